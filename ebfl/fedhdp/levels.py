r"""FedHDP's theory with several privacy levels (Appendix A.1-A.3 and A.6 of the paper).

The model is :mod:`ebfl.fedhdp.theory`'s, with the clients split into privacy
levels: ``counts = (N_1, ..., N_l)`` clients whose group means carry privacy
noise of variances ``gammas2 = (gamma_1^2, ..., gamma_l^2)``:

* two levels (Appendix A.1-A.3): eq. (33), (34), (50), (52)-(54);
* l levels (Appendix A.6): eq. (62), (64), (65), (73), and the exact MSE of the
  personalized estimator with its true minimizer over lambda.

Accepted ranges are those of :mod:`ebfl.fedhdp.theory`.
"""

from __future__ import annotations

import math

import numpy as np

from ebfl._validation import check_counts
from ebfl.fedhdp.theory import (
    MAX_COUNT,
    LambdaOptimum,
    _bayes_local,
    _group_iv,
    _lam_iv,
    _lambda_exact,
    _Levels,
    _levels_iv,
    _matching_lambda,
    _optimal_ratios,
    _out,
    _personalized_mse,
    _ratios_iv,
    _server_mse,
    _sigma2,
    _weights,
)

__all__ = [
    "levels_bayes_local_mse",
    "levels_optimal_lambda",
    "levels_optimal_lambda_exact",
    "levels_optimal_ratios",
    "levels_personalized_mse",
    "levels_server_mse",
    "levels_server_variance",
    "levels_weights",
    "two_level_matching_lambdas",
    "two_level_optimal_lambdas",
    "two_level_optimal_ratio",
    "two_level_server_covariance",
]


# --------------------------------------- two privacy levels (Appendix A.1-A.3)


def _two_levels_iv(counts, alpha2, tau2, gammas2):
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    if model.counts.size != 2:
        raise ValueError(f"counts must hold two groups (N_1, N_2), got {model.counts.size}")
    return model


def two_level_optimal_ratio(counts, alpha2, tau2, gammas2):
    r"""Lemma 5, equation (33) = (58): the optimal ratio of group 2's weight to group 1's.

    .. math:: r^* = \frac{\sigma_c^2 + N_1\gamma_1^2}{\sigma_c^2 + N_2\gamma_2^2}

    Parameters
    ----------
    counts : (int, int)
        N_1, N_2 (clients at the looser and the stricter privacy level).
    alpha2, tau2 : float
        alpha^2 = beta^2/n_s > 0 and tau^2 >= 0.
    gammas2 : (float, float)
        gamma_1^2, gamma_2^2 >= 0, the privacy-noise variances of the groups' means.

    Examples
    --------
    >>> round(two_level_optimal_ratio((5, 15), 1.0, 1.0, (0.05, 0.5)), 6)
    0.236842
    """
    model = _two_levels_iv(counts, alpha2, tau2, gammas2)
    return float(_optimal_ratios(model)[1])


def two_level_server_covariance(counts, alpha2, tau2, gammas2):
    r"""Lemma 5, equation (34): the server's error covariance at r* (times I_d).

    .. math:: \Sigma_{s,opt} = \frac1N\,\frac{(\sigma_c^2+N_1\gamma_1^2)(\sigma_c^2+N_2\gamma_2^2)}
              {\sigma_c^2 + (1-\rho_1)N_1\gamma_1^2 + \rho_1N_2\gamma_2^2}

    Parameters as in :func:`two_level_optimal_ratio`.

    Examples
    --------
    >>> round(two_level_server_covariance((5, 15), 1.0, 1.0, (0.05, 0.5)), 6)
    0.263077
    """
    model = _two_levels_iv(counts, alpha2, tau2, gammas2)
    (n1, n2), (v1, v2) = model.counts, model.v
    n = n1 + n2
    sc, rho1 = model.alpha2 + model.tau2, n1 / n
    return float((sc + v1) * (sc + v2) / (sc + (1 - rho1) * v1 + rho1 * v2) / n)


