"""Figures 1-4 of the FedHDP paper: formulas beside Monte Carlo points (``ebfl validate --plot``).

"Federated learning with heterogeneous differential privacy" plots, for federated
point estimation and linear regression:

* Figure 1: the server's MSE sigma_s^2 against the ratio r (left: N = 20,
  rho_np = 0.05, sigma_c^2 = 11, gamma^2 in {1, 4}; right: gamma^2 = 4,
  sigma_c^2 in {11, 12, 13}), minimized at Lemma 1's r*;
* Figure 2: a client's personalized MSE against lambda when it stays private
  and when it opts out, with HDP-FedAvg (r = 1) and FedHDP (r*);
* Figure 3: the same for two-level linear regression (d = 4, total over d);
* Figure 4: the server's MSE against the fraction rho_np of opt-out clients,
  uniform averaging (HDP-FedAvg) and DP-FedAvg against the optimal FedHDP.

The paper gives no parameters for Figures 2-4; the values used are in
:data:`FIGURES`. Each point is a Monte Carlo mean with a 1.96-standard-error
bar; lines are :mod:`ebfl.fedhdp.theory`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ebfl._validation import as_generator, check_bool, check_int_scalar, check_names
from ebfl.fedhdp import levels as L
from ebfl.fedhdp import theory as T
from ebfl.fedhdp.checks import (
    PHI,
    draw_clients,
    draw_regression_clients,
    personalized,
    server_estimate,
)
from ebfl.validation.engine import run_replicates
from ebfl.validation.registry import register_figures

__all__ = ["FIGURES", "fedhdp_figure_data", "plot_fedhdp_figure", "plot_fedhdp_figures"]

REPS, QUICK_REPS = 20_000, 2_000
#: Ratios r and lambdas at which Monte Carlo points are drawn.
R_POINTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
LAMBDA_POINTS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)

#: name -> parameters of the figure
FIGURES = {
    "fedhdp_fig1_server_vs_r": {"n_clients": 20, "rho": 0.05, "alpha2": 1.0,
                                "left": {"sigma_c2": 11.0, "gamma2s": (1.0, 4.0)},
                                "right": {"gamma2": 4.0, "sigma_c2s": (11.0, 12.0, 13.0)}},
    "fedhdp_fig2_local_vs_lambda": {"n_clients": 20, "n_opt_out_others": 1, "alpha2": 1.0,
                                    "tau2": 0.1, "gamma2": 1.0},
    "fedhdp_fig3_regression_vs_lambda": {"n_clients": 20, "n_opt_out_others": 1,
                                         "alpha2": 1.0, "tau2": 0.1, "gamma2": 1.0, "d": 4,
                                         "n_samples": 10},
    "fedhdp_fig4_server_vs_rho": {"n_clients": 100, "alpha2": 1.0, "tau2": 1.0,
                                  "gamma2": 0.5, "rhos": (0.01, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8)},
}


def _mean_se(values):
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(values.size))


def _server_points(rng, n_reps, counts, alpha2, tau2, gamma2, ratios, progress, desc):
    """Monte Carlo server MSE at each ratio, on shared draws: (means, ses)."""
    counts = np.asarray(counts)

    def step(g, k):
        _, _, psi = draw_clients(g, k, counts, alpha2, tau2, (0.0, gamma2))
        return {f"r{i}": np.sum((server_estimate(psi, counts, (1.0, r)) - PHI) ** 2, axis=-1)
                for i, r in enumerate(ratios)}

    sim = run_replicates(step, n_reps, rng, chunk=5_000, progress=progress, desc=desc)
    return np.array([_mean_se(sim[f"r{i}"]) for i in range(len(ratios))]).T


def _figure1_data(p, rng, n_reps, progress):
    """Figure 1's Monte Carlo points: per panel, per curve, the server MSE at R_POINTS."""
    n, rho, a2 = p["n_clients"], p["rho"], p["alpha2"]
    n_np = round(rho * n)
    panels = ([(p["left"]["sigma_c2"], g2) for g2 in p["left"]["gamma2s"]],
              [(sc2, p["right"]["gamma2"]) for sc2 in p["right"]["sigma_c2s"]])
    gens = iter(rng.spawn(sum(len(x) for x in panels)))
    out = []
    for curves in panels:
        rows = []
        for sc2, g2 in curves:
            mean, se = _server_points(next(gens), n_reps, (n_np, n - n_np), a2, sc2 - a2, g2,
                                      R_POINTS, progress, f"fig1 sigma_c2={sc2:g} gamma2={g2:g}")
            rows.append({"sigma_c2": sc2, "gamma2": g2, "mean": mean.tolist(),
                         "se": se.tolist()})
        out.append(rows)
    return {"r_points": list(R_POINTS), "panels": out}


