"""Instruction loops: a kernel's loop built an iteration at a time, its repeating iterations
placed as calls of the blocks built for the first (Note [instruction loops] in blocks.py,
Note [placed iterations] below). ProgramBuilder takes these methods from LoopBuilder; they
read and move its calls, pools and queues."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from neuroncc.codegen.executable.blocks import Call, turn_queue
from neuroncc.errors import CodegenError

if TYPE_CHECKING:
    from neuroncc.codegen.executable.pools import RingPool, TilePool

MAX_PERIOD = 64  # iterations in the longest period a loop looks for
# Iterations a loop needs to be built an iteration at a time. Each iteration is then a call,
# and placing a call costs a lookup per tile its block touches among the kernel's calls, about
# what tracking its instructions costs: shorter loops of small iterations gain too little (a
# 1-layer Llama at seq 2048 spent 8.4 s emitting with loops from 16 iterations on, against
# 6.5 s from 128). A loop whose iterations are large (BIG_ITERATION instructions or more,
# the caller's estimate) gains from a few on: the iterations a loop emits before it places
# are then a small part of a kernel that the loop's own work hardly adds to (a matmul of
# [2048, 4096] by [4096, 12288], forward and backward, 48 steps of about 900 instructions
# each: 4.3 s of compile unlooped, 1.6 s looped, the same device time).
MIN_LOOP = 128
BIG_ITERATION = 64
MIN_BIG_LOOP = 4  # (a period is seen twice before the loop places the next one)
# A loop waits for a period of whole turns of the queues if it emits at most 1/WAIT_FOR_TURNS
# of its iterations to see it (`_later_whole_turns`): Llama's attention merge at 4096 tokens,
# 512 iterations of period 4 dealing 56 queues, 1.08 -> 0.37 s with a period of 8.
WAIT_FOR_TURNS = 16

# Note [placed iterations]: placing a call costs a lookup and a record per region its block
# touches, about one per instruction, where a loop places thousands of calls. A call placed
# a period after its model (the same block), with the queues dealt in whole turns so that
# the period's engines are the same, meets on chip what its model met moved on by the
# period: the same tiles, last touched by the same instructions of the period before, or
# before the loop by an instruction the periods between did not supersede. So its waits on
# chip are the model's moved on, where each lies in the two periods before the model or
# before the loop (otherwise it is looked up in full); its HBM waits, whose addresses
# moved, are looked up. Its last touches on chip are recorded only for the last period
# placed: each period's touch the same tiles the same way and supersede the period
# before's. `emit_graph(..., unrolled=True)` looks every call up in full: the tests
# compare the two executables.

# Note [quiet runs]: most runs of placed iterations touch HBM so that no iteration waits on
# another there: a row kernel's iterations read their rows and write theirs, a matmul's read
# tiles of its operands and store their output tiles. Their HBM touches are affine in the
# iteration, so a run's are known before it is placed: if no write of an iteration overlaps
# a touch of another (checked per pair of touches over the run's periods) and nothing the
# kernel's calls before the run left in HBM conflicts with any of them, no placed call waits
# on anything in HBM, and the run is placed without looking its calls' HBM touches up. Their
# last touches in HBM are what later calls of the kernel look up; they are recorded (in
# order, as the calls would have recorded them) only when a later lookup or record reaches
# the run's bytes, which a kernel's next iterations, on the next rows, mostly do not. The
# tracker then holds what it would have held: a record drops only accesses that it covers
# and that came before it, and nothing recorded between the run and its records reaches the
# run's bytes.


def loop_bufs(least: int, per_period: int) -> int:
    """Buffers for a pool a loop's period takes `per_period` tiles from: at least `least`,
    and where up to twice as many make each period take whole turns of the pool, that many
    (only then do the periods repeat)."""
    for bufs in range(least, 2 * least + 1):
        if per_period % bufs == 0:
            return bufs
    return least


@dataclass(frozen=True)
class _LoopState:
    """What an iteration of a loop met: the caller's state, the open kernel's pools' rotation,
    the on-chip stacks' tops and the queues dealt so far."""

    caller: Hashable
    rotation: tuple[int, ...]
    sbuf: int
    psum: int
    queue: int


@dataclass(frozen=True)
class _Iteration:
    call: Call | None  # None: the iteration emitted nothing
    state: _LoopState
    index: int = -1  # the call's, in the program's calls


