"""Write every stage of a compiled graph to a dump directory: fx, nir, each pass, program.

Layout: <dump_dir>/<graph name>/<nn>-<stage>.txt, plus program.json (the executable itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from neuroncc.codegen.listing import listing
from neuroncc.codegen.program import Executable
from neuroncc.ir.graph import Graph
from neuroncc.ir.printer import print_graph


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
) -> Path:
    folder = Path(dump_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    stages = [("fx", gm.print_readable(print_output=False)), ("nir", print_graph(nir))]
    stages += snapshots
    stages.append(("program", listing(exe)))
    for i, (stage, text) in enumerate(stages):
        _write(folder / f"{i:02d}-{stage}.txt", text)
    _write(folder / "program.json", exe.to_json())
    return folder
