"""Device memory: `neuron` tensors over host bytes that stand for the NeuronCore's HBM.

Note [device memory]: a `neuron` tensor is a PrivateUse1 TensorImpl whose storage points at a
host byte buffer (a CPU uint8 tensor) kept alive by the storage's Python object; PyTorch keeps
that object as long as any tensor or view uses the storage, so views, `data_ptr()`, autograd,
`deepcopy` and `torch.save` work as on any device. The bytes are counted against the HBM of
the selected target core (`NEURONCC_TARGET`, times `NEURON_LOGICAL_NC_CONFIG` physical cores
per logical one): an allocation past it raises `torch.OutOfMemoryError` with the sizes, as
CUDA does, and frees nothing. A storage's bytes are given back when PyTorch frees it.

The host side reads and writes device bytes through `host_view`, a CPU tensor over the same
bytes: what the simulator's DMA engines would move in and out of HBM.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref

import torch
import torch.utils._pytree as pytree

DEVICE = "neuron"
_FLOOR = 2**30  # bytes below every target's HBM


class Hbm:
    """The simulated HBM of the process's NeuronCore: bytes in use, the peak, the capacity."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.allocated = 0
        self.peak = 0
        self.allocations = 0  # storages allocated since start
        self._capacity: int | None = None

    @property
    def capacity(self) -> int:
        if self._capacity is None:
            self._capacity = hbm_capacity(os.environ)
        return self._capacity

    def take(self, nbytes: int) -> None:
        with self._lock:
            # the capacity (which imports the target table) is read once usage passes the
            # smallest target's HBM could not be: not on autoload's self-test
            if self.allocated + nbytes > _FLOOR and self.allocated + nbytes > self.capacity:
                free = self.capacity - self.allocated
                raise torch.OutOfMemoryError(
                    f"neuron out of memory: tried to allocate {_size(nbytes)}; the simulated "
                    f"NeuronCore has {_size(self.capacity)} of HBM, {_size(self.allocated)} "
                    f"allocated, {_size(free)} free (set NEURONCC_TARGET for another core, "
                    "NEURON_LOGICAL_NC_CONFIG=2 to join two cores' HBM)"
                )
            self.allocated += nbytes
            self.allocations += 1
            self.peak = max(self.peak, self.allocated)

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.allocated -= nbytes

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.allocated


HBM = Hbm()


def hbm_capacity(environ) -> int:
    """Bytes of HBM per device: the target core's, times the physical cores per logical core."""
    from neuroncc.codegen.hardware.targets import get_target
    from neuroncc.errors import OptionsError

    target = get_target(environ.get("NEURONCC_TARGET") or "trn2")
    lnc = environ.get("NEURON_LOGICAL_NC_CONFIG") or "1"
    if lnc not in ("1", "2"):
        raise OptionsError(f"NEURON_LOGICAL_NC_CONFIG must be 1 or 2, not {lnc!r}")
    return target.hbm_bytes * int(lnc)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"


@functools.cache
def device() -> torch.device:
    """neuron:0, the process's one device (made once: every new storage names it)."""
    return torch.device(DEVICE, 0)


def storage_bytes(size, stride, dtype: torch.dtype) -> int:
    """Bytes a strided tensor's elements span."""
    if any(s == 0 for s in size):
        return 0
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(size, stride, strict=True))
    return span * dtype.itemsize


def _device_storage(host: torch.UntypedStorage, nbytes: int) -> torch.UntypedStorage:
    """A `neuron` storage over the bytes of host (a CPU storage; already counted in HBM),
    given back to HBM when PyTorch frees it."""
    storage = torch._C._construct_storage_from_data_pointer(host.data_ptr(), device(), nbytes)
    storage._neuron_host = host  # kept as long as the storage (Note [device memory])
    storage._neuron_flat = {}  # per dtype, a CPU tensor over all of host (host_view)
    _LIVE.add(weakref.ref(storage, functools.partial(_freed, nbytes)))
    return storage


_LIVE: set[weakref.ref] = set()  # the device storages' weak references, until freed


def _freed(nbytes: int, ref: weakref.ref) -> None:
    _LIVE.discard(ref)
    HBM.give(nbytes)


def host_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A `neuron` storage's bytes, as a CPU uint8 tensor."""
    host = storage._neuron_host
    return torch.empty(0, dtype=torch.uint8).set_(host)[: storage.nbytes()]


