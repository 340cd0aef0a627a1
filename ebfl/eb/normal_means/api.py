r"""Empirical Bayes normal means with a choice of prior family: :func:`ebnm`.

:math:`x_i \sim N(\theta_i, s_i^2)` independently, :math:`\theta_i \sim g`, g in a
family; g is fitted by maximum marginal likelihood and each :math:`\theta_i` gets its
posterior under it.
The call, the family names and the result's fields follow R's ebnm
(Willwerscheid, Carbonetto & Stephens, 2025), so its users find their way.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import check_bool, check_finite_array, check_real_scalar
from ebfl.eb.normal_means.families import FAMILIES, GRID_FAMILIES, fit_family
from ebfl.eb.normal_means.prior import NormalMeansPosterior, NormalMeansPrior

__all__ = ["EBNMResult", "check_prior_family", "check_prior_options", "ebnm", "ebnm_ash",
           "ebnm_deconvolver", "ebnm_flat",
           "ebnm_generalized_binary", "ebnm_horseshoe", "ebnm_normal",
           "ebnm_normal_scale_mixture", "ebnm_npmle", "ebnm_point_exponential",
           "ebnm_point_laplace", "ebnm_point_mass", "ebnm_point_normal", "ebnm_unimodal",
           "ebnm_unimodal_nonnegative", "ebnm_unimodal_nonpositive", "ebnm_unimodal_symmetric"]



@dataclass(frozen=True)
class EBNMResult:
    """A fitted normal-means model.

    Attributes
    ----------
    family : str
    fitted_g : NormalMeansPrior or None
        The prior (weights and components; ``fitted_g.to_frame()``); None for the
        improper ``flat`` prior.
    log_likelihood : float or None
        The marginal log-likelihood of the data under ``fitted_g`` (None for the
        improper ``flat`` prior, which has none).
    posterior : NormalMeansPosterior
        Each theta_i's posterior mean, sd, second moment and lfsr (``to_frame()``).
    mode : float or None
        The prior's mode (fixed or estimated; None for npmle, deconvolver and flat).
    diagnostics : dict
        ``converged``, ``at_bound`` (a parameter on the edge of its range), and for
        grid families ``kkt`` and ``log_likelihood_gap_bound`` (the grid optimum
        exceeds ``log_likelihood`` by at most this).
    """

    family: str
    fitted_g: NormalMeansPrior | None
    log_likelihood: float | None
    posterior: NormalMeansPosterior
    mode: float | None
    diagnostics: dict = field(default_factory=dict)
    x: np.ndarray = field(repr=False, default=None)
    s: np.ndarray = field(repr=False, default=None)

    def __repr__(self):
        ll = "None" if self.log_likelihood is None else f"{self.log_likelihood:.6g}"
        return (f"EBNMResult(family={self.family!r}, n={self.x.size}, log_likelihood={ll}, "
                f"mode={self.mode!r}, fitted_g={self.fitted_g!r})")

    def summary(self):
        """A few readable lines: the family, the fit and the posterior's shrinkage."""
        post = self.posterior
        ll = "undefined (improper prior)" if self.log_likelihood is None else \
            f"{self.log_likelihood:.6g}"
        g = self.fitted_g
        prior = ("  prior: flat (improper): each posterior is N(x, s^2)" if g is None else
                 f"  prior: {g.n_components} components, {int(np.sum(g.weights > 0))} with "
                 f"weight > 0, mean {g.mean:.4g}")
        lines = [f"ebnm, prior family {self.family}: n = {self.x.size}",
                 f"  log-likelihood {ll}; converged {self.diagnostics.get('converged')}",
                 prior,
                 f"  posterior means in [{post.mean.min():.4g}, {post.mean.max():.4g}]; "
                 f"lfsr < 0.05 for {int(np.sum(post.lfsr < 0.05))} of {post.lfsr.size}"]
        return "\n".join(lines)

    def sample(self, n_samples, rng=None):
        """Draws from every theta_i's posterior, shape (n_samples, n)."""
        return self.posterior.sample(n_samples, rng)

    def predict(self, x_new, s_new=1.0):
        """The posteriors of new observations under the fitted prior (``fix_g=True``)."""
        return ebnm(x_new, s_new, prior_family=self.family, g_init=self.fitted_g, fix_g=True)

    def plot(self, path=None):
        """Posterior mean against observation, and the fitted prior's CDF.

        Returns the matplotlib Figure (saved to ``path`` when given).
        """
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
        a1.scatter(self.x, self.posterior.mean, s=6, alpha=0.5)
        lim = [float(self.x.min()), float(self.x.max())]
        a1.plot(lim, lim, "k--", lw=0.8)
        a1.set_xlabel("observation x")
        a1.set_ylabel("posterior mean")
        a1.set_title(f"shrinkage ({self.family})")
        grid = np.linspace(lim[0], lim[1], 400)
        if self.fitted_g is not None:  # the flat prior has no CDF
            a2.plot(grid, self.fitted_g.cdf(grid))
        a2.set_xlabel("theta")
        a2.set_ylabel("G(theta)")
        a2.set_title("fitted prior")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


