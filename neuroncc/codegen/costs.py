"""Per-instruction cost formulas: the one source of truth for how long an instruction takes.

The simulator's timing, and later the passes' decisions, call `instr_ns`. Formulas follow
`shared/docs/ref-neuroncore.md` section 1c (NKI ISA "estimated instruction cost", NC-v2 era);
N is the number of elements per partition (the free size).

Note [dma efficiency]: a DMA moves its data as descriptors of contiguous runs; runs shorter than
a burst cost as much as a full burst (`dma_min_burst_bytes`). This is what makes an
element-strided DMA transpose slow, as the docs warn; the exact burst size is our approximation.
"""

from __future__ import annotations

import math

from neuroncc.codegen import isa
from neuroncc.codegen.targets import Target
from neuroncc.ir.types import DType

_LOW_PRECISION = (DType.BF16, DType.F16)


def engine_ghz(engine: str, t: Target) -> float:
    return {"pe": t.tensor_ghz, "act": t.scalar_ghz, "dve": t.vector_ghz, "pool": t.gpsimd_ghz}[
        engine
    ]


def _run_bytes(ref: isa.Operand) -> int:
    if isinstance(ref, isa.TileRef):
        return ref.free_bytes
    return ref.contiguous_run() * ref.dtype.itemsize


def dma_ns(nbytes: int, run_bytes: int, t: Target) -> float:
    if nbytes == 0:
        return t.dma_fixed_ns
    run_bytes = max(1, min(run_bytes, nbytes))
    runs = math.ceil(nbytes / run_bytes)
    effective = runs * max(run_bytes, t.dma_min_burst_bytes)
    return t.dma_fixed_ns + effective / t.dma_engine_gbps


def _vector_cycles(n: int, per_elem: float, t: Target, lowp: bool) -> float:
    speed = t.vector_lowp_speedup if lowp else 1.0
    return t.access_overhead_cycles + max(t.min_ii_cycles, per_elem * n / speed)


def compute_cycles(ins: isa.Instr, t: Target) -> float:
    if isinstance(ins, isa.Matmul):
        m, n = ins.stationary.free_elems, ins.moving.free_elems
        slow = t.pe_fp32_slowdown if ins.moving.dtype == DType.F32 else 1
        return max(min(64, m), n) * slow
    if isinstance(ins, isa.Activation):
        lowp = ins.src.dtype in _LOW_PRECISION
        speed = t.scalar_lowp_speedup if lowp else 1.0
        return t.access_overhead_cycles + max(t.min_ii_cycles, ins.src.free_elems / speed)
    if isinstance(ins, isa.TensorTensor):
        # max(64, 2N), or max(64, N) when both inputs are bf16 (section 1c).
        lowp = ins.a.dtype in _LOW_PRECISION and ins.b.dtype in _LOW_PRECISION
        per_elem = 1.0 if lowp or "psum" in (ins.a.mem, ins.b.mem) else 2.0
        return _vector_cycles(ins.a.free_elems, per_elem, t, lowp)
    if isinstance(ins, isa.TensorReduce):
        lowp = ins.src.dtype in _LOW_PRECISION and ins.op in ("sum", "max")
        return _vector_cycles(ins.src.free_elems, 0.5 if lowp else 1.0, t, False)
    if isinstance(ins, (isa.TensorScalar, isa.TensorCopy, isa.Select)):
        src = ins.src if not isinstance(ins, isa.Select) else ins.a
        return _vector_cycles(src.free_elems, 1.0, t, src.dtype in _LOW_PRECISION)
    if isinstance(ins, isa.Memset):
        per_elem = 0.5 if ins.dst.dtype in _LOW_PRECISION and ins.value == 0 else 1.0
        return _vector_cycles(ins.dst.free_elems, per_elem, t, False)
    if isinstance(ins, isa.Iota):
        return t.gpsimd_startup_cycles + ins.dst.free_elems
    raise TypeError(f"no cost formula for {type(ins).__name__}")


def instr_ns(ins: isa.Instr, t: Target) -> float:
    """Time in ns that `ins` occupies its engine."""
    if isinstance(ins, isa.Dma):
        run = min(_run_bytes(ins.src), _run_bytes(ins.dst))
        return dma_ns(ins.dst.numel * ins.dst.dtype.itemsize, run, t)
    if isinstance(ins, isa.DmaGather):
        row = ins.dst.free_bytes
        return dma_ns(ins.dst.np * row, row, t)
    if isinstance(ins, isa.DmaScatter):
        row = ins.src.free_bytes
        moved = ins.src.np * row * (1 if ins.combine == "set" else 2)  # read-modify-write
        return dma_ns(moved, row, t)
    return compute_cycles(ins, t) / engine_ghz(ins.engine, t)


def matmul_flops(ins: isa.Instr) -> int:
    if not isinstance(ins, isa.Matmul):
        return 0
    k = ins.stationary.np
    return 2 * k * ins.stationary.free_elems * ins.moving.free_elems
