"""Numba kernels of DP-PFL's device round (private; inputs are trusted).

One global iteration of Algorithm 1 of DP-PFL (Hu et al., IEEE IoT J. 2020)
for every device: the local SDCA solve of the subproblem (7), the device's
clean dual update, and the noisy release ``u_t``. The random numbers come from
a counter-based generator keyed by (seed, iteration, device, purpose), so a
device draws the same numbers whichever runtime runs it, in whatever order.

Every kernel has a plain-numpy twin in ``tests/naive_dppfl.py``.
"""

import math

import numpy as np
from numba import config as _numba_config
from numba import njit, prange

from ebfl._config import CACHE

#: Loss codes of the kernels (see :data:`ebfl.dppfl.objective.LOSSES`).
HINGE, SMOOTHED_HINGE, SQUARED = 0, 1, 2
#: Random-stream purposes of one (seed, iteration, device).
DROP, LOCAL_ITERATIONS, COORDINATES, DUAL_NOISE, UPLOAD_NOISE = 1, 2, 3, 4, 5
#: Dual variables below this magnitude are set to 0 (see ``_flushed``).
FLUSH = 1e-250
#: How the sensitivity s2 of the upload is set: 2 xi ||noisy Delta alpha_t|| as
#: Corollary 3 prints it, or the data-independent 2 xi.
S2_PRINTED, S2_BOUND = 0, 1

# Reassociation and fused multiply-adds let LLVM vectorize the sums over the d
# features and over a device's rows; results differ from the strict order by
# rounding only (the twin tests allow 1e-12).
_FAST = {"reassoc", "contract"}
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_TWO53 = 1.0 / 9007199254740992.0

# splitmix64 (Steele et al. 2014) as a counter-based generator: the n-th number
# of a stream is mix64(key + (n + 1) * golden). Compiled, it wraps in uint64;
# without the JIT (NUMBA_DISABLE_JIT=1), numpy uint64 scalars would warn on the
# intended overflow, so the interpreted version uses masked Python integers.
if _numba_config.DISABLE_JIT:
    _SHIFT53 = 11

    def _mix64(z):
        z = int(z) & _MASK
        z = ((z ^ (z >> 30)) * _M1) & _MASK
        z = ((z ^ (z >> 27)) * _M2) & _MASK
        return z ^ (z >> 31)

    def _counter(key, n):
        return _mix64((int(key) + (int(n) + 1) * _GOLDEN) & _MASK)

    def stream_key(seed, iteration, device, purpose):
        h = _mix64(int(seed) & _MASK)
        for x in (iteration, device, purpose):
            h = _mix64(h ^ (int(x) & _MASK))
        return h
else:
    _U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
    _SHIFT53 = np.uint64(11)
    _UM1, _UM2, _UG = np.uint64(_M1), np.uint64(_M2), np.uint64(_GOLDEN)

    @njit(cache=CACHE)
    def _mix64(z):
        z = (z ^ (z >> _U30)) * _UM1
        z = (z ^ (z >> _U27)) * _UM2
        return z ^ (z >> _U31)

    @njit(cache=CACHE)
    def _counter(key, n):
        # explicit casts: an int64 key (a Python int from the caller) plus a
        # uint64 would be promoted to float64
        return _mix64(np.uint64(key) + (np.uint64(n) + np.uint64(1)) * _UG)

    @njit(cache=CACHE)
    def stream_key(seed, iteration, device, purpose):
        h = _mix64(np.uint64(seed))
        h = _mix64(h ^ np.uint64(iteration))
        h = _mix64(h ^ np.uint64(device))
        return _mix64(h ^ np.uint64(purpose))


@njit(cache=CACHE)
def uniform(key, n):
    """The n-th uniform of stream ``key``, in the open interval (0, 1)."""
    return ((_counter(key, n) >> _SHIFT53) + 0.5) * _TWO53


