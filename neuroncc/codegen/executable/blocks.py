"""Kernel blocks and the calls that place them in a program (Note [blocks and calls]).

Note [blocks and calls]: an executable is a sequence of kernel *calls*, each naming a *block*:
a kernel's instructions as built, once, with their waits local to the block (indexes into it)
and their HBM operands naming the block's parameters ("$0", "$1", ...) instead of buffers. A
call binds the parameters to buffers, turns the block's DMA queues by its phase (the program
deals its queues out in turn, kernel after kernel) and adds the waits across kernels (Note
[kernel boundaries]). Identical kernels (the layers of a model, a forward and its recompute)
share one block, so what the compiler builds, checks and stores grows with the distinct
kernels, not with the model's depth. The unrolled stream (`Executable.instructions`: every
call's instructions with its buffers, queues and waits) is made on demand; the simulator, the
timing model and the listing read it.

Note [instruction loops]: a kernel's loop (a matmul's steps over blocks of rows and columns)
is built an iteration at a time, each iteration a block of its own with its own call (`more`:
it continues the kernel). HBM operands count from the first element the block touches of each
parameter, and the call says where that is (`offsets`), so iterations that differ only in
where they read and write share a block. The builder's `loop` watches the iterations go by:
when the last 2p are a period of p repeated (the same blocks on the same buffers, met in the
same state: the emitter's carried tiles and choices, its pools turned by whole rotations, the
same queues dealt) and the emitter's forms say the next iterations look like the period's,
it places them as calls of the period's blocks, offsets moved on by the period's strides,
without running the emitter: what a kernel builds grows with its distinct iterations, not
with the size of its tensors. The executable stores such calls as one run (program.py), so
its size does not grow either; the timing model's memo times a repeated call once (Note
[timing by call]); `emit_graph(..., unrolled=True)` emits every iteration and must give the
same executable. Only loops of MIN_LOOP iterations or more (loops.py) are built this way:
each call costs a lookup per tile it touches, so short loops gain too little. Waits between
a kernel's calls are the boundary waits below, taken among the kernel's calls alone: exact
for on-chip tiles, and for HBM the bytes each engine touches of a parameter in the call.

Note [kernel boundaries]: waits inside a block are exact (the builder's tracker, over the
kernel alone). Across blocks a block is summarised by its footprint: per engine and region it
touches (an HBM buffer, taken whole over the bytes the engine touches of it; an on-chip tile
box, exactly), its first and its last access. A kernel of several calls (a loop's
iterations) orders its calls by their footprints against each other's (the builder's
`_inner`), and is itself summarised by the union of its calls' footprints (`Footprint`):
across kernels, a kernel's first access to a region on an engine waits for the last
conflicting access to it by every engine in earlier kernels (if the engine writes the region
anywhere in the kernel, every earlier access conflicts); its last access is what later
kernels wait for. So a kernel replayed from a template (Note [kernel reuse]) is placed with
one lookup per region it touches, however many calls it has: its waits among its calls are
the template's. Every cross-kernel hazard is ordered: a later access on the same engine comes
after the first in the engine's order. The price: a kernel reading a buffer waits
for the whole of the writer's part of it, where a tracker over the unrolled stream would wait
for the one tile it reads first (the benchmark suite's device times moved by at most 0.2%).
A call's last touches are not ordered among themselves (two engines may write disjoint rows
within one's span), so recording one drops only accesses of earlier calls it covers. A wait
that an earlier instruction on the same engine already has is left out (the engine runs in
order): a layer's calls then wait on a few instructions, not on one per tile they touch.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from neuroncc.codegen.hardware import isa

Box = tuple[int, int, int, int]  # p0, p1, b0, b1 (HBM: 0, 1, byte lo, byte hi)


def param_name(k: int) -> str:
    return f"${k}"


@dataclass(frozen=True)
class Touch:
    """A block's first or last access to a region on one engine (`instr` is local). For HBM,
    `param` is the block's parameter and `box` bytes relative to its buffer's start."""

    instr: int
    engine: str
    mem: str
    param: int
    box: Box
    write: bool


@dataclass(frozen=True)
class Block:
    """A kernel's instructions as built (`name`: the first kernel built as it; blocks are
    equal when their instructions are)."""

    name: str = field(compare=False)
    params: int
    instructions: tuple[isa.Instr, ...]

    @functools.cached_property
    def footprint(self) -> tuple[tuple[Touch, ...], tuple[Touch, ...]]:
        """(first touches, last touches) per (engine, region): Note [kernel boundaries]."""
        regions = _Regions()
        for j, ins in enumerate(self.instructions):
            for ref, write in accesses(ins):
                if isinstance(ref, isa.TileRef):
                    mem, param = ref.mem, -1
                    box = (ref.p0, ref.p0 + ref.np, ref.offset, ref.offset + ref.free_bytes)
                    key = box
                else:
                    mem, param = "hbm", int(ref.buffer[1:])
                    lo, hi = ref.span()
                    size = ref.dtype.itemsize
                    box, key = (0, 1, lo * size, hi * size), None
                regions.add((ins.engine, mem, param, key), j, j, box, write)
        return regions.touches()


class _Regions:
    """The first and last access per (engine, memory, parameter, region key), their boxes
    joined and whether any writes, as accesses come in program order."""

    def __init__(self) -> None:
        self.slots: dict[tuple, list] = {}  # key -> [first, last, box, write]

    def add(self, key: tuple, first: int, last: int, box: Box, write: bool) -> None:
        slot = self.slots.get(key)
        if slot is None:
            self.slots[key] = [first, last, box, write]
        else:
            slot[1] = last
            slot[2] = _union(slot[2], box)
            slot[3] = slot[3] or write

    def touches(self) -> tuple[tuple[Touch, ...], tuple[Touch, ...]]:
        """(first touches, last touches)."""
        entries = tuple(
            Touch(f, e, mem, param, box, write)
            for (e, mem, param, _), (f, _, box, write) in self.slots.items()
        )
        exits = tuple(
            Touch(last, e, mem, param, box, write)
            for (e, mem, param, _), (_, last, box, write) in self.slots.items()
        )
        return entries, exits


@dataclass(frozen=True)
class Call:
    """A block placed in the program: its parameters' buffers, its queue phase, and its
    waits across kernels as (local instruction, global ids of earlier instructions).
    `offsets`: per parameter, the element of its buffer the block's element 0 of it is (none:
    all 0); `more`: the call continues the kernel of the call before it (an iteration of a
    kernel's loop, Note [instruction loops])."""

    name: str
    block: int
    args: tuple[str, ...]
    phase: int
    waits: tuple[tuple[int, tuple[int, ...]], ...]
    offsets: tuple[int, ...] = ()
    more: bool = False

    def offset(self, param: int) -> int:
        return self.offsets[param] if self.offsets else 0

    @property
    def starts(self) -> tuple[int, ...]:
        """`offsets`, one per parameter (zeros where none are stored)."""
        return self.offsets or (0,) * len(self.args)


@dataclass(frozen=True)
class Footprint:
    """A kernel's first and last touches per (engine, region) over all its calls (Note [kernel
    boundaries]), counted from the kernel: `instr` from its first instruction, DMA queues
    from the queue it started at, and HBM regions as `param` into `buffers` with `box` in
    bytes from the buffer's start."""

    buffers: tuple[str, ...]
    entries: tuple[Touch, ...]
    exits: tuple[Touch, ...]


def kernel_footprint(
    blocks: list[Block],
    calls: list[Call],
    start: int,
    shared: int,
    itemsize: Callable[[str], int],
) -> Footprint:
    """The footprint of the kernel made of `calls` (the first at queue phase `start`): its
    calls' block footprints, each region taken whole as a block takes it."""
    regions = _Regions()
    names: dict[str, int] = {}
    at = 0
    for call in calls:
        block = blocks[call.block]
        turn = (call.phase - start) % shared
        for first, last in zip(*block.footprint, strict=True):
            engine = turn_queue(first.engine, turn, shared)
            if first.mem == "hbm":
                buffer = call.args[first.param]
                param = names.setdefault(buffer, len(names))
                shift = call.offset(first.param) * itemsize(buffer)
                box = (0, 1, first.box[2] + shift, first.box[3] + shift)
                key = (engine, "hbm", param, None)
            else:
                param, box = -1, first.box
                key = (engine, first.mem, -1, box)
            regions.add(key, at + first.instr, at + last.instr, box, first.write)
        at += len(block.instructions)
    return Footprint(tuple(names), *regions.touches())


def _union(a: Box, b: Box) -> Box:
    return (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))


