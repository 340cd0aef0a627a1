"""The two halves of the private and leave-one-out estimators.

A private estimator of :mod:`ebfl.privacy.estimators` is one round of a
protocol: each client **releases** a privatized summary (client half:
:func:`corrected_mechanism`, :func:`corrected_release`); the server
**broadcasts** the sums of the releases (server half:
:func:`leave_one_out_sums`); each client then takes its own **shrinkage step**
from the sums, leaving its own release out (client half again:
:func:`theorem4_shrinkage`, :func:`corrected_shrinkage`, built on
:func:`others_mean` and :func:`others_mean_and_squares`).

The in-process estimators run the steps on all clients' releases at once;
the federated protocols (:class:`ebfl.federated.EBBetaBinomial`) run them
client by client from a broadcast message. Both call these functions, so the
two agree to the last bit when they see the same releases.

A client whose release is in the sums (``included``) leaves itself out
(k = m - 1 others); one outside them (it failed in a federated fitting round)
has all m clients as its others.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ebfl._validation import check_choice, check_nonnegative_scalar
from ebfl.privacy.mechanisms import LaplaceMechanism

__all__ = [
    "DEFAULT_UCB_Z",
    "VARIANCE_RULES",
    "LeaveOneOutSums",
    "Shrinkage",
    "check_spread_identifiable",
    "check_variance_rule",
    "corrected_mechanism",
    "corrected_release",
    "corrected_shrinkage",
    "leave_one_out_sums",
    "others_mean",
    "others_mean_and_squares",
    "theorem4_shrinkage",
]


#: How an estimated population variance enters the weights (see the estimators).
VARIANCE_RULES = ("ucb", "plugin")

#: Default one-sided z of the upper confidence bound (Phi(3) = 0.99865).
DEFAULT_UCB_Z = 3.0


def _upper_bound(raw, ucb_z, se, cap):
    """min(raw + z se, cap); the cap itself where se is infinite (noise swamps the data)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isfinite(se), np.minimum(raw + ucb_z * se, cap), cap)


def check_variance_rule(variance, ucb_z):
    """Validate the ``variance`` rule and ``ucb_z`` of a private estimator.

    Returns
    -------
    (str, float)
        ``variance`` (one of :data:`VARIANCE_RULES`) and ``ucb_z`` in [0, 40].
    """
    check_choice(variance, "variance", VARIANCE_RULES)
    ucb_z = check_nonnegative_scalar(ucb_z, "ucb_z")
    if ucb_z > 40.0:
        raise ValueError(f"ucb_z must lie in [0, 40] (a one-sided normal quantile), got {ucb_z!r}")
    return variance, ucb_z


