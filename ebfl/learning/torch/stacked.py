"""Batched forward passes of K client models at once, and fused SGD steps for dense ones.

``torch.func.vmap(grad(...))`` maps one client's forward and backward pass over a
stack of parameters. Profiled on one CPU thread with ten clients and small batches,
two costs stood out. For the paper's CNN, vmap's batching rules for convolutions:
one gradient step took 22 ms through ``vmap(grad)`` against 15 ms as one grouped
convolution per layer differentiated by ordinary autograd; on another day, 18 ms
as such grouped convolutions against 7.4 ms once they ran channels-last (oneDNN's
fast layout for them on the CPU; max-pooling also runs 3x faster on it) and each
ReLU moved after the max-pooling that follows it (the same values and gradients,
on a tensor four times smaller). For a
784-200-200-10 MLP, memory traffic: the ten clients' parameters (8 MB) exceed the
caches, and a step writes the gradients, then reads parameters and gradients and
writes new parameters; :func:`dense_sgd_step_` makes it one read and write of each
weight.

This module writes a model's forward pass over the whole stack directly, for the
layer types whose batched form is one call: ``Linear`` (``baddbmm`` over the client
axis), ``Conv2d`` (one grouped convolution with the clients as groups), ``ReLU``,
``MaxPool2d``, ``Flatten`` and ``Identity``, inside ``nn.Sequential`` containers.
:func:`stacked_forward` returns ``None`` for any other model (a user's own module,
a BatchNorm, dropout), and the callers keep ``vmap``. Each client's logits, and so
each client's gradient, are those of its own model: the clients share no
arithmetic, so the results differ from ``vmap``'s only in floating-point order.

:func:`batched_grad` uses it for the per-client losses of
:func:`ebfl.learning.torch.functional.client_grad`: the logits of every client come
from one batched forward, the loss itself (a few small tensor operations: the
cross-entropy, a proximal term, a distillation term) is still mapped over clients
with ``vmap``, and one ``torch.autograd.grad`` of the summed losses gives every
client's gradient (each client's loss depends only on its own parameters).

:func:`dense_sgd_step_` takes a whole SGD step of dense models (FedAvg, FedHDP's
global and personal steps, AdaPeD's theta and mu steps): the gradient with respect
to the logits (closed form for the cross-entropy, autograd on the logits for other
losses), the backward pass of the linear layers by hand, and the update in place,
Ditto's proximal pull included.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

__all__ = ["batched_grad", "dense_sgd_step_", "stacked_forward"]


class NotBatchable(Exception):
    """Raised inside :func:`batched_grad` when a loss calls the model other than on its own
    parameters and first input; the caller falls back to ``vmap(grad)``."""


# ----------------------------------------------------------------- the layer program

def _sequential(module, prefix):
    """The program of an ``nn.Sequential`` (a list of steps), or None if a layer is not
    one of the supported types."""
    steps = []
    for name, child in module.named_children():
        sub = _layer(child, f"{prefix}{name}.")
        if sub is None:
            return None
        steps += sub
    return steps


def _layer(m, prefix):
    kind = type(m)
    if kind is nn.Sequential:
        return _sequential(m, prefix)
    if kind is nn.Linear:
        return [("linear", prefix + "weight", None if m.bias is None else prefix + "bias")]
    if kind is nn.ReLU:
        return [("relu",)]
    if kind is nn.Identity:
        return []
    if kind is nn.Flatten:
        return [("flatten",)] if (m.start_dim, m.end_dim) == (1, -1) else None
    if kind is nn.Conv2d:
        if m.padding_mode != "zeros":
            return None
        return [("conv", prefix + "weight", None if m.bias is None else prefix + "bias",
                 m.stride, m.padding, m.dilation, m.groups)]
    if kind is nn.MaxPool2d:
        if m.return_indices:
            return None
        return [("maxpool", m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)]
    return None


def _model_program(model):
    """The steps of ``model``'s forward pass, for the model classes whose forward is known."""
    from ebfl.learning.torch.models import CNN5, MLP, LogisticModel

    kind = type(model)  # exact types: a subclass may override forward
    if kind is nn.Sequential:
        return _sequential(model, "")
    if kind in (MLP, LogisticModel):
        return _sequential(model.net, "net.")
    if kind is CNN5:
        features = _sequential(model.features, "features.")
        classifier = _sequential(model.classifier, "classifier.")
        if features is None or classifier is None:
            return None
        # CNN5.forward adds the channel axis to (B, 28, 28) inputs
        return [("unsqueeze3",), *features, *classifier]
    return None


