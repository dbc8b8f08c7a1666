"""Matmuls of few rows (a decode step, a skinny GEMM) with B as it is in HBM: B's blocks
stationary, x^T streaming (`emit_few_rows`). emit_matmul takes this schedule where
`few_rows_fits` and the cost model says it is the faster one.

Note [weight stream]: a decode step is a chain of such matmuls, each streaming its weights from
HBM, with small kernels between them. With B's tiles in each kernel's own SBUF, a matmul's first
loads wait for bytes that the kernels before it used (Note [kernel placement] keeps only
neighbours apart), and the DMAs idle from one matmul to the next. Where a program has two or
more of them reading weights (`stream_tile_bytes`), lower.py sets aside for the whole program
a ring of STREAM_TILES of the largest B tiles at the top of SBUF (builder.RingPool) and
STREAM_QUEUES DMA queues, and every such matmul loads B through them:
- tile after tile in the ring, so that a load waits only for the matmuls that read its bytes
  last, and the next matmul's loads run during the kernels in between;
- on queues of their own, as a queue runs in order: a weight load behind a store that waits
  for compute would wait too;
- in DMAs of one partition row per DMA engine of the queue's share, so that the queues
  together keep every engine busy; an engine's share of a whole 2 MiB tile would take 6 us
  at once, and the small transfers of the kernels in between leave no gap that long.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen.executable.pools import RingPool
from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.emit import EmitCtx, P, rect
from neuroncc.codegen.kernels.emit_fused import emit_fused
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.ir.graph import Graph, Node
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

FEW_ROWS = 64  # a product of at most this many rows runs with B stationary (emit_few_rows)
FEW_ROWS_B_COLS = 4096  # columns of B per DMA (16 KiB rows in fp32: few descriptors)
FEW_ROWS_X_BYTES = 32 * 1024  # x's rows are kept whole in SBUF, per partition at most
STREAM_TILES = 4  # the largest B tiles in flight in the ring (Note [weight stream])
STREAM_QUEUES = 2


@dataclass
class WeightStream:
    """Note [weight stream]: the SBUF ring and the DMA queues B's tiles move on."""

    pool: RingPool
    queues: tuple[str, ...]
    turn: int = 0

    def queue(self) -> str:
        self.turn += 1
        return self.queues[self.turn % len(self.queues)]


