"""Differential tests of the emitters: the simulator executing emitted instructions must compute
what the reference interpreter computes, at and across every tile boundary."""

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TARGETS, TRN1, TRN2
from neuroncc.codegen.kernels.emit_few_rows import STREAM_TILES
from neuroncc.codegen.kernels.emit_tensor import MAX_COPY_DMAS
from neuroncc.codegen.lower import emit_graph
from neuroncc.ir import DType, GraphBuilder, Op, TensorType, interpret, verify
from neuroncc.runtime.simulator import run
from neuroncc.runtime.timing import schedule
from tests.strategies import graphs

RNG = np.random.default_rng(0)


def random_input(t: TensorType) -> np.ndarray:
    if t.dtype == DType.BOOL:
        return RNG.random(t.shape) > 0.5
    if t.dtype.is_int:
        return RNG.integers(-50, 50, t.shape).astype(t.dtype.numpy)
    return RNG.standard_normal(t.shape).astype(np.float32).astype(t.dtype.numpy)


def check(g, inputs=None, target=TRN2, rtol=1e-5, atol=1e-5):
    verify(g)
    inputs = inputs or [random_input(v.type) for v in g.inputs]
    exe = emit_graph(g, target)
    got = run(exe, inputs, target)
    want = interpret(g, inputs)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(
            a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
        )
    return exe


@given(graphs())
def test_random_graphs_simulate_like_the_interpreter(g):
    check(g)


def _unary_graph(op, shape, dtype=DType.F32, **attrs):
    b = GraphBuilder()
    x = b.input(TensorType(shape, dtype))
    return b.build([b.op(op, x, **attrs)])


@pytest.mark.parametrize(
    ("m", "k", "n", "batch"),
    [
        (1, 1, 1, ()),
        (4, 8, 16, ()),
        (130, 129, 513, ()),
        (3, 300, 700, ()),
        (5, 7, 9, (3,)),
        (2, 0, 3, ()),
    ],
)
@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_matmul_tiles(m, k, n, batch, dtype):
    b = GraphBuilder()
    x = b.input(TensorType((*batch, m, k), dtype))
    w = b.input(TensorType((*batch, k, n), dtype))
    g = b.build([b.op(Op.MATMUL, x, w)])
    tol = 1e-5 if dtype == DType.F32 else 1e-2
    exe = check(g, rtol=tol, atol=tol * max(k, 1) ** 0.5)
    matmuls = [i for i in exe.instructions if i.opcode == "matmul"]
    assert all(i.stationary.np <= 128 and i.stationary.free_elems <= 128 for i in matmuls)
    assert all(i.moving.free_elems <= 512 for i in matmuls)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 64),
    k=st.integers(1, 700),
    n=st.integers(1, 5000),
    dtype=st.sampled_from([DType.F32, DType.BF16]),
)
@example(m=3, k=300, n=1000, dtype=DType.F32)  # partial k and n blocks
@example(m=64, k=700, n=5000, dtype=DType.BF16)  # two blocks per group, many groups
@example(m=1, k=129, n=4100, dtype=DType.F32)  # 32 blocks per group
def test_matmuls_of_few_rows(m, k, n, dtype):
    """A few rows of x (a decode step) against B as it is in HBM: B's blocks stationary where
    the cost model says that is faster (emit_few_rows), results transposed back, exact."""
    b = GraphBuilder()
    x, w = b.input(TensorType((m, k), dtype)), b.input(TensorType((k, n), dtype))
    g = b.build([b.op(Op.MATMUL, x, w)])
    tol = 1e-5 if dtype == DType.F32 else 1e-2
    check(g, rtol=tol, atol=tol * k**0.5)


def test_a_skinny_matmul_keeps_b_stationary():
    b = GraphBuilder()
    x, w = b.input(TensorType((1, 1024), DType.F32)), b.input(TensorType((1024, 2048), DType.F32))
    exe = check(b.build([b.op(Op.MATMUL, x, w)]), atol=1e-4)
    products = [i for i in exe.instructions if i.opcode == "matmul" and not i.transpose]
    assert len(products) == 8 * 16 and all(i.moving.free_elems == 1 for i in products)


def _decode_chain(m: int, dims: list[int], dtype: DType):
    """x [m, dims[0]] through weights [dims[i], dims[i+1]] (graph inputs), a GELU between."""
    b = GraphBuilder()
    h = b.input(TensorType((m, dims[0]), dtype))
    for i, (k, n) in enumerate(itertools.pairwise(dims)):
        h = b.op(Op.MATMUL, h, b.input(TensorType((k, n), dtype)))
        h = b.op(Op.GELU, h) if i < len(dims) - 2 else h
    return b.build([h])


