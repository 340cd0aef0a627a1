"""Contract test of PerAda's surface: every public callable refuses bad input by name.

The corpus (:class:`~tests.badinput.Case`) covers the adapters, pretraining,
PerAda and its DP variant, the generalization metrics and the experiment
drivers, on tiny models (one block of 4 channels, 8 x 8 images, 4 classes);
the regression tests below it pin the reported examples: NaN weights, bad
distillation labels and shapes, unreadable ``--backbone-weights`` files, and
sizes refused before any data are loaded.
"""

from __future__ import annotations

import functools
from dataclasses import asdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ebfl.cli import main  # noqa: E402
from ebfl.learning.torch import FederatedDataset, train  # noqa: E402
from ebfl.learning.torch.adapters import (  # noqa: E402
    AdapterBlock,
    ResNet18Adapters,
    SmallResNet,
    load_torchvision_weights,
    parameter_counts,
    parameter_groups,
    split_state,
)
from ebfl.learning.torch.distillation import (  # noqa: E402
    distill,
    ensemble_logits,
    frozen_batchnorm_eval,
    kd_batches,
)
from ebfl.learning.torch.functional import model_state, replicate  # noqa: E402
from ebfl.learning.torch.partial import FedAlt, FedBN, FedRep, FedSim, LGFedAvg  # noqa: E402
from ebfl.learning.torch.pretrain import load_backbone, pretrained_backbone  # noqa: E402
from ebfl.perada import experiment  # noqa: E402
from ebfl.perada.algorithm import PerAda  # noqa: E402
from ebfl.perada.data import (  # noqa: E402
    perada_cifar10,
    perada_mnist,
    perada_paper_numbers,
    synthetic_perada,
)
from ebfl.perada.dp import (  # noqa: E402
    DPDitto,
    DPPerAda,
    batchnorm_eval,
    calibrate_noise_multiplier,
    client_epsilons,
    client_sampling_rates,
)
from ebfl.perada.experiment import PerAdaProtocol, plot_perada, reproduce_perada  # noqa: E402
from ebfl.perada.generalization import (  # noqa: E402
    check_inequalities,
    ensemble_distance,
    generalization_report,
    prediction_distance,
    soft_error,
    zero_one_error,
)
from tests.badinput import NAN, Case, table_tests  # noqa: E402

N_CLASSES = 4


# ----------------------------------------------------------------------------- inputs

def _net(**kw):
    """A tiny SmallResNet with adapters, fed 8 x 8 one-channel images, 4 classes."""
    torch.manual_seed(0)
    return SmallResNet(N_CLASSES, 1, widths=(4,), dropout=0.0, **kw)


def _plain():
    torch.manual_seed(1)
    return SmallResNet(N_CLASSES, 1, widths=(4,), adapters=False)


def _pretrained():
    return model_state(_net())


def _aux(n=6, side=8, channels=1):
    g = torch.Generator().manual_seed(2)
    return torch.rand((n, channels, side, side), generator=g)


def _labels(*values):
    return torch.tensor(values, dtype=torch.int64)


def _validation():
    return (_aux(4), _labels(0, 1, 2, 3))


def _with(state, name, value):
    """A copy of ``state`` with ``state[name]``'s first entry set to ``value``."""
    out = {k: v.clone() for k, v in state.items()}
    out[name].view(-1)[0] = value
    return out


def _without(state, name):
    return {k: v for k, v in state.items() if k != name}


def _probs(shape, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(shape, generator=g), -1)


@functools.cache
def _fed_data(side=8):
    rng = np.random.default_rng(0)
    xs = [rng.random((6, 1, side, side), dtype=np.float32) for _ in range(2)]
    ys = [np.arange(6) % N_CLASSES for _ in range(2)]
    return FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=N_CLASSES)


@functools.cache
def _perada_data():
    return synthetic_perada(n_clients=2, n_train=120, n_test=40, n_aux=8, corruptions=None,
                            seed=0)


# ----------------------------------------------------------------------------- adapters

def _n_params(cls):
    def call(**kw):
        return sum(p.numel() for p in cls(**kw).parameters())

    return call


def _groups(model):
    return parameter_groups(model)


def _split(model, names):
    selected, rest = split_state(model, names)
    return sorted(selected), sorted(rest)


def _load(state):
    """load_backbone into a fresh model (the model is modified in place by design)."""
    model = _net()
    report = load_backbone(model, state)
    return report.loaded, model_state(model)


def _plain_state():
    return model_state(_plain())


