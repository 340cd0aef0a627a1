"""Numba kernels for the empirical-Bayes estimators (private: no validation).

Each kernel has a plain-numpy twin in ``tests/naive.py`` that it must match to
1e-12. Global sums are computed by the caller with numpy (pairwise summation,
deterministic) and passed in, so results do not depend on the thread count.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH

# The leave-one-out client of eq. (6) lives in the shared kernels: the Monte Carlo
# checks of Theorem 3 call it too.
from ebfl._kernels import loo_beta_client


def _outputs(m, k):
    """``k`` empty float64 arrays of ``m`` for a kernel to fill.

    Allocated by numpy rather than inside the kernel: numpy asks Linux for huge
    pages for large arrays, and first-touching 10^7-client outputs was then ~25%
    faster than with Numba's own allocations (measured).
    """
    return tuple(np.empty(m) for _ in range(k))


def _loo_beta_shrinkage(z, n, variant, total, ssq, corr_total):
    """Leave-one-out moment shrinkage of eq. (6) for every client.

    Parameters (all validated by the caller)
    z, n : (m,) successes and trials (the local means are x = z/n)
    variant : LOO_PRINTED, LOO_PROOF or LOO_CORRECTED
    total, ssq, corr_total : global sums, see :func:`loo_beta_client`

    Returns mu, var, a, est, concentration (m,) and the numbers of clipped
    weights and floored variances. (The fit calls :func:`_loo_fill` on the
    distinct (n, z) pairs instead, and copies the results to the clients.)
    """
    out = _outputs(z.size, 5)
    clipped, floored = _loo_fill(z, n, z.size, variant, total, ssq, corr_total, *out)
    return (*out, int(clipped.sum()), int(floored.sum()))


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _loo_fill(z, n, m, variant, total, ssq, corr_total, mu, var, a, est, concentration):
    """Eq. (6) for the items (z_k, n_k) (clients, or distinct pairs) of a fit of ``m``
    clients; fills the five outputs, returns the clipped and floored flags (as 0/1)."""
    clipped = np.empty(z.size)
    floored = np.empty(z.size)
    for i in prange(z.size):
        ni = n[i]
        xi = z[i] / ni
        mu_i, v, ai, clip, floor = loo_beta_client(xi, ni, m, total, ssq, corr_total, variant)
        e = ai * xi + (1.0 - ai) * mu_i
        mu[i] = mu_i
        var[i] = v
        a[i] = ai
        est[i] = e
        clipped[i] = clip
        floored[i] = floor
        # Implied prior Beta(mu_i s, (1-mu_i) s) with s = n(1-a)/a: the posterior's
        # concentration is s + n = n/a, its mean est; a = 0 is a point mass (inf).
        concentration[i] = np.inf if ai == 0.0 else ni / ai
    return clipped, floored


def _pairs_to_clients(z, n, index, per_pair):
    """Rows of ``per_pair`` (k, n_pairs) copied to the clients: (k,) arrays of (m,).

    ``index`` is a dense table ``T[n, z]`` of pair numbers, or the (m,) pair
    number of every client (see ``beta_binomial._compress``).
    """
    out = _outputs(z.size, per_pair.shape[0])
    if index.ndim == 2:
        _gather_by_table(z, n, index, per_pair, out)
    else:
        for row, dest in zip(per_pair, out, strict=True):
            np.take(row, index, out=dest)
    return out


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _gather_by_table(z, n, table, per_pair, out):
    for i in prange(z.size):
        k = table[n[i], z[i]]
        for j in range(len(out)):
            out[j][i] = per_pair[j, k]


def _beta_posterior(z, n, alpha, beta):
    """Posterior Beta(alpha + z, beta + n - z): mean, concentration, and the weight on z/n."""
    out = _outputs(z.size, 3)
    _beta_posterior_fill(z, n, alpha, beta, *out)
    return out


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _beta_posterior_fill(z, n, alpha, beta, mean, concentration, weight):
    for i in prange(z.size):
        c = alpha + beta + n[i]
        mean[i] = (alpha + z[i]) / c
        concentration[i] = c
        weight[i] = n[i] / c


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _trials_successes_table(z, n, n_max, n_chunks):
    """Dense table ``T[n, z]`` = number of clients with those counts.

    The beta-binomial likelihood depends on a client only through (n, z), so
    the MLE iterates over the non-empty cells instead of over all m clients.
    ``n_chunks`` blocks of clients fill a table each, in parallel; the integer
    tables are then added (exact, so independent of the chunking).
    """
    m = z.size
    tables = np.zeros((n_chunks, n_max + 1, n_max + 1), np.int64)
    for c in prange(n_chunks):
        table = tables[c]
        for i in range(c * m // n_chunks, (c + 1) * m // n_chunks):
            table[n[i], z[i]] += 1
    out = tables[0].copy()
    for c in range(1, n_chunks):
        out += tables[c]
    return out


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _pair_checks(z, n, n_chunks):
    """One pass over counts: the largest n, and the clients with n = 0 or z > n.

    Returns (n_max, n_empty, first_empty, n_exceed, first_exceed); a ``first``
    is -1 when there is none. Per-chunk results, combined in chunk order.
    """
    m = z.size
    stats = np.zeros((n_chunks, 5), np.int64)
    for c in prange(n_chunks):
        n_max = 0
        n_empty = 0
        n_exceed = 0
        first_empty = -1
        first_exceed = -1
        for i in range(c * m // n_chunks, (c + 1) * m // n_chunks):
            ni = n[i]
            n_max = max(n_max, ni)
            if ni == 0:
                if n_empty == 0:
                    first_empty = i
                n_empty += 1
            if z[i] > ni:
                if n_exceed == 0:
                    first_exceed = i
                n_exceed += 1
        stats[c, 0] = n_max
        stats[c, 1] = n_empty
        stats[c, 2] = first_empty
        stats[c, 3] = n_exceed
        stats[c, 4] = first_exceed
    n_max = 0
    n_empty = 0
    n_exceed = 0
    first_empty = -1
    first_exceed = -1
    for c in range(n_chunks):
        n_max = max(n_max, stats[c, 0])
        if first_empty < 0 and stats[c, 1] > 0:
            first_empty = stats[c, 2]
        if first_exceed < 0 and stats[c, 3] > 0:
            first_exceed = stats[c, 4]
        n_empty += stats[c, 1]
        n_exceed += stats[c, 3]
    return n_max, n_empty, first_empty, n_exceed, first_exceed


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


# --- Gaussian profile likelihood (ebfl.eb.gaussian) ------------------------------------

_LOG_2PI = np.log(2.0 * np.pi)

#: Client groups per block in :func:`_normal_profile`: a block (a few tens of KiB) stays in
#: cache while it is evaluated at every t, and blocks are the unit of parallel work.
PROFILE_BLOCK = 1024
#: Fewest (t, group) pairs evaluated on threads (about 10 ms of serial work). Below it the
#: serial kernel runs, which never starts Numba's thread pool: a parallel launch can cost
#: more than it saves when other threads hold the cores (a BLAS pool spinning after a
#: numpy call, as in the mixture's EM loop).
PROFILE_PARALLEL_MIN = 1 << 21
#: sum n log v as logarithms of products (see :func:`_profile_term_sums`): a product
#: kept in (1e-200, 1e200) times a factor in (1e-100, 1e100) never over- or underflows.
_PRODUCT_FACTOR_MAX = 1e100
_PRODUCT_MAX = 1e200


# The helpers of _normal_profile are inlined into its kernels (a call per block and t
# costs about 5%).


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _profile_mean_sums(t, count, s2, xm, s2_min, lo, hi, out):
    """out[j] = (sum n a, sum n a xm_1, ..., sum n a xm_d) over groups lo:hi at t_j."""
    d = xm.shape[1]
    for j in range(t.size):
        tj = t[j]
        c = tj + s2_min
        s_na = 0.0
        s_x = 0.0  # d = 1: a scalar accumulator, not a chain through memory
        for g in range(lo, hi):
            na = count[g] * (c / (tj + s2[g]))
            s_na += na
            if d == 1:
                s_x += na * xm[g, 0]
            else:
                for k in range(d):
                    out[j, k + 1] += na * xm[g, k]
        out[j, 0] = s_na
        if d == 1:
            out[j, 1] = s_x


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _profile_term_sums(t, count, s2, xm, ss, s2_min, mu, with_values, lo, hi, out):
    """out[j] = (sum n a, sum n log v, sum q, sum q a, sum n a^2) over groups lo:hi at t_j.

    If the block's weights are all 1 and its v all lie in (1e-100, 1e100), sum log v is
    the logarithm of the running product of the v, flushed whenever it leaves
    (1e-200, 1e200): one logarithm per hundreds of groups instead of one per group.
    Without ``with_values`` the logarithms are skipped (out[j, 1] = 0).
    """
    d = xm.shape[1]
    unit = with_values
    s2_lo = np.inf
    s2_hi = 0.0
    if with_values:
        for g in range(lo, hi):
            if count[g] != 1.0:
                unit = False
            s2_lo = min(s2_lo, s2[g])
            s2_hi = max(s2_hi, s2[g])
    for j in range(t.size):
        tj = t[j]
        c = tj + s2_min
        mu0 = mu[j, 0]
        multiply = (unit and tj + s2_lo > 1.0 / _PRODUCT_FACTOR_MAX
                    and tj + s2_hi < _PRODUCT_FACTOR_MAX)
        s_na = 0.0
        s_log = 0.0
        s_q = 0.0
        s_qa = 0.0
        s_naa = 0.0
        product = 1.0
        for g in range(lo, hi):
            v = tj + s2[g]
            a = c / v
            n = count[g]
            if d == 1:
                diff = xm[g, 0] - mu0
                dist2 = diff * diff
            else:
                dist2 = 0.0
                for k in range(d):
                    diff = xm[g, k] - mu[j, k]
                    dist2 += diff * diff
            q = (ss[g] + n * dist2) / v
            na = n * a
            s_na += na
            s_q += q
            s_qa += q * a
            s_naa += na * a
            if multiply:
                product *= v
                if not 1.0 / _PRODUCT_MAX < product < _PRODUCT_MAX:
                    s_log += np.log(product)
                    product = 1.0
            elif with_values:
                s_log += n * np.log(v)
        if multiply:
            s_log += np.log(product)
        out[j, 0] = s_na
        out[j, 1] = s_log
        out[j, 2] = s_q
        out[j, 3] = s_qa
        out[j, 4] = s_naa


def _normal_profile(t, count, s2, xm, ss, s2_min, total, mean, known_mean, restricted,
                    with_values):
    """Profile log-likelihood of tau^2 at each t_j and its slope scaled by c_j = t_j + s2_min.

    Groups g of clients with equal s_i^2 (``gaussian._VarianceGroups``): weight count_g,
    variance s2_g (any order), weighted mean xm_g (G, d), within-group sum of squares
    ss_g; s2_min = min s2, total = sum count (a numpy sum, passed in). ``mean`` (d,) is
    the known mu, read only when ``known_mean``. With v = t_j + s2_g and
    a = c_j / v in (0, 1] (so that nothing overflows for s2 ~ 1e-300):

        mu     = sum n a xm / sum n a                     (unless known)
        q_g    = (ss_g + n_g |xm_g - mu|^2) / v
        value  = -1/2 [d (sum n log v + total log 2 pi) + sum q]
        slope  = 1/2 [sum q a - d sum n a]               (= c_j l'(t_j))

    ``restricted`` adds d/2 [log 2 pi + log total - log(sum n a) + log c_j] to the value
    and d/2 sum n a^2 / sum n a to the slope. ``with_values=False`` skips the logarithms
    (values are NaN). Two passes per t (mu first, then q: no cancellation). Each block of
    PROFILE_BLOCK groups is evaluated at every t while in cache, on threads
    (:func:`_normal_profile_threads`) when there are PROFILE_PARALLEL_MIN (t, group) pairs
    or more, else by :func:`_normal_profile_serial`, which never starts Numba's thread
    pool; the blocks' partial sums are added in block order, so both give the same bits
    on any number of threads.
    """
    n_blocks = (s2.size + PROFILE_BLOCK - 1) // PROFILE_BLOCK
    threads = n_blocks > 1 and s2.size * t.size >= PROFILE_PARALLEL_MIN
    kernel = _normal_profile_threads if threads else _normal_profile_serial
    return kernel(t, count, s2, xm, ss, s2_min, total, mean, known_mean, restricted,
                  with_values)


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _profile_known_mean(n_t, mean):
    """mu (n_t, d): the known mean at every t."""
    d = mean.size
    mu = np.empty((n_t, d))
    for j in range(n_t):
        for k in range(d):
            mu[j, k] = mean[k]
    return mu


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _profile_means(part1):
    """mu (n_t, d) from the blocks' (sum n a, sum n a xm), added in block order."""
    n_blocks, n_t, d1 = part1.shape
    mu = np.empty((n_t, d1 - 1))
    for j in range(n_t):
        na_sum = 0.0
        for b in range(n_blocks):
            na_sum += part1[b, j, 0]
        for k in range(d1 - 1):
            s_x = 0.0
            for b in range(n_blocks):
                s_x += part1[b, j, k + 1]
            mu[j, k] = s_x / na_sum
    return mu


@njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def _profile_finish(part2, t, s2_min, total, d, restricted, with_values):
    """Values and scaled slopes from the blocks' term sums, added in block order."""
    n_blocks, n_t, _ = part2.shape
    values = np.empty(n_t)
    slopes = np.empty(n_t)
    for j in range(n_t):
        sums = np.zeros(5)
        for b in range(n_blocks):
            for r in range(5):
                sums[r] += part2[b, j, r]
        na_sum = sums[0]
        values[j] = -0.5 * (d * (sums[1] + _LOG_2PI * total) + sums[2])
        slopes[j] = 0.5 * (sums[3] - d * na_sum)
        if restricted:
            log_w = np.log(na_sum) - np.log(t[j] + s2_min)
            values[j] += 0.5 * d * (_LOG_2PI + np.log(total) - log_w)
            slopes[j] += 0.5 * d * sums[4] / na_sum
        if not with_values:
            values[j] = np.nan
    return values, slopes


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _normal_profile_threads(t, count, s2, xm, ss, s2_min, total, mean, known_mean, restricted,
                            with_values):
    """:func:`_normal_profile` with one block of groups per task."""
    n_g = s2.size
    n_blocks = (n_g + PROFILE_BLOCK - 1) // PROFILE_BLOCK
    if known_mean:
        mu = _profile_known_mean(t.size, mean)
    else:
        part1 = np.zeros((n_blocks, t.size, xm.shape[1] + 1))
        for b in prange(n_blocks):
            lo = b * PROFILE_BLOCK
            _profile_mean_sums(t, count, s2, xm, s2_min, lo, min(lo + PROFILE_BLOCK, n_g),
                               part1[b])
        mu = _profile_means(part1)
    part2 = np.zeros((n_blocks, t.size, 5))
    for b in prange(n_blocks):
        lo = b * PROFILE_BLOCK
        _profile_term_sums(t, count, s2, xm, ss, s2_min, mu, with_values, lo,
                           min(lo + PROFILE_BLOCK, n_g), part2[b])
    return _profile_finish(part2, t, s2_min, total, xm.shape[1], restricted, with_values)


@njit(cache=CACHE, fastmath=FASTMATH)
def _normal_profile_serial(t, count, s2, xm, ss, s2_min, total, mean, known_mean, restricted,
                           with_values):
    """:func:`_normal_profile` on the calling thread (the same blocks, the same bits)."""
    n_g = s2.size
    n_blocks = (n_g + PROFILE_BLOCK - 1) // PROFILE_BLOCK
    if known_mean:
        mu = _profile_known_mean(t.size, mean)
    else:
        part1 = np.zeros((n_blocks, t.size, xm.shape[1] + 1))
        for b in range(n_blocks):
            lo = b * PROFILE_BLOCK
            _profile_mean_sums(t, count, s2, xm, s2_min, lo, min(lo + PROFILE_BLOCK, n_g),
                               part1[b])
        mu = _profile_means(part1)
    part2 = np.zeros((n_blocks, t.size, 5))
    for b in range(n_blocks):
        lo = b * PROFILE_BLOCK
        _profile_term_sums(t, count, s2, xm, ss, s2_min, mu, with_values, lo,
                           min(lo + PROFILE_BLOCK, n_g), part2[b])
    return _profile_finish(part2, t, s2_min, total, xm.shape[1], restricted, with_values)
