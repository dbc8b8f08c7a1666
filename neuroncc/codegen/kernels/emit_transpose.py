"""Transposes: left to the matmuls that read them (`layout=fold`: they load A^T as it is, or
make B = W^T on chip from W's rows), or on TensorE against an identity, in blocks of long
contiguous runs (`layout=pe`). The layout pass chooses (passes/layout.py)."""

from __future__ import annotations

import math
from collections.abc import Container, Sequence

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.kernels.emit import EmitCtx, P, rect
from neuroncc.codegen.kernels.emit_gemv import gemv_foldable
from neuroncc.codegen.kernels.pe_transpose import identity
from neuroncc.codegen.kernels.views import View
from neuroncc.errors import CodegenError
from neuroncc.ir.graph import Node, Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, TensorType, contiguous_strides

TRANSPOSE_RUN_BYTES = 2048  # contiguous bytes per partition row in a transpose's DMAs


def pe_transposable(x: TensorType, perm: tuple[int, ...]) -> bool:
    """Whether TRANSPOSE can run on TensorE (transpose_blocks): float data and a permutation
    that puts the input's last axis second-to-last (the last two axes swapped, or a head split
    [b, s, h, d] -> [b, h, d, s]), so each output matrix is the transpose of an input matrix
    with contiguous rows. Axes that stay side by side count as one ([b, h, w, c] -> [b, c, h,
    w] is [b, h w, c] -> [b, c, h w])."""
    shape, perm = _canonical(x.shape, perm)
    rank = len(shape)
    return x.dtype.is_float and rank >= 2 and perm[-2] == rank - 1 and perm[-1] != rank - 1


def foldable(n: Node, users: Sequence[Node], outputs: Container[int]) -> bool:
    """Whether a TRANSPOSE can be left to the matmuls that read it: it swaps the last two
    axes and only matmuls read it, as their left operand, which they need as A^T anyway, or
    (2-D, float) as a right operand W^T of 2-D matmuls, which transpose W on chip as they
    load it (emit_matmul)."""
    rank = n.out.type.rank
    last2 = tuple(n.attr("perm")) == (*range(rank - 2), rank - 1, rank - 2)
    if not last2 or not users or n.out.id in outputs:
        return False
    vid = n.out.id
    as_a = all(u.op is Op.MATMUL and u.inputs[0].id == vid != u.inputs[1].id for u in users)
    as_b = n.out.type.dtype.is_float and rank == 2
    as_b = as_b and all(
        u.op is Op.MATMUL and u.inputs[1].id == vid != u.inputs[0].id and u.out.type.rank == 2
        for u in users
    )
    return as_a or as_b


def emit_transpose_folded(ctx: EmitCtx, n: Node, layout: str) -> None:
    """layout=fold: no kernel; the matmuls that read n load A^T straight from n's input, or
    read W^T as W, transposed on chip. layout=dot: they run as dot products with W's rows
    (emit_gemv.py)."""
    users, outputs = ctx.users[n.out.id], ctx._output_ids
    if layout == "dot":
        if not gemv_foldable(n, users, outputs, ctx.graph.producers()):
            raise CodegenError(
                "layout=dot needs a 2-D transpose read only by matmuls of few rows, as their "
                "right operand"
            )
    elif not foldable(n, users, outputs):
        raise CodegenError(
            "layout=fold needs a last-two-axes transpose read only by matmuls, as their left "
            "operand or (2-D, float) their right one"
        )
    x, offset = n.inputs[0], None
    if x.id in ctx.row_slices:  # W is rows of a larger tensor, read where they are
        x, offset = ctx.row_slices[x.id]
    ctx.fold_transpose(n.out, ctx.buf(x), offset)


def emit_transpose_on_pe(ctx: EmitCtx, n: Node) -> None:
    """layout=pe: TRANSPOSE on TensorE, 128x128 pieces at a time (transpose_blocks)."""
    x = n.inputs[0]
    if not pe_transposable(x.type, tuple(n.attr("perm"))):
        raise CodegenError(
            "layout=pe needs float data and a permutation that puts the input's last axis "
            "second-to-last"
        )
    out = ctx.alloc(n.out)
    if n.out.type.numel:
        transpose_blocks(ctx, pe_source(x, tuple(n.attr("perm"))), out, x.type.dtype)


def pe_source(x: Value, perm: tuple[int, ...]) -> View:
    """The matrices of x whose transposes the output's matrices are, as a view of x: their
    rows are contiguous runs of x (pe_transposable)."""
    shape, perm = _canonical(x.type.shape, perm)
    xs = contiguous_strides(shape)
    *lead, r, c = (shape[p] for p in perm)
    strides = (*(xs[p] for p in perm[:-2]), xs[perm[-1]], 1)
    return View(x, 0, (*lead, c, r), strides)


