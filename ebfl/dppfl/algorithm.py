"""Algorithm 1 of DP-PFL: private multitask learning by distributed dual coordinate ascent.

Every global iteration, each active device solves its local subproblem (7)
approximately by SDCA, adds xi times the result to its dual variables, and
uploads u_t = xi X_t (Delta alpha_t + b_t) + p_t; the server sums the uploads
into V and gives device t the row t of W = Omega V / (2 lambda). After every K
global iterations the server replaces Omega by the closed-form Omega-step, H
times. See :func:`fit_dppfl`.

Where the paper leaves a choice open, the choices are those documented in
:func:`fit_dppfl` and in errata [DP-PFL 10] (docs/errata.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

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
from ebfl.dppfl._checks import (
    MAX_DEVICES,
    MAX_ITERATIONS,
    MAX_MODEL_ENTRIES,
    check_devices,
    check_lam,
    check_models,
    check_omega,
    check_sizes,
    refuse_overflow,
)
from ebfl.dppfl.objective import LOSSES, _dual, _gap, _omega_step, _primal

__all__ = ["CALIBRATIONS", "DUAL_SENSITIVITIES", "DPPFLResult", "PrivacySetting",
           "classification_error", "dual_sensitivity", "exchangeable_omega", "fit_dppfl",
           "noise_multipliers", "sampling_rates", "test_error"]

_LOSS_CODES = {"hinge": _kernels.HINGE, "smoothed_hinge": _kernels.SMOOTHED_HINGE,
               "squared": _kernels.SQUARED}
_S2_MODES = {"printed": _kernels.S2_PRINTED, "bound": _kernels.S2_BOUND}
#: How the noise of :class:`PrivacySetting` is calibrated.
CALIBRATIONS = ("theorem5", "rdp", "per_iteration")
#: The sensitivity of the dual update (see :class:`PrivacySetting`).
DUAL_SENSITIVITIES = ("corollary2", "box")


@dataclass(frozen=True)
class PrivacySetting:
    """The end-to-end (epsilon, delta) target of every device and how the noise is calibrated.

    Attributes
    ----------
    epsilon, delta : float
        The per-device, record-level target (the paper's experiments: 8 and 1e-3).
    ratio : float
        r = epsilon2 / epsilon1, the split of the budget between the dual update
        (line 6) and the upload (line 7); not reported in the paper, 1 by default.
    upload_sensitivity : {"printed", "bound"}
        s2 of the upload: 2 xi ||Delta alpha_t + b_t|| as Corollary 3 states it
        (computed from the noisy dual update, the output of line 6, so the
        adaptive composition of the two releases covers it), or the
        data-independent 2 xi, which bounds ``2 xi |Delta alpha_t^i|`` for the
        clean hinge-loss update but not for the noisy one (b_t is unbounded):
        an alternative reading, not a guarantee.
    calibration : {"theorem5", "rdp", "per_iteration"}
        How sigma1 and sigma2 are set.

        * ``"theorem5"``: the paper's recipe (Theorem 5 with its unknown
          constants set to 1, every one of the K H iterations a release, the
          active probability credited), per device with its expected q_t. It
          misses its target: :meth:`DPPFLResult.delivered_epsilon`.
        * ``"rdp"``: the corrected variant. sigma1 = z, sigma2 = z / r with
          the smallest z at which dp-accounting's RDP accountant certifies
          (epsilon, delta) for K H releases at the largest sampling rate of
          any device (one noise level for all devices; no credit for
          dropping, which the server observes).
        * ``"per_iteration"``: epsilon is the budget of *each* iteration
          (Lemma 4 alone, no composition), a reading under which the noise is
          small enough to learn; the end-to-end epsilon it delivers is
          reported by :meth:`DPPFLResult.delivered_epsilon` and is huge.
    dual_sensitivity : {"corollary2", "box"}
        s1 of the dual update: Corollary 2's (8 lambda + beta) / (beta n_t), as
        printed, or ``"box"``: sqrt(n_t), the diameter of the hinge losses'
        dual box (every alpha_t^i y_t^i lies in [0, 1], so two local solutions
        differ by at most 1 per coordinate). Corollary 2's bound does not hold
        (errata [DP-PFL 2]; ``ebfl validate dppfl_corollary2``: at the paper's scale the
        hinge loss exceeds it 569-fold), so only ``"box"`` makes the noise of line 6 a
        guarantee; with ``calibration="rdp"`` it is the corrected variant.
    """

    epsilon: float
    delta: float = 1e-3
    ratio: float = 1.0
    upload_sensitivity: str = "printed"
    calibration: str = "theorem5"
    dual_sensitivity: str = "corollary2"

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_positive_scalar(self.epsilon, "epsilon"))
        object.__setattr__(self, "delta", check_real_scalar(self.delta, "delta", low=0.0,
                                                            high=1.0, low_open=True,
                                                            high_open=True))
        object.__setattr__(self, "ratio", check_positive_scalar(self.ratio, "ratio"))
        check_choice(self.upload_sensitivity, "upload_sensitivity", tuple(_S2_MODES))
        check_choice(self.calibration, "calibration", CALIBRATIONS)
        check_choice(self.dual_sensitivity, "dual_sensitivity", DUAL_SENSITIVITIES)

    def to_dict(self):
        return asdict(self)


@dataclass
class DPPFLResult:
    """A fit of :func:`fit_dppfl`.

    Attributes
    ----------
    W : ndarray (m, d)
        The devices' models (row t: w_t), the server's W = Omega V / (2 lambda).
    omega : ndarray (m, m)
        The final task covariance.
    alpha : ndarray (n,)
        The devices' dual variables (private to the devices).
    V : ndarray (m, d)
        The server's sum of the uploads.
    history : list of dict
        Per recorded iteration: ``iteration``, ``primal`` (P(W, Omega) on the
        training data), ``test_error`` (when the data has a test split) and,
        without privacy, ``dual`` and ``gap`` (P(W(alpha)) + D(alpha)).
    active : ndarray (m,)
        Iterations in which each device took part (made a release).
    calibration : dict or None
        The noise: per-device sigma1, sigma2, the dual-update std s1 sigma1 and
        the calibration's violated conditions.
    config : dict
    seconds : float
    """

    W: np.ndarray
    omega: np.ndarray
    alpha: np.ndarray
    V: np.ndarray
    history: list = field(default_factory=list)
    active: np.ndarray | None = None
    mean_upload_sensitivity: np.ndarray | None = None
    calibration: dict | None = None
    config: dict = field(default_factory=dict)
    seconds: float = 0.0

    def history_frame(self):
        """The history as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def delivered_epsilon(self, accountant="rdp"):
        """Per device, the epsilon that the run's noise delivers for its (fixed) delta.

        By :func:`ebfl.dppfl.accounting.rigorous_epsilon` for a device active in
        all K H iterations, at its largest sampling rate n_min / n_t, given
        Corollaries 2 and 3's sensitivities. None without privacy.
        """
        if self.calibration is None:
            return None
        from ebfl.dppfl.accounting import rigorous_epsilon

        cal = self.calibration
        return rigorous_epsilon(np.asarray(cal["sigma1"]), np.asarray(cal["sigma2"]),
                                np.asarray(cal["sampling_rate_max"]),
                                self.config["inner"] * self.config["outer"],
                                self.config["privacy"]["delta"], accountant=accountant)

    @property
    def final_test_error(self):
        """Test error of the final models (NaN without a test split)."""
        return self.history[-1].get("test_error", float("nan")) if self.history else float("nan")


