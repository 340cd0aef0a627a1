"""Simulated client failures of a run: parsed and checked once, for both runtimes.

``failures`` maps a 0-based round to the clients that fail in it (see
:func:`ebfl.federated.run`); on the command line and in a Flower App's run
configuration it is the text ``"round:client,..."``. Both forms are checked
against the run here, before anything starts: the in-process runtime, the
Flower runtime and ``ebfl flower simulate --failures`` refuse the same input
with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping

from ebfl._validation import check_bool, check_int_scalar

__all__ = ["check_failures", "failures_of_history", "parse_failures"]


def parse_failures(text, name="failures"):
    """``"1:0,2:3"`` (round:client pairs, 0-based) as {round: {clients}}.

    Only the form is checked here; :func:`check_failures` checks the rounds and
    clients against a run.
    """
    if text is None:
        return {}
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string of round:client pairs like '1:0,2:3', got "
                        f"{type(text).__name__}")
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            r, c = (int(v) for v in parts)
        except ValueError:
            raise ValueError(f"{name} must be round:client pairs like '1:0,2:3', got "
                             f"{item[:40]!r}") from None
        out.setdefault(r, set()).add(c)
    return out


def check_failures(failures, config, *, everyone=False, name="failures"):
    """``failures`` checked against the run ``config``, as {round: set of client ids}.

    Rounds are 0-based, in [0, ``config.rounds`` - 1]; clients in [0, m - 1].
    A round may lose every client it sampled (the server then keeps its state),
    but not every round of the run: such a run aggregates nothing, and its
    estimates would all be NaN, so it is refused.

    Parameters
    ----------
    failures : None, dict round -> iterable of client ids, or str
        A string is parsed by :func:`parse_failures`.
    config : RunConfig
    everyone : bool
        Every client trains every round (the algorithm's ``all_clients_train``).
    name : str
        How errors name ``failures`` (``--failures`` on the command line).
    """
    from ebfl.federated.protocol import RunConfig, sample_clients

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig, got {type(config).__name__}")
    everyone = check_bool(everyone, "everyone")
    if isinstance(failures, str):
        failures = parse_failures(failures, name)
    if failures is None:
        return {}
    if not isinstance(failures, Mapping):
        raise TypeError(f"{name} must be a dict round -> client ids that fail in that round, "
                        f"got {type(failures).__name__}")
    n_rounds, m = config.n_rounds, config.n_clients
    out = {}
    for r, clients in failures.items():
        if n_rounds == 0:
            raise ValueError(f"{name}: the run has no rounds, so no client can fail in "
                             f"round {r!r}")
        r = check_int_scalar(r, f"{name} round", minimum=0, maximum=n_rounds - 1)
        if isinstance(clients, str | bytes) or not hasattr(clients, "__iter__"):
            raise TypeError(f"{name}[{r}] must be an iterable of client ids, got "
                            f"{type(clients).__name__}")
        out.setdefault(r, set()).update(
            check_int_scalar(c, f"{name} client", minimum=0, maximum=m - 1) for c in clients)
    # Only a run whose every round is listed can be silenced entirely: checked then only.
    if out and len(out) == n_rounds and all(
            set(sample_clients(config, r, everyone=everyone).tolist()) <= out[r]
            for r in range(n_rounds)):
        raise ValueError(f"{name} leave no client to reply in any of the {n_rounds} round(s): "
                         "the server would have nothing to aggregate and every estimate "
                         "would be NaN; let at least one sampled client of some round reply")
    return out


def failures_of_history(history):
    """The ``failures`` that replay a run: ``{round: clients}`` from its history.

    Each history row lists the sampled clients whose training replies were not
    aggregated since the previous row (``left_out``, with their 0-based rounds in
    ``left_out_rounds``). Given to :func:`ebfl.federated.run`, the result repeats
    the run, for instance a Flower deployment where nodes joined late, left or
    died, in process (exactly for the algorithms that do not train idle clients:
    an idle client that missed its message is not recorded).

    Parameters
    ----------
    history : list of dict
        ``RunResult.history``.

    Returns
    -------
    dict of int -> set of int

    Examples
    --------
    >>> failures_of_history([{"left_out": [3, 1, 4], "left_out_rounds": [0, 2, 2]},
    ...                      {"left_out": [], "left_out_rounds": []}])
    {0: {3}, 2: {1, 4}}
    """
    out = {}
    for row in history:
        for r, c in zip(row["left_out_rounds"], row["left_out"], strict=True):
            out.setdefault(int(r), set()).add(int(c))
    return out
