"""The elementwise math shared by the interpreter and the simulator, against Python's
double-precision math."""

import math

import numpy as np
import pytest

from neuroncc.ir import numerics

POINTS = np.concatenate(
    [
        np.linspace(-6, 6, 100_001, dtype=np.float32),
        np.logspace(-30, 0.6, 2_000, dtype=np.float32),
        -np.logspace(-30, 0.6, 2_000, dtype=np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 4.0, -4.0, 1e30, -1e30], dtype=np.float32),
    ]
)


@pytest.mark.parametrize(
    ("fn", "ref", "ulps"),
    [(numerics.erf, math.erf, 8), (numerics.erfc, math.erfc, 4)],
)
def test_error_in_ulps(fn, ref, ulps):
    want = np.array([ref(float(v)) for v in POINTS])
    got = fn(POINTS).astype(np.float64)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    worst = np.argmax(np.abs(got - want) / ulp)
    assert np.abs(got - want)[worst] <= ulps * ulp[worst], (POINTS[worst], got[worst], want[worst])
    assert np.all(np.abs(got) <= 2.0)


def test_erf_keeps_nan():
    assert np.isnan(numerics.erf(np.array([np.nan], dtype=np.float32))).all()


@pytest.mark.parametrize("exponent", [2.0, 3.0, -2.0, -0.5, -1.0, 1.7])
def test_pow_by_a_scalar_is_pytorchs(exponent):
    """PyTorch's CPU kernel takes a tensor to 3 or -2 as products and to -0.5 as a root
    (GPT-2's gelu cubes): those bit for bit; other exponents within an ulp (powf)."""
    import torch

    x = POINTS[np.isfinite(POINTS) & (np.abs(POINTS) < 1e12)]
    want = torch.pow(torch.from_numpy(x), exponent).numpy()
    got = numerics.BINARY["pow"](x, np.float32(exponent))
    assert got.dtype == np.float32
    if exponent == 1.7:
        np.testing.assert_array_max_ulp(got[x > 0], want[x > 0], maxulp=1)
    else:
        np.testing.assert_array_equal(got, want)
