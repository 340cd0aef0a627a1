"""Privacy accounting: one core, one thin module per use.

The maths is in the core and shared by every accountant, so the same question
gets the same answer (or the same refusal) from each of them:

* :mod:`~ebfl.privacy.accounting.core`: the accepted ranges and their
  validators, RDP -> (epsilon, delta) conversions, the PLD grid guard, the
  inverse noise search;
* :mod:`~ebfl.privacy.accounting.rdp`: the RDP of the Gaussian and of the
  Poisson-subsampled Gaussian (exact at fractional orders) and of their
  compositions (:func:`~ebfl.privacy.accounting.rdp.event_rdp`);
* :mod:`~ebfl.privacy.accounting.accountant`: :class:`Accountant`, which
  records mechanism events and answers epsilon(delta) and delta(epsilon).

The uses, each a thin module on the core:

* :mod:`~ebfl.privacy.accounting.dp_fedavg`: client-level DP-FedAvg and
  FedHDP's privacy groups (Poisson sampling, add/remove one), with the
  guarantee's model in :mod:`~ebfl.privacy.accounting.guarantee`;
* :mod:`~ebfl.privacy.accounting.adaped`: DP-AdaPeD's user-level accountant
  beside the paper's Theorem 7.

DP-PFL's rigorous accountant and its Theorem 5 / Corollary 4 are with that
paper (:mod:`ebfl.dppfl.accounting`) and call this core.
"""

from ebfl.privacy.accounting.accountant import Accountant
from ebfl.privacy.accounting.adaped import (
    DPAdaPeDAccountant,
    PrivacySpent,
    RoundRecord,
    dp_adaped_epsilon,
    dp_adaped_noise_multiplier,
    theorem7_rdp,
)
from ebfl.privacy.accounting.core import DEFAULT_ORDERS, rdp_to_delta, rdp_to_epsilon
from ebfl.privacy.accounting.dp_fedavg import (
    TFP_ORDERS,
    DPFedAvgPrivacy,
    NoiseCalibration,
    adaptive_clipping_effective_noise,
    adaptive_clipping_noise,
    dp_fedavg_epsilon,
    dp_fedavg_noise_multiplier,
    dp_fedavg_rdp,
    fedhdp_group_epsilons,
)
from ebfl.privacy.accounting.rdp import event_rdp, poisson_gaussian_rdp

__all__ = [
    "DEFAULT_ORDERS",
    "TFP_ORDERS",
    "Accountant",
    "DPAdaPeDAccountant",
    "DPFedAvgPrivacy",
    "NoiseCalibration",
    "PrivacySpent",
    "RoundRecord",
    "adaptive_clipping_effective_noise",
    "adaptive_clipping_noise",
    "dp_adaped_epsilon",
    "dp_adaped_noise_multiplier",
    "dp_fedavg_epsilon",
    "dp_fedavg_noise_multiplier",
    "dp_fedavg_rdp",
    "event_rdp",
    "fedhdp_group_epsilons",
    "poisson_gaussian_rdp",
    "rdp_to_delta",
    "rdp_to_epsilon",
    "theorem7_rdp",
]
