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
* ``frozen(state)``: parameters shared by every client's model and left out of
  ``personal`` (default: none);
* ``summary(state)``: scalars for the history.

:class:`Strategy` gives the optional ones (broadcast, idle step, aggregate,
frozen, summary) as no-ops; every strategy here and in :mod:`.baselines`
derives from it. Optional hooks the engine calls when present:
``bind_generator(gen)`` (strategies that draw noise), ``bind_data(data)``
(strategies that adapt on local data to predict) and
``personal_logits(state, x)`` (predictors that are not one model per client).

The same loop is meant to carry the algorithms of the other papers:

* heterogeneous privacy levels (FedHDP): per-client clip and noise levels are
  strategy attributes indexed by ``active``, the noise comes from the bound
  generator (:class:`GaussianRelease`), and the group-wise weighted average is
  the strategy's ``aggregate``;
* a frozen backbone with small trainable adapters (PerAda): the stacks hold
  only the adapters, the backbone is passed once as ``frozen=`` to
  :func:`~.functional.client_grad` / :func:`~.functional.client_forward` and
  returned by ``frozen(state)`` for evaluation; server-side distillation on
  unlabeled data runs inside ``aggregate``.

``tests/test_torch_extensibility.py`` runs both shapes through :func:`~.engine.train`.

``model`` (an ``nn.Module``) is only the architecture: every call goes through
``torch.func.functional_call`` with stacked parameters.
"""

from __future__ import annotations

import torch

from ebfl._validation import check_bool, check_nonnegative_scalar, check_positive_scalar
from ebfl.learning.torch.functional import (
    client_forward,
    client_grad,
    clip_and_noise,
    clone_params,
    cross_entropy,
    distillation_kl,
    put,
    replicate,
    sgd_step,
    take,
    weighted_mean,
)

__all__ = ["AdaPeD", "DPAdaPeD", "FedAvg", "GaussianRelease", "Local", "Strategy"]


def _ce_loss(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


def _model_iv(model):
    """The architecture every strategy calls through ``functional_call``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise ValueError("model must have trainable parameters")
    return model


class Strategy:
    """The protocol of the module docstring, with the optional steps as no-ops.

    Subclasses implement ``config``, ``init_state``, ``local_step`` and
    ``personal``, and override the others when they do something.
    """

    name = "Strategy"
    #: True: every client trains every round (no sampling), as in local training.
    all_clients_train = False

    def broadcast(self, state, active):
        pass

    def idle_step(self, state, idle, x, y, scale):
        pass

    def aggregate(self, state, active, n_samples):
        pass

    def frozen(self, state):
        return None

    def summary(self, state):
        return {}


class _PlainSGD(Strategy):
    """Shared by FedAvg and Local: one learning rate and weight decay."""

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "weight_decay": self.weight_decay}


class FedAvg(_PlainSGD):
    """FedAvg: local SGD from the global model, server averages weighted by sample counts.

    Parameters
    ----------
    model : nn.Module
    lr : float
    weight_decay : float
    """

    name = "FedAvg"

    def init_state(self, params, m):
        return {"global": clone_params(params), "m": m}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def local_step(self, state, active, x, y, scale):
        g = client_grad(self.model, _ce_loss, state["work"], x, y)
        state["work"] = sgd_step(state["work"], g, self.lr * scale, self.weight_decay)

    def aggregate(self, state, active, n_samples):
        state["global"] = weighted_mean(state.pop("work"), n_samples.to(torch.float32))

    def personal(self, state):
        return replicate(state["global"], state["m"])


class Local(_PlainSGD):
    """Local training only: every client runs SGD on its own data, nothing is shared."""

    name = "Local"
    all_clients_train = True

    def init_state(self, params, m):
        return {"theta": replicate(params, m)}

    def local_step(self, state, active, x, y, scale):
        rows = take(state["theta"], active)
        g = client_grad(self.model, _ce_loss, rows, x, y)
        put(state["theta"], active, sgd_step(rows, g, self.lr * scale, self.weight_decay))

    def personal(self, state):
        return state["theta"]


