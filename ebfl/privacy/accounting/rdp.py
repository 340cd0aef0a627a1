"""Renyi DP of the Gaussian mechanisms every accountant of ebfl composes.

:func:`event_rdp` is the one RDP of a mechanism event under add/remove-one
neighbours: the Gaussian in closed form, the Poisson-subsampled Gaussian by
:func:`poisson_gaussian_rdp` (exact at every order, below), their
compositions by addition; any other event by dp-accounting.

The Poisson-subsampled Gaussian at fractional orders, by quadrature
-------------------------------------------------------------------

Under add/remove-one neighbours, one round of DP-FedAvg (sampling rate q,
noise multiplier z) has RDP of order alpha > 1

.. math:: \\varepsilon(\\alpha) = \\frac{\\log A_\\alpha}{\\alpha - 1},\\qquad
          A_\\alpha = \\mathbb{E}_{x \\sim N(0, z^2)}
          \\left[\\left(1 - q + q\\, e^{(2x - 1)/(2z^2)}\\right)^\\alpha\\right]

(Mironov, Talwar and Zhang 2019, Theorem 5: the other direction, B_alpha, is
never larger). At integer orders A_alpha is a finite binomial sum. At
fractional orders dp-accounting sums the absolute values of an infinite
alternating series: an upper bound, 18 % above the exact value at
(q, z, alpha) = (0.05, 1, 1.5), and +inf when the series does not converge
within its 1000 terms (large q, small z, orders near 1). Those orders matter
most after many rounds, where the best order of the conversion is small.

Here A_alpha - 1 is integrated directly (adaptive Gauss-Kronrod on the
standardized variable): writing u = q (exp((2x - 1)/(2 z^2)) - 1), the
integrand is phi(x) [(1 + u)^alpha - 1 - alpha u] >= 0 (E[u] = 0, and the
bracket is convex in u), so no cancellation against the 1 happens and tiny
RDP values keep their relative precision; far out, where the bracket is
(q e^s)^alpha to double precision, the integral is a Gaussian tail in closed
form. The error is below about 1e-9 relative (checked against the exact sums
at integer orders up to 1e6 and against 30-digit quadrature); the quadrature's
own error estimate is added to the integral, and a relative 1e-8 to the RDP.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, special

from ebfl.privacy.accounting.core import (
    NOISE_MULTIPLIER_RANGE,
    check_noise_multiplier,
    check_orders,
    check_sampling_rate,
    quiet_absl,
)

__all__ = ["event_rdp", "poisson_gaussian_rdp"]

#: Standard deviations kept on each side of the integrand's peaks (the
#: Gaussian factor is below exp(-800) of its peak beyond them).
_TAIL = 40.0
#: |u| (alpha + 1) below this: the bracket is summed as its binomial series.
_SERIES_BELOW = 0.05
_SERIES_TERMS = 24
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: Fractional orders in [2, 12) use dp-accounting's series (capped by the next integer
#: order; its loop is slow at large orders); integer orders up to 1000 the exact sum.
_SERIES_ORDERS_BELOW = 12.0
_SUM_ORDERS_UP_TO = 1000.0
_OFFSETS = (0.0, *(sign * 2.0**k for k in range(-1, 6) for sign in (-1.0, 1.0)))


def _log_series(u, alpha):
    """log sum_{k >= 2} C(alpha, k) u^k = log[(1 + u)^alpha - 1 - alpha u], small |u|.

    With |u| (alpha + 1) < 0.05 each term is at most 0.05 of the one before."""
    coef, total, power = alpha * (alpha - 1.0) / 2.0, 0.0, u * u
    for k in range(2, _SERIES_TERMS):
        total += coef * power
        coef *= (alpha - k) / (k + 1.0)
        power *= u
    return math.log(total) if total > 0.0 else -math.inf


def _log_integrand(t, q, z, alpha):
    """log of phi(t) [(1 + u)^alpha - 1 - alpha u] at x = z t (t standardized).

    The bracket is written (1 + u) [expm1(beta L) - beta u / (1 + u)] with
    L = log(1 + u) and beta = alpha - 1, so that neither (1 + u)^alpha nor u is
    formed when they overflow, and orders next to 1 keep their precision.
    """
    s = t / z - 0.5 / (z * z)  # (2x - 1) / (2 z^2)
    if s < 700.0:
        u = q * math.expm1(s)
        if u == 0.0:
            return -math.inf
        if abs(u) * (alpha + 1.0) < _SERIES_BELOW:
            return _log_series(u, alpha) - 0.5 * t * t - _LOG_SQRT_2PI
        log1p_u = math.log1p(u)
    else:  # u = q (e^s - 1) overflows: log(1 + u) = log q + s to double precision
        log1p_u = math.log(q) + s
    beta = alpha - 1.0
    w = -math.expm1(-log1p_u)  # u / (1 + u)
    b = beta * log1p_u
    if b < 700.0:
        d = math.expm1(b) - beta * w
        log_d = math.log(d) if d > 0.0 else -math.inf
    else:
        log_d = b + math.log1p(-math.exp(-b) * (1.0 + beta * w))
    return log1p_u + log_d - 0.5 * t * t - _LOG_SQRT_2PI


def _log_a_minus_one(q, z, alpha):
    """log(A_alpha - 1) of the Poisson-subsampled Gaussian, rounded up."""
    lo, hi = -_TAIL, max(0.0, alpha / z) + _TAIL
    # Far out, where s = (2x - 1)/(2 z^2) >= 50 + log(alpha) and (alpha - 1) log(1 + u)
    # >= 50, the bracket is (1 + u)^alpha = (q e^s)^alpha to 1e-21: the integrand is
    # exp(alpha log q + alpha (alpha - 1)/(2 z^2)) phi(t - alpha/z), integrated in closed
    # form (quadrature there would difference t^2/2 against alpha t / z: at t = 5e7 their
    # rounding alone is 0.25 in the log).
    s_far = max(50.0 + math.log(alpha), 50.0 / (alpha - 1.0) - math.log(q))
    t_far = z * s_far + 0.5 / z
    log_far = -math.inf
    if t_far < hi:
        log_far = (alpha * math.log(q) + alpha * (alpha - 1.0) / (2.0 * z * z)
                   + float(special.log_ndtr(alpha / z - t_far)))
        hi = t_far
    return float(np.logaddexp(_log_quadrature(q, z, alpha, lo, hi), log_far))


def _log_quadrature(q, z, alpha, lo, hi):
    """log of the integral of the integrand over [lo, hi] (standardized), rounded up."""
    # Landmarks (standardized): the Gaussian's centre, u = 0, the point where the
    # two mixture terms are equal, and the centre alpha / z of the dominant term's
    # Gaussian tilt; the integrand lives within _TAIL of them. Breakpoints at geometric
    # distances around each: a Gauss-Kronrod rule on a long interval whose mass sits at
    # one end would not see it (16 % of A missed at alpha = 12345, z = 1 without them).
    marks = [0.0, 0.5 / z, (z * z * math.log1p(-q) - z * z * math.log(q) + 0.5) / z, alpha / z]
    near = sorted(m + d for m in marks for d in _OFFSETS if lo < m + d < hi)
    # breakpoints closer than 1e-6 would make a sliver QUADPACK cannot subdivide
    marks = [m for i, m in enumerate(near) if i == 0 or m - near[i - 1] > 1e-6]
    grid = np.unique(np.concatenate([np.linspace(lo, hi, 81), marks]))
    peak = max(_log_integrand(float(t), q, z, alpha) for t in grid)
    if peak == -math.inf:  # u underflows to 0 everywhere (q below about 1e-300)
        return -math.inf

    def f(t):
        return math.exp(_log_integrand(t, q, z, alpha) - peak)

    # one quadrature per segment, in its own coordinates (QUADPACK's breakpoints lose
    # precision far from 0: a negative error estimate at alpha / z = 1e9)
    edges = [lo, *marks, hi]
    value = error = 0.0
    with warnings.catch_warnings():  # a missed tolerance shows in ``error``, added below
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            # f <= 1 near its peak and the integral is at least about z times that, so
            # 1e-14 absolute is below 1e-10 of it: segments of negligible mass end at once
            v, e = integrate.quad(lambda x, a=a: f(a + x), 0.0, b - a, limit=100,
                                  epsabs=1e-14, epsrel=1e-10)
            value, error = value + v, error + abs(e)
    return peak + math.log(value + error) if value + error > 0.0 else -math.inf


def _log_a_minus_one_integer(q, z, alpha):
    """log(A_alpha - 1) at an integer order: the binomial sum with its k = 0, 1 terms
    cancelled exactly,

    A_alpha - 1 = sum_{k=2}^{alpha} C(alpha, k) (1 - q)^(alpha - k) q^k expm1((k^2 - k) / (2 z^2)),

    every term >= 0 (dp-accounting sums all terms and subtracts nothing, so a
    tiny RDP comes out as rounding noise, even negative: -8e-25 for 1e-24 at
    (q, z, alpha) = (1e-9, 1000, 2))."""
    k = np.arange(2.0, alpha + 1.0)
    log_coef = (special.gammaln(alpha + 1.0) - special.gammaln(k + 1.0)
                - special.gammaln(alpha - k + 1.0))
    e = (k * k - k) / (2.0 * z * z)
    with np.errstate(over="ignore", divide="ignore"):
        log_expm1 = np.where(e > 30.0, e + np.log1p(-np.exp(-e)), np.log(np.expm1(e)))
    terms = log_coef + (alpha - k) * math.log1p(-q) + k * math.log(q) + log_expm1
    return float(special.logsumexp(terms))


def poisson_gaussian_rdp(sampling_rate, noise_multiplier, orders):
    """Per-round RDP of the Poisson-subsampled Gaussian at each order.

    Parameters
    ----------
    sampling_rate : float
        q in (0, 1].
    noise_multiplier : float
        z in [1e-3, 1e8] (noise std over the L2 sensitivity).
    orders : array_like (n,)
        Renyi orders in (1, 1e6], at most 1000 of them.

    Returns
    -------
    ndarray (n,)
        RDP at each order: alpha / (2 z^2) at q = 1; the exact binomial sum
        at integer orders up to 1000; at fractional orders in [2, 12) the
        smaller of dp-accounting's series (an upper bound, up to 6 times the
        exact value at (q, z) = (0.3, 30) between 2 and 3) and the exact value
        at the next integer order (RDP does not decrease with the order); by
        quadrature everywhere else (fractional orders below 2 or above 12,
        integer orders above 1000, and where the series gives +inf).

    Examples
    --------
    >>> import numpy as np
    >>> rdp = poisson_gaussian_rdp(0.05, 1.0, np.array([1.5, 2.0]))
    >>> [round(float(v), 6) for v in rdp]  # dp-accounting's series: 0.003597 at 1.5
    [0.003054, 0.004287]
    """
    return _rdp(check_sampling_rate(sampling_rate), check_noise_multiplier(noise_multiplier),
                check_orders(orders))


def _rdp(q, z, orders):
    """:func:`poisson_gaussian_rdp` on validated input (orders a float64 array)."""
    if q == 1.0:  # no sampling: the Gaussian's RDP
        return orders / (2.0 * z * z)
    out = np.full(orders.size, math.inf)
    integer = orders == np.round(orders)
    series = ~integer & (orders >= 2.0) & (orders < _SERIES_ORDERS_BELOW)
    if np.any(series):
        acc = rdp_privacy_accountant.RdpAccountant(orders[series],
                                                   NeighboringRelation.ADD_OR_REMOVE_ONE)
        with quiet_absl():  # its "failed to converge" warnings: those orders are redone here
            acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
        out[series] = acc.rdp
    for i in np.flatnonzero(~np.isfinite(out)):
        out[i] = _order_rdp(q, z, float(orders[i]))
    ceilings = {}
    for i in np.flatnonzero(series):  # RDP does not decrease with the order
        up = math.ceil(orders[i])
        if up not in ceilings:
            ceilings[up] = _order_rdp(q, z, float(up))
        out[i] = min(out[i], ceilings[up])
    return out


@functools.lru_cache(maxsize=8192)
def _order_rdp(q, z, alpha):
    """RDP at one order: the binomial sum at an integer order up to 1000, else quadrature
    (plus a relative 1e-8, ten times its largest error measured against the sums)."""
    if alpha == round(alpha) and alpha <= _SUM_ORDERS_UP_TO:
        return float(np.logaddexp(0.0, _log_a_minus_one_integer(q, z, alpha))) / (alpha - 1.0)
    log_a = float(np.logaddexp(0.0, _log_a_minus_one(q, z, alpha)))  # A = 1 + (A - 1)
    return log_a / (alpha - 1.0) * (1.0 + 1e-8)


def event_rdp(event, orders):
    """RDP curve of a dp-accounting event under add/remove-one neighbours, at ``orders``.

    ``GaussianDpEvent`` has RDP alpha/(2 z^2); a ``PoissonSampledDpEvent`` of a
    Gaussian has :func:`poisson_gaussian_rdp`'s; composed events add their
    curves and a self-composed one multiplies by its count. Any other event
    goes to dp-accounting's ``RdpAccountant`` (so does a sampled Gaussian whose noise
    multiplier is outside [1e-3, 1e8], where the quadrature is not
    validated; DP-AdaPeD derives such multipliers from its clip norms and
    noise scales). Every accountant of ebfl
    computes its RDP here, so two accountants of the same mechanism give the
    same curve to the last bit.

    Parameters
    ----------
    event : dp_accounting.DpEvent
    orders : ndarray of float64 (n,)
        Validated Renyi orders (:func:`~ebfl.privacy.accounting.core.check_orders`).

    Returns
    -------
    ndarray (n,)

    Examples
    --------
    >>> from dp_accounting import dp_event
    >>> event_rdp(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(2.0), 10),
    ...           np.array([2.0, 8.0])).tolist()
    [2.5, 10.0]
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        return orders / (2.0 * event.noise_multiplier ** 2)
    lo, hi = NOISE_MULTIPLIER_RANGE
    if (isinstance(event, dp_event.PoissonSampledDpEvent)
            and isinstance(event.event, dp_event.GaussianDpEvent)
            and lo <= event.event.noise_multiplier <= hi):
        return _rdp(event.sampling_probability, event.event.noise_multiplier, orders)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum((event_rdp(e, orders) for e in event.events), np.zeros(orders.size))
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * event_rdp(event.event, orders)
    acc = rdp_privacy_accountant.RdpAccountant(orders, NeighboringRelation.ADD_OR_REMOVE_ONE)
    if not acc.supports(event):
        raise ValueError(f"dp-accounting's RdpAccountant does not support {event!r}")
    with quiet_absl():
        acc.compose(event)
    return np.asarray(acc.rdp, dtype=np.float64)
