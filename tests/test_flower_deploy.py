"""A Flower deployment on loopback: SuperLink, SuperNodes and ``flwr run`` as processes.

The app comes from :func:`ebfl.flower.deploy.write_app`; the processes are
Flower's own commands, started by :class:`ebfl.flower.loopback.LoopbackFederation`
as the deployment guide (docs/guide/flower.md) says, with every address on
127.0.0.1 and free ports picked at run time. Each test stops every process it
started (and their children) by PID and checks that none is left and that none
listened on anything but loopback.
"""

import io
import pickle
import signal
import sys
import time
import tomllib
import zipfile

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                   "pip install 'ebfl[flower]'")
pytest.importorskip("torch", reason="the deployed jobs are learning jobs: "
                                    "pip install 'ebfl[learning]'")
pytest.importorskip("psutil", reason="finding every process Flower started needs psutil")

from flwr.cli.build import build_fab_from_disk  # noqa: E402
from flwr.cli.config_utils import load_and_validate  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402
from flwr.supercore.object_ref import load_app  # noqa: E402

from ebfl.federated import run  # noqa: E402
from ebfl.federated.tree import flatten  # noqa: E402
from ebfl.flower.deploy import FLOWER_OPTIONS, connection_toml, write_app  # noqa: E402
from ebfl.flower.jobs import build_job  # noqa: E402
from ebfl.flower.loopback import LoopbackFederation  # noqa: E402
from ebfl.flower.runtime import FLOWER_KEYS  # noqa: E402

#: A run must end within this many seconds (each takes 40-80 s on two busy cores).
RUN_LIMIT = 300


@pytest.fixture
def federation(tmp_path, request):
    fed = LoopbackFederation(tmp_path, request.param)
    try:
        yield fed.start()
    finally:
        fed.stop()
    left = fed.alive()
    assert not left, f"processes left running: {[(p.pid, p.name()) for p in left]}"
    assert any(port == fed.port for _, _, port in fed.seen), "the socket watch saw nothing"
    wide = fed.wide()
    assert not wide, f"listening beyond loopback: {wide}"


def _result(path, fed):
    assert path.is_file(), ("no result written; flwr run log:\n" + fed.log("flwr-run")[-4000:])
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _max_diff(tree, reference):
    """Largest absolute difference between two trees of the same arrays."""
    a, b = flatten(tree), flatten(reference)
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in b)


# ------------------------------------------------------------------ tests


@pytest.mark.flower
@pytest.mark.parametrize("federation", [3], indirect=True)
def test_killed_supernode_is_left_out(federation, tmp_path):
    """AdaPeD on three SuperNodes, one SIGKILLed once its round-1 reply is in: the run
    still ends and matches the in-process run with that client failing in round 2.

    Round 1 aggregates all three replies and round 2 the two that arrive within
    round-timeout, so equal final server arrays check both the fault-free round and
    the fault. Every task runs in a fresh ClientApp process, so the evaluation sees
    the personal models only through the state each SuperNode kept in Context.state;
    it averages the two clients that answer, each equal to the in-process run's.
    (One deployment test rather than a fault-free one beside it: each task costs a
    few seconds of start-up, and the dead node another minute, so CI pays for one.)"""
    job = {"algorithm": "adaped", "clients": 3, "rounds": 2, "local-steps": 2,
           "eval-every": 2, "seed": 1}
    result_path = tmp_path / "result.pkl"
    # The phase after the kill ends when the SuperLink marks the dead node offline (no
    # heartbeat for about 60 s) and answers for it with an error; round-timeout only has
    # to be well above a live node's answer time (a fresh process per task: 5-15 s on 2
    # idle cores, over a minute beside two CPU-burning processes).
    app = write_app(tmp_path / "app", {**job, "result-path": str(result_path),
                                       "round-timeout": 240.0},
                    superlink=federation.superlink)
    victim, killed = 2, []

    def kill_after_round_one():
        if federation.progress(victim, "train")[1] >= 1:  # its round-1 reply is in
            federation.kill_node(victim)
            killed.append(time.perf_counter())
            return True
        return False

    t0 = time.perf_counter()
    federation.wait_run(federation.flwr_run(app), RUN_LIMIT, until=kill_after_round_one)
    wall = time.perf_counter() - t0
    assert killed, "the SuperNode was never killed"
    assert federation.nodes[victim].returncode == -signal.SIGKILL
    got = _result(result_path, federation)
    assert [(h["round"], h["clients"], h["replies"], h["answered"]) for h in got.history] \
        == [(2, 3, 2, 2)]
    # who: the victim's round-2 reply (0-based round 1) was left out, and it did not evaluate
    assert [(h["left_out_rounds"], h["left_out"], h["not_answered"]) for h in got.history] \
        == [([1], [victim], [victim])]
    assert np.isfinite(got.history[0]["accuracy"])
    assert all(np.all(np.isfinite(np.asarray(v))) for v in flatten(got.server).values())

    ref_job = build_job(job)
    ref = run(ref_job.algorithm, ref_job.data, ref_job.config, failures={1: {victim}})
    assert _max_diff(got.server, ref.server) <= 1e-6
    live = [c for c in range(3) if c != victim]
    assert np.isnan(got.metrics["accuracy"][victim])
    np.testing.assert_allclose(got.metrics["accuracy"][live], ref.metrics["accuracy"][live],
                               rtol=0, atol=1e-6)
    print(f"fault run: {wall:.1f} s, killed at {killed[0] - t0:.1f} s")


