"""Algorithm 1 of the FedHDP paper: federated point estimation with heterogeneous privacy.

"Federated learning with heterogeneous differential privacy" (the FedHDP
paper, Section 3.1) studies N clients, each holding n_s samples::

    x_{j,i} = phi_j + v_{j,i},  v_{j,i} ~ N(0, n_s alpha^2),  phi_j = phi + p_j,
    p_j ~ N(0, tau^2)                                                (eqs. (5)-(6)),

so that a client's mean phi_hat_j ~ N(phi_j, alpha^2). Clients belong to
privacy groups: non-private ones upload psi_j = phi_hat_j, private ones
psi_j = phi_hat_j + l_j with l_j ~ N(0, N_p gamma^2), so that the average of
the N_p private uploads carries noise of variance gamma^2 (eq. (8)). The server
weights the two groups with the ratio r,

    theta* = [sum_np psi_i + r sum_p psi_i] / (N_np + r N_p),

and every client personalizes toward the global estimate with its lambda_j,
theta_j = (phi_hat_j + lambda_j theta*) / (1 + lambda_j) (eq. (48)). With l
groups, group i's per-client noise variance is N_i gamma_i^2 and its weight is
r_i / sum_k N_k r_k (eq. (64)).

:class:`FedHDPPointEstimation` is Algorithm 1 written as the two halves of a
:class:`~ebfl.federated.FederatedAlgorithm`, so it runs in process
(:func:`ebfl.federated.run`) and on Flower alike; :func:`simulate_point_estimation`
draws the clients' data of eqs. (5)-(6) and keeps the truth for evaluation.

Rounds (``n_rounds=2`` is a full run)
-------------------------------------
Algorithm 1's client takes one step of size eta = 1 on its loss, which lands
on phi_hat_j whatever the model it received, and uploads it with its noise;
its personal step needs the *global* estimate, which exists only once the
server has aggregated the uploads. So:

* round 0: the message is ``{"request": [0]}``; every client computes
  phi_hat_j, draws its privacy noise once (from its own stream, keyed by the
  run's seed, the round and its id) and replies ``{"psi": psi_j}``, keeping
  ``psi`` in its state. The server computes theta* from the replies that
  arrived (client-id order) and keeps it (``"global"``).
* round 1: the message is ``{"global": theta*}``; every client computes its
  personal estimate ``"personal"`` and replies nothing.
* later rounds repeat round 1 (idempotent): the uploads are not repeated, as
  fresh noise on the same phi_hat_j would spend privacy again, and Lemma 7
  of the paper notes that the estimates are stable after one round.

After two rounds the server state holds the paper's global estimate (eq.
(11)) and the client states the personal estimates (eq. (48)).

Every client takes part in every round (``all_clients_train``;
``clients_per_round`` is not used). A client that fails in round 0 is left out
of theta* (the weights are renormalized over the replies) and personalizes
when it next runs; if no reply with a positive weight arrives, the server
asks again next round, and clients that released before send the same
release again, never fresh noise.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    as_generator,
    check_choice,
    check_finite_array,
    check_int_scalar,
    check_probability,
    check_real_scalar,
)
from ebfl.federated.protocol import FederatedAlgorithm

__all__ = [
    "CENTERS",
    "FedHDPPointEstimation",
    "PointEstimationData",
    "job_algorithm",
    "job_data",
    "simulate_point_estimation",
]

#: Largest |x_{j,i}| (and |phi|): squares and products with lambda stay finite.
MAX_ABS_VALUE = 1e100
#: Largest privacy-noise variance, ratio and lambda accepted.
MAX_PARAMETER = 1e100
#: Where the personal step regularizes (see :class:`FedHDPPointEstimation`).
CENTERS = ("global", "printed")


def _scalar(value):
    """A one-element float64 array: how a scalar travels in messages and states."""
    return np.array([value], dtype=np.float64)


def _frozen(arr):
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class PointEstimationData:
    """The samples of m clients, n_s each (row j is client j), for :class:`FedHDPPointEstimation`.

    Parameters
    ----------
    samples : array_like, shape (m, n_s)
        x_{j,i}, finite, ``|x| <= 1e100``.
    truth : array_like, shape (m,), optional
        The clients' true phi_j (simulations): the evaluation then reports
        squared errors.
    phi : float, optional
        The true global parameter phi: the evaluation then reports the global
        estimate's squared error.
    groups : array_like of int, shape (m,), optional
        A privacy group per client (:func:`simulate_point_estimation`: 0 =
        non-private, 1 = private), to pass to the algorithm.

    Examples
    --------
    >>> data = PointEstimationData([[1.0, 3.0], [0.0, 1.0]], truth=[2.5, 0.0])
    >>> data.local_estimate.tolist(), data.n_clients, data.subset([1]).truth.tolist()
    ([2.0, 0.5], 2, [0.0])
    """

    samples: np.ndarray
    truth: np.ndarray | None = None
    phi: float | None = None
    groups: np.ndarray | None = None

    def __post_init__(self):
        x = check_finite_array(self.samples, "samples", ndim=2, max_abs=MAX_ABS_VALUE)
        if x.shape[1] < 1:
            raise ValueError(f"samples must hold at least one sample per client, got shape "
                             f"{x.shape}")
        m = x.shape[0]
        object.__setattr__(self, "samples", _frozen(x))
        if self.truth is not None:
            truth = check_finite_array(self.truth, "truth", ndim=1, min_len=0,
                                       max_abs=MAX_ABS_VALUE)
            if truth.shape != (m,):
                raise ValueError(f"truth must have shape ({m},), got {truth.shape}")
            object.__setattr__(self, "truth", _frozen(truth))
        if self.phi is not None:
            object.__setattr__(self, "phi", check_real_scalar(
                self.phi, "phi", low=-MAX_ABS_VALUE, high=MAX_ABS_VALUE))
        if self.groups is not None:
            object.__setattr__(self, "groups", _frozen(_groups_iv(self.groups, "groups", m)))

    @property
    def n_clients(self) -> int:
        return int(self.samples.shape[0])

    @property
    def n_samples(self) -> int:
        """n_s, the samples of every client."""
        return int(self.samples.shape[1])

    @property
    def local_estimate(self) -> np.ndarray:
        """phi_hat_j = (1/n_s) sum_i x_{j,i}, each client's own estimate (eq. (7))."""
        return self.samples.mean(axis=1)

    def subset(self, ids):
        """The clients ``ids`` (positions in this object), in that order."""
        rows = np.asarray(ids, dtype=np.int64).reshape(-1)
        return PointEstimationData(self.samples[rows],
                                   None if self.truth is None else self.truth[rows], self.phi,
                                   None if self.groups is None else self.groups[rows])


