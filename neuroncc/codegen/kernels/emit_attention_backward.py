"""The attention backward kernel's code (Note [attention backward] in attention_backward.py,
which also has its plan, Note [key blocks], and Note [P recomputed] in
attention_recompute.py).

Note [backward pipeline]: a step is one query block of one key block of one head, done in
three stages:
- A, make: its loads, P (loaded, or recomputed: Qᵀ, S = Q Kᵀ, the row group), D, dOᵀ and
  dP = dO Vᵀ;
- B, dV and dS: dV += Pᵀ dO on TensorE, dS = (dP - D) * P on ScalarE and VectorE;
- C, the rest: dSᵀ, dK += dSᵀ Q, dQ (+)= dS K, and what is finished goes out.
Iteration t issues B(t + 1), A(t + 2), then C(t): TensorE's stream is then dV(t + 1), Qᵀ,
S, dOᵀ and dP of t + 2, and dSᵀ, dK and dQ of t, each waiting for work the other engines
did an iteration earlier, while those engines make P(t + 2) and dS(t + 1) beside it. dS(t + 1)
reads dP(t + 1) out of PSUM before dP(t + 2) is written (one set of dP banks suffices).
Where a key block's dK and dV take the PSUM of the last one's (kv_sets 1), C(t) goes first
when t + 1 starts a key block.
"""

from __future__ import annotations

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.attention_backward import BackwardPlan, Gradient
from neuroncc.codegen.kernels.emit import EmitCtx, P
from neuroncc.codegen.kernels.emit_fused import RowKernel
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.codegen.kernels.views import View, strided_view
from neuroncc.ir.graph import Value
from neuroncc.ir.types import DType

Step = tuple[int, int, int, int, int]  # (head, key block number, its first key, r0, rows)


def emit_attention_backward(ctx: EmitCtx, bp: BackwardPlan) -> None:
    """Note [attention backward]."""
    _Backward(ctx, bp).emit()


class _Block:
    """A key block of a head on chip: K's key tiles, Vᵀ's and Kᵀ's columns, and the PSUM
    accumulators of dK and dV (made at its first dV)."""

    def __init__(self, ks: list, vt: isa.TileRef, k_t: isa.TileRef | None) -> None:
        self.ks, self.vt, self.k_t = ks, vt, k_t
        self.accs: list[isa.TileRef] | None = None


