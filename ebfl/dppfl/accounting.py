"""Record-level privacy accounting of DP-PFL (Hu et al., IEEE IoT J. 2020).

Per global iteration, a device t that takes part releases

* its local dual update Delta alpha_t plus N(0, s1^2 sigma1^2 I) (Algorithm 1,
  line 6; s1 of Corollary 2). The local SDCA solver touches a fraction
  q = n_iter / n_t of the records, and the paper credits subsampling
  amplification at rate q;
* u_t = xi X_t (Delta alpha_t + b_t) plus N(0, s2^2 sigma2^2 I) (line 7; s2 of
  Corollary 3). This one is not subsampled: every record's x_i multiplies its
  noise coordinate.

So one iteration is a Poisson-subsampled Gaussian mechanism of noise multiplier
sigma1 at rate q, composed with a Gaussian mechanism of noise multiplier sigma2.
A device active in all K H global iterations (K inner iterations per Omega-step,
H Omega-steps) makes K H releases (:func:`releases_of`). Whether a device drops
out of an iteration is seen by the server, so no amplification is credited to
the active probability p here, although Theorem 5 credits it (errata
[DP-PFL 4]).

Four things live here:

* :func:`calibrate_theorem5`: the paper's noise calibration (Theorem 5 with
  Lemma 4, constants c1 = c2 = 1), with its conditions checked;
* :func:`rigorous_epsilon`: the epsilon that given noise multipliers really
  deliver, by dp-accounting's RDP or PLD accountant;
* :func:`corollary4_epsilon`: the paper's own moments-accountant bound
  (Corollary 4, Theorem 1, Theorem 2);
* :func:`calibrate_rdp`: the corrected calibration, the smallest noise at which
  the RDP accountant certifies the target;

and :func:`dppfl_privacy_report` puts them side by side (what ``ebfl accounting
dp-pfl`` prints).

Neighbouring relation: add or remove one record of the device, the relation
under which Poisson subsampling is analysed. sigma1 and sigma2 are noise
multipliers, i.e. the noise standard deviations over the L2 sensitivities s1
and s2, which are taken to bound the change caused by one record. SDCA draws its
n_iter coordinates uniformly with replacement rather than by Poisson sampling;
modelling it as Poisson sampling at rate q is the paper's idealization
(Corollary 4 rests on the Poisson analysis of Abadi et al. 2016), kept here.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from ebfl._validation import (
    check_bool,
    check_choice,
    check_int_scalar,
    check_positive_scalar,
    check_real_scalar,
)
from ebfl.dppfl._checks import (
    MAX_RELEASES,
    as_output,
    broadcast,
    noise_iv,
    positive_rate_iv,
    releases_iv,
    sampling_rate_iv,
)
from ebfl.privacy.accounting.accountant import Accountant
from ebfl.privacy.accounting.core import (
    DEFAULT_ORDERS,
    DEFAULT_VDI,
    MAX_PLD_POINTS,
    NOISE_MULTIPLIER_RANGE,
    VDI_RANGE,
    check_delta,
    check_orders,
    check_vdi,
    pld_points_refusal,
)

__all__ = [
    "CalibrationConditionWarning",
    "Theorem5Calibration",
    "calibrate_rdp",
    "calibrate_theorem5",
    "corollary4_epsilon",
    "dppfl_privacy_report",
    "releases_of",
    "rigorous_epsilon",
]

#: Largest number of releases of the PLD accountant. dp-accounting composes a
#: small (sparse) privacy-loss distribution of s points by first computing the
#: integer s**releases, whose cost grows with releases: 2 s at 10**6 releases,
#: minutes at 10**7, beyond reach at 10**9. The RDP accountant has no limit.
MAX_PLD_RELEASES = 10**6
#: Standard deviations of a Gaussian's privacy loss that dp-accounting keeps each side.
_PLD_TAIL_SDS = 10.0

_ACCOUNTANTS = ("rdp", "pld")
_FORMS = ("corollary4", "proof")
_RELATION = NeighboringRelation.ADD_OR_REMOVE_ONE

# Names of the conditions that Theorem 5 and the results it rests on assume.
_EPS1 = "epsilon1 < 1 (Lemma 4)"
_EPS2 = "epsilon2 < 1 (Lemma 4)"
_SIGMA1 = "sigma1 >= 1 (Corollary 4)"
_SMALL_Q = "q < 1/(16 sigma1) (Corollary 4)"
_EPS_BELOW = "epsilon < p^2 K (Theorem 5)"
_Q_BELOW_ONE = "q < 1 (Corollary 4)"
_ORDER_RANGE = "an integer gamma in (0, sigma1^2 ln(1/(q sigma1))) (Corollary 4)"


class CalibrationConditionWarning(RuntimeWarning):
    """A condition of DP-PFL's privacy analysis (Lemma 4, Corollary 4, Theorem 5) fails.

    The numbers are still computed, but the paper's guarantee does not cover
    them.
    """


# --------------------------------------------------------------------------- Theorem 5


def releases_of(inner, outer):
    """Number of noisy releases of a device active in every global iteration: K H.

    Theorem 5 of DP-PFL (Hu et al., IEEE IoT J. 2020) composes over "K global
    iterations"; Algorithm 1 runs K inner iterations for each of H Omega-steps
    and every inner iteration releases u_t, so all K H of them count.

    Parameters
    ----------
    inner : int
        K >= 1, global iterations per Omega-step (the paper: 2000).
    outer : int
        H >= 1, Omega-steps (the paper: 10).

    Returns
    -------
    int

    Examples
    --------
    >>> releases_of(2000, 10)
    20000
    """
    inner = check_int_scalar(inner, "inner", minimum=1, maximum=MAX_RELEASES)
    outer = check_int_scalar(outer, "outer", minimum=1, maximum=MAX_RELEASES)
    if inner * outer > MAX_RELEASES:
        raise ValueError(f"inner * outer must be at most 2**53 releases, got {inner * outer}")
    return inner * outer


@dataclass(frozen=True)
class Theorem5Calibration:
    """Noise multipliers of DP-PFL by Theorem 5's recipe (:func:`calibrate_theorem5`).

    Attributes
    ----------
    epsilon, delta : float
        The end-to-end target of one device.
    releases : int
        K in Theorem 5: the noisy releases of a device active in every
        iteration (K H in Algorithm 1, see :func:`releases_of`).
    active_probability : float
        p, the probability that a device takes part in an iteration.
    ratio : float
        r = epsilon2 / epsilon1.
    sampling_rate : ndarray
        q (ndim 0, or one entry per device).
    epsilon_iteration : float
        The per-iteration budget epsilon / (p sqrt(K)).
    epsilon1, epsilon2, sigma1, sigma2 : ndarray
        Lemma 4's budgets of lines 6 and 7 and the noise multipliers that
        reach them (broadcast to the shape of ``sampling_rate``).
    violated : tuple of str
        The conditions of Lemma 4, Corollary 4 and Theorem 5 that fail (for at
        least one device); empty when all hold.
    """

    epsilon: float
    delta: float
    releases: int
    active_probability: float
    ratio: float
    sampling_rate: np.ndarray
    epsilon_iteration: float
    epsilon1: np.ndarray
    epsilon2: np.ndarray
    sigma1: np.ndarray
    sigma2: np.ndarray
    violated: tuple

    def to_dict(self):
        """A JSON-able dict of every field (arrays as lists, 0-d arrays as floats)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out


