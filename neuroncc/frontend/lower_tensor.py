"""Hand-written lowerings for ops with real semantics: matmuls, views, reductions, softmax,
layer norm, constants. Indexing ops (embedding, gather, scatter, index_put) are in lower_index.py.

View-like ops take their result shape from the FX node's metadata (already resolved -1s etc.).
"""

from __future__ import annotations

import math

import torch

from neuroncc.frontend.registry import LowerCtx, norm_dim, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

aten = torch.ops.aten


# -- matmul ---------------------------------------------------------------------------------


@register_lowering(aten.mm.default, aten.bmm.default)
def lower_mm(ctx: LowerCtx, a: Value, b: Value) -> Value:
    return ctx.op(Op.MATMUL, a, b)


def scaled_sum(ctx: LowerCtx, prod: Value, bias, alpha, beta) -> Value:
    """alpha * prod + beta * bias, the epilogue of addmm / addmv / addbmm."""
    out = ctx.out_type()
    if alpha != 1:
        prod = ctx.op(Op.MUL, prod, ctx.full(alpha, out.shape, out.dtype))
    if beta == 0:
        return prod
    bias = ctx.tensor(bias, out.dtype, out.shape)
    if beta != 1:
        bias = ctx.op(Op.MUL, bias, ctx.full(beta, out.shape, out.dtype))
    return ctx.op(Op.ADD, prod, bias)


@register_lowering(aten.addmm.default)
def lower_addmm(ctx: LowerCtx, bias: Value, a: Value, b: Value, beta=1, alpha=1) -> Value:
    return scaled_sum(ctx, ctx.op(Op.MATMUL, a, b), bias, alpha, beta)


# -- views and layout -------------------------------------------------------------------------


@register_lowering(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.flatten.using_ints,
    aten.view_as.default,
    aten.view_copy.default,
    aten.unsqueeze_copy.default,
    aten.squeeze_copy.dims,
    aten._reshape_copy.default,
)
def lower_view(ctx: LowerCtx, x: Value, *args) -> Value:
    return ctx.reshape(x, ctx.out_type().shape)


@register_lowering(aten.expand.default, aten.expand_copy.default)
def lower_expand(ctx: LowerCtx, x: Value, size, implicit: bool = False) -> Value:
    return ctx.broadcast_to(x, ctx.out_type().shape)


@register_lowering(aten.permute.default, aten.permute_copy.default)
def lower_permute(ctx: LowerCtx, x: Value, dims) -> Value:
    return ctx.transpose(x, [norm_dim(d, x.type.rank) for d in dims])


@register_lowering(aten.t.default)
def lower_t(ctx: LowerCtx, x: Value) -> Value:
    return ctx.transpose(x, [1, 0]) if x.type.rank == 2 else x


@register_lowering(aten.transpose.int)
def lower_transpose(ctx: LowerCtx, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(x.type.rank))
    if x.type.rank:
        d0, d1 = norm_dim(d0, x.type.rank), norm_dim(d1, x.type.rank)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.transpose(x, perm)


def slice_axis(ctx: LowerCtx, x: Value, dim: int, start, end, step: int) -> Value:
    size = x.type.shape[dim]
    r = range(size)[slice(start, end, step)]
    lo = min(r.start, size)
    hi = lo + (len(r) - 1) * step + 1 if len(r) else lo
    starts = [0] * x.type.rank
    stops = list(x.type.shape)
    steps = [1] * x.type.rank
    starts[dim], stops[dim], steps[dim] = lo, hi, step
    if (starts, stops, steps) == ([0] * x.type.rank, list(x.type.shape), [1] * x.type.rank):
        return x
    return ctx.op(Op.SLICE, x, starts=starts, stops=stops, steps=steps)


@register_lowering(aten.narrow_copy.default)
def lower_narrow(ctx: LowerCtx, x: Value, dim: int, start: int, length: int) -> Value:
    dim = norm_dim(dim, x.type.rank)
    start = start % x.type.shape[dim] if start < 0 else start
    return slice_axis(ctx, x, dim, start, start + length, 1)


