"""The human-readable listing of an executable (the `program` stage's text form)."""

from __future__ import annotations

import dataclasses
import functools

import jinja2

from neuroncc.codegen.executable.program import Executable
from neuroncc.codegen.hardware import isa


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("neuroncc.codegen.executable", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template("listing.j2")


def describe(ins: isa.Instr) -> str:
    """One instruction's operands: `dst <- srcs` plus its immediates, but those at their
    default (a matmul's `transpose=False, tile_rows=0`, an activation's `scale=1.0`)."""
    ops = ins.operands()
    dst = [str(v) for k, v in ops.items() if k == "dst"]
    srcs = [
        str(v) for k, v in ops.items() if isinstance(v, (isa.TileRef, isa.DramRef)) and k != "dst"
    ]
    defaults = {f.name: f.default for f in dataclasses.fields(ins)}
    imms = [
        f"{k}={v}"
        for k, v in ops.items()
        if not isinstance(v, (isa.TileRef, isa.DramRef)) and defaults.get(k) != v
    ]
    text = f"{', '.join(dst)} <- {', '.join(srcs)}" if srcs else ", ".join(dst)
    return text + (f"  [{', '.join(imms)}]" if imms else "")


def listing(exe: Executable) -> str:
    """The unrolled stream kernel by kernel, each headed by the blocks its calls place (a
    loop's iterations: Note [instruction loops])."""
    blocks: list[list[int]] = []  # per kernel: the blocks of its calls
    for call in exe.calls:
        if call.more and blocks:
            blocks[-1].append(call.block)
        else:
            blocks.append([call.block])
    kernels = [
        {
            "name": k.name,
            "start": k.start,
            "stop": k.stop,
            "blocks": _runs(placed),
            "instructions": [(i, exe.instructions[i]) for i in range(k.start, k.stop)],
        }
        for k, placed in zip(exe.kernels, blocks, strict=True)
        if k.stop > k.start
    ]
    return _template().render(exe=exe, kernels=kernels, describe=describe)


def _runs(placed: list[int], longest: int = 64) -> str:
    """Block numbers with repeats counted: "3, 4 x12, 5", and a loop's period of several
    blocks "(4, 5, 6) x40": at each place, the period up to `longest` blocks that repeats
    over the most blocks (a kernel of 20000 calls is a line, not 20000 numbers)."""
    out: list[str] = []
    i, n = 0, len(placed)
    while i < n:
        best_p, best_count = 1, 1
        for p in range(1, min(longest, (n - i) // 2) + 1):
            end = i + p
            while end < n and placed[end] == placed[end - p]:
                end += 1
            count = (end - i) // p
            if count >= 2 and count * p > best_count * best_p:
                best_p, best_count = p, count
        period = ", ".join(map(str, placed[i : i + best_p]))
        if best_count == 1:
            out.append(period)
        else:
            out.append(f"{period} x{best_count}" if best_p == 1 else f"({period}) x{best_count}")
        i += best_p * best_count
    return ", ".join(out)
