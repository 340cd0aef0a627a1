"""Personalized-FL baselines of the paper's Table 1 and Figure 3, as federated strategies.

FedAvg + fine-tuning, Ditto, pFedMe, Per-FedAvg (first order), QuPeD without
quantization, Federated Mutual Learning, FedEM and DP-FedEM, and the full-model
baselines of PerAda (Xie et al., CVPR 2024, Tables 1 and 2): APFL and FedDF, each one
:class:`~ebfl.learning.torch.strategies.Strategy`: a server half and a client
half (:mod:`ebfl.federated.protocol`), run in process by
:func:`~ebfl.learning.torch.engine.train` (every sampled client at once, each
local step one ``torch.func.vmap`` call through
:func:`~ebfl.learning.torch.functional.client_grad`) and on Flower (one client
per call) to the same result.

Every class says what crosses the network: its *message* (server to the
sampled clients) and its *reply* (each client to the server). What a client
keeps between rounds (personal models, FedEM's mixture weights) is its
persistent state and never leaves it.

Conventions shared by all of them (the papers leave these open):

* only the sampled clients train (see :class:`PFedMe` for the exception in
  its authors' code), and the server's averages are weighted by the clients'
  training-set sizes, as :class:`~.strategies.FedAvg` here and the reference
  code the paper used (github.com/CharlieDinh/pFedMe, github.com/omarfoq/FedEM)
  do; several papers print an unweighted mean;
* weight decay applies to every gradient step on model parameters, and the
  per-epoch learning-rate decay multiplies every learning rate unless a class
  says otherwise;
* KD / KL terms are :func:`~ebfl.learning.torch.functional.distillation_kl`
  (temperature 1, summed over classes, mean over the batch);
* a model's float buffers (BatchNorm running statistics) travel in the stacks
  with its parameters: each model's statistics are updated by the train-mode
  forward passes of its own gradient steps (a forward pass that only computes a
  teacher's outputs leaves them alone), gradient and proximal terms act on
  parameters only, and the server averages buffers as it averages parameters.

Every class reports what Table 1 of PerAda counts: ``trained_parameters()``
(per client) and ``communicated_parameters()`` (per client and round, each
way), both in parameters (buffers not counted), and ``global_state()``, the
server's global model (None where there is none).

:class:`FedAvgFT` and :class:`PerFedAvg` adapt the global model on each
client's own training set at evaluation time, in ``personal(message, client,
data)``; :class:`FedEM` predicts with a mixture, through
``personal_logits(message, client, data, x)``.

Examples
--------
>>> import numpy as np
>>> from ebfl.learning.torch import FederatedDataset, LogisticModel, train
>>> from ebfl.learning.torch.baselines import Ditto
>>> rng = np.random.default_rng(0)
>>> xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(3)]
>>> ys = [(x[:, 0] > 0).astype(np.int64) for x in xs]
>>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
>>> res = train(Ditto(LogisticModel(4, 2), 0.5), data, rounds=2, local_steps=2, batch_size=5)
>>> sorted(res.server), sorted(res.clients), tuple(res.accuracy.shape)
(['global'], ['personal'], (3,))
"""

from __future__ import annotations

import numpy as np
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
from ebfl.federated.protocol import MAX_SEED
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.learning.torch.data import ClientSubset, FederatedDataset
from ebfl.learning.torch.functional import (
    buffer_names,
    client_forward,
    client_generators,
    client_grad,
    clone_params,
    cross_entropy,
    distillation_kl,
    fresh_params,
    replicate,
    sgd_step,
    weighted_mean,
)
from ebfl.learning.torch.perada import ServerDistillation
from ebfl.learning.torch.strategies import (
    FedAvg,
    GaussianRelease,
    Strategy,
    _ce_loss,
    _model_iv,
    _weights,
)

__all__ = ["APFL", "FML", "DPFedEM", "Ditto", "FedAvgFT", "FedDF", "FedEM", "PFedMe", "PerFedAvg",
           "QuPeDFP", "full_batch_steps", "minibatch_steps"]


def _masked_ce_loss(forward, params, x, y, mask):
    """Mean cross-entropy over the real (mask 1) rows of a padded client dataset."""
    ce = F.cross_entropy(forward(params, x), y, reduction="none")
    return (ce * mask).sum() / mask.sum()


