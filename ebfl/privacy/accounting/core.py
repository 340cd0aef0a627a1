"""The accounting core: one set of limits, one RDP conversion, one PLD guard, one noise search.

Every accountant of ebfl (DP-FedAvg and FedHDP's groups, DP-AdaPeD, DP-PFL's
rigorous accountant) checks its arguments with the validators below, so the
same argument is accepted or refused in the same words everywhere; converts
RDP curves with :func:`rdp_to_epsilon` / :func:`rdp_to_delta`; guards its PLD
grids with :func:`check_pld_points`; and finds noise for a target epsilon with
:class:`NoiseSearch`. The RDP of the mechanisms themselves (the Gaussian, the
Poisson-subsampled Gaussian, their compositions) is in
:mod:`ebfl.privacy.accounting.rdp`, and :class:`~ebfl.privacy.accounting.Accountant`
records mechanism events and answers epsilon(delta) and delta(epsilon).

Accepted ranges (outside them ``ValueError`` names the argument and the range):

==============================  ==========================================
delta                           (0, 1)
epsilon                         > 0, finite
noise multiplier                [1e-3, 1e8]
Renyi orders                    (1, 1e6], at most 10,000 of them
value_discretization_interval   [1e-8, 1] (PLD grid step; default 1e-4)
PLD grid                        at most 2e6 points (about 0.4 to 0.8 GB)
==============================  ==========================================
"""

from __future__ import annotations

import contextlib
import logging
import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from ebfl._validation import (
    as_real_array,
    check_choice,
    check_finite_array,
    check_positive_scalar,
    check_real_scalar,
)

__all__ = [
    "CONVERSIONS",
    "DEFAULT_ORDERS",
    "DEFAULT_VDI",
    "MAX_N_ORDERS",
    "MAX_ORDER",
    "MAX_PLD_POINTS",
    "NOISE_MULTIPLIER_RANGE",
    "VDI_RANGE",
    "NoiseSearch",
    "check_delta",
    "check_epsilon",
    "check_noise_multiplier",
    "check_orders",
    "check_pld_points",
    "check_sampling_rate",
    "check_vdi",
    "gaussian_pld_points",
    "pld_points_refusal",
    "quiet_absl",
    "rdp_to_delta",
    "rdp_to_epsilon",
    "rdp_to_epsilon_and_order",
]

#: RDP orders used when none are given (dp-accounting's default grid, from 1.25 to 1024).
DEFAULT_ORDERS = tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
#: Accepted noise multipliers (noise standard deviation over the L2 sensitivity).
NOISE_MULTIPLIER_RANGE = (1e-3, 1e8)
#: Largest Renyi order, and most orders, accepted (each fractional order below 2 of a
#: sampled Gaussian costs a quadrature, about a millisecond).
MAX_ORDER = 1e6
MAX_N_ORDERS = 10_000
#: Accepted PLD discretization intervals, and the default (epsilon stable to about 1e-5).
VDI_RANGE = (1e-8, 1.0)
DEFAULT_VDI = 1e-4
#: Largest PLD grid accepted, in points: measured 200 to 420 bytes a point at the peak of
#: dp-accounting's composition.
MAX_PLD_POINTS = 2e6
#: RDP -> (epsilon, delta) conversions: Balle et al. (2020, Prop. 12), the "Lemma 2" of the
#: DP-AdaPeD paper and TensorFlow Privacy's since 2020; Mironov (2017, Prop. 3).
CONVERSIONS = ("improved", "classic")


@contextlib.contextmanager
def quiet_absl():
    """Silence dp-accounting's absl log lines below ERROR for the duration.

    Its RDP accountant logs every fractional order whose series does not
    converge (hundreds of lines at large sampling rates) and leaves it out,
    which can only raise epsilon.
    """
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# --------------------------------------------------------------------------- validators


def check_delta(delta, name="delta"):
    """delta in (0, 1), as a float."""
    return check_real_scalar(delta, name, low=0.0, high=1.0, low_open=True, high_open=True)


def check_epsilon(epsilon, name="epsilon"):
    """epsilon > 0 and finite, as a float."""
    return check_positive_scalar(epsilon, name)


