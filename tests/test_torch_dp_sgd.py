"""Sample-level DP-SGD (per-sample clipping, Poisson batches) and DP-PerAda / DP-Ditto.

The DP-SGD gradient is checked against a plain autograd loop over samples, the
vectorized stack against one client at a time, the accounting against a hand
composition of the subsampled Gaussian's Renyi DP, and the strategies for
the properties the privacy argument rests on (running statistics never
updated from private data, the proximal term outside the noisy gradient).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from scipy.special import gammaln, logsumexp  # noqa: E402

from ebfl.federated.protocol import RoundContext, RunConfig  # noqa: E402
from ebfl.learning.torch.adapters import SmallResNet, parameter_groups  # noqa: E402
from ebfl.learning.torch.data import FederatedDataset  # noqa: E402
from ebfl.learning.torch.dp_sgd import (  # noqa: E402
    dp_sgd_gradient,
    gather_batch,
    per_sample_grads,
    poisson_batch,
)
from ebfl.learning.torch.engine import train  # noqa: E402
from ebfl.learning.torch.functional import (  # noqa: E402
    buffer_names,
    client_generators,
    client_grad,
    cross_entropy,
    model_state,
    replicate,
)
from ebfl.perada.dp import (  # noqa: E402
    DPDitto,
    DPPerAda,
    batchnorm_eval,
    calibrate_noise_multiplier,
    client_epsilons,
    client_sampling_rates,
)
from ebfl.privacy.accounting.dp_fedavg import dp_fedavg_epsilon  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _net(dropout=0.3, dtype=torch.float64):
    torch.manual_seed(0)
    return SmallResNet(widths=(4, 8), dropout=dropout).to(dtype)


def _split(net):
    """(adapter set, frozen backbone) of the model's state, with non-trivial BN statistics."""
    state = model_state(net)
    gen = torch.Generator().manual_seed(1)
    for name in buffer_names(net):  # pretend pretrained statistics, not 0 / 1
        if name.endswith("running_mean"):
            state[name] = 0.1 * torch.randn(state[name].shape, generator=gen,
                                            dtype=state[name].dtype)
        elif name.endswith("running_var"):
            state[name] = 0.5 + torch.rand(state[name].shape, generator=gen,
                                           dtype=state[name].dtype)
    names = parameter_groups(net)["adapter"]
    return ({n: state[n] for n in names}, {n: t for n, t in state.items() if n not in names},
            state)


def _batch(k, b, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((k, b, 28, 28), generator=gen, dtype=dtype),
            torch.randint(0, 10, (k, b), generator=gen))


def _naive_dp_gradient(net, params, buffers, frozen, x, y, mask, keys, clip, z, seed,
                       expected):
    """One client: a loop over its samples with plain autograd, clip, sum, then the noise
    drawn as one randn per parameter (in the stack's order) from a generator seeded ``seed``."""
    names = list(params)
    total = {n: torch.zeros_like(params[n]) for n in names}
    clipped = unclipped = 0
    for i in range(x.shape[0]):
        if not mask[i]:
            continue
        leaves = {n: params[n].clone().requires_grad_(True) for n in names}
        state = {**buffers, "dropout_key": keys[i].clone(), **frozen}
        logits = torch.func.functional_call(net, {**leaves, **state}, (x[i:i + 1],))
        grads = torch.autograd.grad(cross_entropy(logits, y[i:i + 1]),
                                    [leaves[n] for n in names])
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, clip / float(norm))
        clipped, unclipped = clipped + (factor < 1), unclipped + (factor == 1)
        for n, g in zip(names, grads, strict=True):
            total[n] += factor * g
    gen = torch.Generator().manual_seed(seed)
    out = {n: (total[n] + z * clip * torch.randn((1, *total[n].shape), generator=gen,
                                                 dtype=total[n].dtype)[0]) / expected
           for n in names}
    return out, clipped, unclipped


# --------------------------------------------------------------------------- dp_sgd kernels


