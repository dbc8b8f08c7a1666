"""Lowerings of neural-network building blocks: softmax, normalisations (layer, group, batch,
RMS through its parts), variance and norms. Convolution: lower_conv.py.

Statistics are computed in fp32 whatever the input dtype, as PyTorch does for low precision.
"""

from __future__ import annotations

import math

import torch

from neuroncc.frontend.lower_tensor import reduce, reduced_count
from neuroncc.frontend.registry import LowerCtx, norm_dim, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

aten = torch.ops.aten


# -- normalisations ---------------------------------------------------------------------------


def _bcast(ctx: LowerCtx, v: Value, like: Value) -> Value:
    return ctx.broadcast_to(v, like.type.shape)


def softmax(ctx: LowerCtx, x: Value, dim: int, log: bool) -> Value:
    """exp(x - max) / sum, in fp32 (as PyTorch computes low-precision softmax)."""
    xf = ctx.cast(x, DType.F32)
    m = reduce(ctx, Op.REDUCE_MAX, xf, [dim], True)
    shifted = ctx.op(Op.SUB, xf, _bcast(ctx, m, xf))
    e = ctx.op(Op.EXP, shifted)
    s = reduce(ctx, Op.REDUCE_SUM, e, [dim], True)
    if log:
        y = ctx.op(Op.SUB, shifted, _bcast(ctx, ctx.op(Op.LOG, s), xf))
    else:
        y = ctx.op(Op.DIV, e, _bcast(ctx, s, xf))
    return ctx.cast(y, ctx.out_dtype)


@register_lowering(aten._softmax.default)
def lower_softmax(ctx: LowerCtx, x: Value, dim: int, half_to_float: bool) -> Value:
    return softmax(ctx, x, norm_dim(dim, x.type.rank), log=False)


@register_lowering(aten._log_softmax.default)
def lower_log_softmax(ctx: LowerCtx, x: Value, dim: int, half_to_float: bool) -> Value:
    return softmax(ctx, x, norm_dim(dim, x.type.rank), log=True)


@register_lowering(aten.native_layer_norm.default)
def lower_layer_norm(ctx: LowerCtx, x: Value, normalized_shape, weight, bias, eps: float):
    xf = ctx.cast(x, DType.F32)
    axes = list(range(x.type.rank - len(normalized_shape), x.type.rank))
    n = math.prod(normalized_shape)
    stat_shape = [1 if d in axes else s for d, s in enumerate(x.type.shape)]
    count = ctx.full(n, stat_shape, DType.F32)
    mean = ctx.op(Op.DIV, reduce(ctx, Op.REDUCE_SUM, xf, axes, True), count)
    xc = ctx.op(Op.SUB, xf, _bcast(ctx, mean, xf))
    var = ctx.op(Op.DIV, reduce(ctx, Op.REDUCE_SUM, ctx.op(Op.MUL, xc, xc), axes, True), count)
    rstd = ctx.op(Op.RSQRT, ctx.op(Op.ADD, var, ctx.full(eps, stat_shape, DType.F32)))
    y = ctx.op(Op.MUL, xc, _bcast(ctx, rstd, xf))
    if weight is not None:
        y = ctx.op(Op.MUL, y, ctx.broadcast_to(ctx.cast(weight, DType.F32), y.type.shape))
    if bias is not None:
        y = ctx.op(Op.ADD, y, ctx.broadcast_to(ctx.cast(bias, DType.F32), y.type.shape))
    out_t, mean_t, rstd_t = ctx.out_type(0), ctx.out_type(1), ctx.out_type(2)
    return (
        ctx.cast(y, out_t.dtype),
        ctx.reshape(ctx.cast(mean, mean_t.dtype), mean_t.shape),
        ctx.reshape(ctx.cast(rstd, rstd_t.dtype), rstd_t.shape),
    )


