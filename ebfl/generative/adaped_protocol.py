"""Which protocol reproduces Table 1? A search over what the paper leaves unstated.

The paper gives the split (50 MNIST clients of 3 classes), K = 5, tau = 10 and 50
epochs, but not how many training images a client holds, nor the learning rates it
tuned each method to (over :data:`~ebfl.generative.adaped.PAPER_LR_GRID`). With all
of MNIST each client has about 1,100 images of 3 digits, which makes local training
strong and FedAvg's one model good. :func:`protocol_search` runs Table 1
(:func:`~ebfl.generative.adaped.table1`) for several numbers of training images per
client, optionally choosing each method's rate on a validation split, and sets the
results beside the paper's; :func:`plot_protocol_search` draws accuracy against
images per client, one line per method, with the paper's values as markers.

Every (size, seed) cell is saved to ``checkpoint_dir`` as soon as it is done, so a
long search resumes where it stopped and a finished one re-plots at once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ebfl._validation import check_bool, check_int_scalar

__all__ = ["SEARCH_METHODS", "agreement", "plot_protocol_search", "protocol_search",
           "seeds_by_size"]

#: The methods the paper's Table 1 headline compares (and local training).
SEARCH_METHODS = ("AdaPeD", "FedAvg", "FedAvg+FT", "pFedMe", "QuPeD-FP", "Local")


def _sizes_iv(sizes):
    out = []
    for size in sizes:
        out.append(None if size is None or size == "all"
                   else check_int_scalar(size, "sizes", minimum=2))
    if not out:
        raise ValueError("sizes must hold at least one number of images per client")
    return out


def _cell_path(directory, key):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(directory) / f"adaped_protocol_{digest}.json"


def protocol_search(sizes=(50, 100, 200, 500, None), *, methods=SEARCH_METHODS, seeds=(0,),
                    lr_grid=None, classes_per_client=3, dataset="mnist", quick=False,
                    checkpoint_dir=None, progress=False, device=None):
    """Table 1 for every number of training images per client in ``sizes``.

    Parameters
    ----------
    sizes : sequence of int or None
        Training images per client (None or ``"all"``: all of them).
    methods : sequence of str
        Names from :data:`ebfl.generative.adaped.METHODS`.
    seeds : sequence of int
        One client split, initialization and sampling per seed.
    lr_grid : sequence of float, optional
        Choose each method's rate per seed on a validation split (see
        :func:`ebfl.generative.adaped.table1`); None keeps the default rates.
    classes_per_client : int
        Classes per client (the paper: 3).
    dataset : {"mnist", "fashion-mnist"}
    quick : bool
        :data:`~ebfl.generative.adaped.QUICK_ROUNDS` rounds per run (a pipeline check).
    checkpoint_dir : path-like, optional
        Where each finished (size, seed) cell is kept and read back.
    progress : bool
        Progress bars.
    device : None, str or torch.device
        Where the models train.

    Returns
    -------
    dict
        ``settings``; ``rows``: one per (size, method) with ``mean``, ``sd``,
        ``per_seed`` (of ``seeds``), the chosen ``lr`` per seed (with ``lr_grid``;
        ``lr_at_edge``: the grid's smallest or largest rate, so a better one may lie
        outside), ``seconds`` and the ``paper`` value; ``paper`` {method: [value,
        pm]}; ``agreement``: per size, how close the methods the paper reports come
        to it (see :func:`agreement`);
        ``best``: the size of the smallest ``rms_gap`` (None if the paper reports none
        of ``methods``); ``closest``: per method the paper reports, the size where our
        mean comes closest to it, with that ``gap`` (ours minus the paper's).
    """
    from ebfl.generative.adaped import at_grid_edge, table1

    sizes = _sizes_iv(sizes)
    seeds = [check_int_scalar(s, "seeds", minimum=0) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    quick = check_bool(quick, "quick")
    cells, paper = {}, {}
    for size in sizes:
        for seed in seeds:
            key = {"dataset": dataset, "size": size, "seed": seed, "methods": list(methods),
                   "lr_grid": None if lr_grid is None else [float(v) for v in lr_grid],
                   "classes": classes_per_client, "quick": quick}
            path = None if checkpoint_dir is None else _cell_path(checkpoint_dir, key)
            if path is not None and path.is_file():
                cell = json.loads(path.read_text())
            else:
                cell = table1(dataset, methods=methods, seeds=(seed,), quick=quick,
                              progress=progress, device=device,
                              classes_per_client=classes_per_client,
                              samples_per_client=size, lr_grid=lr_grid)
                cell.pop("curves")
                cell = json.loads(json.dumps(cell, default=float))
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(cell))
                    tmp.replace(path)  # a killed run never leaves half a cell
            cells[size, seed] = cell
            paper = cell["paper"]
    rows = []
    for size in sizes:
        for name in methods:
            runs = [cells[size, seed]["results"][name] for seed in seeds]
            acc = [r["per_seed"][0] for r in runs]
            rows.append({"samples_per_client": "all" if size is None else size, "method": name,
                         "mean": float(np.mean(acc)),
                         "sd": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
                         "per_seed": acc, "seeds": list(seeds),
                         "lr": [r["lr"][0] for r in runs] if lr_grid is not None else None,
                         "lr_at_edge": ([at_grid_edge(r["lr"][0], lr_grid) for r in runs]
                                        if lr_grid is not None else None),
                         "seconds": float(sum(r["seconds"][0] + sum(r.get("selection_seconds",
                                                                             [0.0]))
                                              for r in runs)),
                         "paper": paper.get(name, [None])[0]})
    first = cells[sizes[0], seeds[0]]["settings"]
    settings = {"dataset": dataset, "sizes": ["all" if s is None else s for s in sizes],
                "seeds": seeds, "methods": list(methods), "lr_grid": lr_grid,
                "classes_per_client": classes_per_client, "quick": quick,
                "rounds": first["rounds"], "sampled_per_round": first["sampled_per_round"],
                "metric": first["metric"]}
    match = agreement(rows)
    best = min(match, key=lambda a: a["rms_gap"])["samples_per_client"] if match else None
    closest = {}
    for name in methods:
        ranked = sorted((abs(r["mean"] - r["paper"]), i, r) for i, r in enumerate(rows)
                        if r["method"] == name and r["paper"] is not None)
        if ranked:
            r = ranked[0][2]
            closest[name] = {"samples_per_client": r["samples_per_client"],
                             "gap": r["mean"] - r["paper"]}
    return {"settings": settings, "rows": rows, "paper": paper, "agreement": match,
            "best": best, "closest": closest}


def agreement(rows):
    """How close each size's results come to the paper, over the methods it reports.

    Parameters
    ----------
    rows : list of dict
        The ``rows`` of :func:`protocol_search` (``samples_per_client``, ``method``,
        ``mean``, ``paper``).

    Returns
    -------
    list of dict
        One per size with at least one paper value: ``methods`` compared,
        ``rms_gap`` and ``max_gap`` (points of accuracy, ours minus the paper's;
        ``max_gap`` is the largest in absolute value, for ``worst``), and
        ``kendall_tau``, the rank agreement of our means with the paper's values
        (1: the paper's ordering; None with fewer than two methods).
    """
    from scipy.stats import kendalltau

    sizes = list(dict.fromkeys(r["samples_per_client"] for r in rows))
    out = []
    for size in sizes:
        rs = [r for r in rows if r["samples_per_client"] == size and r["paper"] is not None]
        if not rs:
            continue
        ours = np.array([r["mean"] for r in rs])
        theirs = np.array([r["paper"] for r in rs])
        gaps = ours - theirs
        worst = int(np.argmax(np.abs(gaps)))
        tau = float(kendalltau(ours, theirs).statistic) if len(rs) > 1 else None
        out.append({"samples_per_client": size, "methods": len(rs),
                    "rms_gap": float(np.sqrt(np.mean(gaps ** 2))),
                    "max_gap": float(gaps[worst]), "worst": rs[worst]["method"],
                    "kendall_tau": None if tau is None or np.isnan(tau) else tau})
    return out


def plot_protocol_search(result, path):
    """Accuracy against training images per client, one line per method; the paper's
    values as markers at the right. Saves to ``path`` and returns it.

    Parameters
    ----------
    result : dict or sequence of dict
        One result of :func:`protocol_search` or a sequence of them (for example
        default and tuned rates), drawn side by side on a shared accuracy axis. Only
        ``settings`` (``dataset``, ``sizes``, ``methods``, ``lr_grid``, ``seeds``) and
        ``rows`` (``samples_per_client``, ``method``, ``mean``, ``sd``, ``paper`` and
        optionally ``seeds``) are read, so a table of means ± sd merged from several
        searches (for example more seeds at one size than at another) draws too; the
        title then says which seeds each size has.
    path : path-like
        Where the PNG goes.

    Returns
    -------
    str
        ``path``.
    """
    from ebfl._plotting import subplots

    results = [result] if isinstance(result, dict) else list(result)
    if not results:
        raise ValueError("result must be a protocol_search result or a non-empty sequence")
    fig, axes = subplots(1, len(results), figsize=(7.5 * len(results), 4.5), sharey=True,
                         squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        _draw_search(ax, res)
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def _seeds_text(seeds):
    """``[0]`` -> "seed 0", ``[0, 1, 2]`` -> "seeds 0–2", ``[0, 2]`` -> "seeds 0, 2"."""
    seeds = sorted(seeds)
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(str(s) for s in seeds)


def seeds_by_size(result):
    """The seeds behind each size of a :func:`protocol_search` result (or a merged table).

    Parameters
    ----------
    result : dict
        ``settings`` (``sizes``, ``seeds``) and ``rows``; a row's own ``seeds`` win over
        ``settings["seeds"]``.

    Returns
    -------
    dict
        ``{size: [seeds]}`` in the order of ``settings["sizes"]``; the methods of one
        size must agree (else ValueError).
    """
    out = {}
    for size in result["settings"]["sizes"]:
        found = {tuple(r.get("seeds", result["settings"]["seeds"])) for r in result["rows"]
                 if r["samples_per_client"] == size}
        if len(found) != 1:
            raise ValueError(f"the rows of size {size!r} disagree on their seeds: "
                             f"{sorted(found)}")
        out[size] = list(found.pop())
    return out


def _draw_search(ax, result):
    sizes = result["settings"]["sizes"]
    positions = np.arange(len(sizes))
    for name in result["settings"]["methods"]:
        rows = {r["samples_per_client"]: r for r in result["rows"] if r["method"] == name}
        rows = [rows[size] for size in sizes]
        line = ax.errorbar(positions, [r["mean"] for r in rows], yerr=[r["sd"] for r in rows],
                           marker="o", capsize=3, label=name)
        paper = rows[0]["paper"]
        if paper is not None:
            ax.scatter([positions[-1] + 0.35], [paper], marker="*", s=90,
                       color=line[0].get_color(), zorder=3)
    ax.set_xticks(positions, [str(s) for s in sizes])
    ax.set_xlim(-0.3, positions[-1] + 0.6)
    ax.set_xlabel("training images per client")
    s = result["settings"]
    rates = "rates chosen on validation" if s["lr_grid"] else "default rates"
    by_size = seeds_by_size(result)
    if len({tuple(v) for v in by_size.values()}) == 1:
        seeds = _seeds_text(next(iter(by_size.values())))
    else:  # a merged table: say which seeds each size has
        seeds = ", ".join(f"{_seeds_text(v)} at {k}" for k, v in by_size.items())
    spread = "mean ± sd over " if any(len(v) > 1 for v in by_size.values()) else ""
    ax.set_title(f"Table 1 protocol search on {s['dataset']}, {rates}:\n{spread}{seeds}; "
                 "★ the paper", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
