"""Every Numba kernel against its plain-numpy twin (tests/naive.py), to 1e-12."""

import numpy as np
import pytest

from ebfl._kernels import client_mean_ssd, count_bernoulli, count_bytes
from ebfl.eb import _kernels
from ebfl.eb.results import BetaPosterior
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
    got = count_bernoulli(values, offsets)
    want = naive.naive_bernoulli_counts(values, offsets)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def _byte_counts_of(values, offsets):
    """The word-at-a-time kernel on ``values`` (any 8-byte-aligned 1-byte array)."""
    ones = np.full(offsets.size - 1, -7, np.int64)
    trials = np.full(offsets.size - 1, -7, np.int32)
    words = values[:values.size - values.size % 8].view(np.uint64)
    n_bad = count_bytes(values.view(np.uint8), words, offsets, ones, trials)
    np.testing.assert_array_equal(trials, np.diff(offsets))
    return ones, n_bad


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_values", [0, 5, 8, 13, 64, 203])
def test_byte_counts(seed, n_values):
    # Clients of 0 to 20 bytes over a short array: within one word, across words,
    # ending in the tail shorter than a word, empty.
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, n_values + 1, size=rng.integers(1, 30)))
    offsets = np.concatenate([[0], cuts, [n_values]]).astype(np.int64)
    values = rng.integers(0, 2, n_values).astype(np.uint8)
    ones, n_bad = _byte_counts_of(values, offsets)
    want_ones, want_bad = naive.naive_bernoulli_counts(values, offsets)
    np.testing.assert_array_equal(ones, want_ones)
    assert n_bad == 0 == want_bad.sum()
    if n_values:
        for bad in (2, 255, 128):  # every byte other than 0 and 1 is seen, wherever it is
            spoilt = values.copy()
            spoilt[rng.integers(n_values)] = bad
            assert _byte_counts_of(spoilt, offsets)[1] == 1


def test_byte_counts_long_clients():
    # Clients of thousands of bytes: the byte lanes are summed every 255 words.
    rng = np.random.default_rng(3)
    values = (rng.random(20_011) < 0.97).astype(np.uint8)
    offsets = np.array([0, 3, 2044, 2045, 6133, 20_011], np.int64)
    ones, n_bad = _byte_counts_of(values, offsets)
    np.testing.assert_array_equal(ones, naive.naive_bernoulli_counts(values, offsets)[0])
    assert n_bad == 0


def test_byte_counts_bool_and_int8():
    offsets = np.array([0, 3, 11, 11, 20], np.int64)
    flags = np.arange(20) % 3 == 0
    np.testing.assert_array_equal(_byte_counts_of(flags, offsets)[0], [1, 3, 0, 3])
    signed = flags.astype(np.int8)
    signed[15] = -1
    assert _byte_counts_of(signed, offsets)[1] == 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("d", [1, 3])
def test_client_mean_ssd(seed, d):
    rng = np.random.default_rng(seed)
    offsets, _ = _offsets(rng, 40)
    values = 1e3 + rng.standard_normal((offsets[-1], d))  # large mean: checks the two-pass sum
    mean, ssd, nonfinite = client_mean_ssd(values, offsets)
    want_mean, want_ssd = naive.naive_client_mean_ssd(values, offsets)
    np.testing.assert_allclose(mean, want_mean, rtol=RTOL)
    np.testing.assert_allclose(ssd, want_ssd, rtol=1e-9, atol=1e-12)
    assert not nonfinite.any()
    values[3, 0] = np.inf
    assert client_mean_ssd(values, offsets)[2].sum() == 1


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
    mu, var, a, est, concentration, n_clipped, _ = _kernels._loo_beta_shrinkage(
        z, n, code, total, ssq, corr)
    want = naive.naive_loo_beta(x, n, z, variant)
    posterior = BetaPosterior(est, concentration)
    got = {"mu": mu, "var": var, "a": a, "est": est, "alpha": posterior.alpha,
           "beta": posterior.beta, "post_var": posterior.var}
    for name, g in got.items():
        np.testing.assert_allclose(g, want[name], rtol=RTOL, atol=1e-15, err_msg=name)
    assert n_clipped == want["clipped"].sum()