def check_noise_multiplier(z, name="noise_multiplier"):
    """A noise multiplier in :data:`NOISE_MULTIPLIER_RANGE`, as a float."""
    lo, hi = NOISE_MULTIPLIER_RANGE
    return check_real_scalar(z, name, low=lo, high=hi)


def check_sampling_rate(q, name="sampling_rate"):
    """q in (0, 1], as a float."""
    return check_real_scalar(q, name, low=0.0, high=1.0, low_open=True)


def check_vdi(vdi, name="value_discretization_interval"):
    """A PLD grid step in :data:`VDI_RANGE`, as a float."""
    lo, hi = VDI_RANGE
    return check_real_scalar(vdi, name, low=lo, high=hi)


def check_orders(orders, default=DEFAULT_ORDERS):
    """Renyi orders as a float64 array: in (1, 1e6], 1 to 10,000 of them; None: ``default``."""
    if orders is None:
        return np.array(default, dtype=np.float64)
    try:
        orders = check_finite_array(orders, "orders", ndim=1)
    except OverflowError:
        raise ValueError(f"orders must all lie in (1, {MAX_ORDER:g}] (Renyi orders); got an "
                         "integer too large for float64") from None
    if orders.size > MAX_N_ORDERS:
        raise ValueError(f"orders must have at most {MAX_N_ORDERS} entries, got {orders.size}")
    if np.any(orders <= 1.0) or np.any(orders > MAX_ORDER):
        raise ValueError(f"orders must all lie in (1, {MAX_ORDER:g}] (Renyi orders), got "
                         f"values from {float(orders.min())!r} to {float(orders.max())!r}")
    return orders.astype(np.float64)


def _check_rdp(orders, rdp):
    orders = check_orders(orders)
    try:  # refuses complex values and text (np.asarray(..., float) would drop or parse them)
        rdp = as_real_array(rdp, "rdp")
    except OverflowError:
        raise ValueError("rdp must be >= 0 (+inf allowed); got an integer too large for "
                         "float64") from None
    if rdp.shape != orders.shape:
        raise ValueError(f"rdp must have the shape of orders {orders.shape}, got {rdp.shape}")
    if np.any(np.isnan(rdp)) or np.any(rdp < 0):
        raise ValueError("rdp must be >= 0 (+inf allowed) with no NaN")
    return orders, rdp


# --------------------------------------------------------------------------- conversions


def rdp_to_epsilon(orders, rdp, delta, *, conversion="improved"):
    r"""Smallest epsilon such that an RDP curve gives (epsilon, delta)-DP.

    Parameters
    ----------
    orders : array_like of shape (n_orders,)
        Renyi orders in (1, 1e6].
    rdp : array_like of shape (n_orders,)
        epsilon(alpha) at each order, >= 0 (+inf allowed).
    delta : float
        Target delta in (0, 1).
    conversion : {"improved", "classic"}, default="improved"
        ``"improved"``: Balle et al. (2020, Prop. 12), which the DP-AdaPeD
        paper prints as its Lemma 2,

        .. math:: \varepsilon = \min_\lambda \varepsilon(\lambda)
                  + \frac{\log(1/\delta) + (\lambda-1)\log(1-1/\lambda) - \log\lambda}
                         {\lambda-1}.

        ``"classic"``: Mironov's Proposition 3,
        min over lambda of epsilon(lambda) + log(1/delta)/(lambda - 1).

    Returns
    -------
    epsilon : float
        The minimum over the given orders (a valid bound; finer grids can only
        lower it).

    Notes
    -----
    ``"improved"`` is what ``dp_accounting.rdp.compute_epsilon`` implements
    (r + log1p(-1/a) - log(delta a)/(a - 1) is the same expression), so it is
    delegated to dp-accounting. The library adds two refinements that only
    help: orders in (1, 1.01] are skipped (numerically unstable there), and
    an order whose RDP satisfies delta >= sqrt(1 - exp(-epsilon(alpha)))
    yields epsilon = 0 (the KL/Pinsker bound). The result is clipped at 0.
    ``"classic"`` is written here because dp-accounting no longer offers it.

    Examples
    --------
    With epsilon(alpha) = c alpha the classic conversion has the closed form
    c + 2 sqrt(c log(1/delta)) at lambda* = 1 + sqrt(log(1/delta)/c):

    >>> c, delta = 0.5, 1e-5
    >>> lam = 1 + np.sqrt(np.log(1 / delta) / c)
    >>> round(rdp_to_epsilon([lam], [c * lam], delta, conversion="classic"), 6)
    5.298526
    >>> round(float(c + 2 * np.sqrt(c * np.log(1 / delta))), 6)
    5.298526
    >>> orders = np.linspace(1.5, 30, 300)
    >>> rdp_to_epsilon(orders, c * orders, delta) < 5.298526  # the improved one is tighter
    True
    """
    return rdp_to_epsilon_and_order(orders, rdp, delta, conversion=conversion)[0]


