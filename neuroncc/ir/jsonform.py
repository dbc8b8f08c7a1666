"""Graph <-> JSON-able data: the tensor IR for tools that do not parse text (neuroncc-dump
--format json). `graph_from_json(graph_to_json(g)) == g`, fused kernels and choices included; loading
re-types every node with its shape rule and verifies the graph, as the text parser does.

    {"name": "main", "inputs": [{"id": 0, "type": "f32[4,8]"}],
     "nodes": [{"out": 2, "op": "add", "inputs": [0, 1], "attrs": {}, "type": "f32[4,8]"}],
     "outputs": [2], "kernels": [[2, 3]], "choices": [[2, {"hbm": 0}]]}

Attributes are JSON values by kind: dtype names, int lists, ints, names; scalars are numbers,
or the strings "inf", "-inf", "nan" (JSON has no such numbers).
"""

from __future__ import annotations

import math
from typing import Any

from neuroncc.ir.graph import CHOICES, Graph, Node, Value, make_attrs, normalize_attr
from neuroncc.ir.ops import BY_NAME
from neuroncc.ir.parser import parse_type
from neuroncc.ir.types import DType
from neuroncc.ir.verify import verify


def _attr_to_json(value: Any) -> Any:
    if isinstance(value, DType):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _attr_from_json(kind: str, value: Any) -> Any:
    if kind == "dtype":
        return DType(value)
    if kind == "scalar" and isinstance(value, str):
        return float(value)  # "inf", "-inf", "nan"
    return value


def graph_to_json(g: Graph) -> dict[str, Any]:
    return {
        "name": g.name,
        "inputs": [{"id": v.id, "type": str(v.type)} for v in g.inputs],
        "nodes": [
            {
                "out": n.out.id,
                "op": n.op.value,
                "inputs": [v.id for v in n.inputs],
                "attrs": {k: _attr_to_json(v) for k, v in n.attrs},
                "type": str(n.out.type),
            }
            for n in g.nodes
        ],
        "outputs": [v.id for v in g.outputs],
        "kernels": [list(k) for k in g.kernels],
        "choices": [[vid, {k: _attr_to_json(v) for k, v in kv}] for vid, kv in g.choices],
    }


def graph_from_json(data: dict[str, Any]) -> Graph:
    """The graph in data; ValueError (naming the node) if it is not a valid graph."""
    try:
        values = {d["id"]: Value(d["id"], parse_type(d["type"])) for d in data["inputs"]}
        inputs = tuple(values.values())
        nodes = []
        for d in data["nodes"]:
            op = BY_NAME.get(d["op"])
            if op is None:
                raise ValueError(f"node %{d['out']}: unknown op {d['op']!r}")
            schema = op.info.attrs
            attrs = {k: _attr_from_json(schema.get(k, ""), v) for k, v in d["attrs"].items()}
            ins = tuple(values[i] for i in d["inputs"])
            out = Value(d["out"], parse_type(d["type"]))
            nodes.append(Node(op, ins, make_attrs(op, attrs), out))
            values[out.id] = out
        g = Graph(
            name=data["name"],
            inputs=inputs,
            nodes=tuple(nodes),
            outputs=tuple(values[i] for i in data["outputs"]),
            kernels=tuple(tuple(k) for k in data.get("kernels", ())),
            choices=tuple(
                (vid, tuple(sorted((k, normalize_attr(CHOICES[k][0], v)) for k, v in kv.items())))
                for vid, kv in data.get("choices", ())
            ),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a neuroncc graph: {type(e).__name__}: {e}") from None
    return verify(g)