def _draw_figure1(data):
    from ebfl._plotting import subplots

    p = data["params"]
    fig, axes = subplots(1, 2, figsize=(11, 4.2))
    n, rho, a2 = p["n_clients"], p["rho"], p["alpha2"]
    grid = np.linspace(0.0, 1.0, 401)
    titles = (f"N={n}, rho_np={rho:g}, sigma_c^2={p['left']['sigma_c2']:g}",
              f"N={n}, rho_np={rho:g}, gamma^2={p['right']['gamma2']:g}")
    for side, (ax, rows, title) in enumerate(zip(axes, data["panels"], titles, strict=True)):
        for row in rows:
            sc2, g2 = row["sigma_c2"], row["gamma2"]
            label = f"gamma^2 = {g2:g}" if side == 0 else f"sigma_c^2 = {sc2:g}"
            args = (n, rho, a2, sc2 - a2, g2)
            line, = ax.plot(grid, T.server_mse(grid, *args), "-", label=f"{label}: formula")
            ax.errorbar(data["r_points"], row["mean"], yerr=1.96 * np.asarray(row["se"]),
                        fmt="o", ms=4, color=line.get_color(), label=f"{label}: Monte Carlo")
            ax.plot([T.optimal_ratio(*args)], [T.server_mse_optimal(*args)], "*", ms=14,
                    color=line.get_color(), markeredgecolor="k",
                    label=f"{label}: r* (Lemma 1), eq. (13)")
        ax.set_yscale("log")
        ax.set_xlabel("ratio r (private / opt-out weight)")
        ax.set_ylabel("server MSE sigma_s^2")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("FedHDP Figure 1: server MSE against r")
    return fig


def _scenarios(p):
    """(label, counts, group): the client stays private, or opts out (one more opt-out)."""
    n, k = p["n_clients"], p["n_opt_out_others"]
    return (("stays private", (k, n - k), 1), ("opts out", (k + 1, n - k - 1), 0))


#: The two panels of Figures 2 and 3: HDP-FedAvg's uniform weights, FedHDP's r*.
_LOCAL_PANELS = (("hdp", "HDP-FedAvg (r = 1)"), ("opt", "FedHDP (r = r*)"))


def _local_data(p, rng, n_reps, progress, *, regression):
    """Figures 2 and 3: the Monte Carlo points, each curve's minimizer, the paper's lambda*."""
    d = p["d"] if regression else 1
    points, minimizer, paper = {}, {}, {}
    for (label, counts, g), gen in zip(_scenarios(p), rng.spawn(2), strict=True):
        sim = _local_points(gen, n_reps, p, counts, g, d, regression, progress)
        points[label] = {key: {"mean": sim[key][0].tolist(), "se": sim[key][1].tolist()}
                         for key, _ in _LOCAL_PANELS}
        model = (counts, p["alpha2"], p["tau2"], (0.0, p["gamma2"]))
        for key, _ in _LOCAL_PANELS:
            ratios = (1.0, 1.0) if key == "hdp" else None
            opt = L.levels_optimal_lambda_exact(g, *model, ratios=ratios)
            minimizer.setdefault(key, {})[label] = {"lambda": float(opt.lam),
                                                    "mse": float(d * opt.mse)}
        lam = L.levels_optimal_lambda(g, *model)
        paper[label] = {"lambda": float(lam),
                        "mse": float(d * L.levels_personalized_mse(lam, g, *model))}
    return {"regression": regression, "d": d, "lambda_points": list(LAMBDA_POINTS),
            "points": points, "minimizer": minimizer, "paper_lambda": paper}


