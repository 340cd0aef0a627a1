"""The federated protocol (ebfl.federated): streams, sampling, trees, and the in-process runtime.

The runtime is checked on a toy numpy algorithm with closed-form rounds
(:class:`NoisyMean`) and on the torch strategies, each against
:func:`drive_one_client_at_a_time`: the two halves driven as the Flower
runtime drives them, every client alone (K = 1) with its own state, every
message and reply copied as if it had crossed the network.
"""

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from ebfl.federated import FederatedAlgorithm, RoundContext, RunConfig, run, sample_clients
from ebfl.federated.streams import PURPOSES, SERVER, numpy_streams, stream_seed
from ebfl.federated.tree import (
    flatten,
    tree_cat,
    tree_nbytes,
    tree_put,
    tree_take,
    unflatten,
)

# ------------------------------------------------------------------ the Flower-style driver


def drive_one_client_at_a_time(algorithm, data, config, *, failures=None):
    """Run ``algorithm`` as the Flower runtime does: each client alone, K = 1.

    Every client keeps its own persistent state (what a ClientApp keeps in its
    ``Context.state``), receives its own copy of each message and sends a copy
    of its reply; the server stacks the replies in client-id order. A client in
    ``failures[round]`` neither trains, idles nor replies in that round.

    Returns
    -------
    server : dict
    clients : dict
        The clients' states stacked in client-id order (as :func:`run` returns them).
    metrics : dict of name -> ndarray (m,)
        Every client's evaluation under the final server state.
    """
    failures = {} if failures is None else failures
    m = config.n_clients
    alone = [np.array([c]) for c in range(m)]
    server = algorithm.init_server(config)
    clients = [algorithm.init_clients(config, data.subset(ids), ids) for ids in alone]
    weights = np.concatenate([np.asarray(algorithm.client_weights(data.subset(ids)), float)
                              for ids in alone])
    for r in range(config.n_rounds):
        sampled = sample_clients(config, r, everyone=algorithm.all_clients_train)
        failed = set(failures.get(r, ()))
        message = algorithm.broadcast(server, RoundContext(config, r, sampled))
        answered, replies = [], []
        for c in sampled:
            if c in failed:
                continue
            rc = RoundContext(config, r, alone[c])
            reply = algorithm.client_train(copy.deepcopy(message), clients[c],
                                           data.subset(alone[c]), rc)
            answered.append(int(c))
            replies.append(copy.deepcopy(reply))
        if algorithm.trains_idle:
            for c in sorted(set(range(m)) - set(sampled.tolist()) - failed):
                rc = RoundContext(config, r, alone[c])
                idle = copy.deepcopy(algorithm.idle_message(server, rc))
                algorithm.client_idle(idle, clients[c], data.subset(alone[c]), rc)
        if answered:
            server = algorithm.aggregate(server, tree_cat(replies), weights[answered],
                                         RoundContext(config, r, np.array(answered)))
        elif algorithm.aggregate_empty:
            server = algorithm.aggregate(server, None, weights[:0],
                                         RoundContext(config, r, np.zeros(0, np.int64)))
    final = algorithm.evaluation_message(server)
    per_client = [algorithm.client_evaluate(copy.deepcopy(final), clients[c],
                                            data.subset(alone[c])) for c in range(m)]
    metrics = {name: np.concatenate([_numpy(p[name]) for p in per_client])
               for name in per_client[0]}
    return server, tree_cat(clients), metrics


def _numpy(a):
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def assert_trees_close(actual, expected, atol=0.0):
    """Same keys, shapes and dtypes, and every value within ``atol`` (0: bitwise)."""
    a, e = flatten(actual), flatten(expected)
    assert sorted(a) == sorted(e)
    for key in e:
        assert type(a[key]) is type(e[key]), key
        assert tuple(a[key].shape) == tuple(e[key].shape), key
        assert a[key].dtype == e[key].dtype, key
        diff = np.abs(_numpy(a[key]) - _numpy(e[key]))
        assert diff.size == 0 or float(diff.max()) <= atol, (key, float(diff.max()))


# ------------------------------------------------------------------ a toy numpy algorithm


