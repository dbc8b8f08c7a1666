"""A Dynamo FX graph with symbolic sizes as plain data, and back: what `neuroncc-warmup expand`
re-traces at sizes the trial run did not reach.

Only what Dynamo graphs of models hold is encoded: placeholders (tensors whose sizes are ints,
symbols like s0, or sizes computed from them like s0 + 1, see _size; and SymInt inputs), calls
of functions in torch / operator / math, Tensor method calls, and the output. Arguments are
nodes, Python scalars, strings, tuples, lists, slices, Ellipsis, dtypes, devices, memory
formats and layouts. Anything else raises NotSerializable and the graph is simply not
expandable.

Decoding looks functions up by their qualified name (under those three modules only) and
checks that the name it finds is the name it was given; it evaluates nothing. Running the
rebuilt graph runs those torch calls, as re-running the recorded script would: expand only
manifests you recorded.
"""

from __future__ import annotations

import functools
import importlib
import operator
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
    """A placeholder's spec (sizes as _size encodes them), with the trial run's argument."""
    example = node.meta.get("example_value")
    if isinstance(example, torch.SymInt):
        symbol = _size(example, int(arg), node.name)
        if not isinstance(symbol, str):
            raise NotSerializable(
                f"its int input {node.name} is {example.node.expr}, computed from other sizes, "
                "and expand sets only sizes of their own"
            )
        return {"kind": "symint", "symbol": symbol, "value": int(arg)}
    if isinstance(example, torch.Tensor) and isinstance(arg, torch.Tensor):
        return {
            "kind": "tensor",
            "shape": [_size(d, v, node.name) for d, v in zip(example.shape, arg.shape)],
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


# sympy's arithmetic on sizes (by class name: torch's FloorDiv and Mod are its own classes),
# as expand computes it; sizes are never negative, so floor division and mod are Python's
_ARITHMETIC = {
    "Add": "add",
    "Mul": "mul",
    "Pow": "pow",
    "FloorDiv": "floordiv",
    "CleanDiv": "floordiv",
    "Mod": "mod",
    "PythonMod": "mod",
}
_COMPUTE = {
    "add": operator.add,
    "mul": operator.mul,
    "pow": operator.pow,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
}


def _size(d: int | torch.SymInt, trial: int, name: str) -> int | str | dict:
    """A size: an int (also a SymInt Dynamo specialised, as to a Linear's in_features), a
    symbol's name, or a size computed from symbols (x[:, 1:] added to y makes x's size s1 + 1,
    s1 being y's) as {"expr": its text, "tree": its arithmetic}, which expand computes."""
    if isinstance(d, int) or d.node.expr.is_Integer:
        return int(d)
    expr = d.node.expr
    if expr.is_Symbol:
        return expr.name
    try:
        return {"expr": str(expr), "tree": _tree(expr)}
    except _NotArithmetic as e:
        raise NotSerializable(
            f"the size of {name} that was {trial} in the trial is {expr}, computed from other "
            f"sizes with {e}, which expand does not compute; record a trial at the sizes you "
            "need instead"
        ) from None


class _NotArithmetic(Exception):
    pass


def _tree(e: Any) -> int | str | list:
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return e.name
    op = _ARITHMETIC.get(type(e).__name__)
    if op is None or (op == "pow" and not (e.args[1].is_Integer and e.args[1] >= 0)):
        raise _NotArithmetic(type(e).__name__ if op is None else f"the power {e}")
    return [op, *(_tree(a) for a in e.args)]


def _compute(tree: int | str | list, sizes: dict[str, int]) -> int:
    if isinstance(tree, int):
        return tree
    if isinstance(tree, str):
        return sizes[tree]
    op, *args = tree
    if op not in _COMPUTE:
        raise ValueError(f"unknown size arithmetic {op!r}")
    return functools.reduce(_COMPUTE[op], (_compute(a, sizes) for a in args))


def _symbols(tree: int | str | list) -> list[str]:
    if isinstance(tree, int):
        return []
    if isinstance(tree, str):
        return [tree]
    return sorted({s for a in tree[1:] for s in _symbols(a)})


def _size_at(size: int | str | dict, sizes: dict[str, int]) -> int:
    return _compute(size["tree"] if isinstance(size, dict) else size, sizes)


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
    _check_computable(placeholders)
    return {"placeholders": placeholders, "nodes": nodes}


def _check_computable(placeholders: list[dict]) -> None:
    """Every symbol a computed size reads is an input's own size: what expand sets."""
    own = trial_sizes({"placeholders": placeholders})
    for size, name in _computed_sizes(placeholders):
        missing = [s for s in _symbols(size["tree"]) if s not in own]
        if missing:
            raise NotSerializable(
                f"a size of {name} is {size['expr']}, computed from {', '.join(missing)}, "
                "which is no input's own size, so expand cannot set it"
            )


def _computed_sizes(placeholders: list[dict]) -> list[tuple[dict, str]]:
    return [
        (d, p["name"])
        for p in placeholders
        if p["kind"] == "tensor"
        for d in p["shape"]
        if isinstance(d, dict)
    ]


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
            shape = [_size_at(d, sizes) for d in p["shape"]]
            dtype = _torch_attr(p["dtype"], torch.dtype)
            if p["item"] is not None:
                t = torch.tensor(p["item"], dtype=dtype)
            elif dtype.is_floating_point:
                t = torch.randn(shape).to(dtype)
            else:
                t = torch.zeros(shape, dtype=dtype)
            args.append(t.requires_grad_(p["requires_grad"]))
    return args


def computed_sizes(data: dict) -> list[tuple[str, int, dict[str, int]]]:
    """The sizes computed from symbols: (the expression, its value in the recorded call, the
    symbols it reads with theirs), each once."""
    trial = trial_sizes(data)
    found: dict[str, tuple[str, int, dict[str, int]]] = {}
    for size, _ in _computed_sizes(data["placeholders"]):
        symbols = {s: trial[s] for s in _symbols(size["tree"])}
        found.setdefault(size["expr"], (size["expr"], _compute(size["tree"], trial), symbols))
    return list(found.values())


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
