"""Scaled dot-product attention as the graph neuroncc compiles: the forward and backward of
PyTorch's CPU flash-attention op, written with matmuls and a softmax the fuse pass makes
into the attention kernels (Note [attention kernel], Note [attention backward]).

Note [one attention op]: `F.scaled_dot_product_attention` picks its kernel by device when it
is traced: on CPU tensors the flash-attention op (whose backward is its own), on meta tensors
(timing_only estimates) and on the `neuron` device the math form, which AOTAutograd
differentiates op by op, saving P. The backend retargets the Dynamo graph's SDPA calls
(ATTENTION_CALLS) to the flash op wherever it computes the same thing (no dropout, 4-D), so
every device compiles one form.

Note [attention saves its logsumexp]: `_scaled_dot_product_flash_attention_for_cpu` returns
the output and the rows' logsumexp, and its backward recomputes the probabilities P from Q,
K and that logsumexp, as FlashAttention does. PyTorch's core-ATen decomposition of the
forward returns P in the logsumexp slot instead, so a training forward saved P for the
backward: [heads, queries, keys] per layer, 1 GiB at 32 heads and 4096 tokens in bf16, past
a NeuronCore's HBM after a dozen layers, where Trainium's flash-attention kernels keep the
logsumexp (one value per query row). Here the forward computes the op's own logsumexp and
the backward recomputes P from it: what the backward saves grows with the tokens, not with
their square.

Note [keys in chunks]: the forward attention kernel keeps a block's whole row of scores on
chip, which bounds its keys (2048 on trn2 and trn3 in training, 1024 on trn1: the SBUF per
partition). Past that, the forward takes the keys in chunks the kernel fits, each an attention
kernel of its own, and combines their outputs by their row maxima and sums (`_in_chunks`),
so the scores never go to HBM: 2 x [rows, D] of fp32 per chunk do, and a few row values.
The backward needs no chunks (Note [key blocks]). `key_chunk` is the target's
(`key_chunk_for`), passed in by the backend's per-target decomposition table.

Rows with every key masked: the forward gives 0, as PyTorch's safe softmax does, and their
logsumexp is +inf, so that the recomputed P, exp(s - lse), is 0 there too (eager's kernel
has -inf, which its own backward never meets in a form that matters).
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def flash_attention_cpu(
    query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None,
    key_chunk=None,
):  # fmt: skip
    """(output, logsumexp) of softmax(q kᵀ * scale + mask) v, computed in fp32 as PyTorch's
    math kernel computes it (the scale split between q and k, the mask added, a safe
    softmax), its output laid out as the flash kernel's (see PyTorch's decomposition). Past
    `key_chunk` keys, chunk by chunk (Note [keys in chunks])."""
    if dropout_p:
        return NotImplemented
    dtype = query.dtype
    q, k, v = (_widen(t) for t in (query, key, value))
    groups = q.shape[-3] // k.shape[-3]
    k, v = (_repeat_heads(t, groups) for t in (k, v))
    root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    mask = _additive_mask(q, k, is_causal, attn_mask)  # made first: the fuse pass groups
    if key_chunk is not None and k.shape[-2] > key_chunk:
        out, lse = _in_chunks(q * root, k * root, v, mask, key_chunk)
        return _flash_layout(out.to(dtype)), lse
    s = (q * root) @ (k.transpose(-2, -1) * root)  # what lies between the two matmuls
    if mask is not None:
        s = s + mask
    # the softmax's own max and sum (the same nodes, after CSE), and the logsumexp made
    # before P V: the fuse pass puts what lies between the matmuls in the attention kernel
    top = s.amax(-1, keepdim=True)
    total = torch.exp(s - top).sum(-1, keepdim=True)
    none = top == float("-inf")  # every key masked: P is 0 there (_safe_softmax)
    lse = torch.where(none, float("inf"), top + torch.log(total)).squeeze(-1)
    out = (aten._safe_softmax.default(s, -1) @ v).to(dtype)
    return _flash_layout(out), lse


def _flash_layout(out):
    """out with the flash kernel's strides ([L, N, H, E] in memory), as PyTorch's
    decomposition lays it out."""
    out = out.permute(2, 0, 1, 3).contiguous(memory_format=torch.contiguous_format)
    return out.permute(1, 2, 0, 3)


def _in_chunks(q, k, v, mask, chunk: int):
    """Note [keys in chunks]: attention over the keys `chunk` at a time, each chunk one
    attention kernel giving its rows' unnormalised output o_c = e_c v_c, their max m_c and
    their sum l_c (e_c = exp(s_c - m_c), with m_c taken as 0 where every key of the chunk is
    masked, so e_c, l_c and o_c are 0 there), combined as FlashAttention's split-KV
    combination: with M = max_c m_c, out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c
    and lse = M + log(sum_c exp(m_c - M) l_c). q and k carry the scale."""
    n = k.shape[-2]
    parts = []
    for c0 in range(0, n, chunk):
        kc, vc = k[..., c0 : c0 + chunk, :], v[..., c0 : c0 + chunk, :]
        mc = mask  # (made before the matmul); one broadcast over the keys stays as it is
        if mask is not None and mask.shape[-1] != 1:
            mc = mask[..., c0 : c0 + chunk]
        s = q @ kc.transpose(-2, -1)
        if mc is not None:
            s = s + mc
        top = s.amax(-1, keepdim=True)
        top = torch.where(top == float("-inf"), 0.0, top)
        e = torch.exp(s - top)
        parts.append((top, e.sum(-1, keepdim=True), e @ vc))
    best = parts[0][0]
    for top, _, _ in parts[1:]:
        best = torch.maximum(best, top)
    total = out = None
    for top, rows, o in parts:
        w = torch.exp(top - best)
        total = w * rows if total is None else total + w * rows
        out = w * o if out is None else out + w * o
    none = total == 0.0  # every key masked: 0, and a logsumexp of +inf (see above)
    out = torch.where(none, 0.0, out / total)
    lse = torch.where(none, float("inf"), best + torch.log(total)).squeeze(-1)
    return out, lse


def flash_attention_cpu_backward(
    grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    """Gradients of p v with p = softmax(q kᵀ * scale + mask) = exp(s - logsumexp): the
    standard attention backward, P recomputed (Note [attention saves its logsumexp]).

    A logsumexp of q's rank is P itself, as PyTorch's core-ATen decomposition of the
    forward returns it (a graph traced elsewhere): then it is used as it is. Dropout cannot
    be replayed, so that case keeps the ATen op."""
    if dropout_p:
        return NotImplemented
    dtype = q.dtype
    q, k, v, grad_out, out = (_widen(t) for t in (q, k, v, grad_out, out))
    groups = q.shape[-3] // k.shape[-3]
    k, v = (_repeat_heads(t, groups) for t in (k, v))
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if logsumexp.dim() == q.dim():
        p = logsumexp.float()
    else:
        p = _probabilities(q, k, scale, logsumexp.unsqueeze(-1), is_causal, attn_mask)
    grad_v = p.transpose(-2, -1) @ grad_out
    grad_p = grad_out @ v.transpose(-2, -1)
    grad_s = p * (grad_p - (grad_out * out).sum(-1, keepdim=True))
    grad_q = (grad_s @ k) * scale
    grad_k = (grad_s.transpose(-2, -1) @ q) * scale
    grad_k, grad_v = (_sum_heads(t, groups) for t in (grad_k, grad_v))
    return grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype)


def _probabilities(q, k, scale: float, lse, is_causal: bool, attn_mask):
    """P = exp(q kᵀ * scale + mask - lse). A boolean mask selects -inf where it is false
    after the logsumexp is taken off, so P is exactly 0 there whatever the logsumexp: what
    the backward kernel's dead-key analysis needs to skip those keys (Note [dead keys])."""
    attn_mask = _causal(q, k) if is_causal else attn_mask
    s = (q @ k.transpose(-2, -1)) * scale
    if attn_mask is None:
        return torch.exp(s - lse)
    if attn_mask.dtype == torch.bool:
        return torch.exp(torch.where(attn_mask, s - lse, float("-inf")))
    return torch.exp(s + attn_mask.to(q.dtype) - lse)