def calibrate_theorem5(epsilon, delta, *, releases, sampling_rate, active_probability=1.0,
                       ratio=1.0, warn=True):
    r"""Noise multipliers sigma1, sigma2 by Theorem 5 of DP-PFL (Hu et al., IEEE IoT J. 2020).

    Lemma 4's per-iteration noise with Theorem 5's composition, the unknown
    constants set to 1:

    .. math::
        \varepsilon_{it} = \frac{\varepsilon}{p\sqrt{K}},\quad
        \varepsilon_1 = \frac{\varepsilon_{it}}{\sqrt{q^2 + r^2}},\quad
        \varepsilon_2 = r\,\varepsilon_1,\quad
        \sigma_i = \frac{\sqrt{2\ln(1.25/\delta)}}{\varepsilon_i}.

    Lemma 4 makes an iteration (sqrt(q^2 eps1^2 + eps2^2), delta) =
    (eps_iter, delta)-DP, and Theorem 5 composes K of them into
    (eps_iter p sqrt(K), delta). Theorem 5 prints the result as
    sigma1 >= c2 p sqrt((q^2 + r^2) K log(1/delta)) / epsilon and sigma2 =
    sigma1 / r; the recipe is that form with c2 = sqrt(2 ln(1.25/delta) /
    ln(1/delta)) (1.44 at delta = 1e-3). This is the paper's claim, not a
    guarantee: :func:`rigorous_epsilon` gives the epsilon these noise
    multipliers deliver.

    Parameters
    ----------
    epsilon : float
        End-to-end target epsilon > 0 of one device.
    delta : float
        Target delta in (0, 1).
    releases : int
        K, the noisy releases of a device active in every iteration, in
        [1, 2**53]. For Algorithm 1 that is K H (:func:`releases_of`): the paper
        writes K, but every one of the K H inner iterations releases u_t.
    sampling_rate : float or array_like of shape (m,)
        q = n_iter / n_t in (0, 1]: the fraction of a device's records its
        local solver touches per iteration; one per device, or one for all.
    active_probability : float, default=1.0
        p in (0, 1], the probability that a device takes part in an
        iteration (1 - the drop probability).
    ratio : float, default=1.0
        r = epsilon2 / epsilon1 > 0, the split of the per-iteration budget
        between the dual update (line 6) and the upload (line 7); the paper
        does not report it.
    warn : bool, default=True
        Warn (:class:`CalibrationConditionWarning`) when a condition fails.

    Returns
    -------
    Theorem5Calibration

    Warns
    -----
    CalibrationConditionWarning
        Once, naming the conditions that fail: epsilon1 < 1 and epsilon2 < 1
        (Lemma 4), sigma1 >= 1 and q < 1/(16 sigma1) (Corollary 4), and
        epsilon < p^2 K (Theorem 5 with c1 = 1).

    Notes
    -----
    Errors of the paper's analysis that this recipe inherits (see
    :func:`rigorous_epsilon` for what it really delivers):

    * Theorem 5 credits the active probability p as if dropping were secret
      (noise scales with p). The server sees which devices answered, so a
      device active in every iteration gets no such amplification; with
      p < 1 the delivered epsilon exceeds the target.
    * Theorem 5's proof composes K (eps_iter, delta)-DP iterations into
      (eps_iter p sqrt(K), delta): delta does not grow with K, and the
      sqrt(K) of advanced composition comes without its sqrt(log(1/delta))
      factor. With the constants at 1 the target is missed even at p = 1 (by
      about 2% at the paper's epsilon = 8, delta = 1e-3, PLD accountant).
    * Lemma 4's proof gives epsilon^2 >= log(1/delta) (q^2/sigma1^2 +
      1/sigma2^2) / (c0 (1 - c0)) for some c0 in (0, 1), so its constant c1
      is at least 4, not 1. That proof also uses a simplified log moment
      that is not a valid bound (see :func:`corollary4_epsilon`).
    * Corollary 4 needs q < 1/(16 sigma1), which the paper's setting (q about
      0.5, sigma1 about 60) violates by three orders of magnitude.

    r = 0 (no budget for the upload, sigma2 infinite) is refused, and so are
    settings whose budgets or noise multipliers overflow float64 (e.g. epsilon
    near 1e-320).

    Examples
    --------
    The paper's Figure 4 setting: epsilon = 8, delta = 1e-3, K H = 20000
    releases, drop probability 0.2 and q = 0.5:

    >>> cal = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=0.5,
    ...                          active_probability=0.8, warn=False)
    >>> round(float(cal.sigma1), 2), round(float(cal.sigma2), 2)
    (59.71, 59.71)
    >>> cal.violated
    ('q < 1/(16 sigma1) (Corollary 4)',)
    """
    epsilon = check_positive_scalar(epsilon, "epsilon")
    delta = check_delta(delta)
    releases = releases_iv(releases)
    q = positive_rate_iv(sampling_rate)
    p = check_real_scalar(active_probability, "active_probability", low=0.0, high=1.0,
                          low_open=True)
    r = check_positive_scalar(ratio, "ratio")
    warn = check_bool(warn, "warn")

    eps_iter = epsilon / (p * math.sqrt(releases))
    scale = math.sqrt(2.0 * math.log(1.25 / delta))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        eps1 = eps_iter / np.hypot(q, r)
        eps2 = r * eps1
        sigma1, sigma2 = scale / eps1, scale / eps2
    if not all(np.all(np.isfinite(a) & (a > 0.0)) for a in (eps1, eps2, sigma1, sigma2)):
        raise ValueError(f"epsilon={epsilon:g} with ratio={r:g} and sampling_rate down to "
                         f"{float(np.min(q)):g} gives budgets or noise multipliers that "
                         "float64 cannot hold (Theorem 5: sigma1 = sqrt(2 ln(1.25/delta)) p "
                         "sqrt(K (q^2 + r^2)) / epsilon, sigma2 = sigma1 / r); use a less "
                         "extreme epsilon or ratio")
    violated = _theorem5_violations(epsilon, releases, p, q, eps1, eps2, sigma1)
    if warn and violated:
        warnings.warn(f"calibrate_theorem5: the paper's conditions fail: {', '.join(violated)}; "
                      "the noise is computed, but Theorem 5 does not cover it (see "
                      "rigorous_epsilon for the epsilon it delivers)",
                      CalibrationConditionWarning, stacklevel=2)
    return Theorem5Calibration(epsilon, delta, releases, p, r, q.copy(), eps_iter, eps1, eps2,
                               sigma1, sigma2, violated)


