"""Client partitions: disjointness, coverage, label skew, reproducibility, stratified splits."""

import numpy as np
import pytest

from ebfl.learning.partition import (
    dirichlet,
    natural,
    pathological,
    train_test_split_per_client,
)

SEED = 20240611


def _check_disjoint(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64 and np.unique(allidx).size == allidx.size
    assert allidx.size == 0 or (allidx.min() >= 0 and allidx.max() < n)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    return allidx


# ------------------------------------------------------------ pathological

def test_pathological_mnist_split():
    labels = np.repeat(np.arange(10), 600)
    rng = np.random.default_rng(SEED)
    labels = labels[rng.permutation(labels.size)]
    before = labels.copy()
    parts = pathological(labels, n_clients=50, classes_per_client=3, rng=SEED)
    np.testing.assert_array_equal(labels, before)  # input untouched
    assert len(parts) == 50
    assert _check_disjoint(parts, labels.size).size == labels.size  # every sample used
    holders = np.zeros(10, int)
    for p in parts:
        classes, counts = np.unique(labels[p], return_counts=True)
        assert classes.size == 3
        holders[classes] += 1
        np.testing.assert_array_equal(counts, 40)  # 600 samples / 15 holders
    np.testing.assert_array_equal(holders, 15)  # 50 * 3 / 10


@pytest.mark.parametrize("n_clients, k", [(7, 3), (13, 4), (3, 10), (2, 2)])
def test_pathological_uneven_classes(n_clients, k):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, 900) * 3 + 5  # classes 5, 8, ..., 32 of uneven sizes
    parts = pathological(labels, n_clients, k, rng=2)
    used = _check_disjoint(parts, labels.size)
    holders = {}
    for i, p in enumerate(parts):
        classes = np.unique(labels[p])
        assert classes.size == k
        for c in classes:
            holders.setdefault(c, []).append(i)
    n_holders = np.array([len(v) for v in holders.values()])
    lo, hi = divmod(n_clients * k, 10)[0], -(-n_clients * k // 10)
    assert n_holders.min() >= max(lo, 1) and n_holders.max() <= hi
    held = np.isin(labels, list(holders))
    assert used.size == held.sum()  # samples of held classes all used, others not
    for c, owners in holders.items():  # equal shards within each class
        sizes = [np.sum(labels[parts[i]] == c) for i in owners]
        assert max(sizes) - min(sizes) <= 1


def test_pathological_is_reproducible():
    labels = np.repeat(np.arange(10), 50)
    a = pathological(labels, 20, 3, rng=5)
    b = pathological(labels, 20, 3, rng=np.random.default_rng(5))
    c = pathological(labels, 20, 3, rng=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("args, error, match", [
    ((np.arange(5) % 3, 4, 4), ValueError, "classes_per_client must be <= the 3 classes"),
    ((np.arange(5) % 3, 0, 2), ValueError, r"n_clients must be an integer in \[1, 5\]"),
    ((np.arange(5) % 3, 6, 2), ValueError, r"n_clients must be an integer in \[1, 5\]"),
    ((np.arange(5) % 3, 2, 0), ValueError, "classes_per_client must be an integer >= 1"),
    ((np.arange(5) % 3, 2.5, 2), TypeError, "n_clients must be an integer"),
    ((np.array([0.0, 1.0]), 2, 1), TypeError, "labels must be integer class labels"),
    ((np.zeros((2, 2), int), 2, 1), ValueError, "labels must be 1-D"),
    ((np.array([], int), 2, 1), ValueError, "labels must not be empty"),
    ((np.array([0, 0, 0, 0, 1, 1, 1]), 4, 2), ValueError,
     "class 1 has 3 samples but would be shared by 4 clients"),
])
def test_pathological_errors(args, error, match):
    with pytest.raises(error, match=match):
        pathological(*args, rng=0)


# --------------------------------------------------------------- dirichlet

def test_dirichlet_covers_disjointly_and_respects_min_size():
    labels = np.repeat(np.arange(5), 200)
    parts = dirichlet(labels, 20, 0.3, min_size=15, rng=SEED)
    assert _check_disjoint(parts, labels.size).size == labels.size
    assert min(p.size for p in parts) >= 15
    again = dirichlet(labels, 20, 0.3, min_size=15, rng=SEED)
    other = dirichlet(labels, 20, 0.3, min_size=15, rng=SEED + 1)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(parts, other, strict=True))


def test_dirichlet_mean_class_proportions_are_uniform():
    n_classes, m = 10, 400
    labels = np.repeat(np.arange(n_classes), 2000)
    parts = dirichlet(labels, m, 0.5, min_size=1, rng=SEED)
    props = np.array([np.bincount(labels[p], minlength=n_classes) / p.size for p in parts])
    mean = props.mean(axis=0)
    se = props.std(axis=0, ddof=1) / np.sqrt(m)
    print("seed", SEED, "mean", mean.round(4), "se", se.round(4))
    assert np.all(np.abs(mean - 1 / n_classes) < 4 * se)


def test_dirichlet_skew_follows_alpha():
    labels = np.repeat(np.arange(10), 500)

    def top_share(alpha):
        parts = dirichlet(labels, 50, alpha, min_size=1, rng=SEED)
        return np.mean([np.bincount(labels[p]).max() / p.size for p in parts])

    assert top_share(0.05) > 0.7 and top_share(1000.0) < 0.2


@pytest.mark.parametrize("kwargs, error, match", [
    ({"alpha": 0.0}, ValueError, r"alpha must be a real number in \(0, 1e\+100\]"),
    ({"alpha": -1.0}, ValueError, r"alpha must be a real number in \(0, 1e\+100\]"),
    ({"alpha": float("nan")}, ValueError, r"alpha must be a real number in \(0, 1e\+100\]"),
    ({"alpha": 1e101}, ValueError, r"alpha must be a real number in \(0, 1e\+100\]"),
    ({"alpha": "1"}, TypeError, "alpha must be a real number"),
    ({"n_clients": 0}, ValueError, r"n_clients must be an integer in \[1, 1000\]"),
    ({"min_size": 101}, ValueError, "exceeds the 1000 samples"),
    ({"min_size": -1}, ValueError, "min_size must be an integer >= 0"),
    ({"alpha": 0.01, "n_clients": 50, "min_size": 19, "max_tries": 3}, ValueError,
     "no partition gave every client >= 19 samples in 3 draws"),
])
def test_dirichlet_errors(kwargs, error, match):
    labels = np.repeat(np.arange(4), 250)
    with pytest.raises(error, match=match):
        dirichlet(labels, **{"n_clients": 10, "alpha": 1.0, **kwargs}, rng=0)


# ----------------------------------------------------------------- natural

def test_natural_one_client_per_group_in_sorted_order():
    groups = np.array(["s3", "s1", "s3", "s2", "s1", "s1"])
    parts = natural(groups)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [3], [0, 2]]
    assert [np.unique(groups[p]).item() for p in parts] == ["s1", "s2", "s3"]
    ids = np.array([30, 2, 2, 7])
    assert [p.tolist() for p in natural(ids)] == [[1, 2], [3], [0]]
    for bad, match in (([], "non-empty 1-D"), (np.zeros((2, 2)), "non-empty 1-D"),
                       ([1.0, np.nan], "NaN")):
        with pytest.raises(ValueError, match=match):
            natural(bad)


