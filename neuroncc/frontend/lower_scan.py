"""Lowerings of scans: cumulative sums, products, logsumexp, max and min along an axis.

Each is a Hillis-Steele scan, log2(n) rounds of combining with a shifted copy, so it runs as a
few elementwise kernels whatever the length.
"""

from __future__ import annotations

import torch

from neuroncc.frontend.lower_tensor import slice_axis
from neuroncc.frontend.registry import LowerCtx, norm_dim, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

aten = torch.ops.aten


def _scan(ctx: LowerCtx, y: Value, dim: int, op: Op, identity: float | None) -> Value:
    """Hillis-Steele inclusive scan along dim: log2(n) rounds of combining with a shifted copy.
    The first k positions combine with `identity`, or, for an idempotent op (max, min) given
    None, with themselves."""
    if y.type.rank == 0:
        return y
    dim = norm_dim(dim, y.type.rank)
    n, k = y.type.shape[dim], 1
    while k < n:
        pad_shape = [k if d == dim else s for d, s in enumerate(y.type.shape)]
        head = slice_axis(ctx, y, dim, 0, n - k, 1)
        if identity is None:
            pad = slice_axis(ctx, y, dim, 0, k, 1)
        else:
            pad = ctx.full(identity, pad_shape, y.type.dtype)
        shifted = ctx.op(Op.CONCAT, pad, head, axis=dim)
        y = ctx.op(op, y, shifted)
        k *= 2
    return y


@register_lowering(aten.cumsum.default)
def lower_cumsum(ctx: LowerCtx, x: Value, dim: int, dtype=None) -> Value:
    return _scan(ctx, ctx.cast(x, ctx.out_dtype), dim, Op.ADD, 0)  # exact for integers


@register_lowering(aten.cumprod.default)
def lower_cumprod(ctx: LowerCtx, x: Value, dim: int, dtype=None) -> Value:
    return _scan(ctx, ctx.cast(x, ctx.out_dtype), dim, Op.MUL, 1)


@register_lowering(aten.logcumsumexp.default)
def lower_logcumsumexp(ctx: LowerCtx, x: Value, dim: int) -> Value:
    return _scan(ctx, ctx.cast(x, ctx.out_dtype), dim, Op.LOGADDEXP, float("-inf"))


def _cum_extreme(ctx: LowerCtx, x: Value, dim: int, largest: bool):
    """cummax/cummin: the running extreme (NaN-propagating, as torch.maximum), and the index of
    the latest position that set it. ATen updates at j when x[j] is NaN or beats the running
    value with ties (>=), so exactly where x[j] equals the running value or is NaN."""
    if x.type.rank == 0:
        return x, ctx.full(0, [], DType.I64)
    dim = norm_dim(dim, x.type.rank)
    shape = x.type.shape
    values = _scan(ctx, x, dim, Op.MAX if largest else Op.MIN, None)
    updates = ctx.op(Op.OR, ctx.op(Op.EQ, x, values), ctx.op(Op.NE, x, x))
    iota_shape = [shape[dim] if d == dim else 1 for d in range(len(shape))]
    iota = ctx.broadcast_to(
        ctx.reshape(ctx.op(Op.IOTA, n=shape[dim], start=0, step=1, dtype=DType.I64), iota_shape),
        shape,
    )
    marked = ctx.op(Op.WHERE, updates, iota, ctx.full(0, shape, DType.I64))
    return values, _scan(ctx, marked, dim, Op.MAX, None)


@register_lowering(aten.cummax.default)
def lower_cummax(ctx: LowerCtx, x: Value, dim: int):
    return _cum_extreme(ctx, x, dim, largest=True)


@register_lowering(aten.cummin.default)
def lower_cummin(ctx: LowerCtx, x: Value, dim: int):
    return _cum_extreme(ctx, x, dim, largest=False)
