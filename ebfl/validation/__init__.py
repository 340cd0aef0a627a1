"""Monte Carlo validation of the paper's estimation theorems.

>>> from ebfl.validation import validate
>>> report = validate(["known_beta"], n_reps=20, rng=0)
>>> [row.verdict for row in report.results]
['holds', 'holds']
"""

from __future__ import annotations

import numbers
import zlib
from dataclasses import dataclass

import numpy as np

from ebfl._validation import as_generator, check_bool, check_int_scalar, check_names
from ebfl.validation.engine import CheckResult, judge, make_result, run_replicates
from ebfl.validation.registry import CHECKS, Check

__all__ = ["CHECKS", "Check", "CheckResult", "ValidationReport", "judge", "make_result",
           "run_replicates", "validate"]


@dataclass(frozen=True)
class ValidationReport:
    """The rows of a validation run, in check order."""

    results: tuple[CheckResult, ...]

    def to_dicts(self) -> list[dict]:
        """JSON-serializable rows."""
        return [row.to_dict() for row in self.results]

    def to_frame(self):
        """The table as a pandas DataFrame (one row per comparison)."""
        import pandas as pd

        cols = ["name", "label", "kind", "formula", "estimate", "se", "tolerance", "verdict",
                "n_reps", "flag"]
        return pd.DataFrame([{c: row.to_dict()[c] for c in cols} for row in self.results])

    def counts(self) -> dict:
        """Number of rows per verdict."""
        out = {"holds": 0, "violated": 0, "inconclusive": 0}
        for row in self.results:
            out[row.verdict] += 1
        return out


def _check_seed(base, name):
    """Each check's stream depends on the seed and its name only, not on which others run."""
    return np.random.default_rng([base, zlib.crc32(name.encode())])


def validate(names=None, *, n_reps=None, quick=False, rng=0, progress=False):
    """Run Monte Carlo checks of the paper's statements.

    Parameters
    ----------
    names : str or iterable of str, optional
        Checks to run (see ``CHECKS``); a single name runs that check; all by
        default.
    n_reps : int, optional
        Replicates per check, >= 2; default each check's own (fewer with ``quick``).
    quick : bool
        Use the checks' quick replicate counts.
    rng : int >= 0, Generator or None
        Seed; check ``name`` uses a stream derived from it and ``name``.
    progress : bool
        Show progress bars.

    Returns
    -------
    ValidationReport
    """
    names = list(CHECKS) if names is None else check_names(names, "names", CHECKS, what="check")
    if n_reps is not None:
        n_reps = check_int_scalar(n_reps, "n_reps", minimum=2)
    quick = check_bool(quick, "quick")
    progress = check_bool(progress, "progress")
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool | np.bool_):
        base = check_int_scalar(rng, "rng", minimum=0)
    else:
        base = int(as_generator(rng).integers(2**63))
    rows = []
    for name in names:
        rows += CHECKS[name].run(n_reps, quick=quick, rng=_check_seed(base, name),
                                 progress=progress)
    return ValidationReport(tuple(rows))
