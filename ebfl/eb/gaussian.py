"""Gaussian empirical Bayes: spec sections C.1 and C.2 (Theorems 1 and 2).

Client ``i`` has parameter theta_i ~ N(mu, sigma_theta^2 I_d) and reports a mean
x_i ~ N(theta_i, s_i^2 I_d), with s_i = sigma_x / sqrt(n_i) for n_i samples.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from ebfl._kernels import _client_mean_ssd
from ebfl._validation import (
    check_choice,
    check_finite_array,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.eb import _kernels
from ebfl.eb.priors import NormalPrior
from ebfl.eb.results import GaussianEBResult, NormalPosterior, PersonalizedGaussianEstimate
from ebfl.ragged import Ragged

__all__ = ["gaussian_eb", "gaussian_eb_samples", "personalized_gaussian"]

METHODS = ("mle", "moments")


def personalized_gaussian(xbar, n, *, sigma_theta, sigma_x, shared=None, sigma_q=0.0):
    r"""The paper's personalized Gaussian estimator, Theorem 1 and eq. (4) of Theorem 2.

    theta_hat_i = a xbar_i + (1 - a) mu_hat, with mu_hat the plain average of what
    the clients shared and

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
        What the clients sent to the server, q(xbar_i), same shape as ``xbar``;
        defaults to ``xbar`` itself (Theorem 1).
    sigma_q : float, default=0
        Per-coordinate standard deviation of the sharing mechanism q, so that
        E|q(x) - x|^2 <= d sigma_q^2 (Theorem 2).

    Returns
    -------
    PersonalizedGaussianEstimate

    Notes
    -----
    The per-coordinate Bayes risk is (sigma_x^2/n)((1 - a)/m + a) (see
    :func:`ebfl.bounds.theorem2_mse`), exact when the mechanism's variance is
    sigma_q^2 for every input (spec C.1, C.2).

    Examples
    --------
    >>> res = personalized_gaussian([0.0, 1.0, 2.0], 4, sigma_theta=1.0, sigma_x=2.0)
    >>> res.weight, res.estimate.tolist()
    (0.5, [0.5, 1.0, 1.5])
    """
    xbar = check_finite_array(xbar, "xbar", ndim=(1, 2), min_len=2)
    m = xbar.shape[0]
    n = _n_iv(n, m)
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
    mu_hat = shared_arr.mean(axis=0)
    het = sigma_theta**2 + sigma_q**2 / (m - 1)
    a = het / (het + sigma_x**2 / n) if het > 0 else np.zeros_like(n)
    a_col = a[:, None] if (xbar.ndim == 2 and np.ndim(a)) else a
    estimate = a_col * xbar + (1.0 - a_col) * mu_hat
    weight = float(a) if np.ndim(a) == 0 else a
    return PersonalizedGaussianEstimate(estimate, weight, mu_hat if xbar.ndim == 2
                                        else float(mu_hat), sigma_q)


def gaussian_eb(x, s, *, method="mle", prior_mean=None, prior_sd=None):
    r"""Empirical-Bayes (normal-means) estimates under a Gaussian population prior.

    Model: theta_i ~ N(mu, sigma_theta^2 I_d), x_i | theta_i ~ N(theta_i, s_i^2 I_d).
    Unknown prior parameters are learned from all clients; the posterior of
    every client is N(mu + a_i (x_i - mu), a_i s_i^2 I_d) with
    a_i = sigma_theta^2 / (sigma_theta^2 + s_i^2).

    Parameters
    ----------
    x : array_like, shape (m,) or (m, d)
        Client means.
    s : float or array_like, shape (m,)
        Standard errors of the client means (per coordinate), > 0; with n_i
        samples of noise sd sigma_x, s_i = sigma_x / sqrt(n_i).
    method : {"mle", "moments"}, default="mle"
        How an unknown sigma_theta is fitted: maximum marginal likelihood
        (as R's ebnm does for its normal prior), or moments,
        sigma_theta^2 = max(0, mean_i |x_i - mu_hat|^2/d - mean_i s_i^2).
    prior_mean : float or array_like of shape (d,), optional
        Known mu. If None, mu is estimated: by the precision-weighted mean
        sum_i w_i x_i / sum_i w_i, w_i = 1/(sigma_theta^2 + s_i^2) (its MLE), or
        by the plain mean for ``method="moments"``.
    prior_sd : float, optional
        Known sigma_theta >= 0. If None, it is estimated by ``method``.

    Returns
    -------
    GaussianEBResult

    Notes
    -----
    With ``prior_sd`` known and equal s_i this is exactly the Theorem 1
    estimator (mu_hat is then the plain average, its MLE). With both prior
    parameters known it is the oracle posterior mean, whose risk is the
    lower bound (46).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> theta = rng.normal(1.0, 0.5, size=2000)
    >>> x = theta + rng.normal(0.0, 0.5, size=2000)
    >>> res = gaussian_eb(x, 0.5)
    >>> bool(abs(res.prior.sd - 0.5) < 0.05), bool(abs(res.prior.mean - 1.0) < 0.05)
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
        if mean_known is not None:
            mu, fitted = mean_known, "fixed"
        elif method == "moments":
            mu, fitted = x2.mean(axis=0), "moments"
        else:
            mu, fitted = _weighted_mean(x2, s2, tau2), "mle"
    elif method == "moments":
        mu = mean_known if mean_known is not None else x2.mean(axis=0)
        dof = m if mean_known is not None else m - 1
        if dof < 1:
            raise ValueError("estimating prior_sd by moments needs at least 2 clients")
        raw = float(np.sum((x2 - mu) ** 2) / (d * dof) - np.mean(s2))
        tau2 = max(raw, 0.0)
        diagnostics["variance_floored"] = raw < 0
        fitted = "moments"
    else:
        if m < 2:
            raise ValueError("estimating prior_sd by maximum likelihood needs at least 2 clients")
        tau2, info = _profile_mle_tau2(x2, s2, mean_known)
        mu = mean_known if mean_known is not None else _weighted_mean(x2, s2, tau2)
        diagnostics.update(info)
        fitted = "mle"
    post_mean, post_var, a = _kernels._normal_posterior(x2, s2, np.asarray(mu, float), tau2)
    loglik = _normal_loglik(x2, s2, mu, tau2)
    prior = NormalPrior(mu if x_arr.ndim == 2 else float(np.asarray(mu).reshape(-1)[0]),
                        np.sqrt(tau2))
    posterior = NormalPosterior(post_mean if x_arr.ndim == 2 else post_mean[:, 0], post_var)
    # copy: the result freezes its arrays, and s_arr may be the caller's own array
    return GaussianEBResult(fitted, prior, posterior, a, s_arr.copy(), loglik, diagnostics)


def gaussian_eb_samples(data, *, sigma_x=None, **kwargs):
    r"""Gaussian empirical Bayes from raw client samples.

    Computes every client's mean (Numba kernel, one pass) and, when
    ``sigma_x`` is unknown, the pooled within-client estimate
    sigma_x^2 = sum_i sum_j |X_ij - xbar_i|^2 / (d sum_i (n_i - 1)); then calls
    :func:`gaussian_eb` with s_i = sigma_x / sqrt(n_i).

    Parameters
    ----------
    data : Ragged
        Samples of m clients, values of shape (N,) or (N, d).
    sigma_x : float, optional
        Known data standard deviation. If None it is estimated, which needs at
        least one client with two or more samples.
    **kwargs
        ``method``, ``prior_mean``, ``prior_sd``: see :func:`gaussian_eb`.

    Returns
    -------
    GaussianEBResult
        ``diagnostics["sigma_x"]`` holds the sigma_x used and
        ``diagnostics["sigma_x_estimated"]`` whether it was estimated.
    """
    if not isinstance(data, Ragged):
        raise TypeError(f"data must be a ebfl.Ragged, got {type(data).__name__}")
    values = data.values
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise TypeError(f"data.values must be numeric, got dtype {values.dtype}")
    counts = data.counts
    if np.any(counts == 0):
        raise ValueError(f"every client needs at least one sample; "
                         f"{int(np.sum(counts == 0))} client(s) are empty")
    v2 = values.astype(np.float64, copy=False)
    v2 = v2 if v2.ndim == 2 else v2[:, None]
    mean, ssd, nonfinite = _client_mean_ssd(v2, data.offsets)
    if nonfinite.any():
        raise ValueError(f"data.values must be finite; {int(nonfinite.sum())} value(s) are NaN "
                         "or infinite")
    d = v2.shape[1]
    if sigma_x is None:
        dof = int(np.sum(counts - 1))
        if dof == 0:
            raise ValueError("estimating sigma_x needs a client with at least 2 samples; "
                             "pass sigma_x")
        sigma_x_used = float(np.sqrt(np.sum(ssd) / (d * dof)))
        if sigma_x_used == 0.0:
            raise ValueError("all clients' samples are constant: sigma_x estimate is 0")
    else:
        sigma_x_used = check_positive_scalar(sigma_x, "sigma_x")
    x = mean if values.ndim == 2 else mean[:, 0]
    res = gaussian_eb(x, sigma_x_used / np.sqrt(counts), **kwargs)
    diagnostics = dict(res.diagnostics, sigma_x=sigma_x_used,
                       sigma_x_estimated=sigma_x is None)
    return GaussianEBResult(res.method, res.prior, res.posterior, res.shrinkage, res.s,
                            res.log_likelihood, diagnostics)


def _n_iv(n, m):
    n_arr = np.asarray(n)
    if n_arr.ndim == 0:
        if not float(n_arr).is_integer() or n_arr < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return float(n_arr)
    if n_arr.shape != (m,):
        raise ValueError(f"n must be a scalar or have shape ({m},), got {n_arr.shape}")
    if not np.all(np.isfinite(n_arr)) or np.any(n_arr < 1) or np.any(n_arr != np.floor(n_arr)):
        raise ValueError("n must hold integers >= 1")
    return n_arr.astype(np.float64)


def _gaussian_iv(x, s, prior_mean, prior_sd):
    x_arr = check_finite_array(x, "x", ndim=(1, 2), min_len=1)
    m = x_arr.shape[0]
    s_arr = check_finite_array(s, "s", ndim=(0, 1))
    if s_arr.ndim == 0:
        s_arr = np.full(m, float(s_arr))
    elif s_arr.shape != (m,):
        raise ValueError(f"s must be a scalar or have shape ({m},), got {s_arr.shape}")
    if np.any(s_arr <= 0):
        raise ValueError("s must be > 0 (standard errors of the client means)")
    mean_known = None
    if prior_mean is not None:
        d = 1 if x_arr.ndim == 1 else x_arr.shape[1]
        mean_known = check_finite_array(prior_mean, "prior_mean", ndim=(0, 1))
        mean_known = np.broadcast_to(mean_known, (d,)) if mean_known.ndim == 0 else mean_known
        if mean_known.shape != (d,):
            raise ValueError(f"prior_mean must be a scalar or have shape ({d},), "
                             f"got {mean_known.shape}")
    sd_known = None if prior_sd is None else check_nonnegative_scalar(prior_sd, "prior_sd")
    return x_arr, s_arr, mean_known, sd_known


def _weighted_mean(x2, s2, tau2):
    w = 1.0 / (tau2 + s2)
    return (w @ x2) / w.sum()


def _normal_loglik(x2, s2, mu, tau2):
    d = x2.shape[1]
    v = tau2 + s2
    rss = np.sum((x2 - mu) ** 2, axis=1)
    return float(-0.5 * np.sum(d * np.log(2 * np.pi * v) + rss / v))


def _profile_mle_tau2(x2, s2, mean_known):
    """Maximize the marginal likelihood over tau = sigma_theta >= 0 (mu profiled out)."""
    def negloglik(tau):
        tau2 = tau * tau
        mu = mean_known if mean_known is not None else _weighted_mean(x2, s2, tau2)
        return -_normal_loglik(x2, s2, mu, tau2)

    spread = float(np.sqrt(np.mean((x2 - x2.mean(axis=0)) ** 2)))
    upper = 10.0 * spread + 10.0 * float(np.sqrt(s2.max()))
    opt = optimize.minimize_scalar(negloglik, bounds=(0.0, upper), method="bounded",
                                   options={"xatol": 1e-10 * max(upper, 1e-300)})
    tau = float(opt.x)
    at_zero = negloglik(0.0) <= opt.fun
    if at_zero:
        tau = 0.0
    info = {"converged": bool(opt.success), "at_zero": bool(at_zero),
            "at_upper": bool(np.isclose(tau, upper))}
    return tau * tau, info
