"""Mixture of experts from small random configs: transformers' grouped matmul custom op
(`transformers::grouped_mm_fallback` and its backward) compiles as a dense product over the
experts (frontend/decomp_grouped_mm.py); a training step compiles whole and gives eager's loss
and gradients."""

import pytest
import torch
import transformers
from transformers.integrations import moe  # noqa: F401  (registers the custom ops)

import neuroncc
from neuroncc.frontend import decomp_grouped_mm
from neuroncc.frontend.decomp_grouped_mm import grouped_mm, grouped_mm_backward
from tests.e2e.test_hf import assert_training_step_matches_eager


@pytest.mark.parametrize("stored", ["ekn", "enk"])
@pytest.mark.parametrize(
    "counts,k", [([3, 0, 5, 2], 6), ([0, 0, 10, 0], 6), ([1, 2, 0, 4], 6), ([0, 1, 0, 0], 64)]
)
def test_the_dense_rules_equal_the_op(counts, k, stored):
    """Experts with no rows, and rows past the last offset (counts summing below S), which the
    op leaves 0; weights stored [E, K, N], or [E, N, K] and seen transposed, as transformers
    passes them; and few rows against a long K (a decode step's form, `_few_rows`)."""
    g = torch.Generator().manual_seed(sum(counts))
    rows = 10 if k == 6 else 2
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(4, k, 5, generator=g)
    if stored == "enk":
        w = w.mT.contiguous().mT
    grad = torch.randn(rows, 5, generator=g)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    ops = torch.ops.transformers
    torch.testing.assert_close(grouped_mm(x, w, offs), ops.grouped_mm_fallback(x, w, offs))
    for got, want in zip(
        grouped_mm_backward(x, w, offs, grad),
        ops.grouped_mm_fallback_backward(x, w, offs, grad),
        strict=True,
    ):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_training_step_compiles_whole_and_matches_eager(fresh, arch, monkeypatch):
    monkeypatch.setattr(decomp_grouped_mm, "_WARNED", False)  # (once per process)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(
        arch,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(1, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", options={"fallback": False})
    with pytest.warns(UserWarning, match="dense product over all its experts"):
        got = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    assert neuroncc.stats()["dense_grouped_matmuls"] >= 4  # 2 layers' up and down, forward
    assert_training_step_matches_eager(model, ids, got)


@pytest.mark.filterwarnings("ignore")
def test_the_architecture_survey_runs(fresh):
    """tools/arch_survey.py, the table of families issue 23's notes report, on one case."""
    from tools import arch_survey

    assert arch_survey.main(["--only", "mixtral", "--modes", "fwd"]) == 0
