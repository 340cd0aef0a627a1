"""Quantized and private estimators (Theorems 2 and 4) and the corrected private Bernoulli EB."""

import numpy as np
import pytest

from ebfl import (
    BetaBernoulliPopulation,
    GaussianPopulation,
    beta_binomial_eb,
    personalized_gaussian,
)
from ebfl import bounds as B
from ebfl.privacy import (
    GaussianMechanism,
    StochasticQuantizer,
    paper_clip_range,
    private_bernoulli_corrected,
    private_bernoulli_paper,
    private_gaussian,
)

Z_MC = 4.0
M, N, ST, SX, R_MU = 10_000, 15, 0.1, 0.5, 1.0


def _mc_mse(mechanism, mean, reps, seed):
    pop = GaussianPopulation(mean=mean, sigma_theta=ST, sigma_x=SX)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(reps):
        theta, xbar, _ = pop.sample_sufficient(M, N, rng=rng)
        est = private_gaussian(xbar, N, mechanism, sigma_x=SX, sigma_theta=ST, rng=rng).estimate
        values.append(np.mean((est - theta) ** 2))
    return np.mean(values), np.std(values, ddof=1) / np.sqrt(reps)


@pytest.mark.parametrize(("k_bits", "expected"), [(1, 0.0064131), (2, 0.0062693),
                                                  (8, 0.0062510)])
def test_quantized_monte_carlo_matches_theorem2(k_bits, expected):
    """mu = 0 puts the client means mid-way between levels: quantizer variance = its maximum."""
    b = paper_clip_range(R_MU, M, N, ST, SX)
    formula = B.theorem2_quantizer_mse(M, N, ST, SX, k_bits, R_MU)
    assert formula == pytest.approx(expected, abs=5e-8)
    mse, se = _mc_mse(StochasticQuantizer(k_bits, b), 0.0, 100, seed=k_bits)
    assert abs(mse - formula) <= Z_MC * se, (mse, formula, se)


def test_quantized_is_an_upper_bound_off_the_midpoint():
    b = paper_clip_range(R_MU, M, N, ST, SX)
    mse, se = _mc_mse(StochasticQuantizer(1, b), 0.9 * b, 60, seed=11)
    assert mse <= B.theorem2_quantizer_mse(M, N, ST, SX, 1, R_MU) + Z_MC * se


def test_gaussian_mechanism_monte_carlo_matches_theorem2():
    b = paper_clip_range(R_MU, M, N, ST, SX)
    formula = B.theorem2_gaussian_mse(M, N, ST, SX, 1.0, 1e-5, R_MU)
    assert formula == pytest.approx(0.012572, abs=5e-7)  # spec B.8
    mse, se = _mc_mse(GaussianMechanism(1.0, 1e-5, b), 0.3, 100, seed=5)
    assert abs(mse - formula) <= Z_MC * se, (mse, formula, se)


def test_private_gaussian_is_theorem2_form_and_fits_sigma_theta():
    rng = np.random.default_rng(1)
    theta, xbar, _ = GaussianPopulation(0.2, ST, SX).sample_sufficient(M, N, rng=rng)
    q = StochasticQuantizer(8, paper_clip_range(R_MU, M, N, ST, SX))
    res = private_gaussian(xbar, N, q, sigma_x=SX, sigma_theta=ST, rng=2)
    direct = personalized_gaussian(xbar, N, sigma_theta=ST, sigma_x=SX, shared=res.shared,
                                   sigma_q=np.sqrt(q.max_variance))
    np.testing.assert_allclose(res.estimate, direct.estimate)
    fitted = private_gaussian(xbar, N, q, sigma_x=SX, rng=2)
    # sd of the sample variance of m values ~ Var * sqrt(2/m): a 5% band is ~ 4 SE here
    assert fitted.sigma_theta == pytest.approx(ST, rel=0.05)


