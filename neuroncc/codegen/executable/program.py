"""The executable: instruction streams + HBM buffer table + metadata, as plain data.

An Executable serialises to JSON and back with no pickle and no code: `from_json` only builds
the dataclasses named in isa.INSTRUCTIONS from field values, and rejects anything else.
The form is compact because loading it is what a persistent-cache hit costs (see _Codec).
FORMAT_VERSION changes whenever the meaning of a field changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from neuroncc.codegen.executable.blocks import Block, Call, expand, parametrise
from neuroncc.codegen.hardware import isa
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.ir.types import DType

FORMAT_VERSION = 8  # 2: Matmul.transpose; 3: interned operands, positional rows;
# 4: activation_reduce; 5: Matmul.tile_rows; 6: blocks and calls; 7: a table of waits;
# 8: blocks count HBM from their first element (calls' offsets), loops as runs of calls


@dataclass(frozen=True)
class Buffer:
    """A named region of HBM. kind: "input" | "output" | "temp"."""

    name: str
    kind: str
    offset: int  # bytes from the start of HBM
    dtype: DType
    shape: tuple[int, ...]

    @functools.cached_property
    def nbytes(self) -> int:  # (asked for every HBM touch of every call the builder places)
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
    """A contiguous range of the unrolled stream's instructions: one kernel call."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class Executable:
    """Kernel calls of shared blocks (Note [blocks and calls] in blocks.py) and the HBM buffer
    table; `instructions` and `kernels` are the unrolled stream, made on demand."""

    name: str
    target: str
    hbm_bytes: int
    buffers: tuple[Buffer, ...]
    inputs: tuple[ValueLoc, ...]
    outputs: tuple[ValueLoc, ...]
    blocks: tuple[Block, ...]
    calls: tuple[Call, ...]
    shared_queues: int
    version: int = FORMAT_VERSION

    @functools.cached_property
    def instructions(self) -> tuple[isa.Instr, ...]:
        return expand(self.blocks, self.calls, self.shared_queues)

    @functools.cached_property
    def kernels(self) -> tuple[Kernel, ...]:
        """A kernel per call, with the calls that continue it (its loop's iterations)."""
        out, at = [], 0
        for call in self.calls:
            n = len(self.blocks[call.block].instructions)
            if call.more and out:
                out[-1] = Kernel(out[-1].name, out[-1].start, at + n)
            else:
                out.append(Kernel(call.name, at, at + n))
            at += n
        return tuple(out)

    @staticmethod
    def of_stream(
        name: str,
        target: str,
        hbm_bytes: int,
        buffers: tuple[Buffer, ...],
        inputs: tuple[ValueLoc, ...],
        outputs: tuple[ValueLoc, ...],
        instructions: tuple[isa.Instr, ...],
        kernels: tuple[Kernel, ...] = (),
    ) -> Executable:
        """An executable of an unrolled stream written out (a test's, a hand-written
        program's): each kernel (the whole stream if none is given) a block of its own, its
        waits on earlier kernels its call's."""
        kernels = kernels or (Kernel(name, 0, len(instructions)),)
        blocks, calls = [], []
        for k in kernels:
            local, waits = [], {}
            for j, ins in enumerate(instructions[k.start : k.stop]):
                inside = tuple(d - k.start for d in ins.deps if d >= k.start)
                outside = tuple(d for d in ins.deps if d < k.start)
                if outside:
                    waits[j] = outside
                local.append(dataclasses.replace(ins, deps=inside))
            block, args, offsets = parametrise(k.name, local)
            waits_ = tuple(sorted(waits.items()))
            calls.append(Call(k.name, len(blocks), args, 0, waits_, offsets))
            blocks.append(block)
        # Every call at phase 0: the stream's queues stay as written, none set aside.
        queues = get_target(target).dma_queues
        return Executable(
            name, target, hbm_bytes, buffers, inputs, outputs, tuple(blocks), tuple(calls), queues
        )

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


# Note [estimates past the core's HBM]: whether a graph whose tensors need more HBM than the
# target's core has is an error depends on what its executable is for. Running it is
# (CapacityError, from the builder at the first buffer past the end: the model would not fit
# the device either, so it is never a reason to fall back). Timing it (timing_only) is not:
# estimating a model one core cannot hold (an 8B model's training step needs its weights and
# their gradients, 32 GB, against a trn2 core's 12 GiB) is what such estimates are for. Its
# builder lays the buffers out past the end (fit_hbm=False); the graph is timed as if its core
# had the HBM, warned about once and listed in stats()["hbm_over_capacity"] with what it needs
# (frontend/backend.py). A cache entry an estimate stored still fails when a later run would
# execute it: over_capacity is checked on every entry the backend gets.


