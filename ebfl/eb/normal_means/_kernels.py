"""Numba kernels of the parametric normal-means families (private: no validation).

``point_nll`` is the fused objective of ``families._fit_point``: the negative
marginal log-likelihood of pi0 delta_mode + (1 - pi0) slab(mode, b), with its
gradient and Hessian in (pi0, log b, mode), for the three slabs (normal,
Laplace, exponential) in one pass over the data. Its numpy twin is
``families._point_objective`` (value and gradient), which it must match to
1e-10 (tests/test_ebnm_kernels.py).

Speed. Each observation costs a handful of exp, log and erfcx. libm's scalar
exp and log (and a loop that calls them) cannot be vectorized, so the kernel
has its own: ``vexp`` and ``vlog`` (within an ulp: Taylor and atanh series
after the usual argument reduction, written with bit casts), and ``erfcx``
(piecewise Chebyshev). The terms of ``CHUNK`` observations are computed by a
branch-free loop that LLVM vectorizes, into a buffer; observations that need
the asymptotic series of Phi (t <= ``TAIL``: rare) are then recomputed by the
scalar code, and the buffer is summed in observation order. Everything is
compiled without fastmath (``FASTMATH``), which also keeps the tails of log Phi
accurate (sums of terms of alternating sign), but for fused multiply-adds (see
``_FAST``). ``error_model="numpy"``: a
division by zero gives inf instead of raising (and does not block
vectorization).

Sums over observations are accumulated in fixed blocks of ``BLOCK``
observations (their number depends on n only) and the block totals are added
in block order, so results do not depend on the number of threads.

``log_ndtr`` is log Phi with the accuracy of ``scipy.special.log_ndtr`` in both
tails (relative, ~1e-15).

With NUMBA_DISABLE_JIT the bit casts are done by numpy views, and everything
runs (slowly) as Python.
"""

import math

import numpy as np
from numba import config, njit, prange, types
from numba.extending import intrinsic

from ebfl._config import CACHE, FASTMATH

#: The slabs, as ``point_nll``'s ``kind``.
NORMAL, LAPLACE, EXPONENTIAL = 0, 1, 2
KINDS = {"point_normal": NORMAL, "point_laplace": LAPLACE, "point_exponential": EXPONENTIAL}
#: Observations per block of the parallel sums.
BLOCK = 4096
#: Observations per chunk of the vectorized loop (its buffer, 10 x CHUNK doubles,
#: stays in L1).
CHUNK = 256
#: From this many observations on, ``point_nll`` (parallel); below, ``point_nll_serial``.
PARALLEL_MIN = 4 * BLOCK
#: At and below this t, log Phi(t) and the Mills ratio come from the asymptotic series.
TAIL = -20.0
#: The capped exponent of f0 / mix and f1 / mix (as in the numpy twin).
CAP = 700.0

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT1_2 = math.sqrt(0.5)
_SQRT2 = math.sqrt(2.0)
_LOG2 = math.log(2.0)
#: FASTMATH (off: no reassociated sums) but for "contract": a * b + c as one fused
#: multiply-add (rounded once, not twice: never less accurate, and no sum reordered;
#: a third faster here). The observations' terms are summed in their order.
_FAST = FASTMATH or {"contract"}
_KW = {"cache": CACHE, "fastmath": _FAST, "error_model": "numpy"}
#: The helpers of the vectorized loop are inlined into it by Numba (LLVM does not
#: inline across Numba's separately compiled functions, and a call blocks
#: vectorization).
_INLINE = {**_KW, "inline": "always"}

# ------------------------------------------------------------------ exp, log, erfcx

if config.DISABLE_JIT:
    def _bits(x):
        """The bits of the double x, as an int64."""
        return int(np.array(x, dtype=np.float64).view(np.int64))

    def _double(i):
        """The double whose bits are the int64 i."""
        return float(np.array(i, dtype=np.int64).view(np.float64))
else:
    from llvmlite import ir

    @intrinsic
    def _bits(typingctx, x):
        """The bits of the double x, as an int64 (an LLVM bitcast)."""
        if x != types.float64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(types.float64), codegen

    @intrinsic
    def _double(typingctx, i):
        """The double whose bits are the int64 i (an LLVM bitcast)."""
        if i != types.int64:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(types.int64), codegen


