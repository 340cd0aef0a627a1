"""Prior families (the fitted ``g`` of an empirical-Bayes fit)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_nonnegative_scalar, check_positive_scalar

__all__ = ["BetaPrior", "NormalPrior"]


@dataclass(frozen=True)
class BetaPrior:
    """Beta(alpha, beta) population prior of the clients' success probabilities.

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
        return self.alpha / (self.alpha + self.beta)

    @property
    def variance(self) -> float:
        """Prior variance alpha beta / ((alpha + beta)^2 (alpha + beta + 1))."""
        s = self.alpha + self.beta
        return self.alpha * self.beta / (s * s * (s + 1.0))

    @classmethod
    def from_moments(cls, mean, variance):
        """The Beta prior with the given mean and variance (spec C.5).

        Uses alpha + beta = mean (1 - mean) / variance - 1, which needs
        ``0 < variance < mean (1 - mean)``.
        """
        mean = float(mean)
        variance = float(variance)
        if not 0.0 < mean < 1.0:
            raise ValueError(f"mean must lie in (0, 1), got {mean}")
        if not 0.0 < variance < mean * (1.0 - mean):
            raise ValueError(f"variance must lie in (0, mean(1-mean)) = (0, {mean * (1 - mean)}),"
                             f" got {variance}")
        s = mean * (1.0 - mean) / variance - 1.0
        return cls(mean * s, (1.0 - mean) * s)


@dataclass(frozen=True)
class NormalPrior:
    """Gaussian population prior N(mean, sd^2 I_d) of the client parameters.

    Parameters
    ----------
    mean : float or ndarray of shape (d,)
        Population mean mu.
    sd : float
        Population standard deviation sigma_theta >= 0 (0 means all clients share mu).
    """

    mean: float | np.ndarray
    sd: float

    def __post_init__(self):
        mean = np.asarray(self.mean, dtype=np.float64)
        if mean.ndim > 1 or not np.all(np.isfinite(mean)):
            raise ValueError("mean must be a finite scalar or 1-D array")
        mean = float(mean) if mean.ndim == 0 else mean.copy()
        if isinstance(mean, np.ndarray):
            mean.setflags(write=False)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", check_nonnegative_scalar(self.sd, "sd"))

    def __eq__(self, other):
        return (isinstance(other, NormalPrior) and self.sd == other.sd
                and np.array_equal(self.mean, other.mean))

    __hash__ = None
