"""The NeuronCore instruction set as data.

Operands name memory, never Python objects:
- TileRef: a region of SBUF or PSUM. Dimension 0 is the partition dimension (p0 .. p0+np,
  np <= 128); the free shape is contiguous, row-major, starting at byte `offset` of every
  partition.
- DramRef: an access pattern over one HBM buffer: element `offset` plus (stride, count) pairs,
  outermost first. Elements are visited in row-major order of the counts.

Every instruction runs on one engine ("pe", "act", "dve", "pool", or a DMA queue "q0".."q15")
and lists `deps`: ids of earlier instructions on other engines it must wait for (semaphore
waits). Each engine runs its own stream in order. Instructions are frozen dataclasses and
serialise to plain JSON (see program.py); nothing here executes anything.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from neuroncc.ir.types import DType

COMPUTE_ENGINES = ("pe", "act", "dve", "pool")


class _cached:
    """functools.cached_property without its lock: Python 3.11's takes an RLock on every first
    access (3.12 dropped it), and codegen makes ~10^5 operands per graph, each asked once or
    twice for its sizes. Computed on first use and stored in the instance's __dict__, which
    later lookups find before this descriptor."""

    def __init__(self, fn) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def dma_queue(i: int) -> str:
    return f"q{i}"


@dataclass(frozen=True)
class TileRef:
    """A tile of SBUF or PSUM: partitions p0 .. p0 + np, `free` elements from byte `offset` of
    each. Derived sizes are cached on first use (codegen asks for them per instruction)."""

    mem: str  # "sbuf" | "psum"
    p0: int
    np: int
    offset: int  # bytes, within each partition
    dtype: DType
    free: tuple[int, ...]

    @_cached
    def free_elems(self) -> int:
        return math.prod(self.free)

    @_cached
    def free_bytes(self) -> int:
        return self.free_elems * self.dtype.itemsize

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.np, *self.free)

    @_cached
    def numel(self) -> int:
        return self.np * self.free_elems

    def reshaped(self, free: tuple[int, ...]) -> TileRef:
        assert math.prod(free) == self.free_elems, (free, self.free)
        return TileRef(self.mem, self.p0, self.np, self.offset, self.dtype, tuple(free))

    def rows(self, p: int) -> TileRef:
        """The first p partitions of this tile."""
        return TileRef(self.mem, self.p0, p, self.offset, self.dtype, self.free)

    def partitions(self, start: int, count: int) -> TileRef:
        """Partitions start .. start + count of this tile."""
        assert 0 <= start and start + count <= self.np, (start, count, self.np)
        return TileRef(self.mem, self.p0 + start, count, self.offset, self.dtype, self.free)

    def cols(self, start: int, count: int) -> TileRef:
        """A column range of a tile whose free shape is 1-d."""
        assert len(self.free) == 1 and start + count <= self.free[0]
        offset = self.offset + start * self.dtype.itemsize
        return TileRef(self.mem, self.p0, self.np, offset, self.dtype, (count,))

    def __str__(self) -> str:
        return (
            f"{self.mem}[{self.p0}:{self.p0 + self.np}, +{self.offset}]"
            f":{self.dtype.value}{list(self.free)}"
        )


@dataclass(frozen=True)
class DramRef:
    buffer: str
    offset: int  # elements
    dtype: DType
    dims: tuple[tuple[int, int], ...]  # (stride, count), outermost first

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.dims)

    @_cached
    def numel(self) -> int:
        return math.prod(self.shape)

    @_cached
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def span(self) -> tuple[int, int]:
        """[lo, hi) element bounds of what this pattern touches."""
        return self._span

    @_cached
    def _span(self) -> tuple[int, int]:
        if self.numel == 0:
            return self.offset, self.offset
        lo = self.offset + sum(min(0, s * (c - 1)) for s, c in self.dims)
        hi = self.offset + sum(max(0, s * (c - 1)) for s, c in self.dims) + 1
        return lo, hi

    def contiguous_run(self) -> int:
        """Elements per contiguous run (what one DMA descriptor element moves)."""
        run = 1
        for stride, count in reversed(self.dims):
            if count == 1:
                continue
            if stride != run:
                break
            run *= count
        return run

    def __str__(self) -> str:
        pat = ",".join(f"[{s},{c}]" for s, c in self.dims)
        return f"{self.buffer}[+{self.offset}; {pat}]:{self.dtype.value}"


Operand = TileRef | DramRef


@dataclass(frozen=True)
class Instr:
    """Base: every instruction has an engine and its declared cross-engine waits."""

    opcode: ClassVar[str] = "?"
    engine: str
    deps: tuple[int, ...] = field(default=(), kw_only=True)

    def reads(self) -> tuple[Operand, ...]:
        return ()

    def writes(self) -> tuple[Operand, ...]:
        return ()

    def operands(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _operand_names(type(self))}


@functools.cache
def _operand_names(cls: type) -> tuple[str, ...]:
    """An instruction class's fields past engine and deps (asked per instruction: fields()
    walks the class each time)."""
    return tuple(f.name for f in fields(cls) if f.name not in ("engine", "deps"))


@dataclass(frozen=True)
class Dma(Instr):
    """Copy src to dst element by element (HBM<->SBUF, HBM<->HBM, SBUF<->SBUF)."""

    opcode: ClassVar[str] = "dma"
    dst: Operand
    src: Operand

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class DmaGather(Instr):
    """Indirect DMA: dst row i = table row index[i] (the table is a [rows, cols] DramRef)."""

    opcode: ClassVar[str] = "dma_gather"
    dst: TileRef
    table: DramRef
    index: TileRef

    def reads(self):
        return (self.table, self.index)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class DmaScatter(Instr):
    """Indirect DMA: table row index[i] = src row i ("set"), or combined with it by the DMA
    engine's read-modify-write ("add", "mul", "max", "min"). Repeated indices combine in order;
    with "set" the last wins."""

    opcode: ClassVar[str] = "dma_scatter"
    table: DramRef
    src: TileRef
    index: TileRef
    combine: str

    def reads(self):
        if self.combine == "set":
            return (self.src, self.index)
        return (self.src, self.index, self.table)

    def writes(self):
        return (self.table,)


@dataclass(frozen=True)
class Matmul(Instr):
    """TensorE: dst[M,N] (PSUM, fp32) = (dst if accumulate else 0) + stationary[K,M].T @ moving[K,N].

    `transpose` marks a matmul against the identity that only transposes its stationary
    operand: it counts towards HFU, not MFU. `tile_rows` (0: the whole array) runs it on one
    row tile of that many PE rows (nc_matmul's tile_size), the one its operands' partitions
    name (tile_position): matmuls on different row tiles run in parallel."""

    opcode: ClassVar[str] = "matmul"
    dst: TileRef
    stationary: TileRef
    moving: TileRef
    accumulate: bool
    transpose: bool = False
    tile_rows: int = 0

    def reads(self):
        base = (self.stationary, self.moving)
        return (*base, self.dst) if self.accumulate else base

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class Activation(Instr):
    """ScalarE: dst = func(src * scale + bias), computed in fp32."""

    opcode: ClassVar[str] = "activation"
    func: str
    dst: TileRef
    src: TileRef
    scale: float = 1.0
    bias: float = 0.0

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class ActivationReduce(Instr):
    """ScalarE: dst = func(src + bias) with `bias` a per-partition [p, 1] tile, and
    acc[p, 0] = the sum of each row of dst as stored (nki.isa.activation_reduce), in fp32:
    a softmax's exp(x - max) and its row sum in one pass."""

    opcode: ClassVar[str] = "activation_reduce"
    func: str
    dst: TileRef
    src: TileRef
    bias: TileRef
    acc: TileRef

    def reads(self):
        return (self.src, self.bias)

    def writes(self):
        return (self.dst, self.acc)


@dataclass(frozen=True)
class TensorTensor(Instr):
    """VectorE: dst = a <op> b, elementwise over equally shaped tiles."""

    opcode: ClassVar[str] = "tensor_tensor"
    op: str
    dst: TileRef
    a: TileRef
    b: TileRef

    def reads(self):
        return (self.a, self.b)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class TensorScalar(Instr):
    """dst = src <op> scalar (a compile-time immediate)."""

    opcode: ClassVar[str] = "tensor_scalar"
    op: str
    dst: TileRef
    src: TileRef
    scalar: float

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class TensorReduce(Instr):
    """VectorE: dst[p, 1] = reduce_<op>(src[p, :]) over the whole free dimension."""

    opcode: ClassVar[str] = "tensor_reduce"
    op: str  # "sum" | "max" | "min"
    dst: TileRef
    src: TileRef

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class TensorCopy(Instr):
    """dst = src converted to dst's dtype (round to nearest even for floats)."""

    opcode: ClassVar[str] = "tensor_copy"
    dst: TileRef
    src: TileRef

    def reads(self):
        return (self.src,)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class Select(Instr):
    """VectorE: dst = where(pred, a, b)."""

    opcode: ClassVar[str] = "select"
    dst: TileRef
    pred: TileRef
    a: TileRef
    b: TileRef

    def reads(self):
        return (self.pred, self.a, self.b)

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class Memset(Instr):
    opcode: ClassVar[str] = "memset"
    dst: TileRef
    value: float

    def writes(self):
        return (self.dst,)


@dataclass(frozen=True)
class Iota(Instr):
    """GpSimdE: dst[p, f] = base + p * pstep + f * fstep (f = flat free index)."""

    opcode: ClassVar[str] = "iota"
    dst: TileRef
    base: float
    pstep: float
    fstep: float

    def writes(self):
        return (self.dst,)


INSTRUCTIONS: dict[str, type[Instr]] = {
    cls.opcode: cls
    for cls in (
        Dma,
        DmaGather,
        DmaScatter,
        Matmul,
        Activation,
        ActivationReduce,
        TensorTensor,
        TensorScalar,
        TensorReduce,
        TensorCopy,
        Select,
        Memset,
        Iota,
    )
}
