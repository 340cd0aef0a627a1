"""``plot()`` of the result objects: the fits, the runs' histories and the accountants.

Each plot returns a Figure with the expected axes, draws the result's own numbers
(read back from the artists), writes a PNG to ``path``, refuses bad arguments
before drawing (leaving no figure open) and leaves the result as it was.
"""

import matplotlib
import numpy as np
import pytest
from dp_accounting import dp_event
from matplotlib.container import StemContainer
from matplotlib.figure import Figure
from scipy import stats

import ebfl
from ebfl.eb import DiscreteMixtureFit, discrete_mixture_eb, gaussian_mixture_eb
from ebfl.federated import EBGaussian, RunConfig, RunResult, run, simulated_means
from ebfl.learning.federated import FederatedResult
from ebfl.privacy.accounting import Accountant, DPAdaPeDAccountant, dp_adaped_epsilon

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _no_figure_left_open():
    """Every test closes what it drew, and a refused call opens nothing."""
    before = set(plt.get_fignums())
    yield
    assert set(plt.get_fignums()) == before


def _close(fig):
    assert isinstance(fig, Figure)
    plt.close(fig)


def _stems(ax):
    (stem,) = [c for c in ax.containers if isinstance(c, StemContainer)]
    return stem.markerline.get_xdata(), stem.markerline.get_ydata()


def _shrinkage(fig):
    """x and y of the clients, the identity line and the prior mean's line."""
    lines = fig.axes[1].lines
    return lines[0].get_xdata(), lines[0].get_ydata(), lines[1], lines[2]


