"""DP-PFL on the federated protocol (ebfl.dppfl.federated) against fit_dppfl.

One protocol round is one global iteration of Algorithm 1, so K H rounds in
process must give fit_dppfl's V, Omega and dual variables (to 1e-12: only the
rounding of W = Omega V / (2 lambda) differs), without and with privacy,
device variability and dropping; the halves driven one device at a time (as
Flower runs them) must give the stacked run's arrays; dropped and failed
devices must leave the server's sums alone.
"""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from ebfl.dppfl import algorithm as dppfl_algorithm
from ebfl.dppfl.accounting import CalibrationConditionWarning
from ebfl.dppfl.algorithm import PrivacySetting, exchangeable_omega, fit_dppfl
from ebfl.dppfl.data import DeviceData, l2_normalize
from ebfl.dppfl.federated import DPPFL
from ebfl.dppfl.objective import loss_values
from ebfl.federated import RunConfig, run
from ebfl.federated.protocol import RoundContext
from ebfl.federated.tree import flatten
from ebfl.flower.jobs import build_job
from tests.test_federated_eb import one_at_a_time

LAM, XI, K, H, SEED = 0.05, 0.5, 6, 3, 11
#: The two implementations differ by the rounding of W (BLAS against the kernel's loop).
TOL = 1e-12


@pytest.fixture(scope="module")
def data():
    """Five devices of 12 to 30 rows, 6 features, personal labelling rules, a test split."""
    rng = np.random.default_rng(3)
    xs, ys, xs_test, ys_test = [], [], [], []
    for t in range(5):
        n = int(rng.integers(12, 31))
        X = l2_normalize(rng.normal(size=(n + 8, 6)))
        w = np.array([1.0, 0.5 * t - 1.0, 0.0, 0.3, 0.0, -0.2])
        y = np.where(X @ w + 0.2 * rng.normal(size=n + 8) >= 0.0, 1.0, -1.0)
        xs.append(X[:n])
        ys.append(y[:n])
        xs_test.append(X[n:])
        ys_test.append(y[n:])
    return DeviceData.from_lists(xs, ys, xs_test, ys_test)


def both(data, n_rounds=K * H, seed=SEED, **kwargs):
    """fit_dppfl (serial kernel) and the in-process protocol run on the same settings."""
    fit_kwargs = {k: v for k, v in kwargs.items() if k != "inner"}
    inner = kwargs.get("inner", K)
    fit = fit_dppfl(data, lam=LAM, xi=XI, inner=inner, outer=n_rounds // inner, seed=seed,
                    parallel=False, **fit_kwargs)
    alg = DPPFL.for_data(data, lam=LAM, xi=XI, **{"inner": inner, **fit_kwargs})
    res = run(alg, data, RunConfig(n_clients=data.n_clients, n_rounds=n_rounds, seed=seed))
    return fit, alg, res


def assert_close(actual, expected):
    """Equal to TOL relative to the larger of 1 and the reference's magnitude."""
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert_allclose(actual, expected, rtol=0, atol=TOL * scale)


def assert_same_fit(fit, alg, res):
    assert_close(res.server["V"], fit.V)
    assert_close(res.server["omega"], fit.omega)
    assert_close(alg.dual_variables(res.clients), fit.alpha)
    assert_close(alg.models(res.server), fit.W)
    assert_array_equal(res.clients["releases"], fit.active)
    # the padding beyond each device's rows stays zero
    pad = np.arange(res.clients["alpha"].shape[1]) >= alg.sizes[:, None]
    assert not np.any(res.clients["alpha"][pad])


# --------------------------------------------------------------------------- against fit_dppfl


@pytest.mark.parametrize("kwargs", [
    {},
    {"tau": 0.5, "drop_probability": 0.3},
    {"tau": 1.0, "drop_probability": 0.2, "loss": "smoothed_hinge", "gamma": 0.5},
    {"loss": "squared", "n_min": 7},
], ids=["homogeneous", "tau-drop", "smoothed-hinge", "squared-n_min"])
def test_non_private_run_equals_fit_dppfl(data, kwargs):
    fit, alg, res = both(data, **kwargs)
    assert_same_fit(fit, alg, res)
    assert fit.omega[0, 1] != 0.0  # the Omega-step was taken (and learned a coupling)
    if kwargs.get("drop_probability"):
        assert fit.active.min() < K * H  # some device did drop out
    assert res.history[-1]["iteration"] == K * H


