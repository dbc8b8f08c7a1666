"""The timing model: what an execution of an executable costs, from its schedule.

When each instruction starts and ends is the scheduler's (runtime/scheduler.py: engines, DMA
queues and engines, TensorE's lanes and throttle; Note [timing by call]); this module adds the
profile up, checks it against physics, and draws it (kernels, trace events).

Note [hbm is shared]: HBM is one resource of the core, shared by every DMA in flight. A DMA
reserves HBM for its HBM bytes (read and written: an HBM->HBM copy counts both) at the core's
bandwidth, in the earliest idle gap of HBM's timeline at or after its first share starts, and
ends no earlier than that reservation. Reservations are disjoint and each lies inside its DMA's
span, so HBM bytes / time never exceeds the bandwidth, over the program or any kernel of it.
`check_physics` asserts that after every timing, with the roofline's bound (device time at least
the roofline): a model that beats physics is a bug in neuroncc (NeuronccInternalError).

Nothing here touches tensor data: timing needs only the instruction stream, so a program is
timed without being run ("timing-only": `time_executable` on any Executable). Shapes are static,
so an executable's profile is computed once and reused for every execution.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from neuroncc.codegen.executable.blocks import turn_queue
from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import NeuronccInternalError
from neuroncc.ir.types import DType
from neuroncc.runtime.scheduler import (  # noqa: F401  (Schedule, _Scheduler, _Timeline,
    # hbm_refs: the callers' and tests' names for them)
    Schedule,
    _Scheduler,
    _Timeline,
    busy_share,
    hbm_bytes,
    hbm_refs,
    is_dma,
    schedule,
)


@dataclass(frozen=True)
class Profile:
    """What one execution of an executable costs on the target.

    mfu / hfu follow neuron-profile: FLOPs over (TensorE peak x device time), MFU counting the
    useful 2KMN of each matmul, HFU what the 128x128 array spends (partial tiles count whole).
    roofline_ns is max(FLOPs / peak, unavoidable HBM bytes / bandwidth): what the program reads
    of its inputs, read once, and what it writes of its outputs, written once (`io_bytes`).
    spill bytes are HBM traffic of intermediate buffers, which a fused
    program would keep on chip. dma_efficiency is the payload at full DMA bandwidth over the
    time the engines were busy.
    """

    target: str
    device_ns: float
    engine_busy_ns: dict[str, float]
    engine_instructions: dict[str, int]
    instructions: int
    flops: int
    hw_flops: int
    mfu: float
    hfu: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    sbuf_read_bytes: int
    sbuf_write_bytes: int
    psum_read_bytes: int
    psum_write_bytes: int
    spill_bytes: int
    dma_bytes: int
    dma_efficiency: float
    throttled_ns: float
    roofline_ns: float

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def roofline_fraction(self) -> float:
        """How close the simulated time comes to the roofline bound (1.0 = at the bound)."""
        return self.roofline_ns / self.device_ns if self.device_ns else 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "hbm_bytes": self.hbm_bytes}


def io_bytes(instructions, reads: dict[str, int], writes: dict[str, int]) -> int:
    """HBM bytes that moving these instructions' data needs at the least: per buffer of `reads`
    (name -> size) what they read of it, read once, and per buffer of `writes` what they write,
    written once. "What they read" is the smallest of the buffer's size, the bytes of the
    distinct access patterns read (a tile read again is needed once) and the union of their
    spans: never more than the instructions move, so a timing that moves them is never faster
    than these bytes at the bandwidth."""
    accesses = (
        # an indirect DMA's rows depend on its index: never the same as another's
        (ref.buffer, write, ref if nbytes == ref.nbytes else (ref, i), nbytes, ref, 0)
        for i, ins in enumerate(instructions)
        for ref, nbytes, write in hbm_refs(ins)
    )
    return _io_total(accesses, reads, writes)


def _io_total(accesses, reads: dict[str, int], writes: dict[str, int]) -> int:
    """io_bytes of (buffer, is a write, what tells the access from others, bytes, pattern,
    bytes the pattern is moved by)."""
    distinct: dict[tuple[str, bool], dict] = defaultdict(dict)
    for buffer, write, key, nbytes, ref, moved in accesses:
        if buffer in (writes if write else reads):
            distinct[buffer, write][key] = (nbytes, ref, moved)
    total = 0
    spans_of: dict[isa.DramRef, tuple[int, int]] = {}  # (a pattern repeats at other offsets)
    for (name, write), refs in distinct.items():
        size = (writes if write else reads)[name]
        spans = []
        for _, ref, moved in refs.values():
            span = spans_of.get(ref)
            if span is None:
                span = spans_of[ref] = _byte_span(ref)
            spans.append((span[0] + moved, span[1] + moved))
        total += min(size, sum(n for n, _, _ in refs.values()), _union_length(spans))
    return total


def _call_accesses(exe: Executable, reads: dict[str, int], writes: dict[str, int]):
    """io_bytes' accesses of exe's unrolled stream, read from its blocks and calls: the reads
    of `reads` and the writes of `writes` (a deep model's are mostly of temporaries, which
    io_bytes does not count)."""
    per_block: dict[int, list] = {}
    for c, call in enumerate(exe.calls):
        refs = per_block.get(call.block)
        if refs is None:
            refs = per_block[call.block] = _block_accesses(exe.blocks[call.block])
        for param, write, key, nbytes, ref, indirect in refs:
            if call.args[param] not in (writes if write else reads):
                continue
            offset = call.offset(param)
            if offset:  # the pattern where this call puts it
                key = (key, offset)
            moved = offset * ref.dtype.itemsize
            yield call.args[param], write, (key, c) if indirect else key, nbytes, ref, moved


def _block_accesses(block) -> list[tuple]:
    out = []
    for j, ins in enumerate(block.instructions):
        for ref, nbytes, write in hbm_refs(ins):
            indirect = nbytes != ref.nbytes
            key = dataclasses.replace(ref, buffer="")  # the pattern, whichever buffer
            param = int(ref.buffer[1:])
            out.append((param, write, (key, j) if indirect else key, nbytes, ref, indirect))
    return out


def _byte_span(ref: isa.DramRef) -> tuple[int, int]:
    lo, hi = ref.span()
    return lo * ref.dtype.itemsize, hi * ref.dtype.itemsize


def _union_length(intervals: list[tuple[int, int]]) -> int:
    length, reach = 0, None
    for lo, hi in sorted(intervals):
        if reach is None or lo > reach:
            length, reach = length + hi - lo, hi
        elif hi > reach:
            length, reach = length + hi - reach, hi
    return length


def _tile_bytes(refs, mem: str) -> int:
    return sum(
        r.numel * r.dtype.itemsize for r in refs if isinstance(r, isa.TileRef) and r.mem == mem
    )


def roofline_ns(exe: Executable, t: Target) -> float:
    """max(FLOPs / peak, unavoidable HBM bytes / bandwidth) for this executable's work:
    its matmul FLOPs at the peak of their dtype, what it reads of its inputs read once and what
    it writes of its outputs written once (io_bytes: an input it never reads costs nothing, a
    slice of one only the slice)."""
    reads = {b.name: b.nbytes for b in exe.buffers if b.kind == "input"}
    writes = {b.name: b.nbytes for b in exe.buffers if b.kind == "output"}
    io = _io_total(_call_accesses(exe, reads, writes), reads, writes)
    calls = Counter(call.block for call in exe.calls)
    compute = sum(n * _compute_ns(exe.blocks[b].instructions, t) for b, n in calls.items())
    return max(compute, io / t.hbm_gbps)


def _compute_ns(instructions, t: Target) -> float:
    return sum(
        costs.matmul_flops(ins) / t.peak_flops_per_ns(ins.moving.dtype)
        for ins in instructions
        if isinstance(ins, isa.Matmul)
    )


def check_physics(what: str, ns: float, hbm: int, roofline: float, t: Target) -> None:
    """A timing of `ns` that moved `hbm` bytes of HBM obeys physics: at most the target's HBM
    bandwidth, and no faster than its roofline (Note [hbm is shared]). NeuronccInternalError
    otherwise: the cost model beat the hardware, a bug in neuroncc."""
    slack = 1e-9 * ns + 1e-6  # float rounding of sums of reservations
    if hbm > (ns + slack) * t.hbm_gbps:
        raise NeuronccInternalError(
            f"{what} moves {hbm} B of HBM in {ns:.1f} ns: {hbm / max(ns, 1e-9):.1f} GB/s, over "
            f"{t.name}'s {t.hbm_gbps:g} GB/s",
            stage="simulate",
        )
    if roofline > ns + slack:
        raise NeuronccInternalError(
            f"{what} takes {ns:.1f} ns, under its roofline of {roofline:.1f} ns on {t.name}",
            stage="simulate",
        )


@dataclass
class _BlockCost:
    """What a block's instructions cost whatever their schedule: counted once per block,
    added up per call (Note [blocks and calls])."""

    engines: Counter  # instructions per engine, as the block names them
    flops: int
    hw_flops: int
    peak_ns: float  # hw_flops at the peak of each matmul's dtype
    read: int
    write: int
    dma_payload: int
    sbuf: tuple[int, int]  # bytes read, written
    psum: tuple[int, int]
    param_bytes: dict[int, int]  # per HBM parameter: the bytes its accesses move


def _block_cost(block, plan, t: Target) -> _BlockCost:
    """The block's costs; its HBM bytes and DMA payload are the scheduler's plan's."""
    engines: Counter[str] = Counter()
    flops = hw_flops = 0
    sbuf_r = sbuf_w = psum_r = psum_w = 0
    peak_ns = 0.0
    param_bytes: Counter[int] = Counter()
    for ins in block.instructions:
        engines[ins.engine] += 1
        if isinstance(ins, isa.Matmul):
            hw = costs.matmul_hw_flops(ins, t)
            flops, hw_flops = flops + costs.matmul_flops(ins), hw_flops + hw
            peak_ns += hw / t.peak_flops_per_ns(ins.moving.dtype)
        reads, writes = ins.reads(), ins.writes()
        for ref in (*reads, *writes):
            if isinstance(ref, isa.DramRef):
                param_bytes[int(ref.buffer[1:])] += ref.nbytes
        sbuf_r += _tile_bytes(reads, "sbuf")
        sbuf_w += _tile_bytes(writes, "sbuf")
        psum_r += _tile_bytes(reads, "psum")
        psum_w += _tile_bytes(writes, "psum")
    return _BlockCost(
        engines,
        flops,
        hw_flops,
        peak_ns,
        plan.hbm_read,
        plan.hbm_write,
        plan.dma_payload,
        (sbuf_r, sbuf_w),
        (psum_r, psum_w),
        dict(param_bytes),
    )


