r"""Closed-form MSEs and bounds of the paper (Theorems 1-4, eqs. (46)-(47)).

Plain functions of the model parameters. All Gaussian values are the total
over d coordinates (pass ``d=1`` for per-coordinate values). Where the paper
writes "<=" but the formula is exact (Theorem 1, the known-Beta MSEs, errata
[!3] on the errata page) the docstring says so; tests check them by Monte Carlo.

Accepted ranges (outside them ``ValueError`` names the argument): standard
deviations (:math:`\sigma_\theta, \sigma_x, \sigma_q`) 0 or in
:math:`[10^{-100}, 10^{100}]`; counts m, n, d and k_bits integers up to
:math:`2^{53}`; :math:`\alpha, \beta, \epsilon` finite and > 0 (:math:`\epsilon` in
:math:`[10^{-150}, 10^{150}]` as for the mechanisms). The formulas are written so that
no intermediate value leaves float64 in these ranges; a result that itself overflows
(e.g. :math:`d \sigma_x^2 / n` beyond 1.8e308) raises ``ValueError``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

from ebfl._validation import (
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
    check_standard_deviation,
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
    "gaussian_mechanism_true_delta",
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

#: Largest accepted count (m, n, d, k_bits): exactly representable as a float.
MAX_COUNT = 2**53


def _count(value, name, minimum):
    value = check_int_scalar(value, name, minimum=minimum)
    if value > MAX_COUNT:
        raise ValueError(f"{name} must be an integer in [{minimum}, 2**53], got {value}")
    return value




def _finite(value, what):
    """Refuse a result that overflows float64, saying which arguments to shrink."""
    if not math.isfinite(value):
        raise ValueError(f"{what} overflows float64 for these arguments")
    return float(value)


def _gauss_iv(m, n, sigma_theta, sigma_x, d):
    m = _count(m, "m", 2)
    n = _count(n, "n", 1)
    sigma_theta = check_standard_deviation(sigma_theta, "sigma_theta", zero_ok=True)
    sigma_x = check_standard_deviation(sigma_x, "sigma_x", zero_ok=False)
    d = _count(d, "d", 1)
    return m, n, sigma_theta, sigma_x, d


def gaussian_weight(m, n, sigma_theta, sigma_x, sigma_q=0.0):
    r"""Weight :math:`a` on the local mean in Theorems 1 and 2.

    .. math:: a = \frac{\sigma_\theta^2 + \sigma_q^2/(m-1)}
                       {\sigma_\theta^2 + \sigma_q^2/(m-1) + \sigma_x^2/n}

    Examples
    --------
    >>> round(gaussian_weight(10_000, 15, 0.1, 0.5), 12)
    0.375
    """
    m, n, sigma_theta, sigma_x, _ = _gauss_iv(m, n, sigma_theta, sigma_x, 1)
    sigma_q = check_standard_deviation(sigma_q, "sigma_q", zero_ok=True)
    return _weight(m, n, sigma_theta, sigma_x, sigma_q)


def _weight(m, n, sigma_theta, sigma_x, sigma_q):
    het = sigma_theta**2 + sigma_q**2 / (m - 1)
    return het / (het + sigma_x**2 / n)


def theorem2_mse(m, n, sigma_theta, sigma_x, sigma_q, d=1):
    r"""Theorem 2: risk of :math:`a x_i + (1-a) \frac1m \sum_l q(x_l)` for a mechanism q.

    For a mechanism of per-coordinate variance :math:`\sigma_q^2`:

    .. math:: \frac{d\sigma_x^2}{n}\left(\frac{1-a}{m} + a\right),

    with :math:`a` of :func:`gaussian_weight`. Exact when the mechanism's per-coordinate
    variance equals :math:`\sigma_q^2` for every input (e.g. additive Gaussian noise);
    an upper bound otherwise.
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    sigma_q = check_standard_deviation(sigma_q, "sigma_q", zero_ok=True)
    return _theorem2(m, n, sigma_theta, sigma_x, sigma_q, d)


def _theorem2(m, n, sigma_theta, sigma_x, sigma_q, d):
    a = _weight(m, n, sigma_theta, sigma_x, sigma_q)
    return _finite(d * sigma_x**2 / n * ((1.0 - a) / m + a), "the MSE d sigma_x^2/n (...)")


