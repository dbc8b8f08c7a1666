"""schedule: transposes of graph inputs (weights) are issued first, so they overlap the first
kernels instead of delaying the matmul that reads them."""

import numpy as np

from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.ir import interpret, parse, print_graph
from neuroncc.passes.manager import PassContext
from neuroncc.passes.schedule import Schedule
from tests.codegen.kernels.test_emit import random_input

BLOCK = """graph @main(%0: f32[8,16], %1: f32[32,16], %2: f32[16,8]) {
  %3 = exp %0 : f32[8,16]
  %4 = transpose %1 {perm=[1,0]} : f32[16,32]
  %5 = matmul %3, %4 : f32[8,32]
  %6 = transpose %5 {perm=[1,0]} : f32[32,8]
  %7 = transpose %2 {perm=[1,0]} : f32[8,16]
  %8 = add %7, %3 : f32[8,16]
  return %6, %8
}
"""

# The weight transposes come first, in their order; the transpose of a computed value stays.
SCHEDULED = """graph @main(%0: f32[8,16], %1: f32[32,16], %2: f32[16,8]) {
  %4 = transpose %1 {perm=[1,0]} : f32[16,32]
  %7 = transpose %2 {perm=[1,0]} : f32[8,16]
  %3 = exp %0 : f32[8,16]
  %5 = matmul %3, %4 : f32[8,32]
  %6 = transpose %5 {perm=[1,0]} : f32[32,8]
  %8 = add %7, %3 : f32[8,16]
  return %6, %8
}
"""


def _schedules_as(text: str, golden: str) -> None:
    """The schedule pass turns text into golden, and both compute the same."""
    g = parse(text)
    after = Schedule().run(g, PassContext(TRN2))
    assert print_graph(after) == golden
    inputs = [random_input(v.type) for v in g.inputs]
    for a, b in zip(interpret(after, inputs), interpret(g, inputs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_input_transposes_are_issued_first():
    _schedules_as(BLOCK, SCHEDULED)


# A training forward: the head split of x is saved for the backward (an output only), the
# matmuls' work goes on.
SAVES = """graph @main(%0: f32[8,16], %1: f32[16,32], %2: f32[32,16]) {
  %3 = transpose %0 {perm=[1,0]} : f32[16,8]
  %4 = reshape %3 {shape=[2,8,8]} : f32[2,8,8]
  %5 = matmul %0, %1 : f32[8,32]
  %6 = exp %5 : f32[8,32]
  %7 = matmul %6, %2 : f32[8,16]
  return %7, %4
}
"""

# The copy and its reshape move to just before the last matmul, beside whose TensorE work
# its DMAs run; nothing the next kernels read waits behind them.
SAVES_SCHEDULED = """graph @main(%0: f32[8,16], %1: f32[16,32], %2: f32[32,16]) {
  %5 = matmul %0, %1 : f32[8,32]
  %6 = exp %5 : f32[8,32]
  %3 = transpose %0 {perm=[1,0]} : f32[16,8]
  %4 = reshape %3 {shape=[2,8,8]} : f32[2,8,8]
  %7 = matmul %6, %2 : f32[8,16]
  return %7, %4
}
"""


def test_copies_only_outputs_read_are_issued_late():
    _schedules_as(SAVES, SAVES_SCHEDULED)
