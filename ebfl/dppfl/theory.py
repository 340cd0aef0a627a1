"""The convergence and sensitivity theory of DP-PFL, computed exactly on given instances.

DP-PFL (Hu et al., IEEE IoT J. 2020) solves the dual (5) of the multitask
problem by letting every device t minimize its local subproblem (7)::

    G_t^beta(Delta alpha_t) = sum_i l*(-alpha_t^i - Delta alpha_t^i) + w_t^T X_t Delta alpha_t
                              + beta / (4 lambda) ||X_t Delta alpha_t||^2_{Omega~_t},

with ||v||^2_{Omega~_t} = Omega_tt ||v||^2, and derives from it a convergence
rate (Lemma 1, Theorems 3 and 4) and the sensitivities that calibrate the
privacy noise (Corollaries 1-3). This module evaluates those statements on
concrete instances, with exact solutions of the subproblems, so that
``ebfl validate`` (rows ``dppfl_*``) can check them:

* :func:`local_objective`, :func:`solve_local_exactly` (the exact minimizer
  of (7), with a KKT certificate), :func:`local_solution_quality` (theta of
  Definition 1, eq. (8)) and :func:`solve_dual_exactly` (the minimizer of (5));
* :func:`lemma1_ratio`, :func:`lemma1_ratio_sup` and :func:`lemma1_gap`;
* :func:`local_strong_convexity` (Corollary 1), :func:`corollary2_difference`
  and :func:`corollary3_difference`;
* :func:`omega_objective`, :func:`omega_step_value` and
  :func:`random_feasible_omega` (the Omega-step (2)-(3));
* :func:`theorem3_iterations`, :func:`theorem3_rate`, :func:`theorem3_s`,
  :func:`theorem4_iterations`, :func:`exact_local_run` and :func:`linear_rate`.

Layout: a device's rows ``X_t`` (n_t, d) are the paper's columns x_t^i (the
paper writes X_t as d x n_t), so the paper's X_t Delta alpha_t is
``X_t.T @ dalpha_t`` here; all devices' rows are concatenated in ``X`` with
device t at ``offsets[t]:offsets[t + 1]``, and models are the rows of ``W``.

Errors of the paper found here (each function's notes give the details):

* Lemma 1 is false with (7) as printed (errata [DP-PFL 3]): (7) lacks
  MOCHA's constant ||X alpha||^2_{Omega~} / (4 lambda m) per device, and at
  Delta alpha = 0 the inequality fails by xi ||X alpha||^2_{Omega~} / (4 lambda).
* Corollary 1 is false (errata [DP-PFL 1]): the quadratic of (7) has rank
  <= d < n_t, so G is no more strongly convex than l* (not at all for the
  hinge loss), and the claimed modulus beta n_t / (2 lambda) lacks Omega_tt.
* Corollary 2 fails for small lambda (errata [DP-PFL 2]): replacing one sample
  can move its own dual coordinate from 0 to 1 (hinge) while the bound
  (8 lambda + beta) / (beta n_t) is about 1 / n_t.
* Theorem 4's statement and proof disagree in their constants (errata
  [DP-PFL 8]; the statement's counts come out the larger, so the proof still
  implies it), and in both the log term of k_0 is multiplied by the rate
  constant (1 - xi)(1 - Theta) where the recursion (15) needs its inverse.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit

from ebfl._config import CACHE
from ebfl._validation import (
    as_generator,
    check_choice,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
)
from ebfl.dppfl import _kernels
from ebfl.dppfl._checks import (
    MAX_DEVICES,
    check_devices,
    check_offsets,
    check_omega,
    check_vector,
    refuse_overflow,
)
from ebfl.dppfl.objective import (
    LOSSES,
    conjugate,
    device_sums,
    dual_objective,
    duality_gap,
    omega_step,
    primal_dual_map,
    primal_objective,
    regularizer,
)

__all__ = ["Corollary2Result", "DualSolution", "ExactRun", "LinearRate", "LocalSolution",
           "OmegaStepValue", "Theorem4Iterations", "corollary2_difference",
           "corollary3_difference", "exact_local_run", "lemma1_gap", "lemma1_ratio",
           "lemma1_ratio_sup", "linear_rate", "local_objective", "local_solution_quality",
           "local_strong_convexity", "omega_objective", "omega_step_value",
           "random_feasible_omega", "solve_dual_exactly", "solve_local_exactly",
           "theorem3_iterations", "theorem3_rate", "theorem3_s", "theorem4_iterations"]

_LOSS_CODES = {"hinge": _kernels.HINGE, "smoothed_hinge": _kernels.SMOOTHED_HINGE,
               "squared": _kernels.SQUARED}
#: Rows may exceed norm 1 by this much (rounding of an l2-normalization).
_NORM_SLACK = 1e-9
#: A dual variable may leave the box y alpha in [0, 1] by this much (rounding).
_BOX_SLACK = 1e-12
#: |gradient| above which a coordinate at a bound is pinned there in every minimizer.
_PIN_GRADIENT = 1e-7


# ------------------------------------------------------------------ input checks

def _rows(X, name, *, unit=False):
    X = check_finite_array(X, name, ndim=2, min_len=1)
    if unit:
        norms = np.sqrt(np.einsum("ij,ij->i", X, X))
        if norms.max() > 1.0 + _NORM_SLACK:
            raise ValueError(f"{name} must have rows of l2 norm <= 1 (the paper's assumption), "
                             f"got a row of norm {norms.max():.6g}")
    return np.ascontiguousarray(X)


def _labels(y, name, n):
    y = check_finite_array(y, name, ndim=1, min_len=0)
    if y.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one label per row), got {y.shape}")
    if not np.all(np.abs(y) == 1.0):
        raise ValueError(f"{name} must hold labels in {{-1, +1}}")
    return y


def _feasible_duals(alpha, y, loss, name):
    """For the hinges, y alpha must lie in [0, 1] (the domain of l*)."""
    if loss != "squared":
        ya = y * alpha
        if ya.size and (ya.min() < -_BOX_SLACK or ya.max() > 1.0 + _BOX_SLACK):
            raise ValueError(f"{name} must satisfy y * {name} in [0, 1] for the {loss} loss "
                             f"(the domain of its conjugate), got values in "
                             f"[{ya.min():.6g}, {ya.max():.6g}]")


def _loss_args(loss, gamma):
    loss = check_choice(loss, "loss", LOSSES)
    return loss, check_positive_scalar(gamma, "gamma")


def _local_args(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma):
    X_t = _rows(X_t, "X_t")
    n_t, d = X_t.shape
    y_t = _labels(y_t, "y_t", n_t)
    alpha_t = check_vector(alpha_t, "alpha_t", n_t, "one dual variable per row of X_t")
    w_t = check_vector(w_t, "w_t", d, "one weight per column of X_t")
    omega_tt = check_nonnegative_scalar(omega_tt, "omega_tt")
    lam = check_positive_scalar(lam, "lam")
    beta = check_positive_scalar(beta, "beta")
    loss, gamma = _loss_args(loss, gamma)
    _feasible_duals(alpha_t, y_t, loss, "alpha_t")
    refuse_overflow(beta * (omega_tt / (2.0 * lam)), "the curvature beta omega_tt / (2 lam)",
                    ("beta", "omega_tt", "lam"))
    return X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma


_offsets, _omega = check_offsets, check_omega  # integers 0..n; symmetric PSD (m, m)
#: Largest number of sweeps of an exact solve, and of iterations of exact_local_run.
MAX_SWEEPS, MAX_EXACT_ITERATIONS = 10**7, 10**6


def _global_args(X, y, offsets, omega, *, unit=False):
    X = _rows(X, "X", unit=unit)
    y = _labels(y, "y", X.shape[0])
    offsets = _offsets(offsets, X.shape[0])
    omega = _omega(omega, offsets.size - 1)
    return X, y, offsets, omega


# ------------------------------------------------------------------ kernels

@njit(cache=CACHE)
def _local_sweeps(X, y, sqnorm, alpha, a, w, c, loss, gamma, step_tol, max_sweeps):
    """Cyclic exact coordinate minimization of (7) in a = alpha + Delta alpha, in place.

    Stops after a sweep whose largest step is <= ``step_tol`` or after
    ``max_sweeps``; returns the number of sweeps.
    """
    n, d = X.shape
    v = np.zeros(d)
    for i in range(n):
        diff = a[i] - alpha[i]
        for k in range(d):
            v[k] += diff * X[i, k]
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        largest = 0.0
        for i in range(n):
            z = 0.0
            for k in range(d):
                z += X[i, k] * (w[k] + c * v[k])
            new = _kernels.coordinate_update(loss, gamma, y[i], a[i], z, c * sqnorm[i])
            delta = new - a[i]
            if delta != 0.0:
                a[i] = new
                for k in range(d):
                    v[k] += delta * X[i, k]
                largest = max(largest, abs(delta))
        if largest <= step_tol:
            break
    return sweeps


@njit(cache=CACHE)
def _dual_sweeps(X, y, sqnorm, offsets, omega, lam, a, loss, gamma, step_tol, max_sweeps):
    """Cyclic exact coordinate minimization of the dual (5), in place; returns the sweeps.

    Along alpha_i of device t, D has slope l*'(-a) + x_i^T w_t(alpha) and
    curvature Omega_tt ||x_i||^2 / (2 lambda): the step of (7) with c = Omega_tt / (2 lambda).
    """
    m = offsets.size - 1
    d = X.shape[1]
    S = np.zeros((m, d))
    for t in range(m):
        for i in range(offsets[t], offsets[t + 1]):
            for k in range(d):
                S[t, k] += a[i] * X[i, k]
    w = np.empty(d)
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        largest = 0.0
        for t in range(m):
            for k in range(d):
                w[k] = 0.0
                for s in range(m):
                    w[k] += omega[t, s] * S[s, k] / (2.0 * lam)
            scale = omega[t, t] / (2.0 * lam)
            for i in range(offsets[t], offsets[t + 1]):
                z = 0.0
                for k in range(d):
                    z += X[i, k] * w[k]
                new = _kernels.coordinate_update(loss, gamma, y[i], a[i], z, scale * sqnorm[i])
                delta = new - a[i]
                if delta != 0.0:
                    a[i] = new
                    for k in range(d):
                        S[t, k] += delta * X[i, k]
                        w[k] += scale * delta * X[i, k]
                    largest = max(largest, abs(delta))
        if largest <= step_tol:
            break
    return sweeps


def _conjugate_slope(a, y, loss, gamma):
    """d/da of l*(-a) (the gradient of the conjugate part of (5) and (7))."""
    if loss == "hinge":
        return -y
    if loss == "smoothed_hinge":
        return -y + gamma * a
    return -y + a


def _kkt_residual(a, y, grad, loss):
    """Largest violation of the optimality conditions of a box-constrained minimization.

    For the hinges the variable is s = y a in [0, 1] with slope y grad; the
    residual is |s - clip(s - slope, 0, 1)|, zero exactly at a minimizer. The
    squared loss is unconstrained: the residual is |grad|.
    """
    if a.size == 0:
        return 0.0
    if loss == "squared":
        return float(np.max(np.abs(grad)))
    s = y * a
    return float(np.max(np.abs(s - np.clip(s - y * grad, 0.0, 1.0))))


# ------------------------------------------------------------------ the local subproblem (7)

def _local_value(dalpha, X_t, y_t, alpha_t, w_t, c, loss, gamma):
    v = X_t.T @ dalpha
    return float(conjugate(alpha_t + dalpha, y_t, loss, gamma).sum() + w_t @ v
                 + 0.5 * c * (v @ v))


def local_objective(dalpha_t, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss="hinge",
                    gamma=1.0):
    """G_t^beta of the local subproblem (7) of DP-PFL (Hu et al., IEEE IoT J. 2020).

    G = sum_i l*(-alpha_t^i - Delta alpha_t^i) + w_t^T X_t Delta alpha_t
    + beta Omega_tt ||X_t Delta alpha_t||^2 / (4 lambda), as printed (without
    the constant of MOCHA's subproblem; see :func:`lemma1_gap`).

    Parameters
    ----------
    dalpha_t : array_like, shape (n_t,)
        The update Delta alpha_t.
    X_t : array_like, shape (n_t, d)
        The device's rows (the paper's columns x_t^i).
    y_t : array_like, shape (n_t,)
        Labels in {-1, +1}.
    alpha_t : array_like, shape (n_t,)
        The device's dual variables; for the hinges y alpha in [0, 1].
    w_t : array_like, shape (d,)
        The device's model w_t(alpha) of eq. (6).
    omega_tt : float
        Omega_tt >= 0.
    lam, beta : float
        lambda > 0 and the correction parameter beta > 0.
    loss : {"hinge", "smoothed_hinge", "squared"}
    gamma : float
        Smoothing of the smoothed hinge, > 0.

    Returns
    -------
    float
        +inf when alpha_t + Delta alpha_t leaves the domain of l* (y a in [0, 1]
        for the hinges).

    Examples
    --------
    >>> X_t, y_t = [[1.0, 0.0], [0.0, 1.0]], [1.0, -1.0]
    >>> local_objective([0.5, -0.5], X_t, y_t, [0.0, 0.0], [0.0, 0.0], 1.0, 1.0, 2.0)
    -0.75
    """
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma = _local_args(
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma)
    dalpha = check_vector(dalpha_t, "dalpha_t", X_t.shape[0], "one entry per row of X_t")
    return _local_value(dalpha, X_t, y_t, alpha_t, w_t, beta * omega_tt / (2.0 * lam), loss,
                        gamma)


@dataclass(frozen=True)
class LocalSolution:
    """An exact minimizer of the local subproblem (7).

    Attributes
    ----------
    dalpha : ndarray (n_t,)
        A minimizer Delta alpha_t*.
    objective : float
        G_t^beta(Delta alpha_t*).
    kkt_residual : float
        Largest violation of the optimality conditions (0 at a minimizer).
    converged : bool
        ``kkt_residual <= tol``.
    sweeps : int
        Coordinate-descent sweeps used.
    determined : ndarray of bool (n_t,)
        Coordinates that take this value in *every* minimizer. For the smoothed
        hinge and the squared loss the minimizer is unique (all True); for the
        hinge (7) need not be strictly convex, and a coordinate is determined
        when its slope pins it to a bound (X_t Delta alpha_t, hence every slope,
        is the same in all minimizers) or when no direction that keeps
        X_t Delta alpha_t and the objective unchanged moves it.
    """

    dalpha: np.ndarray
    objective: float
    kkt_residual: float
    converged: bool
    sweeps: int
    determined: np.ndarray


def _box_qp(H, p, lo, hi, s, tol, max_iter):
    """min p^T s + s^T H s / 2 over lo <= s <= hi, H positive semidefinite: a primal active set.

    The textbook active-set method for convex QPs (Nocedal and Wright, 2006,
    Algorithm 16.3) specialized to bounds, written out because scipy has no
    exact QP solver: the working set holds coordinates fixed at a bound; on
    the others the step goes to the minimizer of the quadratic, or, where H
    is singular and the gradient has a component in its null space, along
    that descent ray to the first bound (the hinge's (7) has rank <= d).
    Finite for nondegenerate problems; ``max_iter`` guards against cycling
    (the caller checks the KKT residual either way). Returns the new s.
    """
    n = p.size
    s = np.clip(s, lo, hi)
    working = (s <= lo) | (s >= hi)
    for _ in range(max_iter):
        g = p + H @ s
        free = ~working
        d = np.zeros(n)
        ray = False
        if np.any(free):
            evals, Q = np.linalg.eigh(H[np.ix_(free, free)])
            null = evals <= 1e-11 * max(float(np.abs(evals).max()), 1.0)
            coef = Q.T @ g[free]
            if np.any(null) and np.linalg.norm(coef[null]) > 1e-14 * (1.0 + np.abs(g).max()):
                d[free] = -(Q[:, null] @ coef[null])
                ray = True
            else:
                d[free] = -(Q[:, ~null] @ (coef[~null] / evals[~null]))
        if not ray and not np.any(np.abs(d) > 1e-15 * (1.0 + np.abs(s).max())):
            # at the minimizer on the working face: release the worst wrong-signed bound
            wrong = np.where(working & (s <= lo), np.maximum(-g, 0.0),
                             np.where(working & (s >= hi), np.maximum(g, 0.0), 0.0))
            i = int(np.argmax(wrong))
            if wrong[i] <= 0.01 * tol:
                break
            working[i] = False
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            to_bound = np.where(d < 0.0, (lo - s) / d, np.where(d > 0.0, (hi - s) / d, np.inf))
        to_bound[working] = np.inf
        j = int(np.argmin(to_bound))
        step = to_bound[j]
        if not ray and step >= 1.0:
            s = np.clip(s + d, lo, hi)
        elif np.isfinite(step):
            s = np.clip(s + step * d, lo, hi)
            s[j] = lo[j] if d[j] < 0.0 else hi[j]
            working[j] = True
        else:  # an unbounded descent ray: the problem has no minimizer (not for (5), (7))
            break
    return s


def _local_qp(X_t, y_t, alpha_t, w_t, c, loss, gamma):
    """(7) in s = y (alpha + Delta alpha): H, p and the bounds of p^T s + s^T H s / 2.

    l*(-a) is -s + kappa s^2 / 2 (kappa = 0, gamma, 1 for the hinge, the smoothed
    hinge and the squared loss) and X_t Delta alpha_t = Z^T s - X_t^T alpha_t with
    Z = y * X_t.
    """
    Z = X_t * y_t[:, None]
    kappa = {"hinge": 0.0, "smoothed_hinge": gamma, "squared": 1.0}[loss]
    with np.errstate(over="ignore", invalid="ignore"):
        H = c * (Z @ Z.T) + kappa * np.eye(y_t.size)
    refuse_overflow(H, "the Hessian of (7)", ("beta", "omega_tt", "lam"))
    p = -1.0 + Z @ (w_t - c * (X_t.T @ alpha_t))
    box = (0.0, 1.0) if loss != "squared" else (-np.inf, np.inf)
    return H, p, np.full(y_t.size, box[0]), np.full(y_t.size, box[1])


def _determined(X_t, y_t, s, slope, p):
    """Coordinates of s (= y a) that are the same in every minimizer of the hinge's (7).

    X_t Delta alpha_t is the same in all minimizers (the quadratic is strictly
    convex in it), hence so are the slopes and p^T s. A coordinate at a bound
    with a nonzero slope is pinned there; the others can move only along
    null vectors of [X_free^T diag(y); p_free^T], so a coordinate on which
    every such null vector vanishes is determined too.
    """
    pinned = ((s <= 0.0) & (slope > _PIN_GRADIENT)) | ((s >= 1.0) & (slope < -_PIN_GRADIENT))
    free = ~pinned
    if not np.any(free):
        return pinned
    M = np.vstack([(X_t[free] * y_t[free, None]).T, p[free][None, :]])
    _, sing, vt = np.linalg.svd(M)
    rank = int(np.sum(sing > 1e-10 * max(sing.max(initial=0.0), 1.0)))
    null = vt[rank:]  # rows: an orthonormal basis of the null space
    determined = pinned.copy()
    determined[free] = np.all(np.abs(null) <= 1e-9, axis=0) if null.size else True
    return determined


#: Coordinate-descent sweeps that warm-start the active-set method.
_WARM_SWEEPS = 300
#: Rounds that do not lower the KKT residual before a solve gives up: tol lies below
#: what rounding allows at this scale (e.g. lambda = 1e-200), and more rounds repeat them.
_STALLS = 3


def _solve_local(X_t, y_t, alpha_t, w_t, c, loss, gamma, tol, max_sweeps):
    """Exact minimizer of (7) with curvature c = beta Omega_tt / (2 lambda) (validated inputs)."""
    sqnorm = np.einsum("ij,ij->i", X_t, X_t)
    a = alpha_t.copy()
    code = _LOSS_CODES[loss]
    H, p, lo, hi = _local_qp(X_t, y_t, alpha_t, w_t, c, loss, gamma)
    sweeps, residual, best, stalls = 0, math.inf, math.inf, 0
    while sweeps < max_sweeps and stalls < _STALLS:
        # coordinate descent gets close, the active-set method finishes; KKT decides
        sweeps += _local_sweeps(X_t, y_t, sqnorm, alpha_t, a, w_t, c, code, gamma, 0.01 * tol,
                                min(_WARM_SWEEPS if sweeps == 0 else 5000, max_sweeps - sweeps))
        candidate = y_t * _box_qp(H, p, lo, hi, y_t * a, tol, 20 * a.size + 100)
        dalpha = candidate - alpha_t
        grad = _conjugate_slope(candidate, y_t, loss, gamma) + X_t @ (w_t + c * (X_t.T @ dalpha))
        residual = _kkt_residual(candidate, y_t, grad, loss)
        if residual <= tol:
            a = candidate
            break
        stalls, best = (stalls + 1 if residual >= best else 0), min(best, residual)
    dalpha = a - alpha_t
    grad = _conjugate_slope(a, y_t, loss, gamma) + X_t @ (w_t + c * (X_t.T @ dalpha))
    residual = _kkt_residual(a, y_t, grad, loss)
    converged = residual <= tol
    if not converged:
        warnings.warn(f"the local subproblem (7) was not solved to tol={tol:g} in {sweeps} "
                      f"sweeps (KKT residual {residual:.3g})", RuntimeWarning, stacklevel=3)
    determined = np.ones(a.size, dtype=bool)
    if loss == "hinge":
        determined = _determined(X_t, y_t, y_t * a, y_t * grad, p)
    return LocalSolution(dalpha, _local_value(dalpha, X_t, y_t, alpha_t, w_t, c, loss, gamma),
                         residual, bool(converged), int(sweeps), determined)


def solve_local_exactly(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss="hinge", gamma=1.0,
                        *, tol=1e-10, max_sweeps=200_000):
    """The exact minimizer of the local subproblem (7) of DP-PFL (Hu et al., IEEE IoT J. 2020).

    (7) is a convex quadratic program, box-constrained (y a in [0, 1]) for the
    hinges and unconstrained for the squared loss; for the hinge its Hessian
    has rank <= d, so it need not have a unique minimizer. Cyclic exact
    coordinate minimization (the SDCA step, taken in turn over every
    coordinate) gets close, and a primal active-set method for bound
    constraints finishes exactly (it handles the singular Hessian by moving
    along zero-curvature descent rays to a bound); optimality is certified
    by the KKT residual.

    Parameters
    ----------
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma
        As in :func:`local_objective`.
    tol : float
        Largest accepted KKT residual, > 0.
    max_sweeps : int
        Sweeps allowed, in [1, 10**7]; a RuntimeWarning is issued (and ``converged``
        is False) when the residual is still above ``tol``.

    Returns
    -------
    LocalSolution

    Examples
    --------
    >>> sol = solve_local_exactly([[1.0, 0.0], [0.0, 1.0]], [1.0, -1.0], [0.0, 0.0],
    ...                           [0.0, 0.0], 1.0, 1.0, 2.0)
    >>> sol.dalpha.tolist(), sol.converged
    ([1.0, -1.0], True)
    """
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma = _local_args(
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma)
    tol = check_positive_scalar(tol, "tol")
    max_sweeps = check_int_scalar(max_sweeps, "max_sweeps", minimum=1, maximum=MAX_SWEEPS)
    return _solve_local(X_t, y_t, alpha_t, w_t, beta * omega_tt / (2.0 * lam), loss, gamma,
                        tol, max_sweeps)


def local_solution_quality(dalpha_t, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta,
                           loss="hinge", gamma=1.0, *, tol=1e-10):
    """theta of Definition 1, equation (8): how far an approximate local solution is from exact.

    theta = (G(Delta alpha_t) - G(Delta alpha_t*)) / (G(0) - G(Delta alpha_t*)),
    0 for an exact solution and 1 for no progress (0 when G(0) is already
    the minimum).

    Parameters
    ----------
    dalpha_t : array_like, shape (n_t,)
        The approximate solution, e.g. a few SDCA steps.
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma
        As in :func:`local_objective`.
    tol : float
        KKT tolerance of the exact solve.

    Returns
    -------
    float
        In [0, 1] up to rounding for any update that does not increase G.

    Examples
    --------
    >>> args = ([[1.0, 0.0], [0.0, 1.0]], [1.0, -1.0], [0.0, 0.0], [0.0, 0.0], 1.0, 1.0, 2.0)
    >>> local_solution_quality([0.0, 0.0], *args), local_solution_quality([1.0, -1.0], *args)
    (1.0, 0.0)
    """
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma = _local_args(
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma)
    dalpha = check_vector(dalpha_t, "dalpha_t", X_t.shape[0], "one entry per row of X_t")
    tol = check_positive_scalar(tol, "tol")
    c = beta * omega_tt / (2.0 * lam)
    best = _solve_local(X_t, y_t, alpha_t, w_t, c, loss, gamma, tol, 200_000).objective
    start = _local_value(np.zeros_like(dalpha), X_t, y_t, alpha_t, w_t, c, loss, gamma)
    if not start - best > 0.0:
        return 0.0
    return float((_local_value(dalpha, X_t, y_t, alpha_t, w_t, c, loss, gamma) - best)
                 / (start - best))


def local_strong_convexity(X_t, omega_tt, lam, beta, loss="hinge", gamma=1.0):
    """The strong-convexity modulus of (7) beside the one Corollary 1 claims.

    The Hessian of G_t^beta in Delta alpha_t is diag(l*'') + (beta Omega_tt /
    (2 lambda)) X_t^T X_t (in the paper's layout); l*'' is 0 for the hinge,
    gamma for the smoothed hinge and 1 for the squared loss. Its smallest
    eigenvalue is the modulus. Corollary 1 of DP-PFL (Hu et al., IEEE IoT J.
    2020) claims beta n_t / (2 lambda). That is wrong: the Gram matrix of n_t
    rows in R^d has rank <= d, so for n_t > d the quadratic adds nothing to
    the modulus (the hinge's G is then not strongly convex at all), and even
    for n_t <= d its smallest eigenvalue is at most 1 (rows of norm <= 1),
    not n_t; the claim also lacks the factor Omega_tt.

    Parameters
    ----------
    X_t : array_like, shape (n_t, d)
    omega_tt, lam, beta, loss, gamma
        As in :func:`local_objective`.

    Returns
    -------
    tuple of float
        ``(modulus, claimed)``.

    Examples
    --------
    >>> X_t = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]
    >>> modulus, claimed = local_strong_convexity(X_t, 0.5, 0.1, 2.0)
    >>> round(modulus, 12), claimed
    (0.0, 30.0)
    """
    X_t = _rows(X_t, "X_t")
    omega_tt = check_nonnegative_scalar(omega_tt, "omega_tt")
    lam = check_positive_scalar(lam, "lam")
    beta = check_positive_scalar(beta, "beta")
    loss, gamma = _loss_args(loss, gamma)
    curvature = {"hinge": 0.0, "smoothed_hinge": gamma, "squared": 1.0}[loss]
    smallest = float(np.linalg.eigvalsh(X_t @ X_t.T)[0])
    out = (curvature + beta * (omega_tt / (2.0 * lam)) * max(smallest, 0.0),
           beta * (X_t.shape[0] / (2.0 * lam)))
    return refuse_overflow(out, "the modulus", ("beta", "omega_tt", "lam"))


# ------------------------------------------------------------------ the dual (5)

@dataclass(frozen=True)
class DualSolution:
    """A minimizer of the dual (5) for a fixed Omega.

    Attributes
    ----------
    alpha : ndarray (n,)
    objective : float
        D(alpha*) (= -P(W*, Omega) by strong duality).
    gap : float
        The duality gap P(W(alpha*), Omega) + D(alpha*), an independent
        certificate of optimality (>= D(alpha*) - min D).
    kkt_residual : float
    converged : bool
    sweeps : int
    """

    alpha: np.ndarray
    objective: float
    gap: float
    kkt_residual: float
    converged: bool
    sweeps: int


def solve_dual_exactly(X, y, offsets, omega, lam, loss="hinge", gamma=1.0, *, tol=1e-10,
                       max_sweeps=200_000):
    """The minimizer of the dual (5) of DP-PFL (Hu et al., IEEE IoT J. 2020) for a fixed Omega.

    Cyclic exact coordinate minimization over all dual variables (the
    centralized method the distributed algorithm approximates), finished by
    the active-set method of :func:`solve_local_exactly`, until the KKT
    residual is below ``tol``. Meant for small instances: the active set
    works with the dense n x n Hessian.

    Parameters
    ----------
    X : array_like, shape (n, d)
        All devices' rows, device t at ``offsets[t]:offsets[t + 1]``.
    y : array_like, shape (n,)
        Labels in {-1, +1}.
    offsets : array_like of int, shape (m + 1,)
    omega : array_like, shape (m, m)
        Symmetric positive semidefinite.
    lam, loss, gamma
        As in :func:`local_objective`.
    tol : float
        Largest accepted KKT residual, > 0.
    max_sweeps : int
        In [1, 10**7]; a RuntimeWarning is issued when they do not suffice.

    Returns
    -------
    DualSolution

    Examples
    --------
    >>> X = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]
    >>> sol = solve_dual_exactly(X, [1.0, -1.0, 1.0], [0, 2, 3], [[0.5, 0.2], [0.2, 0.5]],
    ...                          0.1, "smoothed_hinge")
    >>> sol.converged, bool(sol.gap < 1e-8)
    (True, True)
    """
    X, y, offsets, omega = _global_args(X, y, offsets, omega)
    lam = check_positive_scalar(lam, "lam")
    loss, gamma = _loss_args(loss, gamma)
    tol = check_positive_scalar(tol, "tol")
    max_sweeps = check_int_scalar(max_sweeps, "max_sweeps", minimum=1, maximum=MAX_SWEEPS)
    sqnorm = np.einsum("ij,ij->i", X, X)
    rows = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    # (5) in s = y alpha: H = kappa I + (Omega_{t(i) t(j)} y_i y_j x_i^T x_j) / (2 lambda), p = -1
    Z = X * y[:, None]
    kappa = {"hinge": 0.0, "smoothed_hinge": gamma, "squared": 1.0}[loss]
    with np.errstate(over="ignore", invalid="ignore"):
        H = omega[np.ix_(rows, rows)] * (Z @ Z.T) / (2.0 * lam) + kappa * np.eye(y.size)
    refuse_overflow(H, "the Hessian of (5)", ("X", "omega", "lam"))
    box = (0.0, 1.0) if loss != "squared" else (-np.inf, np.inf)
    lo, hi = np.full(y.size, box[0]), np.full(y.size, box[1])

    def kkt(a):
        W = omega @ device_sums(X, a, offsets) / (2.0 * lam)
        grad = _conjugate_slope(a, y, loss, gamma) + np.einsum("ij,ij->i", X, W[rows])
        return _kkt_residual(a, y, grad, loss)

    a = np.zeros(X.shape[0])
    sweeps, residual, best, stalls = 0, math.inf, math.inf, 0
    while sweeps < max_sweeps and stalls < _STALLS:
        # coordinate descent gets close, the active-set method finishes; KKT decides
        sweeps += _dual_sweeps(X, y, sqnorm, offsets, omega, lam, a, _LOSS_CODES[loss], gamma,
                               0.01 * tol, min(_WARM_SWEEPS if sweeps == 0 else 5000,
                                               max_sweeps - sweeps))
        candidate = y * _box_qp(H, -np.ones(y.size), lo, hi, y * a, tol, 20 * a.size + 100)
        residual = kkt(candidate)
        if residual <= tol:
            a = candidate
            break
        stalls, best = (stalls + 1 if residual >= best else 0), min(best, residual)
        residual = kkt(a)
        if residual <= tol:
            break
    if residual > tol:
        warnings.warn(f"the dual (5) was not solved to tol={tol:g} in {sweeps} sweeps (KKT "
                      f"residual {residual:.3g})", RuntimeWarning, stacklevel=2)
    return DualSolution(a, dual_objective(X, y, offsets, a, omega, lam, loss, gamma),
                        duality_gap(X, y, offsets, a, omega, lam, loss, gamma), residual,
                        bool(residual <= tol), int(sweeps))


# ------------------------------------------------------------------ Lemma 1

def _lemma1_terms(X, offsets, omega, dalpha):
    S = device_sums(X, dalpha, offsets)
    return float(np.sum(omega * (S @ S.T))), float(np.sum(np.diag(omega) * np.sum(S**2, axis=1)))


def lemma1_ratio(X, offsets, omega, dalpha):
    """||X Delta alpha||^2_{Omega~} / sum_t ||X_t Delta alpha_t||^2_{Omega~_t}, the ratio of (9).

    Lemma 1 of DP-PFL (Hu et al., IEEE IoT J. 2020) needs beta >= xi times
    its maximum over Delta alpha; the paper's beta = xi m suffices because the
    ratio never exceeds m (:func:`lemma1_ratio_sup`).

    Parameters
    ----------
    X : array_like, shape (n, d)
    offsets : array_like of int, shape (m + 1,)
    omega : array_like, shape (m, m)
        Symmetric positive semidefinite.
    dalpha : array_like, shape (n,)
        With sum_t Omega_tt ||X_t Delta alpha_t||^2 > 0.

    Returns
    -------
    float

    Examples
    --------
    >>> X = [[1.0, 0.0], [1.0, 0.0]]
    >>> lemma1_ratio(X, [0, 1, 2], [[0.5, 0.5], [0.5, 0.5]], [1.0, 1.0])
    2.0
    """
    X = _rows(X, "X")
    offsets = _offsets(offsets, X.shape[0])
    omega = _omega(omega, offsets.size - 1)
    dalpha = check_vector(dalpha, "dalpha", X.shape[0], "one entry per row of X")
    full, blocks = _lemma1_terms(X, offsets, omega, dalpha)
    if not blocks > 0.0:
        raise ValueError("dalpha must have sum_t Omega_tt ||X_t dalpha_t||^2 > 0 (the ratio of "
                         "(9) is 0/0 otherwise)")
    return full / blocks


def lemma1_ratio_sup(omega):
    """The supremum of the ratio (9) over all per-device vectors X_t Delta alpha_t in R^d.

    It is the largest eigenvalue of D^{-1/2} Omega D^{-1/2}, D = diag(Omega)
    (devices with Omega_tt = 0 contribute nothing and are left out), and is
    at most m for every positive semidefinite Omega (Cauchy-Schwarz), so
    beta = xi m satisfies (9) of DP-PFL (Hu et al., IEEE IoT J. 2020).

    Parameters
    ----------
    omega : array_like, shape (m, m)
        Symmetric positive semidefinite.

    Returns
    -------
    float

    Examples
    --------
    >>> round(lemma1_ratio_sup([[0.5, 0.5], [0.5, 0.5]]), 12)
    2.0
    """
    omega = check_finite_array(omega, "omega", ndim=2)
    omega = _omega(omega, omega.shape[0])
    diag = np.diag(omega)
    keep = diag > 0.0
    if not np.any(keep):
        raise ValueError("omega must have a positive diagonal entry")
    scale = 1.0 / np.sqrt(diag[keep])
    return float(np.linalg.eigvalsh(omega[np.ix_(keep, keep)] * np.outer(scale, scale))[-1])


def lemma1_gap(X, y, offsets, alpha, dalpha, omega, lam, xi, loss="hinge", gamma=1.0, *,
               beta=None, form="printed"):
    """(1 - xi) D(alpha) + xi sum_t G_t^beta(Delta alpha_t) - D(alpha + xi Delta alpha).

    Lemma 1 of DP-PFL (Hu et al., IEEE IoT J. 2020) claims this is >= 0 when
    beta satisfies (9) (e.g. beta = xi m). With the subproblem (7) as printed
    (``form="printed"``) it is false: (7) omits the constant
    ||X alpha||^2_{Omega~} / (4 lambda m) that MOCHA's subproblem (Smith et
    al., 2017) carries on every device, and the gap is then short by xi
    ||X alpha||^2_{Omega~} / (4 lambda); at Delta alpha = 0 it equals
    -xi ||X alpha||^2_{Omega~} / (4 lambda) < 0. With the constant
    (``form="mocha"``) the lemma holds. The constant does not change the
    minimizer of (7), so Algorithm 1 is unaffected.

    Parameters
    ----------
    X, y, offsets, omega
        As in :func:`solve_dual_exactly`.
    alpha, dalpha : array_like, shape (n,)
        alpha and alpha + Delta alpha in the domain of l* (y a in [0, 1] for
        the hinges); ``alpha + xi * dalpha`` then is too.
    lam : float
    xi : float
        The aggregation parameter in (0, 1].
    loss, gamma
        As in :func:`local_objective`.
    beta : float, optional
        Default xi m (the paper's choice).
    form : {"printed", "mocha"}
        G_t^beta as printed in (7), or with MOCHA's constant.

    Returns
    -------
    float

    Examples
    --------
    >>> X, y, offsets = [[1.0, 0.0], [0.0, 1.0]], [1.0, 1.0], [0, 1, 2]
    >>> omega, alpha = [[0.5, 0.0], [0.0, 0.5]], [1.0, 1.0]
    >>> lemma1_gap(X, y, offsets, alpha, [0.0, 0.0], omega, 0.25, 0.5)  # -xi ||X a||^2/(4 lam)
    -0.5
    >>> lemma1_gap(X, y, offsets, alpha, [0.0, 0.0], omega, 0.25, 0.5, form="mocha")
    0.0
    """
    X, y, offsets, omega = _global_args(X, y, offsets, omega)
    n, m = X.shape[0], offsets.size - 1
    alpha = check_vector(alpha, "alpha", n, "one dual variable per row of X")
    dalpha = check_vector(dalpha, "dalpha", n, "one entry per row of X")
    lam = check_positive_scalar(lam, "lam")
    xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
    loss, gamma = _loss_args(loss, gamma)
    beta = xi * m if beta is None else check_positive_scalar(beta, "beta")
    form = check_choice(form, "form", ("printed", "mocha"))
    _feasible_duals(alpha, y, loss, "alpha")
    _feasible_duals(alpha + dalpha, y, loss, "alpha + dalpha")
    W = omega @ device_sums(X, alpha, offsets) / (2.0 * lam)
    local = 0.0
    for t in range(m):
        lo, hi = offsets[t], offsets[t + 1]
        local += _local_value(dalpha[lo:hi], X[lo:hi], y[lo:hi], alpha[lo:hi], W[t],
                              beta * omega[t, t] / (2.0 * lam), loss, gamma)
    if form == "mocha":
        S = device_sums(X, alpha, offsets)
        local += np.sum(omega * (S @ S.T)) / (4.0 * lam)  # m devices x the constant / m
    before = dual_objective(X, y, offsets, alpha, omega, lam, loss, gamma)
    after = dual_objective(X, y, offsets, alpha + xi * dalpha, omega, lam, loss, gamma)
    return float((1.0 - xi) * before + xi * local - after)


# ------------------------------------------------------------------ Corollaries 2 and 3

@dataclass(frozen=True)
class Corollary2Result:
    """Exact local solutions on two neighbouring datasets beside Corollary 2's bound.

    Attributes
    ----------
    difference : float
        ||Delta alpha_t - Delta alpha_t'||_2 between the two computed minimizers.
    certified_difference : float
        The same norm over the coordinates determined in both problems (see
        :class:`LocalSolution`): every pair of minimizers differs by at least
        this much. Equal to ``difference`` when both minimizers are unique.
    coordinate_difference : float
        ``|Delta alpha_t^j - Delta alpha_t'^j|`` at the replaced sample.
    bound : float
        (8 lambda + beta) / (beta n_t).
    ratio : float
        ``certified_difference / bound`` (> 1: the bound fails on this pair).
    original, neighbour : LocalSolution
    """

    difference: float
    certified_difference: float
    coordinate_difference: float
    bound: float
    ratio: float
    original: LocalSolution
    neighbour: LocalSolution


def corollary2_difference(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, j, x_new, y_new,
                          loss="hinge", gamma=1.0, *, tol=1e-10):
    """Corollary 2 of DP-PFL (Hu et al., IEEE IoT J. 2020) on one pair of neighbouring datasets.

    Corollary 2 claims that the minimizer of (7) moves by at most
    (8 lambda + beta) / (beta n_t) in l2 norm when one sample of device t is
    replaced by another of norm <= 1, the state (w_t, alpha_t) held fixed.
    Here sample ``j`` is replaced by ``(x_new, y_new)`` at the same
    coordinate, whose dual variable keeps its position in the box
    (alpha_j' = y_new y_j alpha_j, so y alpha is unchanged), and (7) is solved
    exactly on both.

    The corollary rests on Corollary 1's modulus beta n_t / (2 lambda), which
    does not hold (:func:`local_strong_convexity`), and it fails for small
    lambda: the replaced sample's own dual coordinate can move from one end
    of its box to the other (a change of 1) when the new sample's margin
    y x^T (w_t + c X_t Delta alpha_t) is on the other side of 1, while the
    bound is about 1 / n_t for lambda << beta n_t / 8. It holds with room
    when lambda is large enough that (8 lambda + beta) / (beta n_t) >= 1
    (a change in one coordinate is then within the bound) and the models are
    small.

    Parameters
    ----------
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma
        As in :func:`local_objective`; rows of ``X_t`` of norm <= 1.
    j : int
        The replaced sample, in [0, n_t - 1].
    x_new : array_like, shape (d,)
        Its replacement, of norm <= 1.
    y_new : {-1, 1}
    tol : float
        KKT tolerance of both exact solves.

    Returns
    -------
    Corollary2Result

    Examples
    --------
    Replacing a sample with margin 60 by its mirror image moves its dual
    coordinate from 0 to 1, against a bound of 0.35:

    >>> X_t = [[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]
    >>> res = corollary2_difference(X_t, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [60.0, 0.0], 0.5,
    ...                             0.01, 2.0, 0, [-1.0, 0.0], 1)
    >>> res.certified_difference, round(res.bound, 4), round(res.ratio, 3)
    (1.0, 0.3467, 2.885)
    """
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma = _local_args(
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma)
    X_t = _rows(X_t, "X_t", unit=True)
    n_t, d = X_t.shape
    j = check_int_scalar(j, "j", minimum=0, maximum=n_t - 1)
    x_new = check_vector(x_new, "x_new", d, "a row of X_t")
    if np.linalg.norm(x_new) > 1.0 + _NORM_SLACK:
        raise ValueError(f"x_new must have l2 norm <= 1, got {np.linalg.norm(x_new):.6g}")
    if y_new not in (-1, 1) or isinstance(y_new, bool):
        raise ValueError(f"y_new must be -1 or 1, got {y_new!r}")
    tol = check_positive_scalar(tol, "tol")
    X2, y2, alpha2 = X_t.copy(), y_t.copy(), alpha_t.copy()
    X2[j], y2[j] = x_new, float(y_new)
    alpha2[j] = y2[j] * y_t[j] * alpha_t[j]
    c = beta * omega_tt / (2.0 * lam)
    first = _solve_local(X_t, y_t, alpha_t, w_t, c, loss, gamma, tol, 200_000)
    second = _solve_local(X2, y2, alpha2, w_t, c, loss, gamma, tol, 200_000)
    diff = first.dalpha - second.dalpha
    both = first.determined & second.determined
    certified = float(np.linalg.norm(diff[both]))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        bound = (8.0 * np.float64(lam) + beta) / (beta * n_t)
        ratio = certified / bound
    refuse_overflow((bound, ratio, 1.0 / bound), "the bound", ("lam", "beta"))
    return Corollary2Result(float(np.linalg.norm(diff)), certified, float(abs(diff[j])),
                            float(bound), float(ratio), first, second)


def corollary3_difference(X_t, dalpha_t, xi, j, x_new):
    """Corollary 3 of DP-PFL (Hu et al., IEEE IoT J. 2020): the upload's change given Delta alpha_t.

    The upload u_t = xi X_t Delta alpha_t changes by xi Delta alpha_t^j
    (x_j - x_new) when row ``j`` is replaced by ``x_new`` (Delta alpha_t held
    fixed), whose norm is at most ``2 xi |Delta alpha_t^j| <= 2 xi ||Delta
    alpha_t||_2``, the corollary's bound (true, but loose by ``||Delta alpha_t|| /
    max_i |Delta alpha_t^i|``).

    Parameters
    ----------
    X_t : array_like, shape (n_t, d)
        Rows of norm <= 1.
    dalpha_t : array_like, shape (n_t,)
    xi : float
        In (0, 1].
    j : int
        In [0, n_t - 1].
    x_new : array_like, shape (d,)
        Norm <= 1.

    Returns
    -------
    tuple of float
        ``(difference, bound)`` with bound = 2 xi ||Delta alpha_t||_2.

    Examples
    --------
    >>> corollary3_difference([[1.0, 0.0], [0.0, 1.0]], [0.5, 0.25], 0.5, 0, [-1.0, 0.0])
    (0.5, 0.5590169943749475)
    """
    X_t = _rows(X_t, "X_t", unit=True)
    n_t, d = X_t.shape
    dalpha = check_vector(dalpha_t, "dalpha_t", n_t, "one entry per row of X_t")
    xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
    j = check_int_scalar(j, "j", minimum=0, maximum=n_t - 1)
    x_new = check_vector(x_new, "x_new", d, "a row of X_t")
    if np.linalg.norm(x_new) > 1.0 + _NORM_SLACK:
        raise ValueError(f"x_new must have l2 norm <= 1, got {np.linalg.norm(x_new):.6g}")
    X2 = X_t.copy()
    X2[j] = x_new
    difference = float(np.linalg.norm(xi * (X_t.T @ dalpha) - xi * (X2.T @ dalpha)))
    return difference, float(2.0 * xi * np.linalg.norm(dalpha))


# ------------------------------------------------------------------ the Omega-step

def omega_objective(W, omega):
    """tr(W Omega^{-1} W^T) of problem (1) for models W (m, d) (rows) and a feasible Omega.

    Directions outside the range of Omega count only if W has no component
    there (else +inf), as in :func:`ebfl.dppfl.objective.regularizer`.

    Parameters
    ----------
    W : array_like, shape (m, d)
    omega : array_like, shape (m, m)
        Symmetric positive semidefinite.

    Returns
    -------
    float

    Examples
    --------
    >>> omega_objective([[1.0, 0.0], [0.0, 2.0]], [[0.5, 0.0], [0.0, 0.5]])
    10.0
    """
    W = check_finite_array(W, "W", ndim=2)
    omega = _omega(omega, W.shape[0])
    return regularizer(W, omega, 1.0)


@dataclass(frozen=True)
class OmegaStepValue:
    """The Omega-step's objective value, computed two ways.

    Attributes
    ----------
    omega : ndarray (m, m)
        Omega* = (W^T W)^{1/2} / tr((W^T W)^{1/2}) of eq. (3).
    value : float
        tr(W Omega*^{-1} W^T) computed from Omega*.
    closed_form : float
        (tr((W^T W)^{1/2}))^2, the squared nuclear norm of W.
    """

    omega: np.ndarray
    value: float
    closed_form: float


def omega_step_value(W):
    """tr(W Omega*^{-1} W^T) at the Omega-step (2)-(3) and its closed form (tr((W^T W)^{1/2}))^2.

    For models W (m rows), Omega* = (W W^T)^{1/2} / tr((W W^T)^{1/2}) (the
    paper's (W^T W)^{1/2} with models as columns) minimizes tr(W Omega^{-1}
    W^T) over Omega >= 0 with tr(Omega) = 1, and the minimum is the squared
    sum of W's singular values (Zhang and Yeung, 2010). The value is computed
    from Omega* by :func:`omega_objective` (an eigendecomposition, not the
    closed form), so the two agree only if the Omega-step is right.

    Parameters
    ----------
    W : array_like, shape (m, d)
        Not all zero.

    Returns
    -------
    OmegaStepValue

    Examples
    --------
    >>> res = omega_step_value([[3.0, 0.0], [0.0, 1.0]])
    >>> res.omega.tolist(), round(res.value, 12), res.closed_form
    ([[0.75, 0.0], [0.0, 0.25]], 16.0, 16.0)
    """
    W = check_finite_array(W, "W", ndim=2)
    singular = np.linalg.svd(W, compute_uv=False)
    if not singular.sum() > 0.0:
        raise ValueError("W must not be all zero (the Omega-step is undefined there)")
    omega = omega_step(W)
    return OmegaStepValue(omega, regularizer(W, omega, 1.0), float(singular.sum() ** 2))


def random_feasible_omega(m, rng=None, *, rank=None):
    """A random feasible Omega: A A^T / tr(A A^T) with A (m, rank) standard normal.

    Parameters
    ----------
    m : int
        Devices, in [1, 10000].
    rng : None, int, SeedSequence or Generator
    rank : int, optional
        Columns of A, in [1, 10000] (default m: positive definite almost surely).

    Returns
    -------
    ndarray, shape (m, m)
        Symmetric positive semidefinite with trace 1.

    Examples
    --------
    >>> omega = random_feasible_omega(3, 0)
    >>> round(float(np.trace(omega)), 12), bool(np.linalg.eigvalsh(omega).min() > 0)
    (1.0, True)
    """
    m = check_devices(m)
    rank = m if rank is None else check_int_scalar(rank, "rank", minimum=1, maximum=MAX_DEVICES)
    A = as_generator(rng).standard_normal((m, rank))
    omega = A @ A.T
    omega = 0.5 * (omega + omega.T)
    return omega / np.trace(omega)


# ------------------------------------------------------------------ Theorems 3 and 4

def _xi_theta(xi, theta):
    xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
    theta = check_real_scalar(theta, "theta", low=0.0, high=1.0, high_open=True)
    return xi, theta


def theorem3_rate(xi, theta, s):
    """The contraction 1 - (1 - xi) xi (1 - Theta) s of Theorem 3, equations (14) and (16).

    E[D(alpha^{k+1}) - D*] <= rate (D(alpha^k) - D*) for (1/mu)-smooth losses
    in DP-PFL (Hu et al., IEEE IoT J. 2020).

    Parameters
    ----------
    xi : float
        In (0, 1] (xi = 1 gives rate 1: no guarantee).
    theta : float
        Theta = p_max + (1 - p_max) Theta_max in [0, 1); 0 for exact local
        solves without dropping.
    s : float
        In (0, 1]; see :func:`theorem3_s`.

    Returns
    -------
    float

    Examples
    --------
    >>> theorem3_rate(0.5, 0.0, 1.0)
    0.75
    """
    xi, theta = _xi_theta(xi, theta)
    s = check_real_scalar(s, "s", low=0.0, high=1.0, low_open=True)
    return 1.0 - (1.0 - xi) * xi * (1.0 - theta) * s


def theorem3_iterations(n, eps_G, xi, theta, s):
    """Theorem 3's iteration count (12): K >= log(n / eps_G) / ((1 - xi) xi (1 - Theta) s).

    Then E[D(alpha^K) - D*] <= eps_G in DP-PFL (Hu et al., IEEE IoT J.
    2020), using D(alpha^0) - D* <= n. The paper leaves s in (0, 1)
    unspecified (:func:`theorem3_s` gives the value its Lemma 2 supports).

    Parameters
    ----------
    n : float
        Number of samples, > 0.
    eps_G : float
        Target suboptimality, > 0.
    xi, theta, s
        As in :func:`theorem3_rate`.

    Returns
    -------
    float
        The real-valued bound (K is any integer >= it); +inf when xi = 1;
        0 when eps_G >= n.

    Examples
    --------
    >>> round(theorem3_iterations(1000, 1e-3, 0.5, 0.0, 1.0), 6)
    55.262042
    """
    n = check_positive_scalar(n, "n")
    eps_G = check_positive_scalar(eps_G, "eps_G")
    xi, theta = _xi_theta(xi, theta)
    s = check_real_scalar(s, "s", low=0.0, high=1.0, low_open=True)
    speed = (1.0 - xi) * xi * (1.0 - theta) * s
    if speed == 0.0:
        return math.inf
    return max(math.log(n) - math.log(eps_G), 0.0) / speed  # n / eps_G may overflow


def theorem3_s(X, offsets, omega, lam, beta, mu):
    """The s of Theorem 3 that Lemma 2 supports.

    s = min_t 2 lambda mu / (2 lambda mu + beta Omega_tt sigma_t).

    Theorem 3 of DP-PFL (Hu et al., IEEE IoT J. 2020) asserts that *some*
    s in (0, 1) works. Lemma 2's remainder J_t = mu (1 - s) s ||z||^2 / 2 -
    beta s^2 Omega_tt ||X_t z||^2 / (4 lambda) is >= 0 for every z exactly
    when s <= 2 lambda mu / (2 lambda mu + beta Omega_tt sigma_t), with
    sigma_t = the largest eigenvalue of X_t^T X_t (as in CoCoA's analysis);
    then R = 0 in Lemma 3 and the rate follows. This is that value.

    Parameters
    ----------
    X : array_like, shape (n, d)
    offsets : array_like of int, shape (m + 1,)
    omega : array_like, shape (m, m)
    lam, beta : float
        > 0.
    mu : float
        Strong convexity of l* (> 0): gamma for the smoothed hinge, 1 for the
        squared loss.

    Returns
    -------
    float
        In (0, 1].

    Examples
    --------
    >>> theorem3_s([[1.0, 0.0], [0.0, 1.0]], [0, 1, 2], [[0.5, 0.0], [0.0, 0.5]], 0.5, 1.0, 1.0)
    0.6666666666666666
    """
    X = _rows(X, "X")
    offsets = _offsets(offsets, X.shape[0])
    omega = _omega(omega, offsets.size - 1)
    lam, beta, mu = (check_positive_scalar(v, name) for v, name in
                     ((lam, "lam"), (beta, "beta"), (mu, "mu")))
    s = 1.0
    for t in range(offsets.size - 1):
        block = X[offsets[t]:offsets[t + 1]]
        if block.shape[0]:
            sigma = float(np.linalg.eigvalsh(block.T @ block)[-1])
            s = min(s, 2.0 * lam * mu / (2.0 * lam * mu + beta * omega[t, t] * sigma))
    return float(s)


@dataclass(frozen=True)
class Theorem4Iterations:
    """Iteration counts of Theorem 4 (nonsmooth losses), smallest values allowed.

    Attributes
    ----------
    K, K0, k0 : float
        Whole numbers (+inf when xi = 1): run K iterations and average the
        iterates after K0; k0 is the burn-in of the bound's first phase.
    form : str
        "printed" (the statement) or "proof" (the end of its proof).
    """

    K: float
    K0: float
    k0: float
    form: str


def theorem4_iterations(sizes, lam, eps_G, xi, theta=0.0, *, L=1.0, initial_gap=None,
                        beta=None, form="printed"):
    """The iteration counts of Theorem 4 of DP-PFL (Hu et al., IEEE IoT J. 2020), two versions.

    Printed statement (A = m L^2 sum_t n_t^2 / (lambda n^2), eta = (1 - xi)(1 - Theta))::

        k0 = max(0, ceil(eta log(gap0 / (A / 2))))
        K0 = k0 + ceil(2 / eta (4 A / eps_G - 1))
        K  = K0 + ceil(max(1, 2 A / eps_G) / eta)

    End of the proof (B = 2 L^2 beta sum_t n_t^2 / (lambda n^2), eta' = xi eta)::

        k0 = max(0, ceil(eta' log(gap0 / B)))
        K0 = k0 + ceil(2 / eta' (2 B / eps_G - 1))
        K  = K0 + ceil(B / (eta' eps_G))

    The proof ends with "Theorem 4 follows by plugging in beta >= m xi", but
    the two do not agree: with beta = m xi, K0's step differs by the factor
    xi on the -1 (2/eta' against 2/eta), k0's log argument has
    m L^2 sum n_t^2 / (2 lambda n^2) in the statement against
    2 m xi L^2 sum n_t^2 / (lambda n^2) in the proof, and its multiplier
    drops the factor xi. For xi < 1 the statement's K0 - k0 exceeds the
    proof's by about 2 / (xi (1 - Theta)) and its K - K0 is the same, so the
    statement's K is the larger in practice: the proof implies it. Both
    versions multiply the log by the rate constant; the recursion (15)
    reaches a level after about log(ratio) / rate iterations (as (17) does
    for Theorem 3), so the multiplier is likely inverted compared with the
    CoCoA theorem the proof adapts, and k0 is too small by about a factor
    1 / rate^2.

    Parameters
    ----------
    sizes : array_like of int
        n_t of every device (m = len(sizes)), each >= 1.
    lam : float
        lambda > 0.
    eps_G : float
        Target suboptimality of the averaged iterate, > 0.
    xi : float
        In (0, 1].
    theta : float
        Theta in [0, 1).
    L : float
        Lipschitz constant of the loss (1 for the hinge with rows of norm <= 1).
    initial_gap : float, optional
        D(alpha^0) - D(alpha*) >= 0; default n (the bound the paper uses).
    beta : float, optional
        The proof's beta; default xi m.
    form : {"printed", "proof"}

    Returns
    -------
    Theorem4Iterations

    Examples
    --------
    >>> args = ([100, 100], 0.1, 0.5, 0.5)
    >>> theorem4_iterations(*args)
    Theorem4Iterations(K=398.0, K0=318.0, k0=2.0, form='printed')
    >>> theorem4_iterations(*args, form="proof")
    Theorem4Iterations(K=393.0, K0=313.0, k0=1.0, form='proof')
    """
    sizes = check_counts(sizes, "sizes", minimum=1)
    if sizes.size == 0:
        raise ValueError("sizes must hold at least one device")
    lam = check_positive_scalar(lam, "lam")
    eps_G = check_positive_scalar(eps_G, "eps_G")
    xi, theta = _xi_theta(xi, theta)
    L = check_positive_scalar(L, "L")
    m, n = sizes.size, float(sizes.sum())
    initial_gap = n if initial_gap is None else check_nonnegative_scalar(initial_gap,
                                                                         "initial_gap")
    beta = xi * m if beta is None else check_positive_scalar(beta, "beta")
    form = check_choice(form, "form", ("printed", "proof"))
    squares = float(np.sum(sizes.astype(np.float64) ** 2))
    eta = (1.0 - xi) * (1.0 - theta)
    # the scale of k0's log (A / 2 or B) in float64, where it may overflow or underflow,
    # and its log computed from logs (finite whatever the magnitudes)
    factor = m / 2.0 if form == "printed" else 2.0 * beta
    log_scale = (math.log(factor) + 2.0 * math.log(L) + math.log(squares) - math.log(lam)
                 - 2.0 * math.log(n))
    with np.errstate(over="ignore", under="ignore"):
        scale = np.float64(factor) * np.float64(L) ** 2 * squares / (np.float64(lam) * n**2)
        if form == "printed":
            A, log_mult = 2.0 * scale, eta
            step0 = 2.0 / eta * (4.0 * A / eps_G - 1.0) if eta else math.inf
            step = max(1.0, 2.0 * A / eps_G) / eta if eta else math.inf
        else:
            B, log_mult = scale, xi * eta
            step0 = 2.0 / (xi * eta) * (2.0 * B / eps_G - 1.0) if eta else math.inf
            step = B / (xi * eta * eps_G) if eta else math.inf
    if eta:
        refuse_overflow((step0, step), "Theorem 4's iteration counts",
                        ("sizes", "lam", "eps_G", "L") + (("beta",) if form == "proof" else ()))
    log_term = math.log(initial_gap) - log_scale if initial_gap > 0 else -math.inf
    k0 = float(max(0, math.ceil(log_mult * log_term))) if log_term > -math.inf else 0.0
    K0 = k0 + max(math.ceil(step0), 0) if math.isfinite(step0) else math.inf
    K = K0 + math.ceil(step) if math.isfinite(step) else math.inf
    return Theorem4Iterations(float(K), float(K0), k0, form)


# ------------------------------------------------------------------ runs and rates

@dataclass(frozen=True)
class ExactRun:
    """Algorithm 1 without privacy, dropping or Omega-steps, with exact local solves (Theta = 0).

    Attributes
    ----------
    history : list of dict
        ``iteration``, ``dual`` (D(alpha^k)), ``primal`` (P(W(alpha^k))) and
        ``gap``, as in :class:`ebfl.dppfl.DPPFLResult`'s history.
    alpha : ndarray (n,)
        The final dual variables.
    average : ndarray (n,) or None
        The averaged iterate of Theorem 4, the mean of alpha^k over
        k = ``average_after`` + 1..iterations (None without ``average_after``).
    worst_kkt_residual : float
        The largest KKT residual of the local solves.
    """

    history: list
    alpha: np.ndarray
    average: np.ndarray | None
    worst_kkt_residual: float


def exact_local_run(X, y, offsets, omega, lam, xi, iterations, loss="hinge", gamma=1.0, *,
                    beta=None, average_after=None, tol=1e-10):
    """Run the W-step of Algorithm 1 with every local subproblem (7) solved exactly.

    Each iteration, every device t solves (7) at w_t = w_t(alpha) of eq. (6)
    exactly (:func:`solve_local_exactly`) and adds xi Delta alpha_t* to
    alpha_t (for the hinges y alpha_t is then clipped to [0, 1], which only
    removes rounding: the update is a convex combination of feasible points);
    Omega stays fixed. This is the Theta = 0 case of Theorems 3 and 4 of
    DP-PFL (Hu et al., IEEE IoT J. 2020), which is deterministic.

    Parameters
    ----------
    X, y, offsets, omega
        As in :func:`solve_dual_exactly`.
    lam : float
    xi : float
        In (0, 1].
    iterations : int
        In [1, 10**6].
    loss, gamma
        As in :func:`local_objective`.
    beta : float, optional
        Default xi m.
    average_after : int, optional
        K0 of Theorem 4 in [0, iterations - 1]: also average the iterates
        after it.
    tol : float
        KKT tolerance of the local solves.

    Returns
    -------
    ExactRun

    Examples
    --------
    >>> X = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, -0.6]]
    >>> run = exact_local_run(X, [1.0, -1.0, 1.0, -1.0], [0, 2, 4], [[0.5, 0.1], [0.1, 0.5]],
    ...                       0.1, 0.5, 20, "smoothed_hinge")
    >>> bool(run.history[-1]["gap"] < 1e-3 * run.history[0]["gap"])
    True
    """
    X, y, offsets, omega = _global_args(X, y, offsets, omega)
    lam = check_positive_scalar(lam, "lam")
    xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
    iterations = check_int_scalar(iterations, "iterations", minimum=1,
                                  maximum=MAX_EXACT_ITERATIONS)
    loss, gamma = _loss_args(loss, gamma)
    m = offsets.size - 1
    beta = xi * m if beta is None else check_positive_scalar(beta, "beta")
    if average_after is not None:
        average_after = check_int_scalar(average_after, "average_after", minimum=0,
                                         maximum=iterations - 1)
    tol = check_positive_scalar(tol, "tol")
    alpha = np.zeros(X.shape[0])
    total = np.zeros_like(alpha)
    history, worst = [], 0.0

    def record(k):
        W = primal_dual_map(X, alpha, offsets, omega, lam)
        dual = dual_objective(X, y, offsets, alpha, omega, lam, loss, gamma)
        primal = primal_objective(X, y, offsets, W, omega, lam, loss, gamma)
        history.append({"iteration": k, "primal": primal, "dual": dual,
                        "gap": duality_gap(X, y, offsets, alpha, omega, lam, loss, gamma)})

    refuse_overflow(beta * (np.diag(omega) / (2.0 * lam)), "the curvature", ("beta", "lam"))
    record(0)
    for k in range(1, iterations + 1):
        W = primal_dual_map(X, alpha, offsets, omega, lam)
        step = np.zeros_like(alpha)
        for t in range(m):
            lo, hi = offsets[t], offsets[t + 1]
            if hi == lo:
                continue
            sol = _solve_local(X[lo:hi], y[lo:hi], alpha[lo:hi], W[t],
                               beta * omega[t, t] / (2.0 * lam), loss, gamma, tol, 200_000)
            step[lo:hi] = sol.dalpha
            worst = max(worst, sol.kkt_residual)
        alpha += xi * step
        if loss != "squared":  # the convex combination stays in the box, up to rounding
            alpha = y * np.clip(y * alpha, 0.0, 1.0)
        if average_after is not None and k > average_after:
            total += alpha
        record(k)
    average = None if average_after is None else total / (iterations - average_after)
    return ExactRun(history, alpha, average, worst)


@dataclass(frozen=True)
class LinearRate:
    """A fitted geometric rate of convergence.

    Attributes
    ----------
    rate : float
        exp(slope) of the least-squares line through log e_k against k: the
        average contraction per iteration.
    worst_step : float
        The largest per-iteration contraction (e_{k'} / e_k)^(1 / (k' - k))
        between consecutive recorded points.
    slope, intercept : float
    iterations : ndarray
        The iterations used (e_k above the floor).
    """

    rate: float
    worst_step: float
    slope: float
    intercept: float
    iterations: np.ndarray


def linear_rate(history, *, value="dual", optimum=None, rtol=1e-9):
    """Fit the linear rate of convergence of a run: log e_k against k.

    e_k = D(alpha^k) - D* (``value="dual"``, ``optimum`` = D*, e.g. from
    :func:`solve_dual_exactly`) or the duality gap (``value="gap"``, an
    upper bound of D(alpha^k) - D*). Only the leading run of points with
    e_k > rtol e_0 is used (beyond it rounding dominates). Compare the rate
    with :func:`theorem3_rate`.

    Parameters
    ----------
    history : sequence of mapping
        Rows with ``iteration`` and the ``value`` key, in increasing
        iteration order (the history of :func:`ebfl.dppfl.fit_dppfl` without
        privacy, or of :func:`exact_local_run`).
    value : {"dual", "gap"}
    optimum : float, optional
        D*, required for ``value="dual"``.
    rtol : float
        Relative floor in (0, 1).

    Returns
    -------
    LinearRate

    Examples
    --------
    >>> hist = [{"iteration": k, "dual": 1.0 + 0.5**k} for k in range(10)]
    >>> fit = linear_rate(hist, optimum=1.0)
    >>> round(fit.rate, 12), round(fit.worst_step, 12)
    (0.5, 0.5)
    """
    value = check_choice(value, "value", ("dual", "gap"))
    optimum = None if optimum is None else check_real_scalar(optimum, "optimum")
    rtol = check_real_scalar(rtol, "rtol", low=0.0, high=1.0, low_open=True, high_open=True)
    try:
        rows = list(history)
        k = np.array([row["iteration"] for row in rows], dtype=np.float64)
        v = np.array([row[value] for row in rows], dtype=np.float64)
    except (TypeError, KeyError) as exc:
        raise TypeError(f"history must be a sequence of mappings with 'iteration' and "
                        f"{value!r}") from exc
    if value == "dual":
        if optimum is None:
            raise ValueError("optimum (D*) is required for value='dual'")
        v = v - optimum
    if k.size < 3 or not np.all(np.diff(k) > 0) or not np.all(np.isfinite(v)):
        raise ValueError("history must have >= 3 rows with finite values in increasing "
                         "iteration order")
    if not v[0] > 0.0:
        raise ValueError(f"the first e_k must be > 0, got {v[0]!r}")
    below = np.flatnonzero(~(v > rtol * v[0]))
    stop = below[0] if below.size else v.size
    if stop < 3:
        raise ValueError("fewer than 3 points above the floor rtol * e_0: record more often")
    k, e = k[:stop], np.log(v[:stop])
    slope, intercept = np.polyfit(k, e, 1)
    worst = float(np.max(np.exp(np.diff(e) / np.diff(k))))
    return LinearRate(float(math.exp(slope)), worst, float(slope), float(intercept), k)
