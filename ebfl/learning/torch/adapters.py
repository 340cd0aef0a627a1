"""Residual adapters planted in a ResNet: the architecture of PerAda (Xie et al., CVPR 2024).

PerAda keeps a pretrained backbone frozen and personalizes, trains and
communicates only small *adapters*: blocks with a skip connection that are the
identity when their parameters are zero (Section 4 and Figure 2 of PerAda).
The paper implements them after Pillutla et al. (footnote 1 of Section 7);
as in its official code, each BasicBlock of the ResNet gets ``adapter1``
after ``conv1`` (before ``bn1``) and ``adapter2`` after ``conv2`` (before
``bn2``), each

    AdapterBlock(x) = x + Conv1x1(Dropout(BatchNorm(x))).

The trained "adapter" set also holds the BatchNorm layers named
``bn1``/``bn2`` and the head ``fc``: for ResNet-18 with 10 classes it has
1,413,258 parameters against the backbone's 11,181,642 (the 1.41M and 11.18M,
12.6 %, of Section 7.1 and Table 1 of PerAda).

Two backbones are built here with torchvision's parameter names (``conv1``,
``bn1``, ``layer1.0.conv1``, ..., ``layer2.0.downsample.0``, ``fc``), so that
pretrained weights load by name: :class:`ResNet18Adapters` (ImageNet-sized,
:func:`load_torchvision_weights`) and :class:`SmallResNet` (a CPU-sized
backbone for 28 x 28 images, pretrained by :mod:`ebfl.learning.torch.pretrain`).

Everything a model holds is a parameter or a float buffer, so that one dict of
tensors is a client's whole state (stackable for ``torch.func.vmap``):
BatchNorm layers carry no ``num_batches_tracked`` counter (their momentum, 0.1,
does not need it), and dropout is a deterministic function of a float64 buffer
``dropout_key`` instead of torch's random dropout, which ``vmap`` refuses.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ebfl._validation import check_int_scalar, check_real_scalar, check_string_list

__all__ = ["AdapterBlock", "LoadReport", "ResNet18Adapters", "SmallResNet",
           "load_torchvision_weights", "parameter_counts", "parameter_groups", "split_state"]

#: Largest number of channels accepted (a 1x1 conv of MAX_WIDTH^2 floats is 4 TB).
MAX_WIDTH = 2**20

#: Largest model accepted, in floats (parameters and buffers): 4 GiB of float32. The
#: count is checked before any layer is allocated, so that widths which each fit
#: MAX_WIDTH but together ask for terabytes are refused by name, not by MemoryError.
MAX_FLOATS = 2**30

#: Standard deviation of the adapters' 1x1 conv weights at initialization: the
#: block starts within ~1e-4 of the identity (PerAda's official code).
ADAPTER_INIT_STD = 1e-4

# The dropout hash works modulo the Mersenne prime 2^31 - 1: a residue times a
# multiplier below 2^31 stays below 2^62, so int64 arithmetic never overflows.
_PRIME = 2**31 - 1
# Multipliers with good spectral properties modulo 2^31 - 1 (Fishman and Moore, 1986).
_MULTIPLIERS = (742_938_285, 950_706_376, 1_226_874_159)

GROUPS = ("adapter", "backbone", "input", "output", "bn", "feature_extractor", "all")


# --------------------------------------------------------------------------- layers


class _BatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d without the integer ``num_batches_tracked`` buffer.

    With a momentum set the counter is never read, and dropping it leaves a
    model whose state is float tensors only. torch's ``reset_running_stats``
    would zero the missing counter, hence the override.
    """

    def __init__(self, channels):
        super().__init__(channels, momentum=0.1)
        self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        self.running_mean.zero_()
        self.running_var.fill_(1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # torch's BatchNorm adds a num_batches_tracked entry to a state dict without
        # version metadata (any plain dict), which this module would then refuse
        nn.Module._load_from_state_dict(self, state_dict, prefix, *args, **kwargs)


class _Conv2d(nn.Conv2d):
    """A bias-free conv with torchvision's ResNet initialization (He normal, fan-out).

    Written as ``reset_parameters`` so that re-initializing a model (e.g.
    ``functional.fresh_params``) draws from the same distribution as building it.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride,
                         padding=kernel_size // 2, bias=False)

    def reset_parameters(self):
        nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")


class _AdapterConv(nn.Conv2d):
    """The adapter's 1x1 conv, initialized N(0, ADAPTER_INIT_STD^2) (near the identity)."""

    def __init__(self, channels):
        super().__init__(channels, channels, 1, bias=False)

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=ADAPTER_INIT_STD)


