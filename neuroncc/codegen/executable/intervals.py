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
from typing import Generic, TypeVar

T = TypeVar("T")
Entry = tuple[int, int, int, T]  # (lo, hi, seq, item): seq orders items added at one lo


class _Class(Generic[T]):
    def __init__(self) -> None:
        self.los: list[int] = []
        self.items: list[Entry] = []  # sorted by lo, seq


class IntervalIndex(Generic[T]):
    def __init__(self) -> None:
        self._classes: dict[int, _Class[T]] = {}
        self._seq = 0

    def add(self, lo: int, hi: int, item: T) -> Entry:
        """Add an item; its entry, for `discard`."""
        self._seq += 1
        c = self._classes.setdefault(max(hi - lo, 1).bit_length(), _Class())
        i = bisect.bisect_right(c.los, lo)
        entry = (lo, hi, self._seq, item)
        c.los.insert(i, lo)
        c.items.insert(i, entry)
        return entry

    def overlapping(self, lo: int, hi: int) -> list[T]:
        """Items whose [lo, hi) intersects the query (callers refine with exact checks)."""
        out: list[T] = []
        for length_class, c in self._classes.items():
            los = c.los
            start = bisect.bisect_left(los, lo - (1 << length_class))
            stop = bisect.bisect_left(los, hi, start)  # every item from here starts at hi or on
            if start < stop:
                out.extend(e[3] for e in c.items[start:stop] if lo < e[1])
        return out

    def near(self, lo: int, hi: int) -> list[Entry]:
        """The entries (lo, hi, seq, item) of the items that intersect [lo, hi) or lie inside
        [lo, hi]: what `overlapping` returns and what `remove_where` can drop, in one search
        (a caller that asks both of one range, then drops with `discard`)."""
        out: list[Entry] = []
        for length_class, c in self._classes.items():
            los = c.los
            start = bisect.bisect_left(los, lo - (1 << length_class))
            stop = bisect.bisect_right(los, hi, start)
            if start < stop:
                out.extend(
                    e for e in c.items[start:stop] if lo < e[1] or (lo <= e[0] and e[1] <= hi)
                )
        return out

    def discard(self, entry: Entry) -> None:
        """Drop an entry `add` or `near` returned, if it is still held."""
        lo, hi, seq, _ = entry
        c = self._classes.get(max(hi - lo, 1).bit_length())
        if c is None:
            return
        i = bisect.bisect_left(c.los, lo)
        while i < len(c.items) and c.items[i][0] == lo:
            if c.items[i][2] == seq:
                del c.los[i], c.items[i]
                return
            i += 1

    def remove_where(self, lo: int, hi: int, predicate) -> None:
        """Drop the items inside [lo, hi) for which predicate(item) holds."""
        longest = max(hi - lo, 1).bit_length()  # an item inside is no longer than the range
        for length_class, c in self._classes.items():
            if length_class > longest:
                continue
            los, items = c.los, c.items
            start = bisect.bisect_left(los, lo)
            stop = bisect.bisect_right(los, hi, start)
            drop = [i for i in range(start, stop) if items[i][1] <= hi and predicate(items[i][3])]
            for i in reversed(drop):  # (most queries drop none or one)
                del los[i], items[i]