_PROGRAMS = weakref.WeakKeyDictionary()


def stacked_forward(model, stack=None):
    """A batched forward pass of ``model`` over a stack, or None where it has none.

    Parameters
    ----------
    model : nn.Module
        ``nn.Sequential``, :class:`~ebfl.learning.torch.models.MLP`,
        :class:`~ebfl.learning.torch.models.LogisticModel` or
        :class:`~ebfl.learning.torch.models.CNN5` built from ``Linear``,
        ``Conv2d``, ``ReLU``, ``MaxPool2d``, ``Flatten`` and ``Identity`` layers,
        without buffers.
    stack : dict, optional
        If given, None also when its names are not exactly the model's
        parameters (a stack with other entries, or only some of them).

    Returns
    -------
    callable or None
        ``forward(stack, x)``: ``stack`` maps each parameter name to a tensor
        with a leading client axis K, ``x`` has shape (K, B, ...); returns the
        logits, (K, B, n_classes). None for other models.

    Examples
    --------
    >>> import torch
    >>> from ebfl.learning.torch.models import MLP
    >>> from ebfl.learning.torch.functional import client_forward, fresh_params, replicate
    >>> model = MLP(4, 3, hidden=(5,))
    >>> stack = replicate(fresh_params(model, 0), 2)
    >>> x = torch.randn(2, 6, 4)
    >>> logits = stacked_forward(model)(stack, x)
    >>> logits.shape
    torch.Size([2, 6, 3])
    >>> bool(torch.allclose(logits, client_forward(model, stack, x), atol=1e-6))
    True
    """
    program = _program_of(model)
    if program is None or (stack is not None and set(stack) != _names(program)):
        return None
    return functools.partial(_run, program)


def _program_of(model):
    """``model``'s program (a tuple of steps) or None, worked out once per model."""
    try:
        return _PROGRAMS[model]
    except KeyError:
        pass
    program = None if any(True for _ in model.buffers()) else _model_program(model)
    _PROGRAMS[model] = None if program is None else _pool_before_relu(program)
    return _PROGRAMS[model]


def _pool_before_relu(program):
    """The program with each ReLU that a max-pooling follows moved after it.

    ``maxpool(relu(x)) == relu(maxpool(x))`` exactly (ReLU is nondecreasing), and the
    gradients agree too: both route a window's gradient to the same position, the
    first maximum (the positive entries keep their order; a window with no positive
    entry gets zero either way). The ReLU and its backward then run on the pooled
    tensor, four times smaller for 2x2 pooling.
    """
    out = list(program)
    for i in range(len(out) - 1):
        if out[i][0] == "relu" and out[i + 1][0] == "maxpool":
            out[i], out[i + 1] = out[i + 1], out[i]
    return tuple(out)


def _traced(stack):
    """Whether the call is inside a torch.func transform (a caller differentiating
    through the step, as second-order methods do) or on tensors an outer autograd
    graph tracks: detached leaves would cut that graph, so the fast paths step
    aside for ``vmap(grad)``, which composes."""
    return torch._C._functorch.maybe_current_level() is not None \
        or any(v.requires_grad for v in stack.values())


@functools.cache  # one entry per architecture (equal programs hash alike)
def _names(program):
    """The parameter names a program reads (every parameter of its model); asked
    on every step, so cached."""
    return frozenset(name for step in program if step[0] in ("linear", "conv")
                     for name in step[1:3] if name is not None)