def exchangeable_omega(m, rho):
    """Omega = ((1 - rho) I + rho 1 1^T) / m: a Gaussian prior with a shared mean.

    rho = 0 makes the devices independent (local models), rho = 1 forces one
    global model; in between, w_t = w0 + e_t with a shared w0 (the empirical-Bayes
    prior of exchangeable devices).

    Parameters
    ----------
    m : int
        Devices, in [1, 10000] (the matrix is m x m).
    rho : float
        In [0, 1].

    Returns
    -------
    ndarray, shape (m, m)
    """
    m = check_devices(m)
    rho = check_real_scalar(rho, "rho", low=0.0, high=1.0)
    out = np.full((m, m), rho / m)
    out[np.diag_indices(m)] = 1.0 / m
    return out


def dual_sensitivity(lam, beta, sizes, kind="corollary2"):
    """The L2-sensitivity s1 of a device's local solution Delta alpha_t.

    ``kind="corollary2"``: Corollary 2's (8 lambda + beta) / (beta n_t), as
    printed (it does not hold: see :class:`PrivacySetting`); ``"box"``:
    sqrt(n_t), valid for the hinge losses, whose dual variables lie in a box
    of width 1.

    Parameters
    ----------
    lam, beta : float
        lambda > 0 and beta > 0 (fit_dppfl's beta = xi m).
    sizes : array_like of int, shape (m,)
        The devices' training sizes n_t >= 1.
    kind : {"corollary2", "box"}

    Returns
    -------
    ndarray, shape (m,)
    """
    lam = check_positive_scalar(lam, "lam")
    beta = check_positive_scalar(beta, "beta")
    sizes = check_sizes(sizes).astype(np.float64)
    if check_choice(kind, "kind", DUAL_SENSITIVITIES) == "box":
        return np.sqrt(sizes)
    with np.errstate(over="ignore"):
        out = (8.0 * (lam / beta) + 1.0) / sizes
    return refuse_overflow(out, "(8 lambda + beta) / (beta n_t)", ("lam", "beta"))


