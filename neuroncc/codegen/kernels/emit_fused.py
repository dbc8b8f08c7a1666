"""Fused row kernels: a group of elementwise ops, broadcasts and trailing reductions emitted as
one kernel whose intermediates stay in SBUF. What a group is and how its values are laid out
and buffered: Note [row space] in codegen/kernels/row_plan.py; what the kernel emits in place of
some nodes (activation-reduces, folded casts): row_rewrites.py, and their instructions:
row_ops.py. Here: the kernel (`RowKernel`:
pools, constants, and `step`, one [rows, columns] tile of it) and how its instructions are spread
over the engines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.emit import EmitCtx, P, _compute_instr, rect
from neuroncc.codegen.kernels.engine_balance import EngineBalancer
from neuroncc.codegen.kernels.row_ops import (
    activation_reduce,
    chunk_reduce,
    square_sum,
    with_immediate,
)
from neuroncc.codegen.kernels.row_plan import (
    REDUCE_OPS,
    RowPlan,
    assign_slots,
    in_place_results,
    plan,
    rounds_in_flight,
    row_tiles_per_step,
    values_per_slot,
)
from neuroncc.codegen.kernels.row_rewrites import (
    activation_reduces,
    as_computed,
    narrowing_casts,
    square_sums,
    unread,
    widening_casts,
)
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType

PAIRED_ROW_BYTES = 4096  # row kernels issue two steps at a time up to this row size
BALANCE_GROUPS = 2  # a long loop's groups restart the engine balance this often
GEN_COLS = 128  # generated tiles are this wide at most (one key tile), and kept for reuse
GEN_CACHED = 4
GENERATED_BYTES = GEN_CACHED * GEN_COLS + 2 * GEN_COLS * 4  # their pool and the iotas'


def emit_fused(
    ctx: EmitCtx, nodes: Sequence[Node], sig: tuple[tuple[int, ...], int] | None = None
) -> None:
    """The group `nodes` as one row kernel; `sig` (full shape, k) as for row_plan.plan."""
    p = plan(nodes, ctx.target, sig)
    if p is None:
        raise AssertionError("the fuse pass formed a group codegen cannot emit")
    itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
    chunk = p.step_cols(itemsize)
    # Two steps at a time, and the next two's loads ahead, where four rounds fit.
    kernel = RowKernel(
        ctx, nodes, p, chunk, chunk, rounds=rounds_in_flight(nodes, p, ctx.target, most=4)
    )
    if p.rows == 0 or p.cols == 0:
        return  # empty tensors: the buffers exist, nothing moves
    steps = [
        (r0, min(P, p.rows - r0), c0, min(chunk, p.cols - c0))
        for r0 in range(0, p.rows, P)
        for c0 in range(0, p.cols, chunk)
    ]
    # Steps go in groups of `width`, issued node by node in turn (RowKernel.steps), so one
    # step's chain of dependent instructions runs beside the other's on the engines instead of
    # after it. Each group's inputs are loaded before the group ahead of it computes and
    # stores: DMAs share the engines in the order they are issued, so a load issued after the
    # previous step's store would wait behind it. A group and the next one's loads take
    # 2 * width rounds of the pools (with two rounds, the load would wait for the step ahead
    # to finish anyway). Pairs pay where rows are short and a step's chain of fixed
    # instruction costs is what bounds it (LayerNorm on trn2, fp32 4096 rows: 768 wide
    # 99.8 -> 91.6 us, 1024 wide 123.8 -> 114.3), not where its passes over long rows do
    # (2048 wide 207.6 -> 225.0, 4096 wide 402.9 -> 447.0).
    early = kernel.rounds >= 3
    width = 2 if kernel.rounds >= 4 and chunk * itemsize <= PAIRED_ROW_BYTES else 1
    groups = [steps[i : i + width] for i in range(0, len(steps), width)]

    def prefetch(group: list) -> list[dict]:
        return [kernel.prefetch(*spec) for spec in group] if early else [{}] * len(group)

    loaded = prefetch(groups[0])
    periods = kernel.periods

    # Where a step lies in its rows: its column, where a step's instructions read it (a
    # generated mask's iota base, a slice of constants that hold the whole row); otherwise
    # only whether it is a row's first chunk (it starts the running reductions) or last (it
    # ends them). The chunks between are alike, at addresses affine in their index (Note
    # [wide rows] in row_plan.py): a row of a 151936-word vocabulary in bf16 is 149 chunks
    # of 1024, of which the loop builds a few, where each was a form of its own.
    by_column = bool(kernel.generated) or kernel.whole_rows

    def where(c0: int, f: int) -> tuple:
        return (c0,) if by_column else (c0 == 0, c0 + f == p.cols)

    def shape(i: int) -> tuple | None:
        if i == len(groups):
            return None
        return tuple(
            (rp, where(c0, f), f, r0 == 0, tuple(r0 % n for n in periods))
            for r0, rp, c0, f in groups[i]
        )

    # Note [instruction loops]: a group is fixed by its steps' shapes, where they lie in their
    # rows (and in a repeating input's rows) and the next group's shapes (its loads ahead).
    forms = [(shape(i), shape(i + 1)) for i in range(len(groups))]

    def state() -> tuple:
        return tuple(tuple(given.items()) for given in loaded), kernel.loop_state()

    looped = ctx.b.builds_by_iteration(len(groups))
    for i in ctx.b.loop(forms, state):
        if looped and i % BALANCE_GROUPS == 0:  # Note [balance in loops]
            kernel.balance.restart()
        ahead = prefetch(groups[i + 1]) if i + 1 < len(groups) else []
        kernel.steps([(*spec, given) for spec, given in zip(groups[i], loaded, strict=True)])
        loaded = ahead


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
        aliases: Mapping[int, int] | None = None,
        keep: Sequence[int] = (),
        generated: Mapping[int, tuple[int, int, int, int]] | None = None,
        aligned: bool = False,
    ) -> None:
        """`inside`: values the enclosing kernel makes beside `nodes` (a value only they read
        stays on chip); `reserve`: SBUF bytes per partition the enclosing kernel keeps;
        `rounds`: steps whose tiles coexist, if the enclosing kernel needs more than two;
        `aliases`: value id -> the input it may be taken as, without an instruction (a select
        whose condition is known, Note [dead keys]); honoured where the value would be written
        over that input anyway (`aliased`), and then what only the other inputs needed is not
        computed (`dead`; `keep`: values the enclosing kernel reads from the step's tiles);
        `generated`: inputs made on chip instead of loaded, value id -> (base, pstep, fstep,
        rows m): row r0 + p, column c0 + f holds base + pstep * (r0 % m + p) + fstep * (c0 + f)
        >= 0 (Note [generated masks]; at most GENERATED_BYTES per partition); `aligned`: each
        call of `steps` starts its steps at a whole step's buffers of the pools (Note [aligned
        steps]), for a caller that loads nothing ahead of them (`prefetch`)."""
        b = ctx.b
        self.ctx, self.nodes, self.p = ctx, nodes, p
        # the rows of each input whose rows repeat (a mask shared by heads), where a step's
        # rows fall in them fixes its loads
        self.periods = [
            v.type.numel // p.cols for v in _inputs(nodes) if p.kind.get(v.id) == "period"
        ]
        defined = {n.out.id for n in nodes}
        kernel = defined | inside
        users = ctx.users
        outputs = ctx._output_ids
        self.escaping = [
            n.out
            for n in nodes
            if n.out.id in outputs or any(u.out.id not in kernel for u in users[n.out.id])
        ]
        for v in self.escaping:
            ctx.alloc(v)
        self.aliased: dict[int, int] = {}
        self.running: dict[int, isa.TileRef] = {}  # reduction id -> its rows' accumulator
        self.balance = EngineBalancer(ctx.target)
        self.gen_tiles: dict[tuple, isa.TileRef] = {}  # (base, pstep, fstep, rows, cols)
        if p.rows == 0 or p.cols == 0:
            return
        itemsize = max(v.type.dtype.itemsize for n in nodes for v in (*n.inputs, n.out))
        whole_rows = not p.flat and step_cols == p.cols
        escaping_ids = {v.id for v in self.escaping}
        self.act_reduce = activation_reduces(nodes, p, users, escaping_ids) if whole_rows else {}
        self.square_sums = square_sums(nodes, p, users, escaping_ids) if whole_rows else {}
        if self.square_sums:  # their activation's bias: none
            self.zero = b.sbuf_pool(64, bufs=1).tile(min(P, p.rows), (1,), DType.F32)
            b.emit(isa.Memset("pool", dst=self.zero, value=0.0))
        read_outside = {n.out.id for n in nodes if any(u.out.id in inside for u in users[n.out.id])}
        roots = escaping_ids | read_outside | set(keep)
        self.widened = widening_casts(nodes, p, roots, users)
        special = set(self.act_reduce) | set(self.square_sums.values())
        self.narrowed = narrowing_casts(nodes, p, roots, users, special)
        # Buffers as the kernel will compute: an activation-reduce reads x and the row itself;
        # what reads a widening cast reads its input, what reads a narrowing one its producer.
        casts = {**self.widened, **{c.out.id: c.inputs[0] for c in self.narrowed.values()}}
        planned = as_computed(nodes, self.act_reduce, casts)
        self.slots = assign_slots(planned, p)
        self.in_place = in_place_results(planned, p)
        self.aliased = {
            out: src for out, src in (aliases or {}).items() if self.in_place.get(out) == src
        }
        self.dead = unread(nodes, roots, self.aliased, self.act_reduce) if self.aliased else set()
        # Pools hold two or three rounds of what one step allocates, so step i+1 loads while
        # step i computes and no value is overwritten while live.
        rounds = self.rounds = rounds or rounds_in_flight(nodes, p, ctx.target, reserve)
        self.aligned = aligned
        self.slot_pools = [
            b.sbuf_pool(step_cols * itemsize, bufs=rounds * n) for n in values_per_slot(planned, p)
        ]
        row_tiles = row_tiles_per_step(nodes, p) + len(self.act_reduce)  # + the -max tiles
        self.row_pool = b.sbuf_pool(64, bufs=rounds * max(1, row_tiles))
        # Note [wide rows]: a reduction's running accumulator lives through its rows' chunks;
        # two, for the next rows' first chunk beside these rows' last.
        reductions = sum(1 for n in nodes if n.op in REDUCE_OPS)
        self.acc_pool = b.sbuf_pool(64, bufs=2 * reductions) if p.chunked and reductions else None
        periods = sum(1 for c in p.kind.values() if c == "period")
        self.period_pool = (
            b.sbuf_pool(step_cols * itemsize, bufs=rounds * periods) if periods else None
        )
        # Where an escaping broadcast is materialised before it is stored.
        bcast = "bcast" in p.kind.values()
        self.extra_pool = b.sbuf_pool(step_cols * itemsize, bufs=2) if bcast else None
        # Values the same for every step, made once: col rows and scalars loaded from HBM
        # with partition stride 0, constants memset, col values computed from them.
        external = [
            vid for vid, c in p.kind.items() if vid not in defined and c in ("col", "scalar")
        ]
        made = [n for n in nodes if n.op == Op.FULL]
        computed_cols = [n for n in nodes if p.kind[n.out.id] == "col" and n.op != Op.RESHAPE]
        wide = {vid for vid, c in p.kind.items() if c in ("col", "const_full")}
        n_wide = sum(1 for v in external if v in wide) + sum(1 for n in made if n.out.id in wide)
        n_narrow = len(external) + len(made) - n_wide
        n_wide += len(computed_cols)
        wide_pool = b.sbuf_pool(const_cols * itemsize, bufs=n_wide) if n_wide else None
        narrow_pool = b.sbuf_pool(64, bufs=n_narrow) if n_narrow else None
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
        for n in nodes:  # (in order: a reshape's input is there before it)
            if p.kind[n.out.id] != "col" or n.out.id in self.consts:
                continue
            if n.op == Op.RESHAPE:
                self.consts[n.out.id] = self.consts[n.inputs[0].id]
                continue
            t = self.consts[n.out.id] = const_tile(n.out.id, n.out.type.dtype)
            b.emit(_compute_instr(n, t, [self.consts[v.id] for v in n.inputs]))
        self.generated = generated_values(nodes, generated or {})
        assert self.generated is not None, "generated values are read as select conditions"
        if self.generated:
            self.gen_pool = b.sbuf_pool(GEN_COLS, bufs=GEN_CACHED)
            self.iota_pool = b.sbuf_pool(GEN_COLS * 4, bufs=2)

    def loop_state(self) -> tuple:
        """What steps carry to the next beside the pools (a loop's state, Note [instruction
        loops]): the engines' balance, the generated tiles kept and the running reductions."""
        return self.balance.state(), tuple(self.gen_tiles.items()), tuple(self.running.items())

    def prefetch(self, r0: int, rp: int, c0: int, f: int) -> dict[int, isa.TileRef]:
        """The full inputs of step (r0, rp, c0, f) loaded ahead of it, as its `given`."""
        p = self.p
        defined = {n.out.id for n in self.nodes}
        tiles = {}
        for n in self.nodes:
            if n.out.id in self.dead or n.out.id in self.aliased:
                continue
            for v in n.inputs:
                if v.id in defined or v.id in tiles or p.kind.get(v.id) != "full":
                    continue
                if v.id not in self.generated:
                    tiles[v.id] = self.load_full(v, r0, rp, c0, f)
        return tiles

    def load_full(self, v: Value, r0: int, rp: int, c0: int, f: int) -> isa.TileRef:
        """A full input's [rp, f] tile of a step, DMA'd into a buffer of its slot."""
        ctx, cols = self.ctx, self.p.cols
        t = self.slot_pools[self.slots[v.id]].tile(rp, (f,), v.type.dtype)
        ctx.b.dma(t, rect(ctx.buf(v), v.type.dtype, r0 * cols + c0, cols, rp, f))
        return t

    def step(
        self, r0: int, rp: int, c0: int, f: int, given: dict[int, isa.TileRef] | None = None
    ) -> dict[int, isa.TileRef]:
        """Rows r0..r0+rp, columns c0..c0+f: load, compute every node, store. `given` are
        values already on chip for this step (the matmul result of an epilogue). Returns the
        step's tile of every value; they stay valid while the next step runs."""
        return self.steps([(r0, rp, c0, f, given)])[0]

    def steps(self, specs: Sequence[tuple]) -> list[dict[int, isa.TileRef]]:
        """Several steps (r0, rp, c0, f, given[, passed]) issued node by node in turn, so each
        engine's stream alternates between them and one step's chain of dependent
        instructions runs beside the other's instead of after it. Their tiles must all fit the
        pools: at most `rounds` steps (two always fit). `passed`: select id -> leading columns
        of the step where its condition is true (KeyFacts.true_prefix)."""
        if self.aligned:
            self._align()
        gens = [
            _tile_ops(self, r0, rp, c0, f, dict(g or {}), rest[0] if rest else {})
            for r0, rp, c0, f, g, *rest in specs
        ]
        results: list[dict | None] = [None] * len(gens)
        while any(r is None for r in results):
            for i, gen in enumerate(gens):
                if results[i] is None:
                    try:
                        next(gen)
                    except StopIteration as done:
                        results[i] = done.value
        return results

    def _align(self, whole: bool = False) -> None:
        """Note [aligned steps]: the next step's tiles start at a whole step's block of each
        pool, or with `whole` at a whole turn of it."""
        per_step = [*self.slot_pools, self.row_pool, self.period_pool]
        for pool in per_step:
            if pool is not None:
                pool.align(pool.bufs if whole else pool.bufs // self.rounds)

    def turn(self) -> None:
        """Start the next step at a whole turn of the pools: for a caller whose loop's
        iterations issue several steps each (a matmul's epilogue, one step per result tile),
        so that each iteration turns them by whole rotations (Note [aligned steps])."""
        self._align(whole=True)


# Note [aligned steps]: the pools that hold a step's values have `rounds` whole steps' worth
# of buffers (a step takes at most bufs / rounds of each), and at most `rounds` steps' tiles
# are live at once. A step that takes fewer (a value computed in place, a narrower chunk of
# a causal row) moves the pools by less, so in a loop whose iterations issue several steps
# the pools turn by a different amount each iteration and no two iterations meet the same
# tiles (Note [instruction loops]): a matmul of 7 M tiles with its epilogue repeated nothing
# in 73 steps. Started at a multiple of bufs / rounds, each step takes the buffers a step
# that took them all would, the same block of them every `rounds` steps: what is live is
# what the pools were sized for, and the pools turn by whole steps. The buffers a step
# leaves are then idle where unaligned steps would have used them to start sooner (Qwen3-8B
# sized MLP, 2048 tokens, forward and backward: +0.5% device time), so only loops align.


def _passed_columns(k: RowKernel, n: Node, passed: dict, c0: int, f: int) -> int:
    """Leading columns of a step where the select n leaves its `a` input as it is: its
    condition is true there (`passed`: the leading columns of the row where it is) and it
    writes over a's tile."""
    lo = passed.get(n.out.id, 0) - c0
    if lo <= 0 or n.op.info.kind != Kind.SELECT:
        return 0
    return min(lo, f) if k.in_place.get(n.out.id) == n.inputs[1].id else 0


def _fit(const: isa.TileRef, rp: int, c0: int, f: int, whole_rows: bool) -> isa.TileRef:
    """A constant tile seen by one step: its first rp partitions, and for a full-width one the
    step's f columns: from c0 where it holds the whole row, else its first f (every column
    chunk of a flat kernel sees the same constant; the last one can be narrower)."""
    t = const.rows(rp)
    if t.free_elems == 1 or (t.free_elems == f and not whole_rows):
        return t
    return t.cols(c0 if whole_rows else 0, f)


def _generated_tile(k: RowKernel, v: Value, r0: int, rp: int, c0: int, f: int) -> isa.TileRef:
    """Rows r0..r0+rp, columns c0..c0+f (f <= GEN_COLS) of a generated input (Note [generated
    masks]): an iota and a compare. The tiles are kept and reused by later steps that need the
    same values (a causal mask's diagonal tile, for every query block of every head): the last
    GEN_CACHED of them, in the order the pool hands out its buffers."""
    base, pstep, fstep, m = k.generated[v.id]
    i0 = r0 % m
    assert i0 + rp <= m and f <= GEN_COLS, "one period of the rows, GEN_COLS columns at most"
    b0 = base + pstep * i0 + fstep * c0
    key = (b0, pstep, fstep, rp, f)
    if key not in k.gen_tiles:
        if len(k.gen_tiles) == GEN_CACHED:  # the pool's next buffer is the oldest entry's
            del k.gen_tiles[next(iter(k.gen_tiles))]
        t = k.gen_tiles[key] = k.gen_pool.tile(rp, (f,), v.type.dtype)
        line = k.iota_pool.tile(rp, (f,), DType.F32)
        b = k.ctx.b
        b.emit(isa.Iota("pool", dst=line, base=float(b0), pstep=float(pstep), fstep=float(fstep)))
        test = isa.TensorScalar("dve", op="ge", dst=t, src=line, scalar=0.0)
        b.emit(k.balance.place(test))
    return k.gen_tiles[key]


def generated_values(nodes: Sequence[Node], roots: Mapping[int, tuple]) -> dict | None:
    """Note [generated masks]: the values of a group made on chip from `roots` (id -> its
    form): the roots, and what only adds batch dims to them (a mask broadcast over heads).
    None if one of them is read other than as a select's condition, the one use made by
    columns."""
    made = dict(roots)
    for n in nodes:
        if n.op not in (Op.BROADCAST, Op.RESHAPE):
            continue
        x = n.inputs[0]
        if x.id in made and n.out.type.shape[-2:] == x.type.shape[-2:]:
            made[n.out.id] = made[x.id]
    for n in nodes:
        for i, v in enumerate(n.inputs):
            if v.id in made and n.out.id not in made and (n.op is not Op.WHERE or i):
                return None
    return made


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


def _inputs(nodes: Sequence[Node]) -> list[Value]:
    """The values the nodes read, each once."""
    return list({v.id: v for n in nodes for v in n.inputs}.values())


def _value(nodes: Sequence[Node], vid: int) -> Value:
    for n in nodes:
        for v in (*n.inputs, n.out):
            if v.id == vid:
                return v
    raise KeyError(vid)


def _tile_ops(k: RowKernel, r0: int, rp: int, c0: int, f: int, tiles: dict, passed: dict):
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
            t = k.load_full(v, r0, rp, c0, f)
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
            if not p.chunked or c0 == 0 or v.id in k.running:  # (once per rows)
                b.dma(rect(ctx.buf(v), dt, r0, 1, rp, 1), t)
        elif r0 == 0:  # col: the same row for every row step, stored once
            b.dma(rect(ctx.buf(v), dt, c0, p.cols, 1, f), t.rows(1))

    skip = {diff.out.id for diff, _ in k.act_reduce.values()}
    skip |= {total.out.id for _, total in k.act_reduce.values()}
    skip |= {total.out.id for total in k.square_sums.values()}
    for n in nodes:
        if n.out.id in k.dead:
            continue
        c = p.kind[n.out.id]
        if n.out.id in k.aliased:  # the input's tile, which it would have overwritten
            src = next(v for v in n.inputs if v.id == k.aliased[n.out.id])
            tiles[n.out.id] = replace(tile_of(src), dtype=n.out.type.dtype)
            if n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        if n.out.id in skip:  # made by an activation-reduce
            if n.out.id in tiles and n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        if n.out.id in k.generated:  # made where a select reads it
            continue
        if n.out.id in k.widened:  # its readers read its input (Note [widening casts])
            tiles[n.out.id] = tile_of(k.widened[n.out.id])
            continue
        if n.op.info.kind is Kind.CAST and n.inputs[0].id in k.narrowed:
            # its producer wrote it (Note [narrowing casts])
            tiles[n.out.id] = tiles[n.inputs[0].id]
            if n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        if c == "col":  # made once (RowKernel)
            tiles[n.out.id] = tile_of(n.out)
            if n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        if n.op in (Op.BROADCAST, Op.RESHAPE, Op.FULL):
            # Read as a per-partition scalar, a col row or a constant tile: nothing to compute.
            src = consts[n.out.id] if n.op == Op.FULL else tile_of(n.inputs[0])
            tiles[n.out.id] = _fit(src, rp, c0, f, k.whole_rows) if n.op == Op.FULL else src
            if n.out.id in escaping_ids:
                store(n.out, tiles[n.out.id])
            continue
        yield
        lo = _passed_columns(k, n, passed, c0, f)
        diff = k.act_reduce.get(n.out.id, (None,))[0]
        ins = (diff or n).inputs
        made = n.op.info.kind is Kind.SELECT and ins[0].id in k.generated
        srcs = [tile_of(v) for v in ins[made:]]  # (a generated condition: by columns, below)
        cast = k.narrowed.get(n.out.id)
        dt = (cast or n).out.type.dtype
        if n.out.id in k.in_place and tiles[k.in_place[n.out.id]] in k.gen_tiles.values():
            # not over a kept generated tile, which later steps reuse: into its slot
            dst = k.slot_pools[k.slots[k.in_place[n.out.id]]].tile(rp, (f,), dt)
        elif n.out.id in k.in_place:
            dst = replace(tiles[k.in_place[n.out.id]], dtype=dt)
        elif c == "full":
            dst = k.slot_pools[k.slots[n.out.id]].tile(rp, (f,), dt)
        else:
            dst = k.row_pool.tile(rp, (1,), dt)
        if made:  # the condition made GEN_COLS columns at a time, and the select with it
            for c in range(lo, f, GEN_COLS):
                w = min(GEN_COLS, f - c)
                cond = _generated_tile(k, ins[0], r0, rp, c0 + c, w)
                cut = [t.cols(c, w) if t.free == (f,) else t for t in srcs]
                b.emit(k.balance.place(_compute_instr(n, dst.cols(c, w), [cond, *cut])))
        elif lo:  # where(c, x, y) over x's tile with c true on the first lo columns: x there
            if lo < f:
                cut = [t.cols(lo, f - lo) if t.free == (f,) else t for t in srcs]
                b.emit(k.balance.place(_compute_instr(n, dst.cols(lo, f - lo), cut)))
        elif n.out.id in k.act_reduce:
            activation_reduce(k, n, dst, tiles, rp)
        elif n.out.id in k.square_sums:  # (x's tile: the first operand)
            square_sum(k, n, dst, srcs[0], tiles, rp)
        elif n.op in REDUCE_OPS and p.chunked:
            dst = chunk_reduce(k, n, dst, srcs[0], rp, c0, f)
            if dst is None:  # the rows' later chunks add to it
                continue
        elif n.op in REDUCE_OPS:
            acc_dt = n.inputs[0].type.dtype.accumulator
            acc = dst if dst.dtype == acc_dt else k.row_pool.tile(rp, (1,), acc_dt)
            b.emit(isa.TensorReduce("dve", op=REDUCE_OPS[n.op], dst=acc, src=srcs[0]))
            if acc is not dst:
                b.emit(isa.TensorCopy("dve", dst=dst, src=acc))
        else:
            b.emit(k.balance.place(with_immediate(k, n, dst, srcs) or _compute_instr(n, dst, srcs)))
        tiles[n.out.id] = dst
        if n.out.id in escaping_ids:
            store(n.out, dst)
    return tiles
