"""Contract test of ebfl.federated: every public callable refuses bad input by name.

The corpus (:class:`~tests.badinput.Case`, see :mod:`tests.badinput`) covers the
runtime (``run``, ``RunConfig``, ``RoundContext``, ``sample_clients``, the
streams and the tree helpers), the empirical-Bayes protocols and their data,
the failures and the Flower helpers that need no server (``write_app``,
``connection_toml``, ``build_job``). Regression tests follow for checkpoints
(other data, another configuration, damaged, truncated, a folder), failures,
huge sizes, and the command line's ``--failures``, ``--checkpoint-dir`` and
``flower app``. Inputs are tiny: no Flower server starts here.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from ebfl import Ragged
from ebfl.datasets.elections import ElectionMatrix
from ebfl.federated import (
    ClientCounts,
    ClientMeans,
    EBBetaBinomial,
    EBGaussian,
    EBNormalMeans,
    RoundContext,
    RunConfig,
    election_federation,
    election_shares,
    run,
    sample_clients,
    simulated_counts,
    simulated_means,
    stream_seed,
)
from ebfl.federated.checkpoint import data_digest
from ebfl.federated.faults import check_failures, parse_failures
from ebfl.federated.runtime import evaluate
from ebfl.federated.streams import numpy_streams
from ebfl.federated.tree import flatten, tree_cat, tree_nbytes, tree_put, tree_take, unflatten
from ebfl.flower.deploy import connection_toml, write_app
from ebfl.flower.jobs import build_job
from ebfl.privacy import GaussianMechanism, StochasticQuantizer
from tests.badinput import NAN, Case, table_tests

# ------------------------------------------------------------------ inputs

M = 6


def _counts(seed=1):
    return simulated_counts(M, 4, seed=seed)


def _means(seed=1):
    return simulated_means(M, 4, seed=seed)


def _config(**kw):
    return RunConfig(**{"n_clients": M, "n_rounds": 2, **kw})


def _run_result(res):
    # the posteriors, metrics and last history row ("sent" stays NaN for a client that
    # never replied; round 0's history has no posterior yet)
    return {"posterior": [res.clients[k] for k in ("mean", "var", "weight")],
            "metrics": res.metrics, "history": res.history[-1]}


_FOLDER = tempfile.TemporaryDirectory(prefix="ebfl-bad-input-federated-")
_FRESH = itertools.count()


def _fresh_dir():
    """A new, not yet existing, folder for each call (write_app's valid calls repeat)."""
    return Path(_FOLDER.name) / f"app{next(_FRESH)}"


def _matrix():
    """Four counties over three elections."""
    share = np.array([[0.5, 0.625, 0.75], [0.25, 0.375, 0.5], [0.75, 0.5, 0.625],
                      [0.375, 0.25, 0.5]])
    votes = np.full((4, 3), 8, dtype=np.int64)
    return ElectionMatrix(np.array(["1", "2", "3", "4"]), np.array(["a", "b", "c", "d"]),
                          (2012, 2016, 2020), (share > 0.5).astype(np.int8), share,
                          (share * 8).astype(np.int64), votes)


def _run_config(**kw):
    return RunConfig(**kw).to_dict()


def _constructor(cls):
    def call(**kw):
        return cls(**kw).config()

    return call


def _subset(data, ids):
    return data.subset(ids)


def _put(tree, idx, rows):
    tree = copy.deepcopy(tree)  # tree_put writes in place, by design: into a copy here
    tree_put(tree, idx, rows)
    return tree


def _round_context(**kw):
    rc = RoundContext(**kw)
    return rc.round, rc.clients


def _write(**kw):
    app = write_app(**kw)
    return {p.relative_to(app).as_posix(): p.read_text() for p in sorted(app.rglob("*"))
            if p.is_file()}


def _job(settings):
    job = build_job(settings)
    return job.config.to_dict(), job.data.successes


def _streams(**kw):
    return [g.bit_generator.state for g in numpy_streams(**kw)]


def _evaluation_inputs():
    alg, data = EBBetaBinomial(), _counts()
    res = run(alg, data, _config())
    return {"algorithm": alg, "server": res.server, "clients": res.clients, "data": data}


_EVAL = _evaluation_inputs()
_QUARTERS = np.array([0.25, 0.5, 0.75, 0.5, 0.25, 0.5])
_SILENT = {0: list(range(M)), 1: list(range(M))}
_RUN_BAD = (("failures", {7: [0]}, ValueError, "failures round"),
            ("failures", {0: [99]}, ValueError, "failures client"),
            ("failures", {-1: [0]}, ValueError, "failures round"),
            ("failures", {0: [0.5]}, TypeError, "failures client"),
            ("failures", {0: 1}, TypeError, "failures"),
            ("failures", [1], TypeError, "failures"),
            ("failures", _SILENT, ValueError, "failures leave no client"),
            ("config", {"n_clients": M}, TypeError),
            ("config", RunConfig(n_clients=M + 1, n_rounds=2), ValueError, "config.n_clients"),
            ("algorithm", "eb-beta-binomial", TypeError),
            ("checkpoint", 3, TypeError),
            ("checkpoint", _FOLDER.name, ValueError, "checkpoint .* is a folder"))

# ------------------------------------------------------------------ the corpus

FEDERATED = [
    # ---- the runtime
    Case("RunConfig", _run_config, lambda: dict(n_clients=M, n_rounds=2),
         scalars={"n_clients": "size", "local_steps": "size", "batch_size": "size",
                  "iters_per_epoch": "size", "eval_every": "size", "seed": "rng",
                  "lr_decay": "probability", "clients_per_round": "size"},
         bad=(("n_rounds", -1, ValueError), ("n_rounds", 10**20, ValueError),
              ("n_rounds", 10**7 + 1, ValueError), ("n_rounds", 2.5, TypeError),
              ("n_rounds", "2", TypeError), ("n_rounds", True, TypeError),
              ("n_rounds", NAN, TypeError),
              ("n_clients", 10**9, ValueError), ("clients_per_round", M + 1, ValueError),
              ("local_steps", 10**8, ValueError), ("batch_size", 10**8, ValueError),
              ("seed", 2**64, ValueError), ("lr_decay", 0.0, ValueError),
              ("sampling", "uniform", ValueError), ("sampling", ["fixed"], TypeError))),
    Case("RoundContext", _round_context,
         lambda: dict(config=_config(), round=1, clients=np.array([0, 2, 5])),
         counts=("clients",), scalars={"round": "rng"},
         bad=(("clients", np.array([0, 6]), ValueError), ("clients", [-1], ValueError),
              ("clients", [[0, 1]], ValueError), ("clients", [True], TypeError),
              ("config", {"n_clients": M}, TypeError), ("round", 10**8, ValueError))),
    Case("sample_clients", sample_clients,
         lambda: dict(config=_config(clients_per_round=3), round_=1),
         scalars={"round_": "rng", "everyone": "bool"},
         bad=(("config", {"n_clients": M}, TypeError), ("round_", 10**8, ValueError))),
    Case("sample_clients-poisson", sample_clients,
         lambda: dict(config=_config(clients_per_round=3, sampling="poisson"), round_=0),
         scalars={"round_": "rng"}),
    Case("stream_seed", stream_seed, lambda: dict(seed=3, round_=1, client=2),
         scalars={"seed": "rng", "round_": "rng"},
         bad=(("client", -2, ValueError), ("client", 1.5, TypeError), ("client", "0", TypeError),
              ("client", True, TypeError), ("seed", 2**64, ValueError),
              ("round_", 2**63, ValueError), ("purpose", "noise", ValueError),
              ("purpose", ["round"], TypeError))),
    Case("numpy_streams", _streams, lambda: dict(seed=3, round_=1, clients=[0, 2]),
         bad=(("clients", [[0, 1]], ValueError), ("clients", [0.5], TypeError, "client"),
              ("seed", -1, ValueError), ("round_", "1", TypeError))),
    Case("run-beta", lambda **kw: _run_result(run(**kw)),
         lambda: dict(algorithm=EBBetaBinomial(), data=_counts(), config=_config(),
                      failures={0: [0]}),
         scalars={"progress": "bool", "checkpoint_every": "size"}, bad=_RUN_BAD),
    Case("run-gaussian", lambda **kw: _run_result(run(**kw)),
         lambda: dict(algorithm=EBGaussian(sigma_x=0.5), data=_means(), config=_config()),
         bad=(("data", _counts(), TypeError), *_RUN_BAD)),
    Case("run-normal-means", lambda **kw: (lambda r: ([r.clients[k] for k in ("mean", "sd")],
                                                     r.history[-1]))(run(**kw)),
         lambda: dict(algorithm=EBNormalMeans("ash", sigma_x=0.5), data=_means(),
                      config=_config()),
         bad=(("data", _counts(), TypeError), *_RUN_BAD)),
    Case("evaluate", evaluate, lambda: dict(_EVAL),
         bad=(("algorithm", "eb", TypeError), ("data", [1, 2], TypeError))),
    Case("check_failures", check_failures,
         lambda: dict(failures={1: [0, 2]}, config=_config(clients_per_round=3)),
         scalars={"everyone": "bool"},
         bad=(("failures", {2: [0]}, ValueError), ("failures", {0: [6]}, ValueError),
              ("failures", {0: ["0"]}, TypeError), ("failures", {0: "0"}, TypeError),
              ("failures", "0:6", ValueError), ("failures", "0-1", ValueError),
              ("failures", (0, 1), TypeError), ("config", {"n_rounds": 2}, TypeError),
              ("failures", _SILENT, ValueError),
              ("config", RunConfig(n_clients=M, n_rounds=0), ValueError, "failures"))),
    Case("parse_failures", parse_failures, lambda: dict(text="1:0, 0:2,1:3"),
         bad=(("text", "1-0", ValueError, "failures"), ("text", "1:2:3", ValueError, "failures"),
              ("text", "a:b", ValueError, "failures"), ("text", 3, TypeError, "failures"),
              ("text", {1: [0]}, TypeError, "failures"))),
    # ---- tree helpers
    Case("flatten", flatten, lambda: dict(tree={"a": np.zeros(2), "b": {"c": np.ones((2, 1))}}),
         bad=(("tree", [np.zeros(2)], TypeError), ("tree", {"a/b": np.zeros(2)}, ValueError),
              ("tree", np.zeros(2), TypeError))),
    Case("unflatten", unflatten, lambda: dict(flat={"a": np.zeros(2), "b/c": np.ones(2)}),
         bad=(("flat", [1], TypeError), ("flat", {1: np.zeros(2)}, TypeError))),
    Case("tree_take", tree_take,
         lambda: dict(tree={"a": np.arange(6.0), "b": {"c": np.ones((6, 2))}}, idx=[4, 0]),
         counts=("idx",),
         bad=(("idx", [6], ValueError), ("idx", [-1], ValueError), ("idx", [[0]], ValueError),
              ("idx", [True], TypeError), ("tree", [np.zeros(3)], TypeError),
              ("tree", {"a": np.float64(1.0)}, ValueError))),
    Case("tree_put", _put,
         lambda: dict(tree={"a": np.arange(6.0), "b": {"c": np.ones((6, 2))}}, idx=[4, 0],
                      rows={"a": np.array([7.0, 8.0]), "b": {"c": np.zeros((2, 2))}}),
         counts=("idx",),
         bad=(("idx", [6, 0], ValueError), ("idx", [-1, 0], ValueError),
              ("idx", [1], ValueError, "rows"), ("rows", {"a": np.zeros(2)}, ValueError),
              ("rows", [np.zeros(2)], TypeError), ("tree", "x", TypeError))),
    Case("tree_cat", tree_cat,
         lambda: dict(trees=[{"a": np.zeros(2)}, {"a": np.ones(3)}]),
         bad=(("trees", [], ValueError), ("trees", {"a": np.zeros(2)}, TypeError),
              ("trees", [{"a": np.zeros(2)}, {"b": np.zeros(2)}], ValueError),
              ("trees", [np.zeros(2)], TypeError))),
    Case("tree_nbytes", tree_nbytes, lambda: dict(tree={"a": np.zeros(3), "b": {"c": np.ones(2)}}),
         bad=(("tree", [np.zeros(2)], TypeError), ("tree", 3, TypeError))),
    # ---- the empirical-Bayes protocols
    Case("EBBetaBinomial", _constructor(EBBetaBinomial), lambda: dict(),
         bad=(("prior", "cauchy", ValueError), ("prior", ["beta"], TypeError),
              ("method", "em", ValueError), ("method", ["mle"], TypeError),
              ("n_grid", 1, ValueError), ("n_grid", 10**8, ValueError),
              ("n_grid", 2.5, TypeError), ("epsilon", 1.0, ValueError),
              ("privacy", "gaussian", ValueError))),
    Case("EBBetaBinomial-npmle", _constructor(EBBetaBinomial), lambda: dict(prior="npmle"),
         scalars={"n_grid": "size"}, bad=(("method", "mle", ValueError),)),
    Case("EBBetaBinomial-laplace", _constructor(EBBetaBinomial),
         lambda: dict(privacy="laplace", epsilon=1.0),
         scalars={"epsilon": "positive", "ucb_z": "nonnegative"},
         bad=(("variance", "upper", ValueError), ("variance", ["ucb"], TypeError),
              ("ucb_z", 41.0, ValueError), ("prior", "npmle", ValueError, "prior"))),
    Case("EBBetaBinomial-randomized-response", _constructor(EBBetaBinomial),
         lambda: dict(prior="npmle", privacy="randomized-response", epsilon=1.0),
         scalars={"epsilon": "positive"},
         bad=(("epsilon", 701.0, ValueError), ("prior", "beta", ValueError, "prior"))),
    Case("EBGaussian", _constructor(EBGaussian), lambda: dict(sigma_x=0.5, prior_sd=0.25),
         scalars={"sigma_x": "positive", "prior_sd": "nonnegative"},
         bad=(("prior_mean", NAN, ValueError), ("prior_mean", 1e200, ValueError),
              ("prior_mean", "0", TypeError), ("method", "em", ValueError),
              ("prior", "cauchy", ValueError), ("mechanism", "gaussian", TypeError),
              ("n_grid", 1, ValueError))),
    Case("EBGaussian-mechanism", _constructor(EBGaussian),
         lambda: dict(sigma_x=0.5, mechanism=StochasticQuantizer(2, 1.0)),
         scalars={"sigma_x": "positive"},
         bad=(("prior_mean", 0.0, ValueError), ("prior", "npmle", ValueError, "prior"))),
    Case("EBNormalMeans", _constructor(EBNormalMeans), lambda: dict(sigma_x=0.5),
         scalars={"sigma_x": "positive"},
         bad=(("family", "cauchy", ValueError), ("family", ["ash"], TypeError),
              ("mode", NAN, ValueError), ("mode", "median", ValueError),
              ("mode", 1 + 1j, TypeError), ("scale", "wide", ValueError),
              ("scale", -1.0, ValueError), ("scale", [1.0], TypeError),
              ("mechanism", "gaussian", TypeError),
              ("mechanism", StochasticQuantizer(2, 1.0), ValueError))),
    Case("EBNormalMeans-mechanism", _constructor(EBNormalMeans),
         lambda: dict(family="ash", sigma_x=0.5,
                      mechanism=GaussianMechanism(1.0, 1e-5, 2.0, calibration="l2")),
         scalars={"sigma_x": "positive"},
         bad=(("family", "flat", ValueError, "flat"),
              ("scale", [0.5, -1.0], ValueError),
              ("mechanism", GaussianMechanism(1.0, 1e-5, 2.0, d=2, calibration="l2"),
               ValueError))),
    # ---- their data
    Case("ClientCounts", ClientCounts,
         lambda: dict(successes=[0, 1, 2, 3], trials=[3, 3, 4, 4], truth=[0.25, 0.5, 0.5, 0.75]),
         counts=("successes", "trials"), real=("truth",),
         bad=(("successes", [4, 1, 2, 3], ValueError), ("trials", [0, 3, 4, 4], ValueError),
              ("truth", [0.5], ValueError), ("labels", [["a"], ["b"], ["c"], ["d"]], ValueError),
              ("labels", ["a"], ValueError), ("trials", [3, 3], ValueError))),
    Case("ClientCounts.subset", _subset,
         lambda: dict(data=ClientCounts([0, 1, 2], [2, 2, 2]), ids=[2, 0]), counts=("ids",),
         bad=(("ids", [3], ValueError), ("ids", [-1], ValueError), ("ids", [[0]], ValueError),
              ("ids", [True], TypeError))),
    Case("ClientCounts.from_bernoulli", ClientCounts.from_bernoulli,
         lambda: dict(data=Ragged.from_lists([[1, 0, 1], [0, 0]]), truth=[0.5, 0.25]),
         real=("truth",),
         bad=(("data", [[1, 0]], TypeError), ("truth", [0.5], ValueError))),
    Case("ClientMeans", ClientMeans,
         lambda: dict(mean=[0.5, -0.25, 1.0], count=[2, 3, 4], ssd=[0.5, 1.0, 0.25],
                      truth=[0.25, 0.0, 1.0]),
         real=("mean", "ssd", "truth"), counts=("count",),
         bad=(("mean", [1e200, 0.0, 0.0], ValueError), ("mean", np.zeros((3, 1)), ValueError),
              ("count", [0, 3, 4], ValueError), ("count", [2, 3], ValueError),
              ("ssd", [-1.0, 1.0, 0.25], ValueError), ("ssd", [0.5, 1.0], ValueError))),
    Case("ClientMeans-se", ClientMeans, lambda: dict(mean=[0.5, -0.25, 1.0], se=[0.5, 0.25, 1.0]),
         real=("mean", "se"),
         bad=(("se", [0.0, 0.25, 1.0], ValueError), ("se", [0.5, 0.25], ValueError))),
    Case("ClientMeans.subset", _subset,
         lambda: dict(data=ClientMeans([0.5, -0.25, 1.0], se=[0.5, 0.25, 1.0]), ids=[1]),
         counts=("ids",), bad=(("ids", [3], ValueError), ("ids", [-3], ValueError))),
    Case("ClientMeans.from_summaries", ClientMeans.from_summaries,
         lambda: dict(mean=[0.5, -0.25, 1.0], sd=[0.5, 0.25, 1.0], count=[2, 3, 4]),
         real=("mean", "sd"), counts=("count",),
         bad=(("sd", [-0.5, 0.25, 1.0], ValueError), ("count", [2, 3], ValueError),
              ("count", [0, 3, 4], ValueError))),
    Case("ClientMeans.from_samples", ClientMeans.from_samples,
         lambda: dict(data=Ragged.from_lists([[1.0, 3.0], [2.0, 2.0, 5.0]])),
         bad=(("data", [[1.0, 2.0]], TypeError), ("truth", [0.5], ValueError))),
    # ---- datasets
    Case("simulated_counts", lambda **kw: (lambda d: (d.successes, d.trials, d.truth))(
        simulated_counts(**kw)), lambda: dict(n_clients=5, n=4, seed=2),
         scalars={"n_clients": "size", "alpha": "positive", "beta": "positive", "seed": "rng"},
         bad=(("n_clients", 10**10, ValueError), ("n", 10**12, ValueError),
              ("n", 0, ValueError), ("n", [1, 2], ValueError), ("n", 2.5, TypeError))),
    Case("simulated_counts-per-client", lambda **kw: (lambda d: (d.successes, d.trials))(
        simulated_counts(**kw)), lambda: dict(n_clients=4, n=np.array([2, 3, 1, 4]), seed=2),
         counts=("n",), bad=(("n", [10**9] * 4, ValueError), ("n", [2, 3, 0, 4], ValueError))),
    Case("simulated_means", lambda **kw: (lambda d: (d.mean, d.ssd, d.truth))(
        simulated_means(**kw)), lambda: dict(n_clients=5, n=4, seed=2),
         scalars={"n_clients": "size", "sigma_theta": "nonnegative", "sigma_x": "positive",
                  "seed": "rng"},
         bad=(("mean", NAN, ValueError), ("mean", 1e200, ValueError), ("mean", "0", TypeError),
              ("n_clients", 10**10, ValueError), ("n", 10**12, ValueError)),
         extreme=(("mean", 1e148), ("sigma_x", 1e148), ("sigma_theta", 1e148))),
    Case("election_federation", lambda **kw: (lambda d: (d.successes, d.trials, d.truth))(
        election_federation(**kw)), lambda: dict(matrix=_matrix()),
         bad=(("matrix", "elections", TypeError), ("held_out", 3, ValueError),
              ("held_out", 1.5, TypeError), ("unit", "county", ValueError),
              ("target", "votes", ValueError), ("unit", ["vote"], TypeError),
              ("path", "returns.csv", ValueError, "path"))),
    Case("election_shares", lambda **kw: (lambda d: (d.mean, d.ssd, d.truth))(
        election_shares(**kw)), lambda: dict(matrix=_matrix(), held_out=0),
         bad=(("matrix", 3, TypeError), ("held_out", -4, ValueError),
              ("held_out", "0", TypeError))),
    # ---- Flower helpers that need no server
    Case("write_app", _write,
         lambda: dict(directory=_fresh_dir(), settings={"algorithm": "eb-beta-binomial",
                                                        "clients": 4, "failures": "1:3"}),
         scalars={"overwrite": "bool"},
         bad=(("directory", Path(_FOLDER.name) / "no" / "such" / "app", ValueError),
              ("directory", 3, TypeError), ("settings", ["eb-beta-binomial"], TypeError),
              ("settings", {"algorithm": "eb-beta-binomial", "rounds": 10**20}, ValueError,
               "rounds"),
              ("settings", {"algorithm": "eb-beta-binomial", "clients": 4, "failures": "0:9"},
               ValueError, "failures client"),
              ("settings", {"algorithm": "eb-beta-binomial", "failures": "0-9"}, ValueError,
               "failures"),
              ("superlink", "localhost", ValueError), ("superlink", 9093, TypeError))),
    Case("connection_toml", connection_toml, lambda: dict(superlink="127.0.0.1:9093"),
         bad=(("superlink", "127.0.0.1:0", ValueError), ("superlink", None, TypeError),
              ("name", "a b", ValueError), ("name", 3, ValueError))),
    Case("build_job", _job, lambda: dict(settings={"algorithm": "eb-beta-binomial",
                                                   "clients": 4, "rounds": 2}),
         bad=(("settings", {"algorithm": "eb-beta-binomial", "rounds": 10**8}, ValueError,
               "rounds"),
              ("settings", {"algorithm": "eb-beta-binomial", "clients": 10**10}, ValueError,
               "clients"),
              ("settings", {"algorithm": "eb-beta-binomial", "local-steps": 10**8}, ValueError,
               "local-steps"),
              ("settings", {"algorithm": "eb-beta-binomial", "epochs": 3}, ValueError,
               "epochs"))),
]

table_tests(FEDERATED, "federated", globals())


# ------------------------------------------------------------------ checkpoints

def test_a_checkpoint_of_other_data_is_refused(tmp_path):
    ckpt, cfg = tmp_path / "run.ckpt", RunConfig(n_clients=20, n_rounds=2)
    written = run(EBBetaBinomial(), simulated_counts(20, seed=0), cfg, checkpoint=ckpt)
    with pytest.raises(ValueError, match=r"checkpoint .* was written for other data.*delete it"):
        run(EBBetaBinomial(), simulated_counts(20, seed=9), cfg, checkpoint=ckpt)
    # the same data resume (and give the same result)
    again = run(EBBetaBinomial(), simulated_counts(20, seed=0), cfg, checkpoint=ckpt)
    np.testing.assert_array_equal(again.clients["mean"], written.clients["mean"])


def test_a_checkpoint_of_another_configuration_says_what_differs(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)
    with pytest.raises(ValueError, match=r"another configuration \(algorithm\.method: 'mle' in "
                                         r"the checkpoint, 'moments' now\)"):
        run(EBBetaBinomial(method="moments"), _counts(), _config(), checkpoint=ckpt)
    with pytest.raises(ValueError, match=r"run\.seed: 0 in the checkpoint, 4 now"):
        run(EBBetaBinomial(), _counts(), _config(seed=4), checkpoint=ckpt)
    with pytest.raises(ValueError, match="holds 2 rounds, more than this run's n_rounds=1"):
        run(EBBetaBinomial(), _counts(), _config(n_rounds=1), checkpoint=ckpt)


def test_failures_of_rounds_not_yet_run_may_change_on_resuming(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    run(EBBetaBinomial(), _counts(), _config(n_rounds=2), checkpoint=ckpt)
    resumed = run(EBBetaBinomial(), _counts(), _config(n_rounds=3), failures={2: [1]},
                  checkpoint=ckpt)
    full = run(EBBetaBinomial(), _counts(), _config(n_rounds=3), failures={2: [1]})
    np.testing.assert_array_equal(resumed.clients["mean"], full.clients["mean"])
    with pytest.raises(ValueError, match="failures in the rounds done"):
        run(EBBetaBinomial(), _counts(), _config(n_rounds=4), failures={1: [1]}, checkpoint=ckpt)


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9, -1])
def test_a_checkpoint_with_a_flipped_byte_is_refused(tmp_path, where):
    ckpt = tmp_path / "run.ckpt"
    run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)
    content = bytearray(ckpt.read_bytes())
    content[int(where * len(content)) if where > 0 else where] ^= 0x01
    ckpt.write_bytes(bytes(content))
    with pytest.raises(ValueError, match=r"checkpoint .* cannot be read: .*damaged.*delete it, "
                                         "or pass another checkpoint path"):
        run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)


