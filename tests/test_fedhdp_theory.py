"""Closed forms of the FedHDP paper (ebfl.fedhdp.theory) and ``ebfl bounds fedhdp``.

Every formula is checked against an independent reference: the paper's printed
equation written out naively, a brute-force minimizer, or a difference of two
other results. Monte Carlo checks of the same formulas are in
tests/test_fedhdp_validation.py.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, minimize_scalar

from ebfl.cli import main
from ebfl.fedhdp import levels as L
from ebfl.fedhdp import theory as T

SETTING = (20, 0.05, 1.0, 1.0, 0.5)  # N, rho_np, alpha^2, tau^2, gamma^2
REGRESSION = ((5, 15), 1.0, 1.0, (0.05, 0.5))  # (N_1, N_2), alpha^2, tau^2, (gamma_1^2, gamma_2^2)


def _point(n, k, alpha2, tau2, gamma2):
    """Point-estimation arguments with k opt-out clients out of n."""
    return n, k / n, alpha2, tau2, gamma2


# Settings with 1 <= k <= n - 1 opt-out clients (both groups present).
SETTINGS = [SETTING, (100, 0.1, 1.0, 0.5, 0.2), _point(7, 3, 0.3, 2.0, 4.0),
            _point(50, 1, 2.5, 0.01, 10.0), _point(12, 11, 1.0, 3.0, 0.05),
            _point(30, 6, 1e-3, 1e-2, 1e-4), _point(9, 2, 5.0, 0.0, 1.0)]



def _variances(high):
    """0 or a variance in [1e-6, high] (the functions refuse nonzero values below 1e-100)."""
    return st.one_of(st.just(0.0), st.floats(1e-6, high))


point_settings = st.tuples(
    st.integers(2, 200), st.floats(0.0, 1.0), st.floats(1e-3, 1e3), _variances(1e3),
    _variances(1e3)).map(lambda s: (s[0], round(s[1] * s[0]) / s[0], *s[2:]))


# ------------------------------------------------------------ the test vectors

def test_paper_setting_n20():
    """N = 20, rho = 0.05, alpha^2 = tau^2 = 1, gamma^2 = 0.5."""
    assert T.optimal_ratio(*SETTING) == pytest.approx(0.173913, abs=5e-7)
    assert T.server_mse_optimal(*SETTING) == pytest.approx(0.464646, abs=5e-7)
    assert T.hdp_fedavg_gap(*SETTING) == pytest.approx(0.0866035, abs=5e-8)
    assert T.optimal_lambda_private(*SETTING) == pytest.approx(0.72263, abs=5e-6)
    opt = T.optimal_lambda_exact(*SETTING, group="private")
    assert opt.lam == pytest.approx(0.71429, abs=5e-6) and not opt.at_bound and opt.converged
    assert T.personalized_mse(0.72263, *SETTING, group="private") == pytest.approx(
        0.600187, abs=5e-7)
    assert T.personalized_mse(T.optimal_lambda_private(*SETTING), *SETTING,
                              group="private") == pytest.approx(0.600187, abs=5e-7)
    assert opt.mse == pytest.approx(0.600168, abs=5e-7)
    assert T.bayes_local_mse(*SETTING, group="private") == pytest.approx(0.597458, abs=5e-7)


def test_paper_setting_n100():
    s = (100, 0.1, 1.0, 0.5, 0.2)
    assert T.optimal_lambda_private(*s) == pytest.approx(1.71875, abs=5e-6)
    assert T.optimal_lambda_exact(*s, group="private").lam == pytest.approx(1.71765, abs=5e-6)


def test_lemma6_vector_needs_alpha2_tau2_one():
    """Eq. (50) with N_1 = 5, N_2 = 15, gamma_1^2 = 0.05, gamma_2^2 = 0.5 gives the printed
    values with alpha^2 = tau^2 = 1 (lambda* depends on the ratios tau^2/alpha^2 and
    gamma^2/alpha^2 only, so any other split changes them)."""
    lam1, lam2 = L.two_level_optimal_lambdas(*REGRESSION)
    assert (lam1, lam2) == pytest.approx((0.97160, 0.82803), abs=5e-6)
    exact = [L.levels_optimal_lambda_exact(g, *REGRESSION).lam for g in (0, 1)]
    assert exact == pytest.approx([0.96796, 0.82399], abs=5e-6)
    other = L.two_level_optimal_lambdas((5, 15), 1.0, 0.5, (0.05, 0.5))
    assert abs(other[0] - 0.97160) > 0.5
    # A common scale of alpha^2, tau^2 and the gammas leaves them unchanged.
    assert L.two_level_optimal_lambdas((5, 15), 3.0, 3.0, (0.15, 1.5)) == pytest.approx(
        (lam1, lam2), rel=1e-12)


# sigma_c^2, gamma^2: r*, sigma^2_opt, sigma_s^2 at r = 0, 0.05, 0.1, 0.2, 0.5, 1
FIGURE1_TABLE = [
    (11, 1, 0.366667, 1.380753, (11.0, 3.2676, 1.9857, 1.4670, 1.3923, 1.4525)),
    (11, 4, 0.126437, 3.233108, (11.0, 3.9796, 3.2735, 3.3472, 3.8481, 4.1600)),
    (12, 4, 0.136364, 3.341772, (12.0, 4.2551, 3.4150, 3.4236, 3.9002, 4.2100)),
    (13, 4, 0.146067, 3.443452, (13.0, 4.5306, 3.5565, 3.5000, 3.9524, 4.2600)),
]


@pytest.mark.parametrize("sigma_c2, gamma2, r_star, opt, values", FIGURE1_TABLE)
def test_figure1_table(sigma_c2, gamma2, r_star, opt, values):
    """N = 20, rho_np = 0.05; only sigma_c^2 = alpha^2 + tau^2 matters for the server."""
    for alpha2 in (1.0, 0.5 * sigma_c2):
        args = (20, 0.05, alpha2, sigma_c2 - alpha2, gamma2)
        assert T.optimal_ratio(*args) == pytest.approx(r_star, abs=5e-7)
        assert T.server_mse_optimal(*args) == pytest.approx(opt, abs=5e-7)
        got = T.server_mse([0.0, 0.05, 0.1, 0.2, 0.5, 1.0], *args)
        np.testing.assert_allclose(got, values, atol=5e-5)


# -------------------------------------------------------- server (Lemmas 1, 2)

def _server_naive(r, n, rho, alpha2, tau2, gamma2):
    """sigma_s^2(r) = [N_np sc + N_p r^2 (sc + N_p gamma^2)] / (N_np + r N_p)^2, as printed."""
    n_np = round(rho * n)
    n_p = n - n_np
    sc = alpha2 + tau2
    return (n_np * sc + n_p * r**2 * (sc + n_p * gamma2)) / (n_np + r * n_p) ** 2


@pytest.mark.parametrize("s", SETTINGS)
def test_optimal_ratio_is_the_brute_force_minimizer(s):
    r_star = T.optimal_ratio(*s)
    grid = np.linspace(0.0, 1.0, 100_001)
    values = T.server_mse(grid, *s)
    np.testing.assert_allclose(values, _server_naive(grid, *s), rtol=1e-12)
    assert abs(grid[np.argmin(values)] - r_star) <= 1e-5
    res = minimize_scalar(lambda r: T.server_mse(r, *s), bounds=(0.0, 1.0), method="bounded",
                          options={"xatol": 1e-12})
    assert res.x == pytest.approx(r_star, abs=1e-5)
    assert T.server_mse(r_star, *s) == pytest.approx(T.server_mse_optimal(*s), rel=1e-12)
    assert T.server_mse_optimal(*s) <= values.min() * (1 + 1e-12)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(point_settings)
def test_gaps_are_differences_of_the_mses(s):
    n, rho, _, _, gamma2 = s
    opt, hdp, dp = T.server_mse_optimal(*s), T.server_mse_hdp_fedavg(*s), T.server_mse_dp_fedavg(*s)
    scale = max(dp, 1e-300)
    assert T.hdp_fedavg_gap(*s) == pytest.approx(hdp - opt, abs=1e-11 * scale)
    assert T.dp_fedavg_gap(*s) == pytest.approx(dp - opt, abs=1e-11 * scale)
    assert T.dp_vs_hdp_fedavg_gap(*s) == pytest.approx(dp - hdp, abs=1e-11 * scale)
    assert T.dp_vs_hdp_fedavg_gap(*s) == pytest.approx(rho * (1 - rho) * gamma2, abs=1e-11 * scale)
    assert min(T.hdp_fedavg_gap(*s), T.dp_fedavg_gap(*s), T.dp_vs_hdp_fedavg_gap(*s)) >= 0
    if 0 < rho:
        assert T.server_mse(1.0, *s) == pytest.approx(hdp, rel=1e-12)
    # Lemma 1's r* is the Bayes risk of phi: eq. (62) with two levels.
    counts = (round(rho * n), n - round(rho * n))
    assert L.levels_server_variance(counts, s[2], s[3], (0.0, gamma2)) == pytest.approx(
        opt, rel=1e-12)


def test_group_mean_variances():
    var_np, var_p = T.group_mean_variances(*SETTING)
    assert var_np == 2.0 and var_p == pytest.approx(2 / 19 + 0.5, rel=1e-15)
    assert math.isnan(T.group_mean_variances(20, 0.0, 1.0, 1.0, 0.5)[0])
    assert math.isnan(T.group_mean_variances(20, 1.0, 1.0, 1.0, 0.5)[1])
    # r = 0 and r -> inf give the two group means.
    assert T.server_mse(0.0, *SETTING) == var_np
    assert T.server_mse(1e12, *SETTING) == pytest.approx(var_p, rel=1e-9)


def test_lemma2_limits():
    """Section 3.1.2: the gaps vanish at rho = 0 and 1, tend to constants as N -> inf,
    and grow without bound with gamma^2 while sigma^2_opt stays bounded."""
    for rho in (0.0, 1.0):
        s = (20, rho, 1.0, 1.0, 0.5)
        assert T.hdp_fedavg_gap(*s) == T.dp_fedavg_gap(*s) == T.dp_vs_hdp_fedavg_gap(*s) == 0
    rho, gamma2 = 0.1, 0.7
    big = (10**12, rho, 1.0, 1.0, gamma2)
    assert T.hdp_fedavg_gap(*big) == pytest.approx((1 - rho) ** 2 * gamma2, rel=1e-9)
    assert T.dp_fedavg_gap(*big) == pytest.approx((1 - rho) * gamma2, rel=1e-9)
    assert T.server_mse_optimal(*big) < 1e-10
    gaps = [T.hdp_fedavg_gap(20, 0.05, 1.0, 1.0, g) for g in (1.0, 1e3, 1e6)]
    assert gaps[0] < gaps[1] < gaps[2] and gaps[2] > 1e4
    assert T.server_mse_optimal(20, 0.05, 1.0, 1.0, 1e6) == pytest.approx(2.0, rel=1e-4)


# ------------------------------------------------- personalization (Theorem 3)

def _lambda_p_eq18_naive(n, rho, a, t, g):
    return (a * (t + a) + rho * (1 - rho) * a * g * n) / (
        t * (t + a) + (1 - rho) * (a + t) * g + (1 - rho) * rho * t * g * n)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(point_settings)
def test_eq79_equals_eq18(s):
    lam18 = T.optimal_lambda_private(*s)
    assert T._lambda_p_eq79(*s) == pytest.approx(lam18, rel=1e-9)
    if math.isfinite(lam18):
        assert lam18 == pytest.approx(_lambda_p_eq18_naive(*s), rel=1e-12)


@pytest.mark.parametrize("s", [s for s in SETTINGS if s[3] > 0])
def test_lambda_np_is_exact_and_reaches_the_bayes_mse(s):
    opt = T.optimal_lambda_exact(*s, group="nonprivate")
    assert opt.lam == pytest.approx(s[2] / s[3], rel=1e-9) == T.optimal_lambda_nonprivate(*s)
    bayes = T.bayes_local_mse(*s, group="nonprivate")
    assert opt.mse == pytest.approx(bayes, rel=1e-12)
    assert T.personalized_mse(T.optimal_lambda_nonprivate(*s), *s,
                              group="nonprivate") == pytest.approx(bayes, rel=1e-12)


@pytest.mark.parametrize("s", SETTINGS)
def test_lambda_p_is_close_to_but_not_the_minimizer(s):
    """The paper's lambda*_p leaves an excess (lambda w_p/(1+lambda))^2 N_p gamma^2 over the
    Bayes MSE; the true minimizer does better, and nothing reaches the Bayes MSE."""
    n, rho, _, _, gamma2 = s
    lam = T.optimal_lambda_private(*s)
    opt = T.optimal_lambda_exact(*s, group="private")
    bayes = T.bayes_local_mse(*s, group="private")
    mse = T.personalized_mse(lam, *s, group="private")
    n_np = round(rho * n)
    r_star = T.optimal_ratio(*s)
    w_p = r_star / (n_np + r_star * (n - n_np))
    excess = (lam * w_p / (1 + lam)) ** 2 * (n - n_np) * gamma2
    assert mse - bayes == pytest.approx(excess, rel=1e-6, abs=1e-15)
    assert bayes < opt.mse <= mse
    if gamma2 > 0:
        assert opt.lam != pytest.approx(lam, rel=1e-6)
    assert L.levels_optimal_lambda(1, (n_np, n - n_np), s[2], s[3], (0.0, gamma2)) == (
        pytest.approx(lam, rel=1e-12))


def _brute_force_lambda(mse):
    """Minimize over t = lambda/(1+lambda) in [0, 1] (bounded Brent) and on a fine grid."""
    res = minimize_scalar(lambda t: mse(t / (1 - t)) if t < 1 else mse(1e300),
                          bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-12})
    grid = np.linspace(0.0, 1.0, 20_001)[:-1]
    values = mse(grid / (1 - grid))
    return res.x, min(res.fun, values.min())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=4).filter(lambda c: sum(c) >= 2),
       st.floats(1e-2, 10.0), _variances(10.0), st.data())
def test_exact_lambda_is_the_global_minimizer(counts, alpha2, tau2, data):
    gammas2 = data.draw(st.lists(_variances(5.0), min_size=len(counts),
                                 max_size=len(counts)))
    ratios = data.draw(st.one_of(st.none(), st.lists(st.floats(0.05, 1.0), min_size=len(counts),
                                                     max_size=len(counts))))
    model = (counts, alpha2, tau2, gammas2)
    for g in (i for i, c in enumerate(counts) if c):
        opt = L.levels_optimal_lambda_exact(g, *model, ratios=ratios)
        t, best = _brute_force_lambda(
            lambda lam, g=g: L.levels_personalized_mse(lam, g, *model, ratios=ratios))
        assert opt.mse <= best * (1 + 1e-9) + 1e-15
        assert opt.mse == pytest.approx(best, rel=1e-6)
        if not opt.at_bound:
            assert opt.lam / (1 + opt.lam) == pytest.approx(t, abs=1e-4)
            assert opt.mse == pytest.approx(
                L.levels_personalized_mse(opt.lam, g, *model, ratios=ratios), rel=1e-14)


def test_personalized_mse_ends():
    """lambda = 0 is the local estimate (alpha^2); lambda -> inf is the global model."""
    assert T.personalized_mse(0.0, *SETTING, group="private") == 1.0
    n, rho, alpha2, tau2, gamma2 = SETTING
    r = T.optimal_ratio(*SETTING)
    w = np.array([1.0] + [r] * 19) / (1 + 19 * r)
    v = np.array([0.0] + [19 * gamma2] * 19)
    # The global model's error for a private client j: sum_i w_i (p_i + e_i + l_i) - p_j.
    glob = np.sum(w**2 * (alpha2 + tau2 + v)) - 2 * w[1] * tau2 + tau2
    assert T.personalized_mse(1e15, *SETTING, group="private") == pytest.approx(glob, rel=1e-9)
    lam = np.array([0.0, 0.5, 2.0])
    out = T.personalized_mse(lam, *SETTING, group="private")
    assert out.shape == (3,) and out[0] == 1.0


def test_table2_special_cases():
    """Table 2 of the FedHDP paper."""
    # No privacy (rho = 1), homogeneous data: FedAvg, lambda*_np = inf.
    s = (20, 1.0, 1.5, 0.0, 0.7)
    assert T.optimal_lambda_nonprivate(*s) == math.inf
    opt = T.optimal_lambda_exact(*s, group="nonprivate")
    assert opt.lam == math.inf and opt.at_bound
    assert opt.mse == pytest.approx(T.bayes_local_mse(*s, group="nonprivate"), rel=1e-12)
    # No privacy, heterogeneous data: Ditto, alpha^2 / tau^2.
    assert T.optimal_lambda_nonprivate(20, 1.0, 1.5, 0.5, 0.7) == pytest.approx(3.0)
    assert T.optimal_lambda_exact(20, 1.0, 1.5, 0.5, 0.7, group="nonprivate").lam == (
        pytest.approx(3.0, rel=1e-12))
    # Homogeneous privacy (rho = 0), homogeneous data: eq. (18) gives alpha^2/gamma^2; the
    # table prints 1/gamma^2, which is wrong unless alpha^2 = 1.
    for alpha2 in (1.0, 2.0, 0.25):
        assert T.optimal_lambda_private(20, 0.0, alpha2, 0.0, 0.5) == pytest.approx(alpha2 / 0.5)
    assert T.optimal_lambda_private(20, 0.0, 2.0, 0.0, 0.5) != pytest.approx(1 / 0.5)
    # Homogeneous privacy, heterogeneous data: N alpha^2 / (N tau^2 + (1-rho) N gamma^2).
    n, a, t, g = 20, 1.3, 0.4, 0.9
    assert T.optimal_lambda_private(n, 0.0, a, t, g) == pytest.approx(
        n * a / (n * t + n * g), rel=1e-12)
    # gamma^2 -> inf with homogeneous privacy: local learning (lambda*_p -> 0). With opt-out
    # clients it tends instead to rho N alpha^2 / (alpha^2 + tau^2 + rho N tau^2) > 0: the
    # global model becomes the opt-out clients' mean, still worth shrinking towards.
    assert T.optimal_lambda_private(20, 0.0, 1.0, 1.0, 1e9) < 1e-8
    assert T.optimal_lambda_private(20, 0.05, 1.0, 1.0, 1e9) == pytest.approx(1 / 3, rel=1e-6)
    assert T.optimal_lambda_exact(20, 0.05, 1.0, 1.0, 1e9, group="private").lam == (
        pytest.approx(1 / 3, rel=1e-6))
    # lambda*_np >= lambda*_p (r <= 1).
    for s in SETTINGS:
        assert T.optimal_lambda_nonprivate(*s) >= T.optimal_lambda_private(*s)


def test_no_heterogeneity_no_privacy_is_fedavg():
    """tau^2 = 0, gamma^2 = 0: every client's best estimate is the global mean."""
    s = (10, 0.3, 1.0, 0.0, 0.0)
    for group in ("private", "nonprivate"):
        opt = T.optimal_lambda_exact(*s, group=group)
        assert opt.lam == math.inf and opt.at_bound
        assert opt.mse == pytest.approx(0.1, rel=1e-12)
    assert T.optimal_lambda_private(*s) == math.inf


