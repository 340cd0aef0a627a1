"""User-level privacy accounting for DP-AdaPeD (Theorem 7).

Two things live here, kept apart on purpose:

* the paper's bound, :func:`theorem7_rdp`, reproduced exactly as printed; the
  paper's RDP -> (epsilon, delta) conversion (its Lemma 2) is the core's
  improved conversion (:func:`~ebfl.privacy.accounting.core.rdp_to_epsilon`,
  :func:`~ebfl.privacy.accounting.core.rdp_to_delta`);
* a correct accountant, :class:`DPAdaPeDAccountant` (and the one-call
  :func:`dp_adaped_epsilon`), that models one synchronization round as a
  (sub)sampled Gaussian mechanism with the sensitivity tau C (errata [!13]) and
  composes it on the core (:class:`~ebfl.privacy.accounting.accountant.Accountant`:
  RDP or PLD).

The layering follows Opacus: pure keyword-only functions do the maths; the
accountant only records ``(noise_multiplier, sampling, rounds)`` and delegates.

Conventions used throughout
---------------------------
* One *round* is one synchronization period of ``sync_gap`` (tau) local
  iterations; a run of T iterations has T/tau rounds, and T must be a multiple
  of tau (errata [!13]).
* Accepted ranges: clip norms and noise standard deviations in [1e-50, 1e50],
  counts (clients, iterations, rounds) up to 2^53, Renyi orders in (1, 1e6];
  outside them ``ValueError`` names the argument. Inside them no intermediate
  value leaves float64.
* ``noise_multiplier`` follows the ``dp_accounting.GaussianDpEvent`` docstring:
  standard deviation of the noise on the released sum divided by the norm bound
  of ONE client's contribution to that sum (tau*C here). Under the
  replace-one relation the L2 sensitivity is twice that bound.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from ebfl._plotting import check_plot_path, result_figure
from ebfl._validation import check_choice, check_int_scalar, check_positive_scalar
from ebfl.privacy.accounting.accountant import Accountant
from ebfl.privacy.accounting.core import (
    DEFAULT_VDI,
    check_orders,
    check_pld_points,
    gaussian_pld_points,
)

__all__ = [
    "DPAdaPeDAccountant",
    "PrivacySpent",
    "RoundRecord",
    "dp_adaped_epsilon",
    "dp_adaped_noise_multiplier",
    "theorem7_rdp",
]


#: Accepted range of clip norms and noise standard deviations: noise multipliers
#: then stay in [1e-108, 1e108] and every RDP value below 1e240.
SCALE_RANGE = (1e-50, 1e50)
#: Largest count (clients, iterations, rounds): exactly representable as a float.
MAX_COUNT = 2**53

_SAMPLINGS = ("without_replacement", "poisson")
_TRUSTS = ("aggregator", "local")


# --------------------------------------------------------------------------- validation





def _count(value, name, minimum=1):
    value = check_int_scalar(value, name, minimum=minimum)
    if value > MAX_COUNT:
        raise ValueError(f"{name} must be an integer in [{minimum}, 2**53], got {value}")
    return value


def _scale(value, name):
    value = check_positive_scalar(value, name)
    lo, hi = SCALE_RANGE
    if not lo <= value <= hi:
        raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}], got {value!r}")
    return value


def _rounds_iv(n_iterations, sync_gap):
    n_iterations = _count(n_iterations, "n_iterations")
    sync_gap = _count(sync_gap, "sync_gap")
    if n_iterations % sync_gap:
        raise ValueError(f"n_iterations must be a multiple of sync_gap (T/tau synchronization "
                         f"rounds), got n_iterations={n_iterations}, sync_gap={sync_gap}")
    return n_iterations // sync_gap, sync_gap


def _sampled_iv(n_sampled, n_clients):
    n_sampled = _count(n_sampled, "n_sampled")
    if n_sampled > n_clients:
        raise ValueError(f"n_sampled must be an integer in [1, n_clients={n_clients}], "
                         f"got {n_sampled}")
    return n_sampled


def _blocks_iv(clip_mu, noise_mu, clip_psi, noise_psi):
    """Return [(C, sigma), ...]: one block (concatenated variant) or two (mu and psi)."""
    blocks = [(_scale(clip_mu, "clip_mu"), _scale(noise_mu, "noise_mu"))]
    if (clip_psi is None) != (noise_psi is None):
        raise ValueError("clip_psi and noise_psi must be given together (separate clipping of "
                         "psi) or both be None (concatenated [h; k] variant)")
    if clip_psi is not None:
        blocks.append((_scale(clip_psi, "clip_psi"), _scale(noise_psi, "noise_psi")))
    return blocks


# --------------------------------------------------------------------------- Theorem 7


def theorem7_rdp(orders, *, n_clients, n_sampled, n_iterations, sync_gap, clip_mu, noise_mu,
                 clip_psi=None, noise_psi=None):
    r"""RDP curve of DP-AdaPeD exactly as printed in Theorem 7.

    .. math::
        \varepsilon(\alpha) = \Big(\frac{K}{m}\Big)^2 \, 6 \, \frac{T}{\tau} \, \alpha
        \Big(\frac{C_1^2}{K\sigma_{q1}^2} + \frac{C_2^2}{K\sigma_{q2}^2}\Big)

    This is the paper's claim, NOT a valid privacy guarantee: see Notes, and
    use :class:`DPAdaPeDAccountant` for a correct one.

    Parameters
    ----------
    orders : float or array_like of shape (n_orders,)
        Renyi orders alpha, each > 1.
    n_clients : int
        m, the number of clients, >= 1.
    n_sampled : int
        K, the clients sampled per round, in [1, m].
    n_iterations : int
        T, the total number of local iterations; a multiple of ``sync_gap``.
    sync_gap : int
        tau, local iterations per synchronization round, >= 1.
    clip_mu, noise_mu : float
        C1 and sigma_q1 (> 0): clip norm of h and standard deviation of the
        noise added to it at every local step.
    clip_psi, noise_psi : float or None, default=None
        C2 and sigma_q2 (> 0) for the separately clipped psi gradient k. Leave
        both None for the concatenated variant (one clip norm
        C = ``clip_mu`` and one noise scale sigma = ``noise_mu`` on [h; k]),
        whose curve is 6 (K/m)^2 (T/tau) alpha C^2/(K sigma^2).

    Returns
    -------
    rdp : float or ndarray of shape (n_orders,)
        epsilon(alpha) at each order (a float for scalar ``orders``).

    See Also
    --------
    DPAdaPeDAccountant : a correct accountant for the same mechanism.
    ebfl.privacy.accounting.core.rdp_to_epsilon : Lemma 2 conversion to (epsilon, delta)-DP.

    Notes
    -----
    Flaws of the bound (errata [!13]); the value is linear in alpha,
    so it carries its errors unchanged into every conversion:

    * (a) Sensitivity. The tau clipped steps of a round can add up
      coherently, so one client moves the aggregate by up to tau*C (not
      sqrt(tau)*C, eq. (67)); with the paper's own noise accounting the RDP is
      optimistic by a factor tau. Under the paper's replace-one neighbouring
      relation (App. A.3) the sensitivity is 2*tau*C, a further factor 4.
    * (b) Trust. The 1/K in the noise term needs a trusted aggregator or
      secure aggregation; if the server sees each mu_i the benefit vanishes.
    * (c) Sampling. Algorithm 5 samples a fixed-size set of K clients, while
      the q^2 subsampled-Gaussian bound and its constant 6 hold for Poisson
      sampling under unstated conditions (small q, large noise multiplier,
      bounded alpha).
    * (d) The proof composes over "t in [T]" in words but T/tau rounds in the
      formula; the formula (T/tau) is used here, and T must be a multiple of
      tau.

    Examples
    --------
    FEMNIST setting of Section 4.1 (noise multipliers sigma/C = 5): c = 0.582.

    >>> c = theorem7_rdp(2.0, n_clients=66, n_sampled=22, n_iterations=2400, sync_gap=10,
    ...                  clip_mu=1.0, noise_mu=5.0, clip_psi=1.0, noise_psi=5.0) / 2.0
    >>> round(c, 3)
    0.582
    """
    scalar = np.ndim(orders) == 0
    orders = check_orders(np.atleast_1d(orders) if scalar else orders)
    n_clients = _count(n_clients, "n_clients")
    n_sampled = _sampled_iv(n_sampled, n_clients)
    n_rounds, _ = _rounds_iv(n_iterations, sync_gap)
    blocks = _blocks_iv(clip_mu, noise_mu, clip_psi, noise_psi)
    # (c/s)^2 rather than c^2/s^2: in the accepted ranges nothing overflows.
    per_alpha = ((n_sampled / n_clients) ** 2 * 6.0 * n_rounds
                 * sum((c / s) ** 2 / n_sampled for c, s in blocks))
    rdp = per_alpha * orders
    return float(rdp[0]) if scalar else rdp


# --------------------------------------------------------------------------- mechanism model


def dp_adaped_noise_multiplier(*, n_sampled, sync_gap, clip_mu, noise_mu, clip_psi=None,
                               noise_psi=None, trust="aggregator"):
    r"""Noise multiplier of one DP-AdaPeD synchronization round.

    Each sampled client runs tau local steps, each adding a clipped update
    (norm <= C) plus N(0, sigma^2 I); the tau updates can align, so one
    client's contribution to the released sum has norm <= tau*C (errata
    [!13]). The noise on the released quantity has variance
    n_noise*tau*sigma^2, with n_noise = K when only the sum is seen (trusted
    aggregator or secure aggregation) and n_noise = 1 when the server sees
    each client's mu_i (errata [!13]). Per block

    .. math:: z_j = \frac{\sigma_j\sqrt{n_\text{noise}\,\tau}}{\tau C_j},

    and the mu and psi blocks, released together on the same sample, form one
    Gaussian mechanism with :math:`z^{-2} = z_1^{-2} + z_2^{-2}` (rescale each
    block by its noise standard deviation).

    Parameters
    ----------
    n_sampled : int
        K, clients whose noisy updates are summed, >= 1 (unused when
        ``trust="local"``).
    sync_gap : int
        tau, local steps per round, >= 1.
    clip_mu, noise_mu : float
        C1 and sigma_q1, > 0.
    clip_psi, noise_psi : float or None, default=None
        C2 and sigma_q2, > 0; both None for the concatenated variant.
    trust : {"aggregator", "local"}, default="aggregator"
        Who sees what, as above.

    Returns
    -------
    z : float
        Standard deviation of the round's noise over the per-client norm bound
        tau*C (the ``GaussianDpEvent`` convention; under replace-one the L2
        sensitivity is 2*tau*C, i.e. std/sensitivity = z/2).

    Examples
    --------
    >>> round(dp_adaped_noise_multiplier(n_sampled=22, sync_gap=10, clip_mu=1.0, noise_mu=5.0),
    ...       6)  # 5 sqrt(22/10)
    7.416198
    >>> round(dp_adaped_noise_multiplier(n_sampled=22, sync_gap=10, clip_mu=1.0, noise_mu=5.0,
    ...                                  clip_psi=1.0, noise_psi=5.0), 6)  # 5 sqrt(22/20)
    5.244044
    """
    check_choice(trust, "trust", _TRUSTS)
    n_sampled = _count(n_sampled, "n_sampled")
    sync_gap = _count(sync_gap, "sync_gap")
    blocks = _blocks_iv(clip_mu, noise_mu, clip_psi, noise_psi)
    return _noise_multiplier(n_sampled if trust == "aggregator" else 1, sync_gap, blocks)


def _noise_multiplier(n_noise, sync_gap, blocks):
    """z = (sum_j z_j^-2)^(-1/2), z_j = s_j sqrt(n_noise tau)/(tau C_j), via hypot (no overflow)."""
    scale = math.sqrt(n_noise / sync_gap)
    return float(1.0 / math.hypot(*(c / (s * scale) for c, s in blocks)))


def _relation(sampling, trust):
    """User-level neighbouring relation of the model (see DPAdaPeDAccountant Notes)."""
    if trust == "aggregator" and sampling == "poisson":
        return NeighboringRelation.ADD_OR_REMOVE_ONE
    return NeighboringRelation.REPLACE_ONE


def _theorem27_order2(q, z):
    """RDP at order 2 of a Gaussian (std/sensitivity z) subsampled without replacement.

    Wang, Balle and Kasiviswanathan (2019), Theorem 27 at alpha = 2, written
    out independently of dp-accounting: with eps(2) = 1/z^2 the bound is
    log(1 + q^2 min(4 (e^eps(2) - 1), 2 e^eps(2))).
    """
    e2 = 1.0 / z**2
    return math.log1p(q * q * min(4.0 * math.expm1(e2), 2.0 * math.exp(e2)))


@functools.cache
def _rdp_replace_one_factors():
    """Per event kind, the factor by which to scale noise multipliers for the RDP accountant.

    ``GaussianDpEvent`` documents noise_multiplier as std / (per-record norm
    bound), so under REPLACE_ONE the sensitivity is twice that bound; but the
    RDP accountant of dp-accounting 0.6.0 reads it as std / (L2 sensitivity)
    (google/differential-privacy#378; the PLD accountant follows the
    docstring). The reading is probed for each event kind the correction is
    applied to, against closed forms computed here: the unsampled Gaussian
    (RDP alpha/(2 z^2)) and, for sampling without replacement, Theorem 27 of
    Wang, Balle and Kasiviswanathan at alpha = 2 (:func:`_theorem27_order2`).
    """
    def probe(event, as_sensitivity, as_norm_bound):
        acc = rdp_privacy_accountant.RdpAccountant([2.0], NeighboringRelation.REPLACE_ONE)
        acc.compose(event)
        rdp = float(acc.rdp[0])
        if math.isclose(rdp, as_sensitivity, rel_tol=1e-9):   # z read as std / sensitivity
            return 0.5
        if math.isclose(rdp, as_norm_bound, rel_tol=1e-9):    # z read as std / norm bound
            return 1.0
        raise RuntimeError(f"unexpected RDP {rdp} of {event!r} at order 2 under REPLACE_ONE "
                           f"in the installed dp-accounting (expected {as_sensitivity} or "
                           f"{as_norm_bound})")

    gauss = dp_event.GaussianDpEvent(1.0)
    sampled = dp_event.SampledWithoutReplacementDpEvent(4, 2, gauss)
    return {
        dp_event.GaussianDpEvent: probe(gauss, 1.0, 4.0),
        dp_event.SampledWithoutReplacementDpEvent: probe(
            sampled, _theorem27_order2(0.5, 1.0), _theorem27_order2(0.5, 0.5)),
    }


#: Largest noise multiplier handed to dp-accounting's RDP of sampling without
#: replacement: dp-accounting 0.6 fails there ("math domain error", log1p(-1)) once
#: 1/(2 z^2) < 1.1e-16, i.e. z above ~7e7. RDP decreases in z, so a larger z is
#: accounted as this one: a valid, conservative curve (at z = 1e6 the exact terms are
#: of order 1e-12; dp-accounting's approximation for orders above 256 is looser).
_MAX_WOR_NOISE_MULTIPLIER = 1e6


def _scale_gaussians(event, factors, kind=dp_event.GaussianDpEvent):
    """Copy of ``event`` with each GaussianDpEvent's noise multiplier times its factor.

    ``factors[kind]`` applies, ``kind`` being the innermost sampling event
    around the Gaussian (``GaussianDpEvent`` itself when unsampled). Inside
    sampling without replacement the result is capped at
    ``_MAX_WOR_NOISE_MULTIPLIER`` (see there).
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        z = event.noise_multiplier * factors[kind]
        if kind is dp_event.SampledWithoutReplacementDpEvent:
            z = min(z, _MAX_WOR_NOISE_MULTIPLIER)
        return dp_event.GaussianDpEvent(z)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_scale_gaussians(event.event, factors, kind),
                                            event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_scale_gaussians(e, factors, kind)
                                         for e in event.events])
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
        return dp_event.SampledWithoutReplacementDpEvent(
            event.source_dataset_size, event.sample_size,
            _scale_gaussians(event.event, factors, dp_event.SampledWithoutReplacementDpEvent))
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        # dp-accounting's RDP accountant refuses Poisson sampling under REPLACE_ONE, so no
        # factor is ever needed (or probed) for it.
        raise ValueError("PoissonSampledDpEvent is not supported under REPLACE_ONE")
    return event


