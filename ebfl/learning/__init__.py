"""Personalized federated learning: regression in numpy (this package), neural nets in torch.

The numpy part never imports torch; the torch algorithms live in
``ebfl.learning.torch`` (optional ``learning`` extra).
"""

from ebfl.learning.data import RegressionData
from ebfl.learning.federated import FederatedResult, RegressionAlgorithm, run_federated
from ebfl.learning.logistic_eb import LogisticEM, logistic_map
from ebfl.learning.population_models import (
    DiscreteMixtureLinear,
    GaussianMixtureLinear,
    LaplaceLinear,
    laplace_objective,
)
from ebfl.learning.regression import (
    FedAvgLinear,
    FedAvgLogistic,
    LinearEM,
    LinearGD,
    LogisticGD,
    finetune_linear,
    finetune_logistic,
    linear_objective,
    logistic_objective,
)
from ebfl.learning.theorem6 import local_least_squares, marginal_loglik, posterior_regression

__all__ = ["DiscreteMixtureLinear", "FedAvgLinear", "FedAvgLogistic", "FederatedResult",
           "GaussianMixtureLinear", "LaplaceLinear", "LinearEM", "LinearGD", "LogisticEM",
           "LogisticGD", "RegressionAlgorithm", "RegressionData", "finetune_linear",
           "finetune_logistic", "laplace_objective", "linear_objective", "local_least_squares",
           "logistic_map", "logistic_objective", "marginal_loglik", "posterior_regression",
           "run_federated"]
