"""Benchmark P8: the same job per round on Flower and in process, at several federation sizes.

Setting (default): AdaPeD on scikit-learn's digits split among m clients (3 classes
each, a logistic model), K = m / 2 sampled per round, tau = 5 local iterations of 10
images; evaluation only after the last round. ``--algorithm``/``--dataset`` run
another job of :mod:`ebfl.flower.jobs` instead (the digits hold 1797 images, so
federations of thousands of clients take ``eb-beta-binomial`` on ``simulated`` or
``elections``, where every client takes part in every round). The job is built once
by ``ebfl.flower.jobs.build_job`` and run by both runtimes:

flower      ``ebfl.flower.runtime.simulate``: Flower's Simulation Engine, one
            node per client (Ray actors, 1 CPU each); per round: the server's
            messages, the client half on each node (one client at a time), the
            replies. Timed from the first round to the end (``seconds`` of the
            result); Ray's start-up is reported apart.
in process  ``ebfl.federated.run``: the client half once per round for all K
            sampled clients, vectorized. This is the floor for the same
            arithmetic: Flower does the same work plus messaging.

Both end with the same parameters (checked: ``max_abs_diff``). Reported per size:
seconds per round for each and their ratio, the start-up, the message payload per
round, and the peak memory (resident set, summed over this process and its
children, sampled every 0.2 s: Ray's workers included). ``--sizes 20,200`` runs
several sizes; ``--quick``: m = 6, 3 rounds. ``--json`` prints one JSON object
(a list under ``sizes`` with several sizes).
"""

import argparse
import json
import os
import threading
import time

from ebfl.federated import run
from ebfl.flower.jobs import build_job
from ebfl.flower.runtime import max_abs_diff, simulate


class PeakMemory:
    """Peak resident memory (MiB) of this process and its descendants while in use."""

    def __init__(self, interval=0.2):
        self.interval, self.peak = interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _sample(self):
        try:
            import psutil
        except ImportError:  # the test extra's; without it no memory is reported
            self.peak = float("nan")
            return
        procs = [psutil.Process(os.getpid())]
        procs += procs[0].children(recursive=True)
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self.peak = max(self.peak, total / 2**20)

    def _watch(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def one_size(m, n_rounds, algorithm="adaped", dataset=None, per_round=None):
    """P8 at one federation size (a dict; see the module docstring)."""
    settings = {"algorithm": algorithm, "clients": m, "rounds": n_rounds,
                "eval-every": n_rounds}
    if dataset is not None:
        settings["dataset"] = dataset
    if algorithm.startswith("eb-"):
        k = per_round
    else:
        k = max(1, m // 2) if per_round is None else per_round
        settings.update({"local-steps": 5, "batch-size": 10})
    if k is not None:
        settings["clients-per-round"] = k
    job = build_job(settings)

    t0 = time.perf_counter()
    with PeakMemory() as flower_mem:
        flower = simulate(settings)
    flower_wall = time.perf_counter() - t0
    with PeakMemory() as local_mem:
        local = min((run(job.algorithm, job.data, job.config) for _ in range(3)),
                    key=lambda r: r.seconds)
    seconds = {"flower": flower.seconds / n_rounds, "in_process": local.seconds / n_rounds}
    return {
        "benchmark": "P8", "algorithm": algorithm, "dataset": job.settings["dataset"],
        "clients": job.config.n_clients, "rounds": n_rounds,
        "clients_per_round": job.config.clients_per_round,
        "seconds_per_round": seconds,
        "ratio_flower_over_in_process": seconds["flower"] / seconds["in_process"],
        "flower_startup_seconds": flower_wall - flower.seconds,
        "peak_memory_mib": {"flower": round(flower_mem.peak, 1),
                            "in_process": round(local_mem.peak, 1)},
        "payload_bytes_per_round": {"down": flower.history[-1]["bytes_down"],
                                    "up": flower.history[-1]["bytes_up"]},
        "max_abs_diff": max_abs_diff(flower, local),
    }


def _print(result):
    s = result["seconds_per_round"]
    print(f"P8: {result['algorithm']} on {result['dataset']}, {result['clients']} clients, "
          f"K = {result['clients_per_round']}, {result['rounds']} rounds")
    print(f"  seconds per round   Flower {s['flower']:.4f}   in process "
          f"{s['in_process']:.4f}   ratio {result['ratio_flower_over_in_process']:.1f}")
    print(f"  Flower start-up (Ray, nodes) {result['flower_startup_seconds']:.1f} s; peak "
          f"memory MiB {result['peak_memory_mib']}")
    print(f"  payload per round: {result['payload_bytes_per_round']}; max |difference| "
          f"{result['max_abs_diff']:.3g}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--sizes", help="several federation sizes, e.g. 20,200")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--algorithm", default="adaped")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--clients-per-round", type=int, default=None,
                        help="K (default m / 2; eb-* protocols: every client)")
    parser.add_argument("--quick", action="store_true", help="6 clients, 3 rounds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        sizes, n_rounds = [6], 3
    else:
        sizes = ([int(v) for v in args.sizes.split(",")] if args.sizes else [args.clients])
        n_rounds = args.rounds
    results = [one_size(m, n_rounds, args.algorithm, args.dataset, args.clients_per_round)
               for m in sizes]
    for result in results:
        if not args.json:
            _print(result)
    if len(results) == 1:
        if args.json:
            print(json.dumps(results[0]))
        return results[0]
    if args.json:
        print(json.dumps({"benchmark": "P8", "sizes": results}))
    return {"benchmark": "P8", "sizes": results}


if __name__ == "__main__":
    main()
