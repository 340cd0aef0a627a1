"""UCI HAPT smartphone recordings of 30 subjects: raw signals and HAR-style window features.

Thirty volunteers wore a smartphone on the waist; accelerometer and gyroscope
were sampled at 50 Hz while they walked, climbed stairs, sat, stood and lay. Each
subject is a natural federated client.

:func:`hapt_windows` derives features the way the original UCI HAR release did
(Anguita et al. 2013), restricted to the time domain:

1. per experiment, a median filter (3 samples) and a 3rd-order Butterworth
   low-pass at 20 Hz on both sensors;
2. the acceleration split into gravity (Butterworth low-pass at 0.3 Hz) and body
   (the rest);
3. windows of 2.56 s (128 samples) with 50 % overlap, kept when every sample has
   the same basic activity (labels 1-6);
4. per window and for each of body acceleration, gravity and angular velocity
   (x, y, z): mean, standard deviation, median absolute deviation, max, min,
   energy (mean of squares) and interquartile range; plus the correlation of
   each pair of axes. That is 9 x 7 + 3 x 3 = 72 features, named after UCI HAR's
   (``tBodyAcc-mean()-X``, ...).

Filtering uses zero-phase ``scipy.signal.sosfiltfilt``; UCI HAR's exact filter
implementation is not published, so windows and features are close to, not
identical with, the 561-feature release.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pandas as pd

from ebfl.datasets._home import (
    CORRUPTED_FILE_ERRORS,
    data_home,
    dataset_path,
    existing_file,
    manifest,
    sha256,
)
from ebfl.datasets.hapt_uci import UCI_ZIP, fetch_uci_hapt, read_uci_hapt_zip

__all__ = ["ACTIVITIES", "feature_names", "hapt_windows", "load_hapt_raw", "split_first_run",
           "standardized_clients"]

FS = 50.0
#: Names of the six basic activities (labels 1-6), as in UCI HAR.
ACTIVITIES = {1: "WALKING", 2: "WALKING_UPSTAIRS", 3: "WALKING_DOWNSTAIRS", 4: "SITTING",
              5: "STANDING", 6: "LAYING"}
_SIGNALS = ("tBodyAcc", "tGravityAcc", "tBodyGyro")
_STATS = ("mean", "std", "mad", "max", "min", "energy", "iqr")
#: The arrays of :func:`load_hapt_raw`, one entry per sample; acc and gyro are (N, 3).
_RAW_KEYS = ("user", "experiment_seq", "experiment_in_user", "sample_index", "acc", "gyro",
             "label")


def load_hapt_raw(path=None, *, verify=True, download=False, progress=False):
    """The raw 50 Hz streams as a dict of arrays (see the dataset's README).

    Parameters
    ----------
    path : path-like, optional
        A local ``hapt_raw.npz``, or the official UCI zip (``*.zip``). Default:
        the data home's verified ``hapt_raw.npz``, else the UCI zip there.
    verify : bool
        Check an ``.npz`` path's sha256 against the manifest (UCI publishes no
        checksum for its zip).
    download : bool
        With neither file in the data home, download the official zip
        (unverified: :func:`ebfl.datasets.fetch_uci_hapt`).
    progress : bool
        Download progress bar.

    Returns
    -------
    dict
        ``user``, ``experiment_seq``, ``experiment_in_user``, ``sample_index``,
        ``acc`` (N, 3) in g, ``gyro`` (N, 3) in rad/s, ``label`` (-1 = unlabelled).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist, or the data home has neither file and
        ``download`` is False.
    IsADirectoryError
        ``path`` is a folder.
    ValueError
        A checksum mismatch (with ``verify``), or a file that is not an intact
        ``.npz`` of these arrays (or not the UCI zip).
    """
    if path is None:
        try:
            path = dataset_path("uci_hapt_raw", download=False)
        except FileNotFoundError as exc:
            info = manifest("uci_hapt_raw")
            zip_path = data_home() / info["directory"] / UCI_ZIP
            if not zip_path.is_file():
                if not download:
                    raise FileNotFoundError(
                        f"{exc}; or allow the (unverified) download of the official zip to "
                        f"{zip_path}: load_hapt_raw(download=True) / "
                        "`ebfl reproduce hapt --download`"
                    ) from None
                zip_path, _ = fetch_uci_hapt(progress=progress)
            return read_uci_hapt_zip(zip_path)
    else:
        path = existing_file(path)
        if path.suffix == ".zip":
            return read_uci_hapt_zip(path)
        if verify:
            expected = manifest("uci_hapt_raw")["files"]["hapt_raw.npz"]
            digest = sha256(path)
            if digest != expected:
                raise ValueError(f"{path} has sha256 {digest}, expected {expected}; pass "
                                 "verify=False to load it anyway")
    return _read_raw_npz(path)


def _read_raw_npz(path):
    """The arrays of ``hapt_raw.npz``; a file that is not one is a ValueError naming it."""
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array")
        with npz:
            raw = {key: npz[key] for key in npz.files}
    except (ValueError, zipfile.BadZipFile, *CORRUPTED_FILE_ERRORS) as exc:
        # np.load reads a file that is neither .npz nor .npy as a pickle, which
        # allow_pickle=False refuses with a ValueError
        raise ValueError(f"{path} is not an intact .npz file of the HAPT recordings "
                         f"({exc})") from None
    missing = [k for k in _RAW_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{path} lacks the array(s) {missing}: not the HAPT raw recordings")
    n = raw["user"].shape
    if any(raw[k].shape[:1] != n for k in _RAW_KEYS) or any(
            raw[k].shape[1:] != (3,) for k in ("acc", "gyro")):
        raise ValueError(f"{path}: the arrays must share their first dimension, with acc and "
                         "gyro of shape (N, 3)")
    return raw


def _filters():
    from scipy import signal

    noise = signal.butter(3, 20.0, fs=FS, output="sos")
    gravity = signal.butter(3, 0.3, fs=FS, output="sos")
    return noise, gravity


def _window_stats(w):
    """w: (k, 128, 3) windows of one signal -> (k, 7 * 3) statistics, stat-major."""
    q75, q25 = np.percentile(w, [75, 25], axis=1)
    med = np.median(w, axis=1)
    stats = [w.mean(axis=1), w.std(axis=1), np.median(np.abs(w - med[:, None, :]), axis=1),
             w.max(axis=1), w.min(axis=1), np.mean(w**2, axis=1), q75 - q25]
    return np.concatenate(stats, axis=1)


def _axis_correlations(w):
    c = w - w.mean(axis=1, keepdims=True)
    sd = np.sqrt(np.sum(c**2, axis=1))
    out = []
    for a, b in ((0, 1), (0, 2), (1, 2)):
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.sum(c[:, :, a] * c[:, :, b], axis=1) / (sd[:, a] * sd[:, b])
        out.append(np.nan_to_num(r))
    return np.stack(out, axis=1)


def feature_names():
    """The 72 feature names, in column order."""
    names = []
    for sig in _SIGNALS:
        names += [f"{sig}-{stat}()-{axis}" for stat in _STATS for axis in "XYZ"]
    for sig in _SIGNALS:
        names += [f"{sig}-correlation()-{pair}" for pair in ("X,Y", "X,Z", "Y,Z")]
    return names


def hapt_windows(raw=None, *, window=128, step=64):
    """HAR-style windows with 72 time-domain features, one row per window.

    Parameters
    ----------
    raw : dict, optional
        From :func:`load_hapt_raw` (default: load it from the data home).
    window, step : int
        Window length and hop in samples (default 2.56 s with 50 % overlap).

    Returns
    -------
    pandas.DataFrame
        Columns ``user``, ``experiment``, ``start`` (sample index), ``label``
        (1-6), ``activity`` and the features of :func:`feature_names`.
    """
    from scipy import signal

    raw = load_hapt_raw() if raw is None else raw
    noise, gravity = _filters()
    exp = raw["experiment_seq"]
    bounds = np.flatnonzero(np.diff(exp)) + 1
    parts = []
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, exp.size], strict=True):
        acc = signal.medfilt(raw["acc"][lo:hi], kernel_size=(3, 1))
        gyro = signal.medfilt(raw["gyro"][lo:hi], kernel_size=(3, 1))
        acc = signal.sosfiltfilt(noise, acc, axis=0)
        gyro = signal.sosfiltfilt(noise, gyro, axis=0)
        grav = signal.sosfiltfilt(gravity, acc, axis=0)
        label = raw["label"][lo:hi]
        starts = np.arange(0, hi - lo - window + 1, step)
        lab = np.lib.stride_tricks.sliding_window_view(label, window)[starts]
        pure = (lab == lab[:, :1]).all(axis=1) & (lab[:, 0] >= 1) & (lab[:, 0] <= 6)
        starts = starts[pure]
        if starts.size == 0:
            continue
        feats = []
        signals = (acc - grav, grav, gyro)
        views = [np.lib.stride_tricks.sliding_window_view(s, window, axis=0)[starts]
                 .transpose(0, 2, 1) for s in signals]
        feats += [_window_stats(v) for v in views]
        feats += [_axis_correlations(v) for v in views]
        frame = pd.DataFrame(np.concatenate(feats, axis=1), columns=feature_names())
        frame.insert(0, "label", lab[pure, 0].astype(int))
        frame.insert(0, "start", raw["sample_index"][lo + starts])
        frame.insert(0, "experiment", int(exp[lo]))
        frame.insert(0, "user", int(raw["user"][lo]))
        parts.append(frame)
    out = pd.concat(parts, ignore_index=True)
    out.insert(4, "activity", out["label"].map(ACTIVITIES))
    return out


def split_first_run(windows):
    """Per-subject train/test split: the first complete run of the protocol trains.

    A subject's training set is its experiments up to and including the first
    by which every activity the subject performs has been recorded; its later
    experiments are its test set. For 29 subjects that is experiment 1 against
    experiment 2, each a full run of the protocol; subject 10 did the whole
    protocol in its first experiment and split the second run over two. Test sets
    thus follow the subject's own label distribution, and no test window
    overlaps a training window (random splits of 50 %-overlapping windows leak).

    Parameters
    ----------
    windows : pandas.DataFrame
        From :func:`hapt_windows` (columns ``user``, ``experiment``, ``label``).

    Returns
    -------
    train, test : pandas.DataFrame
    """
    if not {"user", "experiment", "label"} <= set(windows.columns):
        raise ValueError("windows must have the columns 'user', 'experiment' and 'label'")
    cutoff = {}
    for user, g in windows.groupby("user"):
        all_labels, seen = set(g["label"]), set()
        experiments = np.sort(g["experiment"].unique())
        for e in experiments:
            seen |= set(g.loc[g["experiment"] == e, "label"])
            if seen == all_labels:
                break
        if e == experiments[-1]:
            raise ValueError(f"subject {user} has no experiment left for testing after its "
                             "first complete run")
        cutoff[user] = e
    is_train = (windows["experiment"] <= windows["user"].map(cutoff)).to_numpy()
    return windows[is_train], windows[~is_train]


def standardized_clients(windows, dtype=np.float64):
    """Per-subject features and labels, split by :func:`split_first_run`.

    Features are z-scored with the pooled training mean and sd (in a
    federation, two averaged moment vectors; constant features are left
    unscaled).

    Parameters
    ----------
    windows : pandas.DataFrame
        From :func:`hapt_windows`.
    dtype : numpy dtype
        Of the features.

    Returns
    -------
    users : ndarray
        Subject ids, one per client, sorted.
    train, test : tuple of (list of ndarray, list of ndarray)
        Per client, features (n_i, 72) and labels (n_i,) in 1-6.
    """
    train, test = split_first_run(windows)
    cols = feature_names()
    center = train[cols].mean()
    scale = train[cols].std().replace(0.0, 1.0)
    users = np.sort(train["user"].unique())

    def per_user(frame):
        groups = dict(tuple(frame.groupby("user")))
        xs = [((groups[u][cols] - center) / scale).to_numpy(dtype) for u in users]
        return xs, [groups[u]["label"].to_numpy(np.int64) for u in users]

    return users, per_user(train), per_user(test)
