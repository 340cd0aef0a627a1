"""Stacked parameters and the vectorized pieces every strategy is built from.

A model's parameters are a dict name -> tensor; a *stack* holds one copy per
client along a new leading axis. :func:`client_forward` and
:func:`client_grad` map a per-client function over a stack with
``torch.func.vmap``, so K clients cost one batched call instead of K. For the
models built from linear, convolution, pooling and ReLU layers the forward pass
over the stack is written out as batched matrix products and grouped
convolutions instead (:mod:`ebfl.learning.torch.stacked`), and only the loss is
mapped with ``vmap`` (a CNN5 gradient of ten clients at batch 20: 7.4 ms, against
22 ms for ``vmap(grad(...))`` over the whole model when measured on another day,
on one CPU thread).

A stack may also hold the model's float buffers (BatchNorm running means and
variances), under their ``named_buffers()`` names: they are the clients' own
statistics, updated in place by every train-mode forward pass (``functional_call``
writes each client's row), never differentiated, and averaged with the
parameters by :func:`weighted_mean`. Evaluation runs under :func:`eval_mode`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from ebfl.learning.torch.stacked import batched_grad, stacked_forward

__all__ = ["batch_counters", "buffer_names", "check_device", "clip_and_noise", "client_forward",
           "ce_loss", "client_generators", "client_grad", "clone_params", "cross_entropy",
           "distillation_kl", "drop_batch_counters", "eval_mode", "fresh_params", "model_device",
           "model_state", "replicate", "sgd_step", "take", "to_device", "train_mode",
           "weighted_mean"]


@contextlib.contextmanager
def eval_mode(model):
    """Run ``model`` in eval mode inside (BatchNorm uses its running statistics, no
    dropout); its previous mode is restored on exit."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextlib.contextmanager
def train_mode(model):
    """Run ``model`` in train mode inside; its previous mode is restored on exit."""
    was_training = model.training
    model.train()
    try:
        yield model
    finally:
        model.train(was_training)


def buffer_names(model):
    """Names of the model's floating-point buffers (the state a stack carries beside the
    parameters; integer buffers such as ``num_batches_tracked`` are not carried)."""
    return [name for name, b in model.named_buffers() if b.is_floating_point()]


def drop_batch_counters(model):
    """Remove the ``num_batches_tracked`` counters of ``model``'s BatchNorm layers, in place.

    The counter is an integer buffer that a train-mode forward pass increments;
    per-client stacks cannot carry it through ``vmap`` and ``grad``, and with
    a set ``momentum`` (the default 0.1) BatchNorm never reads it. Returns ``model``.
    """
    for module in model.modules():
        if (isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                and getattr(module, "num_batches_tracked", None) is not None):
            if module.momentum is None:
                raise ValueError(f"BatchNorm {module} has momentum=None (a cumulative average "
                                 "that reads num_batches_tracked): give it a momentum")
            module.register_buffer("num_batches_tracked", None)
    return model


def batch_counters(model):
    """Names of the BatchNorm ``num_batches_tracked`` counters ``model`` still has."""
    return [name for name, b in model.named_buffers() if name.endswith("num_batches_tracked")]


def model_state(model):
    """A detached copy of the model's parameters and floating-point buffers."""
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    state.update({name: b.detach().clone() for name, b in model.named_buffers()
                  if b.is_floating_point()})
    return state


def check_labels(y, name, n, n_classes):
    """Integer class labels, one per sample, each in ``[0, n_classes)``.

    Parameters
    ----------
    y : torch.Tensor
        The labels, shape ``(n,)``, any integer dtype.
    name : str
        The argument's name in error messages.
    n : int
        The number of samples the labels belong to.
    n_classes : int
        The number of classes of the model or of the probabilities.

    Returns
    -------
    torch.Tensor
        ``y`` as int64 (a copy only when its dtype differs).

    Raises
    ------
    TypeError
        Not a Tensor, or a floating, complex or boolean one.
    ValueError
        Not of shape ``(n,)``, or a label outside ``[0, n_classes - 1]``.
    """
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a Tensor of integer class labels, got "
                        f"{type(y).__name__}")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer class labels, got dtype {y.dtype}")
    if tuple(y.shape) != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one label per sample), got "
                         f"{tuple(y.shape)}")
    if n:
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= n_classes:
            raise ValueError(f"{name} must hold labels in [0, {n_classes - 1}] ({n_classes} "
                             f"classes), got values from {lo} to {hi}")
    return y.long()


