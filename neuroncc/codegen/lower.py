"""IR graph -> Executable: one kernel per fused group (emit_fused) or per remaining node."""

from __future__ import annotations

from neuroncc.codegen.executable.builder import OnChipOverflow
from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels import emit_matmul, emit_tensor  # noqa: F401  (register the emitters)
from neuroncc.codegen.kernels.attention_backward import backward_plans, fold_backward_views
from neuroncc.codegen.kernels.attention_operands import fold_operand_views
from neuroncc.codegen.kernels.attention_planner import (
    AttentionPlan,
    attention_plans,
    with_key_facts,
)
from neuroncc.codegen.kernels.dead_keys import Memo as KeyFactsMemo
from neuroncc.codegen.kernels.emit import EMITTERS, EmitCtx
from neuroncc.codegen.kernels.emit_attention import emit_attention
from neuroncc.codegen.kernels.emit_attention_backward import emit_attention_backward
from neuroncc.codegen.kernels.emit_few_rows import (
    STREAM_QUEUES,
    STREAM_TILES,
    WeightStream,
    stream_tile_bytes,
)
from neuroncc.codegen.kernels.emit_fused import emit_fused
from neuroncc.codegen.kernels.emit_tensor import transpose_layout
from neuroncc.codegen.kernels.reuse import emit_once
from neuroncc.codegen.kernels.views import (
    cols_read_in_place,
    concat_sources,
    copy_sources,
    merged_heads,
    rows_read_in_place,
)
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Graph
from neuroncc.ir.ops import Op
from neuroncc.ir.printer import format_node


def emit_graph(
    g: Graph,
    target: Target,
    reuse: bool = True,
    unrolled: bool = False,
    check_reuse: bool = False,
    fit_hbm: bool = True,
) -> Executable:
    """g's executable; `reuse=False` emits every kernel, where a kernel identical to one
    before it is otherwise placed from its template (Note [kernel reuse]); `unrolled=True`
    emits every iteration of every loop, where one that repeats earlier ones is otherwise
    placed as calls of their blocks (Note [instruction loops]): the executable must be the
    same. `check_reuse=True` emits the second kernel of each key too and checks that it comes
    out as the template says (the kernel keys' check: stats()["kernel_key_mismatches"]).
    `fit_hbm=False` lets its buffers exceed the target's HBM (Note [estimates past the core's
    HBM] in program.py), where they are otherwise a CapacityError."""
    tile = stream_tile_bytes(g, target)
    modes = (reuse, unrolled, check_reuse, fit_hbm)
    if tile:  # Note [weight stream]
        try:
            return _emit(g, target, STREAM_TILES * tile, *modes)
        except OnChipOverflow:
            pass  # a kernel needs the bytes the ring would take: without it
    return _emit(g, target, 0, *modes)