def _snapshot(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def _png(path):
    return path.read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------- fits


@pytest.fixture(scope="module")
def normal_data():
    rng = np.random.default_rng(3)
    s = rng.uniform(0.5, 1.5, 60)
    return rng.normal(0.4, 1.0, 60) + s * rng.standard_normal(60), s


@pytest.fixture(scope="module")
def counts():
    _, z, n = ebfl.BetaBernoulliPopulation(2, 5).sample_sufficient(80, 12, rng=0)
    return z, n


def test_gaussian_eb_plot(normal_data, tmp_path):
    x, s = normal_data
    fit = ebfl.gaussian_eb(x, s)
    kept = _snapshot(fit.posterior.mean, fit.shrinkage, fit.s)
    fig = fit.plot(x, tmp_path / "g.png")
    try:
        assert len(fig.axes) == 2 and _png(tmp_path / "g.png")
        prior = fig.axes[0].lines[0]
        np.testing.assert_array_equal(prior.get_ydata(), stats.norm.pdf(
            prior.get_xdata(), fit.prior.mean, fit.prior.sd))
        bars = fig.axes[0].patches  # a density histogram: area 1
        assert sum(b.get_height() * b.get_width() for b in bars) == pytest.approx(1.0)
        xs, ys, identity, centre = _shrinkage(fig)
        np.testing.assert_array_equal(xs, x)
        np.testing.assert_array_equal(ys, fit.posterior.mean)
        np.testing.assert_array_equal(identity.get_xdata(), identity.get_ydata())
        assert centre.get_ydata()[0] == fit.prior.mean
    finally:
        _close(fig)
    for before, after in zip(kept, (fit.posterior.mean, fit.shrinkage, fit.s), strict=True):
        np.testing.assert_array_equal(before, after)
        assert not after.flags.writeable


def test_gaussian_eb_plot_coordinates_point_mass_and_bad_x(normal_data):
    rng = np.random.default_rng(1)
    x3 = rng.normal(0, 1, (30, 3))
    fit3 = ebfl.gaussian_eb(x3, 0.5)
    fig = fit3.plot(x3, coordinate=2)
    try:
        xs, ys, _, centre = _shrinkage(fig)
        np.testing.assert_array_equal(xs, x3[:, 2])
        np.testing.assert_array_equal(ys, fit3.posterior.mean[:, 2])
        assert centre.get_ydata()[0] == fit3.prior.mean[2]
    finally:
        _close(fig)
    with pytest.raises(ValueError, match="coordinate"):
        fit3.plot(x3, coordinate=3)
    with pytest.raises(TypeError, match="coordinate"):
        fit3.plot(x3, coordinate=1.5)
    # a prior of sd 0 is a point mass: one stem of mass 1 at the mean
    x, s = normal_data
    flat = ebfl.gaussian_eb(x, s, prior_mean=0.25, prior_sd=0.0)
    fig = flat.plot(x)
    try:
        np.testing.assert_array_equal(_stems(fig.axes[0]), [[0.25], [1.0]])
    finally:
        _close(fig)
    fit = ebfl.gaussian_eb(x, s)
    with pytest.raises(ValueError, match="x must have the shape"):
        fit.plot(x[:-1])
    with pytest.raises(ValueError, match="x are not the data"):
        fit.plot(x[::-1])
    with pytest.raises(ValueError, match="x must be finite"):
        fit.plot(np.where(np.arange(x.size) == 0, np.nan, x))


@pytest.mark.parametrize("method", ["mle", "loo_corrected"])
def test_beta_binomial_plot(counts, method, tmp_path):
    z, n = counts
    fit = ebfl.beta_binomial_eb(z, n, method=method)
    kept = _snapshot(fit.posterior.mean, fit.shrinkage)
    fig = fit.plot(z, n, path=str(tmp_path / "b.png"))
    try:
        assert len(fig.axes) == 2 and _png(tmp_path / "b.png")
        prior = fig.axes[0].lines[0]
        assert 0 < prior.get_xdata().min() and prior.get_xdata().max() < 1
        np.testing.assert_array_equal(prior.get_ydata(), stats.beta.pdf(
            prior.get_xdata(), fit.prior.alpha, fit.prior.beta))
        xs, ys, _, centre = _shrinkage(fig)
        np.testing.assert_array_equal(xs, z / n)
        np.testing.assert_array_equal(ys, fit.posterior.mean)
        assert centre.get_ydata()[0] == fit.prior.mean
        assert fig.axes[1].get_title() == f"shrinkage ({method})"
    finally:
        _close(fig)
    np.testing.assert_array_equal(kept[0], fit.posterior.mean)
    np.testing.assert_array_equal(kept[1], fit.shrinkage)


def test_beta_binomial_plot_refuses_other_counts(counts):
    z, n = counts
    fit = ebfl.beta_binomial_eb(z, n)
    with pytest.raises(ValueError, match="successes and trials are not the data"):
        fit.plot(n - z, n)
    with pytest.raises(ValueError, match="hold the 80 clients"):
        fit.plot(z[:-1], n[:-1])
    with pytest.raises(ValueError, match="successes must not exceed trials"):
        fit.plot(n + 1, n)
    with pytest.raises(TypeError, match="trials"):
        fit.plot(z, n.astype(complex))


def test_npmle_plots(counts, normal_data, tmp_path):
    z, n = counts
    fit = ebfl.npmle_binomial(z, n, n_grid=40)
    kept = _snapshot(fit.weights, fit.posterior_mean)
    fig = fit.plot(z, n, tmp_path / "nb.png")
    try:
        assert len(fig.axes) == 2 and _png(tmp_path / "nb.png")
        keep = fit.weights > 0
        atoms, masses = _stems(fig.axes[0])
        np.testing.assert_array_equal(atoms, fit.grid[keep])
        np.testing.assert_array_equal(masses, fit.weights[keep])
        # bars are shares of the clients, on the atoms' scale
        assert sum(b.get_height() for b in fig.axes[0].patches) == pytest.approx(1.0)
        xs, ys, _, centre = _shrinkage(fig)
        np.testing.assert_array_equal(xs, z / n)
        np.testing.assert_array_equal(ys, fit.posterior_mean)
        assert centre.get_ydata()[0] == fit.prior_mean
    finally:
        _close(fig)
    np.testing.assert_array_equal(kept[0], fit.weights)
    with pytest.raises(ValueError, match="trials is required"):
        fit.plot(z)
    with pytest.raises(ValueError, match=r"x \(the successes\) must hold whole numbers"):
        fit.plot(z + 0.5, n)
    x, s = normal_data
    normal = ebfl.npmle_normal(x, s, n_grid=40)
    fig = normal.plot(x)
    try:
        xs, ys, _, _ = _shrinkage(fig)
        np.testing.assert_array_equal(xs, x)
        np.testing.assert_array_equal(ys, normal.posterior_mean)
    finally:
        _close(fig)
    with pytest.raises(ValueError, match="trials applies to a binomial NPMLE"):
        normal.plot(x, n[:x.size])
    with pytest.raises(ValueError, match="x must have the shape"):
        normal.plot(x[:10])


def test_gaussian_mixture_plot():
    rng = np.random.default_rng(0)
    x = rng.choice([-3.0, 3.0], 80) + rng.normal(0, 1.0, 80)
    fit = gaussian_mixture_eb(x, 0.5, 2, rng=0, n_init=1, min_sd=0.1)
    fig = fit.plot(x)
    try:
        assert len(fig.axes) == 2
        prior = fig.axes[0].lines[0]
        g = fit.prior
        expected = stats.norm.pdf(prior.get_xdata()[:, None], g.means, g.sds) @ g.weights
        np.testing.assert_allclose(prior.get_ydata(), expected, rtol=1e-12)
        xs, ys, _, centre = _shrinkage(fig)
        np.testing.assert_array_equal(ys, fit.posterior.mean)
        assert centre.get_ydata()[0] == pytest.approx(g.weights @ g.means)
    finally:
        _close(fig)
    with pytest.raises(ValueError, match="x are not the data"):
        fit.plot(x + 1.0)
    # point-mass components are stems (the discrete prior of Theorem 5)
    tight = rng.choice([-3.0, 3.0], 80) + rng.normal(0, 0.3, 80)  # spread below s: sd 0
    atoms = gaussian_mixture_eb(tight, 1.0, 2, rng=0, n_init=1)
    fig = atoms.plot(tight)
    try:
        points = atoms.prior.sds == 0
        assert points.any()
        np.testing.assert_array_equal(_stems(fig.axes[0]), [atoms.prior.means[points],
                                                            atoms.prior.weights[points]])
    finally:
        _close(fig)


def test_discrete_mixture_plot():
    rng = np.random.default_rng(0)
    xbar = rng.choice([-4.0, 4.0], 60) + rng.normal(0, 0.5, 60)
    fit = discrete_mixture_eb(xbar, 4, sigma_x=1.0, n_atoms=2, n_iter=3, rng=1)
    assert isinstance(fit, DiscreteMixtureFit)
    fig = fit.plot(xbar)
    try:
        np.testing.assert_array_equal(_stems(fig.axes[0]), [fit.atoms, fit.probs])
        xs, ys, _, _ = _shrinkage(fig)
        np.testing.assert_array_equal(xs, xbar)
        np.testing.assert_array_equal(ys, fit.estimate)
    finally:
        _close(fig)
    with pytest.raises(ValueError, match="xbar must have the shape"):
        fit.plot(xbar[:, None])


def test_plot_paths_are_checked_before_drawing(normal_data, tmp_path):
    x, s = normal_data
    fit = ebfl.gaussian_eb(x, s)
    with pytest.raises(TypeError, match="path must be a file path"):
        fit.plot(x, 3)
    with pytest.raises(ValueError, match="path: the folder"):
        fit.plot(x, tmp_path / "missing" / "g.png")
    with pytest.raises(ValueError, match="path must name a file"):
        fit.plot(x, tmp_path)
    with pytest.raises(ValueError, match="cannot write 'xyz' files"):
        fit.plot(x, tmp_path / "g.xyz")
    fig = fit.plot(x, tmp_path / "g.pdf")  # the suffix picks the format
    _close(fig)
    assert (tmp_path / "g.pdf").read_bytes()[:4] == b"%PDF"


# --------------------------------------------------------------------------- histories


@pytest.fixture(scope="module")
def eb_run():
    return run(EBGaussian(), simulated_means(20, seed=0), RunConfig(20, n_rounds=3))


def test_run_result_plot(eb_run, tmp_path):
    history = [dict(row) for row in eb_run.history]
    fig = eb_run.plot(path=tmp_path / "h.png")
    try:
        names = list(eb_run.metrics)  # the per-client metrics, one panel each
        assert [ax.get_ylabel() for ax in fig.axes] == names and _png(tmp_path / "h.png")
        for ax, name in zip(fig.axes, names, strict=True):
            line = ax.lines[0]
            np.testing.assert_array_equal(line.get_xdata(), [r["round"] for r in history])
            np.testing.assert_array_equal(line.get_ydata(), [r[name] for r in history])
            assert len(ax.collections) == 1  # the band of +- one sd over clients
    finally:
        _close(fig)
    assert eb_run.history == history
    fig = eb_run.plot("bytes_down")
    try:
        assert len(fig.axes) == 1 and not fig.axes[0].collections
        np.testing.assert_array_equal(fig.axes[0].lines[0].get_ydata(),
                                      [r["bytes_down"] for r in history])
    finally:
        _close(fig)


def test_history_plot_arguments(eb_run):
    with pytest.raises(ValueError, match="metric: 'nope' is not an entry to plot"):
        eb_run.plot("nope")
    with pytest.raises(ValueError, match="metric: 'round' is not an entry to plot"):
        eb_run.plot(["round"])
    for bad in (3, [], ["sd", 1]):
        with pytest.raises(TypeError, match="metric must be"):
            eb_run.plot(bad)
    with pytest.raises(ValueError, match="history is empty"):
        RunResult({}, {}, {}).plot()
    with pytest.raises(ValueError, match="no per-client metric"):
        RunResult({}, {}, {}, [{"round": 1, "bytes_up": 3}]).plot()


def test_learning_results_plot():
    history = [{"round": r, "train_loss": 1.0 / r, "train_loss_sd": 0.1, "mse": 2.0 / r,
                "objective": -r, "clients": 5} for r in (1, 2, 4)]
    fig = FederatedResult({}, {}, np.zeros(2), history).plot()
    try:
        assert [ax.get_ylabel() for ax in fig.axes] == ["train_loss", "mse"]
        np.testing.assert_array_equal(fig.axes[1].lines[0].get_ydata(), [2.0, 1.0, 0.5])
        np.testing.assert_array_equal(fig.axes[1].lines[0].get_xdata(), [1, 2, 4])
    finally:
        _close(fig)


def test_train_result_plot():
    torch = pytest.importorskip("torch")
    from ebfl.learning.torch import TrainResult

    rows = [{"round": r, "accuracy": 0.5 + 0.1 * r, "accuracy_sd": 0.05} for r in (1, 2)]
    fig = TrainResult({}, {}, torch.zeros(3), rows).plot("accuracy")
    try:
        np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [0.6, 0.7])
    finally:
        _close(fig)


