r"""Unbiased communication and local-privacy mechanisms with exact variances.

Each mechanism is a small frozen object: ``privatize(x, rng)`` maps every
client's value (vectorized over clients) to what the client sends,
``variance(x)`` gives the exact per-coordinate variance of that message for
the input ``x``, and ``max_variance`` its supremum over the domain (the
:math:`\sigma_q^2` of Theorem 2). Mechanisms with a bounded domain say how they treat
inputs outside it: the quantizer, the Gaussian and the Laplace mechanisms clip
to :math:`[-b, b]` (count with ``n_clipped(x)``); the binary mechanism and randomized
response raise.

Every ``privacy`` attribute is a guarantee the release really has, for the
whole released vector; where a calibration does not deliver what was asked
for (the paper's Gaussian calibration), construction warns with
:class:`PrivacyWarning` and ``privacy`` reports what is delivered.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special

from ebfl._validation import (
    as_generator,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)

__all__ = [
    "BinaryMechanism",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "PrivacyGuarantee",
    "PrivacyWarning",
    "RandomizedResponse",
    "StochasticQuantizer",
    "analytic_gaussian_delta",
    "paper_clip_range",
]

#: Accepted range of epsilon for every mechanism. Below it the noise variance
#: (about 1/epsilon^2) leaves float64; above it nothing changes any more.
EPSILON_RANGE = (1e-150, 1e150)
#: Accepted range of the half-width b: b^2 and the quantizer's step stay normal floats.
B_RANGE = (1e-150, 1e150)
#: Largest dimension d (exactly representable as a float).
MAX_DIM = 2**53
#: Largest number of quantizer bits: beyond 52 the levels are closer than float64 resolves.
MAX_K_BITS = 52


class PrivacyWarning(UserWarning):
    """A mechanism delivers a weaker privacy guarantee than the one requested."""


@dataclass(frozen=True)
class PrivacyGuarantee:
    r"""Local differential privacy of one release: :math:`(\epsilon, \delta)`-LDP.

    :math:`\delta = 0`: pure :math:`\epsilon`-LDP.
    """

    epsilon: float
    delta: float = 0.0

    @property
    def pure(self) -> bool:
        r"""True for :math:`\epsilon`-LDP (:math:`\delta = 0`)."""
        return self.delta == 0.0


# ----------------------------------------------------------------------------- validation




def _check_delta(delta):
    delta = check_positive_scalar(delta, "delta")
    if not delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return delta


def _check_epsilon(epsilon):
    epsilon = check_positive_scalar(epsilon, "epsilon")
    lo, hi = EPSILON_RANGE
    if not lo <= epsilon <= hi:
        raise ValueError(f"epsilon must lie in [{lo:g}, {hi:g}], got {epsilon!r}")
    return epsilon


def _check_b(b):
    b = check_positive_scalar(b, "b")
    lo, hi = B_RANGE
    if not lo <= b <= hi:
        raise ValueError(f"b must lie in [{lo:g}, {hi:g}], got {b!r}")
    return b


def _check_dim(d):
    d = check_int_scalar(d, "d", minimum=1)
    if d > MAX_DIM:
        raise ValueError(f"d must be an integer in [1, 2**53], got {d}")
    return d


def _check_noise_variance(variance, arguments):
    """Refuse a noise variance that overflows float64 (naming the arguments that set it)."""
    if not math.isfinite(variance):
        raise ValueError(f"the noise variance overflows float64 for {arguments}: use a larger "
                         f"epsilon or a smaller b (or d)")
    return variance


# ----------------------------------------------------------------------------- interface


class Mechanism(ABC):
    """Interface of every mechanism (see the module docstring)."""

    #: None for a mechanism that only compresses (no privacy).
    privacy: PrivacyGuarantee | None = None

    @abstractmethod
    def privatize(self, x, rng=None):
        """The messages :math:`q(x)` for an array of inputs (one per client, or (m, d))."""

    @abstractmethod
    def variance(self, x):
        """Exact per-coordinate variance of :math:`q(x)` for each input x."""

    @property
    @abstractmethod
    def max_variance(self) -> float:
        r"""Supremum of ``variance`` over the domain: :math:`\sigma_q^2` of Theorem 2."""

    def square_variance_excess(self, input_variance):
        r"""Upper bound on what the noise adds to :math:`\operatorname{Var}((q(x) - \mu)^2)`.

        Per coordinate.

        For inputs x of variance v = ``input_variance`` and mean :math:`\mu`, this bounds
        :math:`\operatorname{Var}((q(x) - \mu)^2) - \operatorname{Var}((x - \mu)^2)`, so
        that the sample variance of m
        messages has about this much more variance (divided by m) than that of
        the inputs. The private estimators use it for the standard error of
        their population-variance estimate. None when unknown (the default);
        the estimators then estimate that standard error from the messages.
        ``input_variance`` is a finite real >= 0, or an array of them.
        """
        return None


def _check_input_variance(v):
    """``square_variance_excess``'s argument: finite variances >= 0 (any shape)."""
    v = check_finite_array(v, "input_variance", min_len=0)
    if np.any(v < 0):
        raise ValueError("input_variance must be >= 0 (a variance)")
    return v


