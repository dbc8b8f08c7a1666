"""The Dynamo backend `neuron`: torch.compile(model, backend="neuron", options={...}).

Dynamo hands over a Torch-IR graph; AOTAutograd turns it into forward and backward ATen graphs
(decomposed to core ATen); each goes through fx -> nir -> passes -> program and comes back as a
callable that runs the executable on the simulator. Options and environment are read once here.
"""

from __future__ import annotations

import copy
import functools
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

from neuroncc.codegen.executable.program import over_capacity
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.errors import (
    CapacityError,
    NeuronccError,
    NeuronccInternalError,
    UnsupportedError,
    internal_error,
)
from neuroncc.frontend import failures, recording
from neuroncc.frontend.compile import (
    Compiled,
    canonical_text,
    compile_nir,
    disk_cache_for,
    graph_key,
    stage_snapshots,
)
from neuroncc.frontend.complex_pairs import to_pairs
from neuroncc.frontend.decomp_attention import (
    ATTENTION_CALLS,
    flash_attention_cpu,
    key_chunk_for,
)
from neuroncc.frontend.decomp_grouped_mm import add_library_ops
from neuroncc.frontend.decomp_loss import GRADIENT_CALLS
from neuroncc.frontend.decompositions import DECOMPOSITIONS
from neuroncc.frontend.dump import dump_graph, write_run_summary_at_exit
from neuroncc.frontend.fx_import import ConstantOutput, ImportedGraph, import_fx
from neuroncc.frontend.fx_serde import STATIC_MARK
from neuroncc.frontend.partition import find_declined, report_fallback, split_graph
from neuroncc.frontend.weight_layout import LaidOut, take_transposed, transpose_graph
from neuroncc.ir.graph import Graph
from neuroncc.ir.types import TensorType
from neuroncc.ir.verify import verify
from neuroncc.options import CompileOptions
from neuroncc.runtime.cache import lookup_or_compile
from neuroncc.runtime.disk_cache import Entry
from neuroncc.runtime.executor import CompiledExecutable
from neuroncc.runtime.stats import STATS


class GraphRunner:
    """Runs one compiled ATen graph: binds arguments and constants, returns the FX outputs.

    With `timing_only` the executable is timed but not simulated: the outputs come from the
    ATen graph run eagerly, and each such execution is counted (stats: timing_only_executions).
    A failure in the simulator is an internal compiler error (Note [internal errors]): with
    fallback on, this graph runs eagerly from then on.
    """

    def __init__(
        self,
        compiled: CompiledExecutable,
        sources: list,
        slots: list[int | None | ConstantOutput],
        gm: torch.fx.GraphModule,
        failed: Callable[[NeuronccInternalError], bool],
        timing_only: bool = False,
    ) -> None:
        self.compiled, self.sources, self.slots = compiled, sources, slots
        self.gm, self.failed, self.timing_only = gm, failed, timing_only
        self.eager = False

    def __call__(self, *args: Any) -> list[torch.Tensor | None]:
        if any(isinstance(a, torch.Tensor) and a.device.type == "neuron" for a in args):
            return _on_device(self._run, args)
        return self._run(*args)

    def _run(self, *args: Any) -> list[torch.Tensor | None]:
        if self.eager:
            return _as_list(self.gm(*args))
        if self.timing_only:
            for kind, source in self.sources:
                if kind == "layout":
                    source(args, timing_only=True)
            self.compiled.record_timing_only()
            return _as_list(self.gm(*args))
        inputs = [self._bind(kind, s, args) for kind, s in self.sources]
        try:
            outs = self.compiled.run(inputs)
        except Exception as e:  # noqa: BLE001  (any simulator failure is an internal error)
            self.eager = self.failed(internal_error(e, stage="simulate"))  # or raises
            return _as_list(self.gm(*args))
        return [_output(s, outs) for s in self.slots]

    @staticmethod
    def _bind(kind: str, source: Any, args: Sequence[Any]) -> Any:
        if kind == "arg":
            return args[source]
        if kind == "scalar":
            return np.asarray(args[source].item(), dtype=np.float32)
        if kind == "layout":
            return source(args)  # a LaidOut weight
        return source  # a constant tensor of the graph module


