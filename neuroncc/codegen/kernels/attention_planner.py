"""The attention kernel's plan: what the fuse pass's matmul-to-matmul group must be to run as
one kernel, its blocks and pipeline shape, and what the row group proves about the keys (Note
[dead keys], dead_keys.py). The kernel and its other Notes are in emit_attention.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen.executable.loops import loop_bufs
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.costs import dma_ns, instr_ns
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels import dead_keys
from neuroncc.codegen.kernels.attention_operands import widened_qk
from neuroncc.codegen.kernels.emit import P
from neuroncc.codegen.kernels.emit_fused import GENERATED_BYTES, generated_values
from neuroncc.codegen.kernels.row_plan import RowPlan, plan, sbuf_bytes
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

SBUF_SHARE = 0.85  # of a partition, for the whole kernel
SPAN = 6  # steps in flight: Qᵀ up to three steps ahead of the row group, P V two behind
ZERO_COLS = 512  # the zero tile P's dead keys are stored from (`zero_fill`), per DMA


@dataclass(frozen=True)
class AttentionPlan:
    scores: Node  # matmul(Q, Kᵀ)
    out: Node  # matmul(P, V)
    rows: Sequence[Node]  # the row group between them
    row_plan: RowPlan
    s_ids: frozenset[int]  # the scores and their reshapes
    given: frozenset[int]  # what the row group is given: those, or the result of `evac`
    p_id: int  # the row group's value the second matmul reads (through reshapes)
    p_chain: frozenset[int]  # those reshapes
    batch: int
    m: int
    d: int
    n: int
    dv: int
    unit: int = 1  # 128-row query blocks per pipeline step (Note [attention pipeline])
    group: int = 1  # heads whose Qᵀ and Kᵀ share partitions (Note [head pairs])
    evac: tuple[str, float] | None = None  # (op, constant) applied as the scores leave PSUM
    live: tuple[int, ...] | None = None  # keys computed per query block (Note [dead keys])
    aliases: tuple[tuple[int, int], ...] = ()  # row values taken as an input (RowKernel)
    # (the division P was, the row value it divided by): the output rows are divided instead
    deferred: tuple[int, int] | None = None
    elided: frozenset[int] = frozenset()  # nodes of the group not emitted (mask_as_select)
    # selects -> per query block, leading keys where they pass their input through (dead_keys)
    true_prefix: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # inputs of the row group made on chip: id -> (base, pstep, fstep) (Note [generated masks])
    generated: tuple[tuple[int, tuple[int, int, int]], ...] = ()
    zero_fill: bool = False  # P is read outside: its dead keys are stored as zeros
    # Q and K read as bf16 before SDPA widens them to f32 (attention_operands.widened_qk)
    qk: DType | None = None

    @property
    def qk_dtype(self) -> DType:
        """The dtype Q and K are loaded and multiplied in."""
        return self.qk or self.scores.inputs[0].type.dtype

    @property
    def chunks(self) -> int:
        """[rows, 512] PSUM banks of one block's scores."""
        return math.ceil(self.n / 512)

    @property
    def row_rounds(self) -> int:
        """RowKernel steps whose tiles coexist: this step's and the last one's (its P is
        transposed after this step's row group is issued)."""
        return 2 * self.unit

    def sbuf_bytes(self) -> int:
        return kernel_bytes(self) + sbuf_bytes(self.rows, self.row_plan, self.row_rounds)


