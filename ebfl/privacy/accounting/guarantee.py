"""What DP-FedAvg's (and FedHDP's) epsilon is a proof for, recorded beside every epsilon.

The accountant of :mod:`ebfl.privacy.accounting.dp_fedavg` analyses one round as a
Poisson-subsampled Gaussian under add/remove-one-client neighbours: every
client takes part independently with probability q, and the released
quantity is a group's noisy *sum* of clipped updates, divided by a constant
that does not depend on who took part (the expected count q M_i,
``denominator="expected"``). A run that samples a fixed number of clients, or
divides by the realized count N_i^t (Algorithm 2 of the FedHDP paper as
printed, ``denominator="realized"``), is outside that model: the epsilon is
then a number computed for a neighbouring mechanism, not a proof for the run.

:func:`dp_fedavg_guarantee` returns the keys that every reported epsilon
carries (run records, :meth:`ebfl.fedhdp.algorithm.FedHDP.privacy`, the
experiments' JSON, ``ebfl accounting fedhdp``): ``sampling``,
``denominator``, ``neighboring_relation`` (as DP-AdaPeD's
:class:`~ebfl.privacy.accounting.PrivacySpent`), ``accountant_model``,
``in_model``, ``guarantee`` (``"proof"`` or ``"conditional"``) and
``condition`` (None inside the model, else why the epsilon is not a proof).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_choice

__all__ = ["ACCOUNTANT_MODEL", "DENOMINATORS", "SAMPLINGS", "VALID_FOR", "FedHDPPrivacy",
           "dp_fedavg_guarantee"]

#: Client sampling of a run (as :func:`ebfl.learning.torch.train`'s ``sampling``).
SAMPLINGS = ("poisson", "fixed")
#: What a group's noisy sum is divided by (as :class:`~ebfl.fedhdp.algorithm.FedHDP`).
DENOMINATORS = ("expected", "realized")
#: The accountant's model, in words.
ACCOUNTANT_MODEL = ("Poisson sampling of clients (rate q); each privacy group releases its sum "
                    "of clipped updates plus Gaussian noise, divided by a constant (the "
                    "expected count, denominator='expected'); add/remove-one-client "
                    "neighbours; rounds compose")
#: Which runs the accountant's epsilon is a proof for, in words.
VALID_FOR = ("The epsilon is a proof only for runs with Poisson sampling that divide each "
             "group's noisy sum by the expected count (denominator='expected'); for fixed-size "
             "sampling or realized counts (Algorithm 2 as printed) it is not.")


def dp_fedavg_guarantee(*, sampling, denominator):
    """The conditions under which DP-FedAvg's accountant epsilon is a proof for a run.

    Parameters
    ----------
    sampling : {"poisson", "fixed"} or None
        The run's client sampling; None when it is not known (then the
        epsilon is conditional on it being Poisson).
    denominator : {"expected", "realized"}
        What the run divides each group's noisy sum by.

    Returns
    -------
    dict
        ``sampling``, ``denominator``, ``neighboring_relation``
        (``"add_or_remove_one"``), ``accountant_model`` (text), ``in_model``
        (bool), ``guarantee`` (``"proof"`` when in the model, else
        ``"conditional"``) and ``condition`` (None, or the reasons, in words).

    Examples
    --------
    >>> dp_fedavg_guarantee(sampling="poisson", denominator="expected")["guarantee"]
    'proof'
    >>> g = dp_fedavg_guarantee(sampling="poisson", denominator="realized")
    >>> g["in_model"], g["guarantee"]
    (False, 'conditional')
    """
    if sampling is not None:
        sampling = check_choice(sampling, "sampling", SAMPLINGS)
    denominator = check_choice(denominator, "denominator", DENOMINATORS)
    reasons = []
    if denominator != "expected":
        reasons.append("the accountant's epsilon assumes denominator='expected'; this run "
                       "divides by the realized count N_i^t, which depends on who took part")
    if sampling is None:
        reasons.append("the accountant's epsilon assumes Poisson sampling; the run's sampling "
                       "was not given (pass sampling='poisson' or 'fixed')")
    elif sampling != "poisson":
        reasons.append("the accountant's epsilon assumes Poisson sampling; this run samples a "
                       "fixed number of clients per round")
    in_model = not reasons
    condition = None if in_model else "; ".join(reasons) + ": the epsilon is not a proof for it"
    return {"sampling": sampling, "denominator": denominator,
            "neighboring_relation": "add_or_remove_one", "accountant_model": ACCOUNTANT_MODEL,
            "in_model": in_model, "guarantee": "proof" if in_model else "conditional",
            "condition": condition}


@dataclass(frozen=True, eq=False)
class FedHDPPrivacy:
    """Each privacy group's epsilon of a FedHDP run, with what it is a proof for.

    Attributes
    ----------
    epsilon : ndarray (l,)
        Epsilon of each group (+inf for a non-private group); the run is
        (max epsilon, delta)-DP (parallel composition), inside the model.
    delta : float
    n_rounds : int
    sampling_rate : float
    noise_multipliers : tuple of float
        z_i per group.
    accountant : str
        ``"rdp"`` or ``"pld"``.
    sampling, denominator, neighboring_relation, accountant_model : str
    in_model : bool
        Whether the run's configuration is inside the accountant's model.
    guarantee : str
        ``"proof"`` or ``"conditional"``.
    condition : str or None
        Why the epsilon is not a proof for the run (None inside the model).
    """

    epsilon: np.ndarray
    delta: float
    n_rounds: int
    sampling_rate: float
    noise_multipliers: tuple
    accountant: str
    sampling: str | None
    denominator: str
    neighboring_relation: str
    accountant_model: str
    in_model: bool
    guarantee: str
    condition: str | None

    def to_dict(self):
        """A JSON-able dict of every field (``epsilon`` as a list)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["epsilon"] = [float(e) for e in self.epsilon]
        out["noise_multipliers"] = list(self.noise_multipliers)
        return out
