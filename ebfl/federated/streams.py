"""Random streams keyed by (seed, round, client), not by call order.

Every random draw of a federated run (which clients the server samples, each
client's minibatches, its privacy noise) comes from a stream named by the run's
seed, the round and the client: the same numbers whichever runtime runs the
client, in whatever order the clients happen to run.
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import check_choice, check_int_scalar

__all__ = ["SERVER", "numpy_streams", "stream_seed"]

#: Seeds lie in [0, 2^64 - 1] (a torch.Generator's range).
MAX_SEED = 2**64 - 1
#: Rounds and client ids are keys of a SeedSequence (any size would do); this bound
#: only catches nonsense (RunConfig allows at most 10^7 rounds and 10^8 clients).
MAX_KEY = 2**63 - 1

#: The client id of the server's own stream (client sampling).
SERVER = -1
#: Purposes of one (seed, round, client): independent streams for independent uses.
PURPOSES = {"round": 0, "evaluate": 1, "init": 2, "aggregate": 3}


def stream_seed(seed, round_, client, purpose="round"):
    """A 64-bit seed for the stream of (``seed``, ``round_``, ``client``, ``purpose``).

    Derived with numpy's ``SeedSequence`` (its hashing decorrelates nearby keys),
    so streams of neighbouring rounds or clients are independent.

    Parameters
    ----------
    seed : int
        The run's seed, in [0, 2^64 - 1].
    round_ : int
        0-based round, in [0, 2^63 - 1].
    client : int
        Client id in [0, 2^63 - 2], or :data:`SERVER` (-1) for the server's stream.
    purpose : str
        One of "round" (a client's training draws; the server's client sampling),
        "evaluate", "init" and "aggregate" (noise the server adds when aggregating).

    Returns
    -------
    int in [0, 2^64 - 1]
    """
    # int() would truncate a float seed or round (2.7 -> 2) into another stream
    key = [check_int_scalar(seed, "seed", minimum=0, maximum=MAX_SEED),
           check_int_scalar(round_, "round_", minimum=0, maximum=MAX_KEY),
           check_int_scalar(client, "client", minimum=SERVER, maximum=MAX_KEY - 1) + 1,
           PURPOSES[check_choice(purpose, "purpose", PURPOSES)]]
    lo, hi = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    return int(lo) | (int(hi) << 32)


def numpy_streams(seed, round_, clients, purpose="round"):
    """One ``numpy.random.Generator`` per client in ``clients`` (see :func:`stream_seed`)."""
    if np.ndim(clients) != 1:
        raise ValueError(f"clients must be a 1-D sequence of client ids, got "
                         f"{np.ndim(clients)}-D")
    return [np.random.default_rng(stream_seed(seed, round_, c, purpose)) for c in clients]
