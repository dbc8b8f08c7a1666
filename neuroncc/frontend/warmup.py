"""neuroncc-warmup: fill the persistent compile cache before the real run, so it compiles nothing.

    neuroncc-warmup record graphs.jsonl train.py --steps 2   # run a trial, record its graphs
    neuroncc-warmup compile graphs.jsonl --jobs 2            # compile them into the cache
    neuroncc-warmup expand graphs.jsonl --sizes 32=128:2048:128   # and for other shapes

`compile` compiles each manifest entry from its IR text in worker processes (spawned, torch is
not imported there), each into the shared cache under the entry's lock, so jobs on several
machines sharing one cache directory (`--shard i/n`) and the real run itself never compile a
graph twice. A worker that dies (killed by memory, say) costs a retry of its entries, not the
job; a compile error fails its entry with the reason, and only successes are stored.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from neuroncc.errors import NeuronccError
from neuroncc.frontend.recording import (
    ENV_VAR,
    DynamoEntry,
    ManifestEntry,
    ManifestError,
    load_manifest,
)
from neuroncc.options import CompileOptions

JOB_MEMORY_BYTES = 2 << 30  # what one compile worker may need: the basis of the --jobs default


class WarmupError(NeuronccError):
    stage = "warmup"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @staticmethod
    def parse(spec: str) -> Shard:
        try:
            i, n = (int(x) for x in spec.split("/"))
        except ValueError:
            i = n = -1
        if not (n >= 1 and 0 <= i < n):
            raise WarmupError(f"shard {spec!r} is not i/n with 0 <= i < n (e.g. 0/4)")
        return Shard(i, n)

    def owns(self, key: str) -> bool:
        """Keys, not manifest positions, pick the shard: every machine agrees on it."""
        return int(key[:8], 16) % self.count == self.index


@dataclass
class Summary:
    compiled: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> reason
    skipped: int = 0  # other shards' entries
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{len(self.compiled)} compiled, {len(self.cached)} already cached, "
            f"{len(self.failed)} failed"
            + (f", {self.skipped} left to other shards" if self.skipped else "")
            + f" in {self.seconds:.1f} s"
        )


def default_jobs() -> int:
    """One job per core, fewer when the available memory would not hold them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, _available_memory() // JOB_MEMORY_BYTES))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# -- the worker -----------------------------------------------------------------------------


def _options(entry: ManifestEntry, cache_dir: str | None) -> CompileOptions:
    return CompileOptions(**entry.options, cache_dir=cache_dir)


def compile_entry(entry: ManifestEntry, cache_dir: str | None) -> str:
    """Compile one manifest entry into the cache: "compiled" or "cached". Runs in a worker."""
    from neuroncc import __version__
    from neuroncc.frontend.compile import compile_nir, disk_cache_for, graph_key
    from neuroncc.ir.parser import parse
    from neuroncc.ir.verify import verify

    opts = _options(entry, cache_dir)
    try:
        g = verify(parse(entry.ir))
    except ValueError as e:  # ParseError, VerifyError: a damaged manifest entry
        raise WarmupError(f"its IR is not valid: {e}") from None
    key = graph_key(entry.ir, opts)
    disk = disk_cache_for(opts)
    assert disk is not None
    with disk.compiling(key):
        if disk.load(key, __version__) is not None:
            return "cached"
        compiled = compile_nir(g, entry.ir, opts, entry.name)
        if not disk.store(key, compiled.entry):
            raise WarmupError(f"could not write the cache at {disk.root}: {disk.disabled_reason}")
    return "compiled"


# -- the job --------------------------------------------------------------------------------


def compile_manifest(
    manifest: str | os.PathLike,
    *,
    jobs: int | None = None,
    shard: Shard | None = None,
    retries: int = 1,
    cache_dir: str | None = None,
    progress: bool = True,
    worker: Callable[[ManifestEntry, str | None], str] = compile_entry,
) -> Summary:
    """Compile every entry of the manifest (of this shard) into the cache. (`worker`, a
    module-level function, replaces compile_entry in tests.)"""
    start = time.perf_counter()
    entries = load_manifest(manifest)
    cache_dir = cache_dir or os.environ.get("NEURONCC_CACHE_DIR")
    _check_writable(cache_dir)
    summary = Summary()
    todo = []
    for e in entries:
        if not isinstance(e, ManifestEntry):
            continue  # a Dynamo graph: expand traces it, there is nothing to compile
        if shard is not None and not shard.owns(e.key):
            summary.skipped += 1
        elif _cached(e, cache_dir):
            summary.cached.append(e.name)
        else:
            todo.append(e)
    jobs = max(1, min(jobs or default_jobs(), len(todo) or 1))
    attempts: Counter[str] = Counter()
    with _Progress(len(todo), progress and bool(todo)) as bar:
        while todo:
            todo = _run_pool(worker, todo, jobs, cache_dir, summary, attempts, retries, bar)
            jobs = 1  # a worker died and broke the pool: retry one at a time to isolate it
    summary.seconds = time.perf_counter() - start
    return summary