def _output(slot: int | None | ConstantOutput, outs: list[torch.Tensor]) -> Any:
    if slot is None:
        return None
    if isinstance(slot, ConstantOutput):
        return slot.value
    return outs[slot]


class RegionModule(torch.nn.Module):
    """A compiled region inside a graph that also runs some nodes eagerly."""

    def __init__(self, run: Any, returns_tuple: bool) -> None:
        super().__init__()
        self.run, self.returns_tuple = run, returns_tuple

    def forward(self, *args: Any) -> Any:
        outs = self.run(*args)
        return tuple(outs) if self.returns_tuple else outs[0]


def _on_device(run: Callable[..., list], args: Sequence[Any]) -> list:
    """run on the host views of `neuron` tensors (the bytes that stand for HBM: Note [device
    memory]), its results as `neuron` tensors (memory.to_device)."""
    from neuroncc.device.memory import host_view, to_device

    on = [isinstance(a, torch.Tensor) and a.device.type == "neuron" for a in args]
    hosts = [host_view(a) if o else a for a, o in zip(args, on, strict=True)]
    return to_device(run(*hosts), hosts, list(args))


def compile_region(
    gm: torch.fx.GraphModule, opts: CompileOptions, name: str, static: frozenset[int] = frozenset()
) -> Callable[..., list]:
    """fx -> nir -> passes -> program for a graph neuroncc supports entirely (recorded, when
    recording; and only recorded, when tracing for warmup). `static`: the arguments that are
    an inference graph's parameters and buffers (Note [weight layout]). An internal compiler
    error comes out with its repro file written (Note [internal errors])."""
    try:
        imported = import_fx(gm, name)
    except NeuronccInternalError as e:
        how = {"kind": "aten", "inference": bool(static), "static": static}
        raise failures.with_fx_dump(e, gm, _example_args(gm), opts, name, **how) from None
    if static and opts.opt_level >= 2:
        imported = take_transposed(imported, static)
    g = verify(imported.graph)
    ir_text = canonical_text(g)
    key = graph_key(ir_text, opts)
    recording.record_graph(ir_text, opts, key, name)
    sources = _layout_sources(imported, opts, name)
    if recording.tracing_only():
        return lambda *args: _as_list(gm(*args))

    compiled_here: list[Compiled] = []

    def compile_entry() -> Entry:
        compiled_here.append(compile_nir(g, ir_text, opts, name, snapshots=bool(opts.dump_dir)))
        return compiled_here[0].entry

    compiled = _through_caches(key, compile_entry, g, ir_text, opts, name)
    if opts.dump_dir:
        if compiled_here:
            snapshots, meta = compiled_here[0].snapshots, compiled_here[0].entry.meta
        else:  # a cache hit: the passes again for their snapshots, the program from the cache
            snapshots, meta = stage_snapshots(g, opts), {"cache_hit": True}
        meta = {**{k: v for k, v in meta.items() if k != "ir"}, "key": key}  # IR: stage files
        dump_graph(opts.dump_dir, name, gm, g, snapshots, compiled.exe, meta)

    def failed(e: NeuronccInternalError) -> bool:
        e = failures.with_ir_dump(e, ir_text, opts, name, simulate=True)
        if not opts.fallback:
            raise e
        failures.report(e, name)
        return True

    slots = imported.output_slots
    return GraphRunner(compiled, sources, slots, gm, failed, timing_only=opts.timing_only)


def _through_caches(
    key: str, compile_entry: Callable[[], Entry], g: Graph, ir_text: str, opts, name: str
) -> CompiledExecutable:
    """lookup_or_compile, an internal compiler error coming out with its IR written, and the
    executable's HBM checked against the target's (Note [estimates past the core's HBM])."""
    try:
        compiled = lookup_or_compile(key, compile_entry, disk_cache_for(opts), name)
    except NeuronccInternalError as e:
        raise failures.with_ir_dump(e, ir_text, opts, name, simulate=False) from None
    problem = over_capacity(compiled.exe)
    if problem and not opts.timing_only:
        raise CapacityError(problem)  # a cache entry an estimate compiled
    if problem and STATS.add_over_capacity(name, compiled.exe.hbm_bytes):
        warnings.warn(
            f"neuroncc timing_only: {problem}; timed as if it fit (stats()['hbm_over_capacity'])",
            stacklevel=2,
        )
    return compiled


