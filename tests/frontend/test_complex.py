"""Complex numbers as pairs of reals (frontend/complex_pairs.py, Note [complex as pairs]):
rotary embeddings written with complex arithmetic compile whole, forward and backward; each rule
against eager on its own, with complex inputs and outputs crossing the graph boundary; an op
without a rule falls back, saying so."""

import cmath

import pytest
import torch

import neuroncc


def _llama4_rope(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """transformers' Llama 4 / DeepSeek-V2 rotary embedding: polar frequencies, a complex
    product, back to reals."""
    pos = torch.arange(x.shape[1], dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * 0.75  # attention scaling
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


def _run(fn, *args, backward=False):
    neuroncc.reset_stats()
    torch._dynamo.reset()
    eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    got, want = torch.compile(fn, backend="neuron")(*args), fn(*eager_args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if backward:
        seed = torch.randn_like(want.real if want.is_complex() else want)
        (got.real if got.is_complex() else got).mul(seed).sum().backward()
        (want.real if want.is_complex() else want).mul(seed).sum().backward()
        for a, e in zip(args, eager_args, strict=True):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, e.grad, atol=1e-5, rtol=1e-5)
    return neuroncc.stats()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_trains_whole(fresh, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3, 16, dtype=dtype, requires_grad=True)
    inv_freq = torch.rand(8, requires_grad=True)
    s = _run(_llama4_rope, x, inv_freq, backward=True)
    assert s["fallback_nodes"] == {}, s
    assert s["executions"] >= 2  # forward and backward ran as simulated instructions


C = torch.complex64


def _c(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=C, generator=g)


def _r(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "mul": (lambda a, b: a * b, lambda: (_c(3, 4), _c(4, seed=2))),
    "mul real tensor": (lambda a, r: r * a, lambda: (_c(3, 4), _r(3, 1))),
    "mul complex scalar": (lambda a: a * (2 - 1j), lambda: (_c(5),)),
    "add sub": (lambda a, b, r: (a + b) - r + 1.5 - (2 - a), lambda: (_c(4), _c(4, seed=3), _r(4))),
    "div": (lambda a, b, r: a / b + a / r + a / (1 + 2j), lambda: (_c(6), _c(6, seed=4), _r(6))),
    "conj neg": (lambda a: -a.conj() * a, lambda: (_c(2, 3),)),
    "abs angle": (lambda a: a.abs() + a.angle(), lambda: (_c(7),)),
    "exp": (lambda a: torch.exp(a * 0.5), lambda: (_c(3, 2),)),
    "polar complex": (
        lambda m, t: torch.polar(m, t) + torch.complex(t, m),
        lambda: (_r(4).abs(), _r(4, seed=5)),
    ),
    "movement": (
        lambda a: a.permute(2, 0, 1).transpose(-1, 0).unsqueeze(1).squeeze(1)[1:, 0].t(),
        lambda: (_c(2, 3, 4),),
    ),
    "select cat sum expand": (
        lambda a, b: torch.cat([a[:, 1:], b], -1).sum(0, keepdim=True).expand(3, -1) + a.sum(),
        lambda: (_c(2, 3), _c(2, 2, seed=6)),
    ),
    "real imag": (lambda a: a.real * 2 + a.imag, lambda: (_c(3, 3),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_equals_eager(fresh, name):
    """Complex inputs and outputs pass the boundary as view_as_real; nothing falls back."""
    fn, make = CASES[name]
    s = _run(fn, *make())
    assert s["fallback_nodes"] == {}, s
    assert s["executions"] >= 1


def test_an_op_without_a_rule_falls_back_and_says_why(fresh):
    a = _c(4)
    with pytest.warns(UserWarning, match=r"aten\.sqrt\.default eagerly.*complex64"):
        s = _run(lambda a: torch.sqrt(a * 2) + 1, a)
    assert "aten.sqrt.default" in s["fallback_nodes"], s


def test_complex_scalar_constants_are_exact(fresh):
    """Python complex scalars split into their float parts (no rounding through a tensor)."""
    z = cmath.rect(1.0, 0.3)
    _run(lambda a: a * z, _c(8))