def _groups_iv(groups, name, m=None, n_groups=None):
    arr = np.asarray(groups)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer)
                             or (np.issubdtype(arr.dtype, np.floating)
                                 and np.all(np.isfinite(arr)) and np.all(arr == np.floor(arr)))):
        raise TypeError(f"{name} must be a 1-D array of integer group labels, got "
                        f"{arr.dtype} of shape {arr.shape}")
    arr = arr.astype(np.int64)
    if m is not None and arr.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},) (one label per client), got "
                         f"{arr.shape}")
    top = n_groups if n_groups is not None else np.inf
    if arr.size and (arr.min() < 0 or arr.max() >= top):
        accepted = f"[0, {n_groups - 1}]" if n_groups is not None else ">= 0"
        raise ValueError(f"{name} must hold labels in {accepted}, got values from "
                         f"{int(arr.min())} to {int(arr.max())}")
    return arr


def simulate_point_estimation(n_clients, rho, alpha2, tau2, n_samples, phi=0.0, rng=None):
    """Clients of the FedHDP paper's point-estimation model (eqs. (5)-(6)), truth kept.

    phi_j = phi + p_j with p_j ~ N(0, tau^2), and x_{j,i} = phi_j + v_{j,i} with
    v_{j,i} ~ N(0, n_s alpha^2), so phi_hat_j ~ N(phi_j, alpha^2). N_np =
    round(rho N) clients, chosen at random, opt out of privacy (group 0); the
    others are private (group 1).

    Parameters
    ----------
    n_clients : int
        N >= 1.
    rho : float
        rho_np in [0, 1], the fraction of non-private clients (N_np is the
        nearest integer to rho N, halves rounded up).
    alpha2 : float
        alpha^2 in [0, 1e100]: the variance of a client's mean (one sample has
        variance n_s alpha^2).
    tau2 : float
        tau^2 in [0, 1e100], the heterogeneity (0: IID clients).
    n_samples : int
        n_s >= 1.
    phi : float
        The global parameter.
    rng : None, int or numpy.random.Generator

    Returns
    -------
    PointEstimationData
        With ``truth`` (the phi_j), ``phi`` and ``groups``.

    Examples
    --------
    >>> data = simulate_point_estimation(20, 0.05, 1.0, 0.5, 10, phi=2.0, rng=0)
    >>> data.samples.shape, int((data.groups == 0).sum()), data.phi
    ((20, 10), 1, 2.0)
    """
    m = check_int_scalar(n_clients, "n_clients", minimum=1, maximum=10**8)
    rho = check_probability(rho, "rho")
    alpha2 = check_real_scalar(alpha2, "alpha2", low=0.0, high=MAX_PARAMETER)
    tau2 = check_real_scalar(tau2, "tau2", low=0.0, high=MAX_PARAMETER)
    n_s = check_int_scalar(n_samples, "n_samples", minimum=1, maximum=10**8)
    if m * n_s > 10**9:
        raise ValueError(f"n_clients * n_samples must be at most 1e9, got {m * n_s}")
    phi = check_real_scalar(phi, "phi", low=-MAX_ABS_VALUE, high=MAX_ABS_VALUE)
    rng = as_generator(rng)
    truth = phi + math.sqrt(tau2) * rng.standard_normal(m)
    samples = truth[:, None] + math.sqrt(n_s * alpha2) * rng.standard_normal((m, n_s))
    n_np = math.floor(rho * m + 0.5)
    groups = np.ones(m, dtype=np.int64)
    groups[rng.permutation(m)[:n_np]] = 0
    return PointEstimationData(samples, truth, phi, groups)


