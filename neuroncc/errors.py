"""neuroncc's error types. Each names the stage it comes from; messages say what was wrong and
what is allowed."""

from __future__ import annotations


class NeuronccError(Exception):
    """Base of every error neuroncc raises on purpose."""

    stage = "neuroncc"


class OptionsError(NeuronccError, ValueError):
    stage = "options"


class UnsupportedError(NeuronccError):
    """The graph uses something neuroncc cannot compile (an ATen op without a lowering, a
    dtype the engines do not have, a symbolic shape where a static one is needed)."""

    stage = "nir"

    def __init__(self, message: str, op: str | None = None) -> None:
        self.op = op
        super().__init__(message)


class CodegenError(NeuronccError):
    stage = "program"


class CapacityError(CodegenError):
    """The graph's tensors do not fit the target's HBM. Never a reason to fall back: the same
    model would not fit the device either."""


class SimulationError(NeuronccError):
    """The simulator found the executable wrong: out-of-bounds access, capacity, or a race."""

    stage = "simulate"


class RaceError(SimulationError):
    pass
