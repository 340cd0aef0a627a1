"""Federated personalized regression on the project's one federated protocol.

Every regression algorithm (:mod:`ebfl.learning.regression`,
:mod:`ebfl.learning.population_models`, :mod:`ebfl.learning.logistic_eb`) is a
:class:`~ebfl.federated.FederatedAlgorithm`: a client half (what a sampled
client computes from the server's broadcast and its own data, and the reply it
sends) and a server half (the new prior or global model from the replies). The
clients' state is their personal model ``theta`` (a stack of rows, one per
client); the server's is the population model (mu, variances, atoms, ...).

:func:`run_federated` runs one on :class:`~ebfl.learning.RegressionData` with
the in-process runtime :func:`ebfl.federated.run`, the round loop that every
federated algorithm of the project shares: the clients of a round are drawn from
the server's stream of (seed, round), the algorithms' own randomness (k-means
restarts) from the streams of (seed, round, purpose), and the history gets the
objective of the algorithm and, when the truth is known, the error of the
personal models.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import (
    check_bool,
    check_callable,
    check_choice,
    check_finite_array,
    check_int_scalar,
)
from ebfl.federated.protocol import MAX_ROUNDS, FederatedAlgorithm, RunConfig
from ebfl.federated.runtime import run
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.learning.data import RegressionData, _data_iv, _mean_iv

__all__ = ["FederatedResult", "RegressionAlgorithm", "run_federated"]

#: How the clients of a round are drawn: everyone; K of m without replacement;
#: each client independently with probability K / m.
SAMPLINGS = ("full", "fixed", "poisson")


class RegressionAlgorithm(FederatedAlgorithm):
    """Base class of the numpy regression algorithms: the halves of a
    :class:`~ebfl.federated.FederatedAlgorithm` plus what a regression run reports.

    Subclasses implement the protocol's ``init_server``, ``init_clients``,
    ``broadcast``, ``client_train`` and ``aggregate``, and
    :meth:`objective` for the history. Client states hold the personal models
    as ``{"theta": (K, d)}``; an algorithm with one global model (FedAvg)
    overrides :meth:`personal`.
    """

    #: The loss each client evaluates its model with: "squared" or "logistic".
    loss = "squared"

    def config(self):
        """The name and every hyperparameter (what a checkpoint must agree on)."""
        out = {"name": self.name}
        for key, value in sorted(vars(self).items()):
            if callable(value):
                value = getattr(value, "__qualname__", type(value).__name__)
            elif isinstance(value, np.ndarray):
                value = value.tolist()
            out[key] = value
        return out

    def personal(self, server, clients):
        """Every client's model, shape (m, d) (the global model (d,) for FedAvg)."""
        return clients["theta"]

    def objective(self, server, clients, data):
        """Entries of the history computed from every client's model and data."""
        return {}

    def evaluation_message(self, server):
        return {}

    def client_evaluate(self, message, client, data):
        """Each client's mean loss on its own data under its personal model."""
        theta = client["theta"]
        z = np.einsum("mnd,md->mn", data.X, theta)
        if self.loss == "squared":
            per_sample = (data.Y - z) ** 2
        else:  # cross-entropy, log(1 + e^z) - y z, stable
            per_sample = np.logaddexp(0.0, z) - data.Y * z
        return {"train_loss": np.sum(per_sample * data.mask, axis=1) / data.n_samples}


def round_rng(rc, purpose="aggregate"):
    """The server's generator for its own draws in round ``rc.round`` (e.g. k-means
    restarts), or at the start of the run with ``purpose="init"`` and round 0."""
    return np.random.default_rng(stream_seed(rc.config.seed, rc.round, SERVER, purpose))


# Helpers of the algorithms' halves: messages, the server's per-client tables.

def _scalar(value):
    """A message's 0-d entry as a Python float (the server's and the clients' arithmetic
    on it is then exactly that of plain floats)."""
    return float(np.asarray(value))


