"""Mechanisms: exact properties where they can be computed, moments statistically elsewhere."""

import math
import warnings

import numpy as np
import pytest
from scipy import special, stats

from ebfl.privacy import (
    BinaryMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
    StochasticQuantizer,
    paper_clip_range,
)
from ebfl.privacy.mechanisms import PrivacyGuarantee, PrivacyWarning, analytic_gaussian_delta

Z_MC = 4.0
GRID = np.linspace(0.0, 1.0, 41)


@pytest.mark.parametrize("k_bits", [1, 2, 3, 8])
def test_quantizer_exact_mean_and_variance_on_a_grid(k_bits):
    q = StochasticQuantizer(k_bits, 1.7)
    x = np.linspace(-1.7, 1.7, 301)
    low, frac = q._position(x)
    levels = q.levels
    lo_val, hi_val = levels[low.astype(int)], levels[np.minimum(low.astype(int) + 1, 2**k_bits - 1)]
    mean = (1 - frac) * lo_val + frac * hi_val                      # E q(x), two outcomes
    var = (1 - frac) * lo_val**2 + frac * hi_val**2 - mean**2
    np.testing.assert_allclose(mean, x, atol=1e-13)                 # unbiased
    np.testing.assert_allclose(var, q.variance(x), atol=1e-12)      # Delta^2 f (1 - f)
    assert np.all(q.variance(x) <= 1.7**2 / (2**k_bits - 1) ** 2 + 1e-15)
    assert q.max_variance == pytest.approx(1.7**2 / (2**k_bits - 1) ** 2)
    out = q.privatize(x, rng=0)
    assert np.all(np.isin(np.round(out, 12), np.round(levels, 12)))


def test_quantizer_sampled_moments_and_clipping():
    q = StochasticQuantizer(2, 1.0)
    x = np.full(200_000, 0.3)
    out = q.privatize(x, rng=1)
    se = np.sqrt(q.variance(0.3) / x.size)
    assert abs(out.mean() - 0.3) <= Z_MC * se
    assert q.n_clipped([2.0, -3.0, 0.5]) == 2
    np.testing.assert_array_equal(q.privatize([5.0, -5.0], rng=0), [1.0, -1.0])


def test_binary_mechanism_exact_properties():
    for eps in (0.1, 1.0, 3.0):
        q = BinaryMechanism(eps)
        low, high = q.outputs
        p = q.prob_high(GRID)
        mean = p * high + (1 - p) * low
        var = p * high**2 + (1 - p) * low**2 - mean**2
        e = math.exp(eps)
        np.testing.assert_allclose(mean, GRID, atol=1e-12)
        np.testing.assert_allclose(var, e / (e - 1) ** 2 + GRID * (1 - GRID), rtol=1e-10)
        np.testing.assert_allclose(q.variance(GRID), var, rtol=1e-10)
        ratio = q.likelihood_ratio_bound(np.repeat(GRID, GRID.size), np.tile(GRID, GRID.size))
        assert np.all(ratio <= e * (1 + 1e-12))
        assert q.likelihood_ratio_bound(1.0, 0.0) == pytest.approx(e)   # equality at extremes
        assert q.privacy.epsilon == eps and q.privacy.pure


def test_binary_mechanism_is_randomized_response_of_a_coin():
    q, rr = BinaryMechanism(1.3), RandomizedResponse(1.3)
    assert q.outputs == rr.outputs
    np.testing.assert_allclose(q.prob_high([0.0, 1.0]), rr.prob_high([0.0, 1.0]))
    assert rr.max_variance == pytest.approx(math.exp(1.3) / (math.exp(1.3) - 1) ** 2)
    out = rr.privatize(np.ones(100_000, int), rng=2)
    assert abs(out.mean() - 1.0) <= Z_MC * math.sqrt(rr.max_variance / out.size)


@pytest.mark.parametrize("mech", [GaussianMechanism(2.0, 1e-5, 1.0),
                                  GaussianMechanism(2.0, 1e-5, 1.0, d=3, calibration="l2"),
                                  LaplaceMechanism(1.5, 0.5, d=2)])
def test_additive_mechanisms_moments(mech):
    x = np.full((100_000, getattr(mech, "d", 1)), 0.2)
    out = mech.privatize(x, rng=3)
    assert np.all(np.abs(out.mean(axis=0) - 0.2) <= Z_MC * np.sqrt(mech.max_variance / x.shape[0]))
    # sample variance: SE of s^2 is sqrt((mu4 - sigma^4)/N); mu4 = 3 s^4 (Gauss), 6 s^4 (Laplace)
    kurt = 3.0 if isinstance(mech, GaussianMechanism) else 6.0
    se_var = mech.max_variance * math.sqrt((kurt - 1) / x.shape[0])
    assert np.all(np.abs(out.var(axis=0) - mech.max_variance) <= Z_MC * se_var)


