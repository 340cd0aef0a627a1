r"""Gaussian-mixture population prior: empirical Bayes by EM.

Client ``i`` has parameter theta_i ~ g = sum_l p_l N(mu_l, tau_l^2 I_d) and
reports a mean x_i ~ N(theta_i, s_i^2 I_d) with a known standard error s_i
(s_i = sigma_x / sqrt(n_i) for n_i samples). The marginal of x_i is

    x_i ~ sum_l p_l N(mu_l, (tau_l^2 + s_i^2) I_d),

and the posterior of theta_i is again a mixture. This generalizes the
single-Gaussian prior of :func:`ebfl.eb.gaussian.gaussian_eb` (k = 1) and the
discrete prior of Theorem 5 / Algorithm 1 (all tau_l = 0); it is the paper's
"Gaussian mixture" population, fitted here to client means instead of to
learned models (the clustering step of Algorithm 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy import special

from ebfl._validation import (
    INT64_MAX,
    as_generator,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
)
from ebfl.eb.gaussian import _gaussian_iv, _group_by_variance, _maximize_profile
from ebfl.eb.mixture_weights import MAX_ITER, _mix_sqp
from ebfl.eb.results import _freeze

__all__ = [
    "GaussianMixtureEBResult",
    "GaussianMixturePosterior",
    "GaussianMixturePrior",
    "gaussian_mixture_eb",
    "gaussian_mixture_posterior",
]

INITS = ("kmeans", "random")

#: A component whose total responsibility sum_i r_il (its effective number of
#: clients) is below this keeps its mean and sd in the M-step (see Notes of
#: :func:`gaussian_mixture_eb`).
EMPTY_COUNT = 1e-8

_LOG_2PI = math.log(2.0 * math.pi)

#: Largest component sd, min_sd and |mean| accepted: their squares must stay finite.
_MAX_SD = 1e150


def _as_2d(x):
    return x if x.ndim == 2 else x[:, None]


@dataclass(frozen=True)
class GaussianMixturePrior:
    r"""Gaussian-mixture population prior g = sum_l p_l N(mu_l, tau_l^2 I_d).

    Parameters
    ----------
    weights : array_like, shape (k,)
        Mixture weights p_l >= 0, summing to 1 (to 1e-9; stored renormalized).
    means : array_like, shape (k,) or (k, d)
        Component means mu_l, in [-1e150, 1e150]; shape (k,) is a one-dimensional prior.
    sds : array_like, shape (k,)
        Component standard deviations tau_l in [0, 1e150] (tau_l^2 must be
        finite); tau_l = 0 is a point mass (the discrete prior of Theorem 5).

    Examples
    --------
    >>> g = GaussianMixturePrior([0.5, 0.5], [-1.0, 1.0], [0.5, 0.5])
    >>> g.n_components, g.dim
    (2, 1)
    >>> round(float(g.logpdf([0.0])[0]), 6)
    -2.225791
    """

    weights: np.ndarray
    means: np.ndarray
    sds: np.ndarray

    def __post_init__(self):
        weights = check_finite_array(self.weights, "weights", ndim=1)
        means = check_finite_array(self.means, "means", ndim=(1, 2), max_abs=_MAX_SD)
        sds = check_finite_array(self.sds, "sds", ndim=1)
        k = weights.shape[0]
        if means.shape[0] != k or sds.shape != (k,):
            raise ValueError(f"weights, means and sds must have one entry per component; got "
                             f"shapes {weights.shape}, {means.shape} and {sds.shape}")
        if means.ndim == 2 and means.shape[1] < 1:
            raise ValueError("means must have at least one coordinate")
        if np.any(weights < 0) or not math.isclose(weights.sum(), 1.0, rel_tol=1e-9):
            raise ValueError("weights must be >= 0 and sum to 1")
        if np.any(sds < 0) or np.any(sds > _MAX_SD):
            raise ValueError(f"sds must lie in [0, {_MAX_SD:g}] (their squares must be finite)")
        weights = weights / weights.sum()
        means = means.copy()
        sds = sds.copy()
        _freeze(weights, means, sds)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "sds", sds)

    def __eq__(self, other):
        return (isinstance(other, GaussianMixturePrior)
                and np.array_equal(self.weights, other.weights)
                and np.array_equal(self.means, other.means)
                and np.array_equal(self.sds, other.sds))

    __hash__ = None

    @property
    def n_components(self) -> int:
        """Number of components k."""
        return self.weights.shape[0]

    @property
    def dim(self) -> int:
        """Dimension d of theta."""
        return 1 if self.means.ndim == 1 else self.means.shape[1]

    def _check_theta(self, theta, name):
        theta = check_finite_array(theta, name, ndim=(1, 2), min_len=0)
        theta2 = _as_2d(theta)
        if theta2.shape[1] != self.dim:
            raise ValueError(f"{name} must have dimension d={self.dim}, got shape {theta.shape}")
        return theta2

    def logpdf(self, theta):
        r"""Log prior density of each row of ``theta``.

        .. math:: \log g(\theta_i) = \log \sum_l p_l (2\pi\tau_l^2)^{-d/2}
                  \exp(-|\theta_i - \mu_l|^2 / (2\tau_l^2)),

        so ``-g.logpdf(theta).sum()`` is the corrected Gaussian-mixture
        regularizer R({theta_i}) of the paper's Gaussian-mixture population.

        Parameters
        ----------
        theta : array_like, shape (n,) or (n, d)
            Points; shape (n,) for a one-dimensional prior.

        Returns
        -------
        ndarray of shape (n,)

        Raises
        ------
        ValueError
            If a component with positive weight has sd 0 (a point mass has no density),
            or a point is so far from every component that its log density is below
            the float64 range (-1.8e308).
        """
        theta2 = self._check_theta(theta, "theta")
        keep = self.weights > 0
        if np.any(self.sds[keep] == 0):
            raise ValueError("logpdf needs sds > 0 for every component of positive weight "
                             "(a point mass has no density)")
        mu = _as_2d(self.means)[keep]
        sds = self.sds[keep]
        d = self.dim
        # |theta - mu_l|^2 / tau_l^2 in units of tau_l and log(tau_l^2) as 2 log(tau_l): a
        # tiny sd (tau_l^2 underflows) or a huge distance does not overflow on its own.
        scaled = np.empty((theta2.shape[0], sds.size))
        with np.errstate(over="ignore"):
            for l in range(sds.size):
                z = (theta2 - mu[l]) / sds[l]
                scaled[:, l] = np.einsum("ij,ij->i", z, z)
        log_terms = (np.log(self.weights[keep]) - 0.5 * d * _LOG_2PI - d * np.log(sds)
                     - 0.5 * scaled)
        out = special.logsumexp(log_terms, axis=1)
        if not np.all(np.isfinite(out)):
            first = int(np.flatnonzero(~np.isfinite(out))[0])
            raise ValueError(f"theta[{first}] is so far from every component that its log "
                             "density is below the float64 range")
        return out

    def sample(self, size, rng=None):
        """Draw ``size`` parameters theta_i ~ g.

        Parameters
        ----------
        size : int
            Number of draws, >= 0.
        rng : None, int, SeedSequence or Generator

        Returns
        -------
        theta : ndarray of shape (size,) or (size, d)
            Shape (size,) for a one-dimensional prior (``means`` of shape (k,)).
        labels : ndarray of int, shape (size,)
            The component each draw came from.
        """
        size = check_int_scalar(size, "size", minimum=0, maximum=INT64_MAX)
        rng = as_generator(rng)
        labels = rng.choice(self.n_components, size=size, p=self.weights)
        mu = _as_2d(self.means)
        theta = mu[labels] + self.sds[labels, None] * rng.standard_normal((size, self.dim))
        return (theta if self.means.ndim == 2 else theta[:, 0]), labels


@dataclass(frozen=True)
class GaussianMixturePosterior:
    """Per-client posteriors of theta_i under a Gaussian-mixture prior.

    The posterior of theta_i is the mixture
    sum_l r_il N(component_means[i, l], component_vars[i, l] I_d).

    Attributes
    ----------
    mean : ndarray of shape (m,) or (m, d)
        Posterior means sum_l r_il (mu_l + a_il (x_i - mu_l)), the personalized
        estimates (same shape as the input).
    var : ndarray of shape (m,)
        Posterior variance per coordinate, ``E[|theta_i - mean_i|^2 | x_i] / d``:
        within-component sum_l r_il a_il s_i^2 plus between-component
        ``sum_l r_il |component_means[i, l] - mean_i|^2 / d``. For d > 1 the
        between part is not isotropic; this is the average over coordinates.
    weights : ndarray of shape (m, k)
        Posterior component probabilities r_il (the responsibilities).
    component_means : ndarray of shape (m, k) or (m, k, d)
        mu_l + a_il (x_i - mu_l), with a_il = tau_l^2 / (tau_l^2 + s_i^2).
    component_vars : ndarray of shape (m, k)
        Per-coordinate variances a_il s_i^2 of the component posteriors.
    """

    mean: np.ndarray
    var: np.ndarray
    weights: np.ndarray
    component_means: np.ndarray
    component_vars: np.ndarray

    def __post_init__(self):
        _freeze(self.mean, self.var, self.weights, self.component_means, self.component_vars)

    @property
    def sd(self) -> np.ndarray:
        """Per-coordinate posterior standard deviations sqrt(var), shape (m,)."""
        return np.sqrt(self.var)

    @property
    def map_component(self) -> np.ndarray:
        """The most probable component of every client, shape (m,)."""
        return np.argmax(self.weights, axis=1)


@dataclass(frozen=True)
class GaussianMixtureEBResult:
    """Empirical-Bayes fit of a Gaussian-mixture prior by EM.

    Attributes
    ----------
    prior : GaussianMixturePrior
        Fitted population prior (weights, means, sds), components sorted by
        their means (first coordinate first).
    posterior : GaussianMixturePosterior
        Per-client posteriors under ``prior``.
    shrinkage : ndarray of shape (m, k)
        a_il = tau_l^2 / (tau_l^2 + s_i^2), the weight on the client's own mean
        within component l.
    s : ndarray of shape (m,)
        Standard errors of the client means used in the fit.
    log_likelihood : float
        Marginal log-likelihood
        sum_i log sum_l p_l N(x_i; mu_l, (tau_l^2 + s_i^2) I_d) at ``prior``
        (equal to ``log_likelihood_history[-1]``).
    log_likelihood_history : ndarray of shape (n_iter + 1,)
        Log-likelihood of the best start at its initial parameters (entry 0)
        and after each EM iteration; non-decreasing up to rounding.
    n_iter : int
        EM iterations run by the best start.
    converged : bool
        Whether the best start met the ``tol`` criterion before ``max_iter``.
    diagnostics : mapping
        ``init``; ``n_init``; ``init_log_likelihoods`` (final log-likelihood of
        every start); ``best_init`` (index of the start kept);
        ``empty_components`` (indices of components whose effective number of
        clients m p_l is below ``EMPTY_COUNT``); ``sd_at_min`` (indices of
        components whose sd sits at ``min_sd``); ``weights_kkt`` (the weights'
        optimality gap for the fitted components: max_l r_l - 1 with
        r_l = mean_i N_il / sum_l' p_l' N_il', at most ``max(tol, 1e-12)``, also when
        ``max_iter`` stopped EM; m times it bounds how far the log-likelihood is below
        that of the best weights for these components).
    responsibilities : ndarray of shape (m, k)
        Property: ``posterior.weights``, r_il = Pr(client i in component l | x_i).
    n_clients : int
        Property: m.
    """

    prior: GaussianMixturePrior
    posterior: GaussianMixturePosterior
    shrinkage: np.ndarray
    s: np.ndarray
    log_likelihood: float
    log_likelihood_history: np.ndarray
    n_iter: int
    converged: bool
    diagnostics: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        _freeze(self.shrinkage, self.s, self.log_likelihood_history)
        object.__setattr__(self, "diagnostics", MappingProxyType(dict(self.diagnostics)))

    @property
    def responsibilities(self) -> np.ndarray:
        """Posterior component probabilities r_il, shape (m, k)."""
        return self.posterior.weights

    @property
    def n_clients(self) -> int:
        """Number of clients m."""
        return self.s.size

    def plot(self, x, path=None, *, coordinate=0):
        """The fitted mixture prior over the client means, and their shrinkage.

        Left: a histogram of x with the prior's density (point-mass components as
        stems of their weight, the histogram then in shares per bin). Right: the
        posterior means against x, with the identity line and the prior mean.

        Parameters
        ----------
        x : array_like of shape (m,) or (m, d)
            The client means this result was fitted to (a result keeps no copy);
            means that do not give the result's posterior means are refused.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).
        coordinate : int, default=0
            The coordinate drawn, for d > 1.

        Returns
        -------
        matplotlib.figure.Figure
            Two axes, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> x = np.random.default_rng(0).choice([-3.0, 3.0], 200) + 0.7
        >>> fit = gaussian_mixture_eb(x, 1.0, 2, rng=0)
        >>> fig = fit.plot(x)
        >>> len(fig.axes)
        2
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl.eb._plots import plot_gaussian_mixture

        return plot_gaussian_mixture(self, x, coordinate, path)


