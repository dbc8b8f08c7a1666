import pytest
from hypothesis import given

from neuroncc.ir import DType, GraphBuilder, Op, ParseError, TensorType, parse, print_graph, verify
from tests.strategies import graphs


@given(graphs())
def test_parse_print_round_trip(g):
    text = print_graph(g)
    assert parse(text) == g
    assert print_graph(parse(text)) == text


def _sample():
    b = GraphBuilder("main")
    x = b.input(TensorType((4, 8), DType.F32))
    i = b.input(TensorType((3,), DType.I64))
    t = b.op(Op.TRANSPOSE, x, perm=[1, 0])
    s = b.op(Op.REDUCE_SUM, t, axes=[1], keepdim=False)
    f = b.op(Op.FULL, shape=[2], value=float("-inf"), dtype=DType.BF16)
    k = b.op(Op.TAKE, x, i)
    return b.build([s, f, k])


def test_golden_text():
    assert print_graph(_sample()) == (
        "graph @main(%0: f32[4,8], %1: i64[3]) {\n"
        "  %2 = transpose %0 {perm=[1,0]} : f32[8,4]\n"
        "  %3 = reduce_sum %2 {axes=[1], keepdim=false} : f32[8]\n"
        "  %4 = full {shape=[2], value=-inf, dtype=bf16} : bf16[2]\n"
        "  %5 = take %0, %1 : f32[3,8]\n"
        "  return %3, %4, %5\n"
        "}\n"
    )
    verify(parse(print_graph(_sample())))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty input"),
        ("graph main() {", "line 1: expected 'graph @name(...) {'"),
        (
            "graph @g(%0: f32[2]) {\n  %1 = frob %0 : f32[2]\n  return %1\n}",
            "line 2: unknown op 'frob'",
        ),
        (
            "graph @g(%0: f32[2]) {\n  %1 = exp %7 : f32[2]\n  return %1\n}",
            "line 2: %7 is used before it is defined",
        ),
        (
            "graph @g(%0: f32[2]) {\n  %1 = exp %0 : f32[3]\n  return %1\n}",
            "line 2: type f32[3] disagrees with the shape rule (f32[2])",
        ),
        ("graph @g(%0: q8[2]) {\n  return %0\n}", "unknown dtype 'q8'"),
        ("graph @g(%0: f32[2]) {\n  %1 = exp %0 : f32[2]\n}", "graph has no return line"),
        (
            "graph @g(%0: f32[2,3]) {\n  %1 = reshape %0 {shape=[5]} : f32[5]\n  return %1\n}",
            "line 2: reshape of f32[2,3] to [5] changes the element count",
        ),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(ParseError) as e:
        parse(text)
    assert message in str(e.value)


@given(graphs())
def test_json_form_round_trips(g):
    import json

    from neuroncc.ir.jsonform import graph_from_json, graph_to_json

    assert graph_from_json(json.loads(json.dumps(graph_to_json(g)))) == g


def test_json_form_keeps_fused_kernels_and_infinities():
    import json

    from neuroncc.ir.jsonform import graph_from_json, graph_to_json

    text = """graph @main(%0: f32[4,8]) {
  fuse {
    %1 = full {shape=[4,8], value=-inf, dtype=f32} : f32[4,8]
    %2 = max %0, %1 : f32[4,8]
  }
  return %2
}
"""
    g = parse(text)
    assert g.kernels
    data = json.loads(json.dumps(graph_to_json(g), allow_nan=False))
    assert graph_from_json(data) == g