@register_lowering(aten.unfold.default)
def lower_unfold(ctx: LowerCtx, x: Value, dim: int, size: int, step: int) -> Value:
    """Sliding windows along dim as one strided view: [..., windows, ..., size]."""
    if x.type.rank == 0:
        return ctx.reshape(x, [1])
    dim = norm_dim(dim, x.type.rank)
    st = contiguous_strides(x.type.shape)
    shape = list(ctx.out_type().shape)
    strides = [s * step if d == dim else s for d, s in enumerate(st)] + [st[dim]]
    return ctx.op(Op.STRIDED, x, shape=shape, strides=strides, offset=0)


@register_lowering(aten.as_strided.default)
def lower_as_strided(ctx: LowerCtx, x: Value, size, stride, storage_offset=None) -> Value:
    """as_strided addresses storage; the IR addresses row-major values. They agree when the
    input is contiguous with storage offset 0, which the FX metadata tells."""
    meta = ctx.node.args[0].meta.get("val")
    if meta is None or not meta.is_contiguous() or meta.storage_offset() != 0:
        raise ctx.unsupported("as_strided of a tensor that is not contiguous from offset 0")
    return ctx.op(Op.STRIDED, x, shape=list(size), strides=list(stride), offset=storage_offset or 0)


@register_lowering(aten.slice.Tensor)
def lower_slice(
    ctx: LowerCtx, x: Value, dim: int = 0, start=None, end=None, step: int = 1
) -> Value:
    return slice_axis(ctx, x, norm_dim(dim, x.type.rank), start, end, step)


@register_lowering(aten.select.int)
def lower_select(ctx: LowerCtx, x: Value, dim: int, index: int) -> Value:
    dim = norm_dim(dim, x.type.rank)
    index = index % x.type.shape[dim]
    return ctx.reshape(slice_axis(ctx, x, dim, index, index + 1, 1), ctx.out_type().shape)


@register_lowering(aten.flip.default)
def lower_flip(ctx: LowerCtx, x: Value, dims) -> Value:
    axes = sorted({norm_dim(d, x.type.rank) for d in dims if x.type.rank})
    return ctx.op(Op.REVERSE, x, axes=axes) if axes else x


@register_lowering(aten.split_with_sizes.default)
def lower_split_with_sizes(ctx: LowerCtx, x: Value, sizes, dim: int = 0) -> tuple[Value, ...]:
    dim = norm_dim(dim, x.type.rank)
    parts, pos = [], 0
    for s in sizes:
        parts.append(slice_axis(ctx, x, dim, pos, pos + s, 1))
        pos += s
    return tuple(parts)


@register_lowering(aten.split.Tensor)
def lower_split(ctx: LowerCtx, x: Value, size: int, dim: int = 0) -> tuple[Value, ...]:
    dim = norm_dim(dim, x.type.rank)
    total = x.type.shape[dim]
    sizes = [min(size, total - p) for p in range(0, total, size)] or [0]
    return lower_split_with_sizes(ctx, x, sizes, dim)


@register_lowering(aten.unbind.int)
def lower_unbind(ctx: LowerCtx, x: Value, dim: int = 0) -> tuple[Value, ...]:
    dim = norm_dim(dim, x.type.rank)
    shape = x.type.shape[:dim] + x.type.shape[dim + 1 :]
    return tuple(
        ctx.reshape(slice_axis(ctx, x, dim, i, i + 1, 1), shape) for i in range(x.type.shape[dim])
    )


@register_lowering(aten.cat.default)
def lower_cat(ctx: LowerCtx, tensors, dim: int = 0) -> Value:
    out = ctx.out_type()
    # Legacy behaviour: 1-d empty tensors are skipped whatever the other ranks.
    parts = [
        ctx.cast(t, out.dtype) for t in tensors if not (t.type.rank == 1 and t.type.numel == 0)
    ]
    if not parts:
        return ctx.full(0, out.shape, out.dtype)
    dim = norm_dim(dim, out.rank)
    return ctx.concat(parts, axis=dim)


# -- reductions -------------------------------------------------------------------------------


def reduce(ctx: LowerCtx, op: Op, x: Value, dims, keepdim: bool) -> Value:
    """Reduce any axes: transpose them to the end (Note [trailing reductions]), reduce, reshape."""
    rank = x.type.rank
    axes = sorted({norm_dim(d, rank) for d in dims}) if dims else list(range(rank))
    if rank == 0:
        return x
    kept = [d for d in range(rank) if d not in axes]
    y = ctx.transpose(x, kept + axes)
    y = ctx.op(op, y, axes=list(range(len(kept), rank)), keepdim=False)
    if keepdim:
        y = ctx.reshape(y, [1 if d in axes else s for d, s in enumerate(x.type.shape)])
    return y


