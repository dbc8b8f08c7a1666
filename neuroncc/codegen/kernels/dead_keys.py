"""Which keys an attention kernel may skip: Note [dead keys].

Note [dead keys]: with a causal mask, half the [query, key] scores are -inf before the
softmax; their probabilities are exactly 0, add nothing to the row sum and nothing to P V. The
attention kernel (emit_attention) skips the key tiles of a query block where that holds for
every element: no scores are computed there, the row group runs on the live columns only, and
P V accumulates the live key tiles only. What is skipped must be provably irrelevant for any
finite scores and values, so `live_keys` proves it by abstract interpretation of the row group:

- every value of the row group is abstracted per element as an interval over the ordered
  float categories NI < NF < Z < P1 < PB < PI (-inf, negative finite, +-0, (0, 1], (1, max],
  +inf) plus "may be nan", packed in one uint8 code. The scores are "finite" everywhere;
  values computed outside the kernel from constants only (a causal mask: iota, compare, where)
  are evaluated with the reference interpreter and categorised exactly; anything else is TOP.
- elementwise ops map codes through tables built from each category's extreme values (every
  op used is monotone inside a category, so the extremes bound the result, rounding included);
- one relational fact is kept, the softmax idiom: in `x - max(x)` every element is <= 0 and
  each row holds a 0 if its max is finite, so `exp` of it holds a 1 and its row sum is >= 1.

An element is dead when P is exactly 0 there and every reduction over the keys reads its
identity there (-inf for max, 0 for sum): removing dead elements changes no reduction and no
live element. A query block skips the key tiles after its last tile with a live element.
The same facts settle selects whose condition is one value everywhere (the safe softmax's
`where(row fully masked, 0, P)` when every row keeps a key): the kernel takes the branch
without computing the select (`KeyFacts.settled`); and a select whose condition is true on a
query block's leading keys (the causal mask left of the diagonal) runs on the other keys only
(`KeyFacts.true_prefix`).
Skipping assumes the (scaled) scores and v are finite, as FlashAttention's causal skipping
does: a nan or inf in a skipped key no longer reaches the rows before it. Under the same
assumption the kernel applies an additive mask `x + where(c, 0, -inf)` as `where(c, x, -inf)`
(attention_planner.mask_as_select), a masked score being -inf whatever it was.

Note [generated masks]: a boolean constant the row group reads that is, in every batch, one
side of a diagonal line, `c[i, j] = (base + pstep * i + fstep * j >= 0)` with (pstep, fstep)
= (1, -1) or (-1, 1) (a causal mask, aligned at either corner, or its complement), is made on
chip where it is needed: an iota and a compare per tile, instead of a kernel computing the
mask into HBM and a DMA of it per query block and head (`KeyFacts.affine`, emit_fused's
`RowKernel(generated=...)`). Exact: the iota's values are small integers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from neuroncc.ir import numerics
from neuroncc.ir.graph import Graph, Node, Value, constant_form
from neuroncc.ir.interpret import evaluate_node
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType

NI, NF, Z, P1, PB, PI = range(6)
_N = 6
MAX_CONSTANT_ELEMENTS = 1 << 24  # constants evaluated at compile time, at most

_F32 = np.finfo(np.float32)
_SAMPLES = (
    (-np.inf,),
    (-float(_F32.max), -float(_F32.smallest_subnormal)),
    (-0.0, 0.0),
    (float(_F32.smallest_subnormal), 1.0),
    (float(np.nextafter(np.float32(1), np.float32(2))), float(_F32.max)),
    (np.inf,),
)


def _code(lo, hi, nan):
    return ((np.asarray(lo) * _N + hi) * 2 + nan).astype(np.uint8)


_CODES = np.arange(_N * _N * 2)
LO = (_CODES // 2 // _N).astype(np.uint8)
HI = (_CODES // 2 % _N).astype(np.uint8)
NAN = (_CODES % 2).astype(bool)
FINITE = int(_code(NF, PB, 0))
_BOOL_CODES = _code([Z, P1], [Z, P1], [0, 0])  # False, True
TOP = int(_code(NI, PI, 1))


def categorize(x: np.ndarray) -> np.ndarray:
    """The code of each element of a concrete array (bools as 0 / 1), as float32. A causal
    mask has 16M elements at 4096 tokens: bools map through a table, floats take one pass of
    comparisons per category edge (each true one adds a category)."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return _BOOL_CODES[x.view(np.uint8)]
    x = x.astype(np.float32, copy=False)
    cat = (x > -np.inf).view(np.uint8) + (x >= 0) + (x > 0) + (x > 1) + (x == np.inf)
    codes = cat * np.uint8(2 * (_N + 1))  # _code(cat, cat, 0)
    nan = np.isnan(x)
    return np.where(nan, _code(Z, Z, 1), codes).astype(np.uint8) if nan.any() else codes


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _code(np.minimum(LO[a], LO[b]), np.maximum(HI[a], HI[b]), NAN[a] | NAN[b])


