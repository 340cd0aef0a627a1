"""Contract test of the DP-PFL surface: every public callable of :mod:`ebfl.dppfl`
(and of its theory module) refuses bad input by name, mutates nothing, and never
hangs or allocates before checking sizes.

The machinery is :mod:`tests.badinput`; the regression tests at the end pin the
reported examples. Inputs are tiny (multiples of 1/4, exact in float16), and the
privacy accountants run with integer Renyi orders or a coarse PLD grid.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from ebfl.cli import main
from ebfl.datasets import feature_names
from ebfl.dppfl import (
    DPPFL,
    DeviceData,
    PrivacySetting,
    algorithm,
    calibrate_rdp,
    calibrate_theorem5,
    corollary4_epsilon,
    dppfl_privacy_report,
    dual_objective,
    dual_sensitivity,
    duality_gap,
    exchangeable_omega,
    fit_dppfl,
    har_sitting_devices,
    l2_normalize,
    omega_step,
    primal_dual_map,
    primal_objective,
    releases_of,
    rigorous_epsilon,
    sampling_rates,
)
from ebfl.dppfl import accounting as A
from ebfl.dppfl import exact as E
from ebfl.dppfl import theory as T
from ebfl.dppfl.objective import conjugate, device_sums, loss_values, regularizer
from tests.badinput import INF, NAN, Case, table_tests

# The private fits' Theorem 5 conditions fail at these tiny sizes: warned, as documented.
pytestmark = pytest.mark.filterwarnings("ignore::ebfl.dppfl.accounting.CalibrationConditionWarning")

# ------------------------------------------------------------------- inputs
# Rows of l2 norm < 1 and dual variables in the hinge's box, all multiples of 1/4.


def _X():
    return np.array([[0.5, 0.5], [0.75, -0.25], [-0.5, 0.25], [0.25, 0.75], [-0.75, 0.5]])


def _y():
    return np.array([1.0, -1.0, 1.0, 1.0, -1.0])


def _offsets():
    return np.array([0, 2, 5])


def _alpha():
    return np.array([0.5, -0.25, 0.75, 0.25, -0.5])


def _omega():
    return np.array([[0.75, 0.25], [0.25, 0.25]])


def _W():
    return np.array([[0.5, -0.25], [0.25, 0.5]])


def _data():
    X, y = _X(), _y()
    return DeviceData.from_lists([X[:2], X[2:]], [y[:2], y[2:]], [X[:1], X[3:]],
                                 [y[:1], y[3:]])


NOT_PSD = np.array([[0.5, 1.0], [1.0, 0.5]])
ASYMMETRIC = np.array([[0.75, 0.5], [0.25, 0.25]])
OMEGA_BAD = (("omega", NOT_PSD, ValueError), ("omega", ASYMMETRIC, ValueError),
             ("omega", np.eye(3) / 3, ValueError), ("omega", np.eye(2)[0], ValueError))
OFFSETS_BAD = (("offsets", np.array([0, 2, 4]), ValueError),
               ("offsets", np.array([0, 3, 2, 5]), ValueError),
               ("offsets", np.array([1, 5]), ValueError), ("offsets", np.array([5]), ValueError),
               ("offsets", np.array([[0, 5]]), ValueError))
LAM_BAD = (("lam", None, TypeError),)
LOSS_BAD = (("loss", "logistic", ValueError), ("loss", ["hinge"], TypeError))
ALPHA_BAD = (("alpha", np.zeros(4), ValueError), ("alpha", np.zeros((5, 1)), ValueError))
X_BAD = (("X", np.zeros(5), ValueError), ("X", np.zeros((5, 0)), ValueError),
         ("X", np.zeros((4, 2)), ValueError))
PROBLEM = dict(real=("X", "y"), counts=("offsets",),
               scalars={"lam": "positive", "gamma": "positive"})


def _index_bad(arg, top):
    """An index in [0, top]: refused beyond it, negative, fractional, text or a bool."""
    return ((arg, top + 1, ValueError), (arg, -1, ValueError), (arg, 2.5, TypeError),
            (arg, "0", TypeError), (arg, True, TypeError), (arg, 10**30, ValueError))


def _problem(**extra):
    return lambda: dict(X=_X(), y=_y(), offsets=_offsets(), omega=_omega(), lam=0.5,
                        loss="smoothed_hinge", gamma=1.0, **{k: f() for k, f in extra.items()})


# ------------------------------------------------------------- objective (1), (5), (6)

OBJECTIVE = [
    Case("primal_objective", primal_objective, _problem(W=_W), **{
        **PROBLEM, "real": ("X", "y", "W", "omega")},
         bad=OMEGA_BAD + OFFSETS_BAD + LAM_BAD + LOSS_BAD + X_BAD + (
             ("W", np.zeros((3, 2)), ValueError), ("W", np.zeros(2), ValueError),
             ("y", np.ones(4), ValueError)),
         extreme=(("W", np.full((2, 2), 1e300)), ("X", np.full((5, 2), 1e300)))),
    Case("dual_objective", dual_objective, _problem(alpha=_alpha),
         **{**PROBLEM, "real": ("alpha", "omega")},
         bad=OMEGA_BAD + OFFSETS_BAD + LAM_BAD + LOSS_BAD + ALPHA_BAD + X_BAD,
         extreme=(("alpha", np.full(5, 1e300)), ("X", np.full((5, 2), 1e300)))),
    Case("duality_gap", duality_gap, _problem(alpha=_alpha), real=("alpha",),
         scalars={"lam": "positive"}, bad=ALPHA_BAD + OMEGA_BAD[:1],
         extreme=(("alpha", np.full(5, 1e300)), ("X", np.full((5, 2), 1e300)))),
    Case("primal_dual_map", primal_dual_map,
         lambda: dict(X=_X(), alpha=_alpha(), offsets=_offsets(), omega=_omega(), lam=0.5),
         real=("alpha",), scalars={"lam": "positive"}, bad=ALPHA_BAD + X_BAD + OFFSETS_BAD[:1],
         extreme=(("alpha", np.full(5, 1e300)),)),
    Case("device_sums", device_sums, lambda: dict(X=_X(), alpha=_alpha(), offsets=_offsets()),
         real=("X", "alpha"), counts=("offsets",), bad=OFFSETS_BAD + ALPHA_BAD + X_BAD,
         extreme=(("alpha", np.full(5, 1e300)),)),
    Case("regularizer", regularizer, lambda: dict(W=_W(), omega=_omega(), lam=0.5),
         real=("W", "omega"), scalars={"lam": "positive"},
         bad=OMEGA_BAD + (("W", np.zeros(2), ValueError),),
         extreme=(("W", np.full((2, 2), 1e300)),)),
    Case("loss_values", loss_values,
         lambda: dict(scores=_alpha(), y=_y(), loss="smoothed_hinge", gamma=0.5),
         real=("scores", "y"), scalars={"gamma": "positive"},
         bad=LOSS_BAD + (("y", np.ones(3), ValueError),),
         extreme=(("scores", np.full(5, 1e300)),)),
    Case("conjugate", conjugate, lambda: dict(alpha=_alpha(), y=_y(), loss="squared"),
         real=("alpha", "y"), scalars={"gamma": "positive"},
         bad=LOSS_BAD + (("y", np.ones(3), ValueError),),
         extreme=(("alpha", np.full(5, 1e300)),)),
    Case("omega_step", omega_step, lambda: dict(W=_W(), previous=_omega()),
         real=("W", "previous"),
         bad=(("W", np.zeros(2), ValueError), ("W", np.zeros((10_001, 1)), ValueError),
              ("previous", NOT_PSD, ValueError), ("previous", np.eye(3), ValueError)),
         extreme=(("W", np.full((2, 2), 1e300)), ("W", np.full((2, 2), 5e-324)),
                  ("W", np.array([[1e300, 0.0], [0.0, 1e-300]])))),
]
table_tests(OBJECTIVE, "objective", globals())


# ------------------------------------------------------------------ Algorithm 1


def _fit(**kw):
    return fit_dppfl(**kw)


def _fit_result(out):
    return out.W, out.omega, out.alpha, out.V, out.history, out.active, out.calibration


FIT_SCALARS = {"lam": "positive", "inner": "count", "outer": "count", "gamma": "positive",
               "tau": "probability", "seed": "rng", "noisy_alpha": "bool", "parallel": "bool",
               "progress": "bool", "record_every": "count", "n_min": "count"}


def _dppfl(**kw):
    return DPPFL(**kw)


def _dual_variables(clients):
    return DPPFL([2, 3], 2, lam=0.5).dual_variables(clients)


ALGORITHM = [
    Case("fit_dppfl", _fit, lambda: dict(data=_data(), lam=0.5, inner=2, outer=2, n_min=2,
                                         record_every=1, parallel=False, seed=3),
         scalars=FIT_SCALARS, result=_fit_result,
         bad=LOSS_BAD + (
             ("data", _X(), TypeError), ("xi", 0.0, ValueError), ("xi", 1.5, ValueError),
             ("xi", "0.5", TypeError), ("drop_probability", 1.0, ValueError),
             ("drop_probability", NAN, ValueError), ("n_min", 3, ValueError),
             ("inner", 10**12, ValueError), ("outer", 10**12, ValueError),
             ("omega", "global", ValueError, "'learn'"), ("omega", NOT_PSD, ValueError),
             ("omega", np.eye(2), ValueError, "trace"), ("omega", np.eye(3) / 3, ValueError),
             ("omega", [[NAN, 0.0], [0.0, 1.0]], ValueError), ("omega", 5, ValueError),
             ("privacy", "strict", TypeError), ("privacy", 8.0, TypeError),
             ("privacy", PrivacySetting(1e-300), ValueError, "privacy.epsilon")),
         extreme=(("privacy", PrivacySetting(1e300)), ("privacy", PrivacySetting(8.0, ratio=1e-6)),
                  ("lam", 1e-100), ("lam", 1e100), ("xi", 5e-324))),
    Case("fit_dppfl-private", _fit,
         lambda: dict(data=_data(), lam=0.5, inner=2, outer=1, parallel=False,
                      privacy=PrivacySetting(8.0), drop_probability=0.25, tau=0.5),
         scalars={"drop_probability": "probability", "tau": "probability"}, result=_fit_result,
         bad=(("drop_probability", 1.0, ValueError),)),
    Case("DPPFL", _dppfl, lambda: dict(sizes=np.array([2, 3]), n_features=2, lam=0.5, inner=2),
         counts=("sizes",), result=lambda alg: alg.config(),
         scalars={"n_features": "size", "lam": "positive", "inner": "count", "gamma": "positive",
                  "tau": "probability", "noisy_alpha": "bool", "n_min": "count"},
         bad=LOSS_BAD + (
             ("sizes", np.array([0, 3]), ValueError), ("sizes", np.array([], int), ValueError),
             ("sizes", np.ones(10_001, int), ValueError), ("n_features", 10**8, ValueError),
             ("n_min", 3, ValueError), ("omega", "global", ValueError, "'learn'"),
             ("omega", NOT_PSD, ValueError), ("privacy", "x", TypeError),
             ("drop_probability", 1.0, ValueError), ("xi", 0.0, ValueError)),
         extreme=(("lam", 1e-100),)),
    Case("DPPFL.dual_variables", _dual_variables, lambda: dict(clients={"alpha": np.ones((2, 3))}),
         bad=(("clients", "x", TypeError), ("clients", {}, TypeError),
              ("clients", {"alpha": np.ones((2, 2))}, ValueError))),
    Case("PrivacySetting", PrivacySetting, lambda: dict(epsilon=8.0, delta=1e-3, ratio=0.5),
         scalars={"epsilon": "positive", "delta": "open_unit", "ratio": "positive"},
         bad=(("calibration", "moments", ValueError), ("upload_sensitivity", "max", ValueError),
              ("dual_sensitivity", ["box"], TypeError))),
    Case("exchangeable_omega", exchangeable_omega, lambda: dict(m=3, rho=0.5),
         scalars={"m": "size", "rho": "probability"},
         bad=(("m", 10**6, ValueError), ("m", 10_001, ValueError))),
    Case("dual_sensitivity", dual_sensitivity,
         lambda: dict(lam=0.5, beta=1.0, sizes=np.array([4, 8])), counts=("sizes",),
         scalars={"lam": "positive", "beta": "positive"},
         bad=(("sizes", np.array([0, 10]), ValueError), ("sizes", np.array([], int), ValueError),
              ("sizes", np.array([[4, 8]]), ValueError), ("kind", "l2", ValueError))),
    Case("dual_sensitivity-box", dual_sensitivity,
         lambda: dict(lam=0.5, beta=1.0, sizes=np.array([4, 8]), kind="box"),
         counts=("sizes",)),
    Case("sampling_rates", sampling_rates,
         lambda: dict(sizes=np.array([10, 20]), n_min=8, tau=0.5), counts=("sizes",),
         scalars={"n_min": "count", "tau": "probability"},
         bad=(("n_min", 50, ValueError), ("n_min", 11, ValueError), ("tau", 2.0, ValueError),
              ("sizes", np.array([0, 10]), ValueError))),
    Case("test_error", algorithm.test_error, lambda: dict(data=_data(), W=_W()), real=("W",),
         bad=(("W", np.zeros((3, 2)), ValueError), ("W", np.zeros(2), ValueError),
              ("data", {"X": _X()}, TypeError))),
]
table_tests(ALGORITHM, "algorithm", globals())


# ------------------------------------------------------------------ accounting

ORDERS = np.array([2.0, 4.0, 8.0, 16.0])  # integer orders: exact and fast
ACC_KINDS = {"releases": "count", "delta": "open_unit"}
NOISE_BAD = (("sigma1", 1e-4, ValueError), ("sigma2", 1e9, ValueError),
             ("sigma1", np.ones((2, 2)), ValueError), ("sigma2", [], ValueError),
             ("sampling_rate", 1.5, ValueError), ("sampling_rate", -0.25, ValueError),
             ("sampling_rate", np.full(3, 0.5), ValueError, "common length"),
             ("releases", 2**53 + 1, ValueError))


def _noise(**extra):
    return lambda: dict(sigma1=np.array([2.0, 4.0]), sigma2=4.0, sampling_rate=0.25,
                        releases=10, delta=1e-5, **extra)


ACCOUNTING = [
    Case("releases_of", releases_of, lambda: dict(inner=20, outer=3),
         scalars={"inner": "count", "outer": "count"},
         bad=(("inner", 2**53 + 1, ValueError), ("outer", 2**50, ValueError, "inner \\* outer"))),
    Case("calibrate_theorem5", calibrate_theorem5,
         lambda: dict(epsilon=8.0, delta=1e-3, releases=200, sampling_rate=np.array([0.25, 1.0]),
                      active_probability=0.75, ratio=0.5, warn=False),
         real=("sampling_rate",),
         scalars={"epsilon": "positive", "ratio": "positive", "warn": "bool", **ACC_KINDS},
         bad=(("sampling_rate", 0.0, ValueError, r"\(0, 1\]"),
              ("sampling_rate", np.array([0.5, 0.0]), ValueError),
              ("sampling_rate", 1.5, ValueError), ("sampling_rate", np.ones((2, 2)), ValueError),
              ("active_probability", 0.0, ValueError), ("active_probability", 1.5, ValueError),
              ("active_probability", "1", TypeError), ("releases", 2**60, ValueError)),
         extreme=(("epsilon", 1e-320), ("ratio", 5e-324), ("sampling_rate", 5e-324))),
    Case("calibrate_rdp", calibrate_rdp,
         lambda: dict(epsilon=2.0, delta=1e-5, releases=10, sampling_rate=1.0, ratio=0.5),
         real=("sampling_rate",), scalars={"epsilon": "positive", "ratio": "positive",
                                           **ACC_KINDS},
         bad=(("sampling_rate", 0.0, ValueError, r"\(0, 1\]"),
              ("sampling_rate", np.array([0.5, 1.0]), ValueError),
              ("ratio", 1e12, ValueError), ("ratio", 1e-12, ValueError))),
    Case("rigorous_epsilon", rigorous_epsilon, _noise(orders=ORDERS),
         real=("sigma1", "sigma2", "sampling_rate", "orders"), scalars=ACC_KINDS,
         bad=NOISE_BAD + (("orders", [1.0, 2.0], ValueError), ("orders", [], ValueError),
                          ("accountant", "moments", ValueError),
                          ("accountant", ["rdp"], TypeError))),
    Case("rigorous_epsilon-pld", rigorous_epsilon,
         _noise(accountant="pld", value_discretization_interval=0.01),
         scalars={"value_discretization_interval": "positive", **ACC_KINDS}, valid=False,
         bad=(("releases", 10**6 + 1, ValueError), ("value_discretization_interval", 2.0,
                                                     ValueError))),
    Case("corollary4_epsilon", corollary4_epsilon, _noise(warn=False),
         real=("sigma1", "sigma2", "sampling_rate"),
         scalars={"restrict_order": "bool", "warn": "bool", **ACC_KINDS},
         bad=NOISE_BAD + (("form", "moments", ValueError),), finite=False),
    Case("dppfl_privacy_report", dppfl_privacy_report,
         lambda: dict(epsilon=8.0, delta=1e-3, inner=5, outer=2, sampling_rate=0.5),
         valid=False, real=("sampling_rate",),
         scalars={"epsilon": "positive", "delta": "open_unit", "inner": "count", "outer": "count",
                  "ratio": "positive"},
         bad=(("sampling_rate", 0.0, ValueError), ("drop_probability", 1.0, ValueError),
              ("drop_probability", -0.5, ValueError), ("inner", 10**14, ValueError),
              ("outer", 10**6, ValueError), ("epsilon", 1e-300, ValueError, r"epsilon must lie in"),
              ("epsilon", 1e300, ValueError), ("ratio", 1e-20, ValueError),
              ("ratio", 1e300, ValueError))),
]
table_tests(ACCOUNTING, "accounting", globals())


# ------------------------------------------------------------------ data


def _from_lists(**kw):
    return DeviceData.from_lists(**kw)


def _method(name):
    def call(**kw):
        return getattr(_data(), name)(**kw)
    return call


def _windows():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(np.round(rng.normal(size=(16, 72)) * 4) / 4, columns=feature_names())
    frame.insert(0, "label", np.tile([4, 1, 5, 6], 4))
    frame.insert(0, "user", np.repeat([1, 2], 8))
    return frame


def _har(windows=None, **kw):
    """har_sitting_devices on a small frame (the harness cannot compare DataFrames)."""
    return har_sitting_devices(_windows() if windows is None else windows, **kw)


DATA = [
    Case("DeviceData", DeviceData, lambda: dict(X=_X(), y=_y(), offsets=_offsets()),
         real=("X", "y"), counts=("offsets",),
         bad=X_BAD + (("y", np.array([1.0, 0.0, 1.0, 1.0, -1.0]), ValueError),
                      ("X", _X() * 2, ValueError, "l2_normalize"),
                      ("offsets", np.array([0, 5, 5]), ValueError),
                      ("offsets", np.array([0.0, 2.0, 5.0]), TypeError),
                      ("users", [1, 1], ValueError), ("users", [0.5, 1.5], TypeError),
                      ("feature_names", ["a"], ValueError), ("feature_names", [1, 2], TypeError),
                      ("X_test", _X(), ValueError))),
    Case("DeviceData.from_lists", _from_lists,
         lambda: dict(xs=[_X()[:2], _X()[2:]], ys=[_y()[:2], _y()[2:]]),
         bad=(("xs", "abc", TypeError), ("xs", [], ValueError), ("xs", [_X()], ValueError),
              ("xs", [_X()[:2], np.zeros((3, 3))], ValueError),
              ("xs", [_X()[:2], np.zeros((0, 2))], ValueError),
              ("xs", [_X()[:2], _X()[2:] + 1j], TypeError),
              ("xs", [_X()[:2], np.full((3, 2), NAN)], ValueError),
              ("ys", [_y()[:2], _y()[2:4]], ValueError), ("xs_test", [_X()], ValueError),
              ("users", [3], ValueError))),
    Case("DeviceData.device", _method("device"), lambda: dict(t=1), bad=_index_bad("t", 1)),
    Case("DeviceData.test_device", _method("test_device"), lambda: dict(t=0),
         bad=(("t", 2, ValueError), ("t", 0.5, TypeError))),
    Case("DeviceData.subset", _method("subset"), lambda: dict(ids=np.array([1, 0])),
         counts=("ids",), result=lambda d: (d.X, d.y, d.offsets, d.users),
         bad=(("ids", np.array([0, 0]), ValueError), ("ids", np.array([2]), ValueError),
              ("ids", np.array([], int), ValueError))),
    Case("DeviceData.folds", _method("folds"), lambda: dict(k=2, seed=0),
         result=lambda folds: [(tr.X, va.X) for tr, va in folds],
         scalars={"seed": "rng"},
         bad=(("k", 1, ValueError), ("k", 3, ValueError), ("k", 10**30, ValueError),
              ("k", 2.5, TypeError))),
    Case("l2_normalize", l2_normalize, lambda: dict(X=_X() * 4), real=("X",),
         bad=(("X", np.zeros(3), ValueError),),
         extreme=(("X", np.full((2, 2), 1e308)), ("X", np.full((2, 2), 5e-324)))),
    Case("har_sitting_devices", _har, lambda: dict(seed=0, test_fraction=0.25, intercept=False),
         result=lambda d: (d.X, d.y, d.offsets, d.X_test),
         scalars={"seed": "rng", "test_fraction": "open_unit", "intercept": "bool"},
         bad=(("source", "wisdm", ValueError), ("windows", _X(), TypeError),
              ("windows", "hapt.csv", TypeError))),
]
table_tests(DATA, "data", globals())


# ------------------------------------------------------------------ theory

LOCAL = lambda: dict(X_t=_X()[:2], y_t=_y()[:2], alpha_t=_alpha()[:2],  # noqa: E731
                     w_t=np.array([0.25, -0.5]), omega_tt=0.5, lam=0.5, beta=1.0,
                     loss="smoothed_hinge")
LOCAL_KINDS = {"omega_tt": "nonnegative", "lam": "positive", "beta": "positive",
               "gamma": "positive"}
LOCAL_BAD = LOSS_BAD + (("X_t", np.zeros(2), ValueError), ("y_t", np.ones(3), ValueError),
                        ("y_t", np.array([1.0, 0.5]), ValueError),
                        ("alpha_t", np.array([2.0, 0.0]), ValueError),
                        ("w_t", np.zeros(3), ValueError))
GLOBAL = lambda: dict(X=_X(), y=_y(), offsets=_offsets(), omega=_omega())  # noqa: E731


def _with(make, **extra):
    return lambda: {**make(), **extra}


# The functions of one family share their checks: every argument is varied on the first
# (local_objective, lemma1_gap, primal_objective, dual_objective), only their own on the others.
LOCAL_EXTREME = (("lam", 1e308), ("lam", 5e-324), ("beta", 1e308), ("beta", 5e-324),
                 ("omega_tt", 1e308))
THEORY = [
    Case("local_objective", E.local_objective, _with(LOCAL, dalpha_t=np.array([0.25, -0.25])),
         real=("dalpha_t", "X_t", "w_t"), scalars=LOCAL_KINDS, bad=LOCAL_BAD),
    Case("solve_local_exactly", E.solve_local_exactly, LOCAL, real=("X_t",),
         result=lambda s: (s.dalpha, s.converged),
         scalars={"tol": "positive", "max_sweeps": "count"}, extreme=LOCAL_EXTREME,
         bad=(("max_sweeps", 10**12, ValueError), ("alpha_t", np.array([2.0, 0.0]), ValueError))),
    Case("local_solution_quality", E.local_solution_quality,
         _with(LOCAL, dalpha_t=np.array([0.25, -0.25])), real=("dalpha_t",),
         scalars={"tol": "positive"}, extreme=LOCAL_EXTREME,
         bad=(("dalpha_t", np.zeros(3), ValueError),)),
    Case("local_strong_convexity", E.local_strong_convexity,
         lambda: dict(X_t=_X(), omega_tt=0.5, lam=0.5, beta=1.0), real=("X_t",),
         scalars=LOCAL_KINDS, bad=LOSS_BAD),
    Case("solve_dual_exactly", E.solve_dual_exactly, _with(GLOBAL, lam=0.5, loss="squared"),
         real=("omega",), result=lambda s: (s.alpha, s.converged),
         scalars={"lam": "positive", "tol": "positive", "max_sweeps": "count"},
         bad=(("max_sweeps", 10**12, ValueError), ("offsets", np.array([0, 5, 4]), ValueError))),
    Case("lemma1_ratio", T.lemma1_ratio,
         lambda: dict(X=_X(), offsets=_offsets(), omega=_omega(), dalpha=_alpha()),
         real=("dalpha",), bad=(("dalpha", np.zeros(5), ValueError), OMEGA_BAD[0])),
    Case("lemma1_ratio_sup", T.lemma1_ratio_sup, lambda: dict(omega=_omega()), real=("omega",),
         bad=(("omega", NOT_PSD, ValueError), ("omega", np.zeros((2, 2)), ValueError),
              ("omega", np.zeros((2, 3)), ValueError))),
    Case("lemma1_gap", T.lemma1_gap,
         _with(GLOBAL, alpha=_alpha(), dalpha=np.zeros(5), lam=0.5, xi=0.5),
         real=("alpha", "dalpha", "omega"), counts=("offsets",),
         scalars={"lam": "positive", "gamma": "positive", "beta": "positive"},
         bad=OMEGA_BAD + OFFSETS_BAD + LOSS_BAD + (
             ("xi", 0.0, ValueError), ("form", "cocoa", ValueError),
             ("dalpha", np.full(5, 4.0), ValueError))),
    Case("corollary2_difference", T.corollary2_difference,
         _with(LOCAL, j=0, x_new=np.array([-0.5, 0.5]), y_new=1),
         real=("x_new",), scalars={"tol": "positive"}, extreme=LOCAL_EXTREME,
         bad=_index_bad("j", 1) + (("x_new", np.ones(2), ValueError),
                                   ("x_new", np.zeros(3), ValueError), ("y_new", 0, ValueError),
                                   ("y_new", "1", ValueError), ("y_new", True, ValueError),
                                   ("X_t", _X()[:2] * 2, ValueError))),
    Case("corollary3_difference", T.corollary3_difference,
         lambda: dict(X_t=_X(), dalpha_t=_alpha(), xi=0.5, j=1, x_new=np.array([0.5, 0.5])),
         real=("X_t", "dalpha_t", "x_new"),
         bad=_index_bad("j", 4) + (("xi", 0.0, ValueError), ("x_new", np.ones(2), ValueError),
                                   ("X_t", _X() * 2, ValueError))),
    Case("omega_objective", T.omega_objective, lambda: dict(W=_W(), omega=_omega()),
         real=("W", "omega"), bad=OMEGA_BAD),
    Case("omega_step_value", T.omega_step_value, lambda: dict(W=_W()), real=("W",),
         result=lambda r: (r.omega, r.value), bad=(("W", np.zeros((2, 2)), ValueError),),
         extreme=(("W", np.full((2, 2), 1e300)),)),
    Case("random_feasible_omega", T.random_feasible_omega, lambda: dict(m=3, rng=0, rank=2),
         scalars={"m": "size", "rng": "rng", "rank": "size"},
         bad=(("m", 10**6, ValueError), ("rank", 10**9, ValueError))),
    Case("theorem3_rate", T.theorem3_rate, lambda: dict(xi=0.5, theta=0.25, s=0.5),
         scalars={"theta": "probability", "s": "probability"},
         bad=(("xi", 0.0, ValueError), ("theta", 1.0, ValueError), ("s", 0.0, ValueError))),
    Case("theorem3_iterations", T.theorem3_iterations,
         lambda: dict(n=100, eps_G=1e-3, xi=0.5, theta=0.25, s=0.5),
         scalars={"n": "positive", "eps_G": "positive"}, bad=(("xi", 1.5, ValueError),)),
    Case("theorem3_s", T.theorem3_s,
         _with(lambda: {k: v for k, v in GLOBAL().items() if k != "y"}, lam=0.5, beta=1.0,
               mu=1.0),
         real=("X",), scalars={"lam": "positive", "beta": "positive", "mu": "positive"},
         bad=OMEGA_BAD[:1]),
    Case("theorem4_iterations", T.theorem4_iterations,
         lambda: dict(sizes=np.array([100, 50]), lam=0.1, eps_G=0.5, xi=0.5, theta=0.25),
         counts=("sizes",),
         scalars={"lam": "positive", "eps_G": "positive", "L": "positive",
                  "initial_gap": "nonnegative", "beta": "positive"},
         bad=(("sizes", np.array([], int), ValueError), ("sizes", np.array([0, 3]), ValueError),
              ("form", "both", ValueError), ("xi", 0.0, ValueError)), finite=False),
    Case("exact_local_run", E.exact_local_run,
         _with(GLOBAL, lam=0.5, xi=0.5, iterations=2, loss="squared", average_after=0),
         real=("y",), result=lambda r: (r.history, r.alpha, r.average),
         scalars={"lam": "positive", "iterations": "count", "tol": "positive"},
         bad=(("average_after", 2, ValueError), ("average_after", -1, ValueError),
              ("iterations", 10**9, ValueError), OMEGA_BAD[0])),
    Case("linear_rate", E.linear_rate,
         lambda: dict(history=[{"iteration": k, "gap": 0.5**k} for k in range(5)], value="gap"),
         scalars={"rtol": "open_unit"},
         bad=(("history", [{"iteration": 0}], TypeError), ("history", "abc", TypeError),
              ("history", [{"iteration": k, "gap": NAN} for k in range(5)], ValueError),
              ("value", "primal", ValueError), ("optimum", "0", TypeError))),
]
table_tests(THEORY, "theory", globals())


# ------------------------------------------------------------------ the reported examples


def test_sampling_rates_are_probabilities():
    with pytest.raises(ValueError, match=r"n_min must be an integer in \[1, 10\], got 50"):
        sampling_rates([10, 20], 50, 1.0)
    with pytest.raises(ValueError, match=r"tau must be a real number in \[0, 1\], got 2.0"):
        sampling_rates([10, 20], 10, 2.0)
    with pytest.raises(ValueError, match="n_min"):
        sampling_rates([10, 20], 0, 0.5)
    q_mean, q_max = sampling_rates([10, 20], 10, 1.0)
    assert np.all((q_mean > 0) & (q_max <= 1)) and q_max.tolist() == [1.0, 0.5]


def test_dual_sensitivity_needs_positive_sizes():
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        dual_sensitivity(0.1, 1.0, [0, 10])
    with pytest.raises(ValueError, match="beta"):
        dual_sensitivity(0.1, 0.0, [5, 10])
    with pytest.raises(ValueError, match="lam"):
        dual_sensitivity(-0.1, 1.0, [5, 10])
    assert np.isfinite(dual_sensitivity(0.1, 1.0, [1, 10])).all()


def test_fit_refuses_n_min_zero_instead_of_learning_nothing():
    with pytest.raises(ValueError, match=r"n_min must be an integer in \[1, 2\], got 0"):
        fit_dppfl(_data(), lam=0.5, inner=2, outer=1, n_min=0, parallel=False)
    with pytest.raises(ValueError, match="n_min"):
        DPPFL([2, 3], 2, lam=0.5, n_min=0)


def test_calibration_refuses_sampling_rate_zero():
    for call in (lambda: calibrate_theorem5(1.0, 1e-3, releases=10, sampling_rate=0.0),
                 lambda: calibrate_rdp(1.0, 1e-3, releases=10, sampling_rate=0.0),
                 lambda: dppfl_privacy_report(1.0, 1e-3, inner=2, outer=2, sampling_rate=0.0)):
        with pytest.raises(ValueError, match=r"sampling_rate must lie in \(0, 1\]"):
            call()
    # the accountants keep q = 0 (only the upload's Gaussian)
    assert np.isfinite(rigorous_epsilon(2.0, 4.0, 0.0, 10, 1e-5, orders=ORDERS))


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(inner=10**12), r"inner \* outer .* at most 1e\+07"),
    (dict(inner=1, outer=10**12), r"inner \* outer .* at most 1e\+07"),
])
def test_fit_refuses_runs_beyond_the_iteration_limit_at_once(kwargs, pattern):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=pattern):
        fit_dppfl(_data(), lam=0.5, **{"outer": 1, **kwargs})
    assert time.perf_counter() - start < 5.0


def test_pld_accountant_refuses_counts_it_cannot_compose():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"releases must be at most 1e\+06 with accountant='pld'"):
        rigorous_epsilon(2.0, 4.0, 0.25, 10**14, 1e-5, accountant="pld")
    with pytest.raises(ValueError, match=r"inner \* outer must be at most 1e\+06"):
        dppfl_privacy_report(8.0, 1e-3, inner=10**14, sampling_rate=0.5)
    assert time.perf_counter() - start < 5.0
    # RDP composes any count in closed form
    assert np.isfinite(rigorous_epsilon(2e6, 4e6, 0.25, 2**53, 1e-5, orders=ORDERS))


def test_omega_must_be_learn_or_a_matrix():
    with pytest.raises(ValueError, match=r"omega must be 'learn' or a \(2, 2\) matrix, "
                                         "got 'global'"):
        fit_dppfl(_data(), lam=0.5, inner=2, outer=1, omega="global", parallel=False)


def test_extreme_epsilon_is_a_clear_error_not_a_linalg_error():
    with pytest.raises(ValueError, match="privacy.epsilon=1e-300 is too small"):
        fit_dppfl(_data(), lam=0.5, inner=2, outer=1, parallel=False,
                  privacy=PrivacySetting(1e-300))
    with pytest.raises(ValueError, match="epsilon=.* float64 cannot hold"):
        calibrate_theorem5(1e-320, 1e-3, releases=10, sampling_rate=0.5)
    fit = fit_dppfl(_data(), lam=0.5, inner=2, outer=1, parallel=False,
                    privacy=PrivacySetting(1e300))
    assert np.isfinite(fit.W).all()


def test_omega_step_of_non_finite_or_extreme_models():
    with pytest.raises(ValueError, match="W must be finite"):
        omega_step(np.array([[NAN, 1.0], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="W must be finite"):
        omega_step(np.array([[INF, 1.0], [1.0, 2.0]]))
    W = _W()
    for scale in (1e-300, 1e300):  # Omega* does not depend on the scale of W
        np.testing.assert_allclose(omega_step(W * scale), omega_step(W), rtol=1e-12)


def test_exchangeable_omega_checks_m_before_allocating():
    with pytest.raises(ValueError, match=r"m must be an integer in \[1, 10000\], got 1000000"):
        exchangeable_omega(10**6, 0.5)
    om = exchangeable_omega(3, 0.5)
    np.testing.assert_allclose(om, (0.5 * np.eye(3) + 0.5 * np.ones((3, 3))) / 3)


def test_model_overflow_names_lam():
    V = np.full((2, 2), 1e300)
    with pytest.raises(ValueError, match="lam=1e-100 is too small"):
        algorithm._models(np.eye(2) / 2, V, 1e-100, None, 5)


def test_empty_device_sums_to_zero():
    """reduceat alone would copy the next device's first row into an empty device."""
    S = device_sums(_X(), _alpha(), np.array([0, 2, 2, 5]))
    assert S[1].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(S[2], _X()[2:].T @ _alpha()[2:])