def reduced_count(x: Value, dims) -> int:
    rank = x.type.rank
    if rank == 0:
        return 1
    axes = {norm_dim(d, rank) for d in dims} if dims else set(range(rank))
    return math.prod(x.type.shape[d] for d in axes)


@register_lowering(aten.sum.dim_IntList, aten.sum.default)
def lower_sum(ctx: LowerCtx, x: Value, dims=None, keepdim: bool = False, dtype=None) -> Value:
    return reduce(ctx, Op.REDUCE_SUM, ctx.cast(x, ctx.out_dtype), dims, keepdim)


@register_lowering(aten.mean.dim, aten.mean.default)
def lower_mean(ctx: LowerCtx, x: Value, dims=None, keepdim: bool = False, dtype=None) -> Value:
    out = ctx.out_type()
    s = reduce(ctx, Op.REDUCE_SUM, ctx.cast(x, out.dtype), dims, keepdim)
    return ctx.op(Op.DIV, s, ctx.full(reduced_count(x, dims), out.shape, out.dtype))


@register_lowering(aten.amax.default, aten.max.default)
def lower_amax(ctx: LowerCtx, x: Value, dims=(), keepdim: bool = False) -> Value:
    return reduce(ctx, Op.REDUCE_MAX, x, dims, keepdim)


@register_lowering(aten.amin.default, aten.min.default)
def lower_amin(ctx: LowerCtx, x: Value, dims=(), keepdim: bool = False) -> Value:
    return reduce(ctx, Op.REDUCE_MIN, x, dims, keepdim)


def _any_all(ctx: LowerCtx, op: Op, x: Value, dims, keepdim: bool) -> Value:
    truthy = ctx.cast(ctx.cast(x, DType.BOOL), DType.F32)
    r = reduce(ctx, op, truthy, dims, keepdim)
    return ctx.op(Op.GT, r, ctx.full(0, r.type.shape, DType.F32))


@register_lowering(aten.any.dim, aten.any.dims, aten.any.default)
def lower_any(ctx: LowerCtx, x: Value, dims=None, keepdim: bool = False) -> Value:
    dims = [dims] if isinstance(dims, int) else dims
    return _any_all(ctx, Op.REDUCE_MAX, x, dims, keepdim)


@register_lowering(aten.all.dim, aten.all.dims, aten.all.default)
def lower_all(ctx: LowerCtx, x: Value, dims=None, keepdim: bool = False) -> Value:
    dims = [dims] if isinstance(dims, int) else dims
    return _any_all(ctx, Op.REDUCE_MIN, x, dims, keepdim)


def _arg_reduce(ctx: LowerCtx, op: Op, x: Value, dim, keepdim: bool) -> tuple[Value, Value]:
    """(values, first index) of max/min along dim: compare with the extreme, take the least
    matching index."""
    if dim is None or x.type.rank == 0:
        x, dim = ctx.reshape(x, [x.type.numel]), 0
    dim = norm_dim(dim, x.type.rank)
    ext = reduce(ctx, op, x, [dim], True)
    hit = ctx.op(Op.EQ, x, ctx.broadcast_to(ext, x.type.shape))
    size = x.type.shape[dim]
    shape_1 = [size if d == dim else 1 for d in range(x.type.rank)]
    iota = ctx.reshape(ctx.op(Op.IOTA, n=size, start=0, step=1, dtype=DType.I64), shape_1)
    cand = ctx.op(
        Op.WHERE, hit, ctx.broadcast_to(iota, x.type.shape), ctx.full(size, x.type.shape, DType.I64)
    )
    idx = reduce(ctx, Op.REDUCE_MIN, cand, [dim], keepdim)
    vals = ext if keepdim else ctx.reshape(ext, idx.type.shape)
    return vals, idx


