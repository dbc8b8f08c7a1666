"""Attention as one kernel (Note [attention kernel]): scores and probabilities stay on chip.
Differential against eager PyTorch through torch.compile, including shapes that exercise
partial query blocks, several PSUM banks of scores and the pipeline across heads; golden IR
of the fuse pass; the training graph (the logsumexp saved for backward); key rows longer than
the kernel holds, in chunks; and the kernel's HBM traffic."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroncc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import TRN1, TRN2, get_target
from neuroncc.codegen.kernels.attention_planner import attention_plans, loads_ahead, with_key_facts
from neuroncc.codegen.kernels.dead_keys import Memo as KeyFactsMemo
from neuroncc.codegen.lower import emit_graph
from neuroncc.frontend.decomp_attention import key_chunk_for
from neuroncc.ir import parse, print_graph
from neuroncc.ir.types import DType
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import PassContext
from neuroncc.runtime.stats import STATS


def _kernel_names() -> list[str]:
    return [k.name for c in STATS.executed().values() for k in c.exe.kernels]


def _compile_and_check(fn, inputs, atol=2e-5, **options):
    neuroncc.reset_stats()
    torch._dynamo.reset()
    got = torch.compile(fn, backend="neuron", options=options)(*inputs)
    torch.testing.assert_close(got, fn(*inputs), atol=atol, rtol=1e-4)
    return _kernel_names()


def _qkv(b, h, m, n, d, dv=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(m * 1000 + n)
    q = torch.randn(b, h, m, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, n, dv or d, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize(
    ("shape", "causal"),
    [
        ((1, 2, 200, 200, 16), True),  # a partial second query block
        ((2, 3, 128, 128, 32), True),  # one block per head: a pipeline step spans two heads
        ((1, 1, 130, 1100, 8), False),  # three PSUM banks of scores, a partial key tile
        ((1, 1, 140, 2048, 8), True),  # four banks: one query block per pipeline step
        ((1, 2, 1, 300, 16), False),  # one query row (decode)
    ],
)
def test_sdpa_is_one_kernel_and_matches_eager(fresh, shape, causal):
    q, k, v = _qkv(*shape)
    names = _compile_and_check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), [q, k, v]
    )
    assert sum(n.startswith("attention.") for n in names) == 1, names
    # K is transposed on chip, and the scale is applied to the scores, not to q and k.
    assert not any(n.startswith(("transpose.", "mul.")) for n in names), names


def test_mask_scale_and_value_width(fresh):
    q, k, v = _qkv(1, 2, 96, 160, 16, dv=48)
    mask = torch.randn(1, 1, 96, 160)
    names = _compile_and_check(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
        [q, k, v, mask],
    )
    assert any(n.startswith("attention.") for n in names)


def test_fully_masked_rows_give_zero(fresh):
    """PyTorch's safe softmax: a row with every key masked is 0, not NaN."""
    q, k, v = _qkv(1, 1, 64, 64, 8)
    mask = torch.ones(64, 64, dtype=torch.bool)
    mask[5] = False
    _compile_and_check(
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, mask]
    )


def test_opt_levels_agree_and_scores_stay_on_chip(fresh):
    q, k, v = _qkv(1, 4, 256, 256, 32)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    hbm = {}
    for level in (0, 2):
        _compile_and_check(fn, [q, k, v], opt_level=level)
        hbm[level] = neuroncc.stats()["hbm_bytes"]
    scores = 4 * 256 * 256 * 4
    assert hbm[0] - hbm[2] > 4 * scores  # S and P each written and read back at opt_level 0


def test_attention_training_matches_eager(fresh):
    """Forward and backward: the forward kernel stores the rows' logsumexp for the backward
    (Note [attention saves its logsumexp]); the gradients agree. The backward's Pᵀ and dSᵀ
    are made inside its kernel: no transpose kernel of scores."""
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2, 64, 64, 16))
    fn = torch.compile(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), backend="neuron"
    )
    fn(q, k, v).square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert any(n.startswith("attention.") for n in _kernel_names())
    backward = [
        k.name
        for n, c in STATS.executed().items()
        if "backward" in n
        for k in c.exe.kernels
        if k.stop > k.start  # (a folded transpose is an empty kernel)
    ]
    assert backward and not [n for n in backward if n.startswith("transpose.")], backward


