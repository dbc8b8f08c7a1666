"""The `neuron` device's host costs (issue 21), as ratios measured in one run.

    python tools/device_bench.py            # all three
    python tools/device_bench.py --json device.json

1. `import torch` with the device's autoload against `TORCH_DEVICE_BACKEND_AUTOLOAD=0`: the
   fastest of --imports fresh processes each, interleaved.
2. Host time per cached eager op beyond its simulation: for a few small ops on `neuron`
   tensors, each call's wall time less the time its compiled program took inside it (the
   simulator's run), the median over calls. Target: at most 30 us.
3. A tiny Llama's greedy `generate` on the device (second call: every op compiled) against
   CPU eager, in one process, runs interleaved; simulated, and with NEURONCC_TIMING_ONLY=1
   (ops timed, not simulated). Target: at most 3x in timing_only.
4. The floor of the design, for 3: the same generate where each op on the device does only
   what any Python backend over host memory must (host views of its tensors, the op on them,
   new device tensors over the results: `floor_run`), nothing of neuroncc's.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch


def import_cost(runs: int) -> dict:
    """The fastest of `runs` fresh processes each way, interleaved (the machine's noise only
    ever adds time)."""

    def once(autoload: str) -> float:
        code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
        env = os.environ | {"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return float(out.stdout.split()[-1])

    on, off = [], []
    for _ in range(runs):
        on.append(once("1"))
        off.append(once("0"))
    return {
        "import_torch_s": min(on),
        "without_autoload_s": min(off),
        "added_s": min(on) - min(off),
    }


OPS = {
    "add": lambda a, b: a + b,
    "mul_scalar": lambda a, b: a * 3.0,
    "matmul": lambda a, b: a @ b,
    "softmax": lambda a, b: torch.softmax(a, -1),
}


def op_overhead(n: int) -> dict:
    """Per op: each call's wall time, and within it the time its compiled program took (its
    CompiledOp.run, timed by a wrapper); the host time is the difference, call by call."""
    from neuroncc.device import eager

    a, b = torch.randn(64, 64, device="neuron"), torch.randn(64, 64, device="neuron")
    rows = {}
    for name, fn in OPS.items():
        known = set(eager._CACHE)
        fn(a, b)  # compiled here
        programs = [c for k, c in eager._CACHE.items() if k not in known and c is not None]
        spent = []
        for c in programs:
            c.run = _timed(c.run, spent)
        host, total = [], []
        for _ in range(n):
            spent.clear()
            t = time.perf_counter()
            fn(a, b)
            wall = time.perf_counter() - t
            total.append(wall)
            host.append(wall - sum(spent))
        rows[name] = {
            "op_us": statistics.median(total) * 1e6,
            "host_us": statistics.median(host) * 1e6,
        }
    rows["median_host_us"] = statistics.median(r["host_us"] for r in rows.values())
    return rows


def _timed(run, spent: list):
    def timed(args):
        t = time.perf_counter()
        out = run(args)
        spent.append(time.perf_counter() - t)
        return out

    return timed


def generate_ratio(runs: int = 10) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 8))

    cpu_model = copy.deepcopy(model)
    model.to("neuron")

    def generate(m, device: str) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            m.generate(ids.to(device), max_new_tokens=8, do_sample=False)
        return time.perf_counter() - t

    generate(cpu_model, "cpu")
    first = generate(model, "neuron")
    cpu, device = [], []
    for _ in range(runs):  # interleaved: the machine's noise falls on both
        cpu.append(generate(cpu_model, "cpu"))
        device.append(generate(model, "neuron"))
    cpu, device = min(cpu), min(device)
    return {"cpu_s": cpu, "device_first_s": first, "device_s": device, "ratio": device / cpu}


def floor_run(op, args: tuple, kwargs: dict):
    """An op on the device doing only what a Python backend over host memory must: the host
    views of its tensors, the op itself on them, new device tensors over its results."""
    from neuroncc.device import eager, memory

    _, leaves, spec, positions, tensors, hosts = eager.arguments(op, args, kwargs)
    return memory.to_device(eager.call_on(op, leaves, positions, spec, hosts), hosts, tensors)


def generate_timing_only(floor: bool = False) -> dict:
    """generate_ratio in a fresh process with NEURONCC_TIMING_ONLY=1 (the device's ops timed,
    not simulated: the options are read from the environment when an op compiles); `floor`:
    with the device's ops replaced by floor_run."""
    env = os.environ | {"NEURONCC_TIMING_ONLY": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--generate-only", "floor" if floor else "neuroncc"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--imports", type=int, default=8, help="processes per import timing")
    p.add_argument("--calls", type=int, default=200, help="calls per op timing")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--generate-only", choices=("neuroncc", "floor"), help=argparse.SUPPRESS)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    if args.generate_only:
        if args.generate_only == "floor":
            from neuroncc.device import eager

            eager.run = floor_run
        print(json.dumps(generate_ratio()))
        return
    out = {
        "import": import_cost(args.imports),
        "eager_op": op_overhead(args.calls),
        "generate": generate_ratio(),
        "generate_timing_only": generate_timing_only(),
        "generate_floor": generate_timing_only(floor=True),
    }
    imp, ops, gen = out["import"], out["eager_op"], out["generate"]
    print(
        f"import torch: {imp['import_torch_s']:.3f} s, {imp['without_autoload_s']:.3f} s "
        f"without the autoload (+{imp['added_s'] * 1e3:.0f} ms)"
    )
    for name in OPS:
        r = ops[name]
        print(f"  {name:<11} op {r['op_us']:7.1f} us, of which host {r['host_us']:6.1f} us")
    print(f"eager op host time beyond simulation: median {ops['median_host_us']:.1f} us (<= 30)")
    rows = (
        ("simulated", gen),
        ("timing_only", out["generate_timing_only"]),
        ("floor", out["generate_floor"]),
    )
    for label, g in rows:
        print(
            f"tiny Llama generate, {label}: device {g['device_s']:.3f} s, CPU {g['cpu_s']:.3f} s,"
            f" {g['ratio']:.1f}x (<= 3 timing_only); first call {g['device_first_s']:.2f} s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
