"""The executable: instruction streams + HBM buffer table + metadata, as plain data.

An Executable serialises to JSON and back with no pickle and no code: `from_json` only builds
the dataclasses named in isa.INSTRUCTIONS from field values, and rejects anything else.
The form is compact because loading it is what a persistent-cache hit costs (see _Codec).
FORMAT_VERSION changes whenever the meaning of a field changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from neuroncc.codegen.hardware import isa
from neuroncc.ir.types import DType

FORMAT_VERSION = 5  # 2: Matmul.transpose; 3: interned operands, positional rows;
# 4: activation_reduce; 5: Matmul.tile_rows


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
        return json.dumps(self.to_data(), separators=(",", ":"))

    def to_data(self) -> dict:
        """Plain JSON-able data (what to_json writes)."""
        return _encode_executable(self)

    @staticmethod
    def from_json(text: str) -> Executable:
        with no_gc():
            return Executable.from_data(json.loads(text))

    @staticmethod
    def from_data(data: Any) -> Executable:
        """The inverse of to_data; ValueError (TypeError for a non-object) for anything that is
        not a valid executable."""
        if not isinstance(data, dict):
            raise TypeError("an executable is a JSON object")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"executable format version {data.get('version')} is not {FORMAT_VERSION}"
            )
        return _decode_executable(data)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Loading builds many small containers, each allocation of which can trigger a full
    collection of the (large) heap of a process running PyTorch: 5x the decode time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Codec:
    """The compact JSON form of an instruction stream, fast to load (a cache hit decodes it).

    Operands are interned in one table (a kernel names the same tiles over and over); an
    instruction is a row [opcode, engine, deps, field...] with its fields in declaration order
    and operand fields as indexes into the table.
    """

    OPERAND_TYPES = ("Operand", "TileRef", "DramRef")

    def __init__(self) -> None:
        self.fields = {
            opcode: [(f.name, f.type in self.OPERAND_TYPES) for f in _own_fields(cls)]
            for opcode, cls in isa.INSTRUCTIONS.items()
        }
        # opcode -> (class, field names as stored, positions of the operand fields)
        self.layouts = {
            opcode: (
                cls,
                ("engine", "deps", *(name for name, _ in self.fields[opcode])),
                tuple(2 + i for i, (_, is_operand) in enumerate(self.fields[opcode]) if is_operand),
            )
            for opcode, cls in isa.INSTRUCTIONS.items()
        }

    def encode(self, instructions: tuple[isa.Instr, ...]) -> tuple[list, list]:
        table: dict[isa.Operand, int] = {}
        rows = []
        for ins in instructions:
            row: list[Any] = [ins.opcode, ins.engine, list(ins.deps)]
            for name, is_operand in self.fields[ins.opcode]:
                value = getattr(ins, name)
                row.append(table.setdefault(value, len(table)) if is_operand else value)
            rows.append(row)
        return [_encode_ref(r) for r in table], rows

    def decode(self, operands: list, rows: list) -> tuple[isa.Instr, ...]:
        table = [_decode_ref(r) for r in operands]
        out = []
        for row in rows:
            layout = self.layouts.get(row[0])
            if layout is None:
                raise ValueError(f"unknown instruction {row[0]!r}")
            cls, names, operand_slots = layout
            if len(row) != len(names) + 1:
                raise ValueError(f"instruction {row[0]}: {len(row) - 1} fields, expected {names}")
            values = row[1:]
            values[1] = tuple(values[1])  # deps
            for i in operand_slots:
                values[i] = table[values[i]]
            # Set the fields directly: what the frozen dataclass's __init__ does, at a third of
            # its cost (a cache hit is mostly this loop).
            ins = object.__new__(cls)
            ins.__dict__.update(zip(names, values))
            out.append(ins)
        return tuple(out)


def _own_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name not in ("engine", "deps")]


def _encode_ref(ref: isa.Operand) -> list:
    if isinstance(ref, isa.TileRef):
        return ["tile", ref.mem, ref.p0, ref.np, ref.offset, ref.dtype.value, list(ref.free)]
    return ["dram", ref.buffer, ref.offset, ref.dtype.value, [list(d) for d in ref.dims]]


_DTYPES = {d.value: d for d in DType}


def _decode_ref(r: list) -> isa.Operand:
    if r[0] == "tile":
        return isa.TileRef(r[1], r[2], r[3], r[4], _DTYPES[r[5]], tuple(r[6]))
    if r[0] == "dram":
        return isa.DramRef(r[1], r[2], _DTYPES[r[3]], tuple(tuple(d) for d in r[4]))
    raise ValueError(f"unknown operand kind {r[0]!r}")


_CODEC = _Codec()


def _encode_executable(exe: Executable) -> dict:
    operands, rows = _CODEC.encode(exe.instructions)
    return {
        "version": exe.version,
        "name": exe.name,
        "target": exe.target,
        "hbm_bytes": exe.hbm_bytes,
        "buffers": [[b.name, b.kind, b.offset, b.dtype.value, list(b.shape)] for b in exe.buffers],
        "inputs": [[v.buffer, list(v.shape), v.dtype.value] for v in exe.inputs],
        "outputs": [[v.buffer, list(v.shape), v.dtype.value] for v in exe.outputs],
        "kernels": [[k.name, k.start, k.stop] for k in exe.kernels],
        "operands": operands,
        "instructions": rows,
    }


def _decode_executable(d: dict) -> Executable:
    try:
        return Executable(
            name=d["name"],
            target=d["target"],
            hbm_bytes=d["hbm_bytes"],
            buffers=tuple(
                Buffer(name, kind, offset, DType(dt), tuple(shape))
                for name, kind, offset, dt, shape in d["buffers"]
            ),
            inputs=tuple(ValueLoc(b, tuple(s), DType(dt)) for b, s, dt in d["inputs"]),
            outputs=tuple(ValueLoc(b, tuple(s), DType(dt)) for b, s, dt in d["outputs"]),
            instructions=_CODEC.decode(d["operands"], d["instructions"]),
            kernels=tuple(Kernel(*k) for k in d["kernels"]),
            version=d["version"],
        )
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"malformed executable: {type(e).__name__}: {e}") from None
