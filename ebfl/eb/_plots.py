"""Drawing for the ``plot`` methods of the empirical-Bayes fits.

Every fit draws the same two panels: its prior over a histogram of the
observations, and the shrinkage (posterior mean against observation, with the
identity line and the prior mean). A fit keeps its posteriors but not the data
it was fitted to (a fit for 10^7 clients would hold it twice), so ``plot`` takes
the observations again; where the fit's own numbers determine its posterior
means from them, the observations are checked against those means, so that a
picture of other data is refused rather than drawn. Plotting only reads the
fit. matplotlib is imported on the first plot (``ebfl._plotting``).
"""

from __future__ import annotations

import numpy as np

from ebfl._plotting import check_plot_path, result_figure
from ebfl._validation import check_counts, check_finite_array, check_int_scalar

#: Histogram bins: sqrt(n), within these bounds.
MIN_BINS, MAX_BINS = 10, 60
#: Points of a prior density curve.
GRID_POINTS = 400
#: The posterior means recomputed from the observations must agree with the fit's to
#: this share of the data's scale (the kernels use fast-math arithmetic).
CONSISTENCY_RTOL = 1e-6


def observations(x, name, shape):
    """``x`` as a finite float array of exactly ``shape`` (the fit's posterior means)."""
    arr = np.asarray(check_finite_array(x, name), dtype=float)
    if arr.shape != shape:
        raise ValueError(f"{name} must have the shape {shape} of the data this result was "
                         f"fitted to, got {arr.shape}")
    return arr


def coordinate_iv(coordinate, mean):
    """The coordinate to draw of (m,) or (m, d) estimates: 0 for one-coordinate fits."""
    d = 1 if mean.ndim == 1 else mean.shape[1]
    return check_int_scalar(coordinate, "coordinate", minimum=0, maximum=d - 1)


def column(values, coordinate):
    return values if values.ndim == 1 else values[:, coordinate]


def check_consistent(recomputed, fitted, name, *, scale_of=()):
    """Refuse observations whose posterior means, recomputed from the fit's own weights,
    differ from the fit's: they are not the data the fit saw."""
    scale = max([float(np.max(np.abs(fitted), initial=0.0))]
                + [float(np.max(np.abs(v), initial=0.0)) for v in scale_of] + [1e-300])
    gap = np.abs(recomputed - fitted)
    if not np.all(gap <= CONSISTENCY_RTOL * scale):
        worst = int(np.argmax(gap))
        raise ValueError(f"{name} are not the data this result was fitted to: the posterior "
                         f"mean they give client {worst} differs from the fit's by "
                         f"{gap.flat[worst]:.3g}")


def density_grid(obs, low, high):
    """Points spanning the observations and [low, high] (the prior's bulk)."""
    return np.linspace(min(float(obs.min()), low), max(float(obs.max()), high), GRID_POINTS)


def draw_fit(obs, post_mean, *, title, prior_label, density=None, atoms=None,
             prior_mean=None, obs_label="observation", path=None):
    """The two panels of a fit.

    ``density``: ``(grid, pdf)`` of the prior's continuous part; ``atoms``:
    ``(points, masses)`` of its point masses. With no atoms the histogram is a
    density; with atoms, bars are shares of the observations, stems the atoms'
    masses and the continuous part (if any) its mass per bin, so that all three
    read on one axis.
    """
    path = check_plot_path(path)
    n = obs.size
    bins = int(np.clip(np.sqrt(n), MIN_BINS, MAX_BINS))

    def draw(axes):
        left, right = axes
        if atoms is None:
            left.hist(obs, bins=bins, density=True, color="0.75", label="observations")
            left.set_ylabel("density")
        else:
            _, edges, _ = left.hist(obs, bins=bins, weights=np.full(n, 1.0 / n), color="0.75",
                                    label="observations (share per bin)")
            left.set_ylabel("probability")
        if density is not None:
            grid, pdf = density
            scale = 1.0 if atoms is None else float(edges[1] - edges[0])
            left.plot(grid, pdf * scale, color="C1", label=prior_label)
        if atoms is not None:
            points, masses = atoms
            left.stem(points, masses, linefmt="C1-", markerfmt="C1o", basefmt=" ",
                      label=f"{prior_label} (atoms)" if density is None else "atoms")
        left.set_xlabel(obs_label)
        left.set_title("fitted prior")
        left.legend(fontsize=8)

        right.plot(obs, post_mean, "o", ms=3, alpha=0.5, label="clients")
        lim = [min(float(obs.min()), float(post_mean.min())),
               max(float(obs.max()), float(post_mean.max()))]
        right.plot(lim, lim, "k--", lw=0.8, label="no shrinkage")
        if prior_mean is not None:
            right.axhline(prior_mean, color="C1", lw=0.8, label="prior mean")
        right.set_xlabel(obs_label)
        right.set_ylabel("posterior mean")
        right.set_title(title)
        right.legend(fontsize=8)

    return result_figure(draw, ncols=2, figsize=(9, 3.6), path=path)


# --------------------------------------------------------------------------- the fits