def _dtype(stack):
    return next(iter(stack.values())).dtype


def _n_parameters(model):
    """Parameters of one model (buffers not counted): the unit of Table 1 of PerAda."""
    return sum(p.numel() for p in model.parameters())


def _uses_batch_statistics(model):
    """Whether a forward pass normalizes with batch statistics (a BatchNorm in train mode)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
               for m in model.modules())


@torch.no_grad()
def _outputs(model, stack, x):
    """Logits of the stacked models, leaving their running statistics as they are.

    A teacher's outputs are one more forward pass of a model whose own gradient
    step updates its statistics: in train mode BatchNorm would move them a
    second time per step (on copies here, which are dropped).
    """
    buffers = set(buffer_names(model))
    return client_forward(model, {n: t.clone() if n in buffers else t for n, t in stack.items()},
                          x)


# --- adaptation on the clients' own training sets -------------------------------------------

def full_batch_steps(model, stack, data, steps, lr, weight_decay=0.0, *, chunk=16):
    """``steps`` full-batch gradient steps of every client's model on its own training set.

    Deterministic (no sampling): client i's loss is the mean cross-entropy over
    its ``n_train[i]`` real samples (the padding is masked out). The model runs
    in its current mode; in train mode its BatchNorm layers (if any) normalize
    with the statistics of each client's real samples (one client per call then,
    so that no padding enters them) and update the stack's running statistics.

    Parameters
    ----------
    model : nn.Module
    stack : dict
        One model per client of ``data`` (K, ...).
    data : FederatedDataset or ClientSubset
        The clients, row i of ``stack`` being the i-th.
    steps : int
    lr, weight_decay : float
    chunk : int
        Clients per vectorized call (bounds the memory).

    Returns
    -------
    dict
        The updated stack (a new one; ``stack`` is not modified).

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.learning.torch import FederatedDataset, LogisticModel
    >>> from ebfl.learning.torch.functional import fresh_params, replicate
    >>> x = [np.eye(4, dtype=np.float32)] * 2
    >>> y = [np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0])]
    >>> data = FederatedDataset.from_clients(x, y, x, y)
    >>> model = LogisticModel(4, 2)
    >>> out = full_batch_steps(model, replicate(fresh_params(model, 0), 2), data, 3, 0.5)
    >>> tuple(out["net.1.weight"].shape)
    (2, 2, 4)
    """
    data = _clients_iv(data)
    steps, lr, weight_decay = _steps_iv(steps, lr, weight_decay)
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    _stack_iv(stack, data)
    return _full_batch(model, stack, data, steps, lr, weight_decay, chunk)


def minibatch_steps(model, stack, data, steps, lr, weight_decay=0.0, *, batch_size, seed=0):
    """``steps`` minibatch SGD steps of every client's model on its own training set.

    ``batch_size`` samples per client and step, drawn with replacement. Client
    c (its id: the row of a :class:`~.data.FederatedDataset`, ``data.clients``
    of a :class:`~.data.ClientSubset`) draws from its own stream,
    ``stream_seed(seed, 0, c, "evaluate")`` (:mod:`ebfl.federated.streams`), so
    it gets the same batches whether it is adapted alone or with others, and
    the draws are independent of the training run's. Much cheaper than
    :func:`full_batch_steps` on large clients. The model runs in its current
    mode (in train mode, BatchNorm running statistics in the stack are updated).

    Parameters
    ----------
    model : nn.Module
    stack : dict
        One model per client of ``data`` (K, ...).
    data : FederatedDataset or ClientSubset
    steps : int
    lr, weight_decay : float
    batch_size : int
    seed : int
        In [0, 2^64 - 1], e.g. the run's seed.

    Returns
    -------
    dict
        The updated stack (a new one; ``stack`` is not modified).

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.learning.torch import FederatedDataset, LogisticModel
    >>> from ebfl.learning.torch.functional import fresh_params, replicate
    >>> x = [np.eye(4, dtype=np.float32)] * 2
    >>> y = [np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0])]
    >>> data = FederatedDataset.from_clients(x, y, x, y)
    >>> model = LogisticModel(4, 2)
    >>> stack = replicate(fresh_params(model, 0), 2)
    >>> both = minibatch_steps(model, stack, data, 3, 0.5, batch_size=2, seed=7)
    >>> alone = minibatch_steps(model, {n: p[1:] for n, p in stack.items()}, data.subset([1]),
    ...                         3, 0.5, batch_size=2, seed=7)
    >>> bool(torch.equal(both["net.1.weight"][1], alone["net.1.weight"][0]))
    True
    """
    data = _clients_iv(data)
    steps, lr, weight_decay = _steps_iv(steps, lr, weight_decay)
    batch_size = check_int_scalar(batch_size, "batch_size", minimum=1)
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=MAX_SEED)
    _stack_iv(stack, data)
    rng = client_generators(_adaptation_seeds(seed, data.clients))
    return _minibatch(model, stack, data, steps, lr, weight_decay, batch_size, rng)


def _clients_iv(data):
    """A FederatedDataset or ClientSubset, as a ClientSubset (client ids known)."""
    if isinstance(data, FederatedDataset):
        return data.subset(np.arange(data.n_clients))
    if isinstance(data, ClientSubset):
        return data
    raise TypeError(f"data must be a FederatedDataset or a ClientSubset, got "
                    f"{type(data).__name__}")


def _steps_iv(steps, lr, weight_decay):
    return (check_int_scalar(steps, "steps", minimum=0), check_positive_scalar(lr, "lr"),
            check_nonnegative_scalar(weight_decay, "weight_decay"))


def _stack_iv(stack, data):
    if not isinstance(stack, dict) or not stack:
        raise TypeError("stack must be a non-empty dict name -> Tensor (one row per client)")
    for name, p in stack.items():
        if not isinstance(p, torch.Tensor) or p.dim() == 0 or p.shape[0] != data.n_clients:
            raise ValueError(f"stack[{name!r}] must be a Tensor with one row per client of data "
                             f"({data.n_clients}), got "
                             f"{tuple(p.shape) if isinstance(p, torch.Tensor) else type(p)}")


def _adaptation_seeds(seed, clients):
    """Client c's stream for evaluation-time adaptation: (seed, round 0, c, "evaluate")."""
    return [stream_seed(seed, 0, int(c), "evaluate") for c in clients]