# ln 2 = _LN2_HI + _LN2_LO, _LN2_HI with its last 32 bits 0 (k _LN2_HI is exact for
# |k| < 2^20); the shifter 1.5 * 2^52 rounds x / ln 2 to an integer in its last bits.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG2E = 1.4426950408889634
_SHIFTER = 6755399441055744.0
_SHIFTER_BITS = 0x4338000000000000
_MANTISSA = (1 << 52) - 1
_ONE_BITS = 1023 << 52


@njit(**_INLINE)
def vexp(x):
    """exp(x), within an ulp (0 below -708, where it is below 1e-307; e^709 above
    709): x = k ln 2 + r, |r| <= ln 2 / 2, e^r by its Taylor polynomial of degree 13
    (remainder < 5e-18), times 2^k."""
    xc = min(max(x, -708.0), 709.0)
    kf = xc * _LOG2E + _SHIFTER
    kd = kf - _SHIFTER
    k = _bits(kf) - _SHIFTER_BITS
    r = (xc - kd * _LN2_HI) - kd * _LN2_LO
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    y = p * _double((k + 1023) << 52)
    return y if x >= -708.0 else (0.0 if x < -708.0 else x)  # (x NaN: NaN)


@njit(**_INLINE)
def vlog(x):
    """log(x) for a normal double x > 0, within an ulp: x = 2^e m, m in
    (sqrt(1/2), sqrt 2], log m = 2 atanh(s), s = (m - 1) / (m + 1), by its series to
    s^23 (|s| < 0.172: remainder < 1e-18), in fdlibm's arrangement."""
    bits = _bits(x)
    e = (bits >> 52) - 1023
    m = _double((bits & _MANTISSA) | _ONE_BITS)
    big = m > _SQRT2
    m = 0.5 * m if big else m
    ed = float(e + 1) if big else float(e)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = 1.0 / 23.0
    p = p * z + 1.0 / 21.0
    p = p * z + 1.0 / 19.0
    p = p * z + 1.0 / 17.0
    p = p * z + 1.0 / 15.0
    p = p * z + 1.0 / 13.0
    p = p * z + 1.0 / 11.0
    p = p * z + 1.0 / 9.0
    p = p * z + 1.0 / 7.0
    p = p * z + 1.0 / 5.0
    p = p * z + 1.0 / 3.0
    # log m = 2 s + 2 s z p, and 2 s = f - f^2 / 2 + s f^2 / 2
    hfsq = 0.5 * f * f
    return ed * _LN2_HI + ((f - (hfsq - s * (hfsq + 2.0 * z * p))) + ed * _LN2_LO)


#: erfcx(u) = exp(u^2) erfc(u) on [0, ERFCX_MAX] is y h(y) with y = 4 / (4 + u) in
#: [1/8, 1] (Johnson's variable, in which erfcx is smooth and nearly linear) and h
#: interpolated on 28 pieces of width 1/32 at 9 Chebyshev points each (degree 8).
ERFCX_MAX = 27.0
_PIECES_PER_UNIT = 32
_Y_LOW = 0.125
_DEGREE = 8


def _erfcx_table():
    """Chebyshev coefficients (pieces, degree + 1) of h(y) = erfcx(4 (1 - y) / y) / y,
    interpolated from scipy.special.erfcx (relative error ~1e-15 on [0, ERFCX_MAX])."""
    from scipy import special

    m = _DEGREE + 1
    theta = np.pi * (np.arange(m) + 0.5) / m
    nodes = np.cos(theta)
    n_pieces = int(round((1.0 - _Y_LOW) * _PIECES_PER_UNIT))
    table = np.empty((n_pieces, m))
    for k in range(n_pieces):
        y = _Y_LOW + (k + (nodes + 1.0) / 2.0) / _PIECES_PER_UNIT
        h = special.erfcx(4.0 * (1.0 - y) / y) / y
        # interpolation at the Chebyshev points: c_j = (2 / m) sum_k h_k cos(j theta_k)
        table[k] = 2.0 / m * np.cos(np.outer(np.arange(m), theta)) @ h
        table[k, 0] /= 2.0
    return table


_ERFCX = _erfcx_table()


