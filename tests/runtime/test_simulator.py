"""The simulator as a verifier: races, bounds and capacities are errors (timing: test_timing.py)."""

from dataclasses import replace

import numpy as np
import pytest

from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.kernel_builder import KernelBuilder
from neuroncc.codegen.executable.program import Executable, ValueLoc, over_capacity
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN2, get_target
from neuroncc.errors import CodegenError, RaceError, SimulationError
from neuroncc.ir.types import DType
from neuroncc.runtime.memory import Memories
from neuroncc.runtime.simulator import run
from neuroncc.runtime.written import WrittenBytes

F32 = DType.F32


def _io_program(make_instrs, shape=(4, 8)):
    """An executable with HBM input `in0` and output `out`, whose instructions are given
    verbatim (deps as written: no tracker), to test what the simulator accepts."""
    pb = ProgramBuilder(TRN2)
    pb.dram("in0", shape, F32, "input")
    pb.dram("out", shape, F32, "output")
    tile = isa.TileRef("sbuf", 0, shape[0], 0, F32, shape[1:])
    tile2 = isa.TileRef("sbuf", 0, shape[0], 1024, F32, shape[1:])
    src = isa.DramRef("in0", 0, F32, ((shape[1], shape[0]), (1, shape[1])))
    dst = isa.DramRef("out", 0, F32, ((shape[1], shape[0]), (1, shape[1])))
    instrs = make_instrs(tile, tile2, src, dst)
    loc_in, loc_out = ValueLoc("in0", shape, F32), ValueLoc("out", shape, F32)
    return Executable.of_stream(
        "t",
        "trn2",
        pb._hbm_top,
        tuple(pb.buffers.values()),
        (loc_in,),
        (loc_out,),
        tuple(instrs),
        (),
    )


def test_correct_dependencies_run():
    exe = _io_program(
        lambda t, t2, s, d: [
            isa.Dma("q0", dst=t, src=s),
            isa.Activation("act", func="exp", dst=t2, src=t, deps=(0,)),
            isa.Dma("q1", dst=d, src=t2, deps=(1,)),
        ]
    )
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    (y,) = run(exe, [x], TRN2)
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)


def test_kept_views_follow_each_program_and_its_inputs():
    """Operand views are kept from run to run (memory.Memories): programs that alternate, one
    that needs more HBM than the kept array holds, and new inputs each run."""

    def program(func, shape):
        return _io_program(
            lambda t, t2, s, d: [
                isa.Dma("q0", dst=t, src=s),
                isa.Activation("act", func=func, dst=t2, src=t, deps=(0,)),
                isa.Dma("q1", dst=d, src=t2, deps=(1,)),
            ],
            shape,
        )

    exp, tanh, wide = program("exp", (4, 8)), program("tanh", (4, 8)), program("exp", (128, 64))
    rng = np.random.default_rng(0)
    for exe, fn in [(exp, np.exp), (tanh, np.tanh), (wide, np.exp), (exp, np.exp), (tanh, np.tanh)]:
        x = rng.standard_normal(exe.inputs[0].shape, dtype=np.float32)
        (y,) = run(exe, [x], TRN2)
        np.testing.assert_allclose(y, fn(x), rtol=1e-6)


def test_unchecked_runs_run_the_kept_steps(monkeypatch):
    """A run without the race checker runs the steps its executable's last run prepared
    (simulator.py), on that run's inputs; a checked run prepares them again."""
    from neuroncc.runtime import semantics

    exe = _io_program(
        lambda t, t2, s, d: [
            isa.Dma("q0", dst=t, src=s),
            isa.Activation("act", func="exp", dst=t2, src=t, scale=2.0, deps=(0,)),
            isa.TensorTensor("dve", op="mul", dst=t2, a=t2, b=t, deps=(1,)),
            isa.Dma("q1", dst=d, src=t2, deps=(2,)),
        ]
    )
    prepared = []
    for opcode, prepare in list(semantics.PREPARE.items()):
        monkeypatch.setitem(
            semantics.PREPARE, opcode, lambda m, i, t, p=prepare: prepared.append(i) or p(m, i, t)
        )
    rng = np.random.default_rng(0)
    for checked in (True, False, False, True):
        x = rng.standard_normal((4, 8), dtype=np.float32)
        (y,) = run(exe, [x], TRN2, check_races=checked)
        np.testing.assert_allclose(y, np.exp(2 * x) * x, rtol=1e-6)
    assert len(prepared) == 2 * len(exe.instructions)


def _proof(exe) -> bool:
    """Whether written.py proves that exe reads only bytes it wrote (outputs included)."""
    written = WrittenBytes(Memories(exe, TRN2))
    for ins in exe.instructions:
        written.record(ins)
    return written.outputs_read(exe)


