r"""Fitting each prior family of the normal-means model: x_i ~ N(theta_i, s_i^2), theta_i ~ g.

Four kinds of fit, by the shape of the family:

* **Parametric** (``normal``, ``point_normal``, ``point_laplace``,
  ``point_exponential``, and in their own modules ``horseshoe`` and
  ``generalized_binary``): the marginal log-likelihood is maximized over a few
  parameters (the weight of the point mass, a scale, the mode when estimated).
  ``normal`` is the maximum-likelihood fit of :func:`ebfl.eb.gaussian_eb`,
  which is certified on its own.
* **Grid** (``normal_scale_mixture``, ``ash``, ``unimodal``,
  ``unimodal_symmetric``, ``unimodal_nonnegative``, ``unimodal_nonpositive``,
  ``npmle``): mixtures of fixed components with KKT-certified weights
  (:mod:`ebfl.eb.normal_means.grid`).
* **Smooth** (``deconvolver``): Efron's penalized log-spline g
  (:mod:`ebfl.eb.normal_means.deconvolver`).
* **Fixed** (``point_mass``, ``flat``): nothing or only the mode to fit.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ebfl.eb.normal_means.grid import fit_grid
from ebfl.eb.normal_means.modes import precision_mean as _precision_mean
from ebfl.eb.normal_means.names import (
    FAMILIES,
    GRID_FAMILIES,
    PARAMETRIC_FAMILIES,
    SMOOTH_FAMILIES,
)
from ebfl.eb.normal_means.prior import NormalMeansPrior

__all__ = ["FAMILIES", "GRID_FAMILIES", "PARAMETRIC_FAMILIES", "SMOOTH_FAMILIES",
           "fit_family"]



# ------------------------------------------------------------------ parametric families

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


#: Below this t, log Phi(t) and the Mills ratio come from the asymptotic series (as in
#: the Numba kernel, ``_kernels.TAIL``).
_TAIL = -20.0


def _tail_series(t):
    """R(t) - 1 where Phi(t) = phi(t) / (-t) R(t), t <= _TAIL: the asymptotic series
    sum_k (-1)^k (2k - 1)!! / t^(2k) (its terms fall below 1e-17 by k = 12 at |t| >= 20)."""
    u = 1.0 / (t * t)
    term = np.ones_like(t)
    total = np.zeros_like(t)
    for k in range(1, 40):
        term = term * (-(2 * k - 1) * u)
        total = total + term
        if t.size == 0 or np.max(np.abs(term)) < 1e-17:
            break
    return total


def _mills(t, log_cdf):
    """lambda = phi(t) / Phi(t) and kappa = t + lambda (both > 0) from log Phi(t), without
    overflow in either tail, nor cancellation in kappa where t -> -inf (lambda ~ -t):
    there both come from the asymptotic series of Phi."""
    lam = np.exp(-0.5 * t * t - 0.5 * _LOG_2PI - log_cdf)
    kappa = t + lam
    tail = t <= _TAIL
    if np.any(tail):
        tt = t[tail]
        r1 = _tail_series(tt)
        lam[tail] = -tt / (1.0 + r1)
        kappa[tail] = tt * r1 / (1.0 + r1)
    return lam, kappa


def _slab(family, z, s, scale):
    """log of the slab's marginal density at z = x - mode, and its derivatives with
    respect to log(scale) and to the mode.

    The exponential slab at t = z / s - a, a = s / b: log f = -log b + a^2 / 2 - z / b
    + log Phi(t); d/d log b = -1 + a kappa(t) and d/d mode = (z / s - kappa(t)) / s
    (kappa = t + phi(t) / Phi(t)), which cancel no large terms. Where t <= _TAIL,
    log Phi(t) = -t^2 / 2 - log(-t) - log(2 pi) / 2 + log R(t), and the a^2 terms
    cancel on paper: log f = -log b - (z / s)^2 / 2 - log(-t) - log(2 pi) / 2 + log R(t).
    """
    if family == "point_normal":
        v = s**2 + scale**2
        logf = -0.5 * (_LOG_2PI + np.log(v) + z**2 / v)
        return logf, scale**2 * (z**2 / v**2 - 1 / v), z / v
    b = scale
    a = s / b
    parts = []
    for sign in ((1.0, -1.0) if family == "point_laplace" else (1.0,)):
        zs = sign * z / s
        t = zs - a
        log_cdf = special.log_ndtr(t)  # the costly part: once for the density and its slope
        lam, kappa = _mills(t, log_cdf)
        logf = -math.log(b) + a * (0.5 * a - zs) + log_cdf
        tail = t <= _TAIL
        if np.any(tail):
            tt = t[tail]
            logf[tail] = (-math.log(b) - 0.5 * zs[tail] ** 2 - np.log(-tt) - 0.5 * _LOG_2PI
                          + np.log1p(_tail_series(tt)))
        d_logb = -1.0 + a * kappa
        d_mode = sign * (zs - kappa) / s
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
    v = (pi0, [log scale], [mode]), in numpy: the twin of the Numba kernel that the fit
    uses (``_kernels.point_nll``, :class:`_PointObjective`), which must match it
    (tests/test_ebnm_kernels.py)."""
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
        # f0 / mix = r0 / pi0 and f1 / mix = r1 / (1 - pi0), not exp(l0 - lm): a
        # difference of log densities of 1e12 (|x| / s ~ 1e6) is off by 1e-4. At pi0 = 0
        # (below 1e-300) f0 / mix can exceed any double where the point explains x far
        # better than the slab: capped, the step still points the right way.
        q0 = r0 / pi0 if pi0 >= 1e-300 else np.exp(np.minimum(l0 - lm, 700.0))
        q1 = r1 / (1 - pi0) if pi0 < 1 else np.exp(np.minimum(l1 - lm, 700.0))
        grad = [-np.sum(q0 - q1)]
        if fit_scale:
            grad.append(-np.sum(r1 * d1_logb))
        if fit_mode:
            grad.append(-np.sum(r0 * z / s**2 + r1 * d1_mode))
        return -float(np.sum(lm)), np.array(grad)

    return fun


