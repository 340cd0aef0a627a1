"""The Table 1 protocol search: cells per (size, seed), checkpoints, the table and figure."""

import json

import numpy as np
import pytest

import ebfl.generative.adaped_protocol as search
from ebfl.cli import main
from tests.conftest import requires_data


@pytest.fixture
def fake_table1(monkeypatch):
    """table1 replaced by a function of (method, size, seed); records its calls."""
    calls = []

    def table1(dataset, *, methods, seeds, samples_per_client, lr_grid, **kwargs):
        (seed,) = seeds
        calls.append((samples_per_client, seed))
        size = 1000 if samples_per_client is None else samples_per_client
        results = {}
        for i, name in enumerate(methods):
            acc = 50 + i + size / 100 + seed
            results[name] = {"per_seed": [acc], "seconds": [2.0], "mean": acc, "sd": 0.0}
            if lr_grid is not None:
                results[name] |= {"lr": [lr_grid[seed % len(lr_grid)]],
                                  "selection_seconds": [3.0]}
        return {"settings": {"rounds": 300, "sampled_per_round": 5, "metric": "accuracy"},
                "results": results, "curves": {}, "paper": {"FedAvg": [92.93, 0.09]}}

    import ebfl.generative.adaped as adaped
    monkeypatch.setattr(adaped, "table1", table1)
    return calls


def test_rows_are_means_over_seeds_beside_the_paper(fake_table1):
    out = search.protocol_search((50, "all"), methods=("FedAvg", "Local"), seeds=(0, 1, 2),
                                 lr_grid=(0.1, 0.05))
    assert fake_table1 == [(50, 0), (50, 1), (50, 2), (None, 0), (None, 1), (None, 2)]
    row = {(r["samples_per_client"], r["method"]): r for r in out["rows"]}
    local = row[50, "Local"]
    assert local["per_seed"] == [51.5, 52.5, 53.5]
    assert local["mean"] == pytest.approx(52.5) and local["sd"] == pytest.approx(1.0)
    assert local["paper"] is None and row["all", "FedAvg"]["paper"] == 92.93
    assert local["lr"] == [0.1, 0.05, 0.1] and local["seconds"] == pytest.approx(15.0)
    assert local["lr_at_edge"] == [True, True, True]  # a two-rate grid is all edge
    assert out["settings"]["sizes"] == [50, "all"]


def test_a_search_resumes_from_its_checkpoints(fake_table1, tmp_path):
    first = search.protocol_search((20, 40), methods=("FedAvg",), seeds=(0,),
                                   checkpoint_dir=tmp_path)
    assert len(fake_table1) == 2 and len(list(tmp_path.glob("*.json"))) == 2
    again = search.protocol_search((20, 40), methods=("FedAvg",), seeds=(0,),
                                   checkpoint_dir=tmp_path)
    assert len(fake_table1) == 2  # nothing re-run
    assert again == first
    # another setting is another cell
    search.protocol_search((20,), methods=("FedAvg",), seeds=(0,), lr_grid=(0.1,),
                           checkpoint_dir=tmp_path)
    assert len(fake_table1) == 3


def test_the_figure_is_drawn(fake_table1, tmp_path):
    out = search.protocol_search((50, 100, None), methods=("FedAvg", "Local"), seeds=(0, 1))
    path = search.plot_protocol_search(out, tmp_path / "search.png")
    assert (tmp_path / "search.png").stat().st_size > 10_000 and path.endswith("search.png")


