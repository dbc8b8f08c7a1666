"""neuroncc-dump: what graphs did my model produce, what did each pass do to them, what runs
on which engine, and where does the time go.

    neuroncc-dump run [SCRIPT.py [ARGS...]]      run with dumping on (default: the built-in
                                                 example model), then summarise the graphs
    neuroncc-dump show DUMP_OR_CACHE_KEY [--stage fuse,program] [--format text|json|dot|svg|html]
    neuroncc-dump profile DUMP [--trace trace.json]
    neuroncc-dump cache ls | show KEY | verify | clear
    neuroncc-dump repro FILE.nir                 replay an internal compiler error

DUMP is a dump directory (`options={"dump_dir": ...}`, NEURONCC_DUMP_DIR, or `run`), or one
graph's folder in it; a cache key (or a unique prefix of one) names an entry of the persistent
cache instead, whose pass stages are recomputed from its IR. Errors are one line on stderr and
exit status 2: never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuroncc.codegen.hardware.targets import get_target
from neuroncc.frontend import report
from neuroncc.frontend.dump_read import (
    STAGES,
    DumpError,
    GraphDump,
    device_ns,
    fusion_groups,
    hbm_plan,
    is_graph_folder,
    kernel_costs_of,
    load,
    load_cache_entry,
    open_cache_for,
)
from neuroncc.frontend.failures import reproduce_ir
from neuroncc.ir.jsonform import graph_to_json

# -- output -----------------------------------------------------------------------------------


def _table(title: str, head: Sequence[str], rows: list[Sequence[str]]) -> None:
    """A rich table on a terminal; plain aligned columns when piped."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if console.is_terminal:
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h == head[0] else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    print(title)
    for line in _columns(head, rows):
        print(line)


