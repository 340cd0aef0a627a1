"""Neural personalized federated learning in torch (optional ``learning`` extra).

Many small client models train at once: their parameters are stacked along a
leading client axis and every local step is one ``torch.func.vmap`` over the
sampled clients (:mod:`ebfl.learning.torch.engine`). Algorithms plug in as
strategies (:mod:`ebfl.learning.torch.strategies`).
"""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError("ebfl.learning.torch needs torch: pip install "
                              "'ebfl[learning]'", name="torch") from exc

from ebfl.learning.torch.adapters import (
    AdapterBlock,
    ResNet18Adapters,
    SmallResNet,
    load_torchvision_weights,
    parameter_counts,
    parameter_groups,
)
from ebfl.learning.torch.baselines import (
    FML,
    Ditto,
    DPFedEM,
    FedAvgFT,
    FedEM,
    PerFedAvg,
    PFedMe,
    QuPeDFP,
)
from ebfl.learning.torch.data import FederatedDataset
from ebfl.learning.torch.engine import TrainResult, train
from ebfl.learning.torch.models import CNN5, MLP, LogisticModel
from ebfl.learning.torch.pretrain import load_backbone, pretrained_backbone
from ebfl.learning.torch.strategies import FedAvg, Local

__all__ = ["CNN5", "FML", "MLP", "AdapterBlock", "DPFedEM", "Ditto",
           "FedAvg", "FedAvgFT", "FedEM", "FederatedDataset", "Local", "LogisticModel", "PFedMe",
           "PerFedAvg", "QuPeDFP", "ResNet18Adapters", "SmallResNet", "TrainResult",
           "load_backbone", "load_torchvision_weights", "parameter_counts", "parameter_groups",
           "pretrained_backbone", "train"]