def _mix(h):
    """One bijective-ish scrambling round of residues modulo 2^31 - 1 (xor-shift, multiply)."""
    h = h ^ (h >> 16)
    h = (h * _MULTIPLIERS[0]) % _PRIME
    h = h ^ (h >> 13)
    return (h * _MULTIPLIERS[1]) % _PRIME


def _hash_uniform(key, salt, shape):
    """Uniform [0, 1) numbers, one per element of ``shape``, a function of (key, salt, index).

    A counter-based generator written with integer tensor ops, because
    ``torch.func.vmap`` refuses torch's random dropout: under vmap ``key`` is one
    scalar per client and each client gets exactly the numbers it would get alone.
    """
    numel = 1
    for size in shape:
        numel *= size
    index = torch.arange(numel, dtype=torch.int64, device=key.device).reshape(shape)
    if numel > _PRIME:  # indices repeat beyond 2^31 - 1 elements (never in practice)
        index = index % _PRIME
    k = key.floor().to(torch.int64) % _PRIME
    c = _mix((k * _MULTIPLIERS[2] + salt) % _PRIME)
    h = _mix((index * 48_271 + c) % _PRIME)
    # (key, salt) enters again after a nonlinear round: another key is not a mere shift
    # of the index sequence
    h = _mix((h + c) % _PRIME)
    return _mix(h).to(torch.float64) / _PRIME


def _hash_dropout(x, p, key, salt):
    """Inverted dropout with the mask of :func:`_hash_uniform`: keep w.p. 1 - p, scale 1/(1-p)."""
    keep = _hash_uniform(key, salt, x.shape) >= p
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


def _channels_iv(value, name):
    return check_int_scalar(value, name, minimum=1, maximum=MAX_WIDTH)


def _dropout_iv(value):
    return check_real_scalar(value, "dropout", low=0.0, high=1.0, high_open=True)


def _size_iv(floats, names):
    """Refuse a model of more than MAX_FLOATS floats before building it; ``names`` are the
    arguments that set its size, as the user passed them."""
    if floats > MAX_FLOATS:
        raise ValueError(f"{names}: a model of {floats:,} floats ({floats * 4 / 2**30:.3g} GiB "
                         f"of float32), more than the {MAX_FLOATS:,} accepted")


def _bn_floats(c):
    return 4 * c  # weight, bias, running mean and variance


def _adapter_floats(c):
    return _bn_floats(c) + c * c


def _resnet_floats(in_channels, stem, stem_kernel, plan, n_classes, adapters):
    """Floats (parameters and buffers) of an _AdapterResNet, computed without building it."""
    total = stem * in_channels * stem_kernel**2 + _bn_floats(stem)
    c_in = stem
    for planes, n_blocks, stride in plan:
        for j in range(n_blocks):
            total += planes * c_in * 9 + planes * planes * 9 + 2 * _bn_floats(planes)
            if (stride if j == 0 else 1) != 1 or c_in != planes:
                total += planes * c_in + _bn_floats(planes)
            if adapters:
                total += 2 * _adapter_floats(planes)
            c_in = planes
    return total + n_classes * (c_in + 1) + (1 if adapters else 0)


