"""Numpy definitions of the elementwise math functions, shared by the reference interpreter and
the simulator's activation semantics (one definition of what `gelu` means).

All functions take and return float32 arrays: the NeuronCore's Vector and Scalar engines compute
in fp32 whatever the storage dtype, and so does this module.
"""

from __future__ import annotations

import math

import numpy as np

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1)): the coefficients of x^(2n+1).
_ERF_TAYLOR = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(12))


def _horner(x2: np.ndarray, coeffs) -> np.ndarray:
    """sum_i coeffs[i] x2^i by Horner's rule, in x2's dtype."""
    poly = x2 * x2.dtype.type(coeffs[-1])
    poly += coeffs[-2]
    for c in reversed(coeffs[:-2]):
        poly *= x2
        poly += c
    return poly


def _erf_taylor(x64: np.ndarray) -> np.ndarray:
    """erf by its Taylor series, Horner's rule in x^2: 12 terms are exact to double precision
    for |x| < 0.5."""
    return _horner(x64 * x64, _ERF_TAYLOR) * x64 * (2.0 / math.sqrt(math.pi))


def _erfc_abs(a: np.ndarray) -> np.ndarray:
    """erfc(a) for a >= 0 by the Chebyshev fit of Numerical Recipes 6.2 (fractional error
    < 1.2e-7, also deep in the tail where 1 - erf would have cancelled)."""
    t = 1.0 / (1.0 + 0.5 * a)
    coeffs = (
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    )
    poly = np.zeros_like(a)
    for c in reversed(coeffs[1:]):
        poly = (poly + c) * t
    return t * np.exp(-a * a + coeffs[0] + poly)


# Eigen's single-precision erf (also XLA's and TVM's): x * alpha(x^2) / beta(x^2) on x clamped
# to [-4, 4], where erf is +-1 in float32. Coefficients from x^0 up.
_ERF_ALPHA = np.array(
    (
        -1.60960333262415e-02,
        -2.95459980854025e-03,
        -7.34990630326855e-04,
        -5.69250639462346e-05,
        -2.10102402082508e-06,
        2.77068142495902e-08,
        -2.72614225801306e-10,
    ),
    dtype=np.float32,
)
_ERF_BETA = np.array(
    (
        -1.42647390514189e-02,
        -7.37332916720468e-03,
        -1.68282697438203e-03,
        -2.13374055278905e-04,
        -1.45660718464996e-05,
    ),
    dtype=np.float32,
)


def erf(x: np.ndarray) -> np.ndarray:
    """erf in float32 to 7 ulp (4.2e-7 relative, measured against math.erf over [-6, 6] and
    down to 1e-30): one rational function, no branches, about 25x faster than the float64
    series it replaced, which mattered for every GELU the simulator runs."""
    x = np.clip(x.astype(np.float32, copy=False), np.float32(-4.0), np.float32(4.0))
    x2 = x * x
    out = _horner(x2, _ERF_ALPHA)
    out *= x
    out /= _horner(x2, _ERF_BETA)
    return np.clip(out, np.float32(-1.0), np.float32(1.0), out=out)


def erfc(x: np.ndarray) -> np.ndarray:
    """erfc to ~1e-7 relative accuracy over the whole float32 range of its value."""
    x64 = x.astype(np.float64)
    a = np.abs(x64)
    near = a < 0.5
    out = np.empty_like(x64)
    out[near] = 1.0 - _erf_taylor(x64[near])
    far = ~near
    tail = _erfc_abs(a[far])
    out[far] = np.where(x64[far] >= 0, tail, 2.0 - tail)
    return out.astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a non-positive argument never overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)), in that order, in place where it can be."""
    half = (0.5 * x).astype(np.float32, copy=False)
    out = erf(x / np.float32(math.sqrt(2.0)))
    out += np.float32(1.0)
    out *= half
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    inner = np.float32(_SQRT_2_OVER_PI) * (x + np.float32(0.044715) * x * x * x)
    return (0.5 * x * (1.0 + np.tanh(inner))).astype(np.float32)


def power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ** b as PyTorch's CPU kernel computes a float tensor to a scalar power: 3 and -2 as
    products (x * x * x, 1 / (x * x)), -0.5 as 1 / sqrt(x), bit for bit, where numpy's powf
    differs in the last place for a third of the values (and takes 100 times as long: GPT-2's
    gelu cubes its 3072-wide rows); other exponents, and exponents that vary, with np.power."""
    b = np.asarray(b)
    if np.asarray(a).dtype.kind != "f" or b.dtype.kind != "f" or not b.size:
        return np.power(a, b)
    e = b.flat[0]
    if b.size > 1 and not (b.min() == e == b.max()):
        return np.power(a, b)
    if e == 3:
        return a * a * a
    if e == -2:
        return np.asarray(1, a.dtype) / (a * a)
    if e == -0.5:
        return np.asarray(1, a.dtype) / np.sqrt(a)
    return np.power(a, b)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * sigmoid(x)).astype(np.float32)


