"""DP-PFL privacy accounting: Theorem 5's calibration, the rigorous accountant, Corollary 4,
the report and ``ebfl accounting dp-pfl``."""

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

import ebfl.dppfl.accounting as A
from ebfl.cli import main
from ebfl.dppfl.accounting import (
    CalibrationConditionWarning,
    calibrate_theorem5,
    corollary4_epsilon,
    dppfl_privacy_report,
    releases_of,
    rigorous_epsilon,
)
from ebfl.privacy.accounting import rdp_to_epsilon

PAPER = dict(epsilon=8.0, delta=1e-3, releases=20000, sampling_rate=0.5,
             active_probability=0.8)


# --------------------------------------------------------------------------- references


def analytic_gaussian_epsilon(mu, delta):
    """Exact epsilon of a Gaussian mechanism with sensitivity/std mu (Balle and Wang 2018):
    the root of Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta."""
    def gap(eps):
        return (special.ndtr(mu / 2 - eps / mu)
                - math.exp(eps + special.log_ndtr(-mu / 2 - eps / mu)) - delta)
    return optimize.brentq(gap, 0.0, 10.0 * mu * mu + 50.0, xtol=1e-13, rtol=1e-13)


def subsampled_gaussian_epsilon(q, sigma, delta):
    """Exact epsilon of ONE Poisson-subsampled Gaussian release (add or remove one record).

    P = (1-q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2); the privacy loss log(P/Q) is
    increasing in the output x, so each direction's hockey-stick divergence is a
    difference of normal tails at a threshold; delta(eps) is the larger of the two.
    """
    def tail(x):   # P(N(0,1) > x)
        return special.ndtr(-x)

    def delta_of(eps):
        x1 = sigma**2 * math.log((math.expm1(eps) + q) / q) + 0.5      # log(P/Q) > eps
        remove = (1 - q) * tail(x1 / sigma) + q * tail((x1 - 1) / sigma) \
            - math.exp(eps) * tail(x1 / sigma)
        add = 0.0
        if math.exp(-eps) > 1 - q:                                     # log(Q/P) > eps
            x2 = sigma**2 * math.log((math.exp(-eps) - 1 + q) / q) + 0.5
            add = special.ndtr(x2 / sigma) - math.exp(eps) * (
                (1 - q) * special.ndtr(x2 / sigma) + q * special.ndtr((x2 - 1) / sigma))
        return max(remove, add) - delta
    return optimize.brentq(delta_of, 1e-9, 50.0, xtol=1e-13, rtol=1e-13)


def brute_force_corollary4(q, s1, s2, releases, delta, form, restrict, cap=200_000):
    """Theorem 2's minimum by enumerating every integer order (up to ``cap``)."""
    if restrict and q >= 1:
        return math.nan
    top = cap
    if restrict and q > 0:
        bound = s1**2 * math.log(1 / (q * s1))
        top = min(cap, math.ceil(bound) - 1)
    if top < 1:
        return math.nan
    g = np.arange(1, top + 1, dtype=float)
    if form == "corollary4":
        with np.errstate(divide="ignore"):
            mu = g * (g + 1) / (2 * s2**2) + q**2 * g * (g + 1) / ((1 - q) * s1**2)
    else:
        mu = q**2 * g**2 / s1**2 + g**2 / s2**2
    return float(np.min((releases * mu + math.log(1 / delta)) / g))


def optimistic_subsampled_epsilon(q, sigma, releases, delta):
    """A LOWER bound on the true epsilon (optimistic PLD discretization)."""
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, pessimistic_estimate=False,
        use_connect_dots=False, value_discretization_interval=1e-3)
    return pld.self_compose(releases).get_epsilon_for_delta(delta)


