"""Personalized federated regression (ebfl.learning): Theorem 6, Algorithms 2 and 3, EM, FedAvg."""

import math

import numpy as np
import pytest
from scipy import optimize

from ebfl.learning import (
    FedAvgLinear,
    LinearEM,
    LinearGD,
    LogisticGD,
    RegressionData,
    finetune_linear,
    linear_objective,
    local_least_squares,
    logistic_objective,
    marginal_loglik,
    posterior_regression,
    run_federated,
    sample_clients,
)

Z = 4.0


def _linear_problem(m, n, d, seed, sigma_theta=0.5, sigma_x=0.3):
    rng = np.random.default_rng(seed)
    mu = rng.normal(0, 1, d)
    theta = mu + sigma_theta * rng.standard_normal((m, d))
    X = rng.standard_normal((m, n, d))
    Y = np.einsum("mnd,md->mn", X, theta) + sigma_x * rng.standard_normal((m, n))
    return RegressionData.from_arrays(X, Y), theta, mu


# ---------------------------------------------------------------- Theorem 6

@pytest.mark.parametrize("n, d", [(3, 6), (8, 4)])
def test_posterior_forms_match_a_per_client_inverse(n, d):
    data, _, mu = _linear_problem(7, n, d, seed=n)
    st, sx = 0.3, 0.2
    for form in ("n", "d"):
        theta, risk = posterior_regression(data, mu, st, sx, form=form)
        for i in range(7):
            M = np.eye(d) / st + data.X[i].T @ data.X[i] / sx
            ref = np.linalg.inv(M) @ (data.X[i].T @ data.Y[i] / sx + mu / st)
            np.testing.assert_allclose(theta[i], ref, rtol=1e-10, atol=1e-12)
            assert risk[i] == pytest.approx(np.trace(np.linalg.inv(M)), rel=1e-10)


def test_theorem6_risks_by_monte_carlo_for_a_fixed_design():
    """(16) and (18): resample theta_i and w_i for one fixed X_i (n >= d)."""
    rng = np.random.default_rng(0)
    n, d, st, sx, draws = 12, 4, 0.5, 0.8, 40_000
    X = rng.standard_normal((n, d))
    mu = np.linspace(-1, 1, d)
    theta = mu + math.sqrt(st) * rng.standard_normal((draws, d))
    Y = theta @ X.T + math.sqrt(sx) * rng.standard_normal((draws, n))
    data = RegressionData.from_arrays(np.broadcast_to(X, (draws, n, d)), Y)
    post, risk = posterior_regression(data, mu, st, sx)
    local, local_risk = local_least_squares(data, sx)
    for est, formula in ((post, risk[0]), (local, local_risk[0])):
        err = np.sum((est - theta) ** 2, axis=1)
        assert abs(err.mean() - formula) <= Z * err.std(ddof=1) / math.sqrt(draws)


def test_local_least_squares_pseudo_inverse_and_undefined_risk():
    data, _, _ = _linear_problem(5, 3, 6, seed=1)  # n < d: X^T X singular
    theta, risk = local_least_squares(data, 0.1)
    for i in range(5):
        ref = np.linalg.lstsq(data.X[i], data.Y[i], rcond=None)[0]  # minimum norm
        np.testing.assert_allclose(theta[i], ref, atol=1e-10)
    assert np.all(np.isnan(risk))


def test_marginal_loglik_matches_a_dense_gaussian():
    from scipy import stats

    data, _, mu = _linear_problem(4, 5, 3, seed=2)
    st, sx = 0.4, 0.3
    ref = sum(stats.multivariate_normal(data.X[i] @ mu, st * data.X[i] @ data.X[i].T
                                        + sx * np.eye(5)).logpdf(data.Y[i]) for i in range(4))
    assert marginal_loglik(data, mu, st, sx) == pytest.approx(ref, rel=1e-12)
    # Padding does not change it.
    padded = RegressionData.from_lists([data.X[0], data.X[1][:2]], [data.Y[0], data.Y[1][:2]])
    two = (RegressionData.from_arrays(data.X[:1], data.Y[:1]),
           RegressionData.from_arrays(data.X[1:2, :2], data.Y[1:2, :2]))
    assert marginal_loglik(padded, mu, st, sx) == pytest.approx(
        sum(marginal_loglik(p, mu, st, sx) for p in two), rel=1e-12)