def _vector(mu, d):
    """The broadcast prior mean as a contiguous (d,) array (the server's starts as a
    scalar: it learns d from the clients)."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(mu, dtype=np.float64), (d,)))


def _initial_mean(mu0):
    """The server's initial mu: mu0 as given (scalar or (d,)), or the scalar 0."""
    return np.zeros(()) if mu0 is None else np.array(mu0, dtype=np.float64)


def _initial_models(data, mu0):
    """theta_i^0 = mu0 for the clients of ``data`` (mu0 checked against their d here)."""
    d = _data_iv(data).dim
    mu = np.zeros(d) if mu0 is None else _mean_iv(mu0, d, "mu0")
    return {"theta": np.tile(mu, (data.n_clients, 1))}


def _message(**values):
    """A message of 0-d and 1-d float arrays (what crosses the network)."""
    return {key: np.asarray(value, dtype=np.float64) for key, value in values.items()}


def _replace_rows(server, key, rc, rows, fill):
    """A copy of the server's per-client table ``key`` (m rows) with the rows of the
    round's clients replaced by ``rows``. The table is created from ``fill`` at the
    first replies: the server learns the clients' d from them."""
    shape = (rc.config.n_clients, *rows.shape[1:])
    table = server.get(key)
    if table is None or table.shape != shape:
        table = np.broadcast_to(np.asarray(fill, dtype=np.float64), shape)
    table = np.array(table, dtype=np.float64)
    table[rc.clients] = rows
    return table


