"""Process-wide counters behind neuroncc.stats().

This is the one piece of module-level mutable state in neuroncc, and it is only written by the
backend entry, the cache, the executor and kernel reuse (codegen/kernels/reuse.py), never read
by compilation decisions.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_COUNTERS = (
    "dynamo_graphs",
    "compiles",
    "compile_seconds",  # neuroncc's own: passes, emission, timing (not Dynamo's or AOTAutograd's)
    "cache_hits_memory",
    "cache_hits_disk",
    "executions",
    "timing_only_executions",
    "weight_layouts",  # weights laid out for an inference graph (Note [weight layout])
    # mixture-of-experts grouped matmuls compiled as dense products over every expert (Note
    # [grouped matmul]): their FLOPs and device time in the profiles are E times the routed ones
    "dense_grouped_matmuls",
    # Note [kernel reuse]: kernels emitted, placed from a template without emitting, and keys
    # whose second kernel came out other than the first (never replayed)
    "kernels_emitted",
    "kernels_reused",
    "kernel_key_mismatches",
    "instructions",
    "device_seconds",
    "roofline_seconds",
    "throttled_seconds",
    "flops",
    "hw_flops",
    "hbm_bytes",
    "sbuf_bytes",
    "psum_bytes",
    "spill_bytes",
    "dma_bytes",
    # the `neuron` device's eager ops (Note [eager ops]): executions of one-op graphs and their
    # simulated time, apart from the compiled graphs' above; random ops drawn on the host
    "eager_executions",
    "eager_device_seconds",
    "eager_host_random",
)
# Time-weighted: summed as value x device seconds, reported divided by device_seconds.
_WEIGHTED = ("mfu", "hfu", "dma_efficiency")
_FLOAT = (
    "compile_seconds",
    "device_seconds",
    "roofline_seconds",
    "throttled_seconds",
    "eager_device_seconds",
)
EAGER_PREFIX = "eager_"  # the names of the device's one-op graphs


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with getattr(self, "_lock", threading.Lock()):
            self._values: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
            self._fallback: Counter[str] = Counter()
            self._errors: Counter[str] = Counter()
            self._engine_busy: Counter[str] = Counter()
            self._weighted: Counter[str] = Counter()
            self._graphs: dict[str, dict[str, Any]] = {}
            self._over_capacity: dict[str, int] = {}  # graph -> HBM bytes it needs
            self._warned: set[str] = set()  # ops warned about since the last reset

    def add(self, key: str, amount: float = 1) -> None:
        if key not in self._values:
            raise KeyError(f"unknown stat {key!r}")
        with self._lock:
            self._values[key] += amount

    def value(self, key: str) -> float:
        """One counter's value (what snapshot() reports, without building the rest)."""
        with self._lock:
            return self._values[key]

    def add_execution(
        self, graph: str, prof: Any, compiled: Any, timing_only: bool = False
    ) -> None:
        """One execution of `compiled` (a CompiledExecutable) with timing.Profile `prof`;
        `timing_only`: it was timed, not simulated."""
        seconds = prof.device_ns * 1e-9
        if graph.startswith(EAGER_PREFIX):
            with self._lock:
                self._values["eager_executions"] += 1
                self._values["eager_device_seconds"] += seconds
                self._values["timing_only_executions"] += timing_only
            return
        amounts = {
            "timing_only_executions": int(timing_only),
            "executions": 1,
            "instructions": prof.instructions,
            "device_seconds": seconds,
            "roofline_seconds": prof.roofline_ns * 1e-9,
            "throttled_seconds": prof.throttled_ns * 1e-9,
            "flops": prof.flops,
            "hw_flops": prof.hw_flops,
            "hbm_bytes": prof.hbm_bytes,
            "sbuf_bytes": prof.sbuf_read_bytes + prof.sbuf_write_bytes,
            "psum_bytes": prof.psum_read_bytes + prof.psum_write_bytes,
            "spill_bytes": prof.spill_bytes,
            "dma_bytes": prof.dma_bytes,
        }
        with self._lock:
            for key, amount in amounts.items():
                self._values[key] += amount
            for key in _WEIGHTED:
                self._weighted[key] += getattr(prof, key) * seconds
            for engine, ns in prof.engine_busy_ns.items():
                self._engine_busy[engine] += ns * 1e-9
            entry = self._graphs.setdefault(graph, {"executions": 0})
            entry.update(executions=entry["executions"] + 1, profile=prof, compiled=compiled)

    def executed(self) -> dict[str, Any]:
        """Per graph executed since the last reset: its CompiledExecutable."""
        with self._lock:
            return {name: g["compiled"] for name, g in self._graphs.items()}

    def add_fallback(self, op: str) -> bool:
        """Count one node of `op` that runs eagerly; True the first time since the last reset."""
        with self._lock:
            self._fallback[op] += 1
            first = op not in self._warned
            self._warned.add(op)
        return first

    def add_over_capacity(self, graph: str, hbm_bytes: int) -> bool:
        """A graph compiled for timing_only that needs more HBM than its target's core has;
        True the first time since the last reset."""
        with self._lock:
            first = graph not in self._over_capacity
            self._over_capacity[graph] = hbm_bytes
        return first

    def add_compiler_error(self, stage: str) -> None:
        """One graph (or region) that failed inside neuroncc at `stage` and ran eagerly
        (Note [internal errors]); fallback_nodes counts only ops declined for want of a
        lowering."""
        with self._lock:
            self._errors[stage] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                k: (v if k in _FLOAT else int(v)) for k, v in self._values.items()
            }
            device = self._values["device_seconds"]
            for key in _WEIGHTED:
                out[key] = self._weighted[key] / device if device else 0.0
            out["fallback_nodes"] = dict(self._fallback)
            out["compiler_errors"] = dict(self._errors)
            out["hbm_over_capacity"] = dict(self._over_capacity)
            out["engine_busy_seconds"] = dict(self._engine_busy)
            out["graphs"] = {
                name: {
                    "executions": g["executions"],
                    "device_seconds": g["profile"].device_ns * 1e-9,
                    "roofline_seconds": g["profile"].roofline_ns * 1e-9,
                    "mfu": g["profile"].mfu,
                    "hbm_needed_bytes": g["compiled"].exe.hbm_bytes,
                }
                for name, g in self._graphs.items()
            }
        return out


STATS = Stats()