@njit(**_INLINE)
def erfcx(u):
    """exp(u^2) erfc(u) for u in [0, ERFCX_MAX] (piecewise Chebyshev, Clenshaw's sum;
    u is clipped into that range)."""
    y = 4.0 / (4.0 + min(max(u, 0.0), ERFCX_MAX))
    pos = (y - _Y_LOW) * _PIECES_PER_UNIT
    k = min(int(pos), _ERFCX.shape[0] - 1)
    w = 2.0 * (pos - k) - 1.0
    w2 = 2.0 * w
    b1 = _ERFCX[k, 8]
    b2 = 0.0
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 7], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 6], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 5], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 4], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 3], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 2], b1
    b1, b2 = w2 * b1 - b2 + _ERFCX[k, 1], b1
    return y * (w * b1 - b2 + _ERFCX[k, 0])


# --------------------------------------------------------------------------- log Phi

@njit(**_KW)
def tail_series(t):
    """R(t) - 1 for t <= TAIL, where Phi(t) = phi(t) / (-t) * R(t):
    sum_{k >= 1} (-1)^k (2k - 1)!! / t^(2k), to the last term above 1e-17 (the
    asymptotic series; at |t| >= 20 its terms fall below 1e-17 by k = 12)."""
    u = 1.0 / (t * t)
    term = 1.0
    total = 0.0
    for k in range(1, 40):
        term *= -(2 * k - 1) * u
        total += term
        if abs(term) < 1e-17:
            break
    return total


@njit(**_INLINE)
def _ndtr_bulk(t):
    """(log Phi(t), lambda = phi(t) / Phi(t), kappa = t + lambda) for t > TAIL,
    branch-free (garbage at and below TAIL). u = |t| / sqrt 2:

    t >= 0: log1p(-p), p = Phi(-t) = exp(-u^2) erfcx(u) / 2 (0 past ERFCX_MAX, where
    it is below 1e-306), lambda = phi(t) / (1 - p); t < 0: log(erfcx(u) / 2) - u^2,
    lambda = sqrt(2 / pi) / erfcx(u)."""
    u = abs(t) * _SQRT1_2
    ex = erfcx(u)
    uu = u * u
    e2 = vexp(-uu)
    p = 0.5 * e2 * ex
    w = 1.0 - p
    neg = t < 0.0
    log_arg = vlog(0.5 * ex if neg else w)
    # log1p(-p) = log(w) - ((w - 1) + p) / w, w = 1 - p rounded
    log_cdf = log_arg - uu if neg else log_arg - ((w - 1.0) + p) / w
    lam = _SQRT_2_OVER_PI / ex if neg else e2 * _INV_SQRT_2PI / w
    return log_cdf, lam, t + lam


@njit(**_KW)
def ndtr_parts(t):
    """(log Phi(t), lambda = phi(t) / Phi(t), kappa = t + lambda), relative accuracy
    ~1e-15 for every double t (kappa: ~1e-15 t^2 above TAIL): ``_ndtr_bulk`` above
    TAIL, the asymptotic series at and below (no cancellation in kappa there)."""
    if t > TAIL:
        return _ndtr_bulk(t)
    r1 = tail_series(t)
    r = 1.0 + r1
    log_cdf = -0.5 * t * t - math.log(-t) - _HALF_LOG_2PI + math.log1p(r1)
    return log_cdf, -t / r, t * r1 / r


@njit(**_KW)
def log_ndtr(t):
    """log Phi(t), relative accuracy ~1e-15 for every double t (see ndtr_parts)."""
    return ndtr_parts(t)[0]


# ------------------------------------------------------------------------- the slabs

@njit(**_INLINE)
def _exp_slab_terms(zs, a, log_b, log_cdf, lam, kappa):
    """The exponential slab (rate 1/b, on the side of positive z) convolved with
    N(0, s^2), at zs = z / s, a = s / b, from the parts of Phi(t), t = zs - a:
    (log density, d/d log b, d/d mode * s, d2/d log b^2, d2/d mode^2 * s^2,
    d2/d log b d mode * s). d/d log b = -1 + a kappa and d/d mode = (zs - kappa) / s
    cancel no large terms; d kappa / dt = 1 - lambda kappa."""
    curv = 1.0 - lam * kappa
    return (-log_b + a * (0.5 * a - zs) + log_cdf, -1.0 + a * kappa, zs - kappa,
            -a * kappa + a * a * curv, -lam * kappa, -a * curv)


