"""The sweep: the shapes real models run, written as users write them, against the roofline.

    python tools/bench.py --sweep                 # everything (hours: every shape, form, target)
    python tools/bench.py --sweep-quick           # a subset, about a minute
    python tools/sweep.py --match gemm/trn1 --quick   # a part of it on its own

The shapes come from the published configs of real models (MODELS), never picked by hand:
every linear of each model in each form users write it (nn.Linear, F.linear, x @ W.T, a @ b,
torch.bmm, einsum) at TOKENS rows; LayerNorm and RMSNorm at each hidden size, with and without
their weight (and bias); softmax over rows of each hidden size; attention at each model's head
size and heads / KV heads, causal and not, at SEQS; fp32 and bf16; trn1 and trn2.

Each case is compiled with torch.compile(backend="neuron") in timing_only mode on `meta`
tensors: nothing is computed, on the host or the simulator, so an 8192-row GEMM costs only
its compile. Its steady-state device time (the second call: weights laid out once, Note
[weight layout], are not in it) is set against the roofline the compiler reports (TensorE's
peak at the operands' dtype, or HBM bandwidth, whichever bounds the case), so a fraction of
1.0 is the hardware's limit. A case that falls back or fails counts as 0 and says why.

TARGETS are the issue's minimums; `summary` says which hold.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import neuroncc


@dataclass(frozen=True)
class ModelConfig:
    """The dimensions of a published model that its kernels' shapes follow from."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    gated: bool = True  # a SwiGLU MLP (gate, up, down); else fc and proj
    fused_qkv: bool = False  # one [hidden, 3 hidden] projection (GPT-2's c_attn)
    norm: str = "rms"  # "rms" or "layer"

    def linears(self) -> list[tuple[str, int, int]]:
        """(name, K, N) of each distinct projection."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [("qkv", h, q + 2 * kv)] if self.fused_qkv else [("q", h, q), ("kv", h, kv)]
        out.append(("o", q, h))
        out += [("gate_up" if self.gated else "fc", h, self.intermediate)]
        out.append(("down", self.intermediate, h))
        seen, unique = set(), []
        for name, k, n in out:
            if (k, n) not in seen:
                seen.add((k, n))
                unique.append((name, k, n))
        return unique


# Published configs (the models' config.json on the Hugging Face Hub).
MODELS = [
    ModelConfig("llama-3.2-1b", 2048, 8192, 32, 8, 64),
    ModelConfig("llama-3.2-3b", 3072, 8192, 24, 8, 128),
    ModelConfig("llama-3-8b", 4096, 14336, 32, 8, 128),
    ModelConfig("qwen3-0.6b", 1024, 3072, 16, 8, 128),
    ModelConfig("qwen3-1.7b", 2048, 6144, 16, 8, 128),
    ModelConfig("qwen3-4b", 2560, 9728, 32, 8, 128),
    ModelConfig("qwen3-8b", 4096, 12288, 32, 8, 128),
    ModelConfig("mistral-7b", 4096, 14336, 32, 8, 128),
    ModelConfig("gemma-2-2b", 2304, 9216, 8, 4, 256),
    ModelConfig("phi-3-mini", 3072, 8192, 32, 32, 96),
    ModelConfig("gpt2", 768, 3072, 12, 12, 64, gated=False, fused_qkv=True, norm="layer"),
    ModelConfig("bert-base", 768, 3072, 12, 12, 64, gated=False, norm="layer"),
    ModelConfig("vit-base", 768, 3072, 12, 12, 64, gated=False, norm="layer"),
]
QUICK_MODELS = ("gpt2", "qwen3-0.6b")
TOKENS = (1, 128, 2048, 8192)
QUICK_TOKENS = (1, 128)
SEQS = (128, 512, 2048, 8192)
QUICK_SEQS = (128,)
ROWS = 4096  # rows of the norms and softmax
DTYPES = (torch.float32, torch.bfloat16)
SWEEP_TARGETS = ("trn1", "trn2")
GEMM_FORMS = ("nn.Linear", "F.linear", "x @ W.T", "a @ b", "torch.bmm", "einsum")
QUICK_FORMS = ("nn.Linear", "a @ b")


@dataclass(frozen=True)
class Case:
    kind: str  # gemm, decode, layernorm, rmsnorm, softmax, attention
    model: str  # the first model with this shape
    form: str
    shape: str
    dtype: torch.dtype
    target: str
    make: Callable[[], tuple[Callable, list[torch.Tensor]]]  # -> (fn, meta inputs)

    @property
    def label(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        return f"{self.kind}/{self.target}/{dt}/{self.form}/{self.shape}"


@dataclass
class Result:
    label: str
    kind: str
    model: str
    target: str
    device_us: float
    roofline_us: float
    fraction: float
    error: str = ""


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


class _Weighted(nn.Module):
    """A module holding W [N, K] that applies it to x as `form` writes it."""

    def __init__(self, form: str, k: int, n: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.form = form
        self.weight = nn.Parameter(_meta(n, k, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "F.linear":
            return F.linear(x, self.weight)
        if self.form == "x @ W.T":
            return x @ self.weight.T
        return torch.einsum("mk,nk->mn", x, self.weight)


def _gemm(form: str, m: int, k: int, n: int, dtype: torch.dtype):
    def make():
        x = _meta(m, k, dtype=dtype)
        if form == "nn.Linear":
            return nn.Linear(k, n, bias=False, dtype=dtype, device="meta"), [x]
        if form == "a @ b":
            return torch.matmul, [x, _meta(k, n, dtype=dtype)]
        if form == "torch.bmm":
            return torch.bmm, [x.unsqueeze(0), _meta(1, k, n, dtype=dtype)]
        return _Weighted(form, k, n, dtype), [x]

    return make


def _norm(kind: str, affine: bool, rows: int, h: int, dtype: torch.dtype):
    def make():
        x = _meta(ROWS, h, dtype=dtype)
        if kind == "layernorm":
            module = nn.LayerNorm(h, elementwise_affine=affine, dtype=dtype, device="meta")
        else:
            module = nn.RMSNorm(h, elementwise_affine=affine, dtype=dtype, device="meta")
        return module, [x]

    return make


def _softmax(rows: int, h: int, dtype: torch.dtype):
    return lambda: ((lambda x: torch.softmax(x, -1)), [_meta(ROWS, h, dtype=dtype)])


def _attention(cfg: ModelConfig, seq: int, causal: bool, dtype: torch.dtype):
    def make():
        q = _meta(1, cfg.heads, seq, cfg.head_dim, dtype=dtype)
        k, v = (_meta(1, cfg.kv_heads, seq, cfg.head_dim, dtype=dtype) for _ in range(2))
        gqa = cfg.kv_heads != cfg.heads

        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        return fn, [q, k, v]

    return make


def cases(quick: bool = False) -> list[Case]:
    """Every case of the sweep (or its quick subset), each distinct shape once."""
    models = [m for m in MODELS if not quick or m.name in QUICK_MODELS]
    tokens, seqs = (QUICK_TOKENS, QUICK_SEQS) if quick else (TOKENS, SEQS)
    forms = QUICK_FORMS if quick else GEMM_FORMS
    out: dict[str, Case] = {}

    def add(case: Case) -> None:
        out.setdefault(case.label, case)

    for target in SWEEP_TARGETS:
        for dtype in DTYPES:
            for cfg in models:
                for name, k, n in cfg.linears():
                    for m in tokens:
                        for form in forms:
                            kind = "decode" if m == 1 else "gemm"
                            make = _gemm(form, m, k, n, dtype)
                            add(Case(kind, cfg.name, form, f"{m}x{k}x{n}", dtype, target, make))
                h = cfg.hidden
                for kind in ("layernorm", "rmsnorm"):
                    for affine in (False, True):
                        form = "affine" if affine else "plain"
                        make = _norm(kind, affine, ROWS, h, dtype)
                        add(Case(kind, cfg.name, form, f"{ROWS}x{h}", dtype, target, make))
                make = _softmax(ROWS, h, dtype)
                add(Case("softmax", cfg.name, "softmax", f"{ROWS}x{h}", dtype, target, make))
                for seq in seqs:
                    for causal in (False, True):
                        shape = f"{cfg.heads}/{cfg.kv_heads}x{seq}x{cfg.head_dim}"
                        form = "causal" if causal else "full"
                        make = _attention(cfg, seq, causal, dtype)
                        add(Case("attention", cfg.name, form, shape, dtype, target, make))
    return list(out.values())


def run_case(case: Case, cache_dir: str) -> Result:
    """The case's steady-state device time against its roofline, or why it has none."""
    fn, inputs = case.make()
    torch._dynamo.reset()
    options = {"timing_only": True, "target": case.target, "cache_dir": cache_dir}
    compiled = torch.compile(fn, backend="neuron", options=options)
    error = ""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # timing_only's "outputs come from eager"
            compiled(*inputs)
            neuroncc.reset_stats()
            compiled(*inputs)
        stats = neuroncc.stats()
    except Exception as e:  # noqa: BLE001  (report the case, go on with the sweep)
        stats, error = {}, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    if stats.get("fallback_nodes") or stats.get("compiler_errors"):
        error = f"fell back: {stats['fallback_nodes'] or stats['compiler_errors']}"
    device, roofline = stats.get("device_seconds", 0.0), stats.get("roofline_seconds", 0.0)
    fraction = roofline / device if device and not error else 0.0
    return Result(
        case.label,
        case.kind,
        case.model,
        case.target,
        device * 1e6,
        roofline * 1e6,
        fraction,
        error,
    )


