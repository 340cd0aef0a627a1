"""Seeded partitions of a labelled dataset into federated clients.

Every partitioner returns, per client, a sorted int64 array of indices into the
dataset; no index appears in two clients. Random ones take ``rng`` (None, an
int, a SeedSequence or a Generator) and give the same partition for the same
seed. numpy only: no torch here.

* :func:`pathological`: each client sees only a few classes (the paper's
  MNIST split: 50 clients, 3 classes each);
* :func:`dirichlet`: label skew with Dirichlet class shares (Hsu et al. 2019;
  the NIID-Bench scheme of Li et al. 2022);
* :func:`natural`: one client per writer, subject, ...;
* :func:`train_test_split_per_client`: a stratified train/test split inside
  each client;
* :func:`dirichlet_least_samples`: the label-skew partition of PerAda (Xie et
  al., CVPR 2024) and FedDF: a few samples of every class per client, then
  Dirichlet shares with a per-client cap;
* :func:`split_like_train`: a test set split among clients in their training
  parts' per-class shares (PerAda's local test sets).
"""

from __future__ import annotations

import numbers

import numpy as np

from ebfl._validation import as_generator, check_int_scalar, check_real_scalar

__all__ = ["count_summary", "count_summary_text", "dirichlet", "dirichlet_least_samples",
           "natural", "pathological", "split_like_train", "train_test_split_per_client"]

#: Largest Dirichlet concentration accepted by :func:`dirichlet`.
MAX_ALPHA = 1e100


def _labels_iv(labels):
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("labels must not be empty")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"labels must be integer class labels, got dtype {arr.dtype}")
    return arr


def _n_clients_iv(n_clients, labels):
    return check_int_scalar(n_clients, "n_clients", minimum=1, maximum=labels.size)


def _grouped(inverse, counts):
    """Indices sorted by class (stable), and each class's start in that order."""
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return order, starts


