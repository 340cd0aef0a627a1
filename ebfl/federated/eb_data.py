"""The clients' data of the federated empirical-Bayes protocols, and datasets of them.

:class:`ClientCounts` (Bernoulli clients, for
:class:`~ebfl.federated.EBBetaBinomial`) and :class:`ClientMeans` (real-valued
clients, for :class:`~ebfl.federated.EBGaussian`) hold one row per client;
``subset([i])`` is what client i holds on Flower. The factories build them
from simulated populations (:func:`simulated_counts`, :func:`simulated_means`)
or from US county presidential returns (:func:`election_federation`,
:func:`election_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._kernels import client_mean_ssd
from ebfl._validation import (
    INT64_MAX,
    as_generator,
    check_choice,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_real_scalar,
    check_standard_errors,
)
from ebfl.eb.beta_binomial import bernoulli_counts, check_binomial_counts
from ebfl.federated.protocol import client_ids
from ebfl.models import BetaBernoulliPopulation, GaussianPopulation
from ebfl.ragged import Ragged

__all__ = [
    "ClientCounts",
    "ClientMeans",
    "election_federation",
    "election_shares",
    "simulated_counts",
    "simulated_means",
]

#: Largest |mean| of a Gaussian client (squares stay finite), as in :func:`ebfl.gaussian_eb`.
MAX_ABS_MEAN = 1e150
#: Most raw observations a simulated dataset draws (sum of n over the clients): every
#: one is drawn before the clients' summaries are taken (about 2.4 GB of working memory
#: at this bound), so a larger request is refused before anything is allocated.
MAX_OBSERVATIONS = 10**8
#: Largest |mean|, sigma_theta and sigma_x of :func:`simulated_means` (see there).
MAX_SIMULATED_SCALE = 1e148


# --------------------------------------------------------------------------- client data


def _frozen(arr):
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


def _optional_column(values, name, m, check):
    """None, or ``check(values)`` as a read-only copy of shape (m,)."""
    if values is None:
        return None
    arr = check(values)
    if arr.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},) (one entry per client), got {arr.shape}")
    return _frozen(arr)


def _truth_iv(truth, m):
    return _optional_column(truth, "truth", m,
                            lambda t: check_finite_array(t, "truth", ndim=1, min_len=0))


def _labels_iv(labels, m):
    return _optional_column(labels, "labels", m, lambda v: np.asarray(v, dtype=str))


def _rows(ids, m):
    """Client positions: integers in [0, m - 1] (a float or negative id is refused, never
    truncated or counted from the end)."""
    return client_ids(ids, "ids", m)


def _take(arr, rows):
    return None if arr is None else arr[rows]


@dataclass(frozen=True)
class ClientCounts:
    """Bernoulli data of m clients, held as each client's (successes, trials).

    The data object of :class:`~ebfl.federated.EBBetaBinomial`: row i is
    client i. On Flower a client holds ``subset([i])``, its own row only.

    Parameters
    ----------
    successes, trials : array_like of int, shape (m,)
        z_i ones among n_i >= 1 observations, 0 <= z_i <= n_i.
    truth : array_like, shape (m,), optional
        The clients' true parameters, when known (simulations, held-out
        data): the evaluation then reports squared errors.
    labels : array_like of str, shape (m,), optional
        Client names (e.g. counties).

    Examples
    --------
    >>> from ebfl import Ragged
    >>> data = ClientCounts.from_bernoulli(Ragged.from_lists([[1, 0, 1], [0, 0]]))
    >>> data.successes.tolist(), data.trials.tolist(), data.n_clients
    ([2, 0], [3, 2], 2)
    >>> data.subset([1]).successes.tolist()
    [0]
    """

    successes: np.ndarray
    trials: np.ndarray
    truth: np.ndarray | None = None
    labels: np.ndarray | None = None

    def __post_init__(self):
        z, n = check_binomial_counts(self.successes, self.trials)
        object.__setattr__(self, "successes", _frozen(z))
        object.__setattr__(self, "trials", _frozen(n))
        object.__setattr__(self, "truth", _truth_iv(self.truth, z.size))
        object.__setattr__(self, "labels", _labels_iv(self.labels, z.size))

    @classmethod
    def from_bernoulli(cls, data, *, truth=None, labels=None):
        """Counts of ragged 0/1 observations (:func:`ebfl.eb.bernoulli_counts`)."""
        successes, trials = bernoulli_counts(data)
        return cls(successes, trials, truth, labels)

    @property
    def n_clients(self) -> int:
        return int(self.successes.size)

    @property
    def local_estimate(self) -> np.ndarray:
        """Each client's own estimate z_i / n_i."""
        return self.successes / self.trials

    def subset(self, ids):
        """The clients ``ids`` (positions in this object), in that order."""
        rows = _rows(ids, self.n_clients)
        return ClientCounts(self.successes[rows], self.trials[rows], _take(self.truth, rows),
                            _take(self.labels, rows))


