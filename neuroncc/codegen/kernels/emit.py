"""Emitters: IR graph -> Executable, one kernel per IR node (opt_level 0 code shape).

Every value lives in its own HBM buffer (a reshape aliases its input's buffer: row-major data
does not move), or, where the plan pass placed it, at its offset in the arena that temporaries
with disjoint lifetimes share. A kernel loads its inputs tile by tile into SBUF, computes on
the engines and stores the result. Tiles respect the hardware limits (Note [tile limits]).

Note [tile limits]: dimension 0 of a tile is the partition dimension (<= 128). Elementwise and
reduction tiles hold at most TILE_BYTES per partition. Matmul tiles are stationary [K<=128,
M<=128] and moving [K<=128, N<=512] with one fp32 PSUM bank ([M, 512] fp32 = 2 KiB) per output
tile; K is accumulated in PSUM.

The EMITTERS registry maps every Op to one function `(ctx, node) -> None`; the completeness test
checks that no Op is missing.
"""

from __future__ import annotations

from collections.abc import Callable

from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.program import ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.types import DType

TILE_BYTES = 8192
P = 128


class EmitCtx:
    """The state of one graph's emission: the builder and where every value lives in HBM."""

    def __init__(self, graph: Graph, target: Target, fit_hbm: bool = True) -> None:
        self.graph, self.target = graph, target
        self.b = ProgramBuilder(target, graph.name, fit_hbm)
        self.loc: dict[int, ValueLoc] = {}
        outputs = {v.id for v in graph.outputs}
        for i, v in enumerate(graph.inputs):
            self.b.dram(f"in{i}", v.type.shape, v.type.dtype, "input")
            self.loc[v.id] = ValueLoc(f"in{i}", v.type.shape, v.type.dtype)
        self._output_ids = outputs
        self.users = graph.users()
        arena, largest = arena_bytes(graph)
        if arena:
            v = largest.out
            self.b.arena(arena, f", its largest value {v}: {v.type.nbytes / 2**30:.2f} GiB")
        # Transposes folded into the matmul that reads them (emit_matmul): value id -> the
        # buffer holding the untransposed data.
        self.transposed_view: dict[int, str] = {}
        # ... and where in that buffer the data starts, in elements, where it is a run of a
        # larger tensor's rows (a slice of W, read in place: views.rows_read_in_place)
        self.view_offset: dict[int, int] = {}
        # slice value id -> (the value it slices, the element its rows start at)
        self.row_slices: dict[int, tuple[Value, int]] = {}
        # slice value id -> (the value it slices, its first element, the row stride): columns
        # of a 2-D tensor that matmuls read as B in place (views.cols_read_in_place)
        self.col_slices: dict[int, tuple[Value, int, int]] = {}
        # matmul left operands read through a head merge: operand id -> views.MergedHeads
        self.merged_heads: dict = {}
        # the SBUF ring that matmuls of few rows load their weights through (Note [weight
        # stream] in emit_few_rows.py), or None
        self.weight_stream = None  # emit_few_rows.WeightStream
        # Attention operands read in place (attention_operands.fold_operand_views): value id ->
        # its views.View.
        self.views: dict = {}
        # (concat id, input position) -> views.ConcatSource (Note [concat in place])
        self.concat_sources: dict = {}
        # slice or DMA transpose id -> the views.View it copies (Note [copies in place])
        self.copy_sources: dict = {}
        # What kernel_key reads of the graph (Note [kernel reuse] in reuse.py), once: buffer
        # name -> the value it was made for, producers, graph input positions, choices.
        self.buffer_values: dict[str, Value] = {f"in{i}": v for i, v in enumerate(graph.inputs)}
        self.buffer_values |= {f"v{n.out.id}": n.out for n in graph.nodes}
        self.producers = graph.producers()
        self.input_index = {v.id: i for i, v in enumerate(graph.inputs)}
        self.choices = dict(graph.choices)
        self.templates: dict = {}  # kernel key -> reuse.Known
        self.constant_forms: dict[int, tuple | None] = {}  # (graph.constant_form)
        # What the open kernel's emission did to this context, while reuse records it.
        self.journal: list | None = None
        self.reuse = True  # place a template's block instead of emitting (tests: False)
        self.check_reuse = False  # emit a key's second kernel too, and compare

    def alloc(self, v: Value) -> str:
        """v's HBM buffer: where the plan pass placed it (the arena), else after the others."""
        name = f"v{v.id}"
        kind = "output" if v.id in self._output_ids else "temp"
        at = self.graph.choice(v.id, "hbm")
        if at is not None and kind == "output":
            raise CodegenError(f"{v} is a graph output: it has a buffer of its own, not hbm={at}")
        self.b.dram(name, v.type.shape, v.type.dtype, kind, at=at)
        self.loc[v.id] = ValueLoc(name, v.type.shape, v.type.dtype)
        if self.journal is not None:
            self.journal.append(("alloc", v))
        return name

    def alias(self, v: Value, buffer: str) -> None:
        """v lives in `buffer`, seen with v's shape (a reshape: row-major data does not
        move)."""
        self.loc[v.id] = ValueLoc(buffer, v.type.shape, v.type.dtype)
        if self.journal is not None:
            self.journal.append(("alias", v, buffer))

    def fold_transpose(self, v: Value, buffer: str, offset: int | None) -> None:
        """v, a transpose, is read by its matmuls from the untransposed data in `buffer`
        (from element `offset` there, if given)."""
        self.transposed_view[v.id] = buffer
        if offset is not None:
            self.view_offset[v.id] = offset
        if self.journal is not None:
            self.journal.append(("fold", v, buffer, offset))

    def replay(self, effect: tuple, values: list[Value]) -> None:
        """Do again what a journal entry (canonical: reuse.template_of) records, on `values`."""
        kind, *args = effect
        if kind == "alloc":
            self.alloc(values[args[0][1]])
        elif kind == "alias":
            self.alias(values[args[0][1]], self.buffer_of(args[1], values))
        elif kind == "fold":
            self.fold_transpose(values[args[0][1]], self.buffer_of(args[1], values), args[2])
        else:
            raise CodegenError(f"unknown journal entry {kind!r}")

    def buffer_of(self, canon: tuple, values: list[Value]) -> str:
        """The buffer a canonical name (reuse._buffer) stands for among `values`."""
        if canon[0] == "name":
            return canon[1]
        v = values[canon[1]]
        i = self.input_index.get(v.id)
        return f"in{i}" if i is not None else f"v{v.id}"

    def stream_state(self) -> tuple:
        """Where the weight stream stands (Note [weight stream]): its ring and its queue."""
        ws = self.weight_stream
        return () if ws is None else (ws.pool.position, ws.turn % len(ws.queues))

    def set_stream_state(self, state: tuple) -> None:
        if state:
            self.weight_stream.pool.position, turn = state
            self.weight_stream.turn = turn

    def buf(self, v: Value) -> str:
        return self.loc[v.id].buffer

    def matrix_source(self, v: Value) -> tuple[str, int, int]:
        """(buffer, first element, row stride) of a value read as rows of its last axis: its
        own buffer, or the larger tensor whose columns it is (`col_slices`)."""
        sliced = self.col_slices.get(v.id)
        if sliced is None:
            return self.buf(v), 0, v.type.shape[-1]
        source, first, stride = sliced
        return self.buf(source), first, stride


