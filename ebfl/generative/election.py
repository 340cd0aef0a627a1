"""The paper's county-election experiment (E2), and extensions beyond it.

Counties are clients; in each of six folds one election is held out and the
other five are the county's data (n = 5 Bernoulli draws, 1 = Republican win).
The local estimate is the mean of the five outcomes; the personalized one is
the Beta-Bernoulli empirical-Bayes posterior mean: eq. (6) as printed
(``loo_printed``), the moment-corrected leave-one-out variant and the MLE.
The gain is 100 (1 - MSE(personalized) / MSE(local)) per fold, averaged over
the folds. The paper reports 10.7 +/- 1.9 % (3112 counties) without saying what
the held-out target is, so both are scored:

* ``outcome``: the held-out election's 0/1 result;
* ``share``: the held-out Republican two-party vote share (the county's
  political tendency).

Beyond the paper:

* private variants: each county releases its five-election mean through an
  eps-LDP mechanism: mechanism (7) with the paper's private estimator
  (Theorem 4, ``paper``), or Laplace noise with the corrected estimator, both
  with its default rule for the estimated population variance (``corrected``,
  ``variance="ucb"``: never shrinks beyond what an upper confidence bound on
  the variance makes safe) and with the plug-in rule max(0, sigma_hat^2) of
  earlier versions (``corrected plug-in``), on the same noisy messages;
* vote-count models for the share target, with the mean of the five training
  shares as the local baseline: a beta-binomial fit with votes as trials (counties
  as clients), and a Gaussian EB fit on the training shares with s_i from each
  county's between-election spread.
"""

from __future__ import annotations

import math

import numpy as np

from ebfl._paths import paper_numbers
from ebfl.datasets.elections import election_matrix, load_county_returns
from ebfl.eb.beta_binomial import beta_binomial_eb
from ebfl.eb.gaussian import gaussian_eb
from ebfl.privacy.estimators import private_bernoulli_corrected, private_bernoulli_paper

__all__ = ["METHODS", "election_experiment", "plot_election", "plot_election_gains",
           "plot_election_shrinkage", "shrinkage_data"]

#: The :func:`~ebfl.eb.beta_binomial_eb` methods compared.
METHODS = ("loo_printed", "loo_corrected", "mle")
TARGETS = ("outcome", "share")
#: Private variants: the paper's estimator, and the corrected one with its default
#: (``variance="ucb"``) and plug-in rules for the population variance.
PRIVATE = ("paper", "corrected", "corrected plug-in")


def _gain(estimate, local, target):
    return 100.0 * (1.0 - np.mean((estimate - target) ** 2) / np.mean((local - target) ** 2))


def _summary(values):
    values = np.asarray(values, dtype=float)
    return {"mean": float(values.mean()), "sd": float(values.std(ddof=1)),
            "per_fold": values.tolist()}


