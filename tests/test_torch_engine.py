"""The vectorized multi-client engine: equal to a client-by-client loop, reproducible, resumable.

Each strategy's client half is checked against the printed update rules run for
one client at a time with plain autograd, on the minibatches that client draws
from its own stream of the round; the server half against the printed average.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.func import functional_call  # noqa: E402

from ebfl.federated import RoundContext, RunConfig  # noqa: E402
from ebfl.generative.algorithm import AdaPeD  # noqa: E402
from ebfl.learning.torch import (  # noqa: E402
    CNN5,
    MLP,
    FedAvg,
    FederatedDataset,
    Local,
    LogisticModel,
    train,
)
from ebfl.learning.torch.engine import evaluate_strategy  # noqa: E402
from ebfl.learning.torch.functional import client_generators, fresh_params  # noqa: E402


def _digits_clients(m=12, classes_per_client=3, seed=0):
    """load_digits split pathologically: each client holds 3 classes, 75/25 split."""
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    rng = np.random.default_rng(seed)
    shards = np.array_split(np.argsort(y, kind="stable"), m * classes_per_client)
    perm = rng.permutation(len(shards))
    parts = [[], [], [], []]
    for i in range(m):
        idx = np.concatenate([shards[j] for j in perm[i * 3:(i + 1) * 3]])
        idx = rng.permutation(idx)
        cut = int(0.75 * idx.size)
        for part, val in zip(parts, (X[idx[:cut]], y[idx[:cut]], X[idx[cut:]], y[idx[cut:]]),
                             strict=True):
            part.append(val)
    return FederatedDataset.from_clients(*parts, n_classes=10)


def _kl(t, s):
    lt, ls = F.log_softmax(t, -1), F.log_softmax(s, -1)
    return (lt.exp() * (lt - ls)).sum(-1).mean()


def _random_stack(model, k, seed):
    gen = torch.Generator().manual_seed(seed)
    return {n: 0.3 * torch.randn((k, *p.shape), generator=gen, dtype=p.dtype)
            for n, p in model.named_parameters()}


def _one(model, params, x):
    return functional_call(model, params, (x,))


def _row(stack, i):
    return {n: p[i].clone() for n, p in stack.items()}


def _adaped_step(model, theta, mu, psi, x, y, lr, wd=1e-4, psi_floor=0.5, lr_psi=3e-2):
    """The printed Algorithm 5 lines for one client and one minibatch, plain autograd.

    ``lr`` is (eta1, eta2) after the epoch decay; returns (theta, mu, psi) after the step.
    """
    th = {n: p.clone().requires_grad_() for n, p in theta.items()}
    z = _one(model, th, x)
    teacher = _one(model, mu, x).detach()
    loss = F.cross_entropy(z, y) + _kl(teacher, z) / (2 * psi)
    g = torch.autograd.grad(loss, list(th.values()))
    th_new = {n: (p - lr[0] * (gi + wd * p)).detach()
              for (n, p), gi in zip(th.items(), g, strict=True)}
    m = {n: p.clone().requires_grad_() for n, p in mu.items()}
    kd = _kl(_one(model, m, x), _one(model, th_new, x).detach()) / (2 * psi)
    h = torch.autograd.grad(kd, list(m.values()))
    mu_new = {n: (p - lr[1] * (hi + wd * p)).detach()
              for (n, p), hi in zip(m.items(), h, strict=True)}
    with torch.no_grad():
        kd_new = _kl(_one(model, mu_new, x), _one(model, th_new, x))
    psi_new = torch.clamp(psi - lr_psi * (1 / (2 * psi) - kd_new / (2 * psi**2)), min=psi_floor)
    return th_new, mu_new, psi_new


def _own_batches(data, clients, seeds, steps, batch):
    """Each client's minibatches of a round, drawn by hand from its own stream: B uniform
    indices into its n_i training rows, with replacement."""
    out = []
    for c, seed in zip(clients, seeds, strict=True):
        gen = torch.Generator().manual_seed(seed)
        n = int(data.n_train[c])
        rows = []
        for _ in range(steps):
            idx = (torch.rand(batch, generator=gen) * n).long()
            rows.append((data.x_train[c, idx], data.y_train[c, idx]))
        out.append(rows)
    return out


def test_vectorized_adaped_step_equals_a_client_by_client_loop():
    # float64, so that the comparison shows the algebra, not float32 summation order
    # (vmap runs the K convolutions as one grouped convolution).
    model = CNN5().double()
    k, b = 4, 6
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((k, b, 28, 28), generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (k, b), generator=gen)
    strat = AdaPeD(model, 0.1, 0.05, 0.03, psi0=2.0, weight_decay=1e-3)
    client = {"theta": _random_stack(model, k, 2)}
    work = {"mu": _random_stack(model, k, 3),
            "psi": torch.tensor([2.0, 1.0, 0.6, 3.0], dtype=torch.float64)}
    before = {"theta": dict(client["theta"]), "mu": dict(work["mu"]), "psi": work["psi"].clone()}
    strat.local_step(work, client, x, y, 0.5, client_generators(range(k)))
    for i in range(k):
        th, mu, psi = _adaped_step(model, _row(before["theta"], i), _row(before["mu"], i),
                                   before["psi"][i], x[i], y[i], (0.05, 0.025), wd=1e-3,
                                   lr_psi=0.03)
        for n in th:
            torch.testing.assert_close(client["theta"][n][i], th[n], atol=1e-10, rtol=0)
            torch.testing.assert_close(work["mu"][n][i], mu[n], atol=1e-10, rtol=0)
        torch.testing.assert_close(work["psi"][i], psi, atol=1e-10, rtol=0)


def test_adaped_round_and_aggregation_equal_the_printed_algorithm():
    data = _digits_clients()
    model = LogisticModel(64, 10)
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=3, clients_per_round=3, local_steps=4,
                    batch_size=7, iters_per_epoch=6, lr_decay=0.5, seed=4)
    strat = AdaPeD(model, psi0=1.5)
    active = np.array([0, 6, 10])
    rc = RoundContext(cfg, 1, active)  # iterations 4..7: the decay applies from the 7th
    server = {"mu": fresh_params(model, 1), "psi": torch.tensor(1.5)}
    client = {"theta": _random_stack(model, 3, 5)}
    theta0 = {n: p.clone() for n, p in client["theta"].items()}
    reply = strat.client_train(strat.broadcast(server, rc), client, data.subset(active), rc)
    new = strat.aggregate(server, reply, data.n_train[active].numpy(), rc)

    batches = _own_batches(data, active, rc.seeds(), 4, 7)
    mus, psis = [], []
    for j in range(3):
        th, mu, psi = _row(theta0, j), dict(server["mu"]), server["psi"]
        for s, (x, y) in enumerate(batches[j]):
            scale = 0.5 ** ((1 * 4 + s) // 6)
            th, mu, psi = _adaped_step(model, th, mu, psi, x, y, (0.1 * scale, 0.1 * scale))
        for n in th:
            torch.testing.assert_close(client["theta"][n][j], th[n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(reply["mu"][n][j], mu[n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(reply["psi"][j], psi, atol=1e-6, rtol=1e-6)
        mus.append(mu)
        psis.append(psi)
    # the server averages mu and psi unweighted (as printed), whatever the sample counts
    assert len(set(data.n_train[active].tolist())) > 1
    for n in server["mu"]:
        torch.testing.assert_close(new["mu"][n], sum(m[n] for m in mus) / 3, atol=1e-6,
                                   rtol=1e-5)
    torch.testing.assert_close(new["psi"], sum(psis) / 3, atol=1e-6, rtol=1e-6)


def test_vectorized_fedavg_round_equals_a_loop_and_weighted_average():
    model = MLP(64, 10, hidden=(16,))
    data = _digits_clients()
    init = fresh_params(model, 3)
    strat = FedAvg(model, 0.2, weight_decay=0.0)
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=2, clients_per_round=3, local_steps=3,
                    batch_size=8, iters_per_epoch=2, lr_decay=0.5, seed=0)
    active = np.array([0, 3, 5])
    rc = RoundContext(cfg, 0, active)
    reply = strat.client_train(strat.broadcast({"global": init}, rc), {}, data.subset(active), rc)
    weights = strat.client_weights(data.subset(active))
    new = strat.aggregate({"global": init}, reply, weights, rc)

    finals = []
    for batches in _own_batches(data, active, rc.seeds(), 3, 8):
        p = {n: v.clone() for n, v in init.items()}
        for s, (x, y) in enumerate(batches):
            ps = {n: v.clone().requires_grad_() for n, v in p.items()}
            g = torch.autograd.grad(F.cross_entropy(_one(model, ps, x), y), list(ps.values()))
            lr = 0.2 * 0.5 ** (s // 2)
            p = {n: (v - lr * gi).detach() for (n, v), gi in zip(ps.items(), g, strict=True)}
        finals.append(p)
    n = data.n_train[active].double()
    np.testing.assert_array_equal(weights, n.numpy())
    w = n / n.sum()
    for name in init:
        expect = sum(float(wj) * f[name] for wj, f in zip(w, finals, strict=True))
        torch.testing.assert_close(new["global"][name], expect, atol=1e-6, rtol=1e-5)


def test_psi_floor_and_its_printed_gradient():
    model = LogisticModel(64, 10)
    data = _digits_clients()
    strat = AdaPeD(model, psi0=0.6, lr_psi=5.0)  # a large eta3 drives psi to the floor
    res = train(strat, data, n_rounds=3, local_steps=2, clients_per_round=4, batch_size=5)
    assert float(res.server["psi"]) == 0.5  # every client's psi stopped at the floor
    assert all(h["psi"] == 0.5 for h in res.history)
    # one step: the unclamped printed update would go below the floor
    work = {"mu": _random_stack(model, 2, 1), "psi": torch.tensor([0.6, 0.6])}
    client = {"theta": _random_stack(model, 2, 2)}
    x, y = data.x_train[:2, :5], data.y_train[:2, :5]
    _, _, unclamped = _adaped_step(model, _row(client["theta"], 0), _row(work["mu"], 0),
                                   work["psi"][0], x[0], y[0], (0.1, 0.1), psi_floor=-np.inf,
                                   lr_psi=5.0)
    assert float(unclamped) < 0.5
    strat.local_step(work, client, x, y, 1.0, client_generators([0, 1]))
    assert work["psi"].tolist() == [0.5, 0.5]


def _same_state(a, b):
    for part in ("server", "clients"):
        x, y = getattr(a, part), getattr(b, part)
        assert sorted(x) == sorted(y)
        for key in x:
            tx = x[key] if isinstance(x[key], dict) else {"": x[key]}
            ty = y[key] if isinstance(y[key], dict) else {"": y[key]}
            for n in tx:
                assert torch.equal(tx[n], ty[n]), (part, key, n)


def test_same_seed_same_run_and_checkpoint_resume(tmp_path):
    data = _digits_clients()
    kw = dict(local_steps=3, clients_per_round=4, batch_size=8, eval_every=2, seed=5)
    full = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, n_rounds=6, **kw)
    again = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, n_rounds=6, **kw)
    assert full.history == again.history
    _same_state(full, again)
    other = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, n_rounds=6, **dict(kw, seed=6))
    assert other.history != full.history

    # a run stopped after 4 rounds and continued to 6 (the README's and notebook's use)
    ckpt = tmp_path / "run.pt"
    part = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, n_rounds=4, checkpoint=ckpt, **kw)
    assert ckpt.is_file() and part.history == full.history[:2]
    resumed = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, n_rounds=6, checkpoint=ckpt, **kw)
    assert resumed.history == full.history
    _same_state(resumed, full)
    torch.testing.assert_close(resumed.accuracy, full.accuracy, atol=0, rtol=0)
    with pytest.raises(ValueError, match="another configuration"):
        train(AdaPeD(MLP(64, 10, hidden=(16,)), lr_theta=0.05), data, n_rounds=6,
              checkpoint=ckpt, **kw)


def test_quick_training_learns_on_load_digits():
    data = _digits_clients()
    kw = dict(n_rounds=20, local_steps=10, clients_per_round=4, batch_size=10, seed=0)
    acc = {}
    for strat in (Local(LogisticModel(64, 10), 0.1), FedAvg(LogisticModel(64, 10), 0.1),
                  AdaPeD(LogisticModel(64, 10)), AdaPeD(LogisticModel(64, 10), fine_tune=True)):
        acc[strat.name] = float(train(strat, data, **kw).accuracy.mean())
    # Chance is 0.1 (a third within a client's own three classes); the global FedAvg
    # model must serve all ten classes and is the weakest.
    assert min(acc.values()) > 0.5, acc
    assert min(acc["Local"], acc["AdaPeD"], acc["AdaPeD-FT"]) > 0.9, acc
    # Personalization pays on pathological splits: AdaPeD beats the one global model.
    assert acc["AdaPeD"] > acc["FedAvg"], acc


def test_idle_clients_train_only_with_fine_tuning():
    data = _digits_clients()
    model = LogisticModel(64, 10)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    kw = dict(n_rounds=1, local_steps=2, clients_per_round=2, batch_size=4, seed=3,
              init_params=init)
    for fine_tune, expected in ((False, 2), (True, data.n_clients)):
        res = train(AdaPeD(model, fine_tune=fine_tune), data, **kw)
        w = res.clients["theta"]["net.1.weight"]
        moved = (w != init["net.1.weight"]).flatten(1).any(1)
        assert int(moved.sum()) == expected
    # the caller's init_params and model are untouched
    for n, p in model.named_parameters():
        assert torch.equal(p, init[n])


def _accuracy_by_hand(model, stack, data):
    """Each client's share of its own test rows (padding excluded) classified right."""
    out = []
    for i in range(data.n_clients):
        n = int(data.n_test[i])
        with torch.no_grad():
            logits = _one(model, _row(stack, i), data.x_test[i, :n])
        out.append(float((logits.argmax(-1) == data.y_test[i, :n]).float().mean()))
    return torch.tensor(out)


