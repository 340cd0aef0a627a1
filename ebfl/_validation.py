"""Input validation shared by the public functions.

Every public function calls these at its boundary and then hands clean arrays
to the kernels, which assume valid input (the SciPy ``_iv`` habit).
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "as_generator",
    "check_choice",
    "check_counts",
    "check_finite_array",
    "check_positive_scalar",
    "check_nonnegative_scalar",
    "check_probability",
    "check_standard_errors",
]


def as_generator(rng):
    """Normalize ``rng`` (None, int, SeedSequence or Generator) to a Generator."""
    if isinstance(rng, np.random.RandomState):
        raise TypeError("rng must be None, an int, a SeedSequence or a numpy.random.Generator, "
                        "not a legacy RandomState")
    return np.random.default_rng(rng)


def _is_real_scalar(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_scalar(value, name, *, allow_inf=False):
    """Return ``float(value)`` after checking it is a finite real > 0."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number > 0, got {value!r}")
    value = float(value)
    if np.isnan(value) or value <= 0 or (np.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite real number > 0, got {value!r}")
    return value


def check_nonnegative_scalar(value, name):
    """Return ``float(value)`` after checking it is a finite real >= 0."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number >= 0, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite real number >= 0, got {value!r}")
    return value


def check_probability(value, name):
    """Return ``float(value)`` after checking it lies in [0, 1]."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number in [0, 1], got {value!r}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def check_int_scalar(value, name, *, minimum):
    """Return ``int(value)`` after checking it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def check_choice(value, name, choices):
    """Check that ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_finite_array(x, name, *, ndim=None, min_len=1):
    """Return ``x`` as a float64 array after checking shape and finiteness.

    No copy is made when ``x`` already is a float64 array; callers never write
    into the result.
    """
    arr = _as_real_float64(x, name)
    if ndim is not None and arr.ndim not in np.atleast_1d(ndim):
        raise ValueError(f"{name} must have ndim in {tuple(np.atleast_1d(ndim))}, "
                         f"got shape {arr.shape}")
    if arr.ndim >= 1 and arr.shape[0] < min_len:
        raise ValueError(f"{name} must have at least {min_len} entries, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite; it has {bad} NaN or infinite value(s)")
    return arr


def _as_real_float64(x, name):
    """``x`` as a native-endian float64 array; complex, text and object data are refused.

    ``np.asarray(..., dtype=float64)`` would silently drop an imaginary part and
    parse strings, so the dtype is checked first. Any real dtype (float16,
    big-endian, integers, bool) is converted to native float64 here, so no
    kernel ever sees it.
    """
    raw = x if isinstance(x, np.ndarray) else None
    if raw is None:
        try:
            raw = np.asarray(x)
        except (TypeError, ValueError) as exc:  # ragged nested sequences
            raise TypeError(f"{name} must be an array of real numbers") from exc
    if raw.dtype.kind == "c" or (raw.dtype.kind == "O" and any(
            isinstance(v, complex | np.complexfloating) for v in raw.ravel())):
        raise TypeError(f"{name} must hold real numbers, got complex values")
    if raw.dtype.kind not in "biufO":
        raise TypeError(f"{name} must be an array of real numbers, got dtype {raw.dtype}")
    try:
        return np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers") from exc


#: Standard errors are squared by every normal-means fit: below this their
#: square underflows to a subnormal or 0, above ``_MAX_SE`` it overflows.
_MIN_SE = 1e-150
_MAX_SE = 1e150


def check_standard_errors(s, name, m):
    """Return standard errors as a float64 array of shape (m,) (a scalar is broadcast).

    Each must be finite and lie in [1e-150, 1e150], so that s^2 and 1/s^2 are
    normal floats: a smaller s would underflow when squared and turn the fit's
    weights into NaN.
    """
    s_arr = check_finite_array(s, name, ndim=(0, 1), min_len=0)
    if s_arr.ndim == 0:
        s_arr = np.full(m, float(s_arr))
    elif s_arr.shape != (m,):
        raise ValueError(f"{name} must be a scalar or have shape ({m},), got {s_arr.shape}")
    bad = ~((s_arr >= _MIN_SE) & (s_arr <= _MAX_SE))
    if np.any(bad):
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [{_MIN_SE:g}, {_MAX_SE:g}] (standard errors > 0 "
                         f"whose square is a normal float); entry {first} is "
                         f"{float(s_arr[first])!r}")
    return s_arr


def check_counts(x, name, *, minimum=0):
    """Return ``x`` as a 1-D int64 array of integers >= ``minimum``.

    Float input is accepted only when every value is integral (pandas often
    hands counts over as floats).
    """
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "c":
        raise TypeError(f"{name} must hold integer counts, got complex values")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer)
                                 or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must hold integer counts, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite integers; it has NaN or infinite values")
        if not np.all(arr == np.floor(arr)):
            raise ValueError(f"{name} must hold whole numbers; it has non-integer values")
    if arr.size and arr.min() < minimum:
        raise ValueError(f"{name} must be >= {minimum}; smallest value is {arr.min()}")
    return arr.astype(np.int64, copy=False)