# --------------------------------------------------------------------------- public API


def gaussian_mixture_posterior(x, s, prior):
    r"""Posterior of every client under a known Gaussian-mixture prior.

    With v_il = tau_l^2 + s_i^2 and a_il = tau_l^2 / v_il,

    .. math:: r_{il} \propto p_l N(x_i; \mu_l, v_{il} I_d), \qquad
              \theta_i \mid x_i \sim \sum_l r_{il}\,
              N(\mu_l + a_{il}(x_i - \mu_l),\; a_{il} s_i^2 I_d),

    with the responsibilities computed by log-sum-exp.

    Parameters
    ----------
    x : array_like, shape (m,) or (m, d)
        Client means, in [-1e150, 1e150].
    s : float or array_like, shape (m,)
        Their standard errors (per coordinate), in [1e-150, 1e150].
    prior : GaussianMixturePrior
        The prior g, of dimension d.

    Returns
    -------
    GaussianMixturePosterior

    Notes
    -----
    With every sd 0 this is Theorem 5's posterior
    (:func:`ebfl.eb.discrete.discrete_posterior`); with one component it is the
    conjugate normal posterior of :func:`ebfl.eb.gaussian.gaussian_eb`.

    Examples
    --------
    >>> g = GaussianMixturePrior([0.5, 0.5], [-3.0, 3.0], [0.5, 0.5])
    >>> post = gaussian_mixture_posterior([-2.5, 0.0, 3.5], 0.5, g)
    >>> np.round(post.mean, 3).tolist()
    [-2.75, 0.0, 3.25]
    >>> post.map_component.tolist()
    [0, 0, 1]
    """
    x_arr, s_arr, _, _ = _gaussian_iv(x, s, None, None)
    x2 = _as_2d(x_arr)
    if x2.shape[1] < 1:
        raise ValueError(f"x must have at least one coordinate, got shape {x_arr.shape}")
    if not isinstance(prior, GaussianMixturePrior):
        raise TypeError(f"prior must be a GaussianMixturePrior, got {type(prior).__name__}")
    if prior.dim != x2.shape[1]:
        raise ValueError(f"prior must have dimension d={x2.shape[1]}, got {prior.dim}")
    with np.errstate(divide="ignore"):
        log_w = np.log(prior.weights)
    _, resp = _e_step(x2, s_arr**2, log_w, _as_2d(prior.means), prior.sds**2)
    post, _ = _posterior(x2, s_arr**2, _as_2d(prior.means), prior.sds**2, resp)
    return _posterior_shape(post, x_arr.ndim)


