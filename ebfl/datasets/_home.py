"""The data home and checksum-verified fetching.

Data are never shipped with ebfl. Each dataset has a manifest in ``data/manifests``
(official source, licence, accepted files and their sha256, a pinned download URL);
an installed ebfl carries the manifests as ``ebfl/_data/manifests``.
A dataset is looked up in ``<data home>/<directory>/``; the data home is the
``EBFL_DATA`` environment variable if set, else a per-user cache directory
(``pooch.os_cache("ebfl")``, e.g. ``~/.cache/ebfl`` on Linux).

Downloads go through :func:`pooch.retrieve`, which streams to a temporary file in
the target directory, checks the sha256 and only then moves the file into place,
so an interrupted or corrupted transfer never leaves a file behind.

A dataset made of several files (MNIST's four IDX files) lists them under
``members`` in its manifest, each with its own accepted files and pinned
download; :func:`dataset_file` finds one of them. A member may also give the
sha256 of its uncompressed content (``content_sha256``), so that a copy
re-compressed by someone else (other gzip header, same data) is accepted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import zlib
from pathlib import Path

from ebfl._paths import data_file, import_pooch, user_cache

__all__ = ["content_sha256", "data_home", "dataset_file", "dataset_path", "fetch", "manifest",
           "sha256"]

#: What reading a corrupted or truncated compressed file raises, beside ValueError:
#: the loaders turn these into a ValueError that names the file.
CORRUPTED_FILE_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)


def existing_file(path):
    """``path`` as a Path, after checking that it is a file (not missing, not a folder)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give the path of a file")
    if not path.is_file():
        raise FileNotFoundError(f"path {path} does not exist")
    return path


def data_home() -> Path:
    """``$EBFL_DATA`` if set, else the per-user cache directory for ebfl."""
    env = os.environ.get("EBFL_DATA")
    if env:
        return Path(env).expanduser()
    return user_cache()


def manifest(name) -> dict:
    """The manifest ``data/manifests/<name>.json`` of a dataset."""
    return json.loads(data_file("manifests", f"{name}.json").read_text())