def _quiet(fn):
    def wrapped(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    wrapped.__name__ = fn.__name__
    wrapped.raw = fn  # for callers that silence warnings themselves (the simulator's steps)
    return wrapped


# Activation functions by their ISA / IR name. Division by zero, log(0) etc. give inf / nan as
# in IEEE arithmetic (and in PyTorch), without numpy warnings.
UNARY: dict = {
    name: _quiet(fn)
    for name, fn in {
        "neg": np.negative,
        "abs": np.abs,
        "sign": np.sign,
        "floor": np.floor,
        "round": np.round,  # half to even, as torch.round
        "log1p": np.log1p,
        "expm1": np.expm1,
        "exp2": np.exp2,
        "log2": np.log2,
        "log10": np.log10,
        "trunc": np.trunc,
        "ceil": np.ceil,
        "tan": np.tan,
        "acos": np.arccos,
        "asin": np.arcsin,
        "atan": np.arctan,
        "sinh": np.sinh,
        "cosh": np.cosh,
        "acosh": np.arccosh,
        "asinh": np.arcsinh,
        "atanh": np.arctanh,
        "erfc": erfc,
        "exp": np.exp,
        "log": np.log,
        "tanh": np.tanh,
        "sigmoid": sigmoid,
        "relu": lambda x: np.maximum(x, np.float32(0)),
        "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
        "sqrt": np.sqrt,
        "reciprocal": lambda x: np.float32(1) / x,
        "erf": erf,
        "gelu": gelu,
        "gelu_tanh": gelu_tanh,
        "silu": silu,
        "sin": np.sin,
        "cos": np.cos,
        "copy": lambda x: x,
        "square": np.square,  # (an activation only: x * x summed by activation_reduce)
    }.items()
}

BINARY: dict = {
    name: _quiet(fn)
    for name, fn in {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "max": np.maximum,
        "min": np.minimum,
        "pow": power,
        "fmod": np.fmod,
        "remainder": np.remainder,  # sign of the divisor, as torch.remainder
        "atan2": np.arctan2,
        "copysign": np.copysign,
        "hypot": np.hypot,
        "fmax": np.fmax,
        "fmin": np.fmin,
        "logaddexp": np.logaddexp,
        "nextafter": np.nextafter,
        "and": np.logical_and,
        "or": np.logical_or,
        "eq": np.equal,
        "ne": np.not_equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
    }.items()
}

COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def scatter_rows(table: np.ndarray, idx: np.ndarray, rows: np.ndarray, combine: str) -> np.ndarray:
    """table with rows combined into table[idx]; repeated indices combine one after another
    (for "set" the last wins), in fp32 / int64 and rounded to table's dtype once at the end."""
    if combine == "set":
        out = table.copy()
        out[idx] = rows
        return out
    wide = np.float32 if table.dtype.kind == "f" or table.dtype.name == "bfloat16" else np.int64
    out = table.astype(wide)
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[combine]
    ufunc.at(out, idx, rows.astype(wide))
    return out.astype(table.dtype)


def int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer `div` truncates toward zero, as the IR defines it for integer dtypes."""
    return np.trunc(a / b).astype(a.dtype)
