"""The official UCI HAR zip: 561 window features of 30 subjects, read into one table.

UCI distributes "Human Activity Recognition Using Smartphones" (dataset 240,
https://archive.ics.uci.edu/dataset/240) as a download that holds
``UCI HAR Dataset.zip``, whose folder ``UCI HAR Dataset/`` has

* ``train/X_train.txt``, ``test/X_test.txt``: one window per row, 561
  space-separated features (already scaled to [-1, 1] by the authors);
* ``train/y_train.txt``, ``test/y_test.txt``: the activity of each window (1-6);
* ``train/subject_train.txt``, ``test/subject_test.txt``: its subject (1-30);
* ``features.txt`` (``<index> <name>`` per line) and ``activity_labels.txt``
  (``<label> <activity>`` per line).

:func:`read_uci_har_zip` reads either that inner zip or UCI's download around
it. UCI publishes no checksum, so nothing is verified and ebfl does not
download it: :func:`load_uci_har` reads it from ``<data home>/uci-har/``.

``features.txt`` repeats some names (the ``bandsEnergy()`` features of the X,
Y and Z axes share theirs); the table's columns are made unique the way
pandas does it: the k-th repeat (k >= 1) of ``name`` becomes ``name.k``.
"""

from __future__ import annotations

import io
import re
import warnings
import zipfile

import numpy as np
import pandas as pd

from ebfl.datasets._home import CORRUPTED_FILE_ERRORS, data_home, existing_file, manifest

__all__ = ["UCI_HAR_FILES", "load_uci_har", "read_uci_har_zip"]

#: Files looked for in ``<data home>/uci-har/``, in this order: the zip of the
#: ``UCI HAR Dataset/`` folder, and UCI's download that holds it.
UCI_HAR_FILES = ("UCI HAR Dataset.zip", "human+activity+recognition+using+smartphones.zip")
_SPLITS = ("train", "test")
_KINDS = ("X", "y", "subject")
_INNER_ZIP = re.compile(r"(?:^|/)UCI HAR Dataset\.zip$")


def _is_junk(name):
    """macOS resource forks (``__MACOSX/``, ``._*``) that UCI's zip carries beside the data."""
    return name.startswith("__MACOSX/") or name.rsplit("/", 1)[-1].startswith("._")


def _find_members(names, where):
    """Map each needed file (``"features"``, ``("X", "train")``, ...) to its member name."""
    patterns = {"features": re.compile(r"(?:^|/)features\.txt$"),
                "activity_labels": re.compile(r"(?:^|/)activity_labels\.txt$")}
    for split in _SPLITS:
        for kind in _KINDS:
            patterns[(kind, split)] = re.compile(rf"(?:^|/){split}/{kind}_{split}\.txt$")
    found = {}
    for key, pattern in patterns.items():
        hits = [n for n in names if pattern.search(n) and not _is_junk(n)]
        if len(hits) > 1:
            raise ValueError(f"{where} holds several candidates for one file: {hits}")
        if hits:
            found[key] = hits[0]
    return found


def _expected_name(key):
    return (f"UCI HAR Dataset/{key}.txt" if isinstance(key, str)
            else f"UCI HAR Dataset/{key[1]}/{key[0]}_{key[1]}.txt")


def _read_bytes(zf, member, where):
    try:
        return zf.read(member)
    except (zipfile.BadZipFile, *CORRUPTED_FILE_ERRORS) as exc:  # bad CRC, broken deflate
        raise ValueError(f"{member} in {where} is corrupted ({exc})") from None


