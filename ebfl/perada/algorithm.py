"""PerAda (torch): personalized adapters on a frozen pretrained backbone, with server distillation.

PerAda (Xie et al., "PerAda: Parameter-Efficient Federated Learning
Personalization with Generalization Guarantees", CVPR 2024, Algorithm 1) keeps
a pretrained backbone u frozen and trains only a small *adapter* (residual
adapters, the BatchNorm affine parameters and the head: see
:func:`ebfl.learning.torch.adapters.parameter_groups`). Each client holds

* a personalized adapter v_m, trained on its data with the proximal pull
  ``(lam/2) |v - w|^2`` to the global adapter w (Ditto-style); it never leaves
  the client and is what the client uses;
* a local adapter theta_m, started from w each round, trained on its data and
  sent to the server.

The server averages the local adapters uniformly (``1/|S_t|``, not by data size),
then refines the average by R steps of ensemble knowledge distillation on
unlabeled data D_aux: the student w is pulled toward the mean of the selected
clients' logits, ``KL(softmax(mean_m f(theta_m, x)/T) || softmax(f(w, x)/T))``.
Without D_aux (``aux=None``) this is "PerAda w/o KD": FedAvg on adapters.
"""

from __future__ import annotations

import warnings

from ebfl._validation import (
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.learning.torch.distillation import (
    ServerDistillation,
    check_pretrained,
    check_trainable,
    frozen_batchnorm_eval,
    redraw_dropout_keys,
)
from ebfl.learning.torch.functional import (
    ce_loss,
    client_grad,
    fresh_params,
    replicate,
    sgd_step,
)
from ebfl.learning.torch.strategies import Strategy, check_model

__all__ = ["PerAda"]


class PerAda(ServerDistillation, Strategy):
    """PerAda (Xie et al., CVPR 2024, Algorithm 1) on the two-runtime protocol.

    Message: the global adapter w^t. Reply: each sampled client's local adapter
    theta_m after the round. Client state: the personalized adapter v_m
    (``personal``). Server state: w (``global``) and the last round's
    distillation diagnostics.

    Local steps: each of the ``local_steps`` iterations of a round draws one
    minibatch and takes one step on v_m (cross-entropy plus the proximal pull
    ``lam (v - w^t)``) and one on theta_m (cross-entropy), so S = E =
    ``local_steps``. The official code counts epochs instead (10 on CIFAR-10);
    pass ``local_steps = epochs * ceil(n_m / batch_size)`` for that.

    Parameters
    ----------
    model : nn.Module
        The backbone with adapters (e.g. :class:`~ebfl.learning.torch.adapters.SmallResNet`).
    pretrained : dict name -> Tensor
        The pretrained state: must hold every tensor of the frozen backbone
        (everything outside ``trainable``), finite and of the model's shape;
        entries of ``trainable`` in it start the adapters (e.g. the pretrained
        BatchNorm affine parameters), the others are freshly initialized from
        the run's seed (the adapter convolutions, a new head, or a head of
        another shape). Every name must be a state name of ``model``
        (``num_batches_tracked`` counters are ignored). Not modified.
    lr : float
        eta_l, the local adapter's rate.
    lr_personal : float, optional
        eta_p (default: ``lr``; the official code uses one rate).
    lam : float
        lambda of the proximal term ``(lam/2)|v - w|^2``, the paper's scaling.
        The official code writes ``lam_code |v - w|^2``: its lam_code = 1.0
        (CIFAR-10, CheXpert) is lam = 2.0 here.
    aux : Tensor (n_aux, ...), optional
        Unlabeled distillation data D_aux (None: PerAda w/o KD): finite inputs
        of the clients' shape (checked when training starts).
    kd_steps : int
        R, distillation steps per round, in [0, 10^6].
    kd_lr : float
        eta_a.
    kd_batch_size : int
        Samples per distillation step; a value above n_aux takes all of D_aux
        at every step.
    kd_optimizer : {"sgd", "adam"}
        Algorithm 1 writes SGD; the official code uses Adam with cosine annealing
        (errata [PerAda 5]).
    temperature : float
        T of the distillation loss, in [1e-3, 1e3] (the paper does not state it;
        the code uses 1).
    kd_rounds : int, optional
        Distill only in rounds < ``kd_rounds`` (the official code: 30 on CIFAR-10);
        default: every round, as Algorithm 1.
    kd_validation : (Tensor, Tensor), optional
        Labelled server data for the best-student selection and early stopping
        of :func:`~ebfl.learning.torch.distillation.distill` (the official code's; the paper
        does not mention it, so it is off by default): inputs as ``aux``'s, integer labels in
        [0, n_classes).
    kd_patience, kd_eval_every : int, optional
    trainable : list of str, optional
        The adapter set (default: ``parameter_groups(model)["adapter"]``).
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> from ebfl.learning.torch.functional import model_state
    >>> net = SmallResNet(n_classes=10, in_channels=1)
    >>> alg = PerAda(net, model_state(net), lr=0.05, lam=2.0)
    >>> alg.name, alg.config()["lam"]
    ('PerAda w/o KD', 2.0)
    """

    name = "PerAda"

    def __init__(self, model, pretrained, *, lr=0.01, lr_personal=None, lam=2.0, aux=None,
                 kd_steps=50, kd_lr=0.01, kd_batch_size=128, kd_optimizer="sgd",
                 temperature=1.0, kd_rounds=None, kd_validation=None, kd_patience=None,
                 kd_eval_every=1, trainable=None, weight_decay=0.0):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = (self.lr if lr_personal is None
                            else check_positive_scalar(lr_personal, "lr_personal"))
        self.lam = check_nonnegative_scalar(lam, "lam")
        if self.lr_personal * self.lam >= 2:
            # v - lr (g + lam (v - w)) multiplies v - w by 1 - lr lam: |1 - lr lam| >= 1 when
            # lr lam >= 2, so the pull to w overshoots and grows (the CPU-scale run diverged
            # at lr 0.2 with lam 20)
            warnings.warn(f"lr_personal * lam = {self.lr_personal * self.lam:g} >= 2: the "
                          "proximal step overshoots w and diverges; lower lr_personal or lam",
                          RuntimeWarning, stacklevel=2)
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.trainable = check_trainable(model, trainable)
        self.pretrained = check_pretrained(model, pretrained, self.trainable)
        self._distillation_setup(aux, kd_steps=kd_steps, kd_lr=kd_lr,
                                 kd_batch_size=kd_batch_size, kd_optimizer=kd_optimizer,
                                 temperature=temperature, kd_rounds=kd_rounds,
                                 kd_validation=kd_validation, kd_patience=kd_patience,
                                 kd_eval_every=kd_eval_every)
        if self.aux is None or self.kd_steps == 0:
            self.name = "PerAda w/o KD"
        self._frozen = {n: t for n, t in self.pretrained.items() if n not in self.trainable}

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam, "weight_decay": self.weight_decay,
                **self._distillation_config(), "trained_parameters": self.n_trainable}

    @property
    def n_trainable(self):
        """Parameters in one adapter (buffers not counted)."""
        params = dict(self.model.named_parameters())
        return sum(params[n].numel() for n in self.trainable if n in params)

    def trained_parameters(self):
        """Parameters each client trains: two adapters (Table 1's "# Trained Params")."""
        return 2 * self.n_trainable

    def communicated_parameters(self):
        """Parameters sent each way per round: one adapter (Table 1's "# Comm. Params")."""
        return self.n_trainable

    def frozen(self):
        return self._frozen

    def training(self):
        return frozen_batchnorm_eval(self.model, self.trainable)

    def initial_params(self, run):
        """w^0: the pretrained adapter tensors, the rest freshly drawn from the run's seed."""
        fresh = fresh_params(self.model, run.seed)
        return {n: (self.pretrained[n] if n in self.pretrained else fresh[n]).clone()
                for n in self.trainable}

    # --- server half -------------------------------------------------------------------------
    def init_server(self, run):
        return {"global": self.initial_params(run)}

    def broadcast(self, server, rc):
        return {"global": server["global"]}

    def evaluation_message(self, server):
        return {"global": server["global"]}

    def aggregate(self, server, replies, weights, rc):
        thetas = replies["theta"]
        average = {n: t.mean(0) for n, t in thetas.items()}  # uniform 1/|S_t| (Algorithm 1)
        if not self.distills(rc.round):
            return {"global": average}
        student, stats = self._distilled(average, thetas, rc, frozen=self._frozen)
        return {"global": student, "kd": stats}

    # --- client half -------------------------------------------------------------------------
    def init_clients(self, run, data, clients):
        super().init_clients(run, data, clients)  # the distillation data fit the clients'
        return {"personal": replicate(self.initial_params(run), len(clients))}

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        return {"theta": replicate(message["global"], k), "anchor": message["global"]}

    def local_step(self, work, client, x, y, scale, rng):
        frozen = self._frozen
        v, theta = client["personal"], work["theta"]
        redraw_dropout_keys(v, rng)
        h = client_grad(self.model, ce_loss, v, x, y, frozen=frozen)
        w = work["anchor"]
        h = {n: g + self.lam * (v[n] - w[n]) for n, g in h.items()}  # grad of (lam/2)|v - w|^2
        client["personal"] = sgd_step(v, h, self.lr_personal * scale, self.weight_decay)
        redraw_dropout_keys(theta, rng)
        g = client_grad(self.model, ce_loss, theta, x, y, frozen=frozen)
        work["theta"] = sgd_step(theta, g, self.lr * scale, self.weight_decay)

    def client_reply(self, work, client):
        return {"theta": work["theta"]}

    def personal(self, message, client, data):
        return client["personal"]

    def global_state(self, server):
        """The global adapter w (with :meth:`frozen`, the global model)."""
        return server["global"]
