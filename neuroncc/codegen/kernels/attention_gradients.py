"""Where the attention backward kernel stores dQ, dK and dV (Note [attention backward] in
attention_backward.py): each gradient's destination, and Note [gradients in place]."""

from __future__ import annotations

from dataclasses import dataclass, replace

from neuroncc.codegen.kernels.views import View, reshape_strides
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import contiguous_strides


@dataclass(frozen=True)
class Gradient:
    """One of dQ, dK, dV: its matmul, the value the kernel computes (the matmul's result or its
    reshape / constant multiple), that constant, and where it is stored: the matmul's
    [B.., rows, D] as a view of `out`, or of the concat the kernel makes (Note [gradients in
    place])."""

    matmul: Node
    out: Value
    scale: float
    dst: View | None = None


def view_as(v: View | None, x: Value) -> View | None:
    """v, a view of the same elements as x row-major, indexed over x's shape."""
    strides = v and reshape_strides(v.shape, v.strides, x.type.shape)
    return None if strides is None else View(v.base, v.offset, x.type.shape, strides)


def concat_of(
    grads: list[Gradient], producers: dict[int, Node], users: dict, outputs: set[int]
) -> tuple[list[Gradient], set[int]] | None:
    """Note [gradients in place]: in a backward, dQ, dK and dV each go through a head merge
    (a transpose and a reshape) into one concat, the QKV projection's output gradient. Where
    nothing else reads them, the kernel stores them straight into the concat's regions: no
    concat kernel, and 3 x [B, S, D] of HBM traffic fewer each way. Returns the gradients with
    their regions as `dst`, and the nodes from them to the concat (it included); None if
    they do not all go to one concat that takes nothing else."""
    concat: Node | None = None
    ends, chain = {}, set()
    for gr in grads:
        v, nodes = gr.out, []
        while v.id not in outputs and len(users[v.id]) == 1:
            (u,) = users[v.id]
            if u.op is Op.CONCAT:
                concat = concat or u
                if u is not concat:
                    return None
                break
            if u.op not in (Op.RESHAPE, Op.TRANSPOSE):
                return None
            nodes.append(u)
            v = u.out
        else:
            return None
        ends[v.id] = (gr, nodes)
        chain.update(x.out.id for x in nodes)
    if (
        concat is None
        or len({x.id for x in concat.inputs}) != 3
        or set(ends) != {x.id for x in concat.inputs}
    ):
        return None
    axis, out_strides = concat.attr("axis"), contiguous_strides(concat.out.type.shape)
    placed, start = [], 0
    for x in concat.inputs:
        gr, nodes = ends[x.id]
        view: View | None = View(concat.out, start * out_strides[axis], x.type.shape, out_strides)
        for node in reversed(nodes):  # back from the concat's input to the gradient
            if view is None:
                return None
            if node.op is Op.RESHAPE:
                view = view_as(view, node.inputs[0])
            else:
                perm = tuple(node.attr("perm"))
                strides = [0] * len(perm)
                for i, pi in enumerate(perm):
                    strides[pi] = view.strides[i]
                view = View(concat.out, view.offset, node.inputs[0].type.shape, tuple(strides))
        dst = view_as(view, gr.matmul.out)
        if dst is None:
            return None
        placed.append(replace(gr, dst=dst))
        start += x.type.shape[axis]
    order = {id(gr.matmul): i for i, gr in enumerate(grads)}
    placed.sort(key=lambda gr: order[id(gr.matmul)])
    return placed, chain | {concat.out.id}
