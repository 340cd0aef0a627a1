"""Closed-form MSEs and bounds of the paper (spec sections C.1, C.2, C.5, C.6).

Plain functions of the model parameters. All Gaussian values are the total
over d coordinates (pass ``d=1`` for per-coordinate values). Where the paper
writes "<=" but the formula is exact (Theorem 1, the known-Beta MSEs, spec
[!3]) the docstring says so; tests check them by Monte Carlo.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ebfl._validation import (
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
)

__all__ = [
    "BetaMSE",
    "GaussianMSE",
    "beta_bounds",
    "beta_local_mse",
    "beta_posterior_mse",
    "gaussian_bounds",
    "gaussian_global_mse",
    "gaussian_mechanism_sigma_q",
    "gaussian_local_mse",
    "gaussian_oracle_mse",
    "gaussian_weight",
    "lower_bound_estimated_mean",
    "lower_bound_known_prior",
    "quantizer_sigma_q",
    "theorem1_mse",
    "theorem2_gaussian_mse",
    "theorem2_mse",
    "theorem2_quantizer_mse",
    "theorem3_rhs",
    "theorem4_rhs",
]


def _gauss_iv(m, n, sigma_theta, sigma_x, d):
    m = check_int_scalar(m, "m", minimum=2)
    n = check_int_scalar(n, "n", minimum=1)
    sigma_theta = check_nonnegative_scalar(sigma_theta, "sigma_theta")
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    d = check_int_scalar(d, "d", minimum=1)
    return m, n, sigma_theta, sigma_x, d


def gaussian_weight(m, n, sigma_theta, sigma_x, sigma_q=0.0):
    r"""Weight a on the local mean in Theorems 1 and 2.

    .. math:: a = \frac{\sigma_\theta^2 + \sigma_q^2/(m-1)}
                       {\sigma_\theta^2 + \sigma_q^2/(m-1) + \sigma_x^2/n}

    Examples
    --------
    >>> round(gaussian_weight(10_000, 15, 0.1, 0.5), 12)
    0.375
    """
    m, n, sigma_theta, sigma_x, _ = _gauss_iv(m, n, sigma_theta, sigma_x, 1)
    sigma_q = check_nonnegative_scalar(sigma_q, "sigma_q")
    het = sigma_theta**2 + sigma_q**2 / (m - 1)
    return het / (het + sigma_x**2 / n)


def theorem2_mse(m, n, sigma_theta, sigma_x, sigma_q, d=1):
    r"""Theorem 2: risk of a x_i + (1-a) mean_l q(x_l) for a mechanism of variance sigma_q^2.

    .. math:: \frac{d\sigma_x^2}{n}\left(\frac{1-a}{m} + a\right)

    Exact when the mechanism's per-coordinate variance equals sigma_q^2 for
    every input (e.g. additive Gaussian noise); an upper bound otherwise.
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    a = gaussian_weight(m, n, sigma_theta, sigma_x, sigma_q)
    return d * sigma_x**2 / n * ((1.0 - a) / m + a)


def theorem1_mse(m, n, sigma_theta, sigma_x, d=1):
    r"""Theorem 1: risk of the personalized estimator a x_i + (1 - a) mu_hat.

    d (sigma_x^2/n) ((1 - a)/m + a). The paper states "<=", but the value is
    exact (spec [!3]); it also equals the lower bound (47).

    Examples
    --------
    >>> round(theorem1_mse(10_000, 15, 0.1, 0.5), 7)
    0.006251
    """
    return theorem2_mse(m, n, sigma_theta, sigma_x, 0.0, d)


def gaussian_local_mse(n, sigma_x, d=1):
    """Risk of the local mean xbar_i: d sigma_x^2 / n (exact)."""
    n = check_int_scalar(n, "n", minimum=1)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    d = check_int_scalar(d, "d", minimum=1)
    return d * sigma_x**2 / n


def gaussian_global_mse(m, n, sigma_theta, sigma_x, d=1):
    """Risk of the global mean mu_hat alone: d((m-1)sigma_theta^2/m + sigma_x^2/(mn)) (exact)."""
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    return d * ((m - 1) * sigma_theta**2 / m + sigma_x**2 / (m * n))


