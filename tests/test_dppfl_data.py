"""DP-PFL device data: layout, validation, subsets, folds, and the HAR "sitting" task."""

import numpy as np
import pandas as pd
import pytest

from ebfl.datasets import feature_names
from ebfl.dppfl.data import DeviceData, har_sitting_devices, l2_normalize
from tests.conftest import requires_data


def _devices(sizes=(5, 3, 4), d=3, seed=0):
    """Rows of norm <= 1 whose first entry is a unique id (row number / 1000)."""
    rng = np.random.default_rng(seed)
    xs, ys, start = [], [], 0
    for n in sizes:
        x = rng.uniform(-0.3, 0.3, size=(n, d))
        x[:, 0] = (start + np.arange(n)) / 1000.0
        xs.append(x)
        ys.append(np.where(rng.random(n) < 0.5, 1.0, -1.0))
        start += n
    return xs, ys


def _ids(X):
    return np.rint(X[:, 0] * 1000).astype(int).tolist()


# --------------------------------------------------------------------------- layout


def test_from_lists_concatenates_devices():
    xs, ys = _devices()
    xt, yt = _devices((2, 1, 3), seed=1)
    data = DeviceData.from_lists(xs, ys, xt, yt, users=[10, 20, 30],
                                 feature_names=["a", "b", "c"])
    assert data.n_clients == 3 and data.n_features == 3
    assert data.offsets.tolist() == [0, 5, 8, 12] and data.offsets.dtype == np.int64
    assert data.sizes.tolist() == [5, 3, 4] and data.test_sizes.tolist() == [2, 1, 3]
    assert data.X.dtype == np.float64 and data.X.flags.c_contiguous
    assert data.y.dtype == np.float64
    np.testing.assert_array_equal(data.X, np.concatenate(xs))
    np.testing.assert_array_equal(data.y_test, np.concatenate(yt))
    for t in range(3):
        X_t, y_t = data.device(t)
        np.testing.assert_array_equal(X_t, xs[t])
        np.testing.assert_array_equal(y_t, ys[t])
        np.testing.assert_array_equal(data.test_device(t)[0], xt[t])
    assert data.users.tolist() == [10, 20, 30] and data.feature_names == ("a", "b", "c")
    assert repr(data) == "DeviceData(n_clients=3, n_features=3, n=12, n_test=6)"


def test_defaults_and_integer_labels():
    data = DeviceData.from_lists([[[1.0]], [[-0.5], [0.0]]], [np.array([1]), [-1, True]])
    assert data.users.tolist() == [0, 1] and data.feature_names is None
    assert data.X_test is None and data.test_sizes is None
    assert data.y.tolist() == [1.0, -1.0, 1.0]
    with pytest.raises(ValueError, match="holds no test data"):
        data.test_device(0)


def test_inputs_are_copied_not_mutated_and_the_data_are_read_only():
    xs, ys = _devices()
    xs_before, ys_before = [x.copy() for x in xs], [y.copy() for y in ys]
    data = DeviceData.from_lists(xs, ys, xs, ys)
    for x, xb, y, yb in zip(xs, xs_before, ys, ys_before, strict=True):
        np.testing.assert_array_equal(x, xb)
        np.testing.assert_array_equal(y, yb)
    xs[0][0, 1] = 0.25  # changing an input afterwards does not reach the data
    assert data.X[0, 1] == xs_before[0][0, 1]
    for arr in (data.X, data.y, data.offsets, data.X_test, data.y_test, data.test_offsets,
                data.users, data.device(0)[0]):
        assert not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        data.X[0, 0] = 1.0
    # The direct constructor copies too.
    X = np.concatenate(xs_before)
    direct = DeviceData(X, np.concatenate(ys), [0, 5, 8, 12])
    X[0, 1] = 0.5
    assert direct.X[0, 1] == xs_before[0][0, 1] and X.flags.writeable


# --------------------------------------------------------------------------- validation

GOOD_X = [[[0.6, 0.8], [0.0, 0.5]], [[1.0, 0.0]]]
GOOD_Y = [[1, -1], [-1]]


