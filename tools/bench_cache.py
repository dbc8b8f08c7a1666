"""The persistent cache's benchmark: what a hit costs next to a compile, and warmup throughput.

    python tools/bench_cache.py [--quick] [--json cache.json]

The graphs are those of the suite's transformer blocks (GPT-2 forward + backward, Llama
forward and decode step), its MLP, LayerNorm, softmax and attention at 512, recorded into a
manifest without compiling (trace only). Then:
- warmup throughput: `compile_manifest` into an empty cache with 1 and with 2 jobs;
- hit / compile: a new process loads each graph from the warm cache (read, checksum, decode),
  as the real run does, against the compile time the entry recorded (passes, emit, timing).
Target: a hit under 5% of the graph's compile time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neuroncc.frontend import recording, warmup
from tools import bench

WORKLOADS = (
    "gpt2_block_fwd_bwd",
    "llama_block_fwd",
    "llama_decode_step",
    "mlp",
    "layernorm",
    "softmax",
    "attention_512",
)

# Run in a new process: load every manifest entry from the cache, timed one by one.
_LOAD = """
import gc, json, sys, time
from neuroncc import __version__
from neuroncc.frontend.compile import disk_cache_for, graph_key
from neuroncc.frontend.recording import ManifestEntry, load_manifest
from neuroncc.options import CompileOptions
from neuroncc.runtime.cache import _remember
out = {}
gc.collect()  # the heap torch's import left: its first full collection is not a hit's cost
for e in load_manifest(sys.argv[1]):
    if not isinstance(e, ManifestEntry):
        continue
    opts = CompileOptions(**e.options, cache_dir=sys.argv[2])
    key = graph_key(e.ir, opts)
    start = time.perf_counter()
    entry = disk_cache_for(opts).load(key, __version__)
    _remember(key, entry, e.name)
    out[e.name] = {"hit_s": time.perf_counter() - start,
                   "compile_s": entry.meta["compile_seconds"],
                   "instructions": len(entry.executable.instructions)}
print(json.dumps(out))
"""


def record_manifest(path: Path, quick: bool) -> None:
    for w in bench.WORKLOADS:
        if w.name not in WORKLOADS:
            continue
        fn, inputs = w.make(quick)
        if w.backward:
            inputs = [x.requires_grad_() for x in inputs]
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="neuron", options={"disk_cache": False})
        with recording.record(path), recording.trace_only():
            bench._call(compiled, inputs, w.backward)


def run(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "graphs.jsonl"
        record_manifest(manifest, quick)
        throughput = {}
        for jobs in (1, 2):
            cache = str(Path(tmp) / f"cache{jobs}")
            s = warmup.compile_manifest(manifest, jobs=jobs, cache_dir=cache, progress=False)
            assert not s.failed, s.failed
            throughput[jobs] = {
                "graphs": len(s.compiled),
                "seconds": s.seconds,
                "graphs_per_s": len(s.compiled) / s.seconds,
            }
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD, str(manifest), str(Path(tmp) / "cache1")],
            check=True,
            capture_output=True,
            text=True,
        )
        graphs = json.loads(proc.stdout)
    for g in graphs.values():
        g["hit_fraction"] = g["hit_s"] / g["compile_s"]
    return {
        "warmup": throughput,
        "graphs": graphs,
        "median_hit_fraction": statistics.median(g["hit_fraction"] for g in graphs.values()),
        "max_hit_fraction": max(g["hit_fraction"] for g in graphs.values()),
    }


def print_report(result: dict) -> None:
    print(f"{'graph':<28}{'instr':>8}{'compile s':>11}{'hit s':>9}{'hit/compile':>13}")
    for name, g in result["graphs"].items():
        print(
            f"{name:<28}{g['instructions']:>8}{g['compile_s']:>11.3f}{g['hit_s']:>9.4f}"
            f"{g['hit_fraction']:>13.1%}"
        )
    print(
        f"hit / compile: median {result['median_hit_fraction']:.1%}, "
        f"max {result['max_hit_fraction']:.1%} (target < 5%)"
    )
    for jobs, t in result["warmup"].items():
        print(
            f"warmup, {jobs} job(s): {t['graphs']} graphs in {t['seconds']:.1f} s "
            f"({t['graphs_per_s']:.2f} graphs/s)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes")
    p.add_argument("--json", default="cache.json", help="write the figures here")
    args = p.parse_args(argv)
    result = run(args.quick)
    print_report(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
