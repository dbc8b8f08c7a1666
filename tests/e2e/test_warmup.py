"""Warmup jobs as a user runs them: record a trial of a small HF llama script, warm an empty
cache in fresh processes, then the real run compiles nothing, at the trial's sizes and at the
sizes `expand` added. Bad input gets a message and exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuroncc.frontend import warmup
from neuroncc.frontend.recording import load_manifest
from neuroncc.runtime.disk_cache import CACHE_FORMAT

SCRIPT = '''
"""A small HF llama: a training step and an inference forward per sequence length given."""
import json, sys
import torch, transformers
import neuroncc

cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=256)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
compiled = torch.compile(model, backend="neuron", dynamic=True)
for seq in [int(a) for a in sys.argv[1:]]:
    ids = torch.randint(0, 128, (1, seq))
    model.train()
    compiled(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    with torch.no_grad():
        compiled(input_ids=ids)
s = neuroncc.stats()
print(json.dumps({k: s[k] for k in ("compiles", "cache_hits_disk", "fallback_nodes")}))
'''


# The console script pip installed beside this interpreter (the venv need not be on PATH).
WARMUP = str(Path(sys.executable).with_name("neuroncc-warmup"))


def _cli(*args, cache, check=True, **env):
    proc = subprocess.run(
        [WARMUP, *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "NEURONCC_CACHE_DIR": str(cache), **env},
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _script(path, *seqs, cache):
    proc = subprocess.run(
        [sys.executable, str(path), *map(str, seqs)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "NEURONCC_CACHE_DIR": str(cache)},
        timeout=600,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """The script recorded once at sequence length 7, with no persistent cache at all."""
    root = tmp_path_factory.mktemp("warmup")
    script = root / "train.py"
    script.write_text(SCRIPT)
    manifest = root / "graphs.jsonl"
    proc = _cli("record", manifest, script, 7, cache=root / "unused", NEURONCC_DISK_CACHE="0")
    # 2 Dynamo graphs; fwd, bwd and inference, and the 5 transposes that lay the inference
    # graph's weights out (Note [weight layout]: one per weight shape)
    assert "recorded 10 graph(s)" in proc.stdout
    assert not (root / "unused").exists()
    return script, manifest


def test_the_real_run_after_a_warmup_compiles_nothing(trial, tmp_path):
    script, manifest = trial
    cache = tmp_path / "cache"
    proc = _cli("compile", manifest, "--jobs", 2, cache=cache)
    assert "8 compiled, 0 already cached, 0 failed" in proc.stdout
    assert len(list(cache.glob(f"v{CACHE_FORMAT}/*/*.json"))) == 8
    run = _script(script, 7, cache=cache)
    assert run == {"compiles": 0, "cache_hits_disk": 8, "fallback_nodes": {}}
    again = _cli("compile", manifest, cache=cache)
    assert "0 compiled, 8 already cached" in again.stdout


def test_expand_precompiles_sizes_the_trial_did_not_reach(trial, tmp_path):
    script, manifest = trial
    expanded = tmp_path / "graphs.jsonl"
    expanded.write_bytes(manifest.read_bytes())
    cache = tmp_path / "cache"
    proc = _cli("expand", expanded, "--sizes", "7=12,16", cache=cache)
    assert "traced 4 new shape variant(s)" in proc.stdout  # 2 graphs x 2 sizes
    # the trial's 8, and fwd, bwd and inference at the two new sizes (the same weights)
    assert "14 compiled, 0 already cached, 0 failed" in proc.stdout
    assert _script(script, 12, 16, cache=cache)["compiles"] == 0


TRAINING = '''
"""Training steps of a small MLP (float inputs, nn.Parameters), one per batch size given;
argv[1] is torch.compile's dynamic ("None": Dynamo's default, or "True")."""
import json, sys
import torch
import neuroncc

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dynamic = {"None": None, "True": True}[sys.argv[1]]
compiled = torch.compile(model, backend="neuron", dynamic=dynamic)
for n in [int(a) for a in sys.argv[2:]]:
    x = torch.randn(n, 16)
    torch.nn.functional.mse_loss(compiled(x), x).backward()
    opt.step()
    opt.zero_grad()
s = neuroncc.stats()
print(json.dumps({k: s[k] for k in ("compiles", "cache_hits_disk", "fallback_nodes")}))
'''


@pytest.mark.parametrize(
    ("dynamic", "trial_sizes", "graph"),
    [
        ("None", [4, 6], "graph2"),  # Dynamo's default: the second size makes graph2 dynamic
        ("True", [6], "graph1"),  # the input's 16 is a size Dynamo specialised to a constant
    ],
)
def test_expand_precompiles_the_training_graphs_the_real_run_looks_up(
    tmp_path, dynamic, trial_sizes, graph
):
    """The expanded forward must save for the backward what the real run's does (a weight,
    not its transpose: the partitioner counts parameters as free to save), or no key
    matches."""
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    manifest = tmp_path / "graphs.jsonl"
    unused = tmp_path / "unused"
    _cli("record", manifest, script, dynamic, *trial_sizes, cache=unused, NEURONCC_DISK_CACHE="0")
    cache = tmp_path / "cache"
    proc = _cli("expand", manifest, "--sizes", "6=8,10", cache=cache)
    assert "traced 2 new shape variant(s)" in proc.stdout
    assert [e.name for e in load_manifest(manifest) if e.kind == "dynamo"] == [graph]
    # with Dynamo's default, 8 is the real run's static graph's size and 10 its dynamic
    # graph's: the static graph at 8 is the dynamic one specialised to 8, key for key
    run = _script(script, dynamic, 8, 10, cache=cache)
    assert run == {"compiles": 0, "cache_hits_disk": 4, "fallback_nodes": {}}


def test_shards_split_the_entries_between_machines(trial, tmp_path):
    _, manifest = trial
    cache = str(tmp_path / "cache")
    a = warmup.compile_manifest(manifest, jobs=1, shard=warmup.Shard(0, 2), cache_dir=cache)
    b = warmup.compile_manifest(manifest, jobs=1, shard=warmup.Shard(1, 2), cache_dir=cache)
    assert sorted(a.compiled + b.compiled) == sorted(
        e.name for e in load_manifest(manifest) if e.kind == "nir"
    )
    assert a.skipped == len(b.compiled) and b.skipped == len(a.compiled)


def die_the_first_time(entry, cache_dir):
    """A worker that is killed (as by the OOM killer) on its first entry."""
    marker = Path(cache_dir) / "died-once"
    if not marker.exists():
        marker.write_text("")
        os._exit(9)
    return warmup.compile_entry(entry, cache_dir)


def test_an_entry_whose_worker_dies_is_retried(trial, tmp_path):
    _, manifest = trial
    cache = tmp_path / "cache"
    cache.mkdir()
    summary = warmup.compile_manifest(
        manifest, jobs=2, cache_dir=str(cache), worker=die_the_first_time, progress=False
    )
    assert len(summary.compiled) == 8 and not summary.failed


def test_a_compile_that_fails_is_reported_and_not_cached(trial, tmp_path):
    _, manifest = trial
    broken = tmp_path / "broken.jsonl"
    lines = manifest.read_text().splitlines()
    nir = next(i for i, line in enumerate(lines) if '"kind":"nir"' in line)
    entry = json.loads(lines[nir])
    entry["ir"] = entry["ir"].replace("graph @main", "graph @main @@", 1)
    lines[nir] = json.dumps(entry)
    broken.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "cache"
    proc = _cli("compile", broken, cache=cache, check=False)
    assert proc.returncode == 1
    assert "7 compiled, 0 already cached, 1 failed" in proc.stdout
    assert f"failed {entry['name']}: WarmupError: its IR is not valid" in proc.stdout
    assert len(list(cache.glob(f"v{CACHE_FORMAT}/*/*.json"))) == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compile", "{tmp}/missing.jsonl"], "manifest {tmp}/missing.jsonl does not exist"),
        (["compile", "{tmp}/header.jsonl"], "header.jsonl:1 is not a neuroncc manifest header"),
        (
            ["compile", "{tmp}/entry.jsonl"],
            "entry.jsonl:2: malformed entry (nir.ir: Field required)",
        ),
        (["compile", "{tmp}/entry.jsonl", "--shard", "2/2"], "shard '2/2' is not i/n"),
        (["compile", "{tmp}/ok.jsonl", "--cache-dir", "{tmp}/file/c"], "is not writable"),
        (["record", "{tmp}/m.jsonl", "{tmp}/missing.py"], "script {tmp}/missing.py does not exist"),
        (["expand", "{tmp}/ok.jsonl", "--sizes", "7=a:b"], "is not TRIAL=START:STOP:STEP"),
        (["expand", "{tmp}/ok.jsonl", "--sizes", "7=8"], "records no graph with dynamic sizes"),
    ],
)
def test_bad_input_gets_a_message_and_status_2(tmp_path, capsys, args, message):
    (tmp_path / "header.jsonl").write_text('{"not": "a manifest"}\n')
    header = '{"neuroncc_manifest": 1}\n'
    (tmp_path / "entry.jsonl").write_text(
        header + '{"kind": "nir", "key": "k", "name": "g", "options": {}}\n'
    )
    (tmp_path / "ok.jsonl").write_text(header)
    (tmp_path / "file").write_text("")
    argv = [a.format(tmp=tmp_path) for a in args]
    assert warmup.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("neuroncc-warmup: error: ") and message.format(tmp=tmp_path) in err
    assert "Traceback" not in err


def test_a_script_that_raises_passes_its_status_on(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    proc = _cli("record", tmp_path / "m.jsonl", script, cache=tmp_path / "c", check=False)
    assert proc.returncode == 3
    assert "the script exited with status 3" in proc.stderr
    assert "recorded 0 graph(s)" in proc.stdout


def test_recording_a_python_callable_then_warming_a_new_cache(fresh, tmp_path):
    import torch

    import neuroncc
    from neuroncc.runtime.disk_cache import DiskCache

    manifest = tmp_path / "graphs.jsonl"
    x = torch.randn(8, 4)
    with neuroncc.record(manifest):
        torch.compile(lambda x: torch.softmax(x * 2, -1), backend="neuron")(x)
    (entry,) = load_manifest(manifest)
    cache = tmp_path / "cache"
    summary = warmup.compile_manifest(manifest, jobs=1, cache_dir=str(cache), progress=False)
    assert summary.compiled == [entry.name]
    # The warmed entry is under the very key the recorded run computed.
    assert [e.key for e in DiskCache(cache).entries()] == [entry.key]


def test_a_size_computed_from_another_is_computed_and_explained(fresh, tmp_path, capsys):
    """With dynamic=True, x[:, 1:] added to y makes x's size s + 1, s being y's: expand computes
    it from s, and tells a user who asks for x's size to ask for y's."""
    import torch

    import neuroncc
    from neuroncc.frontend.fx_serde import example_args, trial_sizes

    manifest = tmp_path / "graphs.jsonl"
    with neuroncc.record(manifest), torch.no_grad():
        f = torch.compile(lambda x, y: x[:, 1:] * 2 + y, backend="neuron", dynamic=True)
        f(torch.randn(3, 8), torch.randn(3, 7))
    (entry,) = [e for e in load_manifest(manifest) if e.kind == "dynamo"]
    trial = trial_sizes(entry.graph)
    (s,) = [symbol for symbol, v in trial.items() if v == 7]
    args = example_args(entry.graph, {**trial, s: 9})
    x, y = [a for a in args if isinstance(a, torch.Tensor)]
    assert (x.shape, y.shape) == ((3, 10), (3, 9))
    assert warmup.main(["expand", str(manifest), "--sizes", "8=10"]) == 2
    recorded = ", ".join(f"{entry.name}: {symbol}={v}" for symbol, v in trial.items())
    assert capsys.readouterr().err.splitlines() == [
        (
            f"  {entry.name}: the size that was 8 in the trial is not a size of its own but "
            f"{s} + 1, computed from {s} (7 in the trial): expand cannot set it directly; "
            "ask for --sizes 7=... instead"
        ),
        (
            "neuroncc-warmup: error: no recorded dynamic size was one of [8] in the trial; "
            f"the recorded ones: {recorded}"
        ),
    ]
