"""Matmuls of a few rows against a transposed weight, as dot products on Vector/GpSimd.

`x @ W.T` with W [N, K] row-major (every nn.Linear) needs W^T on TensorE, K on partitions: a
transpose of all of W, on TensorE and through PSUM, for a product that, with one row of x (a
decode step), uses one column of the array. Here W stays as it is, its rows on partitions: for
each [128, K] block of W and each row of x (broadcast to all partitions by the DMA), one
multiply and one row sum give 128 outputs, out[m, n0 + p] = sum_k W[n0 + p, k] x[m, k]. W is
read once, in long contiguous rows; x is loaded once. The layout pass chooses this (layout=dot on
the transpose the matmuls read as their right operand) where the cost model prices it below
transposing W (gemv_ns); a fused epilogue then runs after, on the result in HBM.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence

from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.codegen.kernels.emit import EmitCtx, P, rect
from neuroncc.codegen.kernels.emit_fused import emit_fused
from neuroncc.codegen.kernels.engine_balance import EngineBalancer
from neuroncc.codegen.kernels.pe_transpose import PeTransposer
from neuroncc.ir.graph import Node
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType

X_BYTES = 32 * 1024  # per partition, for all of x broadcast (so it is loaded once)
CHUNK = 2048  # elements of K per multiply
W_PREFETCH_BYTES = 64 * 1024  # per partition, of W's blocks in flight


def gemv_foldable(
    n: Node, users: Sequence[Node], outputs: Container[int], producers: Mapping[int, Node]
) -> bool:
    """Whether the matmuls reading the TRANSPOSE n (W^T, W 2-D) as their right operand can
    read W as it is: n is read by nothing else, and each matmul's x fits X_BYTES broadcast and
    is not itself a transpose (which might be folded too)."""
    w = n.inputs[0].type
    if w.rank != 2 or tuple(n.attr("perm")) != (1, 0) or n.out.id in outputs or not users:
        return False
    if w.numel == 0:
        return False
    for u in users:
        if u.op is not Op.MATMUL or u.inputs[1].id != n.out.id or u.inputs[0].id == n.out.id:
            return False
        x = u.inputs[0]
        a = producers.get(x.id)
        if (a is not None and a.op is Op.TRANSPOSE) or not 0 < x.type.nbytes <= X_BYTES:
            return False
    return True


def gemv_ns(u: Node, t: Target) -> float:
    """The matmul u on Vector/GpSimd (emit_gemv): x broadcast to every partition first, then
    the multiplies shared by both engines and the row sums on VectorE, or W's DMA, whichever
    takes longer."""
    x = u.inputs[0].type
    k, nn, rows = x.shape[-1], u.out.type.shape[-1], x.numel // max(x.shape[-1], 1)
    cw = min(k, CHUNK)
    prod = isa.TileRef("sbuf", 0, P, 0, DType.F32, (cw,))
    w = isa.TileRef("sbuf", 0, P, 0, x.dtype, (cw,))
    mult = costs.instr_ns(isa.TensorTensor("dve", op="mul", dst=prod, a=w, b=w), t)
    mult_pool = costs.instr_ns(isa.TensorTensor("pool", op="mul", dst=prod, a=w, b=w), t)
    sums = costs.instr_ns(isa.TensorReduce("dve", op="sum", dst=prod.cols(0, 1), src=prod), t)
    steps = math.ceil(nn / P) * math.ceil(k / cw) * rows
    both = 1 / (1 / mult + 1 / mult_pool)  # a multiply's share when both engines take them
    weight = costs.dma_ns(nn * k * x.dtype.itemsize, cw * x.dtype.itemsize, t, t.dma_queues)
    x_rows = costs.dma_ns(rows * P * k * x.dtype.itemsize, k * x.dtype.itemsize, t, t.dma_queues)
    return x_rows + max(steps * (both + sums), weight)


def emit_gemv(ctx: EmitCtx, n: Node, w_buf: str, w_off: int, epilogue: Sequence[Node]) -> None:
    """out = x @ W^T for the matmul n whose right operand is W^T, with W [N, K] in `w_buf`
    from element w_off.
    W's blocks stream in up to W_PREFETCH_BYTES ahead of the multiplies. The results of up to
    128 / rows blocks gather in one tile, res[p, j rows + r] = out[r, n0 + j 128 + p], and
    leave transposed on TensorE, as rows of out (one DMA of 128-element runs, not a 4-byte
    descriptor per output)."""

    b = ctx.b
    x = n.inputs[0]
    k, nn = x.type.shape[-1], n.out.type.shape[-1]
    rows = x.type.numel // max(k, 1)
    dt, odt = x.type.dtype, n.out.type.dtype
    out = ctx.alloc(n.out)
    cw = min(k, CHUNK)
    chunks = [(c0, min(cw, k - c0)) for c0 in range(0, k, cw)]
    x_pool = b.sbuf_pool(k * dt.itemsize, bufs=max(rows, 1))
    w_pool = b.sbuf_pool(cw * dt.itemsize, bufs=max(4, W_PREFETCH_BYTES // (cw * dt.itemsize)))
    prod_pool = b.sbuf_pool(cw * 4, bufs=4)
    part_pool = b.sbuf_pool(4, bufs=2)
    on_pe = 0 < rows <= P
    group = P // rows if on_pe else 1
    res_pool = b.sbuf_pool(group * rows * 4, bufs=2)
    out_pool = b.sbuf_pool(max(P, rows) * odt.itemsize, bufs=2)
    transpose = PeTransposer(ctx, DType.F32) if on_pe else None
    balance = EngineBalancer(ctx.target)
    xs = []
    for r in range(rows):  # row r of x on every partition
        xt = x_pool.tile(P, (k,), dt)
        b.dma(xt, isa.DramRef(ctx.buf(x), r * k, dt, ((0, P), (1, k))))
        xs.append(xt)
    whole = [(n0, P) for n0 in range(0, nn - nn % P, P)]
    groups = [whole[i : i + group] for i in range(0, len(whole), group)]
    if nn % P:
        groups.append([(nn - nn % P, nn % P)])
    for members in groups:
        nt = members[0][1]
        res = res_pool.tile(nt, (len(members) * rows,), DType.F32)
        for j, (n0, _) in enumerate(members):
            for ci, (c0, w) in enumerate(chunks):
                wt = w_pool.tile(nt, (w,), dt)
                b.dma(wt, rect(w_buf, dt, w_off + n0 * k + c0, k, nt, w))
                for r, xt in enumerate(xs):
                    prod = prod_pool.tile(nt, (w,), DType.F32)
                    xr = xt.rows(nt).cols(c0, w)
                    b.emit(balance.place(isa.TensorTensor("dve", op="mul", dst=prod, a=wt, b=xr)))
                    acc = res.cols(j * rows + r, 1)
                    if ci == 0:
                        b.emit(isa.TensorReduce("dve", op="sum", dst=acc, src=prod))
                        continue
                    part = part_pool.tile(nt, (1,), DType.F32)
                    b.emit(isa.TensorReduce("dve", op="sum", dst=part, src=prod))
                    add = isa.TensorTensor("dve", op="add", dst=acc, a=acc, b=part)
                    b.emit(balance.place(add))
        n0, g = members[0][0], len(members)
        if transpose is not None:
            rows_out = out_pool.tile(g * rows, (nt,), odt)  # partition j rows + r
            transpose(rows_out, res)
            b.dma(isa.DramRef(out, n0, odt, ((P, g), (nn, rows), (1, nt))), rows_out)
            continue
        if odt != DType.F32:
            cast = out_pool.tile(nt, (rows,), odt)
            b.emit(balance.place(isa.TensorCopy("dve", dst=cast, src=res)))
            res = cast
        b.dma(isa.DramRef(out, n0, odt, ((1, nt), (nn, rows))), res)  # out[r, n0 + p] = res[p, r]
    if epilogue:  # laid out as the product's rows, as the fuse pass planned it (epilogue_plan)
        emit_fused(ctx, epilogue, (n.out.type.shape, 1))
