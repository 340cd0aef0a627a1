"""Contract test: every public callable of the core refuses bad input by name and mutates nothing.

The machinery (:class:`~tests.badinput.Case` and the variants derived from it)
is in :mod:`tests.badinput`; this file holds the corpus of the estimation
core, privacy, bounds, the numpy learning layer, validation, the experiments
and the torch layer. Inputs are tiny, so the whole file runs in seconds; the
torch cases are in their own section and skip without torch.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from ebfl import (
    BetaBernoulliPopulation,
    BetaPrior,
    GaussianPopulation,
    Ragged,
    beta_bernoulli_eb,
    beta_binomial_eb,
    bounds,
    gaussian_eb,
    gaussian_eb_samples,
    personalized_gaussian,
)
from ebfl.demo import run_demo
from ebfl.eb import (
    GaussianMixturePrior,
    NormalPrior,
    bernoulli_counts,
    discrete_mixture_eb,
    discrete_posterior,
    expected_posterior_variance,
    gaussian_mixture_eb,
    gaussian_mixture_posterior,
    lemma1_radius,
    npmle_binomial,
    npmle_normal,
)
from ebfl.eb.beta_binomial import METHODS as BETA_METHODS
from ebfl.eb.gaussian import METHODS as GAUSSIAN_METHODS
from ebfl.learning import (
    DiscreteMixtureLinear,
    FedAvgLinear,
    FedAvgLogistic,
    GaussianMixtureLinear,
    LaplaceLinear,
    LinearEM,
    LinearGD,
    LogisticEM,
    LogisticGD,
    RegressionData,
    finetune_linear,
    finetune_logistic,
    laplace_objective,
    linear_objective,
    local_least_squares,
    logistic_map,
    logistic_objective,
    marginal_loglik,
    posterior_regression,
    run_federated,
)
from ebfl.learning.partition import dirichlet, natural, pathological, train_test_split_per_client
from ebfl.privacy import (
    BinaryMechanism,
    DPAdaPeDAccountant,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
    StochasticQuantizer,
    analytic_gaussian_delta,
    dp_adaped_epsilon,
    paper_clip_range,
    private_bernoulli_corrected,
    private_bernoulli_paper,
    private_gaussian,
    rdp_to_delta,
    rdp_to_epsilon,
    theorem7_rdp,
)
from ebfl.privacy.accounting import dp_adaped_noise_multiplier
from ebfl.privacy.sweep import private_bernoulli_sweep
from ebfl.validation import judge, make_result, run_replicates, validate
from ebfl.validation.sweeps import plot_sweeps, run_sweep
from tests.badinput import (
    INF,
    NAN,
    Case,
    assert_same,
    bad_variants,
    check_extreme,
    check_refusal,
    check_valid,
    complex_of,
    extreme_variants,
    param_ids,
    table_tests,
)

# ------------------------------------------------------------------- inputs
# Multiples of 1/4 in [-2, 2]: exact in float16, so converted inputs give
# bit-identical results.

def _quarters(shape, seed):
    return np.random.default_rng(seed).integers(-8, 9, shape) / 4.0


def _X():
    return _quarters((4, 3, 2), 0)


def _Y():
    return _quarters((4, 3), 1)


def _Ybin():
    return np.random.default_rng(2).integers(0, 2, (4, 3)).astype(float)


def _data():
    return RegressionData.from_arrays(_X(), _Y())


def _bindata():
    return RegressionData.from_arrays(_X(), _Ybin())


def _halves(points, k, rng):
    """A tiny deterministic clustering: k groups by rank of the first coordinate."""
    order = np.argsort(points[:, 0], kind="stable")
    labels = np.empty(len(points), np.int64)
    for lab, idx in enumerate(np.array_split(order, k)):
        labels[idx] = lab
    centres = np.stack([points[labels == lab].mean(axis=0) for lab in range(k)])
    return centres, labels


def _bad_cluster_shape(points, k, rng):
    return np.zeros((k + 1, points.shape[1])), np.zeros(len(points), np.int64)


def _bad_cluster_labels(points, k, rng):
    return np.zeros((k, points.shape[1])), np.full(len(points), k, np.int64)


# ------------------------------------------------------ estimation: ebfl, ebfl.eb

def _beta_prior(alpha, beta):
    g = BetaPrior(alpha, beta)
    return g.mean, g.variance


def _beta_from_moments(mean, variance):
    g = BetaPrior.from_moments(mean, variance)
    return g.alpha, g.beta, g.mean, g.variance


def _gaussian_sample(mean, sigma_theta, sigma_x, n_clients, n, rng):
    s = GaussianPopulation(mean, sigma_theta, sigma_x).sample(n_clients, n, rng=rng)
    return s.theta, s.data.values, s.data.offsets


def _gaussian_sufficient(mean, sigma_theta, sigma_x, n_clients, n, rng):
    return GaussianPopulation(mean, sigma_theta, sigma_x).sample_sufficient(n_clients, n,
                                                                            rng=rng)


def _beta_sample(alpha, beta, n_clients, n, rng):
    s = BetaBernoulliPopulation(alpha, beta).sample(n_clients, n, rng=rng)
    return s.theta, s.data.values, s.data.offsets


def _npmle_methods(x, threshold, t):
    fit = npmle_normal(x, 1.0, n_grid=10)
    return fit.support(threshold), fit.prior_cdf(t)


def _ragged_item(values, counts, i):
    return Ragged.from_counts(values, counts)[i]


ESTIMATION = [
    Case("BetaPrior", _beta_prior, lambda: dict(alpha=2.0, beta=3.0),
         scalars={"alpha": "positive", "beta": "positive"}),
    Case("BetaPrior.from_moments", _beta_from_moments, lambda: dict(mean=0.25, variance=0.0625),
         scalars={"mean": "open_unit"},
         bad=(("variance", 0.2, ValueError), ("variance", 0.0, ValueError),
              ("variance", "0.1", TypeError), ("variance", NAN, ValueError),
              ("variance", 1 + 1j, TypeError)),
         extreme=(("variance", 1e-320), ("mean", 1e-300))),
    Case("NormalPrior", NormalPrior, lambda: dict(mean=np.array([0.5, -1.25]), sd=0.5),
         real=("mean",), scalars={"sd": "nonnegative"},
         bad=(("mean", np.zeros((2, 2)), ValueError),)),
    Case("discrete_posterior", discrete_posterior,
         lambda: dict(x=np.array([-1.25, 0.25, 2.75]), s=np.array([0.5, 1.0, 0.5]),
                      atoms=np.array([-1.0, 0.0, 3.0]), probs=np.array([0.25, 0.5, 0.25])),
         real=("x", "s", "atoms", "probs"),
         bad=(("s", np.array([0.5, 1.0]), ValueError), ("s", 0.0, ValueError),
              ("s", 1e-200, ValueError), ("x", np.array([1e200, 0.0, 0.0]), ValueError),
              ("atoms", np.array([-1.0, 0.0, 1e200]), ValueError),
              ("probs", np.array([0.5, 0.5]), ValueError),
              ("probs", np.array([0.5, 0.75, -0.25]), ValueError),
              ("probs", np.array([0.25, 0.25, 0.25]), ValueError),
              ("x", np.zeros((3, 2)), ValueError, "dimension"),
              ("x", np.zeros((3, 0)), ValueError), ("x", np.zeros(0), ValueError)),
         extreme=(("s", 1e-150), ("s", 1e150), ("x", np.array([1e150, -1e150, 0.0])))),
    Case("expected_posterior_variance", expected_posterior_variance,
         lambda: dict(atoms=np.array([-1.0, 1.0]), probs=np.array([0.25, 0.75]), sigma_x=1.0,
                      n=4, n_samples=50, rng=0),
         real=("atoms", "probs"),
         scalars={"sigma_x": "positive", "n": "size", "n_samples": "size", "rng": "rng"},
         bad=(("n_samples", 1, ValueError),)),
    Case("lemma1_radius", lemma1_radius, lambda: dict(d=2, sigma_x=1.0, n=10, m=100, r=2.0),
         scalars={"d": "size", "sigma_x": "positive", "n": "size", "m": "size",
                  "r": "nonnegative"}),
    Case("discrete_mixture_eb", discrete_mixture_eb,
         lambda: dict(xbar=np.array([-2.0, -1.75, 0.25, 0.5, 2.0, 2.25]), n=4, sigma_x=1.0,
                      n_atoms=2, n_iter=2, cluster=_halves, rng=0),
         real=("xbar",),
         scalars={"sigma_x": "positive", "n": "size", "n_atoms": "size", "n_iter": "count",
                  "rng": "rng", "cluster": "callable"},
         bad=(("n_atoms", 7, ValueError), ("n", np.array([4, 4]), ValueError),
              ("n", np.array([4, 4, 4, 4, 4, 0]), ValueError),
              ("n", np.array([4.5] * 6), ValueError), ("xbar", np.full(6, 1e200), ValueError),
              ("mechanism", "gaussian", TypeError),
              ("mechanism", StochasticQuantizer(4, 3.0), ValueError, "radius"),
              ("mechanism", GaussianMechanism(1.0, 1e-5, 3.0, d=2, calibration="l2"),
               ValueError),
              ("radius", 3.0, ValueError), ("radius", -1.0, ValueError, "radius"),
              ("delta_total", 1e-5, ValueError),
              ("cluster", _bad_cluster_shape, ValueError),
              ("cluster", _bad_cluster_labels, ValueError),
              ("cluster", lambda points, k, rng: None, TypeError)),
         extreme=(("sigma_x", 1e-150), ("n", 10**18))),
    Case("discrete_mixture_eb-private", discrete_mixture_eb,
         lambda: dict(xbar=np.array([-2.0, -1.75, 0.25, 0.5, 2.0, 2.25]), n=4, sigma_x=1.0,
                      n_atoms=2, n_iter=2, cluster=_halves, rng=0,
                      mechanism=GaussianMechanism(1.0, 1e-5, 3.0), radius=3.0,
                      delta_total=1e-4),
         scalars={"radius": "positive", "delta_total": "open_unit"},
         result=lambda fit: (fit.estimate, fit.privacy)),
    Case("discrete_mixture_eb-kmeans", discrete_mixture_eb,
         lambda: dict(xbar=np.array([[-2.0, 1.0], [-1.75, 1.25], [2.0, 0.0], [2.25, 0.25]]),
                      n=np.array([4, 4, 2, 2]), sigma_x=1.0, n_atoms=2, n_iter=1, rng=0),
         real=("xbar",), counts=("n",)),
    Case("npmle_normal", npmle_normal,
         lambda: dict(x=np.array([-1.5, -1.0, 0.25, 1.75, 2.0]), s=np.array([1.0, 0.5, 1.0,
                                                                           0.5, 1.0]),
                      n_grid=12),
         real=("x", "s"),
         scalars={"n_grid": "size", "tol": "positive", "max_iter": "count"},
         bad=(("s", 1e-200, ValueError), ("s", np.ones(4), ValueError),
              ("x", np.full(5, 1e200), ValueError), ("grid", np.zeros((2, 2)), ValueError),
              ("grid", "0.5", TypeError), ("grid", np.array([0.0, NAN]), ValueError),
              ("bins", 1, ValueError), ("bins", 2.5, TypeError),
              ("grid", np.array([1.0, -1.0, 0.0]), ValueError, "grid.*increasing"),
              ("grid", np.array([-1.0, 0.0, 0.0, 1.0]), ValueError, "grid.*increasing"),
              ("n_grid", 10**12, ValueError, "n_grid"),
              ("s", np.array([1.0, 0.0, 1.0, 0.5, 1.0]), ValueError, "s must be > 0"),
              ("s", -1.0, ValueError, "s must be > 0")),
         extreme=(("x", np.array([-1e150, 0.0, 1e150, 3.0, 1.0])),)),
    Case("npmle_normal-bins", npmle_normal,
         lambda: dict(x=np.array([-1.5, -1.0, 0.25, 1.75, 2.0]), s=0.5, n_grid=12, bins=3),
         bad=(("bins", 10**12, ValueError, "bins"),)),
    Case("npmle_normal-grid", npmle_normal,
         lambda: dict(x=np.array([-1.5, -1.0, 0.25, 1.75]), s=1.0,
                      grid=np.array([-2.0, -1.0, 0.0, 1.0, 2.0])),
         real=("grid",)),
    Case("npmle_binomial", npmle_binomial,
         lambda: dict(successes=np.array([0, 3, 5, 2]), trials=np.array([5, 5, 6, 4]),
                      n_grid=12),
         counts=("successes", "trials"),
         scalars={"n_grid": "size", "tol": "positive", "max_iter": "count"},
         bad=(("successes", np.array([6, 3, 5, 2]), ValueError),
              ("trials", np.array([5, 5, 6]), ValueError),
              ("trials", np.array([5, 5, 6, 2**64 - 1], np.uint64), ValueError),
              ("successes", np.array([0, 3, 5, -2]), ValueError),
              ("grid", np.array([0.5, 1.5]), ValueError),
              ("grid", np.array([0.5, 0.25, 1.0]), ValueError, "grid.*increasing"),
              ("n_grid", 10**12, ValueError, "n_grid")),
         extreme=(("trials", np.array([5, 5, 6, 10**15])),)),
    Case("NPMLEResult.support/prior_cdf", _npmle_methods,
         lambda: dict(x=np.array([-1.0, 0.5, 2.0]), threshold=1e-3, t=np.array([0.0, 1.5])),
         real=("t",), scalars={"threshold": "positive"}),
    Case("GaussianPopulation.sample", _gaussian_sample,
         lambda: dict(mean=np.array([0.5, -1.0]), sigma_theta=0.5, sigma_x=1.0, n_clients=3,
                      n=np.array([2, 1, 3]), rng=0),
         real=("mean",), counts=("n",),
         scalars={"sigma_theta": "nonnegative", "sigma_x": "positive", "n_clients": "size",
                  "rng": "rng"},
         bad=(("n", np.array([2, 0, 3]), ValueError), ("n", np.array([2, 1]), ValueError),
              ("n", 0, ValueError), ("n", 2.5, TypeError), ("mean", np.zeros((2, 2)),
                                                               ValueError)),
         extreme=(("mean", np.array([1e300, -1e300])), ("mean", np.array([1e308, 0.0])))),
    Case("GaussianPopulation.sample_sufficient", _gaussian_sufficient,
         lambda: dict(mean=0.5, sigma_theta=0.5, sigma_x=1.0, n_clients=3, n=4, rng=0),
         scalars={"sigma_theta": "nonnegative", "sigma_x": "positive", "n_clients": "size",
                  "n": "size", "rng": "rng"}),
    Case("BetaBernoulliPopulation.sample", _beta_sample,
         lambda: dict(alpha=2.0, beta=0.5, n_clients=3, n=np.array([2, 1, 3]), rng=0),
         counts=("n",),
         scalars={"alpha": "positive", "beta": "positive", "n_clients": "size", "rng": "rng"}),
    Case("Ragged", Ragged,
         lambda: dict(values=np.array([0.5, 1.0, -2.0, 0.25]), offsets=np.array([0, 3, 4])),
         containers=("values",), counts=("offsets",),
         bad=(("values", np.zeros((4, 1, 1)), ValueError),
              ("offsets", np.array([1, 3, 4]), ValueError),
              ("offsets", np.array([0, 3, 2, 4]), ValueError),
              ("offsets", np.array([0.0, 3.0, 4.0]), TypeError))),
    Case("Ragged.from_counts", Ragged.from_counts,
         lambda: dict(values=np.array([0.5, 1.0, -2.0, 0.25]), counts=np.array([3, 1])),
         containers=("values",), counts=("counts",),
         bad=(("counts", np.array([3, 2]), ValueError), ("counts", np.array([5, -1]),
                                                         ValueError))),
    Case("Ragged.from_lists", Ragged.from_lists,
         lambda: dict(clients=[np.array([0.5, 1.0]), np.array([-2.0])]),
         bad=(("clients", "ab", TypeError), ("clients", [], ValueError),
              ("clients", [[1 + 1j], [0.5]], TypeError),
              ("clients", [np.zeros((2, 2)), np.zeros(3)], ValueError),
              ("clients", 3, TypeError))),
    Case("Ragged.__getitem__", _ragged_item,
         lambda: dict(values=np.array([0.5, 1.0, -2.0]), counts=np.array([2, 1]), i=-1),
         bad=(("i", 2, IndexError, "client 2"), ("i", 0.5, TypeError),
              ("i", slice(0, 1), TypeError))),
]

table_tests(ESTIMATION, "estimation", globals())


def test_extreme_beta_shapes_have_their_exact_moments():
    big = BetaPrior(1e308, 1e308)
    assert big.mean == 0.5 and big.variance == 0.0  # true value 1.25e-309: below double range
    tiny = BetaPrior(5e-324, 5e-324)
    assert tiny.mean == 0.5 and tiny.variance == 0.25  # the limit of a symmetric Beta


def test_discrete_posterior_with_far_atoms_puts_all_mass_on_the_nearest():
    # |x - mu|^2 / (2 s^2) overflows for every atom; the exact posterior is a
    # point mass on the nearest atom (the others are ~1e306 nats less likely).
    post = discrete_posterior([1e5, -3.0, 1e149], 1e-150, [0.0, 1.0, -1.0], [0.25, 0.5, 0.25])
    np.testing.assert_array_equal(post.mean, [1.0, -1.0, 1.0])
    np.testing.assert_array_equal(post.var, [0.0, 0.0, 0.0])


def test_npmle_refuses_a_grid_out_of_reach_of_the_data_by_name():
    # (x - u)^2 / s^2 would overflow for every grid point u: the likelihood is 0.
    with pytest.raises(ValueError, match=r"x\[0\].*grid"):
        npmle_normal([0.0, 1.0], 1e-20, grid=[1e140, 2e140])


def test_lemma1_radius_scales_linearly_in_sigma_x_without_overflow():
    base = lemma1_radius(3, 1.0, 10, 100, 0.0)
    assert lemma1_radius(3, 1e200, 10, 100, 0.0) == pytest.approx(1e200 * base, rel=1e-14)


def test_valid_gaussian_population_with_huge_mean_is_finite():
    theta, values, _ = _gaussian_sample(np.array([1e300]), 1e300, 1e300, 3, 2, 0)
    assert np.all(np.isfinite(theta)) and np.all(np.isfinite(values))


# ------------------------------------- estimation: Gaussian, Beta-binomial, mixtures

def _x1():
    return np.array([-1.5, -0.25, 0.5, 1.75, 2.0])


def _s1():
    return np.array([0.5, 1.0, 0.5, 0.25, 1.0])


def _x2():
    return np.array([[-1.5, 0.5], [-0.25, 1.0], [0.5, -0.75], [1.75, 0.25], [2.0, -1.0]])


#: Refusals shared by every gaussian_eb call (x of shape (5,) or (5, 2), s of shape (5,)).
_GAUSSIAN_EB_BAD = (
    ("method", "ml", ValueError), ("method", ["mle"], TypeError), ("method", None, ValueError),
    ("s", np.ones(4), ValueError), ("s", np.ones((5, 2)), ValueError), ("s", 0.0, ValueError),
    ("s", -0.5, ValueError), ("s", 1e-200, ValueError), ("s", 1e200, ValueError),
    ("x", np.full(5, 1e200), ValueError), ("x", np.zeros((5, 2, 1)), ValueError),
    ("x", np.zeros(0), ValueError), ("prior_mean", np.zeros(3), ValueError),
    ("prior_mean", np.zeros((1, 1)), ValueError), ("prior_mean", NAN, ValueError),
    ("prior_mean", 1e200, ValueError), ("prior_mean", "0.5", TypeError),
    ("prior_mean", 1 + 1j, TypeError), ("prior_sd", np.array([0.5]), TypeError),
    ("prior_sd", 1e200, ValueError), ("extra", 1.0, TypeError),
)
#: Extreme but legal data: x (of shape (5,)) and s at the ends of their documented ranges.
_GAUSSIAN_EB_EXTREME = (
    ("x", np.array([1e150, -1e150, 0.0, 1e150, -1e150])),
    ("x", np.array([1e150, 1e150, 1e150, 1e150, 1e150])),
    ("s", np.array([1e-150, 1e150, 1.0, 1e-150, 1e150])), ("s", 1e-150), ("s", 1e150),
)


def _extremes_2d(extremes):
    """The same extremes for x of shape (5, 2) (its second column reversed)."""
    return tuple((a, np.stack([v, v[::-1]], axis=1) if a == "x" else v) for a, v in extremes)


_ONE_SAMPLE_EACH = Ragged(np.array([0.5, 1.0]), np.array([0, 1, 2]))
_EMPTY_CLIENT = Ragged(np.array([0.5, 0.5, 1.0]), np.array([0, 3, 3]))


def _gaussian_eb_case(label, x, **kw):
    def make():
        return dict(x=x(), s=_s1(), **{k: (v() if callable(v) else v) for k, v in kw.items()})

    real = ("x", "s") + (("prior_mean",) if "prior_mean" in kw else ())
    scalars = {"prior_sd": "nonnegative"} if "prior_sd" in kw else {}
    extreme = _GAUSSIAN_EB_EXTREME if x is _x1 else _extremes_2d(_GAUSSIAN_EB_EXTREME)
    return Case(f"gaussian_eb-{label}", gaussian_eb, make, real=real, scalars=scalars,
                bad=_GAUSSIAN_EB_BAD, extreme=extreme)


def _samples(values, counts, **kw):
    """gaussian_eb_samples on Ragged.from_counts(values, counts) (dtype variants of the data)."""
    return gaussian_eb_samples(Ragged.from_counts(values, counts), **kw)


def _sample_values():
    return np.array([-1.5, -1.0, 0.25, 0.5, 1.75, 2.0, 1.25])


def _bernoulli(values, counts, **kw):
    return beta_bernoulli_eb(Ragged.from_counts(values, counts), **kw)


def _bernoulli_values():
    return np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])


def _bits_counts():
    return np.array([3, 3, 2, 4])


def _counts_of(values, counts):
    return bernoulli_counts(Ragged.from_counts(values, counts))


def _z():
    return np.array([0, 3, 5, 2, 4, 6])


def _n():
    return np.array([5, 5, 6, 4, 6, 8])


_COUNTS_BAD = (
    ("successes", np.array([6, 3, 5, 2, 4, 6]), ValueError),
    ("successes", np.array([0, 3, 5, 2, 4]), ValueError),
    ("successes", np.array([0, 3, 5, 2, 4, -1]), ValueError),
    ("trials", np.array([5, 5, 6, 4, 6, 0]), ValueError),
    ("trials", np.array([5, 5, 6, 4, 6, 2**64 - 1], np.uint64), ValueError),
    ("trials", np.zeros((6, 1), int), ValueError),
)
_BETA_EB_BAD = _COUNTS_BAD + (
    ("method", "loo", ValueError), ("method", ("mle",), ValueError),
    ("method", ["mle"], TypeError), ("prior", (2.0, 3.0), TypeError),
    ("prior", NormalPrior(0.5, 0.25), TypeError), ("fix_prior", "no", TypeError),
)


def _beta_eb_result(res):
    """The fit with its documented sentinels replaced by -1, so all else is checked finite.

    posterior alpha_i = beta_i = inf marks a point mass (leave-one-out weight 0), and the
    log-likelihood is NaN when the moments define no prior (``prior`` None).
    """
    post = res.posterior
    return (res.method, res.prior, np.where(np.isinf(post.alpha), -1.0, post.alpha),
            np.where(np.isinf(post.beta), -1.0, post.beta), post.mean, post.var,
            res.shrinkage, res.centre, -1.0 if res.prior is None else res.log_likelihood,
            res.n_clipped, res.diagnostics)


def _beta_eb_case(method, label=None, **kw):
    return Case(f"beta_binomial_eb-{label or method}", beta_binomial_eb,
                lambda: dict(successes=_z(), trials=_n(), method=method, **kw),
                counts=("successes", "trials"), bad=_BETA_EB_BAD, result=_beta_eb_result,
                extreme=(("trials", np.array([5, 5, 6, 4, 6, 10**15])),
                         ("successes", np.array([0, 0, 0, 0, 0, 0])),
                         ("successes", _n())))


def _gm_prior(weights, means, sds):
    g = GaussianMixturePrior(weights, means, sds)
    return g.weights, g.means, g.sds, g.n_components, g.dim


def _gm_prior_methods(theta, size, rng):
    g = GaussianMixturePrior([0.25, 0.75], [-1.0, 1.5], [0.5, 0.25])
    return g.logpdf(theta), g.sample(size, rng)


def _mixture_prior(dim=1):
    if dim == 1:
        return GaussianMixturePrior(np.array([0.25, 0.75]), np.array([-1.0, 1.5]),
                                    np.array([0.5, 0.0]))
    return GaussianMixturePrior(np.array([0.5, 0.5]), np.array([[-1.0, 0.5], [1.5, -0.5]]),
                                np.array([0.25, 0.5]))


_MIXTURE_BAD = (
    ("s", np.ones(4), ValueError), ("s", 1e-200, ValueError), ("s", 0.0, ValueError),
    ("x", np.full(5, 1e200), ValueError), ("x", np.zeros((5, 0)), ValueError),
    ("x", np.zeros((5, 2, 1)), ValueError),
)

GAUSSIAN_AND_BETA = [
    *[_gaussian_eb_case(method, _x1, method=method) for method in GAUSSIAN_METHODS],
    *[_gaussian_eb_case(f"{method}-prior_mean", _x1, method=method, prior_mean=0.25)
      for method in GAUSSIAN_METHODS],
    *[_gaussian_eb_case(f"{method}-2d", _x2, method=method) for method in GAUSSIAN_METHODS],
    *[_gaussian_eb_case(f"{method}-2d-prior_mean", _x2, method=method,
                        prior_mean=lambda: np.array([0.25, -0.5])) for method in GAUSSIAN_METHODS],
    *[_gaussian_eb_case(f"{method}-prior_sd", _x1, method=method, prior_sd=0.75)
      for method in GAUSSIAN_METHODS],
    _gaussian_eb_case("known-2d", _x2, method="dl", prior_mean=lambda: np.array([0.25, -0.5]),
                      prior_sd=0.75),
    Case("gaussian_eb_samples", gaussian_eb_samples,
         lambda: dict(data=Ragged.from_counts(_sample_values(), np.array([2, 3, 2]))),
         scalars={"sigma_x": "positive"},
         bad=(("data", "ab", TypeError), ("data", _sample_values(), TypeError),
              ("data", Ragged(np.array([0.5, NAN, 1.0]), np.array([0, 2, 3])), ValueError),
              ("data", Ragged(np.array([0.5, INF, 1.0]), np.array([0, 2, 3])), ValueError),
              ("data", _ONE_SAMPLE_EACH, ValueError), ("data", _EMPTY_CLIENT, ValueError),
              ("method", "mom", ValueError), ("prior_sd", -1.0, ValueError),
              ("prior_mean", np.zeros(2), ValueError))),
    Case("gaussian_eb_samples-sigma_x", _samples,
         lambda: dict(values=_sample_values(), counts=np.array([2, 3, 2]), sigma_x=0.5,
                      method="reml"),
         real=("values",), counts=("counts",), scalars={"sigma_x": "positive"}),
    Case("gaussian_eb_samples-2d", _samples,
         lambda: dict(values=_quarters((7, 2), 7), counts=np.array([1, 4, 2]),
                      method="moments", prior_mean=np.array([0.25, 0.5])),
         real=("values",), counts=("counts",)),
    Case("personalized_gaussian", personalized_gaussian,
         lambda: dict(xbar=_x1(), n=np.array([4, 2, 4, 8, 2]), sigma_theta=0.5, sigma_x=1.0),
         real=("xbar",), counts=("n",),
         scalars={"sigma_theta": "nonnegative", "sigma_x": "positive",
                  "sigma_q": "nonnegative"},
         bad=(("n", np.array([4, 2, 4, 8]), ValueError), ("n", np.array([4, 2, 4, 8, 0]),
                                                          ValueError),
              ("n", 2.5, ValueError), ("n", 0, ValueError), ("n", "4", TypeError),
              ("xbar", np.zeros(1), ValueError), ("xbar", np.zeros((5, 2, 1)), ValueError),
              ("shared", np.zeros(4), ValueError), ("shared", "0.5", TypeError)),
         extreme=(("xbar", np.array([1e308, 1e308, -1e308, 0.0, 1e308])),
                  ("xbar", np.array([1e150, 1e150, -1e150, 0.0, 1e150])),
                  ("n", np.array([1, 1, 10**18, 1, 1])))),
    Case("personalized_gaussian-2d-shared", personalized_gaussian,
         lambda: dict(xbar=_x2(), n=4, sigma_theta=0.5, sigma_x=1.0, shared=_quarters((5, 2), 8),
                      sigma_q=0.25),
         real=("xbar", "shared"),
         bad=(("shared", np.zeros((5, 3)), ValueError), ("shared", np.zeros(5), ValueError)),
         extreme=(("shared", np.full((5, 2), 1e308)), ("n", 10**18))),
    *[_beta_eb_case(method) for method in BETA_METHODS],
    _beta_eb_case("mle", "mle-prior", prior=BetaPrior(2.0, 3.0)),
    Case("beta_binomial_eb-fix_prior", beta_binomial_eb,
         lambda: dict(successes=_z(), trials=_n(), prior=BetaPrior(2.0, 3.0), fix_prior=True),
         counts=("successes", "trials"), scalars={"fix_prior": "bool"},
         bad=_COUNTS_BAD + (("prior", None, ValueError, "fix_prior"),
                            ("prior", (2.0, 3.0), TypeError)),
         extreme=(("trials", np.array([5, 5, 6, 4, 6, 10**15])),)),
    Case("beta_bernoulli_eb", _bernoulli,
         lambda: dict(values=_bernoulli_values(), counts=_bits_counts()),
         real=("values",), counts=("counts",),
         bad=(("values", np.full(12, 0.5), ValueError), ("values", np.full(12, 2.0), ValueError),
              ("values", np.zeros((12, 2)), ValueError), ("method", "x", ValueError))),
    Case("beta_bernoulli_eb-data", beta_bernoulli_eb,
         lambda: dict(data=Ragged.from_counts(_bernoulli_values(), _bits_counts()),
                      method="loo_proof"),
         bad=(("data", "ab", TypeError), ("data", _bernoulli_values(), TypeError),
              ("data", Ragged(np.array([1, 0, 1]), np.array([0, 2, 2, 3])), ValueError),
              ("prior", 3, TypeError), ("fix_prior", 1, TypeError))),
    Case("bernoulli_counts", _counts_of,
         lambda: dict(values=_bernoulli_values(), counts=_bits_counts()),
         real=("values",), counts=("counts",)),
    Case("bernoulli_counts-data", bernoulli_counts,
         lambda: dict(data=Ragged.from_counts(np.array([True, False, True]), np.array([2, 1]))),
         bad=(("data", [1, 0], TypeError),
              ("data", Ragged(np.array([1, 0, 1]), np.array([0, 0, 3])), ValueError),
              ("data", Ragged(np.array([1.0, NAN]), np.array([0, 1, 2])), ValueError),
              ("data", Ragged(np.zeros((2, 2)), np.array([0, 1, 2])), ValueError),
              ("data", Ragged(np.array([1, 2]), np.array([0, 1, 2])), ValueError))),
    Case("GaussianMixturePrior", _gm_prior,
         lambda: dict(weights=np.array([0.25, 0.75]), means=np.array([-1.0, 1.5]),
                      sds=np.array([0.5, 0.0])),
         real=("weights", "means", "sds"),
         bad=(("weights", np.array([0.25, 0.5]), ValueError),
              ("weights", np.array([1.25, -0.25]), ValueError),
              ("weights", np.array([0.25, 0.25, 0.5]), ValueError),
              ("sds", np.array([0.5, -0.25]), ValueError), ("sds", np.array([0.5, 1e200]),
                                                            ValueError),
              ("sds", np.zeros((2, 1)), ValueError),
              ("means", np.array([0.0, 1e200]), ValueError),
              ("means", np.zeros((2, 1, 1)), ValueError), ("means", np.zeros((2, 0)),
                                                           ValueError)),
         extreme=(("means", np.array([-1e150, 1e150])), ("sds", np.array([1e150, 0.0])),
                  ("weights", np.array([1.0, 0.0])))),
    Case("GaussianMixturePrior.logpdf/sample", _gm_prior_methods,
         lambda: dict(theta=np.array([-1.0, 0.25, 2.0]), size=3, rng=0),
         real=("theta",), scalars={"rng": "rng"},
         bad=(("theta", np.zeros((3, 2)), ValueError), ("theta", np.zeros((3, 1, 1)),
                                                        ValueError),
              ("size", -1, ValueError), ("size", 2.5, TypeError), ("size", "3", TypeError),
              ("size", True, TypeError), ("size", 10**30, ValueError)),
         extreme=(("theta", np.array([1e150, -1e150])), ("theta", np.array([1e308])),
                  ("size", 0))),
    Case("GaussianMixturePrior.logpdf-tiny-sd", lambda theta: GaussianMixturePrior(
        [0.5, 0.5], [0.0, 1.0], [1e-200, 1e150]).logpdf(theta),
         lambda: dict(theta=np.array([0.0, 0.5, 1.0])), real=("theta",),
         extreme=(("theta", np.array([1e-200, -1e-200, 1e150])),)),
    Case("gaussian_mixture_posterior", gaussian_mixture_posterior,
         lambda: dict(x=_x1(), s=_s1(), prior=_mixture_prior()),
         real=("x", "s"),
         bad=_MIXTURE_BAD + (("prior", "g", TypeError), ("prior", _mixture_prior(2), ValueError),
                             ("prior", NormalPrior(0.0, 1.0), TypeError)),
         extreme=_GAUSSIAN_EB_EXTREME),
    Case("gaussian_mixture_posterior-2d", gaussian_mixture_posterior,
         lambda: dict(x=_x2(), s=0.5, prior=_mixture_prior(2)),
         real=("x",), bad=(("prior", _mixture_prior(), ValueError),),
         extreme=_extremes_2d(_GAUSSIAN_EB_EXTREME)),
    Case("gaussian_mixture_eb", gaussian_mixture_eb,
         lambda: dict(x=_x1(), s=_s1(), n_components=2, rng=0, n_init=2, max_iter=20,
                      init="random"),
         real=("x", "s"),
         scalars={"n_components": "size", "rng": "rng", "n_init": "count", "max_iter": "count",
                  "tol": "nonnegative", "min_sd": "nonnegative"},
         bad=_MIXTURE_BAD + (("n_components", 6, ValueError), ("init", "kmeans++", ValueError),
                             ("init", ["random"], TypeError), ("init", 3, TypeError),
                             ("init", _mixture_prior(2), ValueError),
                             ("init", GaussianMixturePrior([1.0], [0.0], [1.0]), ValueError),
                             ("min_sd", 1e200, ValueError)),
         extreme=_GAUSSIAN_EB_EXTREME),
    Case("gaussian_mixture_eb-kmeans-2d", gaussian_mixture_eb,
         lambda: dict(x=_x2(), s=_s1(), n_components=2, rng=0, n_init=1, max_iter=10,
                      min_sd=0.25),
         real=("x", "s")),
    Case("gaussian_mixture_eb-prior", gaussian_mixture_eb,
         lambda: dict(x=_x1(), s=0.5, n_components=2, max_iter=10, init=_mixture_prior()),
         real=("x",)),
]

table_tests(GAUSSIAN_AND_BETA, "gaussian_beta", globals())


# ------------------------------------------------------------------ privacy

def _mechanism_call(method):
    def call(mechanism, **kw):
        return getattr(mechanism, method)(**kw)

    return call


def _quantizer(k_bits, b):
    q = StochasticQuantizer(k_bits, b)
    return q.step, q.max_variance, q.levels


def _gaussian_mechanism(**kw):
    g = GaussianMechanism(**kw)
    return g.sigma, g.true_delta, g.privacy, g.max_variance


def _laplace(**kw):
    mech = LaplaceMechanism(**kw)
    return mech.scale, mech.max_variance, mech.privacy


def _rr(cls):
    def call(epsilon):
        mech = cls(epsilon)
        return mech.outputs, mech.max_variance, mech.flip_probability, mech.privacy

    return call


#: The clipping mechanisms on [-1.5, 1.5]; x holds values inside and outside.
_CLIPPING = {
    "StochasticQuantizer": lambda: StochasticQuantizer(3, 1.5),
    "GaussianMechanism": lambda: GaussianMechanism(1.0, 1e-5, 1.5, d=2, calibration="l2"),
    "LaplaceMechanism": lambda: LaplaceMechanism(2.0, 1.5, d=2),
}
#: Two-valued mechanisms and an input each takes.
_BITS = {
    "RandomizedResponse": (lambda: RandomizedResponse(1.0),
                           lambda: np.array([0.0, 1.0, 1.0, 0.0])),
    "BinaryMechanism": (lambda: BinaryMechanism(1.0), lambda: np.array([0.25, 1.0, 0.0, 0.5])),
}


def _clipping_cases():
    cases = []
    for name, mech in _CLIPPING.items():
        for method in ("privatize", "variance", "n_clipped"):
            def make(mech=mech, method=method):
                kw = dict(mechanism=mech(), x=_quarters((3, 2), 9) * 1.5)
                return {**kw, "rng": 0} if method == "privatize" else kw

            cases.append(Case(f"{name}.{method}", _mechanism_call(method), make, real=("x",),
                              scalars={"rng": "rng"} if method == "privatize" else {},
                              bad=(("x", np.zeros((2, 2, 2)), ValueError),),
                              extreme=(("x", np.array([1e308, -1e308, 0.0])),
                                       ("x", np.array([5e-324, -5e-324])))))
    return cases


def _excess_cases():
    """square_variance_excess of every mechanism that bounds it."""
    mechanisms = {**{k: v for k, v in _CLIPPING.items()},
                  **{k: v[0] for k, v in _BITS.items()}}
    return [Case(f"{name}.square_variance_excess", _mechanism_call("square_variance_excess"),
                 lambda mech=mech: dict(mechanism=mech(), input_variance=np.array([0.0, 0.25])),
                 real=("input_variance",),
                 bad=(("input_variance", -0.25, ValueError),),
                 # a bound beyond float64 is +inf by design (the estimators read it as
                 # "the noise swamps the data"), so only variances whose bound is finite
                 extreme=(("input_variance", 1e100), ("input_variance", 5e-324)))
            for name, mech in mechanisms.items()]


def _bit_cases():
    cases = []
    for name, (mech, bits) in _BITS.items():
        for method in ("privatize", "variance", "prob_high"):
            def make(mech=mech, bits=bits, method=method):
                kw = dict(mechanism=mech(), x=bits())
                return {**kw, "rng": 0} if method == "privatize" else kw

            cases.append(Case(f"{name}.{method}", _mechanism_call(method), make, real=("x",),
                              scalars={"rng": "rng"} if method == "privatize" else {},
                              bad=(("x", np.zeros((2, 2)), ValueError),
                                   ("x", np.array([0.0, 1.5]), ValueError),
                                   ("x", np.array([0.0, -0.5]), ValueError))))
        for method in ("likelihood_ratio_bound", "log_likelihood_ratio_bound"):
            cases.append(Case(
                f"{name}.{method}", _mechanism_call(method),
                lambda mech=mech, bits=bits: dict(mechanism=mech(), x=bits(),
                                                  x_other=bits()[::-1].copy()),
                real=("x", "x_other"),
                bad=(("x_other", np.zeros(3), ValueError), ("x", np.array([0.0, 2.0, 1.0, 0.0]),
                                                            ValueError))))
    return cases


def _private_gaussian_case(label, **kw):
    def make():
        out = dict(xbar=_x1(), n=np.array([4, 2, 4, 8, 2]), sigma_x=1.0, rng=0)
        return {**out, **{k: (v() if callable(v) else v) for k, v in kw.items()}}

    scalars = {"sigma_x": "positive", "rng": "rng"}
    scalars.update({"sigma_theta": "nonnegative"} if "sigma_theta" in kw
                   else {"ucb_z": "nonnegative"})
    return Case(f"private_gaussian-{label}", private_gaussian, make, real=("xbar",),
                counts=("n",), scalars=scalars,
                bad=(("mechanism", "quantizer", TypeError),
                     ("mechanism", StochasticQuantizer, TypeError),
                     ("xbar", np.zeros(1), ValueError), ("xbar", np.zeros((5, 2, 1)), ValueError),
                     ("xbar", np.full(5, 1e200), ValueError),
                     ("n", np.array([4, 2, 4, 8]), ValueError), ("n", 0, ValueError),
                     ("n", np.array([4, 2, 4, 8, 0]), ValueError),
                     ("variance", "ucb2", ValueError), ("variance", ["ucb"], TypeError),
                     ("ucb_z", 41.0, ValueError), ("ucb_z", -1.0, ValueError),
                     ("ucb_z", "3", TypeError), ("sigma_theta", 1e200, ValueError),
                     ("sigma_x", 1e-200, ValueError)),
                extreme=(("xbar", np.array([1e150, -1e150, 0.0, 1e150, 1.0])),
                         ("n", np.array([1, 1, 10**18, 1, 1]))))


def _bernoulli_private_bad():
    return (("successes", np.array([6, 3, 5, 2, 4, 6]), ValueError),
            ("successes", np.array([0, 3]), ValueError),
            ("trials", np.array([5, 5, 6, 4, 6, 0]), ValueError),
            ("successes", np.array([0, 3]), ValueError, "successes and trials"),
            ("epsilon", 1e200, ValueError))


def _pb_extremes():
    return (("epsilon", 1e150), ("epsilon", 1e-150),
            ("trials", np.array([5, 5, 6, 4, 6, 10**15])))


def _accountant_run(n_clients, delta, epsilon, accountant="rdp",
                    sampling="without_replacement", trust="aggregator", orders=None,
                    value_discretization_interval=1e-4, **step):
    """DPAdaPeDAccountant: constructor, step, and every getter."""
    acc = DPAdaPeDAccountant(n_clients, sampling=sampling, trust=trust, accountant=accountant,
                             orders=orders,
                             value_discretization_interval=value_discretization_interval)
    assert acc.step(**step) is acc
    spent = acc.get_privacy_spent(delta)
    rdp = acc.get_rdp() if accountant == "rdp" else None
    return (spent, acc.get_epsilon(delta), acc.get_delta(epsilon), rdp, acc.n_rounds,
            acc.history, repr(acc.event))


_STEP = dict(n_sampled=2, sync_gap=10, clip_mu=1.0, noise_mu=2.0)
_STEP_KINDS = {"n_sampled": "size", "sync_gap": "size", "clip_mu": "positive",
               "noise_mu": "positive"}
_RUN = dict(n_clients=8, n_iterations=20, **_STEP)
_RUN_KINDS = {"n_clients": "size", "n_iterations": "size", **_STEP_KINDS}
_BLOCK_BAD = (("clip_psi", 1.0, ValueError), ("noise_psi", 1.0, ValueError),
              ("clip_mu", 1e60, ValueError), ("noise_mu", 1e-60, ValueError),
              ("n_sampled", 9, ValueError))
_ACCOUNTANT_BAD = (("sampling", "fixed", ValueError), ("sampling", ["poisson"], TypeError),
                   ("trust", "server", ValueError), ("accountant", "gdp", ValueError),
                   ("orders", np.array([1.0, 2.0]), ValueError),
                   ("orders", np.array([2.0, 1e7]), ValueError),
                   ("orders", "2.0", (TypeError, ValueError)),
                   ("orders", np.zeros((2, 2)) + 2, ValueError),
                   ("value_discretization_interval", 2.0, ValueError),
                   ("value_discretization_interval", 0.0, ValueError),
                   ("value_discretization_interval", "1e-4", TypeError))


def _orders():
    return np.array([2.0, 4.0, 8.0, 16.0])


def _rdp():
    return np.array([0.25, 0.5, 1.0, 2.0])


_RDP_BAD = (("orders", np.array([1.0, 2.0, 4.0, 8.0]), ValueError),
            ("orders", np.array([2.0, 4.0, 8.0, 2e6]), ValueError),
            ("orders", np.zeros((2, 2)) + 2.0, ValueError), ("orders", np.array([]), ValueError),
            ("rdp", np.array([0.25, 0.5, 1.0]), ValueError),
            ("rdp", np.array([0.25, 0.5, 1.0, -2.0]), ValueError),
            ("rdp", np.array([10**400] * 4, dtype=object), ValueError))
# rdp = +inf at every order (no guarantee) gives epsilon = +inf by design (see
# test_accounting's test_conversion_handles_infinite_rdp); rdp_to_delta gives 1 for it.
_RDP_EXTREME = (("rdp", np.array([INF, 0.5, 1.0, 2.0])), ("rdp", np.zeros(4)),
                ("rdp", np.full(4, 5e-324)), ("rdp", np.full(4, 1e-17)),
                ("rdp", np.full(4, 1e308)), ("orders", np.array([1.0 + 2**-52, 1e6, 2.0, 3.0])))

PRIVACY = [
    Case("StochasticQuantizer", _quantizer, lambda: dict(k_bits=3, b=1.5),
         scalars={"k_bits": "size", "b": "positive"},
         bad=(("k_bits", 53, ValueError), ("b", 1e200, ValueError)),
         extreme=(("b", 1e150), ("b", 1e-150), ("k_bits", 24))),
    Case("GaussianMechanism", _gaussian_mechanism,
         lambda: dict(epsilon=1.0, delta=1e-5, b=1.5, d=1),
         scalars={"epsilon": "positive", "delta": "open_unit", "b": "positive", "d": "size"},
         bad=(("calibration", "tight", ValueError), ("calibration", ["l2"], TypeError),
              ("epsilon", 1e200, ValueError), ("d", 2**60, ValueError))),
    Case("GaussianMechanism-l2", _gaussian_mechanism,
         lambda: dict(epsilon=1.0, delta=1e-5, b=1.5, d=4, calibration="l2"),
         scalars={"epsilon": "positive", "delta": "open_unit", "b": "positive", "d": "size"},
         extreme=(("epsilon", 1e150), ("epsilon", 1e-150), ("b", 1e150), ("b", 1e-150),
                  ("delta", 1e-300), ("delta", 1.0 - 2**-53), ("d", 2**53))),
    Case("LaplaceMechanism", _laplace, lambda: dict(epsilon=2.0, b=1.5, d=2),
         scalars={"epsilon": "positive", "b": "positive", "d": "size"},
         extreme=(("epsilon", 1e150), ("epsilon", 1e-150), ("b", 1e150), ("b", 1e-150),
                  ("d", 2**53))),
    Case("RandomizedResponse", _rr(RandomizedResponse), lambda: dict(epsilon=1.0),
         scalars={"epsilon": "positive"}, extreme=(("epsilon", 1e150), ("epsilon", 1e-150))),
    Case("BinaryMechanism", _rr(BinaryMechanism), lambda: dict(epsilon=1.0),
         scalars={"epsilon": "positive"}, extreme=(("epsilon", 1e150), ("epsilon", 1e-150))),
    *_clipping_cases(),
    *_bit_cases(),
    *_excess_cases(),
    Case("dp_adaped_noise_multiplier", dp_adaped_noise_multiplier,
         lambda: dict(clip_psi=0.5, noise_psi=4.0, **_STEP),
         scalars={"clip_psi": "positive", "noise_psi": "positive", **_STEP_KINDS},
         bad=(("trust", "server", ValueError), ("trust", ["local"], TypeError),
              ("clip_psi", None, ValueError), ("noise_mu", 1e60, ValueError)),
         extreme=(("clip_mu", 1e50), ("noise_mu", 1e-50), ("noise_psi", 1e50))),
    Case("paper_clip_range", paper_clip_range,
         lambda: dict(r=1.0, m=10, n=4, sigma_theta=0.5, sigma_x=1.0),
         scalars={"r": "nonnegative", "m": "count", "n": "count", "sigma_theta": "nonnegative",
                  "sigma_x": "positive"},
         bad=(("m", 1, ValueError),),
         extreme=(("m", 10**300), ("n", 10**300), ("m", 2**63))),
    Case("analytic_gaussian_delta", analytic_gaussian_delta,
         lambda: dict(epsilon=0.5, noise_multiplier=2.0),
         scalars={"epsilon": "positive", "noise_multiplier": "positive"}),
    _private_gaussian_case("given", mechanism=lambda: StochasticQuantizer(4, 3.0),
                           sigma_theta=0.5),
    _private_gaussian_case("ucb", mechanism=lambda: LaplaceMechanism(4.0, 3.0)),
    _private_gaussian_case("plugin", mechanism=lambda: StochasticQuantizer(2, 3.0),
                           variance="plugin"),
    Case("private_gaussian-2d", private_gaussian,
         lambda: dict(xbar=_x2(), n=4, sigma_x=1.0, rng=0,
                      mechanism=GaussianMechanism(1.0, 1e-5, 3.0, d=2, calibration="l2")),
         real=("xbar",),
         bad=(("mechanism", RandomizedResponse(1.0), ValueError, "xbar"),
              ("xbar", np.zeros((5, 0)), ValueError)),
         extreme=(("xbar", np.full((5, 2), 1e150)),)),
    Case("private_bernoulli_paper", private_bernoulli_paper,
         lambda: dict(successes=_z(), trials=_n(), epsilon=1.0, rng=0),
         counts=("successes", "trials"), scalars={"epsilon": "positive", "rng": "rng"},
         bad=_bernoulli_private_bad(), extreme=_pb_extremes()),
    *[Case(f"private_bernoulli_corrected-{rule}", private_bernoulli_corrected,
           lambda rule=rule: dict(successes=_z(), trials=_n(), epsilon=2.0, variance=rule,
                                  rng=0),
           counts=("successes", "trials"),
           scalars={"epsilon": "positive", "rng": "rng", "ucb_z": "nonnegative"},
           bad=_bernoulli_private_bad() + (
               ("variance", "upper", ValueError), ("variance", ["ucb"], TypeError),
               ("ucb_z", 41.0, ValueError), ("trials", np.ones(6, int), ValueError)),
           extreme=_pb_extremes()) for rule in ("ucb", "plugin")],
    Case("theorem7_rdp", theorem7_rdp, lambda: dict(orders=_orders(), **_RUN),
         real=("orders",), scalars=_RUN_KINDS,
         bad=_BLOCK_BAD + (("orders", np.array([1.0, 2.0]), ValueError),
                           ("orders", np.zeros((2, 2)) + 2.0, ValueError),
                           ("orders", np.array([2.0, 1e7]), ValueError),
                           ("n_iterations", 25, ValueError), ("n_sampled", 0, ValueError)),
         extreme=(("clip_mu", 1e50), ("noise_mu", 1e-50), ("orders", np.array([1e6])),
                  ("n_clients", 2**53), ("n_iterations", 10 * 2**49))),
    Case("theorem7_rdp-psi-scalar", theorem7_rdp,
         lambda: dict(orders=2.0, clip_psi=0.5, noise_psi=4.0, **_RUN),
         real=("orders",), scalars={"clip_psi": "positive", "noise_psi": "positive"},
         extreme=(("clip_psi", 1e50), ("noise_psi", 1e-50))),
    *[Case(f"rdp_to_epsilon-{conversion}", rdp_to_epsilon,
           lambda conversion=conversion: dict(orders=_orders(), rdp=_rdp(), delta=1e-5,
                                              conversion=conversion),
           real=("orders", "rdp"), scalars={"delta": "open_unit"},
           bad=_RDP_BAD + (("conversion", "lemma3", ValueError),
                           ("conversion", ["classic"], TypeError)),
           extreme=_RDP_EXTREME + (("delta", 5e-324), ("delta", 1.0 - 2**-53)))
      for conversion in ("improved", "classic")],
    Case("rdp_to_delta", rdp_to_delta,
         lambda: dict(orders=_orders(), rdp=_rdp(), epsilon=2.0),
         real=("orders", "rdp"), scalars={"epsilon": "positive"}, bad=_RDP_BAD,
         extreme=_RDP_EXTREME + (("rdp", np.full(4, INF)),)),
    Case("dp_adaped_epsilon", dp_adaped_epsilon,
         lambda: dict(delta=1e-5, orders=_orders(), **_RUN),
         real=("orders",), scalars={"delta": "open_unit", **_RUN_KINDS},
         bad=_BLOCK_BAD + _ACCOUNTANT_BAD + (("n_iterations", 25, ValueError),),
         extreme=(("clip_mu", 1e50), ("noise_mu", 1e-50), ("noise_mu", 1e50),
                  ("delta", 5e-324))),
    Case("dp_adaped_epsilon-pld", dp_adaped_epsilon,
         lambda: dict(delta=1e-5, sampling="poisson", accountant="pld",
                      value_discretization_interval=1e-2, **_RUN),
         scalars={"delta": "open_unit", "value_discretization_interval": "positive"},
         bad=(("sampling", "without_replacement", ValueError),
              ("noise_mu", 1e-3, ValueError, "noise"))),
    Case("DPAdaPeDAccountant", _accountant_run,
         lambda: dict(n_clients=8, delta=1e-5, epsilon=2.0, orders=_orders(), n_rounds=2,
                      **_STEP),
         real=("orders",),
         scalars={"n_clients": "size", "delta": "open_unit", "epsilon": "positive",
                  "n_rounds": "size", **_STEP_KINDS},
         bad=_BLOCK_BAD + _ACCOUNTANT_BAD,
         extreme=(("epsilon", 1e308), ("epsilon", 5e-324), ("n_rounds", 2**53),
                  ("noise_mu", 1e50))),
    Case("DPAdaPeDAccountant-pld-local", _accountant_run,
         lambda: dict(n_clients=8, delta=1e-5, epsilon=2.0, accountant="pld", trust="local",
                      value_discretization_interval=1e-2, n_rounds=2, **_STEP),
         scalars={"value_discretization_interval": "positive", "epsilon": "positive"},
         bad=(("noise_mu", 1e-4, ValueError, "noise"),)),
    Case("private_bernoulli_sweep", private_bernoulli_sweep,
         lambda: dict(epsilons=np.array([1.0, 4.0]), alpha=2.0, beta=2.0, n_clients=6, n=4,
                      rng=0),
         real=("epsilons",),
         scalars={"alpha": "positive", "beta": "positive", "n_clients": "size", "n": "size",
                  "rng": "rng"},
         bad=(("epsilons", np.zeros((2, 1)) + 1.0, ValueError), ("epsilons", [], ValueError),
              ("epsilons", [0.0], ValueError), ("epsilons", [1e200], ValueError),
              ("epsilons", 1.0, (TypeError, ValueError)), ("n_clients", 2, ValueError),
              ("n", 1, ValueError)),
         extreme=(("epsilons", np.array([1e150, 1e-150])),)),
]

table_tests(PRIVACY, "privacy", globals())


# ------------------------------------------------------------------- bounds

#: Valid value and kind of every argument of ebfl.bounds.
_BOUND_ARGS = {
    "m": (10, "size"), "n": (4, "size"), "d": (2, "size"), "k_bits": (3, "size"),
    "sigma_theta": (0.5, "nonnegative"), "sigma_x": (1.0, "positive"),
    "sigma_q": (0.25, "nonnegative"), "r": (1.0, "nonnegative"), "epsilon": (1.0, "positive"),
    "delta": (1e-5, "open_unit"), "alpha": (2.0, "positive"), "beta": (3.0, "positive"),
    "mean_a2": (0.25, "probability"), "mean_one_minus_a2": (0.5, "probability"),
}
#: Legal values at the ends of the documented ranges.
_BOUND_EXTREME = {
    "m": (2**53,), "n": (2**53,), "d": (2**53,), "k_bits": (2**53,),
    "sigma_theta": (1e-100, 1e100), "sigma_x": (1e-100, 1e100), "sigma_q": (1e-100, 1e100),
    "r": (1e100,), "epsilon": (1e150, 1e-150), "alpha": (1e300,), "beta": (1e300,),
    "delta": (5e-324, 1.0 - 2**-53), "mean_a2": (0.0, 1.0),
}


def _bound_case(func, label=None, **fixed):
    names = [p for p in inspect.signature(func).parameters if p not in fixed]
    return Case(label or func.__name__, func,
                lambda: {**{p: _BOUND_ARGS[p][0] for p in names}, **fixed},
                scalars={p: _BOUND_ARGS[p][1] for p in names},
                bad=tuple((p, v, ValueError) for p in names for v in
                          {"m": (1, 2**53 + 1), "n": (2**53 + 1,), "d": (2**53 + 1,),
                           "sigma_theta": (1e-101,), "sigma_x": (1e101,), "r": (1e101,),
                           "alpha": (1e301,), "epsilon": (1e151,)}.get(p, ())),
                extreme=tuple((p, v) for p in names for v in _BOUND_EXTREME.get(p, ())),
                result=lambda out: out.as_dict() if hasattr(out, "as_dict") else out)


BOUNDS = [_bound_case(getattr(bounds, name)) for name in bounds.__all__
          if inspect.isfunction(getattr(bounds, name))]

table_tests(BOUNDS, "bounds", globals())


def test_every_public_bound_is_in_the_table():
    functions = {n for n in bounds.__all__ if inspect.isfunction(getattr(bounds, n))}
    assert functions == {c.id for c in BOUNDS}


# ------------------------------------------------------- learning (numpy)

def _run(algorithm, data, **kw):
    res = run_federated(algorithm, data, 2, **kw)
    return res.theta


def _linear_gd(data, **kw):
    return _run(LinearGD(0.01, **kw), data)


def _linear_em(data, **kw):
    return _run(LinearEM(**kw), data)


def _logistic_gd(data, **kw):
    return _run(LogisticGD(0.05, **kw), data)


def _logistic_em(data, **kw):
    return _run(LogisticEM(**kw), data)


def _fedavg_linear(data, lr, local_steps):
    return _run(FedAvgLinear(lr, local_steps=local_steps), data)


def _fedavg_logistic(data, lr, local_steps, l2):
    return _run(FedAvgLogistic(lr, local_steps=local_steps, l2=l2), data)


def _dm_linear(data, k, sigma_x2, cluster):
    return _run(DiscreteMixtureLinear(k, sigma_x2, cluster=cluster), data)


def _gm_linear(data, k, lr, sigma_x2, min_var, cluster):
    return _run(GaussianMixtureLinear(k, lr, sigma_x2, min_var=min_var, cluster=cluster), data)


def _laplace(data, lr, sigma_x2, **kw):
    return _run(LaplaceLinear(lr, sigma_x2, **kw), data)


def _federated(algorithm, data, n_rounds, **kw):
    res = run_federated(algorithm, data, n_rounds, **kw)
    return res.theta, res.history


def _regression_data(X, Y, mask):
    return RegressionData(X, Y, mask)


def _subset_predict(clients, theta):
    data = _data()
    return data.subset(clients).X, data.predict(theta, clients)


class _NoRound:
    def init_server(self, run):
        return {}


LEARNING = [
    Case("RegressionData", _regression_data, lambda: dict(X=_X(), Y=_Y(), mask=np.ones((4, 3))),
         real=("X", "Y", "mask"),
         bad=(("mask", np.full((4, 3), 0.5), ValueError), ("Y", np.zeros((4, 2)), ValueError),
              ("X", np.full((4, 3, 2), 1e200), ValueError), ("X", np.zeros((4, 3)), ValueError),
              ("mask", np.zeros((4, 3)), ValueError, "sample"))),
    Case("RegressionData.from_arrays", RegressionData.from_arrays,
         lambda: dict(X=_X(), Y=_Y()), real=("X", "Y")),
    Case("RegressionData.from_lists", RegressionData.from_lists,
         lambda: dict(Xs=[_X()[0], _X()[1, :2]], Ys=[_Y()[0], _Y()[1, :2]]),
         bad=(("Xs", "ab", TypeError), ("Ys", [np.zeros(3)], ValueError),
              ("Xs", [np.zeros(3), np.zeros(2)], ValueError),
              ("Xs", [np.zeros((3, 2)), np.zeros((2, 3))], ValueError),
              ("Ys", [np.zeros(3) + 1j, np.zeros(2)], TypeError),
              ("Xs", [], ValueError))),
    Case("RegressionData.subset/predict", _subset_predict,
         lambda: dict(clients=np.array([0, 2]), theta=_quarters((2, 2), 5)),
         real=("theta",), counts=("clients",),
         bad=(("clients", np.array([0, 4]), ValueError), ("clients", np.array([], int),
                                                          ValueError),
              ("theta", np.zeros((3, 2)), ValueError))),
    Case("run_federated", _federated,
         lambda: dict(algorithm=LinearEM(), data=_data(), n_rounds=2, seed=0),
         scalars={"seed": "rng", "record_every": "count", "progress": "bool"},
         bad=(("n_rounds", -1, ValueError), ("n_rounds", 1.5, TypeError),
              ("n_rounds", "2", TypeError), ("n_rounds", 10**8, ValueError),
              ("data", _X(), TypeError), ("algorithm", None, TypeError),
              ("sampling", "some", ValueError), ("sampling", ["full"], TypeError),
              ("clients_per_round", 2, ValueError), ("seed", 2**64, ValueError),
              ("truth", np.zeros((4, 3)), ValueError), ("truth", complex_of(np.zeros((4, 2))),
                                                        TypeError),
              ("truth", np.full((4, 2), NAN), ValueError), ("evaluate", "acc", TypeError),
              ("evaluate", lambda theta: 0.5, TypeError), ("checkpoint", 3, TypeError))),
    Case("run_federated-fixed", _federated,
         lambda: dict(algorithm=LinearEM(), data=_data(), n_rounds=2, seed=0, sampling="fixed",
                      clients_per_round=2, truth=_quarters((4, 2), 3)),
         real=("truth",), scalars={"clients_per_round": "size"},
         bad=(("clients_per_round", 5, ValueError), ("clients_per_round", None, TypeError))),
    Case("run_federated-poisson", _federated,
         lambda: dict(algorithm=LinearEM(), data=_data(), n_rounds=2, seed=0, sampling="poisson",
                      clients_per_round=2),
         scalars={"clients_per_round": "size"}, bad=(("clients_per_round", 5, ValueError),)),
    Case("LinearGD", _linear_gd,
         lambda: dict(data=_data(), mu0=np.array([0.5, -0.25]), sigma_theta2_0=0.5),
         real=("mu0",),
         scalars={"lr_mu": "rate", "lr_var": "rate", "local_steps": "count",
                  "floor": "positive", "sigma_theta2_0": "rate", "sigma_x2_0": "rate"},
         bad=(("mu0", np.zeros(3), ValueError), ("mu0", np.zeros((2, 2)), ValueError),
              ("data", "data", TypeError), ("sigma_x2_0", 1e200, ValueError))),
    Case("LinearEM", _linear_em, lambda: dict(data=_data(), mu0=np.array([0.5, -0.25])),
         real=("mu0",),
         scalars={"sigma_theta2_0": "positive", "sigma_x2_0": "positive", "floor": "positive"},
         bad=(("mu0", np.zeros(3), ValueError),)),
    Case("LogisticGD", _logistic_gd, lambda: dict(data=_bindata(), mu0=0.25),
         real=("mu0",),
         scalars={"lr_mu": "rate", "lr_var": "rate", "floor": "positive",
                  "sigma_theta2_0": "rate", "learn_prior": "bool"},
         bad=(("rule", "sometimes", ValueError), ("mu0", np.zeros(5), ValueError))),
    Case("LogisticEM", _logistic_em, lambda: dict(data=_bindata(), mu0=np.array([0.5, 0.0])),
         real=("mu0",),
         scalars={"newton_steps": "count", "sigma_theta2_0": "positive", "floor": "positive"},
         bad=(("data", _data(), ValueError, r"data\.Y"),)),
    Case("FedAvgLinear", _fedavg_linear, lambda: dict(data=_data(), lr=0.1, local_steps=2),
         scalars={"lr": "rate", "local_steps": "count"}),
    Case("FedAvgLogistic", _fedavg_logistic,
         lambda: dict(data=_bindata(), lr=0.1, local_steps=2, l2=0.5),
         scalars={"lr": "rate", "local_steps": "count", "l2": "rate0"}),
    Case("DiscreteMixtureLinear", _dm_linear,
         lambda: dict(data=_data(), k=2, sigma_x2=0.5, cluster=_halves),
         scalars={"k": "size", "sigma_x2": "positive", "cluster": "callable"},
         bad=(("k", 5, ValueError), ("cluster", _bad_cluster_shape, ValueError))),
    Case("GaussianMixtureLinear", _gm_linear,
         lambda: dict(data=_data(), k=2, lr=0.01, sigma_x2=0.5, min_var=1e-3, cluster=_halves),
         scalars={"k": "size", "lr": "rate", "sigma_x2": "rate", "min_var": "positive",
                  "cluster": "callable"},
         bad=(("k", 5, ValueError),)),
    Case("LaplaceLinear", _laplace,
         lambda: dict(data=_data(), lr=0.01, sigma_x2=0.5, mu0=np.array([0.25, 0.5])),
         real=("mu0",),
         scalars={"lr": "rate", "sigma_x2": "rate", "b0": "rate", "floor": "positive",
                  "learn_prior": "bool"},
         bad=(("mu0", np.zeros(3), ValueError),)),
    Case("linear_objective", linear_objective,
         lambda: dict(data=_data(), theta=_quarters((4, 2), 3), mu=np.array([0.5, 0.0]),
                      sigma_theta2=0.5, sigma_x2=0.25),
         real=("theta", "mu"), scalars={"sigma_theta2": "positive", "sigma_x2": "positive"},
         bad=(("theta", np.zeros((3, 2)), ValueError), ("mu", np.zeros(3), ValueError),
              ("data", _X(), TypeError))),
    Case("logistic_objective", logistic_objective,
         lambda: dict(data=_bindata(), theta=_quarters((4, 2), 3), mu=0.5, sigma_theta2=0.5),
         real=("theta",), scalars={"sigma_theta2": "positive"},
         bad=(("theta", np.zeros(2), ValueError),)),
    Case("laplace_objective", laplace_objective,
         lambda: dict(data=_data(), theta=_quarters((4, 2), 3), mu=np.array([0.5, 0.0]),
                      b=0.5, sigma_x2=0.25),
         real=("theta", "mu"), scalars={"b": "positive", "sigma_x2": "positive"}),
    Case("finetune_linear", finetune_linear,
         lambda: dict(data=_data(), theta0=np.array([0.25, -0.5]), steps=2, lr=0.1),
         real=("theta0",), scalars={"lr": "rate"},
         bad=(("theta0", np.zeros(3), ValueError), ("data", "d", TypeError),
              ("steps", -1, ValueError), ("steps", 1.5, TypeError))),
    Case("finetune_logistic", finetune_logistic,
         lambda: dict(data=_bindata(), theta0=_quarters((4, 2), 4), steps=2, lr=0.1),
         real=("theta0",), scalars={"lr": "rate"},
         bad=(("theta0", np.zeros((3, 2)), ValueError),)),
    Case("posterior_regression", posterior_regression,
         lambda: dict(data=_data(), mu=np.array([0.5, 0.0]), sigma_theta2=0.5, sigma_x2=0.25),
         real=("mu",), scalars={"sigma_theta2": "positive", "sigma_x2": "positive"},
         bad=(("form", "x", ValueError), ("form", ["n"], TypeError),
              ("mu", np.zeros(5), ValueError))),
    Case("local_least_squares", local_least_squares,
         lambda: dict(data=_data(), sigma_x2=0.25),
         scalars={"sigma_x2": "positive"},
         bad=(("rcond", -1.0, ValueError), ("rcond", "1e-12", TypeError),
              ("data", _X(), TypeError))),
    Case("marginal_loglik", marginal_loglik,
         lambda: dict(data=_data(), mu=np.array([0.5, 0.0]), sigma_theta2=0.5, sigma_x2=0.25),
         real=("mu",), scalars={"sigma_theta2": "positive", "sigma_x2": "positive"}),
    Case("logistic_map", logistic_map,
         lambda: dict(data=_bindata(), mu=np.array([0.5, 0.0]), sigma_theta2=0.5,
                      theta0=_quarters((4, 2), 6), steps=3),
         real=("mu", "theta0"),
         scalars={"sigma_theta2": "positive", "steps": "count", "tol": "positive"},
         bad=(("theta0", np.zeros((5, 2)), ValueError), ("data", _data(), ValueError,
                                                          r"data\.Y"))),
    Case("pathological", pathological,
         lambda: dict(labels=np.repeat(np.arange(3), 4), n_clients=3, classes_per_client=2,
                      rng=0),
         counts=("labels",),
         scalars={"n_clients": "size", "classes_per_client": "size", "rng": "rng"},
         bad=(("n_clients", 13, ValueError), ("classes_per_client", 4, ValueError),
              ("labels", np.array([0.5, 1.0]), TypeError))),
    Case("dirichlet", dirichlet,
         lambda: dict(labels=np.repeat(np.arange(3), 4), n_clients=3, alpha=0.5, min_size=1,
                      rng=0),
         counts=("labels",),
         scalars={"n_clients": "size", "alpha": "positive", "max_tries": "count", "rng": "rng"},
         bad=(("alpha", 1e101, ValueError), ("min_size", 5, ValueError),
              ("min_size", -1, ValueError)),
         extreme=(("alpha", 1e100), ("alpha", 1e-300))),
    Case("natural", natural, lambda: dict(groups=np.array(["b", "a", "b"])),
         bad=(("groups", np.array([1 + 1j, 2]), TypeError), ("groups", np.array([1.0, NAN]),
                                                            ValueError),
              ("groups", np.zeros((2, 2)), ValueError), ("groups", [], ValueError))),
    Case("train_test_split_per_client", train_test_split_per_client,
         lambda: dict(labels=np.array([0, 0, 1, 1, 1, 0]),
                      client_indices=[np.array([0, 1, 2]), np.array([3, 4, 5])],
                      test_fraction=0.5, rng=0),
         counts=("labels",), scalars={"test_fraction": "open_unit", "rng": "rng"},
         bad=(("client_indices", "ab", TypeError), ("client_indices", np.arange(3), TypeError),
              ("client_indices", [np.array([0, 9])], ValueError),
              ("client_indices", [np.array([0.5])], TypeError))),
]

table_tests(LEARNING, "learning", globals())


def test_an_algorithm_without_the_protocol_is_refused_by_name():
    with pytest.raises(TypeError, match="algorithm must be a RegressionAlgorithm"):
        run_federated(_NoRound(), _data(), 1)


def test_a_diverging_algorithm_warns():
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning, match="diverged"):
        run_federated(LinearGD(1e300), _data(), 3)


# ------------------------------------------- validation, demo and experiments

def _step(rng, k):
    return {"x": rng.standard_normal(k)}


VALIDATION = [
    Case("validate", validate, lambda: dict(names="known_beta", n_reps=5, rng=0),
         scalars={"n_reps": "count", "quick": "bool", "progress": "bool"},
         bad=(("names", "thm99", ValueError, "unknown check"), ("names", [1], TypeError),
              ("names", 3, TypeError), ("rng", -1, ValueError), ("rng", "0", TypeError),
              ("n_reps", 1, ValueError)),
         result=lambda report: report.to_dicts()),
    Case("judge", judge,
         lambda: dict(kind="exact", estimate=1.0, se=0.25, formula=1.5, z=4.0, atol=0.0),
         scalars={"z": "positive", "atol": "nonnegative"},
         bad=(("kind", "equal", ValueError), ("kind", ["exact"], TypeError),
              ("estimate", "1.0", TypeError), ("se", -1.0, ValueError),
              ("se", 1 + 1j, TypeError), ("formula", None, TypeError))),
    Case("make_result", make_result,
         lambda: dict(name="demo", label="row", statement="eq. (1)", kind="upper", formula=1.0,
                      values=np.array([0.5, 0.75, 1.25]), params={"m": 3}),
         bad=(("values", np.array([0.5, 1j]), TypeError), ("values", "0.5", TypeError),
              ("values", np.zeros((2, 2)), ValueError), ("values", np.zeros(0), ValueError),
              ("name", 3, TypeError), ("params", [1], TypeError), ("se", "0.1", TypeError),
              ("kind", "lower-ish", ValueError), ("z", 0.0, ValueError),
              ("extra", 1.0, TypeError))),
    Case("run_replicates", run_replicates, lambda: dict(step=_step, n_reps=5, rng=0, chunk=2),
         scalars={"n_reps": "count", "chunk": "count", "rng": "rng", "progress": "bool"},
         bad=(("n_reps", 1, ValueError), ("step", "f", TypeError),
              ("step", lambda rng, k: [1.0] * k, TypeError),
              ("step", lambda rng, k: {"x": np.zeros(k + 1)}, ValueError),
              ("desc", 3, TypeError))),
    Case("run_sweep", run_sweep, lambda: dict(name="thm1_vs_sigma_theta", n_reps=5, rng=0),
         valid=False,
         bad=(("name", "thm9", ValueError), ("name", ["thm1_vs_sigma_theta"], TypeError),
              ("n_reps", 1, ValueError), ("quick", "yes", TypeError), ("rng", "0", TypeError))),
    Case("plot_sweeps", plot_sweeps,
         lambda: dict(directory="unused", names="thm1_vs_sigma_theta", n_reps=5), valid=False,
         bad=(("names", "thm9", ValueError), ("names", [3], TypeError),
              ("directory", 3, TypeError), ("n_reps", 0, ValueError))),
    Case("run_demo", run_demo, lambda: dict(n_clients=5, rng=0),
         scalars={"n_clients": "size", "rng": "rng"},
         bad=(("n_clients", 2, ValueError),), finite=False),
]

table_tests(VALIDATION, "validation", globals())


def test_validate_takes_a_bare_name_as_one_check():
    report = validate("known_beta", n_reps=5, rng=0)
    assert {row.name for row in report.results} == {"known_beta"}
    assert report.to_dicts() == validate(["known_beta"], n_reps=5, rng=0).to_dicts()


def _e3_data(m, d, rng, n):
    data, theta, mu = __import__("ebfl.generative.regression",
                                 fromlist=["e3_data"]).e3_data(m, d, rng, n)
    return data.X, theta, mu


def _e3(**kw):
    from ebfl.generative.regression import e3_regression

    return e3_regression(**kw)


def _hapt_clients(**kw):
    from ebfl.generative.hapt import hapt_clients

    return hapt_clients(**kw)


def _hapt_logistic(**kw):
    from ebfl.generative.hapt import hapt_logistic

    return hapt_logistic(**kw)


EXPERIMENTS = [
    Case("e3_data", _e3_data, lambda: dict(m=3, d=2, rng=0, n=4),
         scalars={"m": "size", "d": "size", "n": "size", "rng": "rng"}),
    Case("e3_regression", _e3, lambda: dict(dims=(50,), m=10, runs=1), valid=False,
         bad=(("dims", "50", TypeError), ("dims", (20,), ValueError), ("dims", (), ValueError),
              ("dims", (50.5,), TypeError), ("m", 0, ValueError), ("runs", "1", TypeError),
              ("em_rounds", 0, ValueError), ("gd_rounds", 1.5, TypeError),
              ("rng", "seed", TypeError), ("progress", "no", TypeError))),
    Case("hapt_clients", _hapt_clients, lambda: dict(windows=None, positive="SITTING"),
         valid=False,
         bad=(("positive", "FLYING", ValueError), ("positive", ["SITTING"], TypeError),
              ("windows", "windows.csv", TypeError))),
    Case("hapt_logistic", _hapt_logistic, lambda: dict(positive="SITTING"), valid=False,
         bad=(("positive", "FLYING", ValueError), ("quick", "yes", TypeError),
              ("progress", 1, TypeError))),
]

table_tests(EXPERIMENTS, "experiments", globals())


def _adaped(name):
    def call(**kw):
        pytest.importorskip("torch")  # the experiments build torch models
        from ebfl.generative import adaped

        return getattr(adaped, name)(**kw)

    return call


ADAPED_BAD = [
    Case("load_clients", _adaped("load_clients"), lambda: dict(dataset="mnist"), valid=False,
         bad=(("dataset", "cifar", ValueError), ("seed", -1, ValueError),
              ("seed", "0", TypeError), ("test_fraction", 1.0, ValueError),
              ("femnist_root", 3, TypeError))),
    Case("table1", _adaped("table1"), lambda: dict(dataset="mnist", quick=True), valid=False,
         bad=(("dataset", "cifar", ValueError), ("methods", "SCAFFOLD", ValueError),
              ("methods", [3], TypeError), ("seeds", "0", TypeError), ("seeds", (), ValueError),
              ("seeds", (-1,), ValueError), ("eval_every", 0, ValueError),
              ("quick", "yes", TypeError))),
    Case("dp_sweep", _adaped("dp_sweep"), lambda: dict(dataset="hapt", quick=True),
         valid=False,
         bad=(("noise_multipliers", (0.0,), ValueError), ("noise_multipliers", "1", TypeError),
              ("noise_multipliers", (1 + 1j,), TypeError), ("clip", 0.0, ValueError),
              ("delta", 1.0, ValueError), ("concatenate", "no", TypeError),
              ("fine_tune", 1, TypeError), ("seed", 2.5, TypeError))),
    Case("fedem_comparison", _adaped("fedem_comparison"), lambda: dict(dataset="hapt"),
         valid=False,
         bad=(("noise_multipliers", (NAN,), ValueError), ("noise_multipliers", ("1",), TypeError),
              ("seeds", (), ValueError), ("seeds", (0.5,), TypeError), ("delta", 0.0, ValueError),
              ("dataset", "cifar", ValueError))),
]

table_tests(ADAPED_BAD, "adaped", globals())


# -------------------------------------------------------------------- torch
# Kept last and importorskip'ed inside each test: the rest runs without torch.

def _torch():
    return pytest.importorskip("torch")


def _fed_lists():
    """Two clients, 4 features, 3 classes: per-client feature and label lists."""
    x = [_quarters((3, 4), 10).astype(np.float32), _quarters((2, 4), 11).astype(np.float32)]
    y = [np.array([0, 1, 2]), np.array([2, 0])]
    return x, y


def _fed_data():
    from ebfl.learning.torch import FederatedDataset

    x, y = _fed_lists()
    return FederatedDataset.from_clients(x, y, x, y, n_classes=3)


def _from_clients(**kw):
    from ebfl.learning.torch import FederatedDataset

    data = FederatedDataset.from_clients(**kw)
    return data.x_train, data.y_train, data.n_train, data.n_classes


def _train(model="logistic", strategy="fedavg", **kw):
    torch = _torch()
    from ebfl.learning.torch import MLP, FedAvg, LogisticModel, train

    models = {"logistic": lambda: LogisticModel(4, 3), "wide": lambda: LogisticModel(5, 3),
              "classes": lambda: LogisticModel(4, 5), "mlp": lambda: MLP(4, 2, hidden=(3,))}
    net = models[model]() if isinstance(model, str) else model
    torch.manual_seed(0)
    strat = FedAvg(net, 0.1) if strategy == "fedavg" else strategy
    res = train(strat, _fed_data(), **{"n_rounds": 1, "local_steps": 1, "batch_size": 2, **kw})
    return res.accuracy


def _strategy(name):
    def call(model=None, **kw):
        from ebfl.generative import algorithm as a
        from ebfl.learning.torch import LogisticModel
        from ebfl.learning.torch import baselines as b
        from ebfl.learning.torch import strategies as s

        cls = {**{n: getattr(a, n) for n in ("AdaPeD", "DPAdaPeD")},
               **{n: getattr(s, n) for n in ("FedAvg", "Local")},
               **{n: getattr(b, n) for n in ("Ditto", "FedAvgFT", "FedEM", "DPFedEM", "FML",
                                             "PFedMe", "PerFedAvg", "QuPeDFP")}}[name]
        return cls(LogisticModel(4, 3) if model is None else model, **kw).config()

    return call


def _model(name):
    def call(**kw):
        from ebfl.learning.torch import models

        return sum(p.numel() for p in getattr(models, name)(**kw).parameters())

    return call


def _steps(name):
    def call(**kw):
        from ebfl.learning.torch import LogisticModel
        from ebfl.learning.torch.baselines import full_batch_steps, minibatch_steps
        from ebfl.learning.torch.functional import fresh_params, replicate

        model = LogisticModel(4, 3)
        stack = replicate(fresh_params(model, 0), 2)
        fn = full_batch_steps if name == "full" else minibatch_steps
        out = fn(model, stack, kw.pop("data", _fed_data()), **kw)
        return {k: v.detach().numpy() for k, v in out.items()}

    return call


TORCH = [
    Case("FederatedDataset.from_clients", _from_clients,
         lambda: dict(x_train=_fed_lists()[0], y_train=_fed_lists()[1],
                      x_test=_fed_lists()[0], y_test=_fed_lists()[1], n_classes=3),
         scalars={"n_classes": "size"},
         bad=(("x_train", "ab", TypeError),
              ("x_train", [np.zeros((3, 4)) + 1j, np.zeros((2, 4))], TypeError),
              ("x_train", [np.full((3, 4), NAN), np.zeros((2, 4))], ValueError),
              ("x_train", [np.full((3, 4), 1e300), np.zeros((2, 4))], ValueError),
              ("x_train", [np.zeros((3, 4)).astype(str), np.zeros((2, 4))], TypeError),
              ("x_train", [np.zeros((3, 4)), np.zeros((2, 5))], ValueError),
              ("x_test", [np.zeros((3, 4))], ValueError),
              ("y_train", [np.array([0, 1, -2]), np.array([2, 0])], ValueError),
              ("y_train", [np.array([0.5, 1, 2]), np.array([2, 0])], ValueError),
              ("y_train", [np.array([0, 1]), np.array([2, 0])], ValueError),
              ("n_classes", 2, ValueError), ("n_classes", "3", TypeError))),
    Case("train", _train, lambda: dict(seed=0),
         scalars={"local_steps": "count", "iters_per_epoch": "count",
                  "eval_every": "count", "batch_size": "count", "progress": "bool",
                  "checkpoint_every": "count"},
         bad=(("n_rounds", -1, ValueError), ("n_rounds", 1.5, TypeError),
              ("n_rounds", "1", TypeError),
              ("model", "wide", ValueError, r"model does not accept.*\(B, 4\)"),
              ("model", "classes", ValueError, r"model must return .*\(B, 3\)"),
              ("model", "mlp", ValueError, "model"), ("seed", -1, ValueError),
              ("seed", "0", TypeError), ("seed", 2**64, ValueError),
              ("lr_decay", 1.5, ValueError), ("lr_decay", 0.0, ValueError),
              ("sampling_ratio", 0.0, ValueError), ("clients_per_round", 3, ValueError),
              ("checkpoint", 3, TypeError), ("init_params", [1], TypeError),
              ("init_params", {"net.1.weight": np.zeros((3, 4))}, TypeError),
              ("strategy", "fedavg-ish", TypeError, "strategy"),
              ("failures", [0], TypeError), ("failures", {-1: [0]}, ValueError),
              ("failures", {0: [-1]}, ValueError), ("failures", {0: [0.5]}, TypeError))),
    Case("AdaPeD", _strategy("AdaPeD"), lambda: dict(),
         bad=(("model", "net", TypeError), ("fine_tune", "yes", TypeError),
              ("psi0", 0.1, ValueError), ("lr_theta", 0.0, ValueError))),
    Case("DPAdaPeD", _strategy("DPAdaPeD"),
         lambda: dict(clip_mu=1.0, noise_mu=0.5, concatenate=True),
         scalars={"clip_mu": "positive", "noise_mu": "nonnegative", "concatenate": "bool"},
         bad=(("clip_psi", 1.0, ValueError), ("noise_psi", 1.0, ValueError))),
    Case("FedAvg", _strategy("FedAvg"), lambda: dict(lr=0.1),
         scalars={"lr": "positive", "weight_decay": "nonnegative"},
         bad=(("model", 3, TypeError),)),
    Case("PFedMe", _strategy("PFedMe"), lambda: dict(),
         scalars={"inner_steps": "count", "train_idle": "bool", "lam": "positive"}),
    Case("FedEM", _strategy("FedEM"), lambda: dict(), scalars={"n_components": "count"},
         bad=(("model", [1.0], TypeError),)),
    Case("FML", _strategy("FML"), lambda: dict(), scalars={"alpha": "probability"}),
    Case("MLP", _model("MLP"), lambda: dict(in_features=4, n_classes=3, hidden=(5,)),
         scalars={"in_features": "size", "n_classes": "size"},
         bad=(("hidden", "64", TypeError), ("hidden", (5, 0), ValueError),
              ("hidden", (2.5,), TypeError))),
    Case("LogisticModel", _model("LogisticModel"), lambda: dict(in_features=4, n_classes=3),
         scalars={"in_features": "size", "n_classes": "size"}),
    Case("CNN5", _model("CNN5"), lambda: dict(n_classes=3, in_channels=1),
         scalars={"n_classes": "size", "in_channels": "size"}),
    Case("full_batch_steps", _steps("full"), lambda: dict(steps=2, lr=0.1, chunk=1),
         scalars={"lr": "rate", "weight_decay": "rate0", "chunk": "count"},
         bad=(("steps", -1, ValueError), ("data", "d", TypeError))),
    Case("minibatch_steps", _steps("mini"), lambda: dict(steps=2, lr=0.1, batch_size=2),
         scalars={"batch_size": "count"}, bad=(("seed", -1, ValueError),)),
]

@pytest.mark.parametrize("case", [c for c in TORCH if c.valid], ids=str)
def test_torch_valid_call(case):
    _torch()
    check_valid(case)


_TORCH_BAD = bad_variants(TORCH)


@pytest.mark.parametrize(("case", "arg", "label", "value_of", "exc", "pattern"), _TORCH_BAD,
                         ids=param_ids(_TORCH_BAD))
def test_torch_refused_by_name(case, arg, label, value_of, exc, pattern):
    _torch()
    check_refusal(case, arg, value_of, exc, pattern)


_TORCH_EXT = extreme_variants(TORCH)


@pytest.mark.parametrize(("case", "arg", "value"), _TORCH_EXT, ids=param_ids(_TORCH_EXT))
def test_torch_extreme_values_compute_or_are_refused_by_name(case, arg, value):
    _torch()
    check_extreme(case, arg, value)


def test_torch_features_in_other_dtypes_give_the_same_data():
    _torch()
    x, y = _fed_lists()
    ref = _from_clients(x_train=x, y_train=y, x_test=x, y_test=y)
    for convert in (lambda a: a.astype(np.float16), lambda a: a.astype(">f8"),
                    lambda a: a.astype(np.float64)):
        xs = [convert(a) for a in x]
        ys = [a.astype(">i8") for a in y]
        assert_same(_from_clients(x_train=xs, y_train=ys, x_test=xs, y_test=ys), ref)
