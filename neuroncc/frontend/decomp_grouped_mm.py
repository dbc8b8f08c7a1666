"""Grouped matmuls of mixture-of-experts layers, as dense products over every expert.

transformers' MoE layers run their expert projections through the custom op
`transformers::grouped_mm_fallback` (and `grouped_mm_fallback_backward`): tokens sorted by
expert, `offs` the running token counts, each expert's rows times its weight. How many rows
each expert gets depends on the routing, so it is not known at compile time, and a static
program cannot size one product per expert. Note [grouped matmul]: the rules here tile over the
worst case instead: every row is multiplied by every expert's weight, as one [S, K] x [K, E N]
product, and a one-hot of each row's expert (from `offs`, compared with the row index) keeps the
product of its own expert; rows past the last offset are 0, as the op leaves them. Exact (the
other products are multiplied by 0 and added), and E times the routed FLOPs, which is what the
profile then shows; a warning says so once per process.

The op exists only once transformers is imported, so the rules are added to the table when it
is there (`add_library_ops`, called before each compile).
"""

from __future__ import annotations

import warnings

import torch

_WARNED = False


def _expert_mask(offs: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, E]: 1 where row s belongs to expert e (offs[e-1] <= s < offs[e])."""
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(
            "neuroncc: a mixture-of-experts grouped matmul is compiled as a dense product over "
            "all its experts (tokens per expert are known only at run time): its device time is "
            "that of E times the routed FLOPs (Note [grouped matmul])",
            stacklevel=3,
        )
    row = torch.arange(rows, device=offs.device).unsqueeze(1)
    ends = offs.to(torch.int64).unsqueeze(0)
    starts = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], dim=1)
    return ((row >= starts) & (row < ends)).to(dtype)


def _stacked(weight: torch.Tensor) -> torch.Tensor:
    """[E N, K]: every expert's weightᵀ, stacked. transformers passes the experts' weights as
    a transposed view of their [E, N, K] storage (`weight.transpose(-2, -1)`), and then this is
    a view of that storage: the products below are then a linear layer's (x Aᵀ, and grad A),
    with no transpose of the weights, which the compiler would otherwise make in HBM on every
    call."""
    e, k, n = weight.shape
    return weight.mT.reshape(e * n, k)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out[s] = x[s] @ weight[e(s)] for x [S, K], weight [E, K, N]."""
    (s, k), (e, _, n) = x.shape, weight.shape
    if weight.is_contiguous():
        every = x @ weight.permute(1, 0, 2).reshape(k, e * n)  # rows of N moved, not transposed
    else:
        every = torch.nn.functional.linear(x, _stacked(weight))
    return (every.view(s, e, n) * _expert_mask(offs, s, x.dtype).unsqueeze(-1)).sum(1)


def grouped_mm_backward(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight): grad_x[s] = grad[s] @ weight[e(s)]^T and grad_weight[e] =
    x[rows of e]^T @ grad[rows of e], each as one dense product with grad split by expert.
    grad_weight is laid out as weight is (an [E, N, K] storage seen transposed, or [E, K, N]),
    so that the gradient of the storage needs no transpose either."""
    (s, k), (e, _, n) = x.shape, weight.shape
    split = (grad.unsqueeze(1) * _expert_mask(offs, s, grad.dtype).unsqueeze(-1)).reshape(s, e * n)
    grad_x = split @ _stacked(weight)
    if weight.is_contiguous():
        return grad_x, (x.transpose(0, 1) @ split).view(k, e, n).permute(1, 0, 2).contiguous()
    return grad_x, (split.transpose(0, 1) @ x).view(e, n, k).mT


def add_library_ops(table: dict) -> None:
    """Add the rules for the ops of libraries imported since (transformers' grouped matmul)."""
    for name, rule in (
        ("grouped_mm_fallback", grouped_mm),
        ("grouped_mm_fallback_backward", grouped_mm_backward),
    ):
        op = getattr(torch.ops.transformers, name, None)  # (None until transformers registers it)
        if op is not None and op.default not in table:
            table[op.default] = rule
