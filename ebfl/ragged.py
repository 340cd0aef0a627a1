"""Ragged client data: a flat array of observations plus per-client offsets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Ragged"]


@dataclass(frozen=True)
class Ragged:
    """Observations of ``m`` clients with unequal sample sizes, stored CSR-style.

    Client ``i`` owns ``values[offsets[i]:offsets[i + 1]]``. This is the layout
    the Numba kernels walk in one pass, with no Python loop over clients.

    Parameters
    ----------
    values : ndarray of shape (N,) or (N, d)
        All observations, client after client.
    offsets : ndarray of shape (m + 1,)
        Non-decreasing integer offsets with ``offsets[0] == 0`` and
        ``offsets[-1] == N``.

    Examples
    --------
    >>> data = Ragged.from_lists([[1, 0, 1], [0, 0]])
    >>> data.n_clients, data.counts.tolist()
    (2, [3, 2])
    >>> data[1].tolist()
    [0, 0]
    """

    values: np.ndarray
    offsets: np.ndarray

    def __post_init__(self):
        values = np.asarray(self.values)
        offsets = np.asarray(self.offsets)
        if values.ndim not in (1, 2):
            raise ValueError(f"values must have shape (N,) or (N, d), got {values.shape}")
        if offsets.ndim != 1 or offsets.size < 2:
            raise ValueError("offsets must be 1-D with at least 2 entries (one client), "
                             f"got shape {offsets.shape}")
        if not np.issubdtype(offsets.dtype, np.integer):
            raise TypeError(f"offsets must be integers, got dtype {offsets.dtype}")
        if offsets[0] != 0 or offsets[-1] != values.shape[0]:
            raise ValueError(f"offsets must start at 0 and end at len(values)={values.shape[0]}, "
                             f"got {offsets[0]} and {offsets[-1]}")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "offsets", offsets.astype(np.int64, copy=False))

    @classmethod
    def from_counts(cls, values, counts):
        """Build from the flat ``values`` and the number of observations per client."""
        counts = np.asarray(counts)
        if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer):
            raise TypeError("counts must be a 1-D array of integers")
        if counts.size and counts.min() < 0:
            raise ValueError("counts must be >= 0")
        offsets = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(values, offsets)

    @classmethod
    def from_lists(cls, clients):
        """Build from a sequence with one array-like of observations per client."""
        arrays = [np.asarray(c) for c in clients]
        if not arrays:
            raise ValueError("clients must contain at least one client")
        counts = np.array([a.shape[0] if a.ndim else 1 for a in arrays], np.int64)
        return cls.from_counts(np.concatenate([np.atleast_1d(a) for a in arrays]), counts)

    @property
    def n_clients(self) -> int:
        """Number of clients ``m``."""
        return self.offsets.size - 1

    @property
    def counts(self) -> np.ndarray:
        """Number of observations per client, shape (m,)."""
        return np.diff(self.offsets)

    def __len__(self):
        return self.n_clients

    def __getitem__(self, i):
        return self.values[self.offsets[i]:self.offsets[i + 1]]
