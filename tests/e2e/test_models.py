"""End to end: small models through torch.compile(backend="neuron"), compared with eager."""

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import neuroncc
from neuroncc.codegen.executable.program import FORMAT_VERSION, Executable
from neuroncc.errors import OptionsError
from neuroncc.examples import GPTConfig, TinyGPT, example_batch
from neuroncc.options import CompileOptions
from neuroncc.runtime import executor
from neuroncc.runtime.cache import GRAPH_CACHE
from neuroncc.runtime.stats import STATS

TOL = {"rtol": 1e-4, "atol": 1e-5}
SMALL = GPTConfig(vocab=64, seq=8, dim=32, heads=4, layers=1)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_mlp_forward_and_backward(fresh):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)
    )
    x = torch.randn(16, 20)
    expected = model(x)
    expected.square().mean().backward()
    want = _grads(model)
    model.zero_grad()
    got = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(got, expected, **TOL)
    got.square().mean().backward()
    for name, g in _grads(model).items():
        torch.testing.assert_close(g, want[name], **TOL, msg=name)
    s = neuroncc.stats()
    assert s["compiles"] == 2 and s["executions"] == 2 and s["instructions"] > 0
    assert s["device_seconds"] > 0 and s["hbm_bytes"] > 0


def _tinygpt_against_eager(dtype, logits_tol, loss_tol, grad_tol):
    torch.manual_seed(0)
    model = TinyGPT(SMALL).to(dtype)
    idx, targets = example_batch(SMALL)
    ref_logits, ref_loss = model(idx, targets)
    ref_loss.backward()
    want = _grads(model)
    model.zero_grad()
    logits, loss = torch.compile(model, backend="neuron")(idx, targets)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits, ref_logits, **logits_tol)
    torch.testing.assert_close(loss, ref_loss, **loss_tol)
    loss.backward()
    for name, g in _grads(model).items():
        torch.testing.assert_close(g, want[name], **grad_tol, msg=name)


def test_transformer_block_forward_and_backward(fresh):
    """Attention + MLP + LayerNorm, embeddings and cross-entropy: logits, loss and all grads."""
    _tinygpt_against_eager(torch.float32, TOL, TOL, TOL)


def test_five_sgd_steps_match_eager(fresh):
    torch.manual_seed(0)
    eager = TinyGPT(SMALL)
    compiled_model = TinyGPT(SMALL)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="neuron")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.5)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.5)
    losses_e, losses_c = [], []
    for step in range(5):
        idx, targets = example_batch(SMALL, seed=step)
        for model, opt, losses in ((eager, opt_e, losses_e), (compiled, opt_c, losses_c)):
            opt.zero_grad()
            _, loss = model(idx, targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses_e[-1] < losses_e[0]  # it is really training
    assert losses_c == pytest.approx(losses_e, rel=1e-4)
    for (n, pe), pc in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(pc, pe, rtol=1e-3, atol=1e-5, msg=n)
    assert neuroncc.stats()["compiles"] == 2  # one forward, one backward graph for all steps


def test_same_shapes_never_compile_twice(fresh):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    f = torch.compile(lin, backend="neuron")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), lin(x), **TOL)
    s = neuroncc.stats()
    # The graph, and the transpose that lays the weight out once (Note [weight layout]).
    assert (s["dynamo_graphs"], s["compiles"], s["executions"]) == (1, 2, 4)
    assert s["weight_layouts"] == 1


def _block_a(x, w):
    return torch.tanh(x @ w) * 2


def _block_b(x, w):  # another function, so Dynamo traces it anew; the same graph for neuroncc
    return torch.tanh(x @ w) * 2


def test_identical_graphs_share_one_compile(fresh):
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(
        torch.compile(_block_a, backend="neuron")(x, w1), _block_a(x, w1), **TOL
    )
    torch.testing.assert_close(
        torch.compile(_block_b, backend="neuron")(x, w2), _block_b(x, w2), **TOL
    )
    s = neuroncc.stats()
    assert (s["dynamo_graphs"], s["compiles"], s["cache_hits_memory"]) == (2, 1, 1)