@njit(**_KW)
def exp_slab(zs, a, log_b):
    """``_exp_slab_terms`` for any t: at and below TAIL, log Phi(t) = -t^2 / 2 - log(-t)
    - log(2 pi) / 2 + log R(t), and a^2 / 2 - z / b - t^2 / 2 = -zs^2 / 2 exactly: the
    log density is computed so, its terms of size a^2 cancelling on paper rather than
    in rounding."""
    t = zs - a
    log_cdf, lam, kappa = ndtr_parts(t)
    out = _exp_slab_terms(zs, a, log_b, log_cdf, lam, kappa)
    if t > TAIL:
        return out
    logf = -log_b - 0.5 * zs * zs - math.log(-t) - _HALF_LOG_2PI + math.log1p(
        tail_series(t))
    return logf, out[1], out[2], out[3], out[4], out[5]


@njit(**_INLINE)
def _exp_slab_bulk(zs, a, log_b):
    """``exp_slab`` where t = zs - a > TAIL, branch-free."""
    log_cdf, lam, kappa = _ndtr_bulk(zs - a)
    return _exp_slab_terms(zs, a, log_b, log_cdf, lam, kappa)


@njit(**_INLINE)
def _normal_slab(z, si, b):
    """(log density, d/d log b, d/d mode, d2/d log b^2, d2/d mode^2, d2/d log b d mode)
    of N(0, s^2 + b^2) at z."""
    v = si * si + b * b
    inv_v = 1.0 / v
    w = b * b * inv_v
    zeta = z * z * inv_v
    d_m = z * inv_v
    return (-0.5 * (2.0 * _HALF_LOG_2PI + vlog(v) + zeta), w * (zeta - 1.0), d_m,
            2.0 * w * ((1.0 - w) * (zeta - 1.0) - w * zeta), -inv_v, -2.0 * w * d_m)


@njit(**_INLINE)
def _signed(terms, inv_s, sign):
    """exp_slab's terms in d/d mode (not * s), the side's sign applied."""
    lf, du, dm, huu, hmm, hum = terms
    return lf, du, sign * dm * inv_s, huu, hmm * inv_s * inv_s, sign * hum * inv_s


@njit(**_INLINE)
def _laplace(p, n):
    """The symmetric mixture (p + n) / 2 of the two sides' terms: logaddexp - log 2,
    and the derivatives by the mixture identity (log(1 + e), e in [0, 1], is within
    an ulp of 1 of log1p(e))."""
    lp, up, mp, uup, mmp, ump = p
    ln, un, mn, uun, mmn, umn = n
    top = max(lp, ln)
    d = 1.0 + vexp(min(lp, ln) - top)
    big = 1.0 / d
    wp = big if lp >= ln else 1.0 - big
    wn = 1.0 - wp
    d_u = wp * up + wn * un
    d_m = wp * mp + wn * mn
    return (top + vlog(d) - _LOG2, d_u, d_m,
            wp * (uup + up * up) + wn * (uun + un * un) - d_u * d_u,
            wp * (mmp + mp * mp) + wn * (mmn + mn * mn) - d_m * d_m,
            wp * (ump + up * mp) + wn * (umn + un * mn) - d_u * d_m)


@njit(**_KW)
def _slab(kind, z, si, inv_s, b, log_b):
    """(log density, d/d log b, d/d mode, d2/d log b^2, d2/d mode^2, d2/d log b d mode)
    of the slab's marginal density at z = x - mode, any z (the numpy twin:
    families._slab)."""
    if kind == NORMAL:
        return _normal_slab(z, si, b)
    a = si / b
    zs = z * inv_s
    p = _signed(exp_slab(zs, a, log_b), inv_s, 1.0)
    if kind == EXPONENTIAL:
        return p
    return _laplace(p, _signed(exp_slab(-zs, a, log_b), inv_s, -1.0))


# ---------------------------------------------------------------------- the mixture

_E_CAP = math.exp(CAP)


@njit(**_KW)
def _weights(pi0):
    """(which, lp0, lp1, inv_pi0, inv_pi1) of ``_mixture`` for the weight pi0 of the
    point: which 0 where 1e-300 <= pi0 < 1 (lp0 = log pi0, lp1 = log(1 - pi0),
    inv_pi0 = 1 / pi0, inv_pi1 = 1 / (1 - pi0)); 1 at pi0 = 0 and 2 at pi0 = 1 (no
    weights: lp0 = lp1 = 0); 3 where 0 < pi0 < 1e-300 (``_mixture_general``)."""
    if 1e-300 <= pi0 < 1.0:
        return 0, math.log(pi0), math.log1p(-pi0), 1.0 / pi0, 1.0 / (1.0 - pi0)
    if pi0 == 0.0:
        return 1, 0.0, 0.0, 0.0, 0.0
    if pi0 == 1.0:
        return 2, 0.0, 0.0, 0.0, 0.0
    return 3, math.log(pi0), math.log1p(-pi0), 0.0, 1.0 / (1.0 - pi0)