# ------------------------------------------------------- eq. (46), (47), (73)

def _eq46_naive(group, counts, alpha2, tau2, gammas2):
    n1, n2 = counts
    sc = alpha2 + tau2
    s1, s2 = sc + n1 * gammas2[0], sc + n2 * gammas2[1]
    n, m = (n2, n1 - 1) if group == 0 else (n2 - 1, n1)
    d = n * s1 + m * s2
    return (sc - tau2) * (s1 * s2 + tau2 * d) / (sc * d + s1 * s2)


def _eq73_naive(group, counts, alpha2, tau2, gammas2):
    """Eq. (73) with its products over groups, as printed."""
    s2 = [alpha2 + tau2 + n * g for n, g in zip(counts, gammas2, strict=True)]
    m = [n - (i == group) for i, n in enumerate(counts)]
    prod = math.prod(s2)
    mix = sum(m[i] * math.prod(s2[k] for k in range(len(s2)) if k != i) for i in range(len(s2)))
    return 1.0 / (mix / (prod + tau2 * mix) + 1.0 / alpha2)


def _eq62_naive(counts, alpha2, tau2, gammas2):
    s2 = [alpha2 + tau2 + n * g for n, g in zip(counts, gammas2, strict=True)]
    mix = sum(counts[i] * math.prod(s2[k] for k in range(len(s2)) if k != i)
              for i in range(len(s2)))
    return math.prod(s2) / mix


