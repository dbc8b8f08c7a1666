"""Lowerings of indexing ops.

- embedding / index_select on dim 0: the `take` op (an indirect DMA gather on the device);
- gather / scatter along a dim: the same DMAs over the tensor viewed as one element per row,
  addressed by flat positions computed from the index;
- index_put (embedding backward among others): `put`, an indirect DMA scatter whose
  accumulate mode adds rows with repeated indices as index_put(accumulate=True) requires.
"""

from __future__ import annotations

import math

import torch

from neuroncc.frontend.lower_tensor import reduce
from neuroncc.frontend.registry import LowerCtx, norm_dim, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

aten = torch.ops.aten


@register_lowering(aten.embedding.default)
def lower_embedding(ctx: LowerCtx, weight: Value, indices: Value, *args) -> Value:
    if weight.type.rank != 2:
        raise ctx.unsupported(f"embedding needs a 2-d weight, got {weight.type}")
    return ctx.op(Op.TAKE, weight, indices)


@register_lowering(aten.index_select.default)
def lower_index_select(ctx: LowerCtx, x: Value, dim: int, index: Value) -> Value:
    if x.type.rank == 0:  # a 0-d tensor indexes like a 1-element vector
        return ctx.reshape(
            lower_index_select(ctx, ctx.reshape(x, [1]), 0, index), ctx.out_type().shape
        )
    dim = norm_dim(dim, x.type.rank)
    rank = x.type.rank
    perm = [dim] + [d for d in range(rank) if d != dim]
    moved = ctx.transpose(x, perm)
    table = ctx.reshape(moved, [x.type.shape[dim], math.prod(moved.type.shape[1:])])
    rows = ctx.op(Op.TAKE, table, ctx.reshape(index, [index.type.numel]))
    rows = ctx.reshape(rows, [index.type.numel, *moved.type.shape[1:]])
    inverse = [perm.index(d) for d in range(rank)]
    return ctx.transpose(rows, inverse)


def _flat_positions(ctx: LowerCtx, x: Value, index: Value, dim: int) -> Value:
    """i64[index.numel]: for every entry of index, the row-major offset into x of the element it
    addresses along dim (other axes keep the entry's own coordinates, as torch.gather does)."""
    shape = index.type.shape
    strides = contiguous_strides(x.type.shape)
    idx = ctx.cast(_wrap_negative(ctx, index, x.type.shape[dim]), DType.I64)
    off = ctx.op(Op.MUL, idx, ctx.full(strides[dim], shape, DType.I64))
    for d, n in enumerate(shape):
        if d == dim or n == 1:
            continue
        coord = ctx.op(Op.IOTA, n=n, start=0, step=strides[d], dtype=DType.I64)
        coord = ctx.broadcast_to(
            ctx.reshape(coord, [n if a == d else 1 for a in range(len(shape))]), shape
        )
        off = ctx.op(Op.ADD, off, coord)
    return ctx.reshape(off, [index.type.numel])


@register_lowering(aten.gather.default)
def lower_gather(
    ctx: LowerCtx, x: Value, dim: int, index: Value, sparse_grad: bool = False
) -> Value:
    """Element gather: an indirect DMA over x viewed as one element per row."""
    if x.type.rank == 0:
        return x
    dim = norm_dim(dim, x.type.rank)
    table = ctx.reshape(x, [x.type.numel, 1])
    taken = ctx.op(Op.TAKE, table, _flat_positions(ctx, x, index, dim))
    return ctx.reshape(taken, index.type.shape)


def _scatter(
    ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value, accumulate: bool
) -> Value:
    """x with src's entries written (or added) at index along dim: an indirect DMA scatter."""
    if x.type.rank == 0:
        x, index, src = (ctx.reshape(v, [1]) for v in (x, index, src))
    table = ctx.reshape(x, [x.type.numel, 1])
    flat = _flat_positions(ctx, x, index, dim)
    rows = ctx.reshape(src, [flat.type.numel, 1])
    return ctx.reshape(
        ctx.op(Op.PUT, table, flat, rows, combine="add" if accumulate else "set"),
        ctx.out_type().shape,
    )


def _src_like(ctx: LowerCtx, src: Value, index: Value, x: Value) -> Value:
    stops = list(index.type.shape)
    if stops != list(src.type.shape):
        src = ctx.op(
            Op.SLICE, src, starts=[0] * src.type.rank, stops=stops, steps=[1] * src.type.rank
        )
    return ctx.cast(src, x.type.dtype)