def _draw_local(data):
    from ebfl._plotting import subplots

    p, d, regression = data["params"], data["d"], data["regression"]
    fig, axes = subplots(1, 2, figsize=(11, 4.2), sharey=True)
    grid = np.geomspace(1e-2, 1e2, 301)
    for ax, (key, title) in zip(axes, _LOCAL_PANELS, strict=True):
        for label, counts, g in _scenarios(p):
            model = (counts, p["alpha2"], p["tau2"], (0.0, p["gamma2"]))
            ratios = (1.0, 1.0) if key == "hdp" else None
            curve = d * L.levels_personalized_mse(grid, g, *model, ratios=ratios)
            line, = ax.plot(grid, curve, "-", label=f"client {label}: formula")
            pts = data["points"][label][key]
            ax.errorbar(data["lambda_points"], pts["mean"], yerr=1.96 * np.asarray(pts["se"]),
                        fmt="o", ms=4, color=line.get_color(),
                        label=f"client {label}: Monte Carlo")
            opt = data["minimizer"][key][label]
            ax.plot([opt["lambda"]], [opt["mse"]], "*", ms=14, color=line.get_color(),
                    markeredgecolor="k",
                    label=f"client {label}: minimizer lambda={opt['lambda']:.3g}")
            if key == "opt":
                lam = data["paper_lambda"][label]
                ax.plot([lam["lambda"]], [lam["mse"]], "x", ms=10, color="k",
                        label=f"client {label}: paper's lambda*={lam['lambda']:.3g}")
                ax.axhline(d * L.levels_bayes_local_mse(g, *model), color=line.get_color(),
                           ls=":", lw=1, label=f"client {label}: Bayes MSE, eq. (46)")
        ax.set_xscale("log")
        ax.set_xlabel("lambda")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("local MSE" + (f" (total over d={d})" if d > 1 else ""))
    what = (f"two-level linear regression, d={d}" if regression else "point estimation")
    fig.suptitle(f"FedHDP Figure {3 if regression else 2}: opting out, {what} "
                 f"(N={p['n_clients']}, alpha^2={p['alpha2']:g}, tau^2={p['tau2']:g}, "
                 f"gamma^2={p['gamma2']:g})")
    return fig


def _local_points(rng, n_reps, p, counts, g, d, regression, progress):
    """Monte Carlo local MSE at LAMBDA_POINTS, for r = 1 and r*: {"hdp": .., "opt": ..}."""
    counts = np.asarray(counts)
    model = (counts, p["alpha2"], p["tau2"], (0.0, p["gamma2"]))
    r_star = L.levels_optimal_ratios(*model)
    start = int(counts[:g].sum())
    sl = slice(start, start + int(counts[g]))

    def step(gen, k):
        if regression:
            phi_j, phi_hat, psi = draw_regression_clients(gen, k, *model, d=d,
                                                          n_samples=p["n_samples"])
        else:
            phi_j, phi_hat, psi = draw_clients(gen, k, *model)
        out = {}
        for key, ratios in (("hdp", (1.0, 1.0)), ("opt", r_star)):
            theta = server_estimate(psi, counts, ratios)
            for i, lam in enumerate(LAMBDA_POINTS):
                est = personalized(phi_hat[:, sl], theta, lam)
                out[f"{key}{i}"] = np.sum((est - phi_j[:, sl]) ** 2, axis=-1).mean(axis=1)
        return out

    sim = run_replicates(step, n_reps, rng, chunk=2_000 if regression else 5_000,
                         progress=progress, desc="fedhdp local")
    return {key: np.array([_mean_se(sim[f"{key}{i}"]) for i in range(len(LAMBDA_POINTS))]).T
            for key in ("hdp", "opt")}


def _figure4_data(p, rng, n_reps, progress):
    """Figure 4's Monte Carlo points: the server MSE at r = 1 and at r*, per rho."""
    n, a2, t2, g2 = p["n_clients"], p["alpha2"], p["tau2"], p["gamma2"]
    points = {"hdp": {"mean": [], "se": []}, "opt": {"mean": [], "se": []}}
    for rho, gen in zip(p["rhos"], rng.spawn(len(p["rhos"])), strict=True):
        n_np = round(rho * n)
        r_star = T.optimal_ratio(n, n_np / n, a2, t2, g2)
        mean, se = _server_points(gen, n_reps, (n_np, n - n_np), a2, t2, g2, (1.0, r_star),
                                  progress, f"fig4 rho={rho:g}")
        for i, key in enumerate(("hdp", "opt")):
            points[key]["mean"].append(float(mean[i]))
            points[key]["se"].append(float(se[i]))
    return {"rhos": list(p["rhos"]), "points": points}


def _draw_figure4(data):
    from ebfl._plotting import subplots

    p = data["params"]
    n, a2, t2, g2 = p["n_clients"], p["alpha2"], p["tau2"], p["gamma2"]
    fig, ax = subplots(figsize=(6.5, 4.2))
    rhos = np.arange(1, n) / n
    lines = (("HDP-FedAvg (uniform, r = 1)", T.server_mse_hdp_fedavg),
             ("DP-FedAvg", T.server_mse_dp_fedavg),
             ("FedHDP (r*), eq. (13)", T.server_mse_optimal))
    colors = {}
    for label, func in lines:
        line, = ax.plot(rhos, [func(n, rho, a2, t2, g2) for rho in rhos], "-", label=label)
        colors[label] = line.get_color()
    for key, label, short in (("hdp", lines[0][0], "HDP-FedAvg"),
                              ("opt", lines[2][0], "FedHDP (r*)")):
        pts = data["points"][key]
        ax.errorbar(data["rhos"], pts["mean"], yerr=1.96 * np.asarray(pts["se"]), fmt="o",
                    ms=4, color=colors[label], label=f"{short}: Monte Carlo")
    ax.set_yscale("log")
    ax.set_xlabel("fraction of opt-out clients rho_np")
    ax.set_ylabel("server MSE sigma_s^2")
    ax.set_title(f"FedHDP Figure 4: N={n}, alpha^2={a2:g}, tau^2={t2:g}, gamma^2={g2:g}",
                 fontsize=9)
    ax.legend(fontsize=7)
    return fig


