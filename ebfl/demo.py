"""The quick-start demonstration behind ``ebfl demo`` (and ``make run``).

Simulates the paper's two estimation settings from raw client data, fits every
estimator and puts each empirical MSE beside its closed form: :func:`run_demo`
returns the numbers (``ebfl demo --json`` prints them), :func:`format_demo` the
tables ``ebfl demo`` prints.
"""

from __future__ import annotations

import textwrap

import numpy as np

from ebfl import bounds
from ebfl._validation import INT64_MAX, as_generator, check_int_scalar
from ebfl.eb import BetaPrior, beta_bernoulli_eb, gaussian_eb_samples, personalized_gaussian
from ebfl.models import BetaBernoulliPopulation, GaussianPopulation

__all__ = ["format_demo", "run_demo"]


def _row(name, theta, estimate, formula=None):
    """One estimator: its empirical MSE, the Monte Carlo standard error of that MSE
    (``mse_se``) and the closed form it should match (``formula``, None if none)."""
    sq = (estimate - theta) ** 2
    return {"estimator": name, "mse": float(np.mean(sq)),
            "mse_se": float(np.std(sq, ddof=1) / np.sqrt(sq.size)), "formula": formula}


def gaussian_demo(n_clients, rng):
    """Figure-4 setting of the paper: n = 15, sigma_theta = 0.1, sigma_x = 0.5."""
    n, st, sx, mu = 15, 0.1, 0.5, 0.3
    sample = GaussianPopulation(mu, st, sx).sample(n_clients, n, rng=rng)
    b = bounds.gaussian_bounds(n_clients, n, st, sx)
    eb = gaussian_eb_samples(sample.data)
    xbar = np.add.reduceat(sample.data.values, sample.data.offsets[:-1]) / n
    rows = [
        _row("local mean", sample.theta, xbar, b.local),
        _row("global mean only", sample.theta, np.full(n_clients, xbar.mean()), b.global_only),
        _row("Theorem 1 (sigmas known)", sample.theta,
             personalized_gaussian(xbar, n, sigma_theta=st, sigma_x=sx).estimate, b.personalized),
        _row("EB, all unknown (MLE)", sample.theta, eb.posterior.mean, None),
        _row("oracle (prior known)", sample.theta,
             b.weight * xbar + (1 - b.weight) * mu, b.oracle),
    ]
    return {"setting": {"model": "gaussian", "m": n_clients, "n": n, "mu": mu,
                        "sigma_theta": st, "sigma_x": sx},
            "fitted": {"mu": float(eb.prior.mean), "sigma_theta": eb.prior.sd,
                       "sigma_x": eb.diagnostics["sigma_x"]},
            "rows": rows}


def beta_demo(n_clients, rng):
    """Beta(2, 2) population, n = 14 Bernoulli trials per client (the paper's E1 setting)."""
    n, alpha, beta = 14, 2.0, 2.0
    sample = BetaBernoulliPopulation(alpha, beta).sample(n_clients, n, rng=rng)
    b = bounds.beta_bounds(alpha, beta, n)
    known = beta_bernoulli_eb(sample.data, prior=BetaPrior(alpha, beta), fix_prior=True)
    local = np.add.reduceat(sample.data.values, sample.data.offsets[:-1], dtype=np.int64) / n
    rows = [_row("local mean", sample.theta, local, b.local),
            _row("posterior, prior known", sample.theta, known.posterior.mean, b.posterior)]
    fitted = {}
    for method in ("loo_printed", "loo_proof", "loo_corrected", "moments", "mle"):
        res = beta_bernoulli_eb(sample.data, method=method)
        rows.append(_row(f"EB {method}", sample.theta, res.posterior.mean, None))
        fitted[method] = None if res.prior is None else [res.prior.alpha, res.prior.beta]
    return {"setting": {"model": "beta-bernoulli", "m": n_clients, "n": n,
                        "alpha": alpha, "beta": beta},
            "fitted": fitted, "rows": rows}


def run_demo(n_clients=10_000, rng=0):
    """Both demonstrations; returns a JSON-ready dict.

    Parameters
    ----------
    n_clients : int
        Clients per setting, >= 3 (the leave-one-out fits need three).
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    dict
        ``"gaussian"`` and ``"beta_bernoulli"``, each with ``setting``, ``fitted``
        (the population parameters the EB fits found) and ``rows``: per estimator
        ``mse`` (empirical), ``mse_se`` (its Monte Carlo standard error), ``formula``
        (the closed form it should match, None if there is none) and
        ``gain_vs_local_pct``. :func:`format_demo` makes tables of it.

    Examples
    --------
    >>> out = run_demo(n_clients=200, rng=0)
    >>> sorted(out), out["gaussian"]["rows"][0]["estimator"]
    (['beta_bernoulli', 'gaussian'], 'local mean')
    """
    n_clients = check_int_scalar(n_clients, "n_clients", minimum=3, maximum=INT64_MAX)
    rng = as_generator(rng)
    out = {"gaussian": gaussian_demo(n_clients, rng), "beta_bernoulli": beta_demo(n_clients, rng)}
    for part in out.values():
        local = part["rows"][0]["mse"]
        for row in part["rows"]:
            row["gain_vs_local_pct"] = 100.0 * (1.0 - row["mse"] / local)
    return out