def new_storage(nbytes: int) -> torch.UntypedStorage:
    """nbytes of device memory (uninitialised)."""
    HBM.take(nbytes)
    try:
        host = torch.empty(max(nbytes, 1), dtype=torch.uint8).untyped_storage()
    except RuntimeError:
        HBM.give(nbytes)
        raise torch.OutOfMemoryError(
            f"neuron out of memory: the host has no {_size(nbytes)} free to stand for the "
            "simulated HBM this tensor needs"
        ) from None
    return _device_storage(host, nbytes)


def empty_strided(size, stride, dtype: torch.dtype | None) -> torch.Tensor:
    dtype = dtype or torch.get_default_dtype()
    size, stride = tuple(size), tuple(stride)
    return _tensor(new_storage(storage_bytes(size, stride, dtype)), size, stride, dtype)


def patch_pin_memory() -> None:
    """Pinned host memory is what a real device copies from asynchronously. PyTorch pins
    through the accelerator's C++ hooks, which a Python backend cannot provide, so once
    `neuron` is the accelerator every `pin_memory()` (a DataLoader's, the Trainer's default)
    would raise, CPU-only code included. For the simulated device pinning changes nothing:
    `pin_memory()` of a CPU tensor for it returns the tensor as it is (`is_pinned()` stays
    False)."""
    original = torch.Tensor.pin_memory

    def pin_memory(self, device=None):
        if device is None or torch.device(device).type == DEVICE:
            return self
        return original(self, device)

    torch.Tensor.pin_memory = pin_memory


def patch_storage_constructor() -> None:
    """`torch.UntypedStorage(n, device="neuron")` (what `deepcopy`, `torch.load` and
    `storage.clone()` call) would reach PyTorch's allocator for PrivateUse1, which a Python
    backend cannot provide, and crash the process: such storages come from `new_storage`."""
    original = torch.UntypedStorage.__new__

    def new(cls, *args, device=None, **kwargs):
        if device is None or torch.device(device).type != DEVICE:
            return original(cls, *args, device=device, **kwargs)
        if len(args) != 1 or not isinstance(args[0], int) or kwargs:
            raise RuntimeError(
                "a neuron storage is made as UntypedStorage(nbytes, device='neuron')"
            )
        return new_storage(args[0])

    torch.UntypedStorage.__new__ = new


_SET = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _tensor(storage: torch.UntypedStorage, size, stride, dtype: torch.dtype) -> torch.Tensor:
    """A new `neuron` tensor over storage (PyTorch's own set_, as the device's set_ kernel
    does, without the dispatch to it: the tensor is new, so no autograd to record)."""
    t = torch._C._acc.create_empty_tensor(size, dtype)
    return _SET(_CPU, t, storage, 0, size, stride)


def empty(size, dtype: torch.dtype | None) -> torch.Tensor:
    return empty_strided(size, contiguous_strides(size), dtype)


def contiguous_strides(size) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(tuple(size)):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the bytes of `neuron` tensor t, with its shape, strides and offset."""
    storage = t.untyped_storage()
    flat = storage._neuron_flat.get(t.dtype)  # (as_strided of it: faster than a new set_)
    if flat is None:
        flat = storage._neuron_flat[t.dtype] = torch.empty(0, dtype=t.dtype).set_(
            storage._neuron_host
        )
    out = flat.as_strided(t.shape, t.stride(), t.storage_offset())
    if t.is_conj():  # PyTorch's lazy conjugate and negative bits go with the view
        out = out.conj()
    if t.is_neg():
        out = torch._neg_view(out)
    return out


def to_device(out, hosts: list, args: list):
    """Results computed on the host views `hosts` of `args`, as `neuron` tensors over the
    bytes they were computed into; a view returned as it is gives back its argument."""
    given = {
        (h.data_ptr(), h.shape, h.stride()): a
        for h, a in zip(hosts, args, strict=True)
        if isinstance(h, torch.Tensor)
    }

    def convert(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        arg = given.get((x.data_ptr(), x.shape, x.stride()))
        return adopt(x) if arg is None else arg

    return pytree.tree_map(convert, out)


def adopt(cpu: torch.Tensor) -> torch.Tensor:
    """A `neuron` tensor over a CPU tensor's bytes (what a computation just produced in host
    memory standing for HBM), without copying them."""
    if cpu.is_conj() or cpu.is_neg():  # lazy conjugate and negative bits: the values
        cpu = cpu.resolve_conj().resolve_neg()
    if not cpu.is_contiguous() or cpu.storage_offset():
        cpu = cpu.contiguous()
    nbytes = cpu.numel() * cpu.element_size()
    HBM.take(nbytes)
    host = cpu.untyped_storage() if nbytes else torch.empty(1, dtype=torch.uint8).untyped_storage()
    return _tensor(_device_storage(host, nbytes), cpu.shape, cpu.stride(), cpu.dtype)