def _category_results(fn, args: Sequence[int]) -> tuple[int, int, bool]:
    """(lowest, highest category, may be nan) of fn over the extremes of the categories."""
    grids = np.meshgrid(*(np.array(_SAMPLES[c], dtype=np.float32) for c in args))
    with np.errstate(all="ignore"):
        out = np.asarray(fn(*grids)).astype(np.float32)
    cats = categorize(out)
    ok = ~NAN[cats]
    if not ok.any():
        return Z, Z, True
    return int(LO[cats][ok].min()), int(HI[cats][ok].max()), bool(NAN[cats].any())


def _table(fn, arity: int, boolean: bool) -> np.ndarray:
    """code (, code) -> code of fn's result: the union over the categories in the operands'
    intervals. A nan operand gives nan, or for a comparison or logical op either truth value."""
    lo, hi, nan = (np.zeros((_N,) * arity, dtype=t) for t in (int, int, bool))
    for cats in np.ndindex(*lo.shape):
        lo[cats], hi[cats], nan[cats] = _category_results(fn, cats)
    table = np.zeros((len(_CODES),) * arity, dtype=np.uint8)
    for codes in np.ndindex(*table.shape):
        if any(LO[c] > HI[c] for c in codes):
            continue  # no value has this code
        box = tuple(slice(LO[c], HI[c] + 1) for c in codes)
        r_lo, r_hi, r_nan = lo[box].min(), hi[box].max(), nan[box].any()
        if any(NAN[c] for c in codes):
            if boolean:
                r_lo, r_hi = min(r_lo, Z), max(r_hi, P1)
            else:
                r_nan = True
        table[codes] = _code(r_lo, r_hi, int(r_nan))
    return table


# Ops whose result is monotone in each operand inside a category, the condition for _table.
_UNARY_OK = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu")
_BINARY_OK = ("add", "sub", "mul", "div", "max", "min", "and", "or")
_TABLES: dict[str, np.ndarray] = {}


def _lookup(name: str, arity: int) -> np.ndarray:
    if name not in _TABLES:
        fn = (numerics.UNARY if arity == 1 else numerics.BINARY)[name]
        boolean = name in numerics.COMPARISONS or name in ("and", "or")
        _TABLES[name] = _table(fn, arity, boolean)
    return _TABLES[name]


