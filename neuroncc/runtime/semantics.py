"""What each instruction does to memory, computed with numpy on the tiles it names.

Engines compute in fp32 (integers in int64, predicates as bool) and round to the destination
dtype; TensorE multiplies into fp32 PSUM. Each function checks the hardware rules its
instruction must obey (tile limits, memory kinds, shapes) and raises SimulationError otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from neuroncc.codegen import isa
from neuroncc.codegen.targets import Target
from neuroncc.errors import SimulationError
from neuroncc.ir import numerics
from neuroncc.runtime.memory import Memories


def _compute(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return a
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    return a.astype(np.float32, copy=False)  # a view where it is one: nothing writes into it


def _store(dst: np.ndarray, values: np.ndarray) -> None:
    dst[...] = np.asarray(values).astype(dst.dtype, copy=False).reshape(dst.shape)


def _same_shape(ins: isa.Instr, *refs: isa.TileRef) -> None:
    shapes = {r.shape for r in refs}
    if len(shapes) != 1:
        raise SimulationError(f"{ins.opcode}: operand shapes differ: {sorted(shapes)}")


def run_dma(m: Memories, ins: isa.Dma, t: Target) -> None:
    if ins.src.dtype != ins.dst.dtype:
        raise SimulationError(f"dma cannot convert {ins.src.dtype.value} to {ins.dst.dtype.value}")
    src, dst = m.view(ins.src), m.view(ins.dst)
    if src.size != dst.size:
        raise SimulationError(f"dma moves {src.size} elements into {dst.size}")
    dst[...] = src if src.shape == dst.shape else src.reshape(dst.shape)  # a copy only if needed


def _indexed_table(
    m: Memories, ins: isa.DmaGather | isa.DmaScatter
) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, table view) of an indirect DMA, every index checked against the table."""
    idx = m.tile(ins.index).reshape(-1).astype(np.int64)
    table = m.dram(ins.table)
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        bad = idx[(idx < 0) | (idx >= table.shape[0])][0]
        raise SimulationError(f"{ins.opcode}: index {bad} outside table of {table.shape[0]} rows")
    return idx, table


def run_dma_gather(m: Memories, ins: isa.DmaGather, t: Target) -> None:
    idx, table = _indexed_table(m, ins)
    _store(m.tile(ins.dst), table[idx])


def run_dma_scatter(m: Memories, ins: isa.DmaScatter, t: Target) -> None:
    idx, table = _indexed_table(m, ins)
    rows = m.tile(ins.src).reshape(idx.size, -1)
    table[...] = numerics.scatter_rows(np.asarray(table), idx, rows, ins.combine)


def run_matmul(m: Memories, ins: isa.Matmul, t: Target) -> None:
    st, mv, dst = ins.stationary, ins.moving, ins.dst
    if st.mem != "sbuf" or mv.mem != "sbuf" or dst.mem != "psum":
        raise SimulationError("matmul reads SBUF operands and writes PSUM")
    if st.np != mv.np:
        raise SimulationError(f"matmul contraction sizes differ: {st.np} vs {mv.np}")
    if st.free_elems > t.pe_stationary_fmax or mv.free_elems > t.pe_moving_fmax:
        raise SimulationError(
            f"matmul tile too large: stationary free {st.free_elems} (max {t.pe_stationary_fmax}),"
            f" moving free {mv.free_elems} (max {t.pe_moving_fmax})"
        )
    if dst.shape != (st.free_elems, mv.free_elems) or dst.dtype.value != "f32":
        raise SimulationError(f"matmul result {dst} must be f32[{st.free_elems},{mv.free_elems}]")
    if (
        dst.free_bytes > t.psum_bank_bytes
        or dst.offset // t.psum_bank_bytes != (dst.offset + dst.free_bytes - 1) // t.psum_bank_bytes
    ):
        raise SimulationError(f"matmul result {dst} must lie in one PSUM bank")
    a = m.tile(st).reshape(st.np, -1).astype(np.float32, copy=False)
    b = m.tile(mv).reshape(mv.np, -1).astype(np.float32, copy=False)
    out = m.tile(dst)
    if ins.transpose:  # the exact transpose mode: data movement, no arithmetic
        if not t.pe_exact_transpose:
            raise SimulationError(f"{t.name} has no exact TensorE transpose mode")
        if mv.shape != (st.np, st.np) or (m.checked and not np.array_equal(b, _identity(st.np))):
            raise SimulationError("a transpose matmul multiplies by the identity")
        out[...] = np.ascontiguousarray(a).T  # 4x faster than one copy between strided views
        return
    if ins.accumulate:
        out += a.T @ b
    else:
        np.matmul(a.T, b, out=out)


@functools.cache
def _identity(n: int) -> np.ndarray:
    return np.eye(n, dtype=np.float32)


def run_activation(m: Memories, ins: isa.Activation, t: Target) -> None:
    _same_shape(ins, ins.dst, ins.src)
    fn = numerics.UNARY.get(ins.func)
    if fn is None:
        raise SimulationError(f"activation function {ins.func!r} does not exist")
    x = m.tile(ins.src).astype(np.float32, copy=False)
    if ins.scale != 1.0 or ins.bias != 0.0:
        x = x * np.float32(ins.scale) + np.float32(ins.bias)
    _store(m.tile(ins.dst), fn(x))


