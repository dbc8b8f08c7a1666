"""Triangular solves by doubling (frontend/decomp_linalg.py, Note [triangular solves by
doubling]): the rule against a float64 solve over every flag and batch broadcasting, then
compiled, forward and backward, against eager."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroncc
from neuroncc.frontend.decomp_linalg import LINALG_DECOMPOSITIONS

aten = torch.ops.aten
solve_rule = LINALG_DECOMPOSITIONS[aten.linalg_solve_triangular.default]


def _system(n: int, k: int, batch: tuple, seed: int, dtype=torch.float32):
    """A well-conditioned triangular A (unit-sized diagonal, small off-diagonal) and B."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, n, n, generator=g) / math.sqrt(n)
    a = a + torch.diag_embed(1.5 + torch.rand(*batch, n, generator=g))
    return a.to(dtype), torch.randn(*batch, n, k, generator=g).to(dtype)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 70),
    k=st.integers(1, 5),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    upper=st.booleans(),
    left=st.booleans(),
    unit=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_rule_solves_like_a_float64_solve(n, k, batch, upper, left, unit, seed):
    a, b = _system(n, k, batch, seed)
    if not left:
        b = b.mT  # X A = B: B is [k, n]
    want = torch.linalg.solve_triangular(
        a.double(), b.double(), upper=upper, left=left, unitriangular=unit
    )
    lapack = torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)
    got = solve_rule(a, b, upper=upper, left=left, unitriangular=unit)
    assert got.shape == want.shape
    # As close to the exact solution as LAPACK's float32 solve, within a small factor.
    lapack_error = (lapack.double() - want).abs().max().item()
    assert (got.double() - want).abs().max().item() <= 4 * lapack_error + 1e-6


def test_only_the_named_triangle_is_read():
    a, b = _system(6, 2, (), 0)
    junk = a + torch.randn(6, 6).triu(1) * 100  # the upper triangle must not matter
    torch.testing.assert_close(
        solve_rule(junk, b, upper=False), torch.linalg.solve_triangular(a.tril(), b, upper=False)
    )


def test_broadcast_batches():
    a, _ = _system(5, 1, (3, 1), 1)
    b = torch.randn(4, 5, 2)
    torch.testing.assert_close(
        solve_rule(a, b, upper=True), torch.linalg.solve_triangular(a, b, upper=True)
    )


@pytest.mark.parametrize("upper,unit", [(False, True), (True, False)])
def test_compiled_solve_and_its_gradients_equal_eager(fresh, upper, unit):
    """The chunked delta rule's form (a batch of unit lower-triangular systems) and a general
    upper one; both operands get gradients, which autograd writes as solves again."""

    def f(a, b):
        return torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=unit).sin().sum()

    a, b = _system(16, 4, (2, 3), 7)
    a.requires_grad_()
    b.requires_grad_()
    got = torch.compile(f, backend="neuron", options={"fallback": False})(a, b)
    got.backward()
    grads = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    want = f(a, b)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads[0], a.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], b.grad, rtol=1e-4, atol=1e-5)
    assert neuroncc.stats()["fallback_nodes"] == {}


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
def test_triangular_solve_old_api(fresh):
    a, b = _system(8, 3, (2,), 3)

    def f(a, b):
        return torch.triangular_solve(b, a, upper=True, transpose=True)

    got = torch.compile(f, backend="neuron", options={"fallback": False})(a, b)
    want = f(a, b)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], want[1])