def _canonical(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple, tuple]:
    """The same transpose without axes of size 1 and with each run of input axes that the
    permutation keeps side by side, in order, merged into one (neither changes where an element
    lies): [1, s, d] -> [d, 1, s] is a plain [s, d] -> [d, s], and [b, h, w, c] -> [b, c, h, w]
    is [b, h w, c] -> [b, c, h w]."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    new = {a: i for i, a in enumerate(keep)}
    shape, perm = tuple(shape[a] for a in keep), tuple(new[p] for p in perm if p in new)
    runs: list[list[int]] = []  # runs of input axes, in the output's order
    for p in perm:
        if runs and runs[-1][-1] + 1 == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    by_input = sorted(range(len(runs)), key=lambda i: runs[i][0])
    merged = tuple(math.prod(shape[a] for a in runs[i]) for i in by_input)
    position = {run: i for i, run in enumerate(by_input)}
    return merged, tuple(position[i] for i in range(len(runs)))


def transpose_blocks(ctx: EmitCtx, source: View, out: str, dt: DType) -> None:
    """out[b] = source[b].T for the [r, c] matrices of a view with contiguous rows, in
    blocks of [w, w] with w = RUN_BYTES of
    elements: w/128 row tiles [128, w] are loaded (w-element runs per partition, few DMA
    descriptors), each [128, 128] piece is transposed on TensorE into one PSUM bank per
    output row tile, copied out whole, and stored as [128, w] rows of the result. The blocks
    are an instruction loop (Note [instruction loops])."""
    b, t = ctx.b, ctx.target
    *lead, r, c = source.shape
    src, row_stride = ctx.buf(source.base), source.strides[-2]
    w = max(P, min(TRANSPOSE_RUN_BYTES // dt.itemsize, t.psum_bank_bytes // 4))
    per = w // P  # row tiles per block
    ident = identity(b, dt)
    src_pool = b.sbuf_pool(w * dt.itemsize, bufs=2 * per)
    dst_pool = b.sbuf_pool(w * dt.itemsize, bufs=2 * per)
    psum = b.psum_pool(bufs=4)
    engines = ("act", "dve")
    blocks = [
        (bi, r0, c0)
        for bi in range(math.prod(lead))
        for r0 in range(0, r, w)
        for c0 in range(0, c, w)
    ]

    # A block is fixed by its shape; its addresses are affine in the blocks of a period whose
    # forms repeat once a row of blocks, a matrix and every inner leading index are marked
    # where they start (the outermost index moves the matrix by one stride).
    def form(bi: int, r0: int, c0: int) -> tuple:
        inner = []
        for size in reversed(lead[1:]):
            bi, i = divmod(bi, size)
            inner.append(i)
        return min(w, r - r0), min(w, c - c0), r0 == 0, c0 == 0, tuple(inner)

    forms = [form(*block) for block in blocks]
    copies = [0]  # PSUM copies so far: they take turns on ScalarE and VectorE
    for k in b.loop(forms, lambda: copies[0] % 2, per * (per + 3)):
        bi, r0, c0 = blocks[k]
        off, out_off = source.batch_offset(bi), bi * r * c
        rows = [(r1, min(P, r - r1)) for r1 in range(r0, min(r, r0 + w), P)]
        cw = min(w, c - c0)
        tiles = []
        for r1, rp in rows:
            tile = src_pool.tile(rp, (cw,), dt)
            b.dma(tile, rect(src, dt, off + r1 * row_stride + c0, row_stride, rp, cw))
            tiles.append(tile)
        rw = sum(rp for _, rp in rows)
        for c1 in range(0, cw, P):
            cp = min(P, cw - c1)
            ps = psum.tile(cp, (rw,), DType.F32)
            for i, ((_, rp), tile) in enumerate(zip(rows, tiles, strict=True)):
                piece = tile.cols(c1, cp)
                eye = ident.rows(rp).cols(0, rp)
                dst = ps.cols(i * P, rp)
                b.emit(
                    isa.Matmul(
                        "pe",
                        dst=dst,
                        stationary=piece,
                        moving=eye,
                        accumulate=False,
                        transpose=True,
                    )
                )
            row_out = dst_pool.tile(cp, (rw,), dt)
            b.emit(isa.TensorCopy(engines[copies[0] % 2], dst=row_out, src=ps))
            copies[0] += 1
            b.dma(rect(out, dt, out_off + (c0 + c1) * r + r0, r, cp, rw), row_out)