class ArrayClients:
    """Client i holds the rows ``values[i]`` (n, d) and an aggregation weight ``weights[i]``."""

    def __init__(self, values, weights):
        self.values, self.weights = np.asarray(values, float), np.asarray(weights, float)

    @property
    def n_clients(self):
        return self.values.shape[0]

    def subset(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return ArrayClients(self.values[ids], self.weights[ids])


class NoisyMean(FederatedAlgorithm):
    """Each sampled client replies its mean plus N(0, sigma^2 I) from its own stream; the
    server takes the weighted mean of the replies. Clients count the rounds they trained
    (and idled, with ``trains_idle``)."""

    name = "noisy-mean"

    def __init__(self, dim, sigma=0.5, *, idle=False):
        self.dim, self.sigma, self.trains_idle = dim, sigma, idle

    def config(self):
        return {"name": self.name, "sigma": self.sigma, "idle": self.trains_idle}

    def init_server(self, run):
        return {"estimate": np.zeros(self.dim)}

    def init_clients(self, run, data, clients):
        k = len(clients)
        return {"trained": np.zeros(k), "idled": np.zeros(k), "last": np.zeros((k, self.dim))}

    def client_weights(self, data):
        return data.weights

    def broadcast(self, server, rc):
        return {"estimate": server["estimate"]}

    def idle_message(self, server, rc):
        return {"estimate": server["estimate"][:1]}

    def client_train(self, message, client, data, rc):
        rng = numpy_streams(rc.config.seed, rc.round, rc.clients)
        noise = np.stack([g.standard_normal(self.dim) for g in rng])
        local = data.values.mean(axis=1) + self.sigma * noise
        client["trained"] += 1
        client["last"][:] = local
        return {"local": local}

    def client_idle(self, message, client, data, rc):
        client["idled"] += 1

    def aggregate(self, server, replies, weights, rc):
        return {"estimate": np.average(replies["local"], axis=0, weights=weights)}

    def evaluation_message(self, server):
        return {"estimate": server["estimate"]}

    def summary(self, server):
        return {"estimate_0": float(server["estimate"][0])}

    def client_evaluate(self, message, client, data):
        err = np.abs(message["estimate"] - data.values.mean(axis=1)).mean(axis=1)
        return {"error": err, "trained": client["trained"].copy()}


DIM = 3


def _toy_data(m=8, n=5, seed=0):
    rng = np.random.default_rng(seed)
    return ArrayClients(rng.normal(size=(m, n, DIM)) + np.arange(m)[:, None, None],
                        rng.uniform(1, 3, size=m))


def _expected_estimate(data, sigma, seed, round_, ids):
    """The server's estimate after a round in which clients ``ids`` replied: by hand."""
    local = [data.values[c].mean(0) + sigma * np.random.default_rng(
        stream_seed(seed, round_, c)).standard_normal(DIM) for c in ids]
    return np.average(local, axis=0, weights=data.weights[list(ids)])


# ------------------------------------------------------------------ streams


def test_stream_seeds_are_distinct_across_seed_round_client_and_purpose():
    keys = [(s, r, c, p) for s in (0, 1, 2**40) for r in range(6) for c in range(SERVER, 12)
            for p in PURPOSES]
    seeds = [stream_seed(*k) for k in keys]
    assert len(set(seeds)) == len(keys)
    assert all(0 <= s < 2**64 for s in seeds)
    # the top bit is used: the 64-bit range is not halved
    assert any(s >= 2**63 for s in seeds) and any(s < 2**63 for s in seeds)


def test_stream_seeds_do_not_depend_on_call_order():
    keys = [(7, r, c, "round") for r in range(4) for c in range(SERVER, 9)]
    forward = {k: stream_seed(*k) for k in keys}
    backward = {k: stream_seed(*k) for k in reversed(keys)}
    assert forward == backward
    # a client's generator gives the same draws whoever else is in the stack, in any order
    alone = numpy_streams(7, 2, [5])[0].standard_normal(4)
    for clients in ([5, 1, 3], [3, 5], [0, 1, 2, 3, 4, 5]):
        gens = numpy_streams(7, 2, clients)
        np.testing.assert_array_equal(gens[clients.index(5)].standard_normal(4), alone)


def test_neighbouring_streams_are_uncorrelated():
    n = 4000  # the first draw of neighbouring clients' streams, and of neighbouring rounds
    first = np.array([numpy_streams(0, 0, [c])[0].random() for c in range(n + 1)])
    by_round = np.array([numpy_streams(0, r, [0])[0].random() for r in range(n)])
    for u in (first, by_round):
        # uniform on [0, 1) (Kolmogorov-Smirnov) and lag-1 correlation within 4 standard
        # errors (1 / sqrt(n)) of 0
        assert stats.kstest(u, "uniform").pvalue > 1e-3
        assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 4 / np.sqrt(n)


def test_torch_generators_accept_every_stream_seed():
    torch = pytest.importorskip("torch")
    from ebfl.learning.torch.functional import client_generators

    seeds = [stream_seed(3, 0, c) for c in range(40)]
    assert max(seeds) >= 2**63  # a seed in the top half of the range
    gens = client_generators(seeds)
    draws = torch.stack([torch.rand(3, generator=g) for g in gens])
    assert len({tuple(d.tolist()) for d in draws}) == len(seeds)


# ------------------------------------------------------------------ client sampling


def test_sample_clients_is_deterministic_sorted_and_without_replacement():
    cfg = RunConfig(n_clients=20, n_rounds=50, clients_per_round=6, seed=3)
    draws = [sample_clients(cfg, r) for r in range(50)]
    for r, ids in enumerate(draws):
        assert ids.dtype.kind == "i" and ids.shape == (6,)
        assert np.all(np.diff(ids) > 0)  # sorted, K distinct
        assert 0 <= ids.min() and ids.max() < 20
        np.testing.assert_array_equal(sample_clients(cfg, r), ids)
    assert len({tuple(d) for d in draws}) > 40  # rounds differ
    other = RunConfig(n_clients=20, n_rounds=50, clients_per_round=6, seed=4)
    assert any(not np.array_equal(sample_clients(other, r), draws[r]) for r in range(50))
    np.testing.assert_array_equal(sample_clients(cfg, 0, everyone=True), np.arange(20))
    full = RunConfig(n_clients=20, n_rounds=1)
    np.testing.assert_array_equal(sample_clients(full, 0), np.arange(20))


def test_sample_clients_frequencies_are_uniform():
    m, k, n_rounds = 10, 3, 3000
    cfg = RunConfig(n_clients=m, n_rounds=n_rounds, clients_per_round=k, seed=0)
    hits = np.zeros(m)
    pairs = np.zeros((m, m))
    for r in range(n_rounds):
        ids = sample_clients(cfg, r)
        hits[ids] += 1
        pairs[np.ix_(ids, ids)] += 1
    # Counts of K-of-m sampling without replacement have covariance
    # R p (1 - p) m / (m - 1) (I - 11'/m), p = K/m, so this statistic is chi^2(m - 1).
    p = k / m
    stat = (m - 1) / m * np.sum((hits - n_rounds * p) ** 2) / (n_rounds * p * (1 - p))
    assert stats.chi2.sf(stat, m - 1) > 1e-3, (hits, stat)
    # every pair together with probability K(K-1)/(m(m-1)): 45 binomial counts, each within
    # 4 standard errors (false-alarm rate ~ 45 * 6e-5 for a uniform sampler)
    q = k * (k - 1) / (m * (m - 1))
    together = pairs[np.triu_indices(m, 1)]
    z = (together - n_rounds * q) / np.sqrt(n_rounds * q * (1 - q))
    assert np.max(np.abs(z)) < 4, z


# ------------------------------------------------------------------ RunConfig and RoundContext


@pytest.mark.parametrize(("name", "value", "exc"), [
    ("n_clients", 0, ValueError), ("n_clients", "3", TypeError), ("n_clients", True, TypeError),
    ("n_rounds", -1, ValueError), ("n_rounds", 1.5, TypeError),
    ("clients_per_round", 0, ValueError), ("clients_per_round", 5, ValueError),
    ("seed", -1, ValueError), ("seed", 2**64, ValueError), ("seed", "0", TypeError),
    ("local_steps", 0, ValueError), ("batch_size", 0, ValueError),
    ("iters_per_epoch", 0, ValueError), ("eval_every", 0, ValueError),
    ("lr_decay", 0.0, ValueError), ("lr_decay", 1.5, ValueError),
    ("lr_decay", float("nan"), ValueError), ("lr_decay", "1", TypeError),
])
def test_run_config_refuses_bad_values_by_name(name, value, exc):
    kw = {"n_clients": 4, "n_rounds": 2, name: value}
    with pytest.raises(exc, match=name):
        RunConfig(**kw)


def test_run_config_normalizes_and_round_trips():
    cfg = RunConfig(n_clients=np.int64(5), n_rounds=np.int32(3), seed=2**64 - 1, lr_decay=0.5)
    assert cfg.clients_per_round == 5 and type(cfg.n_clients) is int and type(cfg.n_rounds) is int
    assert RunConfig(**cfg.to_dict()) == cfg
    with pytest.raises(AttributeError):
        cfg.n_rounds = 4  # frozen: every participant sees the same configuration


def test_round_context_seeds_and_learning_rate_schedule():
    cfg = RunConfig(n_clients=6, n_rounds=5, seed=9, local_steps=4, iters_per_epoch=6,
                    lr_decay=0.5)
    rc = RoundContext(cfg, 2, np.array([4, 1]))
    assert rc.seeds() == [stream_seed(9, 2, 4), stream_seed(9, 2, 1)]
    assert rc.seeds("evaluate") == [stream_seed(9, 2, 4, "evaluate"),
                                    stream_seed(9, 2, 1, "evaluate")]
    # iteration t = round * tau + step = 8, 9, 10, 11: epochs 1, 1, 1, 1 at 6 per epoch;
    # round 3's steps are iterations 12.. (epoch 2)
    assert [rc.lr_scale(s) for s in range(4)] == [0.5] * 4
    assert RoundContext(cfg, 3, rc.clients).lr_scale(0) == 0.25
    assert RoundContext(cfg, 1, rc.clients).lr_scale(1) == 1.0  # iteration 5
    assert RoundContext(cfg, 1, rc.clients).lr_scale(2) == 0.5  # iteration 6


def test_the_base_class_defaults_and_required_methods():
    alg, cfg = FederatedAlgorithm(), RunConfig(n_clients=2, n_rounds=1)
    rc = RoundContext(cfg, 0, np.arange(2))
    data = _toy_data(m=2)
    assert alg.idle_message({}, rc) == {} and alg.evaluation_message({}) == {}
    assert alg.summary({}) == {} and alg.config() == {"name": "algorithm"}
    np.testing.assert_array_equal(alg.client_weights(data), np.ones(2))
    for call in (lambda: alg.init_server(cfg), lambda: alg.broadcast({}, rc),
                 lambda: alg.aggregate({}, {}, np.ones(2), rc),
                 lambda: alg.init_clients(cfg, data, np.arange(2)),
                 lambda: alg.client_train({}, {}, data, rc),
                 lambda: alg.client_evaluate({}, {}, data)):
        with pytest.raises(NotImplementedError):
            call()


# ------------------------------------------------------------------ trees


def _numpy_tree():
    rng = np.random.default_rng(0)
    return {"a": rng.normal(size=(4, 3)).astype(np.float32),
            "b": {"c": np.arange(4, dtype=np.int64), "d": {"e": rng.normal(size=(4, 2, 2))}},
            "net.1.weight": rng.normal(size=(4, 5))}


def _torch_tree():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn((4, 3), generator=gen),
            "b": {"c": torch.arange(4), "d": {"e": torch.randn((4, 2, 2), generator=gen,
                                                               dtype=torch.float64)}},
            "net.1.weight": torch.randn((4, 5), generator=gen)}