def _low_iterations(n_min, tau):
    return min(int(round((1.0 - tau) * n_min)), n_min)


def sampling_rates(sizes, n_min, tau):
    """Per device, the expected and the largest q = n_iter / n_t of the local solver.

    n_iter is uniform on the integers round((1 - tau) n_min)..n_min.

    Parameters
    ----------
    sizes : array_like of int, shape (m,)
        The devices' training sizes n_t >= 1.
    n_min : int
        The largest local iteration count, in [1, min(sizes)]: a sampling rate
        n_iter / n_t is a probability.
    tau : float
        Device variability, in [0, 1].

    Returns
    -------
    q_mean, q_max : ndarray, shape (m,)
        In (0, 1].
    """
    sizes = check_sizes(sizes)
    n_min = _n_min_iv(n_min, sizes)
    tau = check_real_scalar(tau, "tau", low=0.0, high=1.0)
    sizes = sizes.astype(np.float64)
    low = _low_iterations(n_min, tau)
    return 0.5 * (low + n_min) / sizes, n_min / sizes


def _n_min_iv(n_min, sizes):
    """n_min in [1, min(sizes)]: n_min <= every n_t keeps every q = n_iter / n_t <= 1."""
    return check_int_scalar(n_min, "n_min", minimum=1, maximum=int(sizes.min()))


def classification_error(W, X, y, offsets):
    """Pooled and per-device error of sign(w_t^T x) on rows ``X`` of the devices ``offsets``.

    sign(0) counts as +1. Every device needs at least one row.
    """
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    scores = np.einsum("ij,ij->i", X, np.asarray(W)[rows])
    wrong = (np.where(scores >= 0.0, 1.0, -1.0) != y).astype(np.float64)
    per_device = np.add.reduceat(wrong, offsets[:-1]) / np.diff(offsets)
    return float(wrong.mean()), per_device


def test_error(data, W):
    """Pooled and per-device test error of the models W (NaN without a test split).

    Parameters
    ----------
    data : DeviceData
    W : array_like, shape (m, d)
        Finite models, one per device.

    Returns
    -------
    error : float
    per_device : ndarray, shape (m,)
    """
    from ebfl.dppfl.data import DeviceData

    if not isinstance(data, DeviceData):
        raise TypeError(f"data must be a DeviceData, got {type(data).__name__}")
    W = check_models(W, data.n_clients, data.n_features)
    return _test_error(data, W)


def _test_error(data, W):
    if data.X_test is None:
        return float("nan"), np.full(data.n_clients, np.nan)
    return classification_error(W, data.X_test, data.y_test, data.test_offsets)


