"""Checks of DP-PFL's theory on random instances (rows ``dppfl_*`` of ``ebfl validate``).

DP-PFL (Hu et al., IEEE IoT J. 2020) proves a linear rate for smooth losses
(Lemma 1, Theorem 3), an O(1/eps) rate for Lipschitz ones (Theorem 4), and
bounds the sensitivities that calibrate its privacy noise (Corollaries 1-3).
Each replicate below draws a random instance (devices with rows of norm in
[1/2, 1], labels from a noisy per-device linear rule, a random feasible
Omega, a random dual state) and evaluates the statement exactly with
:mod:`ebfl.dppfl.theory` (exact minimizers of the local subproblem (7) and of
the dual (5), certified by their KKT residuals) or with
:func:`ebfl.dppfl.fit_dppfl` itself.

Most statements are worst-case claims ("for any alpha, Delta alpha, any
neighbouring datasets"), so a row's estimate is the extreme over the
replicates (with se = 0, ``atol`` covering rounding), not a mean: a single
counterexample decides. Rows where the paper's statement is wrong carry a
``flag`` saying what fails and why.
"""

from __future__ import annotations

import math

import numpy as np

from ebfl.dppfl import _kernels
from ebfl.dppfl import exact as E
from ebfl.dppfl import theory as T
from ebfl.dppfl.objective import device_sums, dual_objective
from ebfl.validation.engine import make_result, run_replicates
from ebfl.validation.registry import CHECKS, register

__all__ = ["draw_instance", "sdca_replay"]

#: The instances: m devices of n_t rows in d dimensions, xi = 1/2 (beta = xi m = 2).
INSTANCE = {"m": 4, "n_t": 10, "d": 3, "xi": 0.5}

LEMMA1_FLAG = ("the local subproblem (7) omits MOCHA's constant ||X alpha||^2_Omega / "
               "(4 lambda m) per device; without it Lemma 1 fails by xi ||X alpha||^2_Omega / "
               "(4 lambda) (exactly that much at Delta alpha = 0; errata [DP-PFL 3])")
COROLLARY1_FLAG = ("Corollary 1 claims the modulus beta n_t / (2 lambda); X_t^T X_t has rank <= d "
                   "< n_t, so (7) is only as strongly convex as l* (not at all for the hinge), "
                   "and the claim also lacks Omega_tt (errata [DP-PFL 1])")
COROLLARY2_FLAG = ("Corollary 2 rests on Corollary 1's false modulus: replacing one sample can "
                   "move its own dual coordinate across its box (a change of 1) and shift the "
                   "others, while (8 lambda + beta) / (beta n_t) is about 1 / n_t when lambda << "
                   "beta n_t / 8; the bound then fails and the noise of line 6 is too small "
                   "(errata [DP-PFL 2])")
THEOREM4_FLAG = ("Theorem 4's statement and the end of its proof (with beta = m xi plugged in, "
                 "as the proof says) disagree: K0's step differs by the factor xi on its -1, and "
                 "k0's log argument (m L^2 sum n_t^2 / (2 lambda n^2) vs 2 m xi L^2 sum n_t^2 / "
                 "(lambda n^2)) and multiplier ((1-xi)(1-Theta) vs (1-xi) xi (1-Theta)) differ "
                 "(the statement's counts are the larger, so the proof still implies it); both "
                 "multiply the log by the rate where (15) needs its inverse (errata [DP-PFL 8])")


# ------------------------------------------------------------------ instances

def draw_instance(g, m, n_t, d):
    """A random instance: rows (m n_t, d) of norm in [1/2, 1], labels, offsets, Omega.

    Device t labels its rows by sign(x^T (theta_0 + theta_t) + noise) with
    theta_0, theta_t ~ N(0, I) and noise ~ N(0, 0.3^2); Omega is
    :func:`ebfl.dppfl.theory.random_feasible_omega`.
    """
    X = g.standard_normal((m * n_t, d))
    X *= (g.uniform(0.5, 1.0, m * n_t) / np.linalg.norm(X, axis=1))[:, None]
    theta = g.standard_normal(d) + g.standard_normal((m, d))
    score = np.einsum("ij,ij->i", X, np.repeat(theta, n_t, axis=0))
    y = np.where(score + 0.3 * g.standard_normal(m * n_t) > 0.0, 1.0, -1.0)
    offsets = np.arange(m + 1, dtype=np.int64) * n_t
    return X, y, offsets, T.random_feasible_omega(m, g)


