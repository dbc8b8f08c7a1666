"""layout: each transpose folded into its matmuls, or on TensorE or the DMA, whichever the cost
model prices lower; codegen follows the choice and refuses one it cannot honour."""

import math

import numpy as np
import pytest

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN1, TRN2
from neuroncc.codegen.lower import emit_graph
from neuroncc.errors import CodegenError
from neuroncc.ir import interpret, parse, print_graph
from neuroncc.ir.graph import with_choices
from neuroncc.passes.layout import Layout, dma_transpose_ns, pe_ns
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import time_executable
from tests.codegen.kernels.test_emit import random_input

TRANSPOSES = """graph @main(%0: f32[256,512], %1: f32[512,128], %2: i32[4,6], %3: f32[8,16], %4: f32[4,8,16]) {
  %5 = transpose %0 {perm=[1,0]} : f32[512,256]
  %6 = matmul %5, %0 : f32[512,512]
  %7 = transpose %1 {perm=[1,0]} : f32[128,512]
  %8 = exp %7 : f32[128,512]
  %9 = transpose %2 {perm=[1,0]} : i32[6,4]
  %10 = transpose %3 {perm=[1,0]} : f32[16,8]
  %11 = transpose %4 {perm=[1,0,2]} : f32[8,4,16]
  return %6, %8, %9, %10, %11
}
"""

# %5 only feeds a matmul's left operand: folded. %7 is large: TensorE. %9 (integers) and %11
# (keeps the last axis) cannot go on TensorE; %10 is small enough that one DMA beats building
# the identity.
CHOSEN = """graph @main(%0: f32[256,512], %1: f32[512,128], %2: i32[4,6], %3: f32[8,16], %4: f32[4,8,16]) {
  %5 = transpose %0 {perm=[1,0]} : f32[512,256] [layout=fold]
  %6 = matmul %5, %0 : f32[512,512]
  %7 = transpose %1 {perm=[1,0]} : f32[128,512] [layout=pe]
  %8 = exp %7 : f32[128,512]
  %9 = transpose %2 {perm=[1,0]} : i32[6,4] [layout=dma]
  %10 = transpose %3 {perm=[1,0]} : f32[16,8] [layout=dma]
  %11 = transpose %4 {perm=[1,0,2]} : f32[8,4,16] [layout=dma]
  return %6, %8, %9, %10, %11
}
"""


