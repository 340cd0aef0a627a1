"""pfl's side of ``bench_pfl.py``: one FedAvg simulation with pfl 0.6.0's PyTorch backend.

Run by the pfl virtual environment's python (pfl is never a dependency of ebfl, and
this file imports nothing from ebfl), as ``python _pfl_runner.py IN.npz OUT.npz``.
``IN.npz`` (written by ``bench_pfl.py``) holds the clients' data, the initial
weights under ``init/<name>``, a ``config`` JSON string and, with same-batches,
the engine's schedule (``schedule_clients`` (R, K) and ``schedule_idx`` (R, K,
steps x batch)). ``OUT.npz`` receives the final weights (``final/<name>``) and the
initial model's logits on a few test images (``init_logits``: the caller checks that
this network computes what ebfl's does). One JSON line on stdout gives ``marks``:
the clocks (``time.perf_counter``, ``time.process_time``) when training began and
after each central iteration, from a pfl callback.

pfl is configured for one process on the CPU: the simulated backend with no
postprocessor (no DP, no weighting: the clients' updates are averaged, which equals
FedAvg's data-size weighting here since every client has as many samples), a
``torch.optim.SGD`` local optimizer (created anew for each client, as pfl does) and
a central ``torch.optim.SGD`` at learning rate 1 (the model plus the mean update, i.e.
the mean of the clients' models), no validation cohort, no central evaluation, and no
metrics sent to the platform (pfl would print every round's metrics). pfl evaluates
each client before and after training on central iterations that are multiples of
``evaluation_frequency``; it is set to the number of rounds, so only the first round
does (the caller discards it as warm-up). Denormals are flushed, as ebfl's ``train``
does for its own runs, so that the two differ in the framework and not in that flag.
"""

import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class _PflModule(nn.Module):
    """The two methods pfl's ``PyTorchModel`` calls on the module besides ``forward``."""

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # noqa: A002, ARG002 - pfl's keyword
        from pfl.metrics import Weighted

        self.eval()
        logits = self(x)
        n = len(y)
        return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), n),
                "accuracy": Weighted(float((logits.argmax(1) == y).sum()), n)}


class MLP(_PflModule):
    """``ebfl.learning.torch.MLP(784, 10)``: the same layers under the same names."""

    def __init__(self, hidden=(200, 200)):
        super().__init__()
        layers, width = [nn.Flatten()], 784
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CNN5(_PflModule):
    """``ebfl.learning.torch.CNN5()``: the same layers under the same names."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x):
        if x.dim() == 3:
            x = x.unsqueeze(1)
        return self.classifier(self.features(x))


def _federated_data(z, cfg):
    """pfl's federated dataset: each client's fixed data (pfl's usual set-up), or with
    same-batches each (round, client) user holding the engine's minibatches in order."""
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler

    x, y = torch.from_numpy(z["x_train"]), torch.from_numpy(z["y_train"])
    if not cfg["same_batches"]:
        # Views, no copies: pfl slices each user's tensors into batches in stored order
        # (one epoch = 60 steps of 10); minimize_reuse never samples a client twice in a
        # round, as the engine's sampling without replacement.
        data = {c: (x[c], y[c]) for c in range(x.shape[0])}
        return FederatedDataset.from_slices(data, get_user_sampler("minimize_reuse",
                                                                   list(data)))
    clients = z["schedule_clients"]
    idx = torch.from_numpy(z["schedule_idx"])
    order = iter([(r, j) for r in range(clients.shape[0]) for j in range(clients.shape[1])])

    def make(key):
        r, j = key
        c = int(clients[r, j])
        return Dataset((x[c][idx[r, j]], y[c][idx[r, j]]), user_id=f"{r}:{c}")

    return FederatedDataset(make, lambda: next(order))


def _round_clock():
    """(a list, a pfl callback that appends the wall and CPU clocks to it when training
    begins and after every central iteration)."""
    from pfl.callback.base import TrainingProcessCallback
    from pfl.metrics import Metrics

    marks = []

    class RoundClock(TrainingProcessCallback):
        def on_train_begin(self, *, model):  # noqa: ARG002
            marks.append((time.perf_counter(), time.process_time()))
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *,  # noqa: ARG002
                                    central_iteration):  # noqa: ARG002
            marks.append((time.perf_counter(), time.process_time()))
            return False, Metrics()

    return marks, RoundClock()


def main(argv):
    src, dst = argv
    z = np.load(src)
    cfg = json.loads(str(z["config"]))
    os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")  # pfl would take a GPU if it saw one
    torch.set_num_threads(cfg["threads"])
    torch.set_flush_denormal(True)
    # pfl's samplers and its algorithm draw from numpy's global state.
    np.random.seed(cfg["seed"])  # noqa: NPY002
    torch.manual_seed(cfg["seed"])

    import pfl
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel

    net = {"mlp": MLP, "cnn": CNN5}[cfg["model"]]()
    init = {k[len("init/"):]: torch.from_numpy(z[k]) for k in z.files if k.startswith("init/")}
    net.load_state_dict(init, strict=True)  # same names and shapes as ebfl's model, or fail
    with torch.no_grad():
        init_logits = net.eval()(torch.from_numpy(z["x_check"])).numpy()

    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=_federated_data(z, cfg), val_data=None,
                               postprocessors=[])
    rounds = cfg["rounds"]
    algorithm_params = NNAlgorithmParams(central_num_iterations=rounds,
                                         evaluation_frequency=rounds,
                                         train_cohort_size=cfg["clients_per_round"],
                                         val_cohort_size=0)
    train_params = NNTrainHyperParams(local_learning_rate=cfg["lr"], local_num_epochs=1,
                                      local_batch_size=cfg["batch"])
    marks, clock = _round_clock()
    trained = FederatedAveraging().run(algorithm_params=algorithm_params, backend=backend,
                                       model=model, model_train_params=train_params,
                                       model_eval_params=None, callbacks=[clock],
                                       send_metrics_to_platform=False)
    final = {f"final/{k}": v.detach().cpu().numpy()
             for k, v in trained.pytorch_model.state_dict().items()}
    np.savez(dst, init_logits=init_logits, **final)
    print(json.dumps({"marks": marks, "pfl": pfl.__version__, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(sys.argv[1:])