def rdp_to_epsilon_and_order(orders, rdp, delta, *, conversion="improved"):
    """:func:`rdp_to_epsilon` and the order that attains it: ``(epsilon, order)``."""
    orders, rdp = _check_rdp(orders, rdp)
    delta = check_delta(delta)
    check_choice(conversion, "conversion", CONVERSIONS)
    return _epsilon_and_order(orders, rdp, delta, conversion)


def _epsilon_and_order(orders, rdp, delta, conversion):
    """:func:`rdp_to_epsilon_and_order` on validated input."""
    if conversion == "improved":
        eps, order = rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)
        return float(eps), float(order)
    with np.errstate(invalid="ignore"):
        eps = rdp - math.log(delta) / (orders - 1.0)   # not log(1/delta): 1/5e-324 overflows
    best = int(np.argmin(eps))
    return float(max(eps[best], 0.0)), float(orders[best])


def rdp_to_delta(orders, rdp, epsilon):
    r"""Smallest delta such that an RDP curve gives (epsilon, delta)-DP (improved conversion).

    .. math:: \delta = \min_\lambda \frac{\exp((\lambda-1)(\varepsilon(\lambda)-\varepsilon))}
                                        {\lambda-1}\Big(1-\frac{1}{\lambda}\Big)^\lambda

    Parameters
    ----------
    orders : array_like of shape (n_orders,)
        Renyi orders in (1, 1e6].
    rdp : array_like of shape (n_orders,)
        epsilon(alpha) at each order, >= 0 (+inf allowed).
    epsilon : float
        Target epsilon, > 0.

    Returns
    -------
    delta : float
        In [0, 1].

    Notes
    -----
    The same computation as ``dp_accounting.rdp.compute_delta``, whose bound
    (a - 1)(r - eps + log1p(-1/a)) - log a is the logarithm of the printed
    formula (expand (1 - 1/a)^a / (a - 1)). As :func:`rdp_to_epsilon`, it
    skips orders <= 1.01, also takes the KL bound sqrt(1 - exp(-r)), and caps
    delta at 1. It is written out (and tested against dp-accounting) because
    dp-accounting 0.6 evaluates the KL bound as 0.5 log1p(-exp(-r)), which
    raises "math domain error" for 0 < r < 1.1e-16 (exp(-r) rounds to 1);
    -expm1(-r) is the same quantity without that flaw.

    Examples
    --------
    It inverts :func:`rdp_to_epsilon` on the same orders:

    >>> orders = np.array([2.0, 4.0, 8.0, 16.0, 32.0])
    >>> eps = rdp_to_epsilon(orders, 0.05 * orders, 1e-5)
    >>> round(eps, 4), f"{rdp_to_delta(orders, 0.05 * orders, eps):.6g}"
    (1.3182, '1e-05')
    """
    orders, rdp = _check_rdp(orders, rdp)
    return _delta(orders, rdp, check_epsilon(epsilon))


