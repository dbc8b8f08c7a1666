"""The decomposition table handed to AOTAutograd: core ATen, plus rules for ops whose PyTorch
form has no decomposition but a plain mathematical one.

Decompositions run at trace time and only build the graph: what they call is recorded as ATen
nodes, lowered and compiled like everything else.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import core_aten_decompositions
from torch._decomp import decomposition_table as decomposition_table_torch

from neuroncc.frontend import fx_import  # noqa: F401  (fills LOWERINGS)
from neuroncc.frontend.decomp_attention import ATTENTION_DECOMPOSITIONS
from neuroncc.frontend.decomp_conv import convolution_backward, convolution_transposed
from neuroncc.frontend.decomp_linalg import LINALG_DECOMPOSITIONS
from neuroncc.frontend.decomp_optim import OPTIMIZER_DECOMPOSITIONS
from neuroncc.frontend.decomp_special import SPECIAL_DECOMPOSITIONS
from neuroncc.frontend.decomp_transformer import TRANSFORMER_DECOMPOSITIONS
from neuroncc.frontend.registry import LOWERINGS

aten = torch.ops.aten


def _pool_geometry(x, kernel, stride, padding):
    k = len(kernel)
    stride = list(stride) or list(kernel)
    padding = list(padding) * k if len(padding) == 1 else list(padding)
    kernel = list(kernel) * k if len(kernel) == 1 else list(kernel)
    return kernel, (stride * k if len(stride) == 1 else stride), padding


def _avg_pool_divisor(
    x, kernel, stride, padding, count_include_pad, divisor_override, out_sp, extra
):
    """Per output position: what avg_pool divides by (torch's rules for padding: with
    count_include_pad the padding counts, what ceil_mode reaches past it never does)."""
    if divisor_override:
        return divisor_override
    ones = torch.ones(x.shape[-len(kernel) :], dtype=x.dtype, device=x.device)
    pad = float(bool(count_include_pad))
    ones = torch.nn.functional.pad(ones, [p for q in reversed(padding) for p in (q, q)], value=pad)
    ones = torch.nn.functional.pad(ones, [v for e in reversed(extra) for v in (0, e)])
    win = _windows(ones.contiguous(), out_sp, kernel, stride)
    return win.sum(list(range(len(kernel), 2 * len(kernel))))


def _windows(t, out_sp, kernel, stride):
    """[*out, *kernel] windows over the trailing len(kernel) axes of a contiguous t."""
    k = len(kernel)
    lead = t.shape[: t.dim() - k]
    st = t.stride()
    return t.as_strided(
        (*lead, *out_sp, *kernel),
        (
            *st[: t.dim() - k],
            *(stride[d] * st[t.dim() - k + d] for d in range(k)),
            *st[t.dim() - k :],
        ),
    )


def _avg_pool2d(
    x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """Average pooling as window sums over a strided view of the padded input (with
    `ceil_mode`, zeros past the right edge for the last, partial windows)."""
    padding = [padding] if isinstance(padding, int) else padding
    kernel, stride, padding = _pool_geometry(x, kernel, stride, padding)
    k = len(kernel)
    sizes = list(x.shape[-k:])
    out_sp = _pool_out_sizes(sizes, kernel, stride, padding, ceil_mode)
    extra = _ceil_extra(sizes, kernel, stride, padding, out_sp)
    xp = torch.nn.functional.pad(x, _pad_list(padding, extra)).contiguous()
    sums = _windows(xp, out_sp, kernel, stride).sum(list(range(x.dim(), x.dim() + k)))
    return sums / _avg_pool_divisor(
        x, kernel, stride, padding, count_include_pad, divisor_override, out_sp, extra
    )


def _pool_out_sizes(sizes, kernel, stride, padding, ceil_mode) -> list[int]:
    """PyTorch's pooling output size: with ceil_mode a last, partial window counts if it
    starts inside the input or its left padding."""
    out = []
    for n, kk, s, p in zip(sizes, kernel, stride, padding, strict=True):
        span = n + 2 * p - kk
        o = (span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (o - 1) * s >= n + p:
            o -= 1
        out.append(o)
    return out


def _ceil_extra(sizes, kernel, stride, padding, out_sp) -> list[int]:
    """Per axis: how far ceil_mode's last window reaches past the padded input."""
    return [
        max(0, (o - 1) * s + kk - (n + 2 * p))
        for n, kk, s, p, o in zip(sizes, kernel, stride, padding, out_sp, strict=True)
    ]


