"""Internal compiler errors: what a failure inside neuroncc leaves behind, and how to replay it.

Note [internal errors]: a failure inside neuroncc (a lowering rule, a decomposition of ours
under AOTAutograd, a pass, an emitter, the timing model, the simulator) is a bug in neuroncc,
never a reason to run quietly in PyTorch. It becomes a NeuronccInternalError naming the stage,
the pass and the node, and the frontend writes the failing input to the failures directory
(`dump_dir`/failures, else <tmp>/neuroncc-failures), with the one-line command that replays it:

- after import (passes, program, simulate): the graph's IR text, the options in its header
  comments; `neuroncc-dump repro FILE.nir` compiles it again (and simulates it on random
  inputs, for a failure at run time);
- before (lowering, AOTAutograd): the FX graph as a Python script, made by PyTorch's own
  minifier code (`generate_compiler_repro_string`), ending in a call of `reproduce_fx`;
  `python FILE.py` replays it.

With fallback=True the graph then runs eagerly, the warning says "internal compiler error" and
where the file is, and stats()["compiler_errors"] counts it by stage; stats()["fallback_nodes"]
counts only the ops neuroncc declines for want of a lowering. With fallback=False the error is
raised.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

from neuroncc.errors import NeuronccInternalError
from neuroncc.options import CompileOptions
from neuroncc.runtime.stats import STATS

_HEADER_OPTIONS = "# options: "
_HEADER_SIMULATE = "# simulate: true"


def failures_dir(opts: CompileOptions) -> Path:
    root = Path(opts.dump_dir) / "failures" if opts.dump_dir else None
    return root or Path(tempfile.gettempdir()) / "neuroncc-failures"


def _path(opts: CompileOptions, name: str, content: str, suffix: str) -> Path:
    digest = hashlib.sha256(content.encode()).hexdigest()[:10]
    folder = failures_dir(opts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}-{digest}{suffix}"


def _comment(text: str) -> str:
    return "\n".join(f"# {line}" for line in text.splitlines())


def _written(e: NeuronccInternalError, path: Path, text: str, repro: str) -> None:
    """Write `text` to `path` and record both in `e`; a failure to write is said in the
    error, not raised over it."""
    try:
        path.write_text(text)
    except OSError as os_error:
        e.dump, e.repro = f"(could not be written to {path}: {os_error})", None
    else:
        e.dump, e.repro = str(path), repro
    e.args = (e._text(),)


def with_ir_dump(
    e: NeuronccInternalError, ir_text: str, opts: CompileOptions, name: str, simulate: bool
) -> NeuronccInternalError:
    """e, with the failing graph's IR written out: `neuroncc-dump repro FILE` compiles it again
    with the same options (and simulates it on random inputs, if it failed at run time)."""
    options = json.dumps(opts.compile_fields(), sort_keys=True)
    path = _path(opts, name, ir_text + options, ".nir")
    header = [
        f"# neuroncc internal compiler error in graph {name}",
        _comment(e.message if e.node is None else f"{e.message}\nat {e.node}"),
        f"# stage: {e.stage}" + (f", pass {e.pass_name}" if e.pass_name else ""),
        _HEADER_OPTIONS + options,
        *([_HEADER_SIMULATE] if simulate else []),
        f"# reproduce: neuroncc-dump repro {path}",
    ]
    _written(e, path, "\n".join(header) + "\n" + ir_text, f"neuroncc-dump repro {path}")
    return e


def with_fx_dump(
    e: NeuronccInternalError, gm: Any, args: list, opts: CompileOptions, name: str, **how: Any
) -> NeuronccInternalError:
    """e, with the FX graph `gm` and its example arguments written as a Python script that
    compiles it again (`how`: reproduce_fx's kind, inference, static)."""
    from torch._dynamo.repro.after_aot import generate_compiler_repro_string

    try:
        script = generate_compiler_repro_string(gm, args)
    except Exception as failed:  # noqa: BLE001  (PyTorch's minifier could not write this graph)
        e.dump = f"(no repro: PyTorch's repro writer failed: {type(failed).__name__}: {failed})"
        e.args = (e._text(),)
        return e
    fields = json.dumps(opts.compile_fields(), sort_keys=True)
    path = _path(opts, name, script + fields, ".py")
    tail = (
        "\n\nif __name__ == '__main__':\n"
        "    from neuroncc.frontend.failures import reproduce_fx\n\n"
        f"    raise SystemExit(reproduce_fx(mod, load_args, {name!r}, {fields!r}, **{how!r}))\n"
    )
    head = f"# neuroncc internal compiler error in graph {name}\n{_comment(str(e))}\n"
    _written(e, path, head + script + tail, f"python {path}")
    return e


def report(e: NeuronccInternalError, name: str) -> None:
    """With fallback on: the graph runs eagerly; say so loudly, and count it."""
    STATS.add_compiler_error(e.stage)
    replay = f"; reproduce with: {e.repro}" if e.repro else f"; {e.dump}" if e.dump else ""
    warnings.warn(
        f"neuroncc internal compiler error in graph {name}, running it eagerly in PyTorch: "
        f"{e.summary().removeprefix('internal compiler error ')}{replay}",
        stacklevel=3,
    )


# -- replaying ------------------------------------------------------------------------------


def reproduce_ir(path: str) -> int:
    """`neuroncc-dump repro FILE.nir`: compile the IR again with the options in its header (and
    simulate it on random inputs if the header says so). 1 if it still fails, else 0."""
    from neuroncc.frontend.compile import compile_nir
    from neuroncc.ir.parser import parse
    from neuroncc.runtime.executor import CompiledExecutable

    text = Path(path).read_text()
    lines = text.splitlines()
    fields = next(ln[len(_HEADER_OPTIONS) :] for ln in lines if ln.startswith(_HEADER_OPTIONS))
    opts = CompileOptions(**json.loads(fields), disk_cache=False)
    g = parse(text)
    try:
        compiled = compile_nir(g, text, opts, g.name)
        if _HEADER_SIMULATE in lines:
            CompiledExecutable(compiled.entry.executable).run(_random_inputs(g))
    except Exception:  # noqa: BLE001  (whatever it is, the replay reports it)
        traceback.print_exc()
        print(f"reproduced: {path} still fails", file=sys.stderr)
        return 1
    print(f"not reproduced: {path} compiles" + (" and runs" if _HEADER_SIMULATE in lines else ""))
    return 0


def _random_inputs(g: Any) -> list:
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    out = []
    for v in g.inputs:
        dtype = v.type.dtype.torch
        values = torch.from_numpy(rng.standard_normal(v.type.shape).astype(np.float32))
        out.append(values.to(dtype) if dtype.is_floating_point else values.abs().to(dtype))
    return out


def reproduce_fx(mod: Any, load_args: Any, name: str, fields: str, **how: Any) -> int:
    """The end of a repro script (with_fx_dump): compile the FX graph again with fallback off
    and run it. 1 if it still fails, else 0."""
    import torch
    from torch._dynamo.debug_utils import InputReader
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from neuroncc.frontend import backend

    reader = InputReader()
    with warnings.catch_warnings():  # "could not load None, generating random data instead"
        warnings.simplefilter("ignore")
        load_args(reader)
    args = list(reader.args)
    gm = torch.fx.symbolic_trace(mod)
    opts = CompileOptions(**{**json.loads(fields), "fallback": False, "disk_cache": False})
    kind = how.pop("kind")
    try:
        if kind == "aten":  # the importer reads each node's example value
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                FakeTensorProp(gm, mode).propagate(*args)
            backend.compile_aten_graph(gm, args, opts=opts, name=name, **how)(args)
        else:  # a Dynamo graph: AOTAutograd, the compiles, a run, and its backward
            outs = backend._aot(gm, args, opts, name)(*args)
            grads = [o for o in _flat(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
            if grads:
                sum(o.float().sum() for o in grads).backward()
    except Exception:  # noqa: BLE001  (whatever it is, the replay reports it)
        traceback.print_exc()
        print(f"reproduced: graph {name} still fails", file=sys.stderr)
        return 1
    print(f"not reproduced: graph {name} compiles and runs")
    return 0


def _flat(outs: Any) -> list:
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]