def attention_plan(
    nodes: Sequence[Node], users: dict, outputs: set[int], t: Target, qk: DType | None = None
) -> AttentionPlan | None:
    """The plan of `nodes` = [matmul, reshapes and row ops, matmul] as one attention kernel,
    or None. `users` and `outputs` are the graph's: only P (and what the row group makes) may
    be read outside the kernel, never the scores. `qk`: the plan's."""
    if len(nodes) < 3 or nodes[0].op is not Op.MATMUL or nodes[-1].op is not Op.MATMUL:
        return None
    mm1, mm2, middle = nodes[0], nodes[-1], nodes[1:-1]
    q, kt = mm1.inputs
    *batch, m, d = q.type.shape
    n = kt.type.shape[-1]
    p2, v = mm2.inputs
    dv = v.type.shape[-1]
    if min(m, d, n, dv, math.prod(batch)) == 0 or d > P or dv > t.pe_moving_fmax:
        return None
    if p2.type.shape != (*batch, m, n) or v.type.shape != (*batch, n, dv):
        return None
    if p2.type.dtype != v.type.dtype or not p2.type.dtype.is_float:
        return None
    inside = {x.out.id for x in nodes}
    if any(x.id in inside for x in (q, kt, v)):
        return None
    # The scores under their reshapes (the same [rows, N] data), and P above its reshapes.
    s_ids = {mm1.out.id}
    for x in middle:
        if x.op is Op.RESHAPE and x.inputs[0].id in s_ids and x.out.type.shape[-1:] == (n,):
            s_ids.add(x.out.id)
    producer = {x.out.id: x for x in middle}
    p_id, p_chain = p2.id, set()
    while p_id in producer and producer[p_id].op is Op.RESHAPE:
        p_chain.add(p_id)
        p_id = producer[p_id].inputs[0].id
    if p_id not in producer or p_id in s_ids:
        return None
    for vid in s_ids | p_chain:
        if vid in outputs or any(u.out.id not in inside for u in users[vid]):
            return None  # the scores, or a reshape of P, read outside: they would need HBM
    rows = [x for x in middle if x.out.id not in s_ids | p_chain]
    rows, elided = mask_as_select(rows, users, outputs)
    given, evac = s_ids, evacuation_op(rows, s_ids, users)
    if evac is not None and (
        evac[0].out.id in outputs or any(u.out.id not in inside for u in users[evac[0].out.id])
    ):
        evac = None  # read outside the kernel: it stays a row op, which stores it
    if evac is not None:  # the scores' first op, done on the way out of PSUM
        node = evac[0]
        rows = [x for x in rows if x is not node and users[x.out.id] != [node]]
        given = {node.out.id}
    full = producer[p_id].out.type.shape
    rp = plan(rows, t, (full, 1))
    if rp is None or rp.flat or rp.rows != math.prod(batch) * m or rp.cols != n:
        return None
    if rp.kind.get(p_id) != "full" or not any(vid in rp.kind for vid in given):
        return None
    if any(rp.kind.get(vid, "full") != "full" for vid in given):
        return None
    ids = (frozenset(s_ids), frozenset(given), p_id, frozenset(p_chain))
    evac_op = (evac[0].op.value, evac[1]) if evac else None
    base = AttentionPlan(
        mm1, mm2, rows, rp, *ids, math.prod(batch), m, d, n, dv, evac=evac_op, elided=elided, qk=qk
    )
    # Two blocks per step where they fit, so their row groups interleave; heads in pairs
    # where their scores fit TensorE's row tiles (Note [head pairs]).
    paired = d in t.pe_row_tiles and 2 * d <= P and base.batch > 1
    for unit, group in ((2, 2), (2, 1), (1, 1)):
        ap = replace(base, unit=unit, group=group)
        fits = ap.sbuf_bytes() <= SBUF_SHARE * t.sbuf_partition_bytes
        if (group == 1 or paired) and fits and psum_banks(ap, t) is not None:
            return ap
    return None


def mask_as_select(
    rows: Sequence[Node], users: dict, outputs: set[int]
) -> tuple[list[Node], frozenset[int]]:
    """Note [dead keys]: x + where(c, 0, -inf), an additive mask made from its condition, as
    where(c, x, -inf): one pass over the scores fewer. Equal for the finite scores the kernel
    assumes, up to the sign of a zero score, which the softmax after it cannot tell (exp(x -
    max) is the same for +0 and -0, and so is the max). Returns the rows and the ids of the
    nodes taken out (still the kernel's: what only they read stays on chip)."""
    made = {x.out.id: x for x in rows}

    def full(v: Value, value: float) -> bool:
        node = made.get(v.id)
        return node is not None and node.op is Op.FULL and float(node.attr("value")) == value

    out, elided = list(rows), set()
    for i, node in enumerate(out):
        if node.op is not Op.ADD or not node.out.type.dtype.is_float:
            continue
        for x, mask in (node.inputs, node.inputs[::-1]):
            sel = made.get(mask.id)
            if sel is None or sel.op is not Op.WHERE or mask.id in outputs:
                continue
            c, zero, neg_inf = sel.inputs
            if users[mask.id] != [node] or not (full(zero, 0.0) and full(neg_inf, -math.inf)):
                continue
            if x.type != node.out.type or neg_inf.type != node.out.type:
                continue
            out[i] = Node(Op.WHERE, (c, x, neg_inf), (), node.out)
            elided.add(sel.out.id)
            if users[zero.id] == [sel] and zero.id not in outputs:
                elided.add(zero.id)
            break
    return [x for x in out if x.out.id not in elided], frozenset(elided)


