"""Emitters for matmul, reductions, data movement and gathers (see emit.py for the conventions)."""

from __future__ import annotations

import itertools
import math

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.emit import TILE_BYTES, EmitCtx, P, rect, register, tiles_2d
from neuroncc.codegen.kernels.emit_transpose import (
    emit_transpose_folded,
    emit_transpose_on_pe,
    pe_transposable,
)
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

DMA_CHUNK_BYTES = 64 * 1024  # split large HBM->HBM copies so they spread over the queues
# ... into at most this many: each DMA fans out over the DMA engines anyway, and more pieces
# add an instruction each (a 151936 x 4096 bf16 embedding table's gradient, copied before its
# rows are scattered in, was 18992 DMAs of 64 KiB)
MAX_COPY_DMAS = 64

_REDUCE_OP = {
    Op.REDUCE_SUM: "sum",
    Op.REDUCE_MAX: "max",
    Op.REDUCE_MIN: "min",
    Op.REDUCE_PROD: "prod",
}
_COMBINE_OP = {"sum": "add", "max": "max", "min": "min", "prod": "mul"}
_IDENTITY = {"sum": 0.0, "prod": 1.0}


@register(Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD)
def emit_reduce(ctx: EmitCtx, n: Node) -> None:
    b = ctx.b
    (x,) = n.inputs
    t = x.type
    nred = len(n.attr("axes"))
    rows = math.prod(t.shape[: t.rank - nred])
    k = math.prod(t.shape[t.rank - nred :])
    op = _REDUCE_OP[n.op]
    acc_dt = t.dtype.accumulator
    odt = n.out.type.dtype
    src, out = ctx.buf(x), ctx.alloc(n.out)
    fmax = TILE_BYTES // t.dtype.itemsize
    in_pool = b.sbuf_pool(min(max(k, 1), fmax) * t.dtype.itemsize, bufs=2)
    acc_pool = b.sbuf_pool(8, bufs=2)
    part_pool = b.sbuf_pool(8, bufs=2)
    out_pool = b.sbuf_pool(8, bufs=2)
    if k == 0 and rows and op not in _IDENTITY:
        raise CodegenError(f"{n.op.value} of an empty tensor has no value")
    # Steps: a row block's column tiles (one step of none where k == 0), an instruction loop:
    # addresses are affine in the steps between a row block's first and last, which its form
    # marks (Note [instruction loops]).
    steps = [
        (r0, min(P, rows - r0), c0, f, c0 + f >= k)
        for r0 in range(0, rows, P)
        for _, _, c0, f in (tiles_2d(min(P, rows - r0), k, fmax) if k else [(0, 0, 0, 0)])
    ]
    acc: list[isa.TileRef | None] = [None]  # the row block's accumulator
    forms = [(p, f, c0 == 0, last) for _, p, c0, f, last in steps]
    for i in b.loop(forms, lambda: acc[0]):
        r0, p, c0, f, last = steps[i]
        if c0 == 0:
            acc[0] = acc_pool.tile(p, (1,), acc_dt)
            if k == 0:
                b.emit(isa.Memset("pool", dst=acc[0], value=_IDENTITY[op]))
        if k:
            xt = in_pool.tile(p, (f,), t.dtype)
            b.dma(xt, rect(src, t.dtype, r0 * k + c0, k, p, f))
            if c0 == 0:
                b.emit(isa.TensorReduce("dve", op=op, dst=acc[0], src=xt))
            else:
                part = part_pool.tile(p, (1,), acc_dt)
                b.emit(isa.TensorReduce("dve", op=op, dst=part, src=xt))
                b.emit(isa.TensorTensor("dve", op=_COMBINE_OP[op], dst=acc[0], a=acc[0], b=part))
        if last:
            ot = out_pool.tile(p, (1,), odt)
            b.emit(isa.TensorCopy("dve", dst=ot, src=acc[0]))
            b.dma(rect(out, odt, r0, 1, p, 1), ot)


# -- data movement: HBM -> HBM DMA with access patterns -------------------------------------


def _coalesce(shape, src_strides, dst_strides):
    """Drop size-1 axes and merge axes that are contiguous in both patterns."""
    dims = [(c, s, d) for c, s, d in zip(shape, src_strides, dst_strides, strict=True) if c != 1]
    merged: list[tuple[int, int, int]] = []
    for c, s, d in dims:
        if merged:
            pc, ps, pd = merged[-1]
            if ps == s * c and pd == d * c:
                merged[-1] = (pc * c, s, d)
                continue
        merged.append((c, s, d))
    return merged or [(1, 1, 1)]


