"""The in-memory graph cache: a compiled graph is looked up by a key derived from its canonical
IR text, the compile options, the target and the versions of neuroncc and the executable format.
Identical graphs (the repeated blocks of a transformer) share one entry.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from neuroncc.codegen.program import FORMAT_VERSION

T = TypeVar("T")


def cache_key(ir_text: str, options_key: str, target: str, version: str) -> str:
    h = hashlib.sha256()
    for part in (ir_text, options_key, target, version, str(FORMAT_VERSION)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class MemoryCache:
    """A bounded least-recently-used map from cache key to compiled graph."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, object] = OrderedDict()

    def get_or_build(self, key: str, build: Callable[[], T]) -> tuple[T, bool]:
        """(value, hit): the cached value for key, building and storing it on a miss."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key], True  # type: ignore[return-value]
        value = build()
        self._items[key] = value
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return value, False

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


# The process's graph cache, shared by every torch.compile call (that sharing is its purpose).
GRAPH_CACHE = MemoryCache()
