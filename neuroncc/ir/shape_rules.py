"""Shape and dtype inference, one function per op family.

A rule takes the input types and the node's attributes and returns the result type, or raises
ShapeError saying what is wrong. The builder calls the rule to type every new node and the
verifier calls it again to check that a graph's recorded types agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from neuroncc.ir.types import DType, TensorType


class ShapeError(ValueError):
    pass


PUT_COMBINE = ("set", "add", "mul", "max", "min")


def _same_types(ins: Sequence[TensorType], what: str) -> TensorType:
    first = ins[0]
    for t in ins[1:]:
        if t != first:
            raise ShapeError(f"{what} needs operands of one type, got {', '.join(map(str, ins))}")
    return first


def elementwise(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    return _same_types(ins, "elementwise op")


def logical(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    t = _same_types(ins, "logical op")
    if t.dtype != DType.BOOL:
        raise ShapeError(f"logical op needs bool operands, got {t}")
    return t


def compare(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    t = _same_types(ins, "comparison")
    return TensorType(t.shape, DType.BOOL)


def where(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    cond, a, b = ins
    if cond.dtype != DType.BOOL:
        raise ShapeError(f"where needs a bool condition, got {cond}")
    t = _same_types([a, b], "where")
    if cond.shape != t.shape:
        raise ShapeError(f"where condition shape {cond.shape} differs from {t.shape}")
    return t


def cast(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    return TensorType(ins[0].shape, attrs["dtype"])


def reduce(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    # Note [trailing reductions]: reductions run along the free dimension of a tile, so the IR
    # only reduces trailing axes; the lowering transposes other axes to the end first.
    (t,) = ins
    axes = attrs["axes"]
    n = len(axes)
    if tuple(axes) != tuple(range(t.rank - n, t.rank)):
        raise ShapeError(f"reduce axes must be the trailing axes of {t}, got {list(axes)}")
    kept = t.shape[: t.rank - n]
    shape = kept + (1,) * n if attrs["keepdim"] else kept
    return TensorType(shape, t.dtype)


def matmul(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    a, b = ins
    if a.dtype != b.dtype or not a.dtype.is_float:
        raise ShapeError(f"matmul needs two float operands of one dtype, got {a} and {b}")
    if a.rank < 2 or a.rank != b.rank:
        raise ShapeError(f"matmul needs operands of one rank >= 2, got {a} and {b}")
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul shapes do not agree: {a} @ {b}")
    return TensorType(a.shape[:-1] + (b.shape[-1],), a.dtype)


def reshape(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (t,) = ins
    shape = tuple(attrs["shape"])
    if math.prod(shape) != t.numel:
        raise ShapeError(f"reshape of {t} to {list(shape)} changes the element count")
    return TensorType(shape, t.dtype)


def transpose(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (t,) = ins
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(t.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {t.rank} axes of {t}")
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def broadcast(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (t,) = ins
    shape = tuple(attrs["shape"])
    if len(shape) != t.rank:
        raise ShapeError(f"broadcast keeps the rank: {t} to {list(shape)}")
    for have, want in zip(t.shape, shape, strict=True):
        if have != want and have != 1:
            raise ShapeError(f"cannot broadcast {t} to {list(shape)}")
    return TensorType(shape, t.dtype)


def slice_(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (t,) = ins
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == t.rank:
        raise ShapeError(f"slice of {t} needs one start, stop and step per axis")
    shape = []
    for d, lo, hi, st in zip(t.shape, starts, stops, steps, strict=True):
        if st < 1 or not 0 <= lo <= hi <= d:
            raise ShapeError(f"slice [{lo}:{hi}:{st}] is out of range for {t}")
        shape.append(len(range(lo, hi, st)))
    return TensorType(tuple(shape), t.dtype)


def reverse(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (t,) = ins
    axes = attrs["axes"]
    if len(set(axes)) != len(axes) or not all(0 <= a < t.rank for a in axes):
        raise ShapeError(f"reverse axes {list(axes)} are not distinct axes of {t}")
    return t


def strided(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """A view of the input's row-major elements: element i of the result is input element
    offset + sum(i_k * strides[k]) (as torch.as_strided on a contiguous tensor)."""
    (t,) = ins
    shape, strides, offset = tuple(attrs["shape"]), tuple(attrs["strides"]), attrs["offset"]
    if len(shape) != len(strides) or any(s < 0 for s in strides) or offset < 0:
        raise ShapeError(
            f"strided view needs one non-negative stride per axis, got {list(strides)}"
        )
    if (
        math.prod(shape)
        and offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) >= t.numel
    ):
        raise ShapeError(f"strided view {list(shape)}/{list(strides)}+{offset} reads outside {t}")
    return TensorType(shape, t.dtype)


def concat(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    axis = attrs["axis"]
    first = ins[0]
    if not 0 <= axis < first.rank:
        raise ShapeError(f"concat axis {axis} out of range for {first}")
    for t in ins[1:]:
        if t.dtype != first.dtype or t.rank != first.rank:
            raise ShapeError(f"concat operands differ: {first} and {t}")
        if any(t.shape[i] != first.shape[i] for i in range(t.rank) if i != axis):
            raise ShapeError(f"concat operands differ off axis {axis}: {first} and {t}")
    size = sum(t.shape[axis] for t in ins)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1 :], first.dtype)


def take(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    table, idx = ins
    if not idx.dtype.is_int:
        raise ShapeError(f"take needs integer indices, got {idx}")
    if table.rank != 2:
        raise ShapeError(f"take needs a 2-d table, got {table}")
    return TensorType(idx.shape + table.shape[1:], table.dtype)


def put(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """put(table[V, D], idx[n], rows[n, D]) {combine}: table with rows written ("set") or combined
    ("add", "mul", "max", "min") into the rows at idx."""
    table, idx, rows = ins
    if attrs["combine"] not in PUT_COMBINE:
        raise ShapeError(f"put combine {attrs['combine']!r} is not one of {', '.join(PUT_COMBINE)}")
    if table.rank != 2 or idx.rank != 1 or not idx.dtype.is_int:
        raise ShapeError(f"put needs a 2-d table and 1-d integer indices, got {table} and {idx}")
    if rows != TensorType((idx.shape[0], table.shape[1]), table.dtype):
        raise ShapeError(
            f"put rows must be {table.dtype.value}[{idx.shape[0]},{table.shape[1]}], got {rows}"
        )
    return table


def full(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


def iota(ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    return TensorType((attrs["n"],), attrs["dtype"])
