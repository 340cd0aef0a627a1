"""Late joiners, leavers and silent nodes in a deployment, on a stand-in for the SuperLink.

:class:`FakeGrid` answers the ``Grid`` calls that the server half makes in a
deployment (``get_node_ids``, ``push_messages``, ``pull_messages``) by running the
real ``ClientApp`` of each node in this process, so that binding, the
``min-clients`` start and the ``left_out`` bookkeeping are checked in seconds,
without a SuperLink or any process. Events scheduled on a round run when the
server pushes that round's first training message: a node connects, leaves (the
SuperLink stops listing it and refuses messages for it) or dies (still listed, it
never answers, as a SIGKILLed SuperNode until the SuperLink marks it offline).
"""

import uuid
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                   "pip install 'ebfl[flower]'")
pytest.importorskip("torch", reason="the job is a learning job: pip install 'ebfl[learning]'")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

import ebfl.flower.runtime as runtime  # noqa: E402
from ebfl.federated import run  # noqa: E402
from ebfl.federated.faults import failures_of_history  # noqa: E402
from ebfl.federated.protocol import sample_clients  # noqa: E402
from ebfl.flower.deploy import write_app  # noqa: E402
from ebfl.flower.jobs import build_job  # noqa: E402
from ebfl.flower.runtime import _Nodes, client_app, max_abs_diff, run_server  # noqa: E402

M = 6
JOB = {"algorithm": "fedavg", "clients": M, "rounds": 4, "clients-per-round": 4,
       "local-steps": 2, "eval-every": 2, "seed": 3}


class FakeGrid:
    """The SuperLink's side of the ``Grid`` API, with nodes running in this process."""

    def __init__(self, run_config):
        self.run_config = dict(run_config)
        self.app = client_app()
        self.nodes, self.replies, self.events, self.started = {}, {}, {}, set()
        self._next = 1000

    def connect(self, cid):
        """A node of ``partition-id`` cid connects; its node id."""
        self._next += 17  # node ids that are not client ids
        self.nodes[self._next] = SimpleNamespace(
            online=True, registered=True, dead=False,
            context=Context(run_id=1, node_id=self._next,
                            node_config={"partition-id": cid, "num-partitions": M},
                            state=RecordDict(), run_config=self.run_config))
        return self._next

    def node_of(self, cid):
        return [n for n, v in self.nodes.items()
                if v.context.node_config["partition-id"] == cid][-1]

    def leave(self, cid):
        node = self.nodes[self.node_of(cid)]
        node.online = node.registered = False

    def kill(self, cid):
        self.nodes[self.node_of(cid)].dead = True

    def at(self, round_, event):
        self.events.setdefault(round_, []).append(event)

    # ---------------------------------------------------------- the Grid calls

    def get_node_ids(self):
        return [n for n, v in self.nodes.items() if v.online]

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            head = msg.content["ebfl"]
            if head["phase"] == "train" and int(head["round"]) not in self.started:
                self.started.add(int(head["round"]))
                for event in self.events.get(int(head["round"]), []):
                    event()
            node = self.nodes.get(msg.metadata.dst_node_id)
            if node is None or not node.registered:  # as the SuperLink: not stored
                ids.append("")
                continue
            msg.metadata.__dict__["_message_id"] = mid = uuid.uuid4().hex
            ids.append(mid)
            if node.dead:
                continue
            try:
                self.replies[mid] = self.app(msg, node.context)
            except Exception as exc:  # noqa: BLE001 - a ClientApp's failure is a reply
                self.replies[mid] = Message(Error(code=0, reason=str(exc)), reply_to=msg)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


@pytest.fixture(autouse=True)
def _server_process(monkeypatch):
    """What a ServerApp process has: its task's identity (every Message names it)."""
    monkeypatch.setattr(runtime, "DEPLOY_POLL", 0.005)
    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, key, value)


def _run_config(**options):
    return {**JOB, "round-timeout": 0.3, "hello-timeout": 0.2, **options}


def _pairs(history):
    return [pair for row in history for pair in zip(row["left_out_rounds"], row["left_out"],
                                                    strict=True)]


