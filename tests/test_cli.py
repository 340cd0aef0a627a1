"""The ``ebfl`` command line: one JSON object with --json, readable tables otherwise."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from ebfl import beta_binomial_eb
from ebfl import bounds as B
from ebfl.cli import main


def _json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object
    return json.loads(out)


def test_bounds_gaussian_json(capsys):
    out = _json(capsys, ["bounds", "gaussian", "--clients", "10000", "--samples-per-client",
                         "15", "--sigma-theta", "0.1", "--sigma-x", "0.5", "--json"])
    assert out["theorem1"] == pytest.approx(0.0062510, abs=5e-8)
    assert out["weight"] == pytest.approx(0.375)
    assert out["local"] == pytest.approx(0.0166667, abs=5e-8)
    assert out["global_only"] == pytest.approx(B.gaussian_global_mse(10_000, 15, 0.1, 0.5))
    assert out["oracle"] == pytest.approx(B.gaussian_oracle_mse(15, 0.1, 0.5))
    d3 = _json(capsys, ["bounds", "gaussian", "--clients", "10000", "--samples-per-client",
                        "15", "--sigma-theta", "0.1", "--sigma-x", "0.5", "--d", "3", "--json"])
    assert d3["theorem1"] == pytest.approx(3 * out["theorem1"])


def test_bounds_beta_json_and_table(capsys):
    out = _json(capsys, ["bounds", "beta", "--alpha", "2", "--beta", "2", "--samples-per-client",
                         "14", "--json"])
    assert out["posterior"] == pytest.approx(0.0111111, abs=5e-8)
    assert out["local"] == pytest.approx(0.0142857, abs=5e-8)
    assert main(["bounds", "beta", "--alpha", "2", "--beta", "2", "--samples-per-client",
                 "14"]) == 0
    assert "posterior" in capsys.readouterr().out


def test_bad_arguments_give_clear_error(capsys):
    assert main(["bounds", "beta", "--alpha", "-1", "--beta", "2", "--samples-per-client",
                 "14"]) == 2
    assert "alpha" in capsys.readouterr().err


def test_fit_beta_binomial_counts_and_long_format(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = rng.integers(3, 20, size=60)
    z = rng.binomial(n, rng.beta(2, 5, size=60))
    pd.DataFrame({"wins": z, "games": n}).to_csv(tmp_path / "counts.csv", index=False)
    out = _json(capsys, ["fit", "beta-binomial", str(tmp_path / "counts.csv"), "--successes",
                         "wins", "--trials", "games", "--output", str(tmp_path / "est.csv"),
                         "--json"])
    direct = beta_binomial_eb(z, n)
    assert out["prior"]["alpha"] == pytest.approx(direct.prior.alpha)
    assert out["converged"] is direct.diagnostics["converged"] is True
    assert out["active_bounds"] == list(direct.diagnostics["active_bounds"])
    est = pd.read_csv(tmp_path / "est.csv")
    np.testing.assert_allclose(est["estimate"], direct.posterior.mean)
    wins = [[1] * a + [0] * (b - a) for a, b in zip(z, n, strict=True)]
    long = pd.DataFrame({"team": np.repeat(np.arange(60), n), "win": np.concatenate(wins)})
    long.to_csv(tmp_path / "long.csv", index=False)
    out2 = _json(capsys, ["fit", "beta-binomial", str(tmp_path / "long.csv"), "--client", "team",
                          "--value", "win", "--method", "loo_corrected", "--json"])
    assert out2["n_clients"] == 60 and out2["method"] == "loo_corrected"


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zip", ".tar.gz"])
def test_fit_reads_every_compressed_kind_as_the_plain_csv(suffix, tmp_path, capsys):
    """The size-limited reader opens each archive kind itself: same estimates as the CSV,
    and a header repeated only in appearance ("x" and "x.1") is not a repeated one."""
    pd.DataFrame({"wins": [3, 1, 4, 0], "games": [5, 4, 6, 3], "wins.1": [0, 0, 0, 0]}).to_csv(
        tmp_path / "counts.csv", index=False)
    plain = tmp_path / "counts.csv"
    packed = tmp_path / f"counts.csv{suffix}"
    if suffix == ".tar.gz":
        import tarfile

        with tarfile.open(packed, "w:gz") as tar:
            tar.add(plain, arcname="counts.csv")
    else:
        pd.read_csv(plain).to_csv(packed, index=False)  # pandas compresses by the suffix
    argv = ["fit", "beta-binomial", "--successes", "wins", "--trials", "games", "--json"]
    assert _json(capsys, [*argv, str(packed)]) == _json(capsys, [*argv, str(plain)])


def test_fit_gaussian_long_format(tmp_path, capsys):
    rng = np.random.default_rng(1)
    ids = np.repeat(np.arange(40), 5)
    frame = pd.DataFrame({"id": ids, "y": rng.normal(size=40)[ids] + rng.normal(size=200)})
    frame.sample(frac=1.0, random_state=0).to_csv(tmp_path / "obs.csv", index=False)
    out = _json(capsys, ["fit", "gaussian", str(tmp_path / "obs.csv"), "--client", "id",
                         "--value", "y", "--output", str(tmp_path / "est.csv"), "--json"])
    assert out["n_clients"] == 40 and out["sigma_x"] > 0
    est = pd.read_csv(tmp_path / "est.csv")
    assert list(est["client"]) == list(range(40))


def test_demo_json(capsys):
    out = _json(capsys, ["demo", "--clients", "2000", "--json"])
    assert {"gaussian", "beta_bernoulli"} == set(out)
    rows = {r["estimator"]: r for r in out["gaussian"]["rows"]}
    assert rows["Theorem 1 (sigmas known)"]["mse"] < rows["local mean"]["mse"]
    assert all(r["mse_se"] > 0 for part in out.values() for r in part["rows"])


def test_demo_prints_tables(capsys):
    """Headings with the setting, the fitted prior, aligned columns, no Python reprs."""
    assert main(["demo", "--clients", "2000", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out and "[" not in out and "None" not in out
    lines = out.splitlines()
    assert lines[0] == ("Gaussian: m = 2000 clients, n = 15 samples each, prior N(mu = 0.3, "
                        "sigma_theta = 0.1), sigma_x = 0.5")
    assert lines[1].startswith("fitted by EB (MLE): mu = ")
    assert "Beta-Bernoulli: m = 2000 clients, n = 14 trials each, prior Beta(alpha = 2, "\
           "beta = 2)" in lines
    assert max(map(len, lines)) <= 100
    header = next(ln for ln in lines if ln.lstrip().startswith("estimator"))
    row = next(ln for ln in lines if ln.lstrip().startswith("oracle (prior known)"))
    # right-aligned numbers: each column ends where its header ends
    for name in ("empirical MSE", "closed form", "ratio"):
        end = header.index(name) + len(name)
        assert row[end - 1] != " " and (end == len(row) or row[end] == " ")
    assert "0.006250" in row  # Theorem 1's oracle MSE, 4 significant digits
    eb = next(ln for ln in lines if ln.lstrip().startswith("EB, all unknown"))
    assert eb.split()[-2:] == ["—", "—"]  # no closed form, no ratio
    mle = next(ln for ln in lines if ln.lstrip().startswith("EB mle"))
    assert re.search(r"  \(\d\.\d{3}, \d\.\d{3}\)  ", mle)  # the fitted Beta(alpha, beta)
    assert sum(ln.startswith("What the numbers show:") for ln in lines) == 2


def test_version(capsys):
    from ebfl import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ebfl {__version__}\n"


def test_fit_refuses_missing_client_ids(tmp_path, capsys):
    pd.DataFrame({"id": [1, None, 2], "y": [1, 0, 1]}).to_csv(tmp_path / "x.csv", index=False)
    for model in ("beta-binomial", "gaussian"):
        assert main(["fit", model, str(tmp_path / "x.csv"), "--client", "id", "--value",
                     "y"]) == 2
        assert "missing client id(s), the first at data row 2" in capsys.readouterr().err


def test_bounds_gaussian_quantized_and_private(capsys):
    base = ["bounds", "gaussian", "--clients", "10000", "--samples-per-client", "15",
            "--sigma-theta", "0.1", "--sigma-x", "0.5", "--r", "1", "--json"]
    q = _json(capsys, base + ["--k-bits", "1"])
    assert q["theorem2"] == pytest.approx(0.0064131, abs=5e-8)
    assert q["b"] == pytest.approx(2.0531, abs=5e-5) and q["mechanism"] == "quantizer"
    g = _json(capsys, base + ["--epsilon", "1", "--delta", "1e-5"])
    assert g["theorem2"] == pytest.approx(0.012572, abs=5e-7)
    assert g["weight"] == pytest.approx(0.75429, abs=5e-6)
    assert main(base[:-3] + ["--k-bits", "2"]) == 2  # no --r
    assert "--r" in capsys.readouterr().err


def test_private_bernoulli_figure(tmp_path, capsys):
    out = _json(capsys, ["private-bernoulli", "--clients", "3000", "--epsilon", "1",
                         "--epsilon", "100", "--plot", str(tmp_path), "--json"])
    assert (tmp_path / "private_bernoulli.png").stat().st_size > 10_000
    high = out["rows"][-1]
    assert high["paper_weight"] > 0.9
    assert high["corrected_weight"] == pytest.approx(
        out["reference"]["loo_corrected"]["weight"], abs=0.03)


def test_accounting_dp_adaped(capsys):
    from ebfl.privacy import dp_adaped_epsilon

    argv = ["accounting", "dp-adaped", "--clients", "66", "--clients-per-round", "22",
            "--rounds", "240", "--local-steps", "10", "--clip", "1", "--noise", "5",
            "--clip-psi", "1", "--noise-psi", "5", "--json"]
    out = _json(capsys, argv)
    direct = dp_adaped_epsilon(1e-5, n_clients=66, n_sampled=22, n_iterations=2400, sync_gap=10,
                               clip_mu=1.0, noise_mu=5.0, clip_psi=1.0, noise_psi=5.0)
    assert out["epsilon"] == pytest.approx(direct.epsilon)
    assert out["theorem7_epsilon_classic"] == pytest.approx(5.76, abs=0.005)  # spec D.9.5
    assert out["epsilon"] > out["theorem7_epsilon_lemma2"]
    assert main(argv[:-5] + ["--delta", "1.5"]) == 2
    assert "delta" in capsys.readouterr().err


def test_fit_npmle_binomial_and_gaussian(tmp_path, capsys):
    from ebfl import npmle_binomial, npmle_normal

    rng = np.random.default_rng(2)
    n = rng.integers(5, 30, size=200)
    z = rng.binomial(n, rng.choice([0.2, 0.8], size=200))
    pd.DataFrame({"wins": z, "games": n}).to_csv(tmp_path / "counts.csv", index=False)
    out = _json(capsys, ["fit", "beta-binomial", str(tmp_path / "counts.csv"), "--successes",
                         "wins", "--trials", "games", "--method", "npmle", "--output",
                         str(tmp_path / "est.csv"), "--json"])
    direct = npmle_binomial(z, n)
    assert out["method"] == "npmle" and out["converged"]
    assert out["log_likelihood"] == pytest.approx(direct.log_likelihood)
    assert out["log_likelihood_gap_bound"] == pytest.approx(z.size * direct.kkt)
    np.testing.assert_allclose(pd.read_csv(tmp_path / "est.csv")["estimate"],
                               direct.posterior_mean)

    x, s = rng.normal(size=150), rng.uniform(0.5, 1.0, size=150)
    pd.DataFrame({"m": x, "se": s}).to_csv(tmp_path / "means.csv", index=False)
    out = _json(capsys, ["fit", "gaussian", str(tmp_path / "means.csv"), "--mean", "m", "--se",
                         "se", "--method", "npmle", "--json"])
    assert out["log_likelihood"] == pytest.approx(npmle_normal(x, s).log_likelihood)
    assert main(["fit", "gaussian", str(tmp_path / "means.csv"), "--client", "m", "--value",
                 "se", "--method", "npmle"]) == 2
    assert "npmle needs --mean" in capsys.readouterr().err


def test_validate_json_and_table(tmp_path, capsys):
    out = _json(capsys, ["validate", "known_beta", "mechanism7", "--reps", "10", "--json"])
    assert {r["name"] for r in out["results"]} == {"known_beta", "mechanism7"}
    assert sum(out["counts"].values()) == len(out["results"])
    assert main(["validate", "thm4", "--reps", "5"]) == 0
    text = capsys.readouterr().out
    assert "violated" in text and "[!5]" in text
    assert main(["validate", "nope"]) == 2


def test_reproduce_estimation_quick(tmp_path, capsys):
    out = _json(capsys, ["reproduce", "estimation", "--quick", "--plot", str(tmp_path),
                         "--json"])
    e1 = {row["paper_row"]: row for row in out["E1"]}
    # Done criterion: the fully specified priors reproduce the paper within its ±.
    assert e1["uniform"]["within_paper_band"] and e1["3-spike"]["within_paper_band"]
    assert all("paper_decrease_pct" in row for row in out["E1"])
    rows = out["E8"]["rows"]
    assert [r["epsilon"] for r in rows] == sorted(r["epsilon"] for r in rows)
    assert (tmp_path / "e8_mse_vs_epsilon.png").exists()
    # E8: Theorem 2.2 is exact when nothing is clipped; every eps0 within 4 SE.
    assert out["E8"]["clipped_run_fraction"] == 0.0
    for r in rows:
        assert abs(r["mse"]["mean"] - r["formula"]) <= 4 * r["mse"]["se"], r["epsilon"]
    # a quick run says what it is: here only fewer replicates, so still the paper's setting
    assert "fewer Monte Carlo replicates" in out["quick_note"]


def test_reproduce_regression_quick(tmp_path, capsys):
    out = _json(capsys, ["reproduce", "regression", "--quick", "--plot", str(tmp_path),
                         "--json"])
    assert [row["d"] for row in out["rows"]] == [50, 100]
    for row in out["rows"]:
        mse = {k: v["mean"] for k, v in row["mse"].items()}
        # The known prior is Bayes-optimal: no estimator beats it on average.
        assert min(mse.values()) == mse["personalized (known prior)"]
        assert row["paper"]["vs_local"][0] in (8.0, 9.2)
    assert (tmp_path / "e3_regression.png").exists()
    # a quick run at reduced scale says its numbers are not the paper's, in both outputs
    assert "not comparable with the paper's" in out["quick_note"]
    assert main(["reproduce", "regression", "--quick", "--quiet"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(out["quick_note"])


def test_missing_dataset_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    assert main(["reproduce", "adaped", "--dataset", "femnist", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no LEAF FEMNIST train files")


@pytest.mark.parametrize("method, mu, tau2", [
    ("reml", -0.7145323484, 0.3132433260),   # metafor 3.8.1 rma(method="REML")
    ("dl", -0.7141172221, 0.3087602629),     # metafor 3.8.1 rma(method="DL")
])
def test_fit_gaussian_reproduces_metafor_on_bcg(tmp_path, capsys, method, mu, tau2):
    """`ebfl fit gaussian means.csv --mean yi --se sei --method reml` on the BCG trials."""
    from tests.test_gaussian import _bcg_log_risk_ratios

    yi, sei = _bcg_log_risk_ratios()
    path = tmp_path / "means.csv"
    pd.DataFrame({"yi": yi, "sei": sei}).to_csv(path, index=False)
    out = _json(capsys, ["fit", "gaussian", str(path), "--mean", "yi", "--se", "sei",
                         "--method", method, "--json"])
    assert out["method"] == method
    assert out["prior"]["mean"] == pytest.approx(mu, rel=1e-6)
    assert out["prior"]["tau2"] == pytest.approx(tau2, rel=1e-6)
    if method == "reml":
        assert out["restricted_log_likelihood"] == pytest.approx(-12.2023714155, rel=1e-6)
        assert out["converged"] is True
    else:
        assert out["q_statistic"] == pytest.approx(152.2330, abs=1e-4)


def test_fit_normal_means_writes_every_posterior_and_matches_the_library(tmp_path, capsys):
    from ebfl.eb import ebnm

    rng = np.random.default_rng(3)
    theta = np.where(rng.random(300) < 0.7, 0.0, rng.normal(0, 2, 300))
    s = rng.uniform(0.3, 1.5, 300)
    x = theta + s * rng.standard_normal(300)
    ids = [f"gene{i}" for i in range(300)]
    pd.DataFrame({"gene": ids, "beta": x, "se": s}).to_csv(tmp_path / "fx.csv", index=False)
    out = _json(capsys, ["fit", "normal-means", str(tmp_path / "fx.csv"), "--x", "beta", "--s",
                         "se", "--family", "point_laplace", "--mode", "estimate", "--id", "gene",
                         "--output", str(tmp_path / "post.csv"), "--json"])
    direct = ebnm(x, s, "point_laplace", mode="estimate")
    assert out["family"] == "point_laplace" and out["n"] == 300 and out["converged"]
    assert out["log_likelihood"] == pytest.approx(direct.log_likelihood, rel=1e-12)
    assert out["mode"] == pytest.approx(direct.mode)
    assert sum(c["weight"] for c in out["prior_components"]) == pytest.approx(1.0)
    post = pd.read_csv(tmp_path / "post.csv")
    assert post["id"].tolist() == ids
    np.testing.assert_allclose(post["mean"], direct.posterior.mean, rtol=1e-12)
    np.testing.assert_allclose(post["lfsr"], direct.posterior.lfsr, rtol=1e-12, atol=1e-300)
    assert main(["fit", "normal-means", str(tmp_path / "fx.csv"), "--x", "beta", "--s", "se",
                 "--family", "unimodal"]) == 0
    text = capsys.readouterr().out
    assert "unimodal" in text and "lfsr" in text


def _ebfl_process(code, **kwargs):
    """``python -c code`` in a fresh interpreter (what the console script does)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], text=True, timeout=600, **kwargs)