@njit(**_INLINE)
def _mixture(l0, g0m, inv_s, slab, which, lp0, lp1, inv_pi0, inv_pi1):
    """The 10 terms of ``point_nll`` of one observation from the point's log density
    l0 (and its d/d mode g0m) and the slab's terms, for ``_weights``' which 0 to 2.

    which 0: lm = logaddexp(l0 + log pi0, l1 + log(1 - pi0)), r_k = exp(a_k - lm),
    q_k = f_k / mix: q0 = r0 / pi0, q1 = r1 / (1 - pi0) (below e^CAP). which 1
    (pi0 = 0): lm = l1, r = (0, 1), q1 = 1 and q0 = exp(min(l0 - l1, CAP)) (as in the
    numpy twin: f0 / mix can exceed any double where the point explains x far better
    than the slab), from the same e = exp(-|l0 - l1|); which 2 (pi0 = 1) the mirror
    image. Branch-free (which is the same for every observation)."""
    l1 = slab[0]
    a0 = l0 + lp0
    a1 = l1 + lp1
    top = max(a0, a1)
    e = vexp(min(a0, a1) - top)
    d = 1.0 + e
    big = 1.0 / d
    first = a0 >= a1
    r0 = big if first else e * big
    r1 = e * big if first else big
    lm = top + vlog(d)
    q0 = r0 * inv_pi0
    q1 = r1 * inv_pi1
    if which != 0:
        # the weightless side's f / mix = exp(l - l_other): 1 / e (at most e^CAP) or e
        inv_e = 1.0 / e if e > 1.0 / _E_CAP else _E_CAP
        ratio = inv_e if first == (which == 1) else e
        none = which == 1
        lm = a1 if none else a0
        r0 = 0.0 if none else 1.0
        r1 = 1.0 - r0
        q0 = ratio if none else 1.0
        q1 = 1.0 if none else ratio
    return _mixture_terms(l0, g0m, inv_s, slab, lm, r0, r1, q0, q1)


@njit(**_KW)
def _mixture_general(l0, g0m, inv_s, slab, lp0, lp1, inv_pi1):
    """``_mixture`` for 0 < pi0 < 1e-300 (``_weights``' which 3), as in the numpy twin:
    q0 = exp(min(l0 - lm, CAP)) (r0 / pi0 can overflow)."""
    l1 = slab[0]
    a0 = l0 + lp0
    a1 = l1 + lp1
    top = max(a0, a1)
    e = math.exp(min(a0, a1) - top)
    lm = top + math.log1p(e)
    r0 = 1.0 / (1.0 + e) if a0 >= a1 else e / (1.0 + e)
    r1 = 1.0 - r0 if a0 >= a1 else 1.0 / (1.0 + e)
    return _mixture_terms(l0, g0m, inv_s, slab, lm, r0, r1, math.exp(min(l0 - lm, CAP)),
                          r1 * inv_pi1)


@njit(**_INLINE)
def _mixture_terms(l0, g0m, inv_s, slab, lm, r0, r1, q0, q1):
    """The 10 terms from log mix = lm, the responsibilities r_k and q_k = f_k / mix:
    -lm, the gradient (-(q0 - q1), -r1 dl1/du, -(r0 dl0/dm + r1 dl1/dm)) and the
    Hessian of -lm by the mixture identity sum_k r_k (H_k + g_k g_k') - g g', and
    d2 lm / d pi0 d theta = q0 (dl0 - g) - q1 (dl1 - g) (dl0 / d log b = 0)."""
    l1, g1u, g1m, h1uu, h1mm, h1um = slab
    dp = q0 - q1
    gu = r1 * g1u
    gm = r0 * g0m + r1 * g1m
    return (-lm, -dp, -gu, -gm, dp * dp, q0 * gu + q1 * (g1u - gu),
            -(q0 * (g0m - gm) - q1 * (g1m - gm)),
            -(r1 * (h1uu + g1u * g1u) - gu * gu),
            -(r1 * (h1um + g1u * g1m) - gu * gm),
            -(r0 * (g0m * g0m - inv_s * inv_s) + r1 * (h1mm + g1m * g1m) - gm * gm))


