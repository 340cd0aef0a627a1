"""Test-wide set-up.

* The data home defaults to ../shared/data unless EBFL_DATA is set. ``.ci/run``
  sets EBFL_DATA itself; this default makes a plain ``pytest`` in a checkout
  next to ``shared/`` behave the same.
* A test that reads a real dataset skips when the data home does not hold it
  (:func:`requires_data`), and no test reaches the network: a fresh clone with
  no data home and no network passes.
* Under ``pytest -n N`` torch gets one intra-op thread per worker, and so do the
  BLAS and OpenMP pools (those of the worker and of the processes it starts).
* OpenMP threads wait for work passively (``OMP_WAIT_POLICY=passive``) unless
  the environment says otherwise: Numba's ``prange`` kernels run on GNU OpenMP,
  whose threads spin after each parallel region, and under ``-n 2`` on 2 cores
  one worker's spinning thread takes the core the other worker needs. Four
  Numba-heavy test files took 43-52 s with spinning and 15-17 s without
  (``pytest -n 2``, 2 cores, measured twice each, alternating).
* matplotlib draws with Agg unless ``MPLBACKEND`` says otherwise: the results'
  ``plot()`` methods make pyplot figures, and a test run on a desktop must open no
  window.
"""

import json
import os
import socket
import sys
from pathlib import Path

import pytest

# Before any OpenMP runtime is loaded (Numba's pool, torch's): it reads this at load.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# Before pyplot is first imported: it picks its backend then.
os.environ.setdefault("MPLBACKEND", "Agg")

_SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
if "EBFL_DATA" not in os.environ and _SHARED.is_dir():
    os.environ["EBFL_DATA"] = str(_SHARED)

_MANIFESTS = Path(__file__).resolve().parent.parent / "data" / "manifests"
#: Files a loader reads besides those its manifest lists: UCI's own zip of the HAPT
#: recordings (``load_hapt_raw``) and LEAF's JSON files (``load_leaf_femnist``).
_OTHER_FILES = {"uci-hapt-raw": ["hapt_uci.zip"], "leaf-femnist": ["data/train/*.json"],
                "uci-har": ["UCI HAR Dataset.zip",
                            "human+activity+recognition+using+smartphones.zip"]}


def has_dataset(folder):
    """Whether the data home holds dataset ``folder`` (e.g. ``"county-elections"``).

    Only the presence of a file the loader reads is checked, never its checksum
    (a corrupted copy must fail its test, not skip it), and nothing is downloaded.
    A multi-file dataset (MNIST) needs one accepted file of every member.
    """
    from ebfl.datasets import data_home

    infos = [json.loads(p.read_text()) for p in _MANIFESTS.glob("*.json")]
    matches = [i for i in infos if i["directory"] == folder]
    if len(matches) != 1:
        raise ValueError(f"no dataset manifest in {_MANIFESTS} has the directory {folder!r}")
    (info,) = matches
    home = data_home() / folder
    if "members" in info:
        return all(any((home / f).is_file() for f in member["files"])
                   for member in info["members"].values())
    patterns = list(info.get("files", ())) + _OTHER_FILES.get(folder, [])
    return any(path.is_file() for pattern in patterns for path in home.glob(pattern))


def missing_data_reason(folder):
    from ebfl.datasets import data_home

    return (f"EBFL_DATA lacks {folder} (nothing in {data_home() / folder}; tests never "
            "download: set EBFL_DATA to a data home that has it)")


def requires_data(*folders):
    """Mark: skip unless the data home holds every dataset of ``folders``."""
    missing = [f for f in folders if not has_dataset(f)]
    return pytest.mark.skipif(bool(missing), reason=missing_data_reason(missing[0])
                              if missing else "")


_THIS_MACHINE = {"localhost", "127.0.0.1", "::1", b"localhost", b"127.0.0.1", b"::1"}


@pytest.fixture(scope="session", autouse=True)
def _no_network():
    """Tests use the loopback server only: resolving any other host fails at once, so
    a test that would download a missing dataset fails loudly instead of waiting on
    (or using) the network. requests and pooch resolve through ``socket.getaddrinfo``."""
    resolve = socket.getaddrinfo

    def this_machine_only(host, *args, **kwargs):
        if host not in _THIS_MACHINE:
            raise OSError(f"tests must not use the network (a connection to {host!r}): a "
                          "test that needs a dataset skips when the data home lacks it")
        return resolve(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket, "getaddrinfo", this_machine_only)
        yield


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


#: The thread-pool sizes a worker's child processes (notebook kernels, CLI runs, Flower
#: nodes) read at start-up; a value the user set is kept.
_ONE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@pytest.fixture(scope="session", autouse=True)
def _one_blas_and_openmp_thread_per_xdist_worker():
    """The same for the BLAS and OpenMP pools (numpy's and scipy's OpenBLAS,
    scikit-learn's k-means): under ``-n 2`` on 2 cores each pool's second thread waits
    on a busy core. A k-means fit on 300 points took 46 ms with two threads beside
    another job and 6 ms with one (``test_algorithm4_beats_local_with_a_clustered_
    population``: 25 s in the suite). Pools already loaded are limited through
    threadpoolctl (a scikit-learn dependency); those loaded later, and child
    processes, read the environment. Numba's ``prange`` kernels size their own pool
    (NUMBA_NUM_THREADS) and are left alone."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn absent: only the environment is set
        threadpool_limits = None
    with pytest.MonkeyPatch.context() as patch:
        for name in _ONE_THREAD_ENV:
            if name not in os.environ:
                patch.setenv(name, "1")
        if threadpool_limits is None:
            yield
        else:
            with threadpool_limits(limits=1):
                yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a test module (its models are tiny: one thread is
    faster, and immune to a busy machine's oversubscription); restored after."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
