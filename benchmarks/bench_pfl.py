"""Benchmark P9: FedAvg rounds in ebfl's engine, in a loop over clients, and in Apple's pfl.

The yardstick of the neural engine against a simulator researchers pick: the same
FedAvg job, on the same client split, initial weights and hyper-parameters, run by

engine  ``ebfl.learning.torch.train`` with the ``FedAvg`` strategy: each round the
        sampled clients' local steps as one ``torch.func`` (vmap) call per step.
loop    the same run (``train``, the same runtime, client sampling, minibatches and
        server step) with the client half written the way client-by-client
        frameworks run it: for each sampled client, load the global model into an
        ``nn.Module`` and take the steps with ``loss.backward()`` and
        ``torch.optim.SGD``. The clients draw their minibatches from their own
        streams, as the engine's, so both compute the same rounds: their final
        models agree to float32 rounding (``max_abs_diff_engine_loop``).
pfl     pfl-research 0.6.0 (``pfl[pytorch]``) with its PyTorch backend in a separate
        virtual environment (``--pfl-venv``, default ``~/.cache/ebfl/pfl-venv``, made
        on first use with ``python -m venv`` and ``pip install torch==<this torch>
        'pfl[pytorch]==0.6.0'``; pip reads its usual configuration, e.g.
        ``PIP_EXTRA_INDEX_URL`` for a CPU-only torch index), run by
        ``_pfl_runner.py`` in a subprocess on the data and weights this process
        writes to a temporary ``.npz``: ``FederatedAveraging`` on the simulated
        backend, one process, no DP (see that file for the configuration). By
        default each pfl client keeps its data and trains one epoch over it in
        stored order (pfl's usual set-up; the engine draws minibatches with
        replacement), so pfl's run follows another random path to a similar
        accuracy. ``--pfl-same-batches`` instead hands pfl the engine's sampled
        clients and minibatches, round by round, and reports how far its final
        model is from the engine's (``max_abs_diff_engine_pfl``).

Workloads (``--workload mlp|cnn|both``; MNIST from ebfl's data home, pixels in
[0, 1], split IID into 100 clients of 600 images; 10 clients a round, one local epoch
of plain SGD, lr 0.05, no weight decay, no learning-rate decay; the server averages
the clients' models weighted by their sizes, all equal):

mlp  the 784-200-200-10 ReLU MLP, batch 10 (60 local steps).
cnn  the papers' 5-layer CNN (``CNN5``, as in ``bench_adaped.py``), batch 20 (30 steps).

Timing: the round's period, from the end of one round to the end of the next (from
the start of training for the first), read with ``time.perf_counter``: in ebfl
when ``aggregate`` returns, in pfl in an ``after_central_iteration`` callback. It
holds the sampling, the broadcast, the clients' training and the server step; the
final evaluation is outside. The first ``--warmup`` rounds (default 2) are discarded
(first calls, pfl's round-0 evaluation). Runs alternate engine, loop, pfl, engine,
... ``--repeats`` times, so that drifts in the machine's load hit all three alike;
the table gives each runner's median over all its steady rounds with the quartiles,
the median CPU time of the round (``time.process_time``: with one torch thread, the
work done, less sensitive than the wall clock to other jobs on a shared machine), the
ratios of the medians (engine / pfl, engine / loop; wall, and CPU in parentheses) and
each final global model's accuracy on the 10,000 MNIST test images (evaluated here,
by one function).
Every runner uses ``--threads`` torch threads (default 1) and flushes denormals.

``--quick``: 20 clients of 60 images, 4 a round, 3 rounds (1 discarded), 1 repeat.
``--no-pfl`` runs the engine and the loop only; when the pfl environment cannot be
made (no network), a line says so and the two ebfl runners still run. ``--json``
prints one JSON object.
"""

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from ebfl.federated import RoundContext, sample_clients
from ebfl.learning.torch import CNN5, MLP, FedAvg, FederatedDataset, train
from ebfl.learning.torch.engine import run_config
from ebfl.learning.torch.functional import client_generators

PFL_VERSION = "0.6.0"
RUNNER = Path(__file__).with_name("_pfl_runner.py")
DEFAULT_VENV = Path("~/.cache/ebfl/pfl-venv").expanduser()
RUNNERS = ("engine", "loop", "pfl")

