"""The prior families of :func:`ebfl.eb.ebnm`, by kind (names only: no imports, so the
command line can list them without loading the solvers)."""

__all__ = ["FAMILIES", "FIXED_FAMILIES", "GRID_FAMILIES", "PARAMETRIC_FAMILIES",
           "SMOOTH_FAMILIES"]

PARAMETRIC_FAMILIES = ("normal", "point_normal", "point_laplace", "point_exponential",
                       "horseshoe", "generalized_binary")
GRID_FAMILIES = ("normal_scale_mixture", "ash", "unimodal", "unimodal_symmetric",
                 "unimodal_nonnegative", "unimodal_nonpositive", "npmle")
#: Efron's log-spline g on a grid of atoms: penalized, so neither parametric nor a
#: mixture fitted by its KKT conditions.
SMOOTH_FAMILIES = ("deconvolver",)
FIXED_FAMILIES = ("point_mass", "flat")
FAMILIES = PARAMETRIC_FAMILIES + GRID_FAMILIES + SMOOTH_FAMILIES + FIXED_FAMILIES
