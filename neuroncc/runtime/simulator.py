"""The NeuronCore simulator: executes an executable's instructions on simulated memories.

`run` binds the inputs into HBM, executes every instruction's semantics in program order (a
valid order: deps only point backwards and each engine's stream is in order), checks every
cross-engine hazard against the declared dependencies, and reads the outputs back from HBM.
Results come only from executing instructions; nothing here calls PyTorch or the IR interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neuroncc.codegen.program import Executable
from neuroncc.codegen.targets import Target
from neuroncc.errors import SimulationError
from neuroncc.runtime.memory import Memories
from neuroncc.runtime.races import RaceChecker
from neuroncc.runtime.semantics import SEMANTICS


def run(
    exe: Executable, inputs: Sequence[np.ndarray], target: Target, check_races: bool = True
) -> list[np.ndarray]:
    if target.name != exe.target:
        raise SimulationError(f"executable was built for {exe.target}, not {target.name}")
    if len(inputs) != len(exe.inputs):
        raise SimulationError(f"executable takes {len(exe.inputs)} inputs, got {len(inputs)}")
    mem = Memories(exe, target, checked=check_races)
    for loc, x in zip(exe.inputs, inputs, strict=True):
        if x.shape != loc.shape or x.dtype != loc.dtype.numpy:
            raise SimulationError(
                f"input for {loc.buffer} must be {loc.dtype.value}{list(loc.shape)}, "
                f"got {x.dtype}{list(x.shape)}"
            )
        mem.write_buffer(loc.buffer, x)
    races = RaceChecker(exe.buffers) if check_races else None
    for i, ins in enumerate(exe.instructions):
        if races is not None:
            races.check(i, ins)
        try:
            SEMANTICS[ins.opcode](mem, ins, target)
        except SimulationError as e:
            raise SimulationError(f"instruction {i} ({ins.opcode} on {ins.engine}): {e}") from None
    return [mem.read_buffer(loc.buffer, loc.shape) for loc in exe.outputs]
