"""Personalized federated regression (ebfl.learning): Theorem 6, Algorithms 2 and 3, EM, FedAvg."""

import math

import numpy as np
import pytest
from scipy import optimize

from ebfl.federated import RunConfig, run, sample_clients
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
    fit = run_federated(alg, data, 8000, record_every=8000)
    state = {**fit.server, **fit.clients}

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
    def loglik(server, clients):
        return {"loglik": marginal_loglik(data, server["mu"], server["sigma_theta2"],
                                          server["sigma_x2"])}

    values = [h["loglik"] for h in run(LinearEM(), data, RunConfig(40, 40),
                                        monitor=loglik).history]
    assert len(values) == 40 and np.all(np.diff(values) >= -1e-9)
    # The fixed point is the maximizer: compare with scipy on (mu, log variances).
    def negll(v):
        return -marginal_loglik(data, v[:3], math.exp(v[3]), math.exp(v[4]))

    opt = optimize.minimize(negll, np.zeros(5), method="L-BFGS-B")
    final = res.server
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
    np.testing.assert_allclose(res.theta, central, atol=1e-10)
    # Fine-tuning from the global model moves every client towards its own fit.
    tuned = finetune_linear(data, res.theta, 50, 0.1)
    own = local_least_squares(data)
    assert np.all(np.sum((tuned - own) ** 2, 1) <= np.sum((res.theta - own) ** 2, 1))


# --------------------------------------------------------------------- core

def test_sampling_schemes_draw_the_clients_of_the_federated_protocol():
    data, _, _ = _linear_problem(100, 3, 2, seed=0)
    full = run_federated(LinearEM(), data, 3)
    assert [h["replies"] for h in full.history] == [100] * 3
    fixed = run_federated(LinearEM(), data, 3, sampling="fixed", clients_per_round=10, seed=4)
    assert [h["replies"] for h in fixed.history] == [10] * 3
    # The clients of round r are the protocol's sample for (seed, r): the runtimes agree.
    config = RunConfig(100, 3, seed=4, clients_per_round=10)
    seen = np.zeros(100, bool)
    for r in range(3):
        seen[sample_clients(config, r)] = True
    np.testing.assert_array_equal(fixed.server["seen"], seen)
    poisson = run_federated(LinearEM(), data, 200, sampling="poisson", clients_per_round=10,
                            seed=1)
    sizes = np.array([h["replies"] for h in poisson.history])
    assert abs(sizes.mean() - 10) <= Z * math.sqrt(100 * 0.1 * 0.9 / 200)
    with pytest.raises(ValueError, match="clients_per_round"):
        run_federated(LinearEM(), data, 1, sampling="fixed", clients_per_round=101)
    with pytest.raises(ValueError, match="sampling"):
        run_federated(LinearEM(), data, 1, sampling="some")


def test_runs_are_reproducible_and_record_mse():
    data, theta, _ = _linear_problem(50, 4, 3, seed=5)
    kw = dict(sampling="fixed", clients_per_round=10, seed=7, truth=theta)
    a = run_federated(LinearGD(0.01, lr_var=1e-3), data, 30, **kw)
    b = run_federated(LinearGD(0.01, lr_var=1e-3), data, 30, **kw)
    np.testing.assert_array_equal(a.theta, b.theta)
    assert len(a.history) == 30 and "mse" in a.history[-1]
    assert a.history_frame().shape[0] == 30


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
    res = run_federated(DiscreteMixtureLinear(3, 0.25), data, 10, truth=theta)
    got = res.server["atoms"][np.argsort(res.server["atoms"][:, 0])]
    np.testing.assert_allclose(got, atoms, atol=0.05)
    probs = res.server["probs"][np.argsort(res.server["atoms"][:, 0])]
    np.testing.assert_allclose(probs, np.bincount(labels) / 300, atol=0.02)
    local_mse = np.mean(np.sum((local_least_squares(data) - theta) ** 2, 1))
    assert res.history[-1]["mse"] < local_mse / 10


def test_algorithm4_beats_local_with_a_clustered_population():
    from ebfl.learning.population_models import GaussianMixtureLinear

    data, theta, atoms, _ = _mixture_problem(1, spread=0.2)
    res = run_federated(GaussianMixtureLinear(3, 0.01, 0.25), data, 200, truth=theta)
    got = res.server["atoms"][np.argsort(res.server["atoms"][:, 0])]
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
    one = run_federated(alg, data, 1)
    np.testing.assert_allclose(one.server["mu"], np.median(one.theta, axis=0))
    assert one.server["b"] == pytest.approx(np.mean(np.abs(one.theta - one.server["mu"])))
    # ...and iterating it collapses b like sigma_theta^2 in Algorithm 2: the joint MAP
    # over (theta, mu, b) is unbounded below (errata [!10]); b stops at the floor.
    assert run_federated(alg, data, 200).server["b"] == alg.floor


# ------------------------------------------------ the algorithms as protocol halves

