"""Weights laid out once (Note [weight layout]): an inference graph takes a parameter that it
reads only as Wᵀ as Wᵀ, made by a compiled transpose on the simulator and made again when W's
bytes change."""

import torch
from torch import nn

import neuroncc
from neuroncc.frontend.weight_layout import _same_bytes
from neuroncc.runtime.stats import STATS

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 32))


def _layouts() -> list[str]:
    """The layout executables run since the last reset."""
    return sorted(name for name in STATS.executed() if "_layout" in name)


def _check(compiled, model, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)


def test_an_inference_graph_takes_its_weights_transposed(fresh, tmp_path):
    model, x = _mlp(), torch.randn(16, 48)
    compiled = torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)})
    _check(compiled, model, x)
    assert _layouts() == ["graph1_inference_layout0", "graph1_inference_layout3"]
    nir = (tmp_path / "graph1_inference" / "01-nir.txt").read_text().splitlines()[0]
    assert "%0: f32[48,96]" in nir and "%3: f32[96,32]" in nir, nir  # Wᵀ, not W
    assert "transpose" not in (tmp_path / "graph1_inference" / "02-simplify.txt").read_text()
    neuroncc.reset_stats()
    _check(compiled, model, x)
    assert _layouts() == [] and neuroncc.stats()["executions"] == 1  # laid out once


def test_a_changed_weight_is_laid_out_again(fresh):
    model, x = _mlp(), torch.randn(16, 48)
    compiled = torch.compile(model, backend="neuron")
    _check(compiled, model, x)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # bumps the version counter
    neuroncc.reset_stats()
    _check(compiled, model, x)
    assert _layouts() == ["graph1_inference_layout0"]
    model[2].weight.data[3, 5] += 1.0  # through .data: the version counter does not move
    neuroncc.reset_stats()
    _check(compiled, model, x)
    assert _layouts() == ["graph1_inference_layout3"]


def test_training_and_opt_level_0_keep_weights_as_they_are(fresh):
    model, x = _mlp(), torch.randn(16, 48)
    out = torch.compile(model, backend="neuron")(x)  # a training forward: weights change
    out.sum().backward()
    assert _layouts() == []
    torch._dynamo.reset()
    _check(torch.compile(model, backend="neuron", options={"opt_level": 0}), model, x)
    assert _layouts() == []


def test_timing_only_times_the_layout_once(fresh):
    model, x = _mlp(), torch.randn(16, 48)
    compiled = torch.compile(model, backend="neuron", options={"timing_only": True})
    _check(compiled, model, x)
    assert neuroncc.stats()["timing_only_executions"] == 3  # the graph and two layouts
    neuroncc.reset_stats()
    _check(compiled, model, x)
    assert neuroncc.stats()["timing_only_executions"] == 1
    with torch.no_grad():  # timing only, the version tells (no copy of W is kept)
        model[0].weight.mul_(2.0)
    neuroncc.reset_stats()
    _check(compiled, model, x)
    assert neuroncc.stats()["timing_only_executions"] == 2


def test_bytes_are_compared_bit_for_bit():
    zero = torch.zeros(4)
    assert not _same_bytes(zero, -zero)
    nan = torch.full((4,), float("nan"))
    assert _same_bytes(nan, nan.clone())
    assert not _same_bytes(zero, zero.to(torch.bfloat16))


def test_shape_variants_share_the_laid_out_weights(fresh):
    model = _mlp()
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    for rows in (16, 9):
        _check(compiled, model, torch.randn(rows, 48))
    assert neuroncc.stats()["weight_layouts"] == 2  # each weight once, for both shapes
