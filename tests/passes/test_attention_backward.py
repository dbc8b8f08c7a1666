"""The attention backward as one kernel (Note [attention backward]): dP and dS stay on chip.
Gradients differential against eager PyTorch through torch.compile, for shapes with partial
query and key blocks, several heads and head dimensions; the kernel's exact HBM traffic;
golden IR of the fuse pass; and graphs that must not fuse."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

import neuroncc
from neuroncc.codegen.hardware import costs, isa
from neuroncc.codegen.hardware.targets import TRN1, TRN2
from neuroncc.codegen.kernels.attention_backward import backward_plans
from neuroncc.ir import parse, print_graph
from neuroncc.passes.fuse import Fuse
from neuroncc.passes.manager import PassContext
from neuroncc.runtime.stats import STATS


def _attention(causal: bool):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def _masked(q, k, v):
    """An additive float mask (as Hugging Face models pass one)."""
    m, n = q.shape[-2], k.shape[-2]
    keep = torch.ones(m, n, dtype=torch.bool).tril(diagonal=n - m)
    mask = torch.zeros(m, n).masked_fill(~keep, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _explicit(q, k, v):
    """Attention written out: softmax's own backward gives dS = P dP - P rowsum(P dP), and
    dKᵀ = Qᵀ dS, a form the kernel does not take (Note [attention backward])."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def _recomputed(q, k, v):
    """Activation checkpointing (as TRL's SFTTrainer has it by default): the backward graph
    makes the forward's Q again, here with an elementwise kernel, and the scores' matmul
    and dK = dSᵀ Q read the same reshape of it."""
    m, n = q.shape[-2], k.shape[-2]
    keep = torch.ones(m, n, dtype=torch.bool).tril(diagonal=n - m)
    mask = torch.zeros(m, n).masked_fill(~keep, float("-inf"))

    def attention(x, k, v):
        return F.scaled_dot_product_attention(x * 2.0 + 1.0, k, v, attn_mask=mask)

    return checkpoint(attention, q, k, v, use_reentrant=False)


def _backward_kernels() -> list:
    return [
        (k, c.exe)
        for name, c in STATS.executed().items()
        if "backward" in name
        for k in c.exe.kernels
        if k.stop > k.start
    ]


def _grads_agree(fn, b, h, m, n, d, dtype=torch.float32, atol=1e-4, **options):
    """Compile fn, run forward and backward, compare the gradients with eager's; returns the
    backward's kernels."""
    gen = torch.Generator().manual_seed(1000 * m + n + d)
    q = torch.randn(b, h, m, d, generator=gen, dtype=dtype)
    k, v = (torch.randn(b, h, n, d, generator=gen, dtype=dtype) for _ in range(2))
    grad = torch.randn(b, h, m, d, generator=gen, dtype=dtype)
    neuroncc.reset_stats()
    torch._dynamo.reset()
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch.compile(fn, backend="neuron", options=options)(*inputs)
    out.backward(grad)
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    fn(*ref).backward(grad)
    for got, want in zip(inputs, ref, strict=True):
        torch.testing.assert_close(got.grad, want.grad, atol=atol, rtol=1e-3)
    return _backward_kernels()


def _names(kernels) -> list[str]:
    return [k.name for k, _ in kernels]


@pytest.mark.parametrize(
    ("fn", "shape"),
    [
        (_attention(True), (1, 2, 256, 256, 64)),  # GPT-2's head size, two blocks per head
        (_attention(False), (2, 3, 200, 200, 32)),  # a partial second query block
        (_attention(False), (1, 1, 130, 300, 16)),  # cross attention, a partial key tile
        (_masked, (1, 2, 128, 128, 128)),  # a full-height head: dOᵀ on 128 partitions
        (_masked, (1, 1, 1, 64, 8)),  # one query row
        (_attention(False), (1, 2, 64, 1100, 64)),  # dP in three PSUM banks, one partial
        (_attention(True), (1, 1, 200, 512, 128)),  # dK and dV in two banks
    ],
)
def test_backward_is_one_kernel_and_matches_eager(fresh, fn, shape):
    names = _names(_grads_agree(fn, *shape))
    assert sum(n.startswith("attention_backward.") for n in names) == 1, names
    # dS is transposed inside the kernel; nothing of [rows, keys] is transposed outside
    assert not any(n.startswith("transpose.") for n in names), names