def election_experiment(matrix=None, *, epsilons=(1.0, 5.0), rng=0, path=None):
    """Leave-one-election-out gains of personalized over local estimates.

    Parameters
    ----------
    matrix : ElectionMatrix, optional
        Default: all counties present in the six elections of the data home's file.
    epsilons : sequence of float
        LDP levels of the private variants.
    rng : int, Generator or None
        Randomness of the private mechanisms.
    path : path-like, optional
        Local copy of the returns file (when ``matrix`` is None).

    Returns
    -------
    dict
        ``n_counties``, ``years``, ``paper`` (figure, ±, counties), ``gains``:
        {target: {estimator: {"mean", "sd", "per_fold"}}}, ``private`` (keys
        "paper eps=1", "corrected eps=1", "corrected plug-in eps=1", ...) and
        ``vote_models`` likewise, and ``reproduces_paper``: which target puts
        eq. (6)'s mean gain within the paper's ± band.
    """
    if matrix is None:
        matrix = election_matrix(load_county_returns(path))
    gen = np.random.default_rng(rng)
    wins, shares = matrix.rep_win, matrix.rep_share
    m, folds = wins.shape
    n = np.full(m, folds - 1)
    gains = {t: {meth: [] for meth in METHODS} for t in TARGETS}
    private = {t: {f"{kind} eps={eps:g}": [] for kind in PRIVATE for eps in epsilons}
               for t in TARGETS}
    votes = {"beta-binomial on votes": [], "gaussian EB on shares": []}
    for j in range(folds):
        train = np.delete(np.arange(folds), j)
        z = wins[:, train].sum(axis=1)
        local = z / n
        targets = {"outcome": wins[:, j].astype(float), "share": shares[:, j]}
        for meth in METHODS:
            est = beta_binomial_eb(z, n, method=meth).posterior.mean
            for t in TARGETS:
                gains[t][meth].append(_gain(est, local, targets[t]))
        for eps in epsilons:
            paper = private_bernoulli_paper(z, n, eps, rng=gen).estimate
            # Both rules see the same noisy messages (same seed): a paired before/after.
            seed = int(gen.integers(2**63))
            ests = {"paper": paper,
                    "corrected": private_bernoulli_corrected(z, n, eps, rng=seed).estimate,
                    "corrected plug-in": private_bernoulli_corrected(
                        z, n, eps, variance="plugin", rng=seed).estimate}
            for kind, est in ests.items():
                for t in TARGETS:
                    private[t][f"{kind} eps={eps:g}"].append(_gain(est, local, targets[t]))
        local_share = shares[:, train].mean(axis=1)
        bb = beta_binomial_eb(matrix.rep_votes[:, train].sum(axis=1),
                              matrix.two_party_votes[:, train].sum(axis=1), method="mle")
        votes["beta-binomial on votes"].append(_gain(bb.posterior.mean, local_share,
                                                     targets["share"]))
        spread = shares[:, train].std(axis=1, ddof=1) / math.sqrt(folds - 1)
        ge = gaussian_eb(local_share, np.maximum(spread, 1e-4))
        votes["gaussian EB on shares"].append(_gain(ge.posterior.mean, local_share,
                                                    targets["share"]))
    paper = paper_numbers("generative_framework_e2").iloc[0]
    out = {
        "n_counties": int(m), "years": list(matrix.years),
        "paper": {"gain_pct": float(paper["paper_gain_pct"]), "pm": float(paper["paper_pm"]),
                  "n_counties": int(paper["paper_n_counties"])},
        "gains": {t: {k: _summary(v) for k, v in d.items()} for t, d in gains.items()},
        "private": {t: {k: _summary(v) for k, v in d.items()} for t, d in private.items()},
        "vote_models": {"target": "share", "local": "mean of the five training shares",
                        **{k: _summary(v) for k, v in votes.items()}},
    }
    band = out["paper"]
    out["reproduces_paper"] = {
        t: bool(abs(out["gains"][t]["loo_printed"]["mean"] - band["gain_pct"]) <= band["pm"])
        for t in TARGETS}
    return out


def shrinkage_data(matrix, *, held_out=-1):
    """What the shrinkage figure shows: each county's local and personalized estimates.

    Every county has the same number of training elections, so its posterior mean
    is a function of its number of Republican wins alone (leave-one-out included:
    the other counties' totals are the grand total less its own). The counties are
    therefore summarized by how many have each number of wins.

    Parameters
    ----------
    matrix : ebfl.datasets.ElectionMatrix
    held_out : int
        The election left out (index into ``matrix.years``; -1: the last).

    Returns
    -------
    dict
        JSON-able: ``years``, ``held_out`` (the year), ``n_trials``, ``n_counties``,
        ``counties`` (per number of wins 0 ... ``n_trials``), ``posterior_mean``
        {method: per number of wins; None where no county has it} and
        ``prior_mean`` (the MLE's).
    """
    folds = matrix.rep_win.shape[1]
    j = held_out % folds
    z = np.delete(matrix.rep_win, j, axis=1).sum(axis=1)
    n = np.full(z.size, folds - 1)
    fits = {meth: beta_binomial_eb(z, n, method=meth) for meth in METHODS}
    wins = np.arange(folds)
    posterior = {}
    for meth, fit in fits.items():
        means = []
        for k in wins:
            values = fit.posterior.mean[z == k]
            if values.size and np.ptp(values) > 1e-12:  # the summary would lose counties
                raise RuntimeError(f"{meth}: counties with {k} wins differ")
            means.append(float(values[0]) if values.size else None)
        posterior[meth] = means
    return {"years": [int(y) for y in matrix.years], "held_out": int(matrix.years[j]),
            "n_trials": int(folds - 1), "n_counties": int(z.size),
            "counties": [int(np.sum(z == k)) for k in wins], "posterior_mean": posterior,
            "prior_mean": float(fits["mle"].prior.mean)}


