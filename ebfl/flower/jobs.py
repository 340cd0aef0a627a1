"""Named federated jobs: an algorithm, the clients' data and a run configuration, from scalars.

The Flower apps receive only scalars (a run's ``run_config``), and every
participant builds the same job from them: the server its half, each client
its half and its own data. ``ebfl flower simulate`` and the deployable app
(``ebfl flower app``) go through :func:`build_job`, and so does the in-process
comparison run, so the two runtimes run the very same configuration.

Settings (keys as in a Flower ``pyproject.toml``; all optional but ``algorithm``):

``algorithm``
    One of :data:`ALGORITHMS`.
``dataset``
    ``digits`` (scikit-learn's bundled 8x8 digits, split pathologically: each
    client holds 3 classes) for the learning algorithms; ``simulated`` (the
    default of the empirical-Bayes protocols) or ``elections`` (US counties as
    clients; needs the county-elections data) for ``eb-*``.
``clients``, ``n_rounds``, ``seed``, ``clients-per-round``
    The run (:class:`~ebfl.federated.RunConfig`). ``clients`` defaults to 6; on
    ``elections`` to every county (3150), and a smaller number takes the first
    counties.
``local-steps``, ``batch-size``, ``eval-every``, ``lr``
    The rest of the run (:class:`~ebfl.federated.RunConfig`) and the learning rate.
``clip``, ``noise``
    DP-AdaPeD / DP-FedEM: clip norm and noise standard deviation; ``fedhdp``
    (Algorithm 2 of the FedHDP paper): the initial clip norm S^0 and the private
    group's noise multiplier z (the unclipped count's noise sigma_b is 1).
``epsilon``
    Local privacy of the ``eb-*`` protocols, pure epsilon-LDP at the user level
    through the Laplace mechanism (omitted: non-private): Beta-Bernoulli clients
    release their means (the corrected estimator); Gaussian clients their means
    clipped to the paper's range, on ``simulated`` data only (its estimator needs
    the known sigma_x). ``eb-normal-means``: the clients release their means through
    the Gaussian mechanism at (``epsilon``, ``delta``)-LDP instead, on ``simulated``
    data only (see :func:`ebfl.federated.eb_normal_means.job_algorithm`).
``family``, ``delta``
    ``eb-normal-means`` (:class:`~ebfl.federated.EBNormalMeans`): the prior family
    of :func:`ebfl.ebnm` (default ``point_normal``), and the delta of its private
    variant (with ``epsilon``; default 1e-5).
``opt-out``, ``gamma2``, ``ratio``, ``lambda``
    ``fedhdp-point`` (Algorithm 1 of the FedHDP paper, on ``simulated`` clients):
    the fraction of non-private clients (default 0.5), the privacy-noise variance
    gamma^2 of the private average (default 1), the private clients' weight ratio r
    (default Lemma 1's r*) and lambda (default 1); see
    :func:`ebfl.fedhdp.point_estimation.job_algorithm`. ``fedhdp``: the clients
    with ids below ``opt-out`` x clients are non-private (default 0.5), r =
    ``ratio`` (default 0.1), lambda = ``lambda`` (default 0.005, Table 7).
``inner``, ``epsilon``, ``ratio``, ``lambda``
    ``dp-pfl`` (Algorithm 1 of DP-PFL, Hu et al., IEEE IoT J. 2020, on ``simulated``
    devices; one round is one global iteration): the Omega-step every ``inner``
    rounds (K, default 10), (``epsilon``, 1e-3)-DP per device (omitted:
    non-private), the budget split r = ``ratio`` (default 1) and lambda =
    ``lambda`` (default 0.1); see :func:`ebfl.dppfl.federated.job_algorithm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    INT64_MAX,
    check_choice,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
    check_real_scalar,
)
from ebfl.federated.protocol import (
    MAX_BATCH_SIZE,
    MAX_CLIENTS,
    MAX_LOCAL_STEPS,
    MAX_ROUNDS,
    MAX_SEED,
    RunConfig,
)

__all__ = ["ALGORITHMS", "DATASETS", "Job", "build_job", "digits_federation", "load_digits"]

#: Learning algorithms (torch, ``learning`` extra) and empirical-Bayes protocols (numpy).
LEARNING = ("fedavg", "local", "adaped", "adaped-ft", "dp-adaped", "fedavg-ft", "ditto",
            "pfedme", "perfedavg", "quped", "fml", "fedem", "dp-fedem", "fedhdp", "perada",
            "perada-nokd")
#: PerAda's jobs run a small residual network with adapters on the digits as 8x8 images.
PERADA = ("perada", "perada-nokd")
EB = ("eb-beta-binomial", "eb-gaussian", "eb-normal-means")
#: Algorithm 1 of the FedHDP paper (numpy; :mod:`ebfl.fedhdp.point_estimation`).
FEDHDP_POINT = ("fedhdp-point",)
#: Algorithm 1 of DP-PFL (numpy; :mod:`ebfl.dppfl.federated`).
DPPFL = ("dp-pfl",)
#: Every job's ``algorithm`` name.
ALGORITHMS = LEARNING + EB + FEDHDP_POINT + DPPFL
#: The values of the ``dataset`` setting.
DATASETS = ("digits", "simulated", "elections")

DEFAULTS = {"dataset": None, "clients": None, "rounds": 3, "seed": 0, "clients-per-round": None,
            "local-steps": 5, "batch-size": 10, "eval-every": 1, "lr": 0.1, "clip": 1.0,
            "noise": 0.1, "epsilon": None, "opt-out": None, "gamma2": None, "ratio": None,
            "lambda": None, "inner": None, "family": None, "delta": None}


@dataclass
class Job:
    """What both runtimes run: the algorithm, every client's data and the run's config."""

    algorithm: object
    data: object
    config: RunConfig
    settings: dict


def digits_federation(n_clients=6, *, seed=0, classes_per_client=3, images=False):
    """scikit-learn's digits (8x8, 1797 images) split among ``n_clients`` clients.

    Each client holds ``classes_per_client`` classes (a pathological split) and
    keeps a quarter of its images, stratified, for testing. Bundled with
    scikit-learn: no download. ``images``: samples of shape (8, 8) instead of (64,).
    """
    from ebfl.learning.partition import pathological, train_test_split_per_client
    from ebfl.learning.torch.data import FederatedDataset

    x, y = load_digits()
    x = (x / 16.0).astype(np.float32)
    if images:
        x = x.reshape(-1, 8, 8)
    rng = np.random.default_rng(seed)
    clients = pathological(y, n_clients, classes_per_client, rng=rng)
    train, test = train_test_split_per_client(y, clients, 0.25, rng=rng)
    return FederatedDataset.from_clients([x[i] for i in train], [y[i] for i in train],
                                         [x[i] for i in test], [y[i] for i in test],
                                         n_classes=10)


def load_digits():
    """scikit-learn's bundled digits, ``(x, y)``: x (1797, 64) in 0..16, y (1797,) int.

    Read as ``sklearn.datasets.load_digits(return_X_y=True)`` reads them (the same
    file, ``np.loadtxt``, the same arrays) but without importing scikit-learn, whose
    import pulls in SciPy: a deployed Flower node pays every import again in each
    task's fresh process. Falls back to scikit-learn where its file is not found.
    """
    import gzip
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("sklearn")  # locates the package without running its __init__
    path = None if spec is None or not spec.submodule_search_locations else \
        Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_digits

        return sklearn_digits(return_X_y=True)
    with open(path, "rb") as fh, gzip.open(fh, mode="rt", encoding="utf-8") as text:
        data = np.loadtxt(text, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int, copy=False)


def settings_of(settings):
    """``settings`` completed with :data:`DEFAULTS` (hyphens or underscores in keys)."""
    given = {str(k).replace("_", "-"): v for k, v in dict(settings).items()}
    unknown = sorted(set(given) - set(DEFAULTS) - {"algorithm"})
    if unknown:
        raise ValueError(f"unknown job settings {unknown}; known: "
                         f"{sorted(['algorithm', *DEFAULTS])}")
    out = {**DEFAULTS, **{k: v for k, v in given.items() if v is not None and v != ""}}
    out["algorithm"] = check_choice(given.get("algorithm"), "algorithm", ALGORITHMS)
    if out["dataset"] is None:
        out["dataset"] = "digits" if out["algorithm"] in LEARNING else "simulated"
    check_choice(out["dataset"], "dataset", DATASETS)
    if out["clients"] is None and out["dataset"] != "elections":  # elections: every county
        out["clients"] = 6
    if (out["algorithm"] in LEARNING) != (out["dataset"] == "digits"):
        kind = "learning" if out["algorithm"] in LEARNING else "empirical-Bayes"
        raise ValueError(f"dataset {out['dataset']!r} does not fit the {kind} algorithm "
                         f"{out['algorithm']!r}: learning algorithms take 'digits', the eb-* "
                         "protocols 'simulated' or 'elections'")
    return _typed(out)


#: Integer settings and their smallest values; the others below are positive reals.
INTEGERS = {"clients": 1, "rounds": 1, "seed": 0, "clients-per-round": 1, "local-steps": 1,
            "batch-size": 1, "eval-every": 1, "inner": 1}
#: Their largest values: those of RunConfig, named here by the setting (default: int64).
MAXIMA = {"clients": MAX_CLIENTS, "clients-per-round": MAX_CLIENTS, "rounds": MAX_ROUNDS,
          "seed": MAX_SEED, "local-steps": MAX_LOCAL_STEPS, "batch-size": MAX_BATCH_SIZE}
POSITIVE = ("lr", "clip", "epsilon")


def _typed(out):
    """Values checked and converted where they arrive (a TOML file, a command line), so a bad
    one fails before a run starts, naming the setting."""
    for key, low in INTEGERS.items():
        if out[key] is not None:
            out[key] = check_int_scalar(_number(out[key], key), key, minimum=low,
                                        maximum=MAXIMA.get(key, INT64_MAX))
    for key in POSITIVE:
        if out[key] is not None:
            out[key] = check_positive_scalar(_number(out[key], key), key)
    if out["noise"] is not None:
        out["noise"] = check_nonnegative_scalar(_number(out["noise"], "noise"), "noise")
    for key in ("gamma2", "ratio", "lambda"):
        if out[key] is not None:
            out[key] = check_nonnegative_scalar(_number(out[key], key), key)
    if out["opt-out"] is not None:
        out["opt-out"] = check_probability(_number(out["opt-out"], "opt-out"), "opt-out")
    _normal_means_settings(out)
    if out["clients-per-round"] is not None and out["clients"] is not None \
            and out["clients-per-round"] > out["clients"]:
        raise ValueError(f"clients-per-round must be <= clients {out['clients']}, got "
                         f"{out['clients-per-round']}")
    return out


def _normal_means_settings(out):
    """``family`` and ``delta``: settings of eb-normal-means only (elsewhere they would be
    silently ignored, so they are refused)."""
    for key in ("family", "delta"):
        if out[key] is not None and out["algorithm"] != "eb-normal-means":
            raise ValueError(f"{key} is a setting of eb-normal-means, not of "
                             f"{out['algorithm']!r}")
    if out["family"] is not None:
        from ebfl.eb.normal_means.api import check_prior_family

        out["family"] = check_prior_family(out["family"], "family")
    if out["delta"] is not None:
        if out["epsilon"] is None:
            raise ValueError("delta is the delta of the private eb-normal-means: it needs "
                             "epsilon")
        out["delta"] = check_real_scalar(_number(out["delta"], "delta"), "delta", low=0.0,
                                         high=1.0, low_open=True, high_open=True)


def _number(value, key):
    """A number given as a number or as its text (run configs may carry either)."""
    if isinstance(value, bool):
        raise TypeError(f"{key} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            return int(value) if key in INTEGERS and value.strip().lstrip("-").isdigit() \
                else float(value)
        except ValueError:
            raise ValueError(f"{key} must be a number, got {value!r}") from None
    return value


def build_job(settings):
    """The :class:`Job` of ``settings`` (see the module docstring)."""
    s = settings_of(settings)
    if s["algorithm"] in LEARNING:
        data = digits_federation(int(s["clients"]), seed=int(s["seed"]),
                                 images=s["algorithm"] in PERADA)
        algorithm = _learning_algorithm(s)
    elif s["algorithm"] in FEDHDP_POINT:
        from ebfl.fedhdp import point_estimation

        data = point_estimation.job_data(s)
        algorithm = point_estimation.job_algorithm(s, data)
    elif s["algorithm"] in DPPFL:
        from ebfl.dppfl import federated as dppfl

        data = dppfl.job_data(s)
        algorithm = dppfl.job_algorithm(s, data)
    else:
        from ebfl.federated import eb, eb_data, eb_normal_means

        data = eb_data.job_data(s)
        algorithm = (eb_normal_means.job_algorithm(s) if s["algorithm"] == "eb-normal-means"
                     else eb.job_algorithm(s))
    config = RunConfig(n_clients=data.n_clients, n_rounds=int(s["rounds"]), seed=int(s["seed"]),
                       clients_per_round=(None if s["clients-per-round"] is None
                                          else int(s["clients-per-round"])),
                       local_steps=int(s["local-steps"]), batch_size=int(s["batch-size"]),
                       eval_every=int(s["eval-every"]), lr_decay=1.0)
    return Job(algorithm, data, config, s)


def _learning_algorithm(s):
    from ebfl.generative import algorithm as ada
    from ebfl.learning.torch import baselines as b
    from ebfl.learning.torch import strategies as st
    from ebfl.learning.torch.models import LogisticModel

    model = LogisticModel(64, 10)
    lr, clip, noise = float(s["lr"]), float(s["clip"]), float(s["noise"])
    makers = {
        "fedavg": lambda: st.FedAvg(model, lr),
        "local": lambda: st.Local(model, lr),
        "adaped": lambda: ada.AdaPeD(model, lr, lr),
        "adaped-ft": lambda: ada.AdaPeD(model, lr, lr, fine_tune=True),
        "dp-adaped": lambda: ada.DPAdaPeD(model, lr, lr, clip_mu=clip, noise_mu=noise,
                                          concatenate=True),
        "fedavg-ft": lambda: b.FedAvgFT(model, lr),
        "ditto": lambda: b.Ditto(model, lr),
        "pfedme": lambda: b.PFedMe(model),
        "perfedavg": lambda: b.PerFedAvg(model),
        "quped": lambda: b.QuPeDFP(model, lr, lr),
        "fml": lambda: b.FML(model, lr),
        "fedem": lambda: b.FedEM(model),
        "dp-fedem": lambda: b.DPFedEM(model, clip=clip, noise=noise),
        "fedhdp": lambda: _fedhdp(model, s),
        "perada": lambda: _perada(s, distill=True),
        "perada-nokd": lambda: _perada(s, distill=False),
    }
    return makers[s["algorithm"]]()


def _fedhdp(model, s):
    """FedHDP on the digits: the first ``opt-out`` of the clients are non-private."""
    from ebfl.fedhdp.algorithm import FedHDP

    m = int(s["clients"])
    opt_out = 0.5 if s["opt-out"] is None else float(s["opt-out"])
    groups = (np.arange(m) >= round(opt_out * m)).astype(np.int64)
    if groups.min() == groups.max():
        raise ValueError(f"opt-out must leave both non-private and private clients among "
                         f"{m}, got {opt_out}")
    return FedHDP(model, groups, lr=float(s["lr"]),
                  lam=0.005 if s["lambda"] is None else float(s["lambda"]),
                  ratio=0.1 if s["ratio"] is None else float(s["ratio"]),
                  noise_multiplier=[0.0, float(s["noise"])], clip=float(s["clip"]),
                  count_noise=1.0)


def _perada(s, *, distill):
    """PerAda on the digits as 8x8 images: adapters on a seeded random frozen backbone."""
    import torch

    from ebfl.learning.torch.adapters import SmallResNet
    from ebfl.learning.torch.functional import fresh_params
    from ebfl.perada.algorithm import PerAda

    model = SmallResNet(10, 1, widths=(8, 16))
    aux = None
    if distill:
        x = load_digits()[0][:400].reshape(-1, 8, 8) / 16.0
        aux = torch.as_tensor(np.ascontiguousarray(x.transpose(0, 2, 1)), dtype=torch.float32)
    return PerAda(model, fresh_params(model, int(s["seed"])), lr=float(s["lr"]),
                  lam=2.0 if s["lambda"] is None else float(s["lambda"]), aux=aux,
                  kd_steps=5, kd_batch_size=64)
