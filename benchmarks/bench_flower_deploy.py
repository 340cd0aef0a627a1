"""Benchmark: a Flower deployment of 20 SuperNodes on loopback that loses and gains nodes.

Setting (default): AdaPeD on scikit-learn's digits split among m = 20 clients (3
classes each, a logistic model), every client sampled in every round (K = m),
tau = 2 local iterations of 10 images, 3 rounds, evaluation after each. The
federation is Flower's own processes on 127.0.0.1
(:class:`ebfl.flower.loopback.LoopbackFederation`): a SuperLink, one SuperNode per
client, and ``flwr run`` submitting the app of :func:`ebfl.flower.deploy.write_app`
with ``min-clients`` m - 2, so that the run starts without the last two:

late      clients m-2 and m-1: their SuperNodes start once round 1 has begun (a
          node has received its first training message); the server binds them
          before its next phase, and they train from round 2 on.
leaves    client 0: SIGTERM once it has answered everything of round 1 (its
          training and its evaluation): the node tells the SuperLink it leaves.
killed    client 1: SIGKILL in round 2 after its SuperNode received the training
          message and before it replied (its ClientApp is running, as its log
          shows); if the reply was faster than the watch, after the reply
          (reported: ``killed_mid_round``). The SuperLink marks the node offline
          after about 60 s without a heartbeat and answers for it with an
          error: the round waits that long.

The run must end with the surviving clients; its history says who answered. The
in-process run (``ebfl.federated.run``) is then given the same failures: for
each round the sampled clients that the Flower run's history lists as left out
(``left_out``, ``left_out_rounds``); both must end with the same server
parameters (``max_abs_diff``; the clients that answered the last evaluation
also have the same accuracy, ``max_abs_diff_accuracy``).

Reported: the start-up (SuperLink and first SuperNodes listening; then from
``flwr run`` to the clients bound, which includes the ``hello-timeout`` wait for
the two missing nodes), seconds per round (between the ServerApp's log lines as
``flwr run --stream`` relays them, so within a few seconds: round 1 from the
binding to the end of its training, round r > 1 from the end of round r - 1's
training, so with that round's evaluation and the late nodes' binding), the whole run,
and per round the clients aggregated and left out, and per evaluation those that
did not answer. Every process is stopped by PID at the end; the processes left
and any socket that listened beyond loopback are reported (both should be
empty). Each message starts a fresh ClientApp process on its node, which imports
ebfl and torch and builds the job: on 2 busy cores a phase of 20 messages takes
a minute or more. ``--nodes``, ``--rounds``; ``--quick``: 6 nodes, 2 rounds (a
few minutes); ``--json`` prints one JSON object.
"""

import argparse
import json
import pickle
import re
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ebfl.federated import run
from ebfl.federated.faults import failures_of_history
from ebfl.flower.deploy import write_app
from ebfl.flower.jobs import build_job
from ebfl.flower.loopback import LoopbackFederation
from ebfl.flower.runtime import max_abs_diff

ROUND_LINE = re.compile(r"round (\d+)/(\d+): (\d+) of (\d+) sampled clients replied")
BOUND_LINE = re.compile(r"bound (\d+) of (\d+) clients")


class Scenario:
    """The nodes' fates, acted out while ``flwr run`` goes on (polled every 0.2 s)."""

    def __init__(self, fed, m, evaluates_round_one, t0):
        self.fed, self.m, self.t0 = fed, m, t0
        self.late, self.leaver, self.victim = [m - 2, m - 1], 0, 1
        self.evaluates_round_one = evaluates_round_one
        self.at, self.marks, self.killed_mid_round = {}, {}, None

    def now(self):
        return time.perf_counter() - self.t0

    def mark_log_lines(self):
        """The time each ServerApp progress line (binding, rounds) first shows up."""
        text = self.fed.log("flwr-run")
        for pattern, key in ((BOUND_LINE, "bound"), (ROUND_LINE, None)):
            for match in pattern.finditer(text):
                name = key or f"round {match.group(1)}"
                self.marks.setdefault(name, self.now())

    def __call__(self):
        """One look at the logs; True once every event has happened."""
        fed = self.fed
        self.mark_log_lines()
        if "late" not in self.at and any(
                fed.progress(c)[0] >= 1 for c in range(self.m) if c not in self.late):
            for c in self.late:
                fed.add_node(c, wait=False)
            self.at["late"] = self.now()
        if "leaves" not in self.at and fed.progress(self.leaver)[1] >= 1 and (
                not self.evaluates_round_one or fed.progress(self.leaver, "evaluate")[1] >= 1):
            fed.stop_node(self.leaver, wait=False)
            self.at["leaves"] = self.now()
        received, replied = fed.progress(self.victim)
        if "killed" not in self.at and received >= 2:
            self.killed_mid_round = replied < 2
            fed.kill_node(self.victim, wait=False)
            self.at["killed"] = self.now()
        return len(self.at) == 3


def who_answered(history, config):
    """Per round (1-based): the clients sampled, aggregated and left out."""
    from ebfl.federated.protocol import sample_clients

    out = failures_of_history(history)
    rounds = []
    for r in range(config.n_rounds):
        sampled = [int(c) for c in sample_clients(config, r)]
        left = sorted(out.get(r, []))
        rounds.append({"round": r + 1, "sampled": len(sampled), "left_out": left,
                       "aggregated": [c for c in sampled if c not in left]})
    return rounds