def integer_order_classic_epsilon(q, s1, s2, releases, delta, max_gamma):
    """Exact RDP (dp-accounting, integer orders) with the classic conversion: the quantity
    that Theorem 2 bounds when the log moments are exact."""
    gammas = np.arange(1, max_gamma + 1, dtype=float)
    acc = rdp_privacy_accountant.RdpAccountant(list(gammas + 1), A._RELATION)
    acc.compose(A._iteration_event(q, s1, s2), releases)
    return rdp_to_epsilon(gammas + 1, np.asarray(acc.rdp), delta, conversion="classic")


# --------------------------------------------------------------------------- Theorem 5


def test_releases_are_all_inner_iterations():
    assert releases_of(2000, 10) == 20000
    assert releases_of(1, 1) == 1
    with pytest.raises(ValueError, match="outer"):
        releases_of(2000, 0)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        releases_of(2**30, 2**30)


def test_calibration_is_lemma4_noise_with_theorem5_composition():
    cal = calibrate_theorem5(**PAPER, warn=False)
    eps, delta, k, q, p = 8.0, 1e-3, 20000, 0.5, 0.8
    r = cal.ratio
    # Theorem 5's printed form, sqrt(K log(1/delta)), with c2 = sqrt(2 ln(1.25/d) / ln(1/d)):
    c2 = math.sqrt(2 * math.log(1.25 / delta) / math.log(1 / delta))
    sigma1 = c2 * p * math.sqrt((q**2 + r**2) * k * math.log(1 / delta)) / eps
    assert float(cal.sigma1) == pytest.approx(sigma1, rel=1e-14)
    assert float(cal.sigma2) == pytest.approx(sigma1 / r, rel=1e-14)
    assert float(cal.sigma1) == pytest.approx(59.71138, abs=1e-5)
    # Lemma 4: one iteration is (sqrt(q^2 eps1^2 + eps2^2), delta)-DP = (eps_iter, delta)
    lemma4 = math.hypot(q * float(cal.epsilon1), float(cal.epsilon2))
    assert lemma4 == pytest.approx(cal.epsilon_iteration, rel=1e-14)
    assert cal.epsilon_iteration * p * math.sqrt(k) == pytest.approx(eps, rel=1e-14)
    assert cal.violated == (A._SMALL_Q,)


def test_ratio_splits_the_budget():
    cal = calibrate_theorem5(1.0, 1e-5, releases=100, sampling_rate=0.3, ratio=0.25,
                             warn=False)
    assert float(cal.epsilon2) == pytest.approx(0.25 * float(cal.epsilon1), rel=1e-15)
    assert float(cal.sigma2) == pytest.approx(4 * float(cal.sigma1), rel=1e-14)


def test_per_device_rates_broadcast_like_a_loop():
    q = np.array([0.1, 0.5, 0.5, 1.0, 0.05])
    keep = q.copy()
    cal = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=q, warn=False)
    assert np.array_equal(q, keep)                       # not mutated
    assert cal.sampling_rate is not q
    for i, qi in enumerate(q):
        one = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=qi, warn=False)
        for name in ("epsilon1", "epsilon2", "sigma1", "sigma2"):
            assert getattr(cal, name).shape == (5,)
            assert getattr(cal, name)[i] == pytest.approx(float(getattr(one, name)), rel=1e-15)
    assert isinstance(cal.epsilon_iteration, float)


