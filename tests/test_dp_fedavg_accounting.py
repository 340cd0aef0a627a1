"""DP-FedAvg / FedHDP client-level accounting (ebfl.privacy.accounting.dp_fedavg).

The FedHDP paper's Table 7 guarantees are reproduced to three decimals; the
RDP curve is checked against a naive computation (the binomial expansion of
Mironov, Talwar and Zhang 2019 at integer orders, numerical integration at
fractional ones), the conversion against its formula written out, PLD beside
RDP, and the adaptive-clipping split against dp-accounting's composition.
"""

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, special

from ebfl.cli import main
from ebfl.privacy.accounting.dp_fedavg import (
    TFP_ORDERS,
    adaptive_clipping_effective_noise,
    adaptive_clipping_noise,
    dp_fedavg_epsilon,
    dp_fedavg_noise_multiplier,
    dp_fedavg_rdp,
    fedhdp_group_epsilons,
)

T, DELTA = 500, 1e-4
#: (q, z) -> (improved epsilon, its order, classic epsilon): Table 7 of the FedHDP paper
#: prints 3.6, 0.6 and 4.1 (non-IID MNIST, FMNIST, FEMNIST). The classic values to four
#: decimals (4.8175 is often quoted truncated, as 4.817).
PAPER_ROWS = {
    (0.05, 1.5): (3.608, 5.1, 4.2106),
    (0.03, 4.0): (0.576, 21.0, 0.7635),
    (0.03, 1.0): (4.122, 4.3, 4.8175),
}


def _kw(q, z, **extra):
    return dict(sampling_rate=q, noise_multiplier=z, n_rounds=T, delta=DELTA, **extra)


# --------------------------------------------------------------------------- the paper's rows


@pytest.mark.parametrize("qz", list(PAPER_ROWS), ids=["mnist", "fmnist", "femnist"])
def test_rdp_reproduces_the_papers_epsilons(qz):
    eps, order, classic = PAPER_ROWS[qz]
    res = dp_fedavg_epsilon(**_kw(*qz))
    assert round(res.epsilon, 3) == eps
    assert res.order == order
    assert (res.accountant, res.conversion, res.n_rounds) == ("rdp", "improved", T)
    assert round(dp_fedavg_epsilon(**_kw(*qz, conversion="classic")).epsilon, 4) == classic


@pytest.mark.parametrize("qz", list(PAPER_ROWS), ids=["mnist", "fmnist", "femnist"])
def test_the_improved_conversion_is_the_formula_on_the_rdp_curve(qz):
    """eps = min_a [T RDP_a + log((a-1)/a) - (log delta + log a)/(a-1)], written out."""
    orders, rdp = dp_fedavg_rdp(sampling_rate=qz[0], noise_multiplier=qz[1], n_rounds=T)
    eps = rdp + np.log((orders - 1) / orders) - (math.log(DELTA) + np.log(orders)) / (orders - 1)
    best = int(np.argmin(eps))
    res = dp_fedavg_epsilon(**_kw(*qz))
    assert res.epsilon == pytest.approx(eps[best], rel=1e-12)
    assert res.order == orders[best]
    classic = np.min(rdp - math.log(DELTA) / (orders - 1))
    assert dp_fedavg_epsilon(**_kw(*qz, conversion="classic")).epsilon == pytest.approx(
        classic, rel=1e-12)


@pytest.mark.parametrize("qz", list(PAPER_ROWS), ids=["mnist", "fmnist", "femnist"])
def test_pld_is_tighter_than_rdp_and_close(qz):
    rdp = dp_fedavg_epsilon(**_kw(*qz)).epsilon
    pld = dp_fedavg_epsilon(**_kw(*qz, accountant="pld"))
    assert (pld.accountant, pld.order, pld.conversion) == ("pld", None, None)
    # measured: PLD is 10-12% below RDP on these three settings
    assert 0.85 * rdp < pld.epsilon <= rdp + 1e-9


