"""What each instruction does to memory, computed with numpy on the tiles it names.

Engines compute in fp32 (integers in int64, predicates as bool) and round to the destination
dtype; TensorE multiplies into fp32 PSUM.

Each opcode has a `prepare` function: it checks the rules its instruction must obey (tile
limits, memory kinds, shapes) and raises SimulationError otherwise, binds the operands to views
of the memories, and returns the step, a function of no arguments that does the arithmetic. The
checks and the views cost more than most steps' arithmetic, and a program names the same bytes
in every run, so the simulator keeps an executable's steps from run to run (memory.Kept).
A prepare function may read memory (the identity of a transpose) only when the memories are
`checked`: in that run each step is prepared right after the one before it has run.
Steps run with numpy's floating-point warnings off (simulator.run): IEEE results, no warnings.

Note [torch on simulator memory]: TensorE's products run on torch's CPU matmul (MKL/oneDNN,
on torch's threads), on tensors that are zero-copy views of the simulator's own SBUF and
PSUM arrays (torch.from_numpy; bf16 tiles through their bits): the product lands in PSUM
itself. Never on a model's tensor, never the graph's ATen op: the simulator computes what
the instruction says, 1.6x faster than numpy's single-threaded BLAS (a Llama layer at 2048:
TensorE's products were 70% of the simulation). bf16 x bf16 products are exact in fp32;
the sums round as any fp32 accumulation does, in the order the library takes.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import ml_dtypes
import numpy as np
import torch

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import SimulationError
from neuroncc.ir import numerics
from neuroncc.runtime.memory import Memories

Step = Callable[[], None]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    if dtype == np.bool_:
        return dtype
    return np.dtype(np.int64 if dtype.kind in "iu" else np.float32)


def _compute(a: np.ndarray) -> np.ndarray:
    return a.astype(_compute_dtype(a.dtype), copy=False)  # a view where it is one: not written


def _store(dst: np.ndarray, values: np.ndarray) -> None:
    dst[...] = np.asarray(values).astype(dst.dtype, copy=False).reshape(dst.shape)


def _as_f32(a: np.ndarray) -> Callable[[], np.ndarray]:
    """a's values in fp32 at the time of the call: a itself if it holds fp32, else a fresh
    conversion (one made now would go stale)."""
    if a.dtype == np.float32:
        return lambda: a
    return lambda: a.astype(np.float32)


def _torch_f32(a: np.ndarray) -> Callable[[], torch.Tensor]:
    """a's values as an fp32 torch tensor at the time of the call, for TensorE's products
    (Note [torch on simulator memory]): a itself, zero-copy, if it holds fp32, else a
    conversion of a zero-copy view made then."""
    if a.dtype == ml_dtypes.bfloat16:
        bits = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
        return lambda: bits.float()
    view = torch.from_numpy(a)
    if view.dtype == torch.float32:
        return lambda: view
    return lambda: view.float()


def _same_shape(ins: isa.Instr, *refs: isa.TileRef) -> None:
    shapes = {r.shape for r in refs}
    if len(shapes) != 1:
        raise SimulationError(f"{ins.opcode}: operand shapes differ: {sorted(shapes)}")


def prepare_dma(m: Memories, ins: isa.Dma, t: Target) -> Step:
    if ins.src.dtype != ins.dst.dtype:
        raise SimulationError(f"dma cannot convert {ins.src.dtype.value} to {ins.dst.dtype.value}")
    src, dst = m.view(ins.src), m.view(ins.dst)
    if src.size != dst.size:
        raise SimulationError(f"dma moves {src.size} elements into {dst.size}")
    if src.shape != dst.shape:
        shaped = src.reshape(dst.shape)
        if not np.may_share_memory(shaped, src):  # a copy: reshape in every run
            return lambda: dst.__setitem__(Ellipsis, src.reshape(dst.shape))
        src = shaped

    def step() -> None:
        dst[...] = src

    return step


def _indexed_table(
    m: Memories, ins: isa.DmaGather | isa.DmaScatter
) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """The indirect DMA's (row indices, table view), every index checked against the table."""
    index, table = m.tile(ins.index), m.dram(ins.table)

    def rows() -> tuple[np.ndarray, np.ndarray]:
        idx = index.reshape(-1).astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
            bad = idx[(idx < 0) | (idx >= table.shape[0])][0]
            raise SimulationError(
                f"{ins.opcode}: index {bad} outside table of {table.shape[0]} rows"
            )
        return idx, table

    return rows


