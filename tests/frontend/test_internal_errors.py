"""Internal compiler errors (Note [internal errors] in frontend/failures.py): a failure inside
neuroncc names its stage, pass and node, writes the failing graph with a command that replays
it, is counted apart from declined ops, and with fallback off is raised. Bugs are injected
(a pass, a lowering rule, a decomposition, the simulator that break) so that these tests keep
meaning something once the real bugs are fixed. Also: options are validated strictly."""

import runpy
import tempfile

import pytest
import torch

import neuroncc
from neuroncc.errors import NeuronccInternalError, OptionsError
from neuroncc.frontend import complex_pairs, decompositions, dump_cli, registry
from neuroncc.options import CompileOptions
from neuroncc.passes.layout import Layout
from neuroncc.runtime import simulator


@pytest.fixture
def failures(tmp_path, monkeypatch):
    """The failures directory (<tmp>/neuroncc-failures) inside this test's tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / "neuroncc-failures"


def _break(*args, **kwargs):
    raise RuntimeError("injected bug")


def _matmul_model(x):
    return torch.tanh(x @ x.T) + 1


def _internal(excinfo) -> NeuronccInternalError:
    """The NeuronccInternalError inside whatever Dynamo wrapped it in."""
    e = excinfo.value
    while e is not None and not isinstance(e, NeuronccInternalError):
        e = e.__cause__ or e.__context__
    assert e is not None, f"no NeuronccInternalError in {excinfo.value!r}"
    return e


def test_a_failing_pass_runs_the_graph_eagerly_loudly_with_a_repro(fresh, failures, monkeypatch):
    monkeypatch.setattr(Layout, "run", _break)
    x = torch.randn(8, 8)
    with pytest.warns(
        UserWarning,
        match=r"neuroncc internal compiler error in graph graph1_inference, running it eagerly "
        r"in PyTorch: \(stage layout\): RuntimeError: injected bug; reproduce with: "
        r"neuroncc-dump repro .*neuroncc-failures/graph1_inference-\w+\.nir",
    ):
        got = torch.compile(_matmul_model, backend="neuron")(x)
    torch.testing.assert_close(got, _matmul_model(x))
    s = neuroncc.stats()
    assert s["compiler_errors"] == {"layout": 1}
    assert s["fallback_nodes"] == {}  # only declined ops
    (dump,) = failures.glob("*.nir")
    text = dump.read_text()
    assert "# stage: layout, pass layout" in text and "matmul" in text
    assert dump_cli.main(["repro", str(dump)]) == 1  # the bug is still there: reproduced
    monkeypatch.undo()
    assert dump_cli.main(["repro", str(dump)]) == 0  # fixed: it compiles


def test_with_fallback_off_the_internal_error_is_raised(fresh, failures, monkeypatch):
    monkeypatch.setattr(Layout, "run", _break)
    f = torch.compile(_matmul_model, backend="neuron", options={"fallback": False})
    with pytest.raises(Exception) as excinfo:
        f(torch.randn(8, 8))
    e = _internal(excinfo)
    assert (e.stage, e.pass_name) == ("layout", "layout")
    assert e.repro.startswith("neuroncc-dump repro ") and e.dump.endswith(".nir")
    assert neuroncc.stats()["compiler_errors"] == {}  # raised, not run eagerly


def test_the_node_is_named_from_where_the_pass_failed(fresh, failures, monkeypatch):
    def run(self, g, ctx):
        for n in g.nodes:
            if n.op.value == "matmul":
                raise ValueError("this matmul")
        return g

    monkeypatch.setattr(Layout, "run", run)
    f = torch.compile(_matmul_model, backend="neuron", options={"fallback": False})
    with pytest.raises(Exception) as excinfo:
        f(torch.randn(8, 8))
    assert _internal(excinfo).node == "%2 = matmul %0, %1 : f32[8,8]"


def test_a_broken_lowering_rule_writes_a_python_repro(fresh, failures, monkeypatch):
    monkeypatch.setitem(registry.LOWERINGS, torch.ops.aten.tanh.default, _break)
    x = torch.randn(8, 8)
    with pytest.warns(UserWarning, match=r"\(stage nir, node %tanh .*reproduce with: python "):
        got = torch.compile(_matmul_model, backend="neuron")(x)
    torch.testing.assert_close(got, _matmul_model(x))
    assert neuroncc.stats()["compiler_errors"] == {"nir": 1}
    (script,) = failures.glob("*.py")
    with pytest.raises(SystemExit) as replay:  # the script compiles the ATen graph again
        runpy.run_path(str(script), run_name="__main__")
    assert replay.value.code == 1
    monkeypatch.undo()
    with pytest.raises(SystemExit) as replay:
        runpy.run_path(str(script), run_name="__main__")
    assert replay.value.code == 0


def test_a_broken_decomposition_is_an_internal_error_of_stage_aot_autograd(
    fresh, failures, monkeypatch
):
    monkeypatch.setitem(decompositions.DECOMPOSITIONS, torch.ops.aten.gelu.default, _break)
    x = torch.randn(4, 8, requires_grad=True)
    f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend="neuron")
    with pytest.warns(UserWarning, match=r"\(stage aot_autograd\): RuntimeError: injected bug"):
        f(x).sum().backward()
    assert neuroncc.stats()["compiler_errors"] == {"aot_autograd": 1}
    (script,) = failures.glob("*.py")
    with pytest.raises(SystemExit) as replay:
        runpy.run_path(str(script), run_name="__main__")
    assert replay.value.code == 1


def test_a_simulator_failure_at_run_time(fresh, failures, monkeypatch):
    monkeypatch.setattr(simulator, "run", _break)
    f = torch.compile(_matmul_model, backend="neuron")
    x = torch.randn(8, 8)
    with pytest.warns(UserWarning, match=r"\(stage simulate\): RuntimeError: injected bug"):
        torch.testing.assert_close(f(x), _matmul_model(x))
    torch.testing.assert_close(f(x), _matmul_model(x))  # eager from then on, warned once
    assert neuroncc.stats()["compiler_errors"] == {"simulate": 1}
    (dump,) = failures.glob("*.nir")
    assert "# simulate: true" in dump.read_text()
    assert dump_cli.main(["repro", str(dump)]) == 1
    monkeypatch.undo()
    assert dump_cli.main(["repro", str(dump)]) == 0  # compiles and simulates


@pytest.mark.parametrize(
    ("options", "environ", "message"),
    [
        ({"fallback": "yes"}, {}, "option fallback='yes': Input should be a valid boolean"),
        ({"opt_level": 2.0}, {}, "option opt_level=2.0: Value error, expected an int"),
        ({"opt_level": True}, {}, "option opt_level=True: Value error, expected an int"),
        ({}, {"NEURONCC_OPT_LEVEL": "two"}, "environment variable NEURONCC_OPT_LEVEL='two': "),
        (
            {},
            {"NEURONCC_OPT_LEVEL": "5"},
            "environment variable NEURONCC_OPT_LEVEL=5 (option opt_level): Input should be",
        ),
        ({}, {"NEURONCC_DISK_CACHE": "maybe"}, "NEURONCC_DISK_CACHE='maybe': expected one of 1/"),
        ({}, {"NEURONCC_TARGET": "trn9"}, "environment variable NEURONCC_TARGET='trn9' (option"),
    ],
)
def test_options_are_validated_strictly(options, environ, message):
    with pytest.raises(OptionsError) as e:
        CompileOptions.from_user(options, environ)
    assert message in str(e.value)


def test_environment_values_are_parsed_and_explicit_options_win():
    opts = CompileOptions.from_user(
        {"target": "trn1"}, {"NEURONCC_TARGET": "trn9", "NEURONCC_DISK_CACHE": "off"}
    )
    assert (opts.target, opts.disk_cache) == ("trn1", False)


def test_a_broken_complex_rule_is_an_internal_error(fresh, failures, monkeypatch):
    """The rewrite of complex values into pairs (Note [complex as pairs]) fails as loudly as a
    pass, with its stage named."""
    monkeypatch.setitem(complex_pairs.RULES, torch.ops.aten.mul.Tensor, _break)
    f = torch.compile(lambda a: a * a, backend="neuron", options={"fallback": False})
    with pytest.raises(Exception) as excinfo:
        f(torch.randn(3, dtype=torch.complex64))
    e = _internal(excinfo)
    assert e.stage == "complex-pairs" and "injected bug" in str(e)
    assert e.repro  # the ATen graph is written, to replay


def test_the_collector_is_off_while_a_graph_compiles(fresh, failures, monkeypatch):
    """Note [compiling without the collector]: off inside the pipeline, on again after it,
    also when the pipeline fails."""
    import gc

    seen = []
    run = Layout.run

    def recording(self, g, ctx):
        seen.append(gc.isenabled())
        return run(self, g, ctx)

    monkeypatch.setattr(Layout, "run", recording)
    assert gc.isenabled()
    torch.compile(_matmul_model, backend="neuron")(torch.randn(8, 8))
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(Layout, "run", _break)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="internal compiler error"):
        torch.compile(_matmul_model, backend="neuron")(torch.randn(4, 4))
    assert gc.isenabled()
