"""Slow, obviously correct twins of the Numba kernels (plain numpy, loops where clearer).

Each function follows the paper's formula literally, so that the fast kernels,
which use O(1)-per-client algebra, are checked against an independent route.
"""

import numpy as np


def naive_bernoulli_counts(values, offsets):
    m = offsets.size - 1
    ones = np.array([np.sum(values[offsets[i]:offsets[i + 1]] == 1) for i in range(m)])
    ok = np.isin(values, [0, 1])
    invalid = np.array([np.sum(~ok[offsets[i]:offsets[i + 1]]) for i in range(m)])
    return ones, invalid


def naive_client_mean_ssd(values, offsets):
    m = offsets.size - 1
    mean = np.array([values[offsets[i]:offsets[i + 1]].mean(axis=0) for i in range(m)])
    ssd = np.array([np.sum((values[offsets[i]:offsets[i + 1]] - mean[i]) ** 2)
                    for i in range(m)])
    return mean, ssd


def naive_loo_beta(x, n, z, variant):
    """Eq. (6) and its variants, one client at a time, every sum recomputed (O(m^2)).

    variant: "loo_printed" (sigma_i^2 centred on mu_l, "-1"), "loo_proof" (centred on
    mu_i, no "-1"), "loo_corrected" (centred on mu_i, minus binomial noise, "-1").
    """
    m = x.size
    loo_mean = np.array([np.mean(np.delete(x, l)) for l in range(m)])
    out = {k: np.empty(m) for k in ("mu", "var", "a", "est", "post_var", "alpha", "beta")}
    clipped = np.zeros(m, bool)
    for i in range(m):
        others = np.arange(m) != i
        mu_i = np.mean(x[others])
        if variant == "loo_printed":
            v = np.sum((x[others] - loo_mean[others]) ** 2) / (m - 2)
        else:
            v = np.sum((x[others] - mu_i) ** 2) / (m - 2)
        if variant == "loo_corrected":
            v = max(v - np.mean(x[others] * (1 - x[others]) / (n[others] - 1)), 0.0)
        u = mu_i * (1 - mu_i)
        if v == 0:
            a = 0.0
        elif variant == "loo_proof":
            a = n[i] / (u / v + n[i])
        else:
            a = n[i] / (u / v - 1 + n[i])
        if not 0 <= a <= 1:
            clipped[i] = True
            a = min(max(a, 0.0), 1.0)
        est = a * x[i] + (1 - a) * mu_i
        s = n[i] * (1 - a) / a if a > 0 else np.inf
        alpha = mu_i * s + z[i] if a > 0 else np.inf
        beta = (1 - mu_i) * s + n[i] - z[i] if a > 0 else np.inf
        post_var = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1)) if a > 0 else 0.0
        for key, val in zip(out, (mu_i, v, a, est, post_var, alpha, beta), strict=True):
            out[key][i] = val
    out["clipped"] = clipped
    return out


def naive_beta_posterior(z, n, alpha, beta):
    pa = alpha + z
    pb = beta + n - z
    mean = pa / (pa + pb)
    var = pa * pb / ((pa + pb) ** 2 * (pa + pb + 1))
    return pa, pb, mean, var, n / (alpha + beta + n)


def naive_trials_successes_table(z, n, n_max):
    table = np.zeros((n_max + 1, n_max + 1), np.int64)
    np.add.at(table, (n, z), 1)
    return table


def naive_normal_posterior(x, s2, mu, tau2):
    """Posterior via precisions: mean = (x/s2 + mu/tau2) / (1/s2 + 1/tau2)."""
    if tau2 == 0:
        return np.broadcast_to(mu, x.shape).copy(), np.zeros_like(s2), np.zeros_like(s2)
    prec = 1 / s2 + 1 / tau2
    mean = (x / s2[:, None] + mu / tau2) / prec[:, None]
    return mean, 1 / prec, (1 / s2) / prec


def naive_discrete_posterior(x, s2, atoms, log_prob):
    """Theorem 5 from the raw formula: p_l exp(-|x - mu_l|^2 / (2 s^2)), normalized (scipy)."""
    from scipy.special import logsumexp

    dist = ((x[:, None, :] - atoms[None, :, :]) ** 2).sum(axis=2)
    logw = log_prob[None, :] - dist / (2 * s2[:, None])
    w = np.exp(logw - logsumexp(logw, axis=1, keepdims=True))
    mean = w @ atoms
    second = w @ (atoms**2).sum(axis=1)
    return w, mean, second - (mean**2).sum(axis=1)


