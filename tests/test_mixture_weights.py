"""Every mixture-weights fit reaches its certified optimum (ebfl.eb.mixture_weights).

The generators below are the shapes users have: sparse effects (most exactly 0), heavy
tails, a few atoms, clusters, skewed nonnegative effects, outliers, standard errors
constant, heteroskedastic and spread over three decades, and data far outside the
grid. On each, a default call must be ``converged``; its ``kkt``, recomputed from
scipy's densities, must be at most ``tol``; and its log-likelihood must be at least
that of a long plain-EM run on the same grid (EM's log-likelihood never decreases, so
it is a lower bound on the optimum). Before the mass moves of ``_vertex_steps``, about
a quarter of such fits stopped after two iterations with kkt ~ 1e11 and tens to
hundreds of nats below EM.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from ebfl.eb import _mixsqp_kernels, gaussian_mixture_eb, mixsqp
from ebfl.eb import mixture_weights as mixsqp_module
from ebfl.eb.npmle import npmle_binomial, npmle_normal
from tests.naive import naive_npmle_em, naive_vertex_slope

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
TOL = 1e-8  # the default tol of every fit
KKT_SLACK = 1e-10  # rounding between the fit's kkt and scipy's recomputation
EM_REL = 1e-9  # the fit may not fall below EM by more than this (relative)
EM_WORK = 4e7  # entries of L visited by the reference EM (its iterations: EM_WORK / (n K))


def _em_lower_bound(log_lik, counts=None, most=3000):
    """Log-likelihood after plain EM from the uniform weights (a lower bound on the optimum)."""
    shift = log_lik.max(axis=1)
    lik = np.exp(log_lik - shift[:, None])
    counts = np.ones(lik.shape[0]) if counts is None else counts
    n_iter = int(min(most, max(50, EM_WORK / lik.size)))
    return naive_npmle_em(lik, counts, shift, n_iter=n_iter)[1]


def _certificate(log_lik, weights, counts=None):
    """max_k r_k - 1 and the log-likelihood, from the log densities (log-sum-exp) of
    rows with multiplicities ``counts``."""
    counts = np.ones(log_lik.shape[0]) if counts is None else counts
    with np.errstate(divide="ignore"):
        log_f = special.logsumexp(log_lik + np.log(weights)[None, :], axis=1)
    ratio = counts @ np.exp(log_lik - log_f[:, None]) / counts.sum()
    return float(ratio.max() - 1.0), float(counts @ log_f)


def _check_certified(fit, log_lik, counts=None):
    """The fit is converged, certified independently, and at least as high as EM."""
    assert fit.converged
    kkt, loglik = _certificate(log_lik, fit.weights, counts)
    assert kkt <= TOL + KKT_SLACK
    assert fit.log_likelihood == pytest.approx(loglik, rel=1e-10, abs=1e-8)
    em = _em_lower_bound(log_lik, counts)
    assert fit.log_likelihood >= em - EM_REL * abs(em)
    # The reported bound holds: EM is below the optimum, which is within n * kkt.
    assert em <= fit.log_likelihood + fit.diagnostics["log_likelihood_gap_bound"] + 1e-12 * abs(em)


# ------------------------------------------------------------------- generators

def _effects(rng, shape, n):
    if shape == "sparse_exp":  # most exactly 0, a few large of either sign
        return np.where(rng.random(n) < 0.7, 0.0, rng.exponential(2, n) * rng.choice([-1, 1], n))
    if shape == "sparse_normal":
        return np.where(rng.random(n) < 0.9, 0.0, rng.normal(0, 3, n))
    if shape == "t3":
        return rng.standard_t(3, n)
    if shape == "cauchy":
        return rng.standard_cauchy(n)
    if shape == "atoms":  # a discrete prior
        return rng.choice([-3.0, 0.0, 3.0], n, p=[0.2, 0.6, 0.2])
    if shape == "clusters":
        centres = rng.normal(0, 10, 4)
        return centres[rng.integers(0, 4, n)] + 0.3 * rng.standard_normal(n)
    if shape == "gamma":  # skewed, nonnegative
        return rng.gamma(0.5, 2.0, n)
    # outliers: a tight bulk and a few far-away effects
    return np.where(rng.random(n) < 0.98, rng.normal(0, 0.5, n), rng.choice([-40.0, 60.0], n))


SHAPES = ["sparse_exp", "sparse_normal", "t3", "cauchy", "atoms", "clusters", "gamma",
          "outliers"]


@st.composite
def normal_means(draw, sizes=(10, 30, 100, 300, 1000, 3000)):
    """(x, s, grid or None, n_grid) of a normal-means problem."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.sampled_from(sizes))
    theta = _effects(rng, draw(st.sampled_from(SHAPES)), n)
    base = 10.0 ** draw(st.integers(-2, 1))
    spread = draw(st.sampled_from(["constant", "uniform", "decades"]))
    if spread == "constant":
        s = np.full(n, base)
    elif spread == "uniform":
        s = base * rng.uniform(0.5, 1.5, n)
    else:  # three orders of magnitude
        s = base * 10.0 ** rng.uniform(0, 3, n)
    x = theta * base * draw(st.sampled_from([1.0, 3.0, 10.0])) + s * rng.standard_normal(n)
    where = draw(st.sampled_from(["default", "default", "default", "inside", "away"]))
    grid = None
    if where == "inside":  # much of the data far outside the grid
        centre, half = np.median(x), max(np.std(x) / 4, base)
        grid = np.linspace(centre - half, centre + half, draw(st.sampled_from([20, 100])))
    elif where == "away":  # the grid far from all of the data
        grid = np.linspace(x.max() + 10 * base, x.max() + 30 * base, 50)
    return x, s, grid, draw(st.sampled_from([20, 100, 300, 300]))