def _worst(name, label, statement, kind, formula, value, params, *, atol=1e-9, flag="",
           extra=None):
    """A row judged on one exact extreme over the replicates (se = 0)."""
    return make_result(name, label, statement, kind, formula, [value, value], params=params,
                       atol=atol, flag=flag, extra=extra)


# ------------------------------------------------------------------ Omega-step

@register("dppfl_omega_step", "DP-PFL eq. (2)-(3): Omega* = (W^T W)^1/2 / tr(.) gives "
          "tr(W Omega*^-1 W^T) = (tr (W^T W)^1/2)^2, and no feasible Omega does better",
          {"m": 5, "d": 8, "omegas": 40}, n_reps=200, quick_reps=40)
def check_omega_step(n_reps, rng, progress, **p):
    m, d, k = p["m"], p["d"], p["omegas"]

    def step(g, n):
        error, best = np.empty(n), np.empty(n)
        for r in range(n):
            W = g.standard_normal((m, d)) * g.uniform(0.1, 3.0, (m, 1))
            res = T.omega_step_value(W)
            error[r] = abs(res.value / res.closed_form - 1.0)
            # random feasible Omegas, half of them perturbations of Omega* (near the optimum)
            ratios = []
            for i in range(k):
                other = T.random_feasible_omega(m, g)
                if i % 2:
                    weight = 10.0 ** g.uniform(-4.0, 0.0)
                    other = (1.0 - weight) * res.omega + weight * other
                ratios.append(T.omega_objective(W, other) / res.closed_form)
            best[r] = min(ratios)
        return {"error": error, "best": best}

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl omega step")
    statement = CHECKS["dppfl_omega_step"].statement
    return [
        _worst("dppfl_omega_step", "max |tr(W Omega*^-1 W^T) / (tr (W^T W)^1/2)^2 - 1|",
               statement, "exact", 0.0, float(sim["error"].max()), p),
        _worst("dppfl_omega_step", "min over random feasible Omega of tr(W Omega^-1 W^T) / "
               "(tr (W^T W)^1/2)^2 >= 1", statement, "lower", 1.0, float(sim["best"].min()), p,
               atol=1e-12, extra={"omegas_per_replicate": k})]


# ------------------------------------------------------------------ Lemma 1

def _random_duals(g, y, loss):
    """Feasible dual variables: y alpha uniform in [0, 1] for the hinges."""
    return y * g.uniform(0.0, 1.0, y.size) if loss != "squared" else g.standard_normal(y.size)


@register("dppfl_lemma1", "DP-PFL Lemma 1: with beta = xi m >= xi max ratio (9), "
          "D(alpha + xi Delta alpha) <= (1 - xi) D(alpha) + xi sum_t G_t^beta(Delta alpha_t)",
          INSTANCE | {"lam": 0.1, "losses": ("hinge", "smoothed_hinge"), "gamma": 1.0},
          n_reps=400, quick_reps=60)