@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 64),
    dims=st.lists(st.integers(1, 1500), min_size=3, max_size=4),
    dtype=st.sampled_from([DType.F32, DType.BF16]),
)
@example(m=1, dims=[512, 4096, 512], dtype=DType.F32)  # 2 MiB tiles, 32 blocks per group
def test_matmuls_of_few_rows_share_a_weight_stream(m, dims, dtype):
    """Note [weight stream]: chained matmuls of few rows load their weights through one SBUF
    ring on queues of their own; the race checker and the interpreter agree."""
    g = _decode_chain(m, dims, dtype)
    rng = np.random.default_rng([m, *dims])  # the same inputs when hypothesis replays a case
    inputs = [rng.standard_normal(v.type.shape).astype(dtype.numpy) for v in g.inputs]
    # Each layer scales the values by about sqrt(K); summation order differs by a few ulps
    # of that scale, not of the (possibly cancelled) result.
    scale = math.prod(k**0.5 for k in dims[:-1])
    tol = 1e-5 if dtype == DType.F32 else 3e-2
    check(g, inputs, rtol=tol, atol=tol * scale)


def test_the_next_matmuls_weights_load_while_the_last_one_runs():
    """A decode step's second matmul starts loading its weights before the first one ends
    (60.2 -> 48.2 us here on trn2), from the ring at the top of SBUF, on queues q14 and q15."""
    g = _decode_chain(1, [512, 4096, 512], DType.F32)
    rng = np.random.default_rng(0)  # inputs of their own: the shared RNG's depend on test order
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    exe = check(g, inputs, atol=1e-5 * math.sqrt(512 * 4096))  # the bound above explains
    sched, _ = schedule(exe, TRN2)
    first, second = [k for k in exe.kernels if k.name.startswith("fused") or "matmul" in k.name]
    loads = [
        i
        for i in range(second.start, second.stop)
        if isinstance(exe.instructions[i], isa.Dma)
        and isinstance(exe.instructions[i].dst, isa.TileRef)
    ]
    streamed = [i for i in loads if exe.instructions[i].engine in ("q14", "q15")]
    assert streamed and min(sched.start[i] for i in streamed) < max(
        sched.end[i] for i in range(first.start, first.stop)
    )
    ring = TRN2.sbuf_partition_bytes - STREAM_TILES * 4096 * 4
    assert all(exe.instructions[i].dst.offset >= ring for i in streamed)


@pytest.mark.parametrize("shape", [(1,), (300, 7), (3, 5000), (2, 3, 129)])
@pytest.mark.parametrize("op", [Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN])
def test_reductions(shape, op):
    check(_unary_graph(op, shape, axes=[len(shape) - 1], keepdim=False), rtol=1e-4, atol=1e-4)


def test_reduce_over_two_axes_and_int():
    check(_unary_graph(Op.REDUCE_SUM, (4, 5, 6), axes=[1, 2], keepdim=True), rtol=1e-5)
    check(_unary_graph(Op.REDUCE_MAX, (40, 6), DType.I64, axes=[1], keepdim=False))


@pytest.mark.parametrize("shape", [(), (1,), (7,), (129, 2049), (128, 3), (131,)])
@pytest.mark.parametrize("op", [Op.EXP, Op.GELU_TANH, Op.RSQRT])
def test_elementwise_tiles(shape, op):
    check(_unary_graph(op, shape))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_target(target):
    b = GraphBuilder()
    x = b.input(TensorType((200, 300), DType.F32))
    y = b.op(Op.SIGMOID, b.op(Op.MATMUL, x, b.op(Op.TRANSPOSE, x, perm=[1, 0])))
    check(b.build([y]), target=TARGETS[target], rtol=1e-4, atol=1e-4)


def test_bf16_cast_rounds_like_ml_dtypes():
    x = np.array([1.0, 1.00390625, 1.01171875, 3.14159, -2.7e-3, 1e30], dtype=np.float32)
    b = GraphBuilder()
    v = b.input(TensorType(x.shape, DType.F32))
    g = b.build([b.op(Op.CAST, v, dtype=DType.BF16)])
    (got,) = run(emit_graph(g, TRN2), [x], TRN2)
    assert got.tobytes() == x.astype(ml_dtypes.bfloat16).tobytes()