def plot_gaussian(fit, x, coordinate, path):
    from scipy import stats

    mean = fit.posterior.mean
    j = coordinate_iv(coordinate, mean)
    x = observations(x, "x", mean.shape)
    mu = np.asarray(fit.prior.mean, dtype=float).reshape(-1)
    a = fit.shrinkage if mean.ndim == 1 else fit.shrinkage[:, None]
    centre = mu[0] if mean.ndim == 1 else mu
    check_consistent(centre + a * (x - centre), mean, "x", scale_of=(x, mu))
    obs, post, mu_j, sd = column(x, j), column(mean, j), float(mu[j]), float(fit.prior.sd)
    label = f"N({mu_j:.3g}, {sd:.3g}²)"
    if sd > 0:
        grid = density_grid(obs, mu_j - 4 * sd, mu_j + 4 * sd)
        prior = {"density": (grid, stats.norm.pdf(grid, mu_j, sd))}
    else:  # a point mass: every client goes to the mean
        prior = {"atoms": (np.array([mu_j]), np.array([1.0]))}
    return draw_fit(obs, post, title=f"shrinkage ({fit.method})", prior_label=label,
                    prior_mean=mu_j, obs_label="x" if mean.ndim == 1 else f"x[:, {j}]",
                    path=path, **prior)


def plot_beta_binomial(fit, successes, trials, path):
    from scipy import stats

    from ebfl.eb.beta_binomial import check_binomial_counts

    z, n = check_binomial_counts(successes, trials)
    if z.size != fit.n_clients:
        raise ValueError(f"successes and trials must hold the {fit.n_clients} clients this "
                         f"result was fitted to, got {z.size}")
    own = z / n
    check_consistent(fit.shrinkage * own + (1.0 - fit.shrinkage) * fit.centre,
                     fit.posterior.mean, "successes and trials", scale_of=(own,))
    prior, density, label, centre = fit.prior, None, "no proper Beta", None
    if prior is not None:
        grid = np.linspace(0.0, 1.0, GRID_POINTS + 2)[1:-1]  # the pdf may be infinite at 0, 1
        density = (grid, stats.beta.pdf(grid, prior.alpha, prior.beta))
        label, centre = f"Beta({prior.alpha:.3g}, {prior.beta:.3g})", prior.mean
    return draw_fit(own, fit.posterior.mean, title=f"shrinkage ({fit.method})",
                    prior_label=label, density=density, prior_mean=centre,
                    obs_label="successes / trials", path=path)


def plot_npmle(fit, x, trials, path):
    shape = fit.posterior_mean.shape
    if fit.likelihood == "binomial":
        from ebfl.eb.beta_binomial import check_binomial_counts

        if trials is None:
            raise ValueError("trials is required for a binomial NPMLE: pass the successes "
                             "and trials it was fitted to")
        # x holds the successes here: checked under its own name first
        z, n = check_binomial_counts(check_counts(x, "x (the successes)"),
                                     check_counts(trials, "trials"))
        if z.shape != shape:
            raise ValueError(f"x (successes) and trials must hold the {shape[0]} clients "
                             f"this result was fitted to, got {z.size}")
        obs, obs_label = z / n, "successes / trials"
    else:
        if trials is not None:
            raise ValueError("trials applies to a binomial NPMLE; this one is normal")
        obs, obs_label = observations(x, "x", shape), "x"
    keep = fit.weights > 0
    return draw_fit(obs, fit.posterior_mean, title=f"shrinkage (NPMLE, {fit.likelihood})",
                    prior_label="NPMLE", atoms=(fit.grid[keep], fit.weights[keep]),
                    prior_mean=fit.prior_mean, obs_label=obs_label, path=path)


def plot_gaussian_mixture(fit, x, coordinate, path):
    from scipy import stats

    mean = fit.posterior.mean
    j = coordinate_iv(coordinate, mean)
    x = observations(x, "x", mean.shape)
    g = fit.prior
    mu = g.means if g.means.ndim == 2 else g.means[:, None]         # (k, d)
    x2 = x if x.ndim == 2 else x[:, None]                            # (m, d)
    a = fit.shrinkage[:, :, None]                                    # (m, k, 1)
    recomputed = np.einsum("mk,mkd->md", fit.posterior.weights,
                           mu[None] + a * (x2[:, None, :] - mu[None]))
    check_consistent(recomputed if x.ndim == 2 else recomputed[:, 0], mean, "x",
                     scale_of=(x, mu))
    obs, post, mu_j = column(x, j), column(mean, j), mu[:, j]
    point = g.sds == 0
    prior = {}
    if np.any(~point):
        sd = g.sds[~point]
        grid = density_grid(obs, float(np.min(mu_j[~point] - 4 * sd)),
                            float(np.max(mu_j[~point] + 4 * sd)))
        pdf = stats.norm.pdf(grid[:, None], mu_j[~point], sd) @ g.weights[~point]
        prior["density"] = (grid, pdf)
    if np.any(point):
        prior["atoms"] = (mu_j[point], g.weights[point])
    return draw_fit(obs, post, title=f"shrinkage ({g.n_components} components)",
                    prior_label=f"mixture of {g.n_components}",
                    prior_mean=float(g.weights @ mu_j),
                    obs_label="x" if mean.ndim == 1 else f"x[:, {j}]", path=path, **prior)


def plot_discrete(fit, xbar, coordinate, path):
    mean = fit.estimate
    j = coordinate_iv(coordinate, mean)
    xbar = observations(xbar, "xbar", mean.shape)
    atoms = column(fit.atoms, j)
    return draw_fit(column(xbar, j), column(mean, j), title="shrinkage (Algorithm 1)",
                    prior_label=f"{atoms.size} atoms", atoms=(atoms, fit.probs),
                    prior_mean=float(fit.probs @ atoms),
                    obs_label="xbar" if mean.ndim == 1 else f"xbar[:, {j}]", path=path)
