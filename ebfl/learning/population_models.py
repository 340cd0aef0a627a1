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
    check_bool,
    check_callable,
    check_int_scalar,
    check_positive_scalar,
)
from ebfl.eb.discrete import kmeans_cluster, run_cluster
from ebfl.learning.data import _mu0_iv, _variance_iv
from ebfl.learning.federated import (
    RegressionAlgorithm,
    _initial_mean,
    _initial_models,
    _message,
    _replace_rows,
    _scalar,
    round_rng,
)
from ebfl.learning.regression import _objective_iv, _residual, _rows
from ebfl.learning.theorem6 import local_least_squares

__all__ = ["DiscreteMixtureLinear", "GaussianMixtureLinear", "LaplaceLinear",
           "laplace_objective"]

_CLUSTER_SIGNATURE = "cluster(points, k, rng) -> (centres (k, d), labels (m,))"


def _clusters(theta, k, rng, cluster):
    centres, labels = run_cluster(cluster, theta, k, rng)
    probs = np.bincount(labels, minlength=k) / labels.size
    return centres, probs, labels


def _k_iv(k, run):
    """The number of atoms or clusters must not exceed the number of clients."""
    if k > run.n_clients:
        raise ValueError(f"k must be <= the number of clients m={run.n_clients}, got {k}")


class _Clustered(RegressionAlgorithm):
    """A population of k clusters that the server finds in the clients' models.

    The clients start from their local least-squares fits. Until the server has
    heard from k clients it has no clusters to broadcast: a sampled client then
    sends its current model unchanged (the initialization exchange, a round of
    communication of its own). After that, every round the server clusters the
    latest models of the clients it has heard from. The server's own draws
    (k-means restarts) come from its stream of the round.
    """

    def _init_server(self, run):
        _k_iv(self.k, run)
        return {"seen": np.zeros(run.n_clients, bool)}

    def init_clients(self, run, data, clients):
        return {"theta": local_least_squares(data)}  # theta_i^0 = (X^T X)^+ X^T Y

    def broadcast(self, server, rc):
        return _message(**{key: server[key] for key in self._prior_keys if key in server})

    def client_train(self, message, client, data, rc):
        if message:
            client["theta"] = self._update(message, client["theta"], data)
        return {"theta": client["theta"]}

    def aggregate(self, server, replies, weights, rc):
        new = dict(server)
        new["theta"] = _replace_rows(server, "theta", rc, replies["theta"], 0.0)
        new["seen"] = server["seen"].copy()
        new["seen"][rc.clients] = True
        if new["seen"].sum() >= self.k:
            new.update(self._server(new["theta"][new["seen"]], round_rng(rc)))
        return new

    def summary(self, server):
        out = {"probs": server["probs"].round(4).tolist()} if "probs" in server else {}
        if "var" in server:
            out["var"] = server["var"].tolist()
        return out


class DiscreteMixtureLinear(_Clustered):
    """Algorithm 7 (Appendix B): theta_i in {mu_1..mu_k}, unknown atoms and proportions.

    The server broadcasts the atoms and proportions; each sampled client weights
    the atoms by their likelihood on its data and replies its posterior mean;
    the server clusters the clients' models (k-means) into new atoms and
    proportions.

    Parameters
    ----------
    k : int
        Number of atoms, at most the number of clients.
    sigma_x2 : float
        Known noise variance, in [1e-300, 1e150].
    cluster : callable
        ``cluster(points, k, rng) -> (centres, labels)``; scikit-learn's KMeans by default.
    """

    name = "discrete-mixture-linear"
    _prior_keys = ("atoms", "probs")

    def __init__(self, k, sigma_x2, *, cluster=kmeans_cluster):
        self.k = check_int_scalar(k, "k", minimum=1)
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.cluster = check_callable(cluster, "cluster", _CLUSTER_SIGNATURE)

    def init_server(self, run):
        return self._init_server(run)

    def weights(self, atoms, probs, data):
        """Posterior weights w_l^(i) of the atoms for the clients of ``data``, shape (m, k)."""
        X, Y, mask = _rows(data)
        pred = np.einsum("mnd,ld->mnl", X, atoms)
        sq = np.sum(((Y[..., None] - pred) * mask[..., None]) ** 2, axis=1)
        # Distances from each client's best atom: the weights are unchanged, and
        # that atom's log-weight stays finite when sq / (2 sigma_x^2) overflows.
        possible = probs > 0
        sq -= np.min(np.where(possible, sq, np.inf), axis=1, keepdims=True)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            log_w = np.where(possible, np.log(probs) - sq / (2 * self.sigma_x2), -np.inf)
        return np.exp(log_w - special.logsumexp(log_w, axis=1, keepdims=True))

    def _update(self, message, theta, data):
        return self.weights(message["atoms"], message["probs"], data) @ message["atoms"]

    def _server(self, theta, rng):
        atoms, probs, _ = _clusters(theta, self.k, rng, self.cluster)
        return {"atoms": atoms, "probs": probs}