# --------------------------------------------------------------------------- privacy


def _curve(fig):
    line = fig.axes[0].lines[0]
    return line.get_xdata(), line.get_ydata()


def test_accountant_plot_is_the_accountant_after_each_step(tmp_path):
    gauss = dp_event.GaussianDpEvent(8.0)
    sampled = dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(1.5))
    acc = Accountant().compose(gauss, 30).compose(sampled, 40)
    eps_before = acc.get_epsilon(1e-5)
    fig = acc.plot(1e-5, n_points=100, path=tmp_path / "a.png")
    try:
        steps, eps = _curve(fig)
        np.testing.assert_array_equal(steps, np.arange(1, 71))
        assert fig.axes[0].get_xscale() == "linear" and _png(tmp_path / "a.png")
        for t in (1, 30, 31, 70):
            fresh = Accountant().compose(gauss, min(t, 30))
            if t > 30:
                fresh.compose(sampled, t - 30)
            assert eps[t - 1] == fresh.get_epsilon(1e-5)
        assert np.all(np.diff(eps) >= 0)
    finally:
        _close(fig)
    assert acc.events == [(gauss, 30), (sampled, 40)]
    assert acc.get_epsilon(1e-5) == eps_before
    fig = acc.plot(1e-5, n_points=10)  # log-spaced, the last step included
    try:
        steps, eps = _curve(fig)
        assert steps[0] == 1 and steps[-1] == 70 and len(steps) <= 10
        assert fig.axes[0].get_xscale() == "log" and eps[-1] == eps_before
    finally:
        _close(fig)