@pytest.mark.parametrize("make", [_numpy_tree, _torch_tree], ids=["numpy", "torch"])
def test_flatten_unflatten_round_trip(make):
    tree = make()
    flat = flatten(tree)
    assert sorted(flat) == ["a", "b/c", "b/d/e", "net.1.weight"]
    back = unflatten(flat)
    assert_trees_close(back, tree)
    assert back["b"]["d"]["e"] is tree["b"]["d"]["e"]  # no copy: a view of the same arrays
    with pytest.raises(ValueError, match="/"):
        flatten({"a/b": np.zeros(1)})


@pytest.mark.parametrize("make", [_numpy_tree, _torch_tree], ids=["numpy", "torch"])
def test_take_put_cat(make):
    tree = make()
    original = copy.deepcopy(tree)
    rows = tree_take(tree, [3, 1])
    assert_trees_close(rows, {"a": tree["a"][[3, 1]], "b": {"c": tree["b"]["c"][[3, 1]],
                              "d": {"e": tree["b"]["d"]["e"][[3, 1]]}},
                              "net.1.weight": tree["net.1.weight"][[3, 1]]})
    rows["a"][0] = 99  # a copy: the stack is untouched
    assert_trees_close(tree, original)
    # one-row stacks concatenated in order give the stack back
    assert_trees_close(tree_cat([tree_take(tree, [i]) for i in range(4)]), tree)
    new = tree_take(make(), [0, 0])
    new["b"]["c"][:] = 7
    tree_put(tree, [2, 0], new)  # in place, rows 2 and 0 only
    for key, value in flatten(tree).items():
        before, put = _numpy(flatten(original)[key]), _numpy(flatten(new)[key])
        np.testing.assert_array_equal(_numpy(value)[[2, 0]], put)
        np.testing.assert_array_equal(_numpy(value)[[1, 3]], before[[1, 3]])


