"""The benchmark suite's quick subset, and opt_level 0 vs 2 agreeing end to end."""

import tempfile

import pytest
import torch

import neuroncc
from neuroncc.examples import GPTConfig, TinyGPT, example_batch
from tools import bench, bench_cache


def test_bench_quick_rows_are_consistent(fresh):
    rows = [bench.gemm_row(quick=True)]
    for name in ("layernorm", "gpt2_block_fwd_bwd"):
        w = next(w for w in bench.WORKLOADS if w.name == name)
        rows.append(bench.run_workload(w, quick=True, inductor=False))
    for r in rows:
        assert 0 < r.roofline_us <= r.device_us
        assert 0 < r.fraction <= 1
        assert r.hbm_mb_o2 <= r.hbm_mb_o0
    assert rows[1].hbm_mb_o2 < rows[1].hbm_mb_o0 / 3  # the fused LayerNorm
    bench.print_table(rows)


@pytest.mark.parametrize("level", [0, 2])
def test_every_bench_workload_compiles_at_full_size(fresh, level):
    """Each of the suite's workloads at its own size, timed (not simulated), at both opt
    levels, with no compiler error: the builder's bounds check found a wrong-code loop in
    attention_2048 at opt_level 0 that no smaller test reached."""
    for w in bench.WORKLOADS:
        stats = bench._neuroncc(w, quick=False, level=level, timing_only=True)[0]
        assert stats["compiler_errors"] == {}, w.name
        assert stats["fallback_nodes"] == {}, w.name


def test_opt_levels_agree_on_a_training_step(fresh):
    torch.manual_seed(0)
    cfg = GPTConfig(seq=16, dim=32, layers=2)
    model = TinyGPT(cfg)
    idx, targets = example_batch(cfg, 2)
    results = {}
    for level in (0, 2):
        torch._dynamo.reset()
        model.zero_grad()
        compiled = torch.compile(model, backend="neuron", options={"opt_level": level})
        logits, loss = compiled(idx, targets)
        loss.backward()
        results[level] = (logits, loss, [p.grad.clone() for p in model.parameters()])
        assert neuroncc.stats()["fallback_nodes"] == {}
    (l0, s0, g0), (l2, s2, g2) = results[0], results[2]
    torch.testing.assert_close(l2, l0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s2, s0, rtol=1e-5, atol=1e-6)
    for a, b in zip(g2, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_fused_and_blocked_code_is_faster_than_one_kernel_per_op(fresh, target):
    torch.manual_seed(0)
    cfg = GPTConfig(seq=32, dim=64, layers=1)
    model = TinyGPT(cfg)
    idx, targets = example_batch(cfg, 2)
    device = {}
    for level in (0, 2):
        torch._dynamo.reset()
        compiled = torch.compile(
            model,
            backend="neuron",
            options={"opt_level": level, "target": target, "fallback": False},
        )
        compiled(idx, targets)
        neuroncc.reset_stats()
        compiled(idx, targets)
        device[level] = neuroncc.stats()["device_seconds"]
    assert device[2] < device[0] / 1.5


@pytest.mark.compiles_nothing("recorded here, compiled by the warmup workers")
def test_cache_benchmark_quick():
    result = bench_cache.run(quick=True)
    n = len(result["graphs"])  # 8 distinct graphs; at the quick shapes two coincide
    assert n >= 7
    for g in result["graphs"].values():  # wall times: reported, never compared in a test
        assert g["hit_s"] > 0 and g["compile_s"] > 0 and g["instructions"] > 0
    assert all(t["graphs"] == n for t in result["warmup"].values())
    bench_cache.print_report(result)


def test_sweep_cases_come_from_the_model_configs_and_time_against_the_roofline(fresh):
    """The sweep's cases are every projection of each model in each form (no hand-picked
    shapes), and a case's fraction is its roofline over its device time; the quick subset
    keeps every kind. One case of each kind is run here (meta tensors: nothing computed)."""
    from tools import sweep

    shapes = {m.name: [(k, n) for _, k, n in m.linears()] for m in sweep.MODELS}
    assert shapes["gpt2"] == [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
    assert shapes["llama-3-8b"] == [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096)]
    quick = sweep.cases(quick=True)
    assert {c.kind for c in quick} == {
        "gemm",
        "decode",
        "layernorm",
        "rmsnorm",
        "softmax",
        "attention",
    }
    assert len(sweep.cases()) > 10 * len(quick)
    picked = [
        "decode/trn2/bfloat16/nn.Linear/1x768x3072",
        "gemm/trn1/float32/a @ b/128x768x768",
        "rmsnorm/trn2/bfloat16/affine/4096x1024",
        "attention/trn2/float32/causal/12/12x128x64",
    ]
    chosen = [c for c in quick if c.label in picked]
    assert len(chosen) == len(picked)
    with tempfile.TemporaryDirectory() as cache:
        results = [sweep.run_case(c, cache) for c in chosen]
    for r in results:
        assert not r.error and 0 < r.roofline_us <= r.device_us
        assert r.fraction == pytest.approx(r.roofline_us / r.device_us)
    s = sweep.summary(results)
    assert s["cases"] == 4 and 0 < s["min"] <= s["geomean"] <= 1