#: Largest abs(x) and range of s accepted: squares and ratios of them stay finite
#: doubles (the same limits as :func:`~ebfl.eb.gaussian_eb` and the NPMLE).
MAX_ABS_X = 1e150
S_RANGE = (1e-150, 1e150)


def _data_iv(x, s):
    x = np.array(check_finite_array(x, "x", ndim=1, max_abs=MAX_ABS_X), dtype=float)
    s_arr = np.asarray(s)
    if s_arr.ndim == 0:
        s = np.full(x.size, check_real_scalar(s, "s", low=S_RANGE[0], high=S_RANGE[1]))
    else:
        s = np.array(check_finite_array(s, "s", ndim=1), dtype=float)
        if s.shape != x.shape:
            raise ValueError(f"s must be a scalar or have the shape of x {x.shape}, got "
                             f"{s.shape}")
        if np.any(s < S_RANGE[0]) or np.any(s > S_RANGE[1]):
            raise ValueError(f"s must lie in [{S_RANGE[0]:g}, {S_RANGE[1]:g}] everywhere "
                             f"(standard errors > 0), got values in [{s.min():g}, "
                             f"{s.max():g}]")
    for arr in (x, s):  # the result keeps them: the caller's later changes must not leak in
        arr.setflags(write=False)
    return x, s


def _mode_iv(mode, family=None):
    if isinstance(mode, str):
        if mode != "estimate":
            raise ValueError(f"mode must be a real number or 'estimate', got {mode!r}")
        return mode
    mode = check_real_scalar(mode, "mode")
    if family == "generalized_binary":
        # Its point mass is always at 0 and ``mode`` is the slab's: 0 (ebnm's default
        # for every family) asks for it to be estimated, as in R's ebnm.
        if mode < 0:
            raise ValueError(f"mode (the generalized binary slab's mode) must be > 0, 0 "
                             f"or 'estimate' (both estimate it), got {mode!r}")
        return "estimate" if mode == 0 else mode
    return mode


def _scale_iv(scale, family):
    if isinstance(scale, str):
        if scale != "estimate":
            raise ValueError(f"scale must be 'estimate', a positive number or (grid "
                             f"families) an array of scales, got {scale!r}")
        return scale
    if family in GRID_FAMILIES:
        grid = check_finite_array(scale, "scale", ndim=(0, 1))
        grid = np.atleast_1d(grid)
        if family != "npmle" and np.any(grid < 0):
            raise ValueError("scale (the grid of sds or half-widths) must be >= 0")
        return np.unique(grid)
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"scale must be 'estimate' or a positive number for "
                        f"family {family!r}, got {type(scale).__name__}")
    return check_real_scalar(scale, "scale", low=0.0, low_open=family != "normal",
                             high=1e150)


