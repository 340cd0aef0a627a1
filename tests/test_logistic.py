"""Personalized logistic regression: client MAPs, Laplace EM, FedAvg and fine-tuning."""

import math

import numpy as np
import pytest
from scipy import optimize, special
from sklearn.linear_model import LogisticRegression

from ebfl.learning import (
    FedAvgLogistic,
    LogisticEM,
    RegressionData,
    finetune_logistic,
    logistic_map,
    run_federated,
)


def _population(m, n, d, seed, s2=0.25, ragged=False):
    rng = np.random.default_rng(seed)
    mu = rng.normal(0, 0.5, d)
    theta = mu + math.sqrt(s2) * rng.standard_normal((m, d))
    X = rng.standard_normal((m, n, d))
    X[..., 0] = 1.0
    p = special.expit(np.einsum("mnd,md->mn", X, theta))
    Y = (rng.random((m, n)) < p).astype(float)
    if ragged:  # clients of sizes n/2 .. n
        sizes = n // 2 + np.arange(m) % (n // 2 + 1)
        return RegressionData.from_lists([X[i, :k] for i, k in enumerate(sizes)],
                                         [Y[i, :k] for i, k in enumerate(sizes)]), theta, mu
    return RegressionData.from_arrays(X, Y), theta, mu


def _client_rows(data, i):
    k = int(data.n_samples[i])
    return data.X[i, :k], data.Y[i, :k]


def test_logistic_map_with_zero_mean_prior_is_sklearn_ridge_logistic():
    data, _, _ = _population(12, 40, 4, seed=1, ragged=True)
    for C in (0.1, 1.0, 10.0):
        theta, _ = logistic_map(data, 0.0, C)
        for i in range(data.n_clients):
            X, Y = _client_rows(data, i)
            ref = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=10_000)
            ref.fit(X, Y)
            np.testing.assert_allclose(theta[i], ref.coef_[0], atol=1e-6)


def test_logistic_map_and_its_laplace_trace_match_scipy_per_client():
    data, _, _ = _population(6, 30, 3, seed=2, ragged=True)
    mu, s = np.array([0.3, -0.2, 0.5]), 0.4
    theta, trace = logistic_map(data, mu, s)
    for i in range(data.n_clients):
        X, Y = _client_rows(data, i)

        def loss(t, X=X, Y=Y):
            z = X @ t
            return np.sum(np.logaddexp(0, z) - Y * z) + np.sum((t - mu) ** 2) / (2 * s)

        ref = optimize.minimize(loss, mu, method="BFGS", options={"gtol": 1e-10})
        np.testing.assert_allclose(theta[i], ref.x, atol=1e-6)
        p = special.expit(X @ ref.x)
        hess = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(3) / s
        assert trace[i] == pytest.approx(np.trace(np.linalg.inv(hess)), rel=1e-6)


def test_logistic_em_round_is_map_then_closed_form_m_step():
    data, _, _ = _population(25, 30, 3, seed=3)
    alg = LogisticEM(newton_steps=50, sigma_theta2_0=0.7, mu0=[0.1, 0.0, -0.1])
    new = run_federated(alg, data, 1)
    theta, trace = logistic_map(data, [0.1, 0.0, -0.1], 0.7)  # the E-step, computed separately
    mu = theta.mean(axis=0)
    np.testing.assert_allclose(new.theta, theta, atol=1e-9)
    np.testing.assert_allclose(new.server["mu"], mu, atol=1e-9)
    assert new.server["sigma_theta2"] == pytest.approx(
        np.mean(np.sum((theta - mu) ** 2, axis=1) + trace) / 3, rel=1e-9)


