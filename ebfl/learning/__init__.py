"""Personalized federated learning: regression in numpy (this package), neural nets in torch.

The numpy part never imports torch; the torch algorithms live in
``ebfl.learning.torch`` (optional ``learning`` extra).
"""

# The public names are imported on first use (ebfl._lazy): a job that needs one
# module does not pay for the others' imports.
from ebfl._lazy import attach  # noqa: E402

_NAMES = {
    "DiscreteMixtureLinear": "ebfl.learning.population_models",
    "FedAvgLinear": "ebfl.learning.regression",
    "FedAvgLogistic": "ebfl.learning.regression",
    "FederatedResult": "ebfl.learning.federated",
    "finetune_linear": "ebfl.learning.regression",
    "finetune_logistic": "ebfl.learning.regression",
    "GaussianMixtureLinear": "ebfl.learning.population_models",
    "laplace_objective": "ebfl.learning.population_models",
    "LaplaceLinear": "ebfl.learning.population_models",
    "linear_objective": "ebfl.learning.regression",
    "LinearEM": "ebfl.learning.regression",
    "LinearGD": "ebfl.learning.regression",
    "local_least_squares": "ebfl.learning.theorem6",
    "logistic_map": "ebfl.learning.logistic_eb",
    "logistic_objective": "ebfl.learning.regression",
    "LogisticEM": "ebfl.learning.logistic_eb",
    "LogisticGD": "ebfl.learning.regression",
    "marginal_loglik": "ebfl.learning.theorem6",
    "posterior_regression": "ebfl.learning.theorem6",
    "RegressionAlgorithm": "ebfl.learning.federated",
    "RegressionData": "ebfl.learning.data",
    "run_federated": "ebfl.learning.federated",
}
__getattr__, __dir__ = attach(__name__, _NAMES)

__all__ = ["DiscreteMixtureLinear", "FedAvgLinear", "FedAvgLogistic", "FederatedResult",
           "GaussianMixtureLinear", "LaplaceLinear", "LinearEM", "LinearGD", "LogisticEM",
           "LogisticGD", "RegressionAlgorithm", "RegressionData", "finetune_linear",
           "finetune_logistic", "laplace_objective", "linear_objective", "local_least_squares",
           "logistic_map", "logistic_objective", "marginal_loglik", "posterior_regression",
           "run_federated"]
