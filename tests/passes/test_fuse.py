"""fuse: grouped kernels compute what the unfused graph computes, keep intermediates on chip,
and form only where the row fits in SBUF."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

import neuroncc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN1, TRN2
from neuroncc.codegen.kernels.row_plan import plan
from neuroncc.codegen.lower import emit_graph
from neuroncc.ir import DType, GraphBuilder, Op, TensorType, interpret, parse, print_graph
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import time_executable
from tests.codegen.kernels.test_emit import random_input
from tests.strategies import graphs

CTX = PassContext(TRN2)


@settings(max_examples=60, deadline=None)
@given(graphs(max_nodes=10))
def test_fused_programs_compute_what_the_interpreter_computes(g):
    fused = run_pipeline(g, default_pipeline(2), CTX).graph
    inputs = [random_input(v.type) for v in g.inputs]
    got = run(emit_graph(fused, TRN2), inputs, TRN2)
    for a, b in zip(got, interpret(g, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


SOFTMAX = """
graph @main(%0: f32[4,8]) {
  %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[4,1]
  %2 = broadcast %1 {shape=[4,8]} : f32[4,8]
  %3 = sub %0, %2 : f32[4,8]
  %4 = exp %3 : f32[4,8]
  %5 = reduce_sum %4 {axes=[1], keepdim=false} : f32[4]
  %6 = reshape %5 {shape=[4,1]} : f32[4,1]
  %7 = broadcast %6 {shape=[4,8]} : f32[4,8]
  %8 = div %4, %7 : f32[4,8]
  %9 = transpose %8 {perm=[1,0]} : f32[8,4]
  return %9
}
"""

SOFTMAX_FUSED = """graph @main(%0: f32[4,8]) {
  fuse {
    %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[4,1]
    %2 = broadcast %1 {shape=[4,8]} : f32[4,8]
    %3 = sub %0, %2 : f32[4,8]
    %4 = exp %3 : f32[4,8]
    %5 = reduce_sum %4 {axes=[1], keepdim=false} : f32[4]
    %6 = reshape %5 {shape=[4,1]} : f32[4,1]
    %7 = broadcast %6 {shape=[4,8]} : f32[4,8]
    %8 = div %4, %7 : f32[4,8]
  }
  %9 = transpose %8 {perm=[1,0]} : f32[8,4]
  return %9
}
"""


def test_softmax_becomes_one_kernel_golden():
    fused = Fuse().run(parse(SOFTMAX), CTX)
    assert print_graph(fused) == SOFTMAX_FUSED
    assert parse(SOFTMAX_FUSED) == fused  # the fuse block round-trips


def test_a_row_too_long_for_sbuf_is_not_fused_with_its_reduction():
    """Note [wide rows]: what reads the reduction is a group of its own, walked in chunks."""
    b = GraphBuilder()
    x = b.input(TensorType((128, 48 * 1024), DType.F32))  # 192 KiB per partition
    r = b.op(Op.REDUCE_SUM, x, axes=[1], keepdim=True)
    y = b.op(Op.SUB, x, b.op(Op.BROADCAST, r, shape=(128, 48 * 1024)))
    g = b.build([y])
    assert plan(list(g.nodes), TRN1) is None
    assert plan(list(g.nodes)[1:], TRN1).chunked
    fused = Fuse().run(g, PassContext(TRN1))
    assert fused.kernels == (tuple(n.out.id for n in list(g.nodes)[1:]),)


WIDE_LOG_SOFTMAX = """
graph @main(%0: f32[130,60000]) {
  %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[130,1]
  %2 = broadcast %1 {shape=[130,60000]} : f32[130,60000]
  %3 = sub %0, %2 : f32[130,60000]
  %4 = exp %3 : f32[130,60000]
  %5 = reduce_sum %4 {axes=[1], keepdim=true} : f32[130,1]
  %6 = log %5 : f32[130,1]
  %7 = broadcast %6 {shape=[130,60000]} : f32[130,60000]
  %8 = sub %3, %7 : f32[130,60000]
  return %8
}
"""


def test_a_log_softmax_over_rows_too_long_for_sbuf_is_walked_in_chunks():
    """Note [wide rows]: 234 KB rows (trn2 has 224 KB per partition): the max; x - max, exp
    and their sum (a group); the log of [130, 1]; the output (a group). Five passes over
    [130, 60000] fp32, where the unfused ops write row values broadcast to full rows to HBM and
    read them back (at least twice the time since broadcasts go through SBUF: Note [broadcast
    along rows]; ten times before)."""
    g = parse(WIDE_LOG_SOFTMAX)
    fused = Fuse().run(g, CTX)
    assert [len(k) for k in fused.kernels] == [4, 2]  # (%1 and %6, alone, are no groups)
    x = np.random.default_rng(0).standard_normal((130, 60000)).astype(np.float32) * 3
    exe = emit_graph(fused, TRN2)
    (got,) = run(exe, [x], TRN2)
    np.testing.assert_allclose(got, interpret(g, [x])[0], rtol=1e-5, atol=1e-5)
    profile = time_executable(exe, TRN2)
    assert profile.hbm_bytes < 5.05 * x.nbytes
    unfused = time_executable(emit_graph(g, TRN2), TRN2)
    assert profile.device_ns < unfused.device_ns / 2


@pytest.mark.parametrize(
    ("reduce", "dtype"),
    [
        ("sum", torch.float32),
        ("amax", torch.float32),
        ("amin", torch.bfloat16),
        ("sum", torch.bfloat16),
    ],
)
def test_reductions_over_wide_rows_combine_their_chunks(fresh, reduce, dtype):
    """Each chunk's partial result joins a running fp32 accumulator, cast once at the end;
    the rows' results are stored once, after their last chunk (130 rows: a partial tile)."""
    x = (torch.randn(130, 61000) * 4).to(dtype)

    def f(x):
        return getattr(torch, reduce)(x * 2 + 1, -1)

    got = torch.compile(f, backend="neuron", options={"disk_cache": False})(x)
    torch.testing.assert_close(got, f(x), rtol=1e-4 if dtype == torch.float32 else 2e-2, atol=1e-2)
    stats = neuroncc.stats()
    assert stats["fallback_nodes"] == {} and stats["hbm_bytes"] < 1.05 * x.numel() * x.itemsize