def _theorem5_violations(epsilon, releases, p, q, eps1, eps2, sigma1):
    checks = ((_EPS1, eps1 < 1.0), (_EPS2, eps2 < 1.0), (_SIGMA1, sigma1 >= 1.0),
              (_SMALL_Q, 16.0 * q * sigma1 < 1.0), (_EPS_BELOW, epsilon < p * p * releases))
    return tuple(name for name, holds in checks if not np.all(holds))


# --------------------------------------------------------------------------- rigorous


def _iteration_event(q, sigma1, sigma2):
    """One iteration: the dual update, Poisson-sampled at q, then the upload (dp-accounting)."""
    upload = dp_event.GaussianDpEvent(sigma2)
    if q == 0.0:
        return upload
    dual = dp_event.GaussianDpEvent(sigma1)
    if q < 1.0:  # at q = 1 the plain Gaussian: PLD composes it exactly, not on a grid
        dual = dp_event.PoissonSampledDpEvent(q, dual)
    return dp_event.ComposedDpEvent([dual, upload])


def _rdp_epsilon(q, sigma1, sigma2, releases, delta, orders):
    """By the core's accountant: the same RDP and conversion as every accountant of ebfl."""
    acc = Accountant(orders=orders).compose(_iteration_event(q, sigma1, sigma2), releases)
    return acc.get_epsilon(delta)