@dataclass(frozen=True)
class ClientMeans:
    """Real-valued data of m clients, held as each client's mean and spread.

    The data object of :class:`~ebfl.federated.EBGaussian`. A client's
    standard error s_i is known in one of three ways, tried in this order:
    the protocol's ``sigma_x`` (s_i = sigma_x / sqrt(n_i), needs ``count``);
    the client's own ``se``; or sigma_x pooled over all clients from ``ssd``
    and ``count`` (as :func:`ebfl.gaussian_eb_samples` does; the server pools).

    Parameters
    ----------
    mean : array_like, shape (m,)
        Client means, in [-1e150, 1e150].
    count : array_like of int, shape (m,), optional
        Observations per client, >= 1.
    ssd : array_like, shape (m,), optional
        Within-client sums of squared deviations from the mean, >= 0 (needs
        ``count``).
    se : array_like, shape (m,), optional
        Known standard errors of the means, in [1e-150, 1e150].
    truth : array_like, shape (m,), optional
        True client parameters, when known.
    labels : array_like of str, shape (m,), optional

    Examples
    --------
    >>> from ebfl import Ragged
    >>> data = ClientMeans.from_samples(Ragged.from_lists([[1.0, 3.0], [2.0, 2.0, 5.0]]))
    >>> data.mean.tolist(), data.ssd.tolist(), data.count.tolist()
    ([2.0, 3.0], [2.0, 6.0], [2, 3])
    """

    mean: np.ndarray
    count: np.ndarray | None = None
    ssd: np.ndarray | None = None
    se: np.ndarray | None = None
    truth: np.ndarray | None = None
    labels: np.ndarray | None = None

    def __post_init__(self):
        mean = check_finite_array(self.mean, "mean", ndim=1, max_abs=MAX_ABS_MEAN)
        m = mean.size
        count = _optional_column(self.count, "count", m,
                                 lambda c: check_counts(c, "count", minimum=1))
        ssd = _optional_column(self.ssd, "ssd", m,
                               lambda v: check_finite_array(v, "ssd", ndim=1, min_len=0))
        if ssd is not None and np.any(ssd < 0):
            raise ValueError("ssd must be >= 0 (sums of squared deviations)")
        if ssd is not None and count is None:
            raise ValueError("ssd needs count (the observations behind each sum of squares)")
        se = None if self.se is None else _frozen(check_standard_errors(self.se, "se", m))
        object.__setattr__(self, "mean", _frozen(mean))
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "ssd", ssd)
        object.__setattr__(self, "se", se)
        object.__setattr__(self, "truth", _truth_iv(self.truth, m))
        object.__setattr__(self, "labels", _labels_iv(self.labels, m))

    @classmethod
    def from_samples(cls, data, *, truth=None, labels=None):
        """Means, sums of squared deviations and counts of ragged 1-D observations.

        Computed by the kernel of :func:`ebfl.gaussian_eb_samples`, client by
        client (each from its own rows only).
        """
        if not isinstance(data, Ragged):
            raise TypeError(f"data must be a ebfl.Ragged, got {type(data).__name__}")
        values = data.values
        if values.ndim != 1:
            raise ValueError(f"data.values must be 1-D (one real observation per entry), got "
                             f"shape {values.shape}")
        if not (np.issubdtype(values.dtype, np.integer)
                or np.issubdtype(values.dtype, np.floating)):
            raise TypeError(f"data.values must be numeric, got dtype {values.dtype}")
        counts = data.counts
        if np.any(counts == 0):
            raise ValueError(f"data: every client needs at least one sample; "
                             f"{int(np.sum(counts == 0))} client(s) are empty")
        mean, ssd, nonfinite = client_mean_ssd(values.astype(np.float64)[:, None],
                                                data.offsets)
        if nonfinite.any():
            raise ValueError(f"data.values must be finite; {int(nonfinite.sum())} value(s) are "
                             "NaN or infinite")
        return cls(mean[:, 0], counts, ssd, None, truth, labels)

    @classmethod
    def from_summaries(cls, mean, sd, count, *, truth=None, labels=None):
        """From each client's mean, sample standard deviation (ddof=1) and count."""
        count = check_counts(count, "count", minimum=1)
        sd = check_finite_array(sd, "sd", ndim=1, min_len=0)
        if np.any(sd < 0):
            raise ValueError("sd must be >= 0")
        if sd.shape != count.shape:
            raise ValueError(f"sd and count must have the same length, got {sd.size} and "
                             f"{count.size}")
        return cls(mean, count, sd**2 * (count - 1), None, truth, labels)

    @property
    def n_clients(self) -> int:
        return int(self.mean.size)

    @property
    def local_estimate(self) -> np.ndarray:
        """Each client's own estimate, its mean."""
        return self.mean

    def subset(self, ids):
        """The clients ``ids`` (positions in this object), in that order."""
        rows = _rows(ids, self.n_clients)
        return ClientMeans(self.mean[rows], _take(self.count, rows), _take(self.ssd, rows),
                           _take(self.se, rows), _take(self.truth, rows),
                           _take(self.labels, rows))


