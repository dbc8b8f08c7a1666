"""Profiles of compiled models from Python: per graph, accumulated in stats(), as a trace file,
and timing-only estimation that skips the numerics."""

import json
import warnings

import pytest
import torch

import neuroncc
from neuroncc.examples import GPTConfig, TinyGPT, example_batch
from neuroncc.runtime import simulator


def _model_and_batch():
    torch.manual_seed(0)
    cfg = GPTConfig(seq=16, dim=32, layers=1)
    return TinyGPT(cfg), example_batch(cfg, 2)


def test_profiles_per_graph_add_up_to_stats(fresh):
    model, (idx, targets) = _model_and_batch()
    compiled = torch.compile(model, backend="neuron")
    _, loss = compiled(idx, targets)
    loss.backward()
    s = neuroncc.stats()
    profiles = neuroncc.profiles()
    assert len(profiles) >= 2  # forward and backward
    assert s["device_seconds"] == pytest.approx(sum(p.device_ns for p in profiles.values()) * 1e-9)
    assert s["flops"] == sum(p.flops for p in profiles.values()) > 0
    for p in profiles.values():
        assert 0 < p.roofline_ns <= p.device_ns
        assert 0 <= p.mfu <= p.hfu <= 1
        assert 0 < p.dma_efficiency <= 1
        assert p.spill_bytes > 0  # one kernel per op: intermediates round-trip through HBM
    assert 0 < s["mfu"] <= s["hfu"] <= 1
    assert set(s["graphs"]) == set(profiles)


def test_write_trace_opens_as_chrome_trace(fresh, tmp_path):
    model, (idx, targets) = _model_and_batch()
    torch.compile(model, backend="neuron")(idx, targets)
    path = neuroncc.write_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == neuroncc.stats()["instructions"]
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len(processes) == len(neuroncc.profiles())


def test_timing_only_times_the_same_programs_without_simulating(fresh, monkeypatch):
    model, (idx, targets) = _model_and_batch()
    simulated = torch.compile(model, backend="neuron")
    simulated(idx, targets)
    want = neuroncc.stats()["device_seconds"]
    neuroncc.reset_stats()
    torch._dynamo.reset()

    def no_simulation(*args, **kwargs):
        raise AssertionError("timing_only ran the simulator")

    monkeypatch.setattr(simulator, "run", no_simulation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        timed = torch.compile(model, backend="neuron", options={"timing_only": True})
        _, eager_loss = timed(idx, targets)
    assert any("timing_only" in str(w.message) for w in caught)
    s = neuroncc.stats()
    assert s["timing_only_executions"] == s["executions"] >= 1
    assert s["device_seconds"] == pytest.approx(want)
    with torch.no_grad():  # the ATen graph's kernels, not the module's: equal to rounding
        torch.testing.assert_close(eager_loss, model(idx, targets)[1], rtol=1e-6, atol=0)


def test_timing_only_on_meta_tensors_computes_nothing(fresh, monkeypatch):
    """A model and inputs on the meta device: the same programs are timed (equal to a run on
    real tensors), nothing runs on the host or the simulator, and the warning says so."""
    model, (idx, targets) = _model_and_batch()
    timed = torch.compile(model, backend="neuron", options={"timing_only": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timed(idx, targets)
    want = neuroncc.stats()["device_seconds"]
    neuroncc.reset_stats()
    torch._dynamo.reset()
    monkeypatch.setattr(simulator, "run", lambda *a, **k: pytest.fail("simulated"))
    meta = model.to("meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(meta, backend="neuron", options={"timing_only": True})
        logits, loss = compiled(idx.to("meta"), targets.to("meta"))
    assert any("meta device: nothing is computed" in str(w.message) for w in caught)
    assert logits.is_meta and loss.is_meta
    assert neuroncc.stats()["device_seconds"] == pytest.approx(want)