def check_device(device, name="device"):
    """The ``torch.device`` a run computes on: "cpu" (or None), "cuda" or "cuda:N".

    Parameters
    ----------
    device : None, str or torch.device
        None means "cpu". "cuda" is the current CUDA device (index filled in,
        so that devices compare equal).
    name : str
        The argument's name in error messages.

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        An unknown device, a device type other than CPU and CUDA, CUDA where
        this torch build or machine has none, or a GPU index out of range.
    TypeError
        Neither None, a str nor a torch.device.

    Examples
    --------
    >>> check_device(None)
    device(type='cpu')
    >>> check_device("cpu")
    device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got "
                             f"{device!r}") from None
    elif isinstance(device, torch.device):
        parsed = device
    else:
        raise TypeError(f"{name} must be None, a str ('cpu', 'cuda', 'cuda:N') or a "
                        f"torch.device, got {type(device).__name__}")
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != "cuda":
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got "
                         f"{str(device)!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name}={str(device)!r}: CUDA is not available (this torch build "
                         f"{torch.__version__} has no CUDA support, or this machine has no "
                         "usable GPU); use device='cpu'")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if parsed.index is None else parsed.index
    if index >= count:
        raise ValueError(f"{name}={str(device)!r}: GPU index out of range; this machine has "
                         f"{count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def model_device(model):
    """The device of ``model``'s parameters (and buffers): where a strategy computes.

    Examples
    --------
    >>> model_device(torch.nn.Linear(2, 1))
    device(type='cpu')
    """
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def to_device(tree, device):
    """A nested dict (or list, tuple) of tensors with every tensor on ``device``.

    Tensors already there are passed on as they are (no copy); other leaves
    (numbers, strings, numpy arrays) too. The input is not modified.

    Examples
    --------
    >>> tree = {"w": torch.zeros(2), "kd": {"steps": torch.tensor(3.0)}, "n": 4}
    >>> moved = to_device(tree, "cpu")
    >>> moved["kd"]["steps"].device, moved["n"]
    (device(type='cpu'), 4)
    """
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(to_device(v, device) for v in tree)
    return tree


def fresh_params(model, seed):
    """Fresh initial parameters of ``model``'s architecture, drawn from ``seed``.

    A copy of the model has every submodule's ``reset_parameters`` called under
    a seeded, forked RNG: the caller's model and the global RNG stay untouched.
    Float buffers (BatchNorm statistics) come with the parameters, reset too.
    The draws are made on the CPU whatever the model's device (CUDA's generator
    gives other numbers for the same seed), then moved to it: a model on a GPU
    starts from exactly the parameters it has on the CPU.
    """
    import copy

    device = model_device(model)
    fresh = copy.deepcopy(model).to("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in fresh.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                _reset_batchnorm(module)
            elif hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return to_device(model_state(fresh), device)


@torch.no_grad()
def _reset_batchnorm(bn):
    """BatchNorm's own reset, which also works without the batch counter
    (torch's ``reset_running_stats`` zeroes ``num_batches_tracked`` unconditionally)."""
    if bn.running_mean is not None:
        bn.running_mean.zero_()
        bn.running_var.fill_(1)
    if getattr(bn, "num_batches_tracked", None) is not None:
        bn.num_batches_tracked.zero_()
    if bn.affine:
        bn.weight.fill_(1)
        bn.bias.zero_()


def clone_params(params):
    """A detached copy of a parameter dict (or of a stack)."""
    return {name: p.detach().clone() for name, p in params.items()}


def replicate(params, k):
    """k copies of a single parameter dict, stacked along a new leading axis."""
    return {name: p.detach().unsqueeze(0).expand(k, *p.shape).clone()
            for name, p in params.items()}


def take(stack, idx):
    """The rows ``idx`` of a stack (a copy)."""
    return {name: p[idx] for name, p in stack.items()}


def put(stack, idx, rows):
    """Write ``rows`` into the rows ``idx`` of ``stack`` (in place)."""
    for name, p in stack.items():
        p[idx] = rows[name]


def weighted_mean(stack, weights):
    """The weighted average over the client axis: a single parameter dict."""
    w = weights / weights.sum()
    return {name: torch.tensordot(w.to(device=p.device, dtype=p.dtype), p, dims=1)
            for name, p in stack.items()}


def sgd_step(stack, grads, lr, weight_decay=0.0):
    """p - lr (g + weight_decay p); ``lr`` a scalar or one value per client.

    Entries without a gradient (buffers) are passed on unchanged.
    """
    out = {}
    for name, p in stack.items():
        if name not in grads:
            out[name] = p
            continue
        g = grads[name]
        # p - lr g - lr wd p: one new tensor, updated in place for the decay, since the
        # step is memory-bound (each pass over a 10-client MLP stack costs about 1 ms)
        if isinstance(lr, torch.Tensor):  # one rate per client: broadcast over the rest
            rate = lr.to(device=p.device, dtype=p.dtype).reshape(-1, *([1] * (p.dim() - 1)))
            # fused: ``p - rate * g`` as two broadcasting operations took 8x longer on
            # the CPU (measured: 8.2 against 1.0 ms for 10 x 200 x 784 floats)
            new = torch.addcmul(p, rate, g, value=-1)
            if weight_decay:
                new.addcmul_(rate, p, value=-weight_decay)
        else:
            new = torch.add(p, g, alpha=-lr)
            if weight_decay:
                new.add_(p, alpha=-lr * weight_decay)
        out[name] = new
    return out


def cross_entropy(logits, y):
    """Mean cross-entropy of a batch."""
    return F.cross_entropy(logits, y)


def ce_loss(forward, params, x, y):
    """The loss of :func:`client_grad` for plain classification: cross-entropy of
    ``forward(params, x)`` against ``y``."""
    return F.cross_entropy(forward(params, x), y)


def distillation_kl(teacher_logits, student_logits):
    """KL(softmax(teacher) || softmax(student)), summed over classes, mean over the batch.

    The KD loss of AdaPeD with the global model as teacher (AdaPeD, Algorithm 5); temperature
    1. The paper does not say sum or mean over the batch (errata [!12]): the mean
    keeps it on the cross-entropy's scale.
    """
    log_t = F.log_softmax(teacher_logits, dim=-1)
    log_s = F.log_softmax(student_logits, dim=-1)
    return torch.sum(log_t.exp() * (log_t - log_s), dim=-1).mean()


def client_forward(model, stack, x, *, frozen=None):
    """Logits of every client's model on its own inputs: stack (K, ...), x (K, B, ...).

    ``frozen`` (name -> tensor, optional): parameters shared by every client
    and not stacked, e.g. a pretrained backbone under per-client adapters
    (PerAda); ``stack`` then holds only the remaining parameters.
    """
    shared = {} if frozen is None else frozen
    fast = stacked_forward(model, stack) if frozen is None else None
    if fast is not None:
        return fast(stack, x)

    def one(params, xb):
        return functional_call(model, (params, shared), (xb,))

    return vmap(one)(stack, x)


def client_grad(model, loss, stack, *args, frozen=None):
    """Per-client gradients of ``loss(logits_fn, params, *args_i)`` over a stack.

    ``loss`` receives ``forward(params, x)`` (the functional model), the client's
    parameters and its slices of ``args`` (each with a leading client axis).
    Gradients are taken with respect to the stacked parameters only: ``frozen``
    parameters (as in :func:`client_forward`) enter the forward pass unbatched
    and receive none. Buffers in the stack (names in ``model``'s float buffers)
    are not differentiated: a train-mode forward pass updates each client's row
    in place, and they are absent from the returned gradients.
    """
    shared = {} if frozen is None else frozen
    fast = stacked_forward(model, stack) if frozen is None else None
    if fast is not None:
        grads = batched_grad(fast, loss, stack, args)
        if grads is not None:
            return grads
    buffers = set(buffer_names(model))
    params = {k: v for k, v in stack.items() if k not in buffers}
    state = {k: v for k, v in stack.items() if k in buffers}

    def forward(p, xb, b):
        return functional_call(model, (p, b, shared), (xb,))

    def one(p, b, *a):
        return loss(lambda q, xb: forward(q, xb, b), p, *a)

    return vmap(grad(one))(params, state, *args)


def clip_and_noise(tensors, clip, noise_std, generator, *, rows_per_client=1):
    """The Gaussian mechanism on every client's update: joint L2 clip, then noise.

    Parameters
    ----------
    tensors : dict of name -> Tensor
        The blocks one client releases together, each with a leading axis of
        ``K * rows_per_client`` rows (client j owns rows
        ``j*rows_per_client ... (j+1)*rows_per_client - 1``: FedEM's M
        component copies are M rows per client).
    clip : float
        C: each client's blocks, concatenated, are scaled by
        ``1 / max(norm / C, 1)``.
    noise_std : float
        sigma: N(0, sigma^2) is added to every coordinate after clipping (drawn
        even when sigma = 0, so the generator's stream does not depend on it).
    generator : torch.Generator or list of torch.Generator
        One generator for all the noise, or one per client (client j's noise
        from ``generator[j]``: the same numbers whether a client runs alone or
        stacked with others).

    Returns
    -------
    dict of name -> Tensor
        Same shapes; the inputs are not modified.
    """
    k = next(iter(tensors.values())).shape[0] // rows_per_client
    sq = sum(t.reshape(k, -1).pow(2).sum(1) for t in tensors.values())
    factor = 1 / torch.clamp(torch.sqrt(sq) / clip, min=1.0)
    return {name: (t.reshape(k, -1) * factor[:, None].to(t.dtype)).reshape(t.shape)
            + noise_std * _gaussian(t, generator, k)
            for name, t in tensors.items()}


def _gaussian(t, generator, k):
    """Standard normal noise shaped as ``t``: from one generator, or client j's rows from
    ``generator[j]``; drawn on the CPU (the generators' device), then moved to ``t``'s."""
    if isinstance(generator, torch.Generator):
        return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)
    if len(generator) != k:
        raise ValueError(f"need one generator per client: {k} clients, {len(generator)} "
                         "generators")
    rows = (t.shape[0] // k, *t.shape[1:])
    noise = torch.cat([torch.randn(rows, generator=g, dtype=t.dtype) for g in generator])
    return noise.to(t.device)


def client_generators(seeds):
    """One CPU ``torch.Generator`` per seed (the clients' streams of a round).

    Every random number of a run is drawn from CPU generators, then moved to
    the device the run computes on, so a run on a GPU uses the same random
    numbers as on the CPU.
    """
    return [torch.Generator().manual_seed(int(s)) for s in seeds]