def pathological(labels, n_clients, classes_per_client=3, *, rng=None):
    """Each client gets samples of ``classes_per_client`` classes only.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
    n_clients : int
        Between 1 and the number of samples.
    classes_per_client : int, default=3
        Between 1 and the number of distinct labels.
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted, disjoint index arrays; client ``i`` holds
        samples of exactly ``classes_per_client`` classes.

    Raises
    ------
    ValueError
        ``classes_per_client`` exceeds the number of classes, ``n_clients < 1``,
        or a class has fewer samples than clients sharing it.

    Notes
    -----
    With ``m`` clients, ``k`` classes per client and ``C`` classes, the
    ``m k`` (client, class) slots are spread as evenly as possible: each class
    is held by ``floor(m k / C)`` or ``ceil(m k / C)`` clients (the larger
    number for randomly chosen classes). Clients then pick their classes in
    turn, each taking the ``k`` classes with the most slots left, ties broken
    at random; this greedy order always succeeds and gives every client ``k``
    distinct classes. The samples of a class are shuffled and cut into as many
    equal shards (sizes differ by at most one) as clients hold it, one shard
    per client, in random order.

    So client ``i`` receives about ``sum_c n_c / h_c`` samples over its classes
    ``c`` (``n_c`` samples of class ``c``, ``h_c`` holders). When ``m k >= C``
    every sample is used; otherwise the classes nobody holds are left out. For
    MNIST's 60,000 training images with ``m = 50``, ``k = 3``: each digit is
    held by 15 clients, and each client gets about 3 x 6000 / 15 = 1200
    images.

    Examples
    --------
    >>> labels = np.repeat(np.arange(4), 6)
    >>> parts = pathological(labels, n_clients=4, classes_per_client=2, rng=0)
    >>> [np.unique(labels[p]).size for p in parts]
    [2, 2, 2, 2]
    >>> sorted(np.concatenate(parts).tolist()) == list(range(24))
    True
    """
    labels = _labels_iv(labels)
    n_clients = _n_clients_iv(n_clients, labels)
    k = check_int_scalar(classes_per_client, "classes_per_client", minimum=1)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    n_classes = classes.size
    if k > n_classes:
        raise ValueError(f"classes_per_client must be <= the {n_classes} classes in labels, "
                         f"got {k}")
    rng = as_generator(rng)
    base, extra = divmod(n_clients * k, n_classes)
    holders = np.full(n_classes, base)
    holders[rng.choice(n_classes, size=extra, replace=False)] += 1
    short = np.flatnonzero(counts < holders)
    if short.size:
        c = short[0]
        raise ValueError(f"class {classes[c]} has {counts[c]} samples but would be shared by "
                         f"{holders[c]} clients; use a smaller n_clients or "
                         "classes_per_client")
    remaining = holders.copy()
    owners = [[] for _ in range(n_classes)]
    for i in range(n_clients):
        chosen = np.lexsort((rng.random(n_classes), -remaining))[:k]
        remaining[chosen] -= 1
        for c in chosen:
            owners[c].append(i)
    order, starts = _grouped(inverse, counts)
    parts = [[] for _ in range(n_clients)]
    for c in range(n_classes):
        if not owners[c]:
            continue
        idx = rng.permutation(order[starts[c]:starts[c] + counts[c]])
        for owner, shard in zip(rng.permutation(owners[c]),
                                np.array_split(idx, len(owners[c])), strict=True):
            parts[owner].append(shard)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def dirichlet(labels, n_clients, alpha, *, min_size=10, max_tries=1000, rng=None):
    """Label skew: each class is shared among the clients in Dirichlet(alpha) proportions.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
    n_clients : int
        Between 1 and the number of samples.
    alpha : float
        Dirichlet concentration, in (0, 1e100]. Small values (0.1) give clients
        dominated by one or two classes; large values (100) nearly the global mix.
    min_size : int, default=10
        Every client must get at least this many samples; partitions that
        fall short are drawn again (the NIID-Bench convention).
    max_tries : int, default=1000
        Draws before giving up.
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted, disjoint index arrays covering every sample.

    Raises
    ------
    ValueError
        ``alpha <= 0``, ``n_clients < 1``, ``min_size * n_clients`` above the
        number of samples, or no draw meeting ``min_size`` in ``max_tries``.

    Notes
    -----
    For each class ``c`` independently, shares
    ``(p_c1, ..., p_cm) ~ Dirichlet(alpha, ..., alpha)`` are drawn and the
    shuffled samples of ``c`` are cut at ``floor(n_c (p_c1 + ... + p_cj))``,
    ``j = 1..m-1``: client ``j`` gets about ``p_cj n_c`` of them. The whole
    draw is repeated until every client has ``min_size`` samples (this
    conditions the shares; it does not change their symmetry). Client ``j``'s
    class proportions are then ``p_cj n_c / sum_c' p_c'j n_c'``; with balanced
    classes their average over clients is close to uniform. Unlike the
    NIID-Bench code, shares are not zeroed for clients that already hold more
    than ``n / m`` samples.

    Examples
    --------
    >>> labels = np.repeat(np.arange(3), 50)
    >>> parts = dirichlet(labels, n_clients=5, alpha=0.5, min_size=5, rng=1)
    >>> sum(p.size for p in parts), min(p.size for p in parts) >= 5
    (150, True)
    """
    labels = _labels_iv(labels)
    n_clients = _n_clients_iv(n_clients, labels)
    # numpy's Dirichlet sampler returns garbage once the sum of the alphas nears
    # the float64 maximum; 1e100 already gives the global mix to 1e-50.
    alpha = check_real_scalar(alpha, "alpha", low=0.0, high=MAX_ALPHA, low_open=True)
    min_size = check_int_scalar(min_size, "min_size", minimum=0)
    max_tries = check_int_scalar(max_tries, "max_tries", minimum=1)
    if min_size * n_clients > labels.size:
        raise ValueError(f"min_size * n_clients = {min_size * n_clients} exceeds the "
                         f"{labels.size} samples: lower min_size or n_clients")
    rng = as_generator(rng)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    for _ in range(max_tries):
        shares = rng.dirichlet(np.full(n_clients, alpha), size=classes.size)
        cuts = np.floor(np.cumsum(shares, axis=1)[:, :-1] * counts[:, None]).astype(np.int64)
        bounds = np.concatenate([np.zeros((classes.size, 1), np.int64),
                                 np.minimum(cuts, counts[:, None]), counts[:, None]], axis=1)
        bounds = np.maximum.accumulate(bounds, axis=1)
        if np.diff(bounds, axis=1).sum(axis=0).min() >= min_size:
            break
    else:
        raise ValueError(f"no partition gave every client >= {min_size} samples in "
                         f"{max_tries} draws (alpha={alpha}, n_clients={n_clients}): lower "
                         "min_size, raise alpha or max_tries")
    order, starts = _grouped(inverse, counts)
    parts = [[] for _ in range(n_clients)]
    for c in range(classes.size):
        idx = rng.permutation(order[starts[c]:starts[c] + counts[c]])
        for j, chunk in enumerate(np.split(idx, bounds[c, 1:-1])):
            parts[j].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def natural(groups):
    """One client per distinct group id (writer, subject, ...), in sorted id order.

    Parameters
    ----------
    groups : array_like, shape (n,)
        Group id of each sample (integers or strings).

    Returns
    -------
    list of ndarray of int64
        Client ``k`` holds the samples of group ``np.unique(groups)[k]``, sorted.

    Raises
    ------
    ValueError
        ``groups`` is empty, not 1-D, or has NaN ids.

    Examples
    --------
    >>> [p.tolist() for p in natural(["b", "a", "b", "c"])]
    [[1], [0, 2], [3]]
    """
    try:
        arr = np.asarray(groups)
    except (TypeError, ValueError) as exc:  # ragged nested sequences
        raise TypeError("groups must be a 1-D array of ids (integers or strings)") from exc
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"groups must be a non-empty 1-D array, got shape {arr.shape}")
    if arr.dtype.kind == "c" or (arr.dtype.kind == "O" and any(
            isinstance(g, complex | np.complexfloating) for g in arr)):
        raise TypeError("groups must hold ids (integers or strings), got complex values")
    if arr.dtype.kind not in "biufUSO":
        raise TypeError(f"groups must hold ids (integers or strings), got dtype {arr.dtype}")
    if (np.issubdtype(arr.dtype, np.floating) and np.isnan(arr).any()) or (
            arr.dtype.kind == "O" and any(isinstance(g, float) and g != g for g in arr)):
        raise ValueError("groups must not contain NaN")
    try:
        order = np.argsort(arr, kind="stable")
        _, starts = np.unique(arr[order], return_index=True)
    except TypeError as exc:
        raise TypeError(f"groups must hold comparable ids (integers or strings): {exc}") from None
    return [part.astype(np.int64) for part in np.split(order, starts[1:])]