def prepare_dma_gather(m: Memories, ins: isa.DmaGather, t: Target) -> Step:
    rows, dst = _indexed_table(m, ins), m.tile(ins.dst)

    def step() -> None:
        idx, table = rows()
        _store(dst, table[idx])

    return step


def prepare_dma_scatter(m: Memories, ins: isa.DmaScatter, t: Target) -> Step:
    rows, src = _indexed_table(m, ins), m.tile(ins.src)

    def step() -> None:
        idx, table = rows()
        new = src.reshape(idx.size, -1)
        table[...] = numerics.scatter_rows(np.asarray(table), idx, new, ins.combine)

    return step


def prepare_matmul(m: Memories, ins: isa.Matmul, t: Target) -> Step:
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
    if ins.tile_rows:
        _check_row_tile(ins, t)
    if (
        dst.free_bytes > t.psum_bank_bytes
        or dst.offset // t.psum_bank_bytes != (dst.offset + dst.free_bytes - 1) // t.psum_bank_bytes
    ):
        raise SimulationError(f"matmul result {dst} must lie in one PSUM bank")
    a_view, b_view = m.tile(st).reshape(st.np, -1), m.tile(mv).reshape(mv.np, -1)
    out = m.tile(dst)
    if ins.transpose:
        identity = _identity(st.np)
        if mv.shape != (st.np, st.np) or (m.checked and not np.array_equal(b_view, identity)):
            raise SimulationError("a transpose matmul multiplies by the identity")
        a = _as_f32(a_view)
        if t.pe_exact_transpose:  # the transpose mode: data movement, no arithmetic

            def transpose() -> None:
                out[...] = np.ascontiguousarray(a()).T  # 4x faster than strided copies

            return transpose

        def identity_product() -> None:
            x = a()
            out[...] = np.ascontiguousarray(x).T  # what x.T @ I is where x is finite
            if not np.isfinite(x).all():
                out[...] = _spread_non_finite(x)

        return identity_product
    a, b, psum = _torch_f32(a_view), _torch_f32(b_view), torch.from_numpy(out)
    if not ins.accumulate:
        return lambda: torch.mm(a().T, b(), out=psum)
    return lambda: psum.addmm_(a().T, b())


def _check_row_tile(ins: isa.Matmul, t: Target) -> None:
    """A row-tiled matmul's operands lie on the partitions of one tile of `tile_rows` PE rows,
    which starts at a multiple of that size (nc_matmul: tile_position, tile_size)."""
    rows, st, mv = ins.tile_rows, ins.stationary, ins.moving
    if rows not in t.pe_row_tiles:
        allowed = ", ".join(map(str, t.pe_row_tiles))
        raise SimulationError(f"{t.name} has no {rows}-row TensorE tiles (it has {allowed})")
    if st.p0 != mv.p0 or st.p0 % rows or st.np > rows:
        raise SimulationError(
            f"row-tiled matmul operands {st} and {mv} must share partitions within one"
            f" {rows}-row tile"
        )


@functools.cache
def _identity(n: int) -> np.ndarray:
    return np.eye(n, dtype=np.float32)