def test_pld_default_discretization_is_stable_to_three_digits():
    q, z = 0.03, 4.0
    coarse = dp_fedavg_epsilon(**_kw(q, z, accountant="pld"))
    fine = dp_fedavg_epsilon(**_kw(q, z, accountant="pld", value_discretization_interval=2e-5))
    assert coarse.value_discretization_interval == 1e-4
    assert abs(coarse.epsilon - fine.epsilon) < 5e-4
    assert coarse.epsilon >= fine.epsilon - 1e-12  # pessimistic discretization: coarser is higher


# --------------------------------------------------------------------------- the RDP curve


def naive_rdp_integer(q, z, alpha):
    """log A_alpha / (alpha - 1) with A_alpha = sum_k C(alpha, k) (1-q)^(alpha-k) q^k
    exp((k^2 - k) / (2 z^2)) (Mironov, Talwar and Zhang 2019, integer alpha)."""
    k = np.arange(alpha + 1)
    log_terms = (special.gammaln(alpha + 1) - special.gammaln(k + 1)
                 - special.gammaln(alpha - k + 1) + (alpha - k) * np.log1p(-q) + k * np.log(q)
                 + (k * k - k) / (2 * z * z))
    return special.logsumexp(log_terms) / (alpha - 1)


def quadrature_rdp(q, z, alpha):
    """log E_{x ~ N(0, z^2)}[((1 - q) + q exp((2x - 1) / (2 z^2)))^alpha] / (alpha - 1)."""
    def log_integrand(x):
        ratio = np.logaddexp(np.log1p(-q), np.log(q) + (2 * x - 1) / (2 * z * z))
        return alpha * ratio - x * x / (2 * z * z) - 0.5 * np.log(2 * np.pi * z * z)

    xs = np.linspace(-30 * z, 30 * z + alpha, 20001)
    top = float(np.max(log_integrand(xs)))
    peak = float(xs[np.argmax(log_integrand(xs))])
    value, _ = integrate.quad(lambda x: np.exp(log_integrand(x) - top), peak - 40 * z,
                              peak + 40 * z, points=[peak], limit=500, epsabs=0, epsrel=1e-12)
    return (math.log(value) + top) / (alpha - 1)


@pytest.mark.parametrize("q, z, n_rounds", [(0.05, 1.5, 500), (0.03, 4.0, 500), (0.3, 0.8, 7),
                                          (0.001, 10.0, 10**6)])
def test_rdp_at_integer_orders_equals_the_binomial_expansion(q, z, n_rounds):
    orders, rdp = dp_fedavg_rdp(sampling_rate=q, noise_multiplier=z, n_rounds=n_rounds)
    integer = [i for i, a in enumerate(orders) if float(a).is_integer() and a <= 256]
    assert len(integer) > 50
    naive = np.array([n_rounds * naive_rdp_integer(q, z, int(orders[i])) for i in integer])
    np.testing.assert_allclose(rdp[integer], naive, rtol=1e-9)


@pytest.mark.parametrize("q, z", [(0.05, 1.5), (0.03, 1.0), (0.03, 4.0)])
def test_rdp_at_fractional_orders_is_a_close_upper_bound(q, z):
    """dp-accounting's fractional-order series sums absolute values: never below the
    exact value, and close to it at the orders that decide these epsilons."""
    alphas = [1.5, 4.3, 5.1, 9.9]
    _, rdp = dp_fedavg_rdp(sampling_rate=q, noise_multiplier=z, n_rounds=1, orders=alphas)
    exact = np.array([quadrature_rdp(q, z, a) for a in alphas])
    assert np.all(rdp >= exact * (1 - 1e-9))
    np.testing.assert_allclose(rdp[1:], exact[1:], rtol=2e-3)


def test_without_sampling_the_rdp_is_the_gaussians():
    orders, rdp = dp_fedavg_rdp(sampling_rate=1.0, noise_multiplier=2.0, n_rounds=3)
    np.testing.assert_allclose(rdp, 3 * orders / 8.0, rtol=1e-15)
    assert orders.tolist() == list(TFP_ORDERS)


