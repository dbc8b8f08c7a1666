"""The static-shape tensor IR: types, op table, graphs, verifier, printer, parser, interpreter."""

from neuroncc.ir.graph import Graph, GraphBuilder, Node, Value
from neuroncc.ir.interpret import interpret
from neuroncc.ir.ops import Kind, Op
from neuroncc.ir.parser import ParseError, parse
from neuroncc.ir.printer import print_graph
from neuroncc.ir.types import DType, TensorType
from neuroncc.ir.verify import VerifyError, verify

__all__ = [
    "DType",
    "Graph",
    "GraphBuilder",
    "Kind",
    "Node",
    "Op",
    "ParseError",
    "TensorType",
    "Value",
    "VerifyError",
    "interpret",
    "parse",
    "print_graph",
    "verify",
]