def _normal_log_lik(x, s, grid):
    return stats.norm.logpdf(x[:, None], grid[None, :], s[:, None])


@st.composite
def binomial_counts(draw, sizes=(10, 100, 1000, 10_000, 30_000)):
    """(successes, trials) with ragged trials."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    m = draw(st.sampled_from(sizes))
    shape = draw(st.sampled_from(["beta28", "rare", "sparse", "atoms", "extremes"]))
    if shape == "beta28":
        p = rng.beta(2, 8, m)
    elif shape == "rare":
        p = rng.beta(0.3, 30, m)
    elif shape == "sparse":  # most exactly 0
        p = np.where(rng.random(m) < 0.8, 0.0, rng.uniform(0, 1, m))
    elif shape == "atoms":
        p = rng.choice([0.05, 0.5], m)
    else:
        p = rng.choice([0.0, 0.3, 1.0], m)
    trials = draw(st.sampled_from(["uniform", "heavy", "constant"]))
    if trials == "uniform":
        n = rng.integers(1, 200, m)
    elif trials == "heavy":  # ragged over orders of magnitude
        n = np.minimum(np.maximum(1, (rng.pareto(1.0, m) * 5).astype(np.int64)), 10**5)
    else:
        n = np.full(m, 20)
    return rng.binomial(n, p), n


# ------------------------------------------------------------------------ tests

def test_the_reported_reproduction_is_certified_and_matches_long_em():
    """n = 200 sparse signals: used to stop after 2 iterations, kkt 1.4e11, 88 nats short."""
    rng = np.random.default_rng(36)
    n = 200
    theta = np.where(rng.random(n) < 0.7, 0, rng.exponential(2, n) * rng.choice([-1, 1], n))
    x = theta + rng.standard_normal(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = npmle_normal(x, np.ones(n))
    log_lik = _normal_log_lik(x, np.ones(n), fit.grid)
    _check_certified(fit, log_lik)
    em = naive_npmle_em(*_shifted(log_lik), n_iter=5000)[1]
    assert fit.log_likelihood >= em - 1e-9 * abs(em)
    assert fit.log_likelihood > -344.34  # 20,000 EM iterations reach -344.335


def _shifted(log_lik):
    shift = log_lik.max(axis=1)
    return np.exp(log_lik - shift[:, None]), np.ones(log_lik.shape[0]), shift


@settings(max_examples=100, deadline=None, derandomize=True)
@given(normal_means())
def test_normal_npmle_is_certified_on_every_shape(case):
    x, s, grid, n_grid = case
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        fit = npmle_normal(x, s, grid=grid, n_grid=n_grid)
    _check_certified(fit, _normal_log_lik(x, s, fit.grid))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(normal_means(sizes=(2000, 5000)))
def test_binned_fit_is_within_its_bound_of_the_exact_fit(case):
    """bins="auto": the exact optimum exceeds the binned prior's exact log-likelihood by at
    most ``log_likelihood_gap_bound``, and never falls below it by more than n * kkt."""
    x, s, grid, n_grid = case
    exact = npmle_normal(x, s, grid=grid, n_grid=n_grid)
    binned = npmle_normal(x, s, grid=grid, n_grid=n_grid, bins="auto")
    assert exact.converged and binned.converged
    d = binned.diagnostics
    gap = exact.log_likelihood - binned.log_likelihood
    assert gap <= d["log_likelihood_gap_bound"] + 1e-9 * abs(exact.log_likelihood)
    assert gap >= -x.size * exact.kkt - 1e-9 * abs(exact.log_likelihood)


@pytest.mark.parametrize("shape, spread, n", [("sparse_exp", "uniform", 100_000),
                                              ("t3", "decades", 30_000)])
def test_normal_npmle_is_certified_on_large_data(shape, spread, n):
    rng = np.random.default_rng(5)
    s = rng.uniform(0.5, 1.5, n) if spread == "uniform" else 10.0 ** rng.uniform(-1, 2, n)
    x = _effects(rng, shape, n) + s * rng.standard_normal(n)
    fit = npmle_normal(x, s)
    log_lik = _normal_log_lik(x, s, fit.grid)
    assert fit.converged
    kkt, loglik = _certificate(log_lik, fit.weights)
    assert kkt <= TOL + KKT_SLACK
    assert fit.log_likelihood == pytest.approx(loglik, rel=1e-10)
    em = _em_lower_bound(log_lik, most=20)
    assert fit.log_likelihood >= em


@SETTINGS
@given(binomial_counts())
def test_binomial_npmle_is_certified_on_ragged_trials(case):
    z, n = case
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = npmle_binomial(z, n)
    # on the distinct (n, z) pairs with their multiplicities: the same sums, cheaper
    pairs, counts = np.unique(np.stack([n, z], axis=1), axis=0, return_counts=True)
    log_lik = stats.binom.logpmf(pairs[:, 1:], pairs[:, :1], fit.grid[None, :])
    _check_certified(fit, log_lik, counts.astype(np.float64))


def test_max_iter_set_by_the_user_reports_its_bound():
    rng = np.random.default_rng(36)
    theta = np.where(rng.random(200) < 0.7, 0, rng.exponential(2, 200) * rng.choice([-1, 1], 200))
    x = theta + rng.standard_normal(200)
    with pytest.warns(RuntimeWarning, match=r"max_iter reached.*may be up to [0-9.e+]+ nats"):
        short = npmle_normal(x, 1.0, max_iter=2)
    full = npmle_normal(x, 1.0)
    assert not short.converged and short.n_iter == 2
    bound = short.diagnostics["log_likelihood_gap_bound"]
    assert bound == pytest.approx(200 * short.kkt)
    assert 0 < full.log_likelihood - short.log_likelihood <= bound


def test_an_unreachable_tol_stops_when_no_step_gains():
    """tol below double precision: the fit stops (no hang), says why, and is at the
    optimum up to rounding."""
    rng = np.random.default_rng(1)
    x = rng.choice([-2.0, 2.0], 500) + rng.standard_normal(500)
    with pytest.warns(RuntimeWarning, match="no step gains at double precision"):
        fit = npmle_normal(x, 1.0, tol=1e-300)
    assert not fit.converged and fit.n_iter < 1000 and fit.kkt < 1e-12


def test_a_subproblem_that_fails_falls_back_to_mass_moves(monkeypatch):
    """When the quadratic subproblem gives no descent direction (rounding on a singular
    Hessian), the iteration moves mass instead of stopping as if converged."""
    real = mixsqp_module._nonnegative_qp
    calls = []

    def failing_every_other_call(hess, b, start, **kwargs):
        calls.append(1)
        return start.copy() if len(calls) % 2 else real(hess, b, start, **kwargs)

    monkeypatch.setattr(mixsqp_module, "_nonnegative_qp", failing_every_other_call)
    rng = np.random.default_rng(2)
    x = rng.choice([-3.0, 0.0, 3.0], 400) + rng.standard_normal(400)
    fit = npmle_normal(x, 1.0)
    assert len(calls) > 2
    _check_certified(fit, _normal_log_lik(x, np.ones(400), fit.grid))


@pytest.mark.parametrize("n_rows", [1, 63, 64, 1000])
def test_vertex_slope_kernel_matches_numpy(n_rows):
    rng = np.random.default_rng(n_rows)
    f = rng.uniform(1e-6, 1, n_rows)
    col = rng.uniform(0, 1, n_rows) * (rng.random(n_rows) < 0.8)
    counts = rng.integers(1, 5, n_rows).astype(float)
    for a in (0.0, 1e-9, 0.3, 1.0):
        got = _mixsqp_kernels._vertex_slope(f, col, a, counts, min(64, n_rows))
        want = naive_vertex_slope(f, col, a, counts)
        if np.isinf(want):
            assert got == want
        else:
            assert got == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------- mixsqp(L)

def test_mixsqp_on_likelihoods_and_log_likelihoods_agree():
    rng = np.random.default_rng(3)
    x = np.concatenate([np.zeros(300), rng.normal(0, 4, 100)]) + rng.standard_normal(400)
    grid = np.linspace(-12, 12, 61)
    log_lik = _normal_log_lik(x, np.ones(400), grid)
    kept = log_lik.copy()
    by_log = mixsqp(log_lik, log=True)
    by_value = mixsqp(np.exp(log_lik))
    np.testing.assert_array_equal(log_lik, kept)  # not modified
    for fit in (by_log, by_value):
        assert fit.converged
        kkt, loglik = _certificate(log_lik, fit.weights)
        assert kkt <= TOL + KKT_SLACK
        assert fit.log_likelihood == pytest.approx(loglik, rel=1e-10)
        assert fit.log_likelihood_gap_bound == pytest.approx(400 * fit.kkt)
    assert by_log.log_likelihood == pytest.approx(by_value.log_likelihood, abs=400 * 2e-8)


def test_mixsqp_stopped_by_max_iter_warns_with_its_bound():
    rng = np.random.default_rng(6)
    x = np.concatenate([np.zeros(300), rng.normal(0, 4, 100)]) + rng.standard_normal(400)
    log_lik = _normal_log_lik(x, np.ones(400), np.linspace(-12, 12, 61))
    with pytest.warns(RuntimeWarning, match=r"mixsqp stopped after 1 iterations \(max_iter"):
        fit = mixsqp(log_lik, log=True, max_iter=1)
    assert not fit.converged
    assert fit.log_likelihood_gap_bound == pytest.approx(400 * fit.kkt)
    best = mixsqp(log_lik, log=True)
    assert 0 < best.log_likelihood - fit.log_likelihood <= fit.log_likelihood_gap_bound


def test_mixsqp_counts_equal_repeated_rows():
    rng = np.random.default_rng(4)
    lik = rng.uniform(0, 1, (30, 8)) ** 4
    counts = rng.integers(1, 5, 30)
    weighted = mixsqp(lik, counts=counts, tol=1e-12)
    repeated = mixsqp(np.repeat(lik, counts, axis=0), tol=1e-12)
    assert weighted.log_likelihood == pytest.approx(repeated.log_likelihood, rel=1e-12)
    np.testing.assert_allclose(weighted.weights, repeated.weights, atol=1e-5)
    warm = mixsqp(lik, counts=counts, start=weighted.weights, tol=1e-12)
    assert warm.n_iter <= 1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"L": [[0.0, 0.0], [1.0, 2.0]]}, ValueError, r"row 0 of L is 0 everywhere"),
    ({"L": [[-1.0, 1.0]]}, ValueError, r"L must hold likelihoods >= 0"),
    ({"L": [[np.nan, 1.0]]}, ValueError, "L must be finite"),
    ({"L": [1.0, 2.0]}, ValueError, "L must have ndim"),
    ({"L": [[-np.inf, -np.inf]], "log": True}, ValueError, r"row 0 of L is -inf everywhere"),
    ({"L": [[np.inf, 0.0]], "log": True}, ValueError, r"finite or -inf"),
    ({"L": [[1.0, 2.0]], "log": 1}, TypeError, "log must be True or False"),
    ({"L": [[1.0, 2.0]], "counts": [0.0]}, ValueError, r"counts must have shape \(1,\)"),
    ({"L": [[1.0, 2.0]], "start": [0.0, 0.0]}, ValueError, "start must have shape"),
    ({"L": [[1.0, 2.0]], "start": [1.0]}, ValueError, "start must have shape"),
    ({"L": [[1.0, 2.0]], "tol": 0.0}, ValueError, "tol"),
    ({"L": [[1.0, 2.0]], "max_iter": 0}, ValueError, "max_iter"),
])
def test_mixsqp_bad_input(kwargs, error, match):
    lik = kwargs.pop("L")
    with pytest.raises(error, match=match):
        mixsqp(lik, **kwargs)


# ------------------------------------------------------- Gaussian-mixture weights

@pytest.mark.parametrize("shape, k", [("sparse_exp", 2), ("sparse_normal", 2), ("t3", 3)])
def test_gaussian_mixture_weights_are_certified_for_their_components(shape, k):
    """At convergence the weights are optimal for the fitted components (EM's own
    update stopped with m * kkt near a nat on sparse data)."""
    rng = np.random.default_rng(0)
    s = rng.uniform(0.5, 1.5, 3000)
    x = _effects(rng, shape, 3000) + s * rng.standard_normal(3000)
    res = gaussian_mixture_eb(x, s, k, rng=0)
    assert res.converged
    p = res.prior
    log_dens = np.stack([stats.norm.logpdf(x, mu, np.sqrt(sd**2 + s**2))
                         for mu, sd in zip(p.means, p.sds, strict=True)], axis=1)
    kkt, loglik = _certificate(log_dens, p.weights)
    assert kkt <= TOL + KKT_SLACK
    assert res.diagnostics["weights_kkt"] == pytest.approx(kkt, abs=1e-10)
    assert res.log_likelihood == pytest.approx(loglik, rel=1e-10)
    best = mixsqp(log_dens, log=True, tol=1e-12)  # no other weights do better
    assert best.log_likelihood <= res.log_likelihood + 3000 * TOL


def test_gaussian_mixture_stopped_by_max_iter_still_has_certified_weights():
    rng = np.random.default_rng(1)
    s = rng.uniform(0.5, 1.5, 2000)
    x = _effects(rng, "sparse_normal", 2000) + s * rng.standard_normal(2000)
    res = gaussian_mixture_eb(x, s, 3, rng=0, max_iter=5, n_init=1)
    assert not res.converged and res.n_iter == 5
    assert res.log_likelihood_history.size == 6  # n_iter + 1 entries
    assert res.log_likelihood == res.log_likelihood_history[-1]
    assert np.all(np.diff(res.log_likelihood_history) >= -1e-9 * abs(res.log_likelihood))
    p = res.prior
    log_dens = np.stack([stats.norm.logpdf(x, mu, np.sqrt(sd**2 + s**2))
                         for mu, sd in zip(p.means, p.sds, strict=True)], axis=1)
    kkt, loglik = _certificate(log_dens, p.weights)
    assert kkt <= TOL + KKT_SLACK and res.diagnostics["weights_kkt"] <= TOL
    assert res.log_likelihood == pytest.approx(loglik, rel=1e-10)
