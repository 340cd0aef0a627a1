"""Algorithm 1 of the FedHDP paper (ebfl.fedhdp.point_estimation) on the federated protocol.

The run's estimates are checked against the closed forms computed here in
numpy from the same draws (the paper's formulas written out, not
ebfl.fedhdp.theory); the vectorized runtime against the halves driven one
client at a time (as Flower runs them); the special cases r = 1 and r = 0;
and, by Monte Carlo, the server's MSE sigma_s^2(r) and the personal MSE.
"""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from ebfl.federated import RunConfig, run
from ebfl.federated.protocol import RoundContext
from ebfl.federated.streams import stream_seed
from ebfl.federated.tree import flatten
from ebfl.fedhdp.point_estimation import (
    FedHDPPointEstimation,
    PointEstimationData,
    simulate_point_estimation,
)
from tests.test_federated_eb import one_at_a_time

SEED = 5


@pytest.fixture(scope="module")
def data():
    return simulate_point_estimation(30, 0.2, 1.0, 0.5, 10, phi=1.5, rng=0)


def two_groups(data, gamma2=0.3, ratio=0.25, lambda_np=2.0, lambda_p=0.6, center="global"):
    return FedHDPPointEstimation.two_groups(data.groups == 1, gamma2, ratio=ratio,
                                            lambda_np=lambda_np, lambda_p=lambda_p,
                                            center=center)


def config(m, n_rounds=2, seed=SEED):
    return RunConfig(n_clients=m, n_rounds=n_rounds, seed=seed)


def noise_draws(m, seed=SEED, round_=0):
    """Each client's standard normal draw of the upload round, from its own stream."""
    return np.array([np.random.default_rng(stream_seed(seed, round_, c)).standard_normal()
                     for c in range(m)])


# --------------------------------------------------------------------------- closed forms


def test_two_groups_equal_the_closed_forms_on_the_same_draws(data):
    gamma2, r, lam_np, lam_p = 0.3, 0.25, 2.0, 0.6
    res = run(two_groups(data, gamma2, r, lam_np, lam_p), data, config(data.n_clients))
    private = data.groups == 1
    n_np, n_p = int((~private).sum()), int(private.sum())
    assert (n_np, n_p) == (6, 24)
    local = data.samples.mean(axis=1)
    # eq. (8): private uploads carry noise of variance N_p gamma^2, non-private none
    psi = local + np.where(private, math.sqrt(n_p * gamma2), 0.0) * noise_draws(data.n_clients)
    # Algorithm 1's server step
    theta = (psi[~private].sum() + r * psi[private].sum()) / (n_np + r * n_p)
    lam = np.where(private, lam_p, lam_np)
    personal = (local + lam * theta) / (1 + lam)  # eq. (48)
    assert_allclose(res.clients["local"], local, rtol=0, atol=1e-12)
    assert_allclose(res.clients["psi"], psi, rtol=0, atol=1e-12)
    assert res.server["global"][0] == pytest.approx(theta, abs=1e-12)
    assert_allclose(res.clients["personal"], personal, rtol=0, atol=1e-12)
    assert res.server["contributors"][0] == data.n_clients
    # the evaluation: squared errors against the simulation's truth
    assert_allclose(res.metrics["squared_error"], (personal - data.truth) ** 2, atol=1e-12)
    assert_allclose(res.metrics["global_squared_error"], (theta - data.truth) ** 2, atol=1e-12)
    assert_allclose(res.metrics["local_squared_error"], (local - data.truth) ** 2, atol=1e-12)
    assert_allclose(res.metrics["server_squared_error"], (theta - 1.5) ** 2, atol=1e-12)