def _paper(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        return GaussianMechanism(*args, **kwargs)


def test_gaussian_paper_calibration_matches_spec_table():
    b = paper_clip_range(1.0, 10_000, 15, 0.1, 0.5)
    assert b - 1.0 == pytest.approx(1.05308, abs=5e-6)
    for eps, var in ((0.1, 41160), (1.0, 411.60), (5.0, 16.464), (10.0, 4.1160)):
        assert _paper(eps, 1e-5, b).sigma ** 2 == pytest.approx(var, rel=5e-5)


def _balle_wang_delta(eps, sigma, sens):
    """Theorem 8 of Balle & Wang (2018), written plainly (fine away from tiny deltas)."""
    a, c = sens / (2 * sigma), eps * sigma / sens
    return special.ndtr(a - c) - math.exp(eps) * special.ndtr(-a - c)


@pytest.mark.parametrize("eps, d, want", [(0.5, 4, 5.7e-4), (0.5, 50, 0.127), (3.0, 4, 0.0103)])
def test_paper_calibration_reports_the_delta_it_delivers(eps, d, want):
    """The review's three values: the paper's sigma with target delta = 1e-5."""
    with pytest.warns(PrivacyWarning, match="only"):
        g = GaussianMechanism(eps, 1e-5, 1.7, d=d)
    assert issubclass(PrivacyWarning, UserWarning)
    assert g.true_delta == pytest.approx(want, rel=0.01)
    assert g.privacy == PrivacyGuarantee(eps, g.true_delta) and not g.privacy.pure
    assert g.sensitivity == pytest.approx(2 * 1.7 * math.sqrt(d))
    assert g.true_delta == pytest.approx(_balle_wang_delta(eps, g.sigma, g.sensitivity),
                                         rel=1e-10)


@pytest.mark.parametrize("eps, d", [(0.5, 1), (1.0, 1), (5.0, 1), (2.0, 4), (10.0, 1)])
def test_analytic_delta_agrees_with_dp_accounting_pld(eps, d):
    """Independent check of delta(eps) by dp-accounting's PLD of the Gaussian mechanism."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    g = _paper(eps, 1e-5, 1.0, d=d)
    dist = pld.from_gaussian_mechanism(g.sigma, sensitivity=g.sensitivity,
                                       value_discretization_interval=1e-4)
    reference = dist.get_delta_for_epsilon(eps)   # pessimistic: >= the exact delta
    assert g.true_delta <= reference * (1 + 1e-9)
    assert g.true_delta == pytest.approx(reference, rel=0.03)
    assert g.privacy.delta == max(1e-5, g.true_delta)


def test_paper_calibration_warns_only_when_it_falls_short():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        ok = GaussianMechanism(0.5, 1e-5, 2.0)           # one coordinate, eps < 1: holds
        tight = GaussianMechanism(3.0, 1e-5, 2.0, d=4, calibration="l2")
    assert ok.true_delta < 1e-5 and ok.privacy == PrivacyGuarantee(0.5, 1e-5)
    assert tight.privacy == PrivacyGuarantee(3.0, 1e-5) and tight.true_delta <= 1e-5
    with pytest.warns(PrivacyWarning):
        GaussianMechanism(10.0, 1e-5, 2.0)                # one coordinate, large eps
    assert analytic_gaussian_delta(0.5, math.sqrt(8 * math.log(2e5)) / 0.5 / 4) == (
        pytest.approx(5.68e-4, rel=1e-3))


@pytest.mark.parametrize("eps, b, d", [(0.7, 1.0, 1), (2.0, 0.3, 3), (40.0, 2.0, 2)])
def test_laplace_claim_by_exact_density_ratio(eps, b, d):
    """sup over outputs and inputs of the log-density ratio is exactly eps (L1 sensitivity 2bd).

    Checked with scipy's Laplace density (not the mechanism's own formulas) at
    the extreme inputs -b 1 and b 1 and outputs on a grid that reaches beyond both.
    """
    mech = LaplaceMechanism(eps, b, d)
    y = np.linspace(-3 * b, 3 * b, 121)
    grid = np.stack(np.meshgrid(*[y] * d, indexing="ij"), axis=-1).reshape(-1, d) if d < 3 else (
        np.column_stack([y] * d))
    log_ratio = (stats.laplace.logpdf(grid, loc=b, scale=mech.scale).sum(axis=1)
                 - stats.laplace.logpdf(grid, loc=-b, scale=mech.scale).sum(axis=1))
    assert np.max(np.abs(log_ratio)) == pytest.approx(eps, rel=1e-9)
    # any other pair of inputs in the box does no worse
    rng = np.random.default_rng(0)
    x1, x2 = rng.uniform(-b, b, (2, 20, d))
    pair = (stats.laplace.logpdf(grid[:, None, :], loc=x1, scale=mech.scale).sum(axis=2)
            - stats.laplace.logpdf(grid[:, None, :], loc=x2, scale=mech.scale).sum(axis=2))
    assert np.max(np.abs(pair)) <= eps * (1 + 1e-12)
    assert mech.privacy == PrivacyGuarantee(eps, 0.0)


@pytest.mark.parametrize("cls", [RandomizedResponse, BinaryMechanism])
@pytest.mark.parametrize("eps", [0.05, 1.0, 6.0, 30.0])
def test_bit_mechanisms_claim_by_exact_likelihood_ratio(cls, eps):
    """P(high | x) = x e^eps/(1+e^eps) + (1-x)/(1+e^eps) from the definition; max ratio e^eps."""
    mech = cls(eps)
    xs = np.array([0.0, 1.0]) if cls is RandomizedResponse else np.linspace(0, 1, 21)
    flip = 1.0 / (1.0 + math.exp(eps))
    high = xs * (1 - flip) + (1 - xs) * flip
    low = xs * flip + (1 - xs) * (1 - flip)       # not 1 - high: keeps digits at large eps
    log_high, log_low = np.log(high), np.log(low)
    worst = max(np.max(log_high[:, None] - log_high[None, :]),
                np.max(log_low[:, None] - log_low[None, :]))
    assert worst == pytest.approx(eps, rel=1e-9)
    np.testing.assert_allclose(mech.prob_high(xs), high, rtol=1e-12)
    lib = mech.log_likelihood_ratio_bound(np.repeat(xs, xs.size), np.tile(xs, xs.size))
    assert np.max(lib) == pytest.approx(eps, rel=1e-9)
    assert mech.privacy == PrivacyGuarantee(eps, 0.0)


def test_l2_calibration_is_tight_and_agrees_with_dp_accounting():
    """Analytic Gaussian: delta(eps) equals the target; dp-accounting's PLD agrees."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    for eps, delta, b, d in ((0.5, 1e-5, 1.0, 1), (2.0, 1e-6, 0.7, 4), (8.0, 1e-3, 2.0, 10)):
        g = GaussianMechanism(eps, delta, b, d=d, calibration="l2")
        s, sens = g.sigma, g.sensitivity
        assert sens == pytest.approx(2 * b * math.sqrt(d))
        a, c = sens / (2 * s), eps * s / sens
        assert special.ndtr(a - c) - math.exp(eps) * special.ndtr(-a - c) == pytest.approx(
            delta, rel=1e-8)
        dist = pld.from_gaussian_mechanism(s, sensitivity=sens, value_discretization_interval=1e-4)
        assert dist.get_delta_for_epsilon(eps) == pytest.approx(delta, rel=2e-2)


