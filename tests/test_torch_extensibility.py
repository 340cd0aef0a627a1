"""The federated protocol carries the shapes of the later papers' algorithms.

Two minimal strategies, written here against the public strategy protocol only
(a client half and a server half, :mod:`ebfl.learning.torch.strategies`):

* ``AdapterDistill`` has PerAda's shape (Sec. 4 of Xie et al., CVPR 2024): a
  frozen pretrained backbone shared by everyone, per-client personal adapters
  with a proximal pull to the global adapter, local adapters averaged by the
  server and then distilled on unlabeled server data;
* ``TwoLevelDPFedAvg`` has FedHDP's shape (Algorithm 2 of "Federated Learning
  with Heterogeneous Differential Privacy"): clients in two privacy groups,
  updates clipped on the client, a noisy mean within each group drawn by the
  server, and a weighted average across groups with ratio r.

They are not the papers' algorithms (no adaptive clipping, no Ditto step, toy
sizes); they show that nothing in the runtime needs a second loop for them,
and that both run one client at a time (as on Flower) to the same result.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call, grad  # noqa: E402

from ebfl.federated import RoundContext, RunConfig, run, sample_clients  # noqa: E402
from ebfl.federated.streams import SERVER, stream_seed  # noqa: E402
from ebfl.federated.tree import tree_nbytes  # noqa: E402
from ebfl.learning.torch import MLP, train  # noqa: E402
from ebfl.learning.torch.functional import (  # noqa: E402
    client_forward,
    client_grad,
    cross_entropy,
    distillation_kl,
    fresh_params,
    replicate,
    sgd_step,
    weighted_mean,
)
from ebfl.learning.torch.strategies import Strategy  # noqa: E402
from tests.test_federated import assert_trees_close, drive_one_client_at_a_time  # noqa: E402
from tests.test_torch_engine import _digits_clients  # noqa: E402

BACKBONE = ("net.1.weight", "net.1.bias")  # MLP(64, 10, hidden=(32,)): Flatten, Linear, ...


def _model():
    return MLP(64, 10, hidden=(32,))


def _pretrained_backbone():
    """Stands in for a pretrained backbone: any fixed parameters of the first layer."""
    return {n: p for n, p in fresh_params(_model(), 123).items() if n in BACKBONE}


def _ce(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


class AdapterDistill(Strategy):
    """Message: the global adapter w. Reply: each client's local adapter after the round.
    Client state: its personal adapter v. The backbone is given to everyone at the start
    (the constructor) and never travels."""

    name = "adapter-distill"

    def __init__(self, model, backbone, aux_x, lr=0.1, lam=0.1, lr_server=0.1, server_steps=3):
        self.model, self.backbone, self.aux_x = model, backbone, aux_x
        self.lr, self.lam, self.lr_server, self.server_steps = lr, lam, lr_server, server_steps

    def config(self):
        return {"name": self.name, "lr": self.lr, "lam": self.lam, "lr_server": self.lr_server,
                "server_steps": self.server_steps}

    def frozen(self):
        return self.backbone

    def _adapter(self, run):
        return {n: p for n, p in self.initial_params(run).items() if n not in BACKBONE}

    # ---- server half
    def init_server(self, run):
        return {"w": self._adapter(run)}

    def broadcast(self, server, rc):
        return {"w": server["w"]}

    def aggregate(self, server, replies, weights, rc):
        local, u = replies["local"], self.backbone
        k = next(iter(local.values())).shape[0]
        with torch.no_grad():  # teachers: the mean logits of the clients' local adapters
            xs = self.aux_x.expand(k, *self.aux_x.shape)
            teacher = client_forward(self.model, local, xs, frozen=u).mean(0)
        w = weighted_mean(local, torch.ones(k))

        def kd(params):
            student = functional_call(self.model, (params, u), (self.aux_x,))
            return distillation_kl(teacher, student)

        for _ in range(self.server_steps):
            g = grad(kd)(w)
            w = {n: p - self.lr_server * g[n] for n, p in w.items()}
        return {"w": w}

    # ---- client half
    def init_clients(self, run, data, clients):
        return {"v": replicate(self._adapter(run), len(clients))}

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        return {"local": replicate(message["w"], k), "anchor": replicate(message["w"], k)}

    def local_step(self, work, client, x, y, scale, rng):
        u = self.backbone

        def personal_loss(forward, params, xb, yb, anchor):
            prox = sum(((params[n] - anchor[n]) ** 2).sum() for n in params)
            return cross_entropy(forward(params, xb), yb) + self.lam / 2 * prox

        g = client_grad(self.model, personal_loss, client["v"], x, y, work["anchor"], frozen=u)
        client["v"] = sgd_step(client["v"], g, self.lr * scale)
        g = client_grad(self.model, _ce, work["local"], x, y, frozen=u)
        work["local"] = sgd_step(work["local"], g, self.lr * scale)

    def client_reply(self, work, client):
        return {"local": work["local"]}

    def personal(self, message, client, data):
        return client["v"]


def _clip_rows(update, clip):
    """Scale each client's update (all blocks together) to L2 norm <= clip. Written out:
    clip_and_noise always draws noise from the clients' streams, and here the noise is
    the server's."""
    k = next(iter(update.values())).shape[0]
    sq = sum(p.reshape(k, -1).pow(2).sum(1) for p in update.values())
    factor = 1 / torch.clamp(torch.sqrt(sq) / clip, min=1.0)
    return {n: p * factor.reshape(-1, *([1] * (p.dim() - 1))) for n, p in update.items()}


