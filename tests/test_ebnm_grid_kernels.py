"""The Numba kernel of the component densities against its numpy twin.

``ebfl.eb.normal_means._grid_kernels.log_component_matrix`` must equal
``NormalMeansPrior._log_component_density_numpy`` to 1e-10 relative (to 1 + |log f|,
plus the cancelling terms of the exponential and truncated normal closed forms)
for every component kind, on observations from the bulk to 1e3 standard errors out,
s over six decades, intervals from 1e-6 s to 1e3 s wide.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from ebfl.eb.normal_means import NormalMeansPrior
from ebfl.eb.normal_means._grid_kernels import log_component_matrix
from ebfl.eb.normal_means.prior import KINDS


def _prior(rng, k, kinds=KINDS, log_scales=(-3, 2)):
    kinds = rng.choice(kinds, k).tolist()
    a = rng.normal(0, 3, k)
    b = np.empty(k)
    for j, kind in enumerate(kinds):
        scale = 10 ** rng.uniform(*log_scales)
        if kind == "uniform":
            b[j] = a[j] + scale
        elif kind == "normal":
            b[j] = 0.0 if rng.random() < 0.2 else scale
        else:
            b[j] = scale
            if kind == "tnormal+" and rng.random() < 0.3:
                a[j] = -30 * scale  # the truncation far in the tail
    return NormalMeansPrior(np.full(k, 1 / k), kinds, a, b)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), far=st.floats(0, 3))
def test_kernel_equals_numpy_twin(seed, n, far):
    rng = np.random.default_rng(seed)
    g = _prior(rng, int(rng.integers(1, 30)))
    s = 10 ** rng.uniform(-3, 3, n)
    x = rng.normal(0, 3, n) + s * rng.normal(0, 10**far, n)
    codes = np.array([KINDS.index(k) for k in g.kinds], dtype=np.int64)
    got = log_component_matrix(x, s, codes, g.a, g.b)
    want = g._log_component_density_numpy(x, s)
    assert got.shape == want.shape
    both_inf = np.isneginf(got) & np.isneginf(want)
    # The exponential components' closed form adds terms of size s^2 / (2 b^2) and
    # |x - a| / b that cancel where b << s: both sides round them alike, so the
    # tolerance is relative to their size there.
    # (The truncated normal's, likewise, subtracts log Phi(a / b) from log Phi(m / sd),
    # both of size (a / b)^2 / 2 where the truncation lies far in the tail.)
    kinds = np.array(g.kinds)[None]
    expo = np.isin(kinds, ("exp+", "exp-"))
    safe_b = np.where(g.b > 0, g.b, 1.0)
    terms = np.where(expo, s[:, None] ** 2 / (2 * safe_b**2)
                     + np.abs(x[:, None] - g.a) / safe_b, 0.0)
    terms = terms + np.where(kinds == "tnormal+", 2 * np.abs(special.log_ndtr(g.a / safe_b)),
                             0.0)
    err = np.where(both_inf, 0.0, np.abs(got - want) / (1 + np.abs(want) + terms))
    # 1e-10, not 1e-12: log(Phi(hi) - Phi(lo)) of a uniform component 1e-5 standard
    # errors wide loses log10(1e5) digits to the difference in both (2e-12 measured)
    assert np.all(np.isfinite(err)) and err.max() <= 1e-10, err.max()


def test_public_method_takes_the_kernel_for_large_problems():
    rng = np.random.default_rng(1)
    g = _prior(rng, 40)
    x, s = rng.normal(0, 3, 2000), 10 ** rng.uniform(-1, 1, 2000)
    got, want = g.log_component_density(x, s), g._log_component_density_numpy(x, s)
    codes = np.array([KINDS.index(k) for k in g.kinds], dtype=np.int64)
    np.testing.assert_array_equal(got, log_component_matrix(x, s, codes, g.a, g.b))
    assert np.max(np.abs(got - want) / (1 + np.abs(want))) < 1e-6  # (the twin: above)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), far=st.floats(0, 3),
       grid_kinds=st.booleans())
def test_likelihood_matrix_equals_numpy_twin(seed, n, far, grid_kinds):
    """mix-SQP's input in one pass (each row scaled to a largest entry of 1, and the
    log of that scale). The grid families' kinds, in linear space (the rows hundreds of
    sds from every component redone in log space), equal the numpy twin to 1e-10 of
    1 + |shift| relative in each entry (an entry is exp(log density - shift): its log's
    relative error times |shift|) plus 1e-12; the other kinds, in log space, equal
    ``log_component_matrix`` exponentiated (that kernel's twin test is above)."""
    from ebfl.eb.normal_means._grid_kernels import likelihood_matrix
    from ebfl.eb.normal_means.grid import _likelihood_numpy

    rng = np.random.default_rng(seed)
    g = _prior(rng, int(rng.integers(1, 30)),
               ("normal", "uniform") if grid_kinds else KINDS)
    s = 10 ** rng.uniform(-3, 3, n)
    x = rng.normal(0, 3, n) + s * rng.normal(0, 10**far, n)
    codes = np.array([KINDS.index(k) for k in g.kinds], dtype=np.int64)
    lik, shift = likelihood_matrix(x, s, codes, g.a, g.b)
    assert np.all(lik.max(axis=1) == pytest.approx(1.0, rel=1e-12))
    if all(k in ("normal", "uniform") for k in g.kinds):
        lik_np, shift_np = _likelihood_numpy(g, x, s)
        assert np.all(np.abs(shift - shift_np) <= 1e-10 * (1 + np.abs(shift_np)))
        tol = 1e-10 * (1 + np.abs(shift_np))[:, None] * lik_np + 1e-12
        assert np.all(np.abs(lik - lik_np) <= tol)
    else:
        log_l = log_component_matrix(x, s, codes, g.a, g.b)
        np.testing.assert_array_equal(shift, log_l.max(axis=1))
        np.testing.assert_allclose(lik, np.exp(log_l - shift[:, None]), rtol=1e-15, atol=0)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20_000))