def test_tfp_orders():
    assert len(TFP_ORDERS) == 99 + 52 + 3
    assert TFP_ORDERS[0] == 1.1 and TFP_ORDERS[98] == 10.9 and TFP_ORDERS[99] == 12.0
    assert TFP_ORDERS[-4:] == (63.0, 128.0, 256.0, 512.0)


def test_epsilon_decreases_with_noise_and_grows_with_rounds_and_sampling():
    eps = [dp_fedavg_epsilon(**_kw(0.05, z)).epsilon for z in (0.8, 1.5, 3.0)]
    assert eps[0] > eps[1] > eps[2]
    assert dp_fedavg_epsilon(**{**_kw(0.05, 1.5), "n_rounds": 1000}).epsilon > eps[1]
    assert dp_fedavg_epsilon(**_kw(0.1, 1.5)).epsilon > eps[1]


# --------------------------------------------------------------------------- inversion


@pytest.mark.parametrize("qz", list(PAPER_ROWS), ids=["mnist", "fmnist", "femnist"])
def test_noise_multiplier_inverts_epsilon(qz):
    q, z = qz
    target = dp_fedavg_epsilon(**_kw(q, z)).epsilon
    cal = dp_fedavg_noise_multiplier(sampling_rate=q, n_rounds=T, delta=DELTA, epsilon=target)
    assert cal.converged and not cal.at_bound
    assert cal.noise_multiplier == pytest.approx(z, rel=2e-6)
    assert cal.epsilon <= target
    below = dp_fedavg_epsilon(**_kw(q, cal.noise_multiplier * (1 - 1e-5))).epsilon
    assert below > target


def test_noise_multiplier_for_the_papers_rounded_epsilon():
    cal = dp_fedavg_noise_multiplier(sampling_rate=0.05, n_rounds=T, delta=DELTA, epsilon=3.6)
    assert cal.converged and cal.epsilon <= 3.6
    assert 1.5 < cal.noise_multiplier < 1.51   # 3.6 < 3.608: a little more noise


def test_noise_multiplier_by_pld_needs_less_noise():
    kw = dict(sampling_rate=0.03, n_rounds=T, delta=DELTA, epsilon=0.6)
    rdp = dp_fedavg_noise_multiplier(**kw)
    pld = dp_fedavg_noise_multiplier(**kw, accountant="pld", value_discretization_interval=1e-3)
    assert pld.converged and pld.epsilon <= 0.6
    assert pld.noise_multiplier < rdp.noise_multiplier
    check = dp_fedavg_epsilon(sampling_rate=0.03, noise_multiplier=pld.noise_multiplier,
                              n_rounds=T, delta=DELTA, accountant="pld",
                              value_discretization_interval=1e-3)
    assert check.epsilon == pytest.approx(pld.epsilon, rel=1e-12)


def test_an_unbracketed_target_is_flagged_and_warned():
    with pytest.warns(RuntimeWarning, match="smallest noise multiplier"):
        cal = dp_fedavg_noise_multiplier(sampling_rate=0.001, n_rounds=1, delta=DELTA,
                                         epsilon=1e9)
    assert cal.at_bound and not cal.converged
    assert cal.noise_multiplier == 1e-3 and cal.epsilon <= 1e9


# --------------------------------------------------------------------------- adaptive clipping