class TwoLevelDPFedAvg(Strategy):
    """Message: the global model. Reply: each client's clipped update. The server knows
    every client's privacy group and adds each group's noise to the group's mean."""

    name = "two-level-dp-fedavg"

    def __init__(self, model, private, noise, clip=1.0, ratio=0.5, lr=0.1):
        self.model, self.private = model, private  # private: bool per client id
        self.noise, self.clip, self.ratio, self.lr = noise, clip, ratio, lr  # noise: per group

    def config(self):
        return {"name": self.name, "noise": list(self.noise), "clip": self.clip,
                "ratio": self.ratio, "lr": self.lr, "private": self.private.tolist()}

    # ---- server half
    def init_server(self, run):
        return {"global": self.initial_params(run)}

    def broadcast(self, server, rc):
        return {"global": server["global"]}

    def aggregate(self, server, replies, weights, rc):
        # the server's own noise stream of the round ("aggregate": apart from the stream
        # that sampled the clients)
        gen = torch.Generator().manual_seed(
            stream_seed(rc.config.seed, rc.round, SERVER, "aggregate"))
        group = self.private[torch.as_tensor(rc.clients)].long()
        r = (1.0, self.ratio)
        counts = [int((group == j).sum()) for j in (0, 1)]
        total = sum(r[j] * counts[j] for j in (0, 1))
        if total == 0:  # only ignored clients replied
            return server
        new = dict(server["global"])
        for j in (0, 1):  # a noisy mean within each privacy group
            if counts[j] == 0:
                continue
            rows = torch.nonzero(group == j).flatten()
            mean = weighted_mean({n: p[rows] for n, p in replies["delta"].items()},
                                 torch.ones(counts[j]))
            std = self.noise[j] * self.clip / counts[j]
            for n, p in mean.items():
                noisy = p + std * torch.randn(p.shape, generator=gen)
                new[n] = new[n] + r[j] * counts[j] / total * noisy
        return {"global": new}

    # ---- client half
    def client_begin(self, message, client, rc):
        k = rc.clients.size
        return {"start": replicate(message["global"], k),
                "model": replicate(message["global"], k)}

    def local_step(self, work, client, x, y, scale, rng):
        g = client_grad(self.model, _ce, work["model"], x, y)
        work["model"] = sgd_step(work["model"], g, self.lr * scale)

    def client_reply(self, work, client):
        delta = {n: p - work["start"][n] for n, p in work["model"].items()}
        return {"delta": _clip_rows(delta, self.clip)}

    def personal(self, message, client, data):
        return replicate(message["global"], data.n_clients)

    def evaluation_message(self, server):
        return {"global": server["global"]}


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
    backbone = _pretrained_backbone()
    kept = {n: p.clone() for n, p in backbone.items()}
    kw = dict(local_steps=5, clients_per_round=4, batch_size=10, eval_every=5, seed=0)
    res = train(AdapterDistill(_model(), backbone, _aux(digits)), digits, n_rounds=20, **kw)
    for n in BACKBONE:  # the backbone never moved, and never travelled
        assert torch.equal(backbone[n], kept[n])
        assert n not in res.server["w"] and n not in res.clients["v"]
    adapter_bytes = tree_nbytes(res.server["w"])
    assert all(h["bytes_down"] == h["bytes_up"] == 4 * adapter_bytes for h in res.history)
    # chance is 0.1; personal adapters on a random 32-unit backbone reach about 0.5 here
    assert res.history[-1]["accuracy"] > 0.3
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):  # a run interrupted after round 10
        interrupted = AdapterDistill(_model(), backbone, _aux(digits))
        interrupted.aggregate = _interrupt_at(interrupted.aggregate, 10)
        train(interrupted, digits, n_rounds=20, checkpoint=ckpt, **kw)
    resumed = train(AdapterDistill(_model(), backbone, _aux(digits)), digits, n_rounds=20,
                    checkpoint=ckpt, **kw)
    assert resumed.history == res.history
    assert_trees_close(resumed.server, res.server)
    assert_trees_close(resumed.clients, res.clients)


