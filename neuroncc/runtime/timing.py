"""The timing model: when each instruction starts and ends on its engine.

Each engine (and DMA queue) executes its stream in order; an instruction starts when its engine
is free and every instruction it waits on has finished. Durations come from codegen/costs.py.
Shapes are static, so an executable's timing is computed once and reused for every execution.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from neuroncc.codegen import costs, isa
from neuroncc.codegen.program import Executable
from neuroncc.codegen.targets import Target


@dataclass(frozen=True)
class Profile:
    """What one execution of an executable costs on the target."""

    target: str
    device_ns: float
    engine_busy_ns: dict[str, float]
    engine_instructions: dict[str, int]
    instructions: int
    flops: int
    hbm_read_bytes: int
    hbm_write_bytes: int
    mfu: float

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes


def _hbm_bytes(ins: isa.Instr) -> tuple[int, int]:
    read = sum(r.nbytes for r in ins.reads() if isinstance(r, isa.DramRef))
    if isinstance(ins, isa.DmaGather):
        read = ins.dst.numel * ins.dst.dtype.itemsize  # only the gathered rows move
    write = sum(w.nbytes for w in ins.writes() if isinstance(w, isa.DramRef))
    if isinstance(ins, isa.DmaScatter):
        write = ins.src.numel * ins.src.dtype.itemsize  # only the scattered rows move
        read = 0 if ins.combine == "set" else write
    return read, write


def time_executable(exe: Executable, t: Target) -> Profile:
    n = len(exe.instructions)
    end = [0.0] * n
    free_at: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    flops = read = write = 0
    for i, ins in enumerate(exe.instructions):
        dur = costs.instr_ns(ins, t)
        ready = max((end[d] + t.semaphore_ns for d in ins.deps), default=0.0)
        start = max(free_at[ins.engine], ready)
        end[i] = start + dur
        free_at[ins.engine] = end[i]
        busy[ins.engine] += dur
        counts[ins.engine] += 1
        flops += costs.matmul_flops(ins)
        r, w = _hbm_bytes(ins)
        read, write = read + r, write + w
    total = max(end, default=0.0)
    peak_flops_per_ns = 2 * t.pe_rows * t.pe_stationary_fmax * t.tensor_ghz
    mfu = flops / (peak_flops_per_ns * total) if total else 0.0
    return Profile(
        target=t.name,
        device_ns=total,
        engine_busy_ns=dict(busy),
        engine_instructions=dict(counts),
        instructions=n,
        flops=flops,
        hbm_read_bytes=read,
        hbm_write_bytes=write,
        mfu=mfu,
    )
