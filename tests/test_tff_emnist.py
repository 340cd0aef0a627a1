"""TFF's federated EMNIST: the HDF5 loader end to end on small files in TFF's layout."""

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
pytest.importorskip("torch")

from ebfl.datasets import (  # noqa: E402
    TFF_EMNIST_FILES,
    TffEmnist,
    load_tff_emnist,
    tff_emnist_writers,
)
from ebfl.fedhdp.data import NONPRIVATE, fedhdp_emnist  # noqa: E402
from ebfl.learning.torch.data import tff_emnist_federation  # noqa: E402


def _writer_data(rng, n, n_classes):
    """TFF-style samples: background 1.0, ink towards 0.0."""
    pixels = rng.uniform(0, 1, (n, 28, 28)).astype(np.float32)
    pixels[:, :3] = 1.0  # blank top rows, as background
    return pixels, rng.integers(0, n_classes, n).astype(np.int32)


def _write_tff(path, writers, *, label_shape=None, skip=None):
    """Write ``{writer: (pixels, label)}`` in TFF's layout (examples/<writer>/...)."""
    with h5py.File(path, "w") as f:
        ex = f.create_group("examples")
        for wid, (pixels, label) in writers.items():
            g = ex.create_group(wid)
            if skip != "pixels":
                g.create_dataset("pixels", data=pixels)
            if skip != "label":
                lab = label if label_shape is None else label.reshape(label_shape(label))
                g.create_dataset("label", data=lab)
    return path


@pytest.fixture()
def tff_dir(tmp_path):
    """Digits-only train/test files: 4 writers in train, 3 in test (f0003 has no test data),
    written in unsorted order; plus the 62-class pair."""
    rng = np.random.default_rng(0)
    sizes = {"f0002_11": (5, 2), "f0000_07": (3, 1), "f0003_40": (4, 0), "f0001_02": (6, 3)}
    content = {}
    for split, k in (("train", 0), ("test", 1)):
        content[split] = {w: _writer_data(rng, n[k], 10) for w, n in sizes.items() if n[k]}
        _write_tff(tmp_path / TFF_EMNIST_FILES[(True, split)], content[split])
    for split in ("train", "test"):
        content[f"all_{split}"] = {w: _writer_data(rng, 4, 62) for w in ("a", "b")}
        _write_tff(tmp_path / TFF_EMNIST_FILES[(False, split)], content[f"all_{split}"])
    return tmp_path, content


def test_loader_reads_writers_in_sorted_order_and_inverts_pixels(tff_dir):
    root, content = tff_dir
    data = load_tff_emnist(root, split="train")
    assert isinstance(data, TffEmnist) and data.split == "train" and data.only_digits
    assert data.writers.tolist() == ["f0000_07", "f0001_02", "f0002_11", "f0003_40"]
    assert data.n_samples == 18 and data.n_writers == 4 and data.n_classes == 10
    assert data.x.shape == (18, 28, 28) and data.x.dtype == np.float32
    assert data.y.dtype == np.int64
    assert data.writer.tolist() == [0] * 3 + [1] * 6 + [2] * 5 + [3] * 4
    for i, wid in enumerate(data.writers):
        pixels, label = content["train"][wid]
        rows = data.writer == i
        np.testing.assert_array_equal(data.x[rows], 1.0 - pixels)  # ink = 1, background = 0
        np.testing.assert_array_equal(data.y[rows], label)
    assert np.all(data.x[:, :3] == 0)  # TFF's background 1.0 is 0 here, as in MNIST
    assert data.path.endswith("fed_emnist_digitsonly_train.h5")


def test_file_path_data_home_and_max_clients(tff_dir, monkeypatch):
    root, _ = tff_dir
    by_path = load_tff_emnist(root / "fed_emnist_digitsonly_test.h5", split="test")
    assert by_path.writers.tolist() == ["f0000_07", "f0001_02", "f0002_11"]
    first2 = load_tff_emnist(root, split="train", max_clients=2)
    assert first2.writers.tolist() == ["f0000_07", "f0001_02"] and first2.n_samples == 9
    home = root / "home"
    (home / "tff-emnist").mkdir(parents=True)
    (root / "fed_emnist_train.h5").rename(home / "tff-emnist" / "fed_emnist_train.h5")
    monkeypatch.setenv("EBFL_DATA", str(home))
    full = load_tff_emnist(only_digits=False)
    assert full.writers.tolist() == ["a", "b"] and full.n_classes == 62 and full.y.max() < 62


def test_label_column_vector_is_accepted(tmp_path):
    rng = np.random.default_rng(1)
    path = _write_tff(tmp_path / "x.h5", {"w": _writer_data(rng, 3, 10)},
                      label_shape=lambda lab: (lab.size, 1))
    assert load_tff_emnist(path).y.shape == (3,)


def test_federation_keeps_writers_with_both_splits(tff_dir):
    root, content = tff_dir
    train, test = load_tff_emnist(root, split="train"), load_tff_emnist(root, split="test")
    common, train_only, test_only = tff_emnist_writers(train, test)
    assert common == ["f0000_07", "f0001_02", "f0002_11"]
    assert train_only == ["f0003_40"] and test_only == []
    data = tff_emnist_federation(train, test)
    assert data.n_clients == 3 and data.n_classes == 10
    assert data.n_train.tolist() == [3, 6, 5] and data.n_test.tolist() == [1, 3, 2]
    assert tuple(data.x_train.shape) == (3, 6, 784)
    for i, wid in enumerate(common):
        for part, x, y, n in (("train", data.x_train, data.y_train, data.n_train),
                              ("test", data.x_test, data.y_test, data.n_test)):
            pixels, label = content[part][wid]
            np.testing.assert_array_equal(x[i, : n[i]].numpy(), 1.0 - pixels.reshape(-1, 784))
            np.testing.assert_array_equal(y[i, : n[i]].numpy(), label)
    images = tff_emnist_federation(train, test, flatten=False)
    assert tuple(images.x_test.shape) == (3, 3, 28, 28)


