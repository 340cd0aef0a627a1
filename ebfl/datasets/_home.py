"""The data home and checksum-verified fetching.

Data are never shipped with ebfl. Each dataset has a manifest in ``data/manifests``
(official source, licence, accepted files and their sha256, a pinned download URL).
A dataset is looked up in ``<data home>/<directory>/``; the data home is the
``EBFL_DATA`` environment variable if set, else a per-user cache directory
(``pooch.os_cache("ebfl")``, e.g. ``~/.cache/ebfl`` on Linux).

Downloads go through :func:`pooch.retrieve`, which streams to a temporary file in
the target directory, checks the sha256 and only then moves the file into place,
so an interrupted or corrupted transfer never leaves a file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ebfl._paths import REPO_DATA

__all__ = ["data_home", "dataset_path", "fetch", "manifest", "sha256"]


def data_home() -> Path:
    """``$EBFL_DATA`` if set, else the per-user cache directory for ebfl."""
    env = os.environ.get("EBFL_DATA")
    if env:
        return Path(env).expanduser()
    import pooch

    return Path(pooch.os_cache("ebfl"))


def manifest(name) -> dict:
    """The manifest ``data/manifests/<name>.json`` of a dataset."""
    path = REPO_DATA / "manifests" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no manifest {path}: dataset manifests ship with the source "
                                "tree (install ebfl from a clone with `pip install -e .`)")
    return json.loads(path.read_text())


def sha256(path) -> str:
    """Hex sha256 of a file."""
    import pooch

    return pooch.file_hash(str(path), alg="sha256")


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
    import pooch

    downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)
    return Path(pooch.retrieve(url, known_hash=f"sha256:{sha256_hex}", fname=fname,
                               path=str(directory), downloader=downloader))


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
    """
    info = manifest(name)
    directory = data_home() / info["directory"]
    for fname, expected in info["files"].items():
        path = directory / fname
        if path.is_file():
            actual = sha256(path)
            if actual != expected:
                raise ValueError(f"{path} has sha256 {actual}, expected {expected}: the file "
                                 "is corrupted or another version; remove it to re-download")
            return path
    dl = info.get("download")
    if dl is None:
        raise FileNotFoundError(f"{name} not found in {directory}: it has no automatic download; "
                                f"get it from {info['official_source']} and place one of "
                                f"{sorted(info['files'])} there (or set EBFL_DATA)")
    if not download:
        raise FileNotFoundError(f"{name} not found in {directory} (data home: set EBFL_DATA "
                                "or allow the download)")
    return fetch(dl["url"], info["files"][dl["file"]], directory, dl["file"],
                 progress=progress)
