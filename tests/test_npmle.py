"""Grid NPMLE of the prior (Kiefer-Wolfowitz) by mix-SQP: ebfl.eb.npmle."""

import numpy as np
import pytest
from scipy import special, stats

from ebfl import beta_binomial_eb, gaussian_eb
from ebfl.eb import _kernels
from ebfl.eb.gaussian_mixture import GaussianMixturePrior, gaussian_mixture_posterior
from ebfl.eb.npmle import _gradient, _nonnegative_qp, npmle_binomial, npmle_normal
from tests.naive import (
    naive_mixture_gradient,
    naive_normal_grid_posterior,
    naive_normal_likelihood_matrix,
    naive_npmle_em,
)

Z = 4.0  # tolerance in Monte Carlo standard errors

# Half the clients at exactly 0, half spread around 2: a prior no single Gaussian fits.
PRIOR = GaussianMixturePrior([0.5, 0.5], [0.0, 2.0], [0.0, 0.5])


def _simulate(m, seed):
    rng = np.random.default_rng(seed)
    theta, _ = PRIOR.sample(m, rng=rng)
    s = rng.uniform(0.5, 1.5, size=m)
    return theta, theta + s * rng.standard_normal(m), s


def _true_loglik(x, s):
    """Marginal log-likelihood under PRIOR in closed form (normal convolutions)."""
    comps = [np.log(w) + stats.norm.logpdf(x, mu, np.sqrt(tau**2 + s**2))
             for w, mu, tau in zip(PRIOR.weights, PRIOR.means, PRIOR.sds, strict=True)]
    return float(special.logsumexp(np.stack(comps), axis=0).sum())


@pytest.fixture(scope="module")
def fitted():
    theta, x, s = _simulate(5000, seed=0)
    return theta, x, s, npmle_normal(x, s)


# ------------------------------------------------------------------ kernels

@pytest.mark.parametrize("seed", [0, 1])
def test_likelihood_matrix_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    x, s = rng.normal(0, 3, 400), rng.uniform(0.1, 2, 400)
    grid = np.linspace(-8, 8, 57)
    lik, shift = _kernels._normal_likelihood_matrix(x, s, grid)
    lik_ref, shift_ref = naive_normal_likelihood_matrix(x, s, grid)
    np.testing.assert_allclose(lik, lik_ref, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(shift, shift_ref, rtol=1e-12)
    assert np.all(lik.max(axis=1) == 1.0)


@pytest.mark.parametrize("n_rows", [1, 63, 64, 1000])
def test_gradient_kernel_matches_numpy(n_rows):
    rng = np.random.default_rng(n_rows)
    lik = rng.uniform(0, 1, (n_rows, 31))
    w = rng.dirichlet(np.ones(31))
    counts = rng.integers(1, 5, n_rows).astype(float)
    grad, ll = _gradient(lik, w, counts)
    grad_ref, ll_ref = naive_mixture_gradient(lik, w, counts)
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-12)
    assert ll == pytest.approx(ll_ref, rel=1e-12)


def test_gradient_kernel_row_with_no_mass_gives_minus_inf():
    lik = np.array([[1.0, 0.0], [0.0, 1.0]])
    grad, ll = _gradient(lik, np.array([1.0, 0.0]), np.ones(2))
    assert ll == -np.inf and np.all(np.isfinite(grad))