# --------------------------------------------------- per-client train/test

def test_split_is_stratified_per_client():
    rng = np.random.default_rng(SEED)
    labels = rng.integers(0, 10, 3000)
    clients = dirichlet(labels, 30, 0.5, min_size=2, rng=SEED)
    clients.append(np.array([5, 17]))  # overlaps another client: allowed, split alone
    snapshot = [c.copy() for c in clients]
    for f in (0.1, 0.25, 0.5, 0.9):
        train, test = train_test_split_per_client(labels, clients, f, rng=SEED)
        for idx, tr, te in zip(clients, train, test, strict=True):
            assert np.intersect1d(tr, te).size == 0
            np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.sort(idx))
            n = idx.size
            t = min(max(int(np.floor(f * n + 0.5)), 1), n - 1)
            assert te.size == t and tr.size >= 1
            classes, counts = np.unique(labels[idx], return_counts=True)
            got = np.array([np.sum(labels[te] == c) for c in classes])
            assert np.all(np.abs(got - t * counts / n) < 1)  # the client's own mix
    assert all(np.array_equal(a, b) for a, b in zip(clients, snapshot, strict=True))


def test_split_small_clients_and_reproducibility():
    labels = np.array([0, 1, 1, 0, 2])
    train, test = train_test_split_per_client(labels, [[4], [0, 1], [2, 3]], 0.01, rng=0)
    assert [t.tolist() for t in train[:1]] == [[4]] and test[0].size == 0
    assert [t.size for t in test[1:]] == [1, 1]  # >= 1 test sample when n >= 2
    labels = np.arange(200) % 4
    clients = [np.arange(0, 100), np.arange(100, 200)]
    a = train_test_split_per_client(labels, clients, 0.3, rng=3)
    b = train_test_split_per_client(labels, clients, 0.3, rng=3)
    c = train_test_split_per_client(labels, clients, 0.3, rng=4)
    assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1], strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a[1], c[1], strict=True))


@pytest.mark.parametrize("clients, frac, error, match", [
    ([[0, 1]], 0.0, ValueError, r"test_fraction must lie in \(0, 1\)"),
    ([[0, 1]], 1.0, ValueError, r"test_fraction must lie in \(0, 1\)"),
    ([[0, 1]], -0.2, ValueError, r"test_fraction must lie in \(0, 1\)"),
    ([[0, 1]], "0.5", TypeError, "test_fraction must be a real number"),
    ([[0, 1], []], 0.5, ValueError, r"client_indices\[1\] must be a non-empty"),
    ([], 0.5, ValueError, "at least one client"),
    ([[0, 9]], 0.5, ValueError, r"client_indices\[0\] must lie in 0..3"),
    ([[0, 0, 1]], 0.5, ValueError, "repeated indices"),
    ([[0.0, 1.0]], 0.5, TypeError, "integer indices"),
    (np.array([0, 1]), 0.5, TypeError, "sequence of index arrays"),
])
def test_split_errors(clients, frac, error, match):
    with pytest.raises(error, match=match):
        train_test_split_per_client(np.array([0, 1, 0, 1]), clients, frac, rng=0)
