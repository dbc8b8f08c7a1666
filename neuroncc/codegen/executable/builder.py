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

The dependency tracker is tracker.py (Note [dependencies]).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from neuroncc.codegen.executable.blocks import (
    Block,
    Call,
    Footprint,
    Touch,
    kernel_footprint,
    needed_waits,
    parametrise,
    turn_queue,
    with_fields,
)
from neuroncc.codegen.executable.loops import LoopBuilder, _QuietRun
from neuroncc.codegen.executable.pools import ALIGN, RingPool, TilePool
from neuroncc.codegen.executable.program import Buffer, Executable, ValueLoc
from neuroncc.codegen.executable.tracker import Box, DepTracker
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import CapacityError, CodegenError
from neuroncc.ir.types import DType

Waits = tuple[tuple[int, tuple[tuple[str, int], ...]], ...]


@dataclass(frozen=True)
class Part:
    """A call of a kernel made of several (a loop's iterations): its block, buffers, offsets,
    the queue it started at and its waits on the kernel's calls before it (local instruction
    -> (engine, instruction)), counted from the kernel's first queue and instruction."""

    block: int
    args: tuple[str, ...]
    offsets: tuple[int, ...]
    queue: int
    inner: Waits


@dataclass(frozen=True)
class Move:
    """An allocation of `nbytes` at `start` of a partition of `mem`, which from the other end
    of the memory is at `to` (Note [mirrored kernels] in kernels/reuse.py)."""

    mem: str
    start: int
    nbytes: int
    to: int


@dataclass(frozen=True)
class Allocations:
    """What a kernel allocated on chip: from which end, the tops it started at, and the bytes
    each allocation asked for, per memory."""

    down: bool
    sbuf: tuple[int, tuple[int, ...]]
    psum: tuple[int, tuple[int, ...]]


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
        self.log: list[int] = []  # the open kernel's allocations, in bytes asked for

    def alloc(self, nbytes: int) -> int:
        self.log.append(nbytes)
        return self._alloc(nbytes)

    def mirrored(self, top: int, down: bool, log: Sequence[int]) -> list[Move] | None:
        """Each allocation of `log` (bytes asked for) made from `top` towards `down`, and where
        the same allocations from the other end put it; None where they would not fit."""
        here = _Stack(self.mem, self.capacity, self.align)
        there = _Stack(self.mem, self.capacity, self.align)
        here.top = there.top = top
        here.down, there.down = down, not down
        try:
            return [Move(self.mem, here._alloc(n), n, there._alloc(n)) for n in log]
        except OnChipOverflow:
            return None

    def _alloc(self, nbytes: int) -> int:
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


