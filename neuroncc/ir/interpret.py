"""The numpy reference interpreter: what every IR op means, executed directly.

It is the oracle for differential and metamorphic tests (no pass may change what it computes).
It never runs in the compiled path: compiled results come from the simulator executing
instructions. Float math happens in fp32 and is rounded to the result dtype, as the engines do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from neuroncc.ir import numerics
from neuroncc.ir.graph import Graph, Node
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType


def compute_dtype(dtype: DType) -> np.dtype:
    """The dtype engines compute in for values stored as `dtype`."""
    if dtype.is_float:
        return np.dtype(np.float32)
    if dtype.is_int:
        return np.dtype(np.int64)
    return np.dtype(np.bool_)


def _unary(n: Node, x: np.ndarray) -> np.ndarray:
    if n.op == Op.NOT:
        return np.logical_not(x)
    return numerics.UNARY[n.op.value](x.astype(np.float32))


def _binary(n: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    cd = compute_dtype(n.inputs[0].type.dtype)
    a, b = a.astype(cd, copy=False), b.astype(cd, copy=False)
    if n.op == Op.DIV and cd.kind == "i":
        return numerics.int_divide(a, b)
    return numerics.BINARY[n.op.value](a, b)


def _reduce(n: Node, x: np.ndarray) -> np.ndarray:
    fn = {
        Op.REDUCE_SUM: np.sum,
        Op.REDUCE_MAX: np.max,
        Op.REDUCE_MIN: np.min,
        Op.REDUCE_PROD: np.prod,
    }[n.op]
    x = x.astype(compute_dtype(n.inputs[0].type.dtype))
    axes = n.attr("axes")
    if x.size == 0 and n.op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        raise ValueError("max/min of an empty tensor")
    return fn(x, axis=tuple(axes), keepdims=n.attr("keepdim"))


def _matmul(n: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # fp32 products accumulated in fp32, as TensorE accumulates into PSUM.
    return np.matmul(a.astype(np.float32), b.astype(np.float32))


def _slice(n: Node, x: np.ndarray) -> np.ndarray:
    idx = tuple(
        slice(lo, hi, st)
        for lo, hi, st in zip(n.attr("starts"), n.attr("stops"), n.attr("steps"), strict=True)
    )
    return x[idx]


def _take(n: Node, table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise IndexError(f"take: index out of range [0, {table.shape[0]})")
    return table[idx]


def _put(n: Node, table: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise IndexError(f"put: index out of range [0, {table.shape[0]})")
    return numerics.scatter_rows(table, idx, rows, n.attr("combine"))


def _iota(n: Node) -> np.ndarray:
    i = np.arange(n.attr("n"), dtype=np.float64)
    return n.attr("start") + n.attr("step") * i


_BY_KIND: dict[Kind, Callable[..., np.ndarray]] = {
    Kind.UNARY: _unary,
    Kind.BINARY: _binary,
    Kind.COMPARE: _binary,
    Kind.SELECT: lambda n, c, a, b: np.where(c, a, b),
    Kind.CAST: lambda n, x: x,
    Kind.REDUCE: _reduce,
    Kind.MATMUL: _matmul,
    Kind.INDEX: _take,
}

_BY_OP: dict[Op, Callable[..., np.ndarray]] = {
    Op.RESHAPE: lambda n, x: x.reshape(n.attr("shape")),
    Op.TRANSPOSE: lambda n, x: np.transpose(x, n.attr("perm")),
    Op.BROADCAST: lambda n, x: np.broadcast_to(x, n.attr("shape")),
    Op.SLICE: _slice,
    Op.REVERSE: lambda n, x: np.flip(x, n.attr("axes")),
    Op.STRIDED: lambda n, x: np.lib.stride_tricks.as_strided(
        x.reshape(-1)[n.attr("offset") :],
        n.attr("shape"),
        [s * x.itemsize for s in n.attr("strides")],
    ),
    Op.CONCAT: lambda n, *xs: np.concatenate(xs, axis=n.attr("axis")),
    Op.FULL: lambda n: np.full(n.attr("shape"), n.attr("value")),
    Op.IOTA: _iota,
    Op.PUT: _put,
}


def evaluate_node(n: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    fn = _BY_OP.get(n.op) or _BY_KIND[n.op.info.kind]
    with np.errstate(all="ignore"):
        result = np.asarray(fn(n, *args))
    result = result.astype(n.out.type.dtype.numpy, copy=False)
    return np.asarray(result, order="C").reshape(n.out.type.shape)


def interpret(g: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(args) != len(g.inputs):
        raise ValueError(f"graph @{g.name} takes {len(g.inputs)} inputs, got {len(args)}")
    env: dict[int, np.ndarray] = {}
    for v, a in zip(g.inputs, args, strict=True):
        a = np.asarray(a)
        if a.shape != v.type.shape or a.dtype != v.type.dtype.numpy:
            raise ValueError(f"input {v} expects {v.type}, got {a.dtype}{list(a.shape)}")
        env[v.id] = a
    for n in g.nodes:
        env[n.out.id] = evaluate_node(n, [env[v.id] for v in n.inputs])
    return [env[v.id] for v in g.outputs]
