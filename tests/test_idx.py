"""IDX reader (files written here), MNIST-style loaders, their verified download, real files."""

import gzip
import hashlib
import struct

import numpy as np
import pytest

from ebfl.datasets import (
    _home,
    content_sha256,
    data_home,
    dataset_file,
    dataset_path,
    load_fashion_mnist,
    load_mnist,
    manifest,
    read_idx,
)
from tests.conftest import requires_data
from tests.loopback import serve

CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D,
         np.float64: 0x0E}


def idx_bytes(arr, code=None):
    arr = np.asarray(arr)
    code = CODES[arr.dtype.type] if code is None else code
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, dtype, compress):
    rng = np.random.default_rng(0)
    arr = (rng.normal(size=(4, 3, 2)) * 50).astype(dtype)
    blob = idx_bytes(arr)
    path = tmp_path / ("a.gz" if compress else "a")
    path.write_bytes(gzip.compress(blob) if compress else blob)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)
    out[0] = 0  # a fresh, writable array
    assert read_idx(path)[0].tolist() == arr[0].tolist()


def test_read_idx_zero_samples(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(idx_bytes(np.zeros((0, 28, 28), np.uint8)))
    assert read_idx(path).shape == (0, 28, 28)


GOOD = idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))


@pytest.mark.parametrize("blob, match", [
    (GOOD[:-1], "truncated: its header promises"),
    (GOOD[:10], "truncated inside its header"),
    (GOOD[:3], "too short for an IDX header"),
    (GOOD + b"\x00", "data past"),
    (b"\x01" + GOOD[1:], "magic number 01000803 must start with two zero bytes"),
    (GOOD[:2] + b"\x07" + GOOD[3:], "data type code 0x07"),
    (GOOD[:3] + b"\x00" + GOOD[4:], "0 dimensions"),
])
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_rejects_malformed_files(tmp_path, blob, match, compress):
    path = tmp_path / "bad"
    path.write_bytes(gzip.compress(blob) if compress else blob)
    with pytest.raises(ValueError, match=match):
        read_idx(path)


def test_read_idx_rejects_a_broken_gzip_stream(tmp_path):
    blob = gzip.compress(idx_bytes(np.arange(6000, dtype=np.int32).reshape(20, 300)))
    path = tmp_path / "cut.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="not a valid gzip stream"):
        read_idx(path)
    bad_crc = bytearray(blob)
    bad_crc[-8] ^= 0xFF
    path.write_bytes(bytes(bad_crc))
    with pytest.raises(ValueError, match="not a valid gzip stream"):
        read_idx(path)
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "missing")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        read_idx(tmp_path)


# ------------------------------------------------- loaders on a toy dataset

FILES = {"train-images": "train-images-idx3-ubyte", "train-labels": "train-labels-idx1-ubyte",
         "test-images": "t10k-images-idx3-ubyte", "test-labels": "t10k-labels-idx1-ubyte"}


def toy_arrays(n_train=7, n_test=3):
    rng = np.random.default_rng(1)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        out[f"{split}-images"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        out[f"{split}-labels"] = rng.integers(0, 10, n, dtype=np.uint8)
    return out


def toy_blobs(arrays):
    """member -> (gz bytes, plain bytes)."""
    blobs = {}
    for member, arr in arrays.items():
        plain = idx_bytes(arr)
        blobs[member] = (gzip.compress(plain, mtime=1504176606), plain)
    return blobs


def toy_manifest(blobs, base_url="http://127.0.0.1:9/"):
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    members = {}
    for member, (gz, plain) in blobs.items():
        f = FILES[member]
        members[member] = {"content_sha256": sha(plain),
                           "files": {f + ".gz": sha(gz), f: sha(plain)},
                           "download": {"url": f"{base_url}{f}.gz", "file": f + ".gz"}}
    return {"name": "toy", "official_source": "https://example.org", "directory": "toy",
            "members": members}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    arrays = toy_arrays()
    blobs = toy_blobs(arrays)
    info = toy_manifest(blobs)
    monkeypatch.setattr(_home, "manifest", lambda name: info)
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))
    folder = tmp_path / "toy"
    folder.mkdir()
    for member, (gz, _) in blobs.items():
        (folder / (FILES[member] + ".gz")).write_bytes(gz)
    return arrays, blobs, folder


@pytest.mark.parametrize("loader", [load_mnist, load_fashion_mnist])
def test_loader_reads_verified_files(toy, loader):
    arrays, _, _ = toy
    for split in ("train", "test"):
        data = loader(split, download=False)
        np.testing.assert_array_equal(data.images, arrays[f"{split}-images"])
        np.testing.assert_array_equal(data.labels, arrays[f"{split}-labels"])
        assert data.n_samples == len(arrays[f"{split}-labels"]) and len(data.classes) == 10


def test_uncompressed_and_recompressed_copies_are_accepted(toy):
    arrays, blobs, folder = toy
    gz, plain = blobs["train-images"]
    (folder / "train-images-idx3-ubyte.gz").unlink()
    (folder / "train-images-idx3-ubyte").write_bytes(plain)
    np.testing.assert_array_equal(load_mnist("train", download=False).images,
                                  arrays["train-images"])
    (folder / "train-images-idx3-ubyte").unlink()
    regz = gzip.compress(plain, mtime=0, compresslevel=1)  # other header and deflate stream
    assert regz != gz
    (folder / "train-images-idx3-ubyte.gz").write_bytes(regz)
    assert content_sha256(folder / "train-images-idx3-ubyte.gz") == hashlib.sha256(
        plain).hexdigest()
    np.testing.assert_array_equal(load_mnist("train", download=False).images,
                                  arrays["train-images"])


