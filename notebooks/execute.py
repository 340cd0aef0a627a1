"""Re-execute the notebooks and store them with their outputs (``make notebooks``).

Each notebook runs top to bottom in a fresh kernel, from this folder, with
matplotlib's inline backend (as Jupyter shows figures), and is written back with
its outputs, execution counts 1, 2, ... and no timing metadata. Notebooks that
read a real dataset need it in the data home (``EBFL_DATA``).

    python notebooks/execute.py                          # every notebook
    python notebooks/execute.py notebooks/normal_means.ipynb
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path):
    """Run notebook ``path`` in a fresh kernel and store it with its outputs."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timings of an earlier run
    # The kernel's figures: inline PNGs, whatever backend the calling shell uses.
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(nb, path)


def main(argv=None):
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    for path in paths or sorted(HERE.glob("*.ipynb")):
        start = time.perf_counter()
        execute(path)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
