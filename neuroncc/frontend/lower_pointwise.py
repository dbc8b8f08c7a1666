"""Lowerings of pointwise ATen ops: tables expanded by factories, plus the few rules with
real semantics (alpha scaling, clamps, backward formulas).

Type promotion follows the FX node's metadata: operands are cast to the result dtype for
arithmetic, and to the promoted operand dtype for comparisons, then broadcast to the result shape.
"""

from __future__ import annotations

import torch

from neuroncc.frontend.registry import LowerCtx, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

aten = torch.ops.aten

UNARY = {
    aten.neg: Op.NEG,
    aten.abs: Op.ABS,
    aten.sign: Op.SIGN,
    aten.floor: Op.FLOOR,
    aten.round: Op.ROUND,
    aten.exp: Op.EXP,
    aten.log: Op.LOG,
    aten.tanh: Op.TANH,
    aten.sigmoid: Op.SIGMOID,
    aten.relu: Op.RELU,
    aten.rsqrt: Op.RSQRT,
    aten.sqrt: Op.SQRT,
    aten.reciprocal: Op.RECIPROCAL,
    aten.erf: Op.ERF,
    aten.silu: Op.SILU,
    aten.sin: Op.SIN,
    aten.cos: Op.COS,
    aten.logical_not: Op.NOT,
    aten.log1p: Op.LOG1P,
    aten.expm1: Op.EXPM1,
    aten.exp2: Op.EXP2,
    aten.log2: Op.LOG2,
    aten.log10: Op.LOG10,
    aten.trunc: Op.TRUNC,
    aten.ceil: Op.CEIL,
    aten.tan: Op.TAN,
    aten.acos: Op.ACOS,
    aten.asin: Op.ASIN,
    aten.atan: Op.ATAN,
    aten.sinh: Op.SINH,
    aten.cosh: Op.COSH,
    aten.acosh: Op.ACOSH,
    aten.asinh: Op.ASINH,
    aten.atanh: Op.ATANH,
    aten.erfc: Op.ERFC,
}

BINARY = {
    aten.mul.Tensor: Op.MUL,
    aten.mul.Scalar: Op.MUL,
    aten.div.Tensor: Op.DIV,
    aten.div.Scalar: Op.DIV,
    aten.maximum.default: Op.MAX,
    aten.minimum.default: Op.MIN,
    aten.pow.Tensor_Tensor: Op.POW,
    aten.pow.Tensor_Scalar: Op.POW,
    aten.pow.Scalar: Op.POW,
    aten.logical_and.default: Op.AND,
    aten.logical_or.default: Op.OR,
    aten.bitwise_and.Tensor: Op.AND,
    aten.bitwise_and.Scalar: Op.AND,
    aten.bitwise_or.Tensor: Op.OR,
    aten.bitwise_or.Scalar: Op.OR,
    aten.fmod.Tensor: Op.FMOD,
    aten.fmod.Scalar: Op.FMOD,
    aten.remainder.Tensor: Op.REMAINDER,
    aten.remainder.Scalar: Op.REMAINDER,
    aten.atan2.default: Op.ATAN2,
    aten.copysign.Tensor: Op.COPYSIGN,
    aten.copysign.Scalar: Op.COPYSIGN,
    aten.hypot.default: Op.HYPOT,
    aten.fmax.default: Op.FMAX,
    aten.fmin.default: Op.FMIN,
    aten.logaddexp.default: Op.LOGADDEXP,
    aten.nextafter.default: Op.NEXTAFTER,
    aten.logical_xor.default: Op.NE,  # on truth values, below
}

COMPARE = {
    getattr(getattr(aten, name), overload): op
    for name, op in (
        ("eq", Op.EQ),
        ("ne", Op.NE),
        ("lt", Op.LT),
        ("le", Op.LE),
        ("gt", Op.GT),
        ("ge", Op.GE),
    )
    for overload in ("Tensor", "Scalar")
}


def operand_dtype(*args: Value | float | bool) -> DType:
    """The dtype PyTorch's type promotion gives operands of these dtypes and ranks."""
    probes = []
    for a in args:
        if isinstance(a, Value):
            probes.append(torch.empty((0,) * min(a.type.rank, 1), dtype=a.type.dtype.torch))
        else:
            probes.append(a)
    result = probes[0]
    for p in probes[1:]:
        result = torch.empty((0,), dtype=torch.result_type(result, p))
    dt = (
        result.dtype
        if isinstance(result, torch.Tensor)
        else torch.result_type(torch.empty(()), result)
    )
    return DType.from_torch(dt)


def _unary_rule(op: Op):
    def rule(ctx: LowerCtx, x: Value) -> Value:
        out = ctx.out_type()
        return ctx.op(op, ctx.cast(x, out.dtype))

    return rule


