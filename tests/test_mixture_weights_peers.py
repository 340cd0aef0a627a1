"""ebfl's mixture weights against R's mixsqp and ebnm on the same grids (peers as oracles).

R's ``mixsqp`` (Kim et al. 2020; Debian ``r-cran-mixsqp``) and ``ebnm``'s NPMLE
(``bash ../shared/peers/r-ebnm/install.sh``) are run through ``Rscript`` on the same
likelihood matrix or the same grid; ebfl's log-likelihood must be at least the peer's
minus 1e-6 relative. All cases go to one R process per peer. Skipped, with the reason,
where R or the package is not installed. Only run here, never copied or translated
(both are GPL).
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
from scipy import stats

from ebfl.eb import mixsqp, npmle_binomial, npmle_normal
from tests.rscript import require_r_package

R_SCRIPT = Path(__file__).parent / "r" / "mixture_weights.R"
REL = 1e-6
R_TIMEOUT = 600  # seconds; generous, for a loaded machine


def _require_r_package(package):
    return require_r_package(package)


def _run_r(tmp_path, cases):
    """Write the cases, run the R script once, return its JSON."""
    lines = []
    for name, kind, arrays in cases:
        for key, value in arrays.items():
            np.ascontiguousarray(value, dtype="<f8").tofile(tmp_path / f"{name}_{key}.bin")
        n, k = arrays["L"].shape if kind == "mixsqp" else (arrays["x"].size,
                                                            arrays["grid"].size)
        lines.append(f"{name} {kind} {n} {k}")
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    proc = subprocess.run([shutil.which("Rscript"), str(R_SCRIPT), str(tmp_path)],
                          capture_output=True, text=True, timeout=R_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sparse(seed, n, spread="constant"):
    """The reported shape: 70% of effects exactly 0, the rest +-Exp(mean 2)."""
    rng = np.random.default_rng(seed)
    theta = np.where(rng.random(n) < 0.7, 0, rng.exponential(2, n) * rng.choice([-1, 1], n))
    s = np.ones(n) if spread == "constant" else rng.uniform(0.5, 1.5, n)
    return theta + s * rng.standard_normal(n), s


def _normal_cases():
    rng = np.random.default_rng(11)
    t3 = rng.standard_t(3, 1500)
    s_dec = 10.0 ** rng.uniform(-1, 1, 1500)
    return {
        "report": _sparse(36, 200),  # the reproduction
        "sparse2000": _sparse(3, 2000, "uniform"),
        "t3_decades": (t3 + s_dec * rng.standard_normal(1500), s_dec),
    }


def test_likelihood_matrices_against_r_mixsqp(tmp_path):
    _require_r_package("mixsqp")
    cases, ours = [], {}
    for name, (x, s) in _normal_cases().items():
        grid = np.linspace(x.min(), x.max(), 300)
        lik = stats.norm.pdf(x[:, None], grid[None, :], s[:, None])
        cases.append((name, "mixsqp", {"L": lik}))
        ours[name] = (mixsqp(lik), npmle_normal(x, s, grid=grid))
    rng = np.random.default_rng(12)
    trials = rng.integers(1, 120, 5000)
    z = rng.binomial(trials, rng.beta(2, 8, 5000))
    grid = np.linspace(0, 1, 200)
    lik = stats.binom.pmf(z[:, None], trials[:, None], grid[None, :])
    cases.append(("binomial", "mixsqp", {"L": lik}))
    ours["binomial"] = (mixsqp(lik), npmle_binomial(z, trials, grid=grid))
    peers = _run_r(tmp_path, cases)
    for name, (on_matrix, on_data) in ours.items():
        peer = peers[name]["log_likelihood"]
        assert on_matrix.converged and on_data.converged
        assert on_matrix.log_likelihood >= peer - REL * abs(peer), name
        assert on_data.log_likelihood >= peer - REL * abs(peer), name
        assert np.isclose(np.sum(peers[name]["weights"]), 1.0, atol=1e-6)


def test_normal_npmle_against_r_ebnm_on_the_same_grid(tmp_path):
    _require_r_package("ebnm")
    cases, ours = [], {}
    for name, (x, s) in _normal_cases().items():
        grid = np.linspace(x.min(), x.max(), 300)
        cases.append((name, "ebnm", {"x": x, "s": s, "grid": grid}))
        ours[name] = npmle_normal(x, s, grid=grid)
    peers = _run_r(tmp_path, cases)
    for name, fit in ours.items():
        peer = peers[name]["log_likelihood"]
        assert fit.converged
        assert fit.log_likelihood >= peer - REL * abs(peer), name
