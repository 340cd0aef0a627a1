"""Federated empirical Bayes normal means: every prior family of :func:`ebfl.ebnm`.

Client i holds an estimate x_i of its parameter theta_i and the estimate's
standard error s_i (x_i ~ N(theta_i, s_i^2)); the population of the theta_i is
g, from one of ebnm's prior families (point-normal, point-Laplace, ash,
unimodal, NPMLE, ...). The server fits g by :func:`ebfl.ebnm` on the clients'
(x_i, s_i) and broadcasts it; each client then computes its own posterior under
g, with its own exact x_i and s_i, and keeps it. The rounds, the faults, the
stored releases and the random streams are those of :mod:`ebfl.federated.eb`
(read its module docstring): round 0 the clients reply, the server fits; round 1
the message is the prior and every client computes its posterior.

With a mechanism (``EBNormalMeans(mechanism=GaussianMechanism(...))``) a client
sends ``mechanism.privatize(x_i)`` (drawn once, from its own (seed, round,
client) stream, and sent again, never redrawn, if the server asks again) and s_i
in the clear; the release is x_i + N(0, sigma^2) when abs(x_i) <= b, so the server
fits g by ``ebnm(release, sqrt(s^2 + sigma^2))``, and each client still computes
its posterior from its exact x_i.

Messages (float64 arrays)
-------------------------
=======================  ==========================  ==========================================
protocol                 reply (per client)          prior message
=======================  ==========================  ==========================================
normal means             mean, se                    weights, kinds, a, b, mode, log_likelihood
normal means, pooled     mean, ssd, count            the same + sigma_x
private normal means     release, se                 weights, kinds, a, b, mode, log_likelihood
flat prior               mean, se                    (nothing: no prior to send)
=======================  ==========================  ==========================================

The prior is g's components (:class:`~ebfl.eb.normal_means.NormalMeansPrior`):
``kinds`` holds each component's kind as its index in
:data:`ebfl.eb.normal_means.prior.KINDS`; ``mode`` is absent where ebnm reports
none (npmle); a family's own ``parameters`` (the horseshoe's scale, ...) travel
as a nested dict of scalars where the prior has them. Every prior message also
carries ``fit_round``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import fields, is_dataclass

import numpy as np

from ebfl._validation import check_standard_deviation, check_standard_errors
from ebfl.eb.normal_means import prior as normal_means_prior
from ebfl.eb.normal_means.api import check_prior_options, ebnm
from ebfl.federated.eb import (
    _as_int,
    _EmpiricalBayes,
    _pooled_sigma_x,
    _scalar,
    _standard_errors,
)
from ebfl.federated.eb_data import (
    SIMULATED_N,
    SIMULATED_SIGMA_THETA,
    SIMULATED_SIGMA_X,
    ClientMeans,
)
from ebfl.privacy.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    paper_clip_range,
)

__all__ = ["EBNormalMeans", "job_algorithm"]

#: Mechanisms whose noise has the same variance for every input (``variance(x)`` is
#: ``max_variance`` everywhere), so that s_i^2 + sigma^2 is each release's variance.
CONSTANT_VARIANCE = (GaussianMechanism, LaplaceMechanism)
#: What every client keeps of its posterior (the fields of ebnm's posterior).
POSTERIOR = ("mean", "sd", "lfsr", "second_moment", "prob_zero")
#: delta of the ``eb-normal-means`` job's Gaussian mechanism when not given.
DEFAULT_DELTA = 1e-5


class EBNormalMeans(_EmpiricalBayes):
    """Empirical Bayes normal means, federated: (x_i, s_i) up, the prior g down.

    The server fits g from ``family`` by :func:`ebfl.ebnm` on the replies
    (client-id order) and broadcasts it; each client's posterior is then what
    ``ebnm`` returns for it in process (to rounding: the prior is rebuilt from
    the message, which renormalizes its weights).

    Parameters
    ----------
    family : str
        A prior family of :func:`ebfl.ebnm`
        (:data:`ebfl.eb.normal_means.FAMILIES`), default ``"point_normal"``.
        ``"flat"`` is improper: the server has nothing to fit nor to send
        (the clients still reply, so every family runs the same rounds), and
        each client's posterior is N(x_i, s_i^2) (lfsr Phi(-abs(x_i) / s_i)).
    mode : float or "estimate"
        The prior's mode, fixed or fitted (see :func:`ebfl.ebnm`).
    scale : "estimate", float or array_like
        The slab's scale, or the grid families' grid (see :func:`ebfl.ebnm`).
    sigma_x : float, optional
        Known data standard deviation, in [1e-100, 1e100]: s_i =
        sigma_x / sqrt(n_i) (the data need ``count``). None: each client's
        own ``se``, else (without a mechanism) sigma_x pooled over the
        clients from ``ssd`` and ``count`` (as :class:`~ebfl.federated.EBGaussian`).
    mechanism : GaussianMechanism or LaplaceMechanism, optional
        Local privacy: each client sends ``mechanism.privatize(x_i)`` and
        s_i (s_i in the clear, as the counts of the other private protocols;
        it must not be secret). The mechanism must add noise of the same
        variance sigma^2 to every input and release one number (``d=1``); the
        server fits ``ebnm(release, sqrt(s^2 + sigma^2))``, which is the
        exact likelihood for :class:`~ebfl.privacy.GaussianMechanism` (the
        Laplace mechanism's noise is treated as normal of its variance: an
        approximation). Each client's posterior uses its exact x_i and s_i.
        The guarantee is ``mechanism.privacy`` ((epsilon, delta)-LDP, user
        level: each client releases x_i once in the whole run). The
        mechanism clips x_i to [-b, b] before adding noise (that is part of
        its privacy); a client whose abs(x_i) > b releases a value biased
        towards 0 and the fit treats it as unbiased, so choose b to cover the
        data (:func:`ebfl.privacy.paper_clip_range`). Nothing is clipped
        anywhere else. Needs each client's s_i (``sigma_x`` or data with
        ``se``: pooling sigma_x would send the ssd in the clear), and a
        proper family (``"flat"`` learns nothing from the releases).

    Attributes
    ----------
    privacy : PrivacyGuarantee or None
        What a client's release guarantees (``mechanism.privacy``); None
        without a mechanism. Reported in ``config()`` and, as ``epsilon`` and
        ``delta``, in every history row.

    Notes
    -----
    Client state: the posterior's ``mean``, ``sd``, ``lfsr``,
    ``second_moment`` and ``prob_zero`` (NaN until computed), ``sent`` and,
    with a mechanism, ``release``. The server's prior is
    ``fitted_g(run_result.server)``. One-dimensional data only.

    Examples
    --------
    >>> from ebfl import ebnm
    >>> from ebfl.federated import RunConfig, run, simulated_means
    >>> data = simulated_means(100, 15, seed=0)
    >>> alg = EBNormalMeans("point_laplace", sigma_x=0.5)
    >>> res = run(alg, data, RunConfig(n_clients=100, n_rounds=2))
    >>> direct = ebnm(data.mean, 0.5 / np.sqrt(data.count), "point_laplace")
    >>> float(np.max(np.abs(res.clients["mean"] - direct.posterior.mean))) < 1e-12
    True

    Private, with the Gaussian mechanism at (1, 1e-5)-LDP:

    >>> from ebfl.privacy import GaussianMechanism
    >>> mech = GaussianMechanism(1.0, 1e-5, b=2.0, calibration="l2")
    >>> alg = EBNormalMeans(sigma_x=0.5, mechanism=mech)
    >>> res = run(alg, data, RunConfig(n_clients=100, n_rounds=2))
    >>> alg.privacy
    PrivacyGuarantee(epsilon=1.0, delta=1e-05)
    """

    name = "eb-normal-means"

    def __init__(self, family="point_normal", *, mode=0, scale="estimate", sigma_x=None,
                 mechanism=None):
        # ebnm's own checks, under this class's argument names
        self.family, self.mode, self.scale = check_prior_options(family, mode, scale,
                                                                 family_name="family")
        if isinstance(self.scale, np.ndarray):
            self.scale.setflags(write=False)  # a new array (np.unique): the caller's is apart
        self.sigma_x = (None if sigma_x is None else
                        check_standard_deviation(sigma_x, "sigma_x"))
        self.mechanism = _check_mechanism(mechanism, self.family)
        self._releases = mechanism is not None

    @property
    def privacy(self):
        return None if self.mechanism is None else self.mechanism.privacy

    def config(self):
        scale = self.scale if isinstance(self.scale, str | float) else self.scale.tolist()
        privacy = self.privacy
        return {"name": self.name, "family": self.family, "mode": self.mode, "scale": scale,
                "sigma_x": self.sigma_x, "mechanism": _mechanism_config(self.mechanism),
                "privacy": None if privacy is None else {"epsilon": privacy.epsilon,
                                                         "delta": privacy.delta}}

    def summary(self, server):
        out = super().summary(server)
        if self.mechanism is not None:  # in every row, fitted or not
            out.update(epsilon=self.privacy.epsilon, delta=self.privacy.delta)
        return out

    def fitted_g(self, server):
        """The prior in a server state (``run(...).server``), as a NormalMeansPrior.

        None before the fit and for the flat prior (which has none).
        """
        message = server.get("prior") if isinstance(server, dict) else None
        if message is None or "weights" not in message:
            return None
        return _prior_of(message, self.family)

    def _check_data(self, data):
        if not isinstance(data, ClientMeans):
            raise TypeError(f"data must be a ClientMeans for {self.name}, got "
                            f"{type(data).__name__}")
        if self.sigma_x is not None:
            if data.count is None:
                raise ValueError("data needs count: with sigma_x, s_i = sigma_x / sqrt(n_i)")
        elif data.se is None:
            if self.mechanism is not None:
                raise ValueError("with a mechanism every client needs its own s_i: pass "
                                 "sigma_x, or data with se (pooling sigma_x would send each "
                                 "client's ssd in the clear)")
            if data.ssd is None:
                raise ValueError("data has neither se nor ssd and count, so no client knows "
                                 "its standard error: pass sigma_x, or data with se or ssd")

    def _standard_errors(self, data, message=None):
        return _standard_errors(self.sigma_x, data, message)

    # ---- client half
    def init_clients(self, run, data, clients):
        self._check_data(data)
        state = {key: np.full(len(clients), np.nan) for key in ("sent", *POSTERIOR)}
        if self._releases:
            state["release"] = np.full(len(clients), np.nan)
        return state

    def client_train(self, message, client, data, rc):
        if "request" in message:
            reply = self._reply(client, data, rc)
            client["sent"][:] = message["request"]
            return reply
        posterior = self._posterior(message, client, data)
        for key in POSTERIOR:
            client[key][:] = getattr(posterior, key)
        return {}

    def client_evaluate(self, message, client, data):
        """Posterior means, sds and lfsr; squared errors, and the local estimate's, when the
        data know the truth. NaN for clients without a posterior yet."""
        out = {"estimate": client["mean"].copy(), "sd": client["sd"].copy(),
               "lfsr": client["lfsr"].copy()}
        if data.truth is not None:
            out["squared_error"] = (client["mean"] - data.truth) ** 2
            out["local_squared_error"] = (data.local_estimate - data.truth) ** 2
        return out

    def _reply(self, client, data, rc):
        x = data.mean
        if self.mechanism is not None:
            release = self._stored_release(client, rc, lambda generators: [
                self.mechanism.privatize(x[j:j + 1], g)[0] for j, g in enumerate(generators)])
            return {"release": release,
                    "se": np.array(self._standard_errors(data), dtype=np.float64)}
        if self.sigma_x is None and data.se is None:
            return {"mean": x.copy(), "ssd": data.ssd.copy(),
                    "count": data.count.astype(np.float64)}
        return {"mean": x.copy(), "se": np.array(self._standard_errors(data), dtype=np.float64)}

    def _posterior(self, message, client, data):
        """ebnm's posterior of each client of the stack under the broadcast prior."""
        x, s = data.mean, self._standard_errors(data, message)
        if self.family == "flat":
            return ebnm(x, s, "flat").posterior
        return ebnm(x, s, self.family, g_init=_prior_of(message, self.family),
                    fix_g=True).posterior

    # ---- server half
    def _fit(self, replies, rc):
        extra = {}
        if self.mechanism is not None:
            x = replies["release"]
            se = check_standard_errors(replies["se"], "reply 'se'", x.size)
            # each release is x_i + noise: variance s_i^2 + sigma^2 (the mechanism's, the
            # same for every input)
            s = check_standard_errors(np.sqrt(se**2 + self.mechanism.max_variance),
                                      "s = sqrt(se^2 + mechanism variance)", x.size)
        elif "ssd" in replies:
            x = replies["mean"]
            count = _as_int(replies["count"], "count")
            sigma_x = _pooled_sigma_x(replies["ssd"], count)
            s = check_standard_errors(sigma_x / np.sqrt(count),
                                      "s = (estimated sigma_x) / sqrt(n_i)", x.size)
            extra = {"sigma_x": _scalar(sigma_x)}
        else:
            x, s = replies["mean"], replies["se"]
        res = ebnm(x, s, self.family, self.mode, self.scale)
        if res.fitted_g is None:  # flat: no prior, no likelihood
            return extra, {}
        g = res.fitted_g
        message = {**_prior_message(g), "log_likelihood": _scalar(res.log_likelihood), **extra}
        info = {"log_likelihood": res.log_likelihood, "prior_mean": g.mean,
                "converged": float(bool(res.diagnostics.get("converged", True)))}
        if res.mode is not None:
            message["mode"] = _scalar(res.mode)
            info["mode"] = res.mode
        return message, info


