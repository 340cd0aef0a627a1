"""Sample-level DP-SGD for a stack of clients: per-sample clipping, Gaussian noise, Poisson batches.

DP-SGD (Abadi et al., CCS 2016) protects each *sample* of a client's data: a
step draws a Poisson batch (every sample independently with probability q),
clips each sample's gradient to L2 norm at most C, sums the clipped gradients,
adds N(0, (z C)^2) to every coordinate and divides by the *expected* batch
size q n. Under add-or-remove-one-sample neighbours one step is the
Poisson-subsampled Gaussian mechanism of rate q and noise multiplier z, the
event :func:`ebfl.privacy.accounting.dp_fedavg.dp_fedavg_epsilon` accounts (there with
clients in place of samples).

Everything is vectorized over K stacked clients with ``torch.func``: a
``vmap`` over clients of a ``vmap`` over samples of ``grad``. Client j's
batch indices and noise come from its own generator, so a client gets the same
numbers whether it runs alone (Flower) or stacked with others.

Per-sample gradients exist only when each sample's output depends on that
sample alone: a BatchNorm layer in train mode normalizes with the statistics
of the batch (and records them in its running statistics), so
:func:`per_sample_grads` refuses a model with a BatchNorm layer in train mode.
Run BatchNorm in eval mode (fixed statistics: an affine map per channel).
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

from ebfl._validation import check_nonnegative_scalar, check_positive_scalar
from ebfl.learning.torch.functional import _gaussian, buffer_names, cross_entropy

__all__ = ["dp_sgd_gradient", "gather_batch", "per_sample_grads", "poisson_batch"]


# --------------------------------------------------------------------------- kernels


def _split_stack(model, stack):
    """(parameters, float buffers) of a stack: only the parameters are differentiated."""
    buffers = set(buffer_names(model))
    params = {n: t for n, t in stack.items() if n not in buffers}
    state = {n: t for n, t in stack.items() if n in buffers}
    return params, state


def _per_sample_grads(model, loss_fn, stack, x, y, frozen, sample_state):
    """dict name -> (K, B, *shape): the gradient of each sample's loss, parameters only."""
    shared = {} if frozen is None else frozen
    params, state = _split_stack(model, stack)
    # copies: a train-mode forward may write buffers in place (the adapters' dropout key)
    extra = {} if sample_state is None else {n: t.clone() for n, t in sample_state.items()}
    state = {n: t.clone() for n, t in state.items() if n not in extra}

    def sample_loss(p, b, e, xi, yi):
        # a batch of one: the model sees this sample and nothing else
        logits = functional_call(model, (p, b, e, shared), (xi.unsqueeze(0),))
        return loss_fn(logits, yi.unsqueeze(0))

    over_samples = vmap(grad(sample_loss), in_dims=(None, None, 0, 0, 0))
    return vmap(over_samples)(params, state, extra, x, y)


def _clipped_sum(grads, clip, mask):
    """Sum over present samples of each sample's gradient scaled to L2 norm <= clip.

    The norm is taken over all parameters jointly (one vector per sample).
    Absent samples (``mask`` False) contribute exactly 0 (``where``, not a
    product, so a non-finite padding gradient cannot leak in).
    """
    first = next(iter(grads.values()))
    k, b = first.shape[:2]
    sq = sum(g.reshape(k, b, -1).pow(2).sum(-1) for g in grads.values())
    factor = clip / torch.clamp(torch.sqrt(sq), min=clip)  # min(1, C / |g_i|)
    out = {}
    for name, g in grads.items():
        scaled = g * factor.reshape(k, b, *([1] * (g.dim() - 2))).to(g.dtype)
        keep = mask.reshape(k, b, *([1] * (g.dim() - 2)))
        out[name] = torch.where(keep, scaled, scaled.new_zeros(())).sum(1)
    return out


def _dp_sgd_gradient(model, loss_fn, stack, x, y, mask, clip, noise_multiplier, generators,
                     expected_batch, frozen=None, sample_state=None):
    """The private kernel of :func:`dp_sgd_gradient` (arguments already checked)."""
    grads = _per_sample_grads(model, loss_fn, stack, x, y, frozen, sample_state)
    total = _clipped_sum(grads, clip, mask)
    k = x.shape[0]
    sigma = noise_multiplier * clip
    out = {}
    for name, s in total.items():
        # drawn even at sigma = 0, so a client's stream does not depend on the noise level
        noisy = s + sigma * _gaussian(s, generators, k)
        denominator = expected_batch.to(device=s.device, dtype=s.dtype)
        out[name] = noisy / denominator.reshape(k, *([1] * (s.dim() - 1)))
    return out