_KEYS = st.text(alphabet="abc.1_", min_size=1, max_size=4)


def _stacks(k):
    """Nested dicts of float64 stacks of k rows (any trailing shape), up to 3 levels deep."""
    leaf = st.tuples(st.lists(st.integers(1, 3), max_size=2), st.integers(0, 2**32 - 1)).map(
        lambda a: np.random.default_rng(a[1]).normal(size=(k, *a[0])))
    return st.recursive(leaf, lambda inner: st.dictionaries(_KEYS, inner, min_size=1,
                                                            max_size=3), max_leaves=8).filter(
        lambda t: isinstance(t, dict))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tree=_stacks(3), order=st.permutations([0, 1, 2]))
def test_tree_round_trips_on_random_nested_stacks(tree, order):
    assert_trees_close(unflatten(flatten(tree)), tree)
    # rows taken in any order and put back where they came from restore the stack
    rows = tree_take(tree, order)
    rebuilt = unflatten({key: np.zeros_like(v) for key, v in flatten(tree).items()})
    tree_put(rebuilt, order, rows)
    assert_trees_close(rebuilt, tree)
    assert_trees_close(tree_cat([tree_take(tree, [i]) for i in order]), rows)
    assert tree_nbytes(tree) == sum(v.nbytes for v in flatten(tree).values())


