"""Eager ops on the `neuron` device: each ATen op compiled as a one-op graph (Note [eager ops]).

Note [eager ops]: an op on `neuron` tensors is traced into an ATen graph of that op alone
(make_fx over fake tensors, with the backend's decompositions, functionalised so that an
in-place or `out=` op becomes its functional form plus the inputs it writes), and that graph
goes through the same pipeline as a graph Dynamo captured (`compile_aten_graph`): nodes the
compiler declines run in PyTorch on the host, counted in stats()["fallback_nodes"] and warned
once per op, and the rest runs as instructions on the simulator. The compiled op is kept per
signature (the op, its tensors' shapes and dtypes, every other argument), in memory here and
on disk through the graph cache, so an op compiles once. Ops that cannot be traced (their
output shape depends on the data: `nonzero`, `unique`) run on the host, counted the same way.

Note [timing_only eager ops]: with timing_only (NEURONCC_TIMING_ONLY) an op's program is
timed, not simulated, and its values come from PyTorch on the host, as for a compiled graph.
A graph runner would run the traced one-op graph for them; the op itself is called on the
host views instead (`_direct`), which gives the CPU's values (the traced graph is its
decomposition) for a fraction of the host time, in-place ops writing the device bytes as they
go. Factories (their `device=` would call the device again), ops returning lists and `out=`
arguments the op would resize (a host view cannot grow its device storage) keep the runner.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from neuroncc.device import memory
from neuroncc.runtime.stats import EAGER_PREFIX

if TYPE_CHECKING:
    from neuroncc.runtime.executor import CompiledExecutable


@dataclass
class CompiledOp:
    """An op compiled for one signature: `run` takes the host views of its tensor arguments
    and returns the values it writes into its mutated arguments (`writes`: their positions
    among the tensor arguments), then its outputs."""

    run: Callable[[list], list]
    writes: tuple[int, ...]
    lists: tuple[int | None, ...] = ()  # per output: the length of the list it is (None: a tensor)
    fresh: bool = False  # it writes no argument and returns one new tensor (most ops)
    timed: CompiledExecutable | None = None  # timing_only: the executable timed for each call


_CACHE: dict[Any, CompiledOp | str] = {}  # a str: why the op runs on the host
_LOCK = threading.Lock()


def run(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """op on `neuron` tensors, compiled (or on the host if it cannot be), with PyTorch's
    results: new `neuron` tensors, or the arguments an in-place or `out=` op returns."""
    args, leaves, spec, positions, tensors, hosts = arguments(op, args, kwargs)
    key = _signature(op, leaves, spec)
    compiled = _CACHE.get(key, ...)
    if compiled is ...:
        with _LOCK:
            compiled = _CACHE.get(key, ...)
            if compiled is ...:
                compiled = _CACHE[key] = _compile(op, leaves, positions, spec, hosts)
    if isinstance(compiled, str):
        return _on_host(op, leaves, positions, spec, tensors, hosts, compiled)
    if compiled.timed is not None:  # timed, and computed by PyTorch on the host views
        compiled.timed.record_timing_only()
        value = call_on(op, leaves, positions, spec, hosts)
        if compiled.fresh:
            return memory.adopt(value)
        return results(op, args, kwargs, list(value) if isinstance(value, tuple) else [value])
    values = compiled.run(hosts)
    if compiled.fresh and isinstance(values[0], torch.Tensor):
        return memory.adopt(values[0])
    for k, value in zip(compiled.writes, values, strict=False):
        if tensors[k].shape != value.shape:  # an `out=` argument takes the result's shape
            tensors[k].resize_(value.shape)
        memory.host_view(tensors[k]).copy_(value)
    outs = values[len(compiled.writes) :]
    if any(n is not None for n in compiled.lists):  # the graph returns lists' tensors flat
        flat, outs = iter(outs), []
        for n in compiled.lists:
            outs.append(next(flat) if n is None else [next(flat) for _ in range(n)])
    return results(op, args, kwargs, outs)


def arguments(op, args: tuple, kwargs: dict) -> tuple:
    """op's arguments as the device's ops take them: (args with numbers wrapped, their leaves
    and spec (`_flatten`), the positions of the tensors among the leaves, the tensors, their
    host views)."""
    args = _wrap_numbers(op, args)
    leaves, spec = _flatten(args, kwargs)
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    return args, leaves, spec, positions, tensors, _hosts(op, tensors)


_FLAT = (torch.Tensor, int, float, bool, type(None), torch.dtype)


def _flatten(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """op's arguments as a list of leaves, and how to put them back (`_unflatten`): None when
    they are flat already (most ops); else the number of positional arguments, the keywords,
    and per argument None (a leaf) or the type and length of its list. ATen's arguments are
    never lists of lists."""
    if not kwargs and all(isinstance(x, _FLAT) for x in args):
        return list(args), None
    leaves, shape = [], []
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            shape.append((type(x), len(x)))
            leaves.extend(x)
        else:
            shape.append(None)
            leaves.append(x)
    return leaves, (len(args), tuple(kwargs), tuple(shape))


def _unflatten(leaves: list, spec) -> tuple[list, dict]:
    if spec is None:
        return leaves, {}
    n, keys, shape = spec
    values, at = [], 0
    for kind in shape:
        if kind is None:
            values.append(leaves[at])
            at += 1
        else:
            values.append(kind[0](leaves[at : at + kind[1]]))
            at += kind[1]
    return values[:n], dict(zip(keys, values[n:], strict=True))


def _wrap_numbers(op, args: tuple) -> tuple:
    """PyTorch hands a Python kernel the number a `Tensor` argument was given as (`x % 3`);
    the op itself wants it as a tensor again."""
    positions = _tensor_positions(op)
    for k in positions:
        if k < len(args) and isinstance(args[k], (int, float)):
            return tuple(
                torch.tensor(x) if i in positions and isinstance(x, (int, float)) else x
                for i, x in enumerate(args)
            )
    return args


@functools.cache
def _tensor_positions(op) -> frozenset[int]:
    return frozenset(
        k
        for k, a in enumerate(op._schema.arguments)
        if str(a.type) == "Tensor" and not a.kwarg_only
    )


def _hosts(op, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The host views of op's `neuron` tensors; CPU tensors only as scalars (0-dim), as on
    any device."""
    hosts = []
    for t in tensors:
        if t.is_cpu and t.dim() == 0:
            hosts.append(t)
        elif not t.is_cpu and t.device.type == memory.DEVICE:
            hosts.append(memory.host_view(t))
        else:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {memory.DEVICE}:0 and {t.device}! (in {op})"
            )
    return hosts


