"""US county presidential returns 2000-2020 (MIT Election Data and Science Lab).

The flagship real dataset of the paper's estimation experiment (E2): each
county is a client, each election a Bernoulli draw (1 = the Republican
candidate won the county), and its political tendency p_i is the parameter.

Quirks of the file handled here (see the dataset's README in the data home):

* ``county_fips`` is zero-padded in 2020 only: padded to 5 digits everywhere;
* missing values are the string ``NA``; rows without a FIPS code (statewide
  write-ins, UOCAVA, federal precincts, DC 2020) are dropped;
* 2020 splits votes by ``mode``: the TOTAL row is used when a county has one,
  else the modes are summed (some Utah counties have both);
* units with no Republican or Democratic votes are dropped (e.g. Alaska's 02099,
  Bedford city VA in 2016); Alaska is reported by state-house district and
  Kansas City MO as its own unit, and they are kept as reported.
"""

from __future__ import annotations

import tarfile
import zipfile
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ebfl.datasets._home import (
    CORRUPTED_FILE_ERRORS,
    dataset_path,
    existing_file,
    manifest,
    sha256,
)

__all__ = ["ELECTION_YEARS", "ElectionMatrix", "election_matrix", "load_county_returns"]

#: The presidential election years of the county returns, 2000 to 2020.
ELECTION_YEARS = (2000, 2004, 2008, 2012, 2016, 2020)
_COLUMNS = ("year", "state_po", "county_name", "county_fips", "party", "candidatevotes", "mode")


def load_county_returns(path=None, *, verify=True, download=True, progress=False):
    """Tidy county returns: one row per county and election.

    Parameters
    ----------
    path : path-like, optional
        A local copy of ``countypres_2000-2020.csv`` (plain, ``.gz`` or ``.xz``).
        Default: the verified copy in the data home (downloaded if missing; see
        :func:`ebfl.datasets.data_home`).
    verify : bool
        Check the sha256 of ``path`` against the manifest (a file that is not one
        of the known releases raises ``ValueError``). Files from the data home
        are always verified.
    download : bool
        Allow downloading into the data home.
    progress : bool
        Progress bar while downloading.

    Returns
    -------
    pandas.DataFrame
        Columns ``year``, ``fips`` (5-character string), ``state_po``,
        ``county_name``, ``rep_votes``, ``dem_votes``, ``total_votes`` (all
        candidates), ``rep_share`` (R / (R + D)), ``rep_win`` (bool), ``winner``.
        Sorted by year and FIPS.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist; or no copy in the data home and ``download``
        is False.
    IsADirectoryError
        ``path`` is a folder.
    ValueError
        A checksum that matches no known release (with ``verify``), or content
        that is not the returns CSV: truncated or corrupted compression, text
        that is not CSV, missing columns, non-numeric vote counts.
    """
    if path is None:
        path = dataset_path("county_elections", download=download, progress=progress)
    else:
        path = existing_file(path)
        if verify:
            known = manifest("county_elections")["files"]
            digest = sha256(path)
            if digest not in known.values():
                raise ValueError(f"{path} has sha256 {digest}, which is none of the known "
                                 f"releases {sorted(known)}; to load it anyway pass "
                                 "verify=False (ebfl reproduce election: --no-verify)")
    return tidy_county_returns(_read_returns_csv(path))


