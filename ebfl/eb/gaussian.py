r"""Gaussian empirical Bayes: Theorems 1 and 2 of the paper.

Client ``i`` has parameter :math:`\theta_i \sim N(\mu, \sigma_\theta^2 I_d)` and reports
a mean :math:`x_i \sim N(\theta_i, s_i^2 I_d)`, with :math:`s_i = \sigma_x / \sqrt{n_i}`
for :math:`n_i` samples.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ebfl._kernels import client_mean_ssd
from ebfl._validation import (
    check_choice,
    check_finite_array,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_samples_per_client,
    check_standard_errors,
)
from ebfl.eb import _kernels
from ebfl.eb.priors import NormalPrior
from ebfl.eb.results import GaussianEBResult, NormalPosterior, PersonalizedGaussianEstimate
from ebfl.ragged import Ragged

__all__ = ["gaussian_eb", "gaussian_eb_samples", "personalized_gaussian"]

METHODS = ("mle", "reml", "dl", "moments")

_LOG_2PI = math.log(2.0 * math.pi)
_EPS = float(np.finfo(np.float64).eps)

#: Largest known prior_sd accepted: its square must be finite.
_MAX_SD = 1e150
#: Largest |x| and |prior_mean| accepted: squared distances stay finite.
_MAX_ABS = 1e150

#: Log-spaced grid points per decade of t = sigma_theta^2 in the global search.
GRID_PER_DECADE = 8
#: The grid starts at this fraction of min_i s_i^2 (or of the upper bound, if smaller).
GRID_FLOOR = 1e-3


def personalized_gaussian(xbar, n, *, sigma_theta, sigma_x, shared=None, sigma_q=0.0):
    r"""The paper's personalized Gaussian estimator, Theorem 1 and equation (4) of Theorem 2.

    :math:`\hat\theta_i = a \bar x_i + (1 - a) \hat\mu`, with :math:`\hat\mu` the plain
    average of what the clients shared and

    .. math:: a = \frac{\sigma_\theta^2 + \sigma_q^2/(m-1)}
                       {\sigma_\theta^2 + \sigma_q^2/(m-1) + \sigma_x^2/n}.

    Parameters
    ----------
    xbar : array_like, shape (m,) or (m, d)
        Each client's own (unquantized) local mean.
    n : int or array_like of int, shape (m,)
        Samples per client (the theorems assume one common n).
    sigma_theta : float
        Known population standard deviation, >= 0.
    sigma_x : float
        Known data standard deviation, > 0.
    shared : array_like, optional
        What the clients sent to the server, :math:`q(\bar x_i)`, same shape as ``xbar``;
        defaults to ``xbar`` itself (Theorem 1).
    sigma_q : float, default=0
        Per-coordinate standard deviation of the sharing mechanism q, so that
        :math:`E\lVert q(x) - x\rVert^2 \le d \sigma_q^2` (Theorem 2).

    Returns
    -------
    PersonalizedGaussianEstimate

    Notes
    -----
    The per-coordinate Bayes risk is :math:`\frac{\sigma_x^2}{n}\big(\frac{1 - a}{m} + a\big)`
    (see :func:`ebfl.bounds.theorem2_mse`), exact when the mechanism's variance is
    :math:`\sigma_q^2` for every input (Theorems 1 and 2).

    Examples
    --------
    >>> res = personalized_gaussian([0.0, 1.0, 2.0], 4, sigma_theta=1.0, sigma_x=2.0)
    >>> res.weight, res.estimate.tolist()
    (0.5, [0.5, 1.0, 1.5])
    """
    xbar = check_finite_array(xbar, "xbar", ndim=(1, 2), min_len=2)
    m = xbar.shape[0]
    n = check_samples_per_client(n, m)
    sigma_theta = check_nonnegative_scalar(sigma_theta, "sigma_theta")
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    sigma_q = check_nonnegative_scalar(sigma_q, "sigma_q")
    if shared is None:
        shared_arr = xbar
    else:
        shared_arr = check_finite_array(shared, "shared", ndim=xbar.ndim)
        if shared_arr.shape != xbar.shape:
            raise ValueError(f"shared must have the shape of xbar {xbar.shape}, "
                             f"got {shared_arr.shape}")
    mu_hat = _scaled_mean(shared_arr)
    # in units of the largest scale, so that no square under- or overflows
    scale = max(sigma_theta, sigma_q, sigma_x)
    het = (sigma_theta / scale) ** 2 + (sigma_q / scale) ** 2 / (m - 1)
    a = het / (het + (sigma_x / scale) ** 2 / n) if het > 0 else np.zeros_like(n)
    a_col = a[:, None] if (xbar.ndim == 2 and np.ndim(a)) else a
    estimate = a_col * xbar + (1.0 - a_col) * mu_hat
    weight = float(a) if np.ndim(a) == 0 else a
    return PersonalizedGaussianEstimate(estimate, weight, mu_hat if xbar.ndim == 2
                                        else float(mu_hat), sigma_q)


def gaussian_eb(x, s, *, method="mle", prior_mean=None, prior_sd=None):
    r"""Empirical-Bayes (normal-means) estimates under a Gaussian population prior.

    Model: :math:`\theta_i \sim N(\mu, \sigma_\theta^2 I_d)`,
    :math:`x_i \mid \theta_i \sim N(\theta_i, s_i^2 I_d)`. Unknown prior parameters are
    learned from all clients; the posterior of every client is

    .. math:: \theta_i \mid x_i \sim N\big(\mu + a_i (x_i - \mu),\ a_i s_i^2 I_d\big),
              \qquad a_i = \frac{\sigma_\theta^2}{\sigma_\theta^2 + s_i^2}.

    Parameters
    ----------
    x : array_like, shape (m,) or (m, d)
        Client means, in [-1e150, 1e150].
    s : float or array_like, shape (m,)
        Standard errors of the client means (per coordinate), in [1e-150, 1e150]
        (so that :math:`s_i^2` is a normal float); with :math:`n_i` samples of noise sd
        :math:`\sigma_x`, :math:`s_i = \sigma_x / \sqrt{n_i}`.
    method : {"mle", "reml", "dl", "moments"}, default="mle"
        How an unknown :math:`\sigma_\theta` is fitted:

        - ``"mle"``: maximum marginal likelihood (as R's ebnm does for its
          normal prior and metafor's ``rma(method="ML")``), globally over
          :math:`\sigma_\theta^2 \ge 0` (see Notes).
        - ``"reml"``: restricted maximum likelihood (metafor's default
          ``"REML"``): the likelihood with mu integrated out under a flat
          prior, which removes the downward bias of the ML variance.
        - ``"dl"``: the DerSimonian-Laird moment estimator (metafor's ``"DL"``),
          :math:`\hat\sigma_\theta^2 = \max\big(0, \frac{Q - d(m-1)}{d\,(\sum_i w_i
          - \sum_i w_i^2 / \sum_i w_i)}\big)` with :math:`w_i = 1/s_i^2` and
          :math:`Q = \sum_i w_i \lVert x_i - \bar x_w\rVert^2`, :math:`\bar x_w` the
          w-weighted mean. For :math:`d > 1` the coordinates are pooled: Q sums over
          them and its expectation is :math:`d(m-1) + d \sigma_\theta^2 (\sum_i w_i
          - \sum_i w_i^2 / \sum_i w_i)`.
        - ``"moments"``: :math:`\hat\sigma_\theta^2 = \max\big(0, \frac{1}{d(m-1)}
          \sum_i \lVert x_i - \bar x\rVert^2 - \frac1m \sum_i s_i^2\big)` with
          :math:`\bar x` the plain mean (unbiased for equal :math:`s_i`).
    prior_mean : float or array_like of shape (d,), optional
        Known :math:`\mu`. If None, :math:`\mu` is estimated by the precision-weighted
        mean :math:`\sum_i w_i x_i / \sum_i w_i`, :math:`w_i = 1/(\sigma_\theta^2 + s_i^2)`
        (its MLE, and the mean metafor reports for every method), or by the plain mean
        for ``method="moments"``. When given, ``"moments"`` divides by :math:`dm`
        instead of :math:`d(m-1)`, ``"dl"`` uses :math:`\hat\sigma_\theta^2 = \max(0,
        (Q_0 - dm) / (d \sum_i w_i))` with :math:`Q_0 = \sum_i w_i \lVert x_i -
        \mu\rVert^2`, and ``"reml"`` is the same as ``"mle"`` (there is no mean to
        integrate out).
    prior_sd : float, optional
        Known :math:`\sigma_\theta`, in [0, 1e150]. If None, it is estimated by
        ``method``.

    Returns
    -------
    GaussianEBResult
        ``log_likelihood`` is always the marginal log-likelihood
        :math:`\sum_i \log N(x_i; \mu, (\sigma_\theta^2 + s_i^2) I_d)` at the fitted
        prior. ``diagnostics`` holds, for ``"mle"`` and ``"reml"``: ``converged``,
        ``at_zero`` (:math:`\sigma_\theta = 0`), ``at_upper`` (the search's upper end,
        never expected) and ``n_local_maxima`` (of the profile over
        :math:`\sigma_\theta^2 \ge 0`, the boundary 0 included); for ``"reml"`` also
        ``restricted_log_likelihood`` (see Notes); for ``"dl"``
        ``q_statistic`` (Q, or Q_0) and ``variance_floored``; for
        ``"moments"`` ``variance_floored``.

    Warns
    -----
    RuntimeWarning
        If the maximization over :math:`\sigma_\theta` did not converge (``"mle"``,
        ``"reml"``).

    Notes
    -----
    Global maximization: with unequal :math:`s_i` the profile log-likelihood of
    :math:`\sigma_\theta^2` can have several local maxima (a few precise, tightly
    clustered clients beside imprecise, distant ones). It is scanned on a
    log-spaced grid (8 points per decade) from :math:`10^{-3} \min_i s_i^2` up to a
    bound beyond which it provably decreases, every sign change of its slope is
    refined by Brent's root finder, and the best of these maxima and
    :math:`\sigma_\theta^2 = 0` is kept. Clients with equal :math:`s_i` are pooled
    first (exact; done when it at least halves their number), so each evaluation
    costs :math:`O(d \times \text{number of distinct } s_i)`, in one parallel Numba
    pass for all grid points.

    Restricted log-likelihood (``"reml"``), in metafor's convention, summed over
    the d coordinates (each with its own mean):

    .. math:: \ell_R = \ell(\hat\mu, \sigma_\theta^2) + \frac d2 \Big[\log(2\pi)
              + \log m - \log \sum_i \frac{1}{\sigma_\theta^2 + s_i^2}\Big],

    with :math:`\ell` the marginal log-likelihood at the weighted mean
    :math:`\hat\mu`; on the BCG vaccine trials it reproduces metafor's REML
    ``logLik`` (-12.2024). With ``prior_mean`` given it equals ``log_likelihood``.

    With ``prior_sd`` known and equal s_i this is exactly the Theorem 1
    estimator (:math:`\hat\mu` is then the plain average, its MLE). With both prior
    parameters known it is the oracle posterior mean, whose risk is the
    lower bound (46).

    References
    ----------
    R. DerSimonian and N. Laird (1986), "Meta-analysis in clinical trials",
    Controlled Clinical Trials 7(3). W. Viechtbauer (2005), "Bias and efficiency
    of meta-analytic variance estimators in the random-effects model", Journal
    of Educational and Behavioral Statistics 30(3).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> theta = rng.normal(1.0, 0.5, size=2000)
    >>> x = theta + rng.normal(0.0, 0.5, size=2000)
    >>> res = gaussian_eb(x, 0.5)
    >>> bool(abs(res.prior.sd - 0.5) < 0.05), bool(abs(res.prior.mean - 1.0) < 0.05)
    (True, True)
    >>> reml = gaussian_eb(x, 0.5, method="reml")
    >>> bool(reml.prior.sd > res.prior.sd), reml.diagnostics["converged"]
    (True, True)
    """
    x_arr, s_arr, mean_known, sd_known = _gaussian_iv(x, s, prior_mean, prior_sd)
    check_choice(method, "method", METHODS)
    x2 = x_arr if x_arr.ndim == 2 else x_arr[:, None]
    m, d = x2.shape
    s2 = s_arr**2
    diagnostics = {}
    if sd_known is not None:
        tau2 = sd_known**2
    elif method == "moments":
        tau2, diagnostics = _moments_tau2(x2, s2, mean_known)
    elif method == "dl":
        tau2, diagnostics = _dersimonian_laird_tau2(x2, s2, mean_known)
    else:
        if m < 2:
            raise ValueError(f"estimating prior_sd by method={method!r} needs at least 2 clients")
        restricted = method == "reml" and mean_known is None
        tau2, diagnostics = _profile_fit_tau2(x2, s2, mean_known, restricted)
        if not diagnostics["converged"]:
            warnings.warn(f"gaussian_eb(method={method!r}): the maximization over sigma_theta "
                          f"did not converge (diagnostics: {diagnostics})", RuntimeWarning,
                          stacklevel=2)
    if mean_known is not None:
        mu = mean_known
    elif method == "moments":
        mu = x2.mean(axis=0)
    else:
        mu = _weighted_mean(x2, s2, tau2)
    fitted = "fixed" if (sd_known is not None and mean_known is not None) else method
    post_mean, post_var, a = _kernels._normal_posterior(x2, s2, np.asarray(mu, float), tau2)
    loglik = _normal_loglik(x2, s2, mu, tau2)
    if method == "reml" and fitted != "fixed":
        diagnostics["restricted_log_likelihood"] = (
            loglik if mean_known is not None else _restricted_loglik(loglik, s2, tau2, d))
    prior = NormalPrior(mu if x_arr.ndim == 2 else float(np.asarray(mu).reshape(-1)[0]),
                        np.sqrt(tau2))
    posterior = NormalPosterior(post_mean if x_arr.ndim == 2 else post_mean[:, 0], post_var)
    # copy: the result freezes its arrays, and s_arr may be the caller's own array
    return GaussianEBResult(fitted, prior, posterior, a, s_arr.copy(), loglik, diagnostics)


def gaussian_eb_samples(data, *, sigma_x=None, **kwargs):
    r"""Gaussian empirical Bayes from raw client samples.

    Computes every client's mean (Numba kernel, one pass) and, when
    ``sigma_x`` is unknown, the pooled within-client estimate
    :math:`\hat\sigma_x^2 = \sum_i \sum_j \lVert X_{ij} - \bar x_i\rVert^2 / (d \sum_i
    (n_i - 1))`; then calls :func:`gaussian_eb` with :math:`s_i = \sigma_x / \sqrt{n_i}`.

    Parameters
    ----------
    data : Ragged
        Samples of m clients, values of shape (N,) or (N, d).
    sigma_x : float, optional
        Known data standard deviation, > 0, such that every :math:`\sigma_x / \sqrt{n_i}`
        lies in [1e-150, 1e150]. If None it is estimated, which needs at
        least one client with two or more samples.
    **kwargs
        ``method``, ``prior_mean``, ``prior_sd``: see :func:`gaussian_eb`.

    Returns
    -------
    GaussianEBResult
        ``diagnostics["sigma_x"]`` holds the sigma_x used and
        ``diagnostics["sigma_x_estimated"]`` whether it was estimated.

    Examples
    --------
    >>> from ebfl import Ragged
    >>> data = Ragged.from_counts(np.array([1.0, 1.2, 0.8, 3.0, 3.4, 2.6]), np.array([3, 3]))
    >>> res = gaussian_eb_samples(data)
    >>> round(res.diagnostics["sigma_x"], 6), res.s.round(6).tolist()
    (0.316228, [0.182574, 0.182574])
    """
    if not isinstance(data, Ragged):
        raise TypeError(f"data must be a ebfl.Ragged, got {type(data).__name__}")
    values = data.values
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise TypeError(f"data.values must be numeric, got dtype {values.dtype}")
    counts = data.counts
    if np.any(counts == 0):
        raise ValueError(f"data: every client needs at least one sample; "
                         f"{int(np.sum(counts == 0))} client(s) are empty")
    v2 = values.astype(np.float64, copy=False)
    v2 = v2 if v2.ndim == 2 else v2[:, None]
    mean, ssd, nonfinite = client_mean_ssd(v2, data.offsets)
    if nonfinite.any():
        raise ValueError(f"data.values must be finite; {int(nonfinite.sum())} value(s) are NaN "
                         "or infinite")
    d = v2.shape[1]
    if sigma_x is None:
        dof = int(np.sum(counts - 1))
        if dof == 0:
            raise ValueError("data: estimating sigma_x needs a client with at least 2 samples; "
                             "pass sigma_x")
        sigma_x_used = float(np.sqrt(np.sum(ssd) / (d * dof)))
        if sigma_x_used == 0.0:
            raise ValueError("data: all clients' samples are constant, so the sigma_x estimate "
                             "is 0; pass sigma_x")
        s_name = "s = (estimated sigma_x) / sqrt(n_i)"
    else:
        sigma_x_used = check_positive_scalar(sigma_x, "sigma_x")
        s_name = "s = sigma_x / sqrt(n_i)"
    s = check_standard_errors(sigma_x_used / np.sqrt(counts), s_name, counts.size)
    x = mean if values.ndim == 2 else mean[:, 0]
    res = gaussian_eb(x, s, **kwargs)
    diagnostics = dict(res.diagnostics, sigma_x=sigma_x_used,
                       sigma_x_estimated=sigma_x is None)
    return GaussianEBResult(res.method, res.prior, res.posterior, res.shrinkage, res.s,
                            res.log_likelihood, diagnostics)


# --------------------------------------------------------------------------- validation


def _gaussian_iv(x, s, prior_mean, prior_sd):
    # |x| <= 1e150 keeps every squared distance finite
    x_arr = check_finite_array(x, "x", ndim=(1, 2), min_len=1, max_abs=_MAX_ABS)
    m = x_arr.shape[0]
    s_arr = check_standard_errors(s, "s", m)
    mean_known = None
    if prior_mean is not None:
        d = 1 if x_arr.ndim == 1 else x_arr.shape[1]
        mean_known = check_finite_array(prior_mean, "prior_mean", ndim=(0, 1), max_abs=_MAX_ABS)
        mean_known = np.broadcast_to(mean_known, (d,)) if mean_known.ndim == 0 else mean_known
        if mean_known.shape != (d,):
            raise ValueError(f"prior_mean must be a scalar or have shape ({d},), "
                             f"got {mean_known.shape}")
    sd_known = None if prior_sd is None else check_nonnegative_scalar(prior_sd, "prior_sd")
    # A tiny prior_sd may underflow when squared: the prior is then a point mass, which
    # changes every a_i by less than prior_sd^2 / s_i^2 < 1e-10. A huge one would overflow.
    if sd_known is not None and sd_known > _MAX_SD:
        raise ValueError(f"prior_sd must lie in [0, {_MAX_SD:g}] (its square must be finite), "
                         f"got {sd_known!r}")
    return x_arr, s_arr, mean_known, sd_known


# --------------------------------------------------------------------------- estimators of tau^2


def _moments_tau2(x2, s2, mean_known):
    m, d = x2.shape
    mu = mean_known if mean_known is not None else x2.mean(axis=0)
    dof = m if mean_known is not None else m - 1
    if dof < 1:
        raise ValueError("estimating prior_sd by moments needs at least 2 clients")
    raw = float(np.sum((x2 - mu) ** 2) / (d * dof) - np.mean(s2))
    return max(raw, 0.0), {"variance_floored": raw < 0}


def _dersimonian_laird_tau2(x2, s2, mean_known):
    """DerSimonian-Laird: tau^2 = max(0, (Q - E_0 Q) / (d c)), coordinates pooled.

    The precisions w_i = 1/s_i^2 enter through u_i = w_i / max_j w_j <= 1, so
    that sum w^2 cannot overflow for s_i near 1e-150; (Q - dof) / (d c) is the
    same ratio with both terms multiplied by min_j s_j^2.
    """
    m, d = x2.shape
    s2_min = float(s2.min())
    u = s2_min / s2
    total = float(u.sum())
    if mean_known is None:
        if m < 2:
            raise ValueError("estimating prior_sd by method='dl' needs at least 2 clients")
        centre = (u @ x2) / total
        dof = d * (m - 1)
        # c = sum u - sum u^2 / sum u = sum_i u_i (sum_{j != i} u_j) / sum u, with the
        # largest weight's "others" summed directly (sum u - u_max would cancel).
        top = int(np.argmax(u))
        others = total - u
        others[top] = float(np.sum(np.delete(u, top)))
        c_u = float(u @ others) / total
    else:
        centre = mean_known
        dof = d * m
        c_u = total
    if c_u == 0.0:
        raise ValueError("method='dl' cannot weigh these s: their squares span more than the "
                         "float range (ratio of largest to smallest s above ~1e150)")
    q_u = float(u @ np.sum((x2 - centre) ** 2, axis=1))
    raw = (q_u - dof * s2_min) / (d * c_u)
    return max(raw, 0.0), {"q_statistic": q_u / s2_min, "variance_floored": raw < 0}


def _profile_fit_tau2(x2, s2, mean_known, restricted):
    groups = _group_by_variance(x2, s2)
    upper = _stationary_bound(x2, s2, mean_known, restricted)
    tau2, info = _maximize_profile(groups, upper, mean=mean_known, restricted=restricted)
    info["at_zero"] = tau2 == 0.0
    return tau2, info


def _scaled_mean(values):
    """Mean over axis 0 in units of max |value|: a plain sum of values near 1e308 overflows."""
    scale = float(np.max(np.abs(values)))
    return values.mean(axis=0) if scale == 0.0 else scale * (values / scale).mean(axis=0)


def _weighted_mean(x2, s2, tau2):
    """sum_i w_i x_i / sum_i w_i, w_i = 1/(tau2 + s_i^2), with w scaled to max 1 (no overflow)."""
    w = (tau2 + s2.min()) / (tau2 + s2)
    return (w @ x2) / w.sum()


def _normal_loglik(x2, s2, mu, tau2):
    """sum_i log N(x_i; mu, (tau2 + s_i^2) I_d): the profile at t = tau2 with mu known and
    every client its own group (one parallel Numba pass)."""
    m, d = x2.shape
    mu = np.ascontiguousarray(np.broadcast_to(mu, (d,)), dtype=np.float64)
    values, _ = _kernels._normal_profile(np.array([float(tau2)]), np.ones(m),
                                         np.ascontiguousarray(s2), np.ascontiguousarray(x2),
                                         np.zeros(m), float(s2.min()), float(m), mu, True, False,
                                         True)
    return float(values[0])


def _restricted_loglik(loglik, s2, tau2, d):
    """metafor's REML log-likelihood from the ML one at the weighted mean (see gaussian_eb)."""
    m = s2.size
    v_min = tau2 + float(s2.min())
    log_w = math.log(float(np.sum(v_min / (tau2 + s2)))) - math.log(v_min)  # log sum 1/v_i
    return loglik + 0.5 * d * (_LOG_2PI + math.log(m) - log_w)


# --------------------------------------------------------------------------- global profile search
#
# The profile log-likelihood of t = tau^2 (mu at its weighted-mean maximizer, or known),
#   l(t) = -1/2 sum_i [d log(2 pi v_i) + |x_i - mu(t)|^2 / v_i],   v_i = t + s_i^2,
# has slope l'(t) = 1/2 sum_i (|x_i - mu(t)|^2 - d v_i) / v_i^2 (envelope theorem). The
# restricted version adds d/2 [log 2 pi + log m - log W(t)], W = sum_i 1/v_i, whose slope
# is d/2 sum_i v_i^-2 / W. The same code serves the mixture's M-step, where client i
# counts with its responsibility r_i (a weighted profile, same formulas).


@dataclass(frozen=True)
class _VarianceGroups:
    """Clients pooled by equal s_i^2, the only data a normal profile likelihood needs.

    With n_g clients (or total weight) at variance s2_g, weighted mean ``mean_g`` and
    within-group sum of squares ``ss_g``, sum_{i in g} r_i |x_i - mu|^2 =
    ss_g + n_g |mean_g - mu|^2 for every mu, so pooling is exact. When pooling would not
    halve the number of rows, every client is its own group (s2 then in client order).
    """

    count: np.ndarray  # (G,)
    s2: np.ndarray  # (G,) distinct when pooled, in any order
    mean: np.ndarray  # (G, d), C-contiguous
    ss: np.ndarray  # (G,)
    s2_min: float  # min s2
    total: float  # sum count


def _group_by_variance(x2, s2, weights=None):
    m = s2.size
    s2 = np.ascontiguousarray(s2, dtype=np.float64)
    w = np.ones(m) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    s2_sorted = np.sort(s2)  # fast (SIMD) sort of the values alone, to count them
    new = s2_sorted[1:] != s2_sorted[:-1]
    n_groups = 1 + int(np.count_nonzero(new))
    if 2 * n_groups > m:
        # pooling would save less than half of every profile evaluation: skip it
        return _VarianceGroups(w, s2, np.ascontiguousarray(x2), np.zeros(m),
                               float(s2_sorted[0]), float(w.sum()))
    order = np.argsort(s2)  # equal s_i^2 in any order: it only rounds the pooled sums
    starts = np.flatnonzero(np.r_[True, new])
    w = w[order]
    xs = x2[order]
    count = np.add.reduceat(w, starts)
    mean = np.add.reduceat(w[:, None] * xs, starts, axis=0) / count[:, None]
    sizes = np.diff(np.r_[starts, m])
    resid = xs - np.repeat(mean, sizes, axis=0)  # two passes: no cancellation in ss
    ss = np.add.reduceat(w * np.einsum("ij,ij->i", resid, resid), starts)
    return _VarianceGroups(count, s2_sorted[starts], mean, ss, float(s2_sorted[0]),
                           float(count.sum()))


def _profile(t, groups, mean=None, restricted=False, with_values=True):
    """Profile log-likelihood at each t (1-D array) and c(t) l'(t), c(t) = t + min_i s_i^2 > 0.

    The slope is returned multiplied by c(t) (same sign, same roots) and computed
    from a_i = c(t) / v_i in (0, 1], so nothing overflows even when s_i^2 ~ 1e-300.
    One fused Numba pass over the groups per t (:func:`ebfl.eb._kernels._normal_profile`);
    ``with_values=False`` skips the logarithms and returns NaN values.
    """
    t = np.ascontiguousarray(t, dtype=np.float64)
    d = groups.mean.shape[1]
    known = mean is not None
    mu = np.ascontiguousarray(mean, dtype=np.float64) if known else np.zeros(d)
    return _kernels._normal_profile(t, groups.count, groups.s2, groups.mean, groups.ss,
                                    groups.s2_min, groups.total, mu, known, bool(restricted),
                                    with_values)


def _stationary_bound(x2, s2, mean, restricted):
    """A t above which the profile decreases strictly, so that no maximum lies beyond it.

    ML: |x_i - mu(t)|^2 <= D^2 (mu(t) lies in the bounding box of the x_i, D its
    diagonal), so every term of l'(t) is negative once d t >= D^2. Known mu: the
    same with max_i |x_i - mu|^2. REML: with r_i = |x_i - mu|^2, sum_i r_i <= S =
    sum_i |x_i - xbar|^2 + m R^2 (R = max_i |x_i - xbar|), sum v^-2 / W <= 1/(t + min s^2),
    and d sum_i 1/v_i - d max_i 1/v_i >= d (m-1) / (t + max s^2), so l_R'(t) < 0 once
    t >= max(max s^2, 2 S / (d (m-1))).
    """
    m, d = x2.shape
    if mean is not None:
        return float(np.max(np.sum((x2 - mean) ** 2, axis=1))) / d
    if not restricted:
        return float(np.sum(np.ptp(x2, axis=0) ** 2)) / d
    resid = np.sum((x2 - x2.mean(axis=0)) ** 2, axis=1)
    spread = float(resid.sum() + m * resid.max())
    return max(float(s2.max()), 2.0 * spread / (d * (m - 1)))


def _tau2_grid(lower, upper, s2_min):
    """Log-spaced grid of [lower, upper] with GRID_PER_DECADE points per decade.

    Below GRID_FLOOR min_i s_i^2 no further points are needed: every term of the
    profile is analytic in t for |t| < min_i s_i^2, with Taylor coefficients shrinking
    like (t / s_i^2)^k, so on [0, 1e-3 min s^2] the slope is affine to within about 1e-3
    of its terms and the interval [lower, first point] holds at most one stationary point.
    """
    start = max(lower, GRID_FLOOR * min(s2_min, upper))
    # log10(upper) - log10(start), not log10(upper / start): the ratio can overflow
    # (s_i^2 from 1e-300 to 1e300)
    decades = math.log10(upper) - math.log10(start)
    n = max(2, int(math.ceil(GRID_PER_DECADE * decades)) + 1)
    grid = np.geomspace(start, upper, n)
    return grid if start == lower else np.concatenate(([lower], grid))


def _maximize_profile(groups, upper, *, mean=None, restricted=False, lower=0.0):
    """Global maximum of the profile log-likelihood over t = tau^2 in [lower, upper].

    ``upper`` must bound every stationary point (see :func:`_stationary_bound`). Scans
    the grid, finds each interval where the slope turns from positive to non-positive
    (a local maximum), refines it by Brent's root finder on the slope, and compares the
    roots and t = lower (which wins ties). Returns (t, info) with info = converged,
    at_upper, n_local_maxima.
    """
    info = {"converged": True, "at_upper": False, "n_local_maxima": 1}
    if not upper > lower:
        return lower, info
    grid = _tau2_grid(lower, upper, groups.s2_min)
    values, slopes = _profile(grid, groups, mean, restricted)

    def slope(t):  # the root finder needs no values: no logarithms
        return _profile(np.array([t]), groups, mean, restricted, with_values=False)[1][0]

    best_t, best_value, best_ok = lower, values[0], True
    n_max = int(slopes[0] <= 0.0)
    for j in np.flatnonzero((slopes[:-1] > 0.0) & (slopes[1:] <= 0.0)):
        a, b = float(grid[j]), float(grid[j + 1])
        root, status = optimize.brentq(slope, a, b, xtol=1e-12 * b, rtol=4 * _EPS,
                                       full_output=True, disp=False)
        value = _profile(np.array([root]), groups, mean, restricted)[0][0]
        n_max += 1
        if value > best_value:
            best_t, best_value, best_ok = root, value, bool(status.converged)
    # Safety net, never expected to fire: the upper end still rising (the bound is
    # exact, so only rounding could do it), or a grid point above every refined
    # maximum, would mean the search missed the maximum: report it, unconverged.
    top = int(np.argmax(values))
    if slopes[-1] > 0.0 and values[-1] > best_value:
        best_t, best_value, best_ok = float(grid[-1]), values[-1], False
    if values[top] > best_value + 1e-10 * (1.0 + abs(best_value)):
        best_t, best_value, best_ok = float(grid[top]), values[top], False
    info.update(converged=best_ok, at_upper=bool(best_t == grid[-1]), n_local_maxima=n_max)
    return float(best_t), info

