"""The FedHDP paper's experiments: Table 3 and the r-sweeps of Tables 8 and 9.

Protocol (Section 5 and Table 7 of "Federated learning with heterogeneous
differential privacy"), non-IID MNIST:

* 2,000 clients holding one digit each, 5 % non-private
  (:func:`ebfl.fedhdp.data.noniid_mnist`; the skewed variant draws
  the non-private clients from the clients holding a 7);
* the FC 784-50-10 network (Table 6);
* 500 rounds, 5 % of the clients per round (q = 0.05, Poisson sampling, so
  N^t varies as in Algorithm 2), 25 local epochs of batch 20 (each a pass of
  ceil(n_i / 20) minibatches, drawn with replacement), eta = eta_p = 0.5
  decayed by 0.9 every 50 rounds;
* adaptive clipping from S^0 = 0.5 with eta_b = 0.2 and kappa = 0.5, effective
  noise multiplier z = 1.5 for the private group, (3.6, 1e-4)-DP;
* the seven metrics of Section 5.2: Acc_g (the global model on the server's
  test set, the MNIST test set), Acc_g,p / Acc_g,np (the global model on the
  private / non-private clients' local test sets, averaged over clients) and
  Acc_l,p / Acc_l,np (the personalized models), with the gaps Delta_g, Delta_l;
  the paper's "variance across clients" is 100 x the variance of the
  per-client accuracies (as fractions), which reproduces its printed values.

The algorithms (all with Ditto personalization, :mod:`ebfl.fedhdp.algorithm`):
Non-private+Ditto, DP-FedAvg+Ditto (every client private), HDP-FedAvg+Ditto
(FedHDP with r = 1) and FedHDP with the ratio r.

Privacy: the (epsilon, delta) of each run comes from the accountant
(:func:`ebfl.privacy.accounting.dp_fedavg.dp_fedavg_epsilon`, Poisson-sampled Gaussian at
z = 1.5, q = 0.05, 500 rounds): 3.608 at delta = 1e-4, the paper's 3.6. The
paper's Algorithm 2 divides each group's noisy sum by the round's realized
count N_i^t, which depends on who took part; the accountant's epsilon is a
proof for the variant with expected counts (``denominator="expected"``), which
this module runs on request. Every run record and table row carries
``guarantee`` (``"proof"`` or ``"conditional"``), ``in_model`` and
``condition`` beside its epsilon (:func:`ebfl.privacy.accounting.guarantee.dp_fedavg_guarantee`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ebfl._validation import check_bool, check_choice, check_int_scalar
from ebfl.privacy.accounting.guarantee import DENOMINATORS, dp_fedavg_guarantee

__all__ = [
    "ALGORITHMS",
    "DATASETS",
    "fedhdp_metrics",
    "FedHDPRun",
    "load_federation",
    "make_algorithm",
    "MNIST_PROTOCOL",
    "plot_sweep",
    "PROTOCOLS",
    "reproduce_fedhdp",
    "run_fedhdp",
    "training_plan",
]

#: The paper's algorithms (the names of its tables).
ALGORITHMS = ("Non-Private+Ditto", "DP-FedAvg+Ditto", "HDP-FedAvg+Ditto", "FedHDP")
#: Datasets of ``reproduce_fedhdp``: the paper's dataset each is compared with, and the tables
#: of its Table-3 rows and of its r-sweep.
DATASETS = {"mnist": ("noniid_mnist", 3, 8), "mnist-skewed": ("skewed_noniid_mnist", 3, 9),
            "synthetic": ("noniid_mnist", 3, 8),
            "synthetic-skewed": ("skewed_noniid_mnist", 3, 9),
            "fashion-mnist": ("fmnist", 10, 10)}

#: Table 7 of the paper, non-IID MNIST (both variants).
MNIST_PROTOCOL = {"rounds": 500, "sampling_rate": 0.05, "batch_size": 20, "local_epochs": 25,
                  "lr": 0.5, "lr_decay": 0.9, "decay_every_rounds": 50, "clip": 0.5,
                  "clip_lr": 0.2, "target_quantile": 0.5, "noise_multiplier": 1.5,
                  "delta": 1e-4, "hidden": 50}
#: Table 7's "FMNIST" column (TFF's EMNIST digits), run by the Fashion-MNIST stand-in.
FMNIST_PROTOCOL = {**MNIST_PROTOCOL, "sampling_rate": 0.03, "local_epochs": 50, "lr": 0.01,
                   "lr_decay": 1.0, "noise_multiplier": 4.0}
#: The training protocol (a Table 7 column) used for each dataset of :data:`DATASETS`.
PROTOCOLS = {"mnist": MNIST_PROTOCOL, "mnist-skewed": MNIST_PROTOCOL,
             "synthetic": MNIST_PROTOCOL, "synthetic-skewed": MNIST_PROTOCOL,
             "fashion-mnist": FMNIST_PROTOCOL}
#: Table 3's rows: (algorithm, r, lambda); the paper's r grids of Tables 8 and 9.
TABLE3 = {"mnist": [("Non-Private+Ditto", None, 0.005), ("DP-FedAvg+Ditto", None, 0.005),
                    ("HDP-FedAvg+Ditto", None, 0.005), ("FedHDP", 0.01, 0.005)],
          "mnist-skewed": [("Non-Private+Ditto", None, 0.005), ("DP-FedAvg+Ditto", None, 0.005),
                           ("HDP-FedAvg+Ditto", None, 0.005), ("FedHDP", 0.1, 0.005),
                           ("FedHDP", 0.9, 0.005)]}
TABLE3["synthetic"], TABLE3["synthetic-skewed"] = TABLE3["mnist"], TABLE3["mnist-skewed"]
#: The stand-in's rows: Table 10's at lambda = 0.05 (Table 4 mixes two lambdas in one row).
TABLE3["fashion-mnist"] = [(a, None, 0.05) for a in ALGORITHMS[:3]] + [("FedHDP", 0.01, 0.05)]
R_GRID = {"mnist": (0.0, 0.001, 0.01, 0.025, 0.1),
          "mnist-skewed": (0.0, 0.025, 0.1, 0.5, 0.75, 0.9),
          "fashion-mnist": (0.0, 0.01, 0.025, 0.05, 0.1, 0.5)}
R_GRID["synthetic"], R_GRID["synthetic-skewed"] = R_GRID["mnist"], R_GRID["mnist-skewed"]
#: ``quick``: a few rounds on few clients, to check the pipeline end to end (minutes on a laptop
#: would not fit the test suite).
QUICK = {"n_clients": 200, "rounds": 12, "local_epochs": 2, "sampling_rate": 0.1}

METRICS = ("acc_g", "acc_g_p", "acc_g_p_var", "acc_g_np", "acc_g_np_var", "delta_g",
           "acc_l_p", "acc_l_p_var", "acc_l_np", "acc_l_np_var", "delta_l")


@dataclass
class FedHDPRun:
    """One run: the algorithm's settings, the seven metrics, privacy and time.

    Attributes
    ----------
    algorithm : str
    r : float or None
    lam : float
    metrics : dict
        ``acc_g``, ``acc_g_p``, ``acc_g_np``, ``acc_l_p``, ``acc_l_np`` (%), their
        ``*_var`` (100 x the variance across clients of the accuracy as a
        fraction) and ``delta_g``, ``delta_l``; NaN where a group has no
        metric (the non-private baseline has no private clients).
    epsilon : float
        The private group's epsilon (inf when nothing is private).
    seconds : float
    history : list of dict
    privacy : dict
        What ``epsilon`` is a proof for: ``sampling``, ``denominator``,
        ``neighboring_relation``, ``accountant_model``, ``in_model``,
        ``guarantee`` (``"proof"`` or ``"conditional"``) and ``condition``
        (:func:`ebfl.privacy.accounting.guarantee.dp_fedavg_guarantee`).
    """

    algorithm: str
    r: float | None
    lam: float
    seed: int
    metrics: dict
    epsilon: float
    seconds: float
    history: list = field(default_factory=list)
    privacy: dict = field(default_factory=dict)

    def to_dict(self):
        """The metrics, the epsilon with its conditions (no model text), and the time."""
        terms = {k: v for k, v in self.privacy.items() if k != "accountant_model"}
        return {"algorithm": self.algorithm, "r": self.r, "lambda": self.lam, "seed": self.seed,
                **self.metrics, "epsilon": self.epsilon, **terms, "seconds": self.seconds}


def _mean_var(acc):
    """Mean accuracy in % and the paper's "variance across clients": 100 x var of fractions."""
    acc = np.asarray(acc, dtype=np.float64)
    if acc.size == 0:
        return math.nan, math.nan
    return 100.0 * float(acc.mean()), 100.0 * float(acc.var())


