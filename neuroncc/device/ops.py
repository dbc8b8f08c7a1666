"""The `neuron` device's ATen kernels: one per op that has a backend kernel (Note [device ops]).

Note [device ops]: PyTorch looks up a kernel per op for the PrivateUse1 key; a boxed fallback
alone is not consulted under a dispatch mode (Dynamo's fake tensors), so every ATen op with a
CPU kernel and no composite one gets a kernel here (composite ops decompose into those). Each
kernel sorts its op into one of:
- allocation (`empty`, `empty_strided`) and the storage ops (`set_`, `resize_`): device memory;
- views (the schema returns an alias it does not write): PyTorch's own view kernel, which
  only makes a TensorImpl over the same storage (no data is read);
- copies between devices and reading a scalar (`_copy_from`, `copy_`, `_local_scalar_dense`):
  the DMA between host memory and HBM, done on the host views (Note [device memory]);
- random ops: drawn on the host with PyTorch's CPU generator, so they equal CPU results under
  `torch.manual_seed` (counted in stats()["eager_host_random"]);
- everything else: compiled and run on the simulator (Note [eager ops]).
"""

from __future__ import annotations

import functools
import math

import torch

from neuroncc.device import autocast, eager, memory

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_LIBRARIES: list[torch.library.Library] = []  # registrations live as long as their Library


def register_all() -> int:
    """A kernel for every ATen op with a backend kernel; how many."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    lib = torch.library.Library("aten", "IMPL")
    count = 0
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        special = name[len("aten::") :] in _SPECIAL
        if not special and (not has(name, "CPU") or has(name, "CompositeImplicitAutograd")):
            continue
        qualified = name[len("aten::") :]
        lib.impl(qualified, _Kernel(qualified), "PrivateUse1")
        count += 1
    _LIBRARIES.append(lib)
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _LIBRARIES.append(fallthrough)  # ops autocast leaves alone run as they are
    casts = torch.library.Library("aten", "IMPL")
    autocast.register(casts)
    _LIBRARIES.append(casts)
    return count


class _Kernel:
    """The kernel of one op, its handling chosen on its first call."""

    def __init__(self, qualified: str) -> None:
        self.qualified = qualified
        self.handle = None

    def __call__(self, *args, **kwargs):
        if self.handle is None:
            base, _, overload = self.qualified.partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            self.handle = _handler(op)
        return self.handle(*args, **kwargs)


def _handler(op: torch._ops.OpOverload):
    special = _SPECIAL.get(op.name().removeprefix("aten::"))
    if special is not None:
        return special
    if _is_view(op):
        return functools.partial(op._handle.redispatch_boxed, _CPU)  # (op.redispatch's own)
    if torch.Tag.nondeterministic_seeded in op.tags:
        return lambda *args, **kwargs: _random(op, args, kwargs)
    return lambda *args, **kwargs: eager.run(op, args, kwargs)


def _is_view(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return any(r.alias_info is not None for r in schema.returns)


def _random(op, args, kwargs):
    """A random op drawn on the host views with the CPU generator (equal to CPU results)."""
    from neuroncc.runtime.stats import STATS

    STATS.add("eager_host_random")

    def host(x):
        return memory.host_view(x) if isinstance(x, torch.Tensor) and _on_device(x) else x

    hosts = torch.utils._pytree.tree_map(host, (args, kwargs))
    out = op(*hosts[0], **hosts[1])
    if _returns_alias(op):
        return eager.results(op, args, kwargs, [])
    return eager.results(op, args, kwargs, list(out) if isinstance(out, tuple) else [out])


def _returns_alias(op) -> bool:
    return all(r.alias_info is not None for r in op._schema.returns)


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == memory.DEVICE


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return memory.empty(size, dtype)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return memory.empty_strided(size, stride, dtype)


def _copy_from(self, dst, non_blocking=False):
    """self into dst, one of them on the device: a DMA between host memory and HBM."""
    src = memory.host_view(self) if _on_device(self) else self
    out = memory.host_view(dst) if _on_device(dst) else dst
    out.copy_(src)
    return dst


def _copy_from_and_resize(self, dst):
    dst.resize_(self.shape)
    return _copy_from(self, dst)


def _copy_(self, src, non_blocking=False):
    """copy_ with a device tensor on either side: a DMA between host memory and HBM (or
    within HBM). A conversion between device tensors runs compiled (Note [eager ops]); one
    between the host and the device is done by the host as it copies."""
    if _on_device(src) and _on_device(self) and src.dtype != self.dtype:
        src = eager.run(torch.ops.aten._to_copy.default, (src,), {"dtype": self.dtype})
    dst = memory.host_view(self) if _on_device(self) else self
    dst.copy_(memory.host_view(src) if _on_device(src) else src)
    return self


def _resize_(self, size, memory_format=None):
    """Grow the storage if the new size needs more bytes (keeping the old bytes), then
    PyTorch's own resize of the metadata."""
    size = tuple(size)
    need = (self.storage_offset() + math.prod(size)) * self.element_size()
    storage = self.untyped_storage()
    if need > storage.nbytes():
        bigger = memory.empty((need,), torch.uint8)
        memory.host_view(bigger)[: storage.nbytes()].copy_(memory.host_bytes(storage))
        self.set_(bigger.untyped_storage(), self.storage_offset(), size)
        return self
    return self.set_(storage, self.storage_offset(), size, memory.contiguous_strides(size))