def _clients_iv(client_indices, n):
    if isinstance(client_indices, str | bytes) or (isinstance(client_indices, np.ndarray)
                                                   and client_indices.ndim == 1):
        raise TypeError("client_indices must be a sequence of index arrays, one per client")
    try:
        clients = [np.asarray(c) for c in client_indices]
    except TypeError:
        raise TypeError("client_indices must be a sequence of index arrays, one per "
                        "client") from None
    if not clients:
        raise ValueError("client_indices must hold at least one client")
    for i, idx in enumerate(clients):
        if idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"client_indices[{i}] must be a non-empty 1-D index array, got "
                             f"shape {idx.shape} (empty clients cannot be split)")
        if idx.dtype == bool or not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"client_indices[{i}] must hold integer indices, got dtype "
                            f"{idx.dtype}")
        if idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"client_indices[{i}] must lie in 0..{n - 1} (labels has {n} "
                             "entries)")
        if np.unique(idx).size != idx.size:
            raise ValueError(f"client_indices[{i}] has repeated indices")
    return clients


def train_test_split_per_client(labels, client_indices, test_fraction, *, rng=None):
    """Split each client's samples into train and test, stratified by its own labels.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
    client_indices : sequence of array_like of int
        Each client's indices into ``labels`` (e.g. from :func:`pathological`),
        non-empty, without repeats.
    test_fraction : float
        In (0, 1).
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    train, test : list of ndarray of int64
        Per client, sorted and disjoint; together they are the client's indices.

    Raises
    ------
    ValueError
        ``test_fraction`` outside (0, 1), an empty client, indices out of
        range or repeated.

    Notes
    -----
    A client with ``n_i >= 2`` samples gets ``t_i = round(test_fraction n_i)``
    test samples, clipped to ``1..n_i - 1`` (so it keeps at least one test and
    one training sample); a client with one sample keeps it for training.
    ``t_i`` is shared among the client's classes by largest remainders
    (Hamilton's method, ties broken at random): class ``c`` with ``n_ic``
    samples gets ``floor(q)`` or ``ceil(q)`` test samples, ``q = t_i n_ic /
    n_i``, chosen at random within the class. The test set thus follows the
    client's label distribution to within one sample per class.

    Examples
    --------
    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    >>> train, test = train_test_split_per_client(labels, [np.arange(10)], 0.5, rng=0)
    >>> np.bincount(labels[test[0]]).tolist(), len(train[0])
    ([2, 3], 5)
    """
    labels = _labels_iv(labels)
    if not isinstance(test_fraction, numbers.Real) or isinstance(test_fraction, bool):
        raise TypeError(f"test_fraction must be a real number in (0, 1), got {test_fraction!r}")
    test_fraction = float(test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    clients = _clients_iv(client_indices, labels.size)
    rng = as_generator(rng)
    train, test = [], []
    for idx in clients:
        idx = idx.astype(np.int64)
        n = idx.size
        n_test = 0 if n < 2 else min(max(int(np.floor(test_fraction * n + 0.5)), 1), n - 1)
        _, inverse, counts = np.unique(labels[idx], return_inverse=True, return_counts=True)
        quota = n_test * counts / n
        take = np.floor(quota).astype(np.int64)
        rest = n_test - int(take.sum())
        take[np.lexsort((rng.random(counts.size), -(quota - take)))[:rest]] += 1
        perm = rng.permutation(n)
        pos = perm[np.argsort(inverse[perm], kind="stable")]  # by class, random within
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(n) - starts[inverse[pos]]
        is_test = np.zeros(n, bool)
        is_test[pos] = rank < take[inverse[pos]]
        train.append(np.sort(idx[~is_test]))
        test.append(np.sort(idx[is_test]))
    return train, test


# -- PerAda's partition: least samples, capped Dirichlet shares, test split like train ------


def _least_samples(inverse, counts, n_clients, least, rng):
    """Per class, ``n_clients * least`` random samples dealt ``least`` to each client; and
    the class's other samples (shuffled), for the Dirichlet stage."""
    order, starts = _grouped(inverse, counts)
    dealt = [[] for _ in range(n_clients)]
    rest = []
    for c in range(counts.size):
        idx = rng.permutation(order[starts[c]:starts[c] + counts[c]])
        first = idx[: n_clients * least].reshape(n_clients, least)
        for j in range(n_clients):
            dealt[j].append(first[j])
        rest.append(idx[n_clients * least:])
    return dealt, rest


def _capped_sizes(shares, held, cap, n):
    """Cut ``n`` samples among clients by ``shares``, zeroing the shares of clients that
    hold ``cap`` or more. A client with a zero share gets nothing (the cumulative share
    is scaled to end at exactly 1, so no rounding hands it a sample)."""
    shares = np.where(held < cap, shares, 0.0)
    if shares.sum() <= 0.0:  # every open share underflowed to 0 (alpha near 0)
        shares = (held < cap).astype(np.float64)
    cum = np.cumsum(shares)
    bounds = np.floor(cum / cum[-1] * n).astype(np.int64)
    return np.diff(np.concatenate([[0], bounds]))


def dirichlet_least_samples(labels, n_clients, alpha, *, least_per_class=2, cap=None,
                            rng=None):
    """Label skew as in PerAda (Xie et al., CVPR 2024): least samples, then capped Dirichlet.

    The partition of PerAda's CIFAR-10 and CheXpert experiments (the rules of
    its official code, which follow FedDF, Lin et al. 2020):

    1. every client first gets ``least_per_class`` random samples of every
       class;
    2. the other samples are dealt class by class (classes in sorted order):
       for class ``k``, shares ``p ~ Dirichlet(alpha 1_M)`` are drawn, the
       share of every client already holding ``cap`` or more samples from
       this stage is set to 0, the shares are renormalised, and the class's
       shuffled samples are cut at ``floor(n_k (p_1 + ... + p_j))``.

    Parameters
    ----------
    labels : array_like of int, shape (n,)
    n_clients : int
        ``M``, at least 1; every class must have ``M * least_per_class``
        samples.
    alpha : float
        Dirichlet concentration, in (0, 1e100] (PerAda: 0.1 for CIFAR-10,
        0.3 and 1 for CheXpert).
    least_per_class : int, default=2
        Samples of every class each client gets first (>= 0).
    cap : float, optional
        Size at which a client's Dirichlet shares are zeroed, counting the
        samples of step 2 only (as the official code does). Default ``n / M``.
        PerAda's code uses ``N / M`` with ``N`` the whole training set,
        server part included (50,000 / 20 = 2,500 for CIFAR-10): pass
        ``cap=N / M`` to match it when ``labels`` holds the clients' pool only.
        Must be at least (samples of step 2) / ``M``, so that some client is
        always below it; ``np.inf`` sets no cap.
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    list of ndarray of int64
        ``n_clients`` sorted, disjoint index arrays covering every sample.

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1e100], a class with fewer than
        ``n_clients * least_per_class`` samples, or ``cap`` below
        (samples of step 2) / ``n_clients``.

    Notes
    -----
    What the cap guarantees: a client receives samples of class ``k`` in step
    2 only if it held fewer than ``cap`` step-2 samples before class ``k``.
    So a client's step-2 count stays below ``cap`` plus the one class chunk
    that took it over (its last chunk), and its total below that plus
    ``least_per_class`` times the number of classes. If every open share
    underflows to 0 (possible only for ``alpha`` near 0), the class is split
    evenly among the clients below the cap instead (the official code would
    divide by zero there).

    Examples
    --------
    >>> labels = np.repeat(np.arange(4), 50)
    >>> parts = dirichlet_least_samples(labels, n_clients=5, alpha=0.1, rng=0)
    >>> [int(np.bincount(labels[p], minlength=4).min()) >= 2 for p in parts]
    [True, True, True, True, True]
    >>> sum(p.size for p in parts)
    200
    """
    labels = _labels_iv(labels)
    n_clients = _n_clients_iv(n_clients, labels)
    # numpy's Dirichlet sampler fails near the float64 maximum (see dirichlet above)
    alpha = check_real_scalar(alpha, "alpha", low=0.0, high=MAX_ALPHA, low_open=True)
    least = check_int_scalar(least_per_class, "least_per_class", minimum=0,
                             maximum=labels.size)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    short = np.flatnonzero(counts < n_clients * least)
    if short.size:
        c = short[0]
        raise ValueError(f"class {classes[c]} has {counts[c]} samples, fewer than "
                         f"n_clients * least_per_class = {n_clients * least}: lower "
                         "least_per_class or n_clients")
    pool = labels.size - n_clients * least * classes.size
    floor_cap = pool / n_clients
    if cap is None:
        cap = labels.size / n_clients
    else:
        cap = check_real_scalar(cap, "cap", low=0.0, high=np.inf)
        if cap < floor_cap:  # then every client could reach the cap before the last class
            raise ValueError(f"cap must be >= {floor_cap:g} (the {pool} samples dealt by "
                             f"Dirichlet shares over n_clients={n_clients}), got {cap:g}")
    rng = as_generator(rng)
    dealt, rest = _least_samples(inverse, counts, n_clients, least, rng)
    held = np.zeros(n_clients, np.int64)
    for c in range(classes.size):
        shares = rng.dirichlet(np.full(n_clients, alpha))
        sizes = _capped_sizes(shares, held, cap, rest[c].size)
        for j, chunk in enumerate(np.split(rest[c], np.cumsum(sizes)[:-1])):
            dealt[j].append(chunk)
        held += sizes
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in dealt]


