"""Monte Carlo checks of the FedHDP theory (rows ``fedhdp_*`` of ``ebfl validate``) and the
paper's Figures 1-4 (``ebfl validate --plot``)."""

import json
import math

import numpy as np
import pytest

from ebfl.cli import main
from ebfl.fedhdp import checks as F
from ebfl.fedhdp import levels as L
from ebfl.fedhdp import theory as T
from ebfl.fedhdp.figures import FIGURES, plot_fedhdp_figures
from ebfl.validation import CHECKS, make_result, validate
from ebfl.validation.sweeps import plot_sweeps

NAMES = [name for name in CHECKS if name.startswith("fedhdp_")]


@pytest.fixture(scope="module")
def quick_rows():
    return validate(NAMES, quick=True, rng=0).results


def test_the_checks_are_registered():
    assert NAMES == ["fedhdp_server", "fedhdp_gaps", "fedhdp_local", "fedhdp_regression",
                     "fedhdp_levels"]


def test_exact_rows_hold_and_the_approximate_ones_are_flagged(quick_rows):
    by = {(r.name, r.label): r for r in quick_rows}
    assert len(quick_rows) >= 30
    failing = [(r.name, r.label) for r in quick_rows if r.verdict != "holds" and not r.flag]
    assert failing == []
    # Theorem 3's Bayes optimality fails for a private client by the derived excess...
    claim = by[("fedhdp_local", "private: MSE at lambda*_p <= Bayes (47) MSE (paired, "
                "Theorem 3)")]
    assert claim.kind == "upper" and claim.verdict == "violated" and "own noise" in claim.flag
    assert claim.extra["difference"] > 4 * claim.se
    derived = [r for r in quick_rows if "(paired, derived)" in r.label][0]
    assert derived.verdict == "holds" and derived.formula == pytest.approx(
        claim.extra["derived_excess"])
    assert derived.estimate == claim.extra["difference"]
    # ... and holds for the opt-out client (the two estimates agree to rounding).
    same = by[("fedhdp_local", "opt-out: MSE at lambda*_np <= Bayes (47) MSE (paired, "
               "Theorem 3)")]
    assert same.verdict == "holds" and abs(same.extra["difference"]) < 1e-12
    # Exact rows all hold (a false paper claim is a flagged bound, as in the other checks).
    assert all(r.verdict == "holds" for r in quick_rows if r.kind == "exact")
    flagged = [r.label for r in quick_rows if r.flag]
    assert any("eq. (18)" in label for label in flagged)
    assert sum("eq. (50)" in label for label in flagged) == 2


def test_the_paired_rows_resolve_their_differences(quick_rows):
    """The comparisons are informative: r* beats its neighbours by many standard errors,
    and the gaps (14)-(15) are far from 0."""
    for r in quick_rows:
        if r.name == "fedhdp_server" and ">= MSE(r*)" in r.label:
            assert r.verdict == "holds" and r.extra["difference"] > 4 * r.se
            assert r.extra["difference"] == pytest.approx(r.extra["formula_difference"],
                                                          abs=4 * r.se)
        if r.name == "fedhdp_gaps" and "FedHDP" in r.label:
            assert r.estimate > 4 * r.se


def test_a_wrong_formula_is_caught(quick_rows):
    """Each MSE row's standard error is small enough to reject a 3 % error, each gap row's
    (a difference of two MSEs, on the same draws) a 10 % error."""
    for r in quick_rows:
        if r.kind == "exact" and r.formula > 0.05:
            factor = 1.10 if r.name == "fedhdp_gaps" else 1.03
            wrong = make_result(r.name, r.label, "", "exact", factor * r.formula,
                                np.full(2, r.estimate), params={}, se=r.se)
            assert wrong.verdict == "violated", (r.name, r.label, r.se / r.formula)


def test_checks_are_reproducible_and_take_parameters():
    a = validate(["fedhdp_gaps"], n_reps=500, rng=3).results
    b = validate(["fedhdp_gaps"], n_reps=500, rng=3).results
    assert [r.estimate for r in a] == [r.estimate for r in b]
    rows = CHECKS["fedhdp_server"].run(n_reps=300, rng=0, ratios=(0.25,), gamma2=2.0)
    assert rows[2].label == "server MSE r=0.25" and rows[2].params["gamma2"] == 2.0
    assert rows[2].formula == T.server_mse(0.25, 20, 0.05, 1.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="opt-out"):
        CHECKS["fedhdp_local"].run(n_reps=10, rng=0, rho=0.0)


# ------------------------------------------- the simulation against naive code

