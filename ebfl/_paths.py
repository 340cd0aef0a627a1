"""Where ebfl's small data tables are: the dataset manifests and the papers' numbers.

The repository keeps them in its top-level ``data/`` (``data/manifests/*.json``,
``data/paper_numbers/*.csv``; never datasets). A wheel carries them as package
data, ``ebfl/_data/`` (``pyproject.toml`` maps ``data/`` there). :data:`DATA` is
that folder of the installed package when it exists, else the source tree's
``data/`` (an editable install or a checkout on ``sys.path``, where nothing is
copied and an edited table is read at once). Beside them, where downloads and
caches go: :func:`user_cache`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DATA", "data_file", "import_pooch", "paper_numbers", "user_cache"]


def _data_root() -> Path:
    packaged = resources.files("ebfl") / "_data"  # ebfl is a regular package: a Path
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "data"


#: The folder holding ``manifests/`` and ``paper_numbers/``.
DATA = _data_root()


def data_file(*parts) -> Path:
    """Path of a table under :data:`DATA`, e.g. ``data_file("manifests", "mnist.json")``.

    Raises
    ------
    FileNotFoundError
        When there is no such table; the message lists the tables of that folder.
    """
    path = DATA.joinpath(*parts)
    if not path.is_file():
        folder = path.parent
        known = sorted(p.stem for p in folder.glob(f"*{path.suffix}")) if folder.is_dir() else []
        raise FileNotFoundError(f"no table {'/'.join(parts)} in {DATA}"
                                + (f"; there are: {', '.join(known)}" if known else ""))
    return path


def paper_numbers(name):
    """The papers' reported figures ``paper_numbers/<name>.csv`` as a DataFrame."""
    import pandas as pd

    return pd.read_csv(data_file("paper_numbers", f"{name}.csv"))


def import_pooch():
    """The ``pooch`` module, imported without its progress-bar warning.

    pooch imports ``tqdm.auto`` when it is imported; in a Jupyter kernel without
    ipywidgets that warns (``TqdmWarning: IProgress not found``) and falls back to
    the text progress bar, which is the bar ebfl asks for anyway. The warning says
    nothing about ebfl's data, so it is silenced at that import only.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import pooch
    return pooch


def user_cache() -> Path:
    """ebfl's per-user cache folder (pooch's ``os_cache``: the platform's convention)."""
    return Path(import_pooch().os_cache("ebfl"))
