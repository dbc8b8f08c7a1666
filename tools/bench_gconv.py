"""What grouped and depthwise convolutions cost to compile and to run (issue 20): a 3x3
depthwise Conv2d on [1, C, 56, 56] for several C, and a MobileNetV2 inverted-residual block,
each in eval and in training (one forward and backward step), compiled cold.

    python tools/bench_gconv.py [--channels 32,96,384] [--json gconv.json]

Per case and graph: neuroncc's compile seconds (passes, emit, timing), the executable's static
instruction count (what is emitted), the simulated instruction count and the simulated device
time of one execution. With `timing_only` the simulator does not compute values, so the numbers
come out even where functional simulation would be slow.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from neuroncc import __version__
from neuroncc.runtime.disk_cache import DiskCache, decode_entry
from neuroncc.runtime.stats import STATS
from tools.campaign import _InvertedResidual


def _cases(channels: list[int]) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    cases = {}
    for c in channels:
        conv = nn.Conv2d(c, c, 3, padding=1, groups=c)
        cases[f"dwconv C={c}"] = (conv, torch.randn(1, c, 56, 56))
    block = _InvertedResidual(16, 6, 3, 1, se=False)
    cases["InvertedResidual(16, x6)"] = (block, torch.randn(1, 16, 28, 28))
    return cases


def measure(model: nn.Module, x: torch.Tensor, train: bool) -> list[dict]:
    torch.manual_seed(0)
    torch._dynamo.reset()
    STATS.reset()
    model.train(train)
    with tempfile.TemporaryDirectory() as cache:
        options = {"cache_dir": cache, "timing_only": True}
        compiled = torch.compile(model, backend="neuron", options=options)
        if train:
            compiled(x.requires_grad_()).sum().backward()
        else:
            with torch.no_grad():
                compiled(x)
        seconds = {}
        for e in DiskCache(cache).entries():
            meta = decode_entry(e.path.read_bytes(), e.key, __version__).meta
            seconds[meta["name"]] = meta["compile_seconds"]
    rows = []
    for name, c in STATS.executed().items():
        rows.append(
            {
                "graph": name,
                "compile_s": round(seconds[name], 2),
                "static_instructions": len(c.exe.instructions),
                "kernels": len(c.exe.kernels),
                "instructions": c.profile.instructions,
                "device_us": round(c.profile.device_ns / 1e3, 1),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--channels", default="32,96,384")
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    p.add_argument("--json")
    args = p.parse_args()
    out = {}
    for what, (model, x) in _cases([int(c) for c in args.channels.split(",")]).items():
        if args.only not in what:
            continue
        for train in (False, True):
            key = f"{what} {'train' if train else 'eval'}"
            out[key] = measure(model, x, train)
            for r in out[key]:
                print(f"{key:38s} " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
