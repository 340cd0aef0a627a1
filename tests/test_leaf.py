"""LEAF FEMNIST JSON (fixtures written here), writer clients, and the opt-in archive fetch."""

import hashlib
import io
import json
import tarfile
import zipfile

import numpy as np
import pytest
import requests

from ebfl.datasets import (
    FEMNIST_CLASSES,
    LeafFemnist,
    femnist_clients,
    fetch_leaf_femnist,
    load_leaf_femnist,
)
from tests.loopback import serve


def writer_data(rng, n, letters=True):
    x = rng.random((n, 784)).round(3)
    y = rng.integers(0, 62 if letters else 10, n)
    return x, y


def write_leaf(root, split, users, n_files=2, extra_empty=True):
    """users: id -> (x (n, 784), y (n,)); spread over ``n_files`` LEAF JSON files."""
    (root / split).mkdir(parents=True, exist_ok=True)
    ids = list(users)
    for k in range(n_files):
        chunk = ids[k::n_files]
        blob = {"users": chunk, "num_samples": [len(users[u][1]) for u in chunk],
                "user_data": {u: {"x": users[u][0].tolist(), "y": users[u][1].tolist()}
                              for u in chunk}}
        if extra_empty:  # LEAF's by-sample split keeps dropped writers with no data
            blob["user_data"][f"dropped{k}"] = {"x": [], "y": []}
        (root / split / f"all_data_{k}_niid_05_keep_0_{split}_9.json").write_text(
            json.dumps(blob))


@pytest.fixture
def leaf_root(tmp_path):
    rng = np.random.default_rng(0)
    users = {f"f{i:04d}_{i % 7:02d}": writer_data(rng, 3 + i % 4) for i in (5, 1, 4, 2, 3)}
    users["f0009_00"] = (np.zeros((0, 784)), np.zeros(0, int))  # no sample: dropped
    write_leaf(tmp_path, "train", users)
    write_leaf(tmp_path, "test", {u: writer_data(rng, 2) for u in users}, n_files=1)
    return tmp_path, users


def test_load_reads_every_file_and_groups_by_writer(leaf_root):
    root, users = leaf_root
    data = load_leaf_femnist(root, "train")
    kept = sorted(u for u in users if len(users[u][1]))
    assert data.writers.tolist() == kept and data.n_writers == 5
    assert data.x.shape == (data.n_samples, 28, 28) and data.x.dtype == np.float32
    assert data.y.dtype == np.int64 and np.all(np.diff(data.writer) >= 0)
    for w, user in enumerate(kept):
        x, y = users[user]
        np.testing.assert_array_equal(data.y[data.writer == w], y)
        np.testing.assert_allclose(data.x[data.writer == w].reshape(-1, 784), x, rtol=1e-6)
    assert load_leaf_femnist(root, "test").n_samples == 2 * 6
    assert len(FEMNIST_CLASSES) == 62 and FEMNIST_CLASSES[10] == "A"
    assert FEMNIST_CLASSES[36] == "a"


def test_load_uses_the_data_home_by_default(leaf_root, monkeypatch, tmp_path_factory):
    root, _ = leaf_root
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("EBFL_DATA", str(home))
    with pytest.raises(FileNotFoundError, match="preprocess.sh"):
        load_leaf_femnist()
    (home / "leaf-femnist").mkdir()
    (root).rename(home / "leaf-femnist" / "data")
    assert load_leaf_femnist(split="test").n_writers == 6


def _one_file(tmp_path, blob):
    (tmp_path / "train").mkdir(exist_ok=True)
    path = tmp_path / "train" / "a.json"
    path.write_text(blob if isinstance(blob, str) else json.dumps(blob))
    return tmp_path


def _blob(x=None, y=None, n=None):
    x = [[0.5] * 784] if x is None else x
    y = [1] if y is None else y
    return {"users": ["u"], "num_samples": [len(y) if n is None else n],
            "user_data": {"u": {"x": x, "y": y}}}


@pytest.mark.parametrize("blob, match", [
    ("{not json", "not valid JSON"),
    ({"users": ["u"]}, "keys 'users', 'num_samples' and 'user_data'"),
    ({"users": ["u"], "num_samples": [], "user_data": {}}, "same length"),
    ({"users": ["u"], "num_samples": [1], "user_data": {}}, "no 'x' and 'y' for writer 'u'"),
    (_blob(n=2), "1 images and 1 labels, num_samples says 2"),
    (_blob(x=[[0.5] * 783]), "783 values, expected 784"),
    (_blob(x=[["a"] * 784]), "numeric images"),
    (_blob(y=[62]), r"labels outside the integers 0..61"),
    (_blob(y=[1.5]), r"labels outside the integers 0..61"),
    (_blob(x=[[float("nan")] * 784]), "NaN or infinite pixels"),
    (_blob(x=7, y=[1]), "must have lists 'x'"),
    ({**_blob(), "user_data": {"u": {"x": [[0.5] * 784], "y": 3}}}, "must have lists 'x'"),
])
def test_load_rejects_malformed_files(tmp_path, blob, match):
    with pytest.raises(ValueError, match=match):
        load_leaf_femnist(_one_file(tmp_path, blob))


