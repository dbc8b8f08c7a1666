"""A Dynamo FX graph with symbolic sizes as plain data, and back: what `neuroncc-warmup expand`
re-traces at sizes the trial run did not reach.

Only what Dynamo graphs of models hold is encoded: placeholders (tensors whose sizes are ints
or plain symbols like s0, and SymInt inputs), calls of functions in torch / operator / math,
Tensor method calls, and the output. Arguments are nodes, Python scalars, strings, tuples,
lists, slices, Ellipsis, dtypes, devices, memory formats and layouts. Anything else raises
NotSerializable and the graph is simply not expandable.

Decoding looks functions up by their qualified name (under those three modules only) and
checks that the name it finds is the name it was given; it evaluates nothing. Running the
rebuilt graph runs those torch calls, as re-running the recorded script would: expand only
manifests you recorded.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.fx

_MODULES = ("torch", "_operator", "operator", "math")


class NotSerializable(Exception):
    pass


def _qualified_name(fn: Any) -> str:
    try:
        name = torch.fx.node._get_qualified_name(fn)  # the name FX's own codegen uses
    except (AttributeError, RuntimeError) as e:
        raise NotSerializable(f"calls {fn!r}: {e}") from None
    if _safe_resolve(name) is not fn:
        raise NotSerializable(f"calls {name}, which is not found under that name")
    return name


def _resolve(name: str) -> Any:
    parts = name.split(".")
    if parts[0] not in _MODULES:
        raise ValueError(f"function {name} is outside {', '.join(_MODULES)}")
    obj: Any = importlib.import_module(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{name} is not a function")
    return obj


def _safe_resolve(name: str) -> Any:
    try:
        return _resolve(name)
    except (AttributeError, ValueError, TypeError, ImportError):
        return None


def _encode_arg(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, tuple):
        return {"tuple": [_encode_arg(x) for x in a]}
    if isinstance(a, list):
        return [_encode_arg(x) for x in a]
    if isinstance(a, dict) and all(isinstance(k, str) for k in a):  # kwargs (immutable_dict)
        return {"dict": [[k, _encode_arg(v)] for k, v in a.items()]}
    if isinstance(a, slice):
        return {"slice": [_encode_arg(x) for x in (a.start, a.stop, a.step)]}
    if a is Ellipsis:
        return {"ellipsis": True}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, (torch.memory_format, torch.layout)):
        return {"torch": str(a).removeprefix("torch.")}
    raise NotSerializable(f"argument of type {type(a).__name__}")


def _decode_arg(a: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if isinstance(a, list):
        return [_decode_arg(x, nodes) for x in a]
    if not isinstance(a, dict):
        return a
    if "node" in a:
        return nodes[a["node"]]
    if "tuple" in a:
        return tuple(_decode_arg(x, nodes) for x in a["tuple"])
    if "dict" in a:
        return {k: _decode_arg(v, nodes) for k, v in a["dict"]}
    if "slice" in a:
        return slice(*(_decode_arg(x, nodes) for x in a["slice"]))
    if "ellipsis" in a:
        return Ellipsis
    if "dtype" in a:
        return _torch_attr(a["dtype"], torch.dtype)
    if "device" in a:
        return torch.device(a["device"])
    if "torch" in a:
        return _torch_attr(a["torch"], (torch.memory_format, torch.layout))
    raise ValueError(f"unknown argument encoding {sorted(a)}")


def _torch_attr(name: str, kind: Any) -> Any:
    value = getattr(torch, name, None)
    if not isinstance(value, kind):
        raise TypeError(f"torch.{name} is not a {kind}")
    return value


STATIC_MARK = "_dynamo_static_input_type"  # Dynamo's mark of a parameter or buffer input


def _placeholder(node: torch.fx.Node, arg: Any) -> dict:
    """A placeholder's spec, sizes as ints or symbol names, with the trial run's argument."""
    example = node.meta.get("example_value")
    if isinstance(example, torch.SymInt):
        return {"kind": "symint", "symbol": _symbol(example), "value": int(arg)}
    if isinstance(example, torch.Tensor) and isinstance(arg, torch.Tensor):
        return {
            "kind": "tensor",
            "shape": [d if isinstance(d, int) else _symbol(d) for d in example.shape],
            "trial_shape": list(arg.shape),
            "dtype": str(arg.dtype).removeprefix("torch."),
            "requires_grad": arg.requires_grad,
            # a 0-d tensor the graph reads with .item(): the specialiser compiles its value
            "item": arg.item() if _read_with_item(node) else None,
            # a parameter or buffer, as Dynamo marked it (Note [weight layout])
            "static": bool(node.meta.get("tensor_dict", {}).get(STATIC_MARK)),
        }
    if isinstance(arg, (bool, int, float)):
        return {"kind": "value", "value": arg}
    raise NotSerializable(f"placeholder {node.name} of type {type(arg).__name__}")


def _read_with_item(node: torch.fx.Node) -> bool:
    return any(u.op == "call_method" and u.target == "item" for u in node.users)


def _symbol(d: torch.SymInt) -> str:
    text = str(d.node.expr)
    if not text.isidentifier():
        raise NotSerializable(f"a size {text} that is an expression, not a symbol")
    return text


def encode_graph(gm: torch.fx.GraphModule, args: list[Any]) -> dict:
    """gm (a Dynamo graph) and the arguments of one call of it, as data."""
    placeholders, nodes = [], []
    it = iter(args)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            placeholders.append({"name": n.name, **_placeholder(n, next(it))})
        elif n.op == "call_function":
            target = _qualified_name(n.target)
            nodes.append(
                ["call_function", n.name, target, _encode_arg(n.args), _encode_arg(n.kwargs)]
            )
        elif n.op == "call_method":
            nodes.append(
                ["call_method", n.name, n.target, _encode_arg(n.args), _encode_arg(n.kwargs)]
            )
        elif n.op == "output":
            nodes.append(["output", n.name, None, _encode_arg(n.args), _encode_arg({})])
        else:
            raise NotSerializable(f"a {n.op} node ({n.target})")
    return {"placeholders": placeholders, "nodes": nodes}


def decode_graph(data: dict) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    for p in data["placeholders"]:
        nodes[p["name"]] = g.placeholder(p["name"])
        if p.get("static"):
            nodes[p["name"]].meta["tensor_dict"] = {STATIC_MARK: "unguarded"}
    for op, name, target, args, kwargs in data["nodes"]:
        args, kwargs = _decode_arg(args, nodes), _decode_arg(kwargs, nodes)
        if op == "call_function":
            node = g.call_function(_resolve(target), tuple(args), kwargs)
        elif op == "call_method":
            if not (isinstance(target, str) and hasattr(torch.Tensor, target)):
                raise ValueError(f"{target!r} is not a Tensor method")
            node = g.call_method(target, tuple(args), kwargs)
        elif op == "output":
            node = g.output(args[0])
        else:
            raise ValueError(f"unknown node kind {op!r}")
        node.name = name
        nodes[name] = node
    return _as_from_dynamo(torch.fx.GraphModule(torch.nn.Module(), g))


def _as_from_dynamo(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Mark gm as a Dynamo graph, as Dynamo's own output is marked (and as its DDPOptimizer
    marks the graphs it splits), so that AOTAutograd reads the static marks of its
    placeholders. Its min-cut partitioner counts a parameter as free to save for the backward
    (it is alive anyway): without the marks it saves Wᵀ where the real run saves W, and the
    expanded graphs are not the ones the real run looks up."""
    gm.meta["dynamo_compile_id"] = None
    gm._param_name_to_source = {}  # Dynamo lifts parameters to placeholders: none are left
    for node in gm.graph.find_nodes(op="placeholder"):
        node._dynamo_source = None  # sources name guards; expand installs none
    return gm


