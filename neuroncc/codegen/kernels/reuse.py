"""Kernels built once: a kernel identical to one built before is placed by a call of its
block, without running its emitter again (Note [kernel reuse]).

Note [kernel reuse]: before a kernel is emitted, `kernel_key` describes everything its emitter
can see: its nodes (ops, attributes, types, the passes' choices), and every value they read or
make with what the emission context and the graph say of it (its producer, its readers, the
views read in place, the buffers it lives in, the HBM bytes it shares with the others), each
value numbered in the order the description meets it, so the 7th layer's kernel and the 8th's
describe alike. The first kernel of a key is emitted and remembered as a template: its blocks,
its parameters, what it allocated on chip and what its emission did to the context (buffers
allocated, aliases, folded transposes), all in that numbering. Every later kernel of the key
is replayed: the effects on the new values, then a call of each block with the new buffers
(Note [blocks and calls]), built from the end of SBUF the kernel gets (Note [mirrored
kernels]). What the emitters build thus grows with the distinct kernels of a model, not with
its depth, and a layer after the first costs its placement and its timing only.

The key is trusted: it is meant to hold all an emitter reads, and a key that missed something
would place a wrong kernel. The option `check_reuse` (on in the test suite, so every model the
tests compile checks its keys) emits each key's second kernel too and compares it with the
template, mirrored where it is built from the other end: a difference marks the key broken,
never replayed, and counts in stats()["kernel_key_mismatches"].

Note [mirrored kernels]: kernels alternate the end of SBUF and PSUM they allocate from (Note
[kernel placement]), so the same kernel in the next layer is often built from the other end.
Built there, it comes out the same but for where its tiles are: each allocation of the kernel
(the bytes of a pool, in the order the emitter asked for them) lands elsewhere, and every tile
inside it moves with it; tiles outside the kernel's allocations (the program's rings) stay.
Allocations are disjoint at either end, so the same tiles overlap and every dependency is the
same. The builder records a kernel's allocations (`ProgramBuilder.allocations`) and says where
the other end would put them (`mirrored`); `blocks.TileMoves` moves the tiles of the blocks and
the on-chip boxes of the footprint. A kernel whose allocations would not fit from the other end
(the ends align differently) is emitted there.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

from neuroncc.codegen.executable.blocks import Footprint, TileMoves, Unmovable
from neuroncc.codegen.executable.builder import Allocations, Part
from neuroncc.ir.graph import Node, Value, constant_form
from neuroncc.runtime.stats import STATS

# The emission context's tables of value facts, read by the emitters (emit.EmitCtx).
FACTS = (
    "transposed_view",
    "view_offset",
    "row_slices",
    "col_slices",
    "merged_heads",
    "views",
    "concat_sources",
    "copy_sources",
)


@dataclass
class Template:
    """A kernel as first built, in its key's numbering of values."""

    parts: tuple[Part, ...]  # its calls (one per iteration of its loops), buffers canonical
    footprint: Footprint  # ... its first and last touches, buffers canonical
    effects: tuple  # what the emission did to the context, canonical, in order
    queues: int  # DMA queues it dealt out
    stream_end: tuple  # where the weight stream stood after it (Note [weight stream])
    allocs: Allocations  # what it allocated on chip (Note [mirrored kernels])


@dataclass
class Known:
    """What the kernels of one key came out as: a template per end of SBUF they were built
    from (Note [kernel placement]), and with `check_reuse`, whether the key is checked or
    broken."""

    templates: dict[bool, Template]
    checked: bool = False  # a second kernel of the key came out as the first
    broken: bool = False  # ... or did not: never replayed


