"""Federated empirical Bayes (ebfl.federated.eb): runs equal the in-process estimators.

Every protocol is checked against the in-process function on the same data
(exactly, or to 1e-12 where a matrix product or a square root sits between),
the private ones on the same noisy releases; the vectorized runtime against
the halves driven one client at a time (as Flower runs them); and the fault
semantics against direct computations.
"""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy import stats

from ebfl import (
    Ragged,
    beta_binomial_eb,
    gaussian_eb,
    gaussian_eb_samples,
    npmle_binomial,
    npmle_normal,
    personalized_gaussian,
)
from ebfl.federated import (
    ClientCounts,
    ClientMeans,
    EBBetaBinomial,
    EBGaussian,
    RunConfig,
    election_federation,
    election_shares,
    run,
    simulated_counts,
    simulated_means,
)
from ebfl.federated.protocol import RoundContext, sample_clients
from ebfl.federated.streams import stream_seed
from ebfl.federated.tree import flatten, tree_cat, tree_nbytes
from ebfl.privacy import (
    BinaryMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
    StochasticQuantizer,
    private_bernoulli_corrected,
    private_bernoulli_paper,
    private_gaussian,
)
from tests.conftest import requires_data

M = 150
GRID = 60  # NPMLE grids kept small: the tests check equality, not resolution


@pytest.fixture(scope="module")
def counts():
    return simulated_counts(M, 14, seed=0)


