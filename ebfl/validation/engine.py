"""Monte Carlo engine: replicates, standard errors and verdicts.

A check draws R independent replicates (population, data, mechanism), computes
per-replicate statistics, and compares their mean with a formula:

* ``exact``: the formula is an equality; holds if ``|estimate - formula| <= z se``.
* ``upper``: the formula bounds the quantity from above; holds unless
  estimate > formula + z se.
* ``lower``: the formula bounds it from below; holds unless estimate < formula - z se.

The standard error is taken across replicates (clients within a replicate are
weakly dependent through the shared statistics). ``z`` is 4 by
default: with ~30 rows, a two-sided 4-sigma band keeps the chance of any false
alarm under 0.2 %.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ebfl._validation import (
    as_generator,
    as_real_array,
    check_bool,
    check_callable,
    check_choice,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)

__all__ = ["KINDS", "VERDICTS", "CheckResult", "judge", "make_result", "run_replicates"]

#: How a check compares its estimate with the formula (described in the module docstring).
KINDS = ("exact", "upper", "lower")
#: The verdicts of a check.
VERDICTS = ("holds", "violated", "inconclusive")
DEFAULT_Z = 4.0


def judge(kind, estimate, se, formula, z=DEFAULT_Z, atol=0.0):
    """Verdict of a Monte Carlo estimate against a formula.

    Parameters
    ----------
    kind : {"exact", "upper", "lower"}
    estimate, se : float
        Monte Carlo mean and its standard error (>= 0).
    formula : float
        The theoretical value.
    z : float
        Tolerance in standard errors, > 0.
    atol : float
        Added tolerance for rounding (rows computed exactly, with se = 0), >= 0.

    Returns
    -------
    str
        ``"holds"``, ``"violated"`` or ``"inconclusive"`` (non-finite inputs).

    Examples
    --------
    >>> judge("exact", 1.02, 0.01, 1.0), judge("upper", 1.5, 0.01, 1.0)
    ('holds', 'violated')
    """
    check_choice(kind, "kind", KINDS)
    estimate, se, formula = (_real(v, n) for v, n in ((estimate, "estimate"), (se, "se"),
                                                      (formula, "formula")))
    if se < 0:
        raise ValueError(f"se must be >= 0 (a standard error), got {se!r}")
    z = check_positive_scalar(z, "z")
    atol = check_nonnegative_scalar(atol, "atol")
    if not (math.isfinite(estimate) and math.isfinite(se) and math.isfinite(formula)):
        return "inconclusive"
    tol = z * se + atol
    if kind == "exact":
        ok = abs(estimate - formula) <= tol
    elif kind == "upper":
        ok = estimate <= formula + tol
    else:
        ok = estimate >= formula - tol
    return "holds" if ok else "violated"


@dataclass(frozen=True)
class CheckResult:
    """One row of the validation table.

    Attributes
    ----------
    name : str
        Check name, e.g. ``"thm1"``; several rows may share it (``label`` differs).
    label : str
        What this row compares, e.g. ``"personalized MSE"`` or ``"k=4"``.
    statement : str
        The paper's statement (theorem, equation).
    kind : {"exact", "upper", "lower"}
    formula : float
        The statement's value.
    estimate, se : float
        Monte Carlo mean and standard error across replicates.
    z : float
        Tolerance in standard errors.
    atol : float
        Rounding allowance; ``tolerance = z * se + atol``.
    verdict : {"holds", "violated", "inconclusive"}
    n_reps : int
    params : mapping
        Parameters of the simulation.
    flag : str
        Why the paper's statement is known to be wrong or weaker than stated
        (the paper's statement and what is wrong with it), or "" when it is not.
    extra : mapping
        Further figures, e.g. ``event_failure_fraction`` for high-probability bounds.
    """

    name: str
    label: str
    statement: str
    kind: str
    formula: float
    estimate: float
    se: float
    z: float
    atol: float
    verdict: str
    n_reps: int
    params: Mapping = field(default_factory=lambda: MappingProxyType({}))
    flag: str = ""
    extra: Mapping = field(default_factory=lambda: MappingProxyType({}))

    @property
    def tolerance(self) -> float:
        """z * se + atol."""
        return self.z * self.se + self.atol

    def to_dict(self) -> dict:
        """Plain-Python dictionary (JSON-serializable)."""
        return {"name": self.name, "label": self.label, "statement": self.statement,
                "kind": self.kind, "formula": self.formula, "estimate": self.estimate,
                "se": self.se, "tolerance": self.tolerance, "verdict": self.verdict,
                "n_reps": self.n_reps, "params": _plain(self.params), "flag": self.flag,
                "extra": _plain(self.extra)}


def _real(value, name):
    """A real number; NaN and inf are allowed (they make a verdict inconclusive)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def _text(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _mapping(value, name):
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    return value


def _plain(mapping):
    out = {}
    for key, value in mapping.items():
        if isinstance(value, np.generic):
            value = value.item()
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[key] = value
    return out


def make_result(name, label, statement, kind, formula, values, *, params, z=DEFAULT_Z,
                se=None, atol=0.0, flag="", extra=None):
    """A :class:`CheckResult` from per-replicate values (mean and SE across replicates).

    ``se`` overrides the standard error, e.g. with that of a paired difference
    when the formula side is itself a Monte Carlo estimate on the same draws.
    """
    name, label, statement, flag = (_text(v, n) for v, n in (
        (name, "name"), (label, "label"), (statement, "statement"), (flag, "flag")))
    values = as_real_array(values, "values")
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array (one per replicate), got shape "
                         f"{values.shape}")
    params = _mapping(params, "params")
    extra = {} if extra is None else _mapping(extra, "extra")
    estimate = float(values.mean())
    if se is None:
        se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.nan
    se, formula = _real(se, "se"), _real(formula, "formula")
    verdict = judge(kind, estimate, se, formula, z, atol)
    return CheckResult(name, label, statement, kind, formula, estimate, se, float(z),
                       float(atol), verdict, int(values.size), MappingProxyType(dict(params)),
                       flag, MappingProxyType(dict(extra)))


def run_replicates(step: Callable, n_reps, rng=None, *, chunk=50, progress=False, desc=""):
    """Run ``step(rng, k)`` over ``n_reps`` replicates in chunks; concatenate its outputs.

    Parameters
    ----------
    step : callable
        ``step(generator, k)`` simulates ``k`` replicates and returns a dict of
        arrays of length ``k`` (per-replicate statistics).
    n_reps : int
        Number of replicates, >= 2 (a standard error needs two).
    rng : None, int, SeedSequence or Generator
        Chunk ``j`` uses the ``j``-th generator spawned from ``rng``, so the
        results depend on ``rng`` and ``chunk`` only.
    chunk : int
        Replicates per call of ``step`` (bounds memory).
    progress : bool
        Show a progress bar (tqdm; also hidden when stderr is not a terminal).
    desc : str
        Label of the progress bar.

    Returns
    -------
    dict of ndarray
    """
    check_callable(step, "step", "step(generator, k) -> dict of arrays of length k")
    n_reps = check_int_scalar(n_reps, "n_reps", minimum=2)
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    progress = check_bool(progress, "progress")
    desc = _text(desc, "desc")
    sizes = [min(chunk, n_reps - start) for start in range(0, n_reps, chunk)]
    children = as_generator(rng).spawn(len(sizes))
    parts = []
    for child, k in _progress(list(zip(children, sizes, strict=True)), progress, desc, n_reps):
        parts.append(_step_output(step(child, k), k, parts[0] if parts else None))
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _step_output(out, k, first):
    """What ``step`` returned: a dict of arrays of length k, with the keys of the first call."""
    if not isinstance(out, Mapping) or not out:
        raise TypeError(f"step must return a non-empty dict of arrays, got {type(out).__name__}")
    if first is not None and set(out) != set(first):
        raise ValueError(f"step returned keys {sorted(first)} first, then {sorted(out)}")
    arrays = {key: np.asarray(value) for key, value in out.items()}
    for key, value in arrays.items():
        if value.ndim == 0 or value.shape[0] != k:
            raise ValueError(f"step must return arrays of length k = {k} (one per replicate); "
                             f"{key!r} has shape {value.shape}")
    return arrays


def _progress(items, enabled, desc, total):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="rep", disable=None, leave=False)

    def gen():
        try:
            for child, k in items:
                yield child, k
                bar.update(k)
        finally:
            bar.close()

    return gen()
