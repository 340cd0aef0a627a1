r"""Theorem 6: personalized linear regression with a known Gaussian prior (Theorem 6 of the paper).

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

from ebfl._validation import check_choice, check_real_scalar
from ebfl.learning.data import _data_iv, _mean_iv, _variance_iv

__all__ = ["local_least_squares", "marginal_loglik", "posterior_regression"]

CHUNK = 1024  # clients per batched linear solve (bounds memory to CHUNK * d^2 doubles)


def posterior_regression(data, mu, sigma_theta2, sigma_x2, *, form=None):
    """Posterior means (15) and their risks Tr(M^{-1}) (16) for every client.

    Parameters
    ----------
    data : RegressionData
    mu : float or array_like, shape (d,)
    sigma_theta2, sigma_x2 : float
        Prior and noise variances, in [1e-300, 1e150].
    form : {"n", "d"}, optional
        Solve in sample space (n x n, cheaper when n < d) or parameter space;
        default the smaller.

    Returns
    -------
    theta_hat : ndarray of shape (m, d)
    risk : ndarray of shape (m,)
        Tr(M^{-1}), the exact MSE of theta_hat_i given X_i.
    """
    m, n, d = _data_iv(data).X.shape
    mu = _mean_iv(mu, d, "mu")
    st = _variance_iv(sigma_theta2, "sigma_theta2")
    sx = _variance_iv(sigma_x2, "sigma_x2")
    form = ("n" if n < d else "d") if form is None else check_choice(form, "form", ("n", "d"))
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
            risk[lo:lo + CHUNK] = d * st - st * st * np.trace(sol[..., 1:], axis1=1, axis2=2)
        else:
            M = np.eye(d) / st + np.einsum("kid,kie->kde", X, X) / sx
            rhs = np.einsum("kid,ki->kd", X, Y) / sx + mu / st
            inv = np.linalg.inv(M)
            theta[lo:lo + CHUNK] = np.einsum("kde,ke->kd", inv, rhs)
            risk[lo:lo + CHUNK] = np.trace(inv, axis1=1, axis2=2)
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
        of theta_i and has no risk formula, errata [!14]).
    rcond : float
        Relative cut-off for small singular values (numpy's pinv), in [0, 1].

    Returns
    -------
    theta_hat : ndarray of shape (m, d)
    risk : ndarray of shape (m,), only if ``sigma_x2`` is given
    """
    m, _, d = _data_iv(data).X.shape
    sx = None if sigma_x2 is None else _variance_iv(sigma_x2, "sigma_x2")
    rcond = check_real_scalar(rcond, "rcond", low=0.0, high=1.0)
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
    if sx is None:
        return theta
    return theta, sx * risk


def marginal_loglik(data, mu, sigma_theta2, sigma_x2):
    """Marginal log-likelihood sum_i log N(Y_i; X_i mu, sigma_theta^2 X_i X_i^T + sigma_x^2 I).

    The objective that empirical Bayes maximizes over (mu, sigma_theta^2,
    sigma_x^2) with the theta_i integrated out (padding rows excluded).
    """
    m, n, d = _data_iv(data).X.shape
    mu = _mean_iv(mu, d, "mu")
    st = _variance_iv(sigma_theta2, "sigma_theta2")
    sx = _variance_iv(sigma_x2, "sigma_x2")
    total = 0.0
    for lo in range(0, m, CHUNK):
        X, Y = data.X[lo:lo + CHUNK], data.Y[lo:lo + CHUNK]
        resid = Y - np.einsum("kid,d->ki", X, mu)
        logdet, quad = (_logdet_quad_n if n <= d else _logdet_quad_d)(X, resid, st, sx)
        total += float(np.sum(-0.5 * (n * np.log(2 * np.pi) + logdet + quad)))
    # A padded row is an independent N(0, sigma_x^2) "observation" of 0: remove it.
    n_pad = data.mask.size - data.mask.sum()
    return total + 0.5 * n_pad * (np.log(2 * np.pi) + np.log(sx))


def _logdet_quad_n(X, resid, st, sx):
    """log det K and r^T K^{-1} r with K = st X X^T + sx I_n, in the n x n form (n <= d)."""
    n = X.shape[1]
    K = st * np.einsum("kid,kjd->kij", X, X) + sx * np.eye(n)
    _, logdet = np.linalg.slogdet(K)
    quad = np.einsum("ki,ki->k", resid, np.linalg.solve(K, resid[..., None])[..., 0])
    return logdet, quad


def _logdet_quad_d(X, resid, st, sx):
    """The same in the d x d form (n > d), where K = st X X^T + sx I_n has rank-d signal.

    With A = (sx/st) I_d + X^T X: det K = sx^n (st/sx)^d det A (determinant lemma)
    and K^{-1} = (I - X A^{-1} X^T) / sx (Woodbury). The n x n form would be
    singular in float64 once sx is ~1e-16 of st |X|^2, while A stays invertible.
    """
    n, d = X.shape[1], X.shape[2]
    A = (sx / st) * np.eye(d) + np.einsum("kid,kie->kde", X, X)
    _, logdet_a = np.linalg.slogdet(A)
    xr = np.einsum("kid,ki->kd", X, resid)
    quad = (np.einsum("ki,ki->k", resid, resid)
            - np.einsum("kd,kd->k", xr, np.linalg.solve(A, xr[..., None])[..., 0])) / sx
    return n * np.log(sx) + d * np.log(st / sx) + logdet_a, quad


def _fit_trace(X, st, sx):
    """Tr(X_i Cov_i X_i^T) per client, Cov_i the posterior covariance M^{-1} of (15).

    Computed in the smaller of the two spaces, as :func:`posterior_regression`
    does: sx n - sx^2 Tr(K^{-1}) with K = st X X^T + sx I_n when n < d, else
    Tr(M^{-1} X^T X) with M = I/st + X^T X/sx (the n x n K is singular in
    float64 when n > d and sx << st |X|^2).
    """
    n, d = X.shape[1], X.shape[2]
    if n < d:
        K = st * np.einsum("kid,kjd->kij", X, X) + sx * np.eye(n)
        return sx * n - sx * sx * np.trace(np.linalg.inv(K), axis1=1, axis2=2)
    gram = np.einsum("kid,kie->kde", X, X)
    M = np.eye(d) / st + gram / sx
    return np.trace(np.linalg.solve(M, gram), axis1=1, axis2=2)
