"""Numba kernels of the normal-means priors (private: no validation).

``log_component_matrix`` fills the (n, K) matrix of log marginal densities of
x_i ~ N(theta_i, s_i^2) under each component (normal, uniform, exponential,
truncated normal), the costliest step of every grid fit (10^5 observations by
250 uniform components: 2.5e7 log Phi differences). Its numpy twin is
:meth:`ebfl.eb.normal_means.NormalMeansPrior.log_component_density` (the
``numpy`` branch), which it must match to 1e-12 relative
(``tests/test_ebnm_kernels.py``). Each entry is computed on its own, so the
result does not depend on the number of threads. No fastmath: the log Phi tails
are sums of terms of alternating sign (see :func:`~._kernels.log_ndtr`).

``likelihood_matrix`` is the same matrix exponentiated, each row scaled to a largest
entry of 1 (mix-SQP's input; twin: ``grid._likelihood_numpy``).
``certificate_sums`` is the one-pass KKT certificate of a grid fit on the data
(twin: ``grid._certificate_numpy``); ``posterior_rows`` every row's posterior
(twin: ``NormalMeansPrior._posterior_arrays_numpy``), which flags the rows
whose truncated pieces need the numpy path's quadrature.
"""

import math

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE
from ebfl.eb.normal_means._kernels import log_ndtr

#: Kind codes, in the order of :data:`ebfl.eb.normal_means.prior.KINDS`.
NORMAL, UNIFORM, EXP_POS, EXP_NEG, TNORMAL_POS = 0, 1, 2, 3, 4
#: Rows per parallel task.
_ROWS = 256

_LOG_2PI = math.log(2.0 * math.pi)
_SQRT1_2 = math.sqrt(0.5)


@njit(cache=CACHE)
def log_normal_mass(lo, hi):
    """log(Phi(hi) - Phi(lo)) for lo <= hi, reflected into the lower tail when lo > 0
    (the twin of :func:`ebfl.eb.normal_means.truncated.log_normal_mass`)."""
    if lo > 0.0:
        lo, hi = -hi, -lo
    if lo == hi:
        return -math.inf
    lb = log_ndtr(hi)
    la = log_ndtr(lo)
    return lb + math.log1p(-math.exp(la - lb))


@njit(cache=CACHE)
def _entry(kind, x, s, a, b, log_width, trunc_const):
    if kind == NORMAL:
        var = s * s + b * b
        d = x - a
        return -0.5 * (_LOG_2PI + math.log(var) + d * d / var)
    if kind == UNIFORM:
        return log_normal_mass((a - x) / s, (b - x) / s) - log_width
    if kind == TNORMAL_POS:
        var = s * s + b * b
        d = x - a
        m = (x * b * b + a * s * s) / var
        sd = s * b / math.sqrt(var)
        return -0.5 * (_LOG_2PI + math.log(var) + d * d / var) + log_ndtr(m / sd) - trunc_const
    z = x - a if kind == EXP_POS else a - x
    return -math.log(b) + s * s / (2.0 * b * b) - z / b + log_ndtr(z / s - s / b)


@njit(cache=CACHE)
def _constants(kinds, a, b):
    """Per component: log(b - a) of the uniforms, log Phi(a / b) of the truncated
    normals (0 elsewhere)."""
    k = kinds.size
    log_width = np.zeros(k)
    trunc_const = np.zeros(k)
    for j in range(k):
        if kinds[j] == UNIFORM:
            log_width[j] = math.log(b[j] - a[j])
        elif kinds[j] == TNORMAL_POS:
            trunc_const[j] = log_ndtr(a[j] / b[j])
    return log_width, trunc_const


@njit(parallel=True, cache=CACHE)
def log_component_matrix(x, s, kinds, a, b):
    """out[i, k] = log of component k's marginal density at x_i with sd s_i.

    kinds : int64 (K,) kind codes; a, b : float64 (K,) the components' parameters.
    """
    n, k = x.size, kinds.size
    out = np.empty((n, k))
    log_width, trunc_const = _constants(kinds, a, b)
    n_tasks = (n + _ROWS - 1) // _ROWS
    for task in prange(n_tasks):
        for i in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
            xi, si = x[i], s[i]
            for j in range(k):
                out[i, j] = _entry(kinds[j], xi, si, a[j], b[j], log_width[j],
                                   trunc_const[j])
    return out


