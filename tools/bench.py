"""The benchmark suite: how close neuroncc's programs come to the NeuronCore's limits.

    python tools/bench.py                    # every workload, table + bench.json
    python tools/bench.py --quick            # tiny shapes (what the tests run)
    python tools/bench.py --only gemm,softmax --json out.json
    python tools/bench.py --timing-only      # no numerics: fast, but no simulator wall time
    python tools/bench.py --sweep-quick      # and the sweep of real models' shapes (sweep.py)
    python tools/bench.py --only none --sweep   # the whole sweep alone (hours)

After the workloads: the persistent cache's figures (tools/bench_cache.py), unless --only or
--no-cache.

Per workload, at opt_level 2: simulated device time, the roofline bound and the fraction of it
achieved, MFU, HBM bytes moved at opt_level 2 vs 0, the HBM footprint (the largest executable's
buffers) at 2 over 0, neuroncc's compile wall time and Inductor's on the same function in the
same run (cold cache), and the simulator's wall time vs eager PyTorch's. Forward-only workloads
run without autograd, as inference does.
Ratios, not absolute times, are what to compare: this machine is noisy.

The big GEMM (bf16 4096x8192x8192 on trn1) is compiled from its IR and timed without numerics:
running it through torch.compile would need an eager bf16 GEMM of 5.5e14 FLOPs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import neuroncc
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.codegen.lower import emit_graph
from neuroncc.frontend.weight_layout import LAID_OUT
from neuroncc.ir import DType, GraphBuilder, Op, TensorType
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.runtime.cache import GRAPH_CACHE
from neuroncc.runtime.stats import STATS
from neuroncc.runtime.timing import time_executable


@dataclass
class Row:
    name: str
    target: str
    device_us: float
    roofline_us: float
    fraction: float
    mfu: float
    hbm_mb_o2: float
    hbm_mb_o0: float
    mem_mb_o2: float  # HBM footprint: the largest executable's buffers (passes/plan.py)
    mem_mb_o0: float
    compile_s: float
    inductor_compile_s: float | None
    sim_s: float | None
    eager_s: float | None
    # device time of laying the weights out, once, on the first call (Note [weight layout])
    layout_us: float = 0.0

    @property
    def sim_over_eager(self) -> float | None:
        return self.sim_s / self.eager_s if self.sim_s and self.eager_s else None


@dataclass
class Workload:
    name: str
    make: Callable[[bool], tuple[Callable, list[torch.Tensor]]]  # quick -> (fn, inputs)
    backward: bool = False
    target: str = "trn2"


def _attention(seq: int, quick: bool):
    heads, dim = (2, 16) if quick else (8, 64)
    seq = 16 if quick else seq
    q, k, v = (torch.randn(1, heads, seq, dim) for _ in range(3))
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]


def _norm_input(quick: bool) -> torch.Tensor:
    return torch.randn(256, 64) if quick else torch.randn(4096, 4096)  # 64 MiB of fp32


class Block(nn.Module):
    """A pre-norm transformer block: GPT-2 style (LayerNorm, GELU MLP) or Llama style (RMSNorm,
    SwiGLU MLP)."""

    def __init__(self, dim: int, heads: int, llama: bool) -> None:
        super().__init__()
        self.heads, self.llama = heads, llama
        norm = nn.RMSNorm if llama else nn.LayerNorm
        self.n1, self.n2 = norm(dim), norm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=not llama), nn.Linear(dim, dim)
        hidden = 4 * dim
        self.up = nn.Linear(dim, 2 * hidden if llama else hidden, bias=not llama)
        self.down = nn.Linear(hidden, dim, bias=not llama)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.up(self.n2(x))
        if self.llama:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return x + self.down(h)


def _block(llama: bool, quick: bool, seq: int = 512, dim: int = 768, heads: int = 12):
    torch.manual_seed(0)
    dim, heads, seq = (32, 2, 16) if quick else (dim, heads, seq)
    block = Block(dim, heads, llama)
    return block, [torch.randn(1, seq, dim)]


def _mlp(quick: bool):
    torch.manual_seed(0)
    d = 32 if quick else 1024
    mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    return mlp, [torch.randn(64 if quick else 512, d)]


def _moe(quick: bool, tokens: int):
    """transformers' Mixtral sparse MoE block (8 experts, top 2, hidden 1024, experts 2048
    wide) through its grouped matmul, as a model from `from_pretrained` runs it."""
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    hidden, inner = (32, 64) if quick else (1024, 2048)
    cfg = transformers.MixtralConfig(
        hidden_size=hidden,
        intermediate_size=inner,
        num_local_experts=8,
        num_experts_per_tok=2,
        experts_implementation="grouped_mm",
    )
    return MixtralSparseMoeBlock(cfg).eval(), [torch.randn(1, 4 if quick else tokens, hidden)]


def _mamba2(quick: bool, decode: bool):
    """transformers' Mamba-2 block (hidden 1024, 32 heads of 64, state 128, chunks of 128):
    the chunked scan over 512 tokens, or one decode step from the state a 16-token prompt
    left in its cache."""
    import transformers
    from transformers.cache_utils import DynamicCache
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Block

    torch.manual_seed(0)
    hidden, heads, state, chunk = (32, 4, 8, 8) if quick else (1024, 32, 128, 128)
    cfg = transformers.Mamba2Config(
        hidden_size=hidden,
        num_heads=heads,
        head_dim=2 * hidden // heads,
        state_size=state,
        n_groups=1,
        chunk_size=chunk,
        num_hidden_layers=1,
    )
    block = Mamba2Block(cfg, layer_idx=0).eval()
    if not decode:
        return (lambda x: block(x)), [torch.randn(1, 16 if quick else 512, hidden)]
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        block(torch.randn(1, 16, hidden), cache=cache)
    return (lambda x: block(x, cache=cache)), [torch.randn(1, 1, hidden)]


WORKLOADS = [
    Workload(
        "gemm_skinny_decode",
        lambda q: (
            torch.matmul,
            [torch.randn(1, 64 if q else 4096), torch.randn(64 if q else 4096, 64 if q else 4096)],
        ),
    ),
    Workload("mlp", _mlp),
    Workload("layernorm", lambda q: (lambda x: F.layer_norm(x, x.shape[-1:]), [_norm_input(q)])),
    Workload(
        "rmsnorm",
        lambda q: (
            lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
            [_norm_input(q)],
        ),
    ),
    Workload("softmax", lambda q: (lambda x: torch.softmax(x, -1), [_norm_input(q)])),
    Workload("attention_128", lambda q: _attention(128, q)),
    Workload("attention_512", lambda q: _attention(512, q)),
    Workload("attention_2048", lambda q: _attention(2048, q)),
    Workload("gpt2_block_fwd", lambda q: _block(False, q)),
    Workload("gpt2_block_fwd_bwd", lambda q: _block(False, q), backward=True),
    Workload("llama_block_fwd", lambda q: _block(True, q, dim=512, heads=8)),
    Workload("llama_decode_step", lambda q: _block(True, q, seq=1, dim=512, heads=8)),
    Workload("moe_prefill", lambda q: _moe(q, 512)),
    Workload("moe_decode_step", lambda q: _moe(q, 1)),
    Workload("mamba2_prefill", lambda q: _mamba2(q, decode=False)),
    Workload("mamba2_decode_step", lambda q: _mamba2(q, decode=True)),
]


def _call(fn, inputs, backward: bool):
    """A training step (forward and backward) or inference: forward-only workloads run
    without autograd, as inference does, so their graphs save nothing for a backward."""
    if not backward:
        with torch.no_grad():
            return fn(*inputs)
    out = fn(*inputs)
    out.float().sum().backward()
    return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _best_of(fn, runs: int = 3, min_seconds: float = 0.5) -> float:
    """The fastest of at least `runs` runs, repeated until `min_seconds` have passed: what the
    code costs, with this machine's noise taken out (simulator and eager get the same
    treatment). The time floor matters right after a simulation: numpy's BLAS threads spin for
    about 0.1 s after their last call, and on 2 cores they slow PyTorch's own threads down
    (attention_128 eager: 8 ms a call for the first 0.1 s, 0.2 ms after)."""
    times, start = [], time.perf_counter()
    while len(times) < runs or time.perf_counter() - start < min_seconds:
        times.append(_timed(fn))
    return min(times)


def _neuroncc(w: Workload, quick: bool, level: int, timing_only: bool = False):
    fn, inputs = w.make(quick)
    if w.backward:
        inputs = [x.requires_grad_() for x in inputs]
    torch._dynamo.reset()
    GRAPH_CACHE.clear()
    LAID_OUT.clear()
    with tempfile.TemporaryDirectory() as cache:  # cold, like Inductor's below
        options = {
            "opt_level": level,
            "target": w.target,
            "timing_only": timing_only,
            "cache_dir": cache,
        }
        compiled = torch.compile(fn, backend="neuron", options=options)
        neuroncc.reset_stats()
        first = _timed(lambda: _call(compiled, inputs, w.backward))
        first_device = neuroncc.stats()["device_seconds"]
        neuroncc.reset_stats()
        second = _timed(lambda: _call(compiled, inputs, w.backward))
        stats = neuroncc.stats()
        stats["layout_seconds"] = first_device - stats["device_seconds"]
        stats["footprint"] = max(c.exe.hbm_bytes for c in STATS.executed().values())
        if not timing_only:
            second = min(second, _best_of(lambda: _call(compiled, inputs, w.backward), 2))
    return stats, max(first - second, 0.0), second, fn, inputs


def _inductor_compile_s(fn, inputs, backward: bool) -> float | None:
    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            torch._dynamo.reset()
            torch._inductor.config.force_disable_caches = True
            compiled = torch.compile(fn, backend="inductor")
            first = _timed(lambda: _call(compiled, inputs, backward))
            second = _timed(lambda: _call(compiled, inputs, backward))
            return max(first - second, 0.0)
    except Exception as e:  # noqa: BLE001  (report, do not abort the suite)
        print(f"  inductor failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        return None


def run_workload(w: Workload, quick: bool, inductor: bool = True, timing_only: bool = False) -> Row:
    s2, compile_s, sim_s, fn, inputs = _neuroncc(w, quick, 2, timing_only)
    if not timing_only:
        # The first simulated run also proves the program race-free (the simulator's checker):
        # not compile time. Compile time is what a timing-only first call costs over a second.
        compile_s = _neuroncc(w, quick, 2, timing_only=True)[1]
    s0 = _neuroncc(w, quick, 0, timing_only)[0]
    eager_s = _best_of(lambda: _call(fn, inputs, w.backward))
    ind = _inductor_compile_s(fn, inputs, w.backward) if inductor else None
    device = s2["device_seconds"]
    return Row(
        w.name,
        w.target,
        device * 1e6,
        s2["roofline_seconds"] * 1e6,
        s2["roofline_seconds"] / device if device else 0.0,
        s2["mfu"],
        s2["hbm_bytes"] / 1e6,
        s0["hbm_bytes"] / 1e6,
        s2["footprint"] / 1e6,
        s0["footprint"] / 1e6,
        compile_s,
        ind,
        None if timing_only else sim_s,
        eager_s,
        s2["layout_seconds"] * 1e6,
    )


def gemm_row(quick: bool) -> Row:
    """bf16 lhsT.T @ rhs on trn1 with lhsT [K, M] delivered transposed, as in the NKI matmul
    tutorial; compiled from its IR and timed without numerics."""
    m, k, n = (256, 512, 512) if quick else (4096, 8192, 8192)
    t = get_target("trn1")
    rows = {}
    for level in (2, 0):
        b = GraphBuilder("gemm")
        lhs_t = b.input(TensorType((k, m), DType.BF16))
        w = b.input(TensorType((k, n), DType.BF16))
        a = b.op(Op.TRANSPOSE, lhs_t, perm=[1, 0])
        g = b.build([b.op(Op.MATMUL, a, w)])
        start = time.perf_counter()
        exe = emit_graph(run_pipeline(g, default_pipeline(level), PassContext(t)).graph, t)
        compile_s = time.perf_counter() - start
        rows[level] = (time_executable(exe, t), compile_s, exe.hbm_bytes)
    p, compile_s, footprint = rows[2]
    return Row(
        f"gemm_bf16_{m}x{k}x{n}",
        "trn1",
        p.device_ns / 1e3,
        p.roofline_ns / 1e3,
        p.roofline_fraction,
        p.mfu,
        p.hbm_bytes / 1e6,
        rows[0][0].hbm_bytes / 1e6,
        footprint / 1e6,
        rows[0][2] / 1e6,
        compile_s,
        None,
        None,
        None,
    )


def _fmt(v, spec: str) -> str:
    width = int(spec.lstrip(">").split(".")[0])
    return "-".rjust(width) if v is None else format(v, spec)


def print_table(rows: list[Row]) -> None:
    head = (
        f"{'workload':<24}{'target':>6}{'device us':>11}{'roofline':>10}{'frac':>7}{'MFU':>7}"
        f"{'HBM MB o2':>10}{'o0':>9}{'mem o2/o0':>10}{'compile s':>10}{'inductor':>9}{'sim/eager':>10}"
    )
    print(head)
    for r in rows:
        print(
            f"{r.name:<24}{r.target:>6}{r.device_us:>11.1f}{r.roofline_us:>10.1f}"
            f"{r.fraction:>7.1%}{r.mfu:>7.1%}{r.hbm_mb_o2:>10.2f}{r.hbm_mb_o0:>9.2f}"
            f"{r.mem_mb_o2 / r.mem_mb_o0:>10.2f}"
            f"{r.compile_s:>10.2f}{_fmt(r.inductor_compile_s, '>9.2f')}"
            f"{_fmt(r.sim_over_eager, '>10.1f')}"
        )
    laid_out = ", ".join(f"{r.name} {r.layout_us:.1f}" for r in rows if r.layout_us > 0.05)
    if laid_out:
        print(f"weights laid out on the first call (device us, not in the table): {laid_out}")
    fractions = [max(r.fraction, 1e-9) for r in rows]
    geo = math.exp(sum(math.log(f) for f in fractions) / len(fractions))
    print(f"geometric mean of the roofline fraction: {geo:.1%}")
    ratios = [r.compile_s / r.inductor_compile_s for r in rows if r.inductor_compile_s]
    if ratios:
        print(f"compile time / Inductor's: median {statistics.median(ratios):.2f} (target <= 0.25)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes")
    p.add_argument("--only", help="comma-separated workload names (substring match)")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor's compile times")
    p.add_argument(
        "--timing-only",
        action="store_true",
        help="time the compiled programs without simulating them (no sim/eager column)",
    )
    p.add_argument("--no-cache", action="store_true", help="skip the persistent-cache figures")
    p.add_argument("--json", default="bench.json", help="write the rows here")
    p.add_argument("--sweep", action="store_true", help="then the sweep (tools/sweep.py)")
    p.add_argument("--sweep-quick", action="store_true", help="then the sweep's quick subset")
    args = p.parse_args(argv)
    wanted = args.only.split(",") if args.only else None
    rows = []
    if not wanted or any(s in "gemm_bf16" for s in wanted):
        rows.append(gemm_row(args.quick))
        print(f"  {rows[-1].name}: {rows[-1].device_us:.1f} us", flush=True)
    for w in WORKLOADS:
        if wanted and not any(s in w.name for s in wanted):
            continue
        rows.append(run_workload(w, args.quick, not args.no_inductor, args.timing_only))
        print(f"  {w.name}: {rows[-1].device_us:.1f} us", flush=True)
    if rows:
        print_table(rows)
    report = {"workloads": [{**asdict(r), "sim_over_eager": r.sim_over_eager} for r in rows]}
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.sweep or args.sweep_quick:
        from tools import sweep

        report["sweep"] = sweep.run(quick=not args.sweep)
        if report["sweep"]["summary"]:
            sweep.print_summary(report["sweep"]["summary"])
    if not args.no_cache and not wanted:
        from tools import bench_cache

        report["cache"] = bench_cache.run(args.quick)
        bench_cache.print_report(report["cache"])
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
