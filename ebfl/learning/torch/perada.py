"""PerAda: personalized adapters on a frozen pretrained backbone, with server distillation.

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

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ebfl._validation import (
    check_choice,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.learning.torch.functional import (
    buffer_names,
    client_forward,
    client_grad,
    clone_params,
    cross_entropy,
    eval_mode,
    fresh_params,
    replicate,
    sgd_step,
    train_mode,
)
from ebfl.learning.torch.strategies import Strategy, _model_iv

__all__ = ["PerAda", "ServerDistillation", "distill", "ensemble_logits", "frozen_batchnorm_eval",
           "kd_batches"]

#: The adapters' dropout key (a float buffer of ebfl's adapter models), redrawn per step.
DROPOUT_KEY = "dropout_key"
#: Keys are drawn below 2^31 so that they are exact in float64 and in the hash.
_KEY_RANGE = 2**31 - 1
#: Aux samples per vectorized teacher forward pass.
_TEACHER_CHUNK = 512


def _ce_loss(forward, params, x, y):
    return cross_entropy(forward(params, x), y)


@contextlib.contextmanager
def frozen_batchnorm_eval(model, trainable):
    """Train mode, except BatchNorm layers none of whose tensors are in ``trainable``.

    A frozen BatchNorm (the backbone's downsample BNs under adapters) keeps the
    pretrained running statistics and normalizes with them: it belongs to the
    fixed backbone u, and in train mode it would both use batch statistics and
    rewrite statistics that are neither trained nor communicated.
    """
    trainable = set(trainable)
    with train_mode(model):
        for prefix, module in model.named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                names = [f"{prefix}.{n}" for n, _ in module.named_parameters(recurse=False)]
                names += [f"{prefix}.{n}" for n, _ in module.named_buffers(recurse=False)]
                if not any(n in trainable for n in names):
                    module.eval()
        yield model


@torch.no_grad()
def ensemble_logits(model, teachers, x, *, frozen=None, chunk=_TEACHER_CHUNK):
    """The mean over the K stacked ``teachers`` of their logits on the inputs ``x`` (n, ...).

    Teachers run in eval mode (their own BatchNorm statistics, no dropout).
    Returns (n, n_classes).
    """
    k = next(iter(teachers.values())).shape[0]
    out = []
    with eval_mode(model):
        for lo in range(0, x.shape[0], chunk):
            xb = x[lo:lo + chunk]
            out.append(client_forward(model, teachers, xb.expand(k, *xb.shape),
                                      frozen=frozen).mean(0))
    return torch.cat(out)


def _kd_loss(teacher, student, temperature):
    """KL(softmax(teacher/T) || softmax(student/T)), summed over classes, mean over the batch."""
    log_t = F.log_softmax(teacher / temperature, dim=-1)
    log_s = F.log_softmax(student / temperature, dim=-1)
    return torch.sum(log_t.exp() * (log_t - log_s), dim=-1).mean()


def kd_batches(n, steps, batch_size, generator):
    """The index batches of ``steps`` distillation steps: consecutive slices of seeded
    permutations of ``range(n)`` (a fresh permutation when one runs out)."""
    out, order, pos = [], torch.randperm(n, generator=generator), 0
    for _ in range(steps):
        if pos + batch_size > n:
            order, pos = torch.randperm(n, generator=generator), 0
        out.append(order[pos:pos + batch_size])
        pos += batch_size
    return out


def distill(model, student, teacher_logits, aux, *, steps, lr, batch_size, generator=None,
            temperature=1.0, optimizer="sgd", frozen=None, validation=None, eval_every=1,
            patience=None, batches=None):
    """R steps of ensemble distillation of ``student`` toward fixed teacher logits.

    Parameters
    ----------
    model : nn.Module
        The architecture (every call goes through ``functional_call``).
    student : dict
        One model's trainable state (parameters and float buffers); not modified.
    teacher_logits : Tensor (n_aux, n_classes)
        The teachers' (mean) logits on ``aux`` (only the rows in ``batches`` are read).
    aux : Tensor (n_aux, ...)
        Unlabeled distillation inputs.
    steps : int
        R.
    lr : float
        eta_a.
    batch_size : int
        Batches are consecutive slices of seeded permutations of ``aux``.
    generator : torch.Generator, optional
        The server's stream of the round (draws the batches unless given).
    temperature : float
    optimizer : {"sgd", "adam"}
        "sgd": Algorithm 1's step ``w - eta_a grad``; "adam": Adam with the
        rate cosine-annealed to 0 over the R steps (the official code).
    frozen : dict, optional
        Shared tensors absent from ``student`` (the backbone).
    validation : (Tensor, Tensor), optional
        Labelled server data: the student is scored every ``eval_every``
        steps and the best one (the starting point included) is returned;
        with ``patience``, distillation stops after that many steps without
        improvement (the official code's early stopping).
    eval_every, patience : int
    batches : list of Tensor, optional
        The steps' index batches (default: :func:`kd_batches` from ``generator``).

    Returns
    -------
    (dict, dict)
        The distilled student, and diagnostics: ``kd_loss_start``, ``kd_loss_end``
        (on the steps' batches), ``kd_steps`` (taken), ``kd_best_step``.

    Notes
    -----
    The student runs in eval mode: its BatchNorm layers normalize with the
    clients' averaged running statistics, which distillation on out-of-domain
    data would otherwise overwrite with the statistics of D_aux; their affine
    parameters are trained.
    """
    shared = {} if frozen is None else frozen
    if batches is None:
        batches = kd_batches(aux.shape[0], steps, batch_size, generator)
    steps = len(batches)
    buffers = set(buffer_names(model))
    params = {n: t.detach().clone().requires_grad_(True) for n, t in student.items()
              if n not in buffers}
    state = {n: t.detach().clone() for n, t in student.items() if n in buffers}
    if optimizer == "adam":
        opt = torch.optim.Adam(list(params.values()), lr=lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    else:
        opt, schedule = torch.optim.SGD(list(params.values()), lr=lr), None

    def score():
        with torch.no_grad():
            x, y = validation
            logits = functional_call(model, (params, state, shared), (x,))
            return float((logits.argmax(-1) == y).float().mean())

    first = last = float("nan")
    taken = 0
    with eval_mode(model):
        best = (score(), 0, clone_params(params)) if validation is not None else None
        for step, idx in enumerate(batches, start=1):
            logits = functional_call(model, (params, state, shared), (aux[idx],))
            loss = _kd_loss(teacher_logits[idx], logits, temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if schedule is not None:
                schedule.step()
            taken = step
            last = float(loss.detach())
            if step == 1:
                first = last
            if best is not None and step % eval_every == 0:
                acc = score()
                if acc > best[0]:
                    best = (acc, step, clone_params(params))
                elif patience is not None and step - best[1] >= patience:
                    break
    final = best[2] if best is not None else params
    out = {**{n: t.detach().clone() for n, t in final.items()}, **state}
    info = {"kd_loss_start": first, "kd_loss_end": last, "kd_steps": taken,
            "kd_best_step": best[1] if best is not None else taken}
    return out, info


class ServerDistillation:
    """Mixin: the server's ensemble distillation of an averaged model (PerAda, FedDF).

    ``_distillation_setup`` checks and stores the settings; ``_distilled``
    distills a round's average toward the mean logits of the round's replies,
    with batches from the server's stream of the round (so both runtimes agree).
    """

    def _distillation_setup(self, aux, *, kd_steps, kd_lr, kd_batch_size, kd_optimizer,
                            temperature, kd_rounds, kd_validation, kd_patience, kd_eval_every):
        self.aux = _aux_iv(aux)
        self.kd_steps = check_int_scalar(kd_steps, "kd_steps", minimum=0)
        self.kd_lr = check_positive_scalar(kd_lr, "kd_lr")
        self.kd_batch_size = check_int_scalar(kd_batch_size, "kd_batch_size", minimum=1)
        self.kd_optimizer = check_choice(kd_optimizer, "kd_optimizer", ("sgd", "adam"))
        self.temperature = check_positive_scalar(temperature, "temperature")
        self.kd_rounds = (None if kd_rounds is None
                          else check_int_scalar(kd_rounds, "kd_rounds", minimum=0))
        self.kd_validation = _validation_iv(kd_validation)
        self.kd_patience = (None if kd_patience is None
                            else check_int_scalar(kd_patience, "kd_patience", minimum=1))
        self.kd_eval_every = check_int_scalar(kd_eval_every, "kd_eval_every", minimum=1)
        if self.kd_patience is not None and self.kd_validation is None:
            raise ValueError("kd_patience needs kd_validation (labelled server data to score "
                             "the student on)")

    def _distillation_config(self):
        return {"kd_steps": self.kd_steps if self.aux is not None else 0, "kd_lr": self.kd_lr,
                "kd_batch_size": self.kd_batch_size, "kd_optimizer": self.kd_optimizer,
                "temperature": self.temperature, "kd_rounds": self.kd_rounds,
                "n_aux": 0 if self.aux is None else len(self.aux),
                "kd_early_stopping": self.kd_patience is not None}

    def distills(self, round_):
        """Whether the server distills after round ``round_`` (0-based)."""
        return (self.aux is not None and self.kd_steps > 0
                and (self.kd_rounds is None or round_ < self.kd_rounds))

    def _distilled(self, average, teachers, rc, frozen=None):
        """(student, diagnostics as tensors): ``average`` distilled toward the mean logits of
        the stacked ``teachers`` on this round's batches of ``aux``."""
        gen = torch.Generator().manual_seed(
            stream_seed(rc.config.seed, rc.round, SERVER, "aggregate"))
        batch = min(self.kd_batch_size, len(self.aux))
        batches = kd_batches(len(self.aux), self.kd_steps, batch, gen)
        # the teachers' logits on the aux samples this round's steps read, not all of D_aux
        used = torch.unique(torch.cat(batches))
        logits = ensemble_logits(self.model, teachers, self.aux[used], frozen=frozen)
        teacher = logits.new_zeros((len(self.aux), logits.shape[1]))
        teacher[used] = logits
        student, info = distill(
            self.model, average, teacher, self.aux, steps=self.kd_steps, lr=self.kd_lr,
            batch_size=batch, batches=batches, temperature=self.temperature,
            optimizer=self.kd_optimizer, frozen=frozen, validation=self.kd_validation,
            eval_every=self.kd_eval_every, patience=self.kd_patience)
        return student, {k: torch.tensor(float(v)) for k, v in info.items()}

    def summary(self, server):
        return {k: float(v) for k, v in server.get("kd", {}).items()}


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
        (everything outside ``trainable``); entries of ``trainable`` in it
        start the adapters (e.g. the pretrained BatchNorm affine parameters),
        the others are freshly initialized from the run's seed (the adapter
        convolutions, a new head).
    lr : float
        eta_l, the local adapter's rate.
    lr_personal : float, optional
        eta_p (default: ``lr``; the official code uses one rate).
    lam : float
        lambda of the proximal term ``(lam/2)|v - w|^2``, the paper's scaling.
        The official code writes ``lam_code |v - w|^2``: its lam_code = 1.0
        (CIFAR-10, CheXpert) is lam = 2.0 here.
    aux : Tensor (n_aux, ...), optional
        Unlabeled distillation data D_aux (None: PerAda w/o KD).
    kd_steps : int
        R, distillation steps per round.
    kd_lr : float
        eta_a.
    kd_batch_size : int
    kd_optimizer : {"sgd", "adam"}
        Algorithm 1 writes SGD; the official code uses Adam with cosine annealing
        (errata [PerAda 5]).
    temperature : float
        T of the distillation loss (the paper does not state it; the code uses 1).
    kd_rounds : int, optional
        Distill only in rounds < ``kd_rounds`` (the official code: 30 on CIFAR-10);
        default: every round, as Algorithm 1.
    kd_validation : (Tensor, Tensor), optional
        Labelled server data for the best-student selection and early stopping
        of :func:`distill` (the official code's; the paper does not mention
        it, so it is off by default).
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
        self.model = _model_iv(model)
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
        self.trainable = _trainable_iv(model, trainable)
        self.pretrained = _pretrained_iv(model, pretrained, self.trainable)
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
        return {"personal": replicate(self.initial_params(run), len(clients))}

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        return {"theta": replicate(message["global"], k), "anchor": message["global"]}

    def local_step(self, work, client, x, y, scale, rng):
        frozen = self._frozen
        v, theta = client["personal"], work["theta"]
        _redraw_keys(v, rng)
        h = client_grad(self.model, _ce_loss, v, x, y, frozen=frozen)
        w = work["anchor"]
        h = {n: g + self.lam * (v[n] - w[n]) for n, g in h.items()}  # grad of (lam/2)|v - w|^2
        client["personal"] = sgd_step(v, h, self.lr_personal * scale, self.weight_decay)
        _redraw_keys(theta, rng)
        g = client_grad(self.model, _ce_loss, theta, x, y, frozen=frozen)
        work["theta"] = sgd_step(theta, g, self.lr * scale, self.weight_decay)

    def client_reply(self, work, client):
        return {"theta": work["theta"]}

    def personal(self, message, client, data):
        return client["personal"]

    def global_state(self, server):
        """The global adapter w (with :meth:`frozen`, the global model)."""
        return server["global"]


def _redraw_keys(stack, rng):
    """A fresh dropout key per client from its own stream (the adapters' dropout masks
    are a hash of the key: the same whether a client runs alone or stacked, and on
    every device, since the keys are drawn on the CPU)."""
    if DROPOUT_KEY in stack:
        keys = [int(torch.randint(_KEY_RANGE, (1,), generator=g)) for g in rng]
        old = stack[DROPOUT_KEY]
        stack[DROPOUT_KEY] = torch.tensor(keys, dtype=old.dtype, device=old.device)


def _trainable_iv(model, trainable):
    state = set(dict(model.named_parameters())) | set(buffer_names(model))
    if trainable is None:
        from ebfl.learning.torch.adapters import parameter_groups

        trainable = list(parameter_groups(model)["adapter"])
    if isinstance(trainable, str) or not hasattr(trainable, "__iter__"):
        raise TypeError(f"trainable must be a list of state names, got {trainable!r}")
    trainable = list(dict.fromkeys(trainable))
    unknown = [n for n in trainable if n not in state]
    if unknown:
        raise ValueError(f"trainable names {unknown[:5]} are not parameters or float buffers "
                         "of model")
    if DROPOUT_KEY in state and DROPOUT_KEY not in trainable:
        trainable.append(DROPOUT_KEY)  # each client's own dropout stream
    params = dict(model.named_parameters())
    if not any(n in params for n in trainable):
        raise ValueError("trainable must name at least one parameter of model")
    return trainable


def _pretrained_iv(model, pretrained, trainable):
    if not isinstance(pretrained, dict):
        raise TypeError(f"pretrained must be a dict name -> Tensor, got "
                        f"{type(pretrained).__name__}")
    shapes = {n: tuple(t.shape) for n, t in model.named_parameters()}
    shapes.update({n: tuple(b.shape) for n, b in model.named_buffers() if b.is_floating_point()})
    missing = [n for n in shapes if n not in trainable and n not in pretrained]
    if missing:
        raise ValueError(f"pretrained lacks frozen backbone tensors {missing[:5]} "
                         f"({len(missing)} in all): it must hold every tensor outside the "
                         "trainable adapter set")
    out = {}
    for n, t in pretrained.items():
        if n not in shapes:
            continue  # e.g. a head of another size, or num_batches_tracked
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"pretrained[{n!r}] must be a floating-point Tensor")
        if tuple(t.shape) != shapes[n]:
            if n in trainable:
                continue  # a head of another size: freshly initialized instead
            raise ValueError(f"pretrained[{n!r}] has shape {tuple(t.shape)}, model needs "
                             f"{shapes[n]}")
        out[n] = t.detach().clone()
    return out


def _aux_iv(aux):
    if aux is None:
        return None
    if not isinstance(aux, torch.Tensor) or not aux.is_floating_point():
        raise TypeError("aux must be a floating-point Tensor of unlabeled inputs (n_aux, ...)")
    if aux.dim() < 2 or aux.shape[0] < 1:
        raise ValueError(f"aux must have shape (n_aux, ...) with n_aux >= 1, got "
                         f"{tuple(aux.shape)}")
    if not bool(torch.isfinite(aux).all()):
        raise ValueError("aux must be finite")
    return aux


def _validation_iv(validation):
    if validation is None:
        return None
    try:
        x, y = validation
    except (TypeError, ValueError):
        raise TypeError("kd_validation must be a pair (x, y) of Tensors") from None
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError("kd_validation must be a pair (x, y) of Tensors")
    if x.shape[0] != y.shape[0] or x.shape[0] < 1:
        raise ValueError(f"kd_validation: x and y must have the same number (>= 1) of rows, "
                         f"got {x.shape[0]} and {y.shape[0]}")
    return x, y.long()