def check_lemma1(n_reps, rng, progress, **p):
    m, n_t, d, xi, lam = (p[key] for key in ("m", "n_t", "d", "xi", "lam"))
    losses = tuple(p["losses"])

    def step(g, n):
        out = {f"{kind}_{loss}": np.empty(n) for kind in ("printed", "mocha") for loss in losses}
        out["ratio"], out["sup"] = np.empty(n), np.empty(n)
        for r in range(n):
            X, y, offsets, omega = draw_instance(g, m, n_t, d)
            for loss in losses:
                alpha = _random_duals(g, y, loss)
                # a convex step towards another feasible point, of any size down to ~0
                scale = 10.0 ** g.uniform(-4.0, 0.0)
                dalpha = scale * (_random_duals(g, y, loss) - alpha)
                size = 1.0 + abs(dual_objective(X, y, offsets, alpha, omega, lam, loss,
                                                p["gamma"]))
                for form in ("printed", "mocha"):
                    gap = T.lemma1_gap(X, y, offsets, alpha, dalpha, omega, lam, xi, loss,
                                       p["gamma"], form=form)
                    out[f"{form}_{loss}"][r] = gap / size
            out["ratio"][r] = T.lemma1_ratio(X, offsets, omega, g.standard_normal(m * n_t))
            out["sup"][r] = T.lemma1_ratio_sup(omega)
        return out

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl lemma1")
    statement = CHECKS["dppfl_lemma1"].statement
    rows = []
    for loss in losses:
        params = {**p, "loss": loss}
        rows += [
            _worst("dppfl_lemma1", f"{loss}: min gap / (1 + |D(alpha)|), G with MOCHA's "
                   "constant", statement, "lower", 0.0, float(sim[f"mocha_{loss}"].min()),
                   params, atol=1e-12),
            _worst("dppfl_lemma1", f"{loss}: min gap / (1 + |D(alpha)|), G as printed in (7)",
                   statement, "lower", 0.0, float(sim[f"printed_{loss}"].min()), params,
                   atol=1e-12, flag=LEMMA1_FLAG,
                   extra={"fraction_negative": float(np.mean(sim[f"printed_{loss}"] < 0.0))})]
    rows += [
        _worst("dppfl_lemma1", "max ratio (9) at random Delta alpha <= m", statement, "upper",
               float(m), float(sim["ratio"].max()), p),
        _worst("dppfl_lemma1", "max sup ratio (9) = lambda_max(D^-1/2 Omega D^-1/2) <= m",
               statement, "upper", float(m), float(sim["sup"].max()), p)]
    return rows


# ------------------------------------------------------------------ Corollaries 1-3

def _state(g, X, y, offsets, omega, lam, loss):
    """A random dual state and the models of eq. (6) it gives: (alpha, W)."""
    alpha = _random_duals(g, y, loss)
    return alpha, omega @ device_sums(X, alpha, offsets) / (2.0 * lam)


def _replacements(g, X_t, y_t, u, count):
    """Neighbouring samples for ``count`` random rows j: the rows that flip j's dual
    coordinate (margin -|u| or +|u| against the current w_t + c X_t Delta alpha_t), the
    same row with its label flipped, and a random row."""
    direction = u / max(np.linalg.norm(u), 1e-300)
    out = []
    for j in g.choice(X_t.shape[0], size=min(count, X_t.shape[0]), replace=False):
        rand = g.standard_normal(X_t.shape[1])
        rand *= g.uniform(0.0, 1.0) / np.linalg.norm(rand)
        out += [(j, -y_t[j] * direction, int(y_t[j])), (j, y_t[j] * direction, int(y_t[j])),
                (j, X_t[j], -int(y_t[j])), (j, rand, int(g.choice([-1, 1])))]
    return out


@register("dppfl_corollary2", "DP-PFL Corollaries 1-2: G_t^beta is (beta n_t / 2 lambda)-strongly "
          "convex, and the L2-sensitivity of argmin G_t^beta is <= (8 lambda + beta) / (beta n_t)",
          INSTANCE | {"lams": (0.01, 0.1, 1.0, 10.0), "losses": ("hinge", "smoothed_hinge"),
           "gamma": 1.0, "rows_replaced": 3}, n_reps=60, quick_reps=4)
