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
    client holds 3 classes) for the learning algorithms; ``mnist`` (the FedHDP
    paper's non-IID MNIST, for ``fedhdp`` only: see below); ``simulated`` (the
    default of the empirical-Bayes protocols) or ``elections`` (US counties as
    clients; needs the county-elections data) for ``eb-*``.
``clients``, ``rounds``, ``seed``, ``clients-per-round``
    The run (:class:`~ebfl.federated.RunConfig`). ``clients`` defaults to 6; on
    ``elections`` to every county (3150), and a smaller number takes the first
    counties; on ``mnist`` to 2000. ``rounds`` defaults to 3, ``seed`` to 0 and
    ``clients-per-round`` to every client (``mnist``: see below).
``local-steps``, ``batch-size``, ``eval-every``, ``lr``
    The rest of the run (:class:`~ebfl.federated.RunConfig`) and the learning rate
    (defaults 5, 10, 1 and 0.1; ``mnist``: see below).
``clip``, ``noise``
    DP-AdaPeD / DP-FedEM: clip norm and noise standard deviation (defaults 1 and
    0.1); ``fedhdp`` (Algorithm 2 of the FedHDP paper): the initial clip norm S^0
    and the private group's noise multiplier z (on ``digits`` the unclipped
    count's noise sigma_b is 1).
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
    :func:`ebfl.fedhdp.point_estimation.job_algorithm`. ``fedhdp`` on ``digits``:
    the clients with ids below ``opt-out`` x clients are non-private (default 0.5),
    r = ``ratio`` (default 0.1), lambda = ``lambda`` (default 0.005, Table 7).
``inner``, ``epsilon``, ``ratio``, ``lambda``
    ``dp-pfl`` (Algorithm 1 of DP-PFL, Hu et al., IEEE IoT J. 2020, on ``simulated``
    devices; one round is one global iteration): the Omega-step every ``inner``
    rounds (K, default 10), (``epsilon``, 1e-3)-DP per device (omitted:
    non-private), the budget split r = ``ratio`` (default 1) and lambda =
    ``lambda`` (default 0.1); see :func:`ebfl.dppfl.federated.job_algorithm`.

``fedhdp`` on ``mnist``
    The FedHDP paper's federation and protocol (its Section 5 and Table 7), as
    ``ebfl reproduce fedhdp`` runs them (:mod:`ebfl.fedhdp.experiment`, whose
    :func:`~ebfl.fedhdp.experiment.load_federation`,
    :func:`~ebfl.fedhdp.experiment.make_algorithm` and
    :func:`~ebfl.fedhdp.experiment.training_plan` build the job). ``clients``
    clients (default 2000) hold one MNIST digit each; a fraction ``opt-out`` of
    them (default 0.05, rounded half up; each group needs a client) is
    non-private, drawn at random; the partition and the draw come from ``seed``,
    which also keys the run. The model is the FC 784-50-10 network. Clients are
    sampled by Poisson sampling, each taking part with probability
    ``clients-per-round`` / ``clients`` (default: K = 5 % of the clients,
    rounded: 100 of 2000). FedHDP weighs the private group by r = ``ratio``
    (default 0.01, Table 3), with lambda = ``lambda`` (default 0.005) and
    adaptive clipping from S^0 = ``clip`` (default 0.5), the private group's
    noise multiplier z = ``noise`` (default 1.5) and the unclipped count's noise
    sigma_b = max(K / 20, z), each group's noisy sum divided by its realized count
    (Algorithm 2 as printed). Both models train with learning rate ``lr``
    (default 0.5), decayed by 0.9 every 50 rounds, on minibatches of
    ``batch-size`` (default 20), ``local-steps`` local steps per round (default:
    the paper's 25 local epochs, 25 x ceil(training samples per client /
    ``batch-size``), 50 at 2000 clients). ``rounds`` (the paper runs 500) and
    ``eval-every`` are as for every job; ``epsilon``, ``gamma2`` and ``inner``
    are not used. The job never downloads MNIST (each Flower node builds the job
    and would fetch it on its own): its files must be in the data home
    (``EBFL_DATA``, on every node), or the job raises FileNotFoundError.
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