@pytest.mark.parametrize("xs, ys, error, match", [
    ([], [], ValueError, "xs must hold at least one device"),
    ("ab", GOOD_Y, TypeError, "xs and ys must be sequences"),
    (GOOD_X, GOOD_Y[:1], ValueError, "one entry per device each, got 2 and 1"),
    ([GOOD_X[0], np.zeros((0, 2))], GOOD_Y, ValueError,
     r"xs\[1\] is empty: every device needs at least one row"),
    ([GOOD_X[0], [[0.1, 0.1, 0.1]]], GOOD_Y, ValueError,
     r"xs\[1\] has 3 features \(columns\), expected 2: every device"),
    ([GOOD_X[0], [[np.nan, 0.0]]], GOOD_Y, ValueError, r"xs\[1\] must be finite"),
    ([GOOD_X[0], [[1j, 0.0]]], GOOD_Y, TypeError, r"xs\[1\] must hold real numbers"),
    ([GOOD_X[0], [0.5, 0.5]], GOOD_Y, ValueError,
     r"xs\[1\] must be 2-D \(rows, features\), got shape \(2,\)"),
    ([GOOD_X[0], [[1.2, 0.9]]], GOOD_Y, ValueError,
     r"xs\[1\] has a row of l2 norm 1\.5 > 1 \(row 0\).*ebfl\.dppfl\.l2_normalize"),
    (GOOD_X, [[1, 0], [-1]], ValueError,
     r"ys\[0\] must hold labels -1 or \+1 only, got 0\.0 at entry 1"),
    (GOOD_X, [[1, -1], [2.0]], ValueError, r"ys\[1\] must hold labels -1 or \+1 only"),
    (GOOD_X, [[1, -1, 1], [-1]], ValueError, r"ys\[0\] must have shape \(2,\)"),
    (GOOD_X, [["a", "b"], [-1]], TypeError, r"ys\[0\] must be an array of real numbers"),
])
def test_from_lists_refuses_bad_devices(xs, ys, error, match):
    with pytest.raises(error, match=match):
        DeviceData.from_lists(xs, ys)


def test_row_norm_tolerance():
    DeviceData.from_lists([[[1.0 + 1e-10, 0.0]]], [[1]])
    with pytest.raises(ValueError, match=r"norm 1 > 1"):
        DeviceData.from_lists([[[1.0 + 1e-8, 0.0]]], [[1]])
    with pytest.raises(ValueError, match=r"norm inf > 1"):  # the square overflows
        DeviceData.from_lists([[[1e200, 0.0]]], [[1]])


@pytest.mark.parametrize("kwargs, error, match", [
    ({"xs_test": GOOD_X}, ValueError, "xs_test and ys_test must be given together"),
    ({"xs_test": GOOD_X[:1], "ys_test": GOOD_Y[:1]}, ValueError,
     r"xs_test must hold one array per device \(2, as xs\), got 1"),
    ({"xs_test": [[[0.0, 1.0]], [[0.0, 1.0, 0.0]]], "ys_test": [[1], [1]]}, ValueError,
     r"xs_test\[1\] has 3 features"),
    ({"xs_test": [[[0.0, 1.0]], [[0.0, 2.0]]], "ys_test": [[1], [1]]}, ValueError,
     r"xs_test\[1\] has a row of l2 norm 2 > 1"),
    ({"xs_test": [[[0.0, 1.0]], [[0.0, 1.0]]], "ys_test": [[1], [0]]}, ValueError,
     r"ys_test\[1\] must hold labels -1 or \+1"),
    ({"users": [1]}, ValueError, r"users must have shape \(2,\)"),
    ({"users": [1, 1]}, ValueError, "users must be distinct"),
    ({"users": [1.0, 2.0]}, TypeError, "users must hold integer ids"),
    ({"feature_names": ["a"]}, ValueError, "feature_names must have 2 entries"),
    ({"feature_names": ["a", 2]}, TypeError, "feature_names must be a sequence of str"),
])
def test_from_lists_refuses_bad_test_data_and_metadata(kwargs, error, match):
    with pytest.raises(error, match=match):
        DeviceData.from_lists(GOOD_X, GOOD_Y, **kwargs)


