"""The instructions a row kernel's step emits in place of some nodes (emit_fused.py, _tile_ops):
a binary op with a constant as an immediate, ScalarE's activation-reduces and square sums
(row_rewrites.py), and a reduction over one chunk of wide rows (Note [wide rows])."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.row_plan import REDUCE_OPS
from neuroncc.ir.graph import Node
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType

if TYPE_CHECKING:
    from neuroncc.codegen.kernels.emit_fused import RowKernel

_COMBINE = {"sum": "add", "max": "max", "min": "min"}


def with_immediate(k: RowKernel, n: Node, dst: isa.TileRef, srcs: list) -> isa.Instr | None:
    """x <op> c with c a float constant of the group, as tensor_scalar with c as an immediate:
    one pass over x at the tensor_scalar rate (half of tensor_tensor's in fp32), and on any of
    the three engines, instead of streaming a memset tile beside it."""
    if n.op.info.kind != Kind.BINARY:
        return None
    x, c = n.inputs
    value = k.const_values.get(c.id)
    if value is None or not x.type.dtype.is_float or c.type.dtype != x.type.dtype:
        return None
    if srcs[0].shape != dst.shape or dst.free_elems == 1:
        # x a per-partition scalar read as a row; or a [p, 1] row op, where the rate does not
        # matter but moving it to another engine's queue would stall the row's chain
        return None
    return isa.TensorScalar("dve", op=n.op.value, dst=dst, src=srcs[0], scalar=value)


def activation_reduce(k: RowKernel, n: Node, dst: isa.TileRef, tiles: dict, rp: int):
    """n = f(x -/+ m) summed over the row (row_rewrites.activation_reduces): one ScalarE pass."""
    b = k.ctx.b
    diff, total = k.act_reduce[n.out.id]
    x, m = (tiles[v.id] for v in diff.inputs)
    bias = m
    if diff.op == Op.SUB:
        bias = k.row_pool.tile(rp, (1,), DType.F32)
        b.emit(isa.TensorScalar("dve", op="mul", dst=bias, src=m, scalar=-1.0))
    acc = k.row_pool.tile(rp, (1,), DType.F32)
    act = isa.ActivationReduce("act", func=n.op.value, dst=dst, src=x, bias=bias, acc=acc)
    b.emit(k.balance.place(act))
    tiles[total.out.id] = _as_sum(k, total, acc, rp)


def square_sum(k: RowKernel, n: Node, dst, x, tiles: dict, rp: int) -> None:
    """n = x * x summed over the row (row_rewrites.square_sums): one ScalarE pass."""
    b, total = k.ctx.b, k.square_sums[n.out.id]
    acc = k.row_pool.tile(rp, (1,), DType.F32)
    b.emit(
        isa.ActivationReduce("act", func="square", dst=dst, src=x, bias=k.zero.rows(rp), acc=acc)
    )
    tiles[total.out.id] = _as_sum(k, total, acc, rp)


def _as_sum(k: RowKernel, total: Node, acc: isa.TileRef, rp: int) -> isa.TileRef:
    """ScalarE's fp32 row sum `acc` as the sum node `total`'s tile: converted where its dtype
    is not fp32."""
    if total.out.type.dtype == DType.F32:
        return acc
    converted = k.row_pool.tile(rp, (1,), total.out.type.dtype)
    k.ctx.b.emit(isa.TensorCopy("dve", dst=converted, src=acc))
    return converted


def chunk_reduce(k: RowKernel, n: Node, dst, src, rp: int, c0: int, f: int):
    """Reduction n over one chunk of its rows (Note [wide rows]): the first chunk's into a new
    running accumulator, each later one's combined into it. After the rows' last chunk, the
    result in `dst` (or the accumulator, where it has the result's dtype); else None."""
    b = k.ctx.b
    acc_dt = n.inputs[0].type.dtype.accumulator
    op = REDUCE_OPS[n.op]
    if c0 == 0:
        running = k.running[n.out.id] = k.acc_pool.tile(rp, (1,), acc_dt)
        b.emit(isa.TensorReduce("dve", op=op, dst=running, src=src))
    else:
        running = k.running[n.out.id]
        part = k.row_pool.tile(rp, (1,), acc_dt)
        b.emit(isa.TensorReduce("dve", op=op, dst=part, src=src))
        b.emit(isa.TensorTensor("dve", op=_COMBINE[op], dst=running, a=running, b=part))
    if c0 + f < k.p.cols:
        return None
    if dst.dtype == acc_dt:
        return running
    b.emit(isa.TensorCopy("dve", dst=dst, src=running))
    return dst