ADAPTERS = [
    Case("AdapterBlock", _n_params(AdapterBlock), lambda: dict(channels=4, dropout=0.25, salt=1),
         scalars={"channels": "size", "dropout": "probability"},
         bad=(("dropout", 1.0, ValueError), ("salt", -1, ValueError), ("salt", 2**31, ValueError),
              ("salt", 1.5, TypeError), ("channels", 2**20, ValueError, "channels=1048576"))),
    Case("SmallResNet", _n_params(SmallResNet),
         lambda: dict(n_classes=3, in_channels=2, widths=(4, 4), adapters=True, dropout=0.0),
         scalars={"n_classes": "size", "in_channels": "size", "adapters": "bool",
                  "dropout": "probability"},
         bad=(("widths", "abc", TypeError), ("widths", (), ValueError),
              ("widths", (4, 0), ValueError), ("widths", (2.5,), TypeError),
              ("widths", (2**15, 2**15), ValueError, "widths"), ("dropout", 1.0, ValueError))),
    # building ResNet-18 takes a while: only its refusals, which come before any layer
    Case("ResNet18Adapters", _n_params(ResNet18Adapters), lambda: dict(n_classes=10),
         valid=False, scalars={"n_classes": "size", "in_channels": "size", "adapters": "bool",
                               "dropout": "probability"},
         bad=(("in_channels", 2**20, ValueError, "in_channels"),)),
    Case("parameter_groups", _groups, lambda: dict(model=_net()),
         bad=(("model", "net", TypeError), ("model", torch.nn.Linear(2, 2), TypeError))),
    Case("parameter_counts", parameter_counts, lambda: dict(model=_net()),
         bad=(("model", None, TypeError),)),
    Case("split_state", _split, lambda: dict(model=_net(), names=["fc.weight", "fc.bias"]),
         bad=(("names", "fc.weight", TypeError), ("names", ["nope"], ValueError),
              ("names", [3], TypeError), ("model", 3, TypeError))),
    Case("load_backbone", _load, lambda: dict(state=_plain_state()),
         bad=(("state", _with(_plain_state(), "conv1.weight", NAN), ValueError,
               r"state\['conv1.weight'\].*NaN"),
              ("state", _with(_plain_state(), "layer1.0.bn1.running_var", float("inf")),
               ValueError, r"state\['layer1.0.bn1.running_var'\]"),
              ("state", _without(_plain_state(), "conv1.weight"), ValueError, "missing"),
              ("state", {**_plain_state(), "extra.weight": torch.zeros(2)}, ValueError,
               "unknown"),
              ("state", {**_plain_state(), "conv1.weight": torch.zeros(4, 1, 5, 5)}, ValueError,
               r"state\['conv1.weight'\] has shape"),
              ("state", {**_plain_state(), "conv1.weight": torch.zeros(4, 1, 3, 3,
                                                                       dtype=torch.int64)},
               ValueError, r"state\['conv1.weight'\].*floating"),
              ("state", {**_plain_state(), "conv1.weight": [0.0]}, TypeError),
              ("state", {**_plain_state(), 3: torch.zeros(1)}, TypeError),
              ("state", [1, 2], TypeError), ("state", model_state(_net()), ValueError,
                                              "unknown"))),
]
table_tests(ADAPTERS, "adapters", globals())


# ----------------------------------------------------------------------------- PerAda

def _config(cls):
    def call(**kw):
        return cls(**kw).config()

    return call


def _perada_kw():
    return dict(model=_net(), pretrained=_pretrained(), lr=0.05, aux=_aux(), kd_steps=2,
                kd_validation=_validation())


PRETRAINED_BAD = (
    ("pretrained", [1], TypeError),
    ("pretrained", _with(_pretrained(), "conv1.weight", NAN), ValueError,
     r"pretrained\['conv1.weight'\].*NaN"),
    ("pretrained", _with(_pretrained(), "fc.weight", float("inf")), ValueError,
     r"pretrained\['fc.weight'\]"),
    ("pretrained", _with(_pretrained(), "layer1.0.adapter1.conv.weight", NAN), ValueError,
     r"pretrained\['layer1.0.adapter1.conv.weight'\]"),
    ("pretrained", _without(_pretrained(), "conv1.weight"), ValueError, "lacks frozen"),
    ("pretrained", {**_pretrained(), "head.weight": torch.zeros(2)}, ValueError,
     r"pretrained.*head\.weight"),
    ("pretrained", {**_pretrained(), "conv1.weight": torch.zeros(4, 1, 5, 5)}, ValueError,
     r"pretrained\['conv1.weight'\] has shape"),
    ("pretrained", {**_pretrained(), "conv1.weight": torch.zeros(4, 1, 3, 3, dtype=torch.int32)},
     TypeError, r"pretrained\['conv1.weight'\]"),
    ("pretrained", {**_pretrained(), 7: torch.zeros(1)}, TypeError),
)

_AUX_NAN = _with({"aux": _aux()}, "aux", NAN)["aux"]