def test_dp_sgd_gradient_equals_a_naive_loop_over_samples():
    net = _net()
    adapter, frozen, _ = _split(net)
    buffers = {n: t for n, t in adapter.items() if n in set(buffer_names(net))}
    params = {n: t for n, t in adapter.items() if n not in buffers}
    x, y = _batch(1, 12)
    mask = torch.tensor([[True] * 9 + [False] * 3])
    keys = torch.arange(100.0, 112.0, dtype=torch.float64)
    with batchnorm_eval(net):
        norms = per_sample_grads(net, cross_entropy, replicate(adapter, 1), x, y, mask,
                                 frozen, sample_state={"dropout_key": keys[None]})
        per = torch.sqrt(sum(g.flatten(2).pow(2).sum(-1) for g in norms.values()))[0, :9]
        clip = float(per.median())  # some samples clipped, some not
        got = dp_sgd_gradient(net, replicate(adapter, 1), x, y, mask, clip=clip,
                              noise_multiplier=0.7, generators=client_generators([5]),
                              expected_batch=7.5, frozen=frozen,
                              sample_state={"dropout_key": keys[None]})
        want, clipped, unclipped = _naive_dp_gradient(net, params, buffers, frozen, x[0], y[0],
                                                      mask[0], keys, clip, 0.7, 5, 7.5)
    assert clipped >= 3 and unclipped >= 3
    assert set(got) == set(params)  # buffers are not differentiated
    for n in params:
        torch.testing.assert_close(got[n][0], want[n], rtol=1e-10, atol=1e-12)


def test_absent_samples_contribute_nothing_and_noise_has_the_stated_scale():
    net = _net()
    adapter, frozen, _ = _split(net)
    x, y = _batch(1, 6)
    mask = torch.zeros((1, 6), dtype=torch.bool)
    with batchnorm_eval(net):
        g = dp_sgd_gradient(net, replicate(adapter, 1), x, y, mask, clip=2.0,
                            noise_multiplier=1.5, generators=client_generators([9]),
                            expected_batch=4.0, frozen=frozen)
    flat = torch.cat([t.flatten() for t in g.values()])
    gen = torch.Generator().manual_seed(9)
    noise = torch.cat([torch.randn(t.shape, generator=gen, dtype=t.dtype).flatten()
                       for t in g.values()])
    torch.testing.assert_close(flat, 1.5 * 2.0 * noise / 4.0, rtol=1e-12, atol=0)


def test_stacked_clients_equal_one_at_a_time():
    net = _net()
    adapter, frozen, _ = _split(net)
    k = 3
    stack = replicate(adapter, k)
    gen = torch.Generator().manual_seed(2)
    for n in stack:  # clients at different points
        if stack[n].is_floating_point() and n != "dropout_key":
            stack[n] = stack[n] + 0.05 * torch.randn(stack[n].shape, generator=gen,
                                                     dtype=stack[n].dtype)
    n_train = torch.tensor([30, 70, 50])
    q = torch.tensor([0.2, 0.1, 0.3], dtype=torch.float64)
    idx, mask, sizes = poisson_batch(n_train, q, client_generators([11, 12, 13]))
    assert len(set(sizes.tolist())) > 1  # the padding differs between alone and stacked
    x_all, y_all = _batch(k, 70, seed=3)
    x = torch.stack([x_all[j, idx[j]] for j in range(k)])
    y = torch.stack([y_all[j, idx[j]] for j in range(k)])
    keys = torch.arange(float(idx.shape[1]), dtype=torch.float64).expand(k, -1) + 7
    kw = dict(clip=0.05, noise_multiplier=1.0, frozen=frozen)
    with batchnorm_eval(net):
        together = dp_sgd_gradient(net, stack, x, y, mask, generators=client_generators(
            [21, 22, 23]), expected_batch=q * n_train, sample_state={"dropout_key": keys}, **kw)
        for j in range(k):
            idx_j, mask_j, _ = poisson_batch(n_train[j:j + 1], q[j:j + 1],
                                             client_generators([11 + j]))
            b = idx_j.shape[1]
            torch.testing.assert_close(idx_j, idx[j:j + 1, :b])
            alone = dp_sgd_gradient(
                net, {n: t[j:j + 1] for n, t in stack.items()}, x[j:j + 1, :b],
                y[j:j + 1, :b], mask_j, generators=client_generators([21 + j]),
                expected_batch=float(q[j] * n_train[j]),
                sample_state={"dropout_key": keys[j:j + 1, :b]}, **kw)
            for n in alone:
                torch.testing.assert_close(alone[n][0], together[n][j], rtol=1e-9, atol=1e-12)


