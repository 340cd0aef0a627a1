"""Benchmark P3: heteroskedastic grid NPMLE, ebfl (Numba + active-set mix-SQP) vs R's mixsqp.

Data (``--data``, both by default), n = 10^5 observations x_i ~ N(theta_i, s_i^2),
s_i uniform on [0.5, 1.5], a 300-point grid from min(x) to max(x):

p3         theta_i from half a point mass at 0 and half N(2, 0.5^2).
sparse     sparse signals: 70% of theta_i exactly 0, the rest +-Exp(mean 2), the
           shape on which the solver used to stop two iterations in, hundreds of
           nats short (before the mass moves of ``ebfl.eb.mixture_weights``).

ours       ``ebfl.npmle_normal(x, s, n_grid=300)``, the whole call (likelihood
           matrix, mix-SQP to kkt <= 1e-8, posterior means), Numba warmed up;
           best of ``--reps``. The likelihood matrix alone (n K exps, written
           once) is timed too: the part no algorithm avoids.
mixsqp     R's ``mixsqp(L)`` (Kim et al. 2020) through ``Rscript mixsqp_p3.R``
           on the same x, s and grid: L built with ``dnorm``, then mixsqp with its
           default settings, timed apart and together; its log-likelihood is
           recomputed on our scale (with the normal constant). Skipped, and said
           so, when R or the mixsqp package is not installed (Debian:
           ``apt-get install r-base-core r-cran-mixsqp libopenblas0-pthread``).
reference  plain numpy EM (Laird 1978): the likelihood matrix by broadcasting,
           then ``f = L @ w; w *= L.T @ (1 / f) / n`` until its log-likelihood
           reaches ours minus ``delta``, for delta = 1, 0.1 and 0.01 nats (all
           read off one run), or until ``--budget`` seconds have passed.

The goal, on each data set, is mixsqp's time / ours >= 10 at equal or higher
log-likelihood (the mixsqp call alone against our whole call). Against EM, the
ratio is reported at delta = 0.01 nats, as a lower bound (">=") when EM does not
get there.

``--large`` adds n = 10^6 and 10^7 fits of the p3 data with ``bins="auto"``
(certified heteroskedastic binning), each in a fresh subprocess that reports its
time, its peak RSS above the RSS before the fit (``VmHWM`` after resetting the
peak mark), the binning bound E and the number of cells; at 10^6 the exact fit
too, so that the realized loss of the binned prior can be set against its bound.

``--quick``: n = 2 * 10^4 and a 60 s budget. ``--json`` prints one JSON object.
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from _timing import best_of, reset_peak_rss, rss_kib

import ebfl
from ebfl.eb.mixture_weights import _gradient
from ebfl.eb.npmle import BIN_ERROR, _normal_likelihood_matrix

GOAL_RATIO = 10.0
DELTAS = (1.0, 0.1, 0.01)
EQUAL_DELTA = 0.01
N_GRID = 300
LARGE_SIZES = (1_000_000, 10_000_000)
R_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixsqp_p3.R")
R_NOT_INSTALLED = "R/mixsqp not installed: skipped"


def make_data(n, seed):
    """The P3 data: half a point mass at 0, half N(2, 0.5^2)."""
    rng = np.random.default_rng(seed)
    theta = np.where(rng.random(n) < 0.5, 0.0, rng.normal(2.0, 0.5, n))
    s = rng.uniform(0.5, 1.5, n)
    return theta + s * rng.standard_normal(n), s


def make_sparse_data(n, seed):
    """Sparse signals: 70% of the effects exactly 0, the rest +-Exp(mean 2)."""
    rng = np.random.default_rng(seed)
    theta = np.where(rng.random(n) < 0.7, 0.0,
                     rng.exponential(2.0, n) * rng.choice([-1.0, 1.0], n))
    s = rng.uniform(0.5, 1.5, n)
    return theta + s * rng.standard_normal(n), s


DATASETS = {"p3": make_data, "sparse": make_sparse_data}


def numpy_likelihood(x, s, grid):
    log_lik = (-0.5 * ((x[:, None] - grid[None, :]) / s[:, None]) ** 2
               - np.log(s)[:, None] - 0.5 * np.log(2 * np.pi))
    shift = log_lik.max(axis=1)
    return np.exp(log_lik - shift[:, None]), shift


def reference_em(x, s, grid, best, budget):
    """Plain EM; returns {delta: seconds to reach best - delta} (None if not) and stats."""
    targets = {delta: best - delta for delta in DELTAS}
    t0 = time.perf_counter()
    lik, shift = numpy_likelihood(x, s, grid)
    n = x.size
    const = float(shift.sum())
    w = np.full(grid.size, 1.0 / grid.size)
    reached = {delta: None for delta in targets}
    it = 0
    while True:
        f = lik @ w
        ll = const + float(np.log(f).sum())
        elapsed = time.perf_counter() - t0
        for delta, target in targets.items():
            if reached[delta] is None and ll >= target:
                reached[delta] = elapsed
                print(f"  reference EM within {delta:g} nats after {it} iterations, "
                      f"{elapsed:.1f} s", file=sys.stderr)
        if all(v is not None for v in reached.values()) or elapsed > budget:
            return reached, {"iterations": it, "seconds": elapsed, "log_likelihood": ll}
        if it % 500 == 0:
            print(f"  reference EM: iteration {it}, {elapsed:.0f} s, gap "
                  f"{best - ll:.4f} nats", file=sys.stderr)
        w = w * (lik.T @ (1.0 / f)) / n
        it += 1


def time_one_pass(x, s, grid, w):
    """Best-of-5 seconds of one pass over L: the fused Numba kernel (f on the support of
    w, the gradient over the whole grid) and the two numpy mat-vecs."""
    lik, _ = numpy_likelihood(x, s, grid)
    ones = np.ones(x.size)
    _gradient(lik, w, ones)
    t_kernel, _ = best_of(lambda: _gradient(lik, w, ones), 5)

    def numpy_pass():
        f = lik @ w
        return lik.T @ (1.0 / f), np.log(f).sum()

    t_numpy, _ = best_of(numpy_pass, 5)
    return t_kernel, t_numpy


def run_mixsqp(x, s, grid):
    """R's mixsqp on the same data and grid, or None when R/mixsqp is missing."""
    rscript = shutil.which("Rscript")
    if rscript is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for name, values in (("x", x), ("s", s), ("grid", grid)):
            values.astype("<f8").tofile(os.path.join(tmp, f"{name}.bin"))
        proc = subprocess.run([rscript, R_SCRIPT, tmp], capture_output=True, text=True)
    if proc.returncode != 0:
        if "there is no package called" in proc.stderr:
            return None
        raise RuntimeError(f"{R_SCRIPT} failed:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["total_seconds"] = out["likelihood_matrix_seconds"] + out["mixsqp_seconds"]
    return out


# ------------------------------------------------------------------ n = 10^6, 10^7

def large_child(n, bins, seed):
    """Body of a --large subprocess: one fit, one JSON line with time and memory."""
    x, s = make_data(n, seed)
    ebfl.npmle_normal(x[:5000], s[:5000], n_grid=N_GRID, bins=bins)  # compile the kernels
    gc.collect()
    reset = reset_peak_rss()
    baseline = rss_kib()  # after the reset: the peak mark is now this RSS
    t0 = time.perf_counter()
    fit = ebfl.npmle_normal(x, s, n_grid=N_GRID, bins=bins)
    seconds = time.perf_counter() - t0
    peak = rss_kib("VmHWM")
    d = fit.diagnostics
    print(json.dumps({
        "n": n, "bins": bins, "bin_error": BIN_ERROR if bins == "auto" else None,
        "seconds": seconds, "iterations": fit.n_iter, "kkt": fit.kkt,
        "converged": fit.converged, "log_likelihood": fit.log_likelihood,
        "rows_fitted": int(d["n_rows"]), "atoms": int(np.count_nonzero(fit.weights)),
        "binning_error_bound": d.get("binning_error_bound"),
        "log_likelihood_gap_bound": d.get("log_likelihood_gap_bound", n * fit.kkt),
        "rss_baseline_kib": baseline, "rss_peak_kib": peak,
        "rss_increase_kib": peak - baseline, "peak_reset_before_fit": reset,
        "inputs_outputs_bytes": 4 * 8 * n}))


def run_large(seed, with_exact=True):
    """The n = 10^6 and 10^7 fits (binned), and at 10^6 the exact fit, in subprocesses."""
    out = []
    jobs = [(n, "auto") for n in LARGE_SIZES]
    if with_exact:
        jobs.insert(1, (LARGE_SIZES[0], "none"))
    for n, bins in jobs:
        cmd = [sys.executable, os.path.abspath(__file__), "--large-child", str(n), bins,
               "--seed", str(seed)]
        r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print(f"  n = {n:.0e}, bins={bins}: {r['seconds']:.2f} s, RSS +"
              f"{r['rss_increase_kib'] / 1024:.0f} MiB", file=sys.stderr)
        out.append(r)
    exact = next((r for r in out if r["bins"] is None), None)
    if exact is not None:
        binned = next(r for r in out if r["n"] == exact["n"] and r["bins"] == "auto")
        binned["exact_log_likelihood"] = exact["log_likelihood"]
        binned["realized_loss"] = exact["log_likelihood"] - binned["log_likelihood"]
    return out


# ------------------------------------------------------------------------ main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 2e4, 60 s budget")
    ap.add_argument("--n", type=int, help="number of observations (overrides --quick)")
    ap.add_argument("--data", nargs="+", choices=sorted(DATASETS), default=["p3", "sparse"],
                    help="data sets (default: both)")
    ap.add_argument("--budget", type=float, help="seconds allowed to the reference EM")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the ebfl fit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-r", action="store_true", help="skip R's mixsqp")
    ap.add_argument("--large", action="store_true",
                    help="add n = 1e6 and 1e7 (binned; subprocesses; minutes, ~2 GB)")
    ap.add_argument("--large-child", nargs=2, metavar=("N", "BINS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.large_child:
        n, bins = args.large_child
        return large_child(int(n), None if bins == "none" else bins, args.seed)
    n = args.n or (20_000 if args.quick else 100_000)
    budget = args.budget or (60.0 if args.quick else 900.0)

    x, s = make_data(5000, args.seed)
    ebfl.npmle_normal(x, s, n_grid=N_GRID)  # compile the kernels
    datasets = {name: run_dataset(name, n, args.seed, args.reps, budget, args.no_r)
                for name in args.data}
    result = {"n": n, "n_grid": N_GRID, "budget_seconds": budget, "datasets": datasets}
    if args.large:
        result["large"] = run_large(args.seed)
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    _print_text(result, budget)
    return result


def run_dataset(name, n, seed, reps, budget, no_r):
    """ours, mixsqp and the EM reference on one data set."""
    print(f"{name}:", file=sys.stderr)
    x, s = DATASETS[name](n, seed)
    t_ours, fit = best_of(lambda: ebfl.npmle_normal(x, s, n_grid=N_GRID), reps)
    print(f"  ebfl.npmle_normal: {t_ours:.2f} s, {fit.n_iter} iterations, "
          f"log-likelihood {fit.log_likelihood:.4f}, kkt {fit.kkt:.2e}", file=sys.stderr)
    t_matrix, _ = best_of(lambda: _normal_likelihood_matrix(x, s, fit.grid), reps)
    t_kernel, t_numpy = time_one_pass(x, s, fit.grid, fit.weights)
    gc.collect()

    mixsqp = None if no_r else run_mixsqp(x, s, fit.grid)
    if mixsqp is None:
        print("  " + (R_NOT_INSTALLED if not no_r else "R/mixsqp: skipped (--no-r)"),
              file=sys.stderr)
        goal = {"ratio_mixsqp_over_ours": GOAL_RATIO, "met": None,
                "note": R_NOT_INSTALLED if not no_r else "skipped (--no-r)"}
    else:
        mixsqp["ratio_mixsqp_over_ours"] = mixsqp["mixsqp_seconds"] / t_ours
        mixsqp["ratio_total_over_ours"] = mixsqp["total_seconds"] / t_ours
        mixsqp["log_likelihood_ours_minus_mixsqp"] = (fit.log_likelihood
                                                      - mixsqp["log_likelihood"])
        goal = {"ratio_mixsqp_over_ours": GOAL_RATIO,
                "met": bool(mixsqp["ratio_mixsqp_over_ours"] >= GOAL_RATIO
                            and mixsqp["log_likelihood_ours_minus_mixsqp"] >= 0)}

    reached, ref = reference_em(x, s, fit.grid, fit.log_likelihood, budget)
    ratios = {}
    for delta in DELTAS:
        if reached[delta] is None:
            ratios[str(delta)] = {"at_least": ref["seconds"] / t_ours}
        else:
            ratios[str(delta)] = {"equals": reached[delta] / t_ours}
    return {
        "ours": {"seconds": t_ours, "iterations": fit.n_iter, "kkt": fit.kkt,
                 "converged": fit.converged, "log_likelihood": fit.log_likelihood,
                 "atoms": int(np.count_nonzero(fit.weights)),
                 "likelihood_matrix_seconds": t_matrix},
        "mixsqp": mixsqp if mixsqp is not None else {"skipped": goal["note"]},
        "reference": {**ref, "seconds_to_delta": {str(k): v for k, v in reached.items()}},
        "ratio_reference_over_ours": ratios,
        "pass_seconds": {"numba_fused": t_kernel, "numpy_two_matvecs": t_numpy,
                         "ratio": t_numpy / t_kernel},
        "goal": goal,
    }


def _print_text(result, budget):
    for name, r in result["datasets"].items():
        _print_dataset(name, r, result["n"], budget)
    for r in result.get("large", []):
        bins = f"bins='auto' (bin_error={r['bin_error']:g})" if r["bins"] else "exact"
        line = (f"  n = {r['n']:.0e} {bins}: {r['seconds']:.2f} s, peak RSS +"
                f"{r['rss_increase_kib'] / 1024:.0f} MiB (inputs+outputs "
                f"{r['inputs_outputs_bytes'] / 2**20:.0f} MiB), {r['rows_fitted']} rows, "
                f"kkt {r['kkt']:.1e}")
        if r["bins"]:
            line += f", E = {r['binning_error_bound']:.3g}"
        if "realized_loss" in r:
            line += (f", exact log-lik - binned = {r['realized_loss']:.4f} (certified <= "
                     f"{r['log_likelihood_gap_bound']:.3g})")
        print(line)


def _print_dataset(name, result, n, budget):
    ours, ref = result["ours"], result["reference"]
    print(f"P3 heteroskedastic NPMLE, {name} data, n = {n}, grid {N_GRID}")
    print(f"  ebfl.npmle_normal     {ours['seconds']:8.2f} s   ({ours['iterations']} "
          f"iterations, kkt {ours['kkt']:.1e}, {ours['atoms']} atoms, log-lik "
          f"{ours['log_likelihood']:.4f})")
    print(f"    of which the likelihood matrix alone {ours['likelihood_matrix_seconds']:.2f} s "
          f"({100 * ours['likelihood_matrix_seconds'] / ours['seconds']:.0f}%)")
    r = result["mixsqp"]
    if "skipped" in r:
        print(f"  {r['skipped']}")
    else:
        print(f"  R mixsqp {r['mixsqp_version']}        {r['mixsqp_seconds']:8.2f} s   "
              f"({r['iterations']} iterations, log-lik {r['log_likelihood']:.4f}; "
              f"+ {r['likelihood_matrix_seconds']:.2f} s for L by dnorm = "
              f"{r['total_seconds']:.2f} s)")
        print(f"  ratio mixsqp / ours: {r['ratio_mixsqp_over_ours']:.1f}x "
              f"(with L: {r['ratio_total_over_ours']:.1f}x); log-lik ours - mixsqp = "
              f"{r['log_likelihood_ours_minus_mixsqp']:+.4f}")
    print(f"  numpy EM reference    {ref['seconds']:8.2f} s   ({ref['iterations']} iterations, "
          f"log-lik {ref['log_likelihood']:.4f})")
    for delta in DELTAS:
        ratio = result["ratio_reference_over_ours"][str(delta)]
        text = (f"= {ratio['equals']:.1f}x" if "equals" in ratio
                else f">= {ratio['at_least']:.1f}x (reference did not get there in {budget:g} s)")
        print(f"  EM / ours within {delta:>5g} nats: {text}")
    p = result["pass_seconds"]
    print(f"  one pass over L: Numba {p['numba_fused'] * 1e3:.1f} ms vs numpy "
          f"{p['numpy_two_matvecs'] * 1e3:.1f} ms ({p['ratio']:.2f}x)")
    goal = result["goal"]
    met = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
    print(f"  goal mixsqp / ours >= {GOAL_RATIO:g}x at equal or higher log-likelihood: {met}")


if __name__ == "__main__":
    main()
