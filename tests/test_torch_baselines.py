"""Personalized-FL baselines: each vectorized step equals a client-by-client loop; they learn."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call  # noqa: E402

from ebfl.learning.torch import CNN5, MLP, FedAvg, LogisticModel, train  # noqa: E402
from ebfl.learning.torch.baselines import (  # noqa: E402
    FML,
    Ditto,
    DPFedEM,
    FedAvgFT,
    FedEM,
    PerFedAvg,
    PFedMe,
    QuPeDFP,
)
from ebfl.learning.torch.engine import evaluate_strategy  # noqa: E402
from ebfl.learning.torch.functional import take  # noqa: E402
from tests.test_torch_engine import _digits_clients, _kl, _random_stack  # noqa: E402

TOL = dict(atol=1e-10, rtol=0)


@pytest.fixture(scope="module")
def digits():
    return _digits_clients()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models: one intra-op thread is faster, and immune to a busy machine's
    oversubscription (2 threads beside another job ran these tests 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def _row(stack, i):
    return {n: p[i].clone() for n, p in stack.items()}


def _one(model, params, x):
    return functional_call(model, params, (x,))


def _sgd(model, params, loss_fn, lr, wd=0.0):
    """One plain-autograd SGD step of one client's parameters on ``loss_fn(params)``."""
    ps = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    g = torch.autograd.grad(loss_fn(ps), list(ps.values()))
    return {n: (p - lr * (gi + wd * p)).detach() for (n, p), gi in zip(ps.items(), g, strict=True)}


def _close(stack, i, expected):
    for n, p in expected.items():
        torch.testing.assert_close(stack[n][i], p, **TOL)


