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

from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import as_generator, check_choice, check_int_scalar, check_probability

__all__ = ["FederatedResult", "run_federated", "sample_clients"]

SAMPLINGS = ("full", "fixed", "poisson")


def sample_clients(m, rng, sampling="full", *, clients_per_round=None, rate=None):
    """Indices of the clients taking part in one round.

    Parameters
    ----------
    m : int
        Number of clients.
    rng : Generator
    sampling : {"full", "fixed", "poisson"}
        Everyone; ``clients_per_round`` drawn without replacement; or each client
        independently with probability ``rate`` (possibly nobody).
    """
    check_choice(sampling, "sampling", SAMPLINGS)
    if sampling == "full":
        return np.arange(m)
    if sampling == "fixed":
        k = check_int_scalar(clients_per_round, "clients_per_round", minimum=1)
        if k > m:
            raise ValueError(f"clients_per_round must be <= the number of clients {m}, got {k}")
        return np.sort(rng.choice(m, size=k, replace=False))
    rate = check_probability(rate, "rate")
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


def run_federated(algorithm, data, rounds, *, sampling="full", clients_per_round=None,
                  rate=None, rng=None, truth=None, evaluate=None, record_every=1,
                  progress=False):
    """Run ``rounds`` synchronization rounds of ``algorithm`` on ``data``.

    Parameters
    ----------
    algorithm : object
        See the module docstring.
    data : RegressionData
    rounds : int
        >= 0.
    sampling, clients_per_round, rate
        Client participation, see :func:`sample_clients`.
    rng : None, int, SeedSequence or Generator
        All randomness (initialization, sampling, the algorithm's own).
    truth : ndarray of shape (m, d), optional
        True client parameters; the history then holds ``mse``, the mean
        squared error sum_d (theta_hat - theta)^2 over clients.
    evaluate : callable, optional
        ``evaluate(theta) -> dict`` on the personal models (m, d) (or the global
        model, for algorithms without personal ones); its entries join the
        history (e.g. test accuracy).
    record_every : int
        Log every this many rounds (and the last).
    progress : bool
        Progress bar.

    Returns
    -------
    FederatedResult
    """
    rounds = check_int_scalar(rounds, "rounds", minimum=0)
    record_every = check_int_scalar(record_every, "record_every", minimum=1)
    check_choice(sampling, "sampling", SAMPLINGS)
    rng = as_generator(rng)
    state = algorithm.init(data, rng)
    history = []

    def record(t):
        row = {"round": t, **algorithm.summary(state, data)}
        if truth is not None:
            row["mse"] = float(np.mean(np.sum((algorithm.personal(state) - truth) ** 2,
                                              axis=1)))
        if evaluate is not None:
            row.update(evaluate(algorithm.personal(state)))
        history.append(row)

    record(0)
    steps = range(1, rounds + 1)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=type(algorithm).__name__, disable=None, leave=False)
    for t in steps:
        active = sample_clients(data.n_clients, rng, sampling,
                                clients_per_round=clients_per_round, rate=rate)
        if active.size:
            state = algorithm.round(state, data, active, rng)
        if t % record_every == 0 or t == rounds:
            record(t)
    return FederatedResult(state, algorithm.personal(state), history)
