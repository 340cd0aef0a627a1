"""Numba kernels of the mix-SQP solver (``ebfl.eb.mixture_weights``; private: no validation).

Each kernel has a plain-numpy twin in ``tests/naive.py`` that it must match to
1e-12. Sums over rows are accumulated in a fixed number of row blocks and the
block totals are added in block order, so results do not depend on the number
of threads; per-row outputs do not depend on the blocking at all.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _mixture_gradient(lik, w, support, counts, n_blocks):
    """One pass over L at a sparse w: f, the full-grid gradient and the log-likelihood.

    f_i = sum_{j in support} L_ij w_j (w is zero off ``support``), then
    g_k = sum_i c_i L_ik / f_i over *every* column k (the certificate needs the
    whole grid) and ll = sum_i c_i log f_i, in one read of each row. A row with
    f_i <= 0 makes ll -inf and adds nothing to g. Returns g (K,), ll and f (n,).
    """
    n, k = lik.shape
    partial = np.zeros((n_blocks, k))
    partial_ll = np.zeros(n_blocks)
    f = np.empty(n)
    for b in prange(n_blocks):
        start = b * n // n_blocks
        stop = (b + 1) * n // n_blocks
        for i in range(start, stop):
            fi = 0.0
            for j in support:
                fi += lik[i, j] * w[j]
            f[i] = fi
            if fi <= 0.0:
                partial_ll[b] = -np.inf
                continue
            scale = counts[i] / fi
            for j in range(k):
                partial[b, j] += lik[i, j] * scale
            partial_ll[b] += counts[i] * np.log(fi)
    grad = np.zeros(k)
    ll = 0.0
    for b in range(n_blocks):
        for j in range(k):
            grad[j] += partial[b, j]
        ll += partial_ll[b]
    return grad, ll, f


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _gather_columns(lik, columns):
    """The columns ``columns`` of L as a contiguous (n, len(columns)) array."""
    n = lik.shape[0]
    m = columns.size
    out = np.empty((n, m))
    for i in prange(n):
        for j in range(m):
            out[i, j] = lik[i, columns[j]]
    return out


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _weighted_gram(a, f, counts, n_blocks):
    """H = sum_i (c_i / f_i^2) a_i a_i' for the rows a_i of a (n, m): the mix-SQP Hessian
    on the active columns, times N. Returns the full symmetric (m, m).

    Numba rather than BLAS: a BLAS call between two parallel Numba passes finds
    the cores held by Numba's spinning threads and can run 100x slower (the two
    thread pools contend on a small machine). Rows are taken four at a time, so
    each partial sum is loaded and stored once per four products.
    """
    n, m = a.shape
    partial = np.zeros((n_blocks, m, m))
    for b in prange(n_blocks):
        h = partial[b]
        tile = np.zeros((4, m))  # four scaled rows; zero rows pad the block's end
        stop = (b + 1) * n // n_blocks
        for i in range(b * n // n_blocks, stop, 4):
            for r in range(4):
                if i + r < stop:
                    scale = np.sqrt(counts[i + r]) / f[i + r]
                    for j in range(m):
                        tile[r, j] = a[i + r, j] * scale
                else:
                    tile[r, :] = 0.0
            for j in range(m):
                t0, t1, t2, t3 = tile[0, j], tile[1, j], tile[2, j], tile[3, j]
                for k in range(j, m):
                    h[j, k] += t0 * tile[0, k] + t1 * tile[1, k] + t2 * tile[2, k] + t3 * tile[3, k]
    hess = np.zeros((m, m))
    for b in range(n_blocks):
        for j in range(m):
            for k in range(j, m):
                hess[j, k] += partial[b, j, k]
    for j in range(m):
        for k in range(j):
            hess[j, k] = hess[k, j]
    return hess


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _matvec(a, y):
    """a @ y for a (n, m) (Numba, for the reason given in :func:`_weighted_gram`)."""
    n, m = a.shape
    out = np.empty(n)
    for i in prange(n):
        v = 0.0
        for j in range(m):
            v += a[i, j] * y[j]
        out[i] = v
    return out


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _log_likelihood_along(f, u, alpha, counts, n_blocks):
    """sum_i c_i log(f_i + alpha (u_i - f_i)), or -inf when a term is not positive.

    The log-likelihood at x + alpha (y - x) from f = L x and u = L y (line search).
    """
    n = f.size
    partial = np.zeros(n_blocks)
    for b in prange(n_blocks):
        for i in range(b * n // n_blocks, (b + 1) * n // n_blocks):
            v = f[i] + alpha * (u[i] - f[i])
            if v > 0.0:
                partial[b] += counts[i] * np.log(v)
            else:
                partial[b] = -np.inf
    total = 0.0
    for b in range(n_blocks):
        total += partial[b]
    return total


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _vertex_slope(f, col, a, counts, n_blocks):
    """d/da sum_i c_i log((1 - a) f_i + a col_i) = sum_i c_i (col_i - f_i) / ((1 - a) f_i
    + a col_i): the slope of the log-likelihood along the move of a share a of the mass
    to one grid point (``col`` its column of L). -inf when a denominator is 0 with
    col_i < f_i (a = 1 and the point has no likelihood at row i)."""
    n = f.size
    partial = np.zeros(n_blocks)
    for b in prange(n_blocks):
        for i in range(b * n // n_blocks, (b + 1) * n // n_blocks):
            d = col[i] - f[i]
            v = f[i] + a * d
            if v > 0.0:
                partial[b] += counts[i] * d / v
            elif d < 0.0:
                partial[b] = -np.inf
    total = 0.0
    for b in range(n_blocks):
        total += partial[b]
    return total
