"""The Flower runtime (Simulation Engine) against the in-process runtime.

One simulation runs every algorithm and protocol one after the other on the
same six nodes (one Ray start-up); each must end with the same final server and
client arrays as :func:`ebfl.federated.run` on the same job. Ray's servers must
listen on loopback only, and no process may outlive the simulation.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                   "pip install 'ebfl[flower]'")
psutil = pytest.importorskip("psutil")

from ebfl.federated import run  # noqa: E402
from ebfl.flower.jobs import ALGORITHMS, build_job  # noqa: E402
from ebfl.flower.runtime import max_abs_diff, parse_failures, simulate  # noqa: E402

pytestmark = pytest.mark.flower

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
#: The issue's acceptance bound; the runtimes agree bit for bit here.
TOLERANCE = 1e-5
FAILURES = {1: {0, 4}}


def _descendants():
    return psutil.Process(os.getpid()).children(recursive=True)


class _ListenWatch(threading.Thread):
    """Polls the listening sockets of this process and its descendants."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.stop = set(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            for proc in [psutil.Process(os.getpid()), *_descendants()]:
                try:
                    for conn in proc.net_connections(kind="inet"):
                        if conn.status == psutil.CONN_LISTEN:
                            self.seen.add((proc.name(), conn.laddr.ip))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            time.sleep(0.3)


def _jobs():
    jobs = []
    for name in ALGORITHMS:
        s = {"algorithm": name, "clients": 6, "rounds": 3, "local-steps": 3,
             "clients-per-round": 3}
        if name == "dp-pfl":  # private (each device's noise), with an Omega-step after round 2
            s.update({"inner": 2, "epsilon": 8.0})
        jobs.append(s)
    return jobs


def _simulate():
    before = {p.pid for p in _descendants()}
    watch = _ListenWatch()
    watch.start()
    try:
        results = simulate(_jobs(), failures=FAILURES)
    finally:
        watch.stop.set()
        watch.join()
    deadline = time.monotonic() + 30
    while (left := [p for p in _descendants() if p.pid not in before and p.is_running()
                    and p.status() != psutil.STATUS_ZOMBIE]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return results, watch.seen, left


def _agreement(flower, local):
    """Whether a Flower run and the in-process run agree (an AssertionError if not)."""
    assert max_abs_diff(flower, local) <= TOLERANCE
    assert len(flower.history) == len(local.history) == 3
    for a, b in zip(flower.history, local.history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=TOLERANCE, nan_ok=True), key
    # the failures: sampled clients 0 and 4 do not reply in round 2 (0-based 1)
    sampled = flower.history[1]["clients"]
    assert flower.history[1]["replies"] <= sampled
    for key, values in flower.metrics.items():
        np.testing.assert_allclose(values, local.metrics[key], atol=TOLERANCE, err_msg=key)


# The dp-pfl job calibrates its noise by the paper's Theorem 5, whose conditions fail in
# this small setting (warned, and tested in test_dppfl_accounting.py); here the subject is
# that the two runtimes agree.
@pytest.mark.filterwarnings("ignore::ebfl.dppfl.accounting.CalibrationConditionWarning")
def test_flower_equals_in_process_and_ray_stays_on_loopback():
    """Every algorithm and protocol in one simulation (one Ray start-up), each against
    the in-process run; then Ray's sockets and processes.

    One test rather than one per algorithm: under ``pytest -n 2`` a module fixture
    would run the simulation once per worker (pytest-xdist's ``loadgroup`` does not
    group tests under pytest 9), which doubled its cost."""
    results, seen, left = _simulate()
    failed = {}
    for settings, flower in zip(_jobs(), results, strict=True):
        job = build_job(settings)
        local = run(job.algorithm, job.data, job.config, failures=FAILURES)
        try:
            _agreement(flower, local)
        except AssertionError as exc:
            failed[settings["algorithm"]] = str(exc)[:500]
    assert not failed, failed
    assert len(results) == len(ALGORITHMS)
    assert seen, "no listening socket observed during the simulation"
    assert {ip for _, ip in seen} <= LOOPBACK, sorted(seen)
    assert not left, [p.name() for p in left]


def test_parse_failures():
    assert parse_failures("1:0, 2:3,1:2") == {1: {0, 2}, 2: {3}}
    assert parse_failures("") == {}
    with pytest.raises(ValueError, match="round:client"):
        parse_failures("1-0")


def test_cli_compare_json(tmp_path, capfd):
    """The issue's command: one JSON object on stdout, the runtimes agree, a figure.

    In process (``main``), which spares a second interpreter its imports; capfd reads
    file descriptor 1, so anything Ray or Flower printed there would break the JSON as
    in a terminal. The real process is ``test_cli_bad_job_is_one_error_line``."""
    from ebfl.cli import main

    code = main(["flower", "simulate", "fedavg", "--dataset", "digits", "--clients", "6",
                 "--rounds", "3", "--compare", "--json", "--plot", str(tmp_path)])
    out = capfd.readouterr()
    assert code == 0, out.err[-2000:]
    payload = json.loads(out.out)
    assert payload["figures"] == [str(tmp_path / "flower_fedavg.png")]
    assert (tmp_path / "flower_fedavg.png").stat().st_size > 10_000
    assert payload["max_abs_diff"] <= TOLERANCE
    assert len(payload["flower"]["history"]) == len(payload["in_process"]["history"]) == 3
    assert payload["flower"]["history"][-1]["accuracy"] == pytest.approx(
        payload["in_process"]["history"][-1]["accuracy"], abs=TOLERANCE)
    assert all(h["bytes_down"] > 0 and h["bytes_up"] > 0 for h in payload["flower"]["history"])


def test_cli_bad_job_is_one_error_line():
    """``python -m ebfl.cli flower simulate`` as a real process (its stdout, stderr and
    exit status as a shell sees them)."""
    out = subprocess.run([sys.executable, "-m", "ebfl.cli", "flower", "simulate",
                          "eb-gaussian", "--dataset", "digits"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.startswith("error:") and out.stderr.count("\n") == 1, out.stderr
