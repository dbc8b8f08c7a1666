"""The attention backward as one kernel: dP, dS and D stay on chip, dK and dV accumulate in PSUM.
This is the kernel's plan (what the fuse pass groups); emit_attention_backward.py emits it.

Note [attention backward]: AOTAutograd differentiates softmax attention O = P V, P =
softmax(scale * Q Kᵀ) into (dO the output's gradient, D one value per query row)

    D  = rowsum(dO * O)            dP = dO Vᵀ            dS = P * (dP - D)
    dV = Pᵀ dO                     dQ = dS K  (* scale)  dK = dSᵀ Q  (* scale)

Run op by op, the [rows, keys] tensors dP and dS go through HBM twice each and P once more
for Pᵀ. The fuse pass groups the pattern (`match`, from the node dS = P * (dP - D)) and this
kernel runs it per head, per key block (every key at once where PSUM holds a query block's
dP and the keys' dK and dV, Note [key blocks]), per 128-row query block:
- D on VectorE (a product and a row sum); dOᵀ transposed on TensorE; dP = dOᵀ.T Vᵀ in
  [rows, 512] PSUM banks; dS = (dP - D) on ScalarE as dP leaves PSUM, times P on VectorE;
- dV += P[:, keys].T dO and dK += dS[:, keys].T Q for every 128-key tile: P and dS are
  already [rows, keys], the contraction (the query rows) on partitions, so they are the
  stationary operands as they are, and the sums over the query blocks build up in PSUM;
- dQ = dS K needs the keys on partitions: dS is transposed 128 keys at a time on TensorE and
  the products accumulate in PSUM.
dQ leaves PSUM scaled and goes out per query block, dK and dV once per key block. The steps
are software-pipelined, so that TensorE does not wait for the Vector/Scalar work on dS (Note
[backward pipeline] in emit_attention_backward.py). The scores' mask needs nothing here: masked keys have P = 0, hence
dS = 0. The kernel reads and writes each tensor once: GPT-2's block at 512 (12 heads of 64),
the backward 1604 -> 1302 us, its attention part 473 -> 199 us and 85 -> 25 MB. Where dQ, dK
and dV only feed the concat of the QKV projection's gradient, they are stored into it
(Note [gradients in place], attention_gradients.py): 1235 -> 1195 us.

Note [key blocks]: FlashAttention-2's loop order, keys outside, queries inside. A key block's
dK and dV accumulate in PSUM over the query blocks, so PSUM bounds its keys (`_fitted` takes
the widest that fits: at a head size of 64, 1536 keys with two blocks' dP in flight; at 128,
512), not the sequence. dQ of a query block is then a sum over the key blocks: the first
block's product is copied to an fp32 tile of that query block's rows in SBUF, the others are
added to it, the last one's leaves scaled (`accumulates_dq`: rows x D x 4 bytes per
partition for a head's queries, 16 KiB at 4096 tokens and D 128). D = rowsum(dO * O) is made
at the first key block and kept for the others. What a key block costs again is the loads of
dO, Q and P's columns for each query block and dOᵀ's transpose: about 2 D of HBM per query
row a key block, beside P's row of keys.

The pattern is the one PyTorch's SDPA backward gives (math and flash forms decompose to it).
Softmax written out in a model gives softmax's own backward, dS = P dP - P rowsum(P dP), and
often dKᵀ = Qᵀ dS: that form is not matched, and runs as separate kernels.

Note [inputs at the boundary]: the matcher follows each input through the reshapes that keep
its matrices to where they start, to see that dP, D and dV read one dO, but the kernel reads
the value its own nodes read (`_read_from`): the graph stores that one, not always the start. With
activation checkpointing the backward makes the forward's Q again; the scores' matmul and
dK = dSᵀ Q read one reshape of it (CSE), and the fuse pass puts that reshape last in the
elementwise kernel that makes Q, which then stores the reshape and never Q. The reshape has
Q's elements in Q's order, with the batch axes shaped otherwise (`View.batch_offset` counts
matrices).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from neuroncc.codegen.executable.builder import ALIGN
from neuroncc.codegen.executable.loops import loop_bufs
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels import attention_recompute as recompute
from neuroncc.codegen.kernels.attention_gradients import Gradient, concat_of, view_as
from neuroncc.codegen.kernels.attention_recompute import Recompute
from neuroncc.codegen.kernels.emit import P
from neuroncc.codegen.kernels.views import View, strided_view, unread_chain_nodes
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

SBUF_SHARE = 0.85  # of a partition, for the whole kernel


@dataclass(frozen=True)
class BackwardPlan:
    # the inputs, as the kernel reads them (Note [inputs at the boundary])
    p: Value  # the softmax probabilities [B.., M, N] (saved by the forward, or `recompute`)
    d_out: Value  # dO [B.., M, D]
    o: Value  # the forward's output O [B.., M, D]
    v_t: Value  # Vᵀ [B.., D, N]
    k: Value  # K [B.., N, D]
    q: Value  # Q [B.., M, D]
    dq: Gradient
    dk: Gradient
    dv: Gradient
    members: frozenset[int]  # the nodes of the kernel
    batch: int
    m: int
    n: int
    d: int
    key_block: int = 0  # keys per key block (Note [key blocks]); 0: all n
    recompute: Recompute | None = None  # P made in the kernel (Note [P recomputed])
    dp_sets: int = 2  # blocks whose dP are in PSUM at once
    kv_sets: int = 2  # key blocks whose dK and dV accumulators are in PSUM at once

    @property
    def block_keys(self) -> int:
        return self.key_block or self.n

    @property
    def key_blocks(self) -> list[tuple[int, int]]:
        """(first key, keys) of each key block."""
        kb = self.block_keys
        return [(k0, min(kb, self.n - k0)) for k0 in range(0, self.n, kb)]

    @property
    def query_blocks(self) -> list[tuple[int, int]]:
        return [(r0, min(P, self.m - r0)) for r0 in range(0, self.m, P)]

    @property
    def tiles_per_block(self) -> int:
        return math.ceil(self.block_keys / P)

    @property
    def accumulates_dq(self) -> bool:
        """dQ sums over several key blocks: its rows wait in SBUF for the last one."""
        return len(self.key_blocks) > 1

    def dp_chunks(self, t: Target, keys: int | None = None) -> list[tuple[int, int]]:
        """dP's [rows, <= 512] PSUM banks of a key block of `keys` (the whole block's)."""
        w, keys = t.pe_moving_fmax, keys or self.block_keys
        return [(c0, min(w, keys - c0)) for c0 in range(0, keys, w)]

    def kv_slot(self) -> int:
        """PSUM bytes per partition of a [keys, D] dK or dV accumulator: a power of two, so
        that none straddles two banks."""
        return max(64, 1 << (4 * self.d - 1).bit_length())

    def kv_banks(self, t: Target) -> int:
        """PSUM banks of one key block's dK and dV."""
        return math.ceil(2 * self.tiles_per_block * self.kv_slot() / t.psum_bank_bytes)

    def psum_banks(self, t: Target) -> int:
        """dP's, dK's and dV's, one for dQ, one for the transposes."""
        scores = len(self.dp_chunks(t)) if self.recompute else 0  # a step's S
        return (self.dp_sets * len(self.dp_chunks(t)) + scores + self.kv_sets * self.kv_banks(t)
                + 2)  # fmt: skip

    def pools(self) -> dict[str, tuple[int, int]]:
        """The kernel's SBUF pools: name -> (bytes per partition of a slot, slots)."""
        it = self.p.type.dtype.itemsize
        kt, d, kb = self.tiles_per_block, self.d, self.block_keys
        query_blocks = len(self.query_blocks)
        # K's tiles: the key blocks of three steps (Note [backward pipeline]), or a few more
        # so that a head's key blocks turn the pool whole (Note [backward loop])
        k_bufs = loop_bufs(3 * kt, 4 * len(self.key_blocks) * kt)
        pools = {
            "k": (d * it, k_bufs),
            "vt": (kb * it, 2),
            "rows": (d * it, 12),  # dO, O, Q blocks: two steps in flight, and one loading
            "prod": (d * 4, 2),
            "d": (4, query_blocks if self.accumulates_dq else 4),
            # P and dS of three steps, and a fourth: a head's steps, a multiple of four
            # where its query blocks are, then turn the pools whole (Note [backward loop])
            "p": (kb * it, 4),
            "ds": (kb * it, 4),
            "do_t": (P * it, 2),
            "ds_t": (P * it, 2 * kt),
            "dq": (d * it, 2),
            "dkv": (d * it, 4 * kt),
        }
        if self.accumulates_dq:
            pools["dq_sum"] = (d * 4, query_blocks)
        if self.recompute:  # P comes from the row group's pools, S and Qᵀ and Kᵀ are made
            del pools["p"]
            qd = self.recompute.q.type.dtype.itemsize
            pools |= {"q_t": (P * qd, 2), "k_t": (kb * qd, 2), "s": (kb * 4, 2)}
            pools["zeros"] = (d * it, 1)  # dK and dV of keys no query reaches (dead keys)
            if not self.reads_q_once:
                pools["q_s"] = (d * qd, 4)
        return pools

    @property
    def reads_q_once(self) -> bool:
        """The scores read the Q rows that dK = dSᵀ Q reads (Note [P recomputed])."""
        return self.recompute is None or self.recompute.q.id == self.q.id

    def inputs(self) -> list[Value]:
        """What the kernel reads from HBM (beside the recomputation's row group's inputs)."""
        rc = self.recompute
        p = [x for x in (rc.q, rc.k_t) if x is not None] if rc else [self.p]
        return [*p, self.d_out, self.o, self.v_t, self.k, self.q]

    def sbuf_bytes(self) -> int:
        rounded = sum(-(-slot // ALIGN) * ALIGN * bufs for slot, bufs in self.pools().values())
        rows = self.recompute.sbuf_bytes(self.block_keys) if self.recompute else 0
        return rounded + rows + 2 * P * (self.p.type.dtype.itemsize + 4)  # (the identity)


def _source(v: Value, producers: dict[int, Node]) -> Value:
    """v under the reshapes that keep its matrices (the last two axes): the same data."""
    while v.id in producers and producers[v.id].op is Op.RESHAPE:
        x = producers[v.id].inputs[0]
        if x.type.shape[-2:] != v.type.shape[-2:]:
            break
        v = x
    return v


def _swaps_last_two(n: Node) -> bool:
    """A transpose of the last two axes; or, where one of them has size 1 (one query row),
    the reshape simplify makes of it (`_transpose_as_reshape`)."""
    if n.op is Op.RESHAPE:  # batch axes may be regrouped, as reshapes merge
        x, out = n.inputs[0].type.shape, n.out.type.shape
        if len(x) < 2 or len(out) < 2 or 1 not in x[-2:]:
            return False
        return out[-2:] == (x[-1], x[-2]) and math.prod(out[:-2]) == math.prod(x[:-2])
    if n.op is not Op.TRANSPOSE:
        return False
    perm = tuple(n.attr("perm"))
    r = len(perm)
    return r >= 2 and perm == (*range(r - 2), r - 1, r - 2)


class _Matcher:
    """The pattern's nodes as `match` finds them: `members`, the nodes the kernel computes
    (and the reshapes and transposes between them), and `views`, the reshapes from which it
    reads its inputs' data, in the kernel where only the kernel reads them."""

    def __init__(self, producers: dict[int, Node], users: dict, outputs: set[int]) -> None:
        self.producers, self.users, self.outputs = producers, users, outputs
        self.members: set[int] = set()
        self.views: set[int] = set()

    def src(self, v: Value) -> Value:
        """v's source (`_source`); the reshapes walked through are views."""
        s = _source(v, self.producers)
        while v.id != s.id:
            self.views.add(v.id)
            v = self.producers[v.id].inputs[0]
        return s

    def made_by(self, v: Value, op: Op) -> Node | None:
        """v's producer (a member), if it is an `op`."""
        n = self.producers.get(v.id)
        if n is None or n.op is not op:
            return None
        self.members.add(v.id)
        return n

    def readers(self, v: Value) -> list[tuple[Node, Value]]:
        """Who reads v's data, through reshapes (members): (reader, the value it reads)."""
        found = []
        for u in self.users[v.id]:
            if _keeps_matrices(u, v):
                self.members.add(u.out.id)
                found += self.readers(u.out)
            else:
                found.append((u, v))
        return found

    def gradient(self, mm: Node) -> Gradient:
        """mm and what the kernel stores of it: its reshapes and one constant multiple, where
        each is the only reader of the value before."""
        self.members.add(mm.out.id)
        v, scale = mm.out, 1.0
        while len(self.users[v.id]) == 1 and v.id not in self.outputs:
            (u,) = self.users[v.id]
            if u.op is Op.MUL and scale == 1.0 and u.out.type == v.type:
                other = u.inputs[1] if u.inputs[0].id == v.id else u.inputs[0]
                c = self.producers.get(other.id)
                if c is None or c.op is not Op.FULL or other.type != v.type or other.id == v.id:
                    break
                scale = float(c.attr("value"))
                self.views.add(other.id)  # the constant: in the kernel if only it reads it
            elif u.op is not Op.RESHAPE:
                break
            v = u.out
            self.members.add(v.id)
        return Gradient(mm, v, scale)

    def closed(self, stored: set[int]) -> set[int] | None:
        """The kernel's nodes: the members, and the views only the kernel reads; None if a
        member's value other than `stored` is read outside."""
        members = set(self.members)
        grown = True
        while grown:
            new = {
                vid
                for vid in self.views - members
                if vid not in self.outputs and all(u.out.id in members for u in self.users[vid])
            }
            members |= new
            grown = bool(new)
        for vid in members - stored:
            if vid in self.outputs or any(u.out.id not in members for u in self.users[vid]):
                return None
        return members


def match(
    ds: Node, producers: dict[int, Node], users: dict, outputs: set[int], t: Target
) -> BackwardPlan | None:
    """The attention backward whose dS = P * (dP - D) is `ds` (Note [attention backward]), or
    None: the nodes must have that form, only dQ, dK and dV may be read outside, and the
    kernel must fit SBUF and PSUM. `producers`, `users` and `outputs` are the graph's."""
    if ds.op is not Op.MUL or not ds.out.type.dtype.is_float:
        return None
    mt = _Matcher(producers, users, outputs)
    sides = [x for x in (ds.inputs, ds.inputs[::-1]) if _made_by(x[1], Op.SUB, producers)]
    if not sides:
        return None
    p_side, sub_side = sides[0]
    mt.members.add(ds.out.id)
    sub = mt.made_by(mt.src(sub_side), Op.SUB)
    p = mt.src(p_side)
    rc = recompute.find(p, producers, users, outputs, t, P)  # (_fitted: the widest)
    if rc is not None:
        mt.members |= rc.members
    dp = mt.made_by(mt.src(sub.inputs[0]), Op.MATMUL)
    bcast = mt.made_by(sub.inputs[1], Op.BROADCAST)
    if dp is None or bcast is None:
        return None
    row = bcast.inputs[0]  # D, through a keepdim reshape ([.., M] -> [.., M, 1])
    if producers.get(row.id) is not None and producers[row.id].op is Op.RESHAPE:
        mt.members.add(row.id)
        row = producers[row.id].inputs[0]
    rsum = mt.made_by(row, Op.REDUCE_SUM)
    if rsum is None or tuple(rsum.attr("axes")) not in ((rsum.inputs[0].type.rank - 1,), (-1,)):
        return None
    prod = mt.made_by(rsum.inputs[0], Op.MUL)
    if prod is None:
        return None
    d_out, v_t = mt.src(dp.inputs[0]), mt.src(dp.inputs[1])
    pair = [mt.src(x) for x in prod.inputs]
    if d_out.id not in (pair[0].id, pair[1].id):
        return None
    o = pair[1] if pair[0].id == d_out.id else pair[0]
    # dS's readers: dQ = dS K, and dSᵀ for dK = dSᵀ Q
    dq = dk = None
    for u, via in mt.readers(ds.out):
        if u.op is Op.MATMUL and u.inputs[0].id == via.id and dq is None:
            dq = u
        elif _swaps_last_two(u) and dk is None:
            mt.members.add(u.out.id)
            dk = next((x for x, xv in mt.readers(u.out) if x.op is Op.MATMUL), None)
            if dk is None or dk.inputs[0].id not in mt.members | {u.out.id}:
                return None
        else:
            return None
    # P's other reader: Pᵀ for dV = Pᵀ dO
    dv = None
    for u, _ in _data_readers(p, mt):
        if _swaps_last_two(u) and dv is None:
            for x, xv in _data_readers(u.out, mt):
                reads_do = _source(x.inputs[1], producers).id == d_out.id
                if x.op is Op.MATMUL and x.inputs[0].id == xv.id and reads_do:
                    mt.src(u.inputs[0])
                    mt.members.add(u.out.id)
                    mt.readers(u.out)  # its reshapes: members
                    dv = x
    if dq is None or dk is None or dv is None:
        return None
    k, q = mt.src(dq.inputs[1]), mt.src(dk.inputs[1])
    mt.src(dv.inputs[1])
    grads = [mt.gradient(x) for x in (dq, dk, dv)]
    *batch, m, n = p.type.shape
    d = d_out.type.shape[-1]
    shapes = {p.id: (m, n), d_out.id: (m, d), o.id: (m, d), v_t.id: (d, n), k.id: (n, d)}
    shapes[q.id] = (m, d)
    b, dtype = math.prod(batch), p.type.dtype
    for x in (p, d_out, o, v_t, k, q):
        if x is p and rc is not None:
            continue
        if x.type.shape[-2:] != shapes[x.id] or x.type.numel != b * math.prod(shapes[x.id]):
            return None
        if x.type.dtype != dtype or x.id in mt.members:
            return None
    if dtype not in (DType.F32, DType.BF16) or min(b, m, n, d) == 0 or d > P:
        return None
    if any(x.out.type.dtype != dtype for x in (dp, dq, dk, dv, ds, sub)):
        return None
    if not all(map(_elementwise, (ds, sub, prod))) or not all(map(_plain, (dp, dq, dk, dv))):
        return None
    if bcast.inputs[0].type.shape[-2:] != (m, 1) or row.type.numel != b * m:
        return None
    stored = {gr.out.id for gr in grads}
    members = mt.closed(stored)
    if members is None:
        return None
    concat = concat_of(grads, producers, users, mt.outputs)
    if concat is not None:  # (Note [gradients in place])
        grads, chain = concat
        members |= chain
    else:
        grads = [replace(gr, dst=view_as(View.of(gr.out), gr.matmul.out)) for gr in grads]
    reads = (_read_from(x, members, users) for x in (p, d_out, o, v_t, k, q))
    if rc is not None:  # what the kernel reads of Q and Kᵀ for S
        q_s, k_t = (_read_from(x, members, users) for x in (rc.scores.inputs))
        if _transposed_k(rc.k_t, k, producers, users, members) and q_s.type.dtype == k.type.dtype:
            k_t = None  # Kᵀ of the K tiles it loads, on chip
        rc = replace(rc, q=q_s, k_t=k_t)
    base = BackwardPlan(*reads, *grads, frozenset(members), b, m, n, d, recompute=rc)
    return _fitted(base, t)


def _fitted(base: BackwardPlan, t: Target) -> BackwardPlan | None:
    """base with the largest key block (Note [key blocks]) and the most overlap that fit
    SBUF and PSUM: every key at once where it fits, as the kernel ran before key blocks."""
    banks = t.psum_partition_bytes // t.psum_bank_bytes
    wide = t.pe_moving_fmax
    blocks = [0, *range(wide * (base.n // wide), 0, -wide), *range(wide - P, 0, -P)]
    for key_block in dict.fromkeys(kb for kb in blocks if kb < base.n or kb == 0):
        for dp_sets, kv_sets in ((2, 2), (1, 2), (1, 1)):  # overlap where PSUM allows
            bp = replace(base, key_block=key_block, dp_sets=dp_sets, kv_sets=kv_sets)
            fits = bp.sbuf_bytes() <= SBUF_SHARE * t.sbuf_partition_bytes
            if fits and bp.psum_banks(t) <= banks:
                return bp
    return None


def _transposed_k(k_t: Value, k: Value, producers: dict, users: dict, members: set[int]) -> bool:
    """Whether k_t is K transposed (through reshapes that keep its matrices) and only the
    kernel reads what makes it from K: then those nodes join `members`."""
    chain, v = [], k_t
    while v.id in producers and producers[v.id].op is Op.RESHAPE:
        x = producers[v.id]
        if x.inputs[0].type.shape[-2:] != v.type.shape[-2:]:
            break
        chain.append(x)
        v = x.inputs[0]
    made = producers.get(v.id)
    if made is None or not _swaps_last_two(made):
        return False
    if _source(made.inputs[0], producers).id != k.id:
        return False
    chain.append(made)
    ids = {x.out.id for x in chain}
    if not all(u.out.id in members | ids for x in chain for u in users[x.out.id]):
        return False
    members |= ids
    return True


def _read_from(x: Value, members: set[int], users: dict) -> Value:
    """The value the kernel reads x's data from (Note [inputs at the boundary]): x, if the
    kernel reads x itself, else the first of x's reshapes (that keep its matrices) that it
    reads."""
    seen = [x]
    for v in seen:
        if any(u.out.id in members for u in users[v.id]):
            return v
        seen += [u.out for u in users[v.id] if _keeps_matrices(u, v)]
    return x


def _keeps_matrices(u: Node, v: Value) -> bool:
    return u.op is Op.RESHAPE and u.out.type.shape[-2:] == v.type.shape[-2:]


def _elementwise(n: Node) -> bool:
    """n's operands have its shape (sub's second is D broadcast), no implicit broadcasting."""
    return all(x.type.shape == n.out.type.shape for x in n.inputs)


def _plain(n: Node) -> bool:
    """A matmul without batch broadcasting: its operands have its batch axes."""
    return all(x.type.shape[:-2] == n.out.type.shape[:-2] for x in n.inputs)


def _made_by(v: Value, op: Op, producers: dict[int, Node]) -> bool:
    n = producers.get(_source(v, producers).id)
    return n is not None and n.op is op


def _data_readers(v: Value, mt: _Matcher) -> list[tuple[Node, Value]]:
    """Who reads v's data through reshapes, without taking anything in."""
    found = []
    for u in mt.users[v.id]:
        if _keeps_matrices(u, v):
            found += _data_readers(u.out, mt)
        else:
            found.append((u, v))
    return found


def backward_plans(g: Graph, t: Target, memo=None) -> dict[int, BackwardPlan]:
    """For each fused kernel of g that is an attention backward (the fuse pass's
    `match`): its first node's id -> its plan; given a `memo` (dead_keys.Memo, shared with
    the forward kernels'), with its recomputation's key facts (codegen needs them)."""
    plans = {}
    producers, users, outputs = g.producers(), g.users(), {v.id for v in g.outputs}
    for group in g.kernel_groups():
        if sum(n.op is Op.MATMUL for n in group) not in (4, 5):  # (5: Note [P recomputed])
            continue
        ids = {n.out.id for n in group}
        for n in group:
            bp = match(n, producers, users, outputs, t) if n.op is Op.MUL else None
            if bp is not None and bp.members == ids:
                plans[group[0].out.id] = _with_key_facts(g, bp, memo)
                break
    return plans


def _with_key_facts(g: Graph, bp: BackwardPlan, memo) -> BackwardPlan:
    if bp.recompute is None or memo is None:
        return bp
    blocks = [(bi, r0, rp) for bi in range(bp.batch) for r0, rp in bp.query_blocks]
    rc = recompute.with_key_facts(g, bp.recompute, bp.p.id, blocks, bp.m, memo)
    return replace(bp, recompute=rc)


def fold_backward_views(
    g: Graph, plans: Iterable[BackwardPlan]
) -> tuple[dict[int, View], set[int]]:
    """The backward kernels' inputs that views of a value make (dO, the output gradient
    split into heads, is a transpose of the output projection's input gradient): the kernel
    reads them through the views, with rows contiguous, and the views only it reads are not
    made (as Note [attention operands] for the forward). Returns input id -> its view, and
    the ids of the nodes not to emit."""
    producers, users = g.producers(), g.users()
    outputs, in_kernels = {v.id for v in g.outputs}, g.kernel_of()
    views: dict[int, View] = {}
    chains: set[int] = set()
    readers: dict[int, frozenset[int]] = {}  # input id -> the kernel's nodes
    for bp in plans:
        for x in bp.inputs():
            view, chain = strided_view(x, producers, in_kernels)
            if chain and view.strides[-1] == 1:
                views[x.id] = view
                chains.update(chain)
                readers[x.id] = bp.members

    def in_place(u: Node, vid: int) -> bool:
        return u.out.id in readers.get(vid, ())

    return views, unread_chain_nodes(chains, outputs, users, in_place)
