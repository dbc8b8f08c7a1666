"""Hugging Face models, unchanged, through torch.compile(backend="neuron"): generation with a
static cache, full-sequence logits and a training step, for ten text-generation architectures
built from small random configs; the Trainer; diffusers regional compilation."""

import tempfile

import pytest
import torch

import neuroncc
from neuroncc.runtime.cache import GRAPH_CACHE

transformers = pytest.importorskip("transformers")
from tools.arch_survey import model_of as small_model  # (the small configs, one place)

ARCHS = [
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "opt",
    # Mixtral's experts run through transformers' grouped_mm custom op: a dense product over the
    # experts (frontend/decomp_grouped_mm.py).
    "mixtral",
]
TOL = {"rtol": 1e-4, "atol": 1e-5}


def assert_training_step_matches_eager(model, ids, got):
    """`got`, the compiled model's loss on `ids` (labels = ids, no cache): its backward, then
    the loss and every gradient against eager's, with nothing run eagerly."""
    got.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    want = model(input_ids=ids, labels=ids, use_cache=False).loss
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert neuroncc.stats()["fallback_nodes"] == {}


def assert_generate_with_own_cache_matches_eager(model, ids, new_tokens: int = 5):
    """Greedy decoding with the model's own cache (state-space and hybrid models keep
    recurrent state, which transformers' static cache does not hold, and `generate` compiles
    only with a static cache): its forward compiled, prefill and every decode step through
    neuroncc, the tokens eager's, nothing run eagerly."""
    kw = {"max_new_tokens": new_tokens, "do_sample": False}
    want = model.generate(ids, **kw)
    eager_forward = model.forward
    model.forward = torch.compile(eager_forward, backend="neuron", options={"fallback": False})
    try:
        got = model.generate(ids, **kw)
    finally:
        model.forward = eager_forward
    assert got.tolist() == want.tolist()
    s = neuroncc.stats()
    assert s["executions"] >= new_tokens and s["fallback_nodes"] == {}, s


def neuron_compile_config():
    """The supported way to make `generate` compile on a CPU host (transformers 5.24 compiles
    by itself only on cuda/xpu/neuron/tpu devices): an explicit CompileConfig with
    `_compile_all_devices` set."""
    cc = transformers.CompileConfig(
        backend="neuron", fullgraph=False, dynamic=False, mode="default"
    )
    cc._compile_all_devices = True
    return cc


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_logits_and_training_step(arch, fresh):
    model = small_model(arch).eval()
    ids = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(1))

    # 1. Greedy decoding with a static KV cache: the compiled decode step mutates the cache.
    want = model.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static")
    got = model.generate(
        ids,
        max_new_tokens=5,
        do_sample=False,
        cache_implementation="static",
        compile_config=neuron_compile_config(),
    )
    assert got.tolist() == want.tolist()
    s = neuroncc.stats()
    assert s["compiles"] >= 1 and s["executions"] >= 4, s

    # 2. Full-sequence forward.
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(
            torch.compile(model, backend="neuron")(ids).logits, model(ids).logits, **TOL
        )

    # 3. A training step: loss and every gradient.
    model.train()
    torch._dynamo.reset()
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    out_c = torch.compile(model, backend="neuron")(ids, labels=ids)
    torch.testing.assert_close(out_c.loss, out.loss, **TOL)
    out_c.loss.backward()
    for n, p in model.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-3, atol=1e-5, msg=n)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randint(1, 256, (40, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _train(backend: str | None) -> list[float]:
    model = small_model("llama")
    extra = {"torch_compile_backend": backend} if backend else {}
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=10,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        **extra,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_trainer_with_neuron_backend(fresh):
    eager = _train(None)
    compiled = _train("neuron")
    assert len(compiled) == 10
    assert compiled == pytest.approx(eager, rel=1e-4)
    s = neuroncc.stats()
    assert s["compiles"] >= 2 and s["executions"] >= 20 and s["fallback_nodes"] == {}, s


def small_flux(layers: int):
    """A diffusers Flux transformer of `layers` double- and single-stream blocks, random
    weights, and inputs for it."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=layers,
        num_single_layers=layers,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(2, 2, 4),
    ).eval()
    inputs = {
        "hidden_states": torch.randn(1, 16, 4),
        "encoder_hidden_states": torch.randn(1, 5, 16),
        "pooled_projections": torch.randn(1, 8),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.randn(16, 3),
        "txt_ids": torch.randn(5, 3),
    }
    return model, inputs


def test_diffusers_regional_compile_shares_one_compile(fresh):
    model, inputs = small_flux(2)
    with torch.no_grad():
        want = model(**inputs).sample
        model.compile_repeated_blocks(backend="neuron")
        got = model(**inputs).sample
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    s = neuroncc.stats()
    # Two block classes (double- and single-stream), two layers each: parameters stay graph
    # inputs, so each class compiles once and its second layer reuses the compile. (Beside
    # them: the transposes that lay the weights out, Note [weight layout].)
    blocks = [c for c in GRAPH_CACHE.values() if "_layout" not in c.exe.name]
    assert len(blocks) == 2, [c.exe.name for c in blocks]
    assert s["executions"] - s["weight_layouts"] == 4, s
    assert s["weight_layouts"] > 0, s


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bf16_forward(arch, fresh):
    model = small_model(arch).to(torch.bfloat16).eval()
    ids = torch.randint(1, 256, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        got = torch.compile(model, backend="neuron")(ids).logits
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert neuroncc.stats()["fallback_nodes"] == {}