def fedhdp_metrics(global_acc_server, global_acc, personal_acc, groups, *, all_private=False,
                   all_nonprivate=False):
    """The seven metrics of Section 5.2 from per-client accuracies.

    Parameters
    ----------
    global_acc_server : float
        The global model's accuracy on the server's test set (a fraction).
    global_acc, personal_acc : array_like (m,)
        Each client's accuracy on its local test set with the global model and
        with its personalized model (fractions).
    groups : array_like of int (m,)
        0 = non-private, 1 = private.
    all_private, all_nonprivate : bool
        DP-FedAvg+Ditto treats every client as private, Non-private+Ditto every
        client as non-private (the paper reports them so).

    Returns
    -------
    dict
        See :class:`FedHDPRun`.
    """
    groups = np.asarray(groups)
    g, p = np.asarray(global_acc, float), np.asarray(personal_acc, float)
    private = np.ones(groups.size, bool) if all_private else groups == 1
    if all_nonprivate:
        private = np.zeros(groups.size, bool)
    out = {"acc_g": 100.0 * float(global_acc_server)}
    out["acc_g_p"], out["acc_g_p_var"] = _mean_var(g[private])
    out["acc_g_np"], out["acc_g_np_var"] = _mean_var(g[~private])
    out["acc_l_p"], out["acc_l_p_var"] = _mean_var(p[private])
    out["acc_l_np"], out["acc_l_np_var"] = _mean_var(p[~private])
    out["delta_g"] = out["acc_g_np"] - out["acc_g_p"]
    out["delta_l"] = out["acc_l_np"] - out["acc_l_p"]
    return out


