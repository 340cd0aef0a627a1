"""DP-PFL's experiments (Figures 2-5) on 30 smartphone users, beside the paper.

DP-PFL (Hu et al., IEEE IoT J. 2020) trains one linear SVM per user of UCI HAR
("sitting" against every other activity, 75 %/25 % split per user, rows
l2-normalized) coupled through a learned task covariance Omega, with and without
Gaussian noise calibrated for (epsilon, delta) = (8, 1e-3) per user:

* Figure 2: the primal objective against the iterations (homogeneous; device
  variability tau = 0.5; tau = 0.5 with drop probability 0.2);
* Figure 3: test error against tau;
* Figure 4: test error against the drop probability (tau = 1); the paper's
  private curve has its minimum, 0.097, at 0.2;
* Figure 5: test error against epsilon (tau = 1, drop probability 0.2).

UCI HAR's 561-feature release cannot be fetched here; the default data are the
72 time-domain features that ebfl computes from the same 30 users' raw HAPT
signals (:func:`ebfl.dppfl.data.har_sitting_devices`). Beside the paper's
method the reproduction fits, with the same solver and the same noise, three
fixed task covariances: independent local SVMs (Omega = I / m), one global
SVM (Omega = 1 1^T / m) and a Gaussian prior with a shared mean (Omega = ((1 -
rho) I + rho 1 1^T) / m), to show what learning Omega buys. lambda and xi (and
rho) are chosen by 5-fold cross-validation on the first repetition's training
data, separately with and without privacy.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ebfl._validation import check_bool, check_int_scalar

__all__ = ["DPPFLProtocol", "FULL", "QUICK", "dppfl_paper_numbers", "plot_dppfl",
           "reproduce_dppfl"]


def dppfl_paper_numbers():
    """The paper's one number, Figure 4's private minimum, from ``data/paper_numbers``.

    Returns
    -------
    dict
        ``figure4_min_error`` (0.097), ``figure4_argmin_drop`` (0.2), ``epsilon``,
        ``delta``.
    """
    from ebfl._paths import paper_numbers

    table = paper_numbers("dppfl_figures").set_index("quantity")
    row = table.loc["private_min_test_error"]
    return {"figure4_min_error": float(row["value"]),
            "figure4_argmin_drop": float(table.loc["private_argmin_drop_probability", "value"]),
            "epsilon": float(row["epsilon"]), "delta": float(row["delta"])}


@dataclass(frozen=True)
class DPPFLProtocol:
    """One reproduction's settings (``FULL`` and ``QUICK``)."""

    n_reps: int = 10
    inner: int = 2000
    outer: int = 10
    epsilon: float = 8.0
    delta: float = 1e-3
    taus: tuple = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    drops: tuple = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    epsilons: tuple = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 8.0, 30.0, 100.0)
    figure2: tuple = ((0.0, 0.0), (0.5, 0.0), (0.5, 0.2))
    figure4_tau: float = 1.0
    figure5: tuple = (1.0, 0.2)
    folds: int = 5
    lams: tuple = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    xis: tuple = (0.25, 0.5, 1.0)
    rhos: tuple = (0.5, 0.8, 0.95)
    record_points: int = 20


FULL = DPPFLProtocol()
#: Seconds instead of minutes: a pipeline check for CI, not a reproduction.
QUICK = DPPFLProtocol(n_reps=2, inner=40, outer=2, taus=(0.0, 1.0), drops=(0.0, 0.2, 0.6),
                      epsilons=(0.1, 8.0, 100.0), folds=2, lams=(1e-3, 1e-2), xis=(0.5,),
                      rhos=(0.8,), record_points=5)

#: The methods: a fixed Omega (local, global, Gaussian prior) or the learned one.
METHODS = ("learned", "local", "global", "gaussian_prior")


def _omega(method, m, rho=None):
    from ebfl.dppfl.algorithm import exchangeable_omega

    return {"learned": "learn", "local": np.eye(m) / m, "global": np.ones((m, m)) / m,
            "gaussian_prior": exchangeable_omega(m, 0.0 if rho is None else rho)}[method]