def _widen(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _additive_mask(q, k, is_causal: bool, attn_mask):
    """The mask as PyTorch's math kernel adds it: causal as a lower-triangular boolean, a
    boolean mask as 0 / -inf, a float mask as it is; None without one."""
    attn_mask = _causal(q, k) if is_causal else attn_mask
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        return torch.where(attn_mask, 0.0, float("-inf"))
    return attn_mask.to(q.dtype)


def _causal(q, k):
    """The causal mask as PyTorch's math kernel makes it: lower-triangular from the top left."""
    shape = (q.shape[-2], k.shape[-2])
    return torch.ones(shape, dtype=torch.bool, device=q.device).tril()


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


ATTENTION_DECOMPOSITIONS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (
        flash_attention_cpu_backward
    ),
}


_SDPA = torch._C._nn.scaled_dot_product_attention


def _flash_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False,
):  # fmt: skip
    """F.scaled_dot_product_attention, through the flash op where that computes the same;
    anything else (dropout, other ranks, a mask beside is_causal, ...) as SDPA has it."""
    plain = (dropout_p == 0.0 and query.dim() == key.dim() == value.dim() == 4
             and key.shape[-3] == value.shape[-3] and query.shape[-3] % key.shape[-3] == 0
             and query.shape[-1] == key.shape[-1] == value.shape[-1]
             and (attn_mask is None or (not is_causal
                                        and attn_mask.dtype in (torch.bool, query.dtype)))
             and query.dtype == key.dtype == value.dtype)  # fmt: skip
    if not plain or (key.shape[-3] != query.shape[-3] and not enable_gqa):
        return _SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                     enable_gqa=enable_gqa)  # fmt: skip
    if key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = (t.repeat_interleave(groups, dim=-3) for t in (key, value))
    out, _ = aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


# Note [one attention op]: the Dynamo graph's calls the backend retargets (backend._aot).
ATTENTION_CALLS = {_SDPA: _flash_sdpa}


def key_chunk_for(sbuf_partition_bytes: int) -> int:
    """Note [keys in chunks]: the keys a chunk of the forward takes on a core with this much
    SBUF per partition (tests/passes/test_attention.py checks that chunks fuse)."""
    return 2048 if sbuf_partition_bytes >= 224 * 1024 else 1024