def test_bayes_estimates_are_eq47():
    """The fused form used by the checks equals eq. (47)'s coefficients, as printed."""
    counts, alpha2, tau2, gammas2 = (3, 5), 0.7, 0.4, (0.2, 1.5)
    rng = np.random.default_rng(0)
    phi_j, phi_hat, psi = F.draw_clients(rng, 4, counts, alpha2, tau2, gammas2, d=2)
    got = F.bayes_estimates(phi_hat, psi, counts, alpha2, tau2, gammas2)
    sc = alpha2 + tau2
    s1, s2 = sc + counts[0] * gammas2[0], sc + counts[1] * gammas2[1]
    for j in range(sum(counts)):
        in1 = j < counts[0]
        n, m = (counts[1], counts[0] - 1) if in1 else (counts[1] - 1, counts[0])
        d = n * s1 + m * s2
        den = sc * d + s1 * s2
        others = np.arange(sum(counts)) != j
        sum1 = psi[:, :counts[0]][:, others[:counts[0]]].sum(axis=1)
        sum2 = psi[:, counts[0]:][:, others[counts[0]:]].sum(axis=1)
        ref = ((s1 * s2 + tau2 * d) / den * phi_hat[:, j] + s2 * (sc - tau2) / den * sum1
               + s1 * (sc - tau2) / den * sum2)
        np.testing.assert_allclose(got[:, j], ref, rtol=1e-12)


def test_personalized_mse_against_a_naive_simulation():
    """Any ratios and lambda, three levels; one client at a time, written out plainly."""
    counts, alpha2, tau2, gammas2 = (2, 3, 4), 0.8, 0.6, (0.0, 0.3, 2.0)
    ratios, lam, n_reps = (1.0, 0.4, 0.15), 1.7, 40_000
    rng = np.random.default_rng(11)
    n = sum(counts)
    group = np.repeat([0, 1, 2], counts)
    noise_sd = np.sqrt(np.array(counts)[group] * np.array(gammas2)[group])
    w = np.array(ratios)[group] / np.sum(np.array(counts) * np.array(ratios))
    phi_j = 0.3 + math.sqrt(tau2) * rng.standard_normal((n_reps, n))
    local = phi_j + math.sqrt(alpha2) * rng.standard_normal((n_reps, n))
    upload = local + noise_sd * rng.standard_normal((n_reps, n))
    glob = upload @ w
    for g in range(3):
        j = int(np.flatnonzero(group == g)[0])
        err = ((local[:, j] + lam * glob) / (1 + lam) - phi_j[:, j]) ** 2
        se = err.std(ddof=1) / math.sqrt(n_reps)
        want = L.levels_personalized_mse(lam, g, counts, alpha2, tau2, gammas2, ratios=ratios)
        assert abs(err.mean() - want) <= 4 * se, (g, err.mean(), want, se)
        glob_err = (glob - phi_j[:, j]) ** 2  # lambda -> inf
        want_inf = L.levels_personalized_mse(1e12, g, counts, alpha2, tau2, gammas2,
                                             ratios=ratios)
        assert abs(glob_err.mean() - want_inf) <= 4 * glob_err.std() / math.sqrt(n_reps)


def test_regression_draws_have_the_least_squares_law():
    """phi_hat_j - phi_j ~ N(0, alpha^2 I_d) (eq. (22) with beta^2 = n_s alpha^2)."""
    rng = np.random.default_rng(5)
    phi_j, phi_hat, psi = F.draw_regression_clients(rng, 3000, (2, 3), 0.5, 0.2, (0.0, 1.0),
                                                    d=3, n_samples=7)
    err = (phi_hat - phi_j).reshape(-1, 3)
    cov = np.cov(err.T)
    se = 0.5 * math.sqrt(2 / err.shape[0])
    np.testing.assert_allclose(np.diag(cov), 0.5, atol=4 * se)
    assert np.max(np.abs(cov - np.diag(np.diag(cov)))) <= 4 * 0.5 / math.sqrt(err.shape[0])
    assert np.all(psi[:, :2] == phi_hat[:, :2])  # the opt-out group adds no noise


# ------------------------------------------------------------------- figures

def test_figures(tmp_path):
    paths = plot_fedhdp_figures(tmp_path, n_reps=50, rng=0)
    assert [p.split("/")[-1] for p in paths] == [f"{name}.png" for name in FIGURES]
    assert all((tmp_path / f"{name}.png").stat().st_size > 10_000 for name in FIGURES)
    with pytest.raises(ValueError, match="unknown figure"):
        plot_fedhdp_figures(tmp_path, names=["fig9"])
    with pytest.raises(ValueError, match="n_reps"):
        plot_fedhdp_figures(tmp_path, n_reps=1)


def test_validate_plot_draws_them_too(tmp_path):
    """``ebfl validate --plot`` calls plot_sweeps, which draws the FedHDP figures as well."""
    paths = plot_sweeps(tmp_path, names=["fedhdp_fig4_server_vs_rho"], n_reps=20, rng=0)
    assert paths == [str(tmp_path / "fedhdp_fig4_server_vs_rho.png")]


def test_cli_validate_fedhdp(capsys):
    assert main(["validate", "fedhdp_gaps", "--reps", "200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["results"]] == ["fedhdp_gaps"] * 3