WORKLOADS = {
    "mlp": {"model": "mlp", "title": "MLP 784-200-200-10", "batch": 10},
    "cnn": {"model": "cnn", "title": "5-layer CNN (CNN5)", "batch": 20},
}
FULL = {"clients": 100, "samples": 600, "per_round": 10, "lr": 0.05}
QUICK = {"clients": 20, "samples": 60, "per_round": 4, "lr": 0.05}


def _model(kind):
    return CNN5() if kind == "cnn" else MLP(784, 10)


# --- the data and the starting point ------------------------------------------------

def mnist_split(n_clients, samples, seed):
    """(per-client train images, labels, test images, test labels): an IID split of
    MNIST's training set into ``n_clients`` of ``samples`` images, pixels in [0, 1]."""
    from ebfl.datasets import load_mnist

    train_set, test_set = load_mnist("train"), load_mnist("test")
    if n_clients * samples > len(train_set.labels):
        raise ValueError(f"{n_clients} x {samples} images exceed MNIST's "
                         f"{len(train_set.labels)}")
    order = np.random.default_rng(seed).permutation(len(train_set.labels))
    order = order[: n_clients * samples].reshape(n_clients, samples)
    x = train_set.images[order].astype(np.float32) / 255.0  # (m, n, 28, 28)
    y = train_set.labels[order].astype(np.int64)
    return x, y, test_set.images.astype(np.float32) / 255.0, test_set.labels.astype(np.int64)


def federated(x, y, x_test, y_test):
    """The split as ebfl data; each client gets an equal share of the test images (only
    for ``train``'s final evaluation: the accuracies reported are computed here)."""
    m = x.shape[0]
    return FederatedDataset.from_clients(list(x), list(y), np.array_split(x_test, m),
                                         np.array_split(y_test, m), n_classes=10)


def initial_params(kind, seed):
    torch.manual_seed(seed)
    return {n: p.detach().clone() for n, p in _model(kind).named_parameters()}


@torch.no_grad()
def accuracy(kind, params, x_test, y_test, chunk=2000):
    """Accuracy of one model (ebfl's architecture with ``params``) on the test images."""
    model = _model(kind).eval()
    params = {n: torch.as_tensor(v) for n, v in params.items()}
    hits = 0
    for lo in range(0, len(y_test), chunk):
        logits = functional_call(model, params, (torch.from_numpy(x_test[lo:lo + chunk]),))
        hits += int((logits.argmax(1) == torch.from_numpy(y_test[lo:lo + chunk])).sum())
    return hits / len(y_test)


# --- the two ebfl runners -----------------------------------------------------------

def _now():
    """(wall, CPU) clocks of this process, seconds."""
    return time.perf_counter(), time.process_time()


class TimedFedAvg(FedAvg):
    """FedAvg that reads the clocks at the first broadcast and after every aggregation.

    ``train`` may run a shallow copy of the strategy: the copy shares ``clock``.
    """

    def __init__(self, model, lr, clock):
        super().__init__(model, lr, weight_decay=0.0)
        self.clock = clock

    def broadcast(self, server, rc):
        if not self.clock:
            self.clock.append(_now())
        return super().broadcast(server, rc)

    def aggregate(self, server, replies, weights, rc):
        out = super().aggregate(server, replies, weights, rc)
        self.clock.append(_now())
        return out


class LoopFedAvg(TimedFedAvg):
    """The same FedAvg with the client half run one client at a time with autograd."""

    _net = None

    def client_train(self, message, client, data, rc):
        if self._net is None:  # one scratch module, reused as a framework reuses its model
            self._net = copy.deepcopy(self.model).train()
        net = self._net
        params = dict(net.named_parameters())
        glob = message["global"]
        gens = client_generators(rc.seeds())  # client j's stream, as in the engine
        k, steps, batch = len(rc.clients), rc.config.local_steps, rc.config.batch_size
        out = {n: torch.empty((k, *v.shape), dtype=v.dtype) for n, v in glob.items()}
        for j in range(k):
            one = data.subset([j])
            with torch.no_grad():
                for n, v in glob.items():
                    params[n].copy_(v)
            opt = torch.optim.SGD(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
            for step in range(steps):
                x, y = one.sample_batch(gens[j:j + 1], batch)
                opt.param_groups[0]["lr"] = self.lr * rc.lr_scale(step)
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(x[0]), y[0]).backward()
                opt.step()
            with torch.no_grad():
                for n in glob:
                    out[n][j] = params[n]
        return {"model": out}


