"""Completeness: every op in the table has everything the compiler needs."""

import pytest

from neuroncc.codegen import lower  # noqa: F401  (registers all emitters)
from neuroncc.codegen.kernels.emit import EMITTERS
from neuroncc.ir import numerics
from neuroncc.ir.interpret import _BY_KIND, _BY_OP
from neuroncc.ir.ops import BY_NAME, OP_TABLE, Kind, Op


@pytest.mark.parametrize("op", list(Op), ids=lambda op: op.value)
def test_op_is_complete(op):
    info = OP_TABLE[op]
    assert callable(info.rule)
    assert BY_NAME[op.value] is op
    assert op in _BY_OP or info.kind in _BY_KIND, "no reference interpreter entry"
    assert op in EMITTERS, "no emitter"
    if info.kind == Kind.UNARY and op != Op.NOT:
        assert op.value in numerics.UNARY, "activation function has no numpy definition"
    if info.kind in (Kind.BINARY, Kind.COMPARE):
        assert op.value in numerics.BINARY