def test_full_batch_without_noise_or_clipping_is_the_mean_gradient():
    net = _net(dropout=0.0)
    adapter, frozen, _ = _split(net)
    x, y = _batch(2, 10, seed=4)
    stack = replicate(adapter, 2)
    with batchnorm_eval(net):
        got = dp_sgd_gradient(net, stack, x, y, None, clip=1e6, noise_multiplier=0.0,
                              generators=client_generators([0, 1]), expected_batch=10.0,
                              frozen=frozen)
        want = client_grad(net, lambda f, p, xb, yb: cross_entropy(f(p, xb), yb), stack, x, y,
                           frozen=frozen)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-13)


def test_each_sample_gets_its_own_dropout_mask_and_inputs_are_not_mutated():
    net = _net(dropout=0.5)
    adapter, frozen, _ = _split(net)
    x, y = _batch(1, 1)
    x, y = x.expand(1, 2, 28, 28), y.expand(1, 2)  # the same sample twice
    stack = replicate(adapter, 1)
    before = {n: t.clone() for n, t in stack.items()}
    with batchnorm_eval(net):
        distinct = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
        g = per_sample_grads(net, cross_entropy, stack, x, y, None, frozen,
                             sample_state={"dropout_key": distinct})
        assert not torch.equal(g["fc.weight"][0, 0], g["fc.weight"][0, 1])
        same = torch.tensor([[3.0, 3.0]], dtype=torch.float64)
        g = per_sample_grads(net, cross_entropy, stack, x, y, None, frozen,
                             sample_state={"dropout_key": same})
        torch.testing.assert_close(g["fc.weight"][0, 0], g["fc.weight"][0, 1])
    assert distinct.tolist() == [[3.0, 4.0]] and same.tolist() == [[3.0, 3.0]]
    for n in stack:
        assert torch.equal(stack[n], before[n])


def test_train_mode_batchnorm_is_refused():
    net = _net()
    adapter, frozen, _ = _split(net)
    x, y = _batch(1, 4)
    net.train()
    with pytest.raises(ValueError, match="BatchNorm layer 'bn1' is in train mode"):
        per_sample_grads(net, cross_entropy, replicate(adapter, 1), x, y, frozen=frozen)


def test_poisson_batches_have_the_right_size_and_are_stream_determined():
    n, q, draws = 200, 0.15, 400
    sizes = []
    for s in range(draws):
        idx, mask, size = poisson_batch([n], q, client_generators([s]))
        chosen = idx[0, mask[0]]
        assert bool((chosen[1:] > chosen[:-1]).all()) and bool((chosen < n).all())
        sizes.append(int(size[0]))
    mean, se = np.mean(sizes), math.sqrt(n * q * (1 - q) / draws)
    assert abs(mean - n * q) < 4 * se  # Binomial(n, q) sizes
    assert abs(np.var(sizes) / (n * q * (1 - q)) - 1) < 4 * math.sqrt(2 / draws)
    idx, mask, _ = poisson_batch([200, 10], [0.15, 1.0], client_generators([0, 1]))
    alone, _, _ = poisson_batch([200], 0.15, client_generators([0]))
    torch.testing.assert_close(idx[:1, :alone.shape[1]], alone)
    assert mask[1].sum() == 10  # q = 1: everything


def test_gather_batch_reads_the_clients_rows():
    xs = [np.full((3, 28, 28), i, np.float32) + np.arange(3)[:, None, None] for i in (0, 10)]
    ys = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=6)
    x, y = gather_batch(data.subset([1]), torch.tensor([[2, 0]]))
    assert y.tolist() == [[5, 3]] and x[0, :, 0, 0].tolist() == [12.0, 10.0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(clip=0.0), "clip"), (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(expected_batch=0.0), "expected_batch"), (dict(generators=[]), "generators"),
])
def test_dp_sgd_gradient_bad_input(kwargs, match):
    net = _net()
    adapter, frozen, _ = _split(net)
    x, y = _batch(1, 3)
    kw = dict(clip=1.0, noise_multiplier=1.0, generators=client_generators([0]),
              expected_batch=3.0, frozen=frozen)
    kw.update(kwargs)
    with batchnorm_eval(net), pytest.raises(ValueError, match=match):
        dp_sgd_gradient(net, replicate(adapter, 1), x, y, None, **kw)


# --------------------------------------------------------------------------- strategies


def _clients(ns=(40, 60, 80), seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.random((n, 28, 28)).astype(np.float32) for n in ns]
    ys = [rng.integers(0, 10, n) for n in ns]
    return FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=10)


