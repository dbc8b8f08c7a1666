"""The NeuronCore simulator: executes an executable's instructions on simulated memories.

`run` binds the inputs into HBM, executes every instruction's semantics in program order (a
valid order: deps only point backwards and each engine's stream is in order), checks every
cross-engine hazard against the declared dependencies, and reads the outputs back from HBM.
Results come only from executing instructions; nothing here calls PyTorch or the IR interpreter.

A run prepares each instruction's step (semantics.py: checks and operand views) and runs it.
The steps are kept with the memories (memory.Kept), and a run without the race checker runs
the kept steps of its executable's last run: what is left of an instruction is its arithmetic.
A checked run also proves whether the program reads only bytes it wrote (written.py); the
later runs of one that does skip resetting the memories.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import SimulationError
from neuroncc.runtime.memory import Memories, prove_reads_only_written
from neuroncc.runtime.races import RaceChecker
from neuroncc.runtime.semantics import PREPARE
from neuroncc.runtime.written import WrittenBytes


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
    with np.errstate(all="ignore"):  # IEEE results (inf, nan), as the engines give them
        if mem.kept.steps is None or check_races:
            mem.kept.steps = _prepare_and_run(exe, mem, target, check_races)
        else:
            i = 0
            try:
                for i, step in enumerate(mem.kept.steps):
                    step()
            except SimulationError as e:
                raise _at(exe, i, e) from None
    return [mem.read_buffer(loc.buffer, loc.shape) for loc in exe.outputs]


def _prepare_and_run(exe: Executable, mem: Memories, target: Target, check_races: bool) -> list:
    """Prepares and runs each instruction's step, with the checks of a checked run; returns the
    steps."""
    races = RaceChecker(exe.buffers) if check_races else None
    written = WrittenBytes(mem) if check_races else None
    steps = []
    for i, ins in enumerate(exe.instructions):
        if races is not None:
            races.check(i, ins)
        try:
            if written is not None:
                written.record(ins)
            step = PREPARE[ins.opcode](mem, ins, target)
            step()
        except SimulationError as e:
            raise _at(exe, i, e) from None
        steps.append(step)
    if written is not None and written.outputs_read(exe):
        prove_reads_only_written(exe)
    return steps


def _at(exe: Executable, i: int, e: SimulationError) -> SimulationError:
    ins = exe.instructions[i]
    return SimulationError(f"instruction {i} ({ins.opcode} on {ins.engine}): {e}")
