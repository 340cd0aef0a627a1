"""Partial personalization (FedAlt, FedSim, FedRep, FedBN, LG-FedAvg), APFL and FedDF on a small
BatchNorm ResNet: each update against a plain-autograd reference, stacked clients equal to one
client at a time through Flower's transport, and what crosses the network."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call  # noqa: E402

from ebfl.federated.protocol import RoundContext, sample_clients  # noqa: E402
from ebfl.federated.streams import stream_seed  # noqa: E402
from ebfl.federated.tree import flatten, tree_cat  # noqa: E402
from ebfl.learning.torch import FedAvg, FederatedDataset, Local, train  # noqa: E402
from ebfl.learning.torch.adapters import (  # noqa: E402
    ResNet18Adapters,
    SmallResNet,
    parameter_groups,
)
from ebfl.learning.torch.baselines import APFL, Ditto, FedDF  # noqa: E402
from ebfl.learning.torch.engine import run_config  # noqa: E402
from ebfl.learning.torch.functional import (  # noqa: E402
    buffer_names,
    client_generators,
    fresh_params,
)
from ebfl.learning.torch.partial import FedAlt, FedBN, FedRep, FedSim, LGFedAvg  # noqa: E402
from tests.test_torch_engine import _digits_clients  # noqa: E402

#: float32 models: a vmapped (grouped) convolution sums in another order than a single one
TOL = dict(atol=1e-6, rtol=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def digit_images(m=6):
    """load_digits as 8 x 8 images, split pathologically over m clients (3 classes each)."""
    flat = _digits_clients(m=m)
    parts = [[], [], [], []]
    for i in range(m):
        n, t = int(flat.n_train[i]), int(flat.n_test[i])
        parts[0].append(flat.x_train[i, :n].reshape(n, 8, 8).numpy())
        parts[1].append(flat.y_train[i, :n].numpy())
        parts[2].append(flat.x_test[i, :t].reshape(t, 8, 8).numpy())
        parts[3].append(flat.y_test[i, :t].numpy())
    return FederatedDataset.from_clients(*parts, n_classes=10)


def bn_net(adapters=False):
    """A ResNet with BatchNorm (and, with adapters, the dropout key buffer): ~1,400 parameters."""
    return SmallResNet(10, 1, widths=(4, 8), adapters=adapters)


def pretrained_state(model, seed=1):
    """A state unlike a fresh initialization: random parameters and running statistics."""
    gen = torch.Generator().manual_seed(seed)
    state = fresh_params(model, seed)
    for name, t in state.items():
        if name.endswith("running_var"):
            state[name] = 0.5 + torch.rand(t.shape, generator=gen)
        elif name.endswith("running_mean"):
            state[name] = 0.3 * torch.randn(t.shape, generator=gen)
        elif name != "dropout_key":
            state[name] = t + 0.05 * torch.randn(t.shape, generator=gen)
    return state


@pytest.fixture(scope="module")
def images():
    return digit_images()


@pytest.fixture(scope="module")
def plain():
    net = bn_net()
    return net, pretrained_state(net)


@pytest.fixture(scope="module")
def adapted():
    net = bn_net(adapters=True)
    return net, pretrained_state(net)


PARTIAL = {
    "FedAlt (input layer)": lambda net, pre: FedAlt(net, 0.05, personal="input", pretrained=pre),
    "FedAlt (output layer)": lambda net, pre: FedAlt(net, 0.05, 0.1, personal="output",
                                                     personal_steps=3, pretrained=pre),
    "FedAlt (adapter)": lambda net, pre: FedAlt(net, 0.05, personal="adapter", pretrained=pre),
    "FedSim (input layer)": lambda net, pre: FedSim(net, 0.05, personal="input", pretrained=pre),
    "FedSim (output layer)": lambda net, pre: FedSim(net, 0.05, personal="output",
                                                     pretrained=pre),
    "FedSim (adapter)": lambda net, pre: FedSim(net, 0.05, 0.1, personal="adapter",
                                                weight_decay=1e-3, pretrained=pre),
    "FedRep": lambda net, pre: FedRep(net, 0.05, pretrained=pre),
    "FedBN": lambda net, pre: FedBN(net, 0.05, pretrained=pre),
    "LG-FedAvg": lambda net, pre: LGFedAvg(net, 0.05, pretrained=pre),
}
ADAPTER_MODELS = {"FedAlt (adapter)", "FedSim (adapter)"}
RUN = dict(n_rounds=2, local_steps=2, clients_per_round=3, batch_size=5, seed=3)


def _make(key, plain, adapted):
    net, pre = adapted if key in ADAPTER_MODELS else plain
    return PARTIAL[key](net, pre)


def _flat(res):
    return flatten({**res.server, **res.clients})


# --- the strategies run, are deterministic, and keep v_m home -----------------------------------

@pytest.mark.parametrize("key", list(PARTIAL))
def test_each_strategy_runs_and_is_deterministic_by_seed(images, plain, adapted, key):
    alg = _make(key, plain, adapted)
    assert alg.name == key
    a, b = train(alg, images, **RUN), train(alg, images, **RUN)
    c = train(alg, images, **{**RUN, "seed": 4})
    fa, fb, fc = _flat(a), _flat(b), _flat(c)
    assert all(torch.equal(fa[n], fb[n]) for n in fa)
    assert any(not torch.equal(fa[n], fc[n]) for n in fa)
    assert torch.equal(a.accuracy, b.accuracy)
    assert bool(((a.accuracy >= 0) & (a.accuracy <= 1)).all())
    assert alg.global_state(a.server) is None


@pytest.mark.parametrize("key", list(PARTIAL))
def test_the_personal_part_never_leaves_the_client(images, plain, adapted, key):
    alg = _make(key, plain, adapted)
    personal, shared = set(alg.personal_names), set(alg.shared_names)
    assert personal and shared and not personal & shared
    seen = []

    class Recording(type(alg)):
        def aggregate(self, server, replies, weights, rc):
            seen.append((replies, np.asarray(weights), rc.clients))
            return super().aggregate(server, replies, weights, rc)

    spy = object.__new__(Recording)
    spy.__dict__.update(alg.__dict__)
    res = train(spy, images, **RUN)
    assert len(seen) == RUN["n_rounds"]
    for replies, _, _ in seen:
        assert set(replies) == {"shared"} and set(replies["shared"]) == shared
    replies, weights, clients = seen[-1]  # u: the replies averaged by training-set size
    np.testing.assert_array_equal(weights, images.n_train[clients].numpy())
    for n, t in res.server["shared"].items():
        mean = sum(w / weights.sum() * replies["shared"][n][j] for j, w in enumerate(weights))
        torch.testing.assert_close(t, mean, atol=1e-6, rtol=0, msg=n)
    assert set(res.server) == {"shared"} and set(res.server["shared"]) == shared
    assert set(res.clients) == {"personal"} and set(res.clients["personal"]) == personal
    cfg = run_config(images, **RUN)
    message = alg.broadcast(alg.init_server(cfg), RoundContext(cfg, 0, np.array([1])))
    assert set(message) == {"shared"} and set(message["shared"]) == shared


def test_unsampled_clients_keep_their_personal_part(images, plain):
    net, pre = plain
    alg = FedSim(net, personal="output", lr=0.05, pretrained=pre)
    res = train(alg, images, **{**RUN, "n_rounds": 1})
    cfg = run_config(images, **RUN)
    sampled = sample_clients(cfg, 0)
    start = alg.init_clients(cfg, images, np.arange(images.n_clients))["personal"]
    for c in range(images.n_clients):
        kept = all(torch.equal(res.clients["personal"][n][c], start[n][c]) for n in start)
        assert kept == (c not in sampled), c


def test_fedbn_server_never_holds_a_batchnorm_tensor(images, plain):
    net, pre = plain
    alg = FedBN(net, lr=0.05, pretrained=pre)
    bn = set(parameter_groups(net)["bn"])
    assert set(alg.personal_names) == bn
    res = train(alg, images, **{**RUN, "clients_per_round": None})
    assert not bn & set(res.server["shared"])
    weights = res.clients["personal"]["bn1.weight"]
    assert not torch.equal(weights[0], weights[1])  # each client's own BatchNorm
    assert set(res.server["shared"]) == set(dict(net.named_parameters())) - bn


def test_lg_fedavg_shares_the_head_only(images, plain):
    net, pre = plain
    alg = LGFedAvg(net, lr=0.05, pretrained=pre)
    assert alg.shared_names == ["fc.weight", "fc.bias"]
    assert alg.communicated_parameters() == 8 * 10 + 10
    res = train(alg, images, **RUN)
    assert set(res.server["shared"]) == {"fc.weight", "fc.bias"}


def test_a_pretrained_backbone_can_be_frozen(images, adapted):
    net, pre = adapted
    alg = FedAlt(net, personal="output", lr=0.05, frozen="backbone", pretrained=pre)
    backbone = set(parameter_groups(net)["backbone"])
    assert set(alg.frozen_names) == backbone
    assert not backbone & set(alg.shared_names + alg.personal_names)
    assert "dropout_key" in alg.personal_names  # each client's own dropout stream
    res = train(alg, images, **RUN)
    assert not backbone & set(_flat(res))
    for n in backbone:  # the frozen tensors, downsample BatchNorm statistics included, as given
        assert torch.equal(alg.frozen()[n], pre[n])
    params = dict(net.named_parameters())
    assert alg.trained_parameters() == sum(params[n].numel() for n in params
                                           if n not in backbone)


def test_each_client_draws_its_own_dropout_masks(images, adapted):
    net, pre = adapted
    alg = FedSim(net, personal="adapter", lr=0.05, pretrained=pre)
    res = train(alg, images, **{**RUN, "clients_per_round": None, "n_rounds": 1})
    keys = res.clients["personal"]["dropout_key"]
    assert "dropout_key" not in res.server["shared"]
    assert len(set(keys.tolist())) == images.n_clients  # redrawn from each client's stream


# --- update rules against plain autograd ----------------------------------------------------

def _rows(state, idx):
    return {n: t[idx].clone() for n, t in state.items()}


def _sgd(model, state, names, x, y, lr, wd=0.0):
    """One plain-autograd SGD step of one client's model on the parameters ``names``; the
    rest of ``state`` held fixed, its buffers updated by the train-mode forward pass."""
    state = {n: t.clone() for n, t in state.items()}
    ps = {n: state[n].requires_grad_() for n in names}
    rest = {n: t for n, t in state.items() if n not in ps}
    loss = F.cross_entropy(functional_call(model, {**ps, **rest}, (x,)), y)
    g = torch.autograd.grad(loss, list(ps.values()))
    out = dict(rest)
    out.update({n: (p - lr * (gi + wd * p)).detach() for (n, p), gi in zip(ps.items(), g,
                                                                            strict=True)})
    return out


def _params(model, names):
    return [n for n in names if n in dict(model.named_parameters())]


def _random_states(model, k, seed=7):
    states = [pretrained_state(model, seed + i) for i in range(k)]
    return {n: torch.stack([s[n] for s in states]) for n in states[0]}


def _batch(k, b=6, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand((k, b, 8, 8), generator=gen), torch.randint(0, 10, (k, b), generator=gen)


def _close(got, want, **tol):
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], **{**TOL, **tol}, msg=n)


def test_a_fedsim_step_is_one_sgd_step_on_u_and_v(plain):
    net, _ = plain
    alg = FedSim(net, personal="output", lr=0.05, lr_personal=0.2, weight_decay=1e-2)
    k = 3
    state = _random_states(net, k)
    work = {"shared": {n: state[n].clone() for n in alg.shared_names}}
    client = {"personal": {n: state[n].clone() for n in alg.personal_names}}
    x, y = _batch(k)
    with alg.training():
        alg.local_step(work, client, x, y, 0.5, client_generators(range(k)))
    u, v = _params(net, alg.shared_names), _params(net, alg.personal_names)
    for i in range(k):
        ref = _sgd(net, _rows(state, i), u, x[i], y[i], 0.5 * 0.05, 1e-2)
        ref = {**ref, **{n: t for n, t in _sgd(net, _rows(state, i), v, x[i], y[i],
                                               0.5 * 0.2, 1e-2).items() if n in v}}
        _close(_rows({**work["shared"], **client["personal"]}, i), ref)
    moved = [n for n in buffer_names(net) if not torch.equal(work["shared"][n], state[n])]
    assert moved == buffer_names(net)  # every running statistic followed the forward pass


def _own_batches(data, client, seed, round_, steps, batch):
    """Client ``client``'s minibatches of a round, drawn by hand from its stream."""
    gen = torch.Generator().manual_seed(stream_seed(seed, round_, client))
    n = int(data.n_train[client])
    out = []
    for _ in range(steps):
        idx = (torch.rand(batch, generator=gen) * n).long()
        out.append((data.x_train[client, idx], data.y_train[client, idx]))
    return out


