"""Extreme but legal numbers in the privacy modules and the bounds.

Every public function of ebfl.privacy.{mechanisms, accounting, estimators} and
ebfl.bounds gets each of its numeric arguments replaced in turn by 1e-300,
1e300 and a Python int too large for float64 (and, for counts, 2**60). The
outcome must be a finite result or a ValueError/TypeError that names the
argument: never OverflowError, ZeroDivisionError, a math domain error, a
memory error, NaN or inf.
"""

import math
import warnings

import numpy as np
import pytest

from ebfl import bounds as B
from ebfl.privacy import accounting as A
from ebfl.privacy import estimators as E
from ebfl.privacy import mechanisms as M

HUGE_INT = 10**400
EXTREMES = (1e-300, 1e300, HUGE_INT)
COUNT_EXTREMES = EXTREMES + (2**60,)


def _finite(value):
    if isinstance(value, (tuple, list)):
        return all(_finite(v) for v in value)
    if dataclass_fields := getattr(value, "__dataclass_fields__", None):
        return all(_finite(getattr(value, k)) for k in dataclass_fields
                   if isinstance(getattr(value, k), (int, float, np.ndarray)))
    arr = np.asarray(value, dtype=np.float64)
    return bool(np.all(np.isfinite(arr)))


def _check(call, name, value):
    """Run ``call``: finite result, or ValueError/TypeError whose message names ``name``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # overflow/invalid in numpy
        warnings.simplefilter("ignore", M.PrivacyWarning)   # the paper's calibration
        try:
            result = call()
        except (ValueError, TypeError) as exc:
            assert name in str(exc), (name, value, str(exc))
            return "refused"
    assert _finite(result), (name, value, result)
    return "finite"


# ------------------------------------------------------------------ mechanisms

MECHANISMS = {
    "StochasticQuantizer": (lambda k_bits=3, b=1.0: M.StochasticQuantizer(k_bits, b),
                            {"k_bits": COUNT_EXTREMES, "b": EXTREMES}),
    "GaussianMechanism paper": (
        lambda epsilon=1.0, delta=1e-5, b=1.0, d=2: M.GaussianMechanism(epsilon, delta, b, d),
        {"epsilon": EXTREMES, "delta": EXTREMES, "b": EXTREMES, "d": COUNT_EXTREMES}),
    "GaussianMechanism l2": (
        lambda epsilon=1.0, delta=1e-5, b=1.0, d=2: M.GaussianMechanism(
            epsilon, delta, b, d, calibration="l2"),
        {"epsilon": EXTREMES, "delta": EXTREMES, "b": EXTREMES, "d": COUNT_EXTREMES}),
    "LaplaceMechanism": (lambda epsilon=1.0, b=1.0, d=2: M.LaplaceMechanism(epsilon, b, d),
                         {"epsilon": EXTREMES, "b": EXTREMES, "d": COUNT_EXTREMES}),
    "RandomizedResponse": (lambda epsilon=1.0: M.RandomizedResponse(epsilon),
                           {"epsilon": EXTREMES}),
    "BinaryMechanism": (lambda epsilon=1.0: M.BinaryMechanism(epsilon), {"epsilon": EXTREMES}),
}


def _use_mechanism(mech):
    x = np.array([0.0, 1.0]) if isinstance(mech, M.RandomizedResponse) else np.array([0.0, 0.5])
    out = [mech.max_variance, mech.variance(x), mech.privatize(x, rng=0)]
    if mech.privacy is not None:
        out += [mech.privacy.epsilon, mech.privacy.delta]
    if isinstance(mech, M.RandomizedResponse):
        out += [mech.outputs, mech.log_likelihood_ratio_bound(x, x[::-1])]
    return out


@pytest.mark.parametrize("kind", sorted(MECHANISMS))
def test_mechanisms_at_extreme_arguments(kind):
    make, arguments = MECHANISMS[kind]
    for name, values in arguments.items():
        for value in values:
            _check(lambda make=make, name=name, value=value: _use_mechanism(
                make(**{name: value})), name, value)


@pytest.mark.parametrize("epsilon", [40.0, 100.0, 800.0])
def test_randomized_response_is_never_deterministic(epsilon):
    """At large epsilon the flip has a tiny but nonzero probability (it was 0 before).

    With uniforms that are all 0 every stage of the flip succeeds: the release
    is the opposite bit. 1 + e^-eps rounds to 1 for eps > 37, and
    ``rng.random() < p`` cannot realize p < 2^-53, so the old sampler kept
    every bit.
    """
    class Zeros(np.random.Generator):
        def random(self, size=None):
            return np.zeros(size)

    zeros = Zeros(np.random.PCG64(0))
    for mech in (M.RandomizedResponse(epsilon), M.BinaryMechanism(epsilon)):
        low, high = mech.outputs
        np.testing.assert_array_equal(mech.privatize([1.0, 1.0], rng=zeros), [low, low])


@pytest.mark.parametrize("epsilon", [0.3, 2.0, 40.0, 100.0, 700.0])
def test_flip_stages_multiply_to_the_flip_probability(epsilon):
    """r 2^-K = 1/(e^eps + 1) to rounding, never below it (never less private)."""
    log_p = -float(np.logaddexp(0.0, epsilon))
    r, whole = M._flip_stages(log_p)
    assert 0.5 <= r <= 1.0
    log_realized = math.log(r) - whole * math.log(2.0)
    assert 0.0 <= log_realized - log_p <= 1e-12


def test_staged_bernoulli_frequencies():
    """P(flip) of the staged sampler at p ~ 1e-3 (two stages) within 4 Monte Carlo SE."""
    rng = np.random.default_rng(0)
    for p in (0.3, 1.3e-3, 2.0**-11 * 0.75):
        draws = M._bernoulli_from_log(math.log(p), 2_000_000, rng)
        se = math.sqrt(p * (1 - p) / draws.size)
        assert abs(draws.mean() - p) <= 4 * se, (p, draws.mean())


@pytest.mark.parametrize("call, name", [
    (lambda v: M.paper_clip_range(v, 100, 10, 0.1, 0.5), "r"),
    (lambda v: M.paper_clip_range(1.0, v, 10, 0.1, 0.5), "m"),
    (lambda v: M.paper_clip_range(1.0, 100, v, 0.1, 0.5), "n"),
    (lambda v: M.paper_clip_range(1.0, 100, 10, v, 0.5), "sigma_theta"),
    (lambda v: M.paper_clip_range(1.0, 100, 10, 0.1, v), "sigma_x"),
    (lambda v: M.analytic_gaussian_delta(v, 1.0), "epsilon"),
    (lambda v: M.analytic_gaussian_delta(1.0, v), "noise_multiplier"),
])
def test_mechanism_functions_at_extreme_arguments(call, name):
    for value in COUNT_EXTREMES:
        _check(lambda value=value: call(value), name, value)


# ------------------------------------------------------------------ bounds

G = dict(m=10_000, n=15, sigma_theta=0.1, sigma_x=0.5)
BOUNDS = [
    (B.gaussian_weight, {**G, "sigma_q": 0.3}),
    (B.theorem1_mse, {**G, "d": 3}),
    (B.theorem2_mse, {**G, "sigma_q": 0.3, "d": 3}),
    (B.gaussian_local_mse, {"n": 15, "sigma_x": 0.5, "d": 3}),
    (B.gaussian_global_mse, {**G, "d": 3}),
    (B.lower_bound_known_prior, {"n": 15, "sigma_theta": 0.1, "sigma_x": 0.5, "d": 3}),
    (B.gaussian_oracle_mse, {"n": 15, "sigma_theta": 0.1, "sigma_x": 0.5, "d": 3}),
    (B.lower_bound_estimated_mean, {**G, "d": 3}),
    (B.gaussian_bounds, {**G, "d": 3, "sigma_q": 0.3}),
    (B.beta_local_mse, {"alpha": 2.0, "beta": 3.0, "n": 14}),
    (B.beta_posterior_mse, {"alpha": 2.0, "beta": 3.0, "n": 14}),
    (B.beta_bounds, {"alpha": 2.0, "beta": 3.0, "n": 14}),
    (B.theorem3_rhs, {"mean_a2": 0.5, "mean_one_minus_a2": 0.1, "m": 10_000, "n": 14,
                      "alpha": 2.0, "beta": 2.0}),
    (B.theorem4_rhs, {"mean_a2": 0.5, "mean_one_minus_a2": 0.1, "m": 10_000, "n": 14,
                      "alpha": 2.0, "beta": 2.0, "epsilon": 1.0}),
    (B.quantizer_sigma_q, {**G, "k_bits": 2, "r": 1.0}),
    (B.gaussian_mechanism_sigma_q, {**G, "epsilon": 1.0, "delta": 1e-5, "r": 1.0}),
    (B.gaussian_mechanism_true_delta, {**G, "epsilon": 1.0, "delta": 1e-5, "r": 1.0, "d": 4}),
    (B.theorem2_quantizer_mse, {**G, "k_bits": 2, "r": 1.0, "d": 3}),
    (B.theorem2_gaussian_mse, {**G, "epsilon": 1.0, "delta": 1e-5, "r": 1.0, "d": 3}),
]


@pytest.mark.parametrize("func, kwargs", BOUNDS, ids=[f.__name__ for f, _ in BOUNDS])
def test_bounds_at_extreme_arguments(func, kwargs):
    for name in kwargs:
        for value in COUNT_EXTREMES:
            _check(lambda name=name, value=value: func(**{**kwargs, name: value}), name, value)


def test_bounds_compute_instead_of_overflowing():
    """Values the naive formulas got wrong, now exact or refused by name."""
    # sigma^4 and sigma_theta^2 sigma_x^2 overflowed (inf / inf = nan) for sigma = 1e100.
    assert B.lower_bound_estimated_mean(10, 5, 1e100, 1e100) == pytest.approx(
        1e200 * (1 + 1 / 50) / 6)
    assert B.lower_bound_known_prior(5, 1e100, 1e100) == pytest.approx(1e200 / 6)
    # alpha beta overflowed for huge Beta parameters (inf/inf); the risk is ~ 1/(4n).
    assert B.beta_local_mse(1e300, 1e300, 10) == pytest.approx(0.025, rel=1e-12)
    # 2**k_bits - 1 as an int overflowed the float conversion for k_bits >= 1024.
    assert B.quantizer_sigma_q(100, 10, 0.1, 0.5, 2000, 1.0) == 0.0
    # 1 - e^-eps was 0 for eps < 1.1e-16 (ZeroDivisionError); coth(eps/2)^2 ~ 4/eps^2.
    rhs = B.theorem4_rhs(0.0, 1.0, 100, 10, 2.0, 2.0, 1e-100) - 0.05
    assert rhs == pytest.approx(4e200 * math.log(4e5) / (3 * 99), rel=1e-12)
    # the accepted ranges keep even the largest totals finite
    assert B.gaussian_local_mse(1, 1e100, 2**53) == pytest.approx(2**53 * 1e200)


# ------------------------------------------------------------------ accounting

FEMNIST = dict(n_clients=66, n_sampled=22, n_iterations=240, sync_gap=10, clip_mu=1.0,
               noise_mu=5.0, clip_psi=1.0, noise_psi=5.0)
ACCOUNTING = [
    ("theorem7_rdp", lambda **kw: A.theorem7_rdp(kw.pop("orders", 2.0), **kw),
     {**FEMNIST, "orders": 2.0}),
    ("dp_adaped_epsilon", lambda **kw: A.dp_adaped_epsilon(kw.pop("delta", 1e-5), **kw),
     {**FEMNIST, "delta": 1e-5}),
    ("dp_adaped_noise_multiplier", A.dp_adaped_noise_multiplier,
     {"n_sampled": 22, "sync_gap": 10, "clip_mu": 1.0, "noise_mu": 5.0}),
    ("rdp_to_epsilon", lambda delta, r: A.rdp_to_epsilon([2.0, 8.0], [r, 4 * r], delta),
     {"delta": 1e-5, "r": 0.1}),
    ("rdp_to_delta", lambda epsilon, r: A.rdp_to_delta([2.0, 8.0], [r, 4 * r], epsilon),
     {"epsilon": 1.0, "r": 0.1}),
    ("accountant", lambda n_clients, n_rounds, epsilon: A.DPAdaPeDAccountant(n_clients).step(
        n_sampled=2, sync_gap=1, clip_mu=1.0, noise_mu=2.0, n_rounds=n_rounds).get_delta(epsilon),
     {"n_clients": 10, "n_rounds": 3, "epsilon": 1.0}),
    ("pld", lambda value_discretization_interval, noise_mu: A.DPAdaPeDAccountant(
        10, accountant="pld", value_discretization_interval=value_discretization_interval).step(
        n_sampled=10, sync_gap=1, clip_mu=1.0, noise_mu=noise_mu).get_epsilon(1e-5),
     {"value_discretization_interval": 1e-3, "noise_mu": 2.0}),
]


@pytest.mark.parametrize("label, func, kwargs", ACCOUNTING, ids=[a[0] for a in ACCOUNTING])
def test_accounting_at_extreme_arguments(label, func, kwargs):
    for name in kwargs:
        for value in COUNT_EXTREMES:
            # rdp values are not named arguments of the wrappers: the real name is "rdp"
            _check(lambda name=name, value=value: func(**{**kwargs, name: value}),
                   "rdp" if name == "r" else name, value)


def test_accounting_failures_fixed():
    """Each of these raised OverflowError, ZeroDivisionError or a math domain error before."""
    # dp-accounting's compute_delta: log1p(-exp(-r)) with exp(-r) == 1 for r < 1.1e-16.
    assert A.rdp_to_delta([2.0, 4.0], [1e-300, 2e-300], 1.0) == pytest.approx(1e-150)
    huge = A.DPAdaPeDAccountant(10).step(n_sampled=10, sync_gap=1, clip_mu=1.0,
                                         noise_mu=1e40)
    assert 0.0 <= huge.get_delta(1e-3) < 1e-30
    # the noise multiplier formed 1/s^2: ZeroDivisionError for noise 1e-300 (now refused),
    # and stays finite at the edge of the accepted range.
    assert math.isfinite(A.dp_adaped_noise_multiplier(n_sampled=1, sync_gap=2**53, clip_mu=1e50,
                                                      noise_mu=1e-50))
    # a PLD grid for a tiny noise multiplier exhausted memory; now refused by name.
    with pytest.raises(ValueError, match="would need a grid of about"):
        A.DPAdaPeDAccountant(10, accountant="pld").step(n_sampled=10, sync_gap=1, clip_mu=1.0,
                                                        noise_mu=1e-3)


def test_lemma2_delta_matches_dp_accounting():
    """The hand-written delta conversion equals dp-accounting's where the latter works."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    orders = np.array(A.DEFAULT_ORDERS)
    for slope, eps in ((0.05, 1.0), (0.5, 3.0), (2.0, 0.2), (1e-9, 1e-3)):
        curve = slope * orders + 0.01 * slope * np.sqrt(orders)
        want, _ = rdp.compute_delta(orders, curve, eps)
        assert A.rdp_to_delta(orders, curve, eps) == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------ estimators

def _bernoulli(**kw):
    z, n = np.array([1, 2, 3, 4, 5, 0]), np.full(6, 5)
    return E.private_bernoulli_corrected(z, n, rng=0, **kw)


def _gaussian(**kw):
    xbar = np.linspace(-1, 1, 20)
    mech = kw.pop("mechanism", M.LaplaceMechanism(1.0, 2.0))
    return E.private_gaussian(xbar, 5, mech, rng=0, **{"sigma_x": 0.5, **kw})


@pytest.mark.parametrize("func, name", [
    (lambda v: _bernoulli(epsilon=v), "epsilon"),
    (lambda v: _bernoulli(epsilon=1.0, ucb_z=v), "ucb_z"),
    (lambda v: E.private_bernoulli_paper([1, 2, 3], [5, 5, 5], v, rng=0), "epsilon"),
    (lambda v: _gaussian(ucb_z=v), "ucb_z"),
    (lambda v: _gaussian(sigma_x=v), "sigma_x"),
    (lambda v: _gaussian(mechanism=M.StochasticQuantizer(2, 2.0), sigma_x=v), "sigma_x"),
])
def test_estimators_at_extreme_arguments(func, name):
    for value in EXTREMES:
        _check(lambda value=value: func(value), name, value)
