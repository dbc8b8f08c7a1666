"""The graph caches: a compiled graph is looked up by a key derived from its canonical IR text
(which holds the input shapes and dtypes), the compile options, the target and the versions of
neuroncc and the executable format. Identical graphs (the repeated blocks of a transformer)
share one entry (the key: disk_cache.cache_key).

`lookup_or_compile` is the one path: the process's memory cache, then the persistent cache on
disk (disk_cache.py), then a compile, stored in both. Each outcome is counted in stats().
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from neuroncc import __version__
from neuroncc.runtime.disk_cache import DiskCache, Entry
from neuroncc.runtime.executor import CompiledExecutable
from neuroncc.runtime.stats import STATS


class MemoryCache:
    """A bounded least-recently-used map from cache key to compiled graph."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, object] = OrderedDict()

    def get(self, key: str) -> object | None:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        return None

    def put(self, key: str, value: object) -> None:
        self._items[key] = value
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def values(self) -> list[object]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


# The process's graph cache, shared by every torch.compile call (that sharing is its purpose).
GRAPH_CACHE = MemoryCache()


def lookup_or_compile(
    key: str, compile_entry: Callable[[], Entry], disk: DiskCache | None, name: str
) -> CompiledExecutable:
    """The compiled graph for key: from memory, from disk, or compiled by compile_entry (under
    the key's disk lock, so that processes sharing a cache compile each graph once)."""
    compiled = GRAPH_CACHE.get(key)
    if compiled is not None:
        STATS.add("cache_hits_memory")
        return compiled  # type: ignore[return-value]
    if disk is None:
        entry = _compiled(compile_entry)
        return _remember(key, entry, name)
    entry = disk.load(key, __version__)
    if entry is None:
        with disk.compiling(key):
            entry = disk.load(key, __version__)  # another process may have compiled it
            if entry is None:
                entry = _compiled(compile_entry)
                disk.store(key, entry)
                return _remember(key, entry, name)
    STATS.add("cache_hits_disk")
    return _remember(key, entry, name)


def _compiled(compile_entry: Callable[[], Entry]) -> Entry:
    entry = compile_entry()
    STATS.add("compiles")
    STATS.add("compile_seconds", entry.meta.get("compile_seconds", 0.0))
    return entry


def _remember(key: str, entry: Entry, name: str) -> CompiledExecutable:
    exe = (
        entry.executable if entry.executable.name == name else replace(entry.executable, name=name)
    )
    compiled = CompiledExecutable(exe, entry.profile)
    GRAPH_CACHE.put(key, compiled)
    return compiled
