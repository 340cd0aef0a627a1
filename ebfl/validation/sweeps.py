"""Monte Carlo versus formula across a parameter sweep, as figures (``ebfl validate --plot``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ebfl._validation import (
    as_generator,
    check_bool,
    check_choice,
    check_int_scalar,
    check_names,
)
from ebfl.validation.registry import CHECKS, figure_sets

__all__ = ["SWEEPS", "plot_sweep", "plot_sweeps", "run_sweep", "sweep_data"]

#: name -> (check, parameter, values, text in the plotted row's label, x label, log x axis)
SWEEPS = {
    "thm1_vs_sigma_theta": ("thm1", "sigma_theta", (0.02, 0.05, 0.1, 0.2, 0.5),
                            "personalized MSE", "sigma_theta", True),
    "thm2_quantizer_vs_bits": ("thm2_quantizer", "k_bits", tuple((k,) for k in range(1, 9)),
                               " MSE", "bits per coordinate k", False),
    "thm2_ldp_vs_epsilon": ("thm2_ldp", "epsilon", (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
                            " MSE", "eps0", True),
    "thm4_weight_vs_epsilon": ("thm4", "epsilon", (0.5, 1.0, 2.0, 5.0, 10.0), "n/(n+1)",
                               "eps0", True),
}


def _options_iv(n_reps, quick, progress):
    if n_reps is not None:
        check_int_scalar(n_reps, "n_reps", minimum=2)
    return check_bool(quick, "quick"), check_bool(progress, "progress")


def run_sweep(name, *, n_reps=None, quick=False, rng=0, progress=False):
    """Run one sweep: ``(x values, list of result rows per x)``; rows are the plotted ones.

    ``name`` is a key of :data:`SWEEPS`; ``n_reps`` (>= 2), ``quick``, ``rng`` and
    ``progress`` are as in :func:`ebfl.validation.validate`.
    """
    check_choice(name, "name", SWEEPS)
    quick, progress = _options_iv(n_reps, quick, progress)
    check, param, values, needle, _, _ = SWEEPS[name]
    gens = as_generator(rng).spawn(len(values))
    xs, rows = [], []
    for value, gen in zip(values, gens, strict=True):
        results = CHECKS[check].run(n_reps, quick=quick, rng=gen, progress=progress,
                                    **{param: value})
        pick = [r for r in results if needle in r.label]
        xs.append(value[0] if isinstance(value, tuple) else value)
        rows.append(pick[0])
    return np.asarray(xs, dtype=float), rows


def sweep_data(name, *, n_reps=None, quick=False, rng=0, progress=False):
    """Run one sweep and keep what its figure shows (JSON-able).

    Parameters are as in :func:`run_sweep`.

    Returns
    -------
    dict
        ``name``, ``check``, ``x`` (the swept values), ``xlabel``, ``logx``, ``kind``
        (exact, upper or lower), ``n_reps`` and, per value, the Monte Carlo
        ``estimate``, its ``se`` and the ``formula``.
    """
    xs, rows = run_sweep(name, n_reps=n_reps, quick=quick, rng=rng, progress=progress)
    _, _, _, _, xlabel, logx = SWEEPS[name]
    return {"name": name, "check": rows[0].name, "x": xs.tolist(), "xlabel": xlabel,
            "logx": logx, "kind": rows[0].kind, "n_reps": int(rows[0].n_reps),
            "estimate": [float(r.estimate) for r in rows], "se": [float(r.se) for r in rows],
            "formula": [float(r.formula) for r in rows]}


def plot_sweep(data, path):
    """Draw one sweep: Monte Carlo ± 1.96 SE against the formula.

    Parameters
    ----------
    data : dict
        A :func:`sweep_data` result.
    path : path-like
        Where the PNG goes.

    Returns
    -------
    str
        ``path``.
    """
    from matplotlib.ticker import NullFormatter

    from ebfl._plotting import subplots

    xs = np.asarray(data["x"], dtype=float)
    fig, ax = subplots(figsize=(6, 4))
    ax.errorbar(xs, data["estimate"], yerr=1.96 * np.asarray(data["se"]), fmt="o",
                label="Monte Carlo ± 1.96 SE")
    label = {"exact": "formula (exact)", "upper": "formula (upper bound)",
             "lower": "formula (lower bound)"}[data["kind"]]
    ax.plot(xs, data["formula"], "-", label=label)
    if data["name"] == "thm4_weight_vs_epsilon":
        ax.set_ylabel("mean private weight a_priv")
        ax.axhline(1.0, color="gray", ls=":", label="local (a = 1)")
    else:
        ax.set_ylabel("MSE")
    if data["logx"]:
        ax.set_xscale("log")
        # Label the swept values: within a decade or two matplotlib labels the
        # minor ticks too, and they overlap.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel(data["xlabel"])
    ax.set_title(f"{data['check']}: {data['name'].split('_vs_')[1].replace('_', ' ')} sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_sweeps(directory, *, names=None, n_reps=None, quick=False, rng=0, progress=False):
    """Save one PNG per sweep in ``directory``; returns the paths.

    ``names``: sweeps to plot (a str is one sweep), all by default; the papers'
    registered validation figures too (FedHDP's Figures 1-4: keys of
    ``ebfl.fedhdp.figures.FIGURES``). Each sweep is :func:`plot_sweep` of
    :func:`sweep_data`.
    """
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(f"directory must be a path, got {type(directory).__name__}")
    # The papers' figures (FedHDP's Figures 1-4, ebfl.fedhdp.figures) are drawn too.
    figures = {name: plot for names_, plot in figure_sets().values() for name in names_}
    names = [*SWEEPS, *figures] if names is None else check_names(
        names, "names", {**SWEEPS, **figures}, what="sweep")
    _options_iv(n_reps, quick, progress)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (n for n in names if n in SWEEPS):
        data = sweep_data(name, n_reps=n_reps, quick=quick, rng=rng, progress=progress)
        paths.append(plot_sweep(data, directory / f"{name}.png"))
    for plot in dict.fromkeys(figures[n] for n in names if n in figures):
        paths += plot(directory, names=[n for n in names if figures.get(n) is plot], n_reps=n_reps,
                      quick=quick, rng=rng, progress=progress)
    return paths
