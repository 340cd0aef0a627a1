"""One definition per federated algorithm: a client half and a server half.

An algorithm is written once, as the two halves of a protocol whose messages
are explicit: the server's *broadcast* to the sampled clients and each
client's *reply*, both nested dicts of arrays (numpy arrays or torch tensors),
so what crosses the network is visible and countable
(:func:`~ebfl.federated.tree.tree_nbytes`), and privacy mechanisms sit in the
half where they act (a client privatizes its reply before it leaves).

Two runtimes run the same object:

* :func:`ebfl.federated.run` (in process): the client half runs once for all
  the sampled clients at a time, vectorized over their stacked states;
* :mod:`ebfl.flower.runtime` (Flower): the client half runs inside a
  ``ClientApp`` for one client (a stack of 1), its persistent state kept in
  the node's ``Context.state``; the server half inside a ``ServerApp``.

Both draw every random number from streams keyed by (seed, round, client)
(:mod:`ebfl.federated.streams`), and the server processes replies in
client-id order, so the two runtimes give the same result.

A round
-------
1. The server samples clients (:func:`sample_clients`: K of m without
   replacement, from the server's stream of the round) and sends each
   ``broadcast(server, rc)``.
2. Every sampled client runs ``client_train(message, client, data, rc)``: it
   updates its persistent state ``client`` in place (a dict of stacks, one row
   per client) and returns its reply (a dict of stacks, one row per client).
3. If ``trains_idle``, every unsampled client runs ``client_idle(message,
   client, data, rc)`` on ``idle_message(server)`` and replies nothing.
4. The server calls ``aggregate(server, replies, weights, rc)`` with the
   replies that arrived, stacked in client-id order, and the clients'
   aggregation weights (``client_weights``, e.g. training-set sizes); it
   returns the new server state. A client that failed during the round is
   absent from ``replies``, and its persistent state is as before the round.
5. Every ``eval_every`` rounds, every client runs ``client_evaluate(message,
   client, data)`` on ``evaluation_message(server)`` and returns per-client
   metrics (arrays of length K).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ebfl._validation import (
    INT64_MAX,
    check_bool,
    check_choice,
    check_int_scalar,
    check_real_scalar,
)
from ebfl.federated.streams import MAX_SEED, SERVER, stream_seed

__all__ = ["FederatedAlgorithm", "RoundContext", "RunConfig", "sample_clients"]

#: Upper bounds of a run's sizes. Far beyond any run that can finish (ten million
#: rounds, a hundred million clients), yet small enough that the arrays of a round
#: (a permutation of the client ids, a K x batch_size draw) can be allocated: a
#: larger value is a typo, refused before anything starts.
MAX_ROUNDS = 10**7
MAX_CLIENTS = 10**8
MAX_LOCAL_STEPS = 10**7
MAX_BATCH_SIZE = 10**7
#: How the server samples the clients of a round (see :func:`sample_clients`).
SAMPLING = ("fixed", "poisson")


@dataclass(frozen=True)
class RunConfig:
    """What every participant of a run knows: sent to the clients in every message.

    Attributes
    ----------
    n_clients : int
        m, in [1, 10^8].
    n_rounds : int
        In [0, 10^7]; rounds are numbered 0 to ``rounds - 1``.
    seed : int
        Keys every random stream of the run, in [0, 2^64 - 1].
    clients_per_round : int
        K sampled per round (m: everyone); with Poisson sampling, the expected
        number, each client taking part with probability q = K / m.
    local_steps : int
        tau, local iterations per round (learning algorithms), in [1, 10^7].
    batch_size : int
        Minibatch per client and local iteration (learning algorithms), in
        [1, 10^7].
    iters_per_epoch : int
        The learning-rate decay applies once per this many iterations, >= 1.
    lr_decay : float
        Learning-rate factor per epoch, in (0, 1].
    eval_every : int
        Evaluate every this many rounds (and after the last).
    sampling : {"fixed", "poisson"}
        "fixed": K clients without replacement; "poisson": every client
        independently with probability K / m (a round may have none), the
        sampling that DP-FedAvg's privacy accountant assumes.
    """

    n_clients: int
    n_rounds: int
    seed: int = 0
    clients_per_round: int | None = None
    local_steps: int = 1
    batch_size: int = 1
    iters_per_epoch: int = 60
    lr_decay: float = 1.0
    eval_every: int = 1
    sampling: str = "fixed"

    def __post_init__(self):
        m = check_int_scalar(self.n_clients, "n_clients", minimum=1, maximum=MAX_CLIENTS)
        k = m if self.clients_per_round is None else self.clients_per_round
        object.__setattr__(self, "n_clients", m)
        object.__setattr__(self, "clients_per_round",
                           check_int_scalar(k, "clients_per_round", minimum=1, maximum=m))
        for name, low, high in (("n_rounds", 0, MAX_ROUNDS), ("local_steps", 1, MAX_LOCAL_STEPS),
                                ("batch_size", 1, MAX_BATCH_SIZE),
                                ("iters_per_epoch", 1, INT64_MAX), ("eval_every", 1, INT64_MAX)):
            object.__setattr__(self, name, check_int_scalar(getattr(self, name), name,
                                                            minimum=low, maximum=high))
        object.__setattr__(self, "seed", check_int_scalar(self.seed, "seed", minimum=0,
                                                          maximum=MAX_SEED))
        object.__setattr__(self, "lr_decay", check_real_scalar(
            self.lr_decay, "lr_decay", low=0.0, high=1.0, low_open=True))
        check_choice(self.sampling, "sampling", SAMPLING)

    @property
    def sampling_rate(self):
        """q = K / m, the probability that a given client is sampled in a round."""
        return self.clients_per_round / self.n_clients

    def to_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class RoundContext:
    """The round a client half (or the server half) is working on.

    Attributes
    ----------
    config : RunConfig
    round : int
        0-based.
    clients : ndarray of int
        The ids of the clients this call handles (row j of the stacks is
        client ``clients[j]``); on Flower, one id.
    """

    config: RunConfig
    round: int
    clients: np.ndarray

    def __post_init__(self):
        if not isinstance(self.config, RunConfig):
            raise TypeError(f"config must be a RunConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "round", check_int_scalar(self.round, "round", minimum=0,
                                                           maximum=MAX_ROUNDS))
        object.__setattr__(self, "clients", client_ids(self.clients, "clients",
                                                       self.config.n_clients))

    def seeds(self, purpose="round"):
        """The 64-bit seed of each client's stream of this round (see :mod:`.streams`)."""
        return [stream_seed(self.config.seed, self.round, int(c), purpose) for c in self.clients]

    def lr_scale(self, step):
        """Learning-rate factor of local iteration ``step`` of this round (per-epoch decay)."""
        c = self.config
        return c.lr_decay ** ((self.round * c.local_steps + step) // c.iters_per_epoch)


def client_ids(ids, name, m):
    """``ids`` as a 1-D int64 array of client ids in [0, m - 1] (no copy of an int64 array).

    Positions must be integers: ``np.asarray(ids, dtype=np.int64)`` would truncate
    0.7 to client 0, and a negative id would silently count from the end.
    """
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError):  # ragged nested sequences
        raise TypeError(f"{name} must be a 1-D array of client ids") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of client ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == bool or arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer client ids, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() > m - 1:
        bad = arr.min() if arr.min() < 0 else arr.max()
        raise ValueError(f"{name} must hold client ids in [0, {m - 1}], got {bad}")
    return arr.astype(np.int64, copy=False)


