"""Lowerings of indexing ops.

- embedding / index_select on dim 0: the `take` op (an indirect DMA gather on the device);
- gather / scatter along a dim: one-hot masks built from iota == index, then where and a reduce
  on the Vector engine (exact: a masked sum has a single non-zero term);
- index_put with one index tensor (embedding backward): a one-hot matrix multiply on TensorE,
  which accumulates duplicate indices as index_put(accumulate=True) requires.
"""

from __future__ import annotations

import math

import torch

from neuroncc.frontend.lower_tensor import reduce
from neuroncc.frontend.registry import LowerCtx, norm_dim, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

aten = torch.ops.aten


@register_lowering(aten.embedding.default)
def lower_embedding(ctx: LowerCtx, weight: Value, indices: Value, *args) -> Value:
    if weight.type.rank != 2:
        raise ctx.unsupported(f"embedding needs a 2-d weight, got {weight.type}")
    return ctx.op(Op.TAKE, weight, indices)


@register_lowering(aten.index_select.default)
def lower_index_select(ctx: LowerCtx, x: Value, dim: int, index: Value) -> Value:
    if x.type.rank == 0:  # a 0-d tensor indexes like a 1-element vector
        return ctx.reshape(lower_index_select(ctx, ctx.reshape(x, [1]), 0, index), ctx.out_type().shape)
    dim = norm_dim(dim, x.type.rank)
    rank = x.type.rank
    perm = [dim] + [d for d in range(rank) if d != dim]
    moved = ctx.transpose(x, perm)
    table = ctx.reshape(moved, [x.type.shape[dim], math.prod(moved.type.shape[1:])])
    rows = ctx.op(Op.TAKE, table, ctx.reshape(index, [index.type.numel]))
    rows = ctx.reshape(rows, [index.type.numel, *moved.type.shape[1:]])
    inverse = [perm.index(d) for d in range(rank)]
    return ctx.transpose(rows, inverse)


def _one_hot(ctx: LowerCtx, index: Value, size: int) -> Value:
    """bool[*index.shape, size]: position c is true where c == index."""
    shape = [*index.type.shape, size]
    iota = ctx.op(Op.IOTA, n=size, start=0, step=1, dtype=index.type.dtype)
    iota = ctx.broadcast_to(iota, shape)
    idx = ctx.broadcast_to(ctx.reshape(index, [*index.type.shape, 1]), shape)
    return ctx.op(Op.EQ, iota, idx)


def _move_last(ctx: LowerCtx, x: Value, dim: int) -> Value:
    rank = x.type.rank
    return ctx.transpose(x, [d for d in range(rank) if d != dim] + [dim])


def _move_back(ctx: LowerCtx, x: Value, dim: int) -> Value:
    rank = x.type.rank
    perm = list(range(rank - 1))
    perm.insert(dim, rank - 1)
    return ctx.transpose(x, perm)


