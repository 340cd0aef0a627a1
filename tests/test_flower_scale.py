"""The Flower runtime at scale: start-up without a round trip to every node, a bounded
message store, and a ClientApp that imports only what its job needs.

The unit tests drive the server half's helpers with a stand-in ``Grid`` (no Flower
process); one simulation checks the whole runtime against the in-process run with more
nodes than a round samples; the import tests run a job's client work in a fresh
interpreter and look at ``sys.modules``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                   "pip install 'ebfl[flower]'")

from ebfl.federated import run  # noqa: E402
from ebfl.federated.eb_data import job_data, simulated_counts  # noqa: E402
from ebfl.flower import runtime as rt  # noqa: E402
from ebfl.flower.jobs import build_job  # noqa: E402


class _Reply:
    """What ``_exchange`` reads of a reply: the id of the message it answers."""

    def __init__(self, msg_id):
        self.metadata = type("M", (), {"reply_to_message_id": msg_id})()


class _Grid:
    """A stand-in Grid: nodes, and replies to every pushed message but those in ``silent``."""

    def __init__(self, nodes, silent=()):
        self.nodes, self.silent = list(nodes), set(silent)
        self.store, self.most, self.pushed = {}, 0, 0

    def get_node_ids(self):
        return set(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("no blocking exchange expected")

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            ids.append(f"m{self.pushed}")
            self.store[ids[-1]] = msg
            self.pushed += 1
        self.most = max(self.most, len(self.store))
        return ids

    def pull_messages(self, ids):
        got = [i for i in ids if i in self.store and self.store[i] not in self.silent]
        for i in got:
            del self.store[i]
        return [_Reply(i) for i in got]


def test_simulation_binds_clients_without_messages():
    grid = _Grid([50, 10, 30, 20])
    assert rt._Nodes(grid, 3, simulation=True).start(1.0, 3).node_of == {0: 10, 1: 20, 2: 30}
    with pytest.raises(TimeoutError, match="only 4 of 5 nodes"):  # never fewer, silently
        rt._Nodes(grid, 5, simulation=True).start(0.3, 5)


def test_exchange_keeps_a_window_and_leaves_out_the_late():
    grid = _Grid([], silent={"late"})
    messages = [f"x{i}" for i in range(10)] + ["late"]
    replies = rt._exchange(grid, messages, timeout=0.5, window=4)
    assert len(replies) == 10  # every message but the silent one, which timed out
    assert grid.most <= 4 and grid.pushed == 11


def test_elections_refuse_more_clients_than_counties(monkeypatch):
    monkeypatch.setattr("ebfl.federated.eb_data.election_federation",
                        lambda: simulated_counts(5, 4, seed=0))
    s = {"algorithm": "eb-beta-binomial", "dataset": "elections", "seed": 0}
    assert job_data({**s, "clients": 3}).n_clients == 3
    with pytest.raises(ValueError, match="clients must be <= 5"):
        job_data({**s, "clients": 6})


_CLIENT_WORK = """
import json, sys
from ebfl.flower.runtime import cached_job
from ebfl.federated import run
job = cached_job(json.loads(sys.argv[1]))
run(job.algorithm, job.data, job.config)  # every client-half call the ClientApp makes
print(json.dumps({m: m in sys.modules for m in ("torch", "numba", "scipy", "sklearn")}))
"""


def _imports(settings):
    env = {**os.environ, **rt.FLOWER_ENV}
    out = subprocess.run([sys.executable, "-c", _CLIENT_WORK, json.dumps(settings)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_eb_client_does_not_import_torch():
    got = _imports({"algorithm": "eb-beta-binomial", "clients": 6, "rounds": 2})
    assert not got["torch"] and not got["sklearn"], got


def test_torch_client_does_not_import_scipy_or_numba():
    pytest.importorskip("torch")
    got = _imports({"algorithm": "fedavg", "clients": 4, "rounds": 1, "local-steps": 1})
    assert got["torch"] and not (got["scipy"] or got["numba"] or got["sklearn"]), got


@pytest.mark.flower
def test_more_nodes_than_sampled_equals_in_process():
    """16 nodes, 2 sampled per round: no start-up message to every node, the same
    clients sampled from the same streams, and the same final arrays as in process."""
    pytest.importorskip("torch")
    settings = {"algorithm": "fedavg", "clients": 16, "clients-per-round": 2, "rounds": 3,
                "local-steps": 2, "eval-every": 3}
    flower = rt.simulate(settings)
    job = build_job(settings)
    local = run(job.algorithm, job.data, job.config)
    assert rt.max_abs_diff(flower, local) == 0.0
    assert [(h["clients"], h["replies"]) for h in flower.history] == [(2, 2)]
    np.testing.assert_array_equal(flower.metrics["accuracy"], local.metrics["accuracy"])