def test_a_fedalt_round_alternates_v_then_u(images, plain):
    net, pre = plain
    alg = FedAlt(net, 0.05, 0.2, personal="input", personal_steps=2, pretrained=pre)
    cfg = run_config(images, n_rounds=1, local_steps=3, batch_size=4, seed=11, lr_decay=0.5,
                     iters_per_epoch=2)
    clients = np.array([1, 4])
    rc = RoundContext(cfg, 0, clients)
    server = alg.init_server(cfg)
    state = alg.init_clients(cfg, images, clients)
    reply = alg.client_train(alg.broadcast(server, rc), state, images.subset(clients), rc)
    u, v = _params(net, alg.shared_names), _params(net, alg.personal_names)
    init = alg.initial_params(cfg)
    for j, c in enumerate(clients):
        ref = dict(init)
        batches = _own_batches(images, int(c), 11, 0, 2 + 3, 4)
        for x, y in batches[:2]:  # personal steps, the round's rate (decay 0.5**0 here)
            ref = _sgd(net, ref, v, x, y, 0.2)
        for step, (x, y) in enumerate(batches[2:]):  # shared steps, decayed per 2 iterations
            ref = _sgd(net, ref, u, x, y, 0.05 * 0.5 ** (step // 2))
        _close(_rows({**reply["shared"], **state["personal"]}, j), ref)


def test_fedalt_with_no_shared_rate_moves_v_but_not_u(images, plain):
    net, pre = plain
    alg = FedAlt(net, personal="output", lr=0.0, lr_personal=0.1, pretrained=pre)
    cfg = run_config(images, **RUN)
    start, init = alg.init_server(cfg)["shared"], alg.init_clients(cfg, images, range(6))
    res = train(alg, images, **{**RUN, "clients_per_round": None})
    buffers = set(buffer_names(net))
    for n, t in res.server["shared"].items():  # parameters fixed, statistics followed the data
        if n in buffers:
            assert float((t - start[n]).abs().max()) > 1e-3, n
        else:  # the server's average of identical copies: exact up to rounding
            torch.testing.assert_close(t, start[n], atol=1e-6, rtol=1e-6, msg=n)
    for n, t in res.clients["personal"].items():
        assert not torch.equal(t, init["personal"][n]), n


# --- the clients alone, through Flower's transport -------------------------------------------

def _through_flower(strat, data, cfg):
    """The run as the Flower runtime does it: each client's half for it alone, its state,
    the messages and the replies encoded and decoded as Flower carries them."""
    flower = pytest.importorskip("ebfl.flower.runtime")

    def send(tree):
        return flower.decode(flower.encode(tree), "torch")

    m = data.n_clients
    server = strat.init_server(cfg)
    states = [send(strat.init_clients(cfg, data.subset([c]), np.array([c]))) for c in range(m)]
    weights = strat.client_weights(data.subset(range(m)))
    for r in range(cfg.n_rounds):
        sampled = sample_clients(cfg, r)
        message = send(strat.broadcast(server, RoundContext(cfg, r, sampled)))
        replies = []
        for c in sampled:
            state = states[c]
            replies.append(send(strat.client_train(message, state, data.subset([c]),
                                                   RoundContext(cfg, r, np.array([c])))))
            states[c] = send(state)
        server = strat.aggregate(server, tree_cat(replies), weights[sampled],
                                 RoundContext(cfg, r, sampled))
    message = send(strat.evaluation_message(server))
    accuracy = torch.cat([strat.client_evaluate(message, states[c], data.subset([c]))["accuracy"]
                          for c in range(m)])
    return server, tree_cat(states), accuracy


OTHERS = {
    "APFL": lambda net, pre: APFL(net, 0.05, alpha=0.3, lr_alpha=0.5),
    # SGD: Adam divides by the root of its second moment and amplifies the runtimes' last-bit
    # differences (a vmapped convolution sums in another order) to ~1e-5 here
    "FedDF": lambda net, pre: FedDF(
        net, 0.05, aux=torch.rand(24, 8, 8, generator=torch.Generator().manual_seed(0)),
        kd_steps=3, kd_batch_size=8, kd_optimizer="sgd", kd_lr=0.1),
}


@pytest.mark.parametrize("key", [*PARTIAL, *OTHERS])
def test_a_client_alone_computes_what_it_computes_stacked(images, plain, adapted, key):
    if key in OTHERS:
        net, pre = plain
        alg = OTHERS[key](net, pre)
        kw = {"init_params": pre}
    else:
        alg, kw = _make(key, plain, adapted), {}
    res = train(alg, images, **RUN, **kw)
    if key in OTHERS:  # init_params reach the strategy through a copy made by train
        alg.init_params = pre
    server, clients, accuracy = _through_flower(alg, images, run_config(images, **RUN))
    stacked, alone = _flat(res), flatten({**server, **clients})
    assert stacked.keys() == alone.keys()
    for n in stacked:
        torch.testing.assert_close(stacked[n], alone[n].to(stacked[n].dtype), **TOL, msg=n)
    torch.testing.assert_close(res.accuracy, accuracy.float(), atol=1e-6, rtol=0)


# --- APFL -----------------------------------------------------------------------------------

def test_apfl_with_alpha_fixed_at_one_is_local_training(images, plain):
    net, pre = plain
    kw = dict(n_rounds=3, local_steps=2, batch_size=5, seed=2, init_params=pre)
    apfl = train(APFL(net, 0.05, alpha=1.0, learn_alpha=False, weight_decay=1e-3), images, **kw)
    local = train(Local(net, 0.05, weight_decay=1e-3), images, **kw)
    for n, t in local.clients["theta"].items():
        assert torch.equal(apfl.clients["personal"][n], t), n
    assert torch.equal(apfl.accuracy, local.accuracy)
    assert bool((apfl.clients["alpha"] == 1).all())


def test_an_apfl_step_matches_the_mixture_gradients(plain):
    net, _ = plain
    alg = APFL(net, 0.05, 0.1, alpha=0.4, lr_alpha=0.3, weight_decay=1e-3)
    k = 3
    w0, v0 = _random_states(net, k, seed=20), _random_states(net, k, seed=30)
    alpha0 = torch.tensor([0.4, 0.0, 1.0])
    work = {"model": {n: t.clone() for n, t in w0.items()}}
    client = {"personal": {n: t.clone() for n, t in v0.items()}, "alpha": alpha0.clone()}
    x, y = _batch(k)
    with alg.training():
        alg.local_step(work, client, x, y, 0.5, client_generators(range(k)))
    params = _params(net, w0)
    buffers = buffer_names(net)
    for i in range(k):
        w_ref = _sgd(net, _rows(w0, i), params, x[i], y[i], 0.5 * 0.05, 1e-3)
        v = {n: v0[n][i].clone().requires_grad_() for n in params}
        a = alpha0[i].clone().requires_grad_()
        v_buffers = {n: v0[n][i].clone() for n in buffers}
        mixed = {n: a * v[n] + (1 - a) * w0[n][i] for n in params}
        loss = F.cross_entropy(functional_call(net, {**mixed, **v_buffers}, (x[i],)), y[i])
        g = torch.autograd.grad(loss, [*v.values(), a])
        v_ref = {n: (v[n] - 0.5 * 0.1 * (gn + 1e-3 * v[n])).detach()
                 for n, gn in zip(params, g[:-1], strict=True)}
        a_ref = torch.clamp(a - 0.5 * 0.3 * g[-1], 0, 1).detach()
        _close(_rows(work["model"], i), w_ref)
        _close(_rows(client["personal"], i), {**v_ref, **v_buffers})
        torch.testing.assert_close(client["alpha"][i], a_ref, **TOL)
    assert bool(((client["alpha"] >= 0) & (client["alpha"] <= 1)).all())


def test_apfl_predicts_with_the_mixture(images, plain):
    net, pre = plain
    alg = APFL(net, 0.05, alpha=0.3)
    res = train(alg, images, n_rounds=2, local_steps=2, batch_size=5, init_params=pre)
    model = alg.personal(alg.evaluation_message(res.server), res.clients, images)
    a, w, v = res.clients["alpha"], res.server["global"], res.clients["personal"]
    assert not torch.equal(a, torch.full_like(a, 0.3))  # learned
    name = "fc.weight"
    torch.testing.assert_close(model[name], a[:, None, None] * v[name]
                               + (1 - a[:, None, None]) * w[name], **TOL)
    assert torch.equal(model["bn1.running_mean"], v["bn1.running_mean"])


# --- FedDF ----------------------------------------------------------------------------------

def test_feddf_without_distillation_is_fedavg(images, plain):
    net, pre = plain
    kw = dict(RUN, init_params=pre)
    feddf = train(FedDF(net, 0.05, aux=torch.rand(10, 8, 8), kd_steps=0), images, **kw)
    fedavg = train(FedAvg(net, 0.05), images, **kw)
    assert feddf.server.keys() == fedavg.server.keys() == {"global"}
    for n, t in fedavg.server["global"].items():
        assert torch.equal(feddf.server["global"][n], t), n
    assert torch.equal(feddf.accuracy, fedavg.accuracy)


def test_feddf_distills_the_average_toward_the_ensemble(images, plain):
    net, pre = plain
    # clients trained apart (20 steps), then plain gradient steps on one full batch of aux
    # inputs: the distillation loss of the same inputs must fall
    alg = FedDF(net, 0.2, aux=digit_images(2).x_train[0, :16], kd_steps=40, kd_lr=0.1,
                kd_batch_size=16, kd_optimizer="sgd")
    kw = {**RUN, "n_rounds": 1, "local_steps": 20, "init_params": pre}
    res = train(alg, images, **kw)
    row = res.history[-1]
    assert row["kd_steps"] == 40
    assert row["kd_loss_end"] < 0.5 * row["kd_loss_start"], row
    plain_avg = train(FedAvg(net, 0.2), images, **kw)
    assert alg.global_state(res.server) is res.server["global"]
    assert not torch.equal(res.server["global"]["fc.weight"],
                           plain_avg.server["global"]["fc.weight"])
    for n in buffer_names(net):  # distillation trains parameters; statistics stay averaged
        assert torch.equal(res.server["global"][n], plain_avg.server["global"][n]), n


# --- Table 1 of PerAda: parameter counts on ResNet-18 ---------------------------------------

def test_table1_parameter_counts_on_resnet18():
    plain, adapted = ResNet18Adapters(10, adapters=False), ResNet18Adapters(10)
    full = 11_181_642  # ResNet-18 with a 10-class head
    bn = 9_600  # 2 x channels of its 20 BatchNorm layers
    head = 512 * 10 + 10
    stem = 64 * 3 * 7 * 7 + 2 * 64
    counts = {
        "FedBN": (FedBN(plain), full, full - bn),
        "LG-FedAvg": (LGFedAvg(plain), full, head),
        "FedRep": (FedRep(plain), full, full - head),
        "FedAlt (output layer)": (FedAlt(plain, personal="output"), full, full - head),
        "FedSim (input layer)": (FedSim(plain, personal="input"), full, full - stem),
        # the backbone: all but the head and the stem's and blocks' bn1/bn2 (7,808 parameters)
        "FedAlt (adapter)": (FedAlt(adapted, personal="adapter"), 12_581_962,
                             full - head - 7_808),
        "Ditto": (Ditto(plain), 2 * full, full),
        "APFL": (APFL(plain), 2 * full + 1, full),
        "FedDF": (FedDF(plain, aux=torch.zeros(1, 3, 32, 32)), full, full),
    }
    for key, (alg, trained, communicated) in counts.items():
        assert (alg.trained_parameters(), alg.communicated_parameters()) == (trained,
                                                                            communicated), key


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda net: FedAlt(net, personal="head"), ValueError, "personal must be a list of"),
    (lambda net: FedAlt(net, personal=["fc.weight", "x"]), ValueError, "not parameters or"),
    (lambda net: FedAlt(net, personal=[]), ValueError, "at least one tensor"),
    (lambda net: FedAlt(net, personal=3), TypeError, "personal must be a group name"),
    (lambda net: FedAlt(net, personal=[1]), TypeError, "state names"),
    (lambda net: FedAlt(net, personal="all"), ValueError, "personal must be a list"),
    (lambda net: FedAlt(net, personal=["bn1.running_mean"]), ValueError, "one parameter"),
    (lambda net: FedAlt(net, personal="feature_extractor", frozen=["fc.weight", "fc.bias"],
                        pretrained={}), ValueError, "no shared parameter"),
    (lambda net: FedAlt(net, personal="output", frozen="input"), ValueError, "give pretrained"),
    (lambda net: FedAlt(net, personal="output", frozen="output", pretrained={}), ValueError,
     "must not share"),
    (lambda net: FedAlt(net, personal="output", frozen=["bn1.weight"], pretrained={}),
     ValueError,
     "all of BatchNorm layer 'bn1'"),
    (lambda net: FedAlt(net, personal="output", frozen=["conv1.weight"], pretrained={}),
     ValueError,
     "lacks frozen tensors"),
    (lambda net: FedAlt(net, personal="output", pretrained=[1]), TypeError, "must be a dict"),
    (lambda net: FedAlt(net, personal="output",
                        pretrained={"fc.bias": torch.full((10,), np.nan)}),
     ValueError, "finite"),
    (lambda net: FedAlt(net, personal="output", lr=-1.0), ValueError, "lr"),
    (lambda net: FedAlt(net, personal="output", personal_steps=-1), ValueError, "personal_steps"),
    (lambda net: FedAlt(torch.nn.Linear(3, 2), personal="output"), TypeError, "list of state"),
    (lambda net: FedAlt(net), TypeError, "personal"),
    (lambda net: FedBN(torch.nn.Linear(3, 2)), ValueError, "no BatchNorm"),
    (lambda net: APFL(net, alpha=1.5), ValueError, "alpha"),
    (lambda net: FedDF(net, aux=None), TypeError, "aux"),
    (lambda net: FedDF(net, aux=torch.zeros(4, 8, 8), kd_optimizer="lbfgs"), ValueError,
     "kd_optimizer"),
])
def test_bad_input(plain, make, error, match):
    with pytest.raises(error, match=match):
        make(plain[0])


def test_nothing_passed_in_is_modified(images, plain):
    net, pre = plain
    before = {n: t.clone() for n, t in pre.items()}
    train(FedAlt(net, personal="adapter", lr=0.05, pretrained=pre), images, **RUN)
    assert all(torch.equal(pre[n], before[n]) for n in pre)