@register_lowering(aten.max.dim)
def lower_max_dim(ctx: LowerCtx, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    return _arg_reduce(ctx, Op.REDUCE_MAX, x, dim, keepdim)


@register_lowering(aten.min.dim)
def lower_min_dim(ctx: LowerCtx, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    return _arg_reduce(ctx, Op.REDUCE_MIN, x, dim, keepdim)


@register_lowering(aten.argmax.default)
def lower_argmax(ctx: LowerCtx, x: Value, dim=None, keepdim: bool = False) -> Value:
    return ctx.reshape(_arg_reduce(ctx, Op.REDUCE_MAX, x, dim, keepdim)[1], ctx.out_type().shape)


@register_lowering(aten.argmin.default)
def lower_argmin(ctx: LowerCtx, x: Value, dim=None, keepdim: bool = False) -> Value:
    return ctx.reshape(_arg_reduce(ctx, Op.REDUCE_MIN, x, dim, keepdim)[1], ctx.out_type().shape)


# -- constants --------------------------------------------------------------------------------


@register_lowering(
    aten.full.default,
    aten.full_like.default,
    aten.zeros.default,
    aten.ones.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    aten.scalar_tensor.default,
    aten.empty_strided.default,
    aten.empty_permuted.default,
    aten.new_empty_strided.default,
    aten._efficientzerotensor.default,
)
def lower_full(ctx: LowerCtx, *args, **kwargs) -> Value:
    # Which argument holds the fill value depends on the op; `empty*` fill with 0 (any value
    # is allowed there, and a defined one keeps results reproducible).
    name = ctx.node.target.name().split("::")[1]
    fill = {
        "full": lambda: args[1],
        "full_like": lambda: args[1],
        "new_full": lambda: args[2],
        "scalar_tensor": lambda: args[0],
        "ones": lambda: 1,
        "ones_like": lambda: 1,
        "new_ones": lambda: 1,
    }.get(name, lambda: 0)()
    out = ctx.out_type()
    return ctx.full(fill, out.shape, out.dtype)


def _iota(ctx: LowerCtx, start, step) -> Value:
    out = ctx.out_type()
    return ctx.op(Op.IOTA, n=out.shape[0], start=start, step=step, dtype=out.dtype)


@register_lowering(aten.arange.default)
def lower_arange(ctx: LowerCtx, end, **kwargs) -> Value:
    return _iota(ctx, 0, 1)


@register_lowering(aten.arange.start, aten.arange.start_step)
def lower_arange_start(ctx: LowerCtx, start, end, step=1, **kwargs) -> Value:
    return _iota(ctx, start, step)


# -- selection ------------------------------------------------------------------------------


@register_lowering(aten.topk.default)
def lower_topk(
    ctx: LowerCtx, x: Value, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
):
    """k rounds of: the extreme among positions not yet taken, and its first index."""
    dim = norm_dim(dim, x.type.rank)
    shape, n = x.type.shape, x.type.shape[dim]
    dt = x.type.dtype
    worst = float("-inf") if largest else float("inf")
    if not dt.is_float:
        info = torch.iinfo(dt.torch)
        worst = info.min if largest else info.max
    op = Op.REDUCE_MAX if largest else Op.REDUCE_MIN
    iota_shape = [n if d == dim else 1 for d in range(len(shape))]
    iota = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=n, start=0, step=1, dtype=DType.I64), iota_shape), shape
    )
    taken = ctx.full(0, shape, DType.BOOL)
    values, indices = [], []
    for _ in range(k):
        cand = ctx.op(Op.WHERE, taken, ctx.full(worst, shape, dt), x)
        ext = reduce(ctx, op, cand, [dim], True)
        hit = ctx.op(Op.AND, ctx.op(Op.EQ, x, ctx.broadcast_to(ext, shape)), ctx.op(Op.NOT, taken))
        idx = reduce(
            ctx,
            Op.REDUCE_MIN,
            ctx.op(Op.WHERE, hit, iota, ctx.full(n, shape, DType.I64)),
            [dim],
            True,
        )
        taken = ctx.op(Op.OR, taken, ctx.op(Op.EQ, iota, ctx.broadcast_to(idx, shape)))
        values.append(ext)
        indices.append(idx)
    if k == 0:
        empty = [0 if d == dim else s for d, s in enumerate(shape)]
        return ctx.full(0, empty, dt), ctx.full(0, empty, DType.I64)
    return ctx.concat(values, axis=dim), ctx.concat(indices, axis=dim)