class _Abstract:
    """Codes of every value of a row group, at shapes that broadcast to the values' own."""

    def __init__(self, n: int) -> None:
        self.n = n  # keys per row
        self.codes: dict[int, np.ndarray] = {}
        self.max_of: dict[int, int] = {}  # reduce_max result (and its reshapes) -> its input
        self.row_zero: dict[int, np.ndarray] = {}  # x - max(x): rows holding a 0
        self.row_one: dict[int, np.ndarray] = {}  # exp of that: rows holding a 1
        # (reduce input's code, its shape, the reduction's identity code)
        self.identity_needed: list[tuple[np.ndarray, tuple[int, ...], int]] = []
        self.settled: dict[int, int] = {}  # where(c, a, b) with c the same everywhere -> a or b
        self.surely: dict[int, np.ndarray] = {}  # where(c, a, b) -> where c is surely true

    def run(self, n: Node) -> None:
        out, ins = n.out, [self.codes[v.id] for v in n.inputs]
        kind = n.op.info.kind
        if n.op is Op.FULL:
            code = categorize(np.asarray(n.attr("value"), dtype=np.float64))
        elif n.op is Op.BROADCAST:
            code = ins[0]
            self._follow(n)
        elif n.op is Op.RESHAPE:
            code = _reshape(ins[0], n.inputs[0].type.shape, out.type.shape)
            self._follow(n)
        elif kind is Kind.UNARY and n.op.value in _UNARY_OK:
            code = _lookup(n.op.value, 1)[ins[0]]
            src = n.inputs[0].id
            if n.op is Op.EXP and src in self.row_zero:
                self.row_one[out.id] = self.row_zero[src]
        elif kind is Kind.UNARY and n.op is Op.NOT:
            code = _lookup("eq", 2)[ins[0], np.uint8(categorize(np.float32(0)))]
        elif kind is Kind.COMPARE and n.op.value in numerics.COMPARISONS:
            code = _lookup(n.op.value, 2)[ins[0], ins[1]]
        elif kind is Kind.BINARY and n.op.value in _BINARY_OK and not out.type.dtype.is_int:
            # (integer arithmetic wraps and truncates: not what the float tables describe)
            code = _lookup(n.op.value, 2)[ins[0], ins[1]]
            if n.op is Op.SUB:
                code = self._minus_max(n, code)
        elif kind is Kind.SELECT:
            cond, a, b = ins
            surely = (LO[cond] == P1) & (HI[cond] == P1) & ~NAN[cond]
            never = (HI[cond] == Z) & ~NAN[cond]
            code = np.where(surely, a, np.where(never, b, _union(a, b)))
            if surely.all() or never.all():
                self.settled[out.id] = n.inputs[1 if surely.all() else 2].id
            else:
                self.surely[out.id] = surely
        elif kind is Kind.CAST:
            code = self._cast(out.type.dtype, ins[0])
        elif n.op in (Op.REDUCE_MAX, Op.REDUCE_SUM, Op.REDUCE_MIN):
            code = self._reduce(n, ins[0])
        else:
            code = np.uint8(TOP)
        self.codes[out.id] = np.asarray(code, dtype=np.uint8)

    def _follow(self, n: Node) -> None:
        src = n.inputs[0].id
        if src in self.max_of:
            self.max_of[n.out.id] = self.max_of[src]

    def _minus_max(self, n: Node, code: np.ndarray) -> np.ndarray:
        """x - max(x) over the keys: <= 0 in rows whose max is finite, and 0 somewhere there."""
        x, m = n.inputs
        if self.max_of.get(m.id) != x.id:
            return code
        mc = self.codes[m.id]
        finite = (LO[mc] >= NF) & (HI[mc] <= PB) & ~NAN[mc]
        if finite.ndim:  # one fact per row
            finite = finite.all(axis=-1, keepdims=True)
        self.row_zero[n.out.id] = finite
        return np.where(finite, _code(LO[code], np.minimum(HI[code], Z), NAN[code]), code)

    def _cast(self, dtype: DType, code: np.ndarray) -> np.ndarray:
        if dtype is DType.BOOL:
            return _lookup("ne", 2)[code, np.uint8(categorize(np.float32(0)))]
        if dtype in (DType.F32, DType.BF16):  # same exponent range: categories survive
            return code
        return np.full_like(code, TOP)

    def _reduce(self, n: Node, code: np.ndarray) -> np.ndarray:
        shape = n.inputs[0].type.shape
        rank = len(shape)
        if tuple(n.attr("axes")) != (rank - 1,):
            return np.uint8(TOP)
        code = np.asarray(code)
        if code.ndim < rank or code.shape[-1] != self.n:  # broadcast along the keys
            code = np.broadcast_to(code, (*code.shape[:-1], self.n) if code.ndim else (self.n,))
        lo, hi, nan = LO[code], HI[code], NAN[code]
        if n.op is Op.REDUCE_MAX:
            self.identity_needed.append((code, shape, int(_code(NI, NI, 0))))
            self.max_of[n.out.id] = n.inputs[0].id
            r = _code(lo.max(-1), hi.max(-1), nan.any(-1))
        elif n.op is Op.REDUCE_MIN:
            self.identity_needed.append((code, shape, int(_code(PI, PI, 0))))
            r = _code(lo.min(-1), hi.min(-1), nan.any(-1))
        else:
            self.identity_needed.append((code, shape, int(_code(Z, Z, 0))))
            r = self._sum(n, lo, hi, nan)
        if n.attr("keepdim"):
            r = r[..., None]
        return r

    def _sum(self, n: Node, lo, hi, nan) -> np.ndarray:
        nonneg = (lo >= Z).all(-1)
        ones = self.row_one.get(n.inputs[0].id, np.False_)
        positive = (lo >= P1).any(-1) | (ones[..., 0] if ones.ndim else ones)
        s_lo = np.where(nonneg, np.where(positive, P1, Z), NI)
        s_lo = np.where((lo == NI).any(-1), NI, s_lo)
        small = (hi <= P1).all(-1) & (self.n < 1 << 24)  # n values <= 1: a finite sum
        s_hi = np.where((hi <= Z).all(-1), Z, np.where(small, PB, PI))
        s_nan = nan.any(-1) | ((hi == PI).any(-1) & (lo == NI).any(-1))
        return _code(s_lo, np.maximum(s_lo, s_hi), s_nan)


