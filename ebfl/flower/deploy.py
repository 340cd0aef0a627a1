"""A job as a Flower App, ready for ``flwr run`` on a SuperLink and SuperNodes.

:func:`write_app` writes a directory that Flower (1.41) runs as it is: its
``pyproject.toml`` names the app's ``ServerApp`` and ``ClientApp`` (the
Flower runtime of :mod:`ebfl.flower.runtime`) and holds the job's settings
as the run configuration (``[tool.flwr.app.config]``, overridable with
``flwr run --run-config``); ``.flwr/config.toml`` holds the SuperLink
connection ``ebfl`` that ``flwr run`` submits the run to. Writing needs
neither Flower nor the job's data: the SuperLink and the SuperNodes build the
job from these settings when the run starts. The deployment guide
(``docs/guide/flower.md``) gives the commands.
"""

from __future__ import annotations

import ipaddress
import json
import math
import numbers
from pathlib import Path

import numpy as np

from ebfl._validation import INT64_MAX, check_bool, check_int_scalar, check_positive_scalar
from ebfl.federated.faults import check_failures, parse_failures
from ebfl.federated.protocol import RunConfig
from ebfl.flower.jobs import LEARNING, settings_of

__all__ = ["APP_MODULE", "CONNECTION", "FLOWER_OPTIONS", "check_min_clients", "connection_toml",
           "write_app"]

#: The package of the written app, holding the ``ServerApp`` and ``ClientApp``.
APP_MODULE = "ebfl_app"
#: Name of the SuperLink connection written to the app's ``.flwr/config.toml``.
CONNECTION = "ebfl"
#: Options of the Flower runtime besides the job, with the values the app gets by
#: default (the keys that :mod:`ebfl.flower.runtime` reads from the run config;
#: ``min-clients`` "" means every client).
FLOWER_OPTIONS = {"round-timeout": 120.0, "hello-timeout": 120.0, "min-clients": "",
                  "result-path": "ebfl-result.pkl", "collect-states": False, "failures": ""}

_APP_CODE = '''"""The ServerApp and ClientApp of an ebfl job (written by ebfl.flower.deploy).

Both build the job from the run configuration: ``[tool.flwr.app.config]`` in
pyproject.toml and ``flwr run --run-config``.
"""

from ebfl.flower.runtime import client_app, server_app

server = server_app()
client = client_app()
'''


def write_app(directory, settings, *, superlink="127.0.0.1:9093", overwrite=False):
    """Write a Flower App that runs the job of ``settings`` on a SuperLink.

    Parameters
    ----------
    directory : str or path-like
        Where the app goes; created if missing (in an existing folder: missing
        parents are not created). It must be empty unless ``overwrite``.
    settings : dict
        The job (keys of :func:`ebfl.flower.jobs.build_job`, e.g.
        ``algorithm``, ``clients``, ``n_rounds``, ``seed``, ``clients-per-round``,
        ``local-steps``, ``batch-size``, ``lr``) and, optionally, the Flower
        runtime's options: ``round-timeout`` (seconds, > 0; default 120: how
        long each exchange, the first one with the nodes included, waits for
        replies), ``hello-timeout`` (seconds, > 0; default 120: how long the
        ServerApp waits for one node per client to connect before its first
        round), ``min-clients`` (an integer in 1..clients; default every
        client: with fewer nodes connected once ``hello-timeout`` has passed,
        the run starts if at least this many clients have a node, and a node
        that connects later takes part from the next round on; until then its
        client counts as not answering), ``result-path`` (where the
        ServerApp writes the result, a pickle of
        :class:`~ebfl.federated.RunResult`, and
        ``<result-path>.json``, the history; a relative path is relative to
        the SuperLink's working directory; default ``ebfl-result.pkl``),
        ``collect-states`` (bool: also gather every client's final state;
        default False) and ``failures`` (``"round:client,..."``: clients told
        to fail, for fault drills; default none). Job settings are numbers
        or strings; every unset one is written as its default (an empty
        string where the default is "none").
    superlink : str
        ``host:port`` of the SuperLink's HTTP API, written as the connection
        ``ebfl`` (insecure: no TLS) in ``<directory>/.flwr/config.toml``.
    overwrite : bool
        Allow a non-empty ``directory`` (the app's files are replaced; other
        files stay).

    Returns
    -------
    pathlib.Path
        The app directory.

    Raises
    ------
    ValueError
        Unknown or invalid settings, a non-empty ``directory`` without
        ``overwrite``, a ``superlink`` that is not ``host:port``.
    TypeError
        A setting of the wrong type (a list, a bool for a number, ...).

    Examples
    --------
    >>> import tempfile, tomllib
    >>> from pathlib import Path
    >>> from ebfl.flower.deploy import write_app
    >>> tmp = tempfile.TemporaryDirectory()
    >>> app = write_app(Path(tmp.name) / "app",
    ...                 {"algorithm": "fedavg", "clients": 3, "rounds": 2})
    >>> config = tomllib.loads((app / "pyproject.toml").read_text())
    >>> run_config = config["tool"]["flwr"]["app"]["config"]
    >>> run_config["algorithm"], run_config["clients"], run_config["clients-per-round"]
    ('fedavg', 3, '')
    >>> sorted(p.name for p in app.iterdir())
    ['.flwr', 'README.md', 'ebfl_app', 'pyproject.toml']
    >>> tmp.cleanup()

    Then ``FLWR_HOME=app/.flwr flwr run app ebfl --stream`` starts the job on
    the SuperLink at 127.0.0.1:9093.
    """
    overwrite = check_bool(overwrite, "overwrite")
    host, port = _parse_superlink(superlink)
    run_config = _run_config(settings)
    path = _prepare_directory(directory, overwrite)
    files = {
        "pyproject.toml": _pyproject(run_config),
        f"{APP_MODULE}/__init__.py": '"""An ebfl job as a Flower App."""\n',
        f"{APP_MODULE}/apps.py": _APP_CODE,
        ".flwr/config.toml": connection_toml(f"{_host_text(host)}:{port}"),
        "README.md": _readme(run_config, f"{_host_text(host)}:{port}"),
    }
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return path


