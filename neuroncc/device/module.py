"""`torch.neuron`: the device module users and libraries call, as `torch.cuda` for CUDA.

One simulated NeuronCore per process (as under `torchrun`, one core per rank): device_count()
is 1. PyTorch's Python device guard for PrivateUse1 knows one device only (its deviceCount is
fixed at 1), so more devices in one process would break autograd.
"""

from __future__ import annotations

import contextlib

import torch

from neuroncc.device.clock import Event  # noqa: F401 (torch.neuron.Event)
from neuroncc.device.memory import HBM


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    index = torch.device(device).index if not isinstance(device, int) else device
    if index not in (None, 0):
        raise ValueError(f"neuron:{index} does not exist: one NeuronCore per process (neuron:0)")


@contextlib.contextmanager
def device(index):
    set_device(index)
    yield


def get_device_name(device=None) -> str:
    import os

    return f"NeuronCore ({os.environ.get('NEURONCC_TARGET') or 'trn2'}, simulated)"


def synchronize(device=None) -> None:
    """Every op issued so far has finished (Note [device clock])."""


def manual_seed(seed: int) -> None:
    """Random ops on the device draw from PyTorch's CPU generator (Note [device ops]), so
    seeding the device seeds that (torch.manual_seed calls this after seeding it)."""
    torch.default_generator.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(seed)


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(new_state)


def memory_allocated(device=None) -> int:
    return HBM.allocated


def max_memory_allocated(device=None) -> int:
    return HBM.peak


def memory_reserved(device=None) -> int:
    return HBM.allocated


def max_memory_reserved(device=None) -> int:
    return HBM.peak


def reset_peak_memory_stats(device=None) -> None:
    HBM.reset_peak()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the simulated HBM."""
    return HBM.capacity - HBM.allocated, HBM.capacity


def memory_stats(device=None) -> dict[str, int]:
    return {
        "allocated_bytes.all.current": HBM.allocated,
        "allocated_bytes.all.peak": HBM.peak,
        "allocation.all.allocated": HBM.allocations,
        "reserved_bytes.all.current": HBM.allocated,
        "reserved_bytes.all.peak": HBM.peak,
    }


def get_amp_supported_dtype() -> list[torch.dtype]:
    """What `torch.autocast("neuron", dtype=...)` accepts (its casts: device/autocast.py)."""
    return [torch.bfloat16, torch.float16, torch.float32]


def empty_cache() -> None:
    """Nothing is cached: freed tensors give their bytes back at once."""


def reset_accumulated_memory_stats(device=None) -> None:
    HBM.reset_peak()


def patch_accelerator() -> None:
    """torch.accelerator's functions that reach C++ hooks a Python backend cannot give (they
    raise or assert while `neuron` is the accelerator) answered by this module instead."""
    ours = {
        "synchronize": synchronize,
        "empty_cache": empty_cache,
        "get_memory_info": mem_get_info,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved,
        "memory_stats": memory_stats,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    }
    for name, fn in ours.items():
        original = getattr(torch.accelerator, name, None)
        if original is not None:
            setattr(torch.accelerator, name, _routed(fn, original))


def _routed(ours, original):
    def routed(*args, **kwargs):
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is not None and accelerator.type == "neuron":
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    routed.__doc__ = original.__doc__
    return routed


def patch_generator() -> None:
    """`torch.Generator("neuron")` would reach the PrivateUse1 hooks' getNewGenerator, which a
    Python backend cannot give, and fail with a message about C++ registration. It raises a
    clear error instead. Random ops on `neuron` tensors draw from the CPU generator (seeded by
    torch.manual_seed or torch.neuron.manual_seed), so a CPU generator does the same job.
    torch.Generator becomes a subclass whose constructor makes the same C generator as before,
    and isinstance/issubclass checks against it hold for every generator."""
    base = torch._C.Generator

    class _Meta(type(base)):
        def __instancecheck__(cls, obj) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub) -> bool:
            return issubclass(sub, base)

    class Generator(base, metaclass=_Meta):
        __doc__ = base.__doc__

        def __new__(cls, *args, **kwargs):
            device = args[0] if args else kwargs.get("device")
            if device is not None and torch.device(device).type == "neuron":
                raise RuntimeError(
                    f"torch.Generator({str(device)!r}) is not supported: PyTorch makes device "
                    "generators only through C++ hooks, which the neuron device (a Python "
                    "backend) cannot give. Random ops on neuron tensors draw from the CPU "
                    "generator, so pass a CPU one: torch.Generator().manual_seed(seed)"
                )
            return base(*args, **kwargs)

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    torch.Generator = Generator


def patch_printing() -> None:
    """Printing a tensor runs slicing, comparisons and float64 ops on it to format it; on a
    `neuron` tensor each would be an eager op (float64 ones falling back with a warning), so
    its contents are copied to the host first, as PyTorch does for XLA and lazy tensors."""
    original = torch._tensor_str._tensor_str

    def _tensor_str(self, indent):
        if self.device.type == "neuron":
            self = self.to("cpu")
        return original(self, indent)

    torch._tensor_str._tensor_str = _tensor_str