def test_load_rejects_a_writer_in_two_files_and_bad_arguments(tmp_path):
    root = _one_file(tmp_path, _blob())
    (root / "train" / "b.json").write_text(json.dumps(_blob()))
    with pytest.raises(ValueError, match="writer 'u' also appears in a.json"):
        load_leaf_femnist(root)
    with pytest.raises(ValueError, match="split must be one of"):
        load_leaf_femnist(root, "valid")
    with pytest.raises(FileNotFoundError, match="no LEAF FEMNIST test files"):
        load_leaf_femnist(root, "test")


# ------------------------------------------------------------- clients

def synthetic(n_writers, rng, per_writer=4, names=None):
    """An in-memory LeafFemnist: ``per_writer`` samples per writer, the first one a digit."""
    names = names or [f"w{i:04d}" for i in range(n_writers)]
    n = n_writers * per_writer
    y = (np.arange(n) * 7 + rng.integers(0, 62)) % 62
    y[::per_writer] = np.arange(n_writers) % 10  # every writer has a digit
    x = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None], (n, 28, 28)).copy()
    return LeafFemnist(x, y.astype(np.int64), np.repeat(np.arange(n_writers), per_writer),
                       np.array(sorted(names)))


def test_clients_follow_the_paper_setup():
    rng = np.random.default_rng(3)
    train, test = synthetic(230, rng, per_writer=6), synthetic(230, rng, per_writer=3)
    clients = femnist_clients(train, test, rng=0)
    assert clients.n_clients == 66 and clients.writers.shape == (66, 3)
    assert np.unique(clients.writers).size == 198 and clients.n_classes == 10
    for c in range(66):
        for data, xs, ys in ((train, clients.x_train, clients.y_train),
                             (test, clients.x_test, clients.y_test)):
            w = np.flatnonzero(np.isin(data.writers, clients.writers[c]))
            want = np.flatnonzero(np.isin(data.writer, w) & (data.y < 10))
            np.testing.assert_array_equal(ys[c], data.y[want])  # exactly its writers' digits
            np.testing.assert_array_equal(xs[c][:, 0, 0], want)
    again = femnist_clients(train, test, rng=0)
    other = femnist_clients(train, test, rng=1)
    np.testing.assert_array_equal(again.writers, clients.writers)
    assert not np.array_equal(other.writers, clients.writers)


def test_all_classes_and_eligibility():
    rng = np.random.default_rng(4)
    train = synthetic(6, rng)
    y = train.y.copy()
    y[train.writer == 0] = 30  # writer 0: letters only
    train = LeafFemnist(train.x, y, train.writer, train.writers)
    test = synthetic(5, rng, names=[f"w{i:04d}" for i in range(1, 6)])
    test = LeafFemnist(test.x, np.zeros(test.n_samples, np.int64), test.writer, test.writers)
    clients = femnist_clients(train, test, writers_per_client=1, n_writers=5, rng=0)
    assert sorted(clients.writers.ravel().tolist()) == [f"w{i:04d}" for i in range(1, 6)]
    with pytest.raises(ValueError, match="<= the 5 writers with digit samples in both"):
        femnist_clients(train, test, writers_per_client=2, n_writers=6)
    everything = femnist_clients(train, None, writers_per_client=2, n_writers=6,
                                 digits_only=False, rng=0)
    assert everything.n_classes == 62 and everything.x_test is None
    assert sum(len(y) for y in everything.y_train) == train.n_samples


@pytest.mark.parametrize("kwargs, error, match", [
    ({"n_writers": 10, "writers_per_client": 3}, ValueError, "multiple of writers_per_client"),
    ({"writers_per_client": 0}, ValueError, "writers_per_client must be an integer >= 1"),
    ({"n_writers": 2.5}, TypeError, "n_writers must be an integer"),
    ({"digits_only": "yes"}, TypeError, "digits_only must be True or False"),
])
def test_client_argument_errors(kwargs, error, match):
    train = synthetic(6, np.random.default_rng(0))
    with pytest.raises(error, match=match):
        femnist_clients(train, **{"n_writers": 6, "writers_per_client": 2, **kwargs})
    with pytest.raises(TypeError, match="train must be a LeafFemnist"):
        femnist_clients({"x": 1})
    with pytest.raises(ValueError, match="disagree"):
        LeafFemnist(train.x[:3], train.y, train.writer, train.writers)
    with pytest.raises(ValueError, match=r"writer must lie in 0..5"):
        LeafFemnist(train.x, train.y, train.writer + 1, train.writers)