def test_tree_nbytes_counts_the_array_payload():
    torch = pytest.importorskip("torch")
    assert tree_nbytes({}) == 0
    assert tree_nbytes(_numpy_tree()) == 4 * 3 * 4 + 4 * 8 + 4 * 2 * 2 * 8 + 4 * 5 * 8
    assert tree_nbytes(_torch_tree()) == 4 * 3 * 4 + 4 * 8 + 4 * 2 * 2 * 8 + 4 * 5 * 4
    assert tree_nbytes({"psi": torch.tensor(2.0), "n": np.float64(1.0)}) == 4 + 8
    # a strided view counts its elements, not its base
    assert tree_nbytes({"v": torch.zeros(10, 10)[:, 0]}) == 40


# ------------------------------------------------------------------ the runtime on NoisyMean


def test_noisy_mean_rounds_follow_the_closed_form():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=3, clients_per_round=3, seed=5)
    for n_rounds in (1, 2, 3):
        res = run(NoisyMean(DIM), data, RunConfig(**{**cfg.to_dict(), "n_rounds": n_rounds}))
        r = n_rounds - 1
        expect = _expected_estimate(data, 0.5, 5, r, sample_clients(cfg, r))
        np.testing.assert_allclose(res.server["estimate"], expect, rtol=1e-12, atol=1e-12)
    trained = sum(np.isin(np.arange(8), sample_clients(cfg, r)) for r in range(3))
    np.testing.assert_array_equal(res.clients["trained"], trained)
    np.testing.assert_array_equal(res.metrics["trained"], trained)


