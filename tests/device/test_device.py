"""The `neuron` device (neuroncc/device): registered on `import torch`, eager ops compiled and
run on the simulator against CPU results, PyTorch's aliasing, device memory and its errors."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import neuroncc
from neuroncc.device import eager
from tests.e2e.test_hf import neuron_compile_config, small_flux, small_model

pytestmark = pytest.mark.filterwarnings("ignore:neuroncc runs")


def test_the_device_is_registered_by_import_torch_alone():
    code = textwrap.dedent(
        """
        import torch
        x = torch.randn(4, 4, device="neuron")
        y = (x @ x).cpu()
        assert torch.allclose(y, x.cpu() @ x.cpu(), atol=1e-5)
        assert x.is_neuron and torch.neuron.is_available() and torch.neuron.device_count() == 1
        assert torch.accelerator.current_accelerator().type == "neuron"
        import neuroncc
        s = neuroncc.stats()
        assert s["eager_executions"] == 1 and s["eager_device_seconds"] > 0, s
        """
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env=os.environ | {"PYTHONWARNINGS": "ignore"}
    )


def test_a_registration_that_cannot_happen_says_why_and_leaves_the_backend_working():
    code = textwrap.dedent(
        """
        import warnings, torch
        torch.utils.backend_registration._setup_privateuseone_for_python_backend("other")
        import neuroncc.device
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            neuroncc.device.autoload()
        assert "already the 'other' device" in neuroncc.device.unavailable()
        assert any("neuron device is unavailable" in str(x.message) for x in w)
        f = torch.compile(lambda a: a * 2 + 1, backend="neuron")
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 3.0))
        """
    )
    env = os.environ | {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def _both(fn, *tensors):
    """fn on CPU tensors and on their copies on the device, the device's results brought back."""
    want = fn(*tensors)
    got = fn(*(t.to("neuron") for t in tensors))
    return torch.utils._pytree.tree_map(
        lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got
    ), want