# ------------------------------------------------------------------ the app files


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # in flwr
def test_write_app_files(tmp_path):
    odd_path = 'out "a"\\b\n\x7f é.pkl'  # quotes, backslash, control characters
    app = write_app(tmp_path / "app", {"algorithm": "fedavg", "clients": 4, "lr": 0.05,
                                       "round_timeout": 30, "result-path": odd_path},
                    superlink="10.0.0.5:9093")
    config = tomllib.loads((app / "pyproject.toml").read_text())
    flwr = config["tool"]["flwr"]["app"]
    assert flwr["components"] == {"serverapp": "ebfl_app.apps:server",
                                  "clientapp": "ebfl_app.apps:client"}
    assert "ebfl[flower,learning]" in config["project"]["dependencies"]
    run_config = flwr["config"]
    assert run_config["clients"] == 4 and run_config["lr"] == 0.05
    assert run_config["round-timeout"] == 30.0 and run_config["clients-per-round"] == ""
    assert run_config["result-path"] == odd_path
    assert set(FLOWER_OPTIONS) == set(FLOWER_KEYS) <= set(run_config)
    home = tomllib.loads((app / ".flwr" / "config.toml").read_text())
    assert home["superlink"]["ebfl"] == {"address": "10.0.0.5:9093", "insecure": True}
    # the settings come back as the same job
    assert build_job({k: v for k, v in run_config.items()
                      if k not in FLOWER_KEYS}).settings["lr"] == 0.05
    # Flower accepts the app as it is, without warnings, loads its two components, and
    # leaves the connection file out of the bundle it sends to the SuperLink
    config, warnings = load_and_validate(app / "pyproject.toml")
    assert warnings == []
    path = list(sys.path)
    try:  # load_app puts the app on sys.path and imports it: both undone below
        assert isinstance(load_app(flwr["components"]["serverapp"], ValueError, app), ServerApp)
        assert isinstance(load_app(flwr["components"]["clientapp"], ValueError, app), ClientApp)
    finally:
        sys.path[:] = path
        for name in [n for n in sys.modules if n.split(".")[0] == "ebfl_app"]:
            del sys.modules[name]
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))) as fab:
        names = set(fab.namelist())
    assert {"pyproject.toml", "README.md", "ebfl_app/apps.py"} <= names
    assert not any(".flwr" in n for n in names)


def test_write_app_refuses(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="directory"):
        write_app(tmp_path / "full", {"algorithm": "fedavg"})
    write_app(tmp_path / "full", {"algorithm": "fedavg"}, overwrite=True)
    assert (tmp_path / "full" / "x").read_text() == "x"
    with pytest.raises(ValueError, match="algorithm"):
        write_app(tmp_path / "a", {"algorithm": "nope"})
    with pytest.raises(ValueError, match="unknown job settings"):
        write_app(tmp_path / "b", {"algorithm": "fedavg", "epochs": 3})
    with pytest.raises(ValueError, match="superlink"):
        write_app(tmp_path / "c", {"algorithm": "fedavg"}, superlink="127.0.0.1")
    with pytest.raises(ValueError, match="round-timeout"):
        write_app(tmp_path / "d", {"algorithm": "fedavg", "round-timeout": 0})
    with pytest.raises(TypeError, match="clients"):
        write_app(tmp_path / "e", {"algorithm": "fedavg", "clients": [3]})
    with pytest.raises(TypeError, match="rounds"):
        write_app(tmp_path / "f", {"algorithm": "fedavg", "rounds": True})
    with pytest.raises(TypeError, match="result-path"):
        write_app(tmp_path / "g", {"algorithm": "fedavg", "result-path": 3})
    with pytest.raises(TypeError, match="overwrite"):
        write_app(tmp_path / "h", {"algorithm": "fedavg"}, overwrite="yes")
    with pytest.raises(TypeError, match="superlink"):
        write_app(tmp_path / "i", {"algorithm": "fedavg"}, superlink=9093)
    with pytest.raises(ValueError, match=r"clients must be an integer in \[1, "):
        write_app(tmp_path / "j", {"algorithm": "fedavg", "clients": 2**63})
    assert not any((tmp_path / n).exists() for n in "abcdefghij")
    assert connection_toml("[::1]:9093").count('"[::1]:9093"') == 1
