"""Generative models of the framework (Section 2): a population prior, then client data.

Each model draws client parameters theta_i from the population and n_i
observations per client; ``sample`` returns the raw ragged data and
``sample_sufficient`` draws the per-client sufficient statistics directly
(exactly the same distribution, far cheaper for Monte Carlo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebfl._validation import (
    INT64_MAX,
    as_generator,
    check_counts,
    check_finite_array,
    check_int_scalar,
    check_real_scalar,
)
from ebfl.ragged import Ragged

__all__ = ["BetaBernoulliPopulation", "ClientSample", "GaussianPopulation"]


@dataclass(frozen=True)
class ClientSample:
    """Clients drawn from a generative model.

    Attributes
    ----------
    theta : ndarray of shape (m,) or (m, d)
        True client parameters.
    data : Ragged
        Observations of every client.
    """

    theta: np.ndarray
    data: Ragged


#: Largest population parameter accepted: draws mean + sd * z must stay far from
#: the float64 overflow at 1.8e308 (numpy's Beta sampler also needs alpha + beta finite).
MAX_PARAMETER = 1e300


def _sizes_iv(n_clients, n):
    m = check_int_scalar(n_clients, "n_clients", minimum=1, maximum=INT64_MAX)
    try:
        ndim = np.ndim(n)
    except (TypeError, ValueError) as exc:  # ragged nested sequences
        raise TypeError(f"n must be an integer or an integer array of shape ({m},)") from exc
    if ndim == 0:
        value = n.item() if isinstance(n, np.ndarray) else n
        return m, np.full(m, check_int_scalar(value, "n", minimum=1, maximum=INT64_MAX),
                          np.int64)
    counts = check_counts(n, "n", minimum=0)
    if counts.shape != (m,):
        raise ValueError(f"n must be an integer or an integer array of shape ({m},), "
                         f"got shape {counts.shape}")
    if counts.min() < 1:
        raise ValueError("n must be >= 1 for every client (empty clients are not allowed)")
    return m, counts


def _scale_iv(value, name, *, allow_zero):
    return check_real_scalar(value, name, low=0.0, high=MAX_PARAMETER, low_open=not allow_zero)


@dataclass(frozen=True)
class GaussianPopulation:
    r"""The Gaussian model: :math:`\theta_i \sim N(\mu, \sigma_\theta^2 I_d)`, Gaussian data.

    .. math:: \theta_i \sim N(\mu, \sigma_\theta^2 I_d), \qquad
              X_{ij} \mid \theta_i \sim N(\theta_i, \sigma_x^2 I_d).

    Parameters
    ----------
    mean : float or array_like of shape (d,)
        Population mean :math:`\mu`, each :math:`|\mu_j| \le 10^{300}`; a scalar gives
        1-D clients.
    sigma_theta : float
        Population standard deviation, in [0, 1e300].
    sigma_x : float
        Observation noise standard deviation, in (0, 1e300].

    Examples
    --------
    >>> pop = GaussianPopulation(mean=[0.0, 1.0], sigma_theta=0.1, sigma_x=0.5)
    >>> s = pop.sample(3, [2, 4, 1], rng=0)
    >>> s.theta.shape, s.data.values.shape
    ((3, 2), (7, 2))
    """

    mean: float | np.ndarray = 0.0
    sigma_theta: float = 1.0
    sigma_x: float = 1.0

    def __post_init__(self):
        mean = check_finite_array(self.mean, "mean", ndim=(0, 1), max_abs=MAX_PARAMETER)
        object.__setattr__(self, "mean", float(mean) if mean.ndim == 0 else mean.copy())
        object.__setattr__(self, "sigma_theta",
                           _scale_iv(self.sigma_theta, "sigma_theta", allow_zero=True))
        object.__setattr__(self, "sigma_x", _scale_iv(self.sigma_x, "sigma_x", allow_zero=False))

    @property
    def _shape(self):
        return np.shape(self.mean)

    def _theta(self, m, rng):
        return self.mean + self.sigma_theta * rng.standard_normal((m, *self._shape))

    def sample(self, n_clients, n, *, rng=None):
        """Draw client parameters and raw observations.

        Parameters
        ----------
        n_clients : int
            Number of clients m >= 1.
        n : int or array_like of int, shape (m,)
            Observations per client, each >= 1.
        rng : None, int, SeedSequence or Generator
            Source of randomness.

        Returns
        -------
        ClientSample
        """
        rng = as_generator(rng)
        m, counts = _sizes_iv(n_clients, n)
        theta = self._theta(m, rng)
        centres = np.repeat(theta, counts, axis=0)
        values = centres + self.sigma_x * rng.standard_normal(centres.shape)
        return ClientSample(theta, Ragged.from_counts(values, counts))

    def sample_sufficient(self, n_clients, n, *, rng=None):
        r"""Draw :math:`\theta_i` and the local means :math:`\bar x_i` directly.

        :math:`\bar x_i \mid \theta_i \sim N(\theta_i, \sigma_x^2/n_i\, I_d)`.

        Returns
        -------
        theta, xbar : ndarray of shape (m,) or (m, d)
        n : ndarray of shape (m,)
        """
        rng = as_generator(rng)
        m, counts = _sizes_iv(n_clients, n)
        theta = self._theta(m, rng)
        scale = self.sigma_x / np.sqrt(counts)
        if theta.ndim == 2:
            scale = scale[:, None]
        xbar = theta + scale * rng.standard_normal(theta.shape)
        return theta, xbar, counts


@dataclass(frozen=True)
class BetaBernoulliPopulation:
    r"""The Beta-Bernoulli model: :math:`p_i \sim \mathrm{Beta}(\alpha, \beta)`, Bernoulli data.

    .. math:: p_i \sim \mathrm{Beta}(\alpha, \beta), \qquad
              X_{ij} \mid p_i \sim \mathrm{Bernoulli}(p_i).

    Parameters
    ----------
    alpha, beta : float
        Shape parameters, in (0, 1e300].

    Examples
    --------
    >>> pop = BetaBernoulliPopulation(2.0, 2.0)
    >>> p, z, n = pop.sample_sufficient(5, 14, rng=0)
    >>> bool(((0 <= z) & (z <= n)).all())
    True
    """

    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "alpha", _scale_iv(self.alpha, "alpha", allow_zero=False))
        object.__setattr__(self, "beta", _scale_iv(self.beta, "beta", allow_zero=False))

    def sample(self, n_clients, n, *, rng=None):
        """Draw success probabilities and raw 0/1 observations (uint8).

        Parameters are those of :meth:`GaussianPopulation.sample`.
        """
        rng = as_generator(rng)
        m, counts = _sizes_iv(n_clients, n)
        p = rng.beta(self.alpha, self.beta, size=m)
        values = (rng.random(int(counts.sum())) < np.repeat(p, counts)).astype(np.uint8)
        return ClientSample(p, Ragged.from_counts(values, counts))

    def sample_sufficient(self, n_clients, n, *, rng=None):
        r"""Draw :math:`p_i` and the success counts :math:`z_i` directly.

        :math:`z_i \mid p_i \sim \mathrm{Binomial}(n_i, p_i)`.

        Returns
        -------
        p : ndarray of shape (m,)
        z, n : ndarray of shape (m,), int64
        """
        rng = as_generator(rng)
        m, counts = _sizes_iv(n_clients, n)
        p = rng.beta(self.alpha, self.beta, size=m)
        return p, rng.binomial(counts, p), counts
