"""tile: matmul blocks as large as PSUM and SBUF allow; any tiling that fits computes the same
numbers, larger blocks read B fewer times, and codegen refuses blocks that do not fit."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuroncc.codegen.hardware.targets import TARGETS, TRN2
from neuroncc.codegen.kernels.emit_matmul import largest_blocking, matmul_blockings
from neuroncc.codegen.lower import emit_graph
from neuroncc.errors import CodegenError
from neuroncc.ir import interpret, parse, print_graph
from neuroncc.ir.graph import with_choices
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.layout import Layout
from neuroncc.passes.manager import PassContext
from neuroncc.passes.tile import Tile
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import time_executable
from tests.codegen.kernels.test_emit import random_input

CTX = PassContext(TRN2)

MLP = """graph @main(%0: bf16[512,256], %1: bf16[256,1024], %2: bf16[1024,256]) {
  %3 = matmul %0, %1 : bf16[512,1024]
  %4 = gelu %3 : bf16[512,1024]
  %5 = matmul %4, %2 : bf16[512,256]
  return %5
}
"""

# Four M tiles per block (all of M); the first matmul's two N tiles share the remaining banks.
TILED = """graph @main(%0: bf16[512,256], %1: bf16[256,1024], %2: bf16[1024,256]) {
  fuse {
    %3 = matmul %0, %1 : bf16[512,1024] [tile=[4,1]]
    %4 = gelu %3 : bf16[512,1024]
  }
  %5 = matmul %4, %2 : bf16[512,256] [tile=[4,1]]
  return %5
}
"""


def _tiled(text: str):
    g = parse(text)
    return Tile().run(Layout().run(Fuse().run(g, CTX), CTX), CTX)


def test_tile_choices_golden():
    assert print_graph(_tiled(MLP)) == TILED


def test_blocks_read_b_fewer_times_and_run_faster_than_single_tiles():
    tiled = _tiled(MLP)
    untiled = replace(tiled, choices=())
    fast, slow = (time_executable(emit_graph(g, TRN2), TRN2) for g in (tiled, untiled))
    assert fast.hbm_read_bytes < slow.hbm_read_bytes
    assert fast.device_ns < slow.device_ns


def test_a_tile_that_does_not_fit_is_refused():
    g = with_choices(parse(MLP), "tile", {5: (16, 1)})
    with pytest.raises(CodegenError, match=r"tile=\[16, 1\] does not fit SBUF/PSUM: at most 4x"):
        emit_graph(g, TRN2)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 300),
    st.integers(1, 1100),
    st.integers(1, 8),
    st.integers(1, 8),
)
def test_every_tiling_that_fits_computes_the_same(m, k, n, tm, tn):
    g = parse(
        f"graph @main(%0: f32[{m},{k}], %1: f32[{k},{n}]) {{\n"
        f"  %2 = matmul %0, %1 : f32[{m},{n}]\n  return %2\n}}"
    )
    largest = largest_blocking(g.nodes[0], [], False, TRN2)
    tm = min(tm, largest.tm)
    tn = max(1, min(tn, 7 // tm))  # 8 PSUM banks, one kept for transposing A
    inputs = [random_input(v.type) for v in g.inputs]
    got = run(emit_graph(with_choices(g, "tile", {2: (tm, tn)}), TRN2), inputs, TRN2)
    np.testing.assert_allclose(got[0], interpret(g, inputs)[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize(("m", "k", "n"), [(1024, 512, 2048), (640, 1024, 1536)])
def test_the_chosen_blocks_are_what_the_simulator_times_fastest(target, m, k, n):
    """The pass prices every blocking that fits (emit_matmul.blocked_ns: TensorE against the
    DMA queues, B's rows as wide as a step) and takes the cheapest: within 5% of the fastest
    the timing model gives."""
    t = TARGETS[target]
    g = parse(
        f"graph @main(%0: bf16[{m},{k}], %1: bf16[{k},{n}]) {{\n"
        f"  %2 = matmul %0, %1 : bf16[{m},{n}]\n  return %2\n}}"
    )
    chosen = tuple(Tile().run(g, PassContext(t)).choice(2, "tile"))
    times = {
        (b.tm, b.tn): time_executable(
            emit_graph(with_choices(g, "tile", {2: (b.tm, b.tn)}), t), t
        ).device_ns
        for b in matmul_blockings(g.nodes[0], [], False, t)
    }
    assert times[chosen] <= 1.05 * min(times.values()), (chosen, times)
