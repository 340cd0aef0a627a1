"""PerAda's experiments at CPU scale: Tables 1, 2 and 4 and Figures 4 and 7, beside the paper.

The paper (Xie et al., CVPR 2024) personalizes an ImageNet-pretrained
ResNet-18 on CIFAR-10 (20 clients, Dirichlet(0.1), 8 per round), distills on
CIFAR-100 and tests generalization on CIFAR-10.1 and CIFAR-10-C. Neither those
data nor ImageNet weights can be fetched on the machines this project is
tested on, so the default reproduction keeps the *structure* at CPU scale:

* backbone: :class:`~ebfl.learning.torch.adapters.SmallResNet` (about 78k
  parameters), pretrained by ebfl on Fashion-MNIST (another dataset than the
  target, as ImageNet is for CIFAR-10) and cached in the data home;
* target: MNIST, 20 clients, Dirichlet(0.1) with the official partition rules,
  8 clients per round, local test splits with the clients' class proportions,
  their union the Global-test;
* distillation data: unlabeled Fashion-MNIST images (out-of-domain, as CIFAR-100
  for CIFAR-10) or held-out MNIST images (in-domain, Figure 4);
* out-of-distribution tests: corruptions of the Global-test set written in torch
  (:mod:`ebfl.learning.torch.corruptions`), in the spirit of CIFAR-10-C.

The paper's numbers are carried beside ours, labelled as a different setting:
the comparison is of the *claims* (does PerAda beat the baselines on
Global-test and OOD, does out-of-domain distillation help), not of values.
``--arch resnet18 --dataset cifar10 --backbone-weights FILE`` runs the paper's
setting for users who have the data and weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from ebfl._validation import (
    check_bool,
    check_choice,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_real_scalar,
)
from ebfl.privacy.accounting.core import quiet_absl

__all__ = ["FULL", "QUICK", "PerAdaProtocol", "TABLE1_METHODS", "check_backbone_weights",
           "plot_perada", "reproduce_perada", "run_method"]


#: Most seeds (runs per setting) of one reproduction, and most rounds of a run.
MAX_SEEDS = 10_000
MAX_ROUNDS = 10**6
#: Largest seed: the torch streams take seeds below 2^63.
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class PerAdaProtocol:
    """One reproduction's settings (``FULL`` and ``QUICK`` below); checked when built.

    Counts are integers (``n_rounds`` at most 10^6, ``clients_per_round`` at most
    ``n_clients``), rates and the clip > 0, ``lam`` >= 0, ``dropout`` in [0, 1),
    ``delta`` in (0, 1); ``dp_epsilons``, ``lambdas`` and ``kd_step_grid`` are
    non-empty sequences of such values.
    """

    n_clients: int = 20
    alpha: float = 0.1
    n_train: int = 12000
    n_test: int = 2000
    n_aux: int = 2000
    n_ood: int = 500
    n_rounds: int = 20
    clients_per_round: int = 8
    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.2
    lam: float = 2.0
    kd_steps: int = 10
    kd_lr: float = 0.05
    kd_batch_size: int = 128
    kd_optimizer: str = "sgd"
    kd_rounds: int | None = None
    dropout: float = 0.0
    pretrain_epochs: int = 2
    pretrain_n_train: int | None = None
    dp_epsilons: tuple = (8.0, 4.0, 2.0)
    delta: float = 1e-5
    dp_clip: float = 1.0
    lambdas: tuple = (0.02, 0.2, 2.0, 20.0, 200.0)
    kd_step_grid: tuple = (0, 10, 40)

    def __post_init__(self):
        # ebfl.learning.torch.distillation's MAX_KD_STEPS (10**6), not imported: FULL and QUICK
        # are built on import, and this module must import without torch.
        MAX_KD_STEPS = 10**6  # noqa: N806
        from ebfl.learning.partition import MAX_ALPHA

        def count(name, minimum, maximum=None):
            return check_int_scalar(getattr(self, name), name, minimum=minimum,
                                    maximum=maximum)

        def grid(name, check):
            values = getattr(self, name)
            if isinstance(values, str) or not hasattr(values, "__iter__"):
                raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
            values = tuple(check(v, f"{name}[{i}]") for i, v in enumerate(values))
            if not values:
                raise ValueError(f"{name} must hold at least one value")
            return values

        checked = {
            "n_clients": count("n_clients", 1, 10**6),
            "alpha": check_real_scalar(self.alpha, "alpha", low=0.0, high=MAX_ALPHA,
                                       low_open=True),
            **{n: count(n, 1, 10**6) for n in ("n_train", "n_test", "n_ood")},
            "n_aux": count("n_aux", 0, 10**6), "n_rounds": count("n_rounds", 1, MAX_ROUNDS),
            **{n: count(n, 1, 2**31 - 1) for n in ("local_steps", "batch_size",
                                                   "kd_batch_size")},
            "kd_steps": count("kd_steps", 0, MAX_KD_STEPS),
            "kd_optimizer": check_choice(self.kd_optimizer, "kd_optimizer", ("sgd", "adam")),
            "kd_rounds": None if self.kd_rounds is None else count("kd_rounds", 0),
            "dropout": check_real_scalar(self.dropout, "dropout", low=0.0, high=1.0,
                                         high_open=True),
            "pretrain_epochs": count("pretrain_epochs", 1, 10**6),
            "pretrain_n_train": (None if self.pretrain_n_train is None
                                 else count("pretrain_n_train", 1)),
            **{n: check_positive_scalar(getattr(self, n), n) for n in ("lr", "kd_lr",
                                                                        "dp_clip")},
            "lam": check_nonnegative_scalar(self.lam, "lam"),
            "delta": check_real_scalar(self.delta, "delta", low=0.0, high=1.0, low_open=True,
                                       high_open=True),
            "dp_epsilons": grid("dp_epsilons", check_positive_scalar),
            "lambdas": grid("lambdas", check_nonnegative_scalar),
            "kd_step_grid": grid("kd_step_grid", lambda v, n: check_int_scalar(
                v, n, minimum=0, maximum=MAX_KD_STEPS)),
        }
        checked["clients_per_round"] = count("clients_per_round", 1, checked["n_clients"])
        for f in fields(self):
            object.__setattr__(self, f.name, checked[f.name])


#: The CPU-scale reproduction.
FULL = PerAdaProtocol()
#: A pipeline check, not a reproduction: every part on a small federation, within 2 minutes on
#: two cores (the evaluations and FedAvg+FT's full-batch adaptation scale with the images).
QUICK = PerAdaProtocol(n_clients=4, n_train=600, n_test=120, n_aux=128, n_ood=50, n_rounds=2,
                       clients_per_round=2, local_steps=3, kd_steps=3, kd_batch_size=64,
                       pretrain_epochs=1, pretrain_n_train=5000, dp_epsilons=(4.0,),
                       lambdas=(0.2, 2.0), kd_step_grid=(0, 3))

#: The paper's CIFAR-10 setting with the official code's defaults (a GPU job: 200 rounds of 10
#: local epochs of ResNet-18 on 8 clients, 500 distillation steps of batch 2048 per round).
PAPER = PerAdaProtocol(n_clients=20, alpha=0.1, n_train=50000, n_test=10000, n_aux=50000,
                       n_ood=10000, n_rounds=200, clients_per_round=8, local_steps=350,
                       batch_size=64, lr=0.01, lam=2.0, kd_steps=500, kd_lr=1e-3,
                       kd_batch_size=2048, kd_optimizer="adam", kd_rounds=30, dropout=0.3)

#: Table 1's rows: (name, personalized part) in the paper's order.
TABLE1_METHODS = (
    ("Standalone", "Full model"),
    ("FedAvg+FT", "Full model"),
    ("pFedMe", "Full model"),
    ("APFL", "Full model"),
    ("Ditto", "Full model"),
    ("FedBN", "Batch norm."),
    ("FedAlt (input)", "Input layer"),
    ("FedSim (input)", "Input layer"),
    ("LG-FedAvg", "Feat. extractor"),
    ("FedRep", "Output layer"),
    ("FedAlt (output)", "Output layer"),
    ("FedSim (output)", "Output layer"),
    ("FedAlt (adapter)", "Adapter"),
    ("FedSim (adapter)", "Adapter"),
    ("PerAda w/o KD", "Adapter"),
    ("PerAda", "Adapter"),
)
#: Every method :func:`run_method` trains: Table 1's rows and FedDF (Table 2).
METHODS = (*(m for m, _ in TABLE1_METHODS), "FedDF")
#: The partial-personalization rows (Pillutla et al.'s split of the model).
PARTIAL = ("FedBN", "LG-FedAvg", "FedRep", "FedAlt (input)", "FedSim (input)",
           "FedAlt (output)", "FedSim (output)", "FedAlt (adapter)", "FedSim (adapter)")
#: The quick run's rows.
QUICK_METHODS = ("Standalone", "FedAvg+FT", "Ditto", "FedBN", "FedSim (adapter)",
                 "PerAda w/o KD", "PerAda")
#: Table 2's global models: (row, the run that holds it).
TABLE2_METHODS = (("FedAvg", "FedAvg+FT"), ("FedDF", "FedDF"), ("pFedMe", "pFedMe"),
                  ("APFL", "APFL"), ("Ditto", "Ditto"), ("PerAda w/o KD", "PerAda w/o KD"),
                  ("PerAda", "PerAda"))
PARTS = ("table1", "table2", "figure4", "figure7", "table4")


# --- building blocks ---------------------------------------------------------------------------

def check_backbone_weights(arch, weights, *, names=None):
    """Check the pair (architecture, backbone weights) and read the weights.

    ``arch="resnet18"`` needs ``weights``: a torchvision-format ResNet-18
    state dict, or the path of a file holding one; it is read (``torch.load``
    with ``weights_only=True``) and checked (keys, shapes, finite values). The
    small architecture pretrains its own backbone, so weights are refused with
    it rather than ignored.

    Parameters
    ----------
    arch : {"small", "resnet18"}
    weights : path-like, dict name -> Tensor, or None
    names : dict, optional
        How the messages call ``arch``, ``backbone_weights`` and ``cache_dir``
        (e.g. the command line's ``--arch``); default: these names.

    Returns
    -------
    SimpleNamespace or None
        The ResNet-18 backbone (``state``, ``config``, ``test_accuracy``,
        ``seconds``) for ``"resnet18"``, None for ``"small"``.

    Raises
    ------
    ValueError
        A missing, unreadable, truncated or foreign file, the state dict of
        another architecture or with NaN/inf values, weights with ``"small"``,
        no weights with ``"resnet18"``; the message names the argument.
    """
    from types import SimpleNamespace

    names = {"arch": "arch", "backbone_weights": "backbone_weights", "cache_dir": "cache_dir",
             **(names or {})}
    arch_name, name = names["arch"], names["backbone_weights"]
    arch = check_choice(arch, arch_name, ("small", "resnet18"))
    if weights is None:
        if arch == "resnet18":
            raise ValueError(f"{arch_name} 'resnet18' needs {name}: a torchvision-format "
                             "ResNet-18 state_dict file (ImageNet weights)")
        return None
    if arch == "small":
        raise ValueError(f"{name} is only used with {arch_name} 'resnet18': the 'small' "
                         f"backbone is pretrained by ebfl (on Fashion-MNIST, cached in "
                         f"{names['cache_dir']}) and no weights file replaces it; drop {name} "
                         f"or use {arch_name} 'resnet18'")
    if not isinstance(weights, str | os.PathLike | Mapping):
        raise TypeError(f"{name} must be the path of a ResNet-18 state_dict file (or a state "
                        f"dict), got {type(weights).__name__}")
    from ebfl.learning.torch.adapters import ResNet18Adapters, load_torchvision_weights
    from ebfl.learning.torch.functional import model_state

    t0 = time.perf_counter()
    net = ResNet18Adapters(1000, 3, adapters=False)
    load_torchvision_weights(net, weights, name=name)
    source = (f"ImageNet weights from {os.fspath(weights)}"
              if isinstance(weights, str | os.PathLike) else "ImageNet weights (a state dict)")
    return SimpleNamespace(state=model_state(net), test_accuracy=None,
                           config={"dataset": source}, seconds=time.perf_counter() - t0)


def _backbone(protocol, *, dataset, arch="small", weights=None, cache_dir=None,
              progress=False):
    """The pretrained backbone: ebfl's small ResNet pretrained on Fashion-MNIST (for the
    MNIST target), or ResNet-18 with the user's ImageNet weights; None on synthetic data."""
    if arch == "resnet18":
        return check_backbone_weights(arch, weights)
    if dataset == "synthetic":
        return None
    from ebfl.learning.torch.pretrain import pretrained_backbone

    source = "mnist" if dataset == "fashion-mnist" else "fashion-mnist"
    return pretrained_backbone(dataset=source, epochs=protocol.pretrain_epochs,
                               n_train=protocol.pretrain_n_train, cache_dir=cache_dir,
                               progress=progress)