def gaussian_mixture_eb(x, s, n_components, *, rng=None, n_init=5, max_iter=1000, tol=1e-8,
                        init="kmeans", min_sd=0.0):
    r"""Empirical Bayes with a Gaussian-mixture prior fitted by (generalized) EM.

    Model: theta_i ~ sum_l p_l N(mu_l, tau_l^2 I_d), x_i | theta_i ~ N(theta_i, s_i^2 I_d),
    so that x_i ~ sum_l p_l N(mu_l, (tau_l^2 + s_i^2) I_d). The prior
    (p, mu, tau) maximizes this marginal likelihood (EM from several starts);
    every client then gets its posterior under the fitted prior
    (:func:`gaussian_mixture_posterior`).

    Parameters
    ----------
    x : array_like, shape (m,) or (m, d)
        Client means, in [-1e150, 1e150].
    s : float or array_like, shape (m,)
        Standard errors of the client means (per coordinate), in [1e-150, 1e150]
        (so that s_i^2 is a normal float); with n_i samples of noise sd sigma_x,
        s_i = sigma_x / sqrt(n_i).
    n_components : int
        k, the number of mixture components, 1 <= k <= m.
    rng : None, int, SeedSequence or Generator
        Seeds the initializations (one k-means seed per start); unused when
        ``init`` is a prior.
    n_init : int, default=5
        Number of EM starts; the fit with the largest final log-likelihood is
        kept. Ignored when ``init`` is a prior.
    max_iter : int, default=1000
        Maximum EM iterations per start, >= 1.
    tol : float, default=1e-8
        A start stops (``converged``) when an iteration raises the
        log-likelihood by less than ``tol`` per client, (l_t - l_{t-1}) / m < tol
        (a rounding-level decrease counts too), and so does the one after it,
        whose M-step maximizes every tau_l globally (see Notes). >= 0.
    init : {"kmeans", "random"} or GaussianMixturePrior, default="kmeans"
        "kmeans": scikit-learn's ``KMeans`` (k-means++, one run per start) on
        the x_i; "random": k distinct clients' x_i as centres, every client
        assigned to its nearest. From the hard clusters S_l: ``p_l = |S_l|/m``,
        mu_l = mean of S_l, ``tau_l^2 = max(min_sd^2, mean_{S_l} |x_i - mu_l|^2/d
        - mean_{S_l} s_i^2)``. A prior (e.g. an earlier fit's) is used as the
        single start, its sds raised to ``min_sd``.
    min_sd : float, default=0
        Lower bound on every tau_l, in [0, 1e150]. Not needed for a bounded likelihood
        (see Notes); 0 allows point-mass components.

    Returns
    -------
    GaussianMixtureEBResult

    Notes
    -----
    E-step: r_il = p_l N(x_i; mu_l, v_il I_d) / sum_l' p_l' N(x_i; mu_l', v_il' I_d),
    v_il = tau_l^2 + s_i^2, by log-sum-exp.

    M-step: p_l = mean_i r_il. For (mu_l, tau_l) the expected complete-data
    log-likelihood (complete data: x_i and its component label) is

    .. math:: Q_l(\mu, t) = -\frac12 \sum_i r_{il}\Big[d \log(t + s_i^2)
              + \frac{|x_i - \mu|^2}{t + s_i^2}\Big] + \text{const},

    maximized in mu for fixed t = tau^2 by
    mu_l(t) = sum_i r_il w_il x_i / sum_i r_il w_il, w_il = 1/(t + s_i^2).
    The profile P_l(t) = Q_l(mu_l(t), t) has no closed-form maximizer when the
    s_i differ, and it can have several local maxima (a few precise, tightly
    clustered clients beside imprecise, distant ones). Each iteration raises
    it by projected Newton from the current tau_l, with the exact P_l' and
    P_l'' and step halving (a few O(md) passes per component, as tau_l moves
    little between iterations). Where P_l is not locally concave, and in one
    more M-step once the ``tol`` criterion is met, P_l is maximized globally
    over t in [min_sd^2, U^2] (the log-grid scan and root refinement of
    :func:`ebfl.eb.gaussian.gaussian_eb`, clients weighted by r_il); EM stops
    only when that step, too, gains less than ``tol`` per client, so that at
    convergence every tau_l is the global maximizer of its P_l (an exact
    M-step). ``U = max(min_sd, 2 max_i |x_i - xbar| / sqrt(d))`` bounds every
    maximizer, because dP_l/dt < 0 once ``t > max_i |x_i - mu|^2/d`` and mu lies
    in the convex hull of the x_i. Every accepted step raises P_l and t =
    min_sd^2 is always compared, so Q never decreases and the log-likelihood
    is non-decreasing (generalized EM). With equal s_i the update is
    closed-form, ``tau^2 = max(min_sd^2, sum_i r_il |x_i - mu_l|^2 / (d sum_i
    r_il) - s^2)`` with mu_l the r-weighted mean; with k = 1 the fit is the
    profile MLE of :func:`ebfl.eb.gaussian.gaussian_eb`.

    In that final phase the weights, too, are solved exactly for the new
    components (ECME: the convex problem of :func:`ebfl.eb.mixsqp`, to kkt <= tol),
    instead of EM's p_l = mean_i r_il, which approaches them only linearly where
    components overlap (a point mass inside a wide component, the usual shape of
    sparse effects) and could stop on its gain per iteration with the weights a
    nat below their optimum. A start stopped by ``max_iter`` gets the same exact
    weights for its last components. So every fit has certified weights for its
    components: ``diagnostics["weights_kkt"] <= max(tol, 1e-12)``. The components
    themselves are a local optimum of a non-convex problem, with no such certificate.

    Because every s_i > 0, each component density N(x_i; mu_l, v_il I_d) is
    at most (2 pi min_i s_i^2)^(-d/2): the likelihood is bounded and tau_l = 0
    (a point mass, the discrete prior of Theorem 5) is a legitimate fit rather
    than the singular collapse of ordinary Gaussian-mixture EM.

    Degenerate components: when a component's effective number of clients
    sum_i r_il falls below ``EMPTY_COUNT`` (its weight p_l -> 0, e.g. all
    responsibilities underflow to 0), its mean and sd are kept unchanged
    (still a valid generalized-EM step) and its weight is set to the tiny,
    possibly zero, mean responsibility; a zero weight stays zero under EM's
    update (the exact weights of the final phase may revive it). The
    component remains in the result and is listed in
    ``diagnostics["empty_components"]``; refit with fewer components if that
    is not wanted. Components start empty when the initial clustering leaves
    a cluster without clients (fewer distinct x_i than k: scikit-learn then
    warns).

    EM finds a local maximum; several starts (``n_init``) reduce, but do not
    remove, the risk of a poor one. Components are returned sorted by their
    means (first coordinate, then the next) so that fits are comparable.

    References
    ----------
    Theorem 5, Algorithm 1 and Section 3 (Gaussian-mixture
    population). A. P. Dempster, N. M. Laird and D. B. Rubin (1977), "Maximum
    likelihood from incomplete data via the EM algorithm", JRSS B 39(1);
    X.-L. Meng and D. B. Rubin (1993), "Maximum likelihood estimation via the
    ECM algorithm", Biometrika 80(2).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.choice(3, size=3000, p=[0.5, 0.3, 0.2])
    >>> theta = np.array([-4.0, 1.0, 6.0])[labels] + 0.5 * rng.standard_normal(3000)
    >>> s = rng.uniform(0.3, 1.0, size=3000)
    >>> x = theta + s * rng.standard_normal(3000)
    >>> res = gaussian_mixture_eb(x, s, 3, rng=1)
    >>> np.round(res.prior.means).tolist(), np.round(res.prior.weights, 1).tolist()
    ([-4.0, 1.0, 6.0], [0.5, 0.3, 0.2])
    >>> bool(np.all(np.abs(res.prior.sds - 0.5) < 0.1)), res.converged
    (True, True)
    >>> bool(np.mean((res.posterior.mean - theta) ** 2) < np.mean((x - theta) ** 2))
    True
    """
    (x_arr, x2, s_arr, k, rng, n_init, max_iter, tol, init,
     min_sd) = _gaussian_mixture_iv(x, s, n_components, rng, n_init, max_iter, tol, init, min_sd)
    m, d = x2.shape
    s2 = s_arr**2
    lower = min_sd
    radius = float(np.sqrt(np.max(np.sum((x2 - x2.mean(axis=0)) ** 2, axis=1))))
    upper = max(lower, 2.0 * radius / math.sqrt(d))

    if isinstance(init, GaussianMixturePrior):
        starts = [(init.weights.copy(), _as_2d(init.means).copy(),
                   np.maximum(init.sds, min_sd) ** 2)]
        init_name = "prior"
    else:
        seeds = rng.integers(2**31 - 1, size=n_init)
        starts = [_initial_params(x2, s2, k, init, int(seed), lower**2) for seed in seeds]
        init_name = init

    best, finals = None, []
    for start in starts:
        fit = _em(x2, s2, *start, lower, upper, max_iter, tol)
        finals.append(fit["history"][-1])
        if best is None or fit["history"][-1] > best["history"][-1]:
            best = fit

    order = np.lexsort(best["means"].T[::-1])
    weights, means, tau2 = best["weights"][order], best["means"][order], best["tau2"][order]
    resp = best["resp"][:, order]
    post, shrinkage = _posterior(x2, s2, means, tau2, resp)
    sds = np.sqrt(tau2)
    prior = GaussianMixturePrior(weights, means if x_arr.ndim == 2 else means[:, 0], sds)
    history = np.asarray(best["history"])
    diagnostics = {
        "init": init_name,
        "n_init": len(starts),
        "init_log_likelihoods": tuple(float(v) for v in finals),
        "best_init": int(np.argmax(finals)),
        "empty_components": tuple(int(i) for i in np.flatnonzero(m * weights < EMPTY_COUNT)),
        "sd_at_min": tuple(int(i) for i in np.flatnonzero(sds <= min_sd)),
        "weights_kkt": best["weights_kkt"],
    }
    # s_arr may be the caller's own array (no copy at validation): copy before freezing
    return GaussianMixtureEBResult(prior, _posterior_shape(post, x_arr.ndim), shrinkage,
                                   s_arr.copy(), float(history[-1]), history, best["n_iter"],
                                   best["converged"], diagnostics)


