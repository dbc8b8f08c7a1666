"""The attention backward kernel's code (Note [attention backward] in attention_backward.py,
which also has its plan, Note [key blocks], and Note [P recomputed] in
attention_recompute.py).

Note [backward pipeline]: a step is one query block of one key block of one head, done in
three stages:
- A, make: its loads, D, dOᵀ and dP = dO Vᵀ, and P: loaded, or recomputed (Qᵀ and S = Q Kᵀ
  here, the row group on S last in the iteration, so that ScalarE and VectorE reach the
  transposes' copies TensorE waits for before it);
- B, dV and dS: dV += Pᵀ dO on TensorE, dS = (dP - D) * P on ScalarE and VectorE;
- C, the rest: dSᵀ, dK += dSᵀ Q, dQ (+)= dS K, and what is finished goes out.
Iteration t issues B(t + 1), A(t + 2), C(t), then the row group of t + 2: TensorE's stream
is dV(t + 1), dOᵀ, Qᵀ, dP and S of t + 2, then dSᵀ, dK and dQ of t, each waiting for work
the other engines did an iteration earlier, while those engines make P(t + 2) and dS(t + 1)
beside it. dS(t + 1) reads dP(t + 1) out of PSUM before dP(t + 2) is written (one set of dP
banks suffices). Where a key block's dK and dV take the PSUM of the last one's (kv_sets 1),
C(t) goes first when t + 1 starts a key block. (SDPA's backward on 12 heads of 64 at 512
keys, fp32, causal: 230 us in the order A, B, C with P made inside A; 179 us so; 163 us
with the causal mask's select run on the diagonal's key tiles only, `true_prefix`.)

Keys a query block need not compute (Note [dead keys]: a causal mask's zeros of P, which the
recomputation's row group proves) are skipped: a step covers the live keys of its key block
(`width`), a key block no key of which is live for a query block has no step for it, and
what it would have added to dK, dV and dQ (nothing: P and dS are 0 there) is not computed.
The first step to reach a key tile starts its dK and dV sums; tiles no step reached have
zero gradients, stored from a zero tile.

Note [backward loop]: the pipeline's iterations are a loop (Note [instruction loops]) that
repeats head by head: within a head the steps differ (query and key blocks, causal widths),
and a head's steps are the last head's at HBM addresses moved by the heads' stride, which
each head's form carries (`head_strides`: K read through HF's repeated KV heads moves once
per group of heads, so the period is then a group). For the heads to meet the same tiles:
- a head turns every pool whole: D and dQ's sums take their query block's slot
  (`query_block_tile`); steps of fewer tiles (causal widths, a key block's first step
  loading O) start theirs at a whole step's block (Note [aligned steps] in emit_fused.py);
  K's pool and P's and dS's hold a head's worth of blocks or steps in whole turns where
  a few more buffers do (attention_backward.pools);
- the row group's engine balance restarts at each head's first step;
- the carried tiles (`_Carried`) are kept per (head, block) and per step, relative to the
  iteration, so that the loop compares them between heads.
The last head's iterations repeat the others' up to the two that drain the pipeline; the
loop places the whole periods and a period's start after them (`partial`), and the kernel
takes up the pipeline where the loop stops in the state the iteration a period back met,
moved on (`take_up`). 32 causal heads of 4096 keys (Qwen3-8B's attention, bf16, trn2):
184579 instructions built -> 15540, 17.4 -> 8.7 s of compile, 47.53 -> 44.38 ms (the
restarted balance and `_passed_columns` past the first key block).
"""

from __future__ import annotations

from dataclasses import dataclass

from neuroncc.codegen.executable.loops import BIG_ITERATION
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
    """A key block of a head on chip: K's key tiles, Vᵀ's and Kᵀ's columns, the PSUM
    accumulators of dK and dV (made at its first dV) and the tiles whose sums have started."""

    def __init__(self, ks: list, vt: isa.TileRef, k_t: isa.TileRef | None) -> None:
        self.ks, self.vt, self.k_t = ks, vt, k_t
        self.accs: list[isa.TileRef] | None = None
        self.dv_started: set[int] = set()
        self.dk_started: set[int] = set()

    def copy(self) -> _Block:
        block = _Block(self.ks, self.vt, self.k_t)
        block.accs = self.accs
        block.dv_started, block.dk_started = set(self.dv_started), set(self.dk_started)
        return block