def _example_args(gm: torch.fx.GraphModule) -> list:
    """The placeholders' example values (fake tensors) AOTAutograd left in the graph."""
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _layout_sources(imported: ImportedGraph, opts: CompileOptions, name: str) -> list:
    """The graph's input sources, each ("layout", arg) bound to a LaidOut over the compiled
    transpose that lays its weight out (Note [weight layout])."""
    sources = []
    for pos, (v, (kind, source)) in enumerate(
        zip(imported.graph.inputs, imported.input_sources, strict=True)
    ):
        if kind == "layout":
            weight = TensorType(v.type.shape[::-1], v.type.dtype)
            key, compiled = _compile(transpose_graph(weight), opts, f"{name}_layout{pos}")
            source = LaidOut(source, key, compiled)
        sources.append((kind, source))
    return sources


def _compile(g: Graph, opts: CompileOptions, name: str) -> tuple[str, CompiledExecutable | None]:
    """(cache key, compiled graph) of a graph of neuroncc's own making, through the caches
    (only recorded, when tracing for warmup: no graph)."""
    ir_text = canonical_text(g)
    key = graph_key(ir_text, opts)
    recording.record_graph(ir_text, opts, key, name)
    if recording.tracing_only():
        return key, None
    compiled = _through_caches(
        key, lambda: compile_nir(g, ir_text, opts, name).entry, g, ir_text, opts, name
    )
    return key, compiled


def _compile_or_eager(
    gm: torch.fx.GraphModule, opts: CompileOptions, name: str, static: frozenset[int] = frozenset()
) -> Any:
    """compile_region, or with fallback on, the graph itself run eagerly if neuroncc declines
    it or fails on it (an internal compiler error: Note [internal errors])."""
    try:
        return compile_region(gm, opts, name, static)
    except UnsupportedError as e:
        if not opts.fallback:
            raise
        warnings.warn(
            f"neuroncc could not compile graph {name} (stage {e.stage}): {e}; "
            "running it eagerly in PyTorch",
            stacklevel=2,
        )
        STATS.add_fallback(e.op or f"graph:{e.stage}")
    except NeuronccInternalError as e:
        if not opts.fallback:
            raise
        failures.report(e, name)
    return lambda *args: _as_list(gm(*args))


def graph_runner(fn: Callable) -> GraphRunner | None:
    """The GraphRunner of what compile_aten_graph returned, if it compiled the graph whole."""
    return getattr(fn, "graph_runner", None)


def _as_list(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compile_aten_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    opts: CompileOptions,
    name: str,
    inference: bool = False,
    static: frozenset[int] | None = None,
):
    """The AOTAutograd compiler: the whole graph compiled, or compiled regions around the nodes
    neuroncc declines (which then run eagerly, see partition.py). An inference graph's
    parameters and buffers (`static`, else as AOTAutograd marked them) may be laid out once
    (Note [weight layout]). Complex values become pairs of reals first (Note [complex as
    pairs])."""
    if static is None and inference:
        static = _static_inputs()
    try:
        gm, boundary = to_pairs(gm)
    except Exception as e:  # noqa: BLE001  (a rewrite rule broke: Note [internal errors])
        how = {"kind": "aten", "inference": inference, "static": static}
        err = internal_error(e, stage="complex-pairs")
        err = failures.with_fx_dump(err, gm, list(example_inputs), opts, name, **how)
        if not opts.fallback:
            raise err from None
        failures.report(err, name)
        return make_boxed_func(lambda *args: _as_list(gm(*args)))
    if boundary is None:
        return _compile_real_graph(gm, example_inputs, opts, name, inference, static)
    example_inputs = boundary.args_as_pairs(example_inputs)
    return boundary.wrap(_compile_real_graph(gm, example_inputs, opts, name, inference, static))


