"""Discrete-mixture priors: Theorem 5 (known prior) and Algorithm 1 (unknown prior).

Client parameters take one of k values, theta_i in {mu_1, ..., mu_k} with
probabilities p_l, and client i reports xbar_i ~ N(theta_i, s_i^2 I_d) with
s_i = sigma_x / sqrt(n_i). Only xbar_i matters: the full-data
exponent ``sum_j |X_ij - mu_l|^2`` differs from ``n_i |xbar_i - mu_l|^2`` by a term
that does not depend on l.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    INT64_MAX,
    as_generator,
    check_callable,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
    check_standard_errors,
)
from ebfl.eb import _kernels

__all__ = [
    "DiscreteMixtureFit",
    "DiscretePosterior",
    "discrete_mixture_eb",
    "discrete_posterior",
    "expected_posterior_variance",
    "kmeans_cluster",
    "lemma1_radius",
    "run_cluster",
]


@dataclass(frozen=True)
class DiscretePosterior:
    """Posterior of every client over the k atoms (Theorem 5).

    Attributes
    ----------
    mean : ndarray of shape (m,) or (m, d)
        Posterior means sum_l w_il mu_l, the Bayes (MMSE) estimates, eq. (9).
    var : ndarray of shape (m,)
        Posterior variance per coordinate: ``sum_l w_il |mu_l - mean_i|^2 / d``.
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


#: Largest |value| of client means and atoms: their squared distances (<= 4e300 d)
#: then stay finite.
MAX_ABS = 1e150


def _as_2d(x):
    return x if x.ndim == 2 else x[:, None]


def _points_iv(x, name):
    """Client means or atoms: finite, |values| <= MAX_ABS, shape (m,) or (m, d) with d >= 1."""
    x = check_finite_array(x, name, ndim=(1, 2), max_abs=MAX_ABS)
    if x.ndim == 2 and x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one coordinate, got shape {x.shape}")
    return x


def _prior_iv(atoms, probs, d):
    atoms = _points_iv(atoms, "atoms")
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
        Client means xbar_i, each ``|value| <= 1e150``.
    s : float or array_like, shape (m,)
        Their standard errors sigma_x / sqrt(n_i), in [1e-150, 1e150].
    atoms : array_like, shape (k,) or (k, d)
        Support mu_1..mu_k of the prior, each ``|value| <= 1e150``.
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
    x = _points_iv(x, "x")
    x2 = _as_2d(x)
    s = check_standard_errors(s, "s", x2.shape[0])
    atoms, atoms2, probs = _prior_iv(atoms, probs, x2.shape[1])
    weights, mean, trace_var = _posterior(x2, s, atoms2, probs)
    d = x2.shape[1]
    return DiscretePosterior(mean if x.ndim == 2 else mean[:, 0], trace_var / d, weights,
                             atoms if x.ndim == 2 or atoms.ndim == 1 else atoms2[:, 0])


def _posterior(x2, s, atoms2, probs):
    """Theorem 5 on validated input: weights (m, k), means (m, d), summed variances (m,)."""
    with np.errstate(divide="ignore"):
        log_prob = np.log(probs)
    weights, mean, trace_var = _kernels._discrete_posterior(x2, s * s, atoms2, log_prob)
    far = ~np.all(np.isfinite(weights), axis=1)
    if np.any(far):
        weights[far], mean[far], trace_var[far] = _far_posterior(x2[far], s[far], atoms2,
                                                                 log_prob)
    return weights, mean, trace_var


def _far_posterior(x2, s, atoms2, log_prob):
    """Rows whose every atom is so far in units of s that |x - mu_l|^2 / (2 s^2) overflows.

    The kernel's log-weights are then all -inf (NaN after normalizing). The
    weights only depend on the distances relative to the nearest atom mu_j of
    positive prior mass, |x - mu_l|^2 - |x - mu_j|^2 = (mu_j - mu_l).(2x - mu_l - mu_j),
    written as a product so that it keeps its precision when both distances
    are huge; it is divided by 2 s^2 last. In practice mu_j takes all the mass.
    """
    possible = np.isfinite(log_prob)  # atoms of positive prior mass

    def excess_over(ref):  # |x - mu_l|^2 - |x - mu_ref|^2, shape (rows, k)
        mu_ref = atoms2[ref]  # (rows, d)
        return np.einsum("rkd,rkd->rk", mu_ref[:, None, :] - atoms2[None],
                         2.0 * x2[:, None, :] - atoms2[None] - mu_ref[:, None, :])

    first = np.full(x2.shape[0], np.flatnonzero(possible)[0])
    nearest = np.argmin(np.where(possible, excess_over(first), np.inf), axis=1)
    with np.errstate(over="ignore"):  # excess -> inf: weight 0
        excess = np.where(possible, excess_over(nearest), 0.0) / (2.0 * s[:, None] ** 2)
    logits = log_prob - excess
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    mean = weights @ atoms2
    trace_var = np.sum(weights * np.sum((atoms2[None] - mean[:, None, :]) ** 2, axis=2), axis=1)
    return weights, mean, trace_var


