"""The Flower job ``fedhdp`` on ``mnist``: the FedHDP paper's non-IID MNIST federation and
protocol, as ``ebfl reproduce fedhdp`` runs them, on Flower's Simulation Engine.

The settings tests need neither MNIST nor Flower; one test checks that the job trains what
``run_fedhdp`` trains (on the synthetic stand-in, no download); the simulation runs a small
federation on Flower and in process, and skips where the data home has no MNIST.
"""

import numpy as np
import pytest

from ebfl.flower.jobs import ALGORITHMS, MNIST_ALGORITHMS, build_job, settings_of
from tests.conftest import requires_data

needs_mnist = requires_data("mnist")
MNIST = {"algorithm": "fedhdp", "dataset": "mnist"}


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a not in MNIST_ALGORITHMS])
def test_mnist_is_refused_by_the_other_algorithms(algorithm):
    with pytest.raises(ValueError, match="dataset 'mnist'.* fedhdp only, not of "
                                         f"'{algorithm}'"):
        settings_of({"algorithm": algorithm, "dataset": "mnist"})


def test_mnist_defaults_are_the_papers():
    s = settings_of(MNIST)
    assert {k: s[k] for k in ("clients", "clients-per-round", "local-steps", "batch-size", "lr",
                              "clip", "noise", "opt-out", "ratio", "lambda", "rounds")} == {
        "clients": 2000, "clients-per-round": 100, "local-steps": None, "batch-size": 20,
        "lr": 0.5, "clip": 0.5, "noise": 1.5, "opt-out": 0.05, "ratio": 0.01, "lambda": 0.005,
        "rounds": 3}
    # what the user gives wins; "" is unset (a deployed app's run config writes it so)
    given = settings_of({**MNIST, "clients": 200, "lr": "0.2", "batch-size": 10,
                         "local-steps": "", "noise": 0})
    assert (given["clients"], given["clients-per-round"], given["lr"], given["batch-size"],
            given["local-steps"], given["noise"]) == (200, 10, 0.2, 10, None, 0)
    # the digits job keeps its defaults
    digits = settings_of({"algorithm": "fedhdp"})
    assert (digits["dataset"], digits["clients"], digits["lr"], digits["local-steps"],
            digits["batch-size"], digits["clip"], digits["noise"]) == ("digits", 6, 0.1, 5, 10,
                                                                       1.0, 0.1)


@pytest.mark.parametrize(("extra", "match"), [
    ({"opt-out": 0}, "opt-out must leave both"),
    ({"opt-out": 1}, "opt-out must leave both"),
    ({"opt-out": 0.0002}, r"opt-out .*\[0\.00025, 0\.99975\)"),
    ({"opt-out": 1.5}, "opt-out"),
    ({"clients": 100, "clients-per-round": 101}, "clients-per-round must be <= clients 100"),
    ({"clients": 0}, "clients"),
    ({"lr": -1}, "lr"),
])
def test_bad_mnist_settings_name_the_setting(extra, match):
    with pytest.raises(ValueError, match=match):
        settings_of({**MNIST, **extra})


def test_missing_mnist_is_a_clear_error(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="(?s)not found in .*never downloads MNIST"):
        build_job({**MNIST, "clients": 20})
    assert not any(tmp_path.iterdir())  # nothing was fetched


def test_the_job_trains_what_run_fedhdp_trains(monkeypatch):
    """The same federation given to both: the job's RunConfig and algorithm are those that
    ``run_fedhdp`` hands to training (the paper's protocol, Poisson sampling, lr decay)."""
    pytest.importorskip("torch")
    from ebfl.fedhdp import experiment as ex
    from ebfl.fedhdp.data import synthetic_noniid_mnist

    fed = synthetic_noniid_mnist(n_clients=200, samples_per_client=29, test_per_client=2,
                                 n_server_test=10, seed=3)
    asked = {}

    def load(dataset, **kwargs):
        asked.update(kwargs, dataset=dataset)
        return fed
    monkeypatch.setattr(ex, "load_federation", load)
    job = build_job({**MNIST, "clients": 200, "seed": 3, "rounds": 4})
    assert asked == {"dataset": "mnist", "seed": 3, "n_clients": 200,
                     "nonprivate_fraction": 0.05, "download": False}

    class Trained(Exception):
        pass

    def train(alg, data, **kwargs):
        raise Trained(alg, data, kwargs)
    monkeypatch.setattr("ebfl.learning.torch.train", train)
    with pytest.raises(Trained) as got:
        ex.run_fedhdp(fed, "FedHDP", r=0.01, lam=0.005, n_rounds=4, seed=3)
    alg, data, kwargs = got.value.args
    assert data is fed.data and job.data is fed.data
    cfg = job.config
    keys = ("n_rounds", "local_steps", "clients_per_round", "batch_size", "iters_per_epoch",
            "lr_decay", "seed", "sampling")
    assert {k: getattr(cfg, k) for k in keys} == {k: kwargs[k] for k in keys}
    # the paper's figures at 200 clients: K = 10, 25 epochs of ceil(29 / 20) = 2 steps
    assert (cfg.clients_per_round, cfg.local_steps, cfg.iters_per_epoch, cfg.sampling) == \
        (10, 50, 2500, "poisson")
    assert job.settings["local-steps"] == 50
    mine, theirs = job.algorithm.config(), alg.config()
    assert mine == theirs and mine["count_noise"] == 1.5  # sigma_b = max(K / 20, z)


@pytest.mark.flower
@needs_mnist
def test_flower_equals_in_process_on_mnist():
    """100 one-digit clients, about 10 sampled per round by Poisson sampling: the Ray
    workers build the job on their own (the same partition, or the runs would differ) and
    the final arrays equal those of the in-process run."""
    pytest.importorskip("torch")
    pytest.importorskip("flwr", reason="the Flower runtime needs the flower extra: "
                                       "pip install 'ebfl[flower]'")
    from ebfl.federated import run
    from ebfl.flower.runtime import max_abs_diff, simulate

    settings = {**MNIST, "clients": 100, "clients-per-round": 10, "rounds": 2,
                "local-steps": 2, "eval-every": 2}
    flower = simulate(settings)
    job = build_job(settings)
    local = run(job.algorithm, job.data, job.config)
    assert max_abs_diff(flower, local) <= 1e-6
    assert [(h["clients"], h["replies"]) for h in flower.history] == \
        [(h["clients"], h["clients"]) for h in local.history]
    np.testing.assert_allclose(flower.metrics["accuracy"], local.metrics["accuracy"],
                               atol=1e-6)
