"""Test-wide set-up.

* The data home defaults to ../shared/data unless EBFL_DATA is set. ``.ci/run``
  sets EBFL_DATA itself; this default makes a plain ``pytest`` in a checkout
  next to ``shared/`` behave the same.
* Under ``pytest -n N`` torch gets one intra-op thread per worker.
"""

import os
import sys
from pathlib import Path

import pytest

_SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
if "EBFL_DATA" not in os.environ and _SHARED.is_dir():
    os.environ["EBFL_DATA"] = str(_SHARED)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread_per_xdist_worker():
    """N workers with torch's default of one thread per core oversubscribe the
    machine; with the tests' tiny models that made torch steps up to ten times
    slower (the notebook's runs beside two other jobs, 2 cores)."""
    torch = sys.modules.get("torch")  # imported at collection by the torch tests, if any
    if torch is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