def _delta(orders, rdp, epsilon):
    """:func:`rdp_to_delta` on validated input."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kl = np.where(rdp > 0, 0.5 * np.log(-np.expm1(-rdp)), -np.inf)
        improved = ((orders - 1.0) * (rdp - epsilon + np.log1p(-1.0 / orders))
                    - np.log(orders))
    log_delta = np.where(orders > 1.01, np.minimum(kl, improved), kl)
    return float(min(math.exp(float(np.min(log_delta))), 1.0))


# --------------------------------------------------------------------------- PLD


def gaussian_pld_points(noise_multiplier, vdi, *, sensitivity=1.0, tail_sds=10.0):
    """Grid points of the privacy-loss distribution of one Gaussian mechanism.

    The privacy loss of a Gaussian of noise multiplier z (std over the norm
    bound) and sensitivity D (in units of the bound) is linear in the output
    and spans about (2 t + D/z) D/z over ``tail_sds`` = t standard deviations
    each side; the grid has that span over the discretization interval.
    """
    ratio = sensitivity / noise_multiplier
    return (2.0 * tail_sds + ratio) * ratio / vdi


def pld_points_refusal(points, *, what, vdi):
    """Why a PLD grid of ``points`` points is refused (more than :data:`MAX_PLD_POINTS`),
    or None; ``what`` says which grid. The words are the same for every accountant."""
    if points <= MAX_PLD_POINTS:
        return None
    return (f"accountant='pld' would need a grid of about {points:.2g} points {what} (at most "
            f"{MAX_PLD_POINTS:g}): raise value_discretization_interval (now {vdi:g}) or use "
            "accountant='rdp'")


def check_pld_points(points, *, what, vdi):
    """Refuse a PLD grid of more than :data:`MAX_PLD_POINTS` points, before it is built.

    ``what`` says which grid (``"per round at noise_multiplier=..."``, ``"for the
    composed loss ..."``); the message is :func:`pld_points_refusal`'s.
    """
    refusal = pld_points_refusal(points, what=what, vdi=vdi)
    if refusal is not None:
        raise ValueError(refusal)


# --------------------------------------------------------------------------- noise search


class NoiseSearch:
    """The smallest noise multiplier z with epsilon(z) <= target: bracketing, then Brent.

    epsilon must decrease in z. The bracketing starts at ``start`` and moves by
    factors of 2 within ``[low, high]``; Brent's method on log z follows; the
    answer is the smallest z evaluated whose epsilon is <= the target, so the
    guarantee holds at the returned z. Every evaluation is remembered. A z
    that the accountant refuses (ValueError, e.g. a PLD grid too large) ends
    the range there.

    Parameters
    ----------
    epsilon_of : callable
        z -> epsilon.
    target : float
        Target epsilon.
    low, high : float
        The search range.
    """

    def __init__(self, epsilon_of, target, *, low, high):
        self._epsilon_of = epsilon_of
        self.target = target
        self.evaluated = {}
        self.lowest = low
        self.highest = high

    @property
    def evaluations(self):
        """Number of epsilon evaluations so far."""
        return len(self.evaluated)

    def epsilon(self, z):
        """epsilon(z), evaluated once."""
        if z not in self.evaluated:
            self.evaluated[z] = self._epsilon_of(z)
        return self.evaluated[z]

    def reachable(self, z):
        """Whether the accountant evaluates z; a refusal moves the range's bottom above z."""
        try:
            self.epsilon(z)
        except ValueError:  # the accountant refuses this z: the range ends above it
            self.lowest = 2.0 * z
            return False
        return True

    def _bracket(self, start):
        """(lo, hi) with epsilon(lo) > target >= epsilon(hi); lo None (hi None) when even
        the top (the bottom) of the range is above (below) the target."""
        z = start
        while not self.reachable(z):
            z *= 2.0
            if z > self.highest:
                raise ValueError("the PLD accountant refuses every noise multiplier up to "
                                 f"{self.highest:g}: use accountant='rdp'")
        if self.epsilon(z) > self.target:
            lo = z
            while self.epsilon(z) > self.target:
                if z >= self.highest:
                    return None, z
                lo, z = z, min(2.0 * z, self.highest)
            return lo, z
        while self.epsilon(z) <= self.target:
            down = max(z / 2.0, self.lowest)
            if z <= self.lowest or not self.reachable(down):
                return z, None
            hi, z = z, down
        return z, hi

    def solve(self, rtol, start=1.0):
        """(z, converged, at_bound): z the smallest evaluated with epsilon <= target."""
        lo, hi = self._bracket(start)
        if lo is None or hi is None:
            return (hi if lo is None else lo), False, True
        optimize.brentq(lambda t: self.epsilon(math.exp(t)) - self.target, math.log(lo),
                        math.log(hi), xtol=rtol / 4.0)
        z = min(z for z, e in self.evaluated.items() if e <= self.target)
        below = max(z for z, e in self.evaluated.items() if e > self.target)
        return z, self.epsilon(z) == self.target or z <= below * (1.0 + rtol), False
