"""Ragged client data: a flat array of observations plus per-client offsets."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_counts, real_dtype_array

__all__ = ["Ragged"]


@dataclass(frozen=True)
class Ragged:
    """Observations of ``m`` clients with unequal sample sizes, stored CSR-style.

    Client ``i`` owns ``values[offsets[i]:offsets[i + 1]]``. This is the layout
    the Numba kernels walk in one pass, with no Python loop over clients.

    Parameters
    ----------
    values : ndarray of shape (N,) or (N, d)
        All observations, client after client: real numbers (integer, bool and
        float32/float64 data keep their dtype; float16 and big-endian data are
        converted for the kernels; complex and text are refused).
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
        values = _native_values(self.values)
        try:
            offsets = np.asarray(self.offsets)
        except (TypeError, ValueError) as exc:
            raise TypeError("offsets must be a 1-D array of integers") from exc
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
        values = _native_values(values)
        counts = check_counts(counts, "counts", minimum=0)
        if counts.size == 0:
            raise ValueError("counts must hold at least one client")
        n_values = values.shape[0] if values.ndim else 1
        if int(counts.sum()) != n_values:  # Python int: no int64 overflow in the comparison
            raise ValueError(f"counts must sum to len(values) = {n_values}, "
                             f"got {int(counts.sum())}")
        offsets = np.zeros(counts.size + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(values, offsets)

    @classmethod
    def from_lists(cls, clients):
        """Build from a sequence with one array-like of observations per client."""
        if isinstance(clients, str | bytes) or not isinstance(clients, Iterable):
            raise TypeError("clients must be a sequence with one array of observations per "
                            f"client, got {type(clients).__name__}")
        arrays = [_native_values(c, f"clients[{i}]") for i, c in enumerate(clients)]
        if not arrays:
            raise ValueError("clients must contain at least one client")
        arrays = [np.atleast_1d(a) for a in arrays]
        if len({a.shape[1:] for a in arrays}) > 1:
            raise ValueError("clients must all have observations of one shape, (n_i,) or "
                             f"(n_i, d); got {sorted({a.shape[1:] for a in arrays})}")
        counts = np.array([a.shape[0] for a in arrays], np.int64)
        return cls.from_counts(np.concatenate(arrays), counts)

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
        i = operator.index(i)  # a client number, not a slice
        if not -self.n_clients <= i < self.n_clients:
            raise IndexError(f"client {i} out of range for {self.n_clients} clients")
        i %= self.n_clients  # data[-1] is the last client, as for a list
        return self.values[self.offsets[i]:self.offsets[i + 1]]


def _native_values(values, name="values"):
    """``values`` as an array that the Numba kernels accept.

    Integer, bool and float32/float64 data keep their dtype (0/1 data stay
    small); float16 and extended precision become float64, and big-endian data
    native-endian, since the kernels cannot read those. Complex, text and
    object data are refused.
    """
    arr = real_dtype_array(values, name)
    if arr.dtype.kind == "O":  # the kernels need a numeric dtype
        raise TypeError(f"{name} must be an array of real numbers, got dtype object")
    if arr.dtype.kind == "f" and arr.dtype.itemsize not in (4, 8):
        return arr.astype(np.float64)
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))
    return arr