def _bounded_noise_excess(v, noise_var, noise_bound):
    r"""Var((x+e-mu)^2) - Var((x-mu)^2) <= 6 v s^2 + 4 D s^2 sqrt(v) + D^2 s^2.

    For noise e with E[e | x] = 0, E[e^2 | x] <= s^2 and |e| <= D: expanding,
    the excess is 6E[(x-mu)^2 e^2] - 2 v E e^2 + E e^4 - (E e^2)^2 + 4E[(x-mu) e^3];
    drop the negative terms and bound |e|^3 <= D e^2, e^4 <= D^2 e^2.
    """
    v, noise_var, noise_bound = (_check_input_variance(v), np.float64(noise_var),
                                 np.float64(noise_bound))
    with np.errstate(over="ignore"):   # +inf: the noise swamps everything
        return 6.0 * v * noise_var + 4.0 * noise_bound * noise_var * np.sqrt(v) + (
            noise_bound**2 * noise_var)


def _independent_noise_excess(v, noise_var, kurtosis):
    """Var((x+e-mu)^2) - Var((x-mu)^2) = 4 v s^2 + (kurtosis - 1) s^4 for e independent of x."""
    v, noise_var = _check_input_variance(v), np.float64(noise_var)
    with np.errstate(over="ignore"):   # +inf: the noise swamps everything
        return 4.0 * v * noise_var + (kurtosis - 1.0) * noise_var**2


class _ClippingMechanism(Mechanism):
    """Mechanisms on [-b, b]^d that clip their input coordinate-wise."""

    b: float

    def _clip(self, x):
        x = check_finite_array(x, "x", ndim=(0, 1, 2), min_len=0)
        return np.clip(x, -self.b, self.b)

    def n_clipped(self, x):
        """Number of coordinates of ``x`` outside :math:`[-b, b]` (clipped before release)."""
        x = check_finite_array(x, "x", ndim=(0, 1, 2), min_len=0)
        return int(np.count_nonzero(np.abs(x) > self.b))


# ----------------------------------------------------------------------------- quantizer