def test_paper_calibration_underprotects_vectors():
    """Errata [!4]: per-coordinate noise for a d-vector gives far less than (eps, delta)-LDP."""
    paper = _paper(1.0, 1e-5, 1.0, d=100)
    tight = GaussianMechanism(1.0, 1e-5, 1.0, d=100, calibration="l2")
    assert tight.sigma > 5 * paper.sigma
    assert paper.privacy.delta > 0.5      # and it says so


@pytest.mark.parametrize(("call", "match"), [
    (lambda: StochasticQuantizer(0, 1.0), "k_bits"),
    (lambda: StochasticQuantizer(2, 0.0), "b must"),
    (lambda: GaussianMechanism(0.0, 1e-5, 1.0), "epsilon"),
    (lambda: GaussianMechanism(1.0, 1.0, 1.0), "delta"),
    (lambda: GaussianMechanism(1.0, 0.0, 1.0), "delta"),
    (lambda: GaussianMechanism(1.0, 1e-5, 1.0, calibration="x"), "calibration"),
    (lambda: GaussianMechanism(1e-200, 1e-5, 1.0), r"epsilon must lie in \[1e-150"),
    (lambda: StochasticQuantizer(53, 1.0), r"k_bits must be an integer in \[1, 52\]"),
    (lambda: StochasticQuantizer(25, 1.0).levels, "k_bits <= 24"),
    (lambda: LaplaceMechanism(1e-150, 1e150), "overflows"),
    (lambda: LaplaceMechanism(-1.0, 1.0), "epsilon"),
    (lambda: BinaryMechanism(1.0).privatize([0.2, 1.2]), r"\[0, 1\]"),
    (lambda: RandomizedResponse(1.0).privatize([0.5]), "bits"),
    (lambda: StochasticQuantizer(2, 1.0).privatize([np.nan]), "finite"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
