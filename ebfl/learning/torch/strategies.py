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

from ebfl._validation import check_nonnegative_scalar, check_positive_scalar
from ebfl.federated.protocol import FederatedAlgorithm
from ebfl.federated.tree import tree_take
from ebfl.learning.torch.functional import (
    batch_counters,
    ce_loss,
    check_device,
    client_forward,
    client_generators,
    client_grad,
    clip_and_noise,
    clone_params,
    eval_mode,
    fresh_params,
    model_device,
    replicate,
    sgd_step,
    to_device,
    train_mode,
    weighted_mean,
)
from ebfl.learning.torch.stacked import dense_sgd_step_

__all__ = ["FedAvg", "GaussianRelease", "Local", "Strategy", "check_model",
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
        # work["model"] is this round's copy of the global model: a dense model's step
        # may update it in place (one pass over the stack instead of four)
        if dense_sgd_step_(self.model, ce_loss, work["model"], x, y, lr=self.lr * scale,
                           weight_decay=self.weight_decay):
            return
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


class GaussianRelease:
    """Mixin of the DP strategies: clip-and-noise on the client, before the reply leaves."""

    def privatize(self, tensors, clip, noise_std, rng, *, rows_per_client=1):
        """:func:`~ebfl.learning.torch.functional.clip_and_noise`, client j's noise drawn
        from ``rng[j]``, its stream of the round."""
        return clip_and_noise(tensors, clip, noise_std, rng, rows_per_client=rows_per_client)