@dataclass(frozen=True)
class StochasticQuantizer(_ClippingMechanism):
    r"""k-bit unbiased stochastic quantizer on :math:`[-b, b]` (Theorem 2 part 1).

    The input is clipped to :math:`[-b, b]` and rounded at random to one of the
    :math:`2^k` levels :math:`-b + j\Delta`, :math:`\Delta = 2b/(2^k - 1)`, so that
    :math:`E\,q(x) = x` for every :math:`x \in [-b, b]`. The exact variance is
    :math:`\Delta^2 f (1 - f)`, f the fractional position of x between its two levels,
    at most :math:`b^2/(2^k - 1)^2`.

    Parameters
    ----------
    k_bits : int
        Bits per coordinate, in [1, 52] (finer grids are below float64 resolution).
    b : float
        Half-width of the range, in [1e-150, 1e150] (the paper's choice:
        :func:`paper_clip_range`).

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
        k_bits = check_int_scalar(self.k_bits, "k_bits", minimum=1)
        if k_bits > MAX_K_BITS:
            raise ValueError(f"k_bits must be an integer in [1, {MAX_K_BITS}] (finer levels "
                             f"are not representable in float64), got {k_bits}")
        object.__setattr__(self, "k_bits", k_bits)
        object.__setattr__(self, "b", _check_b(self.b))

    @property
    def step(self) -> float:
        r"""Distance :math:`\Delta = 2b/(2^k - 1)` between levels."""
        return 2.0 * self.b / (2**self.k_bits - 1)

    @property
    def levels(self) -> np.ndarray:
        """The :math:`2^k` output values (listed for k_bits <= 24 only)."""
        if self.k_bits > 24:
            raise ValueError(f"levels lists 2^k_bits values; it is available for k_bits <= 24, "
                             f"got k_bits={self.k_bits}")
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

    def square_variance_excess(self, input_variance):
        r"""The bound of :meth:`Mechanism.square_variance_excess` for bounded noise e.

        Here :math:`E[e \mid x] = 0`, :math:`\operatorname{Var}(e \mid x) \le \Delta^2/4`
        and :math:`|e| \le \Delta`.
        """
        return _bounded_noise_excess(input_variance, self.max_variance, self.step)


def paper_clip_range(r, m, n, sigma_theta, sigma_x):
    r"""The paper's clipping half-width b (Theorem 2).

    .. math:: b = r + \Big(\sigma_\theta + \frac{\sigma_x}{\sqrt n}\Big)\sqrt{\log(m^2 n)}

    Chosen so that every client mean lies in :math:`[-b, b]` with high probability
    when :math:`\mu` lies in :math:`[-r, r]` (Theorem 2; the paper's failure probability
    :math:`2/(mn)` is optimistic, errata [!4]).

    Raises ``ValueError`` when b would overflow float64.

    Examples
    --------
    >>> round(paper_clip_range(1.0, 10_000, 15, 0.1, 0.5), 4)
    2.0531
    """
    r = check_nonnegative_scalar(r, "r")
    m = check_int_scalar(m, "m", minimum=2)
    n = check_int_scalar(n, "n", minimum=1)
    sigma_theta = check_nonnegative_scalar(sigma_theta, "sigma_theta")
    sigma_x = check_positive_scalar(sigma_x, "sigma_x")
    # math.log takes Python ints of any size; math.sqrt does not (OverflowError).
    inv_sqrt_n = 1.0 / math.sqrt(n) if n <= MAX_DIM else math.exp(-0.5 * math.log(n))
    b = r + (sigma_theta + sigma_x * inv_sqrt_n) * math.sqrt(math.log(m * m * n))
    if not math.isfinite(b):
        raise ValueError(f"the clipping half-width overflows float64 for r={r!r}, "
                         f"sigma_theta={sigma_theta!r}, sigma_x={sigma_x!r}")
    return b


# ----------------------------------------------------------------------------- Gaussian


def _log_delta(epsilon, z):
    """log delta(epsilon) of N(0, (z D)^2) noise at L2 sensitivity D (-inf when delta = 0).

    delta = Phi(A) - e^eps Phi(B), A = 1/(2z) - eps z, B = -1/(2z) - eps z
    (Balle & Wang 2018, Thm 8), written as Phi(A) (1 - exp(eps + log Phi(B) - log Phi(A)))
    so that neither e^eps overflows nor the difference of two tiny numbers cancels.
    """
    with np.errstate(over="ignore", divide="ignore"):
        half_inv, shift = 0.5 / z, epsilon * z
        log_a = float(special.log_ndtr(half_inv - shift))
        log_b = float(special.log_ndtr(-half_inv - shift))
    if log_a == -math.inf:
        return -math.inf
    w = epsilon + log_b - log_a        # <= 0: delta >= 0
    if w >= 0.0:
        return -math.inf
    return log_a + math.log(-math.expm1(w))


def analytic_gaussian_delta(epsilon, noise_multiplier):
    r"""Exact :math:`\delta(\varepsilon)` of the Gaussian mechanism (Balle & Wang 2018, Theorem 8).

    Adding :math:`N(0, \sigma^2 I)` to a function of L2 sensitivity D is
    :math:`(\varepsilon, \delta)`-DP exactly for

    .. math:: \delta(\varepsilon) = \Phi\Big(\frac{1}{2z} - \varepsilon z\Big)
              - e^{\varepsilon}\,\Phi\Big(-\frac{1}{2z} - \varepsilon z\Big),
              \qquad z = \sigma / D,

    and for no smaller :math:`\delta`.

    Parameters
    ----------
    epsilon : float
        > 0.
    noise_multiplier : float
        :math:`z = \sigma / D`, > 0.

    Returns
    -------
    float
        :math:`\delta` in [0, 1] (0 when it underflows).

    Examples
    --------
    The paper's calibration :math:`\sigma = \frac{b}{\varepsilon}\sqrt{8 \log(2/\delta)}`
    for a 4-vector (D = 4b) at :math:`\varepsilon = 0.5`, :math:`\delta = 10^{-5}`:

    >>> z = math.sqrt(8 * math.log(2e5)) / 0.5 / 4
    >>> f"{analytic_gaussian_delta(0.5, z):.2g}"
    '0.00057'
    """
    epsilon = check_positive_scalar(epsilon, "epsilon")
    z = check_positive_scalar(noise_multiplier, "noise_multiplier")
    return math.exp(_log_delta(epsilon, z))


def _analytic_gaussian_sigma(sensitivity, epsilon, delta):
    """Smallest sigma for which N(0, sigma^2) noise is (epsilon, delta)-DP (Balle & Wang 2018).

    delta(z) decreases in z = sigma/D: bracket the root of log delta(z) - log delta
    by doubling from the classical z = sqrt(2 log(1.25/delta))/epsilon, solve on
    log z, then step up until delta(z) <= delta holds in floating point.
    """
    target = math.log(delta)

    def excess(log_z):
        return _log_delta(epsilon, math.exp(log_z)) - target

    guess = math.log(math.sqrt(2.0 * math.log(1.25 / delta))) - math.log(epsilon)
    lo, hi = guess - 1.0, guess + 1.0
    while excess(lo) <= 0:
        lo -= 2.0 * (guess - lo) + 1.0
    while excess(hi) > 0:
        hi += 2.0 * (hi - guess) + 1.0
    log_z = optimize.brentq(excess, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    while excess(log_z) > 0:       # keep the guarantee on the safe side of the root
        log_z = np.nextafter(log_z, math.inf)
    return math.exp(log_z) * sensitivity


@dataclass(frozen=True)
class GaussianMechanism(_ClippingMechanism):
    r"""User-level Gaussian mechanism on :math:`[-b, b]^d`, truly :math:`(\epsilon, \delta)`-LDP.

    Releases :math:`\operatorname{clip}(x) + N(0, \sigma^2 I_d)`; the variance is
    :math:`\sigma^2` for every input, so Theorem 2 holds with equality. The released
    vector has L2 sensitivity :math:`D = 2b\sqrt d`.

    Parameters
    ----------
    epsilon : float
        In [1e-150, 1e150].
    delta : float
        In (0, 1).
    b : float
        Half-width of the input range, in [1e-150, 1e150].
    d : int, default=1
        Dimension of each client's message.
    calibration : {"paper", "l2"}, default="paper"
        ``"paper"``: :math:`\sigma = \frac{b}{\epsilon}\sqrt{8 \log(2/\delta)}`, Theorem 2
        part 2's calibration for one coordinate of sensitivity 2b. It ignores that all
        d coordinates are released and is loose only for :math:`\epsilon < 1`, so it
        often does not give the requested :math:`(\epsilon, \delta)`: construction then
        warns (:class:`PrivacyWarning`) and ``privacy`` reports the :math:`\delta` it
        really delivers at this :math:`\epsilon` (``true_delta``).
        ``"l2"``: the tight analytic calibration (Balle & Wang 2018) for the
        L2 sensitivity :math:`2b\sqrt d`, valid for every :math:`\epsilon`; ``privacy``
        is exactly the requested :math:`(\epsilon, \delta)`.

    Attributes
    ----------
    true_delta : float
        :math:`\delta(\epsilon)` of the release by the analytic Gaussian formula
        (:func:`analytic_gaussian_delta` at :math:`z = \sigma / D`).
    privacy : PrivacyGuarantee
        :math:`(\epsilon, \max(\delta, \delta_{\text{true}}))`: always a guarantee the
        release has.

    Warns
    -----
    PrivacyWarning
        ``calibration="paper"`` with true_delta > delta.

    Examples
    --------
    One coordinate at :math:`\epsilon = 1`: the paper's :math:`\sigma` is enough.

    >>> g = GaussianMechanism(1.0, 1e-5, 2.0531)
    >>> round(g.sigma ** 2, 1), g.privacy.delta
    (411.6, 1e-05)

    A 4-vector at :math:`\epsilon = 3`: it is not, and ``privacy`` says so.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", PrivacyWarning)
    ...     g = GaussianMechanism(3.0, 1e-5, 1.0, d=4)
    >>> f"{g.privacy.delta:.3g}"
    '0.0103'
    """

    epsilon: float
    delta: float
    b: float
    d: int = 1
    calibration: str = "paper"
    true_delta: float = field(init=False, repr=False, compare=False)
    _sigma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))
        object.__setattr__(self, "b", _check_b(self.b))
        object.__setattr__(self, "d", _check_dim(self.d))
        check_choice(self.calibration, "calibration", ("paper", "l2"))
        if self.calibration == "paper":
            sigma = self.b / self.epsilon * math.sqrt(8.0 * math.log(2.0 / self.delta))
        else:
            sigma = _analytic_gaussian_sigma(self.sensitivity, self.epsilon, self.delta)
        _check_noise_variance(sigma**2 if math.isfinite(sigma) else math.inf,
                              f"epsilon={self.epsilon!r}, delta={self.delta!r}, b={self.b!r}, "
                              f"d={self.d}")
        object.__setattr__(self, "_sigma", sigma)
        true_delta = math.exp(_log_delta(self.epsilon, sigma / self.sensitivity))
        object.__setattr__(self, "true_delta", true_delta)
        if self.calibration == "paper" and true_delta > self.delta:
            warnings.warn(
                f"GaussianMechanism(calibration='paper', epsilon={self.epsilon:g}, "
                f"delta={self.delta:g}, d={self.d}): the paper's sigma gives the released "
                f"vector (L2 sensitivity 2b sqrt(d)) only (epsilon, {true_delta:.3g})-LDP; "
                f"privacy reports that. Use calibration='l2' for the requested guarantee.",
                PrivacyWarning, stacklevel=3)

    @property
    def sensitivity(self) -> float:
        r"""L2 sensitivity :math:`2b\sqrt d` of the released vector (whatever the calibration)."""
        return 2.0 * self.b * math.sqrt(self.d)

    @property
    def sigma(self) -> float:
        """Noise standard deviation per coordinate."""
        return self._sigma

    @property
    def privacy(self):
        if self.calibration == "l2":   # calibrated so that true_delta <= delta (see above)
            return PrivacyGuarantee(self.epsilon, self.delta)
        return PrivacyGuarantee(self.epsilon, max(self.delta, self.true_delta))

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        clipped = self._clip(x)
        return clipped + self.sigma * rng.standard_normal(np.shape(clipped))

    def variance(self, x):
        return np.full(np.shape(self._clip(x)), self.sigma**2)

    @property
    def max_variance(self) -> float:
        return self.sigma**2

    def square_variance_excess(self, input_variance):
        r""":math:`4 v \sigma^2 + 2 \sigma^4` (Gaussian noise independent of the clipped input)."""
        return _independent_noise_excess(input_variance, self.max_variance, 3.0)


# ----------------------------------------------------------------------------- Laplace


@dataclass(frozen=True)
class LaplaceMechanism(_ClippingMechanism):
    r""":math:`\epsilon`-LDP Laplace mechanism on :math:`[-b, b]^d`.

    Releases :math:`\operatorname{clip}(x) + \operatorname{Laplace}(s)` noise per
    coordinate with scale :math:`s = 2bd/\epsilon` (L1 sensitivity 2bd); variance
    :math:`2 s^2` for every input. :math:`\epsilon \in [10^{-150}, 10^{150}]`,
    :math:`b \in [10^{-150}, 10^{150}]`, :math:`d \in [1, 2^{53}]`; combinations whose
    variance overflows float64 raise ``ValueError``.

    Examples
    --------
    >>> LaplaceMechanism(1.0, 0.5).max_variance
    2.0
    """

    epsilon: float
    b: float
    d: int = 1

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        object.__setattr__(self, "b", _check_b(self.b))
        object.__setattr__(self, "d", _check_dim(self.d))
        _check_noise_variance(self.max_variance, f"epsilon={self.epsilon!r}, b={self.b!r}, "
                                                 f"d={self.d}")

    @property
    def scale(self) -> float:
        r"""Laplace scale :math:`2bd/\epsilon`."""
        return 2.0 * self.b * float(self.d) / self.epsilon

    @property
    def privacy(self):
        return PrivacyGuarantee(self.epsilon)

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        clipped = self._clip(x)
        return clipped + rng.laplace(0.0, self.scale, np.shape(clipped))

    def variance(self, x):
        return np.full(np.shape(self._clip(x)), self.max_variance)

    @property
    def max_variance(self) -> float:
        with np.errstate(over="ignore"):
            return float(2.0 * np.float64(self.scale) ** 2)

    def square_variance_excess(self, input_variance):
        """:math:`4 v s^2 + 5 s^4` (Laplace noise, kurtosis 6, independent of the clipped input)."""
        return _independent_noise_excess(input_variance, self.max_variance, 6.0)


# ----------------------------------------------------------------------------- bits


def _check_unit_interval(x, name="x"):
    x = check_finite_array(x, name, ndim=(0, 1), min_len=0)
    if np.any((x < 0) | (x > 1)):
        raise ValueError(f"{name} must lie in [0, 1] (it has values outside)")
    return x


#: Bits per stage of the staged Bernoulli sampler: P(U < 2^-32) is exact for
#: numpy's uniforms, which are multiples of 2^-53.
_STAGE_BITS = 32


def _flip_stages(log_p):
    """Split p = exp(log_p) as r 2^-K, r in (1/2, 1]; never below p.

    -log2 p is shrunk by 4 ulps and r rounded up, so the realized probability
    is at least p despite rounding (never less private than claimed).
    """
    bits = max(-log_p / math.log(2.0) * (1.0 - 4.0 * np.finfo(float).eps), 0.0)
    whole = math.floor(bits)
    r = float(np.nextafter(2.0 ** -(bits - whole), 2.0))
    return min(r, 1.0), whole


def _bernoulli_from_log(log_p, size, rng):
    """``size`` independent Bernoulli(p) draws for p = exp(log_p), however small p is.

    ``rng.random() < p`` cannot realize p < 2^-53 (numpy's uniforms are
    multiples of 2^-53), and e^-eps underflows for eps > 745. Instead draw
    U < r and then K independent halvings in stages U < 2^-32 (exact), only
    for the draws still alive: P = r 2^-K = p, at any epsilon.
    """
    r, remaining = _flip_stages(log_p)
    alive = rng.random(size) < r
    while remaining > 0:
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        step = min(_STAGE_BITS, remaining)
        alive[idx] = rng.random(idx.size) < math.ldexp(1.0, -step)
        remaining -= step
    return alive


@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    r"""Debiased randomized response on bits: :math:`\epsilon`-LDP, unbiased.

    A bit is flipped with probability :math:`p = 1/(e^\epsilon + 1)` and kept
    otherwise; the release is debiased to :math:`(y - p)/(1 - 2p)`, i.e. one of
    :math:`-1/(e^\epsilon - 1)` and :math:`e^\epsilon/(e^\epsilon - 1)`. Variance
    :math:`e^\epsilon/(e^\epsilon - 1)^2`. Inputs other than 0 and 1 raise ``ValueError``.

    The flip is drawn with its true probability at every :math:`\epsilon` in
    :math:`[10^{-150}, 10^{150}]`, even where p is below :math:`2^{-53}` or underflows
    (staged draws, never rounded down), so the release is never deterministic.

    Examples
    --------
    >>> rr = RandomizedResponse(math.log(3.0))
    >>> [round(v, 12) for v in rr.outputs], round(rr.flip_probability, 12)
    ([-0.5, 1.5], 0.25)
    """

    epsilon: float

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))

    @property
    def privacy(self):
        return PrivacyGuarantee(self.epsilon)

    @property
    def flip_probability(self) -> float:
        r"""The flip probability :math:`p = 1/(e^\epsilon + 1)`.

        It underflows to 0 for :math:`\epsilon > 745`; sampling does not.
        """
        return float(special.expit(-self.epsilon))

    # Written with e^-eps and expm1 so that neither large nor tiny epsilon overflows.
    @property
    def outputs(self):
        r"""The two possible releases (low, high).

        .. math:: \Big(\frac{-1}{e^\epsilon - 1}, \frac{e^\epsilon}{e^\epsilon - 1}\Big)
        """
        t, one_minus_t = math.exp(-self.epsilon), -math.expm1(-self.epsilon)
        return -t / one_minus_t, 1.0 / one_minus_t

    def prob_high(self, x):
        r"""P(release = high) for input :math:`x \in [0, 1]`.

        It is :math:`p + x (1 - 2p)`, with :math:`1 - 2p = \tanh(\epsilon/2)`.
        """
        x = _check_unit_interval(x)
        return self.flip_probability + x * math.tanh(self.epsilon / 2.0)

    def _log_prob_high(self, x):
        with np.errstate(divide="ignore"):
            return np.logaddexp(-np.logaddexp(0.0, self.epsilon),
                                np.log(x) + math.log(math.tanh(self.epsilon / 2.0)))

    def _inputs(self, x, name="x"):
        x = check_finite_array(x, name, ndim=(0, 1), min_len=0)
        if np.any((x != 0) & (x != 1)):
            raise ValueError(f"randomized response takes bits: {name} must be 0 or 1")
        return x

    def _bits(self, x, rng):
        return x == 1

    def privatize(self, x, rng=None):
        rng = as_generator(rng)
        x = self._inputs(x)
        bits = np.asarray(self._bits(x, rng)).reshape(-1)
        flips = _bernoulli_from_log(-float(np.logaddexp(0.0, self.epsilon)), bits.size, rng)
        low, high = self.outputs
        return np.where(bits ^ flips, high, low).reshape(np.shape(x))

    def variance(self, x):
        return np.full(np.shape(self._inputs(x)), self.max_variance)

    @property
    def max_variance(self) -> float:
        t, one_minus_t = math.exp(-self.epsilon), -math.expm1(-self.epsilon)
        return t / one_minus_t**2

    def log_likelihood_ratio_bound(self, x, x_other):
        r"""Largest :math:`\log P(y \mid x) - \log P(y \mid x')` over the two outputs y.

        :math:`P(\text{high} \mid x) = p + x \tanh(\epsilon/2)` and
        :math:`P(\text{low} \mid x) = P(\text{high} \mid 1 - x)`, :math:`p = 1/(e^\epsilon+1)`;
        :math:`x'` is ``x_other``.
        """
        x, x_other = self._inputs(x), self._inputs(x_other, "x_other")
        try:
            np.broadcast_shapes(x.shape, x_other.shape)
        except ValueError:
            raise ValueError(f"x and x_other must have broadcastable shapes, got {x.shape} "
                             f"and {x_other.shape}") from None
        high = self._log_prob_high(x) - self._log_prob_high(x_other)
        low = self._log_prob_high(1.0 - x) - self._log_prob_high(1.0 - x_other)
        return np.maximum(high, low)

    def likelihood_ratio_bound(self, x, x_other):
        r"""Largest ratio :math:`P(y \mid x) / P(y \mid x')` over the two outputs y.

        :math:`x'` is ``x_other``. Overflows to inf for :math:`\epsilon > 709`; use
        :meth:`log_likelihood_ratio_bound` there.
        """
        with np.errstate(over="ignore"):
            return np.exp(self.log_likelihood_ratio_bound(x, x_other))

    def square_variance_excess(self, input_variance):
        r"""The bound of :meth:`Mechanism.square_variance_excess` for bounded noise e.

        Here :math:`E[e \mid x] = 0`, :math:`\operatorname{Var}(e \mid x)` is at most
        ``max_variance``, and the randomized-response noise satisfies
        :math:`|e| \le 1/(1 - e^{-\epsilon})`.
        """
        return _bounded_noise_excess(input_variance, self.max_variance,
                                     -1.0 / math.expm1(-self.epsilon))


@dataclass(frozen=True)
class BinaryMechanism(RandomizedResponse):
    r"""The paper's two-point mechanism :math:`q_{\text{priv}}` of equation (7) on [0, 1].

    Releases :math:`\frac{e^\epsilon}{e^\epsilon - 1}` with probability
    :math:`\frac{1}{e^\epsilon + 1} + x \frac{e^\epsilon - 1}{e^\epsilon + 1}`, else
    :math:`\frac{-1}{e^\epsilon - 1}`. Unbiased and :math:`\epsilon`-LDP: the likelihood
    ratio of either output between any two inputs is at most :math:`e^\epsilon`, with
    equality at x = 0 versus x = 1. Exact variance
    :math:`\frac{e^\epsilon}{(e^\epsilon - 1)^2} + x(1 - x)`.

    Notes
    -----
    It is randomized response applied to one Bernoulli(x) draw, and is
    sampled that way: the flip has its exact probability at any epsilon (see
    :class:`RandomizedResponse`). The law of its release depends on the
    inputs only through their mean: a server that sees :math:`q_{\text{priv}}(\bar x_l)`
    of many clients cannot learn the spread of the :math:`p_l`. Inputs outside
    [0, 1] raise ``ValueError``.

    Examples
    --------
    >>> q = BinaryMechanism(1.0)
    >>> float(q.variance(0.5)) == q.max_variance
    True
    """

    def _inputs(self, x, name="x"):
        return _check_unit_interval(x, name)

    def _bits(self, x, rng):
        return rng.random(np.shape(x)) < x

    def variance(self, x):
        x = self._inputs(x)
        return super().max_variance + x * (1.0 - x)

    @property
    def max_variance(self) -> float:
        return super().max_variance + 0.25