# --------------------------------------------------------------------------- datasets


def _draw_iv(n_clients, n, seed):
    """Check the size of a simulated draw before anything is allocated; the generator of
    ``seed`` (named ``seed`` in errors, not the population's ``rng``)."""
    m = check_int_scalar(n_clients, "n_clients", minimum=1, maximum=MAX_OBSERVATIONS)
    try:
        scalar = np.ndim(n) == 0
    except (TypeError, ValueError):  # ragged: the population's check says so
        scalar = None
    if scalar:
        value = n.item() if isinstance(n, np.ndarray) else n
        total = m * check_int_scalar(value, "n", minimum=1, maximum=INT64_MAX)
    elif scalar is False:
        total = float(check_counts(n, "n", minimum=1).sum(dtype=np.float64))
    else:
        total = 0
    if total > MAX_OBSERVATIONS:
        raise ValueError(f"n_clients and n: the simulation draws every raw observation (the "
                         f"sum of n over the clients), at most {MAX_OBSERVATIONS}; "
                         f"n_clients={m} and n ask for {total:.6g}")
    return as_generator(seed, "seed")


def simulated_counts(n_clients=500, n=14, *, alpha=2.0, beta=2.0, seed=0):
    """Clients of a Beta(alpha, beta)-Bernoulli population, with their true p_i.

    Raw 0/1 observations are drawn (:meth:`ebfl.BetaBernoulliPopulation.sample`)
    and counted per client.

    Parameters
    ----------
    n_clients : int
        m >= 1.
    n : int or array_like of int
        Observations per client, >= 1. At most 10^8 observations in all
        (``n_clients * n``), drawn one by one.
    alpha, beta : float
        The population prior, in (0, 1e300].
    seed : int
        Seed of the draw (>= 0).

    Returns
    -------
    ClientCounts
        ``truth`` holds the p_i.

    Examples
    --------
    >>> data = simulated_counts(100, 14, seed=1)
    >>> data.n_clients, int(data.trials[0])
    (100, 14)
    """
    population = BetaBernoulliPopulation(alpha, beta)
    sample = population.sample(n_clients, n, rng=_draw_iv(n_clients, n, seed))
    return ClientCounts.from_bernoulli(sample.data, truth=sample.theta)


