"""neuroncc-dump as a user runs it: subprocesses on the built-in example model, their output
and files; JSON output that round-trips into the IR; bad input gets one line and status 2."""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from neuroncc.ir import parse
from neuroncc.ir.jsonform import graph_from_json
from neuroncc.runtime.disk_cache import CACHE_FORMAT

DUMP = str(Path(sys.executable).with_name("neuroncc-dump"))


def _cli(*args, check=True, cwd=None, cache=None):
    env = dict(os.environ)
    if cache is not None:
        env["NEURONCC_CACHE_DIR"] = str(cache)
    proc = subprocess.run(
        [DUMP, *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """`neuroncc-dump run` with no script: the built-in example model, dumped."""
    root = tmp_path_factory.mktemp("dump")
    cache = root / "cache"
    proc = _cli("run", "--dump-dir", root / "d", cwd=root, cache=cache)
    return root / "d", cache, proc.stdout


def test_run_summarises_the_graphs(dumped):
    dump, _, out = dumped
    assert "2 graph(s) dumped in" in out
    for column in ("graph", "inputs", "compile ms", "device us", "top kernels"):
        assert column in out
    assert "graph1_forward" in out and "graph1_backward" in out
    assert "fallbacks: none" in out
    assert "\x1b[" not in out  # piped: plain text, no colour codes
    assert sorted(p.name for p in dump.iterdir() if p.is_dir()) == [
        "graph1_backward",
        "graph1_forward",
    ]
    assert list(dump.glob("run-*.json"))


def test_show_text_has_stages_fusion_groups_and_kernel_costs(dumped):
    dump, _, _ = dumped
    out = _cli("show", dump, "--graph", "forward").stdout
    for stage in ("fx", "nir", "simplify", "fuse", "layout", "tile", "schedule", "plan", "program"):
        assert f"== {stage} ==" in out
    assert "fusion groups (fuse):" in out and "kernel 0: %" in out
    assert re.search(
        r"hbm plan \(plan\): \d+ temporaries of [\d.]+ MB share a [\d.]+ MB arena", out
    )
    assert "[hbm=0" in out and "layout=" in out
    assert "kernels (simulated" in out and "roofline" in out
    only = _cli("show", dump / "graph1_forward", "--stage", "program").stdout
    assert "== program ==" in only and "== fuse ==" not in only


def test_show_diff_between_stages(dumped):
    dump, _, _ = dumped
    out = _cli("show", dump, "--graph", "forward", "--stage", "nir,simplify", "--diff").stdout
    assert "== nir -> simplify ==" in out
    assert any(line.startswith("-  %") for line in out.splitlines())


def test_show_json_round_trips_into_the_ir(dumped):
    dump, _, _ = dumped
    data = json.loads(_cli("show", dump, "--format", "json").stdout)
    assert [g["name"] for g in data["graphs"]] == ["graph1_forward", "graph1_backward"]
    for g in data["graphs"]:
        for stage in ("nir", "simplify", "fuse"):
            entry = g["stages"][stage]
            assert graph_from_json(entry["ir"]) == parse(entry["text"])
        assert g["fusion"] and g["kernels"]
        assert all(0 < k["fraction"] <= 1 for k in g["kernels"] if k["ns"] > 0)


def test_pictures_and_the_html_report(dumped, tmp_path):
    dump, _, _ = dumped
    dot = _cli("show", dump, "--graph", "forward", "--format", "dot").stdout
    assert dot.startswith('digraph "graph1_forward"') and "subgraph cluster_0" in dot
    _cli("show", dump, "--format", "svg", "-o", tmp_path / "g.svg")
    assert ET.parse(tmp_path / "g.svg").getroot().tag.endswith("svg")
    _cli("show", dump, "--format", "html", "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "engine timeline" in page and "<svg" in page and "kernels" in page
    assert "<script" not in page and "src=" not in page and "href=" not in page  # no network


def test_profile_prints_engines_and_writes_a_trace(dumped, tmp_path):
    dump, _, _ = dumped
    out = _cli("profile", dump, "--trace", tmp_path / "t.json").stdout
    for engine in ("TensorE", "VectorE", "ScalarE", "GpSimdE", "DMA (16 queues, mean)"):
        assert engine in out
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}


def test_cache_commands(dumped):
    _, cache, _ = dumped
    ls = _cli("cache", "ls", "--cache-dir", cache).stdout
    assert "2 entries in" in ls and "graph1_forward" in ls
    key = next(p.stem for p in cache.glob("v*/*/*.json"))
    shown = _cli("cache", "show", key[:10], "--cache-dir", cache).stdout
    assert "== fuse ==" in shown and f"cache:{key}" in shown
    assert "== fuse ==" in _cli("show", key[:10], "--cache-dir", cache).stdout
    assert "2 entries, 0 damaged" in _cli("cache", "verify", "--cache-dir", cache).stdout


def test_cache_verify_and_clear_a_damaged_cache(tmp_path):
    cache = tmp_path / "cache"
    entry = cache / f"v{CACHE_FORMAT}" / "ab" / ("ab" * 32 + ".json")
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b'{"format": %d}\ntruncated' % CACHE_FORMAT)
    verify = _cli("cache", "verify", "--cache-dir", cache, check=False)
    assert verify.returncode == 1 and "DAMAGED" in verify.stdout
    assert "removed 1 entries" in _cli("cache", "clear", "--cache-dir", cache).stdout


@pytest.mark.parametrize("command", ["run", "show", "profile", "cache"])
def test_every_command_has_help(command):
    assert "usage: neuroncc-dump " + command in _cli(command, "--help").stdout


def test_bad_input_gets_one_line_and_status_2(dumped, tmp_path):
    dump, _, _ = dumped
    broken = tmp_path / "broken"
    (broken / "g").mkdir(parents=True)
    (broken / "g" / "00-nir.txt").write_text("graph @g() {\n  return\n}\n")
    (broken / "g" / "program.json").write_text("{not json")
    raises = tmp_path / "raises.py"
    raises.write_text("raise RuntimeError('the user script failed')\n")
    cases = [
        (("run", tmp_path / "missing.py"), "script", "does not exist"),
        (("show", dump, "--stage", "bogus"), "unknown stage 'bogus'; stages: fx, nir"),
        (("show", dump, "--stage", "auto-cast"), "has no stage 'auto-cast'; it has: fx, nir"),
        (("show", broken), "is damaged"),
        (("show", tmp_path / "nothing"), "is neither a dump directory nor a cache key"),
        (("show", dump, "--graph", "nope"), "no graph named like 'nope'"),
    ]
    for args, *messages in cases:
        proc = _cli(*args, check=False)
        assert proc.returncode == 2, args
        assert proc.stderr.startswith("neuroncc-dump: error: ")
        assert all(m in proc.stderr for m in messages), proc.stderr
        assert "Traceback" not in proc.stderr
    proc = _cli("run", raises, "--dump-dir", tmp_path / "d", check=False)
    assert proc.returncode == 1
    assert "neuroncc-dump: the script exited with status 1" in proc.stderr
    assert "nothing dumped" in proc.stdout