def _poisson_batch(n_train, rates, generators):
    """Padded indices (K, B_pad), mask (K, B_pad) and realized sizes (K,) of Poisson batches."""
    chosen = []
    for n, q, g in zip(n_train.tolist(), rates.tolist(), generators, strict=True):
        u = torch.rand(int(n), generator=g, dtype=torch.float64)
        chosen.append(torch.nonzero(u < q).flatten())
    sizes = torch.tensor([c.numel() for c in chosen], dtype=torch.int64)
    width = max(1, int(sizes.max()))  # no cap: the largest realized batch of the stack
    idx = torch.zeros((len(chosen), width), dtype=torch.int64)
    for j, c in enumerate(chosen):
        idx[j, :c.numel()] = c
    mask = torch.arange(width)[None, :] < sizes[:, None]
    return idx, mask, sizes


# --------------------------------------------------------------------------- validation


def _check_stack(stack, name="stack"):
    if not isinstance(stack, dict) or not stack:
        raise TypeError(f"{name} must be a non-empty dict name -> Tensor (one row per client)")
    bad = [n for n, t in stack.items() if not isinstance(t, torch.Tensor)]
    if bad:
        raise TypeError(f"{name} must map names to Tensors; not tensors: {bad[:5]}")
    k = {t.shape[0] if t.dim() else None for t in stack.values()}
    if len(k) != 1 or None in k:
        raise ValueError(f"{name} entries must all have the same leading (client) axis, got "
                         f"sizes {sorted(map(str, k))}")
    return k.pop()


def _check_no_train_batchnorm(model):
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training:
            raise ValueError(
                f"model's BatchNorm layer {prefix!r} is in train mode: it normalizes with "
                "the statistics of the whole batch, so a sample's gradient depends on the "
                "other samples and per-sample clipping bounds nothing; put every BatchNorm "
                "layer in eval mode (fixed statistics)")