#: Makes a module uninstalled in the process (an import finder that refuses it; None in
#: sys.modules would also fool the libraries that look there for it, like SciPy).
_BLOCK = """import sys
class _Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Uninstalled())
"""


@pytest.mark.parametrize(("blocked", "argv", "extra"), [
    ("torch", ["reproduce", "adaped", "--quick"], "learning"),
    ("torch", ["reproduce", "fedhdp", "--quick"], "learning"),
    ("flwr", ["flower", "simulate", "eb-gaussian", "--dataset", "simulated"], "flower"),
])
def test_a_missing_extra_is_one_error_line_naming_it(blocked, argv, extra):
    """Without the optional dependency (uninstalled in a fresh interpreter), the command
    prints one ``error:`` line that names the extra and exits 2: no traceback."""
    done = _ebfl_process(_BLOCK.format(blocked=blocked)
                         + f"from ebfl.cli import main\nsys.exit(main({argv!r}))",
                         capture_output=True)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert f"'ebfl[{extra}]'" in done.stderr and blocked in done.stderr


def test_a_closed_pipe_ends_quietly():
    """``ebfl demo --json | head``: the reader has gone before the output is written (a
    pipe whose read end is closed first, so the write fails every time). No
    ``error:`` line, no traceback: status 1, nothing on stderr."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        done = _ebfl_process("import sys\nfrom ebfl.cli import main\n"
                             "sys.exit(main(['demo', '--json']))", stdout=write,
                             stderr=-1)  # subprocess.PIPE
    finally:
        os.close(write)
    assert done.returncode == 1
    assert done.stderr == ""


def test_import_and_version_do_not_load_the_solvers():
    """``import ebfl`` and ``ebfl --version`` import neither SciPy's statistics nor Numba
    (the public names load on first use): they answer in a fraction of a second."""
    code = ("import sys\nimport ebfl\nfrom ebfl.cli import main\nmain(['--version'])\n"
            "print(sorted(m for m in ('scipy.stats', 'numba', 'torch', 'ebfl.eb.gaussian')"
            " if m in sys.modules))")
    done = _ebfl_process(code, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    # and the names are there when used
    done = _ebfl_process("import ebfl\nprint(ebfl.ebnm.__name__, ebfl.bounds.__name__, "
                         "'ebnm' in dir(ebfl), ebfl.eb.npmle.__name__)", capture_output=True)
    assert done.stdout.split() == ["ebnm", "ebfl.bounds", "True", "ebfl.eb.npmle"]


def test_fit_keeps_the_client_ids_of_the_id_column(tmp_path, capsys):
    """``--id`` keeps the clients' names (else rows are numbered from 0), and the weight
    on each client's own mean is the column ``weight_on_own_mean``; ``--id`` with
    ``--client`` (whose values are the ids) is refused in one error line."""
    path = tmp_path / "counts.csv"
    pd.DataFrame({"team": ["a", "b", "c", "d", "e"], "wins": [3, 7, 0, 9, 4],
                  "games": [10, 12, 5, 9, 11]}).to_csv(path, index=False)
    out = _json(capsys, ["fit", "beta-binomial", str(path), "--successes", "wins", "--trials",
                         "games", "--id", "team", "--output", str(tmp_path / "est.csv"),
                         "--json"])
    est = pd.read_csv(tmp_path / "est.csv")
    assert list(est["client"]) == ["a", "b", "c", "d", "e"]
    direct = beta_binomial_eb([3, 7, 0, 9, 4], [10, 12, 5, 9, 11])
    np.testing.assert_allclose(est["weight_on_own_mean"], direct.shrinkage)
    assert out["mean_weight_on_own_mean"] == pytest.approx(float(np.mean(direct.shrinkage)))
    # the Gaussian fit (means and standard errors), and its NPMLE
    gpath = tmp_path / "means.csv"
    pd.DataFrame({"site": ["x", "y", "z", "w"], "m": [0.1, 0.5, -0.2, 0.3],
                  "se": [0.2, 0.3, 0.25, 0.2]}).to_csv(gpath, index=False)
    for method in ("mle", "npmle"):
        assert main(["fit", "gaussian", str(gpath), "--mean", "m", "--se", "se", "--id", "site",
                     "--method", method, "--output", str(tmp_path / "g.csv")]) == 0
        assert list(pd.read_csv(tmp_path / "g.csv")["client"]) == ["x", "y", "z", "w"]
    capsys.readouterr()
    assert main(["fit", "beta-binomial", str(path), "--client", "team", "--value", "wins",
                 "--id", "team"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --id")
    assert main(["fit", "gaussian", str(gpath), "--mean", "m", "--se", "se", "--id",
                 "nope"]) == 2
    assert "--id: column 'nope' is not in the file" in capsys.readouterr().err


def test_progress_bars_in_a_terminal_only_and_quiet_silences_them(monkeypatch, capsys):
    """A long command shows tqdm bars on stderr where stderr is a terminal, none in a
    log or a pipe, and none with ``--quiet``; stdout holds the result either way."""
    import sys

    argv = ["validate", "thm1", "--reps", "20", "--seed", "1", "--json"]
    assert main(argv) == 0  # stderr captured: not a terminal
    first = capsys.readouterr()
    assert first.err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    shown = capsys.readouterr()
    assert "thm1:" in shown.err and "%|" in shown.err and "/20 [" in shown.err  # a tqdm bar
    assert json.loads(shown.out) == json.loads(first.out)  # the same result
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