def _batch(k, b, shape=(64,), seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((k, b, *shape), generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 10, (k, b), generator=gen)


def _mlp():
    return MLP(64, 10, hidden=(8,)).double()


# --- vectorized == client by client ---------------------------------------------------------

def test_fedavg_ft_personal_is_full_batch_fine_tuning_of_the_global(digits):
    model = _mlp()
    strat = FedAvgFT(model, 0.2, weight_decay=1e-3, finetune_steps=3, finetune_lr=0.3,
                     data=digits)
    m = digits.n_clients
    state = {"global": _row(_random_stack(model, 1, 2), 0), "m": m}
    personal = strat.personal(state)
    again = strat.personal(state)
    for i in range(m):
        n = int(digits.n_train[i])
        x, y = digits.x_train[i, :n].double(), digits.y_train[i, :n]
        p = dict(state["global"])
        for _ in range(3):
            p = _sgd(model, p, lambda q, x=x, y=y: F.cross_entropy(_one(model, q, x), y), 0.3,
                     1e-3)
        _close(personal, i, p)
        _close(again, i, p)


def test_ditto_step_equals_a_client_loop():
    model = _mlp()
    k, b = 4, 6
    x, y = _batch(k, b)
    strat = Ditto(model, 0.1, 0.05, lam=0.7, weight_decay=1e-3)
    m, active = 6, torch.tensor([0, 2, 3, 5])
    state = {"global": _row(_random_stack(model, 1, 2), 0), "personal": _random_stack(model, m, 3),
             "work": _random_stack(model, k, 4)}
    personal0 = take(state["personal"], torch.arange(m))
    work0 = take(state["work"], torch.arange(k))
    strat.local_step(state, active, x, y, 0.5)
    w_t = state["global"]
    for j, i in enumerate(active.tolist()):
        w = _sgd(model, _row(work0, j), lambda q, j=j: F.cross_entropy(_one(model, q, x[j]), y[j]),
                 0.05, 1e-3)

        def ditto_loss(v, j=j):
            reg = sum(((v[n] - w_t[n]) ** 2).sum() for n in v)
            return F.cross_entropy(_one(model, v, x[j]), y[j]) + 0.7 / 2 * reg

        v = _sgd(model, _row(personal0, i), ditto_loss, 0.025, 1e-3)
        _close(state["work"], j, w)
        _close(state["personal"], i, v)
    for i in (1, 4):  # unsampled: untouched
        _close(state["personal"], i, _row(personal0, i))


def test_pfedme_step_and_server_update_equal_a_client_loop():
    model = _mlp()
    k, b, m = 3, 5, 5
    x, y = _batch(k, b)
    active = torch.tensor([0, 1, 4])
    strat = PFedMe(model, 0.2, 0.15, lam=0.5, inner_steps=3, beta=0.7, weight_decay=1e-3)
    state = {"global": _row(_random_stack(model, 1, 2), 0), "theta": _random_stack(model, m, 3),
             "m": m, "work_w": _random_stack(model, k, 4), "work_theta": _random_stack(model, k, 5)}
    w0, th0 = take(state["work_w"], torch.arange(k)), take(state["work_theta"], torch.arange(k))
    g0 = dict(state["global"])
    strat.local_step(state, active, x, y, 0.5)
    n_samples = torch.tensor([10, 30, 20])
    ws = []
    for j in range(k):
        w, th = _row(w0, j), _row(th0, j)

        def inner(t, j=j, w=w):
            reg = sum(((t[n] - w[n]) ** 2).sum() for n in t)
            return F.cross_entropy(_one(model, t, x[j]), y[j]) + 0.5 / 2 * reg

        for _ in range(3):
            th = _sgd(model, th, inner, 0.075, 1e-3)
        w = {n: w[n] - 0.1 * 0.5 * (w[n] - th[n]) for n in w}
        _close(state["work_w"], j, w)
        _close(state["work_theta"], j, th)
        ws.append(w)
    strat.aggregate(state, active, n_samples)
    wts = n_samples.double() / n_samples.sum()
    for n in g0:
        avg = sum(wj * wk[n] for wj, wk in zip(wts, ws, strict=True))
        torch.testing.assert_close(state["global"][n], 0.3 * g0[n] + 0.7 * avg, **TOL)
    assert "work_w" not in state and "work_theta" not in state


def test_per_fedavg_step_and_personal_equal_a_client_loop(digits):
    model = _mlp()
    k, b = 3, 7  # odd: D gets 3 samples, D' 4
    x, y = _batch(k, b)
    strat = PerFedAvg(model, 0.075, 0.01, weight_decay=1e-3, data=digits)
    state = {"global": None, "m": digits.n_clients, "work": _random_stack(model, k, 4)}
    w0 = take(state["work"], torch.arange(k))
    strat.local_step(state, torch.arange(k), x, y, 0.5)
    for j in range(k):
        w = _row(w0, j)
        tmp = _sgd(model, w, lambda q, j=j: F.cross_entropy(_one(model, q, x[j, :3]), y[j, :3]),
                   0.01)
        ps = {n: p.clone().requires_grad_() for n, p in tmp.items()}
        g = torch.autograd.grad(F.cross_entropy(_one(model, ps, x[j, 3:]), y[j, 3:]),
                                list(ps.values()))
        expect = {n: w[n] - 0.0375 * (gi + 1e-3 * w[n]) for n, gi in zip(w, g, strict=True)}
        _close(state["work"], j, expect)

    state = {"global": _row(_random_stack(model, 1, 2), 0), "m": digits.n_clients}
    personal = strat.personal(state)
    for i in range(digits.n_clients):
        n = int(digits.n_train[i])
        xi, yi = digits.x_train[i, :n].double(), digits.y_train[i, :n]
        _close(personal, i, _sgd(model, state["global"],
                                 lambda q, xi=xi, yi=yi: F.cross_entropy(_one(model, q, xi), yi),
                                 0.01))
    with pytest.raises(ValueError, match="batch_size"):
        strat.local_step({"work": _random_stack(model, k, 4)}, torch.arange(k), x[:, :1],
                         y[:, :1], 1.0)


def test_quped_fp_step_equals_a_client_loop():
    # CNN5: vmap runs the K convolutions as one grouped convolution; float64 shows the algebra.
    model = CNN5().double()
    k, b, m = 3, 5, 4
    x, y = _batch(k, b, (28, 28))
    active = torch.tensor([0, 2, 3])
    strat = QuPeDFP(model, 0.1, 0.05, lam_p=0.25, weight_decay=1e-3)
    state = {"global": None, "theta": _random_stack(model, m, 2),
             "work": _random_stack(model, k, 3)}
    th0, w0 = take(state["theta"], torch.arange(m)), take(state["work"], torch.arange(k))
    strat.local_step(state, active, x, y, 0.5)
    for j, i in enumerate(active.tolist()):
        w = _row(w0, j)
        t_w = _one(model, w, x[j]).detach()
        th = _sgd(model, _row(th0, i), lambda q, j=j, t=t_w: F.cross_entropy(
            _one(model, q, x[j]), y[j]) + 0.25 * _kl(t, _one(model, q, x[j])), 0.05, 1e-3)
        t_th = _one(model, th, x[j]).detach()
        w = _sgd(model, w, lambda q, j=j, t=t_th: F.cross_entropy(
            _one(model, q, x[j]), y[j]) + 0.25 * _kl(t, _one(model, q, x[j])), 0.025, 1e-3)
        _close(state["theta"], i, th)
        _close(state["work"], j, w)
    _close(state["theta"], 1, _row(th0, 1))


def test_fml_step_equals_a_client_loop():
    model = _mlp()
    k, b, m = 3, 6, 4
    x, y = _batch(k, b)
    active = torch.tensor([1, 2, 3])
    strat = FML(model, 0.1, 0.2, alpha=0.3, beta=0.6, weight_decay=1e-3)
    state = {"global": None, "theta": _random_stack(model, m, 2),
             "work": _random_stack(model, k, 3)}
    th0, w0 = take(state["theta"], torch.arange(m)), take(state["work"], torch.arange(k))
    strat.local_step(state, active, x, y, 0.5)
    for j, i in enumerate(active.tolist()):
        th, meme = _row(th0, i), _row(w0, j)
        z_th, z_meme = _one(model, th, x[j]).detach(), _one(model, meme, x[j]).detach()
        th = _sgd(model, th, lambda q, j=j, t=z_meme: 0.3 * F.cross_entropy(
            _one(model, q, x[j]), y[j]) + 0.7 * _kl(t, _one(model, q, x[j])), 0.05, 1e-3)
        meme = _sgd(model, meme, lambda q, j=j, t=z_th: 0.6 * F.cross_entropy(
            _one(model, q, x[j]), y[j]) + 0.4 * _kl(t, _one(model, q, x[j])), 0.1, 1e-3)
        _close(state["theta"], i, th)
        _close(state["work"], j, meme)


def test_fedem_round_and_mixture_equal_a_client_loop():
    model = _mlp()
    k, b, m, mc = 3, 6, 5, 2
    active = torch.tensor([0, 2, 4])
    n_samples = torch.tensor([10, 30, 20])
    strat = FedEM(model, 0.2, n_components=mc, weight_decay=1e-3)
    comps = _random_stack(model, mc, 2)
    pi = torch.softmax(torch.randn(m, mc, generator=torch.Generator().manual_seed(3),
                                   dtype=torch.float64), 1)
    state = {"components": {n: p.clone() for n, p in comps.items()}, "pi": pi.clone()}
    strat.broadcast(state, active)
    batches = [_batch(k, b, seed=s) for s in (5, 6)]
    for x, y in batches:
        strat.local_step(state, active, x, y, 0.5)
    strat.aggregate(state, active, n_samples)

    finals, new_pi = [], []
    for j, i in enumerate(active.tolist()):
        local = [_row(comps, c) for c in range(mc)]
        q_sum = torch.zeros(mc, dtype=torch.float64)
        for x, y in batches:
            with torch.no_grad():
                losses = torch.stack([F.cross_entropy(_one(model, p, x[j]), y[j], reduction="none")
                                      for p in local])  # (M, B)
                q = pi[i, :, None] * torch.exp(-losses)
                q = q / q.sum(0)
            xj, yj = x[j], y[j]
            local = [_sgd(model, local[c], lambda p, r=q[c], xj=xj, yj=yj: (r * F.cross_entropy(
                _one(model, p, xj), yj, reduction="none")).mean(), 0.1, 1e-3)
                for c in range(mc)]
            q_sum += q.mean(1)
        finals.append(local)
        new_pi.append(q_sum / len(batches))
    wts = n_samples.double() / n_samples.sum()
    for c in range(mc):
        for n in comps:
            expect = sum(wj * f[c][n] for wj, f in zip(wts, finals, strict=True))
            torch.testing.assert_close(state["components"][n][c], expect, **TOL)
    for j, i in enumerate(active.tolist()):
        torch.testing.assert_close(state["pi"][i], new_pi[j], **TOL)
    torch.testing.assert_close(state["pi"][1], pi[1], atol=0, rtol=0)
    assert set(state) == {"components", "pi"}

    x_test = torch.rand((m, 4, 64), generator=torch.Generator().manual_seed(7),
                        dtype=torch.float64)
    logp = strat.personal_logits(state, x_test, chunk=2)
    for i in range(m):
        probs = sum(state["pi"][i, c] * torch.softmax(
            _one(model, _row(state["components"], c), x_test[i]), -1) for c in range(mc))
        torch.testing.assert_close(logp[i], torch.log(probs), **TOL)
    best = state["pi"].argmax(1)
    for n, p in strat.personal(state).items():
        torch.testing.assert_close(p, state["components"][n][best], atol=0, rtol=0)


# --- through the engine ---------------------------------------------------------------------

def test_quick_training_learns_on_load_digits(digits):
    kw = dict(rounds=20, local_steps=10, clients_per_round=4, batch_size=10, seed=0)
    acc = {}
    for strat in (FedAvg(LogisticModel(64, 10)), FedAvgFT(LogisticModel(64, 10), data=digits),
                  Ditto(LogisticModel(64, 10)), PFedMe(LogisticModel(64, 10)),
                  PerFedAvg(LogisticModel(64, 10), data=digits), QuPeDFP(LogisticModel(64, 10)),
                  FML(LogisticModel(64, 10)), FedEM(LogisticModel(64, 10))):
        res = train(strat, digits, **kw)
        acc[strat.name] = float(res.accuracy.mean())
        assert len(res.history) == 20
    # Chance is 0.1. Observed (seed 0): FedAvg 0.79, FedAvg-FT 0.95, Ditto 0.95, pFedMe 0.95,
    # Per-FedAvg 0.76 (alpha = 0.001 barely adapts), QuPeD-FP 0.95, FML 0.84, FedEM 0.83.
    assert min(acc.values()) > 0.6, acc
    assert min(acc[s] for s in ("FedAvg-FT", "Ditto", "pFedMe", "QuPeD-FP")) > 0.85, acc
    assert acc["FedAvg-FT"] > acc["FedAvg"] + 0.05, acc


def test_fedavg_ft_trains_exactly_as_fedavg(digits):
    kw = dict(rounds=3, local_steps=3, clients_per_round=4, batch_size=8, seed=2)
    plain = train(FedAvg(LogisticModel(64, 10)), digits, **kw)
    tuned = train(FedAvgFT(LogisticModel(64, 10), data=digits), digits, **kw)
    for n, p in plain.state["global"].items():
        torch.testing.assert_close(tuned.state["global"][n], p, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="data="):
        FedAvgFT(LogisticModel(64, 10)).personal(plain.state)
    with pytest.raises(ValueError, match="clients"):
        FedAvgFT(LogisticModel(64, 10), data=digits).personal({**plain.state, "m": 3})


def test_pfedme_train_idle_changes_only_idle_personal_models(digits):
    model = LogisticModel(64, 10)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    kw = dict(rounds=1, local_steps=2, clients_per_round=3, batch_size=4, seed=3,
              init_params=init)
    runs = {flag: train(PFedMe(model, train_idle=flag), digits, **kw) for flag in (False, True)}
    for n, p in runs[False].state["global"].items():  # the server sees the sampled clients only
        torch.testing.assert_close(runs[True].state["global"][n], p, atol=0, rtol=0)
    for flag, expected in ((False, 3), (True, digits.n_clients)):
        w = runs[flag].state["theta"]["net.1.weight"]
        assert int((w != init["net.1.weight"]).flatten(1).any(1).sum()) == expected
        assert set(runs[flag].state) == {"global", "theta", "m"}


@pytest.mark.parametrize("make", [lambda m: FedEM(m), lambda m: PFedMe(m, train_idle=True),
                                  lambda m: DPFedEM(m, clip=1.0, noise=0.3)])
def test_checkpoint_resume(tmp_path, digits, make):
    kw = dict(local_steps=2, clients_per_round=4, batch_size=6, eval_every=2, seed=1)
    full = train(make(LogisticModel(64, 10)), digits, rounds=4, **kw)
    ckpt = tmp_path / "run.pt"
    train(make(LogisticModel(64, 10)), digits, rounds=2, checkpoint=ckpt, **kw)
    resumed = train(make(LogisticModel(64, 10)), digits, rounds=4, checkpoint=ckpt, **kw)
    assert resumed.history == full.history
    torch.testing.assert_close(resumed.accuracy, full.accuracy, atol=0, rtol=0)


def test_fedem_is_evaluated_as_a_mixture(digits):
    strat = FedEM(LogisticModel(64, 10))
    res = train(strat, digits, rounds=3, local_steps=3, clients_per_round=4, batch_size=8)
    mixture = strat.personal_logits(res.state, digits.x_test)
    hit = (mixture.argmax(-1) == digits.y_test).float()
    valid = torch.arange(digits.x_test.shape[1])[None, :] < digits.n_test[:, None]
    expect = (hit * valid).sum(1) / digits.n_test.float()
    torch.testing.assert_close(evaluate_strategy(strat, res.state, digits), expect)
    torch.testing.assert_close(res.state["pi"].sum(1), torch.ones(digits.n_clients))
    assert not torch.equal(res.state["components"]["net.1.weight"][0],
                           res.state["components"]["net.1.weight"][1])


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls, kwargs, match", [
    (FedAvgFT, {"finetune_steps": 0}, "finetune_steps"),
    (FedAvgFT, {"finetune_lr": -1.0}, "finetune_lr"),
    (FedAvgFT, {"data": np.zeros(3)}, "FederatedDataset"),
    (Ditto, {"lam": -0.1}, "lam"),
    (Ditto, {"lr_personal": 0.0}, "lr_personal"),
    (PFedMe, {"inner_steps": 0}, "inner_steps"),
    (PFedMe, {"lam": 0.0}, "lam"),
    (PFedMe, {"beta": float("nan")}, "beta"),
    (PFedMe, {"lr_personal": 0.0}, "lr_personal"),
    (PerFedAvg, {"alpha": 0.0}, "alpha"),
    (PerFedAvg, {"lr": -0.1}, "lr"),
    (QuPeDFP, {"lam_p": -1.0}, "lam_p"),
    (QuPeDFP, {"lr_global": 0.0}, "lr_global"),
    (FML, {"alpha": 1.5}, "alpha"),
    (FML, {"beta": -0.1}, "beta"),
    (FML, {"lr_meme": 0.0}, "lr_meme"),
    (FedEM, {"n_components": 0}, "n_components"),
    (FedEM, {"init_seed": -1}, "init_seed"),
    (FedEM, {"weight_decay": -1e-4}, "weight_decay"),
])
def test_bad_hyperparameters(cls, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        cls(LogisticModel(64, 10), **kwargs)


def test_bad_hyperparameter_types():
    with pytest.raises(TypeError, match="inner_steps"):
        PFedMe(LogisticModel(64, 10), inner_steps=2.5)
    with pytest.raises(TypeError, match="lam"):
        Ditto(LogisticModel(64, 10), lam="0.5")


def test_minibatch_adaptation_equals_a_loop_and_is_deterministic(digits):
    from ebfl.learning.torch.baselines import minibatch_steps

    model = MLP(64, 10, hidden=(8,)).double()
    stack = {n: p.detach().unsqueeze(0).repeat(digits.n_clients, *([1] * p.dim())).double()
             for n, p in model.named_parameters()}
    out = minibatch_steps(model, stack, digits, 3, 0.2, 1e-3, batch_size=5, seed=4)
    again = minibatch_steps(model, stack, digits, 3, 0.2, 1e-3, batch_size=5, seed=4)
    for n in out:
        torch.testing.assert_close(out[n], again[n], atol=0, rtol=0)
    gen = torch.Generator().manual_seed(4)
    batches = [digits.sample_batch(torch.arange(digits.n_clients), 5, gen) for _ in range(3)]
    for i in range(digits.n_clients):
        p = {n: v[i].clone() for n, v in stack.items()}
        for x, y in batches:
            ps = {n: v.clone().requires_grad_() for n, v in p.items()}
            loss = F.cross_entropy(functional_call(model, ps, (x[i].double(),)), y[i])
            g = torch.autograd.grad(loss, list(ps.values()))
            p = {n: (v - 0.2 * (gi + 1e-3 * v)).detach()
                 for (n, v), gi in zip(ps.items(), g, strict=True)}
        for n in p:
            torch.testing.assert_close(out[n][i], p[n], atol=1e-10, rtol=0)