def test_the_paper_setting_warns_once_naming_the_failed_condition():
    with pytest.warns(CalibrationConditionWarning) as record:
        cal = calibrate_theorem5(**PAPER)
    assert len(record) == 1
    assert "q < 1/(16 sigma1)" in str(record[0].message)
    assert issubclass(CalibrationConditionWarning, RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert calibrate_theorem5(**PAPER, warn=False).violated == cal.violated


def test_no_warning_when_every_condition_holds():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cal = calibrate_theorem5(1.0, 1e-5, releases=1000, sampling_rate=1e-4)
    assert cal.violated == ()
    assert float(cal.epsilon1) < 1 and float(cal.sigma1) >= 1
    assert 16 * 1e-4 * float(cal.sigma1) < 1


@pytest.mark.parametrize("kwargs, failed", [
    (dict(epsilon=1.0, delta=1e-5, releases=1000, sampling_rate=0.01), {A._SMALL_Q}),
    (dict(epsilon=100.0, delta=1e-5, releases=10, sampling_rate=1e-6),
     {A._EPS1, A._EPS2, A._SIGMA1, A._EPS_BELOW}),
    (dict(epsilon=50.0, delta=0.5, releases=100, sampling_rate=1e-4),
     {A._EPS1, A._EPS2, A._SIGMA1}),
    (dict(epsilon=2.0, delta=1e-5, releases=1, sampling_rate=1e-3),
     {A._EPS1, A._EPS2, A._EPS_BELOW}),
    (dict(epsilon=1.0, delta=1e-5, releases=4, sampling_rate=1e-3, active_probability=0.4),
     {A._EPS1, A._EPS2, A._EPS_BELOW}),
])
def test_each_condition_is_checked(kwargs, failed):
    cal = calibrate_theorem5(**kwargs, warn=False)
    assert set(cal.violated) == failed


def test_calibration_is_frozen_and_json_able():
    cal = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=[0.4, 0.5], warn=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cal.sigma1 = 1.0
    d = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    assert d["sigma1"] == pytest.approx(cal.sigma1.tolist())
    assert d["violated"] == list(cal.violated)
    scalar = calibrate_theorem5(**PAPER, warn=False).to_dict()
    assert isinstance(scalar["sigma1"], float) and isinstance(scalar["sampling_rate"], float)


@pytest.mark.parametrize("kwargs, exc, fragment", [
    (dict(epsilon=0.0), ValueError, "epsilon"),
    (dict(epsilon=float("nan")), ValueError, "epsilon"),
    (dict(epsilon="8"), TypeError, "epsilon"),
    (dict(delta=1.0), ValueError, "delta must be a real number in (0, 1)"),
    (dict(delta=0.0), ValueError, "delta"),
    (dict(releases=0), ValueError, "releases"),
    (dict(releases=2.5), TypeError, "releases"),
    (dict(sampling_rate=1.5), ValueError, "sampling_rate must lie in [0, 1]"),
    (dict(sampling_rate=-0.1), ValueError, "sampling_rate"),
    (dict(sampling_rate=[[0.5]]), ValueError, "sampling_rate must be a scalar or a 1-D"),
    (dict(sampling_rate=[]), ValueError, "sampling_rate"),
    (dict(sampling_rate=float("nan")), ValueError, "sampling_rate"),
    (dict(sampling_rate="0.5"), TypeError, "sampling_rate"),
    (dict(active_probability=0.0), ValueError, "active_probability"),
    (dict(active_probability=1.2), ValueError, "active_probability"),
    (dict(ratio=0.0), ValueError, "ratio"),
    (dict(ratio=float("inf")), ValueError, "ratio"),
    (dict(warn="yes"), TypeError, "warn"),
])
def test_calibration_refuses_bad_input(kwargs, exc, fragment):
    with pytest.raises(exc, match=None) as info:
        calibrate_theorem5(**{**PAPER, **kwargs})
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- rigorous


@pytest.mark.parametrize("s1, s2, releases, delta", [
    (94.41198831647617, 94.41198831647617, 20000, 1e-3),
    (3.0, 5.0, 10, 1e-5),
    (200.0, 50.0, 50000, 1e-6),
])
def test_full_sampling_is_one_gaussian(s1, s2, releases, delta):
    """At q = 1 an iteration is a Gaussian of multiplier (1/s1^2 + 1/s2^2)^(-1/2)."""
    mu = math.sqrt(releases * (1 / s1**2 + 1 / s2**2))
    exact = analytic_gaussian_epsilon(mu, delta)
    pld = rigorous_epsilon(s1, s2, 1.0, releases, delta, accountant="pld")
    rdp = rigorous_epsilon(s1, s2, 1.0, releases, delta)
    assert pld == pytest.approx(exact, rel=1e-3)
    assert pld >= exact * (1 - 1e-9)          # pessimistic discretization
    assert exact <= rdp <= 1.25 * exact       # RDP: an upper bound, not a loose one


@pytest.mark.parametrize("q, sigma, delta", [(0.3, 1.0, 1e-5), (0.05, 0.7, 1e-4),
                                             (0.5, 2.0, 1e-3)])
def test_one_subsampled_release_matches_its_exact_epsilon(q, sigma, delta):
    """One release with a negligible upload: the Poisson-subsampled Gaussian alone, whose
    epsilon has a closed form (two normal tails per direction)."""
    exact = subsampled_gaussian_epsilon(q, sigma, delta)
    pld = rigorous_epsilon(sigma, 1e8, q, 1, delta, accountant="pld")
    rdp = rigorous_epsilon(sigma, 1e8, q, 1, delta)
    assert pld == pytest.approx(exact, rel=2e-3)
    assert rdp >= exact * (1 - 1e-9)


@pytest.mark.parametrize("q", [0.01, 0.2, 0.5, 0.9])
def test_pld_is_at_most_rdp(q):
    cal = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=q, warn=False)
    args = (cal.sigma1, cal.sigma2, q, 20000, 1e-3)
    rdp = rigorous_epsilon(*args)
    pld = rigorous_epsilon(*args, accountant="pld")
    assert math.isfinite(rdp) and math.isfinite(pld)
    assert pld <= rdp * (1 + 1e-6)
    assert pld > 8.0      # Theorem 5 with c = 1 misses its target even at p = 1


