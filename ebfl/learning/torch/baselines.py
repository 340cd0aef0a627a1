"""Personalized-FL baselines of the paper's Table 1 and Figure 3, as engine strategies.

FedAvg + fine-tuning, Ditto, pFedMe, Per-FedAvg (first order), QuPeD without
quantization, Federated Mutual Learning, FedEM and DP-FedEM, each a strategy of
the one round loop in :mod:`.engine` with the interface described in
:mod:`.strategies`. Every local step is one vectorized call over the sampled
clients (``torch.func.vmap`` through
:func:`~ebfl.learning.torch.functional.client_grad`); nothing loops over clients.

Conventions shared by all of them (the papers leave these open):

* only the sampled clients train (see :class:`PFedMe` for the exception in
  its authors' code), and the server's averages are weighted by the clients'
  training-set sizes, as :class:`~.strategies.FedAvg` here and the reference
  code the paper used (github.com/CharlieDinh/pFedMe, github.com/omarfoq/FedEM)
  do; several papers print an unweighted mean;
* weight decay applies to every gradient step on model parameters, and the
  engine's per-epoch decay ``scale`` multiplies every learning rate unless a
  class says otherwise;
* KD / KL terms are :func:`~ebfl.learning.torch.functional.distillation_kl`
  (temperature 1, summed over classes, mean over the batch).

Two extra hooks:

* ``bind_data(data)`` (:class:`FedAvgFT`, :class:`PerFedAvg`): their personal
  models are adapted on each client's full training set at evaluation time, so
  they need the :class:`~.data.FederatedDataset`; pass ``data=`` to the
  constructor (or call ``bind_data``) before training.
* ``personal_logits(state, x)`` (:class:`FedEM`): per-client log-probabilities
  of the mixture, which one stack of models cannot express;
  :func:`~ebfl.learning.torch.engine.evaluate_strategy` uses it when present.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ebfl._validation import (
    check_bool,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
)
from ebfl.learning.torch.data import FederatedDataset
from ebfl.learning.torch.functional import (
    client_forward,
    client_grad,
    clone_params,
    cross_entropy,
    distillation_kl,
    fresh_params,
    put,
    replicate,
    sgd_step,
    take,
    weighted_mean,
)
from ebfl.learning.torch.strategies import FedAvg, GaussianRelease, Strategy, _model_iv

__all__ = ["FML", "DPFedEM", "Ditto", "FedAvgFT", "FedEM", "PFedMe", "PerFedAvg", "QuPeDFP",
           "full_batch_steps", "minibatch_steps"]


def _ce_loss(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


def _masked_ce_loss(forward, params, x, y, mask):
    """Mean cross-entropy over the real (mask 1) rows of a padded client dataset."""
    ce = F.cross_entropy(forward(params, x), y, reduction="none")
    return (ce * mask).sum() / mask.sum()


def _dtype(stack):
    return next(iter(stack.values())).dtype


def full_batch_steps(model, stack, data, steps, lr, weight_decay=0.0, *, chunk=16):
    """``steps`` full-batch gradient steps of every client's model on its own training set.

    Deterministic (no sampling): client i's loss is the mean cross-entropy over
    its ``n_train[i]`` real samples (the padding is masked out).

    Parameters
    ----------
    model : nn.Module
    stack : dict
        One model per client (m, ...).
    data : FederatedDataset
    steps : int
    lr, weight_decay : float
    chunk : int
        Clients per vectorized call (bounds the memory).

    Returns
    -------
    dict
        The updated stack (a new one; ``stack`` is not modified).
    """
    steps, lr, weight_decay = _steps_iv(data, steps, lr, weight_decay)
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    m = data.n_clients
    dtype = _dtype(stack)
    out = clone_params(stack)
    width = data.x_train.shape[1]
    for lo in range(0, m, chunk):
        idx = torch.arange(lo, min(lo + chunk, m))
        x, y = data.x_train[idx].to(dtype), data.y_train[idx]
        mask = (torch.arange(width)[None, :] < data.n_train[idx, None]).to(dtype)
        rows = take(out, idx)
        for _ in range(steps):
            g = client_grad(model, _masked_ce_loss, rows, x, y, mask)
            rows = sgd_step(rows, g, lr, weight_decay)
        put(out, idx, rows)
    return out


def minibatch_steps(model, stack, data, steps, lr, weight_decay=0.0, *, batch_size, seed=0):
    """``steps`` minibatch SGD steps of every client's model on its own training set.

    All m clients at once, ``batch_size`` samples each per step, drawn with
    replacement from a generator seeded with ``seed`` (deterministic, and
    independent of the engine's generator). Much cheaper than
    :func:`full_batch_steps` on large clients.
    """
    steps, lr, weight_decay = _steps_iv(data, steps, lr, weight_decay)
    batch_size = check_int_scalar(batch_size, "batch_size", minimum=1)
    gen = torch.Generator().manual_seed(check_int_scalar(seed, "seed", minimum=0,
                                                         maximum=2**64 - 1))
    everyone = torch.arange(data.n_clients)
    dtype = _dtype(stack)
    out = clone_params(stack)
    for _ in range(steps):
        x, y = data.sample_batch(everyone, batch_size, gen)
        g = client_grad(model, _ce_loss, out, x.to(dtype), y)
        out = sgd_step(out, g, lr, weight_decay)
    return out


def _steps_iv(data, steps, lr, weight_decay):
    if not isinstance(data, FederatedDataset):
        raise TypeError(f"data must be a FederatedDataset, got {type(data).__name__}")
    return (check_int_scalar(steps, "steps", minimum=0), check_positive_scalar(lr, "lr"),
            check_nonnegative_scalar(weight_decay, "weight_decay"))


def _adapt(model, stack, data, steps, lr, weight_decay, batch_size, seed):
    if batch_size is None:
        return full_batch_steps(model, stack, data, steps, lr, weight_decay)
    return minibatch_steps(model, stack, data, steps, lr, weight_decay, batch_size=batch_size,
                           seed=seed)


class _BoundData:
    """Holds the clients' training data for personal models adapted at evaluation time."""

    data = None

    def bind_data(self, data):
        """The run's :class:`~.data.FederatedDataset` (its training sets adapt the models)."""
        if not isinstance(data, FederatedDataset):
            raise TypeError("data must be a FederatedDataset")
        self.data = data

    def _bound(self, m):
        if self.data is None:
            raise RuntimeError(f"{self.name} adapts its personal models on the clients' training "
                               "data: pass data= to the constructor (or call bind_data)")
        if self.data.n_clients != m:
            raise ValueError(f"bound data has {self.data.n_clients} clients, the state {m}")
        return self.data


class FedAvgFT(_BoundData, FedAvg):
    """FedAvg + local fine-tuning ("FedAvg+" of Table 1; Jiang et al. 2019, arXiv:1909.12488).

    Training is exactly :class:`~.strategies.FedAvg` (same state, same use of
    the engine's generator). Each client's personal model is the current global
    model after ``finetune_steps`` full-batch gradient steps (rate
    ``finetune_lr``, same weight decay) on the client's whole training set,
    computed at evaluation time in :meth:`personal`. The paper gives no details
    ("fine-tuning details not given", spec B.4): full-batch steps make the
    personal models deterministic and draw nothing from the engine's generator;
    the learning-rate decay is not applied to them.

    Parameters
    ----------
    model : nn.Module
    lr : float
    weight_decay : float
    finetune_steps : int
        Default 10 (= tau, one round of local iterations).
    finetune_lr : float, optional
        Default: ``lr``.
    finetune_batch : int, optional
        Fine-tune with minibatches of this size (drawn from a fixed seed, so still
        deterministic) instead of full batches: far cheaper on large clients.
    data : FederatedDataset, optional
        The clients' data; needed by :meth:`personal` (or :meth:`bind_data`).

    Notes
    -----
    Cost: every evaluation runs ``finetune_steps`` full-batch steps of all m
    clients.
    """

    name = "FedAvg-FT"

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4, finetune_steps=10, finetune_lr=None,
                 finetune_batch=None, data=None):
        super().__init__(model, lr, weight_decay=weight_decay)
        self.finetune_steps = check_int_scalar(finetune_steps, "finetune_steps", minimum=1)
        self.finetune_batch = (None if finetune_batch is None else
                               check_int_scalar(finetune_batch, "finetune_batch", minimum=1))
        self.finetune_lr = (self.lr if finetune_lr is None
                            else check_positive_scalar(finetune_lr, "finetune_lr"))
        if data is not None:
            self.bind_data(data)

    def config(self):
        return {**super().config(), "finetune_steps": self.finetune_steps,
                "finetune_lr": self.finetune_lr, "finetune_batch": self.finetune_batch}

    def personal(self, state):
        data = self._bound(state["m"])
        return _adapt(self.model, replicate(state["global"], state["m"]), data,
                      self.finetune_steps, self.finetune_lr, self.weight_decay,
                      self.finetune_batch, 0)