def sample_clients(config, round_, *, everyone=False):
    """The sorted ids of the clients sampled in round ``round_``.

    K = ``config.clients_per_round`` of m without replacement (or, with
    ``config.sampling == "poisson"``, each client with probability K / m: the
    result may be empty), drawn from the server's stream of the round; all m
    when K = m or ``everyone``.

    Parameters
    ----------
    config : RunConfig
    round_ : int
        0-based, in [0, 10^7] (a round past ``config.rounds`` is allowed: a run
        may be extended).
    everyone : bool
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    round_ = check_int_scalar(round_, "round_", minimum=0, maximum=MAX_ROUNDS)
    everyone = check_bool(everyone, "everyone")
    m, k = config.n_clients, config.clients_per_round
    if everyone or k == m:
        return np.arange(m)
    rng = np.random.default_rng(stream_seed(config.seed, round_, SERVER))
    if config.sampling == "poisson":
        return np.flatnonzero(rng.random(m) < k / m)
    return np.sort(rng.permutation(m)[:k])


class FederatedAlgorithm:
    """Base class: the two halves of the module docstring, the optional steps as defaults.

    Subclasses implement ``config``, ``init_server``, ``init_clients``,
    ``broadcast``, ``client_train``, ``aggregate`` and ``client_evaluate``.
    Client-half methods are vectorized over a stack of K clients (K = 1 on
    Flower); rows of ``client`` and of ``data`` follow ``rc.clients``.
    """

    name = "algorithm"
    #: True: every client trains every round (no sampling), as in local training.
    all_clients_train = False
    #: True: unsampled clients run ``client_idle`` each round.
    trains_idle = False
    #: "torch" or "numpy": the array type of messages and states (for transport).
    array_api = "numpy"
    #: True: ``aggregate`` runs also in a round where no reply arrived, with
    #: ``replies=None`` (a DP server must release noise every round, or an empty
    #: round would reveal that nobody took part).
    aggregate_empty = False

    def config(self):
        """The algorithm's hyperparameters (a JSON-able dict)."""
        return {"name": self.name}

    # ---- server half
    def init_server(self, run):
        """The server's state at the start of the run.

        ``run`` is the run's :class:`~ebfl.federated.RunConfig`.
        """
        raise NotImplementedError

    def broadcast(self, server, rc):
        """The message to every sampled client of round ``rc.round``."""
        raise NotImplementedError

    def idle_message(self, server, rc):
        """The message to unsampled clients when ``trains_idle`` (default: nothing)."""
        return {}

    def evaluation_message(self, server):
        """What the clients need to evaluate their predictors (default: nothing)."""
        return {}

    def aggregate(self, server, replies, weights, rc):
        """The new server state from the replies that arrived (client-id order).

        ``replies`` is None (and ``rc.clients`` empty) in a round without
        replies, called only when ``aggregate_empty``.
        """
        raise NotImplementedError

    def summary(self, server):
        """Scalars of the server state for the history."""
        return {}

    def restore_state(self, tree):
        """A server or client state read from a checkpoint, placed where this algorithm
        computes (checkpoints hold CPU arrays; a torch strategy on a GPU moves them there).
        Default: as read."""
        return tree

    # ---- client half
    def init_clients(self, run, data, clients):
        """The persistent state of clients ``clients`` (a dict of stacks, one row each).

        ``data`` holds the data of exactly those clients, row j for ``clients[j]``
        (in process every client's; on Flower the client's own).
        """
        raise NotImplementedError

    def client_weights(self, data):
        """Aggregation weight of each client of ``data`` (default: 1)."""
        return np.ones(data.n_clients)

    def client_train(self, message, client, data, rc):
        """One round of the sampled clients: update ``client`` in place, return the reply."""
        raise NotImplementedError

    def client_idle(self, message, client, data, rc):
        """One round of unsampled clients (only when ``trains_idle``); replies nothing."""

    def client_evaluate(self, message, client, data):
        """Per-client metrics: a dict name -> array of length K."""
        raise NotImplementedError
