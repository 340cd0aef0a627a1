"""Empirical Bayes normal means with every usual prior family (:func:`ebnm`).

``ebnm(x, s, prior_family=...)`` fits g by maximum marginal likelihood and
returns each theta_i's posterior; :class:`NormalMeansPrior` is the fitted prior
(a mixture of normal, uniform, exponential and truncated normal components
with exact posteriors; the horseshoe by its quadrature).
"""

from ebfl.eb.normal_means.api import (
    EBNMResult,
    ebnm,
    ebnm_ash,
    ebnm_deconvolver,
    ebnm_flat,
    ebnm_generalized_binary,
    ebnm_horseshoe,
    ebnm_normal,
    ebnm_normal_scale_mixture,
    ebnm_npmle,
    ebnm_point_exponential,
    ebnm_point_laplace,
    ebnm_point_mass,
    ebnm_point_normal,
    ebnm_unimodal,
    ebnm_unimodal_nonnegative,
    ebnm_unimodal_nonpositive,
    ebnm_unimodal_symmetric,
)
from ebfl.eb.normal_means.families import FAMILIES
from ebfl.eb.normal_means.prior import NormalMeansPosterior, NormalMeansPrior

__all__ = ["FAMILIES", "EBNMResult", "NormalMeansPosterior", "NormalMeansPrior", "ebnm",
           "ebnm_ash", "ebnm_deconvolver", "ebnm_flat", "ebnm_generalized_binary",
           "ebnm_horseshoe", "ebnm_normal", "ebnm_normal_scale_mixture", "ebnm_npmle",
           "ebnm_point_exponential", "ebnm_point_laplace", "ebnm_point_mass",
           "ebnm_point_normal", "ebnm_unimodal", "ebnm_unimodal_nonnegative",
           "ebnm_unimodal_nonpositive", "ebnm_unimodal_symmetric"]
