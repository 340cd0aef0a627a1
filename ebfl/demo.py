"""The quick-start demonstration behind ``ebfl demo`` (and ``make run``).

Simulates the paper's two estimation settings from raw client data, fits every
estimator and puts each empirical MSE beside its closed form.
"""

from __future__ import annotations

import numpy as np

from ebfl import bounds
from ebfl._validation import INT64_MAX, as_generator, check_int_scalar
from ebfl.eb import BetaPrior, beta_bernoulli_eb, gaussian_eb_samples, personalized_gaussian
from ebfl.models import BetaBernoulliPopulation, GaussianPopulation

__all__ = ["run_demo"]


def _row(name, theta, estimate, formula=None):
    return {"estimator": name, "mse": float(np.mean((estimate - theta) ** 2)),
            "formula": formula}


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
