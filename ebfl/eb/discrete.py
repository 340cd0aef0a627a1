"""Discrete-mixture priors: Theorem 5 (known prior) and Algorithm 1 (unknown prior).

Client parameters take one of k values, theta_i in {mu_1, ..., mu_k} with
probabilities p_l, and client i reports xbar_i ~ N(theta_i, s_i^2 I_d) with
s_i = sigma_x / sqrt(n_i) (spec C.8, C.9). Only xbar_i matters: the full-data
exponent sum_j |X_ij - mu_l|^2 differs from n_i |xbar_i - mu_l|^2 by a term
that does not depend on l.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    as_generator,
    check_finite_array,
    check_int_scalar,
    check_positive_scalar,
)
from ebfl.eb import _kernels
from ebfl.eb.gaussian import _n_iv

__all__ = [
    "DiscreteMixtureFit",
    "DiscretePosterior",
    "discrete_mixture_eb",
    "discrete_posterior",
    "expected_posterior_variance",
    "kmeans_cluster",
    "lemma1_radius",
]


@dataclass(frozen=True)
class DiscretePosterior:
    """Posterior of every client over the k atoms (Theorem 5).

    Attributes
    ----------
    mean : ndarray of shape (m,) or (m, d)
        Posterior means sum_l w_il mu_l, the Bayes (MMSE) estimates, eq. (9).
    var : ndarray of shape (m,)
        Posterior variance per coordinate: sum_l w_il |mu_l - mean_i|^2 / d.
    weights : ndarray of shape (m, k)
        Posterior probabilities w_il of the atoms.
    atoms : ndarray of shape (k,) or (k, d)
    """

    mean: np.ndarray
    var: np.ndarray
    weights: np.ndarray
    atoms: np.ndarray

    @property
    def map_atom(self) -> np.ndarray:
        """The most probable atom of every client (the MAP estimate)."""
        return self.atoms[np.argmax(self.weights, axis=1)]


def _as_2d(x):
    return x if x.ndim == 2 else x[:, None]


def _prior_iv(atoms, probs, d):
    atoms = check_finite_array(atoms, "atoms", ndim=(1, 2))
    atoms2 = _as_2d(atoms)
    if atoms2.shape[1] != d:
        raise ValueError(f"atoms must have dimension d={d}, got shape {atoms.shape}")
    probs = check_finite_array(probs, "probs", ndim=1)
    if probs.shape != (atoms2.shape[0],):
        raise ValueError(f"probs must have one entry per atom ({atoms2.shape[0]}), "
                         f"got shape {probs.shape}")
    if np.any(probs < 0) or not math.isclose(probs.sum(), 1.0, rel_tol=1e-9):
        raise ValueError("probs must be >= 0 and sum to 1")
    return atoms, atoms2, probs


def discrete_posterior(x, s, atoms, probs):
    r"""Theorem 5: posterior mean of theta_i under a known discrete prior.

    .. math:: w_l^{(i)} = \frac{p_l \exp(-|x_i - \mu_l|^2/(2 s_i^2))}
                              {\sum_{l'} p_{l'} \exp(-|x_i - \mu_{l'}|^2/(2 s_i^2))},
              \qquad \hat\theta_i = \sum_l w_l^{(i)} \mu_l

    computed with log-sum-exp.

    Parameters
    ----------
    x : array_like, shape (m,) or (m, d)
        Client means xbar_i.
    s : float or array_like, shape (m,)
        Their standard errors sigma_x / sqrt(n_i), > 0.
    atoms : array_like, shape (k,) or (k, d)
        Support mu_1..mu_k of the prior.
    probs : array_like, shape (k,)
        Prior probabilities p_l (>= 0, summing to 1).

    Returns
    -------
    DiscretePosterior

    Examples
    --------
    >>> post = discrete_posterior([-1.1, 0.2, 2.9], 0.5, [-1.0, 0.0, 3.0], [0.3, 0.4, 0.3])
    >>> post.map_atom.tolist()
    [-1.0, 0.0, 3.0]
    """
    x = check_finite_array(x, "x", ndim=(1, 2))
    x2 = _as_2d(x)
    s = check_finite_array(s, "s", ndim=(0, 1))
    s = np.full(x2.shape[0], float(s)) if s.ndim == 0 else s
    if s.shape != (x2.shape[0],) or np.any(s <= 0):
        raise ValueError(f"s must be > 0, a scalar or of shape ({x2.shape[0]},)")
    atoms, atoms2, probs = _prior_iv(atoms, probs, x2.shape[1])
    with np.errstate(divide="ignore"):
        log_prob = np.log(probs)
    weights, mean, trace_var = _kernels._discrete_posterior(x2, s * s, atoms2, log_prob)
    d = x2.shape[1]
    return DiscretePosterior(mean if x.ndim == 2 else mean[:, 0], trace_var / d, weights,
                             atoms if x.ndim == 2 or atoms.ndim == 1 else atoms2[:, 0])


def expected_posterior_variance(atoms, probs, sigma_x, n, *, n_samples=100_000, rng=None):
    """Monte Carlo estimate of the Bayes risk (MMSE) of Theorem 5's estimator.

    The MMSE is E[sum_l w_l |mu_l - theta_hat|^2], the expected posterior variance
    (summed over coordinates; spec C.8 [D]). Draws theta ~ prior and
    xbar ~ N(theta, sigma_x^2/n I).

    Returns
    -------
    estimate, standard_error : float
    """
    atoms_arr = check_finite_array(atoms, "atoms", ndim=(1, 2))
    d = 1 if atoms_arr.ndim == 1 else atoms_arr.shape[1]
    atoms_arr, atoms2, probs = _prior_iv(atoms_arr, probs, d)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    n = check_int_scalar(n, "n", minimum=1)
    n_samples = check_int_scalar(n_samples, "n_samples", minimum=2)
    rng = as_generator(rng)
    theta = atoms2[rng.choice(atoms2.shape[0], size=n_samples, p=probs)]
    xbar = theta + sigma_x / math.sqrt(n) * rng.standard_normal(theta.shape)
    post = discrete_posterior(xbar, sigma_x / math.sqrt(n), atoms2, probs)
    total = post.var * d
    return float(total.mean()), float(total.std(ddof=1) / math.sqrt(n_samples))


def lemma1_radius(d, sigma_x, n, m, r):
    r"""Lemma 1's radius: with probability >= 1 - 1/(mn) every |xbar_i| is at most

    .. math:: 4\sqrt{d\sigma_x^2/n} + 2\sqrt{\log(m^2 n)\sigma_x^2/n} + r.

    Parameters
    ----------
    d : int
        Dimension.
    sigma_x : float
        Data noise sd.
    n, m : int
        Samples per client and number of clients.
    r : float
        Bound on the atoms' norms, |mu_l| <= r.

    Examples
    --------
    >>> round(lemma1_radius(1, 1.0, 100, 1000, 2.0), 4)
    3.2584
    """
    d = check_int_scalar(d, "d", minimum=1)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    n = check_int_scalar(n, "n", minimum=1)
    m = check_int_scalar(m, "m", minimum=1)
    r = float(check_finite_array(r, "r", ndim=0))
    if r < 0:
        raise ValueError(f"r must be >= 0, got {r}")
    return (4.0 * math.sqrt(d * sigma_x**2 / n)
            + 2.0 * math.sqrt(math.log(m * m * n) * sigma_x**2 / n) + r)


def kmeans_cluster(points, k, rng):
    """Default clustering step of Algorithm 1: scikit-learn's KMeans (Lloyd, k-means++ init).

    Returns the centres (k, d) and each point's cluster label (m,).
    """
    from sklearn.cluster import KMeans

    seed = int(rng.integers(2**31 - 1))
    km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(points)
    return km.cluster_centers_, km.labels_


@dataclass(frozen=True)
class DiscreteMixtureFit:
    """Result of Algorithm 1.

    Attributes
    ----------
    estimate : ndarray of shape (m,) or (m, d)
        theta_i^T, the personalized estimates after the last iteration.
    atoms : ndarray of shape (k,) or (k, d)
        The last clustering's centres mu_l^(T).
    probs : ndarray of shape (k,)
        Cluster proportions p_l^(T) = |S_l| / m.
    posterior : DiscretePosterior
        Theorem 5 posterior under (atoms, probs), whose mean is ``estimate``.
    history : list of dict
        Per iteration t: ``atoms``, ``probs``, ``max_change`` (largest
        |theta_i^t - theta_i^(t-1)|) and ``n_clipped`` (coordinates or vectors
        clipped before sending).
    privacy : dict or None
        For a private channel: per-round (epsilon, delta), the number of
        releases, and the composed epsilon at ``delta_total`` from dp-accounting.
    """

    estimate: np.ndarray
    atoms: np.ndarray
    probs: np.ndarray
    posterior: DiscretePosterior
    history: list
    privacy: dict | None = None


def _clip_to_ball(points, radius):
    norms = np.linalg.norm(points, axis=1)
    scale = np.minimum(1.0, radius / np.maximum(norms, 1e-300))
    return points * scale[:, None], int(np.count_nonzero(norms > radius))


def discrete_mixture_eb(xbar, n, *, sigma_x, n_atoms, n_iter=10, cluster=kmeans_cluster,
                        mechanism=None, radius=None, delta_total=None, rng=None):
    r"""Algorithm 1: personalized estimation with an unknown discrete-mixture prior.

    theta_i^0 = xbar_i; then for t = 1..T the server clusters the clients' latest
    theta^(t-1) into k groups (centres mu_l^(t), proportions p_l^(t) = |S_l|/m),
    broadcasts them, and each client updates theta_i^t to the Theorem 5 posterior
    mean under that prior. The server clusters before the clients update, the
    order the spec fixes for the printed step order (spec [!7]).

    Parameters
    ----------
    xbar : array_like, shape (m,) or (m, d)
        Client means.
    n : int or array_like of int, shape (m,)
        Samples per client.
    sigma_x : float
        Known data noise sd (s_i = sigma_x / sqrt(n_i)).
    n_atoms : int
        k, the number of atoms, 1 <= k <= m.
    n_iter : int, default=10
        T.
    cluster : callable, default=kmeans_cluster
        ``cluster(points, k, rng) -> (centres (k, d), labels (m,))``.
    mechanism : Mechanism, optional
        What each client applies to theta_i^(t-1) before sending it (Lemma 1
        recipe): the vector is first clipped to the L2 ball of ``radius``, then
        passed through the mechanism coordinate-wise, e.g.
        ``StochasticQuantizer(k_bits, radius)`` (communication) or
        ``GaussianMechanism(eps, delta, radius, d, calibration="l2")`` (privacy;
        the ball lies inside the cube [-radius, radius]^d it is calibrated for).
        Clients keep their exact xbar_i for their own posterior.
    radius : float, optional
        Clipping radius; required with ``mechanism``, e.g. :func:`lemma1_radius`.
    delta_total : float, optional
        For a private mechanism, the delta at which the composed epsilon over
        the T releases is reported (default: T times the per-round delta).
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    DiscreteMixtureFit

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> theta = rng.choice([-4.0, 0.0, 4.0], size=600)
    >>> xbar = theta + rng.normal(0, 0.5, size=600)
    >>> fit = discrete_mixture_eb(xbar, 4, sigma_x=1.0, n_atoms=3, rng=1)
    >>> np.round(np.sort(fit.atoms)).tolist()
    [-4.0, 0.0, 4.0]
    """
    xbar = check_finite_array(xbar, "xbar", ndim=(1, 2), min_len=1)
    x2 = _as_2d(xbar)
    m, d = x2.shape
    n_arr = np.broadcast_to(_n_iv(n, m), (m,))
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    n_atoms = check_int_scalar(n_atoms, "n_atoms", minimum=1)
    if n_atoms > m:
        raise ValueError(f"n_atoms must be <= the number of clients {m}, got {n_atoms}")
    n_iter = check_int_scalar(n_iter, "n_iter", minimum=1)
    if mechanism is not None and radius is None:
        raise ValueError("a mechanism needs the clipping radius (e.g. lemma1_radius(...))")
    if radius is not None:
        radius = check_positive_scalar(radius, "radius")
    rng = as_generator(rng)
    s = sigma_x / np.sqrt(n_arr)
    theta = x2.copy()
    history = []
    for _ in range(n_iter):
        sent, n_clipped = theta, 0
        if mechanism is not None:
            sent, n_clipped = _clip_to_ball(theta, radius)
            sent = mechanism.privatize(sent, rng)
        centres, labels = cluster(sent, n_atoms, rng)
        centres = np.asarray(centres, dtype=np.float64).reshape(n_atoms, d)
        probs = np.bincount(np.asarray(labels), minlength=n_atoms) / m
        post = discrete_posterior(x2, s, centres, probs)
        history.append({"atoms": centres, "probs": probs, "n_clipped": n_clipped,
                        "max_change": float(np.max(np.abs(post.mean - theta)))})
        theta = post.mean
    privacy = _composed_privacy(mechanism, n_iter, delta_total)
    if xbar.ndim == 1:
        post = DiscretePosterior(post.mean[:, 0], post.var, post.weights, post.atoms[:, 0])
    return DiscreteMixtureFit(post.mean, post.atoms, probs, post, history, privacy)


def _composed_privacy(mechanism, n_releases, delta_total):
    """Per-round (eps, delta) and the T-fold composition of a Gaussian mechanism (dp-accounting)."""
    guarantee = getattr(mechanism, "privacy", None)
    if guarantee is None:
        return None
    out = {"epsilon_per_round": guarantee.epsilon, "delta_per_round": guarantee.delta,
           "n_releases": n_releases,
           "basic_composition": (n_releases * guarantee.epsilon, n_releases * guarantee.delta)}
    sigma = getattr(mechanism, "sigma", None)
    if sigma is not None:
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant

        delta_total = n_releases * guarantee.delta if delta_total is None else delta_total
        # Add/remove relation: the noise multiplier is std / L2 sensitivity (unambiguous).
        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(dp_event.GaussianDpEvent(sigma / mechanism.sensitivity), n_releases)
        out.update(delta_total=delta_total, epsilon_composed=float(acc.get_epsilon(delta_total)))
    return out
