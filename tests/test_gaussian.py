"""Gaussian empirical Bayes: Theorem 1 and the unknown-prior fits."""

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
    ({"x": [1.0, 2.0], "s": [1.0, -1.0]}, ValueError, r"s must be > 0.*entry 1"),
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
    for bad in ("4", 4 + 0j, [4.0, 2.5], [4, 4, 4]):  # text, complex, fractional, wrong length
        with pytest.raises((TypeError, ValueError), match="^n must"):
            personalized_gaussian([0.0, 1.0], bad, sigma_theta=1.0, sigma_x=1.0)
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


# --------------------------------------------------------------------------- REML and DL

# BCG vaccine trials (Colditz et al. 1994; metafor's dat.bcg): tpos, tneg, cpos, cneg.
BCG = np.array([[4, 119, 11, 128], [6, 300, 29, 274], [3, 228, 11, 209],
                [62, 13536, 248, 12619], [33, 5036, 47, 5761], [180, 1361, 372, 1079],
                [8, 2537, 10, 619], [505, 87886, 499, 87892], [29, 7470, 45, 7232],
                [17, 1699, 65, 1600], [186, 50448, 141, 27197], [5, 2493, 3, 2338],
                [27, 16886, 29, 17825]], dtype=float)


def _bcg_log_risk_ratios():
    """metafor's escalc(measure="RR", ai=tpos, bi=tneg, ci=cpos, di=cneg): yi and sqrt(vi)."""
    a, b, c, d = BCG.T
    yi = np.log((a / (a + b)) / (c / (c + d)))
    vi = 1 / a - 1 / (a + b) + 1 / c - 1 / (c + d)
    return yi, np.sqrt(vi)


def test_bcg_reml_matches_metafor():
    """metafor 3.8.1, rma(yi, vi, method="REML"): mu, tau^2 and logLik (restricted)."""
    yi, sei = _bcg_log_risk_ratios()
    res = gaussian_eb(yi, sei, method="reml")
    assert res.method == "reml" and res.diagnostics["converged"]
    assert res.prior.mean == pytest.approx(-0.7145323484, rel=1e-6)
    assert res.prior.sd**2 == pytest.approx(0.3132433260, rel=1e-6)
    assert res.diagnostics["restricted_log_likelihood"] == pytest.approx(-12.2023714155, rel=1e-6)
    # log_likelihood keeps its meaning: the marginal log-likelihood at the fitted prior
    want = stats.norm.logpdf(yi, res.prior.mean, np.sqrt(res.prior.sd**2 + sei**2)).sum()
    assert res.log_likelihood == pytest.approx(want, rel=1e-12)


def test_bcg_dersimonian_laird_matches_metafor():
    """metafor 3.8.1, rma(yi, vi, method="DL"): mu, tau^2 (and Q = 152.2330)."""
    yi, sei = _bcg_log_risk_ratios()
    res = gaussian_eb(yi, sei, method="dl")
    assert res.method == "dl"
    assert res.prior.mean == pytest.approx(-0.7141172221, rel=1e-6)
    assert res.prior.sd**2 == pytest.approx(0.3087602629, rel=1e-6)
    assert res.diagnostics["q_statistic"] == pytest.approx(152.2330, abs=1e-4)


def test_reml_exceeds_ml_and_their_likelihoods_are_consistent():
    yi, sei = _bcg_log_risk_ratios()
    ml = gaussian_eb(yi, sei)
    reml = gaussian_eb(yi, sei, method="reml")
    assert reml.prior.sd > ml.prior.sd
    assert ml.log_likelihood >= reml.log_likelihood  # ML maximizes log_likelihood
    assert "restricted_log_likelihood" not in ml.diagnostics


def test_dersimonian_laird_hand_case():
    """x = (0, 2, 6), s = (1, 1, 2): w = (1, 1, 1/4), xbar_w = 14/9, Q = 68/9,
    sum w - sum w^2 / sum w = 4/3, so tau^2 = (68/9 - 2) / (4/3) = 25/6."""
    x, s = np.array([0.0, 2.0, 6.0]), np.array([1.0, 1.0, 2.0])
    res = gaussian_eb(x, s, method="dl")
    assert res.prior.sd**2 == pytest.approx(25 / 6, rel=1e-14)
    assert res.diagnostics["q_statistic"] == pytest.approx(68 / 9, rel=1e-14)
    w = 1 / (25 / 6 + s**2)  # = (6/31, 6/31, 6/49)
    assert res.prior.mean == pytest.approx(w @ x / w.sum(), rel=1e-14)
    assert not res.diagnostics["variance_floored"]
    # (0, 1, 3): Q = 17/9 < m - 1 = 2, so tau^2 is floored at 0 and mu is the w-mean
    low = gaussian_eb(np.array([0.0, 1.0, 3.0]), s, method="dl")
    assert low.prior.sd == 0.0 and low.diagnostics["variance_floored"]
    assert low.prior.mean == pytest.approx(7 / 9, rel=1e-14)


