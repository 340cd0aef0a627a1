"""PerAda's partition: least samples + capped Dirichlet shares, and the test split like train."""

from fractions import Fraction

import numpy as np
import pytest

from ebfl.learning.partition import dirichlet_least_samples, split_like_train

SEED = 20240612


def _check_disjoint_cover(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))  # each index exactly once


def _counts(labels, parts, n_classes):
    """(clients, classes) sample counts."""
    return np.stack([np.bincount(labels[p], minlength=n_classes) for p in parts])


def _mnist_like_labels(n, rng):
    freqs = np.array([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949], float)
    return rng.choice(10, size=n, p=freqs / freqs.sum())


# ------------------------------------------------------------------ dirichlet_least_samples

@pytest.mark.parametrize("n_clients, alpha, least", [(20, 0.1, 2), (7, 0.5, 1), (3, 10.0, 0),
                                                      (1, 0.1, 2)])
def test_least_samples_partition_is_disjoint_covering_and_has_the_least_samples(
        n_clients, alpha, least):
    rng = np.random.default_rng(SEED)
    labels = _mnist_like_labels(3000, rng)
    before = labels.copy()
    parts = dirichlet_least_samples(labels, n_clients, alpha, least_per_class=least, rng=1)
    np.testing.assert_array_equal(labels, before)  # input untouched
    assert len(parts) == n_clients
    _check_disjoint_cover(parts, labels.size)
    assert _counts(labels, parts, 10).min() >= least


def _step2_counts(labels, parts, least):
    return _counts(labels, parts, 10) - least


@pytest.mark.parametrize("alpha", [0.05, 0.1, 1.0])
@pytest.mark.parametrize("cap_factor", [None, 1.0, 1.3])
def test_a_client_gets_class_k_in_the_dirichlet_stage_only_while_below_the_cap(alpha,
                                                                              cap_factor):
    rng = np.random.default_rng(SEED + 1)
    labels = _mnist_like_labels(4000, rng)
    m, least = 20, 2
    pool = labels.size - m * least * 10
    cap = None if cap_factor is None else cap_factor * pool / m
    parts = dirichlet_least_samples(labels, m, alpha, least_per_class=least, cap=cap, rng=3)
    step2 = _step2_counts(labels, parts, least)  # classes are dealt in sorted order
    before = np.cumsum(step2, axis=1) - step2  # step-2 samples held before each class
    limit = labels.size / m if cap is None else cap
    assert np.all(before[step2 > 0] < limit)
    # hence each client's step-2 count is below the cap plus its last chunk
    last = np.array([row[np.flatnonzero(row)[-1]] if row.any() else 0 for row in step2])
    assert np.all(step2.sum(axis=1) - last < limit)


def test_the_cap_binds_with_small_alpha():
    # without a cap Dir(0.05) piles whole classes onto single clients; the cap then
    # stops them, so the largest client is far smaller than with no cap
    labels = np.repeat(np.arange(10), 400)
    capped = dirichlet_least_samples(labels, 10, 0.05, least_per_class=0, rng=4)
    free = dirichlet_least_samples(labels, 10, 0.05, least_per_class=0, cap=np.inf, rng=4)
    big_capped = max(p.size for p in capped)
    big_free = max(p.size for p in free)
    assert big_capped < big_free
    step2 = _counts(labels, capped, 10)
    before = np.cumsum(step2, axis=1) - step2
    assert np.any((before >= 400) & (step2 == 0))  # some share was zeroed by the cap


def _naive_reference(labels, m, alpha, least, cap, seed):
    """The same rules written as plain loops, consuming the generator in the same order:
    every class's permutation first, then one Dirichlet draw per class."""
    rng = np.random.default_rng(seed)
    classes = sorted(set(labels.tolist()))
    perms = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    parts = [[] for _ in range(m)]
    held = [0] * m
    for c in classes:
        for j in range(m):
            parts[j] += perms[c][j * least:(j + 1) * least].tolist()
    for c in classes:
        rest = perms[c][m * least:]
        p = rng.dirichlet([alpha] * m)
        p = [p[j] if held[j] < cap else 0.0 for j in range(m)]
        total = sum(p)
        cum, start = 0.0, 0
        for j in range(m):
            cum += p[j]
            stop = int(np.floor(cum / total * len(rest))) if j < m - 1 else len(rest)
            stop = max(stop, start)
            parts[j] += rest[start:stop].tolist()
            held[j] += stop - start
            start = stop
    return [np.sort(np.array(p, np.int64)) for p in parts]