class _Numbering:
    """Values numbered in the order a description meets them."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.values: list[Value] = []
        self.todo: list[Value] = []

    def __call__(self, v: Value) -> int:
        k = self.index.get(v.id)
        if k is None:
            k = self.index[v.id] = len(self.values)
            self.values.append(v)
            self.todo.append(v)
        return k


class Unkeyable(Exception):
    """A kernel whose emission reaches outside what its key describes: emitted each time."""


def kernel_key(ctx, nodes: list[Node]) -> tuple[tuple, list[Value]]:
    """The description of a kernel (Note [kernel reuse]) and its values in its numbering."""
    g = ctx.graph
    num = _Numbering()
    by_id = ctx.buffer_values
    group = {n.out.id for n in nodes}
    parts: list = [ctx.b.target.name, ctx.stream_state()]
    for n in nodes:
        num(n.out)
    for n in nodes:
        parts.append((n.op.value, n.attrs, tuple(num(v) for v in n.inputs)))
    while num.todo:
        v = num.todo.pop(0)
        producer = ctx.producers.get(v.id)
        readers = ctx.users.get(v.id, [])
        parts.append(
            (
                num.index[v.id],
                v.type,
                ctx.input_index.get(v.id, -1) >= 0,
                # (a graph output: whether it escapes, for the kernel's own values; where the
                # kernel only reads it, none of its emitters looks, and a value a layer's
                # kernel reads may be an output in one layer and not the next: Qwen3's
                # backward)
                v.id in ctx._output_ids if v.id in group else None,
                None if producer is None or v.id in group else (producer.op.value, producer.attrs),
                tuple(sorted((u.op.value, u.out.id in group) for u in readers)),
                tuple((k, x) for k, x in ctx.choices.get(v.id, ()) if k != "hbm"),
                tuple(_canon(getattr(ctx, f).get(v.id), num, by_id) for f in FACTS),
                _canon(ctx.loc.get(v.id), num, by_id),
                # planners read constants through (the dead keys of an attention kernel:
                # Note [dead keys]): kernels reading different masks must not share a key
                None if v.id in group else constant_form(v, ctx.producers, ctx.constant_forms),
            )
        )
        if len(num.values) > MAX_VALUES:
            raise Unkeyable(f"its description reaches more than {MAX_VALUES} values")
    parts.append(_shared_bytes(g, num.values))
    return tuple(parts), num.values


MAX_VALUES = 256  # a key meeting more values is not worth its cost: the kernel is emitted


def _shared_bytes(g, values: list[Value]) -> tuple:
    """Pairs of the kernel's values the plan pass placed on shared HBM bytes, with their
    offset from each other: the block's waits inside depend on it."""
    placed = [(k, g.choice(v.id, "hbm"), v.type.nbytes) for k, v in enumerate(values)]
    placed = [(k, at, n) for k, at, n in placed if at is not None]
    return tuple(
        (a, b, at_b - at_a)
        for i, (a, at_a, n_a) in enumerate(placed)
        for b, at_b, n_b in placed[i + 1 :]
        if at_a < at_b + n_b and at_b < at_a + n_a
    )


def _canon(obj, num: _Numbering, by_id: dict[str, Value]):
    """obj with every value, node and buffer name in it replaced by its number."""
    if obj is None or isinstance(obj, (bool, int, float, enum.Enum)):
        return obj
    if isinstance(obj, str):
        return _buffer(obj, num, by_id)
    if isinstance(obj, Value):
        return ("value", num(obj))
    if isinstance(obj, Node):
        return ("node", num(obj.out))
    if dataclasses.is_dataclass(obj):
        return (
            type(obj).__name__,
            *(_canon(getattr(obj, f.name), num, by_id) for f in dataclasses.fields(obj)),
        )
    if isinstance(obj, (tuple, list)):
        return tuple(_canon(x, num, by_id) for x in obj)
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, (_canon(x, num, by_id) for x in obj)))))
    if isinstance(obj, dict):
        return (
            "dict",
            tuple(
                sorted((repr(_canon(k, num, by_id)), _canon(x, num, by_id)) for k, x in obj.items())
            ),
        )
    raise Unkeyable(f"it reads a {type(obj).__name__}")


def _buffer(name: str, num: _Numbering, by_id: dict[str, Value]):
    """A buffer name as the number of the value whose buffer it is."""
    v = by_id.get(name)
    if v is None:
        return ("name", name)  # not a value's (a constant pool, say): the same in every kernel
    return ("buffer", num(v))


def template_of(
    ctx, values: list[Value], journal: list, parts, footprint, queues, stream_end, allocs
):
    index = {v.id: k for k, v in enumerate(values)}
    num = _Fixed(index)
    return Template(
        tuple(
            dataclasses.replace(p, args=tuple(_canon(a, num, ctx.buffer_values) for a in p.args))
            for p in parts
        ),
        dataclasses.replace(
            footprint, buffers=tuple(_canon(a, num, ctx.buffer_values) for a in footprint.buffers)
        ),
        tuple((e[0], *_canon(e[1:], num, ctx.buffer_values)) for e in journal),
        queues,
        stream_end,
        allocs,
    )