def check_corollary2(n_reps, rng, progress, **p):
    m, n_t, d, xi = (p[key] for key in ("m", "n_t", "d", "xi"))
    beta = xi * m
    settings = [(loss, lam) for loss in p["losses"] for lam in p["lams"]]

    def step(g, n):
        out = {f"{loss}_{lam}_{key}": np.empty(n) for loss, lam in settings
               for key in ("ratio", "difference", "modulus")}
        for r in range(n):
            X, y, offsets, omega = draw_instance(g, m, n_t, d)
            X_t, y_t = X[:n_t], y[:n_t]
            for loss, lam in settings:
                alpha, W = _state(g, X, y, offsets, omega, lam, loss)
                args = (X_t, y_t, alpha[:n_t], W[0], omega[0, 0], lam, beta)
                sol = E.solve_local_exactly(*args, loss, p["gamma"])
                c = beta * omega[0, 0] / (2.0 * lam)
                u = W[0] + c * (X_t.T @ sol.dalpha)
                worst = max((T.corollary2_difference(*args, j, x_new, y_new, loss, p["gamma"])
                             for j, x_new, y_new in _replacements(g, X_t, y_t, u,
                                                                  p["rows_replaced"])),
                            key=lambda res: res.ratio)
                modulus, claimed = E.local_strong_convexity(X_t, omega[0, 0], lam, beta, loss,
                                                            p["gamma"])
                out[f"{loss}_{lam}_ratio"][r] = worst.ratio
                out[f"{loss}_{lam}_difference"][r] = worst.certified_difference
                out[f"{loss}_{lam}_modulus"][r] = modulus / claimed
        return out

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl corollary2")
    statement = CHECKS["dppfl_corollary2"].statement
    rows = []
    for loss, lam in settings:
        key = f"{loss}_{lam}"
        bound = (8.0 * lam + beta) / (beta * n_t)
        ratios = sim[f"{key}_ratio"]
        rows.append(_worst(
            "dppfl_corollary2", f"{loss}, lambda={lam:g}: max ||Delta alpha - Delta alpha'|| / "
            "bound", statement, "upper", 1.0, float(ratios.max()), {**p, "loss": loss,
                                                                    "lam": lam},
            flag=COROLLARY2_FLAG,
            extra={"bound": bound, "largest_difference": float(sim[f"{key}_difference"].max()),
                   "fraction_of_instances_violating": float(np.mean(ratios > 1.0))}))
    for loss in p["losses"]:
        lam = p["lams"][0]
        rows.append(_worst(
            "dppfl_corollary2", f"{loss}: Corollary 1, min modulus of (7) / (beta n_t / "
            "2 lambda)", statement, "lower", 1.0, float(sim[f"{loss}_{lam}_modulus"].min()),
            {**p, "loss": loss, "lam": lam}, flag=COROLLARY1_FLAG))
    return rows


@register("dppfl_corollary3", "DP-PFL Corollary 3: given Delta alpha_t, the L2-sensitivity of "
          "u_t = xi X_t Delta alpha_t is <= 2 xi ||Delta alpha_t||_2",
          INSTANCE | {"replacements": 20}, n_reps=400, quick_reps=80)
def check_corollary3(n_reps, rng, progress, **p):
    n_t, d, xi = p["n_t"], p["d"], p["xi"]

    def step(g, n):
        ratio, tight = np.empty(n), np.empty(n)
        for r in range(n):
            X_t = draw_instance(g, 1, n_t, d)[0]
            X_t[0] /= np.linalg.norm(X_t[0])  # one unit row: the bound 2 xi |Delta alpha^j| is met
            dalpha = g.uniform(-1.0, 1.0, n_t) * (g.uniform(size=n_t) < 0.5)
            dalpha[0] = 1.0  # the largest |Delta alpha^i|, so that the tight bound is met
            worst_ratio, worst_tight = 0.0, 0.0
            for i in range(p["replacements"]):
                j = 0 if i == 0 else int(g.integers(n_t))
                x_new = -X_t[j] if i % 2 == 0 else g.standard_normal(d)
                x_new = x_new / max(np.linalg.norm(x_new), 1.0)
                diff, bound = T.corollary3_difference(X_t, dalpha, xi, j, x_new)
                worst_ratio = max(worst_ratio, diff / bound)
                worst_tight = max(worst_tight, diff / (2.0 * xi * np.abs(dalpha).max()))
            ratio[r], tight[r] = worst_ratio, worst_tight
        return {"ratio": ratio, "tight": tight}

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl corollary3")
    statement = CHECKS["dppfl_corollary3"].statement
    return [
        _worst("dppfl_corollary3", "max ||u_t - u_t'|| / (2 xi ||Delta alpha_t||_2)", statement,
               "upper", 1.0, float(sim["ratio"].max()), p,
               extra={"mean_worst_ratio": float(sim["ratio"].mean())}),
        _worst("dppfl_corollary3", "max ||u_t - u_t'|| / (2 xi max_i |Delta alpha_t^i|) "
               "(the tight bound; 1 at x' = -x_j, |x_j| = 1)", statement, "exact", 1.0,
               float(sim["tight"].max()), p)]