class Ditto(Strategy):
    """Ditto (Li, Hu, Beirami & Smith, ICML 2021, Algorithm 1).

    The global model is trained by FedAvg. Each sampled client also takes, at
    every local iteration and on the same minibatch, one step on its personal
    model v_i of ``f_i(v) + lam/2 |v - w^t|^2``, where w^t is the global model
    received at the start of the round. Unsampled clients keep their v_i; the
    personal models are evaluated.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the global model's local steps.
    lr_personal : float, optional
        Rate of the personal steps (default: ``lr``).
    lam : float
        lambda >= 0. Default 0.5: Ditto is not in the paper's table and Li et al.
        tune lambda per dataset; 0.5 matches pFedMe's lambda in the same table.
    weight_decay : float
    """

    name = "Ditto"

    def __init__(self, model, lr=0.1, lr_personal=None, *, lam=0.5, weight_decay=1e-4):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = (self.lr if lr_personal is None
                            else check_positive_scalar(lr_personal, "lr_personal"))
        self.lam = check_nonnegative_scalar(lam, "lam")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam, "weight_decay": self.weight_decay}

    def init_state(self, params, m):
        return {"global": clone_params(params), "personal": replicate(params, m)}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def local_step(self, state, active, x, y, scale):
        g = client_grad(self.model, _ce_loss, state["work"], x, y)
        state["work"] = sgd_step(state["work"], g, self.lr * scale, self.weight_decay)
        v, w = take(state["personal"], active), state["global"]
        h = client_grad(self.model, _ce_loss, v, x, y)
        h = {n: h[n] + self.lam * (v[n] - w[n]) for n in v}
        put(state["personal"], active, sgd_step(v, h, self.lr_personal * scale,
                                                self.weight_decay))

    def aggregate(self, state, active, n_samples):
        state["global"] = weighted_mean(state.pop("work"), n_samples.to(torch.float64))

    def personal(self, state):
        return state["personal"]


