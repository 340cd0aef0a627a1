"""FedHDP (Algorithm 2): adaptive clipping, group-wise noisy means, group weights, Ditto.

The server's round is checked against an independent reconstruction from the
same noise draws; the clip norm's direction and the noise's calibration to the
round's S (what Flower 1.41's wrapper gets wrong) are tested directly; the
client half against a single-client loop; the two runtimes against each other.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ebfl.federated import RoundContext, RunConfig  # noqa: E402
from ebfl.federated.streams import SERVER, stream_seed  # noqa: E402
from ebfl.fedhdp.aggregation import (  # noqa: E402
    group_weights,
    noisy_unclipped_fraction,
    update_clip_norm,
)
from ebfl.fedhdp.algorithm import (  # noqa: E402
    FedHDP,
    dp_fedavg_ditto,
    hdp_fedavg_ditto,
    non_private_ditto,
)
from ebfl.learning.torch import MLP, LogisticModel, train  # noqa: E402
from ebfl.learning.torch.functional import replicate  # noqa: E402
from ebfl.privacy.accounting.dp_fedavg import adaptive_clipping_noise  # noqa: E402
from tests.test_federated import assert_trees_close, drive_one_client_at_a_time  # noqa: E402
from tests.test_torch_engine import _digits_clients  # noqa: E402

GROUPS = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1])  # 3 opt out, 9 private


@pytest.fixture(scope="module")
def digits():
    """load_digits in 12 clients, in float64 so that the comparisons can be tight."""
    import dataclasses

    d = _digits_clients()
    return dataclasses.replace(d, x_train=d.x_train.double(), x_test=d.x_test.double())


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model():
    return LogisticModel(64, 10).double()


def _server(alg, config, clip):
    server = alg.init_server(config)
    server["clip"] = torch.tensor(clip, dtype=torch.float64)
    return server


def _replies(deltas, unclipped):
    """Replies of len(deltas) clients: ``deltas`` is a list of parameter dicts."""
    stack = {n: torch.stack([d[n] for d in deltas]) for n in deltas[0]}
    return {"delta": stack, "unclipped": torch.as_tensor(unclipped, dtype=torch.float32)}


# --- the server's arithmetic -----------------------------------------------------------------

def test_group_weights_are_hdp_fedavg_at_r1_and_ignore_private_clients_at_r0():
    counts = np.array([5.0, 95.0])
    np.testing.assert_allclose(group_weights(counts, [1, 1]), counts / counts.sum())
    np.testing.assert_array_equal(group_weights(counts, [1, 0]), [1.0, 0.0])
    r = 0.01
    np.testing.assert_allclose(group_weights(counts, [1, r]),
                               [5 / (5 + r * 95), r * 95 / (5 + r * 95)])
    # l groups, eq. (64): r_i N_i / sum_k r_k N_k
    np.testing.assert_allclose(group_weights([2, 3, 5], [1, 0.5, 0.1]),
                               np.array([2, 1.5, 0.5]) / 4.0)
    assert group_weights([0, 0], [1, 1]).tolist() == [0.0, 0.0]


def test_clip_norm_moves_up_when_most_updates_are_clipped_and_down_when_few_are():
    s = 0.5
    assert update_clip_norm(s, 0.1, 0.2, 0.5) > s  # 90 % clipped: S grows
    assert update_clip_norm(s, 0.9, 0.2, 0.5) < s  # 10 % clipped: S shrinks
    assert update_clip_norm(s, 0.5, 0.2, 0.5) == s
    np.testing.assert_allclose(update_clip_norm(s, 0.1, 0.2, 0.5), s * math.exp(0.2 * 0.4))
    # the count is centred as Andrew et al.: sum(b - 1/2) + noise, / n, + 1/2
    assert noisy_unclipped_fraction([1, 1, 0, 0], 4, 0.0) == 0.5
    assert noisy_unclipped_fraction([1, 1, 1, 0], 4, 2.0) == pytest.approx(0.75 + 0.5)


def _round_by_hand(alg, server, replies, ids, config, round_):
    """Algorithm 2's server step written out: group means + N(0, (z_i S^t / N_i)^2), weighted
    sum, then S^{t+1} from the noisy unclipped fraction. Noise draws in the strategy's
    documented order (per parameter, one per group; then the count)."""
    gen = torch.Generator().manual_seed(stream_seed(config.seed, round_, SERVER, "aggregate"))
    s = float(server["clip"])
    g = alg.groups[ids]
    counts = np.bincount(g, minlength=alg.n_groups).astype(float)
    sigma_b = alg.count_noise
    z = np.array([adaptive_clipping_noise(v, sigma_b) for v in alg.noise_multiplier])
    w = counts * alg.ratio / (counts * alg.ratio).sum()
    new = {}
    for name, p in server["global"].items():
        noise = torch.randn((alg.n_groups, *p.shape), generator=gen, dtype=p.dtype)
        step = torch.zeros_like(p)
        for i in range(alg.n_groups):
            if counts[i]:
                mean = replies["delta"][name][g == i].mean(0)
                step += w[i] * (mean + z[i] * s / counts[i] * noise[i])
        new[name] = p + step
    count_noise = float(torch.randn((), generator=gen, dtype=torch.float64)) * sigma_b
    b = replies["unclipped"].double().numpy()
    frac = (np.sum(b - 0.5) + count_noise) / len(ids) + 0.5
    return new, s * math.exp(-alg.clip_lr * (frac - alg.target_quantile))


def test_server_round_equals_algorithm_2_and_noise_uses_this_rounds_clip_norm():
    model = _model()
    alg = FedHDP(model, GROUPS, ratio=0.3, noise_multiplier=[0.0, 1.2], clip=0.7,
                 count_noise=2.0)
    config = RunConfig(n_clients=GROUPS.size, n_rounds=3, seed=5, clients_per_round=6)
    server = _server(alg, config, 0.7)
    ids = np.array([0, 2, 4, 5, 8, 11])
    gen = torch.Generator().manual_seed(0)
    deltas = [{n: 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
               for n, p in server["global"].items()} for _ in ids]
    unclipped = [1, 0, 0, 1, 0, 0]
    replies = _replies(deltas, unclipped)
    out = alg.aggregate(server, replies, np.ones(ids.size), RoundContext(config, 2, ids))
    expected, clip = _round_by_hand(alg, server, replies, ids, config, 2)
    for n in expected:
        torch.testing.assert_close(out["global"][n], expected[n], rtol=0, atol=1e-12)
    assert float(out["clip"]) == pytest.approx(clip, rel=1e-12)
    # the noise is calibrated to S^t (0.7), not to S^{t+1}: rerun from a different S^t and
    # the private group's noise scales with it
    server2 = _server(alg, config, 1.4)
    zero = _replies([{n: torch.zeros_like(p) for n, p in server["global"].items()}
                     for _ in ids], unclipped)
    a = alg.aggregate(server, zero, np.ones(ids.size), RoundContext(config, 2, ids))
    b = alg.aggregate(server2, zero, np.ones(ids.size), RoundContext(config, 2, ids))
    for n, p in server["global"].items():
        torch.testing.assert_close(b["global"][n] - p, 2 * (a["global"][n] - p), rtol=1e-12,
                                   atol=1e-15)


def test_noise_standard_deviation_matches_z_delta_s_over_n():
    """Zero updates: the global model moves by w_p z_Delta S / N_p times N(0, 1), per
    coordinate; its sample sd over many coordinates and rounds matches (4 standard errors)."""
    model = MLP(64, 10, hidden=(32,)).double()
    alg = FedHDP(model, GROUPS, ratio=1.0, noise_multiplier=[0.0, 1.5], clip=0.5, adaptive=False)
    config = RunConfig(n_clients=GROUPS.size, n_rounds=1, seed=1, clients_per_round=6)
    server = _server(alg, config, 0.5)
    ids = np.array([0, 3, 5, 6, 9, 10])  # 1 non-private, 5 private
    zero = _replies([{n: torch.zeros_like(p) for n, p in server["global"].items()}
                     for _ in ids], np.ones(ids.size))
    moves = []
    for r in range(20):
        out = alg.aggregate(server, zero, np.ones(ids.size), RoundContext(config, r, ids))
        moves += [(out["global"][n] - p).reshape(-1) for n, p in server["global"].items()]
    moves = torch.cat(moves).numpy()
    expected = (5 / 6) * 1.5 * 0.5 / 5  # w_p z S / N_p, no adaptive clipping: z_Delta = z
    se = expected / math.sqrt(2 * moves.size)
    assert abs(moves.std() - expected) < 4 * se
    assert abs(moves.mean()) < 4 * expected / math.sqrt(moves.size)


def test_r0_private_clients_neither_train_nor_move_the_global_model(digits):
    model = _model()
    alg = FedHDP(model, GROUPS, ratio=0.0, noise_multiplier=[0.0, 1.0], count_noise=2.0)
    res = train(alg, digits, n_rounds=4, local_steps=2, batch_size=4, clients_per_round=6, seed=3)
    trained = res.clients["trained"].numpy()
    assert not trained[GROUPS == 1].any()  # private clients never trained
    assert trained[GROUPS == 0].any()
    # their personal predictor is the global model
    acc, acc_g = res.history[-1]["accuracy"], res.history[-1]["global_accuracy"]
    assert np.isfinite(acc) and np.isfinite(acc_g)
    # private clients' replies do not change the global model: zero them and get the same step
    config = RunConfig(n_clients=GROUPS.size, n_rounds=1, seed=0, clients_per_round=6)
    server = _server(alg, config, 0.5)
    ids = np.array([0, 1, 3, 4, 7, 9])
    gen = torch.Generator().manual_seed(2)
    deltas = [{n: torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.01
               for n, p in server["global"].items()} for _ in ids]
    zeroed = [d if GROUPS[c] == 0 else {n: torch.zeros_like(v) for n, v in d.items()}
              for c, d in zip(ids, deltas, strict=True)]
    rc = RoundContext(config, 0, ids)
    a = alg.aggregate(server, _replies(deltas, np.ones(6)), np.ones(6), rc)
    b = alg.aggregate(server, _replies(zeroed, np.ones(6)), np.ones(6), rc)
    assert_trees_close(a, b)


def test_client_half_equals_a_single_client_ditto_loop_with_clipping(digits):
    """One sampled client's round by hand: local SGD on the global copy, Ditto steps on the
    personal model toward the received global model, Delta clipped to S, b = |Delta| <= S."""
    import torch.nn.functional as F
    from torch.func import functional_call

    model = _model()
    alg = FedHDP(model, GROUPS, lr=0.3, lr_personal=0.2, lam=[0.05, 0.5], ratio=0.5,
                 noise_multiplier=[0.0, 1.0], clip=0.05, count_noise=2.0)
    config = RunConfig(n_clients=GROUPS.size, n_rounds=1, seed=7, clients_per_round=4,
                       local_steps=3, batch_size=5)
    server = alg.init_server(config)
    ids = np.array([1, 4])
    client = alg.init_clients(config, digits.subset(ids), ids)
    rc = RoundContext(config, 0, ids)
    message = alg.broadcast(server, rc)
    reply = alg.client_train(message, client, digits.subset(ids), rc)

    from ebfl.learning.torch.functional import client_generators

    gens = client_generators(rc.seeds())
    for j, c in enumerate(ids):
        lam = alg.lam[GROUPS[c]]
        w0 = {n: p.clone() for n, p in server["global"].items()}
        theta, v = dict(w0), dict(w0)
        for _ in range(3):
            u = torch.rand(5, generator=gens[j])
            idx = (u * digits.n_train[c]).long()
            x, y = digits.x_train[c, idx], digits.y_train[c, idx]

            def loss(q, x=x, y=y):
                return F.cross_entropy(functional_call(model, q, (x,)), y)

            def sgd(params, lr, extra=None):
                ps = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
                g = torch.autograd.grad(loss(ps), list(ps.values()))
                out = {}
                for (n, p), gi in zip(ps.items(), g, strict=True):
                    gi = gi + (0 if extra is None else extra(n, p))
                    out[n] = (p - lr * gi).detach()
                return out

            theta = sgd(theta, 0.3)
            v = sgd(v, 0.2, lambda n, p, lam=lam, w0=w0: lam * (p - w0[n]))
        delta = {n: theta[n] - w0[n] for n in w0}
        norm = math.sqrt(sum(float(d.pow(2).sum()) for d in delta.values()))
        factor = min(1.0, 0.05 / norm)
        for n in w0:
            torch.testing.assert_close(client["personal"][n][j], v[n], rtol=0, atol=1e-10)
            torch.testing.assert_close(reply["delta"][n][j], delta[n] * factor, rtol=0,
                                       atol=1e-10)
        assert float(reply["unclipped"][j]) == float(norm <= 0.05)
    assert client["trained"].all()


@pytest.mark.parametrize("make", ["fedhdp", "expected", "poisson", "non_private", "dp_fedavg",
                                  "hdp_fedavg"])
def test_both_runtimes_agree(digits, make):
    """Vectorized over the sampled clients = one client at a time (as on Flower)."""
    model = _model()
    kw = dict(noise_multiplier=[0.0, 1.0], count_noise=2.0)
    alg = {"fedhdp": lambda: FedHDP(model, GROUPS, ratio=0.2, **kw),
           "expected": lambda: FedHDP(model, GROUPS, ratio=0.2, denominator="expected", **kw),
           "poisson": lambda: FedHDP(model, GROUPS, ratio=0.2, denominator="expected", **kw),
           "non_private": lambda: non_private_ditto(model, GROUPS.size),
           "dp_fedavg": lambda: dp_fedavg_ditto(model, GROUPS.size, noise_multiplier=1.0,
                                                count_noise=2.0),
           "hdp_fedavg": lambda: hdp_fedavg_ditto(model, GROUPS, **kw)}[make]()
    from ebfl.federated import run

    config = RunConfig(n_clients=GROUPS.size, n_rounds=3, seed=11, clients_per_round=4,
                       local_steps=2, batch_size=4,
                       sampling="poisson" if make == "poisson" else "fixed")
    res = run(alg, digits, config, failures={1: [3]})
    server, clients, metrics = drive_one_client_at_a_time(alg, digits, config,
                                                          failures={1: [3]})
    assert_trees_close(res.server, server, atol=1e-12)
    assert_trees_close(res.clients, clients, atol=1e-12)
    for name in metrics:
        np.testing.assert_allclose(res.metrics[name], metrics[name], atol=1e-12)


def test_expected_denominator_releases_noise_in_a_round_nobody_joined(digits):
    model = _model()
    alg = FedHDP(model, GROUPS, ratio=0.2, noise_multiplier=[0.0, 1.0], count_noise=2.0,
                 denominator="expected")
    config = RunConfig(n_clients=GROUPS.size, n_rounds=1, seed=0, clients_per_round=3,
                       sampling="poisson")
    server = alg.init_server(config)
    out = alg.aggregate(server, None, np.zeros(0), RoundContext(config, 0, np.zeros(0, int)))
    moved = max(float((out["global"][n] - p).abs().max()) for n, p in server["global"].items())
    assert moved > 0
    realized = FedHDP(model, GROUPS, ratio=0.2, noise_multiplier=[0.0, 1.0], count_noise=2.0)
    out = realized.aggregate(server, None, np.zeros(0), RoundContext(config, 0, np.zeros(0, int)))
    assert_trees_close(out["global"], server["global"])


def test_adaptive_clip_tracks_the_target_quantile_of_update_norms(digits):
    """Without noise on the count the clip norm settles where about kappa of the updates are
    unclipped: after the run, the last rounds' unclipped fraction is near 0.5."""
    model = _model()
    alg = FedHDP(model, np.zeros(12, np.int64), noise_multiplier=0.0, clip=5.0, lr=0.1,
                 count_noise=1e-9, clip_lr=0.5)
    res = train(alg, digits, n_rounds=30, local_steps=3, batch_size=8, clients_per_round=12,
                seed=0, lr_decay=1.0)
    clips = [h["clip"] for h in res.history]
    assert clips[-1] < 1.0  # came down from 5, where nothing is clipped
    # at the end, the clip norm sits between the client update norms
    config = RunConfig(n_clients=12, n_rounds=1, seed=99, clients_per_round=12, local_steps=3,
                       batch_size=8)
    ids = np.arange(12)
    message = {"global": res.server["global"], "clip": res.server["clip"]}
    client = alg.init_clients(config, digits.subset(ids), ids)
    reply = alg.client_train(message, client, digits.subset(ids), RoundContext(config, 0, ids))
    frac = float(reply["unclipped"].mean())
    assert 0.1 <= frac <= 0.9