def make_algorithm(name, fed, *, r=None, lam=0.005, protocol=MNIST_PROTOCOL,
                   denominator="realized"):
    """The strategy of one of :data:`ALGORITHMS` on the federation ``fed``."""
    from ebfl.fedhdp import algorithm as f
    from ebfl.learning.torch import MLP

    n_features = int(np.prod(fed.data.x_train.shape[2:]))
    model = MLP(n_features, fed.data.n_classes, hidden=(protocol["hidden"],))
    z = protocol["noise_multiplier"]
    common = dict(lr=protocol["lr"], lam=lam, weight_decay=0.0)
    dp = dict(clip=protocol["clip"], clip_lr=protocol["clip_lr"],
              target_quantile=protocol["target_quantile"], denominator=denominator,
              count_noise=protocol.get("count_noise"))
    if name == "Non-Private+Ditto":
        return f.non_private_ditto(model, fed.n_clients, **common)
    if name == "DP-FedAvg+Ditto":
        return f.dp_fedavg_ditto(model, fed.n_clients, noise_multiplier=z, **common, **dp)
    if name == "HDP-FedAvg+Ditto":
        return f.hdp_fedavg_ditto(model, fed.groups, noise_multiplier=[0.0, z], **common, **dp)
    if name == "FedHDP":
        if r is None:
            raise ValueError("FedHDP needs a ratio r")
        return f.FedHDP(model, fed.groups, ratio=r, noise_multiplier=[0.0, z], **common, **dp)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {name!r}")


