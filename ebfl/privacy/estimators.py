"""Personalized estimators on quantized or locally private messages.

Theorem 2 (Gaussian model, any unbiased mechanism of known variance) and
Theorem 4 (Bernoulli model, the binary mechanism of eq. (7)), plus a corrected
private Bernoulli estimator that, unlike the paper's, learns the population
spread (Theorems 2 and 4; errata [!5]).

Estimators that estimate the population variance from noisy messages guard
against the noise (``variance="ucb"``, the default): when the variance
estimate cannot be told apart from 0, they shrink no further than is safe
for every variance up to an upper confidence bound, instead of shrinking
every client all the way to the mean. ``variance="plugin"`` keeps the plain
moment estimate max(0, sigma_hat^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    as_generator,
    check_finite_array,
    check_samples_per_client,
    check_standard_deviation,
)
from ebfl.eb.beta_binomial import check_binomial_counts
from ebfl.eb.gaussian import personalized_gaussian
from ebfl.privacy.mechanisms import BinaryMechanism, Mechanism
from ebfl.privacy.shrinkage import (
    DEFAULT_UCB_Z,
    VARIANCE_RULES,
    _upper_bound,
    check_spread_identifiable,
    check_variance_rule,
    corrected_mechanism,
    corrected_release,
    corrected_shrinkage,
    leave_one_out_sums,
    theorem4_shrinkage,
)

__all__ = [
    "VARIANCE_RULES",
    "PrivateBernoulliEstimate",
    "PrivateGaussianEstimate",
    "private_bernoulli_corrected",
    "private_bernoulli_paper",
    "private_gaussian",
]


#: Accepted range of |xbar|.
MAX_ABS_XBAR = 1e150


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
        The population sd used in the weight (given, or fitted from the messages
        by the ``variance`` rule).
    sigma_q : float
        sqrt(max_variance) of the mechanism.
    n_clipped : int
        Coordinates of xbar clipped to the mechanism's range before release.
    variance_rule : str
        ``"given"``, ``"plugin"`` or ``"ucb"``.
    sigma_theta_plugin : float or None
        sqrt(max(0, sigma_hat^2)), the moment estimate (None when sigma_theta was given).
    sigma_theta_upper : float or None
        sqrt of the upper confidence bound U on sigma_theta^2 (``"ucb"`` only).
    """

    estimate: np.ndarray
    weight: float | np.ndarray
    global_mean: float | np.ndarray
    shared: np.ndarray
    sigma_theta: float
    sigma_q: float
    n_clipped: int
    variance_rule: str = "given"
    sigma_theta_plugin: float | None = None
    sigma_theta_upper: float | None = None