class PFedMe(Strategy):
    """pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020, Algorithm 1).

    Per local iteration, on one minibatch, each sampled client approximately
    solves ``theta = argmin f_i(theta) + lam/2 |theta - w_i|^2`` by
    ``inner_steps`` (K) gradient steps of rate ``lr_personal``, then moves its
    local copy ``w_i <- w_i - lr lam (w_i - theta)``. The server sets
    ``w <- (1 - beta) w + beta avg(w_i)``. As in the authors' code (which the
    paper used), theta starts each round from the received global model and is
    warm-started across the round's local iterations; the last theta is the
    client's personal model.

    Parameters
    ----------
    model : nn.Module
    lr : float
        eta, the rate of the w_i update (spec table: 0.2).
    lr_personal : float
        The inner problem's rate. The table gives no value; 0.1, pFedMe's own
        MNIST setting and AdaPeD's eta1.
    lam : float
        lambda (spec: 0.5).
    inner_steps : int
        K (spec: 3).
    beta : float
        Server mixing (pFedMe: 1, plain averaging).
    weight_decay : float
        On the inner steps (the authors' optimizer's ``mu``); not on the w_i update.
    train_idle : bool
        The authors' code lets *every* client train each round and aggregates
        only the sampled ones; the unsampled clients' w_i are then discarded but
        their personal theta kept. ``True`` reproduces that (m clients' work per
        round); default ``False``: only sampled clients train, as in every other
        strategy here.
    """

    name = "pFedMe"

    def __init__(self, model, lr=0.2, lr_personal=0.1, *, lam=0.5, inner_steps=3, beta=1.0,
                 weight_decay=1e-4, train_idle=False):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = check_positive_scalar(lr_personal, "lr_personal")
        self.lam = check_positive_scalar(lam, "lam")
        self.inner_steps = check_int_scalar(inner_steps, "inner_steps", minimum=1)
        self.beta = check_positive_scalar(beta, "beta")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.train_idle = check_bool(train_idle, "train_idle")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam, "inner_steps": self.inner_steps, "beta": self.beta,
                "weight_decay": self.weight_decay, "train_idle": self.train_idle}

    def init_state(self, params, m):
        return {"global": clone_params(params), "theta": replicate(params, m), "m": m}

    def broadcast(self, state, active):
        k = active.numel()
        state["work_w"] = replicate(state["global"], k)
        state["work_theta"] = replicate(state["global"], k)
        if self.train_idle and k < state["m"]:
            idle = state["m"] - k
            state["idle_w"] = replicate(state["global"], idle)
            state["idle_theta"] = replicate(state["global"], idle)

    def client_step(self, w, theta, x, y, scale):
        """One local iteration of stacked clients: K inner steps on theta, then the w step."""
        for _ in range(self.inner_steps):
            g = client_grad(self.model, _ce_loss, theta, x, y)
            g = {n: g[n] + self.lam * (theta[n] - w[n]) for n in theta}
            theta = sgd_step(theta, g, self.lr_personal * scale, self.weight_decay)
        rate = self.lr * scale * self.lam
        w = {n: w[n] - rate * (w[n] - theta[n]) for n in w}
        return w, theta

    def local_step(self, state, active, x, y, scale):
        state["work_w"], state["work_theta"] = self.client_step(
            state["work_w"], state["work_theta"], x, y, scale)

    def idle_step(self, state, idle, x, y, scale):
        if self.train_idle and idle.numel():
            state["idle_w"], state["idle_theta"] = self.client_step(
                state["idle_w"], state["idle_theta"], x, y, scale)

    def aggregate(self, state, active, n_samples):
        put(state["theta"], active, state.pop("work_theta"))
        avg = weighted_mean(state.pop("work_w"), n_samples.to(torch.float64))
        state["global"] = {n: (1 - self.beta) * w + self.beta * avg[n]
                           for n, w in state["global"].items()}
        if "idle_theta" in state:
            everyone = torch.arange(state["m"])
            put(state["theta"], everyone[~torch.isin(everyone, active)], state.pop("idle_theta"))
            del state["idle_w"]

    def personal(self, state):
        return state["theta"]


