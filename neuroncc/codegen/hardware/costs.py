"""Per-instruction cost formulas: the one source of truth for how long an instruction takes.

The simulator's timing, and later the passes' decisions, call `instr_ns`. Formulas follow
`shared/docs/ref-neuroncore.md` section 1c (NKI ISA "estimated instruction cost", NC-v2 era);
N is the number of elements per partition (the free size).

Note [dma efficiency]: a DMA moves its data as descriptors, one per contiguous run (a partition
row of a tile, a contiguous stretch of HBM). Each descriptor costs a DMA engine a fixed
`dma_descriptor_ns` plus its bytes at the engine's bandwidth, and runs shorter than a burst cost
as much as a full burst (`dma_min_burst_bytes`). So small rows are overhead-bound and element-
strided transposes slow, as the docs warn; the burst size is our approximation, the descriptor
cost is calibrated (targets.py).

Note [dma ports]: an engine's bytes cost it time once per memory side they cross. HBM is not an
engine's: it is one resource of the core, shared by every DMA in flight, and the timing model
charges it separately (runtime/timing.py, Note [hbm is shared]), an HBM->HBM copy for its read
and its write. SBUF is the engines' own side ("16x DMA engines ... drive its corresponding SBUF
bandwidth", trn2 arch guide), one port per engine: an on-chip copy (SBUF or PSUM to SBUF or
PSUM) reads and writes through it, so its bytes cost the engine twice (`passes` = 2), half the
rate of a copy into SBUF, as the docs give for SBUF->SBUF DMA transposes (50%, against 90% from
HBM) and for DMA compute before NC-v4 (50% of the DMA copy rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.ir.types import DType

_LOW_PRECISION = (DType.BF16, DType.F16)


def engine_ghz(engine: str, t: Target) -> float:
    return {"pe": t.tensor_ghz, "act": t.scalar_ghz, "dve": t.vector_ghz, "pool": t.gpsimd_ghz}[
        engine
    ]


@dataclass(frozen=True)
class DmaWork:
    """What a DMA asks of the DMA engines: `descriptors` contiguous runs of `run_bytes` each
    (`payload` bytes in all), spread over the engines, each byte crossing its engine's port
    `passes` times (Note [dma ports])."""

    descriptors: int
    run_bytes: int
    payload: int
    passes: int = 1

    def engine_ns(self, descriptors: int, t: Target) -> float:
        """Time an engine spends on `descriptors` of this DMA's runs (Note [dma efficiency]).
        HBM's share of the cost is not here: HBM is shared (Note [dma ports])."""
        burst = max(self.run_bytes, t.dma_min_burst_bytes)
        return descriptors * (t.dma_descriptor_ns + self.passes * burst / t.dma_engine_gbps)

    def ideal_ns(self, t: Target) -> float:
        """The payload at full bandwidth over all engines: what a perfect DMA would take."""
        return self.payload / t.dma_gbps


def _run_bytes(ref: isa.Operand) -> int:
    """Bytes per descriptor on one side: a partition row of a tile (partitions are separate
    memories), or a contiguous run of an HBM access pattern."""
    if isinstance(ref, isa.TileRef):
        return ref.free_bytes
    return ref.contiguous_run() * ref.dtype.itemsize


def dma_work(ins: isa.Instr, t: Target) -> DmaWork:
    work = _dma_work(ins)
    if work.run_bytes <= t.dma_max_descriptor_bytes:
        return work
    run = t.dma_max_descriptor_bytes
    return DmaWork(math.ceil(work.payload / run), run, work.payload, work.passes)


def _dma_work(ins: isa.Instr) -> DmaWork:
    if isinstance(ins, isa.Dma):
        payload = ins.dst.numel * ins.dst.dtype.itemsize
        run = max(1, min(_run_bytes(ins.src), _run_bytes(ins.dst), payload))
        if isinstance(ins.src, isa.TileRef) and isinstance(ins.dst, isa.TileRef):
            return DmaWork(math.ceil(payload / run), run, payload, passes=2)  # Note [dma ports]
    elif isinstance(ins, isa.DmaGather):
        run, payload = ins.dst.free_bytes, ins.dst.np * ins.dst.free_bytes
    elif isinstance(ins, isa.DmaScatter):
        run = ins.src.free_bytes
        payload = ins.src.np * run * (1 if ins.combine == "set" else 2)  # read-modify-write
    else:
        raise TypeError(f"{type(ins).__name__} is not a DMA")
    return DmaWork(math.ceil(payload / run) if payload else 0, run, payload)


def dma_ns(nbytes: int, run_bytes: int, t: Target, engines: int = 1) -> float:
    """A transfer of nbytes between HBM and SBUF in runs of run_bytes, alone on `engines` DMA
    engines: the busiest engine's time, or HBM's if that is longer."""
    work = DmaWork(math.ceil(nbytes / run_bytes), run_bytes, nbytes)
    per_engine = math.ceil(work.descriptors / engines)
    return max(work.engine_ns(per_engine, t), nbytes / t.hbm_gbps)


