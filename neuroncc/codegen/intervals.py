"""IntervalIndex: the live accesses of one memory, searchable by byte (or element) range.

Both the codegen dependency tracker and the simulator's race checker ask the same question for
every access: which earlier accesses overlap [lo, hi)? Kept in a list, that is quadratic in the
number of tiles of a large tensor. Here records are kept sorted by `lo`; short records are found
by bisection (any overlapping one starts after lo - longest short length), long ones (rare:
whole-buffer views) are scanned.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_LONG = 1 << 16


class IntervalIndex(Generic[T]):
    def __init__(self) -> None:
        self._los: list[int] = []
        self._items: list[tuple[int, int, int, T]] = []  # (lo, hi, seq, item), sorted by lo, seq
        self._long: list[tuple[int, int, int, T]] = []
        self._max_short = 0
        self._seq = 0

    def add(self, lo: int, hi: int, item: T) -> None:
        self._seq += 1
        entry = (lo, hi, self._seq, item)
        if hi - lo > _LONG:
            self._long.append(entry)
            return
        self._max_short = max(self._max_short, hi - lo)
        i = bisect.bisect_right(self._los, lo)
        self._los.insert(i, lo)
        self._items.insert(i, entry)

    def overlapping(self, lo: int, hi: int) -> Iterator[T]:
        """Items whose [lo, hi) intersects the query (callers refine with exact checks)."""
        start = bisect.bisect_left(self._los, lo - self._max_short)
        stop = bisect.bisect_left(self._los, hi)
        for i in range(start, stop):
            ilo, ihi, _, item = self._items[i]
            if ilo < hi and lo < ihi:
                yield item
        for ilo, ihi, _, item in self._long:
            if ilo < hi and lo < ihi:
                yield item

    def remove_where(self, lo: int, hi: int, predicate) -> None:
        """Drop the items inside [lo, hi) for which predicate(item) holds."""
        start = bisect.bisect_left(self._los, lo)
        stop = bisect.bisect_right(self._los, hi)
        keep = [e for e in self._items[start:stop] if not (e[1] <= hi and predicate(e[3]))]
        self._items[start:stop] = keep
        self._los[start:stop] = [e[0] for e in keep]
        self._long = [e for e in self._long if not (lo <= e[0] and e[1] <= hi and predicate(e[3]))]