OPS = {
    "matmul": (lambda a, b: a @ b, [(24, 40), (40, 16)]),
    "add_mul": (lambda a, b: a * 2 + b, [(8, 33), (8, 33)]),
    "broadcast": (lambda a, b: a - b, [(8, 33), (33,)]),
    "softmax": (lambda a: torch.softmax(a, -1), [(6, 50)]),
    "sum": (lambda a: a.sum(0), [(12, 20)]),
    "layer_norm": (lambda a: torch.nn.functional.layer_norm(a, (20,)), [(12, 20)]),
    "gelu": (lambda a: torch.nn.functional.gelu(a), [(5, 64)]),
    "transposed": (lambda a: a.t() @ a, [(16, 8)]),
    "rmsnorm": (lambda a: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6), [(4, 96)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_eager_ops_equal_cpu(name):
    fn, shapes = OPS[name]
    torch.manual_seed(0)
    got, want = _both(fn, *(torch.randn(s) for s in shapes))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_an_op_compiles_once_per_signature_and_runs_on_the_simulator(fresh):
    a = torch.randn(16, 16, device="neuron")
    b = a * 3.0
    compiles = neuroncc.stats()["compiles"]
    for _ in range(3):
        c = a * 3.0
    s = neuroncc.stats()
    assert s["compiles"] == compiles, "a second call of one signature compiled again"
    assert s["eager_executions"] >= 4 and s["eager_device_seconds"] > 0, s
    assert torch.equal(b.cpu(), c.cpu())
    d = torch.randn(16, 17, device="neuron") * 3.0  # another shape: a compile
    assert neuroncc.stats()["compiles"] > compiles and d.shape == (16, 17)


def test_in_place_and_out_ops_write_their_argument():
    a = torch.randn(6, 7)
    x = a.to("neuron")
    y = x.add_(1.0)
    assert y is x
    out = torch.empty(0, device="neuron")
    z = torch.mul(x, 2.0, out=out)
    assert z is out and out.shape == (6, 7)
    torch.testing.assert_close(out.cpu(), (a + 1) * 2)


def test_views_share_the_device_bytes():
    x = torch.zeros(4, 6, device="neuron")
    v = x[1:3, ::2]
    v.fill_(5.0)
    t = x.t()
    assert t.data_ptr() == x.data_ptr() and v.untyped_storage().data_ptr() == x.data_ptr()
    want = torch.zeros(4, 6)
    want[1:3, ::2] = 5.0
    assert torch.equal(x.cpu(), want) and torch.equal(t.cpu(), want.t())


@given(
    steps=st.lists(
        st.sampled_from(["slice", "transpose", "add_", "mul_", "view", "select", "fill_"]),
        min_size=1,
        max_size=6,
    )
)
def test_chains_of_views_and_in_place_ops_alias_as_on_cpu(steps):
    base_cpu = torch.arange(48.0).reshape(6, 8)
    base_dev = base_cpu.to("neuron")
    cur = [base_cpu, base_dev]
    for step in steps:
        for k, t in enumerate(cur):
            if step == "slice" and t.dim() == 2 and t.shape[0] > 1:
                t = t[1:]
            elif step == "transpose" and t.dim() == 2:
                t = t.t()
            elif step == "select" and t.dim() == 2:
                t = t[0]
            elif step == "view" and t.is_contiguous():
                t = t.view(-1)
            elif step == "add_":
                t.add_(1.0)
            elif step == "mul_":
                t.mul_(2.0)
            elif step == "fill_":
                t.fill_(3.0)
            cur[k] = t
    assert torch.equal(cur[1].cpu(), cur[0])
    assert torch.equal(base_dev.cpu(), base_cpu)


def test_mixing_devices_raises_pytorchs_error():
    x = torch.ones(3, 3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3, 3)
    assert torch.equal((x + torch.tensor(1.0)).cpu(), torch.full((3, 3), 2.0))  # a CPU scalar


def test_device_memory_is_counted_and_an_allocation_past_hbm_is_refused():
    before = torch.neuron.memory_allocated()
    x = torch.empty(1024, 256, device="neuron")
    assert torch.neuron.memory_allocated() == before + 2**20
    with pytest.raises(torch.OutOfMemoryError, match="12.00 GiB of HBM"):
        torch.empty(2**34, device="neuron")
    assert torch.neuron.memory_allocated() == before + 2**20  # nothing lost
    free, total = torch.neuron.mem_get_info()
    assert total == 12 * 2**30 and free == total - torch.neuron.memory_allocated()
    del x
    assert torch.neuron.memory_allocated() == before
    assert (torch.ones(2, device="neuron") + 1).cpu().tolist() == [2.0, 2.0]  # still usable


def test_random_ops_equal_cpu_under_a_seed():
    def draw(device):
        torch.manual_seed(3)
        x = torch.randn(5, 7, device=device)
        return x, torch.nn.functional.dropout(x, 0.5, training=True)  # (output, mask) inside

    want, got = draw("cpu"), draw("neuron")
    for w, g in zip(want, got, strict=True):
        assert g.device.type == "neuron" and torch.equal(g.cpu(), w)


def test_data_dependent_ops_run_on_the_host_and_are_counted(fresh):
    x = torch.tensor([0.0, 2.0, 0.0, 3.0], device="neuron")
    idx = torch.nonzero(x)
    assert idx.device.type == "neuron" and idx.cpu().flatten().tolist() == [1, 3]
    assert "aten.nonzero.default" in neuroncc.stats()["fallback_nodes"]
    assert eager._CACHE  # the signatures seen (this one as a host op)


def test_torch_compile_on_device_tensors_returns_device_tensors(fresh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    want = model(x)
    model.to("neuron")
    got = torch.compile(model, backend="neuron")(x.to("neuron"))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    assert neuroncc.stats()["executions"] == 1  # the compiled graph, not eager ops


def test_a_hugging_face_model_generates_the_cpu_tokens_on_the_device():
    model = small_model("llama").eval()
    ids = torch.randint(1, 256, (1, 8))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
        model.to("neuron")
        got = model.generate(ids.to("neuron"), max_new_tokens=4, do_sample=False)
    assert got.device.type == "neuron" and torch.equal(got.cpu(), want)


def test_from_pretrained_onto_the_device_and_compiled_generate(tmp_path, fresh):
    """device_map="neuron" loads the weights onto the device; generate with the static cache
    and compile_config compiles the decode step over device tensors."""
    from transformers import AutoModelForCausalLM, CompileConfig

    model = small_model("llama").eval()
    model.save_pretrained(tmp_path)
    ids = torch.randint(1, 256, (1, 8))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
        dev = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="neuron")
        assert all(p.device.type == "neuron" for p in dev.parameters())
        got = dev.generate(
            ids.to("neuron"),
            max_new_tokens=4,
            do_sample=False,
            cache_implementation="static",
            compile_config=CompileConfig(backend="neuron", fullgraph=False),
        )
    assert torch.equal(got.cpu(), want)
    s = neuroncc.stats()
    assert s["executions"] > 0 and s["eager_executions"] > 0 and not s["compiler_errors"], s


def test_events_time_device_work_on_the_simulated_clock(fresh):
    from neuroncc.device import clock

    x = torch.randn(64, 64, device="neuron")
    y = x @ x  # compiled before timing
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    before = neuroncc.stats()
    start.record()
    for _ in range(3):
        y = x @ x
    end.record()
    torch.neuron.synchronize()
    after = neuroncc.stats()
    device = after["eager_device_seconds"] - before["eager_device_seconds"]
    ops = after["eager_executions"] - before["eager_executions"]
    assert ops == 3 and device > 0
    want_ms = (device * 1e9 + ops * clock.LAUNCH_NS) * 1e-6
    assert start.elapsed_time(end) == pytest.approx(want_ms)
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.neuron.Event().elapsed_time(end)
    assert y.shape == (64, 64)


def test_the_main_job_runs_on_the_device(fresh, capsys, monkeypatch):
    from neuroncc.__main__ import main

    monkeypatch.setenv("NEURONCC_TARGET", "trn2")  # main sets it for the device: restored after

    assert main(["--device", "neuron", "--layers", "1", "--seq", "16"]) == 0
    out = capsys.readouterr().out
    assert "eager on the neuron device:" in out and "0 ops on the host" in out and "MATCH" in out


def test_a_diffusers_transformer_on_the_device_eager_and_regionally_compiled(fresh):
    model, inputs = small_flux(1)
    on_device = {k: v.to("neuron") for k, v in inputs.items()}
    with torch.no_grad():
        want = model(**inputs).sample
        model.to("neuron")
        eager_out = model(**on_device).sample
        model.compile_repeated_blocks(backend="neuron")
        compiled_out = model(**on_device).sample
    for got in (eager_out, compiled_out):
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    s = neuroncc.stats()
    assert s["executions"] > 0 and s["eager_executions"] > 0 and s["fallback_nodes"] == {}, s


def test_autocast_on_the_device_follows_cudas_op_lists():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    want = torch.nn.functional.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
    lin.to("neuron")
    xd = x.to("neuron").requires_grad_()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = lin(xd)  # lower precision: bf16
        s = torch.softmax(y, -1)  # fp32
        z = y + 1  # not listed: as given
    assert (y.dtype, s.dtype, z.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    torch.testing.assert_close(y.cpu(), want)
    s.sum().backward()  # backward through the casts
    assert xd.grad.dtype == torch.float32 and xd.grad.device.type == "neuron"
    assert lin(xd).dtype == torch.float32  # outside the region


def test_deepcopy_save_load_and_resize_keep_device_tensors(tmp_path):
    """deepcopy, torch.load and storage.clone() make storages with UntypedStorage(n,
    device="neuron"): PyTorch has no allocator for a Python backend (it crashed the process),
    so the device makes them."""
    import copy

    x = torch.arange(6.0).reshape(2, 3).to("neuron")
    y = copy.deepcopy(x)
    assert y.device.type == "neuron" and y.data_ptr() != x.data_ptr()
    assert torch.equal(y.cpu(), x.cpu())
    assert torch.equal(
        torch.frombuffer(bytearray(x.untyped_storage().clone().cpu()), dtype=torch.float32),
        torch.arange(6.0),
    )
    torch.save({"w": x}, tmp_path / "w.pt")
    for where, device in (("neuron", "neuron"), ("cpu", "cpu"), (None, "neuron")):
        w = torch.load(tmp_path / "w.pt", map_location=where)["w"]
        assert w.device.type == device and torch.equal(w.cpu(), x.cpu())
    r = torch.ones(2, device="neuron")
    r.resize_(5)
    assert r.shape == (5,) and r[:2].cpu().tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="UntypedStorage"):
        torch.UntypedStorage([1, 2], device="neuron")


def test_timing_only_times_device_ops_without_simulating_them(fresh, monkeypatch):
    """NEURONCC_TIMING_ONLY=1: an op compiled from then on is timed, its result computed by
    PyTorch on the host (a shape no other test uses, so that it compiles here)."""
    monkeypatch.setenv("NEURONCC_TIMING_ONLY", "1")
    a, b = torch.randn(37, 41), torch.randn(41, 43)
    got = a.to("neuron") @ b.to("neuron")
    torch.testing.assert_close(got.cpu(), a @ b)
    s = neuroncc.stats()
    assert s["timing_only_executions"] == 1 and s["eager_device_seconds"] > 0, s


def test_timing_only_ops_are_called_on_the_host_views(fresh, monkeypatch):
    """Note [timing_only eager ops]: under timing_only an op is called itself on the host
    views (in place, lists of tensors), except an `out=` it would resize; every call timed."""
    from neuroncc.device import eager

    monkeypatch.setenv("NEURONCC_TIMING_ONLY", "1")
    x, y = torch.randn(37, 29), torch.randn(37, 29)
    dx, dy = x.to("neuron"), y.to("neuron")
    torch.testing.assert_close(torch.cat([dx, dy], 1).cpu(), torch.cat([x, y], 1))
    assert dx.add_(dy) is dx
    torch.testing.assert_close(dx.cpu(), x + y)
    out = torch.empty(0, device="neuron")
    assert torch.mul(dy, 3.0, out=out) is out
    torch.testing.assert_close(out.cpu(), y * 3.0)
    assert neuroncc.stats()["timing_only_executions"] == 3
    here = [
        (k, c) for k, c in eager._CACHE.items() if (torch.Size([37, 29]), torch.float32, False) in k
    ]
    direct = {str(k[0]): c.timed is not None for k, c in here}
    assert direct["aten.cat.default"] and direct["aten.add_.Tensor"], direct
    assert not direct["aten.mul.out"], direct  # its `out=` is resized: the graph runner


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "gpt2"])
def test_real_architectures_generate_the_cpu_tokens_on_the_device(arch, fresh):
    """Of the real-models tests' architectures (all ten pass: see the closing note of issue
    21), three: greedy generate with the static cache, eagerly on the device and with the
    decode step compiled over device tensors."""
    model = small_model(arch).eval()
    ids = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        want = model.generate(ids, **kwargs)
        model.to("neuron")
        eager_tokens = model.generate(ids.to("neuron"), **kwargs)
        compiled = model.generate(
            ids.to("neuron"), compile_config=neuron_compile_config(), **kwargs
        )
    assert eager_tokens.cpu().tolist() == want.tolist() == compiled.cpu().tolist()
    s = neuroncc.stats()
    # generate's stopping criteria AND int64 flags; the compiler's bitwise ops take bool only
    assert set(s["fallback_nodes"]) <= {"aten.bitwise_and.Tensor"}, s
    assert s["executions"] > 0 and s["eager_executions"] > 0 and not s["compiler_errors"], s


