"""Prior families (the fitted ``g`` of an empirical-Bayes fit)."""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    check_finite_array,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
)

__all__ = ["BetaPrior", "NormalPrior"]


@dataclass(frozen=True)
class BetaPrior:
    r""":math:`\mathrm{Beta}(\alpha, \beta)` population prior of the clients' success probabilities.

    Parameters
    ----------
    alpha, beta : float
        Shape parameters, both > 0.

    Examples
    --------
    >>> g = BetaPrior(2.0, 2.0)
    >>> g.mean, round(g.variance, 6)
    (0.5, 0.05)
    """

    alpha: float
    beta: float

    def __post_init__(self):
        object.__setattr__(self, "alpha", check_positive_scalar(self.alpha, "alpha"))
        object.__setattr__(self, "beta", check_positive_scalar(self.beta, "beta"))

    @property
    def mean(self) -> float:
        """Prior mean alpha / (alpha + beta)."""
        s = self.alpha + self.beta
        if math.isinf(s):  # both shapes near the float64 maximum: divide first
            return 1.0 / (1.0 + self.beta / self.alpha)
        return self.alpha / s

    @property
    def variance(self) -> float:
        """Prior variance alpha beta / ((alpha + beta)^2 (alpha + beta + 1))."""
        s = self.alpha + self.beta
        num, den = self.alpha * self.beta, s * s * (s + 1.0)
        if math.isfinite(den) and den >= sys.float_info.min and num >= sys.float_info.min:
            return num / den
        # Shapes so large or small that the products overflow or underflow: the
        # same value written as mean (1 - mean) / (alpha + beta + 1).
        mean = self.mean
        return mean * (1.0 - mean) / (s + 1.0)

    @classmethod
    def from_moments(cls, mean, variance):
        """The Beta prior with the given mean and variance (method of moments).

        Uses alpha + beta = mean (1 - mean) / variance - 1, which needs
        ``0 < mean < 1`` and ``0 < variance < mean (1 - mean)``.
        """
        mean = check_real_scalar(mean, "mean", low=0.0, high=1.0, low_open=True,
                                 high_open=True)
        bound = mean * (1.0 - mean)
        if not _is_real(variance):
            raise TypeError(f"variance must be a real number in (0, mean(1-mean)) = "
                            f"(0, {bound!r}), got {variance!r}")
        variance = float(variance)
        if not 0.0 < variance < bound:
            raise ValueError(f"variance must lie in (0, mean(1-mean)) = (0, {bound!r}),"
                             f" got {variance!r}")
        s = bound / variance - 1.0
        alpha, beta = mean * s, (1.0 - mean) * s
        if not (math.isfinite(alpha) and math.isfinite(beta)):
            raise ValueError(f"variance {variance!r} is too small relative to mean(1-mean) = "
                             f"{bound!r}: alpha + beta = {s!r} overflows")
        if alpha == 0.0 or beta == 0.0:
            raise ValueError(f"mean {mean!r} and variance {variance!r} give a Beta shape "
                             "below the smallest float")
        return cls(alpha, beta)


@dataclass(frozen=True)
class NormalPrior:
    r"""Gaussian population prior :math:`N(\mu, \sigma_\theta^2 I_d)` of the client parameters.

    Parameters
    ----------
    mean : float or ndarray of shape (d,)
        Population mean :math:`\mu`.
    sd : float
        Population standard deviation :math:`\sigma_\theta \ge 0` (0 means all clients
        share :math:`\mu`).
    """

    mean: float | np.ndarray
    sd: float

    def __post_init__(self):
        mean = check_finite_array(self.mean, "mean", ndim=(0, 1))
        mean = float(mean) if mean.ndim == 0 else mean.copy()
        if isinstance(mean, np.ndarray):
            mean.setflags(write=False)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", check_nonnegative_scalar(self.sd, "sd"))

    def __eq__(self, other):
        return (isinstance(other, NormalPrior) and self.sd == other.sd
                and np.array_equal(self.mean, other.mean))

    __hash__ = None


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