#: The parallel kernel or the serial one (their results are equal to the last bit).
#: With more than _MIN_THREADS Numba threads, both are timed on the first evaluation
#: of an objective of at least ``_kernels.PARALLEL_MIN`` observations, and the
#: parallel one serves that objective and the next _RETIME only where it took under
#: _PARALLEL_GAIN of the serial time; with fewer, the serial one serves. On a loaded
#: machine a parallel pass can wait milliseconds for a thread to be scheduled
#: (measured: 24 ms against 1.8 ms serial, n = 10^5, 2 busy cores, OpenMP threading
#: layer with active waiting; and a fit's timing of the two did not predict its later
#: passes): with 2 threads the best case halves a pass of ~2 ms, the worst multiplies
#: it by ten.
_KERNEL_CHOICE = {"parallel": None, "left": 0}
_RETIME = 32
_PARALLEL_GAIN = 0.6
_MIN_THREADS = 2

#: Newton's method stops where its step's predicted decrease g' H^-1 g / 2 is below
#: this times 1 + |f|.
_NEWTON_TOL = 1e-14


class _PointObjective:
    """The Numba twin of :func:`_point_objective` on (a subsample of) the data, in
    v = (pi0, [log scale], [mode]): ``fgh(v)`` -> (value, gradient, Hessian) (one fused
    pass, ``_kernels.point_nll``), and ``newton`` (``_kernels.newton``: every
    iteration in Numba)."""

    def __init__(self, family, x, s, fit_scale, fit_mode, scale, mode):
        import numba

        from ebfl.eb.normal_means import _kernels

        self._k = _kernels
        self.args = (_kernels.KINDS[family], np.ascontiguousarray(x, dtype=float),
                     np.ascontiguousarray(s, dtype=float))
        self.args += (np.log(self.args[2]),)
        self.fixed = (fit_scale, fit_mode, 1.0 if fit_scale else float(scale),
                      0.0 if fit_mode else float(mode))
        self.parallel = False
        if x.size >= _kernels.PARALLEL_MIN and numba.get_num_threads() > _MIN_THREADS:
            choice = _KERNEL_CHOICE
            if choice["parallel"] is not None and choice["left"] > 0:
                choice["left"] -= 1
                self.parallel = choice["parallel"]
            else:
                self.parallel = None  # timed on the first evaluation

    def fgh(self, v):
        v = np.asarray(v, dtype=float)
        if self.parallel is None:
            import time

            seconds = []
            for parallel in (True, False):
                start = time.perf_counter()
                out = self._k.objective(*self.args, v, *self.fixed, parallel)
                seconds.append(time.perf_counter() - start)
            self.parallel = bool(seconds[0] < _PARALLEL_GAIN * seconds[1])
            _KERNEL_CHOICE.update(parallel=self.parallel, left=_RETIME)
            return out
        return self._k.objective(*self.args, v, *self.fixed, self.parallel)

    def newton(self, v, lower, upper, tol=_NEWTON_TOL, known=None, sep=None):
        """Projected Newton from v (``_kernels.newton``): (v, f, grad, n_iter, status)."""
        v = np.asarray(v, dtype=float)
        d = v.size
        start = (np.array([np.nan]), np.zeros(d), np.zeros((d, d)))
        if self.parallel is None:
            f, g, h = self.fgh(v)
            start = (np.array([f]), g, h)
        return self._k.newton(*self.args, np.clip(v, lower, upper), lower, upper,
                              *self.fixed, self.parallel, tol, 50, start,
                              np.zeros((0, d)) if known is None else known,
                              np.zeros(d) if sep is None else sep)


