"""schedule: the order kernels are issued in.

Each engine runs its instruction stream in order, so a kernel's place in the program decides
what it can overlap with. Work that depends only on the graph's inputs (a weight transposed for
the matmul that reads it) is issued first: it then runs on TensorE and the DMA queues while the
first kernels (a norm, mostly on VectorE and DMA) run, instead of sitting on the critical path
right before its reader. Only transposes move: they are the costly input-only kernels; a reshape
or broadcast of an input is free or belongs to a fused group.

Kernels (fused groups) stay whole and in their order; the moved nodes keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.ir.graph import Graph
from neuroncc.ir.ops import Op
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Schedule:
    name: ClassVar[str] = "schedule"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        inputs = {v.id for v in g.inputs}
        in_kernel = g.kernel_of()
        early = [
            n
            for n in g.nodes
            if n.op is Op.TRANSPOSE
            and n.out.id not in in_kernel
            and all(v.id in inputs for v in n.inputs)
        ]
        if not early:
            return g
        moved = {n.out.id for n in early}
        rest = [n for n in g.nodes if n.out.id not in moved]
        return replace(g, nodes=(*early, *rest))