def test_bf16_training_matches_eager(fresh):
    """A bf16 training step: the forward's deferred normalisation and its logsumexp, the
    backward's recomputed P, against eager's."""
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2, 128, 128, 32, dtype=torch.bfloat16))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.compile(fn, backend="neuron")(q, k, v).square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    fn(q, k, v).square().sum().backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=2e-2)


def test_bf16_attention(fresh):
    q, k, v = _qkv(1, 2, 128, 192, 32, dtype=torch.bfloat16)
    names = _compile_and_check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [q, k, v],
        atol=2e-2,
    )
    assert any(n.startswith("attention.") for n in names)


@pytest.mark.parametrize(("target", "prologue"), [("trn1", False), ("trn2", False), ("trn2", True)])
def test_bf16_scores_multiply_in_bf16_and_give_the_f32_scores(fresh, target, prologue):
    """Note [widened scores]: SDPA's math widens bf16 q, k and v to f32. The kernel reads q
    and k as bf16 (their casts are not emitted) and multiplies them on TensorE in bf16, which
    gives the f32 scores exactly: the output is the one of the f32 kernel on the widened
    inputs, bit for bit. P V stays f32. With a row kernel making q and k (a rotary embedding's
    place; here -2x, exact in bf16), the casts stay out of it, so that it stores bf16."""
    q, k, v = _qkv(1, 3, 256, 320, 64, dtype=torch.bfloat16)
    pro = (lambda x: -(x * 2)) if prologue else (lambda x: x)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(pro(q), pro(k), v, is_causal=True)
    opts = {"target": target}
    with torch.no_grad():
        names = _compile_and_check(sdpa, [q, k, v], atol=2e-2, **opts)
        got = torch.compile(sdpa, backend="neuron", options=opts)(q, k, v)
    assert sum(n.startswith("cast.") for n in names) == 1  # v's; q's and k's are read in place
    mms = [i for i in _attention_exe().instructions if isinstance(i, isa.Matmul)]
    products = [i for i in mms if not i.transpose]
    assert {i.stationary.dtype for i in products} == {DType.BF16, DType.F32}  # Q Kᵀ, P V
    wide = [pro(q).float(), pro(k).float(), v.float()]
    plain = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True).bfloat16()
    with torch.no_grad():
        want = torch.compile(plain, backend="neuron", options=opts)
        torch.testing.assert_close(got, want(*wide), atol=0, rtol=0)


@settings(max_examples=8)
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 600),
    d=st.sampled_from([4, 16, 64]),
    heads=st.integers(1, 3),
)
def test_random_shapes_match_eager(m, n, d, heads):
    q, k, v = _qkv(1, heads, m, n, d)
    _compile_and_check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [q, k, v])


SDPA = """graph @main(%0: f32[2,64,16], %1: f32[2,16,96], %2: f32[192,16]) {
  %3 = matmul %0, %1 : f32[2,64,96]
  %4 = reduce_max %3 {axes=[2], keepdim=true} : f32[2,64,1]
  %5 = broadcast %4 {shape=[2,64,96]} : f32[2,64,96]
  %6 = sub %3, %5 : f32[2,64,96]
  %7 = exp %6 : f32[2,64,96]
  %8 = reduce_sum %7 {axes=[2], keepdim=true} : f32[2,64,1]
  %9 = broadcast %8 {shape=[2,64,96]} : f32[2,64,96]
  %10 = div %7, %9 : f32[2,64,96]
  %11 = reshape %2 {shape=[2,96,16]} : f32[2,96,16]
  %12 = matmul %10, %11 : f32[2,64,16]
  return %12
}
"""

# V's reshape moves ahead of the group, which is then consecutive.
SDPA_FUSED = """graph @main(%0: f32[2,64,16], %1: f32[2,16,96], %2: f32[192,16]) {
  %11 = reshape %2 {shape=[2,96,16]} : f32[2,96,16]
  fuse {
    %3 = matmul %0, %1 : f32[2,64,96]
    %4 = reduce_max %3 {axes=[2], keepdim=true} : f32[2,64,1]
    %5 = broadcast %4 {shape=[2,64,96]} : f32[2,64,96]
    %6 = sub %3, %5 : f32[2,64,96]
    %7 = exp %6 : f32[2,64,96]
    %8 = reduce_sum %7 {axes=[2], keepdim=true} : f32[2,64,1]
    %9 = broadcast %8 {shape=[2,64,96]} : f32[2,64,96]
    %10 = div %7, %9 : f32[2,64,96]
    %12 = matmul %10, %11 : f32[2,64,16]
  }
  return %12
}
"""