def _cached(entry: ManifestEntry, cache_dir: str | None) -> bool:
    """Whether the cache holds a valid entry for this graph (checked before any worker runs)."""
    from neuroncc import __version__
    from neuroncc.frontend.compile import disk_cache_for, graph_key

    opts = _options(entry, cache_dir)
    disk = disk_cache_for(opts)
    return disk is not None and disk.load(graph_key(entry.ir, opts), __version__) is not None


def _run_pool(
    worker, todo, jobs, cache_dir, summary, attempts, retries, bar
) -> list[ManifestEntry]:
    """Run todo on a fresh pool; the entries to retry because a worker died."""
    retry: list[ManifestEntry] = []
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(worker, e, cache_dir): e for e in todo}
        for future in cf.as_completed(futures):
            e = futures[future]
            attempts[e.key] += 1
            try:
                status = future.result()
            except NeuronccError as err:  # the compiler's verdict: the same on every try
                summary.failed[e.name] = f"{type(err).__name__}: {err}"
            except Exception as err:  # noqa: BLE001  (a dead worker, memory, I/O: retry)
                if attempts[e.key] <= retries:
                    retry.append(e)
                    continue
                summary.failed[e.name] = f"{type(err).__name__}: {err}"
            else:
                (summary.compiled if status == "compiled" else summary.cached).append(e.name)
            bar.advance(e.name)
    return retry


def _check_writable(cache_dir: str | None) -> None:
    from neuroncc.runtime.disk_cache import default_root

    root = Path(cache_dir).expanduser() if cache_dir else default_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise WarmupError(f"the cache directory {root} is not writable: {e.strerror}") from None


class _Progress:
    """A rich progress bar on a terminal; nothing otherwise (the summary says it all)."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import Progress

        console = Console(stderr=True)
        self.bar = Progress(console=console) if enabled and console.is_terminal else None
        self.total = total

    def __enter__(self) -> Self:
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("compiling", total=self.total)
        return self

    def advance(self, name: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=name)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


# -- expand ---------------------------------------------------------------------------------


def parse_sizes(spec: str) -> tuple[int, list[int]]:
    """ "7=128:2048:128" (start:stop:step, stop included) or "7=128,256": every dynamic size
    that was 7 in the trial run, at these values."""
    try:
        trial, values = spec.split("=")
        if ":" in values:
            start, stop, step = (int(x) for x in values.split(":"))
            if step <= 0:
                raise ValueError
            sizes = list(range(start, stop + 1, step))
        else:
            sizes = [int(x) for x in values.split(",")]
        if not sizes or min(sizes) < 1:
            raise ValueError
        return int(trial), sizes
    except ValueError:
        raise WarmupError(
            f"sizes {spec!r} is not TRIAL=START:STOP:STEP or TRIAL=A,B,... "
            "(e.g. 7=128:2048:128: the size that was 7 in the trial, from 128 to 2048)"
        ) from None


def expand_manifest(
    manifest: str | os.PathLike, sizes: dict[int, list[int]], **compile_args: object
) -> tuple[int, Summary]:
    """Trace every recorded Dynamo graph at the requested sizes (recording what it compiles
    into the manifest), then compile the manifest. (variants traced, summary)."""
    import itertools

    import torch

    from neuroncc.frontend import recording
    from neuroncc.frontend.backend import ShapeSpecializer
    from neuroncc.frontend.fx_serde import decode_graph, example_args, trial_sizes

    dynamo = [e for e in load_manifest(manifest) if isinstance(e, DynamoEntry)]
    if not dynamo:
        raise WarmupError(
            f"{manifest} records no graph with dynamic sizes: record a trial that runs two "
            "shapes, or torch.compile(..., dynamic=True)"
        )
    traced, seen = 0, []
    for e in dynamo:
        if e.graph is None:
            print(f"  {e.name} cannot be expanded: {e.why}", file=sys.stderr)
            continue
        trial = trial_sizes(e.graph)
        seen += [f"{e.name}: {sym}={v}" for sym, v in trial.items()]
        for note in _computed_notes(e.name, e.graph, trial, sizes):
            print(f"  {note}", file=sys.stderr)
        axes = {sym: sizes[v] for sym, v in trial.items() if v in sizes}
        gm = decode_graph(e.graph)
        opts = CompileOptions(**e.options, disk_cache=False)
        for combo in itertools.product(*axes.values()) if axes else ():
            args = example_args(e.graph, {**trial, **dict(zip(axes, combo))})
            fn = ShapeSpecializer(gm, opts, f"{e.name}_x{traced}")
            with (
                recording.record(manifest),
                recording.trace_only(),
                torch.set_grad_enabled(e.grad_enabled),
            ):
                _call_with_backward(fn, args)
            traced += 1
    if not traced:
        raise WarmupError(
            f"no recorded dynamic size was one of {sorted(sizes)} in the trial; "
            f"the recorded ones: {', '.join(seen) or 'none'}"
        )
    return traced, compile_manifest(manifest, **compile_args)  # type: ignore[arg-type]


def _computed_notes(
    name: str, graph: dict, trial: dict[str, int], sizes: dict[int, list[int]]
) -> list[str]:
    """Why a size asked for is not expanded in this graph: it is computed from other sizes."""
    from neuroncc.frontend.fx_serde import computed_sizes

    notes = []
    for expr, value, symbols in computed_sizes(graph):
        if value in sizes and value not in trial.values():
            reads = " and ".join(f"{s} ({v} in the trial)" for s, v in symbols.items())
            asks = " or ".join(f"--sizes {v}=..." for v in symbols.values())
            notes.append(
                f"{name}: the size that was {value} in the trial is not a size of its own but "
                f"{expr}, computed from {reads}: expand cannot set it directly; ask for {asks} "
                "instead"
            )
    return notes


def _call_with_backward(fn: object, args: list) -> None:
    import torch

    out = fn(*args)  # type: ignore[operator]
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])]
    needs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if needs:
        torch.autograd.backward(needs, [torch.ones_like(o) for o in needs])


# -- record ---------------------------------------------------------------------------------


def record_script(manifest: str | os.PathLike, script: str, args: Sequence[str]) -> int:
    """Run `python script args` with recording into manifest; the script's exit status."""
    if not Path(script).is_file():
        raise WarmupError(f"script {script} does not exist")
    env = {**os.environ, ENV_VAR: str(Path(manifest).resolve())}
    return subprocess.run([sys.executable, script, *args], env=env, check=False).returncode