def _protocol_cases():
    from ebfl.learning import (
        DiscreteMixtureLinear,
        FedAvgLogistic,
        GaussianMixtureLinear,
        LaplaceLinear,
        LogisticEM,
    )

    return {"LinearGD": (LinearGD(0.01, lr_var=1e-3, local_steps=2), "linear"),
            "LinearEM": (LinearEM(), "linear"),
            "LogisticGD": (LogisticGD(0.05, lr_var=1e-3), "logistic"),
            "LogisticEM": (LogisticEM(), "logistic"),
            "FedAvgLinear": (FedAvgLinear(0.1, local_steps=3), "linear"),
            "FedAvgLogistic": (FedAvgLogistic(0.5, local_steps=2, l2=0.01), "logistic"),
            "DiscreteMixtureLinear": (DiscreteMixtureLinear(2, 0.09), "linear"),
            "GaussianMixtureLinear": (GaussianMixtureLinear(2, 0.01, 0.09), "linear"),
            "LaplaceLinear": (LaplaceLinear(0.01, 0.09), "linear")}


def _ragged_problem(kind, seed=11):
    """24 clients of 3 to 9 examples (ragged), d = 3."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0, 1, 3) + 0.5 * rng.standard_normal((24, 3))
    sizes = 3 + np.arange(24) % 7
    Xs = [rng.standard_normal((k, 3)) for k in sizes]
    if kind == "linear":
        Ys = [x @ t + 0.3 * rng.standard_normal(len(x)) for x, t in zip(Xs, theta, strict=True)]
    else:
        Ys = [(rng.random(len(x)) < 1 / (1 + np.exp(-x @ t))).astype(float)
              for x, t in zip(Xs, theta, strict=True)]
    return RegressionData.from_lists(Xs, Ys), theta


@pytest.mark.parametrize("name", sorted(_protocol_cases()))
@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_each_client_alone_gives_the_vectorized_run(name, sampling):
    """What the Flower runtime does (each client alone, its own copy of every message)
    gives the result of the in-process run: the client half couples no two clients."""
    from tests.test_federated import drive_one_client_at_a_time

    algorithm, kind = _protocol_cases()[name]
    data, _ = _ragged_problem(kind)
    fit = run_federated(algorithm, data, 6, sampling=sampling, clients_per_round=8, seed=3)
    config = RunConfig(24, 6, seed=3, clients_per_round=8, sampling=sampling)
    server, clients, metrics = drive_one_client_at_a_time(algorithm, data, config)
    theta = algorithm.personal(server, clients)
    np.testing.assert_allclose(theta, fit.theta, rtol=1e-12, atol=1e-12)
    assert set(server) == set(fit.server)
    for key, value in server.items():
        np.testing.assert_allclose(np.asarray(value, float), np.asarray(fit.server[key], float),
                                   rtol=1e-12, atol=1e-12, err_msg=key)
    np.testing.assert_allclose(metrics["train_loss"].mean(), fit.history[-1]["train_loss"],
                               rtol=1e-12)


@pytest.mark.parametrize("name", ["LinearEM", "DiscreteMixtureLinear", "LaplaceLinear"])
def test_a_regression_run_resumes_from_its_checkpoint_to_the_same_result(name, tmp_path):
    algorithm, kind = _protocol_cases()[name]
    data, theta = _ragged_problem(kind)
    kw = dict(sampling="fixed", clients_per_round=8, seed=5, truth=theta, record_every=2)
    full = run_federated(algorithm, data, 8, **kw)
    path = tmp_path / "run.ckpt"
    run_federated(algorithm, data, 4, checkpoint=path, **kw)
    resumed = run_federated(algorithm, data, 8, checkpoint=path, **kw)
    np.testing.assert_array_equal(resumed.theta, full.theta)
    assert [h["mse"] for h in resumed.history] == [h["mse"] for h in full.history]
    # Another algorithm's checkpoint is refused, not continued.
    with pytest.raises(ValueError, match="checkpoint"):
        run_federated(LinearGD(0.5), data, 8, checkpoint=path, **kw)


def test_the_clustering_algorithms_wait_for_k_clients_before_clustering():
    from ebfl.learning import DiscreteMixtureLinear

    data, _ = _ragged_problem("linear")
    # 2 clients a round, 5 atoms: the server clusters from the third round on.
    fit = run_federated(DiscreteMixtureLinear(5, 0.09), data, 3, sampling="fixed",
                        clients_per_round=2, seed=0)
    assert [("probs" in h) for h in fit.history] == [False, False, True]
    assert fit.history[0]["bytes_down"] == 0  # nothing to broadcast yet
    with pytest.raises(ValueError, match="k must be <= the number of clients"):
        run_federated(DiscreteMixtureLinear(25, 0.09), data, 1)


def test_the_runtime_monitor_sees_every_state_and_must_return_a_dict():
    data, _ = _ragged_problem("linear")
    seen = []

    def monitor(server, clients):
        seen.append(clients["theta"].shape)
        return {"n_models": len(clients["theta"])}

    out = run(LinearEM(), data, RunConfig(24, 4, eval_every=2), monitor=monitor)
    assert seen == [(24, 3)] * 2 and [h["n_models"] for h in out.history] == [24, 24]
    with pytest.raises(TypeError, match="monitor must return a dict"):
        run(LinearEM(), data, RunConfig(24, 1), monitor=lambda s, c: 1.0)
    with pytest.raises(TypeError, match="monitor must be a callable"):
        run(LinearEM(), data, RunConfig(24, 1), monitor="mse")