@register_lowering(aten.gather.default)
def lower_gather(ctx: LowerCtx, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    dim = norm_dim(dim, x.type.rank)
    if x.type.rank == 0:
        return x
    size = x.type.shape[dim]
    # Only positions inside index's extent take part (torch.gather semantics).
    stops = [size if d == dim else index.type.shape[d] for d in range(x.type.rank)]
    if stops != list(x.type.shape):
        x = ctx.op(Op.SLICE, x, starts=[0] * x.type.rank, stops=stops, steps=[1] * x.type.rank)
    idx_t = _move_last(ctx, index, dim)  # [..., k]
    x_t = _move_last(ctx, x, dim)  # [..., size]
    hot = _one_hot(ctx, idx_t, size)  # [..., k, size]
    src = ctx.broadcast_to(ctx.reshape(x_t, [*x_t.type.shape[:-1], 1, size]), hot.type.shape)
    picked = ctx.op(Op.WHERE, hot, src, ctx.full(0, hot.type.shape, x.type.dtype))
    summed = reduce(ctx, Op.REDUCE_SUM, picked, [-1], False)  # [..., k]
    return _move_back(ctx, summed, dim)


def _scatter_mask_and_values(ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value | None):
    """For scatter along dim with index shaped like x off dim: (hit mask, summed src) over x."""
    if any(index.type.shape[d] != x.type.shape[d] for d in range(x.type.rank) if d != dim):
        raise ctx.unsupported("scatter with an index smaller than self off the scatter dim")
    size = x.type.shape[dim]
    idx_t = _move_last(ctx, index, dim)  # [R..., k]
    hot = _one_hot(ctx, idx_t, size)  # [R..., k, size]
    rank = hot.type.rank
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    hot_t = ctx.transpose(hot, swap)  # [R..., size, k]
    hit = ctx.op(Op.GT, reduce(ctx, Op.REDUCE_SUM, ctx.cast(hot_t, DType.F32), [-1], False), ctx.full(0, hot_t.type.shape[:-1], DType.F32))
    summed = None
    if src is not None:
        src_t = _move_last(ctx, src, dim)  # [R..., k]
        vals = ctx.broadcast_to(ctx.reshape(src_t, [*src_t.type.shape[:-1], 1, src_t.type.shape[-1]]), hot_t.type.shape)
        picked = ctx.op(Op.WHERE, hot_t, vals, ctx.full(0, hot_t.type.shape, x.type.dtype))
        summed = _move_back(ctx, reduce(ctx, Op.REDUCE_SUM, picked, [-1], False), dim)
    return _move_back(ctx, hit, dim), summed


def _src_like(ctx: LowerCtx, src: Value, index: Value, x: Value) -> Value:
    stops = list(index.type.shape)
    if stops != list(src.type.shape):
        src = ctx.op(Op.SLICE, src, starts=[0] * src.type.rank, stops=stops, steps=[1] * src.type.rank)
    return ctx.cast(src, x.type.dtype)


@register_lowering(aten.scatter.value)
def lower_scatter_value(ctx: LowerCtx, x: Value, dim: int, index: Value, value) -> Value:
    dim = norm_dim(dim, x.type.rank)
    hit, _ = _scatter_mask_and_values(ctx, x, dim, index, None)
    return ctx.op(Op.WHERE, hit, ctx.full(value, x.type.shape, x.type.dtype), x)


@register_lowering(aten.scatter.src)
def lower_scatter_src(ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value) -> Value:
    # Duplicate indices are undefined behaviour in PyTorch; here they would sum.
    dim = norm_dim(dim, x.type.rank)
    hit, summed = _scatter_mask_and_values(ctx, x, dim, index, _src_like(ctx, src, index, x))
    return ctx.op(Op.WHERE, hit, summed, x)


@register_lowering(aten.scatter_add.default)
def lower_scatter_add(ctx: LowerCtx, x: Value, dim: int, index: Value, src: Value) -> Value:
    dim = norm_dim(dim, x.type.rank)
    _, summed = _scatter_mask_and_values(ctx, x, dim, index, _src_like(ctx, src, index, x))
    return ctx.op(Op.ADD, x, summed)


@register_lowering(aten.index_put.default)
def lower_index_put(ctx: LowerCtx, x: Value, indices, values: Value, accumulate: bool = False) -> Value:
    """x[i0, i1, ...] = values (or +=) with integer index tensors on consecutive axes: the axes
    move to the front and linearise into one row index (as in lower_index)."""
    present = [d for d, t in enumerate(indices) if t is not None]
    if not present or any(indices[d].type.dtype == DType.BOOL for d in present):
        raise ctx.unsupported("index_put with boolean masks has a data-dependent shape")
    first, last = present[0], present[-1] + 1
    if present != list(range(first, last)):
        raise ctx.unsupported("index tensors separated by slices")
    if not x.type.dtype.is_float:
        raise ctx.unsupported(f"index_put into {x.type.dtype.value} (float tensors only)")
    shape, rank = x.type.shape, x.type.rank
    bshape = list(torch.broadcast_shapes(*(torch.Size(indices[d].type.shape) for d in present)))
    flat = None
    for d in present:
        idx = ctx.cast(ctx.broadcast_to(_wrap_negative(ctx, indices[d], shape[d]), bshape), DType.I64)
        flat = idx if flat is None else ctx.op(Op.ADD, ctx.op(Op.MUL, flat, ctx.full(shape[d], bshape, DType.I64)), idx)
    before, after = list(shape[:first]), list(shape[last:])
    # values broadcast to what x[indices] would be: [*before, *bshape, *after]
    vals = ctx.tensor(values, DType.F32, [*before, *bshape, *after])
    nb, ni = len(before), len(bshape)
    vals = ctx.transpose(vals, list(range(nb, nb + ni)) + list(range(nb)) + list(range(nb + ni, nb + ni + len(after))))
    perm = list(range(first, last)) + [d for d in range(rank) if not first <= d < last]
    rows = math.prod(shape[first:last])
    moved = ctx.transpose(x, perm)
    table = ctx.reshape(moved, [rows, *before, *after])
    result = _index_put_dim0(ctx, table, flat, vals, accumulate)
    result = ctx.reshape(result, moved.type.shape)
    return ctx.transpose(result, [perm.index(d) for d in range(rank)])


def _index_put_dim0(ctx: LowerCtx, x: Value, idx: Value, vals: Value, accumulate: bool) -> Value:
    rows = x.type.shape[0]
    row_shape = x.type.shape[1:]
    n = idx.type.numel
    vals = ctx.reshape(vals, [n, math.prod(row_shape)])
    hot = _one_hot(ctx, ctx.reshape(idx, [n]), rows)  # [n, rows]
    hot_t = ctx.transpose(ctx.cast(hot, DType.F32), [1, 0])  # [rows, n]
    contrib = ctx.reshape(ctx.cast(ctx.op(Op.MATMUL, hot_t, vals), x.type.dtype), x.type.shape)
    if accumulate:
        return ctx.op(Op.ADD, x, contrib)
    hit = ctx.op(Op.GT, reduce(ctx, Op.REDUCE_SUM, hot_t, [1], False), ctx.full(0, [rows], DType.F32))
    hit = ctx.broadcast_to(ctx.reshape(hit, [rows] + [1] * len(row_shape)), x.type.shape)
    return ctx.op(Op.WHERE, hit, contrib, x)


def _wrap_negative(ctx: LowerCtx, idx: Value, size: int) -> Value:
    shape = idx.type.shape
    negative = ctx.op(Op.LT, idx, ctx.full(0, shape, idx.type.dtype))
    return ctx.op(Op.WHERE, negative, ctx.op(Op.ADD, idx, ctx.full(size, shape, idx.type.dtype)), idx)


@register_lowering(aten.index.Tensor)
def lower_index(ctx: LowerCtx, x: Value, indices) -> Value:
    """x[i0, i1, ...] with integer index tensors on consecutive axes starting at `first`: the
    indices are linearised over those axes and the rows taken with one gather."""
    present = [d for d, t in enumerate(indices) if t is not None]
    if not present or any(indices[d].type.dtype == DType.BOOL for d in present):
        raise ctx.unsupported("indexing with boolean masks has a data-dependent shape")
    first, last = present[0], present[-1] + 1
    if present != list(range(first, last)):
        raise ctx.unsupported("index tensors separated by slices")
    out = ctx.out_type()
    shape = x.type.shape
    bshape = torch.broadcast_shapes(*(torch.Size(indices[d].type.shape) for d in present))
    flat = None
    for d in present:
        idx = ctx.cast(ctx.broadcast_to(_wrap_negative(ctx, indices[d], shape[d]), bshape), DType.I64)
        if flat is None:
            flat = idx
        else:
            flat = ctx.op(Op.ADD, ctx.op(Op.MUL, flat, ctx.full(shape[d], bshape, DType.I64)), idx)
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
