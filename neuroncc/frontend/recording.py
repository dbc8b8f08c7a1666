"""Recording the graphs a run compiles into a warmup manifest.

A manifest is a JSON-lines file: a header line {"neuroncc_manifest": 1}, then one entry per
distinct graph: its canonical IR text (which holds the shapes and dtypes), the options that
shape its executable, and the cache key it had when recorded. Entries are data; the warmup
job (warmup.py) compiles them from the IR text. Dynamo graphs with symbolic sizes are also
recorded (as fx_serde data), so that `expand` can trace them at other sizes.

Recording is on inside `with neuroncc.record(path):` or, for a whole process (and the
processes it starts), with NEURONCC_RECORD=path in the environment (`neuroncc-warmup record`
sets it). Each entry is appended with one write under the manifest's file lock, so processes
recording into one manifest do not interleave, and a process killed while recording leaves
only whole lines. Duplicates (the same key recorded twice) are dropped when it is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import filelock
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from neuroncc.errors import NeuronccError
from neuroncc.options import CompileOptions

MANIFEST_FORMAT = 1
ENV_VAR = "NEURONCC_RECORD"


class ManifestError(NeuronccError):
    stage = "manifest"


class ManifestEntry(BaseModel):
    """A graph neuroncc compiled: what `neuroncc-warmup compile` compiles."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["nir"] = "nir"
    key: str
    name: str
    options: dict[str, Any]
    ir: str


class DynamoEntry(BaseModel):
    """A Dynamo graph with symbolic sizes (fx_serde.encode_graph), with the sizes of the trial
    call: what `neuroncc-warmup expand` re-traces at other sizes. graph is None (and why says
    why) when the graph holds something fx_serde cannot encode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["dynamo"]
    key: str
    name: str
    options: dict[str, Any]
    grad_enabled: bool
    graph: dict[str, Any] | None
    why: str | None = None


AnyEntry = Annotated[ManifestEntry | DynamoEntry, Field(discriminator="kind")]
_ENTRY = TypeAdapter(AnyEntry)


_ACTIVE: list[Path] = []  # manifests of the enclosing record() blocks, innermost last
_TRACE_ONLY: list[bool] = []
_WRITTEN: dict[Path, set[str]] = {}  # keys this process has appended, per manifest


@contextlib.contextmanager
def record(path: str | os.PathLike) -> Iterator[Path]:
    """Record every graph neuroncc compiles (or finds cached) in this block into path."""
    manifest = Path(path).resolve()
    _start(manifest)
    _WRITTEN.setdefault(manifest, set()).update(_keys(manifest))
    _ACTIVE.append(manifest)
    try:
        yield manifest
    finally:
        _ACTIVE.pop()


def _keys(manifest: Path) -> set[str]:
    keys = set()
    for line in manifest.read_text().splitlines()[1:]:
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            keys.add(json.loads(line).get("key"))
    return keys


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


@contextlib.contextmanager
def trace_only() -> Iterator[None]:
    """Graphs are recorded and run eagerly, not compiled (expand traces many sizes so; the
    compile job then compiles them in parallel)."""
    _TRACE_ONLY.append(True)
    try:
        yield
    finally:
        _TRACE_ONLY.pop()


def tracing_only() -> bool:
    return bool(_TRACE_ONLY)


def record_graph(ir_text: str, opts: CompileOptions, key: str, name: str) -> None:
    """Record a graph neuroncc compiles (when recording)."""
    _record_entry(
        key, lambda: ManifestEntry(key=key, name=name, options=opts.compile_fields(), ir=ir_text)
    )


def record_dynamo(gm: Any, args: list[Any], opts: CompileOptions, name: str) -> None:
    """Record a Dynamo graph with symbolic sizes and the arguments of its first call (not
    when expand traces one: it is recorded already, and its rebuilt copy has no sizes to
    record)."""
    if _active() is None or tracing_only():
        return
    import torch

    from neuroncc.frontend.fx_serde import NotSerializable, encode_graph

    try:
        graph, why = encode_graph(gm, args), None
        shape_free = {
            "nodes": graph["nodes"],
            "placeholders": [
                {k: v for k, v in p.items() if k not in ("value", "trial_shape")}
                for p in graph["placeholders"]
            ],
        }
        identity = json.dumps(shape_free, sort_keys=True)
    except NotSerializable as e:
        graph, why, identity = None, str(e), gm.code
    options = opts.compile_fields()
    grad = torch.is_grad_enabled()
    key = hashlib.sha256(json.dumps([identity, options, grad], sort_keys=True).encode()).hexdigest()
    _record_entry(
        key,
        lambda: DynamoEntry(
            kind="dynamo",
            key=key,
            name=name,
            options=options,
            grad_enabled=grad,
            graph=graph,
            why=why,
        ),
    )


def _record_entry(key: str, make: Any) -> None:
    manifest = _active()
    if manifest is None:
        return
    written = _WRITTEN.setdefault(manifest, set())
    if key in written:
        return
    if not manifest.exists():
        _start(manifest)
    line = make().model_dump()
    with filelock.FileLock(f"{manifest}.lock"):
        _append(manifest, line)
    written.add(key)


def _append(path: Path, obj: dict) -> None:
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write: a reader never sees half a line from a live writer
    finally:
        os.close(fd)


def load_manifest(path: str | os.PathLike) -> list[ManifestEntry | DynamoEntry]:
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
    entries: dict[str, ManifestEntry | DynamoEntry] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = _ENTRY.validate_json(line)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "line"
            raise ManifestError(f"{path}:{lineno}: malformed entry ({where}: {first['msg']})")
        entries.setdefault(entry.key, entry)
    return list(entries.values())
