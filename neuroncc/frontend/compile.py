"""nir -> passes -> program -> profile: the compile step every path shares (the Dynamo backend
and the warmup workers), and the cache key that names its result.

Nothing here imports torch: a warmup worker compiles manifest entries from their IR text.

Note [compiling without the collector]: a compile allocates millions of small objects
(instructions, tiles, tracker records), and in a process running PyTorch every so many
allocations start a full collection of a heap that holds torch, the model and Dynamo's graphs:
in the first call of a 4-layer Llama at seq 2048 (scale_bench's model), 14 full collections
took 4.0 s, most of them inside the 22 s of compiling. What a compile leaves for the collector
is small (the peak RSS of that run is the same without it), so the collector is off while a
graph compiles, as it is while a cached executable loads (program.no_gc).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from neuroncc import __version__
from neuroncc.codegen.executable.program import no_gc
from neuroncc.codegen.hardware.targets import get_target
from neuroncc.codegen.lower import emit_graph
from neuroncc.errors import CapacityError, internal_error
from neuroncc.ir.graph import Graph
from neuroncc.ir.printer import print_graph
from neuroncc.options import CompileOptions
from neuroncc.passes.manager import PassContext, PipelineResult, run_pipeline
from neuroncc.passes.pipelines import default_pipeline
from neuroncc.runtime.disk_cache import DiskCache, Entry, cache_key, open_cache
from neuroncc.runtime.timing import time_executable


def canonical_text(g: Graph) -> str:
    """The IR text that keys a graph: its name is not part of what it computes."""
    return print_graph(replace(g, name="main"))


def graph_key(ir_text: str, opts: CompileOptions) -> str:
    return cache_key(ir_text, opts.cache_key(), opts.target, __version__)


@dataclass
class Compiled:
    entry: Entry
    snapshots: list[tuple[str, str]] = field(default_factory=list)  # (pass name, IR text)


def _run_passes(g: Graph, opts: CompileOptions, snapshots: bool) -> PipelineResult:
    pipeline = default_pipeline(opts.opt_level, opts.auto_cast)
    return run_pipeline(g, pipeline, PassContext(get_target(opts.target)), snapshots)


def compile_nir(
    g: Graph, ir_text: str, opts: CompileOptions, name: str, snapshots: bool = False
) -> Compiled:
    """Run the pipeline of opts.opt_level on g (whose canonical_text is ir_text), emit the
    executable, time it once. A failure on the way is a NeuronccInternalError naming its stage;
    a graph whose tensors do not fit the target's HBM is a CapacityError, unless it is only to
    be timed."""
    start = time.perf_counter()
    target = get_target(opts.target)
    with no_gc():  # Note [compiling without the collector]
        result = _run_passes(g, opts, snapshots)
        stage = "program"
        try:
            planned = replace(result.graph, name=name)
            # an estimate may need more HBM than the core has (Note [estimates past the core's
            # HBM] in program.py)
            fit = not opts.timing_only
            exe = emit_graph(planned, target, check_reuse=opts.check_reuse, fit_hbm=fit)
            stage = "simulate"  # the timing model
            profile = time_executable(exe, target)
        except CapacityError:
            raise
        except Exception as e:
            raise internal_error(e, stage=stage) from e
    meta = {
        "name": name,
        "neuroncc": __version__,
        "target": opts.target,
        "options": opts.compile_fields(),
        "ir": ir_text,
        "compile_seconds": time.perf_counter() - start,
        "created": time.time(),
    }
    return Compiled(Entry(exe, profile, meta), result.snapshots)


def stage_snapshots(g: Graph, opts: CompileOptions) -> list[tuple[str, str]]:
    """(pass name, IR text) after each pass of opts' pipeline: what a compile of g dumps."""
    return _run_passes(g, opts, snapshots=True).snapshots


def disk_cache_for(opts: CompileOptions) -> DiskCache | None:
    return open_cache(opts.cache_dir, opts.cache_max_bytes) if opts.disk_cache else None