@dataclass(frozen=True)
class _Carried:
    """What an iteration meets from the ones before (Note [backward loop]): the steps' tiles,
    the key blocks on chip, D and dQ's sums per (head, query block), the zero tile and the
    row group's kept tiles."""

    state: dict[Step, dict]
    blocks: dict[tuple[int, int], _Block]
    row_sums: dict[tuple[int, int], isa.TileRef]
    dq_sums: dict[tuple[int, int], isa.TileRef]
    zeros: isa.TileRef | None
    rows: tuple[dict, dict] | None

    def copy(self) -> _Carried:
        """A copy whose tables the emitter may change without changing this one."""
        return _Carried(
            {step: dict(tiles) for step, tiles in self.state.items()},
            {key: x.copy() for key, x in self.blocks.items()},
            dict(self.row_sums),
            dict(self.dq_sums),
            self.zeros,
            None if self.rows is None else (dict(self.rows[0]), dict(self.rows[1])),
        )


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
        self.transpose = self.transpose_q = PeTransposer(ctx, dt, engine="act")
        self._psum_pools()
        self.rc = rc = bp.recompute
        if rc is not None:  # Note [P recomputed]
            self.qdt = rc.q.type.dtype
            self.s_psum = b.psum_pool(bufs=len(bp.dp_chunks(t)))
            if self.qdt != dt:
                self.transpose_q = PeTransposer(ctx, self.qdt, engine="act")
            keep = bp.sbuf_bytes() - rc.sbuf_bytes(bp.block_keys)
            self.rows = RowKernel(
                ctx, rc.rows, rc.row_plan, bp.block_keys, bp.n,
                inside=bp.members, reserve=keep, rounds=2, aliases=dict(rc.aliases),
                generated={vid: (*form, bp.m) for vid, form in rc.generated},
            )  # fmt: skip
        self.zeros: isa.TileRef | None = None  # dK and dV of keys no query reaches
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.row_sums: dict[int, isa.TileRef] = {}  # query block -> D, shared by key blocks
        self.dq_sums: dict[int, isa.TileRef] = {}  # query block -> dQ of the key blocks so far
        self.state: dict[Step, dict[str, isa.TileRef]] = {}

    def _psum_pools(self) -> None:
        """dP's banks, dK's and dV's accumulators, dQ's (the plan's psum_banks)."""
        b, t, bp = self.b, self.t, self.bp
        self.dp_psum = b.psum_pool(bufs=bp.dp_sets * len(bp.dp_chunks(t)))
        kv_banks = b.psum_pool(bufs=bp.kv_sets * bp.kv_banks(t))
        kv_slots = kv_banks.bufs * t.psum_bank_bytes // bp.kv_slot()
        self.kv_psum = b.carve("psum", kv_banks.base, bp.kv_slot(), bufs=kv_slots)
        dq_bank = b.psum_pool(bufs=1)
        dq_slot = -(-self.d * 4 // 64) * 64
        self.dq_psum = b.carve("psum", dq_bank.base, dq_slot, bufs=t.psum_bank_bytes // dq_slot)

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
    def block_index(self, bi: int, r0: int) -> int:
        """Query block r0 of head bi among the plan's (head by head), as key facts count."""
        return bi * len(self.bp.query_blocks) + r0 // P

    def live(self, bi: int, r0: int) -> int:
        """Keys query block r0 of head bi computes (Note [dead keys])."""
        live = self.rc.live if self.rc else None
        return self.bp.n if live is None else live[self.block_index(bi, r0)]

    def width(self, step: Step) -> int:
        """The step's keys: its key block's, up to the last live one."""
        bi, j, k0, r0, _ = step
        return min(self.bp.key_blocks[j][1], self.live(bi, r0) - k0)

    def last_block(self, bi: int, r0: int) -> int:
        """The last key block query block r0 of head bi has a step in."""
        return (self.live(bi, r0) - 1) // self.bp.block_keys

    def emit(self) -> None:
        """Note [backward pipeline], as a loop (Note [backward loop])."""
        bp = self.bp
        steps: list[Step | None] = [
            (bi, j, k0, r0, rp)
            for bi in range(bp.batch)
            for j, (k0, _) in enumerate(bp.key_blocks)
            for r0, rp in bp.query_blocks
            if self.live(bi, r0) > k0
        ]
        self.last_step = {step[:2]: step for step in steps}  # per key block of a head
        for bi in range(bp.batch):  # keys no query block reaches: dK = dV = 0
            for j in range(len(bp.key_blocks)):
                if (bi, j) not in self.last_step:
                    self.store_zeros(bi, self.tiles_of(j))
        self.steps = steps = [None, None, *steps, None, None]  # (the pipeline fills and drains)
        self.index = {step: i for i, step in enumerate(steps) if step is not None}
        self.strides = [self.head_strides(bi) for bi in range(bp.batch)]
        per_head = max(1, (len(steps) - 4) // max(1, bp.batch))  # steps, on average
        # the iterations that make a step: the last head's repeat the others', where the two
        # after them (the pipeline draining) do not
        forms = [self.iteration_form(t) for t in range(len(steps) - 4)]
        self.looped = self.b.builds_by_iteration(len(forms), BIG_ITERATION)
        if self.rc is not None:
            self.rows.aligned = self.looped
        max_period = 4 * per_head * self.head_group()
        met: dict[int, _Carried] = {}  # iteration -> what it met (the last period's)
        done = -1  # the last iteration emitted
        loop = self.b.loop(
            forms, lambda: self.loop_state(done + 1), BIG_ITERATION, max_period, partial=True
        )
        for t in loop:
            if t != done + 1:  # the loop placed the iterations between
                self.take_up(t, done + 1, met)
            met[t] = self.snapshot()
            for x in [x for x in met if x <= t - max_period]:
                del met[x]
            self.iteration(t)
            done = t
        if done + 1 != len(forms):
            self.take_up(len(forms), done + 1, met)
        for t in range(len(forms), len(steps) - 2):
            self.iteration(t)

    def iteration(self, t: int) -> None:
        """Pipeline iteration t: C of step t, B of t + 1, A of t + 2."""
        c, b_, a = self.steps[t : t + 3]
        if self.looped:  # (Note [backward loop])
            self.transpose.align()
            self.transpose_q.align()
            if self.rc is not None and self.head_at(t) != self.head_at(t - 1):
                self.rows.balance.restart()
        early = c is not None and b_ is not None and c[:2] != b_[:2] and self.bp.kv_sets == 1
        if early:
            self.rest(c)
        if b_ is not None:
            self.dv_ds(b_)
        if a is not None:
            self.make(a)
        if c is not None and not early:
            self.rest(c)
        if a is not None and self.rc is not None:
            self.probabilities(a)

    # -- the loop (Note [backward loop]) ----------------------------------------------------
    def iteration_form(self, t: int) -> tuple:
        """What fixes iteration t's instructions beside the state it meets: its three steps'
        forms and whether they share heads and key blocks."""
        c, b_, a = self.steps[t : t + 3]
        same = tuple(
            None if x is None or y is None else (x[0] == y[0], x[1] == y[1])
            for x, y in ((c, b_), (b_, a))
        )
        return (*map(self.step_form, (c, b_, a)), same)

    def step_form(self, step: Step | None) -> tuple | None:
        """A step as its instructions see it, but for the head's addresses in HBM: those move
        by `head_strides` from the head before."""
        if step is None:
            return None
        bi, j, _, r0, rp = step
        block = self.block_index(bi, r0)
        prefix = tuple(p[block] for _, p in self.rc.true_prefix) if self.rc else ()
        last = (self.last_block(bi, r0), self.last_step[bi, j] == step)
        return (j, r0, rp, self.width(step), last, prefix, self.strides[bi])

    def head_strides(self, bi: int) -> tuple | None:
        """How far head bi's matrices lie in HBM from head bi - 1's, and where its rows fall
        in the row group's repeating inputs: a loop's steps are affine in the head where
        these repeat."""
        if bi == 0:
            return None
        views = [*self.views.values(), *(gr.dst for gr in (self.bp.dq, self.bp.dk, self.bp.dv))]
        periods = self.rows.periods if self.rc is not None else ()
        phases = tuple(bi * self.bp.m % n for n in periods)
        return (tuple(v.batch_offset(bi) - v.batch_offset(bi - 1) for v in views), phases)

    def head_group(self) -> int:
        """After how many heads the heads' strides repeat (the heads that share K and V)."""
        strides = self.strides[1:]
        for q in range(1, len(strides)):
            if strides[q:] == strides[:-q]:
                return q
        return 1

    def head_at(self, t: int) -> int:
        """The head of iteration t's A step; past the last step, the head after the last (the
        iterations that drain the pipeline come where the next head's first would)."""
        a = self.steps[t + 2]
        return self.bp.batch if a is None else a[0]

    def loop_state(self, t: int) -> tuple:
        """What iteration t meets beside the pools (Note [instruction loops]), relative to
        its steps and head."""
        h = self.head_at(t)
        steps = tuple(
            (self.index[step] - t, tuple((k, _frozen(v)) for k, v in tiles.items()))
            for step, tiles in self.state.items()
        )
        blocks = tuple(
            (bi - h, j, tuple(x.ks), x.vt, x.k_t, x.accs and tuple(x.accs),
             frozenset(x.dv_started), frozenset(x.dk_started))
            for (bi, j), x in self.blocks.items()
        )  # fmt: skip
        sums = tuple(
            tuple(((bi - h, r0), tile) for (bi, r0), tile in table.items())
            for table in (self.row_sums, self.dq_sums)
        )
        rows = self.rows.loop_state() if self.rc is not None else None
        transposers = (self.transpose.loop_state(), self.transpose_q.loop_state())
        return steps, blocks, sums, self.zeros, rows, transposers

    def snapshot(self) -> _Carried:
        """What the next iteration meets, copied."""
        rows = (self.rows.gen_tiles, self.rows.running) if self.rc else None
        return _Carried(
            self.state, self.blocks, self.row_sums, self.dq_sums, self.zeros, rows
        ).copy()

    def restore(self, c: _Carried) -> None:
        c = c.copy()
        self.state, self.blocks, self.zeros = c.state, c.blocks, c.zeros
        self.row_sums, self.dq_sums = c.row_sums, c.dq_sums
        if c.rows is not None:
            self.rows.gen_tiles, self.rows.running = c.rows

    def moved(self, c: _Carried, t: int, to: int) -> _Carried:
        """What iteration `to` meets, where iteration t met c and the iterations between
        repeat (whole periods: the same tiles, steps and heads on)."""
        steps, heads = to - t, self.head_at(to) - self.head_at(t)
        return _Carried(
            {self.steps[self.index[step] + steps]: x for step, x in c.state.items()},
            {(bi + heads, j): x for (bi, j), x in c.blocks.items()},
            {(bi + heads, r0): x for (bi, r0), x in c.row_sums.items()},
            {(bi + heads, r0): x for (bi, r0), x in c.dq_sums.items()},
            c.zeros,
            c.rows,
        )

    def take_up(self, t: int, now: int, met: dict[int, _Carried]) -> None:
        """Carry on at iteration t, where the loop placed iterations now .. t - 1 (Note
        [backward loop]): each met what the iteration a whole number of periods back, at or
        before `now`, met, moved on. `met` keeps what the last period's iterations met."""
        p = self.b.loop_period
        met[now] = self.snapshot()
        for x in range(max(now + 1, t - p), t + 1):
            back = x - p * -(-(x - now) // p)
            met[x] = self.moved(met[back], back, x)
        self.restore(met[t])

    def tiles_of(self, j: int, width: int | None = None) -> list[tuple[int, int]]:
        """The key tiles of key block j (of its first `width` keys): (first key, keys)."""
        k0, kw = self.bp.key_blocks[j]
        kw = kw if width is None else width
        return [(x, min(P, k0 + kw - x)) for x in range(k0, k0 + kw, P)]

    def store_zeros(self, bi: int, tiles: list[tuple[int, int]]) -> None:
        """dK and dV of the key tiles of head bi: zeros (no live key reaches them)."""
        if not tiles:
            return
        if self.zeros is None:
            self.zeros = self.pools["zeros"].tile(P, (self.d,), self.dt)
            self.b.emit(isa.Memset("pool", dst=self.zeros, value=0.0))
        for x, xw in tiles:
            for gr in (self.bp.dk, self.bp.dv):
                self.store(gr, bi, x, self.zeros.rows(xw))

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
        """Stage A: loads, D, dOᵀ and dP; P loaded, or Qᵀ and S (its row group comes last
        in the iteration, `probabilities`)."""
        bi, j, k0, r0, rp = step
        bp, d, dt, pools = self.bp, self.d, self.dt, self.pools
        kw, width = bp.key_blocks[j][1], self.width(step)
        block = self.key_block(bi, j)
        s = self.state[step] = {}
        fresh = j == 0 or not bp.accumulates_dq  # D is made here, from O
        if self.looped:  # Note [aligned steps] in emit_fused.py: a step's three rows
            pools["rows"].align(3)
        for name, x in (("do", bp.d_out), ("o", bp.o), ("q", bp.q)):
            if name != "o" or fresh:
                s[name] = pools["rows"].tile(rp, (d,), dt)
                self.load(s[name], x, bi, r0, rp)
        if self.rc is None:
            s["p"] = pools["p"].tile(rp, (kw,), dt)
            self.load(s["p"], bp.p, bi, r0, rp, k0)
        if fresh:
            self.row_sums[bi, r0] = self.row_sum(r0, rp, s["do"], s["o"])
        do_t = pools["do_t"].tile(d, (rp,), dt)
        self.transpose(do_t, s["do"])
        q_t = self.q_transposed(step, s["q"]) if self.rc is not None else None
        s["dp"] = []
        if self.looped:  # a whole step's banks (Note [aligned steps])
            self.dp_psum.align(len(bp.dp_chunks(self.t)))
        for c0, w in bp.dp_chunks(self.t, width):
            dp = self.dp_psum.tile(rp, (w,), DType.F32)
            mv = block.vt.cols(c0, w)
            self.b.emit(isa.Matmul("pe", dst=dp, stationary=do_t, moving=mv, accumulate=False))
            s["dp"].append((c0, w, dp))
        if q_t is not None:
            s["s"] = self.scores(step, q_t, block)

    def row_sum(self, r0: int, rp: int, do: isa.TileRef, o: isa.TileRef) -> isa.TileRef:
        """D = rowsum(dO * O) of query block r0 (kept for its other key blocks)."""
        prod = self.pools["prod"].tile(rp, (self.d,), DType.F32)
        self.b.emit(isa.TensorTensor("dve", op="mul", dst=prod, a=do, b=o))
        row = self.query_block_tile("d", r0, rp, 1)
        self.b.emit(isa.TensorReduce("dve", op="sum", dst=row, src=prod))
        return row

    def query_block_tile(self, name: str, r0: int, rp: int, cols: int) -> isa.TileRef:
        """An fp32 tile of query block r0 that lives across key blocks (D, dQ's sum): the
        pool's slot of the query block where the pool has one per query block, so that every
        head puts a query block's sums in the same place (Note [backward loop])."""
        pool = self.pools[name]
        if self.bp.accumulates_dq:
            return pool.tile_at(r0 // P, rp, (cols,), DType.F32)
        return pool.tile(rp, (cols,), DType.F32)

    def q_transposed(self, step: Step, q: isa.TileRef) -> isa.TileRef:
        """Qᵀ of the step's query block, for S (Note [P recomputed])."""
        bi, _, _, r0, rp = step
        if not self.bp.reads_q_once:
            q = self.pools["q_s"].tile(rp, (self.d,), self.qdt)
            self.load(q, self.rc.q, bi, r0, rp)
        q_t = self.pools["q_t"].tile(self.d, (rp,), self.qdt)
        self.transpose_q(q_t, q)
        return q_t

    def scores(self, step: Step, q_t: isa.TileRef, block: _Block) -> isa.TileRef:
        """S = Q Kᵀ of the step's keys, copied out of PSUM with the scale applied."""
        rp, b, rc = step[4], self.b, self.rc
        kw, width = self.bp.key_blocks[step[1]][1], self.width(step)
        s_tile = self.pools["s"].tile(rp, (kw,), DType.F32).cols(0, width)
        if self.looped:
            self.s_psum.align(self.s_psum.bufs)
        for c0, w in self.bp.dp_chunks(self.t, width):
            ps = self.s_psum.tile(rp, (w,), DType.F32)
            mv = block.k_t.cols(c0, w)
            b.emit(isa.Matmul("pe", dst=ps, stationary=q_t, moving=mv, accumulate=False))
            dst = s_tile.cols(c0, w)
            if rc.evac is None:
                b.emit(isa.TensorCopy("dve", dst=dst, src=ps))
            else:
                op, scalar = rc.evac
                b.emit(isa.TensorScalar("dve", op=op, dst=dst, src=ps, scalar=scalar))
        return s_tile

    def probabilities(self, step: Step) -> None:
        """P of the step: the row group on its S (Note [P recomputed])."""
        bi, _, k0, r0, rp = step
        s = self.state[step]
        given = dict.fromkeys(self.rc.given, s.pop("s"))
        block = self.block_index(bi, r0)
        passed = {sel: prefix[block] for sel, prefix in self.rc.true_prefix}
        spec = (bi * self.bp.m + r0, rp, k0, self.width(step), given, passed)
        s["p"] = self.rows.steps([spec])[0][self.bp.p.id]

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
        width = self.width(step)
        for i, (x, xw) in enumerate(self.tiles_of(j, width)):
            st, acc = s["p"].cols(x - k0, xw), block.accs[half + i]
            more = i in block.dv_started
            block.dv_started.add(i)
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["do"], accumulate=more))
        kw = self.bp.key_blocks[j][1]
        s["ds"] = ds = self.pools["ds"].tile(rp, (kw,), self.dt).cols(0, width)
        row = self.row_sums[bi, r0]
        if j == self.last_block(bi, r0):
            del self.row_sums[bi, r0]
        for c0, w, dp in s.pop("dp"):
            b.emit(isa.TensorTensor("act", op="sub", dst=ds.cols(c0, w), a=dp, b=row))
        b.emit(isa.TensorTensor("dve", op="mul", dst=ds, a=ds, b=s["p"]))

    def rest(self, step: Step) -> None:
        """Stage C: dSᵀ, dK += dSᵀ Q, dQ (+)= dS K; dQ out at the last key block, dK and dV
        at a key block's last query block."""
        bi, j, k0, _, rp = step
        bp, b, dt = self.bp, self.b, self.dt
        s = self.state.pop(step)
        block = self.blocks[bi, j]
        tiles = self.tiles_of(j, self.width(step))
        half = len(block.accs) // 2
        # dSᵀ's transposes first and dK's matmuls behind them: TensorE works while the
        # transposes' copies leave PSUM, instead of waiting for each before its dQ matmul.
        if self.looped:  # a whole key block's tiles (Note [aligned steps])
            self.pools["ds_t"].align(self.bp.tiles_per_block)
        ds_ts = [self.pools["ds_t"].tile(xw, (rp,), dt) for _, xw in tiles]
        for (x, xw), ds_t in zip(tiles, ds_ts, strict=True):
            self.transpose(ds_t, s["ds"].cols(x - k0, xw))
        for i, (x, xw) in enumerate(tiles):
            st, acc = s["ds"].cols(x - k0, xw), block.accs[i]
            more = i in block.dk_started
            block.dk_started.add(i)
            b.emit(isa.Matmul("pe", dst=acc, stationary=st, moving=s["q"], accumulate=more))
        dq = self.dq_psum.tile(rp, (self.d,), DType.F32)
        for i, ds_t in enumerate(ds_ts):
            mv = block.ks[i]
            b.emit(isa.Matmul("pe", dst=dq, stationary=ds_t, moving=mv, accumulate=i > 0))
        self.dq_out(step, dq)
        if self.last_step[bi, j] != step:
            return
        all_tiles = self.tiles_of(j)
        self.store_zeros(bi, all_tiles[len(block.dk_started) :])  # (live keys: a prefix)
        for i, (x, xw) in enumerate(all_tiles[: len(block.dk_started)]):
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
        last = self.last_block(bi, r0)
        if bp.accumulates_dq and last > 0:  # (a query block's first key block is 0)
            if j == 0:
                self.dq_sums[bi, r0] = acc = self.query_block_tile("dq_sum", r0, rp, self.d)
                b.emit(isa.TensorCopy("dve", dst=acc, src=dq))
                return
            acc = self.dq_sums[bi, r0]
            b.emit(isa.TensorTensor("dve", op="add", dst=acc, a=acc, b=dq))
            if j < last:
                return
            dq = self.dq_sums.pop((bi, r0))
        out = self.pools["dq"].tile(rp, (self.d,), self.dt)
        b.emit(isa.Activation("act", func="copy", dst=out, src=dq, scale=bp.dq.scale))
        self.store(bp.dq, bi, r0, out)


def _frozen(x):
    """x with its lists as tuples (a loop compares states)."""
    return tuple(map(_frozen, x)) if isinstance(x, (list, tuple)) else x
