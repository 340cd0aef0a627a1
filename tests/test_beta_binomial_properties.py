"""The beta-binomial MLE against an independent brute-force optimum, on adversarial data.

The brute force knows nothing of the fit's parametrization, search box or
likelihood formula: a dense grid over (logit mean, log concentration) of the
textbook product-form log-likelihood (``tests/naive.py``), Nelder-Mead from the
best grid points, and the closed-form limits on the edges of the parameter
space (binomial limit alpha + beta -> inf, point masses at 0 and 1, mean -> 0 or 1).
"""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize, special, stats

from ebfl import beta_binomial_eb
from ebfl.eb import _beta_binomial_mle as bb
from tests import naive

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
#: log(alpha + beta) range of the brute-force grid; beyond, the limits take over.
GRID_T = np.linspace(-12.0, 12.0, 49)
GRID_U = np.linspace(np.log(1e-4), np.log(1e8), 37)


def _log_binomial(z, n):
    return float(np.sum(special.gammaln(n + 1) - special.gammaln(z + 1)
                        - special.gammaln(n - z + 1)))


def edge_limits(z, n):
    """Suprema of the likelihood on the edges of the parameter space (closed forms)."""
    p = z.sum() / n.sum()
    limits = {"binomial": float(np.sum(stats.binom.logpmf(z, n, p)))}
    ends = (z == 0) | (z == n)
    if np.all(ends):  # alpha, beta -> 0: mass at 0 and 1 (n = 0 trials make no claim)
        q = np.mean(z == n) if np.any(n > 0) else 0.5
        limits["point_masses"] = float(np.sum(np.where(z == n, np.log(q) if q > 0 else 0.0,
                                                       np.log1p(-q) if q < 1 else 0.0)))
    if z.sum() == 0 or z.sum() == n.sum():  # mean -> 0 or 1: every count certain
        limits["mean_edge"] = _log_binomial(z, n)
    return limits


def brute_force_sup(z, n):
    """Largest log-likelihood found by grid + Nelder-Mead, or on an edge (closed form)."""
    t, u = np.meshgrid(GRID_T, GRID_U, indexing="ij")
    s = np.exp(u)
    grid = naive.naive_beta_binomial_loglik(z, n, special.expit(t) * s, special.expit(-t) * s)

    def neg(v):
        v = np.clip(v, [-30.0, np.log(1e-8)], [30.0, np.log(1e12)])
        s = np.exp(v[1])
        return -float(naive.naive_beta_binomial_loglik(
            z, n, special.expit(v[0]) * s, special.expit(-v[0]) * s))

    best = float(grid.max())
    for flat in np.argsort(grid, axis=None)[-2:]:
        i, j = np.unravel_index(flat, grid.shape)
        res = optimize.minimize(neg, [GRID_T[i], GRID_U[j]], method="Nelder-Mead",
                                options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 4000})
        best = max(best, -res.fun)
    return max(best, *edge_limits(z, n).values())


