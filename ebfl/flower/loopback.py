"""A Flower deployment on one machine, on loopback: SuperLink, SuperNodes and ``flwr run``.

:class:`LoopbackFederation` starts Flower's own commands as the deployment guide
does, each as a process of its own (its own process group, its own
``FLWR_HOME``), with every server on 127.0.0.1 and free ports picked at run time,
and the environment :data:`ebfl.flower.runtime.FLOWER_ENV` (no telemetry, no
update checks). SuperNodes can be started late (:meth:`~LoopbackFederation.add_node`),
stopped (:meth:`~LoopbackFederation.stop_node`, SIGTERM: the node leaves) or killed
(:meth:`~LoopbackFederation.kill_node`, SIGKILL), and every process is stopped by
its PID at the end. The deployment tests and ``benchmarks/bench_flower_deploy.py``
use it; it needs ``ebfl[flower]`` and psutil (``pip install psutil``), which finds
every process Flower starts (the SuperNodes' SuperExecs and ClientApps) and the
addresses they listen on.

Examples
--------
The app comes from :func:`ebfl.flower.deploy.write_app`::

    with LoopbackFederation(workdir, 3) as fed:
        app = write_app(workdir / "app", {"algorithm": "fedavg", "clients": 3},
                        superlink=fed.superlink)
        fed.wait_run(fed.flwr_run(app), limit=300)
    assert not fed.alive() and not fed.wide()
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ebfl.flower.runtime import FLOWER_ENV

__all__ = ["LOOPBACK", "LoopbackFederation", "free_ports", "node_progress"]

#: The addresses that count as loopback.
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
#: The environment variable that marks every process of one federation (children
#: inherit it), so that one that escaped its parent is still found and stopped.
MARK = "EBFL_LOOPBACK_FEDERATION"


def _psutil():
    try:
        import psutil
    except ImportError as exc:
        raise ImportError("ebfl.flower.loopback needs psutil to find and stop every process "
                          "Flower starts: pip install psutil") from exc
    return psutil


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (all held open until all are picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _command(name):
    """Flower's command ``name``: beside this Python, else on the PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found beside {sys.executable} nor on the PATH; "
                                "install Flower: pip install 'ebfl[flower]'")
    return found