def _largest_remainders(total, weights, rng):
    """Integers summing to ``total``, proportional to integer ``weights`` (Hamilton's method
    in exact integer arithmetic; ties among equal remainders broken at random)."""
    weights = np.asarray(weights, dtype=np.int64)
    scaled = total * weights
    base, rem = scaled // weights.sum(), scaled % weights.sum()
    left = total - int(base.sum())
    base[np.lexsort((rng.random(weights.size), -rem))[:left]] += 1
    return base


def split_like_train(test_labels, train_parts, train_labels, *, rng=None):
    """Split a test set among clients in the per-class shares of their training parts.

    PerAda (Xie et al., CVPR 2024) gives each client a local test set with the
    label distribution of its training data, and the union of the local test
    sets is the whole test set ("Global-test"). Here each class's test
    samples are shared among the clients in proportion to the clients' shares
    of that class's training samples.

    Parameters
    ----------
    test_labels : array_like of int, shape (n_test,)
    train_parts : sequence of array_like of int
        Each client's indices into ``train_labels`` (e.g. from
        :func:`dirichlet_least_samples`), non-empty, without repeats.
    train_labels : array_like of int, shape (n_train,)
    rng : None, int, SeedSequence or Generator

    Returns
    -------
    list of ndarray of int64
        One sorted index array into ``test_labels`` per client; disjoint, and
        together every test index exactly once. A client may get none.

    Raises
    ------
    ValueError
        A class of ``test_labels`` that no client's training part holds (its
        test samples could not be assigned), or malformed ``train_parts``.

    Notes
    -----
    For class ``k`` with ``t_k`` test samples, ``N_k`` training samples
    across the parts and ``n_jk`` of them in client ``j``'s part, client ``j``
    gets ``floor(t_k n_jk / N_k)`` test samples of class ``k`` or one more:
    the ``t_k - sum_j floor(...)`` remaining samples go to the clients with
    the largest remainders ``(t_k n_jk) mod N_k`` (exact integer arithmetic;
    ties broken at random), so a client without training samples of a class
    gets no test samples of it. Which samples go where is random within the
    class. When every class has the same test/train ratio ``t_k / N_k = r``,
    client ``j`` gets ``r n_jk`` test samples of class ``k`` to within one,
    i.e. its training label distribution.

    PerAda's official code instead re-runs its training partition on the
    test set with the same Dirichlet shares; the two agree per class up to
    the cap, the least samples and rounding.

    Examples
    --------
    >>> train_labels = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    >>> parts = [np.array([0, 1, 3]), np.array([2, 4, 5, 6, 7])]
    >>> test_labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    >>> test = split_like_train(test_labels, parts, train_labels, rng=0)
    >>> [np.bincount(test_labels[t], minlength=2).tolist() for t in test]
    [[4, 2], [2, 6]]
    """
    test_labels = _labels_iv(test_labels)
    train_labels = _labels_iv(train_labels)
    try:
        parts = _clients_iv(train_parts, train_labels.size)
    except (TypeError, ValueError) as exc:  # the shared check names its own argument
        message = str(exc).replace("client_indices", "train_parts")
        raise type(exc)(message.replace("(labels has", "(train_labels has")) from None
    classes, inverse, t_counts = np.unique(test_labels, return_inverse=True,
                                           return_counts=True)
    held = np.stack([np.array([np.count_nonzero(train_labels[p] == c) for c in classes],
                              dtype=np.int64) for p in parts])  # (clients, classes)
    missing = np.flatnonzero(held.sum(axis=0) == 0)
    if missing.size:
        raise ValueError(f"test_labels has class {classes[missing[0]]}, which no client's "
                         "training part holds: its test samples cannot be shared like "
                         "the training data")
    rng = as_generator(rng)
    order, starts = _grouped(inverse, t_counts)
    out = [[] for _ in parts]
    for c in range(classes.size):
        sizes = _largest_remainders(int(t_counts[c]), held[:, c], rng)
        idx = rng.permutation(order[starts[c]:starts[c] + t_counts[c]])
        for j, chunk in enumerate(np.split(idx, np.cumsum(sizes)[:-1])):
            out[j].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in out]


# -- describing a partition ------------------------------------------------------------------


def count_summary(counts):
    """``{"min", "max", "total"}`` of per-client sample counts (for a federation's summary).

    >>> count_summary(np.array([3, 5, 4]))
    {'min': 3, 'max': 5, 'total': 12}
    """
    counts = np.asarray(counts)
    return {"min": int(counts.min()), "max": int(counts.max()), "total": int(counts.sum())}


def count_summary_text(summary):
    """One line of a :func:`count_summary`: ``"3-5 (12 in all)"``, or ``"4 (12 in all)"``."""
    lo, hi = summary["min"], summary["max"]
    span = str(lo) if lo == hi else f"{lo}-{hi}"
    return f"{span} ({summary['total']} in all)"
