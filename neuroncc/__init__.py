"""neuroncc: a torch.compile backend for AWS NeuronCore, running on a NeuronCore simulator.

    model = torch.compile(model, backend="neuron", options={"target": "trn2"})

Public API: stats(), reset_stats(), profiles(), write_trace(), record() (a warmup manifest of
the graphs compiled in a block), CompileOptions, the error types, __version__.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from neuroncc.errors import (
    CapacityError,
    CodegenError,
    NeuronccError,
    NeuronccInternalError,
    OptionsError,
    RaceError,
    SimulationError,
    UnsupportedError,
)
from neuroncc.runtime.stats import STATS as _STATS


def __getattr__(name: str) -> Any:
    # CompileOptions imports pydantic (0.2 s): loaded on first use, so that the `neuron`
    # device's autoload on every `import torch` stays cheap (neuroncc.device)
    if name == "CompileOptions":
        from neuroncc.options import CompileOptions

        return CompileOptions
    raise AttributeError(f"module 'neuroncc' has no attribute {name!r}")


def stats() -> dict[str, Any]:
    """A snapshot of the counters accumulated since start or the last reset_stats()."""
    return _STATS.snapshot()


def reset_stats() -> None:
    _STATS.reset()


def profiles() -> dict[str, Any]:
    """Per compiled graph executed since the last reset: its timing.Profile (device time,
    per-engine busy time, MFU/HFU, memory traffic, roofline)."""
    return {name: c.profile for name, c in _STATS.executed().items()}


def record(path: str) -> Any:
    """`with neuroncc.record("graphs.jsonl"): run()` writes every graph neuroncc compiles in the
    block to a manifest, which `neuroncc-warmup compile graphs.jsonl` compiles into the cache."""
    from neuroncc.frontend.recording import record as _record

    return _record(path)


def write_trace(path: str) -> str:
    """Write the simulated schedule of every graph executed since the last reset as one
    Chrome trace-event file (open it in Perfetto or chrome://tracing): a process per graph,
    a track per engine and DMA queue. Returns the path."""
    import json

    events: list = []
    for pid, compiled in enumerate(_STATS.executed().values()):
        events += compiled.trace_events(pid)["traceEvents"]
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    return path


__all__ = [
    "CapacityError",
    "CodegenError",
    "CompileOptions",
    "NeuronccError",
    "NeuronccInternalError",
    "OptionsError",
    "RaceError",
    "SimulationError",
    "UnsupportedError",
    "__version__",
    "profiles",
    "record",
    "reset_stats",
    "stats",
    "write_trace",
]