def _set_storage(self, source, storage_offset=0, size=(), stride=()):
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU, self, source, storage_offset, size, stride
    )


def _convolution(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    """PyTorch sends a convolution on a device it does not know here: compiled as
    aten.convolution, the op the compiler lowers."""
    args = (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return eager.run(torch.ops.aten.convolution.default, args, {})


def _convolution_backward(
    grad, input, weight, stride, padding, dilation, transposed, output_padding, groups, mask
):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]] if mask[2] else None
    args = (grad, input, weight, bias_sizes, stride, padding, dilation, transposed)
    args = (*args, output_padding, groups, mask)
    return eager.run(torch.ops.aten.convolution_backward.default, args, {})


def _fused_adam(functional: str):
    """`_fused_adam(w)_` (Adam/AdamW with fused=True, the Trainer's default) run as its
    functional form, whose new parameters, gradients and moments are written into the lists
    it updates, as eager.run writes an in-place op's values: functionalising the in-place op
    itself fails on the empty `max_exp_avg_sqs` list of every step without amsgrad."""
    base, overload = functional.split(".")
    op = getattr(getattr(torch.ops.aten, base), overload)
    names = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")

    def step(*args, **kwargs):
        new = eager.run(op, args, kwargs)
        written = [*args[:5], *(kwargs[name] for name in names[len(args) :])]
        for tensors, values in zip(written, new, strict=True):
            for t, v in zip(tensors, values, strict=True):
                memory.host_view(t).copy_(memory.host_view(v))

    return step


def _local_scalar_dense(self):
    return memory.host_view(self).item()


_SPECIAL = {
    "empty.memory_format": _empty,
    "empty_strided": _empty_strided,
    "_copy_from": _copy_from,
    "_copy_from_and_resize": _copy_from_and_resize,
    "copy_": _copy_,
    "resize_": _resize_,
    "set_.source_Storage_storage_offset": _set_storage,
    "set_.source_Storage": lambda self, source: _set_storage(
        self, source, 0, (source.nbytes() // self.element_size(),), (1,)
    ),
    "_local_scalar_dense": _local_scalar_dense,
    "convolution_overrideable": _convolution,
    "convolution_backward_overrideable": _convolution_backward,
    "_fused_adamw_": _fused_adam("_fused_adamw.default"),
    "_fused_adamw_.tensor_lr": _fused_adam("_fused_adamw.tensor_lr"),
    "_fused_adam_": _fused_adam("_fused_adam.default"),
    "_fused_adam_.tensor_lr": _fused_adam("_fused_adam.tensor_lr"),
}