# -- the command line -----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuroncc-warmup",
        description="Fill neuroncc's persistent compile cache before the real run.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run a script and record every graph it compiles")
    rec.add_argument("manifest", help="the manifest to write (JSON lines; appended to)")
    rec.add_argument("script", help="the Python script to run")
    rec.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")

    comp = sub.add_parser("compile", help="compile a manifest's graphs into the cache")
    comp.add_argument("manifest")
    _compile_flags(comp)

    exp = sub.add_parser(
        "expand", help="trace the recorded dynamic graphs at more sizes, then compile"
    )
    exp.add_argument("manifest")
    exp.add_argument(
        "--sizes",
        action="append",
        required=True,
        help="TRIAL=START:STOP:STEP or TRIAL=A,B: the dynamic size that was TRIAL in the "
        "recorded run, at these values (repeatable)",
    )
    _compile_flags(exp)
    return p


def _compile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=int, help=f"worker processes (default {default_jobs()})")
    p.add_argument("--shard", type=Shard.parse, help="i/n: compile only this machine's share")
    p.add_argument("--retries", type=int, default=1, help="retries of an entry whose worker died")
    p.add_argument("--cache-dir", help="the cache (default NEURONCC_CACHE_DIR or per-user)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "record":
            status = record_script(args.manifest, args.script, args.args)
            n = len(load_manifest(args.manifest)) if Path(args.manifest).exists() else 0
            print(f"recorded {n} graph(s) in {args.manifest}")
            if status:
                print(f"the script exited with status {status}", file=sys.stderr)
            return status
        flags = {
            "jobs": args.jobs,
            "shard": args.shard,
            "retries": args.retries,
            "cache_dir": args.cache_dir,
            "progress": not args.no_progress,
        }
        if args.command == "expand":
            sizes = dict(parse_sizes(spec) for spec in args.sizes)
            traced, summary = expand_manifest(args.manifest, sizes, **flags)
            print(f"traced {traced} new shape variant(s)")
        else:
            summary = compile_manifest(args.manifest, **flags)
        print(summary.line())
        for name, why in summary.failed.items():
            print(f"  failed {name}: {why}")
        return 1 if summary.failed else 0
    except (WarmupError, ManifestError) as e:
        print(f"neuroncc-warmup: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
