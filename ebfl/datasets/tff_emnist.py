"""TensorFlow Federated's federated EMNIST, from its HDF5 files.

TFF's ``tff.simulation.datasets.emnist.load_data`` (up to its 2020 releases)
downloaded ``fed_emnist_digitsonly.tar.bz2`` (digits only: 3,383 writers, 10
labels) or ``fed_emnist.tar.bz2`` (3,400 writers, 62 labels) from
``https://storage.googleapis.com/tff-datasets-public/``, each holding a train
and a test HDF5 file:

* ``fed_emnist_digitsonly_train.h5``, ``fed_emnist_digitsonly_test.h5``;
* ``fed_emnist_train.h5``, ``fed_emnist_test.h5``.

Layout (TFF's ``HDF5ClientData``, ``tensorflow_federated/python/simulation/
hdf5_client_data.py``): a top-level group ``examples`` with one subgroup per
writer, named by the writer id, holding the datasets ``pixels`` (n, 28, 28)
float32 and ``label`` (n,) integers; TFF lists the writers in sorted order.
Labels 0-9 are digits, 10-35 ``A``-``Z``, 36-61 ``a``-``z``. Every writer has
at least one sample in each split (writers with fewer than 2 samples were left
out by TFF).

Pixel convention: TFF's docstring of ``emnist.load_data`` states that 1.0 is
the background and 0.0 the ink, "the *inverse* of some MNIST representations".
The loader converts to MNIST's convention, ink = 1: ``x = 1 - pixels``.

Later TFF releases ship one SQLite database (``emnist_all.sqlite.lzma``)
instead; this module does not read it. Nothing is downloaded here: put the
four ``.h5`` files in ``<data home>/tff-emnist/`` or pass their folder or path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ebfl._validation import check_bool, check_choice, check_int_scalar
from ebfl.datasets._home import data_home

__all__ = ["TFF_EMNIST_FILES", "TffEmnist", "load_tff_emnist", "tff_emnist_writers"]

#: TFF's file name for (only_digits, split).
TFF_EMNIST_FILES = {(True, "train"): "fed_emnist_digitsonly_train.h5",
                    (True, "test"): "fed_emnist_digitsonly_test.h5",
                    (False, "train"): "fed_emnist_train.h5",
                    (False, "test"): "fed_emnist_test.h5"}
#: Folder of the files in the data home.
TFF_EMNIST_DIRECTORY = "tff-emnist"
_SIDE = 28
_ARCHIVE = {True: "fed_emnist_digitsonly.tar.bz2", False: "fed_emnist.tar.bz2"}


@dataclass(frozen=True)
class TffEmnist:
    """One split of TFF's federated EMNIST, each sample tagged with its writer.

    Attributes
    ----------
    x : ndarray of float32, shape (n, 28, 28)
        Pixels in [0, 1], converted to MNIST's convention (ink 1, background 0).
    y : ndarray of int64, shape (n,)
        Labels 0..9 (``only_digits``) or 0..61.
    writer : ndarray of int64, shape (n,)
        Index of each sample's writer in ``writers``; samples are grouped by
        writer, in the order of ``writers``.
    writers : ndarray of str, shape (n_writers,)
        Writer ids in TFF's sorted order (writers with no sample are left out).
    only_digits : bool
    split : str
        ``"train"`` or ``"test"``.
    path : str
        The file read.
    """

    x: np.ndarray
    y: np.ndarray
    writer: np.ndarray
    writers: np.ndarray
    only_digits: bool
    split: str
    path: str

    def __post_init__(self):
        x, y, writer, writers = self.x, self.y, self.writer, self.writers
        n = y.shape[0] if y.ndim == 1 else -1
        if x.shape != (n, _SIDE, _SIDE) or writer.shape != (n,) or writers.ndim != 1:
            raise ValueError(f"x (n, 28, 28), y (n,), writer (n,) and writers (W,) disagree: "
                             f"{x.shape}, {y.shape}, {writer.shape}, {writers.shape}")
        for name, arr, top in (("y", y, self.n_classes), ("writer", writer, writers.size)):
            if not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
            if arr.size and (arr.min() < 0 or arr.max() >= top):
                raise ValueError(f"{name} must lie in 0..{top - 1}")

    @property
    def n_samples(self) -> int:
        return int(self.y.shape[0])

    @property
    def n_writers(self) -> int:
        return int(self.writers.shape[0])

    @property
    def n_classes(self) -> int:
        return 10 if self.only_digits else 62


def _resolve(path_or_dir, only_digits, split):
    """The file to read: ``path_or_dir`` itself, or TFF's file name inside it."""
    fname = TFF_EMNIST_FILES[(only_digits, split)]
    base = (data_home() / TFF_EMNIST_DIRECTORY if path_or_dir is None
            else Path(path_or_dir).expanduser())
    path = base / fname if base.is_dir() or path_or_dir is None else base
    if not path.is_file():
        raise FileNotFoundError(
            f"TFF federated EMNIST file {path} not found: ebfl does not download it. Get "
            f"{_ARCHIVE[only_digits]} (TensorFlow Federated's HDF5 release, "
            "https://storage.googleapis.com/tff-datasets-public/) and put "
            f"{fname} in {data_home() / TFF_EMNIST_DIRECTORY} (or pass its folder or path)")
    return path


