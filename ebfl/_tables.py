"""Reading a user's CSV for ``ebfl fit``: size-limited decompression and checked columns.

Every problem with the file or a column is a ValueError whose message names the
option and, for a bad value, the row as the user finds it in the file; the fits
that follow cannot point into the file.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

__all__ = ["DEFAULT_MAX_MIB", "CORRUPTED", "client_ids", "column", "numeric_column",
           "read_table", "where"]

#: The default limit on the decompressed size of a compressed CSV (MiB). A small
#: archive can expand without bound (a "decompression bomb"); no per-client table
#: a user fits comes near this, and ``--max-size`` raises it.
DEFAULT_MAX_MIB = 512

#: What a decompressor raises for a damaged file (gzip's is an OSError without a
#: file name; a missing or unreadable file has one and is left to the caller).
CORRUPTED = (EOFError, lzma.LZMAError, zipfile.BadZipFile, zlib.error, tarfile.TarError)

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_STREAM_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


class _Refused(ValueError):
    """A file refused as a whole (its message is complete: not wrapped again)."""


_CHUNK = 1 << 20


def _check_expansion(path, limit):
    """Decompress ``path`` once, discarding the output, and refuse it beyond ``limit`` bytes.

    Counting first, in constant memory, is what makes the limit protect: the CSV
    parser holds what it has parsed, so a limit checked while parsing would let a
    bomb fill several times ``limit`` of memory before it is refused.
    """
    total = 0
    with _decompressed(path) as stream:
        while chunk := stream.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                raise _Refused(f"{path} expands to more than {limit / 2**20:g} MiB when "
                               "decompressed; raise --max-size if the file is genuine")


def _member(archive_names, path):
    names = [n for n in archive_names if not n.endswith("/")]
    if len(names) != 1:
        raise _Refused(f"{path} must hold exactly one file to be read as CSV, it holds "
                       f"{len(names)}")
    return names[0]


@contextlib.contextmanager
def _decompressed(path):
    """A binary stream of the decompressed content of a compressed ``path``.

    The archive kinds are those pandas infers from the file name; each is opened
    here so that the amount decompressed can be limited.
    """
    name = str(path).lower()
    suffix = Path(name).suffix
    with contextlib.ExitStack() as stack:
        if name.endswith(_TAR_SUFFIXES):
            archive = stack.enter_context(tarfile.open(path))
            member = _member([m.name for m in archive.getmembers() if m.isfile()], path)
            yield stack.enter_context(archive.extractfile(member))
        elif suffix in _STREAM_OPENERS:
            yield stack.enter_context(_STREAM_OPENERS[suffix](path, "rb"))
        elif suffix == ".zip":
            archive = stack.enter_context(zipfile.ZipFile(path))
            yield stack.enter_context(archive.open(_member(archive.namelist(), path)))
        else:
            raise _Refused(f"{path}: Zstandard-compressed input is not supported; decompress "
                           "it, or compress it with gzip, bz2, xz or zip")


def read_table(path, *, max_mib=DEFAULT_MAX_MIB):
    """The CSV at ``path``; unparsable, undecodable, oversized or empty content is a
    ValueError naming it.

    Parameters
    ----------
    path : str
        A CSV file, optionally compressed (.gz, .bz2, .xz, .zip or a tar archive
        of one file).
    max_mib : float
        The most a compressed file may expand to (MiB); a larger one is refused
        before it is parsed (it is decompressed once, in constant memory, to count).
    """
    import pandas as pd

    try:
        if _is_compressed(path):
            _check_expansion(path, max_mib * 2**20)
        frame = _read(path, {})
        # pandas renames a repeated header "x" to "x.1": the user's --value x would then
        # silently be the first of the two columns. The raw header says which it was.
        header = _read(path, {"header": None, "nrows": 1, "dtype": str}).iloc[0]
    except _Refused:
        raise
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty: expected a CSV file with a header row") from None
    except OSError as exc:
        if exc.filename is not None:  # missing, a folder, no permission: the caller names it
            raise
        raise ValueError(f"cannot read {path}: {exc} (truncated or corrupted file)") from None
    except (ValueError, *CORRUPTED) as exc:  # ParserError, UnicodeDecodeError, bad archives
        raise ValueError(f"cannot read {path} as CSV: {exc}") from None
    if frame.empty:
        raise ValueError(f"{path} has a header but no data rows")
    names = header.dropna().tolist()
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{path} has repeated column names {repeated}: every column needs "
                         "its own name")
    return frame


def _is_compressed(path):
    name = str(path).lower()
    return name.endswith(_TAR_SUFFIXES) or Path(name).suffix in (*_STREAM_OPENERS, ".zip",
                                                                  ".zst")


def _read(path, options):
    import pandas as pd

    if not _is_compressed(path):
        return pd.read_csv(path, **options)
    with _decompressed(path) as stream:
        return pd.read_csv(stream, **options)


def column(frame, name, option):
    """Column ``name`` of ``frame``, or a ValueError naming ``option`` and the columns."""
    if name not in frame.columns:
        raise ValueError(f"{option}: column {name!r} is not in the file; its columns are "
                         f"{list(frame.columns)}")
    return frame[name]


def where(k):
    """Row ``k`` (0-based) of the data, as a user finds it in the file."""
    return f"data row {k + 1} (line {k + 2} of the file)"


def numeric_column(frame, name, option, *, count_from=None, positive=False):
    """Column ``name`` as float64, or as int64 counts >= ``count_from`` when given.

    The first missing, non-numeric or infinite value, and the first that breaks
    the rule (a count, or > 0 with ``positive``), is a ValueError naming the
    column and its row.
    """
    import pandas as pd

    raw = column(frame, name, option)
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    finite = np.isfinite(values)
    rules = []  # (rows that pass, what the value must be)
    with np.errstate(invalid="ignore"):  # NaN compares False; np.isfinite reports it first
        if count_from is not None:  # beyond 2**53 a float64 no longer holds every integer
            rules.append(((values == np.round(values)) & (np.abs(values) <= 2.0**53),
                          "an integer count"))
            rules.append((values >= count_from, f">= {count_from}"))
        elif positive:
            rules.append((values > 0, "> 0"))
    ok = np.logical_and.reduce([finite, *(passed for passed, _ in rules)])
    if ok.all():
        return values.astype(np.int64) if count_from is not None else values
    k = int(np.argmin(ok))
    cell = raw.iloc[k]
    shown = repr(cell) if isinstance(cell, str) else str(cell)
    if pd.isna(cell):
        problem = "a missing value"
    elif np.isnan(values[k]):
        problem = f"a non-numeric value {shown}"
    elif not finite[k]:
        problem = f"an infinite value {shown}"
    else:
        need = next(what for passed, what in rules if not passed[k])
        problem = f"the value {shown}, which must be {need},"
    raise ValueError(f"{option}: column {name!r} has {problem} at {where(k)}")


def client_ids(frame, name):
    """The client-id column; missing ids would be dropped by groupby, so refuse them."""
    ids = column(frame, name, "--client")
    if ids.isna().any():
        k = int(np.argmax(ids.isna().to_numpy()))
        raise ValueError(f"--client: column {name!r} has {int(ids.isna().sum())} missing client "
                         f"id(s), the first at {where(k)}")
    return ids