def test_pld_accountant_plot():
    event = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    acc = Accountant(accountant="pld", value_discretization_interval=1e-2).compose(event, 6)
    fig = acc.plot(1e-5, n_points=3)
    try:
        steps, eps = _curve(fig)
        np.testing.assert_array_equal(steps, [1, 2, 6])
        fresh = Accountant(accountant="pld", value_discretization_interval=1e-2)
        assert eps[1] == fresh.compose(event, 2).get_epsilon(1e-5)
        assert eps[-1] == acc.get_epsilon(1e-5)
    finally:
        _close(fig)


@pytest.mark.parametrize("sampling", ["poisson", "without_replacement"])
def test_dp_adaped_accountant_plot(sampling):
    orders = [2.0, 4.0, 16.0]
    first = dict(n_sampled=5, sync_gap=2, clip_mu=1.0, noise_mu=4.0)
    second = dict(n_sampled=10, sync_gap=2, clip_mu=1.0, noise_mu=2.0)

    def accountant():
        return DPAdaPeDAccountant(20, sampling=sampling, orders=orders)

    acc = accountant().step(n_rounds=4, **first).step(n_rounds=3, **second)
    history = list(acc.history)
    fig = acc.plot(1e-5)
    try:
        steps, eps = _curve(fig)
        np.testing.assert_array_equal(steps, np.arange(1, 8))
        assert fig.axes[0].get_xlabel() == "rounds"
        for t in (2, 4, 6):
            fresh = accountant().step(n_rounds=min(t, 4), **first)
            if t > 4:
                fresh.step(n_rounds=t - 4, **second)
            assert eps[t - 1] == fresh.get_epsilon(1e-5)
        assert eps[-1] == acc.get_epsilon(1e-5)
    finally:
        _close(fig)
    assert acc.history == history


