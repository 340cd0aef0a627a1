"""Federated empirical Bayes: clients send summaries, the server learns the prior.

Each client keeps its raw data; it sends the server one summary (its counts,
or its mean and standard error), privatized first if so configured; the
server fits the population prior on the summaries and broadcasts it; every
client then computes its own posterior from the prior and its own, exact,
data, and keeps it. This is the one-round protocol of Section 2 of Ozkara et
al. ("client j sends q(X_j), the server broadcasts Agg(q_1..q_m), client i
outputs theta_hat_i(X_i, Agg)"), written as two
:class:`~ebfl.federated.FederatedAlgorithm` halves so that it runs in process
(:func:`ebfl.federated.run`) and on Flower alike.

Rounds (``n_rounds=2`` is a full run)
-------------------------------------
* round 0: the server's message is ``{"request": 0}``; every client replies
  its summary and remembers, in its state, the round it answered
  (``"sent"``) and, for a private protocol, its noisy release
  (``"release"``). The server fits the prior on the replies that arrived
  (client-id order) and keeps it.
* round 1: the message is the fitted prior; every client computes its
  posterior and keeps it in its state (``"mean"``, ``"var"`` and the weight
  ``"weight"`` on its own mean); it replies nothing. ``run(...).clients``
  holds them, one row per client.
* later rounds repeat round 1 (idempotent).

Every client takes part in every round (``all_clients_train``: the prior is
learned from all clients; ``clients_per_round`` is not used).

Faults
------
A client that fails in the fitting round is left out of the fit; the server
fits on the others. The posterior step does not need the client to have
replied: a failed client computes its posterior from the prior it receives in
the next round, with its own data (for the leave-one-out estimators its
"others" are then all the clients of the fit). A client that fails in round 1
computes its posterior in the next round it runs (its state keeps NaN until
then). When fewer clients reply than the fit needs (none at all included), the
server warns and asks again in the next round; clients that released before send their stored
release again, never a fresh noisy one.

Messages (float64 arrays)
-------------------------
=====================  ===============================  =================================
protocol               reply (per client)               prior message
=====================  ===============================  =================================
Beta prior             successes, trials                alpha, beta
leave-one-out eq. (6)  successes, trials                count, total, ssq, corr_total
NPMLE                  successes, trials                grid, weights
randomized response    reported, trials                 grid, weights
mechanism (7)          release                          count, total, ssq
Laplace (corrected)    release, trials                  count, total, ssq, inv_trials
Gaussian prior         mean, se (or mean, ssd, count)   mean, sd (+ sigma_x)
Gaussian NPMLE         mean, se (or mean, ssd, count)   grid, weights (+ sigma_x)
private Gaussian       release, count                   mean, sd, sigma_q, count
=====================  ===============================  =================================

Every prior message also carries ``fit_round``, the round whose replies were
fitted (a client whose ``"sent"`` equals it knows its own summary is in the
server's sums). The leave-one-out sums are those of eq. (6): a client removes
its own term, so one broadcast serves every client (the server never sends
per-client messages).

Randomness: every client draws its noise from its own stream, keyed by (run
seed, round, client id) (:mod:`ebfl.federated.streams`), so a run gives the
same numbers whether the clients run together or one at a time. The
in-process private estimators (:mod:`ebfl.privacy.estimators`) draw all
clients' noise from one generator instead, so a federated run equals them when
they are fed the same noisy releases (the tests feed them those); both compute
the leave-one-out estimates with the same functions (:mod:`ebfl.privacy.shrinkage`).

The clients' data (:class:`~ebfl.federated.ClientCounts`,
:class:`~ebfl.federated.ClientMeans`) and the datasets of them are in
:mod:`ebfl.federated.eb_data`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import fields, is_dataclass

import numpy as np
from scipy import special

from ebfl._validation import (
    check_choice,
    check_int_scalar,
    check_real_scalar,
    check_standard_deviation,
    check_standard_errors,
)
from ebfl.eb.beta_binomial import METHODS as BETA_METHODS
from ebfl.eb.beta_binomial import beta_binomial_eb, leave_one_out_moment_sums
from ebfl.eb.gaussian import METHODS as GAUSSIAN_METHODS
from ebfl.eb.gaussian import gaussian_eb
from ebfl.eb.npmle import normal_grid_posterior, npmle_binomial, npmle_normal
from ebfl.eb.priors import BetaPrior
from ebfl.federated.eb_data import (
    MAX_ABS_MEAN,
    SIMULATED_N,
    SIMULATED_SIGMA_THETA,
    SIMULATED_SIGMA_X,
    ClientCounts,
    ClientMeans,
)
from ebfl.federated.protocol import FederatedAlgorithm
from ebfl.federated.streams import numpy_streams
from ebfl.privacy.estimators import private_gaussian
from ebfl.privacy.mechanisms import (
    BinaryMechanism,
    LaplaceMechanism,
    Mechanism,
    RandomizedResponse,
    paper_clip_range,
)
from ebfl.privacy.shrinkage import (
    DEFAULT_UCB_Z,
    check_spread_identifiable,
    check_variance_rule,
    corrected_mechanism,
    corrected_release,
    corrected_shrinkage,
    leave_one_out_sums,
    others_mean,
    others_mean_and_squares,
    theorem4_shrinkage,
)

__all__ = ["EBBetaBinomial", "EBGaussian"]

#: Largest epsilon of per-observation randomized response: beyond it the flip
#: probability 1/(e^eps + 1) leaves the normal floats.
MAX_RR_EPSILON = 700.0


# --------------------------------------------------------------------------- the protocol


def _scalar(value):
    """A one-element float64 array: how a scalar travels in messages and states (one
    element rather than 0-d, as Flower's transport makes 0-d arrays 1-d)."""
    return np.array([value], dtype=np.float64)


def _read(message, key):
    """The scalar ``message[key]`` (a one-element array)."""
    return float(message[key][0])


def _as_int(values, name):
    """Counts that travelled as float64, back to int64 (they must be whole numbers)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values) & (values == np.floor(values))):
        raise ValueError(f"reply {name!r} must hold whole numbers")
    return values.astype(np.int64)


class _EmpiricalBayes(FederatedAlgorithm):
    """The protocol of the module docstring; subclasses fit and apply one kind of prior.

    Subclasses implement ``_check_data(data)``, ``_reply(client, data, rc)``
    (the summaries of a stack of clients), ``_fit(replies, rc)`` (server:
    the prior message and scalar diagnostics) and ``_posterior(message,
    client, data)`` (mean, var, weight of each client of a stack).
    """

    all_clients_train = True
    array_api = "numpy"
    #: Whether the reply is a noisy release, drawn once and kept in the state.
    _releases = False
    #: Whether the estimate is a posterior with a variance (not a shrinkage estimate).
    _has_variance = True
    #: Fewest replies the fit needs.
    min_clients = 2
    #: A fitting round without any reply is reported (warned), as one with too few.
    aggregate_empty = True

    # ---- server half
    def init_server(self, run):
        return {}

    def broadcast(self, server, rc):
        if "prior" in server:
            return server["prior"]
        return {"request": _scalar(rc.round)}

    def aggregate(self, server, replies, weights, rc):
        if "prior" in server:
            return server
        k = 0 if replies is None else len(rc.clients)
        if k < self.min_clients:
            warnings.warn(f"{self.name}: {k} client(s) replied in round {rc.round}; the prior "
                          f"needs at least {self.min_clients}, so the server asks again next "
                          "round", RuntimeWarning, stacklevel=2)
            return server
        prior, info = self._fit(replies, rc)
        prior["fit_round"] = _scalar(rc.round)
        info["contributors"] = k
        return {"prior": prior, "info": {key: _scalar(v) for key, v in info.items()}}

    def summary(self, server):
        return {key: float(v[0]) for key, v in server.get("info", {}).items()}

    # ---- client half
    def init_clients(self, run, data, clients):
        self._check_data(data)
        k = len(clients)
        state = {key: np.full(k, np.nan) for key in ("sent", "mean", "var", "weight")}
        if self._releases:
            state["release"] = np.full(k, np.nan)
        return state

    def client_train(self, message, client, data, rc):
        if "request" in message:
            reply = self._reply(client, data, rc)
            client["sent"][:] = message["request"]
            return reply
        mean, var, weight = self._posterior(message, client, data)
        client["mean"][:] = mean
        client["var"][:] = var
        client["weight"][:] = weight
        return {}

    def client_evaluate(self, message, client, data):
        """Posterior means (and sds, where the estimator has them); squared errors, and
        the local estimate's, when the data know the truth. NaN for clients without a
        posterior yet."""
        out = {"estimate": client["mean"].copy()}
        if self._has_variance:
            out["sd"] = np.sqrt(client["var"])
        if data.truth is not None:
            out["squared_error"] = (client["mean"] - data.truth) ** 2
            out["local_squared_error"] = (data.local_estimate - data.truth) ** 2
        return out

    def _stored_release(self, client, rc, draw):
        """Each client's release: the one it made before, else ``draw(generators)``.

        A repeated request gets the same noisy value back, never fresh noise
        (averaging fresh releases would weaken the privacy).
        """
        stored = client["release"]
        new = np.isnan(stored)
        if new.any():
            # every row from its own stream: the same whether clients run together or alone
            fresh = np.asarray(draw(numpy_streams(rc.config.seed, rc.round, rc.clients)),
                               dtype=np.float64)
            stored[new] = fresh[new]
        return stored.copy()

    @staticmethod
    def _included(message, client):
        """Whether each client's summary is in the server's fit."""
        return client["sent"] == message["fit_round"]


# --------------------------------------------------------------------------- Beta-Bernoulli

BETA_PRIORS = ("beta", "npmle")
BERNOULLI_PRIVACY = ("randomized-response", "binary", "laplace")
_LOO_METHODS = ("loo_printed", "loo_proof", "loo_corrected")


class EBBetaBinomial(_EmpiricalBayes):
    """Beta-Bernoulli empirical Bayes, federated: counts up, prior down, posteriors stay.

    Without privacy each client sends (z_i, n_i); the server fits the prior
    with :func:`ebfl.beta_binomial_eb` (``prior="beta"``) or
    :func:`ebfl.npmle_binomial` (``prior="npmle"``); each client's posterior
    is then exactly what the in-process function returns for it.

    Parameters
    ----------
    prior : {"beta", "npmle"}
        A Beta prior, or the nonparametric (grid) prior.
    method : str, optional
        How the Beta prior is fitted, one of ``beta_binomial_eb``'s methods:
        ``"mle"`` (default), ``"moments"``, or the leave-one-out moments of
        eq. (6) of Ozkara et al. (``"loo_printed"``, ``"loo_proof"``,
        ``"loo_corrected"``; the server broadcasts the sums and each client
        removes its own term). Only with ``prior="beta"`` and no privacy.
    n_grid : int
        Grid size of the NPMLE, >= 2 (equally spaced on [0, 1]).
    privacy : {None, "randomized-response", "binary", "laplace"}
        What leaves a client:

        - None: its exact (z_i, n_i).
        - ``"randomized-response"``: every observation goes through
          :class:`~ebfl.privacy.RandomizedResponse` (each observation
          epsilon-LDP; a client's whole record n_i epsilon); the client sends
          the number of ones reported and n_i. The server fits the NPMLE of
          the prior of p on the reported counts, whose law is Binomial(n_i,
          f + (1 - 2f) p_i), f = 1/(e^eps + 1) (needs ``prior="npmle"``).
          Caution: at small epsilon the deconvolved prior can be far too
          concentrated, and the posteriors then worse than the local
          estimates (2000 clients of Beta(2, 2), n_i = 14, eps = 0.5: mean
          squared error 0.021 against 0.014 for z_i/n_i); ``"laplace"``
          guards against that.
        - ``"binary"``: its local mean through mechanism (7)
          (:class:`~ebfl.privacy.BinaryMechanism`, user-level epsilon-LDP),
          with Theorem 4's estimator (:func:`ebfl.privacy.private_bernoulli_paper`).
        - ``"laplace"``: its local mean through the Laplace mechanism
          (user-level epsilon-LDP) and n_i, with the corrected estimator
          (:func:`ebfl.privacy.private_bernoulli_corrected`, its ``variance``
          and ``ucb_z``).

        With privacy, each client still uses its own exact data for its
        estimate. With ``"randomized-response"`` and ``"laplace"`` the n_i
        travel in the clear, as in the in-process estimators.
    epsilon : float
        The LDP level (needed with ``privacy``), in [1e-150, 1e150]
        (randomized response: at most 700).
    variance, ucb_z
        See :func:`ebfl.privacy.private_bernoulli_corrected` (``"laplace"`` only).

    Notes
    -----
    The client state holds ``mean`` and ``var`` (the posterior; for the
    private mean-based estimators ``var`` is NaN, they are shrinkage
    estimates), ``weight`` (the weight a_i on the client's own mean z_i/n_i;
    NaN for the NPMLE), ``sent`` and, with privacy, ``release``.

    Examples
    --------
    >>> from ebfl.federated import RunConfig, run, simulated_counts
    >>> data = simulated_counts(200, 14, seed=0)
    >>> res = run(EBBetaBinomial(), data, RunConfig(n_clients=200, n_rounds=2))
    >>> direct = beta_binomial_eb(data.successes, data.trials)
    >>> bool(np.array_equal(res.clients["mean"], direct.posterior.mean))
    True
    """

    name = "eb-beta-binomial"

    def __init__(self, prior="beta", *, method=None, n_grid=300, privacy=None, epsilon=None,
                 variance="ucb", ucb_z=DEFAULT_UCB_Z):
        self.prior = check_choice(prior, "prior", BETA_PRIORS)
        if privacy is not None:
            check_choice(privacy, "privacy", BERNOULLI_PRIVACY)
        self.privacy = privacy
        fits_beta = prior == "beta" and privacy is None
        if method is not None and not fits_beta:
            raise ValueError("method chooses how a Beta prior is fitted on exact counts: it "
                             "needs prior='beta' and privacy=None")
        self.method = (check_choice("mle" if method is None else method, "method", BETA_METHODS)
                       if fits_beta else None)
        self.n_grid = check_int_scalar(n_grid, "n_grid", minimum=2, maximum=10**7)
        self.variance, self.ucb_z = check_variance_rule(variance, ucb_z)
        self.epsilon = None
        self._mechanism = None
        if privacy is None:
            if epsilon is not None:
                raise ValueError("epsilon needs a privacy mechanism (privacy=...)")
        else:
            if epsilon is None:
                raise ValueError(f"privacy={privacy!r} needs epsilon")
            self._mechanism = _bernoulli_mechanism(privacy, epsilon)
            self.epsilon = self._mechanism.epsilon
        if privacy == "randomized-response":
            if prior != "npmle":
                raise ValueError("privacy='randomized-response' needs prior='npmle' (the "
                                 "reported counts are not beta-binomial)")
            if self.epsilon > MAX_RR_EPSILON:
                raise ValueError(f"epsilon must lie in [1e-150, {MAX_RR_EPSILON:g}] for "
                                 f"randomized response, got {self.epsilon!r}")
        if privacy in ("binary", "laplace") and prior != "beta":
            raise ValueError(f"privacy={privacy!r} uses the leave-one-out moment estimator: it "
                             "needs prior='beta'")
        self._releases = privacy is not None
        self._has_variance = privacy not in ("binary", "laplace")
        self.min_clients = 3 if (privacy in ("binary", "laplace")
                                 or self.method in _LOO_METHODS) else 2

    def config(self):
        return {"name": self.name, "prior": self.prior, "method": self.method,
                "n_grid": self.n_grid, "privacy": self.privacy, "epsilon": self.epsilon,
                "variance": self.variance, "ucb_z": self.ucb_z}

    @property
    def _kind(self):
        if self.privacy is not None:
            return self.privacy
        if self.prior == "npmle":
            return "npmle"
        return "loo" if self.method in _LOO_METHODS else "beta"

    def _check_data(self, data):
        if not isinstance(data, ClientCounts):
            raise TypeError(f"data must be a ClientCounts for {self.name}, got "
                            f"{type(data).__name__}")

    # ---- client: the summary
    def _reply(self, client, data, rc):
        z, n = data.successes, data.trials
        trials = n.astype(np.float64)
        if self.privacy is None:
            return {"successes": z.astype(np.float64), "trials": trials}
        release = self._stored_release(client, rc, lambda g: self._draw(z, n, g))
        if self.privacy == "randomized-response":
            return {"reported": release, "trials": trials}
        if self.privacy == "binary":
            return {"release": release}
        return {"release": release, "trials": trials}

    def _draw(self, z, n, generators):
        """Each client's noisy release, drawn from its own generator."""
        mech = self._mechanism
        if self.privacy == "randomized-response":
            return _reported_ones(mech, z, n, generators)
        x = z / n
        if self.privacy == "binary":
            return [mech.privatize(x[j:j + 1], g)[0] for j, g in enumerate(generators)]
        return [corrected_release(mech, x[j:j + 1], g)[0] for j, g in enumerate(generators)]

    # ---- server: the fit
    def _fit(self, replies, rc):
        return {"beta": self._fit_beta, "loo": self._fit_beta, "npmle": self._fit_npmle,
                "randomized-response": self._fit_reported, "binary": self._fit_releases,
                "laplace": self._fit_releases}[self._kind](replies)

    def _fit_beta(self, replies):
        """beta_binomial_eb on the counts: the prior, or the leave-one-out sums of eq. (6)."""
        z, n = _as_int(replies["successes"], "successes"), _as_int(replies["trials"], "trials")
        res = beta_binomial_eb(z, n, method=self.method)
        info = {"prior_mean": np.nan, "prior_sd": np.nan,
                "converged": float(res.diagnostics.get("converged", True)),
                "at_bound": float(res.diagnostics.get("at_bound", False))}
        if res.prior is not None:  # leave-one-out moments may imply no proper global Beta
            info.update(prior_mean=res.prior.mean, prior_sd=math.sqrt(res.prior.variance))
        if self.method in _LOO_METHODS:
            return _loo_sums(z, n, self.method), info
        return {"alpha": _scalar(res.prior.alpha), "beta": _scalar(res.prior.beta)}, info

    def _fit_npmle(self, replies):
        z, n = _as_int(replies["successes"], "successes"), _as_int(replies["trials"], "trials")
        res = npmle_binomial(z, n, n_grid=self.n_grid)
        return {"grid": res.grid, "weights": res.weights}, _npmle_info(res.grid, res.weights,
                                                                       res.converged)

    def _fit_reported(self, replies):
        """The NPMLE of the prior of p from randomized-response counts: the grid prior on
        p whose image on P(reported 1) = f + p tanh(eps/2) fits the reported counts."""
        reported = _as_int(replies["reported"], "reported")
        n = _as_int(replies["trials"], "trials")
        grid = np.linspace(0.0, 1.0, self.n_grid)
        res = npmle_binomial(reported, n, grid=self._mechanism.prob_high(grid))
        return {"grid": grid, "weights": res.weights}, _npmle_info(grid, res.weights,
                                                                   res.converged)

    def _fit_releases(self, replies):
        """The sums of the releases (and of 1/n_i, for the corrected estimator)."""
        release = replies["release"]
        prior = _sums_message(release)
        if self.privacy == "laplace":
            inv_n = 1.0 / _as_int(replies["trials"], "trials")
            check_spread_identifiable(inv_n, "privacy='laplace'")
            prior["inv_trials"] = _scalar(inv_n.sum())
        return prior, {"prior_mean": release.mean()}

    # ---- client: the posterior
    def _posterior(self, message, client, data):
        z, n = data.successes, data.trials
        kind = self._kind
        if kind == "beta":
            prior = BetaPrior(_read(message, "alpha"), _read(message, "beta"))
            res = beta_binomial_eb(z, n, prior=prior, fix_prior=True)
            return res.posterior.mean, res.posterior.var, res.shrinkage
        if kind in ("npmle", "randomized-response"):
            mean, var = _binomial_grid_posterior(z, n, message["grid"], message["weights"])
            return mean, var, np.full(z.size, np.nan)
        included = self._included(message, client)
        if kind == "loo":
            return _loo_posterior(z, n, included, message, self.method)
        sums = _read_sums(message)
        if kind == "binary":
            step = theorem4_shrinkage(z / n, n, client["release"], included, sums)
        else:
            step = corrected_shrinkage(z / n, n, client["release"], included, sums,
                                        _read(message, "inv_trials"), self._mechanism,
                                        self.variance, self.ucb_z)
        return step.estimate, np.full(z.size, np.nan), step.weight


def _bernoulli_mechanism(privacy, epsilon):
    """The mechanism of each ``privacy`` option (it validates epsilon)."""
    if privacy == "randomized-response":
        return RandomizedResponse(epsilon)
    if privacy == "binary":
        return BinaryMechanism(epsilon)
    return corrected_mechanism(epsilon)


def _npmle_info(grid, weights, converged):
    """Mean and sd of a grid prior, and whether its fit converged (for the history)."""
    mean = float(weights @ grid)
    return {"prior_mean": mean, "prior_sd": math.sqrt(float(weights @ (grid - mean) ** 2)),
            "converged": float(converged)}


def _reported_ones(mechanism, z, n, generators):
    """Ones reported by randomized response on each client's n_i observations.

    Each observation is flipped with probability f independently, so the count
    is Binomial(z, 1 - f) + Binomial(n - z, f): the law of the per-observation
    releases, drawn in O(1) per client instead of O(n_i).
    """
    f = mechanism.flip_probability
    return [g.binomial(z[j], 1.0 - f) + g.binomial(n[j] - z[j], f)
            for j, g in enumerate(generators)]


def _binomial_grid_posterior(z, n, grid, weights):
    """Posterior mean and variance of p_i under the grid prior, client by client.

    The arithmetic of :func:`ebfl.npmle_binomial`'s posteriors, on each
    client's own row (n_i, z_i).
    """
    zf, nf = z.astype(np.float64), n.astype(np.float64)
    log_lik = (special.gammaln(nf + 1) - special.gammaln(zf + 1) - special.gammaln(nf - zf + 1)
               )[:, None] + special.xlogy(zf[:, None], grid) + special.xlog1py(
                   (nf - zf)[:, None], -grid)
    shift = log_lik.max(axis=1)
    joint = np.exp(log_lik - shift[:, None]) * weights
    f = joint.sum(axis=1)
    mean = joint @ grid / f
    var = np.sum(joint * (grid - mean[:, None]) ** 2, axis=1) / f
    return mean, var


# Leave-one-out moments (eq. (6) and Theorem 4). The server sends the sums over
# the m clients of its fit; client i removes its own term, with the public halves of
# ebfl.privacy.shrinkage (the in-process private estimators run the same functions).
# A client outside the fit (it failed in the fitting round) has all m clients as its
# "others".


def _sums_message(values):
    """count, total = sum v, ssq = sum (v - mean)^2: what a client needs to leave itself out."""
    m, total, ssq = leave_one_out_sums(values)
    return {"count": _scalar(m), "total": _scalar(total), "ssq": _scalar(ssq)}


def _read_sums(message):
    """(m, total, ssq) of :func:`_sums_message`, read back from a message."""
    return int(_read(message, "count")), _read(message, "total"), _read(message, "ssq")


def _loo_sums(z, n, method):
    """The sums of eq. (6) on x = z/n, and corr_total = sum x(1-x)/(n-1), summed as
    :func:`ebfl.eb.beta_binomial_eb` sums them (over the distinct (n, z) pairs)."""
    total, ssq, corr_total = leave_one_out_moment_sums(z, n, method)
    return {"count": _scalar(z.size), "total": _scalar(total), "ssq": _scalar(ssq),
            "corr_total": _scalar(corr_total)}


def _loo_posterior(z, n, included, message, method):
    """Eq. (6): posterior mean, variance and weight a_i of each client of a stack.

    The arithmetic of the shared kernel ``ebfl._kernels.loo_beta_client``, vectorized over
    a stack of clients, some of which may be outside the fit.
    """
    x = z / n
    sums = _read_sums(message)
    mu, v = others_mean_and_squares(x, included, sums,
                                     "printed" if method == "loo_printed" else "own")
    if method == "loo_corrected":
        with np.errstate(divide="ignore", invalid="ignore"):
            noise = others_mean(x * (1.0 - x) / (n - 1.0), included, sums[0],
                                 _read(message, "corr_total"))
        v = np.maximum(v - noise, 0.0)
    u = mu * (1.0 - mu)
    minus_one = 0.0 if method == "loo_proof" else 1.0
    den = u - minus_one * v + n * v
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(v == 0.0, 0.0, np.where(den <= 0.0, np.inf, n * v / den))
    a = np.clip(a, 0.0, 1.0)
    est = a * x + (1.0 - a) * mu
    # As BetaPosterior.var from the concentration n / a (inf: a point mass).
    with np.errstate(divide="ignore"):
        concentration = np.where(a == 0.0, np.inf, n / a)
    return est, est * (1.0 - est) / (concentration + 1.0), a


# --------------------------------------------------------------------------- Gaussian

GAUSSIAN_PRIORS = ("normal", "npmle")


class _Released(Mechanism):
    """Releases already made: ``privatize`` returns them; the noise's moments are the
    mechanism's. Lets the server run :func:`ebfl.privacy.private_gaussian`'s fit on
    the messages it received (the clients drew the noise)."""

    def __init__(self, released, mechanism):
        self._released = released
        self._mechanism = mechanism

    def privatize(self, x, rng=None):
        return self._released

    def variance(self, x):
        return self._mechanism.variance(x)

    @property
    def max_variance(self):
        return self._mechanism.max_variance

    def square_variance_excess(self, input_variance):
        return self._mechanism.square_variance_excess(input_variance)


class EBGaussian(_EmpiricalBayes):
    """Gaussian empirical Bayes, federated: (mean, se) up, prior down, posteriors stay.

    Without a mechanism each client sends its mean x_i and standard error s_i
    (or, to pool sigma_x, its mean, sum of squared deviations and count); the
    server fits :func:`ebfl.gaussian_eb` (``prior="normal"``) or
    :func:`ebfl.npmle_normal` (``prior="npmle"``) and each client's posterior
    is what the in-process function returns for it (to rounding: the message
    carries sigma_theta, whose square can differ from the fitted
    sigma_theta^2 in the last bit).

    Parameters
    ----------
    prior : {"normal", "npmle"}
    method : {"mle", "reml", "dl", "moments"}, optional
        How :func:`ebfl.gaussian_eb` fits sigma_theta: ``"mle"`` (default).
        Only with ``prior="normal"`` and no mechanism.
    prior_mean, prior_sd : float, optional
        Known mu and sigma_theta (see :func:`ebfl.gaussian_eb`). With a
        mechanism, ``prior_sd`` is the known sigma_theta of
        :func:`ebfl.privacy.private_gaussian` and ``prior_mean`` is not used.
    sigma_x : float, optional
        Known data standard deviation, in [1e-100, 1e100]: s_i =
        sigma_x / sqrt(n_i) (the data need ``count``). None: each client's own
        ``se``, else sigma_x pooled over the clients from ``ssd`` and ``count``
        (the server pools it and broadcasts it with the prior).
    n_grid : int
        Grid size of the NPMLE, >= 2.
    mechanism : Mechanism, optional
        Each client sends ``mechanism.privatize(x_i)`` and n_i instead, e.g.
        :class:`~ebfl.privacy.GaussianMechanism` or
        :class:`~ebfl.privacy.StochasticQuantizer`; the server fits as
        :func:`ebfl.privacy.private_gaussian` (Theorem 2 of Ozkara et al.),
        and each client combines the result with its own exact mean. Needs
        ``sigma_x`` and ``prior="normal"``.
    variance, ucb_z
        See :func:`ebfl.privacy.private_gaussian` (with a mechanism).

    Notes
    -----
    Client state: ``mean``, ``var`` (posterior; NaN with a mechanism, whose
    estimate is a shrinkage estimate), ``weight`` (on the client's own mean;
    NaN for the NPMLE), ``sent`` and, with a mechanism, ``release``.
    One-dimensional data only.

    Examples
    --------
    >>> from ebfl.federated import RunConfig, run, simulated_means
    >>> data = simulated_means(200, 15, seed=0)
    >>> res = run(EBGaussian(sigma_x=0.5), data, RunConfig(n_clients=200, n_rounds=2))
    >>> direct = gaussian_eb(data.mean, 0.5 / np.sqrt(data.count))
    >>> float(np.max(np.abs(res.clients["mean"] - direct.posterior.mean))) < 1e-12
    True
    """

    name = "eb-gaussian"

    def __init__(self, prior="normal", *, method=None, prior_mean=None, prior_sd=None,
                 sigma_x=None, n_grid=300, mechanism=None, variance="ucb",
                 ucb_z=DEFAULT_UCB_Z):
        self.prior = check_choice(prior, "prior", GAUSSIAN_PRIORS)
        fits_normal = prior == "normal" and mechanism is None
        if method is not None and not fits_normal:
            raise ValueError("method chooses how gaussian_eb fits the normal prior: it needs "
                             "prior='normal' and no mechanism")
        self.method = (check_choice("mle" if method is None else method, "method",
                                    GAUSSIAN_METHODS) if fits_normal else None)
        self.prior_mean = (None if prior_mean is None else
                           check_real_scalar(prior_mean, "prior_mean", low=-MAX_ABS_MEAN,
                                             high=MAX_ABS_MEAN))
        self.prior_sd = (None if prior_sd is None else
                         check_real_scalar(prior_sd, "prior_sd", low=0.0, high=1e150))
        self.sigma_x = (None if sigma_x is None else
                        check_standard_deviation(sigma_x, "sigma_x"))
        self.n_grid = check_int_scalar(n_grid, "n_grid", minimum=2, maximum=10**7)
        self.variance, self.ucb_z = check_variance_rule(variance, ucb_z)
        if mechanism is not None and not isinstance(mechanism, Mechanism):
            raise TypeError(f"mechanism must be an ebfl.privacy Mechanism or None, got "
                            f"{type(mechanism).__name__}")
        self.mechanism = mechanism
        if prior == "npmle" and (prior_mean is not None or prior_sd is not None):
            raise ValueError("prior_mean and prior_sd fix a normal prior: they need "
                             "prior='normal'")
        if mechanism is not None:
            if prior != "normal":
                raise ValueError("a mechanism needs prior='normal' (the private estimator of "
                                 "Theorem 2)")
            if self.sigma_x is None:
                raise ValueError("a mechanism needs sigma_x (the private estimator's weight "
                                 "uses the known data noise)")
            if prior_mean is not None:
                raise ValueError("prior_mean is not used with a mechanism (the server "
                                 "averages the releases); leave it None")
            if self.prior_sd is not None:
                self.prior_sd = check_standard_deviation(self.prior_sd, "prior_sd",
                                                         zero_ok=True)
        self._releases = mechanism is not None
        self._has_variance = mechanism is None

    def config(self):
        mech = None
        if self.mechanism is not None:
            mech = {"type": type(self.mechanism).__name__}
            if is_dataclass(self.mechanism):  # ebfl's mechanisms: their parameters
                mech.update({f.name: getattr(self.mechanism, f.name)
                             for f in fields(self.mechanism) if f.init})
            else:
                mech["repr"] = repr(self.mechanism)
        return {"name": self.name, "prior": self.prior, "method": self.method,
                "prior_mean": self.prior_mean, "prior_sd": self.prior_sd,
                "sigma_x": self.sigma_x, "n_grid": self.n_grid, "mechanism": mech,
                "variance": self.variance, "ucb_z": self.ucb_z}

    def _check_data(self, data):
        if not isinstance(data, ClientMeans):
            raise TypeError(f"data must be a ClientMeans for {self.name}, got "
                            f"{type(data).__name__}")
        if self.sigma_x is not None and data.count is None:
            raise ValueError("data needs count: with sigma_x, s_i = sigma_x / sqrt(n_i)")
        if self.sigma_x is None and data.se is None and data.ssd is None:
            raise ValueError("data has neither se nor ssd and count, so no client knows its "
                             "standard error: pass sigma_x, or data with se or ssd")

    def _standard_errors(self, data, message=None):
        return _standard_errors(self.sigma_x, data, message)

    # ---- client: the summary
    def _reply(self, client, data, rc):
        x = data.mean
        if self.mechanism is not None:
            release = self._stored_release(client, rc, lambda generators: [
                self.mechanism.privatize(x[j:j + 1], g)[0] for j, g in enumerate(generators)])
            return {"release": release, "count": data.count.astype(np.float64)}
        if self.sigma_x is None and data.se is None:
            return {"mean": x.copy(), "ssd": data.ssd.copy(),
                    "count": data.count.astype(np.float64)}
        return {"mean": x.copy(), "se": np.array(self._standard_errors(data), np.float64)}

    # ---- server: the fit
    def _fit(self, replies, rc):
        if self.mechanism is not None:
            return self._fit_private(replies)
        x = replies["mean"]
        extra = {}
        if "se" in replies:
            s = replies["se"]
        else:
            sigma_x = _pooled_sigma_x(replies["ssd"], _as_int(replies["count"], "count"))
            s = check_standard_errors(sigma_x / np.sqrt(_as_int(replies["count"], "count")),
                                      "s = (estimated sigma_x) / sqrt(n_i)", x.size)
            extra = {"sigma_x": _scalar(sigma_x)}
        if self.prior == "npmle":
            res = npmle_normal(x, s, n_grid=self.n_grid)
            return ({"grid": res.grid, "weights": res.weights, **extra},
                    _npmle_info(res.grid, res.weights, res.converged))
        res = gaussian_eb(x, s, method=self.method, prior_mean=self.prior_mean,
                          prior_sd=self.prior_sd)
        info = {"prior_mean": res.prior.mean, "prior_sd": res.prior.sd,
                "converged": float(res.diagnostics.get("converged", True))}
        return {"mean": _scalar(res.prior.mean), "sd": _scalar(res.prior.sd), **extra}, info

    def _fit_private(self, replies):
        release = replies["release"]
        n = _as_int(replies["count"], "count")
        res = private_gaussian(release, n, _Released(release, self.mechanism),
                               sigma_x=self.sigma_x, sigma_theta=self.prior_sd,
                               variance=self.variance, ucb_z=self.ucb_z)
        prior = {"mean": _scalar(res.global_mean), "sd": _scalar(res.sigma_theta),
                 "sigma_q": _scalar(res.sigma_q), "count": _scalar(release.size)}
        return prior, {"prior_mean": res.global_mean, "prior_sd": res.sigma_theta}

    # ---- client: the posterior
    def _posterior(self, message, client, data):
        x = data.mean
        if self.mechanism is not None:
            weight = _theorem2_weight(_read(message, "sd"), _read(message, "sigma_q"),
                                      self.sigma_x, int(_read(message, "count")),
                                      data.count.astype(np.float64))
            mean = weight * x + (1.0 - weight) * _read(message, "mean")
            return mean, np.full(x.size, np.nan), weight
        s = self._standard_errors(data, message)
        if self.prior == "npmle":
            mean, var, _ = normal_grid_posterior(x, s, message["grid"], message["weights"])
            return mean, var, np.full(x.size, np.nan)
        res = gaussian_eb(x, s, prior_mean=_read(message, "mean"), prior_sd=_read(message, "sd"))
        return res.posterior.mean, res.posterior.var, res.shrinkage


def _standard_errors(sigma_x, data, message=None):
    """Each client's s_i: sigma_x / sqrt(n_i) (known sigma_x), its own se, or the
    pooled sigma_x of the prior message over sqrt(n_i)."""
    if sigma_x is not None:
        return sigma_x / np.sqrt(data.count)
    if data.se is not None:
        return data.se
    return _read(message, "sigma_x") / np.sqrt(data.count)


def _pooled_sigma_x(ssd, count):
    """sqrt(sum_i ssd_i / sum_i (n_i - 1)), as :func:`ebfl.gaussian_eb_samples` pools it."""
    dof = int(np.sum(count - 1))
    if dof == 0:
        raise ValueError("data: estimating sigma_x needs a client with at least 2 samples; "
                         "pass sigma_x")
    sigma_x = float(np.sqrt(np.sum(ssd) / dof))
    if sigma_x == 0.0:
        raise ValueError("data: all clients' samples are constant, so the sigma_x estimate is "
                         "0; pass sigma_x")
    return sigma_x


def _theorem2_weight(sigma_theta, sigma_q, sigma_x, m, n):
    """a = (st^2 + sq^2/(m-1)) / (st^2 + sq^2/(m-1) + sx^2/n), as
    :func:`ebfl.personalized_gaussian` computes it (in units of the largest scale)."""
    scale = max(sigma_theta, sigma_q, sigma_x)
    het = (sigma_theta / scale) ** 2 + (sigma_q / scale) ** 2 / (m - 1)
    if het > 0:
        return het / (het + (sigma_x / scale) ** 2 / n)
    return np.zeros_like(n)


# --------------------------------------------------------------------------- jobs


def job_algorithm(settings):
    """The protocol of an ``eb-*`` job of :mod:`ebfl.flower.jobs`.

    Without ``epsilon``: :class:`EBBetaBinomial` or :class:`EBGaussian` with
    their defaults. With ``epsilon`` (pure epsilon-LDP, user level): the
    Beta-Bernoulli clients release their means through the Laplace mechanism
    (the corrected estimator, ``privacy="laplace"``); the Gaussian clients
    through :class:`~ebfl.privacy.LaplaceMechanism` on the paper's clipping
    range for the simulated population (Theorem 2's estimator with the
    simulation's known sigma_x; the election shares have no known sigma_x).
    """
    epsilon = settings.get("epsilon")
    if settings["algorithm"] == "eb-beta-binomial":
        return (EBBetaBinomial() if epsilon is None
                else EBBetaBinomial(privacy="laplace", epsilon=float(epsilon)))
    if epsilon is None:
        return EBGaussian()
    if settings["dataset"] != "simulated":
        raise ValueError("eb-gaussian with epsilon needs dataset 'simulated': its private "
                         "estimator needs a known sigma_x, which the election shares lack")
    b = paper_clip_range(1.0, max(int(settings["clients"]), 2), SIMULATED_N,
                         SIMULATED_SIGMA_THETA, SIMULATED_SIGMA_X)
    return EBGaussian(sigma_x=SIMULATED_SIGMA_X, mechanism=LaplaceMechanism(float(epsilon), b))
