"""Monte Carlo checks of the FedHDP paper's closed forms (rows ``fedhdp_*`` of ``ebfl validate``).

"Federated learning with heterogeneous differential privacy" models client c_j
of privacy group i as phi_j = phi + p_j, p_j ~ N(0, tau^2), a local estimate
phi_hat_j ~ N(phi_j, alpha^2) and an upload psi_j = phi_hat_j + l_j,
l_j ~ N(0, N_i gamma_i^2) (Section 3.1, Appendix A). The simulations below
draw that model vectorized over replicates and clients, apply the server's
weighted average, the clients' personalized estimates (eq. (48)) and the Bayes
estimator (eq. (47)/(74)), and compare the mean squared errors with
:mod:`ebfl.fedhdp.theory`. The linear-regression check draws real designs and
responses (eq. (19)-(22)) instead of phi_hat_j.

Per replicate, a client MSE is averaged over the clients of its group (they
are exchangeable), so one replicate gives one value per row and the standard
error is taken across replicates. Comparisons of two estimators are paired on
the same draws (the standard error is that of the difference).

Rows where the paper's statement is only approximate carry a ``flag``: its
lambda*_p (eq. (18)) and Lemma 6's lambda* (eq. (50)) treat a private client's
own upload as noise-free, so they are not the minimizers of the MSE and the
FedHDP estimator does not reach the Bayes MSE (46) for private clients
(Theorem 3 and Lemma 6 claim it does; errata [FedHDP 1]).
"""

from __future__ import annotations

import math

import numpy as np

from ebfl.fedhdp import levels as L
from ebfl.fedhdp import theory as T
from ebfl.validation.engine import make_result, run_replicates
from ebfl.validation.registry import CHECKS, register

__all__ = ["LEVELS", "POINT", "REGRESSION", "bayes_estimates", "draw_clients",
           "draw_regression_clients", "personalized", "server_estimate"]

#: Point estimation (Section 3.1): N = 20 clients, one of which opts out.
POINT = {"n_clients": 20, "rho": 0.05, "alpha2": 1.0, "tau2": 1.0, "gamma2": 0.5}
#: Two-level linear regression (Appendix A.1): d = 3, n_s = 10 samples per client.
REGRESSION = {"counts": (5, 15), "alpha2": 1.0, "tau2": 1.0, "gammas2": (0.05, 0.5), "d": 3,
              "n_samples": 10}
#: Three privacy levels (Appendix A.6), the first one opting out.
LEVELS = {"counts": (2, 8, 10), "alpha2": 1.0, "tau2": 0.5, "gammas2": (0.0, 0.2, 1.0)}

REPS, QUICK_REPS, CHUNK = 1_000_000, 100_000, 20_000
#: The global parameter phi (flat prior: any fixed value).
PHI = 0.3

APPROX_FLAG = ("the paper's lambda* (eq. (18), (50)) matches the Bayes estimator's coefficients "
               "with the client's own upload taken as noise-free (eq. (49)); with its privacy "
               "noise in the global model it is not the minimizer of the MSE (errata [FedHDP 1])")
BAYES_FLAG = ("Theorem 3 / Lemma 6 claim FedHDP at lambda* is Bayes optimal for every client; "
              "for a private client the global model contains its own noise l_j, so the "
              "estimate is the Bayes one plus (lambda w/(1+lambda)) l_j (errata [FedHDP 1])")


# ----------------------------------------------------------------- simulation

def _model(counts, alpha2, tau2, gammas2):
    """Each client's group, sigma_i^2 = alpha^2 + tau^2 + N_i gamma_i^2 and N_i gamma_i^2."""
    counts = np.asarray(counts, dtype=np.int64)
    group = np.repeat(np.arange(counts.size), counts)
    v = counts * np.asarray(gammas2, dtype=np.float64)
    return group, alpha2 + tau2 + v[group], v[group]


