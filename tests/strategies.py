"""Hypothesis strategies for IR graphs: random well-typed graphs built through the GraphBuilder."""

from __future__ import annotations

from hypothesis import strategies as st

from neuroncc.ir import DType, GraphBuilder, Op, TensorType
from neuroncc.ir.ops import Kind

FLOAT_UNARY = [op for op in Op if op.info.kind == Kind.UNARY and op != Op.NOT]
BINARY_ARITH = [Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.MIN]
COMPARES = [op for op in Op if op.info.kind == Kind.COMPARE]

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


@st.composite
def graphs(draw, max_nodes: int = 8):
    """A random f32 graph over one input shape mixing elementwise, movement and reductions."""
    shape = draw(shapes)
    b = GraphBuilder("g")
    vals = [b.input(TensorType(shape, DType.F32)) for _ in range(draw(st.integers(1, 3)))]
    col_shape = (1,) * (len(shape) - 1) + shape[-1:]
    cols = [b.input(TensorType(col_shape, DType.F32))] if draw(st.booleans()) else []
    choices = ["unary", "binary", "where", "transpose", "reduce", "rowop", "full", "cast"]
    for _ in range(draw(st.integers(1, max_nodes))):
        same = [v for v in vals if v.type.shape == shape and v.type.dtype == DType.F32]
        choice = draw(st.sampled_from(choices + (["col"] if cols else [])))
        x = draw(st.sampled_from(same))
        if choice == "unary":
            vals.append(b.op(draw(st.sampled_from(FLOAT_UNARY)), x))
        elif choice == "binary":
            vals.append(b.op(draw(st.sampled_from(BINARY_ARITH)), x, draw(st.sampled_from(same))))
        elif choice == "where":
            c = b.op(draw(st.sampled_from(COMPARES)), x, draw(st.sampled_from(same)))
            vals.append(b.op(Op.WHERE, c, x, draw(st.sampled_from(same))))
        elif choice == "transpose":
            perm = draw(st.permutations(range(len(shape))))
            t = b.op(Op.TRANSPOSE, x, perm=perm)
            vals.append(b.op(Op.TRANSPOSE, t, perm=[perm.index(i) for i in range(len(shape))]))
        elif choice == "reduce":
            op = draw(st.sampled_from([Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN]))
            r = b.op(op, x, axes=[len(shape) - 1], keepdim=True)
            vals.append(b.op(Op.BROADCAST, r, shape=shape))
        elif choice == "rowop":  # work on one value per row, then spread it back
            op = draw(st.sampled_from([Op.REDUCE_SUM, Op.REDUCE_MAX]))
            r = b.op(op, x, axes=[len(shape) - 1], keepdim=False)
            r = b.op(draw(st.sampled_from([Op.EXP, Op.TANH, Op.NEG])), r)
            r = b.op(Op.RESHAPE, r, shape=shape[:-1] + (1,))
            vals.append(b.op(Op.BROADCAST, r, shape=shape))
        elif choice == "col":  # a per-column vector, as a bias or a norm weight
            c = b.op(Op.BROADCAST, cols[0], shape=shape)
            vals.append(b.op(draw(st.sampled_from(BINARY_ARITH)), x, c))
        elif choice == "full":
            value = draw(st.floats(-4, 4, allow_nan=False, width=32))
            vals.append(b.op(Op.FULL, shape=shape, value=value, dtype=DType.F32))
        else:
            h = b.op(Op.CAST, x, dtype=draw(st.sampled_from([DType.BF16, DType.F16])))
            vals.append(b.op(Op.CAST, h, dtype=DType.F32))
    outs = draw(st.lists(st.sampled_from(vals[1:] or vals), min_size=1, max_size=3))
    return b.build(outs)
