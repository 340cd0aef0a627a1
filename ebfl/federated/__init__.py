"""Federated algorithms defined once, run in process or on Flower.

:class:`FederatedAlgorithm` is the protocol (a client half and a server half
with explicit messages), :func:`run` the in-process runtime, and
:mod:`ebfl.flower.runtime` (``ebfl[flower]``) the Flower runtime. The
federated empirical-Bayes protocols are in :mod:`ebfl.federated.eb` and
:mod:`ebfl.federated.eb_normal_means` (every prior family of :func:`ebfl.ebnm`).
"""

from ebfl.federated.eb import EBBetaBinomial, EBGaussian
from ebfl.federated.eb_data import (
    ClientCounts,
    ClientMeans,
    election_federation,
    election_shares,
    simulated_counts,
    simulated_means,
)
from ebfl.federated.eb_normal_means import EBNormalMeans
from ebfl.federated.protocol import FederatedAlgorithm, RoundContext, RunConfig, sample_clients
from ebfl.federated.runtime import RunResult, run
from ebfl.federated.streams import stream_seed

__all__ = ["ClientCounts", "ClientMeans", "EBBetaBinomial", "EBGaussian", "EBNormalMeans",
           "FederatedAlgorithm", "RoundContext", "RunConfig", "RunResult",
           "election_federation", "election_shares", "run", "sample_clients",
           "simulated_counts", "simulated_means", "stream_seed"]
