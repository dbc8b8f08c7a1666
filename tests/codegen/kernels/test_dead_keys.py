"""Note [dead keys]: the abstract interpretation that lets the attention kernel skip masked key
tiles. Its op tables are checked against numpy on random float32 values (soundness), and the
kernel against eager PyTorch: causal masks skip the tiles above the diagonal, masks that are
graph inputs or rows that are fully masked skip nothing they need."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neuroncc
from neuroncc.codegen.kernels import dead_keys as dk
from neuroncc.ir import GraphBuilder, Op, interpret, numerics
from neuroncc.ir.types import DType
from neuroncc.runtime.stats import STATS

f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
BINARY = [*dk._BINARY_OK, *sorted(numerics.COMPARISONS)]


def _category(x) -> tuple[int, bool]:
    c = int(dk.categorize(np.float32(x)))
    return int(dk.LO[c]), bool(dk.NAN[c])


def _interval(*xs) -> int:
    """The code of the smallest interval holding every x."""
    cats = [_category(x) for x in xs]
    finite = [c for c, nan in cats if not nan] or [dk.Z]
    return int(dk._code(min(finite), max(finite), int(any(nan for _, nan in cats))))


def _holds(code: int, x) -> bool:
    cat, nan = _category(x)
    if nan:
        return bool(dk.NAN[code])
    return bool(dk.LO[code] <= cat <= dk.HI[code])


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(BINARY), a=f32, a2=f32, b=f32, b2=f32)
@example(op="and", a=float("nan"), a2=0.0, b=1.0, b2=0.0)  # nan is true: and(nan, 1) = 1
def test_binary_tables_hold_every_result(op, a, a2, b, b2):
    """fn(a, b) lies in the table's result for any intervals holding a and b."""
    with np.errstate(all="ignore"):
        got = np.float32(numerics.BINARY[op](np.float32(a), np.float32(b)))
    code = dk._lookup(op, 2)[_interval(a, a2), _interval(b, b2)]
    assert _holds(int(code), got), (op, a, a2, b, b2, got)


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(dk._UNARY_OK), a=f32, a2=f32)
def test_unary_tables_hold_every_result(op, a, a2):
    with np.errstate(all="ignore"):
        got = np.float32(numerics.UNARY[op](np.float32(a)))
    code = dk._lookup(op, 1)[_interval(a, a2)]
    assert _holds(int(code), got), (op, a, a2, got)


def _attention_matmuls() -> int:
    """Matmuls (not transposes) in the executed attention kernels."""
    count = 0
    for c in STATS.executed().values():
        for k in c.exe.kernels:
            if k.name.startswith("attention."):
                ins = c.exe.instructions[k.start : k.stop]
                count += sum(i.opcode == "matmul" and not i.transpose for i in ins)
    return count


def _run(fn, inputs):
    neuroncc.reset_stats()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="neuron")(*inputs)
    torch.testing.assert_close(got, fn(*inputs), atol=2e-5, rtol=1e-4)
    return _attention_matmuls()


def _qkv(heads=2, seq=512, d=32):
    g = torch.Generator().manual_seed(seq)
    return [torch.randn(1, heads, seq, d, generator=g) for _ in range(3)]


def test_causal_attention_skips_the_tiles_above_the_diagonal(fresh):
    """Per head, 4 query blocks of 512 keys: scores in one PSUM chunk each (4 matmuls), and P V
    over 1 + 2 + 3 + 4 key tiles instead of 4 x 4."""
    qkv = _qkv()
    assert _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), qkv) == (
        2 * (4 + 10)
    )


def _attention_instructions():
    return [
        i
        for c in STATS.executed().values()
        for k in c.exe.kernels
        if k.name.startswith("attention.")
        for i in c.exe.instructions[k.start : k.stop]
    ]


