r"""Federated personalized regression: Algorithms 2 and 3, EM, and the baselines (Section 3).

All algorithms are :class:`~ebfl.learning.federated.RegressionAlgorithm` s (a
client half and a server half of the project's federated protocol) and update
the sampled clients in one vectorized step.

* :class:`LinearGD`: Algorithm 2 as printed. Jacobi-style gradient steps on
  objective (19) over theta_i, mu, sigma_theta^2, sigma_x^2, with the server
  averaging the clients' mu and variance steps. The joint MAP is unbounded below
  (theta_i = mu, sigma_theta^2 -> 0; errata [!10]), so the variances are floored.
* :class:`LinearEM`: the corrected empirical-Bayes variant. EM on the marginal
  likelihood: clients compute the posterior (15) and its moments, and the server
  sets mu, sigma_theta^2, sigma_x^2 in closed form. No degeneracy.
* :class:`LogisticGD`: Algorithm 3 on objective (20), with the prior term's sign
  fixed (``rule="fixed"``) or as printed (``rule="printed"``, which pushes
  theta away from mu; errata [!9]).
* :class:`FedAvgLinear`, :class:`FedAvgLogistic`: one global model by FedAvg,
  plus :func:`finetune_linear` / :func:`finetune_logistic` for local fine-tuning
  afterwards.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ebfl._validation import (
    check_bool,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.learning import _kernels
from ebfl.learning.data import (
    _data_iv,
    _mean_iv,
    _models_iv,
    _mu0_iv,
    _variance_iv,
)
from ebfl.learning.federated import (
    RegressionAlgorithm,
    _initial_mean,
    _initial_models,
    _message,
    _replace_rows,
    _scalar,
    _vector,
)

__all__ = ["FedAvgLinear", "FedAvgLogistic", "LinearEM", "LinearGD", "LogisticGD",
           "finetune_linear", "finetune_logistic", "linear_objective", "logistic_objective"]

_LOG_2PI = math.log(2 * math.pi)


def _rows(data):
    """(X, Y, mask) of the clients of ``data`` (the round's clients: the runtime passes
    their subset)."""
    return data.X, data.Y, data.mask


def _residual(rows, theta):
    X, Y, mask = rows
    return (Y - np.einsum("mnd,md->mn", X, theta)) * mask


def _objective_iv(data, theta, mu, variances):
    data = _data_iv(data)
    theta = _models_iv(theta, data, "theta")
    mu = _mean_iv(mu, data.dim, "mu")
    return data, theta, mu, [_variance_iv(v, name) for name, v in variances.items()]


def linear_objective(data, theta, mu, sigma_theta2, sigma_x2):
    """Objective (19): negative log joint density of the data and the theta_i.

    Parameters
    ----------
    data : RegressionData
    theta : array_like, shape (m, d)
    mu : float or array_like, shape (d,)
    sigma_theta2, sigma_x2 : float
        Variances in [1e-300, 1e150].
    """
    data, theta, mu, (sigma_theta2, sigma_x2) = _objective_iv(
        data, theta, mu, {"sigma_theta2": sigma_theta2, "sigma_x2": sigma_x2})
    return _linear_objective(data, theta, mu, sigma_theta2, sigma_x2)


def _linear_objective(data, theta, mu, sigma_theta2, sigma_x2):
    """Objective (19) without input checks (the algorithms' summaries: a diverged run's
    state is logged, not refused)."""
    m, _, d = data.X.shape
    r = _residual(_rows(data), theta)
    n_total = data.mask.sum()
    return float(0.5 * n_total * (_LOG_2PI + math.log(sigma_x2)) + np.sum(r**2) / (2 * sigma_x2)
                 + 0.5 * m * d * (_LOG_2PI + math.log(sigma_theta2))
                 + np.sum((theta - mu) ** 2) / (2 * sigma_theta2))


def logistic_objective(data, theta, mu, sigma_theta2):
    """Objective (20) with the cross-entropy's minus sign restored.

    As printed, the sign pushes theta away from mu.

    Parameters are those of :func:`linear_objective`.
    """
    data, theta, mu, (sigma_theta2,) = _objective_iv(data, theta, mu,
                                                     {"sigma_theta2": sigma_theta2})
    return _logistic_objective(data, theta, mu, sigma_theta2)


def _logistic_objective(data, theta, mu, sigma_theta2):
    """Objective (20) without input checks (for the algorithms' summaries)."""
    m, _, d = data.X.shape
    z = np.einsum("mnd,md->mn", data.X, theta)
    # -[y log s(z) + (1-y) log(1-s(z))] = log(1 + e^z) - y z, stable via logaddexp.
    ce = (np.logaddexp(0.0, z) - data.Y * z) * data.mask
    return float(np.sum(ce) + 0.5 * m * d * (_LOG_2PI + math.log(sigma_theta2))
                 + np.sum((theta - mu) ** 2) / (2 * sigma_theta2))


class LinearGD(RegressionAlgorithm):
    """Algorithm 2: gradient steps on objective (19), unknown mu, sigma_theta^2, sigma_x^2.

    The server broadcasts (mu, sigma_theta^2, sigma_x^2); each sampled client
    takes ``local_steps`` gradient steps on its theta_i and replies its variance
    steps and its round-start theta_i (the server's mu step mu - eta (mu -
    theta_i) / sigma_theta^2 is affine in theta_i, so the server applies it to
    their mean); the server averages.

    Parameters
    ----------
    lr : float
        eta for the theta steps.
    lr_mu, lr_var : float, optional
        Step sizes of the mu and variance steps (the paper uses one eta; default ``lr``).
    local_steps : int
        Gradient steps on theta_i per round (the paper: 1).
    floor : float
        Smallest variance allowed (the objective is unbounded below as
        sigma_theta^2 -> 0, errata [!10]).
    mu0, sigma_theta2_0, sigma_x2_0 :
        Initial server values (the paper gives none); theta_i^0 = mu0. mu0 is
        a scalar or has shape (d,) (checked against the data); variances and
        ``floor`` lie in [1e-300, 1e150].
    """

    name = "linear-gd"

    def __init__(self, lr, *, lr_mu=None, lr_var=None, local_steps=1, floor=1e-6, mu0=None,
                 sigma_theta2_0=1.0, sigma_x2_0=1.0):
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_mu = self.lr if lr_mu is None else check_positive_scalar(lr_mu, "lr_mu")
        self.lr_var = self.lr if lr_var is None else check_positive_scalar(lr_var, "lr_var")
        self.local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
        self.floor = _variance_iv(floor, "floor")
        self.mu0 = _mu0_iv(mu0)
        self.sigma_theta2_0 = _variance_iv(sigma_theta2_0, "sigma_theta2_0")
        self.sigma_x2_0 = _variance_iv(sigma_x2_0, "sigma_x2_0")

    def init_server(self, run):
        return {"mu": _initial_mean(self.mu0), "sigma_theta2": self.sigma_theta2_0,
                "sigma_x2": self.sigma_x2_0}

    def init_clients(self, run, data, clients):
        return _initial_models(data, self.mu0)

    def broadcast(self, server, rc):
        return _message(**server)

    def client_train(self, message, client, data, rc):
        st, sx = _scalar(message["sigma_theta2"]), _scalar(message["sigma_x2"])
        start = client["theta"]
        # One fused pass over each client's data (Numba, parallel over clients).
        theta, rss, dev2, n_i = _kernels._linear_gd_clients(
            data.X, data.Y, data.mask, start, np.arange(data.n_clients),
            _vector(message["mu"], data.dim), st, sx, self.lr, self.local_steps)
        client["theta"] = theta
        # Jacobi: the variance steps use the round's starting values.
        # sx * sx, not sx**2: a Python float's ** raises OverflowError where * gives inf.
        return {"theta": start,
                "sigma_x2": sx - self.lr_var * (n_i / (2 * sx) - rss / (2 * sx * sx)),
                "sigma_theta2": st - self.lr_var * (data.dim / (2 * st)
                                                    - dev2 / (2 * st * st))}

    def aggregate(self, server, replies, weights, rc):
        mu, st = server["mu"], server["sigma_theta2"]
        return {"mu": mu - self.lr_mu * (mu - replies["theta"].mean(axis=0)) / st,
                "sigma_theta2": max(float(replies["sigma_theta2"].mean()), self.floor),
                "sigma_x2": max(float(replies["sigma_x2"].mean()), self.floor)}

    def summary(self, server):
        return {"sigma_theta2": server["sigma_theta2"], "sigma_x2": server["sigma_x2"]}

    def objective(self, server, clients, data):
        return {"objective": _linear_objective(data, clients["theta"], server["mu"],
                                               server["sigma_theta2"], server["sigma_x2"])}


class LinearEM(RegressionAlgorithm):
    """Empirical Bayes by EM on the marginal likelihood (the corrected Algorithm 2).

    Each round the sampled clients compute the posterior (15) under the current
    (mu, sigma_theta^2, sigma_x^2) and send theta_hat_i, Tr(Cov_i),
    ``E|Y_i - X_i theta_i|^2`` and n_i; the server keeps every client's latest
    statistics and sets mu = mean theta_hat, ``sigma_theta^2 = mean(|theta_hat - mu|^2 +
    Tr Cov)/d``, ``sigma_x^2 = sum E|r_i|^2 / sum n_i`` over the clients it has heard
    from. With full participation this is exact EM: the marginal likelihood never
    decreases.
    """

    name = "linear-em"

    def __init__(self, *, mu0=None, sigma_theta2_0=1.0, sigma_x2_0=1.0, floor=1e-10):
        self.mu0 = _mu0_iv(mu0)
        self.sigma_theta2_0 = _variance_iv(sigma_theta2_0, "sigma_theta2_0")
        self.sigma_x2_0 = _variance_iv(sigma_x2_0, "sigma_x2_0")
        self.floor = _variance_iv(floor, "floor")

    def init_server(self, run):
        m = run.n_clients
        return {"mu": _initial_mean(self.mu0), "sigma_theta2": self.sigma_theta2_0,
                "sigma_x2": self.sigma_x2_0, "trace": np.zeros(m), "rss": np.zeros(m),
                "n": np.zeros(m), "seen": np.zeros(m, bool)}

    def init_clients(self, run, data, clients):
        return _initial_models(data, self.mu0)

    def broadcast(self, server, rc):
        return _message(mu=server["mu"], sigma_theta2=server["sigma_theta2"],
                        sigma_x2=server["sigma_x2"])

    def client_train(self, message, client, data, rc):
        from ebfl.learning.theorem6 import _fit_trace, posterior_regression

        st, sx = _scalar(message["sigma_theta2"]), _scalar(message["sigma_x2"])
        theta, trace = posterior_regression(data, message["mu"], st, sx)
        client["theta"] = theta
        # E|Y - X theta|^2 = |Y - X theta_hat|^2 + Tr(X Cov X^T).
        rss = np.sum(_residual(_rows(data), theta) ** 2, axis=1) + _fit_trace(data.X, st, sx)
        return {"theta": theta, "trace": trace, "rss": rss, "n": data.n_samples}

    def aggregate(self, server, replies, weights, rc):
        new = {key: (val.copy() if isinstance(val, np.ndarray) else val)
               for key, val in server.items()}
        new["theta"] = _replace_rows(server, "theta", rc, replies["theta"], 0.0)
        for key in ("trace", "rss", "n"):
            new[key][rc.clients] = replies[key]
        new["seen"][rc.clients] = True
        seen = new["seen"]
        theta = new["theta"][seen]
        mu = theta.mean(axis=0)
        new["mu"] = mu
        dev = np.sum((theta - mu) ** 2, axis=1) + new["trace"][seen]
        new["sigma_theta2"] = max(float(dev.mean() / theta.shape[1]), self.floor)
        new["sigma_x2"] = max(float(new["rss"][seen].sum() / new["n"][seen].sum()),
                              self.floor)
        return new

    def summary(self, server):
        return {"sigma_theta2": server["sigma_theta2"], "sigma_x2": server["sigma_x2"]}

    def objective(self, server, clients, data):
        return {"objective": _linear_objective(data, clients["theta"], server["mu"],
                                               server["sigma_theta2"], server["sigma_x2"])}


RULES = ("fixed", "printed")


class LogisticGD(RegressionAlgorithm):
    """Algorithm 3: personalized logistic regression, unknown mu and sigma_theta^2.

    The server broadcasts (mu, sigma_theta^2); each sampled client takes a
    gradient step on its theta_i and, when the prior is learned, replies its
    steps mu_i and sigma_theta,i^2 (at the round's start); the server averages.

    Parameters
    ----------
    lr : float
    rule : {"fixed", "printed"}
        ``"fixed"``: theta <- theta - eta (sum_j (s(<theta, x>) - y) x + (theta - mu)/s),
        a gradient step on (20). ``"printed"``: the paper's (mu - theta)/s, which
        pushes theta away from mu (errata [!9]).
    lr_mu, lr_var, floor, mu0, sigma_theta2_0 : as in :class:`LinearGD`.
    learn_prior : bool
        Update mu and sigma_theta^2 (True) or keep them at their initial values.
    """

    name = "logistic-gd"
    loss = "logistic"

    def __init__(self, lr, *, rule="fixed", lr_mu=None, lr_var=None, floor=1e-6, mu0=None,
                 sigma_theta2_0=1.0, learn_prior=True):
        self.lr = check_positive_scalar(lr, "lr")
        check_choice(rule, "rule", RULES)
        self.rule = rule
        self.lr_mu = self.lr if lr_mu is None else check_positive_scalar(lr_mu, "lr_mu")
        self.lr_var = self.lr if lr_var is None else check_positive_scalar(lr_var, "lr_var")
        self.floor = _variance_iv(floor, "floor")
        self.mu0 = _mu0_iv(mu0)
        self.sigma_theta2_0 = _variance_iv(sigma_theta2_0, "sigma_theta2_0")
        self.learn_prior = check_bool(learn_prior, "learn_prior")

    def init_server(self, run):
        return {"mu": _initial_mean(self.mu0), "sigma_theta2": self.sigma_theta2_0}

    def init_clients(self, run, data, clients):
        return _initial_models(data, self.mu0)

    def broadcast(self, server, rc):
        return _message(**server)

    def client_train(self, message, client, data, rc):
        mu, st = message["mu"], _scalar(message["sigma_theta2"])
        X, Y, mask = _rows(data)
        theta = client["theta"]
        p = special.expit(np.einsum("mnd,md->mn", X, theta))
        grad_ce = np.einsum("mnd,mn->md", X, (p - Y) * mask)
        prior = (theta - mu) / st if self.rule == "fixed" else (mu - theta) / st
        client["theta"] = theta - self.lr * (grad_ce + prior)
        if not self.learn_prior:
            return {}
        dev = mu - theta
        return {"mu": mu - self.lr_mu * dev / st,
                "sigma_theta2": st - self.lr_var * (data.dim / (2 * st)
                                                    - np.sum(dev**2, axis=1) / (2 * st * st))}

    def aggregate(self, server, replies, weights, rc):
        if not self.learn_prior:
            return server
        return {"mu": replies["mu"].mean(axis=0),
                "sigma_theta2": max(float(replies["sigma_theta2"].mean()), self.floor)}

    def summary(self, server):
        return {"sigma_theta2": server["sigma_theta2"]}

    def objective(self, server, clients, data):
        return {"objective": _logistic_objective(data, clients["theta"], server["mu"],
                                                 server["sigma_theta2"])}


class _FedAvg(RegressionAlgorithm):
    """FedAvg of one global model: the server broadcasts w, each sampled client runs
    ``local_steps`` gradient steps on its mean loss from w and replies its model, the
    server averages them weighted by n_i. The clients keep no state."""

    def init_server(self, run):
        return {"w": np.zeros(())}

    def init_clients(self, run, data, clients):
        _data_iv(data)
        return {}

    def broadcast(self, server, rc):
        return _message(w=server["w"])

    def evaluation_message(self, server):
        return _message(w=server["w"])

    def client_weights(self, data):
        return data.n_samples

    def aggregate(self, server, replies, weights, rc):
        return {"w": (weights[:, None] * replies["w"]).sum(axis=0) / weights.sum()}

    def personal(self, server, clients):
        return server["w"]

    def client_evaluate(self, message, client, data):
        theta = np.broadcast_to(message["w"], (data.n_clients, data.dim))
        return super().client_evaluate(message, {"theta": theta}, data)

    def _start(self, message, data):
        return np.array(np.broadcast_to(message["w"], (data.n_clients, data.dim)))


class FedAvgLinear(_FedAvg):
    """FedAvg for one global least-squares model (a baseline without personalization).

    Each sampled client runs ``local_steps`` gradient steps on its mean squared
    error ``(1/(2 n_i)) |Y_i - X_i w|^2`` from the global w; the server averages the
    results weighted by n_i.
    """

    name = "fedavg-linear"

    def __init__(self, lr, *, local_steps=1):
        self.lr = check_positive_scalar(lr, "lr")
        self.local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)

    def client_train(self, message, client, data, rc):
        rows = _rows(data)
        X, _, mask = rows
        n_i = mask.sum(axis=1)
        w = self._start(message, data)
        for _ in range(self.local_steps):
            r = _residual(rows, w)
            w = w + self.lr * np.einsum("mnd,mn->md", X, r) / n_i[:, None]
        return {"w": w}

    def objective(self, server, clients, data):
        w = np.broadcast_to(server["w"], (data.n_clients, data.dim))
        r = _residual(_rows(data), w)
        return {"objective": float(np.sum(r**2) / (2 * data.mask.sum()))}


