r"""Beta-Bernoulli (beta-binomial) empirical Bayes: Section 2.2, eq. (6) and Theorem 3.

Client ``i`` has :math:`z_i` successes in :math:`n_i` Bernoulli trials with success
probability :math:`p_i \sim \mathrm{Beta}(\alpha, \beta)`. Every method returns the
posterior :math:`\mathrm{Beta}(\alpha_i + z_i, \beta_i + n_i - z_i)`; the methods differ
in how the prior (or the per-client leave-one-out prior) is obtained.
"""

from __future__ import annotations

import numpy as np

from ebfl._kernels import LOO_CORRECTED, LOO_PRINTED, LOO_PROOF, count_bernoulli, count_bytes
from ebfl._validation import check_bool, check_choice, check_counts
from ebfl.eb import _kernels
from ebfl.eb._beta_binomial_mle import (
    _compress,
    _counts_model,
    _log_likelihood,
    _mle_fit,
    _n_chunks,
    _weighted_sum,
)
from ebfl.eb.priors import BetaPrior
from ebfl.eb.results import BetaBinomialEBResult, BetaPosterior
from ebfl.ragged import Ragged

__all__ = ["METHODS", "beta_bernoulli_eb", "beta_binomial_eb", "bernoulli_counts",
           "check_binomial_counts", "leave_one_out_moment_sums"]

