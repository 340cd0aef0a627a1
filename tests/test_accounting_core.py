"""One accounting core: the three accountants agree where their models coincide, and refuse
the same out-of-range argument in the same words.

The accountants are DP-FedAvg's (:func:`ebfl.privacy.accounting.dp_fedavg_epsilon`, FedHDP's
groups), DP-AdaPeD's (:class:`ebfl.privacy.accounting.DPAdaPeDAccountant`) and DP-PFL's
rigorous one (:func:`ebfl.dppfl.rigorous_epsilon`).
"""

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from ebfl.dppfl import rigorous_epsilon
from ebfl.privacy.accounting import (
    Accountant,
    DPAdaPeDAccountant,
    dp_adaped_epsilon,
    dp_fedavg_epsilon,
    dp_fedavg_rdp,
    fedhdp_group_epsilons,
    rdp_to_epsilon,
)
from ebfl.privacy.accounting.rdp import event_rdp, poisson_gaussian_rdp

ORDERS = np.array([1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0])


@pytest.mark.parametrize("q, z, n_rounds", [(0.05, 1.5, 500), (0.3, 0.8, 40), (1.0, 3.0, 7)])
def test_dp_fedavg_and_dp_adaped_coincide_under_poisson_sampling(q, z, n_rounds):
    """DP-AdaPeD with Poisson sampling, one block and tau = 1 is DP-FedAvg: K = q m clients,
    noise std sigma sqrt(K) over the norm bound C gives the multiplier z = sigma sqrt(K)/C."""
    m = 100
    k = round(q * m)
    sigma = z / math.sqrt(k)   # C = 1
    fedavg = dp_fedavg_epsilon(sampling_rate=k / m, noise_multiplier=z, n_rounds=n_rounds,
                               delta=1e-5, orders=ORDERS)
    adaped = dp_adaped_epsilon(1e-5, n_clients=m, n_sampled=k, n_iterations=n_rounds,
                               sync_gap=1, clip_mu=1.0, noise_mu=sigma, sampling="poisson",
                               orders=ORDERS)
    _, curve = dp_fedavg_rdp(sampling_rate=k / m, noise_multiplier=z, n_rounds=n_rounds,
                             orders=ORDERS)
    np.testing.assert_allclose(adaped.rdp, curve, rtol=1e-12)
    assert adaped.epsilon == pytest.approx(fedavg.epsilon, rel=1e-12)
    assert adaped.order == fedavg.order


@pytest.mark.parametrize("sigma1, sigma2, releases", [(2.0, 3.0, 50), (0.7, 5.0, 1000)])
def test_dp_pfl_and_dp_fedavg_coincide_without_sampling(sigma1, sigma2, releases):
    """At q = 1 a DP-PFL iteration is two Gaussians on the same data, i.e. one of multiplier
    (1/sigma1^2 + 1/sigma2^2)^(-1/2): DP-FedAvg at q = 1 with that multiplier."""
    z = 1.0 / math.hypot(1.0 / sigma1, 1.0 / sigma2)
    pfl = rigorous_epsilon(sigma1, sigma2, 1.0, releases, 1e-5, orders=ORDERS)
    fedavg = dp_fedavg_epsilon(sampling_rate=1.0, noise_multiplier=z, n_rounds=releases,
                               delta=1e-5, orders=ORDERS)
    assert pfl == pytest.approx(fedavg.epsilon, rel=1e-12)


@pytest.mark.parametrize("q", [0.01, 0.2, 0.6])
def test_dp_pfl_rdp_is_the_cores_curve(q):
    """DP-PFL's iteration (the sampled dual update, then the upload) through the core: the
    sampled Gaussian's exact curve plus the upload's alpha/(2 sigma2^2), per release."""
    sigma1, sigma2, releases = 1.3, 4.0, 300
    want = releases * (poisson_gaussian_rdp(q, sigma1, ORDERS) + ORDERS / (2 * sigma2**2))
    acc = Accountant(orders=ORDERS).compose(
        dp_event.ComposedDpEvent([dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(
            sigma1)), dp_event.GaussianDpEvent(sigma2)]), releases)
    np.testing.assert_allclose(acc.get_rdp(), want, rtol=1e-12)
    assert rigorous_epsilon(sigma1, sigma2, q, releases, 1e-6, orders=ORDERS) == pytest.approx(
        rdp_to_epsilon(ORDERS, want, 1e-6), rel=1e-12)


