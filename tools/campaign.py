"""The no-silent-failures campaign: the modules users build, at the shapes that break compilers,
through torch.compile(backend="neuron") against eager PyTorch.

    python tools/campaign.py                      # every family, 40 cases each, fp32 and bf16
    python tools/campaign.py --cases 400 --families linear,conv2d --json found.json

Per family a hypothesis strategy draws a module and its inputs: unit and zero-size dimensions,
sizes off the multiples of 128 and 512, free sizes from 1 to past SBUF (vocabularies of 32k to
256k), ranks 1 to 5, fp32 and bf16, forward and training (gradients of every parameter and
input). A case passes when nothing failed inside neuroncc (`stats()["compiler_errors"]`), no op
fell back (`fallback_nodes`), something was compiled, and outputs and gradients match eager.
The tool runs the cases without stopping and groups the failures by what went wrong; the tests
(tests/e2e/test_campaign.py) run a fixed, small draw of the same strategies.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import nn

import neuroncc

# Sizes that break compilers: unit, odd, around the 128 partitions and the 512-wide PSUM bank.
EDGE = [1, 2, 3, 5, 7, 8, 31, 64, 127, 128, 129, 255, 256, 257, 511, 512, 513, 640, 1000]
SMALL = [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 33]
VOCABS = [32000, 50257, 128256, 151936, 256000]  # free sizes past SBUF, with few rows
MAX_ELEMENTS = 1 << 21  # per tensor: what the simulator runs in about a second


@dataclass
class Case:
    """A module and its inputs; `what` describes it in one line (how a failure is reported)."""

    what: str
    module: nn.Module
    inputs: list[torch.Tensor]
    train: bool = True
    # Ops a case may leave to PyTorch (none, unless a family says why).
    allowed_fallback: set[str] = field(default_factory=set)


@dataclass
class Outcome:
    what: str
    ok: bool
    problem: str = ""
    seconds: float = 0.0


def _sizes(draw, options: list[int], rank: int) -> tuple[int, ...]:
    return tuple(draw(st.sampled_from(options)) for _ in range(rank))


def _fits(*shapes: tuple[int, ...]) -> bool:
    return all(_numel(s) <= MAX_ELEMENTS for s in shapes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _lead(draw, max_rank: int = 3) -> tuple[int, ...]:
    """Leading (batch) dims: none to max_rank of them, a zero-size batch now and then."""
    rank = draw(st.integers(0, max_rank))
    lead = _sizes(draw, SMALL, rank)
    if lead and draw(st.integers(0, 9)) == 0:
        lead = (0, *lead[1:])
    return lead


@st.composite
def linear(draw) -> Case:
    fin, fout = draw(st.sampled_from(EDGE)), draw(st.sampled_from(EDGE + VOCABS[:2]))
    lead = _lead(draw)
    bias = draw(st.booleans())
    shape = (*lead, fin)
    if not _fits(shape, (fin, fout), (*lead, fout)):
        fout = draw(st.sampled_from(EDGE))
    m = nn.Linear(fin, fout, bias=bias)
    return Case(f"Linear({fin}, {fout}, bias={bias}) on {list(shape)}", m, [torch.randn(shape)])


class _Embed(nn.Module):
    def __init__(self, num: int, dim: int, padding_idx: int | None) -> None:
        super().__init__()
        self.emb = nn.Embedding(num, dim, padding_idx=padding_idx)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.emb(idx)


@st.composite
def embedding(draw) -> Case:
    num = draw(st.sampled_from([1, 2, 7, 128, 129, 1000, *VOCABS[:2]]))
    dim = draw(st.sampled_from(EDGE))
    while not _fits((num, dim)):
        dim = draw(st.sampled_from(EDGE))
    lead = _lead(draw, 3) or (draw(st.sampled_from(SMALL)),)
    padding = draw(st.sampled_from([None, 0])) if num > 1 else None
    idx = torch.randint(0, num, lead)
    m = _Embed(num, dim, padding)
    return Case(f"Embedding({num}, {dim}, padding_idx={padding}) on {list(lead)}", m, [idx])


@st.composite
def conv(draw, dims: int) -> Case:
    cin = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, cin) if cin % g == 0]))
    cout = groups * draw(st.sampled_from([1, 2, 3]))
    kernel = draw(st.sampled_from([1, 2, 3, 5]))
    stride, dilation = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    padding = draw(st.sampled_from([0, 1, 2]))
    reach = dilation * (kernel - 1) + 1
    space = tuple(
        draw(st.integers(max(1, reach - 2 * padding), 24 if dims == 2 else 130))
        for _ in range(dims)
    )
    batch = draw(st.sampled_from([1, 2, 3]))
    cls = nn.Conv1d if dims == 1 else nn.Conv2d
    m = cls(cin, cout, kernel, stride, padding, dilation, groups, bias=draw(st.booleans()))
    shape = (batch, cin, *space)
    what = (
        f"{cls.__name__}({cin}, {cout}, {kernel}, stride={stride}, padding={padding}, "
        f"dilation={dilation}, groups={groups}) on {list(shape)}"
    )
    return Case(what, m, [torch.randn(shape)])


class _RMSNorm(nn.Module):  # as Llama writes it, in fp32 and back
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


@st.composite
def norm(draw) -> Case:
    kind = draw(st.sampled_from(["layer", "layer_no_affine", "rms", "torch_rms", "group", "batch"]))
    dim = draw(st.sampled_from(EDGE + VOCABS[:1]))
    lead = _lead(draw, 3) or (draw(st.sampled_from(SMALL)),)
    if not _fits((*lead, dim)):
        dim = draw(st.sampled_from(EDGE))
    if kind in ("group", "batch"):
        channels = draw(st.sampled_from([2, 4, 6, 8, 16]))
        shape = (max(lead[0], 2), channels, *lead[1:], *([dim % 97 + 1]))
        if kind == "group":
            m: nn.Module = nn.GroupNorm(draw(st.sampled_from([1, 2])), channels)
        else:
            m = (nn.BatchNorm1d if len(shape) == 3 else nn.BatchNorm2d)(channels)
            shape = shape[:4] if len(shape) > 4 else shape
        return Case(f"{type(m).__name__} on {list(shape)}", m, [torch.randn(shape)])
    shape = (*lead, dim)
    if kind == "rms":
        m = _RMSNorm(dim)
    elif kind == "torch_rms":
        m = nn.RMSNorm(dim, eps=1e-6)
    else:
        m = nn.LayerNorm(dim, elementwise_affine=kind == "layer")
    return Case(f"{kind} norm({dim}) on {list(shape)}", m, [torch.randn(shape)])


class _Attention(nn.Module):
    def __init__(self, causal: bool, masked: bool) -> None:
        super().__init__()
        self.causal, self.masked = causal, masked

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


@st.composite
def attention(draw) -> Case:
    b, h = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3, 4]))
    sq, sk = draw(st.sampled_from(EDGE[:14])), draw(st.sampled_from(EDGE[:14]))
    d = draw(st.sampled_from([1, 8, 16, 32, 64, 80, 128]))
    causal = draw(st.booleans()) and sq == sk
    masked = not causal and draw(st.booleans())
    q, k, v = torch.randn(b, h, sq, d), torch.randn(b, h, sk, d), torch.randn(b, h, sk, d)
    inputs = [q, k, v]
    if masked:
        inputs.append(torch.rand(b, 1, sq, sk) > 0.3)
    what = f"sdpa q={list(q.shape)} k={list(k.shape)} causal={causal} bool_mask={masked}"
    return Case(what, _Attention(causal, masked), inputs)


class _Fn(nn.Module):
    def __init__(self, fn: Callable, text: str) -> None:
        super().__init__()
        self.fn, self.text = fn, text

    def forward(self, *xs):
        return self.fn(*xs)


@st.composite
def pooling(draw) -> Case:
    dims = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["max", "avg", "adaptive_avg", "adaptive_max"]))
    space = tuple(draw(st.integers(1, 40)) for _ in range(dims))
    batch = draw(st.sampled_from([0, 1, 2])) if kind.startswith("adaptive") else 2
    shape = (batch, draw(st.sampled_from([1, 3, 8])), *space)
    if kind.startswith("adaptive"):
        out = draw(st.integers(1, 9))
        fn = getattr(F, f"{kind}_pool{dims}d")
        text = f"{fn.__name__}(x, {out}) on {list(shape)}"
        return Case(text, _Fn(lambda x: fn(x, out), text), [torch.randn(shape)])
    k = draw(st.integers(1, max(1, min(space))))
    stride = draw(st.integers(1, 3))
    pad = draw(st.integers(0, k // 2))
    ceil = draw(st.booleans())
    fn = getattr(F, f"{kind}_pool{dims}d")
    text = (
        f"{fn.__name__}(x, {k}, stride={stride}, padding={pad}, ceil_mode={ceil}) on {list(shape)}"
    )
    return Case(
        text,
        _Fn(lambda x: fn(x, k, stride=stride, padding=pad, ceil_mode=ceil), text),
        [torch.randn(shape)],
    )


@st.composite
def loss(draw) -> Case:
    kind = draw(
        st.sampled_from(["cross_entropy", "nll", "mse", "l1", "smooth_l1", "bce_logits", "kl"])
    )
    rows = draw(st.sampled_from([1, 2, 3, 7, 64, 129]))
    classes = draw(st.sampled_from([2, 5, 128, 1000, *VOCABS]))
    while not _fits((rows, classes)):
        rows = draw(st.sampled_from([1, 2, 3]))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    x = torch.randn(rows, classes)
    if kind in ("cross_entropy", "nll"):
        target = torch.randint(0, classes, (rows,))
        target[0] = -100 if draw(st.booleans()) else target[0]
        smoothing = draw(st.sampled_from([0.0, 0.1])) if kind == "cross_entropy" else 0.0

        def fn(x, t):
            if kind == "nll":
                return F.nll_loss(F.log_softmax(x, -1), t, reduction=reduction)
            return F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)

        text = f"{kind}({list(x.shape)}, reduction={reduction}, smoothing={smoothing})"
        return Case(text, _Fn(fn, text), [x, target])
    y = torch.rand(rows, classes) if kind in ("bce_logits", "kl") else torch.randn(rows, classes)
    fns = {
        "mse": F.mse_loss,
        "l1": F.l1_loss,
        "smooth_l1": F.smooth_l1_loss,
        "bce_logits": F.binary_cross_entropy_with_logits,
        "kl": lambda a, b, reduction: F.kl_div(
            F.log_softmax(a, -1), b, reduction="batchmean" if reduction == "mean" else reduction
        ),
    }
    text = f"{kind}({list(x.shape)}, reduction={reduction})"
    return Case(text, _Fn(lambda a, b: fns[kind](a, b, reduction=reduction), text), [x, y])


@st.composite
def softmax(draw) -> Case:
    free = draw(st.sampled_from([1, 2, 3, 127, 129, 513, 4099, *VOCABS]))
    lead = _lead(draw, 2)
    while not _fits((*lead, free)):
        lead = lead[1:]
    kind = draw(st.sampled_from(["softmax", "log_softmax", "logsumexp"]))
    fn = {"softmax": torch.softmax, "log_softmax": torch.log_softmax, "logsumexp": torch.logsumexp}
    text = f"{kind}(x, -1) on {[*lead, free]}"
    return Case(text, _Fn(lambda x: fn[kind](x, -1), text), [torch.randn(*lead, free)])


@st.composite
def elementwise(draw) -> Case:
    rank = draw(st.integers(1, 5))
    shape = _sizes(draw, SMALL + [127, 129, 513], rank)
    while not _fits(shape):
        shape = shape[1:]
    kind = draw(st.sampled_from(["gelu", "silu", "tanh_gelu", "swiglu", "residual_scale"]))
    fns = {
        "gelu": lambda x: F.gelu(x),
        "silu": lambda x: F.silu(x) * 2,
        "tanh_gelu": lambda x: F.gelu(x, approximate="tanh"),
        "swiglu": lambda x: F.silu(x) * torch.sigmoid(x.flip(-1)),
        "residual_scale": lambda x: (x + x.mean(0, keepdim=True)) * 0.5,
    }
    text = f"{kind} on {list(shape)}"
    return Case(text, _Fn(fns[kind], text), [torch.randn(shape)])


class _InvertedResidual(nn.Module):  # MobileNetV2 / EfficientNet, with squeeze-excite
    def __init__(self, c: int, expand: int, kernel: int, stride: int, se: bool) -> None:
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.dw = nn.Sequential(
            nn.Conv2d(h, h, kernel, stride, kernel // 2, groups=h, bias=False),
            nn.BatchNorm2d(h),
            nn.Hardswish(),
        )
        self.se = (
            nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Conv2d(h, max(1, h // 4), 1),
                nn.SiLU(),
                nn.Conv2d(max(1, h // 4), h, 1),
                nn.Hardsigmoid(),
            )
            if se
            else None
        )
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        self.residual = stride == 1

    def forward(self, x):
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = y * self.se(y)
        y = self.project(y)
        return x + y if self.residual else y


class _ConvNeXtBlock(nn.Module):  # depthwise 7x7, LayerNorm over channels last, MLP, scale
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return x + (self.gamma * self.mlp(y)).permute(0, 3, 1, 2)


@st.composite
def vision(draw) -> Case:
    c = draw(st.sampled_from([4, 8, 16, 24]))
    side = draw(st.integers(3, 20))
    batch = draw(st.sampled_from([1, 2]))
    if draw(st.booleans()):
        expand, kernel = draw(st.sampled_from([1, 3, 6])), draw(st.sampled_from([3, 5]))
        stride, se = draw(st.sampled_from([1, 2])), draw(st.booleans())
        m: nn.Module = _InvertedResidual(c, expand, kernel, stride, se)
        what = f"InvertedResidual(c={c}, expand={expand}, k={kernel}, stride={stride}, se={se})"
    else:
        m, what = _ConvNeXtBlock(c), f"ConvNeXtBlock(c={c})"
    shape = (batch, c, side, side)
    return Case(f"{what} on {list(shape)}", m, [torch.randn(shape)])


FAMILIES: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "linear": linear,
    "embedding": embedding,
    "conv1d": lambda: conv(1),
    "conv2d": lambda: conv(2),
    "norm": norm,
    "attention": attention,
    "pooling": pooling,
    "loss": loss,
    "softmax": softmax,
    "elementwise": elementwise,
    "vision": vision,
}


# -- running a case -------------------------------------------------------------------------

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2}


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    both_nan = torch.isnan(got) & torch.isnan(want)
    same_inf = torch.isinf(want) & (got == want)
    diff = torch.where(both_nan | same_inf, 0.0, (got - want).abs())
    scale = torch.where(torch.isfinite(want), want.abs(), 0.0).max().item() + 1e-6
    return diff.max().item() / scale


def _cast(case: Case, dtype: torch.dtype) -> tuple[nn.Module, list[torch.Tensor]]:
    module = copy.deepcopy(case.module).to(dtype)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in case.inputs]
    return module, inputs


def _run(module: nn.Module, fn: Callable, inputs: list, train: bool) -> list[torch.Tensor]:
    """Outputs, then the gradients of every parameter and float input (of a fixed random
    weighting of the outputs)."""
    xs = [x.detach().clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
    module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        out = fn(*xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not train:
        return outs
    float_outs = [o for o in outs if o.is_floating_point() and o.requires_grad]
    if not float_outs:
        return outs
    gen = torch.Generator().manual_seed(1)
    total = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in float_outs)
    total.backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    grads += [x.grad for x in xs if x.grad is not None]
    return [o.detach() for o in outs] + grads


def check(case: Case, dtype: torch.dtype = torch.float32, train: bool | None = None) -> Outcome:
    """Compile `case` and compare it with eager; never raises. Both are measured against the
    same computation in float64 (from the same rounded parameters and inputs): the compiled
    result may be off by the dtype's tolerance, or by twice what eager itself is off, whichever
    is more (eager fp32 is off by 1e-3 where a ReLU6 meets its clip, say). See Note [results
    eager cannot resolve] for the references a result that fails this gets."""
    train = case.train if train is None else train
    start = time.perf_counter()
    torch.manual_seed(0)
    module, inputs = _cast(case, dtype)
    what = f"{case.what} {str(dtype).removeprefix('torch.')} {'train' if train else 'forward'}"
    try:
        want = _run(module, module, inputs, train)
        exact = _float64(module, inputs, train)
    except Exception as e:  # noqa: BLE001  (eager rejects it: not a case)
        return Outcome(what, True, f"skipped: eager fails ({type(e).__name__})")
    torch._dynamo.reset()
    neuroncc.reset_stats()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = torch.compile(module, backend="neuron", options={"disk_cache": False})
            got = _run(module, compiled, inputs, train)
    except Exception as e:  # noqa: BLE001
        line = next((ln for ln in str(e).splitlines() if "Error" in ln), str(e).splitlines()[0])
        return Outcome(what, False, f"raised {type(e).__name__}: {line[:300]}", _since(start))
    s = neuroncc.stats()
    problems = []
    if s["compiler_errors"]:
        problems.append(f"internal compiler error at {s['compiler_errors']}")
    declined = set(s["fallback_nodes"]) - case.allowed_fallback
    if declined:
        problems.append(f"fell back: {sorted(declined)}")
    compiled_or_cached = s["compiles"] + s["cache_hits_memory"] + s["cache_hits_disk"]
    if compiled_or_cached == 0 and s["dynamo_graphs"] > 0 and any(t.numel() for t in want):
        problems.append("nothing compiled")
    mismatches = _mismatches(got, [want], exact, TOLERANCE[dtype])
    if mismatches and exact is not None:
        mismatches = _mismatches(
            got, _rounding_samples(module, inputs, train, want, dtype), exact, TOLERANCE[dtype]
        )
    problems += mismatches
    return Outcome(what, not problems, "; ".join(problems), _since(start))


# Note [results eager cannot resolve]
# Some results are ill-conditioned in the dtype: the gradient of a BatchNorm's weight when a
# training-mode BatchNorm follows it is a sum whose exact value is near zero (the second norm
# removes what the first scales), so every fp32 computation of it is mostly rounding: eager
# is off by 1e-3 to 3 relative, neuroncc likewise. LayerNorm over two elements is another. One
# eager run says little about how far the dtype's rounding can take such a result, so a
# result that fails against eager gets more references: PyTorch's decomposed graph
# (`aot_eager_decomp_partition`, the algorithm neuroncc lowers) and eager on inputs and
# parameters nudged by a few units in the last place. The nudge moves the exact result by
# ~1e-7 (it is the float64 computation's own sensitivity), so each nudged run's error against
# float64 is a fresh sample of eager's rounding error (fp32 only: bf16 data is computed in fp32,
# and its own last place, 1%, is no rounding sample). The compiled result passes if it is
# within twice the worst sample; a miscompile stays far outside them. Only failing results
# pay for the extra runs.
NUDGES = 4


def _rounding_samples(
    module: nn.Module, inputs: list, train: bool, want: list, dtype: torch.dtype
) -> list[list]:
    samples = [want]
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = torch.compile(module, backend="aot_eager_decomp_partition")
        try:
            samples.append(_run(module, fn, inputs, train))
        except Exception as e:  # noqa: BLE001  (no decomposed reference: the others decide)
            print(f"(no decomposed reference: {type(e).__name__})", file=sys.stderr)
    if dtype != torch.float32:
        return samples  # a bf16 input's last place is 1%: a nudge there is no rounding sample
    for seed in range(NUDGES):
        gen = torch.Generator().manual_seed(seed)
        nudged = copy.deepcopy(module)
        with torch.no_grad():
            for p in nudged.parameters():
                p.copy_(_nudge(p, gen))
        xs = [_nudge(x, gen) if x.is_floating_point() else x for x in inputs]
        samples.append(_run(nudged, nudged, xs, train))
    return samples


def _nudge(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """t moved by up to two units in the last place of its dtype, at random."""
    ulp = torch.finfo(t.dtype).eps
    noise = (2 * torch.rand(t.shape, generator=gen) - 1) * (2 * ulp)
    return (t.detach().float() * (1 + noise)).to(t.dtype)


def _float64(module: nn.Module, inputs: list[torch.Tensor], train: bool) -> list | None:
    """The case computed in float64 from the same (rounded) values, or None if eager cannot."""
    exact = copy.deepcopy(module).double()
    try:
        return _run(
            exact, exact, [x.double() if x.is_floating_point() else x for x in inputs], train
        )
    except Exception:  # noqa: BLE001  (an op without float64: compare with eager alone)
        return None


def _mismatches(got: list, samples: list[list], exact: list | None, tol: float) -> list[str]:
    """Results off by more than the dtype's tolerance and twice the worst reference sample
    (each sample a list of results; eager alone, without a float64 computation)."""
    want = samples[0]
    if len(got) != len(want):
        return [f"{len(got)} results, eager has {len(want)}"]
    problems = []
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if exact is None:
            err, allowed = _rel_error(a, b), tol
        else:
            err = _rel_error(a, exact[i])
            allowed = max(
                tol, *(2 * _rel_error(s[i], exact[i]) for s in samples if len(s) == len(got))
            )
        if err > allowed:
            problems.append(f"result {i} {list(b.shape)} off by {err:.2e} (allowed {allowed:.1e})")
    return problems


def _since(start: float) -> float:
    return time.perf_counter() - start


# -- the tool -------------------------------------------------------------------------------


def campaign(families: list[str], cases: int, seed: int | None, progress: bool) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for family in families:
        _family_test(family, cases, seed, progress, outcomes)()
    return outcomes


def _family_test(family: str, cases: int, seed: int | None, progress: bool, outcomes: list):
    """The hypothesis test of one family (a function of its own: @given takes no defaults to
    bind a loop variable with)."""

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        derandomize=seed is not None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=FAMILIES[family](), bf16=st.booleans(), train=st.booleans())
    def run(case: Case, bf16: bool, train: bool) -> None:
        outcome = check(case, torch.bfloat16 if bf16 else torch.float32, train)
        outcomes.append(outcome)
        if progress:
            mark = "ok  " if outcome.ok else "FAIL"
            print(f"{mark} {outcome.seconds:5.1f}s {family}: {outcome.what}", file=sys.stderr)
            if not outcome.ok:
                print(f"       {outcome.problem}", file=sys.stderr)

    return run


def _signature(problem: str) -> str:
    """What a failure is, without its sizes: failures of one cause group together."""
    import re

    return re.sub(r"\d+", "N", problem)[:160]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    p.add_argument("--cases", type=int, default=40, help="cases per family (default 40)")
    p.add_argument("--seed", type=int, help="a fixed draw (default: random)")
    p.add_argument("--json", help="write every outcome here")
    args = p.parse_args(argv)
    families = args.families.split(",")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        p.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    outcomes = campaign(families, args.cases, args.seed, progress=True)
    failed = [o for o in outcomes if not o.ok]
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for o in failed:
        groups[_signature(o.problem)].append(o)
    print(f"\n{len(outcomes)} cases, {len(failed)} failed, {len(groups)} distinct problems")
    for sig, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"\n[{len(members)}] {sig}\n    e.g. {members[0].what}\n    {members[0].problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([o.__dict__ for o in outcomes], f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
