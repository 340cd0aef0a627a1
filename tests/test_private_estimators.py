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
from tests.conftest import requires_data

Z_MC = 4.0
M, N, ST, SX, R_MU = 10_000, 15, 0.1, 0.5, 1.0


def _mc_mse(mechanism, mean, n_reps, seed):
    pop = GaussianPopulation(mean=mean, sigma_theta=ST, sigma_x=SX)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_reps):
        theta, xbar, _ = pop.sample_sufficient(M, N, rng=rng)
        est = private_gaussian(xbar, N, mechanism, sigma_x=SX, sigma_theta=ST, rng=rng).estimate
        values.append(np.mean((est - theta) ** 2))
    return np.mean(values), np.std(values, ddof=1) / np.sqrt(n_reps)


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
    assert formula == pytest.approx(0.012572, abs=5e-7)  # Theorem 2's bound
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
    """Errata [!5] values for mu = 0.5, n = 14: a_priv ~ 0.985 (eps=1), 0.935 (eps=5), 0.933."""
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


# ----------------------------------------------------- graceful degradation (variance="ucb")

def _paired_bernoulli(alpha, beta, m, eps, n_reps, seed, n=14):
    """Per replicate MSEs of the ucb and plug-in rules on the same messages, and of local."""
    pop = BetaBernoulliPopulation(alpha, beta)
    rng = np.random.default_rng(seed)
    out = np.empty((n_reps, 3))
    for r in range(n_reps):
        p, z, trials = pop.sample_sufficient(m, n, rng=rng)
        seed_r = int(rng.integers(2**63))
        ucb = private_bernoulli_corrected(z, trials, eps, rng=seed_r)
        plug = private_bernoulli_corrected(z, trials, eps, variance="plugin", rng=seed_r)
        np.testing.assert_array_equal(ucb.shared, plug.shared)
        assert np.all(ucb.weight >= plug.weight)          # never more shrinkage
        out[r] = [np.mean((e - p) ** 2) for e in (ucb.estimate, plug.estimate, z / trials)]
    return out


@pytest.mark.parametrize("alpha, beta, eps", [(2, 2, 2.0), (2, 2, 5.0), (5, 5, 5.0),
                                              (50, 50, 5.0)])
def test_ucb_rule_costs_little_when_the_spread_is_identified(alpha, beta, eps):
    """m = 10^4, n = 14: the paired MSE difference ucb - plug-in is below 0.5 % of the MSE.

    (At eps >= 5 the rules agree exactly in most replicates: the floor lies below
    the plug-in weight.) The 0.5 % is the claim; 4 SE of the paired difference
    is the Monte Carlo allowance.
    """
    mse = _paired_bernoulli(alpha, beta, 10_000, eps, 12, seed=int(10 * eps + alpha))
    diff = mse[:, 0] - mse[:, 1]
    se = diff.std(ddof=1) / np.sqrt(diff.size)
    assert diff.mean() <= 0.005 * mse[:, 1].mean() + Z_MC * se, (diff.mean(), se)
    if eps >= 5:
        assert np.mean(diff == 0) >= 0.5


@pytest.mark.parametrize("m, eps", [(300, 0.5), (1000, 1.0)])
def test_ucb_rule_degrades_to_local_when_the_spread_is_not_identified(m, eps):
    """Plug-in shrinks all to the mean when its noisy sigma_hat^2 hits 0: much worse than local.

    The ucb rule's MSE stays within 4 SE (paired) of the local estimator's.
    """
    mse = _paired_bernoulli(2, 2, m, eps, 100, seed=m)
    vs_local = mse[:, 0] - mse[:, 2]
    se = vs_local.std(ddof=1) / np.sqrt(vs_local.size)
    assert vs_local.mean() <= Z_MC * se + 1e-12, (vs_local.mean(), se)
    assert mse[:, 1].mean() > 1.5 * mse[:, 2].mean()       # the problem being fixed


def test_ucb_rule_is_consistent():
    """As epsilon -> infinity (or m grows) the upper bound tends to the estimate, the rule
    to the plug-in rule, and both to the non-private moment-corrected estimator."""
    p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(M, 14, rng=9)
    ucb = private_bernoulli_corrected(z, n, 1e4, rng=3)
    plug = private_bernoulli_corrected(z, n, 1e4, variance="plugin", rng=3)
    np.testing.assert_array_equal(ucb.weight, plug.weight)
    np.testing.assert_allclose(ucb.variance_upper, ucb.variance, atol=1e-5)
    gaps = [np.mean(private_bernoulli_corrected(z, n, eps, rng=3).variance_upper
                    - private_bernoulli_corrected(z, n, eps, rng=3).variance)
            for eps in (2.0, 8.0, 32.0)]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert ucb.variance_rule == "ucb" and plug.variance_rule == "plugin"


