"""DP-PFL's kernels and Algorithm 1 against independent references."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from sklearn.svm import LinearSVC

from ebfl.dppfl import (
    DeviceData,
    PrivacySetting,
    exchangeable_omega,
    fit_dppfl,
    l2_normalize,
    omega_step,
)
from ebfl.dppfl import _kernels as K
from ebfl.dppfl.objective import conjugate, duality_gap, regularizer
from tests import naive_dppfl as naive

# Theorem 5's calibration fails its own conditions at these small settings, as at the paper's;
# the tests that are about that warning catch it with pytest.warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore::ebfl.dppfl.accounting.CalibrationConditionWarning")

LOSSES = {"hinge": K.HINGE, "smoothed_hinge": K.SMOOTHED_HINGE, "squared": K.SQUARED}


def _devices(sizes=(7, 9, 6, 8), d=3, seed=1, separable=False):
    rng = np.random.default_rng(seed)
    xs = [l2_normalize(rng.normal(size=(n, d))) for n in sizes]
    truth = rng.normal(size=d)
    ys = [np.where(x @ truth > 0, 1.0, -1.0) if separable else
          np.where(rng.random(len(x)) < 0.5, 1.0, -1.0) for x in xs]
    tests = [l2_normalize(rng.normal(size=(5, d))) for _ in sizes]
    return DeviceData.from_lists(xs, ys, tests, [np.where(x @ truth > 0, 1.0, -1.0)
                                                 for x in tests])


def _random_omega(m, seed):
    a = np.random.default_rng(seed).normal(size=(m, m))
    om = a @ a.T
    return om / np.trace(om)


# ------------------------------------------------------------------ random streams

def test_counter_streams_equal_the_numpy_twin():
    for seed, it, dev, purpose in ((7, 3, 2, 4), (2**64 - 5, 1, 1, 1), (0, 0, 0, 0)):
        key = np.uint64(K.stream_key(np.uint64(seed), it, dev, purpose))
        assert int(key) == int(naive.key(seed, it, dev, purpose)[0])
        np.testing.assert_array_equal([K.uniform(key, n) for n in range(9)],
                                      naive.uniforms(naive.key(seed, it, dev, purpose), 9))
        out = np.empty(7)
        K.fill_normal(key, out)
        np.testing.assert_allclose(out, naive.normals(naive.key(seed, it, dev, purpose), 7),
                                   rtol=1e-15, atol=1e-15)


def test_counter_normals_have_mean_0_and_variance_1():
    out = np.empty(200_000)
    K.fill_normal(np.uint64(K.stream_key(np.uint64(11), 0, 0, 4)), out)
    n = out.size
    # 4 standard errors: sd(mean) = 1/sqrt(n), sd(var) = sqrt(2/n)
    assert abs(out.mean()) < 4 / np.sqrt(n)
    assert abs(out.var() - 1.0) < 4 * np.sqrt(2 / n)
    # neighbouring keys are uncorrelated
    other = np.empty(n)
    K.fill_normal(np.uint64(K.stream_key(np.uint64(11), 0, 1, 4)), other)
    assert abs(np.corrcoef(out, other)[0, 1]) < 4 / np.sqrt(n)


# ------------------------------------------------------------------ the local step

@pytest.mark.parametrize("loss", list(LOSSES))
def test_coordinate_update_is_the_exact_one_dimensional_minimizer(loss):
    rng = np.random.default_rng(3)
    gamma = 0.7
    for _ in range(200):
        y = rng.choice([-1.0, 1.0])
        a = y * rng.uniform(0, 1) if loss != "squared" else rng.normal()
        z, curv = rng.normal(scale=2), rng.uniform(0.01, 3)

        def g(b, y=y, a=a, z=z, curv=curv):  # the subproblem (7) along one coordinate
            return conjugate(b, y, loss, gamma) + (b - a) * z + 0.5 * curv * (b - a) ** 2

        new = K.coordinate_update(LOSSES[loss], gamma, y, a, z, curv)
        if loss == "squared":
            ref = minimize_scalar(g, bracket=(-10, 10), tol=1e-12).x
        else:
            bounds = (0.0, 1.0) if y > 0 else (-1.0, 0.0)
            ref = minimize_scalar(g, bounds=bounds, method="bounded",
                                  options={"xatol": 1e-12}).x
        assert g(new) <= g(ref) + 1e-10
        assert new == pytest.approx(ref, abs=1e-5)


# ------------------------------------------------------------------ Algorithm 1

@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
def test_iterations_equal_the_numpy_twin(loss, private, parallel):
    data = _devices()
    m = data.n_clients
    omega = _random_omega(m, 2)
    lam, xi, gamma = 0.1, 0.5, 0.5
    dual_std = np.full(m, 0.3) if private else np.zeros(m)
    sigma2 = np.linspace(0.2, 0.9, m) if private else np.zeros(m)
    alpha, V = np.zeros(data.X.shape[0]), np.zeros((m, data.n_features))
    active, s2 = np.zeros(m, np.int64), np.zeros(m)
    kernel = K.iterations_parallel if parallel else K.iterations_serial
    kernel(data.X, data.y, np.einsum("ij,ij->i", data.X, data.X), data.offsets, alpha, V, omega,
           lam, xi, xi * m, LOSSES[loss], gamma, np.uint64(3), 0, 25, 6, 0.5, 0.2, dual_std,
           sigma2, K.S2_PRINTED, private, False, active, s2)
    a2, V2, act2 = naive.run(data.X, data.y, data.offsets, lam, xi, omega, 25, loss=loss,
                             gamma=gamma, seed=3, n_min=6, tau=0.5, drop=0.2,
                             dual_std=dual_std if private else None, sigma2=sigma2)
    np.testing.assert_allclose(alpha, a2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(V, V2, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(active, act2)
    assert 0 < active.min() and active.max() < 25  # some drops, never all


def test_fit_resumes_iteration_chunks_exactly():
    """Recording every iteration (many kernel calls) gives the run of one call."""
    data = _devices()
    one = fit_dppfl(data, lam=0.1, inner=20, outer=2, tau=0.5, drop_probability=0.2,
                    privacy=PrivacySetting(8.0), seed=4)
    many = fit_dppfl(data, lam=0.1, inner=20, outer=2, tau=0.5, drop_probability=0.2,
                     privacy=PrivacySetting(8.0), seed=4, record_every=1, parallel=False)
    np.testing.assert_allclose(many.W, one.W, rtol=1e-12, atol=1e-12)
    assert len(many.history) == 41 and len(one.history) == 3


@pytest.mark.parametrize("which", ["local", "global"])
def test_fixed_omega_solves_the_svm_of_liblinear(which):
    """Omega = I/m: independent SVMs; 1 1^T / m: one SVM of the pooled data.

    Both minimize sum hinge + lambda m ||w||^2, i.e. LinearSVC with C = 1 / (2 lambda m).
    """
    data = _devices(sizes=(30, 40, 35), d=4, seed=5, separable=False)
    m, lam = data.n_clients, 0.05
    omega = np.eye(m) / m if which == "local" else np.ones((m, m)) / m
    fit = fit_dppfl(data, lam=lam, xi=1.0, inner=4000, outer=1, omega=omega, seed=1)
    assert fit.history[-1]["gap"] < 1e-6 * fit.history[0]["gap"]
    svc = dict(C=1 / (2 * lam * m), loss="hinge", fit_intercept=False, tol=1e-10,
               max_iter=1_000_000)
    if which == "local":
        for t in range(m):
            X_t, y_t = data.device(t)
            ref = LinearSVC(**svc).fit(X_t, y_t).coef_[0]
            np.testing.assert_allclose(fit.W[t], ref, atol=2e-4)
    else:
        ref = LinearSVC(**svc).fit(data.X, data.y).coef_[0]
        for t in range(m):
            np.testing.assert_allclose(fit.W[t], ref, atol=2e-4)


def test_learned_omega_is_the_omega_step_of_the_final_models():
    data = _devices(sizes=(20, 25, 30, 22), d=5, seed=7, separable=True)
    fit = fit_dppfl(data, lam=0.01, inner=200, outer=3)
    W_before = np.linalg.solve(fit.omega, fit.W) if np.linalg.cond(fit.omega) < 1e12 else None
    assert np.isclose(np.trace(fit.omega), 1.0)
    assert np.linalg.eigvalsh(fit.omega).min() > -1e-12
    if W_before is not None:  # W = Omega V / (2 lambda) with the final Omega
        np.testing.assert_allclose(W_before, fit.V / (2 * 0.01), rtol=1e-8, atol=1e-8)


def test_omega_step_minimizes_the_trace_term():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(5, 8))
    om = omega_step(W)
    root = np.trace(np.real(__import__("scipy").linalg.sqrtm(W @ W.T)))
    assert regularizer(W, om, 1.0) == pytest.approx(root**2, rel=1e-9)
    for s in range(200):
        other = _random_omega(5, 100 + s)
        assert regularizer(W, other, 1.0) >= root**2 * (1 - 1e-12)
    np.testing.assert_allclose(omega_step(np.zeros((3, 2))), np.eye(3) / 3)


def test_non_private_gap_goes_to_zero_for_a_fixed_random_omega():
    data = _devices(sizes=(15, 12, 18, 10), d=3, seed=2)
    omega = _random_omega(4, 9)
    fit = fit_dppfl(data, lam=0.1, xi=0.5, inner=3000, outer=1, omega=omega, record_every=500)
    gaps = [row["gap"] for row in fit.history]
    assert gaps[-1] < 1e-6 * gaps[0]
    assert gaps[-1] == pytest.approx(duality_gap(data.X, data.y, data.offsets, fit.alpha,
                                                 omega, 0.1), rel=1e-12)
    assert np.all(np.diff(gaps) <= 1e-9 * gaps[0])


def test_private_fit_records_its_calibration_and_releases():
    data = _devices()
    fit = fit_dppfl(data, lam=0.1, inner=30, outer=2, drop_probability=0.3,
                    privacy=PrivacySetting(8.0, 1e-3))
    cal = fit.calibration
    assert len(cal["sigma1"]) == data.n_clients
    np.testing.assert_allclose(cal["dual_noise_std"],
                               np.asarray(cal["dual_sensitivity"]) * np.asarray(cal["sigma1"]))
    # each device took part in about 70 % of the 60 iterations (binomial, 5 sd)
    assert np.all(np.abs(fit.active - 42) < 5 * np.sqrt(60 * 0.3 * 0.7))
    assert np.all(fit.mean_upload_sensitivity > 0)
    assert "dual" not in fit.history[-1] and "primal" in fit.history[-1]


def test_same_seed_same_fit_and_inputs_untouched():
    data = _devices()
    omega = exchangeable_omega(4, 0.5)
    before = omega.copy()
    a = fit_dppfl(data, lam=0.1, inner=20, outer=1, omega=omega, tau=1.0,
                  privacy=PrivacySetting(2.0), seed=9)
    b = fit_dppfl(data, lam=0.1, inner=20, outer=1, omega=omega, tau=1.0,
                  privacy=PrivacySetting(2.0), seed=9)
    c = fit_dppfl(data, lam=0.1, inner=20, outer=1, omega=omega, tau=1.0,
                  privacy=PrivacySetting(2.0), seed=10)
    np.testing.assert_array_equal(a.W, b.W)
    assert not np.array_equal(a.W, c.W)
    np.testing.assert_array_equal(omega, before)


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": 0.0}, "lam"),
    ({"lam": 0.1, "xi": 1.5}, "xi"),
    ({"lam": 0.1, "inner": 0}, "inner"),
    ({"lam": 0.1, "loss": "logistic"}, "loss"),
    ({"lam": 0.1, "tau": 2.0}, "tau"),
    ({"lam": 0.1, "drop_probability": 1.0}, "drop_probability"),
    ({"lam": 0.1, "omega": np.eye(4)}, "trace 1"),
    ({"lam": 0.1, "omega": np.eye(3) / 3}, "omega"),
    ({"lam": 0.1, "seed": -1}, "seed"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_dppfl(_devices(), **kwargs)


def test_bad_privacy_settings():
    with pytest.raises(ValueError, match="epsilon"):
        PrivacySetting(0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacySetting(1.0, delta=1.0)
    with pytest.raises(ValueError, match="upload_sensitivity"):
        PrivacySetting(1.0, upload_sensitivity="data")
    with pytest.raises(TypeError, match="privacy"):
        fit_dppfl(_devices(), lam=0.1, privacy=8.0)
    with pytest.raises(TypeError, match="DeviceData"):
        fit_dppfl(np.zeros((3, 3)), lam=0.1)


SCRIPT = """
import json, numpy as np
from ebfl.dppfl import DeviceData, PrivacySetting, fit_dppfl, l2_normalize
rng = np.random.default_rng(0)
xs = [l2_normalize(rng.normal(size=(n, 3))) for n in (6, 8, 7)]
ys = [np.where(rng.random(len(x)) < .5, 1.0, -1.0) for x in xs]
data = DeviceData.from_lists(xs, ys)
out = {}
for name, priv in (("plain", None), ("private", PrivacySetting(4.0))):
    fit = fit_dppfl(data, lam=0.1, inner=15, outer=2, tau=0.5, drop_probability=0.2,
                    privacy=priv, seed=3, parallel=False)
    out[name] = fit.W.ravel().tolist() + fit.omega.ravel().tolist()
