"""The Numba kernels of the parametric normal-means families
(``ebfl.eb.normal_means._kernels``) against independent references.

1. The special functions: ``vexp`` and ``vlog`` against libm (within 2 ulps),
   ``erfcx`` against ``scipy.special.erfcx`` and ``log_ndtr`` against
   ``scipy.special.log_ndtr`` (1e-14 relative, over [-40, 40] and far into both
   tails), and log Phi, phi / Phi and t + phi / Phi against mpmath at 40 digits.
2. ``point_nll`` against its numpy twin ``families._point_objective`` (value and
   gradient, 1e-10 of the sum of the terms' magnitudes) on hypothesis data: sparse,
   heavy-tailed, heteroskedastic over up to 6 decades, |x| / s up to 1e8, and pi0
   anywhere in [0, 1] (0 and 1 included), scales far below and above s.
3. Its Hessian against central differences of its gradient.
4. The parallel and serial kernels equal to the last bit, whatever the number of
   threads; the kernels under NUMBA_DISABLE_JIT equal to the compiled ones.
5. The fit on subsamples then all the data (n >= 8192) at least as likely as
   L-BFGS-B run on all the data from the fit's own end point and from the usual
   starts, and converged.
"""

import math

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from ebfl.eb.normal_means import _kernels as K
from ebfl.eb.normal_means import families as F
from tests.test_nojit import run_script

FAMILIES = ("point_normal", "point_laplace", "point_exponential")

# ============================================================ 1. special functions


def _loop(f, values):
    return np.array([f(float(v)) for v in values])


def test_vexp_within_two_ulps_of_libm():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-708, 709, 20000), rng.uniform(-1, 1, 5000),
                        [0.0, -0.0, 1e-300, -1e-300, 709.0, -708.0, 0.5 * math.log(2)]])
    mine = _loop(K.vexp, x)
    ref = np.exp(x)
    assert np.all(np.abs(mine - ref) <= 2 * np.spacing(ref))
    assert K.vexp(-708.5) == 0.0 and K.vexp(-np.inf) == 0.0 and K.vexp(-1e300) == 0.0
    assert math.isnan(K.vexp(math.nan))


def test_vlog_within_two_ulps_of_libm():
    rng = np.random.default_rng(1)
    x = np.concatenate([10.0 ** rng.uniform(-307, 308, 20000), rng.uniform(0.5, 2, 5000),
                        1 + np.linspace(-1e-6, 1e-6, 201), [1.0, 2.0, math.sqrt(2), 0.5,
                                                            np.nextafter(math.sqrt(2), 2)]])
    mine = _loop(K.vlog, x)
    ref = np.log(x)
    assert np.all(np.abs(mine - ref) <= 2 * np.spacing(np.abs(ref)) + 1e-300)
    assert K.vlog(1.0) == 0.0


def test_erfcx_against_scipy():
    u = np.concatenate([np.linspace(0, K.ERFCX_MAX, 20001), np.geomspace(1e-12, 27, 2000)])
    np.testing.assert_allclose(_loop(K.erfcx, u), special.erfcx(u), rtol=5e-15, atol=0)


def _log_ndtr_grid():
    rng = np.random.default_rng(2)
    return np.concatenate([np.linspace(-40, 40, 40001), rng.uniform(-40, 40, 10000),
                           -np.geomspace(40, 1e150, 3000), np.geomspace(1e-300, 40, 2000),
                           -np.geomspace(1e-300, 40, 2000), [0.0, -1.0, 1.0, K.TAIL,
                                                             np.nextafter(K.TAIL, 0)]])


def test_log_ndtr_against_scipy_in_both_tails():
    """1e-14 relative wherever scipy's value is a normal double (above t ~ 37.5 it is
    below 1e-308, where only the absolute error means anything)."""
    t = _log_ndtr_grid()
    mine = _loop(K.log_ndtr, t)
    ref = special.log_ndtr(t)
    normal = np.abs(ref) >= np.finfo(float).tiny
    np.testing.assert_allclose(mine[normal], ref[normal], rtol=1e-14, atol=0)
    assert np.all(np.abs(mine[~normal] - ref[~normal]) <= 1e-300)
    assert K.log_ndtr(-np.inf) == -np.inf and K.log_ndtr(np.inf) == 0.0


