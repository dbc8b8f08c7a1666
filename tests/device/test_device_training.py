"""Training on the `neuron` device: optimizers (AdamW foreach, the fused Adam kernels' math),
the Trainer and PEFT LoRA, each against the CPU."""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import neuroncc

pytestmark = pytest.mark.filterwarnings("ignore:neuroncc runs")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_a_small_mlp_on_the_device_matches_cpu(compiled, fresh):
    """Two AdamW (foreach) steps on the device, eagerly or through torch.compile, give the
    CPU's parameters."""

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))

    model, dev = make(), make().to("neuron")
    step = torch.compile(dev, backend="neuron") if compiled else dev
    x, y = torch.randn(16, 12), torch.randint(0, 3, (16,))
    for m, run, xs, ys in ((model, model, x, y), (dev, step, x.to("neuron"), y.to("neuron"))):
        opt = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(run(xs), ys).backward()
            opt.step()
    for p, q in zip(model.parameters(), dev.parameters(), strict=True):
        assert q.device.type == "neuron"
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    s = neuroncc.stats()
    assert s["fallback_nodes"] == {} and (s["executions"] > 0) == compiled, s


@pytest.mark.parametrize(
    "opt, kwargs",
    [
        (torch.optim.AdamW, {}),
        (torch.optim.AdamW, {"amsgrad": True, "weight_decay": 0.1}),
        (torch.optim.Adam, {"maximize": True, "weight_decay": 0.1}),
        (torch.optim.AdamW, {"lr": torch.tensor(0.01)}),
    ],
    ids=["adamw", "adamw-amsgrad", "adam-maximize", "adamw-tensor-lr"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_adam_steps_compile_and_match_cpus_fused_kernel(opt, kwargs, dtype, fresh):
    """Adam/AdamW(fused=True), the Trainer's default optimizer, compiled on the device (its
    fused op as the update's math, decomp_optim.py): three steps give the CPU fused kernel's
    parameters and moments."""
    torch.manual_seed(0)
    params = [torch.randn(17, 5, dtype=dtype), torch.randn(3, dtype=dtype)]
    cpu = [p.clone().requires_grad_() for p in params]
    dev = [p.to("neuron").requires_grad_() for p in params]

    def copied(kw):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}

    opts = opt(cpu, fused=True, **copied(kwargs)), opt(dev, fused=True, **copied(kwargs))
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, q, g in zip(cpu, dev, grads, strict=True):
            p.grad, q.grad = g.clone(), g.to("neuron")
        for o in opts:
            o.step()
    tol = {"rtol": 0, "atol": 0} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
    for p, q in zip(cpu, dev, strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **tol)
        for name in opts[0].state[p]:
            torch.testing.assert_close(opts[1].state[q][name].cpu(), opts[0].state[p][name], **tol)
    s = neuroncc.stats()
    assert s["fallback_nodes"] == {} and not s["compiler_errors"], s


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_the_fused_adam_decomposition_is_pytorchs_kernel_with_a_grad_scaler(found_inf):
    """The decomposition against PyTorch's CPU kernel with what a GradScaler passes: the
    gradients come back unscaled, and a step that found an overflow changes nothing."""
    from neuroncc.frontend.decomp_optim import OPTIMIZER_DECOMPOSITIONS

    torch.manual_seed(1)
    p, g, m, v, mx = ([torch.rand(6, 4)] for _ in range(5))
    steps = [torch.tensor(3.0)]
    options = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "eps": 1e-8}
    options |= {"amsgrad": True, "maximize": False, "grad_scale": torch.tensor(64.0)}
    options |= {"found_inf": torch.tensor(found_inf)}
    want = [[t.clone() for t in x] for x in (p, g, m, v, mx)]
    torch._fused_adamw_(*want, steps, **options)
    got = OPTIMIZER_DECOMPOSITIONS[torch.ops.aten._fused_adamw.default](
        p, g, m, v, mx, steps, **options
    )
    for w, x in zip(want, got, strict=True):
        torch.testing.assert_close(x[0], w[0], rtol=1e-6, atol=1e-7)
    if found_inf:
        torch.testing.assert_close(got[0][0], p[0], rtol=0, atol=0)


def test_the_trainer_trains_on_the_device():
    """transformers' Trainer on `neuron` (accelerate picks it from ACCELERATE_TORCH_DEVICE):
    its default fused AdamW compiles, nothing falls back, and the loss is the CPU's."""
    code = textwrap.dedent(
        """
        import os, torch
        from torch.utils.data import Dataset
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
        import neuroncc

        class Data(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
                return {"input_ids": ids, "labels": ids}

        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
            num_key_value_heads=1, num_hidden_layers=1, vocab_size=64)
        model = LlamaForCausalLM(config)
        cpu = "ACCELERATE_TORCH_DEVICE" not in os.environ
        args = TrainingArguments(output_dir=os.environ["OUT"], per_device_train_batch_size=2,
            max_steps=2, report_to=[], save_strategy="no", use_cpu=cpu, disable_tqdm=True)
        loss = Trainer(model=model, args=args, train_dataset=Data()).train().training_loss
        assert next(model.parameters()).device.type == ("cpu" if cpu else "neuron")
        s = neuroncc.stats()
        assert s["fallback_nodes"] == {} and (s["eager_executions"] > 0) != cpu, s
        print(loss)
        """
    )
    losses = []
    for device in ({}, {"ACCELERATE_TORCH_DEVICE": "neuron"}):
        env = os.environ | {"PYTHONWARNINGS": "ignore"} | device
        env.pop("ACCELERATE_TORCH_DEVICE", None) if not device else None
        with tempfile.TemporaryDirectory() as out:
            run = subprocess.run(
                [sys.executable, "-c", code],
                check=True,
                capture_output=True,
                text=True,
                env=env | {"OUT": out},
            )
        losses.append(float(run.stdout.split()[-1]))
    assert losses[1] == pytest.approx(losses[0], abs=1e-4)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_lora_fine_tuning_on_the_device_matches_cpu(compiled, fresh):
    """PEFT's LoRA on a small Llama, on the device eagerly or through torch.compile: three
    AdamW steps give the CPU's losses and adapter weights; the frozen base is untouched."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    def make():
        torch.manual_seed(0)
        config = LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_hidden_layers=1,
            vocab_size=64,
        )
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        model = get_peft_model(LlamaForCausalLM(config), lora)
        for name, p in model.named_parameters():
            if "lora_B" in name:  # (B starts at zero: make the adapters do something)
                torch.nn.init.normal_(p, std=0.1)
        return model

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    runs = []
    for device in ("cpu", "neuron"):
        model = make().to(device)
        step = torch.compile(model, backend="neuron") if compiled and device == "neuron" else model
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        for _ in range(3):
            loss = step(ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs.append((losses, {n: p.detach().cpu() for n, p in model.named_parameters()}))
    (want, cpu), (got, dev) = runs
    assert got == pytest.approx(want, abs=1e-4)
    base = make()
    for name, p in cpu.items():
        torch.testing.assert_close(dev[name], p, rtol=1e-3, atol=1e-4)
        if "lora_" not in name:
            assert torch.equal(p, base.get_parameter(name).detach())
    s = neuroncc.stats()
    assert s["fallback_nodes"] == {} and (s["executions"] > 0) == compiled, s
