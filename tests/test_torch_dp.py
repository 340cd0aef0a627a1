"""DP-AdaPeD and DP-FedEM: clipping bounds each client's release; the noise has the stated scale."""

import math

import pytest

torch = pytest.importorskip("torch")

from ebfl.learning.torch import CNN5, DPAdaPeD, LogisticModel, train  # noqa: E402
from ebfl.learning.torch.functional import replicate  # noqa: E402
from tests.test_torch_engine import _digits_clients  # noqa: E402


def _state(strat, model, k, psi=2.0):
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = strat.init_state(params, k)
    active = torch.arange(k)
    strat.broadcast(state, active)
    state["work_psi"] = torch.full((k,), psi, dtype=torch.float64)
    return state, active, replicate(params, k)


def _batch(k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((k, 8, 28, 28), generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 10, (k, 8), generator=gen)


def _flat_change(before, after):
    return torch.cat([(after[n] - before[n]).flatten(1) for n in before], dim=1)


@pytest.mark.parametrize("concatenate", [False, True])
def test_clipping_bounds_every_clients_release(concatenate):
    model = CNN5().double()  # float64: the check is about the algebra, not rounding
    k, clip = 5, 1e-4  # a clip far below the raw gradient norms: every client is clipped
    kw = dict(clip_mu=clip, noise_mu=0.0, weight_decay=0.0, lr_mu=0.5, lr_psi=0.2)
    kw.update(concatenate=True) if concatenate else kw.update(clip_psi=clip, noise_psi=0.0)
    strat = DPAdaPeD(model, **kw)
    strat.bind_generator(torch.Generator().manual_seed(0))
    state, active, mu0 = _state(strat, model, k)
    x, y = _batch(k)
    strat.local_step(state, active, x, y, 1.0)
    h = _flat_change(mu0, state["work_mu"]) / -0.5
    dk = (state["work_psi"] - 2.0) / -0.2
    if concatenate:
        norms = torch.sqrt(h.pow(2).sum(1) + dk**2)
    else:
        norms = h.norm(dim=1)
        torch.testing.assert_close(dk.abs(), torch.full((k,), clip, dtype=torch.float64),
                                   rtol=1e-8, atol=0)
    torch.testing.assert_close(norms, torch.full((k,), clip, dtype=torch.float64), rtol=1e-8,
                               atol=0)


def test_a_round_moves_mu_at_most_tau_clipped_steps():
    data = _digits_clients()
    model = LogisticModel(64, 10)
    tau, clip, lr_mu = 4, 0.05, 0.1
    strat = DPAdaPeD(model, lr_mu=lr_mu, clip_mu=clip, noise_mu=0.0, clip_psi=1.0,
                     noise_psi=0.0, weight_decay=0.0)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    # one round, K = m: the average over clients of mu_i moved by <= tau * eta2 * C1 each
    res = train(strat, data, rounds=1, local_steps=tau, batch_size=6, init_params=init)
    moved = torch.cat([(res.state["mu"][n] - init[n]).flatten() for n in init]).norm()
    assert float(moved) <= tau * lr_mu * clip * (1 + 1e-5)


def test_noise_has_the_stated_standard_deviation():
    model = CNN5().double()
    k, sigma = 3, 0.7
    strat = DPAdaPeD(model, clip_mu=1e-12, noise_mu=sigma, clip_psi=1e-12, noise_psi=sigma,
                     weight_decay=0.0, lr_mu=1.0)
    strat.bind_generator(torch.Generator().manual_seed(1))
    state, active, mu0 = _state(strat, model, k)
    x, y = _batch(k, 2)
    strat.local_step(state, active, x, y, 1.0)
    noise = -_flat_change(mu0, state["work_mu"]).double()  # clipped part ~ 1e-12
    n = noise.numel()
    var = float(noise.pow(2).mean())
    # sample variance of n N(0, sigma^2) draws: sd sigma^2 sqrt(2/n); 4 se
    assert abs(var - sigma**2) < 4 * sigma**2 * math.sqrt(2 / n)
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(n)


def test_dp_adaped_trains_and_is_reproducible():
    data = _digits_clients()
    kw = dict(rounds=10, local_steps=5, clients_per_round=4, batch_size=10, seed=0)

    def run():
        strat = DPAdaPeD(LogisticModel(64, 10), clip_mu=1.0, noise_mu=0.5, clip_psi=1.0,
                         noise_psi=0.5)
        return train(strat, data, **kw)

    a, b = run(), run()
    assert a.history == b.history
    assert float(a.accuracy.mean()) > 0.8  # personal models train locally, noise on mu only


def test_privacy_reports_theorem7_beside_the_accountant():
    strat = DPAdaPeD(LogisticModel(64, 10), clip_mu=1.0, noise_mu=5.0, clip_psi=1.0,
                     noise_psi=5.0)
    eps = strat.privacy(1e-5, n_clients=66, n_sampled=22, n_iterations=2400, sync_gap=10)
    # FEMNIST setting of spec D.9.5 with sigma/C = 5: Theorem 7 (Lemma 2) about 5.2, while a
    # correct accountant (fixed-size sampling, sensitivity tau*C) gives several times more.
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
    strat = DPAdaPeD(m, clip_mu=1.0, noise_mu=1.0, concatenate=True)
    with pytest.raises(RuntimeError, match="generator"):
        strat.release_joint({"w": torch.zeros(2, 3)}, torch.zeros(2))


# --- the shared mechanism and DP-FedEM --------------------------------------------------------

def test_clip_and_noise_equals_a_per_client_loop():
    from ebfl.learning.torch.functional import clip_and_noise

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


def _fedem_state(strat, model, k):
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = strat.init_state(params, k)
    active = torch.arange(k)
    strat.broadcast(state, active)
    return state, active, {n: p.clone() for n, p in state["work"].items()}


def test_dp_fedem_clips_both_components_together():
    from ebfl.learning.torch import DPFedEM

    model = LogisticModel(64, 10).double()
    k, clip, lr = 4, 1e-4, 0.5
    strat = DPFedEM(model, lr, clip=clip, noise=0.0, weight_decay=0.0)
    strat.bind_generator(torch.Generator().manual_seed(0))
    state, active, before = _fedem_state(strat, model, k)
    x = torch.rand((k, 8, 64), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.randint(0, 10, (k, 8), generator=torch.Generator().manual_seed(2))
    strat.local_step(state, active, x, y, 1.0)
    step = torch.cat([(state["work"][n] - before[n]).flatten(1) for n in before], dim=1) / -lr
    norms = step.norm(dim=1)  # per client, both components concatenated
    torch.testing.assert_close(norms, torch.full((k,), clip, dtype=torch.float64), rtol=1e-8,
                               atol=0)
    # one joint clip, not one per component (which would give each component norm C)
    for c in range(strat.n_components):
        comp = torch.cat([(state["work"][n][:, c] - before[n][:, c]).flatten(1)
                          for n in before], dim=1) / -lr
        assert bool((comp.norm(dim=1) < clip * (1 - 1e-6)).all())


def test_dp_fedem_without_clipping_or_noise_is_fedem_averaged_unweighted():
    from ebfl.learning.torch import DPFedEM
    from ebfl.learning.torch.baselines import FedEM

    model = LogisticModel(64, 10).double()
    k = 3
    plain, dp = FedEM(model), DPFedEM(model, clip=1e9, noise=0.0)
    dp.bind_generator(torch.Generator().manual_seed(0))
    s_plain, active, _ = _fedem_state(plain, model, k)
    s_dp, _, _ = _fedem_state(dp, model, k)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        x = torch.rand((k, 8, 64), generator=gen, dtype=torch.float64)
        y = torch.randint(0, 10, (k, 8), generator=gen)
        plain.local_step(s_plain, active, x, y, 1.0)
        dp.local_step(s_dp, active, x, y, 1.0)
    work = {n: p.clone() for n, p in s_dp["work"].items()}
    for n, p in s_plain["work"].items():
        torch.testing.assert_close(work[n], p, atol=1e-12, rtol=0)
    n_samples = torch.tensor([10, 40, 25])
    dp.aggregate(s_dp, active, n_samples)  # DP: unweighted; FedEM: by training size
    for n, p in work.items():
        torch.testing.assert_close(s_dp["components"][n], p.mean(0), atol=1e-12, rtol=0)
    torch.testing.assert_close(s_dp["pi"], s_plain["work_q"] / 3, atol=1e-12, rtol=0)


def test_dp_fedem_trains_reproducibly_and_reports_the_accountant():
    from ebfl.learning.torch import DPFedEM

    data = _digits_clients()
    kw = dict(rounds=4, local_steps=3, clients_per_round=4, batch_size=8, seed=3)

    def run():
        return train(DPFedEM(LogisticModel(64, 10), clip=1.0, noise=0.5), data, **kw)

    a, b = run(), run()
    assert a.history == b.history
    noisy = train(DPFedEM(LogisticModel(64, 10), clip=1.0, noise=5.0), data, **kw)
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
