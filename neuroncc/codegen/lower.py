"""IR graph -> Executable: runs the emitter of every node, one kernel each."""

from __future__ import annotations

from neuroncc.codegen import emit_tensor  # noqa: F401  (registers matmul, reduce, movement)
from neuroncc.codegen.emit import EMITTERS, EmitCtx
from neuroncc.codegen.program import Executable
from neuroncc.codegen.targets import Target
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph
from neuroncc.ir.printer import format_node


def emit_graph(g: Graph, target: Target) -> Executable:
    ctx = EmitCtx(g, target)
    for n in g.nodes:
        with ctx.b.kernel(f"{n.op.value}.{n.out.id}"):
            try:
                EMITTERS[n.op](ctx, n)
            except CodegenError as e:
                raise type(e)(f"emitting {format_node(n)}: {e}") from None
    inputs = [ctx.loc[v.id] for v in g.inputs]
    outputs = [ctx.loc[v.id] for v in g.outputs]
    return ctx.b.finish(inputs, outputs)