@pytest.mark.parametrize("z, sigma_b", [(1.0, 5.0), (1.5, 0.8), (4.0, 2.5), (0.3, 100.0)])
def test_adaptive_clipping_split_composes_to_the_budget(z, sigma_b):
    z_delta = adaptive_clipping_noise(z, sigma_b)
    assert z_delta == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-14)
    assert z_delta > z
    assert adaptive_clipping_effective_noise(z_delta, sigma_b) == pytest.approx(z, rel=1e-14)
    orders = [1.5, 2.0, 8.0, 32.0]

    def rdp(event):
        acc = rdp_privacy_accountant.RdpAccountant(orders)
        acc.compose(event)
        return acc.rdp

    pair = dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(z_delta),
                                     dp_event.GaussianDpEvent(2 * sigma_b)])
    np.testing.assert_allclose(rdp(pair), rdp(dp_event.GaussianDpEvent(z)), rtol=1e-12)
    sampled = [dp_event.PoissonSampledDpEvent(0.05, e) for e in (pair,
                                                                  dp_event.GaussianDpEvent(z))]
    np.testing.assert_allclose(rdp(sampled[0]), rdp(sampled[1]), rtol=1e-12)


def test_adaptive_clipping_refuses_a_count_that_spends_the_budget():
    with pytest.raises(ValueError, match=r"count_noise must be > noise_multiplier / 2"):
        adaptive_clipping_noise(2.0, 1.0)
    with pytest.raises(ValueError, match="count_noise"):
        adaptive_clipping_noise(2.0, 0.9)
    assert adaptive_clipping_noise(0.0, 1.0) == 0.0
    assert adaptive_clipping_effective_noise(0.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="noise_multiplier"):
        adaptive_clipping_noise(-1.0, 1.0)
    with pytest.raises(ValueError, match="update_noise_multiplier"):
        adaptive_clipping_effective_noise(math.nan, 1.0)
    with pytest.raises(ValueError, match="count_noise"):
        adaptive_clipping_effective_noise(1.0, 0.0)


# --------------------------------------------------------------------------- groups


def test_group_epsilons_account_each_group_separately():
    eps = fedhdp_group_epsilons(0.03, [0.0, 1.0, 4.0], T, DELTA)
    assert eps[0] == math.inf
    assert eps[1:].round(3).tolist() == [4.122, 0.576]
    per_group = fedhdp_group_epsilons([0.05, 0.03], [1.5, 4.0], T, DELTA)
    assert per_group.round(3).tolist() == [3.608, 0.576]
    pld = fedhdp_group_epsilons(0.03, [4.0], T, DELTA, accountant="pld")
    assert pld[0] == pytest.approx(
        dp_fedavg_epsilon(**_kw(0.03, 4.0, accountant="pld")).epsilon, rel=1e-12)
    assert fedhdp_group_epsilons(0.5, [0.0], T, DELTA).tolist() == [math.inf]


@pytest.mark.parametrize("args, match", [
    ((0.03, [1.0, -1.0], T, DELTA), "noise_multipliers"),
    ((0.03, [1.0, math.nan], T, DELTA), "noise_multipliers"),
    (([0.03, 0.05, 0.1], [1.0, 2.0], T, DELTA), "sampling_rate"),
    (([0.03, 1.5], [1.0, 2.0], T, DELTA), r"sampling_rate\[1\]"),
    ((0.03, [0.0], 0, DELTA), "rounds"),
    ((0.03, [0.0], T, 1.0), "delta"),
    ((0.03, [1e-5], T, DELTA), "noise_multiplier"),
])
def test_group_epsilons_refuse_bad_input(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fedhdp_group_epsilons(*args)


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("change, match", [
    ({"sampling_rate": 0.0}, r"sampling_rate must be a real number in \(0, 1\]"),
    ({"sampling_rate": 1.5}, "sampling_rate"),
    ({"sampling_rate": math.nan}, "sampling_rate"),
    ({"sampling_rate": "0.1"}, "sampling_rate"),
    ({"noise_multiplier": 0.0}, "noise_multiplier"),
    ({"noise_multiplier": 1e9}, r"noise_multiplier must be a real number in \[0.001, 1e\+08\]"),
    ({"n_rounds": 0}, "n_rounds"),
    ({"n_rounds": 2.5}, "n_rounds"),
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"accountant": "moments"}, "accountant"),
    ({"conversion": "tight"}, "conversion"),
    ({"orders": [0.5, 2.0]}, "orders"),
    ({"orders": [2.0, math.inf]}, "orders"),
    ({"value_discretization_interval": 1e-9}, "value_discretization_interval"),
    ({"accountant": "pld", "noise_multiplier": 0.01}, "accountant='pld' would need"),
    ({"accountant": "pld", "noise_multiplier": 0.3, "sampling_rate": 1.0},
     "accountant='pld' would"),
])
def test_bad_input_names_the_argument(change, match):
    kw = {**_kw(0.05, 1.5), **change}
    with pytest.raises((ValueError, TypeError), match=match):
        dp_fedavg_epsilon(**kw)