def test_fixed_omega_is_kept(data):
    omega = exchangeable_omega(data.n_clients, 0.4)
    fit, alg, res = both(data, omega=omega, tau=0.5)
    assert_same_fit(fit, alg, res)
    assert_array_equal(res.server["omega"], omega)


@pytest.mark.parametrize("kwargs", [
    {"privacy": PrivacySetting(8.0)},
    {"privacy": PrivacySetting(2.0, 1e-4, ratio=0.5, upload_sensitivity="bound"),
     "tau": 0.5, "drop_probability": 0.25, "noisy_alpha": True},
], ids=["homogeneous", "heterogeneous-bound-noisy-alpha"])
def test_private_run_equals_fit_dppfl(data, kwargs):
    # epsilon1 < 1 fails at these budgets: the protocol warns as fit_dppfl does
    with pytest.warns(CalibrationConditionWarning) as caught:
        fit, alg, res = both(data, **kwargs)
    assert {str(w.message) for w in caught} == {str(caught[0].message)}
    assert_same_fit(fit, alg, res)
    # the same calibration, and the noise is there (V is not the clean sum)
    assert_array_equal(res.clients["dual_noise_std"], fit.calibration["dual_noise_std"])
    assert np.all(res.clients["sigma2"] > 0)
    assert_close(res.clients["s2_sum"] / res.clients["releases"], fit.mean_upload_sensitivity)
    clean = fit_dppfl(data, lam=LAM, xi=XI, inner=K, outer=H, seed=SEED, parallel=False,
                      **{k: v for k, v in kwargs.items() if k != "privacy"})
    assert np.max(np.abs(res.server["V"] - clean.V)) > 1e-3


def test_metrics_are_each_devices_test_error_and_training_loss(data):
    fit, alg, res = both(data, tau=0.5)
    _, per_device = dppfl_algorithm.test_error(data, fit.W)
    assert_allclose(res.metrics["test_error"], per_device, rtol=0, atol=1e-12)
    for t in range(data.n_clients):
        X, y = data.device(t)
        assert res.metrics["train_loss"][t] == pytest.approx(
            np.mean(np.maximum(0.0, 1.0 - y * (X @ fit.W[t]))), abs=1e-12)
    assert len(res.history) == K * H


# --------------------------------------------------------------------------- the protocol


@pytest.mark.filterwarnings("ignore::ebfl.dppfl.accounting.CalibrationConditionWarning")
@pytest.mark.parametrize("privacy", [None, PrivacySetting(4.0)], ids=["clean", "private"])
def test_one_device_at_a_time_equals_the_stacked_run(data, privacy):
    """As Flower runs the halves (a stack of one), with a failure thrown in."""
    alg = DPPFL.for_data(data, lam=LAM, inner=4, tau=0.5, drop_probability=0.2,
                         privacy=privacy)
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=9, seed=2)
    failures = {3: {1, 4}}
    res = run(alg, data, cfg, failures=failures)
    server, clients = one_at_a_time(alg, data, cfg, failures)
    for key, value in flatten({"server": server, "clients": clients}).items():
        expected = flatten({"server": res.server, "clients": res.clients})[key]
        assert_array_equal(value, expected, err_msg=key)


def test_a_dropped_device_replies_zeros_and_keeps_its_state(data):
    alg = DPPFL.for_data(data, lam=LAM, drop_probability=0.5)
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=1, seed=SEED)
    server, ids = alg.init_server(cfg), np.arange(data.n_clients)
    clients = alg.init_clients(cfg, data, ids)
    reply = alg.client_train(alg.broadcast(server, RoundContext(cfg, 0, ids)), clients, data,
                             RoundContext(cfg, 0, ids))
    dropped = reply["active"] == 0
    assert dropped.any() and not dropped.all()  # at this seed
    assert not np.any(reply["upload"][dropped]) and np.all(reply["upload"][~dropped].any(1))
    assert not np.any(clients["alpha"][dropped]) and np.all(clients["alpha"][~dropped].any(1))
    # the server adds the active devices' uploads to their rows only
    reply["upload"][dropped] = 1e9  # whatever a dropped device sends is ignored
    new = alg.aggregate(server, reply, np.ones(data.n_clients), RoundContext(cfg, 0, ids))
    assert not np.any(new["V"][dropped])
    assert_array_equal(new["V"][~dropped], reply["upload"][~dropped])


