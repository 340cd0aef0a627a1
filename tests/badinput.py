"""The machinery of the bad-input contract tests, shared by every surface's corpus.

Each :class:`Case` is one public callable with a minimal valid call (a factory
of fresh keyword arguments) and the kinds of its arguments. From those,
:func:`table_tests` derives, per argument:

* bad variants (complex, text, NaN/inf, a string where an array or a list is
  expected, wrong shape, out of range, wrong type), which must raise
  ValueError or TypeError whose message names the argument;
* dtype variants (float16, big-endian, narrower integers) of the valid call,
  which must work and give exactly the float64 / int64 result (the valid
  inputs are chosen exactly representable in float16);
* extreme but legal values, which must either give finite results or be
  refused with a ValueError naming the argument.

Every call, good or bad, is checked not to modify its inputs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Mapping

import numpy as np
import pytest

NAN, INF = float("nan"), float("inf")
NO_SNAPSHOT = object()


# ----------------------------------------------------------------- machinery

@dataclasses.dataclass
class Case:
    """One public callable: a valid call and the kinds of its arguments."""

    id: str
    func: Callable
    make: Callable[[], dict]  # fresh keyword arguments of a minimal valid call
    real: tuple = ()  # real-array arguments
    containers: tuple = ()  # real arrays that may hold NaN (checked by their consumers)
    counts: tuple = ()  # integer-array arguments
    scalars: Mapping = dataclasses.field(default_factory=dict)  # argument -> scalar kind
    bad: tuple = ()  # further (argument, value, exception[, message pattern])
    extreme: tuple = ()  # (argument, value): finite results, or a ValueError naming it
    valid: bool = True  # False: too slow to run, only its refusals are tested
    finite: bool = True  # the valid call's results are all finite
    result: Callable = staticmethod(lambda out: out)  # what to compare between calls

    def __str__(self):
        return self.id


#: Bad values of each kind of scalar argument: (label, value, exception).
SCALAR_BAD = {
    "positive": [("complex", 1 + 1j, TypeError), ("text", "1.0", TypeError),
                 ("bool", True, TypeError), ("nan", NAN, ValueError), ("inf", INF, ValueError),
                 ("zero", 0.0, ValueError), ("negative", -1.0, ValueError)],
    "nonnegative": [("complex", 1 + 1j, TypeError), ("text", "1.0", TypeError),
                    ("bool", True, TypeError), ("nan", NAN, ValueError),
                    ("inf", INF, ValueError), ("negative", -1.0, ValueError)],
    # Step sizes and penalties: huge values make an algorithm diverge (it warns),
    # so only their refusals are tested.
    "rate": [("complex", 1 + 1j, TypeError), ("text", "1.0", TypeError),
             ("bool", True, TypeError), ("nan", NAN, ValueError), ("inf", INF, ValueError),
             ("zero", 0.0, ValueError), ("negative", -1.0, ValueError)],
    "rate0": [("complex", 1 + 1j, TypeError), ("text", "1.0", TypeError),
              ("nan", NAN, ValueError), ("inf", INF, ValueError),
              ("negative", -1.0, ValueError)],
    "probability": [("complex", 0.5 + 1j, TypeError), ("text", "0.5", TypeError),
                    ("nan", NAN, ValueError), ("above", 1.5, ValueError),
                    ("negative", -0.1, ValueError)],
    "open_unit": [("complex", 0.5 + 1j, TypeError), ("text", "0.5", TypeError),
                  ("nan", NAN, ValueError), ("zero", 0.0, ValueError), ("one", 1.0, ValueError),
                  ("above", 1.5, ValueError)],
    # An iteration count: huge values are legal (and slow), so none is tried.
    "count": [("float", 2.5, TypeError), ("text", "3", TypeError), ("bool", True, TypeError),
              ("nan", NAN, TypeError), ("complex", 2 + 1j, TypeError),
              ("zero", 0, ValueError), ("negative", -1, ValueError)],
    # A size that ends up in an array: beyond int64 it must be refused.
    "size": [("float", 2.5, TypeError), ("text", "3", TypeError), ("bool", True, TypeError),
             ("nan", NAN, TypeError), ("zero", 0, ValueError), ("negative", -1, ValueError),
             ("huge", 10**30, ValueError)],
    "bool": [("int", 1, TypeError), ("text", "yes", TypeError), ("none", None, TypeError)],
    "rng": [("text", "seed", TypeError), ("negative", -1, ValueError),
            ("float", 1.5, TypeError), ("bool", True, TypeError),
            ("legacy", np.random.RandomState(0), TypeError)],
    "callable": [("text", "kmeans", TypeError), ("number", 3, TypeError)],
}

#: Extreme but legal values of each kind: computed with finite results or refused by name.
SCALAR_EXTREME = {"positive": (1e308, 5e-324, 1e-200, 1e200),
                  "nonnegative": (1e308, 5e-324, 1e200)}


def complex_of(a):
    return np.asarray(a, float) + 1j


def with_first(a, value):
    out = np.array(a, dtype=float)
    out.flat[0] = value
    return out


def object_text(a):
    """An object array whose first entry is the text "1.0" (float() would parse it)."""
    out = np.array(a, dtype=object)
    out.flat[0] = "1.0"
    return out


CONTAINER_BAD = [("complex", complex_of, TypeError),
                 ("text", lambda a: np.asarray(a).astype(str), TypeError),
                 ("object-text", object_text, TypeError),
                 ("string", lambda a: "0.5", (TypeError, ValueError))]
REAL_BAD = CONTAINER_BAD + [("nan", lambda a: with_first(a, NAN), ValueError),
                            ("inf", lambda a: with_first(a, -INF), ValueError)]
REAL_OK = [("float16", lambda a: np.asarray(a).astype(np.float16)),
           ("big-endian", lambda a: np.asarray(a).astype(">f8")),
           ("list", lambda a: np.asarray(a).tolist())]
COUNT_BAD = [("complex", complex_of, TypeError),
             ("text", lambda a: np.asarray(a).astype(str), TypeError),
             ("fraction", lambda a: np.asarray(a) + 0.5, (TypeError, ValueError)),
             ("nan", lambda a: with_first(a, NAN), (TypeError, ValueError)),
             ("string", lambda a: "3", (TypeError, ValueError))]
COUNT_OK = [("big-endian", lambda a: np.asarray(a).astype(">i8")),
            ("int16", lambda a: np.asarray(a).astype(np.int16)),
            ("list", lambda a: np.asarray(a).tolist())]


def snapshot(kwargs):
    try:
        return copy.deepcopy(kwargs)
    except Exception:  # noqa: BLE001 - objects that cannot be copied are not compared
        return NO_SNAPSHOT


def assert_same(a, b, path="value"):
    """Assert that a and b are equal, recursively (NaN equals NaN; dtypes must agree)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        nan_ok = a.dtype.kind in "fc"
        assert np.array_equal(a, b, equal_nan=nan_ok), f"{path}: values differ"
    elif is_tensor(a):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert bool((a == b).all() or (a.isnan() & b.isnan()).any()), f"{path}: values differ"
    elif isinstance(a, np.random.RandomState):
        assert_same(a.get_state(legacy=False), b.get_state(legacy=False), path)
    elif isinstance(a, np.random.Generator):
        assert_same(a.bit_generator.state, b.bit_generator.state, path)
    elif isinstance(a, Mapping):
        assert set(a) == set(b), f"{path}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: length differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{path}: {a} != {b}"
    elif is_module(a):
        assert_same(a.state_dict(), b.state_dict(), path)
    elif callable(a) or a is None or isinstance(a, str | int | bool | complex):
        assert a is b or a == b, f"{path}: {a!r} != {b!r}"
    elif hasattr(a, "__dict__"):
        assert_same(vars(a), vars(b), path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def is_tensor(x):
    torch = __import__("sys").modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_module(x):
    torch = __import__("sys").modules.get("torch")
    return torch is not None and isinstance(x, torch.nn.Module)


def assert_finite(obj, path="result"):
    """Assert that every float in obj (arrays, floats, nested containers) is finite."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc":
            assert np.all(np.isfinite(obj)), f"{path} has non-finite values"
    elif is_tensor(obj):
        if obj.is_floating_point():
            assert bool(obj.isfinite().all()), f"{path} has non-finite values"
    elif isinstance(obj, float | np.floating):
        assert math.isfinite(obj), f"{path} = {obj}"
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            assert_finite(v, f"{path}[{k!r}]")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            assert_finite(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            assert_finite(getattr(obj, f.name), f"{path}.{f.name}")


def call_unchanged(case, kwargs):
    """Call ``case`` and check that the arguments are unchanged afterwards."""
    before = snapshot(kwargs)
    try:
        return case.func(**kwargs)
    finally:
        if before is not NO_SNAPSHOT:
            assert_same(kwargs, before, "arguments")


def expect_refusal(case, arg, value, exc, pattern=None):
    kwargs = case.make()
    kwargs[arg] = value
    with pytest.raises(exc, match=pattern or re.escape(arg)):
        call_unchanged(case, kwargs)


def bad_variants(cases):
    """(case, argument, label, value-maker, exception, pattern) for every bad variant."""
    out = []
    for case in cases:
        for arg in case.real:
            out += [(case, arg, lab, f, exc, None) for lab, f, exc in REAL_BAD]
        for arg in case.containers:
            out += [(case, arg, lab, f, exc, None) for lab, f, exc in CONTAINER_BAD]
        for arg in case.counts:
            out += [(case, arg, lab, f, exc, None) for lab, f, exc in COUNT_BAD]
        for arg, kind in case.scalars.items():
            out += [(case, arg, lab, (lambda _, v=v: v), exc, None)
                    for lab, v, exc in SCALAR_BAD[kind]]
        for arg, value, exc, *pattern in case.bad:
            out.append((case, arg, "specific", (lambda _, v=value: copy.deepcopy(v)), exc,
                        pattern[0] if pattern else None))
    return out


def dtype_variants(cases):
    out = []
    for case in (c for c in cases if c.valid):
        for arg in case.real + case.containers:
            out += [(case, arg, lab, f) for lab, f in REAL_OK]
        for arg in case.counts:
            out += [(case, arg, lab, f) for lab, f in COUNT_OK]
    return out


def extreme_variants(cases):
    out = []
    for case in (c for c in cases if c.valid):
        for arg, kind in case.scalars.items():
            out += [(case, arg, v) for v in SCALAR_EXTREME.get(kind, ())]
        out += [(case, arg, v) for arg, v in case.extreme]
    return out


def param_ids(params):
    return [f"{p[0]}-{p[1]}-{p[2]}" if isinstance(p[2], str) else f"{p[0]}-{p[1]}-{p[2]!r}"
            for p in params]


_REFERENCE = {}


def reference(case):
    """The result of the valid call, computed once per case."""
    # by the case itself, not its id: corpora of several modules may reuse an id
    if id(case) not in _REFERENCE:
        _REFERENCE[id(case)] = case.result(case.func(**case.make()))
    return _REFERENCE[id(case)]


def check_valid(case):
    kwargs = case.make()
    out = case.result(call_unchanged(case, kwargs))
    if case.finite:
        assert_finite(out)
    assert_same(reference(case), out, "repeated call")  # deterministic (seeded)


def check_refusal(case, arg, value_of, exc, pattern):
    expect_refusal(case, arg, value_of(case.make().get(arg)), exc, pattern)


def check_dtype(case, arg, convert):
    ref = reference(case)
    kwargs = case.make()
    kwargs[arg] = convert(kwargs[arg])
    assert_same(case.result(call_unchanged(case, kwargs)), ref, f"result with converted {arg}")


def check_extreme(case, arg, value):
    kwargs = case.make()
    kwargs[arg] = value
    # An extreme value may honestly stop an optimizer short (e.g. tol=1e-200): that is
    # reported by a RuntimeWarning, the only warning accepted here.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = case.result(call_unchanged(case, kwargs))
        except ValueError as exc:
            assert arg in str(exc), f"refusal of {arg}={value!r} does not name it: {exc}"
            return
    assert all(issubclass(w.category, RuntimeWarning) for w in caught), [
        str(w.message) for w in caught]
    assert_finite(out)


def table_tests(cases, section, namespace):
    """Define a section's table-driven tests (those with any parameters) in ``namespace``.

    ``namespace`` is the test module's ``globals()``, where pytest collects them.
    """
    valid = [c for c in cases if c.valid]
    bad, ok, ext = bad_variants(cases), dtype_variants(cases), extreme_variants(cases)
    tests = {}
    if valid:
        @pytest.mark.parametrize("case", valid, ids=str)
        def test_valid_call(case):
            check_valid(case)

        tests["valid_call"] = test_valid_call
    if bad:
        @pytest.mark.parametrize(("case", "arg", "label", "value_of", "exc", "pattern"),
                                 bad, ids=param_ids(bad))
        def test_refused_by_name(case, arg, label, value_of, exc, pattern):
            check_refusal(case, arg, value_of, exc, pattern)

        tests["refused_by_name"] = test_refused_by_name
    if ok:
        @pytest.mark.parametrize(("case", "arg", "label", "convert"), ok, ids=param_ids(ok))
        def test_other_dtypes_give_the_same_result(case, arg, label, convert):
            check_dtype(case, arg, convert)

        tests["other_dtypes_give_the_same_result"] = test_other_dtypes_give_the_same_result
    if ext:
        @pytest.mark.parametrize(("case", "arg", "value"), ext, ids=param_ids(ext))
        def test_extremes_compute_or_are_refused_by_name(case, arg, value):
            check_extreme(case, arg, value)

        tests["extremes_compute_or_are_refused_by_name"] = (
            test_extremes_compute_or_are_refused_by_name)
    for name, test in tests.items():
        namespace[f"test_{section}_{name}"] = test
