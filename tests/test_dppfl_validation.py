"""The rows ``dppfl_*`` of ``ebfl validate``: verdicts, flags and the helpers behind them."""

import json

import numpy as np
import pytest

from ebfl.cli import main
from ebfl.dppfl import checks as C
from ebfl.dppfl.algorithm import fit_dppfl
from ebfl.validation import CHECKS, validate

NAMES = [name for name in CHECKS if name.startswith("dppfl_")]


@pytest.fixture(scope="module")
def quick_rows():
    return validate(NAMES, quick=True, rng=0).results


def by_label(rows, name, text):
    found = [r for r in rows if r.name == name and text in r.label]
    assert found, (name, text)
    return found


def test_the_checks_are_registered():
    assert NAMES == ["dppfl_omega_step", "dppfl_lemma1", "dppfl_corollary2", "dppfl_corollary3",
                     "dppfl_duality_gap", "dppfl_linear_rate", "dppfl_theorem4"]


def test_only_flagged_statements_fail(quick_rows):
    assert len(quick_rows) >= 30
    assert all(r.verdict in ("holds", "violated") for r in quick_rows)
    unflagged_failures = [(r.name, r.label) for r in quick_rows
                          if r.verdict != "holds" and not r.flag]
    assert unflagged_failures == []
    # as for every check: exact rows hold, a false claim of the paper is a flagged bound
    assert all(r.verdict == "holds" for r in quick_rows if r.kind == "exact")


def test_omega_step_lemma1_corollary3_gap_and_rate_hold(quick_rows):
    for name in ("dppfl_omega_step", "dppfl_corollary3", "dppfl_duality_gap",
                 "dppfl_linear_rate"):
        rows = [r for r in quick_rows if r.name == name]
        assert rows and all(r.verdict == "holds" and not r.flag for r in rows), name
    exact = by_label(quick_rows, "dppfl_omega_step", "max |tr")[0]
    assert exact.estimate < 1e-12
    for row in by_label(quick_rows, "dppfl_lemma1", "MOCHA's constant"):
        assert row.verdict == "holds" and not row.flag
    for row in by_label(quick_rows, "dppfl_lemma1", "ratio (9)"):
        assert row.verdict == "holds" and row.estimate <= row.formula


def test_lemma1_as_printed_is_violated_and_flagged(quick_rows):
    rows = by_label(quick_rows, "dppfl_lemma1", "as printed in (7)")
    assert len(rows) == 2
    for row in rows:
        assert row.verdict == "violated" and "constant" in row.flag
        assert row.estimate < -0.1  # not a rounding matter


def test_corollaries_1_and_2(quick_rows):
    """Corollary 2 fails for lambda <= 1 and holds at lambda = 10 (where (8 lambda + beta) /
    (beta n_t) > 1); Corollary 1's modulus fails for every loss."""
    rows = by_label(quick_rows, "dppfl_corollary2", "bound")
    assert len(rows) == 8
    for row in rows:
        assert row.flag
        if row.params["lam"] <= 1.0:
            assert row.verdict == "violated" and row.estimate > 2.0
            assert row.extra["fraction_of_instances_violating"] > 0.5
        else:
            assert row.verdict == "holds" and row.estimate < 1.0
    for row in by_label(quick_rows, "dppfl_corollary2", "Corollary 1"):
        assert row.verdict == "violated" and row.estimate < 0.01 and row.flag


def test_corollary3_tight_bound_is_attained(quick_rows):
    tight = by_label(quick_rows, "dppfl_corollary3", "tight")[0]
    assert tight.estimate == pytest.approx(1.0, abs=1e-9)


def test_linear_rate_rows_are_informative(quick_rows):
    exact = by_label(quick_rows, "dppfl_linear_rate", "Theta = 0")[0]
    assert 0.5 < exact.extra["mean_contraction"] < exact.extra["mean_bound"] < 1.0
    sdca = by_label(quick_rows, "dppfl_linear_rate", "SDCA")[0]
    assert 0.0 < sdca.extra["mean_theta"] < 1.0
    assert sdca.extra["replay_max_abs_difference"] < 1e-9  # the replay is fit_dppfl's run
    steps = by_label(quick_rows, "dppfl_linear_rate", "K of (12)")[0]
    assert 0 < steps.extra["mean_iterations"] < steps.extra["mean_K_of_12"]


def test_theorem4_disagreement_is_flagged(quick_rows):
    """The statement's counts are at least its proof's (so the proof implies it), but they
    differ: those rows hold and carry the flag; the claim itself holds on the instances."""
    rows = {r.label.split(":")[0]: r for r in quick_rows if r.name == "dppfl_theorem4"}
    assert rows["K - K0"].verdict == "holds" and not rows["K - K0"].flag
    for key in ("K0 - k0", "k0", "K"):
        row = rows[key]
        assert row.kind == "lower" and row.verdict == "holds" and "disagree" in row.flag
        assert row.extra["difference"] > 0
    assert rows["K"].extra["printed"] != rows["K"].extra["proof"]
    assert rows["K0 - k0"].extra["difference"] == 2 / 0.5  # 2 / (xi (1 - Theta))
    claim = [r for r in quick_rows if r.name == "dppfl_theorem4" and "hinge" in r.label][0]
    assert claim.verdict == "holds" and 0 <= claim.estimate < claim.formula


def test_rows_are_reproducible_and_take_parameters():
    a = validate(["dppfl_corollary3"], n_reps=20, rng=4).results
    b = validate(["dppfl_corollary3"], n_reps=20, rng=4).results
    assert [r.estimate for r in a] == [r.estimate for r in b]
    rows = CHECKS["dppfl_corollary2"].run(n_reps=2, rng=0, lams=(50.0,), losses=("hinge",))
    assert rows[0].params["lam"] == 50.0 and rows[0].verdict == "holds"


def test_sdca_replay_matches_fit_dppfl():
    """The replay that measures theta follows fit_dppfl's own run (same kernel, streams)."""
    g = np.random.default_rng(0)
    X, y, offsets, omega = C.draw_instance(g, 3, 8, 2)
    fit = fit_dppfl(C._device_data(X, y, offsets), lam=0.1, xi=0.5, inner=15, outer=1,
                    loss="hinge", omega=omega, seed=7, record_every=1, parallel=False)
    duals, thetas = C.sdca_replay(X, y, offsets, omega, 0.1, 0.5, 15, "hinge", 1.0, 7, draws=3)
    np.testing.assert_allclose(duals, [row["dual"] for row in fit.history], atol=1e-10)
    assert thetas.shape == (15, 3)
    assert np.all(thetas >= -1e-9) and np.all(thetas <= 1 + 1e-9)


def test_draw_instance():
    X, y, offsets, omega = C.draw_instance(np.random.default_rng(1), 3, 5, 4)
    norms = np.linalg.norm(X, axis=1)
    assert X.shape == (15, 4) and np.all((norms >= 0.5 - 1e-12) & (norms <= 1 + 1e-12))
    assert set(np.unique(y)) <= {-1.0, 1.0} and offsets.tolist() == [0, 5, 10, 15]
    assert np.trace(omega) == pytest.approx(1.0)


def test_cli_validate_dppfl(capsys):
    assert main(["validate", "dppfl_omega_step", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["results"]] == ["dppfl_omega_step"] * 2
    assert out["counts"] == {"holds": 2, "violated": 0, "inconclusive": 0}
