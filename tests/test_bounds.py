"""Closed-form values of the bounds module (Theorems 1-4, the known-Beta-prior MSEs, E8)."""

import numpy as np
import pytest

from ebfl import bounds as B


def test_spec_reference_values():
    b = B.gaussian_bounds(10_000, 15, 0.1, 0.5)
    assert b.weight == pytest.approx(0.375)
    assert b.personalized == pytest.approx(0.0062510, abs=5e-8)
    assert b.local == pytest.approx(0.0166667, abs=5e-8)
    assert b.global_only == pytest.approx(0.0100007, abs=5e-8)
    # The oracle equals (46); (47) equals Theorem 1 (errata [!19]).
    assert b.oracle == b.lower_known_prior == pytest.approx(0.375 * 0.25 / 15)
    assert b.lower_estimated_mean == pytest.approx(b.personalized, rel=1e-14)


def test_remark1_ratio():
    """m = 1e4, n = 100, sigma_x^2 = 10, sigma_theta^2 = 1e-3: a = 0.00990099, ratio 0.0100."""
    m, n, st, sx = 10_000, 100, np.sqrt(1e-3), np.sqrt(10)
    assert B.gaussian_weight(m, n, st, sx) == pytest.approx(0.00990099, abs=5e-9)
    ratio = B.theorem1_mse(m, n, st, sx) / B.gaussian_local_mse(n, sx)
    assert ratio == pytest.approx(0.0100, abs=5e-5)
    assert B.theorem1_mse(m, n, 0.0, sx) / B.gaussian_local_mse(n, sx) == pytest.approx(1 / m)


def test_theorem1_algebraic_form_and_dimension():
    m, n, st, sx, d = 50, 7, 0.4, 1.3, 6
    alt = d * (st**2 * sx**2 + sx**4 / (m * n)) / (n * st**2 + sx**2)
    assert B.theorem1_mse(m, n, st, sx, d) == pytest.approx(alt, rel=1e-14)
    assert B.theorem1_mse(m, n, st, sx, d) == pytest.approx(d * B.theorem1_mse(m, n, st, sx))


def test_theorem2_is_theorem1_with_extra_heterogeneity():
    m, n, st, sx, sq = 100, 10, 0.2, 1.0, 3.0
    st_eff = np.sqrt(st**2 + sq**2 / (m - 1))
    assert B.theorem2_mse(m, n, st, sx, sq) == pytest.approx(B.theorem1_mse(m, n, st_eff, sx))
    assert B.theorem2_mse(m, n, st, sx, 1e6) == pytest.approx(B.gaussian_local_mse(n, sx), rel=1e-6)


def test_beta_values():
    b = B.beta_bounds(2, 2, 14)
    assert b.posterior == pytest.approx(0.0111111, abs=5e-8)
    assert b.local == pytest.approx(0.0142857, abs=5e-8)
    assert b.posterior == pytest.approx(b.weight * b.local)


def test_theorem3_rhs():
    m, n, a, b = 10_000, 14, 2.0, 2.0
    c2 = 3 * np.log(4 * m * m * n) / (m - 1)
    assert c2 == pytest.approx(0.006734, abs=5e-7)  # Theorem 3's c^2 at m = 1e4, n = 14
    rhs = B.theorem3_rhs(0.6, 0.05, m, n, a, b)
    assert rhs == pytest.approx(0.6 * B.beta_local_mse(a, b, n) + 0.05 * (0.05 + c2))


