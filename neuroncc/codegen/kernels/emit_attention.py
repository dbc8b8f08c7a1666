"""Attention as one kernel: S = Q Kᵀ on TensorE, the row group on S (scale, mask, softmax, in
whatever form the lowering produced it) on Vector/Scalar, then O = P V on TensorE, with S and P
kept in SBUF and PSUM: the [rows, keys] scores never go to HBM.

Note [attention kernel]: the fuse pass groups `matmul(Q, Kᵀ)`, the reshapes and row ops after it
(`row_plan.plan` with the key axis as the row) and `matmul(P, V)`. Per batch (head) the kernel
loads Kᵀ [D, N] (or K, transposed on chip) and V ([128, Dv] tiles over the keys) once, reading
them in place (Note [attention operands] in attention_operands.py); per block of 128 query rows it
- transposes the Q block on TensorE (Qᵀ [D, rows]: the contraction on partitions), computes the
  scores in [rows, 512] PSUM banks and copies them to one [rows, N] SBUF tile, applying the
  scores' first op if it is a constant scale (`evac`);
- runs the row group on that tile as one RowKernel step (every op sees the whole key row, so a
  softmax's max and sum are exact, no online rescaling; exp and the row sum are one ScalarE
  activation_reduce);
- transposes P 128 keys at a time on TensorE and accumulates P V over the key tiles in one PSUM
  bank.
Key tiles that a constant mask (a causal one) makes irrelevant to a query block are skipped:
no scores, no row group columns, no P V for them (Note [dead keys], codegen/kernels/dead_keys.py).
Such a mask is made on chip, an iota and a compare for the tiles the select runs on (Note
[generated masks]), and the kernel that computed it into HBM is not emitted (lower.py). Where
P itself is read outside (a training forward saves it), its skipped keys are exactly 0 and are
stored from a zero tile (`zero_fill`).
Where P is then `e / s` for the row sum s (the safe-softmax select settled), the row group
stops at e and the output rows are scaled by 1 / s as they leave PSUM, FlashAttention's
deferred normalisation: one pass over the scores fewer (`with_key_facts`).

Note [head pairs]: with a head dimension of 64 (32 on NC-v3 on) a score matmul fills half of
TensorE's rows. Two heads then share their tiles: their Q rows (and K rows) side by side in one
[rows, 2D] tile, read in one DMA where the heads lie side by side in memory (a QKV projection),
are one 128-partition transpose, the heads' Qᵀ (and Kᵀ) one above the other. A pipeline step
holds one query block of each head, and their score matmuls run at once on the array's two row
tiles (`Matmul.tile_rows`). GPT-2's 12 heads of 64 at 512: the block 563 -> 551 us (with the
scores' copies on VectorE, Note [evacuation engines]).

The blocks are software-pipelined (Note [attention pipeline]). A whole key row must fit in SBUF
and a block's scores in the PSUM banks (`attention_plan` checks: up to 3072 keys); longer rows,
and head dimensions over 128 are left unfused: the row group and matmuls then run as before.
"""

from __future__ import annotations

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.attention_operands import load_kind, operands
from neuroncc.codegen.kernels.attention_planner import (
    ZERO_COLS,
    AttentionPlan,
    Block,
    groups_alive,
    kernel_bytes,
    loads_ahead,
    pool_bufs,
    psum_banks,
    query_blocks,
)
from neuroncc.codegen.kernels.emit import EmitCtx, P, rect
from neuroncc.codegen.kernels.emit_fused import RowKernel
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.codegen.kernels.views import View
from neuroncc.errors import CodegenError
from neuroncc.ir.types import DType


