"""Client datasets stacked along a leading client axis, for vectorized training."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch

from ebfl._validation import (
    INT64_MAX,
    check_bool,
    check_counts,
    check_int_scalar,
    real_dtype_array,
)
from ebfl.learning.torch.functional import check_device

__all__ = ["ClientSubset", "FederatedDataset", "tff_emnist_federation"]


#: Largest |feature| accepted: the tensors are float32, which overflows beyond 3.4e38.
MAX_FEATURE = float(np.finfo(np.float32).max)


def _client_list(items, name):
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(f"{name} must be a list with one array per client, got "
                        f"{type(items).__name__}")
    return list(items)


def _features_iv(x, name):
    """One client's features, checked without a float64 copy (MNIST is 440 MB as float64)."""
    arr = real_dtype_array(x, name)
    if arr.dtype.kind == "O":  # the kernels need a numeric dtype
        raise TypeError(f"{name} must be an array of real numbers, got dtype object")
    if arr.ndim == 0:
        raise ValueError(f"{name} must have one row per sample, got a scalar")
    if arr.size and arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; it has NaN or infinite values")
    if arr.size and float(np.max(np.abs(arr))) > MAX_FEATURE:  # float16 cannot hold 3.4e38
        raise ValueError(f"{name} must lie in [-{MAX_FEATURE:g}, {MAX_FEATURE:g}] (float32)")
    return arr


def _labels_iv(y, name):
    try:
        return check_counts(y, name, minimum=0)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name} must hold class labels, non-negative integers: {exc}") from None


def _stack(xs, ys, part):
    """Pad one part's clients (``part`` is "train" or "test") into stacked tensors."""
    xname, yname = f"x_{part}", f"y_{part}"
    xs, ys = _client_list(xs, xname), _client_list(ys, yname)
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"{xname} and {yname} must be non-empty lists of the same length, got "
                         f"{len(xs)} and {len(ys)}")
    xs = [_features_iv(x, f"{xname}[{i}]") for i, x in enumerate(xs)]
    ys = [_labels_iv(y, f"{yname}[{i}]") for i, y in enumerate(ys)]
    shape = xs[0].shape[1:]
    counts = np.array([y.size for y in ys])
    if np.any(counts == 0):
        raise ValueError(f"{part}: every client needs at least one sample; empty clients: "
                         f"{np.flatnonzero(counts == 0)[:10].tolist()}")
    X = np.zeros((len(xs), counts.max(), *shape), np.float32)
    Y = np.zeros((len(xs), counts.max()), np.int64)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if x.shape != (y.size, *shape):
            raise ValueError(f"{xname}[{i}] has shape {x.shape}, expected "
                             f"({y.size}, {', '.join(map(str, shape))}) (one row per label "
                             f"of {yname}[{i}], features shaped as {xname}[0]'s)")
        X[i, : y.size] = x
        Y[i, : y.size] = y
    return torch.from_numpy(X), torch.from_numpy(Y), torch.from_numpy(counts)