# ------------------------------------------------------------------ runs of Algorithm 1

def _device_data(X, y, offsets):
    from ebfl.dppfl.data import DeviceData

    return DeviceData.from_lists([X[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:],
                                                                  strict=True)],
                                 [y[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:],
                                                                  strict=True)])


@register("dppfl_duality_gap", "DP-PFL Algorithm 1 without privacy, fixed Omega: D(alpha^k) "
          "never increases (Lemma 1 with beta = xi m) and the duality gap P(W(alpha)) + "
          "D(alpha) >= 0 goes to 0",
          INSTANCE | {"n_t": 12, "lam": 0.1, "iterations": 400, "gamma": 1.0,
           "losses": ("hinge", "smoothed_hinge"), "gap_reduction": 1e-3},
          n_reps=10, quick_reps=3)
def check_duality_gap(n_reps, rng, progress, **p):
    from ebfl.dppfl.algorithm import fit_dppfl

    m, n_t, d, xi, lam = (p[key] for key in ("m", "n_t", "d", "xi", "lam"))

    def step(g, n):
        out = {f"{loss}_{key}": np.empty(n) for loss in p["losses"]
               for key in ("reduction", "rise", "min_gap")}
        for r in range(n):
            X, y, offsets, omega = draw_instance(g, m, n_t, d)
            data = _device_data(X, y, offsets)
            for loss in p["losses"]:
                fit = fit_dppfl(data, lam=lam, xi=xi, inner=p["iterations"], outer=1, loss=loss,
                                gamma=p["gamma"], omega=omega, seed=int(g.integers(2**32)),
                                record_every=10, parallel=False)
                gaps = np.array([row["gap"] for row in fit.history])
                duals = np.array([row["dual"] for row in fit.history])
                out[f"{loss}_reduction"][r] = gaps[-1] / gaps[0]
                out[f"{loss}_rise"][r] = np.max(np.diff(duals)) / (1.0 + abs(duals[0]))
                out[f"{loss}_min_gap"][r] = gaps.min() / (1.0 + abs(duals[0]))
        return out

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl duality gap")
    statement = CHECKS["dppfl_duality_gap"].statement
    rows = []
    for loss in p["losses"]:
        params = {**p, "loss": loss}
        rows += [
            _worst("dppfl_duality_gap", f"{loss}: max gap after {p['iterations']} iterations / "
                   "gap at alpha = 0", statement, "upper", p["gap_reduction"],
                   float(sim[f"{loss}_reduction"].max()), params, atol=0.0,
                   extra={"median": float(np.median(sim[f"{loss}_reduction"]))}),
            _worst("dppfl_duality_gap", f"{loss}: max rise of D(alpha^k) / (1 + |D(0)|)",
                   statement, "upper", 0.0, float(sim[f"{loss}_rise"].max()), params,
                   atol=1e-12),
            _worst("dppfl_duality_gap", f"{loss}: min gap / (1 + |D(0)|) (weak duality)",
                   statement, "lower", 0.0, float(sim[f"{loss}_min_gap"].min()), params,
                   atol=1e-12)]
    return rows


