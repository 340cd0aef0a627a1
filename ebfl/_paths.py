"""Where the repository's small data tables live (``data/`` beside the package)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO_DATA = Path(__file__).resolve().parent.parent / "data"


def paper_numbers(name):
    """Read ``data/paper_numbers/<name>.csv`` (the papers' reported figures).

    Raises
    ------
    FileNotFoundError
        When ebfl runs from an installation without the source tree's ``data/``.
    """
    path = REPO_DATA / "paper_numbers" / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the papers' numbers ship with the source "
                                "tree (install ebfl from a clone with `pip install -e .`)")
    return pd.read_csv(path)