def _run(program, stack, x):
    """Run ``program`` on ``x`` (K, B, ...) with the parameters of ``stack``.

    Convolutions work in a grouped layout, (B, K * C, H, W): the K clients' channels
    side by side, each client a group of the convolution, so one call convolves every
    client's images with that client's filters. Other steps take either layout.
    """
    k = x.shape[0]
    grouped = False  # False: (K, B, ...); True: (B, K * C, H, W)
    for step in program:
        op = step[0]
        if op == "unsqueeze3":
            if x.dim() == 4:  # (K, B, H, W): one channel
                x = x.unsqueeze(2)
        elif op == "relu":
            x = torch.relu(x)
        elif op == "flatten":
            if grouped:
                b = x.shape[0]
                x, grouped = x.reshape(b, k, -1).transpose(0, 1), False
            else:
                x = x.flatten(2)
        elif op == "linear":
            if grouped:
                x, grouped = _ungroup(x, k), False
            w, bias = stack[step[1]], None if step[2] is None else stack[step[2]]
            shape = x.shape
            flat = x.reshape(k, -1, shape[-1])
            out = (torch.bmm(flat, w.transpose(1, 2)) if bias is None
                   else torch.baddbmm(bias.unsqueeze(1), flat, w.transpose(1, 2)))
            x = out.reshape(*shape[:-1], w.shape[1])
        elif op == "conv":
            _, wname, bname, stride, padding, dilation, groups = step
            if not grouped:
                x, grouped = _group(x), True
            w = stack[wname]
            bias = None if bname is None else stack[bname].reshape(-1)
            x = F.conv2d(x, w.reshape(-1, *w.shape[2:]), bias, stride, padding, dilation,
                         groups * k)
        elif op == "maxpool":
            _, kernel, stride, padding, dilation, ceil_mode = step
            if not grouped:
                x, grouped = _group(x), True
            x = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
        else:  # pragma: no cover - programs are built above
            raise AssertionError(op)
    return _ungroup(x, k) if grouped else x


def _group(x):
    """(K, B, C, H, W) -> (B, K * C, H, W), channels-last in memory on the CPU.

    Why channels-last: oneDNN's grouped convolution and max-pooling are several
    times faster on it for these small per-client channel counts (measured on one
    thread, ten clients of the papers' CNN at batch 20, forward and backward: the
    second convolution 1.6 against 4.5 ms, the first pooling 1.1 against 3.2 ms).
    Convolutions, ReLU and pooling keep the layout, so it is set once. Other
    devices keep the contiguous layout, on which the GPU figures were measured.
    """
    k, b, c = x.shape[:3]
    if x.device.type != "cpu":
        return x.transpose(0, 1).reshape(b, k * c, *x.shape[3:])
    # (B, H, W, K, C) in memory is (B, K * C, H, W) channels-last
    rows = x.permute(1, 3, 4, 0, 2).contiguous()  # one copy, whatever x's strides
    return rows.view(b, *x.shape[3:], k * c).permute(0, 3, 1, 2)


def _ungroup(x, k):
    """(B, K * C, H, W) -> (K, B, C, H, W)."""
    b = x.shape[0]
    return x.reshape(b, k, -1, *x.shape[2:]).transpose(0, 1)


# ----------------------------------------------------------------- gradients

#: Loss functions (by code object) found to call the model otherwise than batchable.
_UNBATCHABLE = set()


def batched_grad(forward, loss, params, args):
    """Per-client gradients of ``loss`` through one batched forward, or None.

    Parameters
    ----------
    forward : callable
        From :func:`stacked_forward`.
    loss : callable
        ``loss(forward_fn, params_i, *args_i)`` for one client, as in
        :func:`ebfl.learning.torch.functional.client_grad`.
    params : dict
        Name -> (K, ...) tensors (the stack, without buffers).
    args : tuple
        Each with a leading client axis K; ``args[0]`` is the model's input.

    Returns
    -------
    dict or None
        Name -> (K, ...) gradients; None when ``loss`` evaluates the model on
        anything but its own parameters and ``args[0]`` (the caller then maps
        the whole loss with ``vmap(grad)``).
    """
    key = getattr(loss, "__code__", loss)
    if key in _UNBATCHABLE or not args:
        return None
    if _traced(params):
        return None
    with torch.enable_grad():
        leaves = {n: v.detach().requires_grad_(True) for n, v in params.items()}
        logits = forward(leaves, args[0])
        try:
            losses = _client_losses(loss, logits, leaves, args)
        except NotBatchable:
            _UNBATCHABLE.add(key)
            return None
        names = list(leaves)
        grads = torch.autograd.grad(losses.sum(), [leaves[n] for n in names],
                                    allow_unused=True)
    return {n: torch.zeros_like(leaves[n]) if g is None else g
            for n, g in zip(names, grads, strict=True)}


def _client_losses(loss, logits, params, args):
    """Each client's ``loss`` (a (K,) tensor), mapped over the clients with ``vmap``,
    its model's output taken from ``logits`` (K, B, C); raises NotBatchable when the
    loss calls the model otherwise than on its own parameters and ``args[0]``."""
    def one(logits_i, p, *a):
        def model_fn(q, xb):
            if q is not p or xb is not a[0]:
                raise NotBatchable
            return logits_i

        return loss(model_fn, p, *a)

    return vmap(one)(logits, params, *args)


# ----------------------------------------------------------------- fused SGD steps

_DENSE = weakref.WeakKeyDictionary()

