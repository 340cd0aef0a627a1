"""CIFAR-10, CIFAR-100, CIFAR-10.1 and CIFAR-10-C: the data of PerAda's CIFAR-10 experiments.

PerAda (Xie et al., CVPR 2024) trains on CIFAR-10, distils on CIFAR-100 and
tests generalization on CIFAR-10.1 and CIFAR-10-C. The loaders read the
official files from the data home, verified against the manifests
``data/manifests/cifar10.json``, ``cifar100.json``, ``cifar10_1.json`` and
``cifar10_c.json`` (official source, checksums and where each checksum was
published):

* CIFAR-10 and CIFAR-100: the python-version tarballs
  ``cifar-10-python.tar.gz`` and ``cifar-100-python.tar.gz`` (sha256), read
  member by member without extracting; an extracted ``cifar-10-batches-py/``
  or ``cifar-100-python/`` folder is accepted too, checked against the md5s
  that torchvision publishes for its files (nobody publishes their sha256).
  The batches are Python pickles; they are read with an unpickler that
  builds nothing but NumPy arrays, lists, dicts and strings, so a tampered
  file cannot run code.
* CIFAR-10.1: ``cifar10.1_v6_data.npy`` and ``cifar10.1_v6_labels.npy`` (or
  v4), sha256.
* CIFAR-10-C: ``CIFAR-10-C.tar`` (2.9 GB, sha256), read member by member; an
  extracted ``CIFAR-10-C/`` folder is accepted too, checked for shape and
  type only (no checksums of its files are published).

Every loader returns a :class:`~ebfl.datasets.idx.LabelledImages`: uint8
images (n, 32, 32, 3) (height, width, RGB), int64 labels (n,) and the class
names.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from ebfl._validation import check_bool, check_choice, check_int_scalar
from ebfl.datasets import _home
from ebfl.datasets._home import CORRUPTED_FILE_ERRORS
from ebfl.datasets.idx import LabelledImages

__all__ = ["CIFAR10_CLASSES", "CIFAR10_C_CORRUPTIONS", "load_cifar10", "load_cifar100",
           "load_cifar10_1", "load_cifar10_c"]

#: CIFAR-10's classes, indexed by label (also CIFAR-10.1's and CIFAR-10-C's).
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
#: The 19 corruptions of CIFAR-10-C (one file each; PerAda averages over all of them).
CIFAR10_C_CORRUPTIONS = (
    "brightness", "contrast", "defocus_blur", "elastic_transform", "fog", "frost",
    "gaussian_blur", "gaussian_noise", "glass_blur", "impulse_noise", "jpeg_compression",
    "motion_blur", "pixelate", "saturate", "shot_noise", "snow", "spatter", "speckle_noise",
    "zoom_blur")
_SIDE = 32
_PIXELS = 3 * _SIDE * _SIDE
#: Files verified in this process: (path, size, mtime, expected sha256). CIFAR-10-C's
#: 2.9 GB archive takes seconds to hash, and a run reads it once per corruption.
_VERIFIED = set()


# -- verified files -----------------------------------------------------------------------------


def _directory(name, directory):
    info = _home.manifest(name)
    folder = (_home.data_home() / info["directory"] if directory is None
              else Path(directory).expanduser())
    return info, folder


def _stamp(path, expected):
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, expected)


def _verified_file(name, member, directory, *, download, progress, verify):
    """``_home.dataset_file``, skipping the checksum of a file already verified in this
    process (same path, size, modification time and expected sha256)."""
    info, folder = _directory(name, directory)
    entry = info["members"][member]
    for fname, expected in entry["files"].items():
        path = folder / fname
        if path.is_file() and _stamp(path, expected) in _VERIFIED:
            return path
    path = _home.dataset_file(name, member, directory=folder, download=download,
                              progress=progress, verify=verify)
    if verify:
        _VERIFIED.add(_stamp(path, entry["files"].get(path.name)))
    return path


def _md5(path):
    digest = hashlib.md5(usedforsecurity=False)  # the only checksum published for the file
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_md5(path, expected):
    actual = _md5(path)
    if actual != expected:
        raise ValueError(f"{path} has md5 {actual}, expected {expected} (torchvision's "
                         "published md5 of the official file): the file is corrupted or "
                         "another version")


def _missing(label, folder, archive, extracted):
    return FileNotFoundError(
        f"{label} not found in {folder}: neither {archive} nor an extracted {extracted}/ "
        f"folder is there (data home {_home.data_home()}; set EBFL_DATA, or allow the "
        "download)")


# -- pickled batches (CIFAR-10 / CIFAR-100 python versions) -------------------------------------


class _ArrayUnpickler(pickle.Unpickler):
    """Builds only what the CIFAR batches hold: dicts, lists, strings, ints and NumPy
    arrays. Any other global is refused, so a tampered pickle cannot run code."""

    _ALLOWED = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): np.zeros(1).__reduce__()[0],
        ("numpy._core.multiarray", "_reconstruct"): np.zeros(1).__reduce__()[0],
        ("numpy.core.multiarray", "scalar"): np.uint8(0).__reduce__()[0],
        ("numpy._core.multiarray", "scalar"): np.uint8(0).__reduce__()[0],
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 stores Python 3 bytes
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR batch "
                                         "holds only arrays, lists and strings") from None


def _unpickle(raw, label):
    """A CIFAR batch: a dict with str keys (the official files are Python 2 pickles with
    byte-string keys; a Python 3 copy may have bytes keys)."""
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError) as exc:
        raise ValueError(f"{label} is not a CIFAR batch (a pickled dict): {exc}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{label} is not a CIFAR batch: it holds a {type(batch).__name__}, "
                         "not a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}


def _read_tar_members(path, folder, wanted):
    """The bytes of members ``folder/<name>`` for ``name`` in ``wanted``, in one pass
    over a (possibly compressed) tar archive."""
    found = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                base = member.name[len(folder) + 1:] if member.name.startswith(
                    folder + "/") else None
                if base in wanted and member.isfile():
                    found[base] = tar.extractfile(member).read()
                    if len(found) == len(wanted):
                        break
    except (tarfile.TarError, *CORRUPTED_FILE_ERRORS) as exc:
        raise ValueError(f"{path} is not a readable tar archive ({exc}): truncated or "
                         "corrupted") from None
    absent = sorted(set(wanted) - set(found))
    if absent:
        raise ValueError(f"{path} lacks {', '.join(f'{folder}/{a}' for a in absent)}: not "
                         "the official archive")
    return found


def _batch_files(name, member, wanted, directory, *, download, progress, verify):
    """The raw bytes of the batch files ``wanted``: from the tarball when present (or
    downloaded), else from an extracted folder (md5-checked)."""
    info, folder = _directory(name, directory)
    extracted = info["extracted"]["folder"]
    archive = next(iter(info["members"][member]["files"]))
    loose = folder / extracted
    if not (folder / archive).is_file() and loose.is_dir():
        out = {}
        for base in wanted:
            path = loose / base
            if not path.is_file():
                raise _missing(f"{name} {base}", folder, archive, extracted)
            if verify:
                _check_md5(path, info["extracted"]["md5"][base])
            out[base] = path.read_bytes()
        return out
    if not download and not (folder / archive).is_file():
        raise _missing(name, folder, archive, extracted)
    path = _verified_file(name, member, directory, download=download, progress=progress,
                          verify=verify)
    return _read_tar_members(path, extracted, wanted)


def _images(batch, label, n_labels):
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or (
            data.shape[1] != _PIXELS):
        shape = getattr(data, "shape", None)
        raise ValueError(f"{label}: 'data' must be a uint8 array of shape (n, {_PIXELS}), got "
                         f"{type(data).__name__} {shape}")
    if data.shape[0] != n_labels:
        raise ValueError(f"{label}: {data.shape[0]} images but {n_labels} labels")
    # rows hold the red, green and blue planes of 32 x 32 pixels, one after the other
    return data.reshape(-1, 3, _SIDE, _SIDE).transpose(0, 2, 3, 1)


def _labels(batch, key, label, n_classes):
    try:
        labels = np.asarray(batch[key], dtype=np.int64)
    except KeyError:
        raise ValueError(f"{label} has no {key!r} entry (keys: {sorted(batch)})") from None
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{label}: {key!r} must be a list of integer labels") from None
    if labels.ndim != 1:
        raise ValueError(f"{label}: {key!r} must be 1-D, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{label}: labels must lie in 0..{n_classes - 1}, found "
                         f"{int(labels.min())}..{int(labels.max())}")
    return labels


def _class_names(batch, key, label):
    try:
        names = batch[key]
        return tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names)
    except (KeyError, TypeError):
        raise ValueError(f"{label} has no list {key!r} of class names") from None


def _labelled(raw, files, label_key, classes, name):
    images, labels = [], []
    for base in files:
        batch = _unpickle(raw[base], f"{name} {base}")
        y = _labels(batch, label_key, f"{name} {base}", len(classes))
        images.append(_images(batch, f"{name} {base}", y.size))
        labels.append(y)
    return LabelledImages(np.ascontiguousarray(np.concatenate(images)),
                          np.concatenate(labels), classes)


def _flags_iv(verify, download, progress):
    return check_bool(verify, "verify"), check_bool(download, "download"), check_bool(
        progress, "progress")


def load_cifar10(split="train", *, directory=None, verify=True, download=True, progress=False):
    """CIFAR-10, one split, from the verified python-version tarball.

    Parameters
    ----------
    split : {"train", "test"}, default="train"
        ``"train"``: the 50,000 images of ``data_batch_1`` .. ``data_batch_5``
        in that order; ``"test"``: the 10,000 of ``test_batch``.
    directory : path-like, optional
        Folder holding ``cifar-10-python.tar.gz`` or an extracted
        ``cifar-10-batches-py/``. Default: ``<data home>/cifar10/``.
    verify : bool, default=True
        Check the tarball's sha256 (or the extracted files' md5s) against the
        manifest ``data/manifests/cifar10.json``; a file verified once is not
        hashed again in the same process unless it changed.
    download : bool, default=True
        Fetch the missing tarball (163 MB) from the official site, verified.
    progress : bool, default=False
        Progress bar while downloading.

    Returns
    -------
    LabelledImages
        ``images`` (n, 32, 32, 3) uint8, ``labels`` (n,) int64,
        ``classes`` (from the archive's ``batches.meta``).

    Raises
    ------
    ValueError
        Bad ``split``; a checksum mismatch (the file is left in place); a
        malformed archive or batch.
    FileNotFoundError
        Nothing in ``directory`` and ``download`` is False (the message names
        the data home).

    Examples
    --------
    >>> train = load_cifar10("train")  # doctest: +SKIP
    >>> train.images.shape, train.classes[:2]  # doctest: +SKIP
    ((50000, 32, 32, 3), ('airplane', 'automobile'))
    """
    check_choice(split, "split", {"train", "test"})
    verify, download, progress = _flags_iv(verify, download, progress)
    files = ([f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"])
    raw = _batch_files("cifar10", "python", [*files, "batches.meta"], directory,
                       download=download, progress=progress, verify=verify)
    meta = _unpickle(raw["batches.meta"], "cifar10 batches.meta")
    classes = _class_names(meta, "label_names", "cifar10 batches.meta")
    return _labelled(raw, files, "labels", classes, "cifar10")


def load_cifar100(split="train", *, label="fine", directory=None, verify=True, download=True,
                  progress=False):
    """CIFAR-100, one split, from the verified python-version tarball.

    Parameters
    ----------
    split : {"train", "test"}, default="train"
        50,000 or 10,000 images.
    label : {"fine", "coarse"}, default="fine"
        The 100 classes, or the 20 superclasses.
    directory : path-like, optional
        Folder holding ``cifar-100-python.tar.gz`` or an extracted
        ``cifar-100-python/``. Default: ``<data home>/cifar100/``.
    verify : bool, default=True
        Check the tarball's sha256 (or the extracted files' md5s) against
        ``data/manifests/cifar100.json``.
    download : bool, default=True
        Fetch the missing tarball (161 MB) from the official site, verified.
    progress : bool, default=False

    Returns
    -------
    LabelledImages
        ``images`` (n, 32, 32, 3) uint8, ``labels`` (n,) int64 and the
        ``classes`` of the chosen ``label`` (from the archive's ``meta``).

    Raises
    ------
    ValueError
        Bad ``split`` or ``label``; a checksum mismatch; a malformed file.
    FileNotFoundError
        Nothing in ``directory`` and ``download`` is False.

    Examples
    --------
    >>> aux = load_cifar100("train")  # doctest: +SKIP
    >>> aux.images.shape, len(aux.classes)  # doctest: +SKIP
    ((50000, 32, 32, 3), 100)
    """
    check_choice(split, "split", {"train", "test"})
    check_choice(label, "label", {"fine", "coarse"})
    verify, download, progress = _flags_iv(verify, download, progress)
    raw = _batch_files("cifar100", "python", [split, "meta"], directory, download=download,
                       progress=progress, verify=verify)
    meta = _unpickle(raw["meta"], "cifar100 meta")
    classes = _class_names(meta, f"{label}_label_names", "cifar100 meta")
    return _labelled(raw, [split], f"{label}_labels", classes, "cifar100")


# -- NumPy files (CIFAR-10.1, CIFAR-10-C) -------------------------------------------------------


def _npy_header(fh, label):
    """Shape, dtype and data offset of a .npy stream (C order, no objects)."""
    try:
        version = np.lib.format.read_magic(fh)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(fh)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{label} is not a NumPy .npy file ({exc})") from None
    if fortran or dtype.hasobject:
        kind = "a Fortran-ordered" if fortran else "an object"
        raise ValueError(f"{label} holds {kind} array; expected plain C-ordered numbers")
    return shape, dtype, fh.tell()


def _read_npy_rows(fh, label, rows=None):
    """Rows ``rows`` (a slice; None: all) of the .npy array in ``fh``, reading only them."""
    shape, dtype, offset = _npy_header(fh, label)
    if len(shape) == 0:
        raise ValueError(f"{label} holds a scalar; expected an array")
    n = shape[0]
    start, stop, _ = (slice(None) if rows is None else rows).indices(n)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    fh.seek(offset + start * row_bytes)
    count = max(stop - start, 0)
    raw = fh.read(count * row_bytes)
    if len(raw) != count * row_bytes:
        raise ValueError(f"{label} is truncated: its header promises {shape} {dtype}")
    out = np.frombuffer(raw, dtype=dtype).reshape(count, *shape[1:])
    return out.astype(dtype.newbyteorder("="), copy=True), n


def _check_images(x, label):
    if x.dtype != np.uint8 or x.shape[1:] != (_SIDE, _SIDE, 3):
        raise ValueError(f"{label} holds a {x.dtype} array of shape {x.shape}; expected uint8 "
                         f"images (n, {_SIDE}, {_SIDE}, 3)")
    return x


def _check_labels(y, label, n):
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise ValueError(f"{label} holds a {y.dtype} array of shape {y.shape}; expected "
                         "integer labels (n,)")
    if y.shape[0] != n:
        raise ValueError(f"{label}: {y.shape[0]} labels for {n} images")
    if y.size and (y.min() < 0 or y.max() >= len(CIFAR10_CLASSES)):
        raise ValueError(f"{label}: labels must lie in 0..9, found {int(y.min())}.."
                         f"{int(y.max())}")
    return y.astype(np.int64)


def load_cifar10_1(version="v6", *, directory=None, verify=True, download=True, progress=False):
    """CIFAR-10.1 (Recht et al. 2018), a fresh test set for CIFAR-10 models.

    Parameters
    ----------
    version : {"v6", "v4"}, default="v6"
        v6: 2,000 images (the recommended version, read by PerAda's code);
        v4: 2,021.
    directory : path-like, optional
        Folder holding ``cifar10.1_<version>_data.npy`` and ``_labels.npy``.
        Default: ``<data home>/cifar10.1/``.
    verify : bool, default=True
        Check their sha256 against ``data/manifests/cifar10_1.json``.
    download : bool, default=True
        Fetch missing files (6 MB) from the official repository, verified.
    progress : bool, default=False

    Returns
    -------
    LabelledImages
        ``images`` (n, 32, 32, 3) uint8, ``labels`` (n,) int64,
        ``classes`` = :data:`CIFAR10_CLASSES`.

    Raises
    ------
    ValueError
        Bad ``version``; a checksum mismatch; malformed files.
    FileNotFoundError
        A file is missing and ``download`` is False.

    Examples
    --------
    >>> ood = load_cifar10_1()  # doctest: +SKIP
    >>> ood.images.shape  # doctest: +SKIP
    (2000, 32, 32, 3)
    """
    check_choice(version, "version", {"v4", "v6"})
    verify, download, progress = _flags_iv(verify, download, progress)
    arrays = {}
    for kind in ("data", "labels"):
        path = _verified_file("cifar10_1", f"{version}-{kind}", directory, download=download,
                              progress=progress, verify=verify)
        with open(path, "rb") as fh:
            arrays[kind] = _read_npy_rows(fh, str(path))[0]
    images = _check_images(arrays["data"], f"cifar10.1 {version} data")
    labels = _check_labels(arrays["labels"], f"cifar10.1 {version} labels", images.shape[0])
    return LabelledImages(images, labels, CIFAR10_CLASSES)


def _severity_rows(n, severity, label):
    if n % 5:
        raise ValueError(f"{label} has {n} rows, not a multiple of the 5 severities")
    if severity is None:
        return slice(None)
    block = n // 5
    return slice((severity - 1) * block, severity * block)


def _read_cifar10_c(open_member, corruption, severity):
    """Images and labels of one corruption via ``open_member(base) -> binary file``."""
    with open_member(f"{corruption}.npy") as fh:
        shape, _, _ = _npy_header(fh, f"CIFAR-10-C {corruption}.npy")
        rows = _severity_rows(shape[0] if shape else 0, severity, f"CIFAR-10-C {corruption}.npy")
        fh.seek(0)
        images, n_images = _read_npy_rows(fh, f"CIFAR-10-C {corruption}.npy", rows)
    with open_member("labels.npy") as fh:
        labels, n_labels = _read_npy_rows(fh, "CIFAR-10-C labels.npy", rows)
    if n_labels != n_images:
        raise ValueError(f"CIFAR-10-C: {corruption}.npy has {n_images} images but labels.npy "
                         f"{n_labels} labels")
    images = _check_images(images, f"CIFAR-10-C {corruption}.npy")
    return images, _check_labels(labels, "CIFAR-10-C labels.npy", images.shape[0])


def load_cifar10_c(corruption, severity=None, *, directory=None, verify=True, download=False,
                   progress=False):
    """CIFAR-10-C (Hendrycks and Dietterich, 2019): the CIFAR-10 test set, corrupted.

    Each corruption's file holds the 10,000 test images at severity 1, then
    2, ..., then 5 (50,000 rows); ``labels.npy`` holds their labels.

    Parameters
    ----------
    corruption : str
        One of :data:`CIFAR10_C_CORRUPTIONS`.
    severity : int, optional
        1..5: only that severity's block of rows (a fifth of the file; only
        those rows are read). None: all five, as PerAda evaluates them.
    directory : path-like, optional
        Folder holding ``CIFAR-10-C.tar`` or an extracted ``CIFAR-10-C/``.
        Default: ``<data home>/cifar10-c/``.
    verify : bool, default=True
        Check the archive's sha256 against ``data/manifests/cifar10_c.json``
        (hashing 2.9 GB takes seconds; it is done once per process). The
        files of an extracted folder cannot be verified (no checksums are
        published): they are checked for shape and type only.
    download : bool, default=False
        Fetch the missing archive (2.9 GB) from Zenodo, verified. Off by
        default because of its size.
    progress : bool, default=False

    Returns
    -------
    LabelledImages
        ``images`` (n, 32, 32, 3) uint8, ``labels`` (n,) int64,
        ``classes`` = :data:`CIFAR10_CLASSES`.

    Raises
    ------
    ValueError
        An unknown ``corruption`` (the message lists them), a bad
        ``severity``, a checksum mismatch, malformed files.
    FileNotFoundError
        Neither the archive nor the folder is there and ``download`` is False
        (the message names the data home).

    Examples
    --------
    >>> fog = load_cifar10_c("fog", severity=5)  # doctest: +SKIP
    >>> fog.images.shape  # doctest: +SKIP
    (10000, 32, 32, 3)
    """
    check_choice(corruption, "corruption", CIFAR10_C_CORRUPTIONS)
    if severity is not None:
        severity = check_int_scalar(severity, "severity", minimum=1, maximum=5)
    verify, download, progress = _flags_iv(verify, download, progress)
    info, folder = _directory("cifar10_c", directory)
    extracted = info["extracted"]["folder"]
    archive = next(iter(info["members"]["tar"]["files"]))
    loose = folder / extracted
    if not (folder / archive).is_file() and loose.is_dir():
        def open_loose(base):
            path = loose / base
            if not path.is_file():
                raise _missing(f"CIFAR-10-C {base}", folder, archive, extracted)
            return open(path, "rb")

        images, labels = _read_cifar10_c(open_loose, corruption, severity)
        return LabelledImages(images, labels, CIFAR10_CLASSES)
    if not download and not (folder / archive).is_file():
        raise _missing("CIFAR-10-C", folder, archive, extracted)
    path = _verified_file("cifar10_c", "tar", directory, download=download, progress=progress,
                          verify=verify)
    try:
        with tarfile.open(path, "r:") as tar:
            def open_member(base):
                try:
                    return tar.extractfile(tar.getmember(f"{extracted}/{base}"))
                except KeyError:
                    raise ValueError(f"{path} lacks {extracted}/{base}: not the official "
                                     "archive") from None

            images, labels = _read_cifar10_c(open_member, corruption, severity)
    except tarfile.TarError as exc:
        raise ValueError(f"{path} is not a readable tar archive ({exc})") from None
    return LabelledImages(images, labels, CIFAR10_CLASSES)
