"""ProgramBuilder: writes NeuronCore instruction streams, in the spirit of NKI.

The compiler's emitters use it, and so can a person writing a tile program by hand: declare HBM
tensors, open a kernel, take SBUF/PSUM tiles from rotating pools, issue instructions. Each
kernel becomes a block, shared by identical kernels, and a call of it (Note [blocks and calls]
in blocks.py).

Invariants it maintains:
- in the unrolled stream, every instruction's waits cover every read-after-write,
  write-after-read and write-after-write hazard with an earlier instruction on another engine:
  inside a kernel by its `deps` (Note [dependencies]), across kernels by its call's waits (Note
  [kernel boundaries]);
- SBUF/PSUM tiles are 64-byte aligned regions inside the target's capacity; tiles of a kernel are
  freed when the kernel closes, so later kernels reuse the space (the boundary waits order the
  reuse);
- HBM buffers fit the target's HBM and overlap only inside the plan pass's arena, where the
  pass gave values with disjoint lifetimes the same bytes; dependencies are tracked by byte
  address, so reusing bytes orders the new writer after the old value's readers.

Note [dependencies]: the tracker keeps, per memory (SBUF, PSUM, HBM), the accesses not yet
superseded, each with a conservative bounding box (partitions x bytes, or a span of HBM byte
addresses). A new access waits on every overlapping earlier access where either side writes.
Because engines execute in order, waiting on the latest such instruction of each engine implies
the earlier ones, so deps keep one id per engine. An access that a later write covers entirely is
dropped: anything overlapping it later overlaps the write too and is ordered through it. Likewise
a read covered by a later read on the same engine: engines run in order.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen.executable.blocks import (
    Block,
    Call,
    Touch,
    parametrise,
    turn_queue,
    with_fields,
)
from neuroncc.codegen.executable.intervals import IntervalIndex
from neuroncc.codegen.executable.program import Buffer, Executable, ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import CapacityError, CodegenError
from neuroncc.ir.types import DType

ALIGN = 64

Box = tuple[int, int, int, int]  # p0, p1, b0, b1 (HBM: 0, 1, byte lo, byte hi)


def region(ref: isa.Operand, buffers: dict[str, Buffer]) -> tuple[str, Box]:
    """The memory an operand touches and its bounding box there; HBM by byte address, since
    temporaries the plan pass placed share addresses."""
    if isinstance(ref, isa.TileRef):
        return ref.mem, (ref.p0, ref.p0 + ref.np, ref.offset, ref.offset + ref.free_bytes)
    lo, hi = ref.span()
    base, size = buffers[ref.buffer].offset, ref.dtype.itemsize
    return "hbm", (0, 1, base + lo * size, base + hi * size)


def overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def covers(a: Box, b: Box) -> bool:
    return a[0] <= b[0] and b[1] <= a[1] and a[2] <= b[2] and b[3] <= a[3]


@dataclass
class _Access:
    instr: int
    engine: str
    box: Box
    write: bool


class DepTracker:
    def __init__(self, buffers: dict[str, Buffer]) -> None:
        self._buffers = buffers  # the builder's HBM buffers, by name
        self._live: dict[str, IntervalIndex[_Access]] = {}

    def add(self, ins_id: int, ins: isa.Instr) -> tuple[int, ...]:
        """The latest instruction of each other engine that ins must wait for (one id per
        engine, Note [dependencies]); then ins is recorded as instruction ins_id."""
        accesses = [(*region(ref, self._buffers), write) for ref, write in _accesses(ins)]
        latest: dict[str, int] = {}
        for mem, box, write in accesses:
            self.conflicts(mem, box, write, ins.engine, latest)
        for mem, box, write in accesses:
            self.record_access(ins_id, ins.engine, mem, box, write)
        return tuple(sorted(latest.values()))

    def conflicts(self, mem: str, box: Box, write: bool, engine: str, latest: dict) -> None:
        """Into `latest` (engine -> instruction): the latest access of each other engine that
        an access of `box` by `engine` must wait for."""
        live = self._live.get(mem)
        if live is None:
            return
        for acc in live.overlapping(box[2], box[3]):
            if (write or acc.write) and acc.engine != engine and overlaps(box, acc.box):
                latest[acc.engine] = max(latest.get(acc.engine, -1), acc.instr)

    def record_access(
        self, ins_id: int, engine: str, mem: str, box: Box, write: bool, before: int | None = None
    ) -> None:
        """Record an access; accesses it supersedes are dropped (Note [dependencies]), of
        those with ids below `before` only if given: a call's last touches are not ordered
        among themselves (Note [kernel boundaries])."""
        live = self._live.setdefault(mem, IntervalIndex())
        limit = ins_id if before is None else before
        if write:
            live.remove_where(
                box[2], box[3], lambda a, box=box: a.instr < limit and covers(box, a.box)
            )
        else:  # a later read by the same engine orders everything the earlier one did
            live.remove_where(
                box[2],
                box[3],
                lambda a, box=box, e=engine: (
                    a.instr < limit and not a.write and a.engine == e and covers(box, a.box)
                ),
            )
        live.add(box[2], box[3], _Access(ins_id, engine, box, write))


def _accesses(ins: isa.Instr) -> list[tuple[isa.Operand, bool]]:
    return [(r, False) for r in ins.reads()] + [(w, True) for w in ins.writes()]


def _needed(block: Block, waits: dict[int, dict[str, int]]) -> tuple:
    """A call's waits (local instruction -> the latest instruction of each other engine it
    must wait for), less those an earlier instruction on its engine already waits for: the
    engine runs in order, so they are met (a TensorE instruction starts after the one before
    it started, which was after the wait)."""
    waited: dict[str, dict[str, int]] = {}  # local engine -> other engine -> latest waited
    out = []
    for j in sorted(waits):
        done = waited.setdefault(block.instructions[j].engine, {})
        ids = []
        for engine, i in waits[j].items():
            if i > done.get(engine, -1):
                done[engine] = i
                ids.append(i)
        if ids:
            out.append((j, tuple(sorted(ids))))
    return tuple(out)


MAX_PERIOD = 64  # iterations in the longest period a loop looks for
# Iterations a loop needs to be built an iteration at a time. Each iteration is then a call,
# and placing a call costs a lookup per tile its block touches, about what tracking its
# instructions costs: shorter loops gain too little, and a kernel replayed from a template
# (Note [kernel reuse]) places every one of its calls again (a 16-layer Llama at seq 512 took
# 37 s to compile with loops from 16 iterations on, against 22 s without).
MIN_LOOP = 128


@dataclass(frozen=True)
class Part:
    """A call of a kernel made of several (a loop's iterations): its block, buffers, offsets
    and the queue it started at, counted from the kernel's first."""

    block: int
    args: tuple[str, ...]
    offsets: tuple[int, ...]
    queue: int


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


class OnChipOverflow(CodegenError):
    """A kernel's tiles do not fit SBUF or PSUM (beside what the program set aside)."""


class _Stack:
    """A per-partition bump allocator whose allocations are released in LIFO order, growing
    up from byte 0 or down from the capacity (`down`): `ProgramBuilder.kernel` alternates, so
    two neighbouring kernels that fit side by side use disjoint bytes, and the next kernel's
    first loads need not wait for the last one's tiles to be read (Note [kernel placement])."""

    def __init__(self, mem: str, capacity: int, align: int) -> None:
        self.mem, self.capacity, self.align = mem, capacity, align
        self.top = 0  # bytes in use, from the growing end
        self.high_water = 0
        self.down = False

    def alloc(self, nbytes: int) -> int:
        used = -(-self.top // self.align) * self.align
        need = used + -(-nbytes // self.align) * self.align if self.down else used + nbytes
        if need > self.capacity:
            raise OnChipOverflow(
                f"{self.mem.upper()} overflow: needs {need} bytes per partition, "
                f"the target has {self.capacity}"
            )
        self.top = need
        self.high_water = max(self.high_water, need)
        return self.capacity - need if self.down else used


class TilePool:
    """`bufs` rotating slots of one size: successive tiles alternate, so a load into slot i+1
    can overlap compute on slot i (double/triple buffering). Dependencies order the reuse."""

    def __init__(self, mem: str, base: int, slot_bytes: int, bufs: int) -> None:
        self.mem, self.base, self.slot_bytes, self.bufs = mem, base, slot_bytes, bufs
        self.state = 0  # tiles handed out
        self.period = bufs  # a loop's period may turn it by whole rotations only

    def tile(self, np_: int, free: Sequence[int], dtype: DType) -> isa.TileRef:
        t = isa.TileRef(self.mem, 0, np_, 0, dtype, tuple(free))
        if t.free_bytes > self.slot_bytes or np_ > 128:
            raise CodegenError(f"tile {t} does not fit a {self.slot_bytes}-byte slot")
        slot = self.state % self.bufs
        self.state += 1
        return replace(t, offset=self.base + slot * self.slot_bytes)


class RingPool:
    """Tiles of any size placed one after another in `nbytes` from `base`, wrapping to the
    start when the next does not fit: a byte ring, where a new tile waits (by dependencies)
    only for the readers of the bytes it takes, however small the tiles before it were."""

    def __init__(self, mem: str, base: int, nbytes: int) -> None:
        self.mem, self.base, self.nbytes = mem, base, nbytes
        self.position = 0  # where the next tile goes, in bytes from base
        self.period = 0  # a loop's period may not move it (Note [instruction loops])

    @property
    def state(self) -> int:
        return self.position

    @state.setter
    def state(self, value: int) -> None:
        self.position = value

    def tile(self, np_: int, free: Sequence[int], dtype: DType) -> isa.TileRef:
        t = isa.TileRef(self.mem, 0, np_, 0, dtype, tuple(free))
        size = -(-t.free_bytes // ALIGN) * ALIGN
        if size > self.nbytes or np_ > 128:
            raise CodegenError(f"tile {t} does not fit a {self.nbytes}-byte ring")
        if self.position + size > self.nbytes:
            self.position = 0
        offset, self.position = self.base + self.position, self.position + size
        return replace(t, offset=offset)


class ProgramBuilder:
    def __init__(self, target: Target, name: str = "main") -> None:
        self.target, self.name = target, name
        self.blocks: list[Block] = []
        self.calls: list[Call] = []
        self._block_index: dict[Block, int] = {}  # an identical kernel's block is shared
        self.buffers: dict[str, Buffer] = {}
        self._hbm_top = 0
        self._arena: tuple[int, int] | None = None  # (offset, bytes) of the plan's arena
        self._boundary = DepTracker(self.buffers)  # the calls' touches: Note [kernel boundaries]
        self._emitted = 0  # instructions placed by calls
        self._open: str | None = None  # the open kernel's name
        self._local: list[isa.Instr] = []  # ... and its instructions so far
        self._tracker = DepTracker(self.buffers)  # ... and their accesses
        self._phase = 0  # ... and the queue turn it started at
        self._sbuf = _Stack("sbuf", target.sbuf_partition_bytes, ALIGN)
        self._psum = _Stack("psum", target.psum_partition_bytes, target.psum_bank_bytes)
        self._down = False  # the next kernel's allocation direction (Note [kernel placement])
        self._queue = 0
        self._shared_queues = target.dma_queues  # the rest are set aside (reserve_queues)
        self._kernel_calls = 0  # calls before the open kernel's first
        self._pools: list[TilePool] = []  # the open kernel's
        self._loop_waits: dict[int, tuple[int, dict]] | None = None  # Note [placed iterations]
        self._loop_start = 0  # the running loop's first instruction
        self._bases: list[int] = []  # per call: its first instruction's id
        self._rings: list[RingPool] = []  # the program's
        self.unrolled = False  # loops emit every iteration (what a compact loop must equal)

    # -- HBM -------------------------------------------------------------------------------
    def dram(
        self,
        name: str,
        shape: Sequence[int],
        dtype: DType,
        kind: str = "temp",
        at: int | None = None,
    ) -> Buffer:
        """An HBM buffer: after the others, or at byte `at` of the arena (`arena`)."""
        if name in self.buffers:
            raise CodegenError(f"HBM buffer {name!r} declared twice")
        if at is None:
            offset = self._reserve(name, math.prod(shape) * dtype.itemsize)
        else:
            offset = self._in_arena(name, at, math.prod(shape) * dtype.itemsize)
        buf = Buffer(name, kind, offset, dtype, tuple(shape))
        self.buffers[name] = buf
        return buf

    def arena(self, nbytes: int, detail: str = "") -> None:
        """Reserve the region where the plan pass placed the temporaries (Note [hbm plan] in
        passes/plan.py): buffers declared `at` an offset share it where lifetimes allow."""
        if self._arena is not None:
            raise CodegenError("the HBM arena is reserved once")
        self._arena = (self._reserve("the temporaries' arena", nbytes, detail), nbytes)

    def _reserve(self, what: str, nbytes: int, detail: str = "") -> int:
        offset = -(-self._hbm_top // ALIGN) * ALIGN
        self._hbm_top = offset + nbytes
        if self._hbm_top > self.target.hbm_bytes:
            raise CapacityError(
                f"tensors do not fit in HBM: {self._hbm_top / 2**30:.2f} GiB needed "
                f"({what}: {nbytes / 2**30:.2f} GiB{detail}), "
                f"{self.target.name} has {self.target.hbm_bytes / 2**30:.0f} GiB per NeuronCore"
            )
        return offset

    def _in_arena(self, name: str, at: int, nbytes: int) -> int:
        base, size = self._arena or (0, 0)
        if at % ALIGN or at + nbytes > size:
            raise CodegenError(
                f"HBM buffer {name!r} at arena byte {at} ({nbytes} bytes) does not fit the "
                f"{size}-byte arena at {ALIGN}-byte alignment"
            )
        return base + at

    # -- on-chip memory ----------------------------------------------------------------------
    def sbuf_pool(self, slot_bytes: int, bufs: int = 2) -> TilePool:
        slot = -(-slot_bytes // ALIGN) * ALIGN
        return self.carve("sbuf", self._sbuf.alloc(slot * bufs), slot, bufs)

    def carve(self, mem: str, base: int, slot_bytes: int, bufs: int) -> TilePool:
        """A pool of `bufs` slots at `base`, in bytes already allocated (a bank shared by
        smaller tiles): a loop counts its rotation in its state."""
        pool = TilePool(mem, base, slot_bytes, bufs)
        self._pools.append(pool)
        return pool

    def ring(self, nbytes: int) -> RingPool:
        """A RingPool of nbytes per partition set aside at the top of SBUF for the whole
        program (reserve_sbuf); loops count its position in their state."""
        pool = RingPool("sbuf", self.reserve_sbuf(nbytes), nbytes)
        self._rings.append(pool)
        return pool

    def reserve_sbuf(self, nbytes: int) -> int:
        """nbytes per partition at the top of SBUF, set aside for the whole program (before
        any kernel allocates): their first byte."""
        if self._sbuf.high_water:
            raise CodegenError("SBUF is set aside before the first kernel allocates")
        self._sbuf.capacity -= -(-nbytes // ALIGN) * ALIGN
        if self._sbuf.capacity < 0:
            raise OnChipOverflow(f"cannot set aside {nbytes} bytes of each SBUF partition")
        return self._sbuf.capacity

    def psum_pool(self, bufs: int = 2) -> TilePool:
        bank = self.target.psum_bank_bytes
        return self.carve("psum", self._psum.alloc(bank * bufs), bank, bufs)

    @contextlib.contextmanager
    def kernel(self, name: str) -> Iterator[None]:
        """Open a kernel: what is emitted until it closes is one block (Note [blocks and
        calls]), with waits local to it, or one per iteration of its loops (`loop`).

        Note [kernel placement]: each kernel allocates SBUF and PSUM from the other end than
        the kernel before it. Tiles are freed when their kernel closes, and the boundary waits
        order a reuse of bytes after their last access; where the two kernels fit side by side
        no byte is reused, and the new kernel's loads run while the old one finishes."""
        self._close_kernel()
        sbuf_top, psum_top = self._sbuf.top, self._psum.top
        self._sbuf.down = self._psum.down = self._down
        self._open_kernel(name)
        try:
            yield
        finally:
            self._sbuf.top, self._psum.top = sbuf_top, psum_top
        if self._local or len(self.calls) > self._kernel_calls:  # an empty kernel takes no bytes
            self._down = not self._down
        self._close_kernel()

    def _open_kernel(self, name: str) -> None:
        self._open = name
        self._kernel_calls = len(self.calls)
        self._pools = []
        self._open_segment()

    def _open_segment(self) -> None:
        self._local = []
        self._tracker = DepTracker(self.buffers)
        self._phase = self._queue % self._shared_queues

    def _close_segment(self) -> None:
        """The open kernel's instructions so far as a block (shared with an identical one
        built before) placed by a call; the kernel stays open."""
        if self._local:
            block, args, offsets = parametrise(self._open, self._local)
            index = self._block_index.setdefault(block, len(self.blocks))
            if index == len(self.blocks):
                self.blocks.append(block)
            more = len(self.calls) > self._kernel_calls
            self.place(index, self._open, args, self._phase, offsets, more)
        self._open_segment()

    def _close_kernel(self) -> None:
        if self._open is None:
            return
        self._close_segment()
        self._open = None

    def replay_kernel(self, name: str, parts: Sequence[Part], queues: int) -> None:
        """A kernel identical to one built before, placed without building it (Note [kernel
        reuse] in kernels/reuse.py): a call of each of its blocks with its buffers and
        offsets, and the program's state moved on as building it would have (the queues it
        dealt, the end its tiles came from)."""
        self._close_kernel()
        start = self._queue
        for k, part in enumerate(parts):
            phase = (start + part.queue) % self._shared_queues
            self.place(part.block, name, part.args, phase, part.offsets, k > 0)
        self._queue = start + queues
        if parts:
            self._down = not self._down

    def parts_since(self, calls: int, queue: int) -> list[Part] | None:
        """The calls placed since the program had `calls` of them, as a kernel's parts (the
        queue each started at counted from `queue`, the queue count the kernel started at);
        None if they are not one kernel's."""
        placed = self.calls[calls:]
        if any(c.more != (k > 0) for k, c in enumerate(placed)):
            return None
        shared = self._shared_queues
        return [Part(c.block, c.args, c.offsets, (c.phase - queue) % shared) for c in placed]

    # -- loops ------------------------------------------------------------------------------
    def loop(
        self, forms: Sequence[Hashable], state: Callable[[], Hashable] = tuple
    ) -> Iterator[int]:
        """The iterations of a loop of the open kernel that the caller must emit, in order:
        each is a block of its own, and a run of iterations that repeats earlier ones is placed
        as calls of their blocks without being emitted (Note [instruction loops]).

        The caller's promise: iteration i's instructions are fixed by `forms[i]` (what it and
        the neighbours it reaches into look like) and by the state it meets, with HBM
        addresses affine in i over iterations whose forms repeat. `state()` is the state the
        caller carries from one iteration to the next (tiles it holds, choices it made); the
        builder adds its own (its pools' rotation, the queues dealt)."""
        if self._open is None or self._loop_waits is not None:
            raise CodegenError("a loop runs inside a kernel, and not inside another loop")
        seen: list[_Iteration] = []
        i, n = 0, len(forms)
        if n < MIN_LOOP:  # too short to repeat much: one block with the rest of the kernel
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
                    placed = self._repeat(seen, forms, i, self._loop_state(state))
                    if placed:
                        i += placed
                        self._open_segment()  # at the queue the placed iterations left
        finally:
            self._loop_waits = None

    def _loop_state(self, state: Callable[[], Hashable]) -> _LoopState:
        rotation = tuple(p.state for p in self._turning())
        return _LoopState(state(), rotation, self._sbuf.top, self._psum.top, self._queue)

    def _repeat(self, seen: list[_Iteration], forms: Sequence[Hashable], i: int, now) -> int:
        """Place iterations i, i+1, ... as copies of the period of p iterations that just
        repeated, for as many whole periods as the forms repeat; how many it placed."""
        for p in range(1, min(MAX_PERIOD, len(seen) // 2) + 1):
            if i + p > len(forms) or forms[i] != forms[i - p]:
                continue
            step = self._period(seen, p, now)
            if step is None:
                continue
            count = 0
            while i + count + p <= len(forms) and all(
                forms[x] == forms[x - p] for x in range(i + count, i + count + p)
            ):
                count += p
            if not count:
                continue
            rotation, queues, strides = step
            # Note [placed iterations]: with the queues dealt in whole turns, waits on chip
            # are the model's moved on by the period
            same_queues = queues % self._shared_queues == 0
            deferred: list[int] = []  # calls whose last touches on chip are not recorded yet
            for k in range(count):
                model = seen[-p]
                call, index = model.call, -1
                if call is not None:
                    offsets = tuple(
                        o + s for o, s in zip(call.offsets or (0,) * len(call.args), strides[k % p])
                    )
                    phase = (call.phase + queues) % self._shared_queues
                    waits = self._moved_on(model.index, self._emitted) if same_queues else None
                    if waits is None:  # looked up in full: on what the period before left
                        self._record_deferred(deferred, p)
                    self.place(call.block, call.name, call.args, phase, offsets, True, waits)
                    call, index = self.calls[-1], len(self.calls) - 1
                    if waits is not None:
                        deferred.append(index)
                was = model.state
                moved = tuple(r + d for r, d in zip(was.rotation, rotation, strict=True))
                state = _LoopState(was.caller, moved, was.sbuf, was.psum, was.queue + queues)
                seen.append(_Iteration(call, state, index))
            self._record_deferred(deferred, p)
            for pool, d in zip(self._turning(), rotation, strict=True):
                pool.state += d * (count // p)
            self._queue += queues * (count // p)
            return count
        return 0

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
            o1, o2 = c1.offsets or (0,) * len(c1.args), c2.offsets or (0,) * len(c2.args)
            strides.append(tuple(y - x for x, y in zip(o1, o2, strict=True)))
        return tuple(rotation), queues, strides

    @property
    def direction(self) -> bool:
        """The end of SBUF and PSUM the next kernel allocates from (Note [kernel placement])."""
        return self._down

    @property
    def queue_count(self) -> int:
        """DMA queues dealt out so far."""
        return self._queue

    def place(
        self,
        index: int,
        name: str,
        args: tuple[str, ...],
        phase: int,
        offsets: tuple[int, ...] = (),
        more: bool = False,
        on_chip: dict[int, dict[str, int]] | None = None,
    ) -> None:
        """A call of block `index`: its waits across kernels from its footprint (Note [kernel
        boundaries]), then its last touches are what later calls wait for. `on_chip`: its
        waits on chip, known (Note [placed iterations]); its last touches on chip are then
        left for the caller to record."""
        block = self.blocks[index]
        base = self._emitted
        call = Call(name, index, args, phase, (), offsets if any(offsets) else (), more)
        known = on_chip is not None
        on_chip = on_chip if known else {}
        hbm: dict[int, dict[str, int]] = {}
        for touch in block.footprint[0]:
            if known and touch.mem != "hbm":
                continue
            mem, box, engine = self._absolute(touch, call)
            latest = (hbm if mem == "hbm" else on_chip).setdefault(touch.instr, {})
            self._boundary.conflicts(mem, box, touch.write, engine, latest)
        self.calls.append(call)
        self._bases.append(base)
        self._emitted += len(block.instructions)
        self._record_exits(len(self.calls) - 1, on_chip=not known, hbm=True)
        waits = {j: dict(latest) for j, latest in on_chip.items() if latest}
        for j, latest in hbm.items():
            merged = waits.setdefault(j, {})
            for e, i in latest.items():
                merged[e] = max(merged.get(e, -1), i)
        self.calls[-1] = with_fields(call, {"waits": _needed(block, waits)})
        if self._loop_waits is not None:
            self._loop_waits[len(self.calls) - 1] = (base, on_chip)

    def _record_deferred(self, deferred: list[int], p: int) -> None:
        """Record the last touches on chip of the last period's calls among `deferred` (the
        periods before are superseded by it: Note [placed iterations]), and forget them."""
        for k in deferred:
            if k >= len(self.calls) - p:  # (an iteration is one call or none)
                self._record_exits(k, on_chip=True)
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
    def _record_exits(self, k: int, on_chip: bool, hbm: bool = False) -> None:
        """Call k's last touches (on chip, in HBM or both): what later calls wait for."""
        call, base = self.calls[k], self._bases[k]
        for touch in self.blocks[call.block].footprint[1]:
            if on_chip if touch.mem != "hbm" else hbm:
                mem, box, engine = self._absolute(touch, call)
                self._boundary.record_access(
                    base + touch.instr, engine, mem, box, touch.write, base
                )

    def _absolute(self, touch: Touch, call: Call) -> tuple[str, Box, str]:
        engine = turn_queue(touch.engine, call.phase, self._shared_queues)
        if touch.mem != "hbm":
            return touch.mem, touch.box, engine
        buf = self.buffers[call.args[touch.param]]
        base = buf.offset + call.offset(touch.param) * buf.dtype.itemsize
        return "hbm", (0, 1, base + touch.box[2], base + touch.box[3]), engine

    # -- instructions ------------------------------------------------------------------------
    def reserve_queues(self, n: int) -> tuple[str, ...]:
        """The last n DMA queues, for the caller's transfers alone: the others take the rest
        in turn, so no transfer of theirs queues ahead of the caller's."""
        if self.calls or self._local:
            raise CodegenError("DMA queues are set aside before the first instruction")
        self._shared_queues = self.target.dma_queues - n
        return tuple(isa.dma_queue(q) for q in range(self._shared_queues, self.target.dma_queues))

    def next_queue(self) -> str:
        """The next shared queue in turn, as the open block names it (Note [blocks and
        calls]: a call turns the block's queues by the phase the program was at)."""
        q = isa.dma_queue((self._queue % self._shared_queues - self._phase) % self._shared_queues)
        self._queue += 1
        return q

    def _local_queue(self, queue: str) -> str:
        """A queue the caller named, as the open block names it."""
        q = int(queue[1:])
        if q >= self._shared_queues:
            return queue
        return isa.dma_queue((q - self._phase) % self._shared_queues)

    def emit(self, ins: isa.Instr) -> int:
        """Append an instruction to the open kernel (a kernel named after the program opens
        if none is); its id in the program's unrolled stream."""
        if self._open is None:
            self._open_kernel(self.name)
        local = len(self._local)
        ins = with_fields(ins, {"deps": self._tracker.add(local, ins)})
        self._local.append(ins)
        return self._emitted + local

    def dma(self, dst: isa.Operand, src: isa.Operand, queue: str | None = None) -> int:
        if dst.numel != src.numel:
            raise CodegenError(f"dma copies {src.numel} elements into {dst.numel}: {src} -> {dst}")
        if self._open is None:
            self._open_kernel(self.name)
        q = self._local_queue(queue) if queue else self.next_queue()
        return self.emit(isa.Dma(q, dst=dst, src=src))

    def finish(self, inputs: Sequence[ValueLoc], outputs: Sequence[ValueLoc]) -> Executable:
        self._close_kernel()
        return Executable(
            name=self.name,
            target=self.target.name,
            hbm_bytes=self._hbm_top,
            buffers=tuple(self.buffers.values()),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            blocks=tuple(self.blocks),
            calls=tuple(self.calls),
            shared_queues=self._shared_queues,
        )

    @property
    def sbuf_high_water(self) -> int:
        return self._sbuf.high_water
