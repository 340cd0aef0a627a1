"""The horseshoe, generalized binary and deconvolver families of ``ebfl.ebnm``.

Each against an independent computation:

* the horseshoe's marginal density and posterior (mean, sd, P(theta < 0)) against
  adaptive quadrature over lambda (scipy's ``quad``), not the trapezoid rule the
  package uses; its fitted tau against a bounded search on the quadrature likelihood;
* the generalized binary fit against a brute-force grid over (pi, log mu);
* the deconvolver: its penalized objective at the fit against perturbed and flat
  alternatives, for data with s far from 1 (which R's ebnm refuses).

The generic checks (posteriors against quadrature for the truncated normal kind,
the hypothesis battery, tiny and large n, aliases, bad input) run on these families
in tests/test_ebnm.py.
"""

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, optimize, special

import ebfl
from ebfl.eb.normal_means import NormalMeansPrior
from ebfl.eb.normal_means.deconvolver import PENALTY, natural_spline_basis
from ebfl.eb.normal_means.generalized_binary import generalized_binary_prior
from ebfl.eb.normal_means.horseshoe import horseshoe_prior


def fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return ebfl.ebnm(*args, **kwargs)


# ==================================================================== horseshoe

def _horseshoe_integrals(x, s, tau, mode=0.0):
    """f(x), E[theta | x], E[theta^2 | x], P(theta < 0 | x) under the horseshoe, by
    quadrature in t = log(lambda): given lambda, theta | x is normal."""

    def parts(t):
        v_prior = (tau * math.exp(t)) ** 2
        v = s**2 + v_prior
        dens = math.exp(-0.5 * (x - mode) ** 2 / v) / math.sqrt(2 * math.pi * v)
        weight = dens / (math.pi * math.cosh(t))
        m = mode + (x - mode) * v_prior / v
        var = v_prior * s**2 / v
        below = special.ndtr(-m / math.sqrt(var)) if var > 0 else float(m < 0)
        return weight, m, var, below

    peak = math.log(max(abs(x - mode), s) / tau)
    out = []
    for k in range(4):
        def integrand(t, k=k):
            w, m, var, below = parts(t)
            return w * (1.0, m, var + m * m, below)[k]

        val, err = integrate.quad(integrand, -80, 80, points=[peak, 0.0], limit=800,
                                  epsabs=0, epsrel=1e-12)
        out.append(val)
    f = out[0]
    return f, out[1] / f, out[2] / f, out[3] / f


@pytest.mark.parametrize(("x", "s", "tau"), [(0.0, 1.0, 0.3), (0.5, 1.0, 0.3), (3.0, 1.0, 0.3),
                                             (-12.0, 1.0, 0.3), (40.0, 1.0, 2.0),
                                             (1.0, 0.01, 1.0), (2.0, 5.0, 1e-4),
                                             (1e3, 10.0, 50.0)])
def test_horseshoe_posterior_against_quadrature(x, s, tau):
    """The trapezoid rule in log(lambda) against adaptive quadrature: the log
    density to 1e-9 relative, posterior mean and sd to 1e-7, P(theta < 0) to 1e-7
    relative (each far inside what any user reads)."""
    g = horseshoe_prior(tau)
    post = g.posterior(np.array([x]), np.array([s]))
    f, m, m2, below = _horseshoe_integrals(x, s, tau)
    sd = math.sqrt(max(m2 - m * m, 0.0))
    assert post.log_marginal[0] == pytest.approx(math.log(f), rel=1e-9, abs=1e-9)
    assert post.mean[0] == pytest.approx(m, abs=1e-7 * (abs(m) + sd))
    assert post.sd[0] == pytest.approx(sd, rel=1e-6)
    p_neg = post.lfsr[0] if post.mean[0] >= 0 else 1 - post.lfsr[0]
    assert p_neg == pytest.approx(below, rel=1e-7, abs=1e-14)
    assert post.prob_zero[0] == 0.0  # no point mass


def test_horseshoe_prior_is_symmetric_and_samples_match_its_cdf():
    g = horseshoe_prior(0.7, mode=1.5)
    t = np.array([-3.0, 0.5, 1.0, 1.4])
    np.testing.assert_allclose(g.cdf(1.5 + (t - 1.5)) + g.cdf(1.5 - (t - 1.5)), 1.0,
                               atol=1e-12)
    draws = g.sample(20_000, rng=3)
    # DKW: P(sup |F_n - F| > eps) <= 2 exp(-2 n eps^2) = 1e-6 at eps = 0.0186
    grid = np.quantile(draws, np.linspace(0.01, 0.99, 99))
    assert np.max(np.abs(np.searchsorted(np.sort(draws), grid, side="right") / draws.size
                         - g.cdf(grid))) < 0.0186


def _sparse(n, seed, s=None):
    rng = np.random.default_rng(seed)
    s = np.ones(n) if s is None else s
    theta = np.where(rng.random(n) < 0.8, 0.0, rng.normal(0, 3, n))
    return theta + s * rng.standard_normal(n), s