@register_lowering(aten.scatter.value)
def lower_scatter_value(ctx: LowerCtx, x: Value, dim: int, index: Value, value) -> Value:
    dim = norm_dim(dim, x.type.rank)
    return _scatter(ctx, x, dim, index, ctx.full(value, index.type.shape, x.type.dtype), False)


@register_lowering(aten.scatter.src)
def lower_scatter_src(ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value) -> Value:
    dim = norm_dim(dim, x.type.rank)
    return _scatter(ctx, x, dim, index, _src_like(ctx, src, index, x), False)


@register_lowering(aten.scatter_add.default)
def lower_scatter_add(ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value) -> Value:
    dim = norm_dim(dim, x.type.rank)
    return _scatter(ctx, x, dim, index, _src_like(ctx, src, index, x), True)


def _linear_index(ctx: LowerCtx, x: Value, indices) -> tuple[int, int, list[int], Value]:
    """For x[i0, i1, ...] with integer index tensors on consecutive axes first..last-1:
    (first, last, the indices' broadcast shape, their row-major linear index over those axes)."""
    present = [d for d, t in enumerate(indices) if t is not None]
    if not present or any(indices[d].type.dtype == DType.BOOL for d in present):
        raise ctx.unsupported("indexing with boolean masks has a data-dependent shape")
    first, last = present[0], present[-1] + 1
    if present != list(range(first, last)):
        raise ctx.unsupported("index tensors separated by slices")
    shape = x.type.shape
    bshape = list(torch.broadcast_shapes(*(torch.Size(indices[d].type.shape) for d in present)))
    flat = None
    for d in present:
        idx = _wrap_negative(ctx, indices[d], shape[d])
        idx = ctx.cast(ctx.broadcast_to(idx, bshape), DType.I64)
        if flat is not None:
            scaled = ctx.op(Op.MUL, flat, ctx.full(shape[d], bshape, DType.I64))
            idx = ctx.op(Op.ADD, scaled, idx)
        flat = idx
    return first, last, bshape, flat


@register_lowering(aten.index_put.default)
def lower_index_put(
    ctx: LowerCtx, x: Value, indices, values: Value, accumulate: bool = False
) -> Value:
    """x[i0, i1, ...] = values (or +=) with integer index tensors on consecutive axes: the axes
    move to the front and linearise into one row index (as in lower_index)."""
    first, last, bshape, flat = _linear_index(ctx, x, indices)
    shape, rank = x.type.shape, x.type.rank
    before, after = list(shape[:first]), list(shape[last:])
    # values broadcast to what x[indices] would be: [*before, *bshape, *after]
    vals = ctx.tensor(values, x.type.dtype, [*before, *bshape, *after])
    nb, ni = len(before), len(bshape)
    vals = ctx.transpose(
        vals,
        list(range(nb, nb + ni)) + list(range(nb)) + list(range(nb + ni, nb + ni + len(after))),
    )
    perm = list(range(first, last)) + [d for d in range(rank) if not first <= d < last]
    rows = math.prod(shape[first:last])
    moved = ctx.transpose(x, perm)
    table = ctx.reshape(moved, [rows, *before, *after])
    result = _index_put_dim0(ctx, table, flat, vals, accumulate)
    result = ctx.reshape(result, moved.type.shape)
    return ctx.transpose(result, [perm.index(d) for d in range(rank)])


def _index_put_dim0(ctx: LowerCtx, x: Value, idx: Value, vals: Value, accumulate: bool) -> Value:
    """x[idx] = vals (or +=) on rows of x: an indirect DMA scatter (`put`)."""
    rows = x.type.shape[0]
    d = math.prod(x.type.shape[1:])
    n = idx.type.numel
    table = ctx.reshape(x, [rows, d])
    flat = ctx.cast(ctx.reshape(idx, [n]), DType.I64)
    out = ctx.op(
        Op.PUT,
        table,
        flat,
        ctx.cast(ctx.reshape(vals, [n, d]), x.type.dtype),
        combine="add" if accumulate else "set",
    )
    return ctx.reshape(out, x.type.shape)


def _wrap_negative(ctx: LowerCtx, idx: Value, size: int) -> Value:
    shape = idx.type.shape
    negative = ctx.op(Op.LT, idx, ctx.full(0, shape, idx.type.dtype))
    return ctx.op(
        Op.WHERE, negative, ctx.op(Op.ADD, idx, ctx.full(size, shape, idx.type.dtype)), idx
    )