def training_plan(fed, protocol=MNIST_PROTOCOL, *, n_rounds=None, local_epochs=None,
                  sampling_rate=None, clients_per_round=None, local_steps=None):
    """How a run of ``protocol`` trains on ``fed``: what :func:`run_fedhdp` passes to
    training, and what the Flower job ``fedhdp`` on ``mnist`` runs
    (:func:`ebfl.flower.jobs.build_job`), so that both run the same protocol.

    Parameters
    ----------
    fed : FedHDPData
    protocol : dict
        :data:`MNIST_PROTOCOL` or a variant (not modified).
    n_rounds, local_epochs, sampling_rate : optional
        Override the protocol's ``rounds``, ``local_epochs`` and ``sampling_rate``.
    clients_per_round : int, optional
        K, the expected clients per round, instead of
        ``max(1, round(sampling_rate x m))``.
    local_steps : int, optional
        Local iterations per round instead of ``local_epochs`` x ceil(mean
        training size / ``batch_size``) (an epoch: one pass of minibatches).

    Returns
    -------
    dict
        ``protocol`` (a copy with the overrides and ``count_noise``, sigma_b, set
        where it was not: max(K / 20, z)), ``clients_per_round`` (K),
        ``local_steps`` and ``iters_per_epoch`` (the learning rate decays by
        ``lr_decay`` every ``decay_every_rounds`` rounds).
    """
    p = dict(protocol)
    for key, value in (("rounds", n_rounds), ("local_epochs", local_epochs),
                       ("sampling_rate", sampling_rate)):
        if value is not None:
            p[key] = value
    k = max(1, round(p["sampling_rate"] * fed.n_clients)) if clients_per_round is None \
        else int(clients_per_round)
    # sigma_b: Andrew et al.'s K / 20, raised to z where that would leave the update no
    # budget (2 sigma_b <= z; with sigma_b = z the update's multiplier is 1.15 z)
    p.setdefault("count_noise", max(k / 20, p["noise_multiplier"]))
    if local_steps is None:
        n_mean = float(fed.data.n_train.float().mean())
        local_steps = p["local_epochs"] * math.ceil(n_mean / p["batch_size"])
    return {"protocol": p, "clients_per_round": k, "local_steps": int(local_steps),
            "iters_per_epoch": p["decay_every_rounds"] * int(local_steps)}