def test_integer_arithmetic_and_comparisons():
    b = GraphBuilder()
    x = b.input(TensorType((3, 40), DType.I64))
    y = b.input(TensorType((3, 40), DType.I64))
    outs = [b.op(op, x, y) for op in (Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.LT, Op.EQ)]
    outs.append(b.op(Op.DIV, x, b.op(Op.FULL, shape=[3, 40], value=7, dtype=DType.I64)))
    big = np.full((3, 40), 2**40 + 3, dtype=np.int64)  # beyond fp32's exact integers
    check(b.build(outs), [big, random_input(TensorType((3, 40), DType.I64))])


def test_movement_ops():
    b = GraphBuilder()
    x = b.input(TensorType((6, 130, 5), DType.F32))
    t = b.op(Op.TRANSPOSE, x, perm=[2, 0, 1])
    s = b.op(Op.SLICE, x, starts=[1, 3, 0], stops=[6, 130, 5], steps=[2, 7, 3])
    c = b.op(Op.CONCAT, x, x, b.op(Op.FULL, shape=[6, 130, 1], value=2.0, dtype=DType.F32), axis=2)
    r = b.op(
        Op.BROADCAST,
        b.op(Op.RESHAPE, b.op(Op.REDUCE_SUM, x, axes=[2], keepdim=True), shape=[6, 130, 1]),
        shape=[6, 130, 4],
    )
    v = b.op(Op.REVERSE, x, axes=[0, 2])
    w = b.op(Op.STRIDED, x, shape=[5, 3, 4], strides=[130, 7, 1], offset=2)  # overlapping windows
    check(b.build([t, s, c, r, v, w]))


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([DType.F32, DType.BF16]))
def test_transposes_of_merged_axes(data, dtype):
    """Axes a permutation keeps side by side count as one (emit_transpose._canonical), so that
    [b, h, w, c] -> [b, c, h, w] runs on TensorE as [b, h w, c] -> [b, c, h w]; every
    permutation, on TensorE where that makes it a matrix transpose, against the interpreter."""
    shape = data.draw(st.lists(st.sampled_from([1, 2, 3, 5, 16, 130]), min_size=2, max_size=5))
    assume(math.prod(shape) <= 1 << 16)
    perm = data.draw(st.permutations(range(len(shape))))
    b = GraphBuilder()
    check(b.build([b.op(Op.TRANSPOSE, b.input(TensorType(tuple(shape), dtype)), perm=perm)]))


def test_a_channels_first_transpose_runs_on_tensore():
    b = GraphBuilder()
    x = b.input(TensorType((2, 16, 130, 5), DType.F32))
    exe = check(b.build([b.op(Op.TRANSPOSE, x, perm=[0, 3, 1, 2])]))
    assert any(i.opcode == "matmul" and i.transpose for i in exe.instructions)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 140), st.booleans()), min_size=0, max_size=3),
    st.integers(1, 2600),
    st.sampled_from([DType.F32, DType.BF16, DType.I32, DType.I64, DType.BOOL]),
)
def test_broadcast_along_rows(lead, cols, dtype):
    """Note [broadcast along rows]: [..., 1] -> [..., C], other axes broadcast too or not,
    through SBUF where rows are long (partial row blocks, column chunks past a tile, blocks
    that repeat the one before), as a strided DMA where they are short."""
    assume(math.prod(n for n, _ in lead) * cols <= 1 << 20)
    b = GraphBuilder()
    x = b.input(TensorType((*(1 if bcast else n for n, bcast in lead), 1), dtype))
    check(b.build([b.op(Op.BROADCAST, x, shape=[*(n for n, _ in lead), cols])]))


@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 2100))
def test_take_and_iota(n, rows, d):
    b = GraphBuilder()
    table = b.input(TensorType((rows, min(d, 64)), DType.F32))
    idx = b.input(TensorType((n,), DType.I64))
    io = b.op(Op.IOTA, n=d, start=-3, step=2, dtype=DType.F32)
    g = b.build([b.op(Op.TAKE, table, idx), io])
    check(g, [random_input(table.type), RNG.integers(0, rows, n)])


def test_where_and_logical():
    b = GraphBuilder()
    x = b.input(TensorType((17, 33), DType.F32))
    y = b.input(TensorType((17, 33), DType.F32))
    c = b.op(Op.AND, b.op(Op.GT, x, y), b.op(Op.NOT, b.op(Op.EQ, x, x)))
    d = b.op(Op.OR, b.op(Op.LE, x, y), c)
    check(b.build([b.op(Op.WHERE, d, x, y), c]))


