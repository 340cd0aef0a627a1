r"""Closed-form results of the FedHDP paper for federated point estimation and linear regression.

"Federated learning with heterogeneous differential privacy" (the FedHDP paper)
analyses a Gaussian model (its Section 3 and Appendix A): client c_j holds an
unbiased local estimate phi_hat_j ~ N(phi_j, alpha^2) of its own parameter
phi_j = phi + p_j, p_j ~ N(0, tau^2), and uploads psi_j = phi_hat_j + l_j, where
l_j ~ N(0, N_i gamma_i^2) for a client of privacy group i of N_i clients (so
that the privacy noise of the group's *mean* has variance gamma_i^2;
gamma_i^2 = 0 for clients that opt out of privacy). The server averages
theta_hat = sum_j w_j psi_j with weight r_i / sum_k N_k r_k for group i
(eq. (64)); a client personalizes with
theta_hat_j(lambda) = (phi_hat_j + lambda theta_hat) / (1 + lambda) (eq. (48)).

Three families of functions, all per coordinate (for linear regression in d
dimensions every covariance is the value times I_d and a total MSE is d times
it):

* point estimation with private and opt-out clients (Section 3), in the
  paper's parameters ``(n_clients, rho, alpha2, tau2, gamma2)`` = (N, rho_np,
  alpha^2, tau^2, gamma^2): eq. (12)-(18), Table 2, and :func:`fedhdp_bounds`;
* two privacy levels (Appendix A.1-A.3), ``counts = (N_1, N_2)`` and
  ``gammas2 = (gamma_1^2, gamma_2^2)``, and l privacy levels (Appendix A.6):
  in :mod:`ebfl.fedhdp.levels`, on this module's model and arithmetic.

The exact personalized MSE (derived here, checked by Monte Carlo in
``ebfl validate fedhdp_local``) is, for a client of group g with weight w,

.. math:: \mathrm{MSE}(\lambda) = \frac{(1+\lambda w)^2\alpha^2 + \lambda^2 B}{(1+\lambda)^2},
          \quad B = (1-w)^2\tau^2 + w^2 v_g + \sum_{i\ne j} w_i^2(\alpha^2+\tau^2+v_i),

with v_i = N_i gamma_i^2 the per-client privacy-noise variance. The paper's
optimal lambdas (eq. (17), (18), (50)) match the coefficients of the Bayes
estimator (eq. (47)) but treat the client's own share of the global model as
noise-free (eq. (49) writes phi_hat_j where the upload is psi_j = phi_hat_j +
l_j). So for a client that adds privacy noise they are close to, not equal to,
the minimizer of the MSE, and the MSE they reach exceeds the Bayes MSE (46) by
(lambda w / (1 + lambda))^2 v_g: Theorem 3 and Lemma 6 hold exactly only for
clients that opt out. :func:`optimal_lambda_exact` gives the true minimizer.

Accepted ranges (outside them ``ValueError`` names the argument): variances
alpha2 in [1e-100, 1e100], tau2 and the gammas 0 or in [1e-100, 1e100]; counts
integers up to 2^53 with at least two clients in all; rho in [0, 1] with
rho * n_clients a whole number of opt-out clients; ratios r and lambdas finite
and >= 0. Quantities of a group with no client are NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from ebfl._validation import (
    check_choice,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
)

__all__ = ["FedHDPBounds", "LambdaOptimum", "bayes_local_mse", "dp_fedavg_gap",
           "dp_vs_hdp_fedavg_gap", "fedhdp_bounds", "group_mean_variances", "hdp_fedavg_gap",
           "optimal_lambda_exact", "optimal_lambda_nonprivate", "optimal_lambda_private",
           "optimal_ratio", "personalized_mse", "server_mse", "server_mse_dp_fedavg",
           "server_mse_hdp_fedavg", "server_mse_optimal"]

#: Largest accepted client count: exactly representable as a float.
MAX_COUNT = 2**53
#: Accepted range of a nonzero variance: products of two of them and a count stay in float64.
VARIANCE_RANGE = (1e-100, 1e100)
#: The two groups of the point-estimation model, in the order of the levels functions.
GROUPS = ("nonprivate", "private")
#: A denominator within this relative distance of 0 is 0 up to rounding (lambda* = inf).
_ROUNDING = 1e-12


# ------------------------------------------------------------------ validation

def _variance(value, name, *, zero_ok=True):
    value = (check_nonnegative_scalar if zero_ok else check_positive_scalar)(value, name)
    lo, hi = VARIANCE_RANGE
    if value != 0.0 and not lo <= value <= hi:
        raise ValueError(f"{name} must be {'0 or ' if zero_ok else ''}in [{lo:g}, {hi:g}], "
                         f"got {value!r}")
    return value


class _Levels(NamedTuple):
    """Validated model: counts and per-client privacy variances per group (float arrays)."""

    counts: np.ndarray
    alpha2: float
    tau2: float
    v: np.ndarray  # N_i gamma_i^2, the variance of one client's privacy noise


def _levels_iv(counts, alpha2, tau2, gammas2):
    counts = check_counts(counts, "counts")
    if counts.size == 0 or counts.max() > MAX_COUNT:
        raise ValueError(f"counts must hold one integer in [0, 2**53] per group, got "
                         f"{counts.tolist()}")
    if counts.sum() < 2:
        raise ValueError(f"counts must add up to at least 2 clients, got {counts.tolist()}")
    gammas2 = check_finite_array(gammas2, "gammas2", ndim=1)
    if gammas2.shape != counts.shape:
        raise ValueError(f"gammas2 must have one variance per group ({counts.size}), got "
                         f"shape {gammas2.shape}")
    for i, g in enumerate(gammas2):
        _variance(float(g), f"gammas2[{i}]")
    alpha2 = _variance(alpha2, "alpha2", zero_ok=False)
    tau2 = _variance(tau2, "tau2")
    n = counts.astype(np.float64)
    return _Levels(n, alpha2, tau2, n * gammas2)


def _ratios_iv(ratios, model):
    """Ratios r_i >= 0 (one per group), or r*_i of eq. (65) when None."""
    if ratios is None:
        return _optimal_ratios(model)
    r = check_finite_array(ratios, "ratios", ndim=1)
    if r.shape != model.counts.shape:
        raise ValueError(f"ratios must have one value per group ({model.counts.size}), got "
                         f"shape {r.shape}")
    if np.any(r < 0):
        raise ValueError(f"ratios must be >= 0, got {r.tolist()}")
    if not np.any(r * model.counts > 0):
        raise ValueError(f"ratios must give some client a positive weight (r_i > 0 for a group "
                         f"with clients), got ratios {r.tolist()} for counts "
                         f"{model.counts.astype(int).tolist()}")
    return r


def _group_iv(group, model):
    group = check_int_scalar(group, "group", minimum=0, maximum=model.counts.size - 1)
    if model.counts[group] < 1:
        raise ValueError(f"group {group} has no client (counts "
                         f"{model.counts.astype(int).tolist()}): it has no personalized MSE")
    return group


def _lam_iv(lam):
    """lambda >= 0, finite; a scalar stays a scalar."""
    arr = check_finite_array(lam, "lam", ndim=(0, 1), min_len=0)
    if np.any(arr < 0):
        raise ValueError("lam must be >= 0 (the weight of the global model), got "
                         f"{float(arr.min())!r}")
    return arr


class _Point(NamedTuple):
    n: int
    n_np: int
    n_p: int
    alpha2: float
    tau2: float
    gamma2: float

    @property
    def levels(self):
        n = np.array([self.n_np, self.n_p], dtype=np.float64)
        return _Levels(n, self.alpha2, self.tau2, np.array([0.0, self.n_p * self.gamma2]))


def _point_iv(n_clients, rho, alpha2, tau2, gamma2):
    n = check_int_scalar(n_clients, "n_clients", minimum=2, maximum=MAX_COUNT)
    rho = check_probability(rho, "rho")
    n_np = round(rho * n)
    if abs(rho * n - n_np) > 1e-9 * n:
        raise ValueError(f"rho * n_clients must be a whole number of opt-out clients "
                         f"(rho = k / n_clients), got {rho!r} * {n} = {rho * n!r}")
    return _Point(n, n_np, n - n_np, _variance(alpha2, "alpha2", zero_ok=False),
                  _variance(tau2, "tau2"), _variance(gamma2, "gamma2"))


def _r_iv(r, point):
    """The private/opt-out ratio r >= 0 (scalar or 1-D array)."""
    arr = check_finite_array(r, "r", ndim=(0, 1), min_len=0)
    if np.any(arr < 0):
        raise ValueError(f"r must be >= 0, got {float(arr.min())!r}")
    if point.n_np == 0 and np.any(arr == 0):
        raise ValueError("r must be > 0 when rho = 0: with no opt-out client, r = 0 gives "
                         "every client weight 0")
    return arr


def _group_name_iv(group, point):
    check_choice(group, "group", GROUPS)
    index = GROUPS.index(group)
    if (point.n_np, point.n_p)[index] == 0:
        raise ValueError(f"there is no {group} client when rho = {point.n_np / point.n:g}")
    return index


def _out(arr):
    """A Python float for a 0-d result, else the array."""
    return float(arr) if np.ndim(arr) == 0 else arr


# --------------------------------------------------------------------- kernels

def _sigma2(model):
    """sigma_{p_i}^2 = alpha^2 + tau^2 + N_i gamma_i^2 (eq. (27), (60))."""
    return model.alpha2 + model.tau2 + model.v


def _optimal_ratios(model):
    s2 = _sigma2(model)
    return s2[0] / s2


def _weights(counts, ratios):
    """Per-client weights r_i / sum_k N_k r_k (eq. (64)); 0 for a group with no client.

    The ratios of the groups with clients are scaled to a largest value of 1 first, so
    that no weight overflows (r* of an empty reference group can dwarf the others).
    """
    r = np.where(counts > 0, ratios, 0.0)
    r = r / r.max()
    return r / np.sum(counts * r)


def _server_mse(model, ratios):
    w = _weights(model.counts, ratios)
    return float(np.sum(model.counts * w**2 * _sigma2(model)))


class _Client(NamedTuple):
    w: float      # the client's own weight in the global model
    b: float      # B of the module docstring
    den: float    # B - w (1 - w) alpha^2, computed without cancellation
    scale: float  # sum of the magnitudes of den's terms (its rounding scale)


def _client(model, ratios, g):
    """The terms of the personalized MSE of a client of group ``g``."""
    w = _weights(model.counts, ratios)
    wj = w[g]
    others = model.counts.copy()
    others[g] -= 1.0
    noise = (1 - wj) ** 2 * model.tau2 + wj**2 * model.v[g] + np.sum(
        others * w**2 * (model.tau2 + model.v))
    b = noise + model.alpha2 * np.sum(others * w**2)
    # alpha^2 (sum_{i!=j} w_i^2 - w (1 - w)) = alpha^2 sum_{i!=j} w_i (w_i - w): the own
    # group's term is exactly 0, so no cancellation when all weights are equal.
    spread = others * w * (w - wj)
    den = noise + model.alpha2 * np.sum(spread)
    scale = noise + model.alpha2 * np.sum(np.abs(spread))
    return _Client(float(wj), float(b), float(den), float(scale))


def _personalized_mse(model, ratios, g, lam):
    c = _client(model, ratios, g)
    t = lam / (1.0 + lam)  # lambda/(1+lambda) in [0, 1): no lambda^2 is formed
    return (1.0 - t * (1.0 - c.w)) ** 2 * model.alpha2 + t**2 * c.b


def _lambda_exact(model, ratios, g):
    """Minimizer of the personalized MSE over lambda in [0, inf] (closed form).

    With t = lambda/(1+lambda) the MSE is the convex parabola
    (1 - t(1-w))^2 alpha^2 + t^2 B on [0, 1], minimized at
    t* = (1-w) alpha^2 / ((1-w)^2 alpha^2 + B), i.e. lambda* = (1-w) alpha^2 / den
    with den = B - w (1-w) alpha^2; den <= 0 puts the minimum at t = 1 (lambda = inf).
    """
    c = _client(model, ratios, g)
    gain = (1.0 - c.w) * model.alpha2
    if gain == 0.0:  # the client is the whole global model: the MSE does not depend on lambda
        return 0.0, model.alpha2, True
    if c.den <= _ROUNDING * c.scale:
        return math.inf, c.w**2 * model.alpha2 + c.b, True
    lam = gain / c.den
    return lam, float(_personalized_mse(model, ratios, g, lam)), False


def _precision_of_others(model, g):
    """P = sum_{i != j} 1/sigma_i^2 over the other clients (M_i of eq. (70))."""
    others = model.counts.copy()
    others[g] -= 1.0
    return float(np.sum(others / _sigma2(model)))


def _bayes_local(model, g):
    """Eq. (73): 1/(1/(V + tau^2) + 1/alpha^2) with V = 1/P, written to allow P = 0."""
    p = _precision_of_others(model, g)
    return model.alpha2 * (1.0 + model.tau2 * p) / (1.0 + (model.alpha2 + model.tau2) * p)


def _matching_lambda(model, g):
    """alpha^2 / (tau^2 + w_j v_j), w_j the client's weight at r* (the paper's lambda*)."""
    ratios = _optimal_ratios(model)
    wj = _weights(model.counts, ratios)[g]
    den = model.tau2 + wj * model.v[g]
    return math.inf if den == 0.0 else float(model.alpha2 / den)


# ------------------------------------------------- point estimation (Section 3)

def group_mean_variances(n_clients, rho, alpha2, tau2, gamma2):
    r"""Variances of the opt-out and private groups' mean uploads (equation (12)).

    .. math:: \theta_{np} \sim \mathcal N\!\left(\phi, \frac{\alpha^2+\tau^2}{\rho N}\right),
              \quad \theta_p \sim \mathcal N\!\left(\phi,
              \frac{\alpha^2+\tau^2}{(1-\rho)N} + \gamma^2\right)

    Parameters
    ----------
    n_clients : int
        N >= 2.
    rho : float
        Fraction of clients that opt out of privacy, rho_np in [0, 1]; rho N must be
        a whole number.
    alpha2, tau2, gamma2 : float
        Variance alpha^2 > 0 of a client's local estimate, heterogeneity tau^2 >= 0,
        and gamma^2 >= 0, the privacy-noise variance of the private group's mean.

    Returns
    -------
    (float, float)
        Variance of the opt-out mean and of the private mean (NaN for an empty group).

    Examples
    --------
    >>> [round(v, 6) for v in group_mean_variances(20, 0.05, 1.0, 1.0, 0.5)]
    [2.0, 0.605263]
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    sc = p.alpha2 + p.tau2
    return (sc / p.n_np if p.n_np else math.nan,
            sc / p.n_p + p.gamma2 if p.n_p else math.nan)