def naive_normal_likelihood_matrix(x, s, grid):
    """Normal densities phi_s(x - u), then each row divided by its largest entry."""
    log_lik = (-0.5 * ((x[:, None] - grid[None, :]) / s[:, None]) ** 2
               - np.log(s)[:, None] - 0.5 * np.log(2 * np.pi))
    shift = log_lik.max(axis=1)
    return np.exp(log_lik - shift[:, None]), shift


def naive_normal_grid_posterior(x, s, grid, w):
    """Posterior over the grid by Bayes' rule with scipy's normal density."""
    from scipy import special, stats

    log_joint = np.log(w)[None, :] + stats.norm.logpdf(x[:, None], grid[None, :], s[:, None])
    loglik = special.logsumexp(log_joint, axis=1)
    post = np.exp(log_joint - loglik[:, None])
    mean = post @ grid
    var = np.sum(post * (grid[None, :] - mean[:, None]) ** 2, axis=1)
    return mean, var, loglik


def naive_npmle_em(lik, counts, shift, *, n_iter=None, target=None, max_iter=10**6):
    """Plain EM for the grid NPMLE (Laird 1978): w <- w * (L^T (c / L w)) / N.

    Runs ``n_iter`` iterations, or until the log-likelihood reaches ``target``.
    Returns weights, log-likelihood and the number of iterations.
    """
    total = counts.sum()
    w = np.full(lik.shape[1], 1.0 / lik.shape[1])
    const = float(counts @ shift)
    for it in range(max_iter):
        f = lik @ w
        ll = const + float(counts @ np.log(f))
        if (n_iter is not None and it >= n_iter) or (target is not None and ll >= target):
            return w, ll, it
        w = w * (lik.T @ (counts / f)) / total
    return w, ll, max_iter


def naive_linear_gd_clients(X, Y, mask, theta, active, mu, st, sx, lr, local_steps):
    """Algorithm 2's client steps with numpy einsum over the stacked clients."""
    X, Y, mask = X[active], Y[active], mask[active]
    th0 = theta[active]
    r0 = (Y - np.einsum("mnd,md->mn", X, th0)) * mask
    th = th0
    for step in range(local_steps):
        r = r0 if step == 0 else (Y - np.einsum("mnd,md->mn", X, th)) * mask
        th = th + lr * (np.einsum("mnd,mn->md", X, r) / sx + (mu - th) / st)
    return th, np.sum(r0**2, axis=1), np.sum((mu - th0) ** 2, axis=1), mask.sum(axis=1)


def naive_beta_binomial_loglik(z, n, alpha, beta):
    """Beta-binomial log-likelihood from the product form of the pmf, client by client
    (clients with equal (n, z) computed once and multiplied by their number).

    P(z | n) = C(n, z) prod_{j<z} (alpha + j) prod_{j<n-z} (beta + j)
               / prod_{j<n} (alpha + beta + j).
    ``alpha`` and ``beta`` may be arrays (broadcast together): one log-likelihood each.
    """
    from math import lgamma

    alpha, beta = np.broadcast_arrays(np.asarray(alpha, float), np.asarray(beta, float))
    total = np.zeros(alpha.shape)
    z, n = np.asarray(z, np.int64), np.asarray(n, np.int64)
    base = int(n.max()) + 1
    keys, counts = np.unique(n * base + z, return_counts=True)
    for key, c in zip(keys.tolist(), counts.tolist(), strict=True):
        ni, zi = divmod(key, base)
        log_binom = lgamma(ni + 1) - lgamma(zi + 1) - lgamma(ni - zi + 1)
        ll = (np.log(alpha[..., None] + np.arange(zi)).sum(axis=-1)
              + np.log(beta[..., None] + np.arange(ni - zi)).sum(axis=-1)
              - np.log((alpha + beta)[..., None] + np.arange(ni)).sum(axis=-1))
        total += c * (ll + log_binom)
    return total


