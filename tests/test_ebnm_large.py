"""``ebfl.ebnm``'s grid families at large n: the search on cells of (x, s), the weights
refitted on the observations, or (beyond the refit size) certified on them.

Every claim is checked against an independent recomputation from scipy
(:func:`tests.test_ebnm.log_lik_matrix` and :func:`tests.test_ebnm.kkt_certificate`):
the reported kkt, log-likelihood and convergence flag are the data's, not the cells'.
"""

import numpy as np
import pytest

import ebfl
import ebfl.eb.normal_means.grid as grid
from tests.test_ebnm import kkt_certificate, log_lik_matrix

N = 25_000  # above grid.BIN_MIN: the cells' path


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    s = 10 ** rng.uniform(-0.5, 0.5, n)
    theta = np.where(rng.random(n) < 0.8, 0.0, 2.0 * rng.standard_t(5, n))
    return theta + s * rng.standard_normal(n), s


def test_the_cells_path_is_taken_and_cells_are_fewer():
    x, s = _data()
    assert x.size > grid.BIN_MIN
    cells = grid.cells(x, s)
    assert cells is not None and cells.x.size < x.size // 2
    assert cells.count.sum() == x.size
    # every cell's mean lies within its members' range (a quarter s wide in x)
    assert np.all(cells.s >= s.min()) and np.all(cells.s <= s.max())


@pytest.mark.parametrize("family", ["ash", "normal_scale_mixture", "unimodal_nonnegative"])
def test_refitted_on_the_data_with_the_datas_certificate(family):
    x, s = _data()
    fit = ebfl.ebnm(x, s, family)
    d = fit.diagnostics
    assert d["refitted"] and d["n_cells"] < x.size // 2
    kkt, loglik = kkt_certificate(log_lik_matrix(fit.fitted_g, x, s), fit.fitted_g.weights)
    assert d["converged"] and kkt <= 1e-8 + 1e-10
    assert fit.log_likelihood == pytest.approx(loglik, rel=1e-12)
    # the exact search (no cells) reaches the same optimum to a few 1e-9 relative (the
    # refined grids differ slightly)
    exact = _exact(x, s, family)
    assert fit.log_likelihood >= exact.log_likelihood - 1e-8 * abs(exact.log_likelihood)


def _exact(x, s, family, mode=0.0):
    saved = grid.BIN_MIN
    grid.BIN_MIN = 10**12
    try:
        return ebfl.ebnm(x, s, family, mode=mode)
    finally:
        grid.BIN_MIN = saved


def test_estimated_mode_on_cells():
    x, s = _data(seed=1)
    x = x + 1.5
    fit = ebfl.ebnm(x, s, "ash", mode="estimate")
    assert fit.mode == pytest.approx(1.5, abs=0.05)
    assert fit.diagnostics["converged"]
    for m in (0.0, 1.5):
        other = ebfl.ebnm(x, s, "ash", mode=m).log_likelihood
        assert fit.log_likelihood >= other - 1e-8 * abs(other)


def test_certified_without_refit_beyond_the_refit_size(monkeypatch):
    """With the refit disabled (REFIT_MAX = 0), the cells' weights are kept and the
    diagnostics are the data's: kkt and log-likelihood equal the recomputation, the
    gap bound is n kkt, and converged is kkt <= tol (true to the state either way)."""
    monkeypatch.setattr(grid, "REFIT_MAX", 0)
    x, s = _data(seed=2)
    fit = ebfl.ebnm(x, s, "normal_scale_mixture")
    d = fit.diagnostics
    assert not d["refitted"]
    kkt, loglik = kkt_certificate(log_lik_matrix(fit.fitted_g, x, s), fit.fitted_g.weights)
    assert d["kkt"] == pytest.approx(max(kkt, 0.0), rel=1e-6, abs=1e-12)
    assert d["log_likelihood_gap_bound"] == pytest.approx(x.size * d["kkt"])
    assert d["converged"] == (d["kkt"] <= 1e-8)
    assert fit.log_likelihood == pytest.approx(loglik, rel=1e-12)
    exact = _exact(x, s, "normal_scale_mixture")
    # the cells' optimum is within the certified gap of the data's
    assert fit.log_likelihood >= exact.log_likelihood - d["log_likelihood_gap_bound"] - 1e-6


def test_log_likelihood_in_row_blocks_equals_whole(monkeypatch):
    """The log-likelihood is summed over row blocks at large n (its (rows, components)
    temporaries would need tens of GB at n = 10^7 whole): the same number as whole, and
    the posterior's log marginals (the row-by-row kernel) sum to it."""
    x, s = _data(5000, seed=3)
    g = ebfl.ebnm(x, s, "unimodal").fitted_g
    whole = g.log_likelihood(x, s)
    monkeypatch.setattr(type(g), "_block_rows", lambda self: 777)
    assert g.log_likelihood(x, s) == pytest.approx(whole, rel=1e-13)
    assert float(g.posterior(x, s).log_marginal.sum()) == pytest.approx(whole, rel=1e-12)


@pytest.mark.parametrize("family", ["horseshoe", "deconvolver", "generalized_binary"])
def test_horseshoe_and_deconvolver_on_cells(monkeypatch, family):
    """Beyond CELLS_ABOVE entries (forced to 0 here) the fit runs on fine cells of (x, s):
    the log-likelihood reported is the data's, within 1e-6 relative of the exact fit's
    (the horseshoe: above it minus that; the deconvolver maximizes a penalized
    likelihood, so only closeness is claimed; the generalized binary: its profile in mu
    on the cells)."""
    import importlib

    module = importlib.import_module(f"ebfl.eb.normal_means.{family}")
    x, _ = _data(8000, seed=4)
    s = np.ones(x.size)  # one class of s: fine cells halve the rows
    exact = ebfl.ebnm(x, s, family)
    monkeypatch.setattr(module, "CELLS_ABOVE", 0)
    binned = ebfl.ebnm(x, s, family)
    assert binned.diagnostics["n_cells"] < x.size // 2
    assert binned.diagnostics["converged"]
    assert binned.log_likelihood == pytest.approx(exact.log_likelihood, rel=1e-6)
    assert binned.log_likelihood == pytest.approx(
        binned.fitted_g.log_likelihood(x, s), rel=1e-12)
