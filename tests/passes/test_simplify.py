import numpy as np
import pytest
import torch
from hypothesis import given

from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.ir import DType, GraphBuilder, Op, TensorType, interpret, parse, print_graph
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.passes.simplify import Simplify
from tests.codegen.kernels.test_emit import random_input
from tests.strategies import graphs

CTX = PassContext(TRN2)


@given(graphs())
def test_simplify_preserves_what_the_interpreter_computes(g):
    after = run_pipeline(g, default_pipeline(2), CTX).graph
    inputs = [random_input(v.type) for v in g.inputs]
    for a, b in zip(interpret(after, inputs), interpret(g, inputs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(after.nodes) <= len(g.nodes)


BEFORE = """
graph @main(%0: f32[4,8], %1: f32[4,8]) {
  %2 = reshape %0 {shape=[32]} : f32[32]
  %3 = reshape %2 {shape=[4,8]} : f32[4,8]
  %4 = transpose %3 {perm=[1,0]} : f32[8,4]
  %5 = transpose %4 {perm=[1,0]} : f32[4,8]
  %6 = add %5, %1 : f32[4,8]
  %7 = add %0, %1 : f32[4,8]
  %8 = exp %1 : f32[4,8]
  %9 = cast %7 {dtype=f32} : f32[4,8]
  %10 = mul %6, %9 : f32[4,8]
  return %10
}
"""

AFTER = """graph @main(%0: f32[4,8], %1: f32[4,8]) {
  %6 = add %0, %1 : f32[4,8]
  %10 = mul %6, %6 : f32[4,8]
  return %10
}
"""


def test_simplify_golden():
    """Chains fold to identities, the duplicate add is CSE'd, the unused exp is dead."""
    after = Simplify().run(parse(BEFORE), CTX)
    assert print_graph(after) == AFTER


def test_pipeline_records_snapshots():
    b = GraphBuilder()
    x = b.input(TensorType((2,), DType.F32))
    g = b.build([b.op(Op.CAST, x, dtype=DType.F32)])
    res = run_pipeline(g, default_pipeline(2), CTX, snapshots=True)
    assert [name for name, _ in res.snapshots] == [
        "simplify",
        "fuse",
        "layout",
        "tile",
        "schedule",
        "plan",
    ]
    assert res.graph.outputs == g.inputs
    assert run_pipeline(g, default_pipeline(0), CTX).graph == g


SAFE_SOFTMAX = """graph @main(%0: f32[3,5]) {
  %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[3,1]
  %2 = full {shape=[3,5], value=-inf, dtype=f32} : f32[3,5]
  %3 = eq %0, %2 : bool[3,5]
  %4 = not %3 : bool[3,5]
  %5 = cast %4 {dtype=f32} : f32[3,5]
  %6 = reduce_max %5 {axes=[1], keepdim=true} : f32[3,1]
  %7 = add %1, %6 : f32[3,1]
  return %7
}
"""

# One pass over the row instead of four: the test shares the softmax's own max.
SAFE_SOFTMAX_AFTER = """graph @main(%0: f32[3,5]) {
  %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[3,1]
  %9 = full {shape=[3,1], value=-inf, dtype=f32} : f32[3,1]
  %10 = ne %1, %9 : bool[3,1]
  %11 = cast %10 {dtype=f32} : f32[3,1]
  %7 = add %1, %11 : f32[3,1]
  return %7
}
"""


def test_any_unmasked_test_shares_the_row_max():
    g = parse(SAFE_SOFTMAX)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == SAFE_SOFTMAX_AFTER
    neg_inf, nan = float("-inf"), float("nan")
    x = np.array([[1, 2, 3, 4, 5], [neg_inf] * 5, [neg_inf, nan, neg_inf, 0, 1]], np.float32)
    np.testing.assert_array_equal(interpret(after, [x]), interpret(g, [x]))


SCALED_MATMUL = """graph @main(%0: f32[2,8,4], %1: f32[2,4,8]) {
  %2 = full {shape=[2,8,4], value=0.5, dtype=f32} : f32[2,8,4]
  %3 = mul %0, %2 : f32[2,8,4]
  %4 = full {shape=[2,4,8], value=0.25, dtype=f32} : f32[2,4,8]
  %5 = mul %4, %1 : f32[2,4,8]
  %7 = matmul %3, %5 : f32[2,8,8]
  return %7
}
"""

SCALED_MATMUL_AFTER = """graph @main(%0: f32[2,8,4], %1: f32[2,4,8]) {
  %8 = matmul %0, %1 : f32[2,8,8]
  %9 = full {shape=[2,8,8], value=0.125, dtype=f32} : f32[2,8,8]
  %10 = mul %8, %9 : f32[2,8,8]
  return %10
}
"""


def test_constant_scales_move_after_the_matmul():
    g = parse(SCALED_MATMUL)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == SCALED_MATMUL_AFTER
    inputs = [random_input(v.type) for v in g.inputs]
    np.testing.assert_allclose(interpret(after, inputs)[0], interpret(g, inputs)[0], rtol=1e-6)


SQUARES = """graph @main(%0: f32[4,8], %1: i64[4,8]) {
  %2 = full {shape=[4,8], value=2.0, dtype=f32} : f32[4,8]
  %3 = pow %0, %2 : f32[4,8]
  %4 = full {shape=[4,8], value=3.0, dtype=f32} : f32[4,8]
  %5 = pow %0, %4 : f32[4,8]
  %6 = full {shape=[4,8], value=2, dtype=i64} : i64[4,8]
  %7 = pow %1, %6 : i64[4,8]
  return %3, %5, %7
}
"""

SQUARES_AFTER = """graph @main(%0: f32[4,8], %1: i64[4,8]) {
  %8 = mul %0, %0 : f32[4,8]
  %4 = full {shape=[4,8], value=3.0, dtype=f32} : f32[4,8]
  %5 = pow %0, %4 : f32[4,8]
  %6 = full {shape=[4,8], value=2, dtype=i64} : i64[4,8]
  %7 = pow %1, %6 : i64[4,8]
  return %8, %5, %7
}
"""


def test_float_squares_are_products():
    """x ** 2 -> x * x for floats (PyTorch's pow kernel does the same); other exponents and
    integer powers stay."""
    g = parse(SQUARES)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == SQUARES_AFTER
    x = np.array([[0.0, -0.0, 1.5, -3.0, np.inf, -np.inf, np.nan, 1e-30]] * 4, np.float32)
    n = np.arange(32).reshape(4, 8) - 16
    want = torch.from_numpy(x).pow(2).numpy()
    np.testing.assert_array_equal(interpret(after, [x, n])[0], want)
    np.testing.assert_array_equal(interpret(after, [x, n])[2], interpret(g, [x, n])[2])


COLUMN_SUM = """graph @main(%0: f32[4,6,8]) {
  %1 = transpose %0 {perm=[2,0,1]} : f32[8,4,6]
  %2 = reduce_sum %1 {axes=[1,2], keepdim=false} : f32[8]
  %3 = transpose %0 {perm=[1,2,0]} : f32[6,8,4]
  %4 = reduce_sum %3 {axes=[2], keepdim=false} : f32[6,8]
  %5 = transpose %0 {perm=[0,2,1]} : f32[4,8,6]
  %6 = reduce_sum %5 {axes=[2], keepdim=false} : f32[4,8]
  %7 = transpose %0 {perm=[2,1,0]} : f32[8,6,4]
  %8 = reduce_sum %7 {axes=[2], keepdim=false} : f32[8,6]
  return %2, %4, %6, %8
}
"""

COLUMN_SUM_AFTER = """graph @main(%0: f32[4,6,8]) {
  %9 = reshape %0 {shape=[24,8]} : f32[24,8]
  %10 = full {shape=[1,24], value=1.0, dtype=f32} : f32[1,24]
  %11 = matmul %10, %9 : f32[1,8]
  %12 = reshape %11 {shape=[8]} : f32[8]
  %13 = reshape %0 {shape=[4,48]} : f32[4,48]
  %14 = full {shape=[1,4], value=1.0, dtype=f32} : f32[1,4]
  %15 = matmul %14, %13 : f32[1,48]
  %16 = reshape %15 {shape=[6,8]} : f32[6,8]
  %18 = full {shape=[4,1,6], value=1.0, dtype=f32} : f32[4,1,6]
  %19 = matmul %18, %0 : f32[4,1,8]
  %20 = reshape %19 {shape=[4,8]} : f32[4,8]
  %7 = transpose %0 {perm=[2,1,0]} : f32[8,6,4]
  %8 = reduce_sum %7 {axes=[2], keepdim=false} : f32[8,6]
  return %12, %16, %20, %8
}
"""


def test_sums_over_leading_or_middle_axes_are_matmuls_with_ones():
    """The reductions the lowering writes as transpose-then-reduce-last over a run of x's
    axes become ones @ x: over its first axes a matrix product, over axes after leading ones
    a batched one (a grouped-query attention's key gradient); a reduction whose kept axes
    the transpose reorders stays as it is."""
    g = parse(COLUMN_SUM)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == COLUMN_SUM_AFTER
    inputs = [random_input(v.type) for v in g.inputs]
    for got, want in zip(interpret(after, inputs), interpret(g, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


CAUSAL_MASK = """graph @main(%0: f32[2,4,4]) {
  %1 = full {shape=[4,4], value=1, dtype=bool} : bool[4,4]
  %2 = iota {n=4, start=0, step=1, dtype=i64} : i64[4]
  %3 = reshape %2 {shape=[1,4]} : i64[1,4]
  %4 = reshape %2 {shape=[4,1]} : i64[4,1]
  %5 = broadcast %3 {shape=[4,4]} : i64[4,4]
  %6 = broadcast %4 {shape=[4,4]} : i64[4,4]
  %7 = sub %5, %6 : i64[4,4]
  %8 = full {shape=[4,4], value=0, dtype=i64} : i64[4,4]
  %9 = le %7, %8 : bool[4,4]
  %10 = and %9, %1 : bool[4,4]
  %11 = full {shape=[4,4], value=0.0, dtype=f32} : f32[4,4]
  %12 = full {shape=[4,4], value=-inf, dtype=f32} : f32[4,4]
  %13 = where %10, %11, %12 : f32[4,4]
  %14 = reshape %13 {shape=[1,4,4]} : f32[1,4,4]
  %15 = broadcast %14 {shape=[2,4,4]} : f32[2,4,4]
  %16 = add %0, %15 : f32[2,4,4]
  return %16
}
"""

CAUSAL_MASK_AFTER = """graph @main(%0: f32[2,4,4]) {
  %2 = iota {n=4, start=0, step=1, dtype=i64} : i64[4]
  %3 = reshape %2 {shape=[1,4]} : i64[1,4]
  %4 = reshape %2 {shape=[4,1]} : i64[4,1]
  %5 = broadcast %3 {shape=[4,4]} : i64[4,4]
  %6 = broadcast %4 {shape=[4,4]} : i64[4,4]
  %17 = le %5, %6 : bool[4,4]
  %18 = reshape %17 {shape=[1,4,4]} : bool[1,4,4]
  %22 = broadcast %18 {shape=[2,4,4]} : bool[2,4,4]
  %23 = full {shape=[2,4,4], value=0.0, dtype=f32} : f32[2,4,4]
  %24 = full {shape=[2,4,4], value=-inf, dtype=f32} : f32[2,4,4]
  %25 = where %22, %23, %24 : f32[2,4,4]
  %16 = add %0, %25 : f32[2,4,4]
  return %16
}
"""


def test_causal_mask_is_one_compare_and_a_select_where_it_is_read():
    """SDPA's mask tril(ones) & (j - i <= 0) becomes j <= i, and the additive mask is selected
    after the broadcast over heads, so the kernel reading it reads the bool condition."""
    g = parse(CAUSAL_MASK)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == CAUSAL_MASK_AFTER
    x = random_input(g.inputs[0].type)
    np.testing.assert_array_equal(interpret(after, [x])[0], interpret(g, [x])[0])


MASK_LOOKALIKES = """graph @main(%0: bool[4], %1: u8[4], %2: u8[4]) {
  %4 = full {shape=[4], value=0, dtype=bool} : bool[4]
  %5 = and %0, %4 : bool[4]
  %6 = sub %1, %2 : u8[4]
  %7 = full {shape=[4], value=0, dtype=u8} : u8[4]
  %8 = le %6, %7 : bool[4]
  %3 = iota {n=4, start=0, step=1, dtype=i32} : i32[4]
  %9 = iota {n=4, start=2147483000, step=1, dtype=i32} : i32[4]
  %10 = sub %9, %3 : i32[4]
  %11 = full {shape=[4], value=0, dtype=i32} : i32[4]
  %12 = lt %10, %11 : bool[4]
  %13 = where %0, %1, %7 : u8[4]
  %14 = reshape %13 {shape=[2,2]} : u8[2,2]
  return %5, %8, %12, %14
}
"""


def test_mask_rules_leave_what_they_cannot_prove():
    """and with false is not x; unsigned or unbounded differences may wrap; a select of a value
    that is not constant stays before its reshape."""
    g = parse(MASK_LOOKALIKES)
    after = Simplify().run(g, CTX)
    assert [n.op for n in after.nodes] == [n.op for n in g.nodes]


TRANSPOSED_OPERAND = """graph @main(%0: f32[1,3,4,5], %1: f32[3,4,2], %2: f32[1,4,1,5]) {
  %3 = transpose %0 {perm=[0,1,3,2]} : f32[1,3,5,4]
  %4 = reshape %3 {shape=[3,5,4]} : f32[3,5,4]
  %5 = matmul %4, %1 : f32[3,5,2]
  %6 = transpose %2 {perm=[2,3,0,1]} : f32[1,5,1,4]
  %7 = reshape %6 {shape=[5,4]} : f32[5,4]
  %8 = transpose %0 {perm=[0,2,1,3]} : f32[1,4,3,5]
  %9 = reshape %8 {shape=[4,3,5]} : f32[4,3,5]
  return %5, %7, %9
}
"""

TRANSPOSED_OPERAND_AFTER = """graph @main(%0: f32[1,3,4,5], %1: f32[3,4,2], %2: f32[1,4,1,5]) {
  %10 = reshape %0 {shape=[3,4,5]} : f32[3,4,5]
  %11 = transpose %10 {perm=[0,2,1]} : f32[3,5,4]
  %5 = matmul %11, %1 : f32[3,5,2]
  %12 = reshape %2 {shape=[4,5]} : f32[4,5]
  %13 = transpose %12 {perm=[1,0]} : f32[5,4]
  %8 = transpose %0 {perm=[0,2,1,3]} : f32[1,4,3,5]
  %9 = reshape %8 {shape=[4,3,5]} : f32[4,3,5]
  return %5, %13, %9
}
"""


def test_unit_dims_are_dropped_before_a_transpose():
    """The transposed operand of a batched matmul (P^T in an attention backward) is read by
    the matmul directly, so the layout pass can fold it; a transpose that is not a swap of the
    last two axes once the unit dims are gone stays as it was."""
    g = parse(TRANSPOSED_OPERAND)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == TRANSPOSED_OPERAND_AFTER
    inputs = [random_input(v.type) for v in g.inputs]
    for a, b in zip(interpret(after, inputs), interpret(g, inputs), strict=True):
        np.testing.assert_array_equal(a, b)


SWIGLU = """graph @main(%0: f32[128,16], %1: f32[64,16]) {
  %2 = transpose %1 {perm=[1,0]} : f32[16,64]
  %3 = matmul %0, %2 : f32[128,64]
  %4 = reshape %3 {shape=[1,128,64]} : f32[1,128,64]
  %5 = slice %4 {starts=[0,0,0], stops=[1,128,32], steps=[1,1,1]} : f32[1,128,32]
  %6 = slice %4 {starts=[0,0,32], stops=[1,128,64], steps=[1,1,1]} : f32[1,128,32]
  %7 = sigmoid %5 : f32[1,128,32]
  %8 = mul %5, %7 : f32[1,128,32]
  %9 = mul %8, %6 : f32[1,128,32]
  return %9
}
"""

SWIGLU_AFTER = """graph @main(%0: f32[128,16], %1: f32[64,16]) {
  %11 = slice %1 {starts=[0,0], stops=[32,16], steps=[1,1]} : f32[32,16]
  %12 = transpose %11 {perm=[1,0]} : f32[16,32]
  %13 = matmul %0, %12 : f32[128,32]
  %14 = reshape %13 {shape=[1,128,32]} : f32[1,128,32]
  %16 = slice %1 {starts=[32,0], stops=[64,16], steps=[1,1]} : f32[32,16]
  %17 = transpose %16 {perm=[1,0]} : f32[16,32]
  %18 = matmul %0, %17 : f32[128,32]
  %19 = reshape %18 {shape=[1,128,32]} : f32[1,128,32]
  %7 = sigmoid %14 : f32[1,128,32]
  %8 = mul %14, %7 : f32[1,128,32]
  %9 = mul %8, %19 : f32[1,128,32]
  return %9
}
"""


def test_a_product_read_in_slices_is_a_matmul_per_slice():
    """A fused gate/up projection split by its readers: each half is x @ (rows of W)^T, so
    the product is never copied into halves and each half can take its own epilogue; a
    decode step's product (fewer than SPLIT_MIN_ROWS rows) stays whole."""
    g = parse(SWIGLU)
    after = Simplify().run(g, CTX)
    assert print_graph(after) == SWIGLU_AFTER
    inputs = [random_input(v.type) for v in g.inputs]
    # BLAS blocks a [128, 16] x [16, 64] product differently from two [16, 32] ones: fp32
    # rounding, up to 1e-6 absolute here
    want = interpret(g, inputs)[0]
    np.testing.assert_allclose(interpret(after, inputs)[0], want, rtol=1e-5, atol=1e-5)
    decode = parse(SWIGLU.replace("128", "4"))
    assert print_graph(Simplify().run(decode, CTX)).count("matmul") == 1


def test_a_sum_over_no_axes_of_a_transpose_stays():
    """A reduce_sum over no axes reads a transpose and keeps it: no run of axes to sum."""
    text = """graph @main(%0: f32[4,6]) {
  %1 = transpose %0 {perm=[1,0]} : f32[6,4]
  %2 = reduce_sum %1 {axes=[], keepdim=false} : f32[6,4]
  return %2
}
"""
    assert print_graph(Simplify().run(parse(text), CTX)) == text


def test_a_loop_of_slice_scatters_is_one_concat(fresh):
    """Note [scatters into concats]: `out[:, i] = step(x[:, i])` over 6 steps, functionalised
    (select_scatter as slice_scatter: a concat per step, each copying the whole buffer), is
    one concat of the steps' results once simplified, and equals eager."""

    def f(x):
        out = torch.zeros(4, 6, 8)
        for i in range(6):
            out[:, i] = torch.tanh(x[:, i]) * (i + 1)
        return out

    x = torch.randn(4, 6, 8)
    got = torch.compile(f, backend="neuron", options={"fallback": False})(x)
    torch.testing.assert_close(got, f(x))
    from neuroncc.frontend.decompositions import DECOMPOSITIONS
    from neuroncc.frontend.fx_import import import_fx

    functional = torch.func.functionalize(f)
    gm = torch.fx.experimental.proxy_tensor.make_fx(functional, DECOMPOSITIONS)(x)
    after = Simplify().run(import_fx(gm).graph, CTX)
    assert [n.op for n in after.nodes].count(Op.CONCAT) == 1


@pytest.mark.parametrize("concat_is_output", [False, True])
def test_slices_of_concats_are_their_parts(concat_is_output):
    """_slice_of_concat and _concat_of_concats: slices within a part, across parts, of a part
    of the inner concat, of everything, and with a step (left alone): the interpreter's values
    before and after. A slice across parts is a concat of them only where nothing but slices
    reads the concat (it then dies); where the concat is made anyway, it stays a slice."""
    b = GraphBuilder()
    x = b.input(TensorType((3, 10, 4), DType.F32))
    y = b.input(TensorType((3, 5, 4), DType.F32))
    inner = b.op(Op.CONCAT, x, y, x, axis=1)  # [3, 25, 4]
    outer = b.op(Op.CONCAT, inner, b.op(Op.EXP, y), axis=1)  # [3, 30, 4]
    outs = [outer] if concat_is_output else []
    for lo, hi in [(0, 10), (3, 12), (9, 26), (10, 15), (24, 30), (0, 30)]:
        outs.append(b.op(Op.SLICE, outer, starts=[1, lo, 1], stops=[3, hi, 4], steps=[1, 1, 1]))
    outs.append(b.op(Op.SLICE, outer, starts=[0, 4, 0], stops=[3, 20, 4], steps=[1, 2, 1]))
    before = b.build(outs)
    after = Simplify().run(before, CTX)
    inputs = [random_input(v.type) for v in before.inputs]
    for a, want in zip(interpret(after, inputs), interpret(before, inputs), strict=True):
        np.testing.assert_array_equal(a, want)
    producers = {n.out.id: n for n in after.nodes}
    sliced_concats = [
        n
        for n in after.nodes
        if n.op is Op.SLICE
        and set(n.attr("steps")) == {1}
        and getattr(producers.get(n.inputs[0].id), "op", None) is Op.CONCAT
    ]
    assert len(sliced_concats) == (4 if concat_is_output else 0)  # (3,12) (9,26) (24,30) (0,30)
