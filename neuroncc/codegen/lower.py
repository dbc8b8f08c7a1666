"""IR graph -> Executable: one kernel per fused group (emit_fused) or per remaining node."""

from __future__ import annotations

from neuroncc.codegen import emit_matmul, emit_tensor  # noqa: F401  (register the emitters)
from neuroncc.codegen.emit import EMITTERS, EmitCtx
from neuroncc.codegen.emit_attention import attention_plan, emit_attention
from neuroncc.codegen.emit_fused import emit_fused
from neuroncc.codegen.program import Executable
from neuroncc.codegen.targets import Target
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph
from neuroncc.ir.ops import Op
from neuroncc.ir.printer import format_node


def emit_graph(g: Graph, target: Target) -> Executable:
    ctx = EmitCtx(g, target)
    kernel_of = g.kernel_of()
    nodes = list(g.nodes)
    i = 0
    while i < len(nodes):
        n = nodes[i]
        k = kernel_of.get(n.out.id)
        if k is not None:
            group = nodes[i : i + len(g.kernels[k])]
            attention = None
            if n.op is Op.MATMUL and group[-1].op is Op.MATMUL and len(group) > 1:
                attention = attention_plan(group, ctx.users, ctx._output_ids, target)
                if attention is None:
                    raise CodegenError("the fuse pass formed an attention group codegen rejects")
            kind = "attention" if attention else "fused"
            with ctx.b.kernel(f"{kind}.{n.out.id}-{group[-1].out.id}"):
                if attention is not None:
                    emit_attention(ctx, attention)  # Note [attention kernel]
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
