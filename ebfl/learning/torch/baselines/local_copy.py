"""Baselines whose clients train a local copy of the global model beside a personal one:
Ditto, pFedMe, Per-FedAvg (first order) and APFL."""

from __future__ import annotations

import torch

from ebfl._validation import (
    check_bool,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
)
from ebfl.learning.torch.baselines.adaptation import (
    _AdaptedGlobal,
    _dtype,
    _OneGlobalModel,
)
from ebfl.learning.torch.functional import (
    buffer_names,
    ce_loss,
    client_grad,
    cross_entropy,
    replicate,
    sgd_step,
    weighted_mean,
)
from ebfl.learning.torch.strategies import (
    Strategy,
    _weights,
    check_model,
)

__all__ = ["APFL", "Ditto", "PFedMe", "PerFedAvg"]


# --- one global model trained from local copies ----------------------------------------------

class _LocalCopyOfGlobal(_OneGlobalModel, Strategy):
    """The server's global model, trained by the sampled clients on local copies.

    Message: the global model. Reply: each sampled client's copy after the
    round. The server averages the copies weighted by the clients' weights.
    """

    def init_server(self, run):
        return {"global": self.initial_params(run)}

    def broadcast(self, server, rc):
        return {"global": server["global"]}

    def client_begin(self, message, client, rc):
        return {"model": replicate(message["global"], rc.clients.size)}

    def client_reply(self, work, client):
        return {"model": work["model"]}

    def aggregate(self, server, replies, weights, rc):
        return {"global": weighted_mean(replies["model"], _weights(weights))}


class _TwoModels(_LocalCopyOfGlobal):
    """A personal model ``theta`` per client beside the local copy of the global one (QuPeD,
    FML); the personal models are evaluated and never leave the clients."""

    models_per_client = 2

    def init_clients(self, run, data, clients):
        return {"theta": replicate(self.initial_params(run), len(clients))}

    def personal(self, message, client, data):
        return client["theta"]


class Ditto(_LocalCopyOfGlobal):
    """Ditto (Li, Hu, Beirami & Smith, ICML 2021, Algorithm 1).

    The global model is trained by FedAvg. Each sampled client also takes, at
    every local iteration and on the same minibatch, one step on its personal
    model v_i of ``f_i(v) + lam/2 |v - w^t|^2``, where w^t is the global model
    received at the start of the round. Unsampled clients keep their v_i; the
    personal models are evaluated.

    Message: the global model w^t. Reply: the client's local copy of the
    global model after the round. v_i (client state ``personal``) stays on
    the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the global model's local steps.
    lr_personal : float, optional
        Rate of the personal steps (default: ``lr``).
    lam : float
        lambda >= 0. Default 0.5: Ditto is not in the paper's table and Li et al.
        tune lambda per dataset; 0.5 matches pFedMe's lambda in Section 4.1 of
        Ozkara et al.
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> Ditto(LogisticModel(4, 3), 0.1, lam=0.2).config()["lr_personal"]
    0.1
    """

    name = "Ditto"
    models_per_client = 2

    def __init__(self, model, lr=0.1, lr_personal=None, *, lam=0.5, weight_decay=1e-4):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = (self.lr if lr_personal is None
                            else check_positive_scalar(lr_personal, "lr_personal"))
        self.lam = check_nonnegative_scalar(lam, "lam")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam, "weight_decay": self.weight_decay}

    def init_clients(self, run, data, clients):
        return {"personal": replicate(self.initial_params(run), len(clients))}

    def client_begin(self, message, client, rc):
        return {**super().client_begin(message, client, rc), "anchor": message["global"]}

    def local_step(self, work, client, x, y, scale, rng):
        g = client_grad(self.model, ce_loss, work["model"], x, y)
        work["model"] = sgd_step(work["model"], g, self.lr * scale, self.weight_decay)
        v, w = client["personal"], work["anchor"]
        h = client_grad(self.model, ce_loss, v, x, y)
        # the proximal pull acts on the parameters (the gradient's names), not on buffers
        h = {n: gn + self.lam * (v[n] - w[n]) for n, gn in h.items()}
        client["personal"] = sgd_step(v, h, self.lr_personal * scale, self.weight_decay)

    def personal(self, message, client, data):
        return client["personal"]


