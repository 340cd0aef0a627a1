r"""Theorem 6: personalized linear regression with a known Gaussian prior (spec C.10).

Client i has Y_i = X_i theta_i + w_i, w_i ~ N(0, sigma_x^2 I_n), theta_i ~ N(mu, sigma_theta^2 I_d).

* (15) posterior mean theta_hat_i = M^{-1}(X_i^T Y_i / sigma_x^2 + mu / sigma_theta^2),
  M = I/sigma_theta^2 + X_i^T X_i / sigma_x^2;
* (16) its risk given X_i, E|theta_hat_i - theta_i|^2 = Tr(M^{-1}) (exact);
* (17) local least squares (X_i^T X_i)^+ X_i^T Y_i (the minimum-norm solution when
  X_i^T X_i is singular, e.g. n < d);
* (18) its risk sigma_x^2 Tr((X_i^T X_i)^{-1}), defined only when X_i^T X_i is invertible.

With n < d the computation uses the n x n form (Woodbury):
theta_hat = mu + sigma_theta^2 X^T K^{-1} (Y - X mu), K = sigma_theta^2 X X^T + sigma_x^2 I_n,
Tr(M^{-1}) = d sigma_theta^2 - sigma_theta^4 Tr(K^{-1} X X^T).
"""

from __future__ import annotations

import numpy as np

from ebfl._validation import check_finite_array, check_positive_scalar
from ebfl.learning.data import RegressionData

__all__ = ["local_least_squares", "marginal_loglik", "posterior_regression"]

CHUNK = 1024  # clients per batched linear solve (bounds memory to CHUNK * d^2 doubles)


def _mu_iv(mu, d):
    mu = check_finite_array(mu, "mu", ndim=(0, 1))
    mu = np.broadcast_to(mu, (d,)) if mu.ndim == 0 else mu
    if mu.shape != (d,):
        raise ValueError(f"mu must be a scalar or have shape ({d},), got {mu.shape}")
    return mu


def posterior_regression(data, mu, sigma_theta2, sigma_x2, *, form=None):
    """Posterior means (15) and their risks Tr(M^{-1}) (16) for every client.

    Parameters
    ----------
    data : RegressionData
    mu : float or array_like, shape (d,)
    sigma_theta2, sigma_x2 : float
        Prior and noise variances, > 0.
    form : {"n", "d"}, optional
        Solve in sample space (n x n, cheaper when n < d) or parameter space;
        default the smaller.

    Returns
    -------
    theta_hat : ndarray of shape (m, d)
    risk : ndarray of shape (m,)
        Tr(M^{-1}), the exact MSE of theta_hat_i given X_i.
    """
    if not isinstance(data, RegressionData):
        raise TypeError("data must be a RegressionData")
    m, n, d = data.X.shape
    mu = _mu_iv(mu, d)
    st = check_positive_scalar(sigma_theta2, "sigma_theta2")
    sx = check_positive_scalar(sigma_x2, "sigma_x2")
    form = form or ("n" if n < d else "d")
    theta = np.empty((m, d))
    risk = np.empty(m)
    for lo in range(0, m, CHUNK):
        X, Y = data.X[lo:lo + CHUNK], data.Y[lo:lo + CHUNK]
        if form == "n":
            xxt = np.einsum("kid,kjd->kij", X, X)
            K = st * xxt + sx * np.eye(n)
            resid = Y - np.einsum("kid,d->ki", X, mu)
            sol = np.linalg.solve(K, np.concatenate([resid[..., None], xxt], axis=2))
            theta[lo:lo + CHUNK] = mu + st * np.einsum("kid,ki->kd", X, sol[..., 0])
            risk[lo:lo + CHUNK] = d * st - st**2 * np.trace(sol[..., 1:], axis1=1, axis2=2)
        elif form == "d":
            M = np.eye(d) / st + np.einsum("kid,kie->kde", X, X) / sx
            rhs = np.einsum("kid,ki->kd", X, Y) / sx + mu / st
            inv = np.linalg.inv(M)
            theta[lo:lo + CHUNK] = np.einsum("kde,ke->kd", inv, rhs)
            risk[lo:lo + CHUNK] = np.trace(inv, axis1=1, axis2=2)
        else:
            raise ValueError(f"form must be 'n' or 'd', got {form!r}")
    return theta, risk


def local_least_squares(data, sigma_x2=None, *, rcond=1e-12):
    """Local estimator (17) and, when sigma_x2 is given, its risk (18).

    Parameters
    ----------
    data : RegressionData
    sigma_x2 : float, optional
        Noise variance; the risk sigma_x^2 Tr((X^T X)^{-1}) is returned for
        clients whose X_i^T X_i is invertible and NaN for the others (with
        n_i < d the pseudo-inverse estimator is biased by the unseen directions
        of theta_i and has no risk formula, spec [!14]).
    rcond : float
        Relative cut-off for small singular values (numpy's pinv).

    Returns
    -------
    theta_hat : ndarray of shape (m, d)
    risk : ndarray of shape (m,), only if ``sigma_x2`` is given
    """
    if not isinstance(data, RegressionData):
        raise TypeError("data must be a RegressionData")
    m, _, d = data.X.shape
    theta = np.empty((m, d))
    risk = np.full(m, np.nan)
    for lo in range(0, m, CHUNK):
        X, Y = data.X[lo:lo + CHUNK], data.Y[lo:lo + CHUNK]
        theta[lo:lo + CHUNK] = np.einsum("kdi,ki->kd", np.linalg.pinv(X, rcond=rcond), Y)
        if sigma_x2 is not None:
            gram = np.einsum("kid,kie->kde", X, X)
            full = np.linalg.matrix_rank(gram) == d
            if full.any():
                risk[lo:lo + CHUNK][full] = np.trace(np.linalg.inv(gram[full]), axis1=1,
                                                      axis2=2)
    if sigma_x2 is None:
        return theta
    sx = check_positive_scalar(sigma_x2, "sigma_x2")
    return theta, sx * risk


def marginal_loglik(data, mu, sigma_theta2, sigma_x2):
    """Marginal log-likelihood sum_i log N(Y_i; X_i mu, sigma_theta^2 X_i X_i^T + sigma_x^2 I).

    The objective that empirical Bayes maximizes over (mu, sigma_theta^2,
    sigma_x^2) with the theta_i integrated out (padding rows excluded).
    """
    if not isinstance(data, RegressionData):
        raise TypeError("data must be a RegressionData")
    m, n, d = data.X.shape
    mu = _mu_iv(mu, d)
    st = check_positive_scalar(sigma_theta2, "sigma_theta2")
    sx = check_positive_scalar(sigma_x2, "sigma_x2")
    total = 0.0
    for lo in range(0, m, CHUNK):
        X, Y = data.X[lo:lo + CHUNK], data.Y[lo:lo + CHUNK]
        K = st * np.einsum("kid,kjd->kij", X, X) + sx * np.eye(n)
        resid = Y - np.einsum("kid,d->ki", X, mu)
        _, logdet = np.linalg.slogdet(K)
        quad = np.einsum("ki,ki->k", resid, np.linalg.solve(K, resid[..., None])[..., 0])
        total += float(np.sum(-0.5 * (n * np.log(2 * np.pi) + logdet + quad)))
    # A padded row is an independent N(0, sigma_x^2) "observation" of 0: remove it.
    n_pad = data.mask.size - data.mask.sum()
    return total + 0.5 * n_pad * (np.log(2 * np.pi) + np.log(sx))
