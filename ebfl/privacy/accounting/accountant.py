"""The accountant: records mechanism events, answers epsilon(delta) and delta(epsilon).

The maths is in :mod:`~ebfl.privacy.accounting.core` (conversions, limits) and
:mod:`~ebfl.privacy.accounting.rdp` (the RDP of the mechanisms); an
:class:`Accountant` only records ``(event, count)`` and delegates, in the way
Opacus separates its accountants from their analyses. The uses build on it:
DP-FedAvg and FedHDP's privacy groups (:mod:`~ebfl.privacy.accounting.dp_fedavg`),
DP-AdaPeD (:class:`~ebfl.privacy.accounting.adaped.DPAdaPeDAccountant`) and
DP-PFL's rigorous accountant (:func:`ebfl.dppfl.rigorous_epsilon`).
"""

from __future__ import annotations

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from ebfl._validation import check_choice, check_int_scalar
from ebfl.privacy.accounting.core import (
    CONVERSIONS,
    DEFAULT_ORDERS,
    DEFAULT_VDI,
    _delta,
    _epsilon_and_order,
    check_delta,
    check_epsilon,
    check_orders,
    check_pld_points,
    check_vdi,
    gaussian_pld_points,
)
from ebfl.privacy.accounting.rdp import event_rdp

__all__ = ["ACCOUNTANTS", "Accountant"]

#: The two ways to compose: Renyi DP, or privacy-loss distributions (tighter).
ACCOUNTANTS = ("rdp", "pld")


def _gaussian_multipliers(event):
    """The noise multipliers of every Gaussian inside ``event``."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return [event.noise_multiplier]
    inner = getattr(event, "events", None) or [getattr(event, "event", None)]
    return [z for e in inner if e is not None for z in _gaussian_multipliers(e)]


class Accountant:
    """Composes recorded mechanism events; answers epsilon(delta) and delta(epsilon).

    Parameters
    ----------
    accountant : {"rdp", "pld"}, default="rdp"
        ``"rdp"``: the RDP curve of :func:`~ebfl.privacy.accounting.rdp.event_rdp`
        at ``orders``, converted by ``conversion``. ``"pld"``: dp-accounting's
        ``PLDAccountant`` (tighter; pessimistic discretization).
    orders : array_like, optional
        Renyi orders in (1, 1e6]; default :data:`~ebfl.privacy.accounting.core.DEFAULT_ORDERS`.
    conversion : {"improved", "classic"}, default="improved"
        RDP -> (epsilon, delta), see :func:`~ebfl.privacy.accounting.core.rdp_to_epsilon`.
    value_discretization_interval : float, default=1e-4
        PLD grid step in [1e-8, 1].

    Notes
    -----
    The neighbouring relation is add/remove one (what Poisson sampling is
    analysed under). A subclass with another relation overrides
    ``_rdp_curve`` and ``_pld_accountant``.

    Examples
    --------
    Ten rounds of a Gaussian of noise multiplier 2, with no sampling:

    >>> from dp_accounting import dp_event
    >>> acc = Accountant(orders=[2.0, 8.0]).compose(dp_event.GaussianDpEvent(2.0), 10)
    >>> acc.get_rdp().tolist()
    [2.5, 10.0]
    >>> round(acc.get_epsilon(1e-5), 4)
    11.2141
    """

    neighboring_relation = NeighboringRelation.ADD_OR_REMOVE_ONE

    def __init__(self, *, accountant="rdp", orders=None, conversion="improved",
                 value_discretization_interval=DEFAULT_VDI):
        self.accountant = check_choice(accountant, "accountant", ACCOUNTANTS)
        self.orders = check_orders(orders, DEFAULT_ORDERS)
        self.conversion = check_choice(conversion, "conversion", CONVERSIONS)
        self.value_discretization_interval = check_vdi(value_discretization_interval)
        self.events = []
        self._cache = (None, None)

    def __repr__(self):  # (the orders, ~150 of them, are there to read, not print)
        return (f"{type(self).__name__}(accountant={self.accountant!r}, "
                f"events={sum(n for _, n in self.events)}, orders={self.orders.size})")

    def compose(self, event, count=1):
        """Record ``count`` >= 1 runs of ``event`` (a dp-accounting ``DpEvent``); returns self."""
        if not isinstance(event, dp_event.DpEvent):
            raise TypeError(f"event must be a dp_accounting DpEvent, got {type(event).__name__}")
        count = check_int_scalar(count, "count", minimum=1, maximum=2**53)
        self.events.append((event, count))
        return self

    @property
    def event(self):
        """Everything recorded, as one ``ComposedDpEvent``."""
        return dp_event.ComposedDpEvent([
            e if n == 1 else dp_event.SelfComposedDpEvent(e, n) for e, n in self.events])

    # ------------------------------------------------------------------ composition

    def _rdp_curve(self):
        """The composed RDP at ``orders`` (float64 array)."""
        return event_rdp(self.event, self.orders)

    def _pld_accountant(self):
        """A dp-accounting PLDAccountant with everything composed (each Gaussian's grid
        checked against the core's guard first)."""
        vdi = self.value_discretization_interval
        for z in _gaussian_multipliers(self.event):
            check_pld_points(gaussian_pld_points(z, vdi), what=f"for a Gaussian of noise "
                             f"multiplier {z:.3g}", vdi=vdi)
        acc = pld_privacy_accountant.PLDAccountant(self.neighboring_relation, vdi)
        acc.compose(self.event)
        return acc

    def _key(self):
        """What was recorded, hashable: the composition is recomputed when it changes."""
        return tuple(self.events)

    def _composed(self):
        key = self._key()
        if self._cache[0] != key:
            self._cache = (key, self._rdp_curve() if self.accountant == "rdp"
                           else self._pld_accountant())
        return self._cache[1]

    # ------------------------------------------------------------------ answers

    def get_rdp(self):
        """The composed RDP curve at ``orders`` (``accountant="rdp"`` only)."""
        if self.accountant != "rdp":
            raise ValueError("get_rdp needs accountant='rdp'; the PLD accountant has no "
                             "RDP curve")
        return np.array(self._composed())

    def get_epsilon_and_order(self, delta):
        """``(epsilon, order)`` for ``delta`` in (0, 1); the order is None for PLD."""
        delta = check_delta(delta)
        if self.accountant == "rdp":
            return _epsilon_and_order(self.orders, self._composed(), delta, self.conversion)
        return float(self._composed().get_epsilon(delta)), None

    def get_epsilon(self, delta):
        """Epsilon of everything recorded, for ``delta`` in (0, 1)."""
        return self.get_epsilon_and_order(delta)[0]

    def get_delta(self, epsilon):
        """Delta of everything recorded, for ``epsilon`` > 0 (improved conversion for RDP)."""
        epsilon = check_epsilon(epsilon)
        if self.accountant == "rdp":
            return _delta(self.orders, self._composed(), epsilon)
        return float(self._composed().get_delta(epsilon))