def lower_bound_known_prior(n, sigma_theta, sigma_x, d=1):
    r"""Van Trees bound (46): d sigma_theta^2 sigma_x^2 / (n sigma_theta^2 + sigma_x^2).

    The Bayes risk with the prior fully known; attained by the oracle that
    knows mu (:func:`gaussian_oracle_mse`).
    """
    n = check_int_scalar(n, "n", minimum=1)
    sigma_theta = check_nonnegative_scalar(sigma_theta, "sigma_theta")
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    d = check_int_scalar(d, "d", minimum=1)
    return d * sigma_theta**2 * sigma_x**2 / (n * sigma_theta**2 + sigma_x**2)


def gaussian_oracle_mse(n, sigma_theta, sigma_x, d=1):
    """Risk of a x_i + (1 - a) mu with the true mu: d a sigma_x^2/n, equal to (46) (exact)."""
    return lower_bound_known_prior(n, sigma_theta, sigma_x, d)


def lower_bound_estimated_mean(m, n, sigma_theta, sigma_x, d=1):
    r"""Bound (47): d (sigma_theta^2 sigma_x^2 + sigma_x^4/(mn)) / (n sigma_theta^2 + sigma_x^2).

    The paper's claimed minimax bound for estimators that do not know mu. It
    equals the Theorem 1 value; the paper's derivation of it is flawed (spec
    [!19]), so treat it as a claim. The known-mu oracle legitimately beats it.
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    return d * (sigma_theta**2 * sigma_x**2 + sigma_x**4 / (m * n)) / (
        n * sigma_theta**2 + sigma_x**2)


@dataclass(frozen=True)
class GaussianMSE:
    """All Gaussian-model risks for one setting (totals over d coordinates).

    Attributes
    ----------
    weight : float
        a of Theorems 1/2.
    personalized : float
        Theorem 1 (sigma_q = 0) or Theorem 2 value.
    local, global_only, oracle : float
        Risks of xbar_i, of mu_hat alone, of the known-mu posterior mean.
    lower_known_prior, lower_estimated_mean : float
        Bounds (46) and (47).
    """

    m: int
    n: int
    sigma_theta: float
    sigma_x: float
    d: int
    sigma_q: float
    weight: float
    personalized: float
    local: float
    global_only: float
    oracle: float
    lower_known_prior: float
    lower_estimated_mean: float

    def as_dict(self):
        """Plain dict (for JSON)."""
        return asdict(self)


def gaussian_bounds(m, n, sigma_theta, sigma_x, d=1, sigma_q=0.0):
    """Every Gaussian-model risk of spec C.1/C.2 for one setting.

    Examples
    --------
    >>> b = gaussian_bounds(10_000, 15, 0.1, 0.5)
    >>> round(b.personalized, 7), round(b.local, 7), round(b.weight, 12)
    (0.006251, 0.0166667, 0.375)
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    sigma_q = check_nonnegative_scalar(sigma_q, "sigma_q")
    return GaussianMSE(
        m=m, n=n, sigma_theta=sigma_theta, sigma_x=sigma_x, d=d, sigma_q=sigma_q,
        weight=gaussian_weight(m, n, sigma_theta, sigma_x, sigma_q),
        personalized=theorem2_mse(m, n, sigma_theta, sigma_x, sigma_q, d),
        local=gaussian_local_mse(n, sigma_x, d),
        global_only=gaussian_global_mse(m, n, sigma_theta, sigma_x, d),
        oracle=gaussian_oracle_mse(n, sigma_theta, sigma_x, d),
        lower_known_prior=lower_bound_known_prior(n, sigma_theta, sigma_x, d),
        lower_estimated_mean=lower_bound_estimated_mean(m, n, sigma_theta, sigma_x, d),
    )


# ----------------------------------------------------------------- Beta-Bernoulli

def _beta_iv(alpha, beta, n):
    return (check_positive_scalar(alpha, "alpha"), check_positive_scalar(beta, "beta"),
            check_int_scalar(n, "n", minimum=1))


