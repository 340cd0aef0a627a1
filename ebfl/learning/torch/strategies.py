"""Federated algorithms as strategies of the one round loop in :mod:`.engine`.

A strategy keeps its state as a dict of tensors and parameter stacks (so a
checkpoint is ``torch.save(state)``) and implements

* ``init_state(params, m)``: from the initial parameters of one model;
* ``broadcast(state, active)``: the server's message to the sampled clients;
* ``local_step(state, active, x, y, scale)``: one local iteration of every
  sampled client at once (x: (K, B, ...), y: (K, B)); ``scale`` is the
  learning-rate decay factor of the current epoch;
* ``idle_step(state, idle, x, y, scale)``: what unsampled clients do (most: nothing);
* ``aggregate(state, active, n_samples)``: the server's update at round end;
* ``personal(state)``: every client's model for evaluation (a stack of m);
* ``summary(state)``: scalars for the history.

``model`` (an ``nn.Module``) is only the architecture: every call goes through
``torch.func.functional_call`` with stacked parameters.
"""

from __future__ import annotations

import torch

from ebfl._validation import check_nonnegative_scalar, check_positive_scalar
from ebfl.learning.torch.functional import (
    client_forward,
    client_grad,
    cross_entropy,
    distillation_kl,
    put,
    replicate,
    sgd_step,
    take,
    weighted_mean,
)

__all__ = ["AdaPeD", "FedAvg", "Local"]


def _ce_loss(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


class FedAvg:
    """FedAvg: local SGD from the global model, server averages weighted by sample counts.

    Parameters
    ----------
    model : nn.Module
    lr : float
    weight_decay : float
    """

    name = "FedAvg"
    all_clients_train = False

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4):
        self.model = model
        self.lr = check_positive_scalar(lr, "lr")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "weight_decay": self.weight_decay}

    def init_state(self, params, m):
        return {"global": {k: v.detach().clone() for k, v in params.items()}, "m": m}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def local_step(self, state, active, x, y, scale):
        g = client_grad(self.model, _ce_loss, state["work"], x, y)
        state["work"] = sgd_step(state["work"], g, self.lr * scale, self.weight_decay)

    def idle_step(self, state, idle, x, y, scale):
        pass

    def aggregate(self, state, active, n_samples):
        state["global"] = weighted_mean(state.pop("work"), n_samples.to(torch.float32))

    def personal(self, state):
        return replicate(state["global"], state["m"])

    def summary(self, state):
        return {}


class Local:
    """Local training only: every client runs SGD on its own data, nothing is shared."""

    name = "Local"
    all_clients_train = True

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4):
        self.model = model
        self.lr = check_positive_scalar(lr, "lr")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "weight_decay": self.weight_decay}

    def init_state(self, params, m):
        return {"theta": replicate(params, m)}

    def broadcast(self, state, active):
        pass

    def local_step(self, state, active, x, y, scale):
        rows = take(state["theta"], active)
        g = client_grad(self.model, _ce_loss, rows, x, y)
        put(state["theta"], active, sgd_step(rows, g, self.lr * scale, self.weight_decay))

    def idle_step(self, state, idle, x, y, scale):
        pass

    def aggregate(self, state, active, n_samples):
        pass

    def personal(self, state):
        return state["theta"]

    def summary(self, state):
        return {}


