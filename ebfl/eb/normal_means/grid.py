r"""The grid families of :func:`ebfl.eb.ebnm`: mixtures of fixed components, weights by mix-SQP.

``normal_scale_mixture``, ``ash`` (= ``unimodal_symmetric``), ``unimodal``,
``unimodal_nonnegative``, ``unimodal_nonpositive`` and ``npmle``: g is a mixture
of fixed components (normals of a grid of sds, or uniforms of a grid of widths,
around the mode; or atoms), and the weights maximize the log-likelihood exactly,
by :func:`ebfl.eb.mixsqp`, with its KKT certificate.

The default grid of scales runs geometrically, by the factor ``GRID_MULT``
(2^(1/8)), from a tenth of the smallest s to twice the largest excess spread
sqrt(max((x - mode)^2 - s^2)): finer than any s can resolve at the bottom, wider
than any observation asks for at the top (the idea of Stephens, 2017, "False
discovery rates: a new deal"); it is then refined around the scales that carry
weight. With ``mode="estimate"`` the mode is the best of a scan over the
quantiles of x (with 0 and the precision-weighted mean) refined by a bounded
search (:func:`~ebfl.eb.normal_means.modes.estimate_mode`).

Large n. Above ``BIN_MIN`` observations the search (the mode, the grid's
refinement) runs on cells of (x, s) (s in classes of ratio ``CELL_RATIO``, x in
bins ``CELL_WIDTH`` times the class's smallest s wide, each cell its count and
mean x and s), and the weights on the final grid are then refitted on the
observations themselves, warm-started from the cells' fit (a few mix-SQP
iterations), so the result and its KKT certificate are the data's. Where the
data's likelihood matrix would exceed ``REFIT_MAX`` entries (n = 10^7 with a
hundred components), the weights are refitted on finer cells instead and then
certified on the data in one pass (:func:`certificate`): ``kkt`` and
``log_likelihood_gap_bound`` are the data's (the log-likelihood is within that
bound of the optimum on the grid), and ``converged`` says whether ``kkt <= tol``
(rarely, at 1e-8: the cells' weights are close to, not at, the data's optimum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ebfl.eb.normal_means.modes import estimate_mode
from ebfl.eb.normal_means.prior import KINDS, NormalMeansPrior

__all__ = ["BIN_MIN", "CELL_RATIO", "CELL_WIDTH", "FINE_RATIO", "FINE_WIDTH", "GRID_MULT",
           "REFIT_MAX", "Rows", "cells", "certificate", "default_scale_grid", "fit_grid"]

#: The default grid's ratio between neighbouring scales. Measured against R's ebnm
#: on sparse heavy-tailed heteroskedastic data (n = 1000): at sqrt(2) (24 scales) every
#: unimodal family fell 0.2 to 2.8 nats below ebnm's fit; at 2^(1/8) (87) all of them
#: were above it, and halving the ratio again gained under 0.1 nats.
GRID_MULT = 2 ** (1 / 8)


def default_scale_grid(x, s, mode, mult=GRID_MULT):
    """The default grid of scales (sds or half-widths) of the grid families.

    Returns 0 (the point mass at the mode) followed by a geometric sequence from
    min(s) / 10 to 2 sqrt(max((x - mode)^2 - s^2)) by the factor ``mult``.
    """
    lo = float(np.min(s)) / 10
    excess = float(np.max((x - mode) ** 2 - s**2))
    hi = max(2 * math.sqrt(excess) if excess > 0 else 0.0, 8 * lo)
    n = int(math.ceil(math.log(hi / lo) / math.log(mult))) + 1
    return np.concatenate([[0.0], lo * mult ** np.arange(n)])



#: Observations above which the grid search runs on cells of (x, s).
BIN_MIN = 20_000
#: The cells: s in classes of this ratio, x in bins CELL_WIDTH times the class's
#: smallest s wide (a cell's members differ in x by at most a quarter of their s).
CELL_RATIO = 1.05
CELL_WIDTH = 0.25
#: Largest likelihood matrix (entries, 8 bytes each) refitted on the observations.
REFIT_MAX = 150_000_000
#: Beyond it, the final weights are refitted on finer cells (bins a twentieth of s,
#: classes of ratio 1.01) before the certificate: the cells' bias falls with the
#: square of their width.
FINE_WIDTH, FINE_RATIO = 0.05, 1.01


@dataclass(frozen=True)
class Rows:
    """The rows a fit sees: the observations (count None) or cells with their counts
    (:func:`cells`)."""

    x: np.ndarray
    s: np.ndarray
    count: np.ndarray | None = None


def cells(x, s, cell_width=CELL_WIDTH, cell_ratio=CELL_RATIO):
    """Cells of (x, s) as :class:`Rows` (mean x and s, count), or None when they would
    not halve the number of rows.

    s is cut into classes of ratio ``cell_ratio`` from min(s), and x, in each class,
    into bins ``cell_width`` times the class's smallest s wide; each cell is its count
    and its members' mean x and s (the means cancel the first-order change of each
    member's log-likelihood)."""
    s_min = float(np.min(s))
    cls = np.floor(np.log(s / s_min) / math.log(cell_ratio)).astype(np.int64)
    width = cell_width * s_min * cell_ratio ** cls
    span = (x - float(np.min(x))) / width
    if not float(np.max(span)) * (int(cls.max()) + 1) < 2.0**62:
        return None  # keys would overflow int64 (x spread over ~1e18 standard errors)
    key = cls * (int(np.max(span)) + 1) + np.floor(span).astype(np.int64)
    _, row, count = np.unique(key, return_inverse=True, return_counts=True)
    if count.size > x.size // 2:
        return None
    row = row.reshape(-1)
    count = count.astype(np.float64)
    return Rows(np.bincount(row, weights=x) / count, np.bincount(row, weights=s) / count,
                 count)