def test_l_groups_use_the_weights_of_eq_64():
    rng = np.random.default_rng(3)
    samples = rng.normal(size=(12, 4))
    groups = np.array([0, 1, 2, 2, 1, 0, 2, 2, 1, 2, 0, 2])
    gamma2, ratios, lambdas = [0.0, 0.1, 0.5], [1.0, 0.6, 0.2], [3.0, 1.0, 0.25]
    d = PointEstimationData(samples)
    res = run(FedHDPPointEstimation(groups, gamma2, ratios=ratios, lambdas=lambdas), d,
              config(12))
    sizes = np.bincount(groups)
    local = samples.mean(axis=1)
    sd = np.sqrt(sizes[groups] * np.asarray(gamma2)[groups])
    psi = local + sd * noise_draws(12)
    w = np.asarray(ratios)[groups] / np.sum(sizes * np.asarray(ratios))  # eq. (64)
    theta = np.sum(w * psi)
    lam = np.asarray(lambdas)[groups]
    assert res.server["global"][0] == pytest.approx(theta, abs=1e-12)
    assert_allclose(res.clients["personal"], (local + lam * theta) / (1 + lam), atol=1e-12)
    assert "squared_error" not in res.metrics and "estimate" in res.metrics


def test_the_printed_center_gives_no_personalization(data):
    """Algorithm 1 as printed regularizes toward the locally updated theta = phi_hat_j:
    the personal estimate is then the local one for every lambda."""
    cfg = config(data.n_clients)
    printed = run(two_groups(data, center="printed"), data, cfg)
    correct = run(two_groups(data), data, cfg)
    local = data.samples.mean(axis=1)
    assert_allclose(printed.clients["personal"], local, rtol=1e-15, atol=0)
    assert printed.server["global"][0] == correct.server["global"][0]
    assert np.all(np.abs(correct.clients["personal"] - local) > 1e-6)
    # the correct centre: a larger lambda moves every client toward theta*
    theta = correct.server["global"][0]
    more = run(two_groups(data, lambda_np=20.0, lambda_p=6.0), data, cfg)
    assert np.all(np.abs(more.clients["personal"] - theta)
                  < np.abs(correct.clients["personal"] - theta))


def test_ratio_one_is_the_uniform_average_with_noise_on_private_clients_only(data):
    gamma2 = 0.8
    res = run(two_groups(data, gamma2=gamma2, ratio=1.0), data, config(data.n_clients))
    private = data.groups == 1
    local = data.samples.mean(axis=1)
    psi = res.clients["psi"]
    assert_array_equal(psi[~private], local[~private])
    assert np.all(psi[private] != local[private])
    expected = local + math.sqrt(private.sum() * gamma2) * noise_draws(data.n_clients)
    assert_allclose(psi[private], expected[private], rtol=0, atol=1e-12)
    assert res.server["global"][0] == pytest.approx(psi.mean(), abs=1e-12)


def test_ratio_zero_ignores_the_private_clients(data):
    cfg = config(data.n_clients)
    res = run(two_groups(data, ratio=0.0), data, cfg)
    private = data.groups == 1
    local = data.samples.mean(axis=1)
    assert res.server["global"][0] == pytest.approx(local[~private].mean(), abs=1e-12)
    moved = data.samples.copy()
    moved[private] += 100.0
    other = PointEstimationData(moved, data.truth, data.phi, data.groups)
    res2 = run(two_groups(other, ratio=0.0), other, cfg)
    assert res2.server["global"][0] == res.server["global"][0]
    # they still personalize toward the non-private average
    assert_allclose(res2.clients["personal"][private],
                    (moved[private].mean(axis=1) + 0.6 * res.server["global"][0]) / 1.6,
                    atol=1e-12)


# --------------------------------------------------------------------------- runtimes


@pytest.mark.parametrize("failures", [None, {0: [1, 7], 1: [3, 7]}], ids=["all", "faults"])
@pytest.mark.parametrize("center", ["global", "printed"])
def test_stacked_clients_equal_clients_run_one_at_a_time(data, failures, center):
    cfg = config(data.n_clients, n_rounds=3)
    res = run(two_groups(data, center=center), data, cfg, failures=failures)
    server, clients = one_at_a_time(two_groups(data, center=center), data, cfg, failures)
    a, b = flatten({**res.server, **res.clients}), flatten({**server, **clients})
    assert a.keys() == b.keys()
    for key in a:
        assert_array_equal(a[key], b[key], err_msg=key)