def _check_mechanism(mechanism, family):
    """A mechanism the protocol can fit through: constant noise variance, one number."""
    if mechanism is None:
        return None
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be an ebfl.privacy Mechanism or None, got "
                        f"{type(mechanism).__name__}")
    if not isinstance(mechanism, CONSTANT_VARIANCE):
        raise ValueError(f"mechanism must add noise of the same variance to every input "
                         f"(GaussianMechanism or LaplaceMechanism), got "
                         f"{type(mechanism).__name__}, whose variance depends on the input: "
                         f"the fit's s_i^2 + sigma^2 would be wrong")
    if mechanism.d != 1:
        raise ValueError(f"mechanism.d must be 1 (each client releases one number), got "
                         f"{mechanism.d}")
    if family == "flat":
        raise ValueError("family='flat' has nothing to fit, so a mechanism would spend privacy "
                         "for nothing: use mechanism=None")
    return mechanism


def _mechanism_config(mechanism):
    """The mechanism's type and constructor arguments (JSON-able), or None."""
    if mechanism is None:
        return None
    out = {"type": type(mechanism).__name__}
    if is_dataclass(mechanism):
        out.update({f.name: getattr(mechanism, f.name) for f in fields(mechanism) if f.init})
    return out


def _prior_message(g):
    """A NormalMeansPrior as float64 arrays: kinds as indices into KINDS (read now, so a
    kind added to KINDS travels without a change here)."""
    kinds = normal_means_prior.KINDS
    message = {"weights": np.array(g.weights, dtype=np.float64),
               "kinds": np.array([kinds.index(k) for k in g.kinds], dtype=np.float64),
               "a": np.array(g.a, dtype=np.float64), "b": np.array(g.b, dtype=np.float64)}
    parameters = {key: _scalar(value) for key, value in
                  (getattr(g, "parameters", None) or {}).items()
                  if isinstance(value, numbers.Real) and math.isfinite(value)}
    if parameters:  # display only (the components define the prior)
        message["parameters"] = parameters
    return message


