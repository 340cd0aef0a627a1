"""The multitask objective of DP-PFL, its dual, and the closed-form Omega-step.

DP-PFL (Hu et al., IEEE IoT J. 2020) learns one linear model w_t per device
and a task-covariance matrix Omega (the MOCHA formulation of Smith et al.,
2017), problem (1)::

    min_{W, Omega}  sum_t sum_i l(w_t^T x_t^i, y_t^i) + lambda tr(W Omega^{-1} W^T),
    Omega >= 0, tr(Omega) = 1.

For fixed Omega the W-step is solved in the dual (5),

    D(alpha) = sum_t sum_i l*(-alpha_t^i) + ||X alpha||^2_{Omega (x) I} / (4 lambda),

with the primal-dual map (6) w(alpha) = (Omega (x) I) X alpha / (2 lambda);
P(w(alpha)) + D(alpha) >= 0 is the duality gap. Arrays follow the layout of
:class:`ebfl.dppfl.data.DeviceData`: all devices' rows concatenated in ``X``
(n, d), labels ``y``, device t's rows at ``offsets[t]:offsets[t + 1]``;
models are the rows of ``W`` (m, d), i.e. the transpose of the paper's W.

Every public function checks its arguments (finite reals of the shapes above,
``offsets`` integers rising from 0 to n, ``omega`` symmetric positive
semidefinite, lambda > 0) and refuses by name a result that overflows
float64; the private ``_``-functions are the same computations on trusted
input, for the algorithm's inner loop.
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import check_choice, check_finite_array, check_positive_scalar
from ebfl.dppfl._checks import (
    MAX_DEVICES,
    check_models,
    check_offsets,
    check_omega,
    check_rows,
    check_vector,
    refuse_overflow,
)

__all__ = ["LOSSES", "conjugate", "device_sums", "dual_objective", "duality_gap", "loss_values",
           "omega_step", "primal_dual_map", "primal_objective", "regularizer"]

#: The losses: the hinge (SVM, as in the paper's experiments), the smoothed hinge
#: with parameter ``gamma`` (1/gamma-smooth, for Theorem 3's linear rate) and the
#: squared loss (v - y)^2 / 2.
LOSSES = ("hinge", "smoothed_hinge", "squared")


# --------------------------------------------------------------------------- checks


def _loss_iv(loss, gamma):
    return check_choice(loss, "loss", LOSSES), check_positive_scalar(gamma, "gamma")


def _pair_iv(a, y, name):
    """Two finite arrays that broadcast together (elementwise arguments)."""
    a = check_finite_array(a, name, min_len=0)
    y = check_finite_array(y, "y", min_len=0)
    try:
        np.broadcast_shapes(a.shape, y.shape)
    except ValueError:
        raise ValueError(f"{name} and y must broadcast together, got shapes {a.shape} and "
                         f"{y.shape}") from None
    return a, y


def _data_iv(X, y, offsets):
    X = check_rows(X)
    n = X.shape[0]
    y = None if y is None else check_vector(y, "y", n, "one label per row of X")
    return X, y, check_offsets(offsets, n)


def _problem_iv(X, y, offsets, omega, lam, vector, name, loss="hinge", gamma=1.0):
    """The arguments of (1), (5) and (6): data, alpha (n,) or W (m, d), Omega, lambda."""
    X, y, offsets = _data_iv(X, y, offsets)
    m, (n, d) = offsets.size - 1, X.shape
    if name == "W":
        vector = check_models(vector, m, d)
    else:
        vector = check_vector(vector, name, n, "one dual variable per row of X")
    omega = check_omega(omega, m)
    lam = check_positive_scalar(lam, "lam")
    loss, gamma = _loss_iv(loss, gamma)
    return X, y, offsets, vector, omega, lam, loss, gamma


# --------------------------------------------------------------------------- trusted kernels


def _loss_values(v, y, loss, gamma):
    if loss == "squared":
        return 0.5 * (v - y) ** 2
    slack = 1.0 - y * v
    if loss == "hinge":
        return np.maximum(slack, 0.0)
    return np.where(slack <= 0.0, 0.0,
                    np.where(slack >= gamma, slack - gamma / 2.0, slack**2 / (2.0 * gamma)))


def _conjugate(a, y, loss, gamma):
    if loss == "squared":
        return -a * y + 0.5 * a**2
    ya = a * y
    out = -ya + (0.5 * gamma * ya**2 if loss == "smoothed_hinge" else 0.0)
    feasible = (ya >= -1e-12) & (ya <= 1.0 + 1e-12)
    return np.where(feasible, out, np.inf)


def _device_sums(X, alpha, offsets):
    """Rows X_t alpha_t; an empty device's row is 0 (reduceat alone would repeat a row)."""
    m = offsets.size - 1
    out = np.zeros((m, X.shape[1]))
    nonempty = np.diff(offsets) > 0
    if np.any(nonempty):
        out[nonempty] = np.add.reduceat(X * alpha[:, None], offsets[:-1][nonempty], axis=0)
    return out


