"""The tensor IR graph: a flat SSA list of immutable nodes with static types.

Invariants:
- every Value is defined once: by a graph input or by exactly one Node (`node.out`);
- nodes are in a topological order: a node only uses values defined before it;
- a node's `out.type` is what its op's shape rule gives for its inputs and attributes;
- attributes are stored in the op table's schema order, normalised to hashable Python values;
- `kernels` (set by the fuse pass) groups nodes into fused kernels: each group lists the output
  ids of consecutive nodes, groups are disjoint. Grouping never changes what the graph computes,
  only how codegen emits it: one kernel per group, its internal values kept on chip.
- `choices` (set by the layout, tile and plan passes) records, per node, how codegen is to emit
  it: keys from CHOICES, at most one value per key. Like kernels, choices never change what the
  graph computes; a graph without them (opt_level 0) gets codegen's plain defaults.

Graphs are never edited in place: passes build new graphs with a GraphBuilder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, TensorType

AttrValue = int | float | bool | str | DType | tuple[int, ...]

# The choices a pass may record for codegen: key -> (attribute kind, the op it applies to, or
# None for any op).
CHOICES: dict[str, tuple[str, Op | None]] = {
    "layout": ("name", Op.TRANSPOSE),  # fold | dot | pe | dma (passes/layout.py)
    "tile": ("ints", Op.MATMUL),  # [TM, TN] 128-row and 512-column tiles per block (tile.py)
    "hbm": ("int", None),  # byte offset in the temporaries' arena (passes/plan.py)
}
LAYOUTS = ("fold", "dot", "pe", "dma")
Choices = tuple[tuple[int, tuple[tuple[str, AttrValue], ...]], ...]


@dataclass(frozen=True)
class Value:
    id: int
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.id}"


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[Value, ...]
    attrs: tuple[tuple[str, AttrValue], ...]
    out: Value

    def attr(self, name: str) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        raise KeyError(f"{self.op.value} has no attribute {name!r}")

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    kernels: tuple[tuple[int, ...], ...] = ()
    choices: Choices = ()  # (value id, ((key, value), ...)), sorted by id and key

    def choice(self, vid: int, key: str) -> Any:
        """The choice recorded for node `vid` under `key`, or None."""
        return self._choice_table.get((vid, key))

    @cached_property
    def _choice_table(self) -> dict[tuple[int, str], AttrValue]:
        return {(v, k): x for v, kv in self.choices for k, x in kv}

    def kernel_groups(self) -> list[list[Node]]:
        """The nodes of each fused kernel, in kernel order."""
        index = {n.out.id: i for i, n in enumerate(self.nodes)}
        return [list(self.nodes[index[ids[0]] : index[ids[0]] + len(ids)]) for ids in self.kernels]

    def kernel_of(self) -> dict[int, int]:
        """Node output id -> index of its fused kernel (nodes in no kernel are absent)."""
        return {vid: k for k, ids in enumerate(self.kernels) for vid in ids}

    def producers(self) -> dict[int, Node]:
        return {n.out.id: n for n in self.nodes}

    def users(self) -> dict[int, list[Node]]:
        uses: dict[int, list[Node]] = {v.id: [] for v in self.inputs}
        for n in self.nodes:
            uses[n.out.id] = []
        for n in self.nodes:
            for v in n.inputs:
                uses[v.id].append(n)
        return uses


def normalize_attr(kind: str, value: Any) -> AttrValue:
    if kind == "ints":
        return tuple(int(v) for v in value)
    if kind == "int":
        return int(value)
    if kind == "bool":
        return bool(value)
    if kind == "dtype":
        if not isinstance(value, DType):
            raise TypeError(f"expected a DType, got {value!r}")
        return value
    if kind == "name":
        if not isinstance(value, str) or not value.isidentifier():
            raise TypeError(f"expected an identifier, got {value!r}")
        return value
    if kind == "scalar":
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        return float(value)
    raise TypeError(f"unknown attribute kind {kind!r}")


def make_attrs(op: Op, attrs: Mapping[str, Any]) -> tuple[tuple[str, AttrValue], ...]:
    schema = op.info.attrs
    unknown = set(attrs) - set(schema)
    missing = set(schema) - set(attrs)
    if unknown or missing:
        raise TypeError(
            f"{op.value}: attributes are {sorted(schema)}; "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return tuple((k, normalize_attr(kind, attrs[k])) for k, kind in schema.items())


class GraphBuilder:
    """Builds a Graph node by node, typing each node with its op's shape rule as it goes."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self._inputs: list[Value] = []
        self._nodes: list[Node] = []
        self._next_id = 0

    def _fresh(self, t: TensorType) -> Value:
        v = Value(self._next_id, t)
        self._next_id += 1
        return v

    def input(self, t: TensorType) -> Value:
        v = self._fresh(t)
        self._inputs.append(v)
        return v

    def op(self, op: Op, *inputs: Value, **attrs: Any) -> Value:
        info = op.info
        if info.arity >= 0 and len(inputs) != info.arity:
            raise TypeError(f"{op.value} takes {info.arity} inputs, got {len(inputs)}")
        if info.arity < 0 and not inputs:
            raise TypeError(f"{op.value} needs at least one input")
        norm = make_attrs(op, attrs)
        t = info.rule([v.type for v in inputs], dict(norm))
        out = self._fresh(t)
        self._nodes.append(Node(op, tuple(inputs), norm, out))
        return out

    def build(self, outputs: Sequence[Value]) -> Graph:
        return Graph(self.name, tuple(self._inputs), tuple(self._nodes), tuple(outputs))


def with_choices(g: Graph, key: str, made: Mapping[int, AttrValue]) -> Graph:
    """g with choice `key` set for the nodes in `made` (value id -> value), others kept."""
    kind = CHOICES[key][0]
    table = {v: dict(kv) for v, kv in g.choices}
    for vid, value in made.items():
        table.setdefault(vid, {})[key] = normalize_attr(kind, value)
    choices = tuple((v, tuple(sorted(table[v].items()))) for v in sorted(table))
    return replace(g, choices=choices)


def rebuild(g: Graph, nodes: Iterable[Node], outputs: Sequence[Value]) -> Graph:
    """A graph with g's name and inputs and the given nodes and outputs (used by passes)."""
    return Graph(g.name, g.inputs, tuple(nodes), tuple(outputs))


def constant_form(v: Value, producers: Mapping[int, Node], memo: dict[int, tuple | None]):
    """The whole computation of a value made from no graph input (a mask, a position table),
    as ops, attributes and types: equal for equal constants whatever their ids; None for any
    other value. `memo` (one per graph) keeps the forms met on the way."""
    stack = [v]  # post-order without recursion: producer chains run the model's whole depth
    while stack:
        x = stack[-1]
        if x.id in memo:
            stack.pop()
            continue
        producer = producers.get(x.id)
        if producer is None:  # a graph input
            memo[x.id] = None
            stack.pop()
            continue
        todo = [i for i in producer.inputs if i.id not in memo]
        if todo:
            stack.extend(todo)
            continue
        inputs = tuple(memo[i.id] for i in producer.inputs)
        const = all(f is not None for f in inputs)
        memo[x.id] = (producer.op.value, producer.attrs, x.type, inputs) if const else None
        stack.pop()
    return memo[v.id]
