"""Note [cross entropy traced]: on meta tensors (timing_only estimates) AOTAutograd traces
F.cross_entropy without its gradient: PyTorch 2.13 reaches `aten::nll_loss` there through a
kernel below the Autograd key ("an autograd kernel was not registered", and the backward
graph returns no gradient at all), so an estimated training step had no loss gradient, and
through it none of the model's. The Dynamo graph's cross_entropy calls become the same math
in ops whose gradients every device traces: log_softmax, then the target's entry picked by
gather, ignored targets zeroed and, for "mean", the sum over the targets counted, as
aten.nll_loss_forward computes it (a mean over no targets is nan, as PyTorch's). The zeroing is
a masked_fill: `torch.where(mask, x, 0.0)`, a Python scalar beside a tensor, loses x's
gradient the same way on meta (aten's nll_loss decomposition is made of such wheres). Calls this
does not cover (class weights, label smoothing, probabilities as targets, the deprecated
size_average / reduce) stay PyTorch's. On every device, so that an estimate on meta compiles
what a run on CPU compiles. The same bug in a model's own torch.where calls: Note [where with
a scalar traced], below.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_CROSS_ENTROPY = F.cross_entropy


def _cross_entropy(
    input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
    reduction="mean", label_smoothing=0.0,
):  # fmt: skip
    plain = (weight is None and size_average is None and reduce is None
             and label_smoothing == 0.0 and not target.is_floating_point()
             and input.dim() >= 1 and reduction in ("mean", "sum", "none"))  # fmt: skip
    if not plain:
        return _CROSS_ENTROPY(
            input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing
        )
    classes = 1 if input.dim() > 1 else 0
    logp = torch.log_softmax(input, classes)
    kept = target != ignore_index
    picked = torch.gather(logp, classes, torch.where(kept, target, 0).unsqueeze(classes))
    losses = (-picked.squeeze(classes)).masked_fill(~kept, 0.0)  # (not where: see the Note)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / kept.sum().to(losses.dtype)


# Note [where with a scalar traced]: the same PyTorch bug, in user code. `torch.where(cond,
# x, 0.0)` (a Python scalar beside a tensor) traced by AOTAutograd on meta tensors gives x no
# gradient: its backward returns None, so an estimated training step silently leaves out
# every gradient that flows through it. With the scalar as a 0-dim tensor it has one. The
# Dynamo graph's torch.where calls with one tensor and one Python scalar among the two
# values get the scalar as a 0-dim tensor of the dtype PyTorch gives that scalar (bool,
# int64, the default float), which promotes as the scalar did: a dimensioned operand of its
# kind keeps its dtype. On every device, as cross entropy's rewrite is.
_WHERE = torch.where


def _scalar_dtype(s) -> torch.dtype | None:
    if isinstance(s, bool):
        return torch.bool
    if isinstance(s, int):
        return torch.int64
    if isinstance(s, float):
        return torch.get_default_dtype()
    return None  # (complex, symbolic: left as they are)


def _where(condition, *args, **kwargs):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(args) != 2 or kwargs or len(tensors) != 1 or not tensors[0].requires_grad:
        return _WHERE(condition, *args, **kwargs)
    like = tensors[0]
    values = []
    for a in args:
        dtype = None if a is like else _scalar_dtype(a)
        values.append(a if dtype is None else torch.full((), a, dtype=dtype, device=like.device))
    return _WHERE(condition, *values)


# The Dynamo graph's calls the backend retargets (backend._aot) so that their gradients are
# traced on meta too: cross entropy's and where's (not only losses).
GRADIENT_CALLS = {_CROSS_ENTROPY: _cross_entropy, _WHERE: _where}