class AdapterBlock(nn.Module):
    """A residual adapter: ``x + Conv1x1(Dropout_p(BatchNorm2d(x)))``.

    The 1x1 conv (no bias, ``channels -> channels``) starts at N(0, 1e-4^2), so
    the block starts near the identity, and is exactly the identity when the
    conv weight is zero (the adapter of PerAda (Xie et al., CVPR 2024),
    Section 4 and Figure 2). Dropout is deterministic: its mask is a hash of
    (``key``, ``salt``, element index), so the same key gives the same mask,
    and ``torch.func.vmap`` over clients with one key each works.

    Parameters
    ----------
    channels : int
        Number of channels in and out, in [1, 2^20].
    dropout : float, default=0.3
        Dropout probability p in [0, 1) (PerAda's official code uses 0.3);
        kept values are scaled by 1/(1-p). Dropout acts only in train mode.
    salt : int, default=0
        Distinguishes this block's masks from other blocks' under the same
        key; models give each adapter its position.

    Examples
    --------
    >>> import torch
    >>> block = AdapterBlock(4, dropout=0.5).eval()
    >>> x = torch.randn(2, 4, 3, 3)
    >>> bool(torch.allclose(block(x), x, atol=1e-2))
    True
    """

    def __init__(self, channels, dropout=0.3, *, salt=0):
        super().__init__()
        channels = _channels_iv(channels, "channels")
        _size_iv(_adapter_floats(channels), f"channels={channels}")
        self.p = _dropout_iv(dropout)
        self.salt = check_int_scalar(salt, "salt", minimum=0, maximum=_PRIME - 1)
        self.bn = _BatchNorm2d(channels)
        self.conv = _AdapterConv(channels)

    def forward(self, x, key=None):
        """``x + conv(dropout(bn(x)))``; ``key`` (float64 scalar tensor) seeds the dropout mask.

        ``key`` is needed only in train mode with ``dropout > 0``.
        """
        h = self.bn(x)
        if self.training and self.p > 0:
            if key is None:
                raise ValueError("AdapterBlock needs key= (a float64 scalar tensor) in train "
                                 f"mode with dropout > 0 (dropout={self.p})")
            h = _hash_dropout(h, self.p, key, self.salt)
        return x + self.conv(h)

    def extra_repr(self):
        return f"dropout={self.p}, salt={self.salt}"


