"""plan: where each intermediate value lives in HBM, recorded as the node's `hbm` choice.

Note [hbm plan]: without this pass every value codegen stores gets HBM of its own for the whole
program, so a training step's footprint is the sum of all its activations and gradients. Here
each value that will be stored (a node's result that is read outside its kernel, not a graph
output, not a reshape, which aliases its input, nor a transpose folded into its readers) gets a byte offset in
one arena, and values whose lifetimes do not overlap share bytes:

- positions count kernels in issue order (a fused group is one position), so this pass runs
  after schedule, once the order is final;
- a value lives from the kernel that makes it to the last kernel that reads it or reads a view
  of it: reshapes, transposes and slices may be read in place by their users (a folded
  transpose, the attention kernel's strided operands), and so may a cast of bf16 to f32
  (Note [widened scores]), so their readers count as the value's (a cast's output saved as
  a graph output is its own: the bf16 value lives to its last reader, not to the end);
  a value that a graph output views lives to the end;
- lifetimes are closed intervals: a kernel's inputs and outputs never share bytes, since it
  may still read one while it writes the other;
- values are placed largest first, each at the lowest 64-byte aligned offset that is free for
  its whole lifetime (greedy by size, as TFLite's and XLA's heap simulators do).

Codegen tracks dependencies by byte address (builder.py), so the first write into reused bytes
waits for the last read of the value that held them: reuse can cost overlap between kernels,
never correctness. On-chip memory is planned per kernel by the emitters (SBUF/PSUM pools freed
when a kernel closes) and the fuse pass only forms kernels whose working set fits, so nothing
spills. Without this pass (opt_level < 2) every stored value has its own buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from neuroncc.codegen.executable.builder import ALIGN
from neuroncc.codegen.executable.intervals import IntervalIndex
from neuroncc.codegen.kernels.views import (
    VIEW_OPS,
    cols_read_in_place,
    rows_read_in_place,
    widens_bf16,
)
from neuroncc.ir.graph import Graph, with_choices
from neuroncc.ir.ops import Op
from neuroncc.passes.manager import PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class Plan:
    name: ClassVar[str] = "plan"

    def run(self, g: Graph, ctx: PassContext) -> Graph:
        lifetimes = value_lifetimes(g)
        sizes = {n.out.id: n.out.type.nbytes for n in g.nodes}
        placed: IntervalIndex[tuple[int, int]] = IntervalIndex()  # lifetime -> (offset, end)
        made: dict[int, int] = {}
        order = sorted(lifetimes, key=lambda v: (-sizes[v], lifetimes[v][0], v))
        for vid in order:
            first, last = lifetimes[vid]
            offset = 0
            for o, e in sorted(placed.overlapping(first, last + 1)):
                if offset + sizes[vid] <= o:
                    break
                offset = max(offset, -(-e // ALIGN) * ALIGN)
            placed.add(first, last + 1, (offset, offset + sizes[vid]))
            made[vid] = offset
        return with_choices(g, "hbm", made) if made else g


def value_lifetimes(g: Graph) -> dict[int, tuple[int, int]]:
    """Stored value id -> (first, last) kernel position, both inclusive (Note [hbm plan])."""
    kernel_of, users = g.kernel_of(), g.users()
    outputs = {v.id for v in g.outputs}
    position: dict[int, int] = {}
    unit, previous = -1, None
    for n in g.nodes:
        k = kernel_of.get(n.out.id)
        unit += k is None or k != previous
        previous = k
        position[n.out.id] = unit
    end = unit + 1
    reads: dict[int, int] = {}  # the last kernel that reads the value, through views too
    last: dict[int, int] = {}
    for n in reversed(g.nodes):
        vid = n.out.id
        readers = users[vid]
        reads[vid] = max(
            [position[vid]]
            + [position[u.out.id] for u in readers]
            + [reads[u.out.id] for u in readers if u.op in VIEW_OPS or widens_bf16(u)]
        )
        last[vid] = max(
            [reads[vid], end if vid in outputs else -1]
            + [last[u.out.id] for u in readers if u.op in VIEW_OPS]  # (an output's views)
        )
    stored = {}
    # slices of W's rows, or of Wᵀ's columns, that the matmuls read where they are
    in_place = rows_read_in_place(g) | cols_read_in_place(g)
    for n in g.nodes:
        vid = n.out.id
        k = kernel_of.get(vid)
        read_outside = any(kernel_of.get(u.out.id) != k for u in users[vid]) or k is None
        aliases = n.op is Op.RESHAPE or g.choice(vid, "layout") in ("fold", "dot")
        aliases = aliases or vid in in_place
        if vid in outputs or aliases or not read_outside or n.out.type.nbytes == 0:
            continue
        stored[vid] = (position[vid], last[vid])
    return stored
