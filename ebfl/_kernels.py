"""Numba kernels shared across subpackages (private: arrays in, no validation).

Most run over ragged client data; the last is the leave-one-out client of eq. (6),
which both the beta-binomial estimator and the Monte Carlo checks of Theorem 3 call.

Ragged data are stored CSR-style: client ``i`` owns ``values[offsets[i]:offsets[i+1]]``.
Each kernel runs ``prange`` over clients and every iteration writes only its own
output slots, so there are no races. Plain-numpy twins live in ``tests/naive.py``.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def count_bernoulli(values, offsets):
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


# SWAR constants of :func:`count_bytes` (uint64: numba turns int64 | uint64 into float64).
_LOW_BITS = np.uint64(0x0101010101010101)
_NOT_01 = np.uint64(0xFEFEFEFEFEFEFEFE)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_BYTES_EVEN = np.uint64(0x00FF00FF00FF00FF)
_SHORTS_EVEN = np.uint64(0x0000FFFF0000FFFF)
_LOW_INT = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_U8 = np.uint64(8)
_U16 = np.uint64(16)
_U32 = np.uint64(32)
#: Words whose bytes (each 0 or 1) are added lane-wise before a lane could pass 255.
_LANE_WORDS = 255


@njit(cache=CACHE, fastmath=FASTMATH)
def _lane_sum(w):
    """Sum of the eight byte lanes of ``w`` (each <= 255), without overflow."""
    w = (w & _BYTES_EVEN) + ((w >> _U8) & _BYTES_EVEN)
    w = (w & _SHORTS_EVEN) + ((w >> _U16) & _SHORTS_EVEN)
    return (w & _LOW_INT) + (w >> _U32)


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def count_bytes(values, words, offsets, ones, trials):
    """Per-client number of ones of 1-byte 0/1 data, eight bytes at a time.

    ``words`` is ``values[:8 * (N // 8)]`` viewed as uint64 (``values`` must be
    8-byte aligned); ``ones`` and ``trials`` (m,), integer arrays wide enough
    for the largest client, are filled in. Returns the number of
    clients holding a byte other than 0 and 1 (their counts are then meaningless:
    the caller locates them with :func:`count_bernoulli`).

    A client's bytes are its partial first word (bytes below it masked off), its
    whole words and its partial last word. Their low bits are added lane-wise
    (each byte lane counts its ones, up to 255 words at a time) and the lanes
    summed once; ``w & 0xFE..FE`` flags invalid bytes. No per-byte loop and no
    wrapping arithmetic (so ``NUMBA_DISABLE_JIT=1`` runs it without overflow
    warnings); a byte loop was 3-5x slower.
    """
    m = offsets.size - 1
    n_words = words.size
    n_bad = 0
    for i in prange(m):
        lo = offsets[i]
        hi = offsets[i + 1]
        first = lo >> 3
        last = hi >> 3
        total = np.uint64(0)
        bad = np.uint64(0)
        if first == last:  # all within one word
            for j in range(lo, hi):
                v = np.uint64(values[j])
                total += v & _ONE
                bad |= v & _NOT_01
        else:
            w = words[first] & (_ALL << (_U8 * np.uint64(lo & 7)))
            bad |= w & _NOT_01
            lanes = w & _LOW_BITS
            k = first + 1
            while True:
                stop = min(last, k + _LANE_WORDS - 1)
                for j in range(k, stop):
                    w = words[j]
                    bad |= w & _NOT_01
                    lanes += w & _LOW_BITS
                total += _lane_sum(lanes)
                lanes = np.uint64(0)
                k = stop
                if k >= last:
                    break
            rest = hi & 7
            if rest and last < n_words:
                w = words[last] & ((_ONE << (_U8 * np.uint64(rest))) - _ONE)
                bad |= w & _NOT_01
                total += _lane_sum(w & _LOW_BITS)
            elif rest:  # the last word is the array's tail, shorter than 8 bytes
                for j in range(last * 8, hi):
                    v = np.uint64(values[j])
                    total += v & _ONE
                    bad |= v & _NOT_01
        ones[i] = np.int64(total)
        trials[i] = hi - lo
        n_bad += bad != 0
    return n_bad


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def client_mean_ssd(values, offsets):
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


# Codes for the leave-one-out variants of eq. (6) (``beta_binomial_eb``'s loo methods).
LOO_PRINTED = 0
LOO_PROOF = 1
LOO_CORRECTED = 2


@njit(cache=CACHE, fastmath=FASTMATH)
def loo_beta_client(xi, ni, m, total, ssq, corr_total, variant):
    """Eq. (6) for one client from the global sums: (mu_i, sigma_i^2, a_i, clipped, floored).

    xi, ni : the client's local mean and trials;  m : number of clients
    total : sum of x;  ssq : sum of (x - mean(x))**2
    corr_total : sum of x(1-x)/(n-1) (only read by LOO_CORRECTED)

    With y_i = x_i - mean(x), the leave-one-out sums are O(1) per client:
      sum_{l != i} (x_l - mu_i)^2       = ssq - y_i^2 m/(m-1)        (proof / intended)
      sum_{l != i} (x_l - mu_l)^2       = (m/(m-1))^2 (ssq - y_i^2)   (as printed: mu_l)
    """
    mu_i = (total - xi) / (m - 1.0)
    y = xi - total / m
    if variant == LOO_PRINTED:
        v = (m / (m - 1.0)) ** 2 * (ssq - y * y) / (m - 2.0)
    else:
        v = (ssq - y * y * m / (m - 1.0)) / (m - 2.0)
    if v < 0.0:  # rounding only: a sum of squares
        v = 0.0
    floored = False
    if variant == LOO_CORRECTED:
        v -= (corr_total - xi * (1.0 - xi) / (ni - 1.0)) / (m - 1.0)
        if v < 0.0:
            v = 0.0
            floored = True
    u = mu_i * (1.0 - mu_i)
    # a = n / (u/v - 1 + n) (printed, corrected) or n / (u/v + n) (proof),
    # multiplied through by v so that v = 0 gives a = 0 without dividing by 0.
    minus_one = 0.0 if variant == LOO_PROOF else 1.0
    den = u - minus_one * v + ni * v
    if v == 0.0:
        ai = 0.0
    elif den <= 0.0:
        ai = np.inf
    else:
        ai = ni * v / den
    clipped = False
    if ai < 0.0:
        ai = 0.0
        clipped = True
    elif ai > 1.0:
        ai = 1.0
        clipped = True
    return mu_i, v, ai, clipped, floored
