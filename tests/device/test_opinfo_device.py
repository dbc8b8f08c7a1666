"""The quick OpInfo subset (tests/frontend/test_opinfo.py) run eagerly on the `neuron` device:
each op's samples, forward and gradients, match CPU, every op compiled and simulated (the whole
database: `python tools/opinfo_sweep.py --device`)."""

import pytest

pytest.importorskip("expecttest")

from tests.frontend.test_opinfo import QUICK
from tools.opinfo_sweep import run_op


@pytest.mark.parametrize("name", QUICK)
def test_opinfo_runs_on_the_device_and_matches_cpu(name, opinfo_ops, fresh):
    result = run_op(opinfo_ops[name], samples=2, grads=True, device=True)
    assert result.status == "compiled", result
    assert result.samples >= 1