def test_the_proof_of_reads_only_written():
    rows = isa.TileRef("sbuf", 0, 4, 4096, DType.I32, (1,))  # a row index per partition

    def full(t, t2, s, d):  # the input through SBUF to the output
        return [isa.Dma("q0", dst=t, src=s), isa.Dma("q1", dst=d, src=t, deps=(0,))]

    def unwritten_tile(t, t2, s, d):
        return [isa.Dma("q1", dst=d, src=t2)]

    def half_output(t, t2, s, d):
        half = replace(d, dims=((8, 2), (1, 8)))
        return [isa.Dma("q0", dst=t, src=s), isa.Dma("q1", dst=half, src=t.rows(2), deps=(0,))]

    def scatter(first_write_the_table):
        def make(t, t2, s, d):
            table = replace(d, dims=((8, 4), (1, 8)))
            pre = [isa.Dma("q2", dst=table, src=t2)] if first_write_the_table else []
            return [
                isa.Memset("pool", dst=t2, value=0.0),
                *pre,
                isa.Iota("pool", dst=rows, base=0.0, pstep=2.0, fstep=0.0),  # rows 0 and 2
                isa.Dma("q0", dst=t, src=s),
                isa.DmaScatter(
                    "q1",
                    table=table,
                    src=t.rows(2),
                    index=rows.rows(2),
                    combine="set",
                    deps=(0, 1, 2, 3)[: 3 + first_write_the_table],
                ),
            ]

        return make

    assert _proof(_io_program(full))
    assert not _proof(_io_program(unwritten_tile))
    assert not _proof(_io_program(half_output))
    # A scatter writes only the rows it names: the others must have been written before.
    assert not _proof(_io_program(scatter(False)))
    assert _proof(_io_program(scatter(True)))


def test_a_program_that_reads_unwritten_bytes_gets_fresh_memories_every_run():
    """Runs of a program the proof fails for still start from reset memories, whatever the
    thread's last program left in them; those of one it holds for need no reset."""
    reads_garbage = _io_program(lambda t, t2, s, d: [isa.Dma("q1", dst=d, src=t2)])
    fills = _io_program(
        lambda t, t2, s, d: [isa.Dma("q0", dst=t2, src=s), isa.Dma("q1", dst=d, src=t2, deps=(0,))]
    )
    x = np.ones((4, 8), np.float32)
    for checked in (True, False, False):
        (y,) = run(reads_garbage, [x], TRN2, check_races=checked)
        assert np.isnan(y).all()  # the NaN-like bytes of fresh SBUF
        (z,) = run(fills, [x], TRN2, check_races=checked)  # leaves ones in that tile
        np.testing.assert_array_equal(z, x)


def test_missing_read_after_write_dependency_is_a_race():
    exe = _io_program(
        lambda t, t2, s, d: [
            isa.Dma("q0", dst=t, src=s),
            isa.Activation("act", func="exp", dst=t2, src=t),  # no wait on the load
            isa.Dma("q1", dst=d, src=t2, deps=(1,)),
        ]
    )
    with pytest.raises(
        RaceError,
        match=r"instruction 1 \(activation@act\) reads .* while instruction 0 \(dma@q0\) writes it",
    ):
        run(exe, [np.zeros((4, 8), np.float32)], TRN2)


def test_missing_write_after_read_dependency_is_a_race():
    exe = _io_program(
        lambda t, t2, s, d: [
            isa.Dma("q0", dst=t, src=s),
            isa.Activation("act", func="exp", dst=t2, src=t, deps=(0,)),
            isa.Dma("q1", dst=t, src=s),  # overwrites the tile act may still be reading
            isa.Dma("q2", dst=d, src=t2, deps=(1,)),
        ]
    )
    with pytest.raises(RaceError, match=r"instruction 2 \(dma@q1\) writes"):
        run(exe, [np.zeros((4, 8), np.float32)], TRN2)


def test_transitive_order_is_enough():
    # q1 waits on act, act waited on q0: q1's overwrite is ordered after q0's write.
    exe = _io_program(
        lambda t, t2, s, d: [
            isa.Dma("q0", dst=t, src=s),
            isa.Activation("act", func="exp", dst=t2, src=t, deps=(0,)),
            isa.Dma("q1", dst=t, src=s, deps=(1,)),
            isa.Dma("q2", dst=d, src=t2, deps=(1,)),
        ]
    )
    run(exe, [np.zeros((4, 8), np.float32)], TRN2)


def test_bounds_are_checked():
    oob = _io_program(
        lambda t, t2, s, d: [isa.Dma("q0", dst=t, src=isa.DramRef("in0", 30, F32, ((1, 32),)))]
    )
    with pytest.raises(SimulationError, match="elements 30..62 outside buffer of 32"):
        run(oob, [np.zeros((4, 8), np.float32)], TRN2)
    wide = isa.TileRef("sbuf", 100, 40, 0, F32, (8,))
    with pytest.raises(SimulationError, match="partitions 100..140 out of range"):
        run(
            _io_program(lambda t, t2, s, d: [isa.Memset("pool", dst=wide, value=0.0)]),
            [np.zeros((4, 8), np.float32)],
            TRN2,
        )


def test_matmul_tile_limits_are_enforced():
    st_ = isa.TileRef("sbuf", 0, 4, 0, F32, (8,))
    mv = isa.TileRef("sbuf", 0, 4, 4096, F32, (600,))
    ps = isa.TileRef("psum", 0, 8, 0, F32, (600,))
    exe = _io_program(
        lambda t, t2, s, d: [isa.Matmul("pe", dst=ps, stationary=st_, moving=mv, accumulate=False)]
    )
    with pytest.raises(SimulationError, match=r"moving free 600 \(max 512\)"):
        run(exe, [np.zeros((4, 8), np.float32)], TRN2)