@pytest.fixture(scope="module")
def means():
    return simulated_means(M, [5, 15, 30] * (M // 3), seed=0)


def config(m=M, n_rounds=2, seed=3):
    return RunConfig(n_clients=m, n_rounds=n_rounds, seed=seed)


def release_streams(m, seed, round_=0):
    """Each client's generator of the round, as the clients draw their noise."""
    return [np.random.default_rng(stream_seed(seed, round_, c)) for c in range(m)]


def assert_same_as_one_at_a_time(res, server, clients, atol=1e-15):
    """A stacked run's server and client state equal the one-client-at-a-time run's
    (the same NaNs, values to ``atol``)."""
    a, b = flatten({**res.server, **res.clients}), flatten({**server, **clients})
    assert a.keys() == b.keys()
    for key in a:
        assert_array_equal(np.isnan(a[key]), np.isnan(b[key]))
        assert_allclose(a[key], b[key], rtol=0, atol=atol, err_msg=key)


def one_at_a_time(alg, data, cfg, failures=None):
    """The halves driven client by client (K = 1), as the Flower runtime runs them."""
    failures = failures or {}
    server = alg.init_server(cfg)
    clients = [alg.init_clients(cfg, data.subset([c]), np.array([c]))
               for c in range(data.n_clients)]
    for r in range(cfg.n_rounds):
        sampled = sample_clients(cfg, r, everyone=alg.all_clients_train)
        message = alg.broadcast(server, RoundContext(cfg, r, sampled))
        active = [int(c) for c in sampled if c not in failures.get(r, ())]
        replies = [alg.client_train(message, clients[c], data.subset([c]),
                                    RoundContext(cfg, r, np.array([c]))) for c in active]
        if active:  # as both runtimes: no reply, no aggregation
            server = alg.aggregate(server, tree_cat(replies), np.ones(len(active)),
                                   RoundContext(cfg, r, np.array(active)))
    return server, tree_cat(clients)


# --------------------------------------------------------------------------- Beta-Bernoulli


@pytest.mark.parametrize("method", ["mle", "moments", "loo_printed", "loo_proof",
                                    "loo_corrected"])
def test_beta_binomial_equals_the_in_process_fit(counts, method):
    res = run(EBBetaBinomial(method=method), counts, config())
    direct = beta_binomial_eb(counts.successes, counts.trials, method=method)
    assert_array_equal(res.clients["mean"], direct.posterior.mean)
    assert_array_equal(res.clients["var"], direct.posterior.var)
    assert_array_equal(res.clients["weight"], direct.shrinkage)
    if method in ("mle", "moments"):
        prior = res.server["prior"]
        assert (prior["alpha"][0], prior["beta"][0]) == (direct.prior.alpha, direct.prior.beta)
    assert res.history[-1]["contributors"] == M and res.history[-1]["answered"] == M


def test_beta_binomial_from_raw_bernoulli_observations():
    ragged = Ragged.from_lists([[1, 1, 0], [0, 0, 0, 1], [1, 1], [0, 1, 1, 1], [0, 0]])
    data = ClientCounts.from_bernoulli(ragged)
    res = run(EBBetaBinomial(method="moments"), data, config(5))
    direct = beta_binomial_eb(*[np.array(v) for v in ([2, 1, 2, 3, 0], [3, 4, 2, 4, 2])],
                              method="moments")
    assert_array_equal(res.clients["mean"], direct.posterior.mean)


def test_npmle_binomial_equals_the_in_process_fit(counts):
    res = run(EBBetaBinomial("npmle", n_grid=GRID), counts, config())
    direct = npmle_binomial(counts.successes, counts.trials, n_grid=GRID)
    assert_array_equal(res.server["prior"]["weights"], direct.weights)
    assert_array_equal(res.server["prior"]["grid"], direct.grid)
    # per client, the posterior's matrix product can round differently from the fit's
    assert_allclose(res.clients["mean"], direct.posterior_mean, rtol=0, atol=1e-12)
    assert_allclose(res.clients["var"], direct.posterior_var, rtol=0, atol=1e-12)
    assert np.isnan(res.clients["weight"]).all()


def _replayed(m, seed, draw):
    """What each client releases in round 0, drawn again from its own stream."""
    return np.array([draw(j, g) for j, g in enumerate(release_streams(m, seed))])


@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_binary_privacy_equals_theorem4_on_the_same_releases(counts, epsilon, monkeypatch):
    cfg = config()
    res = run(EBBetaBinomial(privacy="binary", epsilon=epsilon), counts, cfg)
    x = counts.successes / counts.trials
    mech = BinaryMechanism(epsilon)
    releases = _replayed(M, cfg.seed, lambda j, g: mech.privatize(x[j:j + 1], g)[0])
    assert_array_equal(res.clients["release"], releases)  # each client's own stream
    monkeypatch.setattr(BinaryMechanism, "privatize", lambda self, x, rng=None: releases.copy())
    direct = private_bernoulli_paper(counts.successes, counts.trials, epsilon)
    assert_array_equal(res.clients["mean"], direct.estimate)
    assert_array_equal(res.clients["weight"], direct.weight)
    assert np.isnan(res.clients["var"]).all()


@pytest.mark.parametrize("variance", ["ucb", "plugin"])
@pytest.mark.parametrize("epsilon", [1.0, 20.0])
def test_laplace_privacy_equals_the_corrected_estimator(counts, epsilon, variance, monkeypatch):
    cfg = config()
    res = run(EBBetaBinomial(privacy="laplace", epsilon=epsilon, variance=variance), counts,
              cfg)
    x = counts.successes / counts.trials
    mech = LaplaceMechanism(epsilon, 0.5)
    noisy = _replayed(M, cfg.seed, lambda j, g: mech.privatize(x[j:j + 1] - 0.5, g)[0])
    assert_array_equal(res.clients["release"], 0.5 + noisy)
    monkeypatch.setattr(LaplaceMechanism, "privatize", lambda self, x, rng=None: noisy.copy())
    direct = private_bernoulli_corrected(counts.successes, counts.trials, epsilon,
                                         variance=variance)
    assert_array_equal(res.clients["mean"], direct.estimate)
    assert_array_equal(res.clients["weight"], direct.weight)


def test_randomized_response_fits_the_npmle_of_the_reported_counts(counts):
    eps = 2.0
    res = run(EBBetaBinomial("npmle", n_grid=GRID, privacy="randomized-response",
                             epsilon=eps), counts, config())
    reported = res.clients["release"].astype(np.int64)
    rr = RandomizedResponse(eps)
    grid = np.linspace(0.0, 1.0, GRID)
    direct = npmle_binomial(reported, counts.trials, grid=rr.prob_high(grid))
    assert_array_equal(res.server["prior"]["weights"], direct.weights)
    assert_array_equal(res.server["prior"]["grid"], grid)
    # each client's posterior uses its exact counts: brute force over the grid
    w = res.server["prior"]["weights"]
    joint = w * stats.binom.pmf(counts.successes[:, None], counts.trials[:, None], grid)
    assert_allclose(res.clients["mean"], joint @ grid / joint.sum(1), rtol=1e-10, atol=0)


def test_randomized_response_reports_with_the_flip_law():
    # E[reported | z] = z (1 - f) + (n - z) f; the sum over clients within 4 standard errors
    data = simulated_counts(3000, 20, seed=4)
    eps = 1.0
    alg = EBBetaBinomial("npmle", n_grid=20, privacy="randomized-response", epsilon=eps)
    res = run(alg, data, RunConfig(n_clients=3000, n_rounds=1, seed=9))
    f = RandomizedResponse(eps).flip_probability
    z, n = data.successes, data.trials
    expected = np.sum(z * (1 - f) + (n - z) * f)
    se = math.sqrt(np.sum(n * f * (1 - f)))
    assert abs(res.clients["release"].sum() - expected) < 4 * se
    # the raw counts themselves are not what was sent
    assert not np.array_equal(res.clients["release"], z)


def test_randomized_response_without_noise_recovers_the_npmle(counts):
    # eps = 60: flips have probability ~1e-26, so the reports are the counts
    res = run(EBBetaBinomial("npmle", n_grid=GRID, privacy="randomized-response",
                             epsilon=60.0), counts, config())
    assert_array_equal(res.clients["release"], counts.successes)
    direct = npmle_binomial(counts.successes, counts.trials, n_grid=GRID)
    assert_allclose(res.clients["mean"], direct.posterior_mean, rtol=0, atol=1e-9)


def test_risks_match_the_closed_forms_on_a_beta_population():
    # Beta(2, 2), n = 14: Bayes risk ab/((a+b)(a+b+1)(a+b+n)) = 1/90, local risk
    # ab/(n(a+b)(a+b+1)) = 1/70; a fitted prior adds O(1/m), far below the MC error
    m = 4000
    data = simulated_counts(m, 14, seed=1)
    metrics = run(EBBetaBinomial(), data, config(m)).metrics
    for name, exact in (("squared_error", 1 / 90), ("local_squared_error", 1 / 70)):
        values = metrics[name]
        assert abs(values.mean() - exact) < 4 * values.std(ddof=1) / math.sqrt(m), name


# --------------------------------------------------------------------------- Gaussian


@pytest.mark.parametrize("method", ["mle", "reml", "dl", "moments"])
def test_gaussian_with_known_sigma_x_equals_gaussian_eb(means, method):
    res = run(EBGaussian(method=method, sigma_x=0.5), means, config())
    direct = gaussian_eb(means.mean, 0.5 / np.sqrt(means.count), method=method)
    assert_allclose(res.clients["mean"], direct.posterior.mean, rtol=0, atol=1e-12)
    assert_allclose(res.clients["var"], direct.posterior.var, rtol=1e-12, atol=0)
    assert_allclose(res.clients["weight"], direct.shrinkage, rtol=1e-12, atol=0)
    assert res.server["prior"]["sd"][0] == direct.prior.sd
    assert res.server["prior"]["mean"][0] == direct.prior.mean


def test_gaussian_with_pooled_sigma_x_equals_gaussian_eb_samples():
    sample = simulated_means(M, 10, seed=5)
    rng = np.random.default_rng(5)
    values = [rng.normal(t, 0.5, size=k) for t, k in zip(sample.truth, rng.integers(1, 9, M),
                                                         strict=True)]
    ragged = Ragged.from_lists(values)
    data = ClientMeans.from_samples(ragged)
    res = run(EBGaussian(method="reml"), data, config())
    direct = gaussian_eb_samples(ragged, method="reml")
    assert res.server["prior"]["sigma_x"][0] == direct.diagnostics["sigma_x"]
    assert_allclose(res.clients["mean"], direct.posterior.mean, rtol=0, atol=1e-12)
    assert_allclose(res.clients["var"], direct.posterior.var, rtol=1e-12, atol=0)


def test_gaussian_with_client_standard_errors_and_a_fixed_prior(means):
    s = np.linspace(0.05, 0.3, M)
    data = ClientMeans(means.mean, se=s)
    res = run(EBGaussian(prior_mean=0.1, prior_sd=0.2), data, config())
    direct = gaussian_eb(means.mean, s, prior_mean=0.1, prior_sd=0.2)
    assert direct.method == "fixed"
    assert_allclose(res.clients["mean"], direct.posterior.mean, rtol=0, atol=1e-12)


def test_gaussian_with_known_sigma_theta_equals_theorem1():
    data = simulated_means(M, 15, seed=2)
    res = run(EBGaussian(sigma_x=0.5, prior_sd=0.1), data, config())
    direct = personalized_gaussian(data.mean, 15, sigma_theta=0.1, sigma_x=0.5)
    assert_allclose(res.clients["mean"], direct.estimate, rtol=0, atol=1e-12)
    assert_allclose(res.clients["weight"], direct.weight, rtol=1e-12, atol=0)


def test_gaussian_npmle_equals_npmle_normal(means):
    res = run(EBGaussian("npmle", sigma_x=0.5, n_grid=GRID), means, config())
    direct = npmle_normal(means.mean, 0.5 / np.sqrt(means.count), n_grid=GRID)
    assert_array_equal(res.server["prior"]["weights"], direct.weights)
    assert_array_equal(res.clients["mean"], direct.posterior_mean)
    assert_array_equal(res.clients["var"], direct.posterior_var)


@pytest.mark.parametrize("mechanism", [GaussianMechanism(1.0, 1e-5, 2.0, calibration="l2"),
                                       StochasticQuantizer(2, 2.0)],
                         ids=["gaussian", "quantizer"])
@pytest.mark.parametrize("sigma_theta", [None, 0.1])
def test_private_gaussian_equals_theorem2_on_the_same_releases(means, mechanism, sigma_theta,
                                                               monkeypatch):
    cfg = config()
    res = run(EBGaussian(sigma_x=0.5, prior_sd=sigma_theta, mechanism=mechanism), means, cfg)
    x = means.mean
    releases = _replayed(M, cfg.seed, lambda j, g: mechanism.privatize(x[j:j + 1], g)[0])
    assert_array_equal(res.clients["release"], releases)
    monkeypatch.setattr(type(mechanism), "privatize", lambda self, x, rng=None: releases.copy())
    direct = private_gaussian(x, means.count, mechanism, sigma_x=0.5, sigma_theta=sigma_theta)
    assert_array_equal(res.clients["mean"], direct.estimate)
    assert_array_equal(res.clients["weight"], direct.weight)
    assert res.server["prior"]["sd"][0] == direct.sigma_theta


# --------------------------------------------------------------------------- runtimes and faults

PROTOCOLS = {
    "beta": (lambda: EBBetaBinomial(), "counts"),
    "loo_printed": (lambda: EBBetaBinomial(method="loo_printed"), "counts"),
    "loo_corrected": (lambda: EBBetaBinomial(method="loo_corrected"), "counts"),
    "npmle": (lambda: EBBetaBinomial("npmle", n_grid=GRID), "counts"),
    "randomized-response": (lambda: EBBetaBinomial("npmle", n_grid=GRID,
                                                   privacy="randomized-response",
                                                   epsilon=1.0), "counts"),
    "binary": (lambda: EBBetaBinomial(privacy="binary", epsilon=2.0), "counts"),
    "laplace": (lambda: EBBetaBinomial(privacy="laplace", epsilon=2.0), "counts"),
    "gaussian pooled": (lambda: EBGaussian(), "means"),
    "gaussian npmle": (lambda: EBGaussian("npmle", sigma_x=0.5, n_grid=GRID), "means"),
    "gaussian private": (lambda: EBGaussian(sigma_x=0.5, mechanism=StochasticQuantizer(3, 2.0)),
                         "means"),
}


@pytest.mark.parametrize("failures", [None, {0: [3, 50], 1: [7]}], ids=["all", "faults"])
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_stacked_clients_equal_clients_run_one_at_a_time(name, failures, counts, means):
    make, which = PROTOCOLS[name]
    data = {"counts": counts, "means": means}[which]
    cfg = config(n_rounds=3)
    res = run(make(), data, cfg, failures=failures)
    # (the NPMLE posterior's matrix product may round differently for one row: 1e-15)
    assert_same_as_one_at_a_time(res, *one_at_a_time(make(), data, cfg, failures))


def test_messages_are_the_documented_arrays(counts):
    alg, cfg = EBBetaBinomial(), config()
    state = alg.init_clients(cfg, counts, np.arange(M))
    request = alg.broadcast(alg.init_server(cfg), RoundContext(cfg, 0, np.arange(M)))
    assert list(request) == ["request"]
    reply = alg.client_train(request, state, counts, RoundContext(cfg, 0, np.arange(M)))
    assert sorted(reply) == ["successes", "trials"] and tree_nbytes(reply) == 16 * M
    res = run(alg, counts, cfg)
    assert sorted(res.server["prior"]) == ["alpha", "beta", "fit_round"]
    fit_round, posterior_round = res.history
    assert fit_round["bytes_up"] == 16 * M and fit_round["bytes_down"] == 8 * M
    assert posterior_round["bytes_down"] == 24 * M and posterior_round["bytes_up"] == 0


def test_failed_clients_are_left_out_of_the_fit_and_use_the_prior_later(counts):
    failed = [3, 50, 99]
    res = run(EBBetaBinomial(), counts, config(), failures={0: failed})
    others = np.setdiff1d(np.arange(M), failed)
    fit = beta_binomial_eb(counts.successes[others], counts.trials[others])
    assert res.history[-1]["contributors"] == M - 3
    # every client, failed ones included, has Beta(alpha + z, beta + n - z)
    direct = beta_binomial_eb(counts.successes, counts.trials, prior=fit.prior, fix_prior=True)
    assert_array_equal(res.clients["mean"], direct.posterior.mean)
    assert_array_equal(res.clients["sent"][failed], np.nan)


def test_a_client_outside_a_leave_one_out_fit_uses_all_the_others(counts):
    failed = [10]
    res = run(EBBetaBinomial(method="loo_proof"), counts, config(), failures={0: failed})
    others = np.setdiff1d(np.arange(M), failed)
    # clients in the fit: as if the failed client did not exist
    direct = beta_binomial_eb(counts.successes[others], counts.trials[others],
                              method="loo_proof")
    assert_array_equal(res.clients["mean"][others], direct.posterior.mean)
    # the failed client: moments of all m - 1 others (naive), weight n / (u/v + n)
    x = counts.successes / counts.trials
    mu, v = x[others].mean(), x[others].var(ddof=1)
    a = 14 / (mu * (1 - mu) / v + 14)
    assert res.clients["weight"][10] == pytest.approx(a, rel=1e-12)
    assert res.clients["mean"][10] == pytest.approx(a * x[10] + (1 - a) * mu, rel=1e-12)


def test_a_client_failing_in_the_posterior_round_computes_it_next_round(counts):
    res2 = run(EBBetaBinomial(), counts, config(n_rounds=2), failures={1: [4]})
    assert np.isnan(res2.clients["mean"][4]) and res2.history[-1]["answered"] == M - 1
    assert np.isnan(res2.metrics["estimate"][4])
    res3 = run(EBBetaBinomial(), counts, config(n_rounds=3), failures={1: [4]})
    full = run(EBBetaBinomial(), counts, config(n_rounds=2))
    assert_array_equal(res3.clients["mean"], full.clients["mean"])


def test_too_few_replies_postpone_the_fit_and_releases_are_not_redrawn(counts):
    cfg = config(n_rounds=3)
    failures = {0: list(range(1, M))}  # only client 0 replies in round 0
    with pytest.warns(RuntimeWarning, match="asks again"):
        res = run(EBBetaBinomial(privacy="binary", epsilon=1.0), counts, cfg,
                  failures=failures)
    assert res.server["prior"]["fit_round"][0] == 1.0
    assert res.clients["sent"][0] == 1.0 and res.history[-1]["contributors"] == M
    # client 0 resent its round-0 release; the others released in round 1
    x = counts.successes / counts.trials
    mech = BinaryMechanism(1.0)
    first = mech.privatize(x[:1], release_streams(M, cfg.seed, 0)[0])[0]
    later = [mech.privatize(x[j:j + 1], g)[0]
             for j, g in enumerate(release_streams(M, cfg.seed, 1))]
    assert res.clients["release"][0] == first
    assert_array_equal(res.clients["release"][1:], later[1:])
    assert res.server["prior"]["total"][0] == res.clients["release"].sum()


def test_one_round_fits_the_prior_without_posteriors(counts):
    res = run(EBBetaBinomial(), counts, config(n_rounds=1))
    assert "prior" in res.server and np.isnan(res.clients["mean"]).all()
    assert res.history[-1]["answered"] == 0


def test_inputs_are_not_mutated_and_data_are_read_only():
    z, n = np.array([1, 2, 3, 4]), np.array([5, 5, 5, 5])
    data = ClientCounts(z, n, truth=np.full(4, 0.5))
    run(EBBetaBinomial(), data, config(4))
    assert_array_equal(z, [1, 2, 3, 4])
    z[0] = 5
    assert data.successes[0] == 1
    with pytest.raises(ValueError, match="read-only"):
        data.trials[0] = 7


# --------------------------------------------------------------------------- data


def test_client_means_from_samples_and_summaries_agree():
    values = [np.array([1.0, 3.0]), np.array([2.0, 2.0, 5.0]), np.array([4.0])]
    a = ClientMeans.from_samples(Ragged.from_lists(values))
    b = ClientMeans.from_summaries([np.mean(v) for v in values],
                                   [np.std(v, ddof=1) if v.size > 1 else 0.0 for v in values],
                                   [v.size for v in values])
    assert_allclose(a.ssd, b.ssd, rtol=1e-15)
    assert_array_equal(a.mean, b.mean) and a.subset([2, 0]).count.tolist() == [1, 2]


def test_subset_keeps_rows_truth_and_labels():
    data = ClientCounts([1, 2, 3], [4, 4, 4], truth=[0.1, 0.2, 0.3], labels=["a", "b", "c"])
    sub = data.subset([2, 0])
    assert sub.successes.tolist() == [3, 1] and sub.truth.tolist() == [0.3, 0.1]
    assert sub.labels.tolist() == ["c", "a"] and sub.subset([1]).labels.tolist() == ["a"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, error, match", [
    ({"prior": "gamma"}, ValueError, "prior"),
    ({"prior": "npmle", "method": "mle"}, ValueError, "method"),
    ({"method": "bayes"}, ValueError, "method"),
    ({"epsilon": 1.0}, ValueError, "epsilon"),
    ({"privacy": "binary"}, ValueError, "epsilon"),
    ({"privacy": "rappor", "epsilon": 1.0}, ValueError, "privacy"),
    ({"privacy": "randomized-response", "epsilon": 1.0}, ValueError, "prior='npmle'"),
    ({"prior": "npmle", "privacy": "randomized-response", "epsilon": 800.0}, ValueError,
     r"epsilon must lie in \[1e-150, 700\]"),
    ({"prior": "npmle", "privacy": "laplace", "epsilon": 1.0}, ValueError, "prior='beta'"),
    ({"privacy": "binary", "epsilon": -1.0}, ValueError, "epsilon"),
    ({"n_grid": 1}, ValueError, "n_grid"),
    ({"privacy": "laplace", "epsilon": 1.0, "variance": "max"}, ValueError, "variance"),
])
def test_beta_binomial_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        EBBetaBinomial(**kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"prior": "cauchy"}, ValueError, "prior"),
    ({"method": "em"}, ValueError, "method"),
    ({"sigma_x": 0.0}, ValueError, "sigma_x"),
    ({"prior_sd": -1.0}, ValueError, "prior_sd"),
    ({"prior": "npmle", "prior_sd": 1.0}, ValueError, "prior='normal'"),
    ({"mechanism": "gaussian"}, TypeError, "mechanism"),
    ({"mechanism": StochasticQuantizer(2, 1.0)}, ValueError, "sigma_x"),
    ({"mechanism": StochasticQuantizer(2, 1.0), "sigma_x": 1.0, "prior": "npmle"}, ValueError,
     "prior='normal'"),
    ({"mechanism": StochasticQuantizer(2, 1.0), "sigma_x": 1.0, "prior_mean": 0.0}, ValueError,
     "prior_mean"),
])
def test_gaussian_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        EBGaussian(**kwargs)