def test_per_device_arrays_account_each_distinct_setting_once(monkeypatch):
    calls = []
    original = A._rdp_epsilon

    def counting(*args):
        calls.append(args[:3])
        return original(*args)

    monkeypatch.setattr(A, "_rdp_epsilon", counting)
    q = np.array([0.5, 0.25, 0.5, 0.5, 0.25])
    eps = rigorous_epsilon(60.0, 60.0, q, 1000, 1e-5)
    assert eps.shape == (5,) and len(calls) == 2
    for qi, e in zip(q, eps, strict=True):
        assert e == original(qi, 60.0, 60.0, 1000, 1e-5, np.array(A.DEFAULT_ORDERS))
    assert isinstance(rigorous_epsilon(60.0, 60.0, 0.5, 1000, 1e-5), float)


def test_more_noise_less_epsilon_and_q_zero_leaves_only_the_upload():
    base = rigorous_epsilon(5.0, 10.0, 0.2, 100, 1e-5)
    assert rigorous_epsilon(6.0, 10.0, 0.2, 100, 1e-5) < base
    assert rigorous_epsilon(5.0, 12.0, 0.2, 100, 1e-5) < base
    assert rigorous_epsilon(5.0, 10.0, 0.3, 100, 1e-5) > base
    # q = 0: the dual update touches no record; the upload alone is one Gaussian
    pld = rigorous_epsilon(0.5, 10.0, 0.0, 100, 1e-5, accountant="pld")
    assert pld == pytest.approx(analytic_gaussian_epsilon(math.sqrt(100) / 10.0, 1e-5),
                                rel=1e-3)