def test_federation_groups_writers_even_when_samples_are_not_sorted():
    w = np.array([1, 0, 1, 0])
    y = np.array([5, 6, 7, 8])
    x = np.arange(4, dtype=np.float32)[:, None, None] * np.ones((4, 28, 28), np.float32) / 4
    train = TffEmnist(x, y, w, np.array(["p", "q"]), True, "train", "-")
    data = tff_emnist_federation(train, train)
    assert data.y_train[:, :2].tolist() == [[6, 8], [5, 7]]


def test_fedhdp_emnist_builds_groups_and_the_server_test_set(tff_dir):
    root, content = tff_dir
    fed = fedhdp_emnist(root, nonprivate_fraction=1 / 3, seed=0)
    assert fed.name == "fmnist" and fed.n_clients == 3 and fed.client_digit is None
    assert np.sum(fed.groups == NONPRIVATE) == 1
    # the server's test set is the union of the clients' test sets (6 samples)
    assert fed.x_server_test.shape == (6, 784)
    expected = np.concatenate([content["test"][w][1] for w in ("f0000_07", "f0001_02",
                                                               "f0002_11")])
    np.testing.assert_array_equal(fed.y_server_test, expected)
    assert fed.to_dict()["n_nonprivate"] == 1
    femnist = fedhdp_emnist(root, only_digits=False, flatten=False)
    assert femnist.name == "femnist" and femnist.data.n_classes == 62
    assert femnist.x_server_test.shape == (8, 28, 28)


# -- errors name the file -----------------------------------------------------------------------

def test_missing_file_names_the_path_and_the_archive(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"fed_emnist_digitsonly_test\.h5.*"
                                                r"fed_emnist_digitsonly\.tar\.bz2"):
        load_tff_emnist(tmp_path, split="test")
    with pytest.raises(FileNotFoundError, match="nothere.h5"):
        load_tff_emnist(tmp_path / "nothere.h5")


def test_not_hdf5_or_wrong_layout(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"this is not HDF5")
    with pytest.raises(ValueError, match=r"bad\.h5 is not a readable HDF5 file"):
        load_tff_emnist(bad)
    with h5py.File(tmp_path / "nogroup.h5", "w") as f:
        f.create_dataset("pixels", data=np.zeros((1, 28, 28), np.float32))
    with pytest.raises(ValueError, match=r"nogroup\.h5 has no group 'examples'"):
        load_tff_emnist(tmp_path / "nogroup.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f.create_group("examples")
    with pytest.raises(ValueError, match=r"empty\.h5 holds no samples"):
        load_tff_emnist(tmp_path / "empty.h5")


@pytest.mark.parametrize("mutate,match", [
    (dict(skip="label"), r"writer 'w' has no dataset 'label'"),
    (dict(skip="pixels"), r"writer 'w' has no dataset 'pixels'"),
    (dict(pixels=np.zeros((2, 27, 28), np.float32)), r"pixels must be floats of shape \(n, 28"),
    (dict(pixels=np.zeros((2, 28, 28), np.uint8)), "pixels must be floats"),
    (dict(pixels=np.full((2, 28, 28), 2.0, np.float32)), r"pixels must be finite and in \[0, 1\]"),
    (dict(pixels=np.full((2, 28, 28), np.nan, np.float32)), "pixels must be finite"),
    (dict(label=np.array([1, 2, 3])), "has 2 images but 3 labels"),
    (dict(label=np.array([1.0, 2.0])), "label must be integers"),
    (dict(label=np.array([3, 40])), r"labels must lie in 0\.\.9 \(only_digits=True; pass "
                                    r"only_digits=False"),
])
def test_malformed_writer_names_file_and_writer(tmp_path, mutate, match):
    pixels = mutate.get("pixels", np.ones((2, 28, 28), np.float32))
    label = mutate.get("label", np.array([1, 2], np.int32))
    path = _write_tff(tmp_path / "m.h5", {"w": (pixels, label)}, skip=mutate.get("skip"))
    with pytest.raises(ValueError, match=match) as info:
        load_tff_emnist(path)
    assert str(info.value).startswith(f"{path}: writer 'w'")


def test_bad_arguments(tff_dir):
    root, _ = tff_dir
    with pytest.raises(ValueError, match="split"):
        load_tff_emnist(root, split="validation")
    with pytest.raises(TypeError, match="only_digits"):
        load_tff_emnist(root, only_digits=1)
    with pytest.raises(ValueError, match="max_clients"):
        load_tff_emnist(root, max_clients=0)
    train = load_tff_emnist(root)
    with pytest.raises(TypeError, match="test must be a TffEmnist"):
        tff_emnist_federation(train, {"x": 1})
    with pytest.raises(ValueError, match="both be digits only"):
        tff_emnist_federation(train, load_tff_emnist(root, only_digits=False, split="test"))
    with pytest.raises(ValueError, match="disagree"):
        TffEmnist(np.zeros((2, 28, 28), np.float32), np.zeros(3, np.int64), np.zeros(2, np.int64),
                  np.array(["a"]), True, "train", "-")
    with pytest.raises(ValueError, match="y must lie in 0..9"):
        TffEmnist(np.zeros((1, 28, 28), np.float32), np.array([12]), np.zeros(1, np.int64),
                  np.array(["a"]), True, "train", "-")
