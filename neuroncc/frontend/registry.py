"""The lowering registry: one dict from ATen overload to rule, and the context rules receive.

A rule has the signature `rule(ctx: LowerCtx, *args, **kwargs) -> Value | tuple[Value, ...]`,
where tensor arguments arrive as IR Values and everything else as in the FX node. Rules build IR
through `ctx` helpers; the importer checks every result's type against the FX node's metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from neuroncc.errors import UnsupportedError
from neuroncc.ir.graph import GraphBuilder, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, TensorType

Rule = Callable[..., Any]
LOWERINGS: dict[torch._ops.OpOverload, Rule] = {}


def register_lowering(*targets: Any) -> Callable[[Rule], Rule]:
    """Register a rule for ATen overloads; a packet (e.g. aten.clone) registers all its overloads."""

    def deco(rule: Rule) -> Rule:
        for t in targets:
            overloads = (
                [getattr(t, name) for name in t.overloads()]
                if isinstance(t, torch._ops.OpOverloadPacket)
                else [t]
            )
            for ov in overloads:
                LOWERINGS[ov] = rule
        return rule

    return deco


def fake_type(val: Any) -> TensorType:
    if not isinstance(val, torch.Tensor):
        raise UnsupportedError(f"expected a tensor, got {type(val).__name__} {val!r}")
    shape = []
    for d in val.shape:
        if not isinstance(d, int):
            raise UnsupportedError(
                f"symbolic size {d} in {tuple(val.shape)}: neuroncc compiles static shapes "
                "(pass dynamic=False to torch.compile)"
            )
        shape.append(d)
    try:
        dtype = DType.from_torch(val.dtype)
    except TypeError as e:
        raise UnsupportedError(str(e)) from None
    return TensorType(tuple(shape), dtype)


class LowerCtx:
    """What a lowering rule may use: the builder, the FX node being lowered, and helpers."""

    def __init__(self, builder: GraphBuilder) -> None:
        self.b = builder
        self.node: torch.fx.Node | None = None

    # -- facts about the node being lowered ------------------------------------------------
    def out_type(self, index: int | None = None) -> TensorType:
        val = self.node.meta.get("val") if self.node is not None else None
        if val is None:
            raise UnsupportedError(f"node {self.node} has no shape metadata")
        return fake_type(val if index is None else val[index])

    @property
    def out_dtype(self) -> DType:
        return self.out_type().dtype

    # -- IR construction helpers -------------------------------------------------------------
    def op(self, op: Op, *inputs: Value, **attrs: Any) -> Value:
        return self.b.op(op, *inputs, **attrs)

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.type.dtype == dtype else self.op(Op.CAST, v, dtype=dtype)

    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        return v if v.type.shape == shape else self.op(Op.RESHAPE, v, shape=shape)

    def transpose(self, v: Value, perm: Sequence[int]) -> Value:
        perm = tuple(perm)
        return v if perm == tuple(range(len(perm))) else self.op(Op.TRANSPOSE, v, perm=perm)

    def concat(self, parts: Sequence[Value], axis: int) -> Value:
        return parts[0] if len(parts) == 1 else self.op(Op.CONCAT, *parts, axis=axis)

    def full(self, value: float, shape: Sequence[int], dtype: DType) -> Value:
        return self.op(Op.FULL, shape=tuple(shape), value=value, dtype=dtype)

    def broadcast_to(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        if v.type.shape == shape:
            return v
        lead = len(shape) - v.type.rank
        if lead < 0:
            raise UnsupportedError(f"cannot broadcast {v.type} to {list(shape)}")
        v = self.reshape(v, (1,) * lead + v.type.shape)
        return self.op(Op.BROADCAST, v, shape=shape)

    def tensor(self, x: Value | float | bool, dtype: DType, shape: Sequence[int]) -> Value:
        """x as a Value of `dtype` broadcast to `shape` (a Python scalar becomes a constant)."""
        if isinstance(x, Value):
            return self.broadcast_to(self.cast(x, dtype), shape)
        return self.full(x, shape, dtype)

    def unsupported(self, why: str) -> UnsupportedError:
        target = getattr(self.node, "target", None)
        return UnsupportedError(f"{target}: {why}", op=str(target))


def norm_dim(d: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= d < r:
        raise UnsupportedError(f"dimension {d} out of range for rank {rank}")
    return d % r
