"""Discrete-mixture priors: Theorem 5, Lemma 1 and Algorithm 1."""

import math

import numpy as np
import pytest

from ebfl.eb.discrete import (
    discrete_mixture_eb,
    discrete_posterior,
    expected_posterior_variance,
    lemma1_radius,
)
from ebfl.privacy import GaussianMechanism, StochasticQuantizer

Z_MC = 4.0
ATOMS = np.array([[-2.0, 0.0], [0.0, 1.5], [2.0, -0.5]])
PROBS = np.array([0.5, 0.3, 0.2])
SIGMA_X, N = 2.0, 4  # s = 1: the atoms overlap, so the posterior mean is not trivial


def _simulate(m, seed, atoms=ATOMS, probs=PROBS, n=N):
    rng = np.random.default_rng(seed)
    theta = atoms[rng.choice(len(probs), size=m, p=probs)]
    return theta, theta + SIGMA_X / math.sqrt(n) * rng.standard_normal(theta.shape)


def test_theorem5_posterior_mean_is_bayes_optimal():
    theta, xbar = _simulate(50_000, seed=1)
    post = discrete_posterior(xbar, SIGMA_X / math.sqrt(N), ATOMS, PROBS)
    err = {"posterior": np.sum((post.mean - theta) ** 2, axis=1),
           "local": np.sum((xbar - theta) ** 2, axis=1),
           "map": np.sum((post.map_atom - theta) ** 2, axis=1)}
    for rival in ("local", "map"):
        gap = err[rival] - err["posterior"]  # paired: same clients
        assert gap.mean() > Z_MC * gap.std(ddof=1) / math.sqrt(gap.size), rival


def test_theorem5_mse_equals_expected_posterior_variance():
    theta, xbar = _simulate(50_000, seed=2)
    post = discrete_posterior(xbar, SIGMA_X / math.sqrt(N), ATOMS, PROBS)
    err = np.sum((post.mean - theta) ** 2, axis=1)
    paired = err - 2 * post.var  # var is per coordinate, d = 2
    assert abs(paired.mean()) <= Z_MC * paired.std(ddof=1) / math.sqrt(paired.size)
    mmse, se = expected_posterior_variance(ATOMS, PROBS, SIGMA_X, N, n_samples=50_000, rng=3)
    se_err = err.std(ddof=1) / math.sqrt(err.size)
    assert abs(err.mean() - mmse) <= Z_MC * math.hypot(se, se_err)


def test_single_atom_prior_is_known_exactly():
    post = discrete_posterior([[0.3, 9.0]], 1.0, [[1.0, 2.0]], [1.0])
    np.testing.assert_allclose(post.mean, [[1.0, 2.0]])
    assert post.var[0] == 0.0
    assert expected_posterior_variance([[1.0, 2.0]], [1.0], 1.0, 3, rng=0)[0] == 0.0


def test_lemma1_radius_holds():
    m, n, r = 20_000, 4, float(np.max(np.linalg.norm(ATOMS, axis=1)))
    _, xbar = _simulate(m, seed=4, n=n)
    radius = lemma1_radius(2, SIGMA_X, n, m, r)
    assert np.mean(np.linalg.norm(xbar, axis=1) > radius) <= 1 / (m * n)


def _sorted_rows(a):
    return a[np.lexsort(a.T[::-1])]


def test_algorithm1_recovers_well_separated_atoms():
    atoms = 4 * ATOMS
    theta, xbar = _simulate(6_000, seed=5, atoms=atoms)
    fit = discrete_mixture_eb(xbar, N, sigma_x=SIGMA_X, n_atoms=3, n_iter=8, rng=6)
    # Each centre is an average of >= 1200 clients with s = 1: SE <= 1/sqrt(1200) ~ 0.03
    np.testing.assert_allclose(_sorted_rows(fit.atoms), _sorted_rows(atoms), atol=Z_MC * 0.03)
    np.testing.assert_allclose(np.sort(fit.probs), np.sort(PROBS), atol=0.03)
    assert len(fit.history) == 8 and fit.privacy is None
    mse = np.mean(np.sum((fit.estimate - theta) ** 2, axis=1))
    assert mse < 0.1 * np.mean(np.sum((xbar - theta) ** 2, axis=1))
    np.testing.assert_allclose(fit.posterior.mean, fit.estimate)


def test_algorithm1_quantized_and_private_channels():
    atoms = 4 * ATOMS
    m = 6_000
    _, xbar = _simulate(m, seed=7, atoms=atoms)
    radius = lemma1_radius(2, SIGMA_X, N, m, float(np.max(np.linalg.norm(atoms, axis=1))))
    quant = discrete_mixture_eb(xbar, N, sigma_x=SIGMA_X, n_atoms=3, n_iter=5, rng=8,
                                mechanism=StochasticQuantizer(8, radius), radius=radius)
    np.testing.assert_allclose(_sorted_rows(quant.atoms), _sorted_rows(atoms), atol=0.15)
    gauss = GaussianMechanism(2.0, 1e-6, radius, d=2, calibration="l2")
    priv = discrete_mixture_eb(xbar, N, sigma_x=SIGMA_X, n_atoms=3, n_iter=5, rng=9,
                               mechanism=gauss, radius=radius)
    p = priv.privacy
    assert p["n_releases"] == 5 and p["epsilon_per_round"] == 2.0
    assert p["delta_total"] == pytest.approx(5e-6)
    assert 0 < p["epsilon_composed"] < p["basic_composition"][0]


@pytest.mark.parametrize(("call", "match"), [
    (lambda: discrete_posterior([0.0, np.nan], 1.0, [0.0], [1.0]), "finite"),
    (lambda: discrete_posterior([0.0, 1.0], 0.0, [0.0], [1.0]), "s must"),
    (lambda: discrete_posterior([0.0, 1.0], 1.0, [0.0, 1.0], [0.5, 0.6]), "sum to 1"),
    (lambda: discrete_posterior([0.0, 1.0], 1.0, [0.0, 1.0], [1.0]), "one entry per atom"),
    (lambda: discrete_posterior([[0.0, 1.0]], 1.0, [0.0, 1.0], [0.5, 0.5]), "dimension"),
    (lambda: discrete_mixture_eb([0.0, 1.0], 3, sigma_x=1.0, n_atoms=3), "n_atoms"),
    (lambda: discrete_mixture_eb([0.0, 1.0], 3, sigma_x=1.0, n_atoms=1,
                                 mechanism=StochasticQuantizer(2, 1.0)), "radius"),
    (lambda: lemma1_radius(1, 1.0, 10, 10, -1.0), "r must"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
