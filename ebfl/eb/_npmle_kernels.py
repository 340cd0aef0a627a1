"""Numba kernels of the grid NPMLE (``ebfl.eb.npmle``; private: no validation).

Each kernel has a plain-numpy twin in ``tests/naive.py`` that it must match to
1e-12. Sums over rows are accumulated in a fixed number of row blocks and the
block totals are added in block order, so results do not depend on the number
of threads; per-row outputs do not depend on the blocking at all.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH

_HALF_LOG_2PI = 0.5 * np.log(2.0 * np.pi)


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _normal_log_likelihood_matrix(x, s, grid, sorted_grid):
    """Row-shifted normal log-likelihoods log L_ik = log phi_s_i(x_i - u_k) - c_i.

    x, s : (n,) observations (or bin representatives) and standard errors;
    grid : (K,) support points, and ``sorted_grid`` the same sorted. Returns
    log L (n, K), whose row maxima are exactly 0, and the shifts c (n,), so that
    log(sum_k w_k phi(...)) = c_i + log(sum_k w_k L_ik) without underflow. The
    row maximum is found at the grid point nearest x_i (a binary search), which
    leaves a branch-free loop over the grid. The caller takes the exp in place:
    numpy's vectorized exp is several times faster than the scalar one Numba calls.
    """
    n = x.size
    k = grid.size
    log_lik = np.empty((n, k))
    shift = np.empty(n)
    for i in prange(n):
        inv = 1.0 / s[i]
        pos = np.searchsorted(sorted_grid, x[i])
        near = sorted_grid[min(pos, k - 1)]
        if pos > 0 and abs(x[i] - sorted_grid[pos - 1]) < abs(x[i] - near):
            near = sorted_grid[pos - 1]
        z = (x[i] - near) * inv
        top = -0.5 * z * z
        for j in range(k):
            z = (x[i] - grid[j]) * inv
            log_lik[i, j] = -0.5 * z * z - top
        shift[i] = top - np.log(s[i]) - _HALF_LOG_2PI
    return log_lik, shift


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _atom_log_joint(x, s, atoms, log_w, out):
    """out[i, j] = log w_j - (x_i - a_j)^2 / (2 s_i^2) - t_i, with t_i the maximum over
    j; returns t. The input of :func:`_atom_moments` once the caller has taken its
    exp in place (numpy's vectorized exp; see :func:`_normal_log_likelihood_matrix`)."""
    n = x.size
    m = atoms.size
    top = np.empty(n)
    for i in prange(n):
        inv = 1.0 / s[i]
        t = -np.inf
        for j in range(m):
            z = (x[i] - atoms[j]) * inv
            v = log_w[j] - 0.5 * z * z
            out[i, j] = v
            t = max(t, v)
        for j in range(m):
            out[i, j] -= t
        top[i] = t
    return top


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _atom_moments(p, atoms, top, mean, var, n_blocks):
    """Posterior mean and variance of theta_i from p[i, j] = w_j exp(-(x_i - a_j)^2 /
    (2 s_i^2) - t_i) (the exp of :func:`_atom_log_joint`), written into ``mean`` and
    ``var``; returns sum_i (t_i + log sum_j p_ij), the log-likelihood but for the
    normal constants -log(s_i sqrt(2 pi)) (added by the caller, vectorized)."""
    n, m = p.shape
    partial = np.zeros(n_blocks)
    for b in prange(n_blocks):
        for i in range(b * n // n_blocks, (b + 1) * n // n_blocks):
            total = 0.0
            first = 0.0
            for j in range(m):
                total += p[i, j]
                first += p[i, j] * atoms[j]
            mu = first / total
            second = 0.0
            for j in range(m):
                second += p[i, j] * (atoms[j] - mu) ** 2
            mean[i] = mu
            var[i] = second / total
            partial[b] += top[i] + np.log(total)
    loglik = 0.0
    for b in range(n_blocks):
        loglik += partial[b]
    return loglik


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _cell_index(x, s, scale, inv_widths, offsets, x_low):
    """Cell of each (x_i, s_i): class j = floor(J(s_i)) of s, with
    J(s) = scale[0] log s - scale[1] / s^2 + scale[2] (capped to the classes), then
    bin floor((x_i - x_low) / width_j) of x (capped at the class's last bin); the
    cells of class j are numbered from offsets[j]."""
    n = x.size
    n_classes = inv_widths.size
    cell = np.empty(n, np.int64)
    for i in prange(n):
        j = 0
        if n_classes > 1:
            level = scale[0] * np.log(s[i]) - scale[1] / (s[i] * s[i]) + scale[2]
            j = min(max(np.int64(level), 0), n_classes - 1)
        last = offsets[j + 1] - offsets[j] - 1
        cell[i] = offsets[j] + min(max(np.int64((x[i] - x_low) * inv_widths[j]), 0), last)
    return cell


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _log_ratio_bound(u, c, xi, t, tr, log_ratio, eps):
    """|rho(u)| plus a bound on its rounding error, where
    rho(u) = log(s'/s) + ((c - u)^2 (t' - t) + t (c - x)(c + x - 2u)) / 2."""
    quad = (c - u) * (c - u)
    lin = t * (c - xi) * (c + xi - 2.0 * u)
    value = abs(log_ratio + 0.5 * (quad * (tr - t) + lin))
    # rounding of each term, the difference t' - t included
    return value + eps * (abs(log_ratio) + 0.5 * (quad * (t + tr) + abs(lin)))


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _binning_error(x, s, row, rep_x, rep_s, low, high, n_blocks):
    """Per-observation bound r_i >= max_{u in [low, high]} |rho_i(u)|: its sum and max.

    rho_i(u) = log phi_{s_i}(x_i - u) - log phi_{s'}(c - u) with (c, s') =
    (rep_x[row[i]], rep_s[row[i]]), the row that replaces observation i. It is
    a quadratic in u, so its extreme values lie at ``low``, ``high`` or its
    vertex; it is evaluated there in the cancellation-free form
    log(s'/s) + ((c - u)^2 (t' - t) + t (c - x)(c + x - 2u)) / 2, t = 1/s^2,
    and enlarged by 8 ulps of its terms to cover rounding. Returns (sum, max).
    """
    n = x.size
    rep_t = 1.0 / (rep_s * rep_s)
    rep_log = np.log(rep_s)
    partial = np.zeros(n_blocks)
    partial_max = np.zeros(n_blocks)
    eps = 8.0 * np.finfo(np.float64).eps
    for b in prange(n_blocks):
        for i in range(b * n // n_blocks, (b + 1) * n // n_blocks):
            r = row[i]
            c = rep_x[r]
            tr = rep_t[r]
            t = 1.0 / (s[i] * s[i])
            log_ratio = rep_log[r] - np.log(s[i])
            worst = max(_log_ratio_bound(low, c, x[i], t, tr, log_ratio, eps),
                        _log_ratio_bound(high, c, x[i], t, tr, log_ratio, eps))
            if tr != t:
                # vertex of ((c - u)^2 (t' - t) - 2 t (c - x) u) / 2: u* = c + t (c - x) / (t' - t)
                u = c + t * (c - x[i]) / (tr - t)
                if low < u < high:
                    worst = max(worst, _log_ratio_bound(u, c, x[i], t, tr, log_ratio, eps))
            partial[b] += worst
            partial_max[b] = max(partial_max[b], worst)
    total = 0.0
    top = 0.0
    for b in range(n_blocks):
        total += partial[b]
        top = max(top, partial_max[b])
    return total, top


@njit(cache=CACHE, fastmath=FASTMATH)
def _dense_cell_rows(cell, x, s, counts, n_cells):
    """Rows of the occupied cells: count-weighted means of x and s and the total count,
    numbered in cell order; ``cell`` is overwritten with each observation's row.

    One serial pass (the sums are then in observation order, whatever the number
    of threads) and a table of n_cells entries.
    """
    weight = np.zeros(n_cells)
    sum_x = np.zeros(n_cells)
    sum_s = np.zeros(n_cells)
    for i in range(cell.size):
        c = cell[i]
        weight[c] += counts[i]
        sum_x[c] += counts[i] * x[i]
        sum_s[c] += counts[i] * s[i]
    row_of_cell = np.empty(n_cells, np.int64)
    n_rows = 0
    for c in range(n_cells):
        row_of_cell[c] = n_rows
        if weight[c] > 0.0:
            n_rows += 1
    mean_x = np.empty(n_rows)
    mean_s = np.empty(n_rows)
    total = np.empty(n_rows)
    for c in range(n_cells):
        if weight[c] > 0.0:
            r = row_of_cell[c]
            total[r] = weight[c]
            mean_x[r] = sum_x[c] / weight[c]
            mean_s[r] = sum_s[c] / weight[c]
    for i in range(cell.size):
        cell[i] = row_of_cell[cell[i]]
    return mean_x, mean_s, total


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _farthest_from_grid(x, s, sorted_grid, inside_ok, n_blocks):
    """max_i min_k |x_i - u_k| / s_i (distance to the nearest grid point in standard
    errors) and the first i attaining it.

    With ``inside_ok`` (the caller has shown that no x_i within the grid's range
    can matter: half the largest gap over the smallest s is small), only the
    observations outside [u_1, u_K] are measured, without a search.
    """
    n = x.size
    k = sorted_grid.size
    low = sorted_grid[0]
    high = sorted_grid[k - 1]
    best = np.full(n_blocks, -1.0)
    where = np.zeros(n_blocks, np.int64)
    for b in prange(n_blocks):
        for i in range(b * n // n_blocks, (b + 1) * n // n_blocks):
            if x[i] < low:
                d = low - x[i]
            elif x[i] > high:
                d = x[i] - high
            elif inside_ok:
                d = 0.0
            else:
                pos = np.searchsorted(sorted_grid, x[i])
                d = abs(x[i] - sorted_grid[max(pos - 1, 0)])
                d = min(d, abs(x[i] - sorted_grid[min(pos, k - 1)]))
            reach = d / s[i]
            if reach > best[b]:
                best[b] = reach
                where[b] = i
    top = -1.0
    first = 0
    for b in range(n_blocks):
        if best[b] > top:
            top = best[b]
            first = where[b]
    return top, first

