"""Federated normal means (ebfl.federated.EBNormalMeans): runs equal ebfl.ebnm.

Every prior family of :func:`ebfl.ebnm` (read from ``FAMILIES`` at import, so
families added later are covered) is run in process and checked against
``ebnm`` on the same (x, s); the vectorized runtime against the halves driven
one client at a time (as Flower runs them); the private variant against
``ebnm`` on the mechanism's own releases; a Monte Carlo run that its fit finds
the population; bad input; the Flower job and one Flower simulation.
"""

import math
import time

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy import special

from ebfl import ebnm
from ebfl.eb.normal_means import FAMILIES
from ebfl.federated import ClientCounts, ClientMeans, EBNormalMeans, RunConfig, run
from ebfl.federated.eb_normal_means import DEFAULT_DELTA, POSTERIOR
from ebfl.federated.protocol import RoundContext
from ebfl.privacy import (
    BinaryMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    PrivacyGuarantee,
    StochasticQuantizer,
    paper_clip_range,
)
from tests.test_federated_eb import (
    assert_same_as_one_at_a_time,
    one_at_a_time,
    release_streams,
)

M = 80
#: Clipping half-width of the private tests: every |x_i| of the data below is under 7
#: (checked), so the mechanism never clips and the fit's model is exact.
B = 8.0
GAUSS = GaussianMechanism(2.0, 1e-5, B, calibration="l2")
#: Families that take a mode (npmle, deconvolver and flat have none to estimate).
WITH_MODE = ["point_normal", "point_laplace", "ash", "unimodal_nonnegative"]


@pytest.fixture(scope="module")
def data():
    """Sparse heteroskedastic clients: 60 % at theta = 0, the rest N(0.5, 2^2)."""
    rng = np.random.default_rng(11)
    theta = np.where(rng.random(M) < 0.6, 0.0, rng.normal(0.5, 2.0, M))
    s = rng.uniform(0.3, 1.0, M)
    x = theta + s * rng.standard_normal(M)
    assert np.max(np.abs(x)) < 7.0
    return ClientMeans(x, se=s, truth=theta)


def config(m=M, n_rounds=2, seed=3):
    return RunConfig(n_clients=m, n_rounds=n_rounds, seed=seed)


#: Once, in a full parallel test run, a point-Laplace fit inside the federated run and the
#: same ebnm call right after it differed by 1.4e-8 in pi0 (both converged; the two fits
#: are otherwise equal to the bit, here and in every other run, and the cause was not
#: found): the two point-Laplace comparisons allow the optimizer's own tolerance.
NEWTON_RTOL = 1e-6


def assert_posteriors(clients, posterior, atol=1e-12):
    for key in POSTERIOR:
        assert_allclose(clients[key], getattr(posterior, key), rtol=0, atol=atol, err_msg=key)


def assert_same_prior(alg, server, fitted, rtol=0.0):
    """The prior on the wire is ebnm's, and fitted_g rebuilds it (``rtol``: see
    ``NEWTON_RTOL``)."""
    g = alg.fitted_g(server)
    if fitted is None:
        assert g is None
        return
    message = server["prior"]
    # exactly what ebnm fitted
    assert_allclose(message["weights"], fitted.weights, rtol=rtol, atol=0)
    assert g.kinds == fitted.kinds and g.family == fitted.family
    assert_array_equal(g.a, fitted.a)
    assert_array_equal(g.b, fitted.b)
    # the rebuilt prior renormalizes its weights (a last-bit change at most)
    assert_allclose(g.weights, fitted.weights, rtol=4e-16, atol=1e-300)
    assert getattr(g, "parameters", None) == getattr(fitted, "parameters", None)


# --------------------------------------------------------------------------- every family


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_equals_ebnm(data, family):
    alg = EBNormalMeans(family)
    res = run(alg, data, config())
    direct = ebnm(data.mean, data.se, family)
    assert_posteriors(res.clients, direct.posterior)
    assert_same_prior(alg, res.server, direct.fitted_g)
    last = res.history[-1]
    assert last["contributors"] == M and last["answered"] == M
    if direct.fitted_g is None:  # flat: nothing fitted, nothing sent but the round
        assert sorted(res.server["prior"]) == ["fit_round"]
        assert "log_likelihood" not in last
    else:
        assert last["log_likelihood"] == direct.log_likelihood
        assert ("mode" in res.server["prior"]) == (direct.mode is not None)