def connection_toml(superlink, name=CONNECTION):
    """A Flower configuration file (``config.toml``) with one insecure connection.

    Flower 1.41 keeps SuperLink connections in ``$FLWR_HOME/config.toml``
    (default ``~/.flwr``), not in the app; ``flwr run APP NAME`` submits the
    run to connection ``NAME``. The ``[superlink.NAME]`` table can also be
    copied into an existing ``~/.flwr/config.toml``.

    Parameters
    ----------
    superlink : str
        ``host:port`` of the SuperLink (``[::1]:9093`` for an IPv6 host).
    name : str
        The connection's name (letters, digits, ``-``, ``_``); also the default.

    Returns
    -------
    str
        The file's text.

    Examples
    --------
    >>> print(connection_toml("127.0.0.1:9093"), end="")
    [superlink]
    default = "ebfl"
    <BLANKLINE>
    [superlink.ebfl]
    address = "127.0.0.1:9093"
    insecure = true
    """
    host, port = _parse_superlink(superlink)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"name must be letters, digits, '-' or '_', got {name!r}")
    return (f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
            f'address = "{_host_text(host)}:{port}"\ninsecure = true\n')


# ------------------------------------------------------------------ validation

def check_min_clients(value, m=None):
    """The run option ``min-clients`` checked: an integer in 1..m, or "" (every client).

    Parameters
    ----------
    value : int or str
        The option; "" or None leaves it unset.
    m : int, optional
        The job's number of clients, where known (the ServerApp checks again
        against the job it builds).

    Returns
    -------
    int or str
        The integer, or "" where unset.

    Examples
    --------
    >>> check_min_clients(18, 20), check_min_clients("", 20)
    (18, '')
    >>> check_min_clients(21, 20)
    Traceback (most recent call last):
    ...
    ValueError: min-clients must be an integer in [1, 20], got 21
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return ""
    return check_int_scalar(value, "min-clients", minimum=1,
                            maximum=INT64_MAX if m is None else int(m))


def _parse_superlink(superlink):
    """(host, port) of ``host:port`` (an IPv6 host in brackets: ``[::1]:9093``)."""
    if not isinstance(superlink, str):
        raise TypeError(f"superlink must be a 'host:port' string, got {superlink!r}")
    host, sep, port = superlink.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"superlink must be 'host:port' with a port in 1..65535 "
                         f"(e.g. '127.0.0.1:9093'), got {superlink!r}")
    if any(c in host for c in ' "\\/') or (":" in host and not _is_ipv6(host)):
        raise ValueError(f"superlink host must be a host name or an IP address, got {host!r}")
    return host, int(port)


def _is_ipv6(host):
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _host_text(host):
    return f"[{host}]" if ":" in host else host


def _run_config(settings):
    """The app's run configuration: every job setting and Flower option, as TOML scalars."""
    if not isinstance(settings, dict):
        raise TypeError(f"settings must be a dict of job settings, got {type(settings).__name__}")
    given = {str(k).replace("_", "-"): v for k, v in settings.items()}
    options = {**FLOWER_OPTIONS, **{k: given.pop(k) for k in list(given) if k in FLOWER_OPTIONS}}
    job = settings_of(given)  # unknown keys, algorithm and dataset are refused here
    for key in ("round-timeout", "hello-timeout"):
        options[key] = check_positive_scalar(options[key], key)
    options["min-clients"] = check_min_clients(options["min-clients"], job["clients"])
    options["collect-states"] = check_bool(options["collect-states"], "collect-states")
    for key in ("result-path", "failures"):
        if not isinstance(options[key], str | Path):
            raise TypeError(f"{key} must be a string, got {options[key]!r}")
        options[key] = str(options[key])
    # The form here, and the rounds and clients where the settings fix them (the
    # ServerApp checks the rest, against the job it builds, before its first round).
    parse_failures(options["failures"])
    if job["clients"] is not None and options["failures"].strip():
        check_failures(options["failures"], RunConfig(n_clients=job["clients"],
                                                      n_rounds=job["rounds"]), everyone=True)
    ordered = {"algorithm": job.pop("algorithm"), **job}
    return {**{k: _toml_scalar(k, v) for k, v in ordered.items()}, **options}