def _round(alg, data, clients, local_steps=1, seed=0, message=None):
    cfg = RunConfig(n_clients=data.n_clients, n_rounds=1, seed=seed, local_steps=local_steps)
    run_rc = RoundContext(cfg, 0, np.asarray(clients))
    client = {k: {n: t.clone() for n, t in v.items()}
              for k, v in alg.init_clients(cfg, data, np.asarray(clients)).items()}
    message = message or alg.broadcast(alg.init_server(cfg), run_rc)
    reply = alg.client_train(message, client, data.subset(clients), run_rc)
    return message, client, reply


def test_dp_perada_never_updates_running_statistics():
    net = _net(dtype=torch.float32)
    _, _, pretrained = _split(net)
    pretrained = {n: t.float() for n, t in pretrained.items()}
    alg = DPPerAda(net, pretrained, clip=1.0, noise_multiplier=1.0, expected_batch=8, lr=0.5)
    data = _clients()
    message, client, reply = _round(alg, data, [0, 1, 2], local_steps=2)
    stats = [n for n in buffer_names(net) if "running" in n and n in alg.trainable]
    assert stats
    for n in stats:
        for stack in (reply["theta"], client["personal"]):
            assert torch.equal(stack[n], message["global"][n].expand_as(stack[n]))
    moved = [n for n in reply["theta"] if n not in set(buffer_names(net))
             and not torch.equal(reply["theta"][n][0], message["global"][n])]
    assert "fc.weight" in moved and "layer1.0.adapter1.conv.weight" in moved
    assert net.training and all(m.training for m in net.modules())  # modes restored


def test_dp_perada_stacked_round_equals_one_client_at_a_time():
    net = _net(dtype=torch.float32)
    _, _, pretrained = _split(net)
    pretrained = {n: t.float() for n, t in pretrained.items()}
    alg = DPPerAda(net, pretrained, clip=0.5, noise_multiplier=0.8, sampling_rate=0.2, lr=0.3,
                   lam=1.0)
    data = _clients()
    _, together, reply = _round(alg, data, [0, 1, 2], local_steps=2, seed=4)
    for j in range(3):
        _, alone, reply_j = _round(alg, data, [j], local_steps=2, seed=4)
        for n in reply_j["theta"]:
            torch.testing.assert_close(reply_j["theta"][n][0], reply["theta"][n][j],
                                       rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(alone["personal"][n][0], together["personal"][n][j],
                                       rtol=1e-5, atol=1e-6)


def test_the_proximal_pull_is_added_after_the_noise():
    """Same streams, lam = 2 vs lam = 0: after one step the personal adapters differ by
    exactly lr * lam * (v - w): the noisy gradient does not depend on lam."""
    net = _net(dtype=torch.float32)
    _, _, pretrained = _split(net)
    pretrained = {n: t.float() for n, t in pretrained.items()}
    data = _clients()
    kw = dict(clip=1.0, noise_multiplier=1.0, expected_batch=10, lr=0.1, lr_personal=0.25)
    base = DPPerAda(net, pretrained, lam=0.0, **kw)
    cfg = RunConfig(n_clients=3, n_rounds=1)
    w = {n: t + 0.3 if t.is_floating_point() and n != "dropout_key" else t
         for n, t in base.init_server(cfg)["global"].items()}
    v = base.initial_params(cfg)
    runs = {}
    for lam in (0.0, 2.0):
        alg = DPPerAda(net, pretrained, lam=lam, **kw)
        runs[lam] = _round(alg, data, [0, 1, 2], message={"global": w})[1]["personal"]
    for n in v:
        if n in set(buffer_names(net)):
            continue
        diff = runs[2.0][n] - runs[0.0][n]
        torch.testing.assert_close(diff, (-0.25 * 2.0 * (v[n] - w[n])).expand_as(diff),
                                   rtol=1e-4, atol=1e-6)


def test_dp_perada_and_dp_ditto_train_end_to_end():
    net = _net(dtype=torch.float32)
    _, _, pretrained = _split(net)
    pretrained = {n: t.float() for n, t in pretrained.items()}
    data = _clients()
    aux = torch.rand(16, 28, 28, generator=torch.Generator().manual_seed(0))
    alg = DPPerAda(net, pretrained, clip=1.0, noise_multiplier=1.0, expected_batch=8, lr=0.1,
                   aux=aux, kd_steps=2, kd_batch_size=8)
    assert alg.name == "DP-PerAda" and alg.config()["expected_batch"] == 8.0
    res = train(alg, data, n_rounds=2, local_steps=1, seed=1)
    assert bool(torch.isfinite(res.accuracy).all())
    stats = [n for n in buffer_names(net) if "running" in n and n in alg.trainable]
    for n in stats:  # through distillation too: statistics stay the pretrained ones
        # (the server's uniform mean of equal rows is equal up to rounding)
        torch.testing.assert_close(res.server["global"][n], pretrained[n], rtol=1e-6, atol=0)
        assert torch.equal(res.clients["personal"][n], pretrained[n].expand(3, *pretrained[n]
                                                                             .shape))
    ditto = DPDitto(net, clip=1.0, noise_multiplier=1.0, sampling_rate=0.1, lr=0.1)
    assert ditto.name == "DP-Ditto"
    res = train(ditto, data, n_rounds=1, local_steps=1, seed=1, init_params=pretrained)
    for n in buffer_names(net):
        if "running" in n:
            assert torch.equal(res.clients["personal"][n][0], pretrained[n])


def test_expected_batch_larger_than_a_client_is_refused():
    net = _net(dtype=torch.float32)
    alg = DPPerAda(net, model_state(net), clip=1.0, noise_multiplier=1.0, expected_batch=50)
    with pytest.raises(ValueError, match="expected_batch=50 exceeds"):
        _round(alg, _clients(), [0, 1, 2])


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(clip=0.0), ValueError, "clip"),
    (dict(noise_multiplier=1e-5), ValueError, "noise_multiplier"),
    (dict(noise_multiplier=-1.0), ValueError, "noise_multiplier"),
    (dict(sampling_rate=1.5, expected_batch=None), ValueError, "sampling_rate"),
    (dict(sampling_rate=0.1), ValueError, "exactly one"),
    (dict(expected_batch=None), ValueError, "exactly one"),
    (dict(expected_batch="8"), TypeError, "expected_batch"),
])
def test_strategy_bad_input(kwargs, err, match):
    net = _net(dtype=torch.float32)
    kw = dict(clip=1.0, noise_multiplier=1.0, expected_batch=8)
    kw.update(kwargs)
    with pytest.raises(err, match=match):
        DPPerAda(net, model_state(net), **kw)


