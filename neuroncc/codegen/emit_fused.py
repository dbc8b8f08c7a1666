"""Fused row kernels: a group of elementwise ops, broadcasts and trailing reductions emitted as
one kernel whose intermediates stay in SBUF.

Note [row space]: every value of a group is seen against one full shape F whose k trailing axes
are a row (C = their product elements) and whose leading axes count the rows (R). A value is
- full: shape F (or, with k = 1, any shape of the same rows and row length: a reshape between
  those is free), an [R, C] tile stream, rows on partitions;
- row: shape F[:-k] + (1,)*k or F[:-k], one element per row ([R, 1] tiles);
- col: shape (1,)*(rank-k) + F[-k:], the same row for every row (loaded once, partition stride
  0), only as the input of a broadcast (whose result reads that tile: "bcast_col");
- scalar: one element, only as the input of a broadcast;
- period: shape (1,)*a + F[a:], rows repeating with period R' = prod(F[a:-k]) (a causal mask
  broadcast over batch and heads), only as a kernel input read by a broadcast, whose result
  ("bcast_period") reads rows r0 mod R' onwards, loaded per row step.
A broadcast of a row or scalar value to full costs nothing: its users read the [p, 1] tile,
which VectorE applies to every element of the row (the per-partition scalar operand of
tensor_tensor / select). Reductions over the trailing k axes turn a full value into a row value.
The kernel walks the rows 128 at a time; a whole row must fit in SBUF, which `plan` checks
against the target (the fuse pass only forms groups that fit). Groups without any row
structure (only same-shape elementwise ops) are laid out as `row_view` of their element count
and walked in column chunks, like the unfused elementwise kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from neuroncc.codegen import costs, isa
from neuroncc.codegen.emit import EmitCtx, P, _compute_instr, rect, row_view
from neuroncc.codegen.targets import Target
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType

_ELEMENTWISE = (Kind.UNARY, Kind.BINARY, Kind.COMPARE, Kind.SELECT, Kind.CAST)
_REDUCE = {Op.REDUCE_SUM: "sum", Op.REDUCE_MAX: "max", Op.REDUCE_MIN: "min"}
_BROADCAST_READERS = (Kind.BINARY, Kind.COMPARE, Kind.SELECT)
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


def _classify(shape: tuple[int, ...], full: tuple[int, ...], k: int) -> str | None:
    lead = full[: len(full) - k]
    if shape == full or (
        k == 1 and shape[-1:] == full[-1:] and math.prod(shape) == math.prod(full)
    ):
        return "full"  # the same [R, C] rows, however the leading axes are split
    if shape in (lead + (1,) * k, lead):
        return "row"
    if len(shape) == len(full) and shape == (1,) * len(lead) + full[len(lead) :]:
        return "col"
    if math.prod(shape) == 1:
        return "scalar"
    if len(shape) == len(full) and any(
        shape[:a] == (1,) * a and shape[a:] == full[a:] for a in range(1, len(lead))
    ):
        return "period"  # the same block of rows over and over (a mask for every head)
    return None


def _signature(n: Node) -> tuple[tuple[int, ...], int] | None:
    """The (full shape, k) a group starting at n would take."""
    if n.op in _REDUCE:
        shape = n.inputs[0].type.shape
        return shape, len(n.attr("axes"))
    shape = n.out.type.shape
    return (shape, 1) if shape else None


def fusible(n: Node) -> bool:
    return n.op.info.kind in _ELEMENTWISE or n.op in _REDUCE or n.op in _LAYOUT_FREE


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
    nodes: Sequence[Node], target: Target, sig: tuple[tuple[int, ...], int] | None = None
) -> RowPlan | None:
    """The row plan of a candidate group, or None if codegen cannot emit it as one kernel.
    `sig` (full shape, k) is taken from the first node unless given."""
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
        c = _classify(v.type.shape, full, k)
        if c in ("col", "scalar") and v.id in defined:
            return None  # computed cols/scalars would need their own layout
        kind[v.id] = c
        return c

    for n in nodes:
        if n.op == Op.FULL:
            c = _classify(n.out.type.shape, full, k)
            if c not in ("full", "row"):
                return None
            kind[n.out.id] = "const_" + c
            continue
        if n.op == Op.RESHAPE:
            # Same elements in the same order: the input takes the output's class.
            c = _classify(n.out.type.shape, full, k)
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
            if _classify(n.out.type.shape, full, k) != "full" or ins[0] not in (
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
        if n.op in _REDUCE:
            if _AS.get(ins[0]) != "full" or n.inputs[0].type.shape != full:
                return None
            if len(n.attr("axes")) != k or _classify(n.out.type.shape, full, k) != "row":
                return None
            kind[n.out.id] = "row"
            continue
        out = _classify(n.out.type.shape, full, k)
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
    if _sbuf_bytes(nodes, p) > SBUF_SHARE * target.sbuf_partition_bytes:
        return None
    return p


def epilogue_plan(mm: Node, nodes: Sequence[Node], target: Target) -> RowPlan | None:
    """The plan of elementwise `nodes` applied to matmul `mm`'s result as each tile of it
    leaves PSUM (Note [matmul epilogue] in emit_matmul.py), or None. Rows are the result's
    rows, columns its N; no reductions (a step sees a piece of a row). The group need not use
    the matmul result yet (a bias broadcast may come first): `uses_result` says."""
    if any(n.op in _REDUCE for n in nodes):
        return None
    shape = mm.out.type.shape
    p = plan(nodes, target, (shape, 1)) if shape else None
    if p is None or p.kind.get(mm.out.id, "full") != "full":
        return None
    return replace(p, rows=math.prod(shape[:-1]), cols=shape[-1], flat=False)


def uses_result(mm: Node, p: RowPlan) -> bool:
    return mm.out.id in p.kind


def epilogue_sbuf_bytes(nodes: Sequence[Node], p: RowPlan, step_cols: int, t: Target) -> int:
    """What a RowKernel for an epilogue takes per partition: steps step_cols wide, constants
    as wide as the row."""
    return _sbuf_bytes(nodes, p, rounds_in_flight(nodes, p, t), step_cols)


def _values_per_slot(nodes: Sequence[Node], p: RowPlan) -> list[int]:
    """Per slot, the buffers one step takes from it: one per value, except values computed in
    place of their input."""
    slots = _assign_slots(nodes, p)
    in_place = _in_place(nodes, p)
    per_slot = [0] * (max(slots.values(), default=-1) + 1)
    for vid, s in slots.items():
        if vid not in in_place:
            per_slot[s] += 1
    return per_slot


def _in_place(nodes: Sequence[Node], p: RowPlan) -> dict[int, int]:
    """Elementwise results written over an input that dies there (same element size): value id
    -> the input id whose tile it takes. Fewer buffers per step leave SBUF for more steps in
    flight (rounds_in_flight)."""
    last = _last_uses(nodes)
    taken: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.op.info.kind not in _ELEMENTWISE or p.kind.get(n.out.id) != "full":
            continue
        for v in n.inputs:
            same_size = v.type.dtype.itemsize == n.out.type.dtype.itemsize
            if p.kind.get(v.id) == "full" and last[v.id] == i and same_size:
                taken[n.out.id] = v.id
                break
    return taken


def _sbuf_bytes(
    nodes: Sequence[Node], p: RowPlan, rounds: int = 2, step_cols: int | None = None
) -> int:
    """Per-partition SBUF the kernel needs: `rounds` steps of every slot's values (so steps
    overlap), one tile per col value and constant, small tiles for row values. Steps are a
    whole row wide (a column chunk for flat groups) unless step_cols says otherwise."""
    itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
    row_bytes = (p.cols if not p.flat else min(p.cols, COLUMN_CHUNK_BYTES // itemsize)) * itemsize
    step_bytes = row_bytes if step_cols is None else step_cols * itemsize
    periods = sum(1 for c in p.kind.values() if c == "period")
    full = (sum(_values_per_slot(nodes, p)) + periods) * rounds * step_bytes
    cols = sum(1 for c in p.kind.values() if c in ("col", "const_full"))
    rows = sum(1 for c in p.kind.values() if c in ("row", "bcast", "scalar", "const_row"))
    extra = 2 * step_bytes if "bcast" in p.kind.values() else 0
    return full + cols * row_bytes + rounds * 2 * rows * 64 + extra


def rounds_in_flight(nodes: Sequence[Node], p: RowPlan, t: Target, reserve: int = 0) -> int:
    """Row steps whose tiles coexist: three (load, compute and store of successive steps all
    overlap) where SBUF allows, else two (double buffering)."""
    budget = SBUF_SHARE * t.sbuf_partition_bytes - reserve
    return 3 if _sbuf_bytes(nodes, p, 3) <= budget else 2


def _last_uses(nodes: Sequence[Node]) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            last[v.id] = i
    return last


def _assign_slots(nodes: Sequence[Node], p: RowPlan) -> dict[int, int]:
    """Linear scan over the group: each full value (loaded or computed) gets a slot no other
    value holds while it is live; a value dies after its last use in the group. A value made
    in place of an input (_in_place) takes over that input's slot."""
    last = _last_uses(nodes)
    in_place = _in_place(nodes, p)
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


