"""The one round loop carries the shapes of the later papers' algorithms.

Two minimal strategies, written here against the public strategy protocol only:

* ``AdapterDistill`` has PerAda's shape (spec perada 3.1): a frozen backbone
  shared by everyone, per-client personal adapters with a proximal pull to the
  global adapter, local adapters averaged by the server and then distilled on
  unlabeled server data;
* ``TwoLevelDPFedAvg`` has FedHDP's shape (spec fedhdp 3.3): clients in two
  privacy groups with their own noise levels, a noisy mean within each group,
  and a weighted average across groups with ratio r.

They are not the papers' algorithms (no adaptive clipping, no Ditto step, toy
sizes); they show that nothing in the engine needs a second loop for them.
"""

import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call, grad  # noqa: E402

from ebfl.learning.torch import MLP, train  # noqa: E402
from ebfl.learning.torch.functional import (  # noqa: E402
    client_forward,
    client_grad,
    cross_entropy,
    distillation_kl,
    fresh_params,
    put,
    replicate,
    sgd_step,
    take,
    weighted_mean,
)
from ebfl.learning.torch.strategies import GaussianRelease, Strategy  # noqa: E402
from tests.test_torch_engine import _digits_clients  # noqa: E402

BACKBONE = ("net.1.weight", "net.1.bias")  # MLP(64, 10, hidden=(32,)): Flatten, Linear, ...


def _model():
    return MLP(64, 10, hidden=(32,))


