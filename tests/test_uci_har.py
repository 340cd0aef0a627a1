"""The UCI HAR zip reader, on small zips written here in the official layout."""

import zipfile

import numpy as np
import pandas as pd
import pytest

from ebfl.datasets import data_home, load_uci_har, read_uci_har_zip
from ebfl.datasets.uci_har import UCI_HAR_FILES

# Three features, two sharing a name (as the bandsEnergy() names do in features.txt).
FEATURES = "1 tBodyAcc-mean()-X\n2 fBodyAcc-bandsEnergy()-1,8\n3 fBodyAcc-bandsEnergy()-1,8\n"
ACTIVITIES = ("1 WALKING\n2 WALKING_UPSTAIRS\n3 WALKING_DOWNSTAIRS\n4 SITTING\n5 STANDING\n"
              "6 LAYING\n")
RNG = np.random.default_rng(0)
X = {"train": RNG.uniform(-1, 1, size=(4, 3)), "test": RNG.uniform(-1, 1, size=(3, 3))}
Y = {"train": [4, 1, 6, 4], "test": [2, 4, 5]}
SUBJECT = {"train": [1, 1, 3, 3], "test": [2, 2, 2]}


def _table(rows):
    # UCI's own layout: a leading space, values like " 2.8858451e-001"; %.17g keeps the
    # bits so the test can compare exactly.
    return "".join(" " + " ".join(f"{v:.17g}" for v in np.atleast_1d(r)) + "\n" for r in rows)


def _members(**override):
    files = {"features.txt": FEATURES, "activity_labels.txt": ACTIVITIES,
             "features_info.txt": "not read\n", "README.txt": "not read\n"}
    for split in ("train", "test"):
        files[f"{split}/X_{split}.txt"] = _table(X[split])
        files[f"{split}/y_{split}.txt"] = "\n".join(map(str, Y[split])) + "\n"
        files[f"{split}/subject_{split}.txt"] = "\n".join(map(str, SUBJECT[split])) + "\n"
        files[f"{split}/Inertial Signals/body_acc_x_{split}.txt"] = "0.1 0.2\n"
    files.update(override)
    return {k: v for k, v in files.items() if v is not None}


def _write_zip(path, prefix="UCI HAR Dataset/", compression=zipfile.ZIP_DEFLATED, **override):
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, text in _members(**override).items():
            zf.writestr(prefix + name, text)
    return path


def test_reads_the_official_layout(tmp_path):
    frame = read_uci_har_zip(_write_zip(tmp_path / "UCI HAR Dataset.zip"))
    assert list(frame.columns) == ["user", "split", "label", "activity", "tBodyAcc-mean()-X",
                                   "fBodyAcc-bandsEnergy()-1,8", "fBodyAcc-bandsEnergy()-1,8.1"]
    assert frame["split"].tolist() == ["train"] * 4 + ["test"] * 3
    assert frame["user"].tolist() == SUBJECT["train"] + SUBJECT["test"]
    assert frame["label"].tolist() == Y["train"] + Y["test"]
    assert frame["activity"].tolist() == ["SITTING", "WALKING", "LAYING", "SITTING",
                                          "WALKING_UPSTAIRS", "SITTING", "STANDING"]
    np.testing.assert_array_equal(frame.iloc[:, 4:].to_numpy(), np.vstack([X["train"],
                                                                           X["test"]]))
    assert frame["user"].dtype == np.int64 and frame["label"].dtype == np.int64
    assert (frame.iloc[:, 4:].dtypes == np.float64).all()


def test_macos_entries_another_prefix_and_the_download_around_the_zip(tmp_path):
    inner = _write_zip(tmp_path / "UCI HAR Dataset.zip")
    expected = read_uci_har_zip(inner)
    # UCI's zip carries __MACOSX/ resource forks named like the data files.
    with zipfile.ZipFile(tmp_path / "mac.zip", "w") as zf:
        for name in ("__MACOSX/UCI HAR Dataset/train/._X_train.txt",
                     "__MACOSX/UCI HAR Dataset/._features.txt"):
            zf.writestr(name, b"\x00\x05\x16\x07 binary")
        for name, text in _members().items():
            zf.writestr(f"UCI HAR Dataset/{name}", text)
    pd.testing.assert_frame_equal(read_uci_har_zip(tmp_path / "mac.zip"), expected)
    pd.testing.assert_frame_equal(read_uci_har_zip(_write_zip(tmp_path / "flat.zip", "")),
                                  expected)
    # UCI's download: the zip above, beside a description.
    outer = tmp_path / UCI_HAR_FILES[1]
    with zipfile.ZipFile(outer, "w") as zf:
        zf.writestr("UCI HAR Dataset.names", "description")
        zf.writestr("__MACOSX/._UCI HAR Dataset.zip", b"\x00")
        zf.write(inner, "UCI HAR Dataset.zip")
    pd.testing.assert_frame_equal(read_uci_har_zip(outer), expected)


