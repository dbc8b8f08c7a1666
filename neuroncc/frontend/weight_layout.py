"""Weights laid out once, when they are first used, instead of on every call.

Note [weight layout]: nn.Linear computes x @ Wᵀ from W [out, in] as PyTorch stores it. TensorE
contracts over partitions, so every call has to bring `in` onto partitions: W transposed on
chip as the matmuls load it, or by a kernel of its own, or (a decode step) dot products with W's
rows on VectorE (passes/layout.py). A parameter of an inference graph changes only when the
user changes it, and neuronx-cc lays weights out when a model loads. neuroncc does the same, at
opt_level 2:
- `take_transposed`: a static input of an inference graph (a parameter or buffer: AOTAutograd's
  static_input_indices) that is 2-D and read only through transposes becomes an input of type
  Wᵀ, and the transposes go: the matmuls read Wᵀ as it lies in HBM.
- `LaidOut` binds that input to Wᵀ made by a compiled transpose graph, run on the simulator like
  any graph (stats() counts it: its device time is the load-time cost). Wᵀ is kept, for every
  graph that takes it (`LAID_OUT`), and made again only when W's bytes change. They are
  compared on every call, since a write through `.data` does not bump the version counter and
  the version alone could serve a stale Wᵀ. Timing only, where the outputs are eager's, the
  version is all that is kept.
Training graphs are left alone: their weights change every step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from neuroncc.frontend.fx_import import ImportedGraph
from neuroncc.ir.graph import Graph, GraphBuilder, Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import TensorType
from neuroncc.runtime.executor import CompiledExecutable
from neuroncc.runtime.stats import STATS


def take_transposed(imported: ImportedGraph, static: Collection[int]) -> ImportedGraph:
    """imported with each static 2-D input that is read only through transposes taken as its
    transpose; its source becomes ("layout", argument index)."""
    g = imported.graph
    users, outputs = g.users(), {v.id for v in g.outputs}
    taken: dict[int, Value] = {}  # input id -> the same id as Wᵀ
    for v, (kind, arg) in zip(g.inputs, imported.input_sources, strict=True):
        readers = users[v.id]
        if kind != "arg" or arg not in static or v.type.rank != 2 or v.id in outputs:
            continue
        if readers and all(_reads_transposed(u, outputs) for u in readers):
            taken[v.id] = Value(v.id, readers[0].out.type)
    if not taken:
        return imported
    gone = {u.out.id: taken[vid] for vid in taken for u in users[vid]}

    def sub(x: Value) -> Value:
        return gone.get(x.id, x)

    nodes = [replace(n, inputs=tuple(map(sub, n.inputs))) for n in g.nodes if n.out.id not in gone]
    inputs = tuple(taken.get(v.id, v) for v in g.inputs)
    graph = Graph(g.name, inputs, tuple(nodes), tuple(map(sub, g.outputs)))
    sources = [
        ("layout", s) if v.id in taken else (kind, s)
        for v, (kind, s) in zip(g.inputs, imported.input_sources, strict=True)
    ]
    return ImportedGraph(graph, sources, imported.output_slots)


def _reads_transposed(node: Node, outputs: set[int]) -> bool:
    return node.op is Op.TRANSPOSE and node.attr("perm") == (1, 0) and node.out.id not in outputs


def transpose_graph(t: TensorType) -> Graph:
    """The load-time layout of a weight of type t: its transpose."""
    b = GraphBuilder("weight_layout")
    return b.build([b.op(Op.TRANSPOSE, b.input(t), perm=(1, 0))])


class LaidOutWeights:
    """Wᵀ made from each weight, shared by every graph that takes it (the shape variants of one
    model, the repeated blocks of another), kept least recently used first."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        # (layout graph key, W's address) -> (a copy of W, or its version when only timed;
        # Wᵀ, or None when only timed)
        self._items: OrderedDict[tuple[str, int], tuple[Any, torch.Tensor | None]] = OrderedDict()

    def get(
        self, key: str, w: torch.Tensor, transpose: CompiledExecutable, timing_only: bool
    ) -> torch.Tensor | None:
        """Wᵀ of w by the compiled `transpose` (None when timing only: timed, not run)."""
        slot = (key, w.data_ptr())
        kept = self._items.get(slot)
        if kept is not None and _unchanged(*kept, w, timing_only):
            self._items.move_to_end(slot)
            return kept[1]
        STATS.add("weight_layouts")
        if timing_only:
            transpose.record_timing_only()
            made = None
        else:
            (made,) = transpose.run([w])
        # Timing only, the outputs are eager's and only the layout's time is at stake, and a
        # copy of each weight would double the memory of a model too big to simulate.
        self._items[slot] = (w._version if timing_only else w.clone(), made)
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return made

    def clear(self) -> None:
        self._items.clear()


# The process's laid-out weights, like the graph cache (runtime/cache.py) shared by every
# torch.compile call.
LAID_OUT = LaidOutWeights()


class LaidOut:
    """Binds an input taken as Wᵀ (`take_transposed`) from the call's W, through LAID_OUT."""

    def __init__(self, arg: int, key: str, transpose: CompiledExecutable) -> None:
        self.arg, self.key, self.transpose = arg, key, transpose

    def __call__(self, args: Sequence[torch.Tensor], timing_only: bool = False):
        w = args[self.arg].detach()
        return LAID_OUT.get(self.key, w, self.transpose, timing_only)


def _unchanged(seen: Any, made: torch.Tensor | None, w: torch.Tensor, timing_only: bool) -> bool:
    """Is w what `seen` recorded (its bytes, or only its version when timing only), with Wᵀ
    made where the call needs it?"""
    if isinstance(seen, int):
        return timing_only and seen == w._version
    return (timing_only or made is not None) and _same_bytes(seen, w)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (so -0.0 differs from 0.0, and a NaN equals itself)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return np.array_equal(_words(a), _words(b))


def _words(t: torch.Tensor) -> np.ndarray:
    """t's bytes as 8-byte integers where they divide (compared 4x faster than torch.equal)."""
    raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
    return raw.view(np.int64) if raw.size % 8 == 0 else raw