def naive_normal_profile_loglik(tau2, x, s, *, mean=None, restricted=False):
    """Log-likelihood of x_i ~ N(mu, (tau2 + s_i^2) I_d) at each tau2 (1-D array), literally.

    mu is the known ``mean`` or, for every tau2, the precision-weighted mean (its MLE).
    ``restricted``: metafor's REML log-likelihood summed over coordinates,
    -1/2 [(m-1) log 2 pi - log m + sum log v_i + log sum 1/v_i + sum (x_ij - mu_j)^2 / v_i].
    """
    x2 = x if x.ndim == 2 else x[:, None]
    m, d = x2.shape
    v = np.atleast_1d(tau2)[:, None] + s[None, :] ** 2  # (grid, m)
    w = 1.0 / v
    mu = (w @ x2) / w.sum(axis=1, keepdims=True) if mean is None else np.broadcast_to(mean, (1, d))
    quad = np.sum((x2[None, :, :] - mu[:, None, :]) ** 2, axis=2) / v
    if restricted:
        per_coord = ((m - 1) * np.log(2 * np.pi) - np.log(m) + np.sum(np.log(v), axis=1)
                     + np.log(w.sum(axis=1)))
        return -0.5 * (d * per_coord + quad.sum(axis=1))
    return -0.5 * np.sum(d * np.log(2 * np.pi * v) + quad, axis=1)


def naive_normal_profile_max(x, s, *, mean=None, restricted=False, per_decade=100):
    """Brute-force maximum over tau2 >= 0: a dense log grid, then bounded Brent around its best.

    The grid runs from 1e-8 min s^2 to 100 (squared range of x + max s^2), with tau2 = 0
    added. Returns (tau2, log-likelihood).
    """
    from scipy import optimize

    x2 = x if x.ndim == 2 else x[:, None]
    span = float(np.sum(np.ptp(x2, axis=0) ** 2)) + float(np.max(s) ** 2)
    if mean is not None:
        span += float(np.max(np.sum((x2 - mean) ** 2, axis=1)))
    lo, hi = 1e-8 * float(np.min(s)) ** 2, 100.0 * span
    grid = np.r_[0.0, np.geomspace(lo, hi, int(per_decade * np.log10(hi / lo)) + 2)]
    values = naive_normal_profile_loglik(grid, x, s, mean=mean, restricted=restricted)
    j = int(np.argmax(values))
    best_t, best = float(grid[j]), float(values[j])
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    opt = optimize.minimize_scalar(
        lambda t: -naive_normal_profile_loglik(t, x, s, mean=mean, restricted=restricted)[0],
        bounds=(a, b), method="bounded", options={"xatol": 1e-13 * b})
    if -opt.fun > best:
        best_t, best = float(opt.x), float(-opt.fun)
    return best_t, best


def naive_normal_profile(t, count, s2, xm, ss, *, mean=None, restricted=False):
    """Twin of ``_kernels._normal_profile`` in plain numpy, (T, G) arrays at once.

    Groups g: weight count_g, variance s2_g, mean xm_g (G, d), within sum of squares
    ss_g. Returns the profile log-likelihood at each t, its slope times
    c = t + min s2, and for each the sum of the absolute values of its terms (the scale
    of their rounding errors: both may cancel to near 0).
    """
    n, d = count, xm.shape[1]
    log_2pi = np.log(2 * np.pi)
    t = np.asarray(t, dtype=np.float64)
    c = t[:, None] + s2.min()
    v = t[:, None] + s2[None, :]
    a = c / v
    na = n * a
    na_sum = na.sum(axis=1)
    mu = (na @ xm) / na_sum[:, None] if mean is None else np.broadcast_to(mean, (t.size, d))
    dist2 = np.sum((xm[None, :, :] - mu[:, None, :]) ** 2, axis=2)
    q = (ss + n * dist2) / v
    values = -0.5 * (d * (np.log(v) @ n + log_2pi * n.sum()) + q.sum(axis=1))
    value_scale = 0.5 * (d * (np.abs(np.log(v)) @ n + log_2pi * n.sum()) + q.sum(axis=1))
    slopes = 0.5 * (np.sum(q * a, axis=1) - d * na_sum)
    slope_scale = 0.5 * (np.sum(q * a, axis=1) + d * na_sum)
    if restricted:
        logs = (np.log(n.sum()), np.log(na_sum), np.log(c[:, 0]))
        values += 0.5 * d * (log_2pi + logs[0] - logs[1] + logs[2])
        value_scale += 0.5 * d * (log_2pi + sum(np.abs(term) for term in logs))
        slopes += 0.5 * d * np.sum(na * a, axis=1) / na_sum
        slope_scale += 0.5 * d * np.sum(na * a, axis=1) / na_sum
    return values, slopes, value_scale, slope_scale