def test_load_from_the_data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    folder = data_home() / "uci-har"
    with pytest.raises(FileNotFoundError) as info:
        load_uci_har()
    message = str(info.value)
    assert "https://archive.ics.uci.edu/dataset/240" in message
    assert str(folder) in message and "UCI HAR Dataset.zip" in message
    folder.mkdir()
    expected = read_uci_har_zip(_write_zip(folder / "UCI HAR Dataset.zip"))
    pd.testing.assert_frame_equal(load_uci_har(), expected)
    pd.testing.assert_frame_equal(load_uci_har(folder / "UCI HAR Dataset.zip"), expected)
    # UCI's download is found too.
    (folder / "UCI HAR Dataset.zip").rename(tmp_path / "inner.zip")
    with zipfile.ZipFile(folder / UCI_HAR_FILES[1], "w") as zf:
        zf.write(tmp_path / "inner.zip", "UCI HAR Dataset.zip")
    pd.testing.assert_frame_equal(load_uci_har(), expected)


def _corrupt(path, member):
    """Flip bytes inside a stored (uncompressed) member's data: its CRC no longer matches."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    data_start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[data_start + 3] ^= 0x01  # a digit becomes another digit: still parses as numbers
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_corrupted_member_is_named(tmp_path, compression):
    path = _write_zip(tmp_path / "h.zip", compression=compression)
    if compression == zipfile.ZIP_STORED:
        _corrupt(path, "UCI HAR Dataset/train/X_train.txt")
    else:  # damage the middle of the deflate stream
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("UCI HAR Dataset/train/X_train.txt")
        raw = bytearray(path.read_bytes())
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        for i in range(start + 5, start + info.compress_size - 5):
            raw[i] ^= 0x5A
        path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"UCI HAR Dataset/train/X_train\.txt in .*h\.zip is "
                                         r"corrupted"):
        read_uci_har_zip(path)


@pytest.mark.parametrize("override, match", [
    ({"train/X_train.txt": " 0.1 zero 0.3\n"}, r"train/X_train\.txt in .* cannot be read as a "
                                              "table of numbers"),
    ({"test/X_test.txt": " 0.1 0.2 0.3\n 0.4 0.5\n 0.1 0.2 0.3\n"},
     r"test/X_test\.txt in .* cannot be read as a table of numbers"),
    ({"test/X_test.txt": " 0.1 0.2\n 0.4 0.5\n 0.1 0.2\n"},
     r"test/X_test\.txt in .* must have 3 column\(s\), got 2"),
    ({"test/X_test.txt": " 0.1 0.2 nan\n 0.4 0.5 0.6\n 0.1 0.2 0.3\n"},
     r"test/X_test\.txt in .* holds NaN or infinite values"),
    ({"train/X_train.txt": ""}, r"train/X_train\.txt in .* is empty"),
    ({"train/X_train.txt": " 0.1 0.2 \xe9\n"}, r"train/X_train\.txt in .* cannot be read"),
    ({"train/y_train.txt": "4\n1\n7\n4\n"},
     r"train/y_train\.txt in .* must hold integers in \[1, 6\], got 7\.0 on line 3"),
    ({"train/y_train.txt": "4\n1\n1.5\n4\n"}, r"must hold integers in \[1, 6\], got 1\.5"),
    ({"test/subject_test.txt": "2\n0\n2\n"}, r"test/subject_test\.txt in .* must hold integers"),
    ({"train/subject_train.txt": "1\n1\n3\n"},
     r"the train files must have one row per window, got 4 rows in .*X_train\.txt, 4 in "
     r".*y_train\.txt and 3 in .*subject_train\.txt"),
    ({"activity_labels.txt": "1 WALKING\n2 WALKING_UPSTAIRS\n3 X\n5 STANDING\n6 LAYING\n"},
     r"y_train\.txt in .* has label\(s\) \[4\] that .*activity_labels\.txt does not name"),
    ({"activity_labels.txt": "1 WALKING\n1 SITTING\n"}, "names label 1 twice"),
    ({"activity_labels.txt": "WALKING 1\n"}, "each line must read '<label >= 1> <name>'"),
    ({"activity_labels.txt": "\n\n"}, r"activity_labels\.txt in .* is empty"),
    ({"features.txt": "1 a\n3 b\n2 c\n"}, r"features\.txt in .*: line 2 must read '2 <name>', "
                                         "got '3 b'"),
    ({"features.txt": "1 a\n2 b\n3 \xe9\n"}, r"features\.txt in .* is not ASCII text"),
    ({"test/y_test.txt": None}, r"lacks \['UCI HAR Dataset/test/y_test\.txt'\]: not the UCI "
                                "HAR zip"),
])
def test_odd_files_are_named(tmp_path, override, match):
    path = _write_zip(tmp_path / "h.zip", **override)
    with pytest.raises(ValueError, match=match):
        read_uci_har_zip(path)


def test_not_a_zip_a_folder_and_a_missing_file(tmp_path):
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("README.txt", "hello")
    with pytest.raises(ValueError, match=r"other\.zip lacks \['UCI HAR Dataset/features\.txt', "
                                         r"'UCI HAR Dataset/activity_labels\.txt'"):
        read_uci_har_zip(tmp_path / "other.zip")
    whole = _write_zip(tmp_path / "h.zip").read_bytes()
    for name, body in (("cut.zip", whole[: len(whole) // 2]), ("noise.zip", bytes(range(99)))):
        (tmp_path / name).write_bytes(body)
        with pytest.raises(ValueError, match=f"{name} is not a zip file"):
            read_uci_har_zip(tmp_path / name)
    with pytest.raises(IsADirectoryError):
        read_uci_har_zip(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_uci_har_zip(tmp_path / "nope.zip")
    # Two copies of one file: refused rather than guessed.
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as zf:
        for prefix in ("a/", "b/"):
            for name, text in _members().items():
                zf.writestr(prefix + name, text)
    with pytest.raises(ValueError, match=r"two\.zip holds several candidates for one file"):
        read_uci_har_zip(tmp_path / "two.zip")
    # A corrupted inner zip inside UCI's download.
    with zipfile.ZipFile(tmp_path / "outer.zip", "w") as zf:
        zf.writestr("UCI HAR Dataset.zip", whole[:100])
    with pytest.raises(ValueError, match=r"outer\.zip:UCI HAR Dataset\.zip is not a zip file"):
        read_uci_har_zip(tmp_path / "outer.zip")


def test_unique_names_skip_names_already_taken(tmp_path):
    features = "1 a\n2 a.1\n3 a\n"
    text = _table(np.zeros((4, 3)))
    path = _write_zip(tmp_path / "h.zip", **{"features.txt": features,
                                              "train/X_train.txt": text,
                                              "test/X_test.txt": _table(np.zeros((3, 3)))})
    assert list(read_uci_har_zip(path).columns[4:]) == ["a", "a.1", "a.2"]


# --------------------------------------------------------------------------- the real zip

def _real_zip():
    folder = data_home() / "uci-har"
    return next((folder / f for f in UCI_HAR_FILES if (folder / f).is_file()), None)


@pytest.mark.skipif(_real_zip() is None, reason="EBFL_DATA lacks uci-har (neither "
                    f"{' nor '.join(UCI_HAR_FILES)} in <data home>/uci-har; tests never "
                    "download)")
def test_the_real_zip():
    from ebfl.dppfl.data import har_sitting_devices

    frame = load_uci_har()
    assert frame.shape == (10_299, 4 + 561)
    assert (frame["split"] == "train").sum() == 7352
    assert sorted(frame["user"].unique()) == list(range(1, 31))
    assert frame.columns.is_unique
    features = frame.iloc[:, 4:].to_numpy()
    assert features.min() >= -1.0 and features.max() <= 1.0
    data = har_sitting_devices(frame, source="uci_har")
    assert data.n_clients == 30 and data.n_features == 561
    np.testing.assert_allclose(np.linalg.norm(data.X, axis=1), 1.0, rtol=1e-14)
    assert 0.15 < (np.r_[data.y, data.y_test] == 1).mean() < 0.20


def test_reader_does_not_load_inertial_signals(tmp_path):
    # A broken file the reader does not need is never opened.
    path = _write_zip(tmp_path / "h.zip", **{"train/Inertial Signals/body_acc_x_train.txt":
                                             "not numbers"})
    assert len(read_uci_har_zip(path)) == 7
