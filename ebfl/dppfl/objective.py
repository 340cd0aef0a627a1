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
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import check_choice, check_positive_scalar

__all__ = ["LOSSES", "conjugate", "device_sums", "dual_objective", "duality_gap", "loss_values",
           "omega_step", "primal_dual_map", "primal_objective", "regularizer"]

#: The losses: the hinge (SVM, as in the paper's experiments), the smoothed hinge
#: with parameter ``gamma`` (1/gamma-smooth, for Theorem 3's linear rate) and the
#: squared loss (v - y)^2 / 2.
LOSSES = ("hinge", "smoothed_hinge", "squared")


def loss_values(scores, y, loss="hinge", gamma=1.0):
    """l(v, y) elementwise for scores v = w_t^T x."""
    loss = check_choice(loss, "loss", LOSSES)
    v, y = np.asarray(scores, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if loss == "squared":
        return 0.5 * (v - y) ** 2
    slack = 1.0 - y * v
    if loss == "hinge":
        return np.maximum(slack, 0.0)
    gamma = check_positive_scalar(gamma, "gamma")
    return np.where(slack <= 0.0, 0.0,
                    np.where(slack >= gamma, slack - gamma / 2.0, slack**2 / (2.0 * gamma)))


def conjugate(alpha, y, loss="hinge", gamma=1.0):
    """l*(-alpha) elementwise; +inf outside the domain (alpha y in [0, 1] for the hinges)."""
    loss = check_choice(loss, "loss", LOSSES)
    a, y = np.asarray(alpha, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if loss == "squared":
        return -a * y + 0.5 * a**2
    ya = a * y
    out = -ya + (0.5 * check_positive_scalar(gamma, "gamma") * ya**2
                 if loss == "smoothed_hinge" else 0.0)
    feasible = (ya >= -1e-12) & (ya <= 1.0 + 1e-12)
    return np.where(feasible, out, np.inf)


def device_sums(X, alpha, offsets):
    """The rows X_t alpha_t (m, d): each device's data weighted by its dual variables."""
    X = np.asarray(X, dtype=np.float64)
    weighted = X * np.asarray(alpha, dtype=np.float64)[:, None]
    return np.add.reduceat(weighted, offsets[:-1], axis=0) if X.shape[0] else \
        np.zeros((len(offsets) - 1, X.shape[1]))


def primal_dual_map(X, alpha, offsets, omega, lam):
    """Equation (6): W(alpha) = Omega [X_t alpha_t]_t / (2 lambda), one model per row."""
    lam = check_positive_scalar(lam, "lam")
    return np.asarray(omega, dtype=np.float64) @ device_sums(X, alpha, offsets) / (2.0 * lam)


def regularizer(W, omega, lam):
    """lambda tr(W Omega^{-1} W^T) for models W (m, d) in the range of Omega.

    Computed by an eigendecomposition of Omega: directions with eigenvalue below
    1e-12 of the largest count only if W has no component there (else +inf).
    """
    W = np.asarray(W, dtype=np.float64)
    evals, evecs = np.linalg.eigh(np.asarray(omega, dtype=np.float64))
    coords = evecs.T @ W  # (m, d): W in Omega's eigenbasis
    keep = evals > 1e-12 * max(evals.max(), 0.0)
    outside = np.sum(coords[~keep] ** 2)
    if outside > 1e-18 * max(np.sum(coords**2), 1e-300):
        return np.inf
    return float(lam * np.sum(np.sum(coords[keep] ** 2, axis=1) / evals[keep]))


def _device_scores(X, W, offsets):
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.einsum("ij,ij->i", np.asarray(X, dtype=np.float64), np.asarray(W)[rows])


def primal_objective(X, y, offsets, W, omega, lam, loss="hinge", gamma=1.0):
    """P(W, Omega) of problem (1): the summed loss plus lambda tr(W Omega^{-1} W^T)."""
    lam = check_positive_scalar(lam, "lam")
    total = loss_values(_device_scores(X, W, offsets), y, loss, gamma).sum()
    return float(total + regularizer(W, omega, lam))


def dual_objective(X, y, offsets, alpha, omega, lam, loss="hinge", gamma=1.0):
    """D(alpha) of (5) (to be minimized; -D is the dual function)."""
    lam = check_positive_scalar(lam, "lam")
    S = device_sums(X, alpha, offsets)
    quad = np.sum(np.asarray(omega, dtype=np.float64) * (S @ S.T)) / (4.0 * lam)
    return float(conjugate(alpha, y, loss, gamma).sum() + quad)


def duality_gap(X, y, offsets, alpha, omega, lam, loss="hinge", gamma=1.0):
    """P(W(alpha), Omega) + D(alpha) >= 0, zero exactly at the optimum of the W-step."""
    W = primal_dual_map(X, alpha, offsets, omega, lam)
    S = device_sums(X, alpha, offsets)
    # lambda tr(W Omega^-1 W^T) = ||X alpha||^2_Omega / (4 lambda) at W = W(alpha): no inverse
    quad = np.sum(np.asarray(omega, dtype=np.float64) * (S @ S.T)) / (4.0 * lam)
    primal = loss_values(_device_scores(X, W, offsets), y, loss, gamma).sum() + quad
    return float(primal + conjugate(alpha, y, loss, gamma).sum() + quad)


def omega_step(W, previous=None):
    """Equations (2)-(3): Omega* = (W^T W)^{1/2} / tr((W^T W)^{1/2}) for models W (m, d).

    The square root is taken by an eigendecomposition of the Gram matrix of the
    models, negative rounding eigenvalues clamped to 0. When every model is
    zero the trace vanishes and the step is undefined: ``previous`` (default
    I / m) is returned.
    """
    W = np.asarray(W, dtype=np.float64)
    m = W.shape[0]
    evals, evecs = np.linalg.eigh(W @ W.T)
    root = (evecs * np.sqrt(np.clip(evals, 0.0, None))) @ evecs.T
    root = 0.5 * (root + root.T)
    trace = np.trace(root)
    if not trace > 0.0:
        return np.eye(m) / m if previous is None else np.array(previous, dtype=np.float64)
    return root / trace