def _compile_real_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    opts: CompileOptions,
    name: str,
    inference: bool,
    static: frozenset[int] | None,
):
    try:
        declined = find_declined(gm)
    except NeuronccInternalError as e:  # a lowering rule broke on a node: Note [internal errors]
        how = {"kind": "aten", "inference": inference, "static": static}
        e = failures.with_fx_dump(e, gm, list(example_inputs), opts, name, **how)
        if not opts.fallback:
            raise e from None
        failures.report(e, name)
        return make_boxed_func(lambda *args: _as_list(gm(*args)))
    if not declined:
        if not inference:
            static = frozenset()
        run = _compile_or_eager(gm, opts, name, static)
        boxed = make_boxed_func(run)
        boxed.graph_runner = run if isinstance(run, GraphRunner) else None
        return boxed
    if not opts.fallback:
        ops = sorted({str(n.target) for n in declined if n.target is not operator.getitem})
        first = next(iter(declined.values()))
        raise UnsupportedError(
            f"graph {name} uses ops neuroncc cannot compile: {ops} ({first}); "
            "fallback=True runs them eagerly",
            op=ops[0] if ops else None,
        )
    report_fallback(declined)
    split = split_graph(gm, declined)
    for node in split.graph.nodes:
        if node.op == "call_module":
            sub = getattr(split, node.target)
            returns_tuple = isinstance(sub.graph.output_node().args[0], (tuple, list))
            run = _compile_or_eager(sub, opts, f"{name}.{node.target}")
            setattr(split, node.target, RegionModule(run, returns_tuple))
    split.recompile()
    return make_boxed_func(split.forward)


def _static_inputs() -> frozenset[int]:
    """The graph's arguments that are parameters and buffers, as AOTAutograd marks them."""
    ctx = torch._guards.TracingContext.try_get()
    if ctx is None or ctx.fw_metadata is None:
        return frozenset()
    return frozenset(ctx.fw_metadata.static_input_indices)


def _dynamo_static_inputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """What _static_inputs finds under Dynamo, for an AOTAutograd run outside it (a shape
    specialisation): the module's own parameters and buffers, which AOTAutograd passes first,
    and the placeholders Dynamo marked static."""
    lifted = len(dict(gm.named_parameters())) + len(dict(gm.named_buffers()))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    marked = [n.meta.get("tensor_dict", {}).get(STATIC_MARK) for n in placeholders]
    return frozenset(range(lifted)) | {lifted + i for i, m in enumerate(marked) if m}


def _is_symbolic(example_inputs: Sequence[Any]) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(not isinstance(d, int) for d in x.shape):
            return True
    return False


class ShapeSpecializer:
    """Dynamo handed over symbolic sizes; neuroncc compiles static shapes. Each call's concrete
    signature (shapes, dtypes, requires_grad, int arguments, grad mode) gets its own
    AOTAutograd trace and neuroncc compile, made on first use and kept: a new shape costs one
    neuroncc compile and no Dynamo recompile, a seen shape costs nothing.

    With dynamic=True Dynamo also passes Python floats as 0-d tensors read with `.item()`; those
    reads are specialised to the value (which then joins the signature), as static shapes need."""

    def __init__(self, gm: torch.fx.GraphModule, opts: CompileOptions, name: str) -> None:
        self.gm, self.opts, self.name = gm, opts, name
        self.variants: dict[tuple, Any] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.scalar_reads = {
            i: [u.name for u in ph.users if u.op == "call_method" and u.target == "item"]
            for i, ph in enumerate(placeholders)
        }
        self.scalar_reads = {i: names for i, names in self.scalar_reads.items() if names}

    def signature(self, args: Sequence[Any]) -> tuple:
        sig: list[Any] = []
        for i, a in enumerate(args):
            if i in self.scalar_reads:
                sig.append(("item", a.item()))
            elif isinstance(a, torch.Tensor):
                sig.append((tuple(a.shape), a.dtype, a.requires_grad))
            else:
                sig.append(("value", a))
        return (*sig, torch.is_grad_enabled())

    def _specialised(self, args: Sequence[Any]) -> torch.fx.GraphModule:
        if not self.scalar_reads:
            return self.gm
        gm = torch.fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
        nodes = {n.name: n for n in gm.graph.nodes}
        for i, names in self.scalar_reads.items():
            value = args[i].item()
            for name in names:
                node = nodes[name]
                for user in list(node.users):
                    user.args = torch.fx.node.map_arg(
                        user.args, lambda a, n=node, v=value: v if a is n else a
                    )
                    user.kwargs = torch.fx.node.map_arg(
                        user.kwargs, lambda a, n=node, v=value: v if a is n else a
                    )
                gm.graph.erase_node(node)
        gm.recompile()
        return gm

    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        fn = self.variants.get(key)
        if fn is None:
            if not self.variants:
                recording.record_dynamo(self.gm, list(args), self.opts, self.name)
            name = f"{self.name}_v{len(self.variants)}"
            gm = self._specialised(args)
            fn = _aot(gm, list(args), self.opts, name, _dynamo_static_inputs(gm))
            self.variants[key] = fn
        return fn(*args)


