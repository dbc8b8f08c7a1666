"""Run PyTorch's OpInfo database through torch.compile(backend="neuron") and compare with eager.

    python tools/opinfo_sweep.py                      # every float32 OpInfo, report to stdout
    python tools/opinfo_sweep.py --json report.json   # and per-op results as JSON
    python tools/opinfo_sweep.py --ops add,mul,softmax --samples 3
    python tools/opinfo_sweep.py --device             # eagerly on the neuron device instead

Per op, float32 forward (and gradients where the OpInfo supports autograd) on its first samples:
- compiled: every sample matched eager and nothing ran eagerly;
- fallback: every sample matched eager, some nodes ran eagerly in PyTorch;
- mismatch: some compiled result differs from eager;
- error: compiling or running raised although eager works;
- skipped: no float32 support, or eager itself fails on every sample.
Random ops (dropout, bernoulli, ...) and uninitialised ones (empty*) are compared on shape and
dtype only, as Inductor's OpInfo test does.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.utils._pytree as pytree

import neuroncc

RANDOM_OR_UNINITIALISED = (
    "bernoulli",
    "normal",
    "rand",
    "randn",
    "randint",
    "uniform",
    "multinomial",
    "dropout",
    "rrelu",
    "empty",
    "new_empty",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    # Scatters whose samples repeat indices: which write wins is unspecified (Inductor skips
    # them for the same reason).
    "max_unpool",
)
TOL = {"rtol": 1e-4, "atol": 1e-5}
# Per-op tolerances where float32 itself is ill-conditioned (as Inductor's OpInfo test keeps
# per-op overrides): logcumsumexp's backward cancels signed terms; eager float32 is 2.8e-3 away
# from float64 on the first sample, the compiled result 4.4e-3.
TOL_OVERRIDES = {"logcumsumexp": {"rtol": 1e-2, "atol": 1e-2}}
# The families the issue allows to fall back: linear algebra, FFT and sparse.
LINALG_FFT_SPARSE_PREFIXES = ("linalg.", "fft.", "sparse.", "to_sparse")
LINALG_FFT_SPARSE = {
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "lu",
    "lu_solve",
    "lu_unpack",
    "svd",
    "svd_lowrank",
    "pca_lowrank",
    "qr",
    "geqrf",
    "ormqr",
    "triangular_solve",
    "inverse",
    "det",
    "logdet",
    "pinverse",
    "matrix_exp",
    "stft",
    "istft",
    "addmm.decomposed",
    "nn.functional.pdist",
}


@dataclass
class Result:
    op: str
    status: str
    samples: int = 0
    fallback_ops: list[str] = field(default_factory=list)
    detail: str = ""


def _metadata_only(name: str) -> bool:
    return any(part in name for part in RANDOM_OR_UNINITIALISED)


def _compare(got, want, metadata_only: bool, tol: dict = TOL) -> None:
    g_leaves, w_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(g_leaves) != len(w_leaves):
        raise AssertionError(f"{len(g_leaves)} outputs, eager has {len(w_leaves)}")
    for g, w in zip(g_leaves, w_leaves, strict=True):
        if isinstance(w, torch.Tensor):
            if metadata_only:
                assert g.shape == w.shape and g.dtype == w.dtype, (
                    g.shape,
                    w.shape,
                    g.dtype,
                    w.dtype,
                )
            else:
                torch.testing.assert_close(g, w, **tol, equal_nan=True)
        elif g != w and not (g != g and w != w):  # noqa: PLR0124  (both NaN)
            raise AssertionError(f"{g!r} != {w!r}")


def _grads(fn, tensors, out_fn):
    leaves = [t for t in tensors if t.is_floating_point() and t.requires_grad]
    outs = [
        o
        for o in pytree.tree_leaves(out_fn())
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad
    ]
    if not leaves or not outs:
        return None
    gen = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs)
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def run_sample(op, sample, grads: bool, device: bool = False) -> tuple[str, list[str]]:
    """'ok' / 'eager-fails' and the ops that fell back, raising on mismatch or compile error.
    With `device`, the sample runs eagerly on the `neuron` device instead of compiled."""
    tensors, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    is_tensor = [isinstance(t, torch.Tensor) for t in tensors]
    inputs = [t for t in tensors if isinstance(t, torch.Tensor)]

    def fn(*ts):
        it = iter(ts)
        leaves = [next(it) if flag else t for flag, t in zip(is_tensor, tensors, strict=True)]
        x, args, kwargs = pytree.tree_unflatten(leaves, spec)
        return op.op(x, *args, **kwargs)

    want_grads = grads and op.supports_autograd
    try:
        want = fn(*inputs)
        want_g = _grads(fn, inputs, lambda: want) if want_grads else None
    except Exception:  # noqa: BLE001  (whatever eager raises, the op is skipped)
        return "eager-fails", []
    torch._dynamo.reset()
    neuroncc.reset_stats()
    if device:  # eagerly on the neuron device: each op compiled and simulated
        args = [t.detach().to("neuron").requires_grad_(t.requires_grad) for t in inputs]
        run = fn
    else:
        args, run = inputs, torch.compile(fn, backend="neuron", dynamic=False)
    got = run(*args)
    tol = TOL_OVERRIDES.get(op.name, TOL)
    _compare(pytree.tree_map(_to_cpu, got), want, _metadata_only(op.name), tol)
    if want_g is not None:
        got_g = _grads(run, args, lambda: got)
        if got_g is not None:
            _compare(
                [g.cpu() for g in got_g if g is not None],
                [g for g in want_g if g is not None],
                _metadata_only(op.name),
                tol,
            )
    stats = neuroncc.stats()
    if stats["compiler_errors"]:  # ran eagerly after an internal compiler error: a failure
        raise RuntimeError(f"internal compiler error (stages {stats['compiler_errors']})")
    fell_back = sorted(stats["fallback_nodes"])
    if not device and stats["dynamo_graphs"] == 0:
        fell_back.append("dynamo: not captured")  # Dynamo ran it in Python (graph break)
    # dynamo_graphs > 0 with no execution and no fallback: results are views of the inputs,
    # which AOTAutograd recreates; there is nothing to compute.
    return "ok", fell_back


def _to_cpu(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _first_line(e: Exception) -> str:
    """The informative line of an error (Dynamo wraps backend errors after 'raised:')."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.endswith("raised:") and i + 1 < len(lines):
            return lines[i + 1][:300]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def run_op(op, samples: int, grads: bool, device: bool = False) -> Result:
    if torch.float32 not in op.supported_dtypes("cpu"):
        return Result(
            op.full_name if hasattr(op, "full_name") else op.name, "skipped", detail="no float32"
        )
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    result = Result(name, "compiled")
    fallback: set[str] = set()
    try:
        gen = op.sample_inputs("cpu", torch.float32, requires_grad=grads and op.supports_autograd)
        for i, sample in enumerate(gen):
            if i >= samples:
                break
            status, fell_back = run_sample(op, sample, grads, device)
            if status == "ok":
                result.samples += 1
                fallback.update(fell_back)
    except AssertionError as e:
        return Result(
            name, "mismatch", result.samples, sorted(fallback), str(e).splitlines()[0][:300]
        )
    except Exception as e:  # noqa: BLE001  (any compiler failure is this op's result)
        return Result(name, "error", result.samples, sorted(fallback), _first_line(e))
    if result.samples == 0:
        return Result(name, "skipped", detail="eager fails on every sample")
    result.fallback_ops = sorted(fallback)
    if fallback:
        result.status = "fallback"
    return result


