"""Packages whose public names are imported on first use (PEP 562).

``import ebfl`` and the command line's ``--help`` and ``--version`` then cost tens of
milliseconds instead of the seconds that SciPy's statistics and Numba's decorators take
to import; ``ebfl.ebnm``, ``from ebfl.eb import ebnm`` and ``dir(ebfl.eb)`` behave as
before. (The scientific-python ``lazy_loader`` package does the same; these twenty
lines of the standard library's ``importlib`` spare a dependency.)
"""

from __future__ import annotations

from importlib import import_module


def attach(package, names, submodules=()):
    """``(__getattr__, __dir__)`` for ``package``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : dict
        Public name -> the module (absolute) that defines it.
    submodules : iterable of str
        Subpackages or modules reachable as attributes (``ebfl.bounds``).
    """
    submodules = frozenset(submodules)

    def __getattr__(name):
        if name in names:
            value = getattr(import_module(names[name]), name)
        elif name in submodules:
            value = import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import sys

        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__():
        import sys

        return sorted(set(vars(sys.modules[package])) | set(names) | submodules)

    return __getattr__, __dir__
