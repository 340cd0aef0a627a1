"""ebfl: empirical-Bayes personalized estimation and learning.

Many clients each hold a little data drawn from their own parameter theta_i;
the theta_i come from an unknown population prior. Learning that prior across
clients gives every client a better estimate than its data alone.

Subpackages and modules
-----------------------
ebfl.eb      Empirical-Bayes estimators: Gaussian, Beta-Bernoulli, mixture and
             nonparametric (NPMLE) priors; normal means with every usual prior
             family (``ebfl.ebnm``).
ebfl.privacy Quantizers, local-DP mechanisms, private estimators, accounting.
ebfl.bounds  Closed-form MSEs and bounds of the paper's theorems.
ebfl.models  Generative models (population prior + client data) with ``sample``.
ebfl.ragged  Ragged client data (flat values + offsets).
"""

from importlib.metadata import PackageNotFoundError, version

from ebfl._lazy import attach

try:
    __version__ = version("ebfl")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

# The public names and the subpackages are imported on first use (``ebfl._lazy``).
_NAMES = {
    "BetaBernoulliPopulation": "ebfl.models",
    "BetaPrior": "ebfl.eb",
    "GaussianPopulation": "ebfl.models",
    "NormalPrior": "ebfl.eb",
    "Ragged": "ebfl.ragged",
    "beta_bernoulli_eb": "ebfl.eb",
    "beta_binomial_eb": "ebfl.eb",
    "ebnm": "ebfl.eb",
    "gaussian_eb": "ebfl.eb",
    "gaussian_eb_samples": "ebfl.eb",
    "npmle_binomial": "ebfl.eb",
    "npmle_normal": "ebfl.eb",
    "personalized_gaussian": "ebfl.eb",
}
_SUBMODULES = (
    "bounds", "cli", "datasets", "demo", "dppfl", "eb", "federated", "fedhdp", "flower",
    "generative", "learning", "models", "perada", "privacy", "ragged", "validation",
)
__getattr__, __dir__ = attach(__name__, _NAMES, _SUBMODULES)

__all__ = [
    "BetaBernoulliPopulation",
    "BetaPrior",
    "GaussianPopulation",
    "NormalPrior",
    "Ragged",
    "beta_bernoulli_eb",
    "beta_binomial_eb",
    "bounds",
    "ebnm",
    "gaussian_eb",
    "gaussian_eb_samples",
    "npmle_binomial",
    "npmle_normal",
    "personalized_gaussian",
]