class _Runner:
    """Fits cached per configuration under ``checkpoint_dir``, run on ``jobs`` threads."""

    def __init__(self, protocol, checkpoint_dir, jobs, progress):
        self.protocol = protocol
        self.dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.jobs = jobs
        self.progress = progress
        self._data = {}

    def data(self, rep):
        from ebfl.dppfl.data import har_sitting_devices

        if rep not in self._data:
            self._data[rep] = har_sitting_devices(seed=rep)
        return self._data[rep]

    def _key(self, spec):
        blob = json.dumps(spec, sort_keys=True, default=float).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def _fit(self, spec):
        from ebfl.dppfl.algorithm import PrivacySetting, classification_error, fit_dppfl

        path = None if self.dir is None else self.dir / f"dppfl_{self._key(spec)}.json"
        if path is not None and path.is_file():
            return json.loads(path.read_text())
        data = self.data(spec["rep"])
        val = None
        if spec.get("fold") is not None:
            data, val = data.folds(self.protocol.folds, seed=spec["rep"])[spec["fold"]]
        privacy = (None if spec["epsilon"] is None else
                   PrivacySetting(spec["epsilon"], self.protocol.delta,
                                  calibration=spec.get("calibration", "theorem5"),
                                  dual_sensitivity=spec.get("dual_sensitivity", "corollary2")))
        p = self.protocol
        fit = fit_dppfl(data, lam=spec["lam"], xi=spec["xi"], inner=p.inner, outer=p.outer,
                        tau=spec["tau"], drop_probability=spec["drop"], privacy=privacy,
                        omega=_omega(spec["method"], data.n_clients, spec.get("rho")),
                        seed=spec["rep"], record_every=spec.get("record_every"),
                        parallel=False)
        out = {"spec": spec, "seconds": fit.seconds}
        if val is not None:
            out["validation_error"] = classification_error(fit.W, val.X, val.y, val.offsets)[0]
        else:
            out["test_error"] = fit.final_test_error
            out["history"] = fit.history if spec.get("record_every") else fit.history[-1:]
            if fit.calibration is not None:
                out["violated"] = list(fit.calibration.get("violated", ()))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(out, default=float))
            tmp.replace(path)
        return out

    def many(self, specs, desc):
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(specs), desc=desc, disable=None, leave=False)
        for rep in sorted({s["rep"] for s in specs}):  # built once, before the threads
            self.data(rep)
        out = []
        with ThreadPoolExecutor(self.jobs) as pool:
            for res in pool.map(self._fit, specs):
                out.append(res)
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return out


def _spec(method, *, rep, lam, xi, tau=0.0, drop=0.0, epsilon=None, rho=None, fold=None,
          record_every=None, calibration="theorem5"):
    """One fit's settings (also its checkpoint's key). ``calibration="corrected"``: the RDP
    calibration with the box sensitivity of the dual update."""
    spec = {"method": method, "rep": rep, "lam": lam, "xi": xi, "tau": tau, "drop": drop,
            "epsilon": epsilon, "rho": rho, "fold": fold, "record_every": record_every,
            "calibration": None if epsilon is None else calibration}
    if calibration == "corrected" and epsilon is not None:
        spec.update(calibration="rdp", dual_sensitivity="box")
    return spec


def _cross_validate(runner, method, epsilon, setting, *, xi=None, calibration="theorem5"):
    """The grid point with the least mean validation error over the folds of rep 0.

    The learned Omega searches lambda and xi; the fixed ones lambda (and rho
    for the Gaussian prior) at the learned method's xi.
    """
    p = runner.protocol
    xis = p.xis if xi is None else (xi,)
    rhos = p.rhos if method == "gaussian_prior" else (None,)
    grid = [(lam, x, rho) for lam in p.lams for x in xis for rho in rhos]
    specs = [_spec(method, rep=0, lam=lam, xi=x, rho=rho, epsilon=epsilon, fold=f,
                   calibration=calibration, **setting)
             for lam, x, rho in grid for f in range(p.folds)]
    label = "non-private" if epsilon is None else calibration
    errors = np.array([r["validation_error"] for r in runner.many(
        specs, f"CV {method} {label}")]).reshape(len(grid), p.folds)
    best = int(np.argmin(errors.mean(axis=1)))
    lam, x, rho = grid[best]
    return {"lam": lam, "xi": x, "rho": rho, "cv_error": float(errors[best].mean()),
            "grid": [{"lam": g[0], "xi": g[1], "rho": g[2], "cv_error": float(e)}
                     for g, e in zip(grid, errors.mean(axis=1), strict=True)]}


