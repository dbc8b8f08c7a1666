"""The canonical text form of a Graph: one line per node, types inline.

    graph @main(%0: f32[4,8], %1: f32[8]) {
      %2 = broadcast %1 {shape=[4,8]} : f32[4,8]
      %3 = add %0, %2 : f32[4,8]
      return %3
    }

Nodes the fuse pass grouped into one kernel are printed inside a `fuse {` ... `}` block; the
choices later passes made for a node follow its type in brackets:

      %5 = transpose %4 {perm=[1,0]} : f32[8,4] [layout=pe, hbm=4096]

The text is canonical: equal graphs print equally, so it also serves as the cache key and the
golden-file format. `parser.parse` reads it back: parse(print_graph(g)) == g.
"""

from __future__ import annotations

from neuroncc.ir.graph import AttrValue, Graph, Node
from neuroncc.ir.types import DType


def format_attr(value: AttrValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, DType):
        return value.value
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return repr(value)


def format_node(n: Node) -> str:
    text = f"{n.out} = {n.op.value}"
    if n.inputs:
        text += " " + ", ".join(str(v) for v in n.inputs)
    if n.attrs:
        text += " {" + ", ".join(f"{k}={format_attr(v)}" for k, v in n.attrs) + "}"
    return f"{text} : {n.out.type}"


def print_graph(g: Graph) -> str:
    params = ", ".join(f"{v}: {v.type}" for v in g.inputs)
    lines = [f"graph @{g.name}({params}) {{"]
    kernel_of = g.kernel_of()
    chosen = dict(g.choices)
    current = None
    for n in g.nodes:
        k = kernel_of.get(n.out.id)
        if k != current and current is not None:
            lines.append("  }")
        if k != current and k is not None:
            lines.append("  fuse {")
        current = k
        line = ("    " if k is not None else "  ") + format_node(n)
        if n.out.id in chosen:
            line += " [" + ", ".join(f"{k}={format_attr(v)}" for k, v in chosen[n.out.id]) + "]"
        lines.append(line)
    if current is not None:
        lines.append("  }")
    lines.append("  return " + ", ".join(str(v) for v in g.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"