class _Timeout(BaseException):  # not caught by the per-op `except Exception`
    pass


def _alarm(signum, frame):
    raise _Timeout


def sweep(
    names: list[str] | None = None,
    samples: int = 2,
    grads: bool = True,
    progress: bool = False,
    timeout: int = 60,
    device: bool = False,
) -> list[Result]:
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [op for op in op_db if names is None or op.name in names]
    results = []
    signal.signal(signal.SIGALRM, _alarm)
    for i, op in enumerate(ops):
        start = time.perf_counter()
        signal.alarm(timeout)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(run_op(op, samples, grads, device))
        except _Timeout:
            results.append(Result(op.name, "error", detail=f"timeout after {timeout} s"))
        finally:
            signal.alarm(0)
        if progress:
            r = results[-1]
            print(
                f"[{i + 1}/{len(ops)}] {r.op:<40} {r.status:<9} {time.perf_counter() - start:5.1f}s {r.detail[:80]}",
                file=sys.stderr,
            )
    return results


def allowed_to_fall_back(name: str) -> bool:
    return name.startswith(LINALG_FFT_SPARSE_PREFIXES) or name in LINALG_FFT_SPARSE


def summary(results: list[Result]) -> dict[str, float]:
    tested = [r for r in results if r.status != "skipped"]
    count = {
        s: sum(r.status == s for r in tested) for s in ("compiled", "fallback", "mismatch", "error")
    }
    n = max(len(tested), 1)
    excluded = [r for r in tested if r.status == "fallback" and allowed_to_fall_back(r.op)]
    not_captured = [r for r in tested if r.fallback_ops == ["dynamo: not captured"]]
    return {
        "ops_tested": len(tested),
        **count,
        "compiled_rate": count["compiled"] / n,
        "correct_rate": (count["compiled"] + count["fallback"]) / n,
        # Rates with the ops excluded that are allowed to fall back (linalg/FFT/sparse), and
        # with those Dynamo never hands to a backend (graph breaks: RNG, .item(), ...).
        "compiled_rate_excluding_linalg_fft_sparse": count["compiled"] / max(n - len(excluded), 1),
        "not_captured_by_dynamo": len(not_captured),
        "compiled_rate_of_captured_excluding_linalg_fft_sparse": count["compiled"]
        / max(n - len(excluded) - len([r for r in not_captured if r not in excluded]), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument("--no-grads", action="store_true", help="forward only")
    p.add_argument("--json", help="write per-op results here")
    p.add_argument("--timeout", type=int, default=60, help="seconds per op (default 60)")
    p.add_argument(
        "--device", action="store_true", help="run eagerly on the neuron device, not compiled"
    )
    args = p.parse_args(argv)
    names = args.ops.split(",") if args.ops else None
    results = sweep(names, args.samples, not args.no_grads, True, args.timeout, device=args.device)
    for r in results:
        if r.status in ("mismatch", "error", "fallback"):
            extra = f"  falls back: {', '.join(r.fallback_ops)}" if r.fallback_ops else ""
            print(f"{r.op:<40} {r.status:<9} {r.detail}{extra}")
    s = summary(results)
    print(json.dumps(s, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "results": [asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