def test_loo_beta_shrinkage_clips():
    # n = 1 makes every x_l 0 or 1: the printed variance exceeds mu(1-mu), so a > 1.
    x = np.array([0, 1, 1, 0, 1, 1, 0, 1], float)
    n = np.ones(8, np.int64)
    z = x.astype(np.int64)
    got = _kernels._loo_beta_shrinkage(z, n, 0, x.sum(), np.sum((x - x.mean()) ** 2), 0.0)
    want = naive.naive_loo_beta(x, n, z, "loo_printed")
    assert want["clipped"].all() and got[5] == 8
    np.testing.assert_allclose(got[2], 1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_beta_posterior(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 40, size=100)
    z = rng.binomial(n, 0.3)
    mean, concentration, weight = _kernels._beta_posterior(z, n, 1.7, 4.2)
    want_alpha, want_beta, want_mean, want_var, want_weight = naive.naive_beta_posterior(
        z, n, 1.7, 4.2)
    posterior = BetaPosterior(mean, concentration)
    for g, w in [(posterior.alpha, want_alpha), (posterior.beta, want_beta), (mean, want_mean),
                 (weight, want_weight), (posterior.var, want_var)]:
        np.testing.assert_allclose(g, w, rtol=RTOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_chunks", [1, 3])
def test_trials_successes_table(seed, n_chunks):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 25, size=500)
    z = rng.binomial(n, 0.6)
    np.testing.assert_array_equal(_kernels._trials_successes_table(z, n, 24, n_chunks),
                                  naive.naive_trials_successes_table(z, n, 24))


@pytest.mark.parametrize("n_chunks", [1, 4])
def test_pair_checks(n_chunks):
    rng = np.random.default_rng(5)
    n = rng.integers(0, 30, size=301)
    z = rng.integers(0, 31, size=301)
    empty, exceed = np.flatnonzero(n == 0), np.flatnonzero(z > n)
    want = (n.max(), empty.size, empty[0], exceed.size, exceed[0])
    assert _kernels._pair_checks(z, n, n_chunks) == want
    n_ok = np.maximum(n, 1)
    assert _kernels._pair_checks(np.minimum(z, n_ok), n_ok, n_chunks) == (n.max(), 0, -1, 0, -1)


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


# --- Gaussian profile likelihood -------------------------------------------------------


def _variance_groups(rng, n_groups, d, scale, kind):
    """Groups at variances ~ scale: "clients" (unit weights, ss = 0: every client its own
    group), "pooled" (integer counts) or "weighted" (mixture responsibilities)."""
    s2 = scale * rng.uniform(0.5, 20.0, n_groups)
    if kind == "clients":
        count = np.ones(n_groups)
    elif kind == "pooled":
        count = rng.integers(1, 6, n_groups).astype(float)
    else:
        count = rng.uniform(0.05, 3.0, n_groups)
    xm = np.sqrt(scale) * rng.normal(1.0, 3.0, (n_groups, d))
    ss = np.zeros(n_groups) if kind == "clients" else scale * rng.uniform(0.0, 4.0, n_groups)
    ss[count == 1.0] = 0.0
    return count, s2, xm, ss


def _kernel_profile(t, count, s2, xm, ss, mean, restricted, with_values=True):
    known = mean is not None
    mu = mean if known else np.zeros(xm.shape[1])
    return _kernels._normal_profile(t, count, s2, xm, ss, float(s2.min()), float(count.sum()),
                                    mu, known, restricted, with_values)


def _assert_close_to_scale(got, want, scale, name):
    """|got - want| <= RTOL x (sum of |terms|): values and slopes may cancel to near 0."""
    err = np.abs(got - want)
    assert np.all(err <= RTOL * scale), f"{name}: max error / scale {np.max(err / scale):.3g}"


@pytest.mark.parametrize("n_groups", [1, 5, 2500])  # 2500: three blocks, the last partial
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("kind", ["clients", "pooled", "weighted"])
@pytest.mark.parametrize("scale", [1e-290, 1e-5, 1.0, 1e290])
@pytest.mark.parametrize("mean_known", [False, True])
@pytest.mark.parametrize("restricted", [False, True])
def test_normal_profile(n_groups, d, kind, scale, mean_known, restricted):
    rng = np.random.default_rng(n_groups + 10 * d)
    count, s2, xm, ss = _variance_groups(rng, n_groups, d, scale, kind)
    mean = np.sqrt(scale) * rng.normal(0.0, 2.0, d) if mean_known else None
    t = np.r_[0.0, np.geomspace(1e-3 * s2.min(), 1e3 * s2.max(), 15)]
    values, slopes = _kernel_profile(t, count, s2, xm, ss, mean, restricted)
    want_v, want_s, scale_v, scale_s = naive.naive_normal_profile(
        t, count, s2, xm, ss, mean=mean, restricted=restricted)
    _assert_close_to_scale(values, want_v, scale_v, "values")
    _assert_close_to_scale(slopes, want_s, scale_s, "slopes")
    no_values, same_slopes = _kernel_profile(t, count, s2, xm, ss, mean, restricted, False)
    assert np.isnan(no_values).all()
    np.testing.assert_array_equal(same_slopes, slopes)


def test_normal_profile_pooling_is_exact():
    """Clients pooled by equal s^2 give the profile of the clients themselves."""
    from ebfl.eb.gaussian import _group_by_variance

    rng = np.random.default_rng(7)
    m, d = 3000, 2
    s2 = rng.choice(rng.uniform(0.1, 5.0, 40), m)
    x2 = rng.normal(0.0, 2.0, (m, d)) + np.sqrt(s2)[:, None] * rng.standard_normal((m, d))
    weights = rng.uniform(0.1, 1.0, m)
    t = np.r_[0.0, np.geomspace(1e-3, 1e3, 25)]
    for w in (None, weights):
        groups = _group_by_variance(x2, s2, w)
        assert groups.s2.size == 40 and np.all(np.diff(groups.s2) > 0)
        pooled = _kernel_profile(t, groups.count, groups.s2, groups.mean, groups.ss, None, True)
        count = np.ones(m) if w is None else w
        clients = _kernel_profile(t, count, s2, x2, np.zeros(m), None, True)
        _, _, scale_v, scale_s = naive.naive_normal_profile(t, count, s2, x2, np.zeros(m),
                                                            restricted=True)
        _assert_close_to_scale(pooled[0], clients[0], scale_v, "values")
        _assert_close_to_scale(pooled[1], clients[1], scale_s, "slopes")
    # distinct s^2: every client its own group, no reordering
    distinct = _group_by_variance(x2, rng.uniform(0.1, 5.0, m))
    assert distinct.s2.size == m
    np.testing.assert_array_equal(distinct.mean, x2)
    assert not distinct.ss.any() and (distinct.count == 1.0).all()


def test_normal_profile_ignores_threads():
    """Threaded or not, on any number of threads: the same bits (fixed blocks, in order)."""
    numba = pytest.importorskip("numba")
    rng = np.random.default_rng(8)
    count, s2, xm, ss = _variance_groups(rng, 3000, 1, 1.0, "clients")
    t = np.geomspace(1e-3, 1e3, _kernels.PROFILE_PARALLEL_MIN // 3000 + 1)
    assert s2.size * t.size >= _kernels.PROFILE_PARALLEL_MIN > s2.size  # threads, then not
    together = _kernel_profile(t, count, s2, xm, ss, None, True)
    one_by_one = np.array([_kernel_profile(t[j:j + 1], count, s2, xm, ss, None, True)
                           for j in range(t.size)])[:, :, 0].T
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = _kernel_profile(t, count, s2, xm, ss, None, True)
    finally:
        numba.set_num_threads(before)
    for got in (one_by_one, single):
        for a, b in zip(got, together, strict=True):
            np.testing.assert_array_equal(a, b)