def test_fresh_sbuf_is_garbage_not_zero():
    exe = _io_program(lambda t, t2, s, d: [isa.Dma("q0", dst=d, src=t)])
    (y,) = run(exe, [np.zeros((4, 8), np.float32)], TRN2)
    assert np.isnan(y).all()


def test_capacity_errors_name_the_sizes():
    pb = ProgramBuilder(TRN2)
    with pytest.raises(
        CodegenError, match="SBUF overflow: needs 307200 bytes per partition, the target has 229376"
    ):
        pb.sbuf_pool(300 * 1024, bufs=1)
    with pytest.raises(
        CodegenError, match=r"tensors do not fit in HBM: 32.00 GiB needed .* trn2 has 12 GiB"
    ):
        pb.dram("huge", (8, 2**30), F32)


def test_an_estimate_lays_out_past_the_cores_hbm():
    """Note [estimates past the core's HBM]: with fit_hbm off the buffers are laid out, and the
    executable says what it needs."""
    pb = ProgramBuilder(TRN2, "big", fit_hbm=False)
    pb.dram("small", (4, 8), F32, "input")
    pb.dram("huge", (8, 2**30), F32)
    exe = pb.finish([], [])
    assert over_capacity(exe) == (
        "tensors do not fit in HBM: big needs 32.00 GiB (inputs 0.00, outputs 0.00, temporaries "
        "32.00 GiB; the largest: huge [8, 1073741824] f32), trn2 has 12 GiB per NeuronCore"
    )
    assert over_capacity(_io_program(lambda t, t2, s, d: [])) is None


def test_neighbouring_kernels_allocate_from_opposite_ends():
    """Note [kernel placement]: kernel 2's tiles do not reuse kernel 1's bytes where both fit,
    so its first load does not wait for kernel 1; an empty kernel changes nothing, and a kernel
    allocating downwards still has the whole capacity."""
    pb = ProgramBuilder(TRN2)
    pb.dram("in0", (4, 8), F32, "input")
    cap = TRN2.sbuf_partition_bytes
    src = isa.DramRef("in0", 0, F32, ((8, 4), (1, 8)))
    offsets = []
    for name in ("a", "empty", "b", "c"):
        with pb.kernel(name):
            if name != "empty":
                t = pb.sbuf_pool(1024, bufs=2).tile(4, (8,), F32)
                offsets.append(t.offset)
                pb.dma(t, src)
    assert offsets == [0, cap - 2048, 0]
    b_load = pb.finish((), ()).instructions[1]
    assert not b_load.deps  # a's tile stays where it was: no write-after-read to wait for
    with pb.kernel("d"):
        assert pb.sbuf_pool(cap, bufs=1).base == 0


def _two_heads(target: str, tiles: tuple[tuple[int, int, int], ...]):
    """Scores of two heads whose 64-deep Qᵀ and Kᵀ share one tile's partitions: a matmul per
    (first partition, partitions, tile_rows), its result stored to out[head]."""
    kb = KernelBuilder(target)
    q, k = kb.hbm("q", (128, 128), F32), kb.hbm("k", (128, 256), F32)
    out = kb.hbm("out", (len(tiles), 128, 256), F32, kind="output")
    qt, kt = kb.sbuf((128, 128), F32), kb.sbuf((128, 256), F32)
    kb.load(qt, q[:, :])
    kb.load(kt, k[:, :])
    pool = kb.psum_pool((128, 256), bufs=len(tiles))
    for h, (p0, n, rows) in enumerate(tiles):
        ps, sb = pool.tile(), kb.sbuf((128, 256), F32)
        kb.matmul(ps, qt.partitions(p0, n), kt.partitions(p0, n), False, tile_rows=rows)
        kb.copy(sb, ps)
        kb.store(out[h, :, :], sb)
    return kb.finish()


def test_row_tiled_matmuls_compute_each_tiles_product():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((128, 128), np.float32), rng.standard_normal((128, 256), np.float32)
    exe = _two_heads("trn2", ((0, 64, 64), (64, 64, 64)))
    (out,) = run(exe, [q, k], TRN2)
    for h in range(2):
        rows = slice(64 * h, 64 * h + 64)
        np.testing.assert_allclose(out[h], q[rows].T @ k[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("target", "tile", "message"),
    [
        ("trn1", (0, 32, 32), "trn1 has no 32-row TensorE tiles"),
        ("trn2", (32, 64, 64), "within one 64-row tile"),  # rows 32-95 straddle two tiles
        ("trn2", (0, 64, 32), "within one 32-row tile"),  # deeper than its tile
    ],
)
def test_row_tiles_are_checked(target, tile, message):
    with pytest.raises(SimulationError, match=message):
        exe = _two_heads(target, (tile,))
        run(
            exe,
            [np.zeros((128, 128), np.float32), np.zeros((128, 256), np.float32)],
            get_target(target),
        )