def run_ebfl(kind, setting, data, init, rounds, seed, loop):
    """(round periods (R, 2): wall and CPU seconds, final global model) of one ebfl run."""
    clock = []
    cls = LoopFedAvg if loop else TimedFedAvg
    res = train(cls(_model(kind), setting["lr"], clock), data, n_rounds=rounds,
                **_train_kwargs(setting), eval_every=rounds, seed=seed, init_params=init)
    return np.diff(np.array(clock), axis=0), res.server["global"]


def _train_kwargs(setting):
    steps = setting["samples"] // setting["batch"]  # one local epoch
    return {"local_steps": steps, "clients_per_round": setting["per_round"],
            "batch_size": setting["batch"], "iters_per_epoch": steps, "lr_decay": 1.0}


def engine_schedule(data, setting, rounds, seed):
    """The engine's sampled clients (R, K) and each one's minibatch indices (R, K, steps
    x batch) per round: its own sampling code run on a dataset whose features are the
    sample indices (exact in float32 below 2^24 samples)."""
    m, n = data.x_train.shape[:2]
    ids = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None], (n, 1))
    index_data = FederatedDataset.from_clients([ids] * m, [np.zeros(n, np.int64)] * m,
                                               [ids[:1]] * m, [np.zeros(1, np.int64)] * m,
                                               n_classes=10)
    config = run_config(index_data, n_rounds=rounds, eval_every=rounds, seed=seed,
                        **_train_kwargs(setting))
    clients, idx = [], []
    for r in range(rounds):
        sampled = sample_clients(config, r)
        rc = RoundContext(config, r, sampled)
        gens, part = client_generators(rc.seeds()), index_data.subset(sampled)
        steps = [part.sample_batch(gens, config.batch_size)[0][..., 0]
                 for _ in range(config.local_steps)]
        clients.append(sampled)
        idx.append(torch.cat(steps, dim=1).long().numpy())
    return np.stack(clients), np.stack(idx)


# --- pfl ----------------------------------------------------------------------------

def _venv_python(venv):
    return Path(venv) / "bin" / "python"


def _pfl_versions(python):
    """(pfl version, torch version) importable by ``python``, or None."""
    if not python.is_file():
        return None
    probe = subprocess.run([str(python), "-c", "import pfl, torch; print(pfl.__version__, "
                            "torch.__version__)"], capture_output=True, text=True)
    return tuple(probe.stdout.split()) if probe.returncode == 0 else None


def ensure_pfl_venv(venv, log):
    """(python of a venv with pfl 0.6.0, None) or (None, why it could not be had).

    A venv that already has pfl 0.6.0 is reused. Otherwise it is made: a plain venv
    (not --system-site-packages: pfl's pins must not meet ebfl's environment), this
    process's torch version first (so that both sides run the same kernels; pfl's
    ``pytorch`` extra accepts it), then ``pfl[pytorch]==0.6.0``.
    """
    python = _venv_python(venv)
    found = _pfl_versions(python)
    if found is not None and found[0] == PFL_VERSION:
        return python, None
    torch_pin = torch.__version__.split("+")[0]
    log(f"making the pfl environment {venv} (torch=={torch_pin}, "
        f"pfl[pytorch]=={PFL_VERSION}; a minute or more)")
    t0 = time.perf_counter()
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--retries", "2",
              f"torch=={torch_pin}"],
             [str(python), "-m", "pip", "install", "-q", "--retries", "2",
              f"pfl[pytorch]=={PFL_VERSION}"]]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return None, f"`{' '.join(cmd[2:5])} ...` failed: {' | '.join(tail)}"
    found = _pfl_versions(python)
    if found is None or found[0] != PFL_VERSION:
        return None, f"{venv} has no pfl {PFL_VERSION} after installing (found {found})"
    log(f"pfl environment ready in {time.perf_counter() - t0:.0f} s ({found[0]}, torch "
        f"{found[1]})")
    return python, None