def evacuation_op(rows: Sequence[Node], s_ids: set[int], users: dict) -> tuple[Node, float] | None:
    """The scores' only reader, if it is `scores <mul|add> constant` (the softmax scale): the
    copy out of PSUM applies it (tensor_scalar), one pass over the scores fewer."""
    readers = {u.out.id: u for vid in s_ids for u in users[vid] if u.out.id not in s_ids}
    if len(readers) != 1:
        return None
    (node,) = readers.values()
    consts = {x.out.id: x for x in rows if x.op is Op.FULL}
    if node.op not in (Op.MUL, Op.ADD) or not node.out.type.dtype.is_float:
        return None
    a, c = node.inputs if node.inputs[0].id in s_ids else node.inputs[::-1]
    if a.id not in s_ids or c.id not in consts or c.type != a.type:
        return None
    return node, float(consts[c.id].attr("value"))


def psum_banks(ap: AttentionPlan, t: Target) -> tuple[int, int] | None:
    """(score banks, transpose banks), beside one bank of P V accumulators (and one for Q's
    transposes when Q and P differ in dtype). A step's scores must fit the score banks at
    once: their copies to SBUF are issued after all of the step's matmuls. Scores of two
    steps where that leaves a bank per four transposes of one step's P."""
    free = t.psum_partition_bytes // t.psum_bank_bytes - 1
    free -= ap.qk_dtype != ap.out.inputs[0].type.dtype
    need = ap.unit * ap.chunks
    if need > free - 1:
        return None
    want_t = math.ceil(ap.unit * math.ceil(ap.n / P) / 4)
    s_banks = min(2 * need, max(need, free - want_t))
    return s_banks, free - s_banks


def kernel_bytes(ap: AttentionPlan) -> int:
    """SBUF per partition beside the row group's (emit_attention's pools): Kᵀ and V of the
    heads in flight, Q and Qᵀ blocks, score rows, two steps' Pᵀ tiles, output tiles and the
    transposes' identities."""
    qd = ap.qk_dtype.itemsize
    sd = ap.scores.out.type.dtype.itemsize
    pd = ap.out.inputs[0].type.dtype.itemsize
    od = ap.out.out.type.dtype.itemsize
    key_tiles = math.ceil(ap.n / P)
    kv = groups_alive(ap) * (ap.n * qd + ap.group * key_tiles * ap.dv * pd)
    gd = ap.group * ap.d  # a group's Q and K rows are [rows, group * D]
    bufs = pool_bufs(ap)
    blocks = 2 * gd * qd + bufs["q"] * gd * qd + bufs["qt"] * P * qd + bufs["s"] * ap.n * sd
    blocks += bufs["pt"] * P * pd
    inverses = bufs["inv"] * 64  # 1 / row sum of the steps in flight (`deferred`)
    extra = inverses + GENERATED_BYTES + ZERO_COLS * pd  # (a generated mask, zeros of P)
    return kv + blocks + bufs["o"] * ap.dv * od + 2 * P * (max(qd, pd) + 4) + extra


