"""Numba kernels of the generative framework's Monte Carlo checks (private: inputs trusted)."""

import numpy as np
from numba import njit, prange

from ebfl._config import CACHE, FASTMATH
from ebfl._kernels import loo_beta_client


@njit(parallel=True, cache=CACHE, fastmath=FASTMATH)
def _theorem3_histograms(hist, x_levels, n, m, variant, post_mean, post_var, mu, var, c):
    """Estimator (6) on replicates given as histograms of the counts z = 0..n.

    hist : (k, n+1) client counts per value of z;  x_levels : z/n
    post_mean, post_var : E[p | z] and Var(p | z) under the true prior
    mu, var, c : true prior mean and variance, and Theorem 3's event radius

    Returns per replicate: mean over clients of E[(p_hat - p)^2 | z], of a^2 and
    of (1 - a)^2, and 1.0 where the event |mu - mu_i| <= c, |var - sigma_i^2| <= c
    failed for some client.
    """
    k, levels = hist.shape
    mse = np.empty(k)
    a2 = np.empty(k)
    one_minus_a2 = np.empty(k)
    failed = np.zeros(k)
    for r in prange(k):
        total = 0.0
        for z in range(levels):
            total += hist[r, z] * x_levels[z]
        xbar = total / m
        ssq = 0.0
        corr_total = 0.0
        for z in range(levels):
            dev = x_levels[z] - xbar
            ssq += hist[r, z] * dev * dev
            corr_total += hist[r, z] * x_levels[z] * (1.0 - x_levels[z]) / (n - 1.0)
        sq = 0.0
        s_a2 = 0.0
        s_oma2 = 0.0
        for z in range(levels):
            h = hist[r, z]
            if h == 0.0:
                continue
            mu_i, v, ai, _, _ = loo_beta_client(x_levels[z], n, m, total, ssq, corr_total, variant)
            est = ai * x_levels[z] + (1.0 - ai) * mu_i
            diff = est - post_mean[z]
            sq += h * (diff * diff + post_var[z])
            s_a2 += h * ai * ai
            s_oma2 += h * (1.0 - ai) * (1.0 - ai)
            if abs(mu - mu_i) > c or abs(var - v) > c:
                failed[r] = 1.0
        mse[r] = sq / m
        a2[r] = s_a2 / m
        one_minus_a2[r] = s_oma2 / m
    return mse, a2, one_minus_a2, failed
