"""Dynamo's symbolic sizes: neuroncc specialises per concrete shape at call time."""

import logging

import pytest
import torch

import neuroncc
from neuroncc.examples import GPTConfig, TinyGPT
from neuroncc.runtime.cache import GRAPH_CACHE

CFG = GPTConfig(vocab=64, seq=64, dim=32, heads=4, layers=1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_twelve_lengths_compile_twelve_times_then_never(fresh, caplog, dynamic):
    torch.manual_seed(0)
    model = TinyGPT(CFG).eval()
    f = torch.compile(model, backend="neuron", dynamic=dynamic)
    lengths = list(range(4, 16))
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"), torch.no_grad():
        for n in lengths:
            idx = torch.randint(0, CFG.vocab, (2, n))
            torch.testing.assert_close(f(idx), model(idx), rtol=1e-4, atol=1e-5)
        # Beside the twelve: the transposes that lay the weights out, once for all lengths
        # (Note [weight layout]).
        layouts = sum("_layout" in c.exe.name for c in GRAPH_CACHE.values())
        assert neuroncc.stats()["compiles"] == 12 + layouts
        f(torch.randint(0, CFG.vocab, (2, 7)))
    s = neuroncc.stats()
    assert s["compiles"] == 12 + layouts and s["executions"] == 13 + s["weight_layouts"]
    assert 0 < s["weight_layouts"] <= len(list(model.parameters()))
    assert s["dynamo_graphs"] <= 2  # default: one static graph, then one symbolic graph
    assert "recompile_limit" not in caplog.text


def test_static_shapes_with_dynamic_false(fresh):
    torch.manual_seed(0)
    model = TinyGPT(CFG).eval()
    f = torch.compile(model, backend="neuron", dynamic=False)
    with torch.no_grad():
        for n in (5, 9, 5):
            idx = torch.randint(0, CFG.vocab, (1, n))
            torch.testing.assert_close(f(idx), model(idx), rtol=1e-4, atol=1e-5)
    layouts = sum("_layout" in c.exe.name for c in GRAPH_CACHE.values())
    assert neuroncc.stats()["compiles"] == 2 + layouts


def test_training_with_changing_lengths(fresh):
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    f = torch.compile(model, backend="neuron")
    for n in (6, 10, 6):
        idx = torch.randint(0, CFG.vocab, (2, n))
        model.zero_grad()
        _, loss = model(idx, idx)
        loss.backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        _, loss = f(idx, idx)
        loss.backward()
        for p, w in zip(model.parameters(), want, strict=True):
            torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5)
    assert neuroncc.stats()["compiles"] == 4  # forward + backward for each of two lengths


def test_a_graph_returning_a_size_compiles(fresh):
    """Dynamo returns a symbolic size from the graph; specialised, it is a number the compiled
    graph returns as it is (Llama 4's decode steps return one), not a reason to run eagerly."""

    def f(x):
        return x * 2, x.shape[0] + 1

    compiled = torch.compile(f, backend="neuron", dynamic=True, options={"fallback": False})
    for n in (3, 5):
        x = torch.randn(n, 4)
        y, m = compiled(x)
        assert m == n + 1
        torch.testing.assert_close(y, x * 2)
    assert neuroncc.stats()["compiles"] == 2
