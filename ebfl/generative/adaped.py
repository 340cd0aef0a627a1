"""Table 1 of the paper (E4): AdaPeD against personalized-FL baselines, and its stand-ins.

Datasets (clients, model):

* ``mnist``: the paper's setting. The 70,000 MNIST images are split
  pathologically, 50 clients with 3 classes each
  (:func:`ebfl.learning.partition.pathological`), then 80/20 into train and
  test inside each client, stratified by its labels. The 5-layer CNN.
* ``femnist``: LEAF FEMNIST (not shipped; pass its root), 198 writers in 66
  clients of 3 (:func:`ebfl.datasets.femnist_clients`), digits only since the
  paper's CNN has 10 outputs; pixels inverted to MNIST's ink-is-high. The CNN.
* ``fashion-mnist``: a stand-in with the MNIST protocol on Fashion-MNIST.
* ``hapt``: a natural-client stand-in: 30 smartphone users, the 72 HAR window
  features (:func:`ebfl.datasets.hapt_windows`), 6 activities, first protocol
  run trains (:func:`ebfl.datasets.split_first_run`); an MLP.

Protocol (Section 4.1): tau = 10 local iterations per round, 60 iterations per
epoch (the batch is the mean client training size / 60), 50 epochs (MNIST;
40 for FEMNIST at sampling ratio 0.33), sampling ratio 0.1 (K = 5 of 50),
learning rates x0.99 per epoch, weight decay 1e-4. AdaPeD uses the paper's
eta1 = eta2 = 0.1, eta3 = 3e-2, psi0 = 4; the baselines use the
hyperparameters of Section 4.1's table where it gives them and learning rate 0.1
otherwise; ``lr_grid`` chooses each method's rate on a validation split instead, as
the paper did over :data:`PAPER_LR_GRID`.
"""

from __future__ import annotations

import functools
import math
import numbers
import os

import numpy as np

from ebfl._paths import paper_numbers
from ebfl._validation import (
    check_bool,
    check_choice,
    check_int_scalar,
    check_names,
    check_positive_scalar,
    check_real_scalar,
)

__all__ = ["DATASETS", "METHODS", "PAPER_LR_GRID", "QUICK_ROUNDS", "QUICK_ROUNDS_ALL_CLIENTS",
           "VALIDATION_FRACTION", "dp_sweep",
           "fedem_comparison", "load_clients", "plot_dp_sweep", "plot_fedem_comparison",
           "plot_table1", "table1"]

#: The datasets of :func:`table1` (described in the module docstring).
DATASETS = ("mnist", "femnist", "fashion-mnist", "hapt")
PROTOCOL = {"mnist": dict(n_clients=50, ratio=0.1, epochs=50),
            "fashion-mnist": dict(n_clients=50, ratio=0.1, epochs=50),
            "femnist": dict(n_clients=66, ratio=0.33, epochs=40),
            "hapt": dict(n_clients=30, ratio=0.33, epochs=50)}
PAPER_COLUMN = {"mnist": "mnist", "femnist": "femnist_033"}
TAU, ITERS_PER_EPOCH = 10, 60
#: The learning rates the paper tuned every method over (Section 4.1).
PAPER_LR_GRID = (0.2, 0.15, 0.125, 0.1, 0.075, 0.05)
#: Share of each client's training images a learning rate is chosen on.
VALIDATION_FRACTION = 0.2


#: Rounds of a quick run (a pipeline check: Table 1's eleven methods on MNIST in 1-1.5 min
#: on two idle cores), and of a quick run in which every client trains every round (E7:
#: five times the clients of a sampled round, so fewer rounds for the same time).
QUICK_ROUNDS, QUICK_ROUNDS_ALL_CLIENTS = 8, 2


def _rounds(proto, quick, *, all_clients=False):
    """Rounds of a run: the protocol's epochs of 60 iterations, or a quick run's."""
    if quick:
        return QUICK_ROUNDS_ALL_CLIENTS if all_clients else QUICK_ROUNDS
    return proto["epochs"] * ITERS_PER_EPOCH // TAU