def _wait_listening(port, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def node_progress(log, message_type="train"):
    """(received, replied): how many messages of ``message_type`` a SuperNode's log
    shows it received, and how many replies it shows pushed to the SuperLink.

    ``message_type`` is Flower's: ``train`` (ebfl's training and idle messages),
    ``evaluate``, or ``query`` (the server's question for the node's client id).
    A node between the two counts has a message in hand: its ClientApp is running.
    """
    received = replied = 0
    sending = False
    for line in log.splitlines():
        if f"Receiving: {message_type} message" in line:
            received += 1
        elif "Sending: " in line:
            sending = f"Sending: {message_type} message" in line
        elif "Sent successfully" in line and sending:
            replied, sending = replied + 1, False
    return received, replied


class LoopbackFederation:
    """A SuperLink and SuperNodes on 127.0.0.1, one process group each.

    Parameters
    ----------
    workdir : str or path-like
        An existing folder for the logs (``<name>.log``) and each process's
        ``FLWR_HOME``.
    n_clients : int
        The job's number of clients (each node's ``num-partitions``).
    startup_timeout : float
        Seconds a server has to listen once started.

    Attributes
    ----------
    superlink : str
        ``127.0.0.1:<port>``: the address for :func:`ebfl.flower.deploy.write_app`.
    nodes : dict
        {partition id: ``subprocess.Popen``} of the SuperNodes started, the latest
        per partition id.
    seen : set
        (process name, address, port) of every listening socket seen while the
        federation ran (sampled every 0.25 s).
    """

    def __init__(self, workdir, n_clients, *, startup_timeout=180.0):
        self.psutil = _psutil()
        self.dir = Path(workdir)
        self.n = int(n_clients)
        self.startup_timeout = float(startup_timeout)
        self.token = f"{os.getpid()}-{id(self)}-{time.time_ns()}"
        # The SuperExecs look for tasks every 0.2 s instead of 1 s (a shorter run; the
        # SuperNodes still poll the SuperLink every few seconds).
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                            f"{os.environ.get('PATH', '')}",
                    "PYTHONUNBUFFERED": "1", MARK: self.token}
        (self.port,) = free_ports(1)
        self.superlink = f"127.0.0.1:{self.port}"
        self.procs, self.nodes, self.node_names, self.seen = [], {}, {}, set()
        self.known = {}  # pid -> psutil.Process of everything seen in our trees
        self._stop_watch = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, daemon=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _start(self, name, args, home=None):
        """Start a Flower command; its FLWR_HOME is its own, as on a machine of its own."""
        env = {**self.env, "FLWR_HOME": str(home or self.dir / f"home-{name}")}
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop)
        proc = subprocess.Popen([_command(args[0]), *args[1:]], cwd=self.dir, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # own group: killpg reaches children
        proc.log = log
        self.procs.append(proc)
        self.tree()
        return proc

    def start(self, partitions=None):
        """Start the SuperLink and one SuperNode per partition id (default: every client),
        and wait until each listens."""
        link = self._start("superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1",
                                         "--port", str(self.port)])
        if not self._watch.is_alive():
            self._watch.start()
        _wait_listening(self.port, link, self.startup_timeout)
        ids = range(self.n) if partitions is None else partitions
        started = [self.add_node(i, wait=False) for i in ids]
        for proc in started:
            _wait_listening(proc.node_port, proc, self.startup_timeout)
        return self

    def add_node(self, partition_id, *, wait=True):
        """Start a SuperNode for client ``partition_id`` (also late, while a run goes on).

        A partition id whose earlier node has exited gets a new node (log
        ``node<id>-<k>.log``). Returns its ``subprocess.Popen``.
        """
        pid = int(partition_id)
        old = self.nodes.get(pid)
        if old is not None and old.poll() is None:
            raise ValueError(f"client {pid} already has a running SuperNode")
        name = f"node{pid}" if old is None else f"node{pid}-{len(self.node_names[pid])}"
        (port,) = free_ports(1)
        proc = self._start(name, [
            "flower-supernode", "--insecure", "--superlink", self.superlink,
            "--node-config", f"partition-id={pid} num-partitions={self.n}",
            "--host", "127.0.0.1", "--port", str(port)])
        proc.node_port, proc.name = port, name
        self.nodes[pid] = proc
        self.node_names.setdefault(pid, []).append(name)
        if wait:
            _wait_listening(port, proc, self.startup_timeout)
        return proc

    def stop_node(self, partition_id, timeout=30.0, *, wait=True):
        """SIGTERM SuperNode ``partition_id``'s process group: the node leaves (it tells
        the SuperLink so). With ``wait``, SIGKILL if it has not exited within
        ``timeout`` s, and return its exit code (else None at once)."""
        return self._signal_node(partition_id, signal.SIGTERM, timeout, wait)

    def kill_node(self, partition_id, *, wait=True):
        """SIGKILL SuperNode ``partition_id``'s process group (the node, its SuperExec,
        its ClientApp): it vanishes without a word, as a crashed machine. Returns its
        exit code with ``wait`` (else None at once)."""
        return self._signal_node(partition_id, signal.SIGKILL, 10.0, wait)

    def _signal_node(self, partition_id, sig, timeout, wait):
        proc = self.nodes[int(partition_id)]
        self.tree()  # its children are recorded first, for stop()
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if not wait:
            return None
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(timeout=10)

    def flwr_run(self, app):
        """``flwr run APP ebfl --stream`` with the app's own Flower configuration."""
        return self._start("flwr-run", ["flwr", "run", str(app), "ebfl", "--stream"],
                           home=Path(app) / ".flwr")

    def wait_run(self, proc, limit, until=None):
        """Wait for ``flwr run`` to end; ``until`` (a callable) is polled every 0.2 s
        meanwhile until it returns True. RuntimeError if the run fails, TimeoutError
        after ``limit`` seconds (both with the end of the SuperLink's log)."""
        deadline = time.monotonic() + limit
        while proc.poll() is None:
            if until is not None and until():
                until = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"flwr run did not end within {limit} s; superlink log:\n"
                                   + self.log("superlink")[-3000:])
            time.sleep(0.2)
        if proc.returncode != 0:
            raise RuntimeError(f"flwr run exited with {proc.returncode}:\n"
                               + self.log("flwr-run")[-3000:])

    def log(self, name):
        """The log of process ``name`` (``superlink``, ``flwr-run``, ``node<id>``)."""
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def node_log(self, partition_id):
        """The log of the latest SuperNode of client ``partition_id``."""
        return self.log(self.nodes[int(partition_id)].name)

    def progress(self, partition_id, message_type="train"):
        """:func:`node_progress` of the latest SuperNode of client ``partition_id``."""
        return node_progress(self.node_log(partition_id), message_type)

    # ---------------------------------------------------------- processes

    def tree(self):
        """Every live process we started and its descendants (recorded in ``known``)."""
        ps, out = self.psutil, []
        for proc in self.procs:
            try:
                root = ps.Process(proc.pid)
                out += [root, *root.children(recursive=True)]
            except ps.NoSuchProcess:
                pass
        for p in out:
            self.known.setdefault(p.pid, p)
        return out

    def marked(self):
        """Every process on this machine that carries this federation's mark."""
        ps, out = self.psutil, []
        for p in ps.process_iter():
            try:
                if p.environ().get(MARK) == self.token:
                    out.append(p)
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                pass
        return out

    def _watch_loop(self):
        """Records every listening address of our processes while they run."""
        ps = self.psutil
        while not self._stop_watch.is_set():
            for p in self.tree():
                try:
                    for conn in p.net_connections(kind="inet"):
                        if conn.status == ps.CONN_LISTEN:
                            self.seen.add((p.name(), conn.laddr.ip, conn.laddr.port))
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                    pass
            self._stop_watch.wait(0.25)

    def wide(self):
        """The listening sockets seen on anything but loopback (sorted)."""
        return sorted(s for s in self.seen if s[1] not in LOOPBACK)

    def stop(self):
        """Stop everything by PID: TERM, then KILL after 10 s; reap our children."""
        ps = self.psutil
        self._stop_watch.set()
        if self._watch.is_alive():
            self._watch.join(timeout=5)
        self.tree()
        for p in self.marked():
            self.known.setdefault(p.pid, p)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in list(self.known.values()):
                try:
                    p.send_signal(sig)
                except (ps.NoSuchProcess, ps.ZombieProcess, ProcessLookupError):
                    pass
            deadline = time.monotonic() + 10
            while self.alive() and time.monotonic() < deadline:
                for proc in self.procs:
                    proc.poll()
                time.sleep(0.2)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            proc.log.close()

    def alive(self):
        """Processes of ours still running (a zombie whose parent is gone counts as ended)."""
        ps, out = self.psutil, []
        for p in {**self.known, **{p.pid: p for p in self.marked()}}.values():
            try:
                if p.is_running() and p.status() != ps.STATUS_ZOMBIE:
                    out.append(p)
            except (ps.NoSuchProcess, ps.ZombieProcess):
                pass
        return out
