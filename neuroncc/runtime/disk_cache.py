"""The persistent compile cache: executables on disk, shared by every process and run.

Layout under the cache root (NEURONCC_CACHE_DIR, the cache_dir option, or the per-user cache
directory from platformdirs):

    v<CACHE_FORMAT>/<key[:2]>/<key>.json     one entry per compiled graph
    locks/<key[:2]>/<key>.lock               the lock a process holds while compiling that key

An entry is a one-line JSON header {"format", "neuroncc", "key", "name", "target", "sha256",
"bytes"}, a newline,
and the body: the JSON of {"executable", "profile", "meta"}, zlib-compressed, whose length and
digest the header holds (the body is parsed once, after its digest checks out: that is most of
a hit's cost).

Note [compressed entries]: an executable's calls and the graph's IR text (in meta) grow with a
model's depth, and layer after layer they repeat themselves: compressed, a 16-layer model's
entry is a fifth of its JSON (386 -> 82 KB, a small Llama), and decompressing costs a few ms per
megabyte, little beside parsing it.

Invariants:
- Loading never executes code: the body is parsed as JSON and decoded by Executable.from_data
  (which builds only the instruction dataclasses) and the Profile fields.
- An entry is visible only when complete: it is written to a temporary file in its own
  directory, flushed to disk, then renamed over the final name. A writer killed halfway
  leaves a `.tmp-*` file that no reader looks at (and the next eviction removes).
- One process compiles a key at a time (`compiling`): the others wait on the key's lock and
  then load the entry. The lock is an OS file lock, released by the kernel when its holder
  dies, so an interrupted compile never leaves a stale lock.
- An entry that is unreadable, fails its checksum or does not decode is reported once,
  deleted and recompiled. An entry written by another neuroncc or cache format is replaced
  without a warning: that is an upgrade, not damage.
- A cache directory that cannot be written (read-only, full, not a directory) turns the disk
  cache off for this process with one warning; compiling goes on with the memory cache.
- Only successful compiles are stored; `store` runs after a compile returned.
- With max_bytes set, each store evicts the least recently used entries (by mtime, which a
  hit refreshes) until the entries fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from neuroncc.codegen.executable.program import FORMAT_VERSION, Executable, no_gc
from neuroncc.runtime.timing import Profile

CACHE_FORMAT = 2  # 2: the body is zlib-compressed
LOCK_TIMEOUT_S = 600.0  # a compile that holds a key longer than this is compiled again here


@dataclass(frozen=True)
class Entry:
    executable: Executable
    profile: Profile
    meta: dict[str, Any]  # graph name, ir text, options, target, compile seconds, created


@dataclass(frozen=True)
class EntryInfo:
    key: str
    path: Path
    nbytes: int
    mtime: float


class CorruptEntry(Exception):
    """An entry file that is not a valid entry; the message says why."""


def cache_key(ir_text: str, options_key: str, target: str, version: str) -> str:
    """The key of a compiled graph in both caches: its canonical IR text (shapes and dtypes
    included), compile options, target, the neuroncc and executable-format versions, and the
    compiler's own code (so a changed compiler never reuses what an older one compiled)."""
    h = hashlib.sha256()
    for part in (ir_text, options_key, target, version, str(FORMAT_VERSION), code_fingerprint()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def code_fingerprint() -> str:
    """A digest of neuroncc's source files and templates (a few milliseconds, once)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.j2")]):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def default_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("neuroncc", appauthor=False))


class DiskCache:
    def __init__(self, root: str | os.PathLike, max_bytes: int | None = None) -> None:
        self.root = Path(root).expanduser()
        self.max_bytes = max_bytes
        self.disabled_reason: str | None = None
        self._reported: set[str] = set()  # keys whose damage was already reported

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    def path(self, key: str) -> Path:
        return self.root / f"v{CACHE_FORMAT}" / key[:2] / f"{key}.json"

    # -- reading ----------------------------------------------------------------------------

    def load(self, key: str, version: str) -> Entry | None:
        """The entry for key, or None (missing, stale, or damaged: damage warns once)."""
        if not self.enabled:
            return None
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:  # permissions, I/O: the directory's trouble, not the entry's
            self._disable(e)
            return None
        try:
            entry = decode_entry(raw, key, version)
        except CorruptEntry as e:
            self._damaged(key, path, str(e))
            return None
        if entry is None:  # another format or neuroncc version: replace quietly
            _remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock
        return entry

    def _damaged(self, key: str, path: Path, why: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            warnings.warn(
                f"neuroncc cache entry {path} {why}; it is removed and the graph recompiled",
                stacklevel=3,
            )
        _remove(path)

    # -- writing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def compiling(self, key: str) -> Iterator[None]:
        """Hold key's compile lock (waiting for another process's compile of it to end)."""
        if not self.enabled:
            yield
            return
        lock_path = self.root / "locks" / key[:2] / f"{key}.lock"
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(lock_path, timeout=LOCK_TIMEOUT_S)
            lock.acquire()
        except filelock.Timeout:
            yield  # the holder is stuck or very slow: compile here too, the rename is atomic
            return
        except OSError as e:
            self._disable(e)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def store(self, key: str, entry: Entry) -> bool:
        """Write entry atomically; False (and the cache off, with a warning) if it cannot."""
        if not self.enabled:
            return False
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, encode_entry(entry, key))
        except OSError as e:
            self._disable(e)
            return False
        if self.max_bytes is not None:
            self.evict(self.max_bytes)
        return True

    def _disable(self, e: OSError) -> None:
        self.disabled_reason = f"{e.strerror or e} ({e.filename or self.root})"
        warnings.warn(
            f"neuroncc cannot use its compile cache at {self.root}: {self.disabled_reason}; "
            "caching in memory only for this process",
            stacklevel=4,
        )

    # -- maintenance ------------------------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every entry file of the current format, least recently used first."""
        found = []
        for path in (self.root / f"v{CACHE_FORMAT}").glob("*/*.json"):
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                found.append(EntryInfo(path.stem, path, st.st_size, st.st_mtime))
        return sorted(found, key=lambda e: e.mtime)

    def evict(self, max_bytes: int) -> list[str]:
        """Remove least recently used entries until the rest fit in max_bytes; the keys gone."""
        entries = self.entries()
        total = sum(e.nbytes for e in entries)
        gone = []
        for e in entries:
            if total <= max_bytes:
                break
            _remove(e.path)
            total -= e.nbytes
            gone.append(e.key)
        self._sweep_temporaries()
        return gone

    def _sweep_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Temporary files of writers that died (a live writer's file is seconds old)."""
        now = time.time()
        for tmp in (self.root / f"v{CACHE_FORMAT}").glob("*/.tmp-*"):
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > older_than_s:
                    tmp.unlink()

    def clear(self) -> int:
        """Remove every entry (of any format); the number removed."""
        n = 0
        for path in self.root.glob("v*/*/*.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                n += 1
        return n


# -- the entry format -----------------------------------------------------------------------


def encode_entry(entry: Entry, key: str) -> bytes:
    body = json.dumps(
        {
            "executable": entry.executable.to_data(),
            "profile": dataclasses.asdict(entry.profile),
            "meta": entry.meta,
        },
        separators=(",", ":"),
    ).encode()
    body = zlib.compress(body, 6)  # Note [compressed entries]
    header = {
        "format": CACHE_FORMAT,
        "neuroncc": entry.meta["neuroncc"],
        "key": key,
        "name": entry.meta["name"],  # for listings, which read only headers
        "target": entry.meta["target"],
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
    }
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def decode_entry(raw: bytes, key: str, version: str) -> Entry | None:
    """The entry in raw; None if it is of another format or version; CorruptEntry if damaged."""
    head, _, body = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CorruptEntry("does not start with an entry header") from None
    if not isinstance(header, dict) or "sha256" not in header:
        raise CorruptEntry("is not a neuroncc cache entry")
    if header.get("format") != CACHE_FORMAT or header.get("neuroncc") != version:
        return None
    if header.get("key") != key:
        raise CorruptEntry(f"holds key {str(header.get('key'))[:16]}..., not its file name")
    if len(body) != header.get("bytes"):
        raise CorruptEntry(f"is truncated ({len(body)} of {header.get('bytes')} bytes)")
    if hashlib.sha256(body).hexdigest() != header["sha256"]:
        raise CorruptEntry("fails its checksum (modified or damaged)")
    try:
        with no_gc():
            data = json.loads(zlib.decompress(body))
            exe = Executable.from_data(data["executable"])
        names = {f.name for f in dataclasses.fields(Profile)}
        if set(data["profile"]) != names:
            raise ValueError(f"profile fields {sorted(data['profile'])}")
        profile = Profile(**data["profile"])
        meta = data["meta"]
    except (ValueError, KeyError, TypeError, zlib.error) as e:
        raise CorruptEntry(f"does not decode: {e}") from None
    return Entry(exe, profile, meta)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(Path(tmp))
        raise


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):  # gone already, or a cache we cannot write
        path.unlink()


# One DiskCache per root in a process, so that warnings and the disabled state are per process.
_OPEN: dict[tuple[str, int | None], DiskCache] = {}


def open_cache(root: str | os.PathLike | None, max_bytes: int | None = None) -> DiskCache:
    path = Path(root).expanduser() if root else default_root()
    key = (str(path.resolve()), max_bytes)
    if key not in _OPEN:
        _OPEN[key] = DiskCache(path, max_bytes)
    return _OPEN[key]
