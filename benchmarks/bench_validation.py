"""Benchmark P2: the Theorem 3 Monte Carlo check, m = 10^4, n = 14, R = 10^3 replicates.

ours       ``ebfl.validation.CHECKS["thm3"].run(n_reps=R)``: per replicate, the
           histogram of the counts is drawn (Multinomial over z = 0..n, exact
           because clients are exchangeable) and p_i is integrated out given z_i;
           a Numba kernel evaluates estimator (6) once per distinct z.
loop       a straightforward numpy loop over replicates: draw p_i ~ Beta and
           z_i ~ Bin(n, p_i) for every client, estimator (6) vectorized over
           clients, squared errors, a^2, (1 - a)^2 and the event.
floor      merely drawing p_i and the binomial counts z_i with numpy for all
           R x m clients (what any per-client simulation must pay).

Goals: loop / ours >= 10 and ours / floor <= 2. All three are measured in this
run, best of ``--reps`` (Numba compiled beforehand). ``--quick``: R = 100.
``--json`` prints one JSON object.
"""

import argparse
import json
import math

import numpy as np
from _timing import best_of

from ebfl.validation import CHECKS

M, N, ALPHA, BETA = 10_000, 14, 2.0, 2.0
GOAL_LOOP_RATIO = 10.0
GOAL_FLOOR_RATIO = 2.0


def numpy_loop(n_reps, seed):
    """Theorem 3's simulation written the obvious way; returns the mean MSE."""
    rng = np.random.default_rng(seed)
    c = math.sqrt(3 * math.log(4 * M * M * N) / (M - 1))
    mu_true, var_true = ALPHA / (ALPHA + BETA), ALPHA * BETA / ((ALPHA + BETA) ** 2
                                                               * (ALPHA + BETA + 1))
    mse = np.empty(n_reps)
    for r in range(n_reps):
        p = rng.beta(ALPHA, BETA, M)
        x = rng.binomial(N, p) / N
        total = x.sum()
        mu = (total - x) / (M - 1)  # leave-one-out means
        dev = x - mu  # as printed: each x_l centred on its own mu_l
        var = (np.sum(dev**2) - dev**2) / (M - 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = N / (mu * (1 - mu) / var - 1 + N)
        a = np.clip(np.nan_to_num(a, nan=0.0, posinf=1.0), 0.0, 1.0)
        est = a * x + (1 - a) * mu
        mse[r] = np.mean((est - p) ** 2)
        _ = (np.mean(a**2), np.mean((1 - a) ** 2),
             np.any(np.abs(mu - mu_true) > c) or np.any(np.abs(var - var_true) > c))
    return float(mse.mean())


def rng_floor(n_reps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n_reps):
        rng.binomial(N, rng.beta(ALPHA, BETA, M))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="R = 100 replicates")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each timing")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n_rep = 100 if args.quick else 1000

    check = CHECKS["thm3"]
    check.run(n_reps=10, rng=0)  # compile the kernel
    t_ours, rows = best_of(lambda: check.run(n_reps=n_rep, rng=args.seed), args.reps)
    t_loop, loop_mse = best_of(lambda: numpy_loop(n_rep, args.seed), args.reps)
    t_floor, _ = best_of(lambda: rng_floor(n_rep, args.seed), args.reps)
    ours = rows[0]
    result = {
        "m": M, "n": N, "replicates": n_rep,
        "seconds": {"ours": t_ours, "numpy_loop": t_loop, "rng_floor": t_floor},
        "ratios": {"loop_over_ours": t_loop / t_ours, "ours_over_floor": t_ours / t_floor},
        "mse": {"ours": ours.estimate, "ours_se": ours.se, "numpy_loop": loop_mse},
        "goals": {"loop_over_ours_at_least": GOAL_LOOP_RATIO,
                  "ours_over_floor_at_most": GOAL_FLOOR_RATIO,
                  "met": t_loop / t_ours >= GOAL_LOOP_RATIO
                  and t_ours / t_floor <= GOAL_FLOOR_RATIO},
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    print(f"P2 Theorem 3 check, m = {M}, n = {N}, R = {n_rep}")
    print(f"  ours (histogram + Numba)  {t_ours:8.3f} s   MSE {ours.estimate:.6f} "
          f"± {ours.se:.1e}")
    print(f"  numpy loop over n_reps      {t_loop:8.3f} s   MSE {loop_mse:.6f}")
    print(f"  RNG floor (beta+binomial) {t_floor:8.3f} s")
    print(f"  loop / ours = {t_loop / t_ours:.1f}x (goal >= {GOAL_LOOP_RATIO:g}); "
          f"ours / floor = {t_ours / t_floor:.3f} (goal <= {GOAL_FLOOR_RATIO:g})")
    return result


if __name__ == "__main__":
    main()
