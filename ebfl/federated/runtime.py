"""The in-process runtime: every client of a federated algorithm in one process.

The client half runs once per round for all sampled clients at once, on their
stacked states (vectorized); the server half as on any other runtime. Results
equal those of the Flower runtime (:mod:`ebfl.flower.runtime`) on the same
configuration, since both key every random stream by (seed, round, client) and
aggregate replies in client-id order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import INT64_MAX, check_bool, check_callable, check_int_scalar
from ebfl.federated.checkpoint import (
    check_checkpoint_path,
    check_resumable,
    data_digest,
    load_checkpoint,
    save_checkpoint,
)
from ebfl.federated.faults import check_failures
from ebfl.federated.protocol import FederatedAlgorithm, RoundContext, RunConfig, sample_clients
from ebfl.federated.tree import _is_torch, tree_cat, tree_nbytes, tree_put, tree_take

__all__ = ["RunResult", "history_row", "run"]


@dataclass
class RunResult:
    """Final server and client states, the last per-client metrics and the history.

    Attributes
    ----------
    server : dict
        The server's state.
    clients : dict
        Every client's persistent state (stacks of m rows, client-id order).
    metrics : dict of name -> ndarray (m,)
        The last evaluation, per client (NaN where a client did not answer).
    history : list of dict
        Per evaluated round: metric means (and ``*_sd``), who answered the
        evaluation and whose training replies were left out since the previous
        row (see :func:`history_row`), the server's summary, and the round's
        traffic (``bytes_down``, ``bytes_up``: array payload of the training
        messages, summed over clients).
    seconds : float
    """

    server: dict
    clients: dict
    metrics: dict
    history: list = field(default_factory=list)
    seconds: float = 0.0
    config: dict = field(default_factory=dict)

    def history_frame(self):
        """The history as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def plot(self, metric=None, path=None):
        """Each metric of the history against the round.

        Parameters
        ----------
        metric : str or list of str, optional
            History entries to draw, one panel each. Default: the metrics evaluated
            on the clients (entries with a ``<name>_sd``, drawn as a band of +- one
            sd over clients) and ``mse`` when the history has it (from a ``monitor``).
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            One axes per metric, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> from ebfl.federated import EBGaussian, simulated_means
        >>> res = run(EBGaussian(), simulated_means(20, seed=0), RunConfig(20, n_rounds=2))
        >>> fig = res.plot(["squared_error", "local_squared_error"])
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['squared_error', 'local_squared_error']
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl._plotting import plot_history

        return plot_history(self.history, metric, path)


def history_row(config, done, metrics, summary, traffic, left_out=()):
    """One history entry: identical on both runtimes (means in float64, client-id order).

    Parameters
    ----------
    config : RunConfig
    done : int
        Rounds done (the row's ``round``).
    metrics : dict of name -> ndarray (m,)
        The evaluation (NaN where a client did not answer).
    summary, traffic : dict
        The server's summary and the round's traffic, copied into the row.
    left_out : iterable of (round, client)
        The sampled clients whose training replies were not aggregated in the
        rounds since the previous row (0-based rounds, as in ``failures``).

    Returns
    -------
    dict
        ``round``, ``iteration``, each metric's mean over the clients that
        answered and its ``<name>_sd``; ``answered`` (how many clients have a
        finite first metric) and ``not_answered`` (the others' ids);
        ``left_out`` and ``left_out_rounds``, two lists of plain ints of equal
        length: the ``left_out`` pairs, sorted by round then client (the
        aggregated replies of round r are those of the clients sampled in r
        less these); then the summary and the traffic. Flat lists, so that the
        rows of two runs compare entry by entry (``pytest.approx`` refuses
        nested lists) and serialise to JSON as they are.
    """
    row = {"round": done, "iteration": done * config.local_steps}
    for name, values in metrics.items():
        v = np.asarray(values, dtype=np.float64)
        ok = v[np.isfinite(v)]
        row[name] = float(ok.mean()) if ok.size else float("nan")
        row[f"{name}_sd"] = float(ok.std(ddof=1)) if ok.size > 1 else 0.0
    first = (np.isfinite(np.asarray(next(iter(metrics.values())), dtype=np.float64))
             if metrics else np.zeros(0, dtype=bool))
    row["answered"] = int(first.sum())
    row["not_answered"] = [int(c) for c in np.flatnonzero(~first)]
    pairs = sorted({(int(r), int(c)) for r, c in left_out})
    row["left_out"] = [c for _, c in pairs]
    row["left_out_rounds"] = [r for r, _ in pairs]
    return {**row, **summary, **traffic}


def _left_out(config, failures, since, done, everyone):
    """(round, client) of the sampled clients told to fail in rounds ``since``..``done - 1``."""
    return [(r, int(c)) for r in range(since, done) if failures.get(r)
            for c in sample_clients(config, r, everyone=everyone) if int(c) in failures[r]]


def run(algorithm, data, config, *, failures=None, checkpoint=None, checkpoint_every=None,
        monitor=None, progress=False):
    """Run ``config.rounds`` rounds of ``algorithm`` on ``data`` in this process.

    Parameters
    ----------
    algorithm : FederatedAlgorithm
    data
        The clients' data: has ``n_clients`` and ``subset(ids)`` (the data of
        those clients, in that order).
    config : RunConfig
    failures : dict round -> iterable of client ids, optional
        Clients that fail in a round (for studying faults): they are sampled
        but neither update their state nor reply, exactly as a client that
        crashes on Flower; the server aggregates the others. Rounds are
        0-based, in [0, ``config.rounds`` - 1], clients in [0, m - 1]. A round
        may lose every client it sampled (the server keeps its state), but not
        every round of the run: such a run would aggregate nothing and is
        refused (ValueError).
    checkpoint : path-like, optional
        A file, saved every ``checkpoint_every`` rounds (default
        ``config.eval_every``) and at the end; if it exists the run resumes from
        it, to the same result as an uninterrupted run (also with more
        ``n_rounds`` than the run that wrote it). Tensors are saved on the CPU and
        placed by the algorithm's ``restore_state`` on resuming, so a run
        resumes on another device. The file records the configuration, a
        SHA-256 digest of the clients' data (computed once per run, from every
        array's bytes) and a checksum of its content: a checkpoint of another
        configuration, of other data or with more rounds than ``config.rounds``,
        and a damaged or truncated file, are refused with a ValueError that says
        why (delete the file, or pass another path, to start afresh). A folder is
        refused before the run starts.
    monitor : callable, optional
        ``monitor(server, clients) -> dict``: more entries for each history row,
        computed from the whole server state and every client's state (stacks of
        m rows) after the round (e.g. the error to known true parameters, or an
        objective that needs every client). It exists in process only: on
        Flower no one holds every client's state.
    progress : bool
        A progress bar.

    Returns
    -------
    RunResult
    """
    if not isinstance(algorithm, FederatedAlgorithm):
        raise TypeError(f"algorithm must be a FederatedAlgorithm, got "
                        f"{type(algorithm).__name__}")
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    if getattr(data, "n_clients", None) != config.n_clients:
        raise ValueError(f"data has {getattr(data, 'n_clients', None)} clients, config.n_clients "
                         f"is {config.n_clients}")
    failures = check_failures(failures, config, everyone=algorithm.all_clients_train)
    progress = check_bool(progress, "progress")
    if monitor is not None:
        check_callable(monitor, "monitor", "monitor(server, clients) -> dict")
    if checkpoint is not None:
        checkpoint = check_checkpoint_path(checkpoint)
    checkpoint_every = (config.eval_every if checkpoint_every is None else
                        check_int_scalar(checkpoint_every, "checkpoint_every", minimum=1,
                                         maximum=INT64_MAX))
    # What a checkpoint must agree on to be continued: everything but the length of the
    # run and its evaluation schedule (a run may be extended from a shorter one; the
    # shorter run's final evaluation then stays in the history), and failures only in
    # the rounds it has done.
    run_identity = {k: v for k, v in config.to_dict().items()
                    if k not in ("n_rounds", "eval_every")}
    identity = {"algorithm": algorithm.config(), "run": run_identity,
                "failures": {r: sorted(c) for r, c in sorted(failures.items())}}
    m = config.n_clients
    everyone = np.arange(m)
    digest = None if checkpoint is None else data_digest(data)
    if checkpoint is not None and checkpoint.is_file():
        saved = load_checkpoint(checkpoint)
        check_resumable(checkpoint, saved, identity, digest, config.n_rounds)
        server, clients, start = (algorithm.restore_state(saved["server"]),
                                  algorithm.restore_state(saved["clients"]), saved["round"])
        history, metrics = saved["history"], saved["metrics"]
    else:
        server = algorithm.init_server(config)
        clients = algorithm.init_clients(config, data, everyone)
        start, history, metrics = 0, [], None
    weights = np.asarray(algorithm.client_weights(data), dtype=np.float64)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.n_rounds, initial=start, desc=algorithm.name, disable=None,
                   leave=False)
    t0 = time.perf_counter()
    for r in range(start, config.n_rounds):
        sampled = sample_clients(config, r, everyone=algorithm.all_clients_train)
        failed = failures.get(r, set())
        active = np.array([c for c in sampled if c not in failed], dtype=np.int64)
        message = algorithm.broadcast(server, RoundContext(config, r, sampled))
        traffic = {"clients": int(sampled.size), "replies": int(active.size),
                   "bytes_down": tree_nbytes(message) * int(sampled.size), "bytes_up": 0}
        replies = None
        if active.size:
            rc = RoundContext(config, r, active)
            rows = tree_take(clients, active)
            replies = algorithm.client_train(message, rows, data.subset(active), rc)
            tree_put(clients, active, rows)
            traffic["bytes_up"] = tree_nbytes(replies)
        if algorithm.trains_idle:
            idle = np.setdiff1d(everyone, np.union1d(sampled, list(failed)))
            if idle.size:
                rc = RoundContext(config, r, idle)
                idle_msg = algorithm.idle_message(server, rc)
                rows = tree_take(clients, idle)
                algorithm.client_idle(idle_msg, rows, data.subset(idle), rc)
                tree_put(clients, idle, rows)
                traffic["bytes_down"] += tree_nbytes(idle_msg) * int(idle.size)
        if replies is not None or algorithm.aggregate_empty:
            server = algorithm.aggregate(server, replies, weights[active],
                                         RoundContext(config, r, active))
        done = r + 1
        if done % config.eval_every == 0 or done == config.n_rounds:
            metrics = evaluate(algorithm, server, clients, data)
            # from the failures rather than kept per round: also right after a resume
            since = history[-1]["round"] if history else 0
            history.append(history_row(config, done, metrics, algorithm.summary(server),
                                       traffic, _left_out(config, failures, since, done,
                                                          algorithm.all_clients_train)))
            if monitor is not None:
                history[-1].update(_monitored(monitor, server, clients))
            if bar is not None and "accuracy" in metrics:
                bar.set_postfix(acc=f"{history[-1]['accuracy']:.4f}")
        if checkpoint is not None and (done % checkpoint_every == 0 or done == config.n_rounds):
            save_checkpoint(checkpoint, {"identity": identity, "data": digest,
                                         "server": _on_cpu(server), "clients": _on_cpu(clients),
                                         "round": done, "history": history,
                                         "metrics": metrics})
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if metrics is None:
        metrics = evaluate(algorithm, server, clients, data)
    return RunResult(server, clients, metrics, history, time.perf_counter() - t0,
                     config.to_dict())


def _monitored(monitor, server, clients):
    extra = monitor(server, clients)
    if not isinstance(extra, Mapping):
        raise TypeError(f"monitor must return a dict, got {type(extra).__name__}")
    return extra


def evaluate(algorithm, server, clients, data):
    """Every client's metrics (name -> ndarray (m,)) under the current server state."""
    if not isinstance(algorithm, FederatedAlgorithm):
        raise TypeError(f"algorithm must be a FederatedAlgorithm, got "
                        f"{type(algorithm).__name__}")
    if not isinstance(getattr(data, "n_clients", None), int | np.integer):
        raise TypeError(f"data must have n_clients and subset(ids), got {type(data).__name__}")
    message = algorithm.evaluation_message(server)
    out = algorithm.client_evaluate(message, clients, data.subset(np.arange(data.n_clients)))
    return {k: _to_numpy(v) for k, v in out.items()}


def _to_numpy(v):
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.asarray(v, dtype=np.float64)


def stack_replies(replies):
    """Replies of single clients, in client-id order, as one stack (Flower's server side)."""
    return tree_cat(replies)


def _on_cpu(tree):
    """A state with its torch tensors on the CPU (no copy for those already there): a
    checkpoint that any machine can read."""
    if isinstance(tree, dict):
        return {k: _on_cpu(v) for k, v in tree.items()}
    return tree.cpu() if _is_torch(tree) else tree