def _binary_rule(op: Op):
    def rule(ctx: LowerCtx, a, b) -> Value:
        out = ctx.out_type()
        # Bool-valued logical ops on non-bool inputs: compare with 0 first.
        if ctx.node.target == aten.logical_xor.default:
            return ctx.op(
                Op.NE,
                _truthy(ctx, ctx.tensor(a, operand_dtype(a), out.shape), out.shape),
                _truthy(ctx, ctx.tensor(b, operand_dtype(b), out.shape), out.shape),
            )
        if op in (Op.AND, Op.OR):
            if out.dtype != DType.BOOL and ctx.node.target.name().startswith("aten::bitwise"):
                raise ctx.unsupported("bitwise ops on integers (only bool tensors are supported)")
            dt = DType.BOOL
            a = (
                ctx.tensor(a, dt, out.shape)
                if not isinstance(a, Value)
                else _truthy(ctx, a, out.shape)
            )
            b = (
                ctx.tensor(b, dt, out.shape)
                if not isinstance(b, Value)
                else _truthy(ctx, b, out.shape)
            )
            return ctx.cast(ctx.op(op, a, b), out.dtype)
        return ctx.op(op, ctx.tensor(a, out.dtype, out.shape), ctx.tensor(b, out.dtype, out.shape))

    return rule


def _truthy(ctx: LowerCtx, v: Value, shape) -> Value:
    v = ctx.broadcast_to(v, shape)
    if v.type.dtype == DType.BOOL:
        return v
    return ctx.op(Op.NE, v, ctx.full(0, shape, v.type.dtype))


def _compare_rule(op: Op):
    def rule(ctx: LowerCtx, a, b) -> Value:
        shape = ctx.out_type().shape
        dt = operand_dtype(a, b)
        return ctx.op(op, ctx.tensor(a, dt, shape), ctx.tensor(b, dt, shape))

    return rule


for _packet, _op in UNARY.items():
    register_lowering(_packet.default)(_unary_rule(_op))
for _packet, _op in BINARY.items():
    register_lowering(_packet)(_binary_rule(_op))
for _packet, _op in COMPARE.items():
    register_lowering(_packet)(_compare_rule(_op))


@register_lowering(aten.bitwise_not.default)
def lower_bitwise_not(ctx: LowerCtx, x: Value) -> Value:
    if x.type.dtype != DType.BOOL:
        raise ctx.unsupported("bitwise_not on integers (only bool tensors are supported)")
    return ctx.op(Op.NOT, x)


def _scaled(ctx: LowerCtx, x, alpha, dtype: DType, shape) -> Value:
    x = ctx.tensor(x, dtype, shape)
    if alpha == 1:
        return x
    return ctx.op(Op.MUL, x, ctx.full(alpha, shape, dtype))


@register_lowering(aten.add.Tensor, aten.add.Scalar)
def lower_add(ctx: LowerCtx, a, b, alpha=1) -> Value:
    out = ctx.out_type()
    return ctx.op(
        Op.ADD, ctx.tensor(a, out.dtype, out.shape), _scaled(ctx, b, alpha, out.dtype, out.shape)
    )


@register_lowering(aten.sub.Tensor, aten.sub.Scalar)
def lower_sub(ctx: LowerCtx, a, b, alpha=1) -> Value:
    out = ctx.out_type()
    return ctx.op(
        Op.SUB, ctx.tensor(a, out.dtype, out.shape), _scaled(ctx, b, alpha, out.dtype, out.shape)
    )


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def lower_rsub(ctx: LowerCtx, a, b, alpha=1) -> Value:
    out = ctx.out_type()
    return ctx.op(
        Op.SUB, ctx.tensor(b, out.dtype, out.shape), _scaled(ctx, a, alpha, out.dtype, out.shape)
    )


@register_lowering(
    aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar
)
def lower_where(ctx: LowerCtx, cond, a, b) -> Value:
    out = ctx.out_type()
    c = _truthy(ctx, cond, out.shape)
    return ctx.op(
        Op.WHERE, c, ctx.tensor(a, out.dtype, out.shape), ctx.tensor(b, out.dtype, out.shape)
    )


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def lower_masked_fill(ctx: LowerCtx, x: Value, mask, value) -> Value:
    return lower_where(ctx, mask, value, x)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def lower_clamp(ctx: LowerCtx, x: Value, lo=None, hi=None) -> Value:
    out = ctx.out_type()
    y = ctx.cast(x, out.dtype)
    if lo is not None:
        y = ctx.op(Op.MAX, y, ctx.tensor(lo, out.dtype, out.shape))
    if hi is not None:
        y = ctx.op(Op.MIN, y, ctx.tensor(hi, out.dtype, out.shape))
    return y