def test_cpu_code_that_pins_memory_still_runs_with_the_device_registered():
    """Pinning goes through the accelerator's C++ hooks, which a Python backend cannot give:
    once `neuron` is the accelerator, pin_memory() is a no-op for it (Trainer and DataLoader
    defaults pin)."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(8.0).reshape(4, 2))
    batches = [b for (b,) in DataLoader(data, batch_size=2, pin_memory=True)]
    assert torch.equal(torch.cat(batches), torch.arange(8.0).reshape(4, 2))
    x = torch.ones(3)
    assert x.pin_memory() is x and not x.is_pinned()


def test_a_neuron_generator_is_a_clear_error_and_a_cpu_one_works():
    """torch.Generator("neuron") needs C++ hooks a Python backend cannot give: it says so and
    what to use; CPU generators are still torch.Generator and drive random ops on the device
    as on the CPU."""
    for device in ("neuron", "neuron:0", torch.device("neuron")):
        with pytest.raises(RuntimeError, match=r"not supported.*torch.Generator\(\)"):
            torch.Generator(device)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.Generator(device="neuron")
    g = torch.Generator().manual_seed(7)
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    on_device = torch.randn(5, device="neuron", generator=g)
    assert torch.equal(on_device.cpu(), torch.randn(5, generator=torch.Generator().manual_seed(7)))


def test_printing_a_device_tensor_runs_nothing_on_the_device(recwarn):
    """Formatting a tensor takes float64 comparisons and slices: a device tensor is copied to
    the host first (as PyTorch does for XLA), so printing warns of no fallback."""
    x = torch.linspace(-2, 2, 300, device="neuron").reshape(3, 100)
    before = neuroncc.stats()["eager_executions"]
    text = repr(x)
    assert text == repr(x.cpu())[:-1] + ", device='neuron:0')"
    assert neuroncc.stats()["eager_executions"] == before
    assert not [w for w in recwarn if "eagerly" in str(w.message)]


def test_torch_accelerator_answers_for_the_device():
    """torch.accelerator's synchronize and memory functions reach C++ hooks a Python backend
    cannot give (they raised or asserted): torch.neuron answers them."""
    x = torch.ones(256, device="neuron")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated() >= 1024
    free, total = torch.accelerator.get_memory_info()
    assert total == 12 * 2**30 and free == total - torch.neuron.memory_allocated()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] >= 1024
    torch.accelerator.empty_cache()
    assert x.device.type == "neuron"