def _models(n_classes, in_channels, arch="small", dropout=0.0):
    from ebfl.learning.torch.adapters import ResNet18Adapters, SmallResNet

    cls = ResNet18Adapters if arch == "resnet18" else SmallResNet
    return (cls(n_classes, in_channels, adapters=False),
            cls(n_classes, in_channels, adapters=True, dropout=dropout))


def _pretrained_state(model, backbone, seed):
    """The model's initial state: the pretrained backbone (its head dropped: the target's
    classes are others) over a seeded fresh initialization."""
    from ebfl.learning.torch.functional import fresh_params

    state = fresh_params(model, seed)
    if backbone is not None:
        for name, t in backbone.state.items():
            if name in state and not name.startswith("fc.") and state[name].shape == t.shape:
                state[name] = t.clone()
    return state


def make_method(name, *, data, protocol, backbone, seed=0, lam=None, aux=None, kd_steps=None,
                dp=None, arch="small"):
    """The strategy of Table 1's row ``name`` and its ``init_params`` (or None)."""
    from ebfl.learning.torch import baselines as b
    from ebfl.learning.torch import partial as pt
    from ebfl.learning.torch import strategies as st
    from ebfl.perada.algorithm import PerAda

    n_classes = data.federated.n_classes
    in_channels = 1 if data.federated.x_train.dim() == 4 else data.federated.x_train.shape[2]
    full, adapted = _models(n_classes, in_channels, arch, protocol.dropout)
    lr = protocol.lr
    lam = protocol.lam if lam is None else lam
    init_full = _pretrained_state(full, backbone, seed)
    init_adapted = _pretrained_state(adapted, backbone, seed)
    kd = dict(kd_steps=protocol.kd_steps if kd_steps is None else kd_steps, kd_lr=protocol.kd_lr,
              kd_batch_size=protocol.kd_batch_size, kd_optimizer=protocol.kd_optimizer)
    aux_default = data.aux.get("out-of-domain")
    if name in ("PerAda", "PerAda w/o KD"):
        use_aux = (aux if aux is not None else aux_default) if name == "PerAda" else None
        if dp is not None:
            from ebfl.perada.dp import DPPerAda

            return DPPerAda(adapted, init_adapted, lr=lr, lam=lam, aux=use_aux, **kd,
                            **dp), None
        return PerAda(adapted, init_adapted, lr=lr, lam=lam, aux=use_aux,
                      kd_rounds=protocol.kd_rounds, **kd), None
    wd = dict(weight_decay=0.0)
    steps = protocol.local_steps
    makers = {
        "Standalone": lambda: st.Local(full, lr, **wd),
        "FedAvg+FT": lambda: b.FedAvgFT(full, lr, finetune_steps=steps, **wd),
        "pFedMe": lambda: b.PFedMe(full, lr, lr, lam=lam, **wd),
        "APFL": lambda: b.APFL(full, lr, **wd),
        "Ditto": lambda: b.Ditto(full, lr, lam=lam, **wd),
        "FedDF": lambda: b.FedDF(full, lr, aux=aux_default, **kd, **wd),
        "FedBN": lambda: pt.FedBN(full, lr, pretrained=init_full),
        "LG-FedAvg": lambda: pt.LGFedAvg(full, lr, pretrained=init_full),
        "FedRep": lambda: pt.FedRep(full, lr, head_steps=steps, pretrained=init_full),
        "FedAlt (input)": lambda: pt.FedAlt(full, lr, personal="input", pretrained=init_full),
        "FedSim (input)": lambda: pt.FedSim(full, lr, personal="input", pretrained=init_full),
        "FedAlt (output)": lambda: pt.FedAlt(full, lr, personal="output", pretrained=init_full),
        "FedSim (output)": lambda: pt.FedSim(full, lr, personal="output", pretrained=init_full),
        "FedAlt (adapter)": lambda: pt.FedAlt(adapted, lr, personal="adapter",
                                              pretrained=init_adapted),
        "FedSim (adapter)": lambda: pt.FedSim(adapted, lr, personal="adapter",
                                              pretrained=init_adapted),
    }
    if name not in makers:
        raise ValueError(f"method must be one of {sorted([*makers, 'PerAda', 'PerAda w/o KD'])},"
                         f" got {name!r}")
    # partial-personalization strategies take the pretrained state themselves
    return makers[name](), (None if name in PARTIAL else init_full)


