"""Attention as one kernel: S = Q Kᵀ on TensorE, the row group on S (scale, mask, softmax, in
whatever form the lowering produced it) on Vector/Scalar, then O = P V on TensorE, with S and P
kept in SBUF and PSUM: the [rows, keys] scores never go to HBM.

Note [attention kernel]: the fuse pass groups `matmul(Q, Kᵀ)`, the reshapes and row ops after it
(`row_plan.plan` with the key axis as the row) and `matmul(P, V)`. Per batch (head) the kernel
loads Kᵀ [D, N] (or K, transposed on chip) and V ([128, Dv] tiles over the keys) once, reading
them in place (Note [attention operands] in attention_operands.py); per block of 128 query rows it
- transposes the Q block on TensorE (Qᵀ [D, rows]: the contraction on partitions), computes the
  scores in [rows, 512] PSUM banks and copies them to one [rows, N] SBUF tile, applying the
  scores' first op if it is a constant scale (`evac`);
- runs the row group on that tile as one RowKernel step (every op sees the whole key row, so a
  softmax's max and sum are exact, no online rescaling; exp and the row sum are one ScalarE
  activation_reduce);
- transposes P 128 keys at a time on TensorE and accumulates P V over the key tiles in one PSUM
  bank.
Key tiles that a constant mask (a causal one) makes irrelevant to a query block are skipped:
no scores, no row group columns, no P V for them (Note [dead keys], codegen/dead_keys.py).
Such a mask is made on chip, an iota and a compare for the tiles the select runs on (Note
[generated masks]), and the kernel that computed it into HBM is not emitted (lower.py). Where
P itself is read outside (a training forward saves it), its skipped keys are exactly 0 and are
stored from a zero tile (`zero_fill`).
Where P is then `e / s` for the row sum s (the safe-softmax select settled), the row group
stops at e and the output rows are scaled by 1 / s as they leave PSUM, FlashAttention's
deferred normalisation: one pass over the scores fewer (`with_key_facts`).
The blocks are software-pipelined (Note [attention pipeline]). A whole key row must fit in SBUF
and a block's scores in the PSUM banks (`attention_plan` checks: up to 3072 keys); longer rows,
head dimensions over 128 and targets without an exact TensorE transpose (P would have to
round-trip through HBM) are left unfused: the row group and matmuls then run as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen import dead_keys, isa
from neuroncc.codegen.attention_operands import load_kind, operands
from neuroncc.codegen.builder import TilePool
from neuroncc.codegen.costs import dma_ns, instr_ns
from neuroncc.codegen.emit import EmitCtx, P, rect
from neuroncc.codegen.emit_fused import GENERATED_BYTES, RowKernel, generated_values
from neuroncc.codegen.pe_transpose import PeTransposer
from neuroncc.codegen.row_plan import RowPlan, plan, sbuf_bytes
from neuroncc.codegen.targets import Target
from neuroncc.codegen.views import View
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
    evac: tuple[str, float] | None = None  # (op, constant) applied as the scores leave PSUM
    live: tuple[int, ...] | None = None  # keys computed per query block (Note [dead keys])
    aliases: tuple[tuple[int, int], ...] = ()  # row values taken as an input (RowKernel)
    # (the division P was, the row value it divided by): the output rows are divided instead
    deferred: tuple[int, int] | None = None
    elided: frozenset[int] = frozenset()  # nodes of the group not emitted (_mask_as_select)
    # selects -> per query block, leading keys where they pass their input through (dead_keys)
    true_prefix: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # inputs of the row group made on chip: id -> (base, pstep, fstep) (Note [generated masks])
    generated: tuple[tuple[int, tuple[int, int, int]], ...] = ()
    zero_fill: bool = False  # P is read outside: its dead keys are stored as zeros

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
        return _kernel_bytes(self) + sbuf_bytes(self.rows, self.row_plan, self.row_rounds)


def attention_plan(
    nodes: Sequence[Node], users: dict, outputs: set[int], t: Target
) -> AttentionPlan | None:
    """The plan of `nodes` = [matmul, reshapes and row ops, matmul] as one attention kernel,
    or None. `users` and `outputs` are the graph's: only P (and what the row group makes) may
    be read outside the kernel, never the scores."""
    if len(nodes) < 3 or nodes[0].op is not Op.MATMUL or nodes[-1].op is not Op.MATMUL:
        return None
    if not t.pe_exact_transpose:
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
    rows, elided = _mask_as_select(rows, users, outputs)
    given, evac = s_ids, _evacuation_op(rows, s_ids, users)
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
        mm1, mm2, rows, rp, *ids, math.prod(batch), m, d, n, dv, evac=evac_op, elided=elided
    )
    for unit in (2, 1):  # two blocks per step where they fit, so their row groups interleave
        ap = replace(base, unit=unit)
        fits = ap.sbuf_bytes() <= SBUF_SHARE * t.sbuf_partition_bytes
        if fits and _psum_banks(ap, t) is not None:
            return ap
    return None


def _mask_as_select(
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


def _evacuation_op(rows: Sequence[Node], s_ids: set[int], users: dict) -> tuple[Node, float] | None:
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


def _psum_banks(ap: AttentionPlan, t: Target) -> tuple[int, int] | None:
    """(score banks, transpose banks), beside one bank of P V accumulators (and one for Q's
    transposes when Q and P differ in dtype). A step's scores must fit the score banks at
    once: their copies to SBUF are issued after all of the step's matmuls. Scores of two
    steps where that leaves a bank per four transposes of one step's P."""
    free = t.psum_partition_bytes // t.psum_bank_bytes - 1
    free -= ap.scores.inputs[0].type.dtype != ap.out.inputs[0].type.dtype
    need = ap.unit * ap.chunks
    if need > free - 1:
        return None
    want_t = math.ceil(ap.unit * math.ceil(ap.n / P) / 4)
    s_banks = min(2 * need, max(need, free - want_t))
    return s_banks, free - s_banks


