"""Instruction loops (Note [instruction loops]): a loop's repeating iterations are placed as
calls of the blocks built for the first, the executable is the one emitting every iteration
gives (bit for bit, so the same numbers and the same timing), it is stored as runs of calls,
and the race checker catches a missing wait carried from one iteration to the next."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuroncc.codegen import lower
from neuroncc.codegen.executable import loops
from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.program import Executable, ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN2, get_target
from neuroncc.errors import CodegenError, RaceError
from neuroncc.frontend import compile as compile_module
from neuroncc.ir import GraphBuilder, Op, TensorType, interpret
from neuroncc.ir.types import DType
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import time_executable

F32 = DType.F32
COLS = 32


def _built(exe: Executable) -> int:
    """The instructions exe's blocks hold: what was built, where len(exe.instructions) is the
    stream its calls unroll to."""
    return sum(len(b.instructions) for b in exe.blocks)


def _timed_on_meta(f, shapes, both_ways) -> Executable:
    """f compiled and timed for trn2 on bf16 tensors of `shapes` on the meta device: its one
    executable (emitted both ways)."""
    args = [torch.empty(s, device="meta", dtype=torch.bfloat16) for s in shapes]
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch.compile(f, backend="neuron", options=opts)(*args)
    ((_, exe),) = both_ways
    return exe


@pytest.fixture(autouse=True)
def short_loops(monkeypatch):
    """Every loop of two iterations or more built an iteration at a time (the compiler waits
    for longer loops: loops.MIN_LOOP), so that small shapes exercise the mechanism."""
    monkeypatch.setattr(loops, "MIN_LOOP", 2)


def _scaled(rows: int, tile_rows: int, bufs: int, unrolled: bool) -> Executable:
    """out = 2 * x + 1 over [rows, COLS], a loop over row tiles: load, two VectorE ops, store,
    each iteration's tiles from pools of `bufs` slots."""
    b = ProgramBuilder(TRN2, "scaled")
    b.unrolled = unrolled
    b.dram("x", (rows, COLS), F32, "input")
    b.dram("out", (rows, COLS), F32, "output")
    tiles = [(r0, min(tile_rows, rows - r0)) for r0 in range(0, rows, tile_rows)]
    with b.kernel("scaled"):
        pool = b.sbuf_pool(COLS * 4, bufs=bufs)
        for i in b.loop([p for _, p in tiles]):
            r0, p = tiles[i]
            src = isa.DramRef("x", r0 * COLS, F32, ((COLS, p), (1, COLS)))
            dst = isa.DramRef("out", r0 * COLS, F32, ((COLS, p), (1, COLS)))
            t, u = pool.tile(p, (COLS,), F32), pool.tile(p, (COLS,), F32)
            b.dma(t, src)
            b.emit(isa.TensorScalar("dve", op="mul", dst=u, src=t, scalar=2.0))
            b.emit(isa.TensorScalar("act", op="add", dst=t, src=u, scalar=1.0))
            b.dma(dst, t)
    loc = [ValueLoc("x", (rows, COLS), F32), ValueLoc("out", (rows, COLS), F32)]
    return b.finish(loc[:1], loc[1:])


def test_a_call_placed_outside_its_buffer_is_a_codegen_error():
    """A caller whose forms promise affine addresses that are not (its fourth tile wraps back
    to the first): the loop places the fourth a stride on, past the buffer's end, and the
    builder says so instead of timing a program that writes there."""
    b = ProgramBuilder(TRN2, "wraps")
    b.dram("x", (384, COLS), F32, "input")
    wrapped = pytest.raises(CodegenError, match="reaches bytes 49152..65536 of HBM buffer x")
    with wrapped, b.kernel("wraps"):
        pool = b.sbuf_pool(COLS * 4, bufs=1)
        for i in b.loop([0] * 4):
            t = pool.tile(128, (COLS,), F32)
            src = isa.DramRef("x", (0, 128, 256, 0)[i] * COLS, F32, ((COLS, 128), (1, COLS)))
            b.dma(t, src)
            b.emit(isa.TensorScalar("dve", op="mul", dst=t, src=t, scalar=2.0))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 700),
    tile_rows=st.sampled_from([1, 7, 64, 128]),
    bufs=st.integers(2, 5),
)
def test_a_compact_loop_is_the_unrolled_loop(rows, tile_rows, bufs):
    """Partial last tiles, one iteration, none: the compact executable equals the unrolled
    one, computes 2x + 1 without a race, and times the same."""
    compact, unrolled = (_scaled(rows, tile_rows, bufs, u) for u in (False, True))
    assert compact == unrolled
    assert compact.instructions == unrolled.instructions
    x = np.random.default_rng(rows).standard_normal((rows, COLS)).astype(np.float32)
    (got,) = run(compact, [x], TRN2)
    np.testing.assert_array_equal(got, 2 * x + 1)
    back = Executable.from_json(compact.to_json())
    assert back == compact
    assert time_executable(back, TRN2).device_ns == time_executable(unrolled, TRN2).device_ns