def test_ucb_upper_bound_by_hand():
    """U_0 = min(sigma_hat_0^2 + 3 se_0, mu_0(1 - mu_0)), se_0^2 = (4V s^2 + 5s^4)/((m-2)(1-h)^2).

    Client 0's leave-one-out quantities recomputed from the messages, not the O(m) kernel.
    """
    p, z, n = BetaBernoulliPopulation(2, 2).sample_sufficient(2000, np.arange(2000) % 9 + 2,
                                                              rng=10)
    res = private_bernoulli_corrected(z, n, 2.0, rng=11)
    m, noise = z.size, 2.0 / 2.0**2                     # Laplace(scale 1/eps): variance 2/eps^2
    others = res.shared[1:]
    mu = others.mean()
    v = np.sum((others - mu) ** 2) / (m - 2) - noise
    h = np.mean(1.0 / n[1:])
    u = mu * (1 - mu)
    raw = (v - u * h) / (1 - h)
    se = np.sqrt((4 * min(max(v, 0.0), 0.25) * noise + 5 * noise**2) / (m - 2)) / (1 - h)
    assert res.variance_upper[0] == pytest.approx(min(raw + 3 * se, u), rel=1e-10)
    assert res.variance[0] == pytest.approx(max(raw, 0.0), rel=1e-10)
    floor = (min(raw + 3 * se, u) + np.sum((others - mu) ** 2) / (m - 2) / (m - 1)
             - (u - min(raw + 3 * se, u)) / n[0])
    floor /= (min(raw + 3 * se, u) + np.sum((others - mu) ** 2) / (m - 2) / (m - 1)
              + (u - min(raw + 3 * se, u)) / n[0])
    plug_in = n[0] * max(raw, 0) / (u - max(raw, 0) + n[0] * max(raw, 0))
    assert res.weight[0] == pytest.approx(min(1.0, max(plug_in, floor, 0.0)), rel=1e-10)


def test_ucb_weight_floor_is_the_smallest_no_worse_than_local():
    """a^2 v + (1-a)^2 (s + tau^2) <= v for all s <= U iff a >= floor (checked on a grid)."""
    from ebfl.privacy.shrinkage import _local_safe_weight

    for upper, tau2, v in ((0.05, 1e-4, 0.01), (0.2, 1e-3, 0.03), (0.001, 0.0, 0.01)):
        floor = float(_local_safe_weight(np.array(upper), tau2, v))
        a = np.linspace(0, 1, 2001)
        s = np.linspace(0, upper, 201)[:, None]
        safe = np.all(a**2 * v + (1 - a) ** 2 * (s + tau2) <= v + 1e-15, axis=0)
        assert a[safe].min() == pytest.approx(floor, abs=1e-3)


def _paired_gaussian(mechanism, m, sigma_theta, n_reps, seed, n=15, sigma_x=0.5):
    pop = GaussianPopulation(0.3, sigma_theta, sigma_x)
    rng = np.random.default_rng(seed)
    out = np.empty((n_reps, 3))
    for r in range(n_reps):
        theta, xbar, _ = pop.sample_sufficient(m, n, rng=rng)
        seed_r = int(rng.integers(2**63))
        ucb = private_gaussian(xbar, n, mechanism, sigma_x=sigma_x, rng=seed_r)
        plug = private_gaussian(xbar, n, mechanism, sigma_x=sigma_x, variance="plugin",
                                rng=seed_r)
        assert ucb.sigma_theta >= plug.sigma_theta == plug.sigma_theta_plugin
        out[r] = [np.mean((e - theta) ** 2) for e in (ucb.estimate, plug.estimate, xbar)]
    return out


def test_private_gaussian_ucb_when_identified_and_when_not():
    """8-bit quantizer, m = 10^4: identical to plug-in. 1-bit quantizer, m = 200 and a wide
    population (sigma_theta = 0.5): plug-in often fits sigma_theta = 0 and loses to local;
    the ucb rule stays within 4 paired SE of local."""
    b = paper_clip_range(R_MU, M, N, ST, SX)
    fine = _paired_gaussian(StochasticQuantizer(8, b), M, ST, 5, seed=1)
    np.testing.assert_array_equal(fine[:, 0], fine[:, 1])
    coarse = _paired_gaussian(StochasticQuantizer(1, paper_clip_range(R_MU, 200, N, 0.5, SX)),
                              200, 0.5, 100, seed=2)
    vs_local = coarse[:, 0] - coarse[:, 2]
    assert vs_local.mean() <= Z_MC * vs_local.std(ddof=1) / 10
    assert coarse[:, 1].mean() > 1.2 * coarse[:, 2].mean()


