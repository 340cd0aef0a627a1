"""Beta-Bernoulli empirical Bayes (spec C.5, C.6)."""

import numpy as np
import pytest
from scipy import stats

from ebfl import BetaBernoulliPopulation, BetaPrior, Ragged, beta_bernoulli_eb, beta_binomial_eb
from ebfl.bounds import beta_local_mse, beta_posterior_mse
from ebfl.eb.beta_binomial import METHODS
from tests import naive

Z_MC = 4.0  # Monte Carlo tolerance: |estimate - formula| <= Z_MC standard errors


def _counts(seed=0, m=300, alpha=2.0, beta=5.0, n_lo=2, n_hi=30):
    rng = np.random.default_rng(seed)
    n = rng.integers(n_lo, n_hi, size=m)
    p = rng.beta(alpha, beta, size=m)
    return rng.binomial(n, p), n


def test_known_prior_closed_form():
    z, n = np.array([0, 3, 14, 7]), np.array([14, 14, 14, 10])
    res = beta_binomial_eb(z, n, prior=BetaPrior(2, 2), fix_prior=True)
    np.testing.assert_allclose(res.posterior.mean, (2 + z) / (4 + n), rtol=1e-15)
    np.testing.assert_allclose(res.posterior.alpha, 2 + z)
    np.testing.assert_allclose(res.posterior.beta, 2 + n - z)
    np.testing.assert_allclose(res.shrinkage, n / (4 + n))
    np.testing.assert_allclose(res.posterior.var, stats.beta(2 + z, 2 + n - z).var())
    assert res.method == "fixed" and res.n_clipped == 0


def test_known_beta_mse_monte_carlo():
    """Beta(2,2), n=14: posterior-mean MSE 0.0111111, local 0.0142857 (spec C.5, exact)."""
    pop = BetaBernoulliPopulation(2, 2)
    rng = np.random.default_rng(20261122)
    post, local = [], []
    for _ in range(40):
        p, z, n = pop.sample_sufficient(20_000, 14, rng=rng)
        res = beta_binomial_eb(z, n, prior=BetaPrior(2, 2), fix_prior=True)
        post.append(np.mean((res.posterior.mean - p) ** 2))
        local.append(np.mean((z / n - p) ** 2))
    for values, formula in ((post, beta_posterior_mse(2, 2, 14)),
                            (local, beta_local_mse(2, 2, 14))):
        se = np.std(values, ddof=1) / np.sqrt(len(values))
        assert abs(np.mean(values) - formula) <= Z_MC * se, (np.mean(values), formula, se)
    assert round(beta_posterior_mse(2, 2, 14), 7) == 0.0111111
    assert round(beta_local_mse(2, 2, 14), 7) == 0.0142857


def test_mle_recovers_prior_within_monte_carlo_spread():
    alpha, beta = 2.0, 5.0
    pop = BetaBernoulliPopulation(alpha, beta)
    rng = np.random.default_rng(7)
    fits = []
    for _ in range(30):
        _, z, n = pop.sample_sufficient(3000, rng.integers(5, 40, size=3000), rng=rng)
        res = beta_binomial_eb(z, n)
        assert res.diagnostics["converged"]
        fits.append((res.prior.alpha, res.prior.beta))
    fits = np.array(fits)
    se = fits.std(axis=0, ddof=1) / np.sqrt(len(fits))
    assert np.all(np.abs(fits.mean(axis=0) - [alpha, beta]) <= Z_MC * se), (fits.mean(0), se)


def test_mle_is_a_maximum_of_scipy_betabinom_likelihood():
    z, n = _counts(seed=3)
    res = beta_binomial_eb(z, n)
    g = res.prior
    want = stats.betabinom.logpmf(z, n, g.alpha, g.beta).sum()
    assert res.log_likelihood == pytest.approx(want, rel=1e-12)
    for da, db in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99), (1.01, 1.01)):
        other = stats.betabinom.logpmf(z, n, g.alpha * da, g.beta * db).sum()
        assert other < res.log_likelihood
    moments = beta_binomial_eb(z, n, method="moments")
    assert res.log_likelihood >= moments.log_likelihood


def test_dense_and_sorted_compression_agree(monkeypatch):
    from ebfl.eb import beta_binomial as bb

    z, n = _counts(seed=4)
    dense = bb._compress(z, n)
    monkeypatch.setattr(bb, "MAX_DENSE_TABLE_CELLS", 0)  # forces the np.unique route
    sorted_route = bb._compress(z, n)
    for a, b in zip(dense, sorted_route, strict=True):
        np.testing.assert_array_equal(a, b)
    assert dense[2].sum() == z.size