#: A row's log marginal (under the weighted components) within +-LINEAR_LOG of 0 takes
#: the components without weight in linear space (their densities directly, the ratio
#: as density times exp(-log marginal)); beyond, all of its entries in log space. Within
#: it, a density that underflows to 0 in linear space (below e^-745) has a true ratio
#: below e^(LINEAR_LOG - 745), far below anything a certificate at 1e-8 can see.
LINEAR_LOG = 600.0
_SQRT_2PI = math.sqrt(2.0 * math.pi)


#: erfc(z) is 0 in double precision from z = 27.3 on (below the smallest subnormal);
#: from 6.5 on, 1 - erfc(z) / 2 rounds to 1; and erfc(hi) < 2^-54 erfc(lo) (below half
#: an ulp of the difference) where hi^2 - lo^2 >= 37.5 (lo > 0).
_ERFC_ZERO, _ERFC_ONE, _ERFC_GONE = 27.3, 6.5, 37.5


@njit(cache=CACHE)
def _linear_entry(kind, x, s, a, b, width):
    """A normal or uniform component's marginal density itself (not its log): the
    certificate's cheap path. Uniform: Phi(beta) - Phi(alpha) from the erfc of the
    tail that is away from the mass, so no digits cancel but the difference's own."""
    if kind == NORMAL:
        var = s * s + b * b
        d = x - a
        return math.exp(-0.5 * d * d / var) / (_SQRT_2PI * math.sqrt(var))
    lo, hi = (a - x) / s * _SQRT1_2, (b - x) / s * _SQRT1_2
    # Most of a grid's intervals lie far from x, or far around it, in units of s: there
    # an erfc is 0 or 2 to double precision, or too small to change the difference by
    # an ulp, and is not computed (the same number, at a fraction of the cost).
    if lo > 0.0:
        if lo >= _ERFC_ZERO:
            return 0.0
        far = hi * hi - lo * lo >= _ERFC_GONE
        mass = 0.5 * (math.erfc(lo) - (0.0 if far else math.erfc(hi)))
    elif hi < 0.0:
        if hi <= -_ERFC_ZERO:
            return 0.0
        far = lo * lo - hi * hi >= _ERFC_GONE
        mass = 0.5 * (math.erfc(-hi) - (0.0 if far else math.erfc(-lo)))
    elif hi >= _ERFC_ONE and lo <= -_ERFC_ONE:
        mass = 1.0
    else:
        mass = 1.0 - 0.5 * (math.erfc(hi) + math.erfc(-lo))
    return mass / width


#: A row of ``likelihood_matrix`` whose largest linear density is below this (or not
#: finite) is redone in log space. Above it, an entry lost to underflow (below 5e-324)
#: is below 5e-224 of the row's largest, where the log path's exp gives ~0 as well.
_LINEAR_FLOOR = 1e-100


@njit(parallel=True, cache=CACHE)
def likelihood_matrix(x, s, kinds, a, b):
    """(lik, shift): lik[i, k] = exp(log_component_matrix[i, k] - shift[i]) with shift[i]
    the row's largest log density (so each row's largest entry is 1), in one pass: the
    form mix-SQP works on, without the (n, K) log matrix in between.

    Where every component is normal or uniform (the grid families), the densities are
    taken in linear space (``_linear_entry``: one exp or two erfc an entry instead of a
    log and an exp, or two log Phi) and divided by the row's largest; a row whose
    largest is below _LINEAR_FLOOR (an observation hundreds of sds from every
    component) is redone in log space, so no entry is lost that matters (see _LINEAR_FLOOR).
    """
    n, k = x.size, kinds.size
    lik = np.empty((n, k))
    shift = np.empty(n)
    log_width, trunc_const = _constants(kinds, a, b)
    width = np.exp(log_width)
    linear = True
    for j in range(k):
        linear = linear and (kinds[j] == NORMAL or kinds[j] == UNIFORM)
    n_tasks = (n + _ROWS - 1) // _ROWS
    for task in prange(n_tasks):
        for i in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
            xi, si = x[i], s[i]
            if linear:
                top = 0.0
                for j in range(k):
                    lik[i, j] = _linear_entry(kinds[j], xi, si, a[j], b[j], width[j])
                    top = max(top, lik[i, j])
                if top >= _LINEAR_FLOOR and top < math.inf:
                    inv = 1.0 / top
                    for j in range(k):
                        lik[i, j] *= inv
                    shift[i] = math.log(top)
                    continue
            top = -math.inf
            for j in range(k):
                lik[i, j] = _entry(kinds[j], xi, si, a[j], b[j], log_width[j],
                                   trunc_const[j])
                top = max(top, lik[i, j])
            shift[i] = top
            for j in range(k):
                lik[i, j] = math.exp(lik[i, j] - top)
    return lik, shift


