"""Client datasets stacked along a leading client axis, for vectorized training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["FederatedDataset"]


def _stack(xs, ys, name):
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"{name}: x and y must be non-empty lists of the same length")
    shape = np.asarray(xs[0]).shape[1:]
    counts = np.array([len(y) for y in ys])
    if np.any(counts == 0):
        raise ValueError(f"{name}: every client needs at least one sample; empty clients: "
                         f"{np.flatnonzero(counts == 0)[:10].tolist()}")
    X = np.zeros((len(xs), counts.max(), *shape), np.float32)
    Y = np.zeros((len(xs), counts.max()), np.int64)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != (len(y), *shape):
            raise ValueError(f"{name}: client {i} has x of shape {x.shape}, expected "
                             f"({len(y)}, {', '.join(map(str, shape))})")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name}: client {i} has NaN or inf features")
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0):
            raise ValueError(f"{name}: labels must be non-negative integers (client {i})")
        X[i, : len(y)] = x
        Y[i, : len(y)] = y
    return torch.from_numpy(X), torch.from_numpy(Y), torch.from_numpy(counts)


@dataclass(frozen=True)
class FederatedDataset:
    """Train and test data of m clients, padded to the largest client.

    Attributes
    ----------
    x_train : Tensor (m, n_max, *feature_shape), float32
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
        """Build from per-client lists of numpy arrays (features (n_i, ...), labels (n_i,))."""
        xtr, ytr, ntr = _stack(list(x_train), list(y_train), "train")
        xte, yte, nte = _stack(list(x_test), list(y_test), "test")
        if xtr.shape[0] != xte.shape[0] or xtr.shape[2:] != xte.shape[2:]:
            raise ValueError(f"train and test disagree on clients or feature shape: "
                             f"{tuple(xtr.shape)} vs {tuple(xte.shape)}")
        top = int(max(ytr.max(), yte.max())) + 1
        if n_classes is None:
            n_classes = top
        elif n_classes < top:
            raise ValueError(f"n_classes must be > the largest label {top - 1}, got {n_classes}")
        return cls(xtr, ytr, ntr, xte, yte, nte, int(n_classes))

    @property
    def n_clients(self) -> int:
        return self.x_train.shape[0]

    def sample_batch(self, clients, batch_size, generator):
        """A minibatch of ``batch_size`` samples per client, drawn uniformly with replacement.

        Returns ``(x, y)`` of shapes (K, B, ...) and (K, B). With replacement keeps
        one batch shape for clients of different sizes.
        """
        u = torch.rand((clients.numel(), batch_size), generator=generator)
        idx = (u * self.n_train[clients, None]).long()
        rows = clients[:, None]
        return self.x_train[rows, idx], self.y_train[rows, idx]