@njit(**_KW)
def _terms_scalar(kind, xi, si, log_si, b, log_b, mode, weights):
    """The 10 terms of one observation, any data (the tail series of Phi where
    needed) and any weight (``weights``: ``_weights(pi0)``)."""
    which, lp0, lp1, inv_pi0, inv_pi1 = weights
    inv_s = 1.0 / si
    z = xi - mode
    zs = z * inv_s
    l0 = -_HALF_LOG_2PI - log_si - 0.5 * zs * zs
    slab = _slab(kind, z, si, inv_s, b, log_b)
    if which == 3:
        return _mixture_general(l0, zs * inv_s, inv_s, slab, lp0, lp1, inv_pi1)
    return _mixture(l0, zs * inv_s, inv_s, slab, which, lp0, lp1, inv_pi0, inv_pi1)


@njit(**_INLINE)
def _store(buf, j, terms):
    for k in range(10):
        buf[k, j] = terms[k]


@njit(**_KW)
def _block(kind, x, s, log_s, lo, hi, pi0, b, mode, out):
    """Adds the terms of observations lo..hi-1 of ``point_nll`` to out (10,), each
    term summed in observation order.

    Chunk by chunk: the branch-free loop (one per slab, vectorized) fills the buffer;
    the observations it cannot serve (t <= TAIL on a side of an exponential slab; all
    of them where 0 < pi0 < 1e-300) are recomputed by ``_terms_scalar``."""
    log_b = math.log(b)
    weights = _weights(pi0)
    which, lp0, lp1, inv_pi0, inv_pi1 = weights
    buf = np.empty((10, CHUNK))
    redo = np.empty(CHUNK, dtype=np.bool_)
    # ten running sums, in registers (not in ``out``: those would be stores the loop
    # must wait for)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = s8 = s9 = 0.0
    for c0 in range(lo, hi, CHUNK):
        m = min(CHUNK, hi - c0)
        if kind == NORMAL:
            for j in range(m):
                i = c0 + j
                si = s[i]
                inv_s = 1.0 / si
                z = x[i] - mode
                zs = z * inv_s
                _store(buf, j, _mixture(-_HALF_LOG_2PI - log_s[i] - 0.5 * zs * zs,
                                        zs * inv_s, inv_s, _normal_slab(z, si, b),
                                        which, lp0, lp1, inv_pi0, inv_pi1))
                redo[j] = which == 3
        elif kind == EXPONENTIAL:
            for j in range(m):
                i = c0 + j
                si = s[i]
                inv_s = 1.0 / si
                zs = (x[i] - mode) * inv_s
                a = si / b
                slab = _signed(_exp_slab_bulk(zs, a, log_b), inv_s, 1.0)
                _store(buf, j, _mixture(-_HALF_LOG_2PI - log_s[i] - 0.5 * zs * zs,
                                        zs * inv_s, inv_s, slab, which, lp0, lp1,
                                        inv_pi0, inv_pi1))
                redo[j] = zs - a <= TAIL or which == 3
        else:
            for j in range(m):
                i = c0 + j
                si = s[i]
                inv_s = 1.0 / si
                zs = (x[i] - mode) * inv_s
                a = si / b
                slab = _laplace(_signed(_exp_slab_bulk(zs, a, log_b), inv_s, 1.0),
                                _signed(_exp_slab_bulk(-zs, a, log_b), inv_s, -1.0))
                _store(buf, j, _mixture(-_HALF_LOG_2PI - log_s[i] - 0.5 * zs * zs,
                                        zs * inv_s, inv_s, slab, which, lp0, lp1,
                                        inv_pi0, inv_pi1))
                redo[j] = -abs(zs) - a <= TAIL or which == 3
        for j in range(m):
            if redo[j]:
                i = c0 + j
                _store(buf, j, _terms_scalar(kind, x[i], s[i], log_s[i], b, log_b, mode,
                                             weights))
        for j in range(m):
            s0 += buf[0, j]
            s1 += buf[1, j]
            s2 += buf[2, j]
            s3 += buf[3, j]
            s4 += buf[4, j]
            s5 += buf[5, j]
            s6 += buf[6, j]
            s7 += buf[7, j]
            s8 += buf[8, j]
            s9 += buf[9, j]
    out[0] += s0
    out[1] += s1
    out[2] += s2
    out[3] += s3
    out[4] += s4
    out[5] += s5
    out[6] += s6
    out[7] += s7
    out[8] += s8
    out[9] += s9