def two_level_optimal_lambdas(counts, alpha2, tau2, gammas2):
    r"""Lemma 6, equation (50) = (59): the paper's lambda* for groups C_1 and C_2.

    With Upsilon^2 = tau^2/alpha^2, Gamma_i^2 = N_i gamma_i^2/alpha^2, N = N_1 + N_2:

    .. math:: \lambda_1^* = \frac{N(1+\Upsilon^2) + N_1\Gamma_2^2 + N_2\Gamma_1^2}
              {N\Upsilon^2(1+\Upsilon^2) + \Upsilon^2((N_2+1)\Gamma_1^2 + N_1\Gamma_2^2)
               + \Gamma_1^2(1+\Gamma_2^2)}

    and lambda*_2 the same with the roles of the groups in the denominator
    swapped. Equal to the three coefficient-matching values (52)-(54) (which
    coincide at r = r*, so their average (55) changes nothing) and to
    :func:`levels_optimal_lambda`. Like eq. (18), exact only for a group with
    gamma_i^2 = 0; for a noisy group the minimizer is
    :func:`levels_optimal_lambda_exact` (e.g. 0.96796 and 0.82399 below).

    Returns
    -------
    (float, float)
        lambda*_1, lambda*_2 (``inf`` for a zero denominator).

    Examples
    --------
    >>> [round(x, 5) for x in two_level_optimal_lambdas((5, 15), 1.0, 1.0, (0.05, 0.5))]
    [0.9716, 0.82803]
    """
    model = _two_levels_iv(counts, alpha2, tau2, gammas2)
    (n1, n2), (v1, v2) = model.counts, model.v
    n = n1 + n2
    u2, g1, g2 = model.tau2 / model.alpha2, v1 / model.alpha2, v2 / model.alpha2
    # Numerator and denominators divided by s = max(1, Upsilon^2, Gamma_i^2), one factor of
    # each product at a time: the printed products (e.g. Gamma_1^2 Gamma_2^2) overflow
    # float64 in the accepted ranges; the ratios do not.
    s = max(1.0, u2, g1, g2)
    num = n * ((1 + u2) / s) + n1 * (g2 / s) + n2 * (g1 / s)
    den1 = n * u2 * ((1 + u2) / s) + u2 * (((n2 + 1) * g1 + n1 * g2) / s) + g1 * ((1 + g2) / s)
    den2 = n * u2 * ((1 + u2) / s) + u2 * ((n2 * g1 + (n1 + 1) * g2) / s) + g2 * ((1 + g1) / s)
    return tuple(math.inf if den == 0.0 else float(num / den) for den in (den1, den2))


def two_level_matching_lambdas(group, counts, alpha2, tau2, gammas2):
    r"""Equations (52)-(54): the lambdas that match each coefficient of (49) to (47).

    Matching the weight on phi_hat_j gives lambda_1, on the sum over C_1 lambda_2,
    and on the sum over C_2 lambda_3, with r = r*, S = N_1 + N_2 r,
    D = n sigma_{p_1}^2 + m sigma_{p_2}^2 and i_j = 1 (C_1) or r (C_2):

    .. math:: \lambda_1 = \frac{S(\sigma_c^2-\tau^2)D}
              {S(\tau^2 D + \sigma_{p_1}^2\sigma_{p_2}^2) - i_j(\sigma_c^2D
               + \sigma_{p_1}^2\sigma_{p_2}^2)},\quad
              \lambda_2 = \lambda_3 = \frac{S(\sigma_c^2-\tau^2)\sigma_{p_2}^2}
              {\sigma_c^2D + \sigma_{p_1}^2\sigma_{p_2}^2 - S(\sigma_c^2-\tau^2)\sigma_{p_2}^2}

    Eq. (52) prints "n sigma_c^2 + m sigma_p^2" in its last factor; it must be
    D (as in the rest of the equation) for the derivation to hold (errata
    [FedHDP 3]). At r = r* the three values are equal, so Lemma 6's average (55) is
    each of them: eq. (50).

    Parameters
    ----------
    group : {0, 1}
        0 for a client of C_1, 1 for C_2.
    counts, alpha2, tau2, gammas2
        As in :func:`two_level_optimal_ratio`.

    Returns
    -------
    (float, float, float)

    Examples
    --------
    >>> [round(x, 5) for x in two_level_matching_lambdas(1, (5, 15), 1.0, 1.0, (0.05, 0.5))]
    [0.82803, 0.82803, 0.82803]
    """
    model = _two_levels_iv(counts, alpha2, tau2, gammas2)
    g = _group_iv(group, model)
    s1, s2 = _sigma2(model)
    (n1, n2) = model.counts
    r = s1 / s2
    big_s = n1 + n2 * r
    n, m, i_j = (n2, n1 - 1, 1.0) if g == 0 else (n2 - 1, n1, r)
    d = n * s1 + m * s2
    a, core = model.alpha2, i_j * model.v[g] + model.tau2 * big_s
    # The denominators of (52) and (54) expand to d * core and s2 * core; as printed they
    # subtract terms of size s^2 down to one of size tau^2 s (lambda = -7e16 at alpha2 = 1e100)
    lam1, lam2 = _divide(big_s * a * d, d * core), _divide(big_s * a * s2, s2 * core)
    return lam1, lam2, lam2


