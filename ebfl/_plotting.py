"""Figures for the experiments' ``--plot`` outputs, made without pyplot.

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