@pytest.mark.parametrize("method", ["loo_printed", "loo_proof", "loo_corrected"])
def test_loo_methods_equal_naive_eq6(method):
    z, n = _counts(seed=5, m=80)
    res = beta_binomial_eb(z, n, method=method)
    want = naive.naive_loo_beta(z / n, n, z, method)
    np.testing.assert_allclose(res.posterior.mean, want["est"], rtol=1e-12)
    np.testing.assert_allclose(res.shrinkage, want["a"], rtol=1e-12)
    np.testing.assert_allclose(res.centre, want["mu"], rtol=1e-12)
    assert res.n_clipped == want["clipped"].sum()


def test_loo_printed_with_equal_n_is_eq6_verbatim():
    """Eq. (6) with one common n, sums written out exactly as printed."""
    rng = np.random.default_rng(11)
    m, n = 40, 14
    x = rng.binomial(n, rng.beta(2, 2, size=m)) / n
    res = beta_binomial_eb(np.rint(x * n).astype(int), np.full(m, n), method="loo_printed")
    for i in (0, 17, 39):
        mu = [sum(x[l] for l in range(m) if l != k) / (m - 1) for k in range(m)]
        sigma2 = sum((x[l] - mu[l]) ** 2 for l in range(m) if l != i) / (m - 2)
        a = n / (mu[i] * (1 - mu[i]) / sigma2 - 1 + n)
        assert res.posterior.mean[i] == pytest.approx(a * x[i] + (1 - a) * mu[i], rel=1e-12)


def test_printed_weight_leans_local_and_corrected_does_not():
    """Spec [!5]c: sigma_hat^2 estimates Var(xbar), not Var(p): printed a is biased up.

    Population values for Beta(2,2), n=14: true a = 0.778, printed plug-in 0.829.
    """
    pop = BetaBernoulliPopulation(2, 2)
    p, z, n = pop.sample_sufficient(200_000, 14, rng=1)
    printed = beta_binomial_eb(z, n, method="loo_printed").shrinkage.mean()
    corrected = beta_binomial_eb(z, n, method="loo_corrected").shrinkage.mean()
    assert printed == pytest.approx(0.829, abs=0.005)
    assert corrected == pytest.approx(14 / 18, abs=0.005)


def test_clipped_count_reported():
    z = np.array([0, 1, 1, 0, 1, 1, 0, 1])
    res = beta_binomial_eb(z, np.ones(8, int), method="loo_printed")
    assert res.n_clipped == 8
    assert np.all((res.shrinkage >= 0) & (res.shrinkage <= 1))
    np.testing.assert_allclose(res.posterior.mean, z)


def test_corrected_variance_floor_gives_global_mean():
    # Identical clients: no heterogeneity at all, the corrected variance is < 0.
    z, n = np.full(20, 5), np.full(20, 10)
    res = beta_binomial_eb(z, n, method="loo_corrected")
    assert res.diagnostics["n_variance_floored"] == 20
    np.testing.assert_allclose(res.shrinkage, 0.0)
    np.testing.assert_allclose(res.posterior.mean, 0.5)
    lo, hi = res.posterior.interval()
    np.testing.assert_allclose(lo, 0.5)
    np.testing.assert_allclose(hi, 0.5)


def test_intervals_match_scipy():
    z, n = _counts(seed=6, m=50)
    for method in METHODS:
        res = beta_binomial_eb(z, n, method=method)
        lo, hi = res.posterior.interval(0.9)
        a, b = res.posterior.alpha, res.posterior.beta
        np.testing.assert_allclose(lo, stats.beta.ppf(0.05, a, b), rtol=1e-10)
        np.testing.assert_allclose(hi, stats.beta.ppf(0.95, a, b), rtol=1e-10)
        assert np.all((lo <= res.posterior.mean) & (res.posterior.mean <= hi))


def test_ragged_path_equals_counts_path():
    sample = BetaBernoulliPopulation(3, 2).sample(200, np.arange(1, 201) % 17 + 2, rng=2)
    z = np.array([c.sum() for c in (sample.data[i] for i in range(200))])
    for method in ("mle", "loo_printed"):
        a = beta_bernoulli_eb(sample.data, method=method)
        b = beta_binomial_eb(z, sample.data.counts, method=method)
        np.testing.assert_array_equal(a.posterior.mean, b.posterior.mean)
    as_bool = Ragged(sample.data.values.astype(bool), sample.data.offsets)
    np.testing.assert_array_equal(beta_bernoulli_eb(as_bool).posterior.mean,
                                  beta_bernoulli_eb(sample.data).posterior.mean)


def test_inputs_not_mutated_and_results_frozen():
    z, n = _counts(seed=8)
    z0, n0 = z.copy(), n.copy()
    for method in METHODS:
        res = beta_binomial_eb(z, n, method=method)
        np.testing.assert_array_equal(z, z0)
        np.testing.assert_array_equal(n, n0)
        with pytest.raises(ValueError):
            res.posterior.mean[0] = 0.0
        with pytest.raises(AttributeError):
            res.method = "x"