def emit_attention(ctx: EmitCtx, ap: AttentionPlan) -> None:
    b, t = ctx.b, ctx.target
    q = ap.scores.inputs[0]
    sdt = ap.scores.out.type.dtype
    pdt, odt = ap.out.inputs[0].type.dtype, ap.out.out.type.dtype
    m, d, n, dv = ap.m, ap.d, ap.n, ap.dv
    nf = t.pe_moving_fmax
    out = ctx.alloc(ap.out.out)
    qv, kv, vv = (ctx.views.get(x.id) or View.of(x) for x in operands(ap))
    qdt = ap.qk_dtype  # (bf16 where q and k are read before SDPA widens them)
    if {qv.base.type.dtype, kv.base.type.dtype} != {qdt}:
        raise CodegenError(
            f"attention multiplies q and k in {qdt}, and reads them as"
            f" {qv.base.type.dtype} and {kv.base.type.dtype}"
        )
    # Qᵀ already in HBM (a transpose folded into its matmul readers): load it as it is
    folded = ctx.transposed_view.get(q.id) if q.id not in ctx.views else None
    inside = frozenset({ap.scores.out.id, ap.out.out.id, *ap.s_ids, *ap.p_chain, *ap.elided})
    key_tiles = [(k0, min(P, n - k0)) for k0 in range(0, n, P)]
    chunks = [(c0, min(nf, n - c0)) for c0 in range(0, n, nf)]
    s_banks, t_banks = psum_banks(ap, t)
    # Note [evacuation engines]: the scores leave PSUM on VectorE, which runs the row group's
    # first steps on them (the mask, the max); everything else TensorE makes (Qᵀ, Kᵀ, Pᵀ,
    # P V) leaves on ScalarE. Alternating them, as other kernels do, put each step's score
    # copy in ScalarE's stream behind the last step's exp, and the two engines took turns
    # instead of overlapping (attention at 2048: 689 -> 549 us).
    transpose_p = PeTransposer(ctx, pdt, banks=t_banks, engine="act")
    transpose_q = transpose_p if qdt == pdt else PeTransposer(ctx, qdt, engine="act")
    s_psum = b.psum_pool(bufs=s_banks)
    o_bank = b.psum_pool(bufs=1)
    o_slot = -(-dv * 4 // 64) * 64
    o_psum = b.carve("psum", o_bank.base, o_slot, bufs=t.psum_bank_bytes // o_slot)
    alive, u, g = groups_alive(ap), ap.unit, ap.group
    kt_pool = b.sbuf_pool(n * qdt.itemsize, bufs=alive)
    v_pool = b.sbuf_pool(dv * pdt.itemsize, bufs=alive * g * len(key_tiles))
    bufs = pool_bufs(ap)
    q_pool = b.sbuf_pool(g * d * qdt.itemsize, bufs=bufs["q"])
    k_pool = b.sbuf_pool(g * d * qdt.itemsize, bufs=2)
    qt_pool = b.sbuf_pool(P * qdt.itemsize, bufs=bufs["qt"])
    s_pool = b.sbuf_pool(n * sdt.itemsize, bufs=bufs["s"])
    pt_pool = b.sbuf_pool(P * pdt.itemsize, bufs=bufs["pt"])
    o_pool = b.sbuf_pool(dv * odt.itemsize, bufs=bufs["o"])
    inv_pool = b.sbuf_pool(64, bufs=bufs["inv"])
    blocks = query_blocks(ap)
    steps = [blocks[i : i + u] for i in range(0, len(blocks), u)]
    pipeline = range(-3, len(steps) + 2)  # the pipeline steps, one per loop iteration
    first = pipeline[0]
    # Where the pipeline is a loop, each step starts the transposes' PSUM slots at a whole
    # turn, and Pᵀ's pool and the row group's pools at a whole block's or step's buffers, so
    # that steps of fewer live key tiles (a causal mask's) leave them where the others do
    # (Note [aligned steps] in emit_fused.py) and the steps repeat head by head (32 causal
    # heads of 4096: 60676 -> 9700 instructions built). Pᵀ's tiles live two steps, within the
    # 2u blocks its pool holds at least. An aligned step leaves buffers idle, so only loops
    # align (the suite's attention at 512 tokens, aligned: +1.4% device time).
    looped = b.builds_by_iteration(len(pipeline))
    # The row group's pools last: nearest the previous kernel's tiles (Note [kernel
    # placement]), as the row group is the last phase to start.
    row = RowKernel(
        ctx,
        ap.rows,
        ap.row_plan,
        n,
        n,
        inside=inside,
        reserve=kernel_bytes(ap),
        rounds=ap.row_rounds,
        aliases=dict(ap.aliases),
        keep=(ap.deferred[1],) if ap.deferred else (),
        generated={vid: (*form, m) for vid, form in ap.generated},
        aligned=looped,
    )
    # P is e / s computed as e, the output rows divided by s (FlashAttention's deferred
    # normalisation), where the row kernel takes the division as its numerator's tile.
    deferred = ap.deferred if ap.deferred and ap.deferred[0] in row.aliased else None
    keys = dict(zip(blocks, ap.live or [n] * len(blocks), strict=True))  # Note [dead keys]
    block_index = {blk: i for i, blk in enumerate(blocks)}
    tile_rows = d if g > 1 else 0  # a group's scores on TensorE's row tiles

    def group_of(bi: int) -> range:
        return range(bi - bi % g, min(bi - bi % g + g, ap.batch))

    def load_rows(dst: isa.TileRef, view: View, heads_: range, r0: int, rows: int) -> None:
        """Rows r0.. of each head's [rows, D] matrix into dst's column block of the head: one
        DMA where the heads lie side by side in memory (a QKV projection's columns)."""
        stride = view.strides[-2]
        offsets = [view.batch_offset(bi) + r0 * stride for bi in heads_]
        if all(off == offsets[0] + j * d for j, off in enumerate(offsets)):
            b.dma(dst, rect(ctx.buf(view.base), qdt, offsets[0], stride, rows, len(offsets) * d))
            return
        for j, off in enumerate(offsets):
            b.dma(dst.cols(j * d, d), rect(ctx.buf(view.base), qdt, off, stride, rows, d))

    # What each phase of a block leaves for the next (Qᵀ, the scores in PSUM, in SBUF, P, Pᵀ,
    # 1 / s), by block number; and each head's Kᵀ and V by head.
    carried = _Carried()
    heads = carried.heads

    def head(bi: int) -> tuple[isa.TileRef, tuple[isa.TileRef, ...]]:
        """Kᵀ [D, N] and V's key tiles of batch bi, loaded once for its group: the group's
        Kᵀ one above the other in one tile (Note [head pairs])."""
        if bi not in heads:
            group = group_of(bi)
            for old in group_of(bi - alive * g) if bi >= alive * g else ():
                heads.pop(old, None)  # its tiles are taken again
            k_t = kt_pool.tile(len(group) * d, (n,), qdt)
            if load_kind(kv, "keys") == "kt":
                for j, bj in enumerate(group):
                    src = rect(ctx.buf(kv.base), qdt, kv.batch_offset(bj), kv.strides[-2], d, n)
                    b.dma(k_t.partitions(j * d, d), src)
            else:  # K's rows, transposed on chip
                for k0, kw in key_tiles:
                    kb = k_pool.tile(kw, (len(group) * d,), qdt)
                    load_rows(kb, kv.transposed(), group, k0, kw)
                    transpose_q(k_t.cols(k0, kw), kb)
            for j, bj in enumerate(group):
                vs = []
                off, stride = vv.batch_offset(bj), vv.strides[-2]
                for k0, kw in key_tiles:
                    vt = v_pool.tile(kw, (dv,), pdt)
                    b.dma(vt, rect(ctx.buf(vv.base), pdt, off + k0 * stride, stride, kw, dv))
                    vs.append(vt)
                heads[bj] = (k_t.partitions(j * d, d), tuple(vs))
        return heads[bi]

    def load_qt(blk: Block) -> None:
        """Qᵀ of the block, made for its whole group (Note [head pairs])."""
        bi, r0, rp = blk
        head(bi)
        if block_index[blk] in carried.qts:
            return
        group = group_of(bi)
        qt = qt_pool.tile(len(group) * d, (rp,), qdt)
        for j, bj in enumerate(group):
            carried.qts[block_index[bj, r0, rp]] = qt.partitions(j * d, d)
        if folded is not None:
            for j, bj in enumerate(group):
                b.dma(qt.partitions(j * d, d), rect(folded, qdt, bj * d * m + r0, m, d, rp))
            return
        qb = q_pool.tile(rp, (len(group) * d,), qdt)
        load_rows(qb, qv, group, r0, rp)
        transpose_q(qt, qb)

    def live_chunks(blk: Block) -> list[tuple[int, int]]:
        return [(c0, min(w, keys[blk] - c0)) for c0, w in chunks if c0 < keys[blk]]

    def score_matmuls(step: list[Block]) -> None:
        """The step's scores, block by block; a group's blocks chunk by chunk, each on its
        row tile, so that TensorE runs them side by side (Note [head pairs])."""
        work = []
        for blk in step:
            j = block_index[blk]
            k_t, qt = heads[blk[0]][0], carried.qts.pop(j)
            tiles = tuple(s_psum.tile(blk[2], (w,), DType.F32) for _, w in live_chunks(blk))
            carried.s_ps[j] = tiles
            for i, ((c0, w), dst) in enumerate(zip(live_chunks(blk), tiles, strict=True)):
                mm = isa.Matmul(
                    "pe",
                    dst=dst,
                    stationary=qt,
                    moving=k_t.cols(c0, w),
                    accumulate=False,
                    tile_rows=tile_rows,
                )
                work.append((i if g > 1 else 0, len(work), mm))
        for *_, mm in sorted(work, key=lambda x: x[:2]):
            b.emit(mm)

    def score_copies(blk: Block) -> None:
        j = block_index[blk]
        carried.s_sb[j] = s = s_pool.tile(blk[2], (keys[blk],), sdt)
        for (c0, w), src in zip(live_chunks(blk), carried.s_ps.pop(j), strict=True):
            engine, dst = "dve", s.cols(c0, w)  # (Note [evacuation engines])
            if ap.evac is None:
                b.emit(isa.TensorCopy(engine, dst=dst, src=src))
            else:
                op, scalar = ap.evac
                b.emit(isa.TensorScalar(engine, op=op, dst=dst, src=src, scalar=scalar))

    def softmax(step: list[Block]) -> None:
        specs = [
            (
                bi * m + r0,
                rp,
                0,
                keys[bi, r0, rp],
                dict.fromkeys(ap.given, carried.s_sb.pop(block_index[bi, r0, rp])),
                {sel: prefix[block_index[bi, r0, rp]] for sel, prefix in ap.true_prefix},
            )
            for bi, r0, rp in step
        ]
        for blk, tiles in zip(step, row.steps(specs), strict=True):
            j = block_index[blk]
            carried.ps[j] = tiles[ap.p_id]
            if ap.zero_fill:
                store_zeros(blk)
            if deferred is not None:
                carried.inverses[j] = inv = inv_pool.tile(blk[2], (1,), DType.F32)
                src = tiles[deferred[1]]
                b.emit(isa.Activation("act", func="reciprocal", dst=inv, src=src))

    p_value = next(x.out for x in ap.rows if x.out.id == ap.p_id)
    if ap.zero_fill:
        zeros = b.sbuf_pool(ZERO_COLS * p_value.type.dtype.itemsize, bufs=1).tile(
            P, (ZERO_COLS,), p_value.type.dtype
        )
        b.emit(isa.Memset("pool", dst=zeros, value=0.0))

    def store_zeros(blk: Block) -> None:
        """P's dead keys of a block (Note [dead keys]: exactly 0 there), from the zero tile."""
        bi, r0, rp = blk
        row = (bi * m + r0) * n
        for c0 in range(keys[blk], n, ZERO_COLS):
            w = min(ZERO_COLS, n - c0)
            dst = rect(ctx.buf(p_value), p_value.type.dtype, row + c0, n, rp, w)
            b.dma(dst, zeros.rows(rp).cols(0, w))

    def transpose_probs(blk: Block) -> None:
        j = block_index[blk]
        p_tile, rp = carried.ps.pop(j), blk[2]
        live = [(k0, kw) for k0, kw in key_tiles if k0 < keys[blk]]
        if looped and pt_pool.bufs % len(key_tiles) == 0:  # a whole block of Pᵀ's tiles
            pt_pool.align(len(key_tiles))
        carried.pts[j] = tuple(pt_pool.tile(kw, (rp,), pdt) for _, kw in live)
        for (k0, kw), pt in zip(live, carried.pts[j], strict=True):
            transpose_p(pt, p_tile.cols(k0, kw))

    def times_v(blk: Block) -> None:
        bi, r0, rp = blk
        j = block_index[blk]
        p_tiles = carried.pts.pop(j)
        vs = heads[bi][1][: len(p_tiles)]
        o_ps = o_psum.tile(rp, (dv,), DType.F32)
        for i, (pt, vt) in enumerate(zip(p_tiles, vs, strict=True)):
            b.emit(isa.Matmul("pe", dst=o_ps, stationary=pt, moving=vt, accumulate=i > 0))
        ot = o_pool.tile(rp, (dv,), odt)
        engine = transpose_p.evacuation_engine()
        if j in carried.inverses:  # ScalarE or VectorE: a per-partition scale
            b.emit(isa.TensorTensor(engine, op="mul", dst=ot, a=o_ps, b=carried.inverses.pop(j)))
        else:
            b.emit(isa.TensorCopy(engine, dst=ot, src=o_ps))
        b.dma(rect(out, odt, bi * m * dv + r0 * dv, dv, rp, dv), ot)

    def each(phase):
        return lambda step: [phase(blk) for blk in step]

    # Note [attention pipeline]: pipeline step s issues step s's row group, then work of other
    # steps in the order their engines can take it, so that what each engine reaches next was
    # made ready while the row group (the longest phase, on Vector/Scalar/GpSimd) ran. A
    # step's score copies come before the next step's score matmuls: PSUM banks are reused
    # only after the program has read them. Qᵀ is loaded `loads_ahead` steps ahead.
    phases = (
        (0, softmax),
        (-1, each(transpose_probs)),
        (loads_ahead(ap, t), each(load_qt)),
        (1, each(score_copies)),
        (2, score_matmuls),
        (-2, each(times_v)),
    )
    reach = sorted({offset for offset, _ in phases})

    def block_form(blk: Block) -> tuple:
        j = block_index[blk]
        group = group_of(blk[0])
        starts = j == 0 or group_of(blocks[j - 1][0]) != group  # a new group's Kᵀ, V
        prefix = tuple(p[j] for _, p in ap.true_prefix)
        return (blk[2], keys[blk], prefix, len(group), blk[0] - group[0], starts)

    def step_form(si: int) -> tuple | None:
        return tuple(map(block_form, steps[si])) if 0 <= si < len(steps) else None

    # Note [instruction loops]: a pipeline step is fixed by the steps its phases reach.
    reached = {si: step_form(si) for si in range(first + reach[0], pipeline[-1] + 1 + reach[-1])}
    forms = [tuple(reached[s + r] for r in reach) for s in pipeline]

    def head_at(s: int) -> int:
        return blocks[min(max(s * u, 0), len(blocks) - 1)][0]

    done = first - 1  # the last pipeline step emitted

    def state() -> tuple:
        return (
            carried.relative((done + 1) * u, head_at(done + 1)),
            row.loop_state(),
            transpose_p.loop_state(),
            transpose_q.loop_state(),
        )

    for it in b.loop(forms, state):
        s = first + it
        if s != done + 1:  # the loop placed the steps between: carry what they would have
            carried.shift((s - done - 1) * u, head_at(s) - head_at(done + 1))
        row.balance.restart()
        if looped:
            transpose_p.align()
            transpose_q.align()
        for offset, phase in phases:
            if 0 <= s + offset < len(steps):
                phase(steps[s + offset])
        done = s


class _Carried:
    """What attention's pipeline steps leave for later ones: per block number, its Qᵀ, its
    scores in PSUM and SBUF, P, Pᵀ and 1 / s; per head, Kᵀ and V. A loop that places steps
    without emitting them (Note [instruction loops]) moves them on by as many blocks and heads
    (`shift`); `relative` is what a loop compares between periods."""

    NAMES = ("qts", "s_ps", "s_sb", "ps", "pts", "inverses")

    def __init__(self) -> None:
        for name in self.NAMES:
            setattr(self, name, {})
        self.heads: dict[int, tuple] = {}

    def shift(self, blocks: int, heads: int) -> None:
        for name in self.NAMES:
            table = getattr(self, name)
            moved = {j + blocks: x for j, x in table.items()}
            table.clear()
            table.update(moved)
        moved = {bi + heads: x for bi, x in self.heads.items()}
        self.heads.clear()
        self.heads.update(moved)

    def relative(self, block: int, head: int) -> tuple:
        tables = tuple(
            tuple((j - block, x) for j, x in getattr(self, name).items()) for name in self.NAMES
        )
        return (*tables, tuple((bi - head, x) for bi, x in self.heads.items()))