def _numeric_table(zf, member, where, columns=None):
    """A table of numbers (float64, 2-D); anything else is a ValueError naming the member."""
    data = _read_bytes(zf, member, where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Empty input file": refused below
            table = np.loadtxt(io.StringIO(data.decode("ascii")), dtype=np.float64, ndmin=2)
    except ValueError as exc:  # text that is not numbers, ragged rows, non-ASCII bytes
        raise ValueError(f"{member} in {where} cannot be read as a table of numbers "
                         f"({exc})") from None
    if table.size == 0:
        raise ValueError(f"{member} in {where} is empty")
    if columns is not None and table.shape[1] != columns:
        raise ValueError(f"{member} in {where} must have {columns} column(s), got "
                         f"{table.shape[1]}")
    if not np.all(np.isfinite(table)):
        raise ValueError(f"{member} in {where} holds NaN or infinite values")
    return table


def _integer_column(zf, member, where, low, high):
    """A one-column table of integers in [low, high]."""
    col = _numeric_table(zf, member, where, columns=1)[:, 0]
    bad = (col != np.round(col)) | (col < low) | (col > high)
    if bad.any():
        raise ValueError(f"{member} in {where} must hold integers in [{low}, {high}], got "
                         f"{float(col[bad][0])!r} on line {int(np.flatnonzero(bad)[0]) + 1}")
    return col.astype(np.int64)


def _text_rows(zf, member, where):
    """The non-blank lines of a text member, each split into (first word, rest)."""
    data = _read_bytes(zf, member, where)
    try:
        rows = [line.split(None, 1) for line in data.decode("ascii").splitlines()
                if line.strip()]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{member} in {where} is not ASCII text ({exc})") from None
    if not rows:
        raise ValueError(f"{member} in {where} is empty")
    return rows


def _feature_names(zf, member, where):
    """``features.txt``: lines ``<i> <name>`` with i = 1, 2, ... in order -> the names."""
    rows = _text_rows(zf, member, where)
    for i, row in enumerate(rows, start=1):
        if len(row) != 2 or row[0] != str(i):
            raise ValueError(f"{member} in {where}: line {i} must read '{i} <name>', got "
                             f"{' '.join(row)!r}")
    return [name.strip() for _, name in rows]


def _activity_names(zf, member, where):
    """``activity_labels.txt``: lines ``<label> <name>`` -> {label: name}."""
    out = {}
    for row in _text_rows(zf, member, where):
        if len(row) != 2 or not row[0].isdigit() or int(row[0]) < 1:
            raise ValueError(f"{member} in {where}: each line must read '<label >= 1> <name>', "
                             f"got {' '.join(row)!r}")
        if int(row[0]) in out:
            raise ValueError(f"{member} in {where} names label {row[0]} twice")
        out[int(row[0])] = row[1].strip()
    return out


def _unique(names):
    """The k-th repeat of a name becomes ``name.k`` (pandas' convention), skipping taken names."""
    taken, out = set(names), []
    seen = {}
    for name in names:
        if name not in seen:
            seen[name] = 0
            out.append(name)
            continue
        k = seen[name] + 1
        while f"{name}.{k}" in taken:
            k += 1
        seen[name] = k
        taken.add(f"{name}.{k}")
        out.append(f"{name}.{k}")
    return out


def _open_zip(source, label):
    try:
        return zipfile.ZipFile(source)
    except (zipfile.BadZipFile, *CORRUPTED_FILE_ERRORS) as exc:
        raise ValueError(f"{label} is not a zip file, or a truncated one ({exc})") from None


def read_uci_har_zip(path):
    """Read the official UCI HAR zip into one table, training rows first.

    Parameters
    ----------
    path : path-like
        ``UCI HAR Dataset.zip``, or UCI's download that holds it (any folder
        prefix before ``train/``, ``test/``, ``features.txt``; macOS
        ``__MACOSX/`` entries are ignored).

    Returns
    -------
    pandas.DataFrame
        Columns ``user`` (1-30), ``split`` (``"train"`` or ``"test"``, the
        authors' split by subject), ``label`` (1-6), ``activity`` (from
        ``activity_labels.txt``) and the 561 features, named from
        ``features.txt`` (repeated names made unique: ``name``, ``name.1``,
        ``name.2``). Rows: ``X_train.txt`` then ``X_test.txt``, in file order.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    IsADirectoryError
        ``path`` is a folder.
    ValueError
        Not a zip, or a truncated one; a missing file; a corrupted member,
        text that is not numbers, rows of unequal length; files of one split
        with different numbers of rows; a label not in ``activity_labels.txt``.
        The message names the member.

    Examples
    --------
    >>> import zipfile, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "UCI HAR Dataset.zip"
    >>> files = {"features.txt": "1 a\\n2 b\\n", "activity_labels.txt": "1 WALKING\\n4 SITTING\\n",
    ...          "train/X_train.txt": " 0.5 -0.25\\n 1.0 0.0\\n", "train/y_train.txt": "4\\n1\\n",
    ...          "train/subject_train.txt": "1\\n1\\n", "test/X_test.txt": "0.0 0.125\\n",
    ...          "test/y_test.txt": "1\\n", "test/subject_test.txt": "2\\n"}
    >>> with zipfile.ZipFile(path, "w") as zf:
    ...     for name, text in files.items():
    ...         zf.writestr(f"UCI HAR Dataset/{name}", text)
    >>> frame = read_uci_har_zip(path)
    >>> frame[["user", "split", "activity", "b"]].to_numpy().tolist()
    [[1, 'train', 'SITTING', -0.25], [1, 'train', 'WALKING', 0.0], [2, 'test', 'WALKING', 0.125]]
    """
    path = existing_file(path)
    with _open_zip(path, path) as zf:
        names = zf.namelist()
        members = _find_members(names, path)
        inner = [n for n in names if _INNER_ZIP.search(n) and not _is_junk(n)]
        if not members and len(inner) == 1:  # UCI's download: the data are in the inner zip
            where = f"{path}:{inner[0]}"
            with _open_zip(io.BytesIO(_read_bytes(zf, inner[0], path)), where) as inner_zf:
                return _read_har(inner_zf, _find_members(inner_zf.namelist(), where), where)
        return _read_har(zf, members, path)


def _read_har(zf, members, where):
    missing = [_expected_name(k) for k in ("features", "activity_labels",
                                           *((kind, s) for s in _SPLITS for kind in _KINDS))
               if k not in members]
    if missing:
        raise ValueError(f"{where} lacks {missing}: not the UCI HAR zip (UCI HAR Dataset.zip "
                         "or UCI's download that holds it)")
    features = _unique(_feature_names(zf, members["features"], where))
    activities = _activity_names(zf, members["activity_labels"], where)
    parts = []
    for split in _SPLITS:
        X = _numeric_table(zf, members[("X", split)], where, columns=len(features))
        y = _integer_column(zf, members[("y", split)], where, 1, max(activities))
        user = _integer_column(zf, members[("subject", split)], where, 1, np.iinfo(np.int32).max)
        if not X.shape[0] == y.size == user.size:
            raise ValueError(f"{where}: the {split} files must have one row per window, got "
                             f"{X.shape[0]} rows in {members[('X', split)]}, {y.size} in "
                             f"{members[('y', split)]} and {user.size} in "
                             f"{members[('subject', split)]}")
        unknown = sorted(set(y.tolist()) - set(activities))
        if unknown:
            raise ValueError(f"{members[('y', split)]} in {where} has label(s) {unknown} that "
                             f"{members['activity_labels']} does not name")
        frame = pd.DataFrame(X, columns=features)
        meta = pd.DataFrame({"user": user, "split": split, "label": y,
                             "activity": [activities[v] for v in y.tolist()]})
        parts.append(pd.concat([meta, frame], axis=1))
    return pd.concat(parts, ignore_index=True)


def load_uci_har(path=None):
    """The UCI HAR table of :func:`read_uci_har_zip`, from ``path`` or the data home.

    Parameters
    ----------
    path : path-like, optional
        The zip. Default: the first of :data:`UCI_HAR_FILES` found in
        ``<data home>/uci-har/``.

    Returns
    -------
    pandas.DataFrame
        See :func:`read_uci_har_zip`.

    Raises
    ------
    FileNotFoundError
        Neither file is in the data home (ebfl does not download it: UCI
        publishes no checksum), or ``path`` does not exist.
    ValueError
        See :func:`read_uci_har_zip`.

    Examples
    --------
    >>> try:
    ...     har = load_uci_har()
    ... except FileNotFoundError:  # not in the data home: the message says where to get it
    ...     har = None
    >>> har is None or har.shape[1] == 4 + 561
    True
    """
    if path is not None:
        return read_uci_har_zip(path)
    info = manifest("uci_har")
    directory = data_home() / info["directory"]
    for fname in UCI_HAR_FILES:
        if (directory / fname).is_file():
            return read_uci_har_zip(directory / fname)
    raise FileNotFoundError(
        f"UCI HAR not found in {directory}: ebfl does not download it (UCI publishes no "
        f"checksum). Get it from {info['official_source']} and place UCI's download "
        f"({UCI_HAR_FILES[1]!r}) or the 'UCI HAR Dataset.zip' inside it there "
        "(or set EBFL_DATA to a data home that has it)")