@pytest.mark.parametrize("args, kwargs, exc, fragment", [
    ((1e-4, 1.0, 0.5, 10, 1e-5), {}, ValueError, "sigma1 must lie in [0.001, 1e+08]"),
    ((1.0, np.inf, 0.5, 10, 1e-5), {}, ValueError, "sigma2"),
    ((np.ones(2), 1.0, [0.5, 0.4, 0.3], 10, 1e-5), {}, ValueError, "common length"),
    ((1.0, 1.0, 0.5, 0, 1e-5), {}, ValueError, "releases"),
    ((1.0, 1.0, 0.5, 10, 2.0), {}, ValueError, "delta"),
    ((1.0, 1.0, 0.5, 10, 1e-5), {"accountant": "moments"}, ValueError, "accountant"),
    ((1.0, 1.0, 0.5, 10, 1e-5), {"orders": [0.5, 2.0]}, ValueError, "orders"),
    ((1.0, 1.0, 0.5, 10, 1e-5), {"value_discretization_interval": 0.0}, ValueError,
     "value_discretization_interval"),
    ((0.01, 0.01, 0.5, 10, 1e-5), {"accountant": "pld"}, ValueError,
     "raise value_discretization_interval"),
])
def test_rigorous_epsilon_refuses_bad_input(args, kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        rigorous_epsilon(*args, **kwargs)
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- Corollary 4


@pytest.mark.parametrize("form", ["corollary4", "proof"])
@pytest.mark.parametrize("q, s1, s2, releases, delta", [
    (0.01, 4.0, 40.0, 1000, 1e-5),
    (0.05, 1.1, 1e4, 1000, 1e-5),
    (0.003, 16.0, 100.0, 20000, 1e-3),
    (0.001, 50.0, 3.0, 7, 1e-8),
    (0.06, 1.0, 1e8, 10000, 1e-5),
])
def test_corollary4_is_its_brute_force_minimum(form, q, s1, s2, releases, delta):
    for restrict in (True, False):
        got = corollary4_epsilon(s1, s2, q, releases, delta, form=form, restrict_order=restrict,
                                 warn=False)
        want = brute_force_corollary4(q, s1, s2, releases, delta, form, restrict)
        assert got == pytest.approx(want, rel=1e-13)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(q=st.floats(1e-5, 0.06), s1=st.floats(1.0, 30.0), s2=st.floats(0.5, 300.0),
       releases=st.integers(1, 10**5), log_delta=st.floats(-20.0, -1.0),
       form=st.sampled_from(["corollary4", "proof"]), restrict=st.booleans())
def test_corollary4_kernel_property(q, s1, s2, releases, log_delta, form, restrict):
    delta = 10.0**log_delta
    got = corollary4_epsilon(s1, s2, q, releases, delta, form=form, restrict_order=restrict,
                             warn=False)
    want = brute_force_corollary4(q, s1, s2, releases, delta, form, restrict)
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, rel=1e-12)


def test_corollary4_with_q_zero_is_the_exact_gaussian_at_integer_orders():
    """q = 0: only the upload's Gaussian, whose log moment gamma(gamma+1)/(2 sigma^2) is
    exact, so Theorem 2 is the classic RDP conversion at the integer orders gamma + 1."""
    s2, releases, delta = 7.0, 300, 1e-6
    gammas = np.arange(1.0, 5001.0)
    classic = rdp_to_epsilon(gammas + 1, releases * (gammas + 1) / (2 * s2**2), delta,
                             conversion="classic")
    assert corollary4_epsilon(2.0, s2, 0.0, releases, delta) == pytest.approx(classic,
                                                                                rel=1e-13)