@njit(parallel=True, **_KW)
def point_nll(kind, x, s, log_s, pi0, b, mode):
    """-sum_i log(pi0 N(x_i; mode, s_i^2) + (1 - pi0) slab(x_i)) and its derivatives in
    v = (pi0, log b, mode): returns (10,) = value, gradient (3), Hessian (pp, pu, pm,
    uu, um, mm). ``log_s`` is log(s). pi0 in [0, 1], b > 0. The blocks run in
    parallel; ``point_nll_serial`` is the same sum in one thread (for small n, where
    starting threads costs more than it saves), equal to the last bit."""
    n = x.size
    n_blocks = max(1, (n + BLOCK - 1) // BLOCK)
    partial = np.zeros((n_blocks, 10))
    for blk in prange(n_blocks):
        _block(kind, x, s, log_s, blk * n // n_blocks, (blk + 1) * n // n_blocks, pi0, b,
               mode, partial[blk])
    out = np.zeros(10)
    for blk in range(n_blocks):
        for j in range(10):
            out[j] += partial[blk, j]
    return out


@njit(**_KW)
def point_nll_serial(kind, x, s, log_s, pi0, b, mode):
    """``point_nll`` in one thread (same blocks, same order: the same result)."""
    n = x.size
    n_blocks = max(1, (n + BLOCK - 1) // BLOCK)
    out = np.zeros(10)
    row = np.zeros(10)
    for blk in range(n_blocks):
        row[:] = 0.0
        _block(kind, x, s, log_s, blk * n // n_blocks, (blk + 1) * n // n_blocks, pi0, b,
               mode, row)
        for j in range(10):
            out[j] += row[j]
    return out


# ------------------------------------------------------------------ Newton's method

@njit(**_KW)
def objective(kind, x, s, log_s, v, fit_scale, fit_mode, scale, mode, parallel):
    """``point_nll`` at v = (pi0, [log b], [mode]) (pi0 clipped into [0, 1]; b = scale
    and mode = mode where not fitted): (value, gradient (d,), Hessian (d, d)), d =
    v.size; ``parallel``: point_nll, else point_nll_serial (the same numbers)."""
    pi0 = min(max(v[0], 0.0), 1.0)
    b = math.exp(v[1]) if fit_scale else scale
    md = v[v.size - 1] if fit_mode else mode
    if parallel:
        out = point_nll(kind, x, s, log_s, pi0, b, md)
    else:
        out = point_nll_serial(kind, x, s, log_s, pi0, b, md)
    d = v.size
    keep = np.zeros(d, dtype=np.int64)
    if fit_scale:
        keep[1] = 1
    if fit_mode:
        keep[d - 1] = 2
    # the Hessian's entries in out[4:]: (pp, pu, pm, uu, um, mm)
    where = np.array([[4, 5, 6], [5, 7, 8], [6, 8, 9]])
    g = np.empty(d)
    h = np.empty((d, d))
    for i in range(d):
        g[i] = out[1 + keep[i]]
        for j in range(d):
            h[i, j] = out[where[keep[i], keep[j]]]
    return out[0], g, h


@njit(**_KW)
def _sym_eig(a):
    """Eigenvalues and eigenvectors (columns) of the small symmetric matrix a, by
    cyclic Jacobi rotations (to 1e-15 of its norm; no LAPACK for a 3 x 3)."""
    n = a.shape[0]
    a = a.copy()
    q = np.eye(n)
    scale = 0.0
    for i in range(n):
        for j in range(n):
            scale = max(scale, abs(a[i, j]))
    for _ in range(50):
        off = 0.0
        for i in range(n):
            for j in range(i + 1, n):
                off = max(off, abs(a[i, j]))
        if off <= 1e-15 * scale:
            break
        for p in range(n):
            for r in range(p + 1, n):
                if a[p, r] == 0.0:
                    continue
                theta = (a[r, r] - a[p, p]) / (2.0 * a[p, r])
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1))
                c = 1.0 / math.sqrt(t * t + 1.0)
                sn = t * c
                for k in range(n):  # a <- J' a J, columns then rows
                    akp, akr = a[k, p], a[k, r]
                    a[k, p] = c * akp - sn * akr
                    a[k, r] = sn * akp + c * akr
                for k in range(n):
                    apk, ark = a[p, k], a[r, k]
                    a[p, k] = c * apk - sn * ark
                    a[r, k] = sn * apk + c * ark
                for k in range(n):
                    qkp, qkr = q[k, p], q[k, r]
                    q[k, p] = c * qkp - sn * qkr
                    q[k, r] = sn * qkp + c * qkr
    w = np.empty(n)
    for i in range(n):
        w[i] = a[i, i]
    return w, q