def _grid_components(family, mode, scales):
    """(kinds, a, b) of the fixed components of a grid family around ``mode``."""
    pos = scales[scales > 0]
    point = (["normal"], [mode], [0.0]) if np.any(scales == 0) else ([], [], [])
    if family == "normal_scale_mixture":
        return (point[0] + ["normal"] * pos.size, point[1] + [mode] * pos.size,
                point[2] + list(pos))
    kinds, a, b = list(point[0]), list(point[1]), list(point[2])
    if family in ("unimodal", "unimodal_nonnegative"):
        kinds += ["uniform"] * pos.size
        a += [mode] * pos.size
        b += list(mode + pos)
    if family in ("unimodal", "unimodal_nonpositive"):
        kinds += ["uniform"] * pos.size
        a += list(mode - pos)
        b += [mode] * pos.size
    if family in ("unimodal_symmetric", "ash"):
        kinds += ["uniform"] * pos.size
        a += list(mode - pos)
        b += list(mode + pos)
    return kinds, np.array(a, float), np.array(b, float)


def _fit_grid_weights(family, rows, mode, scales, tol, start=None):
    kinds, a, b = _grid_components(family, mode, scales)
    return _fit_weights(family, rows, kinds, a, b, tol, start, mode)


#: A cold fit (no start) on more columns than this first fits every
#: (K // _COARSE_COLUMNS)-th column and starts from that fit, zero elsewhere.
_COARSE_COLUMNS = 32