def private_gaussian(xbar, n, mechanism, *, sigma_x, sigma_theta=None, variance="ucb",
                     ucb_z=DEFAULT_UCB_Z, rng=None):
    r"""Personalized Gaussian estimation when clients share q(xbar_i) (Theorem 2, equation (4)).

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
        sigma_hat^2 = sample variance of q(xbar) - sigma_x^2 mean(1/n_i) - sigma_q^2
        (averaged over coordinates). For mechanisms whose variance depends on
        the input (the quantizer), ``max_variance`` over-corrects, so the fit
        leans towards more sharing.
    variance : {"ucb", "plugin"}, default="ucb"
        How a fitted sigma_theta^2 enters the weight (ignored when
        ``sigma_theta`` is given). ``"plugin"``: max(0, sigma_hat^2).
        ``"ucb"``: see Notes; it never shrinks more than ``"plugin"``.
    ucb_z : float, default=3.0
        One-sided normal quantile of the upper confidence bound, in [0, 40].
    rng : None, int, SeedSequence or Generator
        Randomness of the mechanism.

    Returns
    -------
    PrivateGaussianEstimate

    Notes
    -----
    With the plug-in rule a noisy sigma_hat^2 that falls to 0 shrinks every
    client to the mean, which is far worse than the local mean when the
    population is in fact spread out. The risk of a xbar_i + (1 - a) mu_hat
    is a^2 v + (1 - a)^2 (sigma_theta^2 + tau^2), v = sigma_x^2/n,
    tau^2 = sigma_q^2/(m-1); it is no larger than the local risk v iff
    a >= (sigma_theta^2 + tau^2 - v)/(sigma_theta^2 + tau^2 + v). The
    ``"ucb"`` rule therefore uses

    .. math:: s = \max\Big(\hat\sigma^2_+,\ \frac{U - \tau^2 - v_{\min}}{2}\Big),
              \qquad U = \hat\sigma^2 + z\,\mathrm{se},

    the smallest variance whose weight is no worse than local for every
    sigma_theta^2 <= U (v_min = sigma_x^2/max n_i). se^2 is the variance the
    mechanism adds to the messages' sample variance,
    ``mechanism.square_variance_excess(v_hat)``/(d (m-1)) with
    v_hat = max(0, sample variance - sigma_q^2) (e.g. 4 v sigma^2 + 2 sigma^4
    for Gaussian noise); for a mechanism that does not provide it, the
    sample variance of the squared centred messages is used. So with
    probability about Phi(z) the estimator is no worse than the local mean;
    when sigma_hat^2 is well above its noise, s is the plug-in value; and
    se -> 0 as m -> infinity or as the noise vanishes (epsilon -> infinity,
    k_bits -> infinity), so the rule is consistent.

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
    if xbar.size == 0:
        raise ValueError(f"xbar must have at least one coordinate, got shape {xbar.shape}")
    if np.max(np.abs(xbar)) > MAX_ABS_XBAR:
        raise ValueError(f"xbar must lie in [-{MAX_ABS_XBAR:g}, {MAX_ABS_XBAR:g}] (its squares "
                         f"must stay finite)")
    n_arr = check_samples_per_client(n, xbar.shape[0])
    sigma_x = check_standard_deviation(sigma_x, "sigma_x", zero_ok=False)
    variance, ucb_z = check_variance_rule(variance, ucb_z)
    if sigma_theta is not None:
        sigma_theta = check_standard_deviation(sigma_theta, "sigma_theta", zero_ok=True)
    rng = as_generator(rng)
    n_clipped = mechanism.n_clipped(xbar) if hasattr(mechanism, "n_clipped") else 0
    try:
        shared = mechanism.privatize(xbar, rng)
    except ValueError as exc:  # e.g. bits-only mechanisms: the message names their own x
        raise ValueError(f"xbar is outside the domain of mechanism "
                         f"{type(mechanism).__name__}: {exc}") from exc
    sigma_q2 = mechanism.max_variance
    rule, plugin, upper = "given", None, None
    if sigma_theta is None:
        rule = variance
        with np.errstate(over="ignore"):
            var_q = float(np.mean(np.var(shared, axis=0, ddof=1)))
        if not np.isfinite(var_q):
            raise ValueError(f"the messages' sample variance overflows float64: the "
                             f"mechanism's noise (max_variance={sigma_q2:.3g}) is too large "
                             f"to fit sigma_theta; pass sigma_theta")
        raw = var_q - sigma_x**2 * float(np.mean(1.0 / n_arr)) - sigma_q2
        plugin = max(raw, 0.0)
        s = plugin
        if variance == "ucb":
            se = _message_variance_se(shared, mechanism, var_q - sigma_q2)
            upper = float(_upper_bound(raw, ucb_z, se, np.inf))
            tau2, v_min = sigma_q2 / (xbar.shape[0] - 1), sigma_x**2 / float(np.max(n_arr))
            s = max(plugin, 0.5 * (upper - tau2 - v_min))
        sigma_theta = float(np.sqrt(s))
    res = personalized_gaussian(xbar, n, sigma_theta=sigma_theta, sigma_x=sigma_x,
                                shared=shared, sigma_q=float(np.sqrt(sigma_q2)))
    return PrivateGaussianEstimate(
        res.estimate, res.weight, res.global_mean, shared, sigma_theta,
        float(np.sqrt(sigma_q2)), n_clipped, rule,
        None if plugin is None else float(np.sqrt(plugin)),
        None if upper is None else float(np.sqrt(max(upper, 0.0))))


def _message_variance_se(shared, mechanism, input_variance):
    """Standard error the mechanism adds to the mean over coordinates of the sample variances.

    From ``mechanism.square_variance_excess`` (per coordinate, divided by
    d (m - 1)); when the mechanism cannot say, the whole sampling variance of
    the sample variance, estimated from the messages' fourth moments
    (conservative: it includes the inputs' own variability).
    """
    m = shared.shape[0]
    d = 1 if shared.ndim == 1 else shared.shape[1]
    excess = mechanism.square_variance_excess(max(input_variance, 0.0))
    with np.errstate(over="ignore"):
        if excess is None:
            centred_sq = (shared - shared.mean(axis=0)) ** 2
            excess = float(np.mean(np.var(centred_sq, axis=0, ddof=1)))
        return float(np.sqrt(excess / (d * (m - 1))))


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
        sigma_hat_i^2, the estimator's population-variance estimate (for the
        corrected estimator the moment estimate max(0, sigma_hat_i^2)).
    shared : ndarray of shape (m,)
        The messages the server saw.
    epsilon : float
        Each client's epsilon-LDP level.
    n_clipped : int
        Weights that left [0, 1] and were clipped.
    variance_rule : str
        ``"printed"`` (the paper's estimator), ``"plugin"`` or ``"ucb"``.
    variance_upper : ndarray of shape (m,) or None
        U_i, the upper confidence bound on the population variance (``"ucb"``).
    """

    estimate: np.ndarray
    weight: np.ndarray
    centre: np.ndarray
    variance: np.ndarray
    shared: np.ndarray
    epsilon: float
    n_clipped: int
    variance_rule: str = "printed"
    variance_upper: np.ndarray | None = None


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
    close to the local one even as epsilon grows (errata [!5]). Use
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
    z, n = check_binomial_counts(successes, trials)
    mechanism = BinaryMechanism(epsilon)
    epsilon = mechanism.epsilon
    _check_loo_size(z.size)
    x = z / n
    shared = mechanism.privatize(x, as_generator(rng))
    step = theorem4_shrinkage(x, n, shared, True, leave_one_out_sums(shared))
    return PrivateBernoulliEstimate(step.estimate, step.weight, step.centre, step.variance,
                                    shared, epsilon, step.n_clipped)


def private_bernoulli_corrected(successes, trials, epsilon, *, variance="ucb",
                                ucb_z=DEFAULT_UCB_Z, rng=None):
    r"""An epsilon-LDP Bernoulli estimator that learns the population spread.

    Client l sends xbar_l + Laplace(1/epsilon) noise (the Laplace mechanism on
    [0, 1], sensitivity 1: the same epsilon-LDP as eq. (7)). With h_i the
    leave-one-out mean of 1/n_l, the server estimates, leaving client i out,

    - mu_i = mean_{l != i} q_l (unbiased for mu);
    - V_i = (1/(m-2)) sum_{l != i} (q_l - mu_i)^2 - 2/epsilon^2, unbiased for the
      average Var(xbar_l) = sigma^2 (1 - h) + mu(1 - mu) h;
    - sigma_hat_i^2 = (V_i - mu_i(1 - mu_i) h_i) / (1 - h_i);

    and client i uses p_hat_i = a_i xbar_i + (1 - a_i) mu_i with the
    Beta-posterior weight a(s) = n_i s / (mu_i(1-mu_i) - s + n_i s) of an
    assumed population variance s (clipped to [0, 1]).

    Parameters
    ----------
    successes, trials : array_like of int, shape (m,)
        z_i and n_i; m >= 3 and some n_i >= 2.
    epsilon : float
        Each client's LDP level, in [1e-150, 1e150].
    variance : {"ucb", "plugin"}, default="ucb"
        ``"plugin"``: a_i = a(max(0, sigma_hat_i^2)) (0 when that is 0), the
        rule of earlier versions. ``"ucb"``: a_i = max(plug-in weight, floor_i),
        see Notes; never more shrinkage than ``"plugin"``.
    ucb_z : float, default=3.0
        One-sided normal quantile of the upper confidence bound, in [0, 40].
    rng : None, int, SeedSequence or Generator
        Randomness of the mechanism.

    Returns
    -------
    PrivateBernoulliEstimate

    Notes
    -----
    Why it works: E(q_l - mu)^2 = Var(xbar_l) + 2/epsilon^2 exactly, and for a Beta
    population Var(xbar_l) = sigma^2 + (mu(1-mu) - sigma^2)/n_l, so subtracting
    the known mechanism variance and inverting gives sigma^2 up to the O(1/m)
    bias of plugging mu_i into mu(1-mu). Needs some n_l >= 2 (h < 1).

    Graceful degradation (``variance="ucb"``). The Laplace noise makes
    sigma_hat^2 noisy: its standard error is about
    sqrt(20/m)/epsilon^2 (e.g. 0.1 for m = 3150 at epsilon = 1), as large as
    typical population variances. When the plug-in estimate then falls to 0
    it shrinks every client to the mean, far worse than the local estimate.
    The risk of a xbar_i + (1 - a) mu_i is a^2 v + (1 - a)^2 (sigma^2 + tau^2)
    with v = (mu(1-mu) - sigma^2)/n_i and tau^2 = Var(mu_i); it is at most the
    local risk v iff a >= (sigma^2 + tau^2 - v)/(sigma^2 + tau^2 + v), which
    increases with sigma^2. So with the upper confidence bound

    .. math:: U_i = \min\big(\hat\sigma_i^2 + z\,\mathrm{se}_i,\ \mu_i(1-\mu_i)\big),
              \qquad \mathrm{se}_i^2 = \frac{4\hat V_i s^2 + 5 s^4}{(m-2)(1-h_i)^2},

    (s^2 = 2/epsilon^2 the noise variance, V_hat_i = V_i clipped to [0, 1/4]:
    4 V s^2 + 5 s^4 is what Laplace noise adds to the variance of a squared
    deviation, kurtosis 6) the weight is

    .. math:: a_i = \max\Big(a(\hat\sigma^2_{i,+}),\
              \frac{U_i + \tau_i^2 - v_i}{U_i + \tau_i^2 + v_i}\Big),
              \qquad v_i = \frac{\mu_i(1-\mu_i) - U_i}{n_i},\ \tau_i^2 = \frac{S_i}{m-1},

    S_i the leave-one-out sample variance of the messages. With probability
    about Phi(z) (one-sided) the estimator is then no worse than the local
    one, whatever the population spread; when sigma_hat_i^2 is well above
    z se_i the floor lies below the plug-in weight and nothing changes. As
    m -> infinity or epsilon -> infinity, se_i -> 0 and the rule becomes the
    plug-in rule (consistent). With z = 0 it is the plug-in rule except that
    it never shrinks beyond what the point estimate itself makes safe.

    As epsilon -> infinity the noise term vanishes and this is a consistent
    non-private moment estimator, so the estimator recovers non-private
    empirical Bayes; the paper's :func:`private_bernoulli_paper` does not.

    Examples
    --------
    >>> from ebfl import BetaBernoulliPopulation
    >>> p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(20000, 14, rng=0)
    >>> res = private_bernoulli_corrected(z, n, 50.0, rng=1)
    >>> bool(abs(res.weight.mean() - 14 / 18) < 0.02)
    True

    With little data and strong noise the plug-in rule can shrink everything
    to the mean; the default rule falls back towards the local estimate:

    >>> p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(300, 14, rng=3)
    >>> plug = private_bernoulli_corrected(z, n, 0.5, variance="plugin", rng=4)
    >>> safe = private_bernoulli_corrected(z, n, 0.5, rng=4)
    >>> float(plug.weight.max()), bool(safe.weight.min() > 0.9)
    (0.0, True)
    """
    z, n = check_binomial_counts(successes, trials)
    mechanism = corrected_mechanism(epsilon)
    epsilon = mechanism.epsilon
    variance, ucb_z = check_variance_rule(variance, ucb_z)
    _check_loo_size(z.size)
    x = z / n
    shared = corrected_release(mechanism, x, as_generator(rng))
    inv_n = 1.0 / n
    check_spread_identifiable(inv_n, "private_bernoulli_corrected")
    step = corrected_shrinkage(x, n, shared, True, leave_one_out_sums(shared), inv_n.sum(),
                                mechanism, variance, ucb_z)
    return PrivateBernoulliEstimate(step.estimate, step.weight, step.centre, step.variance,
                                    shared, epsilon, step.n_clipped, variance, step.upper)


def _check_loo_size(m):
    if m < 3:
        raise ValueError(f"successes and trials must hold at least 3 clients (leave-one-out "
                         f"estimation), got {m}")