def _full_batch(model, stack, data, steps, lr, weight_decay, chunk=16):
    dtype = _dtype(stack)
    out = clone_params(stack)
    if _uses_batch_statistics(model):
        chunk = 1  # the padding rows would enter BatchNorm's batch statistics: each client alone
    for lo in range(0, data.n_clients, chunk):
        rows = np.arange(lo, min(lo + chunk, data.n_clients))
        part = data.subset(rows)
        rows_used = int(part.n_train.max())  # beyond the chunk's largest client: all padding
        x, y = part.x_train[:, :rows_used].to(dtype), part.y_train[:, :rows_used]
        rows_of = torch.arange(rows_used, device=x.device)
        mask = (rows_of[None, :] < part.n_train[:, None]).to(dtype)
        idx = torch.from_numpy(rows)
        params = {n: p[idx] for n, p in out.items()}
        for _ in range(steps):
            g = client_grad(model, _masked_ce_loss, params, x, y, mask)
            params = sgd_step(params, g, lr, weight_decay)
        for n, p in params.items():
            out[n][idx] = p
    return out


def _minibatch(model, stack, data, steps, lr, weight_decay, batch_size, rng):
    """Minibatch SGD, client j's batches drawn from its own generator ``rng[j]``."""
    dtype = _dtype(stack)
    out = clone_params(stack)
    for _ in range(steps):
        x, y = data.sample_batch(rng, batch_size)
        g = client_grad(model, _ce_loss, out, x.to(dtype), y)
        out = sgd_step(out, g, lr, weight_decay)
    return out


# The adaptation stream of each client is persistent client state: an int64 tensor holds the
# unsigned 64-bit seed in two's complement (tensors have no uint64 arithmetic we can rely on).
def _seed_state(run, clients, device):
    seeds = _adaptation_seeds(run.seed, clients)
    return torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds], dtype=torch.int64,
                        device=device)


def _seed_generators(state):
    return client_generators([int(s) % 2**64 for s in state.tolist()])


