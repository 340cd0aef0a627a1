"""Table 1's unstated protocol: images and classes per client, and the learning-rate search.

The paper tuned every method's learning rate over a grid; ebfl chooses it on a
validation split of the training images, never on the test set.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

import ebfl.generative.adaped as adaped  # noqa: E402
from ebfl.cli import main  # noqa: E402
from tests.conftest import requires_data  # noqa: E402

# Synthetic MNIST-like labels: 10 classes of uneven sizes.
LABELS = np.repeat(np.arange(10), [130, 120, 110, 100, 140, 125, 115, 105, 135, 120])


def _split(samples, validation, classes=3, seed=0):
    return adaped._mnist_split(LABELS, 20, classes, samples, 0.2, validation,
                               np.random.default_rng(seed))


@pytest.mark.parametrize("classes", [1, 3, 5])
@pytest.mark.parametrize("samples", [None, 10, 30])
def test_clients_keep_their_classes_and_at_most_n_training_images(classes, samples):
    full_train, full_test = _split(None, False, classes)
    train, test = _split(samples, False, classes)
    for i in range(20):
        assert set(LABELS[train[i]]) == set(LABELS[full_train[i]])  # stratified: every class
        assert len(set(LABELS[full_train[i]]) | set(LABELS[test[i]])) == classes
        np.testing.assert_array_equal(test[i], full_test[i])  # the test images do not change
        assert set(train[i]) <= set(full_train[i])
        expected = len(full_train[i]) if samples is None else min(samples, len(full_train[i]))
        assert len(train[i]) == expected


@pytest.mark.parametrize("samples", [None, 12])
def test_validation_is_carved_from_the_same_training_images(samples):
    train, test = _split(samples, False)
    fit, held_out = _split(samples, True)
    for i in range(20):
        assert set(fit[i]).isdisjoint(held_out[i])
        assert set(fit[i]) | set(held_out[i]) == set(train[i])  # never a test image
        assert abs(len(held_out[i]) - adaped.VALIDATION_FRACTION * len(train[i])) <= 1


def test_the_grid_is_scored_on_the_validation_split_and_the_winner_tested(monkeypatch):
    """Each rate trains on the validation data; the best one (first on a tie) on the rest."""
    calls = []
    score = {0.2: 0.50, 0.1: 0.70, 0.05: 0.70}  # 0.1 and 0.05 tie: the grid's first wins

    def fake_load(dataset, *, seed=0, validation=False, **kwargs):
        data = SimpleNamespace(n_clients=50, role="validation" if validation else "test")
        return data, (lambda: None), {"clients": 50, "split": "fake"}

    def fake_train(registry, make_model, name, clients, lr, every, **kwargs):
        calls.append((name, clients.role, lr))
        accuracy = score[lr] if clients.role == "validation" else 0.9
        return SimpleNamespace(accuracy=np.array([accuracy]), seconds=1.0,
                               history=[{"round": 1, "accuracy": accuracy}])

    monkeypatch.setattr(adaped, "load_clients", fake_load)
    monkeypatch.setattr(adaped, "_train_table1", fake_train)
    out = adaped.table1("mnist", methods=("FedAvg", "pFedMe"), seeds=(0, 1), quick=True,
                        lr_grid=(0.2, 0.1, 0.05))
    for name in ("FedAvg", "pFedMe"):
        runs = [c for c in calls if c[0] == name]
        assert runs == 2 * [(name, "validation", 0.2), (name, "validation", 0.1),
                            (name, "validation", 0.05), (name, "test", 0.1)]
        assert out["results"][name]["lr"] == [0.1, 0.1]
        assert out["results"][name]["lr_at_edge"] == [False, False]  # inside the grid
        assert out["results"][name]["validation"][0] == {"0.2": 50.0, "0.1": 70.0, "0.05": 70.0}
        assert out["results"][name]["selection_seconds"] == [3.0, 3.0]
    assert out["settings"]["lr_grid"] == (0.2, 0.1, 0.05)


def test_a_tuned_rate_reaches_the_methods_step_sizes():
    torch_model = pytest.importorskip("ebfl.learning.torch").MLP(4, 3, hidden=(5,))
    registry = adaped._methods()
    adaped_ = adaped._strategy(registry, "AdaPeD", torch_model, 0.075)
    assert adaped_.lr_theta == adaped_.lr_mu == 0.075
    assert adaped._strategy(registry, "FedAvg", torch_model, 0.15).lr == 0.15
    qu = adaped._strategy(registry, "QuPeD-FP", torch_model, 0.05)
    assert qu.lr_theta == qu.lr_global == 0.05
    assert adaped._strategy(registry, "FedAvg", torch_model).lr == 0.1  # the default


@pytest.mark.parametrize("kwargs, match", [
    ({"classes_per_client": 11}, "classes_per_client"),
    ({"samples_per_client": 1}, "samples_per_client"),
    ({"lr_grid": ()}, "lr_grid"),
    ({"lr_grid": (0.1, -0.1)}, "lr_grid"),
])
def test_bad_protocol_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        adaped.table1("mnist", methods=("FedAvg",), quick=True, **kwargs)


@pytest.mark.parametrize("kwargs", [{"samples_per_client": 50}, {"classes_per_client": 2},
                                    {"lr_grid": (0.1,)}])
def test_protocol_options_are_refused_for_the_natural_client_datasets(kwargs):
    with pytest.raises(ValueError, match="mnist and fashion-mnist"):
        adaped.table1("hapt", methods=("FedAvg",), quick=True, **kwargs)


def test_cli_refuses_a_bad_rate(capsys):
    assert main(["reproduce", "adaped", "--quick", "--lr-grid", "0.1", "-0.2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --lr-grid") and err.count("\n") == 1


@requires_data("mnist")
def test_cli_quick_search_on_mnist(capsys):
    code = main(["reproduce", "adaped", "--dataset", "mnist", "--quick", "--methods", "FedAvg",
                 "--samples-per-client", "20", "--classes-per-client", "2",
                 "--lr-grid", "0.1", "0.05", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    s = out["settings"]
    assert s["samples_per_client"] == 20 and s["classes_per_client"] == 2
    assert max(s["train_sizes"]) == 20
    fedavg = out["results"]["FedAvg"]
    assert fedavg["lr"][0] in (0.1, 0.05)
    assert set(fedavg["validation"][0]) == {"0.1", "0.05"}


def test_a_bare_lr_grid_is_the_papers(monkeypatch, capsys):
    seen = {}

    def fake_table1(dataset, **kwargs):
        seen.update(kwargs)
        return {"settings": {}, "results": {}, "curves": {}, "paper": {}}

    monkeypatch.setattr(adaped, "table1", fake_table1)
    assert main(["reproduce", "adaped", "--quick", "--samples-per-client", "40", "--lr-grid",
                 "--json"]) == 0
    assert seen["lr_grid"] == adaped.PAPER_LR_GRID == (0.2, 0.15, 0.125, 0.1, 0.075, 0.05)
    assert seen["samples_per_client"] == 40 and seen["classes_per_client"] == 3
    assert main(["reproduce", "adaped", "--quick", "--json"]) == 0
    assert seen["lr_grid"] is None and seen["samples_per_client"] is None


@pytest.mark.parametrize("lr, grid, edge", [(0.05, adaped.PAPER_LR_GRID, True),
                                            (0.2, adaped.PAPER_LR_GRID, True),
                                            (0.1, adaped.PAPER_LR_GRID, False),
                                            (0.1, (0.1,), False), (0.1, (0.1, 0.1), False)])
def test_a_rate_at_the_grids_edge_is_flagged(lr, grid, edge):
    assert adaped.at_grid_edge(lr, grid) is edge
