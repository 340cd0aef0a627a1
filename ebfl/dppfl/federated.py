"""DP-PFL as a federated protocol: Algorithm 1 run in process or on Flower.

:class:`DPPFL` writes Algorithm 1 of DP-PFL (Hu et al., IEEE IoT J. 2020) as
the two halves of a :class:`~ebfl.federated.FederatedAlgorithm`, so that the
same object runs in process (:func:`ebfl.federated.run`) and on Flower
(:mod:`ebfl.flower.runtime`). One protocol round is one global iteration:

1. the server broadcasts the models W = Omega V / (2 lambda) (line 10 of
   Algorithm 1, recomputed from V, the sum of every device's uploads) and the
   diagonal of Omega;
2. every device decides from its own random stream whether it drops out of the
   iteration; if not, it solves its subproblem (7) approximately by SDCA,
   updates its dual variables alpha_t (line 5) and replies its upload u_t
   (lines 6-7, with the Gaussian noise of Theorem 5 when private);
3. the server adds each upload to its device's row of V and, after every K-th
   iteration, takes the Omega-step (eq. (2)-(3), line 13) on the most recent W.

The devices draw every random number (dropping, local iteration count, SDCA
coordinates, noise) from the streams of the private ``ebfl.dppfl._kernels``, keyed by
(seed, iteration, device, purpose), and run the very kernel of
:func:`ebfl.dppfl.fit_dppfl`; so a run of ``K H`` rounds gives the same V,
Omega and alpha as ``fit_dppfl(..., inner=K, outer=H)`` with the same seed.

Simulation simplifications
--------------------------
* The broadcast carries every device's model (all of W) and the whole diagonal
  of Omega, since the protocol sends one message to all devices; Algorithm 1
  sends device t only its block w_t and Omega_tt. A device reads only its own
  row.
* A dropped device replies an all-zero upload with ``active = 0``, which the
  server ignores; on a real deployment it would send nothing.
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import (
    check_bool,
    check_choice,
    check_int_scalar,
    check_positive_scalar,
    check_probability,
    check_real_scalar,
)
from ebfl.dppfl import _kernels
from ebfl.dppfl._checks import check_lam, check_sizes
from ebfl.dppfl.algorithm import (
    _LOSS_CODES,
    _S2_MODES,
    PrivacySetting,
    _n_min_iv,
    _omega_iv,
    _size_iv,
    dual_sensitivity,
    noise_multipliers,
)
from ebfl.dppfl.objective import LOSSES, loss_values, omega_step
from ebfl.federated.protocol import FederatedAlgorithm

__all__ = ["DPPFL", "job_algorithm", "job_data"]


def _scalar(value):
    """A one-element float64 array: how a scalar travels (Flower makes 0-d arrays 1-d)."""
    return np.array([value], dtype=np.float64)


class DPPFL(FederatedAlgorithm):
    """Algorithm 1 of DP-PFL (Hu et al., IEEE IoT J. 2020) as a federated protocol.

    One round is one global iteration; run ``K H`` rounds for Algorithm 1's
    K inner and H outer iterations. The parameters are those of
    :func:`ebfl.dppfl.fit_dppfl`, and a run equals that function's fit with
    the same seed (see the module docstring).

    Parameters
    ----------
    sizes : array_like of int, shape (m,)
        Every device's number of training rows n_t >= 1 (the data's
        ``sizes``): they set the default n_min, the width of the dual-variable
        state and each device's noise. At most 10,000 devices.
    n_features : int
        d >= 1, the length of each model; m d at most 10**8.
    lam : float
        lambda of problem (1), in [1e-100, 1e100].
    xi : float
        The aggregation parameter in (0, 1]; beta = xi m (Lemma 1's choice).
    inner : int
        K >= 1: the server takes the Omega-step after every K rounds.
    loss : {"hinge", "smoothed_hinge", "squared"}
    gamma : float
        Smoothing of the smoothed hinge, > 0.
    tau : float in [0, 1]
        Device variability: each device's SDCA iterations per round are
        uniform on the integers round((1 - tau) n_min)..n_min.
    drop_probability : float in [0, 1)
        P(theta = 1): each device drops out of each round independently.
    privacy : PrivacySetting, optional
        None: the non-private baseline. Else every device calibrates its noise
        once, at the start, by Theorem 5's recipe for the run's number of
        rounds, exactly as :func:`~ebfl.dppfl.fit_dppfl` does.
    omega : "learn" or ndarray (m, m)
        "learn": start at I / m and take the Omega-step every K rounds; a
        symmetric positive semidefinite matrix of trace 1: keep it fixed.
    noisy_alpha : bool
        Update alpha_t with the noisy Delta alpha_t (Algorithm 1 as printed
        adds the clean one).
    n_min : int, optional
        The largest local iteration count, in [1, min(sizes)] (default: the
        smallest size).

    Notes
    -----
    Server state: ``V`` (m, d), the sum of each device's uploads;
    ``omega`` (m, m); ``iteration``, the rounds done. Broadcast: ``W``
    (m, d) and ``omega_diag`` (m,). Reply of each device: ``upload`` (d,)
    and ``active`` (1 if it took part, 0 if it dropped out). Client state
    (one row per device): ``device`` (its id), ``alpha`` (its dual
    variables, padded with zeros to the largest n_t: row t holds alpha_t in
    its first n_t entries; see :meth:`dual_variables`), ``dual_noise_std``
    (s1 sigma1) and ``sigma2`` (0 without privacy), ``releases`` (rounds it
    took part in) and ``s2_sum`` (the sum of its upload sensitivities).
    Metrics: each device's ``train_loss`` (mean loss over its training rows)
    and, when the data have a test split, ``test_error`` of sign(w_t^T x)
    (sign(0) counts as +1). The history's ``iteration`` is the number of
    global iterations done.

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.dppfl.algorithm import fit_dppfl
    >>> from ebfl.dppfl.data import DeviceData, l2_normalize
    >>> from ebfl.federated import RunConfig, run
    >>> rng = np.random.default_rng(0)
    >>> xs = [l2_normalize(rng.normal(size=(30, 4))) for _ in range(3)]
    >>> data = DeviceData.from_lists(xs, [np.where(x[:, 0] > 0, 1.0, -1.0) for x in xs])
    >>> alg = DPPFL.for_data(data, lam=0.1, inner=5, tau=0.5, drop_probability=0.2)
    >>> res = run(alg, data, RunConfig(n_clients=3, n_rounds=10, seed=4))
    >>> fit = fit_dppfl(data, lam=0.1, inner=5, outer=2, tau=0.5, drop_probability=0.2,
    ...                 seed=4, parallel=False)
    >>> bool(np.allclose(res.server["V"], fit.V, atol=1e-12, rtol=0))
    True
    >>> bool(np.allclose(alg.dual_variables(res.clients), fit.alpha, atol=1e-12, rtol=0))
    True
    """

    name = "dp-pfl"
    #: Every device is asked every round; dropping out is each device's own draw.
    all_clients_train = True
    #: The Omega-step falls due even in a round where no reply arrived (all failed).
    aggregate_empty = True
    array_api = "numpy"

    def __init__(self, sizes, n_features, *, lam, xi=0.5, inner=2000, loss="hinge", gamma=1.0,
                 tau=0.0, drop_probability=0.0, privacy=None, omega="learn", noisy_alpha=False,
                 n_min=None):
        self.sizes = check_sizes(sizes)
        m = self.sizes.size
        self.n_features = check_int_scalar(n_features, "n_features", minimum=1)
        _size_iv(m, self.n_features, "sizes", "n_features")
        self.lam = check_lam(lam)
        self.xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
        self.inner = check_int_scalar(inner, "inner", minimum=1)
        self.loss = check_choice(loss, "loss", LOSSES)
        self.gamma = check_positive_scalar(gamma, "gamma")
        self.tau = check_real_scalar(tau, "tau", low=0.0, high=1.0)
        self.drop_probability = check_probability(drop_probability, "drop_probability")
        if self.drop_probability >= 1.0:
            raise ValueError("drop_probability must be in [0, 1): at 1 no device ever takes part")
        if privacy is not None and not isinstance(privacy, PrivacySetting):
            raise TypeError(f"privacy must be a PrivacySetting or None, got "
                            f"{type(privacy).__name__}")
        if privacy is not None and privacy.dual_sensitivity == "box" and self.loss == "squared":
            raise ValueError("privacy.dual_sensitivity='box' needs dual variables in a box: "
                             "loss 'hinge' or 'smoothed_hinge', got 'squared'")
        self.privacy = privacy
        self.fixed_omega = _omega_iv(omega, m)
        self.noisy_alpha = check_bool(noisy_alpha, "noisy_alpha")
        self.n_min = int(self.sizes.min()) if n_min is None else _n_min_iv(n_min, self.sizes)
        self.beta = self.xi * m  # Lemma 1's choice, as fit_dppfl

    @classmethod
    def for_data(cls, data, **kwargs):
        """The protocol for ``data`` (a :class:`~ebfl.dppfl.DeviceData`): its sizes and d.

        Keyword arguments are those of :class:`DPPFL`.

        Examples
        --------
        >>> from ebfl.dppfl.data import DeviceData
        >>> data = DeviceData.from_lists([[[1.0, 0.0]], [[0.0, 1.0], [0.6, 0.8]]], [[1], [-1, 1]])
        >>> alg = DPPFL.for_data(data, lam=0.1)
        >>> alg.sizes.tolist(), alg.n_features, alg.n_min, alg.beta
        ([1, 2], 2, 1, 1.0)
        """
        from ebfl.dppfl.data import DeviceData

        if not isinstance(data, DeviceData):
            raise TypeError(f"data must be a DeviceData, got {type(data).__name__}")
        return cls(data.sizes, data.n_features, **kwargs)

    @property
    def n_clients(self):
        """m, the number of devices."""
        return self.sizes.size

    def config(self):
        return {"name": self.name, "sizes": self.sizes.tolist(), "n_features": self.n_features,
                "lam": self.lam, "xi": self.xi, "beta": self.beta, "inner": self.inner,
                "loss": self.loss, "gamma": self.gamma, "tau": self.tau,
                "drop_probability": self.drop_probability,
                "privacy": None if self.privacy is None else self.privacy.to_dict(),
                "omega": "learn" if self.fixed_omega is None else self.fixed_omega.tolist(),
                "noisy_alpha": self.noisy_alpha, "n_min": self.n_min}

    def _check_run(self, run):
        if run.n_clients != self.n_clients:
            raise ValueError(f"the run has {run.n_clients} clients but sizes lists "
                             f"{self.n_clients} devices")

    def models(self, server):
        """W = Omega V / (2 lambda) (m, d): row t is device t's model w_t (eq. (6))."""
        return server["omega"] @ server["V"] / (2.0 * self.lam)

    def dual_variables(self, clients):
        """Every device's alpha_t, concatenated in the data's layout: shape (n,).

        ``clients`` is the client state of all m devices in id order (e.g.
        ``run(...).clients``).
        """
        try:
            alpha = np.asarray(clients["alpha"], dtype=np.float64)
        except (TypeError, KeyError, IndexError, ValueError) as exc:
            raise TypeError("clients must be the client state of a run (a mapping with the "
                            "devices' 'alpha')") from exc
        if alpha.shape != (self.n_clients, int(self.sizes.max())):
            raise ValueError(f"clients['alpha'] must have shape "
                             f"({self.n_clients}, {int(self.sizes.max())}) (every device), got "
                             f"{alpha.shape}")
        return alpha[np.arange(alpha.shape[1]) < self.sizes[:, None]]

    # ---- server half
    def init_server(self, run):
        self._check_run(run)
        m = self.n_clients
        omega = np.eye(m) / m if self.fixed_omega is None else self.fixed_omega.copy()
        return {"V": np.zeros((m, self.n_features)), "omega": omega, "iteration": _scalar(0)}

    def broadcast(self, server, rc):
        return {"W": self.models(server), "omega_diag": np.diag(server["omega"]).copy()}

    def evaluation_message(self, server):
        return {"W": self.models(server)}

    def aggregate(self, server, replies, weights, rc):
        V = server["V"].copy()
        if replies is not None:
            took_part = np.asarray(replies["active"]) > 0  # dropped devices' zeros ignored
            V[rc.clients[took_part]] += replies["upload"][took_part]
        done = rc.round + 1
        omega = server["omega"]
        if self.fixed_omega is None and done % self.inner == 0:
            # line 13: the Omega-step on the most recent W, as fit_dppfl takes it
            omega = omega_step(omega @ V / (2.0 * self.lam), previous=omega)
        return {"V": V, "omega": omega, "iteration": _scalar(done)}

    def summary(self, server):
        return {"iteration": int(server["iteration"][0])}

    # ---- client half
    def init_clients(self, run, data, clients):
        from ebfl.dppfl.data import DeviceData

        self._check_run(run)
        if not isinstance(data, DeviceData):
            raise TypeError(f"data must be a DeviceData for {self.name}, got "
                            f"{type(data).__name__}")
        ids = np.asarray(clients, dtype=np.int64)
        if not np.array_equal(data.sizes, self.sizes[ids]) or data.n_features != self.n_features:
            raise ValueError(f"data does not fit the protocol: devices {ids.tolist()} have "
                             f"sizes {data.sizes.tolist()} and {data.n_features} features, the "
                             f"protocol expects {self.sizes[ids].tolist()} and "
                             f"{self.n_features}")
        k = ids.size
        dual_std, sigma2 = np.zeros(self.n_clients), np.zeros(self.n_clients)
        if self.privacy is not None:
            sigma1, sigma2, _ = noise_multipliers(self.privacy, self.sizes, self.n_min,
                                                  self.tau, self.drop_probability, run.n_rounds)
            dual_std = dual_sensitivity(self.lam, self.beta, self.sizes,
                                        self.privacy.dual_sensitivity) * sigma1
        return {"device": ids.astype(np.float64), "alpha": np.zeros((k, int(self.sizes.max()))),
                "dual_noise_std": dual_std[ids], "sigma2": sigma2[ids],
                "releases": np.zeros(k), "s2_sum": np.zeros(k)}

    def client_train(self, message, client, data, rc):
        k, d = len(rc.clients), self.n_features
        reply = {"upload": np.zeros((k, d)), "active": np.zeros(k)}
        seed, round_ = np.uint64(rc.config.seed), int(rc.round)
        scale = 1.0 / (2.0 * self.lam)
        s2_mode = _S2_MODES[self.privacy.upload_sensitivity] if self.privacy else 0
        for j, device in enumerate(int(t) for t in rc.clients):
            if _kernels.is_dropped(seed, round_, device, self.drop_probability):
                continue  # replies zeros with active = 0 (on a deployment: nothing)
            lo, hi = int(data.offsets[j]), int(data.offsets[j + 1])
            X, n_t = data.X[lo:hi], hi - lo
            n_iter = _kernels.local_iterations(seed, round_, device, self.n_min, self.tau)
            c = self.beta * float(message["omega_diag"][device]) * scale
            s2 = _kernels.device_round(
                X, data.y[lo:hi], np.einsum("ij,ij->i", X, X), 0, n_t, client["alpha"][j, :n_t],
                np.ascontiguousarray(message["W"][device]), c, self.xi, _LOSS_CODES[self.loss],
                self.gamma, n_iter, seed, round_, device, float(client["dual_noise_std"][j]),
                float(client["sigma2"][j]), s2_mode, self.privacy is not None, self.noisy_alpha,
                np.empty(n_t), np.empty(n_t), reply["upload"][j])
            reply["active"][j] = 1.0
            client["releases"][j] += 1.0
            client["s2_sum"][j] += s2
        return reply

    def client_evaluate(self, message, client, data):
        """Per device: the mean training loss and, with a test split, the test error."""
        W = message["W"][client["device"].astype(np.int64)]
        out = {"train_loss": _per_device(loss_values(_scores(data.X, W, data.offsets), data.y,
                                                     self.loss, self.gamma), data.offsets)}
        if data.X_test is not None:
            scores = _scores(data.X_test, W, data.test_offsets)
            wrong = (np.where(scores >= 0.0, 1.0, -1.0) != data.y_test).astype(np.float64)
            out["test_error"] = _per_device(wrong, data.test_offsets)
        return out


def _scores(X, W, offsets):
    """w_t^T x for every row x of device t (row t of ``W`` for the rows of device t)."""
    rows = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    return np.einsum("ij,ij->i", X, W[rows])


def _per_device(values, offsets):
    """The mean of ``values`` over each device's rows (every device has rows)."""
    return np.add.reduceat(values, offsets[:-1]) / np.diff(offsets)


# --------------------------------------------------------------------------- the job

#: The ``dp-pfl`` job of :mod:`ebfl.flower.jobs`: simulated devices and the
#: heterogeneous scenario of Figure 2(c) (tau = 0.5, P(theta = 1) = 0.2).
JOB_FEATURES, JOB_ROWS, JOB_TEST_ROWS = 8, (20, 40), 10
JOB_LAMBDA, JOB_XI, JOB_INNER, JOB_TAU, JOB_DROP = 0.1, 0.5, 10, 0.5, 0.2


def job_data(settings):
    """The devices of a ``dp-pfl`` job: ``clients`` simulated linear-SVM tasks.

    Device t holds 20 to 40 training and 10 test rows of 8 standard normal
    features, l2-normalized, labelled by sign(x^T w_t) with 5 % of the labels
    flipped; the models w_t = w_0 + e_t share a standard normal w_0 and
    differ by e_t ~ N(0, I / 4). Drawn with ``seed``.
    """
    from ebfl.dppfl.data import DeviceData, l2_normalize

    if settings["dataset"] != "simulated":
        raise ValueError(f"dp-pfl takes dataset 'simulated', got {settings['dataset']!r}")
    m, rng = int(settings["clients"]), np.random.default_rng(int(settings["seed"]))
    w0 = rng.standard_normal(JOB_FEATURES)
    xs, ys, xs_test, ys_test = [], [], [], []
    for n in rng.integers(JOB_ROWS[0], JOB_ROWS[1] + 1, size=m):
        w = w0 + 0.5 * rng.standard_normal(JOB_FEATURES)
        X = l2_normalize(rng.standard_normal((n + JOB_TEST_ROWS, JOB_FEATURES)))
        y = np.where(X @ w >= 0.0, 1.0, -1.0) * np.where(rng.random(len(X)) < 0.05, -1.0, 1.0)
        xs.append(X[:n])
        ys.append(y[:n])
        xs_test.append(X[n:])
        ys_test.append(y[n:])
    return DeviceData.from_lists(xs, ys, xs_test, ys_test)


def job_algorithm(settings, data):
    """The protocol of a ``dp-pfl`` job on its devices ``data``.

    lambda = ``lambda`` (default 0.1), K = ``inner`` (default 10), xi = 0.5,
    tau = 0.5, P(theta = 1) = 0.2 and the hinge loss; with ``epsilon``,
    private with (epsilon, 1e-3) per device and r = ``ratio`` (default 1).
    """
    privacy = None
    if settings.get("epsilon") is not None:
        ratio = 1.0 if settings.get("ratio") is None else float(settings["ratio"])
        privacy = PrivacySetting(float(settings["epsilon"]), 1e-3, ratio)
    lam = (JOB_LAMBDA if settings.get("lambda") is None
           else check_positive_scalar(settings["lambda"], "lambda"))
    inner = JOB_INNER if settings.get("inner") is None else int(settings["inner"])
    return DPPFL.for_data(data, lam=lam, xi=JOB_XI, inner=inner, tau=JOB_TAU,
                          drop_probability=JOB_DROP, privacy=privacy)
