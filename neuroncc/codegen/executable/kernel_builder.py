"""KernelBuilder: write a NeuronCore tile program by hand, in the spirit of NKI.

    kb = KernelBuilder("trn1")
    a = kb.hbm("a", (K, M), DType.BF16)            # kernel inputs and outputs live in HBM
    out = kb.hbm("out", (M, N), DType.BF16, kind="output")
    lhs = kb.sbuf_pool((128, 128), DType.BF16, bufs=2)
    acc = kb.psum_pool(bufs=2)
    for m in range(M // 128):                      # loops are Python loops, as affine_range
        t = lhs.tile()
        kb.load(t, a[0:128, m * 128 : (m + 1) * 128])
        ...
    exe = kb.finish()

It produces the same Executable the compiler emits, so the simulator runs it (numerics) and the
timing model times it (`time_executable`, no data needed). Dependencies between engines are
derived from the memory each instruction touches (builder.py), never written by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from neuroncc.codegen.executable.builder import ProgramBuilder
from neuroncc.codegen.executable.pools import TilePool
from neuroncc.codegen.executable.program import Executable, ValueLoc
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import Target, get_target
from neuroncc.errors import CodegenError
from neuroncc.ir.types import DType, contiguous_strides


class HbmTensor:
    """A tensor in HBM. Indexing with integers and step-1 slices gives the access pattern."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: DType, kind: str) -> None:
        self.name, self.shape, self.dtype, self.kind = name, shape, dtype, kind

    def __getitem__(self, index) -> isa.DramRef:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > len(self.shape):
            raise CodegenError(f"{self.name}: {len(index)} indices for shape {self.shape}")
        index = (*index, *(slice(None),) * (len(self.shape) - len(index)))
        strides = contiguous_strides(self.shape)
        offset, dims = 0, []
        for i, n, stride in zip(index, self.shape, strides, strict=True):
            if isinstance(i, int):
                if not 0 <= i < n:
                    raise CodegenError(f"{self.name}: index {i} out of range for size {n}")
                offset += i * stride
                continue
            start, stop, step = i.indices(n)
            if step != 1 or stop <= start:
                raise CodegenError(f"{self.name}: slices must be non-empty with step 1, got {i}")
            offset += start * stride
            dims.append((stride, stop - start))
        return isa.DramRef(self.name, offset, self.dtype, tuple(dims))

    @property
    def loc(self) -> ValueLoc:
        return ValueLoc(self.name, self.shape, self.dtype)


class TileAllocator:
    """Rotating SBUF/PSUM slots of one tile shape: `tile()` hands out the next slot."""

    def __init__(self, pool: TilePool, shape: tuple[int, ...], dtype: DType) -> None:
        self.pool, self.shape, self.dtype = pool, shape, dtype

    def tile(self) -> isa.TileRef:
        return self.pool.tile(self.shape[0], self.shape[1:], self.dtype)