def test_evaluation_is_each_clients_accuracy_on_its_own_test_rows():
    data = _digits_clients(m=20)  # more than one chunk of 16 clients
    kw = dict(n_rounds=2, local_steps=3, clients_per_round=5, batch_size=8, seed=1)
    model = LogisticModel(64, 10)
    ada = AdaPeD(model)
    res = train(ada, data, **kw)
    expect = _accuracy_by_hand(model, res.clients["theta"], data)
    torch.testing.assert_close(res.accuracy, expect, atol=1e-6, rtol=0)
    torch.testing.assert_close(evaluate_strategy(ada, res, data), expect, atol=1e-6, rtol=0)
    fed = FedAvg(model)
    res = train(fed, data, **kw)
    everyone = {n: p.expand(20, *p.shape) for n, p in res.server["global"].items()}
    expect = _accuracy_by_hand(model, everyone, data)
    torch.testing.assert_close(evaluate_strategy(fed, res, data), expect, atol=1e-6, rtol=0)
    assert res.history[-1]["accuracy"] == pytest.approx(float(expect.double().mean()), abs=1e-6)
    with pytest.raises(TypeError, match="FederatedDataset"):
        evaluate_strategy(fed, res, data.x_test)


def test_sampling_ratio_is_k_of_m():
    data = _digits_clients()
    kw = dict(n_rounds=2, local_steps=2, batch_size=4, seed=2)
    by_ratio = train(FedAvg(LogisticModel(64, 10)), data, sampling_ratio=0.34, **kw)
    k = max(1, round(0.34 * data.n_clients))
    by_k = train(FedAvg(LogisticModel(64, 10)), data, clients_per_round=k, **kw)
    assert by_ratio.history == by_k.history
    assert by_k.history[0]["clients"] == k
    full = train(FedAvg(LogisticModel(64, 10)), data, **kw)
    assert full.history != by_k.history