# --------------------------------------------------------------------------- the protocol


def _per_group(values, name, n_groups):
    arr = check_finite_array(np.atleast_1d(values), name, ndim=1)
    if arr.size == 1 and n_groups > 1:
        arr = np.full(n_groups, arr[0])
    if arr.shape != (n_groups,):
        raise ValueError(f"{name} must have one entry per group ({n_groups}), got "
                         f"{arr.shape[0]}")
    if np.any(arr < 0) or np.any(arr > MAX_PARAMETER):
        raise ValueError(f"{name} must lie in [0, {MAX_PARAMETER:g}], got values from "
                         f"{float(arr.min())!r} to {float(arr.max())!r}")
    return arr


class FedHDPPointEstimation(FederatedAlgorithm):
    """Algorithm 1 of the FedHDP paper: private and non-private clients estimate a mean.

    See the module docstring for the model and the rounds. Client j of group
    g uploads psi_j = phi_hat_j + N(0, N_g gamma_g^2) (N_g: the clients of its
    group), the server computes theta* = sum_i r_{g(i)} psi_i / sum_i r_{g(i)}
    over the replies, and the client keeps theta_j = (phi_hat_j + lambda_g c)
    / (1 + lambda_g), with c the centre chosen by ``center``.

    Parameters
    ----------
    groups : array_like of int, shape (m,)
        Each client's privacy group, in [0, l) (a boolean "is private" mask
        reads as groups 0 = non-private, 1 = private).
    noise_variances : array_like (l,)
        gamma_g^2 in [0, 1e100], the privacy-noise variance of the *average* of
        group g's uploads (0: non-private). Each client of the group adds noise
        of variance N_g gamma_g^2 (eq. (8): N_p gamma^2).
    ratios : float or array_like (l,)
        r_g in [0, 1e100], group g's weight per client relative to the others
        (eq. (64); the paper takes r = 1 for the non-private group and r in
        [0, 1] for the private one); only ratios matter. Replies of groups with
        r_g = 0 are ignored (r = 0: the non-private clients alone).
    lambdas : float or array_like (l,)
        lambda_g in [0, 1e100], the personalization of group g's clients (0:
        the local estimate; large: the global estimate).
    center : {"global", "printed"}
        What the personal step regularizes toward. ``"global"`` (default): the
        received global estimate theta*, giving eq. (48), the solution of the
        local FedHDP objective, as Lemma 7's proof requires. ``"printed"``:
        Algorithm 1 as printed in the paper, whose personal step
        theta_j <- theta_j - eta_j((theta_j - phi_hat_j) + lambda_j (theta_j -
        theta)) uses the client's *locally updated* theta = phi_hat_j; one step
        then gives theta_j = phi_hat_j for every lambda_j (no personalization).
        The printed line is an error of the paper (errata [FedHDP 4]); the
        variant is kept to show it.

    Notes
    -----
    Client state (one row per client): ``local`` (phi_hat_j), ``psi`` (its
    release, NaN until made), ``sent`` (the round it answered), ``personal``
    (theta_j, NaN until the global estimate arrives) and ``global`` (the
    estimate it personalized toward). Server state: ``global`` (theta*),
    ``fit_round`` and ``contributors``. The runtimes' aggregation weights
    (``client_weights``) are not used: every client holds n_s samples and the
    weights are the ratios'.

    Examples
    --------
    Two groups, as the paper (5% of 20 clients opt out), with Lemma 1's r*:

    >>> from ebfl.federated import RunConfig, run
    >>> data = simulate_point_estimation(20, 0.05, 1.0, 1.0, 10, rng=0)
    >>> gamma2, n_p = 0.5, int(data.groups.sum())
    >>> r_star = 2.0 / (2.0 + n_p * gamma2)   # sigma_c^2 / (sigma_c^2 + N_p gamma^2)
    >>> alg = FedHDPPointEstimation(data.groups, [0.0, gamma2], ratios=[1.0, r_star],
    ...                             lambdas=[1.0, 0.7])
    >>> res = run(alg, data, RunConfig(n_clients=20, n_rounds=2, seed=1))
    >>> psi, w = res.clients["psi"], np.where(data.groups == 1, r_star, 1.0)
    >>> bool(np.isclose(res.server["global"][0], np.sum(w * psi) / np.sum(w)))
    True
    >>> lam = np.where(data.groups == 1, 0.7, 1.0)
    >>> theta = (data.local_estimate + lam * res.server["global"][0]) / (1 + lam)
    >>> bool(np.allclose(res.clients["personal"], theta))
    True
    """

    name = "fedhdp-point"
    all_clients_train = True
    array_api = "numpy"

    def __init__(self, groups, noise_variances, *, ratios, lambdas, center="global"):
        gamma2 = check_finite_array(np.atleast_1d(noise_variances), "noise_variances", ndim=1)
        self.noise_variances = _per_group(gamma2, "noise_variances", gamma2.size)
        n_groups = self.noise_variances.size
        self.groups = _groups_iv(groups, "groups", n_groups=n_groups)
        if self.groups.size == 0:
            raise ValueError("groups must label at least one client")
        self.ratios = _per_group(ratios, "ratios", n_groups)
        self.lambdas = _per_group(lambdas, "lambdas", n_groups)
        self.center = check_choice(center, "center", CENTERS)
        self.group_sizes = np.bincount(self.groups, minlength=n_groups)
        if not np.any(self.ratios[self.groups] > 0):
            raise ValueError("ratios must give a positive weight to at least one client's group")
        # eq. (8): N_g gamma_g^2 per client, so that group g's average has variance gamma_g^2
        self._client_sd = np.sqrt(self.group_sizes[self.groups] * self.noise_variances[self.groups])
        if not np.all(np.isfinite(self._client_sd)):
            raise ValueError("noise_variances times the group sizes must stay finite")

    @classmethod
    def two_groups(cls, private, gamma2, *, ratio, lambda_np, lambda_p, center="global"):
        """The paper's main case: non-private (group 0) and private (group 1) clients.

        Parameters
        ----------
        private : array_like of bool, shape (m,)
        gamma2 : float
            gamma^2, the privacy-noise variance of the private average.
        ratio : float
            r, the private clients' weight relative to the non-private ones.
        lambda_np, lambda_p : float
            The two groups' personalization.
        center : {"global", "printed"}

        Examples
        --------
        >>> alg = FedHDPPointEstimation.two_groups([False, True, True], 0.5, ratio=0.2,
        ...                                        lambda_np=1.0, lambda_p=0.5)
        >>> alg.groups.tolist(), alg.noise_variances.tolist(), alg.ratios.tolist()
        ([0, 1, 1], [0.0, 0.5], [1.0, 0.2])
        """
        private = np.asarray(private)
        if private.dtype != bool:
            raise TypeError(f"private must be a boolean array, got dtype {private.dtype}")
        gamma2 = check_real_scalar(gamma2, "gamma2", low=0.0, high=MAX_PARAMETER)
        return cls(private.astype(np.int64), [0.0, gamma2],
                   ratios=[1.0, check_real_scalar(ratio, "ratio", low=0.0, high=MAX_PARAMETER)],
                   lambdas=[check_real_scalar(lambda_np, "lambda_np", low=0.0,
                                              high=MAX_PARAMETER),
                            check_real_scalar(lambda_p, "lambda_p", low=0.0,
                                              high=MAX_PARAMETER)],
                   center=center)

    def config(self):
        return {"name": self.name, "groups": self.groups.tolist(),
                "noise_variances": self.noise_variances.tolist(),
                "ratios": self.ratios.tolist(), "lambdas": self.lambdas.tolist(),
                "center": self.center}

    def _check_run(self, run):
        if run.n_clients != self.groups.size:
            raise ValueError(f"the run has {run.n_clients} clients but groups labels "
                             f"{self.groups.size}")

    # ---- server half
    def init_server(self, run):
        self._check_run(run)
        return {}

    def broadcast(self, server, rc):
        if "global" in server:
            return {"global": server["global"], "fit_round": server["fit_round"]}
        return {"request": _scalar(rc.round)}

    def evaluation_message(self, server):
        return {"global": server["global"]} if "global" in server else {}

    def aggregate(self, server, replies, weights, rc):
        if "global" in server or not replies:
            return server
        w = self.ratios[self.groups[rc.clients]]
        if not np.any(w > 0):
            warnings.warn(f"{self.name}: no client with a positive ratio replied in round "
                          f"{rc.round}; the server asks again next round", RuntimeWarning,
                          stacklevel=2)
            return server
        theta = float(np.sum(w * replies["psi"]) / np.sum(w))
        return {"global": _scalar(theta), "fit_round": _scalar(rc.round),
                "contributors": _scalar(rc.clients.size)}

    def summary(self, server):
        if "global" not in server:
            return {}
        return {"global": float(server["global"][0]),
                "contributors": float(server["contributors"][0])}

    # ---- client half
    def init_clients(self, run, data, clients):
        self._check_run(run)
        if not isinstance(data, PointEstimationData):
            raise TypeError(f"data must be a PointEstimationData for {self.name}, got "
                            f"{type(data).__name__}")
        k = len(clients)
        state = {key: np.full(k, np.nan) for key in ("psi", "sent", "personal", "global")}
        state["local"] = np.array(data.local_estimate, dtype=np.float64)
        return state

    def client_train(self, message, client, data, rc):
        if "request" in message:
            client["sent"][:] = message["request"]
            return {"psi": self._release(client, rc)}
        client["global"][:] = message["global"][0]
        client["personal"][:] = self._personal(client["local"], message["global"][0],
                                               self.lambdas[self.groups[rc.clients]])
        return {}

    def _release(self, client, rc):
        """psi_j = phi_hat_j + N(0, N_g gamma_g^2), drawn once per client and kept."""
        psi = client["psi"]
        new = np.isnan(psi)
        if new.any():
            # one draw from each client's own stream: the same alone or stacked
            draws = np.array([np.random.default_rng(s).standard_normal() for s in rc.seeds()])
            fresh = client["local"] + self._client_sd[rc.clients] * draws
            psi[new] = fresh[new]
        return psi.copy()

    def _personal(self, local, global_estimate, lam):
        """One personal step of size 1/(1 + lambda) (Lemma 7): its closed form, eq. (48)."""
        center = global_estimate if self.center == "global" else local  # "printed": theta
        return (local + lam * center) / (1.0 + lam)

    def client_evaluate(self, message, client, data):
        """Personal estimates; with the truth, squared errors of the personal, local and
        global estimates (NaN for clients without a personal estimate yet)."""
        k = client["personal"].size
        theta = float(message["global"][0]) if "global" in message else np.nan
        out = {}
        if data.truth is not None:
            out["squared_error"] = (client["personal"] - data.truth) ** 2
            out["local_squared_error"] = (client["local"] - data.truth) ** 2
            out["global_squared_error"] = (theta - data.truth) ** 2
        if data.phi is not None:
            out["server_squared_error"] = np.full(k, (theta - data.phi) ** 2)
        out["estimate"] = client["personal"].copy()
        return out


