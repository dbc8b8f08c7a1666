"""Text → Graph, the inverse of printer.print_graph.

The parser re-types every node with its shape rule and checks the written type against it, so a
parsed graph always satisfies the verifier's type invariant. Errors name the line.
"""

from __future__ import annotations

import re

from neuroncc.ir.graph import CHOICES, AttrValue, Graph, Node, Value, make_attrs, normalize_attr
from neuroncc.ir.ops import BY_NAME
from neuroncc.ir.types import DType, TensorType

_HEADER = re.compile(r"^graph @([\w.\-]+)\((.*)\) \{$")
_NODE = re.compile(r"^%(\d+) = (\w+)(?: ([^{:]*?))?(?: \{(.*)\})? : (\S+)(?: \[(.*)\])?$")
_TYPE = re.compile(r"^(\w+)\[([\d,]*)\]$")


class ParseError(ValueError):
    pass


def parse_type(text: str) -> TensorType:
    m = _TYPE.match(text.strip())
    if not m:
        raise ParseError(f"bad type {text!r}, expected e.g. f32[4,8]")
    try:
        dtype = DType(m.group(1))
    except ValueError:
        allowed = ", ".join(d.value for d in DType)
        raise ParseError(f"unknown dtype {m.group(1)!r} (allowed: {allowed})") from None
    dims = tuple(int(d) for d in m.group(2).split(",") if d)
    return TensorType(dims, dtype)


def _parse_attr_value(text: str) -> AttrValue | str:
    text = text.strip()
    if text.startswith("["):
        inner = text[1:-1].strip()
        return tuple(int(v) for v in inner.split(",")) if inner else ()
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text  # a dtype or a name; make_attrs checks it


def _parse_attrs(text: str | None, schema: dict[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    if not text:
        return out
    for part in re.split(r",\s*(?=\w+=)", text):
        key, _, raw = part.partition("=")
        value = _parse_attr_value(raw)
        if schema.get(key) == "dtype":
            try:
                value = DType(value)
            except ValueError:
                raise ParseError(f"attribute {key}: unknown dtype {raw!r}") from None
        out[key.strip()] = value
    return out


def parse(text: str) -> Graph:
    lines = [
        ln.strip()
        for ln in text.strip().splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    if not lines:
        raise ParseError("empty input")
    m = _HEADER.match(lines[0])
    if not m:
        raise ParseError(f"line 1: expected 'graph @name(...) {{', got {lines[0]!r}")
    env: dict[int, Value] = {}
    inputs = []
    for param in filter(None, (p.strip() for p in re.split(r",\s*(?=%)", m.group(2)))):
        vid, _, ty = param.partition(":")
        v = Value(int(vid.strip().lstrip("%")), parse_type(ty))
        env[v.id] = v
        inputs.append(v)
    nodes, outputs, kernels = [], None, []
    choices: dict[int, tuple[tuple[str, AttrValue], ...]] = {}
    group: list[int] | None = None
    for lineno, line in enumerate(lines[1:], start=2):
        if line == "fuse {":
            if group is not None:
                raise ParseError(f"line {lineno}: fuse blocks do not nest")
            group = []
            continue
        if line == "}" and group is not None:
            if not group:
                raise ParseError(f"line {lineno}: empty fuse block")
            kernels.append(tuple(group))
            group = None
            continue
        if line == "}":
            break
        if line.startswith("return"):
            names = line[len("return") :].split(",")
            outputs = [_lookup(env, n, lineno) for n in names if n.strip()]
            continue
        node, chosen = _parse_node(line, env, lineno)
        nodes.append(node)
        if chosen:
            choices[node.out.id] = chosen
        if group is not None:
            group.append(nodes[-1].out.id)
    if group is not None:
        raise ParseError("a fuse block is not closed")
    if outputs is None:
        raise ParseError("graph has no return line")
    chosen = tuple(sorted(choices.items()))
    return Graph(m.group(1), tuple(inputs), tuple(nodes), tuple(outputs), tuple(kernels), chosen)


def _lookup(env: dict[int, Value], name: str, lineno: int) -> Value:
    name = name.strip()
    if not name.startswith("%") or not name[1:].isdigit():
        raise ParseError(f"line {lineno}: expected a value like %3, got {name!r}")
    vid = int(name[1:])
    if vid not in env:
        raise ParseError(f"line {lineno}: {name} is used before it is defined")
    return env[vid]


def _parse_node(
    line: str, env: dict[int, Value], lineno: int
) -> tuple[Node, tuple[tuple[str, AttrValue], ...]]:
    """The node on the line and the choices written after its type."""
    m = _NODE.match(line)
    if not m:
        raise ParseError(f"line {lineno}: cannot parse {line!r}")
    vid, opname, args, attr_text, ty, choice_text = m.groups()
    if opname not in BY_NAME:
        raise ParseError(f"line {lineno}: unknown op {opname!r}")
    op = BY_NAME[opname]
    inputs = tuple(_lookup(env, a, lineno) for a in (args or "").split(",") if a.strip())
    try:
        attrs = make_attrs(op, _parse_attrs(attr_text, op.info.attrs))
        want = op.info.rule([v.type for v in inputs], dict(attrs))
    except (TypeError, ValueError) as e:
        raise ParseError(f"line {lineno}: {e}") from None
    written = parse_type(ty)
    if written != want:
        raise ParseError(f"line {lineno}: type {written} disagrees with the shape rule ({want})")
    if int(vid) in env:
        raise ParseError(f"line {lineno}: %{vid} is defined twice")
    out = Value(int(vid), written)
    env[out.id] = out
    return Node(op, inputs, attrs, out), _parse_choices(choice_text, lineno)


def _parse_choices(text: str | None, lineno: int) -> tuple[tuple[str, AttrValue], ...]:
    kinds = {k: kind for k, (kind, _) in CHOICES.items()}
    raw = _parse_attrs(text, kinds)
    unknown = set(raw) - set(kinds)
    if unknown:
        raise ParseError(f"line {lineno}: unknown choice {sorted(unknown)}; known: {sorted(kinds)}")
    try:
        return tuple(sorted((k, normalize_attr(kinds[k], v)) for k, v in raw.items()))
    except TypeError as e:
        raise ParseError(f"line {lineno}: {e}") from None
