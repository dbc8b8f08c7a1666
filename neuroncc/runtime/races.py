"""The race checker: proves that the declared dependencies order every conflicting access.

Two accesses conflict when they touch a common byte and at least one writes. They are ordered
when one happens before the other: same engine (streams run in order) or linked by a chain of
declared deps. Happens-before is tracked with vector clocks, and regions exactly (SBUF/PSUM
rectangles; HBM byte addresses, element by element for strided patterns), independently of
how codegen computed its deps, so a missing dependency in codegen surfaces here as a
RaceError naming both instructions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from neuroncc.codegen.executable.intervals import IntervalIndex
from neuroncc.codegen.executable.program import Buffer
from neuroncc.codegen.hardware import isa
from neuroncc.errors import RaceError


@dataclass
class _Region:
    p0: int
    p1: int
    lo: int
    hi: int
    idx: np.ndarray | None = None  # HBM: the start byte of each element of a strided pattern
    size: int = 1  # HBM: bytes per element

    def overlaps(self, o: _Region) -> bool:
        if not (self.p0 < o.p1 and o.p0 < self.p1 and self.lo < o.hi and o.lo < self.hi):
            return False
        if self.idx is None and o.idx is None:
            return True
        if self.idx is not None and o.idx is not None:
            if self.size != o.size:  # reused arena bytes seen as two dtypes: the bounding
                return True  # boxes decide (conservative; codegen orders by the same boxes)
            return np.intersect1d(self.idx, o.idx, assume_unique=True).size > 0
        idx, other = (self, o) if self.idx is not None else (o, self)
        starts = idx.idx
        return bool(np.any((starts + idx.size > other.lo) & (starts < other.hi)))

    def covers(self, o: _Region) -> bool:
        return (
            self.idx is None
            and self.p0 <= o.p0
            and o.p1 <= self.p1
            and self.lo <= o.lo
            and o.hi <= self.hi
        )


def region(ref: isa.Operand, offsets: dict[str, int]) -> tuple[str, _Region]:
    """On-chip rectangles; HBM by byte address (the plan pass lets temporaries share bytes)."""
    if isinstance(ref, isa.TileRef):
        return ref.mem, _Region(ref.p0, ref.p0 + ref.np, ref.offset, ref.offset + ref.free_bytes)
    lo, hi = ref.span()
    base, size = offsets[ref.buffer], ref.dtype.itemsize
    idx = None
    if ref.contiguous_run() != ref.numel:
        offs = np.zeros(1, dtype=np.int64) + ref.offset
        for stride, count in ref.dims:
            offs = (offs[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]).reshape(-1)
        idx = base + size * (offs if _increasing(ref.dims) else np.unique(offs))
    return "hbm", _Region(0, 1, base + lo * size, base + hi * size, idx, size)


def _increasing(dims: tuple[tuple[int, int], ...]) -> bool:
    """Whether a pattern visits strictly increasing offsets (so they are sorted and unique as
    generated): every stride positive and past the whole extent of the levels inside it. The
    row-by-row tiles codegen moves are such patterns; sorting them was most of the check."""
    extent = 0
    for stride, count in reversed(dims):
        if count == 1:
            continue
        if stride <= extent:
            return False
        extent += stride * (count - 1)
    return True


@dataclass
class _Access:
    instr: int
    engine: int
    seq: int
    region: _Region
    write: bool


class RaceChecker:
    def __init__(self, buffers: Sequence[Buffer]) -> None:
        self._offsets = {b.name: b.offset for b in buffers}
        self._engines: dict[str, int] = {}
        self._clocks: list[np.ndarray] = []
        self._last_on_engine: dict[int, int] = {}
        self._seq: dict[int, int] = {}
        self._live: dict[str, IntervalIndex[_Access]] = {}
        self._opcodes: list[str] = []

    def _engine(self, name: str) -> int:
        if name not in self._engines:
            self._engines[name] = len(self._engines)
            for i, vc in enumerate(self._clocks):
                self._clocks[i] = np.append(vc, -1)
        return self._engines[name]

    def check(self, ins_id: int, ins: isa.Instr) -> None:
        e = self._engine(ins.engine)
        vc = np.full(len(self._engines), -1, dtype=np.int64)
        prev = self._last_on_engine.get(e)
        for d in ((prev,) if prev is not None else ()) + tuple(ins.deps):
            if not 0 <= d < ins_id:
                raise RaceError(
                    f"instruction {ins_id} ({ins.opcode}) waits on {d}, which is not earlier"
                )
            vc = np.maximum(vc, self._clocks[d])
        seq = self._seq.get(e, -1) + 1
        self._seq[e] = seq
        vc[e] = seq
        self._clocks.append(vc)
        self._last_on_engine[e] = ins_id
        self._opcodes.append(f"{ins.opcode}@{ins.engine}")
        accesses = [(r, False) for r in ins.reads()] + [(w, True) for w in ins.writes()]
        for ref, write in accesses:
            mem, reg = region(ref, self._offsets)
            live = self._live.get(mem)
            candidates = live.overlapping(reg.lo, reg.hi) if live is not None else ()
            for acc in candidates:
                if (write or acc.write) and vc[acc.engine] < acc.seq and reg.overlaps(acc.region):
                    kind = "write" if write else "read"
                    raise RaceError(
                        f"race on {mem}: instruction {ins_id} ({self._opcodes[-1]}) {kind}s {ref} "
                        f"while instruction {acc.instr} ({self._opcodes[acc.instr]}) "
                        f"{'writes' if acc.write else 'reads'} it, with no dependency between them"
                    )
        for ref, write in accesses:
            mem, reg = region(ref, self._offsets)
            live = self._live.setdefault(mem, IntervalIndex())
            if write:
                live.remove_where(reg.lo, reg.hi, lambda a, reg=reg: reg.covers(a.region))
            live.add(reg.lo, reg.hi, _Access(ins_id, e, seq, reg, write))
