"""Quiet runs (Note [quiet runs] in loops.py): a loop's placed iterations that wait on nothing
in HBM are placed without looking their HBM touches up, and their last touches there are
recorded only when a later call reaches them. The executable must be the one emitting every
iteration gives, and a loop whose iterations do wait on each other in HBM must not be taken
for quiet."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuroncc.codegen.executable import loops
from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.loops import _overlap_apart, _Span
from neuroncc.codegen.executable.program import Executable, ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.ir.types import DType
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import time_executable

F32 = DType.F32
COLS = 16
LOAD, STORE = isa.dma_queue(0), isa.dma_queue(1)  # (named: each iteration deals no queue turn)


@pytest.fixture(autouse=True)
def short_loops(monkeypatch):
    monkeypatch.setattr(loops, "MIN_LOOP", 2)


@pytest.fixture
def quiet_runs(monkeypatch) -> list[int]:
    """The iterations each quiet run placed, as loops found them."""
    runs: list[int] = []
    found = loops.LoopBuilder._quiet_run

    def spy(self, models, strides, count):
        run = found(self, models, strides, count)
        if run is not None:
            runs.append(count)
        return run

    monkeypatch.setattr(loops.LoopBuilder, "_quiet_run", spy)
    return runs


def _row(name: str, row: int) -> isa.DramRef:
    return isa.DramRef(name, row * COLS, F32, ((COLS, 1), (1, COLS)))


def _prefix_sums(rows: int, unrolled: bool) -> Executable:
    """y[0] = x[0], y[i] = y[i - 1] + x[i]: each iteration loads the row the one before
    stored, on another queue, so it waits on that store in HBM (a run of such iterations
    meets the store of the iteration before it)."""
    b = ProgramBuilder(TRN2, "prefix")
    b.unrolled = unrolled
    b.dram("x", (rows, COLS), F32, "input")
    b.dram("y", (rows, COLS), F32, "output")
    with b.kernel("prefix"):
        pool = b.sbuf_pool(COLS * 4, bufs=2)
        for i in b.loop([i > 0 for i in range(rows)]):
            t, u = pool.tile(1, (COLS,), F32), pool.tile(1, (COLS,), F32)
            b.dma(t, _row("x", i), LOAD)
            if i:
                b.dma(u, _row("y", i - 1), LOAD)
                b.emit(isa.TensorTensor("dve", op="add", dst=t, a=t, b=u))
            b.dma(_row("y", i), t, STORE)
    loc = [ValueLoc("x", (rows, COLS), F32), ValueLoc("y", (rows, COLS), F32)]
    return b.finish(loc[:1], loc[1:])


def _doubled_then_first(rows: int, unrolled: bool) -> Executable:
    """y = 2 x row by row (a quiet loop), then, in the same kernel, z = y[0] + y[rows - 1]:
    the last call reads what the run stored, so it must wait on the run's first and last
    stores."""
    b = ProgramBuilder(TRN2, "doubled")
    b.unrolled = unrolled
    b.dram("x", (rows, COLS), F32, "input")
    b.dram("y", (rows, COLS), F32, "output")
    b.dram("z", (1, COLS), F32, "output")
    with b.kernel("doubled"):
        pool = b.sbuf_pool(COLS * 4, bufs=2)
        for i in b.loop([0] * rows):
            t = pool.tile(1, (COLS,), F32)
            b.dma(t, _row("x", i), LOAD)
            b.emit(isa.TensorScalar("dve", op="mul", dst=t, src=t, scalar=2.0))
            b.dma(_row("y", i), t, STORE)
        ends = b.sbuf_pool(COLS * 4, bufs=2)  # (tiles of their own: no wait on chip)
        first, last = ends.tile(1, (COLS,), F32), ends.tile(1, (COLS,), F32)
        b.dma(first, _row("y", 0), isa.dma_queue(2))
        b.dma(last, _row("y", rows - 1), isa.dma_queue(3))
        b.emit(isa.TensorTensor("dve", op="add", dst=first, a=first, b=last))
        b.dma(_row("z", 0), first, STORE)
    loc = [ValueLoc(n, s, F32) for n, s in (("x", (rows, COLS)), ("y", (rows, COLS)))]
    return b.finish(loc[:1], [*loc[1:], ValueLoc("z", (1, COLS), F32)])


def _same_both_ways(build, rows: int) -> Executable:
    compact, unrolled = (build(rows, u) for u in (False, True))
    assert compact == unrolled
    assert time_executable(compact, TRN2).device_ns == time_executable(unrolled, TRN2).device_ns
    assert len(compact.blocks) < rows  # (the loop placed iterations)
    return compact


def test_iterations_that_wait_on_each_other_in_hbm_are_not_quiet(quiet_runs):
    rows = 40
    exe = _same_both_ways(_prefix_sums, rows)
    assert quiet_runs == []
    x = np.random.default_rng(0).standard_normal((rows, COLS)).astype(np.float32)
    (got,) = run(exe, [x], TRN2)  # (the race checker: every store is waited on)
    np.testing.assert_allclose(got, np.cumsum(x, axis=0), rtol=1e-5)


def test_a_quiet_run_is_recorded_when_a_later_call_reads_it(quiet_runs):
    rows = 40
    exe = _same_both_ways(_doubled_then_first, rows)
    assert sum(quiet_runs) >= rows - 8
    x = np.random.default_rng(1).standard_normal((rows, COLS)).astype(np.float32)
    y, z = run(exe, [x], TRN2)
    np.testing.assert_array_equal(y, 2 * x)
    np.testing.assert_array_equal(z[0], 2 * x[0] + 2 * x[-1])


_spans = st.builds(
    _Span,
    lo=st.integers(-40, 40),
    hi=st.integers(0, 12),  # (a width: made an end below)
    step=st.integers(-9, 9),
    n=st.integers(1, 6),
    model=st.integers(0, 1),
    write=st.booleans(),
)


@given(a=_spans, b=_spans)
def test_overlap_in_another_iteration_is_what_enumerating_the_run_finds(a, b):
    """Touches a and b (b.step forced to a's, or not) overlap in two different iterations of
    the run exactly when enumerating their periods says so (where their steps differ, the
    check may only err towards overlap)."""
    a = _Span(a.lo, a.lo + 1 + a.hi, a.step, a.n, a.model, a.write)
    for step in {a.step, b.step}:
        c = _Span(b.lo, b.lo + 1 + b.hi, step, b.n, b.model, b.write)
        meets = any(
            a.lo + x * a.step < c.hi + y * c.step and c.lo + y * c.step < a.hi + x * a.step
            for x in range(a.n)
            for y in range(c.n)
            if (x, a.model) != (y, c.model)
        )
        if step == a.step:
            assert _overlap_apart(a, c) == meets
        elif meets:
            assert _overlap_apart(a, c)