def test_bad_input():
    data = _digits_clients()
    with pytest.raises(ValueError, match="clients_per_round"):
        train(FedAvg(LogisticModel(64, 10)), data, n_rounds=1, clients_per_round=99)
    for ratio in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="sampling_ratio"):
            train(FedAvg(LogisticModel(64, 10)), data, n_rounds=1, sampling_ratio=ratio)
    with pytest.raises(ValueError, match="not both"):
        train(FedAvg(LogisticModel(64, 10)), data, n_rounds=1, sampling_ratio=0.5,
              clients_per_round=2)
    with pytest.raises(TypeError, match="FederatedDataset"):
        train(FedAvg(LogisticModel(64, 10)), data.x_train, n_rounds=1)
    with pytest.raises(TypeError, match="failures"):
        train(FedAvg(LogisticModel(64, 10)), data, n_rounds=1, failures=[0])
    with pytest.raises(ValueError, match="failures round"):
        train(FedAvg(LogisticModel(64, 10)), data, n_rounds=1, failures={-1: [0]})
    with pytest.raises(ValueError, match="psi0"):
        AdaPeD(LogisticModel(64, 10), psi0=0.1)
    with pytest.raises(ValueError, match="lr_theta"):
        AdaPeD(LogisticModel(64, 10), lr_theta=0.0)
    x = [np.zeros((3, 4)), np.zeros((0, 4))]
    y = [np.zeros(3, int), np.zeros(0, int)]
    with pytest.raises(ValueError, match="empty clients"):
        FederatedDataset.from_clients(x, y, x, y)
    with pytest.raises(ValueError, match="NaN"):
        FederatedDataset.from_clients([np.full((2, 4), np.nan)], [np.zeros(2, int)],
                                      [np.zeros((2, 4))], [np.zeros(2, int)])
    with pytest.raises(ValueError, match="non-negative integers"):
        FederatedDataset.from_clients([np.zeros((2, 4))], [np.array([0, -1])],
                                      [np.zeros((2, 4))], [np.zeros(2, int)])