@njit(cache=CACHE)
def normal_pair(key, n):
    """Normals 2n and 2n + 1 of stream ``key`` (Box-Muller on uniforms 2n, 2n + 1)."""
    r = math.sqrt(-2.0 * math.log(uniform(key, 2 * n)))
    phi = 2.0 * math.pi * uniform(key, 2 * n + 1)
    return r * math.cos(phi), r * math.sin(phi)


@njit(cache=CACHE)
def fill_normal(key, out):
    """``out[:] = `` the first ``out.size`` normals of stream ``key``."""
    n = out.size
    for j in range(n // 2):
        out[2 * j], out[2 * j + 1] = normal_pair(key, j)
    if n % 2:
        out[n - 1] = normal_pair(key, n // 2)[0]


@njit(cache=CACHE)
def coordinate_update(loss, gamma, y, a, z, curvature):
    """The exact minimizer of (7) along one coordinate: the new alpha_t^i + Delta alpha_t^i.

    ``a`` is the current alpha + Delta alpha of the coordinate, ``z = x^T (w_t +
    c v)`` with v = X_t Delta alpha_t, and ``curvature = c ||x||^2`` with c =
    beta Omega_tt / (2 lambda). Hinge: the conjugate is -a y on a y in [0, 1];
    the smoothed hinge adds gamma (a y)^2 / 2; the squared loss (v - y)^2 / 2
    has the conjugate -a y + a^2 / 2, unconstrained.
    """
    if loss == SQUARED:
        return a + (y - a - z) / (1.0 + curvature)
    denom = curvature + (gamma if loss == SMOOTHED_HINGE else 0.0)
    ya = y * a
    grad = 1.0 - y * z - (gamma * ya if loss == SMOOTHED_HINGE else 0.0)
    if denom > 0.0:
        ya = ya + grad / denom
    elif grad != 0.0:  # a zero row under the hinge: the objective is linear in a
        ya = 1.0 if grad > 0.0 else 0.0
    return y * min(1.0, max(0.0, ya))


@njit(cache=CACHE, fastmath=_FAST)
def sdca_device(X, y, sqnorm, lo, hi, alpha, w, c, loss, gamma, n_iter, key, dalpha, v):
    """``n_iter`` SDCA steps on device rows ``lo:hi`` from Delta alpha = 0.

    Coordinates are drawn uniformly with replacement from stream ``key``.
    Writes Delta alpha_t into ``dalpha`` (length n_t) and X_t Delta alpha_t
    into ``v`` (length d); ``alpha`` is not changed.
    """
    n_t = hi - lo
    d = X.shape[1]
    dalpha[:] = 0.0
    v[:] = 0.0
    for s in range(n_iter):
        j = min(int(uniform(key, s) * n_t), n_t - 1)
        i = lo + j
        z = 0.0
        for k in range(d):
            z += X[i, k] * (w[k] + c * v[k])
        a = alpha[i] + dalpha[j]
        delta = coordinate_update(loss, gamma, y[i], a, z, c * sqnorm[i]) - a
        if delta != 0.0:
            dalpha[j] += delta
            for k in range(d):
                v[k] += delta * X[i, k]


@njit(cache=CACHE)
def _flushed(a):
    """``a``, or 0 below FLUSH in magnitude.

    With xi < 1 a dual variable whose target is 0 shrinks by the factor 1 - xi
    at every visit and becomes subnormal after about 2,000 visits, where each
    arithmetic operation costs a hundred times more (measured: a fit 10x
    slower). Values below 1e-250 change no model, objective or error.
    """
    return a if abs(a) >= FLUSH else 0.0


@njit(cache=CACHE)
def local_iterations(seed, iteration, device, n_min, tau):
    """n_iter of a device in an iteration: uniform on the integers round((1 - tau) n_min)..n_min."""
    low = int(round((1.0 - tau) * n_min))
    if low >= n_min:
        return n_min
    u = uniform(stream_key(seed, iteration, device, LOCAL_ITERATIONS), 0)
    return min(low + int(u * (n_min - low + 1)), n_min)


@njit(cache=CACHE, fastmath=_FAST)
def device_round(X, y, sqnorm, lo, hi, alpha, w, c, xi, loss, gamma, n_iter, seed, iteration,
                 device, dual_std, sigma2, s2_mode, private, noisy_alpha, dalpha, noisy, u):
    """Lines 4-7 of Algorithm 1 for one active device.

    Solves (7) approximately by ``n_iter`` SDCA steps, adds xi Delta alpha_t to
    ``alpha[lo:hi]`` (line 5, the clean update as printed; with
    ``noisy_alpha`` the noisy one), and writes the upload u_t into ``u``:
    xi X_t Delta alpha_t without privacy; else xi X_t (Delta alpha_t + b_t) +
    p_t with b_t ~ N(0, dual_std^2 I) and p_t ~ N(0, (s2 sigma2)^2 I).
    Returns s2 (0 without privacy).
    """
    d = X.shape[1]
    n_t = hi - lo
    sdca_device(X, y, sqnorm, lo, hi, alpha, w, c, loss, gamma, n_iter,
                stream_key(seed, iteration, device, COORDINATES), dalpha, u)
    if not private:
        for j in range(n_t):
            alpha[lo + j] = _flushed(alpha[lo + j] + xi * dalpha[j])
        for k in range(d):
            u[k] *= xi
        return 0.0
    fill_normal(stream_key(seed, iteration, device, DUAL_NOISE), noisy)
    norm2 = 0.0
    for j in range(n_t):
        noisy[j] = dalpha[j] + dual_std * noisy[j]
        norm2 += noisy[j] * noisy[j]
        alpha[lo + j] = _flushed(alpha[lo + j] + xi * (noisy[j] if noisy_alpha else dalpha[j]))
    u[:] = 0.0
    for j in range(n_t):
        b = xi * noisy[j]
        for k in range(d):
            u[k] += b * X[lo + j, k]
    s2 = 2.0 * xi * (math.sqrt(norm2) if s2_mode == S2_PRINTED else 1.0)
    key = stream_key(seed, iteration, device, UPLOAD_NOISE)
    for k in range(d // 2):
        g0, g1 = normal_pair(key, k)
        u[2 * k] += s2 * sigma2 * g0
        u[2 * k + 1] += s2 * sigma2 * g1
    if d % 2:
        u[d - 1] += s2 * sigma2 * normal_pair(key, d // 2)[0]
    return s2


@njit(cache=CACHE)
def is_dropped(seed, iteration, device, drop_probability):
    """Whether a device drops out of an iteration (its own stream; no draw at probability 0)."""
    if drop_probability <= 0.0:
        return False
    return uniform(stream_key(seed, iteration, device, DROP), 0) < drop_probability


def _iterations(X, y, sqnorm, offsets, alpha, V, omega, lam, xi, beta, loss, gamma, seed,
                start, stop, n_min, tau, drop_probability, dual_std, sigma2, s2_mode, private,
                noisy_alpha, active_count, s2_sum):
    """Global iterations ``start..stop-1`` of Algorithm 1 (server and devices), in place.

    The server holds V (m, d), the sum of the uploads; device t's model is row
    t of W = Omega V / (2 lambda) (line 10 of Algorithm 1, recomputed from V).
    ``alpha``, ``V``, ``active_count`` (m,) and ``s2_sum`` (m,) are updated.
    """
    m, d = V.shape
    W = np.empty((m, d))
    U = np.empty((m, d))
    dalpha = np.empty(X.shape[0])
    noisy = np.empty(X.shape[0])
    scale = 1.0 / (2.0 * lam)
    for it in range(start, stop):
        # W = Omega V / (2 lambda) by BLAS: with a learned (dense) Omega, plain loops
        # took half of a non-private iteration
        np.dot(omega, V, W)
        W *= scale
        for t in prange(m):
            lo, hi = offsets[t], offsets[t + 1]
            if is_dropped(seed, it, t, drop_probability):
                U[t, :] = 0.0
                continue
            n_iter = local_iterations(seed, it, t, n_min, tau)
            c = beta * omega[t, t] * scale
            s2 = device_round(X, y, sqnorm, lo, hi, alpha, W[t], c, xi, loss, gamma, n_iter,
                              seed, it, t, dual_std[t], sigma2[t], s2_mode, private, noisy_alpha,
                              dalpha[lo:hi], noisy[lo:hi], U[t])
            active_count[t] += 1
            s2_sum[t] += s2
        for t in range(m):
            for k in range(d):
                V[t, k] += U[t, k]


iterations_parallel = njit(parallel=True, cache=CACHE, fastmath=_FAST)(_iterations)
#: The serial build, for running many fits side by side on threads (it releases the GIL).
iterations_serial = njit(parallel=False, nogil=True, cache=CACHE, fastmath=_FAST)(_iterations)


# ------------------------------------------------------------------ exact solvers
# The coordinate sweeps of ebfl.dppfl.exact: the local subproblem (7) and the dual (5)
# minimized to a KKT tolerance (the theory checks need exact minimizers).

@njit(cache=CACHE)
def _local_sweeps(X, y, sqnorm, alpha, a, w, c, loss, gamma, step_tol, max_sweeps):
    """Cyclic exact coordinate minimization of (7) in a = alpha + Delta alpha, in place.

    Stops after a sweep whose largest step is <= ``step_tol`` or after
    ``max_sweeps``; returns the number of sweeps.
    """
    n, d = X.shape
    v = np.zeros(d)
    for i in range(n):
        diff = a[i] - alpha[i]
        for k in range(d):
            v[k] += diff * X[i, k]
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        largest = 0.0
        for i in range(n):
            z = 0.0
            for k in range(d):
                z += X[i, k] * (w[k] + c * v[k])
            new = coordinate_update(loss, gamma, y[i], a[i], z, c * sqnorm[i])
            delta = new - a[i]
            if delta != 0.0:
                a[i] = new
                for k in range(d):
                    v[k] += delta * X[i, k]
                largest = max(largest, abs(delta))
        if largest <= step_tol:
            break
    return sweeps


@njit(cache=CACHE)
def _dual_sweeps(X, y, sqnorm, offsets, omega, lam, a, loss, gamma, step_tol, max_sweeps):
    """Cyclic exact coordinate minimization of the dual (5), in place; returns the sweeps.

    Along alpha_i of device t, D has slope l*'(-a) + x_i^T w_t(alpha) and
    curvature Omega_tt ||x_i||^2 / (2 lambda): the step of (7) with c = Omega_tt / (2 lambda).
    """
    m = offsets.size - 1
    d = X.shape[1]
    S = np.zeros((m, d))
    for t in range(m):
        for i in range(offsets[t], offsets[t + 1]):
            for k in range(d):
                S[t, k] += a[i] * X[i, k]
    w = np.empty(d)
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        largest = 0.0
        for t in range(m):
            for k in range(d):
                w[k] = 0.0
                for s in range(m):
                    w[k] += omega[t, s] * S[s, k] / (2.0 * lam)
            scale = omega[t, t] / (2.0 * lam)
            for i in range(offsets[t], offsets[t + 1]):
                z = 0.0
                for k in range(d):
                    z += X[i, k] * w[k]
                new = coordinate_update(loss, gamma, y[i], a[i], z, scale * sqnorm[i])
                delta = new - a[i]
                if delta != 0.0:
                    a[i] = new
                    for k in range(d):
                        S[t, k] += delta * X[i, k]
                        w[k] += scale * delta * X[i, k]
                    largest = max(largest, abs(delta))
        if largest <= step_tol:
            break
    return sweeps
