"""AdaPeD and DP-AdaPeD (torch): the generative framework's personalized learning algorithm.

AdaPeD gives every client a personal model theta_i, pulled by knowledge distillation
toward a global model mu with a learned scale psi; DP-AdaPeD adds Gaussian noise to
what the clients send, with its accountant in :mod:`ebfl.privacy.accounting.adaped`.
Both are
:class:`~ebfl.learning.torch.strategies.Strategy` halves, run in process by
:func:`~ebfl.learning.torch.engine.train` and on Flower.
"""

from __future__ import annotations

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"{__name__} needs torch: pip install 'ebfl[learning]'") from exc

from ebfl._validation import check_bool, check_nonnegative_scalar, check_positive_scalar
from ebfl.learning.torch.functional import (
    buffer_names,
    client_forward,
    client_grad,
    cross_entropy,
    distillation_kl,
    replicate,
    sgd_step,
    weighted_mean,
)
from ebfl.learning.torch.stacked import dense_sgd_step_
from ebfl.learning.torch.strategies import (
    GaussianRelease,
    Strategy,
    check_model,
)

__all__ = ["AdaPeD", "DPAdaPeD"]


class AdaPeD(Strategy):
    """AdaPeD (Algorithm 5): personalized models regularized by distillation from a global one.

    Each sampled client, per local iteration:

    * theta <- theta - eta1 (grad f(theta) + grad_theta KD(theta, mu) / (2 psi));
    * mu <- mu - eta2 grad_mu KD(theta_new, mu) / (2 psi);
    * psi <- max(psi - eta3 (1/(2 psi) - KD(theta_new, mu_new) / (2 psi^2)), psi_floor);

    and at the end of a round the server averages the sampled clients' mu and
    psi (unweighted, as printed). KD is KL(p_mu || p_theta) on the client's batch
    (:func:`~ebfl.learning.torch.functional.distillation_kl`); the global model
    learns only by distillation. Message: mu and psi. Reply: the client's mu
    and psi after the round. theta never leaves the client.

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
    joint_release = False  # DPAdaPeD(concatenate=True) releases [h; k] together

    def __init__(self, model, lr_theta=0.1, lr_mu=0.1, lr_psi=3e-2, *, psi0=4.0, psi_floor=0.5,
                 weight_decay=1e-4, fine_tune=False):
        self.model = check_model(model)
        self.lr_theta = check_positive_scalar(lr_theta, "lr_theta")
        self.lr_mu = check_positive_scalar(lr_mu, "lr_mu")
        self.lr_psi = check_nonnegative_scalar(lr_psi, "lr_psi")
        self.psi0 = check_positive_scalar(psi0, "psi0")
        self.psi_floor = check_positive_scalar(psi_floor, "psi_floor")
        if self.psi0 < self.psi_floor:
            raise ValueError(f"psi0 must be >= psi_floor {psi_floor}, got {psi0}")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.fine_tune = self.trains_idle = check_bool(fine_tune, "fine_tune")
        if self.fine_tune:
            self.name = "AdaPeD-FT"

    def config(self):
        return {"name": self.name, "lr_theta": self.lr_theta, "lr_mu": self.lr_mu,
                "lr_psi": self.lr_psi, "psi0": self.psi0, "psi_floor": self.psi_floor,
                "weight_decay": self.weight_decay, "fine_tune": self.fine_tune}

    # ---- server half
    def init_server(self, run):
        return {"mu": self.initial_params(run), "psi": torch.tensor(self.psi0, device=self.device)}

    def broadcast(self, server, rc):
        return {"mu": server["mu"], "psi": server["psi"]}

    def aggregate(self, server, replies, weights, rc):
        return {"mu": weighted_mean(replies["mu"], torch.ones(len(weights), device=self.device)),
                "psi": replies["psi"].mean()}

    def summary(self, server):
        return {"psi": float(server["psi"])}

    # ---- client half
    def init_clients(self, run, data, clients):
        params, k = self.initial_params(run), len(clients)
        state = {"theta": replicate(params, k)}
        if self.fine_tune:  # what each client last received from the server
            state["mu_client"] = replicate(params, k)
            state["psi_client"] = torch.full((k,), self.psi0, device=self.device)
        return state

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        work = {"mu": replicate(message["mu"], k), "psi": message["psi"].expand(k).clone()}
        if self.fine_tune:  # Algorithm 6: kept for the rounds this client is not sampled
            client["mu_client"] = replicate(message["mu"], k)
            client["psi_client"] = work["psi"].clone()
        return work

    def theta_step(self, theta, mu, psi, x, y, scale):
        """eta1 step of the personal models against teachers mu (stacks of K).

        ``theta`` is the sampled (or idle) clients' rows, a copy the engine owns: a
        dense model's step updates it in place and returns it.
        """
        with torch.no_grad():
            teacher = client_forward(self.model, mu, x)
        lr = self.lr_theta * scale
        if dense_sgd_step_(self.model, _theta_loss, theta, x, y, teacher, psi, lr=lr,
                           weight_decay=self.weight_decay):
            return theta
        g = client_grad(self.model, _theta_loss, theta, x, y, teacher, psi)
        return sgd_step(theta, g, lr, self.weight_decay)

    def local_step(self, work, client, x, y, scale, rng):
        mu, psi = work["mu"], work["psi"]
        theta = self.theta_step(client["theta"], mu, psi, x, y, scale)
        with torch.no_grad():
            student = client_forward(self.model, theta, x)

        lr = self.lr_mu * scale
        if self.joint_release:  # [h; k] released together: k at the round's mu (see DPAdaPeD)
            h = client_grad(self.model, _kd_mu, mu, x, student, psi)
            h, k = self.release_joint(h, self._psi_grad(mu, student, psi, x), rng)
            mu = sgd_step(mu, h, lr, self.weight_decay)
        else:
            # without privacy (release_mu passes h on as it is) a dense model's step on
            # mu, this round's copy, is fused in place; DP-AdaPeD must clip h itself
            if type(self).release_mu is not AdaPeD.release_mu \
                    or not dense_sgd_step_(self.model, _kd_mu, mu, x, student, psi, lr=lr,
                                           weight_decay=self.weight_decay):
                h = client_grad(self.model, _kd_mu, mu, x, student, psi)
                mu = sgd_step(mu, self.release_mu(h, rng), lr, self.weight_decay)
            k = self.release_psi(self._psi_grad(mu, student, psi, x), rng)
        psi = torch.clamp(psi - self.lr_psi * k, min=self.psi_floor)
        client["theta"] = theta
        work["mu"], work["psi"] = mu, psi

    def _psi_grad(self, mu, student, psi, x):
        """k = 1/(2 psi) - KD(theta, mu) / (2 psi^2), per client (the printed gradient)."""
        with torch.no_grad():
            kd = torch.vmap(distillation_kl)(client_forward(self.model, mu, x), student)
        return 1 / (2 * psi) - kd / (2 * psi**2)

    def release_mu(self, h, rng):
        """What leaves the client for mu: the gradient itself (DP-AdaPeD privatizes it)."""
        return h

    def release_psi(self, k, rng):
        """What leaves the client for psi."""
        return k

    def client_reply(self, work, client):
        return {"mu": work["mu"], "psi": work["psi"]}

    def idle_step(self, work, client, x, y, scale, rng):
        client["theta"] = self.theta_step(client["theta"], client["mu_client"],
                                          client["psi_client"], x, y, scale)

    def personal(self, message, client, data):
        return client["theta"]


def _theta_loss(forward, params, xb, yb, t, p):
    """The personal model's loss: cross-entropy plus KD(teacher || theta) / (2 psi)."""
    z = forward(params, xb)
    return cross_entropy(z, yb) + distillation_kl(t, z) / (2 * p)


