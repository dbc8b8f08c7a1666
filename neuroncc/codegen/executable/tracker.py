"""The dependency tracker: which earlier instructions a new one must wait for, by the memory
each touches (Note [dependencies]). ProgramBuilder keeps one over the open segment's
instructions, one over the open kernel's calls and one over the program's kernels.

Note [dependencies]: the tracker keeps, per memory (SBUF, PSUM, HBM), the accesses not yet
superseded, each with a conservative bounding box (partitions x bytes, or a span of HBM byte
addresses). A new access waits on every overlapping earlier access where either side writes.
Because engines execute in order, waiting on the latest such instruction of each engine implies
the earlier ones, so deps keep one id per engine. An access that a later write covers entirely is
dropped: anything overlapping it later overlaps the write too and is ordered through it. Likewise
a read covered by a later read on the same engine: engines run in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuroncc.codegen.executable.blocks import Box, accesses
from neuroncc.codegen.executable.intervals import IntervalIndex
from neuroncc.codegen.executable.program import Buffer
from neuroncc.codegen.hardware import isa


def region(ref: isa.Operand, buffers: dict[str, Buffer]) -> tuple[str, Box]:
    """The memory an operand touches and its bounding box there; HBM by byte address, since
    temporaries the plan pass placed share addresses."""
    if isinstance(ref, isa.TileRef):
        return ref.mem, (ref.p0, ref.p0 + ref.np, ref.offset, ref.offset + ref.free_bytes)
    lo, hi = ref.span()
    base, size = buffers[ref.buffer].offset, ref.dtype.itemsize
    return "hbm", (0, 1, base + lo * size, base + hi * size)


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
        engine, Note [dependencies]); then ins is recorded as instruction ins_id (above every
        id recorded before). What `conflicts` for each access, then `record_access` for each
        would do, with one search of the index per access for both."""
        engine = ins.engine
        latest: dict[str, int] = {}
        touched = []
        for ref, write in accesses(ins):
            mem, box = region(ref, self._buffers)
            live = self._live.get(mem)
            near = live.near(box[2], box[3]) if live is not None else ()
            touched.append((mem, box, write, near))
            lo, hi, p0, p1 = box[2], box[3], box[0], box[1]
            for e in near:
                acc = e[3]
                if e[0] < hi and lo < e[1] and (write or acc.write) and acc.engine != engine:
                    other = acc.box
                    if p0 < other[1] and other[0] < p1 and latest.get(acc.engine, -1) < acc.instr:
                        latest[acc.engine] = acc.instr
        dropped: set[tuple[str, int]] = set()  # (two accesses of ins may find one entry)
        for mem, box, write, near in touched:
            live = self._live.setdefault(mem, IntervalIndex())
            for e in near:
                acc = e[3]
                if (mem, e[2]) in dropped or not covers(box, acc.box):
                    continue
                if write or (not acc.write and acc.engine == engine):  # as record_access
                    live.discard(e)
                    dropped.add((mem, e[2]))
            live.add(box[2], box[3], _Access(ins_id, engine, box, write))
        return tuple(sorted(latest.values()))

    def conflicts(self, mem: str, box: Box, write: bool, engine: str, latest: dict) -> None:
        """Into `latest` (engine -> instruction): the latest access of each other engine that
        an access of `box` by `engine` must wait for."""
        live = self._live.get(mem)
        if live is None:
            return
        p0, p1 = box[0], box[1]
        for acc in live.overlapping(box[2], box[3]):  # (overlapping in bytes: check partitions)
            if (write or acc.write) and acc.engine != engine:
                other = acc.box
                if p0 < other[1] and other[0] < p1 and latest.get(acc.engine, -1) < acc.instr:
                    latest[acc.engine] = acc.instr

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
