"""The attention backward kernel's code (Note [attention backward] in attention_backward.py,
which also has its plan, and Note [key blocks])."""

from __future__ import annotations

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.attention_backward import BackwardPlan, Gradient
from neuroncc.codegen.kernels.emit import EmitCtx, P
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.codegen.kernels.views import View, strided_view
from neuroncc.ir.graph import Value
from neuroncc.ir.types import DType

Step = tuple[int, int, int, int, int]  # (head, key block number, its first key, r0, rows)


def emit_attention_backward(ctx: EmitCtx, bp: BackwardPlan) -> None:
    """Note [attention backward]."""
    b, t = ctx.b, ctx.target
    dt, d, m = bp.p.type.dtype, bp.d, bp.m
    producers, in_kernels = ctx.graph.producers(), ctx.graph.kernel_of()
    views = {  # read in place (fold_backward_views), in their buffers, or through a folded view
        x.id: ctx.views.get(x.id)
        or (View.of(x) if x.id in ctx.loc else strided_view(x, producers, in_kernels)[0])
        for x in (bp.p, bp.d_out, bp.o, bp.v_t, bp.k, bp.q)
    }
    out_bufs = {}  # the gradients', or the concat's (Note [gradients in place])
    for gr in (bp.dq, bp.dk, bp.dv):
        if gr.dst.base.id not in out_bufs:
            out_bufs[gr.dst.base.id] = ctx.alloc(gr.dst.base)

    def load(dst: isa.TileRef, x: Value, bi: int, r0: int, rows: int, c0: int = 0) -> None:
        """Rows r0.. of matrix bi of x, from column c0, into dst."""
        v: View = views[x.id]
        off = v.batch_offset(bi) + r0 * v.strides[-2] + c0 * v.strides[-1]
        pattern = ((v.strides[-2], rows), (v.strides[-1], dst.free_elems))
        b.dma(dst, isa.DramRef(ctx.buf(v.base), off, dt, pattern))

    def store(gr: Gradient, bi: int, r0: int, src: isa.TileRef) -> None:
        """src, rows r0.. of matrix bi of the gradient, where it goes (`Gradient.dst`)."""
        v: View = gr.dst
        off = v.batch_offset(bi) + r0 * v.strides[-2]
        pattern = ((v.strides[-2], src.np), (v.strides[-1], src.free_elems))
        b.dma(isa.DramRef(out_bufs[v.base.id], off, dt, pattern), src)

    pools = {name: b.sbuf_pool(slot, bufs) for name, (slot, bufs) in bp.pools().items()}
    transpose = PeTransposer(ctx, dt, engine="act")
    dp_psum = b.psum_pool(bufs=bp.dp_sets * len(bp.dp_chunks(t)))
    kv_banks = b.psum_pool(bufs=bp.kv_sets * bp.kv_banks(t))
    kv_slots = kv_banks.bufs * t.psum_bank_bytes // bp.kv_slot()
    kv_psum = b.carve("psum", kv_banks.base, bp.kv_slot(), bufs=kv_slots)
    dq_bank = b.psum_pool(bufs=1)
    dq_slot = -(-d * 4 // 64) * 64
    dq_psum = b.carve("psum", dq_bank.base, dq_slot, bufs=t.psum_bank_bytes // dq_slot)
    key_blocks, last_block = bp.key_blocks, len(bp.key_blocks) - 1
    steps: list[Step] = [
        (bi, j, k0, r0, rp)
        for bi in range(bp.batch)
        for j, (k0, _) in enumerate(key_blocks)
        for r0, rp in bp.query_blocks
    ]

    def tiles_of(j: int) -> list[tuple[int, int]]:
        """The key tiles of key block j: (first key, keys)."""
        k0, kw = key_blocks[j]
        return [(x, min(P, k0 + kw - x)) for x in range(k0, k0 + kw, P)]

    blocks: dict[tuple[int, int], tuple] = {}  # (head, key block) -> its tiles

    def key_block(bi: int, j: int) -> tuple[list[isa.TileRef], isa.TileRef, list[isa.TileRef]]:
        """K's key tiles, Vᵀ's columns and the PSUM accumulators of dK and dV (in that
        order) of key block j of head bi."""
        if (bi, j) not in blocks:
            if len(blocks) >= 2:
                blocks.pop(next(iter(blocks)))
            k0, kw = key_blocks[j]
            ks = []
            for x, xw in tiles_of(j):
                kt = pools["k"].tile(xw, (d,), dt)
                load(kt, bp.k, bi, x, xw)
                ks.append(kt)
            vt = pools["vt"].tile(d, (kw,), dt)
            load(vt, bp.v_t, bi, 0, d, k0)
            accs = [kv_psum.tile(xw, (d,), DType.F32) for _ in range(2) for _, xw in tiles_of(j)]
            blocks[bi, j] = (ks, vt, accs)
        return blocks[bi, j]

    def dk_dv(bi: int, j: int, i: int) -> tuple[isa.TileRef, isa.TileRef]:
        accs = blocks[bi, j][2]
        return accs[i], accs[len(accs) // 2 + i]

    row_sums: dict[int, isa.TileRef] = {}  # query block -> D, where key blocks share it
    dq_sums: dict[int, isa.TileRef] = {}  # query block -> dQ summed over the key blocks so far
    state: dict[Step, dict[str, isa.TileRef]] = {}

    def row_sum(step: Step, do: isa.TileRef, o: isa.TileRef | None) -> isa.TileRef:
        """D = rowsum(dO * O) of the step's query block, made at its first key block."""
        r0, rp = step[3:]
        if o is None:
            return row_sums[r0]
        prod = pools["prod"].tile(rp, (d,), DType.F32)
        b.emit(isa.TensorTensor("dve", op="mul", dst=prod, a=do, b=o))
        row = row_sums[r0] = pools["d"].tile(rp, (1,), DType.F32)
        b.emit(isa.TensorReduce("dve", op="sum", dst=row, src=prod))
        return row

    def first_half(step: Step) -> None:
        """Loads, D, dOᵀ, dP, dV += Pᵀ dO and dS."""
        bi, j, k0, r0, rp = step
        kw = key_blocks[j][1]
        vt = key_block(bi, j)[1]
        s = state[step] = {}
        fresh = j == 0 or not bp.accumulates_dq  # D is made here, from O
        for name, x in (("do", bp.d_out), ("o", bp.o), ("q", bp.q)):
            if name != "o" or fresh:
                s[name] = pools["rows"].tile(rp, (d,), dt)
                load(s[name], x, bi, r0, rp)
        s["p"] = pools["p"].tile(rp, (kw,), dt)
        load(s["p"], bp.p, bi, r0, rp, k0)
        row = row_sum(step, s["do"], s.get("o"))
        do_t = pools["do_t"].tile(d, (rp,), dt)
        transpose(do_t, s["do"])
        chunks = bp.dp_chunks(t, kw)
        dps = [dp_psum.tile(rp, (w,), DType.F32) for _, w in chunks]
        for (c0, w), dp in zip(chunks, dps, strict=True):
            mv = vt.cols(c0, w)
            b.emit(isa.Matmul("pe", dst=dp, stationary=do_t, moving=mv, accumulate=False))
        first = r0 == 0
        for i, (x, xw) in enumerate(tiles_of(j)):
            st, acc = s["p"].cols(x - k0, xw), dk_dv(bi, j, i)[1]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["do"], accumulate=not first))
        s["ds"] = ds = pools["ds"].tile(rp, (kw,), dt)
        for (c0, w), dp in zip(chunks, dps, strict=True):
            b.emit(isa.TensorTensor("act", op="sub", dst=ds.cols(c0, w), a=dp, b=row))
        b.emit(isa.TensorTensor("dve", op="mul", dst=ds, a=ds, b=s["p"]))

    def second_half(step: Step) -> None:
        """dK += dSᵀ Q, dSᵀ, dQ (+)= dS K; dQ out at the last key block, dK and dV at a key
        block's last query block."""
        bi, j, k0, r0, rp = step
        ks = blocks[bi, j][0]
        s = state.pop(step)
        first = r0 == 0
        tiles = tiles_of(j)
        # dSᵀ's transposes first and dK's matmuls behind them: TensorE works while the
        # transposes' copies leave PSUM, instead of waiting for each before its dQ matmul.
        ds_ts = [pools["ds_t"].tile(xw, (rp,), dt) for _, xw in tiles]
        for (x, xw), ds_t in zip(tiles, ds_ts, strict=True):
            transpose(ds_t, s["ds"].cols(x - k0, xw))
        for i, (x, xw) in enumerate(tiles):
            st, acc = s["ds"].cols(x - k0, xw), dk_dv(bi, j, i)[0]
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["q"], accumulate=not first))
        dq = dq_psum.tile(rp, (d,), DType.F32)
        for i, ds_t in enumerate(ds_ts):
            b.emit(isa.Matmul("pe", dst=dq, stationary=ds_t, moving=ks[i], accumulate=i > 0))
        dq_out(step, dq)
        if r0 + rp < m:
            return
        for i, (x, xw) in enumerate(tiles):
            for gr, acc, engine in zip((bp.dk, bp.dv), dk_dv(bi, j, i), ("dve", "act")):
                out = pools["dkv"].tile(xw, (d,), dt)
                if engine == "act":
                    b.emit(isa.Activation("act", func="copy", dst=out, src=acc, scale=gr.scale))
                else:
                    b.emit(isa.TensorScalar("dve", op="mul", dst=out, src=acc, scalar=gr.scale))
                store(gr, bi, x, out)

    def dq_out(step: Step, dq: isa.TileRef) -> None:
        """The step's part of dQ: out, scaled, where it is the last key block's; else summed
        into the query block's rows in SBUF (Note [key blocks])."""
        bi, j, _, r0, rp = step
        if bp.accumulates_dq and j < last_block:
            if j == 0:
                dq_sums[r0] = acc = pools["dq_sum"].tile(rp, (d,), DType.F32)
                b.emit(isa.TensorCopy("dve", dst=acc, src=dq))
            else:
                acc = dq_sums[r0]
                b.emit(isa.TensorTensor("dve", op="add", dst=acc, a=acc, b=dq))
            return
        if bp.accumulates_dq:
            acc = dq_sums.pop(r0)
            b.emit(isa.TensorTensor("dve", op="add", dst=acc, a=acc, b=dq))
            dq = acc
        out = pools["dq"].tile(rp, (d,), dt)
        b.emit(isa.Activation("act", func="copy", dst=out, src=dq, scale=bp.dq.scale))
        store(bp.dq, bi, r0, out)

    # TensorE's second half of a step after the next step's first half, except where the
    # next step starts a key block whose dK and dV take the PSUM of the last one's
    # (kv_sets 1).
    behind = None
    for step in steps:
        if behind is not None and bp.kv_sets == 1 and step[:2] != behind[:2]:
            second_half(behind)
            behind = None
        first_half(step)
        if behind is not None:
            second_half(behind)
        behind = step
    second_half(behind)