def _parameter_columns(alg):
    """Table 1's "# Trained" and "# Comm." columns (parameters, buffers excluded)."""
    out = {}
    for key, method in (("trained_parameters", "trained_parameters"),
                        ("communicated_parameters", "communicated_parameters")):
        fn = getattr(alg, method, None)
        out[key] = int(fn()) if callable(fn) else None
    return out


def run_method(name, data, protocol, backbone, *, seed=0, progress=False, cache=None,
               device=None, **kw):
    """Train Table 1's method ``name`` on ``data`` and evaluate it (Local-test, Global-test,
    OOD, global model, Phi, prediction distance, the Theorem 1-2 inequalities).

    ``cache``: a JSON file; if it exists its result is returned (an interrupted
    reproduction resumes run by run), else the result is written there.
    ``device``: where the model trains and is evaluated ("cpu", "cuda", "cuda:N";
    see :func:`ebfl.learning.torch.train`).
    """
    from ebfl.learning.torch.engine import run_config, train
    from ebfl.learning.torch.functional import check_device
    from ebfl.perada.data import PerAdaData
    from ebfl.perada.generalization import generalization_report

    device = check_device(device)
    name = check_choice(name, "name", METHODS)
    if not isinstance(data, PerAdaData):
        raise TypeError(f"data must be a PerAdaData (ebfl.perada.data), got "
                        f"{type(data).__name__}")
    if not isinstance(protocol, PerAdaProtocol):
        raise TypeError(f"protocol must be a PerAdaProtocol, got {type(protocol).__name__}")
    if backbone is not None and not isinstance(getattr(backbone, "state", None), Mapping):
        raise TypeError("backbone must be None or a pretrained backbone with a state dict "
                        f"(a PretrainedBackbone), got {type(backbone).__name__}")
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=MAX_SEED)
    progress = check_bool(progress, "progress")
    if cache is not None and not isinstance(cache, str | os.PathLike):
        raise TypeError(f"cache must be a path, got {type(cache).__name__}")

    if cache is not None and Path(cache).is_file():
        return json.loads(Path(cache).read_text())
    alg, init = make_method(name, data=data, protocol=protocol, backbone=backbone, seed=seed,
                            **kw)
    t0 = time.perf_counter()
    schedule = dict(n_rounds=protocol.n_rounds, local_steps=protocol.local_steps,
                    clients_per_round=protocol.clients_per_round, batch_size=protocol.batch_size,
                    lr_decay=1.0, eval_every=max(1, protocol.n_rounds // 5), seed=seed)
    res = train(alg, data.federated, init_params=init, progress=progress, device=device,
                **schedule)
    train_seconds = time.perf_counter() - t0
    aux = data.aux.get("out-of-domain")
    report = generalization_report(alg.to(device), res.server, res.clients, data.federated,
                                   global_test=data.global_test, ood=data.ood, aux=aux)
    ood_names = list(data.ood)
    report["ood_mean"] = {
        "personalized": float(np.mean([report[n]["personalized"]["mean"] for n in ood_names])),
        "personalized_std": float(np.mean([report[n]["personalized"]["std"]
                                           for n in ood_names])),
    }
    if all("global_model" in report[n] for n in ood_names):
        report["ood_mean"]["global_model"] = float(np.mean([report[n]["global_model"]
                                                            for n in ood_names]))
    out = {"method": name, "seed": seed, "config": alg.config(), **_parameter_columns(alg),
           "report": report, "history": res.history, "train_seconds": train_seconds,
           "seconds": time.perf_counter() - t0}
    if hasattr(alg, "privacy"):
        with quiet_absl():
            priv = alg.privacy(protocol.delta, protocol.n_rounds, n_train=data.federated.n_train,
                               local_steps=protocol.local_steps,
                               participated=_participation(run_config(data.federated,
                                                                      **schedule)))
        out["privacy"] = {"epsilon": priv.epsilons.tolist(), "delta": protocol.delta,
                          "noise_multiplier": alg.noise_multiplier, "clip": alg.clip}
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(cache) + ".tmp")
        tmp.write_text(json.dumps(_jsonable(out)))
        tmp.replace(cache)
    return _jsonable(out)


def _participation(config):
    """Rounds each client trained in, from the run's sampling (the same streams as the run)."""
    from ebfl.federated.protocol import sample_clients

    counts = np.zeros(config.n_clients, dtype=np.int64)
    for r in range(config.n_rounds):
        counts[sample_clients(config, r)] += 1
    return counts


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if hasattr(obj, "item") and hasattr(obj, "numel") and obj.numel() == 1:
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


# --- the reproduction ----------------------------------------------------------------------------

DATASETS = ("mnist", "synthetic", "cifar10")


def load_data(dataset, protocol, *, seed=0, directory=None):
    """The federation, its Global-test, OOD sets and distillation data for ``dataset``."""
    from ebfl.perada import data as pdata

    common = dict(n_clients=protocol.n_clients, alpha=protocol.alpha, seed=seed,
                  n_train=protocol.n_train, n_test=protocol.n_test, n_aux=protocol.n_aux)
    if dataset == "mnist":
        data = pdata.perada_mnist(directory=directory, **common)
    elif dataset == "synthetic":
        data = pdata.synthetic_perada(**common)
    else:  # the paper's sizes are the whole datasets: None = all
        sizes = {k: (None if v >= full else v) for (k, v), full in zip(
            (("n_train", protocol.n_train), ("n_test", protocol.n_test),
             ("n_aux", protocol.n_aux)), (50000, 10000, 50000), strict=True)}
        data = pdata.perada_cifar10(directory=directory, n_clients=protocol.n_clients,
                                    alpha=protocol.alpha, seed=seed, n_ood=protocol.n_ood,
                                    **sizes)
    return _subsample_ood(data, protocol.n_ood, seed)


def _subsample_ood(data, n, seed):
    """At most ``n`` images per OOD set (seeded), to bound the evaluation's cost."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ood = {}
    for name, (x, y) in data.ood.items():
        if x.shape[0] > n:
            idx = torch.randperm(x.shape[0], generator=g)[:n]
            x, y = x[idx], y[idx]
        ood[name] = (x, y)
    return replace(data, ood=ood)


def _row(runs, key_fn):
    """Mean over seeds of a statistic of each run."""
    vals = [key_fn(r) for r in runs]
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def _table1_row(name, part, runs):
    rep = [r["report"] for r in runs]
    return {"algorithm": name, "personalization": part,
            "trained_parameters": runs[0]["trained_parameters"],
            "communicated_parameters": runs[0]["communicated_parameters"],
            "local_test": float(np.mean([x["local"]["mean"] for x in rep])),
            "local_test_weighted": float(np.mean([x["local"]["weighted_mean"] for x in rep])),
            "local_test_std": float(np.mean([x["local"]["std"] for x in rep])),
            "global_test": float(np.mean([x["global_test"]["personalized"]["mean"]
                                          for x in rep])),
            "global_test_std": float(np.mean([x["global_test"]["personalized"]["std"]
                                              for x in rep])),
            "ood": float(np.mean([x["ood_mean"]["personalized"] for x in rep])),
            "ood_std": float(np.mean([x["ood_mean"]["personalized_std"] for x in rep])),
            "prediction_distance": _row(runs, lambda r: r["report"]["global_test"].get(
                "prediction_distance")),
            "seconds": float(np.mean([r["seconds"] for r in runs]))}


def _table2_row(name, runs):
    rep = [r["report"] for r in runs]
    if any("global_model" not in x["global_test"] for x in rep):
        return None
    return {"algorithm": name,
            "global_test": float(np.mean([x["global_test"]["global_model"] for x in rep])),
            "ood": float(np.mean([x["ood_mean"]["global_model"] for x in rep])),
            "phi_test": float(np.mean([x["global_test"]["phi"] for x in rep])),
            "phi_aux": _row(runs, lambda r: r["report"].get("phi_aux"))}


def reproduce_perada(*, dataset="mnist", quick=False, parts=PARTS, seeds=(0,), n_rounds=None,
                     checkpoint_dir=None, directory=None, cache_dir=None, arch="small",
                     backbone_weights=None, progress=False, device=None):
    """The CPU-scale analogue of PerAda's Tables 1, 2, 4 and Figures 4, 7.

    Parameters
    ----------
    dataset : {"mnist", "synthetic", "cifar10"}
        "mnist": the default reproduction (module docstring); "synthetic": the
        same pipeline on generated images, no data needed (a pipeline check);
        "cifar10": the paper's data (CIFAR-10, CIFAR-100 for distillation,
        CIFAR-10.1 and CIFAR-10-C) from the data home.
    quick : bool
        6 clients, 3 rounds, a subset of the methods: seconds, for CI.
    parts : sequence of {"table1", "table2", "figure4", "figure7", "table4"}
        Run in the order given.
    seeds : sequence of int
        At most 10,000 seeds, each in [0, 2^63 - 1].
    n_rounds : int, optional
        Override the protocol's rounds, in [1, 10^6].
    checkpoint_dir : path-like, optional
        One JSON per finished run: an interrupted reproduction resumes run by run.
    directory : path-like, optional
        Where the datasets are (default: the data home).
    cache_dir : path-like, optional
        Where the pretrained backbone is cached (default: the data home).
    arch : {"small", "resnet18"}
        "resnet18": the paper's ResNet-18 with its adapters, on ``dataset="cifar10"``
        with the official code's CIFAR-10 settings (a GPU-scale job; ``quick``
        shrinks it to a shape check).
    backbone_weights : path-like, optional
        The torchvision-format ImageNet state_dict of ResNet-18, for
        ``arch="resnet18"`` (required there, refused with ``"small"``, whose
        backbone ebfl pretrains); read and checked before any data is loaded.
    device : None, str or torch.device
        Where the federated runs train and are evaluated: "cpu" (None), "cuda"
        or "cuda:N" (see :func:`ebfl.learning.torch.train`). The backbone's
        pretraining stays on the CPU.

    Returns
    -------
    dict
        ``table1``, ``table2``, ``figure4``, ``figure7``, ``table4`` (rows), the
        paper's tables (``paper``), ``protocol``, ``federation``, ``backbone``,
        ``seconds``.
    """
    from ebfl.learning.torch.functional import check_device

    # every argument is checked here, before the backbone is pretrained or data loaded
    dataset = check_choice(dataset, "dataset", DATASETS)
    quick = check_bool(quick, "quick")
    progress = check_bool(progress, "progress")
    device = check_device(device)
    if isinstance(parts, str):
        parts = [parts]
    parts = list(dict.fromkeys(check_choice(p, "parts", PARTS) for p in parts))
    if not parts:
        raise ValueError(f"parts must name at least one of {list(PARTS)}")
    if isinstance(seeds, np.ndarray):
        seeds = seeds.tolist() if seeds.ndim == 1 else [seeds.item()] if seeds.ndim == 0 else None
    if seeds is None or isinstance(seeds, str | bytes | Mapping):
        raise TypeError("seeds must be a seed or a sequence of seeds (integers >= 0)")
    if not hasattr(seeds, "__len__"):
        seeds = [seeds]  # one seed
    if len(seeds) > MAX_SEEDS:  # counted before a range(...) of seeds is expanded
        raise ValueError(f"seeds must hold at most {MAX_SEEDS} seeds, got {len(seeds)}")
    seeds = [check_int_scalar(s, "seeds", minimum=0, maximum=MAX_SEED) for s in seeds]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    arch = check_choice(arch, "arch", ("small", "resnet18"))
    if arch == "resnet18" and dataset != "cifar10":
        raise ValueError(f"arch 'resnet18' runs on dataset 'cifar10' (3-channel images), got "
                         f"{dataset!r}")
    for name, path in (("checkpoint_dir", checkpoint_dir), ("directory", directory),
                       ("cache_dir", cache_dir)):
        if path is not None and not isinstance(path, str | os.PathLike):
            raise TypeError(f"{name} must be a path, got {type(path).__name__}")
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            raise ValueError(f"{name} must be a folder, got the file {os.fspath(path)}")
    protocol = QUICK if quick else (PAPER if arch == "resnet18" else FULL)
    if n_rounds is not None:
        protocol = replace(protocol, n_rounds=check_int_scalar(n_rounds, "n_rounds", minimum=1,
                                                             maximum=MAX_ROUNDS))
    resnet18 = check_backbone_weights(arch, backbone_weights)  # read before any data
    t0 = time.perf_counter()
    backbone = resnet18 or _backbone(protocol, dataset=dataset, arch=arch, cache_dir=cache_dir,
                                     progress=progress)
    data = load_data(dataset, protocol, seed=0, directory=directory)
    ckdir = None if checkpoint_dir is None else Path(checkpoint_dir)
    # the protocol's digest in every file name: a changed setting never reuses a stale run
    digest = hashlib.sha256(json.dumps(asdict(protocol), sort_keys=True).encode()).hexdigest()
    tag = f"{dataset}-{arch}{'-quick' if quick else ''}-{digest[:10]}"

    defaults = {"lam": protocol.lam, "kd_steps": protocol.kd_steps}

    trained = {}  # label -> runs: a run two parts ask for is trained once

    def runs(name, *, aux_name=None, **kw):
        """Every seed's run of ``name`` (cached per run under ``checkpoint_dir``)."""
        kw = {k: v for k, v in kw.items() if not (k in defaults and v == defaults[k])}
        label = name + "".join(f"-{k}={v}" for k, v in sorted(kw.items()) if k != "aux")
        if aux_name is not None:
            label += f"-aux={aux_name}"
        if label not in trained:  # e.g. Figure 7 at the default lambda is Table 1's PerAda
            trained[label] = [run_method(
                name, data, protocol, backbone, seed=seed, progress=progress, arch=arch,
                device=device, cache=(None if ckdir is None else
                                      ckdir / f"{tag}-{_slug(label)}-s{seed}.json"), **kw)
                for seed in seeds]
        return trained[label]

    methods = QUICK_METHODS if quick else [m for m, _ in TABLE1_METHODS]
    personalization = dict(TABLE1_METHODS)
    result = {"dataset": dataset, "quick": quick, "protocol": asdict(protocol),
              "federation": data.to_dict(), "federation_text": data.describe(), "seeds": seeds}
    if backbone is not None:
        result["backbone"] = {"source": backbone.config.get("dataset"),
                              "test_accuracy": backbone.test_accuracy,
                              "seconds": backbone.seconds}

    def table1():
        return [_table1_row(n, personalization[n], runs(n)) for n in methods]

    def table2():
        table1()
        if not quick:
            runs("FedDF")
        return [row for name, run in TABLE2_METHODS if run in trained
                for row in [_table2_row(name, trained[run])] if row is not None]

    build = {"table1": table1, "table2": table2,
             "figure4": lambda: _figure4(runs, data, protocol),
             "figure7": lambda: _figure7(runs, protocol),
             "table4": lambda: _table4(runs, data, protocol)}
    for part in parts:  # in the order asked (two processes can share a checkpoint_dir)
        result[part] = build[part]()
    result["paper"] = _paper_numbers()
    result["seconds"] = time.perf_counter() - t0
    return _jsonable(result)


