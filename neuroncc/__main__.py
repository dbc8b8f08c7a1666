"""The main job: `python -m neuroncc`.

Builds TinyGPT with random weights, compiles it with torch.compile(backend="neuron"), checks the
logits, loss and gradients against eager PyTorch, and prints the simulated Trainium profile of
one forward and one backward pass: device time and the per-engine breakdown. With `--device
neuron` the model and batch live on the `neuron` device: a forward runs eagerly there first
(op by op on the simulator), then the compiled model runs on the device tensors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import torch

import neuroncc
from neuroncc.codegen.hardware.targets import TARGETS
from neuroncc.examples import GPTConfig, TinyGPT, example_batch

TOL = 1e-4  # fp32: compiled and eager differ only by summation order


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m neuroncc", description=__doc__.splitlines()[2])
    p.add_argument("--target", default="trn2", choices=sorted(TARGETS))
    p.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--trace", help="write the simulated schedule here (Chrome trace JSON)")
    p.add_argument("--device", default="cpu", choices=("cpu", "neuron"), help="where tensors live")
    return p.parse_args(argv)


def _engine_table(stats: dict, title: str) -> str:
    device = stats["device_seconds"]
    groups: dict[str, float] = defaultdict(float)
    queues = 0
    for engine, busy in stats["engine_busy_seconds"].items():
        if engine.startswith("q"):
            groups["DMA (16 queues)"] += busy
            queues += 1
        else:
            name = {"pe": "TensorE", "act": "ScalarE", "dve": "VectorE", "pool": "GpSimdE"}[engine]
            groups[name] += busy
    lines = [
        f"{title}: simulated device time {device * 1e6:.1f} us",
        f"  {'engine':<18}{'busy us':>10}{'util':>8}",
    ]
    for name in ("TensorE", "VectorE", "ScalarE", "GpSimdE", "DMA (16 queues)"):
        busy = groups.get(name, 0.0)
        lanes = 16 if name.startswith("DMA") else 1
        util = busy / (device * lanes) if device else 0.0
        lines.append(f"  {name:<18}{busy * 1e6:>10.1f}{util:>8.1%}")
    roof = stats["roofline_seconds"]
    lines.append(
        f"  roofline bound {roof * 1e6:.1f} us (achieved {roof / device if device else 0:.1%}), "
        f"MFU {stats['mfu']:.2%}, HFU {stats['hfu']:.2%}, TensorE throttled "
        f"{stats['throttled_seconds'] * 1e6:.1f} us"
    )
    lines.append(
        f"  HBM traffic {stats['hbm_bytes'] / 1e6:.2f} MB (spills {stats['spill_bytes'] / 1e6:.2f}"
        f" MB), DMA efficiency {stats['dma_efficiency']:.1%}, instructions "
        f"{stats['instructions']}, executables run {stats['executions']}"
    )
    return "\n".join(lines)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().cpu() - b.detach().cpu()).abs().max().item()


def _eager_on_device(model, idx, targets, ref_logits) -> None:
    """A forward run eagerly on the `neuron` device: each op compiled once and simulated."""
    neuroncc.reset_stats()
    start = time.perf_counter()
    with torch.no_grad():
        logits, _ = model(idx, targets)
    wall = time.perf_counter() - start
    s = neuroncc.stats()
    host = s["fallback_nodes"]
    print(
        f"eager on the neuron device: {s['eager_executions']} ops simulated, "
        f"{s['eager_device_seconds'] * 1e6:.1f} us of device time, "
        f"{sum(host.values())} ops on the host{f' {host}' if host else ''}, wall {wall:.2f} s; "
        f"max |device - eager| logits {_max_diff(logits, ref_logits):.2e}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    cfg = GPTConfig(seq=args.seq, dim=args.dim, layers=args.layers)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    idx, targets = example_batch(cfg, args.batch)
    print(
        f"TinyGPT: {args.layers} layers, dim {args.dim}, seq {args.seq}, batch {args.batch}, "
        f"target {args.target}, opt_level {args.opt_level}"
    )

    start = time.perf_counter()
    ref_logits, ref_loss = model(idx, targets)
    eager_s = time.perf_counter() - start
    ref_loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    if args.device == "neuron":
        os.environ["NEURONCC_TARGET"] = args.target  # the device's core (eager ops read it)
        model.to("neuron")
        idx, targets = idx.to("neuron"), targets.to("neuron")
        _eager_on_device(model, idx, targets, ref_logits)

    compiled = torch.compile(
        model, backend="neuron", options={"target": args.target, "opt_level": args.opt_level}
    )
    neuroncc.reset_stats()
    start = time.perf_counter()
    logits, loss = compiled(idx, targets)
    first_s = time.perf_counter() - start
    compile_stats = neuroncc.stats()

    neuroncc.reset_stats()
    start = time.perf_counter()
    logits, loss = compiled(idx, targets)
    run_s = time.perf_counter() - start
    fwd = neuroncc.stats()
    if args.trace:
        neuroncc.write_trace(args.trace)

    neuroncc.reset_stats()
    loss.backward()
    bwd = neuroncc.stats()
    grads = [p.grad for p in model.parameters()]

    diffs = {
        "logits": _max_diff(logits, ref_logits),
        "loss": _max_diff(loss, ref_loss),
        "grads": max(_max_diff(g, r) for g, r in zip(grads, ref_grads, strict=True)),
    }
    ok = all(d <= TOL for d in diffs.values())
    print(f"loss {loss.item():.6f} (eager {ref_loss.item():.6f})")
    print(
        "max |compiled - eager|: "
        + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
        + f"  -> {'MATCH' if ok else 'MISMATCH'} (tolerance {TOL:g})"
    )
    print(
        f"wall time: compile + first call {first_s:.2f} s ({compile_stats['compiles']} graphs compiled), "
        f"simulated forward {run_s * 1e3:.1f} ms, eager forward {eager_s * 1e3:.1f} ms"
    )
    print(_engine_table(fwd, "forward"))
    print(_engine_table(bwd, "backward"))
    if args.trace:
        print(f"trace of the forward graphs written to {args.trace} (open it in Perfetto)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
