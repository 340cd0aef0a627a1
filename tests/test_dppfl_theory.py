"""DP-PFL theory (ebfl.dppfl.theory) against closed forms and brute-force optima."""

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy.optimize import linprog

from ebfl.dppfl import exact as E
from ebfl.dppfl import theory as T
from ebfl.dppfl.objective import device_sums, dual_objective, primal_dual_map, primal_objective

KAPPA = {"hinge": 0.0, "smoothed_hinge": 1.0, "squared": 1.0}


def unit_rows(rng, n, d, low=0.5):
    X = rng.standard_normal((n, d))
    return X * (rng.uniform(low, 1.0, n) / np.linalg.norm(X, axis=1))[:, None]


def naive_conjugate(a, y, loss, gamma=1.0):
    """l*(-a) written out per loss: -a y (+ gamma (a y)^2 / 2) on a y in [0, 1]; squared
    loss (v - y)^2 / 2 has -a y + a^2 / 2."""
    s = a * y
    if loss == "squared":
        return -s + 0.5 * a * a
    if s < -1e-12 or s > 1 + 1e-12:
        return math.inf
    return -s + (0.5 * gamma * s * s if loss == "smoothed_hinge" else 0.0)


def naive_local(dalpha, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss, gamma=1.0):
    """(7) in the paper's layout: X_t is d x n_t with the samples as columns."""
    Xp = np.asarray(X_t).T
    v = Xp @ dalpha
    conj = sum(naive_conjugate(a + da, yy, loss, gamma)
               for a, da, yy in zip(alpha_t, dalpha, y_t, strict=True))
    return conj + w_t @ v + beta / (4 * lam) * omega_tt * (v @ v)


def brute_force_box_qp(H, p, box):
    """min p^T s + s^T H s / 2 over the box (or R^n): every face, its stationary points found
    by an LP feasibility problem (HiGHS), so a singular H needs no special care."""
    n = p.size
    if box is None:
        s = np.linalg.lstsq(H, -p, rcond=None)[0]
        return float(p @ s + 0.5 * s @ H @ s), s
    best, best_s = math.inf, None
    for states in itertools.product((0, 1, 2), repeat=n):  # 0, 1: at that bound; 2: free
        states = np.array(states)
        free = states == 2
        s = np.where(states == 1, 1.0, 0.0)
        if free.any():
            rhs = -(p[free] + H[np.ix_(free, ~free)] @ s[~free])
            res = linprog(np.zeros(free.sum()), A_eq=H[np.ix_(free, free)], b_eq=rhs,
                          bounds=[(0.0, 1.0)] * int(free.sum()), method="highs")
            if res.status != 0:
                continue
            s[free] = res.x
        value = float(p @ s + 0.5 * s @ H @ s)
        if value < best:
            best, best_s = value, s
    return best, best_s


def local_qp(X_t, y_t, alpha_t, w_t, c, loss, gamma=1.0):
    """(7) in s = y (alpha + Delta alpha), written from the paper's formula."""
    Z = X_t * y_t[:, None]
    H = c * Z @ Z.T + (gamma if loss == "smoothed_hinge" else KAPPA[loss]) * np.eye(y_t.size)
    p = -1.0 + Z @ (w_t - c * X_t.T @ alpha_t)
    return H, p


def random_local(rng, n_t, d, loss, *, lam=None):
    X_t = unit_rows(rng, n_t, d)
    y_t = rng.choice([-1.0, 1.0], n_t)
    alpha_t = (y_t * rng.uniform(0, 1, n_t) if loss != "squared" else rng.standard_normal(n_t))
    w_t = rng.standard_normal(d) * rng.uniform(0, 5)
    omega_tt = rng.uniform(0.05, 1.0)
    lam = 10 ** rng.uniform(-3, 1) if lam is None else lam
    return X_t, y_t, alpha_t, w_t, omega_tt, lam, rng.uniform(0.5, 4.0)


# ------------------------------------------------------------------ (7)

