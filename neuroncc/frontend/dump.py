"""Write every stage of a compiled graph to a dump directory, for neuroncc-dump to read.

Layout:
    <dump_dir>/<graph name>/NN-<stage>.txt   fx, nir, each pass of the pipeline, program
    <dump_dir>/<graph name>/program.json     the executable itself (program.py's format)
    <dump_dir>/<graph name>/graph.json       name, shapes, options, cache key, compile time
    <dump_dir>/run-<pid>.json                at exit: that process's stats() (executions,
                                             device time per graph, fallbacks)

A graph found in the cache is dumped too: its passes are re-run for their snapshots (cheap;
they are deterministic) and its cached program is written. Files are written whole (temp file
and rename), so a reader never sees half of one.
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuroncc.codegen.executable.listing import listing
from neuroncc.codegen.executable.program import Executable
from neuroncc.ir.graph import Graph
from neuroncc.ir.printer import print_graph

if TYPE_CHECKING:
    import torch

GRAPH_META = "graph.json"
PROGRAM = "program.json"


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def dump_graph(
    dump_dir: str,
    name: str,
    gm: torch.fx.GraphModule,
    nir: Graph,
    snapshots: list[tuple[str, str]],
    exe: Executable,
    meta: dict[str, Any],
) -> Path:
    folder = Path(dump_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    stages = [("fx", gm.print_readable(print_output=False)), ("nir", print_graph(nir))]
    stages += snapshots
    stages.append(("program", listing(exe)))
    for i, (stage, text) in enumerate(stages):
        _write(folder / f"{i:02d}-{stage}.txt", text)
    _write(folder / PROGRAM, exe.to_json())
    meta = {
        **meta,
        "name": name,
        "inputs": [str(v.type) for v in nir.inputs],
        "outputs": [str(v.type) for v in nir.outputs],
        "stages": [stage for stage, _ in stages],
    }
    _write(folder / GRAPH_META, json.dumps(meta, indent=1))
    return folder


_SUMMARIES: set[str] = set()


def write_run_summary_at_exit(dump_dir: str) -> None:
    """Once per dump directory and process: at exit, write this process's stats() there."""
    if dump_dir in _SUMMARIES:
        return
    _SUMMARIES.add(dump_dir)
    path = Path(dump_dir) / f"run-{os.getpid()}.json"

    def write() -> None:
        from neuroncc import stats

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(path, json.dumps(stats(), indent=1, default=str))
        except OSError:
            pass  # the process is ending; a dump that cannot be written is not its concern

    atexit.register(write)