def test_dersimonian_laird_pooled_coordinates_and_known_mean():
    """d = 2: Q sums over coordinates and E Q = d (m-1) + d tau^2 (sum w - sum w^2/sum w);
    known mean: tau^2 = (Q_0 - d m) / (d sum w)."""
    rng = np.random.default_rng(30)
    s = rng.uniform(0.2, 1.0, size=25)
    x = rng.normal(0.0, 1.5, size=(25, 2)) + s[:, None] * rng.standard_normal((25, 2))
    w = 1 / s**2
    xbar = w @ x / w.sum()
    q = float(w @ np.sum((x - xbar) ** 2, axis=1))
    res = gaussian_eb(x, s, method="dl")
    assert res.prior.sd**2 == pytest.approx((q - 2 * 24) / (2 * (w.sum() - w @ w / w.sum())))
    one = [gaussian_eb(x[:, j], s, method="dl").prior.sd ** 2 for j in range(2)]
    assert min(one) < res.prior.sd**2 < max(one)  # pooling lies between the coordinates
    q0 = float(w @ np.sum((x - 0.5) ** 2, axis=1))
    known = gaussian_eb(x, s, method="dl", prior_mean=0.5)
    assert known.prior.sd**2 == pytest.approx((q0 - 2 * 25) / (2 * w.sum()))
    np.testing.assert_array_equal(known.prior.mean, [0.5, 0.5])


@pytest.mark.parametrize("d", [1, 4])
def test_reml_equal_s_is_the_unbiased_moment_estimator(d):
    """Equal s: REML gives tau^2 = max(0, sum|x - mean|^2 / (d (m-1)) - s^2), mu = mean."""
    rng = np.random.default_rng(31)
    x = rng.normal(1.0, 0.9, size=(40, d))
    res = gaussian_eb(x, 0.5, method="reml")
    want = np.sum((x - x.mean(0)) ** 2) / (d * 39) - 0.25
    assert res.prior.sd**2 == pytest.approx(want, rel=1e-9)
    np.testing.assert_allclose(res.prior.mean, x.mean(0), rtol=1e-12)
    assert res.prior.sd**2 == pytest.approx(gaussian_eb(x, 0.5, method="moments").prior.sd**2,
                                            rel=1e-9)


def test_reml_multivariate_is_the_sum_over_coordinates():
    """d > 1, one mean per coordinate: the restricted log-likelihood is the sum of the d
    one-dimensional ones at the shared tau^2."""
    rng = np.random.default_rng(32)
    s = rng.uniform(0.1, 1.5, size=30)
    x = rng.normal(0.0, 0.8, size=(30, 3)) + s[:, None] * rng.standard_normal((30, 3))
    res = gaussian_eb(x, s, method="reml")
    sd = res.prior.sd
    per_coord = sum(gaussian_eb(x[:, j], s, method="reml", prior_sd=sd)
                    .diagnostics["restricted_log_likelihood"] for j in range(3))
    assert res.diagnostics["restricted_log_likelihood"] == pytest.approx(per_coord, rel=1e-12)
    for other in (0.97 * sd, 1.03 * sd):
        total = sum(gaussian_eb(x[:, j], s, method="reml", prior_sd=other)
                    .diagnostics["restricted_log_likelihood"] for j in range(3))
        assert total < res.diagnostics["restricted_log_likelihood"]


def test_reml_with_known_mean_is_ml():
    rng = np.random.default_rng(33)
    s = rng.uniform(0.1, 1.5, size=50)
    x = rng.normal(0.3, 0.8, size=50) + s * rng.standard_normal(50)
    ml = gaussian_eb(x, s, prior_mean=0.3)
    reml = gaussian_eb(x, s, method="reml", prior_mean=0.3)
    assert reml.prior.sd == ml.prior.sd and reml.prior.mean == 0.3
    assert reml.diagnostics["restricted_log_likelihood"] == reml.log_likelihood


def test_moments_known_mean_divides_by_m():
    rng = np.random.default_rng(34)
    x = rng.normal(0.0, 1.0, size=(100, 2))
    res = gaussian_eb(x, 0.6, method="moments", prior_mean=0.0)
    assert res.prior.sd**2 == pytest.approx(np.sum(x**2) / (2 * 100) - 0.36)


# --------------------------------------------------------------------------- extreme scales


