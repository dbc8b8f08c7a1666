import dataclasses

import pytest

from neuroncc.ir import DType, Graph, GraphBuilder, Node, Op, TensorType, Value, VerifyError, verify


def _graph():
    b = GraphBuilder("main")
    x = b.input(TensorType((4, 8), DType.F32))
    y = b.op(Op.EXP, x)
    z = b.op(Op.ADD, y, x)
    w = b.op(Op.REDUCE_MAX, z, axes=[1], keepdim=False)
    return b.build([w])


def test_well_formed_graph_passes():
    g = _graph()
    assert verify(g) is g


def _replace_node(g: Graph, i: int, node: Node) -> Graph:
    nodes = list(g.nodes)
    nodes[i] = node
    return dataclasses.replace(g, nodes=tuple(nodes))


def test_wrong_result_type_names_node_and_shows_context():
    g = _graph()
    bad = dataclasses.replace(g.nodes[1], out=Value(2, TensorType((4, 9), DType.F32)))
    with pytest.raises(VerifyError) as e:
        verify(_replace_node(g, 1, bad))
    assert str(e.value) == (
        "verify: node 1 (%2): result type f32[4,9] disagrees with the shape rule of add (f32[4,8])\n"
        "   %1 = exp %0 : f32[4,8]\n"
        ">> %2 = add %1, %0 : f32[4,9]\n"
        "   %3 = reduce_max %2 {axes=[1], keepdim=false} : f32[4]"
    )


def test_use_before_definition():
    g = _graph()
    n = g.nodes[0]
    ghost = Value(99, n.inputs[0].type)
    with pytest.raises(VerifyError, match=r"node 0 \(%1\): %99 is used before it is defined"):
        verify(_replace_node(g, 0, dataclasses.replace(n, inputs=(ghost,))))


def test_value_defined_twice():
    g = _graph()
    n = g.nodes[1]
    twice = dataclasses.replace(n, out=Value(1, n.out.type))
    with pytest.raises(VerifyError, match=r"%1 is defined twice"):
        verify(_replace_node(g, 1, twice))


def test_wrong_arity_and_attrs():
    g = _graph()
    n = g.nodes[0]
    with pytest.raises(VerifyError, match="exp takes 1 inputs, got 2"):
        verify(_replace_node(g, 0, dataclasses.replace(n, inputs=(n.inputs[0],) * 2)))
    r = g.nodes[2]
    with pytest.raises(
        VerifyError, match=r"reduce axes must be the trailing axes of f32\[4,8\], got \[0\]"
    ):
        verify(
            _replace_node(g, 2, dataclasses.replace(r, attrs=(("axes", (0,)), ("keepdim", False))))
        )


def test_undefined_output():
    g = dataclasses.replace(_graph(), outputs=(Value(42, TensorType((1,), DType.F32)),))
    with pytest.raises(VerifyError, match="output %42 is not defined"):
        verify(g)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda b, x: b.op(Op.MATMUL, x, x),
            r"matmul shapes do not agree: f32\[4,8\] @ f32\[4,8\]",
        ),
        (
            lambda b, x: b.op(Op.BROADCAST, x, shape=[4, 9]),
            r"cannot broadcast f32\[4,8\] to \[4, 9\]",
        ),
        (lambda b, x: b.op(Op.AND, x, x), "logical op needs bool operands"),
        (
            lambda b, x: b.op(Op.SLICE, x, starts=[0, 0], stops=[5, 8], steps=[1, 1]),
            r"out of range",
        ),
        (lambda b, x: b.op(Op.EXP, x, axis=1), r"unknown \['axis'\]"),
    ],
)
def test_builder_rejects_ill_typed_nodes(build, message):
    b = GraphBuilder()
    x = b.input(TensorType((4, 8), DType.F32))
    with pytest.raises((TypeError, ValueError), match=message):
        build(b, x)