@pytest.mark.parametrize("seed", [0, 1])
def test_grid_posterior_matches_bayes_rule(seed):
    rng = np.random.default_rng(seed)
    x, s = rng.normal(0, 2, 300), rng.uniform(0.2, 1.5, 300)
    grid = np.linspace(-5, 5, 41)
    w = rng.dirichlet(np.ones(41))
    mean, var, loglik = _kernels._normal_grid_posterior(x, s, grid, np.log(w))
    mean_ref, var_ref, loglik_ref = naive_normal_grid_posterior(x, s, grid, w)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(loglik, loglik_ref, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_active_set_qp_matches_scipy_nnls(seed):
    """min y'Hy/2 + b'y over y >= 0 equals NNLS on the Cholesky factor (a different code)."""
    from scipy import linalg, optimize

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((60, 25))
    hess = a.T @ a
    b = rng.standard_normal(25) * 3
    start = rng.uniform(0, 1, 25) * (rng.random(25) < 0.4)
    start[0] = 1.0
    y = _nonnegative_qp(hess, b, start)
    chol = linalg.cholesky(hess)
    y_ref, _ = optimize.nnls(chol, -linalg.solve_triangular(chol, b, trans="T"))
    np.testing.assert_allclose(y, y_ref, atol=1e-9)
    dual = hess @ y + b
    assert np.all(y >= 0) and np.all(dual >= -1e-10)
    assert np.max(np.abs(dual[y > 0])) < 1e-9  # complementary slackness


# ------------------------------------------------------- normal likelihood

def test_loglik_at_least_the_true_priors(fitted):
    _, x, s, fit = fitted
    assert fit.converged
    assert fit.log_likelihood >= _true_loglik(x, s)


def test_kkt_certificate_checked_independently(fitted):
    """max_k (1/n) sum_i phi_ik / f_i <= 1 + tol, recomputed with scipy densities."""
    _, x, s, fit = fitted
    dens = stats.norm.pdf(x[:, None], fit.grid[None, :], s[:, None])
    ratio = (dens / (dens @ fit.weights)[:, None]).mean(axis=0)
    assert ratio.max() - 1 <= 1e-8 + 1e-12
    assert ratio.max() - 1 == pytest.approx(fit.kkt, abs=1e-10)
    assert np.all(fit.weights >= 0) and fit.weights.sum() == pytest.approx(1.0, abs=1e-12)
    # Bayes' rule recomputed from the densities gives the same posterior means.
    post = dens * fit.weights
    np.testing.assert_allclose(fit.posterior_mean, post @ fit.grid / post.sum(axis=1),
                               rtol=1e-9, atol=1e-12)
    assert fit.log_likelihood == pytest.approx(np.log(dens @ fit.weights).sum(), rel=1e-12)


def test_plain_em_never_beats_sqp_and_the_certificate_bounds_its_gap(fitted):
    _, x, s, fit = fitted
    lik, shift = naive_normal_likelihood_matrix(x, s, fit.grid)
    w_em, ll_em, _ = naive_npmle_em(lik, np.ones(x.size), shift, n_iter=500)
    assert ll_em <= fit.log_likelihood + x.size * fit.kkt
    # EM's own certificate, n (max_k r_k - 1), must bound its distance to the optimum.
    f = lik @ w_em
    kkt_em = (lik / f[:, None]).mean(axis=0).max() - 1
    assert fit.log_likelihood - ll_em <= x.size * kkt_em
    # ...and 500 EM iterations are still measurably short of the optimum.
    assert fit.log_likelihood - ll_em > 1e-3


def test_posterior_means_close_to_the_oracle(fitted):
    """Regret against the Bayes rule under the true prior is small; beats one Gaussian."""
    theta, x, s, fit = fitted
    oracle = gaussian_mixture_posterior(x, s, PRIOR).mean
    err_npmle = (fit.posterior_mean - theta) ** 2
    err_oracle = (oracle - theta) ** 2
    assert err_npmle.mean() <= 1.02 * err_oracle.mean()
    assert np.sqrt(np.mean((fit.posterior_mean - oracle) ** 2)) < 0.1
    err_gauss = (gaussian_eb(x, s).posterior.mean - theta) ** 2
    diff = err_gauss - err_npmle
    assert diff.mean() > Z * diff.std(ddof=1) / np.sqrt(diff.size)
    # The point mass at 0 is found: most prior mass within 0.25 of it.
    assert fit.prior_cdf(0.25) - fit.prior_cdf(-0.25) > 0.4


def test_binned_fit_agrees_with_the_exact_fit():
    _, x, _ = _simulate(5000, seed=2)
    exact = npmle_normal(x, 1.0)
    binned = npmle_normal(x, 1.0, bins=1000)
    assert binned.diagnostics["n_rows"] <= 1000
    # The exact fit is the optimum on the data: the binned prior cannot do better.
    assert binned.log_likelihood <= exact.log_likelihood + x.size * exact.kkt
    assert exact.log_likelihood - binned.log_likelihood < 0.01
    width = np.ptp(x) / 1000
    assert np.max(np.abs(binned.posterior_mean - exact.posterior_mean)) < 2 * width


def test_deterministic_and_does_not_mutate_input(fitted):
    _, x, s, fit = fitted
    x0, s0 = x.copy(), s.copy()
    again = npmle_normal(x, s)
    np.testing.assert_array_equal(again.weights, fit.weights)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(s, s0)
    with pytest.raises(ValueError):
        again.weights[0] = 1.0


def test_single_observation_is_a_point_mass_at_it():
    fit = npmle_normal([1.5], 0.3)
    assert fit.posterior_mean[0] == pytest.approx(1.5)
    assert fit.prior_mean == pytest.approx(1.5)


def test_support_and_cdf():
    rng = np.random.default_rng(3)
    theta = rng.choice([-3.0, 3.0], size=3000)
    fit = npmle_normal(theta + rng.standard_normal(3000), 1.0)
    atoms, w = fit.support(0.01)
    assert w.sum() > 0.95 and np.all(np.abs(np.abs(atoms) - 3) < 0.5)
    near = fit.prior_cdf([-2.5, 3.5]) - fit.prior_cdf([-3.5, 2.5])
    assert near.sum() > 0.98
    assert fit.prior_cdf(0.0) == pytest.approx(0.5, abs=Z * 0.5 / np.sqrt(3000) + 0.01)
    assert fit.prior_cdf([-10.0, 10.0]).tolist() == [0.0, pytest.approx(1.0)]
    assert fit.prior_var == pytest.approx(9.0, rel=0.05)


def test_max_iter_reached_warns():
    _, x, s = _simulate(500, seed=4)
    with pytest.warns(RuntimeWarning, match="NPMLE stopped"):
        fit = npmle_normal(x, s, max_iter=1)
    assert not fit.converged and fit.n_iter == 1 and fit.kkt > 1e-8


# ----------------------------------------------------- binomial likelihood

def test_binomial_beats_the_beta_mle_and_finds_two_clusters():
    rng = np.random.default_rng(5)
    p = rng.choice([0.2, 0.8], size=4000)
    n = rng.integers(5, 40, size=4000)
    z = rng.binomial(n, p)
    fit = npmle_binomial(z, n)
    beta = beta_binomial_eb(z, n)
    assert fit.converged and fit.log_likelihood >= beta.log_likelihood
    assert fit.prior_cdf(0.3) - fit.prior_cdf(0.1) == pytest.approx(
        np.mean(p == 0.2), abs=0.05)
    err_np = (fit.posterior_mean - p) ** 2
    err_beta = (beta.posterior.mean - p) ** 2
    diff = err_beta - err_np
    assert diff.mean() > Z * diff.std(ddof=1) / np.sqrt(diff.size)


def test_binomial_posterior_and_loglik_by_bayes_rule():
    rng = np.random.default_rng(6)
    n = rng.integers(1, 15, size=300)
    z = rng.binomial(n, rng.beta(2, 3, size=300))
    fit = npmle_binomial(z, n, n_grid=50)
    pmf = stats.binom.pmf(z[:, None], n[:, None], fit.grid[None, :])
    joint = pmf * fit.weights
    np.testing.assert_allclose(fit.posterior_mean, joint @ fit.grid / joint.sum(axis=1),
                               rtol=1e-10)
    assert fit.log_likelihood == pytest.approx(np.log(joint.sum(axis=1)).sum(), rel=1e-12)
    ratio = (pmf / (pmf @ fit.weights)[:, None]).mean(axis=0)
    assert ratio.max() - 1 <= 1e-8 + 1e-12
    assert fit.diagnostics["n_rows"] < 300  # clients with equal (n, z) share a row


# --------------------------------------------------------------- bad input

@pytest.mark.parametrize("x, s, kwargs, match", [
    ([0.0, np.nan], 1.0, {}, "x"),
    ([0.0, 1.0], -1.0, {}, r"s must lie in \[1e-150, 1e\+150\]"),
    ([0.0, 1.0], [1.0, 1.0, 1.0], {}, r"s must be a scalar or have shape \(2,\)"),
    ([0.0, 1.0], [1.0, 2.0], {"bins": 10}, "bins needs homoskedastic"),
    ([0.0, 1.0], 1.0, {"bins": 1}, "bins"),
    ([0.0, 1.0], 1.0, {"n_grid": 1}, "n_grid"),
    ([0.0, 1.0], 1.0, {"grid": [[0.0]]}, "grid"),
    ([0.0, 1.0], 1.0, {"tol": 0.0}, "tol"),
])
def test_normal_bad_input(x, s, kwargs, match):
    with pytest.raises(ValueError, match=match):
        npmle_normal(x, s, **kwargs)


@pytest.mark.parametrize("z, n, kwargs, match", [
    ([1, 3], [2, 2], {}, "must not exceed"),
    ([0, 1], [0, 2], {}, "empty"),
    ([0, 1], [2, 2], {"grid": [0.5, 1.5]}, r"\[0, 1\]"),
    ([], [], {}, "at least one"),
])
def test_binomial_bad_input(z, n, kwargs, match):
    with pytest.raises(ValueError, match=match):
        npmle_binomial(z, n, **kwargs)
