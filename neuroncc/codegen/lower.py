"""IR graph -> Executable: one kernel per fused group (emit_fused) or per remaining node."""

from __future__ import annotations

from neuroncc.codegen import emit_matmul, emit_tensor  # noqa: F401  (register the emitters)
from neuroncc.codegen.emit import EMITTERS, EmitCtx
from neuroncc.codegen.emit_attention import (
    AttentionPlan,
    attention_plans,
    emit_attention,
    fold_operand_views,
    with_key_facts,
)
from neuroncc.codegen.emit_fused import emit_fused
from neuroncc.codegen.program import Executable
from neuroncc.codegen.targets import Target
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph
from neuroncc.ir.ops import Op
from neuroncc.ir.printer import format_node


def emit_graph(g: Graph, target: Target) -> Executable:
    ctx = EmitCtx(g, target)
    nodes = list(g.nodes)
    start = {ids[0]: ids for ids in g.kernels}
    attention: dict[int, AttentionPlan] = {}
    for first, ap in attention_plans(g, target).items():
        if ap is None:
            raise CodegenError("the fuse pass formed an attention group codegen rejects")
        attention[first] = with_key_facts(g, ap)
    ctx.views, skipped = fold_operand_views(g, list(attention.values()))
    i = 0
    while i < len(nodes):
        n = nodes[i]
        if n.out.id in skipped:  # read in place by an attention kernel
            i += 1
            continue
        ids = start.get(n.out.id)
        if ids is not None:
            group = nodes[i : i + len(ids)]
            ap = attention.get(n.out.id)
            kind = "attention" if ap else "fused"
            with ctx.b.kernel(f"{kind}.{n.out.id}-{group[-1].out.id}"):
                if ap is not None:
                    emit_attention(ctx, ap)  # Note [attention kernel]
                elif n.op is Op.MATMUL:
                    emit_matmul.emit_matmul(ctx, n, group[1:])  # Note [matmul epilogue]
                else:
                    emit_fused(ctx, group)
            i += len(group)
            continue
        with ctx.b.kernel(f"{n.op.value}.{n.out.id}"):
            try:
                EMITTERS[n.op](ctx, n)
            except CodegenError as e:
                raise type(e)(f"emitting {format_node(n)}: {e}") from None
        i += 1
    inputs = [ctx.loc[v.id] for v in g.inputs]
    outputs = [ctx.loc[v.id] for v in g.outputs]
    return ctx.b.finish(inputs, outputs)
