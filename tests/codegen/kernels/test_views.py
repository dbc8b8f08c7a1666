"""Strided views (codegen/kernels/views.py) against NumPy: a chain of reshapes, transposes and
slices read in place must address exactly the elements the chain computes."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.codegen.kernels.emit_tensor import transpose_layout
from neuroncc.codegen.kernels.views import reshape_strides, strided_view
from neuroncc.codegen.lower import emit_graph
from neuroncc.ir import DType, GraphBuilder, Op, TensorType
from neuroncc.runtime.simulator import run


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


def _ir_chain(b: GraphBuilder, x, ops) -> list:
    """The chain's values, x's views one after another."""
    values, v = [], x
    for kind, arg in ops:
        if kind == "transpose":
            v = b.op(Op.TRANSPOSE, v, perm=list(arg))
        elif kind == "slice":
            starts, stops, steps = arg
            v = b.op(Op.SLICE, v, starts=list(starts), stops=list(stops), steps=list(steps))
        else:
            v = b.op(Op.RESHAPE, v, shape=list(arg))
        values.append(v)
    return values


def _numpy_chain(x: np.ndarray, ops) -> np.ndarray:
    """What the chain computes, in NumPy."""
    for kind, arg in ops:
        if kind == "transpose":
            x = x.transpose(arg)
        elif kind == "slice":
            x = x[tuple(slice(a, z, s) for a, z, s in zip(*arg, strict=True))]
        else:
            x = x.reshape(arg)
    return x


def _chain_graph(shape, ops, keep_chain: bool):
    """x through the chain of view ops, concatenated with a second input along axis 0; with
    keep_chain, the chain's first value is also an output (so it must still be made)."""
    b = GraphBuilder()
    x = b.input(TensorType(shape, DType.F32))
    chain = _ir_chain(b, x, ops)
    v, first = chain[-1] if chain else x, chain[0] if chain else None
    y = b.input(v.type)
    cat = b.op(Op.CONCAT, v, y, axis=0)
    return b.build([cat, first] if keep_chain and first is not None else [cat])


@given(chains(), st.booleans())
def test_a_concat_copies_its_inputs_from_where_their_views_start(chain, keep_chain):
    """Note [concat in place]: the result is the concat of what the chain computes, and no
    transpose or slice kernel is left where the chain has no transpose on TensorE, but a
    value read elsewhere."""
    shape, ops = chain
    g = _chain_graph(shape, ops, keep_chain)
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = _numpy_chain(x, ops)
    y = -np.ones(want.shape, np.float32)
    out = run(emit_graph(g, TRN2), [x, y], TRN2)
    np.testing.assert_array_equal(out[0], np.concatenate([want, y]))
    producers = g.producers()
    kept = {
        int(k.name.split(".")[1])
        for k in emit_graph(g, TRN2).kernels
        if k.stop > k.start and k.name.startswith(("transpose.", "slice."))
    }
    src = producers[g.outputs[0].id].inputs[0]
    while src.id in producers and producers[src.id].op is Op.RESHAPE:
        src = producers[src.id].inputs[0]
    _, walked = strided_view(src, producers)  # what the concat's copy reads through
    chain = [producers[v] for v in walked]
    if any(n.op is Op.TRANSPOSE and transpose_layout(g, n, TRN2) == "pe" for n in chain):
        return  # a chain with a transpose on TensorE stays as it is
    # none of it is made, but the chain's first value where it is an output too
    assert not kept & set(walked) - {g.outputs[-1].id}


def test_a_backward_puts_dq_dk_dv_back_into_rows_in_one_copy():
    """[heads, S, D] -> [S, heads * D] for each of three, concatenated: one concat kernel
    reading the heads where they are, no transpose kernels."""
    b = GraphBuilder()
    parts = []
    for _ in range(3):
        x = b.input(TensorType((1, 4, 32, 16), DType.F32))
        t = b.op(Op.TRANSPOSE, x, perm=[0, 2, 1, 3])
        parts.append(b.op(Op.RESHAPE, t, shape=[1, 32, 64]))
    g = b.build([b.op(Op.CONCAT, *parts, axis=2)])
    exe = emit_graph(g, TRN2)
    assert [k.name.split(".")[0] for k in exe.kernels if k.stop > k.start] == ["concat"]
    xs = [np.random.default_rng(i).standard_normal((1, 4, 32, 16), np.float32) for i in range(3)]
    want = np.concatenate([x.transpose(0, 2, 1, 3).reshape(1, 32, 64) for x in xs], axis=2)
    np.testing.assert_array_equal(run(exe, xs, TRN2)[0], want)


@given(chains())
def test_a_copy_reads_through_the_views_before_it(chain):
    """Note [copies in place]: a chain of views ending in a slice or a DMA transpose (a graph
    output, so it is made) is made by one copy from where the chain starts."""
    shape, ops = chain
    b = GraphBuilder()
    x = b.input(TensorType(shape, DType.F32))
    chain = _ir_chain(b, x, ops)
    if not chain:
        return
    v = chain[-1]
    g = b.build([v])
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = _numpy_chain(data, ops)
    exe = emit_graph(g, TRN2)
    np.testing.assert_array_equal(run(exe, [data], TRN2)[0], want)
    if any(n.op is Op.TRANSPOSE and transpose_layout(g, n, TRN2) == "pe" for n in g.nodes):
        return  # a transpose on TensorE stays a kernel of its own
    if strided_view(v, g.producers())[0].base != x:
        return  # a reshape the strides cannot express: the copy before it is made
    copies = [
        k for k in exe.kernels if k.stop > k.start and k.name.startswith(("transpose.", "slice."))
    ]
    assert len(copies) <= 1, [k.name for k in exe.kernels]