def test_certificate_kernel_equals_numpy_twin(seed, n):
    """The one-pass certificate (sums over blocks of 4096 rows, in block order; the
    components without weight in linear space) equals the numpy matrix computation to
    1e-10 relative, on the grid families' kinds (normal and uniform components; the
    others' closed forms cancel, see above), most weights 0 as in a fitted grid."""
    from ebfl.eb.normal_means.grid import _certificate_numpy, certificate

    rng = np.random.default_rng(seed)
    g = _prior(rng, int(rng.integers(1, 25)), ("normal", "uniform"))
    w = rng.dirichlet(np.ones(g.n_components))
    # most components without weight, as in a fitted grid (their linear-space path)
    w = np.where(rng.random(w.size) < 0.7, 0.0, w)
    w[int(np.argmax(w))] += 1e-3
    g = NormalMeansPrior(w / w.sum(), g.kinds, g.a, g.b)
    s = 10 ** rng.uniform(-1, 1, n)
    x = rng.normal(0, 3, n) + s * rng.standard_normal(n)
    kkt, ll = certificate(g, x, s)
    kkt_np, ll_np = _certificate_numpy(g, x, s)
    assert ll == pytest.approx(ll_np, rel=1e-10)
    assert kkt == pytest.approx(kkt_np, rel=1e-9, abs=1e-11)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3000), far=st.floats(0, 2))
def test_posterior_kernel_equals_numpy_twin(seed, n, far):
    """Every field of the posterior from ``posterior_rows`` (with its flagged rows redone
    in numpy) against the numpy path: the mean to 1e-9 posterior sds, the others to
    1e-9 relative (probabilities: plus 1e-12; sd and second moment 1e-7), for every
    kind, s over two decades, scales from 1e-2 to 1e2 and observations up to 100 s out.
    (Scales far below s make the exponential and truncated normal log densities cancel
    terms of size (s / b)^2, which both sides round differently: that is the density
    test's business above.)"""
    rng = np.random.default_rng(seed)
    g = _prior(rng, int(rng.integers(1, 20)), log_scales=(-2, 2))
    g = NormalMeansPrior(rng.dirichlet(np.ones(g.n_components)), g.kinds, g.a, g.b)
    s = 10 ** rng.uniform(-1, 1, n)
    x = rng.normal(0, 3, n) + s * rng.normal(0, 10**far, n)
    got = g._posterior_arrays(x, s) if x.size * g.n_components >= 20_000 else None
    if got is None:  # small problems take numpy: call the kernel path directly
        from ebfl.eb.normal_means import prior as prior_module

        saved = prior_module._KERNEL_MIN
        prior_module._KERNEL_MIN = 0
        try:
            got = g._posterior_arrays(x, s)
        finally:
            prior_module._KERNEL_MIN = saved
    want = g._posterior_arrays_numpy(x, s)
    mean, sd = want[0], want[1]
    assert np.all(np.abs(got[0] - mean) <= 1e-9 * (np.abs(mean) + sd) + 1e-300)
    # sd and second moment to 1e-7: the closed-form variance of a piece 20 sds into a
    # tail subtracts terms 1e5 times its size (the quadrature takes over only beyond
    # 1e6), and the two log Phi's differ in their last bits there (3e-9 measured)
    for k, rtol, floor in ((1, 1e-7, 0.0), (2, 1e-7, 0.0), (3, 1e-9, 1e-12), (4, 1e-9, 1e-12),
                           (5, 1e-9, 0.0)):
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=floor)