def test_failed_clients_keep_their_state_and_the_server_aggregates_the_others():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=3, clients_per_round=4, seed=11)
    sampled = sample_clients(cfg, 1)
    failed = int(sampled[1])
    bystander = int(np.setdiff1d(np.arange(8), sampled)[0])  # fails while not sampled
    failures = {1: [failed, bystander]}

    def upto(n_rounds, failures=failures):  # the failures of the rounds run (others are refused)
        return run(NoisyMean(DIM), data, RunConfig(**{**cfg.to_dict(), "n_rounds": n_rounds}),
                   failures=failures and {r: c for r, c in failures.items() if r < n_rounds})

    before, after, full = upto(1), upto(2), upto(3)
    assert [h["clients"] for h in full.history] == [4, 4, 4]
    assert [h["replies"] for h in full.history] == [4, 3, 4]
    # the failed client's state is as before the round; the others' moved
    for key in ("trained", "last"):
        np.testing.assert_array_equal(after.clients[key][failed], before.clients[key][failed])
    others = [int(c) for c in sampled if c != failed]
    assert np.all(after.clients["trained"][others] == before.clients["trained"][others] + 1)
    # the server aggregates exactly the replies of the others ...
    expect = _expected_estimate(data, 0.5, 11, 1, others)
    np.testing.assert_allclose(after.server["estimate"], expect, rtol=1e-12, atol=1e-12)
    with_failed = _expected_estimate(data, 0.5, 11, 1, sampled)
    assert not np.allclose(after.server["estimate"], with_failed)
    # ... and the other rounds are untouched by the failure
    no_failure = upto(3, failures=None)
    assert full.history[0] == no_failure.history[0]
    # all sampled clients failing: nothing to aggregate, the server keeps its state
    none_left = upto(2, failures={1: sampled.tolist()})
    assert none_left.history[1]["replies"] == 0 and none_left.history[1]["bytes_up"] == 0
    np.testing.assert_array_equal(none_left.server["estimate"], before.server["estimate"])


def test_failed_unsampled_clients_do_not_idle():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=2, clients_per_round=3, seed=2)
    unsampled = np.setdiff1d(np.arange(8), sample_clients(cfg, 1))
    res = run(NoisyMean(DIM, idle=True), data, cfg, failures={1: [int(unsampled[0])]})
    idled = sum(~np.isin(np.arange(8), sample_clients(cfg, r)) for r in range(2))
    idled[unsampled[0]] -= 1
    np.testing.assert_array_equal(res.clients["idled"], idled)


def test_traffic_is_the_message_bytes_per_client_and_the_reply_bytes():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=3, clients_per_round=3, seed=1)
    failed = int(sample_clients(cfg, 2)[0])
    res = run(NoisyMean(DIM, idle=True), data, cfg, failures={2: [failed]})
    # broadcast: DIM float64 to 3 clients; idle message: 1 float64 to the 5 others;
    # replies: DIM float64 from each client that answered
    assert [h["bytes_down"] for h in res.history] == [3 * DIM * 8 + 5 * 8] * 3
    assert [h["bytes_up"] for h in res.history] == [3 * DIM * 8, 3 * DIM * 8, 2 * DIM * 8]


def test_history_rows_and_evaluation_schedule():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=5, clients_per_round=2, seed=0, local_steps=3,
                    eval_every=2)
    res = run(NoisyMean(DIM), data, cfg)
    assert [h["round"] for h in res.history] == [2, 4, 5]  # every 2 rounds, and the last
    assert [h["iteration"] for h in res.history] == [6, 12, 15]
    last = res.history[-1]
    err = res.metrics["error"]
    assert last["error"] == pytest.approx(err.mean(), rel=1e-12)
    assert last["error_sd"] == pytest.approx(err.std(ddof=1), rel=1e-12)
    assert last["answered"] == 8
    assert last["estimate_0"] == float(res.server["estimate"][0])
    assert res.config == cfg.to_dict()


def test_the_runtime_equals_the_one_client_at_a_time_driver_on_numpy():
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=4, clients_per_round=3, seed=6)
    failures = {2: [int(sample_clients(cfg, 2)[0])]}
    for idle in (False, True):
        res = run(NoisyMean(DIM, idle=idle), data, cfg, failures=failures)
        server, clients, metrics = drive_one_client_at_a_time(NoisyMean(DIM, idle=idle), data,
                                                              cfg, failures=failures)
        assert_trees_close(res.server, server)
        assert_trees_close(res.clients, clients)
        assert_trees_close(res.metrics, metrics)


def test_run_leaves_its_inputs_alone():
    data = _toy_data()
    values, weights = data.values.copy(), data.weights.copy()
    failures = {0: [1]}
    run(NoisyMean(DIM), data, RunConfig(n_clients=8, n_rounds=2, clients_per_round=4),
        failures=failures)
    np.testing.assert_array_equal(data.values, values)
    np.testing.assert_array_equal(data.weights, weights)
    assert failures == {0: [1]}