def test_fixed_prior_overrides_data():
    z, n = _counts(seed=9)
    res = beta_binomial_eb(z, n, prior=BetaPrior(1, 1), fix_prior=True)
    assert res.prior == BetaPrior(1, 1)
    start = beta_binomial_eb(z, n, prior=BetaPrior(1, 1))
    assert start.diagnostics["start_from"] == "prior"
    assert start.prior.alpha == pytest.approx(beta_binomial_eb(z, n).prior.alpha, rel=1e-5)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"successes": [1, 2], "trials": [3]}, ValueError, "same length"),
    ({"successes": [4, 1, 1], "trials": [3, 3, 3]}, ValueError, "exceed"),
    ({"successes": [-1, 1, 1], "trials": [3, 3, 3]}, ValueError, "successes must be >= 0"),
    ({"successes": [1, 1, 1], "trials": [3, 0, 3]}, ValueError, "empty"),
    ({"successes": [1.5, 1, 1], "trials": [3, 3, 3]}, ValueError, "whole numbers"),
    ({"successes": [np.nan, 1, 1], "trials": [3, 3, 3]}, ValueError, "finite"),
    ({"successes": [1, 1, 1], "trials": [3, np.inf, 3]}, ValueError, "finite"),
    ({"successes": [[1, 1]], "trials": [[3, 3]]}, ValueError, "1-D"),
    ({"successes": ["a", "b"], "trials": [3, 3]}, TypeError, "integer counts"),
    ({"successes": [], "trials": []}, ValueError, "at least one"),
    ({"successes": [1, 2], "trials": [3, 3], "method": "loo_printed"}, ValueError, "at least 3"),
    ({"successes": [1], "trials": [3]}, ValueError, "at least 2 clients"),
    ({"successes": [1, 1, 1], "trials": [1, 3, 3], "method": "loo_corrected"}, ValueError,
     "trials >= 2"),
    ({"successes": [1, 1, 1], "trials": [1, 3, 3], "method": "moments"}, ValueError,
     "trials >= 2"),
    ({"successes": [1, 0, 1], "trials": [1, 1, 1]}, ValueError, "not identifiable"),
    ({"successes": [1, 1, 1], "trials": [3, 3, 3], "method": "em"}, ValueError, "method"),
    ({"successes": [1, 1, 1], "trials": [3, 3, 3], "fix_prior": True}, ValueError, "needs a prior"),
    ({"successes": [1, 1, 1], "trials": [3, 3, 3], "prior": (1, 1)}, TypeError, "BetaPrior"),
])
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        beta_binomial_eb(**kwargs)


@pytest.mark.parametrize(("values", "match"), [
    ([1, 0, 2, 1], "0 or 1"), ([1, 0, np.nan, 1], "0 or 1"), ([0.5, 1, 0, 1], "0 or 1"),
])
def test_bad_bernoulli_values(values, match):
    with pytest.raises(ValueError, match=match):
        beta_bernoulli_eb(Ragged(np.array(values), np.array([0, 2, 4])))


def test_bad_prior_values():
    for a, b in ((0, 1), (1, -1), (np.nan, 1), (np.inf, 1)):
        with pytest.raises(ValueError, match="alpha|beta"):
            BetaPrior(a, b)
    with pytest.raises(ValueError, match="variance"):
        BetaPrior.from_moments(0.5, 0.3)


def test_no_heterogeneity_gives_strong_shrinkage():
    """Binomial counts with one common p: the fitted prior is narrow and shrinks hard.

    (The MLE of alpha + beta is infinite when the sample happens to be
    under-dispersed and finite otherwise; either way the weight on z/n is small.)
    """
    rng = np.random.default_rng(0)
    z = rng.binomial(20, 0.5, size=2000)
    res = beta_binomial_eb(z, np.full(2000, 20))
    assert res.diagnostics["converged"]
    assert res.shrinkage.max() < 0.1
    np.testing.assert_allclose(res.posterior.mean, z.mean() / 20, atol=0.02)


def test_mle_derivatives_match_finite_differences():
    """Gradient and Hessian (from the z, n-z, n margins) against scipy.stats.betabinom."""
    from ebfl.eb import beta_binomial as bb

    z, n = _counts(seed=12)

    def loglik(t):
        return stats.betabinom.logpmf(z, n, *np.exp(t)).sum()

    x0 = np.log([1.3, 3.1])
    value, grad, hess = bb._derivatives(x0, bb._compress(z, n), bb._margins(z, n))
    const = bb._log_binom_total(*bb._compress(z, n))
    assert value + const == pytest.approx(loglik(x0), rel=1e-12)
    h = 1e-5
    eye = np.eye(2) * h
    fd_grad = [(loglik(x0 + e) - loglik(x0 - e)) / (2 * h) for e in eye]
    np.testing.assert_allclose(grad, fd_grad, rtol=1e-6)
    fd_hess = [[(loglik(x0 + a + b) - loglik(x0 + a - b) - loglik(x0 - a + b)
                 + loglik(x0 - a - b)) / (4 * h * h) for b in eye] for a in eye]
    np.testing.assert_allclose(hess, fd_hess, rtol=1e-4)