def _curve(runner, hp, settings, desc, calibration="theorem5"):
    """Mean and sd of the test error over the repetitions, per (tau, drop, epsilon)."""
    n_reps = runner.protocol.n_reps
    specs = [_spec("learned", rep=r, lam=hp["lam"], xi=hp["xi"], epsilon=eps, tau=tau, drop=drop,
                   calibration=calibration)
             for tau, drop, eps in settings for r in range(n_reps)]
    res = runner.many(specs, desc)
    errors = np.array([r["test_error"] for r in res]).reshape(len(settings), n_reps)
    violated = sorted({v for r in res for v in r.get("violated", ())})
    return {"mean": errors.mean(axis=1).tolist(),
            "sd": (errors.std(axis=1, ddof=1) if n_reps > 1 else 0 * errors[:, 0]).tolist(),
            "errors": errors.tolist(), "violated": violated}


def reproduce_dppfl(*, quick=False, n_reps=None, checkpoint_dir=None, jobs=2, progress=False):
    """Figures 2-5 of DP-PFL and the fixed-Omega baselines on the HAPT users.

    Parameters
    ----------
    quick : bool
        A pipeline check in seconds (:data:`QUICK`), not a reproduction.
    n_reps : int, optional
        Repetitions (random splits and seeds; default 10, the paper's).
    checkpoint_dir : path-like, optional
        Every fit is saved there as JSON and reused: an interrupted run resumes.
    jobs : int
        Fits run side by side on this many threads.
    progress : bool
        Progress bars.

    Returns
    -------
    dict
        JSON-able: ``protocol``, ``hyperparameters`` (cross-validated),
        ``figure2`` ... ``figure5``, ``baselines``, ``calibration`` (the noise
        of the Figure 5 setting, its violated conditions and the epsilon it
        delivers), ``paper``, ``summary`` and ``seconds``. The paper's
        calibration violates its own conditions at every setting; they are
        listed per curve (``violated``) instead of a warning per fit.
    """
    from ebfl.dppfl.accounting import CalibrationConditionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationConditionWarning)
        return _reproduce(quick=quick, n_reps=n_reps, checkpoint_dir=checkpoint_dir, jobs=jobs,
                          progress=progress)


