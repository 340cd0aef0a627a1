"""Input validation shared by the public functions.

Every public function calls these at its boundary and then hands clean arrays
to the kernels, which assume valid input (the SciPy ``_iv`` habit).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "INT64_MAX",
    "as_generator",
    "as_real_array",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_counts",
    "check_finite_array",
    "check_int_scalar",
    "check_names",
    "check_positive_scalar",
    "check_nonnegative_scalar",
    "check_probability",
    "check_real_scalar",
    "check_standard_deviation",
    "check_standard_errors",
    "real_dtype_array",
]

#: Largest value of an int64 array: sizes and counts above it cannot be stored.
INT64_MAX = 2**63 - 1


def short_repr(value, limit=80):
    """``repr(value)``, cut to ``limit`` characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def as_generator(rng, name="rng"):
    """Normalize ``rng`` (None, int, SeedSequence or Generator) to a Generator.

    numpy's own errors for a bad seed ("SeedSequence expects int ...") do not
    say which argument was wrong, so they are re-raised (same type) naming it.
    A bool is refused: ``True`` would silently mean seed 1.
    """
    if isinstance(rng, np.random.RandomState):
        raise TypeError(f"{name} must be None, an int, a SeedSequence or a "
                        "numpy.random.Generator, not a legacy RandomState")
    if isinstance(rng, bool | np.bool_):
        raise TypeError(f"{name} must be None, an int >= 0, a SeedSequence or a "
                        f"numpy.random.Generator, got {rng!r}")
    try:
        return np.random.default_rng(rng)
    except TypeError as exc:
        raise TypeError(f"{name} must be None, an int >= 0, a SeedSequence or a "
                        f"numpy.random.Generator, got {short_repr(rng)}") from exc
    except ValueError as exc:
        raise ValueError(f"{name} must be None, an int >= 0, a SeedSequence or a "
                         f"numpy.random.Generator, got {short_repr(rng)} ({exc})") from exc


def _is_real_scalar(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _as_float(value, name):
    """``float(value)``, with a Python int too large for float64 refused by name."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite real number; got an integer too large "
                         "for float64") from None


def check_positive_scalar(value, name, *, allow_inf=False):
    """Return ``float(value)`` after checking it is a finite real > 0."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number > 0, got {value!r}")
    value = _as_float(value, name)
    if np.isnan(value) or value <= 0 or (np.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite real number > 0, got {value!r}")
    return value


def check_nonnegative_scalar(value, name):
    """Return ``float(value)`` after checking it is a finite real >= 0."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number >= 0, got {value!r}")
    value = _as_float(value, name)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite real number >= 0, got {value!r}")
    return value


#: Accepted range of a nonzero standard deviation in closed-form risks (sigma_x,
#: sigma_theta): its square, fourth power over counts up to 2^53 and products of two
#: squares stay inside float64.
SD_RANGE = (1e-100, 1e100)


def check_standard_deviation(value, name, *, zero_ok=False):
    """Return ``float(value)`` after checking it lies in SD_RANGE (or is 0 when ``zero_ok``)."""
    value = (check_nonnegative_scalar if zero_ok else check_positive_scalar)(value, name)
    lo, hi = SD_RANGE
    if value != 0.0 and not lo <= value <= hi:
        raise ValueError(f"{name} must be {'0 or ' if zero_ok else ''}in [{lo:g}, {hi:g}], "
                         f"got {value!r}")
    return value


def check_probability(value, name):
    """Return ``float(value)`` after checking it lies in [0, 1]."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number in [0, 1], got {value!r}")
    value = _as_float(value, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def check_int_scalar(value, name, *, minimum, maximum=None):
    """Return ``int(value)`` after checking it is an integer in [minimum, maximum].

    ``maximum=None`` sets no upper limit; pass :data:`INT64_MAX` (or less) for
    values that end up in numpy arrays, where a larger one would overflow.
    """
    accepted = (f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]")
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        if (isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
                and float(value).is_integer()):
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer {accepted}, got {short_repr(value)}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an integer {accepted}, got {value}")
    return value


def check_real_scalar(value, name, *, low=-math.inf, high=math.inf, low_open=False,
                      high_open=False):
    """Return ``float(value)`` after checking it is a real number in the given interval.

    The interval is [low, high] with either end open on request; the message
    names it. NaN is always refused, and so are infinities unless an end of
    the interval is infinite and closed.
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number in {interval}, got {short_repr(value)}")
    value = _as_float(value, name)
    below = value < low or (low_open and value == low)
    above = value > high or (high_open and value == high)
    if math.isnan(value) or below or above:
        raise ValueError(f"{name} must be a real number in {interval}, got {value!r}")
    return value


def check_bool(value, name):
    """Return ``value`` as a bool; only True/False (Python or numpy) are accepted.

    ``bool("no")`` is True, so anything else is refused rather than converted.
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {short_repr(value)}")
    return bool(value)


def check_callable(value, name, signature=""):
    """Check that ``value`` is callable (``signature`` describes the expected call)."""
    if not callable(value):
        hint = f" {signature}" if signature else ""
        raise TypeError(f"{name} must be a callable{hint}, got {short_repr(value)}")
    return value


def check_names(value, name, choices, *, what="name"):
    """A list of names from ``choices``; one bare string means that one name.

    ``list("thm1")`` would split a string into characters, so a ``str`` is
    wrapped first; other iterables must hold strings only.
    """
    if isinstance(value, str):
        value = [value]
    try:
        names = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a name or a sequence of names from "
                        f"{sorted(choices)}, got {short_repr(value)}") from None
    wrong = [v for v in names if not isinstance(v, str)]
    if wrong:
        raise TypeError(f"{name} must hold names (strings), got {short_repr(wrong[0])}")
    unknown = [v for v in names if v not in choices]
    if unknown:
        raise ValueError(f"{name}: unknown {what}s {unknown}; choose from {sorted(choices)}")
    return names