def _read_writer(group, wid, path, n_classes):
    """``(x, y)`` of one writer's group, checked; x converted to ink = 1."""
    import h5py

    where = f"{path}: writer {wid!r}"
    if not isinstance(group, h5py.Group):
        raise ValueError(f"{where} must be a group holding 'pixels' and 'label'")
    missing = [k for k in ("pixels", "label") if not isinstance(group.get(k), h5py.Dataset)]
    if missing:
        raise ValueError(f"{where} has no dataset {missing[0]!r} (TFF layout: "
                         "examples/<writer>/pixels and examples/<writer>/label)")
    pixels, label = group["pixels"][()], group["label"][()]
    if pixels.ndim != 3 or pixels.shape[1:] != (_SIDE, _SIDE) or pixels.dtype.kind != "f":
        raise ValueError(f"{where}: pixels must be floats of shape (n, 28, 28), got "
                         f"{pixels.dtype} {pixels.shape}")
    if label.ndim == 2 and label.shape[1] == 1:
        label = label[:, 0]
    if label.ndim != 1 or label.dtype.kind not in "iu":
        raise ValueError(f"{where}: label must be integers of shape (n,), got {label.dtype} "
                         f"{label.shape}")
    if label.shape[0] != pixels.shape[0]:
        raise ValueError(f"{where} has {pixels.shape[0]} images but {label.shape[0]} labels")
    if pixels.size and not (np.all(np.isfinite(pixels)) and pixels.min() >= 0
                            and pixels.max() <= 1):
        raise ValueError(f"{where}: pixels must be finite and in [0, 1]")
    if label.size and (label.min() < 0 or label.max() >= n_classes):
        raise ValueError(f"{where}: labels must lie in 0..{n_classes - 1}"
                         + (" (only_digits=True; pass only_digits=False for the 62-class "
                            "files)" if n_classes == 10 else "")
                         + f", found {int(label.min())}..{int(label.max())}")
    return np.float32(1.0) - pixels.astype(np.float32), label.astype(np.int64)


def load_tff_emnist(path_or_dir=None, *, only_digits=True, split="train", max_clients=None):
    """Read one split of TFF's federated EMNIST (an HDF5 file) into flat arrays.

    Parameters
    ----------
    path_or_dir : path-like, optional
        A ``.h5`` file, or the folder holding TFF's files (the file name then
        follows ``only_digits`` and ``split``, see ``TFF_EMNIST_FILES``).
        Default: ``<data home>/tff-emnist/``.
    only_digits : bool, default=True
        The digits-only files (10 labels) or the full ones (62 labels); for a
        file path it sets the accepted labels.
    split : {"train", "test"}, default="train"
    max_clients : int, optional
        Read only the first writers, in TFF's sorted order (quick runs).

    Returns
    -------
    TffEmnist
        ``x`` (n, 28, 28) float32 with ink = 1 (TFF stores background = 1;
        converted as ``1 - pixels``), ``y`` and ``writer`` (n,) int64, the
        sorted ``writers``.

    Raises
    ------
    FileNotFoundError
        The file is missing (the message says where to put it).
    ValueError
        Not an HDF5 file, no ``examples`` group, a writer without ``pixels``
        or ``label``, shapes that disagree, pixels outside [0, 1], labels
        outside 0..9 (0..61); each message names the file.

    Examples
    --------
    >>> import tempfile, pathlib, h5py, numpy as np
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "fed_emnist_digitsonly_train.h5"
    >>> with h5py.File(path, "w") as f:
    ...     g = f.create_group("examples/f0001_01")
    ...     _ = g.create_dataset("pixels", data=np.ones((2, 28, 28), np.float32))
    ...     _ = g.create_dataset("label", data=np.array([3, 7], np.int32))
    >>> data = load_tff_emnist(path.parent, split="train")
    >>> data.writers.tolist(), data.y.tolist(), float(data.x.max())  # background 1 -> 0
    (['f0001_01'], [3, 7], 0.0)
    """
    only_digits = check_bool(only_digits, "only_digits")
    check_choice(split, "split", {"train", "test"})
    if max_clients is not None:
        max_clients = check_int_scalar(max_clients, "max_clients", minimum=1)
    path = _resolve(path_or_dir, only_digits, split)
    import h5py

    n_classes = 10 if only_digits else 62
    try:
        fh = h5py.File(path, "r")
    except OSError as exc:
        raise ValueError(f"{path} is not a readable HDF5 file ({exc})") from None
    with fh:
        examples = fh.get("examples")
        if not isinstance(examples, h5py.Group):
            raise ValueError(f"{path} has no group 'examples' (TFF layout: "
                             "examples/<writer>/pixels and examples/<writer>/label)")
        ids = sorted(examples.keys())
        if max_clients is not None:
            ids = ids[:max_clients]
        parts = [(wid, *_read_writer(examples[wid], wid, path, n_classes)) for wid in ids]
    parts = [p for p in parts if p[2].size]
    if not parts:
        raise ValueError(f"{path} holds no samples (no writer with data under 'examples')")
    writers = np.array([p[0] for p in parts])
    x = np.concatenate([p[1] for p in parts])
    y = np.concatenate([p[2] for p in parts])
    writer = np.repeat(np.arange(len(parts), dtype=np.int64), [p[2].size for p in parts])
    return TffEmnist(x, y, writer, writers, only_digits, split, str(path))


def _check_tff(data, name):
    if not isinstance(data, TffEmnist):
        raise TypeError(f"{name} must be a TffEmnist (from load_tff_emnist), got "
                        f"{type(data).__name__}")


def tff_emnist_writers(train, test):
    """The writers present in both splits, sorted, and those of one split only.

    Returns
    -------
    common : list of str
    train_only, test_only : list of str
        Writers dropped by :func:`ebfl.learning.torch.data.tff_emnist_federation`.
    """
    _check_tff(train, "train")
    _check_tff(test, "test")
    a, b = set(train.writers.tolist()), set(test.writers.tolist())
    return sorted(a & b), sorted(a - b), sorted(b - a)
