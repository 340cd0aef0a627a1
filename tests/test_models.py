"""Generative models and ragged data."""

import numpy as np
import pytest
from scipy import stats

from ebfl import BetaBernoulliPopulation, GaussianPopulation, Ragged


def test_reproducible_with_seed_and_generator():
    pop = GaussianPopulation(mean=[0.0, 1.0], sigma_theta=0.2, sigma_x=1.0)
    a = pop.sample(10, 3, rng=42)
    b = pop.sample(10, 3, rng=np.random.default_rng(42))
    np.testing.assert_array_equal(a.theta, b.theta)
    np.testing.assert_array_equal(a.data.values, b.data.values)
    c = BetaBernoulliPopulation(2, 3).sample_sufficient(10, 5, rng=1)
    d = BetaBernoulliPopulation(2, 3).sample_sufficient(10, 5, rng=1)
    for x, y in zip(c, d, strict=True):
        np.testing.assert_array_equal(x, y)


def test_shapes_and_ragged_sizes():
    sample = BetaBernoulliPopulation(1, 1).sample(4, [1, 2, 3, 4], rng=0)
    assert sample.data.values.dtype == np.uint8 and sample.data.values.size == 10
    np.testing.assert_array_equal(sample.data.counts, [1, 2, 3, 4])
    g = GaussianPopulation(0.0, 1.0, 1.0).sample(3, 2, rng=0)
    assert g.theta.shape == (3,) and g.data.values.shape == (6,)


def test_sufficient_statistics_have_the_right_law():
    """xbar_i - theta_i ~ N(0, sigma_x^2/n): KS test at a fixed seed."""
    pop = GaussianPopulation(mean=0.0, sigma_theta=1.0, sigma_x=2.0)
    theta, xbar, n = pop.sample_sufficient(5000, 16, rng=3)
    assert stats.kstest((xbar - theta) / 0.5, "norm").pvalue > 1e-3
    full = pop.sample(5000, 16, rng=4)
    means = np.add.reduceat(full.data.values, full.data.offsets[:-1]) / 16
    assert stats.ks_2samp(means - full.theta, xbar - theta).pvalue > 1e-3


@pytest.mark.parametrize(("call", "match"), [
    (lambda: GaussianPopulation(0.0, -1.0, 1.0), "sigma_theta"),
    (lambda: GaussianPopulation(0.0, 1.0, 0.0), "sigma_x"),
    (lambda: GaussianPopulation(np.nan, 1.0, 1.0), "mean"),
    (lambda: BetaBernoulliPopulation(0.0, 1.0), "alpha"),
    (lambda: BetaBernoulliPopulation(1.0, 1.0).sample(0, 3), "n_clients"),
    (lambda: BetaBernoulliPopulation(1.0, 1.0).sample(2, [3, 0]), "empty"),
    (lambda: BetaBernoulliPopulation(1.0, 1.0).sample(2, [3, 1, 1]), "shape"),
    (lambda: GaussianPopulation().sample(2, 3, rng=np.random.RandomState(0)), "RandomState"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_ragged_validation():
    with pytest.raises(ValueError, match="start at 0"):
        Ragged(np.ones(3), np.array([1, 3]))
    with pytest.raises(ValueError, match="non-decreasing"):
        Ragged(np.ones(3), np.array([0, 2, 1, 3]))
    with pytest.raises(TypeError, match="integers"):
        Ragged(np.ones(3), np.array([0.0, 3.0]))
    with pytest.raises(ValueError, match="at least one"):
        Ragged.from_lists([])
    r = Ragged.from_lists([[1.0, 2.0], [3.0]])
    assert r[0].tolist() == [1.0, 2.0] and len(r) == 2