@register_lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def lower_clamp_min(ctx: LowerCtx, x: Value, lo) -> Value:
    return lower_clamp(ctx, x, lo, None)


@register_lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def lower_clamp_max(ctx: LowerCtx, x: Value, hi) -> Value:
    return lower_clamp(ctx, x, None, hi)


@register_lowering(aten.gelu.default)
def lower_gelu(ctx: LowerCtx, x: Value, approximate: str = "none") -> Value:
    op = {"none": Op.GELU, "tanh": Op.GELU_TANH}.get(approximate)
    if op is None:
        raise ctx.unsupported(f"gelu approximate={approximate!r} (allowed: 'none', 'tanh')")
    return ctx.op(op, ctx.cast(x, ctx.out_dtype))


@register_lowering(aten.threshold_backward.default)
def lower_threshold_backward(ctx: LowerCtx, grad: Value, x: Value, threshold) -> Value:
    out = ctx.out_type()
    below = ctx.op(Op.LE, x, ctx.tensor(threshold, x.type.dtype, out.shape))
    return ctx.op(Op.WHERE, below, ctx.full(0, out.shape, out.dtype), grad)


@register_lowering(aten.sigmoid_backward.default)
def lower_sigmoid_backward(ctx: LowerCtx, grad: Value, y: Value) -> Value:
    # grad * y * (1 - y)
    one = ctx.full(1, y.type.shape, y.type.dtype)
    return ctx.op(Op.MUL, grad, ctx.op(Op.MUL, y, ctx.op(Op.SUB, one, y)))


@register_lowering(aten.tanh_backward.default)
def lower_tanh_backward(ctx: LowerCtx, grad: Value, y: Value) -> Value:
    # grad * (1 - y^2)
    one = ctx.full(1, y.type.shape, y.type.dtype)
    return ctx.op(Op.MUL, grad, ctx.op(Op.SUB, one, ctx.op(Op.MUL, y, y)))


@register_lowering(aten._to_copy.default)
def lower_to_copy(ctx: LowerCtx, x: Value, **kwargs) -> Value:
    return ctx.cast(x, ctx.out_dtype)


@register_lowering(
    aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default
)
def lower_identity(ctx: LowerCtx, x: Value, **kwargs) -> Value:
    return x


