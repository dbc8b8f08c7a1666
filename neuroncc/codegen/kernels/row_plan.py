"""Row kernels, planned: which groups of elementwise ops, broadcasts and trailing reductions can
be one kernel (`plan`), how each value is laid out, and the SBUF buffers a step takes (slots
assigned by liveness, results written in place of inputs that die), which decide the rounds of
steps in flight. codegen/kernels/emit_fused.py emits them.

Note [row space]: every value of a group is seen against one full shape F whose k trailing axes
are a row (C = their product elements) and whose leading axes count the rows (R). A value is
- full: shape F (or, with k = 1, any shape of the same rows and row length: a reshape between
  those is free), an [R, C] tile stream, rows on partitions;
- row: shape F[:-k] + (1,)*k or F[:-k], one element per row ([R, 1] tiles);
- col: shape (1,)*(rank-k) + F[-k:] or F[-k:], the same row for every row (loaded once,
  partition stride 0), only as the input of a broadcast (whose result reads that tile:
  "bcast_col"); or computed from col values by unary ops and casts (a LayerNorm weight cast to
  fp32), once per kernel, not per row step;
- scalar: one element, only as the input of a broadcast;
- period: shape (1,)*a + F[a:], rows repeating with period R' = prod(F[a:-k]) (a causal mask
  broadcast over batch and heads), only as a kernel input read by a broadcast, whose result
  ("bcast_period") reads rows r0 mod R' onwards, loaded per row step.
A broadcast of a row or scalar value to full costs nothing: its users read the [p, 1] tile,
which VectorE applies to every element of the row (the per-partition scalar operand of
tensor_tensor / select). Reductions over the trailing k axes turn a full value into a row value.
The kernel walks the rows 128 at a time; a whole row must fit in SBUF, which `plan` checks
against the target (the fuse pass only forms groups that fit), except as Note [wide rows] says.
Groups without any row structure (only same-shape elementwise ops) are laid out as `row_view` of
their element count and walked in column chunks, like the unfused elementwise kernel.

Note [wide rows]: a row too long for SBUF (a log-softmax over a 151936-word vocabulary: 594 KB
of fp32 per row, against 224 KB per partition on trn2) is walked in column chunks too, where
no value of the group is computed from a reduction made in it: each chunk's partial reduction
is combined into a running [p, 1] accumulator, stored after the row's last chunk. The fuse
pass's greedy run stops at the first node that reads a reduction, so a log-softmax over such
rows becomes four kernels, each reading its inputs from HBM once: the row max; x - max, its exp
and their sum (a group); the log of the sum ([rows, 1]); and the output (a group). Unfused, its
[rows, 1] values were broadcast to full rows through HBM. Col and period values differ from
chunk to chunk and are left out (such a group is not formed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.emit import row_view
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Kind, Op

ELEMENTWISE = (Kind.UNARY, Kind.BINARY, Kind.COMPARE, Kind.SELECT, Kind.CAST)
REDUCE_OPS = {Op.REDUCE_SUM: "sum", Op.REDUCE_MAX: "max", Op.REDUCE_MIN: "min"}
_BROADCAST_READERS = (Kind.BINARY, Kind.COMPARE, Kind.SELECT)
_COL_OPS = (Kind.UNARY, Kind.CAST)  # what a kernel may compute on col values
# Share of an SBUF partition a fused kernel may take (the rest: other kernels' pools).
SBUF_SHARE = 0.75
COLUMN_CHUNK_BYTES = 8192  # free bytes per tile of a group without row structure


@dataclass(frozen=True)
class RowPlan:
    """How a group is laid out: rows R of C elements, and each value's class."""

    full: tuple[int, ...]
    k: int
    rows: int
    cols: int
    kind: dict  # value id -> "full" | "row" | "col" | "scalar" | "bcast"
    flat: bool  # no row structure: laid out as row_view(numel), walked in column chunks
    chunked: bool = False  # rows walked in column chunks, reductions combined (Note [wide rows])

    def step_cols(self, itemsize: int) -> int:
        """Columns per step: a whole row, or a chunk of COLUMN_CHUNK_BYTES."""
        if self.flat or self.chunked:
            return max(1, min(self.cols, COLUMN_CHUNK_BYTES // itemsize))
        return self.cols


def classify(shape: tuple[int, ...], full: tuple[int, ...], k: int) -> str | None:
    lead = full[: len(full) - k]
    if shape == full or (
        k == 1 and shape[-1:] == full[-1:] and math.prod(shape) == math.prod(full)
    ):
        return "full"  # the same [R, C] rows, however the leading axes are split
    if shape in (lead + (1,) * k, lead) or (
        _squeezed(shape) == _squeezed(lead) and shape[len(shape) - k :] == (1,) * k
    ):
        return "row"  # one value per row (unit dims anywhere keep the order)
    if shape in ((1,) * len(lead) + full[len(lead) :], full[len(lead) :]):
        return "col"
    if math.prod(shape) == 1:
        return "scalar"
    if len(shape) == len(full) and any(
        shape[:a] == (1,) * a and shape[a:] == full[a:] for a in range(1, len(lead))
    ):
        return "period"  # the same block of rows over and over (a mask for every head)
    return None


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _signature(n: Node) -> tuple[tuple[int, ...], int] | None:
    """The (full shape, k) a group starting at n would take."""
    if n.op in REDUCE_OPS:
        shape = n.inputs[0].type.shape
        return shape, len(n.attr("axes"))
    shape = n.out.type.shape
    return (shape, 1) if shape else None


def fusible(n: Node) -> bool:
    return n.op.info.kind in ELEMENTWISE or n.op in REDUCE_OPS or n.op in _LAYOUT_FREE


# Inside a group these move no data: a reshape between shapes of the same class is the same
# elements per row, and a constant is one memset tile shared by every row step.
_LAYOUT_FREE = (Op.BROADCAST, Op.RESHAPE, Op.FULL)
# What each class can stand in for when an op checks its operands.
_AS = {
    "full": "full",
    "const_full": "full",
    "bcast_col": "full",
    "bcast_period": "full",
    "row": "row",
    "const_row": "row",
}


def plan(
    nodes: Sequence[Node],
    target: Target,
    sig: tuple[tuple[int, ...], int] | None = None,
    step_cols: int | None = None,
) -> RowPlan | None:
    """The row plan of a candidate group, or None if codegen cannot emit it as one kernel.
    `sig` (full shape, k) is taken from the first node unless given; `step_cols`: steps
    walk rows that many columns at a time (else a whole row each)."""
    if not nodes or not all(fusible(n) for n in nodes):
        return None
    sig = sig or _signature(nodes[0])
    if sig is None:
        return None
    full, k = sig
    kind: dict = {}
    defined = {n.out.id for n in nodes}

    def cls(v: Value) -> str | None:
        if v.id in kind:
            return kind[v.id]
        c = classify(v.type.shape, full, k)
        if c in ("col", "scalar") and v.id in defined:
            return None  # computed cols/scalars would need their own layout
        kind[v.id] = c
        return c

    for n in nodes:
        if n.op == Op.FULL:
            c = classify(n.out.type.shape, full, k)
            if c not in ("full", "row"):
                return None
            kind[n.out.id] = "const_" + c
            continue
        if n.op == Op.RESHAPE:
            # Same elements in the same order: the input takes the output's class.
            c = classify(n.out.type.shape, full, k)
            if c == "full":  # rows regrouped: the same [R, C] tile stream
                if cls(n.inputs[0]) != "full":
                    return None
                kind[n.out.id] = "full"
                continue
            have = kind.get(n.inputs[0].id)
            if c not in ("row", "col") or (have is not None and have != c):
                return None
            if have is None and n.inputs[0].id in defined:
                return None
            kind[n.inputs[0].id] = kind[n.out.id] = c
            continue
        ins = [cls(v) for v in n.inputs]
        if None in ins:
            return None
        if n.op == Op.BROADCAST:
            if classify(n.out.type.shape, full, k) != "full" or ins[0] not in (
                "row",
                "const_row",
                "col",
                "scalar",
                "period",
            ):
                return None
            if ins[0] == "period" and n.inputs[0].id in defined:
                return None  # a computed period would need its own layout
            named = {"col": "bcast_col", "period": "bcast_period"}
            kind[n.out.id] = named.get(ins[0], "bcast")
            continue
        if n.op in REDUCE_OPS:
            if _AS.get(ins[0]) != "full" or n.inputs[0].type.shape != full:
                return None
            if len(n.attr("axes")) != k or classify(n.out.type.shape, full, k) != "row":
                return None
            kind[n.out.id] = "row"
            continue
        out = classify(n.out.type.shape, full, k)
        if out == "col" and set(ins) == {"col"} and n.op.info.kind in _COL_OPS:
            kind[n.out.id] = "col"  # computed once per kernel (RowKernel)
            continue
        classes = {"full" if c == "bcast" else _AS.get(c) for c in ins}
        if out not in ("full", "row") or classes != {out}:
            return None
        if "bcast" in ins and n.op.info.kind not in _BROADCAST_READERS:
            return None
        kind[n.out.id] = out
    rows = math.prod(full[: len(full) - k])
    cols = math.prod(full[len(full) - k :])
    flat = set(kind.values()) <= {"full", "const_full"}
    if flat:
        rows, cols = row_view(rows * cols)
    p = RowPlan(full, k, rows, cols, kind, flat)
    budget = SBUF_SHARE * target.sbuf_partition_bytes
    if sbuf_bytes(nodes, p, step_cols=step_cols) <= budget:
        return p
    if flat or step_cols is not None or not _chunkable(nodes, kind):
        return None
    p = replace(p, chunked=True)  # Note [wide rows]
    return p if sbuf_bytes(nodes, p) <= budget else None


def _chunkable(nodes: Sequence[Node], kind: dict) -> bool:
    """Whether the group's rows can be walked in column chunks (Note [wide rows]): nothing in
    it reads a reduction made in it, and no value differs from chunk to chunk but its full
    ones."""
    if any(c in ("col", "bcast_col", "period", "bcast_period") for c in kind.values()):
        return False
    reduced = {n.out.id for n in nodes if n.op in REDUCE_OPS}
    return not any(v.id in reduced for n in nodes for v in n.inputs)


def epilogue_plan(mm: Node, nodes: Sequence[Node], target: Target) -> RowPlan | None:
    """The plan of elementwise `nodes` applied to matmul `mm`'s result as each tile of it
    leaves PSUM (Note [matmul epilogue] in emit_matmul.py), or None. Rows are the result's
    rows, columns its N; no reductions (a step sees a piece of a row). The group need not use
    the matmul result yet (a bias broadcast may come first): `uses_result` says."""
    if any(n.op in REDUCE_OPS for n in nodes):
        return None
    shape = mm.out.type.shape
    p = plan(nodes, target, (shape, 1)) if shape else None
    if p is None or p.chunked or p.kind.get(mm.out.id, "full") != "full":
        return None
    return replace(p, rows=math.prod(shape[:-1]), cols=shape[-1], flat=False)


def uses_result(mm: Node, p: RowPlan) -> bool:
    return mm.out.id in p.kind


def epilogue_sbuf_bytes(nodes: Sequence[Node], p: RowPlan, step_cols: int, t: Target) -> int:
    """What a RowKernel for an epilogue takes per partition: steps step_cols wide, constants
    as wide as the row."""
    return sbuf_bytes(nodes, p, rounds_in_flight(nodes, p, t), step_cols)


def values_per_slot(nodes: Sequence[Node], p: RowPlan) -> list[int]:
    """Per slot, the buffers one step takes from it: one per value, except values computed in
    place of their input."""
    slots = assign_slots(nodes, p)
    in_place = in_place_results(nodes, p)
    per_slot = [0] * (max(slots.values(), default=-1) + 1)
    for vid, s in slots.items():
        if vid not in in_place:
            per_slot[s] += 1
    return per_slot


def in_place_results(nodes: Sequence[Node], p: RowPlan) -> dict[int, int]:
    """Elementwise results written over an input that dies there (same element size): value id
    -> the input id whose tile it takes. Fewer buffers per step leave SBUF for more steps in
    flight (rounds_in_flight)."""
    last = _last_uses(nodes)
    taken: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.op.info.kind not in ELEMENTWISE or p.kind.get(n.out.id) != "full":
            continue
        for v in n.inputs:
            same_size = v.type.dtype.itemsize == n.out.type.dtype.itemsize
            if p.kind.get(v.id) == "full" and last[v.id] == i and same_size:
                taken[n.out.id] = v.id
                break
    return taken


def sbuf_bytes(
    nodes: Sequence[Node], p: RowPlan, rounds: int = 2, step_cols: int | None = None
) -> int:
    """Per-partition SBUF the kernel needs: `rounds` steps of every slot's values (so steps
    overlap), one tile per col value and constant, small tiles for row values. Steps are a
    whole row wide (a column chunk for flat and chunked groups) unless step_cols says otherwise."""
    itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
    row_bytes = p.step_cols(itemsize) * itemsize
    step_bytes = row_bytes if step_cols is None else step_cols * itemsize
    periods = sum(1 for c in p.kind.values() if c == "period")
    full = (sum(values_per_slot(nodes, p)) + periods) * rounds * step_bytes
    cols = sum(1 for c in p.kind.values() if c in ("col", "const_full"))
    rows = sum(1 for c in p.kind.values() if c in ("row", "bcast", "scalar", "const_row"))
    extra = 2 * step_bytes if "bcast" in p.kind.values() else 0
    return full + cols * row_bytes + rounds * 2 * rows * 64 + extra


def rounds_in_flight(
    nodes: Sequence[Node], p: RowPlan, t: Target, reserve: int = 0, most: int = 3
) -> int:
    """Row steps whose tiles coexist: three (load, compute and store of successive steps all
    overlap), or up to `most`, where SBUF allows, else two (double buffering)."""
    budget = SBUF_SHARE * t.sbuf_partition_bytes - reserve
    return next((r for r in range(most, 2, -1) if sbuf_bytes(nodes, p, r) <= budget), 2)


def _last_uses(nodes: Sequence[Node]) -> dict[int, int]:
    """Per value, the last node of the group that reads its tile. A reshape or broadcast is
    its input's tile (RowKernel computes nothing for it), so a value and every such view of
    it share one tile and one last use: the tile dies only when none of them is read any
    more (else a result written in place of a view overwrites a value still to be read,
    e.g. a group output that is another reshape of it, stored later)."""
    last: dict[int, int] = {}
    root: dict[int, int] = {}  # value id -> the value whose tile it is
    for i, n in enumerate(nodes):
        for v in n.inputs:
            last[v.id] = i
        if n.op in (Op.RESHAPE, Op.BROADCAST):
            src = n.inputs[0].id
            root[n.out.id] = root.get(src, src)
    shared: dict[int, int] = {}
    for vid, r in root.items():
        shared[r] = max(shared.get(r, -1), last.get(vid, -1), last.get(r, -1))
    for vid, r in root.items():
        if shared[r] >= 0:
            last[vid] = last[r] = shared[r]
    return last


def assign_slots(nodes: Sequence[Node], p: RowPlan) -> dict[int, int]:
    """Linear scan over the group: each full value (loaded or computed) gets a slot no other
    value holds while it is live; a value dies after its last use in the group. A value made
    in place of an input (in_place_results) takes over that input's slot."""
    last = _last_uses(nodes)
    in_place = in_place_results(nodes, p)
    slot: dict[int, int] = {}
    free: list[int] = []
    live: dict[int, int] = {}  # value id -> last use
    count = 0

    def take(vid: int, until: int) -> None:
        nonlocal count
        if free:
            slot[vid] = free.pop()
        else:
            slot[vid] = count
            count += 1
        live[vid] = until

    for i, n in enumerate(nodes):
        for v in n.inputs:
            if p.kind.get(v.id) == "full" and v.id not in slot:
                take(v.id, last[v.id])
        if n.out.id in in_place:
            src = in_place[n.out.id]
            slot[n.out.id] = slot[src]
            del live[src]  # handed over, not freed
            live[n.out.id] = last.get(n.out.id, i)
        elif p.kind.get(n.out.id) == "full":
            take(n.out.id, last.get(n.out.id, i))
        for vid, until in list(live.items()):
            if until <= i:
                free.append(slot[vid])
                del live[vid]
    return slot


def row_tiles_per_step(nodes: Sequence[Node], p: RowPlan) -> int:
    """[p, 1] tiles one row step allocates: row inputs, row results, reduce accumulators."""
    defined = {n.out.id for n in nodes}
    count = sum(1 for vid, c in p.kind.items() if c == "row" and vid not in defined)
    for n in nodes:
        if p.kind[n.out.id] == "row":
            count += 2 if n.op in REDUCE_OPS else 1
    return count
