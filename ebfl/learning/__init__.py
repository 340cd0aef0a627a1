"""Personalized federated learning: regression in numpy (this package), neural nets in torch.

The numpy part never imports torch; the torch algorithms live in
``ebfl.learning.torch`` (optional ``learning`` extra).
"""

from ebfl.learning.data import RegressionData
from ebfl.learning.federated import FederatedResult, run_federated, sample_clients
from ebfl.learning.population_models import (
    DiscreteMixtureLinear,
    GaussianMixtureLinear,
    LaplaceLinear,
    laplace_objective,
)
from ebfl.learning.regression import (
    FedAvgLinear,
    LinearEM,
    LinearGD,
    LogisticGD,
    finetune_linear,
    linear_objective,
    logistic_objective,
)
from ebfl.learning.theorem6 import local_least_squares, marginal_loglik, posterior_regression

__all__ = ["DiscreteMixtureLinear", "FedAvgLinear", "GaussianMixtureLinear", "LaplaceLinear",
           "laplace_objective", "FederatedResult", "LinearEM", "LinearGD", "LogisticGD",
           "RegressionData", "finetune_linear", "linear_objective", "local_least_squares",
           "logistic_objective", "marginal_loglik", "posterior_regression", "run_federated",
           "sample_clients"]