def _projected(v, grad, lower, upper):
    """The gradient without the components that push v out of its box."""
    return np.where((v <= lower) & (grad > 0) | (v >= upper) & (grad < 0), 0.0, grad)


#: Observations in the deterministic subsample on which the multi-start search finds
#: the basin of the optimum (larger n: the basin's optimum is then polished by Newton's
#: method on subsamples _SAMPLE_GROWTH times larger, then on all of the data).
_BASIN_SAMPLE = 2048
_SAMPLE_GROWTH = 8


def _subsamples(n):
    """Index arrays of the nested ladder of evenly strided subsamples of range(n): sizes
    _BASIN_SAMPLE, 8 times that, ... while at most n / 4 (none for n <= 4 _BASIN_SAMPLE).
    Strided, a subsample of sorted data still spans it."""
    out = []
    m = _BASIN_SAMPLE
    while 4 * m <= n:
        out.append(((np.arange(m) + 0.5) * (n / m)).astype(np.intp))
        m *= _SAMPLE_GROWTH
    return out


def _lbfgsb(fgh, v, bounds):
    """L-BFGS-B from v (the fallback where Newton's method fails): (v, f, grad, n_iter,
    converged by L-BFGS-B's own test)."""
    res = optimize.minimize(lambda u: fgh(u)[:2], v, jac=True, method="L-BFGS-B",
                            bounds=bounds, options={"maxiter": 1000, "ftol": 1e-13,
                                                    "gtol": 1e-9})
    return res.x, float(res.fun), fgh(res.x)[1], int(res.nit), bool(res.success)


def _local_optimum(objective, v, lower, upper, bounds, tol=_NEWTON_TOL, known=None,
                   sep=None):
    """Projected Newton from v (``_PointObjective.newton``), then L-BFGS-B from its end
    where it failed (the better end point): (v, f, grad, n_iter, ok); ok None: merged
    into a basin of ``known`` (see ``_kernels.newton``)."""
    k = objective._k
    v, f, grad, n_iter, status = objective.newton(v, lower, upper, tol, known, sep)
    if status == k.MERGED:
        return v, f, grad, n_iter, None
    ok = status == k.CONVERGED
    if not ok:
        v2, f2, grad2, n2, ok2 = _lbfgsb(objective.fgh, v, bounds)
        n_iter += n2
        if f2 <= f:
            v, f, grad, ok = v2, f2, grad2, ok2
    return v, f, grad, n_iter, ok