def expected_posterior_variance(atoms, probs, sigma_x, n, *, n_samples=100_000, rng=None):
    """Monte Carlo estimate of the Bayes risk (MMSE) of Theorem 5's estimator.

    The MMSE is ``E[sum_l w_l |mu_l - theta_hat|^2]``, the expected posterior variance
    (summed over coordinates). Draws theta ~ prior and
    xbar ~ N(theta, sigma_x^2/n I).

    Returns
    -------
    estimate, standard_error : float
    """
    atoms_arr = _points_iv(atoms, "atoms")
    d = 1 if atoms_arr.ndim == 1 else atoms_arr.shape[1]
    atoms_arr, atoms2, probs = _prior_iv(atoms_arr, probs, d)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    n = check_int_scalar(n, "n", minimum=1, maximum=INT64_MAX)
    n_samples = check_int_scalar(n_samples, "n_samples", minimum=2, maximum=INT64_MAX)
    s = check_standard_errors(sigma_x / math.sqrt(n), "sigma_x / sqrt(n)", 1)
    rng = as_generator(rng)
    theta = atoms2[rng.choice(atoms2.shape[0], size=n_samples, p=probs / probs.sum())]
    xbar = theta + s[0] * rng.standard_normal(theta.shape)
    _, _, total = _posterior(xbar, np.full(n_samples, s[0]), atoms2, probs)
    return float(total.mean()), float(total.std(ddof=1) / math.sqrt(n_samples))