def _slug(text):
    return "".join(c if c.isalnum() or c in "-=." else "_" for c in text)


def _figure4(runs, data, protocol):
    """PerAda's global and personalized generalization against the distillation steps R and
    the distillation data (none, in-domain, out-of-domain)."""
    rows = []
    for steps in protocol.kd_step_grid:
        r = runs("PerAda", kd_steps=steps) if steps > 0 else runs("PerAda w/o KD")
        rows.append({"kd_data": "out-of-domain" if steps else "none", "kd_steps": steps,
                     **_figure_stats(r)})
    if "in-domain" in data.aux:
        r = runs("PerAda", aux=data.aux["in-domain"], aux_name="in-domain")
        rows.append({"kd_data": "in-domain", "kd_steps": protocol.kd_steps, **_figure_stats(r)})
    return rows


def _figure_stats(runs):
    rep = [r["report"] for r in runs]
    return {"local_test": float(np.mean([x["local"]["mean"] for x in rep])),
            "global_test": float(np.mean([x["global_test"]["personalized"]["mean"]
                                          for x in rep])),
            "ood": float(np.mean([x["ood_mean"]["personalized"] for x in rep])),
            "global_model": _row(runs, lambda r: r["report"]["global_test"].get("global_model")),
            "prediction_distance": _row(runs, lambda r: r["report"]["global_test"].get(
                "prediction_distance")),
            "phi_test": _row(runs, lambda r: r["report"]["global_test"].get("phi")),
            "phi_aux": _row(runs, lambda r: r["report"].get("phi_aux"))}