def theorem1_mse(m, n, sigma_theta, sigma_x, d=1):
    r"""Theorem 1: risk of the personalized estimator :math:`a x_i + (1 - a) \hat\mu`.

    .. math:: \frac{d\sigma_x^2}{n}\left(\frac{1-a}{m} + a\right),

    with :math:`a` of :func:`gaussian_weight` (:math:`\sigma_q = 0`). The paper states
    "<=", but the value is exact (errata [!3]); it also equals the lower bound (47).

    Examples
    --------
    >>> round(theorem1_mse(10_000, 15, 0.1, 0.5), 7)
    0.006251
    """
    return theorem2_mse(m, n, sigma_theta, sigma_x, 0.0, d)


def gaussian_local_mse(n, sigma_x, d=1):
    r"""Risk of the local mean :math:`\bar x_i`: :math:`d \sigma_x^2 / n` (exact)."""
    n = _count(n, "n", 1)
    sigma_x = check_standard_deviation(sigma_x, "sigma_x", zero_ok=False)
    d = _count(d, "d", 1)
    return _finite(d * sigma_x**2 / n, "the MSE d sigma_x^2/n")


def gaussian_global_mse(m, n, sigma_theta, sigma_x, d=1):
    r"""Risk of the global mean :math:`\hat\mu` alone (exact).

    .. math:: d\left(\frac{m-1}{m}\sigma_\theta^2 + \frac{\sigma_x^2}{mn}\right)
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    return _finite(d * ((m - 1) / m * sigma_theta**2 + sigma_x**2 / m / n),
                   "the global-mean MSE")


def lower_bound_known_prior(n, sigma_theta, sigma_x, d=1):
    r"""Van Trees bound (46): the Bayes risk with the prior fully known.

    .. math:: \frac{d\,\sigma_\theta^2 \sigma_x^2}{n\sigma_\theta^2 + \sigma_x^2}

    Attained by the oracle that knows :math:`\mu` (:func:`gaussian_oracle_mse`).
    """
    n = _count(n, "n", 1)
    sigma_theta = check_standard_deviation(sigma_theta, "sigma_theta", zero_ok=True)
    sigma_x = check_standard_deviation(sigma_x, "sigma_x", zero_ok=False)
    d = _count(d, "d", 1)
    # sigma_theta^2 times a factor in [0, 1]: no product of two squares is formed.
    shrink = sigma_x**2 / (n * sigma_theta**2 + sigma_x**2)
    return _finite(d * sigma_theta**2 * shrink, "the bound d sigma_theta^2 (...)")


def gaussian_oracle_mse(n, sigma_theta, sigma_x, d=1):
    r"""Risk of :math:`a x_i + (1 - a) \mu` with the true :math:`\mu` (exact).

    :math:`d\,a \sigma_x^2 / n`, equal to the bound (46)
    (:func:`lower_bound_known_prior`).
    """
    return lower_bound_known_prior(n, sigma_theta, sigma_x, d)


def lower_bound_estimated_mean(m, n, sigma_theta, sigma_x, d=1):
    r"""Bound (47): the paper's claimed minimax bound for estimators that do not know :math:`\mu`.

    .. math:: \frac{d\,\big(\sigma_\theta^2 \sigma_x^2 + \sigma_x^4/(mn)\big)}
                   {n\sigma_\theta^2 + \sigma_x^2}

    It equals the Theorem 1 value; the paper's derivation of it is flawed (errata
    [!19]), so treat it as a claim. The known-:math:`\mu` oracle legitimately beats it.
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    # d sigma_x^2 (sigma_theta^2 + sigma_x^2/(mn)) / (n sigma_theta^2 + sigma_x^2): no sigma^4.
    ratio = (sigma_theta**2 + sigma_x**2 / m / n) / (n * sigma_theta**2 + sigma_x**2)
    return _finite(d * sigma_x**2 * ratio, "the bound d sigma_x^2 (...)")


