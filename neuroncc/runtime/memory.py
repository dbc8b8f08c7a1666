"""The NeuronCore's memories as real byte arrays, with bounds and alignment checked on every view.

HBM holds the executable's buffers at their offsets; SBUF and PSUM are [128, bytes-per-partition]
arrays. A TileRef or DramRef becomes a numpy view onto these bytes, so instructions read and write
the same storage: aliasing, capacity and out-of-bounds behave as on the device.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import SimulationError

# Per thread, the last SBUF and PSUM arrays of each shape and one HBM array: refilling one costs
# a memset, a fresh 24 MiB np.full costs its page faults too (80 ms, a third of a block's
# simulation).
_ON_CHIP = threading.local()
KEPT_HBM_BYTES = 512 * 2**20
# Each partition's row of bytes starts five cache lines past a multiple of its size. SBUF's
# 192 KiB and PSUM's 16 KiB are multiples of 4 KiB, so unpadded, the 128 rows of a tile fall
# into the same CPU cache sets and evict one another (GPT-2 block at 512: steps 2-3% faster).
ROW_PAD = 5 * 64
KEPT_EXECUTABLES = 8


def _on_chip(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """This thread's array of that shape, and the padded array it is a view of."""
    arrays = _ON_CHIP.__dict__.setdefault("arrays", {})
    if shape not in arrays:
        arrays[shape] = np.empty((shape[0], shape[1] + ROW_PAD), np.uint8)
    a = arrays[shape]
    return a[:, : shape[1]], a


@dataclass
class Kept:
    """What one executable's runs on this thread's memory arrays share: its operands' views
    (keyed by the operand object, held so its id stays its own) and its steps, once a run has
    prepared them all (semantics.py). Both stay valid run after run: they name the same bytes,
    and making them costs more than most instructions' arithmetic."""

    exe: Executable
    views: dict = field(default_factory=dict)
    steps: list | None = None


def _kept(exe: Executable, arrays: tuple[np.ndarray, ...]) -> Kept:
    """exe's Kept for these arrays, from its last runs on this thread if it has one."""
    cache = _ON_CHIP.__dict__.setdefault("kept", {})  # oldest first
    key = (id(exe), *(a.__array_interface__["data"][0] for a in arrays))
    kept = cache.pop(key, None)
    if kept is None or kept.exe is not exe:
        kept = Kept(exe)
    cache[key] = kept
    while len(cache) > KEPT_EXECUTABLES:
        del cache[next(iter(cache))]
    return kept


# Executables a checked run proved to read only bytes they write (written.py), by id, each
# through a weak reference (an id outlives its object): their runs need no memory reset.
_PROVEN: dict[int, weakref.ref] = {}


def prove_reads_only_written(exe: Executable) -> None:
    if len(_PROVEN) >= 1024:  # forget the dead
        for key in [k for k, ref in _PROVEN.items() if ref() is None]:
            del _PROVEN[key]
    _PROVEN[id(exe)] = weakref.ref(exe)


def _proven(exe: Executable) -> bool:
    ref = _PROVEN.get(id(exe))
    return ref is not None and ref() is exe


def _hbm(nbytes: int) -> tuple[np.ndarray, bool]:
    """HBM bytes from this thread's one HBM array (grown when a program needs more, up to
    KEPT_HBM_BYTES): a fresh np.zeros pays a page fault per 4 KiB the program touches, every
    run. And whether they are fresh zeros, not that array."""
    if nbytes > KEPT_HBM_BYTES:  # not worth holding on to: the run dwarfs its page faults
        return np.zeros(nbytes, np.uint8), True
    a = getattr(_ON_CHIP, "hbm", None)
    if a is None or a.size < nbytes:
        _ON_CHIP.__dict__.get("kept", {}).clear()  # their views hold the old array
        a = _ON_CHIP.hbm = np.empty(nbytes, np.uint8)
    return a[:nbytes], False


