"""Beta-Bernoulli empirical Bayes (eq. (6), Theorem 3 and the alternatives)."""

import warnings

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
    """Beta(2,2), n=14: posterior-mean MSE 0.0111111, local 0.0142857 (exact)."""
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
    from ebfl.eb import _beta_binomial_mle as bb

    z, n = _counts(seed=4)
    dense = bb._compress(z, n)
    monkeypatch.setattr(bb, "MAX_DENSE_TABLE_CELLS", 0)  # forces the np.unique route
    sorted_route = bb._compress(z, n)
    for a, b in zip(dense, sorted_route, strict=True):
        np.testing.assert_array_equal(a, b)
    assert dense[2].sum() == z.size


@pytest.mark.parametrize("method", ["loo_printed", "loo_corrected"])
def test_leave_one_out_fit_is_the_same_on_both_routes(monkeypatch, method):
    # Eq. (6) is computed per distinct (n, z) pair and copied to the clients through
    # the dense table or, on the sorting route, through each client's pair number.
    from ebfl.eb import _beta_binomial_mle as bb

    z, n = _counts(seed=6, m=90)
    dense = beta_binomial_eb(z, n, method=method)
    monkeypatch.setattr(bb, "MAX_DENSE_TABLE_CELLS", 0)
    sorted_route = beta_binomial_eb(z, n, method=method)
    want = naive.naive_loo_beta(z / n, n, z, method)
    for res in (dense, sorted_route):
        np.testing.assert_allclose(res.posterior.mean, want["est"], rtol=1e-12)
        np.testing.assert_allclose(res.posterior.var, want["post_var"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(res.diagnostics["loo_variance"], want["var"], rtol=1e-12,
                                   atol=1e-15)
        assert res.n_clipped == want["clipped"].sum()


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
    """Errata [!5]: sigma_hat^2 estimates Var(xbar), not Var(p): printed a is biased up.

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


ISSUE_N = np.array([2, 2, 2, 3, 1, 166, 158, 370, 345, 266, 95, 242, 206])
ISSUE_Z = np.array([0, 0, 0, 0, 0, 94, 94, 213, 185, 154, 59, 107, 106])


def test_mle_issue_reproduction_reaches_the_interior_optimum():
    """Tiny clients without successes used to send Newton to the alpha + beta -> inf plateau
    (alpha 9.5e9, loglik -40.0148, converged=False without a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = beta_binomial_eb(ISSUE_Z, ISSUE_N)
    d = res.diagnostics
    assert d["converged"] and not d["at_bound"] and d["active_bounds"] == ()
    assert res.prior.alpha == pytest.approx(93.290, abs=5e-4)
    assert res.prior.beta == pytest.approx(78.670, abs=5e-4)
    assert res.log_likelihood == pytest.approx(-38.3065, abs=5e-5)
    want = stats.betabinom.logpmf(ISSUE_Z, ISSUE_N, res.prior.alpha, res.prior.beta).sum()
    assert res.log_likelihood == pytest.approx(want, rel=1e-13)
    # Every start reaches the same optimum; the moments start is the one that failed before.
    assert d["start_from"] == "moments"
    for label, loglik, converged in d["starts"]:
        assert converged and loglik == pytest.approx(res.log_likelihood, abs=1e-9), label


def test_mle_keeps_the_best_start(monkeypatch):
    """A start whose run ends lower (here: stopped after one step) does not win."""
    from ebfl.eb import _beta_binomial_mle as bb

    real = bb._newton_ascent
    calls = []

    def first_run_stops_early(x0, counts, tol):
        calls.append(x0)
        run = real(x0, counts, tol)
        if len(calls) == 1:  # pretend the first start stalled at its starting value
            return bb._Run(np.asarray(x0, float), bb._value(x0, counts), 1, False, 1.0)
        return run

    monkeypatch.setattr(bb, "_newton_ascent", first_run_stops_early)
    res = beta_binomial_eb(ISSUE_Z, ISSUE_N)
    assert res.diagnostics["start_from"] != "moments" and res.diagnostics["converged"]
    assert res.log_likelihood == pytest.approx(-38.3065, abs=5e-5)


def test_mle_warns_when_not_converged(monkeypatch):
    from ebfl.eb import _beta_binomial_mle as bb

    monkeypatch.setattr(bb, "_MAX_ITER", 1)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        res = beta_binomial_eb(ISSUE_Z, ISSUE_N)
    assert res.diagnostics["converged"] is False


def test_mle_no_overdispersion_is_flagged_at_the_upper_edge():
    """Under-dispersed counts: the supremum is the binomial limit alpha + beta -> inf."""
    z, n = np.array([5, 5, 4, 6, 5, 5, 5, 4, 6, 5]), np.full(10, 10)
    res = beta_binomial_eb(z, n)
    d = res.diagnostics
    assert d["converged"] and d["at_bound"] and d["active_bounds"] == ("concentration_upper",)
    assert res.prior.alpha + res.prior.beta == pytest.approx(1e12)
    binomial_limit = stats.binom.logpmf(z, n, z.sum() / n.sum()).sum()
    assert res.log_likelihood == pytest.approx(binomial_limit, abs=1e-9)
    np.testing.assert_allclose(res.posterior.mean, 0.5, atol=1e-10)  # complete pooling


@pytest.mark.parametrize(("z", "n", "edge"), [
    ([0, 0, 0, 0], [3, 5, 2, 7], "mean_lower"),
    ([3, 5, 2, 7], [3, 5, 2, 7], "mean_upper"),
    ([0, 5, 0, 7, 1, 0], [3, 5, 2, 7, 1, 4], "concentration_lower"),
])
def test_mle_edges_of_the_parameter_space(z, n, edge):
    """No successes (no failures): mean -> 0 (1); only 0 or n successes: alpha, beta -> 0."""
    z, n = np.array(z), np.array(n)
    res = beta_binomial_eb(z, n)
    d = res.diagnostics
    assert d["converged"] and d["at_bound"] and edge in d["active_bounds"]
    if edge == "concentration_lower":  # point masses at 0 (weight 4/6) and 1 (2/6)
        q = np.mean(z == n)
        want = np.sum(np.where(z == n, np.log(q), np.log1p(-q)))
        assert res.prior.mean == pytest.approx(q, rel=1e-6)
    else:
        want = 0.0  # every count has probability 1
    assert res.log_likelihood == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("a", [1e-20, 1e-8, 0.37, 3.0, 29.5, 255.0, 1e3, 1e6, 1e10, 1e12])
def test_rising_sums_match_mpmath(a):
    """sum_{j<k} of log1p(j/a), j/(a+j), ja/(a+j)^2, (j/(a+j))^2: direct and Euler-Maclaurin
    parts (k > 256) against digamma/trigamma identities at 80 digits."""
    import mpmath as mp

    from ebfl.eb import _beta_binomial_mle as bb

    mp.mp.dps = 80
    for k in (2, 3, 17, 256, 257, 300, 1000, 12345, 10**7):
        got = bb._rising_sums(a, bb._margin(np.array([float(k)]), np.array([1.0])), True)
        am, km = mp.mpf(a), mp.mpf(k)
        psi = mp.digamma(am + km) - mp.digamma(am)
        tri = mp.psi(1, am) - mp.psi(1, am + km)
        want = (mp.loggamma(am + km) - mp.loggamma(am) - km * mp.log(am), km - am * psi,
                am * psi - am * am * tri, km - 2 * am * psi + am * am * tri)
        for name, g, w in zip(("log1p", "ratio", "second", "square"), got, want, strict=True):
            assert abs(mp.mpf(g) - w) <= 4e-15 * abs(w), (name, k, g, float(w))


@pytest.mark.parametrize("concentration", [3.0, 1e4, 1e8, 1e10, 1e12])
def test_log_likelihood_accurate_at_large_concentration(concentration):
    """At alpha + beta = 1e10, betaln differences lose ~1e-4; the finite-sum form does not."""
    import mpmath as mp

    mp.mp.dps = 60
    rng = np.random.default_rng(3)
    n = np.r_[rng.integers(1, 200, size=200), [400, 3000, 10**5]]
    z = rng.binomial(n, 0.3)
    prior = BetaPrior(0.3 * concentration, 0.7 * concentration)
    res = beta_binomial_eb(z, n, prior=prior, fix_prior=True)
    a, b = mp.mpf(prior.alpha), mp.mpf(prior.beta)
    want = mp.fsum(mp.loggamma(ni + 1) - mp.loggamma(zi + 1) - mp.loggamma(ni - zi + 1)
                   + mp.loggamma(zi + a) + mp.loggamma(ni - zi + b) - mp.loggamma(ni + a + b)
                   - mp.loggamma(a) - mp.loggamma(b) + mp.loggamma(a + b)
                   for zi, ni in zip(z.tolist(), n.tolist(), strict=True))
    # Rounding of terms as large as n log(n) (log-gammas, log binomial coefficients)
    # is unavoidable; betaln differences are off by 1e-5 at 1e8 and 4e-3 at 1e10 here.
    tol = 1e-15 * np.sum(n * np.log1p(n))
    assert abs(res.log_likelihood - want) <= tol, (res.log_likelihood, float(want))


def test_mle_derivatives_match_mpmath():
    """Gradient and Hessian in (logit mean, log(1 + 1/s)), up to s = 1e11 and with counts
    beyond the direct sums, against central differences of an 60-digit log-likelihood."""
    import mpmath as mp

    from ebfl.eb import _beta_binomial_mle as bb

    mp.mp.dps = 60
    rng = np.random.default_rng(12)
    n = np.r_[rng.integers(1, 40, size=30), [300, 1000, 5000]]
    z = rng.binomial(n, rng.beta(2, 5, size=n.size))
    counts = bb._counts_model(z, n)
    pairs = [tuple(int(v) for v in p) for p in zip(*counts.pairs, strict=True)]

    def loglik(t, phi):
        s = 1 / mp.expm1(phi)
        a = s / (1 + mp.exp(-t))
        b = s - a
        return mp.fsum(w * (mp.loggamma(zz + a) + mp.loggamma(nn - zz + b) - mp.loggamma(nn + s)
                            - mp.loggamma(a) - mp.loggamma(b) + mp.loggamma(s))
                       for nn, zz, w in pairs)

    h = mp.mpf(10) ** -12
    unit = ((h, 0), (0, h))
    for t0, s0 in ((0.3, 5.0), (-3.0, 1e4), (1.0, 1e11), (-20.0, 0.01)):
        x = np.array([t0, np.log1p(1 / s0)])
        value, grad, hess = bb._derivatives(x, counts)
        t, phi = mp.mpf(x[0]), mp.mpf(x[1])
        assert value == pytest.approx(float(loglik(t, phi)), rel=1e-14)
        for i, (dt, dp) in enumerate(unit):
            fd = (loglik(t + dt, phi + dp) - loglik(t - dt, phi - dp)) / (2 * h)
            assert grad[i] == pytest.approx(float(fd), rel=1e-12)
            for j, (et, ep) in enumerate(unit):
                fd2 = (loglik(t + dt + et, phi + dp + ep) - loglik(t + dt - et, phi + dp - ep)
                       - loglik(t - dt + et, phi - dp + ep)
                       + loglik(t - dt - et, phi - dp - ep)) / (4 * h * h)
                assert hess[i, j] == pytest.approx(float(fd2), rel=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_ragged_fit_equals_the_fit_from_counts(method):
    # beta_bernoulli_eb counts into int32 arrays (no client reaches 2^31 observations);
    # beta_binomial_eb gets int64 counts: the fits must agree to the last digit.
    from ebfl.eb.beta_binomial import bernoulli_counts

    rng = np.random.default_rng(8)
    n = rng.integers(2, 40, size=300)
    values = (rng.random(n.sum()) < np.repeat(rng.beta(2, 3, size=300), n)).astype(np.uint8)
    data = Ragged.from_counts(values, n)
    ragged = beta_bernoulli_eb(data, method=method)
    counts = beta_binomial_eb(*bernoulli_counts(data), method=method)
    np.testing.assert_array_equal(ragged.posterior.mean, counts.posterior.mean)
    np.testing.assert_array_equal(ragged.posterior.concentration, counts.posterior.concentration)
    np.testing.assert_array_equal(ragged.shrinkage, counts.shrinkage)
    assert ragged.log_likelihood == counts.log_likelihood
