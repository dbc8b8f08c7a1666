"""Steps that write their result in place (semantics._in_place) against numerics' definition,
also where the result overlaps a source, shifted (numpy buffers it)."""

import numpy as np
import pytest

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.ir import numerics
from neuroncc.ir.types import DType
from neuroncc.runtime.memory import Memories
from neuroncc.runtime.semantics import prepare_tensor_scalar, prepare_tensor_tensor

F32 = DType.F32
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, 3e38], np.float32)


@pytest.fixture(autouse=True)
def _quiet():
    with np.errstate(all="ignore"):  # as simulator.run runs steps
        yield


def _tile(offset: int, free: int) -> isa.TileRef:
    return isa.TileRef("sbuf", 0, 4, offset, F32, (free,))


LAYOUTS = {  # (dst, a, b) byte offsets and b's width; a and b are 32 wide
    "apart": (_tile(0, 32), _tile(1024, 32), _tile(2048, 32)),
    "dst is a": (_tile(1024, 32), _tile(1024, 32), _tile(2048, 32)),
    "b per partition": (_tile(0, 32), _tile(1024, 32), _tile(2048, 1)),
    "dst shifted over a": (_tile(1028, 32), _tile(1024, 32), _tile(2048, 32)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "pow", "lt"])
def test_tensor_tensor_steps_match_numerics(op, layout):
    dst, a, b = LAYOUTS[layout]
    exe = Executable.of_stream("t", "trn2", 1, (), (), (), ())
    mem = Memories(exe, TRN2)
    rng = np.random.default_rng(0)
    x = rng.choice(SPECIAL, (4, 32)) * rng.standard_normal((4, 32), dtype=np.float32)
    y = rng.choice(SPECIAL, (4, b.free[0]))
    mem.tile(a)[...], mem.tile(b)[...] = x, y
    want = numerics.BINARY[op](x, y).astype(np.float32)
    prepare_tensor_tensor(mem, isa.TensorTensor("dve", op=op, dst=dst, a=a, b=b), TRN2)()
    np.testing.assert_array_equal(mem.tile(dst), want)  # NaN where NaN, -0.0 as -0.0


@pytest.mark.parametrize("op", ["add", "mul", "div", "max", "pow", "ge"])
def test_tensor_scalar_steps_match_numerics(op):
    src, dst = _tile(1024, 32), _tile(1024, 32)  # in place
    mem = Memories(Executable.of_stream("t", "trn2", 1, (), (), (), ()), TRN2)
    x = np.random.default_rng(1).choice(SPECIAL, (4, 32))
    mem.tile(src)[...] = x
    want = numerics.BINARY[op](x, np.float32(-0.0)).astype(np.float32)
    ins = isa.TensorScalar("dve", op=op, dst=dst, src=src, scalar=-0.0)
    prepare_tensor_scalar(mem, ins, TRN2)()
    np.testing.assert_array_equal(mem.tile(dst), want)