def _figure7(runs, protocol):
    """PerAda's personalized accuracy and prediction distance against lambda (Figure 7)."""
    return [{"lam": lam, **_figure_stats(runs("PerAda", lam=lam))} for lam in protocol.lambdas]


def _table4(runs, data, protocol):
    """Sample-level DP (Table 4): Local-test of PerAda and PerAda w/o KD at target epsilons."""
    from ebfl.perada.dp import calibrate_noise_multiplier

    rows = []
    n_train = data.federated.n_train.numpy()
    batch = int(min(protocol.batch_size, n_train.min()))
    for name in ("PerAda w/o KD", "PerAda"):
        rows.append({"algorithm": name, "epsilon_target": None, **_dp_stats(runs(name))})
        for eps in protocol.dp_epsilons:
            # calibrated for a client that trains in every round: the reported epsilons,
            # from the rounds each client really trained in, are at most the target
            with quiet_absl():
                z = calibrate_noise_multiplier(eps, protocol.delta, n_train=n_train,
                                               n_rounds=protocol.n_rounds,
                                               local_steps=protocol.local_steps,
                                               expected_batch=batch).noise_multiplier
            dp = {"clip": protocol.dp_clip, "noise_multiplier": z, "expected_batch": batch}
            rows.append({"algorithm": name, "epsilon_target": eps, "noise_multiplier": z,
                         **_dp_stats(runs(name, dp=dp))})
    return rows