def noise_multipliers(privacy, sizes, n_min, tau, drop, releases):
    """Per device sigma1 and sigma2 of ``privacy.calibration``, and a JSON-able record.

    Parameters
    ----------
    privacy : PrivacySetting
    sizes : ndarray of int
        The devices' training sizes n_t.
    n_min : int
        The largest local iteration count.
    tau, drop : float
        Device variability and drop probability.
    releases : int
        K H.

    Returns
    -------
    sigma1, sigma2 : ndarray (m,)
    record : dict
    """
    from ebfl.dppfl.accounting import calibrate_rdp, calibrate_theorem5

    m = sizes.size
    q_mean, q_max = sampling_rates(sizes, n_min, tau)
    record = {"calibration": privacy.calibration, "sampling_rate_max": q_max.tolist()}
    if privacy.calibration == "rdp":
        z = calibrate_rdp(privacy.epsilon, privacy.delta, releases=releases,
                          sampling_rate=float(q_max.max()), ratio=privacy.ratio)
        sigma1, sigma2 = np.full(m, z), np.full(m, z / privacy.ratio)
        _noise_in_range(privacy, sigma1, sigma2)
        return sigma1, sigma2, {**record, "sigma1": sigma1.tolist(), "sigma2": sigma2.tolist(),
                                "violated": []}
    per_iteration = privacy.calibration == "per_iteration"
    cal = calibrate_theorem5(privacy.epsilon, privacy.delta,
                             releases=1 if per_iteration else releases, sampling_rate=q_mean,
                             active_probability=1.0 if per_iteration else 1.0 - drop,
                             ratio=privacy.ratio, warn=not per_iteration)
    sigma1 = np.broadcast_to(np.asarray(cal.sigma1, dtype=np.float64), (m,)).copy()
    sigma2 = np.broadcast_to(np.asarray(cal.sigma2, dtype=np.float64), (m,)).copy()
    _noise_in_range(privacy, sigma1, sigma2)
    return sigma1, sigma2, {**cal.to_dict(), **record}


def _noise_in_range(privacy, sigma1, sigma2):
    """Refuse noise multipliers above the accountants' range (1e8), naming privacy.epsilon.

    Beyond it the models of a run overflow float64 (and no accountant checks the
    result); every multiplier is proportional to 1 / epsilon, which gives the
    smallest epsilon that works.
    """
    from ebfl.dppfl.accounting import NOISE_MULTIPLIER_RANGE

    top = NOISE_MULTIPLIER_RANGE[1]
    worst = float(max(sigma1.max(), sigma2.max()))
    if worst <= top:
        return
    raise ValueError(f"privacy.epsilon={privacy.epsilon:g} is too small for this run: the "
                     f"{privacy.calibration!r} calibration gives noise multipliers up to "
                     f"{worst:.3g}, above {top:g}; with this delta, ratio and number of "
                     f"iterations privacy.epsilon must be at least about "
                     f"{privacy.epsilon * worst / top:.3g}")


def _omega_iv(omega, m):
    if omega is None or (isinstance(omega, str) and omega == "learn"):
        return None
    if isinstance(omega, str | bytes):
        raise ValueError(f"omega must be 'learn' or a ({m}, {m}) matrix, got {omega!r}")
    om = check_omega(omega, m)
    if abs(np.trace(om) - 1.0) > 1e-9:
        raise ValueError(f"omega must have trace 1, got {np.trace(om):.6g}")
    return om.copy()


