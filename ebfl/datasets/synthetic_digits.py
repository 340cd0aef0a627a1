"""Synthetic 28 x 28 digit images: a stand-in for MNIST when the data are not at hand.

Each digit is a random set of "stroke" pixels (:func:`digit_strokes`); an image
of a digit inks its strokes with noise and speckles the background
(:func:`draw_digit_images`). Linear models reach MNIST-like accuracies on
them, so the papers' pipelines (FedHDP, PerAda) run end to end, fast and
without downloads, in tests and ``--dataset synthetic`` runs. They are not
MNIST: no number obtained on them is comparable with a paper's.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MNIST_TRAIN_COUNTS", "SIDE", "digit_strokes", "draw_digit_images"]

#: Image side in pixels (as MNIST).
SIDE = 28
#: MNIST's training images per digit 0-9 (synthetic federations mimic these frequencies).
MNIST_TRAIN_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


def digit_strokes(rng, n_ink=120):
    """One random set of ``n_ink`` stroke pixels per digit 0-9: bool array (10, SIDE^2).

    ``rng``: a :class:`numpy.random.Generator` (validated by the caller).
    """
    masks = np.zeros((10, SIDE * SIDE), bool)
    for d in range(10):
        masks[d, rng.choice(SIDE * SIDE, n_ink, replace=False)] = True
    return masks


def draw_digit_images(strokes, labels, rng):
    """Noisy float32 images (n, SIDE^2) of ``labels`` (ints in 0-9) with the digits' ``strokes``.

    Stroke pixels are inked with probability 0.8 (intensity U(0.6, 1)), other
    pixels speckled with probability 0.03 (intensity U(0, 0.5)).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = draw_digit_images(digit_strokes(rng), np.array([3, 7]), rng)
    >>> x.shape, bool(x.max() <= 1.0)
    ((2, 784), True)
    """
    n = labels.size
    on_stroke = strokes[labels]
    ink = on_stroke & (rng.random((n, SIDE * SIDE)) < 0.8)
    speck = ~on_stroke & (rng.random((n, SIDE * SIDE)) < 0.03)
    x = np.zeros((n, SIDE * SIDE), np.float32)
    x[ink] = rng.uniform(0.6, 1.0, int(ink.sum()))
    x[speck] = rng.uniform(0.0, 0.5, int(speck.sum()))
    return x
