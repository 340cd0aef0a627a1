"""Exact solutions of DP-PFL's local subproblem (7) and dual (5), with certificates.

The theory checks of :mod:`ebfl.dppfl.theory` evaluate the paper's statements
on concrete instances; they need the exact minimizers, which this module
computes and certifies by their KKT residuals:

* :func:`local_objective`, :func:`solve_local_exactly` (the exact minimizer of
  (7)), :func:`local_solution_quality` (theta of Definition 1, eq. (8)) and
  :func:`local_strong_convexity` (the true modulus of Corollary 1);
* :func:`solve_dual_exactly` (the minimizer of (5));
* :func:`exact_local_run` (the algorithm with exact local steps) and
  :func:`linear_rate` (the rate a run's history shows).

The layout is :mod:`ebfl.dppfl.theory`'s: a device's rows ``X_t`` (n_t, d) are
the paper's columns x_t^i, all devices' rows are concatenated in ``X`` with
device t at ``offsets[t]:offsets[t + 1]``, and models are the rows of ``W``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
)
from ebfl.dppfl import _kernels
from ebfl.dppfl._checks import (
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
    primal_dual_map,
    primal_objective,
)

__all__ = [
    "DualSolution",
    "ExactRun",
    "LinearRate",
    "LocalSolution",
    "exact_local_run",
    "linear_rate",
    "local_objective",
    "local_solution_quality",
    "local_strong_convexity",
    "solve_dual_exactly",
    "solve_local_exactly",
]

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


#: Largest number of sweeps of an exact solve, and of iterations of exact_local_run.
MAX_SWEEPS, MAX_EXACT_ITERATIONS = 10**7, 10**6


def _global_args(X, y, offsets, omega, *, unit=False):
    X = _rows(X, "X", unit=unit)
    y = _labels(y, "y", X.shape[0])
    offsets = check_offsets(offsets, X.shape[0])
    omega = check_omega(omega, offsets.size - 1)
    return X, y, offsets, omega


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
    the constant of MOCHA's subproblem; see :func:`~ebfl.dppfl.theory.lemma1_gap`).

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
        sweeps += _kernels._local_sweeps(
            X_t, y_t, sqnorm, alpha_t, a, w_t, c, code, gamma, 0.01 * tol,
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
        sweeps += _kernels._dual_sweeps(
            X, y, sqnorm, offsets, omega, lam, a, _LOSS_CODES[loss], gamma, 0.01 * tol,
            min(_WARM_SWEEPS if sweeps == 0 else 5000, max_sweeps - sweeps))
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
    with :func:`~ebfl.dppfl.theory.theorem3_rate`.

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
