"""Plain-numpy twins of the DP-PFL kernels (``ebfl.dppfl._kernels``), written independently.

The generator is splitmix64 in numpy uint64 arrays (which wrap silently); the
SDCA step minimizes the local subproblem (7) along one coordinate by its own
closed form per loss.
"""

import numpy as np

_G = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(z):
    z = np.atleast_1d(np.asarray(z, dtype=np.uint64)).copy()
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def key(seed, iteration, device, purpose):
    h = mix64(np.uint64(seed))
    for x in (iteration, device, purpose):
        h = mix64(h ^ np.uint64(x))
    return h


def uniforms(k, count):
    n = np.arange(count, dtype=np.uint64)
    bits = mix64(k + (n + np.uint64(1)) * _G) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) / 2.0**53


def normals(k, count):
    u = uniforms(k, 2 * ((count + 1) // 2)).reshape(-1, 2)
    r = np.sqrt(-2.0 * np.log(u[:, 0]))
    phi = 2.0 * np.pi * u[:, 1]
    return np.column_stack([r * np.cos(phi), r * np.sin(phi)]).ravel()[:count]


def coordinate_min(loss, gamma, y, a, z, curvature):
    """argmin over b of conj(-b) + (b - a) z + curvature (b - a)^2 / 2 on the domain."""
    if loss == "squared":  # conj(-b) = -b y + b^2 / 2
        return (y + curvature * a - z) / (1.0 + curvature)
    g = gamma if loss == "smoothed_hinge" else 0.0
    # in s = b y in [0, 1]: -s + g s^2 / 2 + (s - a y) y z + curvature (s - a y)^2 / 2
    s = (1.0 - y * z + curvature * a * y) / (g + curvature)
    return y * np.clip(s, 0.0, 1.0)


def sdca(X, y, alpha, w, c, loss, gamma, n_iter, k):
    n = X.shape[0]
    idx = np.minimum((uniforms(k, n_iter) * n).astype(np.int64), n - 1)
    dalpha, v = np.zeros(n), np.zeros(X.shape[1])
    for j in idx:
        a = alpha[j] + dalpha[j]
        z = X[j] @ (w + c * v)
        new = coordinate_min(loss, gamma, y[j], a, z, c * (X[j] @ X[j]))
        dalpha[j] += new - a
        v += (new - a) * X[j]
    return dalpha, v


def n_iterations(seed, iteration, device, n_min, tau):
    low = int(round((1.0 - tau) * n_min))
    if low >= n_min:
        return n_min
    u = uniforms(key(seed, iteration, device, 2), 1)[0]
    return min(low + int(u * (n_min - low + 1)), n_min)


def run(X, y, offsets, lam, xi, omega, iterations, *, loss="hinge", gamma=1.0, seed=0,
        n_min=None, tau=0.0, drop=0.0, dual_std=None, sigma2=None, s2_printed=True):
    """Algorithm 1 for fixed Omega, one device after another: (alpha, V, active)."""
    m, d = len(offsets) - 1, X.shape[1]
    sizes = np.diff(offsets)
    n_min = int(sizes.min()) if n_min is None else n_min
    private = dual_std is not None
    alpha, V, active = np.zeros(X.shape[0]), np.zeros((m, d)), np.zeros(m, dtype=int)
    beta = xi * m
    for it in range(iterations):
        W = omega @ V / (2 * lam)
        U = np.zeros((m, d))
        for t in range(m):
            lo, hi = offsets[t], offsets[t + 1]
            if drop > 0 and uniforms(key(seed, it, t, 1), 1)[0] < drop:
                continue
            c = beta * omega[t, t] / (2 * lam)
            nit = n_iterations(seed, it, t, n_min, tau)
            da, v = sdca(X[lo:hi], y[lo:hi], alpha[lo:hi], W[t], c, loss, gamma, nit,
                         key(seed, it, t, 3))
            alpha[lo:hi] += xi * da
            alpha[lo:hi][np.abs(alpha[lo:hi]) < 1e-250] = 0.0  # the kernel's flush to zero
            if private:
                noisy = da + dual_std[t] * normals(key(seed, it, t, 4), hi - lo)
                s2 = 2 * xi * (np.linalg.norm(noisy) if s2_printed else 1.0)
                U[t] = xi * X[lo:hi].T @ noisy + s2 * sigma2[t] * normals(key(seed, it, t, 5), d)
            else:
                U[t] = xi * v
            active[t] += 1
        V += U
    return alpha, V, active