class GaussianMixtureLinear(_Clustered):
    """Algorithm 4: one gradient step per round on f_i + R_i with a Gaussian-mixture prior.

    The server broadcasts the clusters (centres, proportions, variances); each
    sampled client takes a gradient step on its loss plus the mixture
    regularizer and replies its model; the server clusters the models.

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

    name = "gaussian-mixture-linear"
    _prior_keys = ("atoms", "probs", "var")

    def __init__(self, k, lr, sigma_x2, *, min_var=1e-6, cluster=kmeans_cluster):
        self.k = check_int_scalar(k, "k", minimum=1)
        self.lr = check_positive_scalar(lr, "lr")
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.min_var = _variance_iv(min_var, "min_var")
        self.cluster = check_callable(cluster, "cluster", _CLUSTER_SIGNATURE)

    def init_server(self, run):
        return self._init_server(run)

    def _server(self, theta, rng):
        atoms, probs, labels = _clusters(theta, self.k, rng, self.cluster)
        d = theta.shape[1]
        var = np.array([np.mean(np.sum((theta[labels == l] - atoms[l]) ** 2, axis=1)) / d
                        if np.any(labels == l) else self.min_var for l in range(self.k)])
        return {"atoms": atoms, "probs": probs, "var": np.maximum(var, self.min_var)}

    def prior_gradient(self, theta, atoms, probs, var):
        """grad of -log sum_l p_l N(theta; mu_l, s_l I): sum_l r_l (theta - mu_l)/s_l."""
        d = theta.shape[1]
        diff = theta[:, None, :] - atoms[None]
        with np.errstate(divide="ignore"):
            log_r = (np.log(probs) - 0.5 * d * np.log(var)
                     - np.sum(diff**2, axis=2) / (2 * var))
        resp = np.exp(log_r - special.logsumexp(log_r, axis=1, keepdims=True))
        return np.einsum("ml,mld->md", resp / var, diff)

    def _update(self, message, theta, data):
        rows = _rows(data)
        grad = (-np.einsum("mnd,mn->md", rows[0], _residual(rows, theta)) / self.sigma_x2
                + self.prior_gradient(theta, message["atoms"], message["probs"],
                                      message["var"]))
        return theta - self.lr * grad


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


class LaplaceLinear(RegressionAlgorithm):
    """l1 population model: proximal-gradient client steps, block-minimizer server updates.

    The server broadcasts (mu, b); each sampled client takes a proximal gradient
    step and replies its model; the server keeps every client's latest model and
    sets mu to their coordinate-wise median and b to their mean absolute deviation.

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

    name = "laplace-linear"

    def __init__(self, lr, sigma_x2, *, learn_prior=True, mu0=None, b0=1.0, floor=1e-8):
        self.lr = check_positive_scalar(lr, "lr")
        self.sigma_x2 = _variance_iv(sigma_x2, "sigma_x2")
        self.learn_prior = check_bool(learn_prior, "learn_prior")
        self.mu0 = _mu0_iv(mu0)
        self.b0 = _variance_iv(b0, "b0")
        self.floor = _variance_iv(floor, "floor")

    def init_server(self, run):
        return {"mu": _initial_mean(self.mu0), "b": self.b0}

    def init_clients(self, run, data, clients):
        return _initial_models(data, self.mu0)

    def broadcast(self, server, rc):
        return _message(mu=server["mu"], b=server["b"])

    def client_train(self, message, client, data, rc):
        rows = _rows(data)
        mu, b = message["mu"], _scalar(message["b"])
        theta = client["theta"]
        z = theta + self.lr * np.einsum("mnd,mn->md", rows[0], _residual(rows, theta)) \
            / self.sigma_x2
        # prox of (lr/b)|theta - mu|_1: soft-threshold z - mu at lr/b.
        shift = z - mu
        client["theta"] = mu + np.sign(shift) * np.maximum(np.abs(shift) - self.lr / b, 0.0)
        return {"theta": client["theta"]} if self.learn_prior else {}

    def aggregate(self, server, replies, weights, rc):
        if not self.learn_prior:
            return server
        # A client not heard from yet still holds theta_i^0 = mu0, the initial mu.
        d = replies["theta"].shape[1]
        theta = _replace_rows(server, "theta", rc, replies["theta"],
                              np.broadcast_to(server["mu"], (d,)))
        mu = np.median(theta, axis=0)
        return {"mu": mu, "b": max(float(np.mean(np.abs(theta - mu))), self.floor),
                "theta": theta}

    def summary(self, server):
        return {"b": server["b"]}

    def objective(self, server, clients, data):
        return {"objective": _laplace_objective(data, clients["theta"], server["mu"],
                                                server["b"], self.sigma_x2)}