def _dims(label: str) -> list[int]:
    return [int(d) for d in label.rsplit("/", 1)[1].replace("/", "x").split("x")]


# The minimums: (what the rule covers, the least fraction of the roofline).
def _target(r: Result) -> float | None:
    if r.kind == "gemm":
        return 0.75 if min(_dims(r.label)) >= 512 else None
    if r.kind == "decode":
        return 0.80
    if r.kind in ("layernorm", "rmsnorm", "softmax"):
        return 0.80 if 512 <= _dims(r.label)[-1] <= 16384 else None
    if r.kind == "attention":
        return 0.60 if _dims(r.label)[2] >= 512 else 0.30
    return None


def summary(results: list[Result]) -> dict:
    """The distribution (minimum, median, geomean, the worst ten) and, per kind, how many
    cases meet their minimum."""
    fr = [r.fraction for r in results]
    positive = [f for f in fr if f > 0]
    per_kind = {}
    for kind in sorted({r.kind for r in results}):
        rs = [r for r in results if r.kind == kind]
        ruled = [(r, _target(r)) for r in rs if _target(r) is not None]
        per_kind[kind] = {
            "cases": len(rs),
            "min": min(r.fraction for r in rs),
            "median": statistics.median(r.fraction for r in rs),
            "meeting_target": sum(r.fraction >= t for r, t in ruled),
            "with_target": len(ruled),
        }
    return {
        "cases": len(results),
        "failed": sum(1 for r in results if r.error),
        "min": min(fr) if fr else 0.0,
        "median": statistics.median(fr) if fr else 0.0,
        "geomean": math.exp(statistics.fmean(math.log(f) for f in positive)) if positive else 0.0,
        "per_kind": per_kind,
        "worst": [asdict(r) for r in sorted(results, key=lambda r: r.fraction)[:10]],
    }


