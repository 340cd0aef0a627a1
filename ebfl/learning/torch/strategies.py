"""Federated algorithms in torch: each a client half and a server half (:mod:`ebfl.federated`).

Every strategy is one :class:`~ebfl.federated.FederatedAlgorithm`, run by the
in-process engine (:func:`~ebfl.learning.torch.engine.train`, all sampled clients vectorized with
``torch.func.vmap``) and by Flower (:mod:`ebfl.flower.runtime`, one client per
``ClientApp`` call). :class:`Strategy` supplies the local loop; a strategy
implements

server half

* ``init_server(run)``: the server state, from :meth:`Strategy.initial_params`;
* ``broadcast(server, rc)``: the message to the sampled clients (a dict of tensors);
* ``aggregate(server, replies, weights, rc)``: the new server state from the
  replies (stacks, client-id order) and the clients' weights (training-set sizes);
* ``evaluation_message(server)``: what clients need to evaluate (default: nothing);
* ``summary(server)``: scalars for the history;

client half (vectorized over a stack of K clients; K = 1 on Flower)

* ``init_clients(run, data, ids)``: the clients' persistent state (stacks);
* ``client_begin(message, client, rc)``: the round's working state from the message;
* ``local_step(work, client, x, y, scale, rng)``: one local iteration on a
  minibatch (x: (K, B, ...), y: (K, B)); ``scale`` is the learning-rate decay
  factor of the current epoch, ``rng`` the clients' generators of the round
  (one each: privacy noise is drawn from them);
* ``client_reply(work, client)``: what the clients send back;
* ``personal(message, client, data)``: the clients' models for evaluation (or
  ``personal_logits(message, client, data, x)`` for predictors that are not one
  model per client, as FedEM's mixture);
* ``idle_begin`` / ``idle_step`` with ``trains_idle = True``: what unsampled
  clients do (AdaPeD with fine-tuning).

``frozen()`` returns parameters shared by every client's model and left out of
the stacks (a pretrained backbone under adapters; default: none).

``model`` (an ``nn.Module``) is only the architecture: every call goes through
``torch.func.functional_call`` with stacked parameters.

Devices: a strategy computes where its model lives (:attr:`Strategy.device`);
:meth:`Strategy.to` gives a copy on another device. Tensors a strategy makes
are made there (``device=``, ``*_like``), while every random number is drawn
from the clients' CPU generators and then moved, so that a run on a GPU draws
the same numbers as on the CPU.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ebfl._validation import check_bool, check_nonnegative_scalar, check_positive_scalar
from ebfl.federated.protocol import FederatedAlgorithm
from ebfl.federated.tree import tree_take
from ebfl.learning.torch.functional import (
    batch_counters,
    buffer_names,
    ce_loss,
    check_device,
    client_forward,
    client_generators,
    client_grad,
    clip_and_noise,
    clone_params,
    cross_entropy,
    distillation_kl,
    eval_mode,
    fresh_params,
    model_device,
    replicate,
    sgd_step,
    to_device,
    train_mode,
    weighted_mean,
)

__all__ = ["AdaPeD", "DPAdaPeD", "FedAvg", "GaussianRelease", "Local", "Strategy", "check_model",
           "client_test_accuracy"]


def check_model(model):
    """Check the architecture a strategy calls through ``functional_call``; returns it.

    Raises TypeError unless ``model`` is a ``torch.nn.Module``, ValueError when it
    has no trainable parameters or BatchNorm batch counters.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise ValueError("model must have trainable parameters")
    if batch_counters(model):
        raise ValueError("model's BatchNorm layers count batches (num_batches_tracked), which "
                         "per-client stacks cannot update under vmap: remove the counters with "
                         "ebfl.learning.torch.functional.drop_batch_counters(model)")
    return model


def _weights(weights):
    return torch.as_tensor(np.asarray(weights, dtype=np.float64))


#: Clients evaluated per vectorized call (bounds the memory of the test-set forward pass).
EVAL_CHUNK = 16