def copy_pattern(
    ctx: EmitCtx,
    dst: str,
    dst_off: int,
    dst_strides,
    src: str,
    src_off: int,
    src_strides,
    shape,
    dtype: DType,
) -> None:
    """Copy a logical `shape` between two strided views, split along the outer axis so that no
    DMA moves more than DMA_CHUNK_BYTES, or into MAX_COPY_DMAS pieces where that makes more;
    chunks go round-robin over the DMA queues."""
    if math.prod(shape) == 0:
        return
    dims = _coalesce(shape, src_strides, dst_strides)
    outer, s0, d0 = dims[0]
    inner = dims[1:]
    row_bytes = math.prod(c for c, _, _ in inner) * dtype.itemsize
    step = max(1, DMA_CHUNK_BYTES // max(row_bytes, 1), -(-outer // MAX_COPY_DMAS))
    for i0 in range(0, outer, step):
        cnt = min(step, outer - i0)
        s_ref = isa.DramRef(
            src, src_off + i0 * s0, dtype, ((s0, cnt), *((s, c) for c, s, _ in inner))
        )
        d_ref = isa.DramRef(
            dst, dst_off + i0 * d0, dtype, ((d0, cnt), *((d, c) for c, _, d in inner))
        )
        ctx.b.dma(d_ref, s_ref)


@register(Op.RESHAPE)
def emit_reshape(ctx: EmitCtx, n: Node) -> None:
    # Row-major data does not move: the result aliases its input's buffer.
    ctx.alias(n.out, ctx.loc[n.inputs[0].id].buffer)


def transpose_layout(g: Graph, n: Node, t: Target) -> str:
    """Where the layout pass said (passes/layout.py); without it, on TensorE where possible,
    else as a strided DMA."""
    layout = g.choice(n.out.id, "layout")
    if layout is None:
        layout = "pe" if pe_transposable(n.inputs[0].type, tuple(n.attr("perm"))) else "dma"
    return layout


@register(Op.TRANSPOSE)
def emit_transpose(ctx: EmitCtx, n: Node) -> None:
    layout = transpose_layout(ctx.graph, n, ctx.target)
    if layout in ("fold", "dot"):
        emit_transpose_folded(ctx, n, layout)
    elif layout == "pe":
        emit_transpose_on_pe(ctx, n)
    else:
        emit_transpose_dma(ctx, n)


def _copy_in_place(ctx: EmitCtx, n: Node) -> bool:
    """n copied from where its chain of views starts (Note [copies in place]), if it is."""
    view = ctx.copy_sources.get(n.out.id)
    if view is None:
        return False
    shape = n.out.type.shape
    out = ctx.alloc(n.out)
    src = ctx.buf(view.base)
    dtype = n.out.type.dtype
    copy_pattern(
        ctx, out, 0, contiguous_strides(shape), src, view.offset, view.strides, shape, dtype
    )
    return True


def emit_transpose_dma(ctx: EmitCtx, n: Node) -> None:
    """layout=dma: one HBM -> HBM copy with the permuted access pattern."""
    if _copy_in_place(ctx, n):
        return
    x = n.inputs[0]
    perm = n.attr("perm")
    in_strides = contiguous_strides(x.type.shape)
    shape = n.out.type.shape
    out = ctx.alloc(n.out)
    src_strides = [in_strides[p] for p in perm]
    copy_pattern(
        ctx, out, 0, contiguous_strides(shape), ctx.buf(x), 0, src_strides, shape, x.type.dtype
    )


# Note [broadcast along rows]: a broadcast whose last axis is new (x [..., 1] -> [..., C]) is,
# as an HBM -> HBM copy, a DMA that reads with stride 0: one descriptor per element written, at
# a few percent of HBM's bandwidth. Through SBUF it is one source element per output row, a
# row per partition, repeated across the row by VectorE, and rows of C stored whole. The other
# axes may broadcast too ([1, 1, h, 1] -> [b, s, h, C]): a block of rows reads its elements
# with the rows' pattern, and a block that reads what the block before it read (a period of
# rows) stores the same tile again. Worth it once a row is long enough that its store is not
# element-sized too, and the blocks hold enough rows.
ROW_BROADCAST_MIN_BYTES = 256
ROW_BROADCAST_MIN_ROWS = 32  # per block, on average


@register(Op.BROADCAST)
def emit_broadcast(ctx: EmitCtx, n: Node) -> None:
    x = n.inputs[0]
    in_strides = contiguous_strides(x.type.shape)
    shape = n.out.type.shape
    src_strides = [0 if d == 1 else s for d, s in zip(x.type.shape, in_strides, strict=True)]
    if _broadcast_along_rows(ctx, n, src_strides):
        return
    out = ctx.alloc(n.out)
    copy_pattern(
        ctx, out, 0, contiguous_strides(shape), ctx.buf(x), 0, src_strides, shape, x.type.dtype
    )


def _row_blocks(row_shape, src_strides) -> list[tuple[int, int, tuple]]:
    """Consecutive output rows in blocks of at most P: (rows, source offset, source pattern)
    for each, the pattern a DramRef's (stride, count) pairs."""
    dims = _coalesce(row_shape, src_strides, contiguous_strides(row_shape))
    dims = [(1, 0, 0)] * (2 - len(dims)) + dims
    *outer, (n2, s2, _), (n1, s1, _) = dims
    blocks = []
    for index in itertools.product(*(range(c) for c, _, _ in outer)):
        base = sum(i * s for i, (_, s, _) in zip(index, outer, strict=True))
        if n1 >= P:
            for j2, j1 in itertools.product(range(n2), range(0, n1, P)):
                p = min(P, n1 - j1)
                blocks.append((p, base + j2 * s2 + j1 * s1, ((s1, p), (1, 1))))
        else:
            for j2 in range(0, n2, P // n1):
                k = min(P // n1, n2 - j2)
                blocks.append((k * n1, base + j2 * s2, ((s2, k), (s1, n1))))
    return blocks


def _broadcast_along_rows(ctx: EmitCtx, n: Node, src_strides) -> bool:
    """Note [broadcast along rows], where it applies: True if emitted."""
    x, shape, dt = n.inputs[0], n.out.type.shape, n.out.type.dtype
    if not shape or x.type.shape[-1] != 1 or shape[-1] * dt.itemsize < ROW_BROADCAST_MIN_BYTES:
        return False
    rows, cols = math.prod(shape[:-1]), shape[-1]
    blocks = _row_blocks(shape[:-1], src_strides[:-1])
    if len(blocks) * ROW_BROADCAST_MIN_ROWS > rows:
        return False
    b = ctx.b
    f = min(cols, TILE_BYTES // dt.itemsize)
    src_pool, row_pool = b.sbuf_pool(dt.itemsize, bufs=2), b.sbuf_pool(f * dt.itemsize, bufs=2)
    src, out = ctx.buf(x), ctx.alloc(n.out)
    r0, last, row = 0, None, None
    for p, offset, pattern in blocks:
        if (p, offset, pattern) != last:  # else the tile of the block before holds these rows
            one = src_pool.tile(p, (1,), dt)
            b.dma(one, isa.DramRef(src, offset, dt, pattern))
            row = row_pool.tile(p, (f,), dt)
            b.emit(isa.TensorTensor("dve", op="max", dst=row, a=one, b=one))  # max(v, v) is v
            last = (p, offset, pattern)
        for c0 in range(0, cols, f):
            w = min(f, cols - c0)
            b.dma(rect(out, dt, r0 * cols + c0, cols, p, w), row if w == f else row.cols(0, w))
        r0 += p
    return True


@register(Op.SLICE)
def emit_slice(ctx: EmitCtx, n: Node) -> None:
    if _copy_in_place(ctx, n):
        return
    x = n.inputs[0]
    in_strides = contiguous_strides(x.type.shape)
    offset = sum(lo * s for lo, s in zip(n.attr("starts"), in_strides, strict=True))
    src_strides = [s * st for s, st in zip(in_strides, n.attr("steps"), strict=True)]
    shape = n.out.type.shape
    out = ctx.alloc(n.out)
    copy_pattern(
        ctx, out, 0, contiguous_strides(shape), ctx.buf(x), offset, src_strides, shape, x.type.dtype
    )


@register(Op.REVERSE)
def emit_reverse(ctx: EmitCtx, n: Node) -> None:
    # Read each reversed axis from its last element backwards: a negative DMA stride.
    x = n.inputs[0]
    shape = x.type.shape
    strides = contiguous_strides(shape)
    axes = set(n.attr("axes"))
    offset = sum((shape[a] - 1) * strides[a] for a in axes if shape[a])
    src_strides = [-s if d in axes else s for d, s in enumerate(strides)]
    out = ctx.alloc(n.out)
    copy_pattern(ctx, out, 0, strides, ctx.buf(x), offset, src_strides, shape, x.type.dtype)


@register(Op.STRIDED)
def emit_strided(ctx: EmitCtx, n: Node) -> None:
    x = n.inputs[0]
    shape = n.out.type.shape
    out = ctx.alloc(n.out)
    copy_pattern(
        ctx,
        out,
        0,
        contiguous_strides(shape),
        ctx.buf(x),
        n.attr("offset"),
        n.attr("strides"),
        shape,
        x.type.dtype,
    )


@register(Op.CONCAT)
def emit_concat(ctx: EmitCtx, n: Node) -> None:
    """Each input copied into its region; an input that views make is copied from where
    they start (Note [concat in place], views.concat_sources)."""
    axis = n.attr("axis")
    out = ctx.alloc(n.out)
    out_strides = contiguous_strides(n.out.type.shape)
    pos = 0
    for i, x in enumerate(n.inputs):
        dst = pos * out_strides[axis]
        src = ctx.concat_sources.get((n.out.id, i))
        if src is None:
            shape, strides = x.type.shape, contiguous_strides(x.type.shape)
            copy_pattern(ctx, out, dst, out_strides, ctx.buf(x), 0, strides, shape, x.type.dtype)
        else:
            view = src.view
            base, offset = ctx.buf(view.base), view.offset
            copy_pattern(
                ctx, out, dst, src.dst_strides, base, offset, view.strides, src.shape, x.type.dtype
            )
        pos += x.type.shape[axis]


def _index_tiles(ctx: EmitCtx, idx: Value, d: int, dt: DType):
    """For an indirect DMA over rows of width d: (r0, p, index tile, c0, f, row tile) for every
    block of up to 128 indices (loaded into SBUF) and every column chunk of the rows."""
    b = ctx.b
    it = idx.type.dtype
    fmax = TILE_BYTES // dt.itemsize
    idx_pool = b.sbuf_pool(it.itemsize, bufs=2)
    row_pool = b.sbuf_pool(min(max(d, 1), fmax) * dt.itemsize, bufs=2)
    count = idx.type.numel
    for r0 in range(0, count, P):
        p = min(P, count - r0)
        ti = idx_pool.tile(p, (1,), it)
        b.dma(ti, rect(ctx.buf(idx), it, r0, 1, p, 1))
        for _, _, c0, f in tiles_2d(p, d, fmax):
            yield r0, p, ti, c0, f, row_pool.tile(p, (f,), dt)


@register(Op.TAKE)
def emit_take(ctx: EmitCtx, n: Node) -> None:
    b = ctx.b
    table, idx = n.inputs
    rows_v, d = table.type.shape
    dt = table.type.dtype
    out = ctx.alloc(n.out)
    for r0, p, ti, c0, f, tr in _index_tiles(ctx, idx, d, dt):
        view = isa.DramRef(ctx.buf(table), c0, dt, ((d, rows_v), (1, f)))
        b.emit(isa.DmaGather(b.next_queue(), dst=tr, table=view, index=ti))
        b.dma(rect(out, dt, r0 * d + c0, d, p, f), tr)


@register(Op.PUT)
def emit_put(ctx: EmitCtx, n: Node) -> None:
    """Copy the table, then scatter the rows into the copy with indirect DMAs."""
    b = ctx.b
    table, idx, rows = n.inputs
    v, d = table.type.shape
    dt = table.type.dtype
    out = ctx.alloc(n.out)
    strides = contiguous_strides((v, d))
    copy_pattern(ctx, out, 0, strides, ctx.buf(table), 0, strides, (v, d), dt)
    for r0, p, ti, c0, f, tr in _index_tiles(ctx, idx, d, dt):
        b.dma(tr, rect(ctx.buf(rows), dt, r0 * d + c0, d, p, f))
        view = isa.DramRef(out, c0, dt, ((d, v), (1, f)))
        b.emit(
            isa.DmaScatter(b.next_queue(), table=view, src=tr, index=ti, combine=n.attr("combine"))
        )
