"""Benchmark P8: the same AdaPeD job per round on Flower and in process.

Setting: AdaPeD on scikit-learn's digits split among m clients (3 classes each,
a logistic model), K = m / 2 sampled per round, tau = 5 local iterations of 10
images; evaluation only after the last round. The job is built once by
``ebfl.flower.jobs.build_job`` and run by both runtimes:

flower      ``ebfl.flower.runtime.simulate``: Flower's Simulation Engine, one
            node per client (Ray actors, 1 CPU each); per round: the server's
            messages, the client half on each node (one client at a time), the
            replies. Timed from the first round to the end (``seconds`` of the
            result); the Ray start-up and the nodes' hello are reported apart.
in process  ``ebfl.federated.run``: the client half once per round for all K
            sampled clients, vectorized. This is the floor for the same
            arithmetic: Flower does the same work plus messaging.

Both end with the same parameters (checked: ``max_abs_diff``). Reported: seconds
per round for each and their ratio, the start-up, and the message payload per
round. ``--quick``: m = 6, 3 rounds. ``--json`` prints one JSON object.
"""

import argparse
import json
import time

from ebfl.federated import run
from ebfl.flower.jobs import build_job
from ebfl.flower.runtime import max_abs_diff, simulate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="6 clients, 3 rounds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    m, n_rounds = (6, 3) if args.quick else (args.clients, args.rounds)
    settings = {"algorithm": "adaped", "clients": m, "rounds": n_rounds,
                "clients-per-round": max(1, m // 2), "local-steps": 5, "batch-size": 10,
                "eval-every": n_rounds}
    job = build_job(settings)

    t0 = time.perf_counter()
    flower = simulate(settings)
    flower_wall = time.perf_counter() - t0
    local = min((run(job.algorithm, job.data, job.config) for _ in range(3)),
                key=lambda r: r.seconds)
    per_round = {"flower": flower.seconds / n_rounds, "in_process": local.seconds / n_rounds}
    result = {
        "benchmark": "P8", "clients": m, "rounds": n_rounds,
        "clients_per_round": job.config.clients_per_round,
        "seconds_per_round": per_round,
        "ratio_flower_over_in_process": per_round["flower"] / per_round["in_process"],
        "flower_startup_seconds": flower_wall - flower.seconds,
        "payload_bytes_per_round": {"down": flower.history[-1]["bytes_down"],
                                    "up": flower.history[-1]["bytes_up"]},
        "max_abs_diff": max_abs_diff(flower, local),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"P8: AdaPeD, {m} clients, K = {result['clients_per_round']}, {n_rounds} rounds")
        print(f"  seconds per round   Flower {per_round['flower']:.4f}   in process "
              f"{per_round['in_process']:.4f}   ratio {result['ratio_flower_over_in_process']:.1f}")
        print(f"  Flower start-up (Ray, nodes, hello) {result['flower_startup_seconds']:.1f} s")
        print(f"  payload per round: {result['payload_bytes_per_round']}; max |difference| "
              f"{result['max_abs_diff']:.3g}")
    return result


if __name__ == "__main__":
    main()