def run_fedhdp(fed, algorithm, *, r=None, lam=0.005, protocol=MNIST_PROTOCOL, n_rounds=None,
               local_epochs=None, sampling_rate=None, seed=0, denominator="realized",
               eval_every=None, checkpoint=None, progress=False, device=None):
    """Train one algorithm on ``fed`` and measure the seven metrics.

    Parameters
    ----------
    fed : FedHDPData
    algorithm : str
        One of :data:`ALGORITHMS`.
    r : float, optional
        FedHDP's ratio.
    lam : float
        lambda_p = lambda_np.
    protocol : dict
        :data:`MNIST_PROTOCOL` or a variant; ``n_rounds``, ``local_epochs`` and
        ``sampling_rate`` override its values.
    seed : int
    denominator : {"realized", "expected"}
    eval_every : int, optional
        History every this many rounds (default: rounds / 10).
    checkpoint : path-like, optional
        Resume from / save to this file.
    progress : bool
    device : None, str or torch.device
        Where the model trains and is evaluated: "cpu" (None), "cuda" or
        "cuda:N" (see :func:`ebfl.learning.torch.train`; the same random
        numbers on every device).

    Returns
    -------
    FedHDPRun
    """
    import torch

    from ebfl.learning.torch import train
    from ebfl.learning.torch.functional import check_device, client_forward

    algorithm = check_choice(algorithm, "algorithm", ALGORITHMS)
    denominator = check_choice(denominator, "denominator", DENOMINATORS)
    device = check_device(device)
    plan = training_plan(fed, protocol, n_rounds=n_rounds, local_epochs=local_epochs,
                         sampling_rate=sampling_rate)
    p, k = plan["protocol"], plan["clients_per_round"]
    alg = make_algorithm(algorithm, fed, r=r, lam=lam, protocol=p, denominator=denominator)
    eval_every = eval_every or max(1, p["rounds"] // 10)
    t0 = time.perf_counter()
    res = train(alg, fed.data, n_rounds=p["rounds"], local_steps=plan["local_steps"],
                clients_per_round=k, batch_size=p["batch_size"],
                iters_per_epoch=plan["iters_per_epoch"], lr_decay=p["lr_decay"],
                eval_every=eval_every, seed=seed, checkpoint=checkpoint, progress=progress,
                sampling="poisson", device=device)
    alg = alg.to(device)  # the evaluation runs where the training ran
    server, clients = alg.restore_state(res.server), alg.restore_state(res.clients)
    x = torch.from_numpy(np.array(fed.x_server_test)).to(device)  # a writable copy
    with torch.no_grad():
        logits = client_forward(alg.model, {n: v[None] for n, v in server["global"].items()},
                                x[None])[0]
    server_acc = float((logits.argmax(-1).cpu().numpy()
                        == np.asarray(fed.y_server_test)).mean())
    everyone = fed.data.to(device).subset(np.arange(fed.n_clients))
    out = alg.client_evaluate(alg.evaluation_message(server), clients, everyone)
    metrics = fedhdp_metrics(server_acc, out["global_accuracy"].cpu().numpy(),
                             out["accuracy"].cpu().numpy(), fed.groups,
                             all_private=algorithm == "DP-FedAvg+Ditto",
                             all_nonprivate=algorithm == "Non-Private+Ditto")
    epsilon = math.inf
    if algorithm != "Non-Private+Ditto":
        from ebfl.privacy.accounting.dp_fedavg import dp_fedavg_epsilon

        epsilon = float(dp_fedavg_epsilon(sampling_rate=k / fed.n_clients,
                                          noise_multiplier=p["noise_multiplier"],
                                          n_rounds=p["rounds"], delta=p["delta"]).epsilon)
    # the run samples by Poisson (train above); whether it divides by the expected count
    # decides whether the epsilon is a proof for it
    terms = dp_fedavg_guarantee(sampling="poisson", denominator=alg.denominator)
    return FedHDPRun(algorithm, r, lam, seed, metrics, epsilon, time.perf_counter() - t0,
                     res.history, terms)


def load_federation(dataset, *, quick=False, seed=0, directory=None, download=True,
                    n_clients=None, nonprivate_fraction=0.05):
    """The federation of ``dataset`` (see :data:`DATASETS`).

    ``n_clients``: default 2,000, or 200 with ``quick``; ``nonprivate_fraction``:
    the share of non-private clients (the paper's 5 %). The other arguments as in
    :func:`ebfl.fedhdp.data.noniid_mnist`.
    """
    from ebfl.fedhdp import data as fd

    dataset = check_choice(dataset, "dataset", tuple(DATASETS))
    skewed = dataset.endswith("skewed")
    n = (QUICK["n_clients"] if quick else 2000) if n_clients is None else n_clients
    if dataset.startswith("synthetic"):
        return fd.synthetic_noniid_mnist(n_clients=n, skewed=skewed, seed=seed,
                                         nonprivate_fraction=nonprivate_fraction)
    source = "fashion-mnist" if dataset == "fashion-mnist" else "mnist"
    return fd.noniid_mnist(n_clients=n, skewed=skewed, seed=seed, directory=directory,
                           download=download, source=source,
                           nonprivate_fraction=nonprivate_fraction)


def reproduce_fedhdp(dataset="mnist", *, table="3", lam=0.005, ratios=None, seeds=(0,),
                     quick=False, n_rounds=None, denominator="realized", checkpoint_dir=None,
                     directory=None, download=True, progress=False, device=None):
    """Table 3 (``table="3"``) or an r-sweep as in Tables 8-9 (``table="sweep"``), beside
    the paper's numbers.

    Parameters
    ----------
    dataset : {"mnist", "mnist-skewed", "fashion-mnist", "synthetic", "synthetic-skewed"}
        Non-IID MNIST (or its skewed variant); "fashion-mnist": a labelled
        stand-in for the paper's "FMNIST" (TFF's federated EMNIST digits, not
        available offline): the non-IID construction on Fashion-MNIST, run with
        Table 7's FMNIST column (q = 0.03, z = 4, 50 local epochs, lr 0.01,
        (0.6, 1e-4)-DP), beside Table 10; "synthetic*": the same structure on
        random images, no download (a pipeline check, not a reproduction).
    table : {"3", "sweep"}
        "3": Table 3's rows; "sweep": the three baselines and FedHDP at every r
        of ``ratios`` (default: the paper's grid) at lambda ``lam``.
    lam : float
        lambda_p = lambda_np of the sweep (0.005, 0.05 or 0.25 in the paper).
    seeds : sequence of int
        One run per seed (the federation is built once, from seed 0, as the
        paper's non-private clients are chosen once).
    quick : bool
        200 clients, 12 rounds of 2 local epochs, q = 0.1: minutes become seconds.
    n_rounds : int, optional
        Override the 500 rounds.
    denominator : {"realized", "expected"}
    checkpoint_dir : path-like, optional
        One checkpoint per run: an interrupted reproduction resumes (on any device).
    device : None, str or torch.device
        Where the models train (see :func:`run_fedhdp`).

    Returns
    -------
    dict
        ``rows`` (ours, mean and sd over seeds, beside the paper's values,
        with ``epsilon`` and its ``guarantee``, ``in_model``, ``condition``),
        ``runs`` (every run), ``privacy`` (what the epsilon is a proof for:
        ``guarantee="conditional"`` for ``denominator="realized"``),
        ``federation``, ``protocol``, ``seconds``.
    """
    from pathlib import Path

    from ebfl.fedhdp.data import fedhdp_paper_numbers
    from ebfl.learning.torch.functional import check_device

    dataset = check_choice(dataset, "dataset", tuple(DATASETS))
    device = check_device(device)  # before any data is loaded
    table = check_choice(str(table), "table", ("3", "sweep"))
    denominator = check_choice(denominator, "denominator", DENOMINATORS)
    quick = check_bool(quick, "quick")
    seeds = [check_int_scalar(s, "seeds", minimum=0) for s in np.atleast_1d(seeds).tolist()]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if table == "3":
        cases = TABLE3[dataset]
    else:
        grid = R_GRID[dataset] if ratios is None else [float(r) for r in ratios]
        cases = [(a, None, lam) for a in ALGORITHMS[:3]] + [("FedHDP", r, lam) for r in grid]
    protocol = dict(PROTOCOLS[dataset])
    overrides = {}
    if quick:
        overrides = {k: QUICK[k] for k in ("rounds", "local_epochs", "sampling_rate")}
    if n_rounds is not None:
        overrides["rounds"] = check_int_scalar(n_rounds, "n_rounds", minimum=1)
    protocol.update(overrides)
    t0 = time.perf_counter()
    fed = load_federation(dataset, quick=quick, directory=directory, download=download)
    runs = []
    for algorithm, r, lam_ in cases:
        for seed in seeds:
            ckpt = None
            if checkpoint_dir is not None:
                tag = f"{dataset}-{algorithm}-r{r}-lam{lam_}-seed{seed}-{protocol['rounds']}"
                ckpt = Path(checkpoint_dir) / (tag.replace("+", "_") + ".pt")
            runs.append(run_fedhdp(fed, algorithm, r=r, lam=lam_, protocol=protocol, seed=seed,
                                   denominator=denominator, checkpoint=ckpt, progress=progress,
                                   device=device))
    paper_name, table3, sweep_table = DATASETS[dataset]
    paper = fedhdp_paper_numbers(table3 if table == "3" else sweep_table)
    paper = paper[paper["dataset"] == paper_name]
    rows = []
    for algorithm, r, lam_ in cases:
        mine = [x for x in runs if x.algorithm == algorithm and x.r == r and x.lam == lam_]
        row = {"algorithm": algorithm, "r": r, "lambda": lam_, "n_seeds": len(mine)}
        for key in METRICS:
            values = np.array([x.metrics[key] for x in mine])
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if values.size > 1 else math.nan
        row["epsilon"] = mine[0].epsilon
        row.update({k: mine[0].privacy[k] for k in ("in_model", "guarantee", "condition")})
        row["seconds"] = float(sum(x.seconds for x in mine))
        row["paper"] = _paper_row(paper, algorithm, r, lam_)
        rows.append(row)
    return {"dataset": dataset, "table": table, "quick": quick, "seeds": seeds,
            "protocol": protocol, "denominator": denominator,
            "privacy": dp_fedavg_guarantee(sampling="poisson", denominator=denominator),
            "federation": fed.to_dict(),
            "rows": rows, "runs": [x.to_dict() for x in runs],
            "seconds": time.perf_counter() - t0}


def _paper_row(paper, algorithm, r, lam):
    """The paper's row for (algorithm, r, lambda), as a dict of its metrics (None if absent)."""
    rows = paper[paper["algorithm"].str.lower() == algorithm.lower()]
    if r is not None:
        rows = rows[np.isclose(rows["r"].astype(float), r)]
    lam_col = rows["lambda_np"].where(rows["lambda_np"].notna(), rows["lambda_p"])
    rows = rows[np.isclose(lam_col.astype(float), lam)]
    if rows.empty:
        return None
    rec = rows.iloc[0]
    return {k: (None if (v := rec.get(k)) is None or (isinstance(v, float) and math.isnan(v))
                else float(v)) for k in METRICS}


def plot_sweep(result, path):
    """Accuracy against r (FedHDP) with the baselines as lines, ours beside the paper's.

    Parameters
    ----------
    result : dict
        From ``reproduce_fedhdp(..., table="sweep")``.
    path : path-like
        The PNG to write.

    Returns
    -------
    str
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    sweep = [x for x in rows if x["algorithm"] == "FedHDP"]
    xs = [max(x["r"], 1e-4) for x in sweep]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("acc_g", "Acc_g: global model, server test set"),
              ("acc_g_np", "Acc_g,np / Acc_g,p: global model, clients"),
              ("acc_l_p", "Acc_l,p / Acc_l,np: personalized models"))
    pairs = {"acc_g": ("acc_g",), "acc_g_np": ("acc_g_np", "acc_g_p"),
             "acc_l_p": ("acc_l_p", "acc_l_np")}
    colors = {"acc_g": "C0", "acc_g_np": "C1", "acc_g_p": "C0", "acc_l_p": "C0",
              "acc_l_np": "C1"}
    for ax, (key, title) in zip(axes, panels, strict=True):
        for metric in pairs[key]:
            c = colors[metric]
            ax.plot(xs, [x[metric] for x in sweep], "o-", color=c, label=f"ours {metric}")
            paper = [(xx, x["paper"][metric]) for xx, x in zip(xs, sweep, strict=True)
                     if x["paper"] and x["paper"].get(metric) is not None]
            if paper:
                ax.plot(*zip(*paper, strict=True), "x--", color=c, alpha=0.7,
                        label=f"paper {metric}")
        for base, style in (("DP-FedAvg+Ditto", ":"), ("HDP-FedAvg+Ditto", "-."),
                            ("Non-Private+Ditto", "--")):
            for x in rows:
                v = x.get(pairs[key][0])
                if x["algorithm"] == base and v is not None and np.isfinite(v):
                    ax.axhline(v, ls=style, color="gray", lw=1, label=f"ours {base}")
        ax.set_xscale("log")
        ax.set_xlabel("r (r = 0 drawn at 1e-4)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle(f"FedHDP on {result['dataset']} (lambda = {sweep[0]['lambda'] if sweep else ''}"
                 f", {result['protocol']['rounds']} rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