def _kernel_bytes(ap: AttentionPlan) -> int:
    """SBUF per partition beside the row group's (emit_attention's pools): Kᵀ and V of the
    heads in flight, Q and Qᵀ blocks, score rows, two steps' Pᵀ tiles, output tiles and the
    transposes' identities."""
    qd = ap.scores.inputs[0].type.dtype.itemsize
    sd = ap.scores.out.type.dtype.itemsize
    pd = ap.out.inputs[0].type.dtype.itemsize
    od = ap.out.out.type.dtype.itemsize
    key_tiles = math.ceil(ap.n / P)
    kv = _heads_alive(ap) * (ap.n * qd + key_tiles * ap.dv * pd)
    u = ap.unit
    blocks = 2 * ap.d * qd + u * (
        2 * ap.d * qd + 3 * P * qd + 3 * ap.n * sd + 2 * key_tiles * P * pd
    )
    inverses = 4 * u * 64  # 1 / row sum of the steps in flight (`deferred`)
    extra = inverses + GENERATED_BYTES + ZERO_COLS * pd  # (a generated mask, zeros of P)
    return kv + blocks + 2 * u * ap.dv * od + 2 * P * (max(qd, pd) + 4) + extra


def _heads_alive(ap: AttentionPlan) -> int:
    """Heads whose Kᵀ and V are on chip at once: the pipeline (Note [attention pipeline])
    spans SPAN steps, from the first block's Qᵀ to the last one's P V."""
    per_head = math.ceil(ap.m / P)
    return min(ap.batch, math.ceil(SPAN * ap.unit / per_head) + 1)


def loads_ahead(ap: AttentionPlan, t: Target) -> int:
    """Pipeline steps that a block's Qᵀ (and a new head's Kᵀ and V) are loaded ahead of its row
    group (Note [attention pipeline]): three, so that the loads hide behind the steps between;
    two where a head's loads and stores take longer than its TensorE work (short rows of keys,
    in 256-byte runs). TensorE would then wait, behind transposes of data still in flight,
    instead of finishing the P V of earlier steps, whose stores the DMAs are waiting for."""
    qd, pd = ap.scores.inputs[0].type.dtype, ap.out.inputs[0].type.dtype
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

    heads, blocks = ap.batch, query_blocks(ap)
    dma = moved(ap.m, ap.d, qd) + moved(ap.n, ap.d, qd) + moved(ap.n, ap.dv, pd)
    dma += moved(ap.m, ap.dv, od)
    work = (len(blocks) + heads * math.ceil(ap.n / P)) * pe(ap.d, P, qd, True)  # Qᵀ, Kᵀ
    for keys in ap.live or [ap.n] * len(blocks):  # (Note [dead keys])
        work += sum(pe(P, min(512, keys - c0), qd) for c0 in range(0, keys, 512))  # scores
        work += math.ceil(keys / P) * (pe(P, P, pd, True) + pe(P, ap.dv, pd))  # Pᵀ, P V
    work /= heads
    return 2 if dma > work else 3


