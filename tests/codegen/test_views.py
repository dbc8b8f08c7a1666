"""Strided views (codegen/views.py) against NumPy: a chain of reshapes, transposes and
slices read in place must address exactly the elements the chain computes."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from neuroncc.codegen.views import reshape_strides, strided_view
from neuroncc.ir import DType, GraphBuilder, Op, TensorType


def _factor_pairs(n):
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


@st.composite
def chains(draw):
    """A base shape and a chain of view ops, applied to both NumPy and the IR."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    ops = []
    cur = shape
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["transpose", "slice", "split", "merge"]))
        if kind == "transpose":
            perm = tuple(draw(st.permutations(range(len(cur)))))
            ops.append(("transpose", perm))
            cur = tuple(cur[p] for p in perm)
        elif kind == "slice":
            starts, stops, steps = [], [], []
            for size in cur:
                lo = draw(st.integers(0, size - 1))
                hi = draw(st.integers(lo + 1, size))
                starts.append(lo)
                stops.append(hi)
                steps.append(draw(st.integers(1, 2)))
            ops.append(("slice", (tuple(starts), tuple(stops), tuple(steps))))
            cur = tuple(len(range(a, z, s)) for a, z, s in zip(starts, stops, steps, strict=True))
        elif kind == "split":
            axis = draw(st.integers(0, len(cur) - 1))
            a, c = draw(st.sampled_from(_factor_pairs(cur[axis])))
            cur = (*cur[:axis], a, c, *cur[axis + 1 :])
            ops.append(("reshape", cur))
        elif len(cur) > 1:
            axis = draw(st.integers(0, len(cur) - 2))
            cur = (*cur[:axis], cur[axis] * cur[axis + 1], *cur[axis + 2 :])
            ops.append(("reshape", cur))
    return shape, ops


@given(chains())
def test_views_address_what_the_chain_computes(chain):
    shape, ops = chain
    base = np.arange(int(np.prod(shape))).reshape(shape)
    b = GraphBuilder()
    x = b.input(TensorType(shape, DType.F32))
    want, v = base, x
    arrays = {x.id: base}
    for kind, arg in ops:
        if kind == "transpose":
            want, v = want.transpose(arg), b.op(Op.TRANSPOSE, v, perm=list(arg))
        elif kind == "slice":
            starts, stops, steps = arg
            index = tuple(slice(a, z, s) for a, z, s in zip(starts, stops, steps, strict=True))
            want = want[index]
            v = b.op(Op.SLICE, v, starts=list(starts), stops=list(stops), steps=list(steps))
        else:
            want, v = want.reshape(arg), b.op(Op.RESHAPE, v, shape=list(arg))
        arrays[v.id] = want
    g = b.build([v])
    view, walked = strided_view(v, g.producers())
    # A reshape that needs a copy stops the walk: the view is then of the value it made.
    assert len(walked) == len(ops) or g.producers()[view.base.id].op is Op.RESHAPE
    flat = np.ascontiguousarray(arrays[view.base.id]).ravel()
    got = np.lib.stride_tricks.as_strided(
        flat[view.offset :], view.shape, [s * flat.itemsize for s in view.strides]
    )
    np.testing.assert_array_equal(got, want)


def test_merging_non_contiguous_axes_needs_a_copy():
    assert reshape_strides((4, 6), (1, 4), (24,)) is None  # a transposed [6, 4]
    assert reshape_strides((4, 6), (6, 1), (2, 2, 6)) == (12, 6, 1)
    assert reshape_strides((1, 12, 64), (0, 64, 1), (12, 1, 64)) == (64, 0, 1)