def test_bad_data_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="successes must not exceed trials"):
        ClientCounts([3, 1], [2, 2])
    with pytest.raises(ValueError, match="truth must have shape"):
        ClientCounts([1, 1], [2, 2], truth=[0.5])
    with pytest.raises(ValueError, match="ssd needs count"):
        ClientMeans([0.0, 1.0], ssd=[1.0, 1.0])
    with pytest.raises(ValueError, match="se must "):
        ClientMeans([0.0, 1.0], se=[0.0, 1.0])
    with pytest.raises(TypeError, match="data must be a ClientMeans"):
        run(EBGaussian(), ClientCounts([1, 1], [2, 2]), config(2))
    with pytest.raises(ValueError, match="neither se nor ssd"):
        run(EBGaussian(), ClientMeans([0.0, 1.0]), config(2))
    with pytest.raises(ValueError, match="data needs count"):
        run(EBGaussian(sigma_x=1.0), ClientMeans([0.0, 1.0], se=1.0), config(2))
    with pytest.raises(ValueError, match="unit must be one of"):
        election_federation(unit="county")


# --------------------------------------------------------------------------- jobs


@pytest.mark.parametrize("settings, kind", [
    ({"algorithm": "eb-beta-binomial"}, (EBBetaBinomial, ClientCounts, None)),
    ({"algorithm": "eb-beta-binomial", "epsilon": "1.5"}, (EBBetaBinomial, ClientCounts,
                                                           "laplace")),
    ({"algorithm": "eb-gaussian", "clients": 20}, (EBGaussian, ClientMeans, None)),
    ({"algorithm": "eb-gaussian", "epsilon": 2.0}, (EBGaussian, ClientMeans, "LaplaceMechanism")),
])
def test_jobs_build_the_protocols_on_simulated_clients(settings, kind):
    from ebfl.flower.jobs import build_job

    job = build_job(settings)
    alg_type, data_type, private = kind
    assert isinstance(job.algorithm, alg_type) and isinstance(job.data, data_type)
    assert job.data.n_clients == int(settings.get("clients", 6))
    config = job.algorithm.config()
    assert (config.get("privacy") or (config.get("mechanism") or {}).get("type")) == private
    res = run(job.algorithm, job.data, job.config)
    assert np.isfinite(res.clients["mean"]).all()