def test_known_selects_and_the_row_division_leave_the_rows(fresh):
    """The safe softmax's `where(row fully masked, 0, P)` is never taken when every row keeps a
    key (nor its condition computed), and P = e / s then becomes O = (e V) / s: no division
    over the rows, one reciprocal per block and a scaled PSUM evacuation instead."""
    qkv = _qkv(heads=1)
    _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), qkv)
    ins = _attention_instructions()
    # one select per query block: the causal mask's over its live keys, not the safe softmax's,
    # and the mask is selected into the scores, not added to them
    assert sum(i.opcode == "select" for i in ins) == 4
    assert not [i for i in ins if i.opcode == "tensor_tensor" and i.op == "add"]
    # and only over the diagonal tile: left of it every key is kept (KeyFacts.true_prefix)
    assert all(i.dst.free_elems < 128 for i in ins if i.opcode == "select")
    assert not [i for i in ins if i.opcode == "tensor_tensor" and i.op == "div"]
    assert sum(i.opcode == "activation" and i.func == "reciprocal" for i in ins) == 4
    # nor is the settled select's condition (row max != -inf) computed
    assert not [i for i in ins if getattr(i, "op", None) in ("ne", "gt")]


def test_masks_from_inputs_and_no_mask_skip_nothing(fresh):
    qkv, mask = _qkv(), torch.ones(512, 512, dtype=torch.bool).tril()
    full = 2 * (4 + 16)
    sdpa = F.scaled_dot_product_attention
    assert _run(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), [*qkv, mask]) == full
    assert _run(lambda q, k, v: sdpa(q, k, v), qkv) == full


def test_a_constant_mask_with_fully_masked_rows(fresh):
    """Rows with every key masked are 0 (PyTorch's safe softmax): their block cannot prove its
    max finite, so it keeps every key; the other blocks still skip."""

    def fn(q, k, v):
        rows = torch.arange(512)[:, None]
        mask = torch.ones(512, 512, dtype=torch.bool).tril() & (rows != 300)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert _run(fn, _qkv()) == 2 * (4 + 1 + 2 + 4 + 4)


@pytest.mark.parametrize("seq", [100, 300, 700])
def test_partial_tiles_match_eager(fresh, seq):
    qkv = _qkv(heads=3, seq=seq, d=16)
    _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), qkv)


def test_manual_softmax_attention_with_probabilities_returned(fresh):
    """P is read outside the kernel: it must be whole, so nothing is skipped."""

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / 4.0
        mask = torch.ones(512, 512, dtype=torch.bool).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        return p @ v, p

    qkv = _qkv()
    neuroncc.reset_stats()
    torch._dynamo.reset()
    with torch.no_grad():
        out, p = torch.compile(fn, backend="neuron")(*qkv)
    want_out, want_p = fn(*qkv)
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(p, want_p, atol=2e-5, rtol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    seq=st.integers(1, 300),
    offset=st.integers(-60, 60),
    window=st.none() | st.integers(0, 200),
    scale=st.sampled_from([None, 0.05, 3.0]),
)
def test_banded_constant_masks_match_eager(seq, offset, window, scale):
    """Causal masks shifted by `offset` (the first rows fully masked when it is negative), with
    or without a sliding window: whatever the analysis skips or settles, results are eager's."""

    def fn(q, k, v):
        rows, cols = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
        mask = cols <= rows + offset
        if window is not None:
            mask = mask & (cols >= rows - window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    _run(fn, _qkv(heads=2, seq=seq, d=8))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    base=st.integers(-45, 45),
    upper=st.booleans(),
    heads=st.integers(1, 3),
)
def test_band_edges_are_found_exactly(m, n, base, upper, heads):
    """Note [generated masks]: a mask on one side of a diagonal line is found as the line it
    is, in any of its forms; rows all true or all false everywhere give no line to find."""
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    mask = (j - i + base >= 0) if upper else (i - j + base >= 0)
    value = np.broadcast_to(mask, (1, heads, m, n))
    form = dk.band_edge(value, value.shape, m, n)
    counts = mask.sum(axis=1)
    if not ((counts > 0) & (counts < n)).any():
        assert form is None
        return
    b, ps, fs = form
    np.testing.assert_array_equal(b + ps * i + fs * j >= 0, mask)