class _Crash(Exception):
    pass


def test_a_run_resumed_from_its_checkpoint_after_a_crash_equals_the_uninterrupted_run(tmp_path):
    data = _toy_data()
    cfg = RunConfig(n_clients=8, n_rounds=6, clients_per_round=3, seed=8, eval_every=2)
    failures = {3: [int(sample_clients(cfg, 3)[0])]}
    full = run(NoisyMean(DIM), data, cfg, failures=failures)

    crashing = NoisyMean(DIM)
    aggregate = crashing.aggregate

    def crash_in_round_4(server, replies, weights, rc):
        if rc.round == 4:
            raise _Crash
        return aggregate(server, replies, weights, rc)

    crashing.aggregate = crash_in_round_4
    ckpt = tmp_path / "run.pkl"
    with pytest.raises(_Crash):
        run(crashing, data, cfg, failures=failures, checkpoint=ckpt, checkpoint_every=1)
    with open(ckpt, "rb") as fh:
        assert pickle.load(fh)["round"] == 4  # rounds 0..3 done and saved
    resumed = run(NoisyMean(DIM), data, cfg, failures=failures, checkpoint=ckpt)
    assert resumed.history == full.history
    assert_trees_close(resumed.server, full.server)
    assert_trees_close(resumed.clients, full.clients)
    assert_trees_close(resumed.metrics, full.metrics)

    with pytest.raises(ValueError, match="another configuration"):
        run(NoisyMean(DIM, sigma=0.4), data, cfg, failures=failures, checkpoint=ckpt)
    with pytest.raises(ValueError, match="another configuration"):
        run(NoisyMean(DIM), data, cfg, failures=None, checkpoint=ckpt)
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        run(NoisyMean(DIM), data, cfg, checkpoint=ckpt)


@pytest.mark.parametrize(("kwargs", "exc", "pattern"), [
    (dict(algorithm="fedavg"), TypeError, "algorithm"),
    (dict(config={"n_clients": 8}), TypeError, "config"),
    (dict(data=_toy_data(m=5)), ValueError, "n_clients"),
    (dict(failures=[1, 2]), TypeError, "failures"),
    (dict(failures={-1: [0]}), ValueError, "failures round"),
    (dict(failures={0: [-2]}), ValueError, "failures client"),
    (dict(failures={0: [0.5]}), TypeError, "failures client"),
    (dict(checkpoint=3), TypeError, "checkpoint"),
    (dict(checkpoint_every=0), ValueError, "checkpoint_every"),
    (dict(progress="yes"), TypeError, "progress"),
])
def test_run_refuses_bad_input_by_name(kwargs, exc, pattern):
    call = dict(algorithm=NoisyMean(DIM), data=_toy_data(),
                config=RunConfig(n_clients=8, n_rounds=1))
    call.update(kwargs)
    with pytest.raises(exc, match=pattern):
        run(call.pop("algorithm"), call.pop("data"), call.pop("config"), **call)


# ------------------------------------------------------------------ the torch strategies


def _digits(m=6):
    """load_digits in m IID clients of 200 training examples (the rest tests)."""
    pytest.importorskip("torch")
    from sklearn.datasets import load_digits

    from ebfl.learning.torch import FederatedDataset

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), m)
    return FederatedDataset.from_clients([x[p[:200]] for p in parts], [y[p[:200]] for p in parts],
                                         [x[p[200:]] for p in parts], [y[p[200:]] for p in parts],
                                         n_classes=10)


def _strategy(name):
    from ebfl.generative.algorithm import AdaPeD, DPAdaPeD
    from ebfl.learning.torch import FedAvg, Local, LogisticModel

    model = LogisticModel(64, 10)
    return {"FedAvg": lambda: FedAvg(model),
            "Local": lambda: Local(model),
            "AdaPeD": lambda: AdaPeD(model),
            "AdaPeD-FT": lambda: AdaPeD(model, fine_tune=True),
            "DP-AdaPeD": lambda: DPAdaPeD(model, clip_mu=1.0, noise_mu=0.1, clip_psi=0.5,
                                          noise_psi=0.05),
            "DP-AdaPeD-concat": lambda: DPAdaPeD(model, clip_mu=1.0, noise_mu=0.1,
                                                 concatenate=True, fine_tune=True)}[name]()


