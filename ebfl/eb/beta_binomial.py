"""Beta-Bernoulli (beta-binomial) empirical Bayes: spec sections C.5 and C.6.

Client ``i`` has ``z_i`` successes in ``n_i`` Bernoulli trials with success
probability ``p_i ~ Beta(alpha, beta)``. Every method returns the posterior
Beta(alpha_i + z_i, beta_i + n_i - z_i); the methods differ in how the prior
(or the per-client leave-one-out prior) is obtained.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ebfl._config import MAX_DENSE_TABLE_CELLS
from ebfl._kernels import _bernoulli_counts
from ebfl._validation import check_choice, check_counts
from ebfl.eb import _kernels
from ebfl.eb.priors import BetaPrior
from ebfl.eb.results import BetaBinomialEBResult, BetaPosterior
from ebfl.ragged import Ragged

__all__ = ["METHODS", "beta_bernoulli_eb", "beta_binomial_eb", "bernoulli_counts"]

_LOO_VARIANTS = {
    "loo_printed": _kernels.LOO_PRINTED,
    "loo_proof": _kernels.LOO_PROOF,
    "loo_corrected": _kernels.LOO_CORRECTED,
}
METHODS = ("mle", "moments", *_LOO_VARIANTS)

# log(alpha), log(beta) search box of the MLE: Beta(1e-8, .) to Beta(1e10, .).
_LOG_BOUNDS = (np.log(1e-8), np.log(1e10))


def bernoulli_counts(data):
    """Successes and trials per client from ragged 0/1 observations.

    Parameters
    ----------
    data : Ragged
        One 0/1 observation per entry (bool, integer or float values).

    Returns
    -------
    successes, trials : ndarray of shape (m,), int64

    Raises
    ------
    ValueError
        If a value is not 0 or 1 (NaN included) or a client has no observations.
    """
    if not isinstance(data, Ragged):
        raise TypeError(f"data must be a ebfl.Ragged, got {type(data).__name__}")
    values = data.values
    if values.ndim != 1:
        raise ValueError(f"Bernoulli data must be 1-D, got values of shape {values.shape}")
    if values.dtype == bool:
        values = values.view(np.uint8)
    elif not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise TypeError(f"data.values must be bool, integer or float, got {values.dtype}")
    trials = data.counts
    _check_nonempty(trials)
    successes, invalid = _bernoulli_counts(values, data.offsets)
    n_invalid = int(invalid.sum())
    if n_invalid:
        first = int(np.flatnonzero(invalid)[0])
        raise ValueError(f"data.values must be 0 or 1; {n_invalid} value(s) are not "
                         f"(first in client {first})")
    return successes, trials


def beta_bernoulli_eb(data, **kwargs):
    """Beta-Bernoulli empirical Bayes from ragged 0/1 observations.

    Counts the successes of every client with a Numba kernel (one pass over the
    data, validation fused in) and calls :func:`beta_binomial_eb`.

    Parameters
    ----------
    data : Ragged
        0/1 observations of m clients.
    **kwargs
        Passed to :func:`beta_binomial_eb`.

    Returns
    -------
    BetaBinomialEBResult

    Examples
    --------
    >>> from ebfl import Ragged
    >>> data = Ragged.from_lists([[1, 1, 0], [0, 0, 0, 1], [1, 1], [0, 1, 1, 1]])
    >>> res = beta_bernoulli_eb(data, method="loo_corrected")
    >>> res.posterior.mean.shape
    (4,)
    """
    successes, trials = bernoulli_counts(data)
    return beta_binomial_eb(successes, trials, **kwargs)


def beta_binomial_eb(successes, trials, *, method="mle", prior=None, fix_prior=False):
    r"""Empirical-Bayes estimates of client success probabilities under a Beta prior.

    Parameters
    ----------
    successes : array_like of int, shape (m,)
        Successes z_i, with 0 <= z_i <= n_i.
    trials : array_like of int, shape (m,)
        Trials n_i >= 1 (clients may differ).
    method : {"mle", "moments", "loo_printed", "loo_proof", "loo_corrected"}, default="mle"
        How the prior is learned:

        - ``"mle"``: maximum beta-binomial marginal likelihood over (alpha, beta),
          started from the corrected moments (as R's ebbr does).
        - ``"moments"``: moment matching on all clients with the sampling-noise
          correction of ``"loo_corrected"``.
        - ``"loo_printed"``: the paper's eq. (6) exactly as printed: leave-one-out
          mean mu_i, variance (1/(m-2)) sum_{l != i} (x_l - mu_l)^2 (with mu_l,
          spec [!5]a) and a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 - 1 + n_i).
        - ``"loo_proof"``: the proof's variant: centred on mu_i and without
          the "-1", a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 + n_i).
        - ``"loo_corrected"``: centred on mu_i, and the variance of the local
          means minus their binomial noise, mean_l x_l(1-x_l)/(n_l-1), so that it
          estimates Var(p) (spec C.6 [D]); needs every n_i >= 2.

        The leave-one-out methods estimate client i's prior without its own data
        (the server sends (mu_i, sigma_i^2) to client i) and need m >= 3.
    prior : BetaPrior, optional
        With ``fix_prior=True``, the known prior (spec C.5); otherwise the
        starting point of ``"mle"``.
    fix_prior : bool, default=False
        Use ``prior`` as given, without fitting (ebnm's ``fix_g``).

    Returns
    -------
    BetaBinomialEBResult

    Notes
    -----
    With a known Beta(alpha, beta) prior the posterior mean is
    (alpha + z_i) / (alpha + beta + n_i) = a x_i + (1 - a) alpha/(alpha+beta), with
    a = n_i/(alpha + beta + n_i), and its Bayes risk is
    alpha beta / ((alpha+beta)(alpha+beta+1)(alpha+beta+n)) (spec C.5).

    The printed eq. (6) estimates Var(x_l) = sigma^2 + E[p(1-p)]/n rather than
    sigma^2, so its weight leans towards the local mean (spec [!5]c).
    Leave-one-out weights outside [0, 1] are clipped to [0, 1] and counted in
    ``n_clipped``; a corrected variance below 0 is floored at 0 (weight 0),
    counted in ``diagnostics["n_variance_floored"]``.

    References
    ----------
    Ozkara, Girgis, Data, Diggavi, "A Generative Framework for Personalized
    Learning and Estimation: Theory, Algorithms, and Privacy", eq. (6), Theorem 3.

    Examples
    --------
    >>> import numpy as np
    >>> z, n = np.array([3, 7, 5, 9, 1]), np.array([10, 10, 12, 14, 6])
    >>> res = beta_binomial_eb(z, n, prior=BetaPrior(2, 2), fix_prior=True)
    >>> float(res.posterior.mean[0])  # (2 + 3) / (4 + 10)
    0.35714285714285715
    """
    z, n = _counts_iv(successes, trials)
    check_choice(method, "method", METHODS)
    if prior is not None and not isinstance(prior, BetaPrior):
        raise TypeError(f"prior must be a BetaPrior or None, got {type(prior).__name__}")
    if fix_prior:
        if prior is None:
            raise ValueError("fix_prior=True needs a prior")
        return _posterior_result("fixed", prior, z, n, {})
    if z.size < 2:
        raise ValueError(f"fitting a prior needs at least 2 clients, got {z.size}")
    x = z / n
    if method in _LOO_VARIANTS:
        return _loo_fit(method, x, z, n)
    if method == "moments" and np.any(n < 2):
        raise ValueError("method='moments' needs trials >= 2 for every client to separate "
                         f"binomial noise from heterogeneity ({int(np.sum(n < 2))} have 1)")
    if np.all(n == 1):
        raise ValueError("every client has 1 trial: the likelihood depends on the prior only "
                         "through its mean, so alpha + beta is not identifiable")
    moments = _corrected_moments(x, n)
    if method == "moments":
        return _posterior_result("moments", _prior_or_none(*moments), z, n,
                                 {"mean": moments[0], "variance": moments[1]})
    return _mle_fit(z, n, prior, moments)


def _counts_iv(successes, trials):
    z = check_counts(successes, "successes", minimum=0)
    n = check_counts(trials, "trials", minimum=0)
    if z.shape != n.shape:
        raise ValueError(f"successes and trials must have the same length, got {z.size} "
                         f"and {n.size}")
    if z.size == 0:
        raise ValueError("successes and trials must hold at least one client")
    _check_nonempty(n)
    if np.any(z > n):
        first = int(np.flatnonzero(z > n)[0])
        raise ValueError(f"successes must not exceed trials (client {first}: "
                         f"{z[first]} > {n[first]})")
    return z, n


def _check_nonempty(trials):
    if np.any(trials == 0):
        empty = np.flatnonzero(trials == 0)
        raise ValueError(f"every client needs at least one observation; {empty.size} "
                         f"client(s) are empty (first: {int(empty[0])})")


def _corrected_moments(x, n):
    """Mean of the local means and the variance of p they imply (spec C.6 [D])."""
    mean = float(np.mean(x))
    var_x = float(np.var(x, ddof=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        noise = np.where(n > 1, x * (1.0 - x) / (n - 1.0), 0.0)
    return mean, var_x - float(np.mean(noise))


def _prior_or_none(mean, variance):
    """Beta prior with these moments, or None when they define no proper Beta."""
    if 0.0 < mean < 1.0 and 0.0 < variance < mean * (1.0 - mean):
        return BetaPrior.from_moments(mean, variance)
    return None


def _loo_fit(method, x, z, n):
    m = x.size
    if m < 3:
        raise ValueError(f"method={method!r} uses leave-one-out moments and needs at least "
                         f"3 clients, got {m}")
    if method == "loo_corrected" and np.any(n < 2):
        raise ValueError("method='loo_corrected' needs trials >= 2 for every client "
                         f"({int(np.sum(n < 2))} client(s) have 1 trial)")
    total = float(np.sum(x))
    ssq = float(np.sum((x - total / m) ** 2))
    corr_total = float(np.sum(x * (1.0 - x) / (n - 1.0))) if method == "loo_corrected" else 0.0
    mu, var, a, est, post_var, post_alpha, post_beta, clipped, floored = \
        _kernels._loo_beta_shrinkage(x, n, z, _LOO_VARIANTS[method], total, ssq, corr_total)
    # Global prior implied by the same moments on all m clients (no leave-one-out).
    var_all = ssq / (m - 1.0)
    if method == "loo_corrected":
        var_all -= corr_total / m
    s_all = _implied_concentration(method, total / m, var_all)
    prior = None
    if np.isfinite(s_all) and s_all > 0:
        mean_all = total / m
        prior = BetaPrior(mean_all * s_all, (1 - mean_all) * s_all) if 0 < mean_all < 1 else None
    posterior = BetaPosterior(post_alpha, post_beta, est, post_var)
    diagnostics = {"n_variance_floored": int(floored.sum()), "loo_variance": var}
    return BetaBinomialEBResult(method, prior, posterior, a, mu,
                                _log_likelihood(prior, z, n), int(clipped.sum()), diagnostics)


def _implied_concentration(method, mean, variance):
    """alpha + beta implied by the method's weight formula (inf when variance <= 0)."""
    if variance <= 0:
        return np.inf
    s = mean * (1.0 - mean) / variance
    return s if method == "loo_proof" else s - 1.0


def _posterior_result(method, prior, z, n, diagnostics, compressed=None):
    if prior is None:
        raise ValueError(f"method={method!r}: the moments define no proper Beta prior "
                         f"(variance of p estimated <= 0 or >= mean(1-mean)); "
                         "try method='mle' or a leave-one-out method")
    post_alpha, post_beta, mean, var, weight = _kernels._beta_posterior(
        z, n, prior.alpha, prior.beta)
    centre = np.full(z.size, prior.mean)
    return BetaBinomialEBResult(method, prior, BetaPosterior(post_alpha, post_beta, mean, var),
                                weight, centre, _log_likelihood(prior, z, n, compressed), 0,
                                diagnostics)


# --------------------------------------------------------------------------- MLE

def _compress(z, n):
    """Distinct (n, z) pairs with multiplicities: the likelihood's sufficient statistic."""
    n_max = int(n.max())
    if (n_max + 1) ** 2 <= min(MAX_DENSE_TABLE_CELLS, max(4 * z.size, 1 << 16)):
        table = _kernels._trials_successes_table(z, n, n_max)
        nu, zu = np.nonzero(table)
        return nu.astype(np.float64), zu.astype(np.float64), table[nu, zu].astype(np.float64)
    keys, counts = np.unique(n * (n_max + 1) + z, return_counts=True)
    nu, zu = np.divmod(keys, n_max + 1)
    return nu.astype(np.float64), zu.astype(np.float64), counts.astype(np.float64)


def _log_binom_total(nu, zu, w):
    return float(np.sum(w * (special.gammaln(nu + 1) - special.gammaln(zu + 1)
                             - special.gammaln(nu - zu + 1))))


def _bb_loglik(alpha, beta, nu, zu, w):
    """Beta-binomial log-likelihood without binomial coefficients."""
    return float(np.sum(w * (special.betaln(zu + alpha, nu - zu + beta)))
                 - np.sum(w) * special.betaln(alpha, beta))


def _log_likelihood(prior, z, n, compressed=None):
    if prior is None:
        return float("nan")
    nu, zu, w = _compress(z, n) if compressed is None else compressed
    return _bb_loglik(prior.alpha, prior.beta, nu, zu, w) + _log_binom_total(nu, zu, w)


def _margins(z, n):
    """Weighted histograms of z, n - z and n: the likelihood's derivatives split over them.

    d/d(alpha) sum_i log B(z_i + alpha, n_i - z_i + beta) involves z_i and n_i only
    separately, so the special functions are evaluated on at most max(n) + 1
    points instead of once per distinct (n, z) pair.
    """
    return tuple(_histogram(v) for v in (z, n - z, n))


def _histogram(values):
    top = int(values.max())
    if top + 1 <= max(4 * values.size, 1 << 16):
        counts = np.bincount(values, minlength=top + 1)
        support = np.flatnonzero(counts)
        return support.astype(np.float64), counts[support].astype(np.float64)
    support, counts = np.unique(values, return_counts=True)
    return support.astype(np.float64), counts.astype(np.float64)


def _derivatives(log_params, pairs, margins):
    """Log-likelihood, gradient and Hessian in (log alpha, log beta).

    The value uses ``betaln`` on the distinct (n, z) pairs (accurate for large
    alpha, beta); the derivatives use the margins (see :func:`_margins`).
    """
    alpha, beta = np.exp(log_params)
    (zs, wz), (fs, wf), (ns, wn) = margins
    total = np.sum(wn)
    value = _bb_loglik(alpha, beta, *pairs)
    s = alpha + beta
    dig_ns = np.sum(wn * special.digamma(ns + s))
    g_a = np.sum(wz * special.digamma(zs + alpha)) - dig_ns + total * (
        special.digamma(s) - special.digamma(alpha))
    g_b = np.sum(wf * special.digamma(fs + beta)) - dig_ns + total * (
        special.digamma(s) - special.digamma(beta))
    h_ab = total * special.polygamma(1, s) - np.sum(wn * special.polygamma(1, ns + s))
    trigamma = special.polygamma
    h_aa = np.sum(wz * trigamma(1, zs + alpha)) - total * trigamma(1, alpha) + h_ab
    h_bb = np.sum(wf * trigamma(1, fs + beta)) - total * trigamma(1, beta) + h_ab
    grad = np.array([alpha * g_a, beta * g_b])
    hess = np.array([[alpha * alpha * h_aa + alpha * g_a, alpha * beta * h_ab],
                     [alpha * beta * h_ab, beta * beta * h_bb + beta * g_b]])
    return value, grad, hess


def _newton_mle(x0, pairs, margins, *, max_iter=200, gtol=1e-10):
    """Levenberg-damped Newton ascent of the log-likelihood in (log alpha, log beta).

    Written out rather than calling scipy.optimize: L-BFGS-B stops with
    'ABNORMAL' line searches near the optimum of this smooth 2-parameter
    problem, while Newton with the exact Hessian (trigamma) converges in a few
    steps. The iterate stays in the box ``_LOG_BOUNDS``.
    """
    x = np.clip(np.asarray(x0, float), *_LOG_BOUNDS)
    value, grad, hess = _derivatives(x, pairs, margins)
    scale = np.sum(pairs[2])
    damping = 0.0
    for it in range(1, max_iter + 1):
        if np.max(np.abs(grad)) <= gtol * scale:
            return x, value, it - 1, True
        neg_h = -hess
        while True:
            try:
                step = np.linalg.solve(neg_h + damping * np.eye(2), grad)
                ok = np.all(np.linalg.eigvalsh(neg_h + damping * np.eye(2)) > 0)
            except np.linalg.LinAlgError:
                ok = False
            if ok:
                x_new = np.clip(x + step, *_LOG_BOUNDS)
                value_new, grad_new, hess_new = _derivatives(x_new, pairs, margins)
                if value_new >= value - 1e-12 * abs(value):
                    break
            damping = max(2.0 * damping, 1e-6 * scale)
            if damping > 1e12 * scale:
                return x, value, it, False
        moved = np.max(np.abs(x_new - x))
        x, value, grad, hess = x_new, value_new, grad_new, hess_new
        damping /= 10.0
        if moved < 1e-14:
            return x, value, it, bool(np.max(np.abs(grad)) <= 1e-6 * scale
                                      or _on_bound(x))
    return x, value, max_iter, False


def _on_bound(x):
    return bool(np.any(np.isclose(x, _LOG_BOUNDS[0]) | np.isclose(x, _LOG_BOUNDS[1])))


def _mle_start(z, n, prior, moments):
    if prior is not None:
        return prior, "prior"
    start = _prior_or_none(*moments)
    if start is not None:
        return start, "moments"
    mean = float(np.clip((z.sum() + 0.5) / (n.sum() + 1.0), 1e-6, 1 - 1e-6))
    return BetaPrior(mean * 10.0, (1.0 - mean) * 10.0), "fallback"


def _mle_fit(z, n, prior, moments):
    pairs = _compress(z, n)
    start, start_from = _mle_start(z, n, prior, moments)
    x, _, n_iter, converged = _newton_mle(np.log([start.alpha, start.beta]), pairs,
                                          _margins(z, n))
    fitted = BetaPrior(*np.exp(x))
    diagnostics = {
        "converged": converged, "n_iter": n_iter,
        "start": (start.alpha, start.beta), "start_from": start_from,
        "at_bound": _on_bound(x), "n_distinct_counts": int(pairs[0].size),
    }
    return _posterior_result("mle", fitted, z, n, diagnostics, pairs)