def _emit(
    g: Graph,
    target: Target,
    stream_bytes: int,
    reuse: bool,
    unrolled: bool = False,
    check_reuse: bool = False,
    fit_hbm: bool = True,
) -> Executable:
    ctx = EmitCtx(g, target, fit_hbm)
    ctx.reuse, ctx.check_reuse = reuse, check_reuse
    ctx.b.unrolled = unrolled
    if stream_bytes:
        ring = ctx.b.ring(stream_bytes)
        ctx.weight_stream = WeightStream(ring, ctx.b.reserve_queues(STREAM_QUEUES))
    nodes = list(g.nodes)
    start = {ids[0]: ids for ids in g.kernels}
    attention: dict[int, AttentionPlan] = {}
    # row groups' dead-key facts, layer to layer; constants known as the kernel keys know them
    analysed = KeyFactsMemo(ctx.producers, forms=ctx.constant_forms)
    for first, ap in attention_plans(g, target).items():
        if ap is None:
            raise CodegenError("the fuse pass formed an attention group codegen rejects")
        attention[first] = with_key_facts(g, ap, analysed)
    backward = backward_plans(g, target, analysed)
    ctx.views, skipped = fold_operand_views(g, list(attention.values()))
    backward_views, backward_skipped = fold_backward_views(g, backward.values())
    ctx.views |= backward_views
    skipped |= backward_skipped
    generated = {first: {v for v, _ in ap.generated} for first, ap in attention.items()}
    generated |= {
        first: {v for v, _ in bp.recompute.generated}
        for first, bp in backward.items()
        if bp.recompute is not None
    }
    unneeded = _made_on_chip(g, generated, skipped)
    ctx.row_slices = rows_read_in_place(g)
    ctx.col_slices = cols_read_in_place(g)
    ctx.merged_heads = merged_heads(g)
    skipped = skipped | {v.id for merge in ctx.merged_heads.values() for v in merge.nodes}

    def on_dma(n) -> bool:
        return transpose_layout(g, n, target) == "dma"

    ctx.concat_sources, copied = concat_sources(g, on_dma)
    skipped |= copied
    in_matmuls = {*ctx.row_slices, *ctx.col_slices}
    ctx.copy_sources, copied = copy_sources(g, on_dma, in_matmuls, skipped)
    skipped |= copied
    i = 0
    while i < len(nodes):
        n = nodes[i]
        if n.out.id in skipped or n.out.id in ctx.row_slices or n.out.id in ctx.col_slices:
            # read in place by its readers
            i += 1
            continue
        ids = start.get(n.out.id)
        if n.out.id in unneeded:  # Note [generated masks]
            i += len(ids or (n,))
            continue
        if ids is not None:
            group = nodes[i : i + len(ids)]
            ap, bp = attention.get(n.out.id), backward.get(n.out.id)
            kind = "attention" if ap else "attention_backward" if bp else "fused"

            def emit_group(ap=ap, bp=bp, group=group, n=n) -> None:
                if ap is not None:
                    emit_attention(ctx, ap)  # Note [attention kernel]
                elif bp is not None:
                    emit_attention_backward(ctx, bp)  # Note [attention backward]
                elif n.op is Op.MATMUL:
                    emit_matmul.emit_matmul(ctx, n, group[1:])  # Note [matmul epilogue]
                else:
                    emit_fused(ctx, group)

            emit_once(ctx, f"{kind}.{n.out.id}-{group[-1].out.id}", group, emit_group)
            i += len(group)
            continue

        def emit_node(n=n) -> None:
            try:
                EMITTERS[n.op](ctx, n)
            except CodegenError as e:
                raise type(e)(f"emitting {format_node(n)}: {e}") from None

        emit_once(ctx, f"{n.op.value}.{n.out.id}", [n], emit_node)
        i += 1
    inputs = [ctx.loc[v.id] for v in g.inputs]
    outputs = [ctx.loc[v.id] for v in g.outputs]
    return ctx.b.finish(inputs, outputs)


def _made_on_chip(g: Graph, generated: dict[int, set[int]], skipped: set[int]) -> set[int]:
    """Note [generated masks]: the nodes of kernels (fused groups or single nodes) whose values
    are read only by attention kernels that make them on chip (`generated`: a kernel's first
    node -> the values it makes), or by other such kernels: they are not emitted. Kernels read
    in place (`skipped`) are not among them."""
    outputs, users = {v.id for v in g.outputs}, g.users()
    units = [tuple(ids) for ids in g.kernels]
    grouped = {vid for ids in units for vid in ids}
    units += [(n.out.id,) for n in g.nodes if n.out.id not in grouped]
    unit_of = {vid: u for u, ids in enumerate(units) for vid in ids}
    made_by: dict[int, set[int]] = {}  # node of an attention kernel -> what it makes itself
    for first, made in generated.items():
        for vid in units[unit_of[first]]:
            made_by[vid] = made
    dead: set[int] = set()

    def unread(vid: int, u: int) -> bool:
        return vid not in outputs and all(
            unit_of[r.out.id] in dead or unit_of[r.out.id] == u or vid in made_by.get(r.out.id, ())
            for r in users[vid]
        )

    grown = True
    while grown:
        new = {
            u
            for u, ids in enumerate(units)
            if u not in dead and not skipped & set(ids) and all(unread(v, u) for v in ids)
        }
        dead |= new
        grown = bool(new)
    return {vid for u in dead for vid in units[u]}