_LOO_VARIANTS = {
    "loo_printed": LOO_PRINTED,
    "loo_proof": LOO_PROOF,
    "loo_corrected": LOO_CORRECTED,
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
        Successes :math:`z_i`, with :math:`0 \le z_i \le n_i`.
    trials : array_like of int, shape (m,)
        Trials :math:`n_i \ge 1` (clients may differ).
    method : {"mle", "moments", "loo_printed", "loo_proof", "loo_corrected"}, default="mle"
        How the prior is learned:

        - ``"mle"``: maximum beta-binomial marginal likelihood over :math:`(\alpha, \beta)`,
          by a projected Newton ascent from several starts, keeping the best
          (see Notes).
        - ``"moments"``: moment matching on all clients with the sampling-noise
          correction of ``"loo_corrected"``.
        - ``"loo_printed"``: the paper's eq. (6) exactly as printed: leave-one-out
          mean :math:`\mu_i`, variance :math:`\sigma_i^2 = \frac{1}{m-2} \sum_{l \ne i}
          (x_l - \mu_l)^2` (centred on :math:`\mu_l`, as printed) and
          :math:`a_i = n_i / \big(\mu_i(1-\mu_i)/\sigma_i^2 - 1 + n_i\big)`.
        - ``"loo_proof"``: the proof's variant: centred on :math:`\mu_i` and without
          the "-1", :math:`a_i = n_i / \big(\mu_i(1-\mu_i)/\sigma_i^2 + n_i\big)`.
        - ``"loo_corrected"``: centred on :math:`\mu_i`, and the variance of the local
          means minus their binomial noise, :math:`\operatorname{mean}_l x_l(1-x_l)/(n_l-1)`,
          so that it estimates :math:`\operatorname{Var}(p)`; needs every :math:`n_i \ge 2`.

        The leave-one-out methods estimate client i's prior without its own data
        (the server sends :math:`(\mu_i, \sigma_i^2)` to client i) and need :math:`m \ge 3`.
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
    With a known :math:`\mathrm{Beta}(\alpha, \beta)` prior the posterior mean is

    .. math:: \frac{\alpha + z_i}{\alpha + \beta + n_i} = a x_i + (1 - a)
              \frac{\alpha}{\alpha + \beta}, \qquad a = \frac{n_i}{\alpha + \beta + n_i},

    with :math:`x_i = z_i / n_i`, and its Bayes risk is
    :math:`\frac{\alpha \beta}{(\alpha+\beta)(\alpha+\beta+1)(\alpha+\beta+n)}`.

    The printed eq. (6) estimates :math:`\operatorname{Var}(x_l) = \sigma^2 +
    E[p(1-p)]/n` rather than :math:`\sigma^2`, so its weight leans towards the local
    mean. Leave-one-out weights outside [0, 1] are clipped to [0, 1] and counted in
    ``n_clipped``; a corrected variance below 0 is floored at 0 (weight 0),
    counted in ``diagnostics["n_variance_floored"]``.

    **The MLE.** The log-likelihood is maximized over the prior mean
    :math:`\alpha/(\alpha+\beta) \in [10^{-15}, 1 - 10^{-15}]` and the concentration
    :math:`\alpha + \beta \in [10^{-8}, 10^{12}]`, in the coordinates
    :math:`\big(\operatorname{logit} \frac{\alpha}{\alpha+\beta}, \log(1 +
    \frac{1}{\alpha+\beta})\big)`, where :math:`\alpha + \beta \to \infty` is an edge
    rather than a flat plateau. Each start (``prior`` if given, the corrected moments,
    the pooled mean with the Pearson overdispersion estimate, and the pooled mean with
    :math:`\alpha + \beta = 1, 100, 10^4`) runs a Newton ascent with eigenvalue-modified
    Hessians, bounded steps, a backtracking line search and the box's edges as
    constraints. The log-likelihood is computed as sums of log1p terms that stay
    accurate for any :math:`\alpha, \beta` (no differences of log-gamma functions).
    ``diagnostics``:

    - ``converged``: the returned point is a local maximum in the box (the
      gradient pushes out of the box on active edges, a Newton step gains
      :math:`< 10^{-14} \sum_i n_i` elsewhere, no direction of positive curvature). A
      ``RuntimeWarning`` is issued when it is False.
    - ``at_bound`` and ``active_bounds``: the edges the fit sits on.
      ``"concentration_upper"``: no overdispersion detected; the likelihood's
      supremum is the binomial limit :math:`\alpha + \beta \to \infty` (one p for all
      clients). The fitted prior :math:`\mathrm{Beta}(10^{12} \bar p, 10^{12} (1 -
      \bar p))`, :math:`\bar p` the prior mean, is that limit to within
      :math:`\sum_i n_i / (2 \cdot 10^{12})` in log-likelihood, and every posterior mean
      is the pooled mean (complete pooling). ``"concentration_lower"``:
      :math:`\alpha, \beta \to 0`, point masses at 0 and 1 (only possible when every
      client has 0 or :math:`n_i` successes); the posterior means are then
      :math:`z_i/n_i`.
      ``"mean_lower"`` (``"mean_upper"``): no success (no failure) at all; the
      prior is a point mass at 0 (1).
    - ``start``, ``start_from``, ``n_iter``, ``predicted_gain``: the start
      :math:`(\alpha, \beta)` and its label, the iterations and the last predicted gain
      of the run that gave the fit; ``starts``: (label, log-likelihood,
      converged) of every run; ``n_iter_total``; ``n_distinct_counts``: distinct
      :math:`(n_i, z_i)` pairs, on which the likelihood is computed.

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
    fitted, diagnostics = _mle_fit(prior, _prior_or_none(*moments), counts)
    return _posterior_result("mle", fitted, z, n, diagnostics, counts)


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


# --------------------------------------------------------------------------- the halves
#
# beta_binomial_eb in one process is a server half (fit the prior, or the sums of
# eq. (6), from the clients' counts) and a client half (each client's posterior from
# the broadcast: beta_binomial_eb(z, n, prior=..., fix_prior=True) for a Beta prior).
# The federated protocol (ebfl.federated.EBBetaBinomial) calls the same halves, one
# client at a time.


def leave_one_out_moment_sums(successes, trials, method):
    """The server half of the leave-one-out methods: the sums every client leaves itself out of.

    Parameters
    ----------
    successes, trials : array_like of int, shape (m,)
        Validated counts (:func:`check_binomial_counts`).
    method : {"loo_printed", "loo_proof", "loo_corrected"}

    Returns
    -------
    (float, float, float)
        sum x_i, sum (x_i - mean x)^2 and, for ``"loo_corrected"`` (else 0),
        sum x_i (1 - x_i)/(n_i - 1), with x_i = z_i/n_i, summed as
        :func:`beta_binomial_eb` sums them (over the distinct (n, z) pairs).
    """
    check_choice(method, "method", tuple(_LOO_VARIANTS))
    z, n = check_binomial_counts(successes, trials)
    return _loo_sums(_compress(z, n), method)


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