@pytest.mark.parametrize("offsets, error, match", [
    ([0, 2], ValueError, "must start at 0 and end at the number of rows 3, got 0 and 2"),
    ([1, 3], ValueError, "must start at 0"),
    ([0, 3, 3], ValueError, "must increase strictly .* device 1 has 0"),
    ([[0, 3]], ValueError, "offsets must be 1-D with at least 2 entries"),
    ([0.0, 3.0], TypeError, "offsets must hold integers"),
])
def test_constructor_refuses_bad_offsets(offsets, error, match):
    with pytest.raises(error, match=match):
        DeviceData(np.concatenate(GOOD_X), [1, -1, -1], offsets)


def test_constructor_names_the_device_with_a_long_row():
    X = np.array([[0.6, 0.8], [0.0, 0.5], [3.0, 4.0]])
    with pytest.raises(ValueError, match=r"X \(device 1\) has a row of l2 norm 5 > 1 \(row 0\)"):
        DeviceData(X, [1, -1, -1], [0, 2, 3])
    with pytest.raises(ValueError, match=r"X_test \(device 0\) has a row of l2 norm 5"):
        DeviceData(X[:2], [1, -1], [0, 1, 2], X[::-1], [1, 1, 1], [0, 1, 3])
    with pytest.raises(ValueError, match="test_offsets must have 3 entries"):
        DeviceData(X[:2], [1, -1], [0, 1, 2], X[:2], [1, 1], [0, 2])
    with pytest.raises(ValueError, match="given together"):
        DeviceData(X[:2], [1, -1], [0, 1, 2], X[:2])
    with pytest.raises(ValueError, match=r"y must have shape \(2,\)"):
        DeviceData(X[:2], [1, -1, 1], [0, 1, 2])


# --------------------------------------------------------------------------- l2_normalize


def test_l2_normalize():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 4)) * rng.lognormal(0.0, 3.0, size=(20, 1))
    X[5] = 0.0
    before = X.copy()
    out = l2_normalize(X)
    np.testing.assert_array_equal(X, before)
    norms = np.linalg.norm(out, axis=1)
    np.testing.assert_allclose(np.delete(norms, 5), 1.0, rtol=1e-15)
    np.testing.assert_array_equal(out[5], 0.0)
    ok = np.arange(20) != 5
    np.testing.assert_allclose(out[ok], X[ok] / np.linalg.norm(X[ok], axis=1, keepdims=True),
                               rtol=1e-14)
    assert out.flags.c_contiguous and out.dtype == np.float64
    # Entries whose squares overflow or underflow.
    np.testing.assert_allclose(l2_normalize([[1e200, -1e200], [3e-200, 4e-200]]),
                               [[2**-0.5, -(2**-0.5)], [0.6, 0.8]], rtol=1e-15)
    assert l2_normalize(np.zeros((0, 3))).shape == (0, 3)
    # Rows accepted by DeviceData.
    DeviceData.from_lists([out], [np.ones(20)])
    with pytest.raises(ValueError, match="X must be finite"):
        l2_normalize([[np.inf, 0.0]])
    with pytest.raises(ValueError, match=r"X must be 2-D \(rows, features\), got shape \(2,\)"):
        l2_normalize([1.0, 2.0])


# --------------------------------------------------------------------------- subset, folds


def test_subset_keeps_devices_in_the_given_order():
    xs, ys = _devices()
    xt, yt = _devices((2, 1, 3), seed=1)
    data = DeviceData.from_lists(xs, ys, xt, yt, users=[10, 20, 30],
                                 feature_names=list("abc"))
    sub = data.subset(np.array([2, 0]))
    assert sub.n_clients == 2 and sub.users.tolist() == [30, 10]
    assert sub.offsets.tolist() == [0, 4, 9] and sub.test_offsets.tolist() == [0, 3, 5]
    np.testing.assert_array_equal(sub.X, np.concatenate([xs[2], xs[0]]))
    np.testing.assert_array_equal(sub.y, np.concatenate([ys[2], ys[0]]))
    np.testing.assert_array_equal(sub.X_test, np.concatenate([xt[2], xt[0]]))
    np.testing.assert_array_equal(sub.y_test, np.concatenate([yt[2], yt[0]]))
    assert sub.feature_names == ("a", "b", "c") and not sub.X.flags.writeable
    np.testing.assert_array_equal(sub.subset([1]).X, xs[0])
    assert data.subset([0, 1, 2]) is data
    assert data.subset([1]).n_clients == 1


