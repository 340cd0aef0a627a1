"""Table 1 experiment: client construction on the real data, and the CLI in quick mode."""

import json

import pytest

pytest.importorskip("torch")

from ebfl.generative.adaped import QUICK_ROUNDS, load_clients, table1  # noqa: E402
from tests.conftest import requires_data  # noqa: E402

needs_mnist = requires_data("mnist")
needs_hapt = requires_data("uci-hapt-raw")


@needs_mnist
def test_mnist_clients_follow_the_papers_split():
    data, make_model, info = load_clients("mnist", seed=0)
    assert data.n_clients == 50 and info["clients"] == 50
    assert int(data.n_train.sum() + data.n_test.sum()) == 70_000
    for i in range(50):
        tr = set(data.y_train[i, : data.n_train[i]].tolist())
        te = set(data.y_test[i, : data.n_test[i]].tolist())
        assert len(tr) == 3 and te <= tr
        # the test set follows the client's labels: about 20 % of each class
        for c in tr:
            n_c = int((data.y_train[i, : data.n_train[i]] == c).sum()
                      + (data.y_test[i, : data.n_test[i]] == c).sum())
            t_c = int((data.y_test[i, : data.n_test[i]] == c).sum())
            assert abs(t_c - 0.2 * n_c) <= 1
    x = data.x_train[0, : data.n_train[0]]
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    assert make_model()(x[:2]).shape == (2, 10)


@needs_hapt
def test_hapt_stand_in_has_30_subjects_and_six_activities():
    data, make_model, info = load_clients("hapt")
    assert data.n_clients == 30 and data.n_classes == 6
    assert make_model()(data.x_test[0, :3]).shape == (3, 6)


@needs_mnist
def test_cli_quick_runs_and_prints_the_papers_numbers(tmp_path, capsys):
    from ebfl.cli import main

    # 200 training images per client (of about 1,100): the pipeline, at a fifth of the cost.
    assert main(["reproduce", "adaped", "--quick", "--json", "--methods", "AdaPeD", "FedAvg",
                 "FedEM", "--samples-per-client", "200", "--plot", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"AdaPeD", "FedAvg", "FedEM"}
    assert out["paper"] == {"AdaPeD": [98.53, 0.11], "FedAvg": [92.93, 0.09]}
    s = out["settings"]
    assert s["clients"] == 50 and s["sampled_per_round"] == 5 and s["rounds"] == QUICK_ROUNDS
    for r in out["results"].values():
        assert 0 <= r["mean"] <= 100 and len(r["per_seed"]) == 1
    assert (tmp_path / "table1_mnist.png").exists()


def test_bad_input():
    with pytest.raises(ValueError, match="dataset"):
        load_clients("cifar")
    with pytest.raises(ValueError, match="unknown methods"):
        table1("mnist", methods=("AdaPeD", "SCAFFOLD"))


@needs_hapt
def test_dp_sweep_cli_reports_both_epsilons(tmp_path, capsys):
    from ebfl.cli import main

    assert main(["reproduce", "dp-adaped", "--dataset", "hapt", "--quick", "--json",
                 "--noise", "1", "--noise", "4", "--plot", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = out["runs"]
    assert [r["noise_multiplier"] for r in runs] == [1.0, 4.0]
    for r in runs:  # Theorem 7 understates epsilon (errata [!13])
        assert r["epsilon_accountant"] > r["epsilon_theorem7"] > 0
    assert runs[0]["epsilon_accountant"] > runs[1]["epsilon_accountant"]  # more noise, less eps
    assert set(out["reference"]) == {"AdaPeD", "Local"}
    assert (tmp_path / "dp_adaped_hapt.png").exists()


@needs_hapt
def test_adaped_fedem_cli_runs_both_methods_private_and_not(tmp_path, capsys):
    from ebfl.cli import main

    assert main(["reproduce", "adaped-fedem", "--dataset", "hapt", "--quick", "--json",
                 "--noise", "4", "--plot", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["settings"]
    assert s["sampled_per_round"] == s["clients"] == 30 and s["stand_in"]
    assert set(out["non_private"]) == {"AdaPeD", "FedEM"} and out["paper"] == {}
    (run,) = out["runs"]
    assert run["noise_multiplier"] == 4.0
    assert run["epsilon_accountant"] > run["epsilon_theorem7"] > 0
    for name in ("DP-AdaPeD", "DP-FedEM"):
        assert 0 <= run[name]["mean"] <= 100 and len(run[name]["per_seed"]) == 1
    assert (tmp_path / "adaped_fedem_hapt.png").exists()


def test_adaped_fedem_bad_input():
    from ebfl.generative.adaped import fedem_comparison

    with pytest.raises(ValueError, match="noise_multipliers"):
        fedem_comparison("hapt", noise_multipliers=(0.0,))
    with pytest.raises(ValueError, match="seeds"):
        fedem_comparison("hapt", seeds=())