def _dp_stats(runs):
    stats = {"local_test": float(np.mean([r["report"]["local"]["mean"] for r in runs])),
             "local_test_std": float(np.mean([r["report"]["local"]["std"] for r in runs]))}
    eps = [r["privacy"]["epsilon"] for r in runs if "privacy" in r]
    if eps:
        e = np.asarray(eps[0], dtype=np.float64)
        stats.update(epsilon_mean=float(e.mean()), epsilon_std=float(e.std()))
    return stats


#: Our row names -> (the paper's algorithm, personalization) in its Table 1.
_PAPER_ROWS = {"FedAlt (input)": ("FedAlt", "Input layer"), "FedSim (input)": ("FedSim",
                                                                              "Input layer"),
               "FedAlt (output)": ("FedAlt", "Output layer"),
               "FedSim (output)": ("FedSim", "Output layer"),
               "FedAlt (adapter)": ("FedAlt", "Adapter"), "FedSim (adapter)": ("FedSim",
                                                                               "Adapter")}
_PAPER_COLUMNS = {"Local-test": "local_test", "Global-test": "global_test",
                  "CIFAR-10.1": "cifar10_1", "CIFAR-10-C": "cifar10_c"}


def _paper_numbers():
    """The paper's CIFAR-10 columns of Tables 1 and 2 and its Table 4, keyed by our rows."""
    from ebfl.perada.data import perada_paper_numbers

    t1 = perada_paper_numbers(1)
    t1 = t1[t1["dataset"] == "CIFAR-10"]
    table1 = {}
    for name, part in TABLE1_METHODS:
        algo, pers = _PAPER_ROWS.get(name, (name, part))
        rows = t1[(t1["algorithm"] == algo) & (t1["personalization"] == pers)]
        table1[name] = {_PAPER_COLUMNS[c]: float(m) for c, m in zip(rows["column"], rows["mean"],
                                                                   strict=True)}
    t2 = perada_paper_numbers(2)
    table2 = {}
    for algo, rows in t2.groupby("algorithm", sort=False):
        table2[algo] = {_PAPER_COLUMNS[c]: float(m) for c, m in zip(rows["column"], rows["mean"],
                                                                   strict=True)}
    t4 = perada_paper_numbers(4)
    table4 = t4[["algorithm", "epsilon", "epsilon_std", "mean", "std"]].to_dict(orient="records")
    return {"setting": "CIFAR-10, ResNet-18 pretrained on ImageNet (Table 4: ViT-S/16)",
            "table1": table1, "table2": table2, "table4": table4}


