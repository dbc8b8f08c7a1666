"""The verifier: checks a Graph's invariants (see graph.py) and explains any breach.

Checked: every value defined once and before use; arity; the attribute schema; every node's
recorded type equals its shape rule's result; outputs are defined; fused kernels are disjoint
runs of consecutive nodes; choices name nodes and fit their ops. An error names the node and
prints the lines of the graph around it, so it can be read without a debugger.
"""

from __future__ import annotations

from neuroncc.ir.graph import CHOICES, LAYOUTS, Graph, Node, make_attrs
from neuroncc.ir.printer import format_node
from neuroncc.ir.types import TensorType


class VerifyError(ValueError):
    def __init__(self, message: str, graph: Graph, index: int | None) -> None:
        self.node_index = index
        super().__init__(f"{message}\n{_context(graph, index)}")


def _context(g: Graph, index: int | None, radius: int = 3) -> str:
    if index is None:
        return "  (graph outputs)"
    lo, hi = max(0, index - radius), min(len(g.nodes), index + radius + 1)
    lines = []
    for i in range(lo, hi):
        mark = ">>" if i == index else "  "
        lines.append(f"{mark} {format_node(g.nodes[i])}")
    return "\n".join(lines)


def _check_node(n: Node, defined: dict[int, TensorType]) -> str | None:
    info = n.op.info
    if info.arity >= 0 and len(n.inputs) != info.arity:
        return f"{n.op.value} takes {info.arity} inputs, got {len(n.inputs)}"
    for v in n.inputs:
        if v.id not in defined:
            return f"{v} is used before it is defined"
        if defined[v.id] != v.type:
            return f"{v} is used as {v.type} but defined as {defined[v.id]}"
    try:
        if make_attrs(n.op, n.attr_dict) != n.attrs:
            return f"attributes of {n.op.value} are not in canonical form"
        want = info.rule([v.type for v in n.inputs], n.attr_dict)
    except (TypeError, ValueError) as e:
        return str(e)
    if want != n.out.type:
        return f"result type {n.out.type} disagrees with the shape rule of {n.op.value} ({want})"
    if n.out.id in defined:
        return f"{n.out} is defined twice"
    return None


def verify(g: Graph) -> Graph:
    """Return g unchanged if it is well formed, else raise VerifyError."""
    defined: dict[int, TensorType] = {}
    for v in g.inputs:
        if v.id in defined:
            raise VerifyError(f"graph input {v} is defined twice", g, None)
        defined[v.id] = v.type
    for i, n in enumerate(g.nodes):
        problem = _check_node(n, defined)
        if problem:
            raise VerifyError(f"verify: node {i} ({n.out}): {problem}", g, i)
        defined[n.out.id] = n.out.type
    for v in g.outputs:
        if v.id not in defined:
            raise VerifyError(f"verify: output {v} is not defined", g, None)
    _check_kernels(g)
    _check_choices(g)
    return g


def _check_choices(g: Graph) -> None:
    """Choices name nodes, use known keys, and fit the node's op (graph.CHOICES)."""
    position = {n.out.id: i for i, n in enumerate(g.nodes)}
    for vid, kv in g.choices:
        i = position.get(vid)
        if i is None:
            raise VerifyError(f"verify: choices name %{vid}, which is not a node", g, None)
        n = g.nodes[i]
        for key, value in kv:
            problem = _choice_problem(n, key, value)
            if problem:
                raise VerifyError(f"verify: node {i} ({n.out}): choice {key}: {problem}", g, i)


def _choice_problem(n: Node, key: str, value: object) -> str | None:
    if key not in CHOICES:
        return f"unknown; known: {', '.join(CHOICES)}"
    op = CHOICES[key][1]
    if op is not None and n.op is not op:
        return f"applies to {op.value} only"
    if key == "layout" and value not in LAYOUTS:
        return f"{value!r} is not one of {', '.join(LAYOUTS)}"
    if key == "tile" and not (isinstance(value, tuple) and len(value) == 2 and min(value) >= 1):
        return f"{value!r} is not [TM, TN] with TM, TN >= 1"
    if key == "hbm" and not (isinstance(value, int) and value >= 0):
        return f"{value!r} is not a byte offset"
    return None


def _check_kernels(g: Graph) -> None:
    """Fused kernels: disjoint groups of consecutive nodes."""
    position = {n.out.id: i for i, n in enumerate(g.nodes)}
    seen: set[int] = set()
    for k, ids in enumerate(g.kernels):
        where = [position.get(vid) for vid in ids]
        if not ids or None in where:
            raise VerifyError(f"verify: fused kernel {k} names values that are not nodes", g, None)
        if where != list(range(where[0], where[0] + len(ids))):
            raise VerifyError(f"verify: fused kernel {k} is not consecutive nodes", g, where[0])
        if seen & set(ids):
            raise VerifyError(f"verify: fused kernel {k} overlaps another", g, where[0])
        seen |= set(ids)
