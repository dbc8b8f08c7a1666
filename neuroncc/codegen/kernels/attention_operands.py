"""The attention kernel's operands read in place (Note [attention operands]), from the
projection they come out of, through its slices, head splits and transposes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from neuroncc.codegen.kernels.views import View, strided_view, unread_chain_nodes
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.types import DType

if TYPE_CHECKING:
    from neuroncc.codegen.kernels.attention_planner import AttentionPlan


def fold_operand_views(
    g: Graph, plans: Sequence[AttentionPlan]
) -> tuple[dict[int, View], set[int]]:
    """Note [attention operands]: q, Kᵀ and v usually come out of one QKV projection through
    slices, head-splitting reshapes and transposes. Where only the attention kernel reads
    that chain, the kernel reads the projection in place (views.strided_view) and the chain
    is not emitted: no transpose or slice kernel, no HBM round trip. Kᵀ whose keys are
    contiguous (K's rows) is loaded as K and transposed on TensorE. Returns operand value id
    -> its view, and the ids of the nodes not to emit."""
    producers, users = g.producers(), g.users()
    outputs = {v.id for v in g.outputs}
    views: dict[int, View] = {}
    viewed_by: dict[int, set[int]] = {}  # matmul out id -> the operands it reads as views
    in_kernels = g.kernel_of()
    chains: set[int] = set()
    for ap in plans:
        widened = ap.qk is not None
        for mm, operand, layout, wide in zip(
            (ap.scores, ap.scores, ap.out),
            operands(ap),
            ("rows", "keys", "rows"),
            (widened, widened, False),
            strict=True,
        ):
            view, chain = strided_view(operand, producers, in_kernels, wide)
            if chain and load_kind(view, layout) is not None:
                views[operand.id] = view
                viewed_by.setdefault(mm.out.id, set()).add(operand.id)
                chains.update(chain)

    def in_place(u, vid: int) -> bool:
        return vid in viewed_by.get(u.out.id, ())

    return views, unread_chain_nodes(chains, outputs, users, in_place)


def widened_qk(scores: Node, producers: dict[int, Node], in_kernels) -> bool:
    """Note [widened scores]: whether the scores' q and k are bf16 values that PyTorch's SDPA
    math widens to f32, read in place. The kernel then loads the bf16 values and multiplies
    them on TensorE in bf16, which gives the f32 product exactly (a product of two bf16
    values is exact in f32, and PSUM accumulates in f32), at TensorE's bf16 rate (4x f32's)
    and with half the bytes loaded; the casts are not emitted. P V stays in f32: P is f32."""
    views = [strided_view(x, producers, in_kernels, widened=True)[0] for x in scores.inputs]
    return all(v.base.type.dtype is DType.BF16 for v in views) and all(
        load_kind(v, layout) is not None for v, layout in zip(views, ("rows", "keys"))
    )


def operands(ap: AttentionPlan) -> tuple[Value, Value, Value]:
    return ap.scores.inputs[0], ap.scores.inputs[1], ap.out.inputs[1]


def load_kind(view: View, layout: str) -> str | None:
    """How a view is read: "rows" (q, v: the last axis contiguous), "kt" (Kᵀ rows contiguous)
    or "k" (K's rows contiguous, transposed on chip); None if it cannot be."""
    last, second = view.strides[-1], view.strides[-2]
    if layout == "rows":
        return "rows" if last == 1 else None
    if last == 1:
        return "kt"
    return "k" if second == 1 else None
