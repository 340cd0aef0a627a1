r"""Federated personalized regression: Algorithms 2 and 3, EM, and the baselines (Section 3).

All algorithms follow the protocol of :mod:`ebfl.learning.federated` and update
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

__all__ = ["FedAvgLinear", "FedAvgLogistic", "LinearEM", "LinearGD", "LogisticGD",
           "finetune_linear", "finetune_logistic", "linear_objective", "logistic_objective"]

_LOG_2PI = math.log(2 * math.pi)


def _rows(data, active=None):
    """(X, Y, mask) of the clients ``active``: views, not copies, when all take part."""
    if active is None or (active.size == data.n_clients
                          and np.array_equal(active, np.arange(data.n_clients))):
        return data.X, data.Y, data.mask
    return data.X[active], data.Y[active], data.mask[active]


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


def _init_common(data, mu0, sigma_theta2_0):
    """The initial prior mean (mu0 or 0, checked against the data's d) and variance."""
    d = _data_iv(data).dim
    mu = np.zeros(d) if mu0 is None else _mean_iv(mu0, d, "mu0").copy()
    return mu, sigma_theta2_0


class LinearGD:
    """Algorithm 2: gradient steps on objective (19), unknown mu, sigma_theta^2, sigma_x^2.

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

    def init(self, data, rng):
        mu, st = _init_common(data, self.mu0, self.sigma_theta2_0)
        return {"theta": np.tile(mu, (data.n_clients, 1)), "mu": mu, "sigma_theta2": st,
                "sigma_x2": self.sigma_x2_0}

    def round(self, state, data, active, rng):
        mu, st, sx = state["mu"], state["sigma_theta2"], state["sigma_x2"]
        # One fused pass over each client's data (Numba, parallel over clients).
        theta, rss, dev2, n_i = _kernels._linear_gd_clients(
            data.X, data.Y, data.mask, state["theta"], np.asarray(active, np.int64), mu, st,
            sx, self.lr, self.local_steps)
        # Jacobi: the mu and variance steps use the round's starting values. The
        # server averages of mu_i = mu - eta (mu - theta_i)/s_theta and of the
        # variance steps are taken in closed form.
        d = data.dim
        new = dict(state)
        if np.array_equal(active, np.arange(data.n_clients)):  # everyone: no copies
            new["theta"], old_mean = theta, state["theta"].mean(axis=0)
        else:
            new["theta"] = state["theta"].copy()
            new["theta"][active] = theta
            old_mean = state["theta"][active].mean(axis=0)
        new["mu"] = mu - self.lr_mu * (mu - old_mean) / st
        # sx * sx, not sx**2: a Python float's ** raises OverflowError where * gives inf.
        sx_i = sx - self.lr_var * (n_i / (2 * sx) - rss / (2 * sx * sx))
        st_i = st - self.lr_var * (d / (2 * st) - dev2 / (2 * st * st))
        new["sigma_theta2"] = max(float(st_i.mean()), self.floor)
        new["sigma_x2"] = max(float(sx_i.mean()), self.floor)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"objective": _linear_objective(data, state["theta"], state["mu"],
                                               state["sigma_theta2"], state["sigma_x2"]),
                "sigma_theta2": state["sigma_theta2"], "sigma_x2": state["sigma_x2"]}


class LinearEM:
    """Empirical Bayes by EM on the marginal likelihood (the corrected Algorithm 2).

    Each round the sampled clients compute the posterior (15) under the current
    (mu, sigma_theta^2, sigma_x^2) and send theta_hat_i, Tr(Cov_i) and
    ``E|Y_i - X_i theta_i|^2``; the server keeps every client's latest statistics
    and sets mu = mean theta_hat, ``sigma_theta^2 = mean(|theta_hat - mu|^2 +
    Tr Cov)/d``, ``sigma_x^2 = sum E|r_i|^2 / sum n_i``. With full participation this is
    exact EM: the marginal likelihood never decreases.
    """

    def __init__(self, *, mu0=None, sigma_theta2_0=1.0, sigma_x2_0=1.0, floor=1e-10):
        self.mu0 = _mu0_iv(mu0)
        self.sigma_theta2_0 = _variance_iv(sigma_theta2_0, "sigma_theta2_0")
        self.sigma_x2_0 = _variance_iv(sigma_x2_0, "sigma_x2_0")
        self.floor = _variance_iv(floor, "floor")

    def init(self, data, rng):
        mu, st = _init_common(data, self.mu0, self.sigma_theta2_0)
        m = data.n_clients
        return {"theta": np.tile(mu, (m, 1)), "trace": np.full(m, st * data.dim),
                "rss": np.zeros(m), "seen": np.zeros(m, bool), "mu": mu, "sigma_theta2": st,
                "sigma_x2": self.sigma_x2_0}

    def round(self, state, data, active, rng):
        from ebfl.learning.theorem6 import _fit_trace, posterior_regression

        sub = data.subset(active)
        st, sx = state["sigma_theta2"], state["sigma_x2"]
        theta, trace = posterior_regression(sub, state["mu"], st, sx)
        # E|Y - X theta|^2 = |Y - X theta_hat|^2 + Tr(X Cov X^T).
        rss = np.sum(_residual(_rows(sub), theta) ** 2, axis=1) + _fit_trace(sub.X, st, sx)
        new = {key: (val.copy() if isinstance(val, np.ndarray) else val)
               for key, val in state.items()}
        new["theta"][active], new["trace"][active], new["rss"][active] = theta, trace, rss
        new["seen"][active] = True
        seen = new["seen"]
        mu = new["theta"][seen].mean(axis=0)
        new["mu"] = mu
        dev = np.sum((new["theta"][seen] - mu) ** 2, axis=1) + new["trace"][seen]
        new["sigma_theta2"] = max(float(dev.mean() / data.dim), self.floor)
        new["sigma_x2"] = max(float(new["rss"][seen].sum() / data.mask[seen].sum()),
                              self.floor)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"objective": _linear_objective(data, state["theta"], state["mu"],
                                               state["sigma_theta2"], state["sigma_x2"]),
                "sigma_theta2": state["sigma_theta2"], "sigma_x2": state["sigma_x2"]}


RULES = ("fixed", "printed")


class LogisticGD:
    """Algorithm 3: personalized logistic regression, unknown mu and sigma_theta^2.

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

    def init(self, data, rng):
        mu, st = _init_common(data, self.mu0, self.sigma_theta2_0)
        return {"theta": np.tile(mu, (data.n_clients, 1)), "mu": mu, "sigma_theta2": st}

    def round(self, state, data, active, rng):
        mu, st = state["mu"], state["sigma_theta2"]
        X, Y, mask = _rows(data, active)
        theta = state["theta"][active]
        p = special.expit(np.einsum("mnd,md->mn", X, theta))
        grad_ce = np.einsum("mnd,mn->md", X, (p - Y) * mask)
        prior = (theta - mu) / st if self.rule == "fixed" else (mu - theta) / st
        new = dict(state)
        new["theta"] = state["theta"].copy()
        new["theta"][active] = theta - self.lr * (grad_ce + prior)
        if self.learn_prior:
            dev = mu - theta
            new["mu"] = (mu - self.lr_mu * dev / st).mean(axis=0)
            st_i = st - self.lr_var * (data.dim / (2 * st) - np.sum(dev**2, axis=1) / (2 * st * st))
            new["sigma_theta2"] = max(float(st_i.mean()), self.floor)
        return new

    def personal(self, state):
        return state["theta"]

    def summary(self, state, data):
        return {"objective": _logistic_objective(data, state["theta"], state["mu"],
                                                 state["sigma_theta2"]),
                "sigma_theta2": state["sigma_theta2"]}


class FedAvgLinear:
    """FedAvg for one global least-squares model (a baseline without personalization).

    Each sampled client runs ``local_steps`` gradient steps on its mean squared
    error ``(1/(2 n_i)) |Y_i - X_i w|^2`` from the global w; the server averages the
    results weighted by n_i.
    """

    def __init__(self, lr, *, local_steps=1):
        self.lr = check_positive_scalar(lr, "lr")
        self.local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)

    def init(self, data, rng):
        return {"w": np.zeros(_data_iv(data).dim)}

    def round(self, state, data, active, rng):
        rows = _rows(data, active)
        X, _, mask = rows
        n_i = mask.sum(axis=1)
        w = np.tile(state["w"], (active.size, 1))
        for _ in range(self.local_steps):
            r = _residual(rows, w)
            w = w + self.lr * np.einsum("mnd,mn->md", X, r) / n_i[:, None]
        return {"w": (n_i[:, None] * w).sum(axis=0) / n_i.sum()}

    def personal(self, state):
        return state["w"]

    def summary(self, state, data):
        m = data.n_clients
        r = _residual(_rows(data), np.tile(state["w"], (m, 1)))
        return {"objective": float(np.sum(r**2) / (2 * data.mask.sum()))}