@register_lowering(aten.constant_pad_nd.default)
def lower_constant_pad(ctx: LowerCtx, x: Value, pad, value=0) -> Value:
    """pad lists (before, after) pairs from the last axis backwards; negative pads crop."""
    y = x
    for i in range(len(pad) // 2):
        dim = x.type.rank - 1 - i
        before, after = pad[2 * i], pad[2 * i + 1]
        size = y.type.shape[dim]
        y = slice_axis(ctx, y, dim, max(0, -before), size - max(0, -after), 1)
        parts = []
        for width in (before, None, after):
            if width is None:
                parts.append(y)
            elif width > 0:
                parts.append(
                    ctx.full(
                        value,
                        [width if d == dim else s for d, s in enumerate(y.type.shape)],
                        y.type.dtype,
                    )
                )
        y = ctx.concat(parts, axis=dim)
    return y


@register_lowering(aten.slice_scatter.default)
def lower_slice_scatter(
    ctx: LowerCtx, x: Value, src: Value, dim: int = 0, start=None, end=None, step: int = 1
) -> Value:
    """x with x[start:end:step] along dim replaced by src: a concat of the piece before, the
    replaced stretch and the piece after. With a step, the stretch is seen as [n, step] along
    dim (padded to whole groups): the first of each group is src's, the rest x's."""
    dim = norm_dim(dim, x.type.rank)
    shape, size = list(x.type.shape), x.type.shape[dim]
    r = range(size)[slice(start, end, step)]
    n, lo = len(r), r.start
    if n == 0:
        return x
    src = ctx.cast(src, x.type.dtype)
    hi = min(size, lo + n * step)
    if step > 1:
        stretch = slice_axis(ctx, x, dim, lo, hi, 1)
        if hi - lo < n * step:  # the last group, cut short by the end of the axis
            pad = ctx.full(0, shape[:dim] + [lo + n * step - hi] + shape[dim + 1 :], x.type.dtype)
            stretch = ctx.concat([stretch, pad], axis=dim)
        groups = ctx.reshape(stretch, shape[:dim] + [n, step] + shape[dim + 1 :])
        firsts = ctx.reshape(src, shape[:dim] + [n, 1] + shape[dim + 1 :])
        rest = slice_axis(ctx, groups, dim + 1, 1, step, 1)
        merged = ctx.concat([firsts, rest], axis=dim + 1)
        src = ctx.reshape(merged, shape[:dim] + [n * step] + shape[dim + 1 :])
        src = slice_axis(ctx, src, dim, 0, hi - lo, 1)
    parts = [
        p
        for p in (
            slice_axis(ctx, x, dim, 0, lo, 1),
            src,
            slice_axis(ctx, x, dim, hi, size, 1),
        )
        if p.type.shape[dim]
    ]
    return ctx.concat(parts, axis=dim)


@register_lowering(aten.prod.default, aten.prod.dim_int)
def lower_prod(ctx: LowerCtx, x: Value, dim=None, keepdim: bool = False, dtype=None) -> Value:
    dims = None if dim is None else [dim]
    return reduce(ctx, Op.REDUCE_PROD, ctx.cast(x, ctx.out_dtype), dims, keepdim)


def _diagonal_mask(ctx: LowerCtx, n1: int, n2: int, offset: int) -> Value:
    """bool[n1, n2]: true where j - i == offset."""
    i = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=n1, start=offset, step=1, dtype=DType.I64), [n1, 1]), [n1, n2]
    )
    j = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=n2, start=0, step=1, dtype=DType.I64), [1, n2]), [n1, n2]
    )
    return ctx.op(Op.EQ, i, j)


def _diag_axes_last(ctx: LowerCtx, x: Value, d1: int, d2: int) -> Value:
    rank = x.type.rank
    return ctx.transpose(x, [d for d in range(rank) if d not in (d1, d2)] + [d1, d2])