def example_args(data: dict, sizes: dict[str, int]) -> list[Any]:
    """Arguments for the decoded graph with each symbol at sizes[symbol]. Tensor values do not
    shape the compiled graph, except the 0-d ones it reads with .item(): those keep the value
    of the trial run."""
    args: list[Any] = []
    for p in data["placeholders"]:
        if p["kind"] == "symint":
            args.append(sizes[p["symbol"]])
        elif p["kind"] == "value":
            args.append(p["value"])
        else:
            shape = [d if isinstance(d, int) else sizes[d] for d in p["shape"]]
            dtype = _torch_attr(p["dtype"], torch.dtype)
            if p["item"] is not None:
                t = torch.tensor(p["item"], dtype=dtype)
            elif dtype.is_floating_point:
                t = torch.randn(shape).to(dtype)
            else:
                t = torch.zeros(shape, dtype=dtype)
            args.append(t.requires_grad_(p["requires_grad"]))
    return args


def trial_sizes(data: dict) -> dict[str, int]:
    """symbol -> the value it had in the recorded call."""
    sizes: dict[str, int] = {}
    for p in data["placeholders"]:
        if p["kind"] == "symint":
            sizes[p["symbol"]] = p["value"]
        elif p["kind"] == "tensor":
            for d, v in zip(p["shape"], p["trial_shape"]):
                if isinstance(d, str):
                    sizes[d] = v
    return sizes