def lemma1_radius(d, sigma_x, n, m, r):
    r"""Lemma 1's radius: with probability >= 1 - 1/(mn) every ``|xbar_i|`` is at most

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
        Bound on the atoms' norms, ``|mu_l| <= r``.

    Examples
    --------
    >>> round(lemma1_radius(1, 1.0, 100, 1000, 2.0), 4)
    3.2584
    """
    d = check_int_scalar(d, "d", minimum=1, maximum=INT64_MAX)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    n = check_int_scalar(n, "n", minimum=1, maximum=INT64_MAX)
    m = check_int_scalar(m, "m", minimum=1, maximum=INT64_MAX)
    if isinstance(r, np.ndarray) and r.ndim == 0:
        r = r.item()
    r = check_nonnegative_scalar(r, "r")
    # sigma_x / sqrt(n) is factored out: sigma_x**2 would overflow in Python floats.
    se = sigma_x / math.sqrt(n)
    radius = (4.0 * math.sqrt(d) + 2.0 * math.sqrt(math.log(m * m * n))) * se + r
    if not math.isfinite(radius):
        raise ValueError(f"sigma_x = {sigma_x!r} and r = {r!r} are too large: the radius "
                         "overflows float64")
    return radius


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
        Cluster proportions ``p_l^(T) = |S_l| / m``.
    posterior : DiscretePosterior
        Theorem 5 posterior under (atoms, probs), whose mean is ``estimate``.
    history : list of dict
        Per iteration t: ``atoms``, ``probs``, ``max_change`` (largest
        ``|theta_i^t - theta_i^(t-1)|``) and ``n_clipped`` (coordinates or vectors
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

    def plot(self, xbar, path=None, *, coordinate=0):
        """The last prior's atoms over the client means, and the estimates' shrinkage.

        Left: a histogram of xbar (shares per bin) with a stem at every atom (its
        proportion). Right: the estimates against xbar, with the identity line and
        the prior mean.

        Parameters
        ----------
        xbar : array_like of shape (m,) or (m, d)
            The client means this fit was run on (a fit keeps no copy of them).
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).
        coordinate : int, default=0
            The coordinate drawn, for d > 1.

        Returns
        -------
        matplotlib.figure.Figure
            Two axes, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> rng = np.random.default_rng(0)
        >>> xbar = rng.choice([-4.0, 4.0], size=200) + rng.normal(0, 0.5, size=200)
        >>> fit = discrete_mixture_eb(xbar, 4, sigma_x=1.0, n_atoms=2, rng=1)
        >>> fig = fit.plot(xbar)
        >>> len(fig.axes)
        2
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl.eb._plots import plot_discrete

        return plot_discrete(self, xbar, coordinate, path)


def _clip_to_ball(points, radius):
    norms = np.linalg.norm(points, axis=1)
    scale = np.minimum(1.0, radius / np.maximum(norms, 1e-300))
    return points * scale[:, None], int(np.count_nonzero(norms > radius))


def discrete_mixture_eb(xbar, n, *, sigma_x, n_atoms, n_iter=10, cluster=kmeans_cluster,
                        mechanism=None, radius=None, delta_total=None, rng=None):
    r"""Algorithm 1: personalized estimation with an unknown discrete-mixture prior.

    theta_i^0 = xbar_i; then for t = 1..T the server clusters the clients' latest
    theta^(t-1) into k groups (centres mu_l^(t), proportions ``p_l^(t) = |S_l|/m``),
    broadcasts them, and each client updates theta_i^t to the Theorem 5 posterior
    mean under that prior. The server clusters before the clients update (the
    printed step order is ambiguous; this is the order that makes it well defined).

    Parameters
    ----------
    xbar : array_like, shape (m,) or (m, d)
        Client means, each ``|value| <= 1e150``.
    n : int or array_like of int, shape (m,)
        Samples per client, >= 1.
    sigma_x : float
        Known data noise sd; s_i = sigma_x / sqrt(n_i) must lie in [1e-150, 1e150].
    n_atoms : int
        k, the number of atoms, 1 <= k <= m.
    n_iter : int, default=10
        T.
    cluster : callable, default=kmeans_cluster
        ``cluster(points, k, rng) -> (centres (k, d), labels (m,))``; the
        centres must be finite with ``|value| <= 1e150``, the labels in 0..k-1.
    mechanism : Mechanism, optional
        What each client applies to theta_i^(t-1) before sending it (Lemma 1
        recipe): the vector is first clipped to the L2 ball of ``radius``, then
        passed through the mechanism coordinate-wise, e.g.
        ``StochasticQuantizer(k_bits, radius)`` (communication) or
        ``GaussianMechanism(eps, delta, radius, d, calibration="l2")`` (privacy;
        the ball lies inside the cube [-radius, radius]^d it is calibrated for).
        Clients keep their exact xbar_i for their own posterior.
    radius : float, optional
        Clipping radius in (0, 1e150]; required with ``mechanism`` (and only
        then), e.g. :func:`lemma1_radius`.
    delta_total : float, optional
        For a Gaussian mechanism, the delta in (0, 1) at which the composed
        epsilon over the T releases is reported (default: T times the
        per-round delta).
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
    xbar = _points_iv(xbar, "xbar")
    x2 = _as_2d(xbar)
    m, d = x2.shape
    n_arr = _n_iv(n, m)
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    s = check_standard_errors(sigma_x / np.sqrt(n_arr), "sigma_x / sqrt(n)", m)
    n_atoms = check_int_scalar(n_atoms, "n_atoms", minimum=1, maximum=m)
    n_iter = check_int_scalar(n_iter, "n_iter", minimum=1)
    check_callable(cluster, "cluster", "cluster(points, k, rng) -> (centres, labels)")
    radius = _channel_iv(mechanism, radius, d)
    delta_total = _delta_total_iv(delta_total, mechanism)
    rng = as_generator(rng)
    theta = x2.copy()
    history = []
    for _ in range(n_iter):
        sent, n_clipped = theta, 0
        if mechanism is not None:
            sent, n_clipped = _clip_to_ball(theta, radius)
            sent = _mechanism_output(mechanism.privatize(sent, rng), sent.shape)
        centres, labels = run_cluster(cluster, sent, n_atoms, rng)
        probs = np.bincount(labels, minlength=n_atoms) / m
        weights, mean, trace_var = _posterior(x2, s, centres, probs)
        history.append({"atoms": centres, "probs": probs, "n_clipped": n_clipped,
                        "max_change": float(np.max(np.abs(mean - theta)))})
        theta = mean
    privacy = _composed_privacy(mechanism, n_iter, delta_total)
    post = DiscretePosterior(mean, trace_var / d, weights, centres)
    if xbar.ndim == 1:
        post = DiscretePosterior(post.mean[:, 0], post.var, post.weights, post.atoms[:, 0])
    return DiscreteMixtureFit(post.mean, post.atoms, probs, post, history, privacy)


def _n_iv(n, m):
    """Samples per client as a float64 array of shape (m,) (a scalar is broadcast)."""
    if np.ndim(n) == 0 and not isinstance(n, np.ndarray):
        return np.full(m, float(check_int_scalar(n, "n", minimum=1, maximum=INT64_MAX)))
    if isinstance(n, np.ndarray) and n.ndim == 0:
        return _n_iv(n.item(), m)
    n_arr = check_counts(n, "n", minimum=1)
    if n_arr.shape != (m,):
        raise ValueError(f"n must be a scalar or have shape ({m},), got {n_arr.shape}")
    return n_arr.astype(np.float64)


def _channel_iv(mechanism, radius, d):
    """The clipping radius of a mechanism channel (None without a mechanism)."""
    if mechanism is None:
        if radius is not None:
            raise ValueError("radius clips what a mechanism releases: give a mechanism too, "
                             "or leave radius unset")
        return None
    if not callable(getattr(mechanism, "privatize", None)):
        raise TypeError("mechanism must be a Mechanism with a privatize(x, rng) method, got "
                        f"{type(mechanism).__name__}")
    mech_d = getattr(mechanism, "d", None)
    if isinstance(mech_d, int) and mech_d != d:
        raise ValueError(f"mechanism is calibrated for d={mech_d} coordinates, but xbar has "
                         f"d={d}")
    if radius is None:
        raise ValueError("a mechanism needs the clipping radius (e.g. lemma1_radius(...))")
    return check_real_scalar(radius, "radius", low=0.0, high=MAX_ABS, low_open=True)


def _delta_total_iv(delta_total, mechanism):
    if delta_total is None:
        return None
    if getattr(mechanism, "sigma", None) is None or getattr(mechanism, "privacy", None) is None:
        raise ValueError("delta_total sets the delta of the composed epsilon of a Gaussian "
                         "mechanism: give such a mechanism, or leave delta_total unset")
    return check_real_scalar(delta_total, "delta_total", low=0.0, high=1.0, low_open=True,
                             high_open=True)


def _mechanism_output(sent, shape):
    try:
        sent = check_finite_array(sent, "mechanism output", max_abs=MAX_ABS)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mechanism.privatize must return finite values in [-{MAX_ABS:g}, "
                         f"{MAX_ABS:g}]: {exc}") from None
    if sent.shape != shape:
        raise ValueError(f"mechanism.privatize must return the shape of its input {shape}, "
                         f"got {sent.shape}")
    return sent


def run_cluster(cluster, points, k, rng):
    """Call a clustering step ``cluster(points, k, rng)`` and check what it returned.

    Parameters
    ----------
    cluster : callable
        ``cluster(points, k, rng) -> (centres, labels)``, e.g. :func:`kmeans_cluster`.
    points : ndarray, shape (m, d)
    k : int
    rng : numpy.random.Generator

    Returns
    -------
    centres : ndarray, shape (k, d)
    labels : ndarray of int, shape (m,)
        Each point's cluster, in 0..k-1.

    Raises
    ------
    TypeError, ValueError
        When ``cluster`` returns anything else, naming what was wrong.
    """
    m, d = points.shape
    return _cluster_output(*_pair(cluster(points, k, rng)), k, m, d)


def _pair(out):
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise TypeError("cluster must return a pair (centres, labels), got "
                        f"{type(out).__name__}")
    return out


def _cluster_output(centres, labels, k, m, d):
    """Check what ``cluster`` returned: centres (k, d) and labels (m,) in 0..k-1."""
    try:
        centres = check_finite_array(centres, "centres", ndim=(1, 2), max_abs=MAX_ABS)
        labels = check_counts(labels, "labels", minimum=0)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cluster returned bad output: {exc}") from None
    if centres.size != k * d or centres.shape[0] != k:
        raise ValueError(f"cluster must return centres of shape ({k}, {d}), got {centres.shape}")
    if labels.shape != (m,) or labels.max() >= k:
        raise ValueError(f"cluster must return one label in 0..{k - 1} per client ({m}), got "
                         f"shape {labels.shape} with largest label {labels.max()}")
    return centres.reshape(k, d), labels


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