def _toml_scalar(key, value):
    """A job setting as a TOML scalar; None (the job's "unset") as an empty string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):  # no job setting is a bool: True would mean 1
        raise TypeError(f"{key} must be a number or a string, got {value!r}")
    if isinstance(value, numbers.Integral):
        if not -INT64_MAX - 1 <= int(value) <= INT64_MAX:  # TOML integers are 64-bit
            raise ValueError(f"{key} must fit in 64 bits, got {value!r}")
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{key} must be finite, got {value!r}")
        return float(value)
    raise TypeError(f"{key} must be a number or a string, got {value!r}")


def _prepare_directory(directory, overwrite):
    try:
        path = Path(directory)
    except TypeError:
        raise TypeError(f"directory must be a path, got {directory!r}") from None
    if path.exists() and not path.is_dir():
        raise ValueError(f"directory {str(path)!r} exists and is not a directory")
    parent = path.parent
    if not path.exists() and not parent.is_dir():  # a typo in a parent is not created
        state = "is a file, not a folder" if parent.exists() else "does not exist"
        raise ValueError(f"directory {str(path)!r}: its parent folder {str(parent)!r} {state}"
                         f"{'' if parent.exists() else '; create it first'}")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"directory {str(path)!r} is not empty; pass overwrite=True to "
                         "write the app into it anyway")
    path.mkdir(exist_ok=True)
    return path


# ------------------------------------------------------------------ file contents

def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    # a JSON string is a TOML basic string once DEL, which TOML wants escaped, is
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _pyproject(run_config):
    extras = "flower,learning" if run_config["algorithm"] in LEARNING else "flower"
    config = "\n".join(f"{key} = {_toml_value(value)}" for key, value in run_config.items())
    return f"""# A Flower App running one ebfl job (written by ebfl.flower.deploy.write_app).
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "ebfl-{run_config["algorithm"]}"
version = "1.0.0"
description = "ebfl job: {run_config["algorithm"]} on {run_config["dataset"]}"
license = "BSD-3-Clause"
dependencies = ["ebfl[{extras}]"]

[tool.hatch.build.targets.wheel]
packages = ["{APP_MODULE}"]

[tool.flwr.app]
publisher = "ebfl"

[tool.flwr.app.components]
serverapp = "{APP_MODULE}.apps:server"
clientapp = "{APP_MODULE}.apps:client"

# The job and the Flower runtime's options; change them here or per run with
# flwr run --run-config 'rounds=20 seed=1'. An empty string means "unset".
[tool.flwr.app.config]
{config}
"""


def _readme(run_config, superlink):
    # clients is "" where the dataset decides (elections: one client per county)
    m = str(run_config["clients"]) if run_config["clients"] != "" else "m"
    last = int(m) - 1 if m.isdigit() else "m - 1 (m: the dataset's number of clients)"
    host, port = _parse_superlink(superlink)
    extras = "flower,learning" if run_config["algorithm"] in LEARNING else "flower"
    return f"""# ebfl job: {run_config["algorithm"]} on {run_config["dataset"]}

A Flower App written by `ebfl flower app`. Every machine needs the same ebfl:
`pip install 'ebfl[{extras}]'`; each builds the job (and its client's data) from
the settings in `pyproject.toml`. In every shell:

    export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \\
           FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

1. The SuperLink, listening on `{superlink}` (an address the SuperNodes reach):

       flower-superlink --insecure --host {host} --port {port}

2. One SuperNode per client, `partition-id` 0 to {last}, each id once
   (`--host`/`--port`: the node's local API, kept on 127.0.0.1; one port per
   node on a machine):

       flower-supernode --insecure --superlink {superlink} \\
           --node-config "partition-id=0 num-partitions={m}" \\
           --host 127.0.0.1 --port 9094

3. The run (`.flwr/config.toml` here holds the SuperLink connection `ebfl`):

       FLWR_HOME=<this directory>/.flwr flwr run <this directory> ebfl --stream

   Change settings per run with `--run-config 'rounds=10 seed=1'`.

The ServerApp writes the result to `result-path` on the SuperLink's machine
(a relative path is relative to the SuperLink's working directory): a pickle
of `ebfl.federated.RunResult` and `<result-path>.json`, the history.
"""