def test_a_failed_client_is_left_out_and_personalizes_later(data):
    cfg = config(data.n_clients, n_rounds=2)
    failures = {0: [0, 4], 1: [2]}
    res = run(two_groups(data), data, cfg, failures=failures)
    private = data.groups == 1
    replied = np.setdiff1d(np.arange(data.n_clients), [0, 4])
    w = np.where(private, 0.25, 1.0)
    psi = res.clients["psi"]
    assert np.isnan(psi[[0, 4]]).all() and not np.isnan(psi[replied]).any()
    theta = np.sum(w[replied] * psi[replied]) / np.sum(w[replied])
    assert res.server["global"][0] == pytest.approx(theta, abs=1e-12)
    assert res.server["contributors"][0] == 28
    assert np.isnan(res.clients["personal"][2]) and np.isnan(res.metrics["squared_error"][2])
    assert not np.isnan(res.clients["personal"][[0, 4]]).any()
    later = run(two_groups(data), data, config(data.n_clients, n_rounds=3), failures=failures)
    assert not np.isnan(later.clients["personal"]).any()


def test_without_a_weighted_reply_the_server_asks_again_with_the_same_releases(data):
    cfg = config(data.n_clients, n_rounds=3)
    non_private = np.flatnonzero(data.groups == 0)
    with pytest.warns(RuntimeWarning, match="no client with a positive ratio"):
        res = run(two_groups(data, ratio=0.0), data, cfg, failures={0: non_private})
    with pytest.warns(RuntimeWarning, match="asks again next round"):
        first = run(two_groups(data, ratio=0.0), data, config(data.n_clients, n_rounds=1),
                    failures={0: non_private})
    private = data.groups == 1
    assert "global" not in first.server
    assert_array_equal(res.clients["psi"][private], first.clients["psi"][private])
    assert res.server["fit_round"][0] == 1
    local = data.samples.mean(axis=1)
    assert res.server["global"][0] == pytest.approx(local[non_private].mean(), abs=1e-12)
    assert not np.isnan(res.clients["personal"]).any()


def test_messages_and_states(data):
    alg, cfg = two_groups(data), config(data.n_clients)
    server = alg.init_server(cfg)
    assert set(alg.broadcast(server, RoundContext(cfg, 0, np.arange(30)))) == {"request"}
    res = run(alg, data, cfg)
    message = alg.broadcast(res.server, RoundContext(cfg, 2, np.arange(30)))
    assert set(message) == {"global", "fit_round"}
    assert set(res.clients) == {"local", "psi", "sent", "personal", "global"}
    assert_array_equal(res.clients["sent"], 0.0)
    assert res.history[0]["bytes_up"] == 30 * 8 and res.history[1]["bytes_up"] == 0
    assert res.history[-1]["global"] == res.server["global"][0]


# --------------------------------------------------------------------------- Monte Carlo


def server_mse(n_np, n_p, sigma_c2, gamma2, r):
    """sigma_s^2(r) = [N_np sigma_c^2 + N_p r^2 (sigma_c^2 + N_p gamma^2)] / (N_np + r N_p)^2."""
    return (n_np * sigma_c2 + n_p * r**2 * (sigma_c2 + n_p * gamma2)) / (n_np + r * n_p) ** 2


def personal_mse(lam, j, w, v, alpha2, tau2):
    """E (theta_j - phi_j)^2 of eq. (48) for client j (weights w, per-client noise v)."""
    others = np.delete(np.arange(w.size), j)
    return ((1 + lam * w[j]) ** 2 * alpha2 + lam**2 * (1 - w[j]) ** 2 * tau2
            + lam**2 * w[j] ** 2 * v[j]
            + lam**2 * np.sum(w[others] ** 2 * (tau2 + alpha2 + v[others]))) / (1 + lam) ** 2


def test_closed_form_server_mse_reference_values():
    # N = 20, rho = 0.05, alpha^2 = tau^2 = 1, gamma^2 = 0.5: r* = 2 / (2 + 19 * 0.5)
    r_star = 2.0 / 11.5
    assert r_star == pytest.approx(0.173913, abs=1e-6)
    assert server_mse(1, 19, 2.0, 0.5, r_star) == pytest.approx(0.464646, abs=1e-6)
    rs = np.linspace(0.0, 1.0, 2001)
    assert rs[np.argmin(server_mse(1, 19, 2.0, 0.5, rs))] == pytest.approx(r_star, abs=5e-4)