@dataclass
class _QuietRun:
    """A run of placed iterations whose HBM touches are not recorded yet (Note [quiet
    runs]): the bytes they touch, merged and sorted, and each call with its first
    instruction."""

    los: list[int]
    his: list[int]
    calls: list[tuple[int, int]] = field(default_factory=list)

    def reaches(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.los, lo) - 1
        if i >= 0 and lo < self.his[i]:
            return True
        return i + 1 < len(self.los) and self.los[i + 1] < hi


@dataclass(frozen=True)
class _Span:
    """An HBM touch of the first period of a run, in bytes of HBM, moved on by `step` a
    period for `n` periods; `model` is its iteration in the period."""

    lo: int
    hi: int
    step: int
    n: int
    model: int
    write: bool

    @property
    def whole(self) -> tuple[int, int]:
        last = (self.n - 1) * self.step
        return min(self.lo, self.lo + last), max(self.hi, self.hi + last)


def _periods_apart(a: _Span, b: _Span) -> range:
    """The period differences d for which `a` overlaps `b` moved on by d periods (the two
    move by the same step)."""
    s = a.step
    if s == 0:
        return range(-(a.n - 1), b.n) if a.lo < b.hi and b.lo < a.hi else range(0)
    if s > 0:  # b.lo + d s < a.hi and a.lo < b.hi + d s
        first, last = (a.lo - b.hi) // s + 1, -((b.lo - a.hi) // s) - 1
    else:
        first, last = (b.lo - a.hi) // -s + 1, -((a.lo - b.hi) // -s) - 1
    return range(max(first, -(a.n - 1)), min(last, b.n - 1) + 1)


def _overlap_apart(a: _Span, b: _Span) -> bool:
    """Whether `a` overlaps `b` in another iteration of the run."""
    if a.step != b.step:  # (conservative: the whole run of each)
        (alo, ahi), (blo, bhi) = a.whole, b.whole
        return alo < bhi and blo < ahi
    return any(d != 0 or a.model != b.model for d in _periods_apart(a, b))