class PFedMe(_LocalCopyOfGlobal):
    """pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020, Algorithm 1).

    Per local iteration, on one minibatch, each sampled client approximately
    solves ``theta = argmin f_i(theta) + lam/2 |theta - w_i|^2`` by
    ``inner_steps`` (K) gradient steps of rate ``lr_personal``, then moves its
    local copy ``w_i <- w_i - lr lam (w_i - theta)``. The server sets
    ``w <- (1 - beta) w + beta avg(w_i)``. As in the authors' code (which the
    paper used), theta starts each round from the received global model and is
    warm-started across the round's local iterations; the last theta is the
    client's personal model. Only theta is run on data, so its BatchNorm
    running statistics are updated by its forward passes, and w_i's follow
    theta's by the same pull ``lr lam (w_i - theta)`` as its parameters.

    Message: the global model w. Reply: the client's w_i after the round.
    theta (client state) stays on the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        eta, the rate of the w_i update (Section 4.1 of Ozkara et al.: 0.2).
    lr_personal : float
        The inner problem's rate. The paper gives no value; 0.1, pFedMe's own
        MNIST setting and AdaPeD's eta1.
    lam : float
        lambda (Section 4.1: 0.5).
    inner_steps : int
        K (Section 4.1: 3).
    beta : float
        Server mixing (pFedMe: 1, plain averaging).
    weight_decay : float
        On the inner steps (the authors' optimizer's ``mu``); not on the w_i update.
    train_idle : bool
        The authors' code lets *every* client train each round and aggregates
        only the sampled ones; the unsampled clients' w_i are then discarded but
        their personal theta kept. ``True`` reproduces that (m clients' work per
        round: the unsampled clients receive the global model too); default
        ``False``: only sampled clients train, as in every other strategy here.

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> PFedMe(LogisticModel(4, 3), train_idle=True).trains_idle
    True
    """

    name = "pFedMe"
    models_per_client = 2

    def __init__(self, model, lr=0.2, lr_personal=0.1, *, lam=0.5, inner_steps=3, beta=1.0,
                 weight_decay=1e-4, train_idle=False):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = check_positive_scalar(lr_personal, "lr_personal")
        self.lam = check_positive_scalar(lam, "lam")
        self.inner_steps = check_int_scalar(inner_steps, "inner_steps", minimum=1)
        self.beta = check_positive_scalar(beta, "beta")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.train_idle = self.trains_idle = check_bool(train_idle, "train_idle")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam, "inner_steps": self.inner_steps, "beta": self.beta,
                "weight_decay": self.weight_decay, "train_idle": self.train_idle}

    def init_clients(self, run, data, clients):
        return {"theta": replicate(self.initial_params(run), len(clients))}

    def client_begin(self, message, client, rc):
        client["theta"] = replicate(message["global"], rc.clients.size)
        return super().client_begin(message, client, rc)

    def client_step(self, w, theta, x, y, scale):
        """One local iteration of stacked clients: K inner steps on theta, then the w step."""
        for _ in range(self.inner_steps):
            g = client_grad(self.model, ce_loss, theta, x, y)
            g = {n: gn + self.lam * (theta[n] - w[n]) for n, gn in g.items()}  # parameters only
            theta = sgd_step(theta, g, self.lr_personal * scale, self.weight_decay)
        rate = self.lr * scale * self.lam
        # w is never run on data: its buffers (BatchNorm statistics) follow theta's by the
        # same pull as its parameters
        w = {n: w[n] - rate * (w[n] - theta[n]) for n in w}
        return w, theta

    def local_step(self, work, client, x, y, scale, rng):
        work["model"], client["theta"] = self.client_step(work["model"], client["theta"], x, y,
                                                          scale)

    def aggregate(self, server, replies, weights, rc):
        avg = weighted_mean(replies["model"], _weights(weights))
        return {"global": {n: (1 - self.beta) * w + self.beta * avg[n]
                           for n, w in server["global"].items()}}

    # unsampled clients (train_idle): the same round, their w_i never sent
    def idle_message(self, server, rc):
        return {"global": server["global"]} if self.trains_idle else {}

    def idle_begin(self, message, client, rc):
        return self.client_begin(message, client, rc)

    def idle_step(self, work, client, x, y, scale, rng):
        self.local_step(work, client, x, y, scale, rng)

    def personal(self, message, client, data):
        return client["theta"]


