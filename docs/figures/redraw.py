"""Redraw the documentation's figures from the numbers stored beside them.

Every figure of the documentation that ebfl can draw again has a JSON next to its
PNG, ``docs/figures/<name>.json``: the numbers the figure shows, the command that
produced them, its seeds, where the numbers come from, and the plotting function
that draws them. ``tests/test_docs_figures.py`` checks those numbers against the
tables and captions of the page that shows the figure.

Usage (from the repository root)::

    python docs/figures/redraw.py                  # redraw every figure from its JSON
    python docs/figures/redraw.py estimation_e8    # one figure (names without .png)
    python docs/figures/redraw.py --out /tmp/figs  # somewhere else
    python docs/figures/redraw.py --list           # what there is, and how long --run takes
    python docs/figures/redraw.py --run hapt_logistic   # run the experiment again first

Redrawing takes seconds and runs nothing. ``--run`` re-runs the experiment behind
a figure (the same call as its command; the datasets come from the data home,
``EBFL_DATA``), then rewrites its JSON and PNG; the page's tables must then be
updated by hand where the numbers moved (the test says where).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Figures on the site without stored numbers, and why (their captions say so too).
WITHOUT_NUMBERS = {
    "regression_e3": "drawn by a full run (7-15 min) before its numbers were kept; the "
                     "right panel (EM's MSE per round) is on no page",
    "dppfl_figures": "drawn by the full run (1,421 fits, 66 min) before its numbers were "
                     "kept; Figure 2's objective curves are on no page",
}


# --- what each figure is: (page, plotting function, command, seeds, minutes for --run) --

def _figure(page, plot, command, seeds, minutes, run=None, source="run"):
    return {"page": page, "plot": plot, "command": command, "seeds": list(seeds),
            "minutes": minutes, "run": run, "source": source}


@lru_cache(maxsize=1)
def _election_matrix():
    from ebfl.datasets import election_matrix, load_county_returns

    return election_matrix(load_county_returns())


def _run_e8():
    import numpy as np

    from ebfl.generative.estimation import e8_private_gaussian

    # `ebfl reproduce estimation` gives E8 the second of two streams spawned from its
    # seed (E1 the first): the same numbers without running E1.
    e8 = e8_private_gaussian(runs=200, rng=np.random.default_rng(0).spawn(2)[1])
    keep = ("epsilon", "mse", "formula", "weight", "true_delta")
    return {"settings": e8["settings"], "rows": [{k: r[k] for k in keep} for r in e8["rows"]],
            "local": e8["local"], "non_private": e8["non_private"]}


def _run_election_gains():
    from ebfl.generative.election import election_experiment

    res = election_experiment(_election_matrix(), epsilons=(1.0, 5.0), rng=0)
    return {k: res[k] for k in ("n_counties", "years", "paper", "gains")}


def _run_election_shrinkage():
    from ebfl.generative.election import shrinkage_data

    return shrinkage_data(_election_matrix())


def _run_hapt():
    from ebfl.generative.hapt import hapt_logistic

    res = hapt_logistic(positive="SITTING")
    keep = ("accuracy", "se", "balanced_accuracy", "sigma_theta2")
    return {"settings": {k: res["settings"][k] for k in ("task", "clients")},
            "results": {name: {k: r[k] for k in keep if k in r}
                        for name, r in res["results"].items()},
            "curves": res["curves"]}


def _run_table1_hapt():
    from ebfl.generative.adaped import METHODS, table1

    res = table1("hapt", methods=METHODS, seeds=(0,))
    return {"settings": res["settings"], "paper": res["paper"], "curves": res["curves"]}


def _run_dp(**kwargs):
    def run():
        from ebfl.generative.adaped import dp_sweep

        return dp_sweep("hapt", **kwargs)
    return run


def _run_fedem():
    from ebfl.generative.adaped import fedem_comparison

    return fedem_comparison("hapt", seeds=(0, 1, 2))


def _run_protocol():
    """From the checkpoints of the runs on the neural page (``EBFL_PROTOCOL_CKPT``, else
    ``ckpt``); without them this trains for hours."""
    from ebfl.generative.adaped import PAPER_LR_GRID
    from ebfl.generative.adaped_protocol import SEARCH_METHODS, protocol_search

    ckpt = os.environ.get("EBFL_PROTOCOL_CKPT", "ckpt")
    default = protocol_search(seeds=(0, 1, 2), checkpoint_dir=ckpt)
    tuned = [protocol_search((size,), methods=SEARCH_METHODS[:-1], seeds=seeds,
                             lr_grid=PAPER_LR_GRID, checkpoint_dir=ckpt)
             for size, seeds in ((50, (0, 1, 2)), ("all", (0,)))]
    tuned = {"settings": {**tuned[0]["settings"], "sizes": [50, "all"], "seeds": [0, 1, 2]},
             "rows": tuned[0]["rows"] + tuned[1]["rows"]}
    keep = ("samples_per_client", "method", "mean", "sd", "seeds", "per_seed", "paper")
    return [{"settings": {k: r["settings"][k] for k in ("dataset", "sizes", "methods",
                                                        "lr_grid", "seeds")},
             "rows": [{k: row[k] for k in keep} for row in r["rows"]]}
            for r in (default, tuned)]


def _run_sweep(name):
    def run():
        from ebfl.validation.sweeps import sweep_data

        return sweep_data(name, rng=0)
    return run


@lru_cache(maxsize=1)
def _fedhdp_data():
    from ebfl.fedhdp.figures import fedhdp_figure_data

    return fedhdp_figure_data(rng=0)  # as `ebfl validate --plot` draws them


def _run_fedhdp(name):
    return lambda: _fedhdp_data()[name]


def _run_private_bernoulli():
    from ebfl.privacy.sweep import DEFAULT_EPSILONS, private_bernoulli_sweep

    return private_bernoulli_sweep(DEFAULT_EPSILONS, alpha=2.0, beta=2.0, n_clients=10_000,
                                   n=14, rng=0)


_GUIDE = "docs/guide/"
_FEDHDP = ("ebfl validate fedhdp_server fedhdp_gaps fedhdp_local fedhdp_regression "
           "fedhdp_levels --plot DIR")
_VALIDATE = "ebfl validate --plot DIR"
FIGURES = {
    "estimation_e8": _figure(
        "docs/reproductions.md", "ebfl.generative.estimation:plot_e8",
        "ebfl reproduce estimation --json", [0], 1, _run_e8),
    "election_gains": _figure(
        "docs/reproductions.md", "ebfl.generative.election:plot_election_gains",
        "ebfl reproduce election --json", [0], 0.3, _run_election_gains),
    "election_shrinkage": _figure(
        _GUIDE + "elections.md", "ebfl.generative.election:plot_election_shrinkage",
        "ebfl reproduce election --json", [], 0.3, _run_election_shrinkage),
    "hapt_logistic": _figure(
        "docs/reproductions.md", "ebfl.generative.hapt:plot_hapt",
        "ebfl reproduce hapt --json", [], 1, _run_hapt),
    "adaped_table1_hapt": _figure(
        "docs/reproductions.md", "ebfl.generative.adaped:plot_table1",
        "ebfl reproduce adaped --dataset hapt --json", [0], 2, _run_table1_hapt),
    "adaped_dp_hapt": _figure(
        "docs/reproductions.md", "ebfl.generative.adaped:plot_dp_sweep",
        "ebfl reproduce dp-adaped --dataset hapt --json", [0], 2, _run_dp()),
    "adaped_dp_hapt_concat_finetune": _figure(
        "docs/reproductions.md", "ebfl.generative.adaped:plot_dp_sweep",
        "ebfl reproduce dp-adaped --dataset hapt --concatenate --fine-tune --json", [0], 2,
        _run_dp(concatenate=True, fine_tune=True)),
    "adaped_fedem_hapt": _figure(
        "docs/reproductions.md", "ebfl.generative.adaped:plot_fedem_comparison",
        "ebfl reproduce adaped-fedem --dataset hapt --seeds 3 --json", [0, 1, 2], 6, _run_fedem,
        source="the run's printed output (the neural page's table): ε by the accountant to "
               "3 significant digits, accuracies to 2 decimals"),
    "adaped_table1_protocol": _figure(
        _GUIDE + "neural.md", "ebfl.generative.adaped_protocol:plot_protocol_search",
        "ebfl reproduce adaped-protocol --seeds 3 --checkpoint-dir ckpt --json; ebfl reproduce "
        "adaped-protocol --sizes 50 all --methods AdaPeD FedAvg FedAvg+FT pFedMe QuPeD-FP "
        "--lr-grid --checkpoint-dir ckpt --json; the same with --sizes 50 --seed 1 --seeds 2",
        [0, 1, 2], 240, _run_protocol,
        source="the runs' printed means ± sd (the neural page's tables; per seed where the "
               "history kept it); --run reads the runs' checkpoints"),
    "validate_theorem1": _figure(
        _GUIDE + "bounds-validation.md", "ebfl.validation.sweeps:plot_sweep", _VALIDATE, [0],
        0.2, _run_sweep("thm1_vs_sigma_theta")),
    "validate_theorem2_ldp": _figure(
        _GUIDE + "bounds-validation.md", "ebfl.validation.sweeps:plot_sweep", _VALIDATE, [0],
        0.2, _run_sweep("thm2_ldp_vs_epsilon")),
    "validate_theorem2_quantizer": _figure(
        _GUIDE + "bounds-validation.md", "ebfl.validation.sweeps:plot_sweep", _VALIDATE, [0],
        0.2, _run_sweep("thm2_quantizer_vs_bits")),
    "validate_theorem4": _figure(
        _GUIDE + "bounds-validation.md", "ebfl.validation.sweeps:plot_sweep", _VALIDATE, [0],
        1, _run_sweep("thm4_weight_vs_epsilon")),
    "fedhdp_figure1_server_mse": _figure(
        _GUIDE + "fedhdp.md", "ebfl.fedhdp.figures:plot_fedhdp_figure", _FEDHDP, [0], 0.2,
        _run_fedhdp("fedhdp_fig1_server_vs_r")),
    "fedhdp_figure2_local_mse": _figure(
        _GUIDE + "fedhdp.md", "ebfl.fedhdp.figures:plot_fedhdp_figure", _FEDHDP, [0], 0.2,
        _run_fedhdp("fedhdp_fig2_local_vs_lambda")),
    "fedhdp_figure3_regression": _figure(
        _GUIDE + "fedhdp.md", "ebfl.fedhdp.figures:plot_fedhdp_figure", _FEDHDP, [0], 0.2,
        _run_fedhdp("fedhdp_fig3_regression_vs_lambda")),
    "fedhdp_figure4_optout_fraction": _figure(
        _GUIDE + "fedhdp.md", "ebfl.fedhdp.figures:plot_fedhdp_figure", _FEDHDP, [0], 0.2,
        _run_fedhdp("fedhdp_fig4_server_vs_rho")),
    "private_bernoulli_epsilon": _figure(
        _GUIDE + "privacy.md", "ebfl.privacy.sweep:plot_private_bernoulli",
        "ebfl private-bernoulli --json", [0], 0.2, _run_private_bernoulli),
}


# --- the stored numbers ------------------------------------------------------------------

def json_path(name):
    return HERE / f"{name}.json"


def load(name):
    """The stored record of figure ``name`` (see :func:`record`)."""
    return json.loads(json_path(name).read_text())


def _round(obj, digits=6):
    """Floats to ``digits`` significant digits: far below what a figure resolves or a
    page prints, and a JSON that reads and diffs well."""
    if isinstance(obj, float) and math.isfinite(obj) and obj != 0.0:
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: _round(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round(v, digits) for v in obj]
    return obj


def _flat(obj):
    return not isinstance(obj, dict | list) or (
        isinstance(obj, list) and all(not isinstance(v, dict | list) for v in obj))


def _dumps(obj, indent=0):
    """JSON with dicts one key a line, short flat dicts (a table's row) and lists of
    numbers on one line."""
    pad = " " * indent
    if isinstance(obj, dict) and all(_flat(v) for v in obj.values()) and \
            len(json.dumps(obj, ensure_ascii=False)) <= 140:
        return pad + json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, dict) and obj:
        items = [f'{pad} {json.dumps(k)}: {_dumps(v, indent + 1).lstrip()}'
                 for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict | list) for v in obj):
        if all(isinstance(v, list) and all(not isinstance(w, dict | list) for w in v)
               for v in obj):  # a list of short lists (curves: [round, value] pairs)
            return pad + json.dumps(obj)
        return (pad + "[\n" + ",\n".join(_dumps(v, indent + 1) for v in obj) + "\n" + pad
                + "]")
    return pad + json.dumps(obj, ensure_ascii=False)


def record(name, data, source=None):
    """The JSON record of figure ``name`` drawn from ``data``; ``source``: where the
    numbers come from (default: the figure's note, "run" for a run of its command)."""
    spec = FIGURES[name]
    return {"figure": f"{name}.png", "page": spec["page"], "command": spec["command"],
            "seeds": spec["seeds"], "source": source or spec["source"], "plot": spec["plot"],
            "data": _round(json.loads(json.dumps(data, default=_plain)))}


def _plain(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def save(name, data, source=None):
    """Write ``docs/figures/<name>.json`` from ``data`` (see :func:`record`); its path."""
    path = json_path(name)
    path.write_text(_dumps(record(name, data, source)) + "\n", encoding="utf-8")
    return path


# --- drawing -----------------------------------------------------------------------------

def plot_function(stored):
    module, func = stored["plot"].split(":")
    return getattr(importlib.import_module(module), func)


def redraw(name, out=HERE):
    """Draw figure ``name`` from its JSON into ``out``; returns the PNG's path."""
    stored = load(name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / stored["figure"]
    plot_function(stored)(stored["data"], path)
    return path


def stored_names():
    return sorted(p.stem for p in HERE.glob("*.json"))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python docs/figures/redraw.py",
        description="Redraw the documentation's figures from their stored numbers.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="figures (default: every one with a JSON)")
    parser.add_argument("--out", metavar="DIR", default=str(HERE),
                        help="where the PNGs go (default: docs/figures)")
    parser.add_argument("--run", action="store_true",
                        help="re-run the experiments first and rewrite the JSONs")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, spec in FIGURES.items():
            print(f"{name:32s} {spec['command']}  (--run: about {spec['minutes']:g} min)")
        for name, why in WITHOUT_NUMBERS.items():
            print(f"{name:32s} no stored numbers: {why}")
        return 0
    names = args.names or (list(FIGURES) if args.run else stored_names())
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        why = [f"{n}: {WITHOUT_NUMBERS[n]}" for n in unknown if n in WITHOUT_NUMBERS]
        parser.error(f"no stored numbers for {', '.join(unknown)}"
                     + (" (" + "; ".join(why) + ")" if why else "")
                     + f"; known: {', '.join(FIGURES)}")
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in names:
        if args.run:
            print(f"running {name} (about {FIGURES[name]['minutes']:g} min) ...", flush=True)
            save(name, FIGURES[name]["run"](), source="run")
        print("saved", redraw(name, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