class _AdaptedGlobal:
    """Personal models adapted from the global one on the client's data at evaluation time.

    With ``batch`` None: full-batch steps (deterministic, nothing drawn). Otherwise
    minibatches drawn from each client's stream ``stream_seed(run seed, 0,
    client, "evaluate")``: a client keeps that seed in its state from the start of
    the run (``adapt_seed``), so it needs nothing from the server or the other
    clients, and the same batches serve every evaluation.
    """

    def _adaptation_state(self, run, clients, batch):
        if batch is None:
            return {}
        return {"adapt_seed": _seed_state(run, clients, self.device)}

    def _adapt(self, message, client, data, steps, lr, weight_decay, batch):
        stack = replicate(message["global"], data.n_clients)
        # adaptation is training: train mode (BatchNorm statistics of the client's data, updated
        # in the adapted models), also when called from an evaluation, which runs in eval mode
        with self.training():
            if batch is None:
                return _full_batch(self.model, stack, data, steps, lr, weight_decay)
            return _minibatch(self.model, stack, data, steps, lr, weight_decay, batch,
                              _seed_generators(client["adapt_seed"]))


class _OneGlobalModel:
    """Table 1's columns and the global model of a strategy whose server holds one model.

    ``models_per_client``: full models each client trains (Ditto: its personal
    model and its copy of the global one).
    """

    models_per_client = 1

    def global_state(self, server):
        """The global model (parameters and float buffers) of a server state.

        Parameters
        ----------
        server : dict
            A server state of this strategy (e.g. ``TrainResult.server``).

        Returns
        -------
        dict name -> Tensor
            ``server["global"]`` (not a copy): what Table 2 of PerAda evaluates.

        Examples
        --------
        >>> from ebfl.federated import RunConfig
        >>> from ebfl.learning.torch import LogisticModel
        >>> from ebfl.learning.torch.baselines import Ditto
        >>> alg = Ditto(LogisticModel(4, 3))
        >>> sorted(alg.global_state(alg.init_server(RunConfig(n_clients=2, rounds=1))))
        ['net.1.bias', 'net.1.weight']
        """
        return server["global"]

    def trained_parameters(self):
        """Parameters each client trains (``models_per_client`` full models; buffers not
        counted): Table 1's "# Trained Params".

        Examples
        --------
        >>> from ebfl.learning.torch import LogisticModel
        >>> from ebfl.learning.torch.baselines import Ditto
        >>> Ditto(LogisticModel(4, 3)).trained_parameters()  # 2 x (4 x 3 + 3)
        30
        """
        return self.models_per_client * _n_parameters(self.model)

    def communicated_parameters(self):
        """Parameters a sampled client receives, and sends back, per round (one full model;
        buffers not counted): Table 1's "# Comm. Params".

        Examples
        --------
        >>> from ebfl.learning.torch import LogisticModel
        >>> from ebfl.learning.torch.baselines import Ditto
        >>> Ditto(LogisticModel(4, 3)).communicated_parameters()
        15
        """
        return _n_parameters(self.model)


# --- FedAvg + fine-tuning -------------------------------------------------------------------

class FedAvgFT(_OneGlobalModel, _AdaptedGlobal, FedAvg):
    """FedAvg + local fine-tuning ("FedAvg+" of Table 1; Jiang et al. 2019, arXiv:1909.12488).

    Training is exactly :class:`~.strategies.FedAvg` (message: the global
    model; reply: each sampled client's model after the round). Each client's
    personal model is the current global model after ``finetune_steps``
    gradient steps (rate ``finetune_lr``, same weight decay) on the client's own
    training set, computed at evaluation time in :meth:`personal`. Ozkara et
    al. give no fine-tuning details (Section 4.1): full-batch steps make the
    personal models deterministic; with ``finetune_batch`` the minibatches
    come from each client's own stream (see :func:`minibatch_steps`; the
    client keeps its stream's seed, derived from the run's seed and its id,
    in its state ``adapt_seed``). The learning-rate decay is not applied to
    the fine-tuning. Fine-tuning runs in train mode: BatchNorm layers normalize
    with the client's batch statistics and their running statistics, which the
    personal model is evaluated with, are updated on the client's data.

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
        Fine-tune with minibatches of this size instead of full batches: far
        cheaper on large clients.

    Notes
    -----
    Cost: every evaluation runs ``finetune_steps`` steps of all m clients.

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> FedAvgFT(LogisticModel(4, 3), 0.1, finetune_steps=5).config()["finetune_steps"]
    5
    """

    name = "FedAvg-FT"

    def __init__(self, model, lr=0.1, *, weight_decay=1e-4, finetune_steps=10, finetune_lr=None,
                 finetune_batch=None):
        super().__init__(model, lr, weight_decay=weight_decay)
        self.finetune_steps = check_int_scalar(finetune_steps, "finetune_steps", minimum=1)
        self.finetune_batch = (None if finetune_batch is None else
                               check_int_scalar(finetune_batch, "finetune_batch", minimum=1))
        self.finetune_lr = (self.lr if finetune_lr is None
                            else check_positive_scalar(finetune_lr, "finetune_lr"))

    def config(self):
        return {**super().config(), "finetune_steps": self.finetune_steps,
                "finetune_lr": self.finetune_lr, "finetune_batch": self.finetune_batch}

    def init_clients(self, run, data, clients):
        return self._adaptation_state(run, clients, self.finetune_batch)

    def personal(self, message, client, data):
        return self._adapt(message, client, data, self.finetune_steps, self.finetune_lr,
                           self.weight_decay, self.finetune_batch)


