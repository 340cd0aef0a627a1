"""Benchmark of the Beta-Bernoulli empirical-Bayes fit (prior + per-client posteriors).

P1  ``ebfl.beta_bernoulli_eb(data, method=...)`` on ragged uint8 0/1 data with
    10^6 clients and ~10^8 observations (n_i uniform on 2..198, mean 100; 2 and
    not 1 because ``loo_corrected`` needs n_i >= 2), for every method. Reported
    as a ratio to the floor, one streaming read of the values
    (``np.count_nonzero``, ~100 MB); goal: ratio <= 4. Also timed, as
    references: ``np.add.reduceat(values, offsets[:-1])`` (what counting the
    successes per client costs with numpy) and the counting kernel alone
    (``bernoulli_counts``), so the rest is the fit from counts. Memory: the
    peak of numpy's allocations during one fit (``tracemalloc``; every array
    the fit returns or holds is numpy's, Numba's scratch tables of a few
    hundred KB are not counted), as a multiple of the input bytes. (The RSS
    would not show it: the process reuses the memory freed by earlier fits.)
P5  ``ebfl.beta_binomial_eb(successes, trials, method=...)`` from per-client
    int64 counts for 10^7 clients (160 MB). Goals: <= 0.5 s and a peak RSS
    increase <= 3x the input bytes. Each method runs in a fresh subprocess
    (Numba allocations bypass tracemalloc); the child builds its inputs chunk
    by chunk, warms Numba up, records its RSS (baseline), resets the kernel's
    peak-RSS mark (/proc/self/clear_refs), fits, and reports the peak
    (``VmHWM``) above the RSS.

Every timed item is warmed up first (Numba compile time excluded) and reported as
the best (minimum) of ``--reps`` repetitions, each on a fresh result (the previous
one released). ``--quick``: 10^5 clients (~10^7 observations) for P1 and 10^6
clients for P5. ``--json`` prints one JSON object.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc

import numba
import numpy as np
from _timing import best_of, reset_peak_rss, rss_kib

import ebfl
from ebfl.eb.beta_binomial import bernoulli_counts

METHODS = ebfl.eb.beta_binomial.METHODS
GOAL_P1_RATIO = 4.0  # full fit / one streaming read of the values
GOAL_P5_SECONDS = 0.5
GOAL_P5_MEMORY_RATIO = 3.0  # peak RSS increase / input bytes
N_MIN, N_MAX = 2, 198  # client sizes, uniform: mean 100
ALPHA, BETA = 2.0, 5.0  # population prior of the success probabilities
CHUNK = 50_000  # clients generated at a time


def make_ragged(m, seed):
    """Ragged uint8 0/1 data of ``m`` clients, drawn chunk by chunk (low set-up memory)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(N_MIN, N_MAX + 1, size=m)
    offsets = np.zeros(m + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.empty(offsets[-1], np.uint8)
    for lo in range(0, m, CHUNK):
        hi = min(lo + CHUNK, m)
        p = rng.beta(ALPHA, BETA, size=hi - lo).astype(np.float32)
        a, b = offsets[lo], offsets[hi]
        u = rng.random(b - a, dtype=np.float32)
        np.less(u, np.repeat(p, counts[lo:hi]), out=values[a:b].view(np.bool_))
    return ebfl.Ragged(values, offsets)


def make_counts(m, seed):
    """Per-client (successes, trials), int64, drawn chunk by chunk."""
    rng = np.random.default_rng(seed)
    n = rng.integers(N_MIN, N_MAX + 1, size=m)
    z = np.empty(m, np.int64)
    for lo in range(0, m, 20 * CHUNK):
        hi = min(lo + 20 * CHUNK, m)
        z[lo:hi] = rng.binomial(n[lo:hi], rng.beta(ALPHA, BETA, size=hi - lo))
    return z, n


def warm_up():
    """Compile (or load from cache) every Numba kernel used, on small data."""
    data = make_ragged(300, seed=12345)
    for method in METHODS:
        ebfl.beta_bernoulli_eb(data, method=method)


def peak_increase_kib(fn):
    """Peak RSS increase (KiB) of one call of ``fn``, and its result."""
    gc.collect()
    reset = reset_peak_rss()
    baseline = rss_kib()  # after the reset: the peak mark is now this RSS
    out = fn()
    peak = rss_kib("VmHWM")
    # max(., 0): at tiny sizes the mark and the RSS read differ by a few KiB either way.
    return (max(peak - baseline, 0) if reset else None), baseline, peak, out


def p5_child(m, seed, reps, method):
    """Body of the P5 subprocess: print one JSON line with time and memory figures."""
    z, n = make_counts(m, seed)
    warm_up()
    increase, baseline, peak, _ = peak_increase_kib(
        lambda: ebfl.beta_binomial_eb(z, n, method=method))
    seconds = best_of(lambda: ebfl.beta_binomial_eb(z, n, method=method), reps)[0]
    print(json.dumps({"method": method, "seconds": seconds, "rss_baseline_kib": baseline,
                      "rss_peak_kib": peak, "rss_increase_kib": increase,
                      "input_bytes": z.nbytes + n.nbytes}))


def run_p5(m, seed, reps, methods):
    """P5: one fresh subprocess per method; adds the goals and pass/fail."""
    out = {}
    for method in methods:
        cmd = [sys.executable, os.path.abspath(__file__), "--p5-child", method,
               "--p5-clients", str(m), "--seed", str(seed), "--reps", str(reps)]
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        r["memory_ratio"] = (None if r["rss_increase_kib"] is None
                             else r["rss_increase_kib"] * 1024 / r["input_bytes"])
        r["pass_time"] = r["seconds"] <= GOAL_P5_SECONDS
        r["pass_memory"] = r["memory_ratio"] is not None and r["memory_ratio"] <= \
            GOAL_P5_MEMORY_RATIO
        out[method] = r
    return out


def run_p1(m, seed, reps, methods):
    """P1: the streaming read (floor), reduceat, the counting kernel, the full fit per method."""
    data = make_ragged(m, seed)
    values, starts = data.values, data.offsets[:-1]
    input_bytes = values.nbytes + data.offsets.nbytes
    warm_up()
    ref = np.add.reduceat(values, starts, dtype=np.int64)
    assert np.array_equal(ref, bernoulli_counts(data)[0]), "counting kernel disagrees"
    floor = best_of(lambda: np.count_nonzero(values), reps)[0]
    reduceat = best_of(lambda: np.add.reduceat(values, starts, dtype=np.int64), reps)[0]
    counting = best_of(lambda: bernoulli_counts(data), reps)[0]
    res = {"n_clients": m, "n_observations": int(values.size), "input_bytes": input_bytes,
           "streaming_read_seconds": floor, "reduceat_seconds": reduceat,
           "reduceat_ratio": reduceat / floor, "counting_seconds": counting,
           "counting_ratio": counting / floor, "methods": {}}
    for method in methods:
        def fit(method=method):
            return ebfl.beta_bernoulli_eb(data, method=method)

        gc.collect()
        tracemalloc.start()
        fit()
        peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        t = best_of(fit, reps)[0]
        res["methods"][method] = {
            "seconds": t, "ratio": t / floor, "pass": t / floor <= GOAL_P1_RATIO,
            "peak_allocated_bytes": peak_bytes, "memory_ratio": peak_bytes / input_bytes}
    return res


def _ratio(x):
    return "   n/a" if x is None else f"{x:6.2f}"


def print_table(r):
    """Human-readable report of the result dict built by ``main``."""
    p1, p5, env = r["p1"], r["p5"], r["environment"]
    print(f"numpy {env['numpy']}, numba {env['numba']} ({env['numba_threads']} threads), "
          f"{env['cpu_count']} CPUs; best of {r['repetitions']} repetitions\n")
    print(f"P1 beta_bernoulli_eb: {p1['n_clients']:,} clients, {p1['n_observations']:,} "
          f"obs (uint8); goal: fit <= {GOAL_P1_RATIO:g}x one streaming read")
    print(f"  {'item':<34}{'seconds':>9}{'ratio':>8}  {'memory':>6}  goal")
    print(f"  {'np.count_nonzero (floor)':<34}{p1['streaming_read_seconds']:9.4f}{1:8.2f}")
    print(f"  {'np.add.reduceat':<34}{p1['reduceat_seconds']:9.4f}{p1['reduceat_ratio']:8.2f}")
    print(f"  {'bernoulli_counts (kernel only)':<34}{p1['counting_seconds']:9.4f}"
          f"{p1['counting_ratio']:8.2f}")
    for name, x in p1["methods"].items():
        print(f"  {'fit method=' + name:<34}{x['seconds']:9.4f}{x['ratio']:8.2f}  "
              f"{_ratio(x['memory_ratio'])}x {'PASS' if x['pass'] else 'FAIL'}")
    first = next(iter(p5.values()))
    print(f"\nP5 beta_binomial_eb: {r['p5_n_clients']:,} clients, int64 inputs "
          f"{first['input_bytes'] / 2**20:.0f} MiB; goals <= {GOAL_P5_SECONDS} s, "
          f"peak RSS increase <= {GOAL_P5_MEMORY_RATIO:g}x the inputs (fresh subprocess "
          "per method)")
    print(f"  {'method':<16}{'seconds':>9}{'incr MiB':>10}{'memory':>8}  time  memory")
    for name, x in p5.items():
        incr = "n/a" if x["rss_increase_kib"] is None else f"{x['rss_increase_kib'] / 1024:.0f}"
        print(f"  {name:<16}{x['seconds']:9.3f}{incr:>10}{_ratio(x['memory_ratio'])}x  "
              f"{'PASS' if x['pass_time'] else 'FAIL'}  {'PASS' if x['pass_memory'] else 'FAIL'}")
    print(f"\nall goals met: {r['all_pass']}")


def main(argv=None):
    """Parse arguments, run P5 (subprocesses) then P1, and print the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per timed item")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--p1-clients", type=int, help="clients of P1 (overrides --quick)")
    ap.add_argument("--p5-clients", type=int, help="clients of P5 (overrides --quick)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                    help="methods to time (default: all)")
    ap.add_argument("--p5-child", choices=METHODS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.p5_child:
        return p5_child(args.p5_clients, args.seed + 1, args.reps, args.p5_child)
    m1, m5 = (10**5, 10**6) if args.quick else (10**6, 10**7)
    m1, m5 = args.p1_clients or m1, args.p5_clients or m5
    p5 = run_p5(m5, args.seed, args.reps, args.methods)
    p1 = run_p1(m1, args.seed, args.reps, args.methods)
    ok = (all(x["pass"] for x in p1["methods"].values())
          and all(x["pass_time"] and x["pass_memory"] for x in p5.values()))
    result = {
        "repetitions": args.reps, "quick": args.quick, "seed": args.seed,
        "goals": {"p1_max_ratio": GOAL_P1_RATIO, "p5_max_seconds": GOAL_P5_SECONDS,
                  "p5_max_memory_ratio": GOAL_P5_MEMORY_RATIO},
        "p1": p1, "p5_n_clients": m5, "p5": p5, "all_pass": ok,
        "environment": {"numpy": np.__version__, "numba": numba.__version__,
                        "python": sys.version.split()[0], "cpu_count": os.cpu_count(),
                        "numba_threads": numba.get_num_threads()},
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return result


if __name__ == "__main__":
    main()