def _fit_weights(family, rows, kinds, a, b, tol, start, mode):
    from ebfl.eb.mixture_weights import MAX_ITER, _mix_sqp

    k = len(kinds)
    if start is None and k > 2 * _COARSE_COLUMNS:
        # From uniform weights every column is active, and each of mix-SQP's first
        # Hessians costs n K^2 (a 926-atom NPMLE on 3134 cells: 6.8 s in 17 iterations).
        # Started from a coarse grid's optimum instead, the active set is that fit's
        # support plus the columns that violate, and the fit reaches the same certified
        # optimum.
        pick = np.arange(0, k, k // _COARSE_COLUMNS)
        coarse, coarse_diag = _fit_weights(family, rows, tuple(np.array(kinds)[pick]),
                                           np.asarray(a)[pick], np.asarray(b)[pick], tol,
                                           None, mode)
        start = np.zeros(k)
        start[pick] = coarse.weights
        g, diag = _fit_weights(family, rows, kinds, a, b, tol, start, mode)
        return g, {**diag, "n_iter": diag["n_iter"] + coarse_diag["n_iter"]}
    template = NormalMeansPrior(np.full(len(kinds), 1 / len(kinds)), kinds, a, b, family)
    lik, shift = _likelihood(template, rows.x, rows.s)
    counts = np.ones(rows.x.size) if rows.count is None else rows.count
    if start is not None:
        start = np.asarray(start, dtype=float) / float(np.sum(start))
    # mix-SQP's own core: the matrix is built here, so its input checks (a pass over an
    # (n, K) matrix each) would only re-check it
    weights, info = _mix_sqp(lik, counts, shift, tol, MAX_ITER, start=start, warn=4,
                             name="mixsqp")
    weights = np.where(weights > 0, weights, 0.0)
    g = NormalMeansPrior(weights / weights.sum(), kinds, a, b, family)
    return g, {"converged": bool(info["converged"]), "kkt": float(info["kkt"]),
               "log_likelihood_gap_bound": float(info["log_likelihood_gap_bound"]),
               "n_iter": int(info["n_iter"]), "at_bound": False, "mode": float(mode),
               "log_likelihood": float(info["history"][-1])}


def _likelihood(g, x, s):
    """(lik, shift) of g's components at rows x, s: lik = exp(log density - shift), shift
    each row's largest log density (``_grid_kernels.likelihood_matrix``; numpy below
    its size threshold, as the log densities)."""
    from ebfl.eb.normal_means.prior import _KERNEL_MIN

    if x.size * g.n_components < _KERNEL_MIN:
        lik, shift = _likelihood_numpy(g, x, s)
    else:
        from ebfl.eb.normal_means._grid_kernels import likelihood_matrix

        codes = np.array([KINDS.index(kind) for kind in g.kinds], dtype=np.int64)
        lik, shift = likelihood_matrix(np.ascontiguousarray(x, dtype=float),
                                       np.ascontiguousarray(s, dtype=float), codes, g.a, g.b)
    if not np.all(np.isfinite(shift)):
        row = int(np.flatnonzero(~np.isfinite(shift))[0])
        raise ValueError(f"row {row} of the data (or of its cells) has no likelihood under "
                         "any component of the grid (x too far from every component for "
                         "double precision)")
    return lik, shift


def _likelihood_numpy(g, x, s):
    """:func:`_likelihood` in numpy (the kernel's twin)."""
    log_l = g._log_component_density_numpy(x, s)
    shift = log_l.max(axis=1)
    return np.exp(log_l - shift[:, None]), shift


def _component_scales(family, g):
    """The grid scale each component of a grid prior was built from (0: the point)."""
    kinds = np.array(g.kinds)
    if family == "normal_scale_mixture":
        return g.b.copy()
    width = np.where(kinds == "uniform", g.b - g.a, 0.0)
    return width / 2 if family in ("unimodal_symmetric", "ash") else width


def _refined(family, rows, mode, scales, tol, fit):
    """Refine the grid where the fit puts its weight: scales a factor mult^(1/2),
    mult^(1/4), ... on either side of every scale with weight are added and the weights
    refitted, while the log-likelihood still rises by more than 1e-6 nats.

    On a fixed geometric grid the optimum depends on where the grid happens to fall: at
    2^(1/8) the fit was 0.006 to 0.7 nats below R's ebnm on its own grid on some data
    (n = 300 to 10^5), although above it on most. Halving the spacing around the active
    scales recovers that loss and more, at a few extra columns."""
    g, diag = fit
    for level in range(1, 5):
        active = _component_scales(family, g)[g.weights > 0]
        active = active[active > 0]
        if active.size == 0:
            break
        step = GRID_MULT ** (0.5**level)
        more = np.unique(np.concatenate([active * step, active / step]))
        new_scales = np.unique(np.concatenate([scales, more]))
        if new_scales.size == scales.size:
            break
        # Warm start: the old components keep their weights and the new ones start at
        # 0, so mix-SQP begins at the old optimum and its active set at the old support
        # (the new columns enter as they violate; a trace of mass on every column would
        # make every first Hessian n K^2).
        kinds, a, b = _grid_components(family, mode, new_scales)
        old = {(k, ai, bi): w for k, ai, bi, w in zip(g.kinds, g.a, g.b, g.weights,
                                                     strict=True)}
        start = np.array([old.get((k, ai, bi), 0.0) for k, ai, bi in
                          zip(kinds, a, b, strict=True)])
        g_new, diag_new = _fit_grid_weights(family, rows, mode, new_scales, tol,
                                            start=start)
        gain = diag_new["log_likelihood"] - diag["log_likelihood"]
        if gain < 0:
            break
        g, diag, scales = g_new, diag_new, new_scales
        if gain <= 1e-6:
            break
    return g, {**diag, "grid_size": int(scales.size)}


def fit_grid(family, x, s, mode, scale, tol):
    """Fit grid family ``family`` to checked data; returns (prior, diagnostics)."""
    if family == "npmle":
        return _fit_npmle(x, s, scale, tol)
    return _via_cells(family, x, s, tol,
                      lambda rows: _search(family, x, s, rows, mode, scale, tol))


def _via_cells(family, x, s, tol, fit):
    """``fit(rows)`` on the observations, or (above BIN_MIN) on their cells and then made
    the data's by :func:`_on_the_data`."""
    binned = cells(x, s) if x.size > BIN_MIN else None
    g, diag = fit(Rows(x, s) if binned is None else binned)
    if binned is None:
        return g, diag
    return _on_the_data(family, x, s, g, {**diag, "n_cells": int(binned.x.size)}, tol)


def _search(family, x, s, rows, mode, scale, tol):
    """The mode (if estimated), the refined grid and the weights, fitted on ``rows``
    (the grid and the mode scan from the data x, s themselves)."""
    default = isinstance(scale, str)
    if not isinstance(mode, str):
        scales = default_scale_grid(x, s, mode) if default else scale
        fit = _fit_grid_weights(family, rows, mode, scales, tol)
        return _refined(family, rows, mode, scales, tol, fit) if default else fit
    # One grid for every candidate mode (the objective stays continuous in the mode):
    # wide enough for a mode at either end of the data.
    scales = default_scale_grid(x, s, float(np.min(x))) if default else scale
    fits = {}

    def negll(md):
        md = float(md)
        if md not in fits:
            # Warm start from the last fit, with every column kept alive (a neighbouring
            # mode's optimum is close; mix-SQP only needs a positive start).
            last = next(reversed(fits.values()))[0].weights if fits else None
            start = None if last is None else 0.999 * last + 0.001 / last.size
            fits[md] = _fit_grid_weights(family, rows, md, scales, tol, start=start)
        return -fits[md][1]["log_likelihood"]

    best = estimate_mode(negll, x, s)
    return _refined(family, rows, best, scales, tol, fits[best]) if default else fits[best]


def _on_the_data(family, x, s, g, diag, tol):
    """The cells' fit made the data's: its grid refitted on the observations from its
    weights, or, for a matrix beyond REFIT_MAX, refitted on finer cells and certified
    on the observations (module docstring)."""
    k = g.n_components
    # The cells' weights as they are, zeros included: mix-SQP's active set then starts
    # at the cells' (a trace on every column would make its first Hessian n k^2)
    start = g.weights
    if x.size * k <= REFIT_MAX:
        g_new, d = _fit_weights(family, Rows(x, s), g.kinds, g.a, g.b, tol, start,
                                diag["mode"])
        return g_new, {**diag, **d, "refitted": True}
    fine = cells(x, s, FINE_WIDTH, FINE_RATIO)
    if fine is not None and fine.x.size * k <= REFIT_MAX:
        g, _ = _fit_weights(family, fine, g.kinds, g.a, g.b, tol, start, diag["mode"])
        diag = {**diag, "n_cells": int(fine.x.size)}
    kkt, loglik = certificate(g, x, s)
    return g, {**diag, "converged": bool(kkt <= tol), "kkt": kkt,
               "log_likelihood_gap_bound": x.size * kkt, "log_likelihood": loglik,
               "refitted": False}


def certificate(g, x, s):
    """(kkt, log-likelihood) of the weights of ``g`` on the data x, s, in one pass:
    kkt = max_k (1/n) sum_i L_ik / (L w)_i - 1, clipped at 0 (mix-SQP's; the
    log-likelihood is within n kkt of the optimum on g's components)."""
    from ebfl.eb.normal_means._grid_kernels import certificate_sums

    codes = np.array([KINDS.index(kind) for kind in g.kinds], dtype=np.int64)
    ratio, loglik = certificate_sums(np.ascontiguousarray(x), np.ascontiguousarray(s), codes,
                                     g.a, g.b, g.weights)
    return max(float(ratio.max()) / x.size - 1.0, 0.0), float(loglik)


def _certificate_numpy(g, x, s):
    """:func:`certificate` in numpy (the kernel's twin)."""
    log_l = g._log_component_density_numpy(x, s)
    # shifted by the weighted components' largest: the marginal is theirs (a component
    # without weight may be far larger, or its exp overflow: a ratio of inf, as it is)
    top = log_l[:, g.weights > 0].max(axis=1)
    with np.errstate(over="ignore"):
        lik = np.exp(log_l - top[:, None])
    f = lik[:, g.weights > 0] @ g.weights[g.weights > 0]
    ratio = (lik / f[:, None]).sum(axis=0)
    return max(float(ratio.max()) / x.size - 1.0, 0.0), float(np.sum(np.log(f) + top))


def _fit_npmle(x, s, scale, tol):
    from ebfl.eb.npmle import npmle_normal

    grid, n_grid = None, 300
    if isinstance(scale, str):
        # Atoms a quarter of the smallest s apart (300 to 1000 of them): at 300
        # equally spaced atoms the fit fell 0.02 nats below R's ebnm on data spanning
        # 150 smallest-s; at a quarter-s spacing it is above. Capped at 1000: mix-SQP's
        # Hessian on a wide active set costs n k^2 (14 s at n = 3153, k = 1000 here).
        span = float(np.max(x) - np.min(x)) / float(np.min(s))
        n_grid = int(min(max(300, math.ceil(4 * span)), 1000))
    else:
        grid = scale
    if x.size > BIN_MIN:
        # The cells' path of the other grid families, with atoms for components (the
        # grid as npmle_normal makes it: n_grid points from min x to max x)
        atoms = np.linspace(float(np.min(x)), float(np.max(x)), n_grid) if grid is None \
            else np.asarray(grid, float)
        kinds, zeros = ["normal"] * atoms.size, np.zeros(atoms.size)
        g, diag = _via_cells("npmle", x, s, tol, lambda rows: _fit_weights(
            "npmle", rows, kinds, atoms, zeros, tol, None, 0.0))
        diag.pop("mode", None)  # the NPMLE has none
        return g, diag
    fit = npmle_normal(x, s, grid=grid, n_grid=n_grid, tol=tol)
    keep = fit.weights > 0
    atoms = fit.grid[keep]
    g = NormalMeansPrior(fit.weights[keep] / fit.weights[keep].sum(),
                         ["normal"] * atoms.size, atoms, np.zeros(atoms.size), "npmle")
    return g, {"converged": bool(fit.converged), "kkt": float(fit.kkt),
               "n_iter": int(fit.n_iter), "at_bound": False,
               "log_likelihood_gap_bound": float(
                   fit.diagnostics.get("log_likelihood_gap_bound", np.nan))}
