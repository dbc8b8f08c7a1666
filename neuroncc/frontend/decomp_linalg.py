"""Triangular solves as products of matrices: `linalg_solve_triangular` and `triangular_solve`.

Chunked linear attention (Qwen3-Next's and Qwen3.5's gated delta rule) solves small unit
lower-triangular systems, one per chunk and head, with `torch.linalg.solve_triangular`. LAPACK
solves them by forward substitution, n dependent steps of a row each, which would be n tiny
kernels one after another on the NeuronCore. Note [triangular solves by doubling]: a triangular
A is D (I - N) with D its diagonal and N = -D⁻¹ (A - D) strictly triangular, so nilpotent
(Nⁿ = 0), and

    (I - N)⁻¹ = I + N + N² + ... + Nⁿ⁻¹ = (I + N) (I + N²) (I + N⁴) ... (I + N^(2^(m-1)))

with 2^m >= n. So X = A⁻¹ B takes m = ceil(log2 n) steps Y <- Y + P Y and m - 1 squarings
P <- P P, all batched matmuls on TensorE (6 and 5 for a chunk of 64), and no division except
by the diagonal. The products group the same sum differently from forward substitution; on the
delta rule's systems and on well-conditioned random ones the error against a float64 solve is
that of LAPACK's float32 solve (tests/frontend/test_linalg.py). An ill-conditioned system loses
accuracy either way.

The backward needs nothing here: autograd's formula for the solve is again a triangular solve
(with Aᴴ) and products, and AOTAutograd decomposes it by the same rule.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _solve_lower_or_upper(a: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool):
    """A⁻¹ B for A triangular (only its `upper` or lower triangle read) and B [..., n, k]."""
    n = a.shape[-1]
    off_diagonal = a.triu(1) if upper else a.tril(-1)
    if unit:
        nilpotent = -off_diagonal
    else:
        diagonal = a.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
        nilpotent = -(off_diagonal / diagonal)
        b = b / diagonal
    y, power, reached = b, nilpotent, 1
    while reached < n:
        y = y + power @ y  # now (I + N + ... + N^(2 reached - 1)) B
        reached *= 2
        if reached < n:
            power = power @ power
    return y


def _linalg_solve_triangular(
    a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, unitriangular=False
):
    if not left:  # X A = B is Aᵀ Xᵀ = Bᵀ, with the triangle flipped
        x = _solve_lower_or_upper(a.mT, b.mT, not upper, unitriangular)
        return x.mT.contiguous()
    return _solve_lower_or_upper(a, b, upper, unitriangular)


def _triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """The older API: (solution, a clone of A), solving Aᵀ X = B when `transpose`."""
    if transpose:
        x = _solve_lower_or_upper(a.mT, b, not upper, unitriangular)
    else:
        x = _solve_lower_or_upper(a, b, upper, unitriangular)
    return x, a.clone()


LINALG_DECOMPOSITIONS = {
    aten.linalg_solve_triangular.default: _linalg_solve_triangular,
    aten.triangular_solve.default: _triangular_solve,
}
