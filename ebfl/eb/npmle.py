r"""Nonparametric MLE of the population prior on a grid (Kiefer-Wolfowitz NPMLE).

Client ``i`` reports data with likelihood p(y_i | theta_i), and the theta_i are
drawn from an unknown prior g. The NPMLE maximizes the marginal log-likelihood

.. math:: \ell(g) = \sum_i c_i \log \int p(y_i \mid \theta)\, dg(\theta)

over *all* distributions g; restricted to distributions on a fine grid
u_1 < ... < u_K it is the convex problem (Koenker & Mizera 2014)

.. math:: \max_{w \in \Delta_K} \sum_i c_i \log (L w)_i, \qquad L_{ik} = p(y_i \mid u_k),

where c_i are multiplicities (1, or bin counts). The weights are found by
:func:`ebfl.eb.mixsqp` (mix-SQP with a certificate of optimality: ``kkt``, over
the whole grid, is driven below ``tol``); this module builds the likelihood
matrix, compresses the rows and computes the posteriors:

* *Warm start.* With many rows, the normal problem is first solved on a
  coarse binning of the rows (x into bins half a grid spacing wide, s into
  geometric classes of ratio 1.25), the binomial one on every 4th grid point;
  the solution is already sparse, and mix-SQP on the exact problem then needs
  a few active-set iterations (4 on the P3 benchmark's 10^5 observations,
  where R's mixsqp takes 26 dense ones).
* *Binning* (``bins``): rows replaced by cells of (x, s) with a certified bound
  on the change of every observation's log-likelihood (see :func:`npmle_normal`).
* The posterior pass visits only the atoms with w_k > 0. The n-sized work is in
  Numba kernels (the private ``ebfl.eb._npmle_kernels``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy import special

from ebfl._validation import (
    INT64_MAX,
    check_finite_array,
    check_int_scalar,
    check_positive_scalar,
    check_standard_errors,
)
from ebfl.eb import _mixsqp_kernels, _npmle_kernels
from ebfl.eb.beta_binomial import check_binomial_counts
from ebfl.eb.mixture_weights import MAX_ITER, PARALLEL_MIN_WORK, _mix_sqp, _row_blocks, _threads_for
from ebfl.eb.results import _freeze

__all__ = ["NPMLEResult", "normal_grid_posterior", "npmle_binomial", "npmle_normal"]

#: Largest |x| and |grid point| of a normal fit: squared differences stay finite.
MAX_ABS = 1e150
#: Largest distance, in standard errors, from an observation to its nearest grid
#: point: z^2 / 2 overflows beyond ~1.3e154.
MAX_Z = 1e150
#: The most grid points and equal-width bins: finer adds nothing a user can see, and
#: the arrays they need would no longer fit in memory.
MAX_GRID = 10**6
MAX_BINS = 10**7
#: Warm start: ratio of neighbouring classes of s and the kkt to which the coarse
#: problem is solved (a start, not an answer: it needs no certificate).
WARM_CLASS_RATIO = 1.25
WARM_TOL = 1e-6
WARM_MAX_ITER = 50
#: Step of the coarse grid that warm-starts a fit whose rows cannot be binned.
WARM_GRID_STEP = 4
#: The warm start is used when the coarse problem has at most this share of the rows.
WARM_MAX_SHARE = 0.5
#: Default per-observation budget of ``bins="auto"`` (nats). The bound holds for every
#: prior on the grid, point masses at its far end included, so it is conservative:
#: on the P3 data (n = 10^6) a budget of 3 gives 32,000 cells and a realized loss of
#: the fitted prior of 0.04 nats in all, against E = 2.8e5.
BIN_ERROR = 3.0
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
#: Entries (rows x atoms) of one chunk of the posterior pass (16 MB).
POSTERIOR_CHUNK_CELLS = 1 << 21
#: Largest number of cells of a dense (x, s) binning table (unless it is below n / 2);
#: beyond it cells are found by sorting their keys.
MAX_DENSE_CELLS = 1 << 22


@dataclass(frozen=True)
class NPMLEResult:
    """Fitted grid prior and the posteriors it implies.

    Attributes
    ----------
    grid : ndarray of shape (K,)
        Support points u_k of the prior.
    weights : ndarray of shape (K,)
        Prior probabilities w_k (>= 0, summing to 1); most are exactly 0.
    log_likelihood : float
        Marginal log-likelihood of the data under the fitted prior (with the
        normal constant / binomial coefficients, so it is comparable with
        :func:`~ebfl.eb.gaussian_eb` and :func:`~ebfl.eb.beta_binomial_eb`).
        For a binned fit it is evaluated on the original, unbinned data.
    posterior_mean, posterior_var : ndarray of shape (n,)
        Posterior mean (the plug-in Bayes estimate) and variance of every
        theta_i under the fitted prior.
    kkt : float
        max_k r_k - 1 >= 0 at the solution, over the whole grid; ``n * kkt``
        bounds how far the log-likelihood of the rows fitted (the binned rows
        when binned) is below their grid optimum.
    n_iter : int
        Iterations (mix-SQP steps and mass moves, one pass over L each).
    converged : bool
        Whether ``kkt <= tol`` was reached (always, unless ``max_iter`` stopped the fit
        or ``tol`` is below what double precision resolves; a warning says which).
    likelihood : str
        ``"normal"`` or ``"binomial"``.
    diagnostics : mapping
        ``n_rows`` (rows of L after binning/compression), ``history``
        (log-likelihood per iteration, on the rows fitted),
        ``log_likelihood_gap_bound`` (the grid optimum exceeds ``log_likelihood``
        by at most this: ``n * kkt`` for an exact fit) and, when binned,
        ``binned_log_likelihood`` (on the rows fitted), ``binning_error_bound``
        (E = sum_i r_i: ``|ell_binned(g) - ell(g)| <= E`` for every prior g on the
        grid) and ``binning_error_max`` (max_i r_i); see :func:`npmle_normal`.
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

    def __repr__(self):
        return (f"NPMLEResult(likelihood={self.likelihood!r}, n={self.posterior_mean.size}, "
                f"grid={self.grid.size} points, {int(np.sum(self.weights > 0))} with weight, "
                f"log_likelihood={self.log_likelihood:.6g}, kkt={self.kkt:.3g}, "
                f"converged={self.converged})")

    def to_frame(self):
        """One row per observation: its posterior mean and sd under the fitted prior."""
        import pandas as pd

        return pd.DataFrame({"posterior_mean": self.posterior_mean,
                             "posterior_sd": np.sqrt(self.posterior_var)})

    def plot(self, x, trials=None, path=None):
        """The fitted grid prior's atoms over the observations, and their shrinkage.

        Left: a histogram of the observations (shares per bin) with a stem at every
        grid point of positive weight (its mass). Right: the posterior means against
        the observations, with the identity line (no shrinkage) and the prior mean.

        Parameters
        ----------
        x : array_like of shape (n,)
            What this result was fitted to (a result keeps no copy of it): the
            observations x of :func:`npmle_normal`, or the successes of
            :func:`npmle_binomial`, whose observations are successes / trials.
        trials : array_like of int, shape (n,), optional
            The trials of a binomial fit; refused for a normal one.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            Two axes, on a pyplot figure (``plt.show()`` shows it; ``plt.close(fig)``
            frees it).

        Examples
        --------
        >>> rng = np.random.default_rng(0)
        >>> x = rng.choice([-2.0, 2.0], 300) + rng.normal(size=300)
        >>> fit = npmle_normal(x, 1.0, n_grid=50)
        >>> fig = fit.plot(x)
        >>> len(fig.axes)
        2
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl.eb._plots import plot_npmle

        return plot_npmle(self, x, trials, path)

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


def npmle_normal(x, s, *, grid=None, n_grid=300, bins=None, bin_error=BIN_ERROR, tol=1e-8,
                 max_iter=MAX_ITER):
    r"""NPMLE of the prior of :math:`\theta_i` from :math:`x_i \sim N(\theta_i, s_i^2)`, known s.

    Parameters
    ----------
    x : array_like, shape (n,)
        Observations (client means xbar_i), finite, each ``|x_i| <= 1e150``.
    s : float or array_like, shape (n,)
        Their standard errors, in [1e-150, 1e150] (heteroskedastic allowed).
    grid : array_like, shape (K,), optional
        Strictly increasing support points (at most 10^6), each
        ``|u_k| <= 1e150``; every x_i must lie within 1e150 s_i of one.
        Default: ``n_grid`` equally spaced points from min(x) to max(x) (the
        NPMLE's support lies in that range).
    n_grid : int
        Size of the default grid, 2 to 10^6.
    bins : None, int or "auto"
        None: fit the n observations exactly (n x K likelihood matrix).
        An int in [2, 10^7] (homoskedastic data only: scalar or constant ``s``): replace the
        observations by the midpoints of ``bins`` equal-width bins on
        [min(x), max(x)] with their counts. ``"auto"``: replace them by cells of
        (x, s) chosen so that no observation's log-likelihood moves by more than
        ``bin_error`` under *any* prior on the grid (see Notes); heteroskedastic
        data allowed; when such cells would not halve the number of rows, the
        exact observations are fitted. A binned fit costs O(#cells * K) per
        iteration; posterior means and ``log_likelihood`` are still computed on
        the exact data.
    bin_error : float
        ``bins="auto"`` only: the per-observation budget delta > 0 (nats).
    tol : float
        Stop when the certified gap ``kkt`` (see :class:`NPMLEResult`) is <= tol.
    max_iter : int
        Largest number of iterations (passes over the likelihood matrix), >= 1. The
        default is a guard far above what fits take (a few, at most tens); a fit
        that stops at ``max_iter`` is not ``converged``, warns, and reports how far
        it may be below the optimum (``diagnostics["log_likelihood_gap_bound"]``).

    Returns
    -------
    NPMLEResult
        With binning, ``diagnostics`` holds ``binning_error_bound`` (E below),
        ``binning_error_max`` (max_i r_i), ``binned_log_likelihood`` and
        ``log_likelihood_gap_bound``.

    Raises
    ------
    MemoryError
        When the likelihood matrix would not fit in the memory available.

    Notes
    -----
    *Algorithm.* Active-set mix-SQP, warm-started from a coarse binning, with
    the KKT gap checked over the whole grid at every iteration (module
    :mod:`ebfl.eb.npmle`). ``converged`` means ``kkt <= tol``.

    *Memory.* The likelihood matrix of the rows fitted is stored: 8 n K bytes
    (240 MB for n = 10^5, K = 300), plus O(n k) for the k active columns.
    Binning bounds it by the number of cells; what remains is O(n): the
    outputs and one int64 index per observation. On the data of the P3
    benchmark (n = 10^7, ``bins="auto"``) the peak RSS grows by about 260 MB,
    less than the 320 MB of inputs and outputs.

    *Binning guarantee.* Observation i, replaced by the row (c, s') of its cell,
    gets the bound ``r_i >= max_{u in [u_min, u_max]} |log phi_{s_i}(x_i - u) -
    log phi_{s'}(c - u)|``, in closed form (the log-ratio is a quadratic in u: its
    extremes lie at the ends of the grid or at its vertex). A mixture's
    log-ratio is bounded by its components', so ``|ell_binned(g) - ell(g)| <= E =
    sum_i r_i`` for every prior g on the grid, and the binned optimum is within
    2 E + n kkt of the exact grid optimum; ``log_likelihood_gap_bound``
    = E + n kkt + (ell_binned - ell)(w), the last term computed exactly, is the
    sharper bound reported. With ``"auto"``, s is cut into classes on which
    log(s) - D^2 / (2 s^2) grows by delta / 2, and x, in class j, into bins of
    width delta sigma_j^2 / (2 D), where D bounds ``|x - u|`` and sigma_j is the
    class's smallest s; then r_i <= delta. The bound holds for priors
    concentrated anywhere on the grid, where an observation's log-likelihood is
    most sensitive to its s (the D^2 / s^2 above), so it is conservative: cells
    are represented by their mean x and s, which cancels the first-order error,
    and the realized loss is far smaller. On the P3 data (n = 10^6, s in
    [0.5, 1.5]) the default delta = 3 gives 32,000 cells, E = 2.8e5 and a
    fitted prior whose exact log-likelihood is 0.04 below the exact fit's.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> theta = rng.choice([-2.0, 2.0], size=2000)
    >>> fit = npmle_normal(theta + rng.standard_normal(2000), 1.0)
    >>> fit.converged, round(float(fit.prior_cdf(0.0)), 2)  # share of clients below 0
    (True, 0.47)
    >>> float(np.abs(fit.posterior_mean - theta).mean()) < 0.5
    True

    Heteroskedastic data binned with a certified bound:

    >>> theta = rng.choice([-2.0, 2.0], size=200_000)
    >>> s = rng.uniform(0.5, 1.5, size=200_000)
    >>> big = npmle_normal(theta + s * rng.standard_normal(200_000), s, bins="auto")
    >>> big.converged, big.diagnostics["n_rows"] < 50_000  # cells fitted instead of 200,000
    (True, True)
    >>> big.diagnostics["binning_error_max"] <= 3.0
    True
    """
    x = check_finite_array(x, "x", ndim=1, max_abs=MAX_ABS)
    s_full = check_standard_errors(s, "s", x.size)
    grid = _grid_iv(grid, n_grid, float(x.min()), float(x.max()))
    _check_reach(x, s_full, grid)
    tol = check_positive_scalar(tol, "tol")
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)
    bins = _bins_iv(bins, s_full)
    if bins == "auto":
        bin_error = check_positive_scalar(bin_error, "bin_error")

    rows = _rows_to_fit(x, s_full, grid, bins, bin_error)
    if rows is None:  # the exact observations
        x_fit, s_fit, counts = x, s_full, np.ones(x.size)
    else:
        x_fit, s_fit, counts = rows.x, rows.s, rows.count
    weights, info = _fit_normal_rows(x_fit, s_fit, counts, grid, tol, max_iter)
    mean, var, loglik = _atom_posterior(x, s_full, grid, weights)
    diagnostics = {"n_rows": x_fit.size, "history": info["history"],
                   "log_likelihood_gap_bound": info["log_likelihood_gap_bound"]}
    if bins is not None:
        diagnostics.update(_binning_diagnostics(x, s_full, grid, rows, info, loglik))
    return _result(grid, weights, loglik, mean, var, info, "normal", diagnostics)


def npmle_binomial(successes, trials, *, grid=None, n_grid=300, tol=1e-8,
                   max_iter=MAX_ITER):
    r"""NPMLE of the prior of :math:`p_i` from :math:`z_i \sim \mathrm{Binomial}(n_i, p_i)`.

    The clients are Bernoulli: :math:`z_i` successes in :math:`n_i` trials.

    The nonparametric counterpart of :func:`~ebfl.eb.beta_binomial_eb`: no
    Beta shape is assumed, so bimodal or clustered populations are recovered.
    Clients with the same (n_i, z_i) share a row of the likelihood (an exact
    compression), so the cost per iteration is O(#distinct pairs * K) and the
    rest is O(m).

    Parameters
    ----------
    successes, trials : array_like of int, shape (m,)
        z_i and n_i >= 1 with z_i <= n_i.
    grid : array_like, shape (K,), optional
        Strictly increasing support points in [0, 1] (at most 10^6). Default:
        ``n_grid`` equally spaced points from 0 to 1.
    n_grid : int
        Size of the default grid, 2 to 10^6.
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
    z, n = check_binomial_counts(successes, trials)
    grid = _grid_iv(grid, n_grid, 0.0, 1.0)
    if np.any((grid < 0) | (grid > 1)):
        raise ValueError("grid points must lie in [0, 1] for a binomial likelihood")
    tol = check_positive_scalar(tol, "tol")
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)

    nu, zu, counts, inverse = _distinct_pairs(z, n)
    _check_matrix_fits(nu.size, grid.size, "pass a coarser grid")
    log_lik = (special.gammaln(nu + 1) - special.gammaln(zu + 1) - special.gammaln(nu - zu + 1)
               )[:, None] + special.xlogy(zu[:, None], grid) + special.xlog1py(
                   (nu - zu)[:, None], -grid)
    shift = log_lik.max(axis=1)
    lik = np.exp(log_lik - shift[:, None])
    del log_lik
    start = _coarse_grid_start(lik, counts, shift)
    weights, info = _mix_sqp(lik, counts, shift, tol, max_iter, start=start, warn=3)

    atoms = np.flatnonzero(weights > 0)
    joint = lik[:, atoms] * weights[atoms]
    f = joint.sum(axis=1)
    mean_u = joint @ grid[atoms] / f
    var_u = np.sum(joint * (grid[atoms] - mean_u[:, None]) ** 2, axis=1) / f
    loglik = float(counts @ (shift + np.log(f)))
    return _result(grid, weights, loglik, mean_u[inverse], var_u[inverse], info, "binomial",
                   {"n_rows": nu.size, "history": info["history"],
                    "log_likelihood_gap_bound": info["log_likelihood_gap_bound"]})


# ----------------------------------------------------------------- input checks

def normal_grid_posterior(x, s, grid, weights):
    """The client half of :func:`npmle_normal`: posteriors under a given grid prior.

    Each theta_i has prior sum_k w_k delta(grid_k) and x_i ~ N(theta_i, s_i^2);
    the arithmetic is that of :func:`npmle_normal`'s posteriors (over the atoms
    with w_k > 0, in chunks of rows), so a fitted prior broadcast to clients
    gives them the same numbers as the fit itself.

    Parameters
    ----------
    x : array_like, shape (m,)
    s : float or array_like, shape (m,)
        Standard errors, > 0.
    grid : array_like, shape (k,)
        Strictly increasing support points.
    weights : array_like, shape (k,)
        Prior probabilities: >= 0, summing to 1 (within 1e-8).

    Returns
    -------
    mean, var : ndarray, shape (m,)
        Posterior mean and variance of every theta_i.
    log_likelihood : float
        Marginal log-likelihood of x under the prior.

    Examples
    --------
    >>> mean, var, loglik = normal_grid_posterior([0.0, 2.0], 1.0, [0.0, 2.0], [0.5, 0.5])
    >>> mean.round(3).tolist()
    [0.238, 1.762]
    """
    x = check_finite_array(x, "x", ndim=1, max_abs=MAX_ABS).astype(np.float64)
    s = check_standard_errors(s, "s", x.size)
    if grid is None:
        raise TypeError("grid must be an array of support points, got None")
    grid = _grid_iv(grid, None, 0.0, 0.0)
    weights = check_finite_array(weights, "weights", ndim=1).astype(np.float64)
    if weights.shape != grid.shape:
        raise ValueError(f"weights must have the grid's shape {grid.shape}, got {weights.shape}")
    if np.any(weights < 0) or abs(float(weights.sum()) - 1.0) > 1e-8:
        raise ValueError("weights must be >= 0 and sum to 1")
    return _atom_posterior(np.ascontiguousarray(x), s, grid, weights)


def _grid_iv(grid, n_grid, low, high):
    if grid is not None:
        grid = check_finite_array(grid, "grid", ndim=1, max_abs=MAX_ABS).astype(np.float64,
                                                                                copy=True)
        # The fit's weights, support() and prior_cdf() are reported in grid order: a grid
        # out of order (or with a repeated point) is almost always a mistake in building it.
        if grid.size > MAX_GRID:
            raise ValueError(f"grid must have at most {MAX_GRID} points, got {grid.size}")
        steps = np.diff(grid)
        if np.any(steps <= 0):
            k = int(np.argmax(steps <= 0))
            raise ValueError(f"grid must be strictly increasing; grid[{k + 1}] = "
                             f"{float(grid[k + 1])!r} follows grid[{k}] = {float(grid[k])!r}")
        return grid
    n_grid = check_int_scalar(n_grid, "n_grid", minimum=2, maximum=MAX_GRID)
    return np.linspace(low, high, n_grid)


def _bins_iv(bins, s):
    if bins is None or (isinstance(bins, str) and bins == "auto"):
        return bins
    if isinstance(bins, str):
        raise ValueError(f"bins must be None, an int >= 2 or 'auto', got {bins!r}")
    bins = check_int_scalar(bins, "bins", minimum=2, maximum=MAX_BINS)
    if np.ptp(s) != 0:
        raise ValueError("bins needs homoskedastic data (one value of s); got standard "
                         "errors that differ (use bins='auto')")
    return bins


def _check_reach(x, s, grid):
    """Every x_i must lie within MAX_Z standard errors of some grid point.

    Otherwise (x_i - u)^2 / s_i^2 overflows for every u, the row's likelihood
    is 0 under every grid prior and the fit is undefined (NaN).
    """
    order = np.sort(grid)
    # Inside the grid's range a point is at most half the largest gap from the grid.
    inside_ok = float(np.max(np.diff(order), initial=0.0)) / 2.0 <= MAX_Z * float(s.min())
    with _threads_for(8 * x.size):
        reach, i = _npmle_kernels._farthest_from_grid(x, s, order, inside_ok,
                                                      _row_blocks(x.size))
    if reach > MAX_Z:
        raise ValueError(f"x[{i}] = {float(x[i])!r} lies {reach:.3g} standard errors s from the "
                         f"nearest grid point; the normal likelihood needs at most {MAX_Z:g} "
                         "(widen grid, or check x and s)")


# ---------------------------------------------------------------------- binning

def _rows_to_fit(x, s, grid, bins, bin_error):
    """The rows that replace the observations, or None for the observations themselves
    (``bins=None``, or ``"auto"`` cells that would not halve their number)."""
    if bins is None:
        return None
    if bins == "auto":
        return _auto_cells(x, s, grid, bin_error)
    return _equal_width_bins(x, s, bins)


def _binning_diagnostics(x, s, grid, rows, info, loglik):
    """E = sum_i r_i, max_i r_i, the binned log-likelihood and the certified gap
    E + n kkt + (binned - exact log-likelihood) (see :func:`npmle_normal`)."""
    binned = info["history"][-1]
    bound = worst = 0.0
    if rows is not None:
        with _threads_for(8 * x.size):
            bound, worst = _npmle_kernels._binning_error(
                x, s, rows.row, rows.x, rows.s, float(grid.min()), float(grid.max()),
                _row_blocks(x.size))
    gap = max(bound + info["log_likelihood_gap_bound"] + binned - loglik, 0.0)
    return {"binned_log_likelihood": binned, "binning_error_bound": bound,
            "binning_error_max": worst, "log_likelihood_gap_bound": gap}


@dataclass(frozen=True)
class _Rows:
    """Rows that replace the observations: (x, s, count) each, and each observation's row."""

    x: np.ndarray
    s: np.ndarray
    count: np.ndarray
    row: np.ndarray


def _equal_width_bins(x, s, bins):
    """Midpoints of the non-empty equal-width bins on [min x, max x] and their counts.

    The last bin is closed, as in :func:`numpy.histogram`.
    """
    edges = np.linspace(float(x.min()), float(x.max()), bins + 1)
    index = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    counts = np.bincount(index, minlength=bins)
    keep = counts > 0
    row = np.cumsum(keep) - 1
    mids = 0.5 * (edges[:-1] + edges[1:])
    return _Rows(mids[keep], np.full(int(keep.sum()), s[0]), counts[keep].astype(np.float64),
                 row[index])


def _cells(x, s, counts, scale, widths, x_low):
    """Group the rows into cells of (x, s) and represent each cell by its means.

    s is cut into classes j = floor(J(s)), J(s) = scale[0] log s - scale[1] / s^2
    + scale[2] (increasing, J(s_min) = 0), and, in class j, x into bins of width
    ``widths[j]`` from ``x_low``. A cell's row is the count-weighted mean of its
    x and of its s, so that the first-order change of the log-likelihood cancels
    within the cell. Memory: one int64 n-vector (each row's cell, then its row)
    and O(#cells).
    """
    span = float(x.max()) - x_low
    n_bins = np.minimum(np.floor(span / widths), INT64_MAX // (4 * widths.size)).astype(
        np.int64) + 1
    offsets = np.concatenate([[0], np.cumsum(n_bins)])
    with _threads_for(8 * x.size):
        cell = _npmle_kernels._cell_index(x, s, np.asarray(scale, np.float64), 1.0 / widths,
                                          offsets, x_low)
    n_cells = int(offsets[-1])
    if n_cells <= max(MAX_DENSE_CELLS, x.size // 2):
        mean_x, mean_s, weight = _npmle_kernels._dense_cell_rows(cell, x, s, counts, n_cells)
        return _Rows(mean_x, mean_s, weight, cell)  # cell now holds each row index
    # many more cells than rows: find the occupied ones by sorting
    _, row = np.unique(cell, return_inverse=True)
    row = row.reshape(-1)
    weight = np.bincount(row, weights=counts)
    mean_x = np.bincount(row, weights=counts * x, minlength=weight.size) / weight
    mean_s = np.bincount(row, weights=counts * s, minlength=weight.size) / weight
    return _Rows(mean_x, mean_s, weight, row)


def _auto_cells(x, s, grid, delta):
    """Cells of (x, s) with r_i <= delta for every observation (see :func:`npmle_normal`).

    For s, s' in [a, b] and |x - u|, |c - u| <= D, the log-ratio's dependence on
    s is at most log(b / a) + D^2 (1/a^2 - 1/b^2) / 2 = (delta / 2) (J(b) - J(a))
    with J(s) = (2 / delta) (log s - D^2 / (2 s^2)) + const, so classes of unit
    width in J spend delta / 2; x-bins of width delta sigma_j^2 / (2 D) spend the
    other half (sigma_j: the class's smallest s). Returns None when the cells
    would not halve the number of rows (the exact observations are fitted then).
    """
    low = min(float(grid.min()), float(x.min()))
    reach = max(float(grid.max()), float(x.max())) - low  # bounds |x - u| and |c - u|
    s_min, s_max = float(s.min()), float(s.max())
    reach = max(reach, s_min * 1e-150)
    a, b = 2.0 / delta, reach**2 / delta
    c = -a * math.log(s_min) + b / s_min**2
    top = a * math.log(s_max) - b / s_max**2 + c
    if not top < x.size:  # more classes than observations
        return None
    n_classes = int(top) + 1
    smallest = _class_lower_edges(a, b, c, s_min, s_max, n_classes)
    widths = delta * smallest**2 / (2.0 * reach)
    if float(np.sum(np.ptp(x) / widths)) > 4.0 * x.size:  # cells would outnumber rows
        return None
    rows = _cells(x, s, np.ones(x.size), (a, b, c), widths, float(x.min()))
    return rows if rows.x.size <= x.size // 2 else None


def _class_lower_edges(a, b, c, s_min, s_max, n_classes):
    """sigma_j = J^{-1}(j) for j < n_classes, J(s) = a log s - b / s^2 + c, by bisection
    (J is increasing; 100 halvings of [s_min, s_max] reach the last bit)."""
    level = np.arange(n_classes, dtype=np.float64)
    lo = np.full(n_classes, s_min)
    hi = np.full(n_classes, s_max)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        below = a * np.log(mid) - b / mid**2 + c < level
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return lo  # lower ends: never above the true edge


def _coarse_cells(x, s, counts, grid):
    """Coarse cells for the warm start: x in bins half a grid spacing wide, s in classes
    of ratio 1.25."""
    spacing = 0.5 * (float(grid.max()) - float(grid.min())) / max(grid.size - 1, 1)
    spacing = spacing if spacing > 0 else max(float(np.ptp(x)), 1.0)
    a = 1.0 / math.log(WARM_CLASS_RATIO)
    s_min = float(s.min())
    n_classes = int(a * math.log(float(s.max()) / s_min)) + 1
    return _cells(x, s, counts, (a, 0.0, -a * math.log(s_min)), np.full(n_classes, spacing),
                  float(x.min()))


# ---------------------------------------------------------------------- fitting

def _check_matrix_fits(rows, k, advice):
    """Refuse a likelihood matrix larger than the memory available (Linux), which
    would otherwise end the process (the kernel's out-of-memory killer) instead of
    raising."""
    need = 8.0 * rows * k
    available = _available_memory()
    if available is not None and need > available:
        raise MemoryError(f"the {rows} x {k} likelihood matrix needs {need / 2**30:.1f} GiB, "
                          f"more than the {available / 2**30:.1f} GiB available: {advice}")


def _available_memory():
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return 1024.0 * int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _fit_normal_rows(x, s, counts, grid, tol, max_iter, *, warm_start=None, active_set=True):
    """Grid weights for rows (x, s, counts), warm-started from a coarse binning when that
    has at most WARM_MAX_SHARE of the rows (``warm_start`` forces or forbids it)."""
    _check_matrix_fits(x.size, grid.size, 'bin the data (bins="auto") or pass a coarser grid')
    start = None
    if warm_start is None or warm_start:
        coarse = _coarse_cells(x, s, counts, grid)
        if warm_start or coarse.x.size <= WARM_MAX_SHARE * x.size:
            lik, shift = _normal_likelihood_matrix(coarse.x, coarse.s, grid)
            start, _ = _mix_sqp(lik, coarse.count, shift, WARM_TOL, WARM_MAX_ITER, warn=None)
            del lik
    lik, shift = _normal_likelihood_matrix(x, s, grid)
    return _mix_sqp(lik, counts, shift, tol, max_iter, start=start, active_set=active_set,
                    warn=4)


def _normal_likelihood_matrix(x, s, grid):
    """Row-shifted normal likelihoods L (n, K), max_k L_ik = 1, and the shifts c (n,):
    log phi_{s_i}(x_i - u_k) = c_i + log L_ik."""
    with _threads_for(x.size * grid.size):
        lik, shift = _npmle_kernels._normal_log_likelihood_matrix(x, s, grid, np.sort(grid))
    return np.exp(lik, out=lik), shift


def _coarse_grid_start(lik, counts, shift):
    """Warm start from every WARM_GRID_STEP-th grid point, or None.

    Used when rows cannot be binned (the binomial's distinct pairs): the first
    mix-SQP iteration from the uniform weights needs the Hessian over all K
    columns, O(rows K^2); on the coarse grid it costs WARM_GRID_STEP^2 times
    less, and its sparse solution starts the full grid's active-set iterations.
    None when the problem is small, or when a row has no likelihood on the coarse grid.
    """
    k = lik.shape[1]
    if lik.size < PARALLEL_MIN_WORK or k < 4 * WARM_GRID_STEP:
        return None
    cols = np.arange(0, k, WARM_GRID_STEP)
    with _threads_for(lik.shape[0] * cols.size):
        coarse = _mixsqp_kernels._gather_columns(lik, cols)
    if not np.all(coarse.max(axis=1) > 0):
        return None
    weights, _ = _mix_sqp(coarse, counts, shift, WARM_TOL, WARM_MAX_ITER, warn=None)
    start = np.zeros(k)
    start[cols] = weights
    return start


def _atom_posterior(x, s, grid, weights):
    """Posterior mean and variance of every theta_i, and the total log-likelihood, on the
    exact data: over the atoms (w_k > 0) only, in chunks of rows (memory O(chunk * atoms))."""
    keep = np.flatnonzero(weights > 0)
    atoms, log_w = grid[keep], np.log(weights[keep])
    n = x.size
    mean, var = np.empty(n), np.empty(n)
    chunk = max(1024, POSTERIOR_CHUNK_CELLS // atoms.size)
    buf = np.empty((min(chunk, n), atoms.size))
    loglik = 0.0
    with _threads_for(n * atoms.size):
        for start in range(0, n, chunk):
            rows = slice(start, min(start + chunk, n))
            p = buf[: rows.stop - start]
            top = _npmle_kernels._atom_log_joint(x[rows], s[rows], atoms, log_w, p)
            np.exp(p, out=p)
            loglik += _npmle_kernels._atom_moments(p, atoms, top, mean[rows], var[rows],
                                                   _row_blocks(p.shape[0]))
            loglik -= float(np.sum(np.log(s[rows]))) + p.shape[0] * HALF_LOG_2PI
    return mean, var, loglik


def _result(grid, weights, loglik, mean, var, info, likelihood, diagnostics):
    diagnostics["history"] = np.asarray(diagnostics["history"])
    _freeze(diagnostics["history"])
    return NPMLEResult(grid, weights, loglik, mean, var, info["kkt"], info["n_iter"],
                       info["converged"], likelihood, MappingProxyType(diagnostics))


def _distinct_pairs(z, n):
    """Distinct (n, z) pairs, their multiplicities and each client's pair index.

    A dense table when (n_max + 1)^2 cells are few (O(m)), else a sort of the
    packed key n (n_max + 1) + z (one int64 per client, not an (m, 2) array).
    """
    n_max = int(n.max())
    cells = (n_max + 1) ** 2
    if cells <= min(MAX_DENSE_CELLS, max(4 * z.size, 1 << 16)):
        key = n * (n_max + 1) + z
        table = np.bincount(key, minlength=cells)
        occupied = np.flatnonzero(table)
        index = np.zeros(cells, np.int64)
        index[occupied] = np.arange(occupied.size)
        nu, zu = np.divmod(occupied, n_max + 1)
        return (nu.astype(np.float64), zu.astype(np.float64),
                table[occupied].astype(np.float64), index[key])
    if n_max <= 3_000_000_000:  # n (n_max + 1) + z fits in an int64
        keys, inverse, counts = np.unique(n * (n_max + 1) + z, return_inverse=True,
                                          return_counts=True)
        nu, zu = np.divmod(keys, n_max + 1)
    else:
        pairs, inverse, counts = np.unique(np.stack([n, z], axis=1), axis=0,
                                           return_inverse=True, return_counts=True)
        nu, zu = pairs[:, 0], pairs[:, 1]
    return (nu.astype(np.float64), zu.astype(np.float64), counts.astype(np.float64),
            inverse.reshape(-1))


# ------------------------------------------------------------------------ mix-SQP
