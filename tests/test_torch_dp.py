"""DP-AdaPeD: clipping bounds every client's release, the noise has the stated scale."""

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