@dataclass(frozen=True)
class GaussianMSE:
    r"""All Gaussian-model risks for one setting (totals over d coordinates).

    Attributes
    ----------
    weight : float
        :math:`a` of Theorems 1/2.
    personalized : float
        Theorem 1 (:math:`\sigma_q = 0`) or Theorem 2 value.
    local, global_only, oracle : float
        Risks of :math:`\bar x_i`, of :math:`\hat\mu` alone, of the known-:math:`\mu`
        posterior mean.
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
    """Every Gaussian-model risk of Theorems 1-2 and eqs. (46)-(47) for one setting.

    Examples
    --------
    >>> b = gaussian_bounds(10_000, 15, 0.1, 0.5)
    >>> round(b.personalized, 7), round(b.local, 7), round(b.weight, 12)
    (0.006251, 0.0166667, 0.375)
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    sigma_q = check_standard_deviation(sigma_q, "sigma_q", zero_ok=True)
    return GaussianMSE(
        m=m, n=n, sigma_theta=sigma_theta, sigma_x=sigma_x, d=d, sigma_q=sigma_q,
        weight=_weight(m, n, sigma_theta, sigma_x, sigma_q),
        personalized=_theorem2(m, n, sigma_theta, sigma_x, sigma_q, d),
        local=gaussian_local_mse(n, sigma_x, d),
        global_only=gaussian_global_mse(m, n, sigma_theta, sigma_x, d),
        oracle=gaussian_oracle_mse(n, sigma_theta, sigma_x, d),
        lower_known_prior=lower_bound_known_prior(n, sigma_theta, sigma_x, d),
        lower_estimated_mean=lower_bound_estimated_mean(m, n, sigma_theta, sigma_x, d),
    )


# ----------------------------------------------------------------- Beta-Bernoulli

#: Largest Beta shape parameter accepted: alpha + beta + n must stay finite.
MAX_BETA_SHAPE = 1e300


def _beta_iv(alpha, beta, n):
    shapes = []
    for value, name in ((alpha, "alpha"), (beta, "beta")):
        value = check_positive_scalar(value, name)
        if value > MAX_BETA_SHAPE:
            raise ValueError(f"{name} must lie in (0, {MAX_BETA_SHAPE:g}] (alpha + beta must "
                             f"stay finite), got {value!r}")
        shapes.append(value)
    return (*shapes, _count(n, "n", 1))


def _beta_var_factor(alpha, beta):
    """alpha beta / ((alpha+beta)(alpha+beta+1)) = E[p(1-p)], as a product of two ratios <= 1."""
    s = alpha + beta
    return (alpha / s) * (beta / (s + 1.0))


def beta_local_mse(alpha, beta, n):
    r"""Risk of :math:`z_i/n` under a :math:`\mathrm{Beta}(\alpha, \beta)` population (exact).

    It is :math:`E[p(1-p)]/n`:

    .. math:: \frac{\alpha\beta}{n(\alpha+\beta)(\alpha+\beta+1)}

    Examples
    --------
    >>> round(beta_local_mse(2, 2, 14), 7)
    0.0142857
    """
    alpha, beta, n = _beta_iv(alpha, beta, n)
    return _beta_var_factor(alpha, beta) / n


def beta_posterior_mse(alpha, beta, n):
    r"""Bayes risk of the known-prior posterior mean (exact; the paper writes "<=").

    .. math:: \frac{\alpha\beta}{(\alpha+\beta)(\alpha+\beta+1)(\alpha+\beta+n)}

    Examples
    --------
    >>> round(beta_posterior_mse(2, 2, 14), 7)
    0.0111111
    """
    alpha, beta, n = _beta_iv(alpha, beta, n)
    return _beta_var_factor(alpha, beta) / (alpha + beta + n)


@dataclass(frozen=True)
class BetaMSE:
    r"""Known-Beta-prior risks (Section 2.2 of the paper).

    Attributes
    ----------
    weight : float
        :math:`a = n / (\alpha + \beta + n)`, the posterior mean's weight on
        :math:`z/n`.
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
        :math:`E[\hat a^2]` and :math:`E[(1 - \hat a)^2]`, each in [0, 1] (estimated
        by Monte Carlo).
    m, n : int
        Clients (:math:`m \ge 2`) and trials per client.
    alpha, beta : float
        The true Beta prior.

    Notes
    -----
    The bound holds with probability :math:`\ge 1 - 1/(mn)` over the event
    :math:`|\mu - \hat\mu_i| \le c`, :math:`|\sigma^2 - \hat\sigma_i^2| \le c`, with
    :math:`c^2 = 3 \log(4 m^2 n)/(m-1)`.
    """
    mean_a2 = check_probability(mean_a2, "mean_a2")
    mean_one_minus_a2 = check_probability(mean_one_minus_a2, "mean_one_minus_a2")
    m = _count(m, "m", 2)
    alpha, beta, n = _beta_iv(alpha, beta, n)
    c2 = 3.0 * math.log(4 * m * m * n) / (m - 1)     # exact integer inside the log
    return float(mean_a2 * beta_local_mse(alpha, beta, n)
                 + mean_one_minus_a2 * (_prior_variance(alpha, beta) + c2))


