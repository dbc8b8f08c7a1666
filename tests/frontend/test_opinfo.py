"""A quick subset of PyTorch's OpInfo database through the backend (the whole database:
`python tools/opinfo_sweep.py`). Each op must match eager, compiled with no fallback."""

import pytest

pytest.importorskip("expecttest")

from tools.opinfo_sweep import run_op

QUICK = [
    "add",
    "sub",
    "mul",
    "div.no_rounding_mode",
    "div.trunc_rounding",
    "div.floor_rounding",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "sin",
    "cos",
    "erf",
    "maximum",
    "minimum",
    "clamp",
    "where",
    "sum",
    "mean",
    "amax",
    "amin",
    "softmax",
    "log_softmax",
    "mm",
    "bmm",
    "matmul",
    "addmm",
    "transpose",
    "permute",
    "reshape",
    "cat",
    "flip",
    "cumsum",
    "gather",
    "index_select",
    "nn.functional.gelu",
    "nn.functional.silu",
    "nn.functional.relu",
    "nn.functional.layer_norm",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "topk",
    "argmax",
]


@pytest.mark.parametrize("name", QUICK)
def test_opinfo_compiles_and_matches(name, opinfo_ops, fresh):
    result = run_op(opinfo_ops[name], samples=2, grads=True)
    assert result.status == "compiled", result
    assert result.samples >= 1
