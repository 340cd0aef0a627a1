"""Beta-Bernoulli (beta-binomial) empirical Bayes: Section 2.2, eq. (6) and Theorem 3.

Client ``i`` has ``z_i`` successes in ``n_i`` Bernoulli trials with success
probability ``p_i ~ Beta(alpha, beta)``. Every method returns the posterior
Beta(alpha_i + z_i, beta_i + n_i - z_i); the methods differ in how the prior
(or the per-client leave-one-out prior) is obtained.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numba
import numpy as np
from scipy import special

from ebfl._config import MAX_DENSE_TABLE_CELLS
from ebfl._kernels import count_bernoulli, count_bytes
from ebfl._validation import INT64_MAX, check_bool, check_choice, check_counts
from ebfl.eb import _kernels
from ebfl.eb.priors import BetaPrior
from ebfl.eb.results import BetaBinomialEBResult, BetaPosterior
from ebfl.ragged import Ragged

__all__ = ["METHODS", "beta_bernoulli_eb", "beta_binomial_eb", "bernoulli_counts",
           "check_binomial_counts"]

_LOO_VARIANTS = {
    "loo_printed": _kernels.LOO_PRINTED,
    "loo_proof": _kernels.LOO_PROOF,
    "loo_corrected": _kernels.LOO_CORRECTED,
}
#: The values of :func:`beta_binomial_eb`'s ``method``.
METHODS = ("mle", "moments", *_LOO_VARIANTS)

def bernoulli_counts(data):
    """Successes and trials per client from ragged 0/1 observations.

    Parameters
    ----------
    data : Ragged
        One 0/1 observation per entry (bool, integer or float values).

    Returns
    -------
    successes, trials : ndarray of shape (m,), int64

    Raises
    ------
    ValueError
        If a value is not 0 or 1 (NaN included) or a client has no observations.
    """
    return _count_ones(_bernoulli_values(data), data.offsets, np.int64)


def _bernoulli_values(data):
    """The values of ragged 0/1 data, bool viewed as uint8; refuses other layouts and dtypes."""
    if not isinstance(data, Ragged):
        raise TypeError(f"data must be a ebfl.Ragged, got {type(data).__name__}")
    values = data.values
    if values.ndim != 1:
        raise ValueError(f"data.values must be 1-D (one 0/1 observation per entry), got shape "
                         f"{values.shape}")
    if values.dtype == bool:
        return values.view(np.uint8)
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise TypeError(f"data.values must be bool, integer or float, got {values.dtype}")
    return values


def _count_ones(values, offsets, dtype):
    """Ones and observations per client (``dtype`` arrays), refusing empty clients and
    values other than 0 and 1.

    1-byte data that are 8-byte aligned (numpy's own allocations are) are read
    a word at a time (:func:`ebfl._kernels.count_bytes`); other dtypes, and
    a slice that starts off alignment, by the generic kernel, which also locates
    invalid values for the error message.
    """
    m = offsets.size - 1
    if values.itemsize == 1 and values.flags.c_contiguous and values.ctypes.data % 8 == 0:
        values = values.view(np.uint8)
        ones, trials = np.empty(m, dtype), np.empty(m, dtype)
        words = values[:values.size - values.size % 8].view(np.uint64)
        if count_bytes(values, words, offsets, ones, trials) == 0:
            _check_nonempty(trials, "data")
            return ones, trials
    trials = np.diff(offsets)
    _check_nonempty(trials, "data")
    successes, invalid = count_bernoulli(values, offsets)
    n_invalid = int(invalid.sum())
    if n_invalid:
        first = int(np.flatnonzero(invalid)[0])
        raise ValueError(f"data.values must be 0 or 1; {n_invalid} value(s) are not "
                         f"(first in client {first})")
    return successes, trials


def beta_bernoulli_eb(data, **kwargs):
    """Beta-Bernoulli empirical Bayes from ragged 0/1 observations.

    Counts the successes of every client with a Numba kernel (one pass over the
    data, validation fused in) and calls :func:`beta_binomial_eb`.

    Parameters
    ----------
    data : Ragged
        0/1 observations of m clients.
    **kwargs
        Passed to :func:`beta_binomial_eb`.

    Returns
    -------
    BetaBinomialEBResult

    Examples
    --------
    >>> from ebfl import Ragged
    >>> data = Ragged.from_lists([[1, 1, 0], [0, 0, 0, 1], [1, 1], [0, 1, 1, 1]])
    >>> res = beta_bernoulli_eb(data, method="loo_corrected")
    >>> res.posterior.mean.shape
    (4,)
    """
    values = _bernoulli_values(data)
    # int32 counts when no client can reach 2^31 observations: half the fresh memory
    # of int64 (first-touching new pages is a third of the fit's time beyond the count).
    small = data.offsets[-1] < np.iinfo(np.int32).max
    successes, trials = _count_ones(values, data.offsets, np.int32 if small else np.int64)
    return _fit(successes, trials, **kwargs)  # counts valid by construction


def beta_binomial_eb(successes, trials, *, method="mle", prior=None, fix_prior=False):
    r"""Empirical-Bayes estimates of client success probabilities under a Beta prior.

    Parameters
    ----------
    successes : array_like of int, shape (m,)
        Successes z_i, with 0 <= z_i <= n_i.
    trials : array_like of int, shape (m,)
        Trials n_i >= 1 (clients may differ).
    method : {"mle", "moments", "loo_printed", "loo_proof", "loo_corrected"}, default="mle"
        How the prior is learned:

        - ``"mle"``: maximum beta-binomial marginal likelihood over (alpha, beta),
          by a projected Newton ascent from several starts, keeping the best
          (see Notes).
        - ``"moments"``: moment matching on all clients with the sampling-noise
          correction of ``"loo_corrected"``.
        - ``"loo_printed"``: the paper's eq. (6) exactly as printed: leave-one-out
          mean mu_i, variance (1/(m-2)) sum_{l != i} (x_l - mu_l)^2 (centred on
          mu_l, as printed) and a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 - 1 + n_i).
        - ``"loo_proof"``: the proof's variant: centred on mu_i and without
          the "-1", a_i = n_i / (mu_i(1-mu_i)/sigma_i^2 + n_i).
        - ``"loo_corrected"``: centred on mu_i, and the variance of the local
          means minus their binomial noise, mean_l x_l(1-x_l)/(n_l-1), so that it
          estimates Var(p); needs every n_i >= 2.

        The leave-one-out methods estimate client i's prior without its own data
        (the server sends (mu_i, sigma_i^2) to client i) and need m >= 3.
    prior : BetaPrior, optional
        With ``fix_prior=True``, the known prior; otherwise the
        first starting point of ``"mle"``.
    fix_prior : bool, default=False
        Use ``prior`` as given, without fitting (ebnm's ``fix_g``).

    Returns
    -------
    BetaBinomialEBResult

    Notes
    -----
    With a known Beta(alpha, beta) prior the posterior mean is
    (alpha + z_i) / (alpha + beta + n_i) = a x_i + (1 - a) alpha/(alpha+beta), with
    a = n_i/(alpha + beta + n_i), and its Bayes risk is
    alpha beta / ((alpha+beta)(alpha+beta+1)(alpha+beta+n)).

    The printed eq. (6) estimates Var(x_l) = sigma^2 + E[p(1-p)]/n rather than
    sigma^2, so its weight leans towards the local mean.
    Leave-one-out weights outside [0, 1] are clipped to [0, 1] and counted in
    ``n_clipped``; a corrected variance below 0 is floored at 0 (weight 0),
    counted in ``diagnostics["n_variance_floored"]``.

    **The MLE.** The log-likelihood is maximized over the prior mean
    alpha/(alpha+beta) in [1e-15, 1 - 1e-15] and the concentration alpha + beta
    in [1e-8, 1e12], in the coordinates (logit mean, log(1 + 1/(alpha+beta))),
    where alpha + beta -> inf is an edge rather than a flat plateau. Each start
    (``prior`` if given, the corrected moments, the pooled mean with the
    Pearson overdispersion estimate, and the pooled mean with alpha + beta = 1,
    100, 1e4) runs a Newton ascent with eigenvalue-modified Hessians, bounded
    steps, a backtracking line search and the box's edges as constraints. The
    log-likelihood is computed as sums of log1p terms that stay accurate for
    any alpha, beta (no differences of log-gamma functions). ``diagnostics``:

    - ``converged``: the returned point is a local maximum in the box (the
      gradient pushes out of the box on active edges, a Newton step gains
      < 1e-14 sum(n) elsewhere, no direction of positive curvature). A
      ``RuntimeWarning`` is issued when it is False.
    - ``at_bound`` and ``active_bounds``: the edges the fit sits on.
      ``"concentration_upper"``: no overdispersion detected; the likelihood's
      supremum is the binomial limit alpha + beta -> inf (one p for all
      clients). The fitted prior Beta(1e12 mean, 1e12 (1 - mean)) is that limit
      to within sum(n)/2e12 in log-likelihood, and every posterior mean is the
      pooled mean (complete pooling). ``"concentration_lower"``: alpha, beta
      -> 0, point masses at 0 and 1 (only possible when every client has 0 or
      n_i successes); the posterior means are then z_i/n_i.
      ``"mean_lower"`` (``"mean_upper"``): no success (no failure) at all; the
      prior is a point mass at 0 (1).
    - ``start``, ``start_from``, ``n_iter``, ``predicted_gain``: the start
      (alpha, beta) and its label, the iterations and the last predicted gain
      of the run that gave the fit; ``starts``: (label, log-likelihood,
      converged) of every run; ``n_iter_total``; ``n_distinct_counts``: distinct
      (n_i, z_i) pairs, on which the likelihood is computed.

    References
    ----------
    Ozkara, Girgis, Data, Diggavi, "A Generative Framework for Personalized
    Learning and Estimation: Theory, Algorithms, and Privacy", eq. (6), Theorem 3.

    Examples
    --------
    >>> import numpy as np
    >>> z, n = np.array([3, 7, 5, 9, 1]), np.array([10, 10, 12, 14, 6])
    >>> res = beta_binomial_eb(z, n, prior=BetaPrior(2, 2), fix_prior=True)
    >>> float(res.posterior.mean[0])  # (2 + 3) / (4 + 10)
    0.35714285714285715
    >>> fit = beta_binomial_eb(z, n)
    >>> d = fit.diagnostics
    >>> d["converged"], d["active_bounds"], round(fit.prior.alpha + fit.prior.beta, 1)
    (True, (), 23.3)

    Less spread than binomial noise alone: no overdispersion, complete pooling.

    >>> fit = beta_binomial_eb([5, 5, 4, 6, 5], [10, 10, 10, 10, 10])
    >>> fit.diagnostics["active_bounds"], round(float(fit.posterior.mean[2]), 6)
    (('concentration_upper',), 0.5)
    """
    z, n = check_binomial_counts(successes, trials)
    return _fit(z, n, method=method, prior=prior, fix_prior=fix_prior)


def _fit(z, n, *, method="mle", prior=None, fix_prior=False):
    """:func:`beta_binomial_eb` on validated counts (int64, 0 <= z <= n, n >= 1)."""
    check_choice(method, "method", METHODS)
    if prior is not None and not isinstance(prior, BetaPrior):
        raise TypeError(f"prior must be a BetaPrior or None, got {type(prior).__name__}")
    fix_prior = check_bool(fix_prior, "fix_prior")
    if fix_prior and prior is None:
        raise ValueError("fix_prior=True needs a prior")
    if not fix_prior and z.size < 2:
        raise ValueError(f"fitting a prior needs at least 2 clients, got {z.size}")
    # Every method but the MLE's optimizer makes two passes over the m clients: this
    # one, which counts the distinct (n, z) pairs, and the posteriors'.
    counts = _counts_model(z, n)
    if fix_prior:
        return _posterior_result("fixed", prior, z, n, {}, counts)
    single = int(counts.pairs[2][counts.pairs[0] < 2].sum())  # clients with 1 trial
    if method in _LOO_VARIANTS:
        return _loo_fit(method, z, n, counts, single)
    if method == "moments" and single:
        raise ValueError("method='moments' needs trials >= 2 for every client to separate "
                         f"binomial noise from heterogeneity ({single} have 1)")
    if single == z.size:
        raise ValueError("every client has 1 trial: the likelihood depends on the prior only "
                         "through its mean, so alpha + beta is not identifiable")
    moments = _corrected_moments(counts)
    if method == "moments":
        return _posterior_result("moments", _prior_or_none(*moments), z, n,
                                 {"mean": moments[0], "variance": moments[1]}, counts)
    return _mle_fit(z, n, prior, moments, counts)


def check_binomial_counts(successes, trials):
    """Per-client success and trial counts, checked as every binomial estimator needs them.

    Parameters
    ----------
    successes, trials : array_like of shape (m,)
        Non-negative integers (integral floats are accepted), one pair per
        client, with ``1 <= trials`` and ``successes <= trials``.

    Returns
    -------
    successes, trials : ndarray of int64, shape (m,)
        The inputs if already int64 arrays, else copies; never modified.

    Raises
    ------
    ValueError
        No client, unequal lengths, a negative or fractional count, an empty
        client or more successes than trials (the first offender is named).
    TypeError
        Counts that are not numbers.

    Examples
    --------
    >>> z, n = check_binomial_counts([3, 0, 5], [5, 4, 5])
    >>> z.tolist(), n.dtype.name
    ([3, 0, 5], 'int64')
    """
    z = check_counts(successes, "successes", minimum=0)
    n = check_counts(trials, "trials", minimum=0)
    if z.shape != n.shape:
        raise ValueError(f"successes and trials must have the same length, got {z.size} "
                         f"and {n.size}")
    if z.size == 0:
        raise ValueError("successes and trials must hold at least one client")
    _, n_empty, first_empty, n_exceed, first = _kernels._pair_checks(z, n, _n_chunks(z.size))
    if n_empty:
        raise ValueError(f"trials: every client needs at least one observation; {n_empty} "
                         f"client(s) are empty (first: {first_empty})")
    if n_exceed:
        raise ValueError(f"successes must not exceed trials (client {first}: "
                         f"{z[first]} > {n[first]})")
    return z, n


def _n_chunks(m, cells=1):
    """Blocks of clients for the parallel count kernels: one per thread when m is large,
    with at most 2^22 table cells (32 MB) in all when each block fills a table."""
    if m < 100_000:
        return 1
    return max(1, min(numba.get_num_threads(), (1 << 22) // cells))


def _check_nonempty(trials, name):
    """Refuse clients without observations, naming the argument that holds the counts."""
    if np.any(trials == 0):
        empty = np.flatnonzero(trials == 0)
        raise ValueError(f"{name}: every client needs at least one observation; {empty.size} "
                         f"client(s) are empty (first: {int(empty[0])})")


def _corrected_moments(counts):
    """Mean of the local means and the variance of p they imply.

    The variance is that of eq. (6) less the binomial noise mean_l x_l(1-x_l)/(n_l-1).

    Computed on the distinct (n, z) pairs: the same sums as over the clients.
    """
    nu, zu, w = counts.pairs
    x = zu / nu
    m = counts.n_clients
    mean = _weighted_sum(w, x) / m
    var_x = _weighted_sum(w, (x - mean) ** 2) / (m - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        noise = np.where(nu > 1, x * (1.0 - x) / (nu - 1.0), 0.0)
    return mean, var_x - _weighted_sum(w, noise) / m


def _prior_or_none(mean, variance):
    """Beta prior with these moments, or None when they define no proper Beta."""
    if 0.0 < mean < 1.0 and 0.0 < variance < mean * (1.0 - mean):
        return BetaPrior.from_moments(mean, variance)
    return None


def _loo_fit(method, z, n, counts, single):
    m = z.size
    if m < 3:
        raise ValueError(f"method={method!r} uses leave-one-out moments and needs at least "
                         f"3 clients, got {m}")
    if method == "loo_corrected" and single:
        raise ValueError("method='loo_corrected' needs trials >= 2 for every client "
                         f"({single} client(s) have 1 trial)")
    total, ssq, corr_total = _loo_sums(counts.pairs, method)
    # Eq. (6) depends on a client only through its (n, z): computed once per distinct
    # pair, then copied to the clients (one gather instead of m divisions and branches).
    nu, zu, w = counts.pairs
    per_pair = np.empty((5, nu.size))
    clipped, floored = _kernels._loo_fill(zu, nu, m, _LOO_VARIANTS[method], total, ssq,
                                          corr_total, *per_pair)
    n_clipped, n_floored = _weighted_sum(w, clipped), _weighted_sum(w, floored)
    mu, var, a, est, concentration = _kernels._pairs_to_clients(z, n, counts.index, per_pair)
    # Global prior implied by the same moments on all m clients (no leave-one-out).
    var_all = ssq / (m - 1.0)
    if method == "loo_corrected":
        var_all -= corr_total / m
    s_all = _implied_concentration(method, total / m, var_all)
    prior = None
    if np.isfinite(s_all) and s_all > 0:
        mean_all = total / m
        prior = BetaPrior(mean_all * s_all, (1 - mean_all) * s_all) if 0 < mean_all < 1 else None
    posterior = BetaPosterior(est, concentration)
    diagnostics = {"n_variance_floored": int(n_floored), "loo_variance": var}
    return BetaBinomialEBResult(method, prior, posterior, a, mu,
                                _log_likelihood(prior, z, n, counts), int(n_clipped),
                                diagnostics)


def _loo_sums(pairs, method):
    """The global sums of eq. (6) on x = z/n: sum x, sum (x - mean x)^2 and (for
    "loo_corrected", else 0) sum x(1-x)/(n-1), as sums over the distinct (n, z)
    pairs of :func:`_compress` (no pass over the m clients)."""
    nu, zu, w = pairs
    x = zu / nu
    total = _weighted_sum(w, x)
    ssq = _weighted_sum(w, (x - total / float(w.sum())) ** 2)
    corr_total = 0.0
    if method == "loo_corrected":
        corr_total = _weighted_sum(w, x * (1.0 - x) / (nu - 1.0))
    return total, ssq, corr_total


def _implied_concentration(method, mean, variance):
    """alpha + beta implied by the method's weight formula (inf when variance <= 0)."""
    if variance <= 0:
        return np.inf
    s = mean * (1.0 - mean) / variance
    return s if method == "loo_proof" else s - 1.0


def _posterior_result(method, prior, z, n, diagnostics, counts=None):
    if prior is None:
        raise ValueError(f"method={method!r}: the moments of these successes and trials "
                         "define no proper Beta prior (variance of p estimated <= 0 or "
                         ">= mean(1-mean)); try method='mle' or a leave-one-out method")
    mean, concentration, weight = _kernels._beta_posterior(z, n, prior.alpha, prior.beta)
    centre = np.broadcast_to(np.float64(prior.mean), z.shape)  # read-only, no m-sized copy
    return BetaBinomialEBResult(method, prior, BetaPosterior(mean, concentration),
                                weight, centre, _log_likelihood(prior, z, n, counts), 0,
                                diagnostics)


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


def _mle_starts(prior, moments, counts):
    """Labelled starting points in (t, phi), first the user's prior, then the moments."""
    starts = []
    if prior is not None:
        starts.append(("prior", prior))
    moment_prior = _prior_or_none(*moments)
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


def _mle_fit(z, n, prior, moments, counts):
    tol = _tolerance(counts)
    runs = [(label, start, _newton_ascent(x, counts, tol))
            for label, start, x in _mle_starts(prior, moments, counts)]
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
    return _posterior_result("mle", _from_search(best.x), z, n, diagnostics, counts)
