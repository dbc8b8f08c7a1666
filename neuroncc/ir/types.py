"""Tensor types of the IR: a dtype and a static shape.

Invariants:
- shapes are tuples of non-negative Python ints; there are no symbolic sizes in the IR;
- every DType has exactly one printed name, one numpy dtype and one torch dtype.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import torch


class DType(enum.Enum):
    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U8 = "u8"
    BOOL = "bool"

    @functools.cached_property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]  # codegen asks for it millions of times: an attribute

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def torch(self) -> torch.dtype:
        return _torch_dtypes()[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.BF16, DType.F16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I64, DType.I32, DType.I16, DType.I8, DType.U8)

    @property
    def accumulator(self) -> DType:
        """What a reduction over values of this dtype accumulates in: fp32 for floats, else
        int64."""
        return DType.F32 if self.is_float else DType.I64

    @staticmethod
    def from_torch(dt: torch.dtype) -> DType:
        for k, v in _torch_dtypes().items():
            if v == dt:
                return k
        allowed = ", ".join(str(v) for v in _torch_dtypes().values())
        raise TypeError(f"dtype {dt} is not supported by neuroncc (allowed: {allowed})")

    @staticmethod
    def from_numpy(dt: np.dtype) -> DType:
        for k, v in _NUMPY.items():
            if v == dt:
                return k
        raise TypeError(f"numpy dtype {dt} has no neuroncc DType")


_NUMPY = {
    DType.F32: np.dtype(np.float32),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F16: np.dtype(np.float16),
    DType.I64: np.dtype(np.int64),
    DType.I32: np.dtype(np.int32),
    DType.I16: np.dtype(np.int16),
    DType.I8: np.dtype(np.int8),
    DType.U8: np.dtype(np.uint8),
    DType.BOOL: np.dtype(np.bool_),
}
_ITEMSIZE = {d: n.itemsize for d, n in _NUMPY.items()}


@functools.cache
def _torch_dtypes() -> dict[DType, torch.dtype]:
    """Imported on first use: the compiler proper (warmup workers, neuroncc-dump) runs without
    torch."""
    import torch

    return {
        DType.F32: torch.float32,
        DType.BF16: torch.bfloat16,
        DType.F16: torch.float16,
        DType.I64: torch.int64,
        DType.I32: torch.int32,
        DType.I16: torch.int16,
        DType.I8: torch.int8,
        DType.U8: torch.uint8,
        DType.BOOL: torch.bool,
    }


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise TypeError(f"shape must be non-negative ints, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))