def _spread_non_finite(x: np.ndarray) -> np.ndarray:
    """x.T @ I for an x with an inf or NaN, as a matmul computes it: every other output of
    that value's column gets inf * 0 = NaN (NC-v2's TensorE transpose, pe_transpose.py)."""
    warnings.warn(
        "an inf or NaN went through a TensorE transpose on a target without the exact "
        "transpose mode (trn1): as on the hardware, the rest of its column became NaN "
        "(nki.isa.nc_transpose: not bit-accurate on NeuronCore-v2 for NaN/Inf)",
        RuntimeWarning,
        stacklevel=2,
    )
    return x.T @ _identity(x.shape[0])


def _unary(func: str) -> Callable[[np.ndarray], np.ndarray]:
    fn = numerics.UNARY.get(func)
    if fn is None:
        raise SimulationError(f"activation function {func!r} does not exist")
    return fn


def prepare_activation(m: Memories, ins: isa.Activation, t: Target) -> Step:
    _same_shape(ins, ins.dst, ins.src)
    fn, src, dst = _unary(ins.func), m.tile(ins.src), m.tile(ins.dst)
    scale, bias = np.float32(ins.scale), np.float32(ins.bias)
    affine = ins.scale != 1.0 or ins.bias != 0.0

    def step() -> None:
        x = src.astype(np.float32, copy=False)
        _store(dst, fn(x * scale + bias if affine else x))

    return step


def prepare_activation_reduce(m: Memories, ins: isa.ActivationReduce, t: Target) -> Step:
    _same_shape(ins, ins.dst, ins.src)
    if not ins.bias.shape == ins.acc.shape == (ins.dst.np, 1):
        raise SimulationError(f"{ins.opcode}: bias and acc must be [{ins.dst.np}, 1] tiles")
    fn, p = _unary(ins.func), ins.dst.np
    src, bias = m.tile(ins.src).reshape(p, -1), m.tile(ins.bias).reshape(p, 1)
    dst, acc = m.tile(ins.dst), m.tile(ins.acc)

    def step() -> None:
        # -inf - -inf in a fully masked row: nan, as IEEE says (run's errstate keeps it quiet).
        x = src.astype(np.float32, copy=False) + bias.astype(np.float32)
        _store(dst, fn(x))
        _store(acc, dst.astype(np.float32, copy=False).reshape(p, -1).sum(axis=1, keepdims=True))

    return step


def _binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op == "div" and a.dtype.kind == "i" and b.dtype.kind == "i":
        return numerics.int_divide(a, b)
    return numerics.BINARY[op](a, b)


def _check_binary(op: str) -> None:
    if op not in numerics.BINARY:
        raise SimulationError(f"ALU op {op!r} does not exist")


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


def _in_place(m: Memories, ins: isa.Instr, dst: isa.TileRef, *srcs: isa.TileRef):
    """ins's ufunc and dst's 2-d view, if the ufunc can write dst directly (out=): the same
    function as numerics' definition, one pass less (numpy buffers an out= that overlaps an
    input). None if the op is no ufunc from fp32 to fp32, or a dtype is not fp32."""
    fn = getattr(numerics.BINARY[ins.op], "raw", None)
    if not isinstance(fn, np.ufunc) or "ff->f" not in fn.types:
        return None
    if any(r.dtype.value != "f32" for r in (dst, *srcs)):
        return None
    return fn, m.tile(dst).reshape(dst.np, -1)


def prepare_tensor_tensor(m: Memories, ins: isa.TensorTensor, t: Target) -> Step:
    _operands_fit(ins, ins.dst, ins.a, ins.b)
    _check_binary(ins.op)
    a, b, dst = _operand(m, ins.a, ins.dst), _operand(m, ins.b, ins.dst), m.tile(ins.dst)
    shape = (ins.dst.np, ins.dst.free_elems)
    direct = _in_place(m, ins, ins.dst, ins.a, ins.b)
    if direct is not None:
        fn, out = direct
        return lambda: fn(a, b, out=out)  # out's shape broadcasts [p, 1] sources

    def step() -> None:
        _store(dst, np.broadcast_to(_binary(ins.op, *_promote(a, b)), shape))

    return step