def _read_returns_csv(path):
    """The raw rows; content pandas cannot read is a ValueError naming the file."""
    try:
        return pd.read_csv(path, usecols=list(_COLUMNS), dtype={"county_fips": "string",
                                                                "state_po": "string"},
                           na_values=["NA"], keep_default_na=True)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty: expected the county returns CSV") from None
    except OSError as exc:
        if exc.filename is not None:  # no permission: the caller's problem, named already
            raise
        raise ValueError(f"{path} cannot be decompressed ({exc}): the file is truncated or "
                         "corrupted") from None
    except (*CORRUPTED_FILE_ERRORS, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise ValueError(f"{path} cannot be decompressed ({exc}): the file is truncated or "
                         "corrupted") from None
    except ValueError as exc:  # ParserError, UnicodeDecodeError, missing columns
        raise ValueError(f"{path} is not the county returns CSV ({exc}); it needs the "
                         f"columns {list(_COLUMNS)}") from None


def tidy_county_returns(raw):
    """Apply the quirk rules (module docstring) to the raw rows; see :func:`load_county_returns`."""
    missing = [c for c in _COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"raw returns lack column(s) {missing}")
    df = raw.loc[raw["county_fips"].notna()].copy()
    fips = df["county_fips"].astype(str).str.strip().str.replace(r"\.0$", "", regex=True)
    df["fips"] = fips.str.zfill(5)
    df["mode"] = df["mode"].fillna("TOTAL").str.upper()
    votes = pd.to_numeric(df["candidatevotes"], errors="coerce")
    bad = votes.isna() & df["candidatevotes"].notna()
    if bad.any():
        raise ValueError(f"column 'candidatevotes' must hold vote counts; found "
                         f"{df['candidatevotes'][bad].iloc[0]!r}")
    df["candidatevotes"] = votes.fillna(0)
    # 2020 vote modes: the TOTAL row when the county has one, else the sum of modes.
    is_total = df["mode"].eq("TOTAL")
    has_total = is_total.groupby([df["year"], df["fips"]]).transform("any")
    df = df.loc[is_total | ~has_total]
    votes = (df.groupby(["year", "fips", "party"])["candidatevotes"].sum()
             .unstack("party", fill_value=0))
    out = pd.DataFrame({
        "rep_votes": votes.get("REPUBLICAN", 0),
        "dem_votes": votes.get("DEMOCRAT", 0),
        "total_votes": votes.sum(axis=1),
    })
    names = df.groupby(["year", "fips"])[["state_po", "county_name"]].first()
    out = names.join(out).reset_index()
    out = out.loc[out["rep_votes"] + out["dem_votes"] > 0].copy()
    for col in ("rep_votes", "dem_votes", "total_votes"):
        out[col] = out[col].astype(np.int64)
    two_party = out["rep_votes"] + out["dem_votes"]
    out["rep_share"] = out["rep_votes"] / two_party
    out["rep_win"] = out["rep_votes"] > out["dem_votes"]
    out["winner"] = np.where(out["rep_win"], "REPUBLICAN",
                             np.where(out["rep_votes"] == out["dem_votes"], "TIE", "DEMOCRAT"))
    cols = ["year", "fips", "state_po", "county_name", "rep_votes", "dem_votes", "total_votes",
            "rep_share", "rep_win", "winner"]
    return out[cols].sort_values(["year", "fips"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class ElectionMatrix:
    """Counties present in every election, as county x election matrices.

    Attributes
    ----------
    fips : ndarray of str, shape (m,)
    names : ndarray of str, shape (m,)
        ``"county_name, state_po"``.
    years : tuple of int
    rep_win : ndarray of int8, shape (m, len(years))
        1 where the Republican candidate won the county.
    rep_share : ndarray of float, shape (m, len(years))
        Republican share of the two-party vote.
    rep_votes, two_party_votes : ndarray of int64, shape (m, len(years))
    """

    fips: np.ndarray
    names: np.ndarray
    years: tuple
    rep_win: np.ndarray
    rep_share: np.ndarray
    rep_votes: np.ndarray
    two_party_votes: np.ndarray

    @property
    def n_counties(self) -> int:
        return self.fips.size


def election_matrix(returns, years=ELECTION_YEARS):
    """Matrices of Republican wins and two-party shares for counties in all ``years``.

    Parameters
    ----------
    returns : pandas.DataFrame
        From :func:`load_county_returns`.
    years : sequence of int
        Elections (columns), in order.

    Returns
    -------
    ElectionMatrix
    """
    years = tuple(int(y) for y in years)
    absent = sorted(set(years) - set(returns["year"].unique()))
    if absent:
        raise ValueError(f"years {absent} are not in the returns")
    sub = returns.loc[returns["year"].isin(years)]
    counts = sub.groupby("fips")["year"].nunique()
    keep = counts.index[counts == len(years)]
    sub = sub.loc[sub["fips"].isin(keep)].set_index(["fips", "year"]).sort_index()

    def wide(col):
        return sub[col].unstack("year").loc[:, list(years)].to_numpy()

    last = sub.xs(years[-1], level="year")
    names = (last["county_name"].astype(str) + ", " + last["state_po"].astype(str)).to_numpy()
    rep = wide("rep_votes").astype(np.int64)
    return ElectionMatrix(np.asarray(keep.sort_values(), dtype=str), names, years,
                          wide("rep_win").astype(np.int8), wide("rep_share").astype(float),
                          rep, rep + wide("dem_votes").astype(np.int64))