def fit_dppfl(data, *, lam, xi=0.5, inner=2000, outer=10, loss="hinge", gamma=1.0, tau=0.0,
              drop_probability=0.0, privacy=None, omega="learn", noisy_alpha=False, seed=0,
              record_every=None, n_min=None, parallel=True, progress=False):
    """Run Algorithm 1 of DP-PFL (Hu et al., IEEE IoT J. 2020) on device data.

    Parameters
    ----------
    data : DeviceData
        Every row of l2 norm <= 1 (the privacy analysis needs it); at most
        10,000 devices (Omega is m x m) and 10**8 model entries m d.
    lam : float
        lambda of problem (1), in [1e-100, 1e100].
    xi : float
        The aggregation parameter in (0, 1]; beta = xi m (Lemma 1's choice).
    inner, outer : int
        K global iterations per Omega-step, H Omega-steps (the paper: 2000, 10),
        each >= 1, with K H at most 10**7 (beyond it a run would take hours).
    loss : {"hinge", "smoothed_hinge", "squared"}
        The paper's experiments use the hinge loss (linear SVM).
    gamma : float
        Smoothing of the smoothed hinge.
    tau : float in [0, 1]
        Device variability: each device's SDCA iterations per global iteration
        are uniform on the integers round((1 - tau) n_min)..n_min.
    drop_probability : float in [0, 1)
        P(theta = 1): each device drops out of each iteration independently.
    privacy : PrivacySetting, optional
        Without it the run is the non-private baseline (MOCHA-like). With it,
        the noise is calibrated by Theorem 5's recipe (constants 1, every one
        of the K H iterations a release, the active probability p = 1 -
        drop_probability credited as the paper does, and each device's
        expected q_t = E[n_iter] / n_t).
    omega : "learn" or ndarray (m, m)
        "learn": start at I / m and take the Omega-step after every K
        iterations; a matrix: keep that Omega fixed (I / m: independent local
        models; 1 1^T / m: one global model; see :func:`exchangeable_omega`).
    noisy_alpha : bool
        Update alpha_t with the noisy Delta alpha_t instead of the clean one
        (Algorithm 1 as printed adds the clean one, line 5, before the noise).
    seed : int
        Keys every random draw by (seed, iteration, device).
    record_every : int, optional
        Record the objective and test error every this many iterations
        (default K; always after each Omega-step and at the end).
    n_min : int, optional
        The largest local iteration count, in [1, smallest training size]
        (default: the smallest training size).
    parallel : bool
        Devices in parallel threads (Numba); False for running many fits side
        by side.
    progress : bool
        A progress bar over the iterations.

    Returns
    -------
    DPPFLResult

    Raises
    ------
    ValueError
        Also when ``privacy.epsilon`` is so small that a noise multiplier
        exceeds 1e8, or the models overflow float64 during the run (lambda
        too small for the noise).

    Examples
    --------
    >>> import numpy as np
    >>> from ebfl.dppfl import DeviceData, fit_dppfl, l2_normalize
    >>> rng = np.random.default_rng(0)
    >>> xs = [l2_normalize(rng.normal(size=(40, 5))) for _ in range(4)]
    >>> ys = [np.where(x[:, 0] > 0, 1.0, -1.0) for x in xs]
    >>> fit = fit_dppfl(DeviceData.from_lists(xs, ys), lam=0.01, inner=50, outer=2)
    >>> fit.W.shape
    (4, 5)
    """
    from ebfl.dppfl.data import DeviceData

    if not isinstance(data, DeviceData):
        raise TypeError(f"data must be a DeviceData, got {type(data).__name__}")
    m, d = data.n_clients, data.n_features
    _size_iv(m, d, "data", "its features")
    lam = check_lam(lam)
    xi = check_real_scalar(xi, "xi", low=0.0, high=1.0, low_open=True)
    inner, outer = _iterations_iv(inner, outer)
    loss = check_choice(loss, "loss", LOSSES)
    gamma = check_positive_scalar(gamma, "gamma")
    tau = check_real_scalar(tau, "tau", low=0.0, high=1.0)
    drop = check_probability(drop_probability, "drop_probability")
    if drop >= 1.0:
        raise ValueError("drop_probability must be in [0, 1): at 1 no device ever takes part")
    if privacy is not None and not isinstance(privacy, PrivacySetting):
        raise TypeError(f"privacy must be a PrivacySetting or None, got {type(privacy).__name__}")
    if privacy is not None and privacy.dual_sensitivity == "box" and loss == "squared":
        raise ValueError("privacy.dual_sensitivity='box' needs dual variables in a box: "
                         "loss 'hinge' or 'smoothed_hinge', got 'squared'")
    fixed_omega = _omega_iv(omega, m)
    noisy_alpha = check_bool(noisy_alpha, "noisy_alpha")
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=2**64 - 1)
    total = inner * outer
    record_every = inner if record_every is None else check_int_scalar(
        record_every, "record_every", minimum=1)
    sizes = data.sizes
    n_min = int(sizes.min()) if n_min is None else _n_min_iv(n_min, sizes)
    parallel, progress = check_bool(parallel, "parallel"), check_bool(progress, "progress")

    beta = xi * m
    dual_std, sigma2, calibration = np.zeros(m), np.zeros(m), None
    if privacy is not None:
        sigma1, sigma2, calibration = noise_multipliers(privacy, sizes, n_min, tau, drop, total)
        s1 = dual_sensitivity(lam, beta, sizes, privacy.dual_sensitivity)
        dual_std = s1 * sigma1
        calibration = {**calibration, "dual_sensitivity": s1.tolist(),
                       "dual_noise_std": dual_std.tolist()}

    omega_now = np.eye(m) / m if fixed_omega is None else fixed_omega
    alpha = np.zeros(sizes.sum())
    V = np.zeros((m, d))
    active = np.zeros(m, dtype=np.int64)
    s2_sum = np.zeros(m)
    sqnorm = np.einsum("ij,ij->i", data.X, data.X)
    kernel = _kernels.iterations_parallel if parallel else _kernels.iterations_serial
    config = {"lam": lam, "xi": xi, "beta": beta, "inner": inner, "outer": outer, "loss": loss,
              "gamma": gamma, "tau": tau, "drop_probability": drop,
              "privacy": None if privacy is None else privacy.to_dict(),
              "omega": "learn" if fixed_omega is None else "fixed", "noisy_alpha": noisy_alpha,
              "seed": seed, "n_min": n_min, "n_clients": m, "n_features": d}

    def record(it):
        W = _models(omega_now, V, lam, privacy, it)
        row = {"iteration": it,
               "primal": _primal(data.X, data.y, data.offsets, W, omega_now, lam, loss, gamma)}
        if data.X_test is not None:
            row["test_error"] = _test_error(data, W)[0]
        if privacy is None:
            row["dual"] = _dual(data.X, data.y, data.offsets, alpha, omega_now, lam, loss, gamma)
            row["gap"] = _gap(data.X, data.y, data.offsets, alpha, omega_now, lam, loss, gamma)
        history.append(row)

    history = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="DP-PFL", disable=None, leave=False)
    t0 = time.perf_counter()
    record(0)
    it = 0
    for _h in range(outer):
        stop_outer = it + inner
        while it < stop_outer:
            stop = min(stop_outer, (it // record_every + 1) * record_every)
            kernel(data.X, data.y, sqnorm, data.offsets, alpha, V, omega_now, lam, xi, beta,
                   _LOSS_CODES[loss], gamma, np.uint64(seed), it, stop, n_min, tau, drop,
                   dual_std, sigma2, _S2_MODES[privacy.upload_sensitivity] if privacy else 0,
                   privacy is not None, noisy_alpha, active, s2_sum)
            if bar is not None:
                bar.update(stop - it)
            it = stop
            if it < stop_outer:
                record(it)
        if fixed_omega is None:  # line 13: the Omega-step on the most recent W
            omega_now = _omega_step(_models(omega_now, V, lam, privacy, it), omega_now)
        record(it)
    if bar is not None:
        bar.close()
    W = _models(omega_now, V, lam, privacy, it)
    mean_s2 = np.divide(s2_sum, active, out=np.zeros(m), where=active > 0)
    return DPPFLResult(W=W, omega=omega_now, alpha=alpha, V=V, history=history, active=active,
                       mean_upload_sensitivity=mean_s2 if privacy is not None else None,
                       calibration=calibration, config=config,
                       seconds=time.perf_counter() - t0)


def _size_iv(m, d, devices, features):
    """m devices and m d model entries within the limits (checked before allocating)."""
    if m > MAX_DEVICES:
        raise ValueError(f"{devices} must have at most {MAX_DEVICES} devices (Omega is m x m), "
                         f"got {m}")
    if m * d > MAX_MODEL_ENTRIES:
        raise ValueError(f"{devices} and {features}: the models would have m d = {m} x {d} "
                         f"entries, more than the limit {MAX_MODEL_ENTRIES:g}")


def _iterations_iv(inner, outer):
    inner = check_int_scalar(inner, "inner", minimum=1)
    outer = check_int_scalar(outer, "outer", minimum=1)
    if inner * outer > MAX_ITERATIONS:
        raise ValueError(f"inner * outer (K H global iterations) must be at most "
                         f"{MAX_ITERATIONS:g}, got {inner} * {outer} = {inner * outer:g}")
    return inner, outer


def _models(omega, V, lam, privacy, it):
    """W = Omega V / (2 lambda), refused by name if the run has overflowed float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        W = omega @ V / (2.0 * lam)
    if np.all(np.isfinite(W)):
        return W
    noise = "" if privacy is None else f" or privacy.epsilon={privacy.epsilon:g} too small"
    raise ValueError(f"the models overflowed float64 after {it} iterations: lam={lam:g} is too "
                     f"small for this data{noise}")