@pytest.mark.parametrize(
    ("op", "shape", "attrs"),
    [
        ("cast", (128, 40003), {"dtype": DType.BF16}),
        ("exp", (128, 50000), {}),
        ("full", None, {"shape": [128, 40003], "value": 1.5, "dtype": DType.F32}),
        ("reduce_sum", (300, 60000), {"axes": [1], "keepdim": False}),
        ("reduce_max", (2, 129, 30000), {"axes": [2], "keepdim": False}),
        ("reduce_sum", (300, 0), {"axes": [1], "keepdim": False}),
    ],
)
def test_single_op_kernels_loop_over_their_tiles(op, shape, attrs):
    """The emitters of single elementwise ops, fills and reductions (what the fuse pass leaves
    alone: an embedding gradient's cast, a loss's reductions over a vocabulary) are loops
    over their tiles: equal to their unrolled form, right, and most tiles placed."""
    b = GraphBuilder()
    args = [b.input(TensorType(shape, DType.F32))] if shape is not None else []
    g = b.build([b.op(Op(op), *args, **attrs)])
    compact, unrolled = (lower.emit_graph(g, TRN2, unrolled=u) for u in (False, True))
    assert compact == unrolled
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    (got,) = run(compact, inputs, TRN2)
    (want,) = interpret(g, inputs)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3)
    if all(v.type.numel for v in (*g.inputs, *g.outputs)):  # (not the sum over no elements)
        assert _built(compact) < len(compact.instructions) / 3


def test_a_long_loop_builds_a_few_iterations_and_stores_one_run():
    exe = _scaled(128 * 64, 128, 2, unrolled=False)
    assert len(exe.calls) == 64 and all(c.more for c in exe.calls[1:])
    built = _built(exe)
    assert built <= 3 * 4 < len(exe.instructions) == 64 * 4
    rows = json.loads(exe.to_json())["calls"]
    assert len(rows) <= 3 and sum(r[7] for r in rows) == 64  # runs: [..., count, step, strides]
    assert {c.offsets[0] for c in exe.calls[2:]} == {128 * COLS * i for i in range(2, 64)}


def test_a_run_that_does_not_fit_its_block_is_rejected():
    data = json.loads(_scaled(128 * 32, 128, 2, unrolled=False).to_json())
    run_row = max(data["calls"], key=lambda r: r[7])
    run_row[9] = run_row[9][:-1]  # a stride short
    with pytest.raises(ValueError, match="malformed executable"):
        Executable.from_data(data)


def test_a_missing_wait_carried_across_iterations_is_a_race():
    """Iteration i + 1 loads into the slot iteration i - 1 stored from (two slots): the wait
    on that store is carried by the loop; without it the checker reports the race."""
    exe = _scaled(128 * 32, 128, 2, unrolled=False)
    k = next(k for k, c in enumerate(exe.calls) if k > 2 and c.waits)
    broken = replace(
        exe, calls=(*exe.calls[:k], replace(exe.calls[k], waits=()), *exe.calls[k + 1 :])
    )
    x = np.ones((128 * 32, COLS), np.float32)
    run(exe, [x], TRN2)
    with pytest.raises(RaceError):
        run(broken, [x], TRN2)