def _interrupt_at(aggregate, round_):
    def interrupting(server, replies, weights, rc):
        if rc.round == round_:
            raise KeyboardInterrupt
        return aggregate(server, replies, weights, rc)

    return interrupting


def _private(m):
    return torch.arange(m) % 3 != 0  # two thirds opt for privacy


def test_two_privacy_levels_with_group_weighted_aggregation(digits):
    m = digits.n_clients
    model = _model()
    strat = TwoLevelDPFedAvg(model, _private(m), noise=(0.0, 0.0), clip=1e9, ratio=0.25)
    cfg = RunConfig(n_clients=m, n_rounds=1)
    server = strat.init_server(cfg)
    active = np.array([0, 1, 2, 4])  # clients 0 (open), 1, 2, 4 (private)
    gen = torch.Generator().manual_seed(3)
    delta = {n: torch.randn((4, *p.shape), generator=gen) for n, p in server["global"].items()}
    new = strat.aggregate(server, {"delta": delta}, np.ones(4), RoundContext(cfg, 0, active))
    # group 0 has 1 client, group 1 has 3: weights 1 / (1 + 0.25 * 3) and 0.75 / 1.75
    for n, p in server["global"].items():
        expect = p + (1 / 1.75) * delta[n][0] + (0.75 / 1.75) * delta[n][1:].mean(0)
        torch.testing.assert_close(new["global"][n], expect, atol=1e-5, rtol=0)

    kw = dict(n_rounds=6, local_steps=3, clients_per_round=6, batch_size=8, seed=1)

    def history(noise_private, ratio):
        strat = TwoLevelDPFedAvg(_model(), _private(m), (0.0, noise_private), ratio=ratio)
        return train(strat, digits, **kw).history

    assert history(50.0, 0.5) == history(50.0, 0.5)  # the server's noise comes from the seed
    assert history(50.0, 0.5) != history(0.0, 0.5)
    # r = 0: the server ignores the private group, whatever its noise (App. C of the paper)
    assert history(50.0, 0.0) == history(0.0, 0.0)


def test_client_updates_are_clipped_before_they_leave(digits):
    m, clip = digits.n_clients, 1e-3
    cfg = RunConfig(n_clients=m, n_rounds=1, clients_per_round=5, local_steps=3, batch_size=8)
    strat = TwoLevelDPFedAvg(_model(), _private(m), (0.0, 1.0), clip=clip)
    ids = sample_clients(cfg, 0)
    rc = RoundContext(cfg, 0, ids)
    reply = strat.client_train(strat.broadcast(strat.init_server(cfg), rc), {},
                               digits.subset(ids), rc)
    norms = torch.sqrt(sum(p.reshape(5, -1).pow(2).sum(1) for p in reply["delta"].values()))
    torch.testing.assert_close(norms, torch.full((5,), clip), rtol=1e-5, atol=0)


@pytest.mark.parametrize("which", ["adapter", "two-level"])
def test_both_shapes_run_one_client_at_a_time_to_the_same_result(digits, which):
    m = digits.n_clients
    cfg = RunConfig(n_clients=m, n_rounds=3, clients_per_round=4, local_steps=3, batch_size=8,
                    seed=4)

    def make():
        if which == "adapter":
            return AdapterDistill(_model(), _pretrained_backbone(), _aux(digits))
        return TwoLevelDPFedAvg(_model(), _private(m), (0.0, 2.0), ratio=0.5)

    res = run(make(), digits, cfg)
    server, clients, metrics = drive_one_client_at_a_time(make(), digits, cfg)
    assert_trees_close(res.server, server, atol=1e-6)
    assert_trees_close(res.clients, clients, atol=1e-6)
    assert_trees_close(res.metrics, metrics, atol=1e-6)
