"""Benchmark: ebfl's ``ebnm`` against R's ebnm, prior family by prior family (mode 0,
or ``--mode``).

Data: n = 10^5 (``--n``; ``--quick``: 10^4) sparse heteroskedastic observations
x_i ~ N(theta_i, s_i^2): 80% of the theta_i exactly 0, the rest 2 t_5; s_i = 10^u,
u uniform on [-0.5, 0.5] (one decade of standard errors).

ebfl   ``ebfl.ebnm(x, s, family, mode=0)``, the whole call (fit and posteriors),
       after a warm-up call on 2000 points (Numba compiles); best of ``--reps``.
R      ``ebnm(x, s, prior_family = family, mode = 0)`` of R's ebnm (Willwerscheid,
       Carbonetto & Stephens; ``bash ../shared/peers/r-ebnm/install.sh``), all
       families in one ``Rscript`` process on the same x and s, each call timed
       inside R by ``system.time`` (elapsed), so the process start and the package
       load are excluded; best of ``--r-reps`` (default 1: R's unimodal families take
       minutes at n = 10^5). R's errors are caught per family and reported. When R or
       the package is missing (or ``--no-r``), ebfl alone is timed, and the report
       says so.

Reported per family: both times, R / ebfl, both log-likelihoods and their
difference (ebfl - R; flat has none).

``--mode`` sets the prior's mode of both (a number, or ``estimate``; default 0;
npmle and flat have none).

``--large [N]`` adds ebfl alone at n = N (default 10^7) on the families asked
for, one fit each, with the grid families' certificate on the data (kkt and the
log-likelihood gap bound).
``--json`` prints one JSON object. Run R's side only here: never copy its code (GPL).
"""

import argparse
import csv
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from _timing import best_of

import ebfl
from ebfl.eb.normal_means import FAMILIES

LARGE_N = 10_000_000
R_NOT_INSTALLED = "R/ebnm not installed: ebfl only"

# One R process: reads DIR/x.bin and DIR/s.bin (little-endian float64), DIR/families.txt,
# DIR/reps.txt and DIR/mode.txt; writes DIR/results.csv (family, best elapsed seconds,
# log-likelihood, error) and DIR/version.txt.
R_CODE = r"""
suppressPackageStartupMessages(library(ebnm))
dir <- commandArgs(trailingOnly = TRUE)[1]
read_doubles <- function(path) {
  readBin(path, what = "double", n = file.size(path) / 8, size = 8, endian = "little")
}
x <- read_doubles(file.path(dir, "x.bin"))
s <- read_doubles(file.path(dir, "s.bin"))
families <- readLines(file.path(dir, "families.txt"))
reps <- as.integer(readLines(file.path(dir, "reps.txt")))
mode <- readLines(file.path(dir, "mode.txt"))
if (mode != "estimate") mode <- as.numeric(mode)
rows <- vector("list", length(families))
for (i in seq_along(families)) {
  best <- Inf
  ll <- NA_real_
  err <- ""
  for (r in seq_len(reps)) {
    fit <- NULL
    secs <- system.time(fit <- tryCatch(
      suppressWarnings(ebnm(x, s, prior_family = families[i], mode = mode)),
      error = function(e) e))[["elapsed"]]
    if (inherits(fit, "error")) {
      err <- conditionMessage(fit)
      break
    }
    best <- min(best, secs)
    value <- as.numeric(fit$log_likelihood)
    if (length(value) == 1) ll <- value
    fit <- NULL
    invisible(gc())
  }
  rows[[i]] <- data.frame(family = families[i],
                          seconds = if (nzchar(err)) "NA" else sprintf("%.17g", best),
                          log_likelihood = sprintf("%.17g", ll), error = err)
}
write.csv(do.call(rbind, rows), file.path(dir, "results.csv"), row.names = FALSE)
writeLines(as.character(packageVersion("ebnm")), file.path(dir, "version.txt"))
"""


def make_data(n, seed):
    """Sparse heteroskedastic normal means: 80% zeros, 2 t_5 effects, s over a decade."""
    rng = np.random.default_rng(seed)
    theta = np.where(rng.random(n) < 0.8, 0.0, 2.0 * rng.standard_t(5, n))
    s = 10.0 ** rng.uniform(-0.5, 0.5, n)
    return theta + s * rng.standard_normal(n), s