class ProgramBuilder(LoopBuilder):
    def __init__(self, target: Target, name: str = "main", fit_hbm: bool = True) -> None:
        """fit_hbm=False lays out buffers past the target's HBM (an estimate's: Note [estimates
        past the core's HBM] in program.py); otherwise the first is a CapacityError."""
        self.target, self.name, self.fit_hbm = target, name, fit_hbm
        self.blocks: list[Block] = []
        self.calls: list[Call] = []
        self._block_index: dict[Block, int] = {}  # an identical kernel's block is shared
        self.buffers: dict[str, Buffer] = {}
        self._hbm_top = 0
        self._arena: tuple[int, int] | None = None  # (offset, bytes) of the plan's arena
        self._boundary = DepTracker(self.buffers)  # the kernels' touches: Note [kernel boundaries]
        self._needed_cache: dict[tuple[int, Waits], tuple] = {}  # (`_needed_within`)
        self._emitted = 0  # instructions placed by calls
        self._open: str | None = None  # the open kernel's name
        self._kernel_base = 0  # ... its first instruction
        self._kernel_queue = 0  # ... the queues dealt before it
        self._inner = DepTracker(self.buffers)  # ... its calls' last touches
        self._inner_waits: list[Waits] = []  # ... each call's waits on the calls before it
        self._unrecorded: tuple[int, int, bool, bool] | None = None  # ... a call not in _inner
        self._pending: list[_QuietRun] = []  # ... quiet runs not in it yet (Note [quiet runs])
        self.footprint: Footprint | None = None  # the last kernel closed's
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
        self.loop_period = 0  # iterations in the period a loop placed last
        self._rings: list[RingPool] = []  # the program's
        self._opened_at = (0, 0)  # the SBUF and PSUM tops the last kernel opened at
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
        if self.fit_hbm and self._hbm_top > self.target.hbm_bytes:
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

    def next_kernel(self) -> None:
        """Close the open kernel and open another of its name, on the tiles allocated so far:
        what is emitted next waits on what came before through the kernel boundary (Note
        [kernel boundaries]). A kernel split so is not a template (kernels/reuse.py)."""
        name = self._open
        if name is None:
            raise CodegenError("next_kernel: no kernel is open")
        self._close_kernel()
        self._open_kernel(name)

    def _open_kernel(self, name: str) -> None:
        self._open = name
        self._start_kernel()
        self._opened_at = (self._sbuf.top, self._psum.top)
        self._sbuf.log, self._psum.log = [], []
        self._pools = []
        self._open_segment()

    def _start_kernel(self) -> None:
        """The next calls are a kernel's: they wait on each other through `_inner`, and on
        earlier kernels from the kernel's footprint when it closes (`_place_kernel`)."""
        self._kernel_calls = len(self.calls)
        self._kernel_base, self._kernel_queue = self._emitted, self._queue
        self._inner, self._inner_waits, self._unrecorded = DepTracker(self.buffers), [], None
        self._pending = []

    def _open_segment(self) -> None:
        self._local = []
        self._tracker = DepTracker(self.buffers)
        self._phase = self._queue % self._shared_queues

    def _close_segment(self) -> None:
        """The open kernel's instructions so far as a block (shared with an identical one
        built before) placed by a call; the kernel stays open."""
        if self._local:
            block, args, offsets = parametrise(self._open, self._local)
            index = self.add_block(block)
            more = len(self.calls) > self._kernel_calls
            self.place(index, self._open, args, self._phase, offsets, more)
        self._open_segment()

    def add_block(self, block: Block) -> int:
        """block's index in the program's blocks (an identical one's, if there is one)."""
        index = self._block_index.setdefault(block, len(self.blocks))
        if index == len(self.blocks):
            self.blocks.append(block)
        return index

    def _close_kernel(self) -> None:
        if self._open is None:
            return
        self._close_segment()
        self._open = None
        if len(self.calls) == self._kernel_calls:
            self.footprint = None
            return
        start = self._kernel_queue % self._shared_queues
        calls = self.calls[self._kernel_calls :]
        footprint = kernel_footprint(self.blocks, calls, start, self._shared_queues, self._itemsize)
        self._place_kernel(footprint, self._inner_waits)

    def _place_kernel(self, footprint: Footprint, inner: Sequence[Waits]) -> None:
        """The open kernel's calls' waits: on the kernel's calls before them (`inner`), and
        across kernels from the kernel's footprint (Note [kernel boundaries]); then its last
        touches are what later kernels wait for."""
        self.footprint = footprint
        base, shared = self._kernel_base, self._shared_queues
        start = self._kernel_queue % shared
        cross: dict[int, dict[str, int]] = {}  # instruction of the kernel -> engine -> latest
        for touch in footprint.entries:
            mem, box, engine = self._in_kernel(touch, footprint.buffers, start)
            self._boundary.conflicts(
                mem, box, touch.write, engine, cross.setdefault(touch.instr, {})
            )
        entering = sorted(j for j, latest in cross.items() if latest)
        at, e = 0, 0
        for k in range(self._kernel_calls, len(self.calls)):
            call = self.calls[k]
            block = self.blocks[call.block]
            n = len(block.instructions)
            within = inner[k - self._kernel_calls]
            if e == len(entering) or entering[e] >= at + n:  # waits on the kernel alone
                needed = self._needed_within(call.block, within)
                waits = tuple((j, tuple(base + i for i in ids)) for j, ids in needed)
            else:
                latest = {
                    j: {turn_queue(engine, start, shared): base + i for engine, i in w}
                    for j, w in within
                }
                while e < len(entering) and entering[e] < at + n:
                    merged = latest.setdefault(entering[e] - at, {})
                    for engine, i in cross[entering[e]].items():
                        merged[engine] = max(merged.get(engine, -1), i)
                    e += 1
                waits = needed_waits(block, latest)
            self.calls[k] = with_fields(call, {"waits": waits})
            at += n
        for touch in footprint.exits:
            mem, box, engine = self._in_kernel(touch, footprint.buffers, start)
            self._boundary.record_access(base + touch.instr, engine, mem, box, touch.write, base)

    def _needed_within(self, index: int, within: Waits) -> tuple:
        """`needed_waits` of a call of block `index` whose waits are on its kernel alone, counted
        from the kernel's first instruction and queue: the same for every kernel that replays
        the call (which waits an engine's order meets does not depend on where the kernel
        starts), so worked out once."""
        key = (index, within)
        needed = self._needed_cache.get(key)
        if needed is None:
            block = self.blocks[index]
            needed = needed_waits(block, {j: dict(w) for j, w in within})
            self._needed_cache[key] = needed
        return needed

    def _itemsize(self, buffer: str) -> int:
        return self.buffers[buffer].dtype.itemsize

    def _in_kernel(self, touch: Touch, buffers: Sequence[str], start: int) -> tuple[str, Box, str]:
        """A kernel footprint's touch in the program: its engine, memory and box."""
        engine = turn_queue(touch.engine, start, self._shared_queues)
        if touch.mem != "hbm":
            return touch.mem, touch.box, engine
        at = self.buffers[buffers[touch.param]].offset
        return "hbm", (0, 1, at + touch.box[2], at + touch.box[3]), engine

    def replay_kernel(
        self, name: str, parts: Sequence[Part], queues: int, footprint: Footprint
    ) -> None:
        """A kernel identical to one built before, placed without building it (Note [kernel
        reuse] in kernels/reuse.py): a call of each of its blocks with its buffers and
        offsets, its waits from its parts' and its footprint, and the program's state moved
        on as building it would have (the queues it dealt, the end its tiles came from)."""
        self._close_kernel()
        if not parts:
            return
        self._start_kernel()
        start = self._queue
        for k, part in enumerate(parts):
            phase = (start + part.queue) % self._shared_queues
            offsets = part.offsets if any(part.offsets) else ()
            self.calls.append(Call(name, part.block, part.args, phase, (), offsets, k > 0))
            self._emitted += len(self.blocks[part.block].instructions)
        self._place_kernel(footprint, [part.inner for part in parts])
        self._queue = start + queues
        self._down = not self._down

    def parts_since(self, calls: int, queue: int) -> list[Part] | None:
        """The calls placed since the program had `calls` of them, as a kernel's parts (the
        queue each started at counted from `queue`, the queue count the kernel started at);
        None if they are not the last kernel closed's."""
        placed = self.calls[calls:]
        if self._kernel_calls != calls or any(c.more != (k > 0) for k, c in enumerate(placed)):
            return None
        shared = self._shared_queues
        return [
            Part(c.block, c.args, c.offsets, (c.phase - queue) % shared, inner)
            for c, inner in zip(placed, self._inner_waits, strict=True)
        ]

    def allocations(self) -> Allocations:
        """What the last kernel opened allocated on chip."""
        (sbuf, psum), down = self._opened_at, self._sbuf.down
        return Allocations(down, (sbuf, tuple(self._sbuf.log)), (psum, tuple(self._psum.log)))

    def mirrored(self, allocs: Allocations) -> list[Move] | None:
        """Where the kernel that allocated `allocs` would have put each of its allocations
        had it been built from the other end (Note [mirrored kernels] in kernels/reuse.py);
        None if they would not fit there."""
        sbuf = self._sbuf.mirrored(allocs.sbuf[0], allocs.down, allocs.sbuf[1])
        psum = self._psum.mirrored(allocs.psum[0], allocs.down, allocs.psum[1])
        return None if sbuf is None or psum is None else sbuf + psum

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
        quiet: _QuietRun | None = None,
    ) -> None:
        """A call of block `index` in the open kernel: its waits on the kernel's calls before
        it from its block's footprint (its waits across kernels come when the kernel closes),
        then its last touches are what the kernel's later calls wait for. `on_chip`: its waits
        on chip, known (Note [placed iterations]); its last touches on chip are then left for
        the caller to record. `quiet`: the quiet run it is part of, which holds its last
        touches in HBM (it waits on nothing there: Note [quiet runs])."""
        block = self.blocks[index]
        base = self._emitted
        call = Call(name, index, args, phase, (), offsets if any(offsets) else (), more)
        known = on_chip is not None
        on_chip = on_chip if known else {}
        hbm: dict[int, dict[str, int]] = {}
        if self._unrecorded is not None:
            self._record_exits(*self._unrecorded)
        first = len(self.calls) == self._kernel_calls  # (a kernel's first call waits on none)
        if not (first or (known and quiet)):
            for touch in block.footprint[0]:
                if (known and touch.mem != "hbm") or (quiet and touch.mem == "hbm"):
                    continue
                mem, box, engine = self._absolute(touch, call)
                if mem == "hbm" and self._pending:
                    self._settle(box[2], box[3])
                latest = (hbm if mem == "hbm" else on_chip).setdefault(touch.instr, {})
                self._inner.conflicts(mem, box, touch.write, engine, latest)
        self.calls.append(call)
        self._emitted += len(block.instructions)
        self._unrecorded = (len(self.calls) - 1, base, not known, quiet is None)
        if quiet is not None:
            quiet.calls.append((len(self.calls) - 1, base))
        waits = {j: dict(latest) for j, latest in on_chip.items() if latest}
        for j, latest in hbm.items():
            merged = waits.setdefault(j, {})
            for e, i in latest.items():
                merged[e] = max(merged.get(e, -1), i)
        self._inner_waits.append(self._relative(waits))
        if self._loop_waits is not None:
            self._loop_waits[len(self.calls) - 1] = (base, on_chip)

    def _relative(self, waits: dict[int, dict[str, int]]) -> Waits:
        """Waits on the open kernel's instructions counted from its first instruction and
        queue."""
        shared = self._shared_queues
        back = -self._kernel_queue % shared
        base = self._kernel_base
        return tuple(
            (j, tuple((turn_queue(e, back, shared), i - base) for e, i in latest.items()))
            for j, latest in sorted(waits.items())
        )

    def _record_exits(self, k: int, base: int, on_chip: bool, hbm: bool = False) -> None:
        """Call k's last touches (on chip, in HBM or both), its first instruction at `base`:
        what the kernel's later calls wait for."""
        call = self.calls[k]
        for touch in self.blocks[call.block].footprint[1]:
            if on_chip if touch.mem != "hbm" else hbm:
                mem, box, engine = self._absolute(touch, call)
                if mem == "hbm" and self._pending:
                    self._settle(box[2], box[3])
                self._inner.record_access(base + touch.instr, engine, mem, box, touch.write, base)

    def _absolute(self, touch: Touch, call: Call) -> tuple[str, Box, str]:
        engine = turn_queue(touch.engine, call.phase, self._shared_queues)
        if touch.mem != "hbm":
            return touch.mem, touch.box, engine
        buf = self.buffers[call.args[touch.param]]
        start = call.offset(touch.param) * buf.dtype.itemsize
        lo, hi = start + touch.box[2], start + touch.box[3]
        if lo < 0 or hi > buf.nbytes:  # (a loop placing a call where its strides do not hold)
            raise CodegenError(
                f"a call of {call.name} reaches bytes {lo}..{hi} of HBM buffer {buf.name}, "
                f"which has {buf.nbytes}"
            )
        return "hbm", (0, 1, buf.offset + lo, buf.offset + hi), engine

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
