"""Personalized estimators on quantized or locally private messages.

Theorem 2 (Gaussian model, any unbiased mechanism of known variance) and
Theorem 4 (Bernoulli model, the binary mechanism of eq. (7)), plus a corrected
private Bernoulli estimator that, unlike the paper's, learns the population
spread (spec C.2-C.4, C.7, [!5]d).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    as_generator,
    check_finite_array,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.eb.beta_binomial import _counts_iv
from ebfl.eb.gaussian import _n_iv, personalized_gaussian
from ebfl.privacy.mechanisms import BinaryMechanism, LaplaceMechanism, Mechanism

__all__ = [
    "PrivateBernoulliEstimate",
    "PrivateGaussianEstimate",
    "private_bernoulli_corrected",
    "private_bernoulli_paper",
    "private_gaussian",
]


@dataclass(frozen=True)
class PrivateGaussianEstimate:
    """Theorem 2 estimate from shared q(xbar_i).

    Attributes
    ----------
    estimate : ndarray of shape (m,) or (m, d)
        a xbar_i + (1 - a) mean_l q(xbar_l).
    weight : float or ndarray of shape (m,)
        a, with sigma_q^2 = the mechanism's ``max_variance``.
    global_mean : float or ndarray of shape (d,)
        Average of the messages.
    shared : ndarray
        The messages q(xbar_i) the server saw.
    sigma_theta : float
        The population sd used (given, or fitted from the messages).
    sigma_q : float
        sqrt(max_variance) of the mechanism.
    n_clipped : int
        Coordinates of xbar clipped to the mechanism's range before release.
    """

    estimate: np.ndarray
    weight: float | np.ndarray
    global_mean: float | np.ndarray
    shared: np.ndarray
    sigma_theta: float
    sigma_q: float
    n_clipped: int


def private_gaussian(xbar, n, mechanism, *, sigma_x, sigma_theta=None, rng=None):
    r"""Personalized Gaussian estimation when clients share q(xbar_i) (Theorem 2, eq. (4)).

    Every client sends ``mechanism.privatize(xbar_i)``; the server averages the
    messages; client i combines the average with its own exact xbar_i using

    .. math:: a = \frac{\sigma_\theta^2 + \sigma_q^2/(m-1)}
                       {\sigma_\theta^2 + \sigma_q^2/(m-1) + \sigma_x^2/n}.

    Parameters
    ----------
    xbar : array_like, shape (m,) or (m, d)
        Client means.
    n : int or array_like of int
        Samples per client.
    mechanism : Mechanism
        E.g. :class:`~ebfl.privacy.StochasticQuantizer` or
        :class:`~ebfl.privacy.GaussianMechanism`; sigma_q^2 = its ``max_variance``.
    sigma_x : float
        Known data noise sd, > 0.
    sigma_theta : float, optional
        Known population sd. If None it is fitted by moments from the messages,
        subtracting the mechanism's variance and the sampling noise:
        sigma_theta^2 = max(0, sample variance of q(xbar) - sigma_x^2 mean(1/n_i) - sigma_q^2).
        For mechanisms whose variance depends on the input (the quantizer),
        ``max_variance`` over-corrects, so the fit leans towards more sharing.
    rng : None, int, SeedSequence or Generator
        Randomness of the mechanism.

    Returns
    -------
    PrivateGaussianEstimate

    Examples
    --------
    >>> from ebfl.privacy import StochasticQuantizer
    >>> xbar = np.linspace(-1, 1, 101)
    >>> res = private_gaussian(xbar, 15, StochasticQuantizer(8, 2.0), sigma_x=0.5,
    ...                        sigma_theta=0.1, rng=0)
    >>> round(res.weight, 4)
    0.375
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be an ebfl.privacy Mechanism, got "
                        f"{type(mechanism).__name__}")
    xbar = check_finite_array(xbar, "xbar", ndim=(1, 2), min_len=2)
    n_arr = _n_iv(n, xbar.shape[0])
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    rng = as_generator(rng)
    n_clipped = mechanism.n_clipped(xbar) if hasattr(mechanism, "n_clipped") else 0
    shared = mechanism.privatize(xbar, rng)
    sigma_q2 = mechanism.max_variance
    if sigma_theta is None:
        inv_n = np.mean(1.0 / n_arr)
        raw = float(np.mean(np.var(shared, axis=0, ddof=1)) - sigma_x**2 * inv_n - sigma_q2)
        sigma_theta = float(np.sqrt(max(raw, 0.0)))
    else:
        sigma_theta = check_nonnegative_scalar(sigma_theta, "sigma_theta")
    res = personalized_gaussian(xbar, n, sigma_theta=sigma_theta, sigma_x=sigma_x,
                                shared=shared, sigma_q=float(np.sqrt(sigma_q2)))
    return PrivateGaussianEstimate(res.estimate, res.weight, res.global_mean, shared,
                                   sigma_theta, float(np.sqrt(sigma_q2)), n_clipped)