@pytest.fixture
def both_ways(monkeypatch):
    """Every graph emitted with compact loops and unrolled: the executables must be equal."""
    compared = []

    def emit_graph(g, target, reuse=True, **options):
        compact = lower.emit_graph(g, target, reuse, **options)
        unrolled = lower.emit_graph(g, target, reuse, unrolled=True, **options)
        assert compact == unrolled, g.name
        compared.append((g.name, compact))
        return compact

    monkeypatch.setattr(compile_module, "emit_graph", emit_graph)
    return compared


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    m=st.sampled_from([1, 130, 640, 1024, 1536]),
    k=st.sampled_from([64, 384, 1000, 2048]),
    n=st.sampled_from([96, 700, 1536, 4096]),
    epilogue=st.booleans(),
    bf16=st.booleans(),
    target=st.sampled_from(["trn1", "trn2"]),
)
def test_matmul_loops_equal_their_unrolled_form(fresh, both_ways, m, k, n, epilogue, bf16, target):
    dtype = torch.bfloat16 if bf16 else torch.float32

    def f(a, w, r):
        y = torch.nn.functional.linear(a, w)
        return torch.nn.functional.gelu(y) + r if epilogue else y

    args = (torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype))
    args = (*args, torch.randn(m, n, dtype=dtype))
    opts = {"timing_only": True, "target": target, "disk_cache": False}
    torch._dynamo.reset()
    torch.compile(f, backend="neuron", options=opts)(*args)
    assert both_ways


def test_a_batched_matmul_loops_within_each_matrix(fresh, both_ways):
    """q @ kᵀ over 8 heads of 2048 rows (the suite's attention at opt_level 0): B's address
    jumps at each head, so a period of one block's steps must not be placed across it (it
    read past B's end, which the builder's bounds check refused)."""
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False, "fallback": False}
    q, k = (torch.empty(1, 8, 2048, 64, device="meta") for _ in range(2))
    scores = lambda q, k: (q * 0.5) @ (k.transpose(-1, -2) * 0.5)
    torch.compile(scores, backend="neuron", options={**opts, "opt_level": 0})(q, k)
    exe = next(exe for _, exe in both_ways if any("matmul" in k.name for k in exe.kernels))
    assert _built(exe) < len(exe.instructions) / 4


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.integers(2, 4),
    m=st.sampled_from([130, 640, 1024]),
    k=st.sampled_from([64, 384]),
    n=st.sampled_from([96, 700, 1536]),
    bf16=st.booleans(),
    target=st.sampled_from(["trn1", "trn2"]),
)
def test_batched_matmul_loops_equal_their_unrolled_form(
    fresh, both_ways, batch, m, k, n, bf16, target
):
    dtype = torch.bfloat16 if bf16 else torch.float32
    opts = {"timing_only": True, "target": target, "disk_cache": False, "fallback": False}
    a = torch.empty(batch, m, k, dtype=dtype, device="meta")
    b = torch.empty(batch, k, n, dtype=dtype, device="meta")
    torch._dynamo.reset()
    torch.compile(torch.bmm, backend="neuron", options=opts)(a, b)
    assert both_ways


def test_a_big_matmul_builds_a_fraction_of_its_steps(fresh, both_ways):
    """4096 x 2048 x 8192 in bf16: most steps are placed, not built, and the simulator's
    numbers (a smaller one, run for real) match PyTorch's."""
    a, w = (
        torch.randn(4096, 2048, dtype=torch.bfloat16),
        torch.randn(8192, 2048, dtype=torch.bfloat16),
    )
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch.compile(lambda a, w: a @ w.T, backend="neuron", options=opts)(a, w)
    (_, exe), *_ = both_ways
    built = _built(exe)
    assert built < len(exe.instructions) / 3
    assert time_executable(exe, get_target("trn2")).device_ns > 0
    torch._dynamo.reset()
    a, w = torch.randn(1024, 256), torch.randn(768, 256)
    got = torch.compile(lambda a, w: a @ w.T, backend="neuron", options={"disk_cache": False})(a, w)
    torch.testing.assert_close(got, a @ w.T, rtol=1e-4, atol=1e-4)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seq=st.sampled_from([256, 640, 1024]),
    heads=st.sampled_from([3, 4, 6]),
    dim=st.sampled_from([64, 128]),
    causal=st.booleans(),
)
def test_attention_loops_equal_their_unrolled_form(fresh, both_ways, seq, heads, dim, causal):
    """The attention kernel's pipeline steps (Note [attention pipeline]) repeat head group by
    head group; its carried tiles move on with the steps the loop places."""

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    args = tuple(torch.randn(1, heads, seq, dim, dtype=torch.bfloat16) for _ in range(3))
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch._dynamo.reset()
    torch.compile(f, backend="neuron", options=opts)(*args)
    assert both_ways