class PerFedAvg(_AdaptedGlobal, _LocalCopyOfGlobal):
    """Per-FedAvg, first-order version (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020).

    Each local iteration splits the client's minibatch into two halves D, D'
    (the first ``B // 2`` samples and the rest) and takes the FO-MAML step

    ``w <- w - beta (grad f(w - alpha grad f(w; D); D') + weight_decay w)``.

    The server averages the sampled clients' models. A client's personal model
    is one adaptation step ``w - alpha grad f_i(w)`` from the global model on
    its whole training set (full batch, deterministic), or on one minibatch of
    ``adapt_batch`` samples from the client's own stream (as
    :class:`~ebfl.learning.torch.baselines.FedAvgFT`'s ``finetune_batch``); computed in
    :meth:`personal`, like
    the paper's evaluation after one local step. Notation is Fallah et al.'s:
    alpha the adaptation (inner) rate, beta the outer rate. Only beta decays per
    epoch; alpha, which also defines the evaluated model, stays fixed; weight
    decay is on the outer step only.

    Message: the global model. Reply: the client's model after the round.

    Parameters
    ----------
    model : nn.Module
    lr : float
        beta (Section 4.1 of Ozkara et al.: 0.075).
    alpha : float
        Section 4.1: 0.001.
    weight_decay : float
    adapt_batch : int, optional
        Adapt on one minibatch of this size instead of the whole training set.

    Notes
    -----
    The run's ``batch_size`` must be >= 2 (each minibatch is split in two).

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> PerFedAvg(LogisticModel(4, 3), adapt_batch=32).config()["alpha"]
    0.001
    """

    name = "Per-FedAvg"

    def __init__(self, model, lr=0.075, alpha=0.001, *, weight_decay=1e-4, adapt_batch=None):
        self.model = check_model(model)
        self.adapt_batch = (None if adapt_batch is None else
                            check_int_scalar(adapt_batch, "adapt_batch", minimum=1))
        self.lr = check_positive_scalar(lr, "lr")
        self.alpha = check_positive_scalar(alpha, "alpha")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "alpha": self.alpha,
                "weight_decay": self.weight_decay, "adapt_batch": self.adapt_batch}

    def init_clients(self, run, data, clients):
        if run.batch_size < 2:  # checked here, before any work, on every runtime
            raise ValueError(f"Per-FedAvg splits each minibatch in two: batch_size must be >= 2, "
                             f"got {run.batch_size}")
        return self._adaptation_state(run, clients, self.adapt_batch)

    def local_step(self, work, client, x, y, scale, rng):
        h = x.shape[1] // 2
        w = work["model"]
        g = client_grad(self.model, ce_loss, w, x[:, :h], y[:, :h])
        tmp = sgd_step(w, g, self.alpha)
        g = client_grad(self.model, ce_loss, tmp, x[:, h:], y[:, h:])
        work["model"] = sgd_step(w, g, self.lr * scale, self.weight_decay)

    def evaluation_message(self, server):
        return {"global": server["global"]}

    def personal(self, message, client, data):
        return self._adapt(message, client, data, 1, self.alpha, 0.0, self.adapt_batch)


# APFL's mixing weight sits in the differentiated stack beside the parameter names ("\0": no
# parameter is named so).
_ALPHA = "\0alpha"


def _mix(alpha, v, w):
    """alpha v + (1 - alpha) w, alpha a scalar or one value per row of v and w."""
    if alpha.dim():  # (K,): broadcast over each client's parameter
        alpha = alpha.reshape(-1, *([1] * (v.dim() - 1)))
    return alpha * v + (1 - alpha) * w


def _mixture_loss(forward, params, x, y, w):
    """Cross-entropy of the mixed model alpha v + (1 - alpha) w, a function of v and alpha."""
    alpha = params[_ALPHA]
    mixed = {n: _mix(alpha, v, w[n]) for n, v in params.items() if n != _ALPHA}
    return cross_entropy(forward(mixed, x), y)


