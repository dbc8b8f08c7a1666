"""Kernel reuse (Note [kernel reuse]): a kernel identical to two before it is placed from its
template, and the executable is the one emitting every kernel gives, bit for bit."""

import pytest
import torch
from torch import nn

import neuroncc
from neuroncc.codegen import lower
from neuroncc.codegen.executable import loops
from neuroncc.codegen.kernels import reuse
from neuroncc.frontend import compile as compile_module
from neuroncc.frontend.weight_layout import LAID_OUT
from neuroncc.runtime.cache import GRAPH_CACHE


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _stack(layers: int, d: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block(d) for _ in range(layers)))


@pytest.fixture
def both_ways(monkeypatch):
    """Every graph emitted with reuse (templates trusted, and checked) and without: the
    executables must be equal."""
    compared = []

    def emit_graph(g, target, **kw):
        emitted = lower.emit_graph(g, target, reuse=False)
        for check in (False, True):
            placed = lower.emit_graph(g, target, check_reuse=check)
            assert placed == emitted, f"{g.name}: reuse (check_reuse={check}) changed it"
        compared.append((g.name, emitted))
        return emitted

    monkeypatch.setattr(compile_module, "emit_graph", emit_graph)
    return compared


@pytest.mark.parametrize("short_loops", [False, True], ids=["", "short-loops"])
@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_reused_kernels_give_the_executable_emitting_gives(
    fresh, both_ways, train, short_loops, monkeypatch
):
    """With short loops, the replayed kernels are several calls each, whose waits among
    themselves come from the template and across kernels from the kernel's footprint."""
    if short_loops:
        monkeypatch.setattr(loops, "MIN_LOOP", 2)
    model = _stack(6)
    x = torch.randn(2, 256 if short_loops else 16, 64, requires_grad=train)
    compiled = torch.compile(model, backend="neuron", options={"disk_cache": False})
    with torch.set_grad_enabled(train):
        got, want = compiled(x), model(x)
        if train:
            got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    s = neuroncc.stats()
    assert both_ways and s["kernels_reused"] > 0 and s["kernel_key_mismatches"] == 0, s
    assert any(c.more for _, exe in both_ways for c in exe.calls) == short_loops


def test_a_key_that_misses_something_is_caught_and_never_replayed(fresh, monkeypatch):
    """check_reuse, every kernel given the same key: the second comes out other than the
    first, so the key is marked broken and nothing is placed from it; the executable is the
    one emitting every kernel gives."""
    real = reuse.kernel_key
    monkeypatch.setattr(reuse, "kernel_key", lambda ctx, nodes: ("one key", real(ctx, nodes)[1]))
    graphs = []

    def emit_graph(g, target, **kw):
        graphs.append(g.name)
        checked = lower.emit_graph(g, target, **kw)
        assert kw["check_reuse"] and checked == lower.emit_graph(g, target, reuse=False)
        return checked

    monkeypatch.setattr(compile_module, "emit_graph", emit_graph)
    model = _stack(3)
    x = torch.randn(2, 16, 64)
    compiled = torch.compile(model, backend="neuron", options={"disk_cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    s = neuroncc.stats()
    assert graphs and s["kernel_key_mismatches"] > 0 and s["kernels_reused"] == 0, s


class _MaskedAttention(nn.Module):
    """Attention whose causal mask is shifted by `shift` keys: layers with other shifts have
    kernels alike but for a constant (Note [dead keys] reads it)."""

    def __init__(self, d: int, shift: int) -> None:
        super().__init__()
        self.qkv, self.o, self.shift = nn.Linear(d, 3 * d), nn.Linear(d, d), shift

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        i = torch.arange(s)
        mask = i[None, :] <= i[:, None] + self.shift
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.o(y.transpose(1, 2).reshape(b, s, d))


def test_layers_that_differ_in_a_constant_do_not_share_a_template(fresh, both_ways):
    """Two layers with one mask prove a key; the third, with another, must not be placed from
    it (the key holds the computation of every constant a kernel reads)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(_MaskedAttention(64, 130 if i % 3 == 2 else 0) for i in range(6)))
    x = torch.randn(1, 256, 64)
    compiled = torch.compile(model.eval(), backend="neuron", options={"disk_cache": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    s = neuroncc.stats()
    assert s["kernels_reused"] > 0 and s["kernel_key_mismatches"] == 0, s


class _OddBlock(_Block):
    """Three kernels: layer after layer, the same kernel is built from the other end of SBUF."""

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x)))).sigmoid().sum(-1, keepdim=True)


def test_layers_after_the_first_emit_nothing(fresh, monkeypatch):
    """Trusted templates (the default): a deeper stack emits no more kernels than a shallower
    one (the first layer's kernels read the graph's input, so its keys differ from the rest),
    later layers built from the other end of SBUF are placed from mirrored templates (Note
    [mirrored kernels]), and the executable is the one emitting every kernel gives."""
    monkeypatch.delenv("NEURONCC_CHECK_REUSE")
    mirrored, graphs = [], []
    real_mirrored = reuse._mirrored

    def spy_mirrored(ctx, template):
        mirrored.append(real_mirrored(ctx, template))
        return mirrored[-1]

    def spy_emit(g, target, **kw):
        graphs.append((g, target))
        return lower.emit_graph(g, target, **kw)

    monkeypatch.setattr(reuse, "_mirrored", spy_mirrored)
    monkeypatch.setattr(compile_module, "emit_graph", spy_emit)
    emitted = {}
    for layers in (3, 6):
        torch._dynamo.reset()
        GRAPH_CACHE.clear()  # (the weights' layout graphs too)
        LAID_OUT.clear()
        torch.manual_seed(0)
        model, x = nn.Sequential(*(_OddBlock(64) for _ in range(layers))), torch.randn(2, 16, 64)
        neuroncc.reset_stats()
        compiled = torch.compile(model, backend="neuron", options={"disk_cache": False})
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        emitted[layers] = neuroncc.stats()["kernels_emitted"]
    assert emitted[3] == emitted[6] and neuroncc.stats()["kernels_reused"] > 0, emitted
    assert any(t is not None for t in mirrored), "no template was mirrored"
    for g, target in graphs:
        assert lower.emit_graph(g, target) == lower.emit_graph(g, target, reuse=False), g.name