# What passes through the backend as it is: neuroncc's own verdicts (bad options, a model too
# big for the target, fallback off), and the exceptions Dynamo answers itself, with a graph
# break (data-dependent outputs, ...) or a restart. Anything else is an internal compiler error.
_PASS_THROUGH = (
    NeuronccError,
    torch._dynamo.exc.TorchDynamoException,
    *torch._dynamo.exc.exceptions_allowed_to_be_fallback,
)


def _decompositions(target: str) -> dict:
    """The decomposition table for `target`: attention's forward takes its keys in chunks
    the target's attention kernel fits (Note [keys in chunks]). Made per compile, after
    add_library_ops has added what transformers registered."""
    chunk = key_chunk_for(get_target(target).sbuf_partition_bytes)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    return DECOMPOSITIONS | {flash: functools.partial(flash_attention_cpu, key_chunk=chunk)}


def _retarget(gm: torch.fx.GraphModule, calls: dict[Callable, Callable]) -> None:
    """The Dynamo graph's calls of each key of `calls` made calls of its value, before
    AOTAutograd traces them: Note [one attention op], Note [cross entropy traced], Note
    [where with a scalar traced]."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in calls:
            node.target = calls[node.target]
            changed = True
    if changed:
        gm.recompile()


def _aot(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    opts: CompileOptions,
    name: str,
    static: frozenset[int] | None = None,
):
    compilers = {
        kind: functools.partial(
            compile_aten_graph,
            opts=opts,
            name=f"{name}_{kind}",
            inference=kind == "inference",
            static=static,
        )
        for kind in ("forward", "backward", "inference")
    }
    add_library_ops(DECOMPOSITIONS)
    _retarget(gm, {**ATTENTION_CALLS, **GRADIENT_CALLS})
    backend = aot_autograd(
        fw_compiler=compilers["forward"],
        bw_compiler=compilers["backward"],
        inference_compiler=compilers["inference"],
        decompositions=_decompositions(opts.target),
        partition_fn=min_cut_rematerialization_partition,
    )
    try:
        return backend(gm, example_inputs)
    except _PASS_THROUGH:
        raise
    except Exception as e:  # a decomposition or AOTAutograd itself failed on this graph
        err = internal_error(e, stage="aot_autograd")
        err = failures.with_fx_dump(err, gm, example_inputs, opts, name, kind="dynamo")
        if not opts.fallback:
            raise err from e
        failures.report(err, name)
        return gm.forward


def neuron_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    options: dict | None = None,
    mode: str | None = None,
):
    opts = CompileOptions.from_user(options)
    if mode not in (None, "default"):
        warnings.warn(
            f"neuroncc ignores torch.compile mode={mode!r} (it has one mode)", stacklevel=2
        )
    if opts.timing_only:
        on_meta = any(isinstance(x, torch.Tensor) and x.is_meta for x in example_inputs)
        warnings.warn(
            "neuroncc timing_only: compiled programs are timed, not simulated; "
            + (
                "inputs on the meta device: nothing is computed"
                if on_meta
                else "outputs come from PyTorch eager"
            ),
            stacklevel=2,
        )
    if opts.dump_dir:
        write_run_summary_at_exit(opts.dump_dir)
    STATS.add("dynamo_graphs")
    name = f"graph{STATS.snapshot()['dynamo_graphs']}"
    if _is_symbolic(example_inputs):
        return ShapeSpecializer(gm, opts, name)
    return _aot(gm, example_inputs, opts, name)
