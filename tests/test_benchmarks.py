"""The benchmark scripts run end to end on tiny inputs (their figures are not asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks"


def _load(name):
    if str(BENCH) not in sys.path:  # the scripts import their shared _timing helper
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_npmle_smoke(capsys):
    bench = _load("bench_npmle")
    result = bench.main(["--n", "2000", "--budget", "1", "--reps", "1", "--json", "--no-r"])
    assert sorted(result["datasets"]) == ["p3", "sparse"]
    for data in result["datasets"].values():
        assert data["ours"]["kkt"] <= 1e-8 and data["ours"]["converged"]
        # EM can approach but never pass the certified optimum.
        ref, ours = data["reference"]["log_likelihood"], data["ours"]["log_likelihood"]
        assert ref <= ours + result["n"] * data["ours"]["kkt"]
        for ratio in data["ratio_reference_over_ours"].values():
            assert next(iter(ratio.values())) > 0
        assert data["goal"]["met"] is None  # --no-r
    assert capsys.readouterr().out.lstrip().startswith("{")


def test_bench_npmle_text(capsys):
    # The JSON output is the smoke test's.
    _load("bench_npmle").main(["--n", "500", "--budget", "0.5", "--reps", "1", "--data",
                               "sparse"])
    assert "P3 heteroskedastic NPMLE, sparse data" in capsys.readouterr().out


def test_bench_validation_smoke(capsys):
    result = _load("bench_validation").main(["--quick", "--reps", "1", "--json"])
    assert result["replicates"] == 100
    # Agreement of the two routes is tested with MC tolerances in test_validation.py.
    assert result["mse"]["ours"] > 0 and result["mse"]["numpy_loop"] > 0
    assert capsys.readouterr().out.lstrip().startswith("{")


def test_bench_federated_smoke():
    result = _load("bench_federated").main(["--quick", "--reps", "1", "--json"])
    assert result["m"] == 2000 and result["seconds"]["vectorized"] > 0


def test_bench_adaped_smoke():
    pytest.importorskip("torch")
    # Runs the vectorized and the loop AdaPeD round and checks they agree before timing.
    result = _load("bench_adaped").main(["--quick", "--reps", "1", "--json"])
    assert result["m"] == 10 and result["seconds_per_round"]["loop"] > 0
    assert result["threads"] == 1 and result["floor"]["matmul_gflop"] > 0


@pytest.mark.flower
def test_bench_flower_smoke(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("flwr", reason="P8 needs the flower extra")
    result = _load("bench_flower").main(["--quick", "--json"])
    assert result["max_abs_diff"] <= 1e-5  # the same job on both runtimes (0.0 here)
    assert result["seconds_per_round"]["flower"] > 0
    assert result["payload_bytes_per_round"]["down"] > 0
    assert capsys.readouterr().out.lstrip().startswith("{")


def test_bench_fedhdp_smoke(capsys):
    pytest.importorskip("torch")
    # Runs the vectorized and the loop FedHDP round and checks they agree before timing.
    result = _load("bench_fedhdp").main(["--quick", "--reps", "1", "--json"])
    assert result["clients_per_round"] == 10 and result["local_iterations"] == 2
    assert result["threads"] == 1 and result["seconds_per_round"]["loop"] > 0
    assert result["floor"]["matmul_gflop"] > 0
    assert capsys.readouterr().out.lstrip().startswith("{")


def test_bench_dppfl_smoke(capsys):
    # P7: the Figure 4 sweep (quick) and the kernel against its numpy twin
    result = _load("bench_dppfl").main(["--quick", "--json"])
    assert result["fits"] == 2 * 3 * 2 and result["sweep_seconds"] > 0
    for key in ("non_private", "private"):
        assert result[key]["twin_over_kernel"] > 1  # the twin is the slow reference
    assert result["floor_private_extra_per_iteration_s"] > 0
    assert capsys.readouterr().out.lstrip().startswith("{")


def test_bench_beta_bernoulli_smoke(capsys):
    # P1 in process, and one P5 child's body (make bench runs it in a fresh process).
    bench = _load("bench_beta_bernoulli")
    p1 = bench.run_p1(3000, seed=0, reps=1, methods=["mle", "loo_corrected"])
    assert set(p1["methods"]) == {"mle", "loo_corrected"}
    assert p1["streaming_read_seconds"] > 0 and p1["input_bytes"] == p1["n_observations"] + 8 * 3001
    bench.main(["--p5-child", "loo_proof", "--p5-clients", "3000", "--reps", "1"])
    child = json.loads(capsys.readouterr().out)
    assert child["method"] == "loo_proof" and child["input_bytes"] == 2 * 8 * 3000


def test_bench_ebnm_smoke(capsys):
    # A few families at n = 2000, with R's side where R and ebnm are installed (the
    # benchmark says when they are not, and times ebfl alone).
    families = ["normal", "point_laplace", "ash", "npmle", "flat"]
    result = _load("bench_ebnm").main(["--n", "2000", "--reps", "1", "--json",
                                             "--families", *families, "--large", "3000"])
    assert result["n"] == 2000 and list(result["families"]) == families
    assert list(result["large"]) == families and result["large"]["ash"]["n"] == 3000
    assert result["large"]["ash"]["kkt"] <= 1e-8 and result["large"]["normal"]["kkt"] is None
    with_r = result["r"]["available"]
    assert with_r or result["r"]["note"] == "R/ebnm not installed: ebfl only"
    for family, row in result["families"].items():
        assert row["ebfl_seconds"] > 0
        assert (row["ebfl_log_likelihood"] is None) == (family == "flat")
        assert (row["r_seconds"] is not None) == (with_r and row["r_error"] is None)
        if row["r_seconds"] is not None:
            assert row["ratio_r_over_ebfl"] > 0
    assert capsys.readouterr().out.lstrip().startswith("{")
