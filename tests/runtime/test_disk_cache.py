"""The persistent compile cache: hits across processes, and every fault the issue lists.

Processes are real subprocesses (a cache must survive a new process); each test has its own
empty cache directory (conftest.private_disk_cache).
"""

import errno
import hashlib
import json
import os
import subprocess
import sys
import warnings
import zlib

import pytest
import torch

import neuroncc
from neuroncc.runtime import disk_cache
from neuroncc.runtime.cache import GRAPH_CACHE
from neuroncc.runtime.disk_cache import CACHE_FORMAT, CorruptEntry, DiskCache, decode_entry

# Two graphs (forward and backward), compiled, run and checked against eager; prints stats.
SCRIPT = """
import json, sys, torch, neuroncc
torch.manual_seed(0)
w = torch.randn(16, 8, requires_grad=True)
f = torch.compile(lambda x: torch.tanh(x @ w).sum(-1), backend="neuron")
x = torch.randn(4, 16)
got = f(x)
got.sum().backward()
torch.testing.assert_close(got, torch.tanh(x @ w).sum(-1))
s = neuroncc.stats()
print(json.dumps({k: s[k] for k in ("compiles", "cache_hits_disk", "cache_hits_memory")}))
"""


def _run(root, script=SCRIPT, **env):
    proc = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env={**os.environ, "NEURONCC_CACHE_DIR": str(root), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entries(root):
    return sorted(root.glob(f"v{CACHE_FORMAT}/*/*.json"))


def _valid(path):
    return decode_entry(path.read_bytes(), path.stem, neuroncc.__version__) is not None


def test_a_new_process_against_a_warm_cache_compiles_nothing(private_disk_cache):
    first = _run(private_disk_cache)
    assert first == {"compiles": 2, "cache_hits_disk": 0, "cache_hits_memory": 0}
    assert len(_entries(private_disk_cache)) == 2
    second = _run(private_disk_cache)
    assert second == {"compiles": 0, "cache_hits_disk": 2, "cache_hits_memory": 0}


def test_four_processes_filling_one_empty_cache_compile_each_graph_once(private_disk_cache):
    env = {**os.environ, "NEURONCC_CACHE_DIR": str(private_disk_cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(r["compiles"] for r in results) == 2  # the key lock: one compile per graph
    assert sum(r["cache_hits_disk"] for r in results) == 6
    entries = _entries(private_disk_cache)
    assert len(entries) == 2 and all(_valid(e) for e in entries)


KILL_WHILE_WRITING = (
    """
import os, signal
from neuroncc.runtime import disk_cache
real_fsync = os.fsync
def fsync_then_die(fd):
    real_fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)  # the entry's bytes are on disk, not yet renamed
disk_cache.os.fsync = fsync_then_die
"""
    + SCRIPT
)


def test_sigkill_while_writing_leaves_no_entry_and_no_stale_lock(private_disk_cache):
    env = {**os.environ, "NEURONCC_CACHE_DIR": str(private_disk_cache)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_WHILE_WRITING], check=False, env=env, timeout=300
    )
    assert proc.returncode == -9
    assert _entries(private_disk_cache) == []  # only a .tmp-* file, which no reader opens
    assert list(private_disk_cache.glob(f"v{CACHE_FORMAT}/*/.tmp-*"))
    # The dead process held the key's lock: the kernel released it, so this does not wait.
    assert _run(private_disk_cache)["compiles"] == 2
    assert all(_valid(e) for e in _entries(private_disk_cache))


def _compile_once(x):
    torch._dynamo.reset()
    GRAPH_CACHE.clear()
    neuroncc.reset_stats()
    return torch.compile(lambda x: torch.exp(x) * 3, backend="neuron")(x)


def _truncate(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _flip_a_body_byte(raw: bytes) -> bytes:
    i = raw.index(b"\n") + 200
    return raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1 :]


def _forge(raw: bytes, fix_checksum: bool) -> bytes:
    head, _, body = raw.partition(b"\n")
    header, data = json.loads(head), json.loads(zlib.decompress(body))
    data["executable"]["blocks"][0][2][0][0] = "exec_python"
    body = zlib.compress(json.dumps(data).encode())
    header["bytes"] = len(body)
    if fix_checksum:
        header["sha256"] = hashlib.sha256(body).hexdigest()
    return json.dumps(header).encode() + b"\n" + body


def _tamper(raw: bytes) -> bytes:
    return _forge(raw, fix_checksum=False)


def _forge_with_a_valid_checksum(raw: bytes) -> bytes:
    """Only instructions of the ISA decode: an entry never names code to run."""
    return _forge(raw, fix_checksum=True)


def _not_json(raw: bytes) -> bytes:
    return b"\x00\xff" * 100


@pytest.mark.parametrize(
    "damage", [_truncate, _flip_a_body_byte, _tamper, _forge_with_a_valid_checksum, _not_json]
)
def test_a_damaged_entry_is_reported_once_recompiled_and_replaced(
    fresh, private_disk_cache, damage
):
    x = torch.randn(5)
    expected = _compile_once(x)
    (entry,) = _entries(private_disk_cache)
    entry.write_bytes(damage(entry.read_bytes()))
    with pytest.warns(UserWarning, match="is removed and the graph recompiled") as caught:
        got = _compile_once(x)
    assert len([w for w in caught if "cache entry" in str(w.message)]) == 1
    torch.testing.assert_close(got, expected)
    assert neuroncc.stats()["compiles"] == 1
    assert _entries(private_disk_cache) == [entry] and _valid(entry)
    _compile_once(x)
    assert neuroncc.stats()["cache_hits_disk"] == 1


def test_an_entry_of_an_older_format_is_ignored_and_replaced_quietly(fresh, private_disk_cache):
    x = torch.randn(5)
    _compile_once(x)
    (entry,) = _entries(private_disk_cache)
    head, _, body = entry.read_bytes().partition(b"\n")
    header = json.loads(head)
    header["format"] = CACHE_FORMAT - 1
    entry.write_bytes(json.dumps(header).encode() + b"\n" + body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_once(x)
    assert neuroncc.stats()["compiles"] == 1
    assert json.loads(entry.read_bytes().partition(b"\n")[0])["format"] == CACHE_FORMAT


def test_an_unwritable_cache_degrades_to_memory_with_one_warning(
    fresh, private_disk_cache, monkeypatch
):
    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(disk_cache, "_atomic_write", disk_full)
    monkeypatch.setattr(disk_cache, "_OPEN", {})
    x = torch.randn(5)
    with pytest.warns(UserWarning, match="No space left on device.*caching in memory only"):
        torch.compile(lambda x: torch.exp(x) * 3, backend="neuron")(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.compile(lambda x: torch.sin(x) - 1, backend="neuron")(x)
        torch.compile(lambda x: torch.sin(x) - 1, backend="neuron")(x)
    torch.testing.assert_close(got, torch.sin(x) - 1)
    s = neuroncc.stats()
    assert s["compiles"] == 2 and s["cache_hits_memory"] == 1 and _entries(private_disk_cache) == []


def test_a_cache_dir_that_is_not_a_directory_degrades_the_same_way(fresh, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    x = torch.randn(5)
    options = {"cache_dir": str(blocker / "cache")}
    with pytest.warns(UserWarning, match="cannot use its compile cache"):
        got = torch.compile(lambda x: torch.exp(x) * 3, backend="neuron", options=options)(x)
    torch.testing.assert_close(got, torch.exp(x) * 3)
    assert neuroncc.stats()["compiles"] == 1


def test_size_cap_evicts_the_least_recently_used(fresh, private_disk_cache):
    x = torch.randn(5)
    fns = [lambda x: torch.exp(x) * 3, lambda x: torch.sin(x) - 1, lambda x: torch.cos(x) + 2]
    paths = []
    for fn in fns:
        torch._dynamo.reset()
        torch.compile(fn, backend="neuron")(x)
        (new,) = set(_entries(private_disk_cache)) - set(paths)
        paths.append(new)
    for age, p in enumerate(paths):  # mtimes far apart, oldest first; then touch the oldest
        os.utime(p, (1_000_000 + age * 100, 1_000_000 + age * 100))
    cache = DiskCache(private_disk_cache)
    assert cache.load(paths[0].stem, neuroncc.__version__) is not None  # now most recent
    cap = sum(p.stat().st_size for p in paths[:1] + paths[2:])
    assert cache.evict(cap) == [paths[1].stem]
    assert _entries(private_disk_cache) == sorted([paths[0], paths[2]])


def test_cache_max_bytes_option_caps_the_cache_as_it_fills(fresh, private_disk_cache):
    x = torch.randn(5)
    options = {"cache_max_bytes": 1}  # smaller than any entry: each store evicts the others
    for fn in (lambda x: torch.exp(x) * 3, lambda x: torch.sin(x) - 1):
        torch._dynamo.reset()
        torch.compile(fn, backend="neuron", options=options)(x)
    assert _entries(private_disk_cache) == []


def test_decode_rejects_another_key_and_non_entries():
    with pytest.raises(CorruptEntry, match="not a neuroncc cache entry"):
        decode_entry(b"[1, 2]\n{}", "k", neuroncc.__version__)
    header = {"format": CACHE_FORMAT, "neuroncc": neuroncc.__version__, "key": "a", "sha256": ""}
    with pytest.raises(CorruptEntry, match="holds key a"):
        decode_entry(json.dumps(header).encode() + b"\n{}", "b", neuroncc.__version__)