def time_executable(exe: Executable, t: Target) -> Profile:
    sched, state = schedule(exe, t, detail=False)
    counts: Counter[str] = Counter()
    kinds = {b.name: b.kind for b in exe.buffers}
    flops = hw_flops = read = write = spill = dma_payload = 0
    sbuf_r = sbuf_w = psum_r = psum_w = 0
    peak_ns = 0.0
    block_costs = {k: _block_cost(exe.blocks[k], plan, t) for k, plan in state.plans.items()}
    for call in exe.calls:
        c = block_costs[call.block]
        for engine, n in c.engines.items():
            counts[turn_queue(engine, call.phase, exe.shared_queues)] += n
        flops, hw_flops, peak_ns = flops + c.flops, hw_flops + c.hw_flops, peak_ns + c.peak_ns
        read, write, dma_payload = read + c.read, write + c.write, dma_payload + c.dma_payload
        sbuf_r, sbuf_w = sbuf_r + c.sbuf[0], sbuf_w + c.sbuf[1]
        psum_r, psum_w = psum_r + c.psum[0], psum_w + c.psum[1]
        spill += sum(n for p, n in c.param_bytes.items() if kinds.get(call.args[p]) == "temp")
    total = float(sched.end.max()) if len(sched.end) else 0.0
    # Utilisation against the peak of the dtypes actually multiplied (fp32 runs at 1/4).
    dtype_peak = hw_flops / peak_ns if peak_ns else t.peak_flops_per_ns(DType.BF16)
    ideal_dma_ns = dma_payload / (t.dma_gbps / t.dma_engines)
    profile = Profile(
        target=t.name,
        device_ns=total,
        engine_busy_ns=dict(state.busy),
        engine_instructions=dict(counts),
        instructions=len(sched.end),
        flops=flops,
        hw_flops=hw_flops,
        mfu=flops / (dtype_peak * total) if total else 0.0,
        hfu=hw_flops / (dtype_peak * total) if total else 0.0,
        hbm_read_bytes=read,
        hbm_write_bytes=write,
        sbuf_read_bytes=sbuf_r,
        sbuf_write_bytes=sbuf_w,
        psum_read_bytes=psum_r,
        psum_write_bytes=psum_w,
        spill_bytes=spill,
        dma_bytes=dma_payload,
        dma_efficiency=ideal_dma_ns / state.dma_engine_ns if state.dma_engine_ns else 1.0,
        throttled_ns=state.throttled_ns,
        roofline_ns=roofline_ns(exe, t),
    )
    what = f"executable {exe.name}"
    check_physics(what, total, profile.hbm_bytes, profile.roofline_ns, t)
    return profile


