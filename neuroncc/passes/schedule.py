"""schedule: the order kernels are issued in.

Each engine runs its instruction stream in order, so a kernel's place in the program decides
what it can overlap with. Work that depends only on the graph's inputs (a weight transposed for
the matmul that reads it) is issued first: it then runs on TensorE and the DMA queues while the
first kernels (a norm, mostly on VectorE and DMA) run, instead of sitting on the critical path
right before its reader. Only transposes move: they are the costly input-only kernels; a reshape
or broadcast of an input is free or belongs to a fused group.

Copies that only graph outputs read (a training forward saving tensors for its backward) go
the other way, to just before the last kernel with a matmul: issued where they stand, their
DMAs would sit in the queues ahead of the next kernels' loads.

Kernels (fused groups) stay whole and in their order; the moved nodes keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.ir.graph import Graph, Node
from neuroncc.ir.ops import Op
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Schedule:
    name: ClassVar[str] = "schedule"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        inputs = {v.id for v in g.inputs}
        in_kernel, users, outputs = g.kernel_of(), g.users(), {v.id for v in g.outputs}
        early = [
            n
            for n in g.nodes
            if n.op is Op.TRANSPOSE
            and n.out.id not in in_kernel
            and all(v.id in inputs for v in n.inputs)
            and not _only_outputs_read(n.out.id, users, outputs)  # (those go late)
        ]
        moved = {n.out.id for n in early}
        rest = [n for n in g.nodes if n.out.id not in moved]
        rest = _copies_for_outputs_late(rest, g)
        if not early and [n.out.id for n in rest] == [n.out.id for n in g.nodes]:
            return g
        return replace(g, nodes=(*early, *rest))


def _copies_for_outputs_late(nodes: list[Node], g: Graph) -> list[Node]:
    """Slices and transposes that only graph outputs read (a training forward saving Q, K
    and Vᵀ per head for the backward) move to just before the last kernel with a matmul, so
    their DMAs run beside its TensorE work instead of ahead of the next kernel's loads."""
    users, outputs, in_kernel = g.users(), {v.id for v in g.outputs}, g.kernel_of()

    def only_outputs(vid: int) -> bool:
        return _only_outputs_read(vid, users, outputs)

    at = {n.out.id: i for i, n in enumerate(nodes)}
    last = max((i for i, n in enumerate(nodes) if n.op is Op.MATMUL), default=0)
    kernel = in_kernel.get(nodes[last].out.id) if nodes else None
    while last > 0 and kernel is not None and in_kernel.get(nodes[last - 1].out.id) == kernel:
        last -= 1  # the kernel's first node
    late_ids = {
        n.out.id
        for n in nodes[:last]
        if n.op in (Op.SLICE, Op.TRANSPOSE) and n.out.id not in in_kernel and only_outputs(n.out.id)
    }
    for n in nodes[:last]:  # their reshapes come with them
        if n.op is Op.RESHAPE and n.inputs[0].id in late_ids:
            late_ids.add(n.out.id)
    if not late_ids:
        return nodes
    late = sorted((nodes[at[vid]] for vid in late_ids), key=lambda n: at[n.out.id])
    before = [n for n in nodes[:last] if n.out.id not in late_ids]
    after = nodes[last:]
    return [*before, *late, *after]


def _only_outputs_read(vid: int, users: dict, outputs: set[int]) -> bool:
    """vid is read by nothing but reshapes like it, and is a graph output (or they are)."""
    readers = users[vid]
    if not all(
        u.op is Op.RESHAPE and _only_outputs_read(u.out.id, users, outputs) for u in readers
    ):
        return False
    return vid in outputs or bool(readers)
