"""Empirical-Bayes estimators: Gaussian, Beta-Bernoulli, mixture and nonparametric priors."""

from ebfl.eb.beta_binomial import bernoulli_counts, beta_bernoulli_eb, beta_binomial_eb
from ebfl.eb.discrete import (
    DiscreteMixtureFit,
    DiscretePosterior,
    discrete_mixture_eb,
    discrete_posterior,
    expected_posterior_variance,
    lemma1_radius,
)
from ebfl.eb.gaussian import gaussian_eb, gaussian_eb_samples, personalized_gaussian
from ebfl.eb.gaussian_mixture import (
    GaussianMixtureEBResult,
    GaussianMixturePosterior,
    GaussianMixturePrior,
    gaussian_mixture_eb,
    gaussian_mixture_posterior,
)
from ebfl.eb.mixture_weights import MixSQPResult, mixsqp
from ebfl.eb.npmle import NPMLEResult, npmle_binomial, npmle_normal
from ebfl.eb.priors import BetaPrior, NormalPrior
from ebfl.eb.results import (
    BetaBinomialEBResult,
    BetaPosterior,
    GaussianEBResult,
    NormalPosterior,
    PersonalizedGaussianEstimate,
)

__all__ = [
    "BetaBinomialEBResult",
    "BetaPosterior",
    "BetaPrior",
    "DiscreteMixtureFit",
    "DiscretePosterior",
    "GaussianEBResult",
    "GaussianMixtureEBResult",
    "GaussianMixturePosterior",
    "GaussianMixturePrior",
    "MixSQPResult",
    "NPMLEResult",
    "NormalPosterior",
    "NormalPrior",
    "PersonalizedGaussianEstimate",
    "bernoulli_counts",
    "beta_bernoulli_eb",
    "beta_binomial_eb",
    "discrete_mixture_eb",
    "discrete_posterior",
    "expected_posterior_variance",
    "gaussian_eb",
    "gaussian_eb_samples",
    "gaussian_mixture_eb",
    "gaussian_mixture_posterior",
    "lemma1_radius",
    "mixsqp",
    "npmle_binomial",
    "npmle_normal",
    "personalized_gaussian",
]