# --------------------------------------------------------------------------- validation


def _gaussian_mixture_iv(x, s, n_components, rng, n_init, max_iter, tol, init, min_sd):
    x_arr, s_arr, _, _ = _gaussian_iv(x, s, None, None)
    x2 = _as_2d(x_arr)
    m, d = x2.shape
    if d < 1:
        raise ValueError(f"x must have at least one coordinate, got shape {x_arr.shape}")
    k = check_int_scalar(n_components, "n_components", minimum=1)
    if k > m:
        raise ValueError(f"n_components must be <= the number of clients {m}, got {k}")
    n_init = check_int_scalar(n_init, "n_init", minimum=1)
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)
    tol = check_nonnegative_scalar(tol, "tol")
    min_sd = check_nonnegative_scalar(min_sd, "min_sd")
    if min_sd > _MAX_SD:
        raise ValueError(f"min_sd must lie in [0, {_MAX_SD:g}] (its square must be finite), "
                         f"got {min_sd!r}")
    if isinstance(init, GaussianMixturePrior):
        if init.n_components != k:
            raise ValueError(f"init prior must have n_components={k} components, "
                             f"got {init.n_components}")
        if init.dim != d:
            raise ValueError(f"init prior must have dimension d={d}, got {init.dim}")
    elif isinstance(init, str):
        check_choice(init, "init", INITS)
    else:
        raise TypeError(f"init must be one of {list(INITS)} or a GaussianMixturePrior, "
                        f"got {type(init).__name__}")
    rng = as_generator(rng)
    return x_arr, x2, s_arr, k, rng, n_init, max_iter, tol, init, min_sd


