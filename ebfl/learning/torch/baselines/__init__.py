"""Personalized-FL baselines of the paper's Table 1 and Figure 3, as federated strategies.

FedAvg + fine-tuning, Ditto, pFedMe, Per-FedAvg (first order), QuPeD without
quantization, Federated Mutual Learning, FedEM and DP-FedEM, and the full-model
baselines of PerAda (Xie et al., CVPR 2024, Tables 1 and 2): APFL and FedDF, each one
:class:`~ebfl.learning.torch.strategies.Strategy`: a server half and a client
half (:mod:`ebfl.federated.protocol`), run in process by
:func:`~ebfl.learning.torch.engine.train` (every sampled client at once, each
local step one ``torch.func.vmap`` call through
:func:`~ebfl.learning.torch.functional.client_grad`) and on Flower (one client
per call) to the same result.

Every class says what crosses the network: its *message* (server to the
sampled clients) and its *reply* (each client to the server). What a client
keeps between rounds (personal models, FedEM's mixture weights) is its
persistent state and never leaves it.

Conventions shared by all of them (the papers leave these open):

* only the sampled clients train (see :class:`PFedMe` for the exception in
  its authors' code), and the server's averages are weighted by the clients'
  training-set sizes, as :class:`~.strategies.FedAvg` here and the reference
  code the paper used (github.com/CharlieDinh/pFedMe, github.com/omarfoq/FedEM)
  do; several papers print an unweighted mean;
* weight decay applies to every gradient step on model parameters, and the
  per-epoch learning-rate decay multiplies every learning rate unless a class
  says otherwise;
* KD / KL terms are :func:`~ebfl.learning.torch.functional.distillation_kl`
  (temperature 1, summed over classes, mean over the batch);
* a model's float buffers (BatchNorm running statistics) travel in the stacks
  with its parameters: each model's statistics are updated by the train-mode
  forward passes of its own gradient steps (a forward pass that only computes a
  teacher's outputs leaves them alone), gradient and proximal terms act on
  parameters only, and the server averages buffers as it averages parameters.

Every class reports what Table 1 of PerAda counts: ``trained_parameters()``
(per client) and ``communicated_parameters()`` (per client and round, each
way), both in parameters (buffers not counted), and ``global_state()``, the
server's global model (None where there is none).

:class:`FedAvgFT` and :class:`PerFedAvg` adapt the global model on each
client's own training set at evaluation time, in ``personal(message, client,
data)``; :class:`FedEM` predicts with a mixture, through
``personal_logits(message, client, data, x)``.

Examples
--------
>>> import numpy as np
>>> from ebfl.learning.torch import FederatedDataset, LogisticModel, train
>>> from ebfl.learning.torch.baselines import Ditto
>>> rng = np.random.default_rng(0)
>>> xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(3)]
>>> ys = [(x[:, 0] > 0).astype(np.int64) for x in xs]
>>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
>>> res = train(Ditto(LogisticModel(4, 2), 0.5), data, n_rounds=2, local_steps=2, batch_size=5)
>>> sorted(res.server), sorted(res.clients), tuple(res.accuracy.shape)
(['global'], ['personal'], (3,))
"""

from ebfl.learning.torch.baselines.adaptation import full_batch_steps, minibatch_steps
from ebfl.learning.torch.baselines.distillation import FML, QuPeDFP
from ebfl.learning.torch.baselines.fedem import DPFedEM, FedEM
from ebfl.learning.torch.baselines.global_model import FedAvgFT, FedDF
from ebfl.learning.torch.baselines.local_copy import APFL, Ditto, PerFedAvg, PFedMe

__all__ = ["APFL", "FML", "DPFedEM", "Ditto", "FedAvgFT", "FedDF", "FedEM", "PFedMe", "PerFedAvg",
           "QuPeDFP", "full_batch_steps", "minibatch_steps"]
