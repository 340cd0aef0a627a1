"""The PerAda reproduction: every part end to end at quick scale, the CLI, resumption."""

import contextlib
import io
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from ebfl.cli import main  # noqa: E402
from ebfl.perada.experiment import (  # noqa: E402
    PARTS,
    QUICK,
    QUICK_METHODS,
    TABLE1_METHODS,
    load_data,
    make_method,
    plot_perada,
    reproduce_perada,
)
from tests.conftest import has_dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: The quick run CI makes: on MNIST when the data home has it (the default command), else on
#: the generated images (a clone without data).
QUICK_DATASET = "mnist" if has_dataset("mnist") and has_dataset("fashion-mnist") else "synthetic"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``ebfl reproduce perada --quick --rounds 1 --json`` (with checkpoints, a figure and a
    private backbone cache), run once for the module. One round of the quick protocol's
    three: every part and method still runs, in less than half the time."""
    tmp = tmp_path_factory.mktemp("perada")
    args = ["reproduce", "perada", "--quick", "--rounds", "1", "--json", "--checkpoint-dir",
            str(tmp / "ck"),
            "--cache-dir", str(tmp / "cache"), "--plot", str(tmp)]
    if QUICK_DATASET != "mnist":
        args += ["--dataset", QUICK_DATASET]
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        assert main(args) == 0
    return json.loads(capture.getvalue()), tmp


def test_quick_reproduction_has_every_part(quick):
    result, tmp = quick
    assert result["dataset"] == QUICK_DATASET and result["quick"]
    if QUICK_DATASET == "mnist":  # Fashion-MNIST, 1 epoch on 5,000 images
        assert result["backbone"]["test_accuracy"] > 0.5
    assert (tmp / f"perada_{QUICK_DATASET}.png").stat().st_size > 10_000
    assert [r["algorithm"] for r in result["table1"]] == list(QUICK_METHODS)
    for row in result["table1"]:
        for key in ("local_test", "global_test", "ood"):
            assert 0 <= row[key] <= 100
        assert row["trained_parameters"] >= row["communicated_parameters"] >= 0
    perada = {r["algorithm"]: r for r in result["table1"]}["PerAda"]
    assert perada["trained_parameters"] == 2 * perada["communicated_parameters"]
    assert {r["algorithm"] for r in result["table2"]} >= {"FedAvg", "Ditto", "PerAda"}
    assert [r["kd_data"] for r in result["figure4"]] == ["none", "out-of-domain", "in-domain"]
    assert [r["lam"] for r in result["figure7"]] == list(QUICK.lambdas)
    dp = [r for r in result["table4"] if r["epsilon_target"] is not None]
    assert dp and all(r["epsilon_mean"] <= r["epsilon_target"] + 1e-9 for r in dp)
    assert result["paper"]["table1"]["PerAda"]["global_test"] == 59.05


def test_a_rerun_on_the_checkpoints_gives_the_same_result_without_training(quick,
                                                                          monkeypatch):
    result, tmp = quick
    import ebfl.learning.torch.engine as engine

    def refuse(*a, **k):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr(engine, "train", refuse)
    again = reproduce_perada(dataset=QUICK_DATASET, quick=True, n_rounds=1,
                             checkpoint_dir=tmp / "ck", cache_dir=tmp / "cache")
    for part in PARTS:
        assert json.loads(json.dumps(again[part])) == result[part]
    path = plot_perada(again, tmp / "again.png")
    assert path.endswith("again.png")


def test_every_table1_method_builds_on_the_same_pretrained_state():
    data = load_data("synthetic", QUICK)
    for name, _ in TABLE1_METHODS:
        alg, init = make_method(name, data=data, protocol=QUICK, backbone=None)
        assert alg.trained_parameters() >= alg.communicated_parameters() >= 0, name
    with pytest.raises(ValueError, match="method must be one of"):
        make_method("FedNope", data=data, protocol=QUICK, backbone=None)


def test_resnet18_setting_builds_the_papers_adapter_and_runs_a_round_on_a_fixture(tmp_path):
    """The paper's architecture on 3-channel 32x32 inputs: shapes and counts (no weights)."""
    import torch

    from ebfl.learning.torch.data import FederatedDataset
    from ebfl.perada.data import synthetic_perada

    rng = np.random.default_rng(0)
    xs = [rng.random((6, 3, 32, 32), dtype=np.float32) for _ in range(2)]
    ys = [rng.integers(0, 10, 6) for _ in range(2)]
    fed = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=10)
    data = synthetic_perada(n_clients=3, n_train=300, n_test=60, n_aux=20, seed=0)
    from dataclasses import replace

    data = replace(data, federated=fed, aux={"out-of-domain": torch.rand(8, 3, 32, 32)})
    alg, _ = make_method("PerAda", data=data, protocol=replace(QUICK, kd_steps=1,
                                                                kd_batch_size=4),
                         backbone=None, arch="resnet18")
    assert alg.communicated_parameters() == 1_413_258
    from ebfl.learning.torch.engine import train

    res = train(alg, fed, n_rounds=1, local_steps=1, batch_size=2, seed=0)
    assert res.accuracy.shape == (2,)


def test_bad_input():
    with pytest.raises(ValueError, match="dataset"):
        reproduce_perada(dataset="cifar100", quick=True)
    with pytest.raises(ValueError, match="parts"):
        reproduce_perada(dataset="synthetic", quick=True, parts=["table9"])
    with pytest.raises(ValueError, match="resnet18"):
        reproduce_perada(dataset="synthetic", quick=True, arch="resnet18")
    with pytest.raises(ValueError, match="backbone_weights"):
        reproduce_perada(dataset="cifar10", quick=True, arch="resnet18")


def test_cli_bad_input_is_one_error_line(capsys):
    assert main(["reproduce", "perada", "--dataset", "synthetic", "--quick", "--arch",
                 "resnet18"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