def plot_election_shrinkage(data, path):
    """Local against personalized estimates, one (jittered) point per county.

    Parameters
    ----------
    data : dict
        A :func:`shrinkage_data` result.
    path : path-like
        Where the PNG goes.

    Returns
    -------
    str
        ``path``.
    """
    from ebfl._plotting import subplots

    n = data["n_trials"]
    counts = np.asarray(data["counties"])
    z = np.repeat(np.arange(counts.size), counts)
    jitter = np.random.default_rng(0).uniform(-0.03, 0.03, z.size)
    fig, ax = subplots(figsize=(6, 4.5))
    for meth, marker in zip(METHODS, ("o", "s", "^"), strict=True):
        means = np.array([np.nan if v is None else v for v in data["posterior_mean"][meth]])
        ax.scatter(z / n + jitter, means[z], s=6, alpha=0.4, marker=marker, label=meth)
    ax.plot([0, 1], [0, 1], color="gray", lw=1, label="no shrinkage")
    ax.axhline(data["prior_mean"], color="black", ls=":", lw=1,
               label="fitted prior mean (MLE)")
    ax.set_xlabel(f"local estimate: Republican wins / {n} (jittered)")
    ax.set_ylabel("personalized estimate")
    ax.set_title(f"{data['n_counties']} counties, training on all but {data['held_out']}")
    ax.legend(fontsize=8, markerscale=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_election_gains(result, path):
    """The MSE gain over local per held-out election, both targets, the paper's band.

    Parameters
    ----------
    result : dict
        An :func:`election_experiment` result (``years``, ``paper`` and the
        ``gains``' ``per_fold`` are read).
    path : path-like
        Where the PNG goes.

    Returns
    -------
    str
        ``path``.
    """
    from ebfl._plotting import subplots

    fig, axes = subplots(1, 2, figsize=(9, 3.8), sharey=True)
    years = [str(y) for y in result["years"]]
    width = 0.8 / len(METHODS)
    for ax, target in zip(axes, TARGETS, strict=True):
        for k, meth in enumerate(METHODS):
            vals = result["gains"][target][meth]["per_fold"]
            ax.bar(np.arange(len(years)) + (k - 1) * width, vals, width, label=meth)
        paper = result["paper"]
        ax.axhspan(paper["gain_pct"] - paper["pm"], paper["gain_pct"] + paper["pm"],
                   color="orange", alpha=0.2,
                   label=f"paper {paper['gain_pct']:g} ± {paper['pm']:g} %")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(years)), years)
        ax.set_xlabel("held-out election")
        ax.set_title(f"target: held-out {target}")
    axes[0].set_ylabel("MSE gain over local (%)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def plot_election(matrix, result, directory, *, held_out=-1):
    """Save ``election_shrinkage.png`` (local vs equation (6), per county), ``election_gains.png``.

    The two figures are :func:`plot_election_shrinkage` of :func:`shrinkage_data`
    and :func:`plot_election_gains` of ``result``.

    Returns
    -------
    list of str
        The two paths.
    """
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [plot_election_shrinkage(shrinkage_data(matrix, held_out=held_out),
                                    directory / "election_shrinkage.png"),
            plot_election_gains(result, directory / "election_gains.png")]