def draw_clients(rng, k, counts, alpha2, tau2, gammas2, *, d=1, phi=PHI):
    """k replicates of the point-estimation model (clients ordered by group).

    Returns ``(phi_j, phi_hat, psi)``, each of shape (k, N, d): the clients'
    parameters, their local estimates N(phi_j, alpha^2) and their uploads with
    privacy noise N(0, N_i gamma_i^2).
    """
    group, _, v = _model(counts, alpha2, tau2, gammas2)
    shape = (k, group.size, d)
    phi_j = phi + math.sqrt(tau2) * rng.standard_normal(shape)
    phi_hat = phi_j + math.sqrt(alpha2) * rng.standard_normal(shape)
    psi = phi_hat + np.sqrt(v)[:, None] * rng.standard_normal(shape)
    return phi_j, phi_hat, psi


def draw_regression_clients(rng, k, counts, alpha2, tau2, gammas2, *, d, n_samples, phi=PHI):
    """k replicates of the linear-regression model (equations (19)-(24)).

    Client j has a design F_j (n_s x d, F_j^T F_j = n_s I_d: sqrt(n_s) times
    orthonormal columns, drawn at random once per call and shared by its k
    replicates) and responses x_j = F_j phi_j + v_j, v_j ~ N(0, beta^2 I),
    beta^2 = n_s alpha^2; phi_hat_j is the least-squares fit (eq. (22)).
    Returns ``(phi_j, phi_hat, psi)`` of shape (k, N, d).
    """
    group, _, v = _model(counts, alpha2, tau2, gammas2)
    n = group.size
    q, _ = np.linalg.qr(rng.standard_normal((n, n_samples, d)))
    design = math.sqrt(n_samples) * q
    phi_j = phi + math.sqrt(tau2) * rng.standard_normal((k, n, d))
    x = (np.einsum("nsd,knd->kns", design, phi_j)
         + math.sqrt(n_samples * alpha2) * rng.standard_normal((k, n, n_samples)))
    # (F^T F)^-1 F^T x = F^T x / n_s, since F^T F = n_s I.
    phi_hat = np.einsum("nsd,kns->knd", design, x) / n_samples
    psi = phi_hat + np.sqrt(v)[:, None] * rng.standard_normal((k, n, d))
    return phi_j, phi_hat, psi


def server_estimate(psi, counts, ratios):
    """theta_hat = sum_j w_j psi_j with w_j = r_i / sum_k N_k r_k (equation (64)); shape (k, d)."""
    counts = np.asarray(counts)
    w = np.asarray(ratios, dtype=np.float64) / np.sum(counts * np.asarray(ratios))
    weights = np.repeat(w, counts)
    return np.einsum("knd,n->kd", psi, weights)


def personalized(phi_hat, theta, lam):
    """theta_hat_j(lambda) = (phi_hat_j + lambda theta_hat)/(1 + lambda) (equation (48))."""
    return (phi_hat + lam * theta[:, None, :]) / (1.0 + lam)


def bayes_estimates(phi_hat, psi, counts, alpha2, tau2, gammas2):
    """The Bayes estimator of equation (47)/(74) for every client: shape (k, N, d).

    theta*_j = (1 - k_j) phi_hat_j + k_j phi^(-j), where phi^(-j) fuses the other
    clients' uploads with weights 1/sigma_i^2 (eq. (66)) and
    k_j = alpha^2 / (alpha^2 + tau^2 + V_j), V_j its error variance.
    """
    _, s2, _ = _model(counts, alpha2, tau2, gammas2)
    prec = 1.0 / s2
    total = np.einsum("knd,n->kd", psi, prec)
    others = prec.sum() - prec                        # P_j of the other clients
    fused = (total[:, None, :] - psi * prec[:, None]) / others[:, None]
    k_j = alpha2 / (alpha2 + tau2 + 1.0 / others)
    return (1.0 - k_j)[:, None] * phi_hat + k_j[:, None] * fused