@pytest.mark.parametrize("loss", ["hinge", "smoothed_hinge", "squared"])
def test_local_objective_is_eq7(loss):
    rng = np.random.default_rng(0)
    for _ in range(20):
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta = random_local(rng, 6, 3, loss)
        target = y_t * rng.uniform(0, 1, 6) if loss != "squared" else rng.standard_normal(6)
        dalpha = target - alpha_t
        got = E.local_objective(dalpha, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss)
        want = naive_local(dalpha, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    if loss != "squared":  # outside the domain of l*
        assert E.local_objective(-2 * y_t, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta,
                                 loss) == math.inf


@pytest.mark.parametrize("loss", ["hinge", "smoothed_hinge", "squared"])
def test_exact_local_solution_against_brute_force(loss):
    """Tiny instances, many with n_t > d (the hinge's (7) is then not strictly convex) and
    tiny lambda (large curvature, where plain coordinate descent stalls)."""
    rng = np.random.default_rng(1)
    for case in range(40):
        n_t, d = (4, 2) if case % 2 else (3, 3)
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta = random_local(
            rng, n_t, d, loss, lam=1e-3 if case % 4 == 1 else None)
        sol = E.solve_local_exactly(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss)
        assert sol.converged and sol.kkt_residual <= 1e-10
        c = beta * omega_tt / (2 * lam)
        H, p = local_qp(X_t, y_t, alpha_t, w_t, c, loss)
        value, s = brute_force_box_qp(H, p, None if loss == "squared" else (0, 1))
        const = naive_local(y_t * 0.0 - alpha_t * 0, X_t, y_t, alpha_t, w_t, omega_tt, lam,
                            beta, loss)  # G(0)
        s0 = y_t * alpha_t
        offset = const - float(p @ s0 + 0.5 * s0 @ H @ s0)  # G = QP + offset
        scale = 1.0 + abs(value + offset)
        assert sol.objective == pytest.approx(value + offset, abs=1e-9 * scale)
        assert sol.objective == pytest.approx(
            naive_local(sol.dalpha, X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, loss),
            abs=1e-12 * scale)
        brute_dalpha = y_t * s - alpha_t
        # X_t Delta alpha_t (hence every slope) is the same in every minimizer ...
        np.testing.assert_allclose(X_t.T @ sol.dalpha, X_t.T @ brute_dalpha,
                                   atol=1e-6 * (1 + 1 / c) if loss == "hinge" else 1e-7)
        # ... and the determined coordinates are those of every minimizer
        np.testing.assert_allclose(sol.dalpha[sol.determined], brute_dalpha[sol.determined],
                                   atol=1e-6)
        if loss != "hinge":
            assert sol.determined.all()


def test_hinge_minimizer_set_and_determined_coordinates():
    """Two identical rows: only their sum is determined, unless a slope pins them."""
    X_t = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    y_t = np.ones(3)
    sol = E.solve_local_exactly(X_t, y_t, np.zeros(3), np.zeros(2), 1.0, 1.0, 2.0)
    # c = 1: along x = (1, 0), -(s0 + s1) + (s0 + s1)^2 / 2 is minimal at s0 + s1 = 1
    assert sol.dalpha[:2].sum() == pytest.approx(1.0)
    assert sol.dalpha[2] == pytest.approx(1.0)
    assert sol.determined.tolist() == [False, False, True]


def test_non_convergence_warns(monkeypatch):
    monkeypatch.setattr(E, "_box_qp", lambda H, p, lo, hi, s, tol, max_iter: s)
    rng = np.random.default_rng(2)
    args = random_local(rng, 8, 2, "hinge", lam=1e-3)
    with pytest.warns(RuntimeWarning, match="not solved"):
        sol = E.solve_local_exactly(*args, max_sweeps=1, tol=1e-14)
    assert not sol.converged and sol.kkt_residual > 1e-14


def test_local_solution_quality():
    rng = np.random.default_rng(3)
    args = random_local(rng, 6, 2, "smoothed_hinge", lam=0.1)
    sol = E.solve_local_exactly(*args, "smoothed_hinge")
    q = lambda dalpha: E.local_solution_quality(dalpha, *args, "smoothed_hinge")  # noqa: E731
    assert q(np.zeros(6)) == 1.0
    assert q(sol.dalpha) == pytest.approx(0.0, abs=1e-9)
    # G is convex: half-way is at most half the way up
    assert 0.0 < q(0.5 * sol.dalpha) <= 0.5 + 1e-12
    G = [E.local_objective(v, *args, "smoothed_hinge") for v in (0.5 * sol.dalpha,
                                                                  np.zeros(6))]
    assert q(0.5 * sol.dalpha) == pytest.approx((G[0] - sol.objective)
                                                / (G[1] - sol.objective))


@pytest.mark.parametrize("loss,kappa", [("hinge", 0.0), ("smoothed_hinge", 0.7),
                                        ("squared", 1.0)])
def test_local_strong_convexity_is_the_hessians_smallest_eigenvalue(loss, kappa):
    rng = np.random.default_rng(4)
    for n_t, d in ((2, 3), (5, 3)):
        X_t, y_t, alpha_t, w_t, omega_tt, lam, beta = random_local(rng, n_t, d, loss)
        modulus, claimed = E.local_strong_convexity(X_t, omega_tt, lam, beta, loss, gamma=0.7)
        assert claimed == beta * n_t / (2 * lam)
        # second differences of G (interior point) along the Hessian's eigenvectors
        hess = beta * omega_tt / (2 * lam) * X_t @ X_t.T + kappa * np.eye(n_t)
        evals, evecs = np.linalg.eigh(hess)
        assert modulus == pytest.approx(evals[0], abs=1e-10 * evals[-1])
        a0 = 0.5 * y_t if loss != "squared" else alpha_t
        h = 1e-3
        G = lambda v: naive_local(v, X_t, y_t, a0, w_t, omega_tt, lam, beta, loss, 0.7)  # noqa
        u = evecs[:, 0]
        curv = (G(h * u) + G(-h * u) - 2 * G(0 * u)) / h**2
        assert curv == pytest.approx(modulus, abs=1e-6 * (1 + evals[-1]))
        if n_t > d:
            assert modulus == pytest.approx(kappa, abs=1e-9 * evals[-1])


# ------------------------------------------------------------------ the dual (5)

@pytest.mark.parametrize("loss", ["hinge", "smoothed_hinge", "squared"])
def test_dual_solution_against_brute_force_and_duality(loss):
    rng = np.random.default_rng(5)
    for _ in range(6):
        X = unit_rows(rng, 5, 2)
        y = rng.choice([-1.0, 1.0], 5)
        offsets = np.array([0, 2, 5])
        omega = T.random_feasible_omega(2, rng)
        lam = 10 ** rng.uniform(-2, 0)
        sol = E.solve_dual_exactly(X, y, offsets, omega, lam, loss)
        assert sol.converged
        rows = np.repeat([0, 1], [2, 3])
        Z = X * y[:, None]
        H = omega[np.ix_(rows, rows)] * (Z @ Z.T) / (2 * lam) + KAPPA[loss] * np.eye(5)
        value, _ = brute_force_box_qp(H, -np.ones(5), None if loss == "squared" else (0, 1))
        assert sol.objective == pytest.approx(value, abs=1e-9 * (1 + abs(value)))
        # strong duality: P(W(alpha*)) = -D(alpha*)
        W = primal_dual_map(X, sol.alpha, offsets, omega, lam)
        primal = primal_objective(X, y, offsets, W, omega, lam, loss)
        assert primal == pytest.approx(-sol.objective, abs=1e-8 * (1 + abs(value)))
        assert abs(sol.gap) < 1e-8 * (1 + abs(value))


# ------------------------------------------------------------------ Lemma 1

def lemma1_instance(rng, m=3, n_t=4, d=2):
    X = unit_rows(rng, m * n_t, d)
    y = rng.choice([-1.0, 1.0], m * n_t)
    return X, y, np.arange(m + 1) * n_t, T.random_feasible_omega(m, rng)


def test_lemma1_ratio_closed_forms():
    X = np.tile([[0.6, 0.8]], (6, 1))
    offsets = np.array([0, 2, 4, 6])
    dalpha = np.ones(6)  # every X_t Delta alpha_t is the same vector
    assert T.lemma1_ratio(X, offsets, np.ones((3, 3)) / 3, dalpha) == pytest.approx(3.0)
    assert T.lemma1_ratio(X, offsets, np.diag([0.2, 0.3, 0.5]), dalpha) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="0/0"):
        T.lemma1_ratio(X, offsets, np.eye(3) / 3, np.zeros(6))