#: The row of each setting whose closed form is the prior-known (oracle) risk.
_ORACLE = {"gaussian": "oracle (prior known)", "beta-bernoulli": "posterior, prior known"}


def _num(x):
    """Four significant digits, trailing zeros kept (0.006250); "—" for no value."""
    return "—" if x is None else f"{x:#.4g}"


def _ratio(row):
    return "—" if row["formula"] is None else f"{row['mse'] / row['formula']:.3f}"


def _within(row, value):
    """Whether the empirical MSE lies within two Monte Carlo standard errors of ``value``."""
    return abs(row["mse"] - value) <= 2 * row["mse_se"]


def _table(header, rows, align):
    """Plain-text columns: ``align`` is ``"<"`` or ``">"`` per column."""
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
    return ["  " + "  ".join(f"{c:{a}{w}}" for c, a, w in zip(row, align, widths, strict=True))
            .rstrip() for row in [header, *rows]]


def _names(names):
    quoted = [f'"{n}"' for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _closing(part):
    """What the numbers of one setting show, wrapped at 100 characters."""
    rows = {r["estimator"]: r for r in part["rows"]}
    oracle = rows[_ORACLE[part["setting"]["model"]]]["formula"]
    off = [r["estimator"] for r in part["rows"]
           if r["formula"] is not None and not _within(r, r["formula"])]
    eb = [r for r in part["rows"] if r["estimator"].startswith("EB")]
    near = [r["estimator"] for r in eb if _within(r, oracle)]
    far = [r["estimator"] for r in eb if not _within(r, oracle)]
    said = ["each ratio is within two Monte Carlo standard errors of 1" if not off else
            f"the ratio of {_names(off)} is more than two Monte Carlo standard errors from 1"]
    if near == [r["estimator"] for r in eb]:
        who = f"all {len(near)} EB fits are" if len(near) > 1 else f"{_names(near)} is"
        said.append(f"{who} within two standard errors of the prior-known closed form "
                    f"{_num(oracle)}")
    else:
        said.append(f"of the EB fits, {_names(near) if near else 'none'} "
                    f"{'is' if len(near) == 1 else 'are'} within two standard errors of the "
                    f"prior-known closed form {_num(oracle)}, {_names(far)} "
                    f"{'is' if len(far) == 1 else 'are'} not")
    said.append(f"the local mean's MSE is {rows['local mean']['mse'] / oracle:.3g} times that")
    return textwrap.wrap("What the numbers show: " + "; ".join(said) + ".", 100)


def format_demo(result):
    """The tables ``ebfl demo`` prints, from :func:`run_demo`'s result.

    For each setting: a heading with the setting, the fitted population
    parameters, a table of every estimator's empirical MSE, the closed form it
    should match ("—" where there is none) and their ratio, then what they show.

    Parameters
    ----------
    result : dict
        What :func:`run_demo` returned.

    Returns
    -------
    str
        Plain text, lines of at most 100 characters for the default settings.

    Examples
    --------
    >>> text = format_demo(run_demo(n_clients=200, rng=0))
    >>> text.splitlines()[0].split(", prior")[0]
    'Gaussian: m = 200 clients, n = 15 samples each'
    """
    g = result["gaussian"]
    s, f = g["setting"], g["fitted"]
    out = [f"Gaussian: m = {s['m']} clients, n = {s['n']} samples each, prior N(mu = {s['mu']:g}, "
           f"sigma_theta = {s['sigma_theta']:g}), sigma_x = {s['sigma_x']:g}",
           f"fitted by EB (MLE): mu = {f['mu']:#.4g}, sigma_theta = {f['sigma_theta']:#.4g}, "
           f"sigma_x = {f['sigma_x']:#.4g}", ""]
    out += _table(["estimator", "empirical MSE", "closed form", "ratio"],
                  [[r["estimator"], _num(r["mse"]), _num(r["formula"]), _ratio(r)]
                   for r in g["rows"]], "<>>>")
    out += ["", *_closing(g), "", ""]
    b = result["beta_bernoulli"]
    s = b["setting"]
    out += [f"Beta-Bernoulli: m = {s['m']} clients, n = {s['n']} trials each, "
            f"prior Beta(alpha = {s['alpha']:g}, beta = {s['beta']:g})", ""]
    rows = []
    for r in b["rows"]:
        prior = b["fitted"].get(r["estimator"].removeprefix("EB "))
        shown = "" if prior is None else f"({prior[0]:#.4g}, {prior[1]:#.4g})"
        rows.append([r["estimator"], shown, _num(r["mse"]), _num(r["formula"]), _ratio(r)])
    out += _table(["estimator", "fitted (alpha, beta)", "empirical MSE", "closed form", "ratio"],
                  rows, "<<>>>")
    out += ["", *_closing(b)]
    return "\n".join(out)