def pool_bufs(ap: AttentionPlan) -> dict[str, int]:
    """Buffers of emit_attention's per-block pools: at least what the pipeline needs, and
    where a few more make a head group take whole turns of them, that many, so that the
    pipeline's steps repeat group by group (Note [instruction loops]). Qᵀ and Q come once per
    row block of a group, the scores, outputs and 1 / s once per block, Pᵀ once per key
    tile. The sizes read only the shapes, so the fuse pass's check (kernel_bytes, before the
    dead keys are known) counts what the kernel takes."""
    u, row_blocks = ap.unit, math.ceil(ap.m / P)
    per_group = row_blocks * min(ap.group, ap.batch)
    key_tiles = math.ceil(ap.n / P)
    pt = per_group * key_tiles
    return {
        "q": loop_bufs(2 * u, row_blocks),
        "qt": loop_bufs(3 * u, row_blocks),
        "s": loop_bufs(3 * u, per_group),
        "pt": loop_bufs(2 * u * key_tiles, pt),
        "o": loop_bufs(2 * u, per_group),
        "inv": loop_bufs(4 * u, per_group),
    }


def groups_alive(ap: AttentionPlan) -> int:
    """Head groups whose Kᵀ and V are on chip at once: the pipeline (Note [attention
    pipeline]) spans SPAN steps, from the first block's Qᵀ to the last one's P V."""
    per_group = math.ceil(ap.m / P) * ap.group
    return min(math.ceil(ap.batch / ap.group), math.ceil(SPAN * ap.unit / per_group) + 1)


def loads_ahead(ap: AttentionPlan, t: Target) -> int:
    """Pipeline steps that a block's Qᵀ (and a new head's Kᵀ and V) are loaded ahead of its row
    group (Note [attention pipeline]): three, so that the loads hide behind the steps between;
    two where a head's loads and stores take over twice its TensorE work (short rows of keys,
    in 256-byte runs). TensorE would then wait, behind transposes of data still in flight,
    instead of finishing the P V of earlier steps, whose stores the DMAs are waiting for.
    (Measured: at 128 keys the loads take 2.8 times the TensorE work and two steps win; at
    512, 1.3 times, and three win by 13%.)"""
    qd, pd = ap.qk_dtype, ap.out.inputs[0].type.dtype
    od = ap.out.out.type.dtype

    def moved(rows: int, cols: int, dt: DType) -> float:
        return dma_ns(rows * cols * dt.itemsize, cols * dt.itemsize, t, t.dma_engines)

    def pe(rows: int, cols: int, dt: DType, transpose: bool = False) -> float:
        st = isa.TileRef("sbuf", 0, P, 0, dt, (rows,))
        mv = isa.TileRef("sbuf", 0, P, 0, dt, (cols,))
        acc = isa.TileRef("psum", 0, rows, 0, DType.F32, (cols,))
        mm = isa.Matmul(
            "pe", dst=acc, stationary=st, moving=mv, accumulate=False, transpose=transpose
        )
        return instr_ns(mm, t)

    heads, blocks, g = ap.batch, query_blocks(ap), ap.group
    dma = moved(ap.m, ap.d, qd) + moved(ap.n, ap.d, qd) + moved(ap.n, ap.dv, pd)
    dma += moved(ap.m, ap.dv, od)
    # Qᵀ, Kᵀ: a group's heads transposed together, their scores side by side
    work = (len(blocks) + heads * math.ceil(ap.n / P)) * pe(g * ap.d, P, qd, True) / g
    for keys in ap.live or [ap.n] * len(blocks):  # (Note [dead keys])
        work += sum(pe(P, min(512, keys - c0), qd) for c0 in range(0, keys, 512)) / g  # scores
        work += math.ceil(keys / P) * (pe(P, P, pd, True) + pe(P, ap.dv, pd))  # Pᵀ, P V
    work /= heads
    return 2 if dma > 2 * work else 3


Block = tuple[int, int, int]  # (batch, first query row, rows)


def query_blocks(ap: AttentionPlan) -> list[Block]:
    """The kernel's blocks in order: head by head, or with heads in groups (Note [head
    pairs]) the group's heads block by block, so that a step holds one block of each."""
    return [
        (bi, r0, min(P, ap.m - r0))
        for g0 in range(0, ap.batch, ap.group)
        for r0 in range(0, ap.m, P)
        for bi in range(g0, min(g0 + ap.group, ap.batch))
    ]