@pytest.mark.parametrize(("call", "match"), [
    (lambda: B.theorem1_mse(1, 15, 0.1, 0.5), "m must be"),
    (lambda: B.theorem1_mse(10, 0, 0.1, 0.5), "n must be"),
    (lambda: B.theorem1_mse(10, 2.5, 0.1, 0.5), "n must be"),
    (lambda: B.theorem1_mse(10, 15, -0.1, 0.5), "sigma_theta"),
    (lambda: B.theorem1_mse(10, 15, 0.1, 0.0), "sigma_x"),
    (lambda: B.theorem1_mse(10, 15, np.nan, 0.5), "sigma_theta"),
    (lambda: B.theorem1_mse(10, 15, 0.1, 0.5, d=0), "d must be"),
    (lambda: B.theorem2_mse(10, 15, 0.1, 0.5, -1.0), "sigma_q"),
    (lambda: B.beta_posterior_mse(0, 1, 3), "alpha"),
    (lambda: B.beta_local_mse(1, -2, 3), "beta"),
    (lambda: B.beta_bounds(1e308, 1e308, 14), "alpha"),   # alpha + beta overflowed: local = 0
    (lambda: B.beta_local_mse(1.0, 10**400, 3), "beta"),   # an int too large for float64
    (lambda: B.theorem3_rhs(1.5, 0.1, 10, 5, 1, 1), "mean_a2"),
])
def test_bad_input(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_theorem2_private_values_match_spec_table():
    """Theorem 2 at r = 1, delta = 1e-5, and the quantizer's variance."""
    for eps, mse in ((0.1, 0.016600), (0.5, 0.015215), (1, 0.012572), (2, 0.0091513),
                     (5, 0.0068568), (10, 0.0064094)):
        value = B.theorem2_gaussian_mse(10_000, 15, 0.1, 0.5, eps, 1e-5, 1.0)
        assert value == pytest.approx(mse, rel=5e-5)
    for k, mse in ((1, 0.0064131), (2, 0.0062693), (4, 0.0062518), (8, 0.0062510)):
        assert B.theorem2_quantizer_mse(10_000, 15, 0.1, 0.5, k, 1.0) == pytest.approx(
            mse, abs=5e-8)


def test_theorem4_rhs_and_constants():
    """Theorem 4's c_p^2 (m = 1e4, n = 14) and the 9x gap to Theorem 3 (errata [!5])."""
    m, n = 10_000, 14
    for eps, cp2 in ((0.5, 0.012474), (1, 0.003504), (2, 0.001290), (5, 0.000769)):
        got = B.theorem4_rhs(0.0, 1.0, m, n, 2, 2, eps) - 0.05
        assert got == pytest.approx(cp2, abs=5e-7)
    limit = B.theorem4_rhs(0.0, 1.0, m, n, 2, 2, 700.0) - 0.05
    non_private = B.theorem3_rhs(0.0, 1.0, m, n, 2, 2) - 0.05
    assert non_private / limit == pytest.approx(9.0)
    assert B.theorem4_rhs(1.0, 0.0, m, n, 2, 2, 1.0) == pytest.approx(B.beta_local_mse(2, 2, n))


def test_paper_gaussian_bounds_do_not_warn_and_report_the_true_delta():
    """The bounds use the paper's calibration on purpose: no PrivacyWarning, and the delta
    it really gives (analytic Gaussian formula) is available beside the paper's claim."""
    import warnings

    from ebfl.privacy.mechanisms import GaussianMechanism, PrivacyWarning, paper_clip_range

    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        assert B.theorem2_gaussian_mse(10_000, 15, 0.1, 0.5, 10.0, 1e-5, 1.0) == pytest.approx(
            0.0064094, rel=5e-5)
        sigma = B.gaussian_mechanism_sigma_q(10_000, 15, 0.1, 0.5, 10.0, 1e-5, 1.0)
        short = B.gaussian_mechanism_true_delta(10_000, 15, 0.1, 0.5, 3.0, 1e-5, 1.0, d=4)
        fine = B.gaussian_mechanism_true_delta(10_000, 15, 0.1, 0.5, 0.5, 1e-5, 1.0)
    assert short == pytest.approx(0.0103, rel=0.01) and fine < 1e-5
    b = paper_clip_range(1.0, 10_000, 15, 0.1, 0.5)
    with pytest.warns(PrivacyWarning):
        assert GaussianMechanism(10.0, 1e-5, b).sigma == sigma


def test_quantizer_sigma_q_closed_form_for_any_bits():
    """b/(2^k - 1) without forming 2^k: equal to the quantizer's for k <= 52, 0 far beyond."""
    from ebfl.privacy.mechanisms import StochasticQuantizer, paper_clip_range

    b = paper_clip_range(1.0, 10_000, 15, 0.1, 0.5)
    for k in (1, 2, 8, 30, 52):
        assert B.quantizer_sigma_q(10_000, 15, 0.1, 0.5, k, 1.0) == pytest.approx(
            StochasticQuantizer(k, b).max_variance ** 0.5, rel=1e-14)
    assert B.quantizer_sigma_q(10_000, 15, 0.1, 0.5, 100, 1.0) == pytest.approx(b * 2.0**-100)
