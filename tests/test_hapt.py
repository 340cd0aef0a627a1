"""HAPT windows and features (fixture written here), the split, and the real-data experiment."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from ebfl.datasets import feature_names, hapt_windows, load_hapt_raw, split_first_run
from ebfl.generative.hapt import hapt_clients, hapt_logistic
from tests.conftest import requires_data

# Two users, two experiments each, 1000 samples per experiment. Labels: SITTING (4) on
# samples 100..499, a transition (7) on 500..549, WALKING (1) on 550..949, -1 elsewhere.
N_EXP, SEG = 1000, ((100, 500, 4), (500, 550, 7), (550, 950, 1))
ACC = {4: (0.1, 0.9, -0.3), 1: (0.2, -0.8, 0.4)}  # per experiment (0, 1): pure gravity
GYRO = {4: (0.01, 0.02, 0.03), 1: (-0.5, 0.1, 0.2)}


def _fixture(rng_wiggle=False):
    parts = {k: [] for k in ("user", "experiment_seq", "experiment_in_user", "sample_index",
                             "acc", "gyro", "label")}
    exp = 0
    for user in (1, 2):
        for e in range(2):
            exp += 1
            label = np.full(N_EXP, -1, np.int8)
            acc = np.zeros((N_EXP, 3))
            gyro = np.zeros((N_EXP, 3))
            for lo, hi, lab in SEG:
                label[lo:hi] = lab
            # Signals constant from 50 samples before to 50 after each activity, so the
            # filters' edge effects stay outside the labelled windows.
            # Acceleration constant over the whole experiment (the 0.3 Hz gravity filter
            # rings for seconds after a step); the gyroscope steps at 525, 25 samples
            # from the nearest window (the 20 Hz filter settles within a few).
            acc[:] = ACC[4] if e == 0 else ACC[1]
            gyro[50:525], gyro[525:1000] = GYRO[4], GYRO[1]
            parts["user"].append(np.full(N_EXP, user, np.uint8))
            parts["experiment_seq"].append(np.full(N_EXP, exp, np.uint8))
            parts["experiment_in_user"].append(np.full(N_EXP, e, np.uint8))
            parts["sample_index"].append(np.arange(N_EXP, dtype=np.int32))
            parts["acc"].append(acc)
            parts["gyro"].append(gyro)
            parts["label"].append(label)
    return {k: np.concatenate(v) for k, v in parts.items()}


def test_windows_are_pure_within_one_experiment_and_50pct_overlapping():
    w = hapt_windows(_fixture())
    # Starts are multiples of 64 with the whole window inside one activity's samples.
    starts = {4: [s for s in range(0, N_EXP - 127, 64) if 100 <= s and s + 128 <= 500],
              1: [s for s in range(0, N_EXP - 127, 64) if 550 <= s and s + 128 <= 950]}
    assert len(w) == 4 * (len(starts[4]) + len(starts[1]))
    for (_, _), g in w.groupby(["user", "experiment"]):
        assert g[g.label == 4].start.tolist() == starts[4]
        assert g[g.label == 1].start.tolist() == starts[1]
    assert set(w.activity) == {"SITTING", "WALKING"}
    assert list(w.columns[5:]) == feature_names() and len(feature_names()) == 72


def test_features_of_constant_signals_are_gravity_and_rotation():
    w = hapt_windows(_fixture())
    for lab, exp_in_user in ((4, 0), (1, 1)):
        g = w[w.experiment % 2 == (exp_in_user + 1) % 2]
        for k, axis in enumerate("XYZ"):
            # Constant acceleration is all gravity: body acceleration is 0.
            np.testing.assert_allclose(g[f"tGravityAcc-mean()-{axis}"], ACC[lab][k], atol=1e-6)
            np.testing.assert_allclose(g[f"tGravityAcc-energy()-{axis}"], ACC[lab][k] ** 2,
                                       atol=1e-6)
            np.testing.assert_allclose(g[f"tBodyAcc-mean()-{axis}"], 0.0, atol=1e-6)
        g = w[w.label == lab]
        for k, axis in enumerate("XYZ"):
            np.testing.assert_allclose(g[f"tBodyGyro-max()-{axis}"], GYRO[lab][k], atol=1e-6)
            for stat in ("std", "mad", "iqr"):
                np.testing.assert_allclose(g[f"tBodyGyro-{stat}()-{axis}"], 0.0, atol=1e-6)


def test_features_of_a_sinusoid():
    raw = _fixture()
    t = np.arange(raw["acc"].shape[0]) / 50.0
    raw["gyro"] = np.zeros_like(raw["gyro"])
    raw["gyro"][:, 0] = np.sin(2 * np.pi * 2.0 * t)  # 2 Hz: passes the 20 Hz low-pass
    w = hapt_windows(raw)
    inner = w[(w.start >= 200) & (w.start <= 700)]
    # Over 2.56 s (5.12 periods) the sd of a unit sine is close to 1/sqrt(2).
    np.testing.assert_allclose(inner["tBodyGyro-std()-X"], 1 / np.sqrt(2), atol=0.02)
    np.testing.assert_allclose(inner["tBodyGyro-max()-X"], 1.0, atol=0.02)
    np.testing.assert_allclose(inner["tBodyGyro-correlation()-X,Y"], 0.0)


def test_split_first_run():
    w = hapt_windows(_fixture())
    train, test = split_first_run(w)
    assert set(train.experiment) == {1, 3} and set(test.experiment) == {2, 4}
    assert len(train) + len(test) == len(w)
    with pytest.raises(ValueError, match="no experiment left"):
        split_first_run(w[w.experiment.isin([1, 2, 3])])
    # A protocol split over two experiments: the run completes in the second one.
    half = w[~((w.experiment == 1) & (w.label == 1)) & ~((w.experiment == 2) & (w.label == 4))]
    half = half.assign(experiment=half.experiment.replace({3: 5, 4: 6}))
    extra = w[w.experiment == 2].assign(experiment=3)
    train, test = split_first_run(pd.concat([half, extra]))
    assert set(train[train.user == 1].experiment) == {1, 2}
    assert set(test[test.user == 1].experiment) == {3}
    with pytest.raises(ValueError, match="columns"):
        split_first_run(w.drop(columns="user"))


def test_clients_are_standardized_on_training_data():
    w = hapt_windows(_fixture())
    train, test, users = hapt_clients(w, "SITTING")
    assert users.tolist() == [1, 2] and train.dim == 73
    X = train.X[train.mask > 0]
    np.testing.assert_array_equal(X[:, 0], 1.0)
    train_rows = w[w.experiment.isin([1, 3])][feature_names()]
    # Columns that vary in the raw features are z-scored (those constant up to
    # rounding in this fixture are not meaningful to check).
    varies = (train_rows.std() > 1e-6).to_numpy()
    np.testing.assert_allclose(X[:, 1:][:, varies].mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(X[:, 1:][:, varies].std(axis=0, ddof=1), 1.0, rtol=1e-9)
    np.testing.assert_array_equal(train.Y.sum(axis=1), 2 * [(w.label == 4).sum() / 4])
    with pytest.raises(ValueError, match="positive"):
        hapt_clients(w, "sitting")


def test_load_verifies_the_checksum(tmp_path):
    path = tmp_path / "hapt_raw.npz"
    np.savez(path, **_fixture())
    with pytest.raises(ValueError, match="sha256"):
        load_hapt_raw(path)
    raw = load_hapt_raw(path, verify=False)
    np.testing.assert_array_equal(raw["label"], _fixture()["label"])


def _npz_bytes(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("body, match", [
    (b"", "not an intact .npz"),
    (bytes(range(256)), "not an intact .npz"),
    (_npz_bytes(**_fixture())[:5000], "not an intact .npz"),  # truncated
    (_npz_bytes(acc=np.zeros((4, 3))), r"lacks the array\(s\) \['user'"),
    (_npz_bytes(**{**_fixture(), "gyro": np.zeros((3, 3))}), "share their first dimension"),
])
def test_load_names_a_file_that_is_not_the_recordings(tmp_path, body, match):
    path = tmp_path / "hapt_raw.npz"
    path.write_bytes(body)
    with pytest.raises(ValueError, match=match) as info:
        load_hapt_raw(path, verify=False)
    assert "hapt_raw.npz" in str(info.value)


def test_load_refuses_a_single_array_and_a_folder(tmp_path):
    np.save(tmp_path / "acc.npy", np.zeros((4, 3)))
    with pytest.raises(ValueError, match="single array"):
        load_hapt_raw(tmp_path / "acc.npy", verify=False)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        load_hapt_raw(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hapt_raw(tmp_path / "nope.npz")


def test_no_automatic_download_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="archive.ics.uci.edu"):
        load_hapt_raw()


# ------------------------------------------------------- the real file

real = requires_data("uci-hapt-raw")


@pytest.fixture(scope="module")
def real_windows():
    return hapt_windows()


@real
def test_real_windows_follow_the_har_protocol(real_windows):
    w = real_windows
    assert sorted(w.user.unique()) == list(range(1, 31))
    # UCI HAR v1 cut 10,299 windows from the same recordings with its own filters.
    assert abs(len(w) - 10_299) / 10_299 < 0.05
    # Every subject's train and test sets hold all six activities.
    for part in split_first_run(w):
        assert (part.groupby("user").label.nunique() == 6).all()
    assert np.isfinite(w[feature_names()].to_numpy()).all()


@real
def test_hapt_experiment_on_the_real_data(real_windows, tmp_path, capsys):
    from ebfl.cli import main

    res = hapt_logistic(quick=True, windows=real_windows)
    r = res["results"]
    assert res["settings"]["clients"] == 30
    base = np.array(r["majority class"]["per_client"])
    # Paired over the 30 clients, the learned models beat predicting each client's
    # majority class by more than 3 paired se (one-sided 0.13 %).
    for name in ("local (ridge, C=1)", "FedAvg", "EB, Laplace EM (corrected)"):
        diff = np.array(r[name]["per_client"]) - base
        assert diff.mean() > 3 * diff.std(ddof=1) / np.sqrt(diff.size), name
    # EB's mean accuracy is above local training alone (by 1.7 paired se on this split:
    # 30 clients do not make that significant; the README says so).
    assert r["EB, Laplace EM (corrected)"]["accuracy"] > r["local (ridge, C=1)"]["accuracy"]

    assert main(["reproduce", "hapt", "--quick", "--json", "--plot", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"]["FedAvg"]["accuracy"] == pytest.approx(r["FedAvg"]["accuracy"])
    assert (tmp_path / "hapt_logistic.png").exists()


# ------------------------------------------------------- the official UCI zip

def _write_uci_zip(path, raw, prefix="HAPT Data Set/", labels_text=None):
    """The layout of UCI's zip: RawData/acc_expXX_userYY.txt, gyro_..., labels.txt."""
    import zipfile

    rows = []
    with zipfile.ZipFile(path, "w") as zf:
        for exp in np.unique(raw["experiment_seq"]):
            sel = raw["experiment_seq"] == exp
            user = int(raw["user"][sel][0])
            for kind in ("acc", "gyro"):
                text = "\n".join(" ".join(f"{v:.17g}" for v in row) for row in raw[kind][sel])
                zf.writestr(f"{prefix}RawData/{kind}_exp{exp:02d}_user{user:02d}.txt", text)
            lab = raw["label"][sel]
            edges = np.flatnonzero(np.diff(lab)) + 1
            for lo, hi in zip(np.r_[0, edges], np.r_[edges, lab.size], strict=True):
                if lab[lo] > 0:
                    rows.append(f"{exp} {user} {lab[lo]} {lo} {hi - 1}")
        zf.writestr(f"{prefix}RawData/labels.txt",
                    "\n".join(rows) if labels_text is None else labels_text)
    return path