def sha256(path) -> str:
    """Hex sha256 of a file, read in blocks (no need for pooch's downloader)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(url, sha256_hex, directory, fname, *, progress=False, timeout=60):
    """Download ``url`` to ``directory/fname`` unless a verified copy is there.

    Parameters
    ----------
    url : str
    sha256_hex : str
        Expected sha256; a mismatch raises ``ValueError`` and leaves nothing behind.
    directory : path-like
        Created if missing.
    fname : str
    progress : bool
        Show a download progress bar.
    timeout : float
        Seconds to wait for the server.

    Returns
    -------
    pathlib.Path
    """
    pooch = import_pooch()
    downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel("WARNING")  # pooch logs each download on stderr; the progress bar says it
    try:
        return Path(pooch.retrieve(url, known_hash=f"sha256:{sha256_hex}", fname=fname,
                                   path=str(directory), downloader=downloader))
    finally:
        logger.setLevel(level)


def dataset_path(name, *, download=True, progress=False):
    """Path of a verified copy of dataset ``name`` in the data home, fetching it if needed.

    Any of the manifest's accepted files (e.g. plain, ``.gz`` or ``.xz``) is used
    when present and its sha256 matches; otherwise the pinned download is fetched.

    Raises
    ------
    ValueError
        A file is present but its checksum does not match (it is left alone:
        the data home may be read-only or shared).
    FileNotFoundError
        Nothing present and ``download`` is False.
    ConnectionError
        Nothing present and the download failed (no network, server down,
        transfer cut); nothing is left behind.
    """
    info = manifest(name)
    if "members" in info:
        raise ValueError(f"dataset {name!r} has several files ({sorted(info['members'])}): "
                         "use dataset_file(name, member)")
    return _find_or_fetch(name, info, info, data_home() / info["directory"], download=download,
                          progress=progress, verify=True)


def _find_or_fetch(label, info, entry, directory, *, download, progress, verify):
    """The first of ``entry["files"]`` present in ``directory`` (checked), else its download.

    Shared by :func:`dataset_path` (``entry`` is the manifest) and
    :func:`dataset_file` (``entry`` is one member).
    """
    for fname, expected in entry["files"].items():
        path = directory / fname
        if path.is_file():
            if verify:
                _check_file(path, expected, entry.get("content_sha256"))
            return path
    dl = entry.get("download")
    if dl is None:
        raise FileNotFoundError(f"{label} not found in {directory}: it has no automatic "
                                f"download; get it from {info['official_source']} and place one "
                                f"of {sorted(entry['files'])} there (or set EBFL_DATA)")
    if not download:
        raise FileNotFoundError(f"{label} not found in {directory} (one of "
                                f"{sorted(entry['files'])}; data home: set EBFL_DATA or allow "
                                "the download)")
    import requests

    try:
        return fetch(dl["url"], entry["files"][dl["file"]], directory, dl["file"],
                     progress=progress)
    except requests.RequestException as exc:  # no network, a server down, a cut transfer
        raise ConnectionError(f"{label} is not in {directory} and its download from "
                              f"{dl['url']} failed ({exc}); place one of "
                              f"{sorted(entry['files'])} there (or set EBFL_DATA)") from exc


_OPENERS = {".gz": gzip.open, ".xz": lzma.open}


def content_sha256(path) -> str:
    """Hex sha256 of a file's content after decompression (by suffix: ``.gz`` or ``.xz``).

    Other files are hashed as they are.

    Raises
    ------
    ValueError
        The compressed stream is truncated or corrupted.
    """
    path = Path(path)
    opener = _OPENERS.get(path.suffix, open)
    digest = hashlib.sha256()
    try:
        with opener(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except CORRUPTED_FILE_ERRORS as exc:
        raise ValueError(f"{path} cannot be decompressed ({exc}): the file is truncated or "
                         "corrupted") from None
    return digest.hexdigest()


def _check_file(path, expected, content_expected):
    actual = sha256(path)
    if actual == expected:
        return
    if content_expected is not None:
        try:
            if content_sha256(path) == content_expected:
                return
        except ValueError:
            pass
    raise ValueError(f"{path} has sha256 {actual}, expected {expected}"
                     + (" (or uncompressed content with sha256 "
                        f"{content_expected})" if content_expected else "")
                     + ": the file is corrupted or another version; remove it to re-download")


def dataset_file(name, member, *, directory=None, download=True, progress=False, verify=True):
    """Path of a verified copy of one file (``member``) of a multi-file dataset.

    The manifest lists the dataset's files under ``members``: for each, the
    accepted file names with their sha256 (e.g. ``.gz`` and uncompressed), an
    optional ``content_sha256`` of the uncompressed bytes, and a pinned
    ``download``. The first accepted file present is checked and returned; it
    passes when its sha256 matches, or when its decompressed content's sha256
    equals ``content_sha256``. With none present, the pinned download is
    fetched (verified by its sha256; nothing is left behind on failure).

    Parameters
    ----------
    name : str
        Dataset (manifest) name, e.g. ``"mnist"``.
    member : str
        One of the manifest's ``members``, e.g. ``"train-images"``.
    directory : path-like, optional
        Where to look (and download to). Default: ``<data home>/<directory>``
        of the manifest.
    download : bool, default=True
        Allow downloading a missing file.
    progress : bool, default=False
        Progress bar while downloading.
    verify : bool, default=True
        Check the sha256 of a file found in ``directory`` (downloads are always
        verified).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        ``member`` is not in the manifest, or a file is present but neither its
        sha256 nor its content's matches (it is left alone).
    FileNotFoundError
        Nothing present and ``download`` is False (or no pinned download).
    ConnectionError
        Nothing present and the download failed; nothing is left behind.
    """
    info = manifest(name)
    members = info.get("members") or {}
    if member not in members:
        raise ValueError(f"member must be one of {sorted(members)} for dataset {name!r}, "
                         f"got {member!r}")
    entry = members[member]
    directory = (data_home() / info["directory"] if directory is None
                 else Path(directory).expanduser())
    return _find_or_fetch(f"{name} {member}", info, entry, directory, download=download,
                          progress=progress, verify=verify)