def test_q_made_in_the_backward_is_read_where_it_is_stored(fresh):
    """The kernel reads Q through the reshape the scores' matmul reads too: the kernel that
    makes Q stores only that reshape, so the backward kernel reads it there, not Q (which
    has no buffer)."""
    names = _names(_grads_agree(_recomputed, 1, 2, 59, 59, 16))
    assert sum(n.startswith("attention_backward.") for n in names) == 1, names


@pytest.mark.parametrize(
    ("fn", "shape"),
    [
        (_attention(True), (1, 2, 300, 2048, 64)),  # 10 of the 8 banks for every key at once
        (_masked, (1, 1, 200, 1100, 128)),  # key blocks of 512, 512 and 76
        # causal from the top left: keys past the last query row reach no query, their dK
        # and dV are the zero tile's, and most key blocks have no step for most query blocks
        (_attention(True), (1, 2, 130, 1700, 64)),
    ],
)
def test_past_what_psum_holds_the_keys_go_block_by_block(fresh, tmp_path, fn, shape):
    """Note [key blocks]: where a query block's dP and a head's dK and dV do not fit PSUM
    for every key at once, the kernel goes key block by key block, dQ summed in SBUF."""
    names = _names(_grads_agree(fn, *shape, dump_dir=str(tmp_path)))
    assert sum(n.startswith("attention_backward.") for n in names) == 1, names
    (fused,) = tmp_path.glob("*_backward/03-fuse.txt")
    (bp,) = backward_plans(parse(fused.read_text()), TRN2).values()
    assert bp.accumulates_dq and bp.block_keys < shape[3], bp


def test_softmax_written_out_still_matches(fresh):
    names = _names(_grads_agree(_explicit, 1, 2, 128, 128, 32))
    assert not any(n.startswith("attention_backward.") for n in names), names


def test_bf16_backward(fresh):
    names = _names(_grads_agree(_attention(True), 1, 2, 128, 128, 32, torch.bfloat16, atol=5e-2))
    assert any(n.startswith("attention_backward.") for n in names), names


def test_opt_levels_agree(fresh):
    for level in (0, 2):
        names = _names(_grads_agree(_attention(True), 1, 2, 64, 64, 16, opt_level=level))
        assert any(n.startswith("attention_backward.") for n in names) == (level == 2)


def test_the_kernel_reads_and_writes_each_tensor_once(fresh):
    """dO, O, Vᵀ, K, Q and the logsumexp in, dQ, dK and dV out, nothing else: S, P, dP, dS
    and D never leave the chip (Note [P recomputed]; op by op they are written and read
    back, about 5x this)."""
    b, h, m, n, d = 1, 2, 256, 384, 32
    kernels = _grads_agree(_attention(False), b, h, m, n, d)
    ((kernel, exe),) = [(k, e) for k, e in kernels if k.name.startswith("attention_backward.")]
    moved = sum(
        costs.dma_work(ins, TRN2).payload
        for ins in exe.instructions[kernel.start : kernel.stop]
        if isinstance(ins, isa.Dma)
    )
    assert moved == 4 * b * h * (4 * m * d + 4 * n * d + m)


@settings(max_examples=6, deadline=None)
@given(
    m=st.integers(1, 300),
    n=st.integers(16, 700),
    d=st.sampled_from([8, 64]),
    heads=st.integers(1, 3),
    causal=st.booleans(),
)
def test_random_shapes_match_eager(m, n, d, heads, causal):
    torch._dynamo.reset()
    names = _names(_grads_agree(_attention(causal and m <= n), 1, heads, m, n, d))
    assert any(x.startswith("attention_backward.") for x in names), names