@pytest.mark.parametrize("model", [REGRESSION, ((1, 19), 1.0, 1.0, (0.0, 0.5)),
                                   ((3, 4), 0.2, 2.0, (1.0, 0.1)), ((2, 8, 10), 1.0, 0.5,
                                                                     (0.0, 0.2, 1.0))])
def test_bayes_and_server_variance_match_the_printed_forms(model):
    counts = model[0]
    for g in range(len(counts)):
        got = L.levels_bayes_local_mse(g, *model)
        assert got == pytest.approx(_eq73_naive(g, *model), rel=1e-12)
        if len(counts) == 2:
            assert got == pytest.approx(_eq46_naive(g, *model), rel=1e-12)
    assert L.levels_server_variance(*model) == pytest.approx(_eq62_naive(*model), rel=1e-12)
    if len(counts) == 2:
        assert L.two_level_server_covariance(*model) == pytest.approx(_eq62_naive(*model),
                                                                      rel=1e-12)
    # eq. (65)'s ratios reach eq. (62), and a brute-force search over the ratios cannot beat it.
    assert L.levels_server_mse(*model) == pytest.approx(L.levels_server_variance(*model),
                                                        rel=1e-12)
    res = minimize(lambda x: L.levels_server_mse(*model, ratios=[1.0, *np.abs(x)]),
                   np.full(len(counts) - 1, 0.5), method="Nelder-Mead",
                   options={"xatol": 1e-10, "fatol": 1e-14})
    assert res.fun >= L.levels_server_variance(*model) * (1 - 1e-12)
    np.testing.assert_allclose(np.abs(res.x), L.levels_optimal_ratios(*model)[1:], rtol=1e-4)


