"""The scheduler: when each instruction of an executable starts and ends.

- Compute engines (pe, act, dve, pool) execute their streams in order. An instruction starts when
  its engine is free and every instruction it waits on (`deps`) has finished; its duration comes
  from codegen/hardware/costs.py, plus a pipeline drain when it reads what the previous instruction
  on its engine wrote. TensorE runs throttled after an idle spell on targets that throttle
  (targets.py). Its row-tiled matmuls (`Matmul.tile_rows`) occupy only their rows of the array: one
  on another row tile starts beside it, though still not before the instruction ahead of it in the
  stream has started.
- A DMA is issued on a queue (q0..q15); each queue runs in order. Its descriptors fan out over
  the DMA engines, which all queues share: on each engine its share goes into the earliest idle
  gap, so an independent transfer on another queue is never stuck behind a waiting one. The
  DMA ends when its last share does, and not before HBM has moved its bytes (Note [hbm is
  shared] in timing.py).

Note [timing by call]: the scheduler walks the executable call by call (Note [blocks and calls]),
never the unrolled stream. What a block costs instruction by instruction (durations, DMA
shares, lanes, drains inside it) is worked out once per block (`_Plan`). How a call's
instructions fall depends only on its block and on the state it meets: the free times of the
tracks it uses, TensorE's issue point, lanes and warm-up, the previous writer on each engine it
drains behind, the busy intervals of the DMA engines (taken from the next engine the call
deals to, as they are interchangeable) and of HBM that end after its DMAs can start, and when
its waits across kernels are met. Every time there is taken relative to the call's origin (the
earliest time any of its instructions can start) and clipped at the floor below which it
cannot matter. A call meeting the state an earlier call of its block met (to 1 ps) is placed by
shifting that call's schedule and replaying its effect on the state, without looking at its
instructions; the layers of a model past the first few meet one steady state. Equal states
give equal schedules, so the memo changes no time by more than the picoseconds of the key's
rounding (`schedule(memo=False)` times every call afresh; the tests hold the two together).
A kernel meeting a state met before is placed whole the same way (Note [timing by kernel]).
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from neuroncc.codegen.executable.blocks import Block, turn_queue
from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target

KEY_NS = 3  # decimal places of ns a memo key keeps: 1 ps


@dataclass(frozen=True)
class Schedule:
    """Per instruction of the unrolled stream: start and end in ns, and the track it ran on
    (engine or DMA queue). Without `detail` (schedule's), only the ends."""

    start: np.ndarray | None
    end: np.ndarray
    track: list[str] | None


class _Timeline:
    """Busy intervals of one resource (a DMA engine, HBM), kept sorted and merged; `place`
    finds the earliest idle gap at or after a time that fits a duration. Kept as arrays of
    doubles (8 bytes a time, where a list of floats takes 32): they grow with every DMA of
    the stream (3.5 million intervals for a 6-layer Qwen3-8B-sized backward at 1024 tokens)
    and were most of a 36-layer estimate's memory."""

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")

    def place(self, t0: float, dur: float) -> float:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, t0)
        t = t0
        while i < len(starts) and starts[i] < t + dur:
            t = max(t, ends[i])
            i += 1
        end = t + dur
        if i > 0 and ends[i - 1] >= t:  # touches the interval before: extend it
            ends[i - 1] = end
            i -= 1
        else:
            starts.insert(i, t)
            ends.insert(i, end)
        if i + 1 < len(starts) and starts[i + 1] <= end:  # touches the next one: merge
            ends[i] = max(end, ends[i + 1])
            del starts[i + 1], ends[i + 1]
        return t

    def tail(self, floor: float, origin: float) -> np.ndarray:
        """The intervals that end after `floor`, clipped to start at it, relative to origin:
        all that a placement at or after floor can meet. An array of (start, end) rows: the
        memos keep a tail per kernel and call they remember, and a kernel's holds all of its
        DMAs (kept as tuples of floats, the tails held hundreds of megabytes)."""
        i = bisect.bisect_right(self.ends, floor)
        out = np.empty((len(self.starts) - i, 2))
        out[:, 0], out[:, 1] = np.frombuffer(self.starts[i:]), np.frombuffer(self.ends[i:])
        np.maximum(out[:, 0], floor, out=out[:, 0])
        out -= origin
        return out

    def replace_tail(self, floor: float, origin: float, tail) -> None:
        """Make the part after `floor` the given tail (relative to origin)."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, floor)
        if i < len(starts) and starts[i] < floor:  # straddles floor: keep its head
            ends[i] = floor
            i += 1
        del starts[i:], ends[i:]
        for s, e in (tail + origin).tolist():
            if ends and ends[-1] >= s:
                ends[-1] = max(ends[-1], e)
            else:
                starts.append(s)
                ends.append(e)


def _key_tail(tail: np.ndarray) -> bytes:
    """A tail as a memo key holds it: to the key's picoseconds (+ 0.0: no -0.0)."""
    return (np.round(tail, KEY_NS) + 0.0).tobytes()