@dataclass(frozen=True)
class FederatedDataset:
    """Train and test data of m clients, padded to the largest client.

    Attributes
    ----------
    x_train : Tensor of shape (m, n_max) + feature_shape, float32
    y_train : Tensor (m, n_max), int64
    n_train : Tensor (m,)
        Real samples per client; rows past ``n_train[i]`` are padding.
    x_test, y_test, n_test
        The same for the test sets.
    n_classes : int
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    n_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_test: torch.Tensor
    n_classes: int

    @classmethod
    def from_clients(cls, x_train, y_train, x_test, y_test, *, n_classes=None):
        """Build from per-client lists of numpy arrays (features (n_i, ...), labels (n_i,)).

        Features must be finite with ``|value| <= 3.4e38`` (they are stored as
        float32); labels are integers in 0..n_classes-1.
        """
        xtr, ytr, ntr = _stack(x_train, y_train, "train")
        xte, yte, nte = _stack(x_test, y_test, "test")
        if xtr.shape[0] != xte.shape[0] or xtr.shape[2:] != xte.shape[2:]:
            raise ValueError(f"x_train and x_test disagree on clients or feature shape: "
                             f"{tuple(xtr.shape)} vs {tuple(xte.shape)}")
        top = int(max(ytr.max(), yte.max())) + 1
        if n_classes is None:
            n_classes = top
        else:
            try:
                n_classes = check_int_scalar(n_classes, "n_classes", minimum=top,
                                             maximum=INT64_MAX)
            except ValueError:
                raise ValueError(f"n_classes must be > the largest label {top - 1}, got "
                                 f"{n_classes}") from None
        return cls(xtr, ytr, ntr, xte, yte, nte, n_classes)

    @property
    def n_clients(self) -> int:
        return self.x_train.shape[0]

    @property
    def device(self):
        """The device the tensors live on."""
        return self.x_train.device

    def to(self, device):
        """This dataset with every tensor on ``device`` (a new dataset; this one is unchanged).

        Tensors already on ``device`` are shared, not copied (a dataset's
        tensors are never written to).

        Parameters
        ----------
        device : str or torch.device
            "cpu", "cuda" or "cuda:N" (see
            :func:`~ebfl.learning.torch.functional.check_device`).

        Returns
        -------
        FederatedDataset

        Examples
        --------
        >>> import numpy as np
        >>> x = [np.eye(3, dtype=np.float32)] * 2
        >>> y = [np.array([0, 1, 1])] * 2
        >>> data = FederatedDataset.from_clients(x, y, x, y)
        >>> moved = data.to("cpu")
        >>> moved is data, moved.device, bool(torch.equal(moved.x_train, data.x_train))
        (False, device(type='cpu'), True)
        """
        device = check_device(device)
        return replace(self, x_train=self.x_train.to(device), y_train=self.y_train.to(device),
                       n_train=self.n_train.to(device), x_test=self.x_test.to(device),
                       y_test=self.y_test.to(device), n_test=self.n_test.to(device))

    def subset(self, clients):
        """The clients ``clients`` (ids, in that order) as a :class:`ClientSubset` (no copy)."""
        return ClientSubset(self, torch.as_tensor(np.asarray(clients, dtype=np.int64)))

    def sample_batch(self, clients, batch_size, generator):
        """A minibatch of ``batch_size`` samples per client, drawn uniformly with replacement.

        Returns ``(x, y)`` of shapes (K, B, ...) and (K, B). With replacement keeps
        one batch shape for clients of different sizes.
        """
        u = torch.rand((clients.numel(), batch_size), generator=generator)  # on the CPU
        idx = (u.to(self.n_train.device) * self.n_train[clients, None]).long()
        rows = clients[:, None]
        return self.x_train[rows, idx], self.y_train[rows, idx]


class ClientSubset:
    """Some clients of a :class:`FederatedDataset`, what a client half of a round sees.

    Row j is client ``clients[j]`` of the parent dataset; arrays are gathered
    lazily (a round touches only its minibatches, not the clients' whole data).
    On Flower a client's data is the subset of its one id.
    """

    def __init__(self, parent, clients):
        self.parent = parent
        self.clients = clients
        self.n_classes = parent.n_classes

    @property
    def n_clients(self):
        return int(self.clients.numel())

    @property
    def n_train(self):
        return self.parent.n_train[self.clients]

    @property
    def n_test(self):
        return self.parent.n_test[self.clients]

    @property
    def x_train(self):
        return self.parent.x_train[self.clients]

    @property
    def y_train(self):
        return self.parent.y_train[self.clients]

    @property
    def x_test(self):
        return self.parent.x_test[self.clients]

    @property
    def y_test(self):
        return self.parent.y_test[self.clients]

    def subset(self, rows):
        """Rows ``rows`` of this subset (positions, not client ids)."""
        rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        return ClientSubset(self.parent, self.clients[rows])

    def sample_batch(self, generators, batch_size):
        """``batch_size`` samples per client, uniformly with replacement.

        Client j's indices come from ``generators[j]`` (its own stream), so a
        client draws the same batch whether it runs alone or with others.
        The uniforms are drawn on the CPU (the generators' device) and moved to
        the data's, so the batches are the same on every device.
        Returns ``(x, y)`` of shapes (K, B, ...) and (K, B).
        """
        u = torch.stack([torch.rand(batch_size, generator=g) for g in generators])
        n = self.n_train
        idx = (u.to(n.device) * n[:, None]).long()
        rows = self.clients[:, None]
        return self.parent.x_train[rows, idx], self.parent.y_train[rows, idx]


def tff_emnist_federation(train, test, *, flatten=True):
    """One client per writer: TFF's train and test samples of the writers present in both.

    Writers with no test sample (or no training sample) are dropped; with TFF's
    files none is, since TFF split every writer across both (but
    ``max_clients`` may cut the two files at different writers).
    :func:`~ebfl.datasets.tff_emnist_writers` lists the clients (sorted writer ids, the
    order of the clients here) and the dropped writers.

    Parameters
    ----------
    train, test : TffEmnist
        The two splits of one dataset (:func:`~ebfl.datasets.load_tff_emnist`).
    flatten : bool, default=True
        Features of shape (784,); False keeps (28, 28) images (for a CNN).

    Returns
    -------
    FederatedDataset
        float32 pixels with ink = 1, ``n_classes`` 10 or 62.

    Raises
    ------
    TypeError
        ``train`` or ``test`` is not a :class:`~ebfl.datasets.TffEmnist`.
    ValueError
        The splits come from different datasets (digits only or not), or no
        writer is in both.

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.datasets import TffEmnist
    >>> def split(name, writers, n):
    ...     w = np.repeat(np.arange(len(writers)), n)
    ...     return TffEmnist(np.zeros((w.size, 28, 28), np.float32), w % 10, w,
    ...                      np.array(writers), True, name, "-")
    >>> data = tff_emnist_federation(split("train", ["a", "b"], 3), split("test", ["b"], 2))
    >>> data.n_clients, data.n_train.tolist(), data.n_test.tolist(), tuple(data.x_train.shape)
    (1, [3], [2], (1, 3, 784))
    """
    from ebfl.datasets.tff_emnist import tff_emnist_writers

    common, _, _ = tff_emnist_writers(train, test)
    flatten = check_bool(flatten, "flatten")
    if train.only_digits != test.only_digits:
        raise ValueError("train and test must both be digits only or both have 62 labels, got "
                         f"only_digits={train.only_digits} and {test.only_digits}")
    if not common:
        raise ValueError(f"no writer is in both train ({train.path}) and test ({test.path})")

    def per_writer(data):
        pos = {w: i for i, w in enumerate(data.writers.tolist())}
        order = np.argsort(data.writer, kind="stable")  # samples grouped by writer
        starts = np.concatenate([[0], np.cumsum(np.bincount(data.writer,
                                                            minlength=data.n_writers))])
        xs, ys = [], []
        for w in common:
            idx = order[starts[pos[w]]: starts[pos[w] + 1]]
            xs.append(data.x[idx].reshape(idx.size, -1) if flatten else data.x[idx])
            ys.append(data.y[idx])
        return xs, ys

    (xtr, ytr), (xte, yte) = per_writer(train), per_writer(test)
    return FederatedDataset.from_clients(xtr, ytr, xte, yte, n_classes=train.n_classes)
