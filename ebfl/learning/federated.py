"""A small federated simulation core shared by the regression algorithms.

An algorithm keeps its state as stacked arrays (one row per client for the
personal parameters, plain arrays for the server's) and implements

* ``init(data, rng) -> state``
* ``round(state, data, active, rng) -> state``: one synchronization round for the
  sampled clients ``active`` (vectorized over them), server aggregation included;
* ``personal(state) -> (m, d)``: each client's model;
* ``summary(state, data) -> dict``: what to log (objective, prior estimates).

:func:`run_federated` draws the participating clients each round (all, a fixed
number without replacement, or Poisson with a rate), records a history, and
can report the MSE to known true parameters.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import (
    INT64_MAX,
    as_generator,
    check_bool,
    check_callable,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_probability,
)

__all__ = ["FederatedResult", "run_federated", "sample_clients"]

SAMPLINGS = ("full", "fixed", "poisson")
#: Methods every algorithm implements (see the module docstring).
PROTOCOL = ("init", "round", "personal", "summary")


def sample_clients(m, rng, sampling="full", *, clients_per_round=None, rate=None):
    """Indices of the clients taking part in one round.

    Parameters
    ----------
    m : int
        Number of clients, >= 1.
    rng : None, int, SeedSequence or Generator
    sampling : {"full", "fixed", "poisson"}
        Everyone; ``clients_per_round`` (in 1..m) drawn without replacement; or
        each client independently with probability ``rate`` (possibly nobody).
        Each parameter is required by its scheme and refused by the others.

    Examples
    --------
    >>> sample_clients(10, 0, "fixed", clients_per_round=3).tolist()
    [5, 6, 9]
    """
    m = check_int_scalar(m, "m", minimum=1, maximum=INT64_MAX)
    rng = as_generator(rng)
    k, rate = _sampling_iv(m, sampling, clients_per_round, rate)
    return _draw_clients(m, rng, sampling, k, rate)


def _sampling_iv(m, sampling, clients_per_round, rate):
    """Check a sampling scheme; its parameter must be given for it and only for it."""
    check_choice(sampling, "sampling", SAMPLINGS)
    k = None
    if sampling == "fixed":
        k = check_int_scalar(clients_per_round, "clients_per_round", minimum=1, maximum=m)
    elif clients_per_round is not None:
        raise ValueError(f"clients_per_round applies to sampling='fixed' only, not "
                         f"sampling={sampling!r}")
    if sampling == "poisson":
        rate = check_probability(rate, "rate")
    elif rate is not None:
        raise ValueError(f"rate applies to sampling='poisson' only, not sampling={sampling!r}")
    return k, rate


def _draw_clients(m, rng, sampling, k, rate):
    if sampling == "full":
        return np.arange(m)
    if sampling == "fixed":
        return np.sort(rng.choice(m, size=k, replace=False))
    return np.flatnonzero(rng.random(m) < rate)


@dataclass
class FederatedResult:
    """Final state, personal models and the per-round history of a run."""

    state: dict
    theta: np.ndarray
    history: list = field(default_factory=list)

    def history_frame(self):
        """The history as a pandas DataFrame (one row per recorded round)."""
        import pandas as pd

        return pd.DataFrame(self.history)


def run_federated(algorithm, data, n_rounds, *, sampling="full", clients_per_round=None,
                  rate=None, rng=None, truth=None, evaluate=None, record_every=1,
                  progress=False):
    """Run ``n_rounds`` synchronization rounds of ``algorithm`` on ``data``.

    Parameters
    ----------
    algorithm : object
        See the module docstring.
    data : RegressionData
    n_rounds : int
        >= 0.
    sampling, clients_per_round, rate
        Client participation, see :func:`sample_clients`.
    rng : None, int, SeedSequence or Generator
        All randomness (initialization, sampling, the algorithm's own).
    truth : ndarray of shape (m, d), optional
        True client parameters (finite); the history then holds ``mse``, the
        mean squared error sum_d (theta_hat - theta)^2 over clients.
    evaluate : callable, optional
        ``evaluate(theta) -> dict`` on the personal models (m, d) (or the global
        model, for algorithms without personal ones); its entries join the
        history (e.g. test accuracy).

    Warns
    -----
    RuntimeWarning
        When the final models are not finite (the algorithm diverged).
    record_every : int
        Log every this many rounds (and the last).
    progress : bool
        Progress bar.

    Returns
    -------
    FederatedResult
    """
    missing = [name for name in PROTOCOL if not callable(getattr(algorithm, name, None))]
    if missing:
        raise TypeError(f"algorithm must implement {', '.join(PROTOCOL)} (see "
                        f"ebfl.learning.federated); {type(algorithm).__name__} lacks {missing}")
    m = getattr(data, "n_clients", None)
    if not isinstance(m, numbers.Integral):
        raise TypeError(f"data must be a RegressionData, got {type(data).__name__}")
    n_rounds = check_int_scalar(n_rounds, "n_rounds", minimum=0)
    record_every = check_int_scalar(record_every, "record_every", minimum=1)
    k, rate = _sampling_iv(m, sampling, clients_per_round, rate)
    if truth is not None:
        truth = check_finite_array(truth, "truth", ndim=2)
        shape = (m, getattr(data, "dim", truth.shape[1]))
        if truth.shape != shape:
            raise ValueError(f"truth must have shape (m, d) = {shape}, got {truth.shape}")
    if evaluate is not None:
        check_callable(evaluate, "evaluate", "evaluate(theta) -> dict")
    progress = check_bool(progress, "progress")
    rng = as_generator(rng)
    state = algorithm.init(data, rng)
    history = []

    def record(t):
        row = {"round": t, **algorithm.summary(state, data)}
        if truth is not None:
            row["mse"] = float(np.mean(np.sum((algorithm.personal(state) - truth) ** 2,
                                              axis=1)))
        if evaluate is not None:
            extra = evaluate(algorithm.personal(state))
            if not isinstance(extra, Mapping):
                raise TypeError(f"evaluate must return a dict, got {type(extra).__name__}")
            row.update(extra)
        history.append(row)

    record(0)
    steps = range(1, n_rounds + 1)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=type(algorithm).__name__, disable=None, leave=False)
    for t in steps:
        active = _draw_clients(m, rng, sampling, k, rate)
        if active.size:
            state = algorithm.round(state, data, active, rng)
        if t % record_every == 0 or t == n_rounds:
            record(t)
    theta = algorithm.personal(state)
    if not np.all(np.isfinite(theta)):
        warnings.warn(f"{type(algorithm).__name__}: the models are not finite after {n_rounds} "
                      "rounds; the algorithm diverged (lower its step sizes)", RuntimeWarning,
                      stacklevel=2)
    return FederatedResult(state, theta, history)