__all__ = ["ALGORITHMS", "DATASETS", "MNIST_ALGORITHMS", "Job", "build_job",
           "digits_federation", "load_digits"]

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
DATASETS = ("digits", "mnist", "simulated", "elections")
#: The algorithms that run on ``mnist`` (the FedHDP paper's federation and protocol).
MNIST_ALGORITHMS = ("fedhdp",)

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
    present = {k: v for k, v in given.items() if v is not None and v != ""}
    out = {**DEFAULTS, **present}
    out["algorithm"] = check_choice(given.get("algorithm"), "algorithm", ALGORITHMS)
    if out["dataset"] is None:
        out["dataset"] = "digits" if out["algorithm"] in LEARNING else "simulated"
    check_choice(out["dataset"], "dataset", DATASETS)
    if out["dataset"] == "mnist":
        if out["algorithm"] not in MNIST_ALGORITHMS:
            raise ValueError(f"dataset 'mnist' (the FedHDP paper's non-IID MNIST) is a dataset "
                             f"of {' and '.join(MNIST_ALGORITHMS)} only, not of "
                             f"{out['algorithm']!r}: the other learning algorithms take "
                             "'digits', the eb-* protocols 'simulated' or 'elections'")
        # the paper's values where the user gave none (DEFAULTS are the digits job's)
        out.update({k: v for k, v in _mnist_defaults().items() if k not in present})
        return _mnist_settings(_typed(out))
    if out["clients"] is None and out["dataset"] != "elections":  # elections: every county
        out["clients"] = 6
    if (out["algorithm"] in LEARNING) != (out["dataset"] == "digits"):
        kind = "learning" if out["algorithm"] in LEARNING else "empirical-Bayes"
        raise ValueError(f"dataset {out['dataset']!r} does not fit the {kind} algorithm "
                         f"{out['algorithm']!r}: learning algorithms take 'digits' (fedhdp "
                         "also 'mnist'), the eb-* protocols 'simulated' or 'elections'")
    return _typed(out)


def _mnist_defaults():
    """The ``mnist`` job's settings where the user gives none: the FedHDP paper's
    (Table 7's protocol, Table 3's r). ``local-steps`` None: the paper's local epochs,
    counted on the data once it is built (:func:`_mnist_job`)."""
    from ebfl.fedhdp.experiment import MNIST_PROTOCOL

    return {"clients": 2000, "local-steps": None, "batch-size": MNIST_PROTOCOL["batch_size"],
            "lr": MNIST_PROTOCOL["lr"], "clip": MNIST_PROTOCOL["clip"],
            "noise": MNIST_PROTOCOL["noise_multiplier"], "opt-out": 0.05, "ratio": 0.01,
            "lambda": 0.005}


def _mnist_settings(out):
    """The ``mnist`` job's expected clients per round (the paper's rate where not given),
    and its groups checked before any data is read."""
    from ebfl.fedhdp.experiment import MNIST_PROTOCOL

    m, opt_out = out["clients"], out["opt-out"]
    if out["clients-per-round"] is None:
        out["clients-per-round"] = max(1, round(MNIST_PROTOCOL["sampling_rate"] * m))
    nonprivate = int(np.floor(opt_out * m + 0.5))  # as ebfl.fedhdp.data rounds it
    if not 0 < nonprivate < m:
        raise ValueError(f"opt-out must leave both non-private and private clients among "
                         f"{m}, i.e. lie in [{0.5 / m:.6g}, {1 - 0.5 / m:.6g}), got {opt_out} "
                         f"({nonprivate} non-private)")
    return out


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
    if s["dataset"] == "mnist":
        return _mnist_job(s)
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


def _mnist_job(s):
    """FedHDP on the FedHDP paper's non-IID MNIST (see the module docstring): the
    federation, the algorithm and the run that ``run_fedhdp`` would train."""
    from ebfl.fedhdp import experiment as ex

    m = int(s["clients"])
    try:  # never a download: every Flower node builds the job
        fed = ex.load_federation("mnist", seed=int(s["seed"]), n_clients=m,
                                 nonprivate_fraction=float(s["opt-out"]), download=False)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}. The Flower job never downloads MNIST (each node "
                                "would): fetch it once, e.g. with ebfl.datasets.load_mnist(), "
                                "into the data home of every node") from None
    except ValueError as exc:  # e.g. too many clients for a digit: say which settings
        raise ValueError(f"the mnist federation of clients = {m}, opt-out = {s['opt-out']}: "
                         f"{exc}") from None
    protocol = {**ex.MNIST_PROTOCOL, "lr": float(s["lr"]), "clip": float(s["clip"]),
                "noise_multiplier": float(s["noise"]), "batch_size": int(s["batch-size"])}
    plan = ex.training_plan(fed, protocol, n_rounds=int(s["rounds"]),
                            clients_per_round=int(s["clients-per-round"]),
                            local_steps=None if s["local-steps"] is None
                            else int(s["local-steps"]))
    p = plan["protocol"]
    algorithm = ex.make_algorithm("FedHDP", fed, r=float(s["ratio"]), lam=float(s["lambda"]),
                                  protocol=p)
    config = RunConfig(n_clients=fed.n_clients, n_rounds=int(s["rounds"]), seed=int(s["seed"]),
                       clients_per_round=plan["clients_per_round"],
                       local_steps=plan["local_steps"], batch_size=p["batch_size"],
                       iters_per_epoch=plan["iters_per_epoch"], lr_decay=p["lr_decay"],
                       eval_every=int(s["eval-every"]), sampling="poisson")
    return Job(algorithm, fed.data, config, {**s, "local-steps": plan["local_steps"]})


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
    """FedHDP on the digits: the first ``opt-out`` of the clients are non-private
    (``mnist``: :func:`_mnist_job`)."""
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