# --- FedAvg + server ensemble distillation ---------------------------------------------------

class FedDF(ServerDistillation, _OneGlobalModel, FedAvg):
    """FedDF (Lin, Kong, Stich & Jaggi, NeurIPS 2020): FedAvg refined by ensemble distillation.

    Clients train exactly as in :class:`~.strategies.FedAvg` (message: the
    global model; reply: each sampled client's model after the round). The
    server averages the replies weighted by training-set size, then takes
    ``kd_steps`` distillation steps of that average (the student) toward the
    mean of the received models' logits (the teacher ensemble) on the
    unlabeled inputs ``aux``: :func:`~ebfl.learning.torch.perada.distill` and
    :func:`~ebfl.learning.torch.perada.ensemble_logits`, the server step of
    PerAda applied to the full model. With ``kd_steps = 0`` it is FedAvg.

    The distilled global model is every client's predictor and the one that
    Table 2 of PerAda (Xie et al., CVPR 2024) evaluates (:meth:`global_state`).
    Distillation draws its batches from the server's stream of the round
    (``stream_seed(seed, round, SERVER, "aggregate")``), so both runtimes agree:
    with SGD to float32 rounding (about 1e-7 on a small ResNet after two rounds
    of three distillation steps); Adam, which divides each step by the root of
    its second moment, amplifies the replies' last-bit differences (about 1e-5
    there).

    Parameters
    ----------
    model : nn.Module
    lr : float
        The clients' rate.
    aux : Tensor (n_aux, ...)
        Unlabeled server inputs (shaped as one client's inputs).
    kd_steps : int
        Distillation steps per round (>= 0).
    kd_lr : float
    kd_batch_size : int
        Capped at ``len(aux)``.
    kd_optimizer : {"adam", "sgd"}
        Default Adam, cosine-annealed over the round's steps, with ``kd_lr``
        1e-3: the server optimizer of PerAda's official code on CIFAR-10.
    temperature : float
    kd_rounds : int, optional
        Distill only in rounds < ``kd_rounds`` (default: every round).
    kd_validation : (Tensor, Tensor), optional
        Labelled server data: keep the best student on it (see
        :func:`~ebfl.learning.torch.perada.distill`).
    kd_patience, kd_eval_every : int, optional
        Early stopping on ``kd_validation``.
    weight_decay : float
        On the clients' steps.

    Examples
    --------
    >>> import torch
    >>> from ebfl.learning.torch import LogisticModel
    >>> alg = FedDF(LogisticModel(4, 3), 0.1, aux=torch.zeros(8, 4), kd_steps=5)
    >>> alg.config()["n_aux"], alg.communicated_parameters()
    (8, 15)
    """

    name = "FedDF"

    def __init__(self, model, lr=0.1, *, aux, kd_steps=50, kd_lr=1e-3, kd_batch_size=128,
                 kd_optimizer="adam", temperature=1.0, kd_rounds=None, kd_validation=None,
                 kd_patience=None, kd_eval_every=1, weight_decay=1e-4):
        super().__init__(model, lr, weight_decay=weight_decay)
        if aux is None:
            raise TypeError("aux must be a floating-point Tensor of unlabeled inputs "
                            "(n_aux, ...): FedDF distills on it (without it, use FedAvg)")
        self._distillation_setup(aux, kd_steps=kd_steps, kd_lr=kd_lr,
                                 kd_batch_size=kd_batch_size, kd_optimizer=kd_optimizer,
                                 temperature=temperature, kd_rounds=kd_rounds,
                                 kd_validation=kd_validation, kd_patience=kd_patience,
                                 kd_eval_every=kd_eval_every)

    def config(self):
        return {**super().config(), **self._distillation_config()}

    def aggregate(self, server, replies, weights, rc):
        models = replies["model"]
        average = weighted_mean(models, _weights(weights))
        if not self.distills(rc.round):
            return {"global": average}
        student, stats = self._distilled(average, models, rc)
        return {"global": student, "kd": stats}


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
        self.model = _model_iv(model)
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
        g = client_grad(self.model, _ce_loss, work["model"], x, y)
        work["model"] = sgd_step(work["model"], g, self.lr * scale, self.weight_decay)
        v, w = client["personal"], work["anchor"]
        h = client_grad(self.model, _ce_loss, v, x, y)
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
        self.model = _model_iv(model)
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
            g = client_grad(self.model, _ce_loss, theta, x, y)
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
    :class:`FedAvgFT`'s ``finetune_batch``); computed in :meth:`personal`, like
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
        self.model = _model_iv(model)
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
        g = client_grad(self.model, _ce_loss, w, x[:, :h], y[:, :h])
        tmp = sgd_step(w, g, self.alpha)
        g = client_grad(self.model, _ce_loss, tmp, x[:, h:], y[:, h:])
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
        self.model = _model_iv(model)
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
        h = client_grad(self.model, _ce_loss, w, x, y)
        work["model"] = sgd_step(w, h, self.lr * scale, self.weight_decay)
        client["personal"] = sgd_step(v, g, self.lr_personal * scale, self.weight_decay)
        if self.learn_alpha:
            client["alpha"] = torch.clamp(alpha - self.lr_alpha * scale * g_alpha, 0.0, 1.0)

    def personal(self, message, client, data):
        alpha, w = client["alpha"], message["global"]
        buffers = set(buffer_names(self.model))
        return {n: v if n in buffers else _mix(alpha, v, w[n])
                for n, v in client["personal"].items()}