def _signature(op, leaves: list, spec) -> Any:
    parts = [op, spec]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            parts.append((x.shape, x.dtype, x.is_cpu))
        elif isinstance(x, float):
            parts.append(repr(x))  # nan equals itself, -0.0 differs from 0.0
        elif isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
            parts.append(str(x))
        else:
            parts.append((type(x), x))
    return tuple(parts)


def _compile(op, leaves: list, positions: list[int], spec, hosts: list) -> CompiledOp | str:
    """The one-op graph compiled; or why it cannot be traced (the op then runs on the host:
    mostly ops whose output shape depends on the data)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuroncc.frontend.backend import compile_aten_graph, graph_runner
    from neuroncc.frontend.decompositions import DECOMPOSITIONS

    def call(*ts):
        flat = list(leaves)
        for i, t in zip(positions, ts, strict=True):
            flat[i] = t
        a, k = _unflatten(flat, spec)
        return op(*a, **k)

    try:
        traced = make_fx(
            torch.func.functionalize(call, remove="mutations_and_views"),
            decomposition_table=DECOMPOSITIONS,
            tracing_mode="fake",
        )(*hosts)
    except Exception as e:  # noqa: BLE001 (data-dependent shapes and the like: run on the host)
        lines = str(e).strip().splitlines()
        return f"it cannot be traced: {type(e).__name__}: {lines[0] if lines else ''}"
    writes, lists = _strip_writes(traced)
    opts = _options()
    fn = compile_aten_graph(traced, hosts, opts=opts, name=f"{EAGER_PREFIX}{op}")
    fresh = not writes and lists == (None,) and _returns(op) == (None,)
    compiled = CompiledOp(fn, writes, lists, fresh)
    runner = graph_runner(fn)
    if opts.timing_only and runner is not None and _direct(traced, compiled, leaves, hosts):
        compiled.timed = runner.compiled  # Note [timing_only eager ops]
    return compiled


def _direct(traced: torch.fx.GraphModule, compiled: CompiledOp, leaves: list, hosts: list) -> bool:
    """Whether op itself, called on its arguments' host views, does what its compiled graph
    does: it has tensor arguments and no `device=` (a factory would call the device again),
    returns no list, and what it writes has its argument's shape (no `out=` resized: a host
    view cannot grow its device storage)."""
    if not hosts or any(isinstance(x, torch.device) for x in leaves):
        return False
    if any(n is not None for n in compiled.lists):
        return False
    output = next(n for n in traced.graph.nodes if n.op == "output")
    written = output.args[0][: len(compiled.writes)]
    return all(
        v.meta["val"].shape == hosts[k].shape for k, v in zip(compiled.writes, written, strict=True)
    )


def call_on(op, leaves: list, positions: list[int], spec, hosts: list) -> Any:
    """op called on the host views `hosts` of its tensor arguments."""
    flat = list(leaves)
    for i, h in zip(positions, hosts, strict=True):
        flat[i] = h
    a, k = _unflatten(flat, spec)
    return op(*a, **k)


def _strip_writes(gm: torch.fx.GraphModule) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """Turn the functionalised graph's `copy_(input, value)` epilogue into outputs: the graph
    returns the written values first; their inputs' positions. An output that is a list of
    tensors (`_fused_adamw` returns five) is returned flat: per output, its list's length
    (None: a tensor)."""
    g = gm.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    output = next(n for n in g.nodes if n.op == "output")
    writes, values = [], []
    for n in list(g.nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default:
            dst, value = n.args
            while dst.op == "call_function" and dst.target is torch.ops.aten.resize_.default:
                dst = dst.args[0]  # an `out=` argument resized to the result's shape
            writes.append(placeholders.index(dst))
            values.append(value)
            n.replace_all_uses_with(value)
            g.erase_node(n)
    outs = output.args[0]
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    lists = tuple(len(o) if isinstance(o, (tuple, list)) else None for o in outs)
    outs = [x for o in outs for x in (o if isinstance(o, (tuple, list)) else [o])]
    output.args = ((*values, *outs),)
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and n.target is torch.ops.aten.resize_.default and not n.users:
            g.erase_node(n)
    g.eliminate_dead_code()
    gm.recompile()
    return tuple(writes), lists


def _options():
    """The options from the environment (NEURONCC_TARGET, ...), read when an op compiles."""
    from neuroncc.options import CompileOptions

    opts = CompileOptions.from_user({})
    if opts.timing_only and not _warned_timing_only:
        _warned_timing_only.append(True)
        warnings.warn(
            "neuroncc timing_only (NEURONCC_TIMING_ONLY): the neuron device's ops are timed, "
            "not simulated; their results come from PyTorch on the host",
            stacklevel=4,
        )
    return opts


_warned_timing_only: list[bool] = []


def _on_host(op, leaves, positions, spec, tensors, hosts, why: str) -> Any:
    """op run by PyTorch on the host views (counted and warned once, as a declined node)."""
    from neuroncc.runtime.stats import STATS

    if STATS.add_fallback(str(op)):
        warnings.warn(
            f"neuroncc runs {op} on the host CPU for the neuron device: {why}", stacklevel=3
        )
    return memory.to_device(call_on(op, leaves, positions, spec, hosts), hosts, tensors)


def results(op, args: tuple, kwargs: dict, outs: list) -> Any:
    """What op returns: for each of its schema's returns, the argument it aliases (in-place
    and `out=` ops) or a new `neuron` tensor over the computed value."""
    values = iter(outs)
    result = []
    for written in _returns(op):
        if written is not None:
            position, name = written
            result.append(args[position] if position < len(args) else kwargs[name])
            next(values, None)
        else:
            value = next(values, None)  # (a graph leaves out a return that is None)
            if isinstance(value, (list, tuple)):
                result.append([memory.adopt(v) for v in value])
            else:
                result.append(memory.adopt(value) if isinstance(value, torch.Tensor) else value)
    if not result:  # an op returning nothing (it writes its arguments: _foreach_add_)
        return None
    return result[0] if len(result) == 1 else tuple(result)


@functools.cache
def _returns(op) -> tuple:
    """Per return of op's schema: the (position, name) of the argument it writes and returns
    (in-place and `out=` ops), or None for a new value."""
    schema = op._schema
    written = {}
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            position = len(schema.arguments) if arg.kwarg_only else k
            written[frozenset(arg.alias_info.before_set)] = (position, arg.name)
    return tuple(
        written[frozenset(r.alias_info.before_set)]
        if r.alias_info is not None and r.alias_info.is_write
        else None
        for r in schema.returns
    )