@pytest.mark.parametrize("m, alpha, least", [(20, 0.1, 2), (6, 0.7, 1), (4, 3.0, 0)])
def test_least_samples_matches_a_naive_loop(m, alpha, least):
    labels = _mnist_like_labels(2500, np.random.default_rng(SEED + 2))
    got = dirichlet_least_samples(labels, m, alpha, least_per_class=least, rng=7)
    want = _naive_reference(labels, m, alpha, least, labels.size / m, 7)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_least_samples_is_seeded():
    labels = np.repeat(np.arange(5), 60)
    a = dirichlet_least_samples(labels, 6, 0.3, rng=11)
    b = dirichlet_least_samples(labels, 6, 0.3, rng=np.random.default_rng(11))
    c = dirichlet_least_samples(labels, 6, 0.3, rng=12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_shares_that_underflow_to_zero_still_give_a_valid_partition():
    labels = np.repeat(np.arange(6), 50)
    parts = dirichlet_least_samples(labels, 8, 1e-300, least_per_class=1, rng=0)
    _check_disjoint_cover(parts, labels.size)
    step2 = _step2_counts(labels, parts, 1)[:, :6]
    before = np.cumsum(step2, axis=1) - step2
    assert np.all(before[step2 > 0] < labels.size / 8)
    # Dir(1e-300) draws are one-hot: a class spread over several clients was split evenly
    # among the open clients because its one share fell on a capped client
    spread = (step2 > 0).sum(axis=0)
    assert spread.max() > 1 and set(spread.tolist()) - {1}


def test_least_samples_rejects_bad_input():
    labels = np.repeat(np.arange(3), 10)
    with pytest.raises(ValueError, match=r"class 0 has 10 samples, fewer than n_clients \* "
                                         r"least_per_class = 12"):
        dirichlet_least_samples(labels, 6, 0.1)
    with pytest.raises(ValueError, match=r"alpha must be a real number in \(0, 1e\+100\]"):
        dirichlet_least_samples(labels, 2, 0.0)
    with pytest.raises(ValueError, match=r"cap must be >= 9 \(the 18 samples"):
        dirichlet_least_samples(labels, 2, 0.1, cap=8.5)
    with pytest.raises(ValueError, match="least_per_class must be an integer"):
        dirichlet_least_samples(labels, 2, 0.1, least_per_class=-1)
    with pytest.raises(ValueError, match="n_clients must be an integer"):
        dirichlet_least_samples(labels, 0, 0.1)
    with pytest.raises(TypeError, match="labels must be integer class labels"):
        dirichlet_least_samples(labels.astype(float), 2, 0.1)
    with pytest.raises(TypeError, match="cap must be a real number"):
        dirichlet_least_samples(labels, 2, 0.1, cap="10")


# ------------------------------------------------------------------ split_like_train

def _check_hamilton(test_counts, train_counts):
    """Per class: floor or ceil of the quota t_k n_jk / N_k, summing to t_k, and a client
    rounded down never has a larger remainder than one rounded up (exact fractions)."""
    t = test_counts.sum(axis=0)
    n = train_counts.sum(axis=0)
    for k in range(t.size):
        quota = [Fraction(int(t[k]) * int(a), int(n[k])) for a in train_counts[:, k]]
        got = test_counts[:, k]
        assert got.sum() == t[k]
        floors = [q.numerator // q.denominator for q in quota]
        up = got - np.array(floors)
        assert set(up.tolist()) <= {0, 1}
        rem_up = [quota[j] - floors[j] for j in np.flatnonzero(up == 1)]
        rem_down = [quota[j] - floors[j] for j in np.flatnonzero(up == 0)]
        if rem_up and rem_down:
            assert min(rem_up) >= max(rem_down)
        assert np.all(got[train_counts[:, k] == 0] == 0)


def test_split_like_train_covers_the_test_set_with_largest_remainders():
    rng = np.random.default_rng(SEED + 3)
    train = _mnist_like_labels(6000, rng)
    test = _mnist_like_labels(1000, rng)
    parts = dirichlet_least_samples(train, 20, 0.1, rng=5)
    before = test.copy()
    local = split_like_train(test, parts, train, rng=6)
    np.testing.assert_array_equal(test, before)
    _check_disjoint_cover(local, test.size)
    _check_hamilton(_counts(test, local, 10), _counts(train, parts, 10))


def test_split_like_train_follows_the_train_class_proportions():
    # equal test/train ratio r = 1/5 in every class: each client's test count of class k
    # is r times its training count to within one sample
    train = np.repeat(np.arange(10), 500)
    test = np.repeat(np.arange(10), 100)
    parts = dirichlet_least_samples(train, 20, 0.1, rng=8)
    local = split_like_train(test, parts, train, rng=9)
    tr, te = _counts(train, parts, 10), _counts(test, local, 10)
    assert np.all(np.abs(te - tr / 5) < 1)
    # so the label distributions agree: total variation within (classes / 2) / n_test_j
    p_tr = tr / tr.sum(axis=1, keepdims=True)
    p_te = te / te.sum(axis=1, keepdims=True)
    tv = 0.5 * np.abs(p_tr - p_te).sum(axis=1)
    assert np.all(tv <= 0.5 * 10 / te.sum(axis=1) + 1 / tr.sum(axis=1) * 10)
    # a shuffled assignment of the same sizes would not follow them
    shuffled = np.random.default_rng(0).permutation(test)
    te_bad = _counts(shuffled, local, 10)
    assert np.abs(te_bad - tr / 5).max() > 5


def test_split_like_train_is_seeded_and_random_within_a_class():
    train = np.repeat(np.arange(3), 40)
    test = np.repeat(np.arange(3), 30)
    parts = [np.arange(0, 120, 2), np.arange(1, 120, 2)]
    a = split_like_train(test, parts, train, rng=1)
    b = split_like_train(test, parts, train, rng=1)
    c = split_like_train(test, parts, train, rng=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    assert [x.size for x in a] == [x.size for x in c] == [45, 45]


def test_split_like_train_rejects_bad_input():
    train = np.array([0, 0, 1, 1])
    parts = [np.array([0, 2]), np.array([1, 3])]
    with pytest.raises(ValueError, match="test_labels has class 2, which no client's"):
        split_like_train(np.array([0, 1, 2]), parts, train)
    with pytest.raises(ValueError, match=r"train_parts\[1\] must lie in 0..3"):
        split_like_train(np.array([0, 1]), [np.array([0]), np.array([4])], train)
    with pytest.raises(TypeError, match="labels must be integer class labels"):
        split_like_train(np.array([0.5]), parts, train)
    with pytest.raises(TypeError, match="one per client"):
        split_like_train(np.array([0, 1]), np.array([0, 1]), train)
