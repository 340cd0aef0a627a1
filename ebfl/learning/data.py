"""Client datasets for federated regression, stacked along a leading client axis.

Clients may hold different numbers of samples; rows are padded to the largest
count and a 0/1 ``mask`` marks the real ones, so every per-client computation is
one vectorized numpy expression over all clients (no Python loop over clients).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_finite_array

__all__ = ["RegressionData"]


@dataclass(frozen=True)
class RegressionData:
    """Design matrices and responses of m clients.

    Attributes
    ----------
    X : ndarray of shape (m, n_max, d)
        Padded rows are 0.
    Y : ndarray of shape (m, n_max)
        Padded entries are 0.
    mask : ndarray of float, shape (m, n_max)
        1 for real samples, 0 for padding.
    """

    X: np.ndarray
    Y: np.ndarray
    mask: np.ndarray

    def __post_init__(self):
        X = check_finite_array(self.X, "X", ndim=3)
        Y = check_finite_array(self.Y, "Y", ndim=2)
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
        Y = np.asarray(Y)
        return cls(X, Y, np.ones(Y.shape))

    @classmethod
    def from_lists(cls, Xs, Ys):
        """Clients of different sizes: lists of (n_i, d) and (n_i,) arrays."""
        if len(Xs) != len(Ys) or not Xs:
            raise ValueError("Xs and Ys must be non-empty lists of the same length")
        d = np.asarray(Xs[0]).shape[1]
        n_max = max(len(y) for y in Ys)
        X = np.zeros((len(Xs), n_max, d))
        Y = np.zeros((len(Xs), n_max))
        mask = np.zeros((len(Xs), n_max))
        for i, (x, y) in enumerate(zip(Xs, Ys, strict=True)):
            x = np.asarray(x, dtype=np.float64)
            if x.ndim != 2 or x.shape[1] != d or x.shape[0] != len(y):
                raise ValueError(f"client {i}: X must be (n_i, {d}) with n_i = len(Y_i)")
            X[i, : len(y)] = x
            Y[i, : len(y)] = y
            mask[i, : len(y)] = 1.0
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
        """The data of the given client indices."""
        idx = np.asarray(clients)
        return RegressionData(self.X[idx], self.Y[idx], self.mask[idx])

    def gram(self, clients=None):
        """X_i^T X_i, shape (m, d, d) (or for ``clients``)."""
        X = self.X if clients is None else self.X[clients]
        return np.einsum("mnd,mne->mde", X, X)

    def predict(self, theta, clients=None):
        """<theta_i, x_ij> for every client's rows: theta (m, d) -> (m, n_max)."""
        X = self.X if clients is None else self.X[clients]
        return np.einsum("mnd,md->mn", X, theta)