@pytest.mark.parametrize("combine", ["set", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.I64])
def test_put(combine, dtype):
    accumulate = combine != "set"
    n = 200 if accumulate else 40  # repeated indices only where they combine
    b = GraphBuilder()
    table = b.input(TensorType((40, 300), dtype))
    idx = b.input(TensorType((n,), DType.I64))
    rows = b.input(TensorType((n, 300), dtype))
    g = b.build([b.op(Op.PUT, table, idx, rows, combine=combine)])
    ids = RNG.integers(0, 40, n) if accumulate else RNG.permutation(40)
    check(g, [random_input(table.type), ids.astype(np.int64), random_input(rows.type)], atol=1e-4)


def test_a_large_copy_is_a_few_dmas():
    """A put's table copy of 8 MiB (an embedding gradient's, smaller) is MAX_COPY_DMAS DMAs
    at most, not one per 64 KiB, and the rows still land where they go."""
    b = GraphBuilder()
    table = b.input(TensorType((2053, 1024), DType.F32))
    idx = b.input(TensorType((300,), DType.I64))
    rows = b.input(TensorType((300, 1024), DType.F32))
    g = b.build([b.op(Op.PUT, table, idx, rows, combine="add")])
    ids = RNG.integers(0, 2053, 300).astype(np.int64)
    exe = check(g, [random_input(table.type), ids, random_input(rows.type)], atol=1e-4)
    dram = isa.DramRef
    copies = [
        i
        for i in exe.instructions
        if isinstance(i, isa.Dma) and isinstance(i.src, dram) and isinstance(i.dst, dram)
    ]
    assert copies and len(copies) <= MAX_COPY_DMAS


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("a_transposed", [False, True])
def test_matmul_layouts_with_infinities(target, a_transposed):
    """A (x^T, or x itself) is transposed on TensorE (without the layout pass nothing folds):
    exact on trn2; on trn1 a matmul against the identity, where an inf spreads NaN over its
    128-row tile of A (nki.isa.nc_transpose), with a warning. Every other row is as the
    interpreter gives it."""
    m, k, n = 200, 300, 600
    b = GraphBuilder()
    x = b.input(TensorType((k, m) if a_transposed else (m, k), DType.F32))
    w = b.input(TensorType((k, n), DType.F32))
    a = b.op(Op.TRANSPOSE, x, perm=[1, 0]) if a_transposed else x
    g = b.build([b.op(Op.MATMUL, a, w), b.op(Op.TRANSPOSE, w, perm=[1, 0])])
    xs = RNG.standard_normal(x.type.shape).astype(np.float32)
    xs[(3, 5)] = np.inf
    inputs = [xs, RNG.standard_normal((k, n)).astype(np.float32)]
    if target == "trn2":
        check(g, inputs, TARGETS[target], 1e-4, 1e-4)
        return
    with pytest.warns(RuntimeWarning, match="exact transpose mode"):
        got = run(emit_graph(g, TRN1), inputs, TRN1)[0]
    want = interpret(g, inputs)[0]
    assert not np.isfinite(got[:128]).any()  # the inf's tile of rows
    np.testing.assert_allclose(got[128:], want[128:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("shape", "perm", "dtype"),
    [
        ((700, 130), (1, 0), DType.F32),
        ((3, 129, 1030), (0, 2, 1), DType.F32),
        ((2, 600, 520), (0, 2, 1), DType.BF16),
        ((1, 300, 5, 24), (0, 2, 3, 1), DType.F32),  # heads split, keys last: [b, h, d, s]
        ((2, 130, 3, 8), (2, 0, 3, 1), DType.F32),
        ((1, 200, 136), (2, 0, 1), DType.F32),  # [1, s, d] -> [d, 1, s]: size-1 axes ignored
    ],
)
def test_transpose_in_blocks_of_long_runs(shape, perm, dtype):
    """Transposes that put the input's last axis second-to-last run on TensorE in [512, 512]
    (bf16: [512, 1024]) blocks: partial row tiles, partial 128-column pieces, partial blocks,
    and batch axes permuted too."""
    b = GraphBuilder()
    x = b.input(TensorType(shape, dtype))
    g = b.build([b.op(Op.TRANSPOSE, x, perm=list(perm))])
    exe = check(g, rtol=0, atol=0)
    assert any(isinstance(i, isa.Matmul) and i.transpose for i in exe.instructions)


def test_a_program_the_weight_stream_leaves_too_little_sbuf_is_emitted_without_it(monkeypatch):
    from neuroncc.codegen import lower

    g = _decode_chain(2, [300, 700, 200], DType.F32)
    monkeypatch.setattr(lower, "STREAM_TILES", 1000)  # more than SBUF holds
    exe = check(g, atol=1e-3)
    assert exe.instructions == lower._emit(g, TRN2, 0, reuse=True).instructions