#: Losses (by code object) found to depend on the parameters otherwise than through
#: the model's logits: :func:`dense_sgd_step_` leaves them to the generic step.
_NOT_LOGITS_ONLY = set()


def _dense_layers(model):
    """[(weight name, bias name or None, relu after)] of a model made of Linear, ReLU,
    Flatten and Identity layers only (an MLP, logistic regression), else None."""
    try:
        return _DENSE[model]
    except KeyError:
        pass
    program = _program_of(model)
    layers, flatten = [], False
    if program is not None:
        for step in program:
            if step[0] == "linear":
                layers.append([step[1], step[2], False])
            elif step[0] == "relu" and layers and not layers[-1][2]:
                layers[-1][2] = True
            elif step[0] == "flatten" and not layers and not flatten:
                flatten = True
            else:  # a convolution, a ReLU on the input, two in a row: not this path
                layers = None
                break
    out = None if not layers else ([tuple(v) for v in layers], flatten)
    _DENSE[model] = out
    return out


def dense_sgd_step_(model, loss, stack, *args, lr, weight_decay=0.0, anchor=None, lam=None):
    """One SGD step of every client, in place, for dense models: the fused form of
    ``sgd_step(stack, client_grad(model, loss, stack, *args), lr, weight_decay)``.

    The backward pass of the linear layers is written by hand so that each weight
    is read and written once per step: ``W <- (1 - lr wd) W - lr dZ^T X`` is one
    ``baddbmm_`` per layer. Why: at K clients the stacked parameters exceed the
    CPU's caches (8 MB for ten clients of a 784-200-200-10 MLP), and the generic
    step makes four passes over them (the gradients written, then the parameters
    and the gradients read and the new parameters written); measured on one
    thread, 60 steps of ten such clients took 0.11 s fused against 0.28-0.56 s
    generic. The gradient of the loss with respect to the logits comes from the
    cross-entropy's closed form for :func:`~ebfl.learning.torch.functional.ce_loss`,
    and from autograd on the (K, B, classes) logits for other losses (a
    distillation term, a tempered cross-entropy); the results equal the generic
    step's to floating-point order.

    With ``anchor``, the step is Ditto's (and FedHDP's) proximal one,
    ``p <- p - lr (g + lam (p - anchor) + wd p)``, the pull applied in the same
    pass (a ``lerp_`` toward the anchor).

    Parameters
    ----------
    model : nn.Module
        An MLP or logistic regression (Linear, ReLU, Flatten, Identity layers).
    loss : callable
        ``loss(forward, params, *args_i)`` as for
        :func:`~ebfl.learning.torch.functional.client_grad`; it must depend on the
        parameters only through ``forward(params, args_i[0])``.
    stack : dict
        Name -> (K, ...) parameters, updated in place: the caller must own them
        (for example a round's copy of the global model, or the sampled
        clients' rows).
    *args : tensors with a leading client axis K
        ``args[0]`` is the model's input.
    lr : float or tensor (K,)
        One rate, or one per client; a client whose rate is 0 keeps its model.
    weight_decay : float
    anchor : dict, optional
        Name -> one (unstacked) tensor per parameter, the proximal term's centre.
    lam : float or tensor (K,), optional
        The proximal weight (required with ``anchor``).

    Returns
    -------
    bool
        False, with ``stack`` untouched, when the model is not dense, the stack
        holds other entries, the loss uses the parameters otherwise than
        through the model, or the call is inside a torch.func transform or on
        tensors that require gradients: the caller then takes the generic step.

    Examples
    --------
    >>> import torch
    >>> from ebfl.learning.torch.models import MLP
    >>> from ebfl.learning.torch.functional import (ce_loss, client_grad, fresh_params,
    ...                                            replicate, sgd_step)
    >>> model = MLP(4, 3, hidden=(5,))
    >>> stack = replicate(fresh_params(model, 0), 2)
    >>> x, y = torch.randn(2, 6, 4), torch.randint(0, 3, (2, 6))
    >>> generic = sgd_step(stack, client_grad(model, ce_loss, stack, x, y), 0.1)
    >>> dense_sgd_step_(model, ce_loss, stack, x, y, lr=0.1)
    True
    >>> all(torch.allclose(stack[n], generic[n], atol=1e-6) for n in stack)
    True
    """
    dense = _dense_layers(model)
    if dense is None or not args or getattr(loss, "__code__", loss) in _NOT_LOGITS_ONLY:
        return False
    if (anchor is None) != (lam is None):
        raise ValueError("anchor and lam go together: give both or neither")
    layers, flatten = dense
    x = args[0]
    if set(stack) != _names(_program_of(model)) or (x.dim() != 3 and not flatten) \
            or (anchor is not None and set(anchor) != set(stack)) or _traced(stack):
        return False
    k, b = x.shape[:2]
    with torch.no_grad():
        h = x.reshape(k, b, -1)  # the model's Flatten, or already (K, B, features)
        inputs = []
        for w, bias, relu in layers:
            inputs.append(h)
            h = (torch.bmm(h, stack[w].transpose(1, 2)) if bias is None
                 else torch.baddbmm(stack[bias].unsqueeze(1), h, stack[w].transpose(1, 2)))
            if relu:
                h = torch.relu(h)
    d = _logits_grad(loss, h, stack, args)
    if d is None:
        return False
    with torch.no_grad():
        per_client = isinstance(lr, torch.Tensor) or anchor is not None
        if per_client:
            rate = torch.as_tensor(lr, dtype=d.dtype, device=d.device).expand(k).reshape(k, 1)
            if anchor is not None:
                pull = rate * torch.as_tensor(lam, dtype=d.dtype, device=d.device).reshape(-1, 1)
        for i in range(len(layers) - 1, -1, -1):
            w, bias, _ = layers[i]
            # the gradient flowing down uses the weights before this step's update
            down = None if i == 0 else torch.bmm(d, stack[w])
            if i > 0 and layers[i - 1][2]:
                down.mul_(inputs[i] > 0)  # ReLU's derivative at the layer's input
            if not per_client:
                stack[w].baddbmm_(d.transpose(1, 2), inputs[i], beta=1 - lr * weight_decay,
                                  alpha=-lr)
                if bias is not None:
                    if weight_decay:
                        stack[bias].mul_(1 - lr * weight_decay)
                    stack[bias].sub_(d.sum(1), alpha=lr)
            else:
                step = d * rate.unsqueeze(2)
                for name in (w, bias):
                    if name is None:
                        continue
                    p = stack[name]
                    shape = (k,) + (1,) * (p.dim() - 1)
                    if anchor is not None and weight_decay:
                        # p (1 - lr (lam + wd)) + lr lam anchor
                        p.mul_(1 - (pull + rate * weight_decay).reshape(shape))
                        p.addcmul_(pull.reshape(shape), anchor[name].to(p.dtype))
                    elif anchor is not None:  # p + lr lam (anchor - p)
                        p.lerp_(anchor[name].to(p.dtype), pull.reshape(shape))
                    elif weight_decay:
                        p.mul_(1 - (rate * weight_decay).reshape(shape))
                stack[w].baddbmm_(step.transpose(1, 2), inputs[i], alpha=-1)
                if bias is not None:
                    stack[bias].sub_(step.sum(1))
            d = down
    return True