def run_activation_reduce(m: Memories, ins: isa.ActivationReduce, t: Target) -> None:
    _same_shape(ins, ins.dst, ins.src)
    if not ins.bias.shape == ins.acc.shape == (ins.dst.np, 1):
        raise SimulationError(f"{ins.opcode}: bias and acc must be [{ins.dst.np}, 1] tiles")
    fn = numerics.UNARY.get(ins.func)
    if fn is None:
        raise SimulationError(f"activation function {ins.func!r} does not exist")
    x = m.tile(ins.src).astype(np.float32, copy=False).reshape(ins.dst.np, -1)
    with np.errstate(invalid="ignore"):  # -inf - -inf in a fully masked row: nan, as IEEE says
        x = x + m.tile(ins.bias).astype(np.float32).reshape(ins.dst.np, 1)
    dst = m.tile(ins.dst)
    _store(dst, fn(x))
    rows = dst.astype(np.float32).reshape(ins.dst.np, -1)
    _store(m.tile(ins.acc), rows.sum(axis=1, keepdims=True))


def _binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "div" and a.dtype.kind == "i" and b.dtype.kind == "i":
        return numerics.int_divide(a, b)
    fn = numerics.BINARY.get(op)
    if fn is None:
        raise SimulationError(f"ALU op {op!r} does not exist")
    return fn(a, b)


def _promote(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = _compute(a), _compute(b)
    if a.dtype != b.dtype:
        a, b = a.astype(np.float32), b.astype(np.float32)
    return a, b


def _operands_fit(ins: isa.Instr, dst: isa.TileRef, *srcs: isa.TileRef) -> None:
    """Sources have dst's shape, or are [p, 1]: a per-partition scalar applied to every
    element of the partition (tensor_tensor / select read it as tensor_scalar does)."""
    for s in srcs:
        if s.shape != dst.shape and s.shape != (dst.np, 1):
            raise SimulationError(
                f"{ins.opcode}: operand {s.shape} is neither {dst.shape} nor a per-partition "
                f"scalar [{dst.np}, 1]"
            )


def _operand(m: Memories, ref: isa.TileRef, dst: isa.TileRef) -> np.ndarray:
    x = m.tile(ref)
    return x.reshape(dst.np, 1) if ref.shape != dst.shape else x.reshape(dst.np, -1)


def run_tensor_tensor(m: Memories, ins: isa.TensorTensor, t: Target) -> None:
    _operands_fit(ins, ins.dst, ins.a, ins.b)
    a, b = _promote(_operand(m, ins.a, ins.dst), _operand(m, ins.b, ins.dst))
    out = _binary(ins.op, a, b)
    _store(m.tile(ins.dst), np.broadcast_to(out, (ins.dst.np, ins.dst.free_elems)))


def run_tensor_scalar(m: Memories, ins: isa.TensorScalar, t: Target) -> None:
    _same_shape(ins, ins.dst, ins.src)
    a = _compute(m.tile(ins.src))
    b = np.asarray(ins.scalar, dtype=np.float32 if a.dtype.kind == "f" else np.float64)
    if a.dtype == np.bool_:
        a = a.astype(np.float32)
    _store(m.tile(ins.dst), _binary(ins.op, a, b.astype(a.dtype)))


def run_tensor_reduce(m: Memories, ins: isa.TensorReduce, t: Target) -> None:
    if ins.dst.shape != (ins.src.np, 1):
        raise SimulationError(f"tensor_reduce writes [{ins.src.np}, 1], got {ins.dst}")
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}.get(ins.op)
    if fn is None:
        raise SimulationError(f"reduce op {ins.op!r} does not exist")
    x = _compute(m.tile(ins.src)).reshape(ins.src.np, -1)
    _store(m.tile(ins.dst), fn(x, axis=1, keepdims=True))


def run_tensor_copy(m: Memories, ins: isa.TensorCopy, t: Target) -> None:
    _same_shape(ins, ins.dst, ins.src)
    _store(m.tile(ins.dst), m.tile(ins.src))


def run_select(m: Memories, ins: isa.Select, t: Target) -> None:
    _operands_fit(ins, ins.dst, ins.pred, ins.a, ins.b)
    pred = _operand(m, ins.pred, ins.dst).astype(np.bool_)
    a, b = _operand(m, ins.a, ins.dst), _operand(m, ins.b, ins.dst)
    _store(m.tile(ins.dst), np.broadcast_to(np.where(pred, a, b), (ins.dst.np, ins.dst.free_elems)))


def run_memset(m: Memories, ins: isa.Memset, t: Target) -> None:
    m.tile(ins.dst)[...] = np.asarray(ins.value).astype(ins.dst.dtype.numpy)


def run_iota(m: Memories, ins: isa.Iota, t: Target) -> None:
    dst = m.tile(ins.dst)
    p = np.arange(ins.dst.np, dtype=np.float64)[:, None]
    f = np.arange(ins.dst.free_elems, dtype=np.float64)[None, :]
    _store(dst, ins.base + p * ins.pstep + f * ins.fstep)


SEMANTICS: dict[str, Callable[[Memories, isa.Instr, Target], None]] = {
    "dma": run_dma,
    "dma_gather": run_dma_gather,
    "dma_scatter": run_dma_scatter,
    "matmul": run_matmul,
    "activation": run_activation,
    "activation_reduce": run_activation_reduce,
    "tensor_tensor": run_tensor_tensor,
    "tensor_scalar": run_tensor_scalar,
    "tensor_reduce": run_tensor_reduce,
    "tensor_copy": run_tensor_copy,
    "select": run_select,
    "memset": run_memset,
    "iota": run_iota,
}