def _reshape(code: np.ndarray, src: tuple[int, ...], dst: tuple[int, ...]) -> np.ndarray:
    """A code array (broadcasting to src) reshaped with its value to dst, still broadcast where
    the reshape only adds or drops unit dims (a [1, 1, N, N] mask stays one head's worth)."""
    code = np.asarray(code)
    if code.size == 1:
        return code.reshape(())
    if [d for d in src if d != 1] == [d for d in dst if d != 1]:
        padded = code.reshape((1,) * (len(src) - code.ndim) + code.shape)
        kept = iter(padded.shape[i] for i, d in enumerate(src) if d != 1)
        return padded.reshape([next(kept) if d != 1 else 1 for d in dst])
    return np.broadcast_to(code, src).reshape(dst)


def _constant(v: Value, producers: dict[int, Node], memo: dict[int, np.ndarray | None]):
    """v's value if it depends on constants only (and no value on the way is larger than
    MAX_CONSTANT_ELEMENTS), else None: an array that broadcasts to v's shape, as small as
    v's fills and broadcasts leave it (a causal mask broadcast over 32 heads is one head's,
    as the codes of the abstract interpretation are)."""
    if v.id in memo:
        return memo[v.id]
    memo[v.id] = None
    node = producers.get(v.id)
    if node is None or math.prod(v.type.shape) > MAX_CONSTANT_ELEMENTS:
        return None
    if node.op.info.kind in (Kind.MATMUL, Kind.INDEX):
        return None
    if node.op is Op.FULL:
        memo[v.id] = np.asarray(node.attr("value")).astype(v.type.dtype.numpy)
        return memo[v.id]
    args = [_constant(x, producers, memo) for x in node.inputs]
    if any(a is None for a in args):
        return None
    if node.op is Op.BROADCAST:
        memo[v.id] = args[0]
        return memo[v.id]
    whole = [np.broadcast_to(a, x.type.shape) for a, x in zip(args, node.inputs, strict=True)]
    memo[v.id] = evaluate_node(node, whole)
    return memo[v.id]


def _rows(x: np.ndarray, shape: tuple[int, ...], m: int, n: int) -> np.ndarray:
    """x, broadcasting to a value of `shape`, as that value's row space [batch, m, n] (a view
    where the batch dims are broadcast: a causal mask is not copied per head)."""
    return np.broadcast_to(x, shape).reshape(-1, m, n)


@dataclass(frozen=True)
class KeyFacts:
    """What the abstract interpretation of a row group proved."""

    live: tuple[int, ...] | None  # keys each query block must compute; None: all of them
    settled: dict[int, int]  # where(c, a, b) whose c is the same everywhere -> a's or b's id
    # where(c, a, b) -> per query block, the leading keys where c is true in every row
    true_prefix: dict[int, tuple[int, ...]]
    # boolean constants read by the row group -> (base, pstep, fstep): Note [generated masks]
    affine: dict[int, tuple[int, int, int]]


@dataclass
class Memo:
    """What `analyse` keeps from one row group to the next of a graph: the facts of each row
    group met, by its description, and the graph's producers and constant forms."""

    producers: dict[int, Node]
    facts: dict = field(default_factory=dict)
    forms: dict[int, tuple | None] = field(default_factory=dict)  # (graph.constant_form)


def analyse(
    g: Graph,
    rows: Sequence[Node],
    given: Sequence[int],
    p_id: int,
    blocks: Sequence[tuple[int, int, int]],
    m: int,
    n: int,
    tile: int,
    memo: Memo | None = None,
) -> KeyFacts:
    """For each query block (batch, first row, rows), how many leading keys the attention
    kernel must compute (a multiple of `tile`, at least one tile; None if every block needs
    all n), and the selects the row group need not compute. `rows` is the row group on
    [batch x m, n] rows, `given` the scores' ids as it reads them, `p_id` P. With a `memo`
    (one per graph), a row group like one analysed before (the next layer's: same ops on the
    same values from outside, or on equal constants: each layer makes its own additive mask,
    Note [constants per reader]) takes its facts, renamed."""
    if memo is None:
        return _analyse(g, rows, given, p_id, blocks, m, n, tile)
    ref = {x.out.id: ("row", i) for i, x in enumerate(rows)}
    ref |= {vid: ("given", i) for i, vid in enumerate(given)}
    forms = []
    for x in rows:
        for v in x.inputs:
            form = None if v.id in ref else constant_form(v, memo.producers, memo.forms)
            if form is not None:
                ref[v.id] = ("constant", len(forms))
                forms.append(form)

    def canon(vid: int) -> tuple:
        return ref.get(vid, ("value", vid))  # (a value outside: the same value, layer to layer)

    key = (
        tuple((x.op, x.attrs, x.out.type, tuple(canon(v.id) for v in x.inputs)) for x in rows),
        tuple(forms),
        canon(p_id),
        len(given),
        tuple(blocks),
        m,
        n,
        tile,
    )
    facts = memo.facts.get(key)
    if facts is None:
        facts = _rename(_analyse(g, rows, given, p_id, blocks, m, n, tile), canon)
        memo.facts[key] = facts
    back = {c: vid for vid, c in ref.items()}
    return _rename(facts, lambda c: back.get(c, c[1]) if isinstance(c, tuple) else c)