class FedAvgLogistic(_FedAvg):
    """FedAvg for one global logistic model: local steps on each client's mean cross-entropy.

    Parameters
    ----------
    lr : float
    local_steps : int
    l2 : float
        Ridge penalty ``(l2/2)|w|^2`` added to every client's mean loss (0 for none).
    """

    name = "fedavg-logistic"
    loss = "logistic"

    def __init__(self, lr, *, local_steps=1, l2=0.0):
        self.lr = check_positive_scalar(lr, "lr")
        self.local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
        self.l2 = check_nonnegative_scalar(l2, "l2")

    def client_train(self, message, client, data, rc):
        X, Y, mask = _rows(data)
        n_i = mask.sum(axis=1)
        w = self._start(message, data)
        for _ in range(self.local_steps):
            p = special.expit(np.einsum("mnd,md->mn", X, w))
            grad = np.einsum("mnd,mn->md", X, (p - Y) * mask) / n_i[:, None] + self.l2 * w
            w = w - self.lr * grad
        return {"w": w}

    def objective(self, server, clients, data):
        z = np.einsum("mnd,d->mn", data.X, np.broadcast_to(server["w"], (data.dim,)))
        ce = (np.logaddexp(0.0, z) - data.Y * z) * data.mask
        return {"objective": float(np.sum(ce) / data.mask.sum())}


