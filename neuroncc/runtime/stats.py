"""Process-wide counters behind neuroncc.stats().

This is the one piece of module-level mutable state in neuroncc, and it is only written by the
backend entry, the cache and the executor, never read by compilation decisions.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_COUNTERS = (
    "dynamo_graphs",
    "compiles",
    "cache_hits_memory",
    "cache_hits_disk",
    "executions",
    "instructions",
    "device_seconds",
    "hbm_bytes",
)


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with getattr(self, "_lock", threading.Lock()):
            self._values: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
            self._fallback: Counter[str] = Counter()
            self._engine_busy: Counter[str] = Counter()
            self._warned: set[str] = set()  # ops warned about since the last reset

    def add(self, key: str, amount: float = 1) -> None:
        if key not in self._values:
            raise KeyError(f"unknown stat {key!r}")
        with self._lock:
            self._values[key] += amount

    def add_engine_busy(self, busy_ns: dict[str, float]) -> None:
        with self._lock:
            for engine, ns in busy_ns.items():
                self._engine_busy[engine] += ns * 1e-9

    def add_fallback(self, op: str) -> bool:
        """Count one node of `op` that runs eagerly; True the first time since the last reset."""
        with self._lock:
            self._fallback[op] += 1
            first = op not in self._warned
            self._warned.add(op)
        return first

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                k: (v if k == "device_seconds" else int(v)) for k, v in self._values.items()
            }
            out["fallback_nodes"] = dict(self._fallback)
            out["engine_busy_seconds"] = dict(self._engine_busy)
        return out


STATS = Stats()