#: Rows per block of the certificate's sums (their number depends on n only).
CERT_BLOCK = 4096


@njit(parallel=True, cache=CACHE)
def certificate_sums(x, s, kinds, a, b, weights):
    """(sum_i L_ik / (L w)_i for every k, sum_i log (L w)_i) in one pass over the rows.

    The twin of ``grid._certificate_numpy``. The marginal (L w)_i comes from the
    weighted components in log space; the components without weight, most of a
    fitted grid, are taken in linear space where they are normal or uniform and the
    row's log marginal is within +-LINEAR_LOG (two erfc or one exp an entry, instead of
    two log Phi). Sums are accumulated per block of CERT_BLOCK rows and the blocks
    added in order: the result does not depend on the number of threads.
    """
    n, k = x.size, kinds.size
    log_width, trunc_const = _constants(kinds, a, b)
    width = np.exp(log_width)
    weighted = np.flatnonzero(weights > 0)
    linear = np.zeros(k, dtype=np.bool_)
    for j in range(k):
        linear[j] = weights[j] == 0 and (kinds[j] == NORMAL or kinds[j] == UNIFORM)
    n_blocks = (n + CERT_BLOCK - 1) // CERT_BLOCK
    ratio = np.zeros((n_blocks, k))
    loglik = np.zeros(n_blocks)
    for blk in prange(n_blocks):
        row = np.empty(k)
        for i in range(blk * CERT_BLOCK, min(n, (blk + 1) * CERT_BLOCK)):
            xi, si = x[i], s[i]
            top = -math.inf
            for j in weighted:
                row[j] = _entry(kinds[j], xi, si, a[j], b[j], log_width[j], trunc_const[j])
                top = max(top, row[j])
            f = 0.0
            for j in weighted:
                f += weights[j] * math.exp(row[j] - top)
            log_f = math.log(f) + top
            loglik[blk] += log_f
            cheap = abs(log_f) <= LINEAR_LOG
            inv_f = math.exp(-log_f) if cheap else 0.0
            for j in range(k):
                if cheap and linear[j]:
                    ratio[blk, j] += _linear_entry(kinds[j], xi, si, a[j], b[j],
                                                   width[j]) * inv_f
                else:
                    if weights[j] == 0:
                        row[j] = _entry(kinds[j], xi, si, a[j], b[j], log_width[j],
                                        trunc_const[j])
                    ratio[blk, j] += math.exp(row[j] - log_f)
    total = np.zeros(k)
    ll = 0.0
    for blk in range(n_blocks):
        for j in range(k):
            total[j] += ratio[blk, j]
        ll += loglik[blk]
    return total, ll


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@njit(cache=CACHE)
def _piece(kind, x, s, a, b):
    """The component posterior's normal (mean, sd) and its interval [lo, hi]."""
    if kind == NORMAL:
        if b == 0.0:
            return a, 0.0, -math.inf, math.inf
        var = s * s + b * b
        return (x * b * b + a * s * s) / var, s * b / math.sqrt(var), -math.inf, math.inf
    if kind == UNIFORM:
        return x, s, a, b
    if kind == TNORMAL_POS:
        var = s * s + b * b
        return (x * b * b + a * s * s) / var, s * b / math.sqrt(var), 0.0, math.inf
    if kind == EXP_POS:
        return x - s * s / b, s, a, math.inf
    return x + s * s / b, s, -math.inf, a


@njit(cache=CACHE)
def _log_pdf(z):
    return -0.5 * z * z - _LOG_SQRT_2PI if math.isfinite(z) else -math.inf


#: Sds between the mean (and 0) and each end beyond which a truncated normal piece is
#: taken as untruncated: Phi(-9) = 1.1e-19, and the relative change of the smaller sign's
#: mass is below exp(-9^2 / 2) = 2.6e-18 (see _truncated).
_UNTRUNCATED = 9.0


