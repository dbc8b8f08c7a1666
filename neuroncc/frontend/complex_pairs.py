"""Complex numbers as pairs of real tensors.

Note [complex as pairs]: the IR has no complex dtypes, and NeuronCore engines compute on reals.
Rotary embeddings written with complex arithmetic (Llama 4, DeepSeek-V2: `view_as_complex`,
`polar`, a complex `mul`, `view_as_real`) reach the backend as ATen ops on complex64 tensors,
in the forward graph and in its backward (conjugates, complex sums). `to_pairs` rewrites the
ATen graph before it is partitioned so that each complex tensor of shape S is a real tensor of
shape S + (2,), real part then imaginary part: exactly the layout of `torch.view_as_real`. So
`view_as_complex` and `view_as_real` become nothing, movement ops act on the leading dims, and
arithmetic becomes real arithmetic on the two parts (one rule per op in `RULES`).

A complex graph input or output crosses the boundary as its `view_as_real` (`Boundary`: a view,
nothing computed, nothing copied). An op on complex values with no rule here keeps its complex
operands (a `view_as_complex` of the pair is put before it, a `view_as_real` after) and the
partitioner declines it like any op neuroncc cannot lower, saying which op and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten

COMPLEX_VIEW = "neuroncc_complex_view"  # meta key: this view serves which op without a rule
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _is_complex(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and val.is_complex()


@dataclass(frozen=True)
class Boundary:
    """Which graph inputs and outputs are complex, to be passed as their view_as_real."""

    inputs: frozenset[int]
    outputs: frozenset[int]

    def args_as_pairs(self, args: Sequence[Any]) -> list:
        return [_as_pair(a) if i in self.inputs else a for i, a in enumerate(args)]

    def wrap(self, compiled: Callable) -> Callable:
        """A boxed function taking and returning complex tensors around `compiled`, which
        takes and returns their pairs."""

        def run(args: list) -> list:
            outs = compiled(self.args_as_pairs(args))
            return [_as_complex(o) if i in self.outputs else o for i, o in enumerate(outs)]

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


def _as_pair(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj())


def _as_complex(t: torch.Tensor) -> torch.Tensor:
    if t.stride(-1) != 1 or any(s % 2 for s in t.stride()[:-1]):
        t = t.contiguous()
    return torch.view_as_complex(t)


def to_pairs(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, Boundary | None]:
    """gm with its complex values as pairs (Note [complex as pairs]); gm itself and None when
    it has no complex values."""
    if not any(_is_complex(n.meta.get("val")) for n in gm.graph.nodes):
        return gm, None
    rewriter = _Rewriter(gm)
    graph = rewriter.run()
    return torch.fx.GraphModule(gm, graph, gm.__class__.__name__), rewriter.boundary()


class _Rewriter:
    """Copies gm's graph node by node; `env` maps each old node to its new node, which for a
    complex value is its pair (and the old node is then in `paired`)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.old = gm.graph
        self.graph = torch.fx.Graph()
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.paired: set[torch.fx.Node] = set()
        vals = [n.meta.get("val") for n in gm.graph.nodes]
        self.fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
        self.inputs: set[int] = set()
        self.outputs: set[int] = set()

    def boundary(self) -> Boundary:
        return Boundary(frozenset(self.inputs), frozenset(self.outputs))

    def run(self) -> torch.fx.Graph:
        placeholders = 0
        for node in self.old.nodes:
            if node.op == "placeholder":
                self._placeholder(node, placeholders)
                placeholders += 1
            elif node.op == "output":
                self._output(node)
            elif node.op == "call_function" and self._touches_complex(node):
                self._complex_call(node)
            else:
                self.env[node] = self.graph.node_copy(node, lambda n: self.env[n])
        return self.graph

    def _touches_complex(self, node: torch.fx.Node) -> bool:
        return _is_complex(node.meta.get("val")) or any(
            n in self.paired for n in node.all_input_nodes
        )

    def _placeholder(self, node: torch.fx.Node, index: int) -> None:
        new = self.graph.node_copy(node)
        if _is_complex(node.meta.get("val")):
            new.meta["val"] = _as_pair(node.meta["val"])
            self.paired.add(node)
            self.inputs.add(index)
        self.env[node] = new

    def _output(self, node: torch.fx.Node) -> None:
        outs = node.args[0]
        flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        for i, o in enumerate(flat):
            if isinstance(o, torch.fx.Node) and o in self.paired:
                self.outputs.add(i)
        self.graph.node_copy(node, lambda n: self.env[n])

    def _complex_call(self, node: torch.fx.Node) -> None:
        rule = RULES.get(node.target)
        result = rule(self, node) if rule is not None else None
        if result is None:  # no rule: the op keeps complex operands, and is declined later
            self._keep_complex(node)
            return
        val = node.meta.get("val")
        if _is_complex(val):
            result = self._checked_pair(result, val)
            self.paired.add(node)
        self.env[node] = result

    def _checked_pair(self, result: torch.fx.Node, val: torch.Tensor) -> torch.fx.Node:
        got = result.meta["val"]
        want = (*val.shape, 2)
        if tuple(got.shape) != want:
            raise AssertionError(f"complex pair of shape {tuple(got.shape)}, expected {want}")
        if got.dtype != _REAL_OF[val.dtype]:
            result = self.call(aten._to_copy.default, result, dtype=_REAL_OF[val.dtype])
        return result

    def _keep_complex(self, node: torch.fx.Node) -> None:
        def view(target: Any, n: torch.fx.Node) -> torch.fx.Node:
            v = self.call(target, n)
            v.meta[COMPLEX_VIEW] = str(node.target)
            return v

        def arg(n: torch.fx.Node) -> torch.fx.Node:
            return (
                view(aten.view_as_complex.default, self.env[n]) if n in self.paired else self.env[n]
            )

        new = self.graph.node_copy(node, arg)
        if _is_complex(node.meta.get("val")):
            new = view(aten.view_as_real.default, new)
            self.paired.add(node)
        self.env[node] = new

    # -- what rules use ------------------------------------------------------------------------

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        """A new node target(*args, **kwargs) with its meta value computed from its args'."""
        node = self.graph.call_function(target, args, kwargs)

        def val(a: Any) -> Any:
            return a.meta["val"] if isinstance(a, torch.fx.Node) else a

        vargs = torch.fx.node.map_aggregate(args, val)
        vkwargs = torch.fx.node.map_aggregate(kwargs, val)
        if self.fake_mode is not None:
            with self.fake_mode:
                node.meta["val"] = target(*vargs, **vkwargs)
        else:
            node.meta["val"] = target(*vargs, **vkwargs)
        return node

    def arg(self, node: torch.fx.Node, i: int, name: str | None = None, default: Any = None):
        """The node's argument i (or keyword `name`), mapped into the new graph."""
        a = node.args[i] if i < len(node.args) else node.kwargs.get(name, default)
        return torch.fx.node.map_arg(a, lambda n: self.env[n])

    def is_pair(self, node: torch.fx.Node, i: int) -> bool:
        a = node.args[i] if i < len(node.args) else None
        return isinstance(a, torch.fx.Node) and a in self.paired

    def parts(self, pair: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
        """(real, imaginary), each keeping the trailing dim (size 1) so they broadcast."""
        return (
            self.call(aten.slice.Tensor, pair, -1, 0, 1),
            self.call(aten.slice.Tensor, pair, -1, 1, 2),
        )

    def join(self, re: torch.fx.Node, im: torch.fx.Node) -> torch.fx.Node:
        return self.call(aten.cat.default, [re, im], -1)

    def complex_rank(self, node: torch.fx.Node) -> int:
        return node.args[0].meta["val"].dim()


Rule = Callable[[_Rewriter, torch.fx.Node], "torch.fx.Node | None"]
RULES: dict[Any, Rule] = {}


def _rule(*ops: Any) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


# -- the boundary between real and complex: nothing to compute ----------------------------------


@_rule(aten.view_as_complex.default, aten.view_as_real.default)
def _reinterpret(r: _Rewriter, node: torch.fx.Node):
    return r.arg(node, 0)


@_rule(aten.polar.default)
def _polar(r: _Rewriter, node: torch.fx.Node):
    mag, angle = r.arg(node, 0), r.arg(node, 1)
    re = r.call(aten.mul.Tensor, mag, r.call(aten.cos.default, angle))
    im = r.call(aten.mul.Tensor, mag, r.call(aten.sin.default, angle))
    return r.join(r.call(aten.unsqueeze.default, re, -1), r.call(aten.unsqueeze.default, im, -1))


@_rule(aten.complex.default)
def _complex(r: _Rewriter, node: torch.fx.Node):
    re, im = r.arg(node, 0), r.arg(node, 1)
    return r.join(r.call(aten.unsqueeze.default, re, -1), r.call(aten.unsqueeze.default, im, -1))


@_rule(aten.abs.default)
def _abs(r: _Rewriter, node: torch.fx.Node):
    pair = r.arg(node, 0)
    squares = r.call(aten.sum.dim_IntList, r.call(aten.mul.Tensor, pair, pair), [-1])
    return r.call(aten.sqrt.default, squares)


@_rule(aten.angle.default)
def _angle(r: _Rewriter, node: torch.fx.Node):
    pair = r.arg(node, 0)
    return r.call(
        aten.atan2.default,
        r.call(aten.select.int, pair, -1, 1),
        r.call(aten.select.int, pair, -1, 0),
    )


# -- movement: the same op on the leading dims --------------------------------------------------


@_rule(aten.clone.default, aten.alias.default, aten.detach.default)
def _same(r: _Rewriter, node: torch.fx.Node):
    return r.call(node.target, r.arg(node, 0))


@_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default)
def _sized(r: _Rewriter, node: torch.fx.Node):
    return r.call(node.target, r.arg(node, 0), [*r.arg(node, 1), 2])