class AdaPeD:
    """AdaPeD (Algorithm 5): personalized models regularized by distillation from a global one.

    Each sampled client, per local iteration (spec D.7):

    * theta <- theta - eta1 (grad f(theta) + grad_theta KD(theta, mu) / (2 psi));
    * mu <- mu - eta2 grad_mu KD(theta_new, mu) / (2 psi);
    * psi <- max(psi - eta3 (1/(2 psi) - KD(theta_new, mu_new) / (2 psi^2)), psi_floor);

    and at the end of a round the server averages the sampled clients' mu and
    psi (unweighted, as printed). KD is KL(p_mu || p_theta) on the client's batch
    (:func:`~ebfl.learning.torch.functional.distillation_kl`); the global model
    learns only by distillation.

    Parameters
    ----------
    model : nn.Module
    lr_theta, lr_mu, lr_psi : float
        eta1, eta2, eta3 (paper: 0.1, 0.1, 3e-2). The epoch decay applies to
        eta1 and eta2; eta3 stays fixed.
    psi0 : float
        Initial psi (paper: 4).
    psi_floor : float
        The paper's manual floor (0.5).
    weight_decay : float
        On theta and mu (paper: 1e-4).
    fine_tune : bool
        Algorithm 6: unsampled clients keep training theta against the mu and
        psi they last received.
    """

    name = "AdaPeD"
    all_clients_train = False

    def __init__(self, model, lr_theta=0.1, lr_mu=0.1, lr_psi=3e-2, *, psi0=4.0, psi_floor=0.5,
                 weight_decay=1e-4, fine_tune=False):
        self.model = model
        self.lr_theta = check_positive_scalar(lr_theta, "lr_theta")
        self.lr_mu = check_positive_scalar(lr_mu, "lr_mu")
        self.lr_psi = check_nonnegative_scalar(lr_psi, "lr_psi")
        self.psi0 = check_positive_scalar(psi0, "psi0")
        self.psi_floor = check_positive_scalar(psi_floor, "psi_floor")
        if self.psi0 < self.psi_floor:
            raise ValueError(f"psi0 must be >= psi_floor {psi_floor}, got {psi0}")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.fine_tune = bool(fine_tune)
        if self.fine_tune:
            self.name = "AdaPeD-FT"

    def config(self):
        return {"name": self.name, "lr_theta": self.lr_theta, "lr_mu": self.lr_mu,
                "lr_psi": self.lr_psi, "psi0": self.psi0, "psi_floor": self.psi_floor,
                "weight_decay": self.weight_decay, "fine_tune": self.fine_tune}

    def init_state(self, params, m):
        state = {"theta": replicate(params, m),
                 "mu": {k: v.detach().clone() for k, v in params.items()},
                 "psi": torch.tensor(self.psi0)}
        if self.fine_tune:  # what each client last received from the server
            state["mu_client"] = replicate(params, m)
            state["psi_client"] = torch.full((m,), self.psi0)
        return state

    def broadcast(self, state, active):
        k = active.numel()
        state["work_mu"] = replicate(state["mu"], k)
        state["work_psi"] = state["psi"].expand(k).clone()
        if self.fine_tune:  # Algorithm 6: idle clients use what they last received
            put(state["mu_client"], active, state["work_mu"])
            state["psi_client"][active] = state["work_psi"]

    def theta_step(self, theta, mu, psi, x, y, scale):
        """eta1 step of the personal models against teachers mu (stacks of K)."""
        with torch.no_grad():
            teacher = client_forward(self.model, mu, x)

        def loss(forward, params, xb, yb, t, p):
            z = forward(params, xb)
            return cross_entropy(z, yb) + distillation_kl(t, z) / (2 * p)

        g = client_grad(self.model, loss, theta, x, y, teacher, psi)
        return sgd_step(theta, g, self.lr_theta * scale, self.weight_decay)

    def local_step(self, state, active, x, y, scale):
        mu, psi = state["work_mu"], state["work_psi"]
        theta = self.theta_step(take(state["theta"], active), mu, psi, x, y, scale)
        with torch.no_grad():
            student = client_forward(self.model, theta, x)

        def kd_mu(forward, params, xb, s, p):
            return distillation_kl(forward(params, xb), s) / (2 * p)

        h = client_grad(self.model, kd_mu, mu, x, student, psi)
        mu = sgd_step(mu, h, self.lr_mu * scale, self.weight_decay)
        with torch.no_grad():
            teacher = client_forward(self.model, mu, x)
            kd = torch.vmap(distillation_kl)(teacher, student)
            k = 1 / (2 * psi) - kd / (2 * psi**2)
            psi = torch.clamp(psi - self.lr_psi * k, min=self.psi_floor)
        put(state["theta"], active, theta)
        state["work_mu"], state["work_psi"] = mu, psi

    def idle_step(self, state, idle, x, y, scale):
        if not self.fine_tune or idle.numel() == 0:
            return
        theta = self.theta_step(take(state["theta"], idle), take(state["mu_client"], idle),
                                state["psi_client"][idle], x, y, scale)
        put(state["theta"], idle, theta)

    def aggregate(self, state, active, n_samples):
        mu, psi = state.pop("work_mu"), state.pop("work_psi")
        state["mu"] = weighted_mean(mu, torch.ones(active.numel()))
        state["psi"] = psi.mean()

    def personal(self, state):
        return state["theta"]

    def summary(self, state):
        return {"psi": float(state["psi"])}
