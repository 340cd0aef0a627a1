r"""Personalized logistic regression by empirical Bayes (the corrected Algorithm 3).

Algorithm 3 (:class:`~ebfl.learning.regression.LogisticGD`) takes gradient steps
on the *joint* MAP objective (20) over theta_i, mu and sigma_theta^2. That
objective is unbounded below as sigma_theta^2 -> 0 (errata [!10]), so the learned
prior variance depends on the step sizes and the number of rounds.

:class:`LogisticEM` instead maximizes the marginal likelihood of (mu,
sigma_theta^2), with each client's posterior replaced by its Laplace
approximation N(theta_hat_i, H_i^{-1}) (the usual approximate EB of generalized
linear mixed models): clients find their MAP theta_hat_i under the current prior
by damped Newton steps and send theta_hat_i and Tr(H_i^{-1}); the server sets::

    mu = mean_i theta_hat_i,
    sigma_theta^2 = mean_i (|theta_hat_i - mu|^2 + Tr H_i^{-1}) / d,

the EM update of the linear-Gaussian case (:class:`~ebfl.learning.regression.LinearEM`)
with the exact posterior moments replaced by Laplace's. The trace term keeps
sigma_theta^2 away from the joint MAP's collapse.

:func:`logistic_map` on its own, with a fixed prior N(0, C I), is ridge logistic
regression per client (scikit-learn's ``LogisticRegression(C=C,
fit_intercept=False)``), the "local" baseline.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ebfl._validation import check_finite_array, check_int_scalar, check_positive_scalar
from ebfl.learning.data import _data_iv, _mean_iv, _mu0_iv, _variance_iv
from ebfl.learning.federated import (
    RegressionAlgorithm,
    _initial_mean,
    _initial_models,
    _message,
    _replace_rows,
    _scalar,
)

__all__ = ["LogisticEM", "logistic_map"]


def _penalized_loss(X, Y, mask, theta, mu, s):
    """Per client: cross-entropy sum + |theta - mu|^2 / (2 s), shape (m,)."""
    z = np.einsum("mnd,md->mn", X, theta)
    ce = np.sum((np.logaddexp(0.0, z) - Y * z) * mask, axis=1)
    return ce + np.sum((theta - mu) ** 2, axis=1) / (2 * s)


def _newton(X, Y, mask, theta, mu, s, steps, tol):
    """Damped Newton on every client's penalized loss at once.

    The step is halved (per client, up to 30 times) until the loss does not
    increase; a client whose every gradient coordinate is below ``tol`` keeps its
    theta. Each client's result depends on its own data only (a client run alone,
    as on Flower, gets what it gets in a batch). Returns theta and the Hessians at it.
    """
    m, _, d = X.shape
    eye = np.eye(d) / s
    loss = _penalized_loss(X, Y, mask, theta, mu, s)
    for _ in range(steps):
        p = special.expit(np.einsum("mnd,md->mn", X, theta))
        grad = np.einsum("mnd,mn->md", X, (p - Y) * mask) + (theta - mu) / s
        moving = np.max(np.abs(grad), axis=1) >= tol
        if not moving.any():
            break
        w = p * (1 - p) * mask
        hess = np.einsum("mnd,mn,mne->mde", X, w, X) + eye
        step = np.linalg.solve(hess, grad[..., None])[..., 0]
        t = np.where(moving, 1.0, 0.0)
        for _ in range(30):
            trial = theta - t[:, None] * step
            new_loss = _penalized_loss(X, Y, mask, trial, mu, s)
            bad = moving & (new_loss > loss + 1e-12 * np.abs(loss))
            if not bad.any():
                break
            t[bad] *= 0.5
        done = moving & ~bad
        theta = np.where(done[:, None], trial, theta)
        loss = np.where(done, new_loss, loss)
    p = special.expit(np.einsum("mnd,md->mn", X, theta))
    hess = np.einsum("mnd,mn,mne->mde", X, p * (1 - p) * mask, X) + eye
    return theta, hess


def logistic_map(data, mu, sigma_theta2, *, theta0=None, steps=50, tol=1e-8):
    """Every client's MAP of logistic regression under the prior N(mu, sigma_theta2 I).

    Minimizes ``sum_j CE(<theta_i, x_ij>, y_ij) + |theta_i - mu|^2 / (2 sigma_theta2)``
    by damped Newton steps, all clients at once.

    Parameters
    ----------
    data : RegressionData
        Responses in {0, 1}.
    mu : array_like, shape (d,)
    sigma_theta2 : float
        In [1e-300, 1e150]; with ``mu = 0`` this is ridge logistic regression
        with C = sigma_theta2.
    theta0 : array_like, shape (m, d), optional
        Starting point (default ``mu``).
    steps : int
        Most Newton steps.
    tol : float
        Stop when every gradient coordinate is below this.

    Returns
    -------
    theta : ndarray (m, d)
    cov_trace : ndarray (m,)
        Tr(H_i^{-1}), the Laplace approximation's posterior variance.
    """
    _check_binary(_data_iv(data))
    s = _variance_iv(sigma_theta2, "sigma_theta2")
    steps = check_int_scalar(steps, "steps", minimum=1)
    tol = check_positive_scalar(tol, "tol")
    mu = _mean_iv(mu, data.dim, "mu")
    if theta0 is None:
        theta = np.tile(mu, (data.n_clients, 1))
    else:
        theta = check_finite_array(theta0, "theta0", ndim=(1, 2))
        if theta.shape not in ((data.dim,), (data.n_clients, data.dim)):
            raise ValueError(f"theta0 must have shape (d,) = ({data.dim},) or (m, d) = "
                             f"({data.n_clients}, {data.dim}), got {theta.shape}")
        theta = np.array(np.broadcast_to(theta, (data.n_clients, data.dim)))
    theta, hess = _newton(data.X, data.Y, data.mask, theta, mu, s, steps, tol)
    return theta, np.trace(np.linalg.inv(hess), axis1=1, axis2=2)


def _check_binary(data):
    if not np.all((data.Y == 0) | (data.Y == 1)):
        raise ValueError("logistic regression needs responses data.Y in {0, 1}")


class LogisticEM(RegressionAlgorithm):
    """Empirical Bayes for personalized logistic regression (Laplace-approximate EM).

    The server broadcasts (mu, sigma_theta^2); each sampled client finds its MAP
    under that prior by Newton steps warm-started from its last one and replies
    theta_hat_i and Tr(H_i^{-1}); the server sets mu and sigma_theta^2 as in the
    module docstring.

    Parameters
    ----------
    newton_steps : int
        Newton steps per client per round, warm-started from its last theta.
    mu0 : array_like, optional
        Initial prior mean (default 0).
    sigma_theta2_0 : float
        Initial prior variance.
    floor : float
        Smallest sigma_theta^2 allowed.

    Notes
    -----
    With partial participation the server keeps every client's latest
    (theta_hat_i, Tr H_i^{-1}) and averages over the clients seen so far, as
    :class:`~ebfl.learning.regression.LinearEM` does.
    """

    name = "logistic-em"
    loss = "logistic"

    def __init__(self, *, newton_steps=5, mu0=None, sigma_theta2_0=1.0, floor=1e-8):
        self.newton_steps = check_int_scalar(newton_steps, "newton_steps", minimum=1)
        self.mu0 = _mu0_iv(mu0)
        self.sigma_theta2_0 = _variance_iv(sigma_theta2_0, "sigma_theta2_0")
        self.floor = _variance_iv(floor, "floor")

    def init_server(self, run):
        m = run.n_clients
        return {"mu": _initial_mean(self.mu0), "sigma_theta2": self.sigma_theta2_0,
                "trace": np.zeros(m), "seen": np.zeros(m, bool)}

    def init_clients(self, run, data, clients):
        _check_binary(_data_iv(data))
        return _initial_models(data, self.mu0)

    def broadcast(self, server, rc):
        return _message(mu=server["mu"], sigma_theta2=server["sigma_theta2"])

    def client_train(self, message, client, data, rc):
        theta, hess = _newton(data.X, data.Y, data.mask, client["theta"], message["mu"],
                              _scalar(message["sigma_theta2"]), self.newton_steps, 1e-10)
        client["theta"] = theta
        return {"theta": theta, "trace": np.trace(np.linalg.inv(hess), axis1=1, axis2=2)}

    def aggregate(self, server, replies, weights, rc):
        new = dict(server)
        new["theta"] = _replace_rows(server, "theta", rc, replies["theta"], 0.0)
        new["trace"] = server["trace"].copy()
        new["trace"][rc.clients] = replies["trace"]
        new["seen"] = server["seen"].copy()
        new["seen"][rc.clients] = True
        seen = new["seen"]
        theta = new["theta"][seen]
        mu = theta.mean(axis=0)
        dev = np.sum((theta - mu) ** 2, axis=1) + new["trace"][seen]
        new["mu"] = mu
        new["sigma_theta2"] = max(float(dev.mean() / theta.shape[1]), self.floor)
        return new

    def summary(self, server):
        return {"sigma_theta2": server["sigma_theta2"]}

    def objective(self, server, clients, data):
        from ebfl.learning.regression import _logistic_objective

        return {"objective": _logistic_objective(data, clients["theta"], server["mu"],
                                                 server["sigma_theta2"])}
