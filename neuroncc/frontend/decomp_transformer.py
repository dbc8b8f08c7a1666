"""PyTorch's fused transformer fast paths as the ops they are made of.

In eval mode without autograd, `nn.TransformerEncoderLayer` (and so `nn.TransformerEncoder`)
and `nn.MultiheadAttention` call one fused ATen op each, `_transformer_encoder_layer_fwd` and
`_native_multi_head_attention`, which have CPU and CUDA kernels but no decomposition: without
these rules the whole layer ran eagerly. Each is written here as its kernels compute it
(aten/src/ATen/native/transformers/transformer.cpp and attention.cpp): projections, scaled
dot-product attention with a masked softmax, layer norms, the feed-forward block, residuals.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _masked_softmax(scores, mask, mask_type):
    """softmax over the last axis with `mask` True where a key is left out (the fast path's
    convention; a float mask is added), broadcast by mask_type: 0 a [L, S] mask, 1 a [B, S]
    key-padding mask, 2 (or none given) a mask broadcastable to [B, H, L, S]. A row with
    every key left out is 0."""
    if mask is None:
        return torch.softmax(scores, -1)
    if mask.dim() == 2 and mask_type == 1:
        mask = mask[:, None, None, :]
    elif mask.dim() == 2:
        mask = mask[None, None]
    if mask.is_floating_point():
        scores = scores + mask
        mask = scores == float("-inf")
    else:
        scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, -1)
    return torch.where(mask.all(-1, keepdim=True), 0.0, probs).to(scores.dtype)


def _native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    """(attention output, its weights: averaged over heads, per head, or an empty tensor when
    not needed)."""
    b, length, _ = query.shape
    head = embed_dim // num_head
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)

    def heads(x, w, bias):  # [B, T, E] -> [B, H, T, D]
        return F.linear(x, w, bias).view(b, x.shape[1], num_head, head).transpose(1, 2)

    q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
    probs = _masked_softmax((q / math.sqrt(head)) @ k.transpose(-2, -1), mask, mask_type)
    context = (probs @ v).transpose(1, 2).reshape(b, length, embed_dim)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, query.new_empty(0)
    return out, probs.mean(1) if average_attn_weights else probs


def _transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    """Self-attention and the feed-forward block, each with its residual and layer norm, the
    norm before (norm_first) or after; the activation GELU (exact, as on the CPU) or ReLU."""

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    attended = _native_multi_head_attention(
        x,
        x,
        x,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        False,
        True,
        mask_type,
    )[0]
    x = attended + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    return norm(x, norm_weight_2, norm_bias_2) if not norm_first else x


TRANSFORMER_DECOMPOSITIONS = {
    aten._native_multi_head_attention.default: _native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: _transformer_encoder_layer_fwd,
}
