"""The Dynamo backend `neuron`: torch.compile(model, backend="neuron", options={...}).

Dynamo hands over a Torch-IR graph; AOTAutograd turns it into forward and backward ATen graphs
(decomposed to core ATen); each goes through fx -> nir -> passes -> program and comes back as a
callable that runs the executable on the simulator. Options and environment are read once here.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from neuroncc import __version__
from neuroncc.codegen.lower import emit_graph
from neuroncc.codegen.targets import get_target
from neuroncc.frontend.decompositions import DECOMPOSITIONS
from neuroncc.frontend.dump import dump_graph
from neuroncc.frontend.fx_import import import_fx
from neuroncc.ir.printer import print_graph
from neuroncc.ir.verify import verify
from neuroncc.options import CompileOptions
from neuroncc.passes.manager import PassContext, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.runtime.cache import GRAPH_CACHE, cache_key
from neuroncc.runtime.executor import CompiledExecutable
from neuroncc.runtime.stats import STATS



class GraphRunner:
    """Runs one compiled ATen graph; handed to AOTAutograd wrapped by make_boxed_func."""

    def __init__(self, compiled: CompiledExecutable, sources: list, slots: list[int | None]) -> None:
        self.compiled, self.sources, self.slots = compiled, sources, slots

    def __call__(self, *args: Any) -> list[torch.Tensor | None]:
        inputs = [args[s] if kind == "arg" else s for kind, s in self.sources]
        outs = self.compiled.run(inputs)
        return [None if s is None else outs[s] for s in self.slots]


def compile_aten_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, opts: CompileOptions, name: str
):
    imported = import_fx(gm, name)
    g = verify(imported.graph)
    target = get_target(opts.target)
    key = cache_key(print_graph(replace(g, name="main")), opts.cache_key(), target.name, __version__)

    def build() -> CompiledExecutable:
        result = run_pipeline(g, default_pipeline(opts.opt_level), PassContext(target), bool(opts.dump_dir))
        compiled = CompiledExecutable(emit_graph(result.graph, target))
        if opts.dump_dir:
            dump_graph(opts.dump_dir, name, gm, g, result.snapshots, compiled.exe)
        return compiled

    compiled, hit = GRAPH_CACHE.get_or_build(key, build)
    STATS.add("cache_hits_memory" if hit else "compiles")
    return make_boxed_func(GraphRunner(compiled, imported.input_sources, imported.output_slots))


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, mode: str | None = None):
    opts = CompileOptions.from_user(options)
    if mode not in (None, "default"):
        warnings.warn(
            f"neuroncc ignores torch.compile mode={mode!r} (it has one mode)", stacklevel=2
        )
    STATS.add("dynamo_graphs")
    n = STATS.snapshot()["dynamo_graphs"]
    compilers = {
        kind: functools.partial(compile_aten_graph, opts=opts, name=f"graph{n}_{kind}")
        for kind in ("forward", "backward", "inference")
    }
    backend = aot_autograd(
        fw_compiler=compilers["forward"],
        bw_compiler=compilers["backward"],
        inference_compiler=compilers["inference"],
        decompositions=DECOMPOSITIONS,
    )
    return backend(gm, example_inputs)