STRATEGIES = ["FedAvg", "Local", "AdaPeD", "AdaPeD-FT", "DP-AdaPeD", "DP-AdaPeD-concat"]
#: 3 of 6 clients per round, 5 local steps, the learning rate halved every 4 iterations
TORCH_RUN = dict(n_clients=6, n_rounds=3, clients_per_round=3, local_steps=5, batch_size=10,
                 iters_per_epoch=4, lr_decay=0.5, seed=2)


@pytest.mark.parametrize("name", STRATEGIES)
def test_in_process_run_equals_one_client_at_a_time(name):
    data = _digits()
    cfg = RunConfig(**TORCH_RUN)
    res = run(_strategy(name), data, cfg)
    server, clients, metrics = drive_one_client_at_a_time(_strategy(name), data, cfg)
    # the protocol's promise: the same to 1e-6 (here it is bitwise, 0.0)
    assert_trees_close(res.server, server, atol=1e-6)
    assert_trees_close(res.clients, clients, atol=1e-6)
    assert_trees_close(res.metrics, metrics, atol=1e-6)
    # and the run trained: the states left their initial values
    alg = _strategy(name)
    start = flatten({**alg.init_server(cfg), **alg.init_clients(cfg, data, np.arange(6))})
    end = flatten({**res.server, **res.clients})
    assert all(not np.array_equal(_numpy(end[key]), _numpy(start[key])) for key in start)


@pytest.mark.parametrize("name", ["FedAvg", "AdaPeD-FT"])
def test_in_process_run_with_failures_equals_one_client_at_a_time(name):
    data = _digits()
    cfg = RunConfig(**TORCH_RUN)
    failures = {1: [int(sample_clients(cfg, 1)[0]), int(np.setdiff1d(
        np.arange(6), sample_clients(cfg, 1))[0])]}
    res = run(_strategy(name), data, cfg, failures=failures)
    server, clients, metrics = drive_one_client_at_a_time(_strategy(name), data, cfg,
                                                          failures=failures)
    assert_trees_close(res.server, server, atol=1e-6)
    assert_trees_close(res.clients, clients, atol=1e-6)
    assert_trees_close(res.metrics, metrics, atol=1e-6)
    assert res.history[1]["replies"] == 2


def _leaves(tree):
    return list(flatten(tree).values())


@pytest.mark.parametrize("name", STRATEGIES)
def test_messages_and_states_are_arrays_and_client_halves_mutate_no_message(name):
    torch = pytest.importorskip("torch")
    data = _digits()
    cfg = RunConfig(**TORCH_RUN)
    alg = _strategy(name)
    ids = sample_clients(cfg, 0, everyone=alg.all_clients_train)
    k = ids.size
    rc = RoundContext(cfg, 0, ids)
    server = alg.init_server(cfg)
    clients = alg.init_clients(cfg, data, ids)
    message = alg.broadcast(server, rc)
    server_before, message_before = copy.deepcopy(server), copy.deepcopy(message)
    reply = alg.client_train(message, clients, data.subset(ids), rc)
    assert_trees_close(message, message_before)
    assert_trees_close(server, server_before)
    new_server = alg.aggregate(server, reply, alg.client_weights(data.subset(ids)), rc)
    assert_trees_close(server, server_before)  # aggregate returns a new state
    for tree in (server, new_server, message, reply, clients, alg.evaluation_message(server),
                 alg.idle_message(server, rc)):
        assert all(isinstance(v, torch.Tensor) for v in _leaves(tree))
    for tree in (reply, clients):  # stacks: one row per client
        assert all(v.shape[0] == k for v in _leaves(tree))


def test_fedavg_traffic_is_counted_by_hand():
    from ebfl.learning.torch import FedAvg, LogisticModel

    data = _digits()
    cfg = RunConfig(**TORCH_RUN)
    failed = int(sample_clients(cfg, 2)[1])
    res = run(FedAvg(LogisticModel(64, 10)), data, cfg, failures={2: [failed]})
    model_bytes = (64 * 10 + 10) * 4  # one float32 weight matrix and bias: 2600 bytes
    assert [h["bytes_down"] for h in res.history] == [3 * model_bytes] * 3
    assert [h["bytes_up"] for h in res.history] == [3 * model_bytes, 3 * model_bytes,
                                                    2 * model_bytes]
