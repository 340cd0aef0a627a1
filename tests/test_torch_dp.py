"""DP-AdaPeD and DP-FedEM: clipping bounds each client's release; the noise has the stated scale
and comes from each client's own stream."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ebfl.federated.protocol import RoundContext, RunConfig  # noqa: E402
from ebfl.generative.algorithm import DPAdaPeD  # noqa: E402
from ebfl.learning.torch import CNN5, DPFedEM, LogisticModel, train  # noqa: E402
from ebfl.learning.torch.baselines import FedEM  # noqa: E402
from ebfl.learning.torch.functional import (  # noqa: E402
    client_generators,
    clip_and_noise,
    replicate,
)
from tests.test_torch_baselines import _digits_clients  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    return _digits_clients()


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _adaped_round(strat, model, k, psi=2.0):
    """The working state of K clients of a DP-AdaPeD round, and the round's mu."""
    mu = _params(model)
    client = {"theta": replicate(mu, k)}
    rc = RoundContext(RunConfig(n_clients=k, n_rounds=1), 0, np.arange(k))
    work = strat.client_begin({"mu": mu, "psi": torch.tensor(psi, dtype=torch.float64)},
                              client, rc)
    return work, client, replicate(mu, k)


def _batch(k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((k, 8, 28, 28), generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 10, (k, 8), generator=gen)


def _rng(k, seed=0):
    return client_generators(range(seed, seed + k))


def _flat_change(before, after):
    return torch.cat([(after[n] - before[n]).flatten(1) for n in before], dim=1)


@pytest.mark.parametrize("concatenate", [False, True])
def test_clipping_bounds_every_clients_release(concatenate):
    model = CNN5().double()  # float64: the check is about the algebra, not rounding
    k, clip = 5, 1e-4  # a clip far below the raw gradient norms: every client is clipped
    kw = dict(clip_mu=clip, noise_mu=0.0, weight_decay=0.0, lr_mu=0.5, lr_psi=0.2)
    kw.update(concatenate=True) if concatenate else kw.update(clip_psi=clip, noise_psi=0.0)
    strat = DPAdaPeD(model, **kw)
    work, client, mu0 = _adaped_round(strat, model, k)
    x, y = _batch(k)
    strat.local_step(work, client, x, y, 1.0, _rng(k))
    h = _flat_change(mu0, work["mu"]) / -0.5
    dk = (work["psi"] - 2.0) / -0.2
    if concatenate:
        norms = torch.sqrt(h.pow(2).sum(1) + dk**2)
    else:
        norms = h.norm(dim=1)
        torch.testing.assert_close(dk.abs(), torch.full((k,), clip, dtype=torch.float64),
                                   rtol=1e-8, atol=0)
    torch.testing.assert_close(norms, torch.full((k,), clip, dtype=torch.float64), rtol=1e-8,
                               atol=0)


def test_a_round_moves_mu_at_most_tau_clipped_steps(digits):
    model = LogisticModel(64, 10)
    tau, clip, lr_mu = 4, 0.05, 0.1
    strat = DPAdaPeD(model, lr_mu=lr_mu, clip_mu=clip, noise_mu=0.0, clip_psi=1.0,
                     noise_psi=0.0, weight_decay=0.0)
    init = _params(model)
    # one round, K = m: the average over clients of mu_i moved by <= tau * eta2 * C1 each
    res = train(strat, digits, n_rounds=1, local_steps=tau, batch_size=6, init_params=init)
    moved = torch.cat([(res.server["mu"][n] - init[n]).flatten() for n in init]).norm()
    assert float(moved) <= tau * lr_mu * clip * (1 + 1e-5)
    assert float(moved) > 0  # mu did learn


def test_noise_has_the_stated_standard_deviation():
    model = CNN5().double()
    k, sigma = 3, 0.7
    strat = DPAdaPeD(model, clip_mu=1e-12, noise_mu=sigma, clip_psi=1e-12, noise_psi=sigma,
                     weight_decay=0.0, lr_mu=1.0)
    work, client, mu0 = _adaped_round(strat, model, k)
    x, y = _batch(k, 2)
    strat.local_step(work, client, x, y, 1.0, _rng(k, 1))
    noise = -_flat_change(mu0, work["mu"])  # clipped part ~ 1e-12
    n = noise.numel()
    var = float(noise.pow(2).mean())
    # sample variance of n N(0, sigma^2) draws: sd sigma^2 sqrt(2/n); 4 se
    assert abs(var - sigma**2) < 4 * sigma**2 * math.sqrt(2 / n)
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(n)


def test_each_clients_noise_comes_from_its_own_stream():
    # client j's release depends on its generator only: alone it draws what it draws stacked
    model = LogisticModel(64, 10).double()
    k = 3
    strat = DPAdaPeD(model, clip_mu=0.1, noise_mu=0.5, concatenate=True)
    x = torch.rand((k, 8, 64), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.randint(0, 10, (k, 8), generator=torch.Generator().manual_seed(2))
    work, client, _ = _adaped_round(strat, model, k)
    strat.local_step(work, client, x, y, 1.0, _rng(k, 10))
    for j in range(k):
        one, one_client, _ = _adaped_round(strat, model, 1)
        strat.local_step(one, one_client, x[j:j + 1], y[j:j + 1], 1.0, _rng(1, 10 + j))
        for n, p in one["mu"].items():
            torch.testing.assert_close(work["mu"][n][j], p[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(work["psi"][j], one["psi"][0], atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="one generator per client"):
        strat.local_step(work, client, x, y, 1.0, _rng(k - 1))


def test_dp_adaped_trains_and_is_reproducible(digits):
    kw = dict(n_rounds=10, local_steps=5, clients_per_round=4, batch_size=10, seed=0)

    def run():
        strat = DPAdaPeD(LogisticModel(64, 10), clip_mu=1.0, noise_mu=0.5, clip_psi=1.0,
                         noise_psi=0.5)
        return train(strat, digits, **kw)

    a, b = run(), run()
    assert a.history == b.history
    assert float(a.accuracy.mean()) > 0.8  # personal models train locally, noise on mu only


def test_privacy_reports_theorem7_beside_the_accountant():
    strat = DPAdaPeD(LogisticModel(64, 10), clip_mu=1.0, noise_mu=5.0, clip_psi=1.0,
                     noise_psi=5.0)
    eps = strat.privacy(1e-5, n_clients=66, n_sampled=22, n_iterations=2400, sync_gap=10)
    # the paper's FEMNIST setting (Section 4) with sigma/C = 5: Theorem 7 (Lemma 2) about 5.2,
    # while a correct accountant (fixed-size sampling, sensitivity tau*C) gives several times more.
    assert eps["theorem7"] == pytest.approx(5.16, abs=0.01)
    assert eps["accountant"] > 4 * eps["theorem7"]


def test_bad_input():
    m = LogisticModel(64, 10)
    with pytest.raises(ValueError, match="clip_psi and noise_psi"):
        DPAdaPeD(m, clip_mu=1.0, noise_mu=1.0)
    with pytest.raises(ValueError, match="leave clip_psi"):
        DPAdaPeD(m, clip_mu=1.0, noise_mu=1.0, clip_psi=1.0, noise_psi=1.0, concatenate=True)
    with pytest.raises(ValueError, match="clip_mu"):
        DPAdaPeD(m, clip_mu=0.0, noise_mu=1.0, concatenate=True)
    with pytest.raises(ValueError, match="noise_mu"):
        DPAdaPeD(m, clip_mu=1.0, noise_mu=-1.0, concatenate=True)


# --- the shared mechanism and DP-FedEM --------------------------------------------------------

def test_clip_and_noise_equals_a_per_client_loop():
    gen = torch.Generator().manual_seed(4)
    k, rows = 4, 2  # FedEM-style: two rows (components) per client
    blocks = {"w": torch.randn(k * rows, 3, 5, generator=gen, dtype=torch.float64),
              "b": torch.randn(k * rows, 5, generator=gen, dtype=torch.float64)}
    for t in blocks.values():  # client 1 is under the clip: left unscaled
        t[2:4] *= 1e-3
    before = {n: t.clone() for n, t in blocks.items()}
    clip = 0.8
    out = clip_and_noise(blocks, clip, 0.0, torch.Generator(), rows_per_client=rows)
    scales = []
    for j in range(k):
        mine = torch.cat([t[j * rows:(j + 1) * rows].flatten() for t in before.values()])
        scale = 1 / max(float(mine.norm()) / clip, 1.0)
        scales.append(scale)
        for n, t in before.items():
            torch.testing.assert_close(out[n][j * rows:(j + 1) * rows], t[j * rows:(j + 1) * rows]
                                       * scale, atol=1e-12, rtol=0)
    assert scales[1] == 1.0 and max(scales[0], scales[2], scales[3]) < 1.0  # both paths run
    for n in blocks:  # inputs untouched
        assert torch.equal(blocks[n], before[n])
    # the noise is added after clipping, from the given generator, in the order of the dict
    noisy = clip_and_noise(blocks, clip, 0.3, torch.Generator().manual_seed(9),
                           rows_per_client=rows)
    g = torch.Generator().manual_seed(9)
    for n, t in out.items():
        torch.testing.assert_close(noisy[n], t + 0.3 * torch.randn(t.shape, generator=g,
                                                                   dtype=t.dtype))
    # one generator per client: client j's rows of every block from generator j, in dict order
    noisy = clip_and_noise(blocks, clip, 0.3, _rng(k, 20), rows_per_client=rows)
    for j, g in enumerate(_rng(k, 20)):
        for n, t in out.items():
            mine = t[j * rows:(j + 1) * rows]
            torch.testing.assert_close(noisy[n][j * rows:(j + 1) * rows],
                                       mine + 0.3 * torch.randn(mine.shape, generator=g,
                                                                dtype=t.dtype))


def _fedem_round(strat, model, k):
    """The working state of K clients of a FedEM round, and the round's components."""
    cfg = RunConfig(n_clients=k, n_rounds=1)
    server = strat.init_server(cfg)
    client = strat.init_clients(cfg, None, range(k))
    work = strat.client_begin(strat.broadcast(server, None), client,
                              RoundContext(cfg, 0, np.arange(k)))
    return work, client, {n: p.clone() for n, p in work["components"].items()}


def _fedem_batch(k, gen):
    x = torch.rand((k, 8, 64), generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 10, (k, 8), generator=gen)


def test_dp_fedem_clips_both_components_together():
    model = LogisticModel(64, 10).double()
    k, clip, lr = 4, 1e-4, 0.5
    strat = DPFedEM(model, lr, clip=clip, noise=0.0, weight_decay=0.0)
    work, client, before = _fedem_round(strat, model, k)
    x, y = _fedem_batch(k, torch.Generator().manual_seed(1))
    strat.local_step(work, client, x, y, 1.0, _rng(k))
    step = torch.cat([(work["components"][n] - before[n]).flatten(1) for n in before],
                     dim=1) / -lr
    norms = step.norm(dim=1)  # per client, both components concatenated
    torch.testing.assert_close(norms, torch.full((k,), clip, dtype=torch.float64), rtol=1e-8,
                               atol=0)
    # one joint clip, not one per component (which would give each component norm C)
    for c in range(strat.n_components):
        comp = torch.cat([(work["components"][n][:, c] - before[n][:, c]).flatten(1)
                          for n in before], dim=1) / -lr
        assert bool((comp.norm(dim=1) < clip * (1 - 1e-6)).all())


def test_dp_fedem_noise_has_the_stated_standard_deviation():
    model = LogisticModel(64, 10).double()
    k, sigma, lr = 3, 0.4, 1.0
    strat = DPFedEM(model, lr, clip=1e-12, noise=sigma, weight_decay=0.0)
    work, client, before = _fedem_round(strat, model, k)
    x, y = _fedem_batch(k, torch.Generator().manual_seed(3))
    strat.local_step(work, client, x, y, 1.0, _rng(k, 5))
    noise = -_flat_change(before, work["components"]) / lr  # clipped part <= 1e-12
    n = noise.numel()
    var = float(noise.pow(2).mean())
    assert abs(var - sigma**2) < 4 * sigma**2 * math.sqrt(2 / n)  # 4 se of the sample variance
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(n)


def test_dp_fedem_without_clipping_or_noise_is_fedem_averaged_unweighted(digits):
    model = LogisticModel(64, 10).double()
    k = 3
    plain, dp = FedEM(model), DPFedEM(model, clip=1e9, noise=0.0)
    w_plain, c_plain, _ = _fedem_round(plain, model, k)
    w_dp, c_dp, _ = _fedem_round(dp, model, k)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        x, y = _fedem_batch(k, gen)
        plain.local_step(w_plain, c_plain, x, y, 1.0, _rng(k))
        dp.local_step(w_dp, c_dp, x, y, 1.0, _rng(k))
    r_plain, r_dp = plain.client_reply(w_plain, c_plain), dp.client_reply(w_dp, c_dp)
    for n, p in r_plain["components"].items():
        torch.testing.assert_close(r_dp["components"][n], p, atol=1e-12, rtol=0)
    torch.testing.assert_close(c_dp["pi"], c_plain["pi"], atol=1e-12, rtol=0)
    # DP: every client weighs 1; FedEM: its training-set size
    weights = dp.client_weights(digits.subset([0, 1, 2]))
    np.testing.assert_array_equal(weights, np.ones(3))
    assert not np.all(plain.client_weights(digits.subset([0, 1, 2])) == 1)
    server = dp.aggregate(None, r_dp, weights, None)
    for n, p in r_dp["components"].items():
        torch.testing.assert_close(server["components"][n], p.mean(0), atol=1e-12, rtol=0)


def test_dp_fedem_trains_reproducibly_and_reports_the_accountant(digits):
    kw = dict(n_rounds=4, local_steps=3, clients_per_round=4, batch_size=8, seed=3)

    def run():
        return train(DPFedEM(LogisticModel(64, 10), clip=1.0, noise=0.5), digits, **kw)

    a, b = run(), run()
    assert a.history == b.history
    noisy = train(DPFedEM(LogisticModel(64, 10), clip=1.0, noise=5.0), digits, **kw)
    assert noisy.history != a.history
    # the same mechanism as concatenated DP-AdaPeD, hence the same epsilon
    acct = dict(n_clients=50, n_sampled=5, n_iterations=3000, sync_gap=10)
    eps = DPFedEM(LogisticModel(64, 10), clip=1.0, noise=2.0).privacy(1e-5, **acct)
    ada = DPAdaPeD(LogisticModel(64, 10), clip_mu=1.0, noise_mu=2.0, concatenate=True)
    assert eps == pytest.approx(ada.privacy(1e-5, **acct)["accountant"], rel=1e-12)
    assert math.isfinite(eps) and eps > 0
    assert DPFedEM(LogisticModel(64, 10), clip=1.0, noise=0.0).privacy(1e-5, **acct) == math.inf
    with pytest.raises(ValueError, match="clip"):
        DPFedEM(LogisticModel(64, 10), clip=0.0, noise=1.0)
    with pytest.raises(ValueError, match="noise"):
        DPFedEM(LogisticModel(64, 10), clip=1.0, noise=float("nan"))