@pytest.mark.parametrize("method", ["mle", "reml", "dl", "moments"])
@pytest.mark.parametrize("scale", [1e-140, 1e140])
def test_fits_are_scale_equivariant_down_to_tiny_standard_errors(method, scale):
    """x -> c x, s -> c s gives mu -> c mu, sigma_theta -> c sigma_theta and the
    log-likelihood minus m d log c: s_i ~ 1e-141 are squared to ~1e-282 without harm."""
    rng = np.random.default_rng(35)
    s = rng.uniform(0.1, 2.0, size=40)
    x = rng.normal(1.0, 0.7, size=(40, 2)) + s[:, None] * rng.standard_normal((40, 2))
    ref = gaussian_eb(x, s, method=method)
    res = gaussian_eb(x * scale, s * scale, method=method)
    np.testing.assert_allclose(res.prior.mean, scale * ref.prior.mean, rtol=1e-9)
    assert res.prior.sd == pytest.approx(scale * ref.prior.sd, rel=1e-7)
    assert res.log_likelihood == pytest.approx(ref.log_likelihood - 80 * np.log(scale),
                                               rel=1e-10)
    np.testing.assert_allclose(res.posterior.mean, scale * ref.posterior.mean, rtol=1e-7)
    np.testing.assert_allclose(res.shrinkage, ref.shrinkage, rtol=1e-6, atol=1e-12)


def test_tiny_standard_errors_are_refused_clearly():
    with pytest.raises(ValueError, match=r"s must lie in \[1e-150, 1e\+150\].*entry 1"):
        gaussian_eb([0.0, 1.0], [1.0, 1e-200])
    with pytest.raises(ValueError, match=r"s must lie in \[1e-150"):
        gaussian_eb([0.0, 1.0], 1e-160, method="dl")
    with pytest.raises(ValueError, match=r"prior_sd must lie in \[0, 1e\+150\]"):
        gaussian_eb([0.0, 1.0], 1.0, prior_sd=1e200)
    # a tiny prior_sd is a point mass to within prior_sd^2 / s^2: computed, not refused
    tiny = gaussian_eb([0.0, 1.0], 1e-150, prior_sd=1e-160, prior_mean=0.5)
    np.testing.assert_allclose(tiny.shrinkage, 1e-20, rtol=1e-3)
    np.testing.assert_allclose(tiny.posterior.mean, [0.5, 0.5], rtol=1e-15)
    sample = Ragged(np.array([0.0, 1e-300, 2e-300, 3e-300]), np.array([0, 2, 4]))
    with pytest.raises(ValueError, match=r"s = sigma_x / sqrt\(n_i\) must lie in"):
        gaussian_eb_samples(sample, sigma_x=1e-200)
    close = Ragged(np.array([0.0, 2e-155, 0.0, 2e-155]), np.array([0, 2, 4]))
    with pytest.raises(ValueError, match=r"estimated sigma_x\) / sqrt\(n_i\) must lie in"):
        gaussian_eb_samples(close)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_personalized_gaussian_weight_at_extreme_scales(scale):
    xbar = np.array([0.0, 1.0, 2.0])
    ref = personalized_gaussian(xbar, 4, sigma_theta=1.0, sigma_x=2.0, sigma_q=0.5)
    res = personalized_gaussian(scale * xbar, 4, sigma_theta=scale, sigma_x=2.0 * scale,
                                sigma_q=0.5 * scale)
    assert res.weight == pytest.approx(ref.weight, rel=1e-14)
    np.testing.assert_allclose(res.estimate, scale * ref.estimate, rtol=1e-14)


# --------------------------------------------------------------------------- optimizer state


def test_unconverged_search_warns_and_says_so(monkeypatch):
    """If the root refinement reports failure the fit says so and warns."""
    from ebfl.eb import gaussian as gaussian_module

    def failing_brentq(f, a, b, **kwargs):
        return 0.5 * (a + b), type("Status", (), {"converged": False})()

    monkeypatch.setattr(gaussian_module.optimize, "brentq", failing_brentq)
    rng = np.random.default_rng(36)
    s = rng.uniform(0.1, 1.0, size=30)
    x = rng.normal(0.0, 1.0, size=30)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        res = gaussian_eb(x, s)
    assert res.diagnostics["converged"] is False


def test_diagnostics_are_true_to_the_state():
    rng = np.random.default_rng(37)
    s = rng.uniform(0.1, 1.0, size=200)
    x = rng.normal(0.0, 1.0, size=200) + s * rng.standard_normal(200)
    res = gaussian_eb(x, s)
    assert res.diagnostics == {"converged": True, "at_zero": False, "at_upper": False,
                               "n_local_maxima": 1}
    flat = gaussian_eb(np.full(5, 2.0), s[:5], method="reml")
    assert flat.prior.sd == 0.0 and flat.diagnostics["at_zero"] and flat.diagnostics["converged"]


def test_huge_values_are_refused_clearly():
    with pytest.raises(ValueError, match=r"x must lie in \[-1e\+150, 1e\+150\]"):
        gaussian_eb([0.0, 1e200], 1.0)
    with pytest.raises(ValueError, match=r"prior_mean must lie in \[-1e\+150, 1e\+150\]"):
        gaussian_eb([0.0, 1.0], 1.0, prior_mean=1e200)