def write_pfl_input(path, kind, setting, x, y, init, x_check, rounds, seed, threads,
                    schedule):
    config = {"model": kind, "rounds": rounds, "clients_per_round": setting["per_round"],
              "batch": setting["batch"], "lr": setting["lr"], "seed": seed, "threads": threads,
              "same_batches": schedule is not None}
    arrays = {"x_train": x, "y_train": y, "x_check": x_check, "config": json.dumps(config)}
    arrays.update({f"init/{n}": v.numpy() for n, v in init.items()})
    if schedule is not None:
        arrays["schedule_clients"], arrays["schedule_idx"] = schedule
    np.savez(path, **arrays)


def run_pfl(python, src, dst, threads):
    """(round periods (R, 2): wall and CPU seconds, final global model, initial logits,
    versions)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([str(python), str(RUNNER), str(src), str(dst)], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the pfl runner failed:\n{done.stderr[-3000:]}")
    line = [s for s in done.stdout.splitlines() if s.startswith("{")][-1]
    info = json.loads(line)
    out = np.load(dst)
    final = {k[len("final/"):]: torch.from_numpy(out[k]) for k in out.files
             if k.startswith("final/")}
    return np.diff(np.array(info["marks"]), axis=0), final, out["init_logits"], info


# --- one workload -------------------------------------------------------------------

def _stats(periods, warmup):
    """Median, quartiles and extremes of the steady rounds of several runs."""
    steady = np.concatenate([p[warmup:] for p in periods])
    q1, med, q3 = np.percentile(steady, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "min": float(steady.min()),
            "max": float(steady.max()), "rounds": int(steady.size),
            "per_repeat_median": [float(np.median(p[warmup:])) for p in periods]}


def _max_diff(a, b):
    return max(float((torch.as_tensor(a[n]) - torch.as_tensor(b[n])).abs().max()) for n in a)


def one_workload(name, setting, args, python, log):
    kind = WORKLOADS[name]["model"]
    setting = {**setting, "batch": WORKLOADS[name]["batch"]}
    rounds, warmup, seed = args.rounds, args.warmup, args.seed
    x, y, x_test, y_test = mnist_split(setting["clients"], setting["samples"], seed)
    data = federated(x, y, x_test, y_test)
    init = initial_params(kind, seed)
    runners = [r for r in RUNNERS if r != "pfl" or python is not None]
    periods = {r: [] for r in runners}
    finals, extra = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_pfl_") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        if python is not None:
            schedule = (engine_schedule(data, setting, rounds, seed) if args.pfl_same_batches
                        else None)
            write_pfl_input(src, kind, setting, x, y, init, x_test[:32], rounds, seed,
                            args.threads, schedule)
        for rep in range(args.repeats):
            for r in runners:
                log(f"  {name}: repeat {rep + 1}/{args.repeats}, {r}")
                if r == "pfl":
                    p, final, logits, info = run_pfl(python, src, dst, args.threads)
                    gap = float(np.abs(logits - _logits(kind, init, x_test[:32])).max())
                    if not gap <= 1e-5:  # then pfl would train another network
                        raise RuntimeError(f"pfl's {kind} computes other logits than ebfl's "
                                           f"from the same weights (max difference {gap:g})")
                    extra = {"versions": {"pfl": info["pfl"], "torch": info["torch"]},
                             "threads": info["threads"], "init_logits_max_diff": gap}
                else:
                    p, final = run_ebfl(kind, setting, data, init, rounds, seed, r == "loop")
                periods[r].append(np.asarray(p))
                finals[r] = final
    steps = setting["samples"] // setting["batch"]
    result = {
        "workload": name, "model": WORKLOADS[name]["title"], "clients": setting["clients"],
        "samples_per_client": setting["samples"], "clients_per_round": setting["per_round"],
        "batch": setting["batch"], "local_steps": steps, "lr": setting["lr"],
        "rounds": rounds, "warmup": warmup, "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "seconds_per_round": {r: _stats([p[:, 0] for p in periods[r]], warmup)
                              if r in periods else None for r in RUNNERS},
        "cpu_seconds_per_round": {r: _stats([p[:, 1] for p in periods[r]], warmup)
                                  if r in periods else None for r in RUNNERS},
        "accuracy": {r: accuracy(kind, finals[r], x_test, y_test) if r in finals else None
                     for r in RUNNERS},
        "max_abs_diff_engine_loop": _max_diff(finals["engine"], finals["loop"]),
        "pfl": {"ran": python is not None, "same_batches": bool(args.pfl_same_batches),
                **extra},
    }
    for key, field in (("", "seconds_per_round"), ("cpu_", "cpu_seconds_per_round")):
        sec = {r: (v["median"] if v else None) for r, v in result[field].items()}
        result[f"{key}ratio_engine_over_loop"] = sec["engine"] / sec["loop"]
        result[f"{key}ratio_engine_over_pfl"] = (sec["engine"] / sec["pfl"] if sec["pfl"]
                                                 else None)
    if "pfl" in finals and args.pfl_same_batches:
        result["pfl"]["max_abs_diff_engine_pfl"] = _max_diff(finals["engine"], finals["pfl"])
    return result


@torch.no_grad()
def _logits(kind, params, x):
    return functional_call(_model(kind).eval(), params, (torch.from_numpy(x),)).numpy()


# --- output -------------------------------------------------------------------------

def _ratio(value):
    return "-" if value is None else f"{value:.2f}"


def _print(res):
    print(f"{res['model']}, FedAvg: {res['clients']} IID MNIST clients x "
          f"{res['samples_per_client']}, {res['clients_per_round']} a round, "
          f"{res['local_steps']} SGD steps of {res['batch']}, lr {res['lr']:g}; "
          f"{res['rounds']} rounds (first {res['warmup']} discarded) x {res['repeats']} "
          f"repeats, {res['threads']} torch thread(s)")
    print(f"  {'seconds per round':14}{'wall median':>13}  {'[q1, q3]':>15}  "
          f"{'CPU median':>10}  {'accuracy':>8}")
    labels = {"engine": "ebfl engine", "loop": "ebfl loop",
              "pfl": f"pfl {res['pfl'].get('versions', {}).get('pfl', PFL_VERSION)}"}
    for r in RUNNERS:
        s, c = res["seconds_per_round"][r], res["cpu_seconds_per_round"][r]
        if s is None:
            print(f"  {labels[r]:17}{'not run':>10}")
            continue
        print(f"  {labels[r]:17}{s['median']:10.3f}  [{s['q1']:.3f}, {s['q3']:.3f}]  "
              f"{c['median']:10.3f}  {res['accuracy'][r]:8.4f}")
    print(f"  engine / loop {_ratio(res['ratio_engine_over_loop'])} (CPU "
          f"{_ratio(res['cpu_ratio_engine_over_loop'])})   engine / pfl "
          f"{_ratio(res['ratio_engine_over_pfl'])} (CPU "
          f"{_ratio(res['cpu_ratio_engine_over_pfl'])})   max |engine - loop| "
          f"{res['max_abs_diff_engine_loop']:.2g}"
          + (f"   max |engine - pfl| {res['pfl']['max_abs_diff_engine_pfl']:.2g}"
             if "max_abs_diff_engine_pfl" in res["pfl"] else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["mlp", "cnn", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per run (default 30)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="first rounds of each run not counted (default 2)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of each runner, alternated (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="20 clients of 60 images, 4 a round, 3 rounds, 1 repeat")
    ap.add_argument("--no-pfl", action="store_true", help="run the two ebfl runners only")
    ap.add_argument("--pfl-venv", default=str(DEFAULT_VENV),
                    help=f"pfl's virtual environment, made if needed (default {DEFAULT_VENV})")
    ap.add_argument("--pfl-same-batches", action="store_true",
                    help="feed pfl the engine's clients and minibatches (a correctness check)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (3 if quick else 30)
    args.warmup = (1 if quick else 2) if args.warmup is None else args.warmup
    if args.repeats is None:
        args.repeats = 1 if quick else 3
    if not 0 <= args.warmup < args.rounds:
        ap.error("need 0 <= --warmup < --rounds")

    def log(msg):
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    python, why = (None, "--no-pfl") if args.no_pfl else ensure_pfl_venv(args.pfl_venv, log)
    if python is None and not args.no_pfl:
        log(f"pfl was not run: {why}")
    names = ["mlp", "cnn"] if args.workload == "both" else [args.workload]
    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            results = {n: one_workload(n, QUICK if quick else FULL, args, python, log)
                       for n in names}
    finally:
        torch.set_num_threads(previous)
    out = {"benchmark": "P9", "workloads": results, "pfl_ran": python is not None,
           "pfl_not_run_reason": why if python is None else None,
           "pfl_venv": None if python is None else str(args.pfl_venv)}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for res in results.values():
            _print(res)
    return out


if __name__ == "__main__":
    main()