@pytest.mark.parametrize("ids, error, match", [
    ([], ValueError, "ids must be a non-empty 1-D sequence"),
    ([3], ValueError, r"ids must lie in \[0, 2\], got 3...3"),
    ([-1], ValueError, r"ids must lie in \[0, 2\]"),
    ([0, 0], ValueError, "ids must not repeat a device"),
    ([0.0], TypeError, "ids must hold integers"),
])
def test_subset_refuses_bad_ids(ids, error, match):
    data = DeviceData.from_lists(*_devices())
    with pytest.raises(error, match=match):
        data.subset(ids)


def test_device_index_is_checked():
    data = DeviceData.from_lists(*_devices())
    with pytest.raises(ValueError, match=r"t must be an integer in \[0, 2\], got 3"):
        data.device(3)
    with pytest.raises(TypeError, match="t must be an integer"):
        data.device(0.5)


def test_folds_partition_every_device():
    xs, ys = _devices((5, 7, 12))
    data = DeviceData.from_lists(xs, ys, xs, ys, users=[4, 5, 6])
    folds = data.folds(k=5, seed=1)
    assert len(folds) == 5
    held_out = [[] for _ in range(3)]
    for train, valid in folds:
        assert train.X_test is None and valid.X_test is None
        assert train.users.tolist() == valid.users.tolist() == [4, 5, 6]
        for t in range(3):
            all_ids = _ids(data.device(t)[0])
            tr, va = _ids(train.device(t)[0]), _ids(valid.device(t)[0])
            assert tr and va and set(tr).isdisjoint(va)
            assert sorted(tr + va) == all_ids
            assert tr == sorted(tr) and va == sorted(va)  # original order within a device
            held_out[t] += va
            # Labels travel with their rows.
            lookup = dict(zip(all_ids, data.device(t)[1].tolist(), strict=True))
            assert valid.device(t)[1].tolist() == [lookup[i] for i in va]
        # Fold sizes differ by at most one.
    for t, n in enumerate((5, 7, 12)):
        assert sorted(held_out[t]) == _ids(data.device(t)[0])  # each row validates once
        sizes = [valid.sizes[t] for _, valid in folds]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    # Seeded: the same seed gives the same folds, another seed others.
    again = data.folds(k=5, seed=1)
    other = data.folds(k=5, seed=2)
    assert all(np.array_equal(a.X, b.X) for (_, a), (_, b) in zip(folds, again, strict=True))
    assert not all(np.array_equal(a.X, b.X) for (_, a), (_, b) in zip(folds, other, strict=True))


