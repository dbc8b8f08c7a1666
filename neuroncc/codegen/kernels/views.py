"""Strided views: a value that reshapes, transposes and slices make from another, read in place.

A kernel that can address its operand with strides does not need the reshape/transpose/slice
chain to be materialised in HBM first: `strided_view` walks back from a value through those
nodes to the value that owns a buffer and returns the affine map from the value's indices to
that buffer's elements. The attention kernel reads q, k and v this way straight out of the
fused QKV projection (attention_operands.fold_operand_views).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container
from dataclasses import dataclass

from neuroncc.ir.graph import Graph, Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

VIEW_OPS = (Op.RESHAPE, Op.TRANSPOSE, Op.SLICE)


@dataclass(frozen=True)
class View:
    """Element (i_0, .., i_r) of a value of `shape` is element offset + sum(i_k * strides_k) of
    `base`'s buffer."""

    base: Value
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def of(v: Value) -> View:
        """v read as it is: its own buffer, row-major."""
        return View(v, 0, v.type.shape, contiguous_strides(v.type.shape))

    def transposed(self) -> View:
        """The same elements with the last two axes swapped."""
        shape, strides = self.shape, self.strides
        return View(
            self.base,
            self.offset,
            (*shape[:-2], shape[-1], shape[-2]),
            (*strides[:-2], strides[-1], strides[-2]),
        )

    def batch_offset(self, bi: int) -> int:
        """Offset of matrix bi, counting the leading (all but the last two) axes row-major."""
        off = self.offset
        for size, stride in zip(
            reversed(self.shape[:-2]), reversed(self.strides[:-2]), strict=True
        ):
            bi, i = divmod(bi, size)
            off += i * stride
        return off


def strided_view(
    v: Value, producers: dict[int, Node], opaque: Container[int] = (), widened: bool = False
) -> tuple[View, list[int]]:
    """v as a view of the first value up its producer chain that is not a reshape, transpose
    or slice (or where a reshape cannot be expressed with strides, or in `opaque`: made
    inside a fused kernel, which decides what it stores), and the ids of the values walked
    through, v first. With `widened`, also through casts of bf16 to f32: the view's base is
    then bf16, each of its elements exactly the f32 value v holds."""
    node = producers.get(v.id)
    if node is None or v.type.numel == 0 or v.id in opaque:
        return View.of(v), []
    if widened and widens_bf16(node):
        inner, walked = strided_view(node.inputs[0], producers, opaque, widened)
        return inner, [v.id, *walked]
    if node.op not in VIEW_OPS:
        return View.of(v), []
    inner, walked = strided_view(node.inputs[0], producers, opaque, widened)
    view = _apply(node, inner)
    if view is None:
        return View.of(v), []
    return view, [v.id, *walked]


def widens_bf16(n: Node) -> bool:
    return (
        n.op is Op.CAST and n.inputs[0].type.dtype is DType.BF16 and n.out.type.dtype is DType.F32
    )


def _apply(n: Node, x: View) -> View | None:
    if n.op is Op.TRANSPOSE:
        perm = n.attr("perm")
        return View(x.base, x.offset, n.out.type.shape, tuple(x.strides[p] for p in perm))
    if n.op is Op.SLICE:
        starts, steps = n.attr("starts"), n.attr("steps")
        offset = x.offset + sum(s * st for s, st in zip(starts, x.strides, strict=True))
        strides = tuple(st * step for st, step in zip(x.strides, steps, strict=True))
        return View(x.base, offset, n.out.type.shape, strides)
    strides = reshape_strides(x.shape, x.strides, n.out.type.shape)
    return None if strides is None else View(x.base, x.offset, n.out.type.shape, strides)


def reshape_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Strides of `new` over the same elements in the same order, or None where that needs a
    copy (merged axes that are not contiguous with each other). NumPy's no-copy reshape."""
    old = [(s, st) for s, st in zip(shape, strides, strict=True) if s != 1]
    out = [0] * len(new)
    oi, ni = 0, 0
    while ni < len(new) and oi < len(old):
        if new[ni] == 1:
            ni += 1
            continue
        oj, nj = oi + 1, ni + 1
        o_size, n_size = old[oi][0], new[ni]
        while o_size != n_size:
            if n_size < o_size:
                n_size *= new[nj]
                nj += 1
            else:
                o_size *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):  # merged old axes must be one contiguous run
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        oi, ni = oj, nj
    if math.prod(new) != math.prod(shape):
        return None
    return tuple(out)