def test_square_variance_excess_matches_monte_carlo():
    """Var((q - mu)^2) - Var((x - mu)^2): exact for additive noise, an upper bound otherwise."""
    from ebfl.privacy import BinaryMechanism, LaplaceMechanism

    rng = np.random.default_rng(4)
    x = rng.uniform(-0.8, 0.8, 400_000)
    v = x.var()
    mechs = [(GaussianMechanism(2.0, 1e-5, 1.0, calibration="l2"), "exact"),
             (LaplaceMechanism(3.0, 1.0), "exact"), (StochasticQuantizer(2, 1.0), "upper")]
    for mech, kind in mechs:
        q = mech.privatize(x, rng)
        sq_x, sq_q = (x - x.mean()) ** 2, (q - x.mean()) ** 2
        got = sq_q.var() - sq_x.var()
        # SE of a difference of two variances of squares: bootstrap-free, from fourth moments
        se = np.sqrt((np.var((sq_q - sq_q.mean()) ** 2) + np.var((sq_x - sq_x.mean()) ** 2))
                     / x.size)
        bound = float(mech.square_variance_excess(v))
        if kind == "exact":
            assert abs(got - bound) <= Z_MC * se, (type(mech).__name__, got, bound, se)
        else:
            assert got <= bound + Z_MC * se
    bits = rng.uniform(0, 1, 400_000)
    q = BinaryMechanism(1.0).privatize(bits, rng)
    got = ((q - bits.mean()) ** 2).var() - ((bits - bits.mean()) ** 2).var()
    assert got <= BinaryMechanism(1.0).square_variance_excess(bits.var())


def test_unknown_mechanism_uses_the_empirical_standard_error():
    """A Mechanism without square_variance_excess: the se comes from the messages themselves."""
    from ebfl.privacy import Mechanism

    class Noisy(Mechanism):
        def privatize(self, x, rng=None):
            return np.asarray(x) + 2.0 * np.random.default_rng(rng).standard_normal(np.shape(x))

        def variance(self, x):
            return np.full(np.shape(x), 4.0)

        @property
        def max_variance(self):
            return 4.0

    theta, xbar, _ = GaussianPopulation(0.0, 0.5, SX).sample_sufficient(300, N, rng=5)
    res = private_gaussian(xbar, N, Noisy(), sigma_x=SX, rng=6)
    assert res.variance_rule == "ucb" and res.sigma_theta_upper > res.sigma_theta_plugin
    assert np.mean((res.estimate - theta) ** 2) <= 1.05 * np.mean((xbar - theta) ** 2)


def test_variance_rule_bad_input():
    with pytest.raises(ValueError, match="variance"):
        private_bernoulli_corrected([1, 2, 3], [5, 5, 5], 1.0, variance="upper")
    with pytest.raises(ValueError, match="ucb_z"):
        private_bernoulli_corrected([1, 2, 3], [5, 5, 5], 1.0, ucb_z=-1.0)
    with pytest.raises(ValueError, match="ucb_z"):
        private_gaussian([0.0, 1.0], 5, StochasticQuantizer(2, 1.0), sigma_x=1.0, ucb_z=50.0)


# ----------------------------------------------------------- the county elections

@pytest.fixture(scope="module")
def county_runs():
    """election_experiment with four seeds of the mechanism noise (the data are fixed)."""
    from ebfl.datasets import election_matrix, load_county_returns
    from ebfl.generative.election import election_experiment

    matrix = election_matrix(load_county_returns())
    return [election_experiment(matrix, epsilons=(1.0, 5.0), rng=seed) for seed in range(4)]


@requires_data("county-elections")
def test_corrected_private_degrades_gracefully_on_county_elections(county_runs):
    """Every fold, both targets, eps = 1 and 5, four noise seeds: the corrected private gain is
    at least min(0, gain of non-private loo_corrected in that fold) - 5 points. The plug-in
    rule on the same messages misses this (the problem the default rule fixes)."""
    misses = {"corrected": [], "corrected plug-in": []}
    for seed, run in enumerate(county_runs):
        for target in ("outcome", "share"):
            reference = run["gains"][target]["loo_corrected"]["per_fold"]
            for eps in (1, 5):
                for kind, missed in misses.items():
                    gains = run["private"][target][f"{kind} eps={eps}"]["per_fold"]
                    missed += [(seed, target, eps, fold, round(g, 1))
                               for fold, (g, ref) in enumerate(zip(gains, reference,
                                                                   strict=True))
                               if g < min(0.0, ref) - 5.0]
    assert misses["corrected"] == []
    assert misses["corrected plug-in"], "the plug-in rule was expected to fail somewhere"
