"""Property tests (hypothesis): shrinkage lies between local and prior, and grows with n."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ebfl import BetaPrior, beta_binomial_eb, gaussian_eb
from ebfl import bounds as B
from ebfl.eb.beta_binomial import METHODS

positive = st.floats(0.05, 50.0, allow_nan=False, allow_infinity=False)
# 0 or a normal-sized sd: below 1e-100 the functions refuse a standard deviation
# (its square would be subnormal), which tests/test_bad_input.py covers.
sd_or_zero = st.one_of(st.just(0.0), st.floats(1e-100, 10.0))


@st.composite
def binomial_clients(draw, min_clients=3, min_trials=2):
    m = draw(st.integers(min_clients, 30))
    n = np.array(draw(st.lists(st.integers(min_trials, 60), min_size=m, max_size=m)))
    frac = np.array(draw(st.lists(st.floats(0, 1), min_size=m, max_size=m)))
    return np.floor(frac * n).astype(np.int64), n


def _between(value, a, b, tol=1e-12):
    return np.all((np.minimum(a, b) - tol <= value) & (value <= np.maximum(a, b) + tol))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(binomial_clients(), positive, positive)
def test_known_prior_mean_between_local_and_prior(counts, alpha, beta):
    z, n = counts
    res = beta_binomial_eb(z, n, prior=BetaPrior(alpha, beta), fix_prior=True)
    assert _between(res.posterior.mean, z / n, alpha / (alpha + beta))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(binomial_clients(), st.sampled_from(METHODS))
def test_fitted_mean_between_local_and_centre(counts, method):
    z, n = counts
    try:
        res = beta_binomial_eb(z, n, method=method)
    except ValueError as exc:  # moments without a proper Beta: a documented refusal
        assert method == "moments" and "no proper Beta" in str(exc)
        return
    assert np.all((res.shrinkage >= 0) & (res.shrinkage <= 1))
    assert _between(res.posterior.mean, z / n, res.centre)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=40), st.floats(0.01, 10.0),
       sd_or_zero, st.floats(-100, 100))
def test_gaussian_mean_between_local_and_prior(x, s, sd, mu):
    x = np.array(x)
    res = gaussian_eb(x, s, prior_mean=mu, prior_sd=sd)
    assert _between(res.posterior.mean, x, mu, tol=1e-9)
    fitted = gaussian_eb(x, s)
    assert _between(fitted.posterior.mean, x, fitted.prior.mean, tol=1e-9)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(positive, positive, st.integers(1, 500))
def test_beta_weight_increases_with_n(alpha, beta, n):
    trials = np.array([n, n + 1, 2 * n + 5])
    res = beta_binomial_eb(np.zeros(3, int), trials, prior=BetaPrior(alpha, beta), fix_prior=True)
    assert np.all(np.diff(res.shrinkage) > 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(2, 10_000), st.integers(1, 500), st.floats(1e-3, 10), st.floats(1e-3, 10),
       sd_or_zero)
def test_gaussian_weight_increases_with_n(m, n, sigma_theta, sigma_x, sigma_q):
    a1 = B.gaussian_weight(m, n, sigma_theta, sigma_x, sigma_q)
    a2 = B.gaussian_weight(m, n + 1, sigma_theta, sigma_x, sigma_q)
    assert a2 >= a1 and 0 < a1 < 1
    s = sigma_x / np.sqrt([n, n + 1])
    res = gaussian_eb(np.zeros(2), s, prior_mean=0.0, prior_sd=sigma_theta)
    assert res.shrinkage[1] >= res.shrinkage[0]