def test_options_and_environment(fresh, monkeypatch):
    x = torch.randn(3, 3)
    with pytest.raises(
        Exception, match=r"unknown neuroncc option\(s\) \['tile'\]; allowed: target, opt_level"
    ):
        torch.compile(torch.sin, backend="neuron", options={"tile": 4})(x)
    torch._dynamo.reset()
    with pytest.raises(
        Exception, match="option target='trn9': Input should be 'trn1', 'trn2' or 'trn3'"
    ):
        torch.compile(torch.cos, backend="neuron", options={"target": "trn9"})(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option auto_cast='bf16': Input should be 'matmul'"):
        torch.compile(torch.tan, backend="neuron", options={"auto_cast": "bf16"})(x)
    torch._dynamo.reset()
    monkeypatch.setenv("NEURONCC_TARGET", "trn1")
    monkeypatch.setenv("NEURONCC_OPT_LEVEL", "0")
    torch.testing.assert_close(torch.compile(torch.exp, backend="neuron")(x), torch.exp(x))
    torch._dynamo.reset()
    torch.compile(torch.exp, backend="neuron", options={"target": "trn3"})(x)
    targets = sorted(c.exe.target for c in GRAPH_CACHE._items.values())
    assert targets == ["trn1", "trn3"]  # environment read, explicit option wins


def test_cache_options_from_the_environment():
    env = {"NEURONCC_DISK_CACHE": "0", "NEURONCC_CACHE_MAX_BYTES": "4096"}
    opts = CompileOptions.from_user({}, env)
    assert (opts.disk_cache, opts.cache_max_bytes) == (False, 4096)
    assert opts.cache_key() == CompileOptions.from_user({}, {}).cache_key()  # same executables
    with pytest.raises(OptionsError, match="cache_max_bytes=-1: Input should be greater than 0"):
        CompileOptions.from_user({"cache_max_bytes": -1}, {})


def test_mode_strings_are_tolerated(fresh):
    with pytest.warns(UserWarning, match="ignores torch.compile mode='reduce-overhead'"):
        torch.compile(torch.sin, backend="neuron", mode="reduce-overhead")(torch.ones(2))


def _bessel_between(x):
    y = torch.sin(x) * 3
    return torch.special.bessel_j0(y).exp() + 1


@pytest.mark.expect_fallback("aten.special_bessel_j0.default")
def test_unsupported_op_runs_eagerly_between_compiled_regions(fresh):
    x = torch.randn(4, 6)
    with pytest.warns(
        UserWarning,
        match=r"neuroncc runs aten\.special_bessel_j0\.default eagerly in PyTorch: no lowering for op",
    ):
        got = torch.compile(_bessel_between, backend="neuron")(x)
    torch.testing.assert_close(got, _bessel_between(x), **TOL)
    s = neuroncc.stats()
    assert s["fallback_nodes"] == {"aten.special_bessel_j0.default": 1}
    assert s["compiles"] == 2 and s["executions"] == 2  # the regions before and after bessel_j0


@pytest.mark.compiles_nothing("fallback off: the unsupported op is an error")
def test_fallback_off_names_the_op(fresh):
    with pytest.raises(
        Exception, match=r"uses ops neuroncc cannot compile: \['aten\.special_bessel_j0\.default'\]"
    ):
        torch.compile(_bessel_between, backend="neuron", options={"fallback": False})(
            torch.randn(5)
        )


@pytest.mark.compiles_nothing("the graph does not fit HBM")
def test_tensors_too_large_for_hbm_are_an_error_with_sizes(fresh):
    # The 32 GiB intermediate exists only as a fake tensor at compile time.
    f = torch.compile(lambda x: (x.expand(2**31, 4) * 2).sum(0), backend="neuron")
    with pytest.raises(
        Exception,
        match=r"tensors do not fit in HBM: \d+\.\d\d GiB needed .* value %\d+: 32\.00 GiB\), trn2 has 12 GiB",
    ):
        f(torch.ones(1, 4))


def _reads_a_little(x):
    return x[0, :8] * 2


def test_an_estimate_may_need_more_hbm_than_the_core_has(fresh):
    """Note [estimates past the core's HBM]: timing_only times the graph, warns once and lists
    what it needs; executing the same cache entry later is still a CapacityError."""
    x = torch.empty(7, 2**29, device="meta")  # 14 GiB
    estimate = torch.compile(_reads_a_little, backend="neuron", options={"timing_only": True})
    with pytest.warns(
        UserWarning,
        match=r"needs 1\d\.\d\d GiB \(inputs 14\.00, .*the largest: in0 .* timed as if it fit",
    ):
        assert estimate(x).shape == (8,)
    stats = neuroncc.stats()
    ((graph, needed),) = stats["hbm_over_capacity"].items()
    assert needed > 14 * 2**30 and stats["timing_only_executions"] == 1
    assert stats["graphs"][graph]["hbm_needed_bytes"] == needed
    assert stats["graphs"][graph]["device_seconds"] > 0
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"tensors do not fit in HBM: \w+ needs 1\d\.\d\d GiB"):
        torch.compile(_reads_a_little, backend="neuron")(x)
    assert neuroncc.stats()["cache_hits_memory"] == 1


