"""Every notebook under notebooks/ runs top to bottom (nbclient, a fresh kernel), and is
committed with its outputs (``make notebooks`` stores them), clean of local paths and warnings.

A notebook that reads a real dataset names it in its metadata,
``metadata["ebfl"]["requires_data"]`` (data-home folders such as
``"county-elections"``), and is skipped when the data home lacks it.
"""

import ast
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


#: What no stored output may show: a path of the machine that ran it (the checkout, a
#: virtualenv, a home or temporary folder) or a warning.
_LEAKS = ("/work/", "/home/", "/tmp/", ".venv", "site-packages", "Warning")


def _expects_output(source):
    """A code cell that prints, draws (pyplot, an image) or ends in a bare expression."""
    tree = ast.parse(source)
    calls = {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
             for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name | ast.Attribute)}
    draws = "plt." in source or bool(calls & {"print", "Image", "display", "show"})
    last = tree.body[-1] if tree.body else None
    shown = isinstance(last, ast.Expr) and not isinstance(last.value, ast.Call) \
        and not source.rstrip().endswith(";")
    return draws or shown


def _text_of(output):
    """The text an output shows (images left out: base64 can spell anything)."""
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback)
    data = output.get("data", {})
    return "\n".join(str(v) for k, v in data.items() if k.startswith("text/"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_with_clean_outputs(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "run it top to bottom once (make notebooks)"
    for number, cell in enumerate(code, 1):
        if _expects_output(cell.source):
            assert cell.outputs, f"code cell {number} has no stored output"
        for output in cell.outputs:
            assert output.output_type != "error", f"code cell {number} failed"
            text = _text_of(output)
            leaks = [leak for leak in _LEAKS if leak in text]
            assert not leaks, f"code cell {number} shows {leaks}: {text[:300]!r}"


def test_the_output_check_sees_what_a_cell_shows():
    assert _expects_output("x = 1\nprint(x)") and _expects_output("fig, ax = plt.subplots()")
    assert _expects_output("import pandas as pd\ndf = pd.DataFrame()\ndf")
    assert not _expects_output("import numpy as np\nx = np.arange(3)")
    assert not _expects_output("x = [1]\nx.append(2)")
    assert not _expects_output("x = 1\nx;")