@pytest.mark.parametrize("keep", [0, 10, 0.5, -1])
def test_a_truncated_checkpoint_is_refused(tmp_path, keep):
    ckpt = tmp_path / "run.ckpt"
    run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)
    content = ckpt.read_bytes()
    ckpt.write_bytes(content[:int(keep * len(content)) if isinstance(keep, float) else keep])
    with pytest.raises(ValueError, match=r"checkpoint .* cannot be read"):
        run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)


def test_a_plain_pickle_is_not_a_checkpoint(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    ckpt.write_bytes(pickle.dumps({"round": 2, "server": {"x": np.zeros(20)}}))  # older ebfl
    with pytest.raises(ValueError, match="does not end with its checksum"):
        run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)


def test_a_checkpoint_still_opens_as_one_pickle_and_writes_atomically(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    run(EBBetaBinomial(), _counts(), _config(), checkpoint=ckpt)
    with open(ckpt, "rb") as fh:
        assert pickle.load(fh)["round"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]  # no .tmp left


def test_a_folder_or_a_path_under_a_file_is_refused_before_the_run(tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint .* is a folder; give a file path"):
        run(EBBetaBinomial(), _counts(), _config(), checkpoint=tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"checkpoint .* is a file, not a folder"):
        run(EBBetaBinomial(), _counts(), _config(), checkpoint=tmp_path / "file" / "run.ckpt")
    assert (tmp_path / "file").read_text() == "x"


def test_the_data_digest_sees_every_array_and_nothing_else():
    a = _counts()
    assert data_digest(a) == data_digest(_counts())
    assert data_digest(a) != data_digest(_counts(seed=2))
    changed = ClientCounts(a.successes, a.trials, a.truth + 0.125)  # only the truth differs
    assert data_digest(changed) != data_digest(a)
    assert data_digest(a.subset([0, 1])) != data_digest(a.subset([1, 0]))
    assert data_digest(_means()) != data_digest(a)


# ------------------------------------------------------------------ failures and sizes

def test_failures_of_every_client_in_every_round_are_refused():
    with pytest.raises(ValueError, match="failures leave no client to reply in any of the 2"):
        run(EBBetaBinomial(), simulated_counts(20, seed=9), RunConfig(n_clients=20, n_rounds=2),
            failures={r: range(20) for r in range(2)})


def test_a_silent_fitting_round_is_warned_and_the_fit_asked_again():
    with pytest.warns(RuntimeWarning, match="0 client.* replied in round 0.*asks again"):
        res = run(EBBetaBinomial(), _counts(), _config(n_rounds=3), failures={0: range(M)})
    assert res.server["prior"]["fit_round"][0] == 1.0
    assert np.all(np.isfinite(res.clients["mean"]))


def test_a_failure_in_a_round_outside_the_run_is_refused():
    with pytest.raises(ValueError, match=r"failures round must be an integer in \[0, 1\], got 7"):
        run(EBBetaBinomial(), _counts(), _config(n_rounds=2), failures={7: [0]})


def test_huge_sizes_are_refused_before_allocating():
    with pytest.raises(ValueError, match=r"rounds must be an integer in \[0, 10000000\]"):
        RunConfig(n_clients=2, n_rounds=10**20)
    with pytest.raises(ValueError, match=r"n_clients must be an integer in \[1, 100000000\]"):
        simulated_counts(10**10)
    with pytest.raises(ValueError, match="n_clients and n: the simulation draws"):
        simulated_counts(10, 10**12)
    with pytest.raises(ValueError, match=r"n_clients must be an integer in \[1, 100000000\]"):
        RunConfig(n_clients=10**12, n_rounds=1)


def test_seed_is_named_as_seed():
    for func in (simulated_counts, simulated_means):
        with pytest.raises(TypeError, match="^seed must be"):
            func(5, seed="s")
        with pytest.raises(ValueError, match="^seed must be"):
            func(5, seed=-1)


def test_a_float_client_id_is_refused_not_truncated():
    with pytest.raises(TypeError, match="ids must hold integer client ids"):
        _counts().subset([0.7])
    with pytest.raises(TypeError, match="round_ must be an integer"):
        stream_seed(0, 2.7, 0)


# ------------------------------------------------------------------ the command line

def _cli(argv):
    from ebfl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _one_error_line(code, out, err, option):
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert option in err, err


@pytest.mark.parametrize(("failures", "says"), [
    ("0:99", r"client must be an integer in \[0, 5\], got 99"),
    ("7:0", r"round must be an integer in \[0, 2\], got 7"),
    ("0-1", "round:client pairs"),
    (",".join(f"{r}:{c}" for r in range(3) for c in range(6)), "no client to reply"),
])
def test_cli_failures_are_checked_before_anything_starts(failures, says):
    code, out, err = _cli(["flower", "simulate", "eb-beta-binomial", "--failures", failures])
    _one_error_line(code, out, err, "--failures")
    assert __import__("re").search(says, err), err


@pytest.mark.parametrize("command", [["reproduce", "dp-pfl", "--quick"],
                                     ["reproduce", "fedhdp", "--quick"]])
def test_cli_checkpoint_dir_that_is_a_file(tmp_path, command):
    target = tmp_path / "a-file"
    target.write_text("x")
    code, out, err = _cli([*command, "--checkpoint-dir", str(target)])
    _one_error_line(code, out, err, "--checkpoint-dir")
    assert "is not a folder" in err and target.read_text() == "x"


def test_cli_flower_app_does_not_create_missing_parents(tmp_path):
    target = tmp_path / "no" / "such" / "parent" / "app"
    code, out, err = _cli(["flower", "app", str(target), "eb-beta-binomial"])
    _one_error_line(code, out, err, "directory")
    assert "does not exist" in err and not (tmp_path / "no").exists()
    code, out, err = _cli(["flower", "app", str(tmp_path / "app"), "eb-beta-binomial",
                           "--json"])
    assert code == 0 and (tmp_path / "app" / "pyproject.toml").is_file(), err
