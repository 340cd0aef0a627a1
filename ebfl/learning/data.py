"""Client datasets for federated regression, stacked along a leading client axis.

Clients may hold different numbers of samples; rows are padded to the largest
count and a 0/1 ``mask`` marks the real ones, so every per-client computation is
one vectorized numpy expression over all clients (no Python loop over clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_counts, check_finite_array, check_real_scalar

#: Largest |entry| of X and Y: products and squares of two entries stay finite.
MAX_ABS = 1e150

__all__ = ["RegressionData"]


@dataclass(frozen=True)
class RegressionData:
    """Design matrices and responses of m clients.

    Attributes
    ----------
    X : ndarray of shape (m, n_max, d)
        Padded rows are 0; every ``|entry| <= 1e150``.
    Y : ndarray of shape (m, n_max)
        Padded entries are 0; every ``|entry| <= 1e150``.
    mask : ndarray of float, shape (m, n_max)
        1 for real samples, 0 for padding.
    """

    X: np.ndarray
    Y: np.ndarray
    mask: np.ndarray

    def __post_init__(self):
        X = check_finite_array(self.X, "X", ndim=3, max_abs=MAX_ABS)
        Y = check_finite_array(self.Y, "Y", ndim=2, max_abs=MAX_ABS)
        mask = check_finite_array(self.mask, "mask", ndim=2)
        if Y.shape != X.shape[:2] or mask.shape != Y.shape:
            raise ValueError(f"X (m, n, d), Y (m, n) and mask (m, n) disagree: {X.shape}, "
                             f"{Y.shape}, {mask.shape}")
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError("mask must hold only 0 and 1")
        if np.any(mask.sum(axis=1) == 0):
            raise ValueError(f"every client needs at least one sample; empty clients: "
                             f"{np.flatnonzero(mask.sum(axis=1) == 0)[:10].tolist()}")
        X = X * mask[..., None]
        Y = Y * mask
        for name, arr in (("X", X), ("Y", Y), ("mask", mask)):
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @classmethod
    def from_arrays(cls, X, Y):
        """All clients with the same n: X (m, n, d), Y (m, n)."""
        Y = check_finite_array(Y, "Y", ndim=2, max_abs=MAX_ABS)
        return cls(X, Y, np.ones(Y.shape))

    @classmethod
    def from_lists(cls, Xs, Ys):
        """Clients of different sizes: lists of (n_i, d) and (n_i,) arrays."""
        Xs, Ys = _client_list(Xs, "Xs"), _client_list(Ys, "Ys")
        if len(Xs) != len(Ys):
            raise ValueError(f"Xs and Ys must have one entry per client, got {len(Xs)} and "
                             f"{len(Ys)}")
        Xs = [check_finite_array(x, f"Xs[{i}]", ndim=2, max_abs=MAX_ABS)
              for i, x in enumerate(Xs)]
        Ys = [check_finite_array(y, f"Ys[{i}]", ndim=1, max_abs=MAX_ABS)
              for i, y in enumerate(Ys)]
        d = Xs[0].shape[1]
        for i, (x, y) in enumerate(zip(Xs, Ys, strict=True)):
            if x.shape != (y.size, d):
                raise ValueError(f"Xs[{i}] must have shape (len(Ys[{i}]), d) = ({y.size}, {d}), "
                                 f"got {x.shape}")
        n_max = max(y.size for y in Ys)
        X = np.zeros((len(Xs), n_max, d))
        Y = np.zeros((len(Xs), n_max))
        mask = np.zeros((len(Xs), n_max))
        for i, (x, y) in enumerate(zip(Xs, Ys, strict=True)):
            X[i, : y.size] = x
            Y[i, : y.size] = y
            mask[i, : y.size] = 1.0
        return cls(X, Y, mask)

    @property
    def n_clients(self) -> int:
        return self.X.shape[0]

    @property
    def dim(self) -> int:
        return self.X.shape[2]

    @property
    def n_samples(self) -> np.ndarray:
        """Samples per client, shape (m,)."""
        return self.mask.sum(axis=1)

    def subset(self, clients):
        """The data of the given client indices (this object itself for all of them, in
        order: the data of a round where every client takes part is not copied)."""
        idx = self._clients_iv(clients)
        if idx.size == self.n_clients and np.array_equal(idx, np.arange(self.n_clients)):
            return self
        # Rows of checked data need no second check (a federated run takes a subset
        # every round).
        out = object.__new__(RegressionData)
        for name in ("X", "Y", "mask"):
            arr = getattr(self, name)[idx]
            arr.setflags(write=False)
            object.__setattr__(out, name, arr)
        return out

    def gram(self, clients=None):
        """X_i^T X_i, shape (m, d, d) (or for ``clients``)."""
        X = self.X if clients is None else self.X[self._clients_iv(clients)]
        return np.einsum("mnd,mne->mde", X, X)

    def predict(self, theta, clients=None):
        """<theta_i, x_ij> for every client's rows: theta (m, d) -> (m, n_max)."""
        X = self.X if clients is None else self.X[self._clients_iv(clients)]
        theta = check_finite_array(theta, "theta", ndim=2)
        if theta.shape != (X.shape[0], self.dim):
            raise ValueError(f"theta must have shape ({X.shape[0]}, {self.dim}), got "
                             f"{theta.shape}")
        return np.einsum("mnd,md->mn", X, theta)

    def _clients_iv(self, clients):
        """Client indices: a non-empty 1-D integer array in -m..m-1."""
        idx = check_counts(clients, "clients", minimum=-self.n_clients)
        if idx.size == 0 or idx.max() >= self.n_clients:
            raise ValueError(f"clients must be a non-empty array of indices in 0..."
                             f"{self.n_clients - 1}")
        return idx


def _client_list(items, name):
    if isinstance(items, str | bytes) or not isinstance(items, Sequence | np.ndarray):
        raise TypeError(f"{name} must be a list with one array per client, got "
                        f"{type(items).__name__}")
    if len(items) == 0:
        raise ValueError(f"{name} must hold at least one client")
    return list(items)


# Argument checks shared by the regression algorithms.

#: Range of the variances accepted: their squares and reciprocals stay normal floats.
MIN_VARIANCE, MAX_VARIANCE = 1e-300, 1e150


def _data_iv(data):
    if not isinstance(data, RegressionData):
        raise TypeError(f"data must be a RegressionData, got {type(data).__name__}")
    return data


def _variance_iv(value, name):
    return check_real_scalar(value, name, low=MIN_VARIANCE, high=MAX_VARIANCE)


def _mean_iv(mu, d, name):
    """A prior mean: a scalar (broadcast) or shape (d,), finite."""
    mu = check_finite_array(mu, name, ndim=(0, 1))
    if mu.ndim == 0:
        return np.full(d, float(mu))
    if mu.shape != (d,):
        raise ValueError(f"{name} must be a scalar or have shape (d,) = ({d},), got {mu.shape}")
    return mu


def _models_iv(theta, data, name):
    """Client models theta of shape (m, d)."""
    theta = check_finite_array(theta, name, ndim=2)
    if theta.shape != (data.n_clients, data.dim):
        raise ValueError(f"{name} must have shape (m, d) = ({data.n_clients}, {data.dim}), got "
                         f"{theta.shape}")
    return theta


def _mu0_iv(mu0):
    """An initial prior mean, checked now; its length is checked against the data at init."""
    return None if mu0 is None else check_finite_array(mu0, "mu0", ndim=(0, 1)).copy()
