"""Communication and local-privacy mechanisms, private estimators, privacy accounting."""

from ebfl.privacy.accounting import (
    DPAdaPeDAccountant,
    PrivacySpent,
    dp_adaped_epsilon,
    rdp_to_delta,
    rdp_to_epsilon,
    theorem7_rdp,
)
from ebfl.privacy.dp_fedavg import (
    DPFedAvgPrivacy,
    adaptive_clipping_noise,
    dp_fedavg_epsilon,
    dp_fedavg_noise_multiplier,
    fedhdp_group_epsilons,
)
from ebfl.privacy.estimators import (
    PrivateBernoulliEstimate,
    PrivateGaussianEstimate,
    private_bernoulli_corrected,
    private_bernoulli_paper,
    private_gaussian,
)
from ebfl.privacy.mechanisms import (
    BinaryMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    PrivacyGuarantee,
    PrivacyWarning,
    RandomizedResponse,
    StochasticQuantizer,
    analytic_gaussian_delta,
    paper_clip_range,
)

__all__ = [
    "BinaryMechanism",
    "DPAdaPeDAccountant",
    "DPFedAvgPrivacy",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "PrivacyGuarantee",
    "PrivacySpent",
    "PrivacyWarning",
    "PrivateBernoulliEstimate",
    "PrivateGaussianEstimate",
    "RandomizedResponse",
    "StochasticQuantizer",
    "adaptive_clipping_noise",
    "analytic_gaussian_delta",
    "dp_adaped_epsilon",
    "dp_fedavg_epsilon",
    "dp_fedavg_noise_multiplier",
    "fedhdp_group_epsilons",
    "paper_clip_range",
    "private_bernoulli_corrected",
    "private_bernoulli_paper",
    "private_gaussian",
    "rdp_to_delta",
    "rdp_to_epsilon",
    "theorem7_rdp",
]