def over_capacity(exe: Executable) -> str | None:
    """What is wrong when exe's HBM buffers do not fit its target's HBM, else None."""
    target = get_target(exe.target)
    if exe.hbm_bytes <= target.hbm_bytes:
        return None
    by_kind = {k: sum(b.nbytes for b in exe.buffers if b.kind == k) for k in ("input", "output")}
    temps = exe.hbm_bytes - sum(by_kind.values())  # the arena's, the others', their alignment
    big = max(exe.buffers, key=lambda b: b.nbytes)
    return (
        f"tensors do not fit in HBM: {exe.name} needs {exe.hbm_bytes / 2**30:.2f} GiB (inputs "
        f"{by_kind['input'] / 2**30:.2f}, outputs {by_kind['output'] / 2**30:.2f}, temporaries "
        f"{temps / 2**30:.2f} GiB; the largest: {big.name} {list(big.shape)} {big.dtype.value}), "
        f"{target.name} has {target.hbm_bytes / 2**30:.0f} GiB per NeuronCore"
    )


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

    def encode(self, streams: list[tuple[isa.Instr, ...]]) -> tuple[list, list[list]]:
        """The operand table the streams share, and each stream's rows."""
        table: dict[isa.Operand, int] = {}
        encoded = []
        for instructions in streams:
            rows = []
            for ins in instructions:
                row: list[Any] = [ins.opcode, ins.engine, list(ins.deps)]
                for name, is_operand in self.fields[ins.opcode]:
                    value = getattr(ins, name)
                    row.append(table.setdefault(value, len(table)) if is_operand else value)
                rows.append(row)
            encoded.append(rows)
        return [_encode_ref(r) for r in table], encoded

    def decode(self, operands: list, streams: list) -> list[tuple[isa.Instr, ...]]:
        table = [_decode_ref(r) for r in operands]
        return [self._decode_rows(table, rows) for rows in streams]

    def _decode_rows(self, table: list, rows: list) -> tuple[isa.Instr, ...]:
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
    operands, streams = _CODEC.encode([b.instructions for b in exe.blocks])
    return {
        "version": exe.version,
        "name": exe.name,
        "target": exe.target,
        "hbm_bytes": exe.hbm_bytes,
        "buffers": [[b.name, b.kind, b.offset, b.dtype.value, list(b.shape)] for b in exe.buffers],
        "inputs": [[v.buffer, list(v.shape), v.dtype.value] for v in exe.inputs],
        "outputs": [[v.buffer, list(v.shape), v.dtype.value] for v in exe.outputs],
        "shared_queues": exe.shared_queues,
        "operands": operands,
        "blocks": [[b.name, b.params, rows] for b, rows in zip(exe.blocks, streams, strict=True)],
        **_encode_calls(exe),
    }


def _encode_calls(exe: Executable) -> dict:
    """The calls, each naming its waits in a table of distinct waits: a call's waits as how
    far back from the call's first instruction each waited-for instruction lies, the same
    for every layer of a model, so that the entry does not grow with its depth. A loop's
    iterations are one row (Note [instruction loops]): consecutive calls of one block whose
    waits lie as far back, whose offsets advance by the same strides and whose queue phase
    turns by the same step are a run, [name, block, args, phase, waits, offsets, more,
    count, phase step, strides]."""
    table: dict[tuple, int] = {}
    rows: list[list] = []
    base = 0
    for c in exe.calls:
        back = tuple((j, tuple(base - i for i in ids)) for j, ids in c.waits)
        waits = table.setdefault(back, len(table))
        offsets = list(c.starts)
        base += len(exe.blocks[c.block].instructions)
        if rows and _extends(rows[-1], c, waits, offsets, exe.shared_queues):
            rows[-1][7] += 1
            continue
        rows.append([c.name, c.block, list(c.args), c.phase, waits, offsets, int(c.more), 1, 0, []])
    return {"calls": rows, "waits": [[[j, list(ids)] for j, ids in back] for back in table]}


def _extends(row: list, c: Call, waits: int, offsets: list[int], queues: int) -> bool:
    """Whether call c is the next iteration of the run `row` (setting the run's steps at its
    second call)."""
    name, block, args, phase, row_waits, first, _, count, step, strides = row
    if (name, block, args, row_waits) != (c.name, c.block, list(c.args), waits) or not c.more:
        return False
    if count == 1:
        row[8] = (c.phase - phase) % queues
        row[9] = [o - f for o, f in zip(offsets, first, strict=True)]
        return True
    return c.phase == (phase + count * step) % queues and all(
        o == f + count * s for o, f, s in zip(offsets, first, strides, strict=True)
    )


def _decode_calls(d: dict, blocks: tuple[Block, ...], queues: int) -> tuple[Call, ...]:
    table = [[(j, tuple(ids)) for j, ids in back] for back in d["waits"]]
    calls, base = [], 0
    for name, block, args, phase, waits, offsets, more, count, step, strides in d["calls"]:
        if not 0 <= block < len(blocks) or len(args) != blocks[block].params:
            raise ValueError("a call names a block that is not there, or binds other parameters")
        if len(offsets) != len(args) or (count > 1 and len(strides) != len(args)) or count < 1:
            raise ValueError(f"call {name}: offsets, strides or count do not fit its block")
        back = table[waits] if 0 <= waits < len(table) else None
        args = tuple(args)
        for k in range(count):
            if back is None or any(not 0 < i <= base for _, ids in back for i in ids):
                raise ValueError(f"call {name} waits on instructions that are not before it")
            at = offsets if k == 0 else [o + k * s for o, s in zip(offsets, strides, strict=True)]
            calls.append(
                Call(
                    name,
                    block,
                    args,
                    (phase + k * step) % queues,
                    tuple((j, tuple(base - i for i in ids)) for j, ids in back),
                    tuple(at) if any(at) else (),
                    bool(more) or k > 0,
                )
            )
            base += len(blocks[block].instructions)
    return tuple(calls)


def _decode_executable(d: dict) -> Executable:
    try:
        streams = _CODEC.decode(d["operands"], [rows for _, _, rows in d["blocks"]])
        blocks = tuple(
            Block(name, params, instructions)
            for (name, params, _), instructions in zip(d["blocks"], streams, strict=True)
        )
        calls = _decode_calls(d, blocks, d["shared_queues"])
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
            blocks=blocks,
            calls=calls,
            shared_queues=d["shared_queues"],
            version=d["version"],
        )
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ValueError(f"malformed executable: {type(e).__name__}: {e}") from None