@_rule(aten.repeat.default)
def _repeat(r: _Rewriter, node: torch.fx.Node):
    return r.call(node.target, r.arg(node, 0), [*r.arg(node, 1), 1])


@_rule(aten.permute.default)
def _permute(r: _Rewriter, node: torch.fx.Node):
    rank = r.complex_rank(node)
    dims = [_dim(d, rank) for d in r.arg(node, 1)]
    return r.call(node.target, r.arg(node, 0), [*dims, rank])


@_rule(aten.t.default)
def _t(r: _Rewriter, node: torch.fx.Node):
    if r.complex_rank(node) < 2:
        return r.call(aten.alias.default, r.arg(node, 0))
    return r.call(aten.transpose.int, r.arg(node, 0), 0, 1)


@_rule(aten.transpose.int)
def _transpose(r: _Rewriter, node: torch.fx.Node):
    rank = r.complex_rank(node)
    d0, d1 = (_dim(d, rank) for d in (r.arg(node, 1), r.arg(node, 2)))
    return r.call(node.target, r.arg(node, 0), d0, d1)


@_rule(aten.unsqueeze.default)
def _unsqueeze(r: _Rewriter, node: torch.fx.Node):
    return r.call(node.target, r.arg(node, 0), _dim(r.arg(node, 1), r.complex_rank(node) + 1))