def _variance(ctx: LowerCtx, x: Value, dims, correction, keepdim: bool) -> tuple[Value, Value]:
    """(var, mean) over dims, divided by N - correction, computed in fp32."""
    xf = ctx.cast(x, DType.F32)
    n = reduced_count(x, dims)
    mean_k = ctx.op(
        Op.DIV,
        reduce(ctx, Op.REDUCE_SUM, xf, dims, True),
        ctx.full(n, _kept_shape(x, dims), DType.F32),
    )
    xc = ctx.op(Op.SUB, xf, _bcast(ctx, mean_k, xf))
    ss = reduce(ctx, Op.REDUCE_SUM, ctx.op(Op.MUL, xc, xc), dims, keepdim)
    denom = max(n - (1 if correction is None else correction), 0)
    var = ctx.op(Op.DIV, ss, ctx.full(denom, ss.type.shape, DType.F32))
    mean = mean_k if keepdim else ctx.reshape(mean_k, var.type.shape)
    return var, mean


def _kept_shape(x: Value, dims) -> list[int]:
    rank = x.type.rank
    axes = {norm_dim(d, rank) for d in dims} if dims else set(range(rank))
    return [1 if d in axes else s for d, s in enumerate(x.type.shape)]


@register_lowering(aten.var.correction)
def lower_var(
    ctx: LowerCtx, x: Value, dims=None, *, correction=None, keepdim: bool = False
) -> Value:
    return ctx.cast(_variance(ctx, x, dims, correction, keepdim)[0], ctx.out_dtype)


@register_lowering(aten.std.correction)
def lower_std(
    ctx: LowerCtx, x: Value, dims=None, *, correction=None, keepdim: bool = False
) -> Value:
    return ctx.cast(ctx.op(Op.SQRT, _variance(ctx, x, dims, correction, keepdim)[0]), ctx.out_dtype)


@register_lowering(aten.var_mean.correction)
def lower_var_mean(ctx: LowerCtx, x: Value, dims=None, *, correction=None, keepdim: bool = False):
    var, mean = _variance(ctx, x, dims, correction, keepdim)
    return ctx.cast(var, ctx.out_type(0).dtype), ctx.cast(mean, ctx.out_type(1).dtype)


@register_lowering(aten.linalg_vector_norm.default)
def lower_vector_norm(
    ctx: LowerCtx, x: Value, ord=2, dim=None, keepdim: bool = False, *, dtype=None
) -> Value:
    out = ctx.out_type()
    a = ctx.op(Op.ABS, ctx.cast(x, out.dtype))
    if ord == float("inf"):
        return reduce(ctx, Op.REDUCE_MAX, a, dim, keepdim)
    if ord == float("-inf"):
        return reduce(ctx, Op.REDUCE_MIN, a, dim, keepdim)
    if ord == 0:
        nz = ctx.cast(ctx.op(Op.NE, a, ctx.full(0, a.type.shape, out.dtype)), out.dtype)
        return reduce(ctx, Op.REDUCE_SUM, nz, dim, keepdim)
    if ord == 1:
        return reduce(ctx, Op.REDUCE_SUM, a, dim, keepdim)
    if ord == 2:
        return ctx.op(Op.SQRT, reduce(ctx, Op.REDUCE_SUM, ctx.op(Op.MUL, a, a), dim, keepdim))
    powered = ctx.op(Op.POW, a, ctx.full(ord, a.type.shape, out.dtype))
    s = reduce(ctx, Op.REDUCE_SUM, powered, dim, keepdim)
    return ctx.op(Op.POW, s, ctx.full(1.0 / ord, s.type.shape, out.dtype))