def test_fuse_groups_attention_golden():
    fused = Fuse().run(parse(SDPA), PassContext(TRN2))
    assert print_graph(fused) == SDPA_FUSED
    exe = emit_graph(fused, TRN2)
    assert [k.name for k in exe.kernels] == ["attention.3-12"]  # V read in place, not reshaped
    assert [b.name for b in exe.buffers if b.kind == "temp"] == []  # S and P never in HBM


def test_attention_kernel_on_trn1(fresh):
    """trn1 transposes on TensorE as a matmul against the identity, exact for finite data:
    causal masking and P V run in the one kernel there too."""
    fused = Fuse().run(parse(SDPA), PassContext(TRN1))
    assert any(ids[0] == 3 and 12 in ids for ids in fused.kernels)
    q, k, v = _qkv(1, 2, 200, 200, 32)
    names = _compile_and_check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [q, k, v],
        target="trn1",
    )
    assert sum(n.startswith("attention.") for n in names) == 1, names


def test_the_output_projection_reads_the_heads_where_attention_left_them(fresh):
    """o.transpose(1, 2).reshape(b, s, h * d) @ W^T: the matmul loads its rows of A from
    attention's [1, H, S, D] output (views.MergedHeads), so the head merge is no kernel."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(96, 96)

    def fn(q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return proj(o.transpose(1, 2).reshape(1, 200, 96))

    q, k, v = _qkv(1, 3, 200, 200, 32)
    with torch.no_grad():
        names = _compile_and_check(fn, [q, k, v])
    working = [  # (beside the transpose that lays the weight out: Note [weight layout])
        k.name
        for name, c in STATS.executed().items()
        if "_layout" not in name
        for k in c.exe.kernels
        if k.stop > k.start
    ]
    assert not [n for n in working if n.startswith("transpose.")], working
    assert sum(n.startswith("attention.") for n in names) == 1


@pytest.mark.parametrize(("seq", "ahead"), [(128, 2), (512, 3)])
def test_short_key_rows_are_loaded_fewer_steps_ahead(fresh, tmp_path, seq, ahead):
    """Note [attention pipeline]: at 128 keys a head's loads and stores (256-byte rows) take
    longer than its TensorE work, and loading three steps ahead would keep TensorE waiting on
    transposes of data still in flight (13.9 -> 12.5 us for 8 heads on trn2)."""
    q, k, v = _qkv(1, 8, seq, seq, 64)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        _compile_and_check(sdpa, [q, k, v], dump_dir=str(tmp_path))
    g = parse((tmp_path / "graph1_inference" / "07-plan.txt").read_text())
    plans = [with_key_facts(g, ap) for ap in attention_plans(g, TRN2).values()]
    assert [loads_ahead(ap, TRN2) for ap in plans] == [ahead]


def _attention_exe():
    (exe,) = [c.exe for c in STATS.executed().values() if "attention" in str(c.exe.kernels)]
    return exe


@pytest.mark.parametrize("heads", [2, 3])
def test_head_pairs_share_qt_and_kt_and_score_side_by_side(fresh, heads):
    """Note [head pairs]: at D = 64, two heads' Qᵀ (and Kᵀ) are one 128-partition transpose,
    and their score matmuls run at once on TensorE's two 64-row tiles. A third head runs
    alone, on rows 0-63."""
    q, k, v = _qkv(1, heads, 256, 256, 64)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():
        _compile_and_check(sdpa, [q, k, v])
    mms = [i for i in _attention_exe().instructions if isinstance(i, isa.Matmul)]
    scores = [i for i in mms if i.tile_rows == 64]
    assert len(scores) == 2 * heads  # two query blocks a head, the causal one on one chunk
    assert sorted(i.stationary.p0 for i in scores) == sorted([0] * (2 * heads - 2) + [64] * 2)
    transposes = [i for i in mms if i.transpose]
    pairs = (heads + 1) // 2
    # Qᵀ and Kᵀ: two blocks of each per pair (or head alone); Pᵀ: 1 + 2 key tiles a head.
    assert len(transposes) == 2 * pairs + 2 * pairs + 3 * heads


def test_head_pairs_read_side_by_side_heads_in_one_dma(fresh):
    """Out of a QKV projection two heads' q rows lie side by side: the pair's [rows, 2D]
    block is one DMA of 512-byte rows, not two of 256."""
    torch.manual_seed(0)
    qkv = torch.nn.Linear(128, 3 * 128)

    def fn(x):
        q, k, v = qkv(x).view(1, 128, 3, 2, 64).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        _compile_and_check(fn, [torch.randn(1, 128, 128)])
    loads = [
        i.src.dims
        for i in _attention_exe().instructions
        if isinstance(i, isa.Dma) and isinstance(i.src, isa.DramRef)
    ]
    assert ((3 * 128, 128), (1, 128)) in loads  # q (and k): rows 384 apart, 128 wide


def test_layers_sharing_a_mask_each_make_their_own(fresh, tmp_path):
    """A causal mask built once and read by every layer's SDPA (as Hugging Face models do):
    each SDPA's additive mask, where(mask, 0, -inf), is a constant of its own layer's
    attention kernel (Note [constants per reader]). Merged by CSE, the first kernel stored
    it to HBM for the others to read: [heads, seq, seq] floats per later layer. The layers'
    row groups, on equal constants, are analysed once (dead_keys.Memo)."""
    q, k, v = _qkv(1, 4, 256, 256, 32)

    def layers(n):
        def fn(q, k, v):
            idx = torch.arange(q.shape[-2])
            mask = idx[:, None] >= idx[None, :]
            for _ in range(n):
                q = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return q

        return fn

    hbm = {}
    for n in (1, 3):
        dump = tmp_path / str(n)
        names = _compile_and_check(layers(n), [q, k, v], dump_dir=str(dump))
        assert sum(x.startswith("attention.") for x in names) == n, names
        hbm[n] = neuroncc.stats()["hbm_bytes"]
    assert hbm[3] <= 3 * hbm[1], hbm
    g = parse((tmp_path / "3" / "graph1_inference" / "07-plan.txt").read_text())
    memo = KeyFactsMemo(g.producers())
    aps = list(attention_plans(g, TRN2).values())
    shared = [with_key_facts(g, ap, memo) for ap in aps]
    assert len(shared) == 3 and len(memo.facts) == 1
    assert shared == [with_key_facts(g, ap) for ap in aps]
    assert all(ap.live is not None for ap in shared)  # causal: each skips its dead keys


@pytest.mark.parametrize(("target", "causal", "m"), [("trn2", True, None), ("trn1", False, 200)])
def test_long_key_rows_go_in_chunks(fresh, target, causal, m):
    """Note [keys in chunks]: past the keys the kernel holds, the forward is one attention
    kernel per chunk of keys, combined by their row maxima and sums; the output and the
    gradients (the backward takes every key, Note [key blocks]) agree with eager's."""
    n = 2 * key_chunk_for(get_target(target).sbuf_partition_bytes) + 100
    q, k, v = (x.requires_grad_() for x in _qkv(1, 2, m or n, n, 16))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    got = torch.compile(fn, backend="neuron", options={"target": target})(q, k, v)
    grad = torch.randn_like(got)
    got.backward(grad)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = fn(q, k, v)
    want.backward(grad)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    for got_grad, want_grad in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(got_grad, want_grad, atol=1e-4, rtol=1e-3)
    forward = [k.name for n, c in STATS.executed().items() if "forward" in n for k in c.exe.kernels]
    assert sum(name.startswith("attention.") for name in forward) == 3, forward


@pytest.mark.parametrize("mask_shape", [(64, 1), (64, 2100), (2, 64, 2100)])
def test_chunks_slice_the_mask_with_the_keys(fresh, mask_shape):
    """Note [keys in chunks]: each chunk adds its keys' part of a float mask; a mask that
    broadcasts over the keys is added whole to every chunk (such a mask, one value per query
    row, is not taken into the attention kernel, chunked or not: only checked for values)."""
    q, k, v = _qkv(1, 2, 64, 2100, 16)
    mask = torch.randn(mask_shape, generator=torch.Generator().manual_seed(5))
    names = _compile_and_check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), [q, k, v]
    )
    if mask_shape[-1] != 1:
        assert sum(n.startswith("attention.") for n in names) == 2, names