def with_key_facts(
    g: Graph, ap: AttentionPlan, memo: dead_keys.Memo | None = None
) -> AttentionPlan:
    """ap refined by what the row group proves (Note [dead keys]): the keys each query block
    must compute, where no full row of the group is read outside the kernel (P included);
    selects whose condition is known, taken as the branch they pick; and, where P is then
    `e / s` for a row sum s, the division moved to the output rows (`deferred`)."""
    users, outputs = g.users(), {v.id for v in g.outputs}
    inside = {ap.scores.out.id, ap.out.out.id, *(x.out.id for x in ap.rows), *ap.p_chain}
    inside |= ap.elided

    def read_outside(vid: int) -> bool:
        return vid in outputs or any(u.out.id not in inside for u in users[vid])

    # A full row read outside must be whole, except P: on dead keys it is exactly 0, so the
    # kernel stores zeros there instead of computing them (`zero_fill`: a training forward
    # saving P for its backward).
    wide = [x.out.id for x in ap.rows if x.out.type.shape[-1:] == (ap.n,)]
    wide_outside = any(read_outside(v) for v in wide if v != ap.p_id)
    zero_fill = read_outside(ap.p_id) and not wide_outside
    blocks = query_blocks(ap)
    facts = dead_keys.analyse(g, ap.rows, sorted(ap.given), ap.p_id, blocks, ap.m, ap.n, P, memo)
    aliases = dict(facts.settled)
    # P through the selects it is taken as: e / s, with s one value per row?
    chain, vid = [ap.p_id], ap.p_id
    while vid in aliases:
        vid = aliases[vid]
        chain.append(vid)
    node = next((x for x in ap.rows if x.out.id == vid), None)
    deferred = None
    # Only P V may read the division's value: anything else computed from it (a bf16 copy of
    # P that a training forward saves) would get e instead.
    flow = {*chain, *ap.p_chain}
    only_pv = all(u.out.id in flow or u is ap.out for v in flow for u in users[v])
    if _divides_by_row(node, ap.rows) and only_pv and not any(read_outside(v) for v in flow):
        aliases[node.out.id] = node.inputs[0].id
        deferred = (node.out.id, node.inputs[1].id)
    return replace(
        ap,
        live=None if wide_outside else facts.live,
        zero_fill=zero_fill and facts.live is not None,
        aliases=tuple(sorted(aliases.items())),
        deferred=deferred,
        true_prefix=tuple(sorted(facts.true_prefix.items())),
        generated=tuple(
            (vid, form)
            for vid, form in sorted(facts.affine.items())
            if ap.row_plan.kind.get(vid) in ("full", "period")  # (not loaded once, up front)
            and generated_values(ap.rows, {vid: form}) is not None
        ),
    )


def _divides_by_row(node: Node | None, rows: Sequence[Node]) -> bool:
    """node = a / s with s one value per row (broadcast over it)."""
    if node is None or node.op is not Op.DIV:
        return False
    s = node.inputs[1]
    divisor = next((x for x in rows if x.out.id == s.id), None)
    if divisor is not None and divisor.op is Op.BROADCAST:
        s = divisor.inputs[0]
    return s.type.shape[-1:] == (1,) and s.type.dtype is DType.F32


def attention_plans(g: Graph, t: Target) -> dict[int, AttentionPlan | None]:
    """For each fused kernel of g from a matmul to a matmul (what the fuse pass forms for
    attention): its first node's id -> its plan, or None where attention_plan rejects it."""
    users, outputs = g.users(), {v.id for v in g.outputs}
    producers, in_kernels = g.producers(), g.kernel_of()
    plans = {}
    for group in g.kernel_groups():
        if group[0].op is not Op.MATMUL or group[-1].op is not Op.MATMUL:
            continue
        if sum(x.op is Op.MATMUL for x in group) != 2:  # (4: attention_backward.py)
            continue
        ap = None
        if widened_qk(group[0], producers, in_kernels):  # (a plan that fits in f32 may not)
            ap = attention_plan(group, users, outputs, t, DType.BF16)
        plans[group[0].out.id] = ap or attention_plan(group, users, outputs, t)
    return plans
