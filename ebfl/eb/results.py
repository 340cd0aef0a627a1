"""Result objects of the empirical-Bayes fits (frozen dataclasses, ebnm-shaped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np
from scipy import special, stats

from ebfl._validation import check_positive_scalar
from ebfl.eb.priors import BetaPrior, NormalPrior

__all__ = [
    "BetaBinomialEBResult",
    "BetaPosterior",
    "GaussianEBResult",
    "NormalPosterior",
    "PersonalizedGaussianEstimate",
]


def _check_level(level):
    level = check_positive_scalar(level, "level")
    if not level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def _freeze(*arrays):
    for arr in arrays:
        if isinstance(arr, np.ndarray):
            arr.setflags(write=False)


def _num(value):
    """A number for a repr or a summary: 6 significant digits, NaN and None as they are."""
    return "None" if value is None else f"{value:.6g}"


def _summary(title, rows):
    """A statsmodels-like block: a title, a rule, then ``name  value`` lines."""
    width = max(len(name) for name, _ in rows)
    body = [f"{name:<{width}}  {value}" for name, value in rows]
    rule = "=" * max(len(title), *(len(line) for line in body))
    return "\n".join([title, rule, *body, rule])


def _range(values):
    return f"[{_num(float(np.min(values)))}, {_num(float(np.max(values)))}]" if values.size \
        else "(none)"


@dataclass(frozen=True)
class BetaPosterior:
    """Per-client posterior Beta(alpha_i, beta_i) of the success probabilities.

    Stored as the mean and the concentration alpha_i + beta_i (the mean-precision
    parameterization); ``alpha``, ``beta`` and ``var`` are derived from them on
    first access, so that a fit for 10^7 clients holds two arrays, not five.

    Attributes
    ----------
    mean : ndarray of shape (m,)
        Posterior means alpha_i / (alpha_i + beta_i), the personalized estimates.
    concentration : ndarray of shape (m,)
        alpha_i + beta_i. ``inf`` marks a point mass at ``mean`` (a
        leave-one-out fit with shrinkage weight 0).
    """

    mean: np.ndarray
    concentration: np.ndarray

    def __post_init__(self):
        _freeze(self.mean, self.concentration)

    @cached_property
    def alpha(self) -> np.ndarray:
        """Posterior shape alpha_i = mean_i (alpha_i + beta_i); ``inf`` for a point mass
        (0 marks the limit Beta(0, b), a point mass at 0)."""
        return self._shape(self.mean)

    @cached_property
    def beta(self) -> np.ndarray:
        """Posterior shape beta_i = (1 - mean_i) (alpha_i + beta_i); ``inf`` for a point
        mass (0 marks the limit Beta(a, 0), a point mass at 1)."""
        return self._shape(1.0 - self.mean)

    def _shape(self, share):
        with np.errstate(invalid="ignore"):  # 0 * inf of a point mass at 0 or 1
            shape = np.where(np.isinf(self.concentration), np.inf, share * self.concentration)
        _freeze(shape)
        return shape

    @cached_property
    def var(self) -> np.ndarray:
        """Posterior variances, mean (1 - mean) / (alpha + beta + 1); 0 for a point mass."""
        var = self.mean * (1.0 - self.mean) / (self.concentration + 1.0)
        _freeze(var)
        return var

    @property
    def sd(self) -> np.ndarray:
        """Posterior standard deviations."""
        return np.sqrt(self.var)

    def interval(self, level=0.95):
        """Equal-tailed credible intervals.

        Parameters
        ----------
        level : float, default=0.95
            Posterior probability inside the interval, in (0, 1).

        Returns
        -------
        lower, upper : ndarray of shape (m,)
        """
        level = _check_level(level)
        tail = (1.0 - level) / 2.0
        a, b = self.alpha, self.beta
        proper = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
        lower = self.mean.copy()
        upper = self.mean.copy()
        lower[proper] = special.betaincinv(a[proper], b[proper], tail)
        upper[proper] = special.betaincinv(a[proper], b[proper], 1.0 - tail)
        return lower, upper


@dataclass(frozen=True)
class BetaBinomialEBResult:
    """Empirical-Bayes fit of a Beta prior to binomial client counts.

    Attributes
    ----------
    method : str
        How the prior was obtained (``"mle"``, ``"moments"``, ``"loo_printed"``,
        ``"loo_proof"``, ``"loo_corrected"`` or ``"fixed"``).
    prior : BetaPrior or None
        Fitted population prior ``g``. For the leave-one-out methods this is
        the Beta implied by the method's moments on all m clients; ``None``
        when those moments define no proper Beta (variance <= 0 or
        >= mean (1 - mean)).
    posterior : BetaPosterior
        Per-client posteriors; ``posterior.mean`` are the estimates.
    shrinkage : ndarray of shape (m,)
        Weight ``a_i`` on the client's own mean z_i/n_i; ``1 - a_i`` goes to
        ``centre``.
    centre : ndarray of shape (m,)
        What each client shrinks towards: the prior mean (a read-only
        broadcast of that one number, holding no memory per client), or the
        leave-one-out mean mu_hat_i.
    log_likelihood : float
        Beta-binomial marginal log-likelihood of all counts under ``prior``
        (binomial coefficients included); NaN when ``prior`` is None.
    n_clipped : int
        Number of clients whose shrinkage weight left [0, 1] and was clipped
        (leave-one-out methods only).
    diagnostics : mapping
        Method-specific details (optimizer status, moments, counts of floored
        variances, ...).
    """

    method: str
    prior: BetaPrior | None
    posterior: BetaPosterior
    shrinkage: np.ndarray
    centre: np.ndarray
    log_likelihood: float
    n_clipped: int = 0
    diagnostics: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        _freeze(self.shrinkage, self.centre)
        object.__setattr__(self, "diagnostics", MappingProxyType(dict(self.diagnostics)))

    @property
    def n_clients(self) -> int:
        """Number of clients m."""
        return self.shrinkage.size

    def __repr__(self):
        prior = "None" if self.prior is None else \
            f"Beta({_num(self.prior.alpha)}, {_num(self.prior.beta)})"
        return (f"BetaBinomialEBResult(method={self.method!r}, m={self.n_clients}, "
                f"prior={prior}, log_likelihood={_num(self.log_likelihood)})")

    def summary(self):
        """The fit in a few lines: the prior, its mean and sd, the log-likelihood and how
        much the clients were shrunk."""
        prior = self.prior
        rows = [("method", self.method), ("clients m", str(self.n_clients))]
        if prior is None:
            rows.append(("prior", "None (the moments define no proper Beta)"))
        else:
            rows += [("prior", f"Beta(alpha={_num(prior.alpha)}, beta={_num(prior.beta)})"),
                     ("prior mean, sd", f"{_num(prior.mean)}, {_num(prior.variance ** 0.5)}")]
        rows += [("log-likelihood", _num(self.log_likelihood)),
                 ("converged", str(self.diagnostics.get("converged", "n/a"))),
                 ("weight on own mean", f"median {_num(float(np.median(self.shrinkage)))}, "
                                        f"range {_range(self.shrinkage)}"),
                 ("posterior means", _range(self.posterior.mean))]
        if self.n_clipped:
            rows.append(("weights clipped", str(self.n_clipped)))
        return _summary("Beta-binomial empirical Bayes", rows)

    def to_frame(self):
        """One row per client: the posterior mean and sd, the weight on the client's own
        mean z_i / n_i, and what the rest of the weight goes to."""
        import pandas as pd

        return pd.DataFrame({"posterior_mean": self.posterior.mean,
                             "posterior_sd": np.sqrt(self.posterior.var),
                             "weight_on_own_mean": self.shrinkage, "centre": self.centre})

    def plot(self, successes, trials, path=None):
        """The fitted Beta prior over the clients' own means, and their shrinkage.

        Left: a histogram of z_i / n_i with the prior's density (none when the
        leave-one-out moments define no proper Beta). Right: the posterior means
        against z_i / n_i, with the identity line (no shrinkage) and the prior mean.

        Parameters
        ----------
        successes, trials : array_like of int, shape (m,)
            The counts this result was fitted to (a result keeps no copy of them).
            Counts that do not give the result's posterior means are refused.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            Two axes, on a pyplot figure (``plt.show()`` shows it; ``plt.close(fig)``
            frees it).

        Examples
        --------
        >>> import ebfl
        >>> _, z, n = ebfl.BetaBernoulliPopulation(2, 5).sample_sufficient(300, 20, rng=0)
        >>> fit = ebfl.beta_binomial_eb(z, n)
        >>> fig = fit.plot(z, n)
        >>> [ax.get_title() for ax in fig.axes]
        ['fitted prior', 'shrinkage (mle)']
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl.eb._plots import plot_beta_binomial

        return plot_beta_binomial(self, successes, trials, path)


