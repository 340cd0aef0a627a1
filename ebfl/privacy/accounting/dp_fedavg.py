"""Client-level privacy accounting of DP-FedAvg and of FedHDP's privacy groups.

DP-FedAvg (McMahan et al. 2018; Andrew et al. 2019) samples every client of a
round independently with probability q (Poisson sampling), clips each update
to norm S and adds N(0, z^2 S^2 I) to their sum; z is the *noise multiplier*.
Each round is therefore a Poisson-subsampled Gaussian mechanism and T rounds
compose. "Federated learning with heterogeneous differential privacy" (the
FedHDP paper, Section 4 and Table 7) accounts each privacy group separately
with TensorFlow Privacy's moments accountant; this module reproduces that
accounting with dp-accounting:

* :func:`dp_fedavg_epsilon`: epsilon of T rounds at (q, z), by Renyi DP
  (``accountant="rdp"``, TensorFlow Privacy's orders and its post-2020
  RDP -> (epsilon, delta) conversion) or by privacy-loss distributions
  (``accountant="pld"``, tighter);
* :func:`dp_fedavg_noise_multiplier`: the smallest z that reaches a target
  epsilon (with ``accountant="pld"``, the smaller of the PLD and RDP answers);
* :func:`adaptive_clipping_noise` and :func:`adaptive_clipping_effective_noise`:
  the split of z between the update and the clip count under adaptive
  clipping (Andrew et al. 2019, Theorem 1);
* :func:`fedhdp_group_epsilons`: one epsilon per privacy group of FedHDP.

The neighbouring relation is client level, add or remove one client's whole
dataset (what Poisson sampling is analysed under): the L2 sensitivity of a
round's sum is S and z is the noise standard deviation over S. The epsilon is
a proof for a run only inside that model (Poisson sampling, each sum divided
by a constant such as the expected count): see :mod:`ebfl.privacy.accounting.guarantee`,
whose keys every result here carries.

With T = 500 rounds and delta = 1e-4 the RDP accountant gives the paper's
Table 7 guarantees: (q, z) = (0.05, 1.5) -> 3.608 (the paper's 3.6),
(0.03, 4.0) -> 0.576 (0.6), (0.03, 1.0) -> 4.122 (4.1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf, privacy_loss_distribution
from dp_accounting.privacy_accountant import NeighboringRelation

from ebfl._validation import (
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
)
from ebfl.privacy.accounting.accountant import ACCOUNTANTS
from ebfl.privacy.accounting.core import (
    CONVERSIONS,
    DEFAULT_VDI,
    NoiseSearch,
    _epsilon_and_order,
    check_delta,
    check_noise_multiplier,
    check_orders,
    check_pld_points,
    check_sampling_rate,
    check_vdi,
    gaussian_pld_points,
)
from ebfl.privacy.accounting.guarantee import ACCOUNTANT_MODEL
from ebfl.privacy.accounting.rdp import event_rdp

__all__ = [
    "TFP_ORDERS",
    "DPFedAvgPrivacy",
    "NoiseCalibration",
    "adaptive_clipping_effective_noise",
    "adaptive_clipping_noise",
    "dp_fedavg_epsilon",
    "dp_fedavg_noise_multiplier",
    "dp_fedavg_rdp",
    "fedhdp_group_epsilons",
]

#: TensorFlow Privacy's default RDP orders, {1 + x/10 : x = 1..99} u {12..63} u {128, 256, 512}
#: (the orders the FedHDP paper's accountant used).
TFP_ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
                   + [128.0, 256.0, 512.0])
#: Noise multipliers searched by :func:`dp_fedavg_noise_multiplier` (below 1e-3 epsilon
#: exceeds 1e8 at any sampling rate).
SEARCH_RANGE = (1e-3, 1e6)
#: Largest number of rounds (exact as a float).
MAX_ROUNDS = 2**53
#: Most privacy groups of :func:`fedhdp_group_epsilons` (one accountant call each).
MAX_GROUPS = 1000
#: Beside the core's grid guard (one round's grid, and the composed loss range in grid
#: steps, checked by the RDP epsilon before any PLD is built): the composed grid, the
#: length of the FFT that dp-accounting's self-composition allocates (1e7: about 1 GB
#: and 15 s).
MAX_PLD_COMPOSED_POINTS = 1e7

_RELATION = NeighboringRelation.ADD_OR_REMOVE_ONE


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class DPFedAvgPrivacy:
    """The client-level (epsilon, delta) of T rounds of DP-FedAvg, and how it was obtained.

    Attributes
    ----------
    epsilon, delta : float
        The guarantee.
    order : float or None
        The Renyi order of the conversion (RDP accountant), else None.
    accountant : str
        ``"rdp"`` or ``"pld"``.
    conversion : str or None
        RDP -> DP conversion (``"improved"`` or ``"classic"``); None for PLD.
    sampling_rate, noise_multiplier : float
        q and z.
    n_rounds : int
        T.
    orders : tuple of float or None
        The Renyi orders (RDP accountant).
    value_discretization_interval : float or None
        The PLD grid step (PLD accountant).
    sampling, denominator, neighboring_relation, accountant_model : str
        The model the epsilon is a proof for (``"poisson"``, ``"expected"``,
        ``"add_or_remove_one"``): a run is covered only if it samples and
        normalizes so (see :func:`ebfl.privacy.accounting.guarantee.dp_fedavg_guarantee`).
    """

    epsilon: float
    delta: float
    order: float | None
    accountant: str
    conversion: str | None
    sampling_rate: float
    noise_multiplier: float
    n_rounds: int
    orders: tuple | None = None
    value_discretization_interval: float | None = None
    sampling: str = "poisson"
    denominator: str = "expected"
    neighboring_relation: str = "add_or_remove_one"
    accountant_model: str = ACCOUNTANT_MODEL

    def to_dict(self):
        """A JSON-able dict of every field (``orders`` as a list)."""
        out = asdict(self)
        if out["orders"] is not None:
            out["orders"] = list(out["orders"])
        return out


@dataclass(frozen=True)
class NoiseCalibration:
    """The noise multiplier that reaches a target epsilon (:func:`dp_fedavg_noise_multiplier`).

    Attributes
    ----------
    noise_multiplier : float
        z, with ``epsilon <= target_epsilon`` when ``converged``.
    epsilon : float
        The epsilon at ``noise_multiplier``.
    target_epsilon, delta : float
    sampling_rate : float
    n_rounds : int
    accountant : str
        The accountant asked for.
    converged : bool
        Whether z is the smallest multiplier reaching the target, to ``rtol``.
    at_bound : bool
        Whether the search stopped at an end of its range (then not converged).
    evaluations : int
        Accountant calls made.
    certified_by : str
        The accountant whose epsilon at z is ``epsilon`` (<= the target when
        converged): ``"rdp"`` or ``"pld"``. With ``accountant="pld"`` it is
        ``"rdp"`` where the RDP accountant needs less noise (PLD's
        discretization error grows with the number of rounds).
    sampling, denominator, neighboring_relation : str
        The model the guarantee holds in (as :class:`DPFedAvgPrivacy`).
    """

    noise_multiplier: float
    epsilon: float
    target_epsilon: float
    delta: float
    sampling_rate: float
    n_rounds: int
    accountant: str
    converged: bool
    at_bound: bool
    evaluations: int
    certified_by: str = "rdp"
    sampling: str = "poisson"
    denominator: str = "expected"
    neighboring_relation: str = "add_or_remove_one"

    def to_dict(self):
        """A JSON-able dict of every field."""
        return asdict(self)


# --------------------------------------------------------------------------- validation


def _rounds_iv(n_rounds):
    return check_int_scalar(n_rounds, "n_rounds", minimum=1, maximum=MAX_ROUNDS)


# --------------------------------------------------------------------------- kernels


def _round_event(q, z):
    """One round: the Poisson-sampled Gaussian (the plain Gaussian at q = 1)."""
    gauss = dp_event.GaussianDpEvent(z)
    return gauss if q == 1.0 else dp_event.PoissonSampledDpEvent(q, gauss)


def _rdp_curve(q, z, n_rounds, orders):
    """T RDP_a: rounds compose by adding their RDP (the core's RDP of the event, exact at
    fractional orders, see :func:`ebfl.privacy.accounting.rdp.poisson_gaussian_rdp`)."""
    return event_rdp(dp_event.SelfComposedDpEvent(_round_event(q, z), n_rounds), orders)


def _check_pld_size(q, z, n_rounds, delta, vdi):
    """Refuse a PLD computation too large for memory, before anything is built.

    One round's grid is about (2 t + 1/z)/z points over the grid step (the
    Gaussian's privacy loss is linear over t = 10 standard deviations each
    side); the composed loss reaches about epsilon (the RDP epsilon, cheap,
    bounds PLD's).
    """
    check_pld_points(gaussian_pld_points(z, vdi), what=f"per round at noise_multiplier={z:g}",
                     vdi=vdi)
    orders = np.array(TFP_ORDERS)
    eps = _epsilon_and_order(orders, _rdp_curve(q, z, n_rounds, orders), delta, "improved")[0]
    check_pld_points(eps / vdi, what=f"for the composed privacy loss (range about {eps:.3g} "
                     f"after n_rounds={n_rounds} at noise_multiplier={z:g})", vdi=vdi)


def _composed_points(pld, n_rounds):
    """The FFT length of ``pld.self_compose(rounds)``: dp-accounting's own Chernoff bounds
    on the composed support (1e-15 tail mass, its default), evaluated before it allocates.

    Its bounds use orders of at most 20 over the round's grid length, so they are loose
    for many rounds: 4e8 points at (q, z, T) = (0.01, 10, 1e9).
    """
    sizes = []
    pmfs = {id(p): p for p in (pld._pmf_remove, pld._pmf_add)}  # no public accessor
    for pmf in pmfs.values():
        lo, hi = pld_common.compute_self_convolve_bounds(pmf.to_dense_pmf()._probs, n_rounds,
                                                         1e-15)
        sizes.append(hi - lo + 1)
    return max(sizes)


def _pld_epsilon(q, z, n_rounds, delta, vdi):
    _check_pld_size(q, z, n_rounds, delta, vdi)
    # one round's PLD, as dp-accounting's PLDAccountant builds it for the event
    one = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z, value_discretization_interval=vdi, sampling_prob=q,
        neighboring_relation=_RELATION)
    points = _composed_points(one, n_rounds)
    if points > MAX_PLD_COMPOSED_POINTS:
        raise ValueError(f"accountant='pld' would compose n_rounds={n_rounds} on a grid of about "
                         f"{points:.2g} points at noise_multiplier={z:g} (at most "
                         f"{MAX_PLD_COMPOSED_POINTS:g}): raise value_discretization_interval "
                         f"(now {vdi:g}) or use accountant='rdp'")
    # as PLDAccountant.compose: the identity composed with the T-fold self-composition
    composed = privacy_loss_distribution.identity(value_discretization_interval=vdi)
    return float(composed.compose(_self_compose(one, n_rounds)).get_epsilon_for_delta(delta))


def _self_compose(pld, n_rounds):
    """``pld.self_compose(rounds)`` without its ``size ** rounds`` for a sparse PMF.

    dp-accounting decides whether a sparse PMF must become dense from the integer
    ``size ** rounds``, a number of ``n_rounds`` digits (minutes at 1e9 rounds), and then
    densifies it; a PMF it would densify is densified here first, so the result is the
    same.
    """
    sparse_limit = math.log(pld_pmf._MAX_PMF_SPARSE_SIZE)
    pmfs = []
    for pmf in (pld._pmf_remove, pld._pmf_add):
        if (isinstance(pmf, pld_pmf.SparsePLDPmf) and pmf.size > 1
                and n_rounds * math.log(pmf.size) > sparse_limit):
            pmf = pmf.to_dense_pmf()
        pmfs.append(pmf)
    remove, add = pmfs
    return privacy_loss_distribution.PrivacyLossDistribution(
        remove, None if pld._symmetric else add).self_compose(n_rounds)


def _epsilon(q, z, n_rounds, delta, accountant, orders, conversion, vdi):
    if accountant == "rdp":
        return _epsilon_and_order(orders, _rdp_curve(q, z, n_rounds, orders), delta, conversion)
    return _pld_epsilon(q, z, n_rounds, delta, vdi), None


# --------------------------------------------------------------------------- public API


def dp_fedavg_rdp(*, sampling_rate, noise_multiplier, n_rounds, orders=None):
    """The RDP curve of T rounds of DP-FedAvg: T * RDP_a of the Poisson-sampled Gaussian.

    Parameters
    ----------
    sampling_rate : float
        q in (0, 1], the probability that a client takes part in a round.
    noise_multiplier : float
        z in [1e-3, 1e8]: noise standard deviation over the clip norm.
    n_rounds : int
        T >= 1.
    orders : array_like, optional
        Renyi orders in (1, 1e6], at most 1000 of them; default :data:`TFP_ORDERS`.

    Returns
    -------
    orders, rdp : ndarray (n_orders,)
        The orders and the composed RDP at each (finite for q < 1 at every
        order below 2).

    Notes
    -----
    dp-accounting computes integer orders from the binomial expansion of
    Mironov, Talwar and Zhang (2019) and fractional orders from a series whose
    absolute values it sums: an upper bound, 18% above the exact value at (q,
    z, a) = (0.05, 1, 1.5), twice it at (0.05, 5, 1.1), and +inf where the
    series does not converge (e.g. q = 0.3, z = 0.7, every order below 1.9).
    Orders below 2 are where many rounds are converted, so here
    (:func:`ebfl.privacy.accounting.rdp.poisson_gaussian_rdp`) they are
    computed by quadrature, to about 1e-9 relative error and rounded up;
    integer orders by the binomial sum without its cancelling terms (exact
    also for tiny RDP); fractional orders in [2, 12) by dp-accounting's
    series, capped by the next integer order (RDP does not decrease with the
    order); see the function for the rest.
    On the paper's settings this moves epsilon by less than 3e-4.

    Examples
    --------
    >>> orders, rdp = dp_fedavg_rdp(sampling_rate=1.0, noise_multiplier=2.0, n_rounds=10,
    ...                             orders=[2.0, 8.0])
    >>> rdp.tolist()  # T a / (2 z^2) without sampling
    [2.5, 10.0]
    """
    q = check_sampling_rate(sampling_rate)
    z = check_noise_multiplier(noise_multiplier)
    n_rounds = _rounds_iv(n_rounds)
    orders = check_orders(orders, TFP_ORDERS)
    return orders.copy(), np.asarray(_rdp_curve(q, z, n_rounds, orders), dtype=np.float64)


def dp_fedavg_epsilon(*, sampling_rate, noise_multiplier, n_rounds, delta, accountant="rdp",
                      orders=None, conversion="improved",
                      value_discretization_interval=DEFAULT_VDI):
    r"""Client-level epsilon of T rounds of DP-FedAvg with Poisson sampling.

    Each round samples every client with probability q and releases the sum of
    the clipped updates (norm <= S) plus N(0, z^2 S^2 I); rounds compose.

    Parameters
    ----------
    sampling_rate : float
        q in (0, 1].
    noise_multiplier : float
        z in [1e-3, 1e8].
    n_rounds : int
        T in [1, 2^53].
    delta : float
        In (0, 1).
    accountant : {"rdp", "pld"}
        ``"rdp"``: dp-accounting's RDP of the Poisson-sampled Gaussian at
        ``orders``, composed T times and converted by ``conversion``.
        ``"pld"``: its privacy-loss-distribution accountant (tighter;
        pessimistic discretization, so still an upper bound up to the
        discretization error).
    orders : array_like, optional
        Renyi orders in (1, 1e6]; default :data:`TFP_ORDERS` (TensorFlow
        Privacy's). RDP only.
    conversion : {"improved", "classic"}
        RDP -> (epsilon, delta). ``"improved"`` (Balle et al. 2020, Prop. 12;
        TensorFlow Privacy since 2020):

        .. math:: \varepsilon = \min_\alpha\, T\,\mathrm{RDP}_\alpha
                  + \log\frac{\alpha-1}{\alpha} - \frac{\log\delta + \log\alpha}{\alpha-1}

        ``"classic"`` (Mironov 2017, Prop. 3): min over alpha of
        T RDP_alpha - log(delta)/(alpha - 1). RDP only.
    value_discretization_interval : float
        PLD grid step in [1e-8, 1] (default 1e-4: epsilon stable to about
        1e-5). PLD only; settings whose grid would be too large for memory
        (noise multipliers below about 0.15, or epsilon above about 200) are
        refused with a ValueError.

    Returns
    -------
    DPFedAvgPrivacy

    Examples
    --------
    The non-IID MNIST row of the FedHDP paper's Table 7 (epsilon = 3.6):

    >>> res = dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=1.5, n_rounds=500,
    ...                         delta=1e-4)
    >>> round(res.epsilon, 3), res.order
    (3.608, 5.1)
    >>> pld = dp_fedavg_epsilon(sampling_rate=0.05, noise_multiplier=1.5, n_rounds=500,
    ...                         delta=1e-4, accountant="pld")
    >>> round(pld.epsilon, 3)  # tighter
    3.237
    """
    q = check_sampling_rate(sampling_rate)
    z = check_noise_multiplier(noise_multiplier)
    n_rounds = _rounds_iv(n_rounds)
    delta = check_delta(delta)
    accountant = check_choice(accountant, "accountant", ACCOUNTANTS)
    conversion = check_choice(conversion, "conversion", CONVERSIONS)
    orders = check_orders(orders, TFP_ORDERS)
    vdi = check_vdi(value_discretization_interval)
    eps, order = _epsilon(q, z, n_rounds, delta, accountant, orders, conversion, vdi)
    rdp = accountant == "rdp"
    return DPFedAvgPrivacy(eps, delta, order, accountant, conversion if rdp else None, q, z,
                           n_rounds, tuple(float(a) for a in orders) if rdp else None,
                           None if rdp else vdi)


def dp_fedavg_noise_multiplier(*, sampling_rate, n_rounds, delta, epsilon, accountant="rdp",
                               orders=None, conversion="improved",
                               value_discretization_interval=DEFAULT_VDI, rtol=1e-6):
    """The smallest noise multiplier z whose T rounds of DP-FedAvg are (epsilon, delta)-DP.

    epsilon decreases with z, so z is found by a bracketed root search (Brent's
    method on log z, after bracketing by factors of 2 from z = 1 within
    [1e-3, 1e6]); the answer is the smallest z evaluated whose epsilon is
    <= the target, so the guarantee holds at the returned z.

    With ``accountant="pld"`` the RDP answer is found first and the PLD search
    starts from it: both accountants give valid upper bounds on epsilon, so
    the smaller z that either certifies is valid, and the result never needs
    more noise than the RDP accountant (PLD's pessimistic discretization adds
    error with every composition: at 1e6 rounds it can exceed the target
    itself). ``certified_by`` says which one certified z.

    Parameters
    ----------
    sampling_rate, rounds, delta, accountant, orders, conversion, value_discretization_interval
        As in :func:`dp_fedavg_epsilon`.
    epsilon : float
        Target epsilon > 0.
    rtol : float
        Relative tolerance on z, in [1e-12, 0.1].

    Returns
    -------
    NoiseCalibration
        ``converged`` False, ``at_bound`` True and a RuntimeWarning when the
        target is not reached within the range (z = 1e6 still above it), or is
        reached already at the smallest z the accountant accepts.

    Raises
    ------
    ValueError
        For arguments out of range (named). A PLD evaluation that would need
        too much memory ends the PLD search there; the RDP answer stands.

    Examples
    --------
    It inverts :func:`dp_fedavg_epsilon` (FMNIST in Table 7 of the FedHDP paper):

    >>> eps = dp_fedavg_epsilon(sampling_rate=0.03, noise_multiplier=4.0, n_rounds=500,
    ...                         delta=1e-4).epsilon
    >>> cal = dp_fedavg_noise_multiplier(sampling_rate=0.03, n_rounds=500, delta=1e-4,
    ...                                  epsilon=eps)
    >>> round(cal.noise_multiplier, 5), cal.converged, cal.epsilon <= eps
    (4.0, True, True)
    """
    q = check_sampling_rate(sampling_rate)
    n_rounds = _rounds_iv(n_rounds)
    delta = check_delta(delta)
    target = check_positive_scalar(epsilon, "epsilon")
    accountant = check_choice(accountant, "accountant", ACCOUNTANTS)
    conversion = check_choice(conversion, "conversion", CONVERSIONS)
    orders = check_orders(orders, TFP_ORDERS)
    vdi = check_vdi(value_discretization_interval)
    rtol = check_real_scalar(rtol, "rtol", low=1e-12, high=0.1)
    def epsilon_of(accountant):
        return lambda z: _epsilon(q, z, n_rounds, delta, accountant, orders, conversion, vdi)[0]

    low, high = SEARCH_RANGE
    search = NoiseSearch(epsilon_of("rdp"), target, low=low, high=high)
    z, converged, at_bound = search.solve(rtol)
    certified_by, evaluations = "rdp", search.evaluations
    if accountant == "pld" and search.epsilon(z) <= target and z > search.lowest:
        # Both accountants bound epsilon from above, so the smaller z that either certifies
        # is valid. PLD can only do better below the RDP answer: search down from it.
        pld = NoiseSearch(epsilon_of("pld"), target, low=low, high=high)
        if pld.reachable(z) and pld.epsilon(z) <= target:
            found = pld.solve(rtol, start=z)
            if found[0] < z or pld.epsilon(z) < search.epsilon(z):
                search, (z, converged, at_bound), certified_by = pld, found, "pld"
        evaluations += pld.evaluations
    _warn_search(search, z, target, rtol, converged, at_bound)
    return NoiseCalibration(z, search.epsilon(z), target, delta, q, n_rounds, accountant,
                            converged, at_bound, evaluations, certified_by)


def _warn_search(search, z, target, rtol, converged, at_bound):
    if at_bound:
        where = ("is not reached at the largest noise multiplier" if search.epsilon(z) > target
                 else "is reached already at the smallest noise multiplier searched")
        warnings.warn(f"dp_fedavg_noise_multiplier: the target epsilon {target:g} {where}, "
                      f"z = {z:g} (epsilon {search.epsilon(z):g}); the search range is "
                      f"[{search.lowest:g}, {search.highest:g}]", RuntimeWarning,
                      stacklevel=3)
    elif not converged:
        warnings.warn(f"dp_fedavg_noise_multiplier: z = {z:g} is not within rtol={rtol:g} of "
                      "the smallest noise multiplier reaching the target", RuntimeWarning,
                      stacklevel=3)


def adaptive_clipping_noise(noise_multiplier, count_noise):
    r"""z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the update noise under adaptive clipping.

    With adaptive clipping each round releases two Gaussian sums over the same
    sampled clients: the clipped updates (sensitivity S, noise std
    z_Delta S) and the count of unclipped updates, centred as sum(b - 1/2)
    (sensitivity 1/2, noise std sigma_b, i.e. multiplier 2 sigma_b). Together
    they are one Gaussian mechanism with 1/z^2 = 1/z_Delta^2 + 1/(2 sigma_b)^2
    (Andrew et al. 2019, Theorem 1), so a budget accounted at z leaves z_Delta
    for the update.

    Parameters
    ----------
    noise_multiplier : float
        z >= 0, the multiplier the round is accounted at (0: no noise, and 0
        is returned).
    count_noise : float
        sigma_b > z / 2, the noise std on the count.

    Returns
    -------
    float
        z_Delta >= z.

    Raises
    ------
    ValueError
        When 2 sigma_b <= z: the count alone would spend the whole budget.

    Examples
    --------
    >>> z_delta = adaptive_clipping_noise(1.0, 5.0)   # sigma_b = K/20 with K = 100 clients
    >>> round(z_delta, 6), round(adaptive_clipping_effective_noise(z_delta, 5.0), 12)
    (1.005038, 1.0)
    """
    z = check_nonnegative_scalar(noise_multiplier, "noise_multiplier")
    sigma_b = check_positive_scalar(count_noise, "count_noise")
    if z == 0.0:
        return 0.0
    ratio = (z / 2.0) / sigma_b  # z / (2 sigma_b), without overflowing 2 sigma_b
    if ratio >= 1.0:
        raise ValueError(f"count_noise must be > noise_multiplier / 2 = {z / 2:g} (with "
                         f"2 sigma_b <= z the count alone spends the budget), got {sigma_b:g}")
    # in units of z: z / sqrt((1 - r)(1 + r)), r = z / (2 sigma_b): no overflow for tiny z,
    # and 1 - r kept exact when sigma_b is just above z / 2
    out = z / math.sqrt((1.0 - ratio) * (1.0 + ratio))
    if not math.isfinite(out):
        raise ValueError(f"count_noise={sigma_b:g} is so close to noise_multiplier / 2 = "
                         f"{z / 2:g} that the update's multiplier overflows float64")
    return out


def adaptive_clipping_effective_noise(update_noise_multiplier, count_noise):
    """z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2): the multiplier the update and count are
    accounted at (the inverse of :func:`adaptive_clipping_noise`).

    Parameters
    ----------
    update_noise_multiplier : float
        z_Delta >= 0 (0: no noise, and 0 is returned).
    count_noise : float
        sigma_b > 0.

    Returns
    -------
    float
        z < min(z_Delta, 2 sigma_b).

    Examples
    --------
    >>> round(adaptive_clipping_effective_noise(2.0, 1.0), 6)  # 1 / sqrt(1/4 + 1/4)
    1.414214
    """
    z_delta = check_nonnegative_scalar(update_noise_multiplier, "update_noise_multiplier")
    sigma_b = check_positive_scalar(count_noise, "count_noise")
    if z_delta == 0.0:
        return 0.0
    # 1 / hypot(1/a, 1/b) = min / hypot(1, min / max): no overflow of 1/a for a tiny a
    a, b = sorted((z_delta, 2.0 * sigma_b))  # 2 sigma_b = inf for huge sigma_b: then z_delta
    return a / math.hypot(1.0, a / b)


def fedhdp_group_epsilons(sampling_rate, noise_multipliers, n_rounds, delta, *, accountant="rdp",
                          orders=None, value_discretization_interval=DEFAULT_VDI):
    """FedHDP's epsilon for each privacy group, accounted separately (Section 4 of the paper).

    Algorithm 2 of the FedHDP paper adds noise of multiplier z_i to the
    (clipped) update sum of each privacy group; a client's data enter only its
    group's release, so each group i is a DP-FedAvg of (q, z_i) over T rounds
    and the groups compose in parallel: the whole run is (max_i eps_i,
    max_i delta)-DP (eq. (3)).

    Parameters
    ----------
    sampling_rate : float or array_like (l,)
        q in (0, 1], for every group or one per group.
    noise_multipliers : array_like (l,)
        z_i per group; 0 for a non-private group (its epsilon is +inf), else in
        [1e-3, 1e8]; at most 1000 groups.
    n_rounds : int
    delta : float
    accountant, orders, value_discretization_interval
        As in :func:`dp_fedavg_epsilon` (improved conversion).

    Returns
    -------
    ndarray (l,)
        epsilon of each group (+inf for z_i = 0).

    Notes
    -----
    The accounting is that of the group's noisy *sum* under Poisson sampling.
    Algorithm 2 divides it by the realized group size N_i^t, which depends on
    who took part: for such a run the epsilon is not a proof. Dividing by the
    expected size q M_i instead (McMahan et al. 2018; ``denominator="expected"``
    of :class:`~ebfl.fedhdp.algorithm.FedHDP`) needs no assumption;
    :meth:`FedHDP.privacy <ebfl.fedhdp.algorithm.FedHDP.privacy>` records
    which case a run is in (:mod:`ebfl.privacy.accounting.guarantee`).

    Examples
    --------
    Opt-out clients (z = 0) and private ones at Table 7's FEMNIST setting:

    >>> fedhdp_group_epsilons(0.03, [0.0, 1.0], 500, 1e-4).round(3).tolist()
    [inf, 4.122]
    """
    n_rounds, delta = _rounds_iv(n_rounds), check_delta(delta)
    accountant = check_choice(accountant, "accountant", ACCOUNTANTS)
    orders = check_orders(orders, TFP_ORDERS)
    vdi = check_vdi(value_discretization_interval)
    z = check_finite_array(noise_multipliers, "noise_multipliers", ndim=1)
    if z.size > MAX_GROUPS:
        raise ValueError(f"noise_multipliers must have at most {MAX_GROUPS} entries (privacy "
                         f"groups), got {z.size}")
    if not isinstance(sampling_rate, list | tuple | np.ndarray):  # one rate for every group
        q = np.full(z.size, check_sampling_rate(sampling_rate))
    else:
        q = check_finite_array(sampling_rate, "sampling_rate", ndim=(0, 1))
        q = np.full(z.size, float(q)) if q.ndim == 0 else q
        if q.shape != z.shape:
            raise ValueError(f"sampling_rate must be a scalar or have one entry per group "
                             f"({z.size}), got shape {q.shape}")
    for i, (qi, zi) in enumerate(zip(q.tolist(), z.tolist(), strict=True)):
        check_sampling_rate(qi, f"sampling_rate[{i}]")
        if zi < 0.0:
            raise ValueError(f"noise_multipliers must be >= 0 (0: non-private), got {zi!r} "
                             f"for group {i}")
        if zi != 0.0:
            check_noise_multiplier(zi, f"noise_multipliers[{i}]")
    out = np.full(z.size, math.inf)
    done = {}  # groups with the same (q, z) share one accountant call
    for i, (qi, zi) in enumerate(zip(q.tolist(), z.tolist(), strict=True)):
        if zi != 0.0:
            if (qi, zi) not in done:
                done[qi, zi] = _epsilon(qi, zi, n_rounds, delta, accountant, orders, "improved",
                                        vdi)[0]
            out[i] = done[qi, zi]
    return out