def test_attention_built_once_per_head_group_runs_right(fresh, both_ways):
    """32 heads of 512, not causal: the kernel builds a few head groups' steps and places the
    rest, and the simulator, running what was placed, gives PyTorch's numbers."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 32, 512, 64) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    got = torch.compile(f, backend="neuron", options={"disk_cache": False})(q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=2e-4, atol=2e-4)
    exe = max((e for _, e in both_ways), key=lambda e: len(e.instructions))
    assert _built(exe) < len(exe.instructions) / 2


def test_causal_attention_repeats_head_by_head(fresh, both_ways, monkeypatch):
    """Causal rows differ per query block, so the pipeline repeats a head at a time, and only
    if its steps of fewer live key tiles leave the pools where full ones do (aligned steps,
    emit_attention): 32 heads of 512 run right with most steps placed, and at the compiler's
    own loop lengths 8 heads of 4096 (on meta) place steps, where none were."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 32, 512, 64) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    got = torch.compile(f, backend="neuron", options={"disk_cache": False})(q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=2e-4, atol=2e-4)
    exe = max((e for _, e in both_ways), key=lambda e: len(e.instructions))
    assert _built(exe) < len(exe.instructions) / 2
    monkeypatch.setattr(loops, "MIN_LOOP", 128)
    torch._dynamo.reset()
    args = [torch.empty(1, 8, 4096, 128, device="meta", dtype=torch.bfloat16) for _ in range(3)]
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch.compile(f, backend="neuron", options=opts)(*args)
    exe = max((e for _, e in both_ways), key=lambda e: len(e.instructions))
    assert _built(exe) < 0.75 * len(exe.instructions)


def _attention_grads(q, k, v, causal: bool, options: dict):
    """SDPA's gradients through torch.compile, K and V repeated over Q's heads as HF's
    `repeat_kv` does (expand and reshape) where they have fewer heads."""

    def f(q, k, v):
        rep = q.shape[1] // k.shape[1]
        k, v = (x[:, :, None].expand(-1, -1, rep, -1, -1).flatten(1, 2) for x in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    torch._dynamo.reset()
    torch.compile(f, backend="neuron", options={"disk_cache": False, **options})(q, k, v).sum(
    ).backward()  # fmt: skip
    return f


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seq=st.sampled_from([256, 640, 1024]),
    heads=st.sampled_from([3, 4, 6]),
    kv_heads=st.sampled_from([1, 2, 0]),  # 0: as many as Q's
    causal=st.booleans(),
)
def test_attention_backward_loops_equal_their_unrolled_form(
    fresh, both_ways, seq, heads, kv_heads, causal
):
    """The attention backward's pipeline (Note [backward loop]) repeats head by head, its
    carried tiles moved on with the steps the loop places; K's heads repeated over Q's move
    in HBM by a different stride at each group's end, which the heads' forms tell apart."""
    kv = kv_heads if kv_heads and heads % kv_heads == 0 else heads
    shapes = ((1, heads, seq, 64), (1, kv, seq, 64), (1, kv, seq, 64))
    args = [torch.empty(s, device="meta", dtype=torch.bfloat16, requires_grad=True) for s in shapes]
    _attention_grads(*args, causal, {"timing_only": True, "target": "trn2"})
    assert any("backward" in name for name, _ in both_ways)