class Strategy(FederatedAlgorithm):
    """A federated algorithm in torch: the local loop around the strategy's steps.

    Subclasses implement ``config``, ``init_server``, ``broadcast``,
    ``aggregate``, ``client_begin``, ``local_step``, ``client_reply`` and
    ``personal`` (see the module docstring); the rest default to nothing.
    """

    name = "Strategy"
    array_api = "torch"
    #: Initial parameters of one model (default: drawn from the run's seed).
    init_params = None

    def initial_params(self, run):
        """The run's initial parameters (and float buffers) of one model: ``init_params``
        or a fresh initialization drawn from ``run.seed`` (the same on every participant);
        tensors missing from ``init_params`` are freshly initialized."""
        fresh = fresh_params(self.model, run.seed)
        if self.init_params is None:
            return fresh
        return {**fresh, **clone_params(self.init_params)}

    @property
    def device(self):
        """The device this strategy computes on: its model's."""
        return model_device(self.model)

    def to(self, device):
        """A copy of this strategy computing on ``device`` (this one is unchanged).

        The copy's model and every tensor the strategy holds (pretrained
        weights, distillation data, ``init_params``, ...; found in its
        attributes, also inside dicts, lists and tuples) are moved; a tensor
        held twice is moved once and stays shared. On the device it already
        uses, the strategy itself is returned.

        Parameters
        ----------
        device : str or torch.device
            "cpu", "cuda" or "cuda:N".

        Returns
        -------
        Strategy

        Examples
        --------
        >>> from ebfl.learning.torch import FedAvg, LogisticModel
        >>> alg = FedAvg(LogisticModel(4, 3))
        >>> alg.to("cpu") is alg, alg.device
        (True, device(type='cpu'))
        """
        device = check_device(device)
        if self.device == device and all(t.device == device for t in _held_tensors(self)):
            return self
        moved = copy.copy(self)
        memo = {}
        for name, value in vars(self).items():
            setattr(moved, name, _moved(value, device, memo))
        return moved

    def restore_state(self, tree):
        """A state read from a checkpoint (CPU tensors), on this strategy's device."""
        return to_device(tree, self.device)

    def init_clients(self, run, data, clients):
        return {}

    def client_weights(self, data):
        return data.n_train.cpu().numpy().astype(np.float64)

    def client_begin(self, message, client, rc):
        return {}

    def client_reply(self, work, client):
        return {}

    def client_train(self, message, client, data, rc):
        work = self.client_begin(message, client, rc)
        self._local_loop(self.local_step, work, client, data, rc)
        return self.client_reply(work, client)

    def _local_loop(self, step_fn, work, client, data, rc):
        """``local_steps`` calls of ``step_fn`` on minibatches drawn from the clients'
        streams of the round (the same loop for sampled and idle clients)."""
        rng = client_generators(rc.seeds())
        with self.training():
            for step in range(rc.config.local_steps):
                x, y = data.sample_batch(rng, rc.config.batch_size)
                step_fn(work, client, x, y, rc.lr_scale(step), rng)

    def training(self):
        """The model's mode during local steps: a context manager (default: train mode;
        strategies with a frozen backbone keep its BatchNorm layers in eval mode)."""
        return train_mode(self.model)

    def idle_begin(self, message, client, rc):
        return {}

    def idle_step(self, work, client, x, y, scale, rng):
        pass

    def client_idle(self, message, client, data, rc):
        self._local_loop(self.idle_step, self.idle_begin(message, client, rc), client, data, rc)

    def frozen(self):
        return None

    @torch.no_grad()
    def client_logits(self, message, client, data, x):
        """Every client's logits on its inputs x (K, n, ...)."""
        if hasattr(self, "personal_logits"):
            return self.personal_logits(message, client, data, x)
        return client_forward(self.model, self.personal(message, client, data), x,
                              frozen=self.frozen())

    @torch.no_grad()
    def client_evaluate(self, message, client, data):
        """Test accuracy of every client's personal predictor: {"accuracy": (K,)}."""
        k = data.n_clients
        acc = []
        for lo in range(0, k, EVAL_CHUNK):
            rows = np.arange(lo, min(lo + EVAL_CHUNK, k))
            part = data.subset(rows)
            with eval_mode(self.model):
                logits = self.client_logits(message, tree_take(client, rows), part,
                                            part.x_test)
            acc.append(client_test_accuracy(logits, part))
        return {"accuracy": torch.cat(acc)}


def client_test_accuracy(logits, data):
    """Each client's accuracy of ``logits`` (K, n_test_max, classes) on its own test rows
    (the padding rows past ``data.n_test`` excluded)."""
    hit = (logits.argmax(-1) == data.y_test).float()
    rows = torch.arange(data.x_test.shape[1], device=hit.device)
    valid = rows[None, :] < data.n_test[:, None]
    return (hit * valid).sum(1) / data.n_test.float()


def _moved(value, device, memo):
    """``value`` with its modules and tensors on ``device`` (containers rebuilt; ``memo``
    maps id -> moved object, so that shared tensors stay shared)."""
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.nn.Module):
        out = copy.deepcopy(value).to(device)
    elif isinstance(value, torch.Tensor):
        out = value.to(device)
    elif isinstance(value, dict):
        out = {k: _moved(v, device, memo) for k, v in value.items()}
    elif isinstance(value, list | tuple):
        out = type(value)(_moved(v, device, memo) for v in value)
    else:
        return value
    memo[id(value)] = out
    return out


