"""A pretrained CPU-sized backbone for PerAda-style adapter experiments.

PerAda (Xie et al., CVPR 2024) starts every method from an ImageNet-pretrained
ResNet-18 and personalizes small adapters on top (Section 7 of PerAda). At
CPU scale the same situation is a :class:`~ebfl.learning.torch.adapters.SmallResNet`
pretrained on a *source* dataset (Fashion-MNIST by default) and adapted to a
*target* one (e.g. MNIST): :func:`pretrained_backbone` trains it once, caches
the weights on disk, and :func:`load_backbone` plants them under fresh adapters.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ebfl._paths import user_cache
from ebfl._validation import (
    check_bool,
    check_choice,
    check_counts,
    check_int_scalar,
    check_positive_scalar,
    real_dtype_array,
)
from ebfl.learning.torch.adapters import (
    MAX_WIDTH,
    SmallResNet,
    _copy_backbone,
    _resnet_floats,
    _size_iv,
    _widths_iv,
)
from ebfl.learning.torch.functional import eval_mode

__all__ = ["PretrainedBackbone", "load_backbone", "pretrained_backbone"]

#: Source datasets :func:`pretrained_backbone` can load by name.
DATASETS = ("fashion-mnist", "mnist")

#: Version of the cache file's layout (part of the cache key).
CACHE_FORMAT = 1

#: Adam's default learning rate. On Fashion-MNIST (2 epochs, batch 128) Adam at 1e-3,
#: 2e-3, 3e-3 and SGD with Nesterov momentum at 0.05-0.2 all reached 87-89 % test
#: accuracy; Adam at 1e-3 is the usual default.
DEFAULT_LR = 1e-3


@dataclass(frozen=True)
class PretrainedBackbone:
    """A backbone trained by :func:`pretrained_backbone`.

    Attributes
    ----------
    state : dict of str -> Tensor
        The ``SmallResNet(adapters=False)`` state: parameters and BatchNorm
        running statistics (float tensors only), head ``fc`` included.
    test_accuracy : float
        Accuracy on the source dataset's test set, in [0, 1].
    config : dict
        Everything that determined the weights (the cache key): dataset (or a
        digest of the arrays passed as ``data``), architecture, widths, epochs,
        subset size, seed, batch size, optimizer, learning rate, torch version.
    path : pathlib.Path
        The cache file.
    seconds : float
        Wall time of the training (as recorded when the file was written).
    cached : bool
        Whether this call loaded the file instead of training.
    """

    state: dict
    test_accuracy: float
    config: dict
    path: Path
    seconds: float
    cached: bool


def pretrained_backbone(*, dataset="fashion-mnist", arch="small", widths=(16, 32, 64), epochs=2,
                        n_train=None, seed=0, batch_size=128, lr=DEFAULT_LR, cache_dir=None,
                        progress=False, data=None):
    """Train (or load from the cache) a :class:`SmallResNet` backbone on a source dataset.

    The model, ``SmallResNet(adapters=False)`` with one block per width,
    is trained by Adam on cross-entropy, single model, plain torch, and its
    accuracy measured on the source test set. Everything is seeded (the
    initialization from a forked RNG, the subset and the shuffles from
    ``torch.Generator`` s): the same configuration gives the same weights for
    the same number of torch threads. The result is cached in
    ``perada-backbone-<16 hex digits>.pt``, the digits those of the sha256 of
    the configuration (with the torch version); a later call with the same
    configuration loads the file instead of training, and a corrupted file is
    rebuilt, with a warning.

    Parameters
    ----------
    dataset : {"fashion-mnist", "mnist"}, default="fashion-mnist"
        Source dataset, read by :func:`ebfl.datasets.idx.load_fashion_mnist` or
        :func:`ebfl.datasets.idx.load_mnist` (downloaded and verified on first
        use). Ignored when ``data`` is given.
    arch : {"small"}, default="small"
        Backbone architecture: :class:`~ebfl.learning.torch.adapters.SmallResNet`.
    widths : sequence of int, default=(16, 32, 64)
        Its widths.
    epochs : int, default=2
        Passes over the training set, >= 1.
    n_train : int, optional
        Train on a seeded random subset of this many images (quick runs);
        default all. At most the training set's size.
    seed : int, default=0
        Seed of the initialization, the subset and the shuffles, >= 0.
    batch_size : int, default=128
    lr : float, default=1e-3
        Adam's learning rate, > 0.
    cache_dir : path-like, optional
        Folder of the cache files (created if missing). Default:
        ``<data home>/pretrained`` (see :func:`ebfl.datasets.data_home`), or
        ``pooch.os_cache("ebfl")/pretrained`` when the data home is not writable.
    progress : bool, default=False
        Show a progress bar while training.
    data : tuple of 4 arrays, optional
        ``(x, y, x_test, y_test)`` instead of a named dataset: images (n, H, W)
        or (n, C, H, W), finite, pixels in [0, 1] (uint8 images are divided by
        255, as for the named datasets), and integer labels in [0, 2^20); the
        model has ``1 + max label`` classes. Their digest enters the cache key.

    Returns
    -------
    PretrainedBackbone

    Raises
    ------
    ValueError, TypeError
        An argument out of range (the message names it), a model too large
        for memory, or a training run that diverged (NaN weights; lower ``lr``).
    PermissionError
        ``cache_dir`` cannot be written.

    See Also
    --------
    load_backbone : plant the backbone under adapters.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.random((64, 28, 28), dtype=np.float32), rng.integers(0, 2, 64)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     first = pretrained_backbone(data=(x, y, x, y), widths=(4,), epochs=1,
    ...                                 batch_size=32, cache_dir=folder)
    ...     again = pretrained_backbone(data=(x, y, x, y), widths=(4,), epochs=1,
    ...                                 batch_size=32, cache_dir=folder)
    >>> first.cached, again.cached, first.path.name == again.path.name
    (False, True, True)
    """
    dataset = check_choice(dataset, "dataset", set(DATASETS))
    check_choice(arch, "arch", {"small"})
    config = {
        "format": CACHE_FORMAT,
        "arch": arch,
        "widths": list(_widths_iv(widths)),
        "epochs": check_int_scalar(epochs, "epochs", minimum=1, maximum=10**6),
        "n_train": None if n_train is None else check_int_scalar(n_train, "n_train", minimum=1),
        "seed": check_int_scalar(seed, "seed", minimum=0, maximum=2**63 - 1),
        "batch_size": check_int_scalar(batch_size, "batch_size", minimum=1, maximum=2**31 - 1),
        "optimizer": "adam",
        "lr": check_positive_scalar(lr, "lr"),
        "torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    }
    progress = check_bool(progress, "progress")
    arrays = None if data is None else _data_iv(data)
    config.update(_source_config(dataset, arrays))
    if config["n_train"] is not None and config["n_train"] > config["n_available"]:
        raise ValueError(f"n_train must be in [1, {config['n_available']}] (the training set's "
                         f"size), got {config['n_train']}")
    widths = tuple(config["widths"])  # the model's size, before any data is read
    _size_iv(_resnet_floats(config["in_channels"], widths[0], 3,
                            [(w, 1, 1 if i == 0 else 2) for i, w in enumerate(widths)],
                            config["n_classes"], False),
             f"widths={widths} (with {config['in_channels']} input channels and "
             f"{config['n_classes']} classes)")
    path = _cache_dir_iv(cache_dir) / f"perada-backbone-{_cache_key(config)}.pt"
    cached = _read_cache(path, config)
    if cached is not None:
        return PretrainedBackbone(cached["state"], cached["test_accuracy"], config, path,
                                  cached["seconds"], cached=True)
    if arrays is None:  # read the named dataset only when there is something to train
        arrays = _load_source(dataset)
    state, accuracy, seconds = _train_backbone(config, arrays, progress)
    bad = [name for name, t in state.items() if not bool(torch.isfinite(t).all())]
    if bad:  # nothing is cached: a diverged backbone must not be reused
        raise ValueError(f"pretraining diverged: the trained backbone has NaN or infinite "
                         f"values in {bad[:3]}; lower lr (lr={config['lr']:g})")
    _write_cache(path, {"config": config, "state": state, "test_accuracy": accuracy,
                        "seconds": seconds})
    return PretrainedBackbone(state, accuracy, config, path, seconds, cached=False)


def load_backbone(model, state):
    """Copy a pretrained backbone into a :class:`SmallResNet` (with adapters), in place.

    Every backbone tensor of ``state`` (e.g. ``PretrainedBackbone.state``)
    is copied by name; the adapters and ``dropout_key`` keep their values, and
    the head ``fc`` is copied only when its shape matches (otherwise it is left
    as initialised, and the report says so).

    Parameters
    ----------
    model : SmallResNet
        **Modified in place**; its widths must match the backbone's.
    state : dict of str -> Tensor, or path-like
        A state dict of ``SmallResNet(adapters=False)`` (not modified), or the
        path of a file holding one (loaded with ``torch.load(...,
        weights_only=True)``), such as the cache file of
        :func:`pretrained_backbone` (``PretrainedBackbone.path``).

    Returns
    -------
    LoadReport
        ``loaded`` (names copied) and ``skipped`` (names with the reason).

    Raises
    ------
    ValueError
        Unknown or missing keys, a shape that differs (other than the head's)
        or a non-finite tensor; the message names them, and nothing is copied.
        A file that is missing or cannot be read as a torch checkpoint of
        tensors (truncated, corrupted, foreign).

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> source = SmallResNet(n_classes=10, widths=(4, 8), adapters=False)
    >>> target = SmallResNet(n_classes=3, widths=(4, 8))
    >>> report = load_backbone(target, source.state_dict())
    >>> report.head_loaded, sorted(report.skipped)
    (False, ['fc.bias', 'fc.weight'])
    """
    if not isinstance(model, SmallResNet):
        raise TypeError(f"model must be a SmallResNet, got {type(model).__name__}")
    return _copy_backbone(model, state, "state")


# --------------------------------------------------------------------------- validation


def _cache_dir_iv(cache_dir):
    """The cache folder, created; the default falls back to the user cache if unwritable."""
    if cache_dir is None:
        from ebfl.datasets import data_home

        for folder in (data_home() / "pretrained", user_cache() / "pretrained"):
            if _writable(folder):
                return folder
        raise PermissionError(f"cannot write the backbone cache in {folder}; pass cache_dir=")
    if not isinstance(cache_dir, str | os.PathLike):
        raise TypeError(f"cache_dir must be a path, got {type(cache_dir).__name__}")
    folder = Path(cache_dir).expanduser()
    if not _writable(folder):
        raise PermissionError(f"cache_dir must be a writable folder, got {folder}")
    return folder


def _writable(folder):
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _images_iv(x, name):
    arr = real_dtype_array(x, name)
    if arr.ndim not in (3, 4) or 0 in arr.shape[1:]:
        raise ValueError(f"{name} must be images shaped (n, H, W) or (n, C, H, W) with H, W "
                         f"(and C) >= 1, got shape {arr.shape}")
    if arr.ndim == 4 and arr.shape[1] > MAX_WIDTH:
        raise ValueError(f"{name} must have at most {MAX_WIDTH} channels, got {arr.shape[1]}")
    if arr.dtype == np.uint8:
        return torch.from_numpy(arr.astype(np.float32) / np.float32(255.0))
    arr = arr.astype(np.float32)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (float32); it has NaN or infinite values")
    return torch.from_numpy(arr)


def _data_iv(data):
    if not isinstance(data, tuple | list) or len(data) != 4:
        got = (f"{len(data)} items" if isinstance(data, tuple | list)
               else type(data).__name__)
        raise TypeError(f"data must be a tuple (x, y, x_test, y_test), got {got}")
    x, x_test = _images_iv(data[0], "data[0] (x)"), _images_iv(data[2], "data[2] (x_test)")
    y = torch.from_numpy(check_counts(data[1], "data[1] (y)"))
    y_test = torch.from_numpy(check_counts(data[3], "data[3] (y_test)"))
    for name, labels in (("data[1] (y)", y), ("data[3] (y_test)", y_test)):
        if labels.numel() and int(labels.max()) >= MAX_WIDTH:  # 1 + max label classes
            raise ValueError(f"{name} must hold class labels in [0, {MAX_WIDTH - 1}], got "
                             f"{int(labels.max())}")
    for name, images, labels in (("x", x, y), ("x_test", x_test, y_test)):
        if images.shape[0] != labels.shape[0] or not labels.numel():
            raise ValueError(f"data: {name} must have one image per label and at least one; "
                             f"got {images.shape[0]} images, {labels.shape[0]} labels")
    if x.shape[1:] != x_test.shape[1:]:
        raise ValueError(f"data: x_test images must be shaped as x's {tuple(x.shape[1:])}, got "
                         f"{tuple(x_test.shape[1:])}")
    return x, y, x_test, y_test


def _load_source(dataset):
    from ebfl.datasets.idx import load_fashion_mnist, load_mnist

    load = load_fashion_mnist if dataset == "fashion-mnist" else load_mnist
    train, test = load("train"), load("test")
    return (_images_iv(train.images, "images"), torch.from_numpy(train.labels.astype(np.int64)),
            _images_iv(test.images, "images"), torch.from_numpy(test.labels.astype(np.int64)))


def _source_config(dataset, arrays):
    """What the data contribute to the configuration (without reading a named dataset)."""
    if arrays is None:  # both named datasets: 60,000 training images, 28 x 28, 10 classes
        return {"dataset": dataset, "data_sha256": None, "n_available": 60_000,
                "in_channels": 1, "n_classes": 10}
    x, y, _, y_test = arrays
    return {"dataset": None, "data_sha256": _digest(arrays), "n_available": len(y),
            "in_channels": 1 if x.dim() == 3 else int(x.shape[1]),
            "n_classes": int(max(y.max(), y_test.max())) + 1}


def _digest(arrays):
    """sha256 of the arrays' shapes and bytes: custom data enter the cache key."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(repr((str(a.dtype), tuple(a.shape))).encode())
        h.update(a.contiguous().numpy().tobytes())
    return h.hexdigest()


def _cache_key(config):
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- cache


def _read_cache(path, config):
    """The cached record for ``config``, or None (missing; corrupted: warn, rebuild)."""
    if not path.is_file():
        return None
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
        _check_record(record, config)
    except Exception as exc:  # a truncated or foreign file fails in many ways; all mean rebuild
        warnings.warn(f"the cached backbone {path} is unreadable or corrupted ({exc}); "
                      "training it again", RuntimeWarning, stacklevel=3)
        return None
    return record


def _check_record(record, config):
    if not isinstance(record, dict) or record.get("config") != config:
        raise ValueError("its configuration does not match")
    expected = _state(_backbone_model(config))
    state = record.get("state")
    if not isinstance(state, dict) or list(state) != list(expected):
        raise ValueError("its state names do not match the architecture")
    for name, tensor in state.items():
        if (not isinstance(tensor, torch.Tensor) or tensor.shape != expected[name].shape
                or tensor.dtype != expected[name].dtype or not torch.isfinite(tensor).all()):
            raise ValueError(f"its tensor {name!r} is malformed")
    if not isinstance(record.get("test_accuracy"), float) or not isinstance(
            record.get("seconds"), float):
        raise ValueError("its accuracy or time is missing")


def _write_cache(path, record):
    """Write atomically: a temporary file in the same folder, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(record, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- training


def _backbone_model(config):
    return SmallResNet(config["n_classes"], config["in_channels"],
                       widths=tuple(config["widths"]), adapters=False)


def _state(model):
    """Detached clones of the state dict, in its order (float tensors only in ebfl's models)."""
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _train_backbone(config, arrays, progress):
    """Train the backbone of ``config`` on ``arrays``; (state, test accuracy, seconds)."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    x, y, x_test, y_test = arrays
    generator = torch.Generator().manual_seed(config["seed"])
    if config["n_train"] is not None:
        subset = torch.randperm(len(y), generator=generator)[: config["n_train"]]
        x, y = x[subset], y[subset]
    with torch.random.fork_rng(devices=[]):  # the caller's global RNG stays untouched
        torch.manual_seed(config["seed"])
        model = _backbone_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    n, batch = len(y), config["batch_size"]
    steps_per_epoch = -(-n // batch)
    model.train()
    with tqdm(total=config["epochs"] * steps_per_epoch, disable=not progress,
              desc="pretraining backbone") as bar:
        for _ in range(config["epochs"]):
            order = torch.randperm(n, generator=generator)
            for i in range(steps_per_epoch):
                idx = order[i * batch:(i + 1) * batch]
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                bar.update()
    accuracy = _accuracy(model, x_test, y_test)
    return _state(model), accuracy, time.perf_counter() - start


def _accuracy(model, x, y, batch=1000):
    correct = 0
    with eval_mode(model), torch.no_grad():
        for i in range(0, len(y), batch):
            correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return correct / len(y)