def _vector_cycles(n: int, per_elem: float, t: Target, lowp: bool, engine: str = "dve") -> float:
    """An ALU pass over n elements per lane on VectorE (or GpSimdE, which has no wide modes)."""
    speed = 1.0
    if engine == "dve":
        speed = t.vector_elems_per_lane * (t.vector_lowp_speedup if lowp else 1.0)
    return t.access_overhead_cycles + max(t.min_ii_cycles, per_elem * n / speed)


def compute_cycles(ins: isa.Instr, t: Target) -> float:
    """Engine cycles of one compute instruction; every GpSimdE instruction also pays its
    start-up cost (`iota`: 150 + N)."""
    cycles = _cycles(ins, t)
    return cycles + t.gpsimd_startup_cycles if ins.engine == "pool" else cycles


def _cycles(ins: isa.Instr, t: Target) -> float:
    if isinstance(ins, isa.Matmul):
        m, n = ins.stationary.free_elems, ins.moving.free_elems
        slow = t.pe_fp32_slowdown if ins.moving.dtype == DType.F32 else 1
        if ins.transpose and t.pe_exact_transpose:  # NC-v3's transpose mode: "2x faster for
            slow = max(1, slow // 2)  # FP32" (1c)
        return max(min(64, m), n) * slow
    if isinstance(ins, (isa.Activation, isa.ActivationReduce)):  # the reduction is free
        lowp = ins.src.dtype in _LOW_PRECISION
        speed = t.scalar_lowp_speedup if lowp else 1.0
        return t.access_overhead_cycles + max(t.min_ii_cycles, ins.src.free_elems / speed)
    if isinstance(ins, isa.TensorTensor):
        # max(64, 2N), or max(64, N) when both inputs are bf16 or one is in PSUM (section 1c);
        # a per-partition scalar operand streams like tensor_scalar, max(64, N).
        lowp = ins.a.dtype in _LOW_PRECISION and ins.b.dtype in _LOW_PRECISION
        scalar = ins.dst.free_elems not in (1,) and 1 in (ins.a.free_elems, ins.b.free_elems)
        if ins.engine == "act":  # an activation with a per-partition scale or bias operand
            speed = t.scalar_lowp_speedup if lowp else 1.0
            return t.access_overhead_cycles + max(t.min_ii_cycles, ins.dst.free_elems / speed)
        per_elem = 1.0 if lowp or scalar or "psum" in (ins.a.mem, ins.b.mem) else 2.0
        return _vector_cycles(ins.dst.free_elems, per_elem, t, lowp, ins.engine)
    if isinstance(ins, isa.TensorReduce):
        lowp = ins.src.dtype in _LOW_PRECISION and ins.op in ("sum", "max")
        return _vector_cycles(ins.src.free_elems, 0.5 if lowp else 1.0, t, False, ins.engine)
    if isinstance(ins, (isa.TensorScalar, isa.TensorCopy, isa.Select)):
        src = ins.src if not isinstance(ins, isa.Select) else ins.a
        if ins.engine == "act":  # ScalarE copies/converts at its activation rate
            speed = t.scalar_lowp_speedup if src.dtype in _LOW_PRECISION else 1.0
            return t.access_overhead_cycles + max(t.min_ii_cycles, ins.dst.free_elems / speed)
        lowp = src.dtype in _LOW_PRECISION
        return _vector_cycles(ins.dst.free_elems, 1.0, t, lowp, ins.engine)
    if isinstance(ins, isa.Memset):
        per_elem = 0.5 if ins.dst.dtype in _LOW_PRECISION and ins.value == 0 else 1.0
        return _vector_cycles(ins.dst.free_elems, per_elem, t, False, ins.engine)
    if isinstance(ins, isa.Iota):
        return ins.dst.free_elems
    raise TypeError(f"no cost formula for {type(ins).__name__}")


def instr_ns(ins: isa.Instr, t: Target) -> float:
    """Time in ns that a compute instruction occupies its engine (DMAs: see dma_work)."""
    return compute_cycles(ins, t) / engine_ghz(ins.engine, t)


def matmul_flops(ins: isa.Instr) -> int:
    """Useful FLOPs: 2 K M N of the operands as given (a transpose does no model math)."""
    if not isinstance(ins, isa.Matmul) or ins.transpose:
        return 0
    k = ins.stationary.np
    return 2 * k * ins.stationary.free_elems * ins.moving.free_elems


def matmul_hw_flops(ins: isa.Instr, t: Target) -> int:
    """FLOPs the array spends: a matmul streams N columns through all 128 x 128 PEs (or its
    row tile's) whatever part of them K and M fill (what HFU counts, beside MFU's useful
    FLOPs)."""
    if not isinstance(ins, isa.Matmul):
        return 0
    rows = ins.tile_rows or t.pe_rows
    return 2 * rows * t.pe_stationary_fmax * ins.moving.free_elems
