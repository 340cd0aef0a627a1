"""The client models: the paper's 5-layer CNN, an MLP and multinomial logistic regression."""

from __future__ import annotations

import numbers

from torch import nn

from ebfl._validation import check_int_scalar

__all__ = ["CNN5", "MLP", "LogisticModel"]


#: Largest layer width accepted (a weight matrix of MAX_WIDTH^2 floats is 4 TB).
MAX_WIDTH = 2**20


def _size_iv(value, name):
    return check_int_scalar(value, name, minimum=1, maximum=MAX_WIDTH)


def _hidden_iv(hidden):
    """Hidden widths: a sequence of ints (a bare int is one layer)."""
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if isinstance(hidden, str | bytes) or not hasattr(hidden, "__iter__"):
        raise TypeError(f"hidden must be a sequence of layer widths, got {hidden!r}")
    return [_size_iv(h, f"hidden[{i}]") for i, h in enumerate(hidden)]


class CNN5(nn.Module):
    """The paper's "5-layer CNN" (Section 4.1), LeNet-5 style, for 1 x 28 x 28 inputs.

    conv 5x5 (6) -> ReLU -> 2x2 max-pool -> conv 5x5 (16) -> ReLU -> 2x2 max-pool
    -> FC 256x120 -> ReLU -> FC 120x84 -> ReLU -> FC 84 x ``n_classes``. The paper
    does not state activations or pooling; 256 = 16 * 4 * 4 fixes the 28 x 28
    input and 2x2 pooling (the paper does not say). Returns logits (the softmax is in the loss).
    """

    def __init__(self, n_classes=10, in_channels=1):
        super().__init__()
        n_classes = _size_iv(n_classes, "n_classes")
        in_channels = _size_iv(in_channels, "in_channels")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, n_classes))

    def forward(self, x):
        if x.dim() == 3:  # (B, 28, 28): add the channel axis
            x = x.unsqueeze(1)
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """Fully connected network: ``in_features`` -> hidden layers (ReLU) -> ``n_classes`` logits.

    ``hidden`` is a sequence of layer widths (an int means one hidden layer).
    """

    def __init__(self, in_features, n_classes, hidden=(200, 200)):
        super().__init__()
        in_features = _size_iv(in_features, "in_features")
        n_classes = _size_iv(n_classes, "n_classes")
        layers, width = [nn.Flatten()], in_features
        for h in _hidden_iv(hidden):
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class LogisticModel(nn.Module):
    """Multinomial logistic regression: one linear layer giving ``n_classes`` logits."""

    def __init__(self, in_features, n_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(_size_iv(in_features, "in_features"),
                                                         _size_iv(n_classes, "n_classes")))

    def forward(self, x):
        return self.net(x)

