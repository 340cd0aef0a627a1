"""Gaussian-mixture prior fitted by EM (ebfl.eb.gaussian_mixture; the regularizer of (21))."""

import dataclasses

import numpy as np
import pytest
from scipy import special, stats
from sklearn.exceptions import ConvergenceWarning

from ebfl import gaussian_eb
from ebfl.eb.discrete import discrete_posterior
from ebfl.eb.gaussian_mixture import (
    EMPTY_COUNT,
    GaussianMixturePrior,
    _update_component,
    gaussian_mixture_eb,
    gaussian_mixture_posterior,
)

Z = 4.0  # tolerance in (approximate) standard errors

# A well-separated three-component population in d = 2 (means >= 4.5 apart,
# marginal sds <= sqrt(1 + 1) = 1.4), with heteroskedastic standard errors.
TRUE_WEIGHTS = np.array([0.5, 0.3, 0.2])
TRUE_MEANS = np.array([[-4.0, 0.0], [0.0, 3.0], [4.0, -1.0]])  # sorted by first coordinate
TRUE_SDS = np.array([0.5, 1.0, 0.3])
TRUE_PRIOR = GaussianMixturePrior(TRUE_WEIGHTS, TRUE_MEANS, TRUE_SDS)
S_RANGE = (0.3, 1.0)


def _simulate(m, seed, prior=TRUE_PRIOR, s_range=S_RANGE):
    rng = np.random.default_rng(seed)
    theta, labels = prior.sample(m, rng=rng)
    s = rng.uniform(*s_range, size=m)
    noise = rng.standard_normal(theta.shape)
    x = theta + (s[:, None] if theta.ndim == 2 else s) * noise
    return theta, labels, x, s


def _naive_loglik(x, s, weights, means, sds):
    """sum_i log sum_l p_l prod_j N(x_ij; mu_lj, tau_l^2 + s_i^2), with scipy.stats."""
    x2 = x if x.ndim == 2 else x[:, None]
    mu = means if means.ndim == 2 else means[:, None]
    terms = np.stack([np.log(w) + stats.norm.logpdf(x2, mu[l], np.sqrt(sds[l] ** 2 + s**2)[:, None])
                      .sum(axis=1) for l, w in enumerate(weights)], axis=1)
    return float(special.logsumexp(terms, axis=1).sum()), terms


def _naive_neg_profile_q(tau, x2, s2, r):
    """-Q_l(mu_l(tau^2), tau^2) up to a constant, with mu_l the r/(tau^2 + s^2)-weighted mean."""
    v = tau**2 + s2
    w = r / v
    mu = w @ x2 / w.sum()
    return 0.5 * float(r @ (x2.shape[1] * np.log(v) + np.sum((x2 - mu) ** 2, axis=1) / v))


def _naive_posterior(x, s, weights, means, sds):
    """Mixture posterior from first principles: returns r, a, component means, mean, var."""
    x2 = x if x.ndim == 2 else x[:, None]
    mu = means if means.ndim == 2 else means[:, None]
    d = x2.shape[1]
    _, terms = _naive_loglik(x, s, weights, means, sds)
    r = np.exp(terms - special.logsumexp(terms, axis=1, keepdims=True))
    m, k = r.shape
    a = np.empty((m, k))
    comp = np.empty((m, k, d))
    for i in range(m):
        for l in range(k):
            a[i, l] = sds[l] ** 2 / (sds[l] ** 2 + s[i] ** 2)
            comp[i, l] = mu[l] + a[i, l] * (x2[i] - mu[l])
    mean = np.sum(r[:, :, None] * comp, axis=1)
    within = np.sum(r * a * s[:, None] ** 2, axis=1)
    between = np.sum(r * np.sum((comp - mean[:, None, :]) ** 2, axis=2), axis=1) / d
    return r, a, comp, mean, within + between


# --------------------------------------------------------------------------- k = 1


@pytest.mark.parametrize(("d", "sigma_theta", "noise"), [(1, 1.5, 1.0), (3, 0.7, 1.0),
                                                         (1, 0.0, 0.5)])