def _held_tensors(strategy):
    """Every tensor a strategy holds in its attributes (modules' parameters and buffers too)."""
    stack = list(vars(strategy).values())
    while stack:
        value = stack.pop()
        if isinstance(value, torch.nn.Module):
            yield from value.parameters()
            yield from value.buffers()
        elif isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)


class _PlainSGD(Strategy):
    """Shared by FedAvg and Local: one learning rate and weight decay."""

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "weight_decay": self.weight_decay}

    def trained_parameters(self):
        """Parameters each client trains (one model; buffers not counted)."""
        return sum(p.numel() for p in self.model.parameters())


class FedAvg(_PlainSGD):
    """FedAvg: local SGD from the global model, server averages weighted by sample counts.

    Message: the global model. Reply: each client's model after the round.

    Parameters
    ----------
    model : nn.Module
    lr : float
    weight_decay : float
    """

    name = "FedAvg"

    def init_server(self, run):
        return {"global": self.initial_params(run)}

    def broadcast(self, server, rc):
        return {"global": server["global"]}

    def evaluation_message(self, server):
        return {"global": server["global"]}

    def client_begin(self, message, client, rc):
        return {"model": replicate(message["global"], rc.clients.size)}

    def local_step(self, work, client, x, y, scale, rng):
        g = client_grad(self.model, ce_loss, work["model"], x, y)
        work["model"] = sgd_step(work["model"], g, self.lr * scale, self.weight_decay)

    def client_reply(self, work, client):
        return {"model": work["model"]}

    def aggregate(self, server, replies, weights, rc):
        return {"global": weighted_mean(replies["model"], _weights(weights))}

    def personal(self, message, client, data):
        return replicate(message["global"], data.n_clients)

    def global_state(self, server):
        """The global model."""
        return server["global"]

    def communicated_parameters(self):
        """Parameters sent each way per round (the global model; buffers not counted)."""
        return self.trained_parameters()


class Local(_PlainSGD):
    """Local training only: every client runs SGD on its own data, nothing is shared."""

    name = "Local"
    all_clients_train = True

    def init_server(self, run):
        return {}

    def init_clients(self, run, data, clients):
        return {"theta": replicate(self.initial_params(run), len(clients))}

    def broadcast(self, server, rc):
        return {}

    def local_step(self, work, client, x, y, scale, rng):
        g = client_grad(self.model, ce_loss, client["theta"], x, y)
        client["theta"] = sgd_step(client["theta"], g, self.lr * scale, self.weight_decay)

    def aggregate(self, server, replies, weights, rc):
        return server

    def global_state(self, server):
        """None: there is no global model."""
        return None

    def communicated_parameters(self):
        """Nothing is communicated."""
        return 0

    def personal(self, message, client, data):
        return client["theta"]


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
        """eta1 step of the personal models against teachers mu (stacks of K)."""
        with torch.no_grad():
            teacher = client_forward(self.model, mu, x)

        def loss(forward, params, xb, yb, t, p):
            z = forward(params, xb)
            return cross_entropy(z, yb) + distillation_kl(t, z) / (2 * p)

        g = client_grad(self.model, loss, theta, x, y, teacher, psi)
        return sgd_step(theta, g, self.lr_theta * scale, self.weight_decay)

    def local_step(self, work, client, x, y, scale, rng):
        mu, psi = work["mu"], work["psi"]
        theta = self.theta_step(client["theta"], mu, psi, x, y, scale)
        with torch.no_grad():
            student = client_forward(self.model, theta, x)

        def kd_mu(forward, params, xb, s, p):
            return distillation_kl(forward(params, xb), s) / (2 * p)

        h = client_grad(self.model, kd_mu, mu, x, student, psi)
        if self.joint_release:  # [h; k] released together: k at the round's mu (see DPAdaPeD)
            h, k = self.release_joint(h, self._psi_grad(mu, student, psi, x), rng)
            mu = sgd_step(mu, h, self.lr_mu * scale, self.weight_decay)
        else:
            mu = sgd_step(mu, self.release_mu(h, rng), self.lr_mu * scale, self.weight_decay)
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


class GaussianRelease:
    """Mixin of the DP strategies: clip-and-noise on the client, before the reply leaves."""

    def privatize(self, tensors, clip, noise_std, rng, *, rows_per_client=1):
        """:func:`~ebfl.learning.torch.functional.clip_and_noise`, client j's noise drawn
        from ``rng[j]``, its stream of the round."""
        return clip_and_noise(tensors, clip, noise_std, rng, rows_per_client=rows_per_client)


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