# --------------------------------------------------------------------------- numerics


def _sq_dist(x2, mu):
    """|x_i - mu_l|^2 as an (m, k) array (one pass per component: no (m, k, d) temporary)."""
    out = np.empty((x2.shape[0], mu.shape[0]))
    for l in range(mu.shape[0]):
        diff = x2 - mu[l]
        out[:, l] = np.einsum("ij,ij->i", diff, diff)
    return out


def _log_density(x2, s2, mu, tau2):
    """log N(x_i; mu_l, (tau_l^2 + s_i^2) I_d) as an (m, k) array."""
    d = x2.shape[1]
    v = tau2[None, :] + s2[:, None]
    return -0.5 * (d * (_LOG_2PI + np.log(v)) + _sq_dist(x2, mu) / v)


def _e_step(x2, s2, log_w, mu, tau2):
    """Marginal log-likelihood and responsibilities r_il (log-sum-exp, max-shifted)."""
    log_p = log_w + _log_density(x2, s2, mu, tau2)
    top = log_p.max(axis=1, keepdims=True)  # finite: some weight is > 0
    shifted = np.exp(log_p - top)
    total = shifted.sum(axis=1, keepdims=True)
    return float(np.sum(top[:, 0] + np.log(total[:, 0]))), shifted / total


def _profile_mean(t, x2, s2, r):
    """mu_l(t) = sum_i r_i w_i x_i / sum_i r_i w_i, w_i = 1/(t + s_i^2) (scaled to max 1)."""
    w = r * ((t + s2.min()) / (t + s2))
    return (w @ x2) / w.sum()


