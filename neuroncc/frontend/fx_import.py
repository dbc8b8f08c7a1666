"""FX (ATen, after AOTAutograd) -> tensor IR.

The importer only walks nodes and dispatches to the lowering registry: placeholders and
`get_attr` constants become graph inputs (constants stay data, bound at call time, never baked
into the IR), `call_function` nodes go to their rule, `getitem` picks from a rule's tuple, and
the output node gives the graph outputs. It knows no op semantics.

Every lowered result is checked against the FX node's metadata (shape and dtype), so a wrong
rule fails at compile time, naming the node, instead of computing a wrong answer. A rule that
breaks, or disagrees with PyTorch, is an internal compiler error (Note [internal errors]); a
rule that declines its arguments raises UnsupportedError, and that node runs eagerly.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from neuroncc.errors import NeuronccInternalError, UnsupportedError
from neuroncc.frontend import (  # noqa: F401 (register the lowerings)
    lower_conv,
    lower_index,
    lower_nn,
    lower_pointwise,
    lower_scan,
    lower_tensor,
)
from neuroncc.frontend.registry import LOWERINGS, LowerCtx, fake_type
from neuroncc.ir.graph import Graph, GraphBuilder, Value
from neuroncc.ir.types import DType, TensorType


def _lowering_bug(message: str, node: torch.fx.Node) -> NeuronccInternalError:
    return NeuronccInternalError(message, stage="nir", node=node.format_node())


@dataclass
class ImportedGraph:
    graph: Graph
    # Per IR input: ("arg", i) for the i-th runtime argument, ("scalar", i) for a 0-d float64
    # argument passed as fp32, or ("const", tensor). Integer arguments are specialised (the
    # graph is compiled per concrete value) and are not inputs.
    input_sources: list[tuple[str, Any]]
    # Per FX output: index into graph.outputs, None where the FX graph returns None, or the
    # Python number it returns (a size, fixed for this specialisation).
    output_slots: list[int | None | ConstantOutput]


@dataclass(frozen=True)
class ConstantOutput:
    """A graph output that is a number, not a tensor: returned as it is, never computed."""

    value: int | float | bool


def _map_args(x: Any, env: dict[torch.fx.Node, Any]) -> Any:
    if isinstance(x, torch.fx.Node):
        return env[x]
    if isinstance(x, (list, tuple)):
        return type(x)(_map_args(v, env) for v in x)
    if isinstance(x, dict):
        return {k: _map_args(v, env) for k, v in x.items()}
    return x


def _check_type(v: Value, expected: Any, node: torch.fx.Node) -> None:
    want = fake_type(expected)
    if v.type != want:
        raise _lowering_bug(f"lowering of {node.name} produced {v.type}, expected {want}", node)


def lower_call(ctx: LowerCtx, node: torch.fx.Node, env: dict) -> Any:
    """Lower one call_function node with its rule; check the result against the node's metadata."""
    rule = LOWERINGS.get(node.target)
    if rule is None:
        raise UnsupportedError(
            f"no lowering for op {node.target} (node {node.name}: {node.format_node()})",
            op=str(node.target),
        )
    ctx.node = node
    try:
        result = rule(ctx, *_map_args(node.args, env), **_map_args(node.kwargs, env))
    except UnsupportedError:
        raise
    except Exception as e:  # a rule that breaks on these arguments is a compiler bug
        raise _lowering_bug(f"lowering {node.target} failed: {type(e).__name__}: {e}", node) from e
    val = node.meta.get("val")
    if isinstance(result, Value):
        _check_type(result, val, node)
    else:
        for r, want in zip(result, val, strict=True):
            _check_type(r, want, node)
    return result


def import_fx(gm: torch.fx.GraphModule, name: str = "main") -> ImportedGraph:
    b = GraphBuilder(name)
    ctx = LowerCtx(b)
    env: dict[torch.fx.Node, Any] = {}
    sources: list[tuple[str, Any]] = []
    outputs: list[Value] = []
    slots: list[int | None | ConstantOutput] = []
    arg_index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype == torch.float64 and val.dim() == 0:
                # A Python float Dynamo passes as a tensor (dynamic=True); PyTorch promotes
                # such a wrapped scalar to the other operand's dtype, so fp32 holds it.
                env[node] = b.input(TensorType((), DType.F32))
                sources.append(("scalar", arg_index))
            elif isinstance(val, torch.Tensor):
                env[node] = b.input(fake_type(val))
                sources.append(("arg", arg_index))
            elif isinstance(val, int) or (val is None and not node.users):
                env[node] = val  # a size argument, fixed for this specialisation
            else:
                raise UnsupportedError(f"graph input {node.name} is {val!r}, not a tensor or int")
            arg_index += 1
        elif node.op == "get_attr":
            const = getattr(gm, node.target)
            if not isinstance(const, torch.Tensor):
                raise UnsupportedError(f"get_attr {node.target} is a {type(const).__name__}")
            env[node] = b.input(fake_type(const))
            sources.append(("const", const))
        elif node.op == "call_function" and node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
        elif node.op == "call_function":
            env[node] = lower_call(ctx, node, env)
        elif node.op == "output":
            results = node.args[0]
            for out in results if isinstance(results, (list, tuple)) else [results]:
                if out is None:
                    slots.append(None)
                    continue
                number = env.get(out) if isinstance(out, torch.fx.Node) else out
                if isinstance(number, (int, float, bool)):
                    slots.append(ConstantOutput(number))
                    continue
                if not isinstance(out, torch.fx.Node) or not isinstance(env.get(out), Value):
                    raise UnsupportedError(f"graph output {out!r} is not a tensor")
                slots.append(len(outputs))
                outputs.append(env[out])
        else:
            raise UnsupportedError(f"FX node kind {node.op!r} ({node.format_node()})")
    return ImportedGraph(b.build(outputs), sources, slots)
