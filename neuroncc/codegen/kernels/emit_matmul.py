"""Matmul on TensorE, tiled for the array and blocked for reuse (transposes:
emit_transpose.py).

Layout: TensorE contracts over partitions, `stationary[K, M].T @ moving[K, N]`, so the left
operand is needed as A^T (K on partitions) while HBM holds A row-major. Rather than an
element-strided DMA (one descriptor per element), A is loaded in contiguous [rows, 128] tiles
and transposed on TensorE against an identity matrix (`nc_transpose`: about max(P, 64) cycles),
the PSUM result copied back to SBUF. The same transpose serves TRANSPOSE of the last two axes,
and B = W^T where the layout pass folded a weight's transpose into its matmuls: each [128, 512]
tile of B is then made on chip from four [128, 128] pieces of W's rows, and W^T never goes to
HBM.

Blocking (Note [matmul blocking]): an M block of TM x 128 rows keeps its whole A^T in SBUF and
TM x TN PSUM banks accumulate [128, 512] fp32 output tiles over all of K; each step over K then
loads one [128, TN x 512] tile of B (contiguous rows) and issues TM x TN matmuls. A is read
from HBM once, B once per M block. A larger TM shrinks a step's DMA (B only) relative to its
TensorE time, which is what makes the big GEMMs compute-bound; a larger TN lengthens B's rows
(fewer DMA descriptors). The tile pass prices every blocking the PSUM banks and SBUF allow
(`blocked_ns`) and takes the cheapest; without it, the largest TM. Where even one M tile of A^T
does not fit (a very long K) the plain tiled schedule is used.

Note [matmul epilogue]: elementwise work on the result (bias, activation, residual add,
scaling, a cast) that the fuse pass grouped after the matmul runs on each [rows, <= 512] tile as
it is copied out of PSUM (a RowKernel step, emit_fused.py), so the raw product never goes to
HBM and back unless something outside the group reads it. The epilogue's SBUF comes out of the
A^T budget; where blocking then fails, the epilogue runs as its own kernel after the matmul.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from neuroncc.codegen.executable.builder import ALIGN
from neuroncc.codegen.executable.loops import loop_bufs
from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.emit import EmitCtx, P, rect, register
from neuroncc.codegen.kernels.emit_few_rows import emit_few_rows, few_rows_fits, few_rows_pe_ns
from neuroncc.codegen.kernels.emit_fused import RowKernel, emit_fused
from neuroncc.codegen.kernels.emit_gemv import emit_gemv
from neuroncc.codegen.kernels.emit_transpose import transpose_blocks
from neuroncc.codegen.kernels.pe_transpose import PSUM_TRANSPOSE_BANKS, PeTransposer
from neuroncc.codegen.kernels.row_plan import epilogue_plan, epilogue_sbuf_bytes
from neuroncc.codegen.kernels.views import View
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Node
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

SBUF_SHARE = 0.7  # of a partition, for A^T of one M block
A_CHUNK_TILES = 8  # 128-column tiles of A per load
O_BUFS = 4  # result tiles out of PSUM at once
K_GROUP = 32  # K tiles per step of the plain schedule (_emit_zero_or_simple)


@dataclass(frozen=True)
class Blocking:
    tm: int  # 128-row tiles of M per block
    tn: int  # 512-column tiles of N per step


def blockings(
    m: int,
    k: int,
    n: int,
    dtypes: tuple[DType, DType],
    t: Target,
    on_chip: tuple[bool, bool],
    reserve: int = 0,
) -> list[Blocking]:
    """Every blocking that fits (Note [matmul blocking]), TM from the largest down, each with
    as many N tiles as the PSUM banks left hold; none where even one M tile of A^T does not.
    `dtypes`: the operands' and the result's; `on_chip`: whether A, and W for B = W^T, are
    transposed on chip; `reserve`: SBUF bytes per partition an epilogue needs beside the
    blocks."""
    dt = dtypes[0]
    banks = _accumulator_banks(t, any(on_chip))
    m_tiles, n_tiles = math.ceil(m / P), math.ceil(n / t.pe_moving_fmax)
    at_bytes_per_tile = math.ceil(k / P) * P * dt.itemsize  # A^T of one M tile
    fits = int((SBUF_SHARE * t.sbuf_partition_bytes - reserve) // max(at_bytes_per_tile, 1))
    found = []
    for tm in range(min(m_tiles, banks, fits), 0, -1):
        blocking = Blocking(tm, max(1, min(n_tiles, banks // tm)))
        if _sbuf_bytes(blocking, k, dtypes, t, on_chip) <= t.sbuf_partition_bytes - reserve:
            found.append(blocking)
    return found


def _sbuf_bytes(
    blocking: Blocking, k: int, dtypes: tuple[DType, DType], t: Target, on_chip: tuple[bool, bool]
) -> int:
    """SBUF bytes per partition of emit_matmul's pools for `blocking`."""
    (dt, odt), (tm, tn), nf = dtypes, (blocking.tm, blocking.tn), t.pe_moving_fmax
    kt_n = math.ceil(k / P)
    pools = [
        (tm * P * dt.itemsize, kt_n),  # A^T of one M block
        (tn * nf * dt.itemsize, loop_bufs(3, kt_n)),  # B
        (nf * odt.itemsize, loop_bufs(O_BUFS, tm * tn)),  # results out of PSUM
    ]
    if on_chip[0]:
        pools.append((min(k, A_CHUNK_TILES * P) * dt.itemsize, 2 * tm))  # A's rows, loaded
    if on_chip[1]:
        pools.append((P * dt.itemsize, 2 * tn * nf // P))  # W's rows, loaded
    if any(on_chip):
        pools += [(P * dt.itemsize, 1), (P * 4, 1)]  # the identity, and its grid
    return sum(-(-slot // ALIGN) * ALIGN * bufs for slot, bufs in pools)


def largest_blocking(
    n: Node, epilogue: Sequence[Node], a_transposed: bool, t: Target, b_transposed: bool = False
) -> Blocking | None:
    """The largest blocking for the matmul n with its fused `epilogue`; `a_transposed`: A^T is in
    HBM already (a folded transpose), so no PSUM bank goes to transposing A, unless
    `b_transposed`: B is W^T with W in HBM, transposed on chip as it is loaded."""
    return next(iter(matmul_blockings(n, epilogue, a_transposed, t, b_transposed)), None)


def matmul_blockings(
    n: Node, epilogue: Sequence[Node], a_transposed: bool, t: Target, b_transposed: bool = False
) -> list[Blocking]:
    """blockings for the matmul n (largest_blocking's arguments)."""
    *_, m, k = n.inputs[0].type.shape
    nn = n.inputs[1].type.shape[-1]
    if not (m and k and nn):
        return []
    epi_plan = epilogue_plan(n, epilogue, t) if epilogue else None
    reserve = epilogue_sbuf_bytes(epilogue, epi_plan, t.pe_moving_fmax, t) if epi_plan else 0
    dtypes = (n.inputs[0].type.dtype, n.out.type.dtype)
    return blockings(m, k, nn, dtypes, t, (not a_transposed, b_transposed), reserve)


def blocked_ns(
    u: Node,
    blocking: Blocking,
    t: Target,
    a_folded: bool,
    w_folded: bool,
    pe_extra: float = 0.0,
) -> float:
    """emit_matmul's blocked schedule for u as the busier of TensorE's products (plus
    `pe_extra`) and the DMA queues: A loaded once (rows in chunks, or A^T's rows where it is
    folded), B once per M block in rows of a step's width (W's rows of one K tile where B = W^T
    is made on chip), the result stored once in rows of 512. (TensorE's transposes and the
    copies out of PSUM are left out unless given: the same for every blocking of A.)"""
    a, b, o = (v.type for v in (*u.inputs, u.out))
    *batch, m, k = a.shape
    nn, mats, q = b.shape[-1], math.prod(batch), t.dma_queues
    blocks = mats * math.ceil(math.ceil(m / P) / blocking.tm)
    a_run = min(m, blocking.tm * P) if a_folded else min(k, A_CHUNK_TILES * P)
    b_run = min(k, P) if w_folded else min(nn, blocking.tn * t.pe_moving_fmax)
    moves = costs.dma_ns(a.nbytes, a_run * a.dtype.itemsize, t, q)
    moves += blocks * costs.dma_ns(k * nn * b.dtype.itemsize, b_run * b.dtype.itemsize, t, q)
    moves += costs.dma_ns(o.nbytes, min(nn, t.pe_moving_fmax) * o.dtype.itemsize, t, q)
    return max(pe_matmul_ns(u, t) + pe_extra, moves)


def _accumulator_banks(t: Target, transposes: bool) -> int:
    banks = t.psum_partition_bytes // t.psum_bank_bytes
    return banks - (PSUM_TRANSPOSE_BANKS if transposes else 0)


def _blocking(ctx: EmitCtx, n: Node, largest: Blocking | None, transposes: bool) -> Blocking | None:
    """The tile pass's blocks for n (passes/tile.py), checked against what fits; without the
    pass, one tile at a time."""
    chosen = ctx.graph.choice(n.out.id, "tile")
    if chosen is None:
        return largest and Blocking(1, 1)
    tm, tn = chosen
    if largest is None or tm > largest.tm or tm * tn > _accumulator_banks(ctx.target, transposes):
        most = f"at most {largest.tm}x{largest.tn}" if largest else "no blocking fits"
        raise CodegenError(f"tile={list(chosen)} does not fit SBUF/PSUM: {most}")
    return Blocking(tm, tn)


def pe_matmul_ns(u: Node, t: Target) -> float:
    """The matmul u on TensorE as emit_matmul's blocked schedule runs it: one instruction per
    [128, 128] x [128, 512] block of A and B."""
    *batch, m, k = u.inputs[0].type.shape
    nn, dt = u.out.type.shape[-1], u.inputs[0].type.dtype
    stationary = isa.TileRef("sbuf", 0, min(P, k), 0, dt, (min(P, m),))
    moving = isa.TileRef("sbuf", 0, min(P, k), 0, dt, (min(t.pe_moving_fmax, nn),))
    acc = isa.TileRef("psum", 0, min(P, m), 0, DType.F32, (min(t.pe_moving_fmax, nn),))
    one = costs.instr_ns(
        isa.Matmul("pe", dst=acc, stationary=stationary, moving=moving, accumulate=True), t
    )
    blocks = math.prod(batch) * math.ceil(m / P) * math.ceil(k / P)
    return blocks * math.ceil(nn / t.pe_moving_fmax) * one


@register(Op.MATMUL)
def emit_matmul(ctx: EmitCtx, n: Node, epilogue: Sequence[Node] = ()) -> None:
    """The matmul n, and the elementwise `epilogue` (a fused group after it) applied to each
    result tile as it leaves PSUM (Note [matmul epilogue])."""
    b, t = ctx.b, ctx.target
    a_v, b_v = n.inputs
    *batch, m, k = a_v.type.shape
    nn = b_v.type.shape[-1]
    dt, odt = a_v.type.dtype, n.out.type.dtype
    w_buf = ctx.transposed_view.get(b_v.id)  # B = W^T with W in HBM as it is
    w_off = ctx.view_offset.get(b_v.id, 0)  # (W's first element there)
    if ctx.graph.choice(b_v.id, "layout") == "dot":  # dot products with W's rows
        emit_gemv(ctx, n, w_buf, w_off, epilogue)
        return
    if few_rows_fits(ctx, n) and few_rows_pe_ns(n, t) < pe_matmul_ns(n, t):
        emit_few_rows(ctx, n, epilogue)
        return
    folded = ctx.transposed_view.get(a_v.id)  # A^T already in HBM: load it as it is
    merge = ctx.merged_heads.get(a_v.id)  # A read through a head merge (views.MergedHeads)
    a_buf = folded if folded is not None else None if merge else ctx.buf(a_v)
    # B, or W for B = W^T, as it lies in HBM: its first element and row stride (B may be a
    # slice of a wider tensor's columns: EmitCtx.matrix_source)
    b_buf, b_first, b_stride = (w_buf, w_off, k) if w_buf is not None else ctx.matrix_source(b_v)
    nf = t.pe_moving_fmax
    epi_plan = epilogue_plan(n, epilogue, t) if epilogue else None
    on_pe = folded is None
    largest = largest_blocking(n, epilogue, folded is not None, t, w_buf is not None)
    blocking = _blocking(ctx, n, largest, on_pe or w_buf is not None)
    if merge is not None and blocking is None:
        raise CodegenError("a merged-heads operand needs the blocked schedule with A^T on chip")
    empty = n.out.type.numel == 0  # (an empty batch: no block to compute)
    if blocking is None or empty:  # the epilogue, if any, as a kernel of its own after it
        out = ctx.alloc(n.out)
        if not empty:
            _emit_zero_or_simple(
                ctx, n, a_buf, b_buf, out, folded is not None, w_buf is not None, b_first, b_stride
            )
        if epilogue:  # laid out as the product's rows, as the fuse pass planned it
            emit_fused(ctx, epilogue, (n.out.type.shape, 1))
        return
    group = {e.out.id for e in epilogue}
    escapes = not epilogue or n.out.id in {v.id for v in ctx.graph.outputs}
    escapes = escapes or any(u.out.id not in group for u in ctx.users[n.out.id])
    out = ctx.alloc(n.out) if escapes else None
    tm, tn = blocking.tm, blocking.tn
    kt_n = math.ceil(k / P)
    blocks = [
        (bi, [(r, min(P, m - r)) for r in range(m0, min(m, m0 + tm * P), P)])
        for bi in range(math.prod(batch))
        for m0 in range(0, m, tm * P)
    ]
    # Steps: (block number, block, first column, width) in order. Each step's first B tile is
    # made before the previous step's results leave PSUM, so its loads and transposes queue
    # ahead of that epilogue on the engines instead of behind it.
    steps = [
        (bnum, block, n0, min(tn * nf, nn - n0))
        for bnum, block in enumerate(blocks)
        for n0 in range(0, nn, tn * nf)
    ]
    size = kt_n * (tm * tn + 1) + 3 * tm * tn  # a step's matmuls and loads, its results out
    looped = b.builds_by_iteration(len(steps), size)
    epi = None
    if epi_plan is not None:  # its steps aligned in a loop (Note [aligned steps])
        epi = RowKernel(ctx, epilogue, epi_plan, nf, epi_plan.cols, aligned=looped)
    transpose = PeTransposer(ctx, dt) if on_pe or w_buf is not None else None
    at_pool = b.sbuf_pool(tm * P * dt.itemsize, bufs=kt_n)  # A^T of one M block, all of K
    # A is read in [rows, chunk] pieces (long contiguous rows: few DMA descriptors), each
    # transposed 128 columns at a time.
    chunk = min(k, A_CHUNK_TILES * P)
    a_pool = b.sbuf_pool(chunk * dt.itemsize, bufs=2 * tm) if on_pe else None
    b_pool = b.sbuf_pool(tn * nf * dt.itemsize, bufs=loop_bufs(3, kt_n))
    # B = W^T: W's rows for one B tile, [128, 128] at a time, each transposed into it
    w_pool = b.sbuf_pool(P * dt.itemsize, bufs=2 * tn * nf // P) if w_buf is not None else None
    o_pool = b.sbuf_pool(nf * odt.itemsize, bufs=loop_bufs(O_BUFS, tm * tn))
    acc = b.psum_pool(bufs=tm * tn)
    at_slots = [at_pool.tile(min(P, k - ki * P), (tm * P,), dt) for ki in range(kt_n)]
    chunks: dict[int, isa.TileRef] = {}

    def rebuild(block: tuple, ki: int) -> None:
        """A^T tile ki of `block`: load A chunks as they start, transpose each row tile."""
        bi, mrows = block
        k0, kt = ki * P, min(P, k - ki * P)
        if folded is not None:  # rows of A^T are contiguous: one DMA for the block's tile
            width = sum(mt for _, mt in mrows)
            src = rect(folded, dt, bi * m * k + k0 * m + mrows[0][0], m, kt, width)
            b.dma(at_slots[ki].cols(0, width), src)
            return
        for j, (r0, mt) in enumerate(mrows):
            c0 = k0 - k0 % chunk
            if k0 == c0:
                width = min(chunk, k - c0)
                chunks[j] = a_pool.tile(mt, (width,), dt)
                if merge is not None:  # A[s, h * D + d] = O[h, s, d]
                    sd, dd = merge.seq * merge.dim, merge.dim
                    dims = ((dd, mt), (sd, width // dd), (1, dd))
                    src = isa.DramRef(ctx.buf(merge.o), c0 // dd * sd + r0 * dd, dt, dims)
                else:
                    src = rect(a_buf, dt, bi * m * k + r0 * k + c0, k, mt, width)
                b.dma(chunks[j], src)
            transpose(at_slots[ki].cols(j * P, mt), chunks[j].cols(k0 - c0, min(P, k - k0)))

    def load_b(step: tuple, ki: int) -> isa.TileRef:
        """B's [kt, width] tile ki of a step: loaded, or made from W's rows on TensorE."""
        bi, n0, width = step[1][0], step[2], step[3]
        k0, kt = ki * P, min(P, k - ki * P)
        bt = b_pool.tile(kt, (width,), dt)
        if w_pool is None:
            first = b_first + (bi * k + k0) * b_stride + n0
            b.dma(bt, rect(b_buf, dt, first, b_stride, kt, width))
            return bt
        for j0 in range(0, width, P):  # B[k0:, n0+j0:] is W[n0+j0:, k0:] transposed
            jw = min(P, width - j0)
            wt = w_pool.tile(jw, (kt,), dt)
            b.dma(wt, rect(b_buf, dt, b_first + (n0 + j0) * b_stride + k0, b_stride, jw, kt))
            transpose(bt.cols(j0, jw), wt)
        return bt

    for ki in range(kt_n):
        rebuild(blocks[0], ki)
    first_b = load_b(steps[0], 0)

    def shape(si: int) -> tuple | None:
        if si == len(steps):
            return None
        return tuple(mt for _, mt in steps[si][1][1]), steps[si][3]

    def is_last(si: int) -> bool:  # the block's last step: the next block's A^T beside it
        bnum = steps[si][0]
        return bnum + 1 < len(blocks) and (si + 1 == len(steps) or steps[si + 1][0] != bnum)

    def opens_matrix(si: int) -> bool:  # B's address jumps to the next matrix's there
        return si < len(steps) and steps[si][1][1][0][0] == 0

    # Note [instruction loops]: a step is fixed by its shape, the next step's (its first B
    # tile, the next block's A^T), whether it ends a block, and whether it and the next step
    # open a matrix of a batch: B's addresses are affine in the step only within a matrix
    # (a period of one block's steps placed across the batch boundary read past B's end).
    forms = [
        (shape(si), shape(si + 1), is_last(si), opens_matrix(si), opens_matrix(si + 1))
        for si in range(len(steps))
    ]

    def state() -> tuple:
        return (
            first_b,
            transpose and transpose.loop_state(),
            epi.loop_state() if epi is not None else None,
        )

    for si in b.loop(forms, state, size):
        if looped:
            # A step of fewer tiles (the last M block's, the last columns') moves the pools of
            # its results by less: each step starts them at a whole turn, so that the next
            # steps meet the same tiles (Note [aligned steps]; the results before are read).
            o_pool.align(o_pool.bufs)
            acc.align(acc.bufs)
        step = steps[si]
        bnum, (bi, mrows), n0, width = step
        o_off = bi * m * nn
        cols = [(c, min(nf, n0 + width - c)) for c in range(n0, n0 + width, nf)]
        ps = {
            (j, c): acc.tile(mt, (w,), DType.F32)
            for j, (_, mt) in enumerate(mrows)
            for c, (_, w) in enumerate(cols)
        }
        last = is_last(si)
        for ki in range(kt_n):
            bt = first_b if ki == 0 else load_b(step, ki)
            for j, (_, mt) in enumerate(mrows):
                st = at_slots[ki].cols(j * P, mt)
                for c, (c0, w) in enumerate(cols):
                    b.emit(
                        isa.Matmul(
                            "pe",
                            dst=ps[j, c],
                            stationary=st,
                            moving=bt.cols(c0 - n0, w),
                            accumulate=ki > 0,
                        )
                    )
            if last:  # software pipelining: the next block's A^T tile, once this one is done
                rebuild(blocks[bnum + 1], ki)
        if si + 1 < len(steps):
            first_b = load_b(steps[si + 1], 0)
        # The step's results leave PSUM before its epilogue runs on them (as many at a time
        # as o_pool holds), so that the next step's matmuls, which take the same banks,
        # wait for the copies, not for the epilogue too. The last step's go one by one,
        # each with its epilogue, so that the kernel's last results are done soonest.
        tiles = list(ps.items())
        group = O_BUFS if si + 1 < len(steps) else 1
        for g0 in range(0, len(tiles), group):
            copied = []
            for (j, c), tile in tiles[g0 : g0 + group]:
                r0, mt = mrows[j]
                c0, w = cols[c]
                ot = o_pool.tile(mt, (w,), odt)
                engine = "act" if (j + c) % 2 else "dve"  # spread the PSUM evacuations
                b.emit(isa.TensorCopy(engine, dst=ot, src=tile))
                if out is not None:
                    b.dma(rect(out, odt, o_off + r0 * nn + c0, nn, mt, w), ot)
                copied.append((r0, mt, c0, w, ot))
            for r0, mt, c0, w, ot in copied if epi is not None else ():
                epi.step(bi * m + r0, mt, c0, w, {n.out.id: ot})
        if looped and epi is not None:  # every iteration starts the epilogue alike:
            epi.balance.restart()  # its engines' balance afresh (Note [balance in loops]),
            epi.turn()  # its pools at a whole turn (its steps: one per result tile)


def _emit_zero_or_simple(
    ctx: EmitCtx,
    n: Node,
    a_buf: str,
    b_buf: str,
    out: str,
    a_is_transposed: bool,
    b_is_transposed: bool,
    b_first: int,
    b_stride: int,
) -> None:
    """K == 0 (a zero result), or a K too long to keep A^T on chip: the plain tiled schedule,
    an instruction loop over the output blocks and groups of their K tiles, A^T tiles loaded
    by DMA as rows of A^T (made first by TensorE transposes where `a_buf` holds float A; else
    element-strided), B tiles too where `b_buf` holds W for B = W^T (a 2-D matmul). B (or W)
    starts at element b_first of `b_buf`, its rows b_stride apart."""
    b, t = ctx.b, ctx.target
    a_v, b_v = n.inputs
    *batch, m, k = a_v.type.shape
    nn = b_v.type.shape[-1]
    dt, odt = a_v.type.dtype, n.out.type.dtype
    mt_max, nt_max, kt_max = t.pe_stationary_fmax, t.pe_moving_fmax, t.pe_rows
    if k and not a_is_transposed and dt.is_float and a_buf == ctx.buf(a_v):
        # Aᵀ made first, by TensorE transposes into HBM, so that its tiles load as rows:
        # loaded as Aᵀ from A, a tile is a DMA descriptor per element (the LM head's input
        # gradient at a 152k vocabulary: 9.1 s of a 9.1 s backward, on trn2)
        a_t = ctx.b.dram(f"{out}.at", (*batch, k, m), dt)
        shape = (*batch, m, k)
        transpose_blocks(ctx, View(a_v, 0, shape, contiguous_strides(shape)), a_t.name, dt)
        a_buf, a_is_transposed = a_t.name, True
        # The matmul a kernel of its own: its loads of Aᵀ wait on the transposes' stores
        # through the kernel boundary (a lookup per queue), where inside one kernel each
        # load's bounding span met ~100 of them (the LM head's input gradient: 11.9 s of
        # emission, its loop's runs never quiet: Note [quiet runs])
        b.next_kernel()
    a_pool = b.sbuf_pool(mt_max * dt.itemsize, bufs=2)
    b_pool = b.sbuf_pool(nt_max * dt.itemsize, bufs=2)
    o_pool = b.sbuf_pool(nt_max * odt.itemsize, bufs=2)
    ps_pool = b.psum_pool(bufs=2)
    # Steps: a block of the output and a group of its K tiles. A step of each K tile's
    # loads and product would be a block of 3 * K / 128 instructions (3561 at the LM head's
    # input gradient, K = 151936), emitted whole for each block; in groups, the groups
    # between a block's first and last are alike and the loop places them.
    kt_n = -(-k // kt_max)
    groups = max(1, -(-kt_n // K_GROUP))
    steps = [
        (bi, m0, n0, g)
        for bi in range(math.prod(batch))
        for m0 in range(0, m, mt_max)
        for n0 in range(0, nn, nt_max)
        for g in range(groups)
    ]
    # An instruction loop over the steps: addresses are affine in a run of steps whose forms
    # repeat once the first of a row of blocks and of a matrix, and a block's first and last
    # group, are marked.
    forms = [
        (min(mt_max, m - m0), min(nt_max, nn - n0), m0 == 0, n0 == 0, g == 0, g + 1 == groups)
        for _, m0, n0, g in steps
    ]
    acc: list[isa.TileRef | None] = [None]  # the block's accumulator, through its groups
    for i in b.loop(forms, lambda: acc[0], 3 * min(kt_n, K_GROUP)):
        bi, m0, n0, g = steps[i]
        a_off, b_off, o_off = bi * m * k, b_first + bi * k * b_stride, bi * m * nn
        mt, nt = min(mt_max, m - m0), min(nt_max, nn - n0)
        if k and g == 0:
            acc[0] = ps_pool.tile(mt, (nt,), DType.F32)
        ps = acc[0]
        for ki in range(g * K_GROUP, min(kt_n, (g + 1) * K_GROUP)):
            k0 = ki * kt_max
            kt = min(kt_max, k - k0)
            at = a_pool.tile(kt, (mt,), dt)
            if a_is_transposed:
                src = rect(a_buf, dt, a_off + k0 * m + m0, m, kt, mt)
            else:
                src = isa.DramRef(a_buf, a_off + m0 * k + k0, dt, ((1, kt), (k, mt)))
            b.dma(at, src)
            bt = b_pool.tile(kt, (nt,), dt)
            if b_is_transposed:
                first = b_first + n0 * b_stride + k0
                src = isa.DramRef(b_buf, first, dt, ((1, kt), (b_stride, nt)))
            else:
                src = rect(b_buf, dt, b_off + k0 * b_stride + n0, b_stride, kt, nt)
            b.dma(bt, src)
            b.emit(isa.Matmul("pe", dst=ps, stationary=at, moving=bt, accumulate=ki > 0))
        if g + 1 < groups:
            continue
        ot = o_pool.tile(mt, (nt,), odt)
        if k == 0:
            b.emit(isa.Memset("pool", dst=ot, value=0.0))
        else:
            b.emit(isa.TensorCopy("act", dst=ot, src=ps))
        b.dma(rect(out, odt, o_off + m0 * nn + n0, nn, mt, nt), ot)