class PerFedAvg(_BoundData, Strategy):
    """Per-FedAvg, first-order version (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020).

    Each local iteration splits the client's minibatch into two halves D, D'
    (the first ``B // 2`` samples and the rest) and takes the FO-MAML step

    ``w <- w - beta (grad f(w - alpha grad f(w; D); D') + weight_decay w)``.

    The server averages the sampled clients' models. A client's personal model
    is one adaptation step ``w - alpha grad f_i(w)`` from the global model on
    its whole training set (full batch, deterministic), or on one minibatch of
    ``adapt_batch`` samples drawn from a fixed seed; computed in
    :meth:`personal`, like the paper's evaluation after one local step.
    Notation is Fallah et al.'s: alpha the adaptation (inner) rate, beta the
    outer rate. Only beta decays per epoch; alpha, which also defines the
    evaluated model, stays fixed; weight decay is on the outer step only.

    Parameters
    ----------
    model : nn.Module
    lr : float
        beta (spec: 0.075).
    alpha : float
        Spec: 0.001.
    weight_decay : float
    adapt_batch : int, optional
        Adapt on one minibatch of this size (fixed seed) instead of the whole
        training set.
    data : FederatedDataset, optional
        The clients' data; needed by :meth:`personal` (or :meth:`bind_data`).
    """

    name = "Per-FedAvg"

    def __init__(self, model, lr=0.075, alpha=0.001, *, weight_decay=1e-4, adapt_batch=None,
                 data=None):
        self.model = _model_iv(model)
        self.adapt_batch = (None if adapt_batch is None else
                            check_int_scalar(adapt_batch, "adapt_batch", minimum=1))
        self.lr = check_positive_scalar(lr, "lr")
        self.alpha = check_positive_scalar(alpha, "alpha")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        if data is not None:
            self.bind_data(data)

    def config(self):
        return {"name": self.name, "lr": self.lr, "alpha": self.alpha,
                "weight_decay": self.weight_decay, "adapt_batch": self.adapt_batch}

    def init_state(self, params, m):
        return {"global": clone_params(params), "m": m}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def local_step(self, state, active, x, y, scale):
        b = x.shape[1]
        if b < 2:
            raise ValueError(f"Per-FedAvg splits each minibatch in two: batch_size must be >= 2, "
                             f"got {b}")
        h = b // 2
        w = state["work"]
        g = client_grad(self.model, _ce_loss, w, x[:, :h], y[:, :h])
        tmp = sgd_step(w, g, self.alpha)
        g = client_grad(self.model, _ce_loss, tmp, x[:, h:], y[:, h:])
        state["work"] = sgd_step(w, g, self.lr * scale, self.weight_decay)

    def aggregate(self, state, active, n_samples):
        state["global"] = weighted_mean(state.pop("work"), n_samples.to(torch.float64))

    def personal(self, state):
        data = self._bound(state["m"])
        return _adapt(self.model, replicate(state["global"], state["m"]), data, 1, self.alpha,
                      0.0, self.adapt_batch, 0)


