"""The decomposition table handed to AOTAutograd: core ATen, plus rules for ops whose PyTorch
form has no decomposition but a plain mathematical one.

Decompositions run at trace time and only build the graph: what they call is recorded as ATen
nodes, lowered and compiled like everything else.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten


def _flash_attention_cpu_backward(
    grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    """Gradients of p v with p = softmax(q k^T * scale + mask): the standard attention backward.

    The core-ATen decomposition of the forward returns the probabilities p in the logsumexp slot
    (same rank as q); the eager kernel returns a true logsumexp (one rank less). Both are handled.
    Dropout cannot be replayed, so that case keeps the ATen op."""
    if dropout_p:
        return NotImplemented
    dtype = q.dtype
    q, k, v, grad_out, out = (t.float() for t in (q, k, v, grad_out, out))
    # Grouped-query attention: each key/value head serves `groups` query heads.
    groups = q.shape[-3] // k.shape[-3]
    k, v = (_repeat_heads(t, groups) for t in (k, v))
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if logsumexp.dim() == q.dim():
        p = logsumexp.float()
    else:
        s = (q @ k.transpose(-2, -1)) * scale
        if is_causal:
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        p = torch.exp(s - logsumexp.unsqueeze(-1))
    grad_v = p.transpose(-2, -1) @ grad_out
    grad_p = grad_out @ v.transpose(-2, -1)
    grad_s = p * (grad_p - (grad_out * out).sum(-1, keepdim=True))
    grad_q = (grad_s @ k) * scale
    grad_k = (grad_s.transpose(-2, -1) @ q) * scale
    grad_k, grad_v = (_sum_heads(t, groups) for t in (grad_k, grad_v))
    return grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype)


def _repeat_heads(t, groups: int):
    if groups == 1:
        return t
    *batch, heads, n, e = t.shape
    return t.unsqueeze(-3).expand(*batch, heads, groups, n, e).reshape(*batch, heads * groups, n, e)


def _sum_heads(t, groups: int):
    if groups == 1:
        return t
    *batch, heads, n, e = t.shape
    return t.reshape(*batch, heads // groups, groups, n, e).sum(-3)


DECOMPOSITIONS = {
    **core_aten_decompositions(),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_attention_cpu_backward,
}