#: The simulated Gaussian population's defaults: Figure 4 of Ozkara et al.
SIMULATED_N, SIMULATED_SIGMA_THETA, SIMULATED_SIGMA_X = 15, 0.1, 0.5


def simulated_means(n_clients=500, n=SIMULATED_N, *, mean=0.0, sigma_theta=SIMULATED_SIGMA_THETA,
                    sigma_x=SIMULATED_SIGMA_X, seed=0):
    """Clients of a Gaussian population (Figure 4's values by default), with their theta_i.

    Raw observations are drawn (:meth:`ebfl.GaussianPopulation.sample`) and
    summarized per client (:meth:`ClientMeans.from_samples`).

    Parameters
    ----------
    n_clients, n, seed
        As in :func:`simulated_counts`.
    mean : float
        Population mean mu, in [-1e148, 1e148].
    sigma_theta, sigma_x : float
        Population and observation standard deviations (see
        :class:`ebfl.GaussianPopulation`), in [0, 1e148] and (0, 1e148]: the
        simulated client means then stay inside :class:`ClientMeans`' range
        [-1e150, 1e150].

    Returns
    -------
    ClientMeans
        ``truth`` holds the theta_i.

    Examples
    --------
    >>> data = simulated_means(50, 15, seed=2)
    >>> data.n_clients, int(data.count[0])
    (50, 15)
    """
    # mean + sigma_theta z + sigma_x z' with |z| < 40 (numpy's normal draws stay far
    # inside): below 1e150 whatever the draw, so a bad scale is named here, not as "mean"
    mean = check_real_scalar(mean, "mean", low=-MAX_SIMULATED_SCALE, high=MAX_SIMULATED_SCALE)
    sigma_theta = check_real_scalar(sigma_theta, "sigma_theta", low=0.0,
                                    high=MAX_SIMULATED_SCALE)
    sigma_x = check_real_scalar(sigma_x, "sigma_x", low=0.0, high=MAX_SIMULATED_SCALE,
                                low_open=True)
    population = GaussianPopulation(mean, sigma_theta, sigma_x)
    sample = population.sample(n_clients, n, rng=_draw_iv(n_clients, n, seed))
    return ClientMeans.from_samples(sample.data, truth=sample.theta)


ELECTION_UNITS = ("election", "vote")
ELECTION_TARGETS = ("share", "outcome")


def _election_split(matrix, held_out, path):
    """The election matrix, the training elections' columns and the held-out column."""
    from ebfl.datasets.elections import ElectionMatrix, election_matrix, load_county_returns

    if matrix is None:
        matrix = election_matrix(load_county_returns(path))
    elif not isinstance(matrix, ElectionMatrix):
        raise TypeError(f"matrix must be an ElectionMatrix, got {type(matrix).__name__}")
    elif path is not None:  # it would be ignored
        raise ValueError("give matrix or path (the returns file to build it from), not both")
    folds = len(matrix.years)
    if folds < 2:
        raise ValueError(f"matrix must hold at least 2 elections (one held out), got {folds}")
    held = check_int_scalar(held_out, "held_out", minimum=-folds, maximum=folds - 1) % folds
    return matrix, np.delete(np.arange(folds), held), held