PERADA = [
    Case("PerAda", _config(PerAda), _perada_kw,
         scalars={"lr": "positive", "lr_personal": "positive", "lam": "nonnegative",
                  "kd_lr": "positive", "kd_batch_size": "count", "kd_eval_every": "count",
                  "weight_decay": "nonnegative"},
         bad=(*PRETRAINED_BAD,
              ("model", "net", TypeError), ("kd_steps", -1, ValueError),
              ("kd_steps", 1.5, TypeError), ("kd_steps", 10**7, ValueError),
              ("kd_optimizer", "rmsprop", ValueError), ("temperature", 0.0, ValueError),
              ("temperature", NAN, ValueError), ("temperature", 1e6, ValueError),
              ("temperature", "1", TypeError), ("kd_rounds", -1, ValueError),
              ("kd_patience", 0, ValueError), ("trainable", "fc.weight", TypeError),
              ("trainable", ["nope"], ValueError), ("trainable", [3], TypeError),
              ("aux", _aux().numpy(), TypeError), ("aux", _aux().long(), TypeError),
              ("aux", _AUX_NAN, ValueError, "aux"),
              ("aux", _aux(channels=3), ValueError, r"aux: model does not accept"),
              ("aux", torch.zeros(0, 1, 8, 8), ValueError), ("aux", torch.zeros(8), ValueError),
              ("kd_validation", (_aux(2), _labels(9, 99)), ValueError,
               r"kd_validation\[1\] \(y\).*\[0, 3\]"),
              ("kd_validation", (_aux(2), _labels(-1, 0)), ValueError, "kd_validation"),
              ("kd_validation", (_aux(2), torch.tensor([0.0, 1.0])), TypeError,
               "kd_validation"),
              ("kd_validation", (_aux(2), _labels(0, 1, 2)), ValueError, "kd_validation"),
              ("kd_validation", (_aux(2, side=5), _labels(0, 1)), ValueError,
               r"kd_validation\[0\].*aux's"),
              ("kd_validation", (_AUX_NAN[:2], _labels(0, 1)), ValueError, "kd_validation"),
              ("kd_validation", _aux(2), TypeError, "kd_validation"),
              ("kd_validation", (_aux(2), [0, 1]), TypeError, "kd_validation"))),
    Case("PerAda-patience", _config(PerAda),
         lambda: dict(model=_net(), pretrained=_pretrained(), aux=_aux(), kd_patience=2),
         valid=False, bad=(("kd_patience", 2, ValueError, "kd_validation"),)),
    Case("DPPerAda", _config(DPPerAda),
         lambda: dict(model=_net(), pretrained=_pretrained(), clip=1.0, noise_multiplier=1.0,
                      sampling_rate=0.5),
         scalars={"clip": "positive", "sampling_rate": "positive"},
         bad=(*PRETRAINED_BAD[:3], ("noise_multiplier", 1e-5, ValueError),
              ("noise_multiplier", -1.0, ValueError), ("noise_multiplier", NAN, ValueError),
              ("sampling_rate", 1.5, ValueError), ("expected_batch", 4.0, ValueError),
              ("sampling_rate", None, ValueError, "exactly one"))),
    Case("DPDitto", _config(DPDitto),
         lambda: dict(model=_plain(), clip=1.0, noise_multiplier=0.5, expected_batch=4.0),
         scalars={"clip": "positive", "expected_batch": "positive"},
         bad=(("model", "net", TypeError), ("noise_multiplier", "1", TypeError),
              ("sampling_rate", 0.5, ValueError, "exactly one"))),
]
table_tests(PERADA, "perada", globals())


def _plain_pretrained():
    return model_state(_plain())


PARTIAL_PRETRAINED_BAD = (
    ("pretrained", [1], TypeError),
    ("pretrained", _with(_plain_pretrained(), "conv1.weight", NAN), ValueError,
     r"pretrained\['conv1.weight'\].*NaN"),
    ("pretrained", {**_plain_pretrained(), "head.weight": torch.zeros(2)}, ValueError,
     r"pretrained.*head\.weight"),
    ("pretrained", {**_plain_pretrained(), 7: torch.zeros(1)}, TypeError),
    ("pretrained", {**_plain_pretrained(), "fc.bias": torch.zeros(4, dtype=torch.int64)},
     TypeError, r"pretrained\['fc.bias'\]"),
)

PARTIAL = [
    Case("FedAlt", _config(FedAlt),
         lambda: dict(model=_plain(), personal="output", pretrained=_plain_pretrained(),
                      lr=0.05),
         scalars={"lr": "nonnegative", "lr_personal": "nonnegative",
                  "weight_decay": "nonnegative"},
         bad=(*PARTIAL_PRETRAINED_BAD, ("model", "net", TypeError),
              ("personal", "head", ValueError), ("personal", ["nope"], ValueError),
              ("personal", [3], TypeError), ("personal", 3, TypeError),
              ("personal", [], ValueError), ("personal_steps", -1, ValueError),
              ("personal_steps", 1.5, TypeError), ("frozen", "output", ValueError),
              ("frozen", ["bn1.weight"], ValueError, "frozen"),
              ("frozen", "sideways", ValueError))),
    Case("FedAlt-frozen", _config(FedAlt),
         lambda: dict(model=_plain(), personal="output", frozen="input",
                      pretrained=_plain_pretrained()),
         bad=(("pretrained", None, ValueError, "pretrained"),
              ("pretrained", _without(_plain_pretrained(), "conv1.weight"), ValueError,
               "pretrained lacks frozen"),
              ("pretrained", {**_plain_pretrained(), "conv1.weight": torch.zeros(4, 1, 5, 5)},
               ValueError, r"pretrained\['conv1.weight'\] has shape"))),
    Case("FedSim", _config(FedSim),
         lambda: dict(model=_net(), personal="adapter", pretrained=_pretrained()),
         scalars={"lr": "nonnegative"}, bad=(("personal", None, TypeError),)),
    Case("FedRep", _config(FedRep), lambda: dict(model=_plain(), head_steps=2),
         scalars={"lr": "nonnegative", "lr_head": "nonnegative"},
         bad=(("head_steps", -1, ValueError), ("head", "tail", ValueError),
              *PARTIAL_PRETRAINED_BAD[:2])),
    Case("FedBN", _config(FedBN), lambda: dict(model=_plain()),
         scalars={"lr": "nonnegative", "weight_decay": "nonnegative"},
         bad=(("model", torch.nn.Linear(2, 2), ValueError, "BatchNorm"),
              *PARTIAL_PRETRAINED_BAD[:2])),
    Case("LGFedAvg", _config(LGFedAvg), lambda: dict(model=_plain()),
         scalars={"lr": "nonnegative", "lr_personal": "nonnegative"},
         bad=(("personal", "all", ValueError), *PARTIAL_PRETRAINED_BAD[:2])),
]
table_tests(PARTIAL, "partial", globals())