def needed_waits(block: Block, waits: dict[int, dict[str, int]]) -> tuple:
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


def accesses(ins: isa.Instr) -> list[tuple[isa.Operand, bool]]:
    return [(r, False) for r in ins.reads()] + [(w, True) for w in ins.writes()]


def turn_queue(engine: str, phase: int, shared: int) -> str:
    """A DMA queue of a block as a call runs it: the shared queues turned by `phase`; the
    queues set aside (reserve_queues) and the compute engines stay."""
    if phase and engine[0] == "q":
        q = int(engine[1:])
        if q < shared:
            return isa.dma_queue((q + phase) % shared)
    return engine


def expand(
    blocks: tuple[Block, ...], calls: tuple[Call, ...], shared_queues: int
) -> tuple[isa.Instr, ...]:
    """The unrolled stream: every call's block with its buffers, queues and waits."""
    out: list[isa.Instr] = []
    for call in calls:
        block = blocks[call.block]
        base = len(out)
        waits = dict(call.waits)
        renamed: dict[isa.DramRef, isa.DramRef] = {}

        def bind(ref, call=call, renamed=renamed):
            if not isinstance(ref, isa.DramRef):
                return ref
            new = renamed.get(ref)
            if new is None:
                new = renamed[ref] = bound(ref, call)
            return new

        for j, ins in enumerate(block.instructions):
            deps = tuple(base + d for d in ins.deps)
            extra = waits.get(j)
            if extra:
                deps = tuple(sorted({*deps, *extra}))
            changes = {"deps": deps}
            engine = turn_queue(ins.engine, call.phase, shared_queues)
            if engine != ins.engine:
                changes["engine"] = engine
            for name, value in ins.operands().items():
                if isinstance(value, isa.DramRef):
                    changes[name] = bind(value)
            out.append(with_fields(ins, changes))
    return tuple(out)