def _group_mse(est, phi_j, counts, g):
    """Squared error summed over coordinates, averaged over the clients of group g: (k,)."""
    start = int(np.sum(counts[:g]))
    sl = slice(start, start + int(counts[g]))
    return np.sum((est[:, sl] - phi_j[:, sl]) ** 2, axis=-1).mean(axis=1)


def _sq(est, phi=PHI):
    """Squared error of a (k, d) server estimate, summed over coordinates: (k,)."""
    return np.sum((est - phi) ** 2, axis=-1)


def _paired(name, label, statement, kind, values, reference, params, *, atol=0.0, flag="",
            **extra):
    """Row comparing two Monte Carlo means on the same replicates (SE of the difference)."""
    diff = values - reference
    se = float(diff.std(ddof=1) / math.sqrt(diff.size))
    return make_result(name, label, statement, kind, float(reference.mean()), values,
                       params=params, se=se, atol=atol, flag=flag,
                       extra={"formula_is_monte_carlo": True, "difference": float(diff.mean()),
                              **extra})


def _point_levels(p):
    n_np = round(p["rho"] * p["n_clients"])
    return np.array([n_np, p["n_clients"] - n_np]), (0.0, p["gamma2"])


def _point_args(p):
    return tuple(p[key] for key in ("n_clients", "rho", "alpha2", "tau2", "gamma2"))


# ---------------------------------------------------------------- the checks

@register("fedhdp_server", "FedHDP Lemma 1, eq. (12)-(13): the server's MSE sigma_s^2(r) is "
          "minimized at r* = sigma_c^2/(sigma_c^2 + N_p gamma^2)",
          POINT | {"ratios": (0.05, 0.5, 1.0)}, n_reps=REPS, quick_reps=QUICK_REPS)
def check_server(n_reps, rng, progress, **p):
    args = _point_args(p)
    counts, gammas2 = _point_levels(p)
    r_star = T.optimal_ratio(*args)
    neighbours = (r_star / 2, min(2 * r_star, 1.0))
    ratios = tuple(p["ratios"]) + (r_star,) + neighbours

    def step(g, k):
        _, _, psi = draw_clients(g, k, counts, p["alpha2"], p["tau2"], gammas2)
        out = {f"r{i}": _sq(server_estimate(psi, counts, (1.0, r)))
               for i, r in enumerate(ratios)}
        n_np = counts[0]
        if n_np:
            out["mean_np"] = _sq(psi[:, :n_np].mean(axis=1))
        out["mean_p"] = _sq(psi[:, n_np:].mean(axis=1))
        return out

    sim = run_replicates(step, n_reps, rng, chunk=CHUNK, progress=progress, desc="fedhdp server")
    statement = CHECKS["fedhdp_server"].statement
    var_np, var_p = T.group_mean_variances(*args)
    rows = [make_result("fedhdp_server", "eq. (12) private mean", statement, "exact", var_p,
                        sim["mean_p"], params=p)]
    if "mean_np" in sim:
        rows.insert(0, make_result("fedhdp_server", "eq. (12) opt-out mean", statement, "exact",
                                   var_np, sim["mean_np"], params=p))
    for i, r in enumerate(p["ratios"]):
        rows.append(make_result("fedhdp_server", f"server MSE r={r:g}", statement, "exact",
                                T.server_mse(r, *args), sim[f"r{i}"], params={**p, "r": r}))
    at_star = sim[f"r{len(p['ratios'])}"]
    rows.append(make_result("fedhdp_server", f"server MSE at r*={r_star:.4g}: eq. (13)",
                            statement, "exact", T.server_mse_optimal(*args), at_star,
                            params={**p, "r": r_star}))
    for j, r in enumerate(neighbours, start=len(p["ratios"]) + 1):
        rows.append(_paired("fedhdp_server", f"MSE(r={r:.4g}) >= MSE(r*) (paired)", statement,
                            "lower", sim[f"r{j}"], at_star, {**p, "r": r},
                            formula_difference=T.server_mse(r, *args)
                            - T.server_mse_optimal(*args)))
    return rows


