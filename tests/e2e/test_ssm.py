"""State-space models from small random configs (transformers' reference PyTorch paths: no
mamba_ssm kernels): a training step compiles whole (fallback off) and gives eager's loss and
gradients, and greedy decoding with the model's own cache gives eager's tokens. Mamba's
backward writes every step-th element of a slice (slice_scatter with a step), which fell back
before."""

import pytest
import torch
import transformers

from tests.e2e.test_hf import (
    assert_generate_with_own_cache_matches_eager,
    assert_training_step_matches_eager,
)


def _mamba(kind: str):
    torch.manual_seed(0)
    if kind == "mamba":
        cfg = transformers.MambaConfig(
            vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, time_step_rank=4
        )
        return transformers.MambaForCausalLM(cfg)
    cfg = transformers.Mamba2Config(
        vocab_size=128,
        hidden_size=64,
        state_size=16,
        num_hidden_layers=2,
        n_groups=1,
        num_heads=8,
        head_dim=16,
        chunk_size=8,
    )
    return transformers.Mamba2ForCausalLM(cfg)


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_training_step_compiles_whole_and_matches_eager(fresh, kind):
    model = _mamba(kind)
    ids = torch.randint(1, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", options={"fallback": False})
    got = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    assert_training_step_matches_eager(model, ids, got)


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_generate_with_its_cache_gives_eagers_tokens(fresh, kind):
    ids = torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    assert_generate_with_own_cache_matches_eager(_mamba(kind).eval(), ids)
