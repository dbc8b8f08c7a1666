"""Matmul epilogues (Note [matmul epilogue]): the elementwise work after a matmul runs on each
result tile as it leaves PSUM. Golden IR, hypothesis-generated shapes and epilogues against the
reference interpreter, and the HBM traffic it saves."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroncc
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.codegen.kernels.emit_matmul import O_BUFS
from neuroncc.codegen.lower import emit_graph
from neuroncc.ir import DType, GraphBuilder, Op, TensorType, interpret, parse, print_graph
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import PassContext
from neuroncc.passes.tile import Tile
from neuroncc.runtime.simulator import run
from neuroncc.runtime.stats import STATS
from neuroncc.runtime.timing import time_executable
from tests.codegen.kernels.test_emit import random_input

CTX = PassContext(TRN2)

LINEAR_GELU = """graph @main(%0: f32[128,64], %1: f32[64,256], %2: f32[256]) {
  %3 = matmul %0, %1 : f32[128,256]
  %4 = reshape %2 {shape=[1,256]} : f32[1,256]
  %5 = broadcast %4 {shape=[128,256]} : f32[128,256]
  %6 = add %3, %5 : f32[128,256]
  %7 = gelu %6 : f32[128,256]
  %8 = reduce_sum %7 {axes=[1], keepdim=false} : f32[128]
  return %8
}
"""

# The reduction is not part of the epilogue (a PSUM tile holds a piece of each row).
LINEAR_GELU_FUSED = """graph @main(%0: f32[128,64], %1: f32[64,256], %2: f32[256]) {
  fuse {
    %3 = matmul %0, %1 : f32[128,256]
    %4 = reshape %2 {shape=[1,256]} : f32[1,256]
    %5 = broadcast %4 {shape=[128,256]} : f32[128,256]
    %6 = add %3, %5 : f32[128,256]
    %7 = gelu %6 : f32[128,256]
  }
  %8 = reduce_sum %7 {axes=[1], keepdim=false} : f32[128]
  return %8
}
"""


def test_linear_bias_gelu_is_one_kernel_golden():
    fused = Fuse().run(parse(LINEAR_GELU), CTX)
    assert print_graph(fused) == LINEAR_GELU_FUSED
    exe = emit_graph(fused, TRN2)
    assert [b.name for b in exe.buffers if b.kind == "temp"] == ["v7"]  # no raw product in HBM


def _check(g):
    fused = Fuse().run(g, CTX)
    inputs = [random_input(v.type) for v in g.inputs]
    got = run(emit_graph(fused, TRN2), inputs, TRN2)
    # A bf16 rounding anywhere lets summation order (PSUM tiles vs numpy) flip an ulp.
    bf16 = any(n.out.type.dtype == DType.BF16 for n in g.nodes)
    for a, b in zip(got, interpret(g, inputs), strict=True):
        np.testing.assert_allclose(
            a.astype(np.float32),
            b.astype(np.float32),
            rtol=2e-2 if bf16 else 1e-5,
            # bf16 sums that nearly cancel lose their relative precision: bound by magnitude.
            atol=2e-2 * float(np.abs(b.astype(np.float32)).max(initial=1.0)) if bf16 else 1e-4,
        )
    return fused


EPILOGUE_OPS = ("bias", "residual", "scale", "gelu", "relu", "tanh", "cast")


@settings(max_examples=25, deadline=None)
@given(
    batch=st.sampled_from([(), (2,)]),
    m=st.integers(1, 300),
    k=st.integers(1, 200),
    n=st.integers(1, 700),
    ops=st.lists(st.sampled_from(EPILOGUE_OPS), min_size=1, max_size=4),
    keep_product=st.booleans(),
)
def test_epilogues_compute_what_the_interpreter_computes(batch, m, k, n, ops, keep_product):
    b = GraphBuilder()
    a = b.input(TensorType((*batch, m, k), DType.F32))
    w = b.input(TensorType((*batch, k, n), DType.F32))
    full = (*batch, m, n)
    mm = y = b.op(Op.MATMUL, a, w)
    for op in ops:
        if op == "bias":
            bias = b.op(
                Op.RESHAPE,
                b.input(TensorType((n,), y.type.dtype)),
                shape=(*[1] * len(full[:-1]), n),
            )
            y = b.op(Op.ADD, y, b.op(Op.BROADCAST, bias, shape=full))
        elif op == "residual":
            y = b.op(Op.ADD, y, b.input(TensorType(full, y.type.dtype)))
        elif op == "scale":
            y = b.op(Op.MUL, y, b.op(Op.FULL, shape=full, value=0.125, dtype=y.type.dtype))
        elif op == "cast":
            y = b.op(Op.CAST, y, dtype=DType.BF16 if y.type.dtype == DType.F32 else DType.F32)
        else:
            y = b.op({"gelu": Op.GELU, "relu": Op.RELU, "tanh": Op.TANH}[op], y)
    g = b.build([y, mm] if keep_product else [y])
    fused = _check(g)
    if m > 1 and n > 1:  # (a [1, 1] bias row is a full value, which the row plan declines)
        assert fused.kernels and fused.kernels[0][0] == mm.id  # the matmul heads a group


def test_the_epilogue_saves_the_products_round_trip_through_hbm():
    g = parse(LINEAR_GELU)
    fused, unfused = Fuse().run(g, CTX), g
    hbm = [time_executable(emit_graph(x, TRN2), TRN2).hbm_bytes for x in (fused, unfused)]
    product = 128 * 256 * 4
    assert hbm[1] - hbm[0] >= 2 * product  # written and read back (and more) without it


def test_ops_after_a_matmul_that_do_not_read_it_still_fuse_among_themselves():
    b = GraphBuilder()
    a, w = b.input(TensorType((16, 8), DType.F32)), b.input(TensorType((8, 32), DType.F32))
    x = b.input(TensorType((16, 32), DType.F32))
    mm = b.op(Op.MATMUL, a, w)
    y = b.op(Op.ADD, b.op(Op.EXP, x), x)
    fused = _check(b.build([mm, y]))
    assert fused.kernels == ((y.id - 1, y.id),)  # exp and add; the matmul alone


# An attention backward's softmax step: D = rowsum(dO * O) comes between dP = dO V^T and
# dS = P * (dP - D), and D has a leading unit dim the matmul's rows do not.
SOFTMAX_BACKWARD = """graph @main(%0: f32[2,64,32], %1: f32[2,32,96], %2: f32[1,2,64,32], %3: f32[1,2,64,96]) {
  %4 = matmul %0, %1 : f32[2,64,96]
  %5 = reshape %4 {shape=[1,2,64,96]} : f32[1,2,64,96]
  %6 = reshape %0 {shape=[1,2,64,32]} : f32[1,2,64,32]
  %7 = mul %6, %2 : f32[1,2,64,32]
  %8 = reduce_sum %7 {axes=[3], keepdim=false} : f32[1,2,64]
  %9 = reshape %8 {shape=[1,2,64,1]} : f32[1,2,64,1]
  %10 = broadcast %9 {shape=[1,2,64,96]} : f32[1,2,64,96]
  %11 = sub %5, %10 : f32[1,2,64,96]
  %12 = mul %3, %11 : f32[1,2,64,96]
  return %12
}
"""

SOFTMAX_BACKWARD_FUSED = """graph @main(%0: f32[2,64,32], %1: f32[2,32,96], %2: f32[1,2,64,32], %3: f32[1,2,64,96]) {
  fuse {
    %6 = reshape %0 {shape=[1,2,64,32]} : f32[1,2,64,32]
    %7 = mul %6, %2 : f32[1,2,64,32]
    %8 = reduce_sum %7 {axes=[3], keepdim=false} : f32[1,2,64]
  }
  fuse {
    %4 = matmul %0, %1 : f32[2,64,96]
    %5 = reshape %4 {shape=[1,2,64,96]} : f32[1,2,64,96]
    %9 = reshape %8 {shape=[1,2,64,1]} : f32[1,2,64,1]
    %10 = broadcast %9 {shape=[1,2,64,96]} : f32[1,2,64,96]
    %11 = sub %5, %10 : f32[1,2,64,96]
    %12 = mul %3, %11 : f32[1,2,64,96]
  }
  return %12
}
"""


def test_work_between_a_matmul_and_its_epilogue_moves_ahead_golden():
    """What does not read the product moves ahead of the matmul, so dP = dO V^T never goes
    to HBM: its epilogue reads D (one value per row, under a unit dim) and P as it leaves
    PSUM."""
    g = parse(SOFTMAX_BACKWARD)
    assert print_graph(Fuse().run(g, CTX)) == SOFTMAX_BACKWARD_FUSED
    _check(g)


# An MLP backward: g = dY W2 (%3), then the weight gradient (%5) and the bias gradient's
# column sums (%9), then the GELU backward g * gelu'(x) (%6..%8), which needs only g and the
# saved x: it comes two matmuls after g.
GELU_BACKWARD = """graph @main(%0: f32[64,32], %1: f32[32,96], %2: f32[64,96], %10: f32[32,64], %12: f32[1,64]) {
  %3 = matmul %0, %1 : f32[64,96]
  %5 = matmul %10, %2 : f32[32,96]
  %9 = matmul %12, %0 : f32[1,32]
  %6 = erf %2 : f32[64,96]
  %7 = exp %2 : f32[64,96]
  %11 = add %6, %7 : f32[64,96]
  %8 = mul %3, %11 : f32[64,96]
  return %8, %5, %9
}
"""

# The epilogue comes back to g one window per round; gelu'(x), made from x alone, stays with
# it: the product is multiplied by it as it leaves PSUM, instead of gelu'(x) going through
# HBM from a kernel of its own.
GELU_BACKWARD_FUSED = """graph @main(%0: f32[64,32], %1: f32[32,96], %2: f32[64,96], %10: f32[32,64], %12: f32[1,64]) {
  fuse {
    %3 = matmul %0, %1 : f32[64,96]
    %6 = erf %2 : f32[64,96]
    %7 = exp %2 : f32[64,96]
    %11 = add %6, %7 : f32[64,96]
    %8 = mul %3, %11 : f32[64,96]
  }
  %5 = matmul %10, %2 : f32[32,96]
  %9 = matmul %12, %0 : f32[1,32]
  return %8, %5, %9
}
"""


def test_an_epilogue_comes_back_past_other_matmuls_with_its_inputs_golden():
    g = parse(GELU_BACKWARD)
    assert print_graph(Fuse().run(g, CTX)) == GELU_BACKWARD_FUSED
    _check(g)


@pytest.mark.parametrize("laid_out", [False, True])
def test_a_fused_gate_and_up_projection_reads_its_weight_in_place(laid_out, fresh):
    """SwiGLU from one projection chunked in two (Phi-3's gate_up_proj): two matmuls reading
    the halves of W where they are (no slice kernel, no copy of W or of the product), the
    gate with its SiLU and the up half with the product as epilogues. W passed in is read
    as rows of W; a parameter, laid out as Wᵀ (Note [weight layout]), as columns of Wᵀ."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(64, 512, bias=False)

    def swiglu(x, w):
        gate, up = torch.nn.functional.linear(x, proj.weight if laid_out else w).chunk(2, -1)
        return torch.nn.functional.silu(gate) * up

    x = torch.randn(2, 128, 64)
    neuroncc.reset_stats()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(swiglu, backend="neuron")(x, proj.weight.clone())
        torch.testing.assert_close(got, swiglu(x, proj.weight), atol=1e-5, rtol=1e-4)
    assert neuroncc.stats()["weight_layouts"] == laid_out
    (c,) = [c for name, c in STATS.executed().items() if "_layout" not in name]
    kernels = [k.name for k in c.exe.kernels if k.stop > k.start]
    assert not [k for k in kernels if k.startswith("slice.")], kernels
    assert [k.split(".")[0] for k in kernels] == ["fused", "fused"], kernels


def test_a_step_with_more_results_than_copy_tiles():
    """A block of 7 x 128 rows: a step's 7 results leave PSUM 4 at a time (O_BUFS), each
    group's epilogue before the next group's copies take the tiles again (the first of the
    two steps; the last goes one by one)."""
    g = parse("""graph @main(%0: f32[896,128], %1: f32[128,1024], %2: f32[896,1024]) {
  %3 = matmul %0, %1 : f32[896,1024]
  %4 = relu %3 : f32[896,1024]
  %5 = add %4, %2 : f32[896,1024]
  return %5
}
""")
    tiled = Tile().run(Fuse().run(g, CTX), CTX)
    tm, tn = tiled.choice(3, "tile")
    assert tm * tn > O_BUFS and 1024 > tn * 512  # several results per step, two steps
    inputs = [random_input(v.type) for v in g.inputs]
    (got,) = run(emit_graph(tiled, TRN2), inputs, TRN2)
    np.testing.assert_allclose(got, interpret(g, inputs)[0], rtol=1e-5, atol=1e-4)