def rows_read_in_place(g: Graph) -> dict[int, tuple]:
    """Slices that take whole rows of a tensor (a run of W's output features, after simplify
    split a fused projection) and are read only as W by matmuls' folded W^T: not emitted; the
    matmuls read W's rows where they are (EmitCtx.view_offset). Slice id -> (the sliced value,
    the element the rows start at). Run after the layout pass (its `fold` choices)."""
    users, outputs, grouped = g.users(), {v.id for v in g.outputs}, g.kernel_of()
    found = {}
    for n in g.nodes:
        if n.op is not Op.SLICE or n.out.id in outputs or n.out.id in grouped:
            continue
        shape, starts, stops = n.inputs[0].type.shape, n.attr("starts"), n.attr("stops")
        rows_only = all(starts[d] == 0 and stops[d] == shape[d] for d in range(1, len(shape)))
        if not rows_only or set(n.attr("steps")) != {1} or not users[n.out.id]:
            continue
        if all(_read_as_folded_w(t, users, outputs, g) for t in users[n.out.id]):
            found[n.out.id] = (n.inputs[0], starts[0] * math.prod(shape[1:]))
    return found


def cols_read_in_place(g: Graph) -> dict[int, tuple[Value, int, int]]:
    """Slices that take a run of whole columns of a 2-D tensor (a weight taken as Wᵀ, Note
    [weight layout], that simplify split into one matmul per output slice) and are read only
    as B by 2-D matmuls: not emitted; the matmuls read B's rows where they lie, at the full
    tensor's row stride (EmitCtx.matrix_source). Slice id -> (the sliced value, the element
    the columns start at, the row stride)."""
    users, outputs, grouped = g.users(), {v.id for v in g.outputs}, g.kernel_of()
    found = {}
    for n in g.nodes:
        if (
            n.op is not Op.SLICE
            or n.out.type.rank != 2
            or n.out.id in outputs
            or n.out.id in grouped
        ):
            continue
        (rows, cols), starts, stops = n.inputs[0].type.shape, n.attr("starts"), n.attr("stops")
        if (starts[0], stops[0]) != (0, rows) or set(n.attr("steps")) != {1}:
            continue
        readers = users[n.out.id]
        if readers and all(_reads_as_b(u, n.out.id) for u in readers):
            found[n.out.id] = (n.inputs[0], starts[1], cols)
    return found


def _reads_as_b(u: Node, vid: int) -> bool:
    return u.op is Op.MATMUL and u.out.type.rank == 2 and u.inputs[1].id == vid != u.inputs[0].id


def _read_as_folded_w(t: Node, users: dict, outputs: set[int], g: Graph) -> bool:
    if t.op is not Op.TRANSPOSE or g.choice(t.out.id, "layout") not in ("fold", "dot"):
        return False
    return t.out.id not in outputs and all(
        u.op is Op.MATMUL and u.inputs[1].id == t.out.id != u.inputs[0].id for u in users[t.out.id]
    )


MERGED_HEADS_MAX_K_BYTES = 16 * 1024  # (so one M tile of A^T always fits SBUF: blocked path)


@dataclass(frozen=True)
class MergedHeads:
    """A = reshape(transpose(O, [0, 2, 1, 3]), [S, H * D]) for O [1, H, S, D]: attention's
    output with its heads merged, read by matmuls as their left operand straight from O
    (A[s, h * D + d] = O[h, s, d]), so the transpose is not a kernel of its own."""

    o: Value
    heads: int
    seq: int
    dim: int
    nodes: tuple[Value, ...]  # the transpose and the reshape, not emitted


def merged_heads(g: Graph) -> dict[int, MergedHeads]:
    """Matmul left operands read through a head merge (MergedHeads), by operand id."""
    users, producers, outputs = g.users(), g.producers(), {v.id for v in g.outputs}
    grouped = g.kernel_of()
    found = {}
    for r in g.nodes:
        t = producers.get(r.inputs[0].id) if r.op is Op.RESHAPE else None
        if t is None or t.op is not Op.TRANSPOSE or tuple(t.attr("perm")) != (0, 2, 1, 3):
            continue
        o = t.inputs[0]
        one, heads, seq, dim = o.type.shape
        readers = users[r.out.id]
        if one != 1 or r.out.type.shape != (seq, heads * dim) or 128 % dim or seq < 128:
            continue  # (a decode step's few rows: their matmuls take other schedules)
        if users[t.out.id] != [r] or {t.out.id, r.out.id} & (outputs | set(grouped)):
            continue
        if not readers or any(u.op is not Op.MATMUL or u.inputs[0].id != r.out.id for u in readers):
            continue
        if any(u.inputs[1].id == r.out.id for u in readers) or not o.type.dtype.is_float:
            continue
        if heads * dim * o.type.dtype.itemsize > MERGED_HEADS_MAX_K_BYTES:
            continue
        found[r.out.id] = MergedHeads(o, heads, seq, dim, (t.out, r.out))
    return found


@dataclass(frozen=True)
class ConcatSource:
    """A concat input copied from where its chain of views starts (concat_sources): the
    copy runs over `shape`, reading `view` and writing the concat's region with
    `dst_strides` (in the concat's elements, from the input's first element there)."""

    shape: tuple[int, ...]
    view: View
    dst_strides: tuple[int, ...]


