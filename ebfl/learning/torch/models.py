"""The client models: the paper's 5-layer CNN, an MLP and multinomial logistic regression."""

from __future__ import annotations

from torch import nn

__all__ = ["CNN5", "MLP", "LogisticModel"]


class CNN5(nn.Module):
    """The paper's "5-layer CNN" (spec B.4), LeNet-5 style, for 1 x 28 x 28 inputs.

    conv 5x5 (6) -> ReLU -> 2x2 max-pool -> conv 5x5 (16) -> ReLU -> 2x2 max-pool
    -> FC 256x120 -> ReLU -> FC 120x84 -> ReLU -> FC 84 x ``n_classes``. The paper
    does not state activations or pooling; 256 = 16 * 4 * 4 fixes the 28 x 28
    input and 2x2 pooling (spec B.4 [D]). Returns logits (the softmax is in the loss).
    """

    def __init__(self, n_classes=10, in_channels=1):
        super().__init__()
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
    """Fully connected network: ``in_features`` -> hidden (ReLU) ... -> ``n_classes`` logits."""

    def __init__(self, in_features, n_classes, hidden=(200, 200)):
        super().__init__()
        layers, width = [nn.Flatten()], in_features
        for h in hidden:
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
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, n_classes))

    def forward(self, x):
        return self.net(x)