@pytest.mark.parametrize("ratio", ["optimal", 1.0])
def test_monte_carlo_errors_match_the_closed_forms(ratio):
    n, rho, alpha2, tau2, n_s, gamma2 = 20, 0.05, 1.0, 1.0, 5, 0.5
    n_np, n_p = 1, 19
    r = (alpha2 + tau2) / (alpha2 + tau2 + n_p * gamma2) if ratio == "optimal" else ratio
    lam_np, lam_p = 1.0, 0.7
    trials = 3000
    server, own_np, own_p = [], [], []
    for t in range(trials):
        d = simulate_point_estimation(n, rho, alpha2, tau2, n_s, phi=-2.0, rng=10_000 + t)
        alg = FedHDPPointEstimation.two_groups(d.groups == 1, gamma2, ratio=r,
                                               lambda_np=lam_np, lambda_p=lam_p)
        res = run(alg, d, RunConfig(n_clients=n, n_rounds=2, seed=t))
        server.append(res.metrics["server_squared_error"][0])
        sq = res.metrics["squared_error"]
        own_np.append(sq[d.groups == 0][0])
        own_p.append(sq[d.groups == 1][0])
    private = np.arange(n) >= n_np  # client 0 non-private, the others private
    w = np.where(private, r, 1.0) / (n_np + r * n_p)
    v = np.where(private, n_p * gamma2, 0.0)
    for values, expected in [
        (server, server_mse(n_np, n_p, alpha2 + tau2, gamma2, r)),
        (own_np, personal_mse(lam_np, 0, w, v, alpha2, tau2)),
        (own_p, personal_mse(lam_p, 1, w, v, alpha2, tau2)),
    ]:
        values = np.asarray(values)
        se = values.std(ddof=1) / math.sqrt(trials)
        assert abs(values.mean() - expected) < 4 * se, (values.mean(), expected, se)


def test_the_simulation_follows_the_model():
    m, n_s, alpha2, tau2, phi = 4000, 8, 0.7, 1.3, 3.0
    d = simulate_point_estimation(m, 0.25, alpha2, tau2, n_s, phi=phi, rng=1)
    assert int((d.groups == 0).sum()) == 1000 and d.phi == phi
    local = d.samples.mean(axis=1)
    for values, var in [(d.truth - phi, tau2), (local - d.truth, alpha2),
                        ((d.samples - d.truth[:, None])[:, 0], n_s * alpha2)]:
        assert abs(values.var(ddof=1) - var) < 4 * var * math.sqrt(2 / (m - 1))
    assert abs(np.mean(d.truth) - phi) < 4 * math.sqrt(tau2 / m)
    assert simulate_point_estimation(5, 0.5, 1.0, 1.0, 2, rng=0).groups.tolist().count(0) == 3
    again = simulate_point_estimation(m, 0.25, alpha2, tau2, n_s, phi=phi, rng=1)
    assert_array_equal(again.samples, d.samples)


# --------------------------------------------------------------------------- jobs


def test_the_job_builds_and_runs():
    from ebfl.flower.jobs import build_job

    job = build_job({"algorithm": "fedhdp-point", "clients": 8, "rounds": 2, "seed": 4})
    alg = job.algorithm
    assert isinstance(alg, FedHDPPointEstimation) and isinstance(job.data, PointEstimationData)
    n_p = int(alg.group_sizes[1])
    assert alg.group_sizes.tolist() == [4, 4]
    assert alg.ratios.tolist() == [1.0, pytest.approx(2.0 / (2.0 + n_p * 1.0))]
    res = run(alg, job.data, job.config)
    assert np.isfinite(res.clients["personal"]).all()
    custom = build_job({"algorithm": "fedhdp-point", "clients": 10, "opt-out": "0.3",
                        "gamma2": "2", "ratio": 0.5, "lambda": 0.1})
    assert custom.algorithm.group_sizes.tolist() == [3, 7]
    assert custom.algorithm.noise_variances.tolist() == [0.0, 2.0]
    assert custom.algorithm.ratios.tolist() == [1.0, 0.5]
    assert custom.algorithm.lambdas.tolist() == [0.1, 0.1]


