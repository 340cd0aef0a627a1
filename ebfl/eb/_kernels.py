"""Numba kernels for the empirical-Bayes estimators (private: no validation).

Each kernel has a plain-numpy twin in ``tests/naive.py`` that it must match to
1e-12. Global sums are computed by the caller with numpy (pairwise summation,
deterministic) and passed in, so results do not depend on the thread count.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH

# Codes for the leave-one-out variants of eq. (6) (see ``beta_binomial._LOO_VARIANTS``).
LOO_PRINTED = 0
LOO_PROOF = 1
LOO_CORRECTED = 2


@njit(cache=CACHE, fastmath=FASTMATH)
def _loo_client(xi, ni, m, total, ssq, corr_total, variant):
    """Eq. (6) for one client from the global sums: (mu_i, sigma_i^2, a_i, clipped, floored).

    xi, ni : the client's local mean and trials;  m : number of clients
    total : sum of x;  ssq : sum of (x - mean(x))**2
    corr_total : sum of x(1-x)/(n-1) (only read by LOO_CORRECTED)

    With y_i = x_i - mean(x), the leave-one-out sums are O(1) per client:
      sum_{l != i} (x_l - mu_i)^2       = ssq - y_i^2 m/(m-1)        (proof / intended)
      sum_{l != i} (x_l - mu_l)^2       = (m/(m-1))^2 (ssq - y_i^2)   (as printed: mu_l)
    """
    mu_i = (total - xi) / (m - 1.0)
    y = xi - total / m
    if variant == LOO_PRINTED:
        v = (m / (m - 1.0)) ** 2 * (ssq - y * y) / (m - 2.0)
    else:
        v = (ssq - y * y * m / (m - 1.0)) / (m - 2.0)
    if v < 0.0:  # rounding only: a sum of squares
        v = 0.0
    floored = False
    if variant == LOO_CORRECTED:
        v -= (corr_total - xi * (1.0 - xi) / (ni - 1.0)) / (m - 1.0)
        if v < 0.0:
            v = 0.0
            floored = True
    u = mu_i * (1.0 - mu_i)
    # a = n / (u/v - 1 + n) (printed, corrected) or n / (u/v + n) (proof),
    # multiplied through by v so that v = 0 gives a = 0 without dividing by 0.
    minus_one = 0.0 if variant == LOO_PROOF else 1.0
    den = u - minus_one * v + ni * v
    if v == 0.0:
        ai = 0.0
    elif den <= 0.0:
        ai = np.inf
    else:
        ai = ni * v / den
    clipped = False
    if ai < 0.0:
        ai = 0.0
        clipped = True
    elif ai > 1.0:
        ai = 1.0
        clipped = True
    return mu_i, v, ai, clipped, floored


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _loo_beta_shrinkage(x, n, z, variant, total, ssq, corr_total):
    """Leave-one-out moment shrinkage of eq. (6), spec C.6, for every client.

    Parameters (all validated by the caller)
    x : (m,) local means z/n;  n, z : (m,) trials and successes
    variant : LOO_PRINTED, LOO_PROOF or LOO_CORRECTED
    total, ssq, corr_total : global sums, see :func:`_loo_client`
    """
    m = x.size
    mu = np.empty(m)
    var = np.empty(m)
    a = np.empty(m)
    est = np.empty(m)
    post_var = np.empty(m)
    post_alpha = np.empty(m)
    post_beta = np.empty(m)
    clipped = np.zeros(m, np.bool_)
    floored = np.zeros(m, np.bool_)
    for i in prange(m):
        xi = x[i]
        ni = n[i]
        mu_i, v, ai, clipped[i], floored[i] = _loo_client(xi, ni, m, total, ssq, corr_total,
                                                          variant)
        e = ai * xi + (1.0 - ai) * mu_i
        mu[i] = mu_i
        var[i] = v
        a[i] = ai
        est[i] = e
        # Implied prior Beta(mu_i s, (1-mu_i) s) with s = n(1-a)/a; a = 0 is a point mass.
        post_var[i] = e * (1.0 - e) * ai / (ni + ai)
        if ai == 0.0:
            post_alpha[i] = np.inf
            post_beta[i] = np.inf
        else:
            s = ni * (1.0 - ai) / ai
            post_alpha[i] = mu_i * s + z[i]
            post_beta[i] = (1.0 - mu_i) * s + (ni - z[i])
    return mu, var, a, est, post_var, post_alpha, post_beta, clipped, floored


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _beta_posterior(z, n, alpha, beta):
    """Posterior Beta(alpha + z, beta + n - z): parameters, mean, variance, weight on z/n."""
    m = z.size
    post_alpha = np.empty(m)
    post_beta = np.empty(m)
    mean = np.empty(m)
    var = np.empty(m)
    weight = np.empty(m)
    for i in prange(m):
        pa = alpha + z[i]
        pb = beta + (n[i] - z[i])
        s = pa + pb
        post_alpha[i] = pa
        post_beta[i] = pb
        mean[i] = pa / s
        var[i] = pa * pb / (s * s * (s + 1.0))
        weight[i] = n[i] / (alpha + beta + n[i])
    return post_alpha, post_beta, mean, var, weight


@njit(cache=CACHE, fastmath=FASTMATH)
def _trials_successes_table(z, n, n_max):
    """Dense table ``T[n, z]`` = number of clients with those counts.

    The beta-binomial likelihood depends on a client only through (n, z), so
    the MLE iterates over the non-empty cells instead of over all m clients.
    Serial: one increment per client is memory-bound and a parallel version
    would need a table per thread.
    """
    table = np.zeros((n_max + 1, n_max + 1), np.int64)
    for i in range(z.size):
        table[n[i], z[i]] += 1
    return table


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _normal_posterior(x, s2, mu, tau2):
    """Posterior of theta_i ~ N(mu, tau2 I) given x_i ~ N(theta_i, s2_i I).

    x : (m, d); s2 : (m,); mu : (d,). Returns mean (m, d), per-coordinate
    variance (m,) and shrinkage weight a_i = tau2 / (tau2 + s2_i) on x_i.
    """
    m, d = x.shape
    mean = np.empty((m, d))
    var = np.empty(m)
    a = np.empty(m)
    for i in prange(m):
        ai = tau2 / (tau2 + s2[i])
        for k in range(d):
            mean[i, k] = mu[k] + ai * (x[i, k] - mu[k])
        a[i] = ai
        var[i] = ai * s2[i]
    return mean, var, a


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _discrete_posterior(x, s2, atoms, log_prob):
    """Posterior over k atoms of theta_i given x_i ~ N(theta_i, s2_i I_d) (Theorem 5, eq. (9)).

    x : (m, d); s2 : (m,); atoms : (k, d); log_prob : (k,) log prior weights
    (-inf allowed for empty atoms). Weights by log-sum-exp. Returns weights
    (m, k), posterior mean (m, d) and the posterior variance summed over
    coordinates, sum_l w_l |mu_l|^2 - |theta_hat|^2 computed as
    sum_l w_l |mu_l - theta_hat|^2 (no cancellation), shape (m,).
    """
    m, d = x.shape
    k = atoms.shape[0]
    weights = np.empty((m, k))
    mean = np.zeros((m, d))
    trace_var = np.empty(m)
    for i in prange(m):
        top = -np.inf
        for l in range(k):
            dist = 0.0
            for c in range(d):
                diff = x[i, c] - atoms[l, c]
                dist += diff * diff
            val = log_prob[l] - dist / (2.0 * s2[i])
            weights[i, l] = val
            if val > top:
                top = val
        total = 0.0
        for l in range(k):
            w = np.exp(weights[i, l] - top)
            weights[i, l] = w
            total += w
        for l in range(k):
            weights[i, l] /= total
            for c in range(d):
                mean[i, c] += weights[i, l] * atoms[l, c]
        v = 0.0
        for l in range(k):
            dist = 0.0
            for c in range(d):
                diff = atoms[l, c] - mean[i, c]
                dist += diff * diff
            v += weights[i, l] * dist
        trace_var[i] = v
    return weights, mean, trace_var


# --- NPMLE on a grid (ebfl.eb.npmle) -------------------------------------------------

_HALF_LOG_2PI = 0.5 * np.log(2.0 * np.pi)


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _normal_likelihood_matrix(x, s, grid):
    """Row-shifted normal likelihoods L_ik = exp(log phi_s_i(x_i - u_k) - c_i).

    x, s : (n,) observations and standard errors;  grid : (K,) support points.
    Returns L (n, K) with max_k L_ik = 1 and the shifts c (n,), so that
    log(sum_k w_k phi(...)) = c_i + log(sum_k w_k L_ik) without underflow.
    """
    n = x.size
    k = grid.size
    lik = np.empty((n, k))
    shift = np.empty(n)
    for i in prange(n):
        inv = 1.0 / s[i]
        top = -np.inf
        for j in range(k):
            z = (x[i] - grid[j]) * inv
            v = -0.5 * z * z
            lik[i, j] = v
            if v > top:
                top = v
        for j in range(k):
            lik[i, j] = np.exp(lik[i, j] - top)
        shift[i] = top - np.log(s[i]) - _HALF_LOG_2PI
    return lik, shift


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _mixture_gradient(lik, w, counts, n_blocks):
    """One pass over L: g_k = sum_i c_i L_ik / f_i and sum_i c_i log f_i, f = L w.

    Rows are split into ``n_blocks`` fixed blocks whose partial sums are added in
    block order, so the result does not depend on the number of threads. A row
    with f_i <= 0 (w puts no mass where the row's likelihood lives) makes the
    log-likelihood -inf; its gradient contribution is skipped.
    """
    n, k = lik.shape
    partial = np.zeros((n_blocks, k))
    partial_ll = np.zeros(n_blocks)
    for b in prange(n_blocks):
        start = b * n // n_blocks
        stop = (b + 1) * n // n_blocks
        for i in range(start, stop):
            f = 0.0
            for j in range(k):
                f += lik[i, j] * w[j]
            if f <= 0.0:
                partial_ll[b] = -np.inf
                continue
            scale = counts[i] / f
            for j in range(k):
                partial[b, j] += lik[i, j] * scale
            partial_ll[b] += counts[i] * np.log(f)
    grad = np.zeros(k)
    ll = 0.0
    for b in range(n_blocks):
        for j in range(k):
            grad[j] += partial[b, j]
        ll += partial_ll[b]
    return grad, ll


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _normal_grid_posterior(x, s, grid, log_w):
    """Posterior mean and variance of theta_i under the discrete prior (grid, w).

    Streams over rows without storing the n x K likelihood. log_w may hold -inf
    for empty grid points. Returns mean, var and the marginal log-likelihood of
    each observation, log sum_k w_k phi_s_i(x_i - u_k).
    """
    n = x.size
    k = grid.size
    mean = np.empty(n)
    var = np.empty(n)
    loglik = np.empty(n)
    for i in prange(n):
        inv = 1.0 / s[i]
        top = -np.inf
        for j in range(k):
            z = (x[i] - grid[j]) * inv
            v = log_w[j] - 0.5 * z * z
            if v > top:
                top = v
        total = 0.0
        first = 0.0
        for j in range(k):
            z = (x[i] - grid[j]) * inv
            p = np.exp(log_w[j] - 0.5 * z * z - top)
            total += p
            first += p * grid[j]
        mu = first / total
        second = 0.0
        for j in range(k):
            z = (x[i] - grid[j]) * inv
            p = np.exp(log_w[j] - 0.5 * z * z - top)
            second += p * (grid[j] - mu) ** 2
        mean[i] = mu
        var[i] = second / total
        loglik[i] = top + np.log(total) - np.log(s[i]) - _HALF_LOG_2PI
    return mean, var, loglik
