"""Unbiased communication and local-privacy mechanisms with exact variances.

Each mechanism is a small frozen object: ``privatize(x, rng)`` maps every
client's value (vectorized over clients) to what the client sends,
``variance(x)`` gives the exact per-coordinate variance of that message for
the input ``x``, and ``max_variance`` its supremum over the domain (the
sigma_q^2 of Theorem 2). Mechanisms with a bounded domain say how they treat
inputs outside it: the quantizer, the Gaussian and the Laplace mechanisms clip
to [-b, b] (count with ``n_clipped(x)``); the binary mechanism and randomized
response raise.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from ebfl._validation import (
    as_generator,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_positive_scalar,
)

__all__ = [
    "BinaryMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "PrivacyGuarantee",
    "RandomizedResponse",
    "StochasticQuantizer",
    "paper_clip_range",
]


@dataclass(frozen=True)
class PrivacyGuarantee:
    """Local differential privacy of one release: (epsilon, delta)-LDP (delta = 0: pure)."""

    epsilon: float
    delta: float = 0.0

    @property
    def pure(self) -> bool:
        """True for epsilon-LDP (delta = 0)."""
        return self.delta == 0.0


def _check_delta(delta):
    delta = check_positive_scalar(delta, "delta")
    if not delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return delta


class Mechanism(ABC):
    """Interface of every mechanism (see the module docstring)."""

    #: None for a mechanism that only compresses (no privacy).
    privacy: PrivacyGuarantee | None = None

    @abstractmethod
    def privatize(self, x, rng=None):
        """The messages q(x) for an array of inputs (one per client, or (m, d))."""

    @abstractmethod
    def variance(self, x):
        """Exact per-coordinate variance of q(x) for each input x."""

    @property
    @abstractmethod
    def max_variance(self) -> float:
        """Supremum of ``variance`` over the domain: sigma_q^2 of Theorem 2."""


class _ClippingMechanism(Mechanism):
    """Mechanisms on [-b, b]^d that clip their input coordinate-wise."""

    b: float

    def _clip(self, x):
        x = check_finite_array(x, "x", ndim=(0, 1, 2), min_len=0)
        return np.clip(x, -self.b, self.b)

    def n_clipped(self, x):
        """Number of coordinates of ``x`` outside [-b, b] (clipped before release)."""
        x = check_finite_array(x, "x", ndim=(0, 1, 2), min_len=0)
        return int(np.count_nonzero(np.abs(x) > self.b))


@dataclass(frozen=True)
class StochasticQuantizer(_ClippingMechanism):
    r"""k-bit unbiased stochastic quantizer on [-b, b] (spec C.3, Theorem 2 part 1).

    The input is clipped to [-b, b] and rounded at random to one of the 2^k
    levels -b + j Delta, Delta = 2b/(2^k - 1), so that E q(x) = x for every
    x in [-b, b]. The exact variance is Delta^2 f (1 - f), f the fractional
    position of x between its two levels, at most b^2/(2^k - 1)^2.

    Parameters
    ----------
    k_bits : int
        Bits per coordinate, >= 1.
    b : float
        Half-width of the range, > 0 (the paper's choice: :func:`paper_clip_range`).

    Examples
    --------
    >>> q = StochasticQuantizer(2, 1.5)
    >>> q.levels.tolist()
    [-1.5, -0.5, 0.5, 1.5]
    >>> float(q.variance(0.0)), q.max_variance
    (0.25, 0.25)
    """

    k_bits: int
    b: float

    def __post_init__(self):
        object.__setattr__(self, "k_bits", check_int_scalar(self.k_bits, "k_bits", minimum=1))
        object.__setattr__(self, "b", check_positive_scalar(self.b, "b"))

    @property
    def step(self) -> float:
        """Distance Delta = 2b/(2^k - 1) between levels."""
        return 2.0 * self.b / (2**self.k_bits - 1)

    @property
    def levels(self) -> np.ndarray:
        """The 2^k output values."""
        return -self.b + self.step * np.arange(2**self.k_bits)

    def _position(self, x):
        scaled = (self._clip(x) + self.b) / self.step
        low = np.minimum(np.floor(scaled), 2**self.k_bits - 2)  # x = b: top interval
        return low, scaled - low

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        low, frac = self._position(x)
        up = rng.random(np.shape(frac)) < frac
        return self.step * (low + up) - self.b

    def variance(self, x):
        _, frac = self._position(x)
        return self.step**2 * frac * (1.0 - frac)

    @property
    def max_variance(self) -> float:
        return self.step**2 / 4.0


def paper_clip_range(r, m, n, sigma_theta, sigma_x):
    r"""The paper's clipping half-width b = r + (sigma_theta + sigma_x/sqrt(n)) sqrt(log(m^2 n)).

    Chosen so that every client mean lies in [-b, b] with high probability when
    mu lies in [-r, r] (spec C.3; the paper's failure probability 2/(mn) is
    optimistic, spec [!4]).

    Examples
    --------
    >>> round(paper_clip_range(1.0, 10_000, 15, 0.1, 0.5), 4)
    2.0531
    """
    r = float(check_finite_array(r, "r", ndim=0))
    if r < 0:
        raise ValueError(f"r must be >= 0, got {r}")
    m = check_int_scalar(m, "m", minimum=2)
    n = check_int_scalar(n, "n", minimum=1)
    sigma_theta = float(check_finite_array(sigma_theta, "sigma_theta", ndim=0))
    if sigma_theta < 0:
        raise ValueError(f"sigma_theta must be >= 0, got {sigma_theta}")
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    return r + (sigma_theta + sigma_x / math.sqrt(n)) * math.sqrt(math.log(m * m * n))


def _analytic_gaussian_sigma(sensitivity, epsilon, delta):
    """Smallest sigma for which N(0, sigma^2) noise is (epsilon, delta)-DP (Balle & Wang 2018).

    The mechanism is (eps, delta)-DP iff
    Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta, D the L2
    sensitivity; the left side decreases in s, so bisect on log s.
    """
    def excess(log_s):
        s = math.exp(log_s)
        a, c = sensitivity / (2 * s), epsilon * s / sensitivity
        return (special.ndtr(a - c) - math.exp(epsilon) * special.ndtr(-a - c)) - delta

    lo, hi = math.log(sensitivity) - 20.0, math.log(sensitivity) + 20.0
    return math.exp(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14))


@dataclass(frozen=True)
class GaussianMechanism(_ClippingMechanism):
    r"""User-level (epsilon, delta)-LDP Gaussian mechanism on [-b, b]^d (spec C.4).

    Releases clip(x) + N(0, sigma^2 I_d); the variance is sigma^2 for every
    input, so Theorem 2 holds with equality.

    Parameters
    ----------
    epsilon : float
        > 0.
    delta : float
        In (0, 1).
    b : float
        Half-width of the input range, > 0.
    d : int, default=1
        Dimension of each client's message.
    calibration : {"paper", "l2"}, default="paper"
        ``"paper"``: sigma = (b/epsilon) sqrt(8 log(2/delta)), the paper's
        per-coordinate calibration for sensitivity 2b. It is (epsilon,
        delta)-LDP for one coordinate and epsilon < 1 only; for d > 1 it
        ignores that all d coordinates are released (spec [!4]).
        ``"l2"``: the tight analytic calibration (Balle & Wang 2018) for the
        L2 sensitivity 2b sqrt(d) of the whole vector, valid for every
        epsilon > 0.

    Examples
    --------
    >>> g = GaussianMechanism(1.0, 1e-5, 2.0531)
    >>> round(g.sigma ** 2, 1)
    411.6
    """

    epsilon: float
    delta: float
    b: float
    d: int = 1
    calibration: str = "paper"

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_positive_scalar(self.epsilon, "epsilon"))
        object.__setattr__(self, "delta", _check_delta(self.delta))
        object.__setattr__(self, "b", check_positive_scalar(self.b, "b"))
        object.__setattr__(self, "d", check_int_scalar(self.d, "d", minimum=1))
        check_choice(self.calibration, "calibration", ("paper", "l2"))

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the released vector: 2b (paper, per coordinate) or 2b sqrt(d)."""
        return 2.0 * self.b * (1.0 if self.calibration == "paper" else math.sqrt(self.d))

    @property
    def sigma(self) -> float:
        """Noise standard deviation per coordinate."""
        if self.calibration == "paper":
            return self.b / self.epsilon * math.sqrt(8.0 * math.log(2.0 / self.delta))
        return _analytic_gaussian_sigma(self.sensitivity, self.epsilon, self.delta)

    @property
    def privacy(self):
        return PrivacyGuarantee(self.epsilon, self.delta)

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        clipped = self._clip(x)
        return clipped + self.sigma * rng.standard_normal(np.shape(clipped))

    def variance(self, x):
        return np.full(np.shape(self._clip(x)), self.sigma**2)

    @property
    def max_variance(self) -> float:
        return self.sigma**2


@dataclass(frozen=True)
class LaplaceMechanism(_ClippingMechanism):
    r"""epsilon-LDP Laplace mechanism on [-b, b]^d.

    Releases clip(x) + Laplace(scale) noise per coordinate with
    scale = 2 b d / epsilon (L1 sensitivity 2bd); variance 2 scale^2 for every input.

    Examples
    --------
    >>> LaplaceMechanism(1.0, 0.5).max_variance
    2.0
    """

    epsilon: float
    b: float
    d: int = 1

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_positive_scalar(self.epsilon, "epsilon"))
        object.__setattr__(self, "b", check_positive_scalar(self.b, "b"))
        object.__setattr__(self, "d", check_int_scalar(self.d, "d", minimum=1))

    @property
    def scale(self) -> float:
        """Laplace scale 2bd/epsilon."""
        return 2.0 * self.b * self.d / self.epsilon

    @property
    def privacy(self):
        return PrivacyGuarantee(self.epsilon)

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        clipped = self._clip(x)
        return clipped + rng.laplace(0.0, self.scale, np.shape(clipped))

    def variance(self, x):
        return np.full(np.shape(self._clip(x)), 2.0 * self.scale**2)

    @property
    def max_variance(self) -> float:
        return 2.0 * self.scale**2


