"""The default pipelines, one short list per opt_level. Pass names are also dump stage names.

Stages that design.md names but this version does not have yet (layout, tile, plan, schedule)
are absent; the emitters tile each kernel themselves.
"""

from __future__ import annotations

from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import Pass
from neuroncc.passes.simplify import Simplify


def default_pipeline(opt_level: int) -> list[Pass]:
    if opt_level == 0:
        return []  # one kernel per op, exactly as lowered
    if opt_level == 1:
        return [Simplify()]  # canonicalise, CSE, DCE: fewer kernels, no identity copies
    return [Simplify(), Fuse()]