@register("fedhdp_gaps", "FedHDP Lemma 2, eq. (14)-(16): server-MSE gaps of HDP-FedAvg and "
          "DP-FedAvg to FedHDP at r*", POINT, n_reps=REPS, quick_reps=QUICK_REPS)
def check_gaps(n_reps, rng, progress, **p):
    args = _point_args(p)
    counts, gammas2 = _point_levels(p)
    r_star = T.optimal_ratio(*args)
    n_np, n_p = counts

    def step(g, k):
        _, _, psi = draw_clients(g, k, counts, p["alpha2"], p["tau2"], gammas2)
        opt = _sq(server_estimate(psi, counts, (1.0, r_star)))
        uniform = psi.mean(axis=1)
        # DP-FedAvg: the opt-out clients add the private clients' noise N_p gamma^2 too.
        extra = math.sqrt(n_p * p["gamma2"]) * g.standard_normal((k, n_np, psi.shape[-1]))
        dp = uniform + extra.sum(axis=1) / (n_np + n_p)
        return {"opt": opt, "hdp": _sq(uniform), "dp": _sq(dp)}

    sim = run_replicates(step, n_reps, rng, chunk=CHUNK, progress=progress, desc="fedhdp gaps")
    statement = CHECKS["fedhdp_gaps"].statement
    rows = []
    for label, hi, lo, formula in (
            ("eq. (14) HDP-FedAvg - FedHDP", "hdp", "opt", T.hdp_fedavg_gap(*args)),
            ("eq. (15) DP-FedAvg - FedHDP", "dp", "opt", T.dp_fedavg_gap(*args)),
            ("eq. (16) DP-FedAvg - HDP-FedAvg", "dp", "hdp", T.dp_vs_hdp_fedavg_gap(*args))):
        rows.append(make_result("fedhdp_gaps", label + " (paired)", statement, "exact", formula,
                                sim[hi] - sim[lo], params=p))
    return rows


@register("fedhdp_local", "FedHDP Theorem 3, eq. (17)-(18), (46)-(48): personalized MSE of "
          "private and opt-out clients; Bayes optimality at lambda*", POINT, n_reps=REPS,
          quick_reps=QUICK_REPS)
