import json

import numpy as np
import pytest

from neuroncc.codegen.executable.listing import _runs, listing
from neuroncc.codegen.executable.program import FORMAT_VERSION, Executable
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.codegen.lower import emit_graph
from neuroncc.ir import DType, GraphBuilder, Op, TensorType
from neuroncc.runtime.simulator import run


def _exe():
    b = GraphBuilder("main")
    x = b.input(TensorType((8, 16), DType.F32))
    w = b.input(TensorType((16, 4), DType.BF16))
    y = b.op(Op.MATMUL, b.op(Op.CAST, x, dtype=DType.BF16), w)
    return emit_graph(b.build([b.op(Op.TANH, y)]), TRN2)


def test_json_round_trip_is_exact_and_runs():
    exe = _exe()
    again = Executable.from_json(exe.to_json())
    assert again == exe
    x = np.ones((8, 16), np.float32)
    w = np.ones((16, 4), DType.BF16.numpy)
    assert np.array_equal(run(again, [x, w], TRN2)[0], run(exe, [x, w], TRN2)[0])


def test_loading_rejects_other_versions_and_unknown_instructions():
    data = json.loads(_exe().to_json())
    data["version"] = FORMAT_VERSION + 1
    with pytest.raises(ValueError, match="format version"):
        Executable.from_json(json.dumps(data))
    data = json.loads(_exe().to_json())
    data["blocks"][0][2][0][0] = "exec_python"
    with pytest.raises(ValueError, match="unknown instruction 'exec_python'"):
        Executable.from_json(json.dumps(data))
    data = json.loads(_exe().to_json())
    data["blocks"][0][2][0].append("x")
    with pytest.raises(ValueError, match="fields"):
        Executable.from_json(json.dumps(data))
    data = json.loads(_exe().to_json())
    data["operands"] = data["operands"][:1]
    with pytest.raises(ValueError, match="malformed executable"):
        Executable.from_json(json.dumps(data))


def test_listing_shows_kernels_engines_and_waits():
    text = listing(_exe())
    assert text.startswith(f"executable @main  target=trn2  format=v{FORMAT_VERSION}")
    assert "kernel matmul." in text and "kernel tanh." in text
    assert " pe   matmul " in text and " act  activation " in text
    assert "waits " in text
    assert "in0      input  f32[8, 16]" in text


def test_listing_leaves_out_immediates_at_their_default():
    text = listing(_exe())
    matmuls = [line for line in text.splitlines() if " matmul " in line]
    assert matmuls and all("accumulate=" in line for line in matmuls)  # no default: shown
    assert not any("tile_rows=0" in line or "transpose=False" in line for line in matmuls)
    assert "func=tanh]" in text  # scale=1.0, bias=0.0 left out


def test_listing_counts_a_loops_repeated_blocks():
    """A kernel's header names its calls' blocks with repeats counted, a period of several
    blocks too (a loop's: Note [instruction loops])."""
    period = [131, 132, 133, 134, 135, 136, 137, 138]
    assert _runs([3, 4, 4, 4, 5]) == "3, 4 x3, 5"
    assert _runs([107, *period * 40, 139]) == f"107, ({', '.join(map(str, period))}) x40, 139"
    assert _runs([1, 2, 1, 2, 1, 3]) == "(1, 2) x2, 1, 3"
    assert _runs([]) == ""