class APFL(_LocalCopyOfGlobal):
    """APFL, adaptive personalized FL (Deng, Kamani & Mahdavi 2020, arXiv:2003.13461).

    Each client keeps a personal model v_i and a mixing weight alpha_i, and
    predicts with the parameter mixture ``v̄_i = alpha_i v_i + (1 - alpha_i) w``.
    Per local iteration, on one minibatch and from the values before the
    iteration (Deng et al.'s Algorithm 1):

    * ``w_i <- w_i - lr grad f_i(w_i)``, the client's copy of the global model;
    * ``v_i <- v_i - lr_personal grad_v f_i(v̄_i)``, where
      ``grad_v f_i(v̄_i) = alpha_i grad f_i(v̄_i)`` (the chain rule through the
      mixture, with ``v̄_i = alpha_i v_i + (1 - alpha_i) w_i``);
    * with ``learn_alpha``, ``alpha_i <- clip(alpha_i - lr_alpha
      <v_i - w_i, grad f_i(v̄_i)>, 0, 1)``: the gradient step of Deng et al.'s
      adaptive alpha, projected back onto [0, 1] (the only values for which
      v̄_i is a convex mixture; the paper leaves the projection implicit).

    The server averages the copies w_i. A client's personal predictor is
    ``alpha_i v_i + (1 - alpha_i) w`` with the current global model w.
    BatchNorm statistics: the mixture is run with v_i's buffers, which are
    therefore the personal predictor's statistics; w_i's are updated by its own
    steps. Unsampled clients keep v_i and alpha_i.

    Message: the global model. Reply: the client's copy w_i after the round.
    v_i and alpha_i (client state ``personal``, ``alpha``) stay on the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the steps on w_i.
    lr_personal : float, optional
        Rate of the steps on v_i (default: ``lr``; Deng et al. use one rate).
    alpha : float in [0, 1]
        The initial mixing weight (default 0.5, an implementation choice), or
        the fixed one with ``learn_alpha=False``.
    learn_alpha : bool
        Learn alpha_i per client (the paper's adaptive APFL).
    lr_alpha : float, optional
        Rate of the alpha steps (default: ``lr_personal``).
    weight_decay : float
        On the steps of w_i and v_i (not on alpha).

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> alg = APFL(LogisticModel(4, 3), 0.1, alpha=0.25)
    >>> alg.config()["alpha"], alg.trained_parameters(), alg.communicated_parameters()
    (0.25, 31, 15)
    """

    name = "APFL"
    models_per_client = 2

    def __init__(self, model, lr=0.1, lr_personal=None, *, alpha=0.5, learn_alpha=True,
                 lr_alpha=None, weight_decay=1e-4):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = (self.lr if lr_personal is None
                            else check_positive_scalar(lr_personal, "lr_personal"))
        self.alpha = check_probability(alpha, "alpha")
        self.learn_alpha = check_bool(learn_alpha, "learn_alpha")
        self.lr_alpha = (self.lr_personal if lr_alpha is None
                         else check_positive_scalar(lr_alpha, "lr_alpha"))
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "alpha": self.alpha, "learn_alpha": self.learn_alpha, "lr_alpha": self.lr_alpha,
                "weight_decay": self.weight_decay}

    def trained_parameters(self):
        """Parameters each client trains: v_i and w_i, plus alpha_i when it is learned."""
        return super().trained_parameters() + int(self.learn_alpha)

    def init_clients(self, run, data, clients):
        params, k = self.initial_params(run), len(clients)
        return {"personal": replicate(params, k),
                "alpha": torch.full((k,), self.alpha, dtype=_dtype(params), device=self.device)}

    def evaluation_message(self, server):
        return {"global": server["global"]}

    def local_step(self, work, client, x, y, scale, rng):
        w, v, alpha = work["model"], client["personal"], client["alpha"]
        buffers = set(buffer_names(self.model))
        w_params = {n: t for n, t in w.items() if n not in buffers}
        g = client_grad(self.model, _mixture_loss, {**v, _ALPHA: alpha}, x, y, w_params)
        g_alpha = g.pop(_ALPHA)
        h = client_grad(self.model, ce_loss, w, x, y)
        work["model"] = sgd_step(w, h, self.lr * scale, self.weight_decay)
        client["personal"] = sgd_step(v, g, self.lr_personal * scale, self.weight_decay)
        if self.learn_alpha:
            client["alpha"] = torch.clamp(alpha - self.lr_alpha * scale * g_alpha, 0.0, 1.0)

    def personal(self, message, client, data):
        alpha, w = client["alpha"], message["global"]
        buffers = set(buffer_names(self.model))
        return {n: v if n in buffers else _mix(alpha, v, w[n])
                for n, v in client["personal"].items()}
