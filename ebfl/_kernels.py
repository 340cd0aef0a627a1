"""Numba kernels over ragged client data (private: arrays in, no validation).

Ragged data are stored CSR-style: client ``i`` owns ``values[offsets[i]:offsets[i+1]]``.
Each kernel runs ``prange`` over clients and every iteration writes only its own
output slots, so there are no races. Plain-numpy twins live in ``tests/naive.py``.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _bernoulli_counts(values, offsets):
    """Per-client number of ones, and of entries that are neither 0 nor 1.

    Validation is fused into the single pass over the data (a separate check
    would read 10^8 values a second time); NaN counts as invalid. The loop body
    has no branch so that LLVM vectorizes it (3.5x faster than if/elif).
    """
    m = offsets.size - 1
    ones = np.empty(m, np.int64)
    invalid = np.empty(m, np.int64)
    for i in prange(m):
        s = 0
        bad = 0
        for j in range(offsets[i], offsets[i + 1]):
            v = values[j]
            one = v == 1
            s += one
            bad += (v != 0) & (not one)
        ones[i] = s
        invalid[i] = bad
    return ones, invalid


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _client_mean_ssd(values, offsets):
    """Per-client coordinate means and total within-client sum of squared deviations.

    ``values`` has shape (N, d). Two passes per client (mean, then deviations)
    keep the sum of squares accurate when means are large relative to spread.
    Returns ``mean`` (m, d), ``ssd`` (m,) summed over coordinates, and the number
    of non-finite entries per client.
    """
    m = offsets.size - 1
    d = values.shape[1]
    mean = np.empty((m, d), np.float64)
    ssd = np.empty(m, np.float64)
    nonfinite = np.empty(m, np.int64)
    for i in prange(m):
        lo = offsets[i]
        hi = offsets[i + 1]
        cnt = hi - lo
        bad = 0
        for k in range(d):
            s = 0.0
            for j in range(lo, hi):
                s += values[j, k]
            mean[i, k] = s / cnt if cnt > 0 else np.nan
        total = 0.0
        for j in range(lo, hi):
            for k in range(d):
                v = values[j, k]
                if not np.isfinite(v):
                    bad += 1
                dev = v - mean[i, k]
                total += dev * dev
        ssd[i] = total
        nonfinite[i] = bad
    return mean, ssd, nonfinite
