"""The default pipelines, one short list per opt_level. Pass names are also dump stage names.

plan comes after schedule, not before as design.md lists the stages: the lifetimes it packs
into HBM depend on the order kernels are issued in, which schedule decides.
"""

from __future__ import annotations

from neuroncc.passes.autocast import AutoCast
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.layout import Layout
from neuroncc.passes.manager import Pass
from neuroncc.passes.plan import Plan
from neuroncc.passes.schedule import Schedule
from neuroncc.passes.simplify import Simplify
from neuroncc.passes.tile import Tile


def default_pipeline(opt_level: int, auto_cast: str | None = None) -> list[Pass]:
    first: list[Pass] = [AutoCast()] if auto_cast == "matmul" else []  # bf16 matmuls
    if opt_level == 0:
        return first  # one kernel per op, exactly as lowered
    if opt_level == 1:
        return [*first, Simplify()]  # canonicalise, CSE, DCE: fewer kernels, no identity copies
    return [
        *first,
        Simplify(),
        Fuse(),  # kernels that keep intermediates on chip
        Layout(),  # where each transpose happens
        Tile(),  # matmul block sizes
        Schedule(),  # the order kernels are issued in
        Plan(),  # HBM offsets: temporaries with disjoint lifetimes share bytes
    ]
