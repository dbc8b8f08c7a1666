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
    kernels = [
        {
            "name": k.name,
            "start": k.start,
            "stop": k.stop,
            "block": call.block,
            "instructions": [(i, exe.instructions[i]) for i in range(k.start, k.stop)],
        }
        for k, call in zip(exe.kernels, exe.calls, strict=True)
        if k.stop > k.start
    ]
    return _template().render(exe=exe, kernels=kernels, describe=describe)
