"""Numba kernels of the federated regression rounds (private; inputs are trusted).

Each has a plain-numpy twin in ``tests/naive.py`` that it matches to 1e-12.
"""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH


# Reassociation lets LLVM vectorize the dot products (sums over d); the result
# differs from the strict order by rounding only (the twin test allows 1e-12).
@njit(parallel=True, cache=CACHE, fastmath={"reassoc"} if not FASTMATH else True)
def _linear_gd_clients(X, Y, mask, theta, active, mu, st, sx, lr, local_steps):
    """Algorithm 2's client steps for the clients ``active``, one pass over their data.

    Returns the new theta rows (len(active), d), and per client the squared
    residual norm and |mu - theta|^2 at the round's start (for the Jacobi
    variance steps) and its sample count.
    """
    k = active.size
    n, d = X.shape[1], X.shape[2]
    new = np.empty((k, d))
    rss = np.empty(k)
    dev2 = np.empty(k)
    counts = np.empty(k)
    # Scratch rows allocated once: a heap allocation per client inside the
    # parallel loop costs as much as the arithmetic at n = 10.
    r_all = np.empty((k, n))
    grad_all = np.empty((k, d))
    for a in prange(k):
        i = active[a]
        th = new[a]
        th[:] = theta[i]
        r = r_all[a]
        grad = grad_all[a]
        for step in range(local_steps):
            ss = 0.0
            for j in range(n):
                pred = 0.0
                for c in range(d):
                    pred += X[i, j, c] * th[c]
                r[j] = (Y[i, j] - pred) * mask[i, j]
                ss += r[j] * r[j]
            if step == 0:
                rss[a] = ss
            grad[:] = 0.0
            for j in range(n):
                rj = r[j]
                for c in range(d):
                    grad[c] += X[i, j, c] * rj
            for c in range(d):
                th[c] += lr * (grad[c] / sx + (mu[c] - th[c]) / st)
        s = 0.0
        cnt = 0.0
        for c in range(d):
            diff = mu[c] - theta[i, c]
            s += diff * diff
        for j in range(n):
            cnt += mask[i, j]
        dev2[a] = s
        counts[a] = cnt
    return new, rss, dev2, counts