def check_local(n_reps, rng, progress, **p):
    args = _point_args(p)
    counts, gammas2 = _point_levels(p)
    if min(counts) < 1:
        raise ValueError("fedhdp_local needs both an opt-out and a private client "
                         f"(rho * n_clients = {counts[0]})")
    r_star = T.optimal_ratio(*args)
    lam = {"nonprivate": {"paper": T.optimal_lambda_nonprivate(*args),
                          "exact": T.optimal_lambda_exact(*args, group="nonprivate").lam},
           "private": {"paper": T.optimal_lambda_private(*args),
                       "exact": T.optimal_lambda_exact(*args, group="private").lam}}
    lam_hdp = T.optimal_lambda_exact(*args, group="private", r=1.0).lam

    def step(g, k):
        phi_j, phi_hat, psi = draw_clients(g, k, counts, p["alpha2"], p["tau2"], gammas2)
        theta = server_estimate(psi, counts, (1.0, r_star))
        bayes = bayes_estimates(phi_hat, psi, counts, p["alpha2"], p["tau2"], gammas2)
        out = {}
        for gi, name in enumerate(T.GROUPS):
            out[f"{name}_bayes"] = _group_mse(bayes, phi_j, counts, gi)
            for which, value in lam[name].items():
                out[f"{name}_{which}"] = _group_mse(personalized(phi_hat, theta, value),
                                                    phi_j, counts, gi)
        hdp = server_estimate(psi, counts, (1.0, 1.0))
        out["private_hdp"] = _group_mse(personalized(phi_hat, hdp, lam_hdp), phi_j, counts, 1)
        return out

    sim = run_replicates(step, n_reps, rng, chunk=CHUNK, progress=progress, desc="fedhdp local")
    statement = CHECKS["fedhdp_local"].statement
    rows = []
    for name, eq in (("private", "(18)"), ("nonprivate", "(17)")):
        paper, exact = lam[name]["paper"], lam[name]["exact"]
        bayes = T.bayes_local_mse(*args, group=name)
        approx = "" if name == "nonprivate" else APPROX_FLAG
        who = "opt-out" if name == "nonprivate" else name
        rows += [
            make_result("fedhdp_local", f"{who}: MSE at lambda={paper:.5g} of eq. {eq}",
                        statement, "exact", T.personalized_mse(paper, *args, group=name),
                        sim[f"{name}_paper"], params={**p, "lam": paper}, flag=approx),
            make_result("fedhdp_local", f"{who}: MSE at the exact minimizer "
                        f"lambda={exact:.5g}", statement, "exact",
                        T.optimal_lambda_exact(*args, group=name).mse, sim[f"{name}_exact"],
                        params={**p, "lam": exact}),
            make_result("fedhdp_local", f"{who}: Bayes estimator (47) MSE = eq. (46)",
                        statement, "exact", bayes, sim[f"{name}_bayes"], params=p)]
    # Theorem 3: at lambda* the FedHDP estimate is the Bayes one, i.e. its MSE is at most
    # the Bayes MSE (which bounds every estimator from below). Exact for the opt-out client
    # (the two estimates agree to rounding); for a private client the difference is
    # (lambda w_p/(1+lambda)) l_j, whose mean square is derived below.
    priv = lam["private"]["paper"]
    w_p = r_star / (counts[0] + r_star * counts[1])
    excess = (priv * w_p / (1 + priv)) ** 2 * counts[1] * p["gamma2"]
    rows += [
        _paired("fedhdp_local", "opt-out: MSE at lambda*_np <= Bayes (47) MSE (paired, "
                "Theorem 3)", statement, "upper", sim["nonprivate_paper"],
                sim["nonprivate_bayes"], p, atol=1e-12),
        _paired("fedhdp_local", "private: MSE at lambda*_p <= Bayes (47) MSE (paired, "
                "Theorem 3)", statement, "upper", sim["private_paper"], sim["private_bayes"],
                p, flag=BAYES_FLAG, derived_excess=excess),
        make_result("fedhdp_local", "private: MSE at lambda*_p - Bayes (47) = "
                    "(lambda w_p/(1+lambda))^2 N_p gamma^2 (paired, derived)", statement,
                    "exact", excess, sim["private_paper"] - sim["private_bayes"], params=p),
        make_result("fedhdp_local", f"private, HDP-FedAvg (r=1): MSE at lambda={lam_hdp:.5g}",
                    statement, "exact", T.personalized_mse(lam_hdp, *args, group="private",
                                                           r=1.0),
                    sim["private_hdp"], params={**p, "r": 1.0, "lam": lam_hdp})]
    return rows


def _levels_rows(name, statement, p, sim, model_args, *, d, paper_lambdas=None):
    """Per-group rows: MSE at the exact minimizer and the Bayes estimator's MSE (x d)."""
    rows = []
    for gi in range(len(model_args[0])):
        opt = L.levels_optimal_lambda_exact(gi, *model_args)
        rows.append(make_result(name, f"group {gi + 1}: MSE at the exact minimizer "
                                f"lambda={opt.lam:.5g}", statement, "exact", d * opt.mse,
                                sim[f"exact{gi}"], params={**p, "lam": opt.lam}))
        if paper_lambdas is not None:
            lam = paper_lambdas[gi]
            rows.append(make_result(
                name, f"group {gi + 1}: MSE at lambda*={lam:.5g} of eq. (50)", statement,
                "exact", d * L.levels_personalized_mse(lam, gi, *model_args), sim[f"paper{gi}"],
                params={**p, "lam": lam}, flag=APPROX_FLAG if model_args[3][gi] else ""))
        rows.append(make_result(name, f"group {gi + 1}: Bayes estimator MSE = eq. (46)/(73)",
                                statement, "exact", d * L.levels_bayes_local_mse(gi, *model_args),
                                sim[f"bayes{gi}"], params=p))
    return rows


