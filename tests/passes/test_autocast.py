"""auto-cast: fp32 matmuls become bf16 matmuls between casts; golden IR, and end to end the
numbers of a bf16 matmul with fp32 accumulation, in less simulated time."""

import pytest
import torch

import neuroncc
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.ir import parse, print_graph
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline

BEFORE = """
graph @main(%0: f32[4,8], %1: f32[8,16], %2: f32[16,2]) {
  %3 = matmul %0, %1 : f32[4,16]
  %4 = tanh %3 : f32[4,16]
  %5 = matmul %4, %2 : f32[4,2]
  %6 = matmul %0, %1 : f32[4,16]
  return %5, %6
}
"""

# The shared operands are cast once (simplify's CSE), the two identical matmuls are one.
AFTER = """
graph @main(%0: f32[4,8], %1: f32[8,16], %2: f32[16,2]) {
  %7 = cast %0 {dtype=bf16} : bf16[4,8]
  %8 = cast %1 {dtype=bf16} : bf16[8,16]
  %9 = matmul %7, %8 : bf16[4,16]
  %3 = cast %9 {dtype=f32} : f32[4,16]
  %4 = tanh %3 : f32[4,16]
  %10 = cast %4 {dtype=bf16} : bf16[4,16]
  %11 = cast %2 {dtype=bf16} : bf16[16,2]
  %12 = matmul %10, %11 : bf16[4,2]
  %5 = cast %12 {dtype=f32} : f32[4,2]
  return %5, %3
}
"""


def test_auto_cast_golden_ir():
    pipeline = default_pipeline(1, auto_cast="matmul")
    assert [p.name for p in pipeline] == ["auto-cast", "simplify"]
    got = run_pipeline(parse(BEFORE.strip()), pipeline, PassContext(TRN2)).graph
    assert print_graph(got).strip() == AFTER.strip()


def test_auto_cast_is_off_by_default():
    assert "auto-cast" not in [p.name for p in default_pipeline(2)]


def _mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


@pytest.mark.parametrize("opt_level", [0, 2])
def test_auto_cast_matmul_is_a_bf16_matmul_with_fp32_accumulation(fresh, opt_level):
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(256, 512), torch.randn(512, 256), torch.randn(256, 128)
    results = {}
    for auto_cast in (None, "matmul"):
        torch._dynamo.reset()
        options = {"auto_cast": auto_cast, "opt_level": opt_level}
        results[auto_cast] = torch.compile(_mlp, backend="neuron", options=options)(x, w1, w2)
    bf = torch.bfloat16
    h = torch.relu((x.to(bf) @ w1.to(bf)).float())
    expected = (h.to(bf) @ w2.to(bf)).float()
    # Outputs are ~250 in magnitude: a bf16 rounding of h that summation order flips moves an
    # output by a fraction of 1.
    torch.testing.assert_close(results["matmul"], expected, rtol=1e-2, atol=0.5)
    torch.testing.assert_close(results[None], _mlp(x, w1, w2), rtol=1e-4, atol=1e-3)
    assert not torch.equal(results["matmul"], results[None])  # the cast is real


def test_auto_cast_speeds_up_a_compute_bound_matmul(fresh):
    x, w = torch.randn(2048, 2048), torch.randn(2048, 2048)
    device = {}
    for auto_cast in (None, "matmul"):
        torch._dynamo.reset()
        neuroncc.reset_stats()
        options = {"auto_cast": auto_cast, "timing_only": True}
        with pytest.warns(UserWarning, match="timing_only"):
            torch.compile(torch.matmul, backend="neuron", options=options)(x, w)
        device[auto_cast] = neuroncc.stats()["device_seconds"]
    # TensorE runs bf16 at 4x its fp32 rate; the casts are kernels of their own (HBM traffic).
    assert device["matmul"] < device[None] / 1.5