def _check_unit_interval(x, name="x"):
    x = check_finite_array(x, name, ndim=(0, 1), min_len=0)
    if np.any((x < 0) | (x > 1)):
        raise ValueError(f"{name} must lie in [0, 1] (it has values outside)")
    return x


@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    r"""Debiased randomized response on bits: epsilon-LDP, unbiased.

    A bit is kept with probability e^eps/(e^eps + 1) and flipped otherwise; the
    release is debiased to (y - p)/(1 - 2p), p = 1/(e^eps + 1), i.e. one of
    -1/(e^eps - 1) and e^eps/(e^eps - 1). Variance e^eps/(e^eps - 1)^2.
    Inputs other than 0 and 1 raise ``ValueError``.
    """

    epsilon: float

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_positive_scalar(self.epsilon, "epsilon"))

    @property
    def privacy(self):
        return PrivacyGuarantee(self.epsilon)

    # Written with e^-eps so that large epsilon (no privacy) does not overflow.
    @property
    def outputs(self):
        """The two possible releases (low, high) = (-1/(e^eps - 1), e^eps/(e^eps - 1))."""
        t = math.exp(-self.epsilon)
        return -t / (1.0 - t), 1.0 / (1.0 - t)

    def prob_high(self, x):
        """P(release = high) for input x in [0, 1]: 1/(e^eps+1) + x (e^eps-1)/(e^eps+1)."""
        t = math.exp(-self.epsilon)
        return (t + np.asarray(x) * (1.0 - t)) / (1.0 + t)

    def _inputs(self, x):
        x = check_finite_array(x, "x", ndim=(0, 1), min_len=0)
        if np.any((x != 0) & (x != 1)):
            raise ValueError("randomized response takes bits: x must be 0 or 1")
        return x

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        x = self._inputs(x)
        low, high = self.outputs
        return np.where(rng.random(np.shape(x)) < self.prob_high(x), high, low)

    def variance(self, x):
        return np.full(np.shape(self._inputs(x)), self.max_variance)

    @property
    def max_variance(self) -> float:
        t = math.exp(-self.epsilon)
        return t / (1.0 - t) ** 2