@dataclass
class FederatedResult:
    """Final states, personal models and the history of a regression run.

    Attributes
    ----------
    server : dict
        The server's state (the population model: mu, variances, atoms, ...).
    clients : dict
        Every client's state (stacks of m rows, client-id order).
    theta : ndarray
        The personal models (m, d), or the global model (d,) for FedAvg.
    history : list of dict
        One row per recorded round (see :func:`run_federated`).
    """

    server: dict
    clients: dict
    theta: np.ndarray
    history: list = field(default_factory=list)
    seconds: float = 0.0
    config: dict = field(default_factory=dict)

    def history_frame(self):
        """The history as a pandas DataFrame (one row per recorded round)."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def plot(self, metric=None, path=None):
        """Each metric of the history against the round.

        Parameters
        ----------
        metric : str or list of str, optional
            History entries to draw, one panel each. Default: ``train_loss`` (with a
            band of +- one sd over clients) and ``mse`` when the run was given the
            ``truth``.
        path : str or path-like, optional
            Also save the figure there (PNG unless the suffix names another format).

        Returns
        -------
        matplotlib.figure.Figure
            One axes per metric, on a pyplot figure (``plt.show()`` shows it).

        Examples
        --------
        >>> from ebfl.learning import LinearEM, RegressionData, run_federated
        >>> rng = np.random.default_rng(0)
        >>> theta = 1.0 + 0.5 * rng.standard_normal((20, 2))
        >>> X = rng.standard_normal((20, 10, 2))
        >>> data = RegressionData.from_arrays(X, np.einsum("mnd,md->mn", X, theta))
        >>> fig = run_federated(LinearEM(), data, 5, truth=theta).plot()
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['train_loss', 'mse']
        >>> import matplotlib.pyplot as plt
        >>> plt.close(fig)
        """
        from ebfl._plotting import plot_history

        return plot_history(self.history, metric, path)


def run_federated(algorithm, data, n_rounds, *, sampling="full", clients_per_round=None,
                  seed=0, truth=None, evaluate=None, record_every=1, checkpoint=None,
                  progress=False):
    """Run ``n_rounds`` synchronization rounds of ``algorithm`` on ``data``.

    Parameters
    ----------
    algorithm : RegressionAlgorithm
    data : RegressionData
    n_rounds : int
        In [0, 10^7].
    sampling : {"full", "fixed", "poisson"}
        Everyone each round; ``clients_per_round`` (K in 1..m) drawn without
        replacement; or each client independently with probability K / m (a
        round may have nobody: the server then keeps its state).
    clients_per_round : int
        K, required by "fixed" and "poisson" and refused by "full".
    seed : int
        Keys every random draw of the run (the clients of each round, the
        algorithm's own), in [0, 2^64 - 1].
    truth : array_like of shape (m, d), optional
        True client parameters (finite); the history then holds ``mse``, the
        mean over clients of ``sum_d (theta_hat - theta)^2``.
    evaluate : callable, optional
        ``evaluate(theta) -> dict`` on the personal models (m, d) (or the global
        model, for algorithms without personal ones); its entries join the
        history (e.g. test accuracy).
    record_every : int
        Record a history row every this many rounds, and after the last.
    checkpoint : path-like, optional
        Save the run there and resume from it, as :func:`ebfl.federated.run`.
    progress : bool
        Progress bar.

    Returns
    -------
    FederatedResult
        Its history has one row per recorded round: ``round``, the algorithm's
        summary (prior estimates) and objective, ``train_loss`` (the clients'
        mean loss on their own data, and its sd over clients), ``mse`` and the
        ``evaluate`` entries, and the round's traffic (``clients``, ``replies``,
        ``bytes_down``, ``bytes_up``).

    Warns
    -----
    RuntimeWarning
        When the final models are not finite (the algorithm diverged).

    Examples
    --------
    >>> from ebfl.learning import LinearEM, RegressionData, run_federated
    >>> rng = np.random.default_rng(0)
    >>> theta = 1.0 + 0.5 * rng.standard_normal((50, 2))
    >>> X = rng.standard_normal((50, 10, 2))
    >>> data = RegressionData.from_arrays(X, np.einsum("mnd,md->mn", X, theta))
    >>> fit = run_federated(LinearEM(), data, 20, truth=theta)
    >>> round(fit.history[-1]["sigma_theta2"], 2)
    0.23
    """
    if not isinstance(algorithm, RegressionAlgorithm):
        raise TypeError(f"algorithm must be a RegressionAlgorithm (see ebfl.learning."
                        f"federated), got {type(algorithm).__name__}")
    if not isinstance(data, RegressionData):
        raise TypeError(f"data must be a RegressionData, got {type(data).__name__}")
    m = data.n_clients
    n_rounds = check_int_scalar(n_rounds, "n_rounds", minimum=0, maximum=MAX_ROUNDS)
    record_every = check_int_scalar(record_every, "record_every", minimum=1)
    check_choice(sampling, "sampling", SAMPLINGS)
    if sampling == "full":
        if clients_per_round is not None:
            raise ValueError("clients_per_round applies to sampling='fixed' or 'poisson', not "
                             "sampling='full'")
        clients_per_round = m
    else:
        clients_per_round = check_int_scalar(clients_per_round, "clients_per_round",
                                             minimum=1, maximum=m)
    if truth is not None:
        truth = check_finite_array(truth, "truth", ndim=2)
        if truth.shape != (m, data.dim):
            raise ValueError(f"truth must have shape (m, d) = {(m, data.dim)}, got "
                             f"{truth.shape}")
    if evaluate is not None:
        check_callable(evaluate, "evaluate", "evaluate(theta) -> dict")
    progress = check_bool(progress, "progress")
    config = RunConfig(n_clients=m, n_rounds=n_rounds, seed=seed,
                       clients_per_round=clients_per_round, eval_every=record_every,
                       sampling="fixed" if sampling == "full" else sampling)

    def monitor(server, clients):
        row = algorithm.objective(server, clients, data)
        theta = algorithm.personal(server, clients)
        if truth is not None:
            row["mse"] = float(np.mean(np.sum((theta - truth) ** 2, axis=1)))
        if evaluate is not None:
            extra = evaluate(theta)
            if not isinstance(extra, Mapping):
                raise TypeError(f"evaluate must return a dict, got {type(extra).__name__}")
            row.update(extra)
        return row

    out = run(algorithm, data, config, checkpoint=checkpoint, monitor=monitor,
              progress=progress)
    theta = algorithm.personal(out.server, out.clients)
    if not np.all(np.isfinite(theta)):
        warnings.warn(f"{type(algorithm).__name__}: the models are not finite after {n_rounds} "
                      "rounds; the algorithm diverged (lower its step sizes)", RuntimeWarning,
                      stacklevel=2)
    return FederatedResult(out.server, out.clients, theta, out.history, out.seconds,
                           out.config)