def _distill(**kw):
    student, info = distill(**kw)
    return student, info


def _student():
    return model_state(_net())


def _teacher():
    g = torch.Generator().manual_seed(4)
    return torch.randn((6, N_CLASSES), generator=g)


def _batches():
    return [_labels(0, 1, 2, 3), _labels(4, 5, 0, 1)]


def _distill_kw():
    return dict(model=_net(), student=_student(), teacher_logits=_teacher(), aux=_aux(), steps=2,
                lr=0.05, batch_size=4, batches=_batches(), validation=_validation())


def _ensemble(**kw):
    return ensemble_logits(**kw)


def _kd_batches(n, steps, batch_size, seed=0):
    return kd_batches(n, steps, batch_size, torch.Generator().manual_seed(seed))


def _modes(model, trainable):
    with frozen_batchnorm_eval(model, trainable) as m:
        return [mod.training for mod in m.modules()]


def _bn_modes(model):
    with batchnorm_eval(model) as m:
        return [mod.training for mod in m.modules()]


DISTILLATION = [
    Case("distill", _distill, _distill_kw,
         scalars={"lr": "rate", "eval_every": "count"},
         bad=(("model", "net", TypeError), ("student", [1], TypeError),
              ("student", _with(_student(), "fc.weight", NAN), ValueError,
               r"student\['fc.weight'\].*NaN"),
              ("student", {"nope": torch.zeros(1)}, ValueError, "student"),
              ("student", {"fc.weight": torch.zeros(3, 3)}, ValueError, r"student\['fc.weight'\]"),
              ("student", {}, ValueError, "student"),
              ("teacher_logits", torch.zeros(6, 3), ValueError, "teacher_logits"),
              ("teacher_logits", torch.zeros(5, N_CLASSES), ValueError, "teacher_logits"),
              ("teacher_logits", torch.full((6, N_CLASSES), NAN), ValueError, "teacher_logits"),
              ("teacher_logits", torch.zeros(6, N_CLASSES, dtype=torch.int64), TypeError,
               "teacher_logits"),
              ("aux", _aux(channels=3), ValueError, "aux"), ("aux", "x", TypeError),
              ("steps", 3, ValueError, "steps"), ("steps", -1, ValueError),
              ("batch_size", 0, ValueError), ("temperature", 0.0, ValueError),
              ("optimizer", "lbfgs", ValueError), ("generator", "g", TypeError),
              ("batches", [_labels(0, 99)], ValueError, r"batches\[0\]"),
              ("batches", [torch.tensor([0.0, 1.0])], TypeError, r"batches\[0\]"),
              ("batches", [_labels()], ValueError, r"batches\[0\]"),
              ("batches", "ab", TypeError, "batches"),
              ("validation", (_aux(2), _labels(9, 99)), ValueError, r"validation\[1\]"),
              ("patience", 0, ValueError), ("frozen", [1], TypeError),
              ("frozen", {"conv1.weight": torch.full((4, 1, 3, 3), NAN)}, ValueError,
               r"frozen\['conv1.weight'\]"))),
    Case("distill-patience", _distill, lambda: {**_distill_kw(), "validation": None},
         valid=False, bad=(("patience", 2, ValueError, "validation"),)),
    Case("distill-drawn", _distill, lambda: {**_distill_kw(), "batches": None},
         valid=False,
         bad=(("batch_size", 7, ValueError, "batch_size"), ("steps", 10**7, ValueError))),
    Case("ensemble_logits", _ensemble,
         lambda: dict(model=_net(), teachers=replicate(_student(), 2), x=_aux()),
         scalars={"chunk": "count"},
         bad=(("teachers", _student(), ValueError, r"teachers\['"),
              ("teachers", {"fc.bias": torch.full((2, N_CLASSES), NAN)}, ValueError,
               r"teachers\['fc.bias'\]"),
              ("teachers", {"fc.bias": torch.zeros(2, N_CLASSES),
                            "fc.weight": torch.zeros(3, N_CLASSES, 4)}, ValueError, "teachers"),
              ("x", torch.zeros(2, 1, 8, 8, dtype=torch.int64), TypeError, "x"),
              ("x", torch.full((2, 1, 8, 8), NAN), ValueError, "x"),
              ("frozen", {"conv1.weight": torch.full((4, 1, 3, 3), NAN)}, ValueError, "frozen"),
              ("model", 1, TypeError))),
    Case("kd_batches", _kd_batches, lambda: dict(n=6, steps=3, batch_size=4),
         scalars={"n": "size", "batch_size": "size"},
         bad=(("batch_size", 7, ValueError), ("steps", -1, ValueError),
              ("steps", 1.5, TypeError), ("steps", 10**7, ValueError))),
    Case("kd_batches-generator", kd_batches,
         lambda: dict(n=6, steps=3, batch_size=4, generator=None), valid=False,
         bad=(("generator", np.random.default_rng(0), TypeError),)),
    Case("frozen_batchnorm_eval", _modes, lambda: dict(model=_net(), trainable=["bn1.weight"]),
         bad=(("trainable", "bn1.weight", TypeError), ("trainable", ["nope"], ValueError),
              ("trainable", [1], TypeError), ("model", "m", TypeError))),
    Case("batchnorm_eval", _bn_modes, lambda: dict(model=_net()),
         bad=(("model", "m", TypeError),)),
]
table_tests(DISTILLATION, "distillation", globals())