def check_prior_family(prior_family, name="prior_family"):
    """``prior_family`` checked as :func:`ebnm` checks it: one of ``FAMILIES``.

    For callers that take ebnm's options and pass them on later (the federated
    protocol :class:`~ebfl.federated.EBNormalMeans`), so that a bad value is refused
    where it is given, under the caller's ``name``.
    """
    from ebfl._validation import check_choice

    return check_choice(prior_family, name, FAMILIES)


def check_prior_options(prior_family, mode=0.0, scale="estimate", *,
                        family_name="prior_family"):
    """``(prior_family, mode, scale)`` checked and normalized as :func:`ebnm` does.

    ``mode`` comes back as a float or ``"estimate"``, ``scale`` as ``"estimate"``,
    a float or (grid families) the sorted distinct scales.
    """
    prior_family = check_prior_family(prior_family, family_name)
    return prior_family, _mode_iv(mode, prior_family), _scale_iv(scale, prior_family)


def ebnm(x, s=1.0, prior_family="point_normal", mode=0.0, scale="estimate", g_init=None,
         fix_g=False, *, tol=1e-8):
    r"""Fit a prior of ``prior_family`` to :math:`x_i \sim N(\theta_i, s_i^2)`; the posteriors.

    The model, with :math:`\mathcal G` the family:

    .. math::

        x_i \mid \theta_i \sim N(\theta_i, s_i^2) \text{ independently}, \qquad
        \theta_i \sim g \in \mathcal G,

        \hat g = \arg\max_{g \in \mathcal G} \sum_i \log \int N(x_i; \theta, s_i^2)
        \, g(d\theta),

    and each :math:`\theta_i` gets its posterior under :math:`\hat g` (under ``g_init``
    itself with ``fix_g=True``; :math:`N(x_i, s_i^2)` under the improper ``"flat"``
    prior).

    Parameters
    ----------
    x : array_like (n,)
        Observations, finite.
    s : float or array_like (n,)
        Their standard errors, > 0.
    prior_family : str
        ``"normal"``, ``"point_normal"``, ``"point_laplace"``,
        ``"point_exponential"``, ``"horseshoe"``, ``"generalized_binary"``,
        ``"normal_scale_mixture"``, ``"ash"`` (a symmetric scale mixture of
        uniforms, ashr's default), ``"unimodal"``, ``"unimodal_symmetric"``,
        ``"unimodal_nonnegative"``, ``"unimodal_nonpositive"``, ``"npmle"``,
        ``"deconvolver"`` (Efron's log-spline g on a grid), ``"point_mass"`` or
        ``"flat"``.
    mode : float or "estimate"
        The prior's mode (the location of its point mass, the centre of its
        unimodal shape); ignored by npmle, deconvolver and flat. For
        ``generalized_binary`` it is the mode :math:`\mu > 0` of the slab (the point mass
        stays at 0), and 0 (the default) estimates it, as R's ebnm does.
    scale : "estimate", float or array_like
        Parametric families: the slab's sd or scale (the horseshoe's :math:`\tau`), fitted
        or fixed; ``generalized_binary``: the slab's sd over its mode, fixed
        ("estimate" means 0.1). Grid families: the grid of sds (scale mixtures)
        or half-widths (unimodal), or npmle's grid of atoms; "estimate" takes the
        default grid (:func:`~ebfl.eb.normal_means.grid.default_scale_grid`).
        ``deconvolver``: the spacing of its grid of atoms.
    g_init : NormalMeansPrior, optional
        With ``fix_g=True``: the prior to use as it is (only the posteriors are
        computed; e.g. another data set's fit).
    fix_g : bool
    tol : float
        The grid families' KKT tolerance (see :func:`ebfl.eb.mixsqp`).

    Returns
    -------
    EBNMResult

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> theta = np.where(rng.random(500) < 0.8, 0.0, rng.normal(0, 3, 500))
    >>> fit = ebnm(theta + rng.standard_normal(500), 1.0, "point_normal")
    >>> round(float(fit.fitted_g.weights[0]), 2)   # the weight of the point mass at 0
    0.76
    >>> fit.posterior.to_frame().columns.tolist()
    ['mean', 'sd', 'second_moment', 'lfsr', 'prob_zero']
    """
    check_prior_family(prior_family)
    x, s = _data_iv(x, s)
    mode = _mode_iv(mode, prior_family)
    scale = _scale_iv(scale, prior_family)
    fix_g = check_bool(fix_g, "fix_g")
    tol = check_real_scalar(tol, "tol", low=0.0, high=1.0, low_open=True)
    if g_init is not None and not isinstance(g_init, NormalMeansPrior):
        raise TypeError(f"g_init must be a NormalMeansPrior (a fit's fitted_g), got "
                        f"{type(g_init).__name__}")
    if fix_g and g_init is None and prior_family != "flat":  # flat has nothing to fix
        raise ValueError("fix_g=True needs the prior to fix: pass g_init")
    if g_init is not None and not fix_g:
        raise ValueError("g_init is used with fix_g=True (warm starts are not implemented)")

    if prior_family == "flat":
        # The improper uniform prior: theta_i | x_i ~ N(x_i, s_i^2), no prior object and
        # no marginal likelihood (its posterior samples are drawn from that normal).
        post = NormalMeansPosterior(mean=x, sd=s, second_moment=x**2 + s**2,
                                    lfsr=_flat_lfsr(x, s), prob_zero=np.zeros(x.size),
                                    log_marginal=np.full(x.size, np.nan), _prior=None,
                                    _data=(x, s))
        return EBNMResult("flat", None, None, post, None, {"converged": True,
                                                            "at_bound": False}, x, s)
    if fix_g:
        g, diag = g_init, {"converged": True, "at_bound": False, "fixed": True}
    else:
        g, diag = fit_family(prior_family, x, s, mode, scale, tol=tol)
    diag = dict(diag)
    fitted_mode = diag.pop("mode", None)
    diag.pop("log_likelihood", None)  # the solver's own; the result's is recomputed below
    post = g.posterior(x, s)
    return EBNMResult(prior_family, g, float(np.sum(post.log_marginal)), post, fitted_mode,
                      diag, x, s)


