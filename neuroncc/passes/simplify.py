"""simplify: canonicalise with local rewrite rules, then CSE and DCE.

Rules are data: each takes a node (inputs already rewritten) and the emitter and returns a Value
that replaces the node, or None. `simplify_rules` lists them. A node a rule creates goes through
the rules again (`_Emitter.add`), so every node reaches a fixed point.

Invariant established: no identity reshape/transpose/broadcast/cast/slice, no chains of
reshapes or transposes, no transpose that only moves unit axes (a reshape), no
reshape/broadcast/transpose of a constant, no two nodes computing the same op on the same inputs
(but constants: Note [constants per reader]), no dead nodes. Plus two algebraic rules for
patterns the SDPA decomposition makes (`_any_not_neg_inf`, `_scale_after_matmul`), column sums
as matmuls (`_column_sum`), squares as products (`_square`), slices of concats and concats of
concats taken apart (Note [scatters into concats]), two for the causal mask
(`_logical_unit`, `_compare_difference`), unit dims dropped before a transpose rather than after
it (`_unit_dims_first`), and a product read in slices along its last axis split into a matmul per
slice (`_slice_of_matmul`, `_slice_of_transpose`).

Note [constants per reader]: a value computed from no graph input (a full, an iota, a mask made
from them) is not merged with an equal one by CSE. Each copy is then made by the kernel that
reads it, where it costs a few instructions on chip (or nothing: a mask the attention kernel
generates, Note [generated masks]). Merged, one kernel made it and stored it to HBM and every
other reader loaded it back: each layer's SDPA turns the model's one causal mask into a
[heads, seq, seq] float mask, so with CSE every layer after the first read 4 * heads * seq^2
bytes of mask (512 MiB a layer for 32 heads at 2048 tokens), and its attention kernel, reading
a stored mask, was not the first layer's, so it was not reused either. Constants the source
graph computes once (the bool mask itself) stay one node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from neuroncc.ir.graph import Graph, Node, Value, make_attrs
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType
from neuroncc.passes.manager import PassContext, register_pass

Rule = Callable[[Node, "_Emitter"], Value | None]


class _Emitter:
    """Builds the new node list; rules create nodes through it."""

    def __init__(self, g: Graph) -> None:
        self.nodes: list[Node] = []
        self.next_id = 1 + max([v.id for v in g.inputs] + [n.out.id for n in g.nodes], default=-1)
        self.producers: dict[int, Node] = {}
        self.cse: dict[tuple, Value] = {}
        self.constant: set[int] = set()  # values computed from no graph input
        self.sliced_products = sliced_products(g)
        # Note [scatters into concats]: the values only slices read, and which value of the
        # source graph each value made here stands for (set by Simplify.run)
        outputs = {v.id for v in g.outputs}
        self.only_sliced = {
            vid
            for vid, us in g.users().items()
            if us and vid not in outputs and all(u.op is Op.SLICE for u in us)
        }
        self.origin: dict[int, int] = {v.id: v.id for v in g.inputs}

    def add(self, op: Op, inputs: tuple[Value, ...], attrs: dict) -> Value:
        """Create a new node, simplified like any other."""
        norm = make_attrs(op, attrs)
        t = op.info.rule([v.type for v in inputs], dict(norm))
        out = Value(self.next_id, t)
        self.next_id += 1
        return self.simplify(Node(op, inputs, norm, out))

    def simplify(self, n: Node) -> Value:
        for rule in simplify_rules:
            new = rule(n, self)
            if new is not None:
                return new
        return self.place(n)

    def place(self, n: Node) -> Value:
        """Append n, or return the node computing the same before it (CSE); a constant is
        never merged (Note [constants per reader])."""
        if all(v.id in self.constant for v in n.inputs):
            self.constant.add(n.out.id)
        else:
            key = (n.op, tuple(v.id for v in n.inputs), n.attrs)
            if key in self.cse:
                return self.cse[key]
            self.cse[key] = n.out
        self.nodes.append(n)
        self.producers[n.out.id] = n
        return n.out


def _identity(n: Node, em: _Emitter) -> Value | None:
    if len(n.inputs) != 1:
        return None
    x = n.inputs[0]
    same = (
        n.op in (Op.RESHAPE, Op.BROADCAST, Op.CAST, Op.SLICE, Op.TRANSPOSE) and x.type == n.out.type
    )
    if same and (n.op != Op.TRANSPOSE or n.attr("perm") == tuple(range(x.type.rank))):
        return x
    return None


def _reshape_chain(n: Node, em: _Emitter) -> Value | None:
    if n.op != Op.RESHAPE:
        return None
    inner = em.producers.get(n.inputs[0].id)
    if inner is None or inner.op != Op.RESHAPE:
        return None
    return em.add(Op.RESHAPE, inner.inputs, {"shape": n.out.type.shape})


def _transpose_chain(n: Node, em: _Emitter) -> Value | None:
    if n.op != Op.TRANSPOSE:
        return None
    inner = em.producers.get(n.inputs[0].id)
    if inner is None or inner.op != Op.TRANSPOSE:
        return None
    outer, first = n.attr("perm"), inner.attr("perm")
    perm = tuple(first[p] for p in outer)
    if perm == tuple(range(len(perm))):
        return inner.inputs[0]
    return em.add(Op.TRANSPOSE, inner.inputs, {"perm": perm})


def _transpose_as_reshape(n: Node, em: _Emitter) -> Value | None:
    """A transpose that only moves axes of size 1 keeps every element where it was: a reshape
    ([1, 48] -> [48, 1], a Linear of one output's W^T; [9, 1] of a depthwise filter)."""
    if n.op != Op.TRANSPOSE:
        return None
    shape = n.inputs[0].type.shape
    moved = [axis for axis in n.attr("perm") if shape[axis] != 1]
    if moved != sorted(moved):
        return None
    return em.add(Op.RESHAPE, n.inputs, {"shape": n.out.type.shape})


def _unit_dims_first(n: Node, em: _Emitter) -> Value | None:
    """reshape(transpose(x)) that only drops unit dims: the dims dropped from x first, so the
    transpose is the matmul operand itself (a batched P^T or dS^T of an attention backward,
    [1, H, S, S] -> [H, S, S]) and the layout pass can fold it into the matmul. Only where the
    transpose left is a swap of the last two axes, the kind that folds; x's reshape moves no
    data."""
    if n.op != Op.RESHAPE:
        return None
    inner = em.producers.get(n.inputs[0].id)
    shape = n.out.type.shape
    if inner is None or inner.op != Op.TRANSPOSE or 1 in shape:
        return None
    src, perm = inner.inputs[0], inner.attr("perm")
    kept = [d for d, size in enumerate(inner.out.type.shape) if size != 1]
    if tuple(inner.out.type.shape[d] for d in kept) != shape or len(kept) < 2:
        return None
    axes = [perm[d] for d in kept]
    order = sorted(axes)
    new_perm = tuple(order.index(a) for a in axes)
    rank = len(new_perm)
    if new_perm != (*range(rank - 2), rank - 1, rank - 2):
        return None
    squeezed = em.add(Op.RESHAPE, (src,), {"shape": tuple(src.type.shape[a] for a in order)})
    return em.add(Op.TRANSPOSE, (squeezed,), {"perm": new_perm})


def _slice_of_matmul(n: Node, em: _Emitter) -> Value | None:
    """A slice of a matmul product that only slices along the last axis read (the gate and
    up halves of a fused SwiGLU projection, `sliced_products`): a matmul of its own with the
    right operand sliced. The product is never copied, and each part can take its own
    epilogue."""
    if n.op != Op.SLICE or n.inputs[0].id not in em.sliced_products:
        return None
    view = em.producers[n.inputs[0].id]
    mm = em.producers[view.inputs[0].id] if view.op == Op.RESHAPE else view
    a, b = mm.inputs
    *lead, _last = b.type.shape
    part = em.add(
        Op.SLICE,
        (b,),
        {
            "starts": (*[0] * len(lead), n.attr("starts")[-1]),
            "stops": (*lead, n.attr("stops")[-1]),
            "steps": (1,) * b.type.rank,
        },
    )
    product = em.add(Op.MATMUL, (a, part), {})
    if product.type.shape == n.out.type.shape:
        return product
    return em.add(Op.RESHAPE, (product,), {"shape": n.out.type.shape})


SPLIT_MIN_ROWS = 128  # products with fewer rows are not split (one partition tile of them)


def sliced_products(g: Graph) -> set[int]:
    """Matmul products (or their reshapes that keep the last axis) of at least
    SPLIT_MIN_ROWS rows read only by slices with unit steps along the last axis: what
    `_slice_of_matmul` splits."""
    users, outputs = g.users(), {v.id for v in g.outputs}
    found = set()
    for mm in g.nodes:
        if mm.op != Op.MATMUL or mm.out.id in outputs:
            continue
        if math.prod(mm.out.type.shape[:-1]) < SPLIT_MIN_ROWS:
            continue  # a decode step's few rows: the copies are cheaper than more kernels
        v = mm.out
        readers = users[v.id]
        if len(readers) == 1 and readers[0].op == Op.RESHAPE:  # rows regrouped, N kept
            shape = readers[0].out.type.shape
            if shape[-1:] == v.type.shape[-1:] and readers[0].out.id not in outputs:
                v = readers[0].out
                readers = users[v.id]
        if readers and all(_last_axis_slice(u) for u in readers) and v.id not in outputs:
            found.add(v.id)
    return found


def _last_axis_slice(n: Node) -> bool:
    if n.op != Op.SLICE or set(n.attr("steps")) != {1}:
        return False
    shape = n.inputs[0].type.shape
    return all(
        n.attr("starts")[d] == 0 and n.attr("stops")[d] == shape[d] for d in range(len(shape) - 1)
    )


def _slice_of_transpose(n: Node, em: _Emitter) -> Value | None:
    """A slice of a transposed graph input (a weight W^T) as the transpose of W's slice, so
    the transpose can still fold into the matmul that reads it (layout's `fold`) and W's
    slice is read in place."""
    if n.op != Op.SLICE:
        return None
    inner = em.producers.get(n.inputs[0].id)
    if inner is None or inner.op != Op.TRANSPOSE or inner.inputs[0].id in em.producers:
        return None
    perm = inner.attr("perm")
    x = inner.inputs[0]
    attrs = {}
    for key in ("starts", "stops", "steps"):
        values = [0] * x.type.rank
        for d, axis in enumerate(perm):
            values[axis] = n.attr(key)[d]
        attrs[key] = tuple(values)
    return em.add(Op.TRANSPOSE, (em.add(Op.SLICE, (x,), attrs),), {"perm": perm})


def _constant_fold(n: Node, em: _Emitter) -> Value | None:
    """A reshape, broadcast, transpose or slice of a constant is a constant of the new shape (a
    broadcast mask would otherwise be an element-by-element DMA)."""
    if n.op not in (Op.RESHAPE, Op.BROADCAST, Op.TRANSPOSE, Op.SLICE):
        return None
    inner = em.producers.get(n.inputs[0].id)
    if inner is None or inner.op != Op.FULL:
        return None
    attrs = {"shape": n.out.type.shape, "value": inner.attr("value"), "dtype": n.out.type.dtype}
    return em.add(Op.FULL, (), attrs)


# Note [scatters into concats]: a loop that writes a buffer a slice at a time (`out[:, i] =
# step(i)` in a chunked scan) is, functionalised, a chain of slice_scatters, each lowered as a
# concat of the piece before, the new slice and the piece after: every step copies the whole
# buffer, quadratic in the number of steps. A slice of a concat along its axis is the parts it
# covers (`_slice_of_concat`) and a concat of a concat along the same axis is one concat
# (`_concat_of_concats`), so the chain becomes one concat of the steps' slices, and the
# buffers between die.


def _slice_of_concat(n: Node, em: _Emitter) -> Value | None:
    """slice(concat(parts), axis of the concat) with unit steps: the part it covers, or the
    concat of the parts it covers where only slices read the concat (which then dies), each
    sliced to what it covers (on the other axes as the slice says)."""
    if n.op != Op.SLICE or set(n.attr("steps")) != {1}:
        return None
    inner = em.producers.get(n.inputs[0].id)
    if inner is None or inner.op != Op.CONCAT:
        return None
    axis = inner.attr("axis")
    starts, stops = list(n.attr("starts")), list(n.attr("stops"))
    if n.out.type.numel == 0:
        return None
    covered, offset = [], 0  # (part, first, end) along the axis
    for part in inner.inputs:
        size = part.type.shape[axis]
        lo, hi = max(starts[axis], offset), min(stops[axis], offset + size)
        if lo < hi:
            covered.append((part, lo - offset, hi - offset))
        offset += size
    if len(covered) > 1 and em.origin.get(inner.out.id) not in em.only_sliced:
        return None  # the concat is made for another reader anyway: slicing it costs less
    pieces = []
    for part, lo, hi in covered:
        sub_starts, sub_stops = list(starts), list(stops)
        sub_starts[axis], sub_stops[axis] = lo, hi
        attrs = {"starts": sub_starts, "stops": sub_stops, "steps": [1] * len(starts)}
        pieces.append(em.add(Op.SLICE, (part,), attrs))
    if len(pieces) == 1:
        return pieces[0]
    return em.add(Op.CONCAT, tuple(pieces), {"axis": axis})


def _concat_of_concats(n: Node, em: _Emitter) -> Value | None:
    if n.op != Op.CONCAT:
        return None
    axis, parts, spliced = n.attr("axis"), [], False
    for v in n.inputs:
        inner = em.producers.get(v.id)
        if inner is not None and inner.op == Op.CONCAT and inner.attr("axis") == axis:
            parts.extend(inner.inputs)
            spliced = True
        else:
            parts.append(v)
    return em.add(Op.CONCAT, tuple(parts), {"axis": axis}) if spliced else None


def _full_value(em: _Emitter, v: Value) -> float | None:
    producer = em.producers.get(v.id)
    return float(producer.attr("value")) if producer and producer.op == Op.FULL else None


def _any_not_neg_inf(n: Node, em: _Emitter) -> Value | None:
    """reduce_max(cast(x != -inf)) -> cast(reduce_max(x) != -inf): whether a row has any
    unmasked element, the test PyTorch's safe softmax (fully masked rows give 0, not NaN)
    makes. The reduce_max of x is the one the softmax itself takes, so CSE leaves one full
    pass over the row instead of four. Equal for NaN too (NaN != -inf, and max propagates
    NaN); not for empty rows (max of nothing is -inf on both sides before the cast)."""
    if n.op != Op.REDUCE_MAX:
        return None
    cast = em.producers.get(n.inputs[0].id)
    if cast is None or cast.op != Op.CAST or not n.out.type.dtype.is_float:
        return None
    test = em.producers.get(cast.inputs[0].id)
    if test is not None and test.op == Op.NOT:
        inner = em.producers.get(test.inputs[0].id)
        test = inner if inner is not None and inner.op == Op.EQ else None
    elif test is not None and test.op != Op.NE:
        test = None
    if test is None:
        return None
    x, c = test.inputs
    shape = x.type.shape
    if not x.type.dtype.is_float or _full_value(em, c) != float("-inf") or c.type != x.type:
        return None
    if any(shape[a] == 0 for a in n.attr("axes")):
        return None
    attrs = {"axes": n.attr("axes"), "keepdim": n.attr("keepdim")}
    row_max = em.add(Op.REDUCE_MAX, (x,), attrs)
    neg_inf = em.add(
        Op.FULL, (), {"shape": row_max.type.shape, "value": float("-inf"), "dtype": x.type.dtype}
    )
    unmasked = em.add(Op.NE, (row_max, neg_inf), {})
    return em.add(Op.CAST, (unmasked,), {"dtype": n.out.type.dtype})


def _square(n: Node, em: _Emitter) -> Value | None:
    """x ** 2 -> x * x for float x, as PyTorch's own pow kernel computes it: one multiply, no
    tile of 2s to read (VectorE's pow is a general power per element). An RMSNorm's
    x.pow(2).mean(-1) is the common case."""
    if n.op != Op.POW or not n.out.type.dtype.is_float:
        return None
    x, exponent = n.inputs
    if _full_value(em, exponent) != 2.0 or x.type != n.out.type:
        return None
    return em.add(Op.MUL, (x, x), {})


def _scaled(em: _Emitter, v: Value) -> tuple[Value, float] | None:
    """v = x * c for a constant c (under at most one reshape): (x shaped like v, c)."""
    node = em.producers.get(v.id)
    reshaped = node is not None and node.op == Op.RESHAPE
    if reshaped:
        node = em.producers.get(node.inputs[0].id)
    if node is None or node.op != Op.MUL:
        return None
    for x, c in (node.inputs, node.inputs[::-1]):
        value = _full_value(em, c)
        if value is not None and c.type == x.type:
            return (em.add(Op.RESHAPE, (x,), {"shape": v.type.shape}) if reshaped else x), value
    return None


def _scale_after_matmul(n: Node, em: _Emitter) -> Value | None:
    """(a * c1) @ (b * c2) -> (a @ b) * (c1 * c2) for constants: SDPA scales q and k by
    scale**0.5 each, two passes over the inputs; afterwards the scores take one multiply, inside
    the attention kernel. Only for fp32 and bf16 (fp32's range: the unscaled product cannot
    overflow where the scaled one would not, as fp16's could)."""
    if n.op != Op.MATMUL or n.out.type.dtype not in (DType.F32, DType.BF16):
        return None
    a, b = n.inputs
    sa, sb = _scaled(em, a), _scaled(em, b)
    if sa is None and sb is None:
        return None
    (a0, ca), (b0, cb) = sa or (a, 1.0), sb or (b, 1.0)
    t = n.out.type
    product = em.add(Op.MATMUL, (a0, b0), {})
    scale = em.add(Op.FULL, (), {"shape": t.shape, "value": ca * cb, "dtype": t.dtype})
    return em.add(Op.MUL, (product, scale), {})


def _column_sum(n: Node, em: _Emitter) -> Value | None:
    """reduce_sum over a run of x's axes that are not its last, which the lowering writes as a
    transpose that puts them last (Note [trailing reductions]) -> ones[1, R] @ x[R, C] for the
    leading axes, ones[A, 1, R] @ x[A, R, C] for axes after A leading ones: a column sum is a
    contraction over partitions, which TensorE does as it streams x, instead of a transpose
    kernel and its HBM round trip (a bias or LayerNorm gradient; the transpose, read by a
    weight-gradient matmul too, then folds into it). The batched form is a grouped-query
    attention's key and value gradient, summed over the query heads of each key head
    ([1, 8, 4, s, 128] over axis 2): its transpose put an axis of 4 last, a DMA descriptor
    per element (14.4 ms on trn2 at s = 2048, 0.88 ms as products). Float x only: TensorE
    accumulates in fp32, rounded once to x's dtype as the reduction is."""
    if n.op != Op.REDUCE_SUM or n.attr("keepdim"):
        return None
    t = em.producers.get(n.inputs[0].id)
    if t is None or t.op != Op.TRANSPOSE or t.out.type.dtype not in (DType.F32, DType.BF16):
        return None
    x, perm, rank = t.inputs[0], tuple(t.attr("perm")), t.out.type.rank
    axes = tuple(n.attr("axes"))
    r = len(axes)
    if not r or axes != tuple(range(rank - r, rank)):
        return None
    # reduced: the last r axes of the transpose, x's axes a .. a + r; kept: the rest, in order
    a = perm[rank - r]
    if perm != (*range(a), *range(a + r, rank), *range(a, a + r)):
        return None
    shape = x.type.shape
    lead, rows = math.prod(shape[:a]), math.prod(shape[a : a + r])
    if rows < 2:
        return None
    cols = x.type.numel // max(lead * rows, 1)
    batch = (lead,) if a else ()
    matrix = em.add(Op.RESHAPE, (x,), {"shape": (*batch, rows, cols)})
    ones = em.add(Op.FULL, (), {"shape": (*batch, 1, rows), "value": 1.0, "dtype": x.type.dtype})
    total = em.add(Op.MATMUL, (ones, matrix), {})
    return em.add(Op.RESHAPE, (total,), {"shape": n.out.type.shape})


def _select_constants_late(n: Node, em: _Emitter) -> Value | None:
    """reshape/broadcast(where(c, a, b)) -> where(reshape/broadcast(c), a', b') for constants
    a, b: an additive mask is made from its bool condition, and the kernel that reads the mask
    (for every head, in attention) then reads one byte per element instead of four."""
    if n.op not in (Op.RESHAPE, Op.BROADCAST):
        return None
    sel = em.producers.get(n.inputs[0].id)
    if sel is None or sel.op != Op.WHERE:
        return None
    c, a, b = sel.inputs
    values = _full_value(em, a), _full_value(em, b)
    if None in values or c.type.shape != sel.out.type.shape:
        return None
    t = n.out.type
    cond = em.add(n.op, (c,), {"shape": t.shape})
    a2, b2 = (em.add(Op.FULL, (), {"shape": t.shape, "value": v, "dtype": t.dtype}) for v in values)
    return em.add(Op.WHERE, (cond, a2, b2), {})


def _logical_unit(n: Node, em: _Emitter) -> Value | None:
    """and(x, true) -> x, or(x, false) -> x for a bool x of the result's shape: the causal mask
    of SDPA is tril(ones) & (i >= j), its ones a 4-byte-per-element memset of their own."""
    if n.op not in (Op.AND, Op.OR):
        return None
    unit = n.op == Op.AND
    for x, c in (n.inputs, n.inputs[::-1]):
        value = _full_value(em, c)
        if value is not None and (value != 0) == unit and x.type == n.out.type:
            return x
    return None


def _int_range(em: _Emitter, v: Value) -> tuple[int, int] | None:
    """Bounds of an integer value built from iota and constants by reshapes and broadcasts."""
    node = em.producers.get(v.id)
    while node is not None and node.op in (Op.RESHAPE, Op.BROADCAST):
        node = em.producers.get(node.inputs[0].id)
    if node is None or not v.type.dtype.is_int:
        return None
    if node.op == Op.FULL:
        return int(node.attr("value")), int(node.attr("value"))
    if node.op == Op.IOTA and node.attr("n") > 0:
        ends = node.attr("start"), node.attr("start") + node.attr("step") * (node.attr("n") - 1)
        return min(ends), max(ends)
    return None


_COMPARES = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)


