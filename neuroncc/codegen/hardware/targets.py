"""Target presets: the hardware description every other layer reads.

One validated, frozen config object per NeuronCore generation. Passes read capacities from it,
codegen reads tile limits, and the simulator reads clocks and bandwidths, so the compiler
optimises for exactly what the simulator measures. Every figure names its source in
`shared/docs/ref-neuroncore.md` (section 1a unless noted); [derived] marks our arithmetic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from neuroncc.ir.types import DType

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
    # Datapath rows of 1a, as elements per cycle per partition lane: VectorE for fp32 (and
    # other non-16-bit dtypes), and the bf16/fp16 "perf mode" multiplier on top of that;
    # ScalarE's 16-bit multiplier. GpSimdE moves 1 element per lane per cycle throughout.
    vector_elems_per_lane: float = Field(default=1.0, ge=1)
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
    # Row tiling (1a "PE tiling", nc_matmul docstring): the 128 rows split into 2 x 64 tiles
    # (NC-v2 on), or 4 x 32 (NC-v3 on), where matmuls with a short contraction run in parallel.
    pe_row_tiles: tuple[int, ...] = (64,)
    # NC-v3 adds a bit-exact TensorE transpose mode (1c). Before it a transpose is a matmul
    # against the identity (nc_transpose), exact for finite data, but an inf or NaN anywhere
    # in the tile spreads (inf * 0 = NaN): the simulator computes that, and warns.
    pe_exact_transpose: bool = False
    # NC-v2: "VectorE and GpSimdE cannot access SBUF at the same time" (1c), so moving ALU
    # work from one to the other gains nothing there; NC-v3 lifts it.
    vector_gpsimd_share_sbuf: bool = False
    # TensorE warm-up throttling (1c, Neuron Explorer "Understanding throttling"): the array
    # starts at `pe_throttle_start` of full rate and ramps to full over `pe_throttle_ramp_ns` of
    # busy time; the limit returns when utilisation falls below 50% over that window.
    pe_throttle_start: float = Field(default=1.0, gt=0, le=1)
    pe_throttle_ramp_ns: float = Field(default=3000.0, gt=0)
    # DMA (1a, 1c): 16 DMA engines per core; every transfer fans its descriptors (one per
    # partition row or contiguous run) out over them. An engine spends `dma_descriptor_ns` per
    # descriptor plus the bytes at `dma_engine_gbps`; all engines together are capped by HBM.
    # DMA queues (instruction streams) run in order; different queues share the engines.
    dma_engines: int = 16
    dma_queues: int = 16
    dma_engine_gbps: float = Field(gt=0)
    dma_descriptor_ns: float = Field(ge=0)
    dma_min_burst_bytes: int = 64  # see Note [dma efficiency] in costs.py
    dma_max_descriptor_bytes: int = 64 * KIB  # [assumed] longer runs are split
    # Fixed per-instruction costs in engine cycles (1c).
    access_overhead_cycles: int = 60  # "starting any SBUF/PSUM access costs ~60 cycles"
    min_ii_cycles: int = 64  # MIN_II
    gpsimd_startup_cycles: int = 150  # every GpSimdE instruction
    # An instruction reading what the previous one on its engine wrote cannot overlap it: the
    # docs give ~100 cycles for dependent or tiny instructions and measured one dependent
    # 1-element ScalarE instruction per 264 cycles on NC-v2 (perf guide Opt #5a): 60 access +
    # 64 MIN_II + 140 drain.
    dependent_drain_cycles: int = 140
    semaphore_ns: float = 0.0  # cross-engine wait latency beyond the producer's finish

    def peak_flops_per_ns(self, dtype: DType) -> float:
        """TensorE peak: 128x128 MACs per cycle for bf16/fp16 (1a), fp32 at 1/4 rate."""
        peak = 2 * self.pe_rows * self.pe_stationary_fmax * self.tensor_ghz
        return peak / self.pe_fp32_slowdown if dtype == DType.F32 else peak

    @property
    def dma_gbps(self) -> float:
        """All DMA engines together, as HBM allows."""
        return min(self.dma_engines * self.dma_engine_gbps, self.hbm_gbps)


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
    # No hardware descriptor generation on NC-v2 (1a). Fitted, within the docs' "< 256 B per
    # partition is overhead-bound, >= 4 KiB saturates", to the NKI matmul tutorial's
    # published latencies (section 3); tools/calibrate.py reproduces them.
    dma_descriptor_ns=75.0,
    vector_gpsimd_share_sbuf=True,
)

TRN2 = Target(
    name="trn2",
    tensor_ghz=2.4,
    vector_ghz=0.96,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_elems_per_lane=2.0,  # 256/cycle for fp32 and other dtypes
    vector_lowp_speedup=2.0,  # 512/cycle bf16
    scalar_lowp_speedup=1.0,
    sbuf_partition_bytes=224 * KIB,  # 28 MiB = 128 x 224 KiB
    # One physical NeuronCore-v3, like every other figure here (one TensorE, 16 DMA engines):
    # 96 GiB and 2.9 TB/s over 8 cores [derived]. An LNC=2 logical core is two of these.
    hbm_bytes=12 * GIB,
    hbm_gbps=362.0,
    # 27.2 GB/s theoretical per engine (nki-dma-overview). 26 ns per descriptor was fitted so
    # that 32 KiB as 8 partition rows x 4 KiB takes the measured 1416 ns on one engine (1c); the
    # docs' example is 4 rows x 8 KiB (1309 ns here). Hold-out figures: tools/calibrate.py.
    dma_engine_gbps=27.2,
    dma_descriptor_ns=26.0,
    pe_throttle_start=0.5,
    pe_exact_transpose=True,
    pe_row_tiles=(32, 64),
)

TRN3 = Target(
    name="trn3",
    tensor_ghz=2.4,
    vector_ghz=1.2,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_elems_per_lane=2.0,  # 256/cycle for fp32 and other dtypes
    vector_lowp_speedup=2.0,  # 512/cycle bf16/fp16/fp8
    scalar_lowp_speedup=2.0,  # 256/cycle bf16/fp16/fp8 vs 128 others
    sbuf_partition_bytes=256 * KIB,  # 32 MiB = 128 x 256 KiB
    hbm_bytes=18 * GIB,  # 144 GiB / 8 cores [derived]
    hbm_gbps=612.0,  # [derived]
    dma_engine_gbps=38.4,  # 38.4 GB/s theoretical per engine (nki-dma-overview)
    dma_descriptor_ns=26.0,  # [assumed] as trn2: no published trn3 measurement
    pe_throttle_start=0.5,
    pe_exact_transpose=True,
    pe_row_tiles=(32, 64),
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; allowed: {', '.join(TARGETS)}")
    return TARGETS[name]
