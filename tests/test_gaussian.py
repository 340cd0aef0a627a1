"""Gaussian empirical Bayes (spec C.1, C.2): Theorem 1 and the unknown-prior fits."""

import numpy as np
import pytest
from scipy import stats

from ebfl import GaussianPopulation, Ragged, gaussian_eb, gaussian_eb_samples, personalized_gaussian
from ebfl import bounds as B

Z_MC = 4.0  # Monte Carlo tolerance in standard errors


def test_theorem1_estimator_equals_closed_form():
    rng = np.random.default_rng(0)
    xbar = rng.normal(size=(50, 3))
    n, st, sx = 15, 0.1, 0.5
    res = personalized_gaussian(xbar, n, sigma_theta=st, sigma_x=sx)
    a = st**2 / (st**2 + sx**2 / n)
    mu = xbar.mean(axis=0)
    np.testing.assert_allclose(res.estimate, a * xbar + (1 - a) * mu, rtol=1e-14)
    assert res.weight == pytest.approx(a, rel=1e-15)
    np.testing.assert_allclose(res.global_mean, mu)


def test_theorem2_weight_and_shared_mean():
    rng = np.random.default_rng(1)
    xbar = rng.normal(size=20)
    shared = xbar + rng.normal(scale=2.0, size=20)
    res = personalized_gaussian(xbar, 10, sigma_theta=0.3, sigma_x=1.0, shared=shared,
                                sigma_q=2.0)
    het = 0.09 + 4.0 / 19
    a = het / (het + 0.1)
    assert res.weight == pytest.approx(a)
    np.testing.assert_allclose(res.estimate, a * xbar + (1 - a) * shared.mean())


def test_theorem1_monte_carlo_matches_exact_mse():
    """m = 1e4, n = 15, sigma_theta = 0.1, sigma_x = 0.5: per-coordinate MSE 0.0062510."""
    m, n, st, sx = 10_000, 15, 0.1, 0.5
    pop = GaussianPopulation(mean=0.7, sigma_theta=st, sigma_x=sx)
    rng = np.random.default_rng(20261122)
    mses = {"personalized": [], "local": [], "global": [], "oracle": []}
    a = B.gaussian_weight(m, n, st, sx)
    for _ in range(100):
        theta, xbar, _ = pop.sample_sufficient(m, n, rng=rng)
        est = personalized_gaussian(xbar, n, sigma_theta=st, sigma_x=sx).estimate
        mses["personalized"].append(np.mean((est - theta) ** 2))
        mses["local"].append(np.mean((xbar - theta) ** 2))
        mses["global"].append(np.mean((xbar.mean() - theta) ** 2))
        mses["oracle"].append(np.mean((a * xbar + (1 - a) * 0.7 - theta) ** 2))
    formulas = {"personalized": B.theorem1_mse(m, n, st, sx),
                "local": B.gaussian_local_mse(n, sx),
                "global": B.gaussian_global_mse(m, n, st, sx),
                "oracle": B.gaussian_oracle_mse(n, st, sx)}
    assert round(formulas["personalized"], 7) == 0.0062510
    assert round(formulas["local"], 7) == 0.0166667
    for key, values in mses.items():
        se = np.std(values, ddof=1) / np.sqrt(len(values))
        assert abs(np.mean(values) - formulas[key]) <= Z_MC * se, (key, np.mean(values), se)


def test_known_sd_equal_s_is_theorem1():
    rng = np.random.default_rng(2)
    xbar = rng.normal(size=(30, 2))
    t1 = personalized_gaussian(xbar, 15, sigma_theta=0.1, sigma_x=0.5)
    eb = gaussian_eb(xbar, 0.5 / np.sqrt(15), prior_sd=0.1)
    np.testing.assert_allclose(eb.posterior.mean, t1.estimate, rtol=1e-13)
    np.testing.assert_allclose(eb.shrinkage, t1.weight)


def test_posterior_is_conjugate_normal():
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    s = rng.uniform(0.2, 1.0, size=40)
    res = gaussian_eb(x, s, prior_mean=0.3, prior_sd=0.8)
    assert res.method == "fixed"
    prec = 1 / s**2 + 1 / 0.64
    np.testing.assert_allclose(res.posterior.mean, (x / s**2 + 0.3 / 0.64) / prec)
    np.testing.assert_allclose(res.posterior.var, 1 / prec)
    lo, hi = res.posterior.interval(0.9)
    np.testing.assert_allclose(hi, res.posterior.mean + stats.norm.ppf(0.95) / np.sqrt(prec))
    want = stats.norm.logpdf(x, 0.3, np.sqrt(0.64 + s**2)).sum()
    assert res.log_likelihood == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("d", [1, 4])