# --------------------------------------------------------------------------- accounting


def _hand_rdp_epsilon(q, z, steps, delta, orders):
    """epsilon of ``steps`` Poisson-subsampled Gaussian steps from the exact binomial RDP at
    integer orders (Mironov, Talwar & Zhang 2019, Sec. 3.3), composed by adding, converted by
    Balle et al. (2020, Prop. 12): written out here as an independent check of the library."""
    eps = []
    for a in orders:
        k = np.arange(a + 1)
        log_binom = gammaln(a + 1) - gammaln(k + 1) - gammaln(a - k + 1)
        log_a = logsumexp(log_binom + (a - k) * math.log1p(-q) + k * math.log(q)
                          + (k * k - k) / (2 * z * z))
        rdp = steps * log_a / (a - 1)
        eps.append(rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1))
    return min(eps)


def test_each_round_spends_two_dp_sgd_steps_per_local_iteration():
    res = client_epsilons([640], noise_multiplier=1.0, n_rounds=30, local_steps=5, delta=1e-5,
                          sampling_rate=0.05)
    assert res.steps.tolist() == [300]
    direct = dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=1.0, n_rounds=300,
                               delta=1e-5).epsilon
    assert res.epsilons[0] == direct
    one_adapter = dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=1.0, n_rounds=150,
                                    delta=1e-5).epsilon
    assert res.epsilons[0] > 1.2 * one_adapter
    # independent: the hand RDP composition on the integer orders 2..64 (the library's grid
    # also has fractional orders, so it can only be lower, and the optimum sits near 4)
    hand = _hand_rdp_epsilon(0.05, 1.0, 300, 1e-5, range(2, 65))
    exact_integer = dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=1.0, n_rounds=300,
                                      delta=1e-5, orders=np.arange(2.0, 65.0)).epsilon
    assert hand == pytest.approx(exact_integer, rel=1e-9)
    assert res.epsilons[0] <= hand <= 1.02 * res.epsilons[0]
    # the PLD accountant is tighter than RDP, and not by much here
    pld = client_epsilons([640], noise_multiplier=1.0, n_rounds=30, local_steps=5, delta=1e-5,
                          sampling_rate=0.05, accountant="pld").epsilons[0]
    assert 0.8 * res.epsilons[0] < pld < res.epsilons[0]


