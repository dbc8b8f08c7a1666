"""Hybrid models with chunked linear attention (Qwen3-Next, Qwen3.5: the gated delta rule
beside full attention layers) from small random configs. The delta rule's triangular solves
compile as products of matrices (Note [triangular solves by doubling]): a training step compiles
whole and gives eager's loss and gradients, and greedy decoding with the model's own cache
gives eager's tokens."""

import pytest
import torch

from tests.e2e.test_hf import (
    assert_generate_with_own_cache_matches_eager,
    assert_training_step_matches_eager,
)

pytest.importorskip("transformers")
from tools.arch_survey import model_of  # (the families' small configs)

ARCHS = ["qwen3_next", "qwen3_5_text"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
@pytest.mark.filterwarnings("ignore:.*flash-linear-attention")
def test_training_step_compiles_whole(fresh, arch):
    model = model_of(arch)
    # 70 tokens: two chunks of the rule's 64, the second padded.
    ids = torch.randint(1, 256, (1, 70), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", options={"fallback": False})
    got = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    assert_training_step_matches_eager(model, ids, got)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.filterwarnings("ignore:neuroncc. a mixture-of-experts")
@pytest.mark.filterwarnings("ignore:.*flash-linear-attention")
def test_generate_with_its_cache_gives_eagers_tokens(fresh, arch):
    ids = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    assert_generate_with_own_cache_matches_eager(model_of(arch).eval(), ids)