class _Fixed(_Numbering):
    """A numbering that cannot grow: what an emission touched must be in its key."""

    def __init__(self, index: dict[int, int]) -> None:
        super().__init__()
        self.index = index

    def __call__(self, v: Value) -> int:
        k = self.index.get(v.id)
        if k is None:
            raise Unkeyable(f"its emission touched {v}, which its key does not describe")
        return k


def emit_once(ctx, name: str, nodes: list[Node], emit: Callable[[], None]) -> None:
    """Emit a kernel, or place the block of the identical kernel built before (Note [kernel
    reuse]); with `ctx.check_reuse`, a key's second kernel is emitted and must come out as
    its first did (mirrored, where it is built from the other end: Note [mirrored kernels])."""
    try:
        key, values = kernel_key(ctx, nodes)
    except Unkeyable:
        key, values = None, []
    known = ctx.templates.get(key) if key is not None else None
    end = ctx.b.direction
    trusted = known is not None and not known.broken and (known.checked or not ctx.check_reuse)
    if trusted and ctx.reuse:
        template = _at_end(ctx, known, end)
        if template is not None:
            _replay(ctx, name, template, values)
            STATS.add("kernels_reused")
            return
    made = _emit_recorded(ctx, name, emit, values)
    STATS.add("kernels_emitted")
    if key is None or made is None:
        return
    if known is None:
        ctx.templates[key] = Known({end: made})
        return
    if known.broken:
        return
    expected = _at_end(ctx, known, end)
    if expected is None:  # the first cannot be mirrored to this end: this is its template
        known.templates[end] = made
    elif _same(expected, made):
        known.checked = True
    else:  # the key misses something the emitter read: never replay it
        known.broken = True
        STATS.add("kernel_key_mismatches")


def _at_end(ctx, known: Known, end: bool) -> Template | None:
    """The key's template for a kernel built from `end`: as built there, or mirrored from the
    other end (None if it cannot be)."""
    template = known.templates.get(end)
    if template is None:
        template = _mirrored(ctx, known.templates[not end])
        if template is not None:
            known.templates[end] = template
    return template


def _mirrored(ctx, t: Template) -> Template | None:
    """t as its kernel comes out built from the other end (Note [mirrored kernels]), its
    blocks added to the program; None where its allocations do not fit there."""
    b = ctx.b
    moves = b.mirrored(t.allocs)
    if moves is None:
        return None
    m = TileMoves(moves)
    blocks: dict[int, int] = {}  # t's block -> the mirrored block (a loop's calls share)
    try:
        for p in t.parts:
            if p.block not in blocks:
                blocks[p.block] = b.add_block(m.block(b.blocks[p.block]))
        footprint = dataclasses.replace(
            t.footprint,
            entries=tuple(map(m.touch, t.footprint.entries)),
            exits=tuple(map(m.touch, t.footprint.exits)),
        )
    except Unmovable:
        return None
    return dataclasses.replace(
        t,
        parts=tuple(dataclasses.replace(p, block=blocks[p.block]) for p in t.parts),
        footprint=footprint,
        allocs=dataclasses.replace(t.allocs, down=not t.allocs.down),
    )


def _same(a: Template, b: Template) -> bool:
    """a and b alike: the same blocks placed the same way, with the same effects."""
    return (a.parts, a.footprint, a.effects, a.queues, a.stream_end) == (
        b.parts,
        b.footprint,
        b.effects,
        b.queues,
        b.stream_end,
    )


def _emit_recorded(ctx, name, emit, values) -> Template | None:
    b = ctx.b
    ctx.journal, queue0, calls0 = [], b.queue_count, len(b.calls)
    try:
        with b.kernel(name):
            emit()
    finally:
        journal, ctx.journal = ctx.journal, None
    parts = b.parts_since(calls0, queue0)
    if not parts:
        return None
    queues, stream = b.queue_count - queue0, ctx.stream_state()
    try:
        allocs = b.allocations()
        return template_of(ctx, values, journal, parts, b.footprint, queues, stream, allocs)
    except Unkeyable:
        return None


def _replay(ctx, name: str, t: Template, values: list[Value]) -> None:
    for effect in t.effects:
        ctx.replay(effect, values)
    parts = [
        dataclasses.replace(p, args=tuple(ctx.buffer_of(a, values) for a in p.args))
        for p in t.parts
    ]
    buffers = tuple(ctx.buffer_of(a, values) for a in t.footprint.buffers)
    footprint = dataclasses.replace(t.footprint, buffers=buffers)
    ctx.b.replay_kernel(name, parts, t.queues, footprint)
    ctx.set_stream_state(t.stream_end)