def optimal_ratio(n_clients, rho, alpha2, tau2, gamma2):
    r"""Lemma 1: the server's optimal private-to-opt-out weight ratio.

    .. math:: r^* = \frac{\alpha^2+\tau^2}{\alpha^2+\tau^2+(1-\rho)N\gamma^2}

    Parameters are those of :func:`group_mean_variances`.

    Examples
    --------
    >>> round(optimal_ratio(20, 0.05, 1.0, 1.0, 0.5), 6)
    0.173913
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    sc = p.alpha2 + p.tau2
    return sc / (sc + p.n_p * p.gamma2)


def server_mse(r, n_clients, rho, alpha2, tau2, gamma2):
    r"""The server's MSE E(theta_hat - phi)^2 for any weight ratio r.

    .. math:: \sigma_s^2(r) = \frac{N_{np}\sigma_c^2 + N_p r^2(\sigma_c^2 + N_p\gamma^2)}
                                   {(N_{np} + r N_p)^2}, \quad \sigma_c^2 = \alpha^2+\tau^2

    Exact (Algorithm 1's aggregate with weights 1 and r). It is minimized at
    r* of Lemma 1, where it equals eq. (13); r = 1 is HDP-FedAvg (Figure 1).

    Parameters
    ----------
    r : float or array_like
        Ratio(s) >= 0 (> 0 when rho = 0).
    n_clients, rho, alpha2, tau2, gamma2
        As in :func:`group_mean_variances`.

    Returns
    -------
    float or ndarray

    Examples
    --------
    >>> [round(server_mse(r, 20, 0.05, 1.0, 10.0, 1.0), 4) for r in (0.0, 0.1, 1.0)]
    [11.0, 1.9857, 1.4525]
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    r = _r_iv(r, p)
    model = p.levels
    out = np.array([_server_mse(model, np.array([1.0, x])) for x in np.ravel(r)])
    return _out(out.reshape(r.shape))


def server_mse_optimal(n_clients, rho, alpha2, tau2, gamma2):
    r"""Lemma 1, equation (13) = (77): the server's MSE at r*, the Bayes risk of phi.

    .. math:: \sigma^2_{s,opt} = \frac1N\,
              \frac{(\alpha^2+\tau^2)(\alpha^2+\tau^2+(1-\rho)N\gamma^2)}
                   {\alpha^2+\tau^2+\rho(1-\rho)N\gamma^2}

    Examples
    --------
    >>> round(server_mse_optimal(20, 0.05, 1.0, 1.0, 0.5), 6)
    0.464646
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    sc, g, rho_ = p.alpha2 + p.tau2, p.gamma2, p.n_np / p.n
    return sc / p.n * (sc + p.n_p * g) / (sc + rho_ * p.n_p * g)


def server_mse_hdp_fedavg(n_clients, rho, alpha2, tau2, gamma2):
    r"""HDP-FedAvg's server MSE: the uniform average (r = 1), noise on private uploads only.

    .. math:: \sigma^2_{s,hdp} = \frac{\alpha^2+\tau^2}{N} + (1-\rho)^2\gamma^2

    Examples
    --------
    >>> round(server_mse_hdp_fedavg(20, 0.05, 1.0, 1.0, 0.5), 6)
    0.55125
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    return (p.alpha2 + p.tau2) / p.n + (p.n_p / p.n) ** 2 * p.gamma2


def server_mse_dp_fedavg(n_clients, rho, alpha2, tau2, gamma2):
    r"""DP-FedAvg's server MSE: uniform average, every client adds the private noise.

    .. math:: \sigma^2_{s,dp} = \frac{\alpha^2+\tau^2}{N} + (1-\rho)\gamma^2

    Each of the N uploads carries noise of variance (1 - rho) N gamma^2 (the
    private clients' level applied to all), which is the reading under which
    Lemma 2's gaps (15) and (16) hold.

    Examples
    --------
    >>> round(server_mse_dp_fedavg(20, 0.05, 1.0, 1.0, 0.5), 6)
    0.575
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    return (p.alpha2 + p.tau2) / p.n + p.n_p / p.n * p.gamma2


def _gap_parts(n_clients, rho, alpha2, tau2, gamma2):
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    rho_ = p.n_np / p.n
    sc, g = p.alpha2 + p.tau2, p.gamma2
    return p, rho_, sc, g, sc + rho_ * (1 - rho_) * g * p.n


def hdp_fedavg_gap(n_clients, rho, alpha2, tau2, gamma2):
    r"""Lemma 2, equation (14): HDP-FedAvg's server MSE minus the optimal one.

    .. math:: \frac{\rho(1-\rho)^3\gamma^4 N}{\alpha^2+\tau^2+\rho(1-\rho)\gamma^2 N} \ge 0

    Examples
    --------
    >>> round(hdp_fedavg_gap(20, 0.05, 1.0, 1.0, 0.5), 7)
    0.0866035
    """
    p, rho_, _, g, den = _gap_parts(n_clients, rho, alpha2, tau2, gamma2)
    return rho_ * (1 - rho_) ** 3 * g * g * p.n / den


def dp_fedavg_gap(n_clients, rho, alpha2, tau2, gamma2):
    r"""Lemma 2, equation (15): DP-FedAvg's server MSE minus the optimal one.

    .. math:: \frac{\rho(1-\rho)(\alpha^2+\tau^2)\gamma^2 + \rho(1-\rho)^2\gamma^4N}
                   {\alpha^2+\tau^2+\rho(1-\rho)\gamma^2N} \ge 0

    Examples
    --------
    >>> round(dp_fedavg_gap(20, 0.05, 1.0, 1.0, 0.5), 7)
    0.1103535
    """
    p, rho_, sc, g, den = _gap_parts(n_clients, rho, alpha2, tau2, gamma2)
    return (rho_ * (1 - rho_) * sc * g + rho_ * (1 - rho_) ** 2 * g * g * p.n) / den


def dp_vs_hdp_fedavg_gap(n_clients, rho, alpha2, tau2, gamma2):
    r"""Lemma 2, equation (16): DP-FedAvg's server MSE minus HDP-FedAvg's.

    .. math:: \frac{\rho(1-\rho)(\alpha^2+\tau^2)\gamma^2 + \rho^2(1-\rho)^2\gamma^4N}
                   {\alpha^2+\tau^2+\rho(1-\rho)\gamma^2N} = \rho(1-\rho)\gamma^2

    The printed fraction simplifies to rho (1 - rho) gamma^2 (its numerator is
    rho (1 - rho) gamma^2 times its denominator).

    Examples
    --------
    >>> round(dp_vs_hdp_fedavg_gap(20, 0.05, 1.0, 1.0, 0.5), 7)
    0.02375
    """
    p, rho_, sc, g, den = _gap_parts(n_clients, rho, alpha2, tau2, gamma2)
    return (rho_ * (1 - rho_) * sc * g + rho_**2 * (1 - rho_) ** 2 * g * g * p.n) / den


def optimal_lambda_nonprivate(n_clients, rho, alpha2, tau2, gamma2):
    r"""Theorem 3, equation (17) = (78): the opt-out clients' lambda*_np = alpha^2 / tau^2.

    Exact: with r = r* it minimizes an opt-out client's personalized MSE and
    reaches the Bayes MSE (46). ``inf`` when tau^2 = 0 (the global model alone
    is optimal, Table 2). The arguments other than alpha2 and tau2 are
    validated but do not enter.

    Examples
    --------
    >>> optimal_lambda_nonprivate(20, 0.05, 1.0, 0.5, 0.5)
    2.0
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    return math.inf if p.tau2 == 0.0 else p.alpha2 / p.tau2


def optimal_lambda_private(n_clients, rho, alpha2, tau2, gamma2):
    r"""Theorem 3, equation (18) = (79): the paper's lambda*_p of the private clients.

    .. math:: \lambda_p^* = \frac{\alpha^2(\tau^2+\alpha^2) + \rho(1-\rho)\alpha^2\gamma^2N}
              {\tau^2(\tau^2+\alpha^2) + (1-\rho)(\alpha^2+\tau^2)\gamma^2
               + (1-\rho)\rho\tau^2\gamma^2N}

    Notes
    -----
    This value makes the FedHDP estimator's coefficients equal those of the
    Bayes estimator (47) *if the client's own upload were noise-free*; the
    upload carries its privacy noise, so lambda*_p is close to, but not, the
    minimizer of the private client's MSE, and its MSE exceeds the Bayes MSE
    (46) by (lambda w_p/(1 + lambda))^2 (1 - rho) N gamma^2, w_p the private
    weight. Theorem 3's claim of Bayes optimality is therefore exact only for
    opt-out clients (the paper's eq. (49) writes the client's own share of the
    global model as phi_hat_j; it is psi_j = phi_hat_j + l_j; errata [FedHDP 1]);
    :func:`optimal_lambda_exact` gives the true minimizer.

    As gamma^2 -> inf, lambda*_p -> 0 (local learning) when all clients are
    private (rho = 0, as the paper states for Table 2's private column); with
    opt-out clients it tends to rho N alpha^2 / (alpha^2 + tau^2 + rho N tau^2) > 0,
    since the global model becomes the opt-out clients' mean.

    Table 2 prints lambda*_p = 1/gamma^2 for homogeneous data and privacy
    (tau^2 = 0, rho = 0); eq. (18) gives alpha^2/gamma^2 there, which is
    1/gamma^2 only when alpha^2 = 1. The table's entry is wrong (it dropped
    alpha^2); errata [FedHDP 2].

    Returns ``inf`` when the denominator is 0 (tau^2 = 0 and gamma^2 = 0: no
    heterogeneity and no privacy, FedAvg is optimal).

    Examples
    --------
    >>> round(optimal_lambda_private(20, 0.05, 1.0, 1.0, 0.5), 5)
    0.72263
    >>> round(optimal_lambda_private(20, 0.0, 2.0, 0.0, 0.5), 6)  # Table 2: alpha^2/gamma^2
    4.0
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    a, t, g, n, rho_ = p.alpha2, p.tau2, p.gamma2, p.n, p.n_np / p.n
    num = a * (t + a) + rho_ * (1 - rho_) * a * g * n
    den = t * (t + a) + (1 - rho_) * (a + t) * g + (1 - rho_) * rho_ * t * g * n
    return math.inf if den == 0.0 else num / den


def _lambda_p_eq79(n_clients, rho, alpha2, tau2, gamma2):
    """Eq. (79), the restated form of eq. (18) with Upsilon^2 and Gamma^2 (tests compare them)."""
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    n, n_p = p.n, p.n_p
    u2, g2 = p.tau2 / p.alpha2, n_p * p.gamma2 / p.alpha2
    den = n * u2 * (u2 + 1) + (n - n_p + 1) * u2 * g2 + g2
    return math.inf if den == 0.0 else (n + n * u2 + (n - n_p) * g2) / den


def personalized_mse(lam, n_clients, rho, alpha2, tau2, gamma2, *, group, r=None):
    r"""Exact MSE E(theta_hat_j(lambda) - phi_j)^2 of a client's personalized estimate.

    theta_hat_j(lambda) = (phi_hat_j + lambda theta_hat)/(1 + lambda) (eq. (48)),
    theta_hat the server's average with ratio r. With w the client's weight,
    v its privacy-noise variance ((1-rho) N gamma^2 for a private client, 0
    for an opt-out one) and B = (1-w)^2 tau^2 + w^2 v + sum_{i != j} w_i^2
    (alpha^2 + tau^2 + v_i) the variance of the global model's error that does
    not come from the client's own local noise:

    .. math:: \mathrm{MSE}(\lambda) = \frac{(1+\lambda w)^2\alpha^2 + \lambda^2 B}{(1+\lambda)^2}

    Parameters
    ----------
    lam : float or array_like
        lambda >= 0 (0: local estimate; large: the global model).
    n_clients, rho, alpha2, tau2, gamma2
        As in :func:`group_mean_variances`.
    group : {"private", "nonprivate"}
        The client's group (it must have a client).
    r : float, optional
        The server's ratio; r* of Lemma 1 by default, 1 for HDP-FedAvg.

    Returns
    -------
    float or ndarray

    Examples
    --------
    >>> round(personalized_mse(0.72263, 20, 0.05, 1.0, 1.0, 0.5, group="private"), 6)
    0.600187
    >>> personalized_mse(0.0, 20, 0.05, 1.0, 1.0, 0.5, group="private")  # local: alpha^2
    1.0
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    g = _group_name_iv(group, p)
    lam = _lam_iv(lam)
    model = p.levels
    ratios = _optimal_ratios(model) if r is None else _two_ratios(r, p)
    return _out(_personalized_mse(model, ratios, g, lam))


def _two_ratios(r, point):
    r = _r_iv(r, point)
    if r.ndim:
        raise ValueError(f"r must be a single ratio here, got shape {r.shape}")
    return np.array([1.0, float(r)])


@dataclass(frozen=True)
class LambdaOptimum:
    """The minimizer of a client's personalized MSE over lambda in [0, inf].

    Attributes
    ----------
    lam : float
        The minimizer; ``inf`` when the MSE decreases all the way (the global
        model is optimal).
    mse : float
        The MSE there (its limit for ``lam = inf``).
    at_bound : bool
        True when the minimum is at lambda = 0 or lambda = inf rather than inside.
    converged : bool
        Always True: the minimizer is in closed form.
    """

    lam: float
    mse: float
    at_bound: bool
    converged: bool = True


def optimal_lambda_exact(n_clients, rho, alpha2, tau2, gamma2, *, group, r=None):
    r"""The true minimizer over lambda of :func:`personalized_mse` (closed form).

    With t = lambda/(1+lambda) the MSE is the convex parabola
    (1 - t(1 - w))^2 alpha^2 + t^2 B on t in [0, 1], so its minimizer is

    .. math:: \lambda^* = \frac{(1-w)\alpha^2}{B - w(1-w)\alpha^2}

    when the denominator is positive, and lambda = inf otherwise (B and w as
    in :func:`personalized_mse`). For opt-out clients at r* it equals
    lambda*_np of eq. (17); for private clients it is close to, but not, eq. (18)
    (see :func:`optimal_lambda_private`). A denominator within 1e-12
    (relative) of 0 is taken as 0: the MSE is then flat to rounding for large
    lambda and ``inf`` is reported.

    Parameters
    ----------
    n_clients, rho, alpha2, tau2, gamma2, group, r
        As in :func:`personalized_mse`.

    Returns
    -------
    LambdaOptimum

    Examples
    --------
    >>> opt = optimal_lambda_exact(20, 0.05, 1.0, 1.0, 0.5, group="private")
    >>> round(opt.lam, 5), round(opt.mse, 6), opt.at_bound
    (0.71429, 0.600168, False)
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    g = _group_name_iv(group, p)
    model = p.levels
    ratios = _optimal_ratios(model) if r is None else _two_ratios(r, p)
    return LambdaOptimum(*_lambda_exact(model, ratios, g))


def bayes_local_mse(n_clients, rho, alpha2, tau2, gamma2, *, group):
    r"""Equation (46) with d = 1: the Bayes MSE of a client given its data and all others' uploads.

    .. math:: \frac{\alpha^2\left(\sigma_{p_1}^2\sigma_{p_2}^2 + \tau^2 D\right)}
                   {\sigma_c^2 D + \sigma_{p_1}^2\sigma_{p_2}^2},
              \quad D = n\sigma_{p_1}^2 + m\sigma_{p_2}^2

    with sigma_{p_1}^2 = alpha^2 + tau^2 (opt-out), sigma_{p_2}^2 = sigma_{p_1}^2 +
    (1-rho) N gamma^2, and (n, m) the numbers of *other* private and opt-out
    clients. A lower bound on every estimator's MSE, attained by eq. (47).

    Examples
    --------
    >>> round(bayes_local_mse(20, 0.05, 1.0, 1.0, 0.5, group="private"), 6)
    0.597458
    """
    p = _point_iv(n_clients, rho, alpha2, tau2, gamma2)
    g = _group_name_iv(group, p)
    return float(_bayes_local(p.levels, g))


# ---------------------------------------------------------------- result object

@dataclass(frozen=True)
class FedHDPBounds:
    """Every closed-form quantity of the point-estimation model for one setting.

    Per-client values are per coordinate; those of a group with no client are NaN.

    Attributes
    ----------
    n_clients, rho, alpha2, tau2, gamma2 : the setting (N, rho_np, alpha^2, tau^2, gamma^2)
    n_nonprivate, n_private : int
        N_np = rho N and N_p = N - N_np.
    optimal_ratio : float
        r* of Lemma 1.
    server_mse_optimal, server_mse_hdp_fedavg, server_mse_dp_fedavg : float
        Server MSEs: eq. (13), HDP-FedAvg (r = 1) and DP-FedAvg.
    gap_hdp_fedavg, gap_dp_fedavg, gap_dp_vs_hdp_fedavg : float
        Lemma 2, eq. (14), (15), (16).
    lambda_nonprivate, lambda_private : float
        The paper's lambda*_np (eq. (17)) and lambda*_p (eq. (18)).
    lambda_nonprivate_exact, lambda_private_exact : float
        The true minimizers of the personalized MSE at r*.
    mse_nonprivate, mse_private : float
        Personalized MSE at r* and the paper's lambdas.
    mse_nonprivate_exact, mse_private_exact : float
        The minimum personalized MSE (at the exact lambdas).
    bayes_nonprivate, bayes_private : float
        The Bayes local MSE of eq. (46).
    """

    n_clients: int
    rho: float
    alpha2: float
    tau2: float
    gamma2: float
    n_nonprivate: int
    n_private: int
    optimal_ratio: float
    server_mse_optimal: float
    server_mse_hdp_fedavg: float
    server_mse_dp_fedavg: float
    gap_hdp_fedavg: float
    gap_dp_fedavg: float
    gap_dp_vs_hdp_fedavg: float
    lambda_nonprivate: float
    lambda_private: float
    lambda_nonprivate_exact: float
    lambda_private_exact: float
    mse_nonprivate: float
    mse_private: float
    mse_nonprivate_exact: float
    mse_private_exact: float
    bayes_nonprivate: float
    bayes_private: float

    def to_dict(self):
        """Plain dict of Python numbers (NaN and inf kept as floats)."""
        return asdict(self)


def fedhdp_bounds(n_clients, rho, alpha2, tau2, gamma2):
    """Every point-estimation result of the FedHDP paper for one setting.

    Parameters are those of :func:`group_mean_variances`.

    Returns
    -------
    FedHDPBounds

    Examples
    --------
    >>> b = fedhdp_bounds(20, 0.05, 1.0, 1.0, 0.5)
    >>> round(b.optimal_ratio, 6), round(b.server_mse_optimal, 6), round(b.gap_hdp_fedavg, 7)
    (0.173913, 0.464646, 0.0866035)
    >>> round(b.lambda_private, 5), round(b.lambda_private_exact, 5)
    (0.72263, 0.71429)
    >>> round(b.mse_private, 6), round(b.mse_private_exact, 6), round(b.bayes_private, 6)
    (0.600187, 0.600168, 0.597458)
    """
    args = (n_clients, rho, alpha2, tau2, gamma2)
    p = _point_iv(*args)
    model = p.levels
    ratios = _optimal_ratios(model)
    paper = {"nonprivate": optimal_lambda_nonprivate(*args),
             "private": optimal_lambda_private(*args)}
    per_client = {}
    for g, name in enumerate(GROUPS):
        if model.counts[g] == 0:
            per_client.update({f"lambda_{name}_exact": math.nan, f"mse_{name}": math.nan,
                               f"mse_{name}_exact": math.nan, f"bayes_{name}": math.nan})
            paper[name] = math.nan
            continue
        lam, mse, _ = _lambda_exact(model, ratios, g)
        per_client.update({
            f"lambda_{name}_exact": lam, f"mse_{name}_exact": mse,
            f"mse_{name}": _limit_or_mse(model, ratios, g, paper[name]),
            f"bayes_{name}": float(_bayes_local(model, g))})
    return FedHDPBounds(
        n_clients=p.n, rho=float(rho), alpha2=p.alpha2, tau2=p.tau2, gamma2=p.gamma2,
        n_nonprivate=p.n_np, n_private=p.n_p, optimal_ratio=optimal_ratio(*args),
        server_mse_optimal=server_mse_optimal(*args),
        server_mse_hdp_fedavg=server_mse_hdp_fedavg(*args),
        server_mse_dp_fedavg=server_mse_dp_fedavg(*args),
        gap_hdp_fedavg=hdp_fedavg_gap(*args), gap_dp_fedavg=dp_fedavg_gap(*args),
        gap_dp_vs_hdp_fedavg=dp_vs_hdp_fedavg_gap(*args),
        lambda_nonprivate=paper["nonprivate"], lambda_private=paper["private"], **per_client)


def _limit_or_mse(model, ratios, g, lam):
    """MSE at lambda, its limit (the global model's MSE) for lambda = inf."""
    if math.isinf(lam):
        c = _client(model, ratios, g)
        return c.w**2 * model.alpha2 + c.b
    return float(_personalized_mse(model, ratios, g, lam))

