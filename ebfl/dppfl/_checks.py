"""Input checks of DP-PFL's public functions (the layout of :mod:`ebfl.dppfl.objective`).

Every public function of :mod:`ebfl.dppfl` validates its arguments here, at
its boundary, and hands clean float64 / int64 arrays to the computation.
Sizes are checked before anything of that size is allocated.
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import (
    as_real_array,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_real_scalar,
    real_dtype_array,
    short_repr,
)
from ebfl.privacy.accounting.core import NOISE_MULTIPLIER_RANGE

#: Largest number of devices m where an (m, m) task covariance Omega is built
#: (800 MB of float64 at the limit, more for its eigendecomposition).
MAX_DEVICES = 10_000
#: Largest number of entries m d of the models W (and the server's V).
MAX_MODEL_ENTRIES = 10**8
#: Largest number of global iterations K H of a run of Algorithm 1: 500 times
#: the paper's 20,000. Even on a few tiny devices an iteration costs about
#: 0.1 ms, so 10**7 of them take a quarter of an hour.
MAX_ITERATIONS = 10**7
#: Largest number of releases of the accountants (exact as a float).
MAX_RELEASES = 2**53
#: Accepted lambda of problem (1): W = Omega V / (2 lambda) and the curvature
#: beta Omega_tt / (2 lambda) stay finite for data of row norm <= 1.
LAM_RANGE = (1e-100, 1e100)


def check_lam(lam, name="lam"):
    """lambda > 0 in LAM_RANGE."""
    lo, hi = LAM_RANGE
    return check_real_scalar(lam, name, low=lo, high=hi)


def check_devices(m, name="m"):
    """A number of devices in [1, MAX_DEVICES]."""
    return check_int_scalar(m, name, minimum=1, maximum=MAX_DEVICES)


def check_sizes(sizes, name="sizes"):
    """Training sizes n_t: a non-empty 1-D array of integers >= 1 (int64)."""
    sizes = check_counts(sizes, name, minimum=1)
    if sizes.size == 0:
        raise ValueError(f"{name} must hold at least one device")
    return sizes


def check_rows(X, name="X"):
    """Rows (n, d): finite float64, 2-D, d >= 1."""
    X = check_finite_array(X, name, ndim=2, min_len=0)
    if X.shape[1] == 0:
        raise ValueError(f"{name} must have at least one feature (column), got shape {X.shape}")
    return X


def check_vector(v, name, n, what):
    """A finite 1-D float64 array of shape (n,)."""
    v = check_finite_array(v, name, ndim=1, min_len=0)
    if v.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) ({what}), got {v.shape}")
    return v


def check_offsets(offsets, n, name="offsets", rows="X"):
    """Device offsets (m + 1,): integers rising from 0 to n, the rows of ``rows``.

    An empty device (two equal offsets) is allowed.
    """
    if isinstance(offsets, str | bytes):
        raise TypeError(f"{name} must be a 1-D array of integer row offsets, got "
                        f"{short_repr(offsets)}")
    arr = real_dtype_array(offsets, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (row offsets), got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must be 1-D with m + 1 >= 2 entries, got shape {arr.shape}")
    if arr.size - 1 > MAX_DEVICES:
        raise ValueError(f"{name} must describe at most {MAX_DEVICES} devices, got "
                         f"{arr.size - 1}")
    if arr[0] != 0 or arr[-1] != n or np.any(np.diff(arr) < 0):
        raise ValueError(f"{name} must rise from 0 to n = {n}, the number of rows of {rows} "
                         f"(device t's rows at offsets[t]:offsets[t + 1]), got "
                         f"{short_repr(arr.tolist())}")
    return arr.astype(np.int64)


def check_omega(omega, m, name="omega"):
    """A task covariance (m, m): finite, symmetric, positive semidefinite."""
    omega = check_finite_array(omega, name, ndim=2)
    if omega.shape != (m, m):
        raise ValueError(f"{name} must have shape ({m}, {m}) (one row per device), got "
                         f"{omega.shape}")
    scale = float(np.abs(omega).max())
    if not np.allclose(omega, omega.T, rtol=0.0, atol=1e-12 * max(scale, 1.0)):
        raise ValueError(f"{name} must be symmetric")
    if scale > 0.0 and np.linalg.eigvalsh(omega / scale).min() < -1e-10:
        raise ValueError(f"{name} must be positive semidefinite")
    return omega


def check_models(W, m, d, name="W"):
    """Models (m, d), one per row: finite float64."""
    W = check_finite_array(W, name, ndim=2)
    if W.shape != (m, d):
        raise ValueError(f"{name} must have shape ({m}, {d}) (one model per device), got "
                         f"{W.shape}")
    return W


def refuse_overflow(value, what, names):
    """Refuse a NaN, or an infinity from float64 overflow, naming the arguments at fault."""
    if np.all(np.isfinite(value)):
        return value
    raise ValueError(f"{what} is not finite in float64 at these values of {', '.join(names)}: "
                     "use less extreme values")


# --------------------------------------------------------------------------- accounting


def releases_iv(releases, name="releases"):
    """A number of releases (composed iterations) in [1, MAX_RELEASES]."""
    return check_int_scalar(releases, name, minimum=1, maximum=MAX_RELEASES)


def in_range_iv(x, name, lo, hi, what):
    """``x`` as a float64 array of ndim 0 or 1, every entry in [lo, hi] (NaN refused)."""
    x = vector_iv(x, name)
    outside = ~((x >= lo) & (x <= hi))   # NaN included
    if np.any(outside):
        bad = x.flat[int(np.flatnonzero(outside)[0])]
        raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}] ({what}), got {float(bad)!r}")
    return x


def sampling_rate_iv(q):
    return in_range_iv(q, "sampling_rate", 0.0, 1.0,
                       "q = n_iter/n_t, the fraction of records the local solver touches")


def positive_rate_iv(q):
    """q in (0, 1]: a calibration needs a dual update that touches records."""
    q = sampling_rate_iv(q)
    if np.any(q == 0.0):
        raise ValueError("sampling_rate must lie in (0, 1] (q = n_iter/n_t, the fraction of "
                         "records the local solver touches; n_iter >= 1), got 0.0")
    return q


def noise_iv(sigma, name):
    return in_range_iv(sigma, name, *NOISE_MULTIPLIER_RANGE, "a noise multiplier")


def vector_iv(x, name):
    arr = as_real_array(x, name)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-D array (one entry per device), "
                         f"got shape {arr.shape}")
    if arr.ndim == 1 and arr.size == 0:
        raise ValueError(f"{name} must have at least one entry")
    return arr


def broadcast(**arrays):
    try:
        return np.broadcast_arrays(*arrays.values())
    except ValueError:
        shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise ValueError(f"per-device arrays must have one common length: {shapes}") from None


def as_output(arr, scalar):
    return float(arr) if scalar else arr