def _profile_q_derivatives(t, x2, s2, r):
    """Profile P(t) = Q_l(mu_l(t), t) (up to a constant) and c P'(t), c^2 P''(t), c.

    P'(t) = dQ/dt at mu_l(t) (envelope theorem); P''(t) = Q_tt + |b|^2 / W, the Schur
    complement of the (mu, t) Hessian, with W = sum_i r_i / v_i and
    b = sum_i r_i (x_i - mu) / v_i^2. The derivatives are scaled by powers of
    c = t + min_i s_i^2 and computed from a_i = c / v_i in (0, 1], so that v_i^-3 never
    overflows when s_i^2 is as small as 1e-300; the Newton step is -c (c P') / (c^2 P'').
    """
    d = x2.shape[1]
    v = t + s2
    c = t + float(s2.min())
    ra = r * (c / v)
    total = ra.sum()
    diff = x2 - (ra @ x2) / total
    q = np.einsum("ij,ij->i", diff, diff) / v  # |x_i - mu|^2 / v_i
    a = c / v
    beta = ((ra * a) @ diff) / math.sqrt(c)  # c^(3/2) b
    value = -0.5 * (d * float(r @ np.log(v)) + float(r @ q))
    grad = 0.5 * (float(ra @ q) - d * total)
    hess = 0.5 * d * float(ra @ a) - float((ra * a) @ q) + float(beta @ beta) / total
    return value, grad, hess, c