@_rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(r: _Rewriter, node: torch.fx.Node):
    rank = r.complex_rank(node)
    dims = r.arg(node, 1, "dim", list(range(rank)))
    dims = [dims] if isinstance(dims, int) else dims
    return r.call(aten.squeeze.dims, r.arg(node, 0), [_dim(d, rank) for d in dims])


@_rule(aten.select.int, aten.slice.Tensor, aten.index_select.default)
def _indexed_dim(r: _Rewriter, node: torch.fx.Node):
    if not r.is_pair(node, 0) or any(n in r.paired for n in node.all_input_nodes[1:]):
        return None
    rank = r.complex_rank(node)
    args = [r.arg(node, i) for i in range(len(node.args))]
    kwargs = dict(torch.fx.node.map_arg(dict(node.kwargs), lambda n: r.env[n]))
    if len(args) > 1:
        args[1] = _dim(args[1], rank)
    else:
        kwargs["dim"] = _dim(kwargs.get("dim", 0), rank)
    return r.call(node.target, *args, **kwargs)


@_rule(aten.index.Tensor)
def _index(r: _Rewriter, node: torch.fx.Node):
    # The indices address leading dims only, so the trailing pair dim is kept whole.
    if not r.is_pair(node, 0):
        return None
    return r.call(node.target, r.arg(node, 0), r.arg(node, 1))


@_rule(aten.cat.default)
def _cat(r: _Rewriter, node: torch.fx.Node):
    tensors = node.args[0]
    if not all(t in r.paired for t in tensors):
        return None
    rank = tensors[0].meta["val"].dim()
    dim = _dim(r.arg(node, 1, "dim", 0), rank)
    return r.call(aten.cat.default, [r.env[t] for t in tensors], dim)


@_rule(aten.sum.dim_IntList)
def _sum(r: _Rewriter, node: torch.fx.Node):
    if node.kwargs.get("dtype") is not None:
        return None
    rank = r.complex_rank(node)
    dims = r.arg(node, 1, "dim") or list(range(rank))
    keepdim = r.arg(node, 2, "keepdim", False)
    return r.call(node.target, r.arg(node, 0), [_dim(d, rank) for d in dims], keepdim)


@_rule(aten._to_copy.default)
def _to_copy(r: _Rewriter, node: torch.fx.Node):
    dtype = node.kwargs.get("dtype")
    if set(node.kwargs) - {"dtype"} or not r.is_pair(node, 0) or dtype not in _REAL_OF:
        return None  # a device move, or complex -> real (drops the imaginary part): declined
    return r.call(node.target, r.arg(node, 0), dtype=_REAL_OF[dtype])


# -- arithmetic --------------------------------------------------------------------------------


