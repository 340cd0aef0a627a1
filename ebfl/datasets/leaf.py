"""FEMNIST in the LEAF benchmark's JSON format, grouped into federated clients by writer.

LEAF (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf) builds FEMNIST
from NIST Special Database 19: 28 x 28 grey images of digits and letters, each
tagged with its writer. Its ``preprocess.sh`` writes ``data/train/*.json`` and
``data/test/*.json``; each file is an object with

* ``users``: writer ids;
* ``num_samples``: samples per writer, in the order of ``users``;
* ``user_data``: writer -> ``{"x": [[784 floats], ...], "y": [int, ...]}``,
  images flattened row by row, pixels / 255 (LEAF keeps NIST's polarity:
  background 1.0, ink near 0.0, the reverse of MNIST); labels 0-9 digits,
  10-35 ``A``-``Z``, 36-61 ``a``-``z``.

``user_data`` may hold writers missing from ``users`` (LEAF's by-sample split
keeps empty entries for writers it dropped); only ``users`` are read.

LEAF publishes scripts, not data files: the raw input is NIST's ``by_class.zip``
and ``by_write.zip``, for which neither NIST nor LEAF publishes a checksum.
Run LEAF's ``preprocess.sh`` (e.g. ``-s niid --sf 0.05 -k 0 -t sample``) and
copy its ``data/femnist/data/train`` and ``test`` folders to
``<data home>/leaf-femnist/data/``, or fetch an archive of them with
:func:`fetch_leaf_femnist` (opt-in and unverified unless you pass its sha256).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import numpy as np

from ebfl._validation import as_generator, check_choice, check_int_scalar
from ebfl.datasets._home import (
    CORRUPTED_FILE_ERRORS,
    data_home,
    import_pooch,
    manifest,
    sha256,
)

__all__ = ["FEMNIST_CLASSES", "FemnistClients", "LeafFemnist", "femnist_clients",
           "fetch_leaf_femnist", "load_leaf_femnist"]

#: LEAF's 62 FEMNIST classes: label k is ``FEMNIST_CLASSES[k]``.
FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SIDE = 28


@dataclass(frozen=True)
class LeafFemnist:
    """The samples of one LEAF FEMNIST split, each tagged with its writer.

    Attributes
    ----------
    x : ndarray of float32, shape (n, 28, 28)
        LEAF's pixel values (pixel / 255: background 1.0, ink near 0.0).
    y : ndarray of int64, shape (n,)
        Labels 0..61 (see ``FEMNIST_CLASSES``).
    writer : ndarray of int64, shape (n,)
        Index of each sample's writer in ``writers``; samples are grouped by
        writer, in the order of ``writers``.
    writers : ndarray of str, shape (n_writers,)
        Writer ids, sorted.
    """

    x: np.ndarray
    y: np.ndarray
    writer: np.ndarray
    writers: np.ndarray

    def __post_init__(self):
        x, y, writer = np.asarray(self.x), np.asarray(self.y), np.asarray(self.writer)
        writers = np.asarray(self.writers)
        n = y.shape[0] if y.ndim == 1 else -1
        if x.shape != (n, _SIDE, _SIDE) or writer.shape != (n,) or writers.ndim != 1:
            raise ValueError(f"x (n, 28, 28), y (n,), writer (n,) and writers (W,) disagree: "
                             f"{x.shape}, {y.shape}, {writer.shape}, {writers.shape}")
        for name, arr, top in (("y", y, len(FEMNIST_CLASSES)), ("writer", writer, writers.size)):
            if not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
            if arr.size and (arr.min() < 0 or arr.max() >= top):
                raise ValueError(f"{name} must lie in 0..{top - 1}")

    @property
    def n_samples(self) -> int:
        return self.y.shape[0]

    @property
    def n_writers(self) -> int:
        return self.writers.shape[0]


def _default_root():
    return data_home() / manifest("leaf_femnist")["directory"] / "data"


def _read_leaf_json(path, seen):
    try:
        obj = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or not {"users", "num_samples", "user_data"} <= set(obj):
        raise ValueError(f"{path} must be a JSON object with keys 'users', 'num_samples' and "
                         "'user_data' (LEAF format)")
    users, counts, data = obj["users"], obj["num_samples"], obj["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
        raise ValueError(f"{path}: 'users' and 'num_samples' must be lists of the same length")
    out = []
    for user, count in zip(users, counts, strict=True):
        user = str(user)
        if user in seen:
            raise ValueError(f"{path}: writer {user!r} also appears in {seen[user]}")
        seen[user] = path.name
        entry = data.get(user) if isinstance(data, dict) else None
        if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
            raise ValueError(f"{path}: user_data has no 'x' and 'y' for writer {user!r}")
        x, y = entry["x"], entry["y"]
        if not isinstance(x, list) or not isinstance(y, list):
            raise ValueError(f"{path}: writer {user!r} must have lists 'x' (images) and 'y' "
                             "(labels)")
        if not (len(x) == len(y) == count):
            raise ValueError(f"{path}: writer {user!r} has {len(x)} images and {len(y)} "
                             f"labels, num_samples says {count}")
        try:
            xa = (np.asarray(x, dtype=np.float32).reshape(len(y), -1) if len(y)
                  else np.zeros((0, _SIDE * _SIDE), np.float32))
            ya = np.asarray(y, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: writer {user!r} must have numeric images of "
                             f"{_SIDE * _SIDE} values and integer labels") from None
        if xa.shape[1:] != (_SIDE * _SIDE,):
            raise ValueError(f"{path}: writer {user!r} has images of {xa.shape[1]} values, "
                             f"expected {_SIDE * _SIDE} (28 x 28)")
        if not np.all(np.isfinite(xa)):
            raise ValueError(f"{path}: writer {user!r} has NaN or infinite pixels")
        if np.any(ya != np.floor(ya)) or np.any((ya < 0) | (ya >= len(FEMNIST_CLASSES))):
            raise ValueError(f"{path}: writer {user!r} has labels outside the integers "
                             f"0..{len(FEMNIST_CLASSES) - 1}")
        out.append((user, xa.reshape(len(y), _SIDE, _SIDE), ya.astype(np.int64)))
    return out


def load_leaf_femnist(root=None, split="train"):
    """Read one split of LEAF FEMNIST (all ``<root>/<split>/*.json``) into flat arrays.

    Parameters
    ----------
    root : path-like, optional
        The folder holding ``train/`` and ``test/`` (LEAF's
        ``data/femnist/data``). Default: ``<data home>/leaf-femnist/data``.
    split : {"train", "test"}, default="train"

    Returns
    -------
    LeafFemnist
        ``x`` (n, 28, 28) float32, ``y`` (n,) int64, ``writer`` (n,) int64 and
        the sorted ``writers``. Writers with no sample are kept out.

    Raises
    ------
    FileNotFoundError
        No ``*.json`` file in ``<root>/<split>``.
    ValueError
        A file is not LEAF JSON, its counts disagree, an image does not have
        784 finite values, a label is outside 0..61, or a writer appears twice.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "train").mkdir()
    >>> blob = {"users": ["f0001"], "num_samples": [2],
    ...         "user_data": {"f0001": {"x": [[1.0] * 784, [0.0] * 784], "y": [3, 40]}}}
    >>> _ = (root / "train" / "all_data_0.json").write_text(json.dumps(blob))
    >>> data = load_leaf_femnist(root, "train")
    >>> data.x.shape, data.y.tolist(), data.writers.tolist()
    ((2, 28, 28), [3, 40], ['f0001'])
    """
    check_choice(split, "split", {"train", "test"})
    root = _default_root() if root is None else Path(root).expanduser()
    files = sorted((root / split).glob("*.json"))
    if not files:
        raise FileNotFoundError(
            f"no LEAF FEMNIST {split} files (*.json) in {root / split}: run LEAF's "
            "data/femnist/preprocess.sh (https://github.com/TalwalkarLab/leaf) and copy its "
            f"data/train and data/test folders to {root}, or use fetch_leaf_femnist(url)")
    seen, parts = {}, []
    for path in files:
        parts.extend(_read_leaf_json(path, seen))
    parts = sorted((p for p in parts if p[2].size), key=lambda p: p[0])
    if not parts:
        return LeafFemnist(np.zeros((0, _SIDE, _SIDE), np.float32), np.zeros(0, np.int64),
                           np.zeros(0, np.int64), np.array([], dtype=str))
    writers = np.array([p[0] for p in parts])
    x = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    writer = np.repeat(np.arange(len(parts), dtype=np.int64), [p[2].size for p in parts])
    return LeafFemnist(x, y, writer, writers)


@dataclass(frozen=True)
class FemnistClients:
    """FEMNIST clients, each the union of a few writers' samples.

    Attributes
    ----------
    writers : ndarray of str, shape (n_clients, writers_per_client)
        The writers of each client.
    x_train, y_train : tuple of ndarray
        Per client: images (n_i, 28, 28) float32 and labels (n_i,) int64 from
        the training split.
    x_test, y_test : tuple of ndarray or None
        The same from the test split (None when no test split was given).
    n_classes : int
        10 with ``digits_only``, else 62.
    """

    writers: np.ndarray
    x_train: tuple
    y_train: tuple
    x_test: tuple | None
    y_test: tuple | None
    n_classes: int

    @property
    def n_clients(self) -> int:
        return self.writers.shape[0]


def _by_writer(data, keep):
    """Writer id -> indices of its kept samples."""
    idx = np.flatnonzero(keep)
    w = data.writer[idx]
    order = np.argsort(w, kind="stable")
    idx, w = idx[order], w[order]
    uniq, starts = np.unique(w, return_index=True)
    return {str(data.writers[u]): part
            for u, part in zip(uniq, np.split(idx, starts[1:]), strict=True)}


def _check_leaf(data, name):
    if not isinstance(data, LeafFemnist):
        raise TypeError(f"{name} must be a LeafFemnist (from load_leaf_femnist), got "
                        f"{type(data).__name__}")


def femnist_clients(train, test=None, *, writers_per_client=3, n_writers=198,
                    digits_only=True, rng=None):
    """Group randomly chosen FEMNIST writers into clients (the paper's FEMNIST set-up).

    ``n_writers`` writers are drawn without replacement among those with at
    least one kept sample in ``train`` (and in ``test`` when given), in a random
    order; consecutive groups of ``writers_per_client`` form the clients. With
    the defaults that is 198 writers, 3 per client, 66 clients.

    Parameters
    ----------
    train : LeafFemnist
        Training split (:func:`load_leaf_femnist`).
    test : LeafFemnist, optional
        Test split with the same writers (LEAF's ``-t sample`` split). Without
        it, split each client's data with
        :func:`ebfl.learning.partition.train_test_split_per_client`.
    writers_per_client : int, default=3
    n_writers : int, default=198
        A multiple of ``writers_per_client``.
    digits_only : bool, default=True
        Keep only the digit samples (labels 0-9), for a 10-output model such as
        the paper's CNN; writers without a digit are then not eligible. False
        keeps all 62 classes.
    rng : None, int, SeedSequence or Generator
        Chooses the writers.

    Returns
    -------
    FemnistClients

    Raises
    ------
    ValueError
        ``n_writers`` is not a multiple of ``writers_per_client`` or exceeds the
        eligible writers.
    TypeError
        ``train`` or ``test`` is not a :class:`LeafFemnist`.

    Examples
    --------
    >>> import numpy as np
    >>> writers = np.array(["w0", "w1", "w2", "w3"])
    >>> train = LeafFemnist(np.zeros((8, 28, 28), np.float32), np.arange(8) % 3 * 9,
    ...                     np.repeat(np.arange(4), 2), writers)
    >>> clients = femnist_clients(train, writers_per_client=2, n_writers=4, rng=0)
    >>> clients.n_clients, sorted(clients.writers.ravel().tolist())
    (2, ['w0', 'w1', 'w2', 'w3'])
    >>> sorted(np.concatenate(clients.y_train).tolist())  # the 18s (letter I) are dropped
    [0, 0, 0, 9, 9, 9]
    """
    _check_leaf(train, "train")
    if test is not None:
        _check_leaf(test, "test")
    writers_per_client = check_int_scalar(writers_per_client, "writers_per_client", minimum=1)
    n_writers = check_int_scalar(n_writers, "n_writers", minimum=1)
    if n_writers % writers_per_client:
        raise ValueError(f"n_writers must be a multiple of writers_per_client "
                         f"({writers_per_client}), got {n_writers}")
    if not isinstance(digits_only, bool | np.bool_):
        raise TypeError(f"digits_only must be True or False, got {digits_only!r}")
    rng = as_generator(rng)
    n_classes = 10 if digits_only else len(FEMNIST_CLASSES)
    tr = _by_writer(train, train.y < n_classes)
    te = _by_writer(test, test.y < n_classes) if test is not None else None
    eligible = sorted(tr if te is None else set(tr) & set(te))
    if n_writers > len(eligible):
        where = "train" if te is None else "both train and test"
        raise ValueError(f"n_writers must be <= the {len(eligible)} writers with "
                         f"{'digit ' if digits_only else ''}samples in {where}, got {n_writers}")
    chosen = np.array(eligible)[rng.permutation(len(eligible))[:n_writers]]
    groups = chosen.reshape(-1, writers_per_client)

    def gather(data, by):
        idx = [np.sort(np.concatenate([by[w] for w in g])) for g in groups]
        return tuple(data.x[i] for i in idx), tuple(data.y[i] for i in idx)

    x_train, y_train = gather(train, tr)
    x_test, y_test = gather(test, te) if te is not None else (None, None)
    return FemnistClients(groups, x_train, y_train, x_test, y_test, n_classes)


def _archive_root(tree):
    """The one folder under ``tree`` holding ``train/`` with LEAF JSON files."""
    roots = sorted({p.parent.parent for p in tree.rglob("train/*.json")})
    if len(roots) != 1:
        raise ValueError("the archive must hold exactly one train/ folder of LEAF *.json "
                         f"files (and its test/ beside it), found {len(roots)}")
    return roots[0]


def _safe_members(names):
    for name in names:
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise ValueError(f"the archive has an unsafe member path {name!r}; refusing it")


def _unpack(archive, dest):
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                _safe_members(zf.namelist())
                zf.extractall(dest)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                _safe_members(tf.getnames())
                tf.extractall(dest, filter="data")
        else:
            raise ValueError(f"{archive.name} is neither a zip nor a tar archive")
    except (zipfile.BadZipFile, tarfile.TarError, *CORRUPTED_FILE_ERRORS) as exc:
        raise ValueError(f"{archive.name} is truncated or corrupted ({exc})") from None


def fetch_leaf_femnist(url=None, *, sha256_hex=None, progress=False, timeout=300):
    """Download and unpack an archive of LEAF FEMNIST JSON into the data home (opt-in).

    LEAF distributes only its preprocessing scripts; no archive of the JSON
    files is published, and no checksum of them or of NIST's raw zips (see the
    manifest ``data/manifests/leaf_femnist.json``). So ``url`` is required
    unless the manifest pins a ``download``, and the archive is verified only
    when ``sha256_hex`` is given; otherwise its sha256 is returned, to record.

    The archive (zip or tar, possibly compressed) must hold one ``train/``
    folder of ``*.json`` files and its ``test/`` beside it, under any prefix.
    It is downloaded to ``<data home>/leaf-femnist/`` (a temporary file moved
    into place when complete) and unpacked into a temporary folder, whose
    ``train/`` and ``test/`` are then moved to ``<data home>/leaf-femnist/data``.
    On any failure nothing is left behind. Data already unpacked there is kept.

    Parameters
    ----------
    url : str, optional
        Default: the manifest's pinned ``download`` (none today).
    sha256_hex : str, optional
        Expected sha256 of the archive.
    progress : bool, default=False
    timeout : float, default=300
        Seconds to wait for the server.

    Returns
    -------
    root : pathlib.Path
        ``<data home>/leaf-femnist/data``, for :func:`load_leaf_femnist`.
    digest : str or None
        sha256 of the archive (None when the data were already unpacked).

    Raises
    ------
    ValueError
        No ``url``; a checksum mismatch; not an archive, member paths leaving
        the target folder, or no ``train/*.json`` in it.
    """
    pooch = import_pooch()
    info = manifest("leaf_femnist")
    directory = data_home() / info["directory"]
    root = directory / "data"
    if any((root / "train").glob("*.json")):
        return root, None
    if root.exists():
        raise ValueError(f"{root} exists but holds no train/*.json: complete or remove it "
                         "before fetching")
    if url is None:
        url = (info.get("download") or {}).get("url")
    if url is None:
        raise ValueError("url is required: LEAF publishes no archive of FEMNIST JSON (only "
                         f"scripts: {info['official_source']}); pass the URL of an archive "
                         "of LEAF's data/train and data/test folders")
    fname = PurePosixPath(urlparse(url).path).name or "leaf_femnist_archive"
    archive = directory / fname
    known = f"sha256:{sha256_hex}" if sha256_hex else None
    had_archive = archive.is_file()
    if not had_archive:
        downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)
        pooch.retrieve(url, known_hash=known, fname=fname, path=str(directory),
                       downloader=downloader)
    digest = sha256(archive)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=directory))
    try:
        if sha256_hex and digest != sha256_hex:
            raise ValueError(f"{archive} has sha256 {digest}, expected {sha256_hex}")
        _unpack(archive, tmp)
        found = _archive_root(tmp)
        staged = tmp / ".staged"
        staged.mkdir()
        for split in ("train", "test"):
            if (found / split).is_dir():
                shutil.move(str(found / split), str(staged / split))
        staged.rename(root)
    except BaseException:
        if not had_archive:
            archive.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root, digest
