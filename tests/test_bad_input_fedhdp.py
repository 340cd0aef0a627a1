"""Bad input and regressions of FedHDP's privacy accounting and theory.

The corpus covers every public function of :mod:`ebfl.privacy.accounting.dp_fedavg`,
:mod:`ebfl.fedhdp`, :mod:`ebfl.privacy.accounting.rdp` and
:mod:`ebfl.privacy.accounting.guarantee` with the shared machinery of
:mod:`tests.badinput`; then regressions of three reported problems: an epsilon
reported without the conditions it is a proof under, a PLD inverse that
returned far more noise than RDP shows to be enough, and fractional Renyi
orders below 2 that came back as +inf or loose.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

import ebfl.fedhdp as fedhdp
import ebfl.privacy.accounting.dp_fedavg as dpf
from ebfl.privacy.accounting.core import quiet_absl
from ebfl.privacy.accounting.guarantee import dp_fedavg_guarantee
from ebfl.privacy.accounting.rdp import poisson_gaussian_rdp
from tests.badinput import INF, NAN, Case, table_tests

# ------------------------------------------------------------------ dp_fedavg

#: Bad values of a sampling rate, a probability in (0, 1].
_RATE_BAD = (("sampling_rate", 0.0, ValueError), ("sampling_rate", -0.25, ValueError),
             ("sampling_rate", 1.5, ValueError), ("sampling_rate", NAN, ValueError),
             ("sampling_rate", INF, ValueError), ("sampling_rate", "0.25", TypeError),
             ("sampling_rate", 0.25 + 1j, TypeError), ("sampling_rate", True, TypeError),
             ("sampling_rate", None, TypeError))
#: Bad Renyi orders beyond the generic array variants.
_ORDERS_BAD = (("orders", np.array([1.0, 2.0]), ValueError),
               ("orders", np.array([0.5, 2.0]), ValueError),
               ("orders", np.array([2.0, 2e6]), ValueError),
               ("orders", np.zeros((2, 2)) + 2.0, ValueError),
               ("orders", np.array([]), ValueError),
               ("orders", np.linspace(1.5, 64.0, 10_001), ValueError, "at most 10000"))
_NOISE_BAD = (("noise_multiplier", 1e-4, ValueError), ("noise_multiplier", 2e8, ValueError))
_ROUNDS_BAD = (("n_rounds", 2**53 + 1, ValueError), ("n_rounds", 10**9 + 0.5, TypeError))
_ACCOUNTANT_BAD = (("accountant", "moments", ValueError), ("accountant", ["rdp"], TypeError),
                   ("accountant", None, ValueError))
_VDI_BAD = (("value_discretization_interval", 1e-9, ValueError),
            ("value_discretization_interval", 2.0, ValueError))


def _orders():
    return np.array([1.5, 2.0, 4.0, 8.0])  # exact in float16


def _setting(**kw):
    return dict(sampling_rate=0.25, noise_multiplier=1.5, n_rounds=10, **kw)


def _group_epsilons(**kw):
    return dpf.fedhdp_group_epsilons(**kw)


DP_FEDAVG = [
    Case("dp_fedavg_rdp", dpf.dp_fedavg_rdp, lambda: _setting(orders=_orders()),
         real=("orders",), scalars={"noise_multiplier": "positive", "n_rounds": "size"},
         bad=_RATE_BAD + _ORDERS_BAD + _NOISE_BAD + _ROUNDS_BAD,
         extreme=(("n_rounds", 2**53), ("sampling_rate", 1.0), ("sampling_rate", 5e-324),
                  ("orders", np.array([1.0 + 2**-52, 1.25, 1e6])), ("noise_multiplier", 1e-3),
                  ("noise_multiplier", 1e6))),
    Case("dp_fedavg_epsilon", dpf.dp_fedavg_epsilon,
         lambda: _setting(delta=1e-5, orders=_orders()),
         real=("orders",),
         scalars={"noise_multiplier": "positive", "n_rounds": "size", "delta": "open_unit",
                  "value_discretization_interval": "positive"},
         bad=(_RATE_BAD + _ORDERS_BAD + _NOISE_BAD + _ROUNDS_BAD + _ACCOUNTANT_BAD + _VDI_BAD
              + (("conversion", "lemma2", ValueError), ("conversion", ["classic"], TypeError))),
         extreme=(("n_rounds", 2**53), ("delta", 5e-324), ("delta", 1.0 - 2**-53),
                  ("sampling_rate", 1.0))),
    Case("dp_fedavg_epsilon-pld", dpf.dp_fedavg_epsilon,
         lambda: _setting(delta=1e-5, accountant="pld", value_discretization_interval=1e-2),
         scalars={"value_discretization_interval": "positive"},
         bad=(("noise_multiplier", 1e-3, ValueError, "would need"),
              ("n_rounds", 10**9, ValueError, "for the composed privacy loss")),
         # a PLD that cannot be built in memory is refused by name, never attempted
         extreme=(("n_rounds", 2**53), ("n_rounds", 10**9), ("noise_multiplier", 1e-3))),
    Case("dp_fedavg_noise_multiplier", dpf.dp_fedavg_noise_multiplier,
         lambda: dict(sampling_rate=0.25, n_rounds=10, delta=1e-5, epsilon=4.0,
                      orders=np.array([2.0, 4.0, 8.0, 16.0]), rtol=1e-3),
         real=("orders",),
         scalars={"n_rounds": "size", "delta": "open_unit", "epsilon": "positive",
                  "rtol": "positive"},
         bad=(_RATE_BAD + _ORDERS_BAD + _ROUNDS_BAD + _ACCOUNTANT_BAD
              + (("rtol", 0.5, ValueError), ("rtol", 1e-13, ValueError),
                 ("conversion", "exact", ValueError))),
         extreme=(("n_rounds", 2**53), ("n_rounds", 10**9), ("epsilon", 1e-6))),
    Case("dp_fedavg_noise_multiplier-pld", dpf.dp_fedavg_noise_multiplier,
         lambda: dict(sampling_rate=0.25, n_rounds=10, delta=1e-5, epsilon=4.0,
                      orders=np.array([2.0, 4.0, 8.0, 16.0]), accountant="pld",
                      value_discretization_interval=1e-2, rtol=0.1),
         scalars={"value_discretization_interval": "positive"}, bad=_VDI_BAD),
    Case("adaptive_clipping_noise", dpf.adaptive_clipping_noise,
         lambda: dict(noise_multiplier=1.0, count_noise=5.0),
         scalars={"noise_multiplier": "nonnegative", "count_noise": "positive"},
         bad=(("count_noise", 0.5, ValueError), ("count_noise", 0.25, ValueError)),
         extreme=(("count_noise", 0.5 + 2**-52),)),
    Case("adaptive_clipping_effective_noise", dpf.adaptive_clipping_effective_noise,
         lambda: dict(update_noise_multiplier=2.0, count_noise=1.0),
         scalars={"update_noise_multiplier": "nonnegative", "count_noise": "positive"}),
    Case("fedhdp_group_epsilons", _group_epsilons,
         lambda: dict(sampling_rate=0.25, noise_multipliers=np.array([1.5, 4.0, 1.5]),
                      n_rounds=10, delta=1e-5, orders=_orders()),
         real=("noise_multipliers", "orders"),
         scalars={"n_rounds": "size", "delta": "open_unit"},
         bad=(_RATE_BAD + _ORDERS_BAD + _ROUNDS_BAD + _ACCOUNTANT_BAD + _VDI_BAD
              + (("noise_multipliers", np.array([0.0, -1.0]), ValueError),
                 ("noise_multipliers", np.array([0.0, 1e-5]), ValueError,
                  r"noise_multipliers\[1\]"),
                 ("noise_multipliers", np.array([2e8]), ValueError),
                 ("noise_multipliers", np.zeros((2, 2)), ValueError),
                 ("noise_multipliers", np.array([]), ValueError),
                 ("noise_multipliers", np.full(1001, 1.5), ValueError, "at most 1000"),
                 ("sampling_rate", np.array([0.25, 0.5]), ValueError),
                 ("sampling_rate", np.array([0.25, 0.0, 0.5]), ValueError,
                  r"sampling_rate\[1\]"),
                 ("sampling_rate", np.array([[0.25, 0.5, 0.75]]), ValueError))),
         extreme=(("n_rounds", 2**53),)),
    Case("fedhdp_group_epsilons-per-group", _group_epsilons,
         lambda: dict(sampling_rate=np.array([0.25, 0.5, 0.75]),
                      noise_multipliers=np.array([1.5, 1.5, 4.0]), n_rounds=10, delta=1e-5,
                      orders=_orders()),
         real=("sampling_rate",)),
    Case("poisson_gaussian_rdp", poisson_gaussian_rdp,
         lambda: dict(sampling_rate=0.25, noise_multiplier=1.5,
                      orders=np.array([1.25, 1.5, 2.0, 2.5])),
         real=("orders",), scalars={"noise_multiplier": "positive"},
         bad=_RATE_BAD + _ORDERS_BAD + _NOISE_BAD,
         extreme=(("sampling_rate", 5e-324), ("sampling_rate", 1.0 - 2**-53),
                  ("orders", np.array([1.0 + 2**-52, 1.0 + 1e-9, 1e6 - 0.5])))),
    Case("dp_fedavg_guarantee", dp_fedavg_guarantee,
         lambda: dict(sampling="poisson", denominator="realized"),
         bad=(("sampling", "uniform", ValueError), ("sampling", ["poisson"], TypeError),
              ("denominator", "exact", ValueError), ("denominator", None, ValueError),
              ("denominator", ["expected"], TypeError))),
]

table_tests(DP_FEDAVG, "dp_fedavg", globals())


def test_every_public_function_of_dp_fedavg_is_in_the_table():
    tabled = {c.func.__name__ for c in DP_FEDAVG} | {"fedhdp_group_epsilons"}
    public = {n for n in dpf.__all__ if inspect.isfunction(getattr(dpf, n))}
    assert public <= tabled


# ---------------------------------------------------------------- FedHDP.privacy

def _privacy(denominator="realized", **kw):
    pytest.importorskip("torch")
    from ebfl.fedhdp.algorithm import FedHDP
    from ebfl.learning.torch import LogisticModel

    alg = FedHDP(LogisticModel(2, 2), [0, 1, 1], noise_multiplier=[0.0, 1.5],
                 denominator=denominator)
    return alg.privacy(**kw)


FEDHDP_PRIVACY = [
    Case("FedHDP.privacy", _privacy,
         lambda: dict(delta=1e-5, n_rounds=10, sampling_rate=0.25, sampling="poisson"),
         scalars={"delta": "open_unit", "n_rounds": "size"}, finite=False,
         bad=_RATE_BAD + _ACCOUNTANT_BAD + (("sampling", "uniform", ValueError),
                                            ("sampling", ["fixed"], TypeError),
                                            ("sampling_rate", [0.25, 0.5], TypeError))),
]

table_tests(FEDHDP_PRIVACY, "fedhdp_privacy", globals())


# ------------------------------------------------------------------ theory

#: Valid value and kind of every argument of the point-estimation functions.
_POINT = {"n_clients": (10, "size"), "rho": (0.5, "probability"), "alpha2": (1.0, "positive"),
          "tau2": (0.25, "nonnegative"), "gamma2": (0.5, "nonnegative")}
_POINT_BAD = (("n_clients", 1, ValueError), ("n_clients", 2**53 + 2, ValueError),
              ("rho", 0.33, ValueError), ("alpha2", 1e101, ValueError),
              ("tau2", 1e-101, ValueError), ("gamma2", 1e101, ValueError))
_POINT_EXTREME = (("n_clients", 2**53), ("alpha2", 1e-100), ("alpha2", 1e100),
                  ("tau2", 1e100), ("gamma2", 1e100), ("gamma2", 1e-100), ("rho", 0.0),
                  ("rho", 1.0))
#: Valid multi-level model (counts exact as int16, variances exact in float16).
_LEVELS = {"counts": np.array([4, 6]), "alpha2": 1.0, "tau2": 0.25,
           "gammas2": np.array([0.0, 0.25])}
_LEVELS_BAD = (("counts", np.array([1, 0]), ValueError), ("counts", np.array([-1, 4]),
                                                            ValueError),
               ("counts", np.array([2**60, 4]), ValueError),
               ("counts", np.zeros((2, 2), int), ValueError),
               ("gammas2", np.array([0.25]), ValueError),
               ("gammas2", np.array([0.0, -0.25]), ValueError),
               ("gammas2", np.array([0.0, 1e101]), ValueError),
               ("alpha2", 0.0, ValueError), ("tau2", -1.0, ValueError))
_GROUP_NAME_BAD = (("group", "public", ValueError), ("group", ["private"], TypeError))
_GROUP_INDEX_BAD = (("group", 2, ValueError), ("group", -1, ValueError),
                    ("group", 1.5, TypeError), ("group", "1", TypeError),
                    ("group", True, TypeError))


def _light(names):
    """One refusal of each kind per argument, for functions whose validation is shared with
    a fully tabled one (the same ``_point_iv`` / ``_levels_iv``)."""
    return tuple((p, v, exc) for p in names
                 for v, exc in ((NAN, (TypeError, ValueError)), ("1", TypeError)))


def _point_case(func, label=None, real=(), bad=(), finite=True, full=False, **fixed):
    names = [p for p in inspect.signature(func).parameters
             if p in _POINT and p not in fixed]
    # quantities of a group with no client are NaN by design (documented): no empty group
    extreme = tuple(e for e in _POINT_EXTREME if e[0] != "rho" or func.__name__ not in
                    ("fedhdp_bounds", "group_mean_variances"))
    return Case(label or func.__name__, func,
                lambda: {**{p: _POINT[p][0] for p in names}, **fixed},
                real=real, scalars={p: _POINT[p][1] for p in names} if full else {},
                bad=(_POINT_BAD if full else _light(names)) + bad,
                extreme=extreme if full else (), finite=finite)


def _levels_case(func, label=None, real=(), bad=(), finite=True, model=True, full=False,
                 **fixed):
    names = [p for p in inspect.signature(func).parameters if p in _LEVELS]
    scalars = {p: k for p, k in (("alpha2", "positive"), ("tau2", "nonnegative"))
               if p in names}
    return Case(label or func.__name__, func,
                lambda: {**{p: np.array(_LEVELS[p]) if isinstance(_LEVELS[p], np.ndarray)
                            else _LEVELS[p] for p in names}, **fixed},
                real=real + tuple(p for p in names if p == "gammas2" and full),
                counts=("counts",) if full else (),
                scalars=scalars if full else {},
                bad=(tuple(b for b in _LEVELS_BAD if b[0] in names and model) + bad
                     + (() if full else _light(scalars))),
                extreme=(("alpha2", 1e100), ("tau2", 1e-100)) if "alpha2" in names else (),
                finite=finite)


_R = np.array([0.0, 0.5, 1.0])
_POINT_FUNCS = ("dp_fedavg_gap", "dp_vs_hdp_fedavg_gap", "fedhdp_bounds", "group_mean_variances",
                "hdp_fedavg_gap", "optimal_lambda_nonprivate", "optimal_lambda_private",
                "optimal_ratio", "server_mse_dp_fedavg", "server_mse_hdp_fedavg",
                "server_mse_optimal")
_LEVEL_FUNCS = ("levels_optimal_ratios", "levels_server_variance", "two_level_optimal_lambdas",
                "two_level_optimal_ratio", "two_level_server_covariance")

THEORY = [
    *[_point_case(getattr(fedhdp, name), finite=False, full=name == "fedhdp_bounds")
      for name in _POINT_FUNCS],
    _point_case(fedhdp.server_mse, real=("r",), r=_R, full=True,
                bad=(("r", np.array([-0.5, 1.0]), ValueError), ("r", np.zeros((2, 2)),
                                                                  ValueError))),
    _point_case(fedhdp.bayes_local_mse, group="private", bad=_GROUP_NAME_BAD),
    _point_case(fedhdp.personalized_mse, real=("lam",), lam=np.array([0.0, 0.5, 1.0]),
                group="nonprivate", r=0.5,
                bad=_GROUP_NAME_BAD + (("lam", np.array([-1.0]), ValueError),
                                       ("r", -0.5, ValueError))),
    _point_case(fedhdp.optimal_lambda_exact, group="private", r=0.5, finite=False,
                bad=_GROUP_NAME_BAD + (("r", np.array([0.5, 1.0]), ValueError),
                                       ("r", NAN, ValueError))),
    *[_levels_case(getattr(fedhdp, name), finite=False) for name in _LEVEL_FUNCS],
    _levels_case(fedhdp.levels_bayes_local_mse, group=1, bad=_GROUP_INDEX_BAD),
    _levels_case(fedhdp.levels_optimal_lambda, group=1, bad=_GROUP_INDEX_BAD, finite=False),
    _levels_case(fedhdp.two_level_matching_lambdas, group=0, bad=_GROUP_INDEX_BAD),
    _levels_case(fedhdp.levels_optimal_lambda_exact, real=("ratios",), group=1,
                 ratios=np.array([1.0, 0.5]), bad=_GROUP_INDEX_BAD, finite=False),
    _levels_case(fedhdp.levels_server_mse, real=("ratios",), ratios=np.array([1.0, 0.5]),
                 full=True,
                 bad=(("ratios", np.array([1.0]), ValueError),
                      ("ratios", np.array([0.0, 0.0]), ValueError),
                      ("ratios", np.array([1.0, -0.5]), ValueError))),
    _levels_case(fedhdp.levels_personalized_mse, real=("lam", "ratios"),
                 lam=np.array([0.0, 0.5]), group=1, ratios=np.array([1.0, 0.5]),
                 bad=_GROUP_INDEX_BAD + (("lam", np.array([-0.5]), ValueError),)),
    _levels_case(fedhdp.levels_weights, real=("ratios",), ratios=np.array([1.0, 0.5]),
                 model=False, bad=(("ratios", np.array([1.0, 0.5, 0.25]), ValueError),
                                   ("counts", np.array([-1, 4]), ValueError),
                                   ("counts", np.array([2**60, 4]), ValueError))),
]

table_tests(THEORY, "theory", globals())


def test_every_public_function_of_fedhdp_is_in_the_table():
    public = {n for n in fedhdp.__all__ if inspect.isfunction(getattr(fedhdp, n))}
    assert public == {c.func.__name__ for c in THEORY}


# ------------------------------------------------------------- 1: the conditions

def test_a_realized_denominator_run_says_its_epsilon_is_not_a_proof():
    """FedHDP.privacy of a run that divides by the realized counts (the default) reports
    its epsilon as conditional, and says why; the expected-count run is a proof."""
    realized = _privacy(delta=1e-4, n_rounds=500, sampling_rate=0.05, sampling="poisson")
    assert realized.epsilon[1] == pytest.approx(3.608, abs=5e-4)
    assert (realized.in_model, realized.guarantee) == (False, "conditional")
    assert realized.denominator == "realized" and realized.sampling == "poisson"
    assert "assumes denominator='expected'" in realized.condition
    assert "realized count" in realized.condition and "not a proof" in realized.condition
    expected = _privacy("expected", delta=1e-4, n_rounds=500, sampling_rate=0.05,
                        sampling="poisson")
    assert (expected.in_model, expected.guarantee, expected.condition) == (True, "proof", None)
    np.testing.assert_array_equal(expected.epsilon, realized.epsilon)
    # fixed-size sampling, or a sampling not stated, is outside the model too
    fixed = _privacy("expected", delta=1e-4, n_rounds=500, sampling_rate=0.05, sampling="fixed")
    assert fixed.guarantee == "conditional" and "Poisson" in fixed.condition
    unknown = _privacy("expected", delta=1e-4, n_rounds=500, sampling_rate=0.05)
    assert unknown.guarantee == "conditional" and "not given" in unknown.condition
    # the record's keys are JSON-able and shared with the experiment's records
    record = realized.to_dict()
    assert record["epsilon"][0] == math.inf and record["guarantee"] == "conditional"
    assert {"sampling", "denominator", "neighboring_relation", "in_model", "guarantee",
            "condition"} <= set(dp_fedavg_guarantee(sampling="poisson", denominator="expected"))


def test_the_experiment_records_carry_the_conditions():
    from ebfl.fedhdp.experiment import FedHDPRun

    terms = dp_fedavg_guarantee(sampling="poisson", denominator="realized")
    run = FedHDPRun("FedHDP", 0.1, 0.005, 0, {"acc_g": 90.0}, 3.6, 1.0, [], terms)
    out = run.to_dict()
    assert out["guarantee"] == "conditional" and out["in_model"] is False
    assert out["condition"] == terms["condition"] and out["epsilon"] == 3.6
    assert out["denominator"] == "realized" and "accountant_model" not in out


def test_the_accounting_cli_states_what_its_epsilon_is_a_proof_for(capsys):
    import json

    from ebfl.cli import main

    assert main(["accounting", "fedhdp", "--sampling-rate", "0.05", "--noise", "1.5",
                 "--rounds", "50", "--delta", "1e-4", "--accountant", "rdp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampling"] == "poisson" and out["denominator"] == "expected"
    assert out["guarantee"] == "proof" and "realized counts" in out["valid_for"]
    for bad in (["--sampling-rate", "1.5", "--noise", "1"],
                ["--sampling-rate", "0.5", "--noise", "1e-4"]):
        assert main(["accounting", "fedhdp", *bad, "--rounds", "5", "--delta", "1e-5"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --sampling-rate must lie in (0, 1] and --noise")
        assert err.count("\n") == 1


# ------------------------------------------------------------- 2: the PLD inverse

def test_the_pld_inverse_never_needs_more_noise_than_rdp_at_a_million_rounds():
    """At 1e6 rounds PLD's discretization error (about 0.05 in epsilon) exceeds a target of
    0.1: PLD alone needed z = 754 where RDP certifies 340. The inverse now returns the
    RDP answer, says so, and it really delivers the target."""
    kw = dict(sampling_rate=0.01, n_rounds=10**6, delta=1e-5, epsilon=0.1, rtol=1e-2)
    rdp = dpf.dp_fedavg_noise_multiplier(**kw)
    pld = dpf.dp_fedavg_noise_multiplier(**kw, accountant="pld")
    assert pld.noise_multiplier <= rdp.noise_multiplier < 400
    assert pld.certified_by == "rdp" and pld.converged and pld.epsilon <= 0.1
    forward = dpf.dp_fedavg_epsilon(sampling_rate=0.01, noise_multiplier=pld.noise_multiplier,
                                    n_rounds=10**6, delta=1e-5)
    assert forward.epsilon <= 0.1


def test_where_pld_is_tighter_its_noise_is_returned_and_certifies_the_target():
    kw = dict(sampling_rate=0.05, n_rounds=500, delta=1e-4, epsilon=3.6, rtol=1e-2,
              value_discretization_interval=1e-2)
    rdp = dpf.dp_fedavg_noise_multiplier(**kw)
    pld = dpf.dp_fedavg_noise_multiplier(**kw, accountant="pld")
    assert pld.certified_by == "pld" and pld.noise_multiplier < rdp.noise_multiplier
    forward = dpf.dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=pld.noise_multiplier,
                                    n_rounds=500, delta=1e-4, accountant="pld",
                                    value_discretization_interval=1e-2)
    assert forward.epsilon <= 3.6 and forward.epsilon == pld.epsilon
    assert pld.to_dict()["certified_by"] == "pld"


def test_a_billion_rounds_is_computed_or_refused_quickly():
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="composed privacy loss .* after n_rounds=1000000000"):
        dpf.dp_fedavg_epsilon(sampling_rate=0.01, noise_multiplier=10.0, n_rounds=10**9,
                              delta=1e-5, accountant="pld")
    cal = dpf.dp_fedavg_noise_multiplier(sampling_rate=0.01, n_rounds=10**9, delta=1e-5,
                                         epsilon=8.0, accountant="pld", rtol=1e-2)
    assert cal.certified_by == "rdp" and cal.epsilon <= 8.0  # PLD refused: RDP stands
    assert time.perf_counter() - t0 < 20.0


# ---------------------------------------------------------- 3: fractional orders

def _dp_accounting_rdp(q, z, orders):
    with quiet_absl():
        acc = rdp_privacy_accountant.RdpAccountant(list(orders))
        from dp_accounting import dp_event

        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    return np.asarray(acc.rdp, dtype=np.float64)


@pytest.mark.parametrize("q, z", [(0.05, 1.0), (0.01, 0.5), (0.05, 5.0), (0.001, 10.0),
                                  (0.05, 0.1)])
def test_fractional_orders_are_tight_upper_bounds_below_dp_accountings(q, z):
    """dp-accounting as the oracle: its fractional series is an upper bound (ours may not
    exceed it), its integer orders are exact (ours must match them, with our quadrature
    too), and RDP does not decrease with the order."""
    orders = np.array([1.1, 1.25, 1.5])
    ours = poisson_gaussian_rdp(q, z, orders)
    oracle = _dp_accounting_rdp(q, z, orders)
    assert np.all(np.isfinite(ours)) and np.all(ours <= oracle * (1 + 2e-8))  # its 1e-8 margin
    at_two = _dp_accounting_rdp(q, z, [2.0])[0]
    assert np.all(np.diff(np.r_[ours, at_two]) >= 0)
    from ebfl.privacy.accounting.rdp import _log_a_minus_one

    for alpha in (2.0, 3.0):  # the quadrature itself, where dp-accounting is exact
        quad = np.logaddexp(0.0, _log_a_minus_one(q, z, alpha)) / (alpha - 1.0)
        assert quad == pytest.approx(_dp_accounting_rdp(q, z, [alpha])[0], rel=1e-8)
    # where dp-accounting's series is tight (small z: few terms), the two agree
    if z <= 0.1:
        np.testing.assert_allclose(ours, oracle, rtol=2e-8)


def test_fractional_orders_where_dp_accounting_gives_inf_are_finite():
    orders = np.array([1.1, 1.25, 1.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = _dp_accounting_rdp(0.3, 0.7, orders)
    assert np.all(np.isinf(oracle))  # its series does not converge
    ours = poisson_gaussian_rdp(0.3, 0.7, orders)
    assert np.all(np.isfinite(ours)) and np.all(np.diff(ours) > 0)
    assert ours[-1] <= _dp_accounting_rdp(0.3, 0.7, [2.0])[0]
    # and the epsilon over many rounds uses them: an order below 2 is the best one
    res = dpf.dp_fedavg_epsilon(sampling_rate=0.3, noise_multiplier=0.7, n_rounds=10,
                                delta=1e-5, orders=[1.25, 1.5, 2.0, 4.0, 8.0])
    assert math.isfinite(res.epsilon)


def test_tiny_rdp_stays_positive_and_exact():
    """dp-accounting's integer orders cancel to rounding noise for tiny RDP (-8e-25 for
    1e-24 here); the exact value is q^2 expm1(1/z^2) at order 2."""
    q, z = 1e-9, 1e3
    rdp = poisson_gaussian_rdp(q, z, [1.5, 2.0])
    assert rdp[1] == pytest.approx(math.log1p(q * q * math.expm1(1 / z**2)), rel=1e-12)
    assert 0 < rdp[0] <= rdp[1]


def test_group_epsilons_of_a_non_private_group_are_inf():
    eps = dpf.fedhdp_group_epsilons(0.25, [0.0, 1.5, 0.0], 10, 1e-5, orders=_orders())
    assert math.isinf(eps[0]) and math.isinf(eps[2]) and math.isfinite(eps[1])
    assert np.all(np.isinf(dpf.fedhdp_group_epsilons(0.25, [0.0], 10, 1e-5)))


def test_matching_lambdas_stay_positive_at_extreme_variances():
    """Eq. (52)-(54) as printed cancel catastrophically: lambda = -7e16 at alpha2 = 1e100
    (exactly 4e100, by rational arithmetic)."""
    big = fedhdp.two_level_matching_lambdas(0, [4, 6], 1e100, 0.25, [0.0, 0.25])
    np.testing.assert_allclose(big, 4e100, rtol=1e-12)
    small = fedhdp.two_level_matching_lambdas(0, [4, 6], 1.0, 1e-100, [0.0, 0.25])
    np.testing.assert_allclose(small, 1e100, rtol=1e-12)