class _TwoModels(Strategy):
    """A personal model per client plus local copies of one global model (QuPeD, FML)."""

    def init_state(self, params, m):
        return {"global": clone_params(params), "theta": replicate(params, m)}

    def broadcast(self, state, active):
        state["work"] = replicate(state["global"], active.numel())

    def aggregate(self, state, active, n_samples):
        state["global"] = weighted_mean(state.pop("work"), n_samples.to(torch.float64))

    def personal(self, state):
        return state["theta"]


def _ce_kd(w_ce, w_kd):
    """The loss ``w_ce CE(z, y) + w_kd KL(p_teacher || p_z)`` of a client's model."""
    def loss(forward, params, x, y, teacher):
        z = forward(params, x)
        return w_ce * cross_entropy(z, y) + w_kd * distillation_kl(teacher, z)

    return loss


class QuPeDFP(_TwoModels):
    """QuPeD at full precision (Ozkara, Singh, Data & Diggavi, NeurIPS 2021, Algorithm 1).

    Without quantization the centers and the quantization regularizer drop out
    and each sampled client, per local iteration, takes

    * ``theta <- theta - eta1 grad_theta [f(theta) + lam_p KD(w -> theta)]``;
    * ``w <- w - eta3 grad_w [f(w) + lam_p KD(theta_new -> w)]``,

    where ``KD(a -> b) = KL(p_a || p_b)`` (teacher a) and w is the client's copy
    of the global model; the server averages the copies. The global step
    distills from the *updated* personal model, as Algorithm 1 orders them.

    Parameters
    ----------
    model : nn.Module
    lr_theta, lr_global : float
        eta1 and eta3 (spec: 0.1, 0.1).
    lam_p : float
        lambda_p (spec: 0.25).
    weight_decay : float
    """

    name = "QuPeD-FP"

    def __init__(self, model, lr_theta=0.1, lr_global=0.1, *, lam_p=0.25, weight_decay=1e-4):
        self.model = _model_iv(model)
        self.lr_theta = check_positive_scalar(lr_theta, "lr_theta")
        self.lr_global = check_positive_scalar(lr_global, "lr_global")
        self.lam_p = check_nonnegative_scalar(lam_p, "lam_p")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr_theta": self.lr_theta, "lr_global": self.lr_global,
                "lam_p": self.lam_p, "weight_decay": self.weight_decay}

    def local_step(self, state, active, x, y, scale):
        w, theta = state["work"], take(state["theta"], active)
        with torch.no_grad():
            teacher = client_forward(self.model, w, x)
        g = client_grad(self.model, _ce_kd(1.0, self.lam_p), theta, x, y, teacher)
        theta = sgd_step(theta, g, self.lr_theta * scale, self.weight_decay)
        with torch.no_grad():
            teacher = client_forward(self.model, theta, x)
        h = client_grad(self.model, _ce_kd(1.0, self.lam_p), w, x, y, teacher)
        state["work"] = sgd_step(w, h, self.lr_global * scale, self.weight_decay)
        put(state["theta"], active, theta)