def sdca_replay(X, y, offsets, omega, lam, xi, iterations, loss, gamma, seed, draws=1):
    """Replay :func:`ebfl.dppfl.fit_dppfl`'s non-private W-step and measure theta of (8).

    The same SDCA kernel and random streams as ``fit_dppfl`` (tau = 0, no
    dropping, Omega fixed, n_iter = the smallest device size), so the dual
    values match its history to rounding. At every device and iteration,
    theta of Definition 1 is computed against the exact minimizer of (7) for
    the run's own SDCA draw and ``draws - 1`` further independent ones from
    the same state, and averaged: an estimate of E[theta_t^k | I_k], the
    quantity Assumption 1 bounds by Theta_max.

    Returns
    -------
    duals : ndarray (iterations + 1,)
        D(alpha^k), k = 0..iterations.
    thetas : ndarray (iterations, m)
        The estimates of E[theta_t^k | I_k].
    """
    m, d = offsets.size - 1, X.shape[1]
    beta, n_min = xi * m, int(np.diff(offsets).min())
    code = {"hinge": _kernels.HINGE, "smoothed_hinge": _kernels.SMOOTHED_HINGE,
            "squared": _kernels.SQUARED}[loss]
    sqnorm = np.einsum("ij,ij->i", X, X)
    alpha, V = np.zeros(X.shape[0]), np.zeros((m, d))
    duals = [dual_objective(X, y, offsets, alpha, omega, lam, loss, gamma)]
    thetas = np.empty((iterations, m))
    for it in range(iterations):
        W = omega @ V / (2.0 * lam)
        for t in range(m):
            lo, hi = offsets[t], offsets[t + 1]
            args = (X[lo:hi], y[lo:hi], alpha[lo:hi], W[t], omega[t, t], lam, beta)
            best = E.solve_local_exactly(*args, loss, gamma).objective
            start = E.local_objective(np.zeros(hi - lo), *args, loss, gamma)
            c = beta * omega[t, t] / (2.0 * lam)
            values = []
            for i in range(draws):  # draw 0 is the run's own (seed), the others seed + i
                key = np.uint64(_kernels.stream_key(np.uint64((seed + i) % 2**64), it, t,
                                                    _kernels.COORDINATES))
                dalpha, v = np.empty(hi - lo), np.empty(d)
                _kernels.sdca_device(X, y, sqnorm, lo, hi, alpha, W[t], c, code, gamma, n_min,
                                     key, dalpha, v)
                values.append(E.local_objective(dalpha, *args, loss, gamma))
                if i == 0:
                    own_dalpha, own_v = dalpha, v
            progress = start - best
            thetas[it, t] = (np.mean(values) - best) / progress if progress > 0.0 else 0.0
            alpha[lo:hi] += xi * own_dalpha  # device t reads only its own block
            V[t] += xi * own_v
        duals.append(dual_objective(X, y, offsets, alpha, omega, lam, loss, gamma))
    return np.array(duals), thetas


@register("dppfl_linear_rate", "DP-PFL Theorem 3 (smoothed hinge): E[D(alpha^k+1) - D*] <= "
          "(1 - (1 - xi) xi (1 - Theta) s)(D(alpha^k) - D*), and K of (12) iterations reach eps_G",
          INSTANCE | {"n_t": 12, "lam": 0.1, "gamma": 1.0, "iterations": 80, "eps_G": 1e-4,
           "theta_draws": 10},
          n_reps=12, quick_reps=3)