def test_point_estimation_is_two_levels_with_an_opt_out_group():
    n, rho, a, t, g = SETTING
    model = ((1, 19), a, t, (0.0, g))
    assert L.two_level_optimal_ratio(*model) == pytest.approx(T.optimal_ratio(*SETTING))
    assert L.two_level_optimal_lambdas(*model) == pytest.approx(
        (T.optimal_lambda_nonprivate(*SETTING), T.optimal_lambda_private(*SETTING)), rel=1e-12)
    assert L.levels_bayes_local_mse(1, *model) == T.bayes_local_mse(*SETTING, group="private")


# ---------------------------------------------------------- Lemma 6, eq. (50)

two_level_models = st.tuples(
    st.tuples(st.integers(1, 40), st.integers(1, 40)), st.floats(1e-2, 10.0),
    _variances(10.0), st.tuples(_variances(5.0), _variances(5.0)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(two_level_models)
def test_eq50_is_the_coefficient_match(model):
    """Eq. (52)-(54) coincide at r*, so their average (55) is each of them: eq. (50). The
    l-level closed form alpha^2/(tau^2 + w_g N_g gamma_g^2) gives the same values."""
    lam50 = L.two_level_optimal_lambdas(*model)
    for g in (0, 1):
        if not math.isfinite(lam50[g]):
            continue
        matched = L.two_level_matching_lambdas(g, *model)
        # The printed forms (52)-(54) subtract nearly equal terms when lambda* is large.
        np.testing.assert_allclose(matched, lam50[g], rtol=max(1e-9, 1e-13 * lam50[g]))
        assert L.levels_optimal_lambda(g, *model) == pytest.approx(lam50[g], rel=1e-10)
        exact = L.levels_optimal_lambda_exact(g, *model)
        if model[3][g] == 0:  # a group without privacy noise: eq. (50) is exact
            assert exact.lam == pytest.approx(lam50[g], rel=1e-8)
            assert exact.mse == pytest.approx(L.levels_bayes_local_mse(g, *model), rel=1e-10)
        else:
            assert exact.mse <= L.levels_personalized_mse(lam50[g], g, *model) * (1 + 1e-12)


def test_eq50_corner_cases():
    """The corner cases listed after Lemma 6."""
    n1, n2, a, t = 6, 14, 1.0, 0.7
    n, u2 = n1 + n2, t / a
    # r -> 1: Gamma_1 = Gamma_2 = G gives the same lambda for both groups.
    big_g = 3.0
    lam1, lam2 = L.two_level_optimal_lambdas((n1, n2), a, t, (big_g / n1, big_g / n2))
    common = (n * (1 + u2) + n * big_g) / (n * u2 * (1 + u2) + (n + 1) * u2 * big_g
                                            + (1 + big_g) * big_g)
    assert lam1 == pytest.approx(common, rel=1e-12) and lam2 == pytest.approx(common, rel=1e-12)
    # ... and no privacy at all: Ditto's 1/Upsilon^2.
    assert L.two_level_optimal_lambdas((n1, n2), a, t, (0.0, 0.0)) == pytest.approx(
        (1 / u2, 1 / u2), rel=1e-12)
    # N_2 -> N: lambda*_2 -> N / (Upsilon^2 N + Gamma_2^2).
    g2 = 0.3
    assert L.two_level_optimal_lambdas((0, n), a, t, (0.0, g2))[1] == pytest.approx(
        n / (u2 * n + n * g2 / a), rel=1e-12)
    # alpha^2 -> 0: local estimates (lambda* -> 0).
    assert max(L.two_level_optimal_lambdas((n1, n2), 1e-9, t, (0.1, 0.5))) < 1e-7
    # tau^2 -> 0 (IID).
    g1, g2 = 0.1, 0.5
    big1, big2 = n1 * g1 / a, n2 * g2 / a
    num = n + n2 * big1 + n1 * big2
    assert L.two_level_optimal_lambdas((n1, n2), a, 0.0, (g1, g2)) == pytest.approx(
        (num / (big1 * (1 + big2)), num / (big2 * (1 + big1))), rel=1e-12)


def test_levels_weights_and_ratios():
    w = L.levels_weights([1, 19], [1.0, T.optimal_ratio(*SETTING)])
    assert np.sum(np.array([1, 19]) * w) == pytest.approx(1.0)
    assert w[1] / w[0] == pytest.approx(T.optimal_ratio(*SETTING))
    assert L.levels_optimal_ratios([5, 15, 10], 1.0, 1.0, [0.0, 0.5, 1.0])[0] == 1.0
    # A scale of the ratios changes nothing.
    np.testing.assert_allclose(L.levels_weights([3, 4], [2e-200, 1e-200]),
                               L.levels_weights([3, 4], [1.0, 0.5]), rtol=1e-15)


# --------------------------------------------------------------- the result

def test_fedhdp_bounds_collects_the_functions():
    b = T.fedhdp_bounds(*SETTING)
    d = b.to_dict()
    assert d["n_nonprivate"] == 1 and d["n_private"] == 19
    assert d["optimal_ratio"] == T.optimal_ratio(*SETTING)
    assert d["gap_dp_fedavg"] == T.dp_fedavg_gap(*SETTING)
    assert d["lambda_private"] == T.optimal_lambda_private(*SETTING)
    assert d["lambda_private_exact"] == T.optimal_lambda_exact(*SETTING, group="private").lam
    assert d["mse_private"] == T.personalized_mse(d["lambda_private"], *SETTING,
                                                  group="private")
    assert d["bayes_nonprivate"] == T.bayes_local_mse(*SETTING, group="nonprivate")
    assert d["mse_private_exact"] <= d["mse_private"]
    with pytest.raises(AttributeError):
        b.rho = 0.1  # frozen


def test_fedhdp_bounds_empty_groups_are_nan():
    all_private = T.fedhdp_bounds(20, 0.0, 1.0, 1.0, 0.5)
    assert math.isnan(all_private.bayes_nonprivate) and math.isnan(all_private.lambda_nonprivate)
    assert math.isfinite(all_private.mse_private)
    all_out = T.fedhdp_bounds(20, 1.0, 1.0, 0.0, 0.5)
    assert math.isnan(all_out.mse_private) and all_out.lambda_nonprivate == math.inf
    assert all_out.mse_nonprivate == pytest.approx(all_out.bayes_nonprivate, rel=1e-12)


# ----------------------------------------------------------------- bad input

@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((20, 0.33, 1.0, 1.0, 0.5), {}, ValueError, "whole number"),
    ((20, 1.5, 1.0, 1.0, 0.5), {}, ValueError, "rho"),
    ((1, 0.0, 1.0, 1.0, 0.5), {}, ValueError, "n_clients"),
    ((20.5, 0.05, 1.0, 1.0, 0.5), {}, TypeError, "n_clients"),
    ((20, 0.05, 0.0, 1.0, 0.5), {}, ValueError, "alpha2"),
    ((20, 0.05, 1.0, -1.0, 0.5), {}, ValueError, "tau2"),
    ((20, 0.05, 1.0, 1.0, math.nan), {}, ValueError, "gamma2"),
    ((20, 0.05, 1.0, 1.0, 1e200), {}, ValueError, "gamma2"),
    ((20, 0.05, 1.0, True, 0.5), {}, TypeError, "tau2"),
])
def test_bad_point_arguments(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        T.fedhdp_bounds(*args, **kwargs)


def test_bad_arguments_of_the_other_functions():
    with pytest.raises(ValueError, match="lam"):
        T.personalized_mse(-1.0, *SETTING, group="private")
    with pytest.raises(ValueError, match="group"):
        T.personalized_mse(1.0, *SETTING, group="public")
    with pytest.raises(ValueError, match="no nonprivate client"):
        T.optimal_lambda_exact(20, 0.0, 1.0, 1.0, 0.5, group="nonprivate")
    with pytest.raises(ValueError, match="r must be >= 0"):
        T.server_mse(-0.1, *SETTING)
    with pytest.raises(ValueError, match="r must be > 0 when rho = 0"):
        T.server_mse(0.0, 20, 0.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="r must be a single ratio"):
        T.personalized_mse(1.0, *SETTING, group="private", r=[0.1, 0.2])
    with pytest.raises(ValueError, match="at least 2"):
        L.levels_server_variance([1], 1.0, 1.0, [0.0])
    with pytest.raises(ValueError, match="gammas2"):
        L.levels_server_variance([1, 2], 1.0, 1.0, [0.0])
    with pytest.raises(ValueError, match=r"gammas2\[1\]"):
        L.levels_server_variance([1, 2], 1.0, 1.0, [0.0, -1.0])
    with pytest.raises(ValueError, match="group"):
        L.levels_bayes_local_mse(2, [1, 2], 1.0, 1.0, [0.0, 1.0])
    with pytest.raises(ValueError, match="no client"):
        L.levels_bayes_local_mse(0, [0, 2], 1.0, 1.0, [0.0, 1.0])
    with pytest.raises(ValueError, match="ratios"):
        L.levels_server_mse([1, 2], 1.0, 1.0, [0.0, 1.0], ratios=[0.0, 0.0])
    with pytest.raises(ValueError, match="two groups"):
        L.two_level_optimal_lambdas([1, 2, 3], 1.0, 1.0, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="counts"):
        L.levels_server_variance([1.5, 2], 1.0, 1.0, [0.0, 1.0])


def test_inputs_are_not_mutated():
    counts, gammas2, lam = np.array([2, 8, 10]), np.array([0.0, 0.2, 1.0]), np.array([0.5, 2.0])
    ratios = np.array([1.0, 0.5, 0.2])
    copies = [a.copy() for a in (counts, gammas2, lam, ratios)]
    L.levels_personalized_mse(lam, 1, counts, 1.0, 0.5, gammas2, ratios=ratios)
    L.levels_optimal_lambda_exact(0, counts, 1.0, 0.5, gammas2, ratios=ratios)
    L.levels_bayes_local_mse(2, counts, 1.0, 0.5, gammas2)
    for a, b in zip((counts, gammas2, lam, ratios), copies, strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------- ebfl bounds fedhdp

FEDHDP = ["bounds", "fedhdp", "--clients", "20", "--opt-out", "0.05", "--alpha2", "1",
          "--tau2", "1", "--gamma2", "0.5"]


def _json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object
    return json.loads(out)


def test_cli_bounds_fedhdp_json_and_table(capsys):
    out = _json(capsys, FEDHDP + ["--json"])
    expected = T.fedhdp_bounds(*SETTING).to_dict()
    assert {k: out[k] for k in expected} == expected
    assert out["optimal_ratio"] == pytest.approx(0.173913, abs=5e-7)
    assert main(FEDHDP) == 0
    table = capsys.readouterr().out
    assert "lambda_private_exact" in table and "0.7142857" in table and "0.4646465" in table


def test_cli_bounds_fedhdp_json_has_no_nan_or_infinity(capsys):
    out = _json(capsys, ["bounds", "fedhdp", "--clients", "10", "--opt-out", "1", "--alpha2", "1",
                         "--tau2", "0", "--gamma2", "0.5", "--json"])
    assert out["lambda_nonprivate"] == "inf" and out["mse_private"] is None


@pytest.mark.parametrize("change, fragment", [
    (("--opt-out", "0.33"), "whole number"), (("--opt-out", "2"), "rho"),
    (("--clients", "1"), "--clients"), (("--alpha2", "0"), "--alpha2"),
    (("--tau2", "-1"), "tau2"), (("--gamma2", "nan"), "--gamma2"),
    (("--gamma2", "x"), "--gamma2"), (("--tau2", "1e400"), "--tau2"),
])
def test_cli_bounds_fedhdp_bad_values(change, fragment, capsys):
    argv = list(FEDHDP)
    argv[argv.index(change[0]) + 1] = change[1]
    for extra in ([], ["--json"]):
        assert main(argv + extra) == 2
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("error: ")
        assert fragment in lines[0]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("alpha2", [1e-100, 1.0, 1e100])
@pytest.mark.parametrize("tau2", [0.0, 1e-100, 1e100])
@pytest.mark.parametrize("gamma2", [0.0, 1e-100, 1e100])
def test_no_overflow_at_the_edges_of_the_accepted_ranges(alpha2, tau2, gamma2):
    """Every result is a number (no overflow warning, no NaN but for empty groups), and the
    printed eq. (50) agrees with the l-level closed form."""
    for n, k in ((2, 1), (2**53, 2**52), (10, 0), (10, 10), (2**53, 1)):
        d = T.fedhdp_bounds(n, k / n, alpha2, tau2, gamma2).to_dict()
        empty = {"nonprivate"} if k == 0 else {"private"} if k == n else set()
        for key, value in d.items():
            if isinstance(value, float) and math.isnan(value):
                assert set(key.split("_")) & empty, (n, k, key)
        for gammas2 in ((0.0, gamma2), (gamma2, gamma2)):
            counts = (k, n - k)
            for g in (i for i in (0, 1) if counts[i]):
                lam = L.levels_optimal_lambda(g, counts, alpha2, tau2, gammas2)
                lam50 = L.two_level_optimal_lambdas(counts, alpha2, tau2, gammas2)[g]
                assert lam50 == pytest.approx(lam, rel=1e-9)
                opt = L.levels_optimal_lambda_exact(g, counts, alpha2, tau2, gammas2)
                assert math.isfinite(opt.mse) and opt.mse >= 0
