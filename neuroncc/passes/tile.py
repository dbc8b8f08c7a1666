"""tile: the block sizes of each matmul, recorded as the node's `tile` choice [TM, TN].

A matmul block is TM row tiles of 128 (its A^T kept in SBUF over all of K) by TN column tiles
of 512 (one fp32 PSUM bank each, accumulating over K); each step over K loads one [128, TN x
512] tile of B and issues TM x TN matmuls (Note [matmul blocking] in emit_matmul.py). B is
read from HBM once per M block, so HBM traffic falls as 1/TM and a step's DMA shrinks against
its TensorE time, while a wider TN makes B's rows longer (fewer DMA descriptors). The pass
prices each TM that the PSUM banks and the SBUF left beside a fused epilogue allow, with as many
N tiles as the remaining banks hold (emit_matmul.blocked_ns: TensorE against the DMA queues),
and takes the cheapest; of equals, the largest TM. The limits are the
target's (PSUM banks, SBUF bytes per partition, the 128 x 512 moving tile) and the layout
pass's choice for A (a folded transpose leaves A^T in HBM: no PSUM bank goes to transposing).

Matmuls inside attention kernels are tiled by that kernel (emit_attention.py); those whose W^T
the layout pass made dot products (layout=dot) need no blocks. Without this pass (opt_level <
2) codegen runs every matmul one [128, 512] output tile at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from neuroncc.codegen.kernels.emit_matmul import blocked_ns, matmul_blockings
from neuroncc.ir.graph import Graph, Node, with_choices
from neuroncc.ir.ops import Op
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Tile:
    name: ClassVar[str] = "tile"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        epilogues = _epilogues(g)
        made: dict[int, tuple[int, int]] = {}
        for n in g.nodes:
            if epilogues.get(n.out.id) is None:  # not a matmul, or inside attention
                continue
            if g.choice(n.inputs[1].id, "layout") == "dot":
                continue  # dot products on Vector/GpSimd (emit_gemv.py): no blocks
            a_transposed = g.choice(n.inputs[0].id, "layout") == "fold"
            b_transposed = g.choice(n.inputs[1].id, "layout") == "fold"
            fitting = matmul_blockings(
                n, epilogues[n.out.id], a_transposed, ctx.target, b_transposed
            )
            if fitting:  # the fastest by the cost model; of equals, the largest TM
                ns = [blocked_ns(n, b, ctx.target, a_transposed, b_transposed) for b in fitting]
                best = fitting[ns.index(min(ns))]
                made[n.out.id] = (best.tm, best.tn)
        return with_choices(g, "tile", made) if made else g


def _epilogues(g: Graph) -> dict[int, list[Node] | None]:
    """Matmul id -> the nodes fused after it (its epilogue: [] for a matmul alone), or None
    for the matmuls of an attention kernel."""
    kernel_of = g.kernel_of()
    found: dict[int, list[Node] | None] = {
        n.out.id: [] for n in g.nodes if n.op is Op.MATMUL and n.out.id not in kernel_of
    }
    for group in g.kernel_groups():
        matmuls = [n for n in group if n.op is Op.MATMUL]
        if len(matmuls) > 1:  # attention
            found.update(dict.fromkeys((n.out.id for n in matmuls), None))
        elif matmuls:  # a matmul heads its epilogue group (passes/fuse.py)
            found[matmuls[0].out.id] = group[1:]
    return found
