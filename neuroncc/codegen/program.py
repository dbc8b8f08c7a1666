"""The executable: instruction streams + HBM buffer table + metadata, as plain data.

An Executable serialises to JSON and back with no pickle and no code: `from_json` only builds
the dataclasses named in isa.INSTRUCTIONS from field values, and rejects anything else.
FORMAT_VERSION changes whenever the meaning of a field changes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from neuroncc.codegen import isa
from neuroncc.ir.types import DType

FORMAT_VERSION = 2  # 2: Matmul.transpose


@dataclass(frozen=True)
class Buffer:
    """A named region of HBM. kind: "input" | "output" | "temp"."""

    name: str
    kind: str
    offset: int  # bytes from the start of HBM
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


@dataclass(frozen=True)
class ValueLoc:
    """Where a graph input or output lives: a buffer, seen with a shape (reshapes alias)."""

    buffer: str
    shape: tuple[int, ...]
    dtype: DType


@dataclass(frozen=True)
class Kernel:
    """A contiguous range of instructions emitted for one IR node (or fused group)."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class Executable:
    name: str
    target: str
    hbm_bytes: int
    buffers: tuple[Buffer, ...]
    inputs: tuple[ValueLoc, ...]
    outputs: tuple[ValueLoc, ...]
    instructions: tuple[isa.Instr, ...]
    kernels: tuple[Kernel, ...]
    version: int = FORMAT_VERSION

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(_encode(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Executable:
        data = json.loads(text)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"executable format version {data.get('version')} is not {FORMAT_VERSION}"
            )
        return _decode_executable(data)


def _encode(obj: Any) -> Any:
    if isinstance(obj, DType):
        return obj.value
    if isinstance(obj, isa.Instr):
        d = {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"opcode": obj.opcode, **d}
    if isinstance(obj, (isa.TileRef, isa.DramRef)):
        kind = "tile" if isinstance(obj, isa.TileRef) else "dram"
        return {
            "ref": kind,
            **{f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
        }
    if dataclasses.is_dataclass(obj):
        return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [_encode(v) for v in obj]
    return obj


def _tuple(v: Any) -> Any:
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v


def _decode_ref(d: dict) -> isa.Operand:
    d = dict(d)
    kind = d.pop("ref")
    d["dtype"] = DType(d["dtype"])
    if kind == "tile":
        return isa.TileRef(d["mem"], d["p0"], d["np"], d["offset"], d["dtype"], _tuple(d["free"]))
    if kind == "dram":
        return isa.DramRef(d["buffer"], d["offset"], d["dtype"], _tuple(d["dims"]))
    raise ValueError(f"unknown operand kind {kind!r}")


def _decode_instr(d: dict) -> isa.Instr:
    d = dict(d)
    opcode = d.pop("opcode")
    cls = isa.INSTRUCTIONS.get(opcode)
    if cls is None:
        raise ValueError(f"unknown instruction {opcode!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(d) != names:
        raise ValueError(f"instruction {opcode}: fields {sorted(d)} are not {sorted(names)}")
    args = {k: (_decode_ref(v) if isinstance(v, dict) else _tuple(v)) for k, v in d.items()}
    return cls(**args)


def _decode_loc(d: dict) -> ValueLoc:
    return ValueLoc(d["buffer"], tuple(d["shape"]), DType(d["dtype"]))


def _decode_executable(d: dict) -> Executable:
    buffers = tuple(
        Buffer(b["name"], b["kind"], b["offset"], DType(b["dtype"]), tuple(b["shape"]))
        for b in d["buffers"]
    )
    return Executable(
        name=d["name"],
        target=d["target"],
        hbm_bytes=d["hbm_bytes"],
        buffers=buffers,
        inputs=tuple(_decode_loc(v) for v in d["inputs"]),
        outputs=tuple(_decode_loc(v) for v in d["outputs"]),
        instructions=tuple(_decode_instr(i) for i in d["instructions"]),
        kernels=tuple(Kernel(k["name"], k["start"], k["stop"]) for k in d["kernels"]),
        version=d["version"],
    )
