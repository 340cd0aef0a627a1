"""The in-process engine of the torch strategies: :func:`train`.

Per round: the server samples clients (a fixed number K without replacement,
or everyone), broadcasts, the sampled clients take ``local_steps`` (tau)
vectorized local iterations on fresh minibatches (unsampled clients take the
strategy's idle steps, if any), and the server aggregates. Learning rates decay
by ``lr_decay`` per epoch of ``iters_per_epoch`` iterations. Per-client test
accuracy is recorded every ``eval_every`` rounds.

:func:`train` is the in-process runtime of :mod:`ebfl.federated` with the
engine's defaults: every random number (client sampling, each client's
minibatches and noise) comes from a stream keyed by (seed, round, client), so a
run gives the same result on Flower (:mod:`ebfl.flower.runtime`), and a run
resumed from a checkpoint continues exactly as the uninterrupted run.

A run computes on the CPU or on a CUDA GPU (``train(..., device=)``); every
random number is drawn on the CPU either way, so the two differ only by
floating-point arithmetic.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ebfl._validation import (
    check_bool,
    check_int_scalar,
    check_probability,
    check_real_scalar,
)
from ebfl.federated.protocol import MAX_SEED, RunConfig
from ebfl.federated.runtime import run
from ebfl.learning.torch.data import FederatedDataset
from ebfl.learning.torch.functional import (
    check_device,
    client_forward,
    clone_params,
    eval_mode,
    model_device,
    model_state,
    to_device,
)
from ebfl.learning.torch.strategies import client_test_accuracy

__all__ = ["TrainResult", "evaluate", "evaluate_strategy", "flush_denormals", "train"]

@contextlib.contextmanager
def flush_denormals():
    """Flush denormal floats to zero on the CPU while inside (restored to the default after).

    A context manager, and a decorator (``train`` runs under it).

    Small conv nets produce denormals in their gradients; on x86 CPUs each
    denormal operation is slow, and here one CNN5 step ran 40x slower with them
    (382 ms against 10 ms for 5 clients x 19 images). Values below 1.2e-38 are
    numerically irrelevant to training. torch has no getter for the flag, so it
    is reset to torch's default (off) on exit. The flag is a CPU setting: it
    changes nothing in a run on a GPU.
    """
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@dataclass
class TrainResult:
    """Final states, per-client test accuracy and the per-round history of a run.

    Every tensor lies on the CPU, whatever device the run computed on, so results
    of runs on different devices compare directly and pickle anywhere.

    Attributes
    ----------
    server : dict
        The server's state (e.g. FedAvg's ``global`` model, AdaPeD's ``mu`` and ``psi``).
    clients : dict
        Every client's persistent state, stacks of m rows (e.g. AdaPeD's ``theta``).
    accuracy : Tensor (m,)
        Per-client test accuracy at the end.
    history : list of dict
        Per evaluated round (see :class:`ebfl.federated.RunResult`).
    seconds : float
    """

    server: dict
    clients: dict
    accuracy: torch.Tensor
    history: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def state(self):
        """Server and client states in one dict (their keys never clash)."""
        return {**self.server, **self.clients}

    def history_frame(self):
        """The history as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def plot(self, metric=None, path=None):
        """Each metric of the history against the round.

        Parameters
        ----------
        metric : str or list of str, optional
            History entries to draw, one panel each. Default: the metrics evaluated
            on the clients (``accuracy``, with a band of +- one sd over clients).
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            One axes per metric, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> import numpy as np
        >>> from ebfl.learning.torch import FederatedDataset, FedAvg, LogisticModel
        >>> rng = np.random.default_rng(0)
        >>> xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(3)]
        >>> ys = [(x[:, 0] > 0).astype(np.int64) for x in xs]
        >>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
        >>> res = train(FedAvg(LogisticModel(4, 2), 0.5), data, n_rounds=3, local_steps=2,
        ...             batch_size=5)
        >>> fig = res.plot()
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['accuracy']
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl._plotting import plot_history

        return plot_history(self.history, metric, path)


@torch.no_grad()
def evaluate(model, stack, data, *, chunk=16, frozen=None):
    """Per-client test accuracy of the stacked models ``stack`` (m clients).

    ``frozen``: parameters shared by all clients and absent from ``stack``
    (see :func:`~ebfl.learning.torch.functional.client_forward`). ``model``,
    ``stack`` and ``data`` must be on one device.
    """
    if not isinstance(data, FederatedDataset):
        raise TypeError(f"data must be a FederatedDataset, got {type(data).__name__}")
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    m = data.n_clients
    with eval_mode(model):
        logits = torch.cat([client_forward(model, {k: v[lo:lo + chunk] for k, v in stack.items()},
                                           data.x_test[lo:lo + chunk], frozen=frozen)
                            for lo in range(0, m, chunk)])
    return client_test_accuracy(logits, data)


@torch.no_grad()
def evaluate_strategy(strategy, result, data):
    """Per-client test accuracy of a strategy's personal predictors after a run.

    ``result`` is a :class:`TrainResult` (or anything with ``server`` and
    ``clients``) of ``strategy`` on ``data``. The evaluation runs on
    ``strategy``'s device (see :meth:`~.strategies.Strategy.to`), the result's
    states and ``data`` copied there; the accuracies are returned on that device.
    """
    if not isinstance(data, FederatedDataset):
        raise TypeError(f"data must be a FederatedDataset, got {type(data).__name__}")
    data = data.to(strategy.device)
    server, clients = strategy.restore_state(result.server), strategy.restore_state(result.clients)
    message = strategy.evaluation_message(server)
    everyone = data.subset(range(data.n_clients))
    return strategy.client_evaluate(message, clients, everyone)["accuracy"]


@flush_denormals()
def train(strategy, data, *, n_rounds, local_steps=10, clients_per_round=None, sampling_ratio=None,
          batch_size=None, iters_per_epoch=60, lr_decay=0.99, eval_every=1, seed=0, checkpoint=None,
          checkpoint_every=None, init_params=None, failures=None, progress=False,
          sampling="fixed", device=None):
    """Run ``n_rounds`` synchronization rounds of ``strategy`` on ``data``, in this process.

    Parameters
    ----------
    strategy : Strategy
        FedAvg, Local, AdaPeD, ... (:mod:`ebfl.learning.torch.strategies`).
    data : FederatedDataset
    n_rounds : int
    local_steps : int
        tau, local iterations per round (paper: 10).
    clients_per_round : int, optional
        K sampled without replacement each round (default: all m).
    sampling_ratio : float in (0, 1], optional
        Instead of ``clients_per_round``: K = max(1, round(ratio * m)), the
        paper's "sampling ratio" (0.1 on MNIST, 0.33 on FEMNIST).
    batch_size : int, optional
        Per-client minibatch (default: the mean training size / ``iters_per_epoch``,
        so that an epoch is ``iters_per_epoch`` iterations, as in the paper).
    iters_per_epoch : int
    lr_decay : float
        Learning-rate factor per epoch, in (0, 1] (paper: 0.99).
    eval_every : int
        Record test accuracy every this many rounds (and after the last).
    seed : int
        Keys every random stream of the run (in [0, 2^64 - 1]): initialization,
        client sampling, and each client's batches and noise per round.
    checkpoint : path-like, optional
        File to save the run to every ``checkpoint_every`` rounds (and at the
        end); if it exists, the run resumes from it, to the same state and
        history as an uninterrupted run.
    checkpoint_every : int, optional
        Default: ``eval_every``.
    init_params : dict, optional
        Initial parameters of one model, shared by all clients (default: a fresh
        initialization of the strategy's model drawn from ``seed``); names and
        shapes as in ``strategy.model.named_parameters()``, optionally with its
        float buffers (BatchNorm statistics; default: as freshly initialized).
    failures : dict round -> client ids, optional
        Clients that fail in those rounds (0-based): sampled, but they neither
        train nor reply, as a crashed Flower client (see :func:`ebfl.federated.run`).
    progress : bool
        Progress bar with the latest mean accuracy.
    sampling : {"fixed", "poisson"}
        "fixed": K clients per round without replacement; "poisson": each
        client independently with probability K / m (DP-FedAvg's accounting
        assumes it).
    device : None, str or torch.device
        Where the run computes: "cpu" (None, the default), "cuda" or "cuda:N".
        The strategy (its model and the tensors it holds) and ``data`` are
        copied there; the caller's objects are not modified. Every random
        number (initialization, client sampling, minibatch indices, dropout
        keys, privacy noise) is still drawn on the CPU from the streams keyed
        by (seed, round, client) and then moved to the device, so a run on a
        GPU uses exactly the random numbers of the same run on the CPU and
        differs from it only by floating-point arithmetic (summation order,
        fused kernels): accuracies agree closely, not bit for bit. A
        checkpoint holds CPU tensors, and a run resumes on any device.

    Returns
    -------
    TrainResult
        On the CPU (see :class:`TrainResult`).

    Raises
    ------
    ValueError
        Bad arguments, among them an unknown ``device`` or "cuda" where torch
        has no CUDA (the message says which).

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.learning.torch import FederatedDataset, FedAvg, LogisticModel
    >>> rng = np.random.default_rng(0)
    >>> xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(3)]
    >>> ys = [(x[:, 0] > 0).astype(np.int64) for x in xs]
    >>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
    >>> res = train(FedAvg(LogisticModel(4, 2), 0.5), data, n_rounds=2, local_steps=2,
    ...             batch_size=5, device="cpu")
    >>> tuple(res.accuracy.shape), res.accuracy.device
    ((3,), device(type='cpu'))
    """
    if not isinstance(data, FederatedDataset):
        raise TypeError(f"data must be a FederatedDataset, got {type(data).__name__}")
    _strategy_iv(strategy, data)
    config = run_config(data, n_rounds=n_rounds, local_steps=local_steps,
                        clients_per_round=clients_per_round, sampling_ratio=sampling_ratio,
                        batch_size=batch_size, iters_per_epoch=iters_per_epoch,
                        lr_decay=lr_decay, eval_every=eval_every, seed=seed, sampling=sampling)
    if checkpoint is not None and not isinstance(checkpoint, str | os.PathLike):
        raise TypeError(f"checkpoint must be a path, got {type(checkpoint).__name__}")
    progress = check_bool(progress, "progress")
    device = check_device(device)
    if init_params is not None:
        _init_params_iv(init_params, strategy.model)
        strategy = copy.copy(strategy)  # the caller's strategy is not modified
        strategy.init_params = clone_params(init_params)
    strategy, data = strategy.to(device), data.to(device)  # copies: the caller's stay put
    res = run(strategy, data, config, failures=failures, checkpoint=checkpoint,
              checkpoint_every=checkpoint_every, progress=progress)
    return TrainResult(to_device(res.server, "cpu"), to_device(res.clients, "cpu"),
                       torch.as_tensor(res.metrics["accuracy"], dtype=torch.float32),
                       res.history, res.seconds)


def run_config(data, *, n_rounds, local_steps=10, clients_per_round=None, sampling_ratio=None,
               batch_size=None, iters_per_epoch=60, lr_decay=0.99, eval_every=1, seed=0,
               sampling="fixed"):
    """The :class:`~ebfl.federated.RunConfig` of :func:`train`'s arguments on ``data``."""
    n_rounds = check_int_scalar(n_rounds, "n_rounds", minimum=0)
    local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
    iters_per_epoch = check_int_scalar(iters_per_epoch, "iters_per_epoch", minimum=1)
    eval_every = check_int_scalar(eval_every, "eval_every", minimum=1)
    lr_decay = check_real_scalar(lr_decay, "lr_decay", low=0.0, high=1.0, low_open=True)
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=MAX_SEED)
    m = data.n_clients
    if sampling_ratio is not None:
        if clients_per_round is not None:
            raise ValueError("give clients_per_round or sampling_ratio, not both")
        ratio = check_probability(sampling_ratio, "sampling_ratio")
        if ratio == 0:
            raise ValueError("sampling_ratio must be in (0, 1], got 0")
        clients_per_round = max(1, round(ratio * m))
    k = m if clients_per_round is None else check_int_scalar(clients_per_round,
                                                             "clients_per_round", minimum=1)
    if k > m:
        raise ValueError(f"clients_per_round must be <= the number of clients {m}, got {k}")
    if batch_size is None:
        batch_size = max(1, round(float(data.n_train.float().mean()) / iters_per_epoch))
    batch_size = check_int_scalar(batch_size, "batch_size", minimum=1)
    return RunConfig(n_clients=m, n_rounds=n_rounds, seed=seed, clients_per_round=k,
                     local_steps=local_steps, batch_size=batch_size,
                     iters_per_epoch=iters_per_epoch, lr_decay=lr_decay, eval_every=eval_every,
                     sampling=sampling)


