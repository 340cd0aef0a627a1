"""The vectorized multi-client engine: equal to a client-by-client loop, reproducible, resumable."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.func import functional_call  # noqa: E402

from ebfl.learning.torch import (  # noqa: E402
    CNN5,
    MLP,
    AdaPeD,
    FedAvg,
    FederatedDataset,
    Local,
    LogisticModel,
    train,
)
from ebfl.learning.torch.functional import take  # noqa: E402


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


def test_vectorized_adaped_step_equals_a_client_by_client_loop():
    # float64, so that the comparison shows the algebra, not float32 summation order
    # (vmap runs the K convolutions as one grouped convolution).
    model = CNN5().double()
    k, b = 4, 6
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((k, b, 28, 28), generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (k, b), generator=gen)
    strat = AdaPeD(model, 0.1, 0.05, 0.03, psi0=2.0, weight_decay=1e-3)
    state = {"theta": _random_stack(model, k, 2), "mu": None, "psi": torch.tensor(2.0)}
    state["work_mu"] = _random_stack(model, k, 3)
    state["work_psi"] = torch.tensor([2.0, 1.0, 0.6, 3.0], dtype=torch.float64)
    before = {key: (take(v, torch.arange(k)) if isinstance(v, dict) else v.clone())
              for key, v in state.items() if v is not None}
    strat.local_step(state, torch.arange(k), x, y, 0.5)

    for i in range(k):  # the printed Algorithm 5 lines, one client, plain autograd
        th = {n: p[i].clone().requires_grad_() for n, p in before["theta"].items()}
        mu = {n: p[i].clone().requires_grad_() for n, p in before["work_mu"].items()}
        psi = before["work_psi"][i]
        z = _one(model, th, x[i])
        loss = F.cross_entropy(z, y[i]) + _kl(_one(model, mu, x[i]).detach(), z) / (2 * psi)
        g = torch.autograd.grad(loss, list(th.values()))
        th_new = {n: (p - 0.05 * (gi + 1e-3 * p)).detach()
                  for (n, p), gi in zip(th.items(), g, strict=True)}
        kd = _kl(_one(model, mu, x[i]), _one(model, th_new, x[i]).detach()) / (2 * psi)
        h = torch.autograd.grad(kd, list(mu.values()))
        mu_new = {n: (p - 0.025 * (hi + 1e-3 * p)).detach()
                  for (n, p), hi in zip(mu.items(), h, strict=True)}
        kd_new = _kl(_one(model, mu_new, x[i]), _one(model, th_new, x[i]))
        psi_new = max(float(psi - 0.03 * (1 / (2 * psi) - kd_new / (2 * psi**2))), 0.5)
        for n in th_new:
            torch.testing.assert_close(state["theta"][n][i], th_new[n], atol=1e-10, rtol=0)
            torch.testing.assert_close(state["work_mu"][n][i], mu_new[n], atol=1e-10, rtol=0)
        assert float(state["work_psi"][i]) == pytest.approx(psi_new, abs=1e-10)


def test_vectorized_fedavg_round_equals_a_loop_and_weighted_average():
    model = MLP(64, 10, hidden=(16,))
    data = _digits_clients()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    strat = FedAvg(model, 0.2, weight_decay=0.0)
    state = strat.init_state(init, data.n_clients)
    active = torch.tensor([0, 3, 5])
    strat.broadcast(state, active)
    gen = torch.Generator().manual_seed(0)
    batches = [data.sample_batch(active, 8, gen) for _ in range(3)]
    for x, y in batches:
        strat.local_step(state, active, x, y, 1.0)
    strat.aggregate(state, active, data.n_train[active])

    finals = []
    for j in range(3):
        p = {n: v.clone() for n, v in init.items()}
        for x, y in batches:
            ps = {n: v.clone().requires_grad_() for n, v in p.items()}
            g = torch.autograd.grad(F.cross_entropy(_one(model, ps, x[j]), y[j]),
                                    list(ps.values()))
            p = {n: (v - 0.2 * gi).detach() for (n, v), gi in zip(ps.items(), g, strict=True)}
        finals.append(p)
    w = data.n_train[active].float() / data.n_train[active].sum()
    for n in init:
        expect = sum(wj * f[n] for wj, f in zip(w, finals, strict=True))
        torch.testing.assert_close(state["global"][n], expect, atol=1e-6, rtol=1e-5)


def test_psi_floor_and_its_printed_gradient():
    model = LogisticModel(64, 10)
    data = _digits_clients()
    strat = AdaPeD(model, psi0=0.6, lr_psi=5.0)  # a large eta3 drives psi to the floor
    res = train(strat, data, rounds=3, local_steps=2, clients_per_round=4, batch_size=5)
    assert float(res.state["psi"]) >= 0.5
    assert all(h["psi"] >= 0.5 for h in res.history)


def test_same_seed_same_run_and_checkpoint_resume(tmp_path):
    data = _digits_clients()
    kw = dict(local_steps=3, clients_per_round=4, batch_size=8, eval_every=2, seed=5)
    full = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, rounds=6, **kw)
    again = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, rounds=6, **kw)
    assert full.history == again.history
    other = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, rounds=6, **dict(kw, seed=6))
    assert other.history != full.history

    ckpt = tmp_path / "run.pt"
    part = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, rounds=4, checkpoint=ckpt, **kw)
    assert ckpt.is_file() and part.history == full.history[:2]
    resumed = train(AdaPeD(MLP(64, 10, hidden=(16,))), data, rounds=6, checkpoint=ckpt, **kw)
    assert resumed.history == full.history
    for n, p in full.state["theta"].items():
        torch.testing.assert_close(resumed.state["theta"][n], p, atol=0, rtol=0)
    with pytest.raises(ValueError, match="another configuration"):
        train(AdaPeD(MLP(64, 10, hidden=(16,)), lr_theta=0.05), data, rounds=6,
              checkpoint=ckpt, **kw)


def test_quick_training_learns_on_load_digits():
    data = _digits_clients()
    kw = dict(rounds=20, local_steps=10, clients_per_round=4, batch_size=10, seed=0)
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
    kw = dict(rounds=1, local_steps=2, clients_per_round=2, batch_size=4, seed=3,
              init_params=init)
    for fine_tune, expected in ((False, 2), (True, data.n_clients)):
        res = train(AdaPeD(model, fine_tune=fine_tune), data, **kw)
        w = res.state["theta"]["net.1.weight"]
        moved = (w != init["net.1.weight"]).flatten(1).any(1)
        assert int(moved.sum()) == expected


def test_sampling_ratio_is_k_of_m():
    data = _digits_clients()
    kw = dict(rounds=2, local_steps=2, batch_size=4, seed=2)
    by_ratio = train(FedAvg(LogisticModel(64, 10)), data, sampling_ratio=0.34, **kw)
    k = max(1, round(0.34 * data.n_clients))
    by_k = train(FedAvg(LogisticModel(64, 10)), data, clients_per_round=k, **kw)
    assert by_ratio.history == by_k.history
    full = train(FedAvg(LogisticModel(64, 10)), data, **kw)
    assert full.history != by_k.history


def test_bad_input():
    data = _digits_clients()
    with pytest.raises(ValueError, match="clients_per_round"):
        train(FedAvg(LogisticModel(64, 10)), data, rounds=1, clients_per_round=99)
    for ratio in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="sampling_ratio"):
            train(FedAvg(LogisticModel(64, 10)), data, rounds=1, sampling_ratio=ratio)
    with pytest.raises(ValueError, match="not both"):
        train(FedAvg(LogisticModel(64, 10)), data, rounds=1, sampling_ratio=0.5,
              clients_per_round=2)
    with pytest.raises(TypeError, match="FederatedDataset"):
        train(FedAvg(LogisticModel(64, 10)), data.x_train, rounds=1)
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
