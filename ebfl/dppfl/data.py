"""Device data of DP-PFL: one linear model per device, rows of l2 norm at most 1.

All devices' training rows are stored back to back, CSR-style: ``X`` (n, d)
float64 C-contiguous, labels ``y`` (n,) in {-1, +1}, and device t's rows at
``offsets[t]:offsets[t + 1]``; optional test rows are stored the same way.
Every row has l2 norm <= 1, the assumption behind the sensitivity bounds
(Corollaries 2 and 3) of DP-PFL (Hu et al., IEEE IoT J. 2020).

:func:`har_sitting_devices` builds the paper's experiment: the 30 subjects of
the UCI smartphone recordings as devices, "sitting" against every other
activity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    check_bool,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_real_scalar,
    real_dtype_array,
)

__all__ = ["SITTING", "DeviceData", "har_sitting_devices", "l2_normalize"]

#: Largest row norm accepted: 1 plus room for the rounding of :func:`l2_normalize`.
NORM_TOLERANCE = 1e-9
#: The activity label of SITTING in UCI HAR and HAPT (``ebfl.datasets.ACTIVITIES``).
SITTING = 4


# --------------------------------------------------------------------------- helpers


def l2_normalize(X):
    """Rows of ``X`` scaled to unit l2 norm; an all-zero row stays zero.

    Each row is first divided by its largest ``|entry|``, so that squaring cannot
    overflow or underflow (``np.linalg.norm`` squares the raw values).

    Parameters
    ----------
    X : array_like, shape (n, d)
        Finite real numbers.

    Returns
    -------
    ndarray, shape (n, d)
        A new float64 C-contiguous array; ``X`` is not modified.

    Examples
    --------
    >>> l2_normalize([[3.0, 4.0], [0.0, 0.0], [1e300, 1e300]]).tolist()
    [[0.6, 0.8], [0.0, 0.0], [0.7071067811865475, 0.7071067811865475]]
    """
    X = _finite_2d(X, "X")
    peak = np.max(np.abs(X), axis=1, keepdims=True) if X.shape[1] else np.zeros((len(X), 1))
    peak[peak == 0.0] = 1.0  # all-zero rows stay zero
    scaled = X / peak
    norm = np.sqrt(np.einsum("ij,ij->i", scaled, scaled))[:, None]
    norm[norm == 0.0] = 1.0
    return np.ascontiguousarray(scaled / norm)


def _frozen(arr):
    """A read-only array (the caller passes a fresh copy)."""
    arr.setflags(write=False)
    return arr


def _finite_2d(X, name):
    X = check_finite_array(X, name, min_len=0)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, features), got shape {X.shape}")
    return X


def _check_matrix(X, name, d=None):
    """Finite reals of shape (n, d) with d >= 1 (the given d when there is one)."""
    X = _finite_2d(X, name)
    if d is not None and X.shape[1] != d:
        raise ValueError(f"{name} has {X.shape[1]} features (columns), expected {d}: every "
                         "device (training and test rows) needs the same number")
    if X.shape[1] == 0:
        raise ValueError(f"{name} must have at least one feature (column), got shape {X.shape}")
    return X


def _check_norms(X, name):
    """Every row of l2 norm <= 1 (+ tolerance); the message names the worst row."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    worst = int(np.argmax(norms))
    if not norms[worst] <= 1.0 + NORM_TOLERANCE:  # also catches an overflow to inf
        raise ValueError(f"{name} has a row of l2 norm {norms[worst]:.6g} > 1 (row {worst}): "
                         "DP-PFL needs every row's norm <= 1; normalize the rows with "
                         "ebfl.dppfl.l2_normalize")


def _check_rows(X, name, d=None):
    """One device's rows: non-empty, finite, (n_t, d), l2 norms <= 1."""
    X = _check_matrix(X, name, d)
    if X.shape[0] == 0:
        raise ValueError(f"{name} is empty: every device needs at least one row")
    _check_norms(X, name)
    return X


def _check_labels(y, name, n):
    """A device's labels: shape (n,), each exactly -1 or +1 (float64 copy)."""
    y = real_dtype_array(y, name)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) (one label per row), got {y.shape}")
    y = np.asarray(y, dtype=np.float64)
    bad = (y != 1.0) & (y != -1.0)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must hold labels -1 or +1 only, got {float(y[first])!r} at entry "
                         f"{first}")
    return y