#: Statuses of ``newton``.
FAILED, CONVERGED, MERGED = 0, 1, 2


@njit(**_KW)
def newton(kind, x, s, log_s, v0, lower, upper, fit_scale, fit_mode, scale, mode, parallel,
           tol, max_iter, start, known, sep):
    """Projected Newton on ``objective`` in the box [lower, upper] from v0, with
    backtracking (the optimizer of ``families._fit_point``, here so that no iteration
    returns to Python).

    The variables at a bound whose gradient pushes outward are held; the step of the
    others is Newton's with the Hessian's eigenvalues made positive (|w|, at least
    1e-12 of the largest). Stops when the step's predicted decrease g' H^-1 g / 2 is
    at most tol (1 + |f|), or nothing is free (CONVERGED); where no step decreases f
    (CONVERGED if the decrease promised was at most 1e-10 (1 + |f|), else FAILED);
    where the Hessian is not finite (FAILED); after a step that brings v within sep of
    a row of ``known`` (MERGED: a basin already explored); after max_iter steps
    (FAILED). ``start``: (f, g, H) at v0 when its first element is finite (saves an
    evaluation), else computed. Returns (v, f, g, n_iter, status).
    """
    d = v0.size
    v = np.minimum(np.maximum(v0, lower), upper)
    if math.isfinite(start[0][0]):
        f, g, h = start[0][0], start[1].copy(), start[2].copy()
    else:
        f, g, h = objective(kind, x, s, log_s, v, fit_scale, fit_mode, scale, mode, parallel)
    for it in range(max_iter):
        free = np.empty(d, dtype=np.int64)
        m = 0
        for i in range(d):
            if not ((v[i] <= lower[i] and g[i] > 0) or (v[i] >= upper[i] and g[i] < 0)):
                free[m] = i
                m += 1
        if m == 0:
            return v, f, g, it, CONVERGED
        hf = np.empty((m, m))
        finite = math.isfinite(f)
        for i in range(m):
            finite = finite and math.isfinite(g[free[i]])
            for j in range(m):
                hf[i, j] = h[free[i], free[j]]
                finite = finite and math.isfinite(hf[i, j])
        if not finite:
            return v, f, g, it, FAILED
        w, q = _sym_eig(hf)
        floor = 0.0
        for i in range(m):
            floor = max(floor, abs(w[i]))
        floor = 1e-12 * floor if floor > 0.0 else 1.0
        step = np.zeros(d)
        for k in range(m):  # -sum_k q_k (q_k' g) / max(|w_k|, floor)
            proj = 0.0
            for i in range(m):
                proj += q[i, k] * g[free[i]]
            proj /= max(abs(w[k]), floor)
            for i in range(m):
                step[free[i]] -= q[i, k] * proj
        decrease = 0.0  # the Newton decrement squared
        for i in range(d):
            decrease -= g[i] * step[i]
        if decrease <= 2.0 * tol * (1.0 + abs(f)):
            return v, f, g, it, CONVERGED
        t = 1.0
        accepted = False
        for _ in range(40):
            v_new = np.minimum(np.maximum(v + t * step, lower), upper)
            f_new, g_new, h_new = objective(kind, x, s, log_s, v_new, fit_scale, fit_mode,
                                            scale, mode, parallel)
            slope = 0.0
            for i in range(d):
                slope += g[i] * (v_new[i] - v[i])
            if f_new <= f + 1e-4 * slope:
                accepted = True
                break
            t *= 0.5
        # no decrease left at double precision: converged only where the model promised
        # next to nothing
        if not accepted or np.all(v_new == v):
            return v, f, g, it + 1, CONVERGED if decrease <= 2e-10 * (1.0 + abs(f)) else FAILED
        v, f, g, h = v_new, f_new, g_new, h_new
        for r in range(known.shape[0]):
            near = True
            for i in range(d):
                near = near and abs(v[i] - known[r, i]) <= sep[i]
            if near:
                return v, f, g, it + 1, MERGED
    return v, f, g, max_iter, FAILED