def test_log_ndtr_and_mills_ratio_against_mpmath():
    """log Phi(t), lambda = phi / Phi and kappa = t + lambda at 40 digits: log Phi and
    lambda to 1e-14, kappa to 1e-14 (1 + t^2) in the bulk (it is a difference there:
    lambda ~ -t far left) and to 1e-14 at and below TAIL (the series, no
    cancellation)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    t = np.concatenate([np.linspace(-60, 30, 451), -np.geomspace(60, 1e8, 50)])
    for ti in t:
        log_cdf, lam, kappa = K.ndtr_parts(float(ti))
        x = mpmath.mpf(float(ti))
        cdf = mpmath.ncdf(x)
        ref_log = mpmath.log(cdf) if ti <= 0 else mpmath.log1p(-mpmath.ncdf(-x))
        ref_lam = mpmath.npdf(x) / cdf
        # above 0, Phi(-t) = exp(-t^2 / 2) erfcx / 2 carries the rounding of t^2 / 2
        # (so does scipy's): ~t^2 ulps
        rel = 1e-14 * (1 + ti * ti / 8) if ti > 0 else 1e-14
        assert log_cdf == pytest.approx(float(ref_log), rel=rel, abs=1e-300), ti
        assert lam == pytest.approx(float(ref_lam), rel=rel, abs=1e-300), ti
        tol = 1e-14 * (1 + ti * ti) if ti > K.TAIL else 1e-14
        assert kappa == pytest.approx(float(x + ref_lam), rel=tol), ti


# ====================================================== 2. the kernel and its twin

@st.composite
def point_data(draw):
    """(x, s, pi0, scale, mode): sparse, heavy-tailed, heteroskedastic or huge data and
    parameters anywhere in their box."""
    n = draw(st.integers(1, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    level = 10 ** draw(st.floats(-3, 3))
    decades = draw(st.sampled_from([0.0, 1.0, 3.0, 6.0]))
    s = level * 10 ** rng.uniform(-decades / 2, decades / 2, n)
    shape = draw(st.sampled_from(["sparse", "heavy", "hetero", "huge"]))
    if shape == "sparse":
        theta = np.where(rng.random(n) < 0.8, 0.0, rng.normal(0, 3 * level, n))
    elif shape == "heavy":
        theta = level * rng.standard_t(1.5, n)
    elif shape == "hetero":
        theta = np.where(rng.random(n) < 0.6, 0.0, rng.laplace(0, level, n))
    else:  # |x| / s up to 1e8
        theta = s * rng.choice([-1.0, 1.0], n) * 10 ** rng.uniform(0, 8, n)
    x = theta + s * rng.standard_normal(n)
    pi0 = draw(st.one_of(st.sampled_from([0.0, 1.0, 1e-310, 1e-12, 1 - 1e-12]),
                         st.floats(0.0, 1.0)))
    scale = float(np.median(s)) * 10 ** draw(st.floats(-3, 3))
    mode = float(draw(st.sampled_from([0.0, float(np.median(x)), float(x[0])])))
    return x, s, pi0, scale, mode


def _twin(family, x, s, pi0, scale, mode):
    f, g = F._point_objective(family, x, s, True, True, None, None)(
        np.array([pi0, math.log(scale), mode]))
    return f, g


def _kernel(family, x, s, pi0, scale, mode, kernel=None):
    kernel = kernel or K.point_nll_serial
    return kernel(K.KINDS[family], np.ascontiguousarray(x), np.ascontiguousarray(s),
                  np.log(s), pi0, scale, mode)


KERNEL_DATA = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                       suppress_health_check=[HealthCheck.too_slow])


def _conditioning(x, s, pi0, scale, mode, per_obs):
    """Per observation: the size L of its log densities (1 + (z / s)^2 / 2 + a^2 +
    a |z| / s + |log s| + |log b|, a = s / b), and the natural size of each of its
    four terms: 1 (value), |f0 - f1| / mix + 1 (d pi0), 1 + a (|z| / s + a + 1) +
    (z / s)^2 (d log b) and (1 + 2 |z| / s + a) / s (d mode)."""
    zs = np.abs(x - mode) / s
    a = s / scale
    size = 1 + 0.5 * zs**2 + a * a + a * zs + np.abs(np.log(s)) + abs(math.log(scale))
    d_pi0 = np.array([abs(p[1][0]) for p in per_obs]) + 1
    return size, np.stack([np.ones_like(zs), d_pi0, 1 + a * (zs + a + 1) + zs**2,
                           (1 + 2 * zs + a) / s])


@pytest.mark.parametrize("family", FAMILIES)
@KERNEL_DATA
@given(data=point_data())
def test_kernel_matches_its_numpy_twin(family, data):
    """Value and gradient within 1e-10 of the sum of the magnitudes of the observations'
    terms (each observation's twin alone gives them: the sums may cancel to far below
    their terms), plus 1e-14 of each term's natural size times the size of its log
    densities (a term that is the exp of a difference of log densities of size L is
    only good to L ulps, in either implementation; one that cancels inside, to its
    natural size)."""
    x, s, pi0, scale, mode = data
    with np.errstate(all="ignore"):
        f, g = _twin(family, x, s, pi0, scale, mode)
        per_obs = [_twin(family, x[i:i + 1], s[i:i + 1], pi0, scale, mode)
                   for i in range(x.size)]
        mag = np.sum([np.abs([p[0], *p[1]]) for p in per_obs], axis=0)
        size, natural = _conditioning(x, s, pi0, scale, mode, per_obs)
        floor = 1e-14 * np.sum(size * natural, axis=1)
    out = _kernel(family, x, s, pi0, scale, mode)
    for k, what in enumerate(("value", "d pi0", "d log b", "d mode")):
        mine, ref = out[k], (f, *g)[k]
        if not math.isfinite(ref):  # f0 / mix capped at e^700, summed: inf in both
            assert mine == ref, what
            continue
        tol = 1e-10 * (abs(ref) + mag[k]) + floor[k]
        assert abs(mine - ref) <= tol, (what, mine, ref, tol)


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_matches_its_twin_on_the_benchmark_data(family):
    rng = np.random.default_rng(5)
    n = 30000
    theta = np.where(rng.random(n) < 0.8, 0.0, 2.0 * rng.standard_t(5, n))
    s = 10.0 ** rng.uniform(-0.5, 0.5, n)
    x = theta + s * rng.standard_normal(n)
    for pi0, scale, mode in ((0.8, 1.7, 0.0), (0.0, 0.05, -1.0), (1.0, 30.0, 0.3),
                             (0.3, 1e-3, 0.0)):
        f, g = _twin(family, x, s, pi0, scale, mode)
        out = _kernel(family, x, s, pi0, scale, mode, K.point_nll)
        assert out[0] == pytest.approx(f, rel=1e-12)
        np.testing.assert_allclose(out[1:4], g, rtol=1e-10, atol=1e-10 * abs(f))


# =================================================================== 3. the Hessian

@pytest.mark.parametrize("family", FAMILIES)
def test_hessian_against_differences_of_the_gradient(family):
    rng = np.random.default_rng(6)
    n = 500
    s = 10 ** rng.uniform(-1, 1, n)
    x = np.where(rng.random(n) < 0.6, 0.0, rng.laplace(0, 2, n)) + s * rng.standard_normal(n)
    for v in ([0.6, math.log(1.5), 0.2], [0.05, math.log(0.1), -0.3], [0.97, 2.0, 1.0]):
        fgh = F._PointObjective(family, x, s, True, True, None, None).fgh
        _, _, hess = fgh(np.array(v))
        fd = np.empty((3, 3))
        for j in range(3):
            h = 1e-6 * max(1.0, abs(v[j]))
            e = np.zeros(3)
            e[j] = h
            fd[:, j] = (fgh(np.array(v) + e)[1] - fgh(np.array(v) - e)[1]) / (2 * h)
        np.testing.assert_allclose(hess, hess.T, rtol=0, atol=0)
        np.testing.assert_allclose(hess, fd, rtol=1e-5, atol=1e-6 * np.max(np.abs(hess)))


# ======================================================= 4. threads, NUMBA_DISABLE_JIT

def test_parallel_equals_serial_whatever_the_threads():
    rng = np.random.default_rng(7)
    n = 3 * K.PARALLEL_MIN + 123
    s = 10 ** rng.uniform(-1, 1, n)
    x = np.where(rng.random(n) < 0.7, 0.0, rng.standard_t(3, n)) + s * rng.standard_normal(n)
    before = numba.get_num_threads()
    try:
        for family in FAMILIES:
            serial = _kernel(family, x, s, 0.7, 1.2, 0.1)
            for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
                numba.set_num_threads(threads)
                out = _kernel(family, x, s, 0.7, 1.2, 0.1, K.point_nll)
                np.testing.assert_array_equal(out, serial)
    finally:
        numba.set_num_threads(before)


SCRIPT = """
import json, math, numpy as np
from ebfl.eb.normal_means import _kernels as K
rng = np.random.default_rng(8)
n = 300
s = 10 ** rng.uniform(-1, 1, n)
x = np.where(rng.random(n) < 0.7, 0.0, 30 * rng.standard_t(2, n)) + s * rng.standard_normal(n)
out = {}
for name, kind in K.KINDS.items():
    for pi0 in (0.0, 0.4, 1.0):
        out[f"{name}-{pi0}"] = K.point_nll(kind, x, s, np.log(s), pi0, 0.8, 0.1).tolist()