def test_attention_backward_built_once_per_head_runs_right(fresh, both_ways):
    """32 causal heads of 256 over 8 K and V heads: the backward builds the first heads'
    steps (two periods of a group of 4 heads: K's head moves once per group) and places the
    rest, and the simulator, running what was placed, gives PyTorch's gradients."""
    torch.manual_seed(0)
    q = torch.randn(1, 32, 256, 32, requires_grad=True)
    k, v = (torch.randn(1, 8, 256, 32, requires_grad=True) for _ in range(2))
    f = _attention_grads(q, k, v, True, {})
    got = [x.grad for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    f(q, k, v).sum().backward()
    for g, x in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(g, x.grad, rtol=2e-4, atol=2e-4)
    exe = next(e for name, e in both_ways if "backward" in name)
    assert _built(exe) < len(exe.instructions) / 2


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.sampled_from([1, 300, 2000, 4100]),
    cols=st.sampled_from([64, 1000, 4096]),
    kind=st.sampled_from(["layernorm", "rmsnorm", "softmax", "gelu", "positions"]),
)
def test_row_kernel_loops_equal_their_unrolled_form(fresh, both_ways, rows, cols, kind):
    """Row kernels' steps, whole rows or column chunks, with a table whose rows repeat (a
    position embedding added to every sequence)."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(cols)
    table = torch.randn(100, cols)
    fns = {
        "layernorm": norm,
        "rmsnorm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        "softmax": lambda x: torch.softmax(x, -1),
        "gelu": lambda x: torch.nn.functional.gelu(x) * 2,
        "positions": lambda x: (
            (x.view(-1, 100, cols) + table).view(-1, cols) if rows % 100 == 0 else x + 1
        ),
    }
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch._dynamo.reset()
    torch.compile(fns[kind], backend="neuron", options=opts)(torch.randn(rows, cols))
    assert both_ways


def _pe_transposes(exe: Executable) -> int:
    return sum(isinstance(i, isa.Matmul) and i.transpose for i in exe.instructions)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lead=st.sampled_from([(), (3,), (2, 3), "swapped"]),
    r=st.sampled_from([100, 1024, 1100]),
    c=st.sampled_from([128, 700, 2048]),
    bf16=st.booleans(),
)
def test_transpose_loops_equal_their_unrolled_form(fresh, both_ways, lead, r, c, bf16):
    """TensorE transposes go block by block (emit_transpose.transpose_blocks): partial edge
    blocks, rows of blocks, matrices and inner leading indices each start a new form of the
    loop (each case fails when its mark is left out of the forms)."""
    perm = (1, 0, 3, 2) if lead == "swapped" else (*range(len(lead)), len(lead) + 1, len(lead))
    lead = (3, 8) if lead == "swapped" else lead  # leading axes swapped too: not affine in bi
    x = torch.randn(*lead, r, c, dtype=torch.bfloat16 if bf16 else torch.float32)
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch._dynamo.reset()
    torch.compile(lambda x: x.permute(perm).contiguous(), backend="neuron", options=opts)(x)
    assert any(_pe_transposes(exe) for _, exe in both_ways)


def test_a_transpose_placed_from_its_first_blocks_runs_right(fresh, both_ways):
    """A [2, 3, 700, 1100] transpose on TensorE, most blocks placed, run in the simulator."""
    x = torch.randn(2, 3, 700, 1100)
    got = torch.compile(lambda x: x.transpose(-1, -2).contiguous(), backend="neuron")(x)
    assert torch.equal(got, x.transpose(-1, -2))
    ((_, exe),) = [(n, e) for n, e in both_ways if _pe_transposes(e)]
    assert _built(exe) < len(exe.instructions) / 2


def test_a_period_is_taken_only_from_iterations_whose_forms_repeat(fresh, both_ways):
    """Rows of 8 transpose blocks: a period of 2 whose strides were measured across a row's
    start (iterations 7, 8 against 9, 10) placed the next blocks' stores before the output's
    start. Every [8192, 4096] transpose on TensorE did so (the simulator stopped it; timing
    took the wrong addresses). Run for real here, compact equal to unrolled."""
    x = torch.randn(1536, 4096, dtype=torch.bfloat16)
    got = torch.compile(lambda x: x.t().contiguous(), backend="neuron")(x)
    assert torch.equal(got, x.t())
    assert any(_pe_transposes(exe) for _, exe in both_ways)


def test_wide_row_chunks_loop_equal_their_unrolled_form(fresh, both_ways):
    """Note [wide rows]: chunked row kernels carry their running reductions from step to step
    (the loop's state), a log-softmax over 300 rows of 60000; at 2000 rows (a loop long
    enough to be built an iteration at a time) the chunks between a row's first and last
    are placed, not built (the engine balance restarts: Note [balance in loops])."""
    x = torch.randn(300, 60000)
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    torch.compile(lambda x: torch.log_softmax(x, -1), backend="neuron", options=opts)(x)
    assert both_ways
    torch._dynamo.reset()
    both_ways.clear()
    x = torch.empty(2000, 60000, device="meta")
    torch.compile(lambda x: torch.log_softmax(x, -1), backend="neuron", options=opts)(x)
    ((_, exe),) = both_ways
    assert _built(exe) < len(exe.instructions) / 2


def test_a_long_matmul_epilogue_loop_is_placed(fresh, both_ways):
    """A matmul whose epilogue (a cast) runs on the balanced engines: its steps repeat and
    are placed (Note [balance in loops]); an LM head's logits cast to fp32 at 2048 tokens."""
    a, w = torch.empty(2048, 1024, device="meta"), torch.empty(30000, 1024, device="meta")
    opts = {"timing_only": True, "target": "trn2", "disk_cache": False}
    f = torch.compile(
        lambda a, w: (a.bfloat16() @ w.bfloat16().T).float(), backend="neuron", options=opts
    )
    f(a, w)
    ((_, exe),) = both_ways
    assert _built(exe) < len(exe.instructions) / 4