@dataclass(frozen=True)
class BinaryMechanism(RandomizedResponse):
    r"""The paper's two-point mechanism q_priv of eq. (7) on [0, 1] (spec C.7).

    Releases e^eps/(e^eps - 1) with probability 1/(e^eps + 1) + x (e^eps - 1)/(e^eps + 1),
    else -1/(e^eps - 1). Unbiased and epsilon-LDP: the likelihood ratio of
    either output between any two inputs is at most e^eps, with equality at
    x = 0 versus x = 1. Exact variance e^eps/(e^eps - 1)^2 + x(1 - x).

    Notes
    -----
    It is randomized response applied to one Bernoulli(x) draw, so the law of
    its release depends on the inputs only through their mean: a server that
    sees q_priv(xbar_l) of many clients cannot learn the spread of the p_l
    (spec [!5]d). Inputs outside [0, 1] raise ``ValueError``.

    Examples
    --------
    >>> q = BinaryMechanism(1.0)
    >>> float(q.variance(0.5)) == q.max_variance
    True
    """

    def _inputs(self, x):
        return _check_unit_interval(x)

    def variance(self, x):
        x = self._inputs(x)
        return super().max_variance + x * (1.0 - x)

    @property
    def max_variance(self) -> float:
        return super().max_variance + 0.25

    def likelihood_ratio_bound(self, x, x_other):
        """Largest ratio P(out | x) / P(out | x_other) over the two outputs."""
        p, p_other = self.prob_high(self._inputs(x)), self.prob_high(self._inputs(x_other))
        return np.maximum(p / p_other, (1.0 - p) / (1.0 - p_other))