def _group_blocks(m: int, t: Target) -> int:
    """[128, 128] blocks of B whose [128, m] results share one PSUM bank and one transpose."""
    return max(1, min(P // m, t.psum_bank_bytes // (4 * m), FEW_ROWS_B_COLS // P))


def stream_tile_bytes(g: Graph, t: Target) -> int:
    """The largest tile of the weight stream (Note [weight stream]): the widest B tile among g's
    matmuls of few rows whose B is a graph input (a weight) or a slice of one, where there are
    two or more; else 0."""
    inputs, producers = {v.id for v in g.inputs}, g.producers()
    widths = []
    for n in g.nodes:
        a, b = n.inputs[:2] if n.op is Op.MATMUL else (None, None)
        if a is None or a.type.rank != 2 or b.type.rank != 2:
            continue
        if not 0 < a.type.shape[0] <= FEW_ROWS or 0 in b.type.shape:
            continue
        src = producers.get(b.id)
        sliced = src is not None and src.op is Op.SLICE and src.inputs[0].id in inputs
        if b.id in inputs or sliced:
            cols = min(-(-b.type.shape[1] // P), _group_blocks(a.type.shape[0], t)) * P
            widths.append(cols * b.type.dtype.itemsize)
    return max(widths) if len(widths) >= 2 else 0


def few_rows_fits(ctx: EmitCtx, n: Node) -> bool:
    """Whether `emit_few_rows` takes the matmul n: 2-D, at most FEW_ROWS rows, B as it is in
    HBM (not a folded W^T), A not a folded A^T, float."""
    a_v, b_v = n.inputs
    if a_v.type.rank != 2 or b_v.type.rank != 2:
        return False
    m, k = a_v.type.shape
    if not (0 < m <= FEW_ROWS and k > 0 and b_v.type.shape[1] > 0):
        return False
    if k * a_v.type.dtype.itemsize > FEW_ROWS_X_BYTES:
        return False
    viewed = a_v.id in ctx.transposed_view or b_v.id in ctx.transposed_view
    viewed = viewed or a_v.id in ctx.merged_heads
    return not viewed and a_v.type.dtype.is_float and a_v.type.dtype == b_v.type.dtype


def few_rows_pe_ns(n: Node, t: Target) -> float:
    """TensorE time of emit_few_rows: a matmul per [128, 128] block of B, the transposes of
    x and of the results, and the identities' set-up (as emit_matmul.pe_matmul_ns prices
    the usual schedule)."""
    (m, k), nn = n.inputs[0].type.shape, n.inputs[1].type.shape[1]
    dt = n.inputs[0].type.dtype
    block = isa.TileRef("sbuf", 0, min(P, k), 0, dt, (min(P, nn),))
    x_t = isa.TileRef("sbuf", 0, min(P, k), 0, dt, (m,))
    acc = isa.TileRef("psum", 0, min(P, nn), 0, DType.F32, (m,))
    one = costs.instr_ns(
        isa.Matmul("pe", dst=acc, stationary=block, moving=x_t, accumulate=True), t
    )
    eye = isa.TileRef("sbuf", 0, P, 0, dt, (P,))
    flip = isa.Matmul("pe", dst=acc, stationary=x_t, moving=eye, accumulate=False, transpose=True)
    k_tiles, blocks = math.ceil(k / P), math.ceil(nn / P)
    setup = 2 * costs.instr_ns(isa.Iota("pool", dst=eye, base=0.0, pstep=1.0, fstep=-1.0), t)
    flips = k_tiles + math.ceil(blocks * m / P)
    return k_tiles * blocks * one + flips * costs.instr_ns(flip, t) + setup


def emit_few_rows(ctx: EmitCtx, n: Node, epilogue: Sequence[Node]) -> None:
    """out = x @ B for x of few rows (a decode step, a skinny GEMM), computed transposed:
    out^T[n, m] = sum_k B[k, n] x^T[k, m] with [128, 128] blocks of B as the stationary
    operand and x^T as the moving one. A matmul costs about max(64, moving columns) cycles:
    64 per [128, 128] block of B here, where x^T stationary streams B's 128 columns (512 per
    four blocks), half the TensorE time for m <= 64. The [n, m] results of a group of
    blocks share one PSUM tile, are copied out together and transposed once on TensorE, and
    leave in one DMA whose runs are 128 outputs long. An epilogue runs after, as its own
    kernel over the small product."""
    b, t = ctx.b, ctx.target
    a_v, b_v = n.inputs
    (m, k), nn = a_v.type.shape, b_v.type.shape[1]
    dt, odt = a_v.type.dtype, n.out.type.dtype
    out = ctx.alloc(n.out)
    transpose = PeTransposer(ctx, dt)
    transpose_f32 = transpose if dt == DType.F32 else PeTransposer(ctx, DType.F32)
    k_tiles = [(k0, min(P, k - k0)) for k0 in range(0, k, P)]
    # x^T: x's rows loaded whole, transposed 128 columns at a time
    x_rows = b.sbuf_pool(k * dt.itemsize, bufs=1).tile(m, (k,), dt)
    b.dma(x_rows, rect(ctx.buf(a_v), dt, 0, k, m, k))
    xt_pool = b.sbuf_pool(m * dt.itemsize, bufs=len(k_tiles))
    xts = []
    for k0, kt in k_tiles:
        xt = xt_pool.tile(kt, (m,), dt)
        transpose(xt, x_rows.cols(k0, kt))
        xts.append(xt)
    # Groups of whole 128-column blocks whose [128, m] results fit one PSUM bank and one
    # transpose (blocks x m <= 128); a partial last block alone.
    per_group = _group_blocks(m, t)
    whole = [(n0, P) for n0 in range(0, nn - nn % P, P)]
    groups = [whole[i : i + per_group] for i in range(0, len(whole), per_group)]
    if nn % P:
        groups.append([(nn - nn % P, nn % P)])
    width_max = max(sum(w for _, w in g) for g in groups)
    stream = ctx.weight_stream  # Note [weight stream]
    if stream is not None and STREAM_TILES * width_max * dt.itemsize > stream.pool.nbytes:
        stream = None
    b_pool = stream.pool if stream else b.sbuf_pool(width_max * dt.itemsize, bufs=3)
    acc = b.psum_pool(bufs=2)
    res_pool = b.sbuf_pool(per_group * m * 4, bufs=2)
    o_pool = b.sbuf_pool(P * odt.itemsize, bufs=2)
    b_buf, b_first, b_stride = ctx.matrix_source(b_v)  # (B may be a wider tensor's columns)
    per_dma = max(1, t.dma_engines // STREAM_QUEUES)  # stream DMAs: a partition row per engine
    for members in groups:
        n0, nw = members[0][0], members[0][1]
        width = sum(w for _, w in members)
        ps = acc.tile(nw, (len(members) * m,), DType.F32)
        for ki, (k0, kt) in enumerate(k_tiles):
            bt = b_pool.tile(kt, (width,), dt)  # B's rows k0.., the group's columns
            first = b_first + k0 * b_stride + n0
            if stream is None:
                b.dma(bt, rect(b_buf, dt, first, b_stride, kt, width))
            else:  # in slices of partitions, each fitting between other transfers
                for p0 in range(0, kt, per_dma):
                    pn = min(per_dma, kt - p0)
                    src = rect(b_buf, dt, first + p0 * b_stride, b_stride, pn, width)
                    b.dma(replace(bt, p0=bt.p0 + p0, np=pn), src, queue=stream.queue())
            for j in range(len(members)):
                mm = isa.Matmul(
                    "pe",
                    dst=ps.cols(j * m, m),
                    stationary=bt.cols(j * P, nw),
                    moving=xts[ki],
                    accumulate=ki > 0,
                )
                b.emit(mm)
        res = res_pool.tile(nw, (len(members) * m,), DType.F32)
        b.emit(isa.TensorCopy(transpose.evacuation_engine(), dst=res, src=ps))
        rows = len(members) * m  # row j * m + r of the transpose: out[r, n0 + j * 128 + ...]
        ot = o_pool.tile(rows, (nw,), odt)
        transpose_f32(ot, res)
        dst = isa.DramRef(out, n0, odt, ((P, len(members)), (nn, m), (1, nw)))
        b.dma(dst, ot)
    if epilogue:  # laid out as the product's rows, as the fuse pass planned it
        emit_fused(ctx, epilogue, (n.out.type.shape, 1))