# ----------------------------------------------------------------------------- accounting

ACCOUNTING = [
    Case("client_sampling_rates", client_sampling_rates,
         lambda: dict(n_train=np.array([40, 80]), sampling_rate=0.25), counts=("n_train",),
         scalars={"sampling_rate": "probability"},
         bad=(("sampling_rate", 0.0, ValueError), ("expected_batch", 8.0, ValueError),
              ("n_train", [0, 5], ValueError), ("n_train", [], TypeError),
              ("n_train", [[40, 80]], TypeError))),
    Case("client_sampling_rates-batch", client_sampling_rates,
         lambda: dict(n_train=np.array([40, 80]), expected_batch=8.0),
         scalars={"expected_batch": "positive"},
         bad=(("expected_batch", 50.0, ValueError, "expected_batch=50 exceeds"),)),
    Case("client_epsilons", client_epsilons,
         lambda: dict(n_train=np.array([40, 80]), noise_multiplier=1.0, n_rounds=2, local_steps=1,
                      delta=1e-5, sampling_rate=0.25),
         counts=("n_train",), scalars={"local_steps": "count"},
         bad=(("n_rounds", -1, ValueError), ("n_rounds", 1.5, TypeError),
              ("delta", 0.0, ValueError), ("delta", 1.0, ValueError), ("delta", NAN, ValueError),
              ("noise_multiplier", -1.0, ValueError), ("accountant", "moments", ValueError),
              ("participated", [3, 1], ValueError), ("participated", [1], ValueError),
              ("participated", [0.5, 1], ValueError))),
    Case("calibrate_noise_multiplier", calibrate_noise_multiplier,
         lambda: dict(epsilon=4.0, delta=1e-5, n_train=np.array([40, 80]), n_rounds=2,
                      local_steps=1, expected_batch=8.0),
         valid=False, counts=("n_train",),
         scalars={"epsilon": "positive", "local_steps": "count", "n_rounds": "count"},
         bad=(("delta", 0.0, ValueError), ("accountant", "moments", ValueError),
              ("expected_batch", 41.0, ValueError))),
]
table_tests(ACCOUNTING, "accounting", globals())


# ----------------------------------------------------------------------------- metrics

def _report_kw():
    net = _net()
    return dict(strategy=PerAda(net, model_state(net)), server={}, clients={},
                data=_fed_data(), global_test=(_aux(4), _labels(0, 1, 2, 3)))


METRICS = [
    Case("soft_error", soft_error, lambda: dict(probs=_probs((2, 3, 4)), y=_labels(0, 1, 3)),
         bad=(("probs", _probs((3, 4)) - 1, ValueError, "probs"),
              ("probs", torch.full((3, 4), NAN), ValueError, "probs"),
              ("probs", _probs((4,)), ValueError, "probs"), ("probs", [0.5], TypeError),
              ("y", _labels(0, 1, 9), ValueError, r"y must hold labels in \[0, 3\]"),
              ("y", torch.tensor([0.0, 1.0, 2.0]), TypeError), ("y", _labels(0, 1), ValueError),
              ("y", np.array([0, 1, 2]), TypeError))),
    Case("zero_one_error", zero_one_error, lambda: dict(probs=_probs((3, 4)), y=_labels(0, 1, 3)),
         bad=(("y", _labels(-1, 1, 3), ValueError), ("probs", _probs((3, 4)) * 2, ValueError))),
    Case("ensemble_distance", ensemble_distance,
         lambda: dict(member_probs=_probs((2, 3, 4)), global_probs=_probs((3, 4), 5)),
         bad=(("member_probs", _probs((3, 4)), ValueError, "member_probs"),
              ("member_probs", _probs((2, 3, 5)), ValueError, "member_probs"),
              ("global_probs", _probs((2, 3, 4)), ValueError, "global_probs"),
              ("global_probs", torch.full((3, 4), NAN), ValueError, "global_probs"))),
    Case("prediction_distance", prediction_distance,
         lambda: dict(personal_probs=_probs((2, 3, 4)), global_probs=_probs((3, 4), 5)),
         bad=(("personal_probs", _probs((2, 2, 4)), ValueError, "personal_probs"),
              ("global_probs", "g", TypeError))),
    Case("check_inequalities", check_inequalities,
         lambda: dict(personal_probs=_probs((2, 3, 4)), global_probs=_probs((2, 3, 4))[0],
                      y=_labels(0, 1, 3)),
         scalars={"tol": "nonnegative"},
         bad=(("y", _labels(0, 1, 4), ValueError, "y"), ("y", _labels(0, 1), ValueError),
              ("members", _probs((2, 3, 5)), ValueError, "members"),
              ("personal_probs", _probs((3, 4)), ValueError, "personal_probs"))),
    Case("generalization_report", generalization_report, _report_kw, valid=False,
         bad=(("strategy", "alg", TypeError), ("data", "d", TypeError),
              ("server", [], TypeError, "server"), ("clients", None, TypeError, "clients"),
              ("global_test", (_aux(2), _labels(9, 99)), ValueError,
               r"global_test\[1\] \(y\)"),
              ("global_test", (_aux(2, side=5), _labels(0, 1)), ValueError, r"global_test\[0\]"),
              ("global_test", (torch.full((2, 1, 8, 8), NAN), _labels(0, 1)), ValueError,
               "global_test"),
              ("global_test", _aux(2), TypeError, "global_test"),
              ("ood", {"fog": (_aux(2, side=5), _labels(0, 1))}, ValueError, r"ood\['fog'\]"),
              ("ood", [(_aux(2), _labels(0, 1))], TypeError, "ood"),
              ("aux", _aux(2, side=5), ValueError, "aux"), ("chunk", 0, ValueError))),
]
table_tests(METRICS, "metrics", globals())


