"""Federated algorithms defined once, run in process or on Flower.

:class:`FederatedAlgorithm` is the protocol (a client half and a server half
with explicit messages), :func:`run` the in-process runtime, and
:mod:`ebfl.flower.runtime` (``ebfl[flower]``) the Flower runtime. The
federated empirical-Bayes protocols are in :mod:`ebfl.federated.eb` and
:mod:`ebfl.federated.eb_normal_means` (every prior family of :func:`ebfl.ebnm`).
"""

from ebfl._lazy import attach

_NAMES = {
    "ClientCounts": "ebfl.federated.eb_data",
    "ClientMeans": "ebfl.federated.eb_data",
    "EBBetaBinomial": "ebfl.federated.eb",
    "EBGaussian": "ebfl.federated.eb",
    "EBNormalMeans": "ebfl.federated.eb_normal_means",
    "election_federation": "ebfl.federated.eb_data",
    "election_shares": "ebfl.federated.eb_data",
    "FederatedAlgorithm": "ebfl.federated.protocol",
    "RoundContext": "ebfl.federated.protocol",
    "run": "ebfl.federated.runtime",
    "RunConfig": "ebfl.federated.protocol",
    "RunResult": "ebfl.federated.runtime",
    "sample_clients": "ebfl.federated.protocol",
    "simulated_counts": "ebfl.federated.eb_data",
    "simulated_means": "ebfl.federated.eb_data",
    "stream_seed": "ebfl.federated.streams",
}
_SUBMODULES = (
    "checkpoint", "eb", "eb_data", "eb_normal_means", "faults", "protocol", "runtime",
    "streams", "tree",
)
__getattr__, __dir__ = attach(__name__, _NAMES, _SUBMODULES)

__all__ = ["ClientCounts", "ClientMeans", "EBBetaBinomial", "EBGaussian", "EBNormalMeans",
           "FederatedAlgorithm", "RoundContext", "RunConfig", "RunResult",
           "election_federation", "election_shares", "run", "sample_clients",
           "simulated_counts", "simulated_means", "stream_seed"]
