"""Baselines with one global model: FedAvg + fine-tuning and FedAvg + server distillation."""

from __future__ import annotations

from ebfl._validation import (
    check_int_scalar,
    check_positive_scalar,
)
from ebfl.learning.torch.baselines.adaptation import (
    _AdaptedGlobal,
    _OneGlobalModel,
)
from ebfl.learning.torch.distillation import ServerDistillation
from ebfl.learning.torch.functional import (
    weighted_mean,
)
from ebfl.learning.torch.strategies import (
    FedAvg,
    _weights,
)

__all__ = ["FedAvgFT", "FedDF"]


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
    come from each client's own stream (see
    :func:`~ebfl.learning.torch.baselines.minibatch_steps`; the
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
    unlabeled inputs ``aux``: :func:`~ebfl.learning.torch.distillation.distill` and
    :func:`~ebfl.learning.torch.distillation.ensemble_logits`, the server step of
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
        :func:`~ebfl.learning.torch.distillation.distill`).
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