# ----------------------------------------------------------------------------- experiments

def _protocol(**kw):
    return asdict(PerAdaProtocol(**kw))


def _paper_table(table):
    return perada_paper_numbers(table).to_dict("list")


def _run_kw():
    return dict(name="PerAda", data=_perada_data(), protocol=experiment.QUICK, backbone=None)


EXPERIMENTS = [
    Case("PerAdaProtocol", _protocol, lambda: dict(n_clients=6, clients_per_round=3, n_rounds=3),
         scalars={"n_clients": "size", "lr": "positive", "lam": "nonnegative",
                  "dropout": "probability", "delta": "open_unit", "kd_lr": "positive",
                  "dp_clip": "positive", "local_steps": "count", "batch_size": "count"},
         bad=(("n_rounds", 0, ValueError), ("n_rounds", 10**7, ValueError),
              ("clients_per_round", 7, ValueError, "clients_per_round"),
              ("kd_optimizer", "rmsprop", ValueError), ("alpha", 0.0, ValueError),
              ("n_aux", -1, ValueError), ("dp_epsilons", (), ValueError),
              ("dp_epsilons", "1", TypeError), ("dp_epsilons", (0.0,), ValueError),
              ("lambdas", (-1.0,), ValueError), ("kd_step_grid", (1.5,), TypeError),
              ("kd_steps", 10**7, ValueError), ("pretrain_n_train", 0, ValueError))),
    Case("reproduce_perada", reproduce_perada,
         lambda: dict(dataset="synthetic", quick=True, parts=("table1",)), valid=False,
         bad=(("dataset", "cifar", ValueError), ("quick", "yes", TypeError),
              ("progress", 1, TypeError), ("seeds", "0", TypeError), ("seeds", (), ValueError),
              ("seeds", (-1,), ValueError), ("seeds", (2**63,), ValueError),
              ("seeds", range(10**12), ValueError, "at most 10000"),
              ("seeds", (0.5,), TypeError), ("n_rounds", 0, ValueError),
              ("n_rounds", 10**12, ValueError, "n_rounds"), ("arch", "resnet50", ValueError),
              ("arch", "resnet18", ValueError, "arch"), ("parts", "table9", ValueError),
              ("parts", (), ValueError), ("checkpoint_dir", 3, TypeError),
              ("cache_dir", 3, TypeError), ("device", "tpu", ValueError),
              ("backbone_weights", "/nonexistent/weights.pth", ValueError,
               "backbone_weights is only used with arch 'resnet18'"))),
    Case("run_method", experiment.run_method, _run_kw, valid=False,
         bad=(("name", "Nope", ValueError), ("data", "d", TypeError),
              ("protocol", {}, TypeError), ("backbone", 3, TypeError),
              ("seed", -1, ValueError), ("seed", 2**64, ValueError), ("cache", 3, TypeError),
              ("progress", "no", TypeError), ("device", "tpu", ValueError))),
    Case("plot_perada", plot_perada, lambda: dict(result={"table1": []}, path="x.png"),
         valid=False,
         bad=(("result", "r", TypeError), ("path", 3, TypeError),
              ("result", {}, ValueError, "result"))),
    Case("synthetic_perada", synthetic_perada,
         lambda: dict(n_clients=2, n_train=60, n_test=20, n_aux=4, corruptions=None), valid=False,
         scalars={"n_clients": "size", "n_train": "size", "n_test": "size"},
         bad=(("alpha", 0.0, ValueError), ("server_fraction", 1.0, ValueError),
              ("corruptions", ["nope"], ValueError), ("seed", -1, ValueError),
              ("least_per_class", -1, ValueError), ("n_aux", -1, ValueError))),
    Case("perada_mnist", perada_mnist, lambda: dict(download=False), valid=False,
         bad=(("n_train", 60001, ValueError), ("n_test", 0, ValueError),
              ("n_aux", 10001, ValueError), ("download", "yes", TypeError),
              ("directory", 3, TypeError), ("severities", (6,), ValueError))),
    Case("perada_cifar10", perada_cifar10, lambda: dict(download=False), valid=False,
         bad=(("aux", "cifar", ValueError), ("cifar10_c", ["fog!"], ValueError),
              ("cifar10_c_severity", 6, ValueError), ("n_ood", 0, ValueError),
              ("download", "no", TypeError), ("directory", 3.5, TypeError))),
    Case("perada_paper_numbers", _paper_table, lambda: dict(table=1), finite=False,
         bad=(("table", 5, ValueError), ("table", True, TypeError), ("table", [1], TypeError))),
    Case("pretrained_backbone", pretrained_backbone,
         lambda: dict(data=(np.zeros((4, 8, 8), np.float32), np.arange(4),
                            np.zeros((4, 8, 8), np.float32), np.arange(4)), widths=(4,)),
         valid=False,
         scalars={"epochs": "count", "seed": "rng", "batch_size": "count", "lr": "positive",
                  "progress": "bool"},
         bad=(("dataset", "cifar", ValueError), ("arch", "resnet18", ValueError),
              ("widths", (0,), ValueError), ("widths", (2**15, 2**15), ValueError, "widths"),
              ("n_train", 0, ValueError), ("n_train", 5, ValueError),
              ("cache_dir", 3, TypeError),
              ("data", (np.full((4, 8, 8), NAN), np.arange(4), np.zeros((4, 8, 8)),
                        np.arange(4)), ValueError, r"data\[0\]"),
              ("data", (np.zeros((4, 8, 8)), np.array([0, 1, 2, 2**20]), np.zeros((4, 8, 8)),
                        np.arange(4)), ValueError, r"data\[1\]"),
              ("data", (np.zeros((4, 0, 8)), np.arange(4), np.zeros((4, 0, 8)), np.arange(4)),
               ValueError, r"data\[0\]"),
              ("data", (np.zeros((4, 8, 8)), np.arange(4)), TypeError, "data"),
              ("data", (np.zeros((4, 8, 8)), np.arange(3), np.zeros((4, 8, 8)), np.arange(4)),
               ValueError, "data"))),
]
table_tests(EXPERIMENTS, "experiments", globals())


