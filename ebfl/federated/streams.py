"""Random streams keyed by (seed, round, client), not by call order.

Every random draw of a federated run (which clients the server samples, each
client's minibatches, its privacy noise) comes from a stream named by the run's
seed, the round and the client: the same numbers whichever runtime runs the
client, in whatever order the clients happen to run.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SERVER", "numpy_streams", "stream_seed"]

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
        The run's seed, >= 0.
    round_ : int
        0-based round, >= 0.
    client : int
        Client id >= 0, or :data:`SERVER` (-1) for the server's stream.
    purpose : str
        One of "round" (a client's training draws; the server's client sampling),
        "evaluate", "init" and "aggregate" (noise the server adds when aggregating).

    Returns
    -------
    int in [0, 2^64 - 1]
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {sorted(PURPOSES)}, got {purpose!r}")
    key = [int(seed), int(round_), int(client) + 1, PURPOSES[purpose]]
    lo, hi = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    return int(lo) | (int(hi) << 32)


def numpy_streams(seed, round_, clients, purpose="round"):
    """One ``numpy.random.Generator`` per client in ``clients``."""
    return [np.random.default_rng(stream_seed(seed, round_, c, purpose)) for c in clients]
