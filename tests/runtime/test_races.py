"""The race checker's HBM regions: exact sets of element addresses, built fast for increasing patterns."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from neuroncc.codegen.hardware import isa
from neuroncc.ir.types import DType
from neuroncc.runtime.races import _increasing, region

dims_strategy = st.lists(
    st.tuples(st.integers(-40, 300), st.integers(1, 6)), min_size=1, max_size=4
).map(tuple)


@given(dims_strategy, st.integers(0, 200))
def test_regions_hold_exactly_the_elements_a_pattern_visits(dims, offset):
    ref = isa.DramRef("b", offset + 2000, DType.F32, dims)
    offs = np.array([offset + 2000], dtype=np.int64)
    for stride, count in dims:
        offs = (offs[:, None] + stride * np.arange(count)[None, :]).reshape(-1)
    _, reg = region(ref, {"b": 64})  # buffer b at HBM byte 64, 4-byte elements
    want = 64 + 4 * np.unique(offs)
    got = np.arange(reg.lo, reg.hi, 4) if reg.idx is None else reg.idx
    np.testing.assert_array_equal(got, want)  # sorted, unique, complete
    if _increasing(dims):
        assert np.all(np.diff(offs) > 0)
