"""Communication and local-privacy mechanisms, private estimators, privacy accounting."""

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
    RandomizedResponse,
    StochasticQuantizer,
    paper_clip_range,
)

__all__ = [
    "BinaryMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "PrivacyGuarantee",
    "PrivateBernoulliEstimate",
    "PrivateGaussianEstimate",
    "RandomizedResponse",
    "StochasticQuantizer",
    "paper_clip_range",
    "private_bernoulli_corrected",
    "private_bernoulli_paper",
    "private_gaussian",
]
