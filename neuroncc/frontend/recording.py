"""Recording the graphs a run compiles into a warmup manifest.

A manifest is a JSON-lines file: a header line {"neuroncc_manifest": 1}, then one entry per
distinct graph: its canonical IR text (which holds the shapes and dtypes), the options that
shape its executable, and the cache key it had when recorded. Entries are data; the warmup
job (warmup.py) compiles them from the IR text.

Recording is on inside `with neuroncc.record(path):` or, for a whole process (and the
processes it starts), with NEURONCC_RECORD=path in the environment (`neuroncc-warmup record`
sets it). Each entry is appended with one write under the manifest's file lock, so processes
recording into one manifest do not interleave, and a process killed while recording leaves
only whole lines. Duplicates (the same key recorded twice) are dropped when it is read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import filelock
from pydantic import BaseModel, ConfigDict, ValidationError

from neuroncc.errors import NeuronccError
from neuroncc.options import CompileOptions

MANIFEST_FORMAT = 1
ENV_VAR = "NEURONCC_RECORD"


class ManifestError(NeuronccError):
    stage = "manifest"


class ManifestEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["nir"] = "nir"
    key: str
    name: str
    options: dict[str, Any]
    ir: str


_ACTIVE: list[Path] = []  # manifests of the enclosing record() blocks, innermost last
_WRITTEN: dict[Path, set[str]] = {}  # keys this process has appended, per manifest


@contextlib.contextmanager
def record(path: str | os.PathLike) -> Iterator[Path]:
    """Record every graph neuroncc compiles (or finds cached) in this block into path."""
    manifest = Path(path).resolve()
    _start(manifest)
    _ACTIVE.append(manifest)
    try:
        yield manifest
    finally:
        _ACTIVE.pop()


def _active() -> Path | None:
    if _ACTIVE:
        return _ACTIVE[-1]
    env = os.environ.get(ENV_VAR)
    return Path(env).resolve() if env else None


def _start(manifest: Path) -> None:
    """Create the manifest with its header unless it exists (appending to it is allowed)."""
    manifest.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{manifest}.lock"):
        if not manifest.exists() or manifest.stat().st_size == 0:
            _append(manifest, {"neuroncc_manifest": MANIFEST_FORMAT})


def record_graph(ir_text: str, opts: CompileOptions, key: str, name: str) -> None:
    manifest = _active()
    if manifest is None:
        return
    written = _WRITTEN.setdefault(manifest, set())
    if key in written:
        return
    if not manifest.exists():
        _start(manifest)
    options = opts.model_dump(include={"target", "opt_level", "auto_cast", "fallback"})
    entry = ManifestEntry(key=key, name=name, options=options, ir=ir_text)
    with filelock.FileLock(f"{manifest}.lock"):
        _append(manifest, entry.model_dump())
    written.add(key)


def _append(path: Path, obj: dict) -> None:
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write: a reader never sees half a line from a live writer
    finally:
        os.close(fd)


def load_manifest(path: str | os.PathLike) -> list[ManifestEntry]:
    """The distinct entries of a manifest, in recorded order; ManifestError if it is missing
    or malformed (naming the line)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ManifestError(f"manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"manifest {path} cannot be read: {e}") from None
    if not lines:
        raise ManifestError(f"manifest {path} is empty (expected a neuroncc_manifest header)")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("neuroncc_manifest") != MANIFEST_FORMAT:
        raise ManifestError(
            f"{path}:1 is not a neuroncc manifest header "
            f'(expected {{"neuroncc_manifest": {MANIFEST_FORMAT}}})'
        )
    entries: dict[str, ManifestEntry] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = ManifestEntry.model_validate_json(line)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "line"
            raise ManifestError(f"{path}:{lineno}: malformed entry ({where}: {first['msg']})")
        entries.setdefault(entry.key, entry)
    return list(entries.values())