@pytest.mark.parametrize("sizes, match", [((), "sizes"), ((1,), "sizes"), ((50, 2.5), "sizes")])
def test_bad_sizes(sizes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        search.protocol_search(sizes, methods=("FedAvg",))


def test_cli_refuses_a_bad_size(capsys):
    assert main(["reproduce", "adaped-protocol", "--sizes", "50", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --sizes")


@requires_data("mnist")
def test_cli_quick_search_on_mnist(tmp_path, capsys):
    pytest.importorskip("torch")
    code = main(["reproduce", "adaped-protocol", "--quick", "--sizes", "20", "--methods",
                 "FedAvg", "--checkpoint-dir", str(tmp_path / "ck"), "--plot",
                 str(tmp_path / "fig"), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["rows"]
    assert row["samples_per_client"] == 20 and 0 <= row["mean"] <= 100
    assert np.isfinite(row["seconds"]) and (tmp_path / "fig").is_dir()


def test_agreement_measures_the_gap_and_the_ordering_per_size():
    rows = [{"samples_per_client": 50, "method": "A", "mean": 90.0, "paper": 92.0},
            {"samples_per_client": 50, "method": "B", "mean": 97.0, "paper": 98.0},
            {"samples_per_client": 50, "method": "Local", "mean": 99.0, "paper": None},
            {"samples_per_client": "all", "method": "A", "mean": 98.0, "paper": 92.0},
            {"samples_per_client": "all", "method": "B", "mean": 97.0, "paper": 98.0},
            {"samples_per_client": "all", "method": "Local", "mean": 99.0, "paper": None}]
    small, full = search.agreement(rows)
    assert small["samples_per_client"] == 50 and small["methods"] == 2
    assert small["rms_gap"] == pytest.approx(np.sqrt((4 + 1) / 2))
    assert small["max_gap"] == -2.0 and small["worst"] == "A"
    assert small["kendall_tau"] == pytest.approx(1.0)  # the paper's ordering
    assert full["max_gap"] == 6.0 and full["kendall_tau"] == pytest.approx(-1.0)
    assert search.agreement(rows[2:3]) == []
    assert search.agreement(rows[:1])[0]["kendall_tau"] is None


def test_the_search_names_the_size_closest_to_the_paper(fake_table1):
    # the fake's FedAvg is 50 + 1 + size / 100 against the paper's 92.93
    out = search.protocol_search((50, 4000, "all"), methods=("Local", "FedAvg"))
    assert out["best"] == 4000
    assert [a["samples_per_client"] for a in out["agreement"]] == [50, 4000, "all"]
    assert out["agreement"][1]["max_gap"] == pytest.approx(91.0 - 92.93)


def test_cli_prints_the_agreement_and_the_closest_size(fake_table1, capsys):
    assert main(["reproduce", "adaped-protocol", "--sizes", "50", "4000",
                 "--methods", "FedAvg", "Local"]) == 0
    out = capsys.readouterr().out
    assert "Agreement with the paper" in out and "closest to the paper: 4000" in out
    assert "FedAvg: closest at 4000 images per client, -2.93 points" in out


def test_several_searches_are_drawn_side_by_side(fake_table1, tmp_path):
    default = search.protocol_search((50, None), methods=("FedAvg",), seeds=(0, 1))
    tuned = search.protocol_search((50,), methods=("FedAvg",), lr_grid=(0.1, 0.05))
    search.plot_protocol_search([default, tuned], tmp_path / "both.png")
    from matplotlib.image import imread

    height, width = imread(tmp_path / "both.png").shape[:2]
    assert width > 1.5 * height  # two panels
    with pytest.raises(ValueError, match="result"):
        search.plot_protocol_search([], tmp_path / "none.png")


def test_each_method_gets_the_size_closest_to_its_paper_value(fake_table1):
    # FedAvg (the fake's second method) is 51 + size / 100: closest to 92.93 at 4000 among
    # these, 1.93 below; Local has no paper value
    out = search.protocol_search((50, 4000, 9000), methods=("Local", "FedAvg"))
    assert out["closest"] == {"FedAvg": {"samples_per_client": 4000,
                                         "gap": pytest.approx(91.0 - 92.93)}}


def test_cli_marks_a_rate_chosen_at_the_grids_edge(fake_table1, capsys):
    # the fake chooses lr_grid[seed % 3]: 0.2 (edge), 0.1 (inside), 0.05 (edge)
    assert main(["reproduce", "adaped-protocol", "--sizes", "50", "--methods", "FedAvg",
                 "--seeds", "3", "--lr-grid", "0.2", "0.1", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "0.2* 0.1 0.05*" in out and "*: the grid's smallest or largest" in out