class LoopBuilder:
    """ProgramBuilder's loops."""

    @staticmethod
    def builds_by_iteration(n: int, size: int = 1) -> bool:
        """Whether a loop of n iterations of about `size` instructions each is built an
        iteration at a time (MIN_LOOP, BIG_ITERATION)."""
        return n >= MIN_LOOP or (n >= min(MIN_BIG_LOOP, MIN_LOOP) and size >= BIG_ITERATION)

    def loop(
        self,
        forms: Sequence[Hashable],
        state: Callable[[], Hashable] = tuple,
        size: int = 1,
        max_period: int = MAX_PERIOD,
        partial: bool = False,
    ) -> Iterator[int]:
        """The iterations of a loop of the open kernel that the caller must emit, in order:
        each is a block of its own, and a run of iterations that repeats earlier ones is placed
        as calls of their blocks without being emitted (Note [instruction loops]).

        The caller's promise: iteration i's instructions are fixed by `forms[i]` (what it and
        the neighbours it reaches into look like) and by the state it meets, with HBM
        addresses affine in i over iterations whose forms repeat. `state()` is the state the
        caller carries from one iteration to the next (tiles it holds, choices it made); the
        builder adds its own (its pools' rotation, the queues dealt). The loop looks for
        periods of up to `max_period` iterations. It places whole periods, and with `partial`
        also the iterations of a period's start that the forms repeat after the last whole
        one: the caller then takes the loop up from any iteration, in the state the iteration
        a period before (`loop_period`, the last placed) left, moved on (Note [placed
        iterations])."""
        if self._open is None or self._loop_waits is not None:
            raise CodegenError("a loop runs inside a kernel, and not inside another loop")
        seen: list[_Iteration] = []
        i, n = 0, len(forms)
        if not self.builds_by_iteration(n, size):  # too short to repeat much: one block
            yield from range(n)
            return
        self._close_segment()
        self._loop_waits, self._loop_start = {}, self._emitted
        try:
            while i < n:
                before = self._loop_state(state)
                calls = len(self.calls)
                yield i
                self._close_segment()
                if len(self.calls) > calls + 1:
                    raise CodegenError("a loop's iteration is one block: it may not open kernels")
                if len(self.calls) > calls:
                    seen.append(_Iteration(self.calls[-1], before, len(self.calls) - 1))
                else:
                    seen.append(_Iteration(None, before))
                i += 1
                if not self.unrolled and i < n:
                    now = self._loop_state(state)
                    placed = self._repeat(seen, forms, i, now, max_period, partial)
                    if placed:
                        i += placed
                        self._open_segment()  # at the queue the placed iterations left
        finally:
            self._loop_waits = None

    def _loop_state(self, state: Callable[[], Hashable]) -> _LoopState:
        rotation = tuple(p.state for p in self._turning())
        return _LoopState(state(), rotation, self._sbuf.top, self._psum.top, self._queue)

    def _repeat(
        self,
        seen: list[_Iteration],
        forms: Sequence[Hashable],
        i: int,
        now: _LoopState,
        max_period: int,
        partial: bool,
    ) -> int:
        """Place iterations i, i+1, ... as copies of the period of p iterations that just
        repeated, for as many whole periods as the forms repeat (with `partial`, and as many
        iterations of the next as repeat); how many it placed."""
        for p in range(1, min(max_period, len(seen) // 2) + 1):
            if i + p > len(forms) or forms[i] != forms[i - p]:
                continue
            # the strides come from the two periods before i: they are the caller's affine
            # run only where their forms repeat too (a period of 2 across a transpose's row
            # of blocks took the row's start for a step: offsets out of the buffer)
            if forms[i - 2 * p : i - p] != forms[i - p : i]:
                continue
            step = self._period(seen, p, now)
            if step is None or self._later_whole_turns(p, step[1], len(forms), max_period):
                continue
            count = 0
            while i + count + p <= len(forms) and all(
                forms[x] == forms[x - p] for x in range(i + count, i + count + p)
            ):
                count += p
            while partial and count and i + count < len(forms):
                if forms[i + count] != forms[i + count - p]:
                    break
                count += 1
            if not count:
                continue
            rotation, queues, strides = step
            # Note [placed iterations]: with the queues dealt in whole turns, waits on chip
            # are the model's moved on by the period
            same_queues = queues % self._shared_queues == 0
            quiet = self._quiet_run(seen[-p:], strides, count) if same_queues else None
            deferred: list[int] = []  # calls whose last touches on chip are not recorded yet
            for k in range(count):
                model = seen[-p]
                call, index = model.call, -1
                if call is not None:
                    offsets = tuple(o + s for o, s in zip(call.starts, strides[k % p]))
                    phase = (call.phase + queues) % self._shared_queues
                    waits = self._moved_on(model.index, self._emitted) if same_queues else None
                    if waits is None:  # looked up in full: on what the period before left
                        self._record_deferred(deferred, p)
                    self.place(call.block, call.name, call.args, phase, offsets, True, waits, quiet)
                    call, index = self.calls[-1], len(self.calls) - 1
                    if waits is not None:
                        deferred.append(index)
                was = model.state
                moved = tuple(r + d for r, d in zip(was.rotation, rotation, strict=True))
                state = _LoopState(was.caller, moved, was.sbuf, was.psum, was.queue + queues)
                seen.append(_Iteration(call, state, index))
            self._record_deferred(deferred, p)
            before = seen[-p].state  # the next iteration's, a period back
            for pool, r, d in zip(self._turning(), before.rotation, rotation, strict=True):
                pool.state = r + d
            self._queue = before.queue + queues
            self.loop_period = p
            return count
        return 0

    def _later_whole_turns(self, p: int, queues: int, n: int, max_period: int) -> bool:
        """Whether a period of p iterations that deals `queues` queues, not whole turns of
        them, is better taken as the multiple of it that does: its calls' waits on chip are
        then the model's moved on, and its runs can be quiet (Note [placed iterations], Note
        [quiet runs]). Only in a loop long enough that the iterations emitted to see the
        multiple twice are a small part of it (WAIT_FOR_TURNS): a matmul's 80 steps dealing
        30 queues each waited 16 steps for a period of 8, and emitted twice as long."""
        turns = self._shared_queues // math.gcd(queues, self._shared_queues)
        return turns > 1 and p * turns <= max_period and 2 * p * turns * WAIT_FOR_TURNS <= n

    def _turning(self) -> list[TilePool | RingPool]:
        return [*self._pools, *self._rings]

    def _period(self, seen: list[_Iteration], p: int, now: _LoopState):
        """Whether the last 2p iterations are a period of p repeated: the same blocks on the
        same buffers from the same states, their pools turned by whole rotations; then what a
        period moves (each pool's rotation, the queues dealt) and each iteration's offsets'
        strides."""
        a, b = seen[-2 * p].state, seen[-p].state
        if not len(a.rotation) == len(b.rotation) == len(now.rotation):
            return None  # a pool made inside the loop
        if not (a.caller == b.caller == now.caller and a.sbuf == b.sbuf == now.sbuf):
            return None
        if not a.psum == b.psum == now.psum or now.queue - b.queue != b.queue - a.queue:
            return None
        rotation = []
        turning = self._turning()
        for pool, x, y, z in zip(turning, a.rotation, b.rotation, now.rotation, strict=True):
            moved = z - y
            if moved != y - x or (moved % pool.period if pool.period else moved):
                return None
            rotation.append(z - y)
        queues = now.queue - b.queue
        strides = []
        for first, second in zip(seen[-2 * p : -p], seen[-p:], strict=True):
            c1, c2 = first.call, second.call
            if c1 is None or c2 is None:
                if c1 is not c2:
                    return None
                strides.append(())
                continue
            if (c1.block, c1.args) != (c2.block, c2.args):
                return None
            if (c2.phase - c1.phase - queues) % self._shared_queues:
                return None
            strides.append(tuple(y - x for x, y in zip(c1.starts, c2.starts, strict=True)))
        return tuple(rotation), queues, strides

    def _quiet_run(
        self, models: Sequence[_Iteration], strides: Sequence[tuple[int, ...]], count: int
    ) -> _QuietRun | None:
        """The run of `count` iterations about to be placed, the k-th a call like
        models[k % p]'s moved on by k // p + 1 periods, if it is quiet in HBM (Note [quiet
        runs]); then it is pending. The queues are dealt in whole turns, so each touch is on
        its model's engine."""
        if self._unrecorded is not None:  # the call before the run: its last touches first
            self._record_exits(*self._unrecorded)
            self._unrecorded = None
        p, spans = len(models), []
        for j, model in enumerate(models):
            call, n = model.call, len(range(j, count, p))
            if call is None or not n:
                continue
            for touch in self.blocks[call.block].footprint[0]:
                if touch.mem != "hbm":
                    continue
                buf = self.buffers[call.args[touch.param]]
                size, stride = buf.dtype.itemsize, strides[j][touch.param]
                at = buf.offset + (call.offset(touch.param) + stride) * size
                span = _Span(at + touch.box[2], at + touch.box[3], stride * size, n, j, touch.write)
                lo, hi = span.whole
                if lo < buf.offset or hi > buf.offset + buf.nbytes:
                    return None  # (the calls placed one by one say where)
                self._settle(lo, hi)
                latest: dict[str, int] = {}
                engine = turn_queue(touch.engine, call.phase, self._shared_queues)
                self._inner.conflicts("hbm", (0, 1, lo, hi), touch.write, engine, latest)
                if latest:
                    return None
                spans.append(span)
        writes = [s for s in spans if s.write]
        if any(_overlap_apart(w, s) for w in writes for s in spans):
            return None
        los, his = [], []
        for lo, hi in sorted(s.whole for s in spans):
            if los and lo <= his[-1]:
                his[-1] = max(his[-1], hi)
            else:
                los.append(lo)
                his.append(hi)
        run = _QuietRun(los, his)
        self._pending.append(run)
        return run

    def _settle(self, lo: int, hi: int) -> None:
        """Record the last touches in HBM of the pending quiet runs that reach [lo, hi)
        (Note [quiet runs])."""
        for run in [r for r in self._pending if r.reaches(lo, hi)]:
            self._pending.remove(run)
            for k, base in run.calls:
                self._record_exits(k, base, on_chip=False, hbm=True)

    def _record_deferred(self, deferred: list[int], p: int) -> None:
        """Record the last touches on chip of the last period's calls among `deferred` (the
        periods before are superseded by it: Note [placed iterations]), and forget them."""
        for k in deferred:
            if k >= len(self.calls) - p:  # (an iteration is one call or none)
                self._record_exits(k, self._loop_waits[k][0], on_chip=True)
        deferred.clear()

    def _moved_on(self, like: int, base: int) -> dict[int, dict[str, int]] | None:
        """The waits on chip of call `like` moved on to a call at `base` a period later, if
        each lies before the loop or within the two periods before the model (Note [placed
        iterations]); None otherwise."""
        before, waits = self._loop_waits[like]
        shift, start = base - before, self._loop_start
        window = before - shift  # the model's period before
        moved = {}
        for j, latest in waits.items():
            out = {}
            for e, i in latest.items():
                if start <= i < window:
                    return None
                out[e] = i + shift if i >= start else i
            moved[j] = out
        return moved