@register_lowering(aten.index.Tensor)
def lower_index(ctx: LowerCtx, x: Value, indices) -> Value:
    """x[i0, i1, ...] with integer index tensors on consecutive axes starting at `first`: the
    indices are linearised over those axes and the rows taken with one gather."""
    first, last, bshape, flat = _linear_index(ctx, x, indices)
    out = ctx.out_type()
    shape = x.type.shape
    # Move the indexed axes to the front, gather rows, put the result axes where torch does:
    # in place of the indexed axes (they are consecutive).
    rank = x.type.rank
    perm = list(range(first, last)) + [d for d in range(rank) if not first <= d < last]
    moved = ctx.transpose(x, perm)
    rows = math.prod(shape[first:last])
    rest = [shape[d] for d in range(rank) if not first <= d < last]
    table = ctx.reshape(moved, [rows, math.prod(rest)])
    n = math.prod(bshape)
    taken = ctx.reshape(ctx.op(Op.TAKE, table, ctx.reshape(flat, [n])), [n, *rest])
    # taken: [n, *before, *after] -> [*before, n, *after]
    nb = first
    to_place = list(range(1, nb + 1)) + [0] + list(range(nb + 1, 1 + len(rest)))
    placed = ctx.transpose(taken, to_place)
    return ctx.reshape(placed, out.shape)


@register_lowering(aten.put.default)
def lower_put(
    ctx: LowerCtx, x: Value, index: Value, source: Value, accumulate: bool = False
) -> Value:
    """x.put_(index, source): index_put on x flattened."""
    flat = ctx.reshape(x, [x.type.numel])
    idx = ctx.reshape(_wrap_negative(ctx, index, x.type.numel), [index.type.numel])
    out = _index_put_dim0(ctx, flat, idx, ctx.reshape(source, [source.type.numel]), accumulate)
    return ctx.reshape(out, x.type.shape)


_REDUCE_COMBINE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _identity(reduce: str, dtype: DType) -> float:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.is_float:
        return float("-inf") if reduce == "amax" else float("inf")
    info = torch.iinfo(dtype.torch)
    return info.min if reduce == "amax" else info.max


