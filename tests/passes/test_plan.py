"""plan: temporaries with disjoint lifetimes share HBM bytes; the footprint shrinks, the numbers
do not change, and no two values alive at once ever overlap."""

import numpy as np
import pytest
from hypothesis import given, settings

from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.codegen.lower import emit_graph
from neuroncc.errors import CodegenError
from neuroncc.ir import interpret, parse, print_graph
from neuroncc.ir.graph import with_choices
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.passes.plan import Plan, value_lifetimes
from neuroncc.runtime.simulator import run
from tests.codegen.kernels.test_emit import random_input
from tests.strategies import graphs

CTX = PassContext(TRN2)

CHAIN = """graph @main(%0: f32[64,64]) {
  %1 = exp %0 : f32[64,64]
  %2 = neg %1 : f32[64,64]
  %3 = exp %2 : f32[64,64]
  %4 = neg %3 : f32[64,64]
  %5 = reshape %4 {shape=[4096]} : f32[4096]
  %6 = add %4, %1 : f32[64,64]
  return %6, %5
}
"""

# %1 lives to the end (the add reads it), %2 and %3 overlap at the kernel that makes %3, so %4
# (made after %2's last reader) takes %2's bytes. %4 is viewed by the output %5: it is never
# freed, but %5 itself, a reshape, has no buffer to place.
PLANNED = """graph @main(%0: f32[64,64]) {
  %1 = exp %0 : f32[64,64] [hbm=0]
  %2 = neg %1 : f32[64,64] [hbm=16384]
  %3 = exp %2 : f32[64,64] [hbm=32768]
  %4 = neg %3 : f32[64,64] [hbm=16384]
  %5 = reshape %4 {shape=[4096]} : f32[4096]
  %6 = add %4, %1 : f32[64,64]
  return %6, %5
}
"""


def test_plan_golden_and_exact():
    g = parse(CHAIN)
    planned = Plan().run(g, CTX)
    assert print_graph(planned) == PLANNED
    assert value_lifetimes(g)[4] == (3, 6)  # past the last kernel: the output %5 views it
    inputs = [random_input(v.type) for v in g.inputs]
    exe = emit_graph(planned, TRN2)
    assert exe.hbm_bytes < emit_graph(g, TRN2).hbm_bytes
    for a, b in zip(run(exe, inputs, TRN2), interpret(g, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


WIDENED = """graph @main(%0: bf16[64,64]) {
  %1 = neg %0 : bf16[64,64]
  %2 = cast %1 {dtype=f32} : f32[64,64]
  %3 = exp %2 : f32[64,64]
  %4 = neg %3 : f32[64,64]
  return %4, %2
}
"""


def test_a_value_lives_for_the_readers_of_its_widening_cast():
    """Attention reads bf16 q and k through the cast SDPA widens them with (Note [widened
    scores]): %1 lives to the last reader of its cast %2 (the exp), not only to the cast;
    %2 being saved as an output keeps %2 to the end, not %1."""
    assert value_lifetimes(parse(WIDENED))[1] == (0, 2)


def _deep_mlp(layers: int, rows: int = 256, dim: int = 256) -> str:
    lines = [f"graph @main(%0: f32[{rows},{dim}], %1: f32[{dim},{dim}]) {{"]
    x = 0
    for i in range(layers):
        y = 2 + 2 * i
        lines.append(f"  %{y} = matmul %{x}, %1 : f32[{rows},{dim}]")
        lines.append(f"  %{y + 1} = tanh %{y} : f32[{rows},{dim}]")
        x = y + 1
    return "\n".join([*lines, f"  return %{x}", "}"])


def test_a_deep_chain_needs_a_few_buffers_not_one_per_layer():
    g = parse(_deep_mlp(8))
    planned = run_pipeline(g, default_pipeline(2), CTX).graph
    unplanned = run_pipeline(g, default_pipeline(2)[:-1], CTX).graph
    small, big = emit_graph(planned, TRN2), emit_graph(unplanned, TRN2)
    activation = 256 * 256 * 4
    assert big.hbm_bytes - small.hbm_bytes >= 5 * activation
    inputs = [random_input(v.type) / 16 for v in g.inputs]
    np.testing.assert_allclose(
        run(small, inputs, TRN2)[0], interpret(g, inputs)[0], rtol=1e-4, atol=1e-5
    )


@settings(max_examples=40, deadline=None)
@given(graphs(max_nodes=12))
def test_values_alive_at_once_never_share_bytes(g):
    planned = run_pipeline(g, default_pipeline(2), CTX).graph
    lifetimes = value_lifetimes(planned)
    sizes = {n.out.id: n.out.type.nbytes for n in planned.nodes}
    placed = [(vid, planned.choice(vid, "hbm")) for vid in lifetimes]
    assert all(at is not None for _, at in placed)  # every stored value has its place
    for i, (a, at_a) in enumerate(placed):
        for b, at_b in placed[i + 1 :]:
            (fa, la), (fb, lb) = lifetimes[a], lifetimes[b]
            if fa <= lb and fb <= la:
                assert at_a + sizes[a] <= at_b or at_b + sizes[b] <= at_a, (a, b)


def test_an_output_cannot_be_placed_in_the_arena():
    g = with_choices(parse(CHAIN), "hbm", {6: 0})
    with pytest.raises(CodegenError, match="%6 is a graph output: it has a buffer of its own"):
        emit_graph(g, TRN2)