# --- knowledge-distillation baselines --------------------------------------------------------

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

    Message: the global model. Reply: the client's copy w after the round.
    theta (client state) stays on the client.

    Parameters
    ----------
    model : nn.Module
    lr_theta, lr_global : float
        eta1 and eta3 (Section 4.1 of Ozkara et al.: 0.1, 0.1).
    lam_p : float
        lambda_p (Section 4.1: 0.25).
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> QuPeDFP(LogisticModel(4, 3)).config()["lam_p"]
    0.25
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

    def local_step(self, work, client, x, y, scale, rng):
        w, theta = work["model"], client["theta"]
        teacher = _outputs(self.model, w, x)
        g = client_grad(self.model, _ce_kd(1.0, self.lam_p), theta, x, y, teacher)
        theta = sgd_step(theta, g, self.lr_theta * scale, self.weight_decay)
        teacher = _outputs(self.model, theta, x)
        h = client_grad(self.model, _ce_kd(1.0, self.lam_p), w, x, y, teacher)
        work["model"] = sgd_step(w, h, self.lr_global * scale, self.weight_decay)
        client["theta"] = theta


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

    Message: the global meme. Reply: the client's meme after the round. The
    private model (client state ``theta``) stays on the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of both models (the same schedule, Section 4.1 of Ozkara et al.).
    lr_meme : float, optional
        Default: ``lr``.
    alpha, beta : float in [0, 1]
        Section 4.1: 0.25, 0.25.
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> FML(LogisticModel(4, 3), 0.1, alpha=0.5).config()["lr_meme"]
    0.1
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

    def local_step(self, work, client, x, y, scale, rng):
        meme, theta = work["model"], client["theta"]
        z_meme = _outputs(self.model, meme, x)
        z_personal = _outputs(self.model, theta, x)
        g = client_grad(self.model, _ce_kd(self.alpha, 1 - self.alpha), theta, x, y, z_meme)
        h = client_grad(self.model, _ce_kd(self.beta, 1 - self.beta), meme, x, y, z_personal)
        client["theta"] = sgd_step(theta, g, self.lr * scale, self.weight_decay)
        work["model"] = sgd_step(meme, h, self.lr_meme * scale, self.weight_decay)