# dO, O, Vᵀ, K, Q are the forward's; the saved P is %0 (the graph AOTAutograd makes for
# sdpa's backward, as simplified: tools `neuroncc-dump run` on a [1, 2, 16, 8] attention)
BACKWARD = """graph @bwd(%0: f32[1,2,16,16], %1: f32[1,2,16,8], %2: f32[2,8,16], %3: f32[2,16,8], %4: f32[2,16,8], %5: f32[1,2,16,8]) {
  %6 = reshape %5 {shape=[2,16,8]} : f32[2,16,8]
  %30 = reshape %0 {shape=[2,16,16]} : f32[2,16,16]
  %31 = transpose %30 {perm=[0,2,1]} : f32[2,16,16]
  %9 = matmul %31, %6 : f32[2,16,8]
  %10 = reshape %9 {shape=[1,2,16,8]} : f32[1,2,16,8]
  %11 = matmul %6, %2 : f32[2,16,16]
  %12 = reshape %11 {shape=[1,2,16,16]} : f32[1,2,16,16]
  %13 = mul %5, %1 : f32[1,2,16,8]
  %40 = exp %1 : f32[1,2,16,8]
  %14 = reduce_sum %13 {axes=[3], keepdim=false} : f32[1,2,16]
  %15 = reshape %14 {shape=[1,2,16,1]} : f32[1,2,16,1]
  %16 = broadcast %15 {shape=[1,2,16,16]} : f32[1,2,16,16]
  %17 = sub %12, %16 : f32[1,2,16,16]
  %18 = mul %0, %17 : f32[1,2,16,16]
  %19 = reshape %18 {shape=[2,16,16]} : f32[2,16,16]
  %20 = matmul %19, %3 : f32[2,16,8]
  %21 = reshape %20 {shape=[1,2,16,8]} : f32[1,2,16,8]
  %22 = full {shape=[1,2,16,8], value=0.35355339059327373, dtype=f32} : f32[1,2,16,8]
  %23 = mul %21, %22 : f32[1,2,16,8]
  %41 = add %23, %10 : f32[1,2,16,8]
  %33 = transpose %19 {perm=[0,2,1]} : f32[2,16,16]
  %26 = matmul %33, %4 : f32[2,16,8]
  %27 = reshape %26 {shape=[1,2,16,8]} : f32[1,2,16,8]
  %29 = mul %27, %22 : f32[1,2,16,8]
  return %41, %29, %40
}
"""

# The kernel's nodes together: exp(O), which needs none of them, moves ahead; dQ + dV, which
# reads two of its gradients, after.
BACKWARD_FUSED = """graph @bwd(%0: f32[1,2,16,16], %1: f32[1,2,16,8], %2: f32[2,8,16], %3: f32[2,16,8], %4: f32[2,16,8], %5: f32[1,2,16,8]) {
  %40 = exp %1 : f32[1,2,16,8]
  fuse {
    %6 = reshape %5 {shape=[2,16,8]} : f32[2,16,8]
    %30 = reshape %0 {shape=[2,16,16]} : f32[2,16,16]
    %31 = transpose %30 {perm=[0,2,1]} : f32[2,16,16]
    %9 = matmul %31, %6 : f32[2,16,8]
    %10 = reshape %9 {shape=[1,2,16,8]} : f32[1,2,16,8]
    %11 = matmul %6, %2 : f32[2,16,16]
    %12 = reshape %11 {shape=[1,2,16,16]} : f32[1,2,16,16]
    %13 = mul %5, %1 : f32[1,2,16,8]
    %14 = reduce_sum %13 {axes=[3], keepdim=false} : f32[1,2,16]
    %15 = reshape %14 {shape=[1,2,16,1]} : f32[1,2,16,1]
    %16 = broadcast %15 {shape=[1,2,16,16]} : f32[1,2,16,16]
    %17 = sub %12, %16 : f32[1,2,16,16]
    %18 = mul %0, %17 : f32[1,2,16,16]
    %19 = reshape %18 {shape=[2,16,16]} : f32[2,16,16]
    %20 = matmul %19, %3 : f32[2,16,8]
    %21 = reshape %20 {shape=[1,2,16,8]} : f32[1,2,16,8]
    %22 = full {shape=[1,2,16,8], value=0.35355339059327373, dtype=f32} : f32[1,2,16,8]
    %23 = mul %21, %22 : f32[1,2,16,8]
    %33 = transpose %19 {perm=[0,2,1]} : f32[2,16,16]
    %26 = matmul %33, %4 : f32[2,16,8]
    %27 = reshape %26 {shape=[1,2,16,8]} : f32[1,2,16,8]
    %29 = mul %27, %22 : f32[1,2,16,8]
  }
  %41 = add %23, %10 : f32[1,2,16,8]
  return %41, %29, %40
}
"""