@dataclass(frozen=True)
class PrivateBernoulliEstimate:
    """Private Beta-Bernoulli estimates p_hat_i = a_i xbar_i + (1 - a_i) mu_hat_i.

    Attributes
    ----------
    estimate : ndarray of shape (m,)
    weight : ndarray of shape (m,)
        a_i, clipped to [0, 1].
    centre : ndarray of shape (m,)
        mu_hat_i, leave-one-out mean of the other clients' messages.
    variance : ndarray of shape (m,)
        sigma_hat_i^2, the estimator's population-variance estimate.
    shared : ndarray of shape (m,)
        The messages the server saw.
    epsilon : float
        Each client's epsilon-LDP level.
    n_clipped : int
        Weights that left [0, 1] and were clipped.
    """

    estimate: np.ndarray
    weight: np.ndarray
    centre: np.ndarray
    variance: np.ndarray
    shared: np.ndarray
    epsilon: float
    n_clipped: int


def _loo_mean_and_squares(v, centre_on="own"):
    """Leave-one-out means and (1/(m-2)) sums of squares of ``v``, O(m).

    centre_on="own": sum_{l != i} (v_l - mu_i)^2; "printed": sum_{l != i} (v_l - mu_l)^2.
    """
    m = v.size
    total = v.sum()
    mu = (total - v) / (m - 1.0)
    y = v - total / m
    ssq = np.sum(y * y)
    if centre_on == "own":
        s2 = (ssq - y * y * m / (m - 1.0)) / (m - 2.0)
    else:
        s2 = (m / (m - 1.0)) ** 2 * (ssq - y * y) / (m - 2.0)
    return mu, np.maximum(s2, 0.0)


def _clip_weight(a):
    clipped = (a < 0) | (a > 1) | ~np.isfinite(a)
    a = np.where(np.isnan(a), 1.0, a)
    return np.clip(a, 0.0, 1.0), int(clipped.sum())


def private_bernoulli_paper(successes, trials, epsilon, *, rng=None):
    r"""The paper's epsilon-LDP Bernoulli estimator (Theorem 4), exactly as printed.

    Client l sends q_priv(xbar_l) (:class:`~ebfl.privacy.BinaryMechanism`); the
    server computes, leaving client i out, mu_i = mean_{l != i} q_l and
    sigma_i^2 = (1/(m-2)) sum_{l != i} (q_l - mu_l)^2 (centred on mu_l as in eq. (6));
    client i uses a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 + n_i) (no "-1") and
    p_hat_i = a_i xbar_i + (1 - a_i) mu_i.

    Notes
    -----
    The messages are two-valued with a law that depends on the clients only
    through mu = E[xbar], so sigma_i^2 tends to e^eps/(e^eps-1)^2 + mu(1-mu)
    whatever the population spread, and a_i >= about n/(n+1): the estimator is
    close to the local one even as epsilon grows (spec [!5]d). Use
    :func:`private_bernoulli_corrected` for an estimator that learns the spread.
    Weights outside [0, 1] (possible, as mu_i may leave [0, 1]) are clipped.

    Examples
    --------
    >>> from ebfl import BetaBernoulliPopulation
    >>> p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(5000, 14, rng=0)
    >>> res = private_bernoulli_paper(z, n, 5.0, rng=1)
    >>> bool(res.weight.mean() > 14 / 15)
    True
    """
    z, n = _counts_iv(successes, trials)
    epsilon = check_positive_scalar(epsilon, "epsilon")
    _check_loo_size(z.size)
    x = z / n
    shared = BinaryMechanism(epsilon).privatize(x, as_generator(rng))
    mu, s2 = _loo_mean_and_squares(shared, centre_on="printed")
    with np.errstate(divide="ignore", invalid="ignore"):
        a = n / (mu * (1.0 - mu) / s2 + n)
    a, n_clipped = _clip_weight(a)
    return PrivateBernoulliEstimate(a * x + (1 - a) * mu, a, mu, s2, shared, epsilon, n_clipped)