def _operand(r: _Rewriter, node: torch.fx.Node, i: int) -> tuple[str, Any]:
    """('pair', node) | ('real', node with a trailing dim to broadcast) | ('scalar', complex)."""
    a = node.args[i]
    if isinstance(a, torch.fx.Node):
        if a in r.paired:
            return "pair", r.env[a]
        return "real", r.call(aten.unsqueeze.default, r.env[a], -1)
    return "scalar", complex(a)


def _scalar_pair(z: complex) -> tuple[float, float]:
    return z.real, z.imag


@_rule(aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar)
def _add(r: _Rewriter, node: torch.fx.Node):
    if node.kwargs.get("alpha", 1) != 1:
        return None
    minus = node.target in (aten.sub.Tensor, aten.sub.Scalar)
    op = aten.sub.Tensor if minus else aten.add.Tensor
    (ka, a), (kb, b) = _operand(r, node, 0), _operand(r, node, 1)
    if ka == "pair" and kb == "pair":
        return r.call(op, a, b)
    if ka != "pair":  # real or scalar + complex: swap, then negate the result for a - b
        if not minus:
            return _add_to_pair(r, b, ka, a, aten.add.Tensor)
        return r.call(aten.neg.default, _add_to_pair(r, b, ka, a, aten.sub.Tensor))
    return _add_to_pair(r, a, kb, b, op)


def _add_to_pair(r: _Rewriter, pair: torch.fx.Node, kind: str, other: Any, op: Any):
    re, im = r.parts(pair)
    if kind == "real":
        return r.join(r.call(op, re, other), im)
    x, y = _scalar_pair(other)
    return r.join(r.call(op, re, x), r.call(op, im, y))


@_rule(aten.neg.default)
def _neg(r: _Rewriter, node: torch.fx.Node):
    return r.call(aten.neg.default, r.arg(node, 0))


@_rule(aten._conj.default, aten.conj_physical.default, aten.conj.default)
def _conj(r: _Rewriter, node: torch.fx.Node):
    re, im = r.parts(r.arg(node, 0))
    return r.join(re, r.call(aten.neg.default, im))


@_rule(aten.mul.Tensor, aten.mul.Scalar)
def _mul(r: _Rewriter, node: torch.fx.Node):
    (ka, a), (kb, b) = _operand(r, node, 0), _operand(r, node, 1)
    if ka != "pair":
        (ka, a), (kb, b) = (kb, b), (ka, a)
    if kb == "real":
        return r.call(aten.mul.Tensor, a, b)
    if kb == "scalar":
        return (
            _times(r, r.parts(a), _scalar_pair(b)) if b.imag else r.call(aten.mul.Tensor, a, b.real)
        )
    return _times(r, r.parts(a), r.parts(b))


def _times(r: _Rewriter, a: tuple, b: tuple) -> torch.fx.Node:
    """(p + qi)(x + yi) = (px - qy) + (py + qx)i, the parts nodes or floats."""
    (p, q), (x, y), m = a, b, aten.mul.Tensor
    re = r.call(aten.sub.Tensor, r.call(m, p, x), r.call(m, q, y))
    im = r.call(aten.add.Tensor, r.call(m, p, y), r.call(m, q, x))
    return r.join(re, im)


@_rule(aten.div.Tensor, aten.div.Scalar)
def _div(r: _Rewriter, node: torch.fx.Node):
    (ka, a), (kb, b) = _operand(r, node, 0), _operand(r, node, 1)
    if kb == "real":
        return r.call(aten.div.Tensor, a, b) if ka == "pair" else None
    if kb == "scalar":
        z = 1 / b
        return (
            _times(r, r.parts(a), _scalar_pair(z)) if z.imag else r.call(aten.mul.Tensor, a, z.real)
        )
    if ka != "pair":
        return None  # real / complex: rare enough to leave to PyTorch
    # a / b = a * conj(b) / |b|^2
    x, y = r.parts(b)
    norm = r.call(aten.add.Tensor, r.call(aten.mul.Tensor, x, x), r.call(aten.mul.Tensor, y, y))
    p, q = r.parts(a)
    m = aten.mul.Tensor
    re = r.call(aten.add.Tensor, r.call(m, p, x), r.call(m, q, y))
    im = r.call(aten.sub.Tensor, r.call(m, q, x), r.call(m, p, y))
    return r.call(aten.div.Tensor, r.join(re, im), norm)


@_rule(aten.exp.default)
def _exp(r: _Rewriter, node: torch.fx.Node):
    # e^(p + qi) = e^p (cos q + i sin q)
    p, q = r.parts(r.arg(node, 0))
    mag = r.call(aten.exp.default, p)
    re = r.call(aten.mul.Tensor, mag, r.call(aten.cos.default, q))
    im = r.call(aten.mul.Tensor, mag, r.call(aten.sin.default, q))
    return r.join(re, im)