def _ce(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


class AdapterDistill(Strategy):
    name = "adapter-distill"

    def __init__(self, model, aux_x, lr=0.1, lam=0.1, lr_server=0.1, server_steps=3):
        self.model, self.aux_x = model, aux_x
        self.lr, self.lam, self.lr_server, self.server_steps = lr, lam, lr_server, server_steps

    def config(self):
        return {"name": self.name, "lr": self.lr, "lam": self.lam}

    def init_state(self, params, m):
        adapter = {n: p.clone() for n, p in params.items() if n not in BACKBONE}
        return {"backbone": {n: params[n].clone() for n in BACKBONE}, "w": adapter,
                "v": replicate(adapter, m)}

    def broadcast(self, state, active):
        state["work"] = replicate(state["w"], active.numel())
        state["anchor"] = replicate(state["w"], active.numel())

    def local_step(self, state, active, x, y, scale):
        u = state["backbone"]

        def personal_loss(forward, params, xb, yb, anchor):
            prox = sum(((params[n] - anchor[n]) ** 2).sum() for n in params)
            return cross_entropy(forward(params, xb), yb) + self.lam / 2 * prox

        v = take(state["v"], active)
        g = client_grad(self.model, personal_loss, v, x, y, state["anchor"], frozen=u)
        put(state["v"], active, sgd_step(v, g, self.lr * scale))
        g = client_grad(self.model, _ce, state["work"], x, y, frozen=u)
        state["work"] = sgd_step(state["work"], g, self.lr * scale)

    def aggregate(self, state, active, n_samples):
        local = state.pop("work")
        state.pop("anchor")
        k, u = active.numel(), state["backbone"]
        with torch.no_grad():  # teachers: the mean logits of the sampled local adapters
            xs = self.aux_x.expand(k, *self.aux_x.shape)
            teacher = client_forward(self.model, local, xs, frozen=u).mean(0)
        w = weighted_mean(local, torch.ones(k))

        def kd(params):
            student = functional_call(self.model, (params, u), (self.aux_x,))
            return distillation_kl(teacher, student)

        for _ in range(self.server_steps):
            g = grad(kd)(w)
            w = {n: p - self.lr_server * g[n] for n, p in w.items()}
        state["w"] = w

    def personal(self, state):
        return state["v"]

    def frozen(self, state):
        return state["backbone"]


class TwoLevelDPFedAvg(GaussianRelease, Strategy):
    name = "two-level-dp-fedavg"

    def __init__(self, model, private, noise, clip=1.0, ratio=0.5, lr=0.1):
        self.model, self.private = model, private  # private: bool per client
        self.noise, self.clip, self.ratio, self.lr = noise, clip, ratio, lr  # noise: per group

    def config(self):
        return {"name": self.name, "noise": list(self.noise), "ratio": self.ratio}

    def init_state(self, params, m):
        return {"global": {n: p.clone() for n, p in params.items()}, "m": m}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def local_step(self, state, active, x, y, scale):
        g = client_grad(self.model, _ce, state["work"], x, y)
        state["work"] = sgd_step(state["work"], g, self.lr * scale)

    def aggregate(self, state, active, n_samples):
        delta = {n: p - state["global"][n] for n, p in state.pop("work").items()}
        group = self.private[active].long()
        means, counts = [], []
        for j in (0, 1):  # clip each update, then a noisy mean within each privacy group
            rows = torch.nonzero(group == j).flatten()
            counts.append(rows.numel())
            if rows.numel() == 0:
                means.append(None)
                continue
            clipped = self.privatize(take(delta, rows), self.clip, 0.0)
            mean = weighted_mean(clipped, torch.ones(rows.numel()))
            std = self.noise[j] * self.clip / rows.numel()
            means.append({n: p + std * torch.randn(p.shape, generator=self.generator)
                          for n, p in mean.items()})
        r = (1.0, self.ratio)
        total = sum(r[j] * counts[j] for j in (0, 1))
        for n in state["global"]:
            state["global"][n] = state["global"][n] + sum(
                r[j] * counts[j] / total * means[j][n] for j in (0, 1) if counts[j])

    def personal(self, state):
        return replicate(state["global"], state["m"])


@pytest.fixture(scope="module")
def digits():
    return _digits_clients()


def _aux(digits):
    """Unlabeled server data: one test input per client (labels never used)."""
    return digits.x_test[:, 0]


def test_frozen_parameters_get_no_gradient_and_match_the_full_gradient():
    model = _model().double()
    k = 3
    full = replicate({n: p.detach() for n, p in model.named_parameters()}, k)
    x = torch.rand((k, 5, 64), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.randint(0, 10, (k, 5), generator=torch.Generator().manual_seed(1))
    frozen = {n: full[n][0] for n in BACKBONE}
    adapters = {n: p for n, p in full.items() if n not in BACKBONE}
    g_full = client_grad(model, _ce, full, x, y)
    g_adapt = client_grad(model, _ce, adapters, x, y, frozen=frozen)
    assert set(g_adapt) == set(adapters)
    for n in adapters:
        torch.testing.assert_close(g_adapt[n], g_full[n], atol=1e-12, rtol=0)
    torch.testing.assert_close(client_forward(model, adapters, x, frozen=frozen),
                               client_forward(model, full, x), atol=1e-12, rtol=0)


def test_adapter_strategy_with_server_distillation_runs_in_the_one_loop(digits, tmp_path):
    kw = dict(local_steps=5, clients_per_round=4, batch_size=10, eval_every=5, seed=0)
    res = train(AdapterDistill(_model(), _aux(digits)), digits, rounds=20, **kw)
    init = fresh_params(_model(), 0)  # what train initialized from (seed 0)
    for n in BACKBONE:  # the backbone never moved
        assert torch.equal(res.state["backbone"][n], init[n])
    # chance is 0.1; personal adapters on a random 32-unit backbone reach about 0.5 here
    assert res.history[-1]["accuracy"] > 0.3
    ckpt = tmp_path / "run.pt"
    train(AdapterDistill(_model(), _aux(digits)), digits, rounds=10, checkpoint=ckpt, **kw)
    resumed = train(AdapterDistill(_model(), _aux(digits)), digits, rounds=20, checkpoint=ckpt,
                    **kw)
    assert resumed.history == res.history


def test_two_privacy_levels_with_group_weighted_aggregation(digits):
    m = digits.n_clients
    private = torch.arange(m) % 3 != 0  # two thirds opt for privacy
    model = _model()
    strat = TwoLevelDPFedAvg(model, private, noise=(0.0, 0.0), clip=1e9, ratio=0.25)
    strat.bind_generator(torch.Generator().manual_seed(0))
    params = {n: p.detach() for n, p in model.named_parameters()}
    state = strat.init_state(params, m)
    active = torch.tensor([0, 1, 2, 4])  # clients 0 (open), 1, 2, 4 (private)
    strat.broadcast(state, active)
    gen = torch.Generator().manual_seed(3)
    state["work"] = {n: p + torch.randn(p.shape, generator=gen) for n, p in state["work"].items()}
    work = {n: p.clone() for n, p in state["work"].items()}
    strat.aggregate(state, active, digits.n_train[active])
    # group 0 has 1 client, group 1 has 3: weights 1 / (1 + 0.25 * 3) and 0.75 / 1.75
    for n in params:
        expect = (1 / 1.75) * work[n][0] + (0.75 / 1.75) * work[n][1:].mean(0)
        torch.testing.assert_close(state["global"][n], expect, atol=1e-5, rtol=0)

    kw = dict(rounds=6, local_steps=3, clients_per_round=6, batch_size=8, seed=1)

    def run(noise_private, ratio):
        strat = TwoLevelDPFedAvg(_model(), private, (0.0, noise_private), ratio=ratio)
        return train(strat, digits, **kw).history

    assert run(50.0, 0.5) == run(50.0, 0.5)  # the per-group noise comes from the seed
    assert run(50.0, 0.5) != run(0.0, 0.5)
    # r = 0: the server ignores the private group, whatever its noise (spec fedhdp 3.3)
    assert run(50.0, 0.0) == run(0.0, 0.0)
