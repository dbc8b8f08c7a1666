"""The simulator's semantics where torch computes them (semantics.py's docstring says why)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from neuroncc.ir import numerics
from neuroncc.runtime.semantics import TORCH_BINARY

SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38]
FLOATS = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32, allow_nan=True))


def _bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns, with every NaN as one (their payloads are not specified)."""
    return np.where(np.isnan(x), np.uint32(0x7FC00000), x.view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(
    op=st.sampled_from(sorted(TORCH_BINARY)),
    a=hnp.arrays(np.float32, (8, 33), elements=FLOATS),
    b=hnp.arrays(np.float32, (8, 33), elements=FLOATS),
    scalar_b=st.booleans(),
)
def test_torch_binary_ops_give_numpys_bits(op, a, b, scalar_b):
    """Each op torch computes for VectorE gives the bits numerics.BINARY (the interpreter's
    definition) gives, special values included, also against a per-partition scalar."""
    if scalar_b:
        b = b[:, :1]
    out = np.empty_like(a)
    TORCH_BINARY[op](torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    want = numerics.BINARY[op](a, b)
    np.testing.assert_array_equal(_bits(out), _bits(want.astype(np.float32)))


@pytest.mark.parametrize("op", sorted(TORCH_BINARY))
def test_torch_binary_ops_on_signed_zeros(op):
    a = np.array([[0.0, -0.0, 0.0, -0.0]], np.float32)
    b = np.array([[-0.0, 0.0, 0.0, -0.0]], np.float32)
    out = np.empty_like(a)
    TORCH_BINARY[op](torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    np.testing.assert_array_equal(_bits(out), _bits(numerics.BINARY[op](a, b)))
