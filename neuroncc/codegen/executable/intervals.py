"""IntervalIndex: the live accesses of one memory, searchable by byte (or element) range.

Both the codegen dependency tracker and the simulator's race checker ask the same question for
every access: which earlier accesses overlap [lo, hi)? Kept in a list, that is quadratic in the
number of tiles of a large tensor. Here records are grouped by length class (class c holds
records no longer than 2**c) and kept sorted by `lo` within a class, so any record of class c
overlapping the query starts in [lo - 2**c, hi): one bisection per class. A row-strided tile of
a big matrix (a long span) then only meets the records of its own length class near it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Class(Generic[T]):
    def __init__(self) -> None:
        self.los: list[int] = []
        self.items: list[tuple[int, int, int, T]] = []  # (lo, hi, seq, item), sorted by lo, seq


class IntervalIndex(Generic[T]):
    def __init__(self) -> None:
        self._classes: dict[int, _Class[T]] = {}
        self._seq = 0

    def add(self, lo: int, hi: int, item: T) -> None:
        self._seq += 1
        c = self._classes.setdefault(max(hi - lo, 1).bit_length(), _Class())
        i = bisect.bisect_right(c.los, lo)
        c.los.insert(i, lo)
        c.items.insert(i, (lo, hi, self._seq, item))

    def overlapping(self, lo: int, hi: int) -> Iterator[T]:
        """Items whose [lo, hi) intersects the query (callers refine with exact checks)."""
        for length_class, c in self._classes.items():
            start = bisect.bisect_left(c.los, lo - (1 << length_class))
            stop = bisect.bisect_left(c.los, hi)
            for i in range(start, stop):
                ilo, ihi, _, item = c.items[i]
                if ilo < hi and lo < ihi:
                    yield item

    def remove_where(self, lo: int, hi: int, predicate) -> None:
        """Drop the items inside [lo, hi) for which predicate(item) holds."""
        for c in self._classes.values():
            start = bisect.bisect_left(c.los, lo)
            stop = bisect.bisect_right(c.los, hi)
            if start == stop:
                continue
            keep = [e for e in c.items[start:stop] if not (e[1] <= hi and predicate(e[3]))]
            c.items[start:stop] = keep
            c.los[start:stop] = [e[0] for e in keep]