@pytest.mark.expect_compiler_errors("program")
def test_compiler_failure_falls_back_for_that_graph(fresh, monkeypatch, private_disk_cache):
    from neuroncc.errors import CodegenError
    from neuroncc.frontend import compile

    def broken(g, target, **options):
        raise CodegenError("emitting %3 = exp %2 : f32[3]: injected failure")

    monkeypatch.setattr(compile, "emit_graph", broken)
    x = torch.randn(3)
    with pytest.warns(
        UserWarning,
        match=r"internal compiler error in graph .*: \(stage program\): CodegenError: emitting",
    ):
        got = torch.compile(lambda x: torch.exp(x) + 1, backend="neuron")(x)
    torch.testing.assert_close(got, torch.exp(x) + 1)
    assert neuroncc.stats()["compiler_errors"] == {"program": 1}
    assert neuroncc.stats()["fallback_nodes"] == {}  # only ops declined for want of a lowering
    torch._dynamo.reset()
    with pytest.raises(Exception, match="injected failure"):
        torch.compile(lambda x: torch.exp(x) * 2, backend="neuron", options={"fallback": False})(x)
    assert not list(private_disk_cache.glob("v*/*/*.json"))  # a failure is never cached


class _RecordAten(TorchDispatchMode):
    """The ATen ops that run, and those that take a tensor sharing memory with one of
    `watched` (the model's tensors handed to an executable)."""

    def __init__(self):
        super().__init__()
        self.ops, self.on_watched, self.watched = set(), set(), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.add(name)
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.watched:
                self.on_watched.add(name)
        return func(*args, **(kwargs or {}))


# Handing a tensor's memory to numpy and back (detach/contiguous/view: torch -> numpy;
# lift_fresh: torch.from_numpy wrapping a result).
HAND_OVER = {"detach", "contiguous", "clone", "view", "alias", "lift_fresh"}
# TensorE's products on zero-copy views of the simulator's memories (Note [torch on simulator
# memory] in runtime/semantics.py): bf16 bits as a tensor, widened, transposed, multiplied.
SIMULATOR_TORCH = {"view", "_to_copy", "permute", "t", "mm", "addmm"}


def test_compiled_path_computes_nothing_with_aten(fresh, monkeypatch):
    """Results come from the simulator: while an executable runs, the model's tensors are only
    handed to numpy and back; torch computes only TensorE's products, on the simulator's own
    memory."""
    recorder = _RecordAten()
    run = executor.CompiledExecutable.run

    def recorded_run(self, args):
        recorder.watched = {a.untyped_storage().data_ptr() for a in args if torch.is_tensor(a)}
        with recorder:
            return run(self, args)

    monkeypatch.setattr(executor.CompiledExecutable, "run", recorded_run)
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    idx, targets = example_batch(SMALL)
    _, loss = torch.compile(model, backend="neuron")(idx, targets)
    loss.backward()
    assert neuroncc.stats()["executions"] == 2
    assert recorder.on_watched <= HAND_OVER, recorder.on_watched
    assert recorder.ops <= HAND_OVER | SIMULATOR_TORCH, recorder.ops
    assert "mm" in recorder.ops or "addmm" in recorder.ops  # the check sees the products