def _divide(num, den):
    """num / den for a lambda: inf when the denominator vanishes."""
    return math.inf if den == 0.0 else float(num / den)


# ----------------------------------------------- l privacy levels (Appendix A.6)

def levels_server_variance(counts, alpha2, tau2, gammas2):
    r"""Equation (62): Sigma_theta, the Bayes (and FedHDP at r*) error variance of the server.

    .. math:: \Sigma_\theta = \frac{\prod_i \sigma_{p_i}^2}{\sum_i N_i\prod_{k\ne i}\sigma_{p_k}^2}
              = \Big(\sum_i N_i/\sigma_{p_i}^2\Big)^{-1}

    Parameters
    ----------
    counts : array_like of int (l,)
        N_i >= 0, clients per privacy level (at least 2 in all).
    alpha2, tau2 : float
        As in :func:`two_level_optimal_ratio`.
    gammas2 : array_like of float (l,)
        gamma_i^2 >= 0, privacy-noise variance of each group's mean (0: opt-out).

    Examples
    --------
    >>> round(levels_server_variance([5, 15], 1.0, 1.0, [0.05, 0.5]), 6)
    0.263077
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    return float(1.0 / np.sum(model.counts / _sigma2(model)))


def levels_optimal_ratios(counts, alpha2, tau2, gammas2):
    r"""Equation (65): r*_i = sigma_{p_1}^2 / sigma_{p_i}^2, group 1 the reference (r*_1 = 1).

    Examples
    --------
    >>> levels_optimal_ratios([5, 15, 10], 1.0, 1.0, [0.0, 0.5, 1.0]).round(4).tolist()
    [1.0, 0.2105, 0.1667]
    """
    return _optimal_ratios(_levels_iv(counts, alpha2, tau2, gammas2))


def levels_weights(counts, ratios):
    r"""Equation (64): the server's weight of one client of each group, r_i / sum_k N_k r_k.

    Parameters
    ----------
    counts : array_like of int (l,)
        N_i >= 0.
    ratios : array_like of float (l,)
        r_i >= 0, not all 0 on the groups with clients.

    Returns
    -------
    ndarray (l,)
        Per-client weights (sum_i N_i w_i = 1).

    Examples
    --------
    >>> levels_weights([1, 19], [1.0, 1.0]).tolist()
    [0.05, 0.05]
    """
    counts = check_counts(counts, "counts")
    if counts.size == 0 or counts.max() > MAX_COUNT:
        raise ValueError(f"counts must hold one integer in [0, 2**53] per group, got "
                         f"{counts.tolist()}")
    model = _Levels(counts.astype(np.float64), 1.0, 0.0, np.zeros(counts.size))
    return _weights(model.counts, _ratios_iv(ratios, model))


def levels_server_mse(counts, alpha2, tau2, gammas2, *, ratios=None):
    r"""The server's MSE sum_i N_i w_i^2 sigma_{p_i}^2 for any ratios (r* by default).

    Equals :func:`levels_server_variance` (eq. (62)) at the ratios of eq. (65).

    Examples
    --------
    >>> round(levels_server_mse([1, 19], 1.0, 10.0, [0.0, 1.0], ratios=[1.0, 0.1]), 4)
    1.9857
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    return _server_mse(model, _ratios_iv(ratios, model))


