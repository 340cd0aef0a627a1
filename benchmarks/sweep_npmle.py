"""Sweep: is every NPMLE fit certified on the data shapes users have?

Normal means: six shapes of effects (sparse with exponential or normal slabs, t_3,
three atoms, skewed gamma, a bulk with far outliers) times three kinds of standard
errors (constant, uniform on [0.5, 1.5], log-uniform over three decades) times
``--sizes`` (200, 2,000 and 20,000 observations) times ``--seeds`` seeds. Binomial:
five populations (Beta(2, 8), rare Beta(0.3, 30), 80% exactly 0, two atoms, 0/0.3/1)
of 300 to 100,000 clients with ragged trials (uniform on 1..199, or Pareto).

A fit passes when it is ``converged`` (default call), its kkt recomputed from scipy's
densities is at most 1e-8 (+1e-10 for rounding), and its log-likelihood is at least
that of plain EM from the uniform weights on the same grid (2,000 iterations up to
2,000 observations, 200 above; EM never decreases, so it is a lower bound on the
optimum). Prints one line per fit and the number that fail; ``--json`` prints one
object instead. ``--quick``: sizes 200 and 2,000, one seed.

Used to count the failures of the solver before and after its mass moves (see
``ebfl.eb.mixture_weights``): before, 16 of 72 normal fits up to 2,000 observations,
13 of 36 at 20,000 and 7 of 30 binomial fits stopped uncertified.
"""

import argparse
import json
import time
import warnings

import numpy as np
from scipy import special, stats

from ebfl.eb import npmle_binomial, npmle_normal

NORMAL_SHAPES = ("sparse_exp", "sparse_normal", "t3", "three_point", "skewed", "outliers")
SPREADS = ("constant", "uniform", "decades")
BINOMIAL_CASES = ((30_000, "beta28"), (30_000, "rare"), (5_000, "sparse"), (300, "beta28"),
                  (100_000, "two"))
KKT_OK = 1e-8 + 1e-10


def normal_data(shape, n, spread, seed):
    rng = np.random.default_rng(seed)
    theta = {
        "sparse_exp": lambda: np.where(rng.random(n) < 0.7, 0.0,
                                       rng.exponential(2, n) * rng.choice([-1, 1], n)),
        "sparse_normal": lambda: np.where(rng.random(n) < 0.9, 0.0, rng.normal(0, 3, n)),
        "t3": lambda: rng.standard_t(3, n),
        "three_point": lambda: rng.choice([-3.0, 0.0, 3.0], n, p=[0.2, 0.6, 0.2]),
        "skewed": lambda: rng.gamma(0.5, 2.0, n),
        "outliers": lambda: np.where(rng.random(n) < 0.98, rng.normal(0, 0.5, n),
                                     rng.choice([-40.0, 60.0], n)),
    }[shape]()
    s = {"constant": lambda: np.ones(n), "uniform": lambda: rng.uniform(0.5, 1.5, n),
         "decades": lambda: np.exp(rng.uniform(np.log(0.1), np.log(100), n))}[spread]()
    return theta + s * rng.standard_normal(n), s


def binomial_data(shape, m, seed):
    rng = np.random.default_rng(seed)
    p = {"beta28": lambda: rng.beta(2, 8, m), "rare": lambda: rng.beta(0.3, 30, m),
         "sparse": lambda: np.where(rng.random(m) < 0.8, 0.0, rng.uniform(0, 1, m)),
         "two": lambda: rng.choice([0.05, 0.5], m)}[shape]()
    n = (rng.integers(1, 200, m) if seed % 2 == 0
         else np.maximum(1, (rng.pareto(1.0, m) * 5).astype(np.int64)))
    return rng.binomial(n, p), n


def check(fit, log_lik, counts, em_iter):
    """(passed, independent kkt, fit minus EM) for a fit and its log densities."""
    with np.errstate(divide="ignore"):
        log_f = special.logsumexp(log_lik + np.log(fit.weights), axis=1)
    kkt = float((counts @ np.exp(log_lik - log_f[:, None]) / counts.sum()).max() - 1.0)
    shift = log_lik.max(axis=1)
    lik = np.exp(log_lik - shift[:, None])
    w = np.full(lik.shape[1], 1.0 / lik.shape[1])
    for _ in range(em_iter):
        w *= lik.T @ (counts / (lik @ w)) / counts.sum()
    em = float(counts @ (np.log(lik @ w) + shift))
    gap = fit.log_likelihood - em
    return bool(fit.converged and kkt <= KKT_OK and gap >= -1e-6 * abs(em)), kkt, gap


def run(sizes, seeds, verbose):
    rows = []
    for n in sizes:
        for shape in NORMAL_SHAPES:
            for spread in SPREADS:
                for seed in range(seeds):
                    x, s = normal_data(shape, n, spread, seed)
                    fit, seconds = _fit(npmle_normal, x, s)
                    log_lik = stats.norm.logpdf(x[:, None], fit.grid, s[:, None])
                    rows.append(_record("normal", f"{shape}/{spread}", n, seed, fit, seconds,
                                        log_lik, np.ones(n), 2000 if n <= 2000 else 200,
                                        verbose))
    for seed in range(6 if seeds > 1 else 2):
        for m, shape in BINOMIAL_CASES:
            z, n = binomial_data(shape, m, seed)
            fit, seconds = _fit(npmle_binomial, z, n)
            # on the distinct (n, z) pairs with their multiplicities: the same sums
            pairs, counts = np.unique(np.stack([n, z], axis=1), axis=0, return_counts=True)
            log_lik = stats.binom.logpmf(pairs[:, 1:], pairs[:, :1], fit.grid[None, :])
            rows.append(_record("binomial", shape, m, seed, fit, seconds, log_lik,
                                counts.astype(np.float64), 2000 if m <= 2000 else 200,
                                verbose))
    return rows


def _fit(function, *data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # counted below, not printed
        t0 = time.perf_counter()
        fit = function(*data)
        return fit, time.perf_counter() - t0


def _record(model, shape, n, seed, fit, seconds, log_lik, counts, em_iter, verbose):
    passed, kkt, gap = check(fit, log_lik, counts, em_iter)
    row = {"model": model, "shape": shape, "n": n, "seed": seed, "passed": passed,
           "converged": bool(fit.converged), "kkt": kkt, "iterations": fit.n_iter,
           "minus_em": gap, "seconds": seconds}
    if verbose:
        print(f"{model:8s} {shape:22s} n={n:6d} seed={seed} {'ok ' if passed else 'FAIL'} "
              f"kkt={kkt:9.2e} iterations={fit.n_iter:3d} fit-EM={gap:+10.3f} "
              f"{seconds:6.2f} s", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 200 and 2,000, one seed")
    ap.add_argument("--sizes", type=int, nargs="+", help="normal-means sizes")
    ap.add_argument("--seeds", type=int, help="seeds per case (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    sizes = args.sizes or ((200, 2000) if args.quick else (200, 2000, 20_000))
    seeds = args.seeds or (1 if args.quick else 2)
    rows = run(sizes, seeds, not args.json)
    failed = {model: sum(not r["passed"] for r in rows if r["model"] == model)
              for model in ("normal", "binomial")}
    total = {model: sum(r["model"] == model for r in rows) for model in failed}
    result = {"failed": failed, "fits": total, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for model in failed:
            print(f"{model}: {failed[model]} of {total[model]} fits not certified")
    return result


if __name__ == "__main__":
    main()