def test_accountant_plot_arguments():
    acc = Accountant().compose(dp_event.GaussianDpEvent(5.0), 3)
    with pytest.raises(ValueError, match="delta"):
        acc.plot(0.0)
    with pytest.raises(ValueError, match="n_points"):
        acc.plot(1e-5, n_points=1)
    with pytest.raises(TypeError, match="path must be a file path"):
        acc.plot(1e-5, path=object())
    with pytest.raises(ValueError, match="nothing is recorded yet; compose"):
        Accountant().plot(1e-5)
    with pytest.raises(ValueError, match="nothing is recorded yet; record rounds"):
        DPAdaPeDAccountant(10).plot(1e-5)


def test_privacy_spent_plot(tmp_path):
    kw = dict(n_clients=66, n_sampled=22, n_iterations=200, sync_gap=10, clip_mu=1.0,
              noise_mu=5.0, sampling="poisson", orders=[1.5, 2.0, 4.0, 8.0, 32.0])
    spent = dp_adaped_epsilon(1e-5, **kw)
    fig = spent.plot(tmp_path / "p.png")
    try:
        assert len(fig.axes) == 1 and _png(tmp_path / "p.png")
        orders, rdp = _curve(fig)
        np.testing.assert_array_equal(orders, spent.orders)
        np.testing.assert_array_equal(rdp, spent.rdp)
        assert fig.axes[0].lines[1].get_xdata()[0] == spent.order
    finally:
        _close(fig)
    pld = dp_adaped_epsilon(1e-5, **{**kw, "orders": None}, accountant="pld",
                            value_discretization_interval=1e-2)
    with pytest.raises(ValueError, match="has none; DPAdaPeDAccountant.plot"):
        pld.plot()