def levels_bayes_local_mse(group, counts, alpha2, tau2, gammas2):
    r"""Equation (73) (equation (46) for l = 2): the Bayes MSE of a client of ``group``.

    .. math:: \Sigma_{\theta_j^*} = \left(\frac{1}{V + \tau^2} + \frac{1}{\alpha^2}\right)^{-1},
              \quad V = \Big(\sum_i M_i/\sigma_{p_i}^2\Big)^{-1}

    with M_i the clients of group i other than c_j (eq. (70)); V is the error
    variance of the other clients' fused estimate of phi (eq. (69)).

    Parameters
    ----------
    group : int
        Index of the client's group (0-based), with N_group >= 1.
    counts, alpha2, tau2, gammas2
        As in :func:`levels_server_variance`.

    Examples
    --------
    >>> round(levels_bayes_local_mse(1, [1, 19], 1.0, 1.0, [0.0, 0.5]), 6)
    0.597458
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    return float(_bayes_local(model, _group_iv(group, model)))


def levels_personalized_mse(lam, group, counts, alpha2, tau2, gammas2, *, ratios=None):
    r"""Exact MSE of theta_hat_j(lambda) = (phi_hat_j + lambda theta_hat)/(1+lambda), equation (75).

    As :func:`~ebfl.fedhdp.theory.personalized_mse`, for l groups and any ratios (r* of eq. (65)
    by default).

    Examples
    --------
    >>> round(levels_personalized_mse(0.72263, 1, [1, 19], 1.0, 1.0, [0.0, 0.5]), 6)
    0.600187
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    g = _group_iv(group, model)
    ratios = _ratios_iv(ratios, model)
    return _out(_personalized_mse(model, ratios, g, _lam_iv(lam)))


def levels_optimal_lambda_exact(group, counts, alpha2, tau2, gammas2, *, ratios=None):
    """The true minimizer over lambda of :func:`levels_personalized_mse` (closed form).

    See :func:`~ebfl.fedhdp.theory.optimal_lambda_exact`.

    Returns
    -------
    LambdaOptimum

    Examples
    --------
    >>> opt = levels_optimal_lambda_exact(1, [5, 15], 1.0, 1.0, [0.05, 0.5])
    >>> round(opt.lam, 5), opt.at_bound
    (0.82399, False)
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    g = _group_iv(group, model)
    return LambdaOptimum(*_lambda_exact(model, _ratios_iv(ratios, model), g))


def levels_optimal_lambda(group, counts, alpha2, tau2, gammas2):
    r"""The paper's lambda* for l levels (Appendix A.6 leaves it implicit), at r*.

    Matching the coefficients of eq. (76) to those of the Bayes estimator (74),
    with the client's own upload taken as noise-free as in eq. (49), gives for a
    client of group g with FedHDP weight w_g (eq. (64) at r*)

    .. math:: \lambda_g^* = \frac{\alpha^2}{\tau^2 + w_g N_g\gamma_g^2}

    which is eq. (17) and (18) for point estimation and eq. (50) for two
    levels. Exact (the minimizer, reaching eq. (73)) when gamma_g^2 = 0; an
    approximation otherwise (:func:`levels_optimal_lambda_exact`). ``inf`` when
    tau^2 = 0 and gamma_g^2 = 0.

    Examples
    --------
    >>> round(levels_optimal_lambda(1, [1, 19], 1.0, 1.0, [0.0, 0.5]), 5)
    0.72263
    """
    model = _levels_iv(counts, alpha2, tau2, gammas2)
    return _matching_lambda(model, _group_iv(group, model))