# ------------------------------------------------------------------ the command line


def _cli_error(capsys, argv):
    status = main(["accounting", "dp-pfl", *argv])
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("argv, fragments", [
    (["--epsilon", "1e-300"], ["--epsilon must lie in [", "got 1e-300"]),
    (["--epsilon", "1e-320"], ["--epsilon must lie in ["]),
    (["--omega-every", "100000000000000"], ["--omega-every * --omega-steps must be at most 1e+06"]),
    (["--omega-steps", "100000000000000000000"], ["--omega-steps"]),
    (["--omega-every", "1000", "--omega-steps", "1001"], ["--omega-every * --omega-steps"]),
    (["--ratio", "1e-30"], ["--ratio=1e-30 admits no epsilon"]),
    (["--ratio", "1e300"], ["--ratio"]),
    (["--ratio", "inf"], ["--ratio"]),
    (["--sampling-rate", "0"], ["--sampling-rate"]),
    (["--sampling-rate", "nan"], ["--sampling-rate"]),
    (["--drop", "0.5", "--epsilon", "1e-9"], ["--epsilon"]),
    (["--delta", "1e-400"], ["--delta"]),
    (["--omega-every", "2.5"], ["--omega-every"]), (["--epsilon", "x"], ["--epsilon"]),
])
def test_cli_dp_pfl_refuses_bad_options_by_name(argv, fragments, capsys):
    start = time.perf_counter()
    line = _cli_error(capsys, argv)
    for fragment in fragments:
        assert fragment in line, line
    assert time.perf_counter() - start < 5.0


def test_report_limits_are_documented():
    assert A.MAX_PLD_RELEASES == 10**6
    assert "10**6" in dppfl_privacy_report.__doc__ and "10**7" in fit_dppfl.__doc__


def test_har_windows_without_the_feature_columns():
    with pytest.raises(ValueError, match=r"windows lacks the column\(s\)"):
        har_sitting_devices(pd.DataFrame({"user": [1, 1], "label": [4, 1]}))
