"""Figures: the experiments' ``--plot`` outputs (without pyplot) and the results' ``plot()``.

A :class:`matplotlib.figure.Figure` built directly needs no backend switch
(``matplotlib.use("Agg")`` inside a library call would break a notebook's
inline figures afterwards) and is freed with its last reference, so nothing is
left open in pyplot's figure manager.
"""

from __future__ import annotations


def subplots(*args, figsize=None, constrained_layout=False, **kwargs):
    """Like ``pyplot.subplots``: ``(figure, axes)``, with a pyplot-free Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, constrained_layout=constrained_layout)
    return fig, fig.subplots(*args, **kwargs)


# ----------------------------------------------------------------- results' plot()
#
# The ``plot`` methods of the result objects (fits, run histories, accountants) are
# for interactive use, so, unlike the experiments' figures above, they draw on pyplot
# figures (as ``EBNMResult.plot``, statsmodels and ArviZ do): ``plt.show()`` shows
# them from a script and a notebook displays them. They never switch the backend.

#: Resolution of a saved PNG (that of ``EBNMResult.plot``).
RESULT_DPI = 120


def check_plot_path(path):
    """The ``path`` of a ``plot`` method, checked before anything is drawn.

    None, or a file path whose folder exists and whose suffix, if any, names a
    format matplotlib writes (a PNG when there is none). Returned unchanged.
    """
    import os
    from pathlib import Path

    if path is None:
        return None
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a file path (str or os.PathLike) or None, got "
                        f"{type(path).__name__}")
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"path must name a file, got the folder {str(file)!r}")
    if not file.parent.is_dir():
        raise ValueError(f"path: the folder {str(file.parent)!r} does not exist")
    suffix = file.suffix[1:].lower()
    if suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise ValueError(f"path: matplotlib cannot write {suffix!r} files; use one of "
                             f"{', '.join(sorted(formats))}")
    return path


def result_figure(draw, *, ncols=1, figsize, path=None):
    """The Figure of a ``plot`` method: ``draw(axes)`` on one row of ``ncols`` axes.

    ``path`` (checked by :func:`check_plot_path` first) receives the figure at
    :data:`RESULT_DPI`. A figure whose drawing fails is closed, so no half-drawn
    one stays in pyplot's figure manager.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
    try:
        draw(list(axes[0]))
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=RESULT_DPI)
    except BaseException:
        plt.close(fig)
        raise
    return fig


#: History entries that are bookkeeping, not something to follow over the rounds.
_BOOKKEEPING = ("round", "iteration")


def plot_history(history, metric, path):
    """The ``plot`` of a run's history: each metric against the round, one panel each.

    ``metric``: a history entry's name or a list of them; None takes the metrics
    evaluated on the clients (the entries that have a ``<name>_sd``, the sd over
    clients, drawn as a band) and ``mse`` when the history has it.
    """
    import math
    import numbers

    import numpy as np
    from matplotlib.ticker import MaxNLocator

    path = check_plot_path(path)
    if not history:
        raise ValueError("the history is empty (no round was evaluated): nothing to plot")
    keys = list(dict.fromkeys(k for row in history for k in row))
    numeric = [k for k in keys if k not in _BOOKKEEPING and all(
        isinstance(row.get(k, math.nan), numbers.Real) for row in history)]
    if metric is None:
        names = [k for k in numeric if f"{k}_sd" in keys] + (["mse"] if "mse" in numeric
                                                             else [])
        if not names:
            raise ValueError(f"metric: this history has no per-client metric to default to; "
                             f"name one of {numeric}")
    elif isinstance(metric, str):
        names = [metric]
    elif isinstance(metric, list | tuple) and metric and all(isinstance(m, str)
                                                             for m in metric):
        names = list(dict.fromkeys(metric))
    else:
        raise TypeError(f"metric must be the name of a history entry, a non-empty list of "
                        f"names, or None, got {metric!r}")
    unknown = [m for m in names if m not in numeric]
    if unknown:
        raise ValueError(f"metric: {unknown[0]!r} is not an entry to plot against the round "
                         f"(a number in every row that has it); this history's are {numeric}")
    rounds = np.array([row.get("round", i) for i, row in enumerate(history)], dtype=float)

    def column(name):
        return np.array([row.get(name, math.nan) for row in history], dtype=float)

    def draw(axes):
        for ax, name in zip(axes, names, strict=True):
            values = column(name)
            ax.plot(rounds, values, marker="o" if rounds.size <= 30 else None, ms=3)
            if f"{name}_sd" in numeric:
                sd = column(f"{name}_sd")
                ax.fill_between(rounds, values - sd, values + sd, alpha=0.2, lw=0,
                                label="± sd over clients")
                ax.legend(fontsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole
            ax.set_xlabel("round")
            ax.set_ylabel(name)

    return result_figure(draw, ncols=len(names), figsize=(4.2 * len(names), 3.4), path=path)