def test_folds_refuse_small_devices_and_bad_arguments():
    data = DeviceData.from_lists(*_devices((5, 3, 4)), users=[7, 8, 9])
    assert len(data.folds(k=3)) == 3
    with pytest.raises(ValueError, match=r"k=4 folds need at least 4 rows on every device; "
                                         r"device 1 \(user 8\) has 3"):
        data.folds(k=4)
    with pytest.raises(ValueError, match="k must be an integer >= 2"):
        data.folds(k=1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        data.folds(seed=-1)


# --------------------------------------------------------------------------- the HAR task


def _windows(n_per_user=(40, 33, 27), seed=0):
    """A synthetic hapt_windows frame: random features, a constant one, labels 1-6."""
    rng = np.random.default_rng(seed)
    n = sum(n_per_user)
    frame = pd.DataFrame(rng.normal(size=(n, 72)) * rng.lognormal(0, 2, size=72),
                         columns=feature_names())
    frame["tBodyAcc-mean()-X"] = 3.0  # constant: centred, not scaled
    frame.insert(0, "activity", "")
    frame.insert(0, "label", rng.integers(1, 7, size=n))
    frame.insert(0, "user", np.repeat([3, 1, 2], n_per_user))  # not sorted by user
    return frame


def _source_rows(data, frame, columns):
    """Recover, for each output row of a "uci_har" split, the frame row it came from."""
    raw = frame[columns].to_numpy()
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    out = []
    for X in (data.X, data.X_test):
        match = np.argmin(((X[:, None, :] - unit[None, :, :]) ** 2).sum(axis=2), axis=1)
        np.testing.assert_allclose(X, unit[match], atol=1e-13)
        out.append(match)
    return out


def test_har_sitting_devices_on_a_synthetic_frame():
    frame = _windows()
    before = frame.copy()
    cols = feature_names()
    data = har_sitting_devices(frame, intercept=False)
    pd.testing.assert_frame_equal(frame, before)
    assert data.users.tolist() == [1, 2, 3] and data.n_features == 72
    assert data.feature_names == tuple(cols)
    # floor(0.75 n) windows train: 33 -> 24, 27 -> 20, 40 -> 30.
    assert data.sizes.tolist() == [24, 20, 30] and data.test_sizes.tolist() == [9, 7, 10]
    # The split does not depend on the features' treatment: recover it from the unscaled
    # variant ("uci_har" with the same columns only normalizes rows).
    plain = har_sitting_devices(frame.drop(columns="activity"), source="uci_har",
                                intercept=False)
    train_rows, test_rows = _source_rows(plain, frame, cols)
    assert sorted(train_rows.tolist() + test_rows.tolist()) == list(range(len(frame)))
    users = frame["user"].to_numpy()
    for t, u in enumerate((1, 2, 3)):
        assert set(users[train_rows[plain.offsets[t]:plain.offsets[t + 1]]]) == {u}
        assert set(users[test_rows[plain.test_offsets[t]:plain.test_offsets[t + 1]]]) == {u}
    # Naive reference of the "hapt" features: pandas z-scores with the pooled training
    # mean and sd (as standardized_clients), then each row divided by its norm.
    train = frame.iloc[train_rows][cols]
    z = (frame[cols] - train.mean()) / train.std().replace(0.0, 1.0)
    unit = z.to_numpy() / np.linalg.norm(z.to_numpy(), axis=1, keepdims=True)
    np.testing.assert_allclose(data.X, unit[train_rows], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(data.X_test, unit[test_rows], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(data.X[:, cols.index("tBodyAcc-mean()-X")], 0.0)
    # Labels: +1 exactly for SITTING (4).
    labels = frame["label"].to_numpy()
    np.testing.assert_array_equal(data.y, np.where(labels[train_rows] == 4, 1.0, -1.0))
    np.testing.assert_array_equal(data.y_test, np.where(labels[test_rows] == 4, 1.0, -1.0))
    # Seeded.
    same = har_sitting_devices(frame, intercept=False)
    np.testing.assert_array_equal(same.X, data.X)
    np.testing.assert_array_equal(same.X_test, data.X_test)
    other = har_sitting_devices(frame, seed=1, intercept=False)
    assert other.sizes.tolist() == data.sizes.tolist()
    assert not np.array_equal(other.X, data.X)
    half = har_sitting_devices(frame, test_fraction=0.5)
    assert half.sizes.tolist() == [16, 13, 20]


def test_har_sitting_devices_intercept_is_a_constant_feature_before_normalization():
    frame = _windows()
    plain = har_sitting_devices(frame, intercept=False)
    data = har_sitting_devices(frame)
    assert data.n_features == 73 and data.feature_names[-1] == "intercept"
    # the row [z, 1] / ||[z, 1]||: its last entry is 1 / sqrt(1 + ||z||^2) with z the plain
    # row's direction scaled back; the first 72 entries stay proportional to the plain row
    last = data.X[:, -1]
    np.testing.assert_allclose(np.linalg.norm(data.X, axis=1), 1.0, rtol=1e-14)
    assert np.all((last > 0) & (last < 1))
    np.testing.assert_allclose(data.X[:, :-1] / np.linalg.norm(data.X[:, :-1], axis=1,
                                                               keepdims=True), plain.X,
                               atol=1e-12)


def test_har_sitting_devices_small_users_keep_a_row_on_each_side():
    frame = _windows((2, 3, 2))
    data = har_sitting_devices(frame, test_fraction=0.99)
    assert data.sizes.tolist() == [1, 1, 1] and data.test_sizes.tolist() == [2, 1, 1]
    data = har_sitting_devices(frame, test_fraction=0.01)
    assert data.sizes.tolist() == [2, 1, 1] and data.test_sizes.tolist() == [1, 1, 1]


def test_har_sitting_devices_refuses_bad_input():
    frame = _windows()
    with pytest.raises(ValueError, match=r"source must be one of \['hapt', 'uci_har'\]"):
        har_sitting_devices(frame, source="har")
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"test_fraction must be a real number in \(0, 1\)"):
            har_sitting_devices(frame, test_fraction=bad)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        har_sitting_devices(frame, seed=-1)
    with pytest.raises(TypeError, match="windows must be a pandas DataFrame"):
        har_sitting_devices(frame.to_numpy())
    with pytest.raises(ValueError, match=r"windows lacks the column\(s\) \['tBodyGyro-"):
        har_sitting_devices(frame.drop(columns=["tBodyGyro-mean()-X"]))
    with pytest.raises(ValueError, match=r"windows lacks the column\(s\) \['label'\]"):
        har_sitting_devices(frame.drop(columns=["label"]))
    with pytest.raises(ValueError, match=r"label must lie in 1-6 .* got \[7\]"):
        har_sitting_devices(frame.assign(label=np.where(frame.index == 3, 7, frame.label)))
    with pytest.raises(ValueError, match="windows' features must be finite"):
        har_sitting_devices(frame.assign(**{"tBodyGyro-max()-Y": np.nan}))
    with pytest.raises(ValueError, match="subject 9 has 1 window"):
        har_sitting_devices(pd.concat([frame, frame.iloc[:1].assign(user=9)]))
    with pytest.raises(TypeError, match="user must hold integer subject ids"):
        har_sitting_devices(frame.assign(user=frame.user.astype(str)))
    with pytest.raises(ValueError, match="no feature columns"):
        har_sitting_devices(frame[["user", "label", "activity"]], source="uci_har")


@pytest.mark.parametrize("source", ["hapt", "uci_har"])
def test_har_sitting_devices_without_the_data(tmp_path, monkeypatch, source):
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="archive.ics.uci.edu"):
        har_sitting_devices(source=source)


# --------------------------------------------------------------------------- the real data

real = requires_data("uci-hapt-raw")


@pytest.fixture(scope="module")
def real_windows():
    from ebfl.datasets import hapt_windows

    return hapt_windows()


@real
def test_real_har_sitting_devices(real_windows):
    data = har_sitting_devices(real_windows)
    assert data.n_clients == 30 and data.n_features == 73
    assert data.users.tolist() == list(range(1, 31))
    np.testing.assert_allclose(np.linalg.norm(data.X, axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(data.X_test, axis=1), 1.0, rtol=1e-14)
    total = data.sizes + data.test_sizes
    assert total.sum() == len(real_windows)
    np.testing.assert_array_equal(data.sizes, np.floor(0.75 * total + 1e-9))
    # About 17 % of UCI HAR's windows are SITTING (1,777 of 10,299); every subject sat.
    sitting = np.r_[data.y, data.y_test] == 1
    assert 0.15 < sitting.mean() < 0.20
    assert all((data.device(t)[1] == 1).any() for t in range(30))
    assert all((data.test_device(t)[1] == 1).any() for t in range(30))
    again = har_sitting_devices(real_windows)
    np.testing.assert_array_equal(again.X, data.X)
    np.testing.assert_array_equal(again.y_test, data.y_test)
    assert len(data.folds(k=5)) == 5