def _finetune(data, theta0, steps, lr, link):
    """``steps`` gradient steps on every client's mean loss of a GLM with ``link``.

    For squared error (identity link) and cross-entropy (logistic link) the
    gradient is X_i^T (link(X_i theta) - Y_i) / n_i.
    """
    data = _data_iv(data)
    steps = check_int_scalar(steps, "steps", minimum=0)
    lr = check_positive_scalar(lr, "lr")
    theta0 = check_finite_array(theta0, "theta0", ndim=(0, 1, 2))
    if theta0.ndim and theta0.shape not in ((data.dim,), (data.n_clients, data.dim)):
        raise ValueError(f"theta0 must have shape (d,) = ({data.dim},) or (m, d) = "
                         f"({data.n_clients}, {data.dim}), got {theta0.shape}")
    theta = np.broadcast_to(theta0, (data.n_clients, data.dim)).copy()
    n_i = data.n_samples[:, None]
    for _ in range(steps):
        err = (link(np.einsum("mnd,md->mn", data.X, theta)) - data.Y) * data.mask
        theta -= lr * np.einsum("mnd,mn->md", data.X, err) / n_i
    return theta


def finetune_linear(data, theta0, steps, lr):
    """Local fine-tuning: ``steps`` gradient steps on each client's own mean squared error.

    Parameters
    ----------
    data : RegressionData
    theta0 : array_like, shape (d,) or (m, d)
        Starting models (e.g. the FedAvg model).
    steps : int
    lr : float

    Returns
    -------
    ndarray of shape (m, d)
    """
    return _finetune(data, theta0, steps, lr, lambda z: z)


def finetune_logistic(data, theta0, steps, lr):
    """Local fine-tuning: ``steps`` gradient steps on each client's own mean cross-entropy.

    Parameters
    ----------
    data : RegressionData
        Responses in {0, 1}.
    theta0 : array_like, shape (d,) or (m, d)
        Starting models (e.g. the FedAvg model).
    steps : int
    lr : float

    Returns
    -------
    ndarray of shape (m, d)
    """
    return _finetune(data, theta0, steps, lr, special.expit)