def deploy(m, n_rounds, algorithm="adaped", *, round_timeout=600.0, hello_timeout=15.0,
           limit=3600.0, workdir=None):
    """The benchmark on m SuperNodes (a dict; see the module docstring)."""
    job_settings = {"algorithm": algorithm, "clients": m, "rounds": n_rounds,
                    "clients-per-round": m, "local-steps": 2, "batch-size": 10,
                    "eval-every": 1, "seed": 0}
    job = build_job(job_settings)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        result_path = tmp / "result.pkl"
        fed = LoopbackFederation(tmp, m)
        try:
            t0 = time.perf_counter()
            fed.start(partitions=range(m - 2))
            startup = time.perf_counter() - t0
            app = write_app(tmp / "app", {**job_settings, "result-path": str(result_path),
                                          "round-timeout": round_timeout,
                                          "hello-timeout": hello_timeout,
                                          "min-clients": m - 2},
                            superlink=fed.superlink)
            t1 = time.perf_counter()
            scenario = Scenario(fed, m, job.config.eval_every == 1, t1)

            def watch():
                scenario()
                return False  # keep watching: the log lines are timed to the end

            fed.wait_run(fed.flwr_run(app), limit, until=watch)
            run_seconds = time.perf_counter() - t1
            scenario.mark_log_lines()
        finally:
            fed.stop()
        left, wide = fed.alive(), fed.wide()
        with open(result_path, "rb") as fh:
            got = pickle.load(fh)
    cfg = job.config
    rounds = who_answered(got.history, cfg)
    failures = failures_of_history(got.history)
    ref = run(job.algorithm, job.data, cfg, failures=failures)
    answered = np.isfinite(got.metrics["accuracy"])
    marks = scenario.marks
    ends = [marks.get(f"round {r}") for r in range(1, n_rounds + 1)]
    starts = [marks.get("bound"), *ends[:-1]]
    return {
        "benchmark": "flower-deploy", "algorithm": algorithm,
        "dataset": job.settings["dataset"], "clients": m, "rounds": n_rounds,
        "clients_per_round": cfg.clients_per_round, "nodes_at_start": m - 2,
        "scenario": {"late": scenario.late, "leaves": scenario.leaver,
                     "killed": scenario.victim, "killed_mid_round": scenario.killed_mid_round,
                     "seconds_after_submit": {k: round(v, 1) for k, v in scenario.at.items()}},
        "startup_seconds": {"superlink_and_nodes": round(startup, 1),
                            "submit_to_bound": _round(marks.get("bound"))},
        "seconds_per_round": [_round(None if a is None or b is None else b - a)
                              for a, b in zip(starts, ends, strict=True)],
        "run_seconds": round(run_seconds, 1),
        "who_answered": rounds,
        "not_answered": [{"round": h["round"], "clients": h["not_answered"]}
                         for h in got.history],
        "final_mean_accuracy": float(np.nanmean(got.metrics["accuracy"])),
        "max_abs_diff": max_abs_diff(SimpleNamespace(server=got.server, clients={}),
                                     SimpleNamespace(server=ref.server, clients={})),
        "max_abs_diff_accuracy": float(np.max(np.abs(
            got.metrics["accuracy"][answered] - ref.metrics["accuracy"][answered]))),
        "processes_left": [(p.pid, p.name()) for p in left],
        "listening_beyond_loopback": [list(s) for s in wide],
    }


def _round(value):
    return None if value is None else round(value, 1)


def _print(res):
    print(f"Flower deployment: {res['algorithm']} on {res['dataset']}, {res['clients']} "
          f"SuperNodes on loopback ({res['nodes_at_start']} at the start), K = "
          f"{res['clients_per_round']}, {res['rounds']} rounds")
    s = res["scenario"]
    print(f"  late {s['late']}, leaves {s['leaves']} (SIGTERM), killed {s['killed']} "
          f"(SIGKILL, mid-round: {s['killed_mid_round']}); at {s['seconds_after_submit']} s")
    print(f"  start-up {res['startup_seconds']} s; seconds per round "
          f"{res['seconds_per_round']}; run {res['run_seconds']} s")
    for row in res["who_answered"]:
        print(f"  round {row['round']}: {len(row['aggregated'])} of {row['sampled']} "
              f"aggregated, left out {row['left_out']}")
    for row in res["not_answered"]:
        print(f"  evaluation after round {row['round']}: no answer from {row['clients']}")
    print(f"  final mean accuracy {res['final_mean_accuracy']:.4f}; max |difference| to "
          f"the in-process run: server {res['max_abs_diff']:.3g}, accuracy "
          f"{res['max_abs_diff_accuracy']:.3g}")
    print(f"  processes left {res['processes_left']}; listening beyond loopback "
          f"{res['listening_beyond_loopback']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20, help="SuperNodes = clients (>= 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (>= 2)")
    parser.add_argument("--algorithm", default="adaped")
    parser.add_argument("--round-timeout", type=float, default=600.0)
    parser.add_argument("--hello-timeout", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true", help="6 nodes, 2 rounds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    m, n_rounds = (6, 2) if args.quick else (args.nodes, args.rounds)
    if m < 4 or n_rounds < 2:
        parser.error("the scenario needs --nodes >= 4 and --rounds >= 2")
    res = deploy(m, n_rounds, args.algorithm, round_timeout=args.round_timeout,
                 hello_timeout=args.hello_timeout)
    if args.json:
        print(json.dumps(res))
    else:
        _print(res)
    return res


if __name__ == "__main__":
    main()
