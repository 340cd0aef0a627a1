"""The Flower runtime: any :class:`~ebfl.federated.FederatedAlgorithm` as a Flower App.

:func:`server_app` wraps the server half in a ``ServerApp`` and
:func:`client_app` the client half in a ``ClientApp``; both build the job
(algorithm, data, :class:`~ebfl.federated.RunConfig`) from the run's scalar
``run_config`` through :func:`ebfl.flower.jobs.build_job`, so a run
configured in a Flower ``pyproject.toml`` and one started by
``ebfl flower simulate`` are the same job. Needs ``pip install 'ebfl[flower]'``.

How a run goes
--------------
1. *Binding.* Each client id is bound to one node. In a deployment the
   server waits up to ``hello-timeout`` seconds for one node per client, then
   asks every connected node once for its ``partition-id`` (its client id; one
   parallel round trip: each SuperNode answers on its own machine). With
   fewer nodes than clients it starts if at least ``min-clients`` (default:
   every client) are bound, and before each round and each evaluation it asks
   the nodes that connected since (only those), so a client whose node joins
   late takes part from its next sampled round; until then it counts as not
   answering. A node that claims a client whose node has gone takes the client
   over (its state starts afresh: a node keeps its client's state in memory).
   In a simulation the nodes are Flower's virtual nodes, alike but for their
   ids: client c is bound to the c-th smallest node id, with no message at
   all, and every message names its client, so the start-up costs nothing per
   node and a round touches only the nodes it needs.
2. *Rounds.* The server samples clients from its stream of the round (the same
   clients as in process), sends each sampled node ``broadcast(server, rc)``
   and, if the algorithm trains idle clients, the other nodes
   ``idle_message``. A node runs the client half for its one client, keeps its
   persistent state in ``Context.state`` and replies with its aggregation
   weight. The server aggregates the replies that arrived, in client-id order.
   In a deployment only bound nodes that the SuperLink lists as online are
   sent messages.
3. *Evaluation* every ``eval-every`` rounds: every node evaluates its
   predictor and returns its metrics.
4. *Collect* (optional, ``collect-states``): every node returns its persistent
   state, so that the final parameters can be compared with the in-process run.

Faults
------
A node that fails in a round (its ``ClientApp`` raises, or it does not answer
within ``round-timeout`` seconds) is left out of that round: the server
aggregates the replies that arrived (if none did, its state stays), the
node's persistent state stays as before the round (it is written only after the
client half returns), and the history records ``clients`` (sampled),
``replies`` (arrived) and who was left out: ``left_out`` and
``left_out_rounds`` list, pair by pair, every sampled client whose reply was not
aggregated since the previous row and its round (0-based, as in ``failures``),
as :func:`ebfl.federated.run` records the clients that its ``failures`` silence.
``failures`` rebuilt from these pairs replays the run in process (for an
algorithm that trains idle clients, only if no idle client missed its message:
those are not recorded). Privacy accounting is unaffected: a client's release
is privatized on the client before it leaves, and the accountants count every
round in which a client was sampled, whether or not its reply arrived (an
upper bound on what it released). A node that stops answering keeps being
sampled; its rounds count as failures. Evaluation averages the clients that
answered (``answered`` in the history; ``not_answered`` names the others, whose
metrics are NaN).

Messages
--------
Every message carries ``ConfigRecord`` ``ebfl`` (phase, round, client id) and
an ``ArrayRecord`` ``payload``: the algorithm's message, flattened
(``"mu/net.1.weight"``) to numpy arrays; torch tensors travel as their numpy
arrays and come back bit for bit.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import pickle
import time
from logging import INFO, WARNING
from pathlib import Path

import numpy as np

#: Environment of every Flower process ebfl starts: no telemetry, no update checks,
#: no dependency installs at run time, Ray's usage statistics off, and Ray on one
#: machine only: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 every Ray server listens on
#: 127.0.0.1 (by default Ray 2.55 binds the machine's network address and wildcards).
#: Ray's workers, which run every ClientApp, at the ordinary priority: Ray's default
#: niceness 15 lets any other busy process on the machine starve them (beside two
#: CPU-burning processes on 2 cores, a 6-client simulation's start-up took over 120 s).
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
              "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
              "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
              "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_worker_niceness": "0"}


def apply_flower_env():
    """Set :data:`FLOWER_ENV` in this process where not set already.

    Called on importing this module, before Flower and Ray are imported (Ray
    reads its settings once, at import).
    """
    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)


apply_flower_env()

try:
    import flwr  # noqa: E402, F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError("ebfl.flower.runtime needs Flower: pip install 'ebfl[flower]'",
                              name="flwr") from exc

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.logger import log  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from ebfl.federated.faults import check_failures, parse_failures  # noqa: E402
from ebfl.federated.protocol import RoundContext, sample_clients  # noqa: E402
from ebfl.federated.runtime import RunResult, history_row  # noqa: E402
from ebfl.federated.tree import flatten, tree_cat, tree_nbytes, unflatten  # noqa: E402
from ebfl.flower.deploy import check_min_clients  # noqa: E402
from ebfl.flower.jobs import build_job  # noqa: E402

__all__ = ["FLOWER_ENV", "SIM_WINDOW", "apply_flower_env", "cached_job", "client_app",
           "compare_runtimes", "decode", "encode", "max_abs_diff", "parse_failures",
           "plot_comparison", "server_app", "simulate"]

STATE_KEY = "ebfl-client-state"  # the node's persistent client state in Context.state
FLOWER_KEYS = ("round-timeout", "hello-timeout", "min-clients", "result-path",
               "collect-states", "failures")
#: Messages a simulation keeps in Flower's message store at once (see ``_exchange``).
SIM_WINDOW = 64
#: Seconds between a deployment's pulls of replies from the SuperLink (each pull is a
#: request to it; the SuperNodes themselves look for messages every few seconds).
DEPLOY_POLL = 0.5


class SimulatedFailure(RuntimeError):
    """Raised by a client told to fail in a round (``failures`` in the run config)."""


# ------------------------------------------------------------------ transport

def encode(tree):
    """An ``ArrayRecord`` of a tree of numpy arrays or torch tensors (flattened keys)."""
    arrays = {}
    for name, value in flatten(tree).items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        arrays[name] = Array(np.ascontiguousarray(value))
    return ArrayRecord(arrays)


def decode(record, array_api):
    """The tree of an ``ArrayRecord`` written by :func:`encode` (torch tensors if
    ``array_api == "torch"``)."""
    flat = {name: arr.numpy() for name, arr in record.items()}
    if array_api == "torch":
        import torch

        flat = {k: torch.from_numpy(np.array(v)) for k, v in flat.items()}
    return unflatten(flat)


def _content(phase, round_=-1, payload=None, **extra):
    rd = RecordDict({"ebfl": ConfigRecord({"phase": phase, "round": int(round_), **extra})})
    rd["payload"] = encode(payload or {})
    return rd


def _job_settings(run_config):
    return {k: v for k, v in run_config.items() if k not in FLOWER_KEYS}


# ------------------------------------------------------------------ client half

def client_app(settings=None, *, simulation=False):
    """A ``ClientApp`` running the client half of a job.

    The job comes from ``settings`` (a simulation in this process; a list of
    jobs that the server runs one after the other) or else from the run's
    ``run_config`` (a deployment: the app's ``pyproject.toml`` and
    ``flwr run --run-config``). The node's client id is its ``partition-id``
    (node config); with ``simulation``, the client that each message names
    (the server binds clients to Flower's virtual nodes, see the module
    docstring). Its data is the job's data of that one client; its persistent
    state lives in ``Context.state`` between rounds.
    """
    app = ClientApp()
    listed = None if settings is None else _as_list(settings)

    def handle(msg, context):
        head = msg.content["ebfl"]
        index = int(head["job"])
        run_config = dict(context.run_config) if listed is None else dict(listed[index])
        job = cached_job(run_config)
        alg, cfg = job.algorithm, job.config
        cid = _client_of(head, context, cfg.n_clients, simulation)
        data = job.data.subset([cid])
        phase, r = head["phase"], int(head["round"])
        if phase == "hello":
            return _reply(msg, {"client": cid})
        failures = parse_failures(run_config.get("failures", ""))
        if phase in ("train", "idle") and cid in failures.get(r, ()):
            raise SimulatedFailure(f"client {cid} told to fail in round {r}")
        key = f"{STATE_KEY}-{index}"
        client = _load_state(context, key, alg, cfg, data, cid)
        message = decode(msg.content["payload"], alg.array_api)
        # the round's context for the client half ("collect" carries no round: -1)
        rc = RoundContext(cfg, r, np.array([cid])) if phase in ("train", "idle") else None
        reply, head_out = {}, {"client": cid, "phase": phase}
        with _numerics(alg):  # denormals flushed for torch, as the in-process engine does
            if phase == "train":
                reply = alg.client_train(message, client, data, rc)
                # the server learns each weight with the reply it weighs (no start-up query)
                head_out["weight"] = float(np.asarray(alg.client_weights(data),
                                                      dtype=np.float64)[0])
            elif phase == "idle":
                alg.client_idle(message, client, data, rc)
            elif phase == "evaluate":
                reply = alg.client_evaluate(message, client, data)
            elif phase == "collect":
                reply = client
            else:
                raise ValueError(f"unknown phase {phase!r}")
        if phase in ("train", "idle"):  # written only once the client half has returned
            context.state[key] = encode(client)
        return _reply(msg, head_out, reply)

    @app.query()
    def query(msg: Message, context: Context):
        return handle(msg, context)

    @app.train()
    def train(msg: Message, context: Context):
        return handle(msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context: Context):
        return handle(msg, context)

    return app


def _reply(msg, head, payload=None):
    rd = RecordDict({"ebfl": ConfigRecord(head)})
    rd["payload"] = encode(payload or {})
    return Message(rd, reply_to=msg)


_JOBS = {}  # this process's jobs, by their settings (see cached_job)


def cached_job(run_config):
    """The job of ``run_config`` (Flower options ignored), built once per process.

    A cache here and not in the ``ClientApp``'s closure: the Simulation Engine
    sends the app, pickled, with every task, so a closure's cache would arrive
    empty each time (and every task would rebuild the whole federation's data);
    this module stays imported in the worker between tasks.
    """
    settings = _job_settings(run_config)
    key = json.dumps(settings, sort_keys=True, default=str)
    if key not in _JOBS:
        _JOBS[key] = build_job(settings)
    return _JOBS[key]


def _client_of(head, context, n_clients, simulation):
    """The client a message is for: the one it names in a simulation, else the node's
    ``partition-id`` (a message naming another client is refused)."""
    if simulation:
        cid = int(head["client"])
    else:
        cid = int(context.node_config["partition-id"])
        if "client" in head and int(head["client"]) != cid:
            raise ValueError(f"a message for client {int(head['client'])} reached the node "
                             f"of partition-id {cid}")
    if not 0 <= cid < n_clients:
        raise ValueError(f"client {cid} outside the job's clients 0..{n_clients - 1}")
    return cid


def _load_state(context, key, alg, cfg, data, cid):
    if key in context.state:
        return decode(context.state[key], alg.array_api)
    return alg.init_clients(cfg, data, np.array([cid]))


def _numerics(alg):
    """The in-process engine's numerics (denormals flushed) for torch strategies."""
    if alg.array_api != "torch":
        return contextlib.nullcontext()
    from ebfl.learning.torch.engine import flush_denormals

    return flush_denormals()


# ------------------------------------------------------------------ server half

def server_app(settings=None, *, sink=None, simulation=False):
    """A ``ServerApp`` running the server half of a job.

    Parameters
    ----------
    settings : dict or list of dict, optional
        The job and the Flower options (``round-timeout``, ``collect-states``,
        ``failures``, ``result-path``); default: the run's ``run_config``. A
        list runs its jobs one after the other on the same nodes (the sink
        receives each result).
    sink : callable, optional
        Called with the :class:`~ebfl.federated.RunResult` at the end (in a
        simulation, the caller's process receives the result this way). The
        run config's ``result-path``, when set, also receives it as a pickle
        and ``<result-path>.json`` (the history).
    simulation : bool
        Bind clients to Flower's virtual nodes without a message (see the module
        docstring), and keep at most :data:`SIM_WINDOW` messages in Flower's
        message store at once; pair with ``client_app(..., simulation=True)``.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context):
        for index, run_config in enumerate([dict(context.run_config)] if settings is None
                                           else _as_list(settings)):
            result = run_server(grid, run_config, job=index, simulation=simulation)
            if sink is not None:
                sink(result)
            path = run_config.get("result-path")
            if path:
                _write_result(Path(str(path)), result)

    return app


def run_server(grid, run_config, *, job=0, simulation=False):
    """The server half's round loop on a Flower ``Grid`` (see the module docstring).

    ``job`` numbers the job among those the nodes run (their client states are
    kept apart); ``simulation`` as in :func:`server_app`.
    """
    built = cached_job(run_config)
    alg, cfg = built.algorithm, built.config
    # failures the clients would apply: checked against the run before any round starts
    check_failures(run_config.get("failures", ""), cfg, everyone=alg.all_clients_train)
    timeout = float(run_config.get("round-timeout", 120.0))
    window = SIM_WINDOW if simulation else None
    _msg = functools.partial(_message, job=job)
    _send = functools.partial(_exchange, grid, timeout=timeout, window=window)
    m = cfg.n_clients
    least = check_min_clients(run_config.get("min-clients", ""), m) or m
    nodes = _Nodes(grid, m, job=job, timeout=timeout, simulation=simulation)
    nodes.start(float(run_config.get("hello-timeout", 120.0)), least)
    weights = np.full(m, np.nan)  # each filled by the client's first reply
    server = alg.init_server(cfg)
    history, metrics, left_out = [], None, []
    t0 = time.perf_counter()
    for r in range(cfg.n_rounds):
        nodes.refresh()  # nodes that connected since: bound before the round's sampling
        sampled = sample_clients(cfg, r, everyone=alg.all_clients_train)
        message = alg.broadcast(server, RoundContext(cfg, r, sampled))
        out = [_msg(nodes.node_of[c], "train", r, message, c) for c in nodes.reachable(sampled)]
        # bytes_down counts every sampled client, as in process (where a failing client
        # still receives the broadcast), so that the two runtimes' rows compare
        traffic = {"clients": int(sampled.size), "replies": 0,
                   "bytes_down": tree_nbytes(message) * int(sampled.size), "bytes_up": 0}
        if alg.trains_idle:
            idle = np.setdiff1d(np.arange(m), sampled)
            if idle.size:
                idle_msg = alg.idle_message(server, RoundContext(cfg, r, idle))
                out += [_msg(nodes.node_of[c], "idle", r, idle_msg, c)
                        for c in nodes.reachable(idle)]
                traffic["bytes_down"] += tree_nbytes(idle_msg) * int(idle.size)
        replies = _arrived(_send(out), alg, "train", weights)
        left_out += [(r, int(c)) for c in sampled if int(c) not in replies]
        if replies:
            ids = np.array(sorted(replies))
            stacked = tree_cat([replies[c] for c in ids])
            traffic["replies"], traffic["bytes_up"] = int(ids.size), tree_nbytes(stacked)
            server = alg.aggregate(server, stacked, weights[ids], RoundContext(cfg, r, ids))
        elif alg.aggregate_empty:
            server = alg.aggregate(server, None, weights[:0],
                                   RoundContext(cfg, r, np.zeros(0, np.int64)))
        done = r + 1
        lost = [c for q, c in left_out if q == r]
        log(INFO, "%s round %d/%d: %d of %d sampled clients replied%s", alg.name, done,
            cfg.n_rounds, traffic["replies"], traffic["clients"],
            f"; left out: {lost[:20]}{' ...' if len(lost) > 20 else ''}" if lost else "")
        if done % cfg.eval_every == 0 or done == cfg.n_rounds:
            nodes.refresh()
            metrics = _evaluate(_send, alg, server, nodes, m, r, _msg)
            history.append(history_row(cfg, done, metrics, alg.summary(server), traffic,
                                       left_out))
            left_out = []
            log(INFO, "%s round %d: %s", alg.name, done,
                {k: round(v, 6) for k, v in history[-1].items()
                 if k in metrics and isinstance(v, float)})
    if metrics is None:
        metrics = _evaluate(_send, alg, server, nodes, m, cfg.n_rounds, _msg)
    clients = {}
    if str(run_config.get("collect-states", "false")).lower() in ("1", "true", "yes"):
        clients = _collect(_send, alg, nodes, m, _msg)
    return RunResult(server, clients, metrics, history, time.perf_counter() - t0,
                     cfg.to_dict())


def _as_list(settings):
    return [settings] if isinstance(settings, dict) else list(settings)


def _message(node, phase, round_, payload, client, *, job):
    return Message(_content(phase, round_, payload, client=int(client), job=int(job)),
                   dst_node_id=int(node),
                   message_type={"train": "train", "idle": "train",
                                 "evaluate": "evaluate"}.get(phase, "query"))


def _arrived(replies, alg, phase, weights=None):
    """{client id: reply tree} of the replies of ``phase`` that came without error
    (``weights``, if given, receives the weight each reply carries)."""
    out = {}
    for reply in replies:
        if reply.has_error() or reply.content["ebfl"]["phase"] != phase:
            continue
        head = reply.content["ebfl"]
        cid = int(head["client"])
        out[cid] = decode(reply.content["payload"], alg.array_api)
        if weights is not None:
            weights[cid] = float(head["weight"])
    return out


def _exchange(grid, messages, *, timeout, window=None):
    """Send ``messages`` and return the replies that arrived within ``timeout`` seconds.

    With ``window``, at most that many messages wait in Flower's message store at
    once, each with its own ``timeout`` from when it is sent. Why: Flower 1.41-1.42's
    Simulation Engine looks for each node's next message by scanning every message in
    the store, node after node, every 0.1 s, so a phase that sends one message to each
    of n nodes costs n x n checks per sweep; 3150 messages at once made a sweep take
    minutes. A window keeps a sweep at n x window checks.

    Without ``window`` (a deployment) every message is pushed at once and the
    replies are pulled every :data:`DEPLOY_POLL` seconds. A message the SuperLink
    refuses to store (its node has gone since the server listed it) gets an empty
    id and never a reply: it is dropped at once rather than waited for.
    """
    if not messages:
        return []
    if window is not None and len(messages) <= window:
        return list(grid.send_and_receive(messages, timeout=timeout))
    poll = 0.02 if window is not None else DEPLOY_POLL
    window = window or len(messages)
    waiting, pending, out = collections.deque(messages), {}, []
    while waiting or pending:
        if waiting and len(pending) < window:
            batch = [waiting.popleft() for _ in range(min(window - len(pending),
                                                          len(waiting)))]
            deadline = time.monotonic() + timeout
            pending.update(dict.fromkeys([i for i in grid.push_messages(batch) if i],
                                         deadline))
        got = list(grid.pull_messages(list(pending)))
        for reply in got:
            pending.pop(reply.metadata.reply_to_message_id, None)
        out += got
        now = time.monotonic()
        for late in [k for k, d in pending.items() if d <= now]:  # left out, as in Flower
            del pending[late]
        if not got and pending:
            time.sleep(poll)
    return out


def _wait_nodes(grid, m, timeout, least=None):
    """The connected nodes' ids, once m are, or once ``timeout`` s have passed and at
    least ``least`` (default m) are (TimeoutError if fewer)."""
    least = m if least is None else least
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < m:
        if time.monotonic() > deadline:
            if len(nodes) >= least:
                log(WARNING, "%d of %d nodes connected within %s s: starting with them "
                    "(min-clients %d); the others take part once they connect",
                    len(nodes), m, timeout, least)
                return nodes
            need = ("the job needs one node per client" if least == m else
                    f"the job needs at least {least} (min-clients)")
            raise TimeoutError(f"only {len(nodes)} of {m} nodes connected within {timeout} s; "
                               f"{need}")
        time.sleep(0.2)
    return nodes


class _Nodes:
    """Which node serves which client (see the module docstring's *Binding*).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    m : int
        The job's number of clients.
    job : int
        The job's number among those the nodes run.
    timeout : float
        Seconds a node has to answer the server's question for its client id.
    simulation : bool
        Flower's virtual nodes: client c is the c-th smallest node id; no message,
        no late joiners.

    Attributes
    ----------
    node_of : dict
        {client id: node id} of the bound clients.
    online : set
        The node ids the SuperLink listed at the last :meth:`refresh`.
    asked : set
        Every node id asked for its client id (each is asked once).
    """

    def __init__(self, grid, m, *, job=0, timeout=120.0, simulation=False):
        self.grid, self.m, self.job, self.timeout = grid, m, int(job), float(timeout)
        self.simulation = simulation
        self.node_of, self.online, self.asked = {}, set(), set()

    def start(self, wait, least):
        """Bind the clients of the nodes connected within ``wait`` seconds (at least
        ``least`` clients, else TimeoutError or RuntimeError)."""
        nodes = _wait_nodes(self.grid, self.m, wait, least)
        self.online = set(nodes)
        if self.simulation:  # Flower's virtual nodes differ only in their ids
            self.node_of = dict(enumerate(nodes[:self.m]))
            return self
        self._hello(nodes, initial=True)
        if len(self.node_of) < least:
            missing = sorted(set(range(self.m)) - set(self.node_of))
            need = "" if least == self.m else f" ({len(self.node_of)} bound, min-clients {least})"
            raise RuntimeError(f"no node answered for clients {missing[:10]}{need}")
        log(INFO, "bound %d of %d clients to their nodes", len(self.node_of), self.m)
        return self

    def refresh(self):
        """List the online nodes; ask those never asked before for their client id."""
        if self.simulation:
            return
        self.online = set(self.grid.get_node_ids())
        new = sorted(self.online - self.asked)
        if new:
            self._hello(new, initial=False)

    def reachable(self, clients):
        """Those of ``clients`` bound to an online node, in their order."""
        return [int(c) for c in clients if self.node_of.get(int(c)) in self.online]

    def _hello(self, nodes, *, initial):
        """Ask ``nodes`` their client id (``partition-id``) and bind them."""
        self.asked.update(nodes)
        hello = [Message(_content("hello", job=self.job), dst_node_id=int(n),
                         message_type="query") for n in nodes]
        for reply in _exchange(self.grid, hello, timeout=self.timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():  # e.g. a partition-id outside 0..m-1: that node is not used
                log(WARNING, "node %s did not join: %s", node, reply.error.reason)
                continue
            cid = int(reply.content["ebfl"]["client"])
            held = self.node_of.get(cid)
            if held is not None and held != node:
                if initial:
                    raise ValueError(f"two nodes claim client {cid} (partition-id); each "
                                     "client needs its own node")
                if held in self.online:
                    log(WARNING, "node %s claims client %d, which node %s serves: not used",
                        node, cid, held)
                    continue
                log(WARNING, "node %s takes over client %d from node %s, gone; the client's "
                    "state starts afresh", node, cid, held)
            elif not initial:
                log(INFO, "node %s joined late: client %d", node, cid)
            self.node_of[cid] = node


def _evaluate(send, alg, server, nodes, m, r, _msg):
    message = alg.evaluation_message(server)
    out = [_msg(nodes.node_of[c], "evaluate", r, message, c) for c in nodes.reachable(range(m))]
    got = _arrived(send(out), alg, "evaluate")
    names = sorted({k for v in got.values() for k in v})
    metrics = {k: np.full(m, np.nan) for k in names}
    for c, values in got.items():
        for k in names:
            metrics[k][c] = float(np.asarray(_numpy(values[k]), dtype=np.float64).reshape(-1)[0])
    return metrics


def _collect(send, alg, nodes, m, _msg):
    out = [_msg(nodes.node_of[c], "collect", -1, {}, c) for c in nodes.reachable(range(m))]
    got = _arrived(send(out), alg, "collect")
    if len(got) < m or not got[0]:
        return {c: got[c] for c in sorted(got)} if got else {}
    return tree_cat([got[c] for c in range(m)])


def _numpy(v):
    return v.detach().cpu().numpy() if hasattr(v, "detach") else v


def _write_result(path, result):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(result, fh)
    tmp.replace(path)
    Path(str(path) + ".json").write_text(json.dumps({"history": result.history}))



def simulate(settings, *, failures=None, collect_states=True, round_timeout=600.0,
             verbose=False):
    """Run jobs on Flower's Simulation Engine in this process (one node per client).

    Parameters
    ----------
    settings : dict or list of dict
        A job (:func:`ebfl.flower.jobs.build_job`), or several with the same
        number of clients, run one after the other on the same nodes (one Ray
        start-up for all).
    failures : str or dict, optional
        Clients that fail: ``"round:client,..."`` or {round: clients} (0-based);
        their ``ClientApp`` raises in those rounds (of every job).
    collect_states : bool
        Collect every client's final persistent state into the result.
    round_timeout : float
        Seconds the server waits for each message's reply (and, at the start, for
        the virtual nodes to be registered).
    verbose : bool
        Flower's and Ray's logs.

    Returns
    -------
    RunResult, or a list of them for a list of jobs
    """
    from flwr.simulation import run_simulation

    jobs = [cached_job(s) for s in _as_list(settings)]  # the server half reuses them
    sizes = {job.config.n_clients for job in jobs}
    if len(sizes) != 1:
        raise ValueError(f"jobs simulated together need the same number of clients, got "
                         f"{sorted(sizes)}")
    for job in jobs:  # refused here, before Ray starts, as run() refuses them
        checked = check_failures(failures, job.config, everyone=job.algorithm.all_clients_train)
    failures = ",".join(f"{r}:{c}" for r, cs in sorted(checked.items()) for c in sorted(cs))
    # In simulation no node can be lost on the way: a reply is late only because the
    # machine is busy (on 2 loaded cores the first tasks, which import the job's modules
    # in a fresh worker, can take minutes), so the start-up waits as long as a round does.
    full = [{**s, "failures": failures or "", "round-timeout": float(round_timeout),
             "hello-timeout": float(round_timeout),
             "collect-states": "true" if collect_states else "false"}
            for s in _as_list(settings)]
    got = []
    logger = logging.getLogger("flwr")
    level = logger.level
    if not verbose:  # run_simulation logs a deprecation notice and every client's failure
        logger.setLevel(logging.CRITICAL)
    try:
        run_simulation(server_app(full, sink=got.append, simulation=True),
                       client_app(full, simulation=True),
                       num_supernodes=sizes.pop(),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"include_dashboard": False,
                                                     "log_to_driver": verbose}},
                       verbose_logging=verbose)
    finally:
        logger.setLevel(level)
        _JOBS.clear()  # the federations' data, not needed once the run has ended
    if len(got) != len(full):
        raise RuntimeError("the Flower simulation ended without a result (see its log: "
                           "--verbose)")
    return got[0] if isinstance(settings, dict) else got


def compare_runtimes(settings, *, failures=None, compare=True, verbose=False):
    """Run a job on Flower's Simulation Engine and, with ``compare``, in process too.

    Returns
    -------
    dict
        ``settings``; ``flower`` (history, final mean accuracy, seconds); with
        ``compare``: ``in_process`` (the same) and ``max_abs_diff``, the largest
        absolute difference over every final server and client array.
    """
    from ebfl.federated.runtime import run

    job = cached_job(settings)  # simulate() finds it in the cache: one build, not two
    failures = check_failures(failures, job.config, everyone=job.algorithm.all_clients_train)
    flower = simulate(settings, failures=failures, collect_states=compare, verbose=verbose)
    payload = {"settings": job.settings, "config": job.config.to_dict(),
               "failures": {str(r): sorted(c) for r, c in sorted(failures.items())},
               "flower": _summary(flower)}
    if compare:
        local = run(job.algorithm, job.data, job.config, failures=failures)
        payload["in_process"] = _summary(local)
        payload["max_abs_diff"] = max_abs_diff(flower, local)
    return payload


def _summary(result):
    return {"history": result.history, "seconds": result.seconds,
            "final": {k: _mean_answered(v) for k, v in result.metrics.items()}}


def _mean_answered(values):
    """Mean over the clients that answered (NaN if none did)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def max_abs_diff(a, b):
    """Largest absolute difference between two results' final server and client arrays.

    Positions where one run holds NaN and the other a number count as infinite.
    Raises ValueError if they do not hold the same arrays (names and shapes).
    """
    fa, fb = flatten({"server": a.server, "clients": a.clients}), \
        flatten({"server": b.server, "clients": b.clients})
    if sorted(fa) != sorted(fb):
        raise ValueError(f"the runs hold different arrays: {sorted(set(fa) ^ set(fb))[:5]}")
    worst = 0.0
    for key, x in fa.items():
        x, y = np.asarray(_numpy(x), dtype=np.float64), np.asarray(_numpy(fb[key]),
                                                                   dtype=np.float64)
        if x.shape != y.shape:
            raise ValueError(f"{key} has shape {x.shape} in one run, {y.shape} in the other")
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return float("inf")  # NaN in one run where the other has a number
        both = ~np.isnan(x)
        if both.any():
            worst = max(worst, float(np.max(np.abs(x[both] - y[both]))))
    return worst


def plot_comparison(payload, path):
    """The mean metric per round on Flower and (if compared) in process; saves ``path``."""
    from matplotlib.ticker import MaxNLocator

    from ebfl._plotting import subplots

    metric = "accuracy" if "accuracy" in payload["flower"]["final"] else next(
        iter(payload["flower"]["final"]))
    fig, ax = subplots(figsize=(6, 4))
    for key, label, style in (("flower", "Flower", "-o"), ("in_process", "in process", "--x")):
        if key in payload:
            hist = payload[key]["history"]
            ax.plot([h["round"] for h in hist], [h.get(metric, np.nan) for h in hist], style,
                    label=label)
    s = payload["settings"]
    title = f"{s['algorithm']} on {s['dataset']}, {payload['config']['n_clients']} clients"
    if "max_abs_diff" in payload:
        title += f"\nmax |difference| of the final parameters: {payload['max_abs_diff']:.3g}"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"mean {metric} over the clients")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