def _check_offsets(offsets, name, n, m=None, rows="X"):
    """Offsets (m + 1,) of non-empty devices: 0 = o_0 < ... < o_m = n, the rows of ``rows``."""
    arr = real_dtype_array(offsets, name)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 entries (one device), got shape "
                         f"{arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if m is not None and arr.size != m + 1:
        raise ValueError(f"{name} must have {m + 1} entries (one more than the devices), got "
                         f"{arr.size}")
    if arr[0] != 0 or arr[-1] != n:
        raise ValueError(f"{name} must start at 0 and end at the number of rows {n}, got "
                         f"{arr[0]} and {arr[-1]} ({rows} has {n} rows)")
    if np.any(np.diff(arr) <= 0):
        t = int(np.flatnonzero(np.diff(arr) <= 0)[0])
        raise ValueError(f"{name} must increase strictly (every device needs at least one "
                         f"row); device {t} has {arr[t + 1] - arr[t]}")
    return arr.astype(np.int64)


def _check_device_norms(X, offsets, name):
    """Row norms device by device, so that a message names the device."""
    for t in range(offsets.size - 1):
        _check_norms(X[offsets[t]:offsets[t + 1]], f"{name} (device {t})")


def _gather(offsets, ids):
    """Row indices of devices ``ids`` in that order, and the offsets of the result."""
    sizes = np.diff(offsets)[ids]
    new = np.zeros(ids.size + 1, np.int64)
    np.cumsum(sizes, out=new[1:])
    rows = np.arange(new[-1]) + np.repeat(offsets[ids] - new[:-1], sizes)
    return rows, new


def _is_sequence(value):
    return isinstance(value, Sequence | np.ndarray) and not isinstance(value, str | bytes)


# --------------------------------------------------------------------------- the data