# --------------------------------------------------------------------------- jobs

#: The simulated population of the ``fedhdp-point`` job: alpha^2 = tau^2 = 1, n_s = 10, phi = 0.
JOB_ALPHA2, JOB_TAU2, JOB_N_SAMPLES, JOB_PHI = 1.0, 1.0, 10, 0.0
#: The job's defaults: half the clients opt out; gamma^2 = 1; lambda = alpha^2 / tau^2 (eq. (17)).
JOB_OPT_OUT, JOB_GAMMA2, JOB_LAMBDA = 0.5, 1.0, 1.0


def job_data(settings):
    """The clients of a ``fedhdp-point`` job of :mod:`ebfl.flower.jobs`.

    :func:`simulate_point_estimation` with ``clients`` clients, the fraction
    ``opt-out`` of them non-private (default 0.5), alpha^2 = tau^2 = 1, n_s =
    10, phi = 0, drawn with ``seed``.
    """
    if settings["dataset"] != "simulated":
        raise ValueError(f"fedhdp-point takes dataset 'simulated', got {settings['dataset']!r}")
    if settings.get("epsilon") is not None:
        raise ValueError("fedhdp-point does not use epsilon: its privacy is the noise "
                         "variance gamma2")
    rho = JOB_OPT_OUT if settings.get("opt-out") is None else settings["opt-out"]
    return simulate_point_estimation(int(settings["clients"]), rho, JOB_ALPHA2, JOB_TAU2,
                                     JOB_N_SAMPLES, JOB_PHI, int(settings["seed"]))


def job_algorithm(settings, data):
    """The protocol of a ``fedhdp-point`` job on its clients ``data``.

    :meth:`FedHDPPointEstimation.two_groups` with the data's groups,
    gamma^2 = ``gamma2`` (default 1), r = ``ratio`` (default Lemma 1's r* =
    sigma_c^2 / (sigma_c^2 + N_p gamma^2)) and lambda = ``lambda`` for both
    groups (default alpha^2 / tau^2 = 1, eq. (17)).
    """
    gamma2 = JOB_GAMMA2 if settings.get("gamma2") is None else float(settings["gamma2"])
    ratio = settings.get("ratio")
    if ratio is None:
        sigma_c2 = JOB_ALPHA2 + JOB_TAU2
        ratio = sigma_c2 / (sigma_c2 + int(np.sum(data.groups == 1)) * gamma2)
    lam = JOB_LAMBDA if settings.get("lambda") is None else float(settings["lambda"])
    return FedHDPPointEstimation.two_groups(data.groups == 1, gamma2, ratio=float(ratio),
                                            lambda_np=lam, lambda_p=lam)