def _newton_tau2(t, lo, hi, x2, s2, r, max_steps=50):
    """Projected Newton ascent of P on [lo, hi] from t, with step halving.

    Every accepted step raises P, so the result is never worse than the start. A
    bound where P points outward (e.g. tau at min_sd with P' <= 0) is accepted.
    Stops after a Newton step below 1e-7 (t + min_i s_i^2): convergence is quadratic,
    so t is then accurate to about 1e-14 of that scale. Returns (t, P(t), ok);
    ok is False when P is not locally concave (P'' >= 0), where Newton's
    direction cannot be trusted.
    """
    value, grad, hess, c = _profile_q_derivatives(t, x2, s2, r)
    for _ in range(max_steps):
        if (t == lo and grad <= 0.0) or (t == hi and grad >= 0.0):
            return t, value, True  # a bound satisfying the first-order (KKT) condition
        if hess >= 0.0:
            return t, value, False
        target = min(max(t - c * grad / hess, lo), hi)
        small = abs(target - t) <= 1e-7 * c  # c = t + min_i s_i^2
        for _ in range(60):
            if target == t:
                return t, value, True  # at a bound, or the step is below rounding
            new = _profile_q_derivatives(target, x2, s2, r)
            if new[0] >= value:
                break
            if small:
                return t, value, True  # converged: the remaining step is rounding noise
            target = t + 0.5 * (target - t)
        else:
            return t, value, True
        t, (value, grad, hess, c) = target, new
        if small:
            break
    return t, value, True


def _update_component(x2, s2, r, tau_old, lower, upper, exhaustive=False):
    """Generalized-EM update of one component's (mu, tau^2) given its responsibilities r.

    Maximizes the profile P(t) = Q_l(mu_l(t), t) over t = tau^2 in [lower^2, upper^2]:
    safeguarded Newton from the current tau (one O(md) pass per step, a few steps as
    tau moves little between EM iterations). Newton finds a local maximum only: P can
    have several (precise, tightly clustered clients beside imprecise, distant ones).
    So where P is not locally concave, and whenever ``exhaustive``, the global
    maximizer of P is also computed (the grid scan and root refinement of
    :func:`ebfl.eb.gaussian.gaussian_eb`, with clients weighted by r) and the better
    point is kept. The boundary t = lower^2 is always a candidate (it wins ties). P
    never decreases, so EM stays monotone. Clients with r_i = 0 are dropped (exactly:
    they add nothing). Returns (mu, tau^2).
    """
    keep = r > 0
    x2, s2, r = x2[keep], s2[keep], r[keep]
    upper = max(upper, tau_old)
    lo, hi = lower * lower, upper * upper
    start = min(max(tau_old * tau_old, lo), hi)  # guards against sqrt-then-square rounding
    t, best, ok = _newton_tau2(start, lo, hi, x2, s2, r)
    if (exhaustive or not ok) and hi > lo:
        t_g, _ = _maximize_profile(_group_by_variance(x2, s2, r), hi, lower=lo)
        value_g = _profile_q_derivatives(t_g, x2, s2, r)[0]
        if value_g > best:
            t, best = t_g, value_g
    if t != lo and _profile_q_derivatives(lo, x2, s2, r)[0] >= best:
        t = lo
    return _profile_mean(t, x2, s2, r), t


def _m_step(x2, s2, resp, mu, tau2, lower, upper, exhaustive=False):
    m = x2.shape[0]
    counts = resp.sum(axis=0)
    weights = counts / m
    weights = weights / weights.sum()
    mu_new, tau2_new = mu.copy(), tau2.copy()
    for l in range(resp.shape[1]):
        if counts[l] < EMPTY_COUNT:
            continue  # degenerate component: keep its mean and sd (see Notes)
        mu_new[l], tau2_new[l] = _update_component(x2, s2, resp[:, l], math.sqrt(tau2[l]),
                                                   lower, upper, exhaustive)
    return weights, mu_new, tau2_new