def _norms(x, w, b):
    ln = F.layer_norm(x, (x.shape[-1],), w, b)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return ln, rms, torch.softmax(x, -1)


def test_norms_and_softmax_read_and_write_hbm_once(fresh):
    x, w, b = torch.randn(256, 512), torch.randn(512), torch.randn(512)
    traffic = {}
    for level in (0, 2):
        neuroncc.reset_stats()
        torch._dynamo.reset()
        compiled = torch.compile(_norms, backend="neuron", options={"opt_level": level})
        for got, want in zip(compiled(x, w, b), _norms(x, w, b), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        traffic[level] = neuroncc.stats()["hbm_bytes"]
    # One read of x and one write of each result; w and b are read once per partition (the
    # broadcast load), plus a few row constants.
    assert traffic[2] <= 1.1 * (4 * x.numel() * 4 + 2 * 128 * w.numel() * 4)
    assert traffic[2] < traffic[0] / 4


def test_fusing_softmax_makes_it_faster_on_the_model():
    big = SOFTMAX.replace("[4,", "[512,").replace("[4]", "[512]").replace("8]", "1024]")
    g = parse(big.replace("[8,4]", "[1024,512]"))
    unfused = time_executable(emit_graph(g, TRN2), TRN2).device_ns
    fused = time_executable(emit_graph(Fuse().run(g, CTX), TRN2), TRN2).device_ns
    assert fused < unfused / 3


def test_flat_kernel_with_a_constant_and_a_narrow_last_chunk():
    b = GraphBuilder()
    x = b.input(TensorType((128, 3072), DType.F32))  # flat: 2048-column chunks, then 1024
    two = b.op(Op.FULL, shape=(128, 3072), value=2.0, dtype=DType.F32)
    g = b.build([b.op(Op.EXP, b.op(Op.MUL, x, two))])
    fused = Fuse().run(g, CTX)
    assert fused.kernels
    xs = np.random.default_rng(0).standard_normal((128, 3072)).astype(np.float32)
    (got,) = run(emit_graph(fused, TRN2), [xs], TRN2)
    np.testing.assert_allclose(got, interpret(g, [xs])[0], rtol=1e-6)


def test_a_mask_broadcast_over_heads_is_read_in_place_per_row_step():
    """A [1, 1, S, S] mask added to [B, H, S, S] scores: its rows repeat every S rows of the
    kernel, which 128-row steps cross (S = 40), and it is never materialised."""
    for mask_shape in ((1, 1, 40, 24), (1, 5, 40, 24)):
        b = GraphBuilder()
        x = b.input(TensorType((3, 5, 40, 24), DType.F32))
        mask = b.input(TensorType(mask_shape, DType.F32))
        y = b.op(Op.ADD, x, b.op(Op.BROADCAST, mask, shape=(3, 5, 40, 24)))
        s = b.op(Op.REDUCE_MAX, y, axes=[3], keepdim=True)
        z = b.op(Op.SUB, y, b.op(Op.BROADCAST, s, shape=(3, 5, 40, 24)))
        g = b.build([z])
        fused = Fuse().run(g, CTX)
        assert len(fused.kernels) == 1 and len(fused.kernels[0]) == len(g.nodes)
        inputs = [random_input(v.type) for v in g.inputs]
        exe = emit_graph(fused, TRN2)
        assert not [buf for buf in exe.buffers if buf.kind == "temp"]
        (got,) = run(exe, inputs, TRN2)
        np.testing.assert_allclose(got, interpret(g, inputs)[0], rtol=1e-6)


def test_constants_of_a_group_are_immediates_of_tensor_scalar():
    g = parse(
        """graph @main(%0: f32[256,64]) {
  %1 = full {shape=[256,64], value=3, dtype=f32} : f32[256,64]
  %2 = pow %0, %1 : f32[256,64]
  %3 = reduce_sum %2 {axes=[1], keepdim=true} : f32[256,1]
  %4 = broadcast %3 {shape=[256,64]} : f32[256,64]
  %5 = mul %0, %4 : f32[256,64]
  return %5
}
"""
    )
    fused = Fuse().run(g, CTX)
    assert len(fused.kernels) == 1
    exe = emit_graph(fused, TRN2)
    pows = [i for i in exe.instructions if getattr(i, "op", None) == "pow"]
    assert pows and all(i.opcode == "tensor_scalar" and i.scalar == 3.0 for i in pows)
    x = random_input(g.inputs[0].type)
    np.testing.assert_allclose(run(exe, [x], TRN2)[0], interpret(g, [x])[0], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_softmax_exp_and_sum_are_one_activation_reduce(dtype):
    """exp(x - max) and its row sum: one ScalarE activation_reduce (bias = -max per row)
    instead of a subtraction, an activation and a reduction; the log-sum-exp, read outside
    the group, is still stored."""
    g = parse(
        f"""graph @main(%0: {dtype}[300,200]) {{
  %1 = reduce_max %0 {{axes=[1], keepdim=true}} : {dtype}[300,1]
  %2 = broadcast %1 {{shape=[300,200]}} : {dtype}[300,200]
  %3 = sub %0, %2 : {dtype}[300,200]
  %4 = exp %3 : {dtype}[300,200]
  %5 = reduce_sum %4 {{axes=[1], keepdim=true}} : {dtype}[300,1]
  %6 = broadcast %5 {{shape=[300,200]}} : {dtype}[300,200]
  %7 = div %4, %6 : {dtype}[300,200]
  %8 = log %5 : {dtype}[300,1]
  return %7, %8
}}
"""
    )
    fused = Fuse().run(g, CTX)
    assert len(fused.kernels) == 1
    exe = emit_graph(fused, TRN2)
    opcodes = [i.opcode for i in exe.instructions]
    assert opcodes.count("activation_reduce") == 3  # one per 128-row step
    assert not any(getattr(i, "op", None) in ("sub", "sum") for i in exe.instructions)
    x = random_input(g.inputs[0].type)
    tol = 1e-2 if dtype == "bf16" else 1e-6
    for got, want in zip(run(exe, [x], TRN2), interpret(g, [x]), strict=True):
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol
        )


@pytest.mark.parametrize("square", ["mul %3, %3", "pow %3, %4"])
def test_a_sum_of_squares_is_one_activation_reduce(square):
    """A variance (LayerNorm) or mean square (RMSNorm): x * x and its row sum are one ScalarE
    activation_reduce, not a VectorE multiply and reduction."""
    g = parse(
        f"""graph @main(%0: f32[300,200], %1: f32[300,1]) {{
  %2 = broadcast %1 {{shape=[300,200]}} : f32[300,200]
  %3 = sub %0, %2 : f32[300,200]
  %4 = full {{shape=[300,200], value=2, dtype=f32}} : f32[300,200]
  %5 = {square} : f32[300,200]
  %6 = reduce_sum %5 {{axes=[1], keepdim=true}} : f32[300,1]
  %7 = broadcast %6 {{shape=[300,200]}} : f32[300,200]
  %8 = mul %3, %7 : f32[300,200]
  return %8
}}
"""
    )
    fused = Fuse().run(g, CTX)
    exe = emit_graph(fused, TRN2)
    squares = [i for i in exe.instructions if i.opcode == "activation_reduce"]
    assert len(squares) == 3 and {i.func for i in squares} == {"square"}  # one per row step
    assert not [i for i in exe.instructions if i.opcode == "tensor_reduce"]
    xs = [random_input(v.type) for v in g.inputs]
    np.testing.assert_allclose(run(exe, xs, TRN2)[0], interpret(g, xs)[0], rtol=1e-6)


def test_a_row_kernel_loads_each_step_before_the_step_ahead_is_stored():
    """DMAs share the engines in the order they are issued: a standalone row kernel issues
    step i + 1's load before step i's store (RowKernel.prefetch), so the load does not wait
    behind it."""
    g = parse(
        """graph @main(%0: f32[512,1024]) {
  %1 = reduce_max %0 {axes=[1], keepdim=true} : f32[512,1]
  %2 = broadcast %1 {shape=[512,1024]} : f32[512,1024]
  %3 = sub %0, %2 : f32[512,1024]
  %4 = exp %3 : f32[512,1024]
  %5 = reduce_sum %4 {axes=[1], keepdim=true} : f32[512,1]
  %6 = broadcast %5 {shape=[512,1024]} : f32[512,1024]
  %7 = div %4, %6 : f32[512,1024]
  return %7
}
"""
    )
    exe = emit_graph(Fuse().run(g, CTX), TRN2)
    dmas = [(i, x) for i, x in enumerate(exe.instructions) if x.opcode == "dma"]
    loads = [i for i, x in dmas if isinstance(x.src, isa.DramRef)]
    stores = [i for i, x in dmas if isinstance(x.dst, isa.DramRef)]
    assert len(loads) == len(stores) == 4
    assert all(load < store for load, store in zip(loads[1:], stores, strict=False))
    x = random_input(g.inputs[0].type)
    np.testing.assert_allclose(run(exe, [x], TRN2)[0], interpret(g, [x])[0], rtol=1e-6)


BF16_LAYER_NORM = """graph @main(%0: bf16[300,96], %1: bf16[96], %2: bf16[96]) {
  %3 = cast %0 {dtype=f32} : f32[300,96]
  %4 = reduce_sum %3 {axes=[1], keepdim=true} : f32[300,1]
  %5 = full {shape=[300,1], value=96, dtype=f32} : f32[300,1]
  %6 = div %4, %5 : f32[300,1]
  %7 = broadcast %6 {shape=[300,96]} : f32[300,96]
  %8 = sub %3, %7 : f32[300,96]
  %9 = mul %8, %8 : f32[300,96]
  %10 = reduce_sum %9 {axes=[1], keepdim=true} : f32[300,1]
  %11 = div %10, %5 : f32[300,1]
  %12 = rsqrt %11 : f32[300,1]
  %13 = broadcast %12 {shape=[300,96]} : f32[300,96]
  %14 = mul %8, %13 : f32[300,96]
  %15 = cast %1 {dtype=f32} : f32[96]
  %16 = reshape %15 {shape=[1,96]} : f32[1,96]
  %17 = broadcast %16 {shape=[300,96]} : f32[300,96]
  %18 = mul %14, %17 : f32[300,96]
  %19 = cast %2 {dtype=f32} : f32[96]
  %20 = reshape %19 {shape=[1,96]} : f32[1,96]
  %21 = broadcast %20 {shape=[300,96]} : f32[300,96]
  %22 = add %18, %21 : f32[300,96]
  %23 = cast %22 {dtype=bf16} : bf16[300,96]
  return %23
}
"""


def test_a_bf16_layer_norm_with_weight_and_bias_is_one_kernel_without_cast_passes():
    """The weight and bias, cast to fp32 as the lowering writes them, are col values made once
    per kernel; x is read as bf16 where the cast to fp32 was (Note [widening casts]) and the
    last add writes bf16 itself (Note [narrowing casts]): the only copies are the weight's and
    the bias's, once, over one row."""
    g = parse(BF16_LAYER_NORM)
    fused = Fuse().run(g, CTX)
    assert fused.kernels == (tuple(range(3, 24)),)
    exe = emit_graph(fused, TRN2)
    copies = [x for x in exe.instructions if x.opcode == "tensor_copy"]
    assert len(copies) == 2 and all(x.src.dtype == DType.BF16 for x in copies)
    inputs = [random_input(v.type) for v in g.inputs]
    got, want = run(exe, inputs, TRN2)[0], interpret(g, inputs)[0]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))  # bit for bit


