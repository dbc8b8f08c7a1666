"""Blocks and calls (Note [blocks and calls]): identical kernels share one block, the calls'
boundary waits order every hazard across kernels (the simulator's race checker, run on the
unrolled stream, says so), and the compact form round-trips through JSON."""

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.program import Executable, ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN2
from neuroncc.errors import RaceError
from neuroncc.ir.types import DType
from neuroncc.runtime.simulator import run

F32 = DType.F32
ROWS, COLS = 64, 32


def _rows(name: str, r0: int, p: int) -> isa.DramRef:
    return isa.DramRef(name, r0 * COLS, F32, ((COLS, p), (1, COLS)))


def _scale_kernel(b: ProgramBuilder, src: str, dst: str, factor: float, tile_rows: int) -> None:
    """dst = src * factor, in tiles of tile_rows rows: loads, a VectorE op, stores."""
    pool = b.sbuf_pool(COLS * 4, bufs=2)
    for r0 in range(0, ROWS, tile_rows):
        p = min(tile_rows, ROWS - r0)
        t = pool.tile(p, (COLS,), F32)
        b.dma(t, _rows(src, r0, p))
        out = pool.tile(p, (COLS,), F32)
        b.emit(isa.TensorScalar("dve", op="mul", dst=out, src=t, scalar=factor))
        b.dma(_rows(dst, r0, p), out)


def _chain(steps: list[tuple[int, int, float, int]], buffers: int) -> tuple[Executable, list]:
    """A program of scale kernels over `buffers` HBM buffers (b0 the input, the last the
    output): each step (src, dst, factor, tile rows) reads one and writes another; and the
    numpy reference of what the buffers hold."""
    b = ProgramBuilder(TRN2, "chain")
    names = [f"b{i}" for i in range(buffers)]
    for i, name in enumerate(names):
        b.dram(name, (ROWS, COLS), F32, "input" if i == 0 else "output")
    for k, (src, dst, factor, tile_rows) in enumerate(steps):
        with b.kernel(f"scale{k}"):
            _scale_kernel(b, names[src], names[dst], factor, tile_rows)
    locs = [ValueLoc(n, (ROWS, COLS), F32) for n in names]
    return b.finish(locs[:1], locs[1:]), names


def test_identical_kernels_share_a_block():
    exe, _ = _chain([(0, 1, 2.0, 16), (1, 2, 2.0, 16), (2, 3, 2.0, 16), (3, 4, 3.0, 16)], 5)
    assert len(exe.calls) == 4
    # x2 three times (other buffers, other queue turns; SBUF from alternate ends, Note [kernel
    # placement]), then x3
    assert [c.block for c in exe.calls] == [0, 1, 0, 2]
    assert len({c.phase for c in exe.calls}) > 1  # the queues are dealt out as before
    x = np.random.default_rng(0).standard_normal((ROWS, COLS), dtype=np.float32)
    outs = run(exe, [x], TRN2)  # the race checker runs over the unrolled stream
    for got, want in zip(outs, [2 * x, 4 * x, 8 * x, 24 * x], strict=True):
        np.testing.assert_array_equal(got, want)


def chain_steps(max_size: int):
    """_chain's steps: (src, dst, factor, tile rows) over 4 buffers, 1 to max_size of them."""
    step = st.tuples(
        st.integers(0, 3),
        st.integers(1, 3),
        st.sampled_from([0.5, 2.0, -1.0]),
        st.sampled_from([8, 16, 64]),
    )
    return st.lists(step, min_size=1, max_size=max_size)


@settings(max_examples=40, deadline=None)
@given(steps=chain_steps(8))
def test_boundary_waits_order_every_hazard(steps):
    """Kernels reading and overwriting each other's buffers in any order, with tiles of any
    size (so blocks repeat with other bindings and queue turns): the unrolled stream has no
    race and computes what numpy does."""
    steps = [(s, d, f, t) for s, d, f, t in steps if s != d]
    if not steps:
        return
    exe, _ = _chain(steps, 4)
    want = [np.random.default_rng(1).standard_normal((ROWS, COLS), dtype=np.float32)]
    want += [np.zeros((ROWS, COLS), np.float32)] * 3
    for src, dst, factor, _ in steps:
        want[dst] = want[src] * np.float32(factor)
    got = run(exe, [want[0]], TRN2)
    for k in range(1, 4):
        if any(d == k for _, d, _, _ in steps):
            np.testing.assert_array_equal(got[k - 1], want[k])


def test_a_missing_boundary_wait_is_a_race():
    exe, _ = _chain([(0, 1, 2.0, 16), (1, 2, 2.0, 16)], 3)
    second = exe.calls[1]
    assert second.waits, "the second kernel reads what the first wrote"
    broken = replace(exe, calls=(exe.calls[0], replace(second, waits=())))
    with pytest.raises(RaceError):
        run(broken, [np.ones((ROWS, COLS), np.float32)], TRN2)


def test_compact_form_round_trips_and_is_checked():
    exe, _ = _chain([(0, 1, 2.0, 16), (1, 2, 2.0, 16), (2, 1, 2.0, 16)], 3)
    back = Executable.from_json(exe.to_json())
    assert back.blocks == exe.blocks and back.calls == exe.calls
    assert back.instructions == exe.instructions
    data = json.loads(exe.to_json())
    data["calls"][0][1] = 7
    with pytest.raises(ValueError, match="block"):
        Executable.from_data(data)


def test_of_stream_keeps_a_written_out_stream():
    """An unrolled stream written out (deps as global ids) becomes calls whose expansion is
    that stream again."""
    exe, _ = _chain([(0, 1, 2.0, 16), (1, 2, 2.0, 32)], 3)
    again = Executable.of_stream(
        exe.name,
        exe.target,
        exe.hbm_bytes,
        exe.buffers,
        exe.inputs,
        exe.outputs,
        exe.instructions,
        exe.kernels,
    )
    assert again.instructions == exe.instructions