def test_horseshoe_tau_reaches_the_quadrature_optimum():
    """On n = 40 heteroskedastic observations, tau maximizing the log-likelihood computed
    by adaptive quadrature (a bounded search of its own): ebfl's log-likelihood is at
    least that optimum's minus 1e-7 relative."""
    s = 10 ** np.random.default_rng(5).uniform(-0.5, 0.5, 40)
    x, s = _sparse(40, 6, s)
    res = fit(x, s, "horseshoe")

    def negll(log_tau):
        return -sum(math.log(_horseshoe_integrals(xi, si, math.exp(log_tau))[0])
                    for xi, si in zip(x, s, strict=True))

    ref = optimize.minimize_scalar(negll, bounds=(math.log(1e-3), math.log(30)),
                                   method="bounded", options={"xatol": 1e-5})
    assert res.log_likelihood >= -ref.fun - 1e-7 * abs(ref.fun)
    assert res.fitted_g.parameters["scale"] == pytest.approx(math.exp(ref.x), rel=1e-2)
    assert res.diagnostics["converged"] and not res.diagnostics["at_bound"]


def test_horseshoe_fixed_scale_and_estimated_mode():
    x, s = _sparse(200, 7)
    x = x + 4.0
    fixed = fit(x, s, "horseshoe", scale=0.5)
    assert fixed.fitted_g.parameters["scale"] == 0.5
    est = fit(x, s, "horseshoe", mode="estimate")
    assert est.mode == pytest.approx(4.0, abs=0.3)
    for m in (0.0, 3.5, float(np.median(x)), 4.5):
        assert est.log_likelihood >= fit(x, s, "horseshoe", mode=m).log_likelihood - 1e-8 * abs(
            est.log_likelihood)
    # predict: the same prior on new data
    new = est.predict(np.array([4.0, 10.0]), 1.0)
    assert new.fitted_g is est.fitted_g


def test_horseshoe_null_data_has_tiny_tau_and_shrinks_everything():
    rng = np.random.default_rng(8)
    x = rng.standard_normal(2000)
    res = fit(x, 1.0, "horseshoe")
    assert res.fitted_g.parameters["scale"] < 0.1
    assert np.max(np.abs(res.posterior.mean)) < 0.5 * np.max(np.abs(x))


# ============================================================ generalized binary

def _gb_brute_force(x, s, ratio, mus):
    """max over (pi, mu) on a grid: pi on 2001 points of [0, 1], mu on ``mus``."""
    pis = np.linspace(0, 1, 2001)
    best = -math.inf
    with np.errstate(divide="ignore"):
        log_pi, log_1m = np.log(pis), np.log1p(-pis)
    for mu in mus:
        g = NormalMeansPrior([0.5, 0.5], ["normal", "tnormal+"], [0.0, mu], [0.0, ratio * mu])
        l0, l1 = g.log_component_density(x, s).T
        ll = np.logaddexp(l0[None] + log_1m[:, None], l1[None] + log_pi[:, None]).sum(axis=1)
        best = max(best, float(ll.max()))
    return best


def _on_off(n, seed, s=1.0, on=0.3, mu=4.0):
    rng = np.random.default_rng(seed)
    s = np.broadcast_to(np.asarray(s, float), (n,))
    theta = np.where(rng.random(n) < on, rng.normal(mu, 0.1 * mu, n), 0.0)
    return theta + s * rng.standard_normal(n), np.array(s)


@pytest.mark.parametrize("case", ["on-off", "hetero", "sparse", "negative"])
def test_generalized_binary_reaches_the_brute_force_optimum(case):
    """ebfl's fit >= a dense grid over (pi, log mu) minus 1e-6 relative, and the
    estimate >= the fit at every fixed mode of the grid's coarse version."""
    if case == "on-off":
        x, s = _on_off(300, 1)
    elif case == "hetero":
        x, s = _on_off(300, 2, s=10 ** np.random.default_rng(2).uniform(-1, 0.5, 300))
    elif case == "sparse":
        x, s = _sparse(300, 3)
    else:
        x, s = _sparse(300, 4)
        x = -np.abs(x)
    res = fit(x, s, "generalized_binary", mode="estimate")
    mus = np.exp(np.linspace(math.log(1e-3), math.log(2 * max(x.max(), 1.0)), 600))
    brute = _gb_brute_force(x, s, 0.1, mus)
    assert res.log_likelihood >= brute - 1e-6 * abs(brute)
    assert res.diagnostics["converged"]
    for mu in mus[::60]:
        other = fit(x, s, "generalized_binary", mode=float(mu)).log_likelihood
        assert res.log_likelihood >= other - 1e-8 * abs(other)