@register_lowering(aten.copy.default)
def lower_copy(ctx: LowerCtx, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    return ctx.tensor(src, dst.type.dtype, dst.type.shape)


@register_lowering(aten.fill.Scalar)
def lower_fill(ctx: LowerCtx, x: Value, value) -> Value:
    out = ctx.out_type()
    return ctx.full(value, out.shape, out.dtype)


@register_lowering(aten.isnan.default)
def lower_isnan(ctx: LowerCtx, x: Value) -> Value:
    return ctx.op(Op.NE, x, x)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def lower_div_mode(ctx: LowerCtx, a, b, rounding_mode: str | None = None) -> Value:
    out = ctx.out_type()
    if rounding_mode is None:
        return ctx.op(
            Op.DIV, ctx.tensor(a, out.dtype, out.shape), ctx.tensor(b, out.dtype, out.shape)
        )
    if rounding_mode not in ("trunc", "floor"):
        raise ctx.unsupported(f"rounding_mode={rounding_mode!r} (allowed: None, 'trunc', 'floor')")
    a, b = ctx.tensor(a, out.dtype, out.shape), ctx.tensor(b, out.dtype, out.shape)
    zero = ctx.full(0, out.shape, out.dtype)
    if out.dtype.is_int:
        # Integer div truncates; floor steps down where the remainder's sign differs from b's.
        q = ctx.op(Op.DIV, a, b)
        if rounding_mode == "trunc":
            return q
        r = ctx.op(Op.SUB, a, ctx.op(Op.MUL, q, b))
        differs = ctx.op(Op.NE, ctx.op(Op.LT, r, zero), ctx.op(Op.LT, b, zero))
        step = ctx.op(Op.AND, ctx.op(Op.NE, r, zero), differs)
        return ctx.op(Op.SUB, q, ctx.cast(step, out.dtype))
    q = ctx.op(Op.DIV, a, b)
    if rounding_mode == "floor":
        return ctx.op(Op.FLOOR, q)
    neg = ctx.op(Op.LT, q, zero)
    return ctx.op(
        Op.WHERE, neg, ctx.op(Op.NEG, ctx.op(Op.FLOOR, ctx.op(Op.NEG, q))), ctx.op(Op.FLOOR, q)
    )


@register_lowering(
    aten.isinf.default, aten.isposinf.default, aten.isneginf.default, aten.isfinite.default
)
def lower_isinf(ctx: LowerCtx, x: Value) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    name = ctx.node.target.name().split("::")[1]
    if not dt.is_float:
        return ctx.full(name == "isfinite", shape, DType.BOOL)
    pos = ctx.op(Op.EQ, x, ctx.full(float("inf"), shape, dt))
    neg = ctx.op(Op.EQ, x, ctx.full(float("-inf"), shape, dt))
    if name == "isposinf":
        return pos
    if name == "isneginf":
        return neg
    inf = ctx.op(Op.OR, pos, neg)
    if name == "isinf":
        return inf
    return ctx.op(Op.AND, ctx.op(Op.EQ, x, x), ctx.op(Op.NOT, inf))


@register_lowering(aten.nan_to_num.default)
def lower_nan_to_num(ctx: LowerCtx, x: Value, nan=0.0, posinf=None, neginf=None) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    if not dt.is_float:
        return x
    finfo = torch.finfo(dt.torch)
    y = ctx.op(Op.WHERE, ctx.op(Op.NE, x, x), ctx.full(nan or 0.0, shape, dt), x)
    for bad, value in (
        (float("inf"), finfo.max if posinf is None else posinf),
        (float("-inf"), finfo.min if neginf is None else neginf),
    ):
        y = ctx.op(
            Op.WHERE, ctx.op(Op.EQ, y, ctx.full(bad, shape, dt)), ctx.full(value, shape, dt), y
        )
    return y


@register_lowering(aten.round.decimals)
def lower_round_decimals(ctx: LowerCtx, x: Value, decimals: int = 0) -> Value:
    # As PyTorch computes it: round(x * 10^d) / 10^d (for negative d: * 10^-d after / 10^-d).
    shape, dt = x.type.shape, x.type.dtype
    if decimals >= 0:
        scale = ctx.full(10.0**decimals, shape, dt)
        return ctx.op(Op.DIV, ctx.op(Op.ROUND, ctx.op(Op.MUL, x, scale)), scale)
    scale = ctx.full(10.0 ** (-decimals), shape, dt)
    return ctx.op(Op.MUL, ctx.op(Op.ROUND, ctx.op(Op.DIV, x, scale)), scale)


@register_lowering(aten.hardtanh.default)
def lower_hardtanh(ctx: LowerCtx, x: Value, lo=-1.0, hi=1.0) -> Value:
    return lower_clamp(ctx, x, lo, hi)


@register_lowering(aten.elu.default)
def lower_elu(ctx: LowerCtx, x: Value, alpha=1.0, scale=1.0, input_scale=1.0) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    pos = ctx.op(Op.MUL, x, ctx.full(scale, shape, dt))
    neg = ctx.op(
        Op.MUL,
        ctx.op(Op.EXPM1, ctx.op(Op.MUL, x, ctx.full(input_scale, shape, dt))),
        ctx.full(alpha * scale, shape, dt),
    )
    return ctx.op(Op.WHERE, ctx.op(Op.GT, x, ctx.full(0, shape, dt)), pos, neg)


@register_lowering(aten.leaky_relu.default)
def lower_leaky_relu(ctx: LowerCtx, x: Value, slope=0.01) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    return ctx.op(
        Op.WHERE,
        ctx.op(Op.GT, x, ctx.full(0, shape, dt)),
        x,
        ctx.op(Op.MUL, x, ctx.full(slope, shape, dt)),
    )


@register_lowering(aten.softplus.default)
def lower_softplus(ctx: LowerCtx, x: Value, beta=1.0, threshold=20.0) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    bx = ctx.op(Op.MUL, x, ctx.full(beta, shape, dt))
    soft = ctx.op(Op.DIV, ctx.op(Op.LOG1P, ctx.op(Op.EXP, bx)), ctx.full(beta, shape, dt))
    return ctx.op(Op.WHERE, ctx.op(Op.GT, bx, ctx.full(threshold, shape, dt)), x, soft)


@register_lowering(aten.signbit.default)
def lower_signbit(ctx: LowerCtx, x: Value) -> Value:
    shape, dt = x.type.shape, x.type.dtype
    if not dt.is_float:
        return ctx.op(Op.LT, x, ctx.full(0, shape, dt))
    # copysign(1, x) carries x's sign bit, also for -0.0 and NaNs.
    return ctx.op(Op.LT, ctx.op(Op.COPYSIGN, ctx.full(1.0, shape, dt), x), ctx.full(0, shape, dt))


@register_lowering(aten.ldexp.Tensor)
def lower_ldexp(ctx: LowerCtx, x, e) -> Value:
    out = ctx.out_type()
    return ctx.op(
        Op.MUL,
        ctx.tensor(x, out.dtype, out.shape),
        ctx.op(Op.EXP2, ctx.tensor(e, out.dtype, out.shape)),
    )