# --------------------------------------------------------------- Algorithm 2

@pytest.mark.parametrize("local_steps, part", [(1, "all"), (3, "some")])
def test_gd_kernel_matches_numpy(local_steps, part):
    from ebfl.learning._kernels import _linear_gd_clients
    from tests.naive import naive_linear_gd_clients

    data = RegressionData.from_lists(
        [np.random.default_rng(i).standard_normal((3 + i % 4, 5)) for i in range(30)],
        [np.random.default_rng(100 + i).standard_normal(3 + i % 4) for i in range(30)])
    rng = np.random.default_rng(0)
    theta = rng.standard_normal((30, 5))
    active = np.arange(30) if part == "all" else np.array([2, 7, 8, 29])
    args = (data.X, data.Y, data.mask, theta, active, rng.standard_normal(5), 0.7, 0.4, 0.05,
            local_steps)
    for got, ref in zip(_linear_gd_clients(*args), naive_linear_gd_clients(*args),
                        strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


def test_algorithm2_converges_to_the_map_found_by_scipy():
    data, _, _ = _linear_problem(20, 30, 2, seed=1)
    m, d = 20, 2
    alg = LinearGD(lr=0.002, lr_var=2e-4, sigma_theta2_0=0.5, sigma_x2_0=0.5)
    state = run_federated(alg, data, 8000, record_every=8000).state

    def objective(v):
        return linear_objective(data, v[:m * d].reshape(m, d), v[m * d:m * d + d],
                                math.exp(v[-2]), math.exp(v[-1]))

    v0 = np.concatenate([np.zeros(m * d + d), [math.log(0.5), math.log(0.5)]])
    res = optimize.minimize(objective, v0, method="L-BFGS-B",
                            options={"maxiter": 20_000, "maxfun": 10**6, "ftol": 1e-15,
                                     "gtol": 1e-10})
    np.testing.assert_allclose(state["theta"], res.x[:m * d].reshape(m, d), atol=1e-5)
    np.testing.assert_allclose(state["mu"], res.x[m * d:m * d + d], atol=1e-5)
    assert state["sigma_theta2"] == pytest.approx(math.exp(res.x[-2]), rel=1e-4)
    assert state["sigma_x2"] == pytest.approx(math.exp(res.x[-1]), rel=1e-4)


def test_em_increases_the_marginal_likelihood_and_reaches_its_maximum():
    data, _, _ = _linear_problem(40, 6, 3, seed=3)
    res = run_federated(LinearEM(), data, 300, record_every=1)
    st = [h["sigma_theta2"] for h in res.history]
    assert st[-1] > 0
    # Monotone in the marginal likelihood (recomputed from the logged parameters).
    alg = LinearEM()
    state = alg.init(data, None)
    values = []
    for _ in range(40):
        values.append(marginal_loglik(data, state["mu"], state["sigma_theta2"],
                                      state["sigma_x2"]))
        state = alg.round(state, data, np.arange(40), None)
    assert np.all(np.diff(values) >= -1e-9)
    # The fixed point is the maximizer: compare with scipy on (mu, log variances).
    def negll(v):
        return -marginal_loglik(data, v[:3], math.exp(v[3]), math.exp(v[4]))

    opt = optimize.minimize(negll, np.zeros(5), method="L-BFGS-B")
    final = res.state
    assert marginal_loglik(data, final["mu"], final["sigma_theta2"],
                           final["sigma_x2"]) == pytest.approx(-opt.fun, abs=1e-4)


# --------------------------------------------------------------- Algorithm 3

def _logistic_problem(seed):
    rng = np.random.default_rng(seed)
    m, n, d = 30, 20, 3
    mu = np.array([1.0, -1.0, 0.5])
    theta = mu + 0.5 * rng.standard_normal((m, d))
    X = rng.standard_normal((m, n, d))
    Y = (rng.random((m, n)) < 1 / (1 + np.exp(-np.einsum("mnd,md->mn", X, theta)))) * 1.0
    return RegressionData.from_arrays(X, Y)


def test_algorithm3_fixed_rule_decreases_objective_printed_rule_does_not():
    data = _logistic_problem(0)
    curves = {}
    for rule in ("fixed", "printed"):
        alg = LogisticGD(0.01, rule=rule, lr_var=0.001, sigma_theta2_0=1.0)
        res = run_federated(alg, data, 300)
        curves[rule] = np.array([h["objective"] for h in res.history])
    assert np.all(np.diff(curves["fixed"]) <= 1e-9)
    assert np.any(np.diff(curves["printed"]) > 0)
    assert curves["printed"][-1] > curves["fixed"][-1]


def test_logistic_objective_matches_a_direct_formula():
    data = _logistic_problem(1)
    theta = np.full((30, 3), 0.2)
    p = 1 / (1 + np.exp(-np.einsum("mnd,md->mn", data.X, theta)))
    ce = -np.sum(data.Y * np.log(p) + (1 - data.Y) * np.log(1 - p))
    ref = ce + 0.5 * 30 * 3 * math.log(2 * math.pi * 0.7) + np.sum((theta - 0.1) ** 2) / 1.4
    assert logistic_objective(data, theta, np.full(3, 0.1), 0.7) == pytest.approx(ref)


# ------------------------------------------------------------------- FedAvg

def test_fedavg_on_iid_clients_matches_centralized_least_squares():
    rng = np.random.default_rng(4)
    w_true = np.array([1.0, -2.0, 0.5])
    X = rng.standard_normal((25, 8, 3))
    Y = X @ w_true + 0.1 * rng.standard_normal((25, 8))
    data = RegressionData.from_arrays(X, Y)
    res = run_federated(FedAvgLinear(lr=0.3, local_steps=1), data, 400)
    central = np.linalg.lstsq(X.reshape(-1, 3), Y.ravel(), rcond=None)[0]
    np.testing.assert_allclose(res.state["w"], central, atol=1e-10)
    # Fine-tuning from the global model moves every client towards its own fit.
    tuned = finetune_linear(data, res.state["w"], 50, 0.1)
    own = local_least_squares(data)
    assert np.all(np.sum((tuned - own) ** 2, 1) <= np.sum((res.state["w"] - own) ** 2, 1))


# --------------------------------------------------------------------- core

def test_sampling_schemes():
    rng = np.random.default_rng(0)
    assert sample_clients(5, rng).tolist() == [0, 1, 2, 3, 4]
    fixed = sample_clients(100, rng, "fixed", clients_per_round=10)
    assert fixed.size == 10 and np.unique(fixed).size == 10
    sizes = [sample_clients(1000, rng, "poisson", rate=0.1).size for _ in range(200)]
    assert abs(np.mean(sizes) - 100) <= Z * math.sqrt(1000 * 0.1 * 0.9 / 200)
    with pytest.raises(ValueError, match="clients_per_round"):
        sample_clients(5, rng, "fixed", clients_per_round=6)
    with pytest.raises(ValueError, match="sampling"):
        sample_clients(5, rng, "some")


def test_runs_are_reproducible_and_record_mse():
    data, theta, _ = _linear_problem(50, 4, 3, seed=5)
    kw = dict(sampling="fixed", clients_per_round=10, rng=7, truth=theta)
    a = run_federated(LinearGD(0.01, lr_var=1e-3), data, 30, **kw)
    b = run_federated(LinearGD(0.01, lr_var=1e-3), data, 30, **kw)
    np.testing.assert_array_equal(a.theta, b.theta)
    assert len(a.history) == 31 and "mse" in a.history[-1]
    assert a.history_frame().shape[0] == 31


def test_bad_input():
    with pytest.raises(ValueError, match="disagree"):
        RegressionData.from_arrays(np.zeros((2, 3, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="X"):
        RegressionData.from_arrays(np.full((2, 3, 4), np.nan), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="at least one sample"):
        RegressionData(np.zeros((2, 3, 4)), np.zeros((2, 3)), np.array([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="rule"):
        LogisticGD(0.1, rule="sometimes")
    with pytest.raises(ValueError, match="lr"):
        LinearGD(0.0)
    data, _, _ = _linear_problem(3, 4, 2, seed=0)
    with pytest.raises(ValueError, match="mu"):
        posterior_regression(data, np.zeros(5), 1.0, 1.0)
    with pytest.raises(ValueError, match="sigma_x2"):
        posterior_regression(data, 0.0, 1.0, -1.0)


# -------------------------------------------------- other population models

def _mixture_problem(seed, spread=0.0):
    rng = np.random.default_rng(seed)
    atoms = np.array([[-2.0, 0.0], [0.0, 2.0], [2.0, -1.0]])
    labels = rng.choice(3, size=300, p=[0.5, 0.3, 0.2])
    theta = atoms[labels] + spread * rng.standard_normal((300, 2))
    X = rng.standard_normal((300, 20, 2))
    Y = np.einsum("mnd,md->mn", X, theta) + 0.5 * rng.standard_normal((300, 20))
    return RegressionData.from_arrays(X, Y), theta, atoms, labels


def test_algorithm7_recovers_the_atoms():
    from ebfl.learning.population_models import DiscreteMixtureLinear

    data, theta, atoms, labels = _mixture_problem(0)
    res = run_federated(DiscreteMixtureLinear(3, 0.25), data, 10, rng=0, truth=theta)
    got = res.state["atoms"][np.argsort(res.state["atoms"][:, 0])]
    np.testing.assert_allclose(got, atoms, atol=0.05)
    probs = res.state["probs"][np.argsort(res.state["atoms"][:, 0])]
    np.testing.assert_allclose(probs, np.bincount(labels) / 300, atol=0.02)
    local_mse = np.mean(np.sum((local_least_squares(data) - theta) ** 2, 1))
    assert res.history[-1]["mse"] < local_mse / 10


def test_algorithm4_beats_local_with_a_clustered_population():
    from ebfl.learning.population_models import GaussianMixtureLinear

    data, theta, atoms, _ = _mixture_problem(1, spread=0.2)
    res = run_federated(GaussianMixtureLinear(3, 0.01, 0.25), data, 200, rng=0, truth=theta)
    got = res.state["atoms"][np.argsort(res.state["atoms"][:, 0])]
    np.testing.assert_allclose(got, atoms, atol=0.1)
    local_mse = np.mean(np.sum((local_least_squares(data) - theta) ** 2, 1))
    # n = 20 already pins theta_i well (local MSE ~ 2 x 0.25/20); the prior still helps.
    assert res.history[-1]["mse"] < 0.9 * local_mse


def test_laplace_prox_step_solves_the_lasso_and_prior_is_median():
    from sklearn.linear_model import Lasso

    from ebfl.learning.population_models import LaplaceLinear

    rng = np.random.default_rng(2)
    X = rng.standard_normal((3, 15, 4))
    Y = rng.standard_normal((3, 15))
    data = RegressionData.from_arrays(X, Y)
    mu, b, sx = np.array([0.1, -0.2, 0.0, 0.3]), 0.5, 1.0
    res = run_federated(LaplaceLinear(0.01, sx, learn_prior=False, mu0=mu, b0=b), data, 5000)
    for i in range(3):
        # min |Y - X theta|^2/(2 sx) + |theta - mu|_1 / b  ==  Lasso in beta = theta - mu.
        lasso = Lasso(alpha=sx / (15 * b), fit_intercept=False, tol=1e-12, max_iter=100_000)
        lasso.fit(X[i], Y[i] - X[i] @ mu)
        np.testing.assert_allclose(res.theta[i], mu + lasso.coef_, atol=1e-6)
    # The server's update is the block minimizer of the current models (Algorithm 2)...
    alg = LaplaceLinear(0.01, sx)
    one = alg.round(alg.init(data, None), data, np.arange(3), None)
    np.testing.assert_allclose(one["mu"], np.median(one["theta"], axis=0))
    assert one["b"] == pytest.approx(np.mean(np.abs(one["theta"] - one["mu"])))
    # ...and iterating it collapses b like sigma_theta^2 in Algorithm 2: the joint MAP
    # over (theta, mu, b) is unbounded below (errata [!10]); b stops at the floor.
    assert run_federated(alg, data, 200).state["b"] == alg.floor
