"""The data of the FedHDP experiments, and the paper's reported numbers.

"Federated learning with heterogeneous differential privacy" (the FedHDP
paper, Section 5.1 and Tables 5 and 8-11) trains on four federations, each
with 5 % of its clients non-private (opted out of differential privacy),
chosen once at random and kept fixed across algorithms:

* non-IID MNIST (:func:`noniid_mnist`): 2,000 clients holding one digit each,
  the same number of samples for every client;
* skewed non-IID MNIST (``noniid_mnist(skewed=True)``): the same clients, with
  the non-private ones drawn only from the clients holding a 7;
* "FMNIST" and FEMNIST (:func:`fedhdp_emnist`): TensorFlow Federated's
  federated EMNIST, digits only (3,383 writers, 10 labels) and all 62 labels
  (3,400 writers); "FMNIST" is not Fashion-MNIST.

:func:`synthetic_noniid_mnist` builds the one-digit-per-client structure from
random images, with no download, for fast tests and for users without MNIST.
:func:`fedhdp_paper_numbers` reads the paper's Tables 3, 4 and 8-11.

Every builder returns a :class:`FedHDPData`: the clients'
:class:`~ebfl.learning.torch.FederatedDataset`, their privacy ``groups``
(``NONPRIVATE`` = 0, ``PRIVATE`` = 1) and the server's test set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ebfl._paths import paper_numbers
from ebfl._validation import check_bool, check_choice, check_int_scalar, check_probability
from ebfl.datasets.synthetic_digits import MNIST_TRAIN_COUNTS, digit_strokes, draw_digit_images
from ebfl.learning.partition import count_summary, count_summary_text

if TYPE_CHECKING:  # torch is an optional dependency: imported where a dataset is built
    from ebfl.learning.torch import FederatedDataset

__all__ = ["NONPRIVATE", "PAPER_TABLES", "PRIVATE", "FedHDPData", "fedhdp_emnist",
           "fedhdp_paper_numbers", "noniid_mnist", "synthetic_noniid_mnist"]

#: Privacy group codes of :attr:`FedHDPData.groups`.
NONPRIVATE, PRIVATE = 0, 1
#: The paper's tables of results shipped in ``data/paper_numbers/fedhdp_table<k>.csv``.
PAPER_TABLES = (3, 4, 8, 9, 10, 11)
#: The digit whose clients are the non-private ones in the skewed variant.
SKEWED_DIGIT = 7


@dataclass(frozen=True)
class FedHDPData:
    """A federation of the FedHDP experiments: clients, privacy groups, server test set.

    Attributes
    ----------
    name : str
        ``"noniid-mnist"``, ``"skewed-noniid-mnist"``, ``"synthetic"``,
        ``"synthetic-skewed"``, ``"fmnist"`` (TFF EMNIST digits), ``"femnist"``,
        or ``"noniid-fashion-mnist"`` (a stand-in, see :func:`noniid_mnist`).
    data : FederatedDataset
        The clients' training and local test sets.
    groups : ndarray of int64, shape (m,)
        ``NONPRIVATE`` (0) or ``PRIVATE`` (1) per client.
    x_server_test : ndarray of float32, shape (n,) + feature_shape
        The server's test set (the global model's ``Acc_g``).
    y_server_test : ndarray of int64, shape (n,)
    client_digit : ndarray of int64, shape (m,), or None
        The one digit each client holds (None for the EMNIST federations).
    settings : dict
        How the federation was built (sizes, seed, source), for the record.

    The arrays are read-only.

    Examples
    --------
    >>> fed = synthetic_noniid_mnist(n_clients=20, seed=0)
    >>> fed.n_clients, fed.nonprivate.size, fed.private.size
    (20, 1, 19)
    >>> fed.to_dict()["clients_per_digit"]
    [2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    """

    name: str
    data: FederatedDataset
    groups: np.ndarray
    x_server_test: np.ndarray
    y_server_test: np.ndarray
    client_digit: np.ndarray | None
    settings: dict

    def __post_init__(self):
        for name in ("groups", "x_server_test", "y_server_test", "client_digit"):
            arr = getattr(self, name)
            if arr is not None:  # a read-only view: the caller's array keeps its flags
                view = np.asarray(arr).view()
                view.setflags(write=False)
                object.__setattr__(self, name, view)

    @property
    def n_clients(self) -> int:
        return int(self.groups.shape[0])

    @property
    def nonprivate(self) -> np.ndarray:
        """Indices of the non-private clients."""
        return np.flatnonzero(self.groups == NONPRIVATE)

    @property
    def private(self) -> np.ndarray:
        """Indices of the private clients."""
        return np.flatnonzero(self.groups == PRIVATE)

    def to_dict(self) -> dict:
        """A JSON-ready summary: sizes, groups, digits per group, and the settings."""
        n_train, n_test = self.data.n_train.numpy(), self.data.n_test.numpy()
        out = {"name": self.name, "n_clients": self.n_clients,
               "n_classes": int(self.data.n_classes),
               "feature_shape": list(self.data.x_train.shape[2:]),
               "n_nonprivate": int(self.nonprivate.size), "n_private": int(self.private.size),
               "train_per_client": count_summary(n_train),
               "test_per_client": count_summary(n_test),
               "server_test_size": int(self.y_server_test.shape[0])}
        if self.client_digit is not None:
            k = 10
            out["clients_per_digit"] = np.bincount(self.client_digit, minlength=k).tolist()
            out["nonprivate_per_digit"] = np.bincount(self.client_digit[self.nonprivate],
                                                      minlength=k).tolist()
        out["settings"] = dict(self.settings)
        return out

    def describe(self) -> str:
        """A few lines for people: what the federation holds."""
        d = self.to_dict()
        tr, te = d["train_per_client"], d["test_per_client"]
        lines = [f"{self.name}: {d['n_clients']} clients, {d['n_classes']} classes, features "
                 f"{tuple(d['feature_shape'])}",
                 f"  training samples per client: {count_summary_text(tr)}; local test "
                 f"samples per client: {count_summary_text(te)}",
                 f"  non-private clients: {d['n_nonprivate']} "
                 f"({d['n_nonprivate'] / d['n_clients']:.1%}); private: {d['n_private']}",
                 f"  server test set: {d['server_test_size']} samples"]
        if "clients_per_digit" in d:
            lines.append(f"  clients per digit 0-9: {d['clients_per_digit']}")
            lines.append(f"  non-private clients per digit: {d['nonprivate_per_digit']}")
        return "\n".join(lines)


# -- the one-digit-per-client partition ----------------------------------------------------


def _apportion(weights, total):
    """Split ``total`` into integers proportional to ``weights`` (largest remainders).

    Each share is the floor of its quota ``total * w / sum(w)`` or one more; the
    units left after the floors go to the largest fractional parts (ties to the
    lower index), so the shares sum to ``total``.
    """
    weights = np.asarray(weights, dtype=np.float64)
    quota = total * weights / weights.sum()
    shares = np.floor(quota).astype(np.int64)
    left = total - int(shares.sum())
    order = np.argsort(-(quota - shares), kind="stable")
    shares[order[:left]] += 1
    return shares


def _most_per_client(pool_counts, clients_per_digit):
    """The largest size each client of a digit can get from that digit's pool, disjointly."""
    used = clients_per_digit > 0
    return int(np.min(pool_counts[used] // clients_per_digit[used]))


def _limiting_digit(pool_counts, clients_per_digit):
    used = np.flatnonzero(clients_per_digit > 0)
    d = used[np.argmin(pool_counts[used] // clients_per_digit[used])]
    return int(d)


def _disjoint_draws(labels, client_digit, size, rng):
    """For each client, ``size`` indices of samples with its digit; no index used twice."""
    out = np.empty((client_digit.size, size), np.int64)
    for d in np.unique(client_digit):
        clients = np.flatnonzero(client_digit == d)
        pool = rng.permutation(np.flatnonzero(labels == d))
        out[clients] = pool[: clients.size * size].reshape(clients.size, size)
    return out


def _independent_draws(labels, client_digit, size, rng):
    """For each client, ``size`` distinct indices with its digit, drawn independently of
    the other clients (so clients of one digit share samples)."""
    pools = {int(d): np.flatnonzero(labels == d) for d in np.unique(client_digit)}
    return np.stack([rng.choice(pools[int(d)], size, replace=False) for d in client_digit])


def _nonprivate_count(fraction, n_clients):
    return int(np.floor(fraction * n_clients + 0.5))  # round half up, as the paper's 5 % of 2,000


def _privacy_groups(client_digit, n_nonprivate, skewed, rng):
    """``NONPRIVATE`` for ``n_nonprivate`` clients drawn at random (skewed: among the 7s)."""
    m = client_digit.size
    eligible = np.flatnonzero(client_digit == SKEWED_DIGIT) if skewed else np.arange(m)
    groups = np.full(m, PRIVATE, np.int64)
    groups[rng.choice(eligible, n_nonprivate, replace=False)] = NONPRIVATE
    return groups


def _streams(seed):
    """Independent streams for the digits and training draws, the local test draws, the
    privacy groups and the synthetic images: changing one never changes the others
    (the skewed and plain variants of one seed share their clients)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]


def _common_iv(n_clients, nonprivate_fraction, skewed, seed):
    n_clients = check_int_scalar(n_clients, "n_clients", minimum=1, maximum=10**6)
    nonprivate_fraction = check_probability(nonprivate_fraction, "nonprivate_fraction")
    skewed = check_bool(skewed, "skewed")
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=2**63 - 1)
    return n_clients, nonprivate_fraction, skewed, seed


def _groups_iv(client_digit, nonprivate_fraction, skewed, rng):
    n_np = _nonprivate_count(nonprivate_fraction, client_digit.size)
    if skewed:
        sevens = int(np.sum(client_digit == SKEWED_DIGIT))
        if n_np > sevens:
            raise ValueError(f"nonprivate_fraction must be <= {sevens / client_digit.size:.4f} "
                             f"in the skewed variant: only the {sevens} clients holding digit "
                             f"{SKEWED_DIGIT} can be non-private, got {nonprivate_fraction} "
                             f"({n_np} clients)")
    return _privacy_groups(client_digit, n_np, skewed, rng)


def _flat_images(images):
    """uint8 (n, 28, 28) -> float32 (n, 784) in [0, 1]."""
    return (images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0))


def noniid_mnist(*, n_clients=2000, samples_per_client=None, test_per_client=None,
                 skewed=False, nonprivate_fraction=0.05, seed=0, directory=None,
                 download=True, source="mnist"):
    """Non-IID MNIST of the FedHDP paper: every client holds one digit.

    Section 5.1 of the FedHDP paper: 2,000 clients, each assigned samples of a
    single digit, the same number for every client; 5 % of the clients are
    non-private, chosen at random once. In the skewed variant the non-private
    clients are drawn only from the clients holding a 7: the paper's skewed
    r = 0 rows (Table 9), whose global model scores 10.27 % on the MNIST test
    set (the share of 7s, 1,028 of 10,000) and 100 % on the non-private
    clients, confirm that every client holds one digit. The paper does not give
    the sizes; the choices here:

    * Digits. Clients are apportioned to the digits in proportion to the
      digits' frequencies in the MNIST training set (largest remainders: each
      digit gets the floor of its quota ``n_clients * n_d / 60,000`` or one
      more); the client order is shuffled. For 2,000 clients: 197, 225, 199,
      204, 195, 181, 197, 209, 195, 198 clients for digits 0-9.
    * Training samples. Each client's are drawn without replacement from its
      digit's training images, disjoint across clients. Default: the largest
      equal size that fits every digit, at most ``60,000 // n_clients``. For
      2,000 clients 60,000 / 2,000 = 30 does not fit (225 clients of digit 1
      would need 6,750 images; MNIST has 6,742), so the default is 29
      (58,000 of the 60,000 images are used).
    * Local test samples. From the MNIST test set, the client's digit only.
      Default: the largest equal size for which the clients of every digit get
      disjoint images (4 for 2,000 clients: digit 0 has 980 test images for
      197 clients). A larger ``test_per_client`` (at most 892, the test images
      of digit 5) draws each client's images independently, so clients of one
      digit share images; ``settings["local_test_disjoint"]`` says which. The
      paper's per-client variances (e.g. 0.13 for ``Acc_g,np`` in Table 8)
      are well below the binomial noise of a 4-image test set, which suggests
      its local test sets were much larger.
    * The server test set is the whole MNIST test set (10,000 images).

    In the skewed r = 0 rows the private clients score 7.1 % (Table 9): the
    share of private clients holding a 7, i.e. about 135 of 1,900, or 235
    clients of digit 7 in all; the proportional assignment here has 209 (109
    private), so that row cannot be matched exactly (the paper does not say how
    it assigned the digits).

    Parameters
    ----------
    n_clients : int, default=2000
    samples_per_client : int, optional
        Training samples per client (see above for the default and the limit).
    test_per_client : int, optional
        Local test samples per client (see above).
    skewed : bool, default=False
        Draw the non-private clients among the clients holding a 7.
    nonprivate_fraction : float, default=0.05
        Share of non-private clients, rounded to the nearest count (half up).
    seed : int, default=0
        Seeds the digits' assignment, the draws and the non-private clients,
        from independent streams: the skewed and plain variants of one seed
        have the same clients and data, and differ only in their groups.
    directory : path-like, optional
        Folder with MNIST's IDX files (default: ``<data home>/mnist``).
    download : bool, default=True
        Fetch missing MNIST files (verified against their sha256).
    source : {"mnist", "fashion-mnist"}, default="mnist"
        "fashion-mnist" builds the same federation from Fashion-MNIST's ten
        classes (a stand-in, not a dataset of the paper; its "FMNIST" is TFF's
        federated EMNIST), class 7 (sneaker) taking the place of the 7s.

    Returns
    -------
    FedHDPData
        Features are float32 pixels in [0, 1] flattened to (784,) (the paper's
        FC 784-50-10 network), labels int64; ``client_digit`` per client.

    Raises
    ------
    ValueError
        A size or fraction outside its range (the message gives the limit).
    FileNotFoundError
        MNIST is missing and ``download`` is False.

    Examples
    --------
    >>> fed = noniid_mnist(skewed=True)  # doctest: +SKIP
    >>> summary = fed.to_dict()  # doctest: +SKIP
    >>> summary["train_per_client"], summary["nonprivate_per_digit"][7]  # doctest: +SKIP
    ({'min': 29, 'max': 29, 'total': 58000}, 100)
    """
    from ebfl.datasets import load_fashion_mnist, load_mnist

    source = check_choice(source, "source", ("mnist", "fashion-mnist"))
    load = load_mnist if source == "mnist" else load_fashion_mnist
    n_clients, nonprivate_fraction, skewed, seed = _common_iv(n_clients, nonprivate_fraction,
                                                              skewed, seed)
    download = check_bool(download, "download")
    for value, name in ((samples_per_client, "samples_per_client"),
                        (test_per_client, "test_per_client")):
        if value is not None:  # the type and sign now; the upper limit needs the data
            check_int_scalar(value, name, minimum=1)
    train = load("train", directory=directory, download=download)
    test = load("test", directory=directory, download=download)
    train_counts = np.bincount(train.labels, minlength=10)
    test_counts = np.bincount(test.labels, minlength=10)
    per_digit = _apportion(train_counts, n_clients)
    s = _size_iv(samples_per_client, "samples_per_client", train_counts, per_digit,
                 cap=train.n_samples // n_clients, split="training")
    t_disjoint = _most_per_client(test_counts, per_digit)
    if test_per_client is None:
        t = t_disjoint
        if t < 1:
            d = _limiting_digit(test_counts, per_digit)
            raise ValueError(f"n_clients is too large: digit {d} has {test_counts[d]} test "
                             f"images for {per_digit[d]} clients; give test_per_client to "
                             "draw overlapping local test sets")
    else:
        top = int(test_counts[per_digit > 0].min())
        t = check_int_scalar(test_per_client, "test_per_client", minimum=1, maximum=top)
    rng_train, rng_test, rng_groups, _ = _streams(seed)
    client_digit = rng_train.permutation(np.repeat(np.arange(10), per_digit))
    train_idx = _disjoint_draws(train.labels, client_digit, s, rng_train)
    disjoint = t <= t_disjoint
    draw = _disjoint_draws if disjoint else _independent_draws
    test_idx = draw(test.labels, client_digit, t, rng_test)
    groups = _groups_iv(client_digit, nonprivate_fraction, skewed, rng_groups)

    x_train, x_test = _flat_images(train.images), _flat_images(test.images)
    y_train, y_test = train.labels.astype(np.int64), test.labels.astype(np.int64)
    data = _federated(x_train, y_train, train_idx, x_test, y_test, test_idx, n_classes=10)
    label = "MNIST" if source == "mnist" else "Fashion-MNIST"
    settings = {"source": label, "samples_per_client": s, "test_per_client": t,
                "local_test_disjoint": disjoint, "nonprivate_fraction": nonprivate_fraction,
                "skewed": skewed, "seed": seed,
                "digit_assignment": f"proportional to {label} training frequencies "
                                    "(largest remainders), client order shuffled",
                "server_test": f"the {label} test set"}
    name = "noniid-mnist" if source == "mnist" else "noniid-fashion-mnist"
    return FedHDPData(f"skewed-{name}" if skewed else name, data, groups,
                      x_test, y_test, client_digit, settings)


def _size_iv(value, name, pool_counts, per_digit, *, cap, split):
    """The samples per client: ``value`` checked against what the digits' pools allow."""
    most = min(_most_per_client(pool_counts, per_digit), cap)
    d = _limiting_digit(pool_counts, per_digit)
    if most < 1:
        raise ValueError(f"n_clients is too large: digit {d} has {pool_counts[d]} {split} "
                         f"images for {per_digit[d]} clients")
    if value is None:
        return most
    try:
        return check_int_scalar(value, name, minimum=1, maximum=most)
    except ValueError:
        raise ValueError(f"{name} must be an integer in [1, {most}] for {per_digit.sum()} "
                         f"clients (digit {d}: {per_digit[d]} clients, {pool_counts[d]} "
                         f"{split} images), got {value}") from None


def _federated(x_train, y_train, train_idx, x_test, y_test, test_idx, *, n_classes):
    from ebfl.learning.torch import FederatedDataset

    return FederatedDataset.from_clients([x_train[i] for i in train_idx],
                                         [y_train[i] for i in train_idx],
                                         [x_test[i] for i in test_idx],
                                         [y_test[i] for i in test_idx], n_classes=n_classes)


# -- the synthetic stand-in ------------------------------------------------------------------


def synthetic_noniid_mnist(*, n_clients=200, samples_per_client=30, test_per_client=10,
                           n_server_test=1000, skewed=False, nonprivate_fraction=0.05, seed=0):
    """A download-free stand-in for :func:`noniid_mnist`: random 28 x 28 images, one digit
    per client.

    Each digit 0-9 is a fixed random set of 120 "stroke" pixels (drawn from the
    seed); an image of digit d inks each of d's stroke pixels with probability
    0.8 (intensity uniform in [0.6, 1]) and speckles each other pixel with
    probability 0.03 (intensity uniform in [0, 0.5]). Clients are apportioned to
    the digits in proportion to MNIST's training frequencies (largest
    remainders, client order shuffled), each client's images are fresh draws of
    its digit, and the non-private clients are chosen as in
    :func:`noniid_mnist` (skewed: among the clients holding a 7). The server
    test set has ``n_server_test`` images apportioned the same way.

    Parameters
    ----------
    n_clients : int, default=200
    samples_per_client : int, default=30
    test_per_client : int, default=10
    n_server_test : int, default=1000
    skewed : bool, default=False
    nonprivate_fraction : float, default=0.05
    seed : int, default=0

    Returns
    -------
    FedHDPData
        Named ``"synthetic"`` (``"synthetic-skewed"``); features float32 in
        [0, 1] of shape (784,).

    Raises
    ------
    ValueError
        A size outside its range, or (skewed) more non-private clients than
        clients holding a 7.

    Examples
    --------
    >>> fed = synthetic_noniid_mnist(n_clients=40, skewed=True, seed=1)
    >>> fed.n_clients, fed.nonprivate.size, set(fed.client_digit[fed.nonprivate].tolist())
    (40, 2, {7})
    >>> tuple(fed.data.x_train.shape), fed.x_server_test.shape
    ((40, 30, 784), (1000, 784))
    """
    n_clients, nonprivate_fraction, skewed, seed = _common_iv(n_clients, nonprivate_fraction,
                                                              skewed, seed)
    s = check_int_scalar(samples_per_client, "samples_per_client", minimum=1, maximum=10**5)
    t = check_int_scalar(test_per_client, "test_per_client", minimum=1, maximum=10**5)
    n_server = check_int_scalar(n_server_test, "n_server_test", minimum=1, maximum=10**7)
    rng_train, rng_test, rng_groups, rng_images = _streams(seed)
    client_digit = rng_train.permutation(np.repeat(np.arange(10),
                                                   _apportion(MNIST_TRAIN_COUNTS, n_clients)))
    strokes = digit_strokes(rng_images)
    y_train = np.repeat(client_digit, s)
    y_test = np.repeat(client_digit, t)
    x_train = draw_digit_images(strokes, y_train, rng_train).reshape(n_clients, s, -1)
    x_test = draw_digit_images(strokes, y_test, rng_test).reshape(n_clients, t, -1)
    y_server = rng_test.permutation(np.repeat(np.arange(10),
                                              _apportion(MNIST_TRAIN_COUNTS, n_server)))
    x_server = draw_digit_images(strokes, y_server, rng_test)
    groups = _groups_iv(client_digit, nonprivate_fraction, skewed, rng_groups)

    from ebfl.learning.torch import FederatedDataset

    data = FederatedDataset.from_clients(list(x_train), list(y_train.reshape(n_clients, s)),
                                         list(x_test), list(y_test.reshape(n_clients, t)),
                                         n_classes=10)
    settings = {"source": "synthetic", "samples_per_client": s, "test_per_client": t,
                "local_test_disjoint": True, "nonprivate_fraction": nonprivate_fraction,
                "skewed": skewed, "seed": seed,
                "digit_assignment": "proportional to MNIST training frequencies "
                                    "(largest remainders), client order shuffled",
                "server_test": f"{n_server} fresh synthetic images"}
    return FedHDPData("synthetic-skewed" if skewed else "synthetic", data, groups, x_server,
                      y_server.astype(np.int64), client_digit, settings)


# -- TFF's federated EMNIST ------------------------------------------------------------------


def fedhdp_emnist(directory=None, *, only_digits=True, nonprivate_fraction=0.05, seed=0,
                  max_clients=None, flatten=True):
    """The FedHDP paper's "FMNIST" (``only_digits=True``) or FEMNIST federation.

    TensorFlow Federated's federated EMNIST (read by
    :func:`ebfl.datasets.load_tff_emnist`; not downloaded: see there), one
    client per writer with TFF's own train/test split of the writer's samples
    (writers missing from either split are dropped), pixels converted to ink
    = 1. The server test set is the union of all clients' test sets (Appendix
    C of the FedHDP paper); ``nonprivate_fraction`` of the clients, drawn at
    random from ``seed``, are non-private.

    Parameters
    ----------
    directory : path-like, optional
        Folder with TFF's HDF5 files (default: ``<data home>/tff-emnist``).
    only_digits : bool, default=True
        True: 3,383 writers, 10 labels ("FMNIST"); False: 3,400 writers, 62
        labels (FEMNIST).
    nonprivate_fraction : float, default=0.05
    seed : int, default=0
    max_clients : int, optional
        Keep the first writers in TFF's sorted order (quick runs).
    flatten : bool, default=True
        Features of shape (784,) (the paper's FC network for "FMNIST");
        False keeps (28, 28) (for its FEMNIST CNN).

    Returns
    -------
    FedHDPData
        ``client_digit`` is None.

    Notes
    -----
    The clients are padded to the largest one in the stacked
    :class:`~ebfl.learning.torch.FederatedDataset`; with all writers that takes
    several GB (``max_clients`` keeps it small).

    Examples
    --------
    >>> fed = fedhdp_emnist(only_digits=True)  # doctest: +SKIP
    >>> fed.n_clients, fed.nonprivate.size  # doctest: +SKIP
    (3383, 169)
    """
    from ebfl.datasets.tff_emnist import load_tff_emnist
    from ebfl.learning.torch.data import tff_emnist_federation

    nonprivate_fraction = check_probability(nonprivate_fraction, "nonprivate_fraction")
    seed = check_int_scalar(seed, "seed", minimum=0, maximum=2**63 - 1)
    only_digits = check_bool(only_digits, "only_digits")
    flatten = check_bool(flatten, "flatten")
    train = load_tff_emnist(directory, only_digits=only_digits, split="train",
                            max_clients=max_clients)
    test = load_tff_emnist(directory, only_digits=only_digits, split="test",
                           max_clients=max_clients)
    data = tff_emnist_federation(train, test, flatten=flatten)
    m = data.n_clients
    rng = _streams(seed)[2]
    groups = np.full(m, PRIVATE, np.int64)
    groups[rng.choice(m, _nonprivate_count(nonprivate_fraction, m), replace=False)] = NONPRIVATE
    x_server = np.concatenate([data.x_test[i, : data.n_test[i]].numpy() for i in range(m)])
    y_server = np.concatenate([data.y_test[i, : data.n_test[i]].numpy() for i in range(m)])
    settings = {"source": "TFF federated EMNIST", "only_digits": only_digits,
                "max_clients": max_clients, "nonprivate_fraction": nonprivate_fraction,
                "seed": seed, "server_test": "union of the clients' test sets"}
    return FedHDPData("fmnist" if only_digits else "femnist", data, groups, x_server, y_server,
                      None, settings)


# -- the paper's numbers ---------------------------------------------------------------------


def fedhdp_paper_numbers(table=None):
    """The FedHDP paper's reported accuracies (Tables 3, 4 and 8-11), one row per table row.

    Columns: ``dataset`` (``noniid_mnist``, ``skewed_noniid_mnist``, ``fmnist``
    = TFF EMNIST digits, ``femnist``), ``lambda_p``, ``lambda_np``,
    ``algorithm`` (``Non-Private+Ditto``, ``DP-FedAvg+Ditto``,
    ``HDP-FedAvg+Ditto`` = FedHDP with r = 1, ``FedHDP``), ``r``, then the
    accuracies in % (``acc_g``, ``acc_g_p``, ``acc_g_np``, ``acc_l_p``,
    ``acc_l_np``), the variances across clients printed in parentheses
    (``*_var``) and the gaps ``delta_g`` = ``acc_g_np`` - ``acc_g_p`` and
    ``delta_l`` = ``acc_l_np`` - ``acc_l_p``. A "-" of the paper is NaN; so is
    the lambda of the group an algorithm does not have (``lambda_p`` of
    Non-Private+Ditto, ``lambda_np`` of DP-FedAvg+Ditto) and ``r`` of the
    baselines. Tables 3 and 4 repeat rows of Tables 8-11, except Table 4's
    FMNIST FedHDP row (lambda_p = 0.05, lambda_np = 0.005), which mixes two
    runs: ``acc_l_np`` (and so ``delta_l``) from Table 10's lambda = 0.005 run,
    the rest from its lambda = 0.05 run. Privacy: (3.6, 1e-4) for the MNIST tables, (0.6, 1e-4) for
    "FMNIST", (4.1, 1e-4) for FEMNIST.

    Some printed cells contradict each other beyond the rounding of the
    printed digits (errata [FedHDP 7]); they are shipped as printed:

    * Table 8, lambda = 0.005, r = 0.001: delta_g 0.94, but 92.61 - 91.65 = 0.96;
    * Table 9, lambda = 0.05, r = 0.5: delta_g 5.33, but 93.43 - 87.9 = 5.53;
    * Table 9, lambda = 0.05, r = 0.75: delta_g 2.94, but 91.33 - 88.37 = 2.96;
    * Table 9, lambda = 0.25, r = 0.025: delta_l -0.4, but 99.09 - 98.69 = +0.40;
    * Table 10, lambda = 0.05, r = 0.025: delta_l 0.52, but 95.11 - 93.53 = 1.58;
    * Table 11, lambda = 0.05: the r = 0 row repeats the r = 0.001 row except
      ``acc_g``, and its ``acc_l_p`` (80.59) differs from ``acc_g_p`` (75.9)
      although at r = 0 the private clients are never trained (in every other
      r = 0 row the two agree; Table 10, lambda = 0.005, prints their
      variances as 2.45 and 2.4).

    Parameters
    ----------
    table : {3, 4, 8, 9, 10, 11}, optional
        One table; None: all of them, with a leading ``table`` column.

    Returns
    -------
    pandas.DataFrame

    Examples
    --------
    >>> t9 = fedhdp_paper_numbers(9)
    >>> t9.query("algorithm == 'FedHDP' and r == 0")["acc_g"].tolist()
    [10.27, 10.28, 10.27]
    """
    if table is None:
        import pandas as pd

        frames = [fedhdp_paper_numbers(t) for t in PAPER_TABLES]
        return pd.concat([f.assign(table=t)[["table", *f.columns]]
                          for t, f in zip(PAPER_TABLES, frames, strict=True)],
                         ignore_index=True)
    if isinstance(table, bool | np.bool_):
        raise TypeError(f"table must be one of {list(PAPER_TABLES)}, got {table!r}")
    check_choice(table, "table", PAPER_TABLES)
    return paper_numbers(f"fedhdp_table{int(table)}")