def test_what_is_not_a_band_edge():
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    window = (j <= i) & (j > i - 8)
    steps = j <= 2 * i  # a line of another slope
    per_head = np.stack([j <= i, j <= i + 1])
    for value in (window, steps, per_head, (j <= i).astype(np.float32)):
        assert dk.band_edge(value, value.shape, 64, 64) is None


def _mask_traffic():
    """Kernels other than attention that do something, and DMAs of booleans (a mask's
    loads)."""
    names = [k.name for c in STATS.executed().values() for k in c.exe.kernels if k.stop > k.start]
    bools = [
        i
        for c in STATS.executed().values()
        for i in c.exe.instructions
        if i.opcode == "dma" and i.dst.dtype.value == "bool"
    ]
    return [n for n in names if not n.startswith("attention.")], bools


@pytest.mark.parametrize(("m", "n"), [(512, 512), (100, 300)])
def test_a_causal_mask_is_made_on_chip(fresh, m, n):
    """Note [generated masks]: no kernel computes the causal mask into HBM, and attention loads
    none: its diagonal tiles are made by iota and compare, once for every head."""
    q = torch.randn(1, 4, m, 32)
    k, v = torch.randn(1, 4, n, 32), torch.randn(1, 4, n, 32)
    _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v])
    assert _mask_traffic() == ([], [])
    made = [i for i in _attention_instructions() if i.opcode == "tensor_scalar" and i.op == "ge"]
    assert 1 <= len(made) <= math.ceil(m / 128)


def test_a_mask_from_an_input_is_still_loaded(fresh):
    q, k, v = _qkv(heads=2, seq=256)
    mask = torch.ones(256, 256, dtype=torch.bool).tril()
    _run(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, mask])
    assert _mask_traffic()[1]


def test_a_training_forward_skips_dead_keys_and_stores_p_whole(fresh):
    """The forward saves P for the backward: P is stored whole, its dead keys as zeros from
    a zero tile (AttentionPlan.zero_fill), while the kernel still skips computing them; the
    gradients are eager's."""
    q, k, v = (x.requires_grad_() for x in _qkv())
    neuroncc.reset_stats()
    torch._dynamo.reset()
    sdpa = F.scaled_dot_product_attention
    torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True), backend="neuron")(
        q, k, v
    ).square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    forward = [c for name, c in STATS.executed().items() if "forward" in name]
    assert forward and _attention_matmuls() >= 2 * (4 + 10)
    kernels = [k for k in forward[0].exe.kernels if k.name.startswith("attention.")]
    ins = forward[0].exe.instructions[kernels[0].start : kernels[0].stop]
    assert sum(i.opcode == "matmul" and not i.transpose for i in ins) == 2 * (4 + 10)
    for x in (q, k, v):
        x.grad = None
    sdpa(q, k, v, is_causal=True).square().sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_constants_stay_as_small_as_their_fills_and_broadcasts():
    """A fill broadcast over heads is analysed at its own size (a causal mask broadcast over
    32 heads was copied per head: a Llama layer's key facts at 4096 tokens took 1.52 s, now
    0.44 s); what is computed from it has its full shape, and every value is the
    interpreter's."""
    b = GraphBuilder()
    fill = b.op(Op.FULL, shape=[1, 8, 8], value=1.5, dtype=DType.F32)
    heads = b.op(Op.BROADCAST, fill, shape=[4, 8, 8])
    neg = b.op(Op.NEG, heads)
    g = b.build([fill, heads, neg])
    producers, memo = g.producers(), {}
    got = [dk._constant(v, producers, memo) for v in g.outputs]
    assert got[0].size == got[1].size == 1 and got[2].shape == (4, 8, 8)
    for value, v, want in zip(got, g.outputs, interpret(g, []), strict=True):
        np.testing.assert_array_equal(np.broadcast_to(value, v.type.shape), want)