def private_bernoulli_corrected(successes, trials, epsilon, *, rng=None):
    r"""An epsilon-LDP Bernoulli estimator that learns the population spread.

    Client l sends xbar_l + Laplace(1/epsilon) noise (the Laplace mechanism on
    [0, 1], sensitivity 1: the same epsilon-LDP as eq. (7)). With h_i the
    leave-one-out mean of 1/n_l, the server estimates, leaving client i out,

    - mu_i = mean_{l != i} q_l (unbiased for mu);
    - V_i = (1/(m-2)) sum_{l != i} (q_l - mu_i)^2 - 2/epsilon^2, unbiased for the
      average Var(xbar_l) = sigma^2 (1 - h) + mu(1 - mu) h;
    - sigma_i^2 = max(0, (V_i - mu_i(1 - mu_i) h_i) / (1 - h_i));

    then a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 - 1 + n_i) (the Beta-posterior weight,
    0 when sigma_i^2 = 0) and p_hat_i = a_i xbar_i + (1 - a_i) mu_i.

    As epsilon -> infinity the noise term vanishes and this is a consistent
    non-private moment estimator, so the estimator recovers non-private
    empirical Bayes; the paper's :func:`private_bernoulli_paper` does not.

    Notes
    -----
    Why it works: E(q_l - mu)^2 = Var(xbar_l) + 2/epsilon^2 exactly, and for a Beta
    population Var(xbar_l) = sigma^2 + (mu(1-mu) - sigma^2)/n_l, so subtracting
    the known mechanism variance and inverting gives sigma^2 up to the O(1/m)
    bias of plugging mu_i into mu(1-mu). Needs some n_l >= 2 (h < 1).

    Examples
    --------
    >>> from ebfl import BetaBernoulliPopulation
    >>> p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(20000, 14, rng=0)
    >>> res = private_bernoulli_corrected(z, n, 50.0, rng=1)
    >>> bool(abs(res.weight.mean() - 14 / 18) < 0.02)
    True
    """
    z, n = _counts_iv(successes, trials)
    epsilon = check_positive_scalar(epsilon, "epsilon")
    _check_loo_size(z.size)
    x = z / n
    mechanism = LaplaceMechanism(epsilon, 0.5)
    shared = 0.5 + mechanism.privatize(x - 0.5, as_generator(rng))
    mu, s2 = _loo_mean_and_squares(shared, centre_on="own")
    inv_n = 1.0 / n
    h = (inv_n.sum() - inv_n) / (z.size - 1.0)
    if np.any(h >= 1.0):
        raise ValueError("private_bernoulli_corrected needs clients with trials >= 2 "
                         "(the spread is not identifiable from single trials)")
    u = mu * (1.0 - mu)
    sigma2 = np.maximum((s2 - mechanism.max_variance - u * h) / (1.0 - h), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(sigma2 > 0, n * sigma2 / (u - sigma2 + n * sigma2), 0.0)
    a, n_clipped = _clip_weight(a)
    return PrivateBernoulliEstimate(a * x + (1 - a) * mu, a, mu, sigma2, shared, epsilon,
                                    n_clipped)


def _check_loo_size(m):
    if m < 3:
        raise ValueError(f"leave-one-out estimation needs at least 3 clients, got {m}")