def check_fit(z, n):
    """Fit, compare with the brute force, and check that the flags describe the state."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = beta_binomial_eb(z, n)
    d = res.diagnostics
    assert d["converged"], dict(d)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    g = res.prior
    scale = 1.0 + n.sum()
    # The reported log-likelihood is the naive one at the reported prior ...
    assert res.log_likelihood == pytest.approx(
        float(naive.naive_beta_binomial_loglik(z, n, g.alpha, g.beta)), rel=1e-12, abs=1e-11)
    # ... and at least the brute-force optimum.
    sup = brute_force_sup(z, n)
    assert res.log_likelihood >= sup - 1e-9 * scale, (res.log_likelihood, sup)
    # Flags: at_bound iff some edge is active, and each named edge is where the prior is.
    bounds = d["active_bounds"]
    assert d["at_bound"] == bool(bounds)
    s = g.alpha + g.beta
    assert ("concentration_upper" in bounds) == (s == pytest.approx(bb._CONCENTRATION_MAX))
    assert ("concentration_lower" in bounds) == (s == pytest.approx(bb._CONCENTRATION_MIN))
    assert ("mean_lower" in bounds) == (g.mean == pytest.approx(bb._MEAN_MIN, rel=1e-6))
    assert ("mean_upper" in bounds) == (1 - g.mean <= 1.01 * bb._MEAN_MIN)
    limits = edge_limits(z, n)
    if "concentration_upper" in bounds:  # no overdispersion: the binomial limit is reached
        assert res.log_likelihood == pytest.approx(limits["binomial"], abs=1e-9 * scale)
    if not bounds:  # an interior maximum beats every edge
        assert res.log_likelihood >= max(limits.values()) - 1e-9 * scale
    return res


def _rng(seed):
    return np.random.default_rng(seed)


@settings(PROPERTY, max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), n_tiny=st.integers(3, 12), n_big=st.integers(3, 12))
def test_issue_family_tiny_empty_clients_and_large_ones(seed, n_tiny, n_big):
    """Clients with 1-4 trials and no success, others with hundreds of trials and a
    concentrated prior (about 1 in 5 of these sent the former optimizer to the plateau)."""
    rng = _rng(seed)
    n = np.concatenate([rng.integers(1, 5, size=n_tiny), rng.integers(50, 400, size=n_big)])
    p = rng.beta(*rng.uniform(20, 200, size=2), size=n_big)
    z = np.concatenate([np.zeros(n_tiny, np.int64), rng.binomial(n[n_tiny:], p)])
    check_fit(z, n)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(3, 60), exact=st.booleans())
def test_near_binomial_data(seed, m, exact):
    """One common p (binomial) or counts rounded to n p (under-dispersed: sup at s = inf)."""
    rng = _rng(seed)
    n = rng.integers(2, 50, size=m)
    p = rng.uniform(0.05, 0.95)
    z = np.rint(n * p).astype(np.int64) if exact else rng.binomial(n, p)
    res = check_fit(z, n)
    pearson = np.sum((z - n * z.sum() / n.sum()) ** 2 / n)
    chance = np.sum(n * (z.sum() / n.sum()) * (1 - z.sum() / n.sum()))
    if exact and pearson < 0.5 * chance:  # clearly under-dispersed
        assert res.diagnostics["active_bounds"] == ("concentration_upper",)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(3, 50), flip=st.booleans(),
       n_nonzero=st.integers(0, 2))
def test_extreme_means(seed, m, flip, n_nonzero):
    """All zeros but one or two clients (or all ones but ...), and no success at all."""
    rng = _rng(seed)
    n = rng.integers(1, 30, size=m)
    n[0] = max(n[0], 2)  # the likelihood needs one client with two trials
    z = np.zeros(m, np.int64)
    idx = rng.choice(m, size=min(n_nonzero, m), replace=False)
    z[idx] = rng.integers(1, n[idx] + 1)
    res = check_fit(n - z if flip else z, n)
    if n_nonzero == 0:
        assert ("mean_upper" if flip else "mean_lower") in res.diagnostics["active_bounds"]


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(3, 60),
       shape=st.tuples(st.floats(0.02, 0.5), st.floats(0.02, 0.5)))
def test_heavy_overdispersion(seed, m, shape):
    """U-shaped priors: most counts are 0 or n (the fit may go to alpha, beta -> 0)."""
    rng = _rng(seed)
    n = rng.integers(2, 40, size=m)
    check_fit(rng.binomial(n, rng.beta(*shape, size=m)), n)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(3, 40))
def test_two_clusters(seed, m):
    """Success probabilities 0.1 or 0.9 (bimodal, far from any Beta)."""
    rng = _rng(seed)
    n = rng.integers(5, 80, size=m)
    check_fit(rng.binomial(n, np.where(rng.random(m) < 0.5, 0.1, 0.9)), n)