def _methods():
    """``name -> (factory(model, **rates), the rate arguments a tuned learning rate sets)``.

    The factories keep the rates of the module docstring unless given; the paper's
    grid search sets one "learning rate" per method, which is the step of the model
    the method trains (both for AdaPeD's eta1 = eta2 and QuPeD's two models).
    """
    from ebfl.generative.algorithm import AdaPeD
    from ebfl.learning.torch import FedAvg, Local
    from ebfl.learning.torch import baselines as b

    return {
        "AdaPeD": (lambda model, **kw: AdaPeD(model, **kw), ("lr_theta", "lr_mu")),
        "AdaPeD-FT": (lambda model, **kw: AdaPeD(model, fine_tune=True, **kw),
                      ("lr_theta", "lr_mu")),
        "FedAvg": (lambda model, **kw: FedAvg(model, **kw), ("lr",)),
        "FedAvg+FT": (lambda model, **kw: b.FedAvgFT(model, finetune_batch=32, **kw),
                      ("lr",)),
        "pFedMe": (lambda model, **kw: b.PFedMe(model, **kw), ("lr",)),
        "Per-FedAvg": (lambda model, **kw: b.PerFedAvg(model, adapt_batch=32, **kw), ("lr",)),
        "QuPeD-FP": (lambda model, **kw: b.QuPeDFP(model, **kw), ("lr_theta", "lr_global")),
        "FML": (lambda model, **kw: b.FML(model, **kw), ("lr",)),
        "Ditto": (lambda model, **kw: b.Ditto(model, **kw), ("lr",)),
        "FedEM": (lambda model, **kw: b.FedEM(model, **kw), ("lr",)),
        "Local": (lambda model, **kw: Local(model, **kw), ("lr",)),
    }


def _strategy(registry, name, model, lr=None):
    """Method ``name`` on ``model``, with its tuned rate(s) set to ``lr`` when given."""
    factory, rates = registry[name]
    return factory(model, **({} if lr is None else dict.fromkeys(rates, lr)))


#: The methods of Table 1, in its order (the default of :func:`table1`).
METHODS = ("AdaPeD", "AdaPeD-FT", "FedAvg", "FedAvg+FT", "pFedMe", "Per-FedAvg", "QuPeD-FP",
           "FML", "Ditto", "FedEM", "Local")