class FML(_TwoModels):
    """Federated Mutual Learning (Shen et al. 2020, arXiv:2006.16765).

    Each sampled client trains its private (personal) model and its copy of the
    shared "meme" model by deep mutual learning, per local iteration:

    * ``L_personal = alpha CE(personal) + (1 - alpha) KL(p_meme || p_personal)``;
    * ``L_meme = beta CE(meme) + (1 - beta) KL(p_personal || p_meme)``;

    both models step at once, each against the other's outputs on the same
    batch before either update (the authors' code, github.com/ZJU-DAI/
    Federated-Mutual-Learning, ``train_mutual``). alpha and beta weight the
    cross-entropy, as in the paper and that code. The server averages the memes.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of both models ("same schedule", spec B.4).
    lr_meme : float, optional
        Default: ``lr``.
    alpha, beta : float in [0, 1]
        Spec: 0.25, 0.25.
    weight_decay : float
    """

    name = "FML"

    def __init__(self, model, lr=0.1, lr_meme=None, *, alpha=0.25, beta=0.25,
                 weight_decay=1e-4):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_meme = self.lr if lr_meme is None else check_positive_scalar(lr_meme, "lr_meme")
        self.alpha = check_probability(alpha, "alpha")
        self.beta = check_probability(beta, "beta")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_meme": self.lr_meme, "alpha": self.alpha,
                "beta": self.beta, "weight_decay": self.weight_decay}

    def local_step(self, state, active, x, y, scale):
        meme, theta = state["work"], take(state["theta"], active)
        with torch.no_grad():
            z_meme = client_forward(self.model, meme, x)
            z_personal = client_forward(self.model, theta, x)
        g = client_grad(self.model, _ce_kd(self.alpha, 1 - self.alpha), theta, x, y, z_meme)
        h = client_grad(self.model, _ce_kd(self.beta, 1 - self.beta), meme, x, y, z_personal)
        put(state["theta"], active, sgd_step(theta, g, self.lr * scale, self.weight_decay))
        state["work"] = sgd_step(meme, h, self.lr_meme * scale, self.weight_decay)


def _fresh_params(model, seed, like):
    """Fresh parameters of ``model`` drawn from ``seed`` (global RNG untouched), as ``like``."""
    return {k: v.to(like[k].dtype) for k, v in fresh_params(model, seed).items()}


def _per_sample_ce(logits, y):
    """Per-sample cross-entropy: logits (..., B, C), y (..., B) -> (..., B)."""
    return -torch.gather(F.log_softmax(logits, -1), -1, y.unsqueeze(-1)).squeeze(-1)


def _weighted_ce_loss(forward, params, x, y, q):
    return (q * _per_sample_ce(forward(params, x), y)).mean()