print(json.dumps(out))
"""


def test_same_answers_without_jit():
    def run(disable):
        env = dict(os.environ, NUMBA_DISABLE_JIT="1" if disable else "0")
        proc = subprocess.run([sys.executable, "-W", "error:overflow", "-c", SCRIPT],
                              env=env, capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent.parent)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    jit, plain = run(False), run(True)
    for key in jit:
        np.testing.assert_allclose(plain[key], jit[key], rtol=1e-10, atol=1e-12, err_msg=key)


def test_corrected_variant_uses_the_box_sensitivity_and_meets_its_target():
    """calibration="rdp" with the box sensitivity: one noise level that the RDP accountant
    certifies for the target, the dual noise sqrt(n_t) times it."""
    from ebfl.dppfl import rigorous_epsilon

    data = _devices()
    fit = fit_dppfl(data, lam=0.1, inner=30, outer=2, tau=1.0, drop_probability=0.3,
                    privacy=PrivacySetting(4.0, 1e-3, calibration="rdp",
                                           dual_sensitivity="box"))
    cal = fit.calibration
    z = cal["sigma1"][0]
    assert np.ptp(cal["sigma1"]) == 0 and cal["violated"] == []
    np.testing.assert_allclose(cal["dual_noise_std"], np.sqrt(data.sizes) * z)
    delivered = fit.delivered_epsilon()
    assert delivered.max() <= 4.0 and delivered.max() > 4.0 * (1 - 1e-3)
    # 1 % less noise would exceed the target at the largest sampling rate
    q = max(cal["sampling_rate_max"])
    assert rigorous_epsilon(0.99 * z, 0.99 * z, q, 60, 1e-3) > 4.0


def test_paper_calibration_misses_its_target_and_per_iteration_is_far_off():
    data = _devices()
    kw = dict(lam=0.1, inner=100, outer=2, tau=1.0, drop_probability=0.2)
    with pytest.warns(RuntimeWarning, match="conditions fail"):
        paper = fit_dppfl(data, privacy=PrivacySetting(8.0), **kw)
    assert paper.delivered_epsilon().max() > 8.0  # the active probability is credited
    per_it = fit_dppfl(data, privacy=PrivacySetting(8.0, calibration="per_iteration"), **kw)
    assert per_it.delivered_epsilon().min() > 50 * 8.0


def test_box_sensitivity_needs_a_hinge_loss():
    with pytest.raises(ValueError, match="box"):
        fit_dppfl(_devices(), lam=0.1, loss="squared",
                  privacy=PrivacySetting(1.0, dual_sensitivity="box"))
    with pytest.raises(ValueError, match="dual_sensitivity"):
        PrivacySetting(1.0, dual_sensitivity="exact")
