"""The wheel works from an installation, not only from the source tree.

One test builds the wheel (``python -m build --wheel --no-isolation``) from a
temporary copy of the files the build reads, installs it with its dependencies
from the package index into a fresh virtual environment without the system's
site-packages and without torch, and runs ebfl there: ``ebfl --version``, the
import of every module of the estimation core, the data tables (dataset
manifests, the papers' numbers) read from the installed package, and the demo.
It skips only when pip cannot reach the package index.

It is kept lean for CI (one venv, one ``pip install``, two interpreters):
the venv is made without pip (the test's own pip installs into it with
``--python``), nothing is byte-compiled, and the demo runs with
``NUMBA_DISABLE_JIT=1``, since Numba's first compilation of the demo's kernels
would add some ten seconds of CPU to a test about packaging (the compiled
kernels are what the rest of the suite runs).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What the wheel is built from (MANIFEST.in only matters to an sdist). Copying these
#: instead of `git ls-files` works the same in a clone and in an unpacked tarball, and
#: includes a new module not yet committed.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "ebfl", "data")
#: Build products and caches that may lie in a working tree.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "*.egg-info",
                                 "build", "dist", ".*")
#: Modules behind an extra: ``learning`` (torch: the library's layer and each paper's torch
#: modules) and ``flower`` (flwr).
OPTIONAL = ("ebfl.learning.torch", "ebfl.fedhdp.algorithm", "ebfl.generative.algorithm",
            "ebfl.perada.algorithm", "ebfl.perada.dp", "ebfl.perada.generalization",
            "ebfl.flower.runtime", "ebfl.flower.loopback")
#: What pip prints when it cannot reach the index (then the test skips).
NETWORK_ERRORS = ("NewConnectionError", "Failed to establish a new connection",
                  "Temporary failure in name resolution", "Name or service not known",
                  "Network is unreachable", "No route to host", "ConnectTimeoutError",
                  "ProxyError", "Max retries exceeded", "Could not fetch URL")

# Run in the venv (cwd outside the source tree, so `import ebfl` finds the installed one).
CHECKS = r"""
import importlib, importlib.metadata, json, sys
from pathlib import Path

import ebfl

optional, tables = json.loads(sys.argv[1])
package = Path(ebfl.__file__).parent
assert package.is_relative_to(sys.prefix), f"ebfl imported from {package}, not the venv"

# Every module of the estimation core imports without torch (or flwr).
modules = sorted(".".join(("ebfl", *p.relative_to(package).with_suffix("").parts))
                 .removesuffix(".__init__") for p in package.rglob("*.py"))
core = [m for m in modules if not any(m == o or m.startswith(o + ".") for o in optional)]
for name in core:
    importlib.import_module(name)
assert "torch" not in sys.modules and "flwr" not in sys.modules
for dist in ("torch", "flwr"):
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        raise AssertionError(f"{dist} is installed in the venv")
for name in optional:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        assert "pip install 'ebfl[" in str(exc), (name, str(exc))  # says which extra
    else:
        raise AssertionError(f"{name} imported without its extra")

# The data tables come from the installed package.
from ebfl._paths import DATA, paper_numbers
from ebfl.datasets import manifest

assert DATA == package / "_data", DATA
assert sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file()) == tables
assert manifest("mnist")["directory"] == "mnist"
assert len(paper_numbers("generative_framework_e1")) > 0

from ebfl.cli import main

print(f"--- {len(core)} core modules imported", flush=True)
sys.exit(main(["demo"]))
"""


def _run(argv, **kwargs):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)


def _data_tables():
    """The tables the wheel must carry: data/manifests/*.json, data/paper_numbers/*.csv."""
    return sorted([f"manifests/{p.name}" for p in (ROOT / "data" / "manifests").glob("*.json")]
                  + [f"paper_numbers/{p.name}"
                     for p in (ROOT / "data" / "paper_numbers").glob("*.csv")])


def test_package_list_names_every_package():
    """pyproject.toml lists the packages by hand (to add ``ebfl._data``): none is forgotten."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ebfl").rglob("*.py")
             if "__pycache__" not in p.parts}
    assert set(config["packages"]) == found | {"ebfl._data"}
    assert config["package-dir"] == {"ebfl._data": "data"}


def test_wheel_installs_and_runs(tmp_path):
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=IGNORED)
        elif (ROOT / name).is_file():
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    built = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist,
                  src], cwd=src, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    version = wheel.name.split("-")[1]

    # What the wheel holds: the package, its tables, its metadata; nothing else.
    names = zipfile.ZipFile(wheel).namelist()
    modules = sorted(str(p.relative_to(src)) for p in (src / "ebfl").rglob("*.py"))
    assert sorted(n for n in names if n.endswith(".py")) == modules
    assert sorted(n.removeprefix("ebfl/_data/") for n in names
                  if n.startswith("ebfl/_data/")) == _data_tables()
    stray = [n for n in names if not (n.startswith(("ebfl/", f"ebfl-{version}.dist-info/")))
             or "__pycache__" in n]
    assert not stray, stray  # e.g. tests/, notebooks/, benchmarks/, docs/, data/

    # A fresh venv without the system's site-packages; pip comes from this environment.
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    ebfl_cmd = venv / ("Scripts/ebfl.exe" if os.name == "nt" else "bin/ebfl")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    pip = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-compile",
                "--disable-pip-version-check", "--no-input", "--quiet", "--retries", "1",
                "--timeout", "60", wheel], cwd=tmp_path, env=env, timeout=900)
    if pip.returncode != 0:
        if any(e in pip.stdout + pip.stderr for e in NETWORK_ERRORS):
            pytest.skip("pip cannot reach the package index to install the wheel's "
                        "dependencies: " + pip.stderr.strip().splitlines()[-1])
        pytest.fail("pip install of the wheel failed:\n" + pip.stdout[-3000:]
                    + pip.stderr[-3000:])

    shown = _run([ebfl_cmd, "--version"], cwd=tmp_path, env=env, timeout=300)
    assert (shown.returncode, shown.stdout) == (0, f"ebfl {version}\n"), shown.stderr

    checks = _run([python, "-c", CHECKS, json.dumps([OPTIONAL, _data_tables()])], cwd=tmp_path,
                  env={**env, "NUMBA_DISABLE_JIT": "1"}, timeout=600)
    assert checks.returncode == 0, checks.stdout[-3000:] + checks.stderr[-5000:]
    out = checks.stdout
    assert "core modules imported" in out
    assert "Gaussian: m = 10000 clients, n = 15 samples each" in out
    assert "Beta-Bernoulli: m = 10000 clients, n = 14 trials each" in out
    assert out.count("What the numbers show:") == 2