def test_bad_input():
    model = _model()
    with pytest.raises(ValueError, match="groups"):
        FedHDP(model, [0, 2, 2])
    with pytest.raises(ValueError, match="groups"):
        FedHDP(model, [[0, 1]])
    with pytest.raises(ValueError, match="ratio"):
        FedHDP(model, [0, 1], ratio=1.5)
    with pytest.raises(ValueError, match="lam"):
        FedHDP(model, [0, 1], lam=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="noise_multiplier"):
        FedHDP(model, [0, 1], noise_multiplier=[0.0, -1.0])
    with pytest.raises(ValueError, match="clip"):
        FedHDP(model, [0, 1], clip=None, noise_multiplier=[0.0, 1.0])
    with pytest.raises(ValueError, match="denominator"):
        FedHDP(model, [0, 1], denominator="mean")
    with pytest.raises(ValueError, match="count_noise"):
        FedHDP(model, [0, 1], noise_multiplier=[0, 1.5], count_noise=0.5)
    alg = FedHDP(model, [0, 1, 1, 1], noise_multiplier=[0, 1.5])  # default sigma_b = K / 20
    with pytest.raises(ValueError, match="count_noise"):
        alg.init_server(RunConfig(n_clients=4, n_rounds=1, clients_per_round=4))


def test_personal_model_of_an_untrained_client_is_the_global_model(digits):
    model = _model()
    alg = FedHDP(model, GROUPS, noise_multiplier=[0.0, 1.0], count_noise=2.0)
    config = RunConfig(n_clients=GROUPS.size, n_rounds=1, seed=0)
    server = alg.init_server(config)
    server["global"] = {n: p + 1.0 for n, p in server["global"].items()}
    ids = np.arange(GROUPS.size)
    client = alg.init_clients(config, digits.subset(ids), ids)
    personal = alg.personal(alg.evaluation_message(server), client, digits.subset(ids))
    assert_trees_close(personal, replicate(server["global"], GROUPS.size))


def test_privacy_per_group_is_the_accountants_at_the_groups_multiplier():
    alg = FedHDP(_model(), GROUPS, noise_multiplier=[0.0, 1.5])
    eps = alg.privacy(1e-4, n_rounds=500, sampling_rate=0.05).epsilon
    assert math.isinf(eps[0])
    assert eps[1] == pytest.approx(3.608, abs=5e-4)  # Table 7's (3.6, 1e-4) on non-IID MNIST