def beta_local_mse(alpha, beta, n):
    r"""Risk of z_i/n under a Beta(alpha, beta) population: E[p(1-p)]/n (exact).

    .. math:: \frac{\alpha\beta}{n(\alpha+\beta)(\alpha+\beta+1)}

    Examples
    --------
    >>> round(beta_local_mse(2, 2, 14), 7)
    0.0142857
    """
    alpha, beta, n = _beta_iv(alpha, beta, n)
    s = alpha + beta
    return alpha * beta / (n * s * (s + 1.0))


def beta_posterior_mse(alpha, beta, n):
    r"""Bayes risk of the known-prior posterior mean (spec C.5, exact; the paper writes "<=").

    .. math:: \frac{\alpha\beta}{(\alpha+\beta)(\alpha+\beta+1)(\alpha+\beta+n)}

    Examples
    --------
    >>> round(beta_posterior_mse(2, 2, 14), 7)
    0.0111111
    """
    alpha, beta, n = _beta_iv(alpha, beta, n)
    s = alpha + beta
    return alpha * beta / (s * (s + 1.0) * (s + n))


@dataclass(frozen=True)
class BetaMSE:
    """Known-Beta-prior risks (spec C.5).

    Attributes
    ----------
    weight : float
        a = n / (alpha + beta + n), the posterior mean's weight on z/n.
    posterior, local : float
        Risks of the posterior mean and of z/n; posterior = weight * local.
    """

    alpha: float
    beta: float
    n: int
    weight: float
    posterior: float
    local: float

    def as_dict(self):
        """Plain dict (for JSON)."""
        return asdict(self)


def beta_bounds(alpha, beta, n):
    """Known-prior Beta-Bernoulli risks for one setting."""
    alpha, beta, n = _beta_iv(alpha, beta, n)
    return BetaMSE(alpha=alpha, beta=beta, n=n, weight=n / (alpha + beta + n),
                   posterior=beta_posterior_mse(alpha, beta, n),
                   local=beta_local_mse(alpha, beta, n))


def theorem3_rhs(mean_a2, mean_one_minus_a2, m, n, alpha, beta):
    r"""Right-hand side of Theorem 3 for the leave-one-out estimator (6).

    .. math:: E[\hat a^2]\frac{\alpha\beta}{n(\alpha+\beta)(\alpha+\beta+1)}
              + E[(1-\hat a)^2]\left(\frac{\alpha\beta}{(\alpha+\beta)^2(\alpha+\beta+1)}
              + \frac{3\log(4m^2n)}{m-1}\right)

    Parameters
    ----------
    mean_a2, mean_one_minus_a2 : float
        E[a_hat^2] and E[(1 - a_hat)^2], each in [0, 1] (estimated by Monte Carlo).
    m, n : int
        Clients (>= 2) and trials per client.
    alpha, beta : float
        The true Beta prior.

    Notes
    -----
    The bound holds with probability >= 1 - 1/(mn) over the event
    |mu - mu_hat_i| <= c, |sigma^2 - sigma_hat_i^2| <= c, c^2 = 3 log(4 m^2 n)/(m-1).
    """
    mean_a2 = check_probability(mean_a2, "mean_a2")
    mean_one_minus_a2 = check_probability(mean_one_minus_a2, "mean_one_minus_a2")
    m = check_int_scalar(m, "m", minimum=2)
    alpha, beta, n = _beta_iv(alpha, beta, n)
    s = alpha + beta
    c2 = 3.0 * np.log(4.0 * m * m * n) / (m - 1)
    prior_var = alpha * beta / (s * s * (s + 1.0))
    return float(mean_a2 * beta_local_mse(alpha, beta, n)
                 + mean_one_minus_a2 * (prior_var + c2))


# ------------------------------------------------- quantized and private (Theorems 2, 4)

def quantizer_sigma_q(m, n, sigma_theta, sigma_x, k_bits, r):
    """sigma_q = b/(2^k - 1) of the k-bit quantizer with the paper's range b (spec C.3)."""
    from ebfl.privacy.mechanisms import StochasticQuantizer, paper_clip_range

    b = paper_clip_range(r, m, n, sigma_theta, sigma_x)
    return float(np.sqrt(StochasticQuantizer(k_bits, b).max_variance))


