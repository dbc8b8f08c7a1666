"""Architectures whose rotary embeddings use complex arithmetic (Llama 4, DeepSeek-V2:
`polar`, `view_as_complex`, a complex product, `view_as_real`) compile whole, complex values as
pairs of reals (Note [complex as pairs]): a training step gives eager's loss and gradients, and
DeepSeek-V2 decodes eager's tokens with a static cache. Both are also mixtures of experts."""

import pytest
import torch

import neuroncc
from tests.e2e.test_hf import (
    SMALL,
    assert_generate_with_own_cache_matches_eager,
    assert_training_step_matches_eager,
    neuron_compile_config,
)

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama4_text": {
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 128,
        "head_dim": 16,
        "interleave_moe_layer_step": 1,
        "no_rope_layers": [1, 1],
        "attention_chunk_size": 64,
    },
    "deepseek_v2": {
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
        "topk_method": "greedy",
    },
}


def _model(arch: str):
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(arch, **{**SMALL, **CONFIGS[arch]})
    return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
def test_training_step_compiles_whole(fresh, arch):
    model = _model(arch)
    ids = torch.randint(1, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", options={"fallback": False})
    got = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    assert_training_step_matches_eager(model, ids, got)


@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
def test_deepseek_v2_generates_eagers_tokens(fresh):
    model = _model("deepseek_v2").eval()
    ids = torch.randint(1, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 5, "do_sample": False, "cache_implementation": "static"}
    want = model.generate(ids, **kw)
    got = model.generate(ids, compile_config=neuron_compile_config(), **kw)
    assert got.tolist() == want.tolist()
    s = neuroncc.stats()
    assert s["compiles"] >= 1 and s["executions"] >= 4 and s["fallback_nodes"] == {}, s


@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
def test_llama4_generates_eagers_tokens(fresh):
    """With its own cache (transformers does not compile its chunked-attention static cache):
    the decode steps' graphs return sizes as numbers, which compile (ConstantOutput)."""
    ids = torch.randint(1, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    assert_generate_with_own_cache_matches_eager(_model("llama4_text").eval(), ids)
