"""The pools a kernel takes its on-chip tiles from: rotating slots of one size (`TilePool`)
and a byte ring for tiles of any size (`RingPool`). ProgramBuilder makes them (sbuf_pool,
psum_pool, carve, ring); loops compare their rotation (Note [instruction loops])."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from neuroncc.codegen.hardware import isa
from neuroncc.errors import CodegenError
from neuroncc.ir.types import DType

ALIGN = 64  # bytes: the alignment of allocations on chip and of buffers in HBM


class TilePool:
    """`bufs` rotating slots of one size: successive tiles alternate, so a load into slot i+1
    can overlap compute on slot i (double/triple buffering). Dependencies order the reuse."""

    def __init__(self, mem: str, base: int, slot_bytes: int, bufs: int) -> None:
        self.mem, self.base, self.slot_bytes, self.bufs = mem, base, slot_bytes, bufs
        self.state = 0  # tiles handed out
        self.period = bufs  # a loop's period may turn it by whole rotations only

    def tile(self, np_: int, free: Sequence[int], dtype: DType) -> isa.TileRef:
        slot = self.state % self.bufs
        t = isa.TileRef(self.mem, 0, np_, self.base + slot * self.slot_bytes, dtype, tuple(free))
        if t.free_bytes > self.slot_bytes or np_ > 128:
            raise CodegenError(f"tile {t} does not fit a {self.slot_bytes}-byte slot")
        self.state += 1
        return t

    def tile_at(self, slot: int, np_: int, free: Sequence[int], dtype: DType) -> isa.TileRef:
        """A tile in slot `slot`, the rotation left as it is: for tiles that the caller keeps
        one per slot (safe where the slot's tile before is read by nothing issued later)."""
        state = self.state
        self.state = slot
        try:
            return self.tile(np_, free, dtype)
        finally:
            self.state = state

    def align(self, block: int) -> None:
        """Take the next tile at a multiple of `block` tiles (Note [aligned steps] in
        emit_fused.py): safe where what the tiles from there on hold is read by nothing
        issued later."""
        self.state = -(-self.state // block) * block


class RingPool:
    """Tiles of any size placed one after another in `nbytes` from `base`, wrapping to the
    start when the next does not fit: a byte ring, where a new tile waits (by dependencies)
    only for the readers of the bytes it takes, however small the tiles before it were."""

    def __init__(self, mem: str, base: int, nbytes: int) -> None:
        self.mem, self.base, self.nbytes = mem, base, nbytes
        self.position = 0  # where the next tile goes, in bytes from base
        self.period = 0  # a loop's period may not move it (Note [instruction loops])

    @property
    def state(self) -> int:
        return self.position

    @state.setter
    def state(self, value: int) -> None:
        self.position = value

    def tile(self, np_: int, free: Sequence[int], dtype: DType) -> isa.TileRef:
        t = isa.TileRef(self.mem, 0, np_, 0, dtype, tuple(free))
        size = -(-t.free_bytes // ALIGN) * ALIGN
        if size > self.nbytes or np_ > 128:
            raise CodegenError(f"tile {t} does not fit a {self.nbytes}-byte ring")
        if self.position + size > self.nbytes:
            self.position = 0
        offset, self.position = self.base + self.position, self.position + size
        return replace(t, offset=offset)