def gaussian_mechanism_sigma_q(m, n, sigma_theta, sigma_x, epsilon, delta, r):
    """sigma_q = (b/epsilon) sqrt(8 log(2/delta)) of the paper's Gaussian mechanism (spec C.4)."""
    from ebfl.privacy.mechanisms import GaussianMechanism, paper_clip_range

    b = paper_clip_range(r, m, n, sigma_theta, sigma_x)
    return GaussianMechanism(epsilon, delta, b).sigma


def theorem2_quantizer_mse(m, n, sigma_theta, sigma_x, k_bits, r, d=1):
    r"""Theorem 2, part 1: the k-bit quantizer on [-b, b], b from :func:`paper_clip_range`.

    An upper bound (the quantizer's variance is at most b^2/(2^k-1)^2), claimed
    with probability >= 1 - 2/(mn) over the clipping event (optimistic, spec [!4]).

    Examples
    --------
    >>> [round(theorem2_quantizer_mse(10_000, 15, 0.1, 0.5, k, 1.0), 7) for k in (1, 2, 8)]
    [0.0064131, 0.0062693, 0.006251]
    """
    sigma_q = quantizer_sigma_q(m, n, sigma_theta, sigma_x, k_bits, r)
    return theorem2_mse(m, n, sigma_theta, sigma_x, sigma_q, d)


def theorem2_gaussian_mse(m, n, sigma_theta, sigma_x, epsilon, delta, r, d=1):
    r"""Theorem 2, part 2: the paper's (epsilon, delta)-LDP Gaussian mechanism on [-b, b].

    Exact up to the (rare) clipping, since the noise variance does not depend
    on the input. The paper claims it for epsilon in (0, 1) only (spec [!4]).

    Examples
    --------
    >>> round(theorem2_gaussian_mse(10_000, 15, 0.1, 0.5, 1.0, 1e-5, 1.0), 6)
    0.012572
    """
    sigma_q = gaussian_mechanism_sigma_q(m, n, sigma_theta, sigma_x, epsilon, delta, r)
    return theorem2_mse(m, n, sigma_theta, sigma_x, sigma_q, d)


def theorem4_rhs(mean_a2, mean_one_minus_a2, m, n, alpha, beta, epsilon):
    r"""Right-hand side of Theorem 4 for the paper's private Bernoulli estimator.

    .. math:: E[\hat a^2]\frac{\alpha\beta}{n(\alpha+\beta)(\alpha+\beta+1)}
              + E[(1-\hat a)^2]\left(\frac{\alpha\beta}{(\alpha+\beta)^2(\alpha+\beta+1)}
              + \frac{(e^{\epsilon}+1)^2\log(4m^2n)}{3(e^{\epsilon}-1)^2(m-1)}\right)

    Notes
    -----
    As epsilon -> infinity the last term tends to log(4m^2 n)/(3(m-1)), 9 times
    smaller than Theorem 3's non-private 3 log(4m^2 n)/(m-1) (spec [!5]e).
    """
    mean_a2 = check_probability(mean_a2, "mean_a2")
    mean_one_minus_a2 = check_probability(mean_one_minus_a2, "mean_one_minus_a2")
    m = check_int_scalar(m, "m", minimum=2)
    alpha, beta, n = _beta_iv(alpha, beta, n)
    epsilon = check_positive_scalar(epsilon, "epsilon")
    s = alpha + beta
    t = np.exp(-epsilon)  # (e^eps + 1)/(e^eps - 1) = (1 + t)/(1 - t), no overflow
    cp2 = ((1.0 + t) / (1.0 - t)) ** 2 * np.log(4.0 * m * m * n) / (3.0 * (m - 1))
    prior_var = alpha * beta / (s * s * (s + 1.0))
    return float(mean_a2 * beta_local_mse(alpha, beta, n)
                 + mean_one_minus_a2 * (prior_var + cp2))