def _pld_points(q, sigma1, sigma2, releases, delta, vdi):
    """Largest grid (points) dp-accounting's PLD would build: one release's or the composed.

    A Gaussian's privacy loss of noise multiplier z spans (2 t + 1/z)/z over
    t = 10 standard deviations each side; the upload's Gaussians are composed
    as one of multiplier sigma2/sqrt(K). The composed loss spans about the
    epsilon itself (bounded by the cheap RDP epsilon).
    """
    def span(z):
        return (2.0 * _PLD_TAIL_SDS + 1.0 / z) / z

    spans = [span(sigma2 / math.sqrt(releases))]
    if q > 0.0:
        spans.append(span(sigma1 / (math.sqrt(releases) if q == 1.0 else 1.0)))
        eps = _rdp_epsilon(q, sigma1, sigma2, releases, delta, np.array(DEFAULT_ORDERS))
        spans.append(eps)
    return max(spans) / vdi


def _pld_refusal(q, sigma1, sigma2, releases, delta, vdi):
    """Why the PLD accountant is refused here (too much memory), or None."""
    return pld_points_refusal(_pld_points(q, sigma1, sigma2, releases, delta, vdi),
                              what=f"for q={q:g}, sigma1={sigma1:g}, sigma2={sigma2:g}, "
                                   f"{releases} releases", vdi=vdi)


def _pld_epsilon(q, sigma1, sigma2, releases, delta, vdi):
    if releases > MAX_PLD_RELEASES:
        raise ValueError(f"releases must be at most {MAX_PLD_RELEASES:g} with accountant='pld' "
                         f"(its composition cost grows with the count), got {releases}; use "
                         "accountant='rdp'")
    refusal = _pld_refusal(q, sigma1, sigma2, releases, delta, vdi)
    if refusal is not None:
        raise ValueError(refusal)
    acc = pld_privacy_accountant.PLDAccountant(_RELATION, value_discretization_interval=vdi)
    acc.compose(_iteration_event(q, sigma1, sigma2), releases)
    return float(acc.get_epsilon(delta))


def rigorous_epsilon(sigma1, sigma2, sampling_rate, releases, delta, *, accountant="rdp",
                     orders=None, value_discretization_interval=DEFAULT_VDI):
    """The record-level epsilon that DP-PFL's noise delivers, by dp-accounting.

    Composes ``releases`` iterations, each the Poisson-subsampled Gaussian of
    the dual update (rate q, noise multiplier sigma1) followed by the Gaussian
    of the upload (sigma2), for a device active in every iteration (no
    amplification by the active probability: dropping is seen by the server).
    See the module docstring for the model and the neighbouring relation.

    Parameters
    ----------
    sigma1, sigma2 : float or array_like of shape (m,)
        Noise multipliers (noise std over the sensitivity s1 of Corollary 2,
        s2 of Corollary 3), in [1e-3, 1e8].
    sampling_rate : float or array_like of shape (m,)
        q in [0, 1]. The three arrays broadcast (one entry per device).
    releases : int
        Iterations composed, in [1, 2**53] (K H for Algorithm 1); at most
        10**6 with ``accountant="pld"``.
    delta : float
        In (0, 1).
    accountant : {"rdp", "pld"}, default="rdp"
        ``"rdp"``: the core's Renyi DP accountant
        (:class:`ebfl.privacy.accounting.Accountant`: exact RDP of the
        subsampled Gaussian at every order, the same curve as every accountant
        of ebfl), converted by the improved conversion (Balle et al. 2020).
        ``"pld"``: its privacy-loss-distribution accountant (tighter;
        pessimistic discretization, still an upper bound).
    orders : array_like, optional
        Renyi orders in (1, 1e6] (RDP only); default dp-accounting's grid 1.25
        ... 1024, the project's convention (``ebfl.privacy.accounting.DEFAULT_ORDERS``).
    value_discretization_interval : float, default=1e-4
        PLD grid step, in [1e-8, 1]. A setting whose grid would exceed 2e6
        points (large epsilon, tiny noise) is refused with a ValueError.

    Returns
    -------
    float or ndarray of shape (m,)
        A float when all three of sigma1, sigma2, sampling_rate are scalars.

    Examples
    --------
    At q = 1 an iteration is one Gaussian of multiplier (1/sigma1^2 +
    1/sigma2^2)^(-1/2), and PLD is exact for Gaussians:

    >>> round(rigorous_epsilon(94.41, 94.41, 1.0, 20000, 1e-3, accountant="pld"), 3)
    8.179

    Per device, with the noise of Theorem 5 for a target of 8 (p = 1):

    >>> cal = calibrate_theorem5(8.0, 1e-3, releases=20000, sampling_rate=[0.5, 1.0],
    ...                          warn=False)
    >>> eps = rigorous_epsilon(cal.sigma1, cal.sigma2, cal.sampling_rate, 20000, 1e-3)
    >>> eps.round(2).tolist()
    [9.09, 9.07]
    """
    scalar = all(np.ndim(a) == 0 for a in (sigma1, sigma2, sampling_rate))
    s1 = noise_iv(sigma1, "sigma1")
    s2 = noise_iv(sigma2, "sigma2")
    q = sampling_rate_iv(sampling_rate)
    releases = releases_iv(releases)
    delta = check_delta(delta)
    accountant = check_choice(accountant, "accountant", _ACCOUNTANTS)
    orders = check_orders(orders)
    vdi = check_vdi(value_discretization_interval)
    q, s1, s2 = broadcast(sampling_rate=q, sigma1=s1, sigma2=s2)

    def one(key):
        if accountant == "rdp":
            return _rdp_epsilon(*key, releases, delta, orders)
        return _pld_epsilon(*key, releases, delta, vdi)

    cache = {}   # devices often share (q, sigma1, sigma2): account each once
    out = np.empty(q.shape)
    for i in np.ndindex(q.shape):
        key = (float(q[i]), float(s1[i]), float(s2[i]))
        if key not in cache:
            cache[key] = one(key)
        out[i] = cache[key]
    return as_output(out, scalar)