def _check_batch(k, x, y, mask):
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError("x and y must be Tensors of shapes (K, B, ...) and (K, B)")
    if x.dim() < 3 or y.dim() != 2 or x.shape[:2] != y.shape or x.shape[0] != k:
        raise ValueError(f"x and y must have shapes (K, B, ...) and (K, B) with K = {k} "
                         f"clients (the stack's rows), got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    if mask is None:
        return torch.ones(y.shape, dtype=torch.bool, device=y.device)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != y.shape:
        raise ValueError(f"mask must be a bool Tensor of shape {tuple(y.shape)} (K, B), got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    return mask.to(y.device)  # poisson_batch draws it on the CPU


def _check_sample_state(model, sample_state, k, b):
    if sample_state is None:
        return None
    if not isinstance(sample_state, dict):
        raise TypeError("sample_state must be a dict buffer name -> Tensor (K, B, ...)")
    buffers = set(buffer_names(model))
    for name, t in sample_state.items():
        if name not in buffers:
            raise ValueError(f"sample_state[{name!r}] is not a float buffer of model")
        if not isinstance(t, torch.Tensor) or tuple(t.shape[:2]) != (k, b):
            raise ValueError(f"sample_state[{name!r}] must be a Tensor with leading shape "
                             f"(K, B) = ({k}, {b})")
    return sample_state


def _check_generators(generators, k):
    if isinstance(generators, torch.Generator) or not hasattr(generators, "__len__"):
        raise TypeError("generators must be a list with one torch.Generator per client")
    if len(generators) != k or not all(isinstance(g, torch.Generator) for g in generators):
        raise ValueError(f"generators must hold one torch.Generator per client ({k}), got "
                         f"{len(generators)} items")
    return list(generators)


def _check_rates(n_train, sampling_rate):
    n = torch.as_tensor(n_train)
    if n.dim() != 1 or n.numel() == 0 or n.is_floating_point() or n.dtype == torch.bool:
        raise TypeError("n_train must be a 1-d integer Tensor or list (samples per client)")
    if bool((n < 1).any()):
        raise ValueError(f"n_train must be >= 1 for every client, got {n.tolist()[:10]}")
    q = torch.as_tensor(sampling_rate, dtype=torch.float64)
    if q.dim() == 0:
        q = q.expand(n.numel())
    if q.shape != n.shape:
        raise ValueError(f"sampling_rate must be a scalar or one rate per client "
                         f"({n.numel()}), got shape {tuple(q.shape)}")
    if not bool(((q > 0) & (q <= 1)).all()):
        raise ValueError(f"sampling_rate must lie in (0, 1], got {q.tolist()[:10]}")
    return n, q


def _check_expected_batch(expected_batch, k):
    e = torch.as_tensor(expected_batch, dtype=torch.float64)
    if e.dim() == 0:
        e = e.expand(k)
    if e.shape != (k,):
        raise ValueError(f"expected_batch must be a scalar or one value per client ({k}), "
                         f"got shape {tuple(e.shape)}")
    if not bool((torch.isfinite(e) & (e > 0)).all()):
        raise ValueError(f"expected_batch must be finite and > 0 (q * n_m), got "
                         f"{e.tolist()[:10]}")
    return e


# --------------------------------------------------------------------------- public API


def per_sample_grads(model, loss_fn, stack, x, y, mask=None, frozen=None, *, sample_state=None):
    """The gradient of every sample's loss, for every client of a stack.

    A ``vmap`` over clients of a ``vmap`` over samples of ``grad``: each sample
    is a batch of one through ``functional_call``.

    Parameters
    ----------
    model : nn.Module
        The architecture. Every BatchNorm layer must be in eval mode (see the
        module docstring): a train-mode one raises ValueError.
    loss_fn : callable
        ``loss_fn(logits, y)`` on a batch of one sample (logits (1, n_classes),
        y (1,)), returning a scalar (e.g. :func:`~.functional.cross_entropy`).
    stack : dict name -> Tensor (K, ...)
        The clients' parameters, and optionally float buffers (under their
        ``named_buffers()`` names), which are read, not differentiated.
    x : Tensor (K, B, ...)
        B samples per client.
    y : Tensor (K, B)
    mask : bool Tensor (K, B), optional
        Which samples are present; absent ones get a zero gradient.
    frozen : dict name -> Tensor, optional
        Shared tensors not in the stack (a frozen backbone).
    sample_state : dict name -> Tensor (K, B, ...), optional
        Buffers given one value per sample, replacing the stack's (e.g. a
        dropout key per sample, so that samples get independent masks).

    Returns
    -------
    dict name -> Tensor (K, B, ...)
        For the parameters of the stack (buffers excluded), each of shape
        (K, B) + the parameter's shape.

    Examples
    --------
    >>> import torch
    >>> from ebfl.learning.torch.functional import cross_entropy
    >>> model = torch.nn.Linear(3, 2)
    >>> stack = {n: p.detach()[None] for n, p in model.named_parameters()}  # K = 1
    >>> g = per_sample_grads(model, cross_entropy, stack, torch.randn(1, 5, 3),
    ...                      torch.tensor([[0, 1, 1, 0, 1]]))
    >>> tuple(g["weight"].shape)
    (1, 5, 2, 3)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(logits, y)")
    k = _check_stack(stack)
    mask = _check_batch(k, x, y, mask)
    _check_no_train_batchnorm(model)
    sample_state = _check_sample_state(model, sample_state, k, y.shape[1])
    grads = _per_sample_grads(model, loss_fn, stack, x, y, frozen, sample_state)
    return {n: torch.where(mask.reshape(*mask.shape, *([1] * (g.dim() - 2))), g, g.new_zeros(()))
            for n, g in grads.items()}


def dp_sgd_gradient(model, stack, x, y, mask, *, clip, noise_multiplier, generators,
                    expected_batch, frozen=None, loss_fn=cross_entropy, sample_state=None):
    """The DP-SGD gradient of every client: clip per sample, sum, add noise, divide by q n.

    For client j with present samples S_j (``mask``)::

        g_j = ( sum_{i in S_j} clip_C(grad l(x_i, y_i)) + N(0, (z C)^2 I) ) / expected_batch_j

    where ``clip_C(g) = g min(1, C / |g|_2)`` over all parameters of the stack
    jointly (buffers are not differentiated) and the noise comes from
    ``generators[j]``.

    Dividing by the *expected* batch size q n_j rather than the realized
    ``|S_j|`` is the standard DP-SGD estimator under Poisson sampling: it is
    unbiased for the mean clipped gradient over the client's data
    (E sum_{i in S_j} = q sum_i), and a fixed denominator keeps the L2
    sensitivity of the step at C / (q n_j), whereas ``|S_j|`` would itself depend
    on the data.

    The per-sample gradients are materialized: K B d numbers for d parameters
    in the stack (8 clients x 40 samples x ResNet-18's 1.41M-parameter adapter
    is 1.8 GB in float32).

    Parameters
    ----------
    model, stack, x, y, frozen, sample_state
        As :func:`per_sample_grads` (every BatchNorm in eval mode).
    mask : bool Tensor (K, B) or None
        The Poisson batch (see :func:`poisson_batch`); None: every row present.
    clip : float
        C > 0.
    noise_multiplier : float
        z >= 0 (0: clipping without noise, no privacy).
    generators : list of torch.Generator
        One per client; client j's noise is drawn from ``generators[j]`` (one
        ``randn`` per parameter, in the stack's order), the same numbers alone
        or stacked.
    expected_batch : float or Tensor (K,)
        q n_j, per client or one for all.
    loss_fn : callable
        Per-sample loss ``loss_fn(logits (1, c), y (1,))`` (default: cross-entropy).

    Returns
    -------
    dict name -> Tensor (K, ...)
        One noisy gradient per client, for the parameters of the stack (each of
        shape (K,) + the parameter's shape).

    Examples
    --------
    >>> import torch
    >>> model = torch.nn.Linear(3, 2)
    >>> stack = {n: p.detach()[None] for n, p in model.named_parameters()}
    >>> x, y = torch.randn(1, 4, 3), torch.tensor([[0, 1, 1, 0]])
    >>> g = dp_sgd_gradient(model, stack, x, y, None, clip=1.0, noise_multiplier=0.0,
    ...                     generators=[torch.Generator().manual_seed(0)], expected_batch=4.0)
    >>> norm = torch.cat([t.flatten() for t in g.values()]).norm()
    >>> bool(norm <= 1.0 + 1e-6)  # the mean of 4 gradients each of norm <= C = 1
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(logits, y)")
    k = _check_stack(stack)
    mask = _check_batch(k, x, y, mask)
    _check_no_train_batchnorm(model)
    clip = check_positive_scalar(clip, "clip")
    noise_multiplier = check_nonnegative_scalar(noise_multiplier, "noise_multiplier")
    generators = _check_generators(generators, k)
    expected = _check_expected_batch(expected_batch, k)
    sample_state = _check_sample_state(model, sample_state, k, y.shape[1])
    return _dp_sgd_gradient(model, loss_fn, stack, x, y, mask, clip, noise_multiplier,
                            generators, expected, frozen, sample_state)


def poisson_batch(n_train, sampling_rate, generators):
    """Poisson batches: client j keeps each of its n_j samples with probability q_j.

    Client j draws n_j uniforms from ``generators[j]`` (so the same batch
    alone or stacked). The batches of the K clients are returned as one
    padded index tensor: its width is the largest realized batch of the stack
    (at least 1), so no sampled point is ever dropped and there is no cap whose
    overflow would need accounting; only the tensor width varies from step to
    step. The cost of the padding is the gap between the largest and the mean
    batch of the stack (per-sample gradients of padding rows are computed,
    then masked out). The draws and the returned tensors are on the CPU, where
    the generators are; :func:`gather_batch` and :func:`dp_sgd_gradient` take
    them for data on any device.

    Parameters
    ----------
    n_train : 1-d int Tensor or list (K,)
        Training samples per client, each >= 1.
    sampling_rate : float or Tensor (K,)
        q_j in (0, 1].
    generators : list of torch.Generator (K,)

    Returns
    -------
    idx : int64 Tensor (K, B_pad)
        Row j holds client j's sampled indices in increasing order, then
        zeros (padding).
    mask : bool Tensor (K, B_pad)
        True on the sampled entries.
    sizes : int64 Tensor (K,)
        The realized batch sizes (``mask.sum(1)``).

    Examples
    --------
    >>> import torch
    >>> gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    >>> idx, mask, sizes = poisson_batch([100, 40], 0.1, gens)
    >>> idx.shape[1] == max(int(sizes.max()), 1), bool((mask.sum(1) == sizes).all())
    (True, True)
    """
    n, q = _check_rates(n_train, sampling_rate)
    generators = _check_generators(generators, n.numel())
    return _poisson_batch(n, q, generators)


def gather_batch(data, idx):
    """The training samples ``idx`` (K, B) of the K clients of ``data``: (x (K, B, ...), y (K, B)).

    ``data`` is a :class:`~ebfl.learning.torch.data.FederatedDataset` or a
    :class:`~ebfl.learning.torch.data.ClientSubset` (gathered from its parent,
    without copying the clients' whole data).

    Examples
    --------
    >>> import numpy as np, torch
    >>> from ebfl.learning.torch.data import FederatedDataset
    >>> xs = [np.arange(6.0).reshape(3, 2), np.ones((2, 2))]
    >>> data = FederatedDataset.from_clients(xs, [[0, 1, 0], [1, 1]], xs, [[0, 1, 0], [1, 1]])
    >>> x, y = gather_batch(data.subset([0]), torch.tensor([[2, 0]]))
    >>> x.tolist(), y.tolist()
    ([[[4.0, 5.0], [0.0, 1.0]]], [[0, 0]])
    """
    parent = getattr(data, "parent", data)
    rows = getattr(data, "clients", None)
    if rows is None:
        rows = torch.arange(data.n_clients)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != rows.numel():
        raise ValueError(f"idx must be an integer Tensor (K, B) with K = {rows.numel()} "
                         "clients")
    return parent.x_train[rows[:, None], idx], parent.y_train[rows[:, None], idx]
