"""Special functions as elementwise programs of engine ops: lgamma, digamma, polygamma, erfinv,
ndtri, erfcx, log_ndtr.

The NeuronCore has no instruction for these, so they are written the way a math library writes
them: argument reduction (reflection, a shift by a fixed number of recurrence steps) and then an
asymptotic series or a rational approximation. Each follows PyTorch's own CPU kernel
(aten/src/ATen/native/Math.h, after Cephes) closely enough to agree to float32 accuracy; the
data-dependent loops there ("while x < 10") become a fixed number of masked steps.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten

_SHIFT_STEPS = 10  # x >= 0.5 reaches 10 in at most 10 steps of x -> x + 1


def _shift_up(z, step):
    """Apply the recurrence `acc = step(acc, z); z += 1` while z < 10, as 10 masked steps."""
    acc = None
    for _ in range(_SHIFT_STEPS):
        small = z < 10
        acc = step(acc, z, small)
        z = torch.where(small, z + 1, z)
    return acc, z


def _fraction(x):
    """x - floor(x), exact in floating point: sin/tan of pi times it keep their accuracy."""
    return x - torch.floor(x)


def _cot_pi(x):
    """cot(pi x), accurate near the half-integers too: there it is -tan(pi (r - 1/2)), whose
    argument is exact, where 1/tan(pi r) would divide by a rounded tan(pi/2)."""
    r = _fraction(x)
    near_pole = torch.where(r > 0.5, r - 1, r)  # exact, in [-1/2, 1/2]
    mid = torch.abs(r - 0.5) < 0.25
    return torch.where(mid, -torch.tan(math.pi * (r - 0.5)), 1 / torch.tan(math.pi * near_pole))


def _lgamma(x):
    """log|Gamma(x)|: reflection below 1/2, shift to >= 10, then Stirling's series."""
    neg = x < 0.5
    z = torch.where(neg, 1 - x, x)

    def product(acc, z, small):
        factor = torch.where(small, z, torch.ones_like(z))
        return factor if acc is None else acc * factor

    prod, z = _shift_up(z, product)
    inv = 1 / z
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    lg = (z - 0.5) * torch.log(z) - z + 0.5 * math.log(2 * math.pi) + series - torch.log(prod)
    reflected = torch.log(math.pi / torch.abs(torch.sin(math.pi * _fraction(x)))) - lg
    return torch.where(neg, reflected, lg)


_DIGAMMA_A = [
    8.33333333333333333333e-2,
    -2.10927960927960927961e-2,
    7.57575757575757575758e-3,
    -4.16666666666666666667e-3,
    3.96825396825396825397e-3,
    -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
]


def _digamma(x):
    """psi(x), as calc_digamma: reflection below 0, shift to >= 10, asymptotic series."""
    neg = x < 0
    z = torch.where(neg, 1 - x, x)

    def harmonic(acc, z, small):
        term = torch.where(small, 1 / z, torch.zeros_like(z))
        return term if acc is None else acc + term

    shifted, z = _shift_up(z, harmonic)
    zz = 1 / (z * z)
    poly = torch.full_like(z, _DIGAMMA_A[0])
    for c in _DIGAMMA_A[1:]:
        poly = poly * zz + c
    psi = torch.log(z) - 0.5 / z - zz * poly - shifted
    reflected = psi - math.pi * _cot_pi(x)
    out = torch.where(neg, reflected, psi)
    out = torch.where(neg & (x == torch.floor(x)), torch.full_like(x, math.nan), out)
    # psi(+0) = -inf, psi(-0) = +inf: -1/x has exactly that sign.
    return torch.where(x == 0, -1 / x, out)