def election_federation(matrix=None, *, held_out=-1, unit="election", target="share",
                        path=None):
    """US counties as the Bernoulli clients of :class:`~ebfl.federated.EBBetaBinomial`.

    As in the paper's county-election experiment: a county's data are the
    elections other than ``held_out``, and its parameter is its Republican
    tendency, scored on the held-out election.

    Parameters
    ----------
    matrix : ebfl.datasets.ElectionMatrix, optional
        Default: the counties present in all six elections of the data home's
        returns (:func:`ebfl.datasets.load_county_returns`; needs the
        ``county-elections`` dataset, downloaded if missing).
    held_out : int
        Index of the held-out election in ``matrix.years`` (negative counts
        from the end).
    unit : {"election", "vote"}
        What a Bernoulli observation is. ``"election"``: one per training
        election, 1 where the Republican candidate won the county (n_i = 5, the
        paper's setting). ``"vote"``: one per two-party vote, 1 for a
        Republican vote (n_i = the county's two-party votes, summed over the
        training elections).
    target : {"share", "outcome"}
        ``truth``: the held-out Republican two-party share, or the held-out
        0/1 result.
    path : path-like, optional
        A local copy of the returns file (when ``matrix`` is None).

    Returns
    -------
    ClientCounts
        Row i is county ``matrix.fips[i]``; ``labels`` holds "county, state".

    Examples
    --------
    >>> data = election_federation()  # doctest: +SKIP
    >>> data.n_clients, int(data.trials[0])  # doctest: +SKIP
    (3150, 5)
    """
    check_choice(unit, "unit", ELECTION_UNITS)
    check_choice(target, "target", ELECTION_TARGETS)
    matrix, train, held = _election_split(matrix, held_out, path)
    if unit == "election":
        successes = matrix.rep_win[:, train].sum(axis=1)
        trials = np.full(matrix.n_counties, train.size)
    else:
        successes = matrix.rep_votes[:, train].sum(axis=1)
        trials = matrix.two_party_votes[:, train].sum(axis=1)
    truth = (matrix.rep_share[:, held] if target == "share"
             else matrix.rep_win[:, held].astype(np.float64))
    return ClientCounts(successes, trials, truth, matrix.names)


def election_shares(matrix=None, *, held_out=-1, path=None):
    """US counties' Republican two-party shares as clients of :class:`~ebfl.federated.EBGaussian`.

    A county's observations are its shares in the elections other than
    ``held_out``; its parameter is its tendency, scored on the held-out share.
    With :class:`~ebfl.federated.EBGaussian`'s default (no ``sigma_x``), the
    between-election spread is pooled over the counties.

    Parameters
    ----------
    matrix, held_out, path
        As in :func:`election_federation`.

    Returns
    -------
    ClientMeans
        ``mean``: the mean training share; ``ssd``, ``count`` (the training
        elections); ``truth``: the held-out share.

    Examples
    --------
    >>> data = election_shares()  # doctest: +SKIP
    >>> data.n_clients, int(data.count[0])  # doctest: +SKIP
    (3150, 5)
    """
    matrix, train, held = _election_split(matrix, held_out, path)
    shares = Ragged.from_counts(matrix.rep_share[:, train].reshape(-1),
                                np.full(matrix.n_counties, train.size))
    return ClientMeans.from_samples(shares, truth=matrix.rep_share[:, held],
                                    labels=matrix.names)


# --------------------------------------------------------------------------- jobs


def job_data(settings):
    """The clients' data of an ``eb-*`` job of :mod:`ebfl.flower.jobs`.

    ``settings["dataset"]``: ``"simulated"`` (``clients`` clients drawn with
    ``seed``: :func:`simulated_counts` or :func:`simulated_means`) or
    ``"elections"`` (:func:`election_federation` or :func:`election_shares`;
    with ``clients``, the first that many counties; more than the data hold is
    an error).
    """
    gaussian = settings["algorithm"] in ("eb-gaussian", "eb-normal-means")
    if settings["dataset"] == "elections":
        data = election_shares() if gaussian else election_federation()
        if settings.get("clients") is not None:  # the first counties, in the data's order
            m = int(settings["clients"])
            if m > data.n_clients:  # never fewer clients than asked for, silently
                raise ValueError(f"clients must be <= {data.n_clients}, the counties in the "
                                 f"elections data, got {m}")
            data = data.subset(np.arange(m))
        return data
    m, seed = int(settings["clients"]), int(settings["seed"])
    return simulated_means(m, seed=seed) if gaussian else simulated_counts(m, seed=seed)