def test_tampered_file_is_refused_and_left_alone(toy):
    arrays, blobs, folder = toy
    plain = bytearray(blobs["test-labels"][1])
    plain[-1] ^= 1
    path = folder / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(bytes(plain)))
    with pytest.raises(ValueError, match="uncompressed content with sha256"):
        load_mnist("test", download=False)
    assert path.is_file()
    data = load_mnist("test", download=False, verify=False)
    assert data.labels[-1] == arrays["test-labels"][-1] ^ 1
    path.write_bytes(b"\x1f\x8b garbage")  # a broken gzip is a mismatch, not a crash
    with pytest.raises(ValueError, match="sha256"):
        load_mnist("test", download=False)


def test_loader_checks_arguments_and_consistency(toy, tmp_path):
    arrays, blobs, folder = toy
    with pytest.raises(ValueError, match="split must be one of"):
        load_mnist("validation")
    with pytest.raises(ValueError, match="member must be one of"):
        dataset_file("toy", "valid-images")
    with pytest.raises(ValueError, match=r"use dataset_file\(name, member\)"):
        dataset_path("toy")
    other = tmp_path / "other"
    other.mkdir()
    for member, arr in (("train-images", arrays["train-images"][:5]),
                        ("train-labels", arrays["train-labels"])):
        (other / FILES[member]).write_bytes(idx_bytes(arr))
    with pytest.raises(ValueError, match="5 images but 7 labels"):
        load_mnist("train", directory=other, verify=False, download=False)
    (other / FILES["train-images"]).write_bytes(idx_bytes(arrays["train-images"]))
    (other / FILES["train-labels"]).write_bytes(idx_bytes(np.full(7, 10, np.uint8)))
    with pytest.raises(ValueError, match=r"labels must lie in 0..9, found 10"):
        load_mnist("train", directory=other, verify=False, download=False)
    (other / FILES["train-labels"]).write_bytes(idx_bytes(np.zeros(7, np.int32)))
    with pytest.raises(ValueError, match="must be uint8 with 1 dimension"):
        load_mnist("train", directory=other, verify=False, download=False)
    with pytest.raises(FileNotFoundError, match="allow the download"):
        load_mnist("test", directory=other, download=False)


# ----------------------------------------------- download (loopback server)

@pytest.fixture(scope="module")
def server():
    with serve() as files:
        yield files


@pytest.fixture
def remote(server, tmp_path, monkeypatch):
    arrays = toy_arrays()
    blobs = toy_blobs(arrays)
    server.files = {FILES[m] + ".gz": gz for m, (gz, _) in blobs.items()}
    server.hits.clear()
    monkeypatch.setenv("EBFL_DATA", str(tmp_path))

    def use(route):
        info = toy_manifest(blobs, f"{server.url}{route}")
        monkeypatch.setattr(_home, "manifest", lambda name: info)
    return arrays, use, tmp_path / "toy"


def test_download_into_the_data_home_once(remote, server):
    arrays, use, folder = remote
    use("/good/")
    with pytest.raises(FileNotFoundError, match="allow the download"):
        load_mnist("train", download=False)
    data = load_mnist("train")
    np.testing.assert_array_equal(data.images, arrays["train-images"])
    assert sorted(p.name for p in folder.iterdir()) == ["train-images-idx3-ubyte.gz",
                                                        "train-labels-idx1-ubyte.gz"]
    load_mnist("train")
    assert server.hits == ["/good/train-images-idx3-ubyte.gz",
                             "/good/train-labels-idx1-ubyte.gz"]  # verified copies reused


@pytest.mark.parametrize("route, error, match", [
    ("/bad/", ValueError, "does not match the known hash"),
    ("/cut/", ConnectionError, "mnist test-images is not in .* and its download from .* failed"),
])
def test_bad_download_leaves_nothing_behind(remote, route, error, match):
    _, use, folder = remote
    use(route)
    with pytest.raises(error, match=match):
        load_mnist("test")
    assert not folder.exists() or list(folder.iterdir()) == []


# ------------------------------------------------------------ real files

# Label histograms from the data home's READMEs.
README = {
    "mnist": ([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
              [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009],
              [5, 0, 4, 1, 9, 2, 1, 3, 1, 4], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]),
    "fashion_mnist": ([6000] * 10, [1000] * 10, None, None),
}


@pytest.mark.parametrize("name, folder, loader", [
    pytest.param("mnist", "mnist", load_mnist, marks=requires_data("mnist")),
    pytest.param("fashion_mnist", "fashion-mnist", load_fashion_mnist,
                 marks=requires_data("fashion-mnist")),
])
def test_real_files_match_the_readme(name, folder, loader):
    info = manifest(name)
    assert info["directory"] == folder
    for member, entry in info["members"].items():
        path = dataset_file(name, member, download=False)  # verified, never downloaded
        assert path.parent == data_home() / folder
        assert content_sha256(path) == entry["content_sha256"]
        assert entry["download"]["file"] in entry["files"]
    hist_train, hist_test, first_train, first_test = README[name]
    for split, hist, first, n in (("train", hist_train, first_train, 60000),
                                  ("test", hist_test, first_test, 10000)):
        data = loader(split, download=False)
        assert data.images.shape == (n, 28, 28) and data.images.dtype == np.uint8
        assert data.labels.shape == (n,) and data.labels.dtype == np.uint8
        assert np.bincount(data.labels, minlength=10).tolist() == hist
        if first is not None:
            assert data.labels[:10].tolist() == first