def test_mle_equal_s_has_closed_form(d):
    """Equal s: the MLE is mu = mean, sigma_theta^2 = max(0, sum|x - mean|^2/(d m) - s^2)."""
    rng = np.random.default_rng(4)
    x = rng.normal(1.0, 0.9, size=(200, d))
    res = gaussian_eb(x, 0.5)
    want = np.sum((x - x.mean(0)) ** 2) / (d * 200) - 0.25
    assert res.prior.sd ** 2 == pytest.approx(want, rel=1e-7)
    np.testing.assert_allclose(res.prior.mean, x.mean(0), rtol=1e-9)
    tight = gaussian_eb(rng.normal(0, 0.1, size=(200, d)), 0.5)
    assert tight.prior.sd == 0.0 and tight.diagnostics["at_zero"]


def test_mle_heteroskedastic_beats_neighbours():
    rng = np.random.default_rng(5)
    s = rng.uniform(0.1, 2.0, size=500)
    x = rng.normal(2.0, 0.7, size=500) + s * rng.standard_normal(500)
    res = gaussian_eb(x, s)
    for sd in (res.prior.sd * 0.98, res.prior.sd * 1.02):
        w = 1 / (sd**2 + s**2)
        mu = np.sum(w * x) / w.sum()
        other = stats.norm.logpdf(x, mu, np.sqrt(sd**2 + s**2)).sum()
        assert other < res.log_likelihood
    assert res.prior.sd == pytest.approx(0.7, abs=0.1)


def test_moments_fit():
    rng = np.random.default_rng(6)
    x = rng.normal(0, 1.0, size=(1000, 2))
    res = gaussian_eb(x, 0.6, method="moments")
    want = np.sum((x - x.mean(0)) ** 2) / (2 * 999) - 0.36
    assert res.prior.sd ** 2 == pytest.approx(want)
    assert res.method == "moments"


def test_samples_pooled_sigma_x():
    pop = GaussianPopulation(mean=[0.0, 1.0], sigma_theta=0.3, sigma_x=2.0)
    sample = pop.sample(2000, np.arange(2000) % 9 + 2, rng=7)
    res = gaussian_eb_samples(sample.data)
    assert res.diagnostics["sigma_x"] == pytest.approx(2.0, rel=0.02)
    assert res.prior.sd == pytest.approx(0.3, abs=0.06)
    means = np.array([sample.data[i].mean(axis=0) for i in range(2000)])
    direct = gaussian_eb(means, res.diagnostics["sigma_x"] / np.sqrt(sample.data.counts))
    np.testing.assert_allclose(res.posterior.mean, direct.posterior.mean, rtol=1e-10)
    known = gaussian_eb_samples(sample.data, sigma_x=2.0)
    assert known.diagnostics["sigma_x_estimated"] is False


def test_inputs_not_mutated():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(20, 2))
    s = np.full(20, 0.5)
    x0, s0 = x.copy(), s.copy()
    gaussian_eb(x, s)
    personalized_gaussian(x, 5, sigma_theta=1.0, sigma_x=1.0)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(s, s0)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"x": [1.0, np.nan], "s": 1.0}, ValueError, "x must be finite"),
    ({"x": [1.0, 2.0], "s": [1.0, -1.0]}, ValueError, "s must be > 0"),
    ({"x": [1.0, 2.0], "s": [1.0, 1.0, 1.0]}, ValueError, "shape"),
    ({"x": [1.0, 2.0], "s": 1.0, "prior_sd": -1.0}, ValueError, "prior_sd"),
    ({"x": [1.0, 2.0], "s": 1.0, "prior_mean": [0.0, 0.0]}, ValueError, "prior_mean"),
    ({"x": [1.0, 2.0], "s": 1.0, "method": "em"}, ValueError, "method"),
    ({"x": [1.0], "s": 1.0}, ValueError, "at least 2 clients"),
    ({"x": [[[1.0]]], "s": 1.0}, ValueError, "ndim"),
])
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        gaussian_eb(**kwargs)


def test_bad_input_personalized_and_samples():
    with pytest.raises(ValueError, match="sigma_x"):
        personalized_gaussian([0.0, 1.0], 5, sigma_theta=1.0, sigma_x=0.0)
    with pytest.raises(ValueError, match="n must"):
        personalized_gaussian([0.0, 1.0], 0, sigma_theta=1.0, sigma_x=1.0)
    with pytest.raises(ValueError, match="shared"):
        personalized_gaussian([0.0, 1.0], 5, sigma_theta=1.0, sigma_x=1.0, shared=[1.0])
    with pytest.raises(ValueError, match="empty"):
        gaussian_eb_samples(Ragged(np.ones(3), np.array([0, 3, 3])))
    with pytest.raises(ValueError, match="finite"):
        gaussian_eb_samples(Ragged(np.array([1.0, np.nan, 2.0, 3.0]), np.array([0, 2, 4])))
    with pytest.raises(ValueError, match="at least 2 samples"):
        gaussian_eb_samples(Ragged(np.ones(2), np.array([0, 1, 2])))
    with pytest.raises(TypeError, match="Ragged"):
        gaussian_eb_samples(np.ones(3))


def test_caller_arrays_stay_writeable():
    x = np.linspace(0.0, 1.0, 10)
    s = np.full(10, 0.5)
    gaussian_eb(x, s)
    assert x.flags.writeable and s.flags.writeable