def test_fedhdp_groups_are_dp_fedavg_per_group():
    eps = fedhdp_group_epsilons(0.05, [0.0, 1.5, 4.0], 500, 1e-4)
    assert math.isinf(eps[0])
    for got, z in zip(eps[1:], (1.5, 4.0), strict=True):
        assert got == dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=z, n_rounds=500,
                                        delta=1e-4).epsilon


def test_the_gaussian_curve_is_closed_form_and_composes():
    rdp = event_rdp(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(2.0), 10), ORDERS)
    np.testing.assert_allclose(rdp, 10 * ORDERS / 8.0, rtol=1e-15)
    acc = Accountant(orders=ORDERS).compose(dp_event.GaussianDpEvent(2.0), 10)
    assert acc.get_epsilon(1e-5) == pytest.approx(rdp_to_epsilon(ORDERS, rdp, 1e-5), rel=1e-15)
    assert acc.get_delta(acc.get_epsilon(1e-5)) == pytest.approx(1e-5, rel=1e-6)


# --------------------------------------------------------------------------- refusals


def _dp_fedavg(**kw):
    args = dict(sampling_rate=0.1, noise_multiplier=1.0, n_rounds=10, delta=1e-5)
    return dp_fedavg_epsilon(**{**args, **kw})


def _dp_adaped(**kw):
    delta = kw.pop("delta", 1e-5)
    args = dict(n_clients=10, n_sampled=5, n_iterations=10, sync_gap=1, clip_mu=1.0,
                noise_mu=1.0, sampling="poisson")
    return dp_adaped_epsilon(delta, **{**args, **kw})


def _dp_pfl(**kw):
    delta = kw.pop("delta", 1e-5)
    return rigorous_epsilon(1.0, 1.0, 0.1, 10, delta, **kw)


ACCOUNTANTS = {"dp_fedavg": _dp_fedavg, "dp_adaped": _dp_adaped, "dp_pfl": _dp_pfl}
BAD = [
    {"delta": 0.0}, {"delta": 1.0}, {"delta": -1e-5}, {"delta": math.nan}, {"delta": "1e-5"},
    {"orders": [0.5, 2.0]}, {"orders": [2.0, 2e6]}, {"orders": [2.0, math.inf]},
    {"orders": np.linspace(1.5, 64.0, 10_001)},
    {"accountant": "pld", "value_discretization_interval": 1e-9},
    {"accountant": "pld", "value_discretization_interval": 2.0},
    {"accountant": "moments"},
]


@pytest.mark.parametrize("bad", BAD, ids=lambda b: ",".join(f"{k}={v!r}"[:30] for k, v in
                                                             b.items()))
def test_the_same_argument_is_refused_in_the_same_words(bad):
    messages = {}
    for name, call in ACCOUNTANTS.items():
        with pytest.raises((TypeError, ValueError)) as info:
            call(**dict(bad))
        messages[name] = (type(info.value), str(info.value))
    assert len(set(messages.values())) == 1, messages


def test_a_pld_grid_too_large_is_refused_in_the_same_words():
    """A tiny noise multiplier: each accountant (and the core's own) names its grid, in the
    core's words, before building it."""
    ends = []
    for call in (lambda: _dp_fedavg(noise_multiplier=0.01, accountant="pld"),
                 lambda: DPAdaPeDAccountant(10, sampling="poisson", accountant="pld").step(
                     n_sampled=5, sync_gap=1, clip_mu=1.0, noise_mu=0.005),
                 lambda: rigorous_epsilon(0.01, 0.01, 0.1, 10, 1e-5, accountant="pld"),
                 lambda: Accountant(accountant="pld").compose(
                     dp_event.GaussianDpEvent(0.005), 10).get_epsilon(1e-5)):
        with pytest.raises(ValueError, match="accountant='pld' would need a grid of about") as e:
            call()
        ends.append(str(e.value).split(" (at most ")[1])
    assert len(set(ends)) == 1, ends
