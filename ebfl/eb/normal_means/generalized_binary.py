r"""The generalized binary prior: g = (1 - pi) delta_0 + pi N+(mu, (ratio mu)^2).

N+(mu, sigma^2) is the normal N(mu, sigma^2) conditioned on theta >= 0 (Liu,
Carbonetto, Willwerscheid, Oakes, Macdonald & Stephens, 2023, "Dissecting
tumor transcriptional heterogeneity from single-cell RNA-seq data by
generalized binary covariance decomposition"). With the sd a fixed small
fraction ``ratio`` of the mode mu, the posterior shrinks each theta_i towards
0 or towards mu: an "on/off" effect.

The fit maximizes the marginal log-likelihood over pi in [0, 1] and (when the
mode is estimated) over mu > 0. For a fixed mu, the log-likelihood
sum_i log((1 - pi) f0_i + pi f1_i) is concave in pi, and its derivative is
monotone: its root is found by Brent's method (or pi sits at 0 or 1 when the
derivative has one sign there). The profile in mu can have several local
maxima (a bump of small effects and one of large ones): a scan over a
geometric grid of mu and over the positive quantiles of x finds the best basin,
and a bounded search between the scan's neighbours refines it, so the estimate
is never below the fit at any scanned mode.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from ebfl.eb.normal_means.grid import FINE_RATIO, FINE_WIDTH, Rows, cells
from ebfl.eb.normal_means.prior import NormalMeansPrior

__all__ = ["CELLS_ABOVE", "DEFAULT_RATIO", "fit_generalized_binary", "generalized_binary_prior"]

#: The sd of the slab as a fraction of its mode (ebnm's default): the slab is tight
#: around mu, so the posterior separates "off" (0) from "on" (about mu).
DEFAULT_RATIO = 0.1

#: Observations above which the fit runs on fine cells of (x, s).
CELLS_ABOVE = 200_000
#: Steps of the geometric scan over mu, per factor of e.
_SCAN_PER_E = 4


def generalized_binary_prior(pi, mode, ratio=DEFAULT_RATIO):
    """(1 - pi) delta_0 + pi N+(mode, (ratio mode)^2) as a :class:`NormalMeansPrior`."""
    return NormalMeansPrior([1 - pi, pi], ["normal", "tnormal+"], [0.0, mode],
                            [0.0, ratio * mode], "generalized_binary",
                            {"pi": float(pi), "mode": float(mode), "ratio": float(ratio)})


def _log_densities(x, s, mode, ratio):
    """log f0 (the point mass at 0) and log f1 (the slab) at every x_i, (2, n)."""
    g = NormalMeansPrior([0.5, 0.5], ["normal", "tnormal+"], [0.0, mode], [0.0, ratio * mode])
    return g.log_component_density(x, s).T


def _best_weight(l0, l1, count=None):
    """argmax over pi in [0, 1] of sum_i c_i log((1 - pi) e^l0_i + pi e^l1_i), and the
    max (c_i: the rows' counts, default 1).

    The derivative sum_i (r_i - 1) / (1 - pi + pi r_i), r_i = e^(l1_i - l0_i), falls
    with pi (the objective is concave): written with e^(-|d|) it never overflows.
    """
    d = l1 - l0
    pos = d > 0
    e = np.exp(-np.abs(d))
    count = np.ones(d.size) if count is None else count

    def slope(pi):
        # d > 0: (1 - e^-d) / (pi + (1 - pi) e^-d); d <= 0: (e^d - 1) / (1 - pi + pi e^d)
        num = np.where(pos, 1.0 - e, e - 1.0)
        den = np.where(pos, pi + (1.0 - pi) * e, 1.0 - pi + pi * e)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # a subnormal den overflows the ratio: +inf, the true slope's sign and size
            return float(count @ np.where(den > 0, num / den,
                                          np.where(num > 0, np.inf, 0.0)))

    if slope(0.0) <= 0:
        pi = 0.0
    elif slope(1.0) >= 0:
        pi = 1.0
    else:
        pi = optimize.brentq(slope, 0.0, 1.0, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    with np.errstate(divide="ignore"):
        ll = np.logaddexp(l0 + math.log1p(-pi) if pi < 1 else -np.inf,
                          l1 + math.log(pi) if pi > 0 else -np.inf)
    return pi, float(count @ ll)


def fit_generalized_binary(x, s, mode, ratio):
    """Fit the generalized binary prior to checked data.

    Parameters
    ----------
    x, s : ndarray (n,)
    mode : float > 0 or "estimate"
        The slab's mode mu (the point mass stays at 0).
    ratio : float > 0
        The slab's sd over its mode.

    Returns
    -------
    (NormalMeansPrior, dict)
        The prior and its diagnostics (``converged``, ``at_bound``, ``mode``,
        ``n_evaluations``).
    """
    fits = {}
    converged = True
    # Beyond CELLS_ABOVE observations the profile is computed on fine cells of (x, s)
    # (the fit is the cells' optimum; the log-likelihood and posteriors reported are
    # the data's).
    rows = Rows(x, s)
    if x.size > CELLS_ABOVE:
        rows = cells(x, s, FINE_WIDTH, FINE_RATIO) or rows

    def negll(log_mu):
        mu = math.exp(float(log_mu))
        if mu not in fits:
            fits[mu] = _best_weight(*_log_densities(rows.x, rows.s, mu, ratio), rows.count)
        return -fits[mu][1]

    if not isinstance(mode, str):
        negll(math.log(mode))
        lo = hi = math.log(mode)
    else:
        # mu from far below the smallest s (the slab then sits on the point mass) to
        # twice the largest x: beyond, the slab explains no observation better.
        lo = math.log(float(np.min(s)) * 1e-3)
        hi = math.log(2 * max(float(np.max(x)), float(np.max(s))))
        scan = np.linspace(lo, hi, int(math.ceil((hi - lo) * _SCAN_PER_E)) + 1)
        positive = x[x > 0]
        if positive.size:
            scan = np.union1d(scan, np.log(np.quantile(positive, np.linspace(0.05, 1, 20))))
        scan = scan[(scan >= lo) & (scan <= hi)]
        for v in scan:
            negll(v)
        best = math.log(min(fits, key=lambda m: -fits[m][1]))
        i = int(np.searchsorted(scan, best))
        left, right = scan[max(i - 1, 0)], scan[min(i + 1, scan.size - 1)]
        if right > left:
            res = optimize.minimize_scalar(negll, bounds=(left, right), method="bounded",
                                           options={"xatol": 1e-8})
            negll(res.x)
            converged = bool(res.success)
    mu = min(fits, key=lambda m: -fits[m][1])
    pi = fits[mu][0]
    log_mu = math.log(mu)
    at_bound = bool(pi in (0.0, 1.0) or (isinstance(mode, str)
                                         and (log_mu <= lo + 1e-9 or log_mu >= hi - 1e-9)))
    diag = {"converged": converged, "at_bound": at_bound, "mode": float(mu),
            "n_evaluations": len(fits)}
    if rows.count is not None:
        diag["n_cells"] = int(rows.x.size)
    return generalized_binary_prior(pi, mu, ratio), diag