def test_corollary4_is_nan_outside_its_range_and_says_why():
    with pytest.warns(CalibrationConditionWarning, match="an integer gamma in") as record:
        assert math.isnan(corollary4_epsilon(59.71, 59.71, 0.5, 20000, 1e-3))
    assert "NaN for 1 of 1" in str(record[0].message)
    with pytest.warns(CalibrationConditionWarning, match=r"q < 1 \(Corollary 4\)"):
        assert math.isnan(corollary4_epsilon(2.0, 2.0, 1.0, 10, 1e-3, form="proof"))
    outside = corollary4_epsilon(59.71, 59.71, 0.5, 20000, 1e-3, restrict_order=False,
                                 warn=False)
    assert outside == pytest.approx(
        brute_force_corollary4(0.5, 59.71, 59.71, 20000, 1e-3, "corollary4", False))
    assert corollary4_epsilon(2.0, 2.0, 1.0, 10, 1e-3, restrict_order=False,
                              warn=False) == math.inf     # 1/(1 - q)
    eps = corollary4_epsilon([4.0, 59.71], 40.0, [0.01, 0.5], 1000, 1e-5, warn=False)
    assert np.isfinite(eps[0]) and np.isnan(eps[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # conditions hold: silent
        corollary4_epsilon(4.0, 40.0, 0.01, 1000, 1e-5)


@pytest.mark.parametrize("q, s1, s2, releases, delta", [
    (0.01, 4.0, 40.0, 1000, 1e-5),
    (0.01, 4.0, 1e8, 1000, 1e-5),
    (0.02, 2.0, 1e8, 10000, 1e-5),
    (0.05, 1.1, 1e8, 1000, 1e-5),
    (0.003, 16.0, 100.0, 20000, 1e-3),
])
def test_corollary4_against_the_rigorous_accountant(q, s1, s2, releases, delta):
    """Inside its conditions Corollary 4 (O(q^3) term dropped) stays above the exact log
    moments at the same integer orders, hence above the rigorous RDP epsilon."""
    assert 16 * q * s1 < 1 and s1 >= 1
    cor4 = corollary4_epsilon(s1, s2, q, releases, delta)
    top = math.ceil(s1**2 * math.log(1 / (q * s1))) - 1
    exact = integer_order_classic_epsilon(q, s1, s2, releases, delta, min(top, 2000))
    assert cor4 >= exact * (1 - 1e-9)
    assert cor4 >= rigorous_epsilon(s1, s2, q, releases, delta)


@pytest.mark.parametrize("releases", [3000, 10000])
def test_the_proofs_simplification_is_not_a_valid_bound(releases):
    """sigma1 = 1, q = 0.06 < 1/16 (Corollary 4's conditions hold), a negligible upload: the
    proof's q^2 gamma^2/sigma1^2 claims less than a LOWER bound on the true epsilon."""
    q, s1, delta = 0.06, 1.0, 1e-5
    proof = corollary4_epsilon(s1, 1e8, q, releases, delta, form="proof")
    lower = optimistic_subsampled_epsilon(q, s1, releases, delta)
    assert proof < 0.95 * lower
    assert corollary4_epsilon(s1, 1e8, q, releases, delta) > lower   # Corollary 4 itself holds


# --------------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def paper_report():
    """The report at the paper's setting (the CLI's default), computed once per worker."""
    return dppfl_privacy_report(8.0, 1e-3, drop_probability=0.2, sampling_rate=0.5)


def test_report_at_the_paper_setting(paper_report):
    rep = paper_report
    json.dumps(rep, allow_nan=False)
    cal = rep["calibration"]
    assert cal["sigma1"] == pytest.approx(59.71138, abs=1e-5)
    assert cal["violated"] == [A._SMALL_Q]
    assert rep["setting"]["releases"] == 20000
    assert rep["setting"]["active_probability"] == pytest.approx(0.8)
    got = rep["delivered"]
    assert got["rdp"] == rigorous_epsilon(cal["sigma1"], cal["sigma2"], 0.5, 20000, 1e-3)
    assert got["pld"] == rigorous_epsilon(cal["sigma1"], cal["sigma2"], 0.5, 20000, 1e-3,
                                          accountant="pld")
    assert 8.0 < got["pld"] <= got["rdp"]
    assert rep["corollary4"]["epsilon"] is None and rep["corollary4"]["epsilon_proof_form"] is None
    assert A._ORDER_RANGE in rep["corollary4"]["failed"]
    assert rep["corollary4"]["epsilon_unrestricted"] > got["pld"]


@pytest.mark.parametrize("drop, inner, outer, ratio", [(0.0, 2000, 10, 1.0),
                                                       (0.2, 2000, 10, 1.0),
                                                       (0.5, 300, 2, 0.3)])
def test_report_at_full_sampling_has_a_closed_form(drop, inner, outer, ratio):
    """q = 1: the calibrated iteration is a Gaussian, and K of them one Gaussian with
    mu = epsilon / (p sqrt(2 ln(1.25/delta))), whatever K and r."""
    eps, delta = 8.0, 1e-3
    rep = dppfl_privacy_report(eps, delta, inner=inner, outer=outer, drop_probability=drop,
                               sampling_rate=1.0, ratio=ratio)
    mu = eps / ((1 - drop) * math.sqrt(2 * math.log(1.25 / delta)))
    assert rep["delivered"]["pld"] == pytest.approx(analytic_gaussian_epsilon(mu, delta),
                                                    rel=1e-3)


def test_report_per_device():
    rep = dppfl_privacy_report(8.0, 1e-3, inner=100, outer=2, sampling_rate=[0.3, 0.6, 0.3])
    assert len(rep["delivered"]["rdp"]) == 3 and len(rep["calibration"]["sigma1"]) == 3
    assert rep["delivered"]["rdp"][0] == rep["delivered"]["rdp"][2]
    json.dumps(rep, allow_nan=False)


def test_report_coarsens_the_pld_grid_instead_of_failing(monkeypatch):
    fine = dppfl_privacy_report(8.0, 1e-3, inner=100, outer=2, sampling_rate=0.5)
    assert fine["delivered"]["pld_value_discretization_interval"] == A.DEFAULT_VDI
    from ebfl.privacy.accounting import core

    monkeypatch.setattr(A, "MAX_PLD_POINTS", 1e5)   # as if epsilon were much larger
    monkeypatch.setattr(core, "MAX_PLD_POINTS", 1e5)
    coarse = dppfl_privacy_report(8.0, 1e-3, inner=100, outer=2, sampling_rate=0.5)
    vdi = coarse["delivered"]["pld_value_discretization_interval"]
    assert vdi > 3 * A.DEFAULT_VDI
    q, s1 = 0.5, coarse["calibration"]["sigma1"]
    assert A._pld_refusal(q, s1, s1, 200, 1e-3, vdi) is None
    assert A._pld_refusal(q, s1, s1, 200, 1e-3, A.DEFAULT_VDI) is not None
    assert coarse["delivered"]["pld"] == pytest.approx(fine["delivered"]["pld"], rel=1e-2)
    assert coarse["delivered"]["pld"] >= fine["delivered"]["pld"] * (1 - 1e-4)


# --------------------------------------------------------------------------- CLI


def test_cli_default_is_the_paper_setting(paper_report, capsys):
    assert main(["accounting", "dp-pfl", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    payload = json.loads(out)
    assert payload == json.loads(json.dumps(paper_report))
    assert main(["accounting", "dp-pfl", "--drop", "0", "--sampling-rate", "1", "--omega-every",
                 "100", "--omega-steps", "2"]) == 0
    text = capsys.readouterr().out
    sigma1 = math.sqrt(2 * math.log(1250) * 2 * 200) / 8   # Theorem 5, p = q = r = 1
    assert "sigma1" in text and f"{sigma1:.7g}" in text
    assert "violated conditions: q < 1/(16 sigma1)" in text


@pytest.mark.parametrize("extra, fragment", [
    (["--delta", "1.5"], "--delta"), (["--delta", "0"], "--delta"),
    (["--sampling-rate", "0"], "--sampling-rate"),
    (["--sampling-rate", "1.5"], "--sampling-rate must lie in (0, 1]"),
    (["--drop", "1"], "--drop must lie in [0, 1)"), (["--drop", "-0.1"], "--drop"),
    (["--ratio", "0"], "--ratio"), (["--omega-every", "0"], "--omega-every"),
    (["--omega-steps", "2.5"], "--omega-steps"), (["--epsilon", "-1"], "--epsilon"),
    (["--epsilon", "nan"], "--epsilon"),
])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_cli_bad_values_are_one_error_line(extra, fragment, json_flag, capsys):
    assert main(["accounting", "dp-pfl", *extra, *json_flag]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err