# --- grid NPMLE (ebfl.eb._npmle_kernels) ----------------------------------------------

def naive_sparse_mixture_gradient(lik, w, support, counts):
    """f = L[:, S] w[S] on the support S, then g = L' (c / f) over every column and
    c' log f; rows with f = 0 give -inf and no gradient."""
    f = lik[:, support] @ w[support]
    ok = f > 0
    ll = float(counts[ok] @ np.log(f[ok])) if ok.all() else -np.inf
    return lik[ok].T @ (counts[ok] / f[ok]), ll, f


def naive_atom_posterior(x, s, atoms, w):
    """Posterior mean and variance on the atoms by Bayes' rule, and the total
    log-likelihood (scipy's normal density)."""
    mean, var, loglik = naive_normal_grid_posterior(x, s, atoms, w)
    return mean, var, float(loglik.sum())


def naive_weighted_gram(a, f, counts):
    return (a * (counts / f**2)[:, None]).T @ a


def naive_log_likelihood_along(f, u, alpha, counts):
    v = f + alpha * (u - f)
    return float(counts @ np.log(v)) if np.all(v > 0) else -np.inf


def naive_vertex_slope(f, col, a, counts):
    """d/da sum_i c_i log((1 - a) f_i + a col_i), term by term."""
    v = (1.0 - a) * f + a * col
    if np.any((v <= 0) & (col < f)):
        return -np.inf
    ok = v > 0
    return float(np.sum(counts[ok] * (col[ok] - f[ok]) / v[ok]))


def naive_cell_index(x, s, scale, widths, x_low):
    """Class floor(J(s)) of s (J(s) = scale[0] log s - scale[1] / s^2 + scale[2]), then
    bin floor((x - x_low) / width) within the class, both capped to their ranges."""
    span = x.max() - x_low
    n_bins = np.floor(span / widths).astype(np.int64) + 1
    offsets = np.concatenate([[0], np.cumsum(n_bins)])
    if widths.size == 1:
        klass = np.zeros(x.size, np.int64)
    else:
        level = scale[0] * np.log(s) - scale[1] / s**2 + scale[2]
        klass = np.clip(np.floor(level), 0, widths.size - 1).astype(np.int64)
    local = np.clip(np.floor((x - x_low) / widths[klass]), 0, n_bins[klass] - 1)
    return offsets[klass] + local.astype(np.int64)


def naive_cell_rows(cell, x, s, counts):
    """Occupied cells in increasing order: count-weighted means of x and s, the total
    count, and each observation's row (np.unique)."""
    _, row = np.unique(cell, return_inverse=True)
    total = np.bincount(row, weights=counts)
    return (np.bincount(row, weights=counts * x) / total,
            np.bincount(row, weights=counts * s) / total, total, row)


def naive_binning_error(x, s, rep_x, rep_s, low, high):
    """r_i = max over u in [low, high] of |log phi_{s_i}(x_i - u) - log phi_{s'_i}(c_i - u)|
    with scipy's log density, at the ends and at the vertex of the quadratic
    A u^2 + B u + C (A = 1/(2 s'^2) - 1/(2 s^2), B = x / s^2 - c / s'^2)."""
    from scipy import stats

    def rho(u):
        return stats.norm.logpdf(x, u, s) - stats.norm.logpdf(rep_x, u, rep_s)

    r = np.maximum(np.abs(rho(low)), np.abs(rho(high)))
    a = 0.5 / rep_s**2 - 0.5 / s**2
    b = x / s**2 - rep_x / rep_s**2
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = -b / (2 * a)
    inside = (a != 0) & (vertex > low) & (vertex < high)
    r[inside] = np.maximum(r[inside], np.abs(rho(np.where(inside, vertex, low))[inside]))
    return r


def naive_farthest_from_grid(x, s, grid):
    reach = np.min(np.abs(x[:, None] - grid[None, :]), axis=1) / s
    return float(reach.max()), int(np.argmax(reach))