def test_jobs_refuse_private_gaussian_on_election_shares():
    from ebfl.federated.eb import job_algorithm

    with pytest.raises(ValueError, match="needs dataset 'simulated'"):
        job_algorithm({"algorithm": "eb-gaussian", "dataset": "elections", "epsilon": 1.0,
                       "clients": 6})


# --------------------------------------------------------------------------- county elections

needs_elections = requires_data("county-elections")


@pytest.fixture(scope="module")
def elections():
    from ebfl.datasets.elections import election_matrix, load_county_returns

    return election_matrix(load_county_returns(download=False))


@needs_elections
@pytest.mark.parametrize("unit, method", [("election", "loo_printed"), ("vote", "mle")])
def test_counties_as_clients_equal_the_in_process_fit(elections, unit, method):
    data = election_federation(elections, unit=unit, held_out=-1)
    assert data.n_clients == 3150 and data.labels[0].endswith(", AL")
    res = run(EBBetaBinomial(method=method), data, config(data.n_clients))
    direct = beta_binomial_eb(data.successes, data.trials, method=method)
    assert_array_equal(res.clients["mean"], direct.posterior.mean)
    h = res.history[-1]
    if unit == "election":  # five draws per county: pooling helps on the held-out share
        assert h["squared_error"] < 0.95 * h["local_squared_error"]
    else:  # thousands of votes per county: the posterior is the county's own share
        assert np.median(res.clients["weight"]) > 0.99


@needs_elections
def test_county_shares_as_gaussian_clients_equal_gaussian_eb_samples(elections):
    data = election_shares(elections, held_out=0)
    res = run(EBGaussian(), data, config(data.n_clients))
    shares = elections.rep_share[:, 1:]
    direct = gaussian_eb_samples(Ragged.from_counts(shares.reshape(-1),
                                                    np.full(data.n_clients, 5)))
    assert_allclose(res.clients["mean"], direct.posterior.mean, rtol=0, atol=1e-12)
    assert res.server["prior"]["sigma_x"][0] == direct.diagnostics["sigma_x"]
    assert_array_equal(data.truth, elections.rep_share[:, 0])