@register_lowering(aten.scatter_reduce.two)
def lower_scatter_reduce(
    ctx: LowerCtx,
    x: Value,
    dim: int,
    index: Value,
    src: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    """Indirect DMA scatters with the DMA engine's combine: positions the index touches start
    from the reduction's identity when include_self is false; mean divides a scattered sum by a
    scattered count."""
    if reduce not in _REDUCE_COMBINE:
        raise ctx.unsupported(f"scatter_reduce reduce={reduce!r}")
    if reduce == "mean" and not x.type.dtype.is_float:
        raise ctx.unsupported("scatter_reduce mean on integers")
    dim = norm_dim(dim, x.type.rank) if x.type.rank else 0
    shape = x.type.shape or (1,)
    xs = ctx.reshape(x, shape)
    table = ctx.reshape(xs, [xs.type.numel, 1])
    flat = _flat_positions(ctx, xs, ctx.reshape(index, index.type.shape or (1,)), dim)
    n = flat.type.numel
    rows = ctx.reshape(
        _src_like(
            ctx,
            ctx.reshape(src, src.type.shape or (1,)),
            ctx.reshape(index, index.type.shape or (1,)),
            x,
        ),
        [n, 1],
    )
    dt = x.type.dtype
    start = table
    if not include_self:
        start = ctx.op(
            Op.PUT, table, flat, ctx.full(_identity(reduce, dt), [n, 1], dt), combine="set"
        )
    out = ctx.op(Op.PUT, start, flat, rows, combine=_REDUCE_COMBINE[reduce])
    if reduce == "mean":
        ones = ctx.full(1, [n, 1], dt)
        base = ctx.full(1 if include_self else 0, table.type.shape, dt)
        count = ctx.op(Op.PUT, base, flat, ones, combine="add")
        zero = ctx.op(Op.EQ, count, ctx.full(0, count.type.shape, dt))
        safe = ctx.op(Op.WHERE, zero, ctx.full(1, count.type.shape, dt), count)
        out = ctx.op(Op.WHERE, zero, table, ctx.op(Op.DIV, out, safe))
    return ctx.reshape(out, ctx.out_type().shape)


@register_lowering(aten.index_reduce.default)
def lower_index_reduce(
    ctx: LowerCtx,
    x: Value,
    dim: int,
    index: Value,
    source: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    """x.index_reduce(dim, index, source): scatter_reduce with the 1-d index spread over source."""
    dim = norm_dim(dim, x.type.rank) if x.type.rank else 0
    shape = source.type.shape or (1,)
    along = [index.type.numel if d == dim else 1 for d in range(len(shape))]
    full_index = ctx.broadcast_to(ctx.reshape(index, along), shape)
    return lower_scatter_reduce(ctx, x, dim, full_index, source, reduce, include_self=include_self)


_MAX_SORT = 1024  # the rank matrix is n x n per row


def _sorts_before(ctx: LowerCtx, p: Value, q: Value, descending: bool) -> tuple[Value, Value]:
    """(p sorts strictly before q, p ties q), with NaN after everything ascending, first descending."""
    before = ctx.op(Op.GT if descending else Op.LT, p, q)
    tie = ctx.op(Op.EQ, p, q)
    if p.type.dtype.is_float:
        p_nan, q_nan = ctx.op(Op.NE, p, p), ctx.op(Op.NE, q, q)
        nan_first = (
            ctx.op(Op.AND, p_nan, ctx.op(Op.NOT, q_nan))
            if descending
            else ctx.op(Op.AND, q_nan, ctx.op(Op.NOT, p_nan))
        )
        before = ctx.op(Op.OR, before, nan_first)
        tie = ctx.op(Op.OR, tie, ctx.op(Op.AND, p_nan, q_nan))
    return before, tie


def _sort(ctx: LowerCtx, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    """Stable sort by ranks: element i goes to the number of elements that sort before it (ties
    broken by position), one VectorE comparison matrix per row, then a DMA scatter to the ranks."""
    if x.type.rank == 0:
        return x, ctx.full(0, [], DType.I64)
    dim = norm_dim(dim, x.type.rank)
    n = x.type.shape[dim]
    if n > _MAX_SORT:
        raise ctx.unsupported(f"sort of {n} > {_MAX_SORT} elements along one axis")
    rank = x.type.rank
    perm = [d for d in range(rank) if d != dim] + [dim]
    xt = ctx.transpose(x, perm)  # [R..., n]
    lead = list(xt.type.shape[:-1])
    square = [*lead, n, n]
    mine = ctx.broadcast_to(ctx.reshape(xt, [*lead, n, 1]), square)  # [..., i, j] = x_i
    other = ctx.broadcast_to(ctx.reshape(xt, [*lead, 1, n]), square)  # [..., i, j] = x_j
    before, tie = _sorts_before(ctx, other, mine, descending)
    i = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=n, start=0, step=1, dtype=DType.I64), [n, 1]), square
    )
    j = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=n, start=0, step=1, dtype=DType.I64), [1, n]), square
    )
    earlier = ctx.op(Op.OR, before, ctx.op(Op.AND, tie, ctx.op(Op.LT, j, i)))
    ranks = reduce(ctx, Op.REDUCE_SUM, ctx.cast(earlier, DType.I64), [-1], False)  # [R..., n]
    rows = math.prod(lead)
    base = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=rows, start=0, step=n, dtype=DType.I64), [*lead, 1]),
        [*lead, n],
    )
    flat = ctx.reshape(ctx.op(Op.ADD, base, ranks), [rows * n])
    positions = ctx.broadcast_to(ctx.op(Op.IOTA, n=n, start=0, step=1, dtype=DType.I64), [*lead, n])
    out = []
    for v in (xt, positions):
        table = ctx.full(0, [rows * n, 1], v.type.dtype)
        placed = ctx.op(Op.PUT, table, flat, ctx.reshape(v, [rows * n, 1]), combine="set")
        out.append(
            ctx.transpose(ctx.reshape(placed, [*lead, n]), [perm.index(d) for d in range(rank)])
        )
    return out[0], out[1]


@register_lowering(aten.sort.default)
def lower_sort(ctx: LowerCtx, x: Value, dim: int = -1, descending: bool = False):
    return _sort(ctx, x, dim, descending)


@register_lowering(aten.sort.stable)
def lower_sort_stable(
    ctx: LowerCtx, x: Value, *, stable=None, dim: int = -1, descending: bool = False
):
    return _sort(ctx, x, dim, descending)