def _flat_lfsr(x, s):
    from scipy import special

    # Phi(-|x| / s), the smaller tail itself: 1 - Phi would round to 0 beyond 8 s
    return special.ndtr(-np.abs(x) / s)


def _alias(family):
    def fit(x, s=1.0, mode=0.0, scale="estimate", g_init=None, fix_g=False, **kwargs):
        return ebnm(x, s, family, mode, scale, g_init, fix_g, **kwargs)

    fit.__name__ = f"ebnm_{family}"
    fit.__qualname__ = fit.__name__
    fit.__doc__ = (f"``ebnm(x, s, prior_family={family!r}, ...)``: see :func:`ebnm`.")
    return fit


ebnm_normal = _alias("normal")
ebnm_point_normal = _alias("point_normal")
ebnm_point_laplace = _alias("point_laplace")
ebnm_point_exponential = _alias("point_exponential")
ebnm_normal_scale_mixture = _alias("normal_scale_mixture")
ebnm_ash = _alias("ash")
ebnm_unimodal = _alias("unimodal")
ebnm_unimodal_symmetric = _alias("unimodal_symmetric")
ebnm_unimodal_nonnegative = _alias("unimodal_nonnegative")
ebnm_unimodal_nonpositive = _alias("unimodal_nonpositive")
ebnm_npmle = _alias("npmle")
ebnm_point_mass = _alias("point_mass")
ebnm_flat = _alias("flat")
ebnm_horseshoe = _alias("horseshoe")
ebnm_deconvolver = _alias("deconvolver")


def ebnm_generalized_binary(x, s=1.0, mode="estimate", scale=0.1, g_init=None, fix_g=False,
                            **kwargs):
    """``ebnm(x, s, prior_family="generalized_binary", ...)``: see :func:`ebnm`.

    Here ``mode`` (the slab's) defaults to ``"estimate"`` and ``scale`` (the slab's sd
    over its mode) to 0.1, as in R's ``ebnm_generalized_binary``.
    """
    return ebnm(x, s, "generalized_binary", mode, scale, g_init, fix_g, **kwargs)