def _logits_grad(loss, logits, stack, args):
    """d(sum over clients of loss)/d(logits), (K, B, C); None when ``loss`` is not a
    function of the logits alone (the caller takes the generic step)."""
    from ebfl.learning.torch.functional import ce_loss

    k, b = logits.shape[:2]
    if loss is ce_loss and len(args) == 2 and args[1].shape == (k, b) \
            and args[1].dtype == torch.int64:
        # d(mean cross-entropy)/d(logits) = (softmax - one-hot) / B
        y = args[1]
        with torch.no_grad():
            d = torch.softmax(logits, dim=-1)
            d.scatter_add_(2, y.unsqueeze(2), torch.full((k, b, 1), -1.0, dtype=d.dtype,
                                                         device=d.device))
            return d.div_(b)
    key = getattr(loss, "__code__", loss)
    with torch.enable_grad():
        z = logits.detach().requires_grad_(True)
        # the parameters as leaves too: a loss that uses them outside the model would
        # get a gradient for them, which this step does not apply
        leaves = {n: v.detach().requires_grad_(True) for n, v in stack.items()}
        try:
            losses = _client_losses(loss, z, leaves, args)
        except NotBatchable:
            _NOT_LOGITS_ONLY.add(key)
            return None
        if not losses.requires_grad:  # a constant loss
            return torch.zeros_like(logits)
        grads = torch.autograd.grad(losses.sum(), [z, *leaves.values()], allow_unused=True)
    if any(g is not None for g in grads[1:]):
        _NOT_LOGITS_ONLY.add(key)
        return None
    return torch.zeros_like(z) if grads[0] is None else grads[0]
