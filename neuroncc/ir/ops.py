"""The op table: every IR op declared once.

Each row gives the op's kind, arity (-1 = variadic), attribute schema, shape rule and the engine
class that executes it. Printer, parser, verifier, reference interpreter, codegen and the
completeness test all read this table; group sets are derived from it.

Attribute kinds: "int", "ints", "scalar" (int or float), "dtype", "bool", "name" (an identifier).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from neuroncc.ir import shape_rules as R


class Kind(enum.Enum):
    UNARY = "unary"  # elementwise, one input, same type out
    BINARY = "binary"  # elementwise, two inputs of one type, same type out
    COMPARE = "compare"  # elementwise, two inputs of one type, bool out
    SELECT = "select"  # where(cond, a, b)
    CAST = "cast"
    REDUCE = "reduce"
    MATMUL = "matmul"
    MOVEMENT = "movement"  # data movement only: values are copied, never computed
    INDEX = "index"  # data-dependent addressing (gathers)
    CONSTANT = "constant"  # no inputs


class Engine(enum.Enum):
    """Which NeuronCore engine class an op maps to at opt_level 0 (codegen may refine)."""

    TENSOR = "pe"
    VECTOR = "dve"
    SCALAR = "act"
    GPSIMD = "pool"
    DMA = "dma"


@dataclass(frozen=True)
class OpInfo:
    kind: Kind
    arity: int
    rule: Callable
    engine: Engine
    attrs: dict[str, str] = field(default_factory=dict)


class Op(enum.Enum):
    # unary elementwise: ScalarE activation functions
    NEG = "neg"
    ABS = "abs"
    SIGN = "sign"
    FLOOR = "floor"
    ROUND = "round"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    EXP2 = "exp2"
    LOG2 = "log2"
    LOG10 = "log10"
    TRUNC = "trunc"
    CEIL = "ceil"
    TAN = "tan"
    ACOS = "acos"
    ASIN = "asin"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ACOSH = "acosh"
    ASINH = "asinh"
    ATANH = "atanh"
    ERFC = "erfc"
    EXP = "exp"
    LOG = "log"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    RSQRT = "rsqrt"
    SQRT = "sqrt"
    RECIPROCAL = "reciprocal"
    ERF = "erf"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    SIN = "sin"
    COS = "cos"
    NOT = "not"
    # binary elementwise: VectorE tensor_tensor
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    AND = "and"
    OR = "or"
    FMOD = "fmod"
    REMAINDER = "remainder"
    ATAN2 = "atan2"
    COPYSIGN = "copysign"
    HYPOT = "hypot"
    FMAX = "fmax"
    FMIN = "fmin"
    LOGADDEXP = "logaddexp"
    NEXTAFTER = "nextafter"
    # comparisons
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    WHERE = "where"
    CAST = "cast"
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    REDUCE_PROD = "reduce_prod"
    MATMUL = "matmul"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    BROADCAST = "broadcast"
    SLICE = "slice"
    REVERSE = "reverse"
    STRIDED = "strided"
    CONCAT = "concat"
    TAKE = "take"
    PUT = "put"
    FULL = "full"
    IOTA = "iota"

    @property
    def info(self) -> OpInfo:
        return OP_TABLE[self]


_REDUCE_ATTRS = {"axes": "ints", "keepdim": "bool"}


def _unary(engine: Engine = Engine.SCALAR) -> OpInfo:
    return OpInfo(Kind.UNARY, 1, R.elementwise, engine)


def _binary(rule: Callable = R.elementwise) -> OpInfo:
    return OpInfo(Kind.BINARY, 2, rule, Engine.VECTOR)


def _compare() -> OpInfo:
    return OpInfo(Kind.COMPARE, 2, R.compare, Engine.VECTOR)


OP_TABLE: dict[Op, OpInfo] = {
    Op.NEG: _unary(),
    Op.ABS: _unary(),
    Op.SIGN: _unary(),
    Op.FLOOR: _unary(),
    Op.ROUND: _unary(),
    Op.LOG1P: _unary(),
    Op.EXPM1: _unary(),
    Op.EXP2: _unary(),
    Op.LOG2: _unary(),
    Op.LOG10: _unary(),
    Op.TRUNC: _unary(),
    Op.CEIL: _unary(),
    Op.TAN: _unary(),
    Op.ACOS: _unary(),
    Op.ASIN: _unary(),
    Op.ATAN: _unary(),
    Op.SINH: _unary(),
    Op.COSH: _unary(),
    Op.ACOSH: _unary(),
    Op.ASINH: _unary(),
    Op.ATANH: _unary(),
    Op.ERFC: _unary(),
    Op.EXP: _unary(),
    Op.LOG: _unary(),
    Op.TANH: _unary(),
    Op.SIGMOID: _unary(),
    Op.RELU: _unary(),
    Op.RSQRT: _unary(),
    Op.SQRT: _unary(),
    Op.RECIPROCAL: _unary(),
    Op.ERF: _unary(),
    Op.GELU: _unary(),
    Op.GELU_TANH: _unary(),
    Op.SILU: _unary(),
    Op.SIN: _unary(),
    Op.COS: _unary(),
    Op.NOT: OpInfo(Kind.UNARY, 1, R.logical, Engine.VECTOR),
    Op.ADD: _binary(),
    Op.SUB: _binary(),
    Op.MUL: _binary(),
    Op.DIV: _binary(),
    Op.MAX: _binary(),
    Op.MIN: _binary(),
    Op.POW: _binary(),
    Op.AND: _binary(R.logical),
    Op.OR: _binary(R.logical),
    Op.FMOD: _binary(),
    Op.REMAINDER: _binary(),
    Op.ATAN2: _binary(),
    Op.COPYSIGN: _binary(),
    Op.HYPOT: _binary(),
    Op.FMAX: _binary(),
    Op.FMIN: _binary(),
    Op.LOGADDEXP: _binary(),
    Op.NEXTAFTER: _binary(),
    Op.EQ: _compare(),
    Op.NE: _compare(),
    Op.LT: _compare(),
    Op.LE: _compare(),
    Op.GT: _compare(),
    Op.GE: _compare(),
    Op.WHERE: OpInfo(Kind.SELECT, 3, R.where, Engine.VECTOR),
    Op.CAST: OpInfo(Kind.CAST, 1, R.cast, Engine.VECTOR, {"dtype": "dtype"}),
    Op.REDUCE_SUM: OpInfo(Kind.REDUCE, 1, R.reduce, Engine.VECTOR, _REDUCE_ATTRS),
    Op.REDUCE_MAX: OpInfo(Kind.REDUCE, 1, R.reduce, Engine.VECTOR, _REDUCE_ATTRS),
    Op.REDUCE_MIN: OpInfo(Kind.REDUCE, 1, R.reduce, Engine.VECTOR, _REDUCE_ATTRS),
    Op.REDUCE_PROD: OpInfo(Kind.REDUCE, 1, R.reduce, Engine.VECTOR, _REDUCE_ATTRS),
    Op.MATMUL: OpInfo(Kind.MATMUL, 2, R.matmul, Engine.TENSOR),
    Op.RESHAPE: OpInfo(Kind.MOVEMENT, 1, R.reshape, Engine.DMA, {"shape": "ints"}),
    Op.TRANSPOSE: OpInfo(Kind.MOVEMENT, 1, R.transpose, Engine.DMA, {"perm": "ints"}),
    Op.BROADCAST: OpInfo(Kind.MOVEMENT, 1, R.broadcast, Engine.DMA, {"shape": "ints"}),
    Op.SLICE: OpInfo(
        Kind.MOVEMENT,
        1,
        R.slice_,
        Engine.DMA,
        {"starts": "ints", "stops": "ints", "steps": "ints"},
    ),
    Op.REVERSE: OpInfo(Kind.MOVEMENT, 1, R.reverse, Engine.DMA, {"axes": "ints"}),
    Op.STRIDED: OpInfo(
        Kind.MOVEMENT,
        1,
        R.strided,
        Engine.DMA,
        {"shape": "ints", "strides": "ints", "offset": "int"},
    ),
    Op.CONCAT: OpInfo(Kind.MOVEMENT, -1, R.concat, Engine.DMA, {"axis": "int"}),
    Op.TAKE: OpInfo(Kind.INDEX, 2, R.take, Engine.DMA),
    Op.PUT: OpInfo(Kind.INDEX, 3, R.put, Engine.DMA, {"combine": "name"}),
    Op.FULL: OpInfo(
        Kind.CONSTANT,
        0,
        R.full,
        Engine.GPSIMD,
        {"shape": "ints", "value": "scalar", "dtype": "dtype"},
    ),
    Op.IOTA: OpInfo(
        Kind.CONSTANT,
        0,
        R.iota,
        Engine.GPSIMD,
        {"n": "int", "start": "scalar", "step": "scalar", "dtype": "dtype"},
    ),
}

ELEMENTWISE = frozenset(
    op
    for op, i in OP_TABLE.items()
    if i.kind in (Kind.UNARY, Kind.BINARY, Kind.COMPARE, Kind.SELECT, Kind.CAST)
)
REDUCE = frozenset(op for op, i in OP_TABLE.items() if i.kind == Kind.REDUCE)
MOVEMENT = frozenset(op for op, i in OP_TABLE.items() if i.kind == Kind.MOVEMENT)
CONSTANT = frozenset(op for op, i in OP_TABLE.items() if i.kind == Kind.CONSTANT)
BY_NAME: dict[str, Op] = {op.value: op for op in Op}