def _regularizer(W, omega, lam):
    evals, evecs = np.linalg.eigh(omega)
    coords = evecs.T @ W  # (m, d): W in Omega's eigenbasis
    keep = evals > 1e-12 * max(evals.max(), 0.0)
    outside = np.sum(coords[~keep] ** 2)
    if outside > 1e-18 * max(np.sum(coords**2), 1e-300):
        return np.inf  # W leaves the range of Omega: the objective is +inf, no overflow
    with np.errstate(over="ignore", invalid="ignore"):
        value = float(lam * np.sum(np.sum(coords[keep] ** 2, axis=1) / evals[keep]))
    return refuse_overflow(value, "lambda tr(W Omega^-1 W^T)", ("W", "omega", "lam"))


def _device_scores(X, W, offsets):
    rows = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    return np.einsum("ij,ij->i", X, W[rows])


def _loss_total(X, y, offsets, W, loss, gamma):
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(_loss_values(_device_scores(X, W, offsets), y, loss, gamma).sum())
    names = ("X", "W", "y", "gamma") if loss == "smoothed_hinge" else ("X", "W", "y")
    return refuse_overflow(total, "the summed loss", names)


def _primal(X, y, offsets, W, omega, lam, loss, gamma):
    return float(_loss_total(X, y, offsets, W, loss, gamma) + _regularizer(W, omega, lam))


def _quadratic(X, alpha, offsets, omega, lam):
    """||X alpha||^2_Omega / (4 lambda)."""
    with np.errstate(over="ignore", invalid="ignore"):
        S = _device_sums(X, alpha, offsets)
        quad = float(np.sum(omega * (S @ S.T)) / (4.0 * lam))
    return refuse_overflow(quad, "||X alpha||^2_Omega / (4 lambda)",
                           ("X", "alpha", "omega", "lam"))


def _conjugate_total(alpha, y, loss, gamma):
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(_conjugate(alpha, y, loss, gamma).sum())
    if np.isnan(total) or (np.isinf(total) and loss == "squared"):
        refuse_overflow(total, "the summed conjugate loss", ("alpha", "y"))
    return total  # +inf: alpha outside the domain of l* (the hinges)


def _dual(X, y, offsets, alpha, omega, lam, loss, gamma):
    return float(_conjugate_total(alpha, y, loss, gamma) + _quadratic(X, alpha, offsets, omega,
                                                                      lam))


def _map(X, alpha, offsets, omega, lam):
    with np.errstate(over="ignore", invalid="ignore"):
        W = omega @ _device_sums(X, alpha, offsets) / (2.0 * lam)
    return refuse_overflow(W, "W(alpha) = Omega X alpha / (2 lambda)",
                           ("X", "alpha", "omega", "lam"))


def _gap(X, y, offsets, alpha, omega, lam, loss, gamma):
    W = _map(X, alpha, offsets, omega, lam)
    # lambda tr(W Omega^-1 W^T) = ||X alpha||^2_Omega / (4 lambda) at W = W(alpha): no inverse
    quad = _quadratic(X, alpha, offsets, omega, lam)
    primal = _loss_total(X, y, offsets, W, loss, gamma) + quad
    return float(primal + _conjugate_total(alpha, y, loss, gamma) + quad)


def _omega_step(W, previous):
    m = W.shape[0]
    peak = float(np.abs(W).max()) if W.size else 0.0
    if not peak > 0.0:
        return np.eye(m) / m if previous is None else np.array(previous, dtype=np.float64)
    W = W / peak  # Omega* is invariant to the scale of W: nothing can overflow nor vanish
    # (W W^T)^{1/2} = U diag(s) U^T from the SVD W = U S V^T: the singular values come
    # without squaring, so a rank-deficient W keeps its zero directions at zero (the
    # square root of W W^T's rounding errors would be about 1e-8, not 1e-16)
    U, s, _ = np.linalg.svd(W, full_matrices=False)
    root = (U * s) @ U.T
    root = 0.5 * (root + root.T)
    return root / np.trace(root)


# --------------------------------------------------------------------------- public