def _levels_step(draw, p, paper_lambdas=None):
    counts = np.asarray(p["counts"])
    model_args = (p["counts"], p["alpha2"], p["tau2"], p["gammas2"])
    ratios = L.levels_optimal_ratios(*model_args)
    exact = [L.levels_optimal_lambda_exact(gi, *model_args).lam for gi in range(counts.size)]

    def step(g, k):
        phi_j, phi_hat, psi = draw(g, k)
        theta = server_estimate(psi, counts, ratios)
        bayes = bayes_estimates(phi_hat, psi, counts, p["alpha2"], p["tau2"], p["gammas2"])
        out = {"server": _sq(theta)}
        for gi in range(counts.size):
            out[f"exact{gi}"] = _group_mse(personalized(phi_hat, theta, exact[gi]), phi_j,
                                           counts, gi)
            out[f"bayes{gi}"] = _group_mse(bayes, phi_j, counts, gi)
            if paper_lambdas is not None:
                out[f"paper{gi}"] = _group_mse(personalized(phi_hat, theta, paper_lambdas[gi]),
                                               phi_j, counts, gi)
        return out

    return step


@register("fedhdp_regression", "FedHDP Lemma 5-6, eq. (33)-(34), (46), (50): two-level "
          "federated linear regression (totals over d coordinates)", REGRESSION,
          n_reps=REPS // 4, quick_reps=QUICK_REPS // 4)
def check_regression(n_reps, rng, progress, **p):
    model_args = (p["counts"], p["alpha2"], p["tau2"], p["gammas2"])
    d = p["d"]
    paper = L.two_level_optimal_lambdas(*model_args)

    def draw(g, k):
        return draw_regression_clients(g, k, *model_args, d=d, n_samples=p["n_samples"])

    sim = run_replicates(_levels_step(draw, p, paper), n_reps, rng, chunk=CHUNK // 4,
                         progress=progress, desc="fedhdp regression")
    statement = CHECKS["fedhdp_regression"].statement
    r_star = L.two_level_optimal_ratio(*model_args)
    rows = [make_result("fedhdp_regression", f"server MSE at r*={r_star:.4g}: d x eq. (34)",
                        statement, "exact", d * L.two_level_server_covariance(*model_args),
                        sim["server"], params=p)]
    return rows + _levels_rows("fedhdp_regression", statement, p, sim, model_args, d=d,
                               paper_lambdas=paper)


@register("fedhdp_levels", "FedHDP Appendix A.6, eq. (62), (64)-(65), (73): l privacy levels",
          LEVELS, n_reps=REPS, quick_reps=QUICK_REPS)
def check_levels(n_reps, rng, progress, **p):
    model_args = (p["counts"], p["alpha2"], p["tau2"], p["gammas2"])

    def draw(g, k):
        return draw_clients(g, k, *model_args)

    sim = run_replicates(_levels_step(draw, p), n_reps, rng, chunk=CHUNK, progress=progress,
                         desc="fedhdp levels")
    statement = CHECKS["fedhdp_levels"].statement
    ratios = L.levels_optimal_ratios(*model_args)
    rows = [make_result("fedhdp_levels", "server MSE at r*_i of eq. (65) = eq. (62)", statement,
                        "exact", L.levels_server_variance(*model_args), sim["server"],
                        params={**p, "ratios": tuple(ratios.tolist())})]
    return rows + _levels_rows("fedhdp_levels", statement, p, sim, model_args, d=1)