def test_a_matmul_of_few_large_steps_loops_them(fresh, both_ways, monkeypatch):
    """At the compiler's own loop lengths, 32 steps of about 250 instructions (2048 rows by
    4096 columns, K = 2048, in blocks of 7 M tiles) are a loop, though short
    (loops.BIG_ITERATION), and its last M block's shorter steps leave the epilogue's pools
    where the other steps do, so that its steps repeat (Note [aligned steps]). One run for
    real, its last M block short, matches PyTorch."""
    monkeypatch.setattr(loops, "MIN_LOOP", 128)

    def f(a, w, r):
        return torch.nn.functional.silu(a @ w.T) * r

    exe = _timed_on_meta(f, ((2048, 2048), (4096, 2048), (2048, 4096)), both_ways)
    assert _built(exe) < len(exe.instructions) / 3
    torch._dynamo.reset()
    torch.manual_seed(0)
    args = [torch.randn(s) for s in ((700, 1024), (2048, 1024), (700, 2048))]
    got = torch.compile(f, backend="neuron", options={"disk_cache": False})(*args)
    torch.testing.assert_close(got, f(*args), rtol=1e-4, atol=1e-3)
    _, exe = both_ways[-1]
    assert _built(exe) < len(exe.instructions)


@pytest.mark.parametrize(("batch", "m", "n"), [((), 130, 1100), ((2,), 200, 600)])
def test_a_matmul_too_long_to_block_loops_over_its_output_blocks(fresh, both_ways, batch, m, n):
    """K too long to keep Aᵀ on chip (50000 fp32): the plain tiled schedule
    (emit_matmul._emit_zero_or_simple) goes by output block and group of K tiles as a loop,
    runs right with the groups between a block's first and last placed, not built, and at
    2000 rows (on meta) places most of its steps. Aᵀ is made by TensorE transposes into HBM
    first, a kernel of its own, which the matmul waits on through the kernel boundary."""
    torch.manual_seed(0)
    a, b = torch.randn(*batch, m, 50000), torch.randn(*batch, 50000, n)
    got = torch.compile(torch.matmul, backend="neuron", options={"disk_cache": False})(a, b)
    torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=2e-3)
    exe = max((e for _, e in both_ways), key=lambda e: len(e.instructions))
    assert _built(exe) < len(exe.instructions) / 4
    transposes, product = exe.kernels
    assert transposes.name == product.name
    torch._dynamo.reset()
    a, b = torch.empty(*batch, 2000, 50000, device="meta"), b.to("meta")
    opts = {"disk_cache": False, "timing_only": True}
    torch.compile(torch.matmul, backend="neuron", options=opts)(a, b)
    exe = max((e for _, e in both_ways), key=lambda e: len(e.instructions))
    assert _built(exe) < len(exe.instructions) / 4


def test_a_matmul_epilogue_of_several_tiles_per_result_loops(fresh, both_ways):
    """A projection with the residual add and the fp32 square RMSNorm starts with (a Llama
    layer's o_proj and down_proj): the epilogue takes two tiles of its pools per result tile,
    7 result tiles per step, so its pools turned by 14 a step against 6 buffers and no step
    repeated another. Each step now leaves them at a whole turn (RowKernel.turn)."""

    def f(h, x, w):
        r = h + x @ w.T
        return r, r.float().pow(2).mean(-1)

    exe = _timed_on_meta(f, ((4096, 4096), (4096, 2048), (4096, 2048)), both_ways)
    assert _built(exe) < len(exe.instructions) / 3
