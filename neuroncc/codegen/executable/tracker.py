"""The dependency tracker: which earlier instructions a new one must wait for, by the memory
each touches (Note [dependencies]). ProgramBuilder keeps one over the open segment's
instructions, one over the open kernel's calls and one over the program's kernels.

Note [dependencies]: the tracker keeps, per memory (SBUF, PSUM, HBM), the accesses not yet
superseded, each with a conservative bounding box (partitions x bytes, or a span of HBM byte
addresses). A new access waits on every overlapping earlier access where either side writes.
Because engines execute in order, waiting on the latest such instruction of each engine implies
the earlier ones, so deps keep one id per engine. An access that a later write covers entirely is
dropped: anything overlapping it later overlaps the write too and is ordered through it. Likewise
a read of the same box by a later read on the same engine: engines run in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuroncc.codegen.executable.blocks import Box, accesses
from neuroncc.codegen.executable.intervals import Entry, IntervalIndex
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
    """Note [dependencies], with each memory's live reads and writes in two indexes: a read
    conflicts only with writes, so it searches the writes alone (a matmul's loads, most of
    a kernel's accesses, each overlap hundreds of earlier loads of a big matrix's row band
    and no write). A read drops only an earlier read of the same box by its engine, looked
    up by the box rather than searched for: other reads it covers stay, which changes no
    wait (what waits on one of them waits on the later read too, a later instruction of the
    same engine)."""

    def __init__(self, buffers: dict[str, Buffer]) -> None:
        self._buffers = buffers  # the builder's HBM buffers, by name
        self._reads: dict[str, IntervalIndex[_Access]] = {}
        self._writes: dict[str, IntervalIndex[_Access]] = {}
        self._read_at: dict[tuple[str, Box, str], Entry] = {}  # the last read of a box

    def _index(self, mem: str, write: bool) -> IntervalIndex[_Access]:
        table = self._writes if write else self._reads
        index = table.get(mem)
        if index is None:
            index = table[mem] = IntervalIndex()
        return index

    def _read(self, mem: str, box: Box, access: _Access, limit: int) -> None:
        """Record a read, dropping the last read of the same box by its engine if its id is
        below `limit` (a write may have dropped it already)."""
        key = (mem, box, access.engine)
        index = self._index(mem, False)
        last = self._read_at.get(key)
        if last is not None and last[3].instr < limit:
            index.discard(last)
        self._read_at[key] = index.add(box[2], box[3], access)

    def add(self, ins_id: int, ins: isa.Instr) -> tuple[int, ...]:
        """The latest instruction of each other engine that ins must wait for (one id per
        engine, Note [dependencies]); then ins is recorded as instruction ins_id (above every
        id recorded before). What `conflicts` for each access, then `record_access` for each
        would do, with one search of each index an access reads."""
        engine = ins.engine
        latest: dict[str, int] = {}
        touched = []
        for ref, write in accesses(ins):
            mem, box = region(ref, self._buffers)
            lo, hi, p0, p1 = box[2], box[3], box[0], box[1]
            near_writes = self._index(mem, True).near(lo, hi)
            near_reads = self._index(mem, False).near(lo, hi) if write else ()
            touched.append((mem, box, write, near_writes, near_reads))
            for e in (*near_writes, *near_reads):
                acc = e[3]
                if e[0] < hi and lo < e[1] and acc.engine != engine:
                    other = acc.box
                    if p0 < other[1] and other[0] < p1 and latest.get(acc.engine, -1) < acc.instr:
                        latest[acc.engine] = acc.instr
        for mem, box, write, near_writes, near_reads in touched:
            access = _Access(ins_id, engine, box, write)
            if not write:
                self._read(mem, box, access, ins_id)
                continue
            for kind, near in ((True, near_writes), (False, near_reads)):
                index = self._index(mem, kind)
                for e in near:  # a write drops what it covers (as record_access; two
                    if covers(box, e[3].box):  # accesses of ins may drop one entry)
                        index.discard(e)
            self._index(mem, True).add(box[2], box[3], access)
        return tuple(sorted(latest.values()))

    def conflicts(self, mem: str, box: Box, write: bool, engine: str, latest: dict) -> None:
        """Into `latest` (engine -> instruction): the latest access of each other engine that
        an access of `box` by `engine` must wait for."""
        p0, p1 = box[0], box[1]
        for kind in (True, False) if write else (True,):
            index = (self._writes if kind else self._reads).get(mem)
            if index is None:
                continue
            for acc in index.overlapping(box[2], box[3]):  # (in bytes: check partitions)
                if acc.engine != engine:
                    other = acc.box
                    if p0 < other[1] and other[0] < p1 and latest.get(acc.engine, -1) < acc.instr:
                        latest[acc.engine] = acc.instr

    def record_access(
        self, ins_id: int, engine: str, mem: str, box: Box, write: bool, before: int | None = None
    ) -> None:
        """Record an access; accesses it supersedes are dropped (Note [dependencies]), of
        those with ids below `before` only if given: a call's last touches are not ordered
        among themselves (Note [kernel boundaries])."""
        limit = ins_id if before is None else before
        access = _Access(ins_id, engine, box, write)
        if not write:
            self._read(mem, box, access, limit)
            return
        for index in (self._index(mem, True), self._index(mem, False)):
            index.remove_where(
                box[2], box[3], lambda a, box=box: a.instr < limit and covers(box, a.box)
            )
        self._index(mem, True).add(box[2], box[3], access)
