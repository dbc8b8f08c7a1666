"""layout: where each transpose happens, recorded as the node's `layout` choice.

TensorE contracts over partitions, so a matmul wants its left operand as A^T; Vector/Scalar
row kernels want rows on partitions. The lowering writes the transposes the math needs; this
pass decides, per TRANSPOSE, how codegen realises it:

- `fold`: no kernel at all. A last-two-axes transpose that only matmuls read as their left
  operand is what they need anyway: they load A^T from its input directly (emit_matmul). So
  are the transposes an attention kernel reads in place through strided views (Note
  [attention operands] in attention_operands.py), and an attention output's head merge that
  matmuls read as their left operand (views.MergedHeads). A weight's W^T read as the right
  operand of 2-D matmuls folds where transposing W on chip as each matmul loads it (once per
  M block) costs less than a transpose kernel, which also writes W^T to HBM and reads it
  back.
- `dot`: W^T read by matmuls of a few rows (a decode step's `x @ W.T`): their dot products
  with W's rows on Vector/GpSimd (emit_gemv.py), where that costs less than the above.
- `pe` or `dma`: a kernel of its own, whichever the cost model says is cheaper. On TensorE the
  data moves in 2 KiB runs and each 128 x 128 piece costs a matmul against the identity and a
  PSUM copy (transpose_blocks); as a DMA the data moves in runs as long as the permutation
  keeps contiguous, often one element (Note [dma efficiency] in costs.py).
The estimates price the instructions codegen would emit with the formulas the simulator uses.

VectorE has no transpose instruction in this ISA, so it is not a candidate. Without this pass
(opt_level < 2) codegen transposes on TensorE where it can, else by DMA, and folds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.costs import dma_ns, instr_ns
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.attention_backward import backward_plans, fold_backward_views
from neuroncc.codegen.kernels.attention_operands import fold_operand_views
from neuroncc.codegen.kernels.attention_planner import attention_plans
from neuroncc.codegen.kernels.emit import P
from neuroncc.codegen.kernels.emit_gemv import gemv_foldable, gemv_ns
from neuroncc.codegen.kernels.emit_matmul import Blocking, blocked_ns, largest_blocking
from neuroncc.codegen.kernels.emit_transpose import (
    TRANSPOSE_RUN_BYTES,
    foldable,
    pe_source,
    pe_transposable,
)
from neuroncc.codegen.kernels.views import merged_heads
from neuroncc.ir.graph import Graph, Node, with_choices
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Layout:
    name: ClassVar[str] = "layout"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        users = g.users()
        outputs = {v.id for v in g.outputs}
        in_kernel = g.kernel_of()
        read_in_place = _attention_operand_chains(g, ctx.target)
        for merge in merged_heads(g).values():
            read_in_place.update(merge.nodes)  # matmuls read attention's output as it is
        made: dict[int, str] = {}
        producers = g.producers()
        for n in g.nodes:
            if n.op is not Op.TRANSPOSE or n.out.id in in_kernel:
                continue
            if n.out.id in read_in_place:
                made[n.out.id] = "fold"
            else:
                made[n.out.id] = _layout(n, users[n.out.id], outputs, producers, ctx.target)
        return with_choices(g, "layout", made) if made else g


def _layout(n: Node, readers: list[Node], outputs: set[int], producers: dict, t: Target) -> str:
    """The cheapest way to realise the transpose n for its readers, by the cost model."""
    if n.out.type.numel == 0:
        return "dma"  # nothing to move
    perm = tuple(n.attr("perm"))
    kernel = {"dma": dma_transpose_ns(n, t)}  # as a kernel of its own
    if pe_transposable(n.inputs[0].type, perm):
        kernel["pe"] = pe_ns(n, t)
    way = min(kernel, key=kernel.__getitem__)
    if not foldable(n, readers, outputs) and not gemv_foldable(n, readers, outputs, producers):
        return way
    cost = kernel[way] + sum(_matmul_ns(u, t) for u in readers)
    if foldable(n, readers, outputs):
        if all(u.inputs[0].id == n.out.id for u in readers):
            return "fold"  # A^T is what the matmuls load anyway
        folded = sum(_matmul_ns(u, t, n) for u in readers)
        way, cost = ("fold", folded) if folded <= cost else (way, cost)
    if gemv_foldable(n, readers, outputs, producers):
        dot = sum(gemv_ns(u, t) for u in readers)
        way = "dot" if dot < cost else way
    return way


def _matmul_ns(u: Node, t: Target, folded: Node | None = None) -> float:
    """The matmul u as emit_matmul runs it at its largest blocking (emit_matmul.blocked_ns),
    B read as it is in HBM, or, with the transpose `folded` (B = W^T), made from W's rows on
    chip, which costs TensorE and the PSUM copies its pieces once per M block."""
    w_folded = folded is not None
    blocking = largest_blocking(u, [], False, t, b_transposed=w_folded) or Blocking(1, 1)
    if not w_folded:
        return blocked_ns(u, blocking, t, False, False)
    *batch, m, _ = u.inputs[0].type.shape
    blocks = math.prod(batch) * math.ceil(math.ceil(m / P) / blocking.tm)
    _, pieces, copies, _ = _pe_parts(folded, t)
    return max(blocked_ns(u, blocking, t, False, True, blocks * pieces), blocks * copies)


def _attention_operand_chains(g: Graph, t: Target) -> set[int]:
    """The nodes the attention kernels (and their backwards) read in place (they are not
    emitted)."""
    plans = [ap for ap in attention_plans(g, t).values() if ap is not None]
    chains = fold_operand_views(g, plans)[1] if plans else set()
    return chains | fold_backward_views(g, backward_plans(g, t).values())[1]


def pe_ns(n: Node, t: Target) -> float:
    """TensorE transpose as transpose_blocks emits it: building the identity, then the
    busiest of TensorE (a matmul per 128 x 128 piece), the two engines evacuating PSUM (a copy
    per [128, w] row of the result) and the DMA queues (w-element runs in and out), then the
    last copy."""
    setup, pieces, copies, moves = _pe_parts(n, t)
    return setup + max(pieces, copies, moves)


def _pe_parts(n: Node, t: Target) -> tuple[float, float, float, float]:
    """pe_ns's parts: the identity and the last copy, TensorE, the copies, the DMAs."""
    x = n.inputs[0]
    dt = x.type.dtype
    *lead, r, c = pe_source(x, tuple(n.attr("perm"))).shape
    w = max(P, min(TRANSPOSE_RUN_BYTES // dt.itemsize, t.psum_bank_bytes // 4))
    rp, cp = min(P, r), min(P, c)
    grid = isa.TileRef("sbuf", 0, P, 0, DType.F32, (P,))
    ident = isa.TileRef("sbuf", 0, P, 0, dt, (P,))
    setup = instr_ns(isa.Iota("pool", dst=grid, base=0.0, pstep=1.0, fstep=-1.0), t)
    setup += instr_ns(isa.TensorScalar("dve", op="eq", dst=ident, src=grid, scalar=0.0), t)
    piece = isa.TileRef("sbuf", 0, rp, 0, dt, (cp,))
    acc = isa.TileRef("psum", 0, cp, 0, DType.F32, (min(w, r),))
    eye = isa.TileRef("sbuf", 0, rp, 0, dt, (rp,))
    matmul = isa.Matmul(
        "pe", dst=acc, stationary=piece, moving=eye, accumulate=False, transpose=True
    )
    copy = instr_ns(isa.TensorCopy("dve", dst=replace(acc, mem="sbuf", dtype=dt), src=acc), t)
    mats, col_tiles = math.prod(lead), math.ceil(c / P)
    nbytes = x.type.nbytes
    moves = dma_ns(nbytes, min(c, w) * dt.itemsize, t, t.dma_queues)
    moves += dma_ns(nbytes, min(r, w) * dt.itemsize, t, t.dma_queues)
    pieces = mats * math.ceil(r / P) * col_tiles * instr_ns(matmul, t)
    copies = mats * math.ceil(r / w) * col_tiles * copy / 2
    return setup + copy, pieces, copies, moves


def dma_transpose_ns(n: Node, t: Target) -> float:
    """Strided DMA: the whole tensor read in runs of the elements the permutation keeps
    contiguous (the trailing axes it leaves in place)."""
    x = n.inputs[0].type
    perm, run = tuple(n.attr("perm")), 1
    for axis in reversed(range(x.rank)):
        if perm[axis] != axis:
            break
        run *= x.shape[axis]
    return dma_ns(x.nbytes, run * x.dtype.itemsize, t, t.dma_queues)
