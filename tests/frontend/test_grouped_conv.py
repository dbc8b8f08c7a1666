"""Grouped and depthwise convolutions (Note [grouped convolution] in frontend/lower_conv.py):
forward and gradients against eager, and an IR whose size does not depend on the group count."""

import copy

import pytest
import torch
from torch import nn

import neuroncc
from neuroncc.ir.parser import parse

# (dims, in channels, out channels, groups, kernel, stride, padding, dilation, input size)
CASES = {
    "dw3x3": (2, 8, 8, 8, 3, 1, 1, 1, 9),
    "dw_stride2": (2, 8, 8, 8, 3, 2, 1, 1, 10),
    "dw_dilated": (2, 6, 6, 6, 3, 1, 2, 2, 9),
    "dw_multiplier2_stride2": (2, 4, 8, 4, 3, 2, 0, 1, 11),
    "dw_pad_beyond_kernel": (2, 4, 4, 4, 3, 2, 3, 1, 8),
    "dw_5x5_rect_input": (2, 4, 4, 4, 5, 1, 2, 1, (7, 12)),
    "dw1d_multiplier3": (1, 4, 12, 4, 5, 1, 2, 1, 17),
    "dw1d_stride3": (1, 4, 4, 4, 3, 3, 0, 1, 13),
    "grouped_cg2": (2, 8, 8, 4, 3, 1, 1, 1, 8),
    "grouped_stride2_dilated": (2, 8, 16, 2, 3, 2, 2, 2, 11),
    "grouped1d": (1, 6, 9, 3, 3, 2, 1, 1, 15),
}


def _conv(case: str, bias: bool = True) -> tuple[nn.Module, torch.Tensor]:
    dims, c, o, groups, kernel, stride, padding, dilation, size = CASES[case]
    cls = nn.Conv1d if dims == 1 else nn.Conv2d
    torch.manual_seed(0)
    m = cls(c, o, kernel, stride, padding, dilation, groups, bias=bias)
    size = size if isinstance(size, tuple) else (size,) * dims
    return m, torch.randn(2, c, *size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_conv_matches_eager_forward_and_backward(case, dtype, fresh):
    m, x = _conv(case, bias=case != "grouped_cg2")
    m, x = m.to(dtype), x.to(dtype)
    ref_m = copy.deepcopy(m)
    xr = x.clone().requires_grad_()
    ref = ref_m(xr)
    (ref.float() ** 2).sum().backward()
    xc = x.clone().requires_grad_()
    out = torch.compile(m, backend="neuron")(xc)
    (out.float() ** 2).sum().backward()
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    assert not neuroncc.stats()["fallback_nodes"]
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(xc.grad, xr.grad, **tol)
    for p, q in zip(m.parameters(), ref_m.parameters(), strict=True):
        scale = q.grad.float().abs().max().item()  # sums over every output position
        torch.testing.assert_close(
            p.grad.float(), q.grad.float(), atol=tol["atol"] * max(1, scale), rtol=tol["rtol"]
        )


def _ir_sizes(tmp_path, channels: int, train: bool) -> dict[str, tuple[int, int]]:
    """Per graph of a 3x3 depthwise conv: its IR nodes as lowered, and its fused kernels."""
    torch._dynamo.reset()
    m = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
    x = torch.randn(1, channels, 12, 12, requires_grad=train)
    opts = {"dump_dir": str(tmp_path / str(channels)), "timing_only": True}
    y = torch.compile(m, backend="neuron", options=opts)(x)
    if train:
        y.sum().backward()
    counts = {}
    for d in sorted((tmp_path / str(channels)).glob("graph*")):
        nodes = len(parse((d / "01-nir.txt").read_text()).nodes)
        kernels = len(parse((d / "03-fuse.txt").read_text()).kernels)
        counts[d.name.split("_", 1)[1]] = (nodes, kernels)
    return counts


@pytest.mark.parametrize("train", [False, True])
def test_depthwise_ir_does_not_grow_with_channels(tmp_path, train, fresh):
    small, large = _ir_sizes(tmp_path, 8, train), _ir_sizes(tmp_path, 64, train)
    assert small == large, (small, large)
    assert all(n < 200 for n, _ in small.values()), small