class _Backward:
    def __init__(self, ctx: EmitCtx, bp: BackwardPlan) -> None:
        self.ctx, self.bp, self.b, self.t = ctx, bp, ctx.b, ctx.target
        b, t, dt = self.b, self.t, bp.p.type.dtype
        self.dt, self.d = dt, bp.d
        producers, in_kernels = ctx.graph.producers(), ctx.graph.kernel_of()
        self.views = {  # read in place (fold_backward_views), from buffers or folded views
            x.id: ctx.views.get(x.id)
            or (View.of(x) if x.id in ctx.loc else strided_view(x, producers, in_kernels)[0])
            for x in bp.inputs()
        }
        self.out_bufs = {}  # the gradients', or the concat's (Note [gradients in place])
        for gr in (bp.dq, bp.dk, bp.dv):
            if gr.dst.base.id not in self.out_bufs:
                self.out_bufs[gr.dst.base.id] = ctx.alloc(gr.dst.base)
        self.pools = {name: b.sbuf_pool(slot, bufs) for name, (slot, bufs) in bp.pools().items()}
        self.transpose = PeTransposer(ctx, dt, engine="act")
        self.dp_psum = b.psum_pool(bufs=bp.dp_sets * len(bp.dp_chunks(t)))
        kv_banks = b.psum_pool(bufs=bp.kv_sets * bp.kv_banks(t))
        kv_slots = kv_banks.bufs * t.psum_bank_bytes // bp.kv_slot()
        self.kv_psum = b.carve("psum", kv_banks.base, bp.kv_slot(), bufs=kv_slots)
        dq_bank = b.psum_pool(bufs=1)
        dq_slot = -(-self.d * 4 // 64) * 64
        self.dq_psum = b.carve("psum", dq_bank.base, dq_slot, bufs=t.psum_bank_bytes // dq_slot)
        self.rc = rc = bp.recompute
        if rc is not None:  # Note [P recomputed]
            self.qdt = qdt = rc.q.type.dtype
            self.s_psum = b.psum_pool(bufs=len(bp.dp_chunks(t)))
            self.transpose_q = self.transpose
            if qdt != dt:
                self.transpose_q = PeTransposer(ctx, qdt, engine="act")
            keep = bp.sbuf_bytes() - rc.sbuf_bytes(bp.block_keys)
            self.rows = RowKernel(
                ctx, rc.rows, rc.row_plan, bp.block_keys, bp.n,
                inside=bp.members, reserve=keep, rounds=2,
            )  # fmt: skip
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.row_sums: dict[int, isa.TileRef] = {}  # query block -> D, shared by key blocks
        self.dq_sums: dict[int, isa.TileRef] = {}  # query block -> dQ of the key blocks so far
        self.state: dict[Step, dict[str, isa.TileRef]] = {}

    # -- HBM ---------------------------------------------------------------------------------
    def load(self, dst: isa.TileRef, x: Value, bi: int, r0: int, rows: int, c0: int = 0) -> None:
        """Rows r0.. of matrix bi of x, from column c0, into dst."""
        v: View = self.views[x.id]
        off = v.batch_offset(bi) + r0 * v.strides[-2] + c0 * v.strides[-1]
        pattern = ((v.strides[-2], rows), (v.strides[-1], dst.free_elems))
        self.b.dma(dst, isa.DramRef(self.ctx.buf(v.base), off, x.type.dtype, pattern))

    def store(self, gr: Gradient, bi: int, r0: int, src: isa.TileRef) -> None:
        """src, rows r0.. of matrix bi of the gradient, where it goes (`Gradient.dst`)."""
        v: View = gr.dst
        off = v.batch_offset(bi) + r0 * v.strides[-2]
        pattern = ((v.strides[-2], src.np), (v.strides[-1], src.free_elems))
        self.b.dma(isa.DramRef(self.out_bufs[v.base.id], off, self.dt, pattern), src)

    # -- the steps ---------------------------------------------------------------------------
    def emit(self) -> None:
        """Note [backward pipeline]."""
        bp = self.bp
        steps: list[Step | None] = [
            (bi, j, k0, r0, rp)
            for bi in range(bp.batch)
            for j, (k0, _) in enumerate(bp.key_blocks)
            for r0, rp in bp.query_blocks
        ]
        steps = [None, None, *steps, None, None]  # (the pipeline fills and drains)
        for t in range(len(steps) - 2):
            c, b_, a = steps[t], steps[t + 1], steps[t + 2]
            early = c is not None and b_ is not None and c[:2] != b_[:2] and bp.kv_sets == 1
            if early:
                self.rest(c)
            if b_ is not None:
                self.dv_ds(b_)
            if a is not None:
                self.make(a)
            if c is not None and not early:
                self.rest(c)

    def tiles_of(self, j: int) -> list[tuple[int, int]]:
        """The key tiles of key block j: (first key, keys)."""
        k0, kw = self.bp.key_blocks[j]
        return [(x, min(P, k0 + kw - x)) for x in range(k0, k0 + kw, P)]

    def key_block(self, bi: int, j: int) -> _Block:
        """Key block j of head bi, loaded at its first step."""
        if (bi, j) in self.blocks:
            return self.blocks[bi, j]
        bp, rc, pools = self.bp, self.rc, self.pools
        k0, kw = bp.key_blocks[j]
        ks = []
        for x, xw in self.tiles_of(j):
            ks.append(pools["k"].tile(xw, (self.d,), self.dt))
            self.load(ks[-1], bp.k, bi, x, xw)
        vt = pools["vt"].tile(self.d, (kw,), self.dt)
        self.load(vt, bp.v_t, bi, 0, self.d, k0)
        k_t = None
        if rc is not None:  # Kᵀ's columns, for S: loaded, or K's tiles transposed
            k_t = pools["k_t"].tile(self.d, (kw,), self.qdt)
            if rc.k_t is not None:
                self.load(k_t, rc.k_t, bi, 0, self.d, k0)
            for kt, (x, xw) in zip(ks, self.tiles_of(j)) if rc.k_t is None else ():
                self.transpose(k_t.cols(x - k0, xw), kt)
        block = self.blocks[bi, j] = _Block(ks, vt, k_t)
        return block

    def make(self, step: Step) -> None:
        """Stage A: loads, P, D, dOᵀ and dP."""
        bi, j, k0, r0, rp = step
        bp, d, dt, pools = self.bp, self.d, self.dt, self.pools
        kw = bp.key_blocks[j][1]
        block = self.key_block(bi, j)
        s = self.state[step] = {}
        fresh = j == 0 or not bp.accumulates_dq  # D is made here, from O
        for name, x in (("do", bp.d_out), ("o", bp.o), ("q", bp.q)):
            if name != "o" or fresh:
                s[name] = pools["rows"].tile(rp, (d,), dt)
                self.load(s[name], x, bi, r0, rp)
        if self.rc is None:
            s["p"] = pools["p"].tile(rp, (kw,), dt)
            self.load(s["p"], bp.p, bi, r0, rp, k0)
        else:
            s["p"] = self.recomputed(step, s["q"], block)
        if fresh:
            self.row_sums[r0] = self.row_sum(rp, s["do"], s["o"])
        do_t = pools["do_t"].tile(d, (rp,), dt)
        self.transpose(do_t, s["do"])
        s["dp"] = []
        for c0, w in bp.dp_chunks(self.t, kw):
            dp = self.dp_psum.tile(rp, (w,), DType.F32)
            mv = block.vt.cols(c0, w)
            self.b.emit(isa.Matmul("pe", dst=dp, stationary=do_t, moving=mv, accumulate=False))
            s["dp"].append((c0, w, dp))

    def row_sum(self, rp: int, do: isa.TileRef, o: isa.TileRef) -> isa.TileRef:
        """D = rowsum(dO * O) of a query block (kept for its other key blocks)."""
        prod = self.pools["prod"].tile(rp, (self.d,), DType.F32)
        self.b.emit(isa.TensorTensor("dve", op="mul", dst=prod, a=do, b=o))
        row = self.pools["d"].tile(rp, (1,), DType.F32)
        self.b.emit(isa.TensorReduce("dve", op="sum", dst=row, src=prod))
        return row

    def recomputed(self, step: Step, q: isa.TileRef, block: _Block) -> isa.TileRef:
        """P of the step made on chip (Note [P recomputed]): S = Q Kᵀ of the key block,
        copied out of PSUM scaled, and the row group on it."""
        bi, j, k0, r0, rp = step
        rc, bp, b = self.rc, self.bp, self.b
        kw = bp.key_blocks[j][1]
        if not bp.reads_q_once:
            q = self.pools["q_s"].tile(rp, (self.d,), self.qdt)
            self.load(q, rc.q, bi, r0, rp)
        q_t = self.pools["q_t"].tile(self.d, (rp,), self.qdt)
        self.transpose_q(q_t, q)
        s_tile = self.pools["s"].tile(rp, (kw,), DType.F32)
        for c0, w in bp.dp_chunks(self.t, kw):
            ps = self.s_psum.tile(rp, (w,), DType.F32)
            mv = block.k_t.cols(c0, w)
            b.emit(isa.Matmul("pe", dst=ps, stationary=q_t, moving=mv, accumulate=False))
            dst = s_tile.cols(c0, w)
            if rc.evac is None:
                b.emit(isa.TensorCopy("dve", dst=dst, src=ps))
            else:
                op, scalar = rc.evac
                b.emit(isa.TensorScalar("dve", op=op, dst=dst, src=ps, scalar=scalar))
        given = dict.fromkeys(rc.given, s_tile)
        return self.rows.step(bi * bp.m + r0, rp, k0, kw, given)[bp.p.id]

    def dv_ds(self, step: Step) -> None:
        """Stage B: dV += Pᵀ dO, dS = (dP - D) * P."""
        bi, j, k0, r0, rp = step
        s, b = self.state[step], self.b
        block = self.blocks[bi, j]
        if block.accs is None:
            tiles = self.tiles_of(j)
            kv = self.kv_psum
            block.accs = [kv.tile(xw, (self.d,), DType.F32) for _ in (0, 1) for _, xw in tiles]
        half = len(block.accs) // 2
        for i, (x, xw) in enumerate(self.tiles_of(j)):
            st, acc = s["p"].cols(x - k0, xw), block.accs[half + i]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["do"], accumulate=r0 > 0))
        s["ds"] = ds = self.pools["ds"].tile(rp, (self.bp.key_blocks[j][1],), self.dt)
        row = self.row_sums[r0]
        for c0, w, dp in s.pop("dp"):
            b.emit(isa.TensorTensor("act", op="sub", dst=ds.cols(c0, w), a=dp, b=row))
        b.emit(isa.TensorTensor("dve", op="mul", dst=ds, a=ds, b=s["p"]))

    def rest(self, step: Step) -> None:
        """Stage C: dSᵀ, dK += dSᵀ Q, dQ (+)= dS K; dQ out at the last key block, dK and dV
        at a key block's last query block."""
        bi, j, k0, r0, rp = step
        bp, b, dt = self.bp, self.b, self.dt
        s = self.state.pop(step)
        block = self.blocks[bi, j]
        tiles = self.tiles_of(j)
        half = len(block.accs) // 2
        # dSᵀ's transposes first and dK's matmuls behind them: TensorE works while the
        # transposes' copies leave PSUM, instead of waiting for each before its dQ matmul.
        ds_ts = [self.pools["ds_t"].tile(xw, (rp,), dt) for _, xw in tiles]
        for (x, xw), ds_t in zip(tiles, ds_ts, strict=True):
            self.transpose(ds_t, s["ds"].cols(x - k0, xw))
        for i, (x, xw) in enumerate(tiles):
            st, acc = s["ds"].cols(x - k0, xw), block.accs[i]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["q"], accumulate=r0 > 0))
        dq = self.dq_psum.tile(rp, (self.d,), DType.F32)
        for i, ds_t in enumerate(ds_ts):
            mv = block.ks[i]
            b.emit(isa.Matmul("pe", dst=dq, stationary=ds_t, moving=mv, accumulate=i > 0))
        self.dq_out(step, dq)
        if r0 + rp < bp.m:
            return
        for i, (x, xw) in enumerate(tiles):
            for gr, acc, engine in zip((bp.dk, bp.dv), block.accs[i::half], ("dve", "act")):
                out = self.pools["dkv"].tile(xw, (self.d,), dt)
                if engine == "act":
                    b.emit(isa.Activation("act", func="copy", dst=out, src=acc, scale=gr.scale))
                else:
                    b.emit(isa.TensorScalar("dve", op="mul", dst=out, src=acc, scalar=gr.scale))
                self.store(gr, bi, x, out)
        del self.blocks[bi, j]

    def dq_out(self, step: Step, dq: isa.TileRef) -> None:
        """The step's part of dQ: out, scaled, where it is the last key block's; else summed
        into the query block's rows in SBUF (Note [key blocks])."""
        bi, j, _, r0, rp = step
        bp, b = self.bp, self.b
        if bp.accumulates_dq:
            if j == 0:
                self.dq_sums[r0] = acc = self.pools["dq_sum"].tile(rp, (self.d,), DType.F32)
                b.emit(isa.TensorCopy("dve", dst=acc, src=dq))
                return
            acc = self.dq_sums[r0]
            b.emit(isa.TensorTensor("dve", op="add", dst=acc, a=acc, b=dq))
            if j < len(bp.key_blocks) - 1:
                return
            dq = self.dq_sums.pop(r0)
        out = self.pools["dq"].tile(rp, (self.d,), self.dt)
        b.emit(isa.Activation("act", func="copy", dst=out, src=dq, scale=bp.dq.scale))
        self.store(bp.dq, bi, r0, out)