class AdaPeD(Strategy):
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
    joint_release = False  # DPAdaPeD(concatenate=True) releases [h; k] together

    def __init__(self, model, lr_theta=0.1, lr_mu=0.1, lr_psi=3e-2, *, psi0=4.0, psi_floor=0.5,
                 weight_decay=1e-4, fine_tune=False):
        self.model = _model_iv(model)
        self.lr_theta = check_positive_scalar(lr_theta, "lr_theta")
        self.lr_mu = check_positive_scalar(lr_mu, "lr_mu")
        self.lr_psi = check_nonnegative_scalar(lr_psi, "lr_psi")
        self.psi0 = check_positive_scalar(psi0, "psi0")
        self.psi_floor = check_positive_scalar(psi_floor, "psi_floor")
        if self.psi0 < self.psi_floor:
            raise ValueError(f"psi0 must be >= psi_floor {psi_floor}, got {psi0}")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.fine_tune = check_bool(fine_tune, "fine_tune")
        if self.fine_tune:
            self.name = "AdaPeD-FT"

    def config(self):
        return {"name": self.name, "lr_theta": self.lr_theta, "lr_mu": self.lr_mu,
                "lr_psi": self.lr_psi, "psi0": self.psi0, "psi_floor": self.psi_floor,
                "weight_decay": self.weight_decay, "fine_tune": self.fine_tune}

    def init_state(self, params, m):
        state = {"theta": replicate(params, m),
                 "mu": clone_params(params),
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
        if self.joint_release:  # [h; k] released together: k at the round's mu (see DPAdaPeD)
            h, k = self.release_joint(h, self._psi_grad(mu, student, psi, x))
            mu = sgd_step(mu, h, self.lr_mu * scale, self.weight_decay)
        else:
            mu = sgd_step(mu, self.release_mu(h), self.lr_mu * scale, self.weight_decay)
            k = self.release_psi(self._psi_grad(mu, student, psi, x))
        psi = torch.clamp(psi - self.lr_psi * k, min=self.psi_floor)
        put(state["theta"], active, theta)
        state["work_mu"], state["work_psi"] = mu, psi

    def _psi_grad(self, mu, student, psi, x):
        """k = 1/(2 psi) - KD(theta, mu) / (2 psi^2), per client (the printed gradient)."""
        with torch.no_grad():
            kd = torch.vmap(distillation_kl)(client_forward(self.model, mu, x), student)
        return 1 / (2 * psi) - kd / (2 * psi**2)

    def release_mu(self, h):
        """What leaves the client for mu: the gradient itself (DP-AdaPeD privatizes it)."""
        return h

    def release_psi(self, k):
        """What leaves the client for psi."""
        return k

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


class GaussianRelease:
    """Mixin of the DP strategies: clip-and-noise drawing from the engine's generator."""

    generator = None

    def bind_generator(self, generator):
        """The engine's generator, the source of the privacy noise."""
        self.generator = generator

    def privatize(self, tensors, clip, noise_std, *, rows_per_client=1):
        """:func:`~ebfl.learning.torch.functional.clip_and_noise` with the bound generator."""
        if self.generator is None:
            raise RuntimeError(f"{type(self).__name__} draws its noise from the engine's "
                               "generator: run it through ebfl.learning.torch.train (or call "
                               "bind_generator)")
        return clip_and_noise(tensors, clip, noise_std, self.generator,
                              rows_per_client=rows_per_client)


_PSI = "\0psi"  # key of k beside the parameter names in the joint release (no name clash)


class DPAdaPeD(GaussianRelease, AdaPeD):
    """DP-AdaPeD (spec D.9): AdaPeD with clipped, Gaussian-noised mu and psi gradients.

    At every local step each sampled client replaces h and k by
    ``h / max(|h|_2 / C1, 1) + N(0, noise_mu^2 I)`` and
    ``k / max(|k| / C2, 1) + N(0, noise_psi^2)`` (user-level clipping of the
    whole mu gradient, noise before the learning rate, D.9.1). With
    ``concatenate=True`` (E6/E7, D.9.6) the vector [h; k] is clipped to
    ``clip_mu`` and noised with ``noise_mu`` as one; k is then taken at the
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

    def release_mu(self, h):
        return self.privatize(h, self.clip_mu, self.noise_mu)

    def release_psi(self, k):
        return self.privatize({"psi": k}, self.clip_psi, self.noise_psi)["psi"]

    def release_joint(self, h, k):
        out = self.privatize({**h, _PSI: k}, self.clip_mu, self.noise_mu)
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
        import numpy as np

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
