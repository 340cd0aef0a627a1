"""The official UCI HAPT zip: download it and read its raw signals.

UCI distributes HAPT (dataset 341) as one zip whose ``RawData/`` folder holds,
per experiment XX of user YY, ``acc_expXX_userYY.txt`` and
``gyro_expXX_userYY.txt`` (one 50 Hz sample per row, three columns) and one
``labels.txt`` (rows: experiment, user, activity, start, end).
:func:`read_uci_hapt_zip` turns them into the arrays of
:func:`ebfl.datasets.load_hapt_raw`, so either source feeds :func:`ebfl.datasets.hapt_windows`.

UCI publishes no checksum for the zip, so :func:`fetch_uci_hapt` cannot verify
it: it reports the sha256 of what arrived, and downloads only when asked.
``labels.txt``'s start and end are read as inclusive 0-based sample indices,
the convention of the data home's ``hapt_raw.npz`` (its experiment 1 has
STANDING on samples 250..1232 and labels.txt's first row is ``1 1 5 250 1232``).
"""

from __future__ import annotations

import io
import re
import warnings
import zipfile

import numpy as np

from ebfl.datasets._home import (
    CORRUPTED_FILE_ERRORS,
    data_home,
    existing_file,
    import_pooch,
    manifest,
    sha256,
)

__all__ = ["UCI_ZIP", "fetch_uci_hapt", "read_uci_hapt_zip"]

#: File name of the official zip in ``<data home>/uci-hapt-raw/``.
UCI_ZIP = "hapt_uci.zip"
_SIGNAL = re.compile(r"(?:^|/)RawData/(acc|gyro)_exp(\d+)_user(\d+)\.txt$")


def _read_table(zf, member, dtype):
    """One text table of the zip; unreadable content is a ValueError naming the member."""
    try:
        with zf.open(member) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Empty input file": refused below
            table = np.loadtxt(io.TextIOWrapper(fh, "ascii"), dtype=dtype, ndmin=2)
    except (ValueError, zipfile.BadZipFile, *CORRUPTED_FILE_ERRORS) as exc:
        # ValueError covers text that is not numbers and non-ASCII bytes (UnicodeDecodeError)
        raise ValueError(f"{member} in {zf.filename} cannot be read as a table of numbers "
                         f"({exc})") from None
    if table.size == 0:
        raise ValueError(f"{member} in {zf.filename} is empty")
    return table


def read_uci_hapt_zip(path):
    """Read the official zip's ``RawData/`` into the arrays of :func:`load_hapt_raw`.

    Parameters
    ----------
    path : path-like
        The zip as UCI distributes it (any folder prefix before ``RawData/``).

    Returns
    -------
    dict
        ``user``, ``experiment_seq``, ``experiment_in_user``, ``sample_index``,
        ``acc``, ``gyro``, ``label``; rows in user, experiment and time order.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    IsADirectoryError
        ``path`` is a folder.
    ValueError
        Not a zip, or a truncated or corrupted one; missing ``labels.txt``, an
        experiment without both signals, signals of different lengths, text
        that is not numbers, or a label outside its experiment.
    """
    path = existing_file(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path} is not a zip file, or a truncated one ({exc})") from None
    with zf:
        signals, labels_member = {}, None
        for name in zf.namelist():
            if name.endswith("RawData/labels.txt"):
                labels_member = name
            elif match := _SIGNAL.search(name):
                kind, exp, user = match.group(1), int(match.group(2)), int(match.group(3))
                signals.setdefault((user, exp), {})[kind] = name
        if labels_member is None or not signals:
            raise ValueError(f"{path} has no RawData/labels.txt and acc/gyro files: not the "
                             "UCI HAPT zip")
        labels = _read_table(zf, labels_member, np.int64)
        if labels.shape[1] != 5:
            raise ValueError(f"{labels_member} in {path} must have 5 columns, got "
                             f"{labels.shape[1]}")
        parts = {k: [] for k in ("user", "experiment_seq", "experiment_in_user",
                                 "sample_index", "acc", "gyro", "label")}
        rank = {}
        for user, exp in sorted(signals):
            files = signals[(user, exp)]
            if set(files) != {"acc", "gyro"}:
                raise ValueError(f"experiment {exp} of user {user} lacks "
                                 f"{({'acc', 'gyro'} - set(files)).pop()} data")
            acc = _read_table(zf, files["acc"], np.float64)
            gyro = _read_table(zf, files["gyro"], np.float64)
            if acc.shape != gyro.shape or acc.shape[1] != 3:
                raise ValueError(f"experiment {exp}: acc {acc.shape} and gyro {gyro.shape} "
                                 "must both be (n, 3)")
            n = acc.shape[0]
            label = np.full(n, -1, np.int8)
            for _, _, act, lo, hi in labels[(labels[:, 0] == exp) & (labels[:, 1] == user)]:
                if not 0 <= lo <= hi < n:
                    raise ValueError(f"label {act} on samples {lo}..{hi} lies outside "
                                     f"experiment {exp} ({n} samples)")
                label[lo:hi + 1] = act
            rank[user] = rank.get(user, -1) + 1
            parts["user"].append(np.full(n, user, np.uint8))
            parts["experiment_seq"].append(np.full(n, exp, np.uint8))
            parts["experiment_in_user"].append(np.full(n, rank[user], np.uint8))
            parts["sample_index"].append(np.arange(n, dtype=np.int32))
            parts["acc"].append(acc)
            parts["gyro"].append(gyro)
            parts["label"].append(label)
    return {k: np.concatenate(v) for k, v in parts.items()}


def fetch_uci_hapt(*, url=None, progress=False, timeout=120):
    """Download the official HAPT zip into ``<data home>/uci-hapt-raw/`` (unverified).

    UCI publishes no checksum: the file is not verified, only kept whole (pooch
    writes to a temporary file and moves it into place when the transfer ends).
    A zip already present is kept.

    Parameters
    ----------
    url : str, optional
        Default: the manifest's ``official_download``.
    progress : bool
    timeout : float

    Returns
    -------
    path : pathlib.Path
    digest : str
        sha256 of the zip, to record or compare with others' copies.
    """
    pooch = import_pooch()
    info = manifest("uci_hapt_raw")
    directory = data_home() / info["directory"]
    path = directory / UCI_ZIP
    if not path.is_file():
        downloader = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)
        pooch.retrieve(url or info["official_download"], known_hash=None, fname=UCI_ZIP,
                       path=str(directory), downloader=downloader)
    return path, sha256(path)