def test_dump_dir_writes_every_stage(fresh, tmp_path):
    f = torch.compile(
        lambda x: F.gelu(x @ x.T).sum(-1), backend="neuron", options={"dump_dir": str(tmp_path)}
    )
    f(torch.randn(4, 4))
    (folder,) = tmp_path.iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "00-fx.txt",
        "01-nir.txt",
        "02-simplify.txt",
        "03-fuse.txt",
        "04-layout.txt",
        "05-tile.txt",
        "06-schedule.txt",
        "07-plan.txt",
        "08-program.txt",
        "graph.json",
        "program.json",
    ]
    assert "gelu" in (folder / "01-nir.txt").read_text()
    exe = Executable.from_json((folder / "program.json").read_text())
    assert exe.target == "trn2" and json.loads(exe.to_json())["version"] == FORMAT_VERSION
    meta = json.loads((folder / "graph.json").read_text())
    assert meta["inputs"] == ["f32[4,4]"] and meta["compile_seconds"] > 0
    # A graph found in the cache is dumped too, with the same stages.
    torch._dynamo.reset()
    again = tmp_path / "again"
    torch.compile(
        lambda x: F.gelu(x @ x.T).sum(-1), backend="neuron", options={"dump_dir": str(again)}
    )(torch.randn(4, 4))
    (hit,) = again.iterdir()
    assert sorted(p.name for p in hit.iterdir()) == names
    assert json.loads((hit / "graph.json").read_text())["cache_hit"] is True
    body = [(d / "03-fuse.txt").read_text().split("\n", 1)[1] for d in (hit, folder)]
    assert body[0] == body[1]  # the same graph, but for its name


def test_bf16_model_runs(fresh):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        got = torch.compile(model, backend="neuron")(x)
        want = model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_batch_norm_training_updates_running_stats(fresh):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    twin = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(16, 6)
    want = twin(x)
    want.sum().backward()
    got = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(got, want, **TOL)
    got.sum().backward()
    bn, bn_twin = model[1], twin[1]
    torch.testing.assert_close(bn.running_mean, bn_twin.running_mean, **TOL)  # input mutation
    torch.testing.assert_close(bn.running_var, bn_twin.running_var, **TOL)
    torch.testing.assert_close(model[0].weight.grad, twin[0].weight.grad, **TOL)
    assert neuroncc.stats()["fallback_nodes"] == {}


