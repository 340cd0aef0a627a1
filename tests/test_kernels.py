"""Every Numba kernel against its plain-numpy twin (tests/naive.py), to 1e-12."""

import numpy as np
import pytest

from ebfl._kernels import _bernoulli_counts, _client_mean_ssd
from ebfl.eb import _kernels
from tests import naive

SEEDS = [0, 1, 2]
RTOL = 1e-12


def _offsets(rng, m, max_n=12, min_n=1):
    counts = rng.integers(min_n, max_n + 1, size=m)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), counts


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float64])
def test_bernoulli_counts(seed, dtype):
    rng = np.random.default_rng(seed)
    offsets, _ = _offsets(rng, 50, min_n=0)
    values = rng.integers(0, 2, offsets[-1]).astype(dtype)
    if dtype == np.float64:
        values[::7] = np.nan
        values[3] = 0.5
    else:
        values[5] = 2
    got = _bernoulli_counts(values, offsets)
    want = naive.naive_bernoulli_counts(values, offsets)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("d", [1, 3])
def test_client_mean_ssd(seed, d):
    rng = np.random.default_rng(seed)
    offsets, _ = _offsets(rng, 40)
    values = 1e3 + rng.standard_normal((offsets[-1], d))  # large mean: checks the two-pass sum
    mean, ssd, nonfinite = _client_mean_ssd(values, offsets)
    want_mean, want_ssd = naive.naive_client_mean_ssd(values, offsets)
    np.testing.assert_allclose(mean, want_mean, rtol=RTOL)
    np.testing.assert_allclose(ssd, want_ssd, rtol=1e-9, atol=1e-12)
    assert not nonfinite.any()
    values[3, 0] = np.inf
    assert _client_mean_ssd(values, offsets)[2].sum() == 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", ["loo_printed", "loo_proof", "loo_corrected"])
def test_loo_beta_shrinkage(seed, variant):
    rng = np.random.default_rng(seed)
    m = 60
    n = rng.integers(2, 30, size=m)
    z = rng.binomial(n, rng.beta(2, 3, size=m))
    x = z / n
    code = {"loo_printed": 0, "loo_proof": 1, "loo_corrected": 2}[variant]
    total = x.sum()
    ssq = np.sum((x - x.mean()) ** 2)
    corr = np.sum(x * (1 - x) / (n - 1))
    got = _kernels._loo_beta_shrinkage(x, n, z, code, total, ssq, corr)
    want = naive.naive_loo_beta(x, n, z, variant)
    names = ("mu", "var", "a", "est", "post_var", "alpha", "beta")
    for name, g in zip(names, got[:7], strict=True):
        np.testing.assert_allclose(g, want[name], rtol=RTOL, atol=1e-15, err_msg=name)
    np.testing.assert_array_equal(got[7], want["clipped"])


def test_loo_beta_shrinkage_clips():
    # n = 1 makes every x_l 0 or 1: the printed variance exceeds mu(1-mu), so a > 1.
    x = np.array([0, 1, 1, 0, 1, 1, 0, 1], float)
    n = np.ones(8, np.int64)
    z = x.astype(np.int64)
    got = _kernels._loo_beta_shrinkage(x, n, z, 0, x.sum(), np.sum((x - x.mean()) ** 2), 0.0)
    want = naive.naive_loo_beta(x, n, z, "loo_printed")
    assert want["clipped"].all() and got[7].all()
    np.testing.assert_allclose(got[2], 1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_beta_posterior(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 40, size=100)
    z = rng.binomial(n, 0.3)
    got = _kernels._beta_posterior(z, n, 1.7, 4.2)
    want = naive.naive_beta_posterior(z, n, 1.7, 4.2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_trials_successes_table(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 25, size=500)
    z = rng.binomial(n, 0.6)
    np.testing.assert_array_equal(_kernels._trials_successes_table(z, n, 24),
                                  naive.naive_trials_successes_table(z, n, 24))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tau2", [0.0, 0.3, 5.0])
def test_normal_posterior(seed, tau2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((30, 4))
    s2 = rng.uniform(0.1, 2, size=30)
    mu = rng.standard_normal(4)
    got = _kernels._normal_posterior(x, s2, mu, tau2)
    want = naive.naive_normal_posterior(x, s2, mu, tau2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("d", [1, 3])
def test_discrete_posterior(seed, d):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(80, d)) * 3
    s2 = rng.uniform(0.2, 2.0, size=80)
    atoms = rng.normal(size=(5, d)) * 3
    log_prob = np.log(rng.dirichlet(np.ones(5)))
    got = _kernels._discrete_posterior(x, s2, atoms, log_prob)
    want = naive.naive_discrete_posterior(x, s2, atoms, log_prob)
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=1e-15)
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=1e-13)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-9, atol=1e-12)