def _kd_mu(forward, params, xb, s, p):
    """The global model's loss: KD(mu || student) / (2 psi)."""
    return distillation_kl(forward(params, xb), s) / (2 * p)


_PSI = "\0psi"  # key of k beside the parameter names in the joint release (no name clash)


class DPAdaPeD(GaussianRelease, AdaPeD):
    """DP-AdaPeD: AdaPeD with clipped, Gaussian-noised mu and psi gradients.

    At every local step each sampled client replaces h and k by
    ``h / max(|h|_2 / C1, 1) + N(0, noise_mu^2 I)`` and
    ``k / max(|k| / C2, 1) + N(0, noise_psi^2)`` (user-level clipping of the
    whole mu gradient, noise before the learning rate). With
    ``concatenate=True`` (as in the paper's experiments) the vector [h; k] is
    clipped to ``clip_mu`` and noised with ``noise_mu`` as one; k is then taken at the
    round's mu rather than the updated one, since both must exist before the
    joint clip (the paper does not say how). theta never leaves the client and
    is not noised. Weight decay on mu is data-independent and kept.

    :meth:`privacy` gives the run's epsilon by the paper's Theorem 7 and by
    the correct accountant (:mod:`ebfl.privacy.accounting`).

    Parameters
    ----------
    clip_mu, noise_mu : float
        C1 > 0 and sigma_q1 >= 0.
    clip_psi, noise_psi : float, optional
        C2 > 0 and sigma_q2 >= 0 (required unless ``concatenate``).
    concatenate : bool
    **kwargs
        As :class:`AdaPeD` (``fine_tune=True`` for E6's local fine-tuning).
    """

    name = "DP-AdaPeD"

    def __init__(self, model, *args, clip_mu, noise_mu, clip_psi=None, noise_psi=None,
                 concatenate=False, **kwargs):
        super().__init__(model, *args, **kwargs)
        if buffer_names(model):
            raise ValueError("model must not have float buffers (BatchNorm running "
                             "statistics): DP-AdaPeD's reply would carry them computed from "
                             "the client's data and not noised (use a model without "
                             "BatchNorm, e.g. with GroupNorm)")
        self.name = "DP-AdaPeD" + ("-FT" if self.fine_tune else "")
        self.clip_mu = check_positive_scalar(clip_mu, "clip_mu")
        self.noise_mu = check_nonnegative_scalar(noise_mu, "noise_mu")
        self.concatenate = self.joint_release = check_bool(concatenate, "concatenate")
        if self.concatenate:
            if clip_psi is not None or noise_psi is not None:
                raise ValueError("concatenate=True uses clip_mu and noise_mu for [h; k]; "
                                 "leave clip_psi and noise_psi unset")
            self.clip_psi = self.noise_psi = None
        else:
            if clip_psi is None or noise_psi is None:
                raise ValueError("clip_psi and noise_psi are required unless concatenate=True")
            self.clip_psi = check_positive_scalar(clip_psi, "clip_psi")
            self.noise_psi = check_nonnegative_scalar(noise_psi, "noise_psi")

    def config(self):
        return {**super().config(), "clip_mu": self.clip_mu, "noise_mu": self.noise_mu,
                "clip_psi": self.clip_psi, "noise_psi": self.noise_psi,
                "concatenate": self.concatenate}

    def release_mu(self, h, rng):
        return self.privatize(h, self.clip_mu, self.noise_mu, rng)

    def release_psi(self, k, rng):
        return self.privatize({"psi": k}, self.clip_psi, self.noise_psi, rng)["psi"]

    def release_joint(self, h, k, rng):
        out = self.privatize({**h, _PSI: k}, self.clip_mu, self.noise_mu, rng)
        return {n: out[n] for n in h}, out[_PSI]

    def privacy(self, delta, *, n_clients, n_sampled, n_iterations, sync_gap,
                sampling="without_replacement", trust="aggregator", accountant="rdp"):
        """Epsilon of a run: Theorem 7 as printed beside the correct accountant.

        Returns
        -------
        dict
            ``theorem7`` (Lemma 2 conversion of the printed RDP curve) and
            ``accountant`` (:func:`ebfl.privacy.accounting.dp_adaped_epsilon`).
        """

        from ebfl.privacy.accounting import (
            DEFAULT_ORDERS,
            dp_adaped_epsilon,
            rdp_to_epsilon,
            theorem7_rdp,
        )

        if self.noise_mu == 0 or (self.noise_psi == 0 and not self.concatenate):
            return {"theorem7": float("inf"), "accountant": float("inf")}
        kw = dict(n_clients=n_clients, n_sampled=n_sampled, n_iterations=n_iterations,
                  sync_gap=sync_gap, clip_mu=self.clip_mu, noise_mu=self.noise_mu,
                  clip_psi=self.clip_psi, noise_psi=self.noise_psi)
        orders = np.asarray(DEFAULT_ORDERS)
        paper = rdp_to_epsilon(orders, theorem7_rdp(orders, **kw), delta)
        correct = dp_adaped_epsilon(delta, sampling=sampling, trust=trust,
                                    accountant=accountant, **kw)
        return {"theorem7": float(paper), "accountant": float(correct.epsilon)}