def check_linear_rate(n_reps, rng, progress, **p):
    from ebfl.dppfl.algorithm import fit_dppfl

    m, n_t, d, xi, lam, gamma = (p[key] for key in ("m", "n_t", "d", "xi", "lam", "gamma"))
    loss, iterations = "smoothed_hinge", p["iterations"]

    def step(g, n):
        keys = ("exact_excess", "exact_rate", "exact_bound", "implied_s", "steps_excess",
                "steps", "steps_bound", "sdca_excess", "sdca_rate", "sdca_bound", "theta",
                "replay_error")
        out = {key: np.empty(n) for key in keys}
        for r in range(n):
            X, y, offsets, omega = draw_instance(g, m, n_t, d)
            best = E.solve_dual_exactly(X, y, offsets, omega, lam, loss, gamma).objective
            s = T.theorem3_s(X, offsets, omega, lam, xi * m, gamma)
            # Theta = 0: exact local solves, deterministic, so (14) holds at every step
            run = E.exact_local_run(X, y, offsets, omega, lam, xi, iterations, loss, gamma)
            fit = E.linear_rate(run.history, optimum=best)
            bound = T.theorem3_rate(xi, 0.0, s)
            out["exact_rate"][r], out["exact_bound"][r] = fit.worst_step, bound
            out["exact_excess"][r] = fit.worst_step - bound
            out["implied_s"][r] = (1.0 - fit.worst_step) / ((1.0 - xi) * xi)
            gaps = np.array([row["dual"] for row in run.history]) - best
            reached = np.flatnonzero(gaps <= p["eps_G"])
            steps = float(reached[0]) if reached.size else math.inf
            needed = T.theorem3_iterations(X.shape[0], p["eps_G"], xi, 0.0, s)
            out["steps"][r], out["steps_bound"][r] = steps, needed
            out["steps_excess"][r] = steps - needed
            # SDCA local solver (fit_dppfl), Theta measured on a replay of the same run
            seed = int(g.integers(2**32))
            sdca = fit_dppfl(_device_data(X, y, offsets), lam=lam, xi=xi, inner=iterations,
                             outer=1, loss=loss, gamma=gamma, omega=omega, seed=seed,
                             record_every=1, parallel=False)
            duals, thetas = sdca_replay(X, y, offsets, omega, lam, xi, iterations, loss, gamma,
                                        seed, draws=p["theta_draws"])
            fitted = np.array([row["dual"] for row in sdca.history])
            out["replay_error"][r] = float(np.max(np.abs(fitted - duals)))
            theta = float(thetas.max())  # Assumption 1 bounds every conditional mean
            rate = E.linear_rate(sdca.history, optimum=best).rate
            sdca_bound = T.theorem3_rate(xi, min(theta, 1.0 - 1e-12), s)
            out["sdca_rate"][r], out["sdca_bound"][r], out["theta"][r] = rate, sdca_bound, theta
            out["sdca_excess"][r] = rate - sdca_bound
        return out

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl linear rate")
    statement = CHECKS["dppfl_linear_rate"].statement
    params = {**p, "loss": loss}
    faster = 1.0 - (1.0 - xi) * xi
    return [
        _worst("dppfl_linear_rate", "exact local solves (Theta = 0): max over instances of worst "
               "per-step contraction - bound (s from Lemma 2)", statement, "upper", 0.0,
               float(sim["exact_excess"].max()), params,
               extra={"mean_contraction": float(sim["exact_rate"].mean()),
                      "mean_bound": float(sim["exact_bound"].mean()),
                      "bound_with_s_1": faster,
                      "fraction_faster_than_any_s": float(np.mean(sim["exact_rate"] <= faster)),
                      "min_implied_s": float(sim["implied_s"].min())}),
        _worst("dppfl_linear_rate", f"exact local solves: max (iterations to reach eps_G="
               f"{p['eps_G']:g}) - K of (12)", statement, "upper", 0.0,
               float(sim["steps_excess"].max()), params, atol=0.0,
               extra={"mean_iterations": float(sim["steps"].mean()),
                      "mean_K_of_12": float(sim["steps_bound"].mean())}),
        _worst("dppfl_linear_rate", "SDCA local solver (fit_dppfl, Theta = max measured theta): "
               "max fitted rate - bound", statement, "upper", 0.0,
               float(sim["sdca_excess"].max()), params,
               extra={"mean_rate": float(sim["sdca_rate"].mean()),
                      "mean_bound": float(sim["sdca_bound"].mean()),
                      "mean_theta": float(sim["theta"].mean()),
                      "replay_max_abs_difference": float(sim["replay_error"].max())})]