def _reproduce(*, quick, n_reps, checkpoint_dir, jobs, progress):
    quick, progress = check_bool(quick, "quick"), check_bool(progress, "progress")
    protocol = QUICK if quick else FULL
    if n_reps is not None:
        protocol = replace(protocol, n_reps=check_int_scalar(n_reps, "n_reps", minimum=1))
    jobs = check_int_scalar(jobs, "jobs", minimum=1)
    runner = _Runner(protocol, checkpoint_dir, jobs, progress)
    t0 = time.perf_counter()
    p, eps = protocol, protocol.epsilon
    base = {"tau": p.figure5[0], "drop": p.figure5[1]}

    hyper = {}
    for key, epsilon, calibration in (("non_private", None, "theorem5"),
                                      ("private", eps, "theorem5"),
                                      ("per_iteration", eps, "per_iteration")):
        learned = _cross_validate(runner, "learned", epsilon, base, calibration=calibration)
        hyper.setdefault("learned", {})[key] = learned
        if key == "per_iteration":
            continue
        for method in METHODS[1:]:
            hyper.setdefault(method, {})[key] = _cross_validate(
                runner, method, epsilon, base, xi=learned["xi"], calibration=calibration)

    def hp(method, private):
        return hyper[method]["private" if private else "non_private"]

    total = p.inner * p.outer
    every = max(total // p.record_points, 1)
    figure2 = []
    for tau, drop in p.figure2:
        entry = {"tau": tau, "drop": drop}
        for private in (False, True):
            h = hp("learned", private)
            (res,) = runner.many([_spec("learned", rep=0, lam=h["lam"], xi=h["xi"], tau=tau,
                                        drop=drop, epsilon=eps if private else None,
                                        record_every=every)], "Figure 2")
            key = "private" if private else "non_private"
            entry[key] = {"iteration": [r["iteration"] for r in res["history"]],
                          "primal": [r["primal"] for r in res["history"]],
                          "test_error": [r.get("test_error") for r in res["history"]]}
        figure2.append(entry)

    def sweep(settings, desc):
        out = {("private" if private else "non_private"): _curve(
            runner, hp("learned", private),
            [(t, d, e if private else None) for t, d, e in settings], desc)
            for private in (False, True)}
        out["per_iteration"] = _curve(runner, hyper["learned"]["per_iteration"], settings,
                                      desc + " per-iteration", calibration="per_iteration")
        return out

    figure3 = {"tau": list(p.taus), **sweep([(t, 0.0, eps) for t in p.taus], "Figure 3")}
    figure4 = {"drop": list(p.drops), "tau": p.figure4_tau,
               **sweep([(p.figure4_tau, d, eps) for d in p.drops], "Figure 4")}
    f5 = [(p.figure5[0], p.figure5[1], e) for e in p.epsilons]
    figure5 = {"epsilon": list(p.epsilons), "tau": p.figure5[0], "drop": p.figure5[1],
               "private": _curve(runner, hp("learned", True), f5, "Figure 5"),
               "per_iteration": _curve(runner, hyper["learned"]["per_iteration"], f5,
                                       "Figure 5 per-iteration", calibration="per_iteration"),
               "corrected": _curve(runner, hp("learned", True), f5, "Figure 5 corrected",
                                   calibration="corrected")}
    figure5["non_private"] = figure4["non_private"]["mean"][list(p.drops).index(p.figure5[1])] \
        if p.figure5[1] in p.drops else None

    baselines = []
    for method in METHODS:
        for private in (False, True):
            h = hp(method, private)
            specs = [_spec(method, rep=r, lam=h["lam"], xi=h["xi"], rho=h["rho"],
                           epsilon=eps if private else None, **base) for r in range(p.n_reps)]
            errors = np.array([r["test_error"] for r in runner.many(specs, method)])
            baselines.append({"method": method, "private": private, "lam": h["lam"],
                              "xi": h["xi"], "rho": h["rho"], "error_mean": float(errors.mean()),
                              "error_sd": float(errors.std(ddof=1)) if errors.size > 1 else 0.0})

    data0 = runner.data(0)
    calibration = {key: _calibration(data0, hp("learned", True) if key == "corrected"
                                     else hyper["learned"][key], protocol, key)
                   for key in ("private", "per_iteration", "corrected")}

    def minimum(curve):
        mean = np.array(curve["mean"])
        return {"min_error": float(mean.min()), "argmin_drop": float(p.drops[int(mean.argmin())]),
                "dips_then_rises": bool(0 < mean.argmin() < mean.size - 1)}

    summary = {
        "figure4_private": minimum(figure4["private"]),
        "figure4_per_iteration": minimum(figure4["per_iteration"]),
        "figure4_non_private_increasing": bool(np.all(np.diff(figure4["non_private"]["mean"])
                                                      >= -1e-12)),
        "figure3_range": {k: float(np.ptp(figure3[k]["mean"]))
                          for k in ("non_private", "private", "per_iteration")},
        "figure5_decreasing": {k: bool(np.all(np.diff(figure5[k]["mean"]) <= 1e-12))
                               for k in ("private", "per_iteration", "corrected")},
        "sitting_fraction_test": float(np.mean(data0.y_test > 0)),
    }
    return {"protocol": asdict(protocol), "quick": quick, "data": _data_summary(data0),
            "hyperparameters": hyper, "figure2": figure2, "figure3": figure3,
            "figure4": figure4, "figure5": figure5, "baselines": baselines,
            "calibration": calibration, "paper": dppfl_paper_numbers(), "summary": summary,
            "seconds": time.perf_counter() - t0}


def _data_summary(data):
    return {"devices": int(data.n_clients), "features": int(data.n_features),
            "train_sizes": [int(data.sizes.min()), int(data.sizes.max())],
            "test_sizes": [int(data.test_sizes.min()), int(data.test_sizes.max())]}


def _calibration(data, h, protocol, key):
    """The noise of the Figure 5 setting (tau = 1, drop 0.2) and the epsilon it delivers."""
    import warnings

    from ebfl.dppfl.accounting import rigorous_epsilon
    from ebfl.dppfl.algorithm import PrivacySetting, dual_sensitivity, noise_multipliers

    tau, drop = protocol.figure5
    releases = protocol.inner * protocol.outer
    privacy = PrivacySetting(
        protocol.epsilon, protocol.delta,
        calibration={"private": "theorem5", "corrected": "rdp"}.get(key, key),
        dual_sensitivity="box" if key == "corrected" else "corollary2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the violated conditions are in the record
        sigma1, sigma2, record = noise_multipliers(privacy, data.sizes, int(data.sizes.min()),
                                                   tau, drop, releases)
    delivered = rigorous_epsilon(sigma1, sigma2, np.asarray(record["sampling_rate_max"]),
                                 releases, protocol.delta)
    s1 = dual_sensitivity(h["lam"], h["xi"] * data.n_clients, data.sizes,
                          privacy.dual_sensitivity)
    return {"calibration": record["calibration"], "tau": tau, "drop": drop,
            "target_epsilon": protocol.epsilon, "violated": list(record.get("violated", [])),
            "sigma1": [float(sigma1.min()), float(sigma1.max())],
            "sigma2": [float(sigma2.min()), float(sigma2.max())],
            "dual_noise_std": [float((s1 * sigma1).min()), float((s1 * sigma1).max())],
            "delivered_epsilon_rdp": [float(delivered.min()), float(delivered.max())]}


_LABELS = {"non_private": "non-private", "private": "private (Theorem 5, end to end)",
           "per_iteration": "private, epsilon per iteration",
           "corrected": "corrected (valid sensitivity, RDP)"}
_COLORS = {"non_private": "C0", "private": "C1", "per_iteration": "C2", "corrected": "C3"}


def plot_dppfl(result, path):
    """Figures 2-5 in one image: our curves, the paper's Figure 4 minimum as a marker.

    Figures 3-5 share one legend, below them: inside their axes every corner can
    hold a curve (chance at small epsilon, the non-private line along the bottom,
    the per-iteration curve falling between them).
    """
    from ebfl._plotting import subplots

    fig, axes = subplots(2, 3, figsize=(15, 9))
    for ax, entry in zip(axes[0], result["figure2"], strict=True):
        for key, style in (("non_private", "-"), ("private", "--")):
            ax.plot(entry[key]["iteration"], entry[key]["primal"], style, color=_COLORS[key],
                    label=_LABELS[key])
        ax.set_yscale("log")
        ax.set_xlabel("global iteration")
        ax.set_ylabel("primal objective P(W, Omega)")
        ax.set_title(f"Figure 2: tau={entry['tau']:g}, drop={entry['drop']:g}")
        ax.legend()
    panels = (("figure3", "tau", "device variability tau"),
              ("figure4", "drop", "drop probability P(theta=1)"))
    for ax, (name, xkey, xlabel) in zip(axes[1][:2], panels, strict=True):
        fig_ = result[name]
        for key, style in (("non_private", "o-"), ("private", "s--"), ("per_iteration", "^:")):
            ax.errorbar(fig_[xkey], fig_[key]["mean"], yerr=fig_[key]["sd"], fmt=style,
                        color=_COLORS[key], capsize=2, label=_LABELS[key])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test error")
        ax.set_title(name.replace("figure", "Figure "))
    paper = result.get("paper")
    if paper:
        axes[1][1].plot([paper["figure4_argmin_drop"]], [paper["figure4_min_error"]], "k*",
                        markersize=12, label="paper: Figure 4's private minimum")
    ax = axes[1][2]
    f5 = result["figure5"]
    for key, style in (("private", "s--"), ("per_iteration", "^:"), ("corrected", "d-.")):
        if key not in f5:
            continue
        ax.errorbar(f5["epsilon"], f5[key]["mean"], yerr=f5[key]["sd"], fmt=style, capsize=2,
                    color=_COLORS[key], label=_LABELS[key])
    if f5.get("non_private") is not None:
        ax.axhline(f5["non_private"], color=_COLORS["non_private"], label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (delta = 1e-3)")
    ax.set_ylabel("test error")
    ax.set_title(f"Figure 5: tau={f5['tau']:g}, drop={f5['drop']:g}")
    handles = {}
    for panel in axes[1]:
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
               fontsize=9, frameon=False)
    fig.savefig(path, dpi=110)
    return path