class FedEM(Strategy):
    """FedEM (Marfoq, Neglia, Bellet, Kameni & Vidal, NeurIPS 2021, Algorithm 1).

    The server holds M component models; client i holds mixture weights pi_i
    and predicts with ``sum_m pi_im softmax(h_m(x))``. Per local iteration each
    sampled client

    * E-step on its minibatch: ``q_jm ∝ pi_im exp(-CE(h_m(x_j), y_j))``, with
      its current local copies of the components;
    * one SGD step of every component on ``mean_j q_jm CE(h_m(x_j), y_j)``;

    and at the end of the round ``pi_i`` becomes the mean responsibility over
    the round's minibatches (the paper's M-step, which uses the full local
    dataset once per round; the engine hands out minibatches, so the E-step is
    per minibatch and pi_i stays fixed within a round). The server averages
    each component over the sampled clients.

    Component 0 starts from the engine's initial parameters, component c >= 1
    from a fresh initialization of the model drawn from ``init_seed + c``
    (identical components would stay identical); pi starts uniform.

    Evaluation: :meth:`personal_logits` gives the mixture's log-probabilities
    (:func:`~ebfl.learning.torch.engine.evaluate_strategy` uses it);
    :meth:`personal` returns each client's highest-weight component, for
    callers that need one model per client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Spec (E7): 0.2.
    n_components : int
        M (spec: 2).
    weight_decay : float
    init_seed : int
    """

    name = "FedEM"

    def __init__(self, model, lr=0.2, *, n_components=2, weight_decay=1e-4, init_seed=0):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.n_components = check_int_scalar(n_components, "n_components", minimum=1)
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.init_seed = check_int_scalar(init_seed, "init_seed", minimum=0)

    def config(self):
        return {"name": self.name, "lr": self.lr, "n_components": self.n_components,
                "weight_decay": self.weight_decay, "init_seed": self.init_seed}

    def init_state(self, params, m):
        comps = [clone_params(params)] + [_fresh_params(self.model, self.init_seed + c, params)
                                    for c in range(1, self.n_components)]
        dtype = _dtype(params)
        return {"components": {n: torch.stack([c[n] for c in comps]) for n in params},
                "pi": torch.full((m, self.n_components), 1 / self.n_components, dtype=dtype)}

    def broadcast(self, state, active):
        k = active.numel()
        state["work"] = {n: p.unsqueeze(0).expand(k, *p.shape).clone()
                         for n, p in state["components"].items()}
        state["work_q"] = torch.zeros(k, self.n_components, dtype=state["pi"].dtype)
        state["work_steps"] = torch.zeros((), dtype=torch.int64)

    def local_step(self, state, active, x, y, scale):
        k, mc = active.numel(), self.n_components
        flat = {n: p.reshape(k * mc, *p.shape[2:]) for n, p in state["work"].items()}
        xs = x.repeat_interleave(mc, dim=0)
        ys = y.repeat_interleave(mc, dim=0)
        with torch.no_grad():  # E-step: responsibilities (K, M, B)
            losses = _per_sample_ce(client_forward(self.model, flat, xs), ys).reshape(k, mc, -1)
            q = torch.softmax(torch.log(state["pi"][active])[:, :, None] - losses, dim=1)
        g = client_grad(self.model, _weighted_ce_loss, flat, xs, ys, q.reshape(k * mc, -1))
        flat = sgd_step(flat, self.release(g), self.lr * scale, self.weight_decay)
        state["work"] = {n: p.reshape(k, mc, *p.shape[1:]) for n, p in flat.items()}
        state["work_q"] = state["work_q"] + q.mean(-1)
        state["work_steps"] = state["work_steps"] + 1

    def release(self, g):
        """The components' gradients as they leave the client (DP-FedEM privatizes them)."""
        return g

    def aggregation_weights(self, n_samples):
        """Server weights of the sampled clients: their training-set sizes."""
        return n_samples.to(torch.float64)

    def aggregate(self, state, active, n_samples):
        state["components"] = weighted_mean(state.pop("work"), self.aggregation_weights(n_samples))
        steps = state.pop("work_steps")
        q = state.pop("work_q")
        if int(steps) > 0:
            state["pi"][active] = q / steps

    def personal(self, state):
        best = state["pi"].argmax(1)
        return {n: p[best] for n, p in state["components"].items()}

    @torch.no_grad()
    def personal_logits(self, state, x, *, chunk=16):
        """Log-probabilities of every client's mixture on its own inputs.

        Parameters
        ----------
        state : dict
        x : Tensor (m, n, ...)
            Client i's inputs in row i (e.g. ``data.x_test``).
        chunk : int
            Clients per forward pass.

        Returns
        -------
        Tensor (m, n, classes)
            ``log sum_c pi_ic softmax(h_c(x_ij))``.
        """
        chunk = check_int_scalar(chunk, "chunk", minimum=1)
        comps, pi = state["components"], state["pi"]
        dtype = _dtype(comps)
        m, n = x.shape[:2]
        out = []
        for lo in range(0, m, chunk):
            xb = x[lo:lo + chunk].to(dtype)
            k = xb.shape[0]
            flat = xb.reshape(k * n, *xb.shape[2:])
            parts = []
            for c in range(self.n_components):
                z = functional_call(self.model, {p: v[c] for p, v in comps.items()}, (flat,))
                parts.append(F.log_softmax(z, -1).reshape(k, n, -1)
                             + torch.log(pi[lo:lo + k, c])[:, None, None])
            out.append(torch.logsumexp(torch.stack(parts), dim=0))
        return torch.cat(out)