@dataclass(frozen=True, eq=False, repr=False)
class DeviceData:
    """Training (and optionally test) rows of m devices, stored back to back.

    Device t's training rows are ``X[offsets[t]:offsets[t + 1]]``, its labels
    ``y[offsets[t]:offsets[t + 1]]``; its test rows likewise with
    ``test_offsets``. The arrays are read-only copies: nothing passed in is
    modified, and nothing held can be. Build one with :meth:`from_lists`.

    Parameters
    ----------
    X : array_like, shape (n, d)
        Finite features, every row of l2 norm <= 1 (+1e-9 for rounding); see
        :func:`l2_normalize`.
    y : array_like, shape (n,)
        Labels, each -1 or +1.
    offsets : array_like of int, shape (m + 1,)
        0 = offsets[0] < offsets[1] < ... < offsets[m] = n: every device has
        at least one row.
    X_test, y_test, test_offsets : optional
        Test rows in the same layout (d columns, m devices, each non-empty);
        all three or none.
    users : array_like of int, shape (m,), optional
        Distinct device ids (e.g. subject numbers). Default ``0, ..., m - 1``.
    feature_names : sequence of str, optional
        d names of the columns.

    Examples
    --------
    >>> data = DeviceData.from_lists([[[0.6, 0.8], [1.0, 0.0]], [[0.0, -1.0]]],
    ...                              [[1, -1], [1]], users=[7, 9])
    >>> data.n_clients, data.n_features, data.sizes.tolist(), data.offsets.tolist()
    (2, 2, [2, 1], [0, 2, 3])
    >>> data.device(1)[0].tolist(), data.subset([1, 0]).users.tolist()
    ([[0.0, -1.0]], [9, 7])
    """

    X: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    test_offsets: np.ndarray | None = None
    users: np.ndarray | None = None
    feature_names: tuple | None = None

    def __post_init__(self):
        X = _check_matrix(self.X, "X")
        offsets = _check_offsets(self.offsets, "offsets", X.shape[0])
        m, d = offsets.size - 1, X.shape[1]
        y = _check_labels(self.y, "y", X.shape[0])
        _check_device_norms(X, offsets, "X")
        test = (self.X_test, self.y_test, self.test_offsets)
        if any(v is None for v in test) and any(v is not None for v in test):
            raise ValueError("X_test, y_test and test_offsets must be given together (or none)")
        if self.X_test is not None:
            X_test = _check_matrix(self.X_test, "X_test", d)
            test_offsets = _check_offsets(self.test_offsets, "test_offsets", X_test.shape[0], m,
                                          "X_test")
            y_test = _check_labels(self.y_test, "y_test", X_test.shape[0])
            _check_device_norms(X_test, test_offsets, "X_test")
            test = (_frozen(np.array(X_test, order="C")), _frozen(y_test.copy()),
                    _frozen(test_offsets))
        _set_fields(self, _frozen(np.array(X, order="C")), _frozen(y.copy()), _frozen(offsets),
                    *test, _users_iv(self.users, m), _feature_names_iv(self.feature_names, d))

    @classmethod
    def _trusted(cls, X, y, offsets, X_test=None, y_test=None, test_offsets=None, users=None,
                 feature_names=None):
        """An instance from arrays already checked (subsets and folds of a checked one)."""
        out = object.__new__(cls)
        _set_fields(out, *(None if a is None else _frozen(a) for a in
                           (X, y, offsets, X_test, y_test, test_offsets, users)), feature_names)
        return out

    @classmethod
    def from_lists(cls, xs, ys, xs_test=None, ys_test=None, *, users=None, feature_names=None):
        """Build from one array of rows and one of labels per device.

        Parameters
        ----------
        xs : sequence of array_like, each (n_t, d)
            Every device non-empty, the same d, finite, rows of l2 norm <= 1
            (+1e-9; else a ValueError naming the device suggests
            :func:`l2_normalize`).
        ys : sequence of array_like, each (n_t,)
            Labels -1 or +1.
        xs_test, ys_test : sequence of array_like, optional
            Test rows and labels of the same m devices (both or neither).
        users : array_like of int, shape (m,), optional
            Distinct device ids; default ``0, ..., m - 1``.
        feature_names : sequence of str, optional
            d column names.

        Returns
        -------
        DeviceData
            Holds copies: the inputs are never modified.

        Examples
        --------
        >>> data = DeviceData.from_lists([[[1.0, 0.0]], [[0.0, 1.0], [0.6, 0.8]]], [[1], [-1, 1]],
        ...                              [[[0.0, 1.0]], [[1.0, 0.0]]], [[-1], [1]])
        >>> data.test_sizes.tolist(), data.y.tolist()
        ([1, 1], [1.0, -1.0, 1.0])
        """
        X, y, offsets = _stack(xs, ys, "xs", "ys")
        test = (None, None, None)
        if (xs_test is None) != (ys_test is None):
            raise ValueError("xs_test and ys_test must be given together (or neither)")
        if xs_test is not None:
            m = offsets.size - 1
            if not _is_sequence(xs_test) or len(xs_test) != m:
                raise ValueError(f"xs_test must hold one array per device ({m}, as xs), got "
                                 f"{len(xs_test) if _is_sequence(xs_test) else xs_test!r}")
            test = _stack(xs_test, ys_test, "xs_test", "ys_test", X.shape[1])
        return cls(X, y, offsets, *test, users=users, feature_names=feature_names)

    # ----------------------------------------------------------------- shape

    @property
    def n_clients(self) -> int:
        """Number of devices m."""
        return self.offsets.size - 1

    @property
    def n_features(self) -> int:
        """Number of features d."""
        return self.X.shape[1]

    @property
    def sizes(self) -> np.ndarray:
        """Training rows per device n_t, shape (m,) int64."""
        return np.diff(self.offsets)

    @property
    def test_sizes(self) -> np.ndarray | None:
        """Test rows per device, shape (m,) int64; None without test data."""
        return None if self.test_offsets is None else np.diff(self.test_offsets)

    def __repr__(self):
        test = "" if self.X_test is None else f", n_test={self.X_test.shape[0]}"
        return (f"DeviceData(n_clients={self.n_clients}, n_features={self.n_features}, "
                f"n={self.X.shape[0]}{test})")

    # ----------------------------------------------------------------- access

    def _device_index(self, t):
        return check_int_scalar(t, "t", minimum=0, maximum=self.n_clients - 1)

    def device(self, t):
        """Device t's training rows and labels (read-only views), t in [0, m - 1]."""
        t = self._device_index(t)
        lo, hi = self.offsets[t], self.offsets[t + 1]
        return self.X[lo:hi], self.y[lo:hi]

    def test_device(self, t):
        """Device t's test rows and labels (read-only views); ValueError without test data."""
        t = self._device_index(t)
        if self.test_offsets is None:
            raise ValueError("this DeviceData holds no test data")
        lo, hi = self.test_offsets[t], self.test_offsets[t + 1]
        return self.X_test[lo:hi], self.y_test[lo:hi]

    def subset(self, ids):
        """The devices ``ids`` (positions 0..m-1, distinct), in that order.

        Parameters
        ----------
        ids : array_like of int
            At least one device.

        Returns
        -------
        DeviceData
            With their training and test rows, users and feature names (this
            object itself when ``ids`` is ``0, ..., m - 1``).
        """
        ids = self._ids_iv(ids)
        if ids.size == self.n_clients and np.array_equal(ids, np.arange(self.n_clients)):
            return self  # immutable: no copy needed (the runtimes ask for everyone each round)
        rows, offsets = _gather(self.offsets, ids)
        test = (None, None, None)
        if self.X_test is not None:
            test_rows, test_offsets = _gather(self.test_offsets, ids)
            test = (self.X_test[test_rows], self.y_test[test_rows], test_offsets)
        return DeviceData._trusted(self.X[rows], self.y[rows], offsets, *test,
                                   self.users[ids], self.feature_names)

    def _ids_iv(self, ids):
        m = self.n_clients
        arr = real_dtype_array(ids, "ids")
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"ids must be a non-empty 1-D sequence of device positions, got "
                             f"shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"ids must hold integers in [0, {m - 1}], got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
        if arr.min() < 0 or arr.max() >= m:
            raise ValueError(f"ids must lie in [0, {m - 1}], got {int(arr.min())}..."
                             f"{int(arr.max())}")
        if np.unique(arr).size != arr.size:
            raise ValueError("ids must not repeat a device")
        return arr

    def folds(self, k=5, seed=0):
        """Per-device k-fold splits of the training rows, for cross-validation.

        Each device's rows are permuted (one seeded generator, devices in
        order) and cut into k folds whose sizes differ by at most one; fold j
        validates on its rows and trains on the others, rows in their
        original order. Test data are not carried over.

        Parameters
        ----------
        k : int
            Number of folds, >= 2; every device needs at least k rows, so
            that each fold has a validation row and training rows on every
            device.
        seed : int
            Seed of the permutations, >= 0.

        Returns
        -------
        list of (DeviceData, DeviceData)
            k pairs (train, validation).

        Examples
        --------
        >>> data = DeviceData.from_lists([[[1.0]] * 5, [[-1.0]] * 3], [[1] * 5, [-1] * 3])
        >>> [(tr.sizes.tolist(), va.sizes.tolist()) for tr, va in data.folds(k=3)]
        [([3, 2], [2, 1]), ([3, 2], [2, 1]), ([4, 2], [1, 1])]
        """
        k = check_int_scalar(k, "k", minimum=2)
        seed = check_int_scalar(seed, "seed", minimum=0)
        sizes = self.sizes
        if sizes.min() < k:
            t = int(np.argmin(sizes))
            raise ValueError(f"k={k} folds need at least {k} rows on every device; device {t} "
                             f"(user {self.users[t]}) has {sizes[t]}")
        rng = np.random.default_rng(seed)
        fold_of = np.empty(self.X.shape[0], np.int64)  # fold of each training row
        for lo, n in zip(self.offsets[:-1], sizes, strict=True):
            parts = np.array_split(rng.permutation(n), k)
            for j, part in enumerate(parts):
                fold_of[lo + part] = j
        device_of = np.repeat(np.arange(self.n_clients), sizes)
        return [(self._rows_where(fold_of != j, device_of),
                 self._rows_where(fold_of == j, device_of)) for j in range(k)]

    def _rows_where(self, keep, device_of):
        """The training rows where ``keep`` holds (every device keeps some), no test data."""
        counts = np.bincount(device_of[keep], minlength=self.n_clients)
        offsets = np.zeros(self.n_clients + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return DeviceData._trusted(self.X[keep], self.y[keep], offsets, users=self.users,
                                   feature_names=self.feature_names)


def _set_fields(obj, X, y, offsets, X_test, y_test, test_offsets, users, feature_names):
    for name, value in (("X", X), ("y", y), ("offsets", offsets), ("X_test", X_test),
                        ("y_test", y_test), ("test_offsets", test_offsets), ("users", users),
                        ("feature_names", feature_names)):
        object.__setattr__(obj, name, value)


def _stack(xs, ys, xname, yname, d=None):
    """Check each device's rows and labels (named ``xs[t]``) and concatenate them."""
    if not _is_sequence(xs) or not _is_sequence(ys):
        raise TypeError(f"{xname} and {yname} must be sequences with one array per device, got "
                        f"{type(xs).__name__} and {type(ys).__name__}")
    if len(xs) == 0:
        raise ValueError(f"{xname} must hold at least one device")
    if len(xs) != len(ys):
        raise ValueError(f"{xname} and {yname} must have one entry per device each, got "
                         f"{len(xs)} and {len(ys)}")
    Xs, labels = [], []
    for t, (x, lab) in enumerate(zip(xs, ys, strict=True)):
        x = _check_rows(x, f"{xname}[{t}]", d)
        d = x.shape[1]
        Xs.append(x)
        labels.append(_check_labels(lab, f"{yname}[{t}]", x.shape[0]))
    offsets = np.zeros(len(Xs) + 1, np.int64)
    np.cumsum([x.shape[0] for x in Xs], out=offsets[1:])
    return np.concatenate(Xs), np.concatenate(labels), offsets


def _users_iv(users, m):
    if users is None:
        return _frozen(np.arange(m, dtype=np.int64))
    arr = real_dtype_array(users, "users")
    if arr.shape != (m,):
        raise ValueError(f"users must have shape ({m},) (one id per device), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"users must hold integer ids, got dtype {arr.dtype}")
    if np.unique(arr).size != m:
        raise ValueError("users must be distinct (one id per device)")
    return _frozen(arr.astype(np.int64))


def _feature_names_iv(names, d):
    if names is None:
        return None
    if not _is_sequence(names) or not all(isinstance(v, str) for v in names):
        raise TypeError("feature_names must be a sequence of str")
    if len(names) != d:
        raise ValueError(f"feature_names must have {d} entries (one per feature), got "
                         f"{len(names)}")
    return tuple(names)


# --------------------------------------------------------------------------- the HAR task


def har_sitting_devices(windows=None, *, seed=0, test_fraction=0.25, source="hapt",
                        intercept=True):
    """The experiment of DP-PFL (Hu et al., IEEE IoT J. 2020): "sitting" vs. the rest.

    Each of the 30 subjects is a device; a window is labelled +1 when its
    activity is SITTING (label 4) and -1 otherwise. Each subject's windows are
    split at random into training and test sets, as the paper does (75 % /
    25 %): ``floor((1 - test_fraction) * n_t)`` windows train, kept within
    [1, n_t - 1], and the others test; the split depends only on the
    subjects' window counts, ``seed`` and ``test_fraction``, not on
    ``source``. Windows overlap by 50 %, so a random split puts windows that
    share half their samples on both sides (neighbours leak into the test
    set); the paper's random split of UCI HAR's overlapping windows did the
    same. :func:`ebfl.datasets.split_first_run` gives a split without
    overlap.

    Features, by ``source``:

    * ``"hapt"``: the 72 time-domain features of
      :func:`ebfl.datasets.hapt_windows` computed from the HAPT recordings
      (the same subjects and sessions as UCI HAR), z-scored with the pooled
      training mean and sd (as :func:`ebfl.datasets.standardized_clients`
      does; a constant feature is centred, not scaled: its raw scales differ
      by orders of magnitude), then each row l2-normalized ("all data are
      normalized locally by l2-normalization" in the paper).
    * ``"uci_har"``: the 561 features of the UCI HAR release
      (:func:`ebfl.datasets.load_uci_har`, its training and test files
      pooled before the split), already scaled to [-1, 1] by its authors:
      each row l2-normalized, no z-scoring.

    With ``intercept`` a constant feature 1 is appended before the
    normalization, so that a linear model w^T x has an intercept. The paper
    does not mention one; without it, a model through the origin of
    z-scored features cannot shift its threshold, and one global linear SVM
    errs more often than the constant "not sitting" (about 0.17).

    Parameters
    ----------
    windows : pandas.DataFrame, optional
        Precomputed windows: the frame of :func:`ebfl.datasets.hapt_windows`
        (``source="hapt"``) or of :func:`ebfl.datasets.load_uci_har`
        (``source="uci_har"``). Default: computed from the data home (a few
        seconds for HAPT).
    seed : int
        Seed of the train/test split, >= 0.
    test_fraction : float
        In (0, 1).
    source : {"hapt", "uci_har"}
    intercept : bool
        Append the constant feature (named ``"intercept"``).

    Returns
    -------
    DeviceData
        Devices in increasing subject order, ``users`` the subject numbers,
        with test data and ``feature_names``.

    Raises
    ------
    FileNotFoundError
        ``windows`` not given and the data home lacks the recordings (the
        loader's message says where to get them).
    ValueError
        ``windows`` lacks a column, has a non-finite feature, a label outside
        1-6, or a subject with fewer than 2 windows.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> from ebfl.datasets import feature_names
    >>> rng = np.random.default_rng(0)
    >>> frame = pd.DataFrame(rng.normal(size=(40, 72)), columns=feature_names())
    >>> frame.insert(0, "label", np.tile([4, 1, 5, 6], 10))
    >>> frame.insert(0, "user", np.repeat([1, 2], 20))
    >>> data = har_sitting_devices(frame, intercept=False)
    >>> data.users.tolist(), data.sizes.tolist(), data.test_sizes.tolist()
    ([1, 2], [15, 15], [5, 5])
    >>> bool(np.allclose(np.linalg.norm(data.X, axis=1), 1.0))
    True
    """
    source = check_choice(source, "source", ("hapt", "uci_har"))
    intercept = check_bool(intercept, "intercept")
    seed = check_int_scalar(seed, "seed", minimum=0)
    test_fraction = check_real_scalar(test_fraction, "test_fraction", low=0.0, high=1.0,
                                      low_open=True, high_open=True)
    if windows is None:
        windows = _load_windows(source)
    columns = _feature_columns(windows, source)
    features = _finite_2d(windows[columns].to_numpy(np.float64), "windows' features")
    user = windows["user"].to_numpy()
    label = windows["label"].to_numpy()
    if not np.isin(label, np.arange(1, 7)).all():
        raise ValueError("windows' label must lie in 1-6 (the six activities), got "
                         f"{sorted(set(label[~np.isin(label, np.arange(1, 7))].tolist()))[:5]}")
    users = np.unique(user)
    train, test = _split_per_user(user, users, test_fraction, seed)
    if source == "hapt":
        features = _zscore(features, np.concatenate(train))
    if intercept:
        features = np.column_stack([features, np.ones(len(features))])
        columns = [*columns, "intercept"]
    X = l2_normalize(features)
    y = np.where(label == SITTING, 1.0, -1.0)
    return DeviceData.from_lists([X[r] for r in train], [y[r] for r in train],
                                 [X[r] for r in test], [y[r] for r in test],
                                 users=users.astype(np.int64), feature_names=columns)


def _load_windows(source):
    if source == "hapt":
        from ebfl.datasets import hapt_windows

        return hapt_windows()
    from ebfl.datasets import load_uci_har

    return load_uci_har()


#: Columns of the window tables that are not features.
_META = ("user", "experiment", "start", "label", "activity", "split")


def _feature_columns(windows, source):
    import pandas as pd

    if not isinstance(windows, pd.DataFrame):
        raise TypeError(f"windows must be a pandas DataFrame, got {type(windows).__name__}")
    if source == "hapt":
        from ebfl.datasets import feature_names

        columns = feature_names()
    else:
        columns = [c for c in windows.columns if c not in _META]
        if not columns:
            raise ValueError("windows has no feature columns")
    missing = [c for c in ("user", "label", *columns) if c not in windows.columns]
    if missing:
        raise ValueError(f"windows lacks the column(s) {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''} (source={source!r})")
    if not pd.api.types.is_integer_dtype(windows["user"]):
        raise TypeError(f"windows' user must hold integer subject ids, got dtype "
                        f"{windows['user'].dtype}")
    return columns


def _split_per_user(user, users, test_fraction, seed):
    """Row indices (in original order) of each user's random training and test windows."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for u in users:
        rows = np.flatnonzero(user == u)
        n = rows.size
        if n < 2:
            raise ValueError(f"subject {u} has {n} window(s): a train/test split needs at least 2")
        # 1e-9: (1 - 0.3) * 10 is 7.000000000000001, but other products fall just below
        n_train = min(max(math.floor((1.0 - test_fraction) * n + 1e-9), 1), n - 1)
        perm = rng.permutation(n)
        train.append(np.sort(rows[perm[:n_train]]))
        test.append(np.sort(rows[perm[n_train:]]))
    return train, test


def _zscore(features, train_rows):
    """Centre and scale by the pooled training mean and sd (ddof=1); sd 0 -> scale 1."""
    fit = features[train_rows]
    center = fit.mean(axis=0)
    scale = fit.std(axis=0, ddof=1) if len(train_rows) > 1 else np.zeros(features.shape[1])
    scale[scale == 0.0] = 1.0
    return (features - center) / scale
