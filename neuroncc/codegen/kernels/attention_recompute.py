"""P made again inside the attention backward kernel: what the fuse pass groups with it.

Note [P recomputed]: the forward of SDPA saves the rows' logsumexp, not P (Note [attention
saves its logsumexp] in frontend/decomp_attention.py), so the backward graph makes P again:
S = Q Kᵀ, the row group the forward ran on S without its reductions (the scale, the mask,
minus the logsumexp, exp), then P feeds the backward's four matmuls. Run apart, S and P go
through HBM ([heads, queries, keys] each, written and read); the backward kernel instead
makes each step's P on chip as the forward kernel makes it (Note [attention kernel]): the
step's S on TensorE from Qᵀ (the Q rows it loads anyway, transposed on TensorE) and Kᵀ's
columns of the key block (loaded once per key block), copied out of PSUM with the scale
applied (`evac`), and the row group run on it by a RowKernel step as wide as the key block,
its mask and logsumexp loaded per step. `find` recognises the nodes: the values that depend
on one matmul of P's shape on the way to P, and the constants, broadcasts and selects only
they read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels import dead_keys
from neuroncc.codegen.kernels.attention_planner import evacuation_op, mask_as_select
from neuroncc.codegen.kernels.emit import P
from neuroncc.codegen.kernels.emit_fused import generated_values
from neuroncc.codegen.kernels.row_plan import RowPlan, classify, fusible, plan, sbuf_bytes
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Op


@dataclass(frozen=True)
class Recompute:
    scores: Node  # S = matmul(q, k_t)
    q: Value  # [B.., M, D] as the scores' matmul reads it
    k_t: Value | None  # [B.., D, N]; None: transposed on chip from the kernel's K tiles
    rows: tuple[Node, ...]  # the row group from S (or S scaled) to P, as RowKernel runs it
    row_plan: RowPlan
    given: frozenset[int]  # what the kernel hands the row group: S, or `evac`'s result
    evac: tuple[str, float] | None  # (op, constant) applied as S leaves PSUM
    members: frozenset[int]  # every node of it: the kernel's
    # what the row group proves (with_key_facts, Note [dead keys]): keys each query block
    # must compute (None: all), selects settled (value -> the input it is), masks made on chip
    live: tuple[int, ...] | None = None
    aliases: tuple[tuple[int, int], ...] = ()
    generated: tuple[tuple[int, tuple[int, int, int]], ...] = ()
    # selects -> per query block, leading keys where they pass their input through
    true_prefix: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def sbuf_bytes(self, step_cols: int) -> int:
        return sbuf_bytes(self.rows, self.row_plan, 2, step_cols)


def find(
    p: Value, producers: dict[int, Node], users: dict, outputs: set[int], t: Target, step_cols
) -> Recompute | None:
    """P's recomputation (Note [P recomputed]) with steps `step_cols` keys wide, or None if P
    is not made from a matmul of its shape by a row group the kernel can run."""
    if len(p.type.shape) < 2:
        return None
    *batch, m, n = p.type.shape
    full = tuple(p.type.shape)

    inside: dict[int, Node] = {}
    scores: list[Node] = []
    stack = [p]
    while stack:
        v = stack.pop()
        x = producers.get(v.id)
        if x is None or x.out.id in inside or x in scores:
            continue
        if x.op is Op.MATMUL and x.out.type.numel == math.prod(full) and x.out.type.shape[-1] == n:
            scores.append(x)
        elif fusible(x) and x.op not in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN):
            if classify(x.out.type.shape, full, 1) not in ("full", "row"):
                continue  # a kernel input (a mask made elsewhere, period-shaped)
            inside[x.out.id] = x
            stack.extend(x.inputs)
    if len(scores) != 1:
        return None
    (mm,) = scores
    member_ids = set(inside) | {mm.out.id}
    for vid in member_ids - {p.id}:  # nothing of it read outside, but by the kernel
        if vid in outputs or any(u.out.id not in member_ids for u in users[vid]):
            return None
    order = {vid: i for i, vid in enumerate(producers)}
    rows = sorted(inside.values(), key=lambda x: order[x.out.id])
    s_ids = {mm.out.id}
    for x in rows:
        if x.op is Op.RESHAPE and x.inputs[0].id in s_ids and x.out.type.shape[-1:] == (n,):
            s_ids.add(x.out.id)
    rows = [x for x in rows if x.out.id not in s_ids]
    rows, _ = mask_as_select(rows, users, outputs)
    given, evac = set(s_ids), evacuation_op(rows, s_ids, users)
    if evac is not None:
        node = evac[0]
        rows = [x for x in rows if x is not node and users[x.out.id] != [node]]
        given = {node.out.id}
    rp = plan(rows, t, (full, 1), step_cols)
    if rp is None or rp.flat or rp.rows != math.prod(batch) * m or rp.cols != n:
        return None
    if rp.kind.get(p.id) != "full" or not any(rp.kind.get(vid) == "full" for vid in given):
        return None
    q, k_t = mm.inputs
    if q.type.shape[-2] != m or k_t.type.shape[-1] != n or q.type.shape[-1] != k_t.type.shape[-2]:
        return None
    evac_op = (evac[0].op.value, evac[1]) if evac else None
    return Recompute(
        mm, q, k_t, tuple(rows), rp, frozenset(given), evac_op, frozenset(member_ids),
    )  # fmt: skip


def with_key_facts(
    g: Graph, rc: Recompute, p_id: int, blocks: list[tuple[int, int, int]], m: int, memo
) -> Recompute:
    """rc refined by what its row group proves (Note [dead keys]) for the query blocks
    (batch, first row, rows): the keys each must compute (a causal mask's zeros of P are
    skipped, with everything computed from them: S, dP, dS and their products), the
    selects settled, and the masks made on chip (Note [generated masks])."""
    n = rc.row_plan.cols
    facts = dead_keys.analyse(g, rc.rows, sorted(rc.given), p_id, blocks, m, n, P, memo)
    generated = tuple(
        (vid, form)
        for vid, form in sorted(facts.affine.items())
        if rc.row_plan.kind.get(vid) in ("full", "period")
        and generated_values(rc.rows, {vid: form}) is not None
    )
    aliases = tuple(sorted(facts.settled.items()))
    prefix = tuple(sorted(facts.true_prefix.items()))
    return replace(rc, live=facts.live, aliases=aliases, generated=generated, true_prefix=prefix)
