r"""Maximum-likelihood mixture weights by mix-SQP, with a certificate of optimality.

Given the likelihood L_ik >= 0 of observation i under component k (a grid point
of an NPMLE, a component of a fitted mixture) and multiplicities c_i, the weights

.. math:: \max_{w \in \Delta_K} \sum_i c_i \log (L w)_i

solve a convex problem. :func:`mixsqp` solves it by the sequential quadratic
programming method of Kim, Carbonetto, Stephens & Anitescu (2020, "mix-SQP"):
each iteration minimizes the quadratic model of the relaxed objective
phi(x) = -(1/N) sum_i c_i log (Lx)_i + sum_k x_k over x >= 0 (whose minimizer
sums to 1), then backtracks along the step. :func:`ebfl.eb.npmle_normal`,
:func:`ebfl.eb.npmle_binomial` and the weights of
:func:`ebfl.eb.gaussian_mixture_eb` are solved here.

The solution is sparse (tens of atoms out of hundreds of grid points). Kim et
al. solve the subproblem by an active-set method; here the sparsity is used
throughout:

* *Active set.* The Hessian (1/N) L' diag(c / f^2) L and the quadratic
  subproblem are restricted to the columns with positive weight plus the
  worst KKT violators (negative gradient) and those at the local minima of
  the gradient along the grid: O(n k^2) per iteration with k ~ 10-40 instead
  of O(n K^2). The gradient over the *whole* grid is still computed exactly
  each iteration (one fused pass over L, O(n K)), so the certificate below is
  unaffected; a fixed point of the restricted iteration has no violators and
  is the optimum.
* The line search evaluates f = L x along the step from L restricted to the
  active columns.

Two kinds of step keep the iteration moving where the quadratic model fails:

* *Mass moves.* A Newton step can leave rows with almost no density (a first
  step from the uniform weights onto three atoms near 0 leaves observations at
  8 with f ~ 1e-14, the usual case with sparse signals). The quadratic model of
  -log f_i holds only for changes of f_i of the size of f_i, so from there each
  Newton step at most doubles f_i: tens of iterations, on a Hessian whose
  entries span 25 orders of magnitude and on which the subproblem is solved
  only to rounding error. While ``kkt > 1``, mass is instead moved to the
  columns at the peaks of r_k, one at a time, each by an exact line search on
  x -> (1 - a) x + a e_k (concave in a, with slope N (r_k - 1) at 0); this
  restores the density of those rows in one iteration.
* *Fallback.* When the subproblem's solution is not a descent direction or the
  line search finds no gain (rounding on a nearly singular Hessian), mass is
  moved to the most violating column the same way, which gains whenever
  kkt > 0. The iteration stops only when ``kkt <= tol``, at ``max_iter``, or
  when neither step raises the log-likelihood at double precision.

Convergence is *certified*: with r_k = (1/N) sum_i c_i L_ik / (Lw)_i, concavity
gives ell(w*) - ell(w) <= N (max_k r_k - 1) for the optimum w*, and the
reported ``kkt = max_k r_k - 1`` (over every column) is driven below ``tol``.
All sums over rows are accumulated in fixed row blocks, so the result does not
depend on the number of threads; the n-sized work is in Numba kernels (the
private ``ebfl.eb._mixsqp_kernels``), and small problems run them on one thread.

Why hand-written: mixsqp exists only for R, and REBayes (R) calls the commercial
Mosek solver; no maintained Python package solves this problem. The nonnegative
QP inside each step is a warm-started Lawson-Hanson active-set method (the
private ``_nonnegative_qp`` explains why not ``scipy.optimize.nnls``).
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import numpy as np
from scipy import linalg, optimize

from ebfl._validation import (
    as_real_array,
    check_finite_array,
    check_int_scalar,
    check_positive_scalar,
)
from ebfl.eb import _mixsqp_kernels
from ebfl.eb.results import _freeze

__all__ = ["MixSQPResult", "mixsqp"]

#: Blocks of rows of the Hessian kernel (each holds a k x k partial sum); fixed,
#: so results do not depend on the number of threads.
HESSIAN_BLOCKS = 16
#: Blocks of rows of the Numba passes; fixed, so results do not depend on the
#: number of threads.
ROW_BLOCKS = 64
#: Least work (entries visited per pass, about 2 ms on one core) run on threads. A
#: parallel launch waits at its barrier for every thread, and on a shared machine a
#: descheduled thread costs a time slice per launch: a small fit (hundreds of
#: launches) could take 30x longer on two threads than on one.
PARALLEL_MIN_WORK = 1 << 21
#: Armijo constant and smallest step of the backtracking line search.
ARMIJO = 0.01
MIN_STEP = 1e-10
#: Default largest number of iterations: a guard against a hang, not a working limit.
MAX_ITER = 1000
#: Above this kkt, mass is first moved to the most violating columns by exact line
#: searches (the quadratic model of -log f is poor where a step left rows with
#: almost no density; see the module docstring).
RESCUE_KKT = 1.0
#: Optimality tolerance of the quadratic subproblem on its dual (gradient units).
QP_DUAL_TOL = 1e-13
#: Most violating columns added to the active set per iteration (besides one per dip).
ACTIVE_VIOLATORS = 32
#: Largest free set the quadratic subproblem is warm-started with.
QP_WARM_MAX_FREE = 64


@dataclass(frozen=True)
class MixSQPResult:
    """Mixture weights that maximize the log-likelihood, with their certificate.

    Attributes
    ----------
    weights : ndarray of shape (K,)
        w_k >= 0, summing to 1; most are exactly 0 on a fine grid.
    log_likelihood : float
        sum_i c_i log (L w)_i (on the scale of the input: with ``log=True`` the
        log-likelihoods' own scale).
    kkt : float
        max_k r_k - 1 >= 0 with r_k = (1/N) sum_i c_i L_ik / (L w)_i, N = sum_i c_i.
    log_likelihood_gap_bound : float
        ``N * kkt``: the optimum exceeds ``log_likelihood`` by at most this.
    n_iter : int
        Iterations (mix-SQP steps and mass moves, one pass over L each).
    converged : bool
        Whether ``kkt <= tol`` was reached.
    history : ndarray
        Log-likelihood before each iteration and at the end.
    """

    weights: np.ndarray
    log_likelihood: float
    kkt: float
    log_likelihood_gap_bound: float
    n_iter: int
    converged: bool
    history: np.ndarray

    def __post_init__(self):
        _freeze(self.weights, self.history)


def mixsqp(L, *, log=False, counts=None, start=None, tol=1e-8, max_iter=MAX_ITER):
    r"""Mixture weights maximizing sum_i c_i log sum_k w_k L_ik over the simplex.

    The Python counterpart of R's ``mixsqp(L)``, certified: it returns only when
    ``kkt <= tol`` (the log-likelihood is then within ``N * tol`` of the optimum),
    or warns and says by how much it may fall short.

    Parameters
    ----------
    L : array_like, shape (n, K)
        Likelihoods L_ik >= 0 (finite), each row with a positive entry; with
        ``log=True``, log-likelihoods (finite or -inf, each row with a finite
        entry), which avoids underflow. Not modified.
    log : bool
        Whether ``L`` holds log-likelihoods.
    counts : array_like, shape (n,), optional
        Multiplicities c_i > 0 (finite) of the rows; default 1.
    start : array_like, shape (K,), optional
        Starting weights >= 0 with a positive sum (normalized here), e.g. an
        earlier fit's. Default: uniform.
    tol : float
        Stop when ``kkt <= tol``, > 0.
    max_iter : int
        Largest number of iterations, >= 1 (a guard: the default is far above what
        any fit has needed).

    Returns
    -------
    MixSQPResult

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = np.concatenate([rng.normal(0, 1, 700), rng.normal(4, 1, 300)])
    >>> grid = np.linspace(-3, 7, 41)
    >>> fit = mixsqp(-0.5 * (x[:, None] - grid) ** 2, log=True)
    >>> fit.converged, fit.kkt <= 1e-8
    (True, True)
    >>> round(float(fit.weights[grid > 2].sum()), 1)  # share of the component at 4
    0.3
    """
    lik, shift = _likelihood_iv(L, log)
    n, k = lik.shape
    if counts is None:
        counts = np.ones(n)
    else:
        counts = check_finite_array(counts, "counts", ndim=1, min_len=0)
        if counts.shape != (n,) or not np.all(counts > 0):
            raise ValueError(f"counts must have shape ({n},) and entries > 0")
    if start is not None:
        start = check_finite_array(start, "start", ndim=1, min_len=0)
        if start.shape != (k,) or np.any(start < 0) or not start.sum() > 0:
            raise ValueError(f"start must have shape ({k},), entries >= 0 and a positive sum")
        start = start / start.sum()
    tol = check_positive_scalar(tol, "tol")
    max_iter = check_int_scalar(max_iter, "max_iter", minimum=1)
    weights, info = _mix_sqp(lik, counts, shift, tol, max_iter, start=start, warn=3,
                             name="mixsqp")
    history = np.asarray(info["history"], dtype=np.float64)
    return MixSQPResult(weights, float(history[-1]), info["kkt"],
                        info["log_likelihood_gap_bound"], info["n_iter"], info["converged"],
                        history)


def _likelihood_iv(L, log):
    """Row-normalized likelihoods (max 1 per row, C order, a new array) and the log shifts."""
    if not isinstance(log, bool | np.bool_):
        raise TypeError(f"log must be True or False, got {type(log).__name__}")
    if log:
        arr = as_real_array(L, "L")
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise ValueError(f"L must be a 2-d array with at least one row and column, "
                             f"got shape {arr.shape}")
        if np.any(np.isnan(arr) | (arr == np.inf)):
            raise ValueError("L (log-likelihoods) must be finite or -inf; it has NaN or +inf")
        shift = arr.max(axis=1)
        if not np.all(np.isfinite(shift)):
            row = int(np.flatnonzero(~np.isfinite(shift))[0])
            raise ValueError(f"row {row} of L is -inf everywhere: that observation has no "
                             "likelihood under any component")
        return np.exp(arr - shift[:, None]), shift
    arr = check_finite_array(L, "L", ndim=2)
    if arr.shape[1] < 1:
        raise ValueError(f"L must have at least one column, got shape {arr.shape}")
    if np.any(arr < 0):
        raise ValueError("L must hold likelihoods >= 0")
    top = arr.max(axis=1)
    if not np.all(top > 0):
        row = int(np.flatnonzero(~(top > 0))[0])
        raise ValueError(f"row {row} of L is 0 everywhere: that observation has no "
                         "likelihood under any component")
    return np.ascontiguousarray(arr / top[:, None]), np.log(top)


def _row_blocks(n):
    return max(1, min(ROW_BLOCKS, n))


@contextmanager
def _threads_for(work):
    """Run the Numba kernels inside on one thread when ``work`` < PARALLEL_MIN_WORK.

    The results do not change (the kernels sum in fixed blocks); only the
    launch cost does.
    """
    if work >= PARALLEL_MIN_WORK:
        yield
        return
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


# ------------------------------------------------------------------------ mix-SQP

def _mix_sqp(lik, counts, shift, tol, max_iter, *, start=None, active_set=True, warn=3,
             name="NPMLE"):
    """mix-SQP (Kim et al. 2020) on the relaxed problem; returns normalized weights.

    Minimizes phi(x) = -(1/N) sum_i c_i log (L x)_i + sum_k x_k over x >= 0,
    from ``start`` (weights summing to 1) or the uniform weights. With
    ``active_set``, the Hessian and the subproblem use only the columns with
    x_k > 0 or a negative gradient; ``active_set=False`` uses all K columns.
    ``warn``: the stack level of the warning when not converged (the public
    caller's caller), or None for no warning; ``name`` names the fit in it.
    """
    with _threads_for(lik.size):
        x, kkt, n_iter, history = _sqp_iterations(lik, counts, shift, tol, max_iter, start,
                                                  active_set)
    converged = kkt <= tol
    kkt = max(kkt, 0.0)
    gap_bound = float(counts.sum()) * kkt
    if warn is not None and not converged:
        reason = ("max_iter reached" if n_iter >= max_iter
                  else "no step gains at double precision")
        warnings.warn(f"{name} stopped after {n_iter} iterations ({reason}) with kkt={kkt:.3g} "
                      f"> tol={tol:g}: its log-likelihood may be up to {gap_bound:.3g} "
                      "nats below the optimum (N * kkt)", RuntimeWarning, stacklevel=warn)
    weights = x / x.sum()
    return weights, {"kkt": kkt, "log_likelihood_gap_bound": gap_bound, "n_iter": n_iter,
                     "converged": converged, "history": history}


def _sqp_iterations(lik, counts, shift, tol, max_iter, start, active_set):
    """The iterations of :func:`_mix_sqp`: returns x, its kkt, the iterations and the
    log-likelihood history."""
    total = float(counts.sum())
    const = float(counts @ shift)
    k = lik.shape[1]
    x = np.full(k, 1.0 / k) if start is None else start.astype(np.float64, copy=True)
    history = []
    kkt = math.inf
    n_iter = 0
    while True:
        grad_sum, ll, f = _gradient(lik, x, counts)
        if ll == -math.inf and start is not None and n_iter == 0:
            # The warm start leaves a row without mass (its likelihood underflows
            # at every atom): start again from the uniform weights.
            x, start = np.full(k, 1.0 / k), None
            continue
        mass = float(x.sum())
        # Log-likelihood and KKT residual of the normalized weights w = x / sum(x).
        ll_normalized = ll - total * math.log(mass)  # sum_i c_i log (f_i / mass)
        history.append(const + ll_normalized)
        kkt = mass * float(grad_sum.max()) / total - 1.0
        if kkt <= tol or n_iter >= max_iter:
            break
        n_iter += 1
        ratio = mass * grad_sum / total  # r_k of the normalized weights
        if kkt > RESCUE_KKT:
            x, f, moved = _vertex_steps(lik, x, f, counts, ratio, ll_normalized, RESCUE_KKT)
            if moved:
                continue
        grad = 1.0 - grad_sum / total
        if active_set:
            cols = _active_columns(x, grad)
            lik_active = _mixsqp_kernels._gather_columns(lik, cols)
        else:
            cols, lik_active = np.arange(k), lik
        hess = _hessian(lik_active, f, counts, total)
        x_active, grad_active = x[cols], grad[cols]
        y = _nonnegative_qp(hess, grad_active - hess @ x_active, x_active)
        step = y - x_active
        slope = float(grad_active @ step)
        alpha = 0.0
        if slope < 0.0:
            u = _mixsqp_kernels._matvec(lik_active, y)
            alpha = _line_search(f, u, counts, total, mass, float(step.sum()),
                                 -ll / total + mass, slope)
        if alpha == 0.0:
            # The quadratic model gave no step that raises the log-likelihood (it is
            # solved in floating point on a Hessian that can be numerically singular):
            # move mass to the most violating grid point instead, which always gains
            # while kkt > 0.
            x, f, moved = _vertex_steps(lik, x, f, counts, ratio, ll_normalized, 0.0, most=1)
            if not moved:
                break  # no further progress possible at double precision
            continue
        x = np.zeros(k)
        x[cols] = np.maximum(x_active + alpha * step, 0.0)
    return x, kkt, n_iter, history


def _gradient(lik, x, counts):
    """Full-grid gradient sum_i c_i L_ik / f_i, log-likelihood sum_i c_i log f_i and f = L x."""
    support = np.flatnonzero(x > 0)
    return _mixsqp_kernels._mixture_gradient(lik, x, support, counts, _row_blocks(lik.shape[0]))


def _active_columns(x, grad):
    """Columns of the subproblem: the support of x and some KKT violators (grad_k < 0).

    The violators taken are the ACTIVE_VIOLATORS most violating ones and those
    at a local minimum of grad along the column order (one per dip of a sorted
    grid, where neighbours violate together). Taking them all costs O(n K^2)
    per Hessian early on; taking one per dip costs extra passes over L. The
    most violating column always enters, so a fixed point has no violators (it
    is the grid optimum) whatever the order of the grid.
    """
    violators = np.flatnonzero(grad < 0)
    take = np.zeros(grad.size, bool)
    take[violators[np.argsort(grad[violators], kind="stable")[:ACTIVE_VIOLATORS]]] = True
    padded = np.concatenate([[np.inf], grad, [np.inf]])
    take |= (grad <= padded[:-2]) & (grad <= padded[2:]) & (grad < 0)
    return np.flatnonzero((x > 0) | take)


def _hessian(lik_active, f, counts, total):
    """H = (1/N) L_A' diag(c / f^2) L_A on the active columns A."""
    n = lik_active.shape[0]
    blocks = max(1, min(HESSIAN_BLOCKS, n))
    return _mixsqp_kernels._weighted_gram(lik_active, f, counts, blocks) / total


def _nonnegative_qp(hess, b, start, dual_tol=QP_DUAL_TOL):
    """argmin_{y >= 0} y'Hy/2 + b'y by the Lawson-Hanson active-set method.

    Warm-started with the free set {k : start_k > 0} when that has at most
    QP_WARM_MAX_FREE members (the NPMLE's support is small; from a dense start,
    such as the uniform weights, dropping hundreds of coordinates one solve at a
    time costs more than adding the few that are needed). Written out rather than
    calling :func:`scipy.optimize.nnls` because that routine fixes its own
    optimality tolerance relative to |H|, which stalls the outer iteration at
    kkt ~ 1e-8 for large n (H grows as the fitted density gets small somewhere).
    Here the dual H y + b is required to be >= -dual_tol, in the units of the
    outer gradient.
    """
    k = b.size
    # Jacobi scaling: the diagonal spans orders of magnitude (a column whose
    # likelihood is small everywhere has a large one), and a ridge relative to
    # the mean diagonal would bias the solve on the small entries. Diagonals
    # below 1e-12 of the largest (columns without likelihood) are floored there.
    diag = np.diag(hess)
    scale = 1.0 / np.sqrt(np.maximum(diag, max(1e-12 * float(diag.max()), 1e-300)))
    free = start > 0
    if free.sum() > QP_WARM_MAX_FREE:
        free[:] = False
    y = np.where(free, start, 0.0)  # feasible, positive on the free set
    for _ in range(3 * k + 10):
        # Solve on the free set; while that leaves y >= 0, step from y toward it
        # until a coordinate hits 0 and fix that coordinate at 0 (Lawson-Hanson).
        while free.any():
            idx = np.flatnonzero(free)
            d = scale[idx]
            sub = hess[np.ix_(idx, idx)] * d[:, None] * d[None, :] + 1e-12 * np.eye(idx.size)
            z = d * linalg.solve(sub, -b[idx] * d, assume_a="pos")
            if np.all(z > 0):
                y[:] = 0.0
                y[idx] = z
                break
            yi = y[idx]
            neg = z <= 0
            step = float(np.min(yi[neg] / (yi[neg] - z[neg])))
            yi = yi + step * (z - yi)
            hit = neg & (yi <= yi.max() * 1e-15)
            hit[np.flatnonzero(neg)[np.argmin(yi[neg])]] = True  # at least the blocking one
            y[idx] = np.where(hit, 0.0, yi)
            free[idx[hit]] = False
        dual = hess @ y + b
        dual[free] = np.inf
        j = int(np.argmin(dual))
        if dual[j] >= -dual_tol:
            return y
        free[j] = True
    warnings.warn("mix-SQP quadratic subproblem: active-set iteration limit reached",
                  RuntimeWarning, stacklevel=4)
    return y


def _line_search(f, u, counts, total, mass, step_sum, phi0, slope):
    """Largest alpha in 1, 1/2, ... with an Armijo decrease of phi along x + alpha (y - x).

    f = L x and u = L y on the rows, so f + alpha (u - f) is L at the trial point
    without reading L again. Returns 0.0 when no step above MIN_STEP decreases phi.
    """
    # Rounding error of phi: near the optimum the decrease a step brings is
    # ~|grad|^2, below what double precision resolves, so decreases smaller
    # than this count as ties and the Newton step is taken (it drives kkt down).
    noise = 16.0 * np.finfo(float).eps * (abs(phi0) + 2.0 * mass)
    blocks = _row_blocks(f.size)
    alpha = 1.0
    while alpha >= MIN_STEP:
        ll = _mixsqp_kernels._log_likelihood_along(f, u, alpha, counts, blocks)
        phi = -ll / total + mass + alpha * step_sum
        if phi <= phi0 + ARMIJO * alpha * slope + noise:  # False for ll = -inf
            return alpha
        alpha *= 0.5
    return 0.0


def _vertex_steps(lik, x, f, counts, ratio, before, threshold, most=ACTIVE_VIOLATORS):
    """Move mass to grid points with r_k - 1 > threshold, one at a time, each by an exact
    line search. Returns x, f = L x and whether the log-likelihood rose above ``before``
    (that of x / sum(x), without the row shifts); x and f unchanged when it did not.

    The points are the local maxima of r along the column order (one per dip of a
    sorted grid), most violating first, at most ``most``. Along x -> (1 - a) x + a e_k
    (mass kept) the log-likelihood is concave in a with slope N (r_k - 1) at a = 0, so
    the step to its maximizer gains whenever r_k > 1. This is what a Newton step cannot
    do after a step that left rows with almost no density: there the quadratic model
    of -log f holds only for changes of f of the size of f itself, so each iteration
    would at most double it (tens of iterations for a density of 1e-14).
    """
    padded = np.concatenate([[-np.inf], ratio, [-np.inf]])
    peaks = np.flatnonzero((ratio >= padded[:-2]) & (ratio >= padded[2:])
                           & (ratio - 1.0 > threshold))
    peaks = peaks[np.argsort(-ratio[peaks], kind="stable")[:most]]
    if peaks.size == 0:
        peaks = np.array([int(np.argmax(ratio))])
    mass = float(x.sum())
    x_new, f_new = x / mass, f / mass
    blocks = _row_blocks(f.size)
    for k in peaks:
        col = np.ascontiguousarray(lik[:, k])
        a = _vertex_share(f_new, col, counts, blocks)
        if a > 0.0:
            x_new *= 1.0 - a
            x_new[k] += a
            f_new = (1.0 - a) * f_new + a * col
    after = _mixsqp_kernels._log_likelihood_along(f_new, f_new, 0.0, counts, blocks)
    if not after > before:
        return x, f, False
    return x_new, f_new, True


def _vertex_share(f, col, counts, blocks):
    """argmax_{a in [0, 1]} sum_i c_i log((1 - a) f_i + a col_i): the root of its
    decreasing slope (Brent's method), 0 when the slope at 0 is not positive."""
    def slope(a):
        return max(_mixsqp_kernels._vertex_slope(f, col, a, counts, blocks), -1e300)

    if not slope(0.0) > 0.0:
        return 0.0
    if slope(1.0) >= 0.0:
        return 1.0
    # Brent's method falls back to bisection where the slope is -inf at a = 1, so it
    # ends within ~2100 halvings at worst; its result is only a step, not a certificate.
    return optimize.brentq(slope, 0.0, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps,
                           maxiter=4000, disp=False)
