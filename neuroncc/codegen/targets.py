"""Target presets: the hardware description every other layer reads.

One validated, frozen config object per NeuronCore generation. Passes read capacities from it,
codegen reads tile limits, and the simulator reads clocks and bandwidths, so the compiler
optimises for exactly what the simulator measures. Every figure names its source in
`shared/docs/ref-neuroncore.md` (section 1a unless noted); [derived] marks our arithmetic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

KIB = 1024
GIB = 1024**3


class Target(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    # Engine clocks in GHz (arch guides).
    tensor_ghz: float = Field(gt=0)
    vector_ghz: float = Field(gt=0)
    scalar_ghz: float = Field(gt=0)
    gpsimd_ghz: float = Field(gt=0)
    # Elements per cycle per partition lane for fp32 operands; VectorE has a bf16/fp16 "perf
    # mode" on trn2/trn3 (datapath rows). Expressed as multipliers on the 1-per-lane baseline.
    vector_lowp_speedup: float = Field(ge=1)
    scalar_lowp_speedup: float = Field(ge=1)
    # Memories.
    partitions: int = 128
    sbuf_partition_bytes: int = Field(gt=0)
    psum_partition_bytes: int = 16 * KIB  # 8 banks x 2 KiB (PSUM row)
    psum_bank_bytes: int = 2 * KIB
    hbm_bytes: int = Field(gt=0)  # per NeuronCore as the backend sees it [derived]
    hbm_gbps: float = Field(gt=0)  # per NeuronCore [derived]
    # TensorE tile limits (nc_matmul docstring): stationary <= 128x128, moving free <= 512.
    pe_rows: int = 128
    pe_stationary_fmax: int = 128
    pe_moving_fmax: int = 512
    pe_fp32_slowdown: int = 4  # "FP32 inputs cost 4x" (1c)
    # DMA: 16 engines (queues) per core; per-engine bandwidth from the B/ns table.
    dma_queues: int = 16
    dma_engine_gbps: float = Field(gt=0)
    dma_fixed_ns: float = Field(ge=0)
    dma_min_burst_bytes: int = 64  # see Note [dma efficiency] in costs.py
    # Fixed per-instruction costs in engine cycles (1c).
    access_overhead_cycles: int = 60  # "starting any SBUF/PSUM access costs ~60 cycles"
    min_ii_cycles: int = 64  # MIN_II
    gpsimd_startup_cycles: int = 150
    semaphore_ns: float = 0.0  # cross-engine wait latency beyond the producer's finish


TRN1 = Target(
    name="trn1",
    tensor_ghz=2.8,
    vector_ghz=1.12,
    scalar_ghz=1.4,
    gpsimd_ghz=1.4,
    vector_lowp_speedup=1.0,  # NC-v2: 128 elements/cycle for all dtypes
    scalar_lowp_speedup=1.0,
    sbuf_partition_bytes=192 * KIB,  # 24 MiB = 128 x 192 KiB
    hbm_bytes=16 * GIB,  # 32 GiB per chip / 2 cores [derived]
    hbm_gbps=410.0,  # 820 GB/s per chip / 2 cores [derived]
    dma_engine_gbps=17.0,  # 17 B/ns per engine (nki-dma-bandwidth-guide table)
    dma_fixed_ns=64.0,
)

TRN2 = Target(
    name="trn2",
    tensor_ghz=2.4,
    vector_ghz=0.96,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_lowp_speedup=2.0,  # 512/cycle bf16 vs 256/cycle other dtypes
    scalar_lowp_speedup=1.0,
    sbuf_partition_bytes=224 * KIB,  # 28 MiB = 128 x 224 KiB
    hbm_bytes=24 * GIB,  # LNC=2 logical core: 24 GiB [derived]
    hbm_gbps=725.0,  # LNC=2 logical core [derived]
    dma_engine_gbps=23.0,  # 23 B/ns; fits 32 KiB in 1416 ns on one engine
    dma_fixed_ns=0.0,
)

TRN3 = Target(
    name="trn3",
    tensor_ghz=2.4,
    vector_ghz=1.2,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_lowp_speedup=2.0,  # 512/cycle bf16/fp16/fp8 vs 256 others
    scalar_lowp_speedup=2.0,  # 256/cycle bf16/fp16/fp8 vs 128 others
    sbuf_partition_bytes=256 * KIB,  # 32 MiB = 128 x 256 KiB
    hbm_bytes=18 * GIB,  # 144 GiB / 8 cores [derived]
    hbm_gbps=612.0,  # [derived]
    dma_engine_gbps=33.0,  # 33 B/ns per engine
    dma_fixed_ns=0.0,
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; allowed: {', '.join(TARGETS)}")
    return TARGETS[name]