# ------------------------------------------------ archive fetch (loopback)

def fixture_tree():
    rng = np.random.default_rng(7)
    users = {f"f{i:04d}": writer_data(rng, 3, letters=False) for i in range(4)}
    files = {}
    for split in ("train", "test"):
        blob = {"users": list(users), "num_samples": [3] * 4,
                "user_data": {u: {"x": x.tolist(), "y": y.tolist()}
                              for u, (x, y) in users.items()}}
        files[f"femnist/data/{split}/all_data_0_{split}.json"] = json.dumps(blob).encode()
    return files


def tar_gz(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def zipped(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
    return buf.getvalue()


ARCHIVES = {
    "femnist.tar.gz": tar_gz(fixture_tree()),
    "femnist.zip": zipped(fixture_tree()),
    "flat.zip": zipped({k.replace("femnist/data/", ""): v for k, v in fixture_tree().items()}),
    "notrain.zip": zipped({"readme.txt": b"hello"}),
    "evil.zip": zipped({**fixture_tree(), "../evil.json": b"{}"}),
    "plain.txt": b"not an archive",
    "cut.tar.gz": tar_gz(fixture_tree())[:300],
    "crc.zip": bytes(b ^ 0xFF if i == 100 else b  # a flipped byte in a member's data
                     for i, b in enumerate(zipped(fixture_tree()))),
}


@pytest.fixture(scope="module")
def server():
    with serve(ARCHIVES) as files:
        yield files


@pytest.fixture
def home(server, tmp_path, monkeypatch):
    monkeypatch.setenv("EBFL_DATA", str(tmp_path / "home"))
    server.hits.clear()
    return tmp_path / "home" / "leaf-femnist"


def _empty(folder):
    return not folder.exists() or list(folder.iterdir()) == []


@pytest.mark.parametrize("name", ["femnist.tar.gz", "femnist.zip", "flat.zip"])
def test_fetch_unpacks_an_archive_for_the_loader(server, home, name):
    with pytest.raises(ValueError, match="url is required"):
        fetch_leaf_femnist()
    root, digest = fetch_leaf_femnist(f"{server.url}/good/{name}")
    assert root == home / "data" and digest == hashlib.sha256(ARCHIVES[name]).hexdigest()
    assert sorted(p.name for p in home.iterdir()) == ["data", name]  # no temporary left
    train, test = load_leaf_femnist(split="train"), load_leaf_femnist(split="test")
    assert train.n_writers == test.n_writers == 4 and train.n_samples == 12
    assert fetch_leaf_femnist(f"{server.url}/good/{name}") == (root, None)  # kept
    assert server.hits == [f"/good/{name}"]


def test_fetch_verifies_a_given_checksum(server, home):
    good = hashlib.sha256(ARCHIVES["femnist.zip"]).hexdigest()
    with pytest.raises(ValueError, match="does not match the known hash"):
        fetch_leaf_femnist(f"{server.url}/good/femnist.zip", sha256_hex="0" * 64)
    assert _empty(home)
    root, digest = fetch_leaf_femnist(f"{server.url}/good/femnist.zip", sha256_hex=good)
    assert digest == good and load_leaf_femnist(root).n_writers == 4


@pytest.mark.parametrize("route, error, match", [
    ("/cut/femnist.zip", requests.exceptions.ChunkedEncodingError, "IncompleteRead"),
    ("/good/notrain.zip", ValueError, "exactly one train/ folder"),
    ("/good/evil.zip", ValueError, "unsafe member path '../evil.json'"),
    ("/good/plain.txt", ValueError, "neither a zip nor a tar"),
    ("/good/cut.tar.gz", ValueError, "cut.tar.gz is truncated or corrupted"),
    ("/good/crc.zip", ValueError, "crc.zip is truncated or corrupted .Bad CRC-32"),
])
def test_failed_fetch_leaves_nothing_behind(server, home, route, error, match):
    with pytest.raises(error, match=match):
        fetch_leaf_femnist(f"{server.url}{route}")
    assert _empty(home)
    assert not (home.parent / "evil.json").exists() and not (home / "evil.json").exists()


def test_fetch_refuses_an_incomplete_data_folder(server, home):
    (home / "data" / "test").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no train/\\*.json"):
        fetch_leaf_femnist(f"{server.url}/good/femnist.zip")
    assert server.hits == []