@functools.lru_cache(maxsize=2)
def _images(dataset):
    """All 70,000 images (float32 in [0, 1]) and labels, read once per process (read-only)."""
    from ebfl.datasets import load_fashion_mnist, load_mnist

    load = load_mnist if dataset == "mnist" else load_fashion_mnist
    tr, te = load("train"), load("test")
    x = np.concatenate([tr.images, te.images]).astype(np.float32) / 255.0
    y = np.concatenate([tr.labels, te.labels]).astype(np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_clients(dataset, *, seed=0, femnist_root=None, test_fraction=0.2,
                 classes_per_client=3, samples_per_client=None, validation=False):
    """The federated dataset and a model factory for ``dataset`` (see the module docstring).

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS`.
    seed : int
        The client split's seed.
    femnist_root : path-like, optional
        LEAF FEMNIST directory.
    test_fraction : float
        Share of each client's images held out for testing, in (0, 1) (MNIST-like
        datasets).
    classes_per_client : int
        Classes of each client's images, 1 to 10 (MNIST-like datasets; the paper: 3).
    samples_per_client : int, optional
        Keep this many (2 to 70,000) of each client's training images, drawn
        stratified by its classes (all it has if fewer); None keeps all (about
        1,100 with 50 clients of 3 classes). The test images are not affected.
        MNIST-like datasets only: the paper does not state this number.
    validation : bool
        Hold out :data:`VALIDATION_FRACTION` of each client's (kept) training images
        and return them in place of the test set: the data to choose a learning rate
        on. The same seed gives the same training images with and without it, so a
        rate chosen on the validation split is then used on the full training set.

    Returns
    -------
    data : FederatedDataset
    make_model : callable
        ``make_model() -> nn.Module``.
    info : dict
        How the clients were formed.
    """
    from ebfl.learning.torch import CNN5, MLP, FederatedDataset

    _dataset_iv(dataset)
    seed = _seed_iv(seed)
    test_fraction = check_real_scalar(test_fraction, "test_fraction", low=0.0, high=1.0,
                                      low_open=True, high_open=True)
    classes_per_client, samples_per_client = _protocol_iv(dataset, classes_per_client,
                                                          samples_per_client)
    validation = check_bool(validation, "validation")
    _root_iv(femnist_root)
    rng = np.random.default_rng(seed)
    if dataset in ("mnist", "fashion-mnist"):
        x, y = _images(dataset)
        train, test = _mnist_split(y, PROTOCOL[dataset]["n_clients"], classes_per_client,
                                   samples_per_client, test_fraction, validation, rng)
        data = FederatedDataset.from_clients([x[i] for i in train], [y[i] for i in train],
                                             [x[i] for i in test], [y[i] for i in test],
                                             n_classes=10)
        kept = "all" if samples_per_client is None else f"at most {samples_per_client}"
        info = {"clients": len(train),
                "split": f"pathological, {classes_per_client} classes per client; "
                f"{1 - test_fraction:.0%}/{test_fraction:.0%} stratified per client; "
                f"{kept} training images per client"
                + (f"; validation: {VALIDATION_FRACTION:.0%} of them" if validation else ""),
                "classes_per_client": classes_per_client,
                "samples_per_client": samples_per_client,
                "train_sizes": [int(len(i)) for i in train]}
        return data, CNN5, info
    if validation:
        raise ValueError(f"validation is available for mnist and fashion-mnist, not {dataset!r}")
    if dataset == "femnist":
        from ebfl.datasets import femnist_clients, load_leaf_femnist

        cl = femnist_clients(load_leaf_femnist(femnist_root, "train"),
                             load_leaf_femnist(femnist_root, "test"), rng=rng)
        data = FederatedDataset.from_clients([1 - x for x in cl.x_train], cl.y_train,
                                             [1 - x for x in cl.x_test], cl.y_test,
                                             n_classes=cl.n_classes)
        return data, CNN5, {"clients": cl.n_clients, "split": "3 writers per client (LEAF)"}
    from ebfl.datasets import hapt_windows, standardized_clients

    users, (xtr, ytr), (xte, yte) = standardized_clients(hapt_windows(), np.float32)
    data = FederatedDataset.from_clients(xtr, [y - 1 for y in ytr], xte, [y - 1 for y in yte],
                                         n_classes=6)
    return data, (lambda: MLP(xtr[0].shape[1], 6, hidden=(64,))), {
        "clients": len(users), "split": "subjects; first complete protocol run trains"}


def at_grid_edge(lr, grid):
    """Whether ``lr`` is the smallest or the largest rate of ``grid``: a rate chosen there
    may be beaten by one outside the grid (``False`` for a one-rate grid: nothing was
    chosen)."""
    return len(set(grid)) > 1 and lr in (min(grid), max(grid))


def _train_table1(registry, make_model, name, clients, lr, every, *, n_rounds, k, seed, progress,
                  device):
    """One Table 1 run of method ``name`` (rate ``lr``, or its default when None)."""
    from ebfl.learning.torch import train

    return train(_strategy(registry, name, make_model(), lr), clients, n_rounds=n_rounds,
                 local_steps=TAU, clients_per_round=k, iters_per_epoch=ITERS_PER_EPOCH,
                 eval_every=every, seed=seed, progress=progress, device=device)


def _mnist_split(y, n_clients, classes, samples, test_fraction, validation, rng):
    """Per-client (train, test) indices: pathological classes, then test, then the kept
    training images, then (``validation``) the validation split of those, in that order
    so that one seed gives the same training images with and without validation."""
    from ebfl.learning.partition import pathological, train_test_split_per_client

    parts = pathological(y, n_clients, classes, rng=rng)
    train, test = train_test_split_per_client(y, parts, test_fraction, rng=rng)
    if samples is not None:
        # Dropping n_i - N of a client's n_i images, stratified like a test split.
        train = [idx if len(idx) <= samples else
                 train_test_split_per_client(y, [idx], 1 - samples / len(idx), rng=rng)[0][0]
                 for idx in train]
    if validation:
        train, test = train_test_split_per_client(y, train, VALIDATION_FRACTION, rng=rng)
    return train, test


def _protocol_iv(dataset, classes_per_client, samples_per_client):
    classes_per_client = check_int_scalar(classes_per_client, "classes_per_client",
                                          minimum=1, maximum=10)
    if samples_per_client is not None:
        # MNIST and Fashion-MNIST hold 70,000 images in all: a larger "at most" is a typo.
        samples_per_client = check_int_scalar(samples_per_client, "samples_per_client",
                                              minimum=2, maximum=70_000)
    if dataset not in ("mnist", "fashion-mnist") and (
            classes_per_client != 3 or samples_per_client is not None):
        raise ValueError("classes_per_client and samples_per_client apply to mnist and "
                         f"fashion-mnist, not {dataset!r}")
    return classes_per_client, samples_per_client


def table1(dataset="mnist", *, methods=METHODS, seeds=(0,), quick=False, femnist_root=None,
           progress=False, eval_every=None, device=None, classes_per_client=3,
           samples_per_client=None, lr_grid=None):
    """Train every method on ``dataset``; per-method accuracy (mean, sd over seeds).

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS`.
    methods : sequence of str
        Names from :data:`METHODS`.
    seeds : sequence of int
        One run per seed (client split, initialization, sampling, batches).
    quick : bool
        :data:`QUICK_ROUNDS` rounds instead of the paper's epochs, evaluated once at
        the end: a pipeline check, not comparable with the paper.
    femnist_root : path-like, optional
        LEAF FEMNIST directory (with ``train/`` and ``test/``).
    device : None, str or torch.device
        Where the models train: "cpu" (None), "cuda" or "cuda:N" (see
        :func:`ebfl.learning.torch.train`; the same random numbers on every device).
    classes_per_client, samples_per_client : int, optional
        The client split of MNIST-like datasets (see :func:`load_clients`; the paper
        states 3 classes and not the number of images).
    lr_grid : sequence of float, optional
        Choose each method's learning rate per seed from these values, as the paper
        did (its grid: :data:`PAPER_LR_GRID`): every value is trained on the
        training images less a validation split (:data:`VALIDATION_FRACTION` per
        client) and scored on that split, never on the test set; the best (the
        first in the grid's order on a tie) is then trained on all training images
        and tested. None keeps the rates of the module docstring.

    Returns
    -------
    dict
        ``settings``, ``results`` {method: {mean, sd, per_seed, seconds}, plus with
        ``lr_grid`` ``lr`` (the chosen rate per seed), ``validation`` (per seed,
        the validation accuracy of every rate) and ``selection_seconds``},
        ``curves`` {method: [(round, accuracy), ...]} of the first seed, and
        ``paper`` {method: [value, pm]} where the paper reports the column. With
        ``lr_grid``, ``lr_at_edge`` says per seed whether the chosen rate is the
        grid's smallest or largest: the best rate may then lie outside the grid.
    """
    from ebfl.learning.torch.functional import check_device

    _dataset_iv(dataset)
    device = check_device(device)  # before any data is loaded
    registry = _methods()
    methods = check_names(methods, "methods", registry, what="method")
    seeds = _seeds_iv(seeds)
    quick, progress = check_bool(quick, "quick"), check_bool(progress, "progress")
    if eval_every is not None:
        eval_every = check_int_scalar(eval_every, "eval_every", minimum=1)
    _root_iv(femnist_root)
    split = dict(zip(("classes_per_client", "samples_per_client"),
                     _protocol_iv(dataset, classes_per_client, samples_per_client), strict=True))
    if lr_grid is not None:
        if dataset not in ("mnist", "fashion-mnist"):
            raise ValueError(f"lr_grid is available for mnist and fashion-mnist (a validation "
                             f"split of their training images), not {dataset!r}")
        lr_grid = tuple(check_positive_scalar(v, "lr_grid") for v in _sequence(lr_grid,
                                                                              "lr_grid"))
        if not lr_grid:
            raise ValueError("lr_grid must hold at least one learning rate")
    proto = PROTOCOL[dataset]
    n_rounds = _rounds(proto, quick)
    eval_every = eval_every or (n_rounds if quick else max(1, n_rounds // 30))
    results = {name: {"per_seed": [], "seconds": []}
               | ({"lr": [], "lr_at_edge": [], "validation": [], "selection_seconds": []}
                  if lr_grid else {})
               for name in methods}
    curves, info, k = {}, None, None
    for seed in seeds:
        data, make_model, info = load_clients(dataset, seed=seed, femnist_root=femnist_root,
                                              **split)
        k = max(1, round(proto["ratio"] * data.n_clients))
        run = functools.partial(_train_table1, registry, make_model, n_rounds=n_rounds, k=k,
                                seed=seed, progress=progress, device=device)
        if lr_grid:
            held_out = load_clients(dataset, seed=seed, validation=True, **split)[0]
        for name in methods:
            lr = None
            if lr_grid:
                trials = [run(name, held_out, v, n_rounds) for v in lr_grid]
                scores = [100 * float(t.accuracy.mean()) for t in trials]
                lr = lr_grid[int(np.argmax(scores))]
                results[name]["lr"].append(lr)
                results[name]["lr_at_edge"].append(at_grid_edge(lr, lr_grid))
                results[name]["selection_seconds"].append(sum(t.seconds for t in trials))
                results[name]["validation"].append(dict(zip(map(str, lr_grid), scores,
                                                            strict=True)))
            res = run(name, data, lr, eval_every)
            results[name]["per_seed"].append(100 * float(res.accuracy.mean()))
            results[name]["seconds"].append(res.seconds)
            if seed == seeds[0]:
                curves[name] = [(h["round"], 100 * h["accuracy"]) for h in res.history]
    for r in results.values():
        r.update(_mean_sd(r["per_seed"]))
    paper = {}
    if dataset in PAPER_COLUMN:
        col = PAPER_COLUMN[dataset]
        for row in paper_numbers("generative_framework_table1").itertuples():
            if row.method in results:
                paper[row.method] = [getattr(row, col), getattr(row, col + "_pm")]
    return {"settings": {"dataset": dataset, **info, **split, "lr_grid": lr_grid,
                         "validation_fraction": VALIDATION_FRACTION if lr_grid else None,
                         "sampled_per_round": k, "tau": TAU,
                         "rounds": n_rounds, "iterations": n_rounds * TAU, "seeds": list(seeds),
                         "quick": bool(quick), "stand_in": dataset in ("fashion-mnist", "hapt"),
                         "metric": "test accuracy (%), mean over clients"},
            "results": results, "curves": curves, "paper": paper}


def plot_table1(result, path):
    """Accuracy per round of every method (first seed), paper values as markers; saves ``path``."""
    from matplotlib import colormaps

    from ebfl._plotting import subplots

    fig, ax = subplots(figsize=(8, 4.5))
    colors = colormaps["tab20"].colors[::2] + colormaps["tab20"].colors[1::2]
    for (name, curve), color in zip(result["curves"].items(), colors, strict=False):
        n_rounds, acc = zip(*curve, strict=True)
        line, = ax.plot(n_rounds, acc, label=name, color=color,
                        marker="o" if len(n_rounds) < 3 else None)  # visible in --quick
        if name in result["paper"]:
            ax.scatter([n_rounds[-1]], [result["paper"][name][0]], marker="*", s=60,
                       color=line.get_color())
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    s = result["settings"]
    ax.set_title(f"{s['dataset']}: {s['clients']} clients, K = {s['sampled_per_round']}"
                 + (" (stars: paper)" if result["paper"] else ""))
    lo = min(min(a for _, a in c) for c in result["curves"].values())
    ax.set_ylim(max(0.0, math.floor(lo / 10) * 10), 100)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def dp_sweep(dataset="mnist", *, noise_multipliers=(0.5, 1.0, 2.0, 4.0), clip=1.0, delta=1e-5,
             concatenate=False, fine_tune=False, seed=0, quick=False, femnist_root=None,
             progress=False, device=None):
    """DP-AdaPeD accuracy against epsilon (Figures 1-3 of the paper).

    One run per noise multiplier z = sigma / C (both blocks, C1 = C2 = ``clip``),
    beside non-private AdaPeD and local training (which is private by
    construction). Each run's epsilon at ``delta`` is given twice: by the
    paper's Theorem 7 and by the correct accountant
    (:meth:`ebfl.generative.algorithm.DPAdaPeD.privacy`; fixed-size sampling,
    trusted aggregator, RDP). ``device``: where the models train (as in
    :func:`table1`).

    Returns
    -------
    dict
        ``settings``, ``runs`` (one per z: accuracy %, epsilon_theorem7,
        epsilon_accountant), ``reference`` {AdaPeD, Local: accuracy %}.
    """
    from ebfl.generative.algorithm import AdaPeD, DPAdaPeD
    from ebfl.learning.torch import Local, train
    from ebfl.learning.torch.functional import check_device

    _dataset_iv(dataset)
    device = check_device(device)
    noise_multipliers = _noise_iv(noise_multipliers)
    clip, delta = _clip_delta_iv(clip, delta)
    concatenate = check_bool(concatenate, "concatenate")
    fine_tune = check_bool(fine_tune, "fine_tune")
    seed = _seed_iv(seed)
    quick, progress = check_bool(quick, "quick"), check_bool(progress, "progress")
    _root_iv(femnist_root)
    proto = PROTOCOL[dataset]
    n_rounds = _rounds(proto, quick)
    data, make_model, info = load_clients(dataset, seed=seed, femnist_root=femnist_root)
    k = max(1, round(proto["ratio"] * data.n_clients))
    kw = dict(n_rounds=n_rounds, local_steps=TAU, clients_per_round=k,
              iters_per_epoch=ITERS_PER_EPOCH, eval_every=n_rounds, seed=seed, progress=progress,
              device=device)
    runs = []
    for z in noise_multipliers:
        if concatenate:
            strat = DPAdaPeD(make_model(), clip_mu=clip, noise_mu=z * clip, concatenate=True,
                             fine_tune=fine_tune)
        else:
            strat = DPAdaPeD(make_model(), clip_mu=clip, noise_mu=z * clip, clip_psi=clip,
                             noise_psi=z * clip, fine_tune=fine_tune)
        res = train(strat, data, **kw)
        eps = strat.privacy(delta, n_clients=data.n_clients, n_sampled=k,
                            n_iterations=n_rounds * TAU, sync_gap=TAU)
        runs.append({"noise_multiplier": z, "accuracy": 100 * float(res.accuracy.mean()),
                     "epsilon_theorem7": eps["theorem7"],
                     "epsilon_accountant": eps["accountant"]})
    reference = {name: 100 * float(train(strat, data, **kw).accuracy.mean())
                 for name, strat in (("AdaPeD", AdaPeD(make_model(), fine_tune=fine_tune)),
                                     ("Local", Local(make_model(), 0.1)))}
    return {"settings": {"dataset": dataset, **info, "sampled_per_round": k, "rounds": n_rounds,
                         "tau": TAU, "clip": clip, "delta": delta, "concatenate": concatenate,
                         "fine_tune": fine_tune, "seed": seed, "quick": bool(quick)},
            "runs": runs, "reference": reference}


def plot_dp_sweep(result, path):
    """Accuracy against epsilon by both accountings, with the reference lines; saves ``path``."""
    from ebfl._plotting import subplots

    fig, ax = subplots(figsize=(7, 4.2))
    acc = [r["accuracy"] for r in result["runs"]]
    ax.plot([r["epsilon_theorem7"] for r in result["runs"]], acc, "o-",
            label="DP-AdaPeD, epsilon by Theorem 7 (as printed)")
    ax.plot([r["epsilon_accountant"] for r in result["runs"]], acc, "s--",
            label="DP-AdaPeD, epsilon by a correct accountant")
    for (name, value), style in zip(result["reference"].items(), (":", "-."), strict=True):
        ax.axhline(value, ls=style, color="gray", label=f"{name} (no privacy cost)"
                   if name == "Local" else f"{name} (non-private)")
    ax.set_xscale("log")
    ax.set_xlabel(f"epsilon (delta = {result['settings']['delta']:g})")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"DP-AdaPeD on {result['settings']['dataset']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _dataset_iv(dataset):
    check_choice(dataset, "dataset", DATASETS)


def _seed_iv(seed, name="seed"):
    return check_int_scalar(seed, name, minimum=0, maximum=2**63 - 1)


def _root_iv(root):
    if root is not None and not isinstance(root, str | os.PathLike):
        raise TypeError(f"femnist_root must be a path, got {type(root).__name__}")


def _sequence(values, name):
    """A sequence of values; one bare number means that one value."""
    if isinstance(values, numbers.Number) and not isinstance(values, bool):
        return [values]
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence, got {values!r}")
    return list(values)


def _seeds_iv(seeds):
    seeds = [_seed_iv(s, "seeds") for s in _sequence(seeds, "seeds")]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    return tuple(seeds)


def _noise_iv(noise_multipliers, *, allow_empty=False):
    zs = tuple(check_real_scalar(z, "noise_multipliers", low=0.0, high=math.inf, low_open=True,
                                 high_open=True)
               for z in _sequence(noise_multipliers, "noise_multipliers"))
    if not zs and not allow_empty:
        raise ValueError("noise_multipliers must hold at least one value")
    return zs


def _clip_delta_iv(clip, delta):
    return (check_positive_scalar(clip, "clip"),
            check_real_scalar(delta, "delta", low=0.0, high=1.0, low_open=True, high_open=True))


def _mean_sd(values):
    return {"mean": float(np.mean(values)),
            "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "per_seed": [float(v) for v in values]}


def fedem_comparison(dataset="mnist", *, noise_multipliers=(1.0, 4.0, 16.0), clip=1.0,
                     delta=1e-5, seeds=(0,), quick=False, femnist_root=None, progress=False,
                     device=None):
    """AdaPeD against FedEM, non-private and DP, at full participation (E7, Figure 3).

    Every client trains every round (K = m, "to give an advantage to FedEM").
    The private versions release one concatenated vector per client and local
    step, clipped to ``clip`` and noised with sigma = z * clip: [h; k] for
    DP-AdaPeD (``DPAdaPeD(concatenate=True)``), the M = 2 component gradients
    for DP-FedEM (:class:`~ebfl.learning.torch.baselines.DPFedEM`). Being the
    same mechanism, both have the same epsilon, given by the correct accountant
    (no subsampling here) and, for DP-AdaPeD, by Theorem 7 as printed.

    Parameters
    ----------
    dataset : str
        One of :data:`DATASETS`.
    noise_multipliers : sequence of float
        z = sigma / C, one private run of each method per value (may be empty:
        the non-private pair only).
    clip : float
    delta : float
    seeds : sequence of int
        One run per seed, for the mean and sd (the paper's error bars are 3 sd).
    quick : bool
        :data:`QUICK_ROUNDS_ALL_CLIENTS` rounds: a pipeline check, not comparable
        with the paper.
    device : None, str or torch.device
        Where the models train (as in :func:`table1`).

    Returns
    -------
    dict
        ``settings``; ``non_private`` {AdaPeD, FedEM: {mean, sd, per_seed}};
        ``runs`` one per z with ``epsilon_accountant``, ``epsilon_theorem7`` and
        {DP-AdaPeD, DP-FedEM: {mean, sd, per_seed}}; ``paper`` {method: [value,
        pm]} where the paper reports it (MNIST).
    """
    from ebfl.generative.algorithm import DPAdaPeD
    from ebfl.learning.torch import train
    from ebfl.learning.torch.functional import check_device

    _dataset_iv(dataset)
    device = check_device(device)
    zs = _noise_iv(noise_multipliers, allow_empty=True)
    seeds = _seeds_iv(seeds)
    clip, delta = _clip_delta_iv(clip, delta)
    quick, progress = check_bool(quick, "quick"), check_bool(progress, "progress")
    _root_iv(femnist_root)
    proto = PROTOCOL[dataset]
    n_rounds = _rounds(proto, quick, all_clients=True)
    acc = {"AdaPeD": [], "FedEM": []} | {(name, z): [] for z in zs
                                         for name in ("DP-AdaPeD", "DP-FedEM")}
    for seed in seeds:
        data, make_model, info = load_clients(dataset, seed=seed, femnist_root=femnist_root)
        kw = dict(n_rounds=n_rounds, local_steps=TAU, iters_per_epoch=ITERS_PER_EPOCH,
                  eval_every=n_rounds, seed=seed, progress=progress, device=device)
        for key in acc:
            res = train(_e7_strategy(key, make_model(), clip), data, **kw)
            acc[key].append(100 * float(res.accuracy.mean()))
    m = data.n_clients
    runs = []
    for z in zs:
        eps = DPAdaPeD(make_model(), clip_mu=clip, noise_mu=z * clip, concatenate=True).privacy(
            delta, n_clients=m, n_sampled=m, n_iterations=n_rounds * TAU, sync_gap=TAU)
        runs.append({"noise_multiplier": z, "epsilon_accountant": eps["accountant"],
                     "epsilon_theorem7": eps["theorem7"],
                     "DP-AdaPeD": _mean_sd(acc["DP-AdaPeD", z]),
                     "DP-FedEM": _mean_sd(acc["DP-FedEM", z])})
    paper = {}
    if dataset == "mnist":
        paper = {row.method: [row.mnist, row.mnist_pm]
                 for row in paper_numbers("generative_framework_e7").itertuples()}
    return {"settings": {"dataset": dataset, **info, "sampled_per_round": m, "rounds": n_rounds,
                         "tau": TAU, "clip": clip, "delta": delta, "seeds": list(seeds),
                         "quick": bool(quick), "stand_in": dataset in ("fashion-mnist", "hapt"),
                         "metric": "test accuracy (%), mean over clients"},
            "non_private": {name: _mean_sd(acc[name]) for name in ("AdaPeD", "FedEM")},
            "runs": runs, "paper": paper}


def _e7_strategy(key, model, clip):
    """The strategy of a key: "AdaPeD", "FedEM", ("DP-AdaPeD", z) or ("DP-FedEM", z)."""
    from ebfl.generative.algorithm import AdaPeD, DPAdaPeD
    from ebfl.learning.torch import DPFedEM, FedEM

    if key == "AdaPeD":
        return AdaPeD(model)
    if key == "FedEM":
        return FedEM(model)
    name, z = key
    if name == "DP-AdaPeD":
        return DPAdaPeD(model, clip_mu=clip, noise_mu=z * clip, concatenate=True)
    return DPFedEM(model, clip=clip, noise=z * clip)


def plot_fedem_comparison(result, path):
    """Figure 3: accuracy (log axis) against epsilon, error bars 3 sd; saves ``path``."""
    from ebfl._plotting import subplots

    fig, ax = subplots(figsize=(7, 4.2))
    eps = [r["epsilon_accountant"] for r in result["runs"]]
    for name, style in (("DP-AdaPeD", "o-"), ("DP-FedEM", "s--")):
        ax.errorbar(eps, [r[name]["mean"] for r in result["runs"]],
                    yerr=[3 * r[name]["sd"] for r in result["runs"]], fmt=style, capsize=3,
                    label=name)
    for (name, value), style in zip(result["non_private"].items(), (":", "-."), strict=True):
        ax.axhline(value["mean"], ls=style, color="gray", label=f"{name} (non-private)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    s = result["settings"]
    ax.set_xlabel(f"epsilon by a correct accountant (delta = {s['delta']:g})")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{s['dataset']}: all {s['clients']} clients every round, "
                 f"{len(s['seeds'])} seed(s), error bars 3 sd")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