@dataclass(frozen=True)
class NormalPosterior:
    """Per-client Gaussian posteriors N(mean_i, var_i I_d).

    Attributes
    ----------
    mean : ndarray of shape (m,) or (m, d)
        Posterior means, the personalized estimates (same shape as the input).
    var : ndarray of shape (m,)
        Per-coordinate posterior variance of each client.
    """

    mean: np.ndarray
    var: np.ndarray

    def __post_init__(self):
        _freeze(self.mean, self.var)

    @property
    def sd(self) -> np.ndarray:
        """Per-coordinate posterior standard deviations, shape (m,)."""
        return np.sqrt(self.var)

    def interval(self, level=0.95):
        """Equal-tailed credible intervals per coordinate, each of the shape of ``mean``."""
        level = _check_level(level)
        zq = stats.norm.ppf(0.5 + level / 2.0)
        half = zq * self.sd
        if self.mean.ndim == 2:
            half = half[:, None]
        return self.mean - half, self.mean + half


@dataclass(frozen=True)
class GaussianEBResult:
    """Empirical-Bayes fit of a Gaussian prior N(mu, sigma_theta^2 I_d).

    Attributes
    ----------
    method : str
        ``"mle"``, ``"reml"``, ``"dl"``, ``"moments"`` or ``"fixed"`` (both prior
        parameters given).
    prior : NormalPrior
        Fitted (or given) population prior.
    posterior : NormalPosterior
        Per-client posteriors.
    shrinkage : ndarray of shape (m,)
        Weight a_i = sigma_theta^2 / (sigma_theta^2 + s_i^2) on the client's own mean.
    s : ndarray of shape (m,)
        Standard errors of the client means used in the fit.
    log_likelihood : float
        Marginal log-likelihood sum_i log N(x_i; mu, (sigma_theta^2 + s_i^2) I_d)
        at ``prior``, whatever the method (for ``"reml"`` the restricted
        log-likelihood is ``diagnostics["restricted_log_likelihood"]``).
    diagnostics : mapping
        Method-specific details: for ``"mle"``/``"reml"`` ``converged``,
        ``at_zero``, ``at_upper``, ``n_local_maxima``; for ``"reml"`` also
        ``restricted_log_likelihood`` (metafor's convention); for ``"dl"``
        ``q_statistic`` and ``variance_floored``; for ``"moments"``
        ``variance_floored``; from raw samples ``sigma_x`` and
        ``sigma_x_estimated`` (see :func:`ebfl.eb.gaussian.gaussian_eb`).
    """

    method: str
    prior: NormalPrior
    posterior: NormalPosterior
    shrinkage: np.ndarray
    s: np.ndarray
    log_likelihood: float
    diagnostics: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        _freeze(self.shrinkage, self.s)
        object.__setattr__(self, "diagnostics", MappingProxyType(dict(self.diagnostics)))

    @property
    def n_clients(self) -> int:
        """Number of clients m."""
        return self.shrinkage.size

    def __repr__(self):
        return (f"GaussianEBResult(method={self.method!r}, m={self.n_clients}, "
                f"prior=N(mean={_num_array(self.prior.mean)}, sd={_num(self.prior.sd)}), "
                f"log_likelihood={_num(self.log_likelihood)})")

    def summary(self):
        """The fit in a few lines: the prior, the log-likelihood and the shrinkage."""
        rows = [("method", self.method), ("clients m", str(self.n_clients)),
                ("prior mean", _num_array(self.prior.mean)),
                ("prior sd", _num(self.prior.sd)),
                ("log-likelihood", _num(self.log_likelihood)),
                ("converged", str(self.diagnostics.get("converged", "n/a"))),
                ("weight on own mean", f"median {_num(float(np.median(self.shrinkage)))}, "
                                       f"range {_range(self.shrinkage)}"),
                ("standard errors", _range(self.s))]
        return _summary("Gaussian empirical Bayes", rows)

    def to_frame(self):
        """One row per client (one coordinate: the posterior mean and sd; d coordinates:
        ``posterior_mean_0`` ... ), the weight on the client's own mean and its
        standard error."""
        import pandas as pd

        mean = self.posterior.mean
        cols = ({"posterior_mean": mean} if mean.ndim == 1 else
                {f"posterior_mean_{j}": mean[:, j] for j in range(mean.shape[1])})
        return pd.DataFrame({**cols, "posterior_sd": self.posterior.sd,
                             "weight_on_own_mean": self.shrinkage, "s": self.s})

    def plot(self, x, path=None, *, coordinate=0):
        """The fitted normal prior over the client means, and their shrinkage.

        Left: a histogram of x with the prior's density (a stem for sd 0). Right:
        the posterior means against x, with the identity line (no shrinkage) and
        the prior mean.

        Parameters
        ----------
        x : array_like of shape (m,) or (m, d)
            The client means this result was fitted to (a result keeps no copy of
            them; for :func:`~ebfl.eb.gaussian_eb_samples`, the sample means). Means
            that do not give the result's posterior means are refused.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).
        coordinate : int, default=0
            The coordinate drawn, for d > 1.

        Returns
        -------
        matplotlib.figure.Figure
            Two axes, on a pyplot figure (``plt.show()`` shows it; ``plt.close(fig)``
            frees it).

        Examples
        --------
        >>> import ebfl
        >>> x = np.random.default_rng(0).normal(0.0, 1.5, 200)
        >>> fit = ebfl.gaussian_eb(x, 1.0)
        >>> fig = fit.plot(x)
        >>> len(fig.axes)
        2
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl.eb._plots import plot_gaussian

        return plot_gaussian(self, x, coordinate, path)


def _num_array(value):
    arr = np.asarray(value, dtype=float)
    return _num(float(arr)) if arr.ndim == 0 else "[" + ", ".join(_num(v) for v in arr) + "]"


@dataclass(frozen=True)
class PersonalizedGaussianEstimate:
    """Output of the Theorem 1 / Theorem 2 estimator ``a x_i + (1 - a) mu_hat``.

    Attributes
    ----------
    estimate : ndarray of shape (m,) or (m, d)
        Personalized estimates theta_hat_i.
    weight : float or ndarray of shape (m,)
        Weight a on the client's own (unquantized) mean.
    global_mean : float or ndarray of shape (d,)
        mu_hat, the average of what the clients shared.
    sigma_q : float
        Per-coordinate standard deviation of the sharing mechanism (0: exact).
    """

    estimate: np.ndarray
    weight: float | np.ndarray
    global_mean: float | np.ndarray
    sigma_q: float

    def __post_init__(self):
        _freeze(self.estimate, self.weight, self.global_mean)