def test_lemma1_ratio_never_exceeds_its_sup_and_the_sup_is_attained():
    rng = np.random.default_rng(6)
    for _ in range(30):
        X, y, offsets, omega = lemma1_instance(rng)
        sup = T.lemma1_ratio_sup(omega)
        assert sup <= 3 + 1e-12
        assert T.lemma1_ratio(X, offsets, omega, rng.standard_normal(12)) <= sup + 1e-12
    # attained: every device one row along a shared direction, Delta alpha_t from the
    # top eigenvector of D^-1/2 Omega D^-1/2 (scaled back by D^-1/2)
    X = np.tile([[1.0, 0.0]], (3, 1))
    evals, evecs = np.linalg.eigh(omega / np.sqrt(np.outer(np.diag(omega), np.diag(omega))))
    dalpha = evecs[:, -1] / np.sqrt(np.diag(omega))
    assert T.lemma1_ratio(X, np.arange(4), omega, dalpha) == pytest.approx(
        T.lemma1_ratio_sup(omega))


def test_lemma1_gap_printed_vs_mocha():
    rng = np.random.default_rng(7)
    for loss in ("hinge", "smoothed_hinge", "squared"):
        for _ in range(20):
            X, y, offsets, omega = lemma1_instance(rng)
            lam, xi = 10 ** rng.uniform(-2, 0), rng.uniform(0.1, 1.0)
            if loss == "squared":
                alpha, target = rng.standard_normal(12), rng.standard_normal(12)
            else:
                alpha, target = y * rng.uniform(0, 1, 12), y * rng.uniform(0, 1, 12)
            dalpha = rng.uniform(0, 1) * (target - alpha)
            args = (X, y, offsets, alpha, dalpha, omega, lam, xi, loss)
            mocha, printed = T.lemma1_gap(*args, form="mocha"), T.lemma1_gap(*args)
            S = device_sums(X, alpha, offsets)
            shift = xi * np.sum(omega * (S @ S.T)) / (4 * lam)
            assert printed == pytest.approx(mocha - shift, abs=1e-10 * (1 + abs(mocha)))
            assert mocha >= -1e-10 * (1 + abs(dual_objective(X, y, offsets, alpha, omega, lam,
                                                             loss)))
            # Delta alpha = 0: the printed form fails by exactly xi ||X alpha||^2 / (4 lambda)
            zero = T.lemma1_gap(X, y, offsets, alpha, 0 * alpha, omega, lam, xi, loss)
            assert zero == pytest.approx(-shift, rel=1e-10)


