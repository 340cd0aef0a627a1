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

# The public names are imported on first use (ebfl._lazy): a job that needs one
# module does not pay for the others' imports.
from ebfl._lazy import attach  # noqa: E402

_NAMES = {
    "AdapterBlock": "ebfl.learning.torch.adapters",
    "CNN5": "ebfl.learning.torch.models",
    "Ditto": "ebfl.learning.torch.baselines",
    "DPFedEM": "ebfl.learning.torch.baselines",
    "FedAvg": "ebfl.learning.torch.strategies",
    "FedAvgFT": "ebfl.learning.torch.baselines",
    "FedEM": "ebfl.learning.torch.baselines",
    "FederatedDataset": "ebfl.learning.torch.data",
    "FML": "ebfl.learning.torch.baselines",
    "load_backbone": "ebfl.learning.torch.pretrain",
    "load_torchvision_weights": "ebfl.learning.torch.adapters",
    "Local": "ebfl.learning.torch.strategies",
    "LogisticModel": "ebfl.learning.torch.models",
    "MLP": "ebfl.learning.torch.models",
    "parameter_counts": "ebfl.learning.torch.adapters",
    "parameter_groups": "ebfl.learning.torch.adapters",
    "PerFedAvg": "ebfl.learning.torch.baselines",
    "PFedMe": "ebfl.learning.torch.baselines",
    "pretrained_backbone": "ebfl.learning.torch.pretrain",
    "QuPeDFP": "ebfl.learning.torch.baselines",
    "ResNet18Adapters": "ebfl.learning.torch.adapters",
    "SmallResNet": "ebfl.learning.torch.adapters",
    "train": "ebfl.learning.torch.engine",
    "TrainResult": "ebfl.learning.torch.engine",
}
__getattr__, __dir__ = attach(__name__, _NAMES)

__all__ = ["CNN5", "FML", "MLP", "AdapterBlock", "DPFedEM", "Ditto",
           "FedAvg", "FedAvgFT", "FedEM", "FederatedDataset", "Local", "LogisticModel", "PFedMe",
           "PerFedAvg", "QuPeDFP", "ResNet18Adapters", "SmallResNet", "TrainResult",
           "load_backbone", "load_torchvision_weights", "parameter_counts", "parameter_groups",
           "pretrained_backbone", "train"]