def prepare_tensor_scalar(m: Memories, ins: isa.TensorScalar, t: Target) -> Step:
    _same_shape(ins, ins.dst, ins.src)
    _check_binary(ins.op)
    src, dst = m.tile(ins.src), m.tile(ins.dst)
    kind = _compute_dtype(src.dtype)
    scalar = np.asarray(ins.scalar, dtype=np.float32 if kind.kind == "f" else np.float64)
    scalar = scalar.astype(np.float32 if kind == np.bool_ else kind)  # bools compute in fp32
    direct = _in_place(m, ins, ins.dst, ins.src)
    if direct is not None:
        fn, out = direct
        flat = src.reshape(ins.dst.np, -1)
        return lambda: fn(flat, scalar, out=out)

    def step() -> None:
        a = _compute(src)
        _store(dst, _binary(ins.op, a.astype(scalar.dtype, copy=False), scalar))

    return step


def prepare_tensor_reduce(m: Memories, ins: isa.TensorReduce, t: Target) -> Step:
    if ins.dst.shape != (ins.src.np, 1):
        raise SimulationError(f"tensor_reduce writes [{ins.src.np}, 1], got {ins.dst}")
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}.get(ins.op)
    if fn is None:
        raise SimulationError(f"reduce op {ins.op!r} does not exist")
    src, dst = m.tile(ins.src), m.tile(ins.dst)

    def step() -> None:
        _store(dst, fn(_compute(src).reshape(ins.src.np, -1), axis=1, keepdims=True))

    return step


def prepare_tensor_copy(m: Memories, ins: isa.TensorCopy, t: Target) -> Step:
    _same_shape(ins, ins.dst, ins.src)
    src, dst = m.tile(ins.src), m.tile(ins.dst)
    return lambda: _store(dst, src)


def prepare_select(m: Memories, ins: isa.Select, t: Target) -> Step:
    _operands_fit(ins, ins.dst, ins.pred, ins.a, ins.b)
    pred, a, b = (_operand(m, r, ins.dst) for r in (ins.pred, ins.a, ins.b))
    dst, shape = m.tile(ins.dst), (ins.dst.np, ins.dst.free_elems)

    def step() -> None:
        _store(dst, np.broadcast_to(np.where(pred.astype(np.bool_), a, b), shape))

    return step


def prepare_memset(m: Memories, ins: isa.Memset, t: Target) -> Step:
    dst, value = m.tile(ins.dst), np.asarray(ins.value).astype(ins.dst.dtype.numpy)
    return lambda: dst.__setitem__(Ellipsis, value)


def prepare_iota(m: Memories, ins: isa.Iota, t: Target) -> Step:
    dst = m.tile(ins.dst)
    p = np.arange(ins.dst.np, dtype=np.float64)[:, None]
    f = np.arange(ins.dst.free_elems, dtype=np.float64)[None, :]
    values = np.empty_like(dst)  # the same in every run: computed once
    _store(values, ins.base + p * ins.pstep + f * ins.fstep)
    return lambda: dst.__setitem__(Ellipsis, values)


PREPARE: dict[str, Callable[[Memories, isa.Instr, Target], Step]] = {
    "dma": prepare_dma,
    "dma_gather": prepare_dma_gather,
    "dma_scatter": prepare_dma_scatter,
    "matmul": prepare_matmul,
    "activation": prepare_activation,
    "activation_reduce": prepare_activation_reduce,
    "tensor_tensor": prepare_tensor_tensor,
    "tensor_scalar": prepare_tensor_scalar,
    "tensor_reduce": prepare_tensor_reduce,
    "tensor_copy": prepare_tensor_copy,
    "select": prepare_select,
    "memset": prepare_memset,
    "iota": prepare_iota,
}