def _prior_variance(alpha, beta):
    """Var(p) = alpha beta / ((alpha+beta)^2 (alpha+beta+1)), without forming alpha beta."""
    s = alpha + beta
    return (alpha / s) * (beta / s) / (s + 1.0)


# ------------------------------------------------- quantized and private (Theorems 2, 4)

#: Largest accepted r (bound on |mu|): keeps b and sigma_q^2 inside float64.
MAX_R = 1e100


def _paper_b(m, n, sigma_theta, sigma_x, r):
    from ebfl.privacy.mechanisms import paper_clip_range

    m, n, sigma_theta, sigma_x, _ = _gauss_iv(m, n, sigma_theta, sigma_x, 1)
    r = check_nonnegative_scalar(r, "r")
    if r > MAX_R:
        raise ValueError(f"r must lie in [0, {MAX_R:g}], got {r!r}")
    return paper_clip_range(r, m, n, sigma_theta, sigma_x)


def _paper_gaussian(m, n, sigma_theta, sigma_x, epsilon, delta, r, d=1):
    """The paper's Gaussian mechanism for this setting, its PrivacyWarning silenced on purpose.

    The bounds reproduce the paper's Theorem 2 with the paper's calibration;
    :func:`gaussian_mechanism_true_delta` reports the delta it really gives.
    """
    from ebfl.privacy.mechanisms import GaussianMechanism, PrivacyWarning

    b = _paper_b(m, n, sigma_theta, sigma_x, r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        return GaussianMechanism(epsilon, delta, b, d=_count(d, "d", 1), calibration="paper")


def quantizer_sigma_q(m, n, sigma_theta, sigma_x, k_bits, r):
    r""":math:`\sigma_q = b/(2^k - 1)` of the k-bit quantizer, b the paper's range (Theorem 2.1).

    Computed as :math:`b\, 2^{-k} / (1 - 2^{-k})`, so any k_bits up to :math:`2^{53}`
    works (the quantizer object itself stops at 52 bits).

    Examples
    --------
    >>> round(quantizer_sigma_q(10_000, 15, 0.1, 0.5, 2, 1.0), 6)
    0.684359
    """
    b = _paper_b(m, n, sigma_theta, sigma_x, r)
    k_bits = _count(k_bits, "k_bits", 1)
    return math.ldexp(b, -k_bits) / -math.expm1(-k_bits * math.log(2.0))


def gaussian_mechanism_sigma_q(m, n, sigma_theta, sigma_x, epsilon, delta, r):
    r""":math:`\sigma_q = \frac{b}{\epsilon}\sqrt{8 \log(2/\delta)}`: the paper's Gaussian noise.

    Theorem 2.2. The paper's calibration, used on purpose: it does not always deliver
    :math:`(\epsilon, \delta)`-LDP (see :func:`gaussian_mechanism_true_delta`).
    """
    return _paper_gaussian(m, n, sigma_theta, sigma_x, epsilon, delta, r).sigma


def gaussian_mechanism_true_delta(m, n, sigma_theta, sigma_x, epsilon, delta, r, d=1):
    r"""The :math:`\delta` the paper's Gaussian mechanism really gives at ``epsilon``, d-vectors.

    With :math:`\sigma = \frac{b}{\epsilon}\sqrt{8 \log(2/\delta)}` per coordinate and
    L2 sensitivity :math:`2b\sqrt d`, the release is :math:`(\epsilon, \delta')`-LDP with
    :math:`\delta'` from the analytic Gaussian formula (Balle & Wang 2018, Theorem 8;
    :func:`ebfl.privacy.mechanisms.analytic_gaussian_delta`), and no smaller
    :math:`\delta`. The paper's claim holds when :math:`\delta' \le \delta`.

    Examples
    --------
    >>> f"{gaussian_mechanism_true_delta(10_000, 15, 0.1, 0.5, 0.5, 1e-5, 1.0, d=4):.2g}"
    '0.00057'
    >>> gaussian_mechanism_true_delta(10_000, 15, 0.1, 0.5, 0.5, 1e-5, 1.0) < 1e-5
    True
    """
    return _paper_gaussian(m, n, sigma_theta, sigma_x, epsilon, delta, r, d).true_delta


def theorem2_quantizer_mse(m, n, sigma_theta, sigma_x, k_bits, r, d=1):
    r"""Theorem 2, part 1: the k-bit quantizer on :math:`[-b, b]`, b the paper's clipping range.

    b comes from :func:`~ebfl.privacy.paper_clip_range`.

    An upper bound (the quantizer's variance is at most :math:`b^2/(2^k-1)^2`), claimed
    with probability :math:`\ge 1 - 2/(mn)` over the clipping event (optimistic, errata
    [!4]).

    Examples
    --------
    >>> [round(theorem2_quantizer_mse(10_000, 15, 0.1, 0.5, k, 1.0), 7) for k in (1, 2, 8)]
    [0.0064131, 0.0062693, 0.006251]
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    sigma_q = quantizer_sigma_q(m, n, sigma_theta, sigma_x, k_bits, r)
    return _theorem2(m, n, sigma_theta, sigma_x, sigma_q, d)


def theorem2_gaussian_mse(m, n, sigma_theta, sigma_x, epsilon, delta, r, d=1):
    r"""Theorem 2, part 2: the paper's Gaussian mechanism on :math:`[-b, b]` (its own calibration).

    Exact up to the (rare) clipping, since the noise variance does not depend
    on the input. The paper claims :math:`(\epsilon, \delta)`-LDP for
    :math:`\epsilon \in (0, 1)`; for :math:`d > 1` or large :math:`\epsilon` its
    :math:`\sigma` gives only the :math:`\delta` of :func:`gaussian_mechanism_true_delta`.

    Examples
    --------
    >>> round(theorem2_gaussian_mse(10_000, 15, 0.1, 0.5, 1.0, 1e-5, 1.0), 6)
    0.012572
    """
    m, n, sigma_theta, sigma_x, d = _gauss_iv(m, n, sigma_theta, sigma_x, d)
    sigma_q = gaussian_mechanism_sigma_q(m, n, sigma_theta, sigma_x, epsilon, delta, r)
    return _theorem2(m, n, sigma_theta, sigma_x, sigma_q, d)


def theorem4_rhs(mean_a2, mean_one_minus_a2, m, n, alpha, beta, epsilon):
    r"""Right-hand side of Theorem 4 for the paper's private Bernoulli estimator.

    .. math:: E[\hat a^2]\frac{\alpha\beta}{n(\alpha+\beta)(\alpha+\beta+1)}
              + E[(1-\hat a)^2]\left(\frac{\alpha\beta}{(\alpha+\beta)^2(\alpha+\beta+1)}
              + \frac{(e^{\epsilon}+1)^2\log(4m^2n)}{3(e^{\epsilon}-1)^2(m-1)}\right)

    Notes
    -----
    As :math:`\epsilon \to \infty` the last term tends to :math:`\log(4m^2 n)/(3(m-1))`,
    9 times smaller than Theorem 3's non-private :math:`3 \log(4m^2 n)/(m-1)` (errata
    [!5]).
    """
    from ebfl.privacy.mechanisms import EPSILON_RANGE

    mean_a2 = check_probability(mean_a2, "mean_a2")
    mean_one_minus_a2 = check_probability(mean_one_minus_a2, "mean_one_minus_a2")
    m = _count(m, "m", 2)
    alpha, beta, n = _beta_iv(alpha, beta, n)
    epsilon = check_positive_scalar(epsilon, "epsilon")
    if not EPSILON_RANGE[0] <= epsilon <= EPSILON_RANGE[1]:
        raise ValueError(f"epsilon must lie in [{EPSILON_RANGE[0]:g}, {EPSILON_RANGE[1]:g}], "
                         f"got {epsilon!r}")
    # (e^eps + 1)/(e^eps - 1) = coth(eps/2) = (1 + e^-eps)/(-expm1(-eps)): no overflow,
    # no division by zero for tiny eps.
    coth = (1.0 + math.exp(-epsilon)) / -math.expm1(-epsilon)
    cp2 = coth**2 * math.log(4 * m * m * n) / (3.0 * (m - 1))
    return float(mean_a2 * beta_local_mse(alpha, beta, n)
                 + mean_one_minus_a2 * (_prior_variance(alpha, beta) + cp2))