class _Scheduler:
    def __init__(self, t: Target) -> None:
        self.t = t
        self.free_at: dict[str, float] = defaultdict(float)
        self.pe_lane_free = [0.0] * (t.pe_rows // LANE_ROWS)
        self.pe_issued = 0.0
        self.dma_engines = [_Timeline() for _ in range(t.dma_engines)]
        self.hbm = _Timeline()  # Note [hbm is shared]
        self.next_engine = 0
        self.pe_warm_ns = 0.0
        self.throttled_ns = 0.0
        self.dma_engine_ns = 0.0
        self.busy: dict[str, float] = defaultdict(float)  # per track: ns x busy_share
        self.last_writes: dict[str, tuple] = {}  # compute engine -> its last writes
        self.calls_replayed = 0  # calls placed from the memo (Note [timing by call])
        self.kernels_replayed = 0  # kernels placed whole (Note [timing by kernel])
        self.plans: dict[int, _Plan] = {}  # per block called

    def compute(self, track: str, dur: float, ready: float) -> tuple[float, float]:
        start = max(self.free_at[track], ready)
        self.free_at[track] = start + dur
        return start, start + dur

    def tensor(self, lanes: range, dur: float, share: float, ready: float):
        """TensorE: in order of issue, each instruction on its lanes of the array."""
        start = max(ready, self.pe_issued, *(self.pe_lane_free[k] for k in lanes))
        dur = self._throttle(start, dur, share)
        for k in lanes:
            self.pe_lane_free[k] = start + dur
        self.pe_issued = start
        self.free_at["pe"] = max(self.free_at["pe"], start + dur)
        return start, start + dur

    def _throttle(self, start: float, dur: float, share: float) -> float:
        """TensorE warm-up: rate ramps from pe_throttle_start to 1 over the ramp's busy time
        (a row tile's time counts at its share of the array); an idle gap of half the window
        (utilisation below 50%) brings the limit back. The warm time saturates at the ramp
        (past it the rate is 1), which keeps it a finite state (Note [timing by call])."""
        t = self.t
        if t.pe_throttle_start >= 1.0:
            return dur
        if start - self.free_at["pe"] > t.pe_throttle_ramp_ns / 2:
            self.pe_warm_ns = 0.0
        warm = min(1.0, self.pe_warm_ns / t.pe_throttle_ramp_ns)
        rate = t.pe_throttle_start + (1.0 - t.pe_throttle_start) * warm
        slowed = dur / rate
        self.pe_warm_ns = min(self.pe_warm_ns + slowed * share, t.pe_throttle_ramp_ns)
        self.throttled_ns += (slowed - dur) * share
        return slowed

    def dma(self, queue: str, shares: tuple[float, ...], hbm_ns: float, ready: float):
        """A DMA on `queue` whose descriptors take `shares` ns on successive DMA engines."""
        t0 = max(self.free_at[queue], ready)
        if not shares:
            return t0, t0
        engines = self.dma_engines
        start, end = float("inf"), t0
        for k, dur in enumerate(shares):
            s = engines[(self.next_engine + k) % len(engines)].place(t0, dur)
            start, end = min(start, s), max(end, s + dur)
            self.dma_engine_ns += dur
        self.next_engine = (self.next_engine + len(shares)) % len(engines)
        if hbm_ns > 0:
            end = max(end, self.hbm.place(start, hbm_ns) + hbm_ns)
        self.free_at[queue] = end
        return start, end


LANE_ROWS = 32  # the smallest row tile (NC-v3 on): TensorE's rows as the timing tracks them


def pe_lanes(ins: isa.Instr, t: Target) -> range:
    """The 32-row lanes of the array a TensorE instruction occupies: its row tile's, else all."""
    if not isinstance(ins, isa.Matmul) or not ins.tile_rows:
        return range(t.pe_rows // LANE_ROWS)
    first = ins.stationary.p0 // LANE_ROWS
    return range(first, first + ins.tile_rows // LANE_ROWS)


def busy_share(ins: isa.Instr, t: Target) -> float:
    """The part of its engine an instruction keeps busy: a row-tiled matmul its rows' share of
    the array (so TensorE's busy time never exceeds the time it ran), anything else all."""
    return len(pe_lanes(ins, t)) * LANE_ROWS / t.pe_rows if ins.engine == "pe" else 1.0


def reads_any(ins: isa.Instr, written: tuple) -> bool:
    """Does ins read on-chip memory that one of `written` (tiles) covers?"""
    for r in ins.reads():
        if not isinstance(r, isa.TileRef):
            continue
        for w in written:
            if (
                isinstance(w, isa.TileRef)
                and w.mem == r.mem
                and r.p0 < w.p0 + w.np
                and w.p0 < r.p0 + r.np
                and r.offset < w.offset + w.free_bytes
                and w.offset < r.offset + r.free_bytes
            ):
                return True
    return False


def is_dma(ins: isa.Instr) -> bool:
    return isinstance(ins, (isa.Dma, isa.DmaGather, isa.DmaScatter))


def hbm_refs(ins: isa.Instr) -> list[tuple[isa.DramRef, int, bool]]:
    """(access pattern, bytes moved, is a write) for each HBM operand of an instruction.
    Indirect DMAs move only the rows they name, not their whole table. Only DMAs reach HBM."""
    if not is_dma(ins):
        return []
    out = [(r, r.nbytes, False) for r in ins.reads() if isinstance(r, isa.DramRef)]
    out += [(w, w.nbytes, True) for w in ins.writes() if isinstance(w, isa.DramRef)]
    if isinstance(ins, isa.DmaGather):
        out = [(ins.table, ins.dst.numel * ins.dst.dtype.itemsize, False)]
    elif isinstance(ins, isa.DmaScatter):
        rows = ins.src.numel * ins.src.dtype.itemsize
        out = [(ins.table, rows, True)] + ([(ins.table, rows, False)] * (ins.combine != "set"))
    return out


def hbm_bytes(ins: isa.Instr) -> tuple[int, int]:
    """(bytes read, bytes written) of HBM by one instruction."""
    refs = hbm_refs(ins)
    return sum(n for _, n, w in refs if not w), sum(n for _, n, w in refs if w)


# -- a block's costs, worked out once ------------------------------------------------------------

COMPUTE, TENSOR, DMA = 0, 1, 2


@dataclass(frozen=True)
class _Step:
    """One instruction of a block as the scheduler needs it."""

    kind: int
    engine: str  # as the block names it (a call turns its queues)
    deps: tuple[int, ...]  # local
    dur: float  # compute: ns, with the drain when the previous instruction on its engine is
    # in the block and wrote what it reads; TensorE: ns before throttling
    lanes: range
    share: float
    shares: tuple[float, ...]  # DMA: ns on each DMA engine it deals to
    hbm_ns: float
    least_ns: float  # it takes at least this long, whatever the state it meets


class _Plan:
    """A block's instructions as steps (Note [timing by call])."""

    def __init__(self, block: Block, t: Target) -> None:
        self.steps: list[_Step] = []
        self.hbm_read = self.hbm_write = self.dma_payload = 0  # over the block
        # compute engine -> (its first instruction, the drain it pays if the engine's
        # previous instruction, before the block, wrote what it reads)
        self.entry_drains: dict[str, tuple[int, float]] = {}
        self.instructions = block.instructions
        last_on: dict[str, int] = {}  # compute engine -> its last instruction so far
        for j, ins in enumerate(block.instructions):
            self.steps.append(self._step(ins, t, last_on, j))
            if not is_dma(ins):
                last_on[ins.engine] = j
        self.exit_writes = {e: block.instructions[j].writes() for e, j in last_on.items()}
        self.engines = tuple(dict.fromkeys(s.engine for s in self.steps))
        self.slot = [self.engines.index(s.engine) for s in self.steps]  # per step
        self.dma_slots = [k for k, e in enumerate(self.engines) if e[0] == "q"]
        self.uses_pe = any(s.kind == TENSOR for s in self.steps)
        self.uses_dma = any(s.kind == DMA for s in self.steps)
        self._tracks: dict[int, tuple[tuple[str, ...], list[str]]] = {}

    def _step(self, ins: isa.Instr, t: Target, last_on: dict, j: int) -> _Step:
        if is_dma(ins):
            work = costs.dma_work(ins, t)
            engines = min(t.dma_engines, work.descriptors)
            shares = ()
            if engines:
                base, extra = divmod(work.descriptors, engines)
                shares = tuple(work.engine_ns(base + (k < extra), t) for k in range(engines))
            read, write = hbm_bytes(ins)
            self.hbm_read, self.hbm_write = self.hbm_read + read, self.hbm_write + write
            self.dma_payload += work.payload
            hbm_ns = (read + write) / t.hbm_gbps
            least = max(hbm_ns, min(shares, default=0.0))
            return _Step(DMA, ins.engine, ins.deps, 0.0, range(0), 1.0, shares, hbm_ns, least)
        dur = costs.instr_ns(ins, t)
        if ins.engine == "pe":
            lanes, share = pe_lanes(ins, t), busy_share(ins, t)
            return _Step(TENSOR, "pe", ins.deps, dur, lanes, share, (), 0.0, dur)
        drain = t.dependent_drain_cycles / costs.engine_ghz(ins.engine, t)
        previous = last_on.get(ins.engine)
        if previous is None:
            self.entry_drains[ins.engine] = (j, drain)
        elif reads_any(ins, self.instructions[previous].writes()):
            dur += drain
        return _Step(COMPUTE, ins.engine, ins.deps, dur, range(0), 1.0, (), 0.0, dur)

    def tracks(self, phase: int, shared: int) -> tuple[tuple[str, ...], list[str]]:
        """The tracks the block's engines run on in a call of this phase, and each step's."""
        out = self._tracks.get(phase)
        if out is None:
            tracks = tuple(turn_queue(e, phase, shared) for e in self.engines)
            out = self._tracks[phase] = (tracks, [tracks[k] for k in self.slot])
        return out


# -- calls, one after another --------------------------------------------------------------------


@dataclass
class _Effect:
    """What timing one call did, relative to its origin: replayed on a memo hit."""

    start: np.ndarray
    end: np.ndarray
    free_at: tuple[float, ...]  # per engine of the block (plan.engines)
    pe: tuple[float, ...]  # issued, lanes (relative); warm-up (absolute)
    # per DMA engine from the call's first, then HBM: tails after dma_floor
    dma_tails: tuple[np.ndarray, ...]
    dealt: int  # DMA engine shares dealt
    busy: tuple[float, ...]  # per engine of the block
    throttled_ns: float
    dma_engine_ns: float


def schedule(
    exe: Executable, t: Target, memo: bool = True, detail: bool = True
) -> tuple[Schedule, _Scheduler]:
    """The schedule of exe's unrolled stream, timed kernel by kernel where a kernel meets a
    state met before (Note [timing by kernel]), else call by call (Note [timing by call]).
    `detail=False` keeps only the ends, which waits across kernels and the total need; the
    starts and tracks, for timelines, are two more values per instruction of the stream."""
    sizes = [len(b.instructions) for b in exe.blocks]
    n = sum(sizes[c.block] for c in exe.calls)
    start, end = np.zeros(n) if detail else None, np.zeros(n)
    state = _Scheduler(t)
    effects: dict[tuple, _Effect] = {}
    kernels = _KernelMemo(exe, state)
    track: list[str] | None = [] if detail else None
    base = 0
    for k0, k1 in _kernel_spans(exe.calls):
        visit = kernels.visit(k0, k1, base, end) if memo else None
        if visit is not None and visit.effect is not None:
            base = visit.apply(state, start, end, track)
            continue
        at = base
        for call in exe.calls[k0:k1]:
            base = _place_call(exe, state, call, base, start, end, effects if memo else None)
            if track is not None:
                track += state.plans[call.block].tracks(call.phase, exe.shared_queues)[1]
        if visit is not None:
            starts = start[at:base] if start is not None else None
            tracks = track[len(track) - (base - at) :] if track is not None else None
            visit.record(state, starts, end[at:base], tracks)
    return Schedule(start, end, track), state


def _place_call(exe, state: _Scheduler, call, base: int, start, end, effects) -> int:
    """Time one call at `base` of the stream, from the memo `effects` where its entry state
    was met before (None: afresh); the stream position after it."""
    t, plans = state.t, state.plans
    plan = plans.get(call.block)
    if plan is None:
        plan = plans[call.block] = _Plan(exe.blocks[call.block], t)
    tracks = plan.tracks(call.phase, exe.shared_queues)[0]
    waits = {j: float(end[list(ids)].max()) + t.semaphore_ns for j, ids in call.waits}
    entry = _Entry(state, plan, tracks, waits)
    effect = effects.get((call.block, entry.key)) if effects is not None else None
    stop = base + len(plan.steps)
    if effect is None:
        effect, starts, end[base:stop] = _time_call(state, plan, tracks, entry, t)
        if start is not None:
            start[base:stop] = starts
        if effects is not None:
            effects[call.block, entry.key] = effect
    else:
        _apply(state, plan, tracks, entry, effect)
        state.calls_replayed += 1
        if start is not None:
            start[base:stop] = effect.start + entry.origin
        end[base:stop] = effect.end + entry.origin
    return stop


class _Entry:
    """The state a call meets, as the memo key that stands for it (Note [timing by call]).

    Times are taken relative to the call's origin and reduced to what can still matter:
    a pass over the block finds, per instruction, a lower bound of its start (its engine's
    floor, its waits' readiness, its dependencies' lower bounds plus their least duration).
    An engine's free time is raised to the bound of its first instruction (it starts no
    earlier), a wait met before its instruction could start anyway is left out, TensorE's
    issue point and lanes are raised likewise; the earliest of the engines' bounds is the
    origin. States equal in this form schedule the call alike, shifted."""

    def __init__(self, state: _Scheduler, plan: _Plan, tracks, waits: dict[int, float]):
        self.waits = waits
        free = [state.free_at[tr] for tr in tracks]
        floors = list(free)  # per engine: no instruction on it starts earlier
        pe_slot = plan.engines.index("pe") if plan.uses_pe else -1
        if plan.uses_pe:
            floors[pe_slot] = max(state.pe_issued, min(state.pe_lane_free))
        first, live = _bounds(plan, floors, waits, state.t.semaphore_ns)
        self.origin = o = min(first, default=0.0)
        rel = [round(x - o, KEY_NS) for x in first]
        pe: tuple = ()
        if plan.uses_pe:
            pe = self._tensor(state, first[pe_slot], o)
            rel[pe_slot] = pe[0]
        self.drains = {
            e: reads_any(plan.instructions[j], state.last_writes.get(e, ()))
            for e, (j, _) in plan.entry_drains.items()
        }
        tails: tuple = ()
        self.dma_floor = 0.0
        self.first_engine = state.next_engine
        if plan.uses_dma:
            self.dma_floor = f = min(first[k] for k in plan.dma_slots)
            tails = tuple(_key_tail(tl.tail(f, o)) for tl in _dealt(state, state.next_engine))
        live_key = tuple((j, round(w - o, KEY_NS)) for j, w in live)
        self.key = (tuple(rel), pe, live_key, tuple(self.drains.values()), tails)

    @staticmethod
    def _tensor(state: _Scheduler, first: float, o: float) -> tuple:
        """TensorE's state as the key holds it: its free time, issue point and lanes raised
        to its first instruction's bound, and the warm-up. Where the array throttles, its
        free time says whether the first instruction finds it cooled down: kept as it is,
        unless the bound alone shows the idle gap (the warm-up is then 0 either way)."""
        t = state.t
        free, warm = state.free_at["pe"], round(state.pe_warm_ns, KEY_NS)
        if t.pe_throttle_start >= 1.0 or first - free > t.pe_throttle_ramp_ns / 2:
            free, warm = max(free, first), 0.0 if t.pe_throttle_start < 1.0 else warm
        lanes = (round(max(lane, first) - o, KEY_NS) for lane in state.pe_lane_free)
        return (round(free - o, KEY_NS), round(first - o, KEY_NS), *lanes, warm)


def _bounds(plan: _Plan, floors: list[float], waits: dict[int, float], sem: float):
    """Per engine of the block, a lower bound of its first instruction's start; and the
    waits that can move an instruction's start (the rest are met before it could start)."""
    n = len(plan.steps)
    first: list[float | None] = [None] * len(floors)
    track = list(floors)  # per engine: a lower bound of when its next instruction can start
    end = [0.0] * n
    live = []
    for j, s in enumerate(plan.steps):
        k = plan.slot[j]
        start = max(track[k], max((end[d] for d in s.deps), default=-sem) + sem)
        w = waits.get(j)
        if w is not None and w > start:
            live.append((j, w))
            start = w
        end[j] = start + s.least_ns
        if s.kind == DMA and not s.shares:  # moves nothing: its queue is not held
            continue
        if first[k] is None:
            first[k] = start
        track[k] = start if s.kind == TENSOR else end[j]
    return [f if f is not None else floors[k] for k, f in enumerate(first)], live


def _dealt(state: _Scheduler, first: int) -> list[_Timeline]:
    """The DMA engines in the order they are dealt to from engine `first` on, then HBM."""
    e = state.dma_engines
    return [*e[first:], *e[:first], state.hbm]


def _time_call(state: _Scheduler, plan: _Plan, tracks, entry: _Entry, t: Target):
    """Time a call's instructions on the state, one by one: what it did (relative to its
    origin), and its instructions' starts and ends."""
    n = len(plan.steps)
    start, end = np.zeros(n), np.zeros(n)
    busy = [0.0] * len(tracks)
    throttled, dma_ns, dealt = state.throttled_ns, state.dma_engine_ns, 0
    drain = {j: d for e, (j, d) in plan.entry_drains.items() if entry.drains[e]}
    sem = t.semaphore_ns
    ends = end.tolist()  # list indexing is faster than numpy's, one element at a time
    for j, s in enumerate(plan.steps):
        ready = max((ends[d] for d in s.deps), default=-sem) + sem
        ready = max(ready, entry.waits.get(j, 0.0))
        track = tracks[plan.slot[j]]
        if s.kind == DMA:
            b, e = state.dma(track, s.shares, s.hbm_ns, ready)
            dealt += len(s.shares)
        elif s.kind == TENSOR:
            b, e = state.tensor(s.lanes, s.dur, s.share, ready)
        else:
            b, e = state.compute(track, s.dur + drain.get(j, 0.0), ready)
        start[j] = b
        ends[j] = e
        busy[plan.slot[j]] += (e - b) * s.share
    state.last_writes.update(plan.exit_writes)
    for k, tr in enumerate(tracks):
        state.busy[tr] += busy[k]
    o = entry.origin
    end = np.array(ends)
    pe = ()
    if plan.uses_pe:
        pe = (state.pe_issued - o, *(x - o for x in state.pe_lane_free), state.pe_warm_ns)
    effect = _Effect(
        start=start - o,
        end=end - o,
        free_at=tuple(state.free_at[tr] - o for tr in tracks),
        pe=pe,
        dma_tails=tuple(tl.tail(entry.dma_floor, o) for tl in _dealt(state, entry.first_engine))
        if plan.uses_dma
        else (),
        dealt=dealt,
        busy=tuple(busy),
        throttled_ns=state.throttled_ns - throttled,
        dma_engine_ns=state.dma_engine_ns - dma_ns,
    )
    return effect, start, end


def _apply(state: _Scheduler, plan: _Plan, tracks, entry: _Entry, effect: _Effect) -> None:
    """Replay a memoised call's effect on the state, shifted to this call's origin."""
    o = entry.origin
    for k, tr in enumerate(tracks):
        state.free_at[tr] = effect.free_at[k] + o
        state.busy[tr] += effect.busy[k]
    if plan.uses_pe:
        lanes = len(state.pe_lane_free)
        state.pe_issued = effect.pe[0] + o
        state.pe_lane_free = [x + o for x in effect.pe[1 : 1 + lanes]]
        state.pe_warm_ns = effect.pe[-1]
    if plan.uses_dma:
        timelines = _dealt(state, entry.first_engine)
        for tl, tail in zip(timelines, effect.dma_tails, strict=True):
            tl.replace_tail(entry.dma_floor, o, tail)
        state.next_engine = (entry.first_engine + effect.dealt) % len(state.dma_engines)
    state.last_writes.update(plan.exit_writes)
    state.throttled_ns += effect.throttled_ns
    state.dma_engine_ns += effect.dma_engine_ns


# -- kernels, replayed whole ---------------------------------------------------------------------


def _kernel_spans(calls) -> list[tuple[int, int]]:
    """[first, stop) call indexes of each kernel: a call and the calls that continue it."""
    spans, first = [], 0
    for k in range(1, len(calls) + 1):
        if k == len(calls) or not calls[k].more:
            spans.append((first, k))
            first = k
    return spans


@dataclass
class _KernelShape:
    """What timing a kernel depends on besides the state it meets, worked out once per shape:
    the tracks it runs on, its compute engines (whose drains it may pay on entry), and its
    instructions up to the last track's first, as the pass that bounds the kernel's floor
    walks them (Note [timing by kernel]): (track, the steps it waits for, the wait on earlier
    kernels it has (-1: none), its least duration, whether it is TensorE's, whether it holds
    its track)."""

    tracks: tuple[str, ...]
    engines: tuple[str, ...]
    prefix: tuple[tuple[int, tuple[int, ...], int, float, bool, bool], ...]
    uses_pe: bool
    uses_dma: bool

    def floor(self, floors: list[float], waits: list[float], sem: float) -> float:
        """A lower bound of every start in the kernel: the least of its tracks' first
        instructions' bounds, from the tracks' floors and the waits' readiness."""
        bound, first = list(floors), [None] * len(floors)
        ends: list[float] = []
        for k, deps, wait, least, tensor, holds in self.prefix:
            start = bound[k]
            for d in deps:
                start = max(start, ends[d] + sem)
            if wait >= 0 and waits[wait] > start:
                start = waits[wait]
            ends.append(start + least)
            if first[k] is None:
                first[k] = start
            if holds:
                bound[k] = start if tensor else start + least
        return min(first)  # type: ignore[type-var]


@dataclass
class _KernelEffect:
    """What timing a kernel did, relative to its floor: replayed on a memo hit."""

    start: np.ndarray | None  # (None: timed without detail, as are the next)
    end: np.ndarray
    track: list[str] | None  # per instruction, with the kernel's first queue at `phase`
    phase: int
    free_at: tuple[float | None, ...]  # per track of the shape (None: left as it was)
    pe: tuple[float, ...]  # issued, lanes (relative); warm-up (absolute)
    # per DMA engine from the kernel's first, then HBM: tails after the floor
    dma_tails: tuple[np.ndarray, ...]
    dealt: int
    busy: tuple[float, ...]  # per track of the shape
    last_writes: tuple[tuple[str, tuple], ...]
    throttled_ns: float
    dma_engine_ns: float
    calls: int


class _KernelMemo:
    """Note [timing by kernel]: a kernel (a call and the calls continuing it: a loop's
    iterations) that meets a state an earlier kernel of its shape met is placed whole, by
    shifting that kernel's schedule and replaying its effect, without visiting its calls. A
    shape is the kernel's calls' blocks, queue phases and waits among themselves, and which
    of its instructions wait on earlier kernels. The state is taken relative to the kernel's
    floor F, a lower bound of every start in it: the least, over its tracks, of a bound of the
    track's first instruction (the track's free time, and what its dependencies and waits
    imply, as a max-plus form worked out once per shape, up to the last track's first
    instruction). Below F nothing matters, so values under it are raised to it: the tracks'
    free times, the waits on earlier kernels, TensorE's issue point (its lanes to that point,
    its free time to where an idle gap is sure), the DMA engines' and HBM's busy intervals
    (only their tails after F). With those, the compute engines' last writes (which drains
    the kernel pays) and the DMA engine dealt to first, the state decides the kernel's
    schedule up to the shift: equal keys give equal schedules, to the key's picoseconds as
    the call memo does. The layers of a model past the first few then cost a lookup per
    kernel, where the call memo still computed every call's entry (a pass over its block)."""

    def __init__(self, exe: Executable, state: _Scheduler) -> None:
        self.exe, self.state = exe, state
        self.ids: dict[tuple, int] = {}  # shape -> its id
        self.shapes: dict[int, _KernelShape] = {}  # id -> summary
        self.effects: dict[tuple, _KernelEffect] = {}

    def visit(self, k0: int, k1: int, base: int, end: np.ndarray) -> _KernelVisit:
        """The kernel of calls [k0, k1) at stream position `base`: its memo key, and its
        effect if one was recorded."""
        calls, shared = self.exe.calls[k0:k1], self.exe.shared_queues
        phase = calls[0].phase  # the shape's queues count from the kernel's first
        shape, cross = [], []  # cross: (kernel instruction, earlier instructions it waits on)
        at = 0
        for call in calls:
            waits = []
            for j, ids in call.waits:
                inner = tuple(i - base for i in ids if i >= base)
                outer = tuple(i for i in ids if i < base)
                if outer:
                    cross.append((at + j, outer))
                waits.append((j, inner, bool(outer)))
            shape.append((call.block, (call.phase - phase) % shared, tuple(waits)))
            at += len(self.exe.blocks[call.block].instructions)
        sid = self.ids.setdefault(tuple(shape), len(self.ids))
        summary = self.shapes.get(sid)
        if summary is None:
            summary = self.shapes[sid] = self._summarise(calls, base)
        tracks = tuple(turn_queue(tr, phase, shared) for tr in summary.tracks)
        return _KernelVisit(self, sid, summary, tracks, phase, cross, end, base, k1 - k0)

    def _summarise(self, calls, base: int) -> _KernelShape:
        shared = self.exe.shared_queues
        plans = [self._plan(call.block) for call in calls]
        phases = [(c.phase - calls[0].phase) % shared for c in calls]  # as the shape has them
        tracks = tuple(
            dict.fromkeys(tr for c, p in zip(phases, plans) for tr in p.tracks(c, shared)[1])
        )
        index = {tr: k for k, tr in enumerate(tracks)}
        met, prefix, waits = set(), [], 0
        for call, plan, phase in zip(calls, plans, phases):
            step_tracks = plan.tracks(phase, shared)[1]
            at, local = len(prefix), dict(call.waits)
            for j, s in enumerate(plan.steps):
                deps = tuple(at + d for d in s.deps)
                wait = -1
                if j in local:
                    deps += tuple(i - base for i in local[j] if i >= base)
                    if any(i < base for i in local[j]):
                        wait, waits = waits, waits + 1
                k = index[step_tracks[j]]
                holds = s.kind != DMA or bool(s.shares)  # one that moves nothing does not
                prefix.append((k, deps, wait, s.least_ns, s.kind == TENSOR, holds))
                met.add(k)
            if len(met) == len(tracks):
                break
        engines = tuple(dict.fromkeys(e for p in plans for e in p.exit_writes))
        return _KernelShape(
            tracks,
            engines,
            tuple(prefix),
            any(p.uses_pe for p in plans),
            any(p.uses_dma for p in plans),
        )

    def _plan(self, block: int) -> _Plan:
        plans = self.state.plans
        if block not in plans:
            plans[block] = _Plan(self.exe.blocks[block], self.state.t)
        return plans[block]


class _KernelVisit:
    """One kernel met in the stream: its floor, its memo key, the effect recorded for it."""

    def __init__(
        self,
        memo: _KernelMemo,
        sid: int,
        shape: _KernelShape,
        tracks,
        phase,
        cross,
        end,
        base,
        calls,
    ):
        """`tracks`: the shape's, turned by the kernel's first queue (at `phase`)."""
        self.memo, self.shape, self.tracks, self.phase = memo, shape, tracks, phase
        self.base, self.calls = base, calls
        state, t = memo.state, memo.state.t
        sem = t.semaphore_ns
        pe_floor = max(state.pe_issued, min(state.pe_lane_free))
        floors = [pe_floor if tr == "pe" else state.free_at[tr] for tr in tracks]
        ready = [float(end[list(ids)].max()) + sem for _, ids in cross]
        self.floor = f = shape.floor(floors, ready, sem)
        free = tuple(round(max(state.free_at[tr], f) - f, KEY_NS) for tr in tracks if tr != "pe")
        pe: tuple = ()
        if shape.uses_pe:
            issued = max(state.pe_issued, f)
            idle = issued - t.pe_throttle_ramp_ns / 2 - 1.0  # a free time before it: idle
            pe = (
                round(issued - f, KEY_NS),
                *(round(max(lane, issued) - f, KEY_NS) for lane in state.pe_lane_free),
                round(max(state.free_at["pe"], idle) - f, KEY_NS),
                round(state.pe_warm_ns, KEY_NS),
            )
        waits = tuple(round(max(w, f) - f, KEY_NS) for w in ready)
        drains = tuple(id(state.last_writes.get(e)) for e in shape.engines)
        tails: tuple = ()
        self.first_engine = state.next_engine
        if shape.uses_dma:
            tails = tuple(_key_tail(tl.tail(f, f)) for tl in _dealt(state, state.next_engine))
        self.key = (sid, free, pe, waits, drains, tails)
        self.effect = memo.effects.get(self.key)
        if self.effect is None:  # what the kernel's timing is measured against
            self.busy = tuple(state.busy[tr] for tr in tracks)
            self.free = tuple(state.free_at[tr] for tr in tracks)
            self.throttled_ns, self.dma_engine_ns = state.throttled_ns, state.dma_engine_ns

    def record(self, state: _Scheduler, start, end, track: list[str] | None) -> None:
        """The kernel was timed call by call: remember what it did."""
        f, shape = self.floor, self.shape
        pe: tuple = ()
        if shape.uses_pe:
            issued = state.pe_issued
            pe = (issued - f, *(max(x, issued) - f for x in state.pe_lane_free), state.pe_warm_ns)
        tails = ()
        if shape.uses_dma:
            tails = tuple(tl.tail(f, f) for tl in _dealt(state, self.first_engine))
        self.memo.effects[self.key] = _KernelEffect(
            start=start - f if start is not None else None,
            end=end - f,
            track=track,
            phase=self.phase,
            free_at=tuple(
                None if state.free_at[tr] == was else state.free_at[tr] - f
                for tr, was in zip(self.tracks, self.free, strict=True)
            ),
            pe=pe,
            dma_tails=tails,
            dealt=(state.next_engine - self.first_engine) % len(state.dma_engines),
            busy=tuple(state.busy[tr] - b for tr, b in zip(self.tracks, self.busy, strict=True)),
            last_writes=tuple((e, state.last_writes[e]) for e in shape.engines),
            throttled_ns=state.throttled_ns - self.throttled_ns,
            dma_engine_ns=state.dma_engine_ns - self.dma_engine_ns,
            calls=self.calls,
        )

    def apply(self, state: _Scheduler, start, end, track: list[str] | None) -> int:
        """Place the kernel from its recorded effect; the stream position after it."""
        e, f, shape = self.effect, self.floor, self.shape
        assert e is not None
        for tr, free, busy in zip(self.tracks, e.free_at, e.busy, strict=True):
            if free is not None:
                state.free_at[tr] = free + f
            state.busy[tr] += busy
        if shape.uses_pe:
            lanes = len(state.pe_lane_free)
            state.pe_issued = e.pe[0] + f
            state.pe_lane_free = [x + f for x in e.pe[1 : 1 + lanes]]
            state.pe_warm_ns = e.pe[-1]
        if shape.uses_dma:
            for tl, tail in zip(_dealt(state, self.first_engine), e.dma_tails, strict=True):
                tl.replace_tail(f, f, tail)
            state.next_engine = (self.first_engine + e.dealt) % len(state.dma_engines)
        state.last_writes.update(e.last_writes)
        state.throttled_ns += e.throttled_ns
        state.dma_engine_ns += e.dma_engine_ns
        state.calls_replayed += e.calls
        state.kernels_replayed += 1
        stop = self.base + len(e.end)
        end[self.base : stop] = e.end + f
        if start is None:  # timed without detail (then no effect has starts or tracks)
            return stop
        start[self.base : stop] = e.start + f
        if e.phase == self.phase:
            track += e.track
        else:  # the same queues, turned on
            shared = self.memo.exe.shared_queues
            turn = (self.phase - e.phase) % shared
            names = {name: turn_queue(name, turn, shared) for name in set(e.track)}
            track += [names[name] for name in e.track]
        return stop