def arena_bytes(g: Graph) -> tuple[int, Node | None]:
    """The size of the arena the plan pass's `hbm` choices place values in, and its largest
    value."""
    placed = [(n, g.choice(n.out.id, "hbm")) for n in g.nodes]
    placed = [(n, at) for n, at in placed if at is not None]
    size = max((at + n.out.type.nbytes for n, at in placed), default=0)
    largest = max(placed, key=lambda p: p[0].out.type.nbytes, default=(None, 0))[0]
    return size, largest


Emitter = Callable[[EmitCtx, Node], None]
EMITTERS: dict[Op, Emitter] = {}


def register(*ops: Op) -> Callable[[Emitter], Emitter]:
    def deco(fn: Emitter) -> Emitter:
        for op in ops:
            EMITTERS[op] = fn
        return fn

    return deco


def row_view(numel: int) -> tuple[int, int]:
    """View `numel` contiguous elements as [R, C] with R the largest divisor <= 128, so an
    elementwise kernel fills as many partitions as the size allows."""
    if numel == 0:
        return 0, 0
    for r in range(min(P, numel), 0, -1):
        if numel % r == 0:
            return r, numel // r
    raise AssertionError("unreachable")


def rect(buffer: str, dtype: DType, offset: int, row_stride: int, p: int, f: int) -> isa.DramRef:
    """p rows of f contiguous elements, rows row_stride apart."""
    return isa.DramRef(buffer, offset, dtype, ((row_stride, p), (1, f)))


