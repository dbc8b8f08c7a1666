"""Architectures whose rotary embeddings use complex arithmetic (Llama 4, DeepSeek-V2:
`polar`, `view_as_complex`, a complex product, `view_as_real`) compile whole, complex values as
pairs of reals (Note [complex as pairs]): a training step gives eager's loss and gradients, and
DeepSeek-V2 decodes eager's tokens with a static cache. Both are also mixtures of experts."""

import pytest
import torch

import neuroncc
from tests.e2e.test_hf import (
    assert_generate_with_own_cache_matches_eager,
    assert_training_step_matches_eager,
    neuron_compile_config,
)

pytest.importorskip("transformers")

from tools.arch_survey import model_of  # (the families' small configs)

ARCHS = ["llama4_text", "deepseek_v2"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
def test_training_step_compiles_whole(fresh, arch):
    model = model_of(arch)
    ids = torch.randint(1, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", options={"fallback": False})
    got = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    assert_training_step_matches_eager(model, ids, got)


@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
def test_deepseek_v2_generates_eagers_tokens(fresh):
    model = model_of("deepseek_v2").eval()
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
    assert_generate_with_own_cache_matches_eager(model_of("llama4_text").eval(), ids)