def concat_sources(
    g: Graph, on_dma: Callable[[Node], bool]
) -> tuple[dict[tuple[int, int], ConcatSource], set[int]]:
    """Note [concat in place]: a concat's input that transposes, slices and reshapes make (a
    backward's dQ, dK and dV, each [heads, S, D] put back into [S, heads * D] for the QKV
    projection's gradients) is copied by the concat straight from the value the chain starts
    at, with the chain's strides: one copy where there was one per transpose or slice and
    then the concat's. Only transposes that would run as DMAs (`on_dma`) are taken in: one on
    TensorE stays, as a strided DMA would cost more. Returns (concat id, input position) -> its ConcatSource, and the ids of the
    chain nodes nothing else reads, which are not emitted."""
    producers, users = g.producers(), g.users()
    outputs, in_kernels = {v.id for v in g.outputs}, g.kernel_of()
    sources: dict[tuple[int, int], ConcatSource] = {}
    chains: set[int] = set()
    for n in g.nodes:
        if n.op is not Op.CONCAT or n.out.id in in_kernels:
            continue
        dst_strides = contiguous_strides(n.out.type.shape)
        for i, x in enumerate(n.inputs):
            y, peeled = x, []  # a reshape aliases its input: copy over the shape it reshapes
            while y.id in producers and producers[y.id].op is Op.RESHAPE:
                peeled.append(y.id)
                y = producers[y.id].inputs[0]
            view, chain = strided_view(y, producers, in_kernels)
            if not _saves_a_copy([producers[vid] for vid in chain], on_dma):
                continue
            strides = reshape_strides(x.type.shape, dst_strides, y.type.shape)
            if strides is None:
                continue
            sources[n.out.id, i] = ConcatSource(y.type.shape, view, strides)
            chains.update(peeled + chain)

    def in_place(u: Node, vid: int) -> bool:
        return u.op is Op.CONCAT and all(
            (u.out.id, i) in sources for i, x in enumerate(u.inputs) if x.id == vid
        )

    return sources, unread_chain_nodes(chains, outputs, users, in_place)


def copy_sources(
    g: Graph, on_dma: Callable[[Node], bool], exclude: Container[int], skipped: set[int]
) -> tuple[dict[int, View], set[int]]:
    """Note [copies in place]: a slice, or a transpose that runs as a DMA, of a value that
    other slices and transposes (and reshapes) make copies straight from where that chain
    starts, with the chain's strides: one copy where there was one per view. A training
    forward saves Q and K per head for its backward, each a slice of the QKV projection and
    then a head split: two copies of each become one. As in concat_sources, a chain through
    a transpose on TensorE is left alone; `exclude`: slices read in place by matmuls;
    `skipped`: nodes not emitted already (views other kernels read in place). Returns copy
    id -> the view it reads, and the ids of the chain nodes nothing else reads, which are
    not emitted."""
    producers, users = g.producers(), g.users()
    outputs, in_kernels = {v.id for v in g.outputs}, g.kernel_of()
    sources: dict[int, View] = {}
    chains: set[int] = set()
    for n in g.nodes:
        if n.out.id in in_kernels or n.out.id in exclude:
            continue
        if n.op is not Op.SLICE and not (n.op is Op.TRANSPOSE and on_dma(n)):
            continue
        view, chain = strided_view(n.out, producers, in_kernels)
        if not _saves_a_copy([producers[vid] for vid in chain[1:]], on_dma):
            continue
        sources[n.out.id] = view
        chains.update(chain[1:])

    def in_place(u: Node, vid: int) -> bool:
        return u.out.id in sources or u.out.id in skipped

    return sources, unread_chain_nodes(chains, outputs, users, in_place)


def _saves_a_copy(walked: list[Node], on_dma: Callable[[Node], bool]) -> bool:
    """Copying through the views `walked` saves a copy: one of them is a slice or transpose
    (a reshape aliases), and none is a transpose on TensorE (a strided DMA would cost more)."""
    return any(m.op is not Op.RESHAPE for m in walked) and not any(
        m.op is Op.TRANSPOSE and not on_dma(m) for m in walked
    )


def unread_chain_nodes(
    chains: set[int], outputs: set[int], users: dict, in_place: Callable[[Node, int], bool]
) -> set[int]:
    """The chain nodes not to emit: each is no output and everything that reads it is not
    emitted either or reads it in place (`in_place(reader, vid)`). Nodes shared with other
    readers stay (the views read through them)."""
    skipped: set[int] = set()

    def unread(vid: int) -> bool:
        return vid not in outputs and all(
            u.out.id in skipped or in_place(u, vid) for u in users[vid]
        )

    grown = True
    while grown:
        new = {vid for vid in chains - skipped if unread(vid)}
        skipped |= new
        grown = bool(new)
    return skipped
