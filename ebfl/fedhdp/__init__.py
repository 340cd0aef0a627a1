"""FedHDP: federated learning with heterogeneous differential privacy.

The closed-form theory of "Federated learning with heterogeneous differential
privacy" (the FedHDP paper) for federated point estimation and linear
regression with clients at several privacy levels (some opting out): the
server's optimal weights and MSE (Lemma 1, Lemma 2, Lemma 5), the clients'
personalization parameters (Theorem 3, Lemma 6) beside the true minimizers of
their MSE, and the Bayes local MSE (eq. (46), (73)). See :mod:`ebfl.fedhdp.theory` and
:mod:`ebfl.fedhdp.levels`.

Everything else that is the paper's lives in this package too: the
aggregation rules (:mod:`~ebfl.fedhdp.aggregation`), federated point
estimation on the two runtimes (:mod:`~ebfl.fedhdp.point_estimation`), the
FedHDP algorithm in torch (:mod:`~ebfl.fedhdp.algorithm`, imported only when
used: it needs ``ebfl[learning]``), its federations (:mod:`~ebfl.fedhdp.data`),
``ebfl reproduce fedhdp`` (:mod:`~ebfl.fedhdp.experiment`), the ``fedhdp_*``
rows of ``ebfl validate`` (:mod:`~ebfl.fedhdp.checks`) and Figures 1-4
(:mod:`~ebfl.fedhdp.figures`).
"""

from ebfl.fedhdp.levels import (
    levels_bayes_local_mse,
    levels_optimal_lambda,
    levels_optimal_lambda_exact,
    levels_optimal_ratios,
    levels_personalized_mse,
    levels_server_mse,
    levels_server_variance,
    levels_weights,
    two_level_matching_lambdas,
    two_level_optimal_lambdas,
    two_level_optimal_ratio,
    two_level_server_covariance,
)
from ebfl.fedhdp.theory import (
    FedHDPBounds,
    LambdaOptimum,
    bayes_local_mse,
    dp_fedavg_gap,
    dp_vs_hdp_fedavg_gap,
    fedhdp_bounds,
    group_mean_variances,
    hdp_fedavg_gap,
    optimal_lambda_exact,
    optimal_lambda_nonprivate,
    optimal_lambda_private,
    optimal_ratio,
    personalized_mse,
    server_mse,
    server_mse_dp_fedavg,
    server_mse_hdp_fedavg,
    server_mse_optimal,
)

__all__ = [
    "FedHDPBounds",
    "LambdaOptimum",
    "bayes_local_mse",
    "dp_fedavg_gap",
    "dp_vs_hdp_fedavg_gap",
    "fedhdp_bounds",
    "group_mean_variances",
    "hdp_fedavg_gap",
    "levels_bayes_local_mse",
    "levels_optimal_lambda",
    "levels_optimal_lambda_exact",
    "levels_optimal_ratios",
    "levels_personalized_mse",
    "levels_server_mse",
    "levels_server_variance",
    "levels_weights",
    "optimal_lambda_exact",
    "optimal_lambda_nonprivate",
    "optimal_lambda_private",
    "optimal_ratio",
    "personalized_mse",
    "server_mse",
    "server_mse_dp_fedavg",
    "server_mse_hdp_fedavg",
    "server_mse_optimal",
    "two_level_matching_lambdas",
    "two_level_optimal_lambdas",
    "two_level_optimal_ratio",
    "two_level_server_covariance",
]
