"""Every lowering against PyTorch eager, through torch.compile(backend="neuron"), forward and
(where the op is differentiable) backward: gradients come from the compiled backward graph."""

import zlib

import pytest
import torch
import torch.nn.functional as F

import neuroncc

T = torch.Tensor


def f32(*shape, lo=None):
    def make():
        x = torch.randn(*shape)
        return x.abs() + lo if lo is not None else x

    return make


def ints(high, *shape):
    return lambda: torch.randint(0, high, shape)


def boolean(*shape):
    return lambda: torch.rand(*shape) > 0.5


def rms_norm(x: T, w: T) -> T:
    # As written in HF Llama (LlamaRMSNorm.forward).
    dtype = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + 1e-6)
    return w * x.to(dtype)


CASES = {
    # name: (fn, input makers, differentiable); "views": differentiable, but AOTAutograd
    # replays the views of the inputs eagerly in the backward, so no backward graph is compiled.
    "add_sub_mul_div": (
        lambda a, b: (a + b, a - 2 * b, a * b, a / (b.abs() + 1)),
        [f32(3, 4), f32(3, 4)],
        True,
    ),
    "broadcast_binary": (lambda a, b: a * b + a - b, [f32(5, 1, 4), f32(3, 1)], True),
    "scalar_ops": (lambda a: (a + 1.5, 2 - a, a * 3, a / 4, a**2, 2**a), [f32(6)], True),
    "alpha": (
        lambda a, b: (torch.add(a, b, alpha=3), torch.sub(a, b, alpha=0.5)),
        [f32(4), f32(4)],
        True,
    ),
    "max_min": (
        lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), a.clamp(-0.5, 0.5)),
        [f32(8), f32(8)],
        True,
    ),
    "comparisons": (
        lambda a, b: (a < b, a <= b, a > 0, a >= b, a == a, a != b),  # noqa: PLR0124
        [f32(3, 5), f32(3, 5)],
        False,
    ),
    "logical": (
        lambda a, b: (a & b, a | b, ~a, torch.logical_not(a)),
        [boolean(4, 4), boolean(4, 4)],
        False,
    ),
    "where": (
        lambda c, a, b: torch.where(c, a, b) + torch.where(c, a, 0.0),
        [boolean(4, 6), f32(4, 6), f32(1, 6)],
        True,
    ),
    "masked_fill": (
        lambda a, m: a.masked_fill(m, float("-inf")).softmax(-1),
        [f32(3, 7), boolean(3, 7)],
        False,
    ),
    "relu": (torch.relu, [f32(4, 9)], True),
    "gelu": (F.gelu, [f32(4, 9)], True),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [f32(4, 9)], True),
    "silu": (F.silu, [f32(4, 9)], True),
    "tanh_sigmoid": (lambda x: (torch.tanh(x), torch.sigmoid(x)), [f32(4, 9)], True),
    "exp_log_rsqrt": (
        lambda x: (torch.exp(x), torch.log(x), torch.rsqrt(x), torch.sqrt(x)),
        [f32(10, lo=0.1)],
        True,
    ),
    "abs_neg_recip": (lambda x: (x.abs(), -x, torch.reciprocal(x)), [f32(10, lo=0.5)], True),
    "sin_cos_erf": (lambda x: (torch.sin(x), torch.cos(x), torch.erf(x)), [f32(10)], True),
    "casts": (
        lambda x: (
            x.to(torch.bfloat16),
            x.to(torch.float16),
            x.int(),
            (x > 0).float(),
            (x * 9).to(torch.int8),
            (x.abs() * 9).byte(),
            (x * 99).short(),
        ),
        [f32(4, 4)],
        False,
    ),
    "int_math": (
        lambda a, b: (a + b, a * 3, a - b, a // 7, (-a) // 7, a / 3),
        [ints(100, 5), ints(100, 5)],
        False,
    ),
    "float_div_modes": (
        lambda a: (a // 0.3, torch.div(a, 0.3, rounding_mode="trunc"), torch.floor(a)),
        [f32(9)],
        False,
    ),
    "any_all_isnan": (lambda a: ((a > 0).any(-1), (a > -3).all(), a.isnan()), [f32(3, 4)], False),
    "linear": (F.linear, [f32(4, 16), f32(8, 16), f32(8)], True),
    "mm_bmm": (
        lambda a, b, c: (a @ b, torch.bmm(c, c.transpose(1, 2))),
        [f32(5, 7), f32(7, 3), f32(2, 4, 6)],
        True,
    ),
    "matmul_4d": (lambda a, b: a @ b, [f32(2, 3, 4, 5), f32(2, 3, 5, 6)], True),
    "addmm_scaled": (
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        [f32(6), f32(3, 4), f32(4, 6)],
        True,
    ),
    "views": (
        lambda x: (x.view(6, 4), x.reshape(-1), x.unsqueeze(1).squeeze(1), x.flatten(1)),
        [f32(2, 3, 4)],
        "views",
    ),
    "permute_transpose": (
        lambda x: (x.permute(2, 0, 1), x.transpose(0, 2), x.mT),
        [f32(2, 3, 4)],
        "views",
    ),
    "expand": (lambda x: x.expand(3, 4, 5) * 1.0, [f32(4, 1)], True),
    "slice_select": (
        lambda x: (x[1:3], x[:, ::2], x[..., -2:], x[1], x[:, 2, 1:]),
        [f32(4, 5, 6)],
        "views",
    ),
    "cat_split": (
        lambda a, b: (torch.cat([a, b], 1), *a.split(2, dim=1), *torch.split(b, [1, 2], 1)),
        [f32(3, 4), f32(3, 3)],
        True,
    ),
    "chunk_unbind": (lambda a: (*a.chunk(2, -1), *a.unbind(0)), [f32(3, 4)], True),
    "sum_mean": (
        lambda x: (x.sum(), x.sum(0), x.sum((0, 2), keepdim=True), x.mean(-1), x.mean((1,))),
        [f32(3, 4, 5)],
        True,
    ),
    "amax_amin": (
        lambda x: (x.amax(-1), x.amin(0, keepdim=True), x.max(), x.min()),
        [f32(4, 7)],
        True,
    ),
    "max_dim_argmax": (
        lambda x: (*x.max(-1), *x.min(0), x.argmax(), x.argmax(1)),
        [f32(5, 6)],
        False,
    ),
    "softmax": (lambda x: (x.softmax(-1), x.softmax(0), F.log_softmax(x, -1)), [f32(3, 8)], True),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, (8,), w, b),
        [f32(2, 3, 8), f32(8), f32(8)],
        True,
    ),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (3, 8)), [f32(2, 3, 8)], True),
    "rms_norm_llama": (rms_norm, [f32(2, 5, 16), f32(16)], True),
    "embedding": (lambda w, i: F.embedding(i, w), [f32(20, 8), ints(20, 3, 5)], True),
    "index_put": (
        # Unique indices where not accumulating (duplicates are undefined behaviour there).
        lambda x, v, i, j: (
            x.index_put((i,), v[0]),
            x.index_put((j, i[:3]), v[1, :3], accumulate=True),
        ),
        [f32(5, 4, 3), f32(2, 4, 3), lambda: torch.tensor([3, 0, -1, 1]), ints(5, 3)],
        True,
    ),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), [f32(6, 11), ints(11, 6)], True),
    "cross_entropy_sum": (
        lambda x, t: F.cross_entropy(x, t, reduction="sum"),
        [f32(6, 11), ints(11, 6)],
        True,
    ),
    "nll_loss": (lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), [f32(5, 9), ints(9, 5)], True),
    "gather": (lambda x, i: torch.gather(x, 1, i), [f32(4, 6), ints(6, 4, 3)], True),
    "index_select": (lambda x, i: torch.index_select(x, 1, i), [f32(4, 6), ints(6, 5)], True),
    "scatter_value": (lambda x, i: x.scatter(1, i, 2.5), [f32(4, 6), ints(6, 4, 1)], False),
    "scatter_add": (
        lambda x, i, s: x.scatter_add(1, i, s),
        [f32(4, 6), ints(6, 4, 3), f32(4, 3)],
        True,
    ),
    "scatter_small_index": (
        lambda x, i, s: x.scatter_add(0, i, s),
        [f32(4, 6), ints(4, 2, 3), f32(2, 3)],
        True,
    ),
    "scatter_reduce": (
        lambda x, i, s: tuple(
            x.scatter_reduce(1, i, s, r, include_self=inc)
            for r in ("sum", "prod", "mean", "amax", "amin")
            for inc in (True, False)
        ),
        [f32(3, 5), ints(5, 3, 4), f32(3, 4)],
        False,
    ),
    "index_reduce": (
        lambda x, i, s: tuple(
            x.index_reduce(0, i, s, r, include_self=inc)
            for r in ("prod", "mean", "amax", "amin")
            for inc in (True, False)
        ),
        [f32(4, 3), ints(4, 6), f32(6, 3)],
        False,
    ),
    "gather_small_index": (lambda x, i: torch.gather(x, 0, i), [f32(5, 6), ints(5, 2, 3)], True),
    "constants": (
        lambda x: (
            torch.zeros_like(x),
            torch.ones(3) + x.sum(),
            torch.full((2, 2), 7.0),
            x.new_zeros(4),
        ),
        [f32(3)],
        False,
    ),
    "arange": (
        lambda x: (
            torch.arange(5),
            torch.arange(2, 11, 3),
            torch.arange(x.shape[0], dtype=torch.float32) * x,
        ),
        [f32(6)],
        False,
    ),
    "tril_mask": (
        lambda x: torch.ones(5, 5, dtype=torch.bool).tril() & (x > 0),
        [f32(5, 5)],
        False,
    ),
    "cumsum": (
        lambda x, i: (x.cumsum(-1), i.cumsum(0), x.cumsum(0)),
        [f32(3, 37), ints(9, 5)],
        True,
    ),
    "sort": (
        lambda x, i: (
            *torch.sort(x),
            *torch.sort(x, 0, descending=True),
            *torch.sort(i, stable=True),
            torch.argsort(x.round()),
        ),
        [
            lambda: torch.tensor(
                [[1.0, float("nan"), -2.0, 3.0, 1.0], [0.5, 0.5, -1.0, float("nan"), 2.0]]
            ),
            ints(4, 7),
        ],
        False,
    ),
    "sort_grad": (lambda x: torch.sort(x, -1)[0] * 2, [f32(3, 6)], True),
    "topk": (
        lambda x: (*torch.topk(x, 3), *torch.topk(x, 2, dim=0, largest=False)),
        [f32(4, 9)],
        True,
    ),
    # Ties: the lowest index wins here; PyTorch leaves their order unspecified, so compare values.
    "topk_ties": (lambda x: torch.topk(x.round(), 4)[0], [f32(3, 8)], False),
    "index_tensor": (
        lambda x, i, j: (x[i], x[:, j], x[i, j], x[i.unsqueeze(1), j[:3]], x[-1 - i]),
        [f32(6, 5, 3), ints(5, 4), ints(4, 4)],
        True,
    ),
    "flip": (lambda x: (x.flip(0), x.flip(-1, 1)), [f32(3, 4, 5)], True),
    "pad": (lambda x: (F.pad(x, (1, 2)), F.pad(x, (0, 0, 2, -1), value=-3.0)), [f32(3, 4)], True),
    "slice_scatter": (
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 3),
        [f32(3, 5), f32(3, 2)],
        True,
    ),
    # With a step (Mamba's backward): groups cut short at the end, the first axis, a negative
    # start.
    "slice_scatter_step": (
        lambda x, s, t: (
            torch.slice_scatter(x, s, 1, 1, None, 3),
            torch.slice_scatter(x, t, 0, -4, None, 2),
            torch.slice_scatter(x, s, 1, 0, 7, 3),
        ),
        [f32(4, 8, 2), f32(4, 3, 2), f32(2, 8, 2)],
        True,
    ),
    "more_unary": (
        lambda x: (
            x.log1p(),
            x.expm1(),
            x.exp2(),
            x.log2(),
            x.log10(),
            x.trunc(),
            x.ceil(),
            x.tan(),
            x.atan(),
            x.sinh(),
            x.cosh(),
            x.asinh(),
            torch.special.erfc(x),
            x.frac(),
        ),
        [f32(3, 5, lo=0.1)],
        True,
    ),
    "inverse_trig": (
        lambda x: (x.acos(), x.asin(), x.atanh()),
        [lambda: torch.rand(7) * 1.8 - 0.9],
        True,
    ),
    "more_binary": (
        lambda a, b: (
            torch.fmod(a, b),
            torch.remainder(a, b),
            torch.atan2(a, b),
            torch.copysign(a, b),
            torch.hypot(a, b),
            torch.fmax(a, b),
            torch.logaddexp(a, b),
            a % 0.7,
        ),
        [f32(3, 4), f32(3, 4, lo=0.2)],
        False,
    ),
    "inf_nan": (
        lambda x: (x.isinf(), x.isfinite(), x.isposinf(), torch.nan_to_num(x.log())),
        [f32(9)],
        False,
    ),
    "activations": (
        lambda x: (F.elu(x), F.leaky_relu(x), F.softplus(x), F.hardtanh(x), x.round(decimals=1)),
        [f32(4, 5)],
        True,
    ),
    "prod_var_norm": (
        lambda x: (
            x.prod(),
            x.prod(1),
            x.cumprod(0),
            x.var(1),
            x.std(),
            *torch.var_mean(x, 0),
            x.norm(),
            torch.linalg.vector_norm(x, 1, -1),
        ),
        [f32(3, 4)],
        True,
    ),
    "diagonal": (
        lambda x: (
            x.diagonal(),
            x.diagonal(1),
            x.diagonal(-1, 1, 2),
            torch.diagonal_scatter(x[0], x[1, :4, 0] * 0 + 5),
            torch.diagonal_scatter(x[0], x[1, :3, 1], -1),
        ),
        [f32(3, 4, 5)],
        True,
    ),
    "repeat_mv": (
        lambda x, v: (x.repeat(2, 1, 3), x @ v, torch.dot(v, v), torch.addmv(v[:3], x, v)),
        [f32(3, 4), f32(4)],
        True,
    ),
    "conv": (
        lambda x, w, b, w1, x1: (
            F.conv2d(x, w, b, stride=2, padding=1),
            F.conv2d(x, w[:, :2], None, dilation=2, groups=2),
            F.conv1d(x1, w1, padding=2),
        ),
        [f32(2, 4, 9, 8), f32(6, 4, 3, 3), f32(6), f32(5, 3, 4), f32(2, 3, 11)],
        True,
    ),
    "max_pool": (lambda x: (F.max_pool2d(x, 2), F.max_pool2d(x, 3, 2, 1)), [f32(2, 3, 8, 7)], True),
    "avg_pool": (
        lambda x: (
            F.avg_pool2d(x, 2),
            F.avg_pool2d(x, 3, 2, 1),
            F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
            F.avg_pool2d(x, (2, 3), divisor_override=4),
            F.avg_pool1d(x[0], 3, 2),
        ),
        [f32(2, 3, 8, 7)],
        True,
    ),
    "adaptive_avg_pool": (
        lambda x: (F.adaptive_avg_pool2d(x, 3), F.adaptive_avg_pool2d(x, (5, 2))),
        [f32(2, 3, 8, 7)],
        True,
    ),
    "group_norm": (
        lambda x, w, b: F.group_norm(x, 2, w, b),
        [f32(2, 4, 3, 5), f32(4), f32(4)],
        True,
    ),
    "batch_norm_eval": (
        lambda x, m, v, w, b: F.batch_norm(x, m, v.abs() + 0.5, w, b),
        [f32(3, 4, 5), f32(4), f32(4), f32(4), f32(4)],
        False,
    ),
    "misc_math": (
        lambda a, b: (
            torch.logical_xor(a > 0, b),
            a.signbit(),
            torch.ldexp(a, b.round()),
            torch.nextafter(a, b),
        ),
        [f32(5), f32(5)],
        False,
    ),
    "unfold_narrow": (lambda x: (x.unfold(1, 3, 2), x.narrow_copy(0, 1, 2)), [f32(3, 8)], True),
    "addbmm_put": (
        lambda b, x, y, t, i: (
            torch.addbmm(b, x, y),
            t.put(i, t[:3] * 2),
            t.put(i, t[:3], accumulate=True),
        ),
        [f32(3, 4), f32(2, 3, 5), f32(2, 5, 4), f32(7), lambda: torch.tensor([5, -1, 0])],
        True,
    ),
    "conv_transpose": (
        lambda x, w, b, x1, w1: (
            F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
            F.conv_transpose1d(x1, w1, stride=3, groups=2, dilation=2),
        ),
        [f32(2, 4, 5, 6), f32(4, 3, 3, 3), f32(3), f32(2, 4, 7), f32(4, 3, 2)],
        True,
    ),
    "replicate_pad_bilinear": (
        lambda x, a, b, w, bias: (
            F.pad(x, (1, 2, 2, 1), mode="replicate"),
            F.pad(x[0], (2, -1), mode="replicate"),
            F.bilinear(a, b, w, bias),
        ),
        [f32(2, 3, 4, 5), f32(6, 4), f32(6, 3), f32(5, 4, 3), f32(5)],
        True,
    ),
    # Away from the poles at the non-positive integers: reflection and the series both run.
    "special_gamma": (
        lambda x: (
            torch.lgamma(x),
            torch.digamma(x),
            torch.polygamma(1, x),
            torch.polygamma(3, x),
            torch.mvlgamma(x.abs() + 2, 3),
        ),
        [lambda: torch.cat([torch.arange(-7.0, 9.0) + 0.3, torch.arange(-7.0, 9.0) + 0.7])],
        True,
    ),
    "special_normal": (
        lambda p, x: (
            torch.erfinv(2 * p - 1),
            torch.special.ndtri(p),
            torch.special.erfcx(x),
            torch.special.log_ndtr(x),
            torch.erfc(x),
        ),
        [lambda: torch.rand(40) * 0.98 + 0.01, lambda: torch.randn(40) * 4],
        True,
    ),
    "cummax_cummin": (
        lambda x: (*torch.cummax(x, 1), *torch.cummin(x, 0)),
        [f32(5, 9)],
        True,
    ),
    "histc_searchsorted": (
        lambda x, s, v: (
            torch.histc(x, 10, -2, 2),
            torch.histc(x, 5),
            torch.searchsorted(s.sort().values, v),
            torch.searchsorted(s.sort().values, v, right=True),
            torch.isin(torch.cat([v, s[:3]]), s),
        ),
        [f32(50), f32(12), f32(6)],
        False,
    ),
    "masked_scatter": (
        lambda x, m, src: x.masked_scatter(m, src),
        [f32(4, 5), boolean(4, 5), f32(20)],
        True,
    ),
    "nonzero_static": (
        lambda x: (torch.nonzero_static(x, size=7), torch.nonzero_static(x, size=30, fill_value=9)),
        [lambda: torch.randint(0, 3, (4, 5)).float()],
        False,
    ),
    "attention": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [f32(2, 2, 8, 4), f32(2, 2, 8, 4), f32(2, 2, 8, 4)],
        True,
    ),
    "attention_gqa_mask": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
        [f32(1, 4, 6, 8), f32(1, 2, 6, 8), f32(1, 2, 6, 8), boolean(6, 6)],
        True,
    ),
}

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name", list(CASES))
def test_lowering_matches_eager(name, fresh):
    fn, makers, differentiable = CASES[name]
    torch.manual_seed(zlib.crc32(name.encode()))
    inputs = [m() for m in makers]
    if differentiable:
        inputs = [x.requires_grad_() if x.is_floating_point() else x for x in inputs]
    expected = _flat(fn(*inputs))
    compiled = torch.compile(fn, backend="neuron", fullgraph=True, dynamic=False)
    got = _flat(compiled(*inputs))
    assert neuroncc.stats()["compiles"] >= 1
    assert neuroncc.stats()["fallback_nodes"] == {}, "something ran eagerly"
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **TOL, equal_nan=True)
    if not differentiable:
        return
    leaves = [x for x in inputs if x.requires_grad]
    weights = [torch.randn_like(e) for e in expected if e.is_floating_point()]
    loss_e = sum(
        (e * w).sum() for e, w in zip([e for e in expected if e.is_floating_point()], weights)
    )
    want = torch.autograd.grad(loss_e, leaves, allow_unused=True)
    loss_g = sum((g * w).sum() for g, w in zip([g for g in got if g.is_floating_point()], weights))
    compiles = neuroncc.stats()["compiles"]
    have = torch.autograd.grad(loss_g, leaves, allow_unused=True)
    if differentiable != "views":
        assert neuroncc.stats()["compiles"] > compiles, "the backward graph was not compiled"
    assert neuroncc.stats()["fallback_nodes"] == {}, "something in the backward ran eagerly"
    for h, w in zip(have, want, strict=True):
        if w is None:
            continue
        torch.testing.assert_close(h, w, **TOL)


def test_erfinv_tail_keeps_the_gradient_accurate(fresh):
    """Near |y| = 1, erfinv's gradient sqrt(pi)/2 exp(x^2) multiplies any error in x by 2x. The
    Newton steps' residual comes from erfc there, so x stays within two ulp of the float64 value
    (erf's few ulp near 1 once gave 1.1e-6 relative error in the gradient, and a flaky
    gradient check)."""
    y = torch.cat([torch.linspace(0.5, 0.999, 500), -torch.linspace(0.5, 0.999, 500)])
    compiled = torch.compile(torch.erfinv, backend="neuron", fullgraph=True, dynamic=False)
    exact = torch.erfinv(y.double())
    err = (compiled(y).double() - exact).abs() / exact.abs()
    assert err.max() <= 2**-22  # two float32 ulp; it was 4.2e-6 with erf in the residual
