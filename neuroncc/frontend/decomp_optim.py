"""Fused optimizer steps as the elementwise math they fuse: `torch.optim.Adam/AdamW(fused=True)`
(the Trainer's default optimizer, `adamw_torch_fused`) calls `aten._fused_adam(w)_` on every
parameter at once. Functionalised, that is `aten._fused_adam(w)`, which returns the new
parameters, gradients and moments; here it becomes the same update PyTorch's fused kernels
compute (aten/src/ATen/native/cuda/fused_adam_utils.cuh, FusedAdamKernel.cpp), in fp32 for
low-precision tensors as their opmath does, then cast back.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _adam_step(param, grad, exp_avg, exp_avg_sq, max_sq, step, o: dict, decoupled: bool):
    """One parameter's update; its new (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)."""
    dtype = param.dtype
    up = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    p, m, v = param.to(up), exp_avg.to(up), exp_avg_sq.to(up)
    g = grad.to(up)
    if o["grad_scale"] is not None:
        g = g / o["grad_scale"].to(up)
    grad_out = g  # the kernels store the unscaled gradient back
    if o["maximize"]:
        g = -g
    lr, wd, beta1, beta2 = o["lr"], o["weight_decay"], o["beta1"], o["beta2"]
    if wd != 0:
        if decoupled:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
    m = m + (1 - beta1) * (g - m)  # lerp, as the kernels write it
    v = beta2 * v + (1 - beta2) * g * g
    step = step.to(up)
    bias1 = 1 - torch.pow(beta1, step)
    bias2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
    new_max = None
    if o["amsgrad"]:
        new_max = torch.maximum(max_sq.to(up), v)
        denom = torch.sqrt(new_max) / bias2_sqrt + o["eps"]
    else:
        denom = torch.sqrt(v) / bias2_sqrt + o["eps"]
    p = p - (lr / bias1) * m / denom
    new = [p, grad_out, m, v, new_max]
    old = [param, grad, exp_avg, exp_avg_sq, max_sq]
    if o["found_inf"] is not None:  # an overflow found by the grad scaler: nothing changes
        skip = o["found_inf"] != 0
        new = [None if n is None else torch.where(skip, x.to(up), n) for n, x in zip(new, old)]
    return [x if n is None else n.to(x.dtype) for n, x in zip(new, old)]


def _fused(decoupled: bool):
    def fused_adam(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        *,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        o = {
            "lr": lr,
            "beta1": beta1,
            "beta2": beta2,
            "weight_decay": weight_decay,
            "eps": eps,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "grad_scale": grad_scale,
            "found_inf": found_inf,
        }
        outs: list[list[torch.Tensor]] = [[], [], [], [], []]
        for k, p in enumerate(self):
            max_sq = max_exp_avg_sqs[k] if amsgrad else p.new_zeros(())
            new = _adam_step(
                p, grads[k], exp_avgs[k], exp_avg_sqs[k], max_sq, state_steps[k], o, decoupled
            )
            for out, x in zip(outs, new, strict=True):
                out.append(x)
        if not amsgrad:  # untouched (and usually empty)
            outs[4] = [t.clone() for t in max_exp_avg_sqs]
        return tuple(outs)

    return fused_adam


OPTIMIZER_DECOMPOSITIONS = {
    aten._fused_adamw.default: _fused(decoupled=True),
    aten._fused_adamw.tensor_lr: _fused(decoupled=True),
    aten._fused_adam.default: _fused(decoupled=False),
    aten._fused_adam.tensor_lr: _fused(decoupled=False),
}