def test_bf16_transformer_forward_and_backward(fresh):
    # Both sides round every op's result to bf16; matmuls accumulate in fp32 (PSUM on the
    # device, fp32 accumulation in PyTorch's CPU kernels), so they differ by a few bf16 ulps.
    _tinygpt_against_eager(
        torch.bfloat16,
        {"rtol": 2e-2, "atol": 2e-2},
        {"rtol": 1e-2, "atol": 1e-2},
        {"rtol": 5e-2, "atol": 5e-3},
    )


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args, code] if code else [sys.executable, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_backend_entry_point_works_without_importing_neuroncc():
    """`import torch` autoloads the `neuron` device (neuroncc.device) but not the compiler,
    which the backend's entry point brings in on first use."""
    code = (
        "import sys, torch\n"
        "assert 'neuroncc.frontend' not in sys.modules and 'neuroncc.options' not in sys.modules\n"
        "f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend='neuron')\n"
        "print(f(torch.tensor([-1.0, 0.5])).tolist(), 'neuroncc.frontend' in sys.modules)\n"
    )
    res = _python(code, "-c")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[1.0, 2.0] True"


def test_main_job():
    res = subprocess.run(
        [sys.executable, "-m", "neuroncc", "--layers", "1", "--seq", "16"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "-> MATCH" in res.stdout
    assert "forward: simulated device time" in res.stdout and "TensorE" in res.stdout


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_trains_on_cpu_and_on_meta(fresh, reduction):
    """Note [cross entropy traced]: the loss and its gradients equal eager's, ignored targets
    and all; on meta (an estimate) the backward holds the weight's gradient, where PyTorch's
    trace of F.cross_entropy there gave a backward with no gradient at all."""
    torch.manual_seed(0)
    head = nn.Linear(32, 300)
    x, labels = torch.randn(20, 32), torch.randint(0, 300, (20,))
    labels[::3] = -100

    def step(head, x, labels):
        return F.cross_entropy(head(x), labels, reduction=reduction).sum()

    got = torch.compile(step, backend="neuron", options={"disk_cache": False})(head, x, labels)
    got.backward()
    want_head = copy.deepcopy(head)
    want_head.zero_grad()
    step(want_head, x, labels).backward()
    torch.testing.assert_close(got, step(want_head, x, labels), **TOL)
    torch.testing.assert_close(head.weight.grad, want_head.weight.grad, **TOL)
    torch._dynamo.reset()
    neuroncc.reset_stats()
    meta = nn.Linear(32, 300, device="meta")
    opts = {"timing_only": True, "disk_cache": False}
    args = (x.to("meta"), labels.to("meta"))
    torch.compile(step, backend="neuron", options=opts)(meta, *args).backward()
    graphs = neuroncc.stats()["graphs"]
    backward = [g for name, g in graphs.items() if name.endswith("_backward")]
    assert backward and all(g["device_seconds"] > 0 for g in backward)


def test_where_with_a_scalar_trains_on_meta(fresh):
    """Note [where with a scalar traced]: torch.where with a Python scalar beside x gives x its
    gradient on meta as on CPU (PyTorch's trace on meta returned none: a backward of 0 s), and
    on CPU the results equal eager's."""

    def f(x):
        return torch.where(x > 0, x * 2, 0.0).sum() + torch.where(x > 1, 1.5, x).sum()

    times = {}
    for device in ("cpu", "meta"):
        torch._dynamo.reset()
        neuroncc.reset_stats()
        x = torch.randn(64, 64, device=device, requires_grad=True)
        opts = {"disk_cache": False, "timing_only": device == "meta"}
        got = torch.compile(f, backend="neuron", options=opts)(x)
        got.backward()
        if device == "cpu":
            want = x.detach().clone().requires_grad_()
            torch.testing.assert_close(got, f(want), **TOL)
            f(want).backward()
            torch.testing.assert_close(x.grad, want.grad, **TOL)
        graphs = neuroncc.stats()["graphs"]
        times[device] = [g["device_seconds"] for name, g in graphs.items() if "backward" in name]
    assert times["meta"] == times["cpu"] and all(t > 0 for t in times["meta"]), times


def test_grouped_query_key_gradient_is_a_batched_sum(fresh):
    """A key head shared by 4 query heads (transformers' repeat_kv) gets the sum of their
    gradients: a reduction over a middle axis, made a batched matmul with ones (simplify's
    _column_sum), equal to eager's; no transpose is left in the backward."""

    def f(k, q):
        shared = k[:, :, None].expand(1, 2, 4, 256, 64).reshape(1, 8, 256, 64)
        return (shared * q).sum()

    k = torch.randn(1, 2, 256, 64, requires_grad=True)
    q = torch.randn(1, 8, 256, 64)
    got = torch.compile(f, backend="neuron", options={"disk_cache": False})(k, q)
    got.backward()
    want = k.detach().clone().requires_grad_()
    f(want, q).backward()
    torch.testing.assert_close(k.grad, want.grad, **TOL)
    (backward,) = [c.exe for name, c in STATS.executed().items() if "backward" in name]
    kernels = [k.name for k in backward.kernels]
    assert any(k.startswith("matmul") for k in kernels)
    assert not any(k.startswith("transpose") for k in kernels), kernels