def bound(ref: isa.DramRef, call: Call) -> isa.DramRef:
    """A block's HBM operand as `call` binds it: its parameter's buffer and offset."""
    param = int(ref.buffer[1:])
    return relocated(ref, call.args[param], ref.offset + call.offset(param))


def relocated(ref: isa.DramRef, buffer: str, offset: int) -> isa.DramRef:
    """ref in another buffer at another element offset (its shape's cached facts kept)."""
    new = with_fields(ref, {"buffer": buffer, "offset": offset})
    if offset != ref.offset:
        new.__dict__.pop("_span", None)
    return new


def with_fields(ins, changes: dict):
    """dataclasses.replace of an instruction or operand without __init__: a third of its
    cost (building and expanding are per instruction of the unrolled stream)."""
    new = object.__new__(type(ins))
    new.__dict__.update(ins.__dict__)
    new.__dict__.update(changes)
    return new


def parametrise(
    name: str, instructions: list[isa.Instr]
) -> tuple[Block, tuple[str, ...], tuple[int, ...]]:
    """A kernel's instructions as a block whose HBM operands name parameters "$0", "$1", ...
    in order of first use, each counted from the first element the block touches of it; the
    buffers they stand for, and those elements (the call's offsets)."""
    base: dict[str, int] = {}
    for ins in instructions:
        for value in ins.operands().values():
            if isinstance(value, isa.DramRef):
                lo = value.span()[0]
                if lo < base.get(value.buffer, lo + 1):
                    base[value.buffer] = lo
    args = {buffer: k for k, buffer in enumerate(base)}
    renamed: dict[isa.DramRef, isa.DramRef] = {}
    out = []
    for ins in instructions:
        changes = {}
        for field_name, value in ins.operands().items():
            if isinstance(value, isa.DramRef):
                new = renamed.get(value)
                if new is None:
                    buffer = value.buffer
                    new = renamed[value] = relocated(
                        value, param_name(args[buffer]), value.offset - base[buffer]
                    )
                changes[field_name] = new
        out.append(with_fields(ins, changes) if changes else ins)
    offsets = tuple(base.values())
    return Block(name, len(args), tuple(out)), tuple(base), offsets if any(offsets) else ()


class TileMoves:
    """Tiles moved allocation by allocation (Note [mirrored kernels] in kernels/reuse.py):
    `moves` are (mem, start, nbytes, to) of a kernel's allocations; a tile inside one moves
    with it, a tile outside them all (the program's rings) stays."""

    def __init__(self, moves) -> None:
        self.regions: dict[str, list[tuple[int, int, int]]] = {}
        for m in moves:
            self.regions.setdefault(m.mem, []).append((m.start, m.start + m.nbytes, m.to))
        for regions in self.regions.values():
            regions.sort()
        self.starts = {mem: [r[0] for r in regions] for mem, regions in self.regions.items()}

    def offset(self, mem: str, lo: int, hi: int) -> int:
        """Where the bytes [lo, hi) of a partition of `mem` go; Unmovable if they straddle an
        allocation's edge."""
        regions = self.regions.get(mem)
        if not regions:
            return lo
        k = bisect.bisect_right(self.starts[mem], lo) - 1
        if k >= 0 and lo < regions[k][1]:
            start, end, to = regions[k]
            if hi > end:
                raise Unmovable(f"{mem} bytes {lo}..{hi} straddle the allocation {start}..{end}")
            return lo - start + to
        if k + 1 < len(regions) and regions[k + 1][0] < hi:
            raise Unmovable(f"{mem} bytes {lo}..{hi} straddle an allocation's start")
        return lo

    def tile(self, t: isa.TileRef) -> isa.TileRef:
        offset = self.offset(t.mem, t.offset, t.offset + t.free_bytes)
        return t if offset == t.offset else with_fields(t, {"offset": offset})

    def block(self, block: Block) -> Block:
        out = []
        for ins in block.instructions:
            changes = {
                name: self.tile(value)
                for name, value in ins.operands().items()
                if isinstance(value, isa.TileRef)
            }
            out.append(with_fields(ins, changes) if changes else ins)
        return Block(block.name, block.params, tuple(out))

    def touch(self, touch: Touch) -> Touch:
        if touch.mem == "hbm":
            return touch
        p0, p1, lo, hi = touch.box
        offset = self.offset(touch.mem, lo, hi)
        return touch if offset == lo else replace(touch, box=(p0, p1, offset, offset + hi - lo))


class Unmovable(Exception):
    """A tile that is not inside one allocation: its kernel cannot be mirrored."""