class FedAvgLogistic:
    """FedAvg for one global logistic model: local steps on each client's mean cross-entropy.

    Parameters
    ----------
    lr : float
    local_steps : int
    l2 : float
        Ridge penalty ``(l2/2)|w|^2`` added to every client's mean loss (0 for none).
    """

    def __init__(self, lr, *, local_steps=1, l2=0.0):
        self.lr = check_positive_scalar(lr, "lr")
        self.local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
        self.l2 = check_nonnegative_scalar(l2, "l2")

    def init(self, data, rng):
        return {"w": np.zeros(_data_iv(data).dim)}

    def round(self, state, data, active, rng):
        X, Y, mask = _rows(data, active)
        n_i = mask.sum(axis=1)
        w = np.tile(state["w"], (active.size, 1))
        for _ in range(self.local_steps):
            p = special.expit(np.einsum("mnd,md->mn", X, w))
            grad = np.einsum("mnd,mn->md", X, (p - Y) * mask) / n_i[:, None] + self.l2 * w
            w = w - self.lr * grad
        return {"w": (n_i[:, None] * w).sum(axis=0) / n_i.sum()}

    def personal(self, state):
        return state["w"]

    def summary(self, state, data):
        z = np.einsum("mnd,d->mn", data.X, state["w"])
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