#: name -> (Monte Carlo points of the figure, its drawing from them)
_BUILDERS = {
    "fedhdp_fig1_server_vs_r": (_figure1_data, _draw_figure1),
    "fedhdp_fig2_local_vs_lambda": (lambda p, rng, n_reps, progress: _local_data(
        p, rng, n_reps, progress, regression=False), _draw_local),
    "fedhdp_fig3_regression_vs_lambda": (lambda p, rng, n_reps, progress: _local_data(
        p, rng, n_reps, progress, regression=True), _draw_local),
    "fedhdp_fig4_server_vs_rho": (_figure4_data, _draw_figure4),
}


def _options_iv(names, n_reps, quick, progress):
    names = list(FIGURES) if names is None else check_names(names, "names", FIGURES,
                                                            what="figure")
    if n_reps is not None:
        n_reps = check_int_scalar(n_reps, "n_reps", minimum=2)
    quick, progress = check_bool(quick, "quick"), check_bool(progress, "progress")
    return names, (n_reps if n_reps is not None else (QUICK_REPS if quick else REPS)), progress


def fedhdp_figure_data(names=None, *, n_reps=None, quick=False, rng=0, progress=False):
    """The Monte Carlo points of Figures 1-4 and the numbers their legends print.

    Parameters are those of :func:`plot_fedhdp_figures` (the same ``rng`` gives the
    same points).

    Returns
    -------
    dict
        ``{name: data}``, JSON-able; each ``data`` holds its ``name``, ``params``
        (:data:`FIGURES`), ``n_reps`` and the points, and draws with
        :func:`plot_fedhdp_figure`.
    """
    names, n_reps, progress = _options_iv(names, n_reps, quick, progress)
    out = {}
    for name, gen in zip(names, as_generator(rng).spawn(len(names)), strict=True):
        data = _BUILDERS[name][0](FIGURES[name], gen, n_reps, progress)
        out[name] = {"name": name, "params": _plain(FIGURES[name]), "n_reps": n_reps, **data}
    return out


def _plain(params):
    """Tuples as lists, as JSON gives them back (so that stored data draws the same)."""
    if isinstance(params, dict):
        return {k: _plain(v) for k, v in params.items()}
    if isinstance(params, tuple | list):
        return [_plain(v) for v in params]
    return params


def plot_fedhdp_figure(data, path):
    """Draw one figure from its :func:`fedhdp_figure_data` entry; formulas drawn anew.

    Parameters
    ----------
    data : dict
        One value of :func:`fedhdp_figure_data`.
    path : path-like
        Where the PNG goes.

    Returns
    -------
    str
        ``path``.
    """
    check_names([data["name"]], "data['name']", FIGURES, what="figure")
    fig = _BUILDERS[data["name"]][1](data)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_fedhdp_figures(directory, *, names=None, n_reps=None, quick=False, rng=0,
                        progress=False):
    """Save Figures 1-4 of the FedHDP paper as PNGs in ``directory``; returns the paths.

    Parameters
    ----------
    directory : str or path
        Folder (created if needed).
    names : str or iterable of str, optional
        Figures to draw (keys of :data:`FIGURES`); all by default.
    n_reps : int, optional
        Monte Carlo replicates per curve, >= 2 (default 20,000; 2,000 with ``quick``).
    quick : bool
        Fewer replicates.
    rng : int >= 0, Generator or None
        Seed; figure ``i`` of ``names`` uses the ``i``-th stream spawned from it.
    progress : bool
        Show progress bars.

    Returns
    -------
    list of str
    """
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    _options_iv(names, n_reps, quick, progress)  # before creating the folder
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = fedhdp_figure_data(names, n_reps=n_reps, quick=quick, rng=rng, progress=progress)
    return [plot_fedhdp_figure(entry, directory / f"{name}.png") for name, entry in data.items()]


# `ebfl validate --plot` (ebfl.validation.sweeps.plot_sweeps) draws them with the sweeps.
register_figures("fedhdp", FIGURES, plot_fedhdp_figures)
