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


def naive_mixture_gradient(lik, w, counts):
    f = lik @ w
    return lik.T @ (counts / f), float(counts @ np.log(f))


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