def _local_safe_weight(upper, tau2, v):
    r"""Smallest weight a with a^2 v + (1-a)^2 (s + tau2) <= v for every s <= ``upper``.

    The risk of a x_i + (1 - a) mu_hat is a^2 v + (1 - a)^2 (sigma^2 + tau^2)
    (v: sampling variance of x_i, tau^2: variance of mu_hat); it is at most the
    local risk v iff a >= (sigma^2 + tau^2 - v)/(sigma^2 + tau^2 + v), which
    increases in sigma^2. NaN (0/0) means nothing to protect: no floor.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        floor = (upper + tau2 - v) / (upper + tau2 + v)
    return np.clip(np.where(np.isnan(floor), 0.0, floor), 0.0, 1.0)


# --------------------------------------------------------------------------- the server's sums


class LeaveOneOutSums(NamedTuple):
    """What the server broadcasts so that every client can leave itself out."""

    #: m, the number of values summed.
    count: int
    #: sum of the values.
    total: float
    #: sum of squared deviations from their mean.
    ssq: float


class Shrinkage(NamedTuple):
    """p_hat_i = a_i xbar_i + (1 - a_i) mu_i and its parts (see PrivateBernoulliEstimate)."""

    estimate: np.ndarray
    weight: np.ndarray
    centre: np.ndarray
    variance: np.ndarray
    n_clipped: int
    upper: np.ndarray | None = None


def leave_one_out_sums(v):
    """The server half: count, sum and sum of squared deviations of the releases ``v``.

    Parameters
    ----------
    v : ndarray of float, shape (m,)
        The clients' released values (validated by the caller).

    Returns
    -------
    LeaveOneOutSums
    """
    m = v.size
    total = v.sum()
    y = v - total / m
    return LeaveOneOutSums(m, total, np.sum(y * y))


# --------------------------------------------------------------------------- each client's step


def others_mean(v, included, m, total):
    """Mean of the other clients' values, from the sum ``total`` over the m in the sums.

    ``included`` (bool or bool array) says whether a client's own value is in
    ``total`` (then it has m - 1 others) or not (all m are its others).
    """
    return np.where(included, (total - v) / (m - 1.0), total / m)


def others_mean_and_squares(v, included, sums, centre_on):
    """Mean of the other clients' values and (1/(k-1)) sum of their squared deviations, O(1).

    With y_i = v_i - mean(v): centre_on="own" gives sum_{l != i} (v_l - mu_i)^2 =
    ssq - y_i^2 m/(m-1); "printed" gives sum_{l != i} (v_l - mu_l)^2 = (m/(m-1))^2
    (ssq - y_i^2), centred on each other client's leave-one-out mean mu_l as eq. (6)
    of Ozkara et al. is printed.
    """
    m, total, ssq = sums
    y = v - total / m
    factor = (m / (m - 1.0)) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        if centre_on == "own":
            inside = (ssq - y * y * m / (m - 1.0)) / (m - 2.0)
            outside = ssq / (m - 1.0)
        else:
            inside = factor * (ssq - y * y) / (m - 2.0)
            outside = factor * ssq / (m - 1.0)
    mu = others_mean(v, included, m, total)
    return mu, np.maximum(np.where(included, inside, outside), 0.0)  # rounding: sums of squares


def theorem4_shrinkage(x, n, release, included, sums):
    """Theorem 4's weights a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 + n_i), clipped to [0, 1]."""
    mu, s2 = others_mean_and_squares(release, included, sums, "printed")
    with np.errstate(divide="ignore", invalid="ignore"):
        a = n / (mu * (1.0 - mu) / s2 + n)
    a, n_clipped = _clip_weight(a)
    return Shrinkage(a * x + (1 - a) * mu, a, mu, s2, n_clipped)


def corrected_shrinkage(x, n, release, included, sums, inv_trials_total, mechanism, variance,
                         ucb_z):
    """The weights of :func:`~ebfl.privacy.private_bernoulli_corrected` (see its Notes).

    ``inv_trials_total``: sum of 1/n_l over the m clients in ``sums``; ``mechanism``:
    the Laplace mechanism of the releases (its variance is subtracted).
    """
    m = sums[0]
    others = np.where(included, m - 1.0, float(m))
    mu, s2 = others_mean_and_squares(release, included, sums, "own")
    h = others_mean(1.0 / n, included, m, inv_trials_total)
    u = mu * (1.0 - mu)
    v_hat = s2 - mechanism.max_variance
    raw = (v_hat - u * h) / (1.0 - h)
    plugin = np.maximum(raw, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(plugin > 0, n * plugin / (u - plugin + n * plugin), 0.0)
    a, n_clipped = _clip_weight(a)
    upper = None
    if variance == "ucb":
        excess = mechanism.square_variance_excess(np.clip(v_hat, 0.0, 0.25))
        se = np.sqrt(excess / (others - 1.0)) / (1.0 - h)
        upper = _upper_bound(raw, ucb_z, se, u)
        a = np.maximum(a, _local_safe_weight(upper, s2 / others, (u - upper) / n))
    return Shrinkage(a * x + (1 - a) * mu, a, mu, plugin, n_clipped, upper)


# --------------------------------------------------------------------------- the client's release


def corrected_mechanism(epsilon):
    """The Laplace mechanism of :func:`~ebfl.privacy.private_bernoulli_corrected`.

    It acts on xbar - 1/2 in [-1/2, 1/2] (sensitivity 1); it validates ``epsilon``.
    """
    return LaplaceMechanism(epsilon, 0.5)


def corrected_release(mechanism, x, rng):
    """1/2 + the mechanism on x - 1/2: what a client of the corrected estimator sends."""
    return 0.5 + mechanism.privatize(x - 0.5, rng)


def check_spread_identifiable(inv_trials, who):
    """Refuse when some client's others all have one trial (h_i = 1: no spread to learn)."""
    h = others_mean(inv_trials, True, inv_trials.size, inv_trials.sum())
    if np.any(h >= 1.0):
        raise ValueError(f"{who} needs clients with trials >= 2 (the spread is not identifiable "
                         "from single trials)")


def _clip_weight(a):
    clipped = (a < 0) | (a > 1) | ~np.isfinite(a)
    a = np.where(np.isnan(a), 1.0, a)
    return np.clip(a, 0.0, 1.0), int(clipped.sum())