def test_generalized_binary_recovers_on_off_effects():
    x, s = _on_off(4000, 5)
    res = ebfl.eb.ebnm_generalized_binary(x, s)
    p = res.fitted_g.parameters
    assert p["pi"] == pytest.approx(0.3, abs=0.03)
    assert p["mode"] == pytest.approx(4.0, abs=0.15)
    assert p["ratio"] == 0.1 and res.mode == p["mode"]
    # posterior means are near 0 or near mu; the probability of "off" is prob_zero
    post = res.posterior
    assert np.all((post.mean >= 0) & (post.mean <= 1.5 * p["mode"]))
    off = post.prob_zero > 0.5
    assert np.mean(off) == pytest.approx(0.7, abs=0.05)


def test_generalized_binary_mode_and_scale_arguments():
    x, s = _on_off(200, 6)
    zero = fit(x, s, "generalized_binary")  # mode 0 (the default) estimates it, as in R
    est = fit(x, s, "generalized_binary", mode="estimate")
    assert zero.log_likelihood == est.log_likelihood
    fixed = fit(x, s, "generalized_binary", mode=2.0, scale=0.3)
    assert fixed.fitted_g.parameters == pytest.approx({"pi": fixed.fitted_g.weights[1],
                                                       "mode": 2.0, "ratio": 0.3})
    with pytest.raises(ValueError, match="mode"):
        ebfl.ebnm(x, s, "generalized_binary", mode=-1.0)
    with pytest.raises(ValueError, match="scale"):
        ebfl.ebnm(x, s, "generalized_binary", scale=0.0)
    g = generalized_binary_prior(0.25, 3.0)
    assert g.cdf(0.0)[()] == pytest.approx(0.75) and g.cdf(100.0)[()] == pytest.approx(1.0)


# ================================================================== deconvolver

def test_spline_basis_is_orthonormal_and_natural():
    """Orthonormal, centred columns that with a constant span exactly the natural cubic
    splines on the 6 equally spaced knots (scipy's CubicSpline, bc_type='natural',
    through random values at the knots, lies in their span)."""
    from scipy.interpolate import CubicSpline

    t = np.linspace(-3, 5, 101)
    q = natural_spline_basis(t)
    np.testing.assert_allclose(q.T @ q, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(q.sum(axis=0), 0.0, atol=1e-10)
    basis = np.column_stack([np.ones(t.size), q])
    knots = np.linspace(-3, 5, 6)
    rng = np.random.default_rng(0)
    for _ in range(5):
        target = CubicSpline(knots, rng.normal(size=6), bc_type="natural")(t)
        coef, *_ = np.linalg.lstsq(basis, target, rcond=None)
        np.testing.assert_allclose(basis @ coef, target, atol=1e-10)


def _penalized(g_alpha, q, lik_x, s, grid):
    eta = q @ g_alpha
    pi = np.exp(eta - eta.max())
    pi /= pi.sum()
    ll = np.log(np.exp(-0.5 * ((lik_x[:, None] - grid) / s[:, None]) ** 2)
                / (math.sqrt(2 * math.pi) * s[:, None]) @ pi).sum()
    return ll - PENALTY * np.linalg.norm(g_alpha)


@pytest.mark.parametrize("s_kind", ["ones", "hetero", "small"])
def test_deconvolver_is_a_local_optimum_for_any_s(s_kind):
    """The fit's penalized log-likelihood (recomputed here) is at least that of 200
    random perturbations of its alpha (sizes 1e-3 to 1) and of the flat g; works for
    s far from 1 and heteroskedastic (R's ebnm requires s = 1)."""
    rng = np.random.default_rng(9)
    s = {"ones": np.ones(400), "hetero": 10 ** rng.uniform(-1, 1, 400),
         "small": np.full(400, 0.01)}[s_kind]
    x, _ = _sparse(400, 10, s)
    res = fit(x, s, "deconvolver")
    d = res.diagnostics
    assert d["converged"]
    grid = res.fitted_g.a
    q = natural_spline_basis(grid)
    alpha = np.array(d["alpha"])
    at_fit = _penalized(alpha, q, x, s, grid)
    assert at_fit == pytest.approx(d["penalized_log_likelihood"], rel=1e-9)
    assert at_fit >= _penalized(np.zeros(5), q, x, s, grid) - 1e-9 * abs(at_fit)
    for size in (1e-3, 1e-2, 1e-1, 1.0):
        for _ in range(50):
            other = _penalized(alpha + size * rng.standard_normal(5), q, x, s, grid)
            assert at_fit >= other - 1e-9 * abs(at_fit)
    assert np.all(res.fitted_g.weights > 0)  # smooth: no atom dropped


def test_deconvolver_fixed_spacing_and_flat_optimum():
    x, s = _sparse(300, 11)
    res = fit(x, s, "deconvolver", scale=0.5)
    assert np.allclose(np.diff(res.fitted_g.a), 0.5)
    # Two identical observations: the likelihood's slope at the flat g is within the
    # penalty, so the optimum is flat (alpha = 0 exactly) and converged.
    flat = fit(np.array([0.1, 0.1]), 1.0, "deconvolver")
    assert flat.diagnostics["converged"]
    assert flat.diagnostics["alpha"] == [0.0] * 5
    with pytest.raises(ValueError, match="scale"):
        ebfl.ebnm(x, s, "deconvolver", scale=1e-9)
