"""The default pipelines, one short list per opt_level. Pass names are also dump stage names.

Stages that design.md names but this version does not have as passes of their own yet (layout,
tile, plan) are absent: the emitters choose layouts, tiles and buffers for each kernel.
"""

from __future__ import annotations

from neuroncc.passes.autocast import AutoCast
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import Pass
from neuroncc.passes.schedule import Schedule
from neuroncc.passes.simplify import Simplify


def default_pipeline(opt_level: int, auto_cast: str | None = None) -> list[Pass]:
    first: list[Pass] = [AutoCast()] if auto_cast == "matmul" else []  # bf16 matmuls
    if opt_level == 0:
        return first  # one kernel per op, exactly as lowered
    if opt_level == 1:
        return [*first, Simplify()]  # canonicalise, CSE, DCE: fewer kernels, no identity copies
    return [*first, Simplify(), Fuse(), Schedule()]