def _prior_of(message, family):
    """The NormalMeansPrior of a prior message (its checks refuse a damaged one)."""
    kinds = normal_means_prior.KINDS
    codes = np.asarray(message["kinds"], dtype=np.float64)
    if not np.all((codes == np.floor(codes)) & (codes >= 0) & (codes < len(kinds))):
        raise ValueError(f"message 'kinds' must hold indices into KINDS {kinds}")
    extra = {}
    if "parameters" in message:
        extra["parameters"] = {key: float(v[0]) for key, v in message["parameters"].items()}
    return normal_means_prior.NormalMeansPrior(
        message["weights"], tuple(kinds[int(c)] for c in codes), message["a"], message["b"],
        family, **extra)


# --------------------------------------------------------------------------- jobs


def job_algorithm(settings):
    """The protocol of the ``eb-normal-means`` job of :mod:`ebfl.flower.jobs`.

    ``family`` (default ``"point_normal"``); s_i from the simulation's known
    sigma_x on ``simulated`` data, from sigma_x pooled over the counties on
    ``elections``. With ``epsilon``: the clients release their means through
    :class:`~ebfl.privacy.GaussianMechanism` at (``epsilon``, ``delta``)-LDP
    (``delta`` default 1e-5; the ``"l2"`` calibration, so the guarantee is the
    one requested), clipped to the paper's range for the simulated population
    (:func:`~ebfl.privacy.paper_clip_range` with mu in [-1, 1]); only on
    ``simulated`` data (the election shares have no known s_i to send).
    """
    family = settings.get("family") or "point_normal"
    epsilon = settings.get("epsilon")
    simulated = settings["dataset"] == "simulated"
    sigma_x = SIMULATED_SIGMA_X if simulated else None
    if epsilon is None:
        return EBNormalMeans(family, sigma_x=sigma_x)
    if not simulated:
        raise ValueError("eb-normal-means with epsilon needs dataset 'simulated': each client "
                         "sends its s_i, which the election shares only have through a pooled "
                         "sigma_x")
    delta = settings.get("delta")
    b = paper_clip_range(1.0, max(int(settings["clients"]), 2), SIMULATED_N,
                         SIMULATED_SIGMA_THETA, SIMULATED_SIGMA_X)
    mechanism = GaussianMechanism(float(epsilon), DEFAULT_DELTA if delta is None else
                                  float(delta), b, calibration="l2")
    return EBNormalMeans(family, sigma_x=SIMULATED_SIGMA_X, mechanism=mechanism)
