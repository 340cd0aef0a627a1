r"""Other population priors for federated linear regression (Section 3).

* :class:`DiscreteMixtureLinear`: Algorithm 7. Clients weight the current atoms
  by their likelihood and send the posterior mean; the server clusters the
  clients' models (k-means) into new atoms and proportions. It is FedEM
  applied to linear regression, with clustering in place of averaging.
* :class:`GaussianMixtureLinear`: Algorithm 4. Each client takes a gradient step
  on its loss plus the *corrected* Gaussian-mixture regularizer
  -log sum_l p_l N(theta; mu_l, s_l I) (errata [!9]). The server clusters the
  models and also returns the per-cluster variances, which the printed line 12
  omits.
* :class:`LaplaceLinear`: the l1 / Laplace population model of Section 3, for
  which the paper gives only the objective. The theta step is a proximal
  gradient step (soft-thresholding towards mu, the exact prox of
  ``|theta - mu|_1 / b``). The server updates mu and b with the block minimizers
  (coordinate-wise median and mean absolute deviation); the
  printed per-coordinate regularizer's missing factor d is restored (errata [!9]).
  Like Algorithm 2, the joint MAP over (theta_i, mu, b) is unbounded below
  (theta_i = mu, b -> 0; errata [!10]): with few clients or little data b
  collapses to ``floor``; keep the prior fixed (``learn_prior=False``) or use
  enough clients.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ebfl._validation import (
    as_generator,
    check_bool,
    check_callable,
    check_int_scalar,
    check_positive_scalar,
)
from ebfl.eb.discrete import kmeans_cluster, run_cluster
from ebfl.learning.data import _data_iv, _mean_iv, _mu0_iv, _variance_iv
from ebfl.learning.regression import _objective_iv, _residual, _rows
from ebfl.learning.theorem6 import local_least_squares

__all__ = ["DiscreteMixtureLinear", "GaussianMixtureLinear", "LaplaceLinear",
           "laplace_objective"]

_CLUSTER_SIGNATURE = "cluster(points, k, rng) -> (centres (k, d), labels (m,))"


def _clusters(theta, k, rng, cluster):
    centres, labels = run_cluster(cluster, theta, k, as_generator(rng))
    probs = np.bincount(labels, minlength=k) / labels.size
    return centres, probs, labels


def _k_iv(k, data):
    """The number of atoms or clusters must not exceed the number of clients."""
    if k > _data_iv(data).n_clients:
        raise ValueError(f"k must be <= the number of clients m={data.n_clients}, got {k}")
    return data


class DiscreteMixtureLinear:
    """Algorithm 7 (Appendix B): theta_i in {mu_1..mu_k}, unknown atoms and proportions.

    Parameters
    ----------
    k : int
        Number of atoms, at most the number of clients.
    sigma_x2 : float
        Known noise variance, in [1e-300, 1e150].
    cluster : callable
        ``cluster(points, k, rng) -> (centres, labels)``; scikit-learn's KMeans by default.
    """

    def __init__(self, k, sigma_x2, *, cluster=kmeans_cluster):
        self.k = check_int_scalar(k, "k", minimum=1)
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.cluster = check_callable(cluster, "cluster", _CLUSTER_SIGNATURE)

    def init(self, data, rng):
        theta = local_least_squares(_k_iv(self.k, data))  # theta_i^0 = (X^T X)^+ X^T Y
        atoms, probs, _ = _clusters(theta, self.k, rng, self.cluster)
        return {"theta": theta, "atoms": atoms, "probs": probs}

    def weights(self, state, data, active=None):
        """Posterior weights w_l^(i) of the atoms, shape (len(active), k)."""
        X, Y, mask = _rows(data, active)
        pred = np.einsum("mnd,ld->mnl", X, state["atoms"])
        sq = np.sum(((Y[..., None] - pred) * mask[..., None]) ** 2, axis=1)
        # Distances from each client's best atom: the weights are unchanged, and
        # that atom's log-weight stays finite when sq / (2 sigma_x^2) overflows.
        possible = state["probs"] > 0
        sq -= np.min(np.where(possible, sq, np.inf), axis=1, keepdims=True)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            log_w = np.where(possible, np.log(state["probs"]) - sq / (2 * self.sigma_x2),
                             -np.inf)
        return np.exp(log_w - special.logsumexp(log_w, axis=1, keepdims=True))

    def round(self, state, data, active, rng):
        new = dict(state)
        new["theta"] = state["theta"].copy()
        new["theta"][active] = self.weights(state, data, active) @ state["atoms"]
        new["atoms"], new["probs"], _ = _clusters(new["theta"], self.k, rng, self.cluster)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"probs": state["probs"].round(4).tolist()}


class GaussianMixtureLinear:
    """Algorithm 4: one gradient step per round on f_i + R_i with a Gaussian-mixture prior.

    Parameters
    ----------
    k : int
        Number of clusters, at most the number of clients.
    lr : float
    sigma_x2 : float
        Noise variance in ``f_i = |Y_i - X_i theta|^2 / (2 sigma_x^2)``, in [1e-300, 1e150].
    min_var : float
        Floor on the clusters' variances.
    cluster : callable
        As in :class:`DiscreteMixtureLinear`.
    """

    def __init__(self, k, lr, sigma_x2, *, min_var=1e-6, cluster=kmeans_cluster):
        self.k = check_int_scalar(k, "k", minimum=1)
        self.lr = check_positive_scalar(lr, "lr")
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.min_var = _variance_iv(min_var, "min_var")
        self.cluster = check_callable(cluster, "cluster", _CLUSTER_SIGNATURE)

    def _server(self, theta, rng):
        atoms, probs, labels = _clusters(theta, self.k, rng, self.cluster)
        d = theta.shape[1]
        var = np.array([np.mean(np.sum((theta[labels == l] - atoms[l]) ** 2, axis=1)) / d
                        if np.any(labels == l) else self.min_var for l in range(self.k)])
        return atoms, probs, np.maximum(var, self.min_var)

    def init(self, data, rng):
        theta = local_least_squares(_k_iv(self.k, data))
        atoms, probs, var = self._server(theta, rng)
        return {"theta": theta, "atoms": atoms, "probs": probs, "var": var}

    def prior_gradient(self, theta, state):
        """grad of -log sum_l p_l N(theta; mu_l, s_l I): sum_l r_l (theta - mu_l)/s_l."""
        d = theta.shape[1]
        diff = theta[:, None, :] - state["atoms"][None]
        with np.errstate(divide="ignore"):
            log_r = (np.log(state["probs"]) - 0.5 * d * np.log(state["var"])
                     - np.sum(diff**2, axis=2) / (2 * state["var"]))
        resp = np.exp(log_r - special.logsumexp(log_r, axis=1, keepdims=True))
        return np.einsum("ml,mld->md", resp / state["var"], diff)

    def round(self, state, data, active, rng):
        rows = _rows(data, active)
        theta = state["theta"][active]
        grad = (-np.einsum("mnd,mn->md", rows[0], _residual(rows, theta)) / self.sigma_x2
                + self.prior_gradient(theta, state))
        new = dict(state)
        new["theta"] = state["theta"].copy()
        new["theta"][active] = theta - self.lr * grad
        new["atoms"], new["probs"], new["var"] = self._server(new["theta"], rng)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"probs": state["probs"].round(4).tolist(), "var": state["var"].tolist()}


def laplace_objective(data, theta, mu, b, sigma_x2):
    """-log p(data, theta) under theta_ij ~ Laplace(mu_j, b) i.i.d. (md log(2b)).

    Parameters
    ----------
    data : RegressionData
    theta : array_like, shape (m, d)
    mu : float or array_like, shape (d,)
    b, sigma_x2 : float
        Laplace scale and noise variance, in [1e-300, 1e150].
    """
    data, theta, mu, (b, sigma_x2) = _objective_iv(data, theta, mu,
                                                   {"b": b, "sigma_x2": sigma_x2})
    return _laplace_objective(data, theta, mu, b, sigma_x2)


def _laplace_objective(data, theta, mu, b, sigma_x2):
    """:func:`laplace_objective` without input checks (for the summaries)."""
    m, _, d = data.X.shape
    r = _residual(_rows(data), theta)
    n_total = data.mask.sum()
    return float(0.5 * n_total * math.log(2 * math.pi * sigma_x2) + np.sum(r**2) / (2 * sigma_x2)
                 + m * d * math.log(2 * b) + np.sum(np.abs(theta - mu)) / b)


class LaplaceLinear:
    """l1 population model: proximal-gradient client steps, block-minimizer server updates.

    Parameters
    ----------
    lr : float
        Step of the client's proximal gradient step (stable below
        sigma_x^2 / lambda_max(X_i^T X_i)).
    sigma_x2 : float
        Known noise variance.
    learn_prior : bool
        Update mu (coordinate-wise median of the theta_i) and b (their mean
        absolute deviation) each round; else keep ``mu0``, ``b0``.
    mu0, b0 :
        Initial prior (mu0 default 0).
    """

    def __init__(self, lr, sigma_x2, *, learn_prior=True, mu0=None, b0=1.0, floor=1e-8):
        self.lr = check_positive_scalar(lr, "lr")
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.learn_prior = check_bool(learn_prior, "learn_prior")
        self.mu0 = _mu0_iv(mu0)
        self.b0 = _variance_iv(b0, "b0")
        self.floor = _variance_iv(floor, "floor")

    def init(self, data, rng):
        d = _data_iv(data).dim
        mu = np.zeros(d) if self.mu0 is None else _mean_iv(self.mu0, d, "mu0").copy()
        return {"theta": np.tile(mu, (data.n_clients, 1)), "mu": mu, "b": self.b0}

    def round(self, state, data, active, rng):
        rows = _rows(data, active)
        mu, b = state["mu"], state["b"]
        theta = state["theta"][active]
        z = theta + self.lr * np.einsum("mnd,mn->md", rows[0], _residual(rows, theta)) \
            / self.sigma_x2
        # prox of (lr/b)|theta - mu|_1: soft-threshold z - mu at lr/b.
        shift = z - mu
        new_theta = mu + np.sign(shift) * np.maximum(np.abs(shift) - self.lr / b, 0.0)
        new = dict(state)
        new["theta"] = state["theta"].copy()
        new["theta"][active] = new_theta
        if self.learn_prior:
            new["mu"] = np.median(new["theta"], axis=0)
            new["b"] = max(float(np.mean(np.abs(new["theta"] - new["mu"]))), self.floor)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"objective": _laplace_objective(data, state["theta"], state["mu"], state["b"],
                                                self.sigma_x2), "b": state["b"]}
