"""Decompositions of convolution's gradients and of transposed convolution, in ATen ops that
lower_conv.py and the other lowerings compile (they run at trace time and only build the graph).

Dense convolutions take the im2col form: the weight's gradient is grad_out^T times the windows,
the input's is grad_out times the weight scattered back into the windows (index_add). Grouped
and depthwise convolutions take forms whose op count does not depend on the group count (Note
[grouped convolution] in lower_conv.py).
"""

from __future__ import annotations

import itertools
import math

import torch

from neuroncc.frontend.lower_conv import row_split


def _conv_windows(xp, n, out_sp, cg, kernel, stride, dilation, offset):
    """The [N, *out, Cg, *kernel] windows of a contiguous padded input, as a strided view."""
    st = xp.stride()
    k = len(kernel)
    return xp.as_strided(
        (n, *out_sp, cg, *kernel),
        (
            st[0],
            *(stride[d] * st[2 + d] for d in range(k)),
            st[1],
            *(dilation[d] * st[2 + d] for d in range(k)),
        ),
        offset,
    )


def convolution_backward(
    grad_out,
    x,
    w,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    """The gradients of im2col convolution: weight = grad_out^T @ windows; input = grad_out @ w
    scattered back into the windows (index_add) and cropped; bias = sum of grad_out."""
    if transposed:
        return _conv_transpose_backward(
            grad_out, x, w, stride, padding, dilation, groups, output_mask
        )
    if groups > 1:
        return _groupedconvolution_backward(
            grad_out, x, w, stride, padding, dilation, groups, output_mask
        )
    k = x.dim() - 2
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    kernel = list(w.shape[2:])
    pad = [p for q in reversed(padding) for p in (q, q)]
    xp = torch.nn.functional.pad(x, pad).contiguous()
    out_sp = list(grad_out.shape[2:])
    cg, og = c // groups, o // groups
    rows, width = n * math.prod(out_sp), cg * math.prod(kernel)
    positions = _conv_windows(
        torch.arange(xp.numel(), device=x.device).view(xp.shape),
        n,
        out_sp,
        cg,
        kernel,
        stride,
        dilation,
        0,
    )
    grad_w, grad_xp = [], torch.zeros(xp.numel(), dtype=x.dtype, device=x.device)
    for g in range(groups):
        go = grad_out[:, g * og : (g + 1) * og].movedim(1, -1).reshape(rows, og)
        if output_mask[1]:
            offset = g * cg * xp.stride(1)
            cols = _conv_windows(xp, n, out_sp, cg, kernel, stride, dilation, offset)
            grad_w.append((go.t() @ cols.reshape(rows, width)).reshape(og, cg, *kernel))
        wg = w[g * og : (g + 1) * og].reshape(og, width)
        idx = (positions + g * cg * xp.stride(1)).reshape(-1)
        grad_xp = grad_xp.index_add(0, idx, (go @ wg).reshape(-1))
    grad_xp = grad_xp.view(xp.shape)
    crop = [slice(None), slice(None)] + [
        slice(p, p + x.shape[2 + d]) for d, p in enumerate(padding)
    ]
    grad_x = grad_xp[tuple(crop)] if output_mask[0] else None
    grad_b = grad_out.sum([0, *range(2, k + 2)]) if output_mask[2] else None
    return grad_x, torch.cat(grad_w, 0) if output_mask[1] else None, grad_b


def _groupedconvolution_backward(grad_out, x, w, stride, padding, dilation, groups, mask):
    """Gradients of a grouped convolution in a number of ops that does not depend on the group
    count (Note [grouped convolution] in lower_conv.py): the input's is a convolution of the
    output gradient, the weight's a product of it with the input's windows."""
    k = x.dim() - 2
    grad_x = grad_w = grad_b = None
    if mask[0]:
        grad_x = _grouped_grad_input(grad_out, x, w, stride, padding, dilation, groups)
    if mask[1]:
        pad = [p for q in reversed(padding) for p in (q, q)]
        xp = torch.nn.functional.pad(x, pad).contiguous()
        grad_w = (_depthwise_grad_weight if x.shape[1] == groups else _grouped_grad_weight)(
            grad_out, xp, w, stride, dilation, groups
        )
    if mask[2]:
        grad_b = grad_out.sum([0, *range(2, k + 2)])
    return grad_x, grad_w, grad_b


def _grouped_grad_input(grad_out, x, w, stride, padding, dilation, groups):
    """The input gradient as a stride-1 convolution, of the same groups, of the output gradient
    (zeros between its elements where the stride skipped, padded so that every input position
    sees every tap) with the flipped kernel, each group's [og, cg] weight transposed. A
    depthwise conv with channel multiplier m > 1 takes m separate channels' sums instead (a
    depthwise conv and a sum), so it stays depthwise."""
    k = x.dim() - 2
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    cg, og = c // groups, o // groups
    g = grad_out
    for d in range(k):
        g = _spread(g, 2 + d, stride[d])
    pad = []
    for d in reversed(range(k)):
        before = dilation[d] * (w.shape[2 + d] - 1) - padding[d]
        pad += [before, x.shape[2 + d] + padding[d] - g.shape[2 + d]]
    g = torch.nn.functional.pad(g, pad)
    flipped = w.flip(list(range(2, k + 2)))
    ones = [1] * k
    if cg == 1:
        y = torch.convolution(g, flipped, None, ones, [0] * k, dilation, False, [0] * k, o)
        return y.reshape(n, c, og, *x.shape[2:]).sum(2) if og > 1 else y
    wt = flipped.reshape(groups, og, cg, *w.shape[2:]).transpose(1, 2)
    wt = wt.reshape(groups * cg, og, *w.shape[2:])
    return torch.convolution(g, wt, None, ones, [0] * k, dilation, False, [0] * k, groups)


def _spread(t, dim: int, s: int):
    """t with s - 1 zeros after each element along dim, but the last: a strided
    convolution's output gradient on the grid of the positions it was computed at."""
    if s == 1:
        return t
    length = t.shape[dim]
    t = t.unsqueeze(dim + 1)
    zeros = torch.zeros_like(t).expand(*t.shape[: dim + 1], s - 1, *t.shape[dim + 2 :])
    t = torch.cat([t, zeros], dim + 1)
    t = t.reshape(*t.shape[:dim], length * s, *t.shape[dim + 2 :])
    return t.narrow(dim, 0, (length - 1) * s + 1)


def _depthwise_grad_weight(grad_out, xp, w, stride, dilation, groups):
    """Per tap, the sum over the batch and the outputs of the tap's window times the output
    gradient, in fp32; laid out as the forward's (lower_conv._depthwise: channels on rows, each
    channel's outputs `split` rows), the windows first and the products last, so that they are
    one row kernel with the taps' row sums as its results."""
    k = xp.dim() - 2
    n, c, o = xp.shape[0], xp.shape[1], w.shape[0]
    kernel, out_sp = list(w.shape[2:]), list(grad_out.shape[2:])
    m, taps, count = o // c, math.prod(kernel), n * math.prod(out_sp)
    split = row_split(o, count, taps)
    rows, cols = o * split, count // split
    st = xp.stride()
    windows = [
        xp.as_strided(
            (c, m, n, *out_sp),
            (st[1], 0, st[0], *(stride[d] * st[2 + d] for d in range(k))),
            sum(tap[d] * dilation[d] * st[2 + d] for d in range(k)),
        ).reshape(rows, cols)
        for tap in itertools.product(*(range(s) for s in kernel))
    ]
    go = grad_out.transpose(0, 1).reshape(rows, cols).float()
    sums = torch.stack([(win.float() * go).sum(1) for win in windows], 1)  # [rows, taps]
    grad_w = sums.reshape(o, split, taps).sum(1) if split > 1 else sums
    return grad_w.reshape(o, 1, *kernel).to(w.dtype)


def _grouped_grad_weight(grad_out, xp, w, stride, dilation, groups):
    """The output gradient [G, og, N*out] times the windows [G, N*out, cg*kernel]: one matmul
    batched over the groups."""
    k = xp.dim() - 2
    n, c, o = xp.shape[0], xp.shape[1], w.shape[0]
    kernel, out_sp = list(w.shape[2:]), list(grad_out.shape[2:])
    cg, og = c // groups, o // groups
    st = xp.stride()
    cols = xp.as_strided(
        (groups, n, *out_sp, cg, *kernel),
        (
            cg * st[1],
            st[0],
            *(stride[d] * st[2 + d] for d in range(k)),
            st[1],
            *(dilation[d] * st[2 + d] for d in range(k)),
        ),
    ).reshape(groups, n * math.prod(out_sp), cg * math.prod(kernel))
    go = grad_out.reshape(n, groups, og, -1).permute(1, 2, 0, 3).reshape(groups, og, -1)
    return torch.bmm(go, cols).reshape(o, cg, *kernel)


def convolution_transposed(
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups
):
    """A transposed convolution is the input gradient of the ordinary convolution that maps
    its output back to its input (weight [C_in, C_out/groups, *k] read as [O, C/groups, *k]),
    so it is built by the same im2col scatter."""
    if not transposed:
        return NotImplemented
    k = x.dim() - 2
    out_sp = [
        (x.shape[2 + d] - 1) * stride[d]
        - 2 * padding[d]
        + dilation[d] * (w.shape[2 + d] - 1)
        + output_padding[d]
        + 1
        for d in range(k)
    ]
    like = torch.zeros(x.shape[0], w.shape[1] * groups, *out_sp, dtype=x.dtype, device=x.device)
    mask = [True, False, False]
    y = convolution_backward(
        x, like, w, None, stride, padding, dilation, False, None, groups, mask
    )[0]
    return y if bias is None else y + bias.view(-1, *([1] * k))


def _conv_transpose_backward(grad_out, x, w, stride, padding, dilation, groups, output_mask):
    """Gradients of y = conv_transpose(x, w): the input's is the ordinary convolution of
    grad_out with w; the weight's is that convolution's weight gradient with the roles of input
    (grad_out) and output gradient (x) exchanged."""
    k = x.dim() - 2
    grad_x = grad_w = grad_b = None
    if output_mask[0]:
        grad_x = torch.convolution(
            grad_out, w, None, stride, padding, dilation, False, [0] * k, groups
        )
        # An output_padding >= stride (allowed below the dilation) adds a trailing window.
        grad_x = grad_x[(slice(None), slice(None), *(slice(0, n) for n in x.shape[2:]))]
    if output_mask[1]:
        mask = [False, True, False]
        grad_w = convolution_backward(
            x, grad_out, w, None, stride, padding, dilation, False, None, groups, mask
        )[1]
    if output_mask[2]:
        grad_b = grad_out.sum([0, *range(2, k + 2)])
    return grad_x, grad_w, grad_b