def test_the_flat_prior_leaves_every_client_its_own_normal(data):
    res = run(EBNormalMeans("flat"), data, config())
    x, s = data.mean, data.se
    assert_array_equal(res.clients["mean"], x)
    assert_array_equal(res.clients["sd"], s)
    # ebnm computes it as min(Phi(-x/s), 1 - Phi(-x/s)): absolute, not relative, accuracy
    assert_allclose(res.clients["lfsr"], special.ndtr(-np.abs(x) / s), rtol=0, atol=1e-15)
    assert_array_equal(res.clients["prob_zero"], 0.0)


@pytest.mark.parametrize("family", [f for f in WITH_MODE if f in FAMILIES])
def test_estimated_modes_equal_ebnm(data, family):
    alg = EBNormalMeans(family, mode="estimate")
    res = run(alg, data, config())
    direct = ebnm(data.mean, data.se, family, mode="estimate")
    assert_posteriors(res.clients, direct.posterior)
    assert_same_prior(alg, res.server, direct.fitted_g)
    assert res.server["prior"]["mode"][0] == direct.mode == res.history[-1]["mode"]


@pytest.mark.parametrize("family, scale", [("point_normal", 1.5), ("ash", [0.0, 0.5, 1.0, 4.0]),
                                           ("npmle", np.linspace(-6, 6, 25))])
def test_fixed_scales_equal_ebnm(data, family, scale):
    alg = EBNormalMeans(family, scale=scale)
    res = run(alg, data, config())
    direct = ebnm(data.mean, data.se, family, scale=scale)
    assert_posteriors(res.clients, direct.posterior)
    assert_same_prior(alg, res.server, direct.fitted_g)