@pytest.mark.parametrize("settings, match", [
    ({"dataset": "elections"}, "simulated"),
    ({"dataset": "digits"}, "dataset"),
    ({"epsilon": 1.0}, "epsilon"),
    ({"gamma2": -1.0}, "gamma2"),
    ({"opt-out": 1.5}, "opt-out"),
    ({"ratio": "x"}, "ratio"),
    ({"lambda": math.inf}, "lambda"),
])
def test_the_job_refuses_bad_settings(settings, match):
    from ebfl.flower.jobs import build_job

    with pytest.raises((ValueError, TypeError), match=match):
        build_job({"algorithm": "fedhdp-point", "clients": 6, **settings})


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("kwargs, match", [
    ({"groups": [0, 1, 2]}, r"groups must hold labels in \[0, 1\]"),
    ({"groups": [[0, 1]]}, "groups"),
    ({"groups": [0.5, 1]}, "groups"),
    ({"groups": []}, "groups"),
    ({"noise_variances": [0.0, -1.0]}, "noise_variances"),
    ({"noise_variances": [0.0, math.nan]}, "noise_variances"),
    ({"ratios": [1.0, 0.5, 0.2]}, "ratios must have one entry per group"),
    ({"ratios": [0.0, 0.0]}, "ratios"),
    ({"lambdas": [-1.0, 1.0]}, "lambdas"),
    ({"center": "local"}, "center"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    args = {"groups": [0, 1, 1], "noise_variances": [0.0, 1.0], "ratios": [1.0, 0.5],
            "lambdas": 1.0, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        FedHDPPointEstimation(args.pop("groups"), args.pop("noise_variances"), **args)


@pytest.mark.parametrize("call, match", [
    (lambda: simulate_point_estimation(0, 0.5, 1.0, 1.0, 5), "n_clients"),
    (lambda: simulate_point_estimation(5, 1.5, 1.0, 1.0, 5), "rho"),
    (lambda: simulate_point_estimation(5, 0.5, -1.0, 1.0, 5), "alpha2"),
    (lambda: simulate_point_estimation(5, 0.5, 1.0, math.nan, 5), "tau2"),
    (lambda: simulate_point_estimation(5, 0.5, 1.0, 1.0, 0), "n_samples"),
    (lambda: simulate_point_estimation(5, 0.5, 1.0, 1.0, 5, phi=math.inf), "phi"),
    (lambda: simulate_point_estimation(5, 0.5, 1.0, 1.0, 5, rng="a"), "rng"),
    (lambda: PointEstimationData([1.0, 2.0]), "samples"),
    (lambda: PointEstimationData([[1.0, math.nan]]), "samples"),
    (lambda: PointEstimationData([[1.0]], truth=[1.0, 2.0]), "truth"),
    (lambda: PointEstimationData([[1.0]], groups=[-1]), "groups"),
    (lambda: FedHDPPointEstimation.two_groups([0, 1], 1.0, ratio=0.5, lambda_np=1,
                                              lambda_p=1), "private"),
    (lambda: FedHDPPointEstimation.two_groups([False, True], 1.0, ratio=-0.5, lambda_np=1,
                                              lambda_p=1), "ratio"),
])
def test_bad_data_and_simulation_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_the_run_refuses_data_of_another_size_or_kind(data):
    alg = two_groups(data)
    with pytest.raises(ValueError, match="groups labels 30"):
        run(alg, data.subset(range(10)), config(10))
    from ebfl.federated import simulated_means

    with pytest.raises(TypeError, match="PointEstimationData"):
        run(alg, simulated_means(30, seed=0), config(30))


def test_inputs_are_not_mutated_and_data_are_read_only():
    groups = np.array([0, 1, 1, 0])
    samples = np.arange(8.0).reshape(4, 2)
    alg = FedHDPPointEstimation(groups, [0.0, 1.0], ratios=[1.0, 0.5], lambdas=1.0)
    d = PointEstimationData(samples, groups=groups)
    run(alg, d, config(4))
    assert_array_equal(groups, [0, 1, 1, 0])
    assert_array_equal(samples, np.arange(8.0).reshape(4, 2))
    with pytest.raises(ValueError):
        d.samples[0, 0] = 1.0
