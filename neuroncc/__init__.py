"""neuroncc: a torch.compile backend for AWS NeuronCore, running on a NeuronCore simulator.

    model = torch.compile(model, backend="neuron", options={"target": "trn2"})

Public API: stats(), reset_stats(), CompileOptions, the error types, __version__.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from neuroncc.errors import (
    CapacityError,
    CodegenError,
    NeuronccError,
    OptionsError,
    RaceError,
    SimulationError,
    UnsupportedError,
)
from neuroncc.options import CompileOptions
from neuroncc.runtime.stats import STATS as _STATS


def stats() -> dict[str, Any]:
    """A snapshot of the counters accumulated since start or the last reset_stats()."""
    return _STATS.snapshot()


def reset_stats() -> None:
    _STATS.reset()


__all__ = [
    "CapacityError",
    "CodegenError",
    "CompileOptions",
    "NeuronccError",
    "OptionsError",
    "RaceError",
    "SimulationError",
    "UnsupportedError",
    "__version__",
    "reset_stats",
    "stats",
]