t = [-1e4, -45.0, -20.0, -3.0, -0.5, 0.0, 0.7, 5.0, 39.0]
out["ndtr"] = [list(K.ndtr_parts(v)) for v in t]
out["exp_log"] = [K.vexp(v) for v in (-700.0, -3.3, 0.0, 2.5, 600.0)] + [
    K.vlog(v) for v in (1e-300, 0.3, 1.0, 1.7, 1e300)]
from ebfl.eb.normal_means.families import fit_family
for name in K.KINDS:
    for mode in (0.0, "estimate"):
        g, diag = fit_family(name, x[:150], s[:150], mode, "estimate")
        out[f"fit-{name}-{mode}"] = [*g.weights, *g.b, diag["mode"], diag["converged"]]
print(json.dumps(out))
"""


def _run(disable_jit):
    return run_script(SCRIPT, disable_jit)


def test_same_results_without_jit():
    """Under NUMBA_DISABLE_JIT (bit casts by numpy views, Python's arithmetic) the kernels
    give the compiled results, up to fused multiply-adds and summation rounding, and the
    fits (Newton's method included) the same optima."""
    jit, plain = _run(False), _run(True)
    assert jit.keys() == plain.keys()
    for key in jit:
        mine, ref = np.array(plain[key]), np.array(jit[key])
        if key.startswith("point"):  # the Hessian's terms cancel more: 1e-9
            np.testing.assert_allclose(mine[:4], ref[:4], rtol=1e-12, atol=0, err_msg=key)
            np.testing.assert_allclose(mine[4:], ref[4:], rtol=1e-9, atol=0, err_msg=key)
        elif key.startswith("fit"):  # the same optimum (and converged)
            np.testing.assert_allclose(mine, ref, rtol=1e-7, atol=1e-9, err_msg=key)
        else:
            np.testing.assert_allclose(mine, ref, rtol=1e-12, atol=0, err_msg=key)


# ================================================== 5. the fit on subsamples, then all

def _large(seed, shape, n):
    rng = np.random.default_rng(seed)
    s = 10 ** rng.uniform(-0.5, 0.5, n)
    if shape == "sparse":
        theta = np.where(rng.random(n) < 0.8, 0.0, 2.0 * rng.standard_t(5, n))
    else:  # bimodal: the estimated mode has two basins
        theta = np.where(rng.random(n) < 0.4, -2.0, 3.0) + 0.3 * rng.standard_normal(n)
    return theta + s * rng.standard_normal(n), s


@pytest.mark.parametrize("mode", [0.0, "estimate"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", ["sparse", "bimodal"])
def test_subsampled_fit_is_the_optimum(shape, family, mode):
    """n = 20000 (the starts run on a subsample of 2048): the fit is converged and at
    least as likely (1e-12 relative) as L-BFGS-B on all the data from its end point and
    from the starts of the fit itself, on the numpy twin."""
    x, s = _large(9, shape, 20000)
    assert F._subsamples(x.size)
    g, diag = F.fit_family(family, x, s, mode, "estimate")
    assert diag["converged"]
    fit_mode = isinstance(mode, str)
    pi0, scale = float(g.weights[0]), float(g.b[-1])
    md = diag["mode"]
    twin = F._point_objective(family, x, s, True, fit_mode, None, mode)
    v = [pi0, math.log(scale)] + ([md] if fit_mode else [])
    mine = twin(np.array(v))[0]
    spread = math.sqrt(max(float(np.var(x)), float(np.min(s)) ** 2))
    span = float(np.max(np.abs(x))) + spread
    bounds = [(0.0, 1.0), (math.log(np.min(s) * 1e-3), math.log(10 * span))]
    if fit_mode:
        bounds.append((float(np.min(x)), float(np.max(x))))
    starts = [v]
    for p0, sc in ((0.5, spread), (0.5, spread / 10), (0.9, spread)):
        for m in (np.quantile(x, [0.1, 0.5, 0.9]) if fit_mode else [None]):
            starts.append([p0, math.log(sc)] + ([m] if fit_mode else []))
    for v0 in starts:
        res = optimize.minimize(twin, v0, jac=True, method="L-BFGS-B", bounds=bounds,
                                options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-10})
        assert mine <= res.fun + 1e-12 * abs(res.fun), (v0, mine, res.fun)


def test_subsample_ladder():
    assert F._subsamples(4 * F._BASIN_SAMPLE - 1) == []
    ladder = F._subsamples(100_000)
    assert [p.size for p in ladder] == [F._BASIN_SAMPLE, F._BASIN_SAMPLE * F._SAMPLE_GROWTH]
    for pick in ladder:
        assert np.all(np.diff(pick) > 0) and pick[0] >= 0 and pick[-1] < 100_000