Block = tuple[int, int, int]  # (batch, first query row, rows)


def query_blocks(ap: AttentionPlan) -> list[Block]:
    return [(bi, r0, min(P, ap.m - r0)) for bi in range(ap.batch) for r0 in range(0, ap.m, P)]


def with_key_facts(g: Graph, ap: AttentionPlan) -> AttentionPlan:
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
    facts = dead_keys.analyse(g, ap.rows, sorted(ap.given), ap.p_id, blocks, ap.m, ap.n, P)
    aliases = dict(facts.settled)
    # P through the selects it is taken as: e / s, with s one value per row?
    chain, vid = [ap.p_id], ap.p_id
    while vid in aliases:
        vid = aliases[vid]
        chain.append(vid)
    node = next((x for x in ap.rows if x.out.id == vid), None)
    deferred = None
    if _divides_by_row(node, ap.rows) and not any(read_outside(v) for v in (*chain, *ap.p_chain)):
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
    return {
        group[0].out.id: attention_plan(group, users, outputs, t)
        for group in g.kernel_groups()
        if len(group) > 1 and group[0].op is Op.MATMUL is group[-1].op
    }


def emit_attention(ctx: EmitCtx, ap: AttentionPlan) -> None:
    b, t = ctx.b, ctx.target
    q = ap.scores.inputs[0]
    qdt, sdt = q.type.dtype, ap.scores.out.type.dtype
    pdt, odt = ap.out.inputs[0].type.dtype, ap.out.out.type.dtype
    m, d, n, dv = ap.m, ap.d, ap.n, ap.dv
    nf = t.pe_moving_fmax
    out = ctx.alloc(ap.out.out)
    qv, kv, vv = (ctx.views.get(x.id) or View.of(x) for x in operands(ap))
    # Qᵀ already in HBM (a transpose folded into its matmul readers): load it as it is
    folded = ctx.transposed_view.get(q.id) if q.id not in ctx.views else None
    inside = frozenset({ap.scores.out.id, ap.out.out.id, *ap.s_ids, *ap.p_chain, *ap.elided})
    key_tiles = [(k0, min(P, n - k0)) for k0 in range(0, n, P)]
    chunks = [(c0, min(nf, n - c0)) for c0 in range(0, n, nf)]
    s_banks, t_banks = _psum_banks(ap, t)
    transpose_p = PeTransposer(ctx, pdt, banks=t_banks)
    transpose_q = transpose_p if qdt == pdt else PeTransposer(ctx, qdt)
    s_psum = b.psum_pool(bufs=s_banks)
    o_bank = b.psum_pool(bufs=1)
    o_slot = -(-dv * 4 // 64) * 64
    o_psum = TilePool("psum", o_bank.base, o_slot, bufs=t.psum_bank_bytes // o_slot)
    alive, u = _heads_alive(ap), ap.unit
    kt_pool = b.sbuf_pool(n * qdt.itemsize, bufs=alive)
    v_pool = b.sbuf_pool(dv * pdt.itemsize, bufs=alive * len(key_tiles))
    q_pool = b.sbuf_pool(d * qdt.itemsize, bufs=2 * u)
    k_pool = b.sbuf_pool(d * qdt.itemsize, bufs=2)
    qt_pool = b.sbuf_pool(P * qdt.itemsize, bufs=3 * u)
    s_pool = b.sbuf_pool(n * sdt.itemsize, bufs=3 * u)
    pt_pool = b.sbuf_pool(P * pdt.itemsize, bufs=2 * u * len(key_tiles))
    o_pool = b.sbuf_pool(dv * odt.itemsize, bufs=2 * u)
    inv_pool = b.sbuf_pool(64, bufs=4 * u)
    # The row group's pools last: nearest the previous kernel's tiles (Note [kernel
    # placement]), as the row group is the last phase to start.
    row = RowKernel(
        ctx,
        ap.rows,
        ap.row_plan,
        n,
        n,
        inside=inside,
        reserve=_kernel_bytes(ap),
        rounds=ap.row_rounds,
        aliases=dict(ap.aliases),
        keep=(ap.deferred[1],) if ap.deferred else (),
        generated={vid: (*form, m) for vid, form in ap.generated},
    )
    # P is e / s computed as e, the output rows divided by s (FlashAttention's deferred
    # normalisation), where the row kernel takes the division as its numerator's tile.
    deferred = ap.deferred if ap.deferred and ap.deferred[0] in row.aliased else None
    blocks = query_blocks(ap)
    keys = dict(zip(blocks, ap.live or [n] * len(blocks), strict=True))  # Note [dead keys]
    block_index = {blk: i for i, blk in enumerate(blocks)}
    steps = [blocks[i : i + u] for i in range(0, len(blocks), u)]
    heads: dict[int, tuple[isa.TileRef, list[isa.TileRef]]] = {}
    # What each phase of a block leaves for the next: Qᵀ, the scores in PSUM, in SBUF, P, Pᵀ.
    qts: dict[Block, isa.TileRef] = {}
    s_ps: dict[Block, list[isa.TileRef]] = {}
    s_sb: dict[Block, isa.TileRef] = {}
    ps: dict[Block, isa.TileRef] = {}
    pts: dict[Block, list[isa.TileRef]] = {}
    inverses: dict[Block, isa.TileRef] = {}

    def head(bi: int) -> tuple[isa.TileRef, list[isa.TileRef]]:
        """Kᵀ [D, N] and V's key tiles of batch bi, loaded once."""
        if bi not in heads:
            heads.pop(bi - alive, None)  # its tiles are taken again
            k_t = kt_pool.tile(d, (n,), qdt)
            off = kv.batch_offset(bi)
            if load_kind(kv, "keys") == "kt":
                b.dma(k_t, rect(ctx.buf(kv.base), qdt, off, kv.strides[-2], d, n))
            else:  # K's rows, transposed on chip
                for k0, kw in key_tiles:
                    kb = k_pool.tile(kw, (d,), qdt)
                    src = rect(
                        ctx.buf(kv.base), qdt, off + k0 * kv.strides[-1], kv.strides[-1], kw, d
                    )
                    b.dma(kb, src)
                    transpose_q(k_t.cols(k0, kw), kb)
            vs = []
            off, stride = vv.batch_offset(bi), vv.strides[-2]
            for k0, kw in key_tiles:
                vt = v_pool.tile(kw, (dv,), pdt)
                b.dma(vt, rect(ctx.buf(vv.base), pdt, off + k0 * stride, stride, kw, dv))
                vs.append(vt)
            heads[bi] = (k_t, vs)
        return heads[bi]

    def load_qt(blk: Block) -> None:
        bi, r0, rp = blk
        head(bi)
        qts[blk] = qt = qt_pool.tile(d, (rp,), qdt)
        if folded is not None:
            b.dma(qt, rect(folded, qdt, bi * d * m + r0, m, d, rp))
            return
        qb = q_pool.tile(rp, (d,), qdt)
        stride = qv.strides[-2]
        b.dma(qb, rect(ctx.buf(qv.base), qdt, qv.batch_offset(bi) + r0 * stride, stride, rp, d))
        transpose_q(qt, qb)

    def live_chunks(blk: Block) -> list[tuple[int, int]]:
        return [(c0, min(w, keys[blk] - c0)) for c0, w in chunks if c0 < keys[blk]]

    def score_matmuls(blk: Block) -> None:
        k_t, qt = heads[blk[0]][0], qts.pop(blk)
        s_ps[blk] = [s_psum.tile(blk[2], (w,), DType.F32) for _, w in live_chunks(blk)]
        for (c0, w), dst in zip(live_chunks(blk), s_ps[blk], strict=True):
            mm = isa.Matmul("pe", dst=dst, stationary=qt, moving=k_t.cols(c0, w), accumulate=False)
            b.emit(mm)

    def score_copies(blk: Block) -> None:
        s_sb[blk] = s = s_pool.tile(blk[2], (keys[blk],), sdt)
        for (c0, w), src in zip(live_chunks(blk), s_ps.pop(blk), strict=True):
            engine, dst = transpose_p.evacuation_engine(), s.cols(c0, w)
            if ap.evac is None:
                b.emit(isa.TensorCopy(engine, dst=dst, src=src))
            else:
                op, scalar = ap.evac
                b.emit(isa.TensorScalar(engine, op=op, dst=dst, src=src, scalar=scalar))

    def softmax(step: list[Block]) -> None:
        specs = [
            (
                bi * m + r0,
                rp,
                0,
                keys[bi, r0, rp],
                dict.fromkeys(ap.given, s_sb.pop((bi, r0, rp))),
                {sel: prefix[block_index[bi, r0, rp]] for sel, prefix in ap.true_prefix},
            )
            for bi, r0, rp in step
        ]
        for blk, tiles in zip(step, row.steps(specs), strict=True):
            ps[blk] = tiles[ap.p_id]
            if ap.zero_fill:
                store_zeros(blk)
            if deferred is not None:
                inverses[blk] = inv = inv_pool.tile(blk[2], (1,), DType.F32)
                src = tiles[deferred[1]]
                b.emit(isa.Activation("act", func="reciprocal", dst=inv, src=src))

    p_value = next(x.out for x in ap.rows if x.out.id == ap.p_id)
    if ap.zero_fill:
        zeros = b.sbuf_pool(ZERO_COLS * p_value.type.dtype.itemsize, bufs=1).tile(
            P, (ZERO_COLS,), p_value.type.dtype
        )
        b.emit(isa.Memset("pool", dst=zeros, value=0.0))

    def store_zeros(blk: Block) -> None:
        """P's dead keys of a block (Note [dead keys]: exactly 0 there), from the zero tile."""
        bi, r0, rp = blk
        row = (bi * m + r0) * n
        for c0 in range(keys[blk], n, ZERO_COLS):
            w = min(ZERO_COLS, n - c0)
            dst = rect(ctx.buf(p_value), p_value.type.dtype, row + c0, n, rp, w)
            b.dma(dst, zeros.rows(rp).cols(0, w))

    def transpose_probs(blk: Block) -> None:
        p_tile, rp = ps.pop(blk), blk[2]
        live = [(k0, kw) for k0, kw in key_tiles if k0 < keys[blk]]
        pts[blk] = [pt_pool.tile(kw, (rp,), pdt) for _, kw in live]
        for (k0, kw), pt in zip(live, pts[blk], strict=True):
            transpose_p(pt, p_tile.cols(k0, kw))

    def times_v(blk: Block) -> None:
        bi, r0, rp = blk
        p_tiles = pts.pop(blk)
        vs = heads[bi][1][: len(p_tiles)]
        o_ps = o_psum.tile(rp, (dv,), DType.F32)
        for i, (pt, vt) in enumerate(zip(p_tiles, vs, strict=True)):
            b.emit(isa.Matmul("pe", dst=o_ps, stationary=pt, moving=vt, accumulate=i > 0))
        ot = o_pool.tile(rp, (dv,), odt)
        engine = transpose_p.evacuation_engine()
        if blk in inverses:  # ScalarE or VectorE: a per-partition scale
            b.emit(isa.TensorTensor(engine, op="mul", dst=ot, a=o_ps, b=inverses.pop(blk)))
        else:
            b.emit(isa.TensorCopy(engine, dst=ot, src=o_ps))
        b.dma(rect(out, odt, bi * m * dv + r0 * dv, dv, rp, dv), ot)

    def each(phase):
        return lambda step: [phase(blk) for blk in step]

    # Note [attention pipeline]: pipeline step s issues step s's row group, then work of other
    # steps in the order their engines can take it, so that what each engine reaches next was
    # made ready while the row group (the longest phase, on Vector/Scalar/GpSimd) ran. A
    # step's score copies come before the next step's score matmuls: PSUM banks are reused
    # only after the program has read them. Qᵀ is loaded `loads_ahead` steps ahead.
    phases = (
        (0, softmax),
        (-1, each(transpose_probs)),
        (loads_ahead(ap, t), each(load_qt)),
        (1, each(score_copies)),
        (2, each(score_matmuls)),
        (-2, each(times_v)),
    )
    for s in range(-3, len(steps) + 2):
        for offset, phase in phases:
            if 0 <= s + offset < len(steps):
                phase(steps[s + offset])
