"""Reading what neuroncc-dump shows: dump directories (frontend/dump.py writes them) and
persistent-cache entries, as GraphDump records, and the facts derived from one (device time,
kernel costs, fusion groups). No output here; dump_cli.py prints.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuroncc.codegen.executable.listing import listing
from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.codegen.kernels.emit import arena_bytes
from neuroncc.errors import NeuronccError
from neuroncc.frontend.dump import GRAPH_META, PROGRAM
from neuroncc.ir.graph import Graph
from neuroncc.ir.parser import parse
from neuroncc.runtime.timing import KernelCost, kernel_costs, time_executable

# The stages of design.md in pipeline order (auto-cast only with auto_cast="matmul").
STAGES = ("fx", "nir", "auto-cast", "simplify", "fuse", "layout", "tile", "schedule", "plan")
STAGES += ("program",)
_STAGE_FILE = re.compile(r"^(\d\d)-([\w-]+)\.txt$")


class DumpError(NeuronccError):
    stage = "dump"


@dataclass
class GraphDump:
    name: str
    source: str
    stages: dict[str, str]  # stage -> text, in pipeline order
    exe: Executable | None
    meta: dict[str, Any] = field(default_factory=dict)

    def ir(self, stage: str) -> Graph | None:
        """The stage's graph, for the tensor-IR stages (nir and the passes)."""
        if stage in ("fx", "program") or stage not in self.stages:
            return None
        return parse(self.stages[stage])


# -- loading dumps and cache entries --------------------------------------------------------


def is_graph_folder(p: Path) -> bool:
    return p.is_dir() and any(_STAGE_FILE.match(f.name) for f in p.iterdir())


def load(what: str, cache_dir: str | None = None) -> list[GraphDump]:
    path = Path(what)
    if path.is_dir():
        folders = (
            [path]
            if is_graph_folder(path)
            else sorted(
                (p for p in path.iterdir() if is_graph_folder(p)), key=lambda p: p.stat().st_mtime
            )
        )
        if not folders:
            raise DumpError(f"{what} is not a neuroncc dump (no folders of NN-<stage>.txt files)")
        return [_load_folder(f) for f in folders]
    if path.exists():
        raise DumpError(f"{what} is a file; give a dump directory or a cache key")
    if re.fullmatch(r"[0-9a-f]{6,64}", what):
        return [load_cache_entry(what, cache_dir)]
    raise DumpError(f"{what} is neither a dump directory nor a cache key (hex, 6+ digits)")


def _load_folder(folder: Path) -> GraphDump:
    try:
        stages = {}
        for f in sorted(folder.iterdir()):
            m = _STAGE_FILE.match(f.name)
            if m:
                stages[m.group(2)] = f.read_text()
        meta_file, program = folder / GRAPH_META, folder / PROGRAM
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        exe = Executable.from_json(program.read_text()) if program.exists() else None
    except (OSError, UnicodeDecodeError) as e:
        raise DumpError(f"cannot read the dump {folder}: {e}") from None
    except (ValueError, TypeError) as e:
        raise DumpError(f"the dump {folder} is damaged: {e}") from None
    return GraphDump(folder.name, str(folder), stages, exe, meta)


def open_cache_for(cache_dir: str | None):
    """The persistent cache at cache_dir, NEURONCC_CACHE_DIR or the per-user default."""
    from neuroncc.runtime.disk_cache import open_cache

    return open_cache(cache_dir or os.environ.get("NEURONCC_CACHE_DIR") or None)


def load_cache_entry(prefix: str, cache_dir: str | None) -> GraphDump:
    from neuroncc import __version__
    from neuroncc.frontend.compile import stage_snapshots
    from neuroncc.options import CompileOptions

    cache = open_cache_for(cache_dir)
    matches = [e for e in cache.entries() if e.key.startswith(prefix)]
    if len(matches) != 1:
        found = "no" if not matches else f"{len(matches)}"
        raise DumpError(f"{found} cache entries in {cache.root} have a key starting {prefix}")
    entry = cache.load(matches[0].key, __version__)
    if entry is None:
        raise DumpError(f"cache entry {matches[0].key} is damaged or of another version")
    g = parse(entry.meta["ir"])
    stages = {"nir": entry.meta["ir"]}
    stages.update(stage_snapshots(g, CompileOptions(**entry.meta["options"], disk_cache=False)))
    stages["program"] = listing(entry.executable)
    meta = {**entry.meta, "key": matches[0].key, "inputs": [str(v.type) for v in g.inputs]}
    return GraphDump(entry.meta["name"], f"cache:{matches[0].key}", stages, entry.executable, meta)


def device_ns(g: GraphDump) -> float:
    return time_executable(g.exe, get_target(g.exe.target)).device_ns if g.exe else 0.0


def kernel_costs_of(g: GraphDump) -> list[KernelCost]:
    return kernel_costs(g.exe, get_target(g.exe.target)) if g.exe else []


def fusion_groups(g: GraphDump) -> list[dict[str, Any]]:
    fused = g.ir("fuse")
    if fused is None:
        return []
    ops = {n.out.id: n.op.value for n in fused.nodes}
    return [
        {"kernel": k, "nodes": [f"%{v}" for v in ids], "ops": [ops[v] for v in ids]}
        for k, ids in enumerate(fused.kernels)
    ]


def hbm_plan(g: GraphDump) -> dict[str, int] | None:
    """What the plan pass did: how many temporaries it placed, their bytes, and the arena they
    share (passes/plan.py)."""
    planned = g.ir("plan")
    if planned is None:
        return None
    sizes = [
        n.out.type.nbytes for n in planned.nodes if planned.choice(n.out.id, "hbm") is not None
    ]
    return {"values": len(sizes), "bytes": sum(sizes), "arena_bytes": arena_bytes(planned)[0]}
