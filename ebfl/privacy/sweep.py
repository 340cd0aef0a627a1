"""The private Bernoulli estimators across privacy levels (``ebfl private-bernoulli``).

Shows errata [!5]: the paper's estimator (Theorem 4) keeps its weight on the
local mean near n/(n+1) or above however large epsilon is, while the corrected
estimator's weight and MSE approach the non-private empirical Bayes ones. The
corrected estimator is shown with its default rule for the estimated variance
(``variance="ucb"``) and with the plug-in rule, on the same messages: at small
epsilon the plug-in rule can shrink everything to the mean, the default one
falls back towards the local estimate.
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import INT64_MAX, as_generator, check_finite_array, check_int_scalar
from ebfl.eb.beta_binomial import beta_binomial_eb
from ebfl.models import BetaBernoulliPopulation
from ebfl.privacy.estimators import private_bernoulli_corrected, private_bernoulli_paper
from ebfl.privacy.mechanisms import EPSILON_RANGE

__all__ = ["DEFAULT_EPSILONS", "plot_private_bernoulli", "private_bernoulli_sweep"]

#: The privacy levels epsilon of :func:`private_bernoulli_sweep` by default.
DEFAULT_EPSILONS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 50.0)


def private_bernoulli_sweep(epsilons=DEFAULT_EPSILONS, *, alpha=2.0, beta=2.0, n_clients=10_000,
                            n=14, rng=0):
    """Mean weight a_i and MSE of the private estimators for each epsilon, one population draw.

    ``epsilons``: one or more privacy levels in [1e-150, 1e150]; ``alpha``, ``beta``:
    the Beta population, in (0, 1e300]; ``n_clients`` >= 3 clients of ``n`` >= 2 trials
    each (the leave-one-out references need both).

    Returns a JSON-ready dict with the non-private references (local,
    ``loo_printed``, ``loo_corrected``) and one row per epsilon: the paper's
    estimator (``paper_*``), the corrected one (``corrected_*``, default
    ``variance="ucb"``) and the corrected one with ``variance="plugin"``
    (``corrected_plugin_*``) on the same messages.
    """
    epsilons = check_finite_array(epsilons, "epsilons", ndim=1)
    lo, hi = EPSILON_RANGE
    if np.any((epsilons < lo) | (epsilons > hi)):
        raise ValueError(f"epsilons must lie in [{lo:g}, {hi:g}]; got "
                         f"{float(epsilons[(epsilons < lo) | (epsilons > hi)][0])!r}")
    # leave-one-out estimators need 3 clients; loo_corrected needs 2 trials per client
    n_clients = check_int_scalar(n_clients, "n_clients", minimum=3, maximum=INT64_MAX)
    n = check_int_scalar(n, "n", minimum=2, maximum=INT64_MAX)
    rng = as_generator(rng)
    p, z, trials = BetaBernoulliPopulation(alpha, beta).sample_sufficient(n_clients, n, rng=rng)

    def mse(estimate):
        return float(np.mean((estimate - p) ** 2))

    reference = {"local": {"weight": 1.0, "mse": mse(z / trials)}}
    for method in ("loo_printed", "loo_corrected"):
        res = beta_binomial_eb(z, trials, method=method)
        reference[method] = {"weight": float(res.shrinkage.mean()), "mse": mse(res.posterior.mean)}
    rows = []
    for eps in epsilons:
        paper = private_bernoulli_paper(z, trials, eps, rng=rng)
        seed = int(rng.integers(2**63))     # same messages for both variance rules
        corrected = private_bernoulli_corrected(z, trials, eps, rng=seed)
        plugin = private_bernoulli_corrected(z, trials, eps, variance="plugin", rng=seed)
        rows.append({"epsilon": float(eps),
                     "paper_weight": float(paper.weight.mean()), "paper_mse": mse(paper.estimate),
                     "corrected_weight": float(corrected.weight.mean()),
                     "corrected_mse": mse(corrected.estimate),
                     "corrected_plugin_weight": float(plugin.weight.mean()),
                     "corrected_plugin_mse": mse(plugin.estimate)})
    return {"setting": {"alpha": alpha, "beta": beta, "m": n_clients, "n": n,
                        "bayes_weight": n / (alpha + beta + n)},
            "reference": reference, "rows": rows}


def plot_private_bernoulli(sweep, path):
    """Save the two-panel figure (weight and MSE versus epsilon) to ``path``."""
    from ebfl._plotting import subplots

    eps = [r["epsilon"] for r in sweep["rows"]]
    fig, (ax_w, ax_m) = subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, key, label in ((ax_w, "weight", "mean weight $\\hat a_i$ on local mean"),
                           (ax_m, "mse", "MSE")):
        ax.plot(eps, [r[f"paper_{key}"] for r in sweep["rows"]], "o-",
                label="paper, Theorem 4 (eq. 7)")
        ax.plot(eps, [r[f"corrected_{key}"] for r in sweep["rows"]], "s-",
                label="corrected (Laplace, variance subtracted)")
        ax.plot(eps, [r[f"corrected_plugin_{key}"] for r in sweep["rows"]], "x--",
                label="corrected, plug-in variance")
        for name, style in (("local", ":"), ("loo_printed", "--"), ("loo_corrected", "-.")):
            ax.axhline(sweep["reference"][name][key], color="gray", linestyle=style,
                       label=f"non-private {name}")
        ax.set_xscale("log")
        ax.set_xlabel("$\\epsilon_0$ (per-client LDP)")
        ax.set_ylabel(label)
    s = sweep["setting"]
    ax_m.set_yscale("log")
    ax_w.legend(fontsize=8)
    fig.suptitle(f"Private Beta-Bernoulli EB: Beta({s['alpha']:g}, {s['beta']:g}), "
                 f"m={s['m']}, n={s['n']}")
    fig.savefig(path, dpi=120)
    return path