class Memories:
    def __init__(self, exe: Executable, target: Target, checked: bool = True) -> None:
        self.exe = exe
        # Checks of what the program computes, not of its inputs (a transpose's identity):
        # made on an executable's first run, when the race checker runs too.
        self.checked = checked
        self.hbm, fresh = _hbm(max(exe.hbm_bytes, 1))
        self.sbuf, sbuf_rows = _on_chip((target.partitions, target.sbuf_partition_bytes))
        self.psum, psum_rows = _on_chip((target.partitions, target.psum_partition_bytes))
        self._buffers = {b.name: b for b in exe.buffers}
        self._tiles: dict[isa.TileRef, np.ndarray] = {}
        # Else a fresh HBM array: views die with it.
        self.kept = Kept(exe) if fresh else _kept(exe, (self.hbm, self.sbuf, self.psum))
        self._views = self.kept.views
        if checked or not _proven(exe):
            # HBM starts zeroed. On-chip memory holds garbage on the device; NaN-like bytes
            # make reads of never-written tiles visible in results instead of silently
            # reading zeros. One simulation at a time per thread uses these arrays.
            if not fresh:
                self.hbm.fill(0)
            sbuf_rows.fill(0xFF)
            psum_rows.fill(0xFF)

    def tile(self, ref: isa.TileRef) -> np.ndarray:
        """The numpy view of a tile, checked once per distinct TileRef (a program names the
        same tiles over and over), and kept for the program's next runs."""
        hit = self._views.get(id(ref))
        if hit is not None and hit[0] is ref:
            return hit[1]
        view = self._tiles.get(ref)
        if view is None:
            view = self._tiles[ref] = self._tile(ref)
        self._views[id(ref)] = (ref, view)
        return view

    def _tile(self, ref: isa.TileRef) -> np.ndarray:
        mem = {"sbuf": self.sbuf, "psum": self.psum}.get(ref.mem)
        if mem is None:
            raise SimulationError(f"unknown on-chip memory {ref.mem!r} in {ref}")
        itemsize = ref.dtype.itemsize
        end = ref.offset + ref.free_bytes
        if ref.p0 < 0 or ref.np < 1 or ref.p0 + ref.np > mem.shape[0]:
            raise SimulationError(f"{ref}: partitions {ref.p0}..{ref.p0 + ref.np} out of range")
        if ref.offset < 0 or end > mem.shape[1]:
            raise SimulationError(
                f"{ref}: bytes {ref.offset}..{end} exceed the {mem.shape[1]}-byte partition"
            )
        if ref.offset % itemsize:
            raise SimulationError(f"{ref}: offset not aligned to {itemsize} bytes")
        raw = mem[ref.p0 : ref.p0 + ref.np, ref.offset : end]
        return raw.view(ref.dtype.numpy).reshape(ref.shape)

    def dram(self, ref: isa.DramRef) -> np.ndarray:
        """The numpy view of an HBM access pattern, checked and kept like a tile's."""
        hit = self._views.get(id(ref))
        if hit is not None and hit[0] is ref:
            return hit[1]
        view = self._dram(ref)
        self._views[id(ref)] = (ref, view)
        return view

    def _dram(self, ref: isa.DramRef) -> np.ndarray:
        buf = self._buffers.get(ref.buffer)
        if buf is None:
            raise SimulationError(f"{ref}: no HBM buffer {ref.buffer!r}")
        if buf.dtype != ref.dtype:
            raise SimulationError(f"{ref}: buffer {buf.name} holds {buf.dtype.value}")
        lo, hi = ref.span()
        numel = buf.nbytes // buf.dtype.itemsize
        if ref.numel and (lo < 0 or hi > numel):
            raise SimulationError(f"{ref}: elements {lo}..{hi} outside buffer of {numel}")
        itemsize = ref.dtype.itemsize
        strides = tuple(s * itemsize for s, _ in ref.dims)
        offset = buf.offset + ref.offset * itemsize
        if not ref.numel:
            offset = 0  # nothing is touched: anywhere in the buffer will do
        return np.ndarray(ref.shape, ref.dtype.numpy, self.hbm, offset, strides)

    def view(self, ref: isa.Operand) -> np.ndarray:
        return self.tile(ref) if isinstance(ref, isa.TileRef) else self.dram(ref)

    def write_buffer(self, name: str, data: np.ndarray) -> None:
        buf = self._buffers[name]
        raw = np.asarray(data, order="C").reshape(-1).view(np.uint8)
        self.hbm[buf.offset : buf.offset + buf.nbytes] = raw

    def read_buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        buf = self._buffers[name]
        raw = self.hbm[buf.offset : buf.offset + buf.nbytes]
        return raw.view(buf.dtype.numpy).reshape(shape).copy()
