"""Lowering of convolution: a fixed number of IR ops whatever the group count.

Note [grouped convolution]: the padded input xp is read through strided views (Op.STRIDED),
so no window is gathered by a per-group or per-channel loop.
- Dense and grouped with cg > 1 input channels per group (im2col): the windows as one view
  [G, N*out, cg*kernel] and one MATMUL on TensorE, batched over the G groups (no batch axis
  when G = 1), against the weight as [G, cg*kernel, og].
- Depthwise (cg = 1, any channel multiplier m = O/C): shifted multiply-accumulates on VectorE.
  Per kernel tap, the window every output channel o reads (input channel o // m: a stride-0
  axis repeats it m times) is one view laid out [O, N*out], channels on rows; the tap's weights
  are an [O, 1] column, a per-row scalar. The taps' products and their sum come last and
  consecutive, so the fuse pass makes them one row kernel (Note [row space] in
  codegen/row_plan.py) whose row is one channel's N*out outputs. The sum is in fp32 whatever
  the dtype, as TensorE's would be.
The result is laid out [N, O, *out] by one transpose (a reshape when N = 1).
"""

from __future__ import annotations

import itertools
import math

import torch

from neuroncc.frontend.lower_tensor import lower_constant_pad, slice_axis
from neuroncc.frontend.registry import LowerCtx, register_lowering
from neuroncc.ir.graph import Value
from neuroncc.ir.ops import Op
from neuroncc.ir.types import DType, contiguous_strides

aten = torch.ops.aten


@register_lowering(aten.convolution.default)
def lower_convolution(
    ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups
):
    if transposed:
        raise ctx.unsupported("transposed convolution")
    k = x.type.rank - 2
    n, c, o = x.type.shape[0], x.type.shape[1], w.type.shape[0]
    kernel = list(w.type.shape[2:])
    pad = [p for q in reversed(padding) for p in (q, q)]
    xp = lower_constant_pad(ctx, x, pad, 0) if any(padding) else x
    spatial = list(xp.type.shape[2:])
    out_sp = [(spatial[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1 for d in range(k)]
    if c == groups and groups > 1:
        y = _depthwise(ctx, xp, w, bias, out_sp, stride, dilation)
        y = ctx.reshape(y, [o, n, *out_sp])  # [O, N, *out]
        return ctx.transpose(y, [1, 0, *range(2, k + 2)])
    y = _im2col(ctx, xp, w, groups, out_sp, stride, dilation)
    if bias is not None:
        shape = [1, o] + [1] * k
        bias = ctx.reshape(ctx.cast(bias, y.type.dtype), shape)
        y = ctx.op(Op.ADD, y, ctx.broadcast_to(bias, y.type.shape))
    return y


def _im2col(ctx: LowerCtx, xp: Value, w: Value, groups: int, out_sp, stride, dilation) -> Value:
    """[N, O, *out]: the windows [G, N*out, cg*kernel] (one strided view) times the weight
    [G, cg*kernel, og], one matmul batched over the groups (2-D when G = 1)."""
    k = len(out_sp)
    n, c = xp.type.shape[:2]
    o, kernel = w.type.shape[0], list(w.type.shape[2:])
    cg, og = c // groups, o // groups
    st = contiguous_strides(tuple(xp.type.shape))
    rows, width = n * math.prod(out_sp), cg * math.prod(kernel)
    batch = [groups] if groups > 1 else []
    cols = ctx.op(
        Op.STRIDED,
        xp,
        shape=[*batch, n, *out_sp, cg, *kernel],
        strides=[
            *([cg * st[1]] if batch else []),
            st[0],
            *(stride[d] * st[2 + d] for d in range(k)),
            st[1],
            *(dilation[d] * st[2 + d] for d in range(k)),
        ],
        offset=0,
    )
    cols = ctx.reshape(cols, [*batch, rows, width])
    wg = ctx.reshape(w, [*batch, og, width])
    y = ctx.op(Op.MATMUL, cols, ctx.transpose(wg, [*range(len(batch)), len(batch) + 1, len(batch)]))
    if not batch:
        y = ctx.reshape(y, [n, *out_sp, o])
        return ctx.transpose(y, [0, k + 1, *range(1, k + 1)])
    y = ctx.reshape(y, [groups, n, *out_sp, og])
    y = ctx.transpose(y, [1, 0, k + 2, *range(2, k + 2)])  # [N, G, og, *out]
    return ctx.reshape(y, [n, o, *out_sp])


# A depthwise kernel's row (Note [grouped convolution]): at most ROW_BUDGET / (2 * taps + 6)
# fp32 elements, so that every tap's window and the running sum fit SBUF two row steps deep
# (row_plan.sbuf_bytes: one buffer per loaded window per step) and the taps stay one kernel.
ROW_BUDGET = 32768


def _depthwise(ctx: LowerCtx, xp: Value, w: Value, bias, out_sp, stride, dilation) -> Value:
    """[O, N*out]: the sum over kernel taps of each tap's window times its weights, broadcast
    along the row (Note [grouped convolution]). Views and weights come first and the arithmetic
    last, so that it is one run for the fuse pass. Each channel's N*out outputs are `split` rows
    (a row kernel walks 128 rows at a time: few channels fill the partitions, long rows fit)."""
    k = len(out_sp)
    n, c = xp.type.shape[:2]
    o, kernel = w.type.shape[0], list(w.type.shape[2:])
    m, taps, count = o // c, math.prod(kernel), n * math.prod(out_sp)
    split = row_split(o, count, taps)
    rows, cols = o * split, count // split
    st = contiguous_strides(tuple(xp.type.shape))
    dtype, acc = xp.type.dtype, DType.F32 if xp.type.dtype.is_float else xp.type.dtype
    windows = []
    for tap in itertools.product(*(range(s) for s in kernel)):
        win = ctx.op(
            Op.STRIDED,
            xp,
            shape=[c, m, n, *out_sp],
            strides=[st[1], 0, st[0], *(stride[d] * st[2 + d] for d in range(k))],
            offset=sum(tap[d] * dilation[d] * st[2 + d] for d in range(k)),
        )
        windows.append(ctx.reshape(win, [rows, cols]))
    wt = ctx.transpose(ctx.reshape(ctx.cast(w, acc), [o, taps]), [1, 0])  # [taps, O]
    wt = ctx.broadcast_to(ctx.reshape(wt, [taps, o, 1]), [taps, o, split])
    weights = [ctx.reshape(slice_axis(ctx, wt, 0, t, t + 1, 1), [rows, 1]) for t in range(taps)]
    if bias is not None:
        bias = ctx.broadcast_to(ctx.reshape(ctx.cast(bias, acc), [o, 1]), [o, split])
        bias = ctx.reshape(bias, [rows, 1])
    y = None
    for win, wv in zip(windows, weights, strict=True):
        p = ctx.op(Op.MUL, ctx.cast(win, acc), ctx.broadcast_to(wv, [rows, cols]))
        y = p if y is None else ctx.op(Op.ADD, y, p)
    if bias is not None:
        y = ctx.op(Op.ADD, y, ctx.broadcast_to(bias, [rows, cols]))
    return ctx.reshape(ctx.cast(y, dtype), [o, count])


def row_split(channels: int, count: int, taps: int) -> int:
    """Into how many rows each channel's `count` outputs go: the fewest that fill 128
    partitions with rows short enough for one kernel, else the fewest short enough."""
    longest = max(1, ROW_BUDGET // (2 * taps + 6))
    fits = [d for d in range(1, count + 1) if count % d == 0 and count // d <= longest]
    if not fits:
        return count
    return next((d for d in fits if channels * d >= 128), fits[0])