def run_r(x, s, families, reps, mode=0.0):
    """R's ebnm on every family: {"version", "families": {family: {seconds,
    log_likelihood, error}}}, or None when R or the ebnm package is missing."""
    rscript = shutil.which("Rscript")
    if rscript is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for name, values in (("x", x), ("s", s)):
            np.ascontiguousarray(values, dtype="<f8").tofile(os.path.join(tmp, f"{name}.bin"))
        with open(os.path.join(tmp, "families.txt"), "w") as f:
            f.write("\n".join(families) + "\n")
        with open(os.path.join(tmp, "reps.txt"), "w") as f:
            f.write(f"{reps}\n")
        with open(os.path.join(tmp, "mode.txt"), "w") as f:
            f.write(f"{mode!r}\n" if mode != "estimate" else "estimate\n")
        script = os.path.join(tmp, "bench_ebnm.R")
        with open(script, "w") as f:
            f.write(R_CODE)
        proc = subprocess.run([rscript, script, tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            if "there is no package called" in proc.stderr:
                return None
            raise RuntimeError(f"R's ebnm benchmark failed:\n{proc.stderr}")
        with open(os.path.join(tmp, "results.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        with open(os.path.join(tmp, "version.txt")) as f:
            version = f.read().strip()
    out = {}
    for row in rows:
        seconds = None if row["seconds"] == "NA" else float(row["seconds"])
        ll = None if row["log_likelihood"] in ("NA", "NaN") else float(row["log_likelihood"])
        out[row["family"]] = {"seconds": seconds,
                              "log_likelihood": ll if ll is None or math.isfinite(ll) else None,
                              "error": row["error"] or None}
    return {"version": version, "families": out}


def time_ebfl(x, s, family, reps, mode=0.0):
    seconds, fit = best_of(lambda: ebfl.ebnm(x, s, family, mode), reps)
    return seconds, fit.log_likelihood


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 1e4")
    ap.add_argument("--n", type=int, help="number of observations (overrides --quick)")
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                    help="prior families (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each ebfl fit")
    ap.add_argument("--r-reps", type=int, default=1, help="repetitions of each R fit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-r", action="store_true", help="skip R's ebnm")
    ap.add_argument("--large", type=float, nargs="?", const=LARGE_N, default=None,
                    metavar="N", help="add ebfl alone at n = N (default 1e7) on every "
                                      "family asked for (one fit each)")
    ap.add_argument("--mode", default="0",
                    help='the prior mode: a number or "estimate" (default 0)')
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    n = args.n or (10_000 if args.quick else 100_000)
    mode = "estimate" if args.mode == "estimate" else float(args.mode)

    x, s = make_data(n, args.seed)
    wx, ws = make_data(2000, args.seed + 1)
    for family in args.families:  # compile the kernels
        ebfl.ebnm(wx, ws, family, mode)

    rows = {}
    for family in args.families:
        gc.collect()
        seconds, ll = time_ebfl(x, s, family, args.reps, mode)
        rows[family] = {"ebfl_seconds": seconds, "ebfl_log_likelihood": ll}
        print(f"  ebfl {family}: {seconds:.3f} s", file=sys.stderr)

    if args.no_r:
        peer, r_note = None, "R skipped (--no-r): ebfl only"
    else:
        print("  R's ebnm ...", file=sys.stderr)
        peer = run_r(x, s, args.families, args.r_reps, mode)
        r_note = R_NOT_INSTALLED if peer is None else f"R ebnm {peer['version']}"
    for family, row in rows.items():
        r = None if peer is None else peer["families"].get(family)
        row.update({"r_seconds": None, "r_log_likelihood": None, "r_error": None,
                    "ratio_r_over_ebfl": None, "log_likelihood_ebfl_minus_r": None})
        if r is None:
            continue
        row.update({"r_seconds": r["seconds"], "r_log_likelihood": r["log_likelihood"],
                    "r_error": r["error"]})
        if r["seconds"] is not None:
            row["ratio_r_over_ebfl"] = r["seconds"] / row["ebfl_seconds"]
        if r["log_likelihood"] is not None and row["ebfl_log_likelihood"] is not None:
            row["log_likelihood_ebfl_minus_r"] = (row["ebfl_log_likelihood"]
                                                  - r["log_likelihood"])

    result = {"n": n, "mode": mode, "seed": args.seed, "reps": args.reps,
              "r_reps": args.r_reps,
              "r": {"available": peer is not None, "note": r_note}, "families": rows}
    if args.large is not None:
        result["large"] = run_large(args.seed, args.families, mode, args.large)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_text(result)
    return result


def run_large(seed, families, mode=0.0, n=LARGE_N):
    """ebfl alone at n (default 10^7), one fit per family: seconds, log-likelihood and
    (grid families) the certificate on the data."""
    x, s = make_data(int(n), seed)
    out = {}
    for family in families:
        gc.collect()
        seconds, fit = best_of(lambda family=family: ebfl.ebnm(x, s, family, mode), 1)
        d = fit.diagnostics
        print(f"  ebfl {family} at n = {n:.0e}: {seconds:.2f} s", file=sys.stderr)
        out[family] = {"n": int(n), "ebfl_seconds": seconds,
                       "ebfl_log_likelihood": fit.log_likelihood,
                       "converged": d.get("converged"), "kkt": d.get("kkt"),
                       "log_likelihood_gap_bound": d.get("log_likelihood_gap_bound"),
                       "n_cells": d.get("n_cells")}
    return out


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


def _print_text(result):
    print(f"ebnm per prior family (mode {result['mode']}), sparse heteroskedastic data, "
          f"n = {result['n']}; "
          f"{result['r']['note']}")
    print(f"  ebfl best of {result['reps']}" + (f", R best of {result['r_reps']} (system.time "
                                               f"inside R)" if result["r"]["available"] else ""))
    print(f"  {'family':22s} {'ebfl s':>9s} {'R s':>9s} {'R/ebfl':>8s} "
          f"{'log-lik ebfl':>16s} {'log-lik R':>16s} {'ebfl - R':>10s}")
    for family, row in result["families"].items():
        print(f"  {family:22s} {row['ebfl_seconds']:9.3f} {_num(row['r_seconds'], '9.3f'):>9s} "
              f"{_num(row['ratio_r_over_ebfl'], '8.1f'):>8s} "
              f"{_num(row['ebfl_log_likelihood'], '16.4f'):>16s} "
              f"{_num(row['r_log_likelihood'], '16.4f'):>16s} "
              f"{_num(row['log_likelihood_ebfl_minus_r'], '+10.4f'):>10s}"
              + (f"  R error: {row['r_error']}" if row["r_error"] else ""))
    for family, row in result.get("large", {}).items():
        ll = row["ebfl_log_likelihood"]
        cert = ("" if row.get("kkt") is None else
                f", kkt {row['kkt']:.2g} (gap bound {row['log_likelihood_gap_bound']:.3g})")
        print(f"  ebfl {family} at n = {row['n']:.0e}: {row['ebfl_seconds']:.2f} s, log-lik "
              f"{_num(ll, '.4f')}{cert}")


if __name__ == "__main__":
    main()
