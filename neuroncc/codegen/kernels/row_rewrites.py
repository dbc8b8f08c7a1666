"""What a row kernel emits in place of some of its nodes, found before it emits anything
(emit_fused.RowKernel): activation-reduces (a softmax's exp and row sum), sums of squares, casts
folded into their readers or producers (Notes [widening casts], [narrowing casts]), values an
alias leaves unread; and the group as it will compute, for buffer planning (`as_computed`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from neuroncc.codegen.kernels.row_plan import ELEMENTWISE, REDUCE_OPS, RowPlan
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType


def activation_reduces(
    nodes: Sequence[Node], p: RowPlan, users: dict, escaping: set[int]
) -> dict[int, tuple[Node, Node]]:
    """Unary ops f(x - m) (or f(x + m)) with m a row value broadcast over the row and the
    difference read by nothing else, whose result is then summed over the row: one
    ActivationReduce each (ScalarE applies the per-partition bias and sums as it writes), in
    place of the subtraction, the activation and the reduction: a softmax's exp and row sum.
    Returns unary node id -> (the subtraction, the sum)."""
    defined = {n.out.id: n for n in nodes}
    found = {}
    for n in nodes:
        if n.op.info.kind != Kind.UNARY or n.op == Op.NOT or p.kind.get(n.out.id) != "full":
            continue
        diff = defined.get(n.inputs[0].id)
        if diff is None or diff.op not in (Op.SUB, Op.ADD) or diff.out.id in escaping:
            continue
        x, m = diff.inputs
        if p.kind.get(x.id) != "full" or p.kind.get(m.id) != "bcast" or users[diff.out.id] != [n]:
            continue
        if not (x.type.dtype.is_float and n.out.type.dtype.is_float):
            continue
        sums = [u for u in users[n.out.id] if u.op == Op.REDUCE_SUM and u.out.id in defined]
        if sums:
            found[n.out.id] = (diff, sums[0])
    return found


def square_sums(
    nodes: Sequence[Node], p: RowPlan, users: dict, escaping: set[int]
) -> dict[int, Node]:
    """x * x (or x ** 2) read only by its sum over the row (a variance, RMSNorm's mean
    square): one ScalarE activation_reduce (square, summed as it writes) in place of
    VectorE's multiply and reduction, the two slowest passes of a norm. Returns the multiply's
    id -> the sum."""
    twos = {n.out.id for n in nodes if n.op is Op.FULL and float(n.attr("value")) == 2.0}
    found = {}
    for n in nodes:
        x = n.inputs[0] if n.inputs else None
        squares = (n.op is Op.MUL and x.id == n.inputs[1].id) or (
            n.op is Op.POW and n.inputs[1].id in twos
        )
        if not squares or p.kind.get(n.out.id) != "full":
            continue
        if n.out.id in escaping or not x.type.dtype.is_float or not n.out.type.dtype.is_float:
            continue
        readers = users[n.out.id]
        if len(readers) == 1 and readers[0].op is Op.REDUCE_SUM and p.kind.get(x.id) == "full":
            found[n.out.id] = readers[0]
    return found


def unread(nodes: Sequence[Node], roots: set[int], aliased: dict, act_reduce: dict) -> set[int]:
    """Nodes that no root needs once each aliased value is taken as its input: the condition of
    a select the row facts settle. `roots`: the values read from outside the nodes."""
    need = set(roots)
    made_by = {total.out.id: exp for exp, (_, total) in act_reduce.items()}
    for n in reversed(nodes):
        vid = n.out.id
        if vid not in need:
            continue
        if vid in aliased:
            need.add(aliased[vid])
        elif vid in made_by:
            need.add(made_by[vid])
        else:
            need.update(v.id for v in (act_reduce.get(vid, (n,))[0]).inputs)
    return {n.out.id for n in nodes} - need


def widening_casts(
    nodes: Sequence[Node], p: RowPlan, roots: set[int], users: Mapping
) -> dict[int, Value]:
    """Note [widening casts]: casts of a 16-bit float full value to fp32 that only the group's
    arithmetic reads (not `roots`; no reshape or broadcast, which would pass the tile on as
    it is): cast id -> its input. Engines compute in fp32 whatever they read, so what reads
    the cast reads its input instead, and the cast, a pass over every element, is not
    emitted."""
    return {
        n.out.id: n.inputs[0]
        for n in nodes
        if n.op.info.kind is Kind.CAST
        and n.out.type.dtype == DType.F32
        and n.inputs[0].type.dtype in (DType.BF16, DType.F16)
        and p.kind.get(n.out.id) == p.kind.get(n.inputs[0].id) == "full"
        and n.out.id not in roots
        and all(u.op.info.kind in ELEMENTWISE or u.op in REDUCE_OPS for u in users[n.out.id])
    }


def narrowing_casts(
    nodes: Sequence[Node], p: RowPlan, roots: set[int], users: Mapping, special: set[int]
) -> dict[int, Node]:
    """Note [narrowing casts]: casts of an fp32 full value to a 16-bit float whose producer,
    a unary or binary op of the group (not one emitted specially: `special`), is read by the
    cast alone and only in the group: producer id -> the cast. The producer writes the cast's
    dtype itself (engines compute in fp32 and round to their destination's dtype, so the
    values are the same), and the cast, a pass over every element, is not emitted."""
    made = {n.out.id: n for n in nodes}
    found = {}
    for n in nodes:
        src = made.get(n.inputs[0].id) if n.op.info.kind is Kind.CAST else None
        if src is None or src.op.info.kind not in (Kind.UNARY, Kind.BINARY) or src.op == Op.NOT:
            continue
        if n.out.type.dtype not in (DType.BF16, DType.F16) or src.out.type.dtype != DType.F32:
            continue
        if p.kind.get(src.out.id) != "full" or p.kind.get(n.out.id) != "full":
            continue
        if src.out.id in roots | special or [u.out.id for u in users[src.out.id]] != [n.out.id]:
            continue
        found[src.out.id] = n
    return found


def as_computed(nodes: Sequence[Node], act_reduce: dict, casts: Mapping) -> list[Node]:
    """The group as emitted with activation-reduces (the subtraction gone, the activation
    reading x and the row value) and without the casts it folds away (`casts`: id -> the
    value their readers read instead): for buffer planning, what is live when."""
    gone = {diff.out.id for diff, _ in act_reduce.values()} | set(casts)
    out = []
    for n in nodes:
        if n.out.id in gone:
            continue
        if n.out.id in act_reduce:
            diff = act_reduce[n.out.id][0]
            n = replace(n, inputs=diff.inputs)
        if any(v.id in casts for v in n.inputs):
            n = replace(n, inputs=tuple(casts.get(v.id, v) for v in n.inputs))
        out.append(n)
    return out