def plot_perada(result, path):
    """Figures of a reproduction: Table 1's accuracies per method, Figure 4 (distillation
    steps and data) and Figure 7 (lambda), those present in ``result``.

    Parameters
    ----------
    result : dict
        From :func:`reproduce_perada`.
    path : path-like
        The PNG to write.

    Returns
    -------
    str
        The path written.
    """
    if not isinstance(result, Mapping):
        raise TypeError(f"result must be the dict of reproduce_perada, got "
                        f"{type(result).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a path, got {type(path).__name__}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("table1", "figure4", "figure7") if result.get(p)]
    if not panels:
        raise ValueError("result has none of table1, figure4, figure7 to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        rows = result[panel]
        if panel == "table1":
            names = [r["algorithm"] for r in rows]
            pos = np.arange(len(rows))
            for i, (key, label) in enumerate((("local_test", "Local-test"),
                                              ("global_test", "Global-test"),
                                              ("ood", "OOD (corruptions)"))):
                ax.bar(pos + (i - 1) * 0.27, [r[key] for r in rows], 0.27, label=label)
            ax.set_xticks(pos, names, rotation=70, ha="right", fontsize=7)
            ax.set_ylabel("personalized accuracy (%)")
            ax.set_title("Table 1 analogue (mean over clients)")
        elif panel == "figure4":
            labels = [f"{r['kd_data']}\nR={r['kd_steps']}" for r in rows]
            pos = np.arange(len(rows))
            for i, (key, label) in enumerate((("global_test", "personalized, Global-test"),
                                              ("ood", "personalized, OOD"),
                                              ("global_model", "global model, Global-test"))):
                ax.bar(pos + (i - 1) * 0.27, [r[key] or 0 for r in rows], 0.27, label=label)
            ax.set_xticks(pos, labels, fontsize=7)
            ax.set_ylabel("accuracy (%)")
            ax.set_title("Figure 4 analogue: distillation steps and data")
        else:
            lams = [r["lam"] for r in rows]
            for key, label in (("local_test", "Local-test"), ("global_test", "Global-test"),
                               ("ood", "OOD")):
                ax.plot(lams, [r[key] for r in rows], "o-", label=label)
            ax.set_xscale("log")
            ax.set_xlabel("lambda")
            ax.set_ylabel("personalized accuracy (%)")
            twin = ax.twinx()
            twin.plot(lams, [r["prediction_distance"] for r in rows], "k--",
                      label="prediction distance")
            twin.set_ylabel("prediction distance to the global model")
            ax.set_title("Figure 7 analogue: lambda")
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    scale = "quick pipeline check" if result.get("quick") else "CPU scale"
    fig.suptitle(f"PerAda on {result.get('dataset')} ({scale}; not the paper's CIFAR-10 "
                 "setting)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