def _columns(head: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    """Plain aligned columns: the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        )
        for row in (head, *rows)
    ]


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text)
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


# -- show -----------------------------------------------------------------------------------


def _pick_stages(g: GraphDump, wanted: list[str] | None) -> list[str]:
    if not wanted:
        return list(g.stages)
    for s in wanted:
        if s not in STAGES:
            raise DumpError(f"unknown stage {s!r}; stages: {', '.join(STAGES)}")
        if s not in g.stages:
            raise DumpError(f"graph {g.name} has no stage {s!r}; it has: {', '.join(g.stages)}")
    return wanted


def show(graphs: list[GraphDump], stages: list[str] | None, fmt: str, diff: bool) -> str:
    if fmt == "json":
        return json.dumps({"graphs": [_graph_json(g, stages) for g in graphs]}, indent=1) + "\n"
    if fmt in ("dot", "svg"):
        pics = []
        for g in graphs:
            ir_stage = [s for s in _pick_stages(g, stages) if g.ir(s) is not None]
            if not ir_stage:
                raise DumpError(f"a {fmt} picture needs an IR stage (nir, simplify, fuse)")
            ir = g.ir(ir_stage[-1])
            pics.append(report.graph_dot(ir) if fmt == "dot" else report.graph_svg(ir))
        return "".join(pics) if fmt == "dot" else _stack_svgs(pics)
    if fmt == "html":
        return _html(graphs, stages)
    return "".join(_show_text(g, stages, diff) for g in graphs)


def _graph_json(g: GraphDump, stages: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": g.name, "source": g.source, "meta": g.meta, "stages": {}}
    for s in _pick_stages(g, stages):
        ir = g.ir(s)
        out["stages"][s] = {"text": g.stages[s], **({"ir": graph_to_json(ir)} if ir else {})}
    out["fusion"] = fusion_groups(g)
    out["hbm_plan"] = hbm_plan(g)
    out["kernels"] = [
        {
            "name": c.name,
            "engine": c.engine,
            "ns": c.ns,
            "flops": c.flops,
            "hbm_bytes": c.hbm_bytes,
            "roofline_ns": c.roofline_ns,
            "fraction": c.fraction,
        }
        for c in kernel_costs_of(g)
    ]
    return out


def _show_text(g: GraphDump, stages: list[str] | None, diff: bool) -> str:
    picked = _pick_stages(g, stages)
    inputs = g.meta.get("inputs", [])
    shown = ", ".join(inputs[:6]) + (f", ... ({len(inputs)} inputs)" if len(inputs) > 6 else "")
    lines = [f"graph {g.name}  inputs {shown}  ({g.source})", ""]
    if diff:  # what each stage changed, stage after stage
        for before, after in itertools.pairwise(picked):
            lines.append(f"== {before} -> {after} ==")
            a, b = g.stages[before].splitlines(), g.stages[after].splitlines()
            lines += list(difflib.unified_diff(a, b, before, after, lineterm=""))[2:]
            lines.append("")
    else:
        for s in picked:
            lines += [f"== {s} ==", g.stages[s].rstrip(), ""]
    groups = fusion_groups(g)
    if groups:
        lines.append("fusion groups (fuse):")
        lines += [
            f"  kernel {x['kernel']}: {' '.join(x['nodes'])}  ({', '.join(x['ops'])})"
            for x in groups
        ]
        lines.append("")
    plan = hbm_plan(g)
    if plan and plan["values"]:
        lines.append(
            f"hbm plan (plan): {plan['values']} temporaries of {plan['bytes'] / 1e6:.2f} MB share "
            f"a {plan['arena_bytes'] / 1e6:.2f} MB arena"
        )
        lines.append("")
    if g.exe is not None:
        device = device_ns(g)
        lines.append(f"kernels (simulated {device / 1e3:.2f} us on {g.exe.target}):")
        rows = report.kernel_rows(kernel_costs_of(g), device)
        lines += ["  " + line for line in _columns(report.KERNEL_HEAD, rows)]
        lines.append("")
    return "\n".join(lines) + "\n"


def _stack_svgs(pics: list[str]) -> str:
    if len(pics) == 1:
        return pics[0]
    y, width, body = 0, 0, []
    for pic in pics:
        w, h = (int(x) for x in re.search(r'width="(\d+)" height="(\d+)"', pic).groups())
        body.append(pic.replace("<svg ", f'<svg y="{y}" ', 1))
        y, width = y + h + 10, max(width, w)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}">\n'
        + "".join(body)
        + "</svg>\n"
    )


def _html(graphs: list[GraphDump], stages: list[str] | None) -> str:
    from neuroncc.runtime.timing import schedule

    items = []
    for g in graphs:
        picked = _pick_stages(g, stages)
        ir_stages = [s for s in picked if g.ir(s) is not None]
        device = device_ns(g)
        target = get_target(g.exe.target) if g.exe else None
        items.append(
            {
                "name": g.name,
                "inputs": ", ".join(g.meta.get("inputs", [])),
                "target": g.exe.target if g.exe else "-",
                "device_us": f"{device / 1e3:.2f}",
                "picture": report.graph_svg(g.ir(ir_stages[-1])) if ir_stages else "",
                "picture_stage": ir_stages[-1] if ir_stages else "",
                "kernels": report.kernel_rows(kernel_costs_of(g), device),
                "timeline": report.timeline_svg(g.exe, schedule(g.exe, target)[0]) if g.exe else "",
                "stages": [(s, g.stages[s]) for s in picked],
            }
        )
    return report.html_report(graphs[0].source if len(graphs) == 1 else "dump", items)


# -- profile --------------------------------------------------------------------------------


def profile(graphs: list[GraphDump], trace: str | None) -> None:
    from neuroncc.runtime.timing import time_executable, trace_events

    events: list[dict] = []
    for pid, g in enumerate(x for x in graphs if x.exe is not None):
        target = get_target(g.exe.target)
        p = time_executable(g.exe, target)
        rows = [
            (
                label,
                f"{busy / 1e3:.2f}",
                f"{busy / p.device_ns:.0%}" if p.device_ns else "-",
                str(n),
            )
            for label, busy, n in _engine_rows(p)
        ]
        _table(
            f"{g.name} on {p.target}: {p.device_ns / 1e3:.2f} us, MFU {p.mfu:.1%}, "
            f"HBM {p.hbm_bytes / 1e6:.2f} MB, {p.roofline_fraction:.0%} of roofline",
            ("engine", "busy us", "utilisation", "instructions"),
            rows,
        )
        events += trace_events(g.exe, target, pid)["traceEvents"]
    if trace:
        Path(trace).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
        print(f"wrote {trace} (open it in Perfetto or chrome://tracing)")


_ENGINE_NAMES = {"pe": "TensorE", "act": "ScalarE", "dve": "VectorE", "pool": "GpSimdE"}


def _engine_rows(p: Any) -> list[tuple[str, float, int]]:
    """(engine, busy ns, instructions) per compute engine, and the DMA queues as one row whose
    busy time is their mean (each queue is one of 16 running side by side)."""
    rows = [
        (label, p.engine_busy_ns.get(e, 0.0), p.engine_instructions.get(e, 0))
        for e, label in _ENGINE_NAMES.items()
    ]
    queues = [e for e in p.engine_busy_ns if e not in _ENGINE_NAMES]
    if queues:
        busy = sum(p.engine_busy_ns[q] for q in queues) / len(queues)
        n = sum(p.engine_instructions.get(q, 0) for q in queues)
        rows.append((f"DMA ({len(queues)} queues, mean)", busy, n))
    return rows


# -- run ------------------------------------------------------------------------------------


def run(script: str | None, args: Sequence[str], dump_dir: str) -> int:
    """Run script (or the built-in example) with dumping into dump_dir; the script's status."""
    if script is not None and not Path(script).is_file():
        raise DumpError(f"script {script} does not exist")
    _fresh_dump_dir(Path(dump_dir))
    command = [sys.executable, script, *args] if script else [sys.executable, "-m", "neuroncc"]
    env = {**os.environ, "NEURONCC_DUMP_DIR": str(Path(dump_dir).resolve())}
    status = subprocess.run(command, env=env, check=False).returncode
    if status:
        print(f"neuroncc-dump: the script exited with status {status}", file=sys.stderr)
    if any(is_graph_folder(p) for p in Path(dump_dir).iterdir()):
        summarise(dump_dir)
    else:
        print(f"no graph was compiled, nothing dumped in {dump_dir}")
    return status


def _fresh_dump_dir(path: Path) -> None:
    """An empty directory, or one holding only an earlier dump (which is replaced)."""
    if path.exists():
        if not path.is_dir():
            raise DumpError(f"dump directory {path} is a file")
        for p in path.iterdir():
            if is_graph_folder(p):
                shutil.rmtree(p)
            elif p.name.startswith("run-") and p.suffix == ".json":
                p.unlink()
            else:
                raise DumpError(
                    f"{path} holds {p.name}, which is not part of a neuroncc dump; "
                    "choose another --dump-dir"
                )
    path.mkdir(parents=True, exist_ok=True)


def summarise(dump_dir: str) -> None:
    graphs = load(dump_dir)
    fallbacks: dict[str, int] = {}
    for p in Path(dump_dir).glob("run-*.json"):  # stats() of each process, at its exit
        for op, n in json.loads(p.read_text()).get("fallback_nodes", {}).items():
            fallbacks[op] = fallbacks.get(op, 0) + n
    rows = []
    for g in graphs:
        costs = sorted(kernel_costs_of(g), key=lambda c: -c.ns)[:2]
        compile_s = g.meta.get("compile_seconds")
        rows.append(
            (
                g.name,
                " ".join(g.meta.get("inputs", []))[:40],
                "hit"
                if g.meta.get("cache_hit")
                else f"{compile_s * 1e3:.0f}"
                if compile_s
                else "-",
                f"{device_ns(g) / 1e3:.2f}",
                ", ".join(f"{c.name} {c.ns / 1e3:.1f}us" for c in costs),
            )
        )
    head = ("graph", "inputs", "compile ms", "device us", "top kernels")
    _table(f"{len(graphs)} graph(s) dumped in {dump_dir}", head, rows)
    if fallbacks:
        print("ran eagerly (fallbacks): " + ", ".join(f"{k} x{v}" for k, v in fallbacks.items()))
    else:
        print("fallbacks: none")


# -- cache ----------------------------------------------------------------------------------


def cache_command(action: str, key: str | None, cache_dir: str | None) -> int:
    import time

    from neuroncc import __version__
    from neuroncc.runtime.disk_cache import CorruptEntry, decode_entry

    cache = open_cache_for(cache_dir)
    entries = cache.entries()
    if action == "ls":
        rows = []
        for e in reversed(entries):  # most recently used first
            try:
                with open(e.path, "rb") as f:
                    head = json.loads(f.readline())  # the entry's header line
            except (OSError, ValueError):
                head = {}
            rows.append(
                (
                    e.key[:16],
                    str(head.get("name", "?")),
                    str(head.get("target", "?")),
                    str(head.get("neuroncc", "?")),
                    f"{e.nbytes / 1e3:.1f}",
                    f"{(time.time() - e.mtime) / 60:.0f}",
                )
            )
        head_row = ("key", "graph", "target", "neuroncc", "KB", "min ago")
        _table(f"{len(entries)} entries in {cache.root}", head_row, rows)
    elif action == "show":
        if not key:
            raise DumpError("cache show needs a KEY (or a unique prefix); see cache ls")
        print(show([load_cache_entry(key, cache_dir)], None, "text", False), end="")
    elif action == "verify":
        bad = 0
        for e in entries:
            try:
                if decode_entry(e.path.read_bytes(), e.key, __version__) is None:
                    print(f"{e.key[:16]}  stale (another neuroncc version)")
            except (CorruptEntry, OSError) as err:
                bad += 1
                print(f"{e.key[:16]}  DAMAGED: {err}")
        print(f"{len(entries)} entries, {bad} damaged")
        return 1 if bad else 0
    else:  # clear
        print(f"removed {cache.clear()} entries from {cache.root}")
    return 0


# -- the command line -----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuroncc-dump", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a script with dumping on, then summarise its graphs")
    r.add_argument("script", nargs="?", help="the script (default: the built-in example model)")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    r.add_argument("--dump-dir", default="neuroncc-dump", help="where (default ./neuroncc-dump)")

    s = sub.add_parser("show", help="a graph's stages, fusion groups and kernel costs")
    s.add_argument("dump", help="a dump directory, a graph's folder, or a cache key")
    s.add_argument("--stage", help=f"comma-separated, of: {','.join(STAGES)} (default: all)")
    s.add_argument("--format", default="text", choices=("text", "json", "dot", "svg", "html"))
    s.add_argument("--diff", action="store_true", help="diffs between the stages shown")
    s.add_argument("--graph", help="only the graphs whose name contains this")
    s.add_argument("-o", "--output", help="write here instead of stdout")
    s.add_argument("--cache-dir", help="the persistent cache (for a cache key)")

    pr = sub.add_parser("profile", help="per-engine utilisation and a Perfetto trace")
    pr.add_argument("dump", help="a dump directory, a graph's folder, or a cache key")
    pr.add_argument("--trace", help="write the trace here (Chrome trace-event JSON)")
    pr.add_argument("--graph", help="only the graphs whose name contains this")
    pr.add_argument("--cache-dir", help="the persistent cache (for a cache key)")

    rp = sub.add_parser("repro", help="replay an internal compiler error from its file")
    rp.add_argument("file", help="the .nir file an internal compiler error wrote")

    c = sub.add_parser("cache", help="inspect the persistent compile cache")
    c.add_argument("action", choices=("ls", "show", "verify", "clear"))
    c.add_argument("key", nargs="?", help="for show: a key or a unique prefix")
    c.add_argument("--cache-dir", help="default NEURONCC_CACHE_DIR or the per-user cache")
    return p


def _select(graphs: list[GraphDump], name: str | None) -> list[GraphDump]:
    if not name:
        return graphs
    chosen = [g for g in graphs if name in g.name]
    if not chosen:
        raise DumpError(
            f"no graph named like {name!r}; graphs: {', '.join(g.name for g in graphs)}"
        )
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args.script, args.args, args.dump_dir)
        if args.command == "cache":
            return cache_command(args.action, args.key, args.cache_dir)
        if args.command == "repro":
            return reproduce_ir(args.file)
        graphs = _select(load(args.dump, args.cache_dir), args.graph)
        if args.command == "profile":
            profile(graphs, args.trace)
            return 0
        stages = args.stage.split(",") if args.stage else None
        _emit(show(graphs, stages, args.format, args.diff), args.output)
        return 0
    except BrokenPipeError:  # `neuroncc-dump show ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (DumpError, OSError) as e:
        print(f"neuroncc-dump: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