def _strategy_iv(strategy, data):
    """The strategy implements the protocol and its model fits the data's inputs and classes."""
    from ebfl.learning.torch.strategies import Strategy

    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a Strategy of ebfl.learning.torch.strategies, got "
                        f"{type(strategy).__name__}")
    model = getattr(strategy, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"strategy.model must be a torch.nn.Module, got {type(model).__name__}")
    _model_fits(model, data)


@torch.no_grad()
def _model_fits(model, data):
    """One forward pass on one training sample, so that a model built for other inputs or
    another number of classes fails here with its sizes named, not deep inside vmap."""
    features = tuple(data.x_train.shape[2:])
    was_training = model.training
    model.eval()  # no batch-norm statistics are updated by the check
    try:  # on the model's device: the run moves both to the same one later
        out = model(data.x_train[0, :1].to(model_device(model)))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"model does not accept the data's inputs: a batch of B samples of "
                         f"shape {features}, i.e. (B, {', '.join(map(str, features))}) "
                         f"(torch: {exc})") from None
    finally:
        model.train(was_training)
    if tuple(out.shape) != (1, data.n_classes):
        raise ValueError(f"model must return (B, n_classes) = (B, {data.n_classes}) logits for "
                         f"the data's {data.n_classes} classes, got shape {tuple(out.shape)} for "
                         "B = 1")


def _init_params_iv(init_params, model):
    """Initial parameters: a dict of finite tensors named and shaped as the model's."""
    if not isinstance(init_params, Mapping):
        raise TypeError(f"init_params must be a dict name -> Tensor, got "
                        f"{type(init_params).__name__}")
    shapes = {n: tuple(p.shape) for n, p in model_state(model).items()}
    for name, value in init_params.items():
        if name not in shapes:
            raise ValueError(f"init_params has {name!r}, which is not a parameter or float "
                             f"buffer of model (it has {sorted(shapes)})")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"init_params[{name!r}] must be a floating-point Tensor")
        if tuple(value.shape) != shapes[name]:
            raise ValueError(f"init_params[{name!r}] must have shape {shapes[name]}, got "
                             f"{tuple(value.shape)}")
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"init_params[{name!r}] must be finite")