def _compare_difference(n: Node, em: _Emitter) -> Value | None:
    """(a - b) <op> 0 -> a <op> b for integers that cannot overflow (index arithmetic: the
    causal mask compares key minus query index with 0), one pass over the elements fewer."""
    if n.op not in _COMPARES or _full_value(em, n.inputs[1]) != 0:
        return None
    d = em.producers.get(n.inputs[0].id)
    if d is None or d.op != Op.SUB or not d.out.type.dtype.is_int or d.out.type.dtype == DType.U8:
        return None
    limit = 2 ** (8 * d.out.type.dtype.itemsize - 2)  # |a|, |b| below it: a - b is exact
    bounds = [_int_range(em, x) for x in d.inputs]
    if any(b is None or max(abs(b[0]), abs(b[1])) >= limit for b in bounds):
        return None
    a, b = d.inputs
    if a.type != d.out.type:
        a = em.add(Op.BROADCAST, (a,), {"shape": d.out.type.shape})
    if b.type != d.out.type:
        b = em.add(Op.BROADCAST, (b,), {"shape": d.out.type.shape})
    return em.add(n.op, (a, b), {})


simplify_rules: list[Rule] = [
    _identity,
    _constant_fold,
    _reshape_chain,
    _transpose_chain,
    _transpose_as_reshape,
    _any_not_neg_inf,
    _scale_after_matmul,
    _column_sum,
    _logical_unit,
    _compare_difference,
    _select_constants_late,
    _unit_dims_first,
    _slice_of_matmul,
    _slice_of_transpose,
    _slice_of_concat,
    _concat_of_concats,
    _square,
]


def dce(nodes: list[Node], outputs: tuple[Value, ...]) -> list[Node]:
    live = {v.id for v in outputs}
    kept = []
    for n in reversed(nodes):
        if n.out.id in live:
            kept.append(n)
            live.update(v.id for v in n.inputs)
    return kept[::-1]


@register_pass
@dataclass(frozen=True)
class Simplify:
    name: ClassVar[str] = "simplify"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        em = _Emitter(g)
        remap: dict[int, Value] = {v.id: v for v in g.inputs}
        for n in g.nodes:
            node = Node(n.op, tuple(remap[v.id] for v in n.inputs), n.attrs, n.out)
            remap[n.out.id] = em.simplify(node)
            em.origin.setdefault(remap[n.out.id].id, n.out.id)
        outputs = tuple(remap[v.id] for v in g.outputs)
        return Graph(g.name, g.inputs, tuple(dce(em.nodes, outputs)), outputs)