def test_uci_zip_reads_into_the_same_arrays(tmp_path):
    from ebfl.datasets import read_uci_hapt_zip

    raw = _fixture()
    got = read_uci_hapt_zip(_write_uci_zip(tmp_path / "hapt.zip", raw))
    assert got.keys() == raw.keys()
    for key in raw:
        np.testing.assert_array_equal(got[key], raw[key], err_msg=key)
        assert got[key].dtype == raw[key].dtype, key
    # load_hapt_raw takes the zip too
    np.testing.assert_array_equal(load_hapt_raw(tmp_path / "hapt.zip")["acc"], raw["acc"])


def test_uci_zip_errors(tmp_path):
    import zipfile

    from ebfl.datasets import read_uci_hapt_zip

    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("README.txt", "hello")
    with pytest.raises(ValueError, match="not the UCI HAPT zip"):
        read_uci_hapt_zip(tmp_path / "other.zip")
    # a label past the end of experiment 1 (1000 samples)
    path = _write_uci_zip(tmp_path / "h.zip", _fixture(), labels_text="1 1 5 900 1200")
    with pytest.raises(ValueError, match="outside"):
        read_uci_hapt_zip(path)
    path = _write_uci_zip(tmp_path / "h4.zip", _fixture(), labels_text="1 1 5 900")
    with pytest.raises(ValueError, match="5 columns"):
        read_uci_hapt_zip(path)
    for labels, match in (("1 1 five 0 9", "labels.txt in .*h5.zip cannot be read"),
                          ("", "labels.txt in .*h5.zip is empty"),
                          ("1 1 5 0 9\n\xe9", "labels.txt in .*h5.zip cannot be read")):
        path = _write_uci_zip(tmp_path / "h5.zip", _fixture(), labels_text=labels)
        with pytest.raises(ValueError, match=match):
            read_uci_hapt_zip(path)
    whole = _write_uci_zip(tmp_path / "h6.zip", _fixture()).read_bytes()
    for name, body in (("cut.zip", whole[: len(whole) // 2]), ("noise.zip", bytes(range(99)))):
        (tmp_path / name).write_bytes(body)
        with pytest.raises(ValueError, match=f"{name} is not a zip file"):
            read_uci_hapt_zip(tmp_path / name)
    with pytest.raises(IsADirectoryError):
        read_uci_hapt_zip(tmp_path)


def test_data_home_zip_and_its_download(tmp_path, monkeypatch):
    import hashlib

    from ebfl.datasets import hapt_uci
    from tests.loopback import serve

    payload = _write_uci_zip(tmp_path / "served.zip", _fixture()).read_bytes()
    with serve({"hapt.zip": payload}) as server:
        home = tmp_path / "home"
        monkeypatch.setenv("EBFL_DATA", str(home))
        info = dict(hapt_uci.manifest("uci_hapt_raw"),
                    official_download=f"{server.url}/good/hapt.zip")
        monkeypatch.setattr(hapt_uci, "manifest", lambda name: info)
        with pytest.raises(FileNotFoundError, match="download=True"):
            load_hapt_raw()
        raw = load_hapt_raw(download=True)
        assert (home / "uci-hapt-raw" / "hapt_uci.zip").read_bytes() == payload
        np.testing.assert_array_equal(raw["gyro"], _fixture()["gyro"])
        path, digest = hapt_uci.fetch_uci_hapt()  # already there: kept, not fetched again
        assert digest == hashlib.sha256(payload).hexdigest()
        assert server.hits == ["/good/hapt.zip"]
        # an interrupted transfer leaves nothing behind
        (home / "uci-hapt-raw" / "hapt_uci.zip").unlink()
        info["official_download"] = f"{server.url}/cut/hapt.zip"
        import requests

        with pytest.raises(requests.exceptions.ChunkedEncodingError, match="IncompleteRead"):
            hapt_uci.fetch_uci_hapt()
        assert list((home / "uci-hapt-raw").iterdir()) == []