def _trigamma(x):
    """psi'(x), as calc_trigamma: reflection below 1/2, six shift steps, asymptotic series.
    Like the float kernel it takes sin(pi x) of the unreduced float32 product."""
    neg = x < 0.5
    sin_pi_x = torch.sin(math.pi * x)
    result = torch.where(neg, -(math.pi**2) / (sin_pi_x * sin_pi_x), torch.zeros_like(x))
    z = torch.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (z * z)
        z = z + 1
    ixx = 1 / (z * z)
    result = result + (1 + 1 / (2 * z) + ixx * (1 / 6 - ixx * (1 / 30 - ixx / 42))) / z
    return torch.where(neg, -result, result)


# Euler-Maclaurin denominators of Cephes' zeta (Bernoulli numbers times factorials).
_ZETA_A = [
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
]


def _hurwitz_zeta_positive(s: int, q):
    """zeta(s, q) = sum_k (q + k)^-s for q > 0 and an integer s >= 2: ten direct terms and the
    Euler-Maclaurin tail from w = q + 10 (Cephes' zeta with its loop bound fixed)."""
    total = torch.zeros_like(q)
    for k in range(_SHIFT_STEPS + 1):
        total = total + torch.pow(q + k, float(-s))
    w = q + _SHIFT_STEPS
    b = torch.pow(w, float(-s))
    total = total + b * w / (s - 1) - 0.5 * b
    # Term i is a_i / A_i * w^-(s + 2i + 1), a_i = s (s+1) ... (s+2i): the coefficient is a
    # trace-time constant because s is.
    u = b / w
    inv_w2 = 1 / (w * w)
    a = 1.0
    for i, denom in enumerate(_ZETA_A):
        a *= s + 2 * i
        total = total + (a / denom) * u
        a *= s + 2 * i + 1
        u = u * inv_w2
    return total


def _cot_derivative_poly(n: int) -> list[float]:
    """Coefficients (lowest first) of P_n with d^n/dx^n cot(x) = P_n(cot x):
    P_0 = c, P_{k+1} = -(1 + c^2) P_k'."""
    p = [0.0, 1.0]
    for _ in range(n):
        dp = [i * p[i] for i in range(1, len(p))] or [0.0]
        nxt = [0.0] * (len(dp) + 2)
        for i, c in enumerate(dp):
            nxt[i] -= c
            nxt[i + 2] -= c
        p = nxt
    return p


def _polygamma(n: int, x):
    """psi^(n)(x): digamma, trigamma, else (-1)^(n+1) n! zeta(n+1, x) for x > 0 and the
    reflection psi^(n)(x) = -(-1)^n [(-1)^n pi d^n/dx^n cot(pi x) - psi^(n)(1 - x)] below."""
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    scale = sign * math.factorial(n)
    neg = x <= 0
    z = torch.where(neg, 1 - x, x)
    direct = scale * _hurwitz_zeta_positive(n + 1, z)
    cot = _cot_pi(x)
    poly = torch.zeros_like(x)
    for c in reversed(_cot_derivative_poly(n)):
        poly = poly * cot + c
    cot_term = (-1) ** n * math.pi ** (n + 1) * poly
    reflected = -((-1) ** n) * (cot_term - direct)
    out = torch.where(neg, reflected, direct)
    pole = neg & (x == torch.floor(x))
    return torch.where(pole, torch.full_like(x, math.inf if n % 2 else -math.inf), out)


_ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_ERFINV_D = (3.543889200, 1.637067800)


def _erfinv_guess(y, tail_q):
    """calc_erfinv's first guess: a rational function of y^2 for |y| <= 0.7, else of
    sqrt(-log q) with q = (1 - |y|) / 2, passed in so callers can supply it unrounded."""
    a, b, c, d = _ERFINV_A, _ERFINV_B, _ERFINV_C, _ERFINV_D
    z = y * y
    num = ((a[3] * z + a[2]) * z + a[1]) * z + a[0]
    dem = (((b[3] * z + b[2]) * z + b[1]) * z + b[0]) * z + 1.0
    central = y * num / dem
    # The tail form is only selected where |y| > 0.7, so its log never sees 0 there.
    t = torch.sqrt(-torch.log(torch.clamp(tail_q, min=1e-38)))
    num = ((c[3] * t + c[2]) * t + c[1]) * t + c[0]
    dem = (d[1] * t + d[0]) * t + 1.0
    tail = torch.copysign(num, y) / dem
    return torch.where(torch.abs(y) <= 0.7, central, tail)