@dataclass(frozen=True)
class RoundRecord:
    """Rounds recorded by :class:`DPAdaPeDAccountant` with identical parameters.

    Attributes
    ----------
    noise_multiplier : float
        z of :func:`dp_adaped_noise_multiplier` (std over the norm bound tau*C).
    n_sampled : int
        K, clients sampled per round.
    sampling_rate : float
        K/m; 1.0 when nothing amplifies privacy (K = m or ``trust="local"``).
    n_rounds : int
        Number of such rounds.
    """

    noise_multiplier: float
    n_sampled: int
    sampling_rate: float
    n_rounds: int


@dataclass(frozen=True, eq=False)
class PrivacySpent:
    """(epsilon, delta) of a DP-AdaPeD run and how it was obtained.

    Attributes
    ----------
    epsilon, delta : float
        The user-level (epsilon, delta)-DP guarantee.
    order : float or None
        Optimal Renyi order of the conversion (RDP accountant), else None.
    orders, rdp : ndarray of shape (n_orders,) or None
        The composed RDP curve (RDP accountant), else None.
    n_rounds : int
        Synchronization rounds composed.
    accountant : str
        ``"rdp"`` or ``"pld"``.
    neighboring_relation : str
        ``"replace_one"`` or ``"add_or_remove_one"`` (user level).
    """

    epsilon: float
    delta: float
    order: float | None
    orders: np.ndarray | None
    rdp: np.ndarray | None
    n_rounds: int
    accountant: str
    neighboring_relation: str

    def __repr__(self):  # the RDP curve (a value per order, ~150) is there to read, not print
        order = "None" if self.order is None else f"{self.order:.4g}"
        return (f"PrivacySpent(epsilon={self.epsilon:.6g}, delta={self.delta:.3g}, "
                f"order={order}, n_rounds={self.n_rounds}, accountant={self.accountant!r}, "
                f"neighboring_relation={self.neighboring_relation!r})")

    def plot(self, path=None):
        """The composed RDP curve against the Renyi order, the order of ``epsilon`` marked.

        The curve is what ``epsilon`` was converted from (RDP accountant only: a
        PLD result has none). Epsilon against the rounds is the accountant's
        :meth:`DPAdaPeDAccountant.plot`.

        Parameters
        ----------
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            One axes, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> spent = dp_adaped_epsilon(1e-5, n_clients=66, n_sampled=22, n_iterations=2400,
        ...                           sync_gap=10, clip_mu=1.0, noise_mu=5.0, sampling="poisson")
        >>> fig = spent.plot()
        >>> bool((fig.axes[0].lines[0].get_ydata() == spent.rdp).all())
        True
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        path = check_plot_path(path)
        if self.rdp is None:
            raise ValueError(f"PrivacySpent.plot draws the RDP curve, and a result of "
                             f"accountant={self.accountant!r} has none; "
                             f"DPAdaPeDAccountant.plot(delta) draws epsilon against the rounds")

        def draw(axes):
            (ax,) = axes
            ax.plot(self.orders, self.rdp, marker=".", ms=3, label="RDP of the run")
            ax.axvline(self.order, color="C1", lw=0.8, ls="--",
                       label=f"order {self.order:.3g}: epsilon = {self.epsilon:.3g}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("Renyi order")
            ax.set_ylabel("RDP epsilon(order)")
            ax.set_title(f"{self.n_rounds} rounds, delta = {self.delta:.3g}")
            ax.legend(fontsize=8)

        return result_figure(draw, figsize=(5.5, 3.6), path=path)


class DPAdaPeDAccountant(Accountant):
    r"""Correct user-level accountant for DP-AdaPeD, built on dp-accounting.

    Records synchronization rounds with :meth:`step` and converts them with
    dp-accounting's RDP or PLD accountant. Round model: K of the m clients
    are sampled; each runs tau local steps adding a clipped update (norm <= C)
    and N(0, sigma^2 I) noise; the server averages. One round is a Gaussian
    mechanism with noise multiplier z of :func:`dp_adaped_noise_multiplier`,
    amplified by the client sampling, and rounds compose.

    Parameters
    ----------
    n_clients : int
        m, >= 1.
    sampling : {"without_replacement", "poisson"}, default="without_replacement"
        Fixed-size sampling of K clients (Algorithm 5), or Poisson sampling
        with rate q = K/m.
    trust : {"aggregator", "local"}, default="aggregator"
        ``"aggregator"``: the adversary sees only the sum over the sampled
        clients (trusted server or secure aggregation). ``"local"``: the
        server sees each client's mu_i; no 1/K noise benefit and no
        amplification by sampling (the server knows who was sampled).
    accountant : {"rdp", "pld"}, default="rdp"
        dp-accounting's ``RdpAccountant`` (conversion = Lemma 2) or
        ``PLDAccountant`` (tighter; pessimistic discretization).
    orders : array_like of shape (n_orders,), default=None
        RDP orders (> 1); None uses :data:`~ebfl.privacy.accounting.core.DEFAULT_ORDERS`. RDP only.
    value_discretization_interval : float, default=1e-4
        PLD discretization, in [1e-8, 1]. PLD only; :meth:`step` refuses rounds
        whose grid would exceed 2e6 points (tiny noise multipliers).

    Attributes
    ----------
    history : list of RoundRecord
        The recorded rounds, consecutive identical ones merged.
    neighboring_relation : dp_accounting.NeighboringRelation
        See Notes.

    Raises
    ------
    ValueError
        From :meth:`step`, for ``accountant="pld"`` with
        ``sampling="without_replacement"`` and K < m: dp-accounting's PLD
        accountant has no sampling-without-replacement event.

    See Also
    --------
    dp_adaped_epsilon : the one-call version for a constant schedule.
    theorem7_rdp : the paper's (incorrect) bound.

    Notes
    -----
    Neighbouring relation (user level: one client's whole dataset differs):

    * ``sampling="without_replacement"``: REPLACE_ONE, the paper's own
      notion (App. A.3) and the only one for which fixed-size subsampling is
      analysed (Wang, Balle and Kasiviswanathan 2019, Thm 27, via
      ``SampledWithoutReplacementDpEvent``). The L2 sensitivity of the round's
      sum is 2*tau*C.
    * ``sampling="poisson"``: ADD_OR_REMOVE_ONE, sensitivity tau*C
      (``PoissonSampledDpEvent``, exact subsampled-Gaussian RDP or PLD).
    * ``trust="local"``: REPLACE_ONE (a sampled client always sends
      something), no sampling amplification; every round counts, i.e. the
      guarantee of a client sampled in all T/tau rounds. A client that took
      part in r rounds gets the guarantee of ``n_rounds=r``.

    The two relations are not comparable one to one: a replace-one
    guarantee is roughly an add/remove guarantee at twice the sensitivity.

    Modelling assumptions. The released round aggregate is taken to be
    sum_i g_i + N(0, K tau sigma^2 I) with ||g_i|| <= tau*C and the noise
    independent of the g_i. This is exact when the noise is added after the
    local steps (or by the aggregator); in Algorithm 5 the noise enters mu_i
    and so feeds back into later clipped steps, which this model (like the
    paper's) idealizes away. Under Poisson sampling the number of sampled
    clients is random; the noise standard deviation sigma sqrt(K tau) is taken
    as fixed (the aggregator tops it up, as in DP-FedAvg), not as the sum of a
    random number of client noises. The mu and psi blocks share the sample
    and are released together, so they form one Gaussian with
    1/z^2 = 1/z1^2 + 1/z2^2 inside the sampling (not two independently
    sampled mechanisms).

    dp-accounting 0.6.0 reads ``GaussianDpEvent.noise_multiplier`` as std
    over L2 sensitivity in its RDP accountant under REPLACE_ONE but as std
    over the norm bound in its PLD accountant (google/differential-privacy
    #378); the RDP path is rescaled accordingly (probed at run time).

    Examples
    --------
    FEMNIST (Section 4.1): m = 66, K = 22, T = 2400, tau = 10, sigma/C = 5.

    >>> acc = DPAdaPeDAccountant(66)
    >>> acc = acc.step(n_sampled=22, sync_gap=10, clip_mu=1.0, noise_mu=5.0, clip_psi=1.0,
    ...                noise_psi=5.0, n_rounds=240)
    >>> round(acc.get_epsilon(1e-5), 2)
    26.27
    """

    def __init__(self, n_clients, *, sampling="without_replacement", trust="aggregator",
                 accountant="rdp", orders=None, value_discretization_interval=DEFAULT_VDI):
        self.n_clients = _count(n_clients, "n_clients")
        self.sampling = check_choice(sampling, "sampling", _SAMPLINGS)
        self.trust = check_choice(trust, "trust", _TRUSTS)
        super().__init__(accountant=accountant, orders=orders,
                         value_discretization_interval=value_discretization_interval)
        self.neighboring_relation = _relation(self.sampling, self.trust)
        self.history = []

    # ------------------------------------------------------------------ recording

    def step(self, *, n_sampled, sync_gap, clip_mu, noise_mu, clip_psi=None, noise_psi=None,
             n_rounds=1):
        """Record ``n_rounds`` synchronization rounds; returns ``self``.

        Parameters are those of :func:`dp_adaped_noise_multiplier`, plus
        ``n_rounds`` (int >= 1). ``n_sampled`` must lie in [1, n_clients].
        """
        n_sampled = _sampled_iv(n_sampled, self.n_clients)
        n_rounds = _count(n_rounds, "n_rounds")
        z = dp_adaped_noise_multiplier(n_sampled=n_sampled, sync_gap=sync_gap, clip_mu=clip_mu,
                                       noise_mu=noise_mu, clip_psi=clip_psi,
                                       noise_psi=noise_psi, trust=self.trust)
        rate = 1.0 if self.trust == "local" else n_sampled / self.n_clients
        if self.accountant == "pld" and self.sampling == "without_replacement" and rate < 1.0:
            raise ValueError(
                "accountant='pld' does not support sampling='without_replacement' with "
                f"n_sampled={n_sampled} < n_clients={self.n_clients}: dp-accounting's "
                "PLDAccountant has no SampledWithoutReplacementDpEvent; use accountant='rdp' "
                "or sampling='poisson'")
        if self.accountant == "pld":
            # Sensitivity in units of the norm bound: 2 under REPLACE_ONE, else 1; the grid
            # keeps 8.3 standard deviations each side (dp-accounting's tail mass).
            sensitivity = (2.0 if self.neighboring_relation is NeighboringRelation.REPLACE_ONE
                           else 1.0)
            vdi = self.value_discretization_interval
            check_pld_points(gaussian_pld_points(z, vdi, sensitivity=sensitivity,
                                                 tail_sds=8.3),
                             what=f"per round at noise multiplier z={z:.3g}", vdi=vdi)
        last = self.history[-1] if self.history else None
        if last is not None and (last.noise_multiplier, last.n_sampled) == (z, n_sampled):
            self.history[-1] = RoundRecord(z, n_sampled, rate, last.n_rounds + n_rounds)
        else:
            self.history.append(RoundRecord(z, n_sampled, rate, n_rounds))
        return self

    def compose(self, event, count=1):
        """Not available: record rounds with :meth:`step`."""
        raise TypeError("DPAdaPeDAccountant records synchronization rounds with step(); "
                        "use ebfl.privacy.accounting.Accountant for arbitrary events")

    @property
    def n_rounds(self):
        """Total number of recorded rounds."""
        return sum(r.n_rounds for r in self.history)

    def __repr__(self):
        return (f"DPAdaPeDAccountant(n_clients={self.n_clients}, sampling={self.sampling!r}, "
                f"trust={self.trust!r}, accountant={self.accountant!r}, "
                f"n_rounds={self.n_rounds})")

    @property
    def event(self):
        """The recorded run as a ``dp_accounting`` DpEvent (``GaussianDpEvent`` convention).

        Under REPLACE_ONE, feeding it to dp-accounting's ``RdpAccountant``
        directly under-counts (see Notes); the accountant's methods correct it.
        """
        return dp_event.ComposedDpEvent([
            dp_event.SelfComposedDpEvent(self._round_event(r), r.n_rounds)
            for r in self.history])

    def _round_event(self, record):
        gauss = dp_event.GaussianDpEvent(record.noise_multiplier)
        if record.sampling_rate == 1.0:
            return gauss
        if self.sampling == "poisson":
            return dp_event.PoissonSampledDpEvent(record.sampling_rate, gauss)
        return dp_event.SampledWithoutReplacementDpEvent(self.n_clients, record.n_sampled, gauss)

    # ------------------------------------------------------------------ delegation

    def _key(self):
        return tuple(self.history)

    _step_name = "rounds"
    _how_to_record = "record rounds with step()"

    def _step_counts(self):
        return [r.n_rounds for r in self.history]

    def _with_steps(self, counts):
        new = copy.copy(self)
        new.history = [dataclasses.replace(r, n_rounds=int(c))
                       for r, c in zip(self.history, counts, strict=True) if c]
        new._cache = (None, None)
        return new

    def _rdp_curve(self):
        if self.neighboring_relation is NeighboringRelation.ADD_OR_REMOVE_ONE:
            return super()._rdp_curve()
        acc = rdp_privacy_accountant.RdpAccountant(self.orders, self.neighboring_relation)
        event = _scale_gaussians(self.event, _rdp_replace_one_factors())
        if not acc.supports(event):
            raise ValueError(f"dp-accounting's RdpAccountant does not support {event!r} under "
                             f"{self.neighboring_relation.name}")
        acc.compose(event)
        return np.asarray(acc.rdp, dtype=np.float64)

    def get_privacy_spent(self, delta):
        """Epsilon for ``delta`` in (0, 1), with the RDP curve and optimal order.

        Returns
        -------
        PrivacySpent
        """
        eps, order = self.get_epsilon_and_order(delta)
        relation = self.neighboring_relation.name.lower()
        rdp = self.get_rdp() if self.accountant == "rdp" else None
        return PrivacySpent(eps, float(delta), order,
                            self.orders.copy() if rdp is not None else None, rdp,
                            self.n_rounds, self.accountant, relation)


def dp_adaped_epsilon(delta, *, n_clients, n_sampled, n_iterations, sync_gap, clip_mu,
                      noise_mu, clip_psi=None, noise_psi=None, sampling="without_replacement",
                      trust="aggregator", accountant="rdp", orders=None,
                      value_discretization_interval=1e-4):
    """Correct user-level (epsilon, delta) of a DP-AdaPeD run with a constant schedule.

    Same mechanism arguments as :func:`theorem7_rdp`; the accountant options
    are those of :class:`DPAdaPeDAccountant` (see its Notes for the model and
    the neighbouring relation). Composes T/tau rounds.

    Parameters
    ----------
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    PrivacySpent

    Examples
    --------
    >>> kw = dict(n_clients=66, n_sampled=22, n_iterations=2400, sync_gap=10, clip_mu=1.0,
    ...           noise_mu=5.0, clip_psi=1.0, noise_psi=5.0)
    >>> res = dp_adaped_epsilon(1e-5, sampling="poisson", **kw)
    >>> round(res.epsilon, 2), res.neighboring_relation, res.n_rounds
    (4.77, 'add_or_remove_one', 240)
    """
    n_clients = _count(n_clients, "n_clients")
    n_sampled = _sampled_iv(n_sampled, n_clients)
    n_rounds, sync_gap = _rounds_iv(n_iterations, sync_gap)
    acc = DPAdaPeDAccountant(n_clients, sampling=sampling, trust=trust, accountant=accountant,
                             orders=orders,
                             value_discretization_interval=value_discretization_interval)
    acc.step(n_sampled=n_sampled, sync_gap=sync_gap, clip_mu=clip_mu, noise_mu=noise_mu,
             clip_psi=clip_psi, noise_psi=noise_psi, n_rounds=n_rounds)
    return acc.get_privacy_spent(delta)