def test_logistic_em_beats_local_and_global_models():
    data, theta, _ = _population(600, 40, 3, seed=4)
    em = run_federated(LogisticEM(), data, 30, truth=theta)
    local, _ = logistic_map(data, 0.0, 1e6)  # (nearly) unpenalized per-client MLE
    glob = run_federated(FedAvgLogistic(1.0, local_steps=1), data, 300).theta
    err_em = np.sum((em.theta - theta) ** 2, axis=1)
    for other in (local, np.tile(glob, (600, 1))):
        diff = np.sum((other - theta) ** 2, axis=1) - err_em
        assert diff.mean() > 4 * diff.std(ddof=1) / math.sqrt(diff.size)
    assert em.history[-1]["mse"] == pytest.approx(err_em.mean())


def test_partial_participation_keeps_the_latest_statistics():
    data, _, _ = _population(40, 20, 2, seed=5)
    res = run_federated(LogisticEM(), data, 6, sampling="fixed", clients_per_round=10, seed=7)
    again = run_federated(LogisticEM(), data, 6, sampling="fixed", clients_per_round=10, seed=7)
    np.testing.assert_array_equal(res.theta, again.theta)
    seen = res.server["seen"]
    assert 10 <= seen.sum() < 40
    np.testing.assert_allclose(res.server["mu"], res.server["theta"][seen].mean(axis=0))
    # The server's copies are the latest models of the clients it heard from.
    np.testing.assert_array_equal(res.server["theta"][seen], res.theta[seen])


def test_fedavg_logistic_on_one_step_matches_centralized_ridge_logistic():
    data, _, _ = _population(20, 30, 3, seed=6, ragged=True)
    l2 = 0.05
    res = run_federated(FedAvgLogistic(2.0, local_steps=1, l2=l2), data, 3000)
    N = data.n_samples.sum()
    X = np.concatenate([_client_rows(data, i)[0] for i in range(data.n_clients)])
    Y = np.concatenate([_client_rows(data, i)[1] for i in range(data.n_clients)])
    # FedAvg with one local step is GD on (1/N) sum CE + l2/2 |w|^2 = sklearn with C = 1/(l2 N).
    ref = LogisticRegression(C=1 / (l2 * N), fit_intercept=False, tol=1e-12, max_iter=10_000)
    ref.fit(X, Y)
    np.testing.assert_allclose(res.theta, ref.coef_[0], atol=1e-6)


def test_finetune_logistic_descends_every_clients_loss():
    data, _, _ = _population(15, 30, 3, seed=8)
    w = np.array([0.2, -0.1, 0.0])

    def losses(theta):
        z = data.predict(theta)
        return np.sum((np.logaddexp(0, z) - data.Y * z) * data.mask, axis=1)

    np.testing.assert_array_equal(finetune_logistic(data, w, 0, 0.1), np.tile(w, (15, 1)))
    one, ten = finetune_logistic(data, w, 1, 0.5), finetune_logistic(data, w, 10, 0.5)
    before = losses(np.tile(w, (15, 1)))
    assert np.all(losses(one) < before) and np.all(losses(ten) < losses(one))


def test_bad_input():
    data, _, _ = _population(5, 10, 2, seed=9)
    with pytest.raises(ValueError, match=r"Y in \{0, 1\}"):
        logistic_map(RegressionData(data.X, data.Y * 2, data.mask), 0.0, 1.0)
    with pytest.raises(ValueError, match="sigma_theta2"):
        logistic_map(data, 0.0, 0.0)
    with pytest.raises(ValueError, match="mu"):
        logistic_map(data, [0.0, 1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="mu"):
        logistic_map(data, [np.nan, 1.0], 1.0)
    with pytest.raises(TypeError, match="RegressionData"):
        logistic_map(data.X, 0.0, 1.0)
    with pytest.raises(ValueError, match="newton_steps"):
        LogisticEM(newton_steps=0)
    with pytest.raises(ValueError, match=r"Y in \{0, 1\}"):
        run_federated(LogisticEM(), RegressionData(data.X, data.Y + 0.5, data.mask), 1)
    with pytest.raises(ValueError, match="l2"):
        FedAvgLogistic(0.1, l2=-1.0)
