r"""Nonparametric MLE of the population prior on a grid (Kiefer-Wolfowitz NPMLE).

Client ``i`` reports data with likelihood p(y_i | theta_i), and the theta_i are
drawn from an unknown prior g. The NPMLE maximizes the marginal log-likelihood

.. math:: \ell(g) = \sum_i c_i \log \int p(y_i \mid \theta)\, dg(\theta)

over *all* distributions g; restricted to distributions on a fine grid
u_1 < ... < u_K it is the convex problem (Koenker & Mizera 2014)

.. math:: \max_{w \in \Delta_K} \sum_i c_i \log (L w)_i, \qquad L_{ik} = p(y_i \mid u_k),

where c_i are multiplicities (1, or bin counts). It is solved here by the
sequential quadratic programming method of Kim, Carbonetto, Stephens & Anitescu
(2020, "mix-SQP"), which converges in tens of iterations where EM needs
thousands: each iteration minimizes the quadratic model of the relaxed objective
-(1/N) sum_i c_i log (Lx)_i + sum_k x_k over x >= 0 (whose minimizer sums to 1),
then backtracks along the step.

Convergence is *certified*: with r_k = (1/N) sum_i c_i L_ik / (Lw)_i, concavity
gives ell(w*) - ell(w) <= N (max_k r_k - 1) for the grid optimum w*, and the
reported ``kkt = max_k r_k - 1`` is driven below ``tol``.

Why hand-written: REBayes (R) calls the commercial Mosek solver and mixsqp
exists only for R; no maintained Python package solves this problem. The
nonnegative QP inside each step is a warm-started Lawson-Hanson active-set
method (see :func:`_nonnegative_qp` for why not :func:`scipy.optimize.nnls`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy import linalg, special

from ebfl._validation import (
    INT64_MAX,
    check_finite_array,
    check_int_scalar,
    check_positive_scalar,
    check_standard_errors,
)
from ebfl.eb import _kernels
from ebfl.eb.beta_binomial import _counts_iv
from ebfl.eb.results import _freeze

__all__ = ["NPMLEResult", "npmle_binomial", "npmle_normal"]

#: Rows per block when accumulating the Hessian: bounds the extra memory to
#: HESSIAN_BLOCK_ROWS * K doubles while keeping the BLAS call efficient.
HESSIAN_BLOCK_ROWS = 8192
#: Blocks of rows for the gradient kernel; fixed, so results do not depend on
#: the number of threads.
GRADIENT_BLOCKS = 64
#: Armijo constant and smallest step of the backtracking line search.
ARMIJO = 0.01
MIN_STEP = 1e-10
#: Optimality tolerance of the quadratic subproblem on its dual (gradient units).
QP_DUAL_TOL = 1e-13
#: Largest |x| and |grid point| of a normal fit: squared differences stay finite.
MAX_ABS = 1e150
#: Largest distance, in standard errors, from an observation to its nearest grid
#: point: z^2 / 2 overflows beyond ~1.3e154.
MAX_Z = 1e150


@dataclass(frozen=True)
class NPMLEResult:
    """Fitted grid prior and the posteriors it implies.

    Attributes
    ----------
    grid : ndarray of shape (K,)
        Support points u_k of the prior.
    weights : ndarray of shape (K,)
        Prior probabilities w_k (>= 0, summing to 1); most are ~0.
    log_likelihood : float
        Marginal log-likelihood of the data under the fitted prior (with the
        normal constant / binomial coefficients, so it is comparable with
        :func:`~ebfl.eb.gaussian_eb` and :func:`~ebfl.eb.beta_binomial_eb`).
        For a binned fit it is evaluated on the original, unbinned data.
    posterior_mean, posterior_var : ndarray of shape (n,)
        Posterior mean (the plug-in Bayes estimate) and variance of every
        theta_i under the fitted prior.
    kkt : float
        max_k r_k - 1 >= 0 at the solution; ``n * kkt`` bounds how far the
        (binned) log-likelihood is below the grid optimum.
    n_iter : int
        SQP iterations.
    converged : bool
        Whether ``kkt <= tol`` was reached.
    likelihood : str
        ``"normal"`` or ``"binomial"``.
    diagnostics : mapping
        ``n_rows`` (rows of L after binning/compression), ``history``
        (log-likelihood per iteration, on the rows fitted) and, when binned,
        ``binned_log_likelihood``.
    """

    grid: np.ndarray
    weights: np.ndarray
    log_likelihood: float
    posterior_mean: np.ndarray
    posterior_var: np.ndarray
    kkt: float
    n_iter: int
    converged: bool
    likelihood: str
    diagnostics: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        _freeze(self.grid, self.weights, self.posterior_mean, self.posterior_var)

    @property
    def prior_mean(self) -> float:
        """Mean of the fitted prior, sum_k w_k u_k."""
        return float(self.weights @ self.grid)

    @property
    def prior_var(self) -> float:
        """Variance of the fitted prior."""
        return float(self.weights @ (self.grid - self.prior_mean) ** 2)

    def support(self, threshold=1e-6):
        """Grid points carrying prior mass above ``threshold``, and their weights.

        Parameters
        ----------
        threshold : float
            Smallest weight kept, > 0.

        Returns
        -------
        atoms, weights : ndarray
        """
        threshold = check_positive_scalar(threshold, "threshold")
        keep = self.weights > threshold
        return self.grid[keep].copy(), self.weights[keep].copy()

    def prior_cdf(self, t):
        """Fitted prior CDF G(t) = sum_{u_k <= t} w_k at the points ``t``."""
        t = check_finite_array(t, "t", ndim=(0, 1), min_len=0)
        order = np.argsort(self.grid)
        cum = np.cumsum(self.weights[order])
        idx = np.searchsorted(self.grid[order], t, side="right")
        return np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0.0)


def npmle_normal(x, s, *, grid=None, n_grid=300, bins=None, tol=1e-8, max_iter=100):
    r"""NPMLE of the prior of theta_i from x_i ~ N(theta_i, s_i^2), s_i known.

    Parameters
    ----------
    x : array_like, shape (n,)
        Observations (client means xbar_i), finite, each |x_i| <= 1e150.
    s : float or array_like, shape (n,)
        Their standard errors, in [1e-150, 1e150] (heteroskedastic allowed).
    grid : array_like, shape (K,), optional
        Support points, each |u_k| <= 1e150; every x_i must lie within 1e150
        s_i of one. Default: ``n_grid`` equally spaced points from min(x) to
        max(x) (the NPMLE's support lies in that range).
    n_grid : int
        Size of the default grid, >= 2.
    bins : int, optional
        Homoskedastic data only (scalar or constant ``s``): replace the n
        observations by the midpoints of ``bins`` equal-width bins on
        [min(x), max(x)] with their counts. The fit then costs O(bins * K)
        per iteration instead of O(n * K); each x moves by at most half a bin
        width. Posterior means and ``log_likelihood`` still use the exact x.
    tol : float
        Stop when the certified gap ``kkt`` (see :class:`NPMLEResult`) is <= tol.
    max_iter : int
        Largest number of SQP iterations.

    Returns
    -------
    NPMLEResult

    Notes
    -----
    The n x K likelihood matrix is stored: 8 n K bytes (240 MB for n = 10^5,
    K = 300). Use ``bins`` for larger homoskedastic data.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> theta = rng.choice([-2.0, 2.0], size=2000)
    >>> fit = npmle_normal(theta + rng.standard_normal(2000), 1.0)
    >>> fit.converged, round(float(fit.prior_cdf(0.0)), 2)  # share of clients below 0
    (True, 0.47)
    >>> float(np.abs(fit.posterior_mean - theta).mean()) < 0.5
    True
    """
    x = check_finite_array(x, "x", ndim=1, max_abs=MAX_ABS)
    s_full = check_standard_errors(s, "s", x.size)
    grid = _grid_iv(grid, n_grid, float(x.min()), float(x.max()))
    _check_reach(x, s_full, grid)
    tol = check_positive_scalar(tol, "tol")
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)

    if bins is None:
        x_fit, s_fit, counts = x, s_full, np.ones(x.size)
    else:
        bins = check_int_scalar(bins, "bins", minimum=2)
        if np.ptp(s_full) != 0:
            raise ValueError("bins needs homoskedastic data (one value of s); "
                             "got standard errors that differ")
        x_fit, counts = _bin(x, bins)
        s_fit = np.full(x_fit.size, s_full[0])

    lik, shift = _kernels._normal_likelihood_matrix(x_fit, s_fit, grid)
    weights, info = _mix_sqp(lik, counts, shift, tol, max_iter)

    with np.errstate(divide="ignore"):
        log_w = np.log(weights)
    mean, var, loglik = _kernels._normal_grid_posterior(x, s_full, grid, log_w)
    diagnostics = {"n_rows": x_fit.size, "history": info["history"]}
    if bins is not None:
        diagnostics["binned_log_likelihood"] = info["history"][-1]
    return _result(grid, weights, float(np.sum(loglik)), mean, var, info, "normal",
                   diagnostics)


def npmle_binomial(successes, trials, *, grid=None, n_grid=300, tol=1e-8, max_iter=100):
    r"""NPMLE of the prior of p_i from z_i ~ Binomial(n_i, p_i) (Bernoulli clients).

    The nonparametric counterpart of :func:`~ebfl.eb.beta_binomial_eb`: no
    Beta shape is assumed, so bimodal or clustered populations are recovered.
    Clients with the same (n_i, z_i) share a row of the likelihood, so the cost
    per iteration is O(#distinct pairs * K).

    Parameters
    ----------
    successes, trials : array_like of int, shape (m,)
        z_i and n_i >= 1 with z_i <= n_i.
    grid : array_like, shape (K,), optional
        Support points in [0, 1]. Default: ``n_grid`` equally spaced points
        from 0 to 1.
    n_grid : int
        Size of the default grid, >= 2.
    tol, max_iter
        As in :func:`npmle_normal`.

    Returns
    -------
    NPMLEResult
        ``log_likelihood`` includes the binomial coefficients, as
        :func:`~ebfl.eb.beta_binomial_eb` does.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> p = rng.choice([0.2, 0.8], size=3000)
    >>> fit = npmle_binomial(rng.binomial(20, p), np.full(3000, 20))
    >>> atoms, w = fit.support(0.05)
    >>> float(np.abs(fit.posterior_mean - p).mean()) < 0.05
    True
    """
    z, n = _counts_iv(successes, trials)
    grid = _grid_iv(grid, n_grid, 0.0, 1.0)
    if np.any((grid < 0) | (grid > 1)):
        raise ValueError("grid points must lie in [0, 1] for a binomial likelihood")
    tol = check_positive_scalar(tol, "tol")
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)

    keys, inverse, counts = np.unique(np.stack([n, z], axis=1), axis=0, return_inverse=True,
                                      return_counts=True)
    nu, zu = keys[:, 0].astype(np.float64), keys[:, 1].astype(np.float64)
    log_lik = (special.gammaln(nu + 1) - special.gammaln(zu + 1) - special.gammaln(nu - zu + 1)
               )[:, None] + special.xlogy(zu[:, None], grid) + special.xlog1py(
                   (nu - zu)[:, None], -grid)
    shift = log_lik.max(axis=1)
    lik = np.exp(log_lik - shift[:, None])
    counts = counts.astype(np.float64)
    weights, info = _mix_sqp(lik, counts, shift, tol, max_iter)

    joint = lik * weights
    f = joint.sum(axis=1)
    mean_u = joint @ grid / f
    var_u = np.sum(joint * (grid - mean_u[:, None]) ** 2, axis=1) / f
    inverse = inverse.reshape(-1)
    loglik = float(counts @ (shift + np.log(f)))
    return _result(grid, weights, loglik, mean_u[inverse], var_u[inverse], info, "binomial",
                   {"n_rows": nu.size, "history": info["history"]})


def _grid_iv(grid, n_grid, low, high):
    if grid is not None:
        return check_finite_array(grid, "grid", ndim=1, max_abs=MAX_ABS).astype(np.float64,
                                                                                copy=True)
    n_grid = check_int_scalar(n_grid, "n_grid", minimum=2, maximum=INT64_MAX)
    return np.linspace(low, high, n_grid)


def _check_reach(x, s, grid):
    """Every x_i must lie within MAX_Z standard errors of some grid point.

    Otherwise (x_i - u)^2 / s_i^2 overflows for every u, the row's likelihood
    is 0 under every grid prior and the fit is undefined (NaN).
    """
    order = np.sort(grid)
    pos = np.searchsorted(order, x)
    below = np.abs(x - order[np.maximum(pos - 1, 0)])
    above = np.abs(x - order[np.minimum(pos, order.size - 1)])
    reach = np.minimum(below, above) / s
    if np.any(reach > MAX_Z):
        i = int(np.argmax(reach))
        raise ValueError(f"x[{i}] = {x[i]!r} lies {reach[i]:.3g} standard errors s from the "
                         f"nearest grid point; the normal likelihood needs at most {MAX_Z:g} "
                         "(widen grid, or check x and s)")


def _bin(x, bins):
    """Midpoints of the non-empty equal-width bins on [min x, max x] and their counts."""
    counts, edges = np.histogram(x, bins=bins)
    mids = 0.5 * (edges[:-1] + edges[1:])
    keep = counts > 0
    return mids[keep], counts[keep].astype(np.float64)


def _result(grid, weights, loglik, mean, var, info, likelihood, diagnostics):
    diagnostics["history"] = np.asarray(diagnostics["history"])
    _freeze(diagnostics["history"])
    return NPMLEResult(grid, weights, loglik, mean, var, info["kkt"], info["n_iter"],
                       info["converged"], likelihood, MappingProxyType(diagnostics))


def _gradient(lik, x, counts):
    n_blocks = min(GRADIENT_BLOCKS, lik.shape[0])
    return _kernels._mixture_gradient(lik, x, counts, n_blocks)


def _hessian(lik, x, counts, total):
    """H = (1/N) L^T diag(c / f^2) L with f = L x, accumulated over row blocks."""
    k = lik.shape[1]
    hess = np.zeros((k, k))
    for start in range(0, lik.shape[0], HESSIAN_BLOCK_ROWS):
        block = lik[start:start + HESSIAN_BLOCK_ROWS]
        scale = np.sqrt(counts[start:start + HESSIAN_BLOCK_ROWS]) / (block @ x)
        a = block * scale[:, None]
        hess += a.T @ a
    return hess / total


def _nonnegative_qp(hess, b, start, dual_tol=QP_DUAL_TOL):
    """argmin_{y >= 0} y'Hy/2 + b'y by the Lawson-Hanson active-set method.

    Warm-started with the free set {k : start_k > 0}. Written out rather than
    calling :func:`scipy.optimize.nnls` because that routine fixes its own
    optimality tolerance relative to |H|, which stalls the outer iteration at
    kkt ~ 1e-8 for large n (H grows as the fitted density gets small somewhere).
    Here the dual H y + b is required to be >= -dual_tol, in the units of the
    outer gradient.
    """
    k = b.size
    ridge = 1e-12 * max(float(np.mean(np.diag(hess))), 1e-300)
    free = start > 0
    y = np.where(free, start, 0.0)  # feasible, positive on the free set
    for _ in range(3 * k + 10):
        # Solve on the free set; while that leaves y >= 0, step from y toward it
        # until a coordinate hits 0 and fix that coordinate at 0 (Lawson-Hanson).
        while free.any():
            idx = np.flatnonzero(free)
            sub = hess[np.ix_(idx, idx)] + ridge * np.eye(idx.size)
            z = linalg.solve(sub, -b[idx], assume_a="pos")
            if np.all(z > 0):
                y[:] = 0.0
                y[idx] = z
                break
            yi = y[idx]
            neg = z <= 0
            step = float(np.min(yi[neg] / (yi[neg] - z[neg])))
            yi = yi + step * (z - yi)
            hit = neg & (yi <= yi.max() * 1e-15)
            hit[np.flatnonzero(neg)[np.argmin(yi[neg])]] = True  # at least the blocking one
            y[idx] = np.where(hit, 0.0, yi)
            free[idx[hit]] = False
        dual = hess @ y + b
        dual[free] = np.inf
        j = int(np.argmin(dual))
        if dual[j] >= -dual_tol:
            return y
        free[j] = True
    warnings.warn("NPMLE quadratic subproblem: active-set iteration limit reached",
                  RuntimeWarning, stacklevel=4)
    return y


def _mix_sqp(lik, counts, shift, tol, max_iter):
    """mix-SQP (Kim et al. 2020) on the relaxed problem; returns normalized weights.

    Minimizes phi(x) = -(1/N) sum_i c_i log (L x)_i + sum_k x_k over x >= 0.
    """
    total = float(counts.sum())
    const = float(counts @ shift)
    k = lik.shape[1]
    x = np.full(k, 1.0 / k)
    history = []
    kkt = math.inf
    n_iter = 0
    while True:
        grad_sum, ll = _gradient(lik, x, counts)
        mass = float(x.sum())
        # Log-likelihood and KKT residual of the normalized weights w = x / sum(x).
        history.append(const + ll - total * math.log(mass))
        kkt = mass * float(grad_sum.max()) / total - 1.0
        if kkt <= tol or n_iter >= max_iter:
            break
        n_iter += 1
        grad = 1.0 - grad_sum / total
        hess = _hessian(lik, x, counts, total)
        y = _nonnegative_qp(hess, grad - hess @ x, x)
        step = y - x
        slope = float(grad @ step)
        if slope >= 0.0:
            break  # no descent direction left at double precision
        phi0 = -ll / total + mass
        # Rounding error of phi: near the optimum the decrease a step brings is
        # ~|grad|^2, below what double precision resolves, so decreases smaller
        # than this count as ties and the Newton step is taken (it drives kkt down).
        noise = 16.0 * np.finfo(float).eps * (abs(ll) / total + mass)
        alpha = 1.0
        while alpha >= MIN_STEP:
            trial = x + alpha * step
            f = lik @ trial
            if np.all(f > 0):
                phi = -float(counts @ np.log(f)) / total + float(trial.sum())
                if phi <= phi0 + ARMIJO * alpha * slope + noise:
                    break
            alpha *= 0.5
        if alpha < MIN_STEP:
            break  # no further progress possible at double precision
        x = np.maximum(trial, 0.0)
    converged = kkt <= tol
    if not converged:
        warnings.warn(f"NPMLE stopped after {n_iter} iterations with kkt={kkt:.3g} > tol={tol:g}"
                      " (the log-likelihood is within n*kkt of the grid optimum)",
                      RuntimeWarning, stacklevel=3)
    weights = x / x.sum()
    return weights, {"kkt": max(kkt, 0.0), "n_iter": n_iter, "converged": converged,
                     "history": history}
