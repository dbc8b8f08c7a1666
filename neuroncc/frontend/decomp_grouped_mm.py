"""Grouped matmuls of mixture-of-experts layers, as dense products over every expert.

transformers' MoE layers run their expert projections through the custom op
`transformers::grouped_mm_fallback` (and `grouped_mm_fallback_backward`): tokens sorted by
expert, `offs` the running token counts, each expert's rows times its weight. How many rows
each expert gets depends on the routing, so it is not known at compile time, and a static
program cannot size one product per expert. Note [grouped matmul]: the rules here tile over the
worst case instead: each row is placed in the columns of its own expert (a one-hot of its expert,
from `offs` compared with the row index, times the row: [S, E K], 0 elsewhere) and multiplied by
every expert's weight stacked along the contraction ([E K, N]), one product whose accumulation
sums over the experts; rows past the last offset are 0, as the op leaves them. Exact (the other
experts' terms are products with 0), and E times the routed FLOPs, which is what the profile
then shows; a warning says so once per process, and stats()["dense_grouped_matmuls"] counts the
products compiled so.

The op exists only once transformers is imported, so the rules are added to the table when it
is there (`add_library_ops`, called before each compile).
"""

from __future__ import annotations

import warnings

import torch

from neuroncc.runtime.stats import STATS

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


def _routed(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[S, E K]: row s of x in the columns of its own expert, 0 in the others."""
    (s, k), e = x.shape, offs.shape[0]
    return (x.unsqueeze(1) * _expert_mask(offs, s, x.dtype).unsqueeze(-1)).reshape(s, e * k)


def _by_contraction(weight: torch.Tensor) -> torch.Tensor:
    """[N, E K]: the experts' weights side by side along the contraction, each transposed, as
    a linear layer's weight. transformers passes them as a transposed view of an [E, N, K]
    storage (`weight.transpose(-2, -1)`): then this moves rows of K, it transposes nothing."""
    e, k, n = weight.shape
    return weight.permute(2, 0, 1).reshape(n, e * k)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out[s] = x[s] @ weight[e(s)] for x [S, K], weight [E, K, N]: the routed rows [S, E K]
    times every expert's weight stacked [E K, N], so that the sum over experts is the
    product's own accumulation (in PSUM) and no [S, E, N] of products is made."""
    STATS.add("dense_grouped_matmuls")
    (s, _), (e, k, n) = x.shape, weight.shape
    if weight.is_contiguous():
        return _routed(x, offs) @ weight.reshape(e * k, n)
    if _few_rows(s, k):
        every = torch.nn.functional.linear(x, weight.mT.reshape(e * n, k)).view(s, e, n)
        return (every * _expert_mask(offs, s, x.dtype).unsqueeze(-1)).sum(1)
    return torch.nn.functional.linear(_routed(x, offs), _by_contraction(weight))


def _few_rows(rows: int, k: int) -> bool:
    """Whether to multiply every row by every expert and keep each row's own expert's product
    ([S, E, N] made and summed over E) rather than rearrange weights stored [E, N, K] into
    [N, E K] (E N K elements moved in HBM on every call): with rows fewer than K / 4. The
    products then cost little beside the weights' bytes, which both ways read (a decode step);
    the threshold is measured (tools/bench.py moe rows, trn2): at 1024 rows and K = 2048 the
    rearranged weights are already 7% faster in all, and at 2 rows 2x slower."""
    return 4 * rows < k


def grouped_mm_backward(
    x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight): grad_x[s] = grad[s] @ weight[e(s)]^T, the product with every
    expert kept for its own rows; grad_weight = routedᵀ @ grad, each expert's block of the
    routed rows against grad. grad_weight is laid out as weight is ([E, K, N], or an [E, N, K]
    storage seen transposed), so that the storage's gradient needs no transpose either."""
    STATS.add("dense_grouped_matmuls")
    s, (e, k, n) = x.shape[0], weight.shape
    routed = _routed(x, offs)
    if weight.is_contiguous():
        every = torch.nn.functional.linear(grad, weight.reshape(e * k, n))
        grad_weight = (routed.transpose(0, 1) @ grad).view(e, k, n)
    else:
        every = grad @ _by_contraction(weight)
        grad_weight = (grad.transpose(0, 1) @ routed).view(n, e, k).permute(1, 0, 2).mT
    mask = _expert_mask(offs, s, grad.dtype).unsqueeze(-1)
    return (every.view(s, e, k) * mask).sum(1), grad_weight


def add_library_ops(table: dict) -> None:
    """Add the rules for the ops of libraries imported since (transformers' grouped matmul)."""
    for name, rule in (
        ("grouped_mm_fallback", grouped_mm),
        ("grouped_mm_fallback_backward", grouped_mm_backward),
    ):
        op = getattr(torch.ops.transformers, name, None)  # (None until transformers registers it)
        if op is not None and op.default not in table:
            table[op.default] = rule
