"""The pass manager: a pass is a small frozen object with a kebab-case `name` and one `run`.

`run_pipeline` applies passes in order, verifying the graph after each one and keeping a text
snapshot per stage (the dump). Pass names are the stage names of dumps and the CLI. A pass that
fails, or leaves a graph the verifier rejects, is an internal compiler error naming the pass
(Note [internal errors] in frontend/failures.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from neuroncc.codegen.hardware.targets import Target
from neuroncc.errors import CapacityError, internal_error
from neuroncc.ir.graph import Graph
from neuroncc.ir.printer import print_graph
from neuroncc.ir.verify import verify


@dataclass(frozen=True)
class PassContext:
    target: Target


class Pass(Protocol):
    name: ClassVar[str]

    def run(self, g: Graph, ctx: PassContext) -> Graph: ...


PASSES: dict[str, type] = {}


def register_pass(cls: type) -> type:
    PASSES[cls.name] = cls
    return cls


@dataclass
class PipelineResult:
    graph: Graph
    snapshots: list[tuple[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def run_pipeline(
    g: Graph, passes: Sequence[Pass], ctx: PassContext, snapshots: bool = False
) -> PipelineResult:
    result = PipelineResult(g)
    for p in passes:
        start = time.perf_counter()
        try:
            g = verify(p.run(g, ctx))
        except CapacityError:
            raise  # the model does not fit the target: a verdict, not a bug
        except Exception as e:
            raise internal_error(e, stage=p.name, pass_name=p.name) from e
        result.seconds[p.name] = time.perf_counter() - start
        if snapshots:
            result.snapshots.append((p.name, print_graph(g)))
    result.graph = g
    return result