@dataclass(frozen=True)
class KernelCost:
    """One kernel of an executable: its span in the schedule and what it does in it.
    fraction = roofline_ns / (end_ns - start_ns), the kernel's own roofline being
    max(matmul FLOPs / peak, the HBM bytes it needs / bandwidth), where what it needs counts
    every buffer it reads or writes (io_bytes), temporaries too: they are its inputs and
    outputs. hbm_bytes is what it moves."""

    name: str
    start_ns: float
    end_ns: float
    engine: str  # the engine busiest in it
    busy_ns: dict[str, float]
    instructions: int
    flops: int
    hbm_bytes: int
    roofline_ns: float

    @property
    def ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def fraction(self) -> float:
        return self.roofline_ns / self.ns if self.ns else 1.0


def kernel_costs(exe: Executable, t: Target) -> list[KernelCost]:
    """Each kernel's cost, checked against physics as the whole program's is (a kernel's
    DMAs' HBM reservations lie inside its span: Note [hbm is shared])."""
    sched, _ = schedule(exe, t)
    sizes = {b.name: b.nbytes for b in exe.buffers}
    out = []
    for k in exe.kernels:
        if k.start == k.stop:
            continue
        busy: dict[str, float] = defaultdict(float)
        flops = hbm = 0
        instructions = exe.instructions[k.start : k.stop]
        for i, ins in enumerate(instructions, k.start):
            group = "dma" if is_dma(ins) else ins.engine
            busy[group] += (sched.end[i] - sched.start[i]) * busy_share(ins, t)
            flops += costs.matmul_flops(ins)
            hbm += sum(hbm_bytes(ins))
        io = io_bytes(instructions, sizes, sizes)
        cost = KernelCost(
            name=k.name,
            start_ns=min(sched.start[k.start : k.stop]),
            end_ns=max(sched.end[k.start : k.stop]),
            engine=max(busy, key=busy.__getitem__),
            busy_ns=dict(busy),
            instructions=k.stop - k.start,
            flops=flops,
            hbm_bytes=hbm,
            roofline_ns=max(_compute_ns(instructions, t), io / t.hbm_gbps),
        )
        check_physics(f"kernel {k.name} of {exe.name}", cost.ns, hbm, cost.roofline_ns, t)
        out.append(cost)
    return out