def check_string_list(values, name, *, what):
    """A list of strings (e.g. state names); one bare string is refused (it is not a list)."""
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a list of {what}s, got {values!r}")
    values = list(values)
    wrong = [v for v in values if not isinstance(v, str)]
    if wrong:
        raise TypeError(f"{name} must hold {what}s (strings), got {wrong[0]!r}")
    return values


def check_distinct_ints(values, name, *, minimum, maximum):
    """A non-empty list of distinct integers in ``[minimum, maximum]`` (e.g. severities)."""
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of integers in {minimum}..{maximum}, got "
                        f"{short_repr(values)}")
    values = list(values)
    out = [check_int_scalar(v, name, minimum=minimum, maximum=maximum) for v in values]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{name} must be a non-empty sequence of distinct integers in "
                         f"{minimum}..{maximum}, got {short_repr(values)}")
    return out


def check_choice(value, name, choices):
    """Check that ``value`` is one of ``choices``."""
    try:
        hash(value)  # an array or a list would compare elementwise (or never match)
    except TypeError:
        raise TypeError(f"{name} must be one of {sorted(choices)}, got a "
                        f"{type(value).__name__}") from None
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_finite_array(x, name, *, ndim=None, min_len=1, max_abs=None):
    """Return ``x`` as a float64 array after checking shape and finiteness.

    No copy is made when ``x`` already is a float64 array; callers never write
    into the result. ``max_abs`` also bounds every |value| (e.g. 1e150, so that
    squares and products of two values stay finite).
    """
    arr = as_real_array(x, name)
    if ndim is not None and arr.ndim not in np.atleast_1d(ndim):
        raise ValueError(f"{name} must have ndim in {tuple(np.atleast_1d(ndim))}, "
                         f"got shape {arr.shape}")
    if arr.ndim >= 1 and arr.shape[0] < min_len:
        raise ValueError(f"{name} must have at least {min_len} entries, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite; it has {bad} NaN or infinite value(s)")
    if max_abs is not None and arr.size and np.max(np.abs(arr)) > max_abs:
        raise ValueError(f"{name} must lie in [-{max_abs:g}, {max_abs:g}], got a value of "
                         f"{float(arr.flat[np.argmax(np.abs(arr))])!r}")
    return arr


def real_dtype_array(x, name):
    """``x`` as an array of a real dtype (bool, integer, float, or object holding reals).

    No conversion is made: callers choose the dtype they need. Complex values
    and text (also hidden in an object array, where ``float("1.5")`` would
    parse it) are refused, since ``np.asarray(..., dtype=float64)`` would
    silently drop an imaginary part and parse strings.
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
    if raw.dtype.kind == "O" and any(isinstance(v, str | bytes) for v in raw.ravel()):
        raise TypeError(f"{name} must be an array of real numbers, got text")
    if raw.dtype.kind not in "biufO":
        raise TypeError(f"{name} must be an array of real numbers, got dtype {raw.dtype}")
    return raw


def as_real_array(x, name):
    """``x`` as a native-endian float64 array (NaN and inf allowed); complex and text refused.

    Any real dtype (float16, big-endian, integers, bool) is converted here, so no
    kernel ever sees it.
    """
    raw = real_dtype_array(x, name)
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
    if np.any(s_arr <= 0):
        first = int(np.flatnonzero(s_arr <= 0)[0])
        raise ValueError(f"{name} must be > 0 (standard errors); entry {first} is "
                         f"{float(s_arr[first])!r}")
    bad = ~((s_arr >= _MIN_SE) & (s_arr <= _MAX_SE))
    if np.any(bad):
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must lie in [{_MIN_SE:g}, {_MAX_SE:g}] (standard errors > 0 "
                         f"whose square is a normal float); entry {first} is "
                         f"{float(s_arr[first])!r}")
    return s_arr


def check_samples_per_client(n, m):
    """Samples per client: a scalar or shape (m,), whole numbers >= 1 (float64 out)."""
    n_arr = check_finite_array(n, "n", ndim=(0, 1), min_len=0)
    if n_arr.ndim == 1 and n_arr.shape != (m,):
        raise ValueError(f"n must be a scalar or have shape ({m},), got {n_arr.shape}")
    if np.any(n_arr < 1) or np.any(n_arr != np.floor(n_arr)):
        raise ValueError(f"n must hold integers >= 1, got {n!r}" if n_arr.ndim == 0
                         else "n must hold integers >= 1")
    return float(n_arr) if n_arr.ndim == 0 else n_arr


def check_counts(x, name, *, minimum=0):
    """Return ``x`` as a 1-D int64 array of integers >= ``minimum``.

    Float input is accepted only when every value is integral (pandas often
    hands counts over as floats).
    """
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged nested sequences
        raise TypeError(f"{name} must be a 1-D array of integer counts") from exc
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
    # uint64 values or integral floats beyond int64 would wrap around on the cast
    # (a float is compared with 2.0**63: INT64_MAX itself rounds up to it). Signed
    # integers always fit: no pass over them.
    if arr.size and arr.dtype.kind != "i" and (
            arr.max() >= 2.0**63 if arr.dtype.kind == "f" else arr.max() > INT64_MAX):
        raise ValueError(f"{name} must be <= {INT64_MAX} (int64); largest value is {arr.max()}")
    return arr.astype(np.int64, copy=False)