class _BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, with an optional adapter after each 3x3 conv."""

    def __init__(self, in_planes, planes, stride, *, adapters, dropout, salt):
        super().__init__()
        self.conv1 = _Conv2d(in_planes, planes, 3, stride)
        self.adapter1 = AdapterBlock(planes, dropout, salt=salt) if adapters else None
        self.bn1 = _BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = _Conv2d(planes, planes, 3)
        self.adapter2 = AdapterBlock(planes, dropout, salt=salt + 1) if adapters else None
        self.bn2 = _BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(_Conv2d(in_planes, planes, 1, stride),
                                            _BatchNorm2d(planes))

    def forward(self, x, key=None):
        out = self.conv1(x)
        if self.adapter1 is not None:
            out = self.adapter1(out, key)
        out = self.relu(self.bn1(out))
        out = self.conv2(out)
        if self.adapter2 is not None:
            out = self.adapter2(out, key)
        out = self.bn2(out)
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class _AdapterResNet(nn.Module):
    """What both backbones share: the layers, the dropout key and the forward loop.

    Subclasses build ``conv1``, ``bn1``, ``layer1`` ... and ``fc`` and call
    :meth:`_build_layers`; ``_stem`` maps the input to the first layer's input.
    """

    def _build_layers(self, in_planes, plan, *, adapters, dropout):
        """``plan``: (planes, blocks, first stride) per layer ``layer1``, ``layer2``, ..."""
        self._layer_names = []
        salt = 0
        for i, (planes, n_blocks, stride) in enumerate(plan, start=1):
            blocks = []
            for j in range(n_blocks):
                blocks.append(_BasicBlock(in_planes, planes, stride if j == 0 else 1,
                                          adapters=adapters, dropout=dropout, salt=salt))
                in_planes, salt = planes, salt + 2
            # a container for the names layerI.J; the forward pass below walks it by hand
            self.add_module(f"layer{i}", nn.Sequential(*blocks))
            self._layer_names.append(f"layer{i}")
        self.has_adapters = adapters
        self.dropout = dropout
        if adapters:  # the clients' dropout stream: a float buffer, so it stacks and vmaps
            self.register_buffer("dropout_key", torch.zeros((), dtype=torch.float64))
        return in_planes

    def forward(self, x):
        key = None
        if self.has_adapters and self.training and self.dropout > 0:
            key = self.dropout_key
        x = self._stem(x)
        for name in self._layer_names:
            for block in getattr(self, name):
                x = block(x, key)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        x = self.fc(x)
        if key is not None:  # next step, next mask; under vmap, each client's own key
            # copy_ of an out-of-place remainder: vmap has no batching rule for remainder_
            self.dropout_key.copy_((self.dropout_key + 1) % _PRIME)
        return x


class ResNet18Adapters(_AdapterResNet):
    """ResNet-18 with PerAda's residual adapters, under torchvision's parameter names.

    The ImageNet ResNet-18 (7x7 stride-2 stem conv, max-pool, four layers of
    two BasicBlocks, 64-128-256-512 channels, global average pool, ``fc``).
    With ``adapters=True`` every BasicBlock gets ``adapter1`` after ``conv1``
    and ``adapter2`` after ``conv2`` (:class:`AdapterBlock`), and the model a
    float64 buffer ``dropout_key`` that seeds the adapters' dropout: each
    train-mode forward pass with ``dropout > 0`` uses it, then adds 1 to it in
    place (so under ``functional_call`` with one key per client, each client
    advances its own). A strategy may also overwrite it before a step.

    With 10 classes the backbone has 11,181,642 parameters and the model with
    adapters 12,581,962, of which 1,413,258 form the adapter set
    (:func:`parameter_groups`), the counts of Table 1 of PerAda (Xie et al.,
    CVPR 2024). BatchNorm layers have no ``num_batches_tracked`` buffer.

    Parameters
    ----------
    n_classes : int, default=1000
        Outputs of the head ``fc``.
    in_channels : int, default=3
        Input channels.
    adapters : bool, default=True
        Plant the adapters.
    dropout : float, default=0.3
        The adapters' dropout probability, in [0, 1).

    See Also
    --------
    load_torchvision_weights : load an ImageNet-pretrained torchvision checkpoint.
    SmallResNet : the CPU-sized backbone with the same layout.

    Examples
    --------
    >>> import torch
    >>> model = ResNet18Adapters(n_classes=10).eval()
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    >>> parameter_counts(model)["adapter"]
    1413258
    """

    def __init__(self, n_classes=1000, in_channels=3, *, adapters=True, dropout=0.3):
        super().__init__()
        n_classes = _channels_iv(n_classes, "n_classes")
        in_channels = _channels_iv(in_channels, "in_channels")
        adapters = _bool_iv(adapters, "adapters")
        dropout = _dropout_iv(dropout)
        plan = [(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)]
        _size_iv(_resnet_floats(in_channels, 64, 7, plan, n_classes, adapters),
                 f"n_classes={n_classes} and in_channels={in_channels}")
        self.conv1 = _Conv2d(in_channels, 64, 7, stride=2)
        self.bn1 = _BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        width = self._build_layers(64, plan, adapters=adapters, dropout=dropout)
        self.fc = nn.Linear(width, n_classes)

    def _stem(self, x):
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))


class SmallResNet(_AdapterResNet):
    """A CPU-sized ResNet for 28 x 28 images, laid out and named as ResNet-18.

    Stride-2 3x3 stem conv + ``bn1`` + ReLU, then one BasicBlock per width
    (``layer1.0``, ``layer2.0``, ...; stride 1 for the first, 2 after, a 1x1
    conv + BatchNorm ``downsample`` where the shape changes), global average
    pool and ``fc``. Adapters are planted as in :class:`ResNet18Adapters`, so
    :func:`parameter_groups` applies unchanged. Without adapters, at the
    default widths and 10 classes, it has 77,754 parameters; the adapters add
    11,200 (10,752 conv weights, 448 BatchNorm parameters), and the adapter set
    of :func:`parameter_groups` holds 12,330.

    Parameters
    ----------
    n_classes : int, default=10
    in_channels : int, default=1
    widths : sequence of int, default=(16, 32, 64)
        Channels of the stem and of each block (one block per width).
    adapters : bool, default=True
    dropout : float, default=0.3
        The adapters' dropout probability, in [0, 1).

    Notes
    -----
    Inputs are (B, H, W) (one channel, as stored by MNIST-like datasets) or
    (B, C, H, W); pixels in [0, 1] as :mod:`ebfl.learning.torch.pretrain` trains it.

    Examples
    --------
    >>> import torch
    >>> model = SmallResNet(adapters=False).eval()
    >>> model(torch.zeros(5, 28, 28)).shape
    torch.Size([5, 10])
    >>> sum(p.numel() for p in model.parameters())
    77754
    """

    def __init__(self, n_classes=10, in_channels=1, *, widths=(16, 32, 64), adapters=True,
                 dropout=0.3):
        super().__init__()
        n_classes = _channels_iv(n_classes, "n_classes")
        in_channels = _channels_iv(in_channels, "in_channels")
        widths = _widths_iv(widths)
        adapters = _bool_iv(adapters, "adapters")
        dropout = _dropout_iv(dropout)
        plan = [(w, 1, 1 if i == 0 else 2) for i, w in enumerate(widths)]
        _size_iv(_resnet_floats(in_channels, widths[0], 3, plan, n_classes, adapters),
                 f"widths={widths}, n_classes={n_classes} and in_channels={in_channels}")
        self.widths = widths
        self.conv1 = _Conv2d(in_channels, widths[0], 3, stride=2)
        self.bn1 = _BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        width = self._build_layers(widths[0], plan, adapters=adapters, dropout=dropout)
        self.fc = nn.Linear(width, n_classes)

    def _stem(self, x):
        if x.dim() == 3:  # (B, H, W): add the channel axis
            x = x.unsqueeze(1)
        return self.relu(self.bn1(self.conv1(x)))


def _bool_iv(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _widths_iv(widths):
    if isinstance(widths, numbers.Integral) and not isinstance(widths, bool):
        widths = (widths,)
    if isinstance(widths, str | bytes) or not hasattr(widths, "__iter__"):
        raise TypeError(f"widths must be a sequence of channel counts, got {widths!r}")
    widths = tuple(_channels_iv(w, f"widths[{i}]") for i, w in enumerate(widths))
    if not widths:
        raise ValueError("widths must hold at least one channel count, got an empty sequence")
    return widths


# --------------------------------------------------------------------------- groups


def check_model(model):
    if not isinstance(model, _AdapterResNet):
        raise TypeError("model must be a ResNet18Adapters or a SmallResNet, got "
                        f"{type(model).__name__}")
    return model


def _names_under(module, prefix):
    return [prefix + name for name in module.state_dict()]


def parameter_groups(model):
    """Which state tensors each personalization method trains or keeps personal.

    Parameters
    ----------
    model : ResNet18Adapters or SmallResNet

    Returns
    -------
    dict of str -> list of str
        State names (parameters and float buffers), each list in
        ``model.state_dict()`` order:

        - ``"adapter"``: PerAda's adapter set (Table 1 of PerAda (Xie et al.,
          CVPR 2024)): every ``adapter*`` tensor, the BatchNorm tensors (affine
          parameters and running statistics) of the stem ``bn1`` and of every
          block's ``bn1``/``bn2`` (not the ``downsample`` BatchNorm), the head
          ``fc``, and the ``dropout_key`` (each client's dropout stream
          travels with its adapters);
        - ``"backbone"``: everything else (frozen under adapters);
        - ``"input"``: the stem ``conv1``, ``bn1``;
        - ``"output"``: the head ``fc``;
        - ``"bn"``: every BatchNorm tensor (adapters' included);
        - ``"feature_extractor"``: everything but ``fc``;
        - ``"all"``: every state tensor.

        ``"adapter"`` and ``"backbone"`` partition ``"all"``, and so do
        ``"feature_extractor"`` and ``"output"``.

    Notes
    -----
    A train-mode forward pass updates the running statistics of *every*
    BatchNorm, the ``downsample`` ones of the frozen backbone too. Under
    ``torch.func.vmap`` over clients those buffers must then be stacked (one
    row per client, like the adapter set) or their layers put in eval mode:
    vmap refuses to update an unstacked buffer from batched inputs.

    See Also
    --------
    parameter_counts, ebfl.learning.torch.adapters.split_state

    Examples
    --------
    >>> groups = parameter_groups(SmallResNet(widths=(4,)))
    >>> groups["output"]
    ['fc.weight', 'fc.bias']
    >>> groups["input"][:2]
    ['conv1.weight', 'bn1.weight']
    """
    check_model(model)
    names = list(model.state_dict())
    adapter, bn = set(), set()
    for prefix, module in model.named_modules():
        if isinstance(module, AdapterBlock):
            adapter.update(_names_under(module, prefix + "."))
        elif isinstance(module, _BasicBlock):
            adapter.update(_names_under(module.bn1, prefix + ".bn1."))
            adapter.update(_names_under(module.bn2, prefix + ".bn2."))
        if isinstance(module, nn.BatchNorm2d):
            bn.update(_names_under(module, prefix + "."))
    stem = set(_names_under(model.conv1, "conv1.")) | set(_names_under(model.bn1, "bn1."))
    head = set(_names_under(model.fc, "fc."))
    adapter |= set(_names_under(model.bn1, "bn1.")) | head
    if model.has_adapters:
        adapter.add("dropout_key")

    def ordered(selected):
        return [name for name in names if name in selected]

    return {"adapter": ordered(adapter), "backbone": [n for n in names if n not in adapter],
            "input": ordered(stem), "output": ordered(head), "bn": ordered(bn),
            "feature_extractor": [n for n in names if n not in head], "all": names}


def parameter_counts(model):
    """The number of parameters (buffers not counted) in each of :func:`parameter_groups`.

    Parameters
    ----------
    model : ResNet18Adapters or SmallResNet

    Returns
    -------
    dict of str -> int

    Examples
    --------
    >>> counts = parameter_counts(ResNet18Adapters(n_classes=10))
    >>> counts["adapter"], counts["backbone"], counts["all"]
    (1413258, 11168704, 12581962)
    """
    groups = parameter_groups(model)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    return {group: sum(sizes.get(name, 0) for name in names) for group, names in groups.items()}


def split_state(model, names):
    """The model's state split in two: the tensors named in ``names``, and the rest.

    Parameters
    ----------
    model : torch.nn.Module
    names : iterable of str
        State names (parameters or float buffers), e.g. a list of
        :func:`parameter_groups`.

    Returns
    -------
    selected, rest : dict of str -> Tensor
        Detached clones, in ``model.state_dict()`` order; the model is untouched.

    Raises
    ------
    ValueError
        A name is not in the model's state.

    Examples
    --------
    >>> model = SmallResNet(widths=(4,))
    >>> adapters, frozen = split_state(model, parameter_groups(model)["adapter"])
    >>> "fc.weight" in adapters, "conv1.weight" in frozen
    (True, True)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = check_string_list(names, "names", what="state name")
    state = dict(model.named_parameters())
    state.update((name, b) for name, b in model.named_buffers() if b.is_floating_point())
    order = [name for name in model.state_dict() if name in state]
    wanted = set(names)
    unknown = sorted(wanted - set(order))
    if unknown:
        raise ValueError(f"names must be state names of the model; unknown: {unknown[:10]}")
    selected = {n: state[n].detach().clone() for n in order if n in wanted}
    rest = {n: state[n].detach().clone() for n in order if n not in wanted}
    return selected, rest


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_torchvision_weights` (or ``pretrain.load_backbone``) copied.

    Attributes
    ----------
    loaded : tuple of str
        Model state names that received a tensor.
    skipped : dict of str -> str
        Names in the weights that were not copied, with the reason
        (``num_batches_tracked`` counters; the head ``fc`` when its shape differs,
        in which case the model's head is left as initialised).
    """

    loaded: tuple
    skipped: dict

    @property
    def head_loaded(self) -> bool:
        """Whether the head ``fc`` was copied."""
        return "fc.weight" in self.loaded


def _backbone_names(model):
    """The state names a checkpoint without adapters provides (all but adapters and key)."""
    adapters = {n for n in parameter_groups(model)["adapter"]
                if ".adapter" in n or n == "dropout_key"}
    return [n for n in model.state_dict() if n not in adapters]


def _read_checkpoint(path, name):
    """The object stored in the torch checkpoint at ``path``, loaded on the CPU.

    Loading uses ``torch.load(..., weights_only=True)``, so no code in the file
    runs. A missing, unreadable, empty, truncated, corrupted or foreign file
    fails in many ways inside torch (``UnpicklingError``, ``PytorchStreamReader``
    errors, ``EOFError``, ``IndexError``, ``KeyError``, ...); each becomes one
    ValueError naming ``name`` (the argument or option the path came from).
    """
    shown = os.fspath(path)
    if not os.path.exists(shown):
        raise ValueError(f"{name}: {shown} does not exist")
    if not os.path.isfile(shown):
        raise ValueError(f"{name}: {shown} is not a file")
    try:
        return torch.load(shown, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure of a bad file means the same
        detail = " ".join(str(exc).split())
        detail = f"{type(exc).__name__}: {detail.split('. ')[0][:160]}".rstrip(": ")
        raise ValueError(f"{name}: cannot read {shown} as a torch checkpoint of tensors "
                         f"(truncated, corrupted or not a torch state dict: {detail})") from None


def _weights_iv(weights, name):
    """A state dict (name -> tensor) from a mapping or the path of a ``.pth`` file."""
    if isinstance(weights, str | os.PathLike):
        weights = _read_checkpoint(weights, name)
        # a checkpoint wrapping its state dict: torchvision-style {"state_dict": ...}, or the
        # cache record of ebfl.learning.torch.pretrain {"state": ..., "config": ...}
        for key in ("state_dict", "state"):
            if isinstance(weights, Mapping) and key in weights and not any(
                    isinstance(v, torch.Tensor) for v in weights.values()):
                weights = weights[key]
        if not isinstance(weights, Mapping):
            raise ValueError(f"{name}: the checkpoint holds a {type(weights).__name__}, not a "
                             "state dict (name -> tensor)")
    if not isinstance(weights, Mapping):
        raise TypeError(f"{name} must be a state dict (name -> tensor) or the path of a "
                        f"torch checkpoint holding one, got {type(weights).__name__}")
    bad = [k for k, v in weights.items() if not isinstance(k, str)]
    if bad:
        raise TypeError(f"{name} must map names (strings) to tensors; not strings: {bad[:10]}")
    bad = [k for k, v in weights.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"{name} must map names to tensors; not tensors: {bad[:10]}")
    return weights


def _copy_backbone(model, weights, name):
    """Copy a checkpoint without adapters into ``model``'s backbone; returns a LoadReport.

    Every backbone tensor must be present with its shape, except the head ``fc``,
    which is skipped (left as initialised) when its shape differs.
    """
    weights = _weights_iv(weights, name)
    state = model.state_dict()
    expected = _backbone_names(model)
    counters = {k for k in weights if k.endswith("num_batches_tracked")
                and k[:-len("num_batches_tracked")] + "running_mean" in state}
    unknown = sorted(set(weights) - set(expected) - counters)
    missing = [k for k in expected if k not in weights]
    if unknown or missing:
        hint = (" (the state dict of another architecture?)"
                if len(unknown) + len(missing) > 2 else "")
        label = "ResNet-18" if isinstance(model, ResNet18Adapters) else type(model).__name__
        raise ValueError(f"{name} must hold exactly the tensors of a {label} backbone{hint}; "
                         + (f"{len(unknown)} unknown keys: {unknown[:10]}" if unknown else "")
                         + ("; " if unknown and missing else "")
                         + (f"{len(missing)} missing keys: {missing[:10]}" if missing else ""))
    skipped = {k: "integer counter, not kept by ebfl's BatchNorm" for k in sorted(counters)}
    head = [k for k in expected if k.startswith("fc.")]
    if any(weights[k].shape != state[k].shape for k in head):
        skipped.update({k: f"head shape {tuple(weights[k].shape)} differs from the model's "
                           f"{tuple(state[k].shape)}; left as initialised" for k in head})
    to_copy = [k for k in expected if k not in skipped]
    for k in to_copy:
        if weights[k].shape != state[k].shape:
            raise ValueError(f"{name}[{k!r}] has shape {tuple(weights[k].shape)}, the model "
                             f"expects {tuple(state[k].shape)}")
        if not weights[k].is_floating_point():
            raise ValueError(f"{name}[{k!r}] must be a floating-point tensor, got dtype "
                             f"{weights[k].dtype}")
        bad = int(weights[k].numel() - torch.isfinite(weights[k]).sum())
        if bad:
            raise ValueError(f"{name}[{k!r}] must be finite; it has {bad} NaN or infinite "
                             "value(s)")
    with torch.no_grad():
        for k in to_copy:
            state[k].copy_(weights[k])  # state_dict tensors share storage with the model
    return LoadReport(loaded=tuple(to_copy), skipped=skipped)


def load_torchvision_weights(model, weights, *, name="weights"):
    """Copy a torchvision ResNet-18 checkpoint into a :class:`ResNet18Adapters`, in place.

    Every backbone tensor (conv, BatchNorm affine and running statistics,
    downsample, head) is copied by name; the adapters and ``dropout_key`` keep
    their values. This is how PerAda (Xie et al., CVPR 2024) starts every
    method: from an ImageNet-pretrained ResNet-18.

    Parameters
    ----------
    model : ResNet18Adapters
        **Modified in place** (that is the point of the function).
    weights : dict of str -> Tensor, or path-like
        A state dict with torchvision's names, or the path of a ``.pth`` file
        holding one (loaded with ``torch.load(..., weights_only=True)``, so no
        code in the file runs). It is not modified. ``num_batches_tracked``
        entries are skipped; the head ``fc.*`` is skipped, and the model's
        head left as initialised, when its shape differs (e.g. ImageNet's
        1000 classes into a 10-class model).
    name : str, default="weights"
        How error messages call ``weights`` (e.g. a command-line option).

    Returns
    -------
    LoadReport
        ``loaded`` (names copied) and ``skipped`` (names with the reason).

    Raises
    ------
    ValueError
        A key the model does not have, a backbone tensor missing, a shape that
        differs (other than the head's) or a non-finite tensor; the message
        names the keys, and nothing is copied. A file that is missing or cannot
        be read as a torch checkpoint of tensors (truncated, corrupted, foreign).
    TypeError
        ``model`` is not a ResNet18Adapters, or ``weights`` is not a state dict.

    Examples
    --------
    >>> source = ResNet18Adapters(n_classes=1000, adapters=False)
    >>> model = ResNet18Adapters(n_classes=10)
    >>> report = load_torchvision_weights(model, source.state_dict())
    >>> report.head_loaded, len(report.loaded)
    (False, 100)
    >>> bool(torch.equal(model.layer1[0].conv1.weight, source.layer1[0].conv1.weight))
    True
    """
    if not isinstance(model, ResNet18Adapters):
        raise TypeError(f"model must be a ResNet18Adapters, got {type(model).__name__}")
    return _copy_backbone(model, weights, name)
