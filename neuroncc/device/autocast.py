"""`torch.autocast("neuron", dtype=...)`: CUDA's op lists, applied on the `neuron` device.

PyTorch keeps autocast's per-op casts in C++ for its own devices only; a Python PrivateUse1
backend registers them itself, on the AutocastPrivateUse1 key. The lists below are CUDA's, as
PyTorch 2.13 declares them (ATen/autocast_mode.h: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE), so code tuned under CUDA's autocast runs in
the same precisions here. Every other op falls through (runs in the dtypes it is given).
Unlike CUDA, casts of weights are not cached within a region: each op casts again (the cost
is the eager ops' own, not a difference in results).
"""

from __future__ import annotations

import functools

import torch

# Run in the autocast dtype (bf16 / fp16).
LOWER_PRECISION = [
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
]
# Run in fp32 (and the set-dtype ones with their lower-precision inputs made fp32).
FP32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
]
# Run in the widest floating dtype among their arguments.
PROMOTE = [
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
]

_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def register(lib: torch.library.Library) -> int:
    """Autocast kernels for the listed ops on `lib` (an aten IMPL library); how many."""
    count = 0
    for policy, names in (("lower", LOWER_PRECISION), ("fp32", FP32), ("promote", PROMOTE)):
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(torch.ops.aten, base, None)
            op = getattr(packet, overload or "default", None) if packet is not None else None
            if op is None:
                continue  # not an op of this torch
            lib.impl(name, _kernel(op, policy), "AutocastPrivateUse1")
            count += 1
    return count


def _kernel(op, policy: str):
    def autocast(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("neuron")
            cast = _casting(lambda t: t.dtype == torch.float32, dtype)
        elif policy == "fp32":
            cast = _casting(lambda t: t.dtype in (torch.float16, torch.bfloat16), torch.float32)
        else:
            floats = [
                x.dtype
                for x in torch.utils._pytree.tree_leaves((args, kwargs))
                if isinstance(x, torch.Tensor) and x.dtype in _FLOATS
            ]
            widest = functools.reduce(torch.promote_types, floats) if floats else None
            cast = _casting(lambda t: widest is not None and t.dtype != widest, widest)
        args, kwargs = torch.utils._pytree.tree_map(cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_KEY):
            return op(*args, **kwargs)

    return autocast


def _casting(wanted, dtype):
    def cast(x):
        on_device = isinstance(x, torch.Tensor) and x.device.type == "neuron"
        if on_device and x.dtype in _FLOATS and wanted(x):
            return x.to(dtype)
        return x

    return cast
