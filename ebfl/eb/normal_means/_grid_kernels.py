"""Numba kernels of the normal-means priors' component densities (private: no validation).

``log_component_matrix`` fills the (n, K) matrix of log marginal densities of
x_i ~ N(theta_i, s_i^2) under each component (normal, uniform, exponential,
truncated normal), the costliest step of every grid fit (10^5 observations by
250 uniform components: 2.5e7 log Phi differences). Its numpy twin is
:meth:`ebfl.eb.normal_means.NormalMeansPrior.log_component_density` (the
``numpy`` branch), which it must match to 1e-12 relative
(``tests/test_ebnm_kernels.py``). Each entry is computed on its own, so the
result does not depend on the number of threads. No fastmath: the log Phi tails
are sums of terms of alternating sign (see :func:`~._kernels.log_ndtr`).
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


@njit(parallel=True, cache=CACHE)
def log_component_matrix(x, s, kinds, a, b):
    """out[i, k] = log of component k's marginal density at x_i with sd s_i.

    kinds : int64 (K,) kind codes; a, b : float64 (K,) the components' parameters.
    """
    n, k = x.size, kinds.size
    out = np.empty((n, k))
    log_width = np.zeros(k)
    trunc_const = np.zeros(k)
    for j in range(k):
        if kinds[j] == UNIFORM:
            log_width[j] = math.log(b[j] - a[j])
        elif kinds[j] == TNORMAL_POS:
            trunc_const[j] = log_ndtr(a[j] / b[j])
    n_tasks = (n + _ROWS - 1) // _ROWS
    for task in prange(n_tasks):
        for i in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
            xi, si = x[i], s[i]
            for j in range(k):
                out[i, j] = _entry(kinds[j], xi, si, a[j], b[j], log_width[j],
                                   trunc_const[j])
    return out


#: Rows per block of the certificate's sums (their number depends on n only).
CERT_BLOCK = 4096


@njit(parallel=True, cache=CACHE)
def certificate_sums(x, s, kinds, a, b, weights):
    """(sum_i L_ik / (L w)_i for every k, sum_i log (L w)_i) in one pass over the rows.

    The twin of ``grid._certificate_numpy``. Sums are accumulated per block of
    CERT_BLOCK rows and the blocks added in order: the result does not depend on the
    number of threads.
    """
    n, k = x.size, kinds.size
    log_width = np.zeros(k)
    trunc_const = np.zeros(k)
    for j in range(k):
        if kinds[j] == UNIFORM:
            log_width[j] = math.log(b[j] - a[j])
        elif kinds[j] == TNORMAL_POS:
            trunc_const[j] = log_ndtr(a[j] / b[j])
    n_blocks = (n + CERT_BLOCK - 1) // CERT_BLOCK
    ratio = np.zeros((n_blocks, k))
    loglik = np.zeros(n_blocks)
    for blk in prange(n_blocks):
        row = np.empty(k)
        for i in range(blk * CERT_BLOCK, min(n, (blk + 1) * CERT_BLOCK)):
            top = -math.inf
            for j in range(k):
                row[j] = _entry(kinds[j], x[i], s[i], a[j], b[j], log_width[j],
                                trunc_const[j])
                top = max(top, row[j])
            f = 0.0
            for j in range(k):
                row[j] = math.exp(row[j] - top)
                f += weights[j] * row[j]
            for j in range(k):
                ratio[blk, j] += row[j] / f
            loglik[blk] += math.log(f) + top
    total = np.zeros(k)
    ll = 0.0
    for blk in range(n_blocks):
        for j in range(k):
            total[j] += ratio[blk, j]
        ll += loglik[blk]
    return total, ll