def test_known_sigma_x_gives_each_client_sigma_x_over_root_n():
    from ebfl.federated import simulated_means

    data = simulated_means(M, [5, 15, 30] * (M // 3) + [5] * (M % 3), seed=1)
    res = run(EBNormalMeans("point_laplace", sigma_x=0.5), data, config())
    direct = ebnm(data.mean, 0.5 / np.sqrt(data.count), "point_laplace")
    assert_posteriors(res.clients, direct.posterior, atol=1e-9)  # NEWTON_RTOL


def test_pooled_sigma_x_equals_ebnm_on_the_pooled_standard_errors():
    from ebfl import Ragged

    rng = np.random.default_rng(4)
    counts = rng.integers(1, 9, M)
    theta = rng.normal(0.0, 1.0, M)
    ragged = Ragged.from_lists([rng.normal(t, 0.7, k) for t, k in zip(theta, counts,
                                                                        strict=True)])
    data = ClientMeans.from_samples(ragged)
    res = run(EBNormalMeans("ash"), data, config())
    sigma_x = math.sqrt(data.ssd.sum() / (data.count - 1).sum())
    assert res.server["prior"]["sigma_x"][0] == pytest.approx(sigma_x, rel=1e-14)
    direct = ebnm(data.mean, res.server["prior"]["sigma_x"][0] / np.sqrt(data.count), "ash")
    assert_posteriors(res.clients, direct.posterior)


def test_messages_are_the_documented_arrays(data):
    res = run(EBNormalMeans("point_normal"), data, config())
    assert sorted(res.server["prior"]) == ["a", "b", "fit_round", "kinds", "log_likelihood",
                                           "mode", "weights"]
    fit_round = res.history[0]
    assert fit_round["bytes_up"] == 16 * M  # mean and se, float64
    alg = EBNormalMeans("npmle")
    assert "mode" not in run(alg, data, config()).server["prior"]
    private = EBNormalMeans(mechanism=GAUSS)
    state = private.init_clients(config(), data, np.arange(M))
    reply = private.client_train({"request": np.array([0.0])}, state, data,
                                 RoundContext(config(), 0, np.arange(M)))
    assert sorted(reply) == ["release", "se"]
    assert_array_equal(reply["se"], data.se)


# --------------------------------------------------------------------------- runtimes and faults

ONE_AT_A_TIME = {**{f: (lambda f=f: EBNormalMeans(f)) for f in FAMILIES},
                 "private": lambda: EBNormalMeans("ash", mechanism=GAUSS)}


@pytest.mark.parametrize("name", list(ONE_AT_A_TIME))
def test_stacked_clients_equal_clients_run_one_at_a_time(name, data):
    """With faults: clients 3 and 50 miss the fit, client 7 the posterior round."""
    make, failures, cfg = ONE_AT_A_TIME[name], {0: [3, 50], 1: [7]}, config(n_rounds=3)
    res = run(make(), data, cfg, failures=failures)
    assert_same_as_one_at_a_time(res, *one_at_a_time(make(), data, cfg, failures))
    assert not np.isnan(res.clients["mean"]).any()  # client 7 caught up in round 2


def test_failed_clients_are_left_out_of_the_fit_and_use_the_prior_later(data):
    failed = [3, 50]
    alg = EBNormalMeans("point_laplace")
    res = run(alg, data, config(), failures={0: failed})
    others = np.setdiff1d(np.arange(M), failed)
    fit = ebnm(data.mean[others], data.se[others], "point_laplace")
    assert_same_prior(alg, res.server, fit.fitted_g, rtol=NEWTON_RTOL)
    # every client, failed ones included, has its posterior under that prior
    direct = ebnm(data.mean, data.se, "point_laplace", g_init=alg.fitted_g(res.server),
                  fix_g=True)
    assert_posteriors(res.clients, direct.posterior)
    assert_array_equal(res.clients["sent"][failed], np.nan)


# --------------------------------------------------------------------------- private


def _releases(mechanism, x, seed, round_=0):
    """Each client's release, drawn again from its own stream of the round."""
    return np.array([mechanism.privatize(x[j:j + 1], g)[0]
                     for j, g in enumerate(release_streams(x.size, seed, round_))])


# Weak privacy (noise sd about 2.3 and 1.1): with 80 clients the fitted prior then keeps
# a slab, so the exact and the noisy posteriors differ visibly.
@pytest.mark.parametrize("mechanism", [GaussianMechanism(50.0, 1e-5, B, calibration="l2"),
                                       LaplaceMechanism(20.0, B)], ids=["gaussian", "laplace"])
@pytest.mark.parametrize("family", ["point_normal", "ash", "npmle"])
def test_private_fit_is_ebnm_on_the_releases_and_posteriors_use_exact_x(data, family,
                                                                        mechanism):
    assert mechanism.n_clipped(data.mean) == 0
    cfg = config()
    alg = EBNormalMeans(family, mechanism=mechanism)
    res = run(alg, data, cfg)
    releases = _releases(mechanism, data.mean, cfg.seed)
    assert_array_equal(res.clients["release"], releases)  # each client's own stream
    again = run(EBNormalMeans(family, mechanism=mechanism), data, cfg)
    assert_array_equal(again.clients["release"], releases)  # the same numbers on a rerun
    # the server fits on the releases, their variance s^2 + the mechanism's
    fit = ebnm(releases, np.sqrt(data.se**2 + mechanism.max_variance), family)
    assert_same_prior(alg, res.server, fit.fitted_g)
    assert res.history[-1]["log_likelihood"] == fit.log_likelihood
    # each client's posterior: its exact x and s under that prior
    exact = ebnm(data.mean, data.se, family, g_init=fit.fitted_g, fix_g=True)
    assert_posteriors(res.clients, exact.posterior)
    assert np.ptp(res.clients["mean"]) > 1.0  # the prior did not shrink everyone to one value
    noisy = ebnm(releases, data.se, family, g_init=fit.fitted_g, fix_g=True)
    assert np.max(np.abs(noisy.posterior.mean - res.clients["mean"])) > 0.1


def test_private_protocol_reports_its_privacy(data):
    alg = EBNormalMeans(mechanism=GAUSS)
    assert alg.privacy == GAUSS.privacy == PrivacyGuarantee(2.0, 1e-5)
    cfg = alg.config()
    assert cfg["privacy"] == {"epsilon": 2.0, "delta": 1e-5}
    assert cfg["mechanism"] == {"type": "GaussianMechanism", "epsilon": 2.0, "delta": 1e-5,
                                "b": B, "d": 1, "calibration": "l2"}
    res = run(alg, data, config())
    assert all(h["epsilon"] == 2.0 and h["delta"] == 1e-5 for h in res.history)
    plain = EBNormalMeans()
    assert plain.privacy is None and plain.config()["privacy"] is None
    assert "epsilon" not in run(plain, data, config()).history[-1]


def test_too_few_replies_postpone_the_fit_and_releases_are_not_redrawn(data):
    cfg = config(n_rounds=3)
    with pytest.warns(RuntimeWarning, match="asks again"):
        res = run(EBNormalMeans(mechanism=GAUSS), data, cfg,
                  failures={0: list(range(1, M))})  # only client 0 replies in round 0
    assert res.server["prior"]["fit_round"][0] == 1.0
    # client 0 sent its round-0 release again; the others released in round 1
    assert res.clients["release"][0] == _releases(GAUSS, data.mean[:1], cfg.seed, 0)[0]
    later = _releases(GAUSS, data.mean, cfg.seed, 1)
    assert_array_equal(res.clients["release"][1:], later[1:])


def test_private_fit_finds_the_population_for_many_clients():
    """50 000 clients, theta ~ N(0.5, 1), s_i in [0.2, 0.6], Gaussian mechanism at
    (16, 1e-5) on [-6, 6] (sigma = 4.13, so each release's variance is about 18 times
    the population's): the normal family's fit recovers mu and tau^2.

    Tolerance: release_i ~ N(mu, tau^2 + v_i), v_i = s_i^2 + sigma^2 <= v = 0.36 +
    sigma^2, so the maximum-likelihood estimates have standard errors at most
    sqrt((tau^2 + v) / m) = 0.019 for mu and (tau^2 + v) sqrt(2 / m) = 0.117 for
    tau^2 (the Fisher information of m observations of variance <= tau^2 + v); the
    test allows 4 of them. A fit that forgot the mechanism's variance would put
    tau^2 near 18, and the fixed seed makes the run reproducible.
    """
    m = 50_000
    rng = np.random.default_rng(7)
    theta = rng.normal(0.5, 1.0, m)
    s = rng.uniform(0.2, 0.6, m)
    x = theta + s * rng.standard_normal(m)
    mech = GaussianMechanism(16.0, 1e-5, 6.0, calibration="l2")
    assert mech.n_clipped(x) == 0  # b covers the data: the fit's model is exact
    alg = EBNormalMeans("normal", mode="estimate", mechanism=mech)
    res = run(alg, ClientMeans(x, se=s, truth=theta), config(m, seed=5))
    g = alg.fitted_g(res.server)
    total = 1.0 + 0.6**2 + mech.max_variance
    assert abs(g.a[0] - 0.5) < 4 * math.sqrt(total / m)
    assert abs(g.b[0] ** 2 - 1.0) < 4 * total * math.sqrt(2 / m)
    # and the posteriors, from each client's exact x_i, beat the local estimates
    last = res.history[-1]
    assert last["squared_error"] < 0.9 * last["local_squared_error"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, error, match", [
    ({"family": "cauchy"}, ValueError, "family must be one of"),
    ({"family": ["ash"]}, TypeError, "family"),
    ({"family": None}, ValueError, "family"),
    ({"mode": "median"}, ValueError, "mode"),
    ({"mode": float("nan")}, ValueError, "mode"),
    ({"mode": 1 + 1j}, TypeError, "mode"),
    ({"scale": "wide"}, ValueError, "scale"),
    ({"scale": -1.0}, ValueError, "scale"),
    ({"scale": [1.0, 2.0]}, TypeError, "scale"),
    ({"family": "ash", "scale": [0.5, -1.0]}, ValueError, "scale"),
    ({"sigma_x": 0.0}, ValueError, "sigma_x"),
    ({"sigma_x": 1e200}, ValueError, "sigma_x"),
    ({"sigma_x": "0.5"}, TypeError, "sigma_x"),
    ({"mechanism": "gaussian"}, TypeError, "mechanism"),
    ({"mechanism": StochasticQuantizer(2, 1.0)}, ValueError, "same variance"),
    ({"mechanism": BinaryMechanism(1.0)}, ValueError, "same variance"),
    ({"mechanism": GaussianMechanism(1.0, 1e-5, 1.0, d=2, calibration="l2")}, ValueError,
     "mechanism.d must be 1"),
    ({"family": "flat", "mechanism": GAUSS}, ValueError, "flat"),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        EBNormalMeans(**kwargs)


def test_bad_data_is_refused():
    with pytest.raises(TypeError, match="data must be a ClientMeans"):
        run(EBNormalMeans(), ClientCounts([1, 1], [2, 2]), config(2))
    with pytest.raises(ValueError, match="neither se nor ssd"):
        run(EBNormalMeans(), ClientMeans([0.0, 1.0]), config(2))
    with pytest.raises(ValueError, match="data needs count"):
        run(EBNormalMeans(sigma_x=1.0), ClientMeans([0.0, 1.0], se=1.0), config(2))
    pooled_only = ClientMeans.from_summaries([0.0, 1.0], [1.0, 2.0], [3, 4])
    with pytest.raises(ValueError, match="every client needs its own s_i"):
        run(EBNormalMeans(mechanism=GAUSS), pooled_only, config(2))


def test_a_damaged_prior_message_is_refused(data):
    alg, cfg = EBNormalMeans(), config(2)
    two = ClientMeans(data.mean[:2], se=data.se[:2])
    state = alg.init_clients(cfg, two, np.arange(2))
    rc = RoundContext(cfg, 1, np.arange(2))
    good = {"weights": np.array([0.5, 0.5]), "kinds": np.array([0.0, 0.0]),
            "a": np.zeros(2), "b": np.array([0.0, 1.0]), "fit_round": np.array([0.0])}
    alg.client_train(good, state, two, rc)
    assert np.isfinite(state["mean"]).all()
    for key, value, match in (("kinds", np.array([0.0, 99.0]), "kinds"),
                              ("kinds", np.array([0.0, 0.5]), "kinds"),
                              ("weights", np.array([0.5, 0.6]), "weights")):
        with pytest.raises(ValueError, match=match):
            alg.client_train({**good, key: value}, state, two, rc)


def test_inputs_are_not_mutated():
    grid = np.array([1.0, 0.0, 0.5])
    alg = EBNormalMeans("ash", scale=grid)
    assert_array_equal(grid, [1.0, 0.0, 0.5]) and grid.flags.writeable
    assert alg.config()["scale"] == [0.0, 0.5, 1.0]
    x, s = np.array([0.5, -1.0, 2.0, 0.0]), np.array([0.5, 0.5, 1.0, 1.0])
    run(alg, ClientMeans(x, se=s), config(4))
    assert_array_equal(x, [0.5, -1.0, 2.0, 0.0]) and x.flags.writeable


# --------------------------------------------------------------------------- jobs and Flower


def test_jobs_build_eb_normal_means_and_its_private_variant():
    from ebfl.federated.eb_normal_means import job_algorithm
    from ebfl.flower.jobs import build_job

    job = build_job({"algorithm": "eb-normal-means", "clients": 20})
    alg = job.algorithm
    assert isinstance(alg, EBNormalMeans) and isinstance(job.data, ClientMeans)
    assert (alg.family, alg.sigma_x, alg.mechanism) == ("point_normal", 0.5, None)
    res = run(alg, job.data, job.config)
    direct = ebnm(job.data.mean, 0.5 / np.sqrt(job.data.count), "point_normal")
    assert_posteriors(res.clients, direct.posterior)

    job = build_job({"algorithm": "eb-normal-means", "family": "ash", "epsilon": "2",
                     "clients": 20})
    mech = job.algorithm.mechanism
    assert job.algorithm.family == "ash" and isinstance(mech, GaussianMechanism)
    assert (mech.calibration, mech.delta, DEFAULT_DELTA) == ("l2", 1e-5, 1e-5)
    assert mech.b == paper_clip_range(1.0, 20, 15, 0.1, 0.5)
    assert job.algorithm.privacy == PrivacyGuarantee(2.0, 1e-5)  # exactly what was asked
    assert np.isfinite(run(job.algorithm, job.data, job.config).clients["mean"]).all()
    job = build_job({"algorithm": "eb-normal-means", "epsilon": 1.0, "delta": "1e-3"})
    assert job.algorithm.privacy == PrivacyGuarantee(1.0, 1e-3)

    for settings, match in (
            ({"algorithm": "eb-gaussian", "family": "ash"}, "family is a setting of "
                                                           "eb-normal-means"),
            ({"algorithm": "eb-normal-means", "delta": 1e-3}, "delta .* needs epsilon"),
            ({"algorithm": "eb-normal-means", "family": "cauchy"}, "family must be one of"),
            ({"algorithm": "eb-normal-means", "epsilon": 1.0, "delta": 1.0}, "delta"),
            ({"algorithm": "eb-normal-means", "epsilon": 1.0, "delta": "x"}, "delta")):
        with pytest.raises(ValueError, match=match):
            build_job(settings)
    with pytest.raises(ValueError, match="needs dataset 'simulated'"):
        job_algorithm({"algorithm": "eb-normal-means", "dataset": "elections",
                       "epsilon": 1.0, "clients": 6})
    # the election shares: sigma_x pooled over the counties, as eb-gaussian does
    shares = job_algorithm({"algorithm": "eb-normal-means", "dataset": "elections",
                            "family": "npmle"})
    assert (shares.family, shares.sigma_x, shares.mechanism) == ("npmle", None, None)


def test_cli_passes_family_and_delta_to_the_job(tmp_path, capsys):
    from ebfl.cli import main

    app = tmp_path / "app"
    assert main(["flower", "app", str(app), "eb-normal-means", "--family", "ash",
                 "--epsilon", "1", "--delta", "1e-4", "--json"]) == 0
    capsys.readouterr()
    toml = (app / "pyproject.toml").read_text()
    assert 'family = "ash"' in toml and "delta = 0.0001" in toml
    assert main(["flower", "app", str(tmp_path / "b"), "eb-normal-means", "--family",
                 "cauchy"]) == 2
    assert "--family" in capsys.readouterr().err


@pytest.mark.flower
def test_flower_equals_in_process():
    """eb-normal-means on Flower (plain, another family, private), with a client failing
    in the posterior round, against the in-process run; Ray on loopback only."""
    pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                       "pip install 'ebfl[flower]'")
    pytest.importorskip("psutil")
    from ebfl.flower.jobs import build_job
    from ebfl.flower.runtime import max_abs_diff
    from tests.test_flower_simulate import LOOPBACK, _descendants, _ListenWatch

    jobs = [{"algorithm": "eb-normal-means", "clients": 6, "rounds": 3},
            {"algorithm": "eb-normal-means", "clients": 6, "rounds": 3, "family": "ash"},
            {"algorithm": "eb-normal-means", "clients": 6, "rounds": 3, "epsilon": 2.0}]
    failures = {1: {0, 4}}
    before = {p.pid for p in _descendants()}
    watch = _ListenWatch()
    watch.start()
    try:
        from ebfl.flower.runtime import simulate

        results = simulate(jobs, failures=failures)
    finally:
        watch.stop.set()
        watch.join()
    deadline = time.monotonic() + 30  # Ray's processes end after the simulation
    while (left := [p for p in _descendants() if p.pid not in before and p.is_running()
                    and p.status() != "zombie"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    for settings, flower in zip(jobs, results, strict=True):
        job = build_job(settings)
        local = run(job.algorithm, job.data, job.config, failures=failures)
        assert max_abs_diff(flower, local) <= 1e-12, settings
        assert len(flower.history) == len(local.history) == 3
        for a, b in zip(flower.history, local.history, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key] == pytest.approx(b[key], abs=1e-12, nan_ok=True), key
        assert not np.isnan(flower.clients["mean"]).any()  # 0 and 4 caught up in round 2
    assert watch.seen, "no listening socket observed during the simulation"
    assert {ip for _, ip in watch.seen} <= LOOPBACK, sorted(watch.seen)
    assert not left, [p.name() for p in left]