def test_layout_choices_golden_and_exact():
    g = parse(TRANSPOSES)
    chosen = Layout().run(g, PassContext(TRN2))
    assert print_graph(chosen) == CHOSEN
    assert parse(CHOSEN) == chosen
    inputs = [random_input(v.type) for v in g.inputs]
    got = run(emit_graph(chosen, TRN2), inputs, TRN2)
    for a, b in zip(got, interpret(g, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)  # K=256 fp32 sums


def test_trn1_transposes_on_tensore_and_spreads_what_is_not_finite():
    """trn1 has no exact transpose mode: its TensorE transposes multiply by the identity, exact
    for finite data; an inf spreads NaN over the rest of its column, as on the hardware
    (nki.isa.nc_transpose), with a warning. trn2's transpose mode moves it as it is."""
    g = parse(TRANSPOSES)
    chosen = Layout().run(g, PassContext(TRN1))
    assert chosen.choice(7, "layout") == "pe" and chosen.choice(5, "layout") == "fold"
    inputs = [random_input(v.type) for v in g.inputs]
    want = interpret(g, inputs)
    for a, b in zip(run(emit_graph(chosen, TRN1), inputs, TRN1), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    inputs[1][3, 5] = np.inf  # %7 = %1^T: row 5, column 3
    exact = run(emit_graph(Layout().run(g, PassContext(TRN2)), TRN2), inputs, TRN2)[1]
    assert np.array_equal(exact, np.exp(inputs[1].T))
    with pytest.warns(RuntimeWarning, match="NaN"):
        spread = run(emit_graph(chosen, TRN1), inputs, TRN1)[1]
    assert spread[5, 3] == np.inf and np.isnan(spread[5, :128]).sum() == 127
    assert np.array_equal(spread[5, 128:], exact[5, 128:]) and np.isfinite(spread[:5]).all()


def _transpose(r: int, c: int):
    return parse(
        f"graph @main(%0: f32[{r},{c}]) {{\n"
        f"  %1 = transpose %0 {{perm=[1,0]}} : f32[{c},{r}]\n  return %1\n}}"
    )


@pytest.mark.parametrize("shape", [(2, 3), (8, 16), (16, 32), (128, 128), (4, 4096), (4096, 4)])
def test_the_choice_is_what_the_simulator_times_faster(shape):
    g = _transpose(*shape)
    times = {
        layout: time_executable(emit_graph(with_choices(g, "layout", {1: layout}), TRN2), TRN2)
        for layout in ("pe", "dma")
    }
    faster = min(times, key=lambda k: times[k].device_ns)
    assert Layout().run(g, PassContext(TRN2)).choice(1, "layout") == faster
    # The estimates are the simulator's costs of the same instructions, within 20%.
    n = g.nodes[0]
    for layout, estimate in (("pe", pe_ns(n, TRN2)), ("dma", dma_transpose_ns(n, TRN2))):
        assert estimate == pytest.approx(times[layout].device_ns, rel=0.2), layout


@pytest.mark.parametrize(
    ("node", "layout", "message"),
    [
        (7, "fold", "layout=fold needs a last-two-axes transpose read only by matmuls"),
        (9, "pe", "layout=pe needs float data"),
        (11, "pe", "layout=pe needs float data"),
    ],
)
def test_codegen_refuses_a_layout_it_cannot_honour(node, layout, message):
    g = with_choices(parse(TRANSPOSES), "layout", {node: layout})
    with pytest.raises(CodegenError, match=message):
        emit_graph(g, TRN2)


def _linear(rows: int, n: int, k: int, dtype: str = "f32", epilogue: bool = False):
    tail = f"  %5 = tanh %4 : {dtype}[{rows},{n}]\n  return %5" if epilogue else "  return %4"
    return parse(
        f"graph @main(%0: {dtype}[{rows},{k}], %1: {dtype}[{n},{k}]) {{\n"
        f"  %3 = transpose %1 {{perm=[1,0]}} : {dtype}[{k},{n}]\n"
        f"  %4 = matmul %0, %3 : {dtype}[{rows},{n}]\n{tail}\n}}"
    )


def _compiled_exactly(g, layout=None, tol=1e-4):
    """g through the default pipeline (its transpose %3's layout then forced, if given),
    emitted, simulated and checked against the interpreter."""
    compiled = run_pipeline(g, default_pipeline(2), PassContext(TRN2)).graph
    if layout is not None:
        compiled = with_choices(compiled, "layout", {3: layout})
    exe = emit_graph(compiled, TRN2)
    inputs = [random_input(v.type) for v in g.inputs]
    for a, b in zip(run(exe, inputs, TRN2), interpret(g, inputs), strict=True):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=tol, atol=tol)
    return compiled, exe


@pytest.mark.parametrize(
    ("rows", "n", "k", "epilogue"), [(1, 1536, 512, False), (1, 600, 2500, True)]
)
def test_a_decode_step_linear_is_dot_products_with_the_weight_rows(rows, n, k, epilogue):
    compiled, exe = _compiled_exactly(_linear(rows, n, k, "f32", epilogue))
    assert compiled.choice(3, "layout") == "dot" and compiled.choice(4, "tile") is None
    # W is read as it is: TensorE only turns the gathered [128, blocks] results into rows of out
    transposes = [ins for ins in exe.instructions if isinstance(ins, isa.Matmul)]
    assert all(t.transpose and t.stationary.free_elems <= n // 128 for t in transposes)
    assert len(transposes) == math.ceil(n // 128 / 128) + (n % 128 > 0)
    stores = [i.dst for i in exe.instructions if isinstance(i, isa.Dma)]
    stores = [d for d in stores if isinstance(d, isa.DramRef)]
    assert min(d.contiguous_run() for d in stores) >= (n % 128 or 128)  # no 4-byte descriptors


BIAS_AFTER = """graph @main(%0: f32[64,64], %1: f32[192,64], %2: f32[192]) {
  %3 = transpose %1 {perm=[1,0]} : f32[64,192]
  %4 = matmul %0, %3 : f32[64,192]
  %5 = reshape %2 {shape=[1,192]} : f32[1,192]
  %6 = broadcast %5 {shape=[64,192]} : f32[64,192]
  %7 = add %4, %6 : f32[64,192]
  return %7
}"""


def test_dot_products_then_an_epilogue_that_starts_with_the_bias():
    """The epilogue runs after the dot products as a kernel of its own, laid out as the
    product's rows, not as its first node's [1, 192]."""
    _compiled_exactly(parse(BIAS_AFTER), layout="dot")


def test_dot_products_in_bf16():
    _compiled_exactly(_linear(2, 256, 200, "bf16", epilogue=True), layout="dot", tol=1e-2)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_weight_transposed_inside_its_matmul_never_goes_through_hbm(dtype):
    g = _linear(300, 700, 650, dtype, epilogue=True)
    compiled, exe = _compiled_exactly(g, tol=1e-2 if dtype == "bf16" else 1e-3)
    assert compiled.choice(3, "layout") == "fold"
    assert [k.name for k in exe.kernels if k.stop > k.start] == ["fused.4-5"]  # no transpose
    assert {b.name for b in exe.buffers} == {"in0", "in1", "v5"}  # and no W^T buffer


def test_the_chosen_weight_layout_is_what_the_simulator_times_fastest():
    for rows in (1, 4, 16):  # 16 rows of 512: all the x that emit_gemv keeps broadcast
        g = _linear(rows, 1024, 512)
        times = {
            layout: time_executable(emit_graph(with_choices(g, "layout", {3: layout}), TRN2), TRN2)
            for layout in ("dot", "fold", "pe")
        }
        fastest = min(times, key=lambda k: times[k].device_ns)
        assert Layout().run(g, PassContext(TRN2)).choice(3, "layout") == fastest, rows


def test_an_empty_transpose_is_a_dma_of_nothing():
    g = _transpose(0, 4)
    chosen = Layout().run(g, PassContext(TRN2))
    assert chosen.choice(1, "layout") == "dma"
    assert run(emit_graph(chosen, TRN2), [np.zeros((0, 4), np.float32)], TRN2)[0].shape == (4, 0)