def test_one_component_equals_gaussian_eb(d, sigma_theta, noise):
    """k = 1: the EM M-step is the exact profile MLE, so the fit is gaussian_eb's.

    The last case is under-dispersed (noise 0.5 s_i): the MLE of sigma_theta is 0.
    """
    rng = np.random.default_rng(10 + d)
    m = 300
    s = rng.uniform(0.2, 1.5, size=m)
    theta = 2.0 + sigma_theta * rng.standard_normal((m, d))
    x = theta + noise * s[:, None] * rng.standard_normal((m, d))
    x = x[:, 0] if d == 1 else x
    res = gaussian_mixture_eb(x, s, 1, rng=0)
    ref = gaussian_eb(x, s)
    assert res.converged
    np.testing.assert_allclose(res.prior.means[0], ref.prior.mean, rtol=1e-6)
    np.testing.assert_allclose(res.prior.sds[0], ref.prior.sd, rtol=1e-6, atol=1e-9)
    assert res.log_likelihood == pytest.approx(ref.log_likelihood, rel=1e-9)
    np.testing.assert_allclose(res.posterior.mean, ref.posterior.mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res.posterior.var, ref.posterior.var, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(res.shrinkage[:, 0], ref.shrinkage, rtol=1e-6, atol=1e-12)
    assert res.prior.weights.tolist() == [1.0]
    if noise < 1:
        assert ref.diagnostics["at_zero"] and res.prior.sds[0] == 0.0


# --------------------------------------------------------------------------- M-step


@pytest.mark.parametrize(("spread", "min_sd", "case"), [
    (2.0, 0.0, "interior"), (0.05, 0.0, "floored at 0"), (2.0, 2.5, "floored at min_sd"),
])
def test_equal_s_tau_update_is_closed_form(spread, min_sd, case):
    """Equal s_i: tau^2 = max(min_sd^2, sum r |x - mu|^2 / (d sum r) - s^2), mu = r-mean."""
    rng = np.random.default_rng(20)
    m, d, s = 200, 3, 0.6
    x2 = spread * rng.standard_normal((m, d)) + 1.0
    r = rng.uniform(0.0, 1.0, size=m)
    s2 = np.full(m, s**2)
    upper = max(min_sd, 2 * np.sqrt(np.max(np.sum((x2 - x2.mean(0)) ** 2, 1))) / np.sqrt(d))
    mu, tau2 = _update_component(x2, s2, r, 0.3, min_sd, upper)
    mu_cf = r @ x2 / r.sum()
    tau2_cf = max(min_sd**2, float(r @ np.sum((x2 - mu_cf) ** 2, axis=1)) / (d * r.sum()) - s**2)
    np.testing.assert_allclose(mu, mu_cf, rtol=1e-12)
    assert tau2 == pytest.approx(tau2_cf, rel=1e-7, abs=1e-14), case
    if case != "interior":
        assert tau2 == min_sd**2


def test_heteroskedastic_tau_update_maximizes_profile_q():
    """Unequal s_i: the update beats a fine grid of tau and keeps mu = sum r w x / sum r w.

    From tau = 5 the profile is convex (P'' > 0), so the global search runs; from
    tau = 0.5 Newton alone finds the same maximizer.
    """
    rng = np.random.default_rng(21)
    m, d = 150, 2
    s = rng.uniform(0.1, 2.0, size=m)
    x2 = rng.normal(0.0, 1.3, size=(m, d)) + s[:, None] * rng.standard_normal((m, d))
    r = rng.uniform(0.0, 1.0, size=m)
    mu, tau2 = _update_component(x2, s**2, r, 5.0, 0.0, 20.0)
    best = _naive_neg_profile_q(np.sqrt(tau2), x2, s**2, r)
    grid = [_naive_neg_profile_q(t, x2, s**2, r) for t in np.linspace(0.0, 20.0, 4001)]
    assert best <= min(grid) + 1e-9
    w = r / (tau2 + s**2)
    np.testing.assert_allclose(mu, w @ x2 / w.sum(), rtol=1e-12)
    mu_newton, tau2_newton = _update_component(x2, s**2, r, 0.5, 0.0, 20.0)
    assert tau2_newton == pytest.approx(tau2, rel=1e-8)
    np.testing.assert_allclose(mu_newton, mu, rtol=1e-8)


# Two precise, close clients beside three imprecise, distant ones: the profile of
# tau^2 has a local maximum at 383.5 (loglik -22.878) and the global one at 0.005826
# (loglik -18.647). Newton from tau = 10 climbs to the local one.
TWO_PEAKS_X = np.array([-0.1889, -0.0295, -59.0, -36.0, -37.0])
TWO_PEAKS_S = np.array([0.023, 0.023, 18.0, 18.0, 18.0])


def test_tau_update_finds_the_global_maximum_among_several():
    x2, s2 = TWO_PEAKS_X[:, None], TWO_PEAKS_S**2
    r = np.ones(5)
    upper = 2 * np.max(np.abs(TWO_PEAKS_X - TWO_PEAKS_X.mean()))
    grid = np.r_[0.0, np.geomspace(1e-8, upper, 20001)]
    naive = [-_naive_neg_profile_q(t, x2, s2, r) for t in grid]
    assert 0.075 < grid[np.argmax(naive)] < 0.078  # tau, i.e. tau^2 ~ 0.0058
    _, local = _update_component(x2, s2, r, 10.0, 0.0, upper)
    assert local == pytest.approx(383.53, rel=1e-4)  # Newton alone: the local maximum
    for start in (0.0, 1.0, 10.0, 20.0):
        mu, tau2 = _update_component(x2, s2, r, start, 0.0, upper, exhaustive=True)
        assert tau2 == pytest.approx(0.005825746767735, rel=1e-9)
        assert -_naive_neg_profile_q(np.sqrt(tau2), x2, s2, r) >= max(naive) - 1e-12


def test_weighted_tau_update_beats_brute_force_with_several_local_maxima():
    """Responsibilities r != 1: the exhaustive update is at least the best of a fine grid."""
    rng = np.random.default_rng(22)
    for _ in range(20):
        s = np.r_[10 ** rng.uniform(-4, -1, 3), rng.uniform(5, 25, 6)]
        x = np.r_[s[:3] * rng.normal(0, 3, 3), rng.uniform(10, 40) + s[3:] * rng.normal(0, 1, 6)]
        r = rng.uniform(0.2, 1.0, size=9)
        x2, s2 = x[:, None], s**2
        upper = 2 * np.max(np.abs(x - x.mean()))
        mu, tau2 = _update_component(x2, s2, r, 10.0, 0.0, upper, exhaustive=True)
        grid = np.r_[0.0, np.geomspace(1e-6 * s2.min(), upper**2, 4001)]
        best = min(_naive_neg_profile_q(np.sqrt(t), x2, s2, r) for t in grid)
        assert _naive_neg_profile_q(np.sqrt(tau2), x2, s2, r) <= best + 1e-10 * (1 + abs(best))
        w = r / (tau2 + s2)
        np.testing.assert_allclose(mu, w @ x2 / w.sum(), rtol=1e-10)


def test_one_component_fit_is_the_global_mle_with_several_local_maxima():
    """k = 1 from the k-means start (tau^2 = 335.5): EM's M-step must not stop at the local
    maximum 383.5 (as a Newton-only update did), but reach gaussian_eb's global MLE."""
    res = gaussian_mixture_eb(TWO_PEAKS_X, TWO_PEAKS_S, 1, rng=0)
    ref = gaussian_eb(TWO_PEAKS_X, TWO_PEAKS_S)
    assert ref.log_likelihood == pytest.approx(-18.64656572632692, rel=1e-12)
    assert res.converged
    assert res.log_likelihood == pytest.approx(ref.log_likelihood, rel=1e-12)
    assert res.prior.sds[0] ** 2 == pytest.approx(ref.prior.sd**2, rel=1e-8)


# --------------------------------------------------------------------------- EM


def test_em_log_likelihood_history_is_non_decreasing():
    """Overlapping components (slow EM) from random starts: every iteration raises ll."""
    prior = GaussianMixturePrior([0.4, 0.35, 0.25], [-1.0, 0.5, 2.0], [0.6, 0.3, 0.8])
    _, _, x, s = _simulate(600, 30, prior=prior)
    for seed in range(3):
        res = gaussian_mixture_eb(x, s, 3, rng=seed, n_init=1, init="random", tol=0.0,
                                  max_iter=150)
        hist = res.log_likelihood_history
        assert res.n_iter >= 20  # a real test of monotonicity, not two steps
        assert hist.shape == (res.n_iter + 1,)
        assert np.all(np.diff(hist) >= -1e-9 * np.abs(hist[1:]))
        assert res.log_likelihood == hist[-1]


@pytest.fixture(scope="module")
def separated_fit():
    theta, labels, x, s = _simulate(1500, 40)
    return theta, labels, x, s, gaussian_mixture_eb(x, s, 3, rng=41)


def test_recovers_well_separated_mixture(separated_fit):
    """Fitted (p, mu, tau) are within Z approximate standard errors of the truth.

    With separated components the fit is close to per-component fits on known labels,
    so with m_l = m p_l clients and the worst-case s^2 = 1 (conservative):
      se(p_l) = sqrt(p_l (1 - p_l) / m), se(mu_lj) = sqrt((tau_l^2 + 1) / m_l),
      se(tau_l^2) = sqrt(2 / (d m_l)) (tau_l^2 + 1), se(tau_l) = se(tau_l^2) / (2 tau_l).
    """
    _, _, x, s, res = separated_fit
    m, d = x.shape
    assert res.converged and res.diagnostics["empty_components"] == ()
    m_l = m * TRUE_WEIGHTS
    se_p = np.sqrt(TRUE_WEIGHTS * (1 - TRUE_WEIGHTS) / m)
    se_mu = np.sqrt((TRUE_SDS**2 + 1.0) / m_l)
    se_tau = np.sqrt(2.0 / (d * m_l)) * (TRUE_SDS**2 + 1.0) / (2 * TRUE_SDS)
    # se_p ~ (0.013, 0.012, 0.010), se_mu ~ (0.041, 0.067, 0.060), se_tau ~ (0.046, 0.047, 0.10)
    # (seed 40: largest |error| / se is 1.5)
    assert np.all(np.abs(res.prior.weights - TRUE_WEIGHTS) <= Z * se_p)
    assert np.all(np.abs(res.prior.means - TRUE_MEANS) <= Z * se_mu[:, None])
    assert np.all(np.abs(res.prior.sds - TRUE_SDS) <= Z * se_tau)
    # the fitted MAP component is as good a classifier as the true prior's (error ~0.9%)
    labels = separated_fit[1]
    oracle = gaussian_mixture_posterior(x, s, TRUE_PRIOR).map_component
    assert np.mean(res.posterior.map_component != labels) <= np.mean(oracle != labels) + 0.002


def test_log_likelihood_is_correct_and_beats_truth(separated_fit):
    _, _, x, s, res = separated_fit
    fitted, _ = _naive_loglik(x, s, res.prior.weights, res.prior.means, res.prior.sds)
    truth, _ = _naive_loglik(x, s, TRUE_WEIGHTS, TRUE_MEANS, TRUE_SDS)
    assert res.log_likelihood == pytest.approx(fitted, rel=1e-12)
    assert res.log_likelihood >= truth
    # every start converged to the same optimum here
    assert max(res.diagnostics["init_log_likelihoods"]) == res.log_likelihood
    assert np.ptp(res.diagnostics["init_log_likelihoods"]) < 1e-3


def test_posterior_matches_direct_computation(separated_fit):
    _, _, x, s, res = separated_fit
    g = res.prior
    r, a, comp, mean, var = _naive_posterior(x, s, g.weights, g.means, g.sds)
    np.testing.assert_allclose(res.responsibilities, r, atol=1e-12)
    np.testing.assert_allclose(res.shrinkage, a, rtol=1e-13)
    np.testing.assert_allclose(res.posterior.component_means, comp, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.posterior.component_vars, a * s[:, None] ** 2, rtol=1e-13)
    np.testing.assert_allclose(res.posterior.mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.posterior.var, var, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(res.posterior.sd, np.sqrt(var), rtol=1e-10)
    # the known-prior function gives the same posterior
    post = gaussian_mixture_posterior(x, s, g)
    np.testing.assert_allclose(post.mean, res.posterior.mean, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(post.var, res.posterior.var, rtol=1e-13)


@pytest.mark.parametrize("d", [1, 2])
def test_known_prior_posterior_one_dimensional_and_multivariate(d):
    rng = np.random.default_rng(50 + d)
    means = rng.normal(0, 3, size=(4, d))
    prior = GaussianMixturePrior([0.1, 0.2, 0.3, 0.4], means[:, 0] if d == 1 else means,
                                 [0.0, 0.5, 1.0, 2.0])
    x, _ = prior.sample(80, rng=rng)
    s = rng.uniform(0.2, 1.5, size=80)
    post = gaussian_mixture_posterior(x, s, prior)
    r, a, comp, mean, var = _naive_posterior(x, s, prior.weights, prior.means, prior.sds)
    assert post.mean.shape == x.shape
    assert post.component_means.shape == ((80, 4) if d == 1 else (80, 4, d))
    np.testing.assert_allclose(post.weights, r, atol=1e-12)
    np.testing.assert_allclose(post.mean, mean[:, 0] if d == 1 else mean, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(post.var, var, rtol=1e-10, atol=1e-14)


def test_posterior_mean_lies_between_x_and_shrinkage_centre(separated_fit):
    """mean_i = abar_i x_i + (1 - abar_i) c_i, abar_i = sum_l r_il a_il in [0, 1],
    c_i = sum_l r_il (1 - a_il) mu_l / sum_l r_il (1 - a_il).

    (c_i is the responsibility-weighted mean of the mu_l only when the a_il agree.)
    """
    _, _, x, _, res = separated_fit
    r, a, mu = res.responsibilities, res.shrinkage, res.prior.means
    abar = np.sum(r * a, axis=1)
    c = (r * (1 - a)) @ mu / np.sum(r * (1 - a), axis=1, keepdims=True)
    assert np.all((abar >= 0) & (abar <= 1))
    np.testing.assert_allclose(res.posterior.mean, abar[:, None] * x + (1 - abar[:, None]) * c,
                               rtol=1e-10, atol=1e-10)


def test_posterior_mean_need_not_lie_between_x_and_weighted_component_means():
    """Counterexample to 'between x_i and sum_l r_il mu_l': a point mass at 0 and a wide
    component at 10, x = 5 equidistant in responsibility; the mean is pulled to ~2.5."""
    prior = GaussianMixturePrior([0.5, 0.5], [0.0, 10.0], [0.0, 100.0])
    post = gaussian_mixture_posterior([5.0], 1.0, prior)
    r = post.weights[0]
    centre = r @ prior.means
    lo, hi = sorted([5.0, centre])
    assert not lo <= post.mean[0] <= hi
    assert post.mean[0] == pytest.approx(r @ np.array([0.0, 10.0 + (1e4 / (1e4 + 1)) * -5.0]))


def test_zero_sd_prior_is_theorem5_discrete_posterior():
    rng = np.random.default_rng(60)
    atoms = np.array([[-2.0, 0.0], [1.0, 1.0], [3.0, -1.0]])
    probs = np.array([0.2, 0.5, 0.3])
    x = atoms[rng.choice(3, size=100, p=probs)] + rng.normal(0, 0.8, size=(100, 2))
    s = rng.uniform(0.3, 1.2, size=100)
    ours = gaussian_mixture_posterior(x, s, GaussianMixturePrior(probs, atoms, np.zeros(3)))
    ref = discrete_posterior(x, s, atoms, probs)
    np.testing.assert_allclose(ours.weights, ref.weights, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(ours.mean, ref.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.var, ref.var, rtol=1e-9, atol=1e-14)


def test_posterior_mean_beats_local_and_single_gaussian_on_multimodal_data(separated_fit):
    """Per-client squared errors: the mixture posterior mean beats x_i and gaussian_eb by
    more than Z standard errors of the paired per-client difference."""
    theta, _, x, s, res = separated_fit
    err = {"mixture": np.sum((res.posterior.mean - theta) ** 2, axis=1),
           "local": np.sum((x - theta) ** 2, axis=1),
           "gaussian": np.sum((gaussian_eb(x, s).posterior.mean - theta) ** 2, axis=1)}
    for other in ("local", "gaussian"):
        diff = err[other] - err["mixture"]
        se = diff.std(ddof=1) / np.sqrt(diff.size)
        assert diff.mean() > Z * se, (other, diff.mean(), se)
    # per client (2 coordinates): local 0.94 (2 E s^2 = 0.93), gaussian_eb 0.85, mixture 0.39,
    # within 2% of the Bayes risk, i.e. of the posterior mean under the true prior
    oracle = np.sum((gaussian_mixture_posterior(x, s, TRUE_PRIOR).mean - theta) ** 2, axis=1)
    assert np.mean(err["mixture"]) < 0.5 * np.mean(err["local"])
    assert np.mean(err["mixture"]) <= 1.02 * np.mean(oracle)


# --------------------------------------------------------------------------- degenerate cases


def test_empty_component_does_not_crash():
    """A start with a component no client can reach: its responsibilities underflow to 0."""
    _, _, x, s = _simulate(300, 70)
    start = GaussianMixturePrior([0.45, 0.45, 0.1], [[-4.0, 0.0], [2.0, 1.0], [1e4, 1e4]],
                                 [0.5, 1.0, 0.1])
    res = gaussian_mixture_eb(x, s, 3, init=start)
    assert res.prior.weights[2] == 0.0 and res.diagnostics["empty_components"] == (2,)
    np.testing.assert_array_equal(res.prior.means[2], [1e4, 1e4])  # kept unchanged
    assert np.all(res.responsibilities[:, 2] == 0.0)
    assert np.isfinite(res.log_likelihood) and np.all(np.isfinite(res.posterior.mean))
    assert np.all(np.diff(res.log_likelihood_history) >= -1e-9 * abs(res.log_likelihood))
    assert res.diagnostics["init"] == "prior" and res.diagnostics["n_init"] == 1
    assert 3 * 300 * EMPTY_COUNT < 1  # the threshold is far below one client


def test_zero_weight_start_and_as_many_components_as_clients():
    x = np.array([-3.0, -1.0, 0.5, 2.0, 4.0])
    res = gaussian_mixture_eb(x, 0.3, 5, rng=0)
    assert np.all(np.isfinite(res.prior.sds)) and np.all(np.isfinite(res.posterior.mean))
    assert res.prior.weights.sum() == pytest.approx(1.0)
    start = GaussianMixturePrior([0.0, 1.0], [0.0, 1.0], [1.0, 1.0])
    res = gaussian_mixture_eb(x, 0.3, 2, init=start)
    assert res.prior.weights.tolist() == [0.0, 1.0]


def test_duplicate_points_leave_extra_kmeans_components_empty():
    with pytest.warns(ConvergenceWarning, match="distinct clusters"):
        res = gaussian_mixture_eb(np.ones(5), 0.5, 2, rng=0)
    assert res.prior.weights.tolist() == [1.0, 0.0]
    assert res.diagnostics["empty_components"] == (1,) and res.prior.sds[0] == 0.0
    np.testing.assert_array_equal(res.posterior.mean, np.ones(5))


def test_min_sd_is_respected():
    _, _, x, s = _simulate(400, 80)
    res = gaussian_mixture_eb(x, s, 3, rng=0, min_sd=0.8)
    assert np.all(res.prior.sds >= 0.8)
    assert 0 in res.diagnostics["sd_at_min"] and 2 in res.diagnostics["sd_at_min"]


@pytest.mark.parametrize("scale", [1e-140, 1e140])
def test_fit_is_scale_equivariant_down_to_tiny_standard_errors(scale):
    """x -> c x, s -> c s (from the scaled start): means and sds scale by c, weights and
    responsibilities stay, the log-likelihood drops by m d log c. With s_i ~ 1e-141 the
    M-step's 1/v_i^3 would overflow unless computed in units of t + min s_i^2."""
    _, _, x, s = _simulate(300, 85)
    start = GaussianMixturePrior(TRUE_WEIGHTS, TRUE_MEANS + 0.3, TRUE_SDS * 1.5)
    scaled_start = GaussianMixturePrior(TRUE_WEIGHTS, scale * start.means, scale * start.sds)
    ref = gaussian_mixture_eb(x, s, 3, init=start)
    res = gaussian_mixture_eb(scale * x, scale * s, 3, init=scaled_start)
    assert res.converged and ref.converged
    np.testing.assert_allclose(res.prior.weights, ref.prior.weights, rtol=1e-6)
    np.testing.assert_allclose(res.prior.means, scale * ref.prior.means, rtol=1e-6)
    np.testing.assert_allclose(res.prior.sds, scale * ref.prior.sds, rtol=1e-6)
    assert res.log_likelihood == pytest.approx(ref.log_likelihood - 600 * np.log(scale),
                                               rel=1e-9)
    post = gaussian_mixture_posterior(scale * x, scale * s, res.prior)
    np.testing.assert_allclose(post.mean, scale * ref.posterior.mean, rtol=1e-5)


def test_tiny_standard_errors_and_huge_sds_are_refused_clearly():
    g = GaussianMixturePrior([1.0], [0.0], [1.0])
    with pytest.raises(ValueError, match=r"s must lie in \[1e-150, 1e\+150\].*entry 2"):
        gaussian_mixture_eb([0.0, 1.0, 2.0], [1.0, 1.0, 1e-200], 1)
    with pytest.raises(ValueError, match=r"s must lie in \[1e-150"):
        gaussian_mixture_posterior([0.0], 1e-160, g)
    with pytest.raises(ValueError, match=r"min_sd must lie in \[0, 1e\+150\]"):
        gaussian_mixture_eb([0.0, 1.0, 2.0], 1.0, 1, min_sd=1e200)


# --------------------------------------------------------------------------- prior object


@pytest.mark.parametrize("d", [1, 3])
def test_prior_logpdf_is_the_corrected_d0_regularizer(d):
    """The regularizer of (21), corrected (errata [!9]): -sum_i logpdf(theta_i)
    = -sum_i log sum_l p_l (2 pi tau_l^2)^(-d/2) exp(-|mu_l - theta_i|^2 / (2 tau_l^2))."""
    rng = np.random.default_rng(90 + d)
    means = rng.normal(size=(3, d))
    g = GaussianMixturePrior([0.2, 0.3, 0.5], means[:, 0] if d == 1 else means, [0.5, 1.0, 2.0])
    theta, _ = g.sample(50, rng=rng)
    t2 = theta if d > 1 else theta[:, None]
    dens = sum(p * (2 * np.pi * tau**2) ** (-d / 2)
               * np.exp(-np.sum((mu - t2) ** 2, axis=1) / (2 * tau**2))
               for p, mu, tau in zip(g.weights, means, g.sds, strict=True))
    assert -g.logpdf(theta).sum() == pytest.approx(-np.sum(np.log(dens)), rel=1e-12)
    with pytest.raises(ValueError, match="point mass"):
        GaussianMixturePrior([0.5, 0.5], [0.0, 1.0], [0.0, 1.0]).logpdf([0.0])


def test_prior_validation_and_frozen():
    g = GaussianMixturePrior([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [1.0, 2.0])
    assert (g.n_components, g.dim) == (2, 2)
    assert g == GaussianMixturePrior([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [1.0, 2.0])
    assert g != GaussianMixturePrior([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [1.0, 3.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.sds = np.ones(2)
    with pytest.raises(ValueError, match="read-only"):
        g.means[0, 0] = 5.0
    for args, match in [(([0.5, 0.6], [0.0, 1.0], [1.0, 1.0]), "sum to 1"),
                        (([0.5, 0.5], [0.0, 1.0], [1.0, -1.0]), r"sds must lie in \[0, 1e\+150\]"),
                        (([0.5, 0.5], [0.0, 1.0], [1.0, 1e200]), "squares must be finite"),
                        (([1.0], [1e200], [1.0]), r"means must lie in \[-1e\+150, 1e\+150\]"),
                        (([0.5, 0.5], [0.0, 1.0, 2.0], [1.0, 1.0]), "one entry per component"),
                        (([1.0], [np.nan], [1.0]), "means must be finite")]:
        with pytest.raises(ValueError, match=match):
            GaussianMixturePrior(*args)


# --------------------------------------------------------------------------- API contract


def test_result_is_frozen_and_shaped():
    _, _, x, s = _simulate(200, 100)
    res = gaussian_mixture_eb(x[:, 0], s, 2, rng=0)
    assert res.prior.means.shape == (2,) and res.posterior.mean.shape == (200,)
    assert res.responsibilities.shape == res.shrinkage.shape == (200, 2)
    assert res.posterior.var.shape == (200,) and res.n_clients == 200
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.log_likelihood = 0.0
    with pytest.raises(ValueError, match="read-only"):
        res.posterior.mean[0] = 1.0
    with pytest.raises(TypeError):
        res.diagnostics["init"] = "x"


def test_inputs_not_mutated():
    _, _, x, s = _simulate(200, 110)
    x0, s0 = x.copy(), s.copy()
    res = gaussian_mixture_eb(x, s, 3, rng=0)
    assert x.flags.writeable and s.flags.writeable  # the result froze copies, not the inputs
    assert not res.s.flags.writeable
    x.setflags(write=False)
    s.setflags(write=False)
    start = GaussianMixturePrior(TRUE_WEIGHTS, TRUE_MEANS, TRUE_SDS)
    gaussian_mixture_eb(x, s, 3, rng=0)
    gaussian_mixture_eb(x, s, 3, init=start, min_sd=0.6)
    gaussian_mixture_posterior(x, s, start)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(s, s0)
    np.testing.assert_array_equal(start.sds, TRUE_SDS)


@pytest.mark.parametrize("init", ["kmeans", "random"])
def test_reproducible_with_same_seed(init):
    _, _, x, s = _simulate(300, 120)
    a = gaussian_mixture_eb(x, s, 3, rng=7, init=init, n_init=2)
    b = gaussian_mixture_eb(x, s, 3, rng=np.random.default_rng(7), init=init, n_init=2)
    np.testing.assert_array_equal(a.prior.means, b.prior.means)
    np.testing.assert_array_equal(a.prior.sds, b.prior.sds)
    np.testing.assert_array_equal(a.log_likelihood_history, b.log_likelihood_history)
    np.testing.assert_array_equal(a.posterior.mean, b.posterior.mean)
    assert a.diagnostics == b.diagnostics


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"x": [1.0, np.nan, 2.0]}, ValueError, "x must be finite"),
    ({"x": [[[1.0]]]}, ValueError, "ndim"),
    ({"x": np.ones((3, 0))}, ValueError, "at least one coordinate"),
    ({"s": [1.0, 0.0, 1.0]}, ValueError, r"s must be > 0.*entry 1"),
    ({"s": -1.0}, ValueError, r"s must be > 0"),
    ({"s": [1.0, np.inf, 1.0]}, ValueError, "s must be finite"),
    ({"s": [1.0, 1.0]}, ValueError, r"s must be a scalar or have shape \(3,\)"),
    ({"n_components": 0}, ValueError, "n_components must be an integer >= 1"),
    ({"n_components": 4}, ValueError, "n_components must be <= the number of clients 3"),
    ({"n_components": 1.5}, TypeError, "n_components"),
    ({"n_init": 0}, ValueError, "n_init"),
    ({"max_iter": 0}, ValueError, "max_iter"),
    ({"tol": -1.0}, ValueError, "tol"),
    ({"min_sd": -0.1}, ValueError, "min_sd"),
    ({"min_sd": np.nan}, ValueError, "min_sd"),
    ({"init": "em"}, ValueError, "init must be one of"),
    ({"init": 3}, TypeError, "init must be one of"),
    ({"init": GaussianMixturePrior([1.0], [0.0], [1.0])}, ValueError, "n_components=2"),
    ({"init": GaussianMixturePrior([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [1.0, 1.0])},
     ValueError, "dimension d=1"),
    ({"rng": np.random.RandomState(0)}, TypeError, "RandomState"),
])
def test_bad_input(kwargs, error, match):
    args = {"x": [0.0, 1.0, 2.0], "s": 1.0, "n_components": 2, **kwargs}
    with pytest.raises(error, match=match):
        gaussian_mixture_eb(args.pop("x"), args.pop("s"), args.pop("n_components"), **args)


def test_bad_input_posterior():
    g = GaussianMixturePrior([1.0], [0.0], [1.0])
    with pytest.raises(TypeError, match="GaussianMixturePrior"):
        gaussian_mixture_posterior([0.0], 1.0, {"weights": [1.0]})
    with pytest.raises(ValueError, match="dimension d=2"):
        gaussian_mixture_posterior([[0.0, 1.0]], 1.0, g)
    with pytest.raises(ValueError, match=r"s must be > 0"):
        gaussian_mixture_posterior([0.0], 0.0, g)
