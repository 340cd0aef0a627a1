"""Test-wide set-up: point the data home at ../shared/data unless EBFL_DATA is set.

``.ci/run`` sets EBFL_DATA itself; this default makes a plain ``pytest`` in a
checkout next to ``shared/`` behave the same.
"""

import os
from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
if "EBFL_DATA" not in os.environ and _SHARED.is_dir():
    os.environ["EBFL_DATA"] = str(_SHARED)
