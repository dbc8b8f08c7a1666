"""Executable -> callable on torch tensors.

Binding converts torch tensors to numpy arrays (bf16 through ml_dtypes, bit for bit), runs the
simulator and converts the outputs back. The race checker runs on an executable's first
execution: addresses and dependencies are static, so one clean run proves every run clean.
The timing profile is computed once per executable and reused.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
import torch

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.runtime import simulator
from neuroncc.runtime.stats import STATS
from neuroncc.runtime.timing import Profile, time_executable, trace_events


def to_numpy(t: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    a = np.asarray(a, order="C")  # ascontiguousarray would make 0-d arrays 1-d
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class CompiledExecutable:
    def __init__(self, exe: Executable, profile: Profile | None = None) -> None:
        self.exe = exe
        self.target = get_target(exe.target)
        self._profile = profile
        self._verified = False

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            self._profile = time_executable(self.exe, self.target)
        return self._profile

    def run(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        arrays = [to_numpy(a) for a in args]
        outs = simulator.run(self.exe, arrays, self.target, check_races=not self._verified)
        self._verified = True
        STATS.add_execution(self.exe.name, self.profile, self)
        return [to_torch(o) for o in outs]

    def record_timing_only(self) -> None:
        """An execution that was timed, not simulated (CompileOptions.timing_only)."""
        STATS.add_execution(self.exe.name, self.profile, self, timing_only=True)

    def trace_events(self, pid: int = 0) -> dict:
        """This executable's schedule in Chrome trace-event format (see timing.trace_events)."""
        return trace_events(self.exe, self.target, pid)