class DPFedEM(GaussianRelease, FedEM):
    """DP-FedEM as in the paper's Figure 3 (spec B.7, D.9.6): FedEM with the M components'
    gradients concatenated, clipped and Gaussian-noised at every local step.

    Each sampled client's M component gradients, as one vector, are scaled to
    L2 norm at most ``clip`` and N(0, ``noise``^2) is added to every coordinate
    (:func:`~ebfl.learning.torch.functional.clip_and_noise`), exactly the
    mechanism of :class:`~ebfl.learning.torch.DPAdaPeD` with
    ``concatenate=True``; the mixture weights pi never leave the client. The
    server averages the components *unweighted*: weights by training-set size
    would let a large client's update exceed the 1/K share the accountant
    assumes.

    Parameters
    ----------
    model : nn.Module
    lr : float
    clip, noise : float
        C > 0 and sigma >= 0.
    **kwargs
        As :class:`FedEM`.
    """

    name = "DP-FedEM"

    def __init__(self, model, lr=0.2, *, clip, noise, **kwargs):
        super().__init__(model, lr, **kwargs)
        self.clip = check_positive_scalar(clip, "clip")
        self.noise = check_nonnegative_scalar(noise, "noise")

    def config(self):
        return {**super().config(), "clip": self.clip, "noise": self.noise}

    def release(self, g):
        return self.privatize(g, self.clip, self.noise, rows_per_client=self.n_components)

    def aggregation_weights(self, n_samples):
        return torch.ones(n_samples.shape, dtype=torch.float64)

    def privacy(self, delta, *, n_clients, n_sampled, n_iterations, sync_gap,
                sampling="without_replacement", trust="aggregator", accountant="rdp"):
        """Epsilon of a run by the accountant of :func:`ebfl.privacy.accounting.dp_adaped_epsilon`.

        The released mechanism is the same as concatenated DP-AdaPeD's (one
        block, clip C, noise sigma per step, tau steps per round), so the same
        accountant applies; the paper states no privacy theorem for DP-FedEM.

        Returns
        -------
        float
            Epsilon at ``delta`` (inf without noise).
        """
        from ebfl.privacy.accounting import dp_adaped_epsilon

        if self.noise == 0:
            return float("inf")
        return float(dp_adaped_epsilon(delta, n_clients=n_clients, n_sampled=n_sampled,
                                       n_iterations=n_iterations, sync_gap=sync_gap,
                                       clip_mu=self.clip, noise_mu=self.noise, sampling=sampling,
                                       trust=trust, accountant=accountant).epsilon)
