"""Adapting a global model on each client's own training set, and the baselines' shared parts.

:func:`~ebfl.learning.torch.baselines.full_batch_steps` and
:func:`~ebfl.learning.torch.baselines.minibatch_steps` are the local fine-tuning of
:class:`~ebfl.learning.torch.baselines.FedAvgFT` and
:class:`~ebfl.learning.torch.baselines.PerFedAvg` at evaluation time; the mixins
below hold what every baseline with one global model shares.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ebfl._validation import (
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.federated.protocol import MAX_SEED
from ebfl.federated.streams import stream_seed
from ebfl.learning.torch.data import ClientSubset, FederatedDataset
from ebfl.learning.torch.functional import (
    buffer_names,
    ce_loss,
    client_forward,
    client_generators,
    client_grad,
    clone_params,
    replicate,
    sgd_step,
)

__all__ = ["full_batch_steps", "minibatch_steps"]


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
    :func:`~ebfl.learning.torch.baselines.full_batch_steps` on large clients. The model
    runs in its current mode (in train mode, BatchNorm running statistics in the stack are updated).

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
        g = client_grad(model, ce_loss, out, x.to(dtype), y)
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
        >>> sorted(alg.global_state(alg.init_server(RunConfig(n_clients=2, n_rounds=1))))
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