def _erfinv(y):
    """calc_erfinv: the rational first guess, then two Newton steps on erf. For |y| > 0.5
    the residual erf(x) - y is taken as sign(y) ((1 - |y|) - erfc(|x|)): 1 - |y| is exact
    there and erfc keeps its relative accuracy, where erf's few ulp of rounding near 1
    would cost x as many ulp again, times exp(x^2) in the gradient."""
    y_abs = torch.abs(y)
    x = _erfinv_guess(y, (1.0 - y_abs) / 2.0)
    tail = y_abs > 0.5
    for _ in range(2):
        tail_residual = torch.sign(y) * ((1.0 - y_abs) - torch.erfc(torch.abs(x)))
        residual = torch.where(tail, tail_residual, torch.erf(x) - y)
        x = x - residual / ((2.0 / math.sqrt(math.pi)) * torch.exp(-x * x))
    x = torch.where(y_abs == 1.0, torch.copysign(torch.full_like(y, math.inf), y), x)
    return torch.where(y_abs > 1.0, torch.full_like(y, math.nan), x)


def _ndtri(p):
    """The inverse normal CDF. Solved for the lower tail q = min(p, 1 - p), where Newton's
    residual 0.5 erfc(-x / sqrt 2) - q keeps its relative accuracy, then mirrored."""
    q = torch.where(p < 0.5, p, 1 - p)
    x = math.sqrt(2) * _erfinv_guess(2 * q - 1, q)
    for _ in range(2):
        density = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        x = x - (0.5 * torch.erfc(-x / math.sqrt(2)) - q) / density
    x = torch.where(q == 0, torch.full_like(p, -math.inf), x)
    x = torch.where(p < 0.5, x, -x)
    return torch.where((p < 0) | (p > 1), torch.full_like(p, math.nan), x)


def _erfcx(x):
    """exp(x^2) erfc(x); from x = 9 on, where erfc leaves the float32 normal range, the
    asymptotic series 1 / (x sqrt pi) (1 - 1/(2x^2) + 3/(4x^4) - ...)."""
    direct = torch.exp(x * x) * torch.erfc(x)
    big = torch.clamp(x, min=9.0)
    inv2 = 1 / (2 * big * big)
    series = 1 - inv2 * (1 - 3 * inv2 * (1 - 5 * inv2 * (1 - 7 * inv2 * (1 - 9 * inv2))))
    asymptotic = series / (big * math.sqrt(math.pi))
    return torch.where(x < 9.0, direct, asymptotic)


def _log_ndtr(x):
    """log of the normal CDF, as calc_log_ndtr: through erfcx in the lower tail."""
    t = x / math.sqrt(2)
    lower = torch.log(_erfcx(-t) / 2) - t * t
    upper = torch.log1p(-torch.erfc(t) / 2)
    return torch.where(x < -1.0, lower, upper)


def _floating(fn):
    """Integer inputs promote to the default float dtype, as the ATen kernels do."""

    def decomposition(x, *args):
        if not x.dtype.is_floating_point:
            x = x.to(torch.get_default_dtype())
        return fn(x, *args)

    return decomposition


SPECIAL_DECOMPOSITIONS = {
    aten.lgamma.default: _floating(_lgamma),
    aten.digamma.default: _floating(_digamma),
    aten.polygamma.default: lambda n, x: _floating(lambda t: _polygamma(n, t))(x),
    aten.erfinv.default: _floating(_erfinv),
    aten.special_ndtri.default: _floating(_ndtri),
    aten.special_erfcx.default: _floating(_erfcx),
    aten.special_log_ndtr.default: _floating(_log_ndtr),
}