class KernelBuilder:
    def __init__(self, target: str | Target = "trn2", name: str = "kernel") -> None:
        self.target = get_target(target) if isinstance(target, str) else target
        self.b = ProgramBuilder(self.target, name)
        self._tensors: list[HbmTensor] = []
        self._kernel = self.b.kernel(name)
        self._kernel.__enter__()

    # -- memory ------------------------------------------------------------------------------
    def hbm(self, name: str, shape: Sequence[int], dtype: DType, kind: str = "input") -> HbmTensor:
        if kind not in ("input", "output", "temp"):
            raise CodegenError(f"HBM tensor kind must be input, output or temp, not {kind!r}")
        self.b.dram(name, tuple(shape), dtype, kind)
        t = HbmTensor(name, tuple(shape), dtype, kind)
        self._tensors.append(t)
        return t

    def sbuf_pool(self, shape: Sequence[int], dtype: DType, bufs: int = 2) -> TileAllocator:
        shape = self._tile_shape(shape)
        slot = math.prod(shape[1:]) * dtype.itemsize
        return TileAllocator(self.b.sbuf_pool(slot, bufs), shape, dtype)

    def sbuf(self, shape: Sequence[int], dtype: DType) -> isa.TileRef:
        """One SBUF tile for the whole kernel."""
        return self.sbuf_pool(shape, dtype, bufs=1).tile()

    def psum_pool(self, shape: Sequence[int] = (128, 512), bufs: int = 2) -> TileAllocator:
        """Rotating fp32 PSUM tiles, each within one 2 KiB bank (at most [128, 512])."""
        shape = self._tile_shape(shape)
        if math.prod(shape[1:]) * 4 > self.target.psum_bank_bytes:
            raise CodegenError(f"a PSUM tile holds at most one bank: {shape} fp32 does not fit")
        return TileAllocator(self.b.psum_pool(bufs), shape, DType.F32)

    def _tile_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(shape)
        if len(shape) < 2 or not 0 < shape[0] <= self.target.partitions:
            raise CodegenError(
                f"tile shape {shape}: dimension 0 is the partition dimension, 1..128"
            )
        return shape

    # -- instructions ------------------------------------------------------------------------
    def load(self, dst: isa.TileRef, src: isa.DramRef, queue: str | None = None) -> int:
        return self.b.dma(dst, src, queue)

    def store(self, dst: isa.DramRef, src: isa.TileRef, queue: str | None = None) -> int:
        return self.b.dma(dst, src, queue)

    def matmul(
        self,
        dst: isa.TileRef,
        stationary: isa.TileRef,
        moving: isa.TileRef,
        accumulate: bool,
        tile_rows: int = 0,
    ) -> int:
        """dst[M, N] (PSUM) (+)= stationary[K, M].T @ moving[K, N] on TensorE; with tile_rows,
        on the row tile of that many PE rows that the operands' partitions lie in."""
        if dst.mem != "psum":
            raise CodegenError(f"matmul writes PSUM, not {dst.mem}")
        k, m, n = stationary.np, stationary.free_elems, moving.free_elems
        t = self.target
        if moving.np != k or m > t.pe_stationary_fmax or n > t.pe_moving_fmax:
            raise CodegenError(
                f"matmul tiles: stationary [K={k}, M={m}] (M <= {t.pe_stationary_fmax}), moving "
                f"[K={moving.np}, N={n}] (N <= {t.pe_moving_fmax}) must share K"
            )
        if dst.np != m or dst.free_elems != n:
            raise CodegenError(f"matmul result is [{m}, {n}], dst is {dst}")
        mm = isa.Matmul(
            "pe",
            dst=dst,
            stationary=stationary,
            moving=moving,
            accumulate=accumulate,
            tile_rows=tile_rows,
        )
        return self.b.emit(mm)

    def activation(
        self, dst: isa.TileRef, src: isa.TileRef, func: str, scale: float = 1.0, bias: float = 0.0
    ) -> int:
        return self.b.emit(
            isa.Activation("act", func=func, dst=dst, src=src, scale=scale, bias=bias)
        )

    def tensor_tensor(self, dst: isa.TileRef, a: isa.TileRef, b: isa.TileRef, op: str) -> int:
        return self.b.emit(isa.TensorTensor("dve", op=op, dst=dst, a=a, b=b))

    def tensor_scalar(self, dst: isa.TileRef, src: isa.TileRef, op: str, scalar: float) -> int:
        return self.b.emit(isa.TensorScalar("dve", op=op, dst=dst, src=src, scalar=scalar))

    def copy(self, dst: isa.TileRef, src: isa.TileRef, engine: str = "dve") -> int:
        """dst = src converted to dst's dtype, e.g. PSUM fp32 to SBUF bf16."""
        return self.b.emit(isa.TensorCopy(engine, dst=dst, src=src))

    def memset(self, dst: isa.TileRef, value: float, engine: str = "dve") -> int:
        return self.b.emit(isa.Memset(engine, dst=dst, value=value))

    def finish(self) -> Executable:
        self._kernel.__exit__(None, None, None)
        return self.b.finish(
            [t.loc for t in self._tensors if t.kind == "input"],
            [t.loc for t in self._tensors if t.kind == "output"],
        )