# ----------------------------------------------------------------------------- regressions
# 1. NaN weights are refused by name before training.

def test_nan_pretrained_weights_are_refused_by_name_not_trained():
    net = _net()
    for name in ("conv1.weight", "layer1.0.bn1.running_mean", "fc.bias"):
        with pytest.raises(ValueError, match=rf"pretrained\['{name}'\] must be finite"):
            PerAda(net, _with(_pretrained(), name, NAN))
    with pytest.raises(ValueError, match=r"pretrained\['conv1.weight'\] must be finite"):
        FedAlt(_plain(), personal="output", pretrained=_with(model_state(_plain()),
                                                            "conv1.weight", NAN))
    with pytest.raises(ValueError, match=r"init_params\['conv1.weight'\]"):
        train(FedAlt(_plain(), personal="output"), _fed_data(), n_rounds=1, local_steps=1,
              batch_size=2, init_params=_with(model_state(_plain()), "conv1.weight", NAN))
    model = _net()
    before = model_state(model)
    with pytest.raises(ValueError, match=r"state\['layer1.0.conv2.weight'\] must be finite"):
        load_backbone(model, _with(_plain_state(), "layer1.0.conv2.weight", NAN))
    assert all(torch.equal(before[k], v) for k, v in model_state(model).items())  # nothing copied


# 2. Distillation labels and images must fit the model.

def test_distillation_labels_outside_the_classes_are_refused():
    with pytest.raises(ValueError, match=r"labels in \[0, 3\].*from 9 to 99"):
        PerAda(_net(), _pretrained(), aux=_aux(), kd_validation=(_aux(2), _labels(9, 99)))
    kw = _distill_kw()
    kw["validation"] = (_aux(2), _labels(9, 99))
    with pytest.raises(ValueError, match=r"validation\[1\] \(y\).*\[0, 3\]"):
        distill(**kw)


def test_auxiliary_images_of_another_size_are_refused_before_training():
    alg = PerAda(_net(), _pretrained(), aux=_aux(side=5), kd_steps=1)  # the model pools: it fits
    with pytest.raises(ValueError, match=r"aux must hold inputs shaped as the clients' "
                                         r"\(1, 8, 8\), got \(1, 5, 5\)"):
        train(alg, _fed_data(), n_rounds=1, local_steps=1, batch_size=2)
    with pytest.raises(ValueError, match=r"kd_validation\[0\] \(x\) must hold inputs shaped as "
                                         r"aux's"):
        PerAda(_net(), _pretrained(), aux=_aux(), kd_validation=(_aux(2, side=5), _labels(0, 1)))
    with pytest.raises(ValueError, match=r"aux: model does not accept inputs of shape \(3, 8, 8\)"):
        PerAda(_net(), _pretrained(), aux=_aux(channels=3))


def test_matching_auxiliary_images_train():
    alg = PerAda(_net(), _pretrained(), aux=_aux(), kd_steps=1, kd_validation=_validation())
    res = train(alg, _fed_data(), n_rounds=1, local_steps=1, batch_size=2)
    assert bool(torch.isfinite(torch.as_tensor(res.accuracy)).all()) and "kd" in res.server


