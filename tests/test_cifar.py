"""CIFAR-10/100, CIFAR-10.1 and CIFAR-10-C loaders on files written here in the official formats.

The CIFAR batches are written as Python 2 wrote them (byte-string keys and array data,
``numpy.core.multiarray._reconstruct``), CIFAR-10.1 and CIFAR-10-C as .npy files, in a
.tar.gz, a plain .tar or an extracted folder. Nothing is downloaded.
"""

import copy
import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import tarfile

import numpy as np
import pytest

from ebfl._paths import DATA
from ebfl.datasets import _home, data_home
from ebfl.datasets import cifar as cifar_module
from ebfl.datasets.cifar import (
    CIFAR10_C_CORRUPTIONS,
    CIFAR10_CLASSES,
    load_cifar10,
    load_cifar10_1,
    load_cifar10_c,
    load_cifar100,
)
from tests.conftest import requires_data

_RECONSTRUCT = np.zeros(1).__reduce__()[0]


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` (BINSTRING) and names NumPy's reconstructor by its
    NumPy 1 module, as the official CIFAR files (Python 2, NumPy 1) do."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str

    def save_global(self, obj, name=None):
        if obj is _RECONSTRUCT:
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def py2_pickle(obj):
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def cifar_rows(images):
    """(n, 32, 32, 3) -> the official (n, 3072) rows: red plane, green plane, blue plane."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(images.shape[0], -1))


def _images(rng, n):
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def cifar10_arrays(n_train=6, n_test=5, seed=0):
    """Five training batches of ``n_train`` images each and a test batch."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(1, 6):
        out[f"data_batch_{i}"] = (_images(rng, n_train), rng.integers(0, 10, n_train))
    out["test_batch"] = (_images(rng, n_test), rng.integers(0, 10, n_test))
    return out


def cifar10_files(arrays):
    """Batch name -> pickled bytes, as in cifar-10-batches-py/."""
    files = {name: py2_pickle({b"batch_label": name.encode(), b"labels": y.tolist(),
                               b"data": cifar_rows(x)})
             for name, (x, y) in arrays.items()}
    files["batches.meta"] = py2_pickle({b"label_names": [c.encode() for c in CIFAR10_CLASSES],
                                        b"num_cases_per_batch": 10000})
    return files


def cifar100_arrays(n_train=12, n_test=7, seed=1):
    rng = np.random.default_rng(seed)
    return {split: (_images(rng, n), rng.integers(0, 100, n), rng.integers(0, 20, n))
            for split, n in (("train", n_train), ("test", n_test))}


FINE = tuple(f"fine{i}" for i in range(100))
COARSE = tuple(f"coarse{i}" for i in range(20))


def cifar100_files(arrays):
    files = {split: py2_pickle({b"fine_labels": f.tolist(), b"coarse_labels": c.tolist(),
                                b"data": cifar_rows(x)})
             for split, (x, f, c) in arrays.items()}
    files["meta"] = py2_pickle({b"fine_label_names": [n.encode() for n in FINE],
                                b"coarse_label_names": [n.encode() for n in COARSE]})
    return files


def write_tar(path, folder, files, mode):
    with tarfile.open(path, mode) as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def sha(blob):
    return hashlib.sha256(blob).hexdigest()


def md5(blob):
    return hashlib.md5(blob).hexdigest()


def cifar10_c_arrays(rows_per_severity=4, seed=2):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, rows_per_severity).astype(np.uint8)
    return {"fog": _images(rng, 5 * rows_per_severity),
            "gaussian_noise": _images(rng, 5 * rows_per_severity),
            "labels": np.tile(y, 5)}


def write_fixtures(home, *, n_train=6, n_test=5):
    """All four datasets in ``home`` in the official formats (CIFAR-10 with ``n_train``
    images per training batch and ``n_test`` test images); returns (arrays, manifests)."""
    real = {name: json.loads((DATA / "manifests" / f"{name}.json").read_text())
            for name in ("cifar10", "cifar100", "cifar10_1", "cifar10_c")}
    info = copy.deepcopy(real)
    arrays = {"cifar10": cifar10_arrays(n_train, n_test), "cifar100": cifar100_arrays()}
    for name, files, folder in (("cifar10", cifar10_files(arrays["cifar10"]),
                                 "cifar-10-batches-py"),
                                ("cifar100", cifar100_files(arrays["cifar100"]),
                                 "cifar-100-python")):
        d = home / real[name]["directory"]
        d.mkdir(parents=True)
        (archive,) = real[name]["members"]["python"]["files"]
        write_tar(d / archive, folder, files, "w:gz")
        info[name]["members"]["python"]["files"][archive] = sha((d / archive).read_bytes())
        info[name]["extracted"]["md5"] = {k: md5(v) for k, v in files.items()}
    rng = np.random.default_rng(3)
    d = home / real["cifar10_1"]["directory"]
    d.mkdir()
    arrays["cifar10_1"] = {}
    for version, n in (("v6", 20), ("v4", 21)):
        x, y = _images(rng, n), rng.integers(0, 10, n).astype(np.int32)
        arrays["cifar10_1"][version] = (x, y)
        for kind, arr in (("data", x), ("labels", y)):
            blob = npy_bytes(arr)
            (fname,) = real["cifar10_1"]["members"][f"{version}-{kind}"]["files"]
            (d / fname).write_bytes(blob)
            info["cifar10_1"]["members"][f"{version}-{kind}"]["files"][fname] = sha(blob)
    arrays["cifar10_c"] = cifar10_c_arrays()
    d = home / real["cifar10_c"]["directory"]
    d.mkdir()
    files = {f"{k}.npy": npy_bytes(v) for k, v in arrays["cifar10_c"].items()}
    write_tar(d / "CIFAR-10-C.tar", "CIFAR-10-C", files, "w")
    info["cifar10_c"]["members"]["tar"]["files"]["CIFAR-10-C.tar"] = sha(
        (d / "CIFAR-10-C.tar").read_bytes())
    return arrays, info


@pytest.fixture
def fixtures(tmp_path, monkeypatch):
    arrays, info = write_fixtures(tmp_path)
    monkeypatch.setattr(_home, "manifest", lambda name: info[name])
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    return arrays, tmp_path


def test_the_manifests_hold_the_published_checksums():
    m = {name: json.loads((DATA / "manifests" / f"{name}.json").read_text())
         for name in ("cifar10", "cifar100", "cifar10_1", "cifar10_c")}
    assert m["cifar10"]["members"]["python"]["files"]["cifar-10-python.tar.gz"].startswith(
        "6d958be0") and m["cifar10"]["members"]["python"]["md5"].startswith("c58f3010")
    assert m["cifar100"]["members"]["python"]["files"]["cifar-100-python.tar.gz"].startswith(
        "85cd44d0") and m["cifar100"]["members"]["python"]["md5"].startswith("eb9058c3")
    assert m["cifar10_c"]["members"]["tar"]["files"]["CIFAR-10-C.tar"].startswith("c72763e1")
    assert set(m["cifar10_1"]["members"]) == {"v4-data", "v4-labels", "v6-data", "v6-labels"}
    assert set(m["cifar10"]["extracted"]["md5"]) == {
        *(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"}
    for info in m.values():
        for member in info["members"].values():
            assert all(len(h) == 64 for h in member["files"].values())
            assert "download" in member and member["download"]["file"] in member["files"]
    assert len(CIFAR10_C_CORRUPTIONS) == 19


# -- CIFAR-10 / CIFAR-100 ----------------------------------------------------------------------

def test_cifar10_reads_the_tarball(fixtures):
    arrays, _ = fixtures
    train = load_cifar10("train", download=False)
    x = np.concatenate([arrays["cifar10"][f"data_batch_{i}"][0] for i in range(1, 6)])
    y = np.concatenate([arrays["cifar10"][f"data_batch_{i}"][1] for i in range(1, 6)])
    np.testing.assert_array_equal(train.images, x)
    np.testing.assert_array_equal(train.labels, y)
    assert train.images.dtype == np.uint8 and train.images.shape == (30, 32, 32, 3)
    assert train.labels.dtype == np.int64 and train.classes == CIFAR10_CLASSES
    test = load_cifar10("test", download=False)
    np.testing.assert_array_equal(test.images, arrays["cifar10"]["test_batch"][0])
    # the official row layout: red plane, then green, then blue
    row = cifar_rows(test.images)[2]
    assert test.images[2, 5, 7, 1] == row[1024 + 5 * 32 + 7]


@pytest.mark.parametrize("label, names", [("fine", FINE), ("coarse", COARSE)])
def test_cifar100_reads_fine_and_coarse_labels(fixtures, label, names):
    arrays, _ = fixtures
    for split in ("train", "test"):
        data = load_cifar100(split, label=label, download=False)
        x, fine, coarse = arrays["cifar100"][split]
        np.testing.assert_array_equal(data.images, x)
        np.testing.assert_array_equal(data.labels, fine if label == "fine" else coarse)
        assert data.classes == names


def test_an_extracted_folder_is_read_and_checked_by_md5(fixtures):
    arrays, home = fixtures
    folder = home / "cifar10"
    with tarfile.open(folder / "cifar-10-python.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    (folder / "cifar-10-python.tar.gz").unlink()
    np.testing.assert_array_equal(load_cifar10("test", download=False).images,
                                  arrays["cifar10"]["test_batch"][0])
    path = folder / "cifar-10-batches-py" / "test_batch"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 1  # a pixel of the array data
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"test_batch has md5 .*, expected .*torchvision"):
        load_cifar10("test", download=False)
    assert load_cifar10("test", download=False, verify=False).n_samples == 5
    (folder / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="cifar10 data_batch_3 not found in"):
        load_cifar10("train", download=False)


def test_a_tampered_tarball_is_refused_and_left_alone(fixtures):
    _, home = fixtures
    path = home / "cifar100" / "cifar-100-python.tar.gz"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="has sha256 .* expected"):
        load_cifar100("train", download=False)
    assert path.is_file()


def test_a_missing_dataset_names_the_data_home(fixtures):
    _, home = fixtures
    (home / "cifar10" / "cifar-10-python.tar.gz").unlink()
    with pytest.raises(FileNotFoundError, match=f"data home {data_home()}") as err:
        load_cifar10("train", download=False)
    assert "cifar-10-batches-py" in str(err.value)


def _rewrite_tar(home, files, folder="cifar-10-batches-py"):
    path = home / "cifar10" / "cifar-10-python.tar.gz"
    write_tar(path, folder, files, "w:gz")
    return path


def test_malformed_batches_are_refused(fixtures):
    arrays, home = fixtures
    files = cifar10_files(arrays["cifar10"])
    evil = pickle.dumps({b"data": os.system}, protocol=2)  # would import os.system
    bad = dict(files, test_batch=evil)
    _rewrite_tar(home, bad)
    with pytest.raises(ValueError, match="refusing to load posix.system|refusing to load"):
        load_cifar10("test", download=False, verify=False)
    x, y = arrays["cifar10"]["test_batch"]
    for batch, match in (({b"labels": y.tolist(), b"data": cifar_rows(x)[:, :100]},
                          r"'data' must be a uint8 array of shape \(n, 3072\)"),
                         ({b"labels": y.tolist()[:-1], b"data": cifar_rows(x)},
                          "5 images but 4 labels"),
                         ({b"labels": [10] * 5, b"data": cifar_rows(x)},
                          r"labels must lie in 0..9"),
                         ({b"data": cifar_rows(x)}, "has no 'labels' entry"),
                         ([1, 2], "not a dict")):
        _rewrite_tar(home, dict(files, test_batch=py2_pickle(batch)))
        with pytest.raises(ValueError, match=match):
            load_cifar10("test", download=False, verify=False)
    _rewrite_tar(home, {k: v for k, v in files.items() if k != "data_batch_2"})
    with pytest.raises(ValueError, match="lacks cifar-10-batches-py/data_batch_2"):
        load_cifar10("train", download=False, verify=False)
    path = _rewrite_tar(home, files)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match="not a readable tar archive"):
        load_cifar10("train", download=False, verify=False)


def test_a_verified_file_is_hashed_once_per_process(fixtures, monkeypatch):
    _, home = fixtures
    calls = []
    real = _home.sha256
    monkeypatch.setattr(_home, "sha256", lambda p: calls.append(p) or real(p))
    monkeypatch.setattr(cifar_module, "_VERIFIED", set())
    load_cifar10("test", download=False)
    load_cifar10("train", download=False)
    assert len(calls) == 1
    path = home / "cifar10" / "cifar-10-python.tar.gz"
    path.write_bytes(path.read_bytes())  # rewritten: a new modification time
    os.utime(path, ns=(0, 10**9))
    load_cifar10("test", download=False)
    assert len(calls) == 2


def test_loaders_check_their_arguments(fixtures):
    with pytest.raises(ValueError, match="split must be one of"):
        load_cifar10("valid")
    with pytest.raises(ValueError, match="label must be one of"):
        load_cifar100("train", label="medium")
    with pytest.raises(ValueError, match="version must be one of"):
        load_cifar10_1("v5")
    with pytest.raises(TypeError, match="verify must be True or False"):
        load_cifar10("train", verify="yes")


# -- CIFAR-10.1 --------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v6", "v4"])
def test_cifar10_1_reads_the_npy_files(fixtures, version):
    arrays, _ = fixtures
    data = load_cifar10_1(version, download=False)
    x, y = arrays["cifar10_1"][version]
    np.testing.assert_array_equal(data.images, x)
    np.testing.assert_array_equal(data.labels, y)
    assert data.labels.dtype == np.int64 and data.classes == CIFAR10_CLASSES


def test_cifar10_1_refuses_tampered_or_malformed_files(fixtures):
    _, home = fixtures
    path = home / "cifar10.1" / "cifar10.1_v6_labels.npy"
    good = path.read_bytes()
    path.write_bytes(npy_bytes(np.zeros(20, np.int32)))
    with pytest.raises(ValueError, match="has sha256"):
        load_cifar10_1(download=False)
    path.write_bytes(npy_bytes(np.zeros(19, np.int32)))
    with pytest.raises(ValueError, match="19 labels for 20 images"):
        load_cifar10_1(download=False, verify=False)
    path.write_bytes(npy_bytes(np.full(20, 10, np.int32)))
    with pytest.raises(ValueError, match=r"labels must lie in 0..9"):
        load_cifar10_1(download=False, verify=False)
    path.write_bytes(good[:-8])
    with pytest.raises(ValueError, match="truncated"):
        load_cifar10_1(download=False, verify=False)
    path.write_bytes(npy_bytes(np.array([None] * 20, dtype=object)))
    with pytest.raises(ValueError, match="holds an object array"):
        load_cifar10_1(download=False, verify=False)
    path.write_bytes(b"not a npy file")
    with pytest.raises(ValueError, match="not a NumPy .npy file"):
        load_cifar10_1(download=False, verify=False)
    path.unlink()
    with pytest.raises(FileNotFoundError, match="allow the download"):
        load_cifar10_1(download=False)


# -- CIFAR-10-C --------------------------------------------------------------------------------

def test_cifar10_c_reads_all_or_one_severity_from_the_tar(fixtures):
    arrays, _ = fixtures
    x, y = arrays["cifar10_c"]["fog"], arrays["cifar10_c"]["labels"]
    every = load_cifar10_c("fog")
    np.testing.assert_array_equal(every.images, x)
    np.testing.assert_array_equal(every.labels, y)
    assert every.labels.dtype == np.int64 and every.classes == CIFAR10_CLASSES
    for s in (1, 3, 5):
        block = load_cifar10_c("fog", severity=s)
        np.testing.assert_array_equal(block.images, x[4 * (s - 1):4 * s])
        np.testing.assert_array_equal(block.labels, y[4 * (s - 1):4 * s])
    np.testing.assert_array_equal(load_cifar10_c("gaussian_noise", 2).images,
                                  arrays["cifar10_c"]["gaussian_noise"][4:8])


def test_cifar10_c_reads_an_extracted_folder(fixtures):
    arrays, home = fixtures
    d = home / "cifar10-c"
    with tarfile.open(d / "CIFAR-10-C.tar") as tar:
        tar.extractall(d, filter="data")
    (d / "CIFAR-10-C.tar").unlink()
    np.testing.assert_array_equal(load_cifar10_c("fog", severity=4).images,
                                  arrays["cifar10_c"]["fog"][12:16])
    with pytest.raises(FileNotFoundError, match="CIFAR-10-C snow.npy not found"):
        load_cifar10_c("snow")
    labels = np.load(d / "CIFAR-10-C" / "labels.npy")
    np.save(d / "CIFAR-10-C" / "labels.npy", labels[:15])
    with pytest.raises(ValueError, match="fog.npy has 20 images but labels.npy 15 labels"):
        load_cifar10_c("fog")
    np.save(d / "CIFAR-10-C" / "labels.npy", labels)
    np.save(d / "CIFAR-10-C" / "fog.npy", np.zeros((18, 32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="has 18 rows, not a multiple of the 5 severities"):
        load_cifar10_c("fog", 2)
    np.save(d / "CIFAR-10-C" / "fog.npy", np.zeros((20, 32, 32), np.uint8))
    with pytest.raises(ValueError, match=r"expected uint8 images \(n, 32, 32, 3\)"):
        load_cifar10_c("fog", 1)
    shutil.rmtree(d / "CIFAR-10-C")
    with pytest.raises(FileNotFoundError, match=f"data home {data_home()}"):
        load_cifar10_c("fog")


def test_cifar10_c_checks_its_arguments_and_archive(fixtures):
    _, home = fixtures
    with pytest.raises(ValueError, match=r"corruption must be one of \['brightness'"):
        load_cifar10_c("rotate")
    with pytest.raises(ValueError, match=r"severity must be an integer in \[1, 5\]"):
        load_cifar10_c("fog", severity=0)
    path = home / "cifar10-c" / "CIFAR-10-C.tar"
    with pytest.raises(ValueError, match="lacks CIFAR-10-C/snow.npy"):
        load_cifar10_c("snow")
    path.write_bytes(path.read_bytes()[:-1024])
    with pytest.raises(ValueError, match="has sha256"):
        load_cifar10_c("fog")


# -- the real files, when the data home has them ------------------------------------------------

@requires_data("cifar10")
def test_real_cifar10():
    test = load_cifar10("test", download=False)
    assert test.images.shape == (10000, 32, 32, 3)
    assert np.bincount(test.labels).tolist() == [1000] * 10


@requires_data("cifar100")
def test_real_cifar100():
    test = load_cifar100("test", download=False)
    assert test.images.shape == (10000, 32, 32, 3) and len(test.classes) == 100
    assert np.bincount(test.labels).tolist() == [100] * 100


@requires_data("cifar10.1")
def test_real_cifar10_1():
    assert load_cifar10_1(download=False).images.shape == (2000, 32, 32, 3)