def _fit_point(family, x, s, mode, scale):
    """Maximize the log-likelihood of pi0 delta + (1 - pi0) slab over pi0 (and the
    scale and the mode when they are estimated), with analytic gradients and Hessians.

    Projected Newton (``_kernels.newton``; L-BFGS-B where it fails) from several
    starts on the data (from 4 ``_BASIN_SAMPLE`` observations on: on an evenly strided
    subsample of ``_BASIN_SAMPLE``) finds the basins; there the best end point (and any
    distinct one whose subsample log-likelihood is close) is polished the same way on
    ever larger subsamples (:func:`_subsamples`), then on all the data. The best end
    point wins."""
    spread = math.sqrt(max(float(np.var(x)), float(np.min(s)) ** 2))
    span = float(np.max(np.abs(x))) + spread
    lo_log, hi_log = math.log(float(np.min(s)) * 1e-3), math.log(10 * span + 1e-300)
    fit_scale, fit_mode = isinstance(scale, str), isinstance(mode, str)
    x_lo, x_hi = float(np.min(x)), float(np.max(x))
    picks = _subsamples(x.size)
    ladder = [_PointObjective(family, x[pick], s[pick], fit_scale, fit_mode, scale, mode)
              for pick in picks]
    ladder.append(_PointObjective(family, x, s, fit_scale, fit_mode, scale, mode))
    bounds = [(0.0, 1.0)]
    if fit_scale:
        bounds.append((lo_log, hi_log))
    if fit_mode:
        bounds.append((x_lo, x_hi))
    lower, upper = np.array(bounds).T
    starts = []
    log_spread = [min(max(math.log(spread), lo_log), hi_log)] if fit_scale else []
    # (the median, then the other quantiles: one partition of x, or of the subsample
    # where the starts run)
    quantiles = (np.quantile(x[picks[0]] if picks else x, [0.5, 0.1, 0.25, 0.75, 0.9])
                 if fit_mode else [])
    for pi0, sc in ((0.5, spread), (0.5, spread / 10), (0.5, 3 * spread), (0.1, spread),
                    (0.9, spread)):
        v = [pi0] + ([min(max(math.log(sc), lo_log), hi_log)] if fit_scale else [])
        if fit_mode:
            v.append(min(max(float(quantiles[0]), x_lo), x_hi))
        if v not in starts:
            starts.append(v)
    if fit_mode:
        # The log-likelihood need not be unimodal in the mode (bimodal data): one more
        # start at each of a few quantiles of x, and at 0 (the default fixed mode).
        for md in (*quantiles[1:], 0.0):
            v = [0.5, *log_spread, min(max(float(md), x_lo), x_hi)]
            if v not in starts:
                starts.append(v)
    # Distinct basins: end points farther apart than sep in some coordinate.
    sep = np.array([0.02, 0.05, 0.02 * spread])[[0] + ([1] if fit_scale else [])
                                                 + ([2] if fit_mode else [])]
    ends = []
    if len(ladder) > 1:
        # On a subsample only the basins matter (the next rungs polish): a looser stop,
        # and a start whose path comes within sep of an end point found before is
        # in that basin, and stopped.
        for v0 in starts:
            known = np.array([r[0] for r in ends]).reshape(len(ends), len(v0))
            r = _local_optimum(ladder[0], v0, lower, upper, bounds, 1e-6, known, sep)
            if r[4] is not None:
                ends.append(r)
    else:
        ends = [_local_optimum(ladder[0], v0, lower, upper, bounds) for v0 in starts]
    ends.sort(key=lambda r: r[1])
    if len(ladder) > 1:
        # The subsample's log-likelihoods differ from the data's by sampling noise of
        # order sqrt(sample size): distinct basins that close are all polished (up to 3).
        margin = 2.0 * math.sqrt(_BASIN_SAMPLE)
        candidates = []
        for r in ends:
            if r[1] <= ends[0][1] + margin and len(candidates) < 3 and not any(
                    np.all(np.abs(r[0] - c[0]) <= sep) for c in candidates):
                candidates.append(r)
        for objective in ladder[1:]:
            polished = []
            for r in candidates:
                v, f, grad, n_iter, ok = _local_optimum(objective, r[0], lower, upper,
                                                        bounds)
                polished.append((v, f, grad, r[3] + n_iter, ok))
            candidates = polished
        ends = sorted(candidates, key=lambda r: r[1])
    v, f, grad, n_iter, ok = ends[0]
    # The fit has converged when Newton's model promised no further decrease, or the
    # projected gradient is small (L-BFGS-B can end ABNORMAL in its line search at the
    # optimum: no decrease left at double precision), or a start that converged ends
    # at its value.
    projected = _projected(v, grad, lower, upper)
    converged = bool(ok or np.max(np.abs(projected)) <= 1e-6 * (1 + abs(f))
                     or any(r[4] and r[1] <= f + 1e-10 * (1 + abs(f)) for r in ends))
    pi0 = min(max(float(v[0]), 0.0), 1.0)
    sc = math.exp(v[1]) if fit_scale else scale
    md = float(v[-1]) if fit_mode else mode
    at_bound = bool(pi0 in (0.0, 1.0) or (fit_scale and (v[1] <= lo_log + 1e-9
                                                         or v[1] >= hi_log - 1e-9)))
    return _point_prior(family, pi0, sc, md), {"converged": converged,
                                                "at_bound": at_bound, "n_iter": int(n_iter),
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


# ------------------------------------------------------------------------------- entry

def fit_family(family, x, s, mode, scale, *, tol=1e-8):
    """Fit ``family`` to checked data; returns (prior, diagnostics)."""
    if family in PARAMETRIC_FAMILIES:
        if family == "normal":
            return _fit_normal(x, s, mode, scale)
        if family == "horseshoe":
            from ebfl.eb.normal_means.horseshoe import fit_horseshoe

            return fit_horseshoe(x, s, mode, scale)
        if family == "generalized_binary":
            from ebfl.eb.normal_means.generalized_binary import (
                DEFAULT_RATIO,
                fit_generalized_binary,
            )

            return fit_generalized_binary(x, s, mode,
                                          DEFAULT_RATIO if isinstance(scale, str) else scale)
        return _fit_point(family, x, s, mode, scale)
    if family == "deconvolver":
        from ebfl.eb.normal_means.deconvolver import fit_deconvolver

        return fit_deconvolver(x, s, scale)
    if family in GRID_FAMILIES:
        return fit_grid(family, x, s, mode, scale, tol)
    md = _precision_mean(x, s) if isinstance(mode, str) else mode
    if family == "point_mass":
        return NormalMeansPrior([1.0], ["normal"], [md], [0.0], "point_mass"), {
            "converged": True, "at_bound": False, "n_iter": 0, "mode": float(md)}
    raise AssertionError(family)  # flat is handled by the caller (improper)
