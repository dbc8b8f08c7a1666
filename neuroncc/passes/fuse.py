"""fuse: group runs of elementwise ops, broadcasts and trailing reductions into row kernels
(codegen/emit_fused.py), so softmax, LayerNorm, RMSNorm and elementwise chains each read their
inputs from HBM once and write their results once.

The decision is the cost model's: a group forms only where codegen can emit it within the
target's SBUF (`emit_fused.plan`), and only where it saves HBM traffic, i.e. some value made in
the group is used only inside it. Groups are runs of consecutive nodes (consecutive nodes are
always a convex set, so no value leaves and re-enters a kernel); the IR order from the lowering
keeps each normalisation's chain together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.codegen.emit_fused import fusible, plan
from neuroncc.ir.graph import Graph, Node
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Fuse:
    name: ClassVar[str] = "fuse"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        users = g.users()
        outputs = {v.id for v in g.outputs}
        kernels: list[tuple[int, ...]] = []
        run: list[Node] = []

        def close() -> None:
            if len(run) >= 2 and _saves_traffic(run, users, outputs):
                kernels.append(tuple(n.out.id for n in run))

        for n in g.nodes:
            if fusible(n) and plan([*run, n], ctx.target) is not None:
                run.append(n)
                continue
            close()
            run = [n] if fusible(n) and plan([n], ctx.target) is not None else []
        close()
        return replace(g, kernels=tuple(kernels))


def _saves_traffic(run: list[Node], users: dict, outputs: set[int]) -> bool:
    inside = {n.out.id for n in run}
    return any(
        n.out.id not in outputs and all(u.out.id in inside for u in users[n.out.id]) for n in run
    )