def test_paper_private_weight_does_not_learn_spread():
    """Spec [!5]d values for mu = 0.5, n = 14: a_priv ~ 0.985 (eps=1), 0.935 (eps=5), 0.933."""
    pop = BetaBernoulliPopulation(2, 2)
    p, z, n = pop.sample_sufficient(M, 14, rng=0)
    for eps, want in ((1.0, 0.985), (5.0, 0.935), (50.0, 0.933)):
        assert private_bernoulli_paper(z, n, eps, rng=1).weight.mean() == pytest.approx(
            want, abs=0.005)
    narrow = BetaBernoulliPopulation(50, 50).sample_sufficient(M, 14, rng=2)
    # a ten times narrower population gets the same private weight: the spread is invisible
    assert private_bernoulli_paper(*narrow[1:], 50.0, rng=3).weight.mean() == pytest.approx(
        0.933, abs=0.005)


def test_theorem4_rhs_holds_for_the_paper_estimator():
    """UPPER check over replicates; the bound is nearly tight here because a_priv ~ 1."""
    alpha, beta, eps = 2.0, 2.0, 1.0
    pop = BetaBernoulliPopulation(alpha, beta)
    rng = np.random.default_rng(4)
    mses, a2, one_minus_a2 = [], [], []
    for _ in range(30):
        p, z, n = pop.sample_sufficient(M, 14, rng=rng)
        res = private_bernoulli_paper(z, n, eps, rng=rng)
        mses.append(np.mean((res.estimate - p) ** 2))
        a2.append(np.mean(res.weight**2))
        one_minus_a2.append(np.mean((1 - res.weight) ** 2))
    rhs = B.theorem4_rhs(np.mean(a2), np.mean(one_minus_a2), M, 14, alpha, beta, eps)
    se = np.std(mses, ddof=1) / np.sqrt(len(mses))
    assert np.mean(mses) <= rhs + Z_MC * se, (np.mean(mses), rhs, se)


def test_corrected_private_variance_is_unbiased():
    """E[sigma_hat^2] = Var(p) = 0.05 for Beta(2, 2), over replicates (eps = 5, m = 2000)."""
    pop = BetaBernoulliPopulation(2, 2)
    rng = np.random.default_rng(6)
    means = []
    for _ in range(100):
        _, z, n = pop.sample_sufficient(2000, rng.integers(5, 25, size=2000), rng=rng)
        means.append(private_bernoulli_corrected(z, n, 5.0, rng=rng).variance.mean())
    se = np.std(means, ddof=1) / np.sqrt(len(means))
    assert abs(np.mean(means) - 0.05) <= Z_MC * se, (np.mean(means), se)


def test_corrected_recovers_non_private_and_paper_does_not():
    p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(M, 14, rng=7)
    nonprivate = beta_binomial_eb(z, n, method="loo_corrected")
    corrected = private_bernoulli_corrected(z, n, 1e4, rng=8)
    paper = private_bernoulli_paper(z, n, 1e4, rng=8)
    assert corrected.weight.mean() == pytest.approx(nonprivate.shrinkage.mean(), abs=0.01)
    mse = {k: np.mean((v - p) ** 2) for k, v in (("np", nonprivate.posterior.mean),
                                                 ("corr", corrected.estimate),
                                                 ("paper", paper.estimate),
                                                 ("local", z / n))}
    assert mse["corr"] == pytest.approx(mse["np"], rel=0.01)
    assert mse["paper"] > 1.1 * mse["np"] and paper.weight.mean() > 0.9


def test_private_bad_input():
    with pytest.raises(ValueError, match="epsilon"):
        private_bernoulli_paper([1, 2, 3], [5, 5, 5], 0.0)
    with pytest.raises(ValueError, match="at least 3"):
        private_bernoulli_corrected([1, 2], [5, 5], 1.0)
    with pytest.raises(ValueError, match="trials >= 2"):
        private_bernoulli_corrected([1, 0, 1], [1, 1, 1], 1.0)
    with pytest.raises(ValueError, match="n must"):
        private_gaussian([0.0, 1.0], 0, StochasticQuantizer(2, 1.0), sigma_x=1.0)
    with pytest.raises(TypeError, match="Mechanism"):
        private_gaussian([0.0, 1.0], 5, "gaussian", sigma_x=1.0)
    with pytest.raises(ValueError, match="exceed"):
        private_bernoulli_paper([6, 2, 3], [5, 5, 5], 1.0)
