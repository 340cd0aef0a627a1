r"""Efron's g-modeling ("deconvolver"): a smooth prior on a grid of atoms, for any s.

g puts weight pi_j on each atom mu_j of an equally spaced grid, and
log pi = Q alpha - log sum exp(Q alpha), with Q a natural cubic spline basis of
``DEGREES`` columns over the grid (Efron, 2016, "Empirical Bayes deconvolution
estimates", Biometrika 103: 1-20). alpha maximizes the penalized marginal
log-likelihood

    sum_i log sum_j pi_j N(x_i; mu_j, s_i^2) - c0 ||alpha||_2,

which keeps g smooth where the NPMLE is spiky. R's ebnm offers this family for
z-scores only (s = 1); here each x_i has its own s_i.

The objective is not concave in alpha, so it is maximized from several starts
(BFGS with the exact gradient Q'(G * pi - n pi), G_j = sum_i L_ij / f_i); the
best end point wins and ``converged`` says whether its gradient vanished.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ebfl.eb.normal_means.grid import FINE_RATIO, FINE_WIDTH, Rows, cells
from ebfl.eb.normal_means.prior import NormalMeansPrior

__all__ = ["CELLS_ABOVE", "DEGREES", "PENALTY", "fit_deconvolver", "natural_spline_basis"]

#: Columns of the spline basis (degrees of freedom of log g, as in Efron's examples).
DEGREES = 5
#: c0, the weight of the penalty on ||alpha||.
PENALTY = 1.0
#: Entries of the likelihood matrix above which the fit runs on cells of (x, s).
CELLS_ABOVE = 50_000_000
#: The default grid: atoms a quarter of the smallest s apart, 50 to 200 of them.
_GRID_MIN, _GRID_MAX = 50, 200


def natural_spline_basis(t, df=DEGREES):
    """A natural cubic spline basis of ``df`` columns on the points ``t``, standardized.

    The textbook truncated-power form (Hastie, Tibshirani & Friedman, 2009, eqs.
    5.4-5.5) with ``df + 1`` equally spaced knots from min(t) to max(t), without
    its constant column (a constant in log g cancels in the normalization), each
    column centred and the columns orthonormalized over ``t``, so that the penalty
    treats them alike. Written out because it is ten lines and scipy has B-splines but no
    natural-spline basis.
    """
    t = np.asarray(t, float)
    knots = np.linspace(t.min(), t.max(), df + 1)

    def d(k):
        return ((np.maximum(t - knots[k], 0.0) ** 3 - np.maximum(t - knots[-1], 0.0) ** 3)
                / (knots[-1] - knots[k]))

    cols = [t] + [d(k) - d(df - 1) for k in range(df - 1)]
    q = np.column_stack(cols)
    # Centred, then orthonormalized (QR): the penalty c0 ||alpha|| then measures log g's
    # departure from flat in one unit whatever the grid's range, and BFGS sees a
    # well-conditioned problem.
    return np.linalg.qr(q - q.mean(axis=0))[0]


def default_grid(x, s, spacing=None):
    """Equally spaced atoms over [min x, max x], ``spacing`` apart (default: a quarter
    of the smallest s, between 50 and 200 atoms)."""
    lo, hi = float(np.min(x)), float(np.max(x))
    if hi == lo:
        hi, lo = hi + float(np.min(s)), lo - float(np.min(s))
    if spacing is None:
        count = int(min(max(math.ceil((hi - lo) / (float(np.min(s)) / 4)) + 1, _GRID_MIN),
                        _GRID_MAX))
        return np.linspace(lo, hi, count)
    count = int(math.floor((hi - lo) / spacing)) + 1
    if count > 10**4:
        raise ValueError(f"scale (the deconvolver's grid spacing) {spacing:g} would make "
                         f"{count} atoms over [{lo:g}, {hi:g}]; the most is 10000")
    return lo + spacing * np.arange(max(count, 2))


def fit_deconvolver(x, s, scale, *, penalty=PENALTY):
    """Fit Efron's log-spline prior to checked data.

    Parameters
    ----------
    x, s : ndarray (n,)
    scale : "estimate" or float > 0
        The spacing of the grid of atoms.
    penalty : float
        c0.

    Returns
    -------
    (NormalMeansPrior, dict)
        Atoms (normal components of sd 0) and their weights; the diagnostics
        (``converged``, ``at_bound`` False, ``penalized_log_likelihood``,
        ``alpha``, ``grid_size``).
    """
    grid = default_grid(x, s, None if isinstance(scale, str) else scale)
    q = natural_spline_basis(grid)
    n = x.size
    # Beyond CELLS_ABOVE entries the likelihood is that of cells of (x, s) (the fit is
    # the cells' optimum; the log-likelihood and posteriors reported are the data's).
    rows = Rows(x, s)
    if x.size * grid.size > CELLS_ABOVE:
        rows = cells(x, s, FINE_WIDTH, FINE_RATIO) or rows
    count = np.ones(rows.x.size) if rows.count is None else rows.count
    xr, sr = rows.x, rows.s
    log_lik = -0.5 * ((xr[:, None] - grid[None]) ** 2 / sr[:, None] ** 2
                      + np.log(2 * math.pi * sr[:, None] ** 2))
    top = log_lik.max(axis=1)
    lik = np.exp(log_lik - top[:, None])
    base = float(count @ top)

    def weights(alpha):
        eta = q @ alpha
        eta = eta - eta.max()
        w = np.exp(eta)
        return w / w.sum()

    def objective(alpha):
        pi = weights(alpha)
        f = lik @ pi
        norm = math.sqrt(float(alpha @ alpha))
        if np.all(f > 1e-280):
            value = -(base + float(count @ np.log(f))) + penalty * norm
            g_pi = (lik.T @ (count / f)) * pi
        else:
            # Some row's mixture underflows (BFGS tried a g concentrated far from it):
            # the same quantities in log space
            with np.errstate(divide="ignore"):
                joint = log_lik + np.log(pi)[None]
            log_f = special.logsumexp(joint, axis=1)
            value = -float(count @ log_f) + penalty * norm
            g_pi = count @ np.exp(joint - log_f[:, None])
        grad = -(q.T @ (g_pi - n * pi))
        if norm > 0:
            grad = grad + penalty * alpha / norm
        return value, grad

    best = None
    rng = np.random.default_rng(0)  # fixed starts: the fit is deterministic
    starts = [np.full(q.shape[1], 0.01)] + [rng.normal(0, 1, q.shape[1]) for _ in range(3)]
    for a0 in starts:
        res = optimize.minimize(objective, a0, jac=True, method="BFGS",
                                options={"gtol": 1e-7 * max(n, 1), "maxiter": 2000})
        if best is None or res.fun < best.fun:
            best = res
    alpha = best.x
    value, grad = objective(alpha)
    # alpha = 0 (a flat g on the grid) is the penalty's kink: an optimum there when the
    # likelihood's own slope is within the penalty's, ||grad(-loglik)(0)|| <= c0 (a
    # subgradient is 0); BFGS only creeps towards it.
    zero = np.zeros_like(alpha)
    value0, slope0 = objective(zero)  # at 0 the gradient is the likelihood's alone
    kink = float(np.linalg.norm(slope0)) <= penalty
    if kink and value0 <= value + 1e-9 * (1 + abs(value)):
        alpha, value, converged = zero, value0, True
    else:
        # away from the kink the fit has converged when its gradient vanishes (relative
        # to n)
        converged = bool(best.success or np.max(np.abs(grad)) <= 1e-5 * max(n, 1))
    pi = weights(alpha)
    g = NormalMeansPrior(pi, ["normal"] * grid.size, grid, np.zeros(grid.size), "deconvolver")
    return g, {"converged": converged, "at_bound": False,
               "penalized_log_likelihood": float(-value),
               "alpha": [float(v) for v in alpha], "grid_size": int(grid.size),
               **({} if rows.count is None else {"n_cells": int(rows.x.size)})}