def loss_values(scores, y, loss="hinge", gamma=1.0):
    """l(v, y) elementwise for scores v = w_t^T x (finite arrays that broadcast together)."""
    loss, gamma = _loss_iv(loss, gamma)
    v, y = _pair_iv(scores, y, "scores")
    with np.errstate(over="ignore", invalid="ignore"):
        out = _loss_values(v, y, loss, gamma)
    names = ("scores", "y", "gamma") if loss == "smoothed_hinge" else ("scores", "y")
    return refuse_overflow(out, "the loss", names)


def conjugate(alpha, y, loss="hinge", gamma=1.0):
    """l*(-alpha) elementwise; +inf outside the domain (alpha y in [0, 1] for the hinges)."""
    loss, gamma = _loss_iv(loss, gamma)
    a, y = _pair_iv(alpha, y, "alpha")
    with np.errstate(over="ignore", invalid="ignore"):
        out = _conjugate(a, y, loss, gamma)
    if np.any(np.isnan(out)) or (loss == "squared" and not np.all(np.isfinite(out))):
        refuse_overflow(out, "l*(-alpha)", ("alpha", "y"))
    return out


def device_sums(X, alpha, offsets):
    """The rows X_t alpha_t (m, d): each device's data weighted by its dual variables."""
    X, _, offsets = _data_iv(X, None, offsets)
    alpha = check_vector(alpha, "alpha", X.shape[0], "one dual variable per row of X")
    with np.errstate(over="ignore", invalid="ignore"):
        out = _device_sums(X, alpha, offsets)
    return refuse_overflow(out, "X_t alpha_t", ("X", "alpha"))


def primal_dual_map(X, alpha, offsets, omega, lam):
    """Equation (6): W(alpha) = Omega [X_t alpha_t]_t / (2 lambda), one model per row."""
    X, _, offsets, alpha, omega, lam, _, _ = _problem_iv(X, None, offsets, omega, lam, alpha,
                                                         "alpha")
    return _map(X, alpha, offsets, omega, lam)


def regularizer(W, omega, lam):
    """lambda tr(W Omega^{-1} W^T) for models W (m, d) in the range of Omega.

    Computed by an eigendecomposition of Omega: directions with eigenvalue below
    1e-12 of the largest count only if W has no component there (else +inf).
    """
    W = check_finite_array(W, "W", ndim=2)
    omega = check_omega(omega, W.shape[0])
    return _regularizer(W, omega, check_positive_scalar(lam, "lam"))


def primal_objective(X, y, offsets, W, omega, lam, loss="hinge", gamma=1.0):
    """P(W, Omega) of problem (1): the summed loss plus lambda tr(W Omega^{-1} W^T).

    +inf when W leaves the range of Omega.
    """
    args = _problem_iv(X, y, offsets, omega, lam, W, "W", loss, gamma)
    return _primal(*args)


def dual_objective(X, y, offsets, alpha, omega, lam, loss="hinge", gamma=1.0):
    """D(alpha) of (5) (to be minimized; -D is the dual function).

    +inf when alpha leaves the domain of l* (y alpha in [0, 1] for the hinges).
    """
    args = _problem_iv(X, y, offsets, omega, lam, alpha, "alpha", loss, gamma)
    return _dual(*args)


def duality_gap(X, y, offsets, alpha, omega, lam, loss="hinge", gamma=1.0):
    """P(W(alpha), Omega) + D(alpha) >= 0, zero exactly at the optimum of the W-step."""
    args = _problem_iv(X, y, offsets, omega, lam, alpha, "alpha", loss, gamma)
    return _gap(*args)


def omega_step(W, previous=None):
    """Equations (2)-(3): Omega* = (W^T W)^{1/2} / tr((W^T W)^{1/2}) for models W (m, d).

    The square root is U diag(s) U^T from the singular value decomposition
    W = U S V^T of the models (scaled first, which leaves Omega* unchanged).
    When every model is zero the trace vanishes and the step is undefined:
    ``previous`` (default I / m) is returned.

    Parameters
    ----------
    W : array_like, shape (m, d)
        Finite models, one per row; m at most 10,000.
    previous : array_like, shape (m, m), optional
        Symmetric positive semidefinite (a copy is returned).

    Returns
    -------
    ndarray, shape (m, m)
    """
    W = check_finite_array(W, "W", ndim=2)
    if W.shape[0] > MAX_DEVICES:
        raise ValueError(f"W must have at most {MAX_DEVICES} rows (devices), got {W.shape[0]}")
    if previous is not None:
        previous = check_omega(previous, W.shape[0], "previous")
    return _omega_step(W, previous)