def test_a_widened_value_passed_on_by_a_reshape_is_cast():
    """A cast to fp32 that only a reshape reads is stored as the reshape's fp32 result, so it
    is computed (Note [widening casts] skips only casts the group's arithmetic reads)."""
    g = parse(
        """graph @main(%0: bf16[3,1,2]) {
  %1 = cast %0 {dtype=f32} : f32[3,1,2]
  %2 = reshape %1 {shape=[3,2]} : f32[3,2]
  return %2
}
"""
    )
    fused = Fuse().run(g, CTX)
    assert fused.kernels == ((1, 2),)
    x = random_input(g.inputs[0].type)
    np.testing.assert_array_equal(run(emit_graph(fused, TRN2), [x], TRN2)[0], interpret(g, [x])[0])


@pytest.mark.parametrize("source", ["elementwise", "matmul"])
def test_a_result_in_place_of_a_view_spares_the_values_other_views(fresh, source):
    """A reshape is its input's tile in a fused kernel: `neg` of one view of y may not be
    written over y's tile while another view of y (a graph output) is still to be stored. It
    was, at opt_level 2 (the second output came out negated), found as wrong gradients of
    Qwen3-Next when a node beside such a group ran eagerly."""

    def f(x, w):
        y = x @ w if source == "matmul" else x * 2
        return -(y.view(1, 64, 16)) * 3, y.view(1, 1, 64, 16) + 0

    x, w = torch.randn(64, 16), torch.randn(16, 16)
    got = torch.compile(f, backend="neuron", options={"fallback": False})(x, w)
    for g, want in zip(got, f(x, w), strict=True):
        torch.testing.assert_close(g, want)
