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

import copy

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from ebfl._plotting import check_plot_path, result_figure
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
#: Most points of :meth:`Accountant.plot` (each is a conversion, or for PLD a composition).
MAX_PLOT_POINTS = 10_000


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

    # ------------------------------------------------------------------ picture

    #: What one recorded step is (the plot's x axis), and how steps are recorded.
    _step_name = "events composed"
    _how_to_record = "compose() events"

    def _step_counts(self):
        """Steps recorded by each entry, in order."""
        return [n for _, n in self.events]

    def _with_steps(self, counts):
        """A copy that holds ``counts[i]`` steps of entry i (0 drops it); self is untouched."""
        new = copy.copy(self)
        new.events = [(e, int(c)) for (e, _), c in zip(self.events, counts, strict=True) if c]
        new._cache = (None, None)
        return new

    def _epsilon_after(self, steps, delta):
        """Epsilon at ``delta`` after the first ``steps[j]`` steps, for every j."""
        counts = np.array(self._step_counts(), dtype=np.int64)
        starts = np.cumsum(counts) - counts
        prefixes = [np.clip(t - starts, 0, counts) for t in steps]
        if self.accountant == "pld":
            return np.array([self._with_steps(p).get_epsilon(delta) for p in prefixes])
        # RDP composes by adding count x each event's curve (so do event_rdp and
        # dp-accounting's RdpAccountant, in this order from zeros): one curve per entry
        # gives every prefix's to the last bit, where recomposing each prefix would
        # cost a composition per point (a second each for sampling without replacement).
        units = [self._with_steps(np.arange(counts.size) == i)._rdp_curve()
                 for i in range(counts.size)]
        out = []
        for prefix in prefixes:
            curve = np.zeros(self.orders.size)
            for c, unit in zip(prefix, units, strict=True):
                if c:  # (0 x an infinite order would give NaN)
                    curve = curve + c * unit
            out.append(_epsilon_and_order(self.orders, curve, delta, self.conversion)[0])
        return np.array(out)

    def plot(self, delta, *, n_points=50, path=None):
        """Epsilon at ``delta`` against the number of steps recorded so far.

        Each point is what the accountant answers for the first t steps (events
        for an :class:`Accountant`, rounds for a DP-AdaPeD one): all of 1..T when
        T <= ``n_points``, else ``n_points`` log-spaced t (the x axis then
        logarithmic), T always among them. The accountant is not changed.

        Parameters
        ----------
        delta : float
            In (0, 1).
        n_points : int, default=50
            Most points, in [2, 10^4]. With ``accountant="pld"`` each point is a
            fresh composition (seconds for fine grids): fewer points are faster.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            One axes, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> from dp_accounting import dp_event
        >>> acc = Accountant().compose(dp_event.GaussianDpEvent(20.0), 100)
        >>> fig = acc.plot(1e-5)
        >>> line = fig.axes[0].lines[0]
        >>> bool(line.get_ydata()[-1] == acc.get_epsilon(1e-5)), int(line.get_xdata()[-1])
        (True, 100)
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        delta = check_delta(delta)
        n_points = check_int_scalar(n_points, "n_points", minimum=2, maximum=MAX_PLOT_POINTS)
        path = check_plot_path(path)
        total = sum(self._step_counts())
        if total == 0:
            raise ValueError(f"{type(self).__name__}.plot: nothing is recorded yet; "
                             f"{self._how_to_record} first")
        log_spaced = total > n_points
        steps = (np.unique(np.rint(np.geomspace(1, total, n_points)).astype(np.int64))
                 if log_spaced else np.arange(1, total + 1))
        epsilon = self._epsilon_after(steps, delta)

        def draw(axes):
            (ax,) = axes
            ax.plot(steps, epsilon, marker="o" if steps.size <= 30 else None, ms=3)
            if log_spaced:
                ax.set_xscale("log")
            ax.set_xlabel(self._step_name)
            ax.set_ylabel("epsilon")
            ax.set_title(f"epsilon at delta = {delta:.3g} ({self.accountant.upper()})")

        return result_figure(draw, figsize=(5.5, 3.6), path=path)