def test_omega_step_falls_due_in_a_round_without_replies(data):
    """Every device failing in the K-th round: the server still takes the Omega-step."""
    alg = DPPFL.for_data(data, lam=LAM, inner=3)
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=3, seed=SEED)
    res = run(alg, data, cfg, failures={2: set(range(data.n_clients))})
    fit2 = fit_dppfl(data, lam=LAM, xi=0.5, inner=2, outer=1, omega=np.eye(5) / 5, seed=SEED,
                     parallel=False)  # two iterations at Omega = I / m, no Omega-step
    assert_close(res.server["V"], fit2.V)
    assert res.history[-1]["replies"] == 0
    assert res.server["omega"][0, 1] != 0.0 and res.server["iteration"][0] == 3


def test_checkpoint_resume_equals_an_uninterrupted_run(data, tmp_path):
    alg = DPPFL.for_data(data, lam=LAM, inner=3, tau=0.5, drop_probability=0.2)
    whole = run(alg, data, RunConfig(n_clients=5, n_rounds=7, seed=1))
    path = tmp_path / "ckpt.pkl"
    run(alg, data, RunConfig(n_clients=5, n_rounds=4, seed=1), checkpoint=path)
    resumed = run(alg, data, RunConfig(n_clients=5, n_rounds=7, seed=1), checkpoint=path)
    for key, value in flatten({"s": whole.server, "c": whole.clients}).items():
        assert_array_equal(flatten({"s": resumed.server, "c": resumed.clients})[key], value)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_refused_naming_the_argument(data):
    with pytest.raises(ValueError, match="drop_probability"):
        DPPFL.for_data(data, lam=LAM, drop_probability=1.0)
    with pytest.raises(ValueError, match="lam"):
        DPPFL.for_data(data, lam=0.0)
    with pytest.raises(ValueError, match="inner"):
        DPPFL.for_data(data, lam=LAM, inner=0)
    with pytest.raises(TypeError, match="privacy"):
        DPPFL.for_data(data, lam=LAM, privacy=8.0)
    with pytest.raises(ValueError, match="sizes"):
        DPPFL([3, 0], 2, lam=LAM)
    with pytest.raises(TypeError, match="data must be a DeviceData"):
        DPPFL.for_data(np.zeros((3, 2)), lam=LAM)
    with pytest.raises(ValueError, match="omega"):
        DPPFL.for_data(data, lam=LAM, omega=np.eye(5))  # trace 5
    alg = DPPFL.for_data(data, lam=LAM)
    with pytest.raises(ValueError, match="the run has 4 clients"):
        run(alg, data.subset([0, 1, 2, 3]), RunConfig(n_clients=4, n_rounds=1))
    other = DPPFL(np.flip(data.sizes), data.n_features, lam=LAM)
    if not np.array_equal(other.sizes, data.sizes):
        with pytest.raises(ValueError, match="data does not fit the protocol"):
            run(other, data, RunConfig(n_clients=5, n_rounds=1))
    with pytest.raises(ValueError, match="clients\\['alpha'\\] must have shape"):
        alg.dual_variables({"alpha": np.zeros((2, 3))})


# --------------------------------------------------------------------------- the job


def test_job_runs_and_takes_its_settings():
    job = build_job({"algorithm": "dp-pfl", "clients": 4, "rounds": 6, "inner": 3,
                     "lambda": 0.2, "seed": 2})
    alg = job.algorithm
    assert (alg.n_clients, alg.inner, alg.lam, alg.privacy) == (4, 3, 0.2, None)
    assert job.data.X_test is not None and job.config.n_rounds == 6
    res = run(alg, job.data, job.config)
    assert set(res.metrics) == {"train_loss", "test_error"}
    assert res.history[-1]["train_loss"] < res.history[0]["train_loss"]
    private = build_job({"algorithm": "dp-pfl", "clients": 4, "epsilon": "8", "ratio": 0.5})
    assert private.algorithm.privacy == PrivacySetting(8.0, 1e-3, 0.5)
    with pytest.raises(ValueError, match="dp-pfl takes dataset 'simulated'"):
        build_job({"algorithm": "dp-pfl", "dataset": "elections", "clients": 4})
    with pytest.raises(ValueError, match="lambda"):
        build_job({"algorithm": "dp-pfl", "lambda": 0})
    with pytest.raises(ValueError, match="inner"):
        build_job({"algorithm": "dp-pfl", "inner": 0})


def test_loss_metric_follows_the_loss(data):
    alg = DPPFL.for_data(data, lam=LAM, loss="squared", inner=2)
    res = run(alg, data, RunConfig(n_clients=5, n_rounds=2, seed=0))
    W = alg.models(res.server)
    X, y = data.device(2)
    assert res.metrics["train_loss"][2] == pytest.approx(
        loss_values(X @ W[2], y, "squared").mean(), abs=1e-12)