@pytest.mark.parametrize("change, match", [
    ({"epsilon": 0.0}, "epsilon"),
    ({"rtol": 0.5}, "rtol"),
    ({"sampling_rate": -0.1}, "sampling_rate"),
])
def test_noise_multiplier_refuses_bad_input(change, match):
    kw = {"sampling_rate": 0.05, "n_rounds": T, "delta": DELTA, "epsilon": 1.0, **change}
    with pytest.raises((ValueError, TypeError), match=match):
        dp_fedavg_noise_multiplier(**kw)


def test_results_are_json_able():
    res = dp_fedavg_epsilon(**_kw(0.05, 1.5))
    d = json.loads(json.dumps(res.to_dict()))
    assert d["epsilon"] == res.epsilon and d["orders"] == list(TFP_ORDERS)
    assert d["noise_multiplier"] == 1.5 and d["sampling_rate"] == 0.05
    cal = dp_fedavg_noise_multiplier(sampling_rate=0.05, n_rounds=T, delta=DELTA, epsilon=3.6)
    assert json.loads(json.dumps(cal.to_dict()))["converged"] is True


def test_custom_orders_are_used():
    res = dp_fedavg_epsilon(**_kw(0.05, 1.5, orders=[2.0, 5.0, 5.1, 6.0]))
    assert res.order == 5.1 and res.orders == (2.0, 5.0, 5.1, 6.0)
    assert res.epsilon == pytest.approx(3.608, abs=5e-4)


# --------------------------------------------------------------------------- CLI


ARGV = ["accounting", "fedhdp", "--sampling-rate", "0.05", "--noise", "1.5", "--rounds", "500",
        "--delta", "1e-4"]


def test_cli_prints_rdp_and_pld(capsys):
    assert main(ARGV + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert round(out["rdp"]["epsilon"], 3) == 3.608 and out["rdp"]["order"] == 5.1
    assert out["pld"]["epsilon"] == pytest.approx(
        dp_fedavg_epsilon(**_kw(0.05, 1.5, accountant="pld")).epsilon, rel=1e-12)
    assert out["setting"] == {"sampling_rate": 0.05, "noise_multiplier": 1.5, "n_rounds": 500,
                              "delta": 1e-4}
    assert main(ARGV + ["--accountant", "rdp", "--json"]) == 0
    assert "pld" not in json.loads(capsys.readouterr().out)
    assert main(ARGV) == 0
    text = capsys.readouterr().out
    assert "3.608" in text and "5.1" in text and "pld" in text


@pytest.mark.parametrize("change, fragment", [
    (("--sampling-rate", "1.5"), "--sampling-rate"),
    (("--noise", "1e-4"), "--noise"),
    (("--sampling-rate", "0"), "--sampling-rate"),
    (("--noise", "-1"), "--noise"),
    (("--noise", "nan"), "--noise"),
    (("--rounds", "0"), "--rounds"),
    (("--delta", "1"), "--delta"),
    (("--accountant", "moments"), "--accountant"),
])
def test_cli_bad_values_are_one_error_line(change, fragment, capsys):
    argv = list(ARGV)
    if change[0] in argv:
        argv[argv.index(change[0]) + 1] = change[1]
    else:
        argv += list(change)
    assert main(argv + ["--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0]
