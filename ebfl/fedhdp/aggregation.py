"""The server's arithmetic in FedHDP (Algorithm 2): group weights and adaptive clipping.

Plain numpy on scalars and small arrays, shared by the torch strategy
(:class:`ebfl.fedhdp.algorithm.FedHDP`) and by the tests that check it.

Adaptive clipping follows Andrew, Thakkar, McMahan & Ramaswamy, "Differentially
private learning with adaptive clipping" (NeurIPS 2021), which Algorithm 2
cites:

* each client reports b = 1 if its update was *not* clipped (norm <= S);
* the server releases the count with Gaussian noise of standard deviation
  sigma_b, centred as in Andrew et al. (sum of b - 1/2, whose sensitivity is
  1/2 under adding or removing a client), and forms the noisy fraction
  b~ = (sum (b - 1/2) + N(0, sigma_b^2)) / n + 1/2;
* S <- S exp(-eta_b (b~ - kappa)): when most updates are clipped b~ < kappa
  and S grows; when few are, S shrinks;
* the round's update noise is calibrated to the S that clipped the round's
  updates, and its multiplier is z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2), so
  that the update and the count together are accounted as one Gaussian
  mechanism with multiplier z (Andrew et al., Theorem 1;
  :func:`ebfl.privacy.accounting.dp_fedavg.adaptive_clipping_noise`).

Flower 1.41's adaptive-clipping wrappers get the last two points wrong (their
clip norm follows the fraction of *clipped* updates, and their noise uses the
norm of the next round); the tests of this module check that ours does not.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["group_weights", "noisy_unclipped_fraction", "update_clip_norm"]


def group_weights(counts, ratios):
    """FedHDP's weights of the privacy groups' mean updates (Algorithm 2; equation (64)).

    Group i's weight is ``r_i N_i / sum_k r_k N_k``: with two groups and
    ``ratios = (1, r)`` the non-private group gets ``N_1 / (N_1 + r N_2)`` and the
    private one ``r N_2 / (N_1 + r N_2)``. Groups with no client (N_i = 0) get 0
    and the others are renormalized; if no group has weight, all are 0 (the
    round changes nothing).

    Parameters
    ----------
    counts : array_like of float (l,)
        N_i, the clients of each group whose updates are averaged (realized or
        expected counts), >= 0.
    ratios : array_like of float (l,)
        r_i in [0, 1] (group 0 is the reference, usually r_0 = 1).

    Returns
    -------
    ndarray (l,)
        Weights summing to 1 (or all 0).

    Examples
    --------
    >>> group_weights([5, 95], [1.0, 0.01]).round(4).tolist()
    [0.8403, 0.1597]
    >>> group_weights([5, 95], [1.0, 1.0]).tolist()  # r = 1: HDP-FedAvg, uniform over clients
    [0.05, 0.95]
    >>> group_weights([0, 95], [1.0, 0.01]).tolist()  # an empty group drops out
    [0.0, 1.0]
    """
    n = np.asarray(counts, dtype=np.float64)
    r = np.asarray(ratios, dtype=np.float64)
    raw = r * n
    total = raw.sum()
    return raw / total if total > 0 else np.zeros_like(raw)


def noisy_unclipped_fraction(unclipped, n, noise):
    """b~ = (sum (b_i - 1/2) + noise) / n + 1/2, the released fraction of unclipped updates.

    Parameters
    ----------
    unclipped : array_like of {0, 1}
        b_i of the clients that took part.
    n : float
        The denominator: the number of those clients (Algorithm 2), or its
        expectation.
    noise : float
        A draw of N(0, sigma_b^2).
    """
    b = np.asarray(unclipped, dtype=np.float64)
    return float((np.sum(b - 0.5) + noise) / n + 0.5)


def update_clip_norm(clip, fraction_unclipped, lr, target):
    """S exp(-eta_b (b~ - kappa)): Algorithm 2's geometric update of the clip norm.

    Parameters
    ----------
    clip : float
        S^t > 0.
    fraction_unclipped : float
        b~, the noisy fraction of updates with norm <= S^t.
    lr : float
        eta_b >= 0.
    target : float
        kappa in [0, 1], the target fraction of unclipped updates (a quantile
        of the update norms).

    Returns
    -------
    float
        S^{t+1}: larger than S^t when fewer than kappa of the updates were
        unclipped, smaller when more were.

    Examples
    --------
    >>> update_clip_norm(0.5, 0.0, 0.2, 0.5) > 0.5  # everything clipped: S grows
    True
    >>> update_clip_norm(0.5, 1.0, 0.2, 0.5) < 0.5  # nothing clipped: S shrinks
    True
    """
    return float(clip * math.exp(-lr * (fraction_unclipped - target)))
