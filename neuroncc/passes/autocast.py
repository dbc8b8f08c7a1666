"""auto-cast: fp32 matmuls run on TensorE in bf16, as neuronx-cc does by default (its
`--auto-cast matmult`): both operands are rounded to bf16, the products accumulate in fp32 in
PSUM, and the result is cast back to fp32 for its users. Everything else keeps its dtype.

On with `options={"auto_cast": "matmul"}`; off by default, so that results match eager fp32.
Runs first, so that simplify's CSE shares the cast of an operand that several matmuls read.

Invariant established: no matmul with fp32 operands. Values keep their ids and types: each
rewritten matmul's result id now names the cast back to fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.ir.graph import Graph, Node, Value, make_attrs
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, TensorType
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class AutoCast:
    name: ClassVar[str] = "auto-cast"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        assert not g.kernels, "auto-cast runs before fusion"
        next_id = 1 + max([v.id for v in g.inputs] + [n.out.id for n in g.nodes], default=-1)
        nodes: list[Node] = []

        def fresh(op: Op, inputs: tuple[Value, ...], attrs: dict, t: TensorType) -> Value:
            nonlocal next_id
            out = Value(next_id, t)
            next_id += 1
            nodes.append(Node(op, inputs, make_attrs(op, attrs), out))
            return out

        for n in g.nodes:
            if n.op is not Op.MATMUL or n.out.type.dtype is not DType.F32:
                nodes.append(n)
                continue
            a, b = (
                fresh(Op.CAST, (v,), {"dtype": DType.BF16}, replace(v.type, dtype=DType.BF16))
                for v in n.inputs
            )
            low = fresh(Op.MATMUL, (a, b), {}, replace(n.out.type, dtype=DType.BF16))
            nodes.append(Node(Op.CAST, (low,), make_attrs(Op.CAST, {"dtype": DType.F32}), n.out))
        return replace(g, nodes=tuple(nodes))