# --------------------------------------------------------------------------- Corollary 4


def _corollary4_kernel(q, sigma1, sigma2, releases, log_inv_delta, form, restrict):
    r"""min over integer gamma of (K mu(gamma) + ln(1/delta)) / gamma, vectorized.

    With mu(gamma) = a gamma (gamma + 1) (Corollary 4) or b gamma^2 (the proof),
    the objective is K a (gamma + 1) + L / gamma or K b gamma + L / gamma: convex
    in gamma > 0, minimized at sqrt(L / (K a)) (resp. b), so the integer optimum
    is the floor or the ceiling of that point, clipped to the allowed range.
    Returns (epsilon, gamma); NaN where the range is empty or q >= 1 (restricted).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if form == "corollary4":
            coef = 1.0 / (2.0 * sigma2**2) + q**2 / ((1.0 - q) * sigma1**2)
            shift = 1.0
        else:
            coef = q**2 / sigma1**2 + 1.0 / sigma2**2
            shift = 0.0
        upper = _order_upper_bound(q, sigma1) if restrict else np.full(q.shape, np.inf)
        top = np.ceil(upper) - 1.0          # largest integer strictly below the bound
        star = np.sqrt(log_inv_delta / (releases * coef))
        best = np.full(q.shape, np.nan)
        gamma = np.full(q.shape, np.nan)
        for cand in (np.floor(star), np.ceil(star)):
            cand = np.clip(cand, 1.0, np.maximum(top, 1.0))
            value = releases * coef * (cand + shift) + log_inv_delta / cand
            better = ~(value >= best)       # also replaces NaN
            best = np.where(better, value, best)
            gamma = np.where(better, cand, gamma)
    empty = (top < 1.0) | (restrict & (q >= 1.0))
    best[empty], gamma[empty] = np.nan, np.nan
    return best, gamma


def _order_upper_bound(q, sigma1):
    """sigma1^2 ln(1/(q sigma1)) of Corollary 4 (+inf at q = 0)."""
    with np.errstate(divide="ignore"):
        return sigma1**2 * -(np.log(q) + np.log(sigma1))


def _corollary4_problems(q, sigma1, restrict):
    """(conditions that fail somewhere, whether the bound cannot be evaluated somewhere)."""
    fails = [name for name, holds in ((_SIGMA1, sigma1 >= 1.0),
                                      (_SMALL_Q, 16.0 * q * sigma1 < 1.0)) if not np.all(holds)]
    if restrict:
        if np.any(q >= 1.0):
            fails.append(_Q_BELOW_ONE)
        if np.any(_order_upper_bound(q, sigma1) <= 1.0):
            fails.append(_ORDER_RANGE)
    return fails


def corollary4_epsilon(sigma1, sigma2, sampling_rate, releases, delta, *, form="corollary4",
                       restrict_order=True, warn=True):
    r"""The paper's own epsilon bound: Corollary 4, composed (Theorem 1), Theorem 2's tail.

    Per iteration, Corollary 4 of DP-PFL (Hu et al., IEEE IoT J. 2020) bounds
    the log moment of order gamma by

    .. math::
        \mu(\gamma) \le \frac{\gamma(\gamma+1)}{2\sigma_2^2}
                      + \frac{q^2\gamma(\gamma+1)}{(1-q)\sigma_1^2}

    (``form="corollary4"``, the O(q^3 gamma^3 / sigma1^3) term dropped) or, as
    its proof simplifies it, q^2 gamma^2 / sigma1^2 + gamma^2 / sigma2^2
    (``form="proof"``). Theorem 1 adds K of them and Theorem 2 gives

    .. math::
        \varepsilon = \min_{\gamma} \frac{K\mu(\gamma) + \ln(1/\delta)}{\gamma}

    over the integers gamma in (0, sigma1^2 ln(1/(q sigma1))).

    Parameters
    ----------
    sigma1, sigma2 : float or array_like of shape (m,)
        Noise multipliers in [1e-3, 1e8].
    sampling_rate : float or array_like of shape (m,)
        q in [0, 1].
    releases : int
        K, in [1, 2**53].
    delta : float
        In (0, 1).
    form : {"corollary4", "proof"}, default="corollary4"
    restrict_order : bool, default=True
        Minimize over Corollary 4's range of gamma (NaN where it holds no
        integer, and where q >= 1). False minimizes over every integer
        gamma >= 1: what the formula claims outside its range (then infinite
        for ``form="corollary4"`` at q = 1).
    warn : bool, default=True
        Warn (:class:`CalibrationConditionWarning`) when Corollary 4's
        conditions (sigma1 >= 1, q < 1/(16 sigma1)) fail or the bound is NaN.

    Returns
    -------
    float or ndarray of shape (m,)
        NaN where the bound cannot be evaluated (see ``restrict_order``).

    Notes
    -----
    The log moment of order gamma is gamma times the Renyi divergence of order
    gamma + 1, so Theorem 2's tail bound is the classic RDP conversion at
    integer orders. The Gaussian term is exact; the subsampled term is the
    bound of Abadi et al. (2016, Lemma 3), which needs the conditions above.
    It is no guarantee where they fail: at the paper's setting (q about 0.5,
    sigma1 about 60) the range of gamma is empty.

    The proof's form is not a valid bound even where the conditions hold: it
    drops the factor (gamma + 1)/(gamma (1 - q)) of the subsampled term, and
    at sigma1 = 1, q = 0.06, K = 10000, delta = 1e-5 it claims epsilon 47.5
    where the true epsilon is at least 55.9 (an optimistic PLD). Corollary 4's
    own form gives 88.1 there.

    Examples
    --------
    Inside Corollary 4's conditions it lies above the rigorous RDP epsilon:

    >>> round(corollary4_epsilon(4.0, 40.0, 0.01, 1000, 1e-5), 3)
    4.151
    >>> round(rigorous_epsilon(4.0, 40.0, 0.01, 1000, 1e-5), 3)
    3.638

    At the paper's setting the range of gamma is empty; the formula evaluated
    over every order claims 18.13, above the 11.03 that PLD finds:

    >>> corollary4_epsilon(59.71, 59.71, 0.5, 20000, 1e-3, warn=False)
    nan
    >>> round(corollary4_epsilon(59.71, 59.71, 0.5, 20000, 1e-3, restrict_order=False,
    ...                          warn=False), 2)
    18.13
    """
    scalar = all(np.ndim(a) == 0 for a in (sigma1, sigma2, sampling_rate))
    s1 = noise_iv(sigma1, "sigma1")
    s2 = noise_iv(sigma2, "sigma2")
    q = sampling_rate_iv(sampling_rate)
    releases = releases_iv(releases)
    delta = check_delta(delta)
    form = check_choice(form, "form", _FORMS)
    restrict = check_bool(restrict_order, "restrict_order")
    warn = check_bool(warn, "warn")
    q, s1, s2 = broadcast(sampling_rate=q, sigma1=s1, sigma2=s2)

    eps, _ = _corollary4_kernel(q, s1, s2, float(releases), -math.log(delta), form, restrict)
    problems = _corollary4_problems(q, s1, restrict)
    if warn and problems:
        nan = (f"; the bound is NaN for {int(np.isnan(eps).sum())} of {eps.size} setting(s)"
               if np.any(np.isnan(eps)) else "")
        warnings.warn(f"corollary4_epsilon: Corollary 4's conditions fail: "
                      f"{', '.join(problems)}{nan}", CalibrationConditionWarning, stacklevel=2)
    return as_output(eps, scalar)


# --------------------------------------------------------------------------- report


def dppfl_privacy_report(epsilon, delta, *, inner=2000, outer=10, drop_probability=0.0,
                         sampling_rate, ratio=1.0):
    """Theorem 5's calibration beside the epsilon it delivers (what ``ebfl accounting dp-pfl``
    prints).

    For a device active in every one of the K H global iterations of Algorithm
    1 of DP-PFL (Hu et al., IEEE IoT J. 2020): the noise multipliers of
    :func:`calibrate_theorem5` (crediting the active probability p = 1 -
    ``drop_probability`` as the paper does), the conditions they violate, and
    the epsilon they deliver by :func:`rigorous_epsilon` (RDP and PLD) and by
    the paper's own :func:`corollary4_epsilon`. Nothing is warned: the
    violated conditions are in the result.

    Parameters
    ----------
    epsilon : float
        The target epsilon > 0 (the paper: 8).
    delta : float
        In (0, 1) (the paper: 1e-3).
    inner, outer : int, default=2000, 10
        K and H (the paper's values), each >= 1; K H at most 10**6 (the limit
        of the PLD accountant, ``MAX_PLD_RELEASES``).
    drop_probability : float, default=0.0
        P(theta = 1) in [0, 1) (Figure 4 of the paper: 0.2 at the optimum).
    sampling_rate : float or array_like of shape (m,)
        q in (0, 1] (tau = 1 gives an expected 0.5 for the device with the
        fewest samples).
    ratio : float, default=1.0
        r = epsilon2 / epsilon1 > 0.

    Raises
    ------
    ValueError
        Also when epsilon puts Theorem 5's sigma1 or sigma2 outside the
        accountants' range [1e-3, 1e8] (sigma is proportional to 1 /
        epsilon: the message gives the range of epsilon that works), or the
        PLD grid would not fit in memory (epsilon too large).

    Returns
    -------
    dict
        JSON-able (NaN and infinity written as None): ``setting``, ``calibration`` (see
        :class:`Theorem5Calibration`), ``delivered`` (``rdp``, ``pld``, their
        ratios to the target, and ``pld_value_discretization_interval``), and
        ``corollary4`` (``epsilon`` and ``epsilon_proof_form`` in its range,
        None where it is empty, ``epsilon_unrestricted`` and
        ``epsilon_proof_form_unrestricted`` over every integer order, and
        ``failed``, the conditions of Corollary 4 that fail).

    Examples
    --------
    >>> rep = dppfl_privacy_report(8.0, 1e-3, drop_probability=0.0, sampling_rate=1.0)
    >>> round(rep["calibration"]["sigma1"], 2), round(rep["delivered"]["pld"], 3)
    (94.41, 8.179)
    """
    inner = check_int_scalar(inner, "inner", minimum=1)
    outer = check_int_scalar(outer, "outer", minimum=1)
    releases = releases_of(inner, outer)
    if releases > MAX_PLD_RELEASES:
        raise ValueError(f"inner * outer must be at most {MAX_PLD_RELEASES:g} (K H releases, "
                         f"the limit of the report's PLD accountant), got {inner} * {outer} = "
                         f"{releases:g}")
    drop = check_real_scalar(drop_probability, "drop_probability", low=0.0, high=1.0,
                             high_open=True)
    epsilon = check_positive_scalar(epsilon, "epsilon")
    delta = check_delta(delta)
    ratio = check_positive_scalar(ratio, "ratio")
    q = positive_rate_iv(sampling_rate)
    _report_epsilon_iv(epsilon, delta, releases, q, 1.0 - drop, ratio)
    cal = calibrate_theorem5(epsilon, delta, releases=releases, sampling_rate=q,
                             active_probability=1.0 - drop, ratio=ratio, warn=False)
    q, s1, s2 = broadcast(sampling_rate=cal.sampling_rate, sigma1=cal.sigma1,
                           sigma2=cal.sigma2)
    args = (s1, s2, q, releases, cal.delta)
    rdp = rigorous_epsilon(*args, accountant="rdp")
    vdi = _report_vdi(q, s1, s2, releases, cal.delta, epsilon)
    pld = rigorous_epsilon(*args, accountant="pld", value_discretization_interval=vdi)
    cor4 = {
        "epsilon": corollary4_epsilon(*args, warn=False),
        "epsilon_proof_form": corollary4_epsilon(*args, form="proof", warn=False),
        "epsilon_unrestricted": corollary4_epsilon(*args, restrict_order=False, warn=False),
        "epsilon_proof_form_unrestricted": corollary4_epsilon(
            *args, form="proof", restrict_order=False, warn=False),
        "failed": _corollary4_problems(q, s1, True),
    }
    report = {
        "paper": "DP-PFL (Hu et al., IEEE IoT J. 2020), Theorem 5",
        "setting": {"epsilon": cal.epsilon, "delta": cal.delta, "inner": inner, "outer": outer,
                    "releases": releases, "drop_probability": drop,
                    "active_probability": cal.active_probability,
                    "sampling_rate": cal.sampling_rate, "ratio": cal.ratio,
                    "neighboring_relation": "add_or_remove_one record"},
        "calibration": cal.to_dict(),
        "delivered": {"rdp": rdp, "pld": pld, "rdp_over_target": np.divide(rdp, cal.epsilon),
                      "pld_over_target": np.divide(pld, cal.epsilon),
                      "pld_value_discretization_interval": vdi},
        "corollary4": cor4,
        "corrected": _corrected(epsilon, delta, releases, q, ratio),
    }
    return _jsonable(report)


def _corrected(epsilon, delta, releases, q, ratio):
    """The corrected calibration (:func:`calibrate_rdp`) at the largest q, and what it delivers."""
    q_max = float(np.max(q))
    z = calibrate_rdp(epsilon, delta, releases=releases, sampling_rate=q_max, ratio=ratio)
    return {"sampling_rate": q_max, "sigma1": z, "sigma2": z / ratio,
            "epsilon_rdp": rigorous_epsilon(z, z / ratio, q_max, releases, delta)}


def _report_epsilon_iv(epsilon, delta, releases, q, p, r):
    """Refuse an epsilon whose Theorem 5 noise leaves NOISE_MULTIPLIER_RANGE, giving the range.

    sigma1 = c / epsilon with c = sqrt(2 ln(1.25/delta)) p sqrt(K (q^2 + r^2)), and
    sigma2 = sigma1 / r, so the epsilons that keep every sigma in [lo, hi] form
    the interval [max c / hi, min c / lo] (c over both sigmas and every device).
    """
    lo, hi = NOISE_MULTIPLIER_RANGE
    with np.errstate(over="ignore"):
        c1 = math.sqrt(2.0 * math.log(1.25 / delta)) * p * math.sqrt(releases) * np.hypot(q, r)
        c = np.concatenate([np.ravel(c1), np.ravel(c1 / r)])
    low, high = float(c.max()) / hi, float(c.min()) / lo
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"ratio={r:g} admits no epsilon: sigma1 and sigma2 = sigma1 / ratio "
                         f"cannot both lie in the accountants' range [{lo:g}, {hi:g}]")
    if not low <= epsilon <= high:
        raise ValueError(f"epsilon must lie in [{low * (1 + 1e-6):.6g}, {high * (1 - 1e-6):.6g}] "
                         f"for these settings (Theorem 5's sigma1 and sigma2, proportional to "
                         f"1 / epsilon, must lie in the accountants' range [{lo:g}, {hi:g}]), "
                         f"got {epsilon:g}")


def _report_vdi(q, s1, s2, releases, delta, epsilon):
    """The default PLD grid step, coarsened until every device's grid fits in memory."""
    settings = set(zip(q.ravel().tolist(), s1.ravel().tolist(), s2.ravel().tolist(),
                       strict=True))
    points = max(_pld_points(*key, releases, delta, DEFAULT_VDI) for key in settings)
    if points <= MAX_PLD_POINTS:
        return DEFAULT_VDI
    if points * DEFAULT_VDI / VDI_RANGE[1] > MAX_PLD_POINTS:
        raise ValueError(f"epsilon={epsilon:g} is too large for the report's PLD accountant: "
                         f"even its coarsest grid would need about "
                         f"{points * DEFAULT_VDI / VDI_RANGE[1]:.2g} points (at most "
                         f"{MAX_PLD_POINTS:g}); use a smaller epsilon")
    # the grid shrinks as 1/step: this step brings the largest just under the limit
    return min(DEFAULT_VDI * points / MAX_PLD_POINTS * 1.01, VDI_RANGE[1])


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, float | np.floating):  # strict JSON has no NaN or Infinity
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# --------------------------------------------------------------------------- the corrected variant

