"""IDX files (the MNIST format) and the MNIST / Fashion-MNIST loaders.

An IDX file is a 4-byte magic number ``00 00 <dtype code> <ndim>``, then
``ndim`` big-endian uint32 dimensions, then the data in C order, big-endian.
MNIST and Fashion-MNIST ship as four gzip-compressed IDX files each: images
(``idx3``, uint8, (n, 28, 28), magic 2051) and labels (``idx1``, uint8, (n,),
magic 2049) for the training (``train-``) and test (``t10k-``) sets.

The loaders find the files in the data home (``<data home>/mnist/``,
``<data home>/fashion-mnist/``), verify their sha256 against the manifests
``data/manifests/mnist.json`` and ``fashion_mnist.json`` (see
:func:`ebfl.datasets.dataset_file`) and download the missing ones from the
pinned mirror.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ebfl._validation import check_choice
from ebfl.datasets._home import dataset_file, existing_file

__all__ = ["FASHION_MNIST_CLASSES", "MNIST_CLASSES", "LabelledImages", "load_fashion_mnist",
           "load_mnist", "read_idx"]

#: IDX data type codes (third byte of the magic number) and their big-endian dtypes.
IDX_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
#: MNIST's classes, indexed by label: the digits "0" to "9".
MNIST_CLASSES = tuple(str(d) for d in range(10))
#: Fashion-MNIST's classes, indexed by label.
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")


def _read_exact(fh, n):
    data = fh.read(n)
    return data if data is not None else b""


def _read_idx_stream(fh, path):
    magic = _read_exact(fh, 4)
    if len(magic) < 4:
        raise ValueError(f"{path} is too short for an IDX header ({len(magic)} bytes)")
    if magic[0] or magic[1]:
        raise ValueError(f"{path} is not an IDX file: its magic number {magic.hex()} must "
                         "start with two zero bytes")
    code, ndim = magic[2], magic[3]
    if code not in IDX_DTYPES:
        raise ValueError(f"{path} has IDX data type code 0x{code:02x}; expected one of "
                         f"{', '.join(f'0x{c:02x}' for c in IDX_DTYPES)}")
    if ndim == 0:
        raise ValueError(f"{path} declares 0 dimensions; an IDX array needs at least one")
    raw_dims = _read_exact(fh, 4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise ValueError(f"{path} is truncated inside its header ({ndim} dimensions declared)")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    dtype = IDX_DTYPES[code]
    n_bytes = int(np.prod(dims, dtype=np.float64)) * dtype.itemsize
    try:
        out = np.empty(dims, dtype)
    except (MemoryError, ValueError):
        raise ValueError(f"{path}: header dimensions {dims} are implausible "
                         "(malformed file)") from None
    view = memoryview(out.reshape(-1).view(np.uint8))
    got = 0
    while got < n_bytes:
        k = fh.readinto(view[got:])
        if not k:
            break
        got += k
    if got < n_bytes:
        raise ValueError(f"{path} is truncated: its header promises {dims} {dtype.name} "
                         f"({n_bytes} data bytes) but it holds {got}")
    if _read_exact(fh, 1):
        raise ValueError(f"{path} has data past the {dims} {dtype.name} array its header "
                         "declares (malformed file)")
    return out.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path):
    """Read an IDX file, plain or gzip-compressed (detected from its first bytes).

    Parameters
    ----------
    path : path-like

    Returns
    -------
    ndarray
        Shape from the header, native byte order, dtype from the type code
        (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
        0x0E float64). A fresh, writable array.

    Raises
    ------
    ValueError
        Bad magic number or type code, a truncated header or data, data past
        the declared size, or a corrupted gzip stream.
    FileNotFoundError
        ``path`` does not exist.
    IsADirectoryError
        ``path`` is a folder.

    Examples
    --------
    >>> import tempfile, struct, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny-idx2-ubyte"
    >>> _ = path.write_bytes(bytes([0, 0, 8, 2]) + struct.pack(">2I", 2, 3) + bytes(range(6)))
    >>> read_idx(path)
    array([[0, 1, 2],
           [3, 4, 5]], dtype=uint8)
    """
    path = existing_file(path)
    with path.open("rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not compressed:
            return _read_idx_stream(raw, path)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                return _read_idx_stream(fh, path)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise ValueError(f"{path} is not a valid gzip stream ({exc}): truncated or "
                             "corrupted") from None


@dataclass(frozen=True)
class LabelledImages:
    """Images and their labels (one split of MNIST or Fashion-MNIST).

    Attributes
    ----------
    images : ndarray of uint8, shape (n, 28, 28)
        Pixel intensities 0..255 (0 = background).
    labels : ndarray of uint8, shape (n,)
        Class indices 0..9.
    classes : tuple of str
        Class names, indexed by label.
    """

    images: np.ndarray
    labels: np.ndarray
    classes: tuple

    @property
    def n_samples(self) -> int:
        return self.labels.shape[0]


def _load(name, classes, split, directory, verify, download, progress):
    check_choice(split, "split", {"train", "test"})
    arrays = {}
    for kind, magic_ndim in (("images", 3), ("labels", 1)):
        path = dataset_file(name, f"{split}-{kind}", directory=directory, download=download,
                            progress=progress, verify=verify)
        arr = read_idx(path)
        if arr.dtype != np.uint8 or arr.ndim != magic_ndim:
            raise ValueError(f"{path} holds a {arr.dtype} array of shape {arr.shape}; "
                             f"{kind} must be uint8 with {magic_ndim} dimension(s)")
        arrays[kind] = arr
    images, labels = arrays["images"], arrays["labels"]
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{name} {split}: {images.shape[0]} images but {labels.shape[0]} "
                         "labels")
    if labels.size and labels.max() >= len(classes):
        raise ValueError(f"{name} {split}: labels must lie in 0..{len(classes) - 1}, found "
                         f"{int(labels.max())}")
    return LabelledImages(images, labels, classes)


_LOAD_DOC = """{title}, one split, from verified IDX files.

    Parameters
    ----------
    split : {{"train", "test"}}, default="train"
        ``"train"``: 60,000 images; ``"test"``: the 10,000 ``t10k`` images.
    directory : path-like, optional
        Folder holding the IDX files (``.gz`` or uncompressed, official names).
        Default: ``<data home>/{folder}/``.
    verify : bool, default=True
        Check each file's sha256 (or its uncompressed content's) against the
        manifest ``data/manifests/{manifest}.json``.
    download : bool, default=True
        Fetch missing files from the pinned mirror ({mirror}), verified.
    progress : bool, default=False
        Progress bar while downloading.

    Returns
    -------
    LabelledImages
        ``images`` (n, 28, 28) uint8, ``labels`` (n,) uint8, ``classes``.

    Raises
    ------
    ValueError
        Bad ``split``; a file whose checksum does not match (left in place);
        a malformed IDX file.
    FileNotFoundError
        A file is missing and ``download`` is False.

    Examples
    --------
    >>> train = {func}("train")  # doctest: +SKIP
    >>> train.images.shape, train.labels.shape  # doctest: +SKIP
    ((60000, 28, 28), (60000,))
    """


def load_mnist(split="train", *, directory=None, verify=True, download=True, progress=False):
    return _load("mnist", MNIST_CLASSES, split, directory, verify, download, progress)


def load_fashion_mnist(split="train", *, directory=None, verify=True, download=True,
                       progress=False):
    return _load("fashion_mnist", FASHION_MNIST_CLASSES, split, directory, verify, download,
                 progress)


load_mnist.__doc__ = _LOAD_DOC.format(
    title="MNIST handwritten digits", folder="mnist", manifest="mnist", func="load_mnist",
    mirror="torchvision's ossci-datasets S3 bucket; yann.lecun.com is often down")
load_fashion_mnist.__doc__ = _LOAD_DOC.format(
    title="Fashion-MNIST (Zalando article images, classes in ``FASHION_MNIST_CLASSES``)",
    folder="fashion-mnist", manifest="fashion_mnist", func="load_fashion_mnist",
    mirror="the official fashion-mnist.s3-website.eu-central-1.amazonaws.com")