_TRACK_NAMES = {"pe": "TensorE", "act": "ScalarE", "dve": "VectorE", "pool": "GpSimdE"}


def _trace_track(ins: isa.Instr) -> str:
    if isinstance(ins, isa.Matmul) and ins.tile_rows:
        first = ins.stationary.p0
        return f"pe rows {first}-{first + ins.tile_rows - 1}"
    return ins.engine


def trace_events(exe: Executable, t: Target, pid: int = 0) -> dict:
    """The schedule in Chrome trace-event format (Perfetto, chrome://tracing): one track per
    engine and DMA queue, one slice per instruction, times in microseconds; the executable is
    process `pid`, so several can share a file. Row-tiled matmuls, which overlap each other,
    go on a track per row tile ("TensorE rows 64-127")."""
    sched, _ = schedule(exe, t)
    track = [_trace_track(ins) for ins in exe.instructions]
    tracks = sorted(set(track), key=lambda e: (e.split(" ")[0] not in _TRACK_NAMES, len(e), e))
    tid = {name: k for k, name in enumerate(tracks)}
    kernel_of = {}
    for k in exe.kernels:
        for i in range(k.start, k.stop):
            kernel_of[i] = k.name
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{exe.name} on {t.name}"}}
    ]
    for name, k in tid.items():
        engine, _, rows = name.partition(" ")
        label = f"{_TRACK_NAMES[engine]} {rows}".strip() if engine in _TRACK_NAMES else ""
        label = label or f"DMA queue {name}"
        for meta, arg in (
            ("thread_name", {"name": label}),
            ("thread_sort_index", {"sort_index": k}),
        ):
            events.append({"name": meta, "ph": "M", "pid": pid, "tid": k, "args": arg})
    for i, ins in enumerate(exe.instructions):
        events.append(
            {
                "name": ins.opcode,
                "cat": kernel_of.get(i, ""),
                "ph": "X",
                "pid": pid,
                "tid": tid[track[i]],
                "ts": sched.start[i] / 1e3,
                "dur": (sched.end[i] - sched.start[i]) / 1e3,
                "args": {"id": i, "kernel": kernel_of.get(i, ""), "deps": list(ins.deps)},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ns"}
