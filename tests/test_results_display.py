"""Fits read well: a one-line ``repr`` (no arrays), ``summary()`` (a small table of the
fit) and ``to_frame()`` (one row per client, columns named for what they hold)."""

import numpy as np
import pytest

import ebfl


@pytest.fixture(scope="module")
def counts():
    p, z, n = ebfl.BetaBernoulliPopulation(2, 2).sample_sufficient(500, 14, rng=0)
    return z, n


@pytest.mark.parametrize("method", ["mle", "loo_corrected"])
def test_beta_binomial_result(counts, method):
    fit = ebfl.beta_binomial_eb(*counts, method=method)
    text = repr(fit)
    assert "\n" not in text and len(text) < 200 and "array" not in text
    assert f"m={fit.n_clients}" in text and f"{fit.prior.alpha:.6g}" in text
    summary = fit.summary()
    assert method in summary and f"{fit.log_likelihood:.6g}" in summary
    assert f"{fit.prior.mean:.6g}" in summary
    frame = fit.to_frame()
    assert list(frame.columns) == ["posterior_mean", "posterior_sd", "weight_on_own_mean",
                                   "centre"]
    np.testing.assert_array_equal(frame["posterior_mean"], fit.posterior.mean)
    np.testing.assert_array_equal(frame["weight_on_own_mean"], fit.shrinkage)
    np.testing.assert_allclose(frame["posterior_sd"] ** 2, fit.posterior.var)


def test_gaussian_result_one_and_several_coordinates():
    rng = np.random.default_rng(1)
    theta = rng.normal(0.3, 0.5, 200)
    s = 10 ** rng.uniform(-0.5, 0.5, 200)
    fit = ebfl.gaussian_eb(theta + s * rng.standard_normal(200), s)
    text = repr(fit)
    assert "\n" not in text and "array" not in text and f"sd={fit.prior.sd:.6g}" in text
    assert f"{fit.log_likelihood:.6g}" in fit.summary()
    frame = fit.to_frame()
    assert list(frame.columns) == ["posterior_mean", "posterior_sd", "weight_on_own_mean", "s"]
    np.testing.assert_array_equal(frame["s"], fit.s)
    # d = 3 coordinates per client: one column per coordinate of the mean
    fit3 = ebfl.gaussian_eb(rng.normal(0, 1, (50, 3)), 0.5)
    frame3 = fit3.to_frame()
    assert [c for c in frame3.columns if c.startswith("posterior_mean")] == [
        "posterior_mean_0", "posterior_mean_1", "posterior_mean_2"]
    np.testing.assert_array_equal(frame3["posterior_mean_2"], fit3.posterior.mean[:, 2])
    assert "[" in repr(fit3)  # the prior mean, a vector


def test_npmle_result(counts):
    fit = ebfl.npmle_binomial(*counts)
    text = repr(fit)
    assert "\n" not in text and "array" not in text
    assert f"{int(np.sum(fit.weights > 0))} with weight" in text
    np.testing.assert_array_equal(fit.to_frame()["posterior_mean"], fit.posterior_mean)


def test_accountant_and_privacy_spent_reprs_are_one_line():
    """The RDP curve (a value for each of ~150 orders) is there to read, not to print."""
    from ebfl.privacy.accounting import Accountant, DPAdaPeDAccountant

    acc = DPAdaPeDAccountant(100).step(n_sampled=10, sync_gap=5, clip_mu=1.0, noise_mu=1.0,
                                       n_rounds=50)
    spent = acc.get_privacy_spent(1e-5)
    assert spent.rdp.size > 100  # the curve is still there
    for text in (repr(acc), repr(spent), repr(Accountant())):
        assert "\n" not in text and len(text) < 200 and "array" not in text
    assert "n_rounds=50" in repr(acc) and f"epsilon={spent.epsilon:.6g}" in repr(spent)
