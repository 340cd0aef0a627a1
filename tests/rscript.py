"""Running R peers from the tests: skip, saying why, where R or a package is missing.

The R packages are oracles only (GPL): the tests run them and compare numbers; ebfl never
copies or translates their code. CI machines have no R, so every test that needs it skips.
"""

import shutil
import subprocess

import pytest

#: Seconds an R process may take: generous, for a loaded machine.
R_TIMEOUT = 600


def require_r_package(package, hint=""):
    """Skip the calling test unless ``Rscript`` can load ``package``; return Rscript's path."""
    rscript = shutil.which("Rscript")
    if rscript is None:
        pytest.skip("R is not installed (Rscript not on PATH)")
    probe = subprocess.run([rscript, "-e", f"library({package})"], capture_output=True,
                           text=True, timeout=R_TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"the R package {package} is not installed{hint}")
    return rscript