# ------------------------------------------------------------------ Theorem 4

@register("dppfl_theorem4", "DP-PFL Theorem 4 (L-Lipschitz losses): after K iterations "
          "E[D(alpha_bar) - D*] <= eps_G at the average of alpha^k, k > K0; the statement's "
          "K, K0, k0 follow from its proof with beta = m xi",
          {"m": 30, "n_min": 157, "n_max": 230, "lam": 0.1, "eps_G": 1.0, "xi": 0.5,
           "theta": 0.0, "L": 1.0, "run": INSTANCE | {"lam": 0.1, "eps_G": 1.0}},
          n_reps=6, quick_reps=2)
def check_theorem4(n_reps, rng, progress, **p):
    """Two parts. The counts of the statement and of its proof side by side (no Monte
    Carlo), at device sizes spanning the paper's training sizes (3/4 of 210-306 windows
    per subject) with D(alpha^0) - D* bounded by n, as the paper does; a count of the
    statement at least the proof's is implied by the proof. And the claim itself on random
    instances of ``run`` (hinge loss, L = 1, exact local solves so Theta = 0): the averaged
    iterate after the statement's K iterations, against eps_G.
    """
    sizes = np.linspace(p["n_min"], p["n_max"], p["m"]).round().astype(np.int64)
    args = (sizes, p["lam"], p["eps_G"], p["xi"], p["theta"])
    printed = T.theorem4_iterations(*args, L=p["L"], form="printed")
    proof = T.theorem4_iterations(*args, L=p["L"], form="proof")
    statement = CHECKS["dppfl_theorem4"].statement
    eta = (1.0 - p["xi"]) * (1.0 - p["theta"])
    n = float(sizes.sum())
    scale = p["m"] * p["L"] ** 2 * float(np.sum(sizes.astype(float) ** 2)) / (p["lam"] * n**2)
    extra = {"printed": [printed.K, printed.K0, printed.k0],
             "proof": [proof.K, proof.K0, proof.k0],
             "k0_with_log_divided_by_rate": float(max(0, math.ceil(
                 math.log(n / (scale / 2.0)) / eta)))}
    rows = []
    for label, a, b in (("K - K0", printed.K - printed.K0, proof.K - proof.K0),
                        ("K0 - k0", printed.K0 - printed.k0, proof.K0 - proof.k0),
                        ("k0", printed.k0, proof.k0), ("K", printed.K, proof.K)):
        rows.append(_worst("dppfl_theorem4", f"{label}: statement (estimate) >= proof "
                           "(formula)", statement, "lower", b, a, p, atol=0.0,
                           flag=THEOREM4_FLAG if a != b else "",
                           extra={**extra, "difference": a - b}))

    q = p["run"]
    m, n_t, d, xi = (q[key] for key in ("m", "n_t", "d", "xi"))
    counts = T.theorem4_iterations(np.full(m, n_t), q["lam"], q["eps_G"], xi)
    K, K0 = int(counts.K), int(counts.K0)

    def step(g, k):
        excess = np.empty(k)
        for r in range(k):
            X, y, offsets, omega = draw_instance(g, m, n_t, d)
            best = E.solve_dual_exactly(X, y, offsets, omega, q["lam"]).objective
            run = E.exact_local_run(X, y, offsets, omega, q["lam"], xi, K, average_after=K0)
            excess[r] = dual_objective(X, y, offsets, run.average, omega, q["lam"]) - best
        return {"excess": excess}

    sim = run_replicates(step, n_reps, rng, progress=progress, desc="dppfl theorem4")
    rows.append(_worst("dppfl_theorem4", f"hinge, exact local solves: max D(alpha_bar) - D* "
                       f"after the statement's K={K} (K0={K0}) vs eps_G", statement, "upper",
                       q["eps_G"], float(sim["excess"].max()), {**p, "K": K, "K0": K0},
                       atol=0.0, extra={"mean": float(sim["excess"].mean())}))
    return rows