def test_fixed_batch_gives_smaller_clients_larger_epsilon():
    n = [100, 200, 400, 400]
    res = client_epsilons(n, noise_multiplier=1.2, n_rounds=10, local_steps=3, delta=1e-5,
                          expected_batch=20)
    np.testing.assert_allclose(res.sampling_rates, [0.2, 0.1, 0.05, 0.05])
    assert res.epsilons[0] > res.epsilons[1] > res.epsilons[2] == res.epsilons[3]
    assert res.mean == pytest.approx(np.mean(res.epsilons))
    assert res.std == pytest.approx(np.std(res.epsilons)) and res.std > 0
    np.testing.assert_allclose(client_sampling_rates(n, expected_batch=20), res.sampling_rates)
    fixed = client_epsilons(n, noise_multiplier=1.2, n_rounds=10, local_steps=3, delta=1e-5,
                            sampling_rate=0.1)
    assert fixed.std == 0.0 and fixed.epsilons[0] == pytest.approx(res.epsilons[1])


def test_only_participating_rounds_are_spent():
    kw = dict(noise_multiplier=1.0, n_rounds=10, local_steps=2, delta=1e-5, sampling_rate=0.1)
    full = client_epsilons([50, 50, 50], **kw)
    part = client_epsilons([50, 50, 50], participated=[10, 4, 0], **kw)
    assert part.epsilons[0] == full.epsilons[0]
    assert 0 < part.epsilons[1] < full.epsilons[1] and part.epsilons[2] == 0
    assert part.steps.tolist() == [40, 16, 0]
    assert np.isinf(client_epsilons([50], **{**kw, "noise_multiplier": 0.0}).epsilons).all()


def test_calibration_finds_the_smallest_sufficient_noise():
    n, kw = [300, 900], dict(n_rounds=20, local_steps=5, expected_batch=30)
    cal = calibrate_noise_multiplier(3.0, 1e-5, n_train=n, **kw)
    assert cal.converged and not cal.at_bound
    at = client_epsilons(n, noise_multiplier=cal.noise_multiplier, delta=1e-5, **kw)
    below = client_epsilons(n, noise_multiplier=cal.noise_multiplier * (1 - 1e-3), delta=1e-5,
                            **kw)
    assert at.max <= 3.0 < below.max
    assert at.epsilons[0] == at.max  # the smallest client binds


def test_strategy_privacy_delegates_to_client_epsilons():
    net = _net(dtype=torch.float32)
    alg = DPPerAda(net, model_state(net), clip=1.0, noise_multiplier=0.9, expected_batch=16)
    got = alg.privacy(1e-5, 12, n_train=torch.tensor([64, 128]), local_steps=4)
    want = client_epsilons([64, 128], noise_multiplier=0.9, n_rounds=12, local_steps=4,
                           delta=1e-5, expected_batch=16)
    np.testing.assert_array_equal(got.epsilons, want.epsilons)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(n_train=[0, 5]), ValueError, "n_train"),
    (dict(n_train=[1.5]), TypeError, "n_train"),
    (dict(delta=0.0), ValueError, "delta"),
    (dict(participated=[11]), ValueError, "participated"),
    (dict(accountant="moments"), ValueError, "accountant"),
    (dict(expected_batch=100, sampling_rate=None), ValueError, "expected_batch=100 exceeds"),
])
def test_client_epsilons_bad_input(kwargs, err, match):
    kw = dict(n_train=[50], noise_multiplier=1.0, n_rounds=10, local_steps=1, delta=1e-5,
              sampling_rate=0.1)
    kw.update(kwargs)
    n_train = kw.pop("n_train")
    with pytest.raises(err, match=match):
        client_epsilons(n_train, **kw)


def test_strategy_draws_one_dropout_key_per_sample_from_the_clients_streams():
    from ebfl.perada.dp import _sample_keys

    stack = {"dropout_key": torch.zeros(2, dtype=torch.float64)}
    keys = _sample_keys(stack, client_generators([0, 1]), 5)["dropout_key"]
    assert keys.shape == (2, 5)
    assert all(len(set(row.tolist())) == 5 for row in keys) and keys[0, 0] != keys[1, 0]
    alone = _sample_keys(stack, client_generators([1]), 3)["dropout_key"]
    torch.testing.assert_close(alone[0], keys[1, :3])
    assert _sample_keys({"w": torch.zeros(2)}, client_generators([0, 1]), 5) is None