@njit(cache=CACHE)
def _truncated(mu, sd, lo, hi):
    """(mean, variance, P(< 0), P(> 0), lost) of N(mu, sd^2) on [lo, hi] (sd > 0), the
    closed forms of :func:`ebfl.eb.normal_means.truncated.truncated_normal_pieces`;
    ``lost``: the variance's closed form kept few digits (the caller recomputes)."""
    alpha = (lo - mu) / sd
    beta = (hi - mu) / sd
    cut = -mu / sd
    if alpha <= cut - _UNTRUNCATED and beta >= cut + _UNTRUNCATED \
            and alpha <= -_UNTRUNCATED and beta >= _UNTRUNCATED:
        # The interval reaches 9 sds beyond the mean and beyond 0 on both sides: the
        # truncation moves the mean, the variance and each sign's mass by under 1e-17
        # of themselves, so the untruncated closed forms hold (one erfc, not three
        # log Phi differences).
        tail = 0.5 * math.erfc(abs(mu) / sd * _SQRT1_2)
        below, above = (tail, 1.0 - tail) if mu > 0.0 else (1.0 - tail, tail)
        return mu, sd * sd, below, above, False
    log_mass = log_normal_mass(alpha, beta)
    ra = math.exp(_log_pdf(alpha) - log_mass)
    rb = math.exp(_log_pdf(beta) - log_mass)
    a_ra = alpha * ra if math.isfinite(alpha) else 0.0
    b_rb = beta * rb if math.isfinite(beta) else 0.0
    shift = ra - rb
    first = min(max(mu + sd * shift, lo), hi)
    bracket = 1.0 + a_ra - b_rb - shift * shift
    size = 1.0 + abs(a_ra) + abs(b_rb) + shift * shift
    lost = not (size * 1e-6 < abs(bracket))
    var = sd * sd * max(bracket, 0.0)
    cut = min(beta, cut)
    below = 0.0 if cut <= alpha else math.exp(min(log_normal_mass(alpha, max(cut, alpha))
                                                  - log_mass, 0.0))
    cut_up = max(alpha, -mu / sd)
    above = 0.0 if cut_up >= beta else math.exp(min(log_normal_mass(min(cut_up, beta), beta)
                                                    - log_mass, 0.0))
    return first, var, below, above, lost


@njit(parallel=True, cache=CACHE)
def posterior_rows(x, s, kinds, a, b, log_w, mean, sd_out, second, lfsr, p_zero, log_marg,
                   lost):
    """Fill each row's posterior (mean, sd, second moment, lfsr, P(0), log marginal).

    The twin of ``NormalMeansPrior._posterior_arrays`` (numpy). ``lost[i]`` is set
    where a truncated piece's variance lost its digits in the closed form: the caller
    recomputes those rows with the numpy path (which integrates them by quadrature).
    """
    n, k = x.size, kinds.size
    log_width, trunc_const = _constants(kinds, a, b)
    n_tasks = (n + _ROWS - 1) // _ROWS
    for task in prange(n_tasks):
        lj = np.empty(k)
        first = np.empty(k)
        var = np.empty(k)
        resp = np.empty(k)
        for i in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
            xi, si = x[i], s[i]
            top = -math.inf
            for j in range(k):
                lj[j] = log_w[j] + _entry(kinds[j], xi, si, a[j], b[j], log_width[j],
                                          trunc_const[j])
                top = max(top, lj[j])
            lm = top
            if k > 1:  # (one component: its log density is the marginal's)
                total = 0.0
                for j in range(k):
                    total += math.exp(lj[j] - top)
                lm += math.log(total)
            m1 = m2 = pn = pp = pz = 0.0
            flag = False
            for j in range(k):
                r = math.exp(lj[j] - lm)
                resp[j] = r
                if r == 0.0:  # (no weight here: nothing of this piece to add)
                    first[j] = var[j] = 0.0
                    continue
                mu, sd, lo, hi = _piece(kinds[j], xi, si, a[j], b[j])
                if sd == 0.0:
                    f, v = mu, 0.0
                    bl = 1.0 if mu < 0 else 0.0
                    ab = 1.0 if mu > 0 else 0.0
                    if mu == 0.0:
                        pz += r
                elif lo == -math.inf and hi == math.inf:
                    f, v = mu, sd * sd
                    # one erfc: the smaller tail from it (full relative accuracy), the
                    # larger as 1 minus it (>= 1/2, so accurate too)
                    tail = 0.5 * math.erfc(abs(mu) / sd * _SQRT1_2)
                    bl, ab = (tail, 1.0 - tail) if mu > 0.0 else (1.0 - tail, tail)
                else:
                    f, v, bl, ab, bad = _truncated(mu, sd, lo, hi)
                    flag = flag or bad
                first[j], var[j] = f, v
                m1 += r * f
                m2 += r * (f * f + v)
                pn += r * bl
                pp += r * ab
            tv = 0.0
            for j in range(k):
                d = first[j] - m1
                tv += resp[j] * (var[j] + d * d)
            mean[i] = m1
            sd_out[i] = math.sqrt(tv)
            second[i] = m2
            lfsr[i] = min(max(min(pn + pz, pp + pz), 0.0), 1.0)
            p_zero[i] = pz
            log_marg[i] = lm
            lost[i] = flag