def test_fuse_groups_the_backward_golden():
    fused = Fuse().run(parse(BACKWARD), PassContext(TRN2))
    assert print_graph(fused) == BACKWARD_FUSED
    (bp,) = backward_plans(fused, TRN2).values()
    assert (bp.batch, bp.m, bp.n, bp.d) == (2, 16, 16, 8)
    assert [gr.scale for gr in (bp.dq, bp.dk, bp.dv)] == [0.35355339059327373] * 2 + [1.0]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("return %41, %29, %40", "return %41, %29, %40, %17"),  # dP - D read outside
        ("%17 = sub %12, %16", "%17 = add %12, %16"),  # not dP - D
        ("%13 = mul %5, %1", "%13 = mul %1, %1"),  # D from another tensor than dP's dO
    ],
)
def test_what_does_not_fuse(old, new):
    assert old in BACKWARD
    g = Fuse().run(parse(BACKWARD.replace(old, new)), PassContext(TRN2))
    assert not backward_plans(g, TRN2)


def test_the_kernel_on_trn1(fresh):
    """dS is transposed on TensorE, on trn1 as a matmul against the identity (exact for the
    finite dS): the same one kernel, the same gradients."""
    g = Fuse().run(parse(BACKWARD), PassContext(TRN1))
    assert backward_plans(g, TRN1)
    names = _names(_grads_agree(_attention(True), 1, 2, 128, 128, 64, target="trn1"))
    assert sum(n.startswith("attention_backward.") for n in names) == 1, names


class _SelfAttention(torch.nn.Module):
    """GPT-2's attention: one QKV projection, heads split and merged around SDPA."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(b, s, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, dim))


def test_the_gradients_go_straight_into_the_qkv_gradient(fresh):
    """Note [gradients in place]: dQ, dK and dV are stored into the QKV projection's output
    gradient where its concat would put them: no concat kernel, and the weights' gradients
    still agree with eager's. And dO is read in place (fold_backward_views)."""
    torch.manual_seed(0)
    model = _SelfAttention(64, 4)
    x = torch.randn(1, 256, 64)
    compiled = torch.compile(model, backend="neuron")
    compiled(x.clone().requires_grad_()).square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=2e-4, rtol=1e-3, msg=name)
    names = _names(_backward_kernels())
    assert sum(n.startswith("attention_backward.") for n in names) == 1, names
    assert not any(n.startswith("concat.") for n in names), names
    # dO is read out of the projection's input gradient through its head split (no transpose
    # kernel for it); the one left merges the saved O's heads for the weight gradient.
    assert sum(n.startswith("transpose.") for n in names) == 1, names


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_training_saves_the_logsumexp_not_p(fresh, tmp_path, device):
    """Note [attention saves its logsumexp], Note [one attention op]: on CPU tensors and on
    meta tensors (timing_only estimates, where SDPA takes its math form) the forward hands
    the backward one value per query row, never [queries, keys]."""
    m = n = 256
    q, k, v = (torch.randn(1, 2, m, 32, device=device, requires_grad=True) for _ in range(3))
    opts = {"dump_dir": str(tmp_path), "timing_only": device == "meta"}
    torch.compile(_attention(True), backend="neuron", options=opts)(q, k, v).sum().backward()
    (bwd,) = tmp_path.glob("*_backward/03-fuse.txt")
    g = parse(bwd.read_text())
    assert not [x for x in g.inputs if x.type.shape[-2:] == (m, n)], g.inputs
    assert any(x.type.shape[-2:] == (m, 1) for x in g.inputs), g.inputs  # the logsumexp
    assert len(backward_plans(g, TRN2)) == 1


def test_causal_keys_are_skipped(fresh):
    """Note [dead keys] in the backward: a causal mask's zero P is not computed with, so the
    kernel issues about half the matmuls of the same attention without a mask."""

    def matmuls(causal: bool) -> int:
        kernels = _grads_agree(_attention(causal), 1, 2, 512, 512, 64)
        ((kernel, exe),) = [(k, e) for k, e in kernels if k.name.startswith("attention_b")]
        run = exe.instructions[kernel.start : kernel.stop]
        return sum(isinstance(ins, isa.Matmul) and not ins.transpose for ins in run)

    assert matmuls(True) < 0.7 * matmuls(False)