def print_summary(s: dict) -> None:
    print(
        f"\nsweep: {s['cases']} cases, {s['failed']} failed; fraction of roofline: "
        f"min {s['min']:.1%}, median {s['median']:.1%}, geomean {s['geomean']:.1%}"
        " (target: geomean >= 75%)"
    )
    print(f"  {'kind':10} {'cases':>5} {'min':>7} {'median':>7}  meeting their minimum")
    for kind, k in s["per_kind"].items():
        met = f"{k['meeting_target']}/{k['with_target']}" if k["with_target"] else "-"
        print(f"  {kind:10} {k['cases']:5d} {k['min']:7.1%} {k['median']:7.1%}  {met}")
    print("  the worst ten:")
    for r in s["worst"]:
        why = f"  ({r['error']})" if r["error"] else ""
        print(
            f"    {r['fraction']:6.1%}  {r['device_us']:10.1f} us  {r['label']}  [{r['model']}]{why}"
        )


def run(quick: bool = False, match: str | None = None, progress: bool = True) -> dict:
    """Every case (or those whose label contains `match`): the results and their summary."""
    chosen = [c for c in cases(quick) if not match or match in c.label]
    results = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        for i, case in enumerate(chosen):
            results.append(run_case(case, cache))
            if progress:
                r = results[-1]
                print(f"  [{i + 1}/{len(chosen)}] {r.fraction:6.1%} {r.label}", flush=True)
    return {
        "seconds": time.perf_counter() - start,
        "summary": summary(results) if results else {},
        "results": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick subset")
    p.add_argument("--match", help="only cases whose label contains this (kind/target/dtype/form)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    report = run(args.quick, args.match)
    if report["summary"]:
        print_summary(report["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
