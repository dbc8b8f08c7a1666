"""The default pipelines, one short list per opt_level. Pass names are also dump stage names.

Stages that design.md names but this version does not have yet (fuse, layout, tile, plan,
schedule) are absent: every opt level then lowers one kernel per op, tiled by the emitters.
"""

from __future__ import annotations

from neuroncc.passes.manager import Pass
from neuroncc.passes.simplify import Simplify


def default_pipeline(opt_level: int) -> list[Pass]:
    if opt_level == 0:
        return []  # one kernel per op, exactly as lowered
    return [
        Simplify(),  # canonicalise, CSE, DCE: fewer kernels, no identity copies
    ]
