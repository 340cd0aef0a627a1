"""Estimating the mode of a unimodal prior: a scan, then a bounded refinement.

The profile log-likelihood in the mode need not be unimodal (bimodal data): a
coarse scan over the quantiles of x (and 0 and the precision-weighted mean)
finds the best basin, and a bounded search between the scan's neighbours
refines it. The estimate is the best mode evaluated, so its fit is never below
the fit at any scanned mode (0 included).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

__all__ = ["estimate_mode", "precision_mean"]


def precision_mean(x, s, sd=0.0):
    """sum_i w_i x_i / sum_i w_i with w_i = 1 / (s_i^2 + sd^2)."""
    w = 1.0 / (s**2 + sd**2)
    return float(np.sum(w * x) / np.sum(w))


def estimate_mode(negll, x, s):
    """The mode minimizing ``negll`` (a function of the mode, memoized by the caller).

    Returns the best mode evaluated.
    """
    lo, hi = float(np.min(x)), float(np.max(x))
    scan = np.unique(np.concatenate([np.quantile(x, np.linspace(0, 1, 21)),
                                     [0.0, precision_mean(x, s)]]))
    values = {float(md): negll(float(md)) for md in scan}
    if hi > lo:
        best = min(values, key=values.get)
        i = int(np.searchsorted(scan, best))
        left, right = scan[max(i - 1, 0)], scan[min(i + 1, scan.size - 1)]
        if right > left:
            res = optimize.minimize_scalar(negll, bounds=(left, right), method="bounded",
                                           options={"xatol": 1e-6 * (hi - lo + 1)})
            values[float(res.x)] = negll(float(res.x))
    return min(values, key=values.get)
