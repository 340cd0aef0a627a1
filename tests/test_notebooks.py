"""Every notebook under notebooks/ runs top to bottom (nbclient, a fresh kernel).

A notebook that reads a real dataset names it in its metadata,
``metadata["ebfl"]["requires_data"]`` (data-home folders such as
``"county-elections"``), and is skipped when the data home lacks it.
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import has_dataset, missing_data_reason

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
#: Calls that read a dataset from the data home, and the dataset they read.
_LOADERS = {"load_county_returns(": "county-elections", "election_experiment(": "county-elections",
            "load_hapt_raw(": "uci-hapt-raw", "hapt_windows(": "uci-hapt-raw",
            "load_mnist(": "mnist", "load_fashion_mnist(": "fashion-mnist",
            "load_leaf_femnist(": "leaf-femnist"}


def _required_data(nb):
    return list(nb.metadata.get("ebfl", {}).get("requires_data", []))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebooks_declare_the_data_they_read(path):
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    read = {folder for call, folder in _LOADERS.items() if call in code}
    assert read <= set(_required_data(nb)), f"add {sorted(read)} to requires_data"
    for folder in _required_data(nb):
        has_dataset(folder)  # a folder no manifest knows raises


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    for folder in _required_data(nb):
        if not has_dataset(folder):
            pytest.skip(missing_data_reason(folder))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