@register_lowering(aten.diagonal.default)
def lower_diagonal(ctx: LowerCtx, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    """Masked reduction over the last axis: exact (one non-zero term per output)."""
    d1, d2 = norm_dim(dim1, x.type.rank), norm_dim(dim2, x.type.rank)
    t = _diag_axes_last(ctx, x, d1, d2)  # [..., n1, n2]
    n1, n2 = t.type.shape[-2:]
    mask = ctx.broadcast_to(_diagonal_mask(ctx, n1, n2, offset), t.type.shape)
    picked = ctx.op(Op.WHERE, mask, t, ctx.full(0, t.type.shape, t.type.dtype))
    if offset >= 0:
        rows = slice_axis(ctx, picked, t.type.rank - 2, 0, max(0, min(n1, n2 - offset)), 1)
    else:
        rows = slice_axis(ctx, picked, t.type.rank - 2, -offset, n1, 1)
    return ctx.reshape(reduce(ctx, Op.REDUCE_SUM, rows, [-1], False), ctx.out_type().shape)


@register_lowering(aten.diagonal_scatter.default)
def lower_diagonal_scatter(
    ctx: LowerCtx, x: Value, src: Value, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> Value:
    d1, d2 = norm_dim(dim1, x.type.rank), norm_dim(dim2, x.type.rank)
    t = _diag_axes_last(ctx, x, d1, d2)
    n1, n2 = t.type.shape[-2:]
    mask = ctx.broadcast_to(_diagonal_mask(ctx, n1, n2, offset), t.type.shape)
    # src[..., k] goes to row k (offset >= 0) or row k - offset: place it along the rows, padded.
    lead = t.type.shape[:-2]
    k = src.type.shape[-1]
    start = 0 if offset >= 0 else -offset
    col = ctx.reshape(ctx.cast(src, x.type.dtype), [*lead, k, 1])
    parts = [
        p
        for p in (
            ctx.full(0, [*lead, start, 1], x.type.dtype) if start else None,
            col,
            ctx.full(0, [*lead, n1 - start - k, 1], x.type.dtype) if n1 - start - k else None,
        )
        if p is not None
    ]
    rows = ctx.concat(parts, axis=len(lead))
    placed = ctx.op(Op.WHERE, mask, ctx.broadcast_to(rows, t.type.shape), t)
    rank = x.type.rank
    perm = [d for d in range(rank) if d not in (d1, d2)] + [d1, d2]
    return ctx.transpose(placed, [perm.index(d) for d in range(rank)])


@register_lowering(aten.repeat.default)
def lower_repeat(ctx: LowerCtx, x: Value, repeats) -> Value:
    """Broadcast each axis to [r, n] and merge: row-major order is repeat's order."""
    lead = len(repeats) - x.type.rank
    shape = [1] * lead + list(x.type.shape)
    y = ctx.reshape(x, [v for n in shape for v in (1, n)])
    y = ctx.broadcast_to(y, [v for r, n in zip(repeats, shape, strict=True) for v in (r, n)])
    return ctx.reshape(y, ctx.out_type().shape)


@register_lowering(aten.mv.default)
def lower_mv(ctx: LowerCtx, a: Value, v: Value) -> Value:
    return ctx.reshape(
        ctx.op(Op.MATMUL, a, ctx.reshape(v, [v.type.numel, 1])), ctx.out_type().shape
    )


@register_lowering(aten.dot.default)
def lower_dot(ctx: LowerCtx, a: Value, b: Value) -> Value:
    prod = ctx.op(Op.MATMUL, ctx.reshape(a, [1, a.type.numel]), ctx.reshape(b, [b.type.numel, 1]))
    return ctx.reshape(prod, [])


@register_lowering(aten.addmv.default)
def lower_addmv(ctx: LowerCtx, bias: Value, a: Value, v: Value, beta=1, alpha=1) -> Value:
    return scaled_sum(ctx, lower_mv(ctx, a, v), bias, alpha, beta)


@register_lowering(aten.addbmm.default)
def lower_addbmm(ctx: LowerCtx, bias: Value, a: Value, b: Value, beta=1, alpha=1) -> Value:
    """bias * beta + alpha * sum_i a[i] @ b[i]: the batch folds into the contraction."""
    nb, m, k = a.type.shape
    a2 = ctx.reshape(ctx.transpose(a, [1, 0, 2]), [m, nb * k])
    prod = ctx.op(Op.MATMUL, a2, ctx.reshape(b, [nb * k, b.type.shape[-1]]))
    return scaled_sum(ctx, prod, bias, alpha, beta)
