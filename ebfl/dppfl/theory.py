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

* :func:`lemma1_ratio`, :func:`lemma1_ratio_sup` and :func:`lemma1_gap`;
* :func:`~ebfl.dppfl.exact.local_strong_convexity` (Corollary 1), :func:`corollary2_difference`
  and :func:`corollary3_difference`;
* :func:`omega_objective`, :func:`omega_step_value` and
  :func:`random_feasible_omega` (the Omega-step (2)-(3));
* :func:`theorem3_iterations`, :func:`theorem3_rate`, :func:`theorem3_s`,
  :func:`theorem4_iterations`.

The exact minimizers of (7) and (5) these need, and runs with exact local
steps, are in :mod:`ebfl.dppfl.exact`.

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
from dataclasses import dataclass

import numpy as np

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
from ebfl.dppfl._checks import (
    MAX_DEVICES,
    check_devices,
    check_offsets,
    check_omega,
    check_vector,
    refuse_overflow,
)
from ebfl.dppfl.exact import (
    _NORM_SLACK,
    LocalSolution,
    _feasible_duals,
    _global_args,
    _local_args,
    _local_value,
    _loss_args,
    _rows,
    _solve_local,
)
from ebfl.dppfl.objective import (
    device_sums,
    dual_objective,
    omega_step,
    regularizer,
)

__all__ = ["Corollary2Result", "OmegaStepValue", "Theorem4Iterations", "corollary2_difference",
           "corollary3_difference", "lemma1_gap", "lemma1_ratio", "lemma1_ratio_sup",
           "omega_objective", "omega_step_value", "random_feasible_omega", "theorem3_iterations",
           "theorem3_rate", "theorem3_s", "theorem4_iterations"]

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
    offsets = check_offsets(offsets, X.shape[0])
    omega = check_omega(omega, offsets.size - 1)
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
    omega = check_omega(omega, omega.shape[0])
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
        As in :func:`~ebfl.dppfl.exact.solve_dual_exactly`.
    alpha, dalpha : array_like, shape (n,)
        alpha and alpha + Delta alpha in the domain of l* (y a in [0, 1] for
        the hinges); ``alpha + xi * dalpha`` then is too.
    lam : float
    xi : float
        The aggregation parameter in (0, 1].
    loss, gamma
        As in :func:`~ebfl.dppfl.exact.local_objective`.
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
        :class:`~ebfl.dppfl.exact.LocalSolution`): every pair of minimizers differs by at least
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
    does not hold (:func:`~ebfl.dppfl.exact.local_strong_convexity`), and it fails for small
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
        As in :func:`~ebfl.dppfl.exact.local_objective`; rows of ``X_t`` of norm <= 1.
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
    omega = check_omega(omega, W.shape[0])
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
    offsets = check_offsets(offsets, X.shape[0])
    omega = check_omega(omega, offsets.size - 1)
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