def _rename(facts: KeyFacts, name) -> KeyFacts:
    """facts with every value id (or canonical name) passed through `name`."""
    return KeyFacts(
        facts.live,
        {name(a): name(b) for a, b in facts.settled.items()},
        {name(v): p for v, p in facts.true_prefix.items()},
        {name(v): form for v, form in facts.affine.items()},
    )


def _analyse(g, rows, given, p_id, blocks, m, n, tile) -> KeyFacts:
    producers = g.producers()
    inside = {x.out.id for x in rows}
    memo: dict[int, np.ndarray | None] = {}
    affine: dict[int, tuple[int, int, int]] = {}
    a = _Abstract(n)
    for vid in given:
        a.codes[vid] = np.uint8(FINITE)
    for node in rows:
        for x in node.inputs:
            if x.id not in a.codes and x.id not in inside:
                value = _constant(x, producers, memo)
                a.codes[x.id] = np.uint8(TOP) if value is None else categorize(value)
                form = None if value is None else band_edge(value, x.type.shape, m, n)
                if form is not None:
                    affine[x.id] = form
        a.run(node)
    p_shape = next(x.out.type.shape for x in rows if x.out.id == p_id)
    dead = a.codes[p_id] == _code(Z, Z, 0)
    others = []
    for code, shape, identity in a.identity_needed:
        if shape == p_shape:
            dead = dead & (code == identity)
        else:
            others.append(_rows(code == identity, shape, m, n))
    dead = _rows(dead, p_shape, m, n)
    for other in others:
        dead = dead & other
    key_tiles = math.ceil(n / tile)
    live = []
    for bi, r0, rp in blocks:
        block = dead[bi, r0 : r0 + rp]
        padded = np.ones((rp, key_tiles * tile), dtype=bool)
        padded[:, :n] = block
        alive = ~padded.reshape(rp, key_tiles, tile).all(axis=(0, 2))
        last = int(np.flatnonzero(alive)[-1]) + 1 if alive.any() else 1
        live.append(min(n, last * tile))
    prefixes = {}
    for vid, surely in a.surely.items():
        shape = next(x.out.type.shape for x in rows if x.out.id == vid)
        if shape[-1:] != (n,) or n == 1:
            continue  # a select of one value per row (the logsumexp's): no keys to skip
        true = _rows(surely, shape, m, n)
        seen: dict[tuple[int, int, int], int] = {}  # a mask broadcast over heads: once per rows
        prefix = []
        for bi, r0, rp in blocks:
            key = (bi if true.strides[0] else 0, r0, rp)
            if key not in seen:
                cols = true[bi, r0 : r0 + rp].all(axis=0)
                seen[key] = n if cols.all() else int(np.argmin(cols))
            prefix.append(seen[key])
        if any(prefix):
            prefixes[vid] = tuple(prefix)
    live_keys = tuple(live) if any(x < n for x in live) else None
    return KeyFacts(live_keys, a.settled, prefixes, affine)


def band_edge(value: np.ndarray, shape: tuple[int, ...], m: int, n: int):
    """(base, pstep, fstep) with value[..., i, j] == (base + pstep * i + fstep * j >= 0) for
    every row i < m and key j < n of every batch (Note [generated masks]), or None."""
    value = np.asarray(value)
    if value.dtype != np.bool_ or shape[-2:] != (m, n) or value.size <= 1:
        return None
    rows = _rows(value, shape, m, n)
    first = rows[0]
    if rows.shape[0] > 1 and rows.strides[0] != 0 and not (rows == first).all():
        return None  # differs between batches
    counts = first.sum(axis=1)
    partial = np.flatnonzero((counts > 0) & (counts < n))
    if not len(partial):
        return None  # whole rows true or false: no line to find (or a settled select)
    r = int(partial[0])
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    for pstep, fstep in ((1, -1), (-1, 1)):
        # (1, -1): j <= i + base, a prefix of each row; (-1, 1): j >= i - base, a suffix
        base = int(counts[r]) - 1 - r if pstep == 1 else r - (n - int(counts[r]))
        if np.array_equal(first, base + pstep * i + fstep * j >= 0):
            return base, pstep, fstep
    return None