def emit_fused(ctx: EmitCtx, nodes: Sequence[Node]) -> None:
    p = plan(nodes, ctx.target)
    if p is None:
        raise AssertionError("the fuse pass formed a group codegen cannot emit")
    itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
    chunk = p.cols if not p.flat else max(1, min(p.cols, COLUMN_CHUNK_BYTES // itemsize))
    kernel = RowKernel(ctx, nodes, p, chunk, chunk)
    if p.rows == 0 or p.cols == 0:
        return  # empty tensors: the buffers exist, nothing moves
    for r0 in range(0, p.rows, P):
        rp = min(P, p.rows - r0)
        for c0 in range(0, p.cols, chunk):
            kernel.step(r0, rp, c0, min(chunk, p.cols - c0))


class RowKernel:
    """A fused group's buffers, pools and constants, and `step`: one [rows, columns] tile of it.

    Steps are `step_cols` wide at most; constants (col values, memsets) are `const_cols` wide:
    the whole row where steps walk a row in pieces (a matmul epilogue, Note [matmul
    epilogue]), the step width where every piece is alike (a flat group)."""

    def __init__(
        self,
        ctx: EmitCtx,
        nodes: Sequence[Node],
        p: RowPlan,
        step_cols: int,
        const_cols: int,
        inside: frozenset[int] = frozenset(),
        reserve: int = 0,
        rounds: int | None = None,
    ) -> None:
        """`inside`: values the enclosing kernel makes beside `nodes` (a value only they read
        stays on chip); `reserve`: SBUF bytes per partition the enclosing kernel keeps;
        `rounds`: steps whose tiles coexist, if the enclosing kernel needs more than two."""
        b = ctx.b
        self.ctx, self.nodes, self.p = ctx, nodes, p
        defined = {n.out.id for n in nodes}
        kernel = defined | inside
        users = ctx.graph.users()
        outputs = {v.id for v in ctx.graph.outputs}
        self.escaping = [
            n.out
            for n in nodes
            if n.out.id in outputs or any(u.out.id not in kernel for u in users[n.out.id])
        ]
        for v in self.escaping:
            ctx.alloc(v)
        if p.rows == 0 or p.cols == 0:
            return
        itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
        self.slots = _assign_slots(nodes, p)
        self.in_place = _in_place(nodes, p)
        # Pools hold two or three rounds of what one step allocates, so step i+1 loads while
        # step i computes and no value is overwritten while live.
        rounds = rounds or rounds_in_flight(nodes, p, ctx.target, reserve)
        self.slot_pools = [
            b.sbuf_pool(step_cols * itemsize, bufs=rounds * n) for n in _values_per_slot(nodes, p)
        ]
        self.row_pool = b.sbuf_pool(64, bufs=rounds * max(1, _row_tiles_per_step(nodes, p)))
        periods = sum(1 for c in p.kind.values() if c == "period")
        self.period_pool = (
            b.sbuf_pool(step_cols * itemsize, bufs=rounds * periods) if periods else None
        )
        # Where an escaping broadcast is materialised before it is stored.
        bcast = "bcast" in p.kind.values()
        self.extra_pool = b.sbuf_pool(step_cols * itemsize, bufs=2) if bcast else None
        # Values the same for every step, made once: col rows and scalars loaded from HBM
        # with partition stride 0, constants memset.
        external = [
            vid for vid, c in p.kind.items() if vid not in defined and c in ("col", "scalar")
        ]
        made = [n for n in nodes if n.op == Op.FULL]
        wide = {vid for vid, c in p.kind.items() if c in ("col", "const_full")}
        n_wide = sum(1 for v in external if v in wide) + sum(1 for n in made if n.out.id in wide)
        wide_pool = b.sbuf_pool(const_cols * itemsize, bufs=max(1, n_wide))
        narrow_pool = b.sbuf_pool(64, bufs=max(1, len(external) + len(made) - n_wide))
        self.consts: dict[int, isa.TileRef] = {}
        self.whole_rows = const_cols == p.cols  # constants hold the whole row: slice at c0
        first_p = min(P, p.rows)

        def const_tile(vid: int, dtype: DType) -> isa.TileRef:
            if vid in wide:
                return wide_pool.tile(first_p, (const_cols,), dtype)
            return narrow_pool.tile(first_p, (1,), dtype)

        for vid in external:
            v = _value(nodes, vid)
            t = const_tile(vid, v.type.dtype)
            b.dma(t, isa.DramRef(ctx.buf(v), 0, v.type.dtype, ((0, first_p), (1, t.free_elems))))
            self.consts[vid] = t
        self.const_values: dict[int, float] = {}
        for n in made:
            t = const_tile(n.out.id, n.out.type.dtype)
            b.emit(isa.Memset("pool", dst=t, value=float(n.attr("value"))))
            self.consts[n.out.id] = t
            self.const_values[n.out.id] = float(n.attr("value"))
        self.balance = EngineBalancer(ctx.target)

    def step(
        self, r0: int, rp: int, c0: int, f: int, given: dict[int, isa.TileRef] | None = None
    ) -> dict[int, isa.TileRef]:
        """Rows r0..r0+rp, columns c0..c0+f: load, compute every node, store. `given` are
        values already on chip for this step (the matmul result of an epilogue). Returns the
        step's tile of every value; they stay valid while the next step runs."""
        return self.steps([(r0, rp, c0, f, given)])[0]

    def steps(self, specs: Sequence[tuple]) -> list[dict[int, isa.TileRef]]:
        """Several steps (r0, rp, c0, f, given) issued node by node in turn, so each engine's
        stream alternates between them and one step's chain of dependent instructions runs
        beside the other's instead of after it. Their tiles must all fit the pools: at most
        `rounds` steps (two always fit)."""
        gens = [_tile_ops(self, r0, rp, c0, f, dict(g or {})) for r0, rp, c0, f, g in specs]
        results: list[dict | None] = [None] * len(gens)
        while any(r is None for r in results):
            for i, gen in enumerate(gens):
                if results[i] is None:
                    try:
                        next(gen)
                    except StopIteration as done:
                        results[i] = done.value
        return results


class EngineBalancer:
    """Spreads a kernel's ALU instructions over the engines that can run them: each goes to the
    candidate with the least estimated busy time so far (costs.instr_ns), so VectorE, GpSimdE
    and ScalarE work side by side instead of queueing on one."""

    def __init__(self, t: Target) -> None:
        self.t = t
        self.busy: dict[str, float] = {"dve": 0.0, "pool": 0.0, "act": 0.0}

    def candidates(self, ins: isa.Instr) -> tuple[str, ...]:
        # Reductions stay on VectorE, the fastest at them: they sit on each row's critical path.
        if isinstance(ins, isa.Activation):
            return ("act",)
        if isinstance(ins, (isa.TensorCopy, isa.TensorScalar)) or _scalar_affine(ins):
            # ScalarE applies a per-partition scale or bias as part of an activation.
            engines = ("dve", "act", "pool")
        elif isinstance(ins, (isa.TensorTensor, isa.Select)):
            engines = ("dve", "pool")
        else:
            return (ins.engine,)
        if self.t.vector_gpsimd_share_sbuf:
            engines = tuple(e for e in engines if e != "pool")
        return engines

    def place(self, ins: isa.Instr) -> isa.Instr:
        options = [replace(ins, engine=e) for e in self.candidates(ins)]
        best = min(options, key=lambda o: self.busy.get(o.engine, 0.0) + costs.instr_ns(o, self.t))
        self.busy[best.engine] = self.busy.get(best.engine, 0.0) + costs.instr_ns(best, self.t)
        return best


def _scalar_affine(ins: isa.Instr) -> bool:
    """x (+-*) a per-partition scalar: what an activation's scale/bias operand computes."""
    return (
        isinstance(ins, isa.TensorTensor)
        and ins.op in ("add", "sub", "mul")
        and ins.dst.free_elems > 1
        and ins.b.free_elems == 1
        and ins.a.free_elems == ins.dst.free_elems
        and ins.dst.dtype.is_float
    )


def _row_tiles_per_step(nodes: Sequence[Node], p: RowPlan) -> int:
    """[p, 1] tiles one row step allocates: row inputs, row results, reduce accumulators."""
    defined = {n.out.id for n in nodes}
    count = sum(1 for vid, c in p.kind.items() if c == "row" and vid not in defined)
    for n in nodes:
        if p.kind[n.out.id] == "row":
            count += 2 if n.op in _REDUCE else 1
    return count


def _fit(const: isa.TileRef, rp: int, c0: int, f: int, whole_rows: bool) -> isa.TileRef:
    """A constant tile seen by one step: its first rp partitions, and for a full-width one the
    step's f columns: from c0 where it holds the whole row, else its first f (every column
    chunk of a flat kernel sees the same constant; the last one can be narrower)."""
    t = const.rows(rp)
    if t.free_elems == 1 or (t.free_elems == f and not whole_rows):
        return t
    return t.cols(c0 if whole_rows else 0, f)


def _with_immediate(k: RowKernel, n: Node, dst: isa.TileRef, srcs: list) -> isa.Instr | None:
    """x <op> c with c a float constant of the group, as tensor_scalar with c as an immediate:
    one pass over x at the tensor_scalar rate (half of tensor_tensor's in fp32), and on any of
    the three engines, instead of streaming a memset tile beside it."""
    if n.op.info.kind != Kind.BINARY:
        return None
    x, c = n.inputs
    value = k.const_values.get(c.id)
    if value is None or not x.type.dtype.is_float or c.type.dtype != x.type.dtype:
        return None
    if srcs[0].shape != dst.shape or dst.free_elems == 1:
        # x a per-partition scalar read as a row; or a [p, 1] row op, where the rate does not
        # matter but moving it to another engine's queue would stall the row's chain
        return None
    return isa.TensorScalar("dve", op=n.op.value, dst=dst, src=srcs[0], scalar=value)


def _load_period(ctx, v: Value, t: isa.TileRef, r0: int, rp: int, c0: int, f: int, cols: int):
    """Rows r0..r0+rp of a value whose rows repeat every R' (its own row count): one DMA per
    run of rows that does not wrap around."""
    period = v.type.numel // cols
    done = 0
    while done < rp:
        src_row = (r0 + done) % period
        run = min(rp - done, period - src_row)
        dst = replace(t, p0=t.p0 + done, np=run)
        ctx.b.dma(dst, rect(ctx.buf(v), v.type.dtype, src_row * cols + c0, cols, run, f))
        done += run


def _value(nodes: Sequence[Node], vid: int) -> Value:
    for n in nodes:
        for v in (*n.inputs, n.out):
            if v.id == vid:
                return v
    raise KeyError(vid)


def _tile_ops(k: RowKernel, r0: int, rp: int, c0: int, f: int, tiles: dict):
    """One [rp rows, f columns] step of the kernel: load, compute every node, store. A
    generator: it pauses after each node (RowKernel.steps) and returns the step's tiles."""
    ctx, nodes, p, consts = k.ctx, k.nodes, k.p, k.consts
    b = ctx.b
    escaping_ids = {v.id for v in k.escaping}

    def tile_of(v: Value) -> isa.TileRef:
        if v.id in tiles:
            return tiles[v.id]
        c = p.kind[v.id]
        if c in ("col", "scalar", "const_full", "const_row"):
            t = _fit(consts[v.id], rp, c0, f, k.whole_rows)
        elif c == "full":
            t = k.slot_pools[k.slots[v.id]].tile(rp, (f,), v.type.dtype)
            b.dma(t, rect(ctx.buf(v), v.type.dtype, r0 * p.cols + c0, p.cols, rp, f))
        elif c == "period":
            t = k.period_pool.tile(rp, (f,), v.type.dtype)
            _load_period(ctx, v, t, r0, rp, c0, f, p.cols)
        else:  # row
            t = k.row_pool.tile(rp, (1,), v.type.dtype)
            b.dma(t, rect(ctx.buf(v), v.type.dtype, r0, 1, rp, 1))
        tiles[v.id] = t
        return t

    def store(v: Value, t: isa.TileRef) -> None:
        c, dt = p.kind[v.id], v.type.dtype
        if c == "bcast":  # materialise the per-partition scalar across the row
            full_t = k.extra_pool.tile(rp, (f,), dt)
            b.emit(isa.TensorTensor("dve", op="max", dst=full_t, a=t, b=t))
            t, c = full_t, "full"
        if c in ("full", "const_full", "bcast_col", "bcast_period"):
            b.dma(rect(ctx.buf(v), dt, r0 * p.cols + c0, p.cols, rp, f), t)
        elif c in ("row", "const_row"):
            b.dma(rect(ctx.buf(v), dt, r0, 1, rp, 1), t)
        elif r0 == 0:  # col: the same row for every row step, stored once
            b.dma(rect(ctx.buf(v), dt, c0, p.cols, 1, f), t.rows(1))

    for n in nodes:
        c = p.kind[n.out.id]
        if n.op in (Op.BROADCAST, Op.RESHAPE, Op.FULL):
            # Read as a per-partition scalar, a col row or a constant tile: nothing to compute.
            src = consts[n.out.id] if n.op == Op.FULL else tile_of(n.inputs[0])
            tiles[n.out.id] = _fit(src, rp, c0, f, k.whole_rows) if n.op == Op.FULL else src
            if n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        yield
        srcs = [tile_of(v) for v in n.inputs]
        if n.out.id in k.in_place:
            dst = replace(tiles[k.in_place[n.out.id]], dtype=n.out.type.dtype)
        elif c == "full":
            dst = k.slot_pools[k.slots[n.out.id]].tile(rp, (f,), n.out.type.dtype)
        else:
            dst = k.row_pool.tile(rp, (1,), n.out.type.dtype)
        if n.op in _REDUCE:
            acc_dt = DType.F32 if n.inputs[0].type.dtype.is_float else DType.I64
            acc = dst if dst.dtype == acc_dt else k.row_pool.tile(rp, (1,), acc_dt)
            b.emit(isa.TensorReduce("dve", op=_REDUCE[n.op], dst=acc, src=srcs[0]))
            if acc is not dst:
                b.emit(isa.TensorCopy("dve", dst=dst, src=acc))
        else:
            b.emit(
                k.balance.place(_with_immediate(k, n, dst, srcs) or _compute_instr(n, dst, srcs))
            )
        tiles[n.out.id] = dst
        if n.out.id in escaping_ids:
            store(n.out, dst)
    return tiles