# --- FedEM and DP-FedEM ----------------------------------------------------------------------

def _per_sample_ce(logits, y):
    """Per-sample cross-entropy: logits (..., B, C), y (..., B) -> (..., B)."""
    return -torch.gather(F.log_softmax(logits, -1), -1, y.unsqueeze(-1)).squeeze(-1)


def _weighted_ce_loss(forward, params, x, y, q):
    return (q * _per_sample_ce(forward(params, x), y)).mean()


def _component_seed(base, c):
    """Seed of component c >= 1's initialization: the server's "init" stream, the component
    in the round's place, so it never equals the run seed that draws component 0."""
    return stream_seed(base, c, SERVER, "init")


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
    dataset once per round; here the E-step is per minibatch and pi_i stays
    fixed within a round). The server averages each component over the
    sampled clients.

    Message: the M components. Reply: the client's M local copies after the
    round. pi_i (client state ``pi``) stays on the client.

    Component 0 starts from the run's initial parameters, component c >= 1
    from a fresh initialization of the model drawn from a stream keyed by
    ``init_seed`` (default: the run's seed) and c, never the one of component
    0 (identical components would stay identical); pi starts uniform.

    Evaluation: :meth:`personal_logits` gives the mixture's log-probabilities;
    :meth:`personal` returns each client's highest-weight component, for
    callers that need one model per client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Section 4.1 of Ozkara et al.: 0.2.
    n_components : int
        M (Section 4.1: 2).
    weight_decay : float
    init_seed : int, optional
        Keys the initialization of components 1..M-1 (default: the run's seed).

    Examples
    --------
    >>> from ebfl.federated import RunConfig
    >>> from ebfl.learning.torch import LogisticModel
    >>> strat = FedEM(LogisticModel(4, 3), n_components=3)
    >>> tuple(strat.init_server(RunConfig(n_clients=2, rounds=1))["components"]
    ...       ["net.1.weight"].shape)
    (3, 3, 4)
    """

    name = "FedEM"

    def __init__(self, model, lr=0.2, *, n_components=2, weight_decay=1e-4, init_seed=None):
        self.model = _model_iv(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.n_components = check_int_scalar(n_components, "n_components", minimum=1)
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.init_seed = (None if init_seed is None else
                          check_int_scalar(init_seed, "init_seed", minimum=0, maximum=MAX_SEED))

    def config(self):
        return {"name": self.name, "lr": self.lr, "n_components": self.n_components,
                "weight_decay": self.weight_decay, "init_seed": self.init_seed}

    # ---- server half
    def init_server(self, run):
        first = self.initial_params(run)
        base = run.seed if self.init_seed is None else self.init_seed
        comps = [first] + [{n: p.to(first[n].dtype) for n, p in
                            fresh_params(self.model, _component_seed(base, c)).items()}
                           for c in range(1, self.n_components)]
        return {"components": {n: torch.stack([c[n] for c in comps]) for n in first}}

    def broadcast(self, server, rc):
        return {"components": server["components"]}

    def evaluation_message(self, server):
        return {"components": server["components"]}

    def aggregate(self, server, replies, weights, rc):
        return {"components": weighted_mean(replies["components"], _weights(weights))}

    # ---- client half
    def init_clients(self, run, data, clients):
        dtype = _dtype(self.initial_params(run))
        return {"pi": torch.full((len(clients), self.n_components), 1 / self.n_components,
                                 dtype=dtype, device=self.device)}

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        comps = {n: p.unsqueeze(0).expand(k, *p.shape).clone()
                 for n, p in message["components"].items()}
        return {"components": comps, "q": torch.zeros_like(client["pi"]), "steps": 0}

    def local_step(self, work, client, x, y, scale, rng):
        k, mc = x.shape[0], self.n_components
        # client j's M components are rows j*M .. (j+1)*M - 1 of one flat stack
        flat = {n: p.reshape(k * mc, *p.shape[2:]) for n, p in work["components"].items()}
        xs = x.repeat_interleave(mc, dim=0)
        ys = y.repeat_interleave(mc, dim=0)
        with torch.no_grad():  # E-step: responsibilities (K, M, B)
            losses = _per_sample_ce(_outputs(self.model, flat, xs), ys).reshape(k, mc, -1)
            q = torch.softmax(torch.log(client["pi"])[:, :, None] - losses, dim=1)
        g = client_grad(self.model, _weighted_ce_loss, flat, xs, ys, q.reshape(k * mc, -1))
        flat = sgd_step(flat, self.release(g, rng), self.lr * scale, self.weight_decay)
        work["components"] = {n: p.reshape(k, mc, *p.shape[1:]) for n, p in flat.items()}
        work["q"] = work["q"] + q.mean(-1)
        work["steps"] += 1

    def release(self, g, rng):
        """The components' gradients as they leave the client (DP-FedEM privatizes them)."""
        return g

    def client_reply(self, work, client):
        client["pi"] = work["q"] / work["steps"]  # the M-step closes the client's round
        return {"components": work["components"]}

    def personal(self, message, client, data):
        best = client["pi"].argmax(1)
        return {n: p[best] for n, p in message["components"].items()}

    def global_state(self, server):
        """None: FedEM has no single global model (each client predicts with its own mixture
        of the server's M components)."""
        return None

    def trained_parameters(self):
        """Parameters each client trains: its copies of the M components (buffers and the M
        mixture weights not counted)."""
        return self.n_components * _n_parameters(self.model)

    def communicated_parameters(self):
        """Parameters sent each way per sampled client and round: the M components."""
        return self.n_components * _n_parameters(self.model)

    @torch.no_grad()
    def personal_logits(self, message, client, data, x, *, chunk=16):
        """Log-probabilities of every client's mixture on its own inputs.

        Parameters
        ----------
        message : dict
            ``{"components": ...}`` (:meth:`evaluation_message`).
        client : dict
            The clients' states (``pi``: (K, M)).
        data : ClientSubset
            Unused: the mixture needs no data beyond ``x``.
        x : Tensor (K, n, ...)
            Client j's inputs in row j (e.g. ``data.x_test``).
        chunk : int
            Clients per forward pass.

        Returns
        -------
        Tensor (K, n, classes)
            ``log sum_c pi_jc softmax(h_c(x_ji))``.
        """
        chunk = check_int_scalar(chunk, "chunk", minimum=1)
        comps, pi = message["components"], client["pi"]
        dtype = _dtype(comps)
        k_all, n = x.shape[:2]
        out = []
        for lo in range(0, k_all, chunk):
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
    """DP-FedEM as in Figure 3 of Ozkara et al. (Section 4): FedEM with the M components'
    gradients concatenated, clipped and Gaussian-noised at every local step.

    Each sampled client's M component gradients, as one vector, are scaled to
    L2 norm at most ``clip`` and N(0, ``noise``^2) is added to every coordinate
    (:func:`~ebfl.learning.torch.functional.clip_and_noise`, client j's noise
    from its own stream of the round), exactly the mechanism of
    :class:`~ebfl.learning.torch.DPAdaPeD` with ``concatenate=True``; the
    mixture weights pi never leave the client. The server averages the
    components *unweighted* (every client's weight is 1): weights by
    training-set size would let a large client's update exceed the 1/K share
    the accountant assumes. Models with BatchNorm running statistics are
    refused: the reply would carry them, computed from the client's data and
    not noised.

    Parameters
    ----------
    model : nn.Module
    lr : float
    clip, noise : float
        C > 0 and sigma >= 0.
    **kwargs
        As :class:`FedEM`.

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> strat = DPFedEM(LogisticModel(4, 3), clip=1.0, noise=0.0)
    >>> strat.privacy(1e-5, n_clients=50, n_sampled=5, n_iterations=100, sync_gap=10)
    inf
    """

    name = "DP-FedEM"

    def __init__(self, model, lr=0.2, *, clip, noise, **kwargs):
        super().__init__(model, lr, **kwargs)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
               for m in model.modules()):
            raise ValueError("model must not have BatchNorm running statistics: DP-FedEM's "
                             "reply carries each component's buffers, computed from the "
                             "client's data and not noised (use a model without BatchNorm, "
                             "e.g. with GroupNorm)")
        self.clip = check_positive_scalar(clip, "clip")
        self.noise = check_nonnegative_scalar(noise, "noise")

    def config(self):
        return {**super().config(), "clip": self.clip, "noise": self.noise}

    def release(self, g, rng):
        return self.privatize(g, self.clip, self.noise, rng, rows_per_client=self.n_components)

    def client_weights(self, data):
        return np.ones(data.n_clients)

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
