"""How compile time grows with depth: TinyGPT with 1, 2, 4, 8 and 16 transformer layers, one
training step (forward and backward graphs), each depth compiled cold.

    python tools/bench_depth.py [--quick] [--json depth.json]

Per depth: neuroncc's own compile time (passes, emit, timing: what the cache entries record)
and the first call's wall time over a second call's (Dynamo and AOTAutograd included). The
target is linear growth: compile seconds per layer about constant from 1 to 16 layers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neuroncc import __version__
from neuroncc.examples import GPTConfig, TinyGPT, example_batch
from neuroncc.runtime.disk_cache import DiskCache, decode_entry

DEPTHS = (1, 2, 4, 8, 16)


def _step(model, idx, targets) -> None:
    _, loss = model(idx, targets)
    loss.backward()


def run(quick: bool) -> dict:
    rows = {}
    for layers in DEPTHS[:3] if quick else DEPTHS:
        torch.manual_seed(0)
        cfg = GPTConfig(layers=layers) if not quick else GPTConfig(layers=layers, seq=8, dim=16)
        model = TinyGPT(cfg)
        idx, targets = example_batch(cfg, 2)
        torch._dynamo.reset()
        with tempfile.TemporaryDirectory() as cache:
            options = {"cache_dir": cache, "timing_only": True}
            compiled = torch.compile(model, backend="neuron", options=options)
            start = time.perf_counter()
            _step(compiled, idx, targets)
            first = time.perf_counter() - start
            start = time.perf_counter()
            _step(compiled, idx, targets)
            second = time.perf_counter() - start
            own = sum(
                decode_entry(e.path.read_bytes(), e.key, __version__).meta["compile_seconds"]
                for e in DiskCache(cache).entries()
            )
        rows[layers] = {"neuroncc_s": own, "wall_s": max(first - second, 0.0)}
    base = rows[DEPTHS[0]]["neuroncc_s"]
    for layers, r in rows.items():
        r["per_layer_vs_1"] = r["neuroncc_s"] / layers / base
    return rows


def print_report(rows: dict) -> None:
    print(f"{'layers':>6}{'neuroncc s':>12}{'wall s':>9}{'per layer / 1 layer':>22}")
    for layers, r in rows.items():
        print(f"{layers:>6}{r['neuroncc_s']:>12.2f}{r['wall_s']:>9.2f}{r['per_layer_vs_1']:>22.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes, depths 1 to 4")
    p.add_argument("--json", default="depth.json", help="write the figures here")
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message="neuroncc timing_only")
    rows = run(args.quick)
    print_report(rows)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
