r"""Fitting each prior family of the normal-means model: x_i ~ N(theta_i, s_i^2), theta_i ~ g.

Three kinds of fit, by the shape of the family:

* **Parametric** (``normal``, ``point_normal``, ``point_laplace``,
  ``point_exponential``): the marginal log-likelihood is maximized over a few
  parameters (the weight of the point mass, a scale, the mode when estimated)
  by L-BFGS-B inside their box, from several starts; the best end point wins.
  ``normal`` is the maximum-likelihood fit of :func:`ebfl.eb.gaussian_eb`, which
  is certified on its own.
* **Grid** (``normal_scale_mixture``, ``ash``, ``unimodal``,
  ``unimodal_symmetric``, ``unimodal_nonnegative``, ``unimodal_nonpositive``,
  ``npmle``): g is a mixture of fixed components (normals of a grid of sds, or
  uniforms of a grid of widths, around the mode; or atoms), and the weights
  maximize the log-likelihood exactly, by :func:`ebfl.eb.mixsqp`, with its KKT
  certificate. With ``mode="estimate"`` the mode is the best of a scan over
  the quantiles of x (with 0 and the precision-weighted mean) refined by a
  bounded search around the best, so the estimate is never below the fit at
  any of those modes.
* **Fixed** (``point_mass``, ``flat``): nothing or only the mode to fit.

``ash`` is the scale mixture of uniforms symmetric about the mode (ashr's
default, so also ``unimodal_symmetric``). The default grid of scales runs
geometrically, by the factor ``GRID_MULT`` (2^(1/8)), from a tenth of the
smallest s to twice the largest excess spread sqrt(max((x - mode)^2 - s^2)):
finer than any s can resolve at the bottom, wider than any observation asks for
at the top (the idea of Stephens, 2017, "False discovery rates: a new deal").
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ebfl.eb.normal_means.prior import NormalMeansPrior

__all__ = ["FAMILIES", "GRID_FAMILIES", "PARAMETRIC_FAMILIES", "default_scale_grid",
           "fit_family"]

PARAMETRIC_FAMILIES = ("normal", "point_normal", "point_laplace", "point_exponential")
GRID_FAMILIES = ("normal_scale_mixture", "ash", "unimodal", "unimodal_symmetric",
                 "unimodal_nonnegative", "unimodal_nonpositive", "npmle")
FIXED_FAMILIES = ("point_mass", "flat")
FAMILIES = PARAMETRIC_FAMILIES + GRID_FAMILIES + FIXED_FAMILIES


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


# ------------------------------------------------------------------ parametric families

def _precision_mean(x, s, sd=0.0):
    w = 1.0 / (s**2 + sd**2)
    return float(np.sum(w * x) / np.sum(w))


def _point_prior(family, pi0, scale, mode):
    """pi0 delta_mode + (1 - pi0) slab(mode, scale)."""
    if family == "point_normal":
        return NormalMeansPrior([pi0, 1 - pi0], ["normal", "normal"], [mode, mode],
                                [0.0, scale], family)
    if family == "point_laplace":
        half = (1 - pi0) / 2
        return NormalMeansPrior([pi0, half, half], ["normal", "exp+", "exp-"],
                                [mode, mode, mode], [0.0, scale, scale], family)
    return NormalMeansPrior([pi0, 1 - pi0], ["normal", "exp+"], [mode, mode], [0.0, scale],
                            family)


_LOG_2PI = math.log(2 * math.pi)


def _mills(t, log_cdf):
    """phi(t) / Phi(t) from log Phi(t), without overflow in either tail."""
    return np.exp(-0.5 * t * t - 0.5 * _LOG_2PI - log_cdf)


def _slab(family, z, s, scale):
    """log of the slab's marginal density at z = x - mode, and its derivatives with
    respect to log(scale) and to the mode."""
    if family == "point_normal":
        v = s**2 + scale**2
        logf = -0.5 * (_LOG_2PI + np.log(v) + z**2 / v)
        return logf, scale**2 * (z**2 / v**2 - 1 / v), z / v
    b = scale
    parts = []
    for sign in ((1.0, -1.0) if family == "point_laplace" else (1.0,)):
        zz = sign * z
        t = zz / s - s / b
        log_cdf = special.log_ndtr(t)  # the costly part: once for the density and its slope
        lam = _mills(t, log_cdf)
        logf = -math.log(b) + s**2 / (2 * b * b) - zz / b + log_cdf
        d_logb = -1.0 - s**2 / (b * b) + zz / b + lam * s / b
        d_mode = sign * (1.0 / b - lam / s)
        parts.append((logf, d_logb, d_mode))
    if len(parts) == 1:
        return parts[0]
    (lp, gp_b, gp_m), (ln, gn_b, gn_m) = parts
    logf = np.logaddexp(lp, ln) - math.log(2)
    wp = np.exp(lp - math.log(2) - logf)
    wn = 1.0 - wp
    return logf, wp * gp_b + wn * gn_b, wp * gp_m + wn * gn_m


def _point_objective(family, x, s, fit_scale, fit_mode, scale, mode):
    """The negative log-likelihood of pi0 delta + (1 - pi0) slab and its gradient in
    v = (pi0, [log scale], [mode])."""
    log_point_const = -0.5 * (_LOG_2PI + 2 * np.log(s))

    def fun(v):
        pi0 = min(max(v[0], 0.0), 1.0)
        sc = math.exp(v[1]) if fit_scale else scale
        md = v[-1] if fit_mode else mode
        z = x - md
        l0 = log_point_const - 0.5 * z**2 / s**2
        l1, d1_logb, d1_mode = _slab(family, z, s, sc)
        with np.errstate(divide="ignore"):
            a0 = l0 + math.log(pi0) if pi0 > 0 else np.full(x.size, -np.inf)
            a1 = l1 + math.log1p(-pi0) if pi0 < 1 else np.full(x.size, -np.inf)
        lm = np.logaddexp(a0, a1)
        r0, r1 = np.exp(a0 - lm), np.exp(a1 - lm)
        # f0 / mix can exceed any double where pi0 -> 0 and the point explains x far
        # better than the slab: capped, the step still points the right way.
        grad = [-np.sum(np.exp(np.minimum(l0 - lm, 700.0)) - np.exp(np.minimum(l1 - lm, 700.0)))]
        if fit_scale:
            grad.append(-np.sum(r1 * d1_logb))
        if fit_mode:
            grad.append(-np.sum(r0 * z / s**2 + r1 * d1_mode))
        return -float(np.sum(lm)), np.array(grad)

    return fun


def _fit_point(family, x, s, mode, scale):
    """Maximize the log-likelihood of pi0 delta + (1 - pi0) slab over pi0 (and the
    scale and the mode when they are estimated), with analytic gradients, from
    several starts; the best end point wins."""
    spread = math.sqrt(max(float(np.var(x)), float(np.min(s)) ** 2))
    span = float(np.max(np.abs(x))) + spread
    lo_log, hi_log = math.log(float(np.min(s)) * 1e-3), math.log(10 * span + 1e-300)
    fit_scale, fit_mode = isinstance(scale, str), isinstance(mode, str)
    x_lo, x_hi = float(np.min(x)), float(np.max(x))
    fun = _point_objective(family, x, s, fit_scale, fit_mode, scale, mode)
    bounds = [(0.0, 1.0)]
    if fit_scale:
        bounds.append((lo_log, hi_log))
    if fit_mode:
        bounds.append((x_lo, x_hi))
    starts = []
    for pi0, sc in ((0.5, spread), (0.5, spread / 10), (0.5, 3 * spread), (0.1, spread),
                    (0.9, spread)):
        v = [pi0] + ([min(max(math.log(sc), lo_log), hi_log)] if fit_scale else [])
        if fit_mode:
            v.append(min(max(float(np.median(x)), x_lo), x_hi))
        if v not in starts:
            starts.append(v)
    best, ends = None, []
    for v0 in starts:
        res = optimize.minimize(fun, v0, jac=True, method="L-BFGS-B", bounds=bounds,
                                options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-9})
        ends.append(res)
        if best is None or res.fun < best.fun:
            best = res
    # L-BFGS-B can end a start ABNORMAL in its line search at the optimum (no decrease
    # left at double precision). The fit has converged when its projected gradient is
    # small, or when a start that converged by L-BFGS-B's own test ends at its value.
    v = best.x
    lower, upper = np.array(bounds).T
    grad = fun(v)[1]
    projected = np.where((v <= lower) & (grad > 0) | (v >= upper) & (grad < 0), 0.0, grad)
    converged = bool(best.success or np.max(np.abs(projected)) <= 1e-6 * (1 + abs(best.fun))
                     or any(r.success and r.fun <= best.fun + 1e-10 * (1 + abs(best.fun))
                            for r in ends))
    pi0 = min(max(float(v[0]), 0.0), 1.0)
    sc = math.exp(v[1]) if fit_scale else scale
    md = float(v[-1]) if fit_mode else mode
    at_bound = bool(pi0 in (0.0, 1.0) or (fit_scale and (v[1] <= lo_log + 1e-9
                                                         or v[1] >= hi_log - 1e-9)))
    return _point_prior(family, pi0, sc, md), {"converged": converged,
                                                "at_bound": at_bound, "n_iter": int(best.nit),
                                                "mode": md}


def _fit_normal(x, s, mode, scale):
    from ebfl.eb.gaussian import gaussian_eb

    if not isinstance(scale, str):
        md = _precision_mean(x, s, scale) if isinstance(mode, str) else mode
        return NormalMeansPrior([1.0], ["normal"], [md], [scale], "normal"), {
            "converged": True, "at_bound": False, "n_iter": 0, "mode": float(md)}
    if x.size == 1:
        # One observation: the likelihood N(x; mode, s^2 + sd^2) is largest at mode = x,
        # sd = 0 (mode estimated), or at sd^2 = max((x - mode)^2 - s^2, 0) (mode fixed).
        md = float(x[0]) if isinstance(mode, str) else mode
        sd = math.sqrt(max((float(x[0]) - md) ** 2 - float(s[0]) ** 2, 0.0))
        return NormalMeansPrior([1.0], ["normal"], [md], [sd], "normal"), {
            "converged": True, "at_bound": sd == 0.0, "n_iter": 0, "mode": md}
    fit = gaussian_eb(x, s, method="mle", prior_mean=None if isinstance(mode, str) else mode)
    sd = float(fit.prior.sd)
    md = float(np.asarray(fit.prior.mean))
    return NormalMeansPrior([1.0], ["normal"], [md], [sd], "normal"), {
        "converged": True, "at_bound": sd == 0.0, "n_iter": 0, "mode": md}


# ------------------------------------------------------------------------ grid families

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


def _fit_grid_weights(family, x, s, mode, scales, tol, start=None):
    from ebfl.eb.mixture_weights import mixsqp

    kinds, a, b = _grid_components(family, mode, scales)
    template = NormalMeansPrior(np.full(len(kinds), 1 / len(kinds)), kinds, a, b, family)
    sol = mixsqp(template.log_component_density(x, s), log=True, tol=tol, start=start)
    weights = np.where(sol.weights > 0, sol.weights, 0.0)
    g = NormalMeansPrior(weights / weights.sum(), kinds, a, b, family)
    return g, {"converged": bool(sol.converged), "kkt": float(sol.kkt),
               "log_likelihood_gap_bound": float(sol.log_likelihood_gap_bound),
               "n_iter": int(sol.n_iter), "at_bound": False, "mode": float(mode),
               "log_likelihood": float(sol.log_likelihood)}


def _component_scales(family, g):
    """The grid scale each component of a grid prior was built from (0: the point)."""
    kinds = np.array(g.kinds)
    if family == "normal_scale_mixture":
        return g.b.copy()
    width = np.where(kinds == "uniform", g.b - g.a, 0.0)
    return width / 2 if family in ("unimodal_symmetric", "ash") else width


def _refined(family, x, s, mode, scales, tol, fit):
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
        # Warm start: the old components keep their weights (the new ones start at a
        # trace of mass), so mix-SQP begins at the old optimum.
        kinds, a, b = _grid_components(family, mode, new_scales)
        old = {(k, ai, bi): w for k, ai, bi, w in zip(g.kinds, g.a, g.b, g.weights,
                                                     strict=True)}
        start = np.array([old.get((k, ai, bi), 0.0) for k, ai, bi in
                          zip(kinds, a, b, strict=True)]) + 1e-6 / len(kinds)
        g_new, diag_new = _fit_grid_weights(family, x, s, mode, new_scales, tol,
                                            start=start)
        gain = diag_new["log_likelihood"] - diag["log_likelihood"]
        if gain < 0:
            break
        g, diag, scales = g_new, diag_new, new_scales
        if gain <= 1e-6:
            break
    return g, {**diag, "grid_size": int(scales.size)}


def _fit_grid(family, x, s, mode, scale, tol):
    if family == "npmle":
        return _fit_npmle(x, s, scale, tol)
    default = isinstance(scale, str)
    if not isinstance(mode, str):
        scales = default_scale_grid(x, s, mode) if default else scale
        fit = _fit_grid_weights(family, x, s, mode, scales, tol)
        return _refined(family, x, s, mode, scales, tol, fit) if default else fit
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
            fits[md] = _fit_grid_weights(family, x, s, md, scales, tol, start=start)
        return -fits[md][1]["log_likelihood"]

    # The log-likelihood need not be unimodal in the mode (bimodal data): a coarse scan
    # over the quantiles of x (and 0 and the precision-weighted mean) finds the best
    # basin, and a bounded search between the scan's neighbours refines it.
    lo, hi = float(np.min(x)), float(np.max(x))
    scan = np.unique(np.concatenate([np.quantile(x, np.linspace(0, 1, 21)),
                                     [0.0, _precision_mean(x, s)]]))
    for md in scan:
        negll(md)
    if hi > lo:
        best = min(fits, key=negll)
        i = int(np.searchsorted(scan, best))
        left, right = scan[max(i - 1, 0)], scan[min(i + 1, scan.size - 1)]
        if right > left:
            res = optimize.minimize_scalar(negll, bounds=(left, right), method="bounded",
                                           options={"xatol": 1e-6 * (hi - lo + 1)})
            negll(res.x)
    best = min(fits, key=negll)
    return _refined(family, x, s, best, scales, tol, fits[best]) if default else fits[best]


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
    fit = npmle_normal(x, s, grid=grid, n_grid=n_grid, tol=tol)
    keep = fit.weights > 0
    atoms = fit.grid[keep]
    g = NormalMeansPrior(fit.weights[keep] / fit.weights[keep].sum(),
                         ["normal"] * atoms.size, atoms, np.zeros(atoms.size), "npmle")
    return g, {"converged": bool(fit.converged), "kkt": float(fit.kkt),
               "n_iter": int(fit.n_iter), "at_bound": False,
               "log_likelihood_gap_bound": float(
                   fit.diagnostics.get("log_likelihood_gap_bound", np.nan))}


# ------------------------------------------------------------------------------- entry

def fit_family(family, x, s, mode, scale, *, tol=1e-8):
    """Fit ``family`` to checked data; returns (prior, diagnostics)."""
    if family in PARAMETRIC_FAMILIES:
        if family == "normal":
            return _fit_normal(x, s, mode, scale)
        return _fit_point(family, x, s, mode, scale)
    if family in GRID_FAMILIES:
        return _fit_grid(family, x, s, mode, scale, tol)
    md = _precision_mean(x, s) if isinstance(mode, str) else mode
    if family == "point_mass":
        return NormalMeansPrior([1.0], ["normal"], [md], [0.0], "point_mass"), {
            "converged": True, "at_bound": False, "n_iter": 0, "mode": float(md)}
    raise AssertionError(family)  # flat is handled by the caller (improper)
