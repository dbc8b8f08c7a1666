"""Proof that a program reads only bytes it has written: then its memories need no reset.

Every run used to start from fresh memories: HBM zeroed, SBUF and PSUM filled with NaN-like
bytes so that a read of a never-written tile shows in the results. That reset costs 8 ms of a
GPT-2 block's ~100 ms simulation. A checked run (the first of each executable, with the race
checker) also tracks which bytes have been written, the inputs' counting as written, and
checks every read against them and, at the end, the outputs. If no read found an unwritten
byte, what the program computes cannot depend on what memory held before, and its later runs
skip the reset (memory.prove_reads_only_written).

The marks are bytes laid out like the memories, read and written through views with the
operands' shapes and strides, so a check costs less than a copy of the operand.
A scatter counts as reading its whole table: the rows it does not name keep what they held.
"""

from __future__ import annotations

import numpy as np

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import isa
from neuroncc.runtime.memory import Memories


class WrittenBytes:
    def __init__(self, mem: Memories) -> None:
        self._mem = mem
        # On-chip marks: a [partition, byte] array per memory. HBM's: bytes laid out as HBM.
        self._tiles = {"sbuf": np.zeros(mem.sbuf.shape, np.uint8)}
        self._tiles["psum"] = np.zeros(mem.psum.shape, np.uint8)
        self._hbm = np.zeros(mem.hbm.size, np.uint8)
        for loc in mem.exe.inputs:
            buf = mem.exe.buffer(loc.buffer)
            self._hbm[buf.offset : buf.offset + buf.nbytes] = 1
        self.reads_only_written = True
        self._known: set[isa.Operand] = set()  # written: marks only ever go from 0 to 1

    def _marks_of(self, ref: isa.Operand) -> np.ndarray:
        """The marks of ref's bytes (1: written)."""
        if isinstance(ref, isa.TileRef):
            return self._tiles[ref.mem][
                ref.p0 : ref.p0 + ref.np, ref.offset : ref.offset + ref.free_bytes
            ]
        # HBM: the operand's view, an axis of its element's bytes added last.
        view = self._mem.dram(ref)
        offset = view.__array_interface__["data"][0] - self._mem.hbm.__array_interface__["data"][0]
        size = view.dtype.itemsize
        if view.ndim and view.strides[-1] == size:  # rows of contiguous elements: bytes
            shape, strides = (*view.shape[:-1], view.shape[-1] * size), (*view.strides[:-1], 1)
        else:
            shape, strides = (*view.shape, size), (*view.strides, 1)
        return np.ndarray(shape, np.uint8, self._hbm, offset, strides)

    def record(self, ins: isa.Instr) -> None:
        """Before ins runs: its reads are checked, then its writes count as written."""
        if not self.reads_only_written:
            return  # nothing left to prove
        reads = ins.reads()
        if isinstance(ins, isa.DmaScatter):
            reads = (*reads, ins.table)
        for ref in reads:
            if ref in self._known:
                continue
            marks = self._marks_of(ref)
            if marks.size and marks.min() == 0:  # min: 5x faster than all() on bytes
                self.reads_only_written = False
                return
            self._known.add(ref)
        for ref in ins.writes():
            if ref not in self._known:
                self._marks_of(ref)[...] = 1
                self._known.add(ref)

    def outputs_read(self, exe: Executable) -> bool:
        """After the run: whether the proof holds, the outputs' bytes read too."""
        for loc in exe.outputs:
            buf = exe.buffer(loc.buffer)
            if not self._hbm[buf.offset : buf.offset + buf.nbytes].all():
                self.reads_only_written = False
        return self.reads_only_written
