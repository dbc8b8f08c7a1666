"""fuse: group runs of elementwise ops, broadcasts and trailing reductions into row kernels
(codegen/kernels/emit_fused.py), so softmax, LayerNorm, RMSNorm and elementwise chains each read
their inputs from HBM once and write their results once; and a matmul with the elementwise ops after
it (bias, activation, residual, scaling, cast: Note [matmul epilogue] in emit_matmul.py), so its
result is finished on the way out of PSUM instead of going through HBM; and attention, matmul -> row
group -> matmul, as one kernel that keeps the scores on chip (Note [attention kernel] in
emit_attention.py); and its backward, four matmuls and the dS between them, as one kernel that keeps
dP and dS on chip (Note [attention backward] in attention_backward.py).

The decision is the cost model's: a group forms only where codegen can emit it within the
target's SBUF (`row_plan.plan`), and only where it saves HBM traffic, i.e. some value made in
the group is used only inside it. Groups are runs of consecutive nodes (consecutive nodes are
always a convex set, so no value leaves and re-enters a kernel); the IR order from the lowering
keeps each normalisation's chain together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.codegen.kernels.attention_backward import match
from neuroncc.codegen.kernels.attention_planner import attention_plan
from neuroncc.codegen.kernels.row_plan import REDUCE_OPS, epilogue_plan, fusible, plan, uses_result
from neuroncc.codegen.kernels.views import strided_view, widens_bf16
from neuroncc.ir.graph import Graph, Node
from neuroncc.ir.ops import Op
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Fuse:
    name: ClassVar[str] = "fuse"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        users = g.users()
        outputs = {v.id for v in g.outputs}
        # the backward first: its S = Q Kᵀ, P and dP = dO Vᵀ, dS and dQ = dS K look like
        # forward attention (Note [P recomputed])
        nodes, backward = _attention_backward_groups(list(g.nodes), g, ctx)
        nodes, attention = _attention_groups(nodes, users, outputs, ctx, backward)
        forward = {ids[0] for ids in attention.values() if ids[0] not in backward}
        widening = _widening_casts(g, forward, users)
        attention |= backward
        nodes = _epilogues_together(nodes, attention)
        kernels: list[tuple[int, ...]] = []
        run: list[Node] = []

        def close() -> None:
            if run and run[0].op is Op.MATMUL:
                p = epilogue_plan(run[0], run[1:], ctx.target) if len(run) > 1 else None
                if p is not None and uses_result(run[0], p):
                    # Always a saving: the epilogue reads the product on chip, not from HBM.
                    kernels.append(tuple(n.out.id for n in run))
                    return
                del run[0]  # no epilogue: what followed may still be a group of its own,
                if plan(run, ctx.target) is None:  # but it was planned around the product
                    return
            if len(run) >= 2 and _saves_traffic(run, users, outputs):
                kernels.append(tuple(n.out.id for n in run))

        def extends(n: Node) -> bool:
            if not run or not fusible(n) or n.out.id in widening:
                return False
            if run[0].op is Op.MATMUL:
                return epilogue_plan(run[0], [*run[1:], n], ctx.target) is not None
            return plan([*run, n], ctx.target) is not None

        for n in nodes:
            if n.out.id in attention:
                close()
                run = []
                if n.out.id == attention[n.out.id][0]:
                    kernels.append(attention[n.out.id])
                continue
            if extends(n):
                run.append(n)
                continue
            close()
            starts = n.op is Op.MATMUL or (fusible(n) and plan([n], ctx.target) is not None)
            starts = starts and n.out.id not in widening
            run = [n] if starts else []
        close()
        return replace(g, nodes=tuple(nodes), kernels=tuple(kernels))


_IN_PLACE_OPS = (Op.RESHAPE, Op.BROADCAST, Op.TRANSPOSE, Op.FULL, Op.IOTA)


def _widening_casts(g: Graph, scores: set[int], users: dict) -> set[int]:
    """The casts of bf16 to f32 that only widen an attention kernel's q or k on their way
    to it (through reshapes, transposes and slices): they stay out of row kernels, so that
    the attention kernel reads the bf16 value before them and multiplies it in bf16 (Note
    [widened scores] in attention_operands.py). Fused with the rotary embedding before it,
    the cast was inside a kernel, which stored q and k in f32."""
    producers, out = g.producers(), set()

    def cast_before(x) -> int | None:
        # on the walk the attention kernel reads x by, each value read by the next alone
        chain = strided_view(x, producers, widened=True)[1]
        for vid in chain:
            if len(users[vid]) != 1:
                return None
            if widens_bf16(producers[vid]):
                return vid
        return None

    for sid in scores:
        casts = [cast_before(x) for x in producers[sid].inputs]
        if None not in casts:  # (both or neither: one alone is a cast kernel more)
            out.update(casts)
    return out


def _epilogues_together(nodes: list[Node], grouped: dict) -> list[Node]:
    """Between a matmul and the next one, the computations that do not depend on the matmul
    move ahead of it, so that what does (its epilogue) follows it without a gap: in an
    attention backward, D = rowsum(dO * O) sits between dP = dO V^T and dS = P * (dP - D), and
    would otherwise end the run, sending dP through HBM. Reshapes, broadcasts and constants
    that only the epilogue reads stay with it: they say how it reads its inputs (a bias, or a
    row value broadcast over the product); the next matmul's W^T moves ahead. Legal: nothing
    moved ahead reads what stays behind; each part keeps its order. Attention kernels
    (`grouped` already) are left alone, and end the window. The windows are taken last to
    first, so that what moves ahead of one matmul is in the window before when that is taken:
    an epilogue two matmuls on (a GELU backward after the weight gradient and a bias
    gradient's column sums) comes back to its matmul in one pass."""
    out = list(nodes)
    starts = [i for i, n in enumerate(out) if n.op is Op.MATMUL and n.out.id not in grouped]
    for i in reversed(starts):  # rearranging [i, j) moves nothing before i
        j = next(
            (
                j
                for j in range(i + 1, len(out))
                if out[j].op is Op.MATMUL or out[j].out.id in grouped
            ),
            len(out),
        )
        window = out[i + 1 : j]
        dep = {out[i].out.id}  # the matmul's result and what is computed from it
        for n in window:
            if any(v.id in dep for v in n.inputs):
                dep.add(n.out.id)
        readers: dict[int, list[int]] = {}
        for n in window:
            for v in n.inputs:
                readers.setdefault(v.id, []).append(n.out.id)
        stays = set(dep)
        for n in reversed(window):
            read_by = readers.get(n.out.id)
            if _epilogue_input(n) and read_by and all(r in stays for r in read_by):
                stays.add(n.out.id)
        ahead = [n for n in window if n.out.id not in stays]
        out[i:j] = [*ahead, out[i], *(n for n in window if n.out.id in stays)]
    return out


def _epilogue_input(n: Node) -> bool:
    """n may stay with the epilogue that alone reads it: a view or constant, or an elementwise
    op, which the epilogue computes as well from its inputs (a GELU's derivative at x, which
    the GELU backward multiplies the product by)."""
    return n.op in _IN_PLACE_OPS or (fusible(n) and n.op not in REDUCE_OPS)


def _attention_groups(
    nodes: list[Node], users: dict, outputs: set[int], ctx: PassContext, taken: dict
) -> tuple[list[Node], dict[int, tuple[int, ...]]]:
    """Attention kernels: each matmul with the nodes up to the next matmul, where
    `attention_plan` accepts them. Reshapes of values made before the group (V, the mask)
    move ahead of it so the group is consecutive; nodes of kernels `taken` stay theirs.
    Returns the new node order and, for every node in a group, the group's ids."""
    groups: dict[int, tuple[int, ...]] = {}
    i = 0
    while i < len(nodes):
        if nodes[i].op is not Op.MATMUL:
            i += 1
            continue
        j = next((j for j in range(i + 1, len(nodes)) if nodes[j].op is Op.MATMUL), None)
        if j is None:
            break
        span = {n.out.id for n in nodes[i : j + 1]}
        hoisted = []
        for n in nodes[i + 1 : j]:
            if n.op is Op.RESHAPE and n.inputs[0].id not in span:
                hoisted.append(n)
                span.discard(n.out.id)
        kept = [n for n in nodes[i : j + 1] if n.out.id in span]
        if any(n.out.id in taken for n in kept) or (
            attention_plan(kept, users, outputs, ctx.target) is None
        ):
            i += 1
            continue
        nodes[i : j + 1] = [*hoisted, *kept]
        ids = tuple(n.out.id for n in kept)
        groups.update(dict.fromkeys(ids, ids))
        i = j + 1
    return nodes, groups


def _attention_backward_groups(
    nodes: list[Node], g: Graph, ctx: PassContext
) -> tuple[list[Node], dict[int, tuple[int, ...]]]:
    """Attention backward kernels (Note [attention backward]), each found from its dS node;
    their nodes are brought together (`_contiguous`). Returns the new node order and, for
    every node in a kernel, the kernel's ids."""
    groups: dict[int, tuple[int, ...]] = {}
    producers, users, outputs = g.producers(), g.users(), {v.id for v in g.outputs}
    for n in g.nodes:
        if n.op is not Op.MUL or n.out.id in groups:
            continue
        bp = match(n, producers, users, outputs, ctx.target)
        if bp is None or any(vid in groups for vid in bp.members):
            continue
        order = _contiguous(nodes, bp.members, set(groups))
        if order is None:
            continue
        nodes = order
        ids = tuple(x.out.id for x in nodes if x.out.id in bp.members)
        groups.update(dict.fromkeys(ids, ids))
    return nodes, groups


def _contiguous(nodes: list[Node], members: frozenset[int], grouped: set[int]) -> list[Node] | None:
    """nodes with `members` consecutive: between the first and the last member, what does not
    depend on them moves ahead, what does moves after. None where a member depends on such a
    node (they cannot be one kernel) or a node of another kernel is in the way."""
    at = [i for i, n in enumerate(nodes) if n.out.id in members]
    lo, hi = at[0], at[-1]
    ahead, inside, after = [], [], []
    depends = set(members)
    for n in nodes[lo : hi + 1]:
        reads = {v.id for v in n.inputs}
        if n.out.id in members:
            if reads & {x.out.id for x in after}:
                return None
            inside.append(n)
        elif n.out.id in grouped:
            return None
        elif reads & depends:
            depends.add(n.out.id)
            after.append(n)
        else:
            ahead.append(n)
    return [*nodes[:lo], *ahead, *inside, *after, *nodes[hi + 1 :]]


def _saves_traffic(run: list[Node], users: dict, outputs: set[int]) -> bool:
    inside = {n.out.id for n in run}
    return any(
        n.out.id not in outputs and all(u.out.id in inside for u in users[n.out.id]) for n in run
    )
