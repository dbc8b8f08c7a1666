"""Which modern architectures compile whole: Hugging Face causal LMs from small random configs
through torch.compile(backend="neuron"), against eager PyTorch.

    python tools/arch_survey.py                       # every family, forward, train, generate
    python tools/arch_survey.py --only mamba2,qwen3_next --modes train

Per family and mode: `fwd` (full-sequence logits without autograd), `train` (loss and every
gradient), `gen` (5 greedy tokens; the static cache where transformers compiles `generate`,
else the model's own cache with `model.forward` compiled). A case is whole when nothing fell
back (`stats()["fallback_nodes"]`) and no compiler error happened; it matches when the numbers
are eager's (logits 1e-3 / 1e-4, gradients within 1e-3, tokens equal). Each test of the suite
covers one family (tests/e2e/test_moe.py, test_complex_rope.py, test_linear_attention.py,
test_ssm.py); this is the whole table, for the closing notes of issue 23.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import torch
import transformers
from transformers.integrations import moe  # noqa: F401  (registers the grouped matmul ops)

import neuroncc

SMALL = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}
MOE = {
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "head_dim": 16,
}
MLA = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "head_dim": 8,
    "first_k_dense_replace": 1,
    "n_shared_experts": 1,
}
LINEAR = {
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "head_dim": 16,
    "layer_types": ["linear_attention", "full_attention"],
}
HYBRID_MAMBA = {"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_chunk_size": 8}
# family -> (config overrides, cache for generate: "static" or None for the model's own)
FAMILIES = {
    "mixtral": (MOE, "static"),
    "qwen2_moe": ({**MOE, "shared_expert_intermediate_size": 32}, "static"),
    "qwen3_moe": (MOE, "static"),
    "deepseek_v2": ({**MOE, **MLA, "topk_method": "greedy"}, "static"),
    "deepseek_v3": ({**MOE, **MLA, "n_group": 1, "topk_group": 1}, "static"),
    "gpt_oss": ({**MOE, "sliding_window": 32}, "static"),
    "phimoe": (MOE, "static"),
    "olmoe": (MOE, "static"),
    "granitemoe": (MOE, "static"),
    "jamba": (
        {
            **MOE,
            "attn_layer_offset": 1,
            "attn_layer_period": 2,
            "expert_layer_offset": 1,
            "expert_layer_period": 2,
            "mamba_d_state": 8,
            "mamba_dt_rank": 8,
            "use_mamba_kernels": False,
        },
        None,
    ),
    "llama4_text": (
        {
            **MOE,
            "num_experts_per_tok": 1,
            "intermediate_size_mlp": 128,
            "interleave_moe_layer_step": 1,
            "no_rope_layers": [1, 1],
            "attention_chunk_size": 64,
        },
        None,
    ),
    "mamba": ({"state_size": 8, "time_step_rank": 4, "hidden_size": 32}, None),
    "mamba2": (
        {"state_size": 16, "n_groups": 1, "num_heads": 8, "head_dim": 16, "chunk_size": 8},
        None,
    ),
    "falcon_h1": (
        {
            "mamba_d_ssm": 64,
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_d_state": 16,
            "mamba_chunk_size": 8,
            "head_dim": 16,
        },
        None,
    ),
    "qwen3_next": (
        {**MOE, **LINEAR, "shared_expert_intermediate_size": 32},
        None,
    ),
    "qwen3_5_text": (LINEAR, None),
    "kimi_linear": (
        {
            **MOE,
            **MLA,
            "layer_types": ["linear_attention", "full_attention"],
            "head_dim": 16,
            "linear_head_dim": 16,
            "linear_num_heads": 4,
        },
        None,
    ),
    "minimax": (MOE, None),
    "minimax_m2": (MOE, "static"),
    "hunyuan_v1_moe": (MOE, "static"),
    "granitemoeshared": (MOE, "static"),
    "falcon_mamba": ({}, None),
    "bamba": ({**MOE, **HYBRID_MAMBA, "attn_layer_indices": [1]}, None),
    "granitemoehybrid": (
        {**MOE, **HYBRID_MAMBA, "layer_types": ["linear_attention", "full_attention"]},
        None,
    ),
    "zamba2": (
        {
            **MOE,
            "layers_block_type": ["mamba", "hybrid"],
            "mamba_d_state": 16,
            "mamba_headdim": 16,
            "n_mamba_heads": 8,
            "chunk_size": 8,
        },
        None,
    ),
    "lfm2": (MOE, None),
    "lfm3": ({**MOE, "layer_types": ["conv", "full_attention"]}, None),
    "nemotron_h": (MOE, None),  # its default layer pattern is long: about 90 s
}


def model_of(family: str):
    """A causal LM of any transformers family from SMALL (and the family's overrides, for those
    in FAMILIES), random weights from seed 0; dropout off, so that eager and compiled training
    steps are comparable (they would draw different random masks)."""
    torch.manual_seed(0)
    overrides = FAMILIES.get(family, ({}, None))[0]
    cfg = transformers.AutoConfig.for_model(family, **{**SMALL, **overrides})
    for key, value in list(cfg.to_dict().items()):
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(cfg, key, 0.0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def _compile_config():
    cc = transformers.CompileConfig(backend="neuron", fullgraph=False, dynamic=False)
    cc._compile_all_devices = True  # transformers compiles generate itself on accelerators only
    return cc


def run_case(family: str, mode: str) -> tuple[bool, str]:
    """(matches eager, how far off); nothing fell back is read from stats() by the caller."""
    model = model_of(family)
    ids = torch.randint(1, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    if mode == "fwd":
        with torch.no_grad():
            want = model.eval()(ids, use_cache=False).logits
            got = torch.compile(model, backend="neuron")(ids, use_cache=False).logits
        err = (got - want).abs().max().item()
        return torch.allclose(got, want, rtol=1e-3, atol=1e-4), f"logits {err:.1e}"
    if mode == "train":
        got = torch.compile(model, backend="neuron")(ids, labels=ids, use_cache=False).loss
        got.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        want = model(ids, labels=ids, use_cache=False).loss
        want.backward()
        errs = [
            (g - dict(model.named_parameters())[n].grad).abs().max().item()
            for n, g in grads.items()
        ]
        err = max([abs(got.item() - want.item()), *errs])
        return err < 1e-3, f"loss/grads {err:.1e}"
    model.eval()
    kw = {"max_new_tokens": 5, "do_sample": False}
    if FAMILIES[family][1] == "static":
        kw["cache_implementation"] = "static"
        want = model.generate(ids[:, :8], **kw)
        got = model.generate(ids[:, :8], compile_config=_compile_config(), **kw)
    else:
        want = model.generate(ids[:, :8], **kw)
        model.forward = torch.compile(model.forward, backend="neuron")
        got = model.generate(ids[:, :8], **kw)
    return got.tolist() == want.tolist(), f"{neuroncc.stats()['executions']} executions"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated families (default: all)")
    ap.add_argument("--modes", default="fwd,train,gen")
    args = ap.parse_args(argv)
    families = args.only.split(",") if args.only else list(FAMILIES)
    warnings.filterwarnings("ignore")
    rows = []
    for family in families:
        for mode in args.modes.split(","):
            torch._dynamo.reset()
            neuroncc.reset_stats()
            start = time.perf_counter()
            try:
                ok, how = run_case(family, mode)
            except Exception as e:  # noqa: BLE001  (report, go on with the others)
                traceback.print_exc()
                ok, how = False, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            s = neuroncc.stats()
            fell = {**s["fallback_nodes"], **s["compiler_errors"]}
            whole = "whole" if not fell else "fell back: " + ", ".join(sorted(fell))
            row = (family, mode, "yes" if ok else "NO", whole, how, time.perf_counter() - start)
            print("{:14s} {:5s} matches {:3s}  {}  ({}, {:.1f} s)".format(*row), flush=True)
            rows.append(row)
    bad = [r for r in rows if r[2] != "yes" or r[3] != "whole"]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} cases compile whole and match eager")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
