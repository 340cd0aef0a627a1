"""The beta-binomial maximum-likelihood solver of :func:`ebfl.eb.beta_binomial_eb`.

Its sufficient statistic (the distinct (n, z) pairs and the margins of the
counts), the log-likelihood and its first two derivatives in the search
coordinates, and a bounded Newton ascent from several starts whose result is
certified by the projected gradient (see ``_tolerance``). Private: the
public API is :func:`ebfl.eb.beta_binomial_eb`.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numba
import numpy as np
from scipy import special

from ebfl._config import MAX_DENSE_TABLE_CELLS
from ebfl._validation import INT64_MAX
from ebfl.eb import _kernels
from ebfl.eb.priors import BetaPrior


def _n_chunks(m, cells=1):
    """Blocks of clients for the parallel count kernels: one per thread when m is large,
    with at most 2^22 table cells (32 MB) in all when each block fills a table."""
    if m < 100_000:
        return 1
    return max(1, min(numba.get_num_threads(), (1 << 22) // cells))



def _log_likelihood(prior, z, n, counts=None):
    """Beta-binomial log-likelihood of all counts under ``prior`` (NaN for None)."""
    if prior is None:
        return float("nan")
    counts = _counts_model(z, n) if counts is None else counts
    a, b = prior.alpha, prior.beta
    return (_loglik_at(-np.log1p(b / a), -np.log1p(a / b), a, b, a + b, counts)
            + counts.log_binomial)



# --------------------------------------------------------------------------- MLE
#
# The beta-binomial log-likelihood of client i is
#   log C(n, z) + sum_{j<z} log(alpha + j) + sum_{j<f} log(beta + j) - sum_{j<n} log(s + j)
# with f = n - z and s = alpha + beta. Writing alpha = mu s, beta = (1 - mu) s and
# D(a, k) = sum_{j<k} log1p(j / a) = log Gamma(a + k) - log Gamma(a) - k log(a), the
# log(s) terms cancel exactly and
#   loglik = const + Z log(mu) + F log(1 - mu) + sum_i [D(alpha, z_i) + D(beta, f_i) - D(s, n_i)],
# Z, F the total successes and failures: the binomial limit (s -> inf) plus corrections
# that vanish as 1/s. Each D is a sum of positive terms, so nothing cancels, even at
# alpha + beta = 1e10, where ``betaln`` differences lose 1e-4 or more.
#
# The sums only involve the z_i, f_i and n_i separately ("margins"): with the weight
# C(j) of clients whose count exceeds j, sum_i D(a, k_i) = sum_j C(j) log1p(j / a).
# Terms j < _DIRECT_TERMS are summed directly; the rest of a large count (the "tail",
# j in [K, k)) by the Euler-Maclaurin formula (see :func:`_tail_sums`).

#: Terms of the finite sums added one by one; beyond, Euler-Maclaurin (error < 1e-20).
_DIRECT_TERMS = 256
#: Search box of the MLE: prior mean in [1e-15, 1 - 1e-15], alpha + beta in [1e-8, 1e12].
_MEAN_MIN = 1e-15
_CONCENTRATION_MIN = 1e-8
_CONCENTRATION_MAX = 1e12
#: The MLE works in (t, phi) = (logit(mean), log(1 + 1/(alpha + beta))): phi -> 0 is the
#: binomial limit, where the log-likelihood is ~linear in phi (a boundary, not a plateau).
_LOWER = np.array([np.log(_MEAN_MIN) - np.log1p(-_MEAN_MIN), np.log1p(1.0 / _CONCENTRATION_MAX)])
_UPPER = np.array([-_LOWER[0], np.log1p(1.0 / _CONCENTRATION_MIN)])
_EDGE_NAMES = (("mean_lower", "concentration_upper"), ("mean_upper", "concentration_lower"))
#: Largest Newton step (in t or phi) and iterations per start.
_MAX_STEP = 4.0
_MAX_ITER = 100
#: Fixed concentrations alpha + beta tried as extra starts, at the pooled mean.
_FIXED_CONCENTRATIONS = (1.0, 100.0, 1e4)

# Euler-Maclaurin: B_2/2!, B_4/4!, B_6/6!.
_EM_COEFFS = (1.0 / 12.0, -1.0 / 720.0, 1.0 / 30240.0)
# Power series (x <= 1/4, 30 terms: truncation < 1e-17 relative) of
#   g(x) = (1+x) log1p(x) - x,  h(x) = x - log1p(x),  q(x) = log1p(x) - x/(1+x),
#   r(x) = x - 2 log1p(x) + x/(1+x),
# whose closed forms cancel for small x. Coefficients of x^2 ... x^31.
_SERIES_X_MAX = 0.25
_R = np.arange(2, 32, dtype=np.float64)
_SIGN = (-1.0) ** _R
_SERIES = {
    "g": _SIGN / (_R * (_R - 1.0)),
    "h": _SIGN / _R,
    "q": _SIGN * (_R - 1.0) / _R,
    "r": -_SIGN * (_R - 2.0) / _R,
}


def _weighted_sum(w, values):
    """sum_k w_k values_k over the distinct pairs (or margin counts), as a float.

    numpy's pairwise sum rather than BLAS's dot: the same digits whatever BLAS's
    thread count, and no thread hand-off. A threaded dot over 17,000 pairs took
    12 ms on a busy 2-core machine, against 0.01 ms for this (measured).
    """
    return float(np.sum(w * values))


def _compress(z, n, with_index=False):
    """Distinct (n, z) pairs with multiplicities: the likelihood's sufficient statistic.

    Returns (nu, zu, w) as float arrays; with ``with_index``, also where each
    client's pair is: a dense table ``T[n, z]`` of pair numbers, or the (m,)
    pair number of every client when the pairs are found by sorting.
    """
    n_max = int(n.max())
    if (n_max + 1) ** 2 <= min(MAX_DENSE_TABLE_CELLS, max(4 * z.size, 1 << 16)):
        chunks = _n_chunks(z.size, (n_max + 1) ** 2)
        table = _kernels._trials_successes_table(z, n, n_max, chunks)
        nu, zu = np.nonzero(table)
        pairs = nu.astype(np.float64), zu.astype(np.float64), table[nu, zu].astype(np.float64)
        if not with_index:
            return pairs
        table[nu, zu] = np.arange(nu.size)  # the table becomes the pairs' index
        return (*pairs, table)
    if n_max * (n_max + 1) + n_max > INT64_MAX:  # the packed key n (n_max + 1) + z overflows
        keys, inverse, counts = np.unique(np.stack([n, z], axis=1), axis=0,
                                          return_inverse=True, return_counts=True)
        nu, zu = keys[:, 0], keys[:, 1]
    else:
        keys, inverse, counts = np.unique(n * (n_max + 1) + z, return_inverse=True,
                                          return_counts=True)
        nu, zu = np.divmod(keys, n_max + 1)
    pairs = nu.astype(np.float64), zu.astype(np.float64), counts.astype(np.float64)
    return (*pairs, inverse.reshape(-1)) if with_index else pairs


class _Margin(NamedTuple):
    """One margin (z, f or n) of the counts, laid out for :func:`_rising_sums`.

    ``cum[j]`` is the weight of clients whose count exceeds j (j < K = cum.size);
    ``tail_k``, ``tail_w``: the counts above K and their weights.
    """

    j: np.ndarray
    cum: np.ndarray
    tail_k: np.ndarray
    tail_w: np.ndarray


class _Counts(NamedTuple):
    """What the beta-binomial log-likelihood needs from the data."""

    successes: _Margin
    failures: _Margin
    trials: _Margin
    total_successes: float
    total_failures: float
    total_trials: float
    n_clients: float
    log_binomial: float  # sum_i log C(n_i, z_i)
    pairs: tuple  # distinct (n, z) pairs and their weights, from :func:`_compress`
    index: np.ndarray  # where each client's pair is (see :func:`_compress`)


def _margin(values, weights):
    """The :class:`_Margin` of counts ``values`` (one per distinct pair) with ``weights``."""
    support, inverse = np.unique(values, return_inverse=True)
    w = np.bincount(inverse, weights=weights)
    k_direct = int(min(_DIRECT_TERMS, support[-1]))
    hist = np.bincount(np.minimum(support, k_direct).astype(np.int64), weights=w,
                       minlength=k_direct + 1)
    cum = np.cumsum(hist[::-1])[::-1][1:]  # cum[j] = weight of counts > j
    tail = support > k_direct
    return _Margin(np.arange(k_direct, dtype=np.float64), cum, support[tail], w[tail])


def _counts_model(z, n):
    """Compress the counts and build the margins of the likelihood."""
    nu, zu, w, index = _compress(z, n, with_index=True)
    fu = nu - zu
    log_binomial = float(np.sum(w * (special.gammaln(nu + 1) - special.gammaln(zu + 1)
                                     - special.gammaln(fu + 1))))
    return _Counts(_margin(zu, w), _margin(fu, w), _margin(nu, w), _weighted_sum(w, zu),
                   _weighted_sum(w, fu), _weighted_sum(w, nu), float(w.sum()), log_binomial,
                   (nu, zu, w), index)


def _series_or_closed(name, x, closed):
    """g, h, q or r of x >= 0: the power series where the closed form cancels."""
    small = x <= _SERIES_X_MAX
    out = np.empty_like(x)
    out[~small] = closed(x[~small])
    xs = x[small]
    out[small] = xs * xs * np.polynomial.polynomial.polyval(xs, _SERIES[name])
    return out


def _g(x):
    return _series_or_closed("g", x, lambda y: (1.0 + y) * np.log1p(y) - y)


def _h(x):
    return _series_or_closed("h", x, lambda y: y - np.log1p(y))


def _q(x):
    return _series_or_closed("q", x, lambda y: np.log1p(y) - y / (1.0 + y))


def _r(x):
    return _series_or_closed("r", x, lambda y: y - 2.0 * np.log1p(y) + y / (1.0 + y))


def _tail_sums(a, big_k, k, w, derivatives):
    """Weighted sums over j in [K, k) of log1p(j/a) (and of j/(a+j), ja/(a+j)^2, (j/(a+j))^2).

    Euler-Maclaurin: sum_{j=K}^{k-1} f(j) = int_K^k f + (f(K) - f(k))/2
    + sum_r B_2r/(2r)! (f^(2r-1)(k) - f^(2r-1)(K)); f varies on the scale a + K >= K, so
    three correction terms leave an error below 1e-20. The integrals are written with
    b = a + K, x = (k - K)/b as sums of positive terms (nothing cancels at large a):
      int log1p(j/a)   = (k-K) log1p(K/a) + b g(x)
      int j/(a+j)      = b h(x) + K log1p(x)
      int ja/(a+j)^2   = a (q(x) + K x / (b (1+x)))
      int j^2/(a+j)^2  = K^2 x / (b (1+x)) + 2 K q(x) + b r(x)
    """
    b = a + big_k
    kp = k - big_k
    x = kp / b
    ends = np.array([big_k]), k

    def euler_maclaurin(integral, f, d1, d3, d5):
        corr = 0.5 * (f(ends[0]) - f(ends[1]))
        for c, d in zip(_EM_COEFFS, (d1, d3, d5), strict=True):
            corr = corr + c * (d(ends[1]) - d(ends[0]))
        return _weighted_sum(w, integral + corr)

    value = euler_maclaurin(
        kp * np.log1p(big_k / a) + b * _g(x), lambda j: np.log1p(j / a),
        lambda j: 1.0 / (a + j), lambda j: 2.0 / (a + j) ** 3, lambda j: 24.0 / (a + j) ** 5)
    if not derivatives:
        return value
    qx = _q(x)
    first = euler_maclaurin(
        b * _h(x) + big_k * np.log1p(x), lambda j: j / (a + j), lambda j: a / (a + j) ** 2,
        lambda j: 6.0 * a / (a + j) ** 4, lambda j: 120.0 * a / (a + j) ** 6)
    second = euler_maclaurin(
        a * (qx + big_k * x / (b * (1.0 + x))), lambda j: j * a / (a + j) ** 2,
        lambda j: a * (a - j) / (a + j) ** 3, lambda j: 6.0 * a * (3.0 * a - j) / (a + j) ** 5,
        lambda j: 120.0 * a * (5.0 * a - j) / (a + j) ** 7)
    square = euler_maclaurin(
        big_k * big_k * x / (b * (1.0 + x)) + 2.0 * big_k * qx + b * _r(x),
        lambda j: (j / (a + j)) ** 2, lambda j: 2.0 * a * j / (a + j) ** 3,
        lambda j: 12.0 * a * (j - a) / (a + j) ** 5,
        lambda j: 240.0 * a * (j - 2.0 * a) / (a + j) ** 7)
    return value, first, second, square


def _rising_sums(a, margin, derivatives=False):
    """Weighted sums over clients i and j < k_i of log1p(j/a), and optionally of
    j/(a+j), j a/(a+j)^2 and (j/(a+j))^2.

    The first is sum_i D(a, k_i); the others give its derivatives in log(a):
    dD/dlog(a) = -sum j/(a+j), d2D/dlog(a)^2 = sum j a/(a+j)^2. All four are sums
    of positive terms.
    """
    j, cum = margin.j, margin.cum
    value = float(cum @ np.log1p(j / a))
    if margin.tail_k.size:
        tail = _tail_sums(a, float(j.size), margin.tail_k, margin.tail_w, derivatives)
    else:
        tail = (0.0, 0.0, 0.0, 0.0) if derivatives else 0.0
    if not derivatives:
        return value + tail
    ratio = j / (a + j)
    direct = (value, float(cum @ ratio), float(cum @ (ratio * a / (a + j))),
              float(cum @ (ratio * ratio)))
    return tuple(d + t for d, t in zip(direct, tail, strict=True))


def _mean_concentration(x):
    """(mu, 1 - mu, s) of a point (t, phi), each without cancellation."""
    t, phi = x
    return special.expit(t), special.expit(-t), 1.0 / np.expm1(phi)


def _loglik_at(log_mu, log_nu, alpha, beta, s, counts):
    """Log-likelihood (binomial coefficients excluded) in the cancellation-free form."""
    return (counts.total_successes * log_mu + counts.total_failures * log_nu
            + _rising_sums(alpha, counts.successes) + _rising_sums(beta, counts.failures)
            - _rising_sums(s, counts.trials))


def _value(x, counts):
    """Log-likelihood at (t, phi), as :func:`_derivatives` computes it."""
    mu, nu, s = _mean_concentration(x)
    t = x[0]
    return _loglik_at(-np.logaddexp(0.0, -t), -np.logaddexp(0.0, t), mu * s, nu * s, s,
                      counts)


def _derivatives(x, counts):
    """Log-likelihood, gradient and Hessian in (t, phi) = (logit(mean), log(1 + 1/s)).

    With u = log(s): dlog(alpha)/dt = 1 - mu, dlog(beta)/dt = -mu, dlog(alpha)/du =
    dlog(beta)/du = 1, du/dphi = -(s + 1), d2u/dphi2 = s (s + 1). The second
    derivative in phi is assembled per margin as (s+1) (D'' - s G), G the sum of
    (j/(a+j))^2, which stays accurate as s -> inf (D'' + s D' would cancel).
    """
    mu, nu, s = _mean_concentration(x)
    t = x[0]
    zero, a1, a2, ag = _rising_sums(mu * s, counts.successes, True)
    one, b1, b2, bg = _rising_sums(nu * s, counts.failures, True)
    two, c1, c2, cg = _rising_sums(s, counts.trials, True)
    zt, ft = counts.total_successes, counts.total_failures
    value = (zt * -np.logaddexp(0.0, -t) + ft * -np.logaddexp(0.0, t) + zero + one - two)
    # First derivatives in log(alpha), log(beta), log(s) are -a1, -b1, -c1.
    d_t = zt * nu - ft * mu - nu * a1 + mu * b1
    d_u = -a1 - b1 + c1
    d_tt = -(zt + ft) * mu * nu + mu * nu * (a1 + b1) + nu * nu * a2 + mu * mu * b2
    d_tu = nu * a2 - mu * b2
    d_pp = (s + 1.0) * ((a2 - s * ag) + (b2 - s * bg) - (c2 - s * cg))
    grad = np.array([d_t, -(s + 1.0) * d_u])
    hess = np.array([[d_tt, -(s + 1.0) * d_tu], [-(s + 1.0) * d_tu, d_pp]])
    return value, grad, hess


class _Tolerance(NamedTuple):
    """Convergence tolerances, relative to the total number of trials N.

    gain: largest predicted gain 1/2 g' |H|^-1 g of a Newton step at a converged
    point; stall: the same where no step increases the computed log-likelihood
    any more (its terms are up to ~N log(n) in size, so it is exact to a few
    1e-15 N only); curvature: largest allowed positive curvature, also the floor
    of |H| in flat directions.
    """

    gain: float
    stall: float
    curvature: float


def _tolerance(counts):
    scale = 1.0 + counts.total_trials
    return _Tolerance(1e-14 * scale, 1e-12 * scale, 1e-12 * scale)


def _free_coordinates(x, grad):
    """Coordinates not held at a bound by a gradient pointing out of the box."""
    return ~(((x <= _LOWER) & (grad < 0)) | ((x >= _UPPER) & (grad > 0)))


def _ascent_direction(grad, hess, free, tol):
    """Eigenvalue-modified Newton direction on the free coordinates.

    Returns the direction, the predicted gain 1/2 g' |H|^-1 g of the step and the
    largest curvature of the log-likelihood in the free subspace. |H| has the
    absolute values of the eigenvalues of H (floored), so the direction ascends
    even where H is indefinite; a positive eigenvalue (saddle, or the convex side
    of a plateau) is followed at least one unit along its eigenvector.
    """
    direction = np.zeros(2)
    if not free.any():
        return direction, 0.0, -np.inf
    g = grad[free]
    eig, vec = np.linalg.eigh(hess[np.ix_(free, free)])
    size = np.maximum(np.abs(eig), max(1e-10 * np.max(np.abs(eig)), tol.curvature))
    proj = vec.T @ g
    coef = proj / size
    convex = eig > tol.curvature
    coef[convex] = np.where(proj[convex] < 0, -1.0, 1.0) * np.maximum(np.abs(coef[convex]), 1.0)
    step = vec @ coef
    step *= min(1.0, _MAX_STEP / max(np.max(np.abs(step)), 1e-300))
    direction[free] = step
    return direction, 0.5 * float(proj @ (proj / size)), float(eig.max())


def _line_search(x, value, grad, direction, counts):
    """Backtracking (Armijo) along the projected path clip(x + tau d); None if no gain."""
    tau = 1.0
    for _ in range(60):
        x_new = np.clip(x + tau * direction, _LOWER, _UPPER)
        moved = x_new - x
        if not np.any(moved):
            return None
        value_new = _value(x_new, counts)
        if value_new >= value + 1e-4 * float(grad @ moved) and value_new > value:
            return x_new
        tau *= 0.5
    return None


class _Run(NamedTuple):
    x: np.ndarray
    value: float
    n_iter: int
    converged: bool
    gain: float


def _newton_ascent(x0, counts, tol):
    """Projected, eigenvalue-modified Newton ascent of the log-likelihood in (t, phi).

    Written out rather than calling scipy.optimize: the box must be handled as
    a constraint with Karush-Kuhn-Tucker checks (the supremum is often on an
    edge), and indefinite Hessians must give ascent steps of bounded length.
    Converged means: on the coordinates not held at an edge by the gradient,
    the predicted gain of a Newton step is <= ``tol.gain`` (``tol.stall`` once no
    step increases the computed value) and the curvature is not positive (a
    local maximum in the box, not a saddle or the convex side of a plateau).
    """
    x = np.clip(np.asarray(x0, float), _LOWER, _UPPER)
    value, grad, hess = _derivatives(x, counts)
    for it in range(_MAX_ITER + 1):
        free = _free_coordinates(x, grad)
        direction, gain, curvature = _ascent_direction(grad, hess, free, tol)
        if gain <= tol.gain and curvature <= tol.curvature:
            return _Run(x, value, it, True, gain)
        if it == _MAX_ITER:
            break
        x_new = _line_search(x, value, grad, direction, counts)
        if x_new is None and np.any(grad[free]):  # fall back to the gradient direction
            g = np.where(free, grad, 0.0)
            x_new = _line_search(x, value, grad, g * (_MAX_STEP / np.max(np.abs(g))), counts)
        if x_new is None:  # no computable gain left: converged if at rounding level
            return _Run(x, value, it, gain <= tol.stall and curvature <= tol.curvature, gain)
        x = x_new
        value, grad, hess = _derivatives(x, counts)
    return _Run(x, value, _MAX_ITER, False, gain)


def _to_search(prior):
    """(t, phi) of a Beta prior, clipped to the search box."""
    x = np.array([np.log(prior.alpha) - np.log(prior.beta),
                  np.log1p(1.0 / (prior.alpha + prior.beta))])
    return np.clip(x, _LOWER, _UPPER)


def _from_search(x):
    mu, nu, s = _mean_concentration(x)
    return BetaPrior(mu * s, nu * s)


def _pooled_start(counts):
    """Pooled mean and the concentration of the Pearson overdispersion estimate.

    Var(z_i) = n_i p (1-p) (1 + (n_i - 1) rho) with rho = 1/(s + 1), so
    sum_i (z_i - n_i p)^2 / (n_i p (1-p)) ~ (m - 1) + rho sum_i (n_i - 1).
    """
    nu, zu, w = counts.pairs
    p = float(np.clip(counts.total_successes / counts.total_trials, _MEAN_MIN, 1 - _MEAN_MIN))
    pearson = _weighted_sum(w, (zu - nu * p) ** 2 / (nu * p * (1.0 - p)))
    rho = (pearson - (counts.n_clients - 1.0)) / (counts.total_trials - counts.n_clients)
    rho = float(np.clip(rho, 1e-8, 1.0 - 1e-8))
    return p, 1.0 / rho - 1.0


def _mle_starts(prior, moment_prior, counts):
    """Labelled starting points in (t, phi), first the user's prior, then the moments."""
    starts = []
    if prior is not None:
        starts.append(("prior", prior))
    if moment_prior is not None:
        starts.append(("moments", moment_prior))
    p, s = _pooled_start(counts)
    starts.append(("pooled_moments", BetaPrior(p * s, (1 - p) * s)))
    for s in _FIXED_CONCENTRATIONS:
        starts.append((f"concentration={s:g}", BetaPrior(p * s, (1 - p) * s)))
    unique = []
    for label, start in starts:
        x = _to_search(start)
        if all(np.max(np.abs(x - y)) > 1e-6 for _, _, y in unique):
            unique.append((label, start, x))
    return unique


def _active_bounds(x):
    names = [name for side, edge in zip((x <= _LOWER, x >= _UPPER), _EDGE_NAMES, strict=True)
             for hit, name in zip(side, edge, strict=True) if hit]
    return tuple(names)


def _best_run(runs, tol):
    """Highest log-likelihood; among ties (within rounding, tol.stall): converged, earliest."""
    top = max(run.value for _, _, run in runs)
    tied = [r for r in runs if r[2].value >= top - tol.stall]
    return next((r for r in tied if r[2].converged), tied[0])


def _mle_fit(prior, moment_prior, counts):
    """The maximum-likelihood Beta prior, from several starts: (prior, diagnostics).

    ``prior``: a user's start or None; ``moment_prior``: the moment
    estimator's prior (None where the moments define none); ``counts``:
    :func:`_counts_model` of the data.
    """
    tol = _tolerance(counts)
    runs = [(label, start, _newton_ascent(x, counts, tol))
            for label, start, x in _mle_starts(prior, moment_prior, counts)]
    label, start, best = _best_run(runs, tol)
    bounds = _active_bounds(best.x)
    diagnostics = {
        "converged": best.converged, "n_iter": best.n_iter,
        "start": (start.alpha, start.beta), "start_from": label,
        "at_bound": bool(bounds), "active_bounds": bounds,
        "n_distinct_counts": int(counts.pairs[0].size),
        "predicted_gain": best.gain,
        "n_iter_total": sum(run.n_iter for _, _, run in runs),
        "starts": tuple((lab, float(run.value + counts.log_binomial), run.converged)
                        for lab, _, run in runs),
    }
    if not best.converged:
        warnings.warn(f"beta_binomial_eb(method='mle'): the optimizer did not converge "
                      f"(predicted gain {best.gain:.3g} of a further Newton step); the "
                      "returned prior may not maximize the likelihood", RuntimeWarning,
                      stacklevel=3)
    return _from_search(best.x), diagnostics