def test_lemma1_needs_its_condition_on_beta():
    """Every X_t Delta alpha_t along one direction and Omega = 1 1^T / m: the ratio (9) is m,
    so with xi = 1 the (MOCHA) inequality holds at beta = m and fails well below it."""
    X, offsets = np.tile([[1.0, 0.0]], (12, 1)), np.arange(4) * 4
    omega, y = np.ones((3, 3)) / 3, np.ones(12)
    alpha, dalpha = np.zeros(12), np.ones(12)
    assert T.lemma1_ratio(X, offsets, omega, dalpha) == pytest.approx(3.0)
    gaps = [T.lemma1_gap(X, y, offsets, alpha, dalpha, omega, 0.1, 1.0, "hinge", beta=b,
                         form="mocha") for b in (3.0, 0.5)]
    assert gaps[0] == pytest.approx(0.0, abs=1e-9)  # tight: the ratio is exactly m
    # D(dalpha) = -12 + ||X dalpha||^2_Omega / (4 lambda), sum G = -12 + beta 16 / (4 lambda)
    assert gaps[1] == pytest.approx((0.5 - 3.0) * 16 / 0.4)


# ------------------------------------------------------------------ Corollaries 2 and 3

def test_corollary2_flip_by_hand():
    """Sample 0 has margin 60 (Delta alpha^0 = 0); its mirror image has margin -60 and
    curvature c = beta Omega_tt / (2 lambda) = 50, so its coordinate moves to
    min(1, 61 / 50) = 1; rows 1 and 2 cancel and stay at 1 in both."""
    X_t = [[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]
    res = T.corollary2_difference(X_t, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [60.0, 0.0], 0.5,
                                  0.01, 2.0, 0, [-1.0, 0.0], 1)
    np.testing.assert_allclose(res.original.dalpha, [0.0, 1.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(res.neighbour.dalpha, [1.0, 1.0, 1.0], atol=1e-12)
    assert res.difference == res.certified_difference == res.coordinate_difference == 1.0
    assert res.bound == pytest.approx((8 * 0.01 + 2.0) / (2.0 * 3))
    assert res.ratio == pytest.approx(1.0 / res.bound)
    # with margin 20 the coordinate stops inside the box: 21 / 50
    res = T.corollary2_difference(X_t, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [20.0, 0.0], 0.5,
                                  0.01, 2.0, 0, [-1.0, 0.0], 1)
    assert res.coordinate_difference == pytest.approx(21 / 50)


def test_corollary2_label_flip_keeps_the_box_position():
    rng = np.random.default_rng(9)
    X_t, y_t, alpha_t, w_t, omega_tt, lam, beta = random_local(rng, 5, 2, "hinge", lam=10.0)
    res = T.corollary2_difference(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, 2, X_t[2],
                                  int(-y_t[2]))
    # the neighbour's problem is (7) with row 2 relabelled and alpha_2 -> -alpha_2
    y2, a2 = y_t.copy(), alpha_t.copy()
    y2[2], a2[2] = -y_t[2], -alpha_t[2]
    ref = E.solve_local_exactly(X_t, y2, a2, w_t, omega_tt, lam, beta)
    assert res.neighbour.objective == pytest.approx(ref.objective, abs=1e-10)
    assert res.bound == (8 * lam + beta) / (beta * 5)


def test_corollary2_holds_for_large_lambda_with_small_models():
    """(8 lambda + beta)/(beta n_t) >= 1 and a state w(alpha) of eq. (6): nothing moves much."""
    rng = np.random.default_rng(10)
    for _ in range(10):
        X_t, y_t, alpha_t, _, omega_tt, _, beta = random_local(rng, 6, 2, "smoothed_hinge")
        lam = 20.0
        w_t = X_t.T @ alpha_t * omega_tt / (2 * lam)
        res = T.corollary2_difference(X_t, y_t, alpha_t, w_t, omega_tt, lam, beta, 0,
                                      -X_t[0], int(y_t[0]), "smoothed_hinge")
        assert res.ratio < 1.0


def test_corollary3_closed_form():
    rng = np.random.default_rng(11)
    for _ in range(20):
        X_t = unit_rows(rng, 5, 3)
        dalpha, xi, j = rng.standard_normal(5), rng.uniform(0.1, 1), int(rng.integers(5))
        x_new = unit_rows(rng, 1, 3)[0]
        diff, bound = T.corollary3_difference(X_t, dalpha, xi, j, x_new)
        assert diff == pytest.approx(xi * abs(dalpha[j]) * np.linalg.norm(X_t[j] - x_new))
        assert bound == pytest.approx(2 * xi * np.linalg.norm(dalpha))
        assert diff <= bound


# ------------------------------------------------------------------ Omega-step

def test_omega_step_value_closed_form_and_optimality():
    rng = np.random.default_rng(12)
    for m, d in ((4, 6), (5, 5), (6, 3)):  # the last: rank-deficient W, singular Omega*
        W = rng.standard_normal((m, d))
        res = T.omega_step_value(W)
        assert res.closed_form == pytest.approx(np.linalg.svd(W, compute_uv=False).sum() ** 2)
        assert res.value == pytest.approx(res.closed_form, rel=1e-10)
        assert np.trace(res.omega) == pytest.approx(1.0)
        assert np.linalg.eigvalsh(res.omega).min() > -1e-12
        for _ in range(50):
            other = T.random_feasible_omega(m, rng)
            for weight in (1.0, 1e-3):
                mix = (1 - weight) * res.omega + weight * other
                assert T.omega_objective(W, mix) >= res.closed_form * (1 - 1e-12)
    # the inverse is the real one: a diagonal example
    assert T.omega_objective([[1.0, 0.0], [0.0, 2.0]], np.diag([0.2, 0.8])) == pytest.approx(
        1 / 0.2 + 4 / 0.8)
    with pytest.raises(ValueError, match="all zero"):
        T.omega_step_value(np.zeros((2, 3)))


def test_random_feasible_omega():
    omega = T.random_feasible_omega(5, 0, rank=2)
    assert np.trace(omega) == pytest.approx(1.0)
    assert np.linalg.matrix_rank(omega, tol=1e-12) == 2
    np.testing.assert_array_equal(omega, T.random_feasible_omega(5, 0, rank=2))


# ------------------------------------------------------------------ Theorems 3 and 4

def test_theorem3_closed_forms():
    assert T.theorem3_rate(0.5, 0.2, 0.5) == pytest.approx(1 - 0.5 * 0.5 * 0.8 * 0.5)
    assert T.theorem3_iterations(1000, 1e-3, 0.5, 0.0, 1.0) == pytest.approx(
        math.log(1e6) / 0.25)
    assert T.theorem3_iterations(100, 1e-3, 1.0, 0.0, 1.0) == math.inf
    assert T.theorem3_iterations(1.0, 2.0, 0.5, 0.0, 0.5) == 0.0
    # s: device 1's rows (1,0),(1,0) have sigma = 2; Omega_11 = 0.7
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    s = T.theorem3_s(X, [0, 2, 3], np.diag([0.7, 0.3]), 0.5, 1.5, 2.0)
    assert s == pytest.approx(min(2 * 0.5 * 2 / (2 * 0.5 * 2 + 1.5 * 0.7 * 2),
                                  2 / (2 + 1.5 * 0.3 * 1)))
    with pytest.raises(ValueError, match="theta"):
        T.theorem3_rate(0.5, 1.0, 0.5)


def test_theorem4_both_forms_by_hand():
    """sizes (100, 100), lambda 0.1, eps 0.5, xi 0.5: A = 2 * 20000 / (0.1 * 40000) = 10 and,
    with beta = xi m = 1, B = 2 * 20000 / 4000 = 10."""
    printed = T.theorem4_iterations([100, 100], 0.1, 0.5, 0.5)
    k0 = math.ceil(0.5 * math.log(200 / 5))
    K0 = k0 + math.ceil(2 / 0.5 * (4 * 10 / 0.5 - 1))
    assert (printed.k0, printed.K0, printed.K) == (k0, K0, K0 + math.ceil(2 * 10 / 0.5 / 0.5))
    proof = T.theorem4_iterations([100, 100], 0.1, 0.5, 0.5, form="proof")
    k0 = math.ceil(0.25 * math.log(200 / 10))
    K0 = k0 + math.ceil(2 / 0.25 * (2 * 10 / 0.5 - 1))  # 4 L^2 beta sum n^2 / (lam n^2) = 2 B
    assert (proof.k0, proof.K0, proof.K) == (k0, K0, K0 + math.ceil(10 / (0.25 * 0.5)))
    # the K - K0 steps agree; K0's differ by 2 / (xi (1 - Theta)) before rounding
    assert printed.K - printed.K0 == proof.K - proof.K0
    assert (printed.K0 - printed.k0) - (proof.K0 - proof.k0) == 4
    assert T.theorem4_iterations([10, 20], 1.0, 1.0, 1.0).K == math.inf
    assert T.theorem4_iterations([10, 20], 1.0, 1.0, 0.5, initial_gap=0.0).k0 == 0.0


# ------------------------------------------------------------------ runs and rates

def test_exact_local_run_descends_to_the_dual_optimum():
    rng = np.random.default_rng(13)
    X, y, offsets, omega = lemma1_instance(rng, m=3, n_t=6, d=2)
    best = E.solve_dual_exactly(X, y, offsets, omega, 0.1, "smoothed_hinge")
    run = E.exact_local_run(X, y, offsets, omega, 0.1, 0.5, 80, "smoothed_hinge")
    duals = np.array([row["dual"] for row in run.history])
    assert np.all(np.diff(duals) <= 1e-12)  # Lemma 1 (with the constant) and exact solves
    assert duals[-1] - best.objective < 1e-9 and duals[-1] >= best.objective - 1e-12
    fit = E.linear_rate(run.history, optimum=best.objective)
    s = T.theorem3_s(X, offsets, omega, 0.1, 1.5, 1.0)
    assert fit.worst_step <= T.theorem3_rate(0.5, 0.0, s)
    assert fit.rate <= fit.worst_step + 1e-12
    assert run.worst_kkt_residual <= 1e-10


def test_linear_rate_on_geometric_sequences():
    hist = [{"iteration": k, "dual": 2.0 + 3.0 * 0.7**k, "gap": 0.9**k} for k in range(0, 40, 2)]
    fit = E.linear_rate(hist, optimum=2.0)
    assert fit.rate == pytest.approx(0.7) and fit.worst_step == pytest.approx(0.7)
    assert fit.intercept == pytest.approx(math.log(3.0))
    assert E.linear_rate(hist, value="gap").rate == pytest.approx(0.9)
    # the floor: a sequence that stalls at rounding level is cut there
    stall = [{"iteration": k, "gap": max(0.5**k, 1e-13)} for k in range(60)]
    fit = E.linear_rate(stall, value="gap")
    assert fit.rate == pytest.approx(0.5) and fit.iterations[-1] < 30
    with pytest.raises(ValueError, match="optimum"):
        E.linear_rate(hist)
    with pytest.raises(TypeError, match="history"):
        E.linear_rate([{"iteration": 0}], value="gap")


# ------------------------------------------------------------------ input checks

def test_bad_input_is_refused_by_name():
    X_t, y_t = np.eye(2), np.ones(2)
    good = (X_t, y_t, np.zeros(2), np.zeros(2), 0.5, 0.1, 1.0)
    with pytest.raises(ValueError, match="y_t"):
        E.solve_local_exactly(X_t, [1.0, 0.5], *good[2:])
    with pytest.raises(ValueError, match="alpha_t"):
        E.solve_local_exactly(X_t, y_t, [2.0, 0.0], *good[3:])
    with pytest.raises(ValueError, match="w_t"):
        E.solve_local_exactly(X_t, y_t, np.zeros(2), np.zeros(3), 0.5, 0.1, 1.0)
    with pytest.raises(ValueError, match="lam"):
        E.solve_local_exactly(*good[:5], 0.0, 1.0)
    with pytest.raises(ValueError, match="loss"):
        E.solve_local_exactly(*good, "logistic")
    with pytest.raises(ValueError, match="norm <= 1"):
        T.corollary2_difference(2 * X_t, *good[1:], 0, [0.0, 1.0], 1)
    with pytest.raises(ValueError, match="x_new"):
        T.corollary2_difference(*good, 0, [1.0, 1.0], 1)
    with pytest.raises(ValueError, match="y_new"):
        T.corollary2_difference(*good, 0, [1.0, 0.0], 0)
    with pytest.raises(ValueError, match="j"):
        T.corollary3_difference(X_t, [1.0, 1.0], 0.5, 2, [1.0, 0.0])
    with pytest.raises(ValueError, match="xi"):
        T.corollary3_difference(X_t, [1.0, 1.0], 0.0, 0, [1.0, 0.0])
    with pytest.raises(ValueError, match="offsets"):
        T.lemma1_ratio(X_t, [0, 1], np.eye(1), [1.0, 1.0])
    with pytest.raises(ValueError, match="semidefinite"):
        T.lemma1_ratio(X_t, [0, 1, 2], [[0.5, 1.0], [1.0, 0.5]], [1.0, 1.0])
    with pytest.raises(ValueError, match="form"):
        T.lemma1_gap(X_t, y_t, [0, 1, 2], np.zeros(2), np.zeros(2), np.eye(2) / 2, 0.1, 0.5,
                     form="cocoa")
    with pytest.raises(ValueError, match="form"):
        T.theorem4_iterations([5], 1.0, 1.0, 0.5, form="both")
    with pytest.raises(TypeError, match="gamma"):
        E.local_objective(np.zeros(2), *good, gamma="1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inputs = [x.copy() for x in (X_t, y_t)]
        E.solve_local_exactly(*good)
        np.testing.assert_array_equal(inputs[0], X_t)  # nothing passed in is changed