@register_lowering(aten.native_group_norm.default)
def lower_group_norm(
    ctx: LowerCtx, x: Value, weight, bias, n: int, c: int, hw: int, groups: int, eps: float
):
    xf = ctx.reshape(ctx.cast(x, DType.F32), [n, groups, (c // groups) * hw])
    var, mean = _variance(ctx, xf, [2], 0, True)
    rstd = ctx.op(Op.RSQRT, ctx.op(Op.ADD, var, ctx.full(eps, var.type.shape, DType.F32)))
    y = ctx.op(Op.MUL, ctx.op(Op.SUB, xf, _bcast(ctx, mean, xf)), _bcast(ctx, rstd, xf))
    y = ctx.reshape(y, x.type.shape)
    y = _channel_affine(ctx, y, weight, bias)
    mean_t, rstd_t = ctx.out_type(1), ctx.out_type(2)
    return (
        ctx.cast(y, ctx.out_type(0).dtype),
        ctx.cast(ctx.reshape(mean, mean_t.shape), mean_t.dtype),
        ctx.cast(ctx.reshape(rstd, rstd_t.shape), rstd_t.dtype),
    )


def _per_channel(ctx: LowerCtx, v: Value, like: Value) -> Value:
    """A [C] vector broadcast along axis 1 of `like` ([N, C, ...])."""
    shape = [1] * like.type.rank
    shape[1] = v.type.numel
    return ctx.broadcast_to(ctx.reshape(ctx.cast(v, like.type.dtype), shape), like.type.shape)


def _channel_affine(ctx: LowerCtx, y: Value, weight, bias) -> Value:
    if weight is not None:
        y = ctx.op(Op.MUL, y, _per_channel(ctx, weight, y))
    if bias is not None:
        y = ctx.op(Op.ADD, y, _per_channel(ctx, bias, y))
    return y


def _batch_norm(
    ctx: LowerCtx, x: Value, weight, bias, mean: Value, var: Value, eps: float
) -> Value:
    xf = ctx.cast(x, DType.F32)
    rstd = ctx.op(Op.RSQRT, ctx.op(Op.ADD, var, ctx.full(eps, var.type.shape, DType.F32)))
    y = ctx.op(Op.MUL, ctx.op(Op.SUB, xf, _per_channel(ctx, mean, xf)), _per_channel(ctx, rstd, xf))
    return ctx.cast(_channel_affine(ctx, y, weight, bias), ctx.out_type(0).dtype)


@register_lowering(aten._native_batch_norm_legit_functional.default)
def lower_batch_norm_train(
    ctx: LowerCtx, x, weight, bias, running_mean, running_var, training, momentum, eps
):
    """Returns (out, mean, rstd, new running mean, new running var); statistics over every
    axis but the channels, the running variance updated with the unbiased estimate."""
    if not training:
        raise ctx.unsupported("functional batch norm outside training")
    axes = [d for d in range(x.type.rank) if d != 1]
    count = reduced_count(x, axes)
    var, mean = _variance(ctx, x, axes, 0, False)
    out = _batch_norm(ctx, x, weight, bias, mean, var, eps)
    rstd = ctx.op(Op.RSQRT, ctx.op(Op.ADD, var, ctx.full(eps, var.type.shape, DType.F32)))
    shape = mean.type.shape
    unbiased = ctx.op(Op.MUL, var, ctx.full(count / max(count - 1, 1), shape, DType.F32))

    def update(old: Value, new: Value) -> Value:
        keep = ctx.op(Op.MUL, ctx.cast(old, DType.F32), ctx.full(1 - momentum, shape, DType.F32))
        return ctx.op(Op.ADD, keep, ctx.op(Op.MUL, new, ctx.full(momentum, shape, DType.F32)))

    stats = [mean, rstd, update(running_mean, mean), update(running_var, unbiased)]
    # Each in the dtype the graph gives it: PyTorch's meta says fp32 for a bf16 model, whatever
    # the running statistics' own dtype (the functionalized graph copies them back).
    return out, *(ctx.cast(v, ctx.out_type(i).dtype) for i, v in enumerate(stats, 1))


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def lower_batch_norm_eval(ctx: LowerCtx, x, weight, bias, running_mean, running_var, momentum, eps):
    mean, var = ctx.cast(running_mean, DType.F32), ctx.cast(running_var, DType.F32)
    out = _batch_norm(ctx, x, weight, bias, mean, var, eps)
    empty = ctx.out_type(1)
    return (
        out,
        ctx.full(0, empty.shape, empty.dtype),
        ctx.full(0, ctx.out_type(2).shape, ctx.out_type(2).dtype),
    )