def _pad_list(padding, extra) -> list[int]:
    """F.pad's list (last axis first): `padding` both sides, then `extra` on the right."""
    return [v for q, e in zip(reversed(padding), reversed(extra), strict=True) for v in (q, q + e)]


def _avg_pool2d_backward(
    grad_out, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    """Each output's gradient, divided by its divisor, added back into every position of its
    window (index_add over the window positions of the padded input), then cropped."""
    kernel, stride, padding = _pool_geometry(x, kernel, stride, padding)
    k = len(kernel)
    out_sp = list(grad_out.shape[-k:])
    extra = _ceil_extra(list(x.shape[-k:]), kernel, stride, padding, out_sp)
    padded = [x.shape[-k + d] + 2 * padding[d] + extra[d] for d in range(k)]
    lead = list(x.shape[: x.dim() - k])
    g = grad_out / _avg_pool_divisor(
        x, kernel, stride, padding, count_include_pad, divisor_override, out_sp, extra
    )
    positions = _windows(
        torch.arange(math.prod(padded), device=x.device).view(padded), out_sp, kernel, stride
    )
    per_image = torch.zeros(math.prod(lead), math.prod(padded), dtype=x.dtype, device=x.device)
    spread = g.reshape(math.prod(lead), *out_sp, *([1] * k)).expand(
        math.prod(lead), *out_sp, *kernel
    )
    per_image = per_image.index_add(1, positions.reshape(-1), spread.reshape(math.prod(lead), -1))
    grad_xp = per_image.view(*lead, *padded)
    crop = [slice(None)] * len(lead) + [
        slice(p, p + x.shape[-k + d]) for d, p in enumerate(padding)
    ]
    return grad_xp[tuple(crop)]


def _adaptive_bounds(out_size: int, in_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[out] first and one-past-last input index of each of adaptive pooling's windows."""
    o = torch.arange(out_size, device=device)
    starts = torch.div(o * in_size, out_size, rounding_mode="floor")
    ends = torch.div((o + 1) * in_size + out_size - 1, out_size, rounding_mode="floor")
    return starts, ends


def _adaptive_matrix(out_size: int, in_size: int, like):
    """P[o, i] = 1/len(window o) where i lies in adaptive pooling's window o, else 0."""
    starts, ends = _adaptive_bounds(out_size, in_size, like.device)
    i = torch.arange(in_size, device=like.device)
    inside = (i[None, :] >= starts[:, None]) & (i[None, :] < ends[:, None])
    return inside.to(like.dtype) / (ends - starts)[:, None].to(like.dtype)


def _adaptive_windows(out_size: int, in_size: int, device) -> torch.Tensor:
    """[out, K] input indices of adaptive pooling's windows, K the longest window; shorter
    windows repeat their last index (which changes neither a max nor its argmax)."""
    starts, ends = _adaptive_bounds(out_size, in_size, device)
    longest = max(
        -(-(i + 1) * in_size // out_size) - i * in_size // out_size for i in range(out_size)
    )
    j = torch.arange(longest, device=device)
    return torch.minimum(starts[:, None] + j[None, :], ends[:, None] - 1)


def _adaptive_max_pool2d(x, output_size):
    """Adaptive max pooling whose windows differ in length (PyTorch's own decomposition
    covers only even windows): the windows gathered as [..., oh, ow, Kh*Kw], their max, and
    the flat index ih*W + iw of the first maximum."""
    h, w = x.shape[-2:]
    oh, ow = output_size
    if oh == 0 or ow == 0 or h == 0 or w == 0 or (h % oh == 0 and w % ow == 0):
        return decomposition_table_torch[aten.adaptive_max_pool2d.default](x, output_size)
    ih = _adaptive_windows(oh, h, x.device)  # [oh, Kh]
    iw = _adaptive_windows(ow, w, x.device)  # [ow, Kw]
    kh, kw = ih.shape[1], iw.shape[1]
    win = x[..., ih[:, None, :, None], iw[None, :, None, :]]  # [..., oh, ow, Kh, Kw]
    win = win.reshape(*x.shape[:-2], oh, ow, kh * kw)
    values, arg = win.max(-1)
    flat = (ih[:, None, :, None] * w + iw[None, :, None, :]).reshape(oh, ow, kh * kw)
    flat = flat.expand(*x.shape[:-2], oh, ow, kh * kw)
    return values, torch.gather(flat, -1, arg.unsqueeze(-1)).squeeze(-1)


def _adaptive_max_pool2d_backward(grad_out, x, indices):
    """Each output's gradient added at its maximum's flat index."""
    lead = x.shape[:-2]
    flat = torch.zeros(*lead, x.shape[-2] * x.shape[-1], dtype=grad_out.dtype, device=x.device)
    flat = flat.scatter_add(-1, indices.flatten(-2), grad_out.flatten(-2))
    return flat.view(x.shape)


def _adaptive_avg_pool2d_backward(grad_out, x):
    """Adaptive average pooling is P_h @ x @ P_w^T per image, so the gradient is
    P_h^T @ grad @ P_w: two matmuls on TensorE."""
    ph = _adaptive_matrix(grad_out.shape[-2], x.shape[-2], grad_out)
    pw = _adaptive_matrix(grad_out.shape[-1], x.shape[-1], grad_out)
    return ph.t() @ grad_out @ pw


def _replication_pad_backward(grad_out, x, padding):
    """Replication padding reads x at clamped indices, so its gradient adds each padded
    position back into the edge it copied: one index_add per padded axis, last axis first."""
    grad = grad_out
    for i in range(len(padding) // 2):
        d = x.dim() - 1 - i
        before, after, n = padding[2 * i], padding[2 * i + 1], x.shape[d]
        source = torch.arange(-before, n + after, device=x.device).clamp(0, n - 1)
        shape = list(grad.shape)
        shape[d] = n
        grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add(d, source, grad)
    return grad


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over sumdim of i1 * i2 * i3, each unsqueezed at its expand dims, as one einsum
    (which traces to matmuls) instead of the full broadcast product."""
    total = i1.dim() + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:total]

    def spec(expand):
        return "".join(c for d, c in enumerate(letters) if d not in expand)

    out = "".join(c for d, c in enumerate(letters) if d not in sumdim)
    eq = f"{spec(expand1)},{spec(expand2)},{spec(expand3)}->{out}"
    return torch.einsum(eq, i1, i2, i3)


def _searchsorted(seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    """The result of ATen's binary search, as a count: positions whose element is not >= the
    value (left) or not > it (right). One comparison per (value, element) pair."""
    if sorter is not None:
        seq = seq.gather(-1, sorter)
    right = right or side == "right"
    if seq.dim() == 1:
        row = seq.view(*([1] * values.dim()), -1)
    else:
        row = seq.unsqueeze(-2)
    v = values.unsqueeze(-1)
    before = ~(row > v) if right else ~(row >= v)
    return before.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _histc(x, bins=100, min=0, max=0):
    """histc: each element's bin (ATen's linear-interpolation formula, the right edge into the
    last bin), counted with a scatter_add; elements outside [min, max] and NaNs count nothing."""
    x = x.flatten()
    if x.numel() == 0:
        return torch.zeros(bins, dtype=x.dtype, device=x.device)
    lo = torch.full((), min, dtype=x.dtype, device=x.device)
    hi = torch.full((), max, dtype=x.dtype, device=x.device)
    if min == max:
        lo, hi = x.min(), x.max()
    same = lo == hi
    lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    pos = ((x - lo) * bins / (hi - lo)).to(torch.int64).clamp(0, bins - 1)
    counts = torch.zeros(bins, dtype=x.dtype, device=x.device)
    return counts.scatter_add(0, pos, inside.to(x.dtype))


def _nonzero_static(x, *, size, fill_value=-1):
    """The first `size` nonzero positions in row-major order, padded with fill_value: each
    nonzero element's rank (a cumulative sum) says which output row its coordinates go to;
    the rest are sent to a spare row that is dropped."""
    flat = x.flatten() != 0
    rank = torch.cumsum(flat.to(torch.int64), 0) - 1
    row = torch.where(flat & (rank < size), rank, size)
    i = torch.arange(flat.numel(), device=x.device)
    strides = [math.prod(x.shape[d + 1 :]) for d in range(x.dim())]
    if x.dim() == 0:
        coords = torch.zeros(flat.numel(), 0, dtype=torch.int64, device=x.device)
    else:
        coords = torch.stack([(i // st) % n for st, n in zip(strides, x.shape, strict=True)], -1)
    out = torch.full((size + 1, x.dim()), fill_value, dtype=torch.int64, device=x.device)
    return out.index_put((row,), coords)[:size]


def _masked_scatter(x, mask, source):
    """Masked positions take source's elements in order: the k-th masked position (its rank,
    a cumulative sum) reads source.flatten()[k]."""
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    m = mask.expand(shape).flatten()
    rank = (torch.cumsum(m.to(torch.int64), 0) - 1).clamp(min=0)
    taken = source.flatten()[rank.clamp(max=max(source.numel() - 1, 0))]
    return torch.where(m, taken, x.expand(shape).flatten()).view(shape)


def _masked_scatter_backward(grad, mask, sizes):
    """The source's gradient: masked positions' gradients sent back to the source element
    they read; unread source elements get zero."""
    n = math.prod(sizes)
    m = mask.expand(grad.shape).flatten()
    rank = torch.cumsum(m.to(torch.int64), 0) - 1
    target = torch.where(m & (rank < n), rank, n)
    out = torch.zeros(n + 1, dtype=grad.dtype, device=grad.device)
    return out.index_put((target,), grad.flatten(), accumulate=True)[:n].view(sizes)


# Ops neuroncc has no lowering for, rewritten by PyTorch's own (global, backend-neutral)
# decompositions into ops it lowers: pooling, as_strided_scatter, frexp, ...
_PYTORCH_EXTRAS = [
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_max_pool2d.default,
    aten.max_pool2d_with_indices.default,
    aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices.default,
    aten.as_strided_scatter.default,
    aten.as_strided_copy.default,
    aten.unbind_copy.int,
    aten.dist.default,
    aten.frexp.Tensor,
    aten.bucketize.Tensor,
    aten.aminmax.default,
    aten.im2col.default,
    aten.col2im.default,
    aten._batch_norm_with_update_functional.default,
    aten.batch_norm_backward.default,
    aten._native_batch_norm_legit.default,
]


def _select_scatter(x, src, dim, index):
    """x with x.select(dim, index) replaced by src, as a slice_scatter (a concat: Note
    [scatters into concats]); PyTorch's rule rewrites the whole of x through a where."""
    index = index + x.shape[dim] if index < 0 else index
    return aten.slice_scatter(x, src.unsqueeze(dim), dim, index, index + 1)


def decomposition_table() -> dict:
    table = dict(core_aten_decompositions())
    for op in _PYTORCH_EXTRAS:
        if op in decomposition_table_torch and op not in LOWERINGS:
            table[op] = decomposition_table_torch[op]
    table[aten.convolution.default] = convolution_transposed
    table[aten.convolution_backward.default] = convolution_backward
    table[aten.avg_pool2d.default] = _avg_pool2d
    table[aten.avg_pool2d_backward.default] = _avg_pool2d_backward
    table[aten._adaptive_avg_pool2d_backward.default] = _adaptive_avg_pool2d_backward
    table[aten.adaptive_max_pool2d.default] = _adaptive_max_pool2d
    table[aten.adaptive_max_pool2d_backward.default] = _adaptive_max_pool2d_backward
    for op in (
        aten.replication_pad1d_backward.default,
        aten.replication_pad2d_backward.default,
        aten.replication_pad3d_backward.default,
    ):
        table[op] = _replication_pad_backward
    table[aten._trilinear.default] = _trilinear
    table[aten.searchsorted.Tensor] = _searchsorted
    table[aten.histc.default] = _histc
    table[aten.nonzero_static.default] = _nonzero_static
    table[aten.masked_scatter.default] = _masked_scatter
    table[aten.masked_scatter_backward.default] = _masked_scatter_backward
    table[aten.select_scatter.default] = _select_scatter
    table.update(ATTENTION_DECOMPOSITIONS)
    table.update(SPECIAL_DECOMPOSITIONS)
    table.update(TRANSFORMER_DECOMPOSITIONS)
    table.update(OPTIMIZER_DECOMPOSITIONS)
    table.update(LINALG_DECOMPOSITIONS)
    return table


DECOMPOSITIONS = decomposition_table()
