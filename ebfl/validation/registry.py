"""The registry of Monte Carlo checks and of the papers' validation figures.

A check is registered where its paper lives: the generative framework's in
:mod:`ebfl.generative.checks`, FedHDP's in :mod:`ebfl.fedhdp.checks`, DP-PFL's in
:mod:`ebfl.dppfl.checks`. Those packages sit above this layer (they import it to
register), so the registry names them in :data:`PROVIDERS` instead of importing
them, and imports them the first time anyone reads :data:`~ebfl.validation.CHECKS` or
:func:`figure_sets`: the same plug-in pattern as entry points, without packaging
metadata. Reading :data:`~ebfl.validation.CHECKS` therefore always shows every check, in
:data:`PROVIDERS` order.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CHECKS", "PROVIDERS", "Check", "figure_sets", "register", "register_figures"]

#: Modules that register checks or figures when imported, in the order of the table.
PROVIDERS = ("ebfl.generative.checks", "ebfl.dppfl.checks", "ebfl.fedhdp.checks",
             "ebfl.fedhdp.figures")


@dataclass(frozen=True)
class Check:
    """A registered check: its function, the statement it tests and its defaults."""

    name: str
    statement: str
    func: object
    defaults: dict
    n_reps: int
    quick_reps: int

    def run(self, n_reps=None, *, quick=False, rng=None, progress=False, **params):
        """Run the check; ``params`` override the defaults."""
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise TypeError(f"check {self.name!r} has no parameter(s) {sorted(unknown)}; "
                            f"it takes {sorted(self.defaults)}")
        n_reps = n_reps if n_reps is not None else (self.quick_reps if quick else self.n_reps)
        return self.func(n_reps, rng, progress, **{**self.defaults, **params})


_checks: dict[str, Check] = {}
_figures: dict[str, tuple[tuple[str, ...], object]] = {}
_loaded = False


def _load():
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a provider that reads CHECKS while importing must not recurse
    try:
        for module in PROVIDERS:
            importlib.import_module(module)
    except BaseException:
        _loaded = False
        raise


class _Checks(Mapping):
    """Read-only ``{name: Check}`` that imports the providers on first use."""

    def __getitem__(self, name):
        _load()
        return _checks[name]

    def __iter__(self):
        _load()
        return iter(_checks)

    def __len__(self):
        _load()
        return len(_checks)

    def __repr__(self):
        return f"CHECKS({', '.join(self)})"


#: Every registered check, by name (a read-only mapping).
CHECKS = _Checks()


def register(name, statement, defaults, n_reps=200, quick_reps=50):
    """Decorator: register ``func(n_reps, rng, progress, **params) -> list[CheckResult]``."""
    if name in _checks:
        raise ValueError(f"a check named {name!r} is already registered")

    def wrap(func):
        _checks[name] = Check(name, statement, func, dict(defaults), n_reps, quick_reps)
        return func
    return wrap


def register_figures(group, names, plot):
    """Register a paper's validation figures: ``plot(directory, *, names, n_reps, quick, rng,
    progress) -> list of paths`` draws any of ``names``."""
    _figures[group] = (tuple(names), plot)


def figure_sets():
    """``{group: (figure names, plot function)}`` of every registered set of figures."""
    _load()
    return dict(_figures)
