"""Empirical Bayes normal means with every usual prior family (:func:`ebnm`).

``ebnm(x, s, prior_family=...)`` fits g by maximum marginal likelihood and
returns each theta_i's posterior; :class:`NormalMeansPrior` is the fitted prior
(a mixture of normal, uniform, exponential and truncated normal components
with exact posteriors; the horseshoe by its quadrature).
"""

from ebfl._lazy import attach

_NAMES = {
    "FAMILIES": "ebfl.eb.normal_means.names",
    "EBNMResult": "ebfl.eb.normal_means.api",
    "ebnm": "ebfl.eb.normal_means.api",
    "ebnm_ash": "ebfl.eb.normal_means.api",
    "ebnm_deconvolver": "ebfl.eb.normal_means.api",
    "ebnm_flat": "ebfl.eb.normal_means.api",
    "ebnm_generalized_binary": "ebfl.eb.normal_means.api",
    "ebnm_horseshoe": "ebfl.eb.normal_means.api",
    "ebnm_normal": "ebfl.eb.normal_means.api",
    "ebnm_normal_scale_mixture": "ebfl.eb.normal_means.api",
    "ebnm_npmle": "ebfl.eb.normal_means.api",
    "ebnm_point_exponential": "ebfl.eb.normal_means.api",
    "ebnm_point_laplace": "ebfl.eb.normal_means.api",
    "ebnm_point_mass": "ebfl.eb.normal_means.api",
    "ebnm_point_normal": "ebfl.eb.normal_means.api",
    "ebnm_unimodal": "ebfl.eb.normal_means.api",
    "ebnm_unimodal_nonnegative": "ebfl.eb.normal_means.api",
    "ebnm_unimodal_nonpositive": "ebfl.eb.normal_means.api",
    "ebnm_unimodal_symmetric": "ebfl.eb.normal_means.api",
    "NormalMeansPosterior": "ebfl.eb.normal_means.prior",
    "NormalMeansPrior": "ebfl.eb.normal_means.prior",
}
_SUBMODULES = (
    "api", "deconvolver", "families", "generalized_binary", "grid", "horseshoe", "modes",
    "names", "prior", "truncated",
)
__getattr__, __dir__ = attach(__name__, _NAMES, _SUBMODULES)

__all__ = ["FAMILIES", "EBNMResult", "NormalMeansPosterior", "NormalMeansPrior", "ebnm",
           "ebnm_ash", "ebnm_deconvolver", "ebnm_flat", "ebnm_generalized_binary",
           "ebnm_horseshoe", "ebnm_normal", "ebnm_normal_scale_mixture", "ebnm_npmle",
           "ebnm_point_exponential", "ebnm_point_laplace", "ebnm_point_mass",
           "ebnm_point_normal", "ebnm_unimodal", "ebnm_unimodal_nonnegative",
           "ebnm_unimodal_nonpositive", "ebnm_unimodal_symmetric"]