def tiles_2d(rows: int, cols: int, fmax: int):
    """(r0, p, c0, f) for every [<=128, <=fmax] tile of a [rows, cols] matrix."""
    for r0 in range(0, rows, P):
        for c0 in range(0, cols, fmax):
            yield r0, min(P, rows - r0), c0, min(fmax, cols - c0)


def _compute_instr(n: Node, dst: isa.TileRef, srcs: list[isa.TileRef]) -> isa.Instr:
    kind = n.op.info.kind
    if n.op == Op.NOT:
        return isa.TensorScalar("dve", op="eq", dst=dst, src=srcs[0], scalar=0.0)
    if kind == Kind.UNARY:
        return isa.Activation("act", func=n.op.value, dst=dst, src=srcs[0])
    if kind in (Kind.BINARY, Kind.COMPARE):
        return isa.TensorTensor("dve", op=n.op.value, dst=dst, a=srcs[0], b=srcs[1])
    if kind == Kind.SELECT:
        return isa.Select("dve", dst=dst, pred=srcs[0], a=srcs[1], b=srcs[2])
    if kind == Kind.CAST:
        return isa.TensorCopy("dve", dst=dst, src=srcs[0])
    raise AssertionError(n.op)


@register(
    *(
        op
        for op in Op
        if op.info.kind in (Kind.UNARY, Kind.BINARY, Kind.COMPARE, Kind.SELECT, Kind.CAST)
    )
)
def emit_elementwise(ctx: EmitCtx, n: Node) -> None:
    b = ctx.b
    out = ctx.alloc(n.out)
    values = [*n.inputs, n.out]
    itemsize = max(v.type.dtype.itemsize for v in values)
    fmax = TILE_BYTES // itemsize
    rows, cols = row_view(n.out.type.numel)
    slot = min(cols, fmax) * itemsize
    pools = [b.sbuf_pool(slot, bufs=2) for _ in values]
    tiles = list(tiles_2d(rows, cols, fmax))  # (one row of tiles: row_view's rows <= 128)
    for i in b.loop([tile[1::2] for tile in tiles]):  # Note [instruction loops]
        r0, p, c0, f = tiles[i]
        srcs = []
        for v, pool in zip(n.inputs, pools, strict=False):
            t = pool.tile(p, (f,), v.type.dtype)
            b.dma(t, rect(ctx.buf(v), v.type.dtype, r0 * cols + c0, cols, p, f))
            srcs.append(t)
        dst = pools[-1].tile(p, (f,), n.out.type.dtype)
        b.emit(_compute_instr(n, dst, srcs))
        b.dma(rect(out, n.out.type.dtype, r0 * cols + c0, cols, p, f), dst)


@register(Op.FULL)
def emit_full(ctx: EmitCtx, n: Node) -> None:
    b, t = ctx.b, n.out.type
    out = ctx.alloc(n.out)
    rows, cols = row_view(t.numel)
    fmax = TILE_BYTES // t.dtype.itemsize
    if not rows:
        return
    tile = b.sbuf_pool(min(cols, fmax) * t.dtype.itemsize, bufs=1).tile(
        min(P, rows), (min(cols, fmax),), t.dtype
    )
    b.emit(isa.Memset("pool", dst=tile, value=float(n.attr("value"))))
    tiles = list(tiles_2d(rows, cols, fmax))  # (one row of tiles: row_view's rows <= 128)
    for i in b.loop([tile[1::2] for tile in tiles]):  # Note [instruction loops]
        r0, p, c0, f = tiles[i]
        b.dma(rect(out, t.dtype, r0 * cols + c0, cols, p, f), tile.rows(p).cols(0, f))


@register(Op.IOTA)
def emit_iota(ctx: EmitCtx, n: Node) -> None:
    b, t = ctx.b, n.out.type
    out = ctx.alloc(n.out)
    rows, cols = row_view(t.numel)
    fmax = TILE_BYTES // t.dtype.itemsize
    pool = b.sbuf_pool(min(cols, fmax) * t.dtype.itemsize, bufs=2) if rows else None
    start, step = float(n.attr("start")), float(n.attr("step"))
    for r0, p, c0, f in tiles_2d(rows, cols, fmax):
        tile = pool.tile(p, (f,), t.dtype)
        base = start + step * (r0 * cols + c0)
        b.emit(isa.Iota("pool", dst=tile, base=base, pstep=step * cols, fstep=step))
        b.dma(rect(out, t.dtype, r0 * cols + c0, cols, p, f), tile)