@functools.lru_cache(maxsize=256)
def _calibrate_rdp_cached(epsilon, delta, releases, q, ratio):
    def eps_at(z):
        return _rdp_epsilon(q, z, z / ratio, releases, delta, np.array(DEFAULT_ORDERS))

    lo, hi = 1e-3, 1.0
    while eps_at(hi) > epsilon:  # epsilon decreases in z: bracket, then bisect in log z
        lo, hi = hi, hi * 4.0
        if hi > 1e8:
            raise ValueError(f"epsilon={epsilon:g} is out of reach: no noise multiplier z up to "
                             f"1e8 (sigma1 = z, sigma2 = z / ratio with ratio={ratio:g}) "
                             f"certifies it for releases={releases} at delta={delta:g}; raise "
                             "epsilon or lower releases")
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if eps_at(mid) > epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-6:
            break
    return hi


def calibrate_rdp(epsilon, delta, *, releases, sampling_rate, ratio=1.0):
    """The noise multiplier z of DP-PFL's corrected calibration (sigma1 = z, sigma2 = z / r).

    The smallest z (to a relative 1e-6, rounded up) at which
    :func:`rigorous_epsilon` with the RDP accountant certifies (epsilon,
    delta) for ``releases`` iterations at sampling rate q, with no credit
    for the active probability. Unlike :func:`calibrate_theorem5`, the target
    is then met, given the sensitivities of Corollaries 2 and 3.

    Parameters
    ----------
    epsilon : float
        Target > 0.
    delta : float
        In (0, 1).
    releases : int
        K H.
    sampling_rate : float
        q in (0, 1]: the largest fraction of its records any device's local
        solver touches in an iteration.
    ratio : float
        r > 0: sigma2 = sigma1 / r, Theorem 5's relation between the two.

    Raises
    ------
    ValueError
        Also when no z up to 1e8 meets the target.

    Returns
    -------
    float

    Examples
    --------
    >>> z = calibrate_rdp(8.0, 1e-3, releases=20000, sampling_rate=1.0)
    >>> bool(rigorous_epsilon(z, z, 1.0, 20000, 1e-3) <= 8.0)
    True
    """
    epsilon = check_positive_scalar(epsilon, "epsilon")
    delta = check_delta(delta)
    releases = releases_iv(releases)
    q = positive_rate_iv(sampling_rate)
    if q.ndim:
        raise ValueError(f"sampling_rate must be a scalar (the largest q of any device), got "
                         f"shape {q.shape}")
    ratio = check_positive_scalar(ratio, "ratio")
    lo, hi = NOISE_MULTIPLIER_RANGE
    if not lo / hi <= ratio <= hi / lo:
        raise ValueError(f"ratio must lie in [{lo / hi:g}, {hi / lo:g}] (sigma1 = z and sigma2 = "
                         f"z / ratio must both lie in [{lo:g}, {hi:g}]), got {ratio:g}")
    return _calibrate_rdp_cached(epsilon, delta, releases, float(q), ratio)
