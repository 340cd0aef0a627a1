"""The FedHDP reproduction: metrics, the table's rows beside the paper's, quick runs."""

import contextlib
import io
import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")

from ebfl.fedhdp.experiment import (  # noqa: E402
    ALGORITHMS,
    fedhdp_metrics,
    plot_sweep,
    reproduce_fedhdp,
)
from tests.conftest import requires_data  # noqa: E402


def test_metrics_follow_section_5_2_and_the_papers_variance_convention():
    groups = np.array([0, 0, 1, 1, 1])
    g = np.array([1.0, 0.5, 0.25, 0.5, 0.75])
    p = np.array([1.0, 1.0, 0.5, 1.0, 1.0])
    out = fedhdp_metrics(0.9, g, p, groups)
    assert out["acc_g"] == pytest.approx(90.0)
    assert out["acc_g_np"] == pytest.approx(75.0)
    assert out["acc_g_p"] == pytest.approx(50.0)
    assert out["acc_l_p"] == pytest.approx(100 * 2.5 / 3)
    assert out["delta_g"] == pytest.approx(25.0)
    assert out["delta_l"] == pytest.approx(100 - 100 * 2.5 / 3)
    # "variance across clients" = 100 x var of the fractions: the paper's skewed r = 0 row
    # prints 7.1 (6.5): clients scoring 0 or 1 with mean 0.071 give 100 * 0.071 * 0.929 = 6.6
    acc = np.r_[np.ones(71), np.zeros(929)]
    out = fedhdp_metrics(0.1, acc, acc, np.ones(1000, int))
    assert out["acc_g_p"] == pytest.approx(7.1)
    assert out["acc_g_p_var"] == pytest.approx(100 * 0.071 * 0.929)
    assert math.isnan(out["acc_g_np"])
    # DP-FedAvg treats everyone as private, the non-private baseline everyone as non-private
    everyone = fedhdp_metrics(0.9, g, p, groups, all_private=True)
    assert everyone["acc_g_p"] == pytest.approx(100 * g.mean()) and math.isnan(
        everyone["acc_g_np"])
    nobody = fedhdp_metrics(0.9, g, p, groups, all_nonprivate=True)
    assert nobody["acc_l_np"] == pytest.approx(100 * p.mean()) and math.isnan(nobody["acc_l_p"])


@pytest.fixture(scope="module")
def sweep():
    return reproduce_fedhdp("synthetic", table="sweep", ratios=(0.0, 0.1), quick=True,
                            n_rounds=4)


def test_quick_sweep_runs_every_algorithm_beside_the_papers_rows(sweep, tmp_path):
    rows = sweep["rows"]
    assert [r["algorithm"] for r in rows] == [*ALGORITHMS[:3], "FedHDP", "FedHDP"]
    assert sweep["protocol"]["rounds"] == 4 and sweep["federation"]["n_clients"] == 200
    by = {(r["algorithm"], r["r"]): r for r in rows}
    # r = 0: private clients never train, so their personalized model is the global one
    r0 = by[("FedHDP", 0.0)]
    assert r0["acc_l_p"] == pytest.approx(r0["acc_g_p"])
    # the paper's Table 8 rows are attached (lambda = 0.005)
    assert by[("FedHDP", 0.1)]["paper"]["acc_g"] == pytest.approx(90.7)
    assert by[("DP-FedAvg+Ditto", None)]["paper"]["acc_g"] == pytest.approx(88.75)
    for r in rows:
        for key in ("acc_g", "acc_l_p", "acc_l_np", "acc_g_p", "acc_g_np"):
            v = r[key]
            assert math.isnan(v) or 0 <= v <= 100
    assert math.isinf(by[("Non-Private+Ditto", None)]["epsilon"])
    assert by[("FedHDP", 0.1)]["epsilon"] > 0
    path = plot_sweep(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000 and path.endswith("sweep.png")


@pytest.fixture(scope="module")
def table3_cli(tmp_path_factory):
    """``ebfl reproduce fedhdp --dataset synthetic --quick --rounds 3 --json`` with a
    checkpoint folder, run once for the module: its JSON payload and the folder. (One
    quick Table 3 serves the CLI test and the resumption test, which each ran their own.)
    """
    from ebfl.cli import main

    ck = tmp_path_factory.mktemp("fedhdp-checkpoints")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["reproduce", "fedhdp", "--dataset", "synthetic", "--quick", "--rounds",
                     "3", "--checkpoint-dir", str(ck), "--json"]) == 0
    return json.loads(out.getvalue()), ck


def test_table3_quick_with_checkpoints_resumes_to_the_same_result(table3_cli):
    """The same protocol and defaults as the CLI's run: every run resumes from its file."""
    a, ck = table3_cli
    b = reproduce_fedhdp("synthetic", quick=True, n_rounds=3, checkpoint_dir=ck)
    assert [r["acc_g"] for r in a["rows"]] == [r["acc_g"] for r in b["rows"]]
    assert len(list(ck.glob("*.pt"))) == len(a["rows"])


def test_bad_input():
    with pytest.raises(ValueError, match="dataset"):
        reproduce_fedhdp("cifar")
    with pytest.raises(ValueError, match="table"):
        reproduce_fedhdp("synthetic", table="5")
    with pytest.raises(ValueError, match="seeds"):
        reproduce_fedhdp("synthetic", seeds=[])


def test_cli_reproduce_fedhdp_json_and_bad_input(table3_cli, capsys):
    from ebfl.cli import main

    out, _ = table3_cli
    assert [r["algorithm"] for r in out["rows"]] == list(ALGORITHMS)
    assert out["rows"][0]["acc_g_p"] is None  # NaN -> null: no private clients
    assert out["rows"][3]["paper"]["acc_g"] == pytest.approx(92.48)
    for argv in (["--ratio", "1.5", "--sweep"], ["--lam", "-1"], ["--dataset", "cifar"],
                 ["--rounds", "0"]):
        assert main(["reproduce", "fedhdp", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and len(err.strip().splitlines()) == 1


@requires_data("mnist")
def test_quick_table3_on_non_iid_mnist_runs_end_to_end():
    out = reproduce_fedhdp("mnist", quick=True, n_rounds=2)
    assert out["federation"]["name"] == "noniid-mnist" and out["federation"]["n_clients"] == 200
    fedhdp = out["rows"][-1]
    assert fedhdp["algorithm"] == "FedHDP" and fedhdp["r"] == 0.01
    assert 0 <= fedhdp["acc_g"] <= 100 and fedhdp["paper"]["acc_g"] == pytest.approx(92.48)


@requires_data("fashion-mnist")
def test_fashion_mnist_stand_in_runs_table_7s_fmnist_column_beside_table_10():
    out = reproduce_fedhdp("fashion-mnist", quick=True, n_rounds=1)
    assert out["federation"]["name"] == "noniid-fashion-mnist"
    assert out["protocol"]["noise_multiplier"] == 4.0 and out["protocol"]["lr"] == 0.01
    fedhdp = out["rows"][-1]
    assert (fedhdp["r"], fedhdp["lambda"]) == (0.01, 0.05)
    assert fedhdp["paper"]["acc_g"] == pytest.approx(86.88)  # Table 10, lambda = 0.05
