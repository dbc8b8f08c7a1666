"""Eager fallback: split an ATen graph into compiled regions and nodes that run in PyTorch.

A node is supported when its lowering rule accepts it, which is decided by lowering the node on
its own (rules may decline particular arguments, e.g. bitwise ops on integers). Supported nodes
are grouped into maximal regions by torch.fx's CapabilityBasedPartitioner; each region becomes a
compiled submodule, and only the declined nodes run eagerly, each counted in stats() and warned
about once per op per process.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from neuroncc.errors import UnsupportedError
from neuroncc.frontend.complex_pairs import COMPLEX_VIEW
from neuroncc.frontend.fx_import import lower_call
from neuroncc.frontend.registry import LOWERINGS, LowerCtx, fake_type
from neuroncc.ir.graph import GraphBuilder
from neuroncc.runtime.stats import STATS


def declined_reason(node: torch.fx.Node) -> str | None:
    """Why neuroncc cannot compile this call_function node, or None if it can."""
    if node.target is operator.getitem:
        return None
    if COMPLEX_VIEW in node.meta:
        return (
            f"a view of complex values for {node.meta[COMPLEX_VIEW]}, which has no rule for "
            "complex operands and runs eagerly (Note [complex as pairs])"
        )
    if node.target not in LOWERINGS:
        return f"no lowering for op {node.target}"
    b = GraphBuilder("probe")
    env: dict[torch.fx.Node, Any] = {}
    try:
        for arg in node.all_input_nodes:
            val = arg.meta.get("val")
            if isinstance(val, (tuple, list)):
                return f"{node.target} consumes a tuple"
            env[arg] = b.input(fake_type(val))
        lower_call(LowerCtx(b), node, env)
    except UnsupportedError as e:
        return str(e)
    return None


class _Support(OperatorSupportBase):
    def __init__(self, declined: dict[torch.fx.Node, str]) -> None:
        self.declined = declined

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node not in self.declined


def find_declined(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    declined = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            why = declined_reason(node)
            if why is not None:
                declined[node] = why
    # A getitem of a declined node runs where its tuple is: eagerly.
    for node in gm.graph.nodes:
        if node.target is operator.getitem and node.args[0] in declined:
            declined[node] = "getitem of a node that runs eagerly"
    return declined


def report_fallback(declined: dict[torch.fx.Node, str]) -> None:
    for node, why in declined.items():
        if node.target is operator.getitem:
            continue
        op = str(node.target)
        if STATS.add_fallback(op):
            warnings.warn(f"neuroncc runs {op} eagerly in PyTorch: {why}", stacklevel=4)


def split_graph(
    gm: torch.fx.GraphModule, declined: dict[torch.fx.Node, str]
) -> torch.fx.GraphModule:
    """gm with every supported region moved into a `fused_N` submodule (always returning a
    tuple), whose placeholders carry the metadata the importer needs."""
    partitioner = CapabilityBasedPartitioner(
        gm, _Support(declined), allows_single_node_partition=True
    )
    split = partitioner.fuse_partitions(partitioner.propose_partitions())
    for node in split.graph.nodes:
        if node.op == "call_module":
            sub = getattr(split, node.target)
            placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for ph, arg in zip(placeholders, node.args, strict=True):
                ph.meta.setdefault("val", arg.meta.get("val"))
    return split
