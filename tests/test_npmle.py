"""Grid NPMLE of the prior (Kiefer-Wolfowitz) by mix-SQP: ebfl.eb.npmle."""

import numba
import numpy as np
import pytest
from scipy import special, stats

from ebfl import beta_binomial_eb, gaussian_eb
from ebfl.eb import _mixsqp_kernels, _npmle_kernels
from ebfl.eb import mixture_weights as mixsqp_module
from ebfl.eb import npmle as npmle_module
from ebfl.eb.gaussian_mixture import GaussianMixturePrior, gaussian_mixture_posterior
from ebfl.eb.mixture_weights import _gradient, _mix_sqp, _nonnegative_qp
from ebfl.eb.npmle import npmle_binomial, npmle_normal
from tests.naive import (
    naive_atom_posterior,
    naive_binning_error,
    naive_cell_index,
    naive_cell_rows,
    naive_farthest_from_grid,
    naive_log_likelihood_along,
    naive_normal_likelihood_matrix,
    naive_npmle_em,
    naive_sparse_mixture_gradient,
    naive_weighted_gram,
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


def _grid_loglik(x, s, grid, w, counts=None):
    """sum_i c_i log sum_k w_k phi_{s_i}(x_i - u_k) with scipy's density."""
    with np.errstate(divide="ignore"):
        log_joint = np.log(w)[None, :] + stats.norm.logpdf(x[:, None], grid[None, :],
                                                            s[:, None])
    per_row = special.logsumexp(log_joint, axis=1)
    return float(per_row.sum() if counts is None else counts @ per_row)


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
    lik, shift = npmle_module._normal_likelihood_matrix(x, s, grid)
    lik_ref, shift_ref = naive_normal_likelihood_matrix(x, s, grid)
    np.testing.assert_allclose(lik, lik_ref, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(shift, shift_ref, rtol=1e-12)
    assert np.all(lik.max(axis=1) == 1.0)


@pytest.mark.parametrize("n_rows", [1, 63, 64, 1000])
def test_gradient_kernel_matches_numpy(n_rows):
    rng = np.random.default_rng(n_rows)
    lik = rng.uniform(0, 1, (n_rows, 31))
    w = rng.dirichlet(np.ones(31)) * (rng.random(31) < 0.3)  # sparse, as the solver's
    w[3] = 0.2
    counts = rng.integers(1, 5, n_rows).astype(float)
    grad, ll, f = _gradient(lik, w, counts)
    grad_ref, ll_ref, f_ref = naive_sparse_mixture_gradient(lik, w, np.flatnonzero(w),
                                                            counts)
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-12)
    np.testing.assert_allclose(f, f_ref, rtol=1e-12)
    assert ll == pytest.approx(ll_ref, rel=1e-12)


def test_gradient_kernel_row_with_no_mass_gives_minus_inf():
    lik = np.array([[1.0, 0.0], [0.0, 1.0]])
    grad, ll, f = _gradient(lik, np.array([1.0, 0.0]), np.ones(2))
    assert ll == -np.inf and np.all(np.isfinite(grad)) and f.tolist() == [1.0, 0.0]
    assert grad.tolist() == naive_sparse_mixture_gradient(lik, np.array([1.0, 0.0]),
                                                          np.array([0]), np.ones(2))[0].tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_atom_posterior_matches_bayes_rule(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    x, s = rng.normal(0, 2, 300), rng.uniform(0.2, 1.5, 300)
    atoms = np.sort(rng.uniform(-5, 5, 7))
    w = rng.dirichlet(np.ones(7))
    log_joint = np.empty((300, 7))
    top = _npmle_kernels._atom_log_joint(x, s, atoms, np.log(w), log_joint)
    mean, var = np.empty(300), np.empty(300)
    loglik = _npmle_kernels._atom_moments(np.exp(log_joint), atoms, top, mean, var, 16)
    loglik -= np.log(s).sum() + 300 * 0.5 * np.log(2 * np.pi)
    mean_ref, var_ref, loglik_ref = naive_atom_posterior(x, s, atoms, w)
    assert np.all(log_joint.max(axis=1) == 0.0)
    # ...and the chunked pass of the fit, in chunks of 1024 rows (the last one shorter)
    monkeypatch.setattr(npmle_module, "POSTERIOR_CHUNK_CELLS", 1)
    whole = npmle_module._atom_posterior(np.tile(x, 5), np.tile(s, 5), atoms, w)
    np.testing.assert_allclose(whole[0], np.tile(mean_ref, 5), rtol=1e-12, atol=1e-12)
    assert whole[2] == pytest.approx(5 * loglik_ref, rel=1e-12)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-10, atol=1e-14)
    assert loglik == pytest.approx(loglik_ref, rel=1e-12)


@pytest.mark.parametrize("n_rows, m", [(1, 1), (7, 5), (1001, 13)])
def test_hessian_matvec_and_line_search_kernels_match_numpy(n_rows, m):
    rng = np.random.default_rng(m)
    a = rng.uniform(0, 1, (n_rows, m))
    f, u = rng.uniform(0.5, 2, n_rows), rng.uniform(0.0, 2, n_rows)
    counts = rng.integers(1, 5, n_rows).astype(float)
    hess = _mixsqp_kernels._weighted_gram(a, f, counts, min(16, n_rows))
    np.testing.assert_allclose(hess, naive_weighted_gram(a, f, counts), rtol=1e-12)
    assert np.array_equal(hess, hess.T)
    y = rng.uniform(0, 1, m)
    np.testing.assert_allclose(_mixsqp_kernels._matvec(a, y), a @ y, rtol=1e-12)
    for alpha in (1.0, 0.25):
        ll = _mixsqp_kernels._log_likelihood_along(f, u, alpha, counts, min(64, n_rows))
        assert ll == pytest.approx(naive_log_likelihood_along(f, u, alpha, counts), rel=1e-12)
    u[0] = -3.0 * f[0]  # the full step leaves a row without mass
    assert _mixsqp_kernels._log_likelihood_along(f, u, 1.0, counts, 1) == -np.inf
    cols = rng.permutation(m)[: max(1, m // 2)]
    np.testing.assert_array_equal(_mixsqp_kernels._gather_columns(a, cols), a[:, cols])


@pytest.mark.parametrize("scale", [(0.0, 0.0, 0.0), (2.5, 0.3, 1.7)])
def test_cell_kernels_match_numpy(scale):
    rng = np.random.default_rng(11)
    x, s = rng.normal(0, 2, 3000), rng.uniform(0.4, 1.6, 3000)
    counts = rng.integers(1, 4, 3000).astype(float)
    widths = np.array([0.3]) if scale[0] == 0 else rng.uniform(0.05, 0.5, 4)
    cell = _npmle_kernels._cell_index(x, s, np.array(scale), 1.0 / widths,
                                      _offsets(x, widths, x.min()), x.min())
    np.testing.assert_array_equal(cell, naive_cell_index(x, s, scale, widths, x.min()))
    n_cells = int(_offsets(x, widths, x.min())[-1])
    mean_x, mean_s, total, row = naive_cell_rows(cell, x, s, counts)
    got = _npmle_kernels._dense_cell_rows(cell, x, s, counts, n_cells)  # cell -> row
    np.testing.assert_allclose(got[0], mean_x, rtol=1e-12)
    np.testing.assert_allclose(got[1], mean_s, rtol=1e-12)
    np.testing.assert_array_equal(got[2], total)
    np.testing.assert_array_equal(cell, row)


def _offsets(x, widths, x_low):
    n_bins = np.floor((x.max() - x_low) / widths).astype(np.int64) + 1
    return np.concatenate([[0], np.cumsum(n_bins)])


@pytest.mark.parametrize("seed", [0, 1])
def test_binning_error_kernel_matches_scipy_and_bounds_a_dense_search(seed):
    rng = np.random.default_rng(seed)
    x, s = rng.normal(0, 2, 500), rng.uniform(0.3, 1.5, 500)
    row = rng.integers(0, 40, 500)
    rep_x, rep_s = rng.normal(0, 2, 40), rng.uniform(0.3, 1.5, 40)
    rep_s[:5] = s[np.flatnonzero(row < 5)[:1]] if np.any(row < 5) else rep_s[:5]
    low, high = -6.0, 7.0
    total, worst = _npmle_kernels._binning_error(x, s, row, rep_x, rep_s, low, high, 16)
    r = naive_binning_error(x, s, rep_x[row], rep_s[row], low, high)
    # rel 1e-10, not 1e-12: the kernel adds 8 ulps of its terms (up to ~100 here) to
    # cover its rounding, and scipy's difference of two log densities cancels as much.
    assert total == pytest.approx(r.sum(), rel=1e-10) and total >= r.sum() * (1 - 1e-13)
    assert worst == pytest.approx(r.max(), rel=1e-10)
    # Whatever u, the bound holds (a brute-force search over a fine grid).
    u = np.linspace(low, high, 4001)
    dense = np.abs(stats.norm.logpdf(x[:, None], u, s[:, None])
                   - stats.norm.logpdf(rep_x[row][:, None], u, rep_s[row][:, None]))
    assert np.all(dense.max(axis=1) <= r * (1 + 1e-9) + 1e-12)
    assert dense.max(axis=1).sum() >= total * (1 - 1e-3)  # and is attained


def test_farthest_from_grid_matches_numpy():
    rng = np.random.default_rng(4)
    x, s = rng.normal(0, 4, 700), rng.uniform(0.1, 2, 700)
    grid = np.sort(rng.uniform(-3, 3, 30))
    ref = naive_farthest_from_grid(x, s, grid)
    for inside_ok in (False, True):  # inside the range only the search path measures
        reach, i = _npmle_kernels._farthest_from_grid(x, s, grid, inside_ok, 8)
        assert (reach, i) == (pytest.approx(ref[0], rel=1e-14), ref[1])


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


def test_active_set_qp_on_a_badly_scaled_hessian():
    """A diagonal spanning 6 orders of magnitude (a column whose likelihood is small
    everywhere has a large one): the solution and its support are found. A ridge
    relative to the mean diagonal used to bias the small entries and stall the fit."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 12))
    d = np.logspace(0, 3, 12)
    hess = (a.T @ a) * d[:, None] * d[None, :]
    y_true = np.where(np.arange(12) % 2 == 0, rng.uniform(0.1, 1, 12) / d, 0.0)
    dual_true = np.where(y_true > 0, 0.0, rng.uniform(1e-6, 1e-3, 12))
    b = dual_true - hess @ y_true
    for start in (np.ones(12), y_true):  # cold (dense start) and warm
        y = _nonnegative_qp(hess, b, start)
        np.testing.assert_array_equal(y > 0, y_true > 0)
        np.testing.assert_allclose(y, y_true, rtol=1e-9)


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
    # The certified bound: the exact optimum is at most the reported gap above it.
    assert exact.log_likelihood - binned.log_likelihood <= binned.diagnostics[
        "log_likelihood_gap_bound"]
    assert binned.diagnostics["binning_error_max"] <= 2.0 * 0.5 * width * np.ptp(x) + 1e-9


def test_warm_started_active_set_fit_agrees_with_the_dense_cold_fit(fitted):
    """Both paths certified: their log-likelihoods differ by at most n * kkt."""
    _, x, s, fit = fitted
    weights, info = npmle_module._fit_normal_rows(x, s, np.ones(x.size), fit.grid, 1e-10, 100,
                                                  warm_start=False, active_set=False)
    assert info["converged"] and info["n_iter"] >= 1
    dense = _grid_loglik(x, s, fit.grid, weights)
    assert abs(dense - fit.log_likelihood) <= x.size * max(fit.kkt, info["kkt"]) + 1e-9
    # The mixture densities at the data (unique at the optimum) agree too.
    dens = stats.norm.pdf(x[:, None], fit.grid[None, :], s[:, None])
    np.testing.assert_allclose(dens @ fit.weights, dens @ weights, rtol=1e-3)


def test_the_fixture_fit_takes_the_warm_started_path(fitted, monkeypatch):
    _, x, s, fit = fitted
    starts = []
    real = npmle_module._mix_sqp

    def spy(*args, start=None, **kwargs):
        starts.append(start)
        return real(*args, start=start, **kwargs)

    monkeypatch.setattr(npmle_module, "_mix_sqp", spy)
    again = npmle_normal(x, s)
    assert len(starts) == 2 and starts[0] is None and starts[1] is not None
    assert np.count_nonzero(starts[1]) < 40  # the coarse solution is already sparse
    np.testing.assert_array_equal(again.weights, fit.weights)


def test_warm_start_without_mass_on_a_row_restarts_from_uniform():
    rng = np.random.default_rng(8)
    lik = rng.uniform(0.1, 1, (50, 6))
    lik[0, :] = [1.0, 0, 0, 0, 0, 0]  # row 0 lives on column 0 only
    start = np.array([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    w, info = _mix_sqp(lik, np.ones(50), np.zeros(50), 1e-10, 100, start=start)
    assert info["converged"] and np.isfinite(info["history"][0]) and w[0] > 0


def test_same_answer_on_one_thread(fitted, monkeypatch):
    _, x, s, fit = fitted
    for module in (npmle_module, mixsqp_module):  # every kernel on threads
        monkeypatch.setattr(module, "PARALLEL_MIN_WORK", 0)
    assert numba.get_num_threads() > 1 or numba.config.DISABLE_JIT
    threaded = npmle_normal(x, s)
    binned = npmle_normal(x, s, bins="auto", bin_error=10.0)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = npmle_normal(x, s)
        binned_one = npmle_normal(x, s, bins="auto", bin_error=10.0)
    finally:
        numba.set_num_threads(threads)
    for a, b in ((threaded, one), (threaded, fit), (binned, binned_one)):
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.posterior_mean, b.posterior_mean)
        assert a.log_likelihood == b.log_likelihood
    assert binned.diagnostics["n_rows"] < x.size // 2
    assert binned.diagnostics["binning_error_bound"] == binned_one.diagnostics[
        "binning_error_bound"]


@pytest.fixture(scope="module")
def auto_binned():
    _, x, s = _simulate(6000, seed=9)
    return x, s, npmle_normal(x, s, bins="auto", bin_error=4.0)


def test_auto_binning_bound_holds_for_every_prior(auto_binned):
    """|l_binned(g) - l(g)| <= E for priors spread out and concentrated anywhere on the
    grid, E = sum_i r_i recomputed with scipy."""
    x, s, fit = auto_binned
    grid = fit.grid
    rows = npmle_module._auto_cells(x, s, grid, 4.0)
    assert rows.x.size == fit.diagnostics["n_rows"] <= x.size // 2
    r = naive_binning_error(x, s, rows.x[rows.row], rows.s[rows.row], grid.min(), grid.max())
    bound = fit.diagnostics["binning_error_bound"]
    assert bound == pytest.approx(r.sum(), rel=1e-9)
    assert fit.diagnostics["binning_error_max"] <= 4.0
    rng = np.random.default_rng(10)
    priors = [fit.weights, np.full(grid.size, 1 / grid.size), rng.dirichlet(np.ones(grid.size))]
    for k in (0, grid.size // 3, grid.size - 1):  # point masses, the ends included
        priors.append(np.eye(grid.size)[k])
    for w in priors:
        exact = _grid_loglik(x, s, grid, w)
        binned = _grid_loglik(rows.x, rows.s, grid, w, rows.count)
        assert abs(binned - exact) <= bound
    # It is conservative: it adds |rho_i| over observations whose changes partly cancel.
    assert abs(fit.diagnostics["binned_log_likelihood"] - fit.log_likelihood) < 0.01 * bound


def test_auto_binned_fit_is_within_its_gap_bound_of_the_exact_fit(auto_binned):
    x, s, fit = auto_binned
    exact = npmle_normal(x, s, grid=fit.grid)
    gap = exact.log_likelihood - fit.log_likelihood
    assert -x.size * exact.kkt <= gap <= fit.diagnostics["log_likelihood_gap_bound"]
    assert gap < 0.05  # the realized loss: second order in the cell sizes
    assert np.max(np.abs(fit.posterior_mean - exact.posterior_mean)) < 0.01
    assert fit.converged and fit.diagnostics["binned_log_likelihood"] == pytest.approx(
        fit.diagnostics["history"][-1])


def test_auto_binning_that_would_not_compress_fits_the_exact_data(fitted):
    _, x, s, fit = fitted
    tight = npmle_normal(x, s, bins="auto", bin_error=1e-3)
    assert tight.diagnostics["n_rows"] == x.size
    assert tight.diagnostics["binning_error_bound"] == 0.0
    np.testing.assert_array_equal(tight.weights, fit.weights)


def test_a_likelihood_matrix_larger_than_memory_is_refused(monkeypatch):
    monkeypatch.setattr(npmle_module, "_available_memory", lambda: 1e5)  # 100 kB left
    x = np.linspace(0, 1, 2000)
    with pytest.raises(MemoryError, match=r"2000 x 300 likelihood matrix needs .*bins=\"auto\""):
        npmle_normal(x, 0.1)
    with pytest.raises(MemoryError, match="50 x 300 likelihood matrix .* coarser grid"):
        npmle_binomial(np.arange(2000) % 50, np.full(2000, 60))  # 50 distinct pairs
    assert npmle_normal(x, 0.1, n_grid=6).converged  # 2000 x 6 x 8 B fit in 100 kB


def test_auto_binning_of_homoskedastic_data_uses_one_class():
    _, x, _ = _simulate(4000, seed=12)
    fit = npmle_normal(x, 0.8, bins="auto", bin_error=0.5)
    assert fit.converged and fit.diagnostics["n_rows"] < 2000
    assert fit.diagnostics["binning_error_max"] <= 0.5


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


def test_binomial_coarse_grid_warm_start_reaches_the_same_optimum(monkeypatch):
    rng = np.random.default_rng(13)
    n = rng.integers(1, 60, size=3000)
    z = rng.binomial(n, rng.choice([0.15, 0.5, 0.9], size=3000))
    cold = npmle_binomial(z, n, tol=1e-10)
    starts = []
    real = npmle_module._coarse_grid_start

    def spy(*args):
        starts.append(real(*args))
        return starts[-1]

    monkeypatch.setattr(npmle_module, "PARALLEL_MIN_WORK", 0)  # warm-start small fits too
    monkeypatch.setattr(npmle_module, "_coarse_grid_start", spy)
    warm = npmle_binomial(z, n, tol=1e-10)
    start = starts[0]
    assert start is not None and np.all(start[np.arange(300) % 4 != 0] == 0)
    assert warm.converged and cold.converged
    assert abs(warm.log_likelihood - cold.log_likelihood) <= 3000 * max(warm.kkt, cold.kkt)
    # A row without likelihood on the coarse grid: no warm start.
    lik = np.eye(16)[[1, 2, 3]]  # columns 1-3: none on the coarse grid 0, 4, 8, 12
    assert real(lik, np.ones(3), np.zeros(3)) is None


@pytest.mark.parametrize("n_max", [30, 5_000_000])  # dense table; sorted packed keys
def test_distinct_pairs_and_their_inverse(n_max):
    rng = np.random.default_rng(n_max % 97)
    n = rng.integers(1, n_max + 1, 2000)
    n[:500] = n[500:1000]  # repeated pairs
    z = rng.binomial(n, 0.3)
    z[:500] = z[500:1000]
    nu, zu, counts, inverse = npmle_module._distinct_pairs(z, n)
    pairs, ref_counts = np.unique(np.stack([n, z], axis=1), axis=0, return_counts=True)
    np.testing.assert_array_equal(np.stack([nu, zu], axis=1), pairs)
    np.testing.assert_array_equal(counts, ref_counts)
    np.testing.assert_array_equal(nu[inverse], n)
    np.testing.assert_array_equal(zu[inverse], z)


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
    ([0.0, 1.0], -1.0, {}, r"s must be > 0"),
    ([0.0, 1.0], [1.0, 1.0, 1.0], {}, r"s must be a scalar or have shape \(2,\)"),
    ([0.0, 1.0], [1.0, 2.0], {"bins": 10}, "bins needs homoskedastic"),
    ([0.0, 1.0], 1.0, {"bins": 1}, "bins"),
    ([0.0, 1.0], 1.0, {"n_grid": 1}, "n_grid"),
    ([0.0, 1.0], 1.0, {"grid": [[0.0]]}, "grid"),
    ([0.0, 1.0], 1.0, {"tol": 0.0}, "tol"),
    ([0.0, 1.0], 1.0, {"bins": "fine"}, "bins must be None, an int >= 2 or 'auto'"),
    ([0.0, 1.0], 1.0, {"bins": "auto", "bin_error": 0.0}, "bin_error"),
    ([0.0, 1e151], 1.0, {}, "x must lie in"),
    ([0.0, 1.0], 1e-150, {"grid": [1e140]}, "standard errors s from the nearest grid point"),
    # a grid whose gaps exceed 1e150 s: points inside its range are measured too
    ([0.0, 1.0], 1e-150, {"grid": [-1e150, 1e150]}, r"x\[0\] = 0.0 lies 1e\+300"),
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