def _em(x2, s2, weights, mu, tau2, lower, upper, max_iter, tol):
    """EM from one start. When the tol criterion is first met, one more M-step maximizes
    every P_l globally and then the weights exactly (:func:`_optimal_weights`); EM stops
    only if that step, too, gains less than tol per client."""
    m = x2.shape[0]
    with np.errstate(divide="ignore"):
        ll, resp = _e_step(x2, s2, np.log(weights), mu, tau2)
    history = [ll]
    converged = False
    exhaustive = False
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        weights, mu, tau2 = _m_step(x2, s2, resp, mu, tau2, lower, upper, exhaustive)
        if exhaustive:
            solved = _optimal_weights(x2, s2, weights, mu, tau2, tol)
            weights = solved["weights"]
        with np.errstate(divide="ignore"):
            ll_new, resp = _e_step(x2, s2, np.log(weights), mu, tau2)
        history.append(ll_new)
        stalled = (ll_new - ll) / m < tol
        ll = ll_new
        if stalled and exhaustive:
            converged = True
            break
        exhaustive = stalled
    if not converged:
        # Stopped by max_iter: the weights are still made optimal for the last components
        # (part of the last iteration), so that they are certified whatever happened.
        solved = _optimal_weights(x2, s2, weights, mu, tau2, tol)
        weights = solved["weights"]
        with np.errstate(divide="ignore"):
            history[-1], resp = _e_step(x2, s2, np.log(weights), mu, tau2)
    # Either way the last step solved the weights exactly: its kkt is theirs.
    return {"weights": weights, "means": mu, "tau2": tau2, "resp": resp, "history": history,
            "n_iter": n_iter, "converged": converged, "weights_kkt": solved["kkt"]}


def _optimal_weights(x2, s2, weights, mu, tau2, tol):
    """The weights maximizing the log-likelihood for the components (mu, tau2), from
    ``weights``: the convex problem of :func:`ebfl.eb.mixsqp`, solved to kkt <= tol
    (at least 1e-12). Returns its info (``weights``, ``kkt``, ``converged``, ...).

    EM's own update p_l = mean_i r_il approaches these weights only linearly, slowly
    where components overlap (a point mass inside a wide component, the usual shape
    of sparse effects): there it stops on its gain per iteration while the weights'
    own optimality gap, m * kkt, is still of the order of a nat.
    """
    log_dens = _log_density(x2, s2, mu, tau2)
    shift = log_dens.max(axis=1)
    lik = np.exp(log_dens - shift[:, None])
    start = weights if np.all(lik @ weights > 0) else None
    w, info = _mix_sqp(lik, np.ones(x2.shape[0]), shift, max(tol, 1e-12), MAX_ITER,
                       start=start, warn=None)
    info["weights"] = w
    return info


def _initial_params(x2, s2, k, init, seed, lower2):
    """Initial (weights, means, tau^2) from hard clusters: k-means or random centres."""
    m = x2.shape[0]
    if init == "kmeans":
        from sklearn.cluster import KMeans

        labels = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x2).labels_
    else:
        centres = x2[np.random.default_rng(seed).choice(m, size=k, replace=False)]
        labels = np.argmin(_sq_dist(x2, centres), axis=1)
    d = x2.shape[1]
    weights = np.bincount(labels, minlength=k) / m
    mu = np.empty((k, d))
    tau2 = np.full(k, lower2)
    overall = x2.mean(axis=0)
    for l in range(k):
        members = labels == l
        if not members.any():  # an empty cluster: weight 0, kept for the fixed k
            mu[l] = overall
            continue
        mu[l] = x2[members].mean(axis=0)
        spread = np.sum((x2[members] - mu[l]) ** 2) / (d * members.sum())
        tau2[l] = max(lower2, spread - float(s2[members].mean()))
    return weights, mu, tau2


def _posterior(x2, s2, mu, tau2, resp):
    """Mixture posterior of every client; returns (GaussianMixturePosterior in 2-D, a_il)."""
    d = x2.shape[1]
    a = tau2[None, :] / (tau2[None, :] + s2[:, None])
    comp_mean = mu[None, :, :] + a[:, :, None] * (x2[:, None, :] - mu[None, :, :])
    comp_var = a * s2[:, None]
    mean = np.einsum("il,ild->id", resp, comp_mean)
    between = np.einsum("il,il->i", resp,
                        np.sum((comp_mean - mean[:, None, :]) ** 2, axis=2)) / d
    var = np.einsum("il,il->i", resp, comp_var) + between
    return GaussianMixturePosterior(mean, var, resp, comp_mean, comp_var), a


def _posterior_shape(post, ndim):
    if ndim == 2:
        return post
    return GaussianMixturePosterior(post.mean[:, 0], post.var, post.weights,
                                    post.component_means[:, :, 0], post.component_vars)