def test_late_joiner_leaver_and_dead_node_match_the_in_process_run():
    """Clients 0-3 have nodes at the start (min-clients 4); client 4's node joins
    during round 0 and takes part from round 1; in round 1 client 2's node leaves and
    client 1's dies; client 5 never has a node. Every sampled client without a live
    node is left out, and the in-process run with those failures ends with the same
    server state and the same ``left_out``."""
    grid = FakeGrid(_run_config(**{"min-clients": 4}))
    for cid in range(4):
        grid.connect(cid)
    grid.at(0, lambda: grid.connect(4))
    grid.at(1, lambda: (grid.leave(2), grid.kill(1)))
    got = run_server(grid, grid.run_config)

    job = build_job(JOB)
    cfg = job.config
    gone = {0: {4, 5}, 1: {1, 2, 5}, 2: {1, 2, 5}, 3: {1, 2, 5}}
    expected = [(r, int(c)) for r in range(cfg.n_rounds)
                for c in sample_clients(cfg, r) if int(c) in gone[r]]
    assert _pairs(got.history) == expected
    assert {c for _, c in expected} == {1, 2, 4, 5}  # each kind of loss was sampled
    assert [h["round"] for h in got.history] == [2, 4]
    # each row holds the rounds since the previous one
    assert [sorted(set(h["left_out_rounds"])) for h in got.history] == [[0, 1], [2, 3]]
    assert [h["not_answered"] for h in got.history] == [[1, 2, 5], [1, 2, 5]]
    assert [h["answered"] for h in got.history] == [3, 3]
    assert np.isnan(got.metrics["accuracy"][[1, 2, 5]]).all()
    assert np.isfinite(got.metrics["accuracy"][[0, 3, 4]]).all()
    last = sample_clients(cfg, 3)
    assert got.history[-1]["replies"] == sum(int(c) not in gone[3] for c in last)

    failures = failures_of_history(got.history)
    ref = run(job.algorithm, job.data, cfg, failures=failures)
    assert max_abs_diff(SimpleNamespace(server=got.server, clients={}),
                        SimpleNamespace(server=ref.server, clients={})) <= 1e-6
    for a, b in zip(got.history, ref.history, strict=True):
        assert a.keys() == b.keys()
        assert (a["left_out"], a["left_out_rounds"]) == (b["left_out"], b["left_out_rounds"])
        assert b["not_answered"] == []  # in process every client evaluates
    # the live clients evaluate as in process: their states went the same way
    live = [0, 3, 4]
    np.testing.assert_allclose(got.metrics["accuracy"][live], ref.metrics["accuracy"][live],
                               rtol=0, atol=1e-6)


def test_in_process_left_out_follows_the_failures_across_rows():
    job = build_job(JOB)
    cfg = job.config
    failures = {r: {int(sample_clients(cfg, r)[0])} for r in (0, 3)}
    res = run(job.algorithm, job.data, cfg, failures=failures)
    assert _pairs(res.history) == [(0, min(failures[0])), (3, min(failures[3]))]
    assert [h["left_out_rounds"] for h in res.history] == [[0], [3]]
    clean = run(job.algorithm, job.data, cfg)
    assert all(h["left_out"] == [] == h["left_out_rounds"] == h["not_answered"]
               for h in clean.history)


def test_every_client_is_needed_by_default():
    grid = FakeGrid(_run_config())
    for cid in range(M - 1):
        grid.connect(cid)
    with pytest.raises(TimeoutError, match="only 5 of 6 nodes connected.*one node per client"):
        run_server(grid, grid.run_config)
    with pytest.raises(TimeoutError, match="one node per client"):
        run_server(grid, {**grid.run_config, "min-clients": 6})


def test_min_clients_counts_bound_clients():
    """Six nodes, but one claims a client outside the job: five bound, too few for 6."""
    grid = FakeGrid(_run_config(**{"min-clients": 6}))
    for cid in (0, 1, 2, 3, 4, 9):
        grid.connect(cid)
    with pytest.raises(RuntimeError, match=r"no node answered for clients \[5\]"):
        run_server(grid, grid.run_config)


@pytest.mark.parametrize("bad", [0, 7, -1])
def test_min_clients_out_of_range_is_refused(bad):
    grid = FakeGrid(_run_config())
    with pytest.raises(ValueError, match="min-clients"):
        run_server(grid, {**grid.run_config, "min-clients": bad})


def test_two_nodes_for_one_client():
    grid = FakeGrid(_run_config())
    for cid in (0, 0, 1, 2, 3, 4):
        grid.connect(cid)
    with pytest.raises(ValueError, match="two nodes claim client 0"):
        _Nodes(grid, M, timeout=0.3).start(0.2, 5)


def test_a_late_claimant_takes_over_only_a_client_whose_node_has_gone():
    grid = FakeGrid(_run_config())
    first = [grid.connect(cid) for cid in range(M)]
    nodes = _Nodes(grid, M, timeout=0.3).start(0.2, M)
    assert nodes.node_of == dict(enumerate(first))
    second = grid.connect(0)  # client 0's node is still online: the newcomer is not used
    nodes.refresh()
    assert nodes.node_of[0] == first[0] and second in nodes.asked
    grid.leave(1)
    third = grid.connect(1)  # client 1's node has gone: the newcomer serves client 1
    nodes.refresh()
    assert nodes.node_of[1] == third
    assert nodes.reachable(range(M)) == list(range(M))
    grid.leave(3)
    nodes.refresh()
    assert nodes.reachable([5, 3, 2]) == [5, 2]


def test_write_app_min_clients(tmp_path):
    import tomllib

    def config(app):
        return tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"][
            "config"]

    assert config(write_app(tmp_path / "a", {"algorithm": "fedavg", "clients": 20}))[
        "min-clients"] == ""
    assert config(write_app(tmp_path / "b", {"algorithm": "fedavg", "clients": 20,
                                             "min_clients": 18}))["min-clients"] == 18
    with pytest.raises(ValueError, match=r"min-clients must be an integer in \[1, 20\], got 21"):
        write_app(tmp_path / "c", {"algorithm": "fedavg", "clients": 20, "min-clients": 21})
    with pytest.raises(ValueError, match="min-clients"):
        write_app(tmp_path / "d", {"algorithm": "fedavg", "min-clients": 0})
    with pytest.raises(TypeError, match="min-clients"):
        write_app(tmp_path / "e", {"algorithm": "fedavg", "min-clients": True})
    with pytest.raises(TypeError, match="min-clients"):
        write_app(tmp_path / "f", {"algorithm": "fedavg", "min-clients": "18"})
    assert not any((tmp_path / n).exists() for n in "cdef")
