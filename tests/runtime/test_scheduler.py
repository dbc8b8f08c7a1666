"""Timing by call (Note [timing by call]): a call that meets the state an earlier call of its
block met is placed from the memo; the schedule equals timing every call afresh."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from torch import nn

import neuroncc
from neuroncc.codegen.executable.blocks import Block
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.ir.types import DType
from neuroncc.runtime.scheduler import _bounds, _Plan, schedule
from neuroncc.runtime.stats import STATS
from neuroncc.runtime.timing import time_executable
from tests.codegen.executable.test_blocks import _chain, chain_steps
from tools import bench


def _same_schedule(exe, target) -> tuple[int, int]:
    """Assert the memo's schedule is the fresh one (to the key's picoseconds); the calls the
    memo placed, and the kernels it placed whole."""
    fresh, _ = schedule(exe, target, memo=False)
    memo, state = schedule(exe, target)
    scale = max(float(fresh.end.max(initial=0.0)), 1.0)
    np.testing.assert_allclose(memo.start, fresh.start, rtol=0, atol=1e-9 * scale + 1e-2)
    np.testing.assert_allclose(memo.end, fresh.end, rtol=0, atol=1e-9 * scale + 1e-2)
    assert memo.track == fresh.track
    lean, _ = schedule(exe, target, detail=False)  # what time_executable keeps: the ends
    assert lean.start is None and lean.track is None
    np.testing.assert_array_equal(lean.end, memo.end)
    return state.calls_replayed, state.kernels_replayed


@settings(max_examples=30, deadline=None)
@given(steps=chain_steps(24))
def test_memo_equals_fresh_timing(steps):
    """Kernels over shared buffers in any order, blocks repeating with other bindings, queue
    turns and predecessors: placing calls from the memo changes no instruction's time."""
    steps = [(s, d, f, t) for s, d, f, t in steps if s != d]
    if not steps:
        return
    exe, _ = _chain(steps, 4)
    _same_schedule(exe, get_target("trn2"))


class _Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.mark.filterwarnings("ignore:neuroncc timing_only")
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_repeated_layers_are_timed_once(target):
    """Eight identical layers: past the first few, each layer's kernels meet the state the
    previous layer's met and come from the memo; the profile is the fresh timing's."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_Layer(128) for _ in range(8)])
    options = {"timing_only": True, "target": target, "disk_cache": False}
    compiled = torch.compile(model, backend="neuron", options=options)
    STATS.reset()
    with torch.no_grad():
        compiled(torch.randn(512, 128))
    # the model's graph (the others lay its weights out)
    entry = max(STATS.executed().values(), key=lambda e: len(e.exe.calls))
    exe, t = entry.exe, get_target(target)
    replayed, kernels = _same_schedule(exe, t)
    assert replayed >= len(exe.calls) // 2
    # the later layers' kernels are placed whole (Note [timing by kernel])
    assert kernels >= sum(not c.more for c in exe.calls) // 4
    profile = time_executable(exe, t)
    assert profile.device_ns == pytest.approx(entry.profile.device_ns, rel=1e-12)
    assert neuroncc.stats()["fallback_nodes"] == {}


@pytest.mark.filterwarnings("ignore:neuroncc timing_only")
@pytest.mark.parametrize("name", [w.name for w in bench.WORKLOADS])
def test_bench_workloads_time_alike_with_and_without_the_memo(name):
    """Every workload of the benchmark suite (quick shapes): the memo's schedule is the
    call-by-call one, graph by graph (the weights' layouts too)."""
    (workload,) = [w for w in bench.WORKLOADS if w.name == name]
    bench._neuroncc(workload, quick=True, level=2, timing_only=True)
    for entry in STATS.executed().values():
        _same_schedule(entry.exe, get_target(entry.exe.target))


def test_a_dma_that_moves_nothing_does_not_raise_its_queue():
    """A DMA of no elements is placed at its queue's free time but does not hold the queue, so
    the key's lower bounds must not raise the queue to it: the wait of a later DMA on that
    queue stays in the key (a bound raised past it would drop it, and calls whose waits differ
    would share a schedule)."""
    f32, n, t = DType.F32, 32, get_target("trn2")
    tile = isa.TileRef("sbuf", 0, 128, 0, f32, (n,))
    rows = isa.DramRef("$0", 0, f32, ((n, 128), (1, n)))
    slow = isa.Activation(
        "act",
        func="exp",
        dst=isa.TileRef("sbuf", 0, 128, 4096, f32, (2048,)),
        src=isa.TileRef("sbuf", 0, 128, 4096, f32, (2048,)),
    )
    empty = isa.Dma(
        "q0",
        deps=(0,),
        dst=isa.TileRef("sbuf", 0, 1, 256, f32, (0,)),
        src=isa.DramRef("$0", 0, f32, ((1, 0),)),
    )
    load = isa.Dma("q0", dst=tile, src=rows)
    plan = _Plan(Block("k", 1, (slow, empty, load)), t)
    assert plan.steps[1].shares == () and plan.steps[0].least_ns > 100
    first, live = _bounds(plan, [0.0] * len(plan.engines), {2: 50.0}, t.semaphore_ns)
    assert live == [(2, 50.0)]
    assert first[plan.engines.index("q0")] == 50.0