# 3. Backbone weight files: every unreadable one gives one clear error naming its argument.

def _files(folder):
    rng = np.random.default_rng(0)
    torch.save(_plain_state(), folder / "small.pth")
    whole = (folder / "small.pth").read_bytes()
    nan_state = _with(_plain_state(), "conv1.weight", NAN)
    torch.save(nan_state, folder / "nan.pth")
    files = {"garbage": b"this is not a checkpoint\n" * 20,
             "random": bytes(rng.integers(0, 256, 4096, dtype=np.uint8)),
             "truncated": whole[: len(whole) // 2], "empty": b"",
             "pickled-list": None, "other-architecture": None}
    for name, body in files.items():
        if body is not None:
            (folder / f"{name}.pth").write_bytes(body)
    torch.save([1, 2, 3], folder / "pickled-list.pth")
    torch.save(model_state(SmallResNet(3, 1, widths=(4, 8), adapters=False)),
               folder / "other-architecture.pth")
    return folder


BAD_FILES = {"garbage": "cannot read", "random": "cannot read", "truncated": "cannot read",
             "empty": "cannot read", "pickled-list": "holds a list",
             "other-architecture": "another architecture", "nan": "must be finite",
             "missing": "does not exist"}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_backbone_file_is_one_value_error(kind, tmp_path):
    folder = _files(tmp_path)
    model = _net()
    with pytest.raises(ValueError, match=rf"^state.*{BAD_FILES[kind]}") as info:
        load_backbone(model, folder / f"{kind}.pth")
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


def test_the_small_backbone_loads_from_its_file(tmp_path):
    torch.save(_plain_state(), tmp_path / "small.pth")
    report = load_backbone(_net(), tmp_path / "small.pth")
    assert report.head_loaded and "conv1.weight" in report.loaded


@pytest.fixture(scope="module")
def resnet18():
    return ResNet18Adapters(10, adapters=False)


def test_torchvision_loader_names_its_argument_for_a_bad_file(resnet18, tmp_path):
    folder = _files(tmp_path)
    for kind in ("random", "truncated", "other-architecture"):
        with pytest.raises(ValueError, match=r"^weights"):
            load_torchvision_weights(resnet18, folder / f"{kind}.pth")


def _fails(capsys, argv):
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def no_data(monkeypatch):
    """Loading data or pretraining fails the test: refusals must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("data were loaded before the options were checked")

    monkeypatch.setattr(experiment, "load_data", forbidden)
    monkeypatch.setattr(experiment, "_backbone", forbidden)


@pytest.mark.parametrize("kind", [k for k in BAD_FILES if k != "nan"])
def test_cli_bad_backbone_weights_file(kind, tmp_path, capsys, no_data):
    folder = _files(tmp_path)
    line = _fails(capsys, ["reproduce", "perada", "--dataset", "cifar10", "--arch", "resnet18",
                           "--quick", "--backbone-weights", str(folder / f"{kind}.pth")])
    assert "--backbone-weights" in line and "Traceback" not in line


def test_cli_backbone_weights_with_the_small_architecture_is_refused(tmp_path, capsys, no_data):
    torch.save(_plain_state(), tmp_path / "small.pth")
    line = _fails(capsys, ["reproduce", "perada", "--dataset", "synthetic", "--quick",
                           "--arch", "small", "--backbone-weights", str(tmp_path / "small.pth")])
    assert "--backbone-weights is only used with --arch 'resnet18'" in line
    line = _fails(capsys, ["reproduce", "perada", "--dataset", "cifar10", "--arch", "resnet18",
                           "--quick"])
    assert "--arch 'resnet18' needs --backbone-weights" in line


@pytest.mark.parametrize("argv, option", [
    (["perada", "--dataset", "synthetic", "--seeds", str(10**12)], "--seeds"),
    (["perada", "--dataset", "synthetic", "--rounds", str(10**12)], "--rounds"),
    (["perada", "--dataset", "synthetic", "--seed", str(2**63)], "--seed"),
    (["fedhdp", "--dataset", "synthetic", "--seeds", str(10**12)], "--seeds"),
    (["fedhdp", "--dataset", "synthetic", "--rounds", str(10**12)], "--rounds"),
])
def test_cli_huge_sizes_are_refused_before_any_data(argv, option, capsys, no_data, monkeypatch):
    from ebfl.fedhdp import experiment as fedhdp

    monkeypatch.setattr(fedhdp, "load_federation", experiment.load_data)  # forbidden too
    line = _fails(capsys, ["reproduce", *argv, "--quick"])
    assert option in line


def test_cli_cache_dir_that_is_a_file_is_refused_before_any_data(tmp_path, capsys, no_data):
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "sub"):
        line = _fails(capsys, ["reproduce", "perada", "--dataset", "synthetic", "--quick",
                               "--cache-dir", str(path)])
        assert "--cache-dir" in line and "file" in line


def test_a_diverging_distillation_is_reported_not_silent():
    kw = {**_distill_kw(), "lr": 1e30, "steps": 4, "validation": None,
          "batches": [*_batches(), *_batches()]}
    with pytest.warns(RuntimeWarning, match="distillation diverged; lower lr"):
        distill(**kw)
