"""The pretrained CPU backbone: training on a tiny synthetic set, the on-disk cache, loading."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ebfl.learning.torch.pretrain as pretrain  # noqa: E402
from ebfl.learning.torch.adapters import SmallResNet, parameter_groups  # noqa: E402
from ebfl.learning.torch.functional import eval_mode  # noqa: E402
from ebfl.learning.torch.pretrain import load_backbone, pretrained_backbone  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_data(n=96, n_test=64, seed=0):
    """Three classes that differ by which third of the image is bright: learnable fast."""
    rng = np.random.default_rng(seed)

    def make(m):
        y = rng.integers(0, 3, m)
        x = rng.integers(0, 60, (m, 28, 28)).astype(np.uint8)
        for i, label in enumerate(y):
            x[i, :, label * 9:(label + 1) * 9] += 150
        return x, y

    return (*make(n), *make(n_test))


QUICK = {"widths": (4, 8), "epochs": 6, "batch_size": 16, "lr": 1e-2}


def test_trains_learns_and_caches(tmp_path, monkeypatch):
    data = _tiny_data()
    first = pretrained_backbone(data=data, cache_dir=tmp_path, **QUICK)
    assert not first.cached and first.path.parent == tmp_path and first.path.is_file()
    assert first.path.name.startswith("perada-backbone-") and len(first.path.stem) == 16 + 16
    assert first.test_accuracy > 0.9  # chance is 1/3 on 64 test images
    assert first.seconds > 0
    model = SmallResNet(n_classes=3, widths=(4, 8), adapters=False)
    assert list(first.state) == list(model.state_dict())
    assert all(t.is_floating_point() for t in first.state.values())

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of reading the cache")

    monkeypatch.setattr(pretrain, "_train_backbone", no_training)
    again = pretrained_backbone(data=data, cache_dir=tmp_path, **QUICK)
    assert again.cached and again.path == first.path
    assert again.test_accuracy == first.test_accuracy and again.seconds == first.seconds
    assert again.config == first.config
    assert all(torch.equal(again.state[n], first.state[n]) for n in first.state)
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no temp file left


def test_reproducible_and_keyed_by_config(tmp_path):
    data = _tiny_data()
    a = pretrained_backbone(data=data, cache_dir=tmp_path / "a", **QUICK)
    b = pretrained_backbone(data=data, cache_dir=tmp_path / "b", **QUICK)
    assert a.path.name == b.path.name and not b.cached
    assert all(torch.equal(a.state[n], b.state[n]) for n in a.state)
    changes = [{"seed": 1}, {"epochs": 5}, {"n_train": 50}, {"lr": 2e-2}, {"widths": (4, 4)}]
    names = {a.path.name}
    for change in changes:
        other = pretrained_backbone(data=data, cache_dir=tmp_path / "a", **{**QUICK, **change})
        assert not other.cached
        names.add(other.path.name)
    changed_data = _tiny_data(seed=1)
    names.add(pretrained_backbone(data=changed_data, cache_dir=tmp_path / "a", **QUICK).path.name)
    assert len(names) == len(changes) + 2
    assert len(list((tmp_path / "a").iterdir())) == len(changes) + 2


def test_subset_and_global_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    out = pretrained_backbone(data=_tiny_data(), cache_dir=tmp_path, n_train=40, **QUICK)
    assert torch.equal(torch.rand(3), expected)
    assert out.config["n_train"] == 40


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_config"])
def test_corrupted_cache_is_rebuilt_with_a_warning(tmp_path, damage):
    data = _tiny_data()
    first = pretrained_backbone(data=data, cache_dir=tmp_path, **QUICK)
    raw = first.path.read_bytes()
    if damage == "truncate":
        first.path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        first.path.write_bytes(b"not a torch file")
    else:  # a readable file whose record does not belong to this configuration
        record = torch.load(first.path, weights_only=True)
        record["config"] = {**record["config"], "seed": 99}
        torch.save(record, first.path)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        again = pretrained_backbone(data=data, cache_dir=tmp_path, **QUICK)
    assert not again.cached
    assert all(torch.equal(again.state[n], first.state[n]) for n in first.state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pretrained_backbone(data=data, cache_dir=tmp_path, **QUICK).cached


def test_default_cache_dir_is_the_data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EBFL_DATA", str(tmp_path / "home"))
    out = pretrained_backbone(data=_tiny_data(), **QUICK)
    assert out.path.parent == tmp_path / "home" / "pretrained"


def test_load_backbone_under_adapters():
    source = SmallResNet(n_classes=3, widths=(4, 8), adapters=False)
    with torch.no_grad():
        for t in source.state_dict().values():
            t.uniform_(0.5, 1.5)
    model = SmallResNet(n_classes=3, widths=(4, 8))
    adapter = model.layer2[0].adapter1.conv.weight.clone()
    state = {n: t.clone() for n, t in source.state_dict().items()}
    report = load_backbone(model, state)
    assert report.head_loaded and not report.skipped
    target = model.state_dict()
    assert all(torch.equal(target[n], state[n]) for n in state)
    assert torch.equal(model.layer2[0].adapter1.conv.weight, adapter)
    assert all(torch.equal(state[n], source.state_dict()[n]) for n in state)  # not modified
    # a backbone with zeroed adapters computes exactly what the source computes
    with torch.no_grad():
        for name in parameter_groups(model)["adapter"]:
            if ".adapter" in name and name.endswith("conv.weight"):
                target[name].zero_()
    x = torch.rand(4, 28, 28)
    with eval_mode(model), eval_mode(source), torch.no_grad():
        assert torch.equal(model(x), source(x))

    other_head = SmallResNet(n_classes=5, widths=(4, 8))
    head = other_head.fc.weight.clone()
    report = load_backbone(other_head, state)
    assert not report.head_loaded and torch.equal(other_head.fc.weight, head)
    with pytest.raises(ValueError, match=r"conv1.weight.*\(8, 1, 3, 3\)"):
        load_backbone(SmallResNet(n_classes=3, widths=(8, 8)), state)
    with pytest.raises(ValueError, match="missing keys.*layer3"):
        load_backbone(SmallResNet(n_classes=3, widths=(4, 8, 8)), state)
    with pytest.raises(TypeError, match="SmallResNet"):
        load_backbone(torch.nn.Linear(2, 2), state)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dataset": "cifar"}, ValueError, "dataset"),
    ({"arch": "resnet18"}, ValueError, "arch"),
    ({"epochs": 0}, ValueError, "epochs"),
    ({"n_train": 97}, ValueError, r"n_train must be in \[1, 96\]"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"lr": -1.0}, ValueError, "lr"),
    ({"seed": -1}, ValueError, "seed"),
    ({"widths": ()}, ValueError, "widths"),
    ({"progress": "yes"}, TypeError, "progress"),
    ({"cache_dir": 3}, TypeError, "cache_dir"),
])
def test_bad_arguments_are_named(tmp_path, kwargs, error, match):
    kwargs = {"data": _tiny_data(), "cache_dir": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        pretrained_backbone(**kwargs)


def test_bad_data_is_named(tmp_path):
    x, y, xt, yt = _tiny_data()
    with pytest.raises(TypeError, match="data"):
        pretrained_backbone(data=(x, y), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="one image per label"):
        pretrained_backbone(data=(x, y[:-1], xt, yt), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="x_test"):
        pretrained_backbone(data=(x, y, xt[:, :20], yt), cache_dir=tmp_path)
    bad = x.astype(np.float32)
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        pretrained_backbone(data=(bad, y, xt, yt), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="y"):
        pretrained_backbone(data=(x, -y - 1, xt, yt), cache_dir=tmp_path)
