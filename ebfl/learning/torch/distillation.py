"""Server-side ensemble distillation, and the frozen-backbone helpers of adapter training.

The server step of PerAda (:class:`ebfl.perada.algorithm.PerAda`) and of FedDF
(:class:`~ebfl.learning.torch.baselines.FedDF`): the student w is pulled toward the
mean of the selected clients' logits on unlabeled data D_aux,
``KL(softmax(mean_m f(theta_m, x)/T) || softmax(f(w, x)/T))``
(:func:`ensemble_logits`, :func:`kd_batches`, :func:`distill`,
:class:`ServerDistillation`); and what every strategy that trains a few tensors on a
frozen pretrained backbone shares: the trainable set and the pretrained tensors
(:func:`check_trainable`, :func:`check_pretrained`, :func:`check_state_names`), BatchNorm
statistics frozen with the backbone (:func:`frozen_batchnorm_eval`) and the adapters'
dropout keys (:func:`redraw_dropout_keys`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch.func import functional_call

from ebfl._validation import (
    check_choice,
    check_int_scalar,
    check_positive_scalar,
    check_real_scalar,
    check_string_list,
)
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.learning.torch.functional import (
    buffer_names,
    check_labels,
    client_forward,
    clone_params,
    eval_mode,
    model_device,
    train_mode,
)

__all__ = ["DROPOUT_KEY", "DROPOUT_KEY_RANGE", "ServerDistillation", "check_pretrained",
           "check_state_names", "check_trainable", "distill", "ensemble_logits",
           "frozen_batchnorm_eval", "kd_batches", "redraw_dropout_keys"]

#: The adapters' dropout key (a float buffer of ebfl's adapter models), redrawn per step.
DROPOUT_KEY = "dropout_key"
#: Keys are drawn below 2^31 so that they are exact in float64 and in the hash.
DROPOUT_KEY_RANGE = 2**31 - 1
#: Aux samples per vectorized teacher forward pass.
_TEACHER_CHUNK = 512
#: Most distillation steps per call: each step's index batch is kept in a list.
MAX_KD_STEPS = 10**6
#: Most samples :func:`kd_batches` permutes (a permutation of 2^27 int64 indices is 1 GiB).
MAX_KD_SAMPLES = 2**27
#: Accepted range of the distillation temperature: logits / T must stay finite.
TEMPERATURE_RANGE = (1e-3, 1e3)


def frozen_batchnorm_eval(model, trainable):
    """Train mode, except BatchNorm layers none of whose tensors are in ``trainable``.

    A frozen BatchNorm (the backbone's downsample BNs under adapters) keeps the
    pretrained running statistics and normalizes with them: it belongs to the
    fixed backbone u, and in train mode it would both use batch statistics and
    rewrite statistics that are neither trained nor communicated.

    Parameters
    ----------
    model : nn.Module
    trainable : iterable of str
        State names (parameters and buffers) of ``model``.

    Returns
    -------
    context manager
        The previous modes are restored on exit.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    trainable = check_string_list(trainable, "trainable", what="state name")
    known = set(model.state_dict())
    unknown = [n for n in trainable if n not in known]
    if unknown:
        raise ValueError(f"trainable holds names that are not state names of model: "
                         f"{unknown[:5]}")
    return _frozen_batchnorm_eval(model, set(trainable))


@contextlib.contextmanager
def _frozen_batchnorm_eval(model, trainable):
    with train_mode(model):
        for prefix, module in model.named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                names = [f"{prefix}.{n}" for n, _ in module.named_parameters(recurse=False)]
                names += [f"{prefix}.{n}" for n, _ in module.named_buffers(recurse=False)]
                if not any(n in trainable for n in names):
                    module.eval()
        yield model


def ensemble_logits(model, teachers, x, *, frozen=None, chunk=_TEACHER_CHUNK):
    """The mean over the K stacked ``teachers`` of their logits on the inputs ``x`` (n, ...).

    Teachers run in eval mode (their own BatchNorm statistics, no dropout).

    Parameters
    ----------
    model : nn.Module
    teachers : dict name -> Tensor (K, ...)
        K >= 1 stacked states (parameters and float buffers of ``model``), finite.
    x : Tensor (n, ...)
        Inputs the model accepts, finite.
    frozen : dict name -> Tensor, optional
        Tensors shared by every teacher.
    chunk : int
        Samples per vectorized forward pass.

    Returns
    -------
    Tensor (n, n_classes)
    """
    _module_iv(model)
    teachers = _state_iv(teachers, "teachers", model, stacked=True)
    frozen = None if frozen is None else _state_iv(frozen, "frozen", model)
    _inputs_iv(x, "x", model)
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    return _ensemble_logits(model, teachers, x, frozen, chunk)


@torch.no_grad()
def _ensemble_logits(model, teachers, x, frozen=None, chunk=_TEACHER_CHUNK):
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
    permutations of ``range(n)`` (a fresh permutation when one runs out).

    Parameters
    ----------
    n : int
        Samples, in [1, 2^27].
    steps : int
        In [0, 10^6].
    batch_size : int
        In [1, n].
    generator : torch.Generator or None
        The stream of the permutations (None: torch's global one).

    Returns
    -------
    list of Tensor
        ``steps`` int64 index tensors of ``batch_size`` entries each.
    """
    n = check_int_scalar(n, "n", minimum=1, maximum=MAX_KD_SAMPLES)
    steps = check_int_scalar(steps, "steps", minimum=0, maximum=MAX_KD_STEPS)
    batch_size = check_int_scalar(batch_size, "batch_size", minimum=1, maximum=n)
    _generator_iv(generator)
    return _kd_batches(n, steps, batch_size, generator)


def _kd_batches(n, steps, batch_size, generator):
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
        One model's trainable state (parameters and float buffers, finite); not modified.
    teacher_logits : Tensor (n_aux, n_classes)
        The teachers' (mean) logits on ``aux`` (only the rows in ``batches`` are read).
    aux : Tensor (n_aux, ...)
        Unlabeled distillation inputs (finite, accepted by ``model``).
    steps : int
        R, in [0, 10^6].
    lr : float
        eta_a.
    batch_size : int
        In [1, n_aux]: batches are consecutive slices of seeded permutations of ``aux``.
    generator : torch.Generator, optional
        The server's stream of the round (draws the batches unless given).
    temperature : float
        In [1e-3, 1e3].
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
        The steps' index batches (default: :func:`kd_batches` from ``generator``):
        ``steps`` non-empty 1-D integer tensors indexing ``aux``.

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
    _module_iv(model)
    student = _state_iv(student, "student", model)
    shared = {} if frozen is None else _state_iv(frozen, "frozen", model)
    n_classes = _inputs_iv(aux, "aux", model)
    n_aux = aux.shape[0]
    _logits_iv(teacher_logits, "teacher_logits", n_aux, n_classes)
    lr = check_positive_scalar(lr, "lr")
    temperature = _temperature_iv(temperature)
    optimizer = check_choice(optimizer, "optimizer", ("sgd", "adam"))
    validation = _validation_iv(validation, model, aux, "validation")
    eval_every = check_int_scalar(eval_every, "eval_every", minimum=1)
    if patience is not None:
        patience = check_int_scalar(patience, "patience", minimum=1)
        if validation is None:
            raise ValueError("patience needs validation (labelled data to score the student "
                             "on)")
    if batches is None:
        batches = kd_batches(n_aux, steps, batch_size, generator)
    else:
        steps = check_int_scalar(steps, "steps", minimum=0, maximum=MAX_KD_STEPS)
        check_int_scalar(batch_size, "batch_size", minimum=1)
        _generator_iv(generator)
        batches = _batches_iv(batches, n_aux)
        if len(batches) != steps:
            raise ValueError(f"steps must equal the number of batches given, {len(batches)}; "
                             f"got {steps}")
    return _distill(model, student, teacher_logits, aux, batches, lr, temperature, optimizer,
                    shared, validation, eval_every, patience)


def _distill(model, student, teacher_logits, aux, batches, lr, temperature, optimizer, shared,
             validation, eval_every, patience):
    """:func:`distill` on checked arguments."""
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
            if not math.isfinite(last):
                # the student has left float range: further steps only spread the NaN
                cause = ("the student's logits overflow before any update" if step == 1
                         else f"distillation diverged; lower lr (lr={lr:g})")
                warnings.warn(f"the distillation loss is {last} at step {step}: {cause}",
                              RuntimeWarning, stacklevel=3)
                break
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
        self.aux = _aux_iv(aux, self.model)
        self.kd_steps = check_int_scalar(kd_steps, "kd_steps", minimum=0, maximum=MAX_KD_STEPS)
        self.kd_lr = check_positive_scalar(kd_lr, "kd_lr")
        self.kd_batch_size = check_int_scalar(kd_batch_size, "kd_batch_size", minimum=1)
        self.kd_optimizer = check_choice(kd_optimizer, "kd_optimizer", ("sgd", "adam"))
        self.temperature = _temperature_iv(temperature)
        self.kd_rounds = (None if kd_rounds is None
                          else check_int_scalar(kd_rounds, "kd_rounds", minimum=0))
        self.kd_validation = _validation_iv(kd_validation, self.model, self.aux,
                                            "kd_validation")
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

    def init_clients(self, run, data, clients):
        """Check that the distillation data are inputs of the clients' shape (a model with
        global pooling accepts images of any size, so its forward pass cannot tell)."""
        features = tuple(data.x_train.shape[2:])
        for name, x in (("aux", self.aux),
                        ("kd_validation", None if self.kd_validation is None
                         else self.kd_validation[0])):
            if x is not None and not _same_inputs(tuple(x.shape[1:]), features):
                raise ValueError(f"{name} must hold inputs shaped as the clients' "
                                 f"{features}, got {tuple(x.shape[1:])}")
        return super().init_clients(run, data, clients)

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
        batches = _kd_batches(len(self.aux), self.kd_steps, batch, gen)
        # the teachers' logits on the aux samples this round's steps read, not all of D_aux
        used = torch.unique(torch.cat(batches))
        logits = _ensemble_logits(self.model, teachers, self.aux[used], frozen=frozen)
        if not bool(torch.isfinite(logits).all()):
            # nothing to distill toward: the round's models overflow (say so, do not hide it)
            warnings.warn(f"round {rc.round}: the clients' models give NaN or infinite logits "
                          "on aux (local training diverged: lower lr or lr_personal); the "
                          "average is kept without distillation", RuntimeWarning, stacklevel=3)
            nan = torch.tensor(float("nan"))
            return average, {"kd_loss_start": nan, "kd_loss_end": nan,
                             "kd_steps": torch.tensor(0.0), "kd_best_step": torch.tensor(0.0)}
        teacher = logits.new_zeros((len(self.aux), logits.shape[1]))
        teacher[used] = logits
        student, info = _distill(
            self.model, average, teacher, self.aux, batches, self.kd_lr, self.temperature,
            self.kd_optimizer, {} if frozen is None else frozen, self.kd_validation,
            self.kd_eval_every, self.kd_patience)
        return student, {k: torch.tensor(float(v)) for k, v in info.items()}

    def summary(self, server):
        return {k: float(v) for k, v in server.get("kd", {}).items()}


def redraw_dropout_keys(stack, rng):
    """Draw a fresh dropout key per client (in place), each from its own stream ``rng``.

    From its own stream (the adapters' dropout masks
    are a hash of the key: the same whether a client runs alone or stacked, and on
    every device, since the keys are drawn on the CPU)."""
    if DROPOUT_KEY in stack:
        keys = [int(torch.randint(DROPOUT_KEY_RANGE, (1,), generator=g)) for g in rng]
        old = stack[DROPOUT_KEY]
        stack[DROPOUT_KEY] = torch.tensor(keys, dtype=old.dtype, device=old.device)


def check_trainable(model, trainable):
    """The names trained on a frozen backbone: ``trainable``, or the model's adapter group
    when None; every name a parameter or float buffer, at least one a parameter; the
    dropout key added when the model has one."""
    state = set(dict(model.named_parameters())) | set(buffer_names(model))
    if trainable is None:
        from ebfl.learning.torch.adapters import parameter_groups

        trainable = list(parameter_groups(model)["adapter"])
    trainable = list(dict.fromkeys(check_string_list(trainable, "trainable", what="state name")))
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


def _state_shapes(model):
    """Shape and dtype of every parameter and float buffer of ``model``."""
    out = {n: (tuple(t.shape), t.dtype) for n, t in model.named_parameters()}
    out.update({n: (tuple(b.shape), b.dtype) for n, b in model.named_buffers()
                if b.is_floating_point()})
    return out


def _finite_iv(tensor, name):
    bad = int(tensor.numel() - torch.isfinite(tensor).sum())
    if bad:
        raise ValueError(f"{name} must be finite; it has {bad} NaN or infinite value(s)")


def check_state_names(pretrained, names):
    """Refuse keys of ``pretrained`` that are not strings or not among ``names`` (the
    model's parameters and float buffers): the state dict of another architecture."""
    wrong = [n for n in pretrained if not isinstance(n, str)]
    if wrong:
        raise TypeError(f"pretrained must map state names (strings) to tensors, got key "
                        f"{wrong[0]!r}")
    # torchvision checkpoints carry BatchNorm counters, which ebfl's models do not keep
    unknown = [n for n in pretrained if n not in names and not n.endswith("num_batches_tracked")]
    if unknown:
        raise ValueError(f"pretrained holds names that are not parameters or float buffers "
                         f"of model: {unknown[:5]} ({len(unknown)} in all; the state dict of "
                         "another architecture?)")


def check_pretrained(model, pretrained, trainable):
    """Check ``pretrained`` against ``model``; returns the tensors that start the model.

    As the model's dtypes: every frozen tensor, finite and of the model's shape; a
    trainable one of another shape (a head for other classes) is left out, to be drawn
    fresh."""
    if not isinstance(pretrained, Mapping):
        raise TypeError(f"pretrained must be a dict name -> Tensor, got "
                        f"{type(pretrained).__name__}")
    shapes = _state_shapes(model)
    check_state_names(pretrained, shapes)
    missing = [n for n in shapes if n not in trainable and n not in pretrained]
    if missing:
        raise ValueError(f"pretrained lacks frozen backbone tensors {missing[:5]} "
                         f"({len(missing)} in all): it must hold every tensor outside the "
                         "trainable adapter set")
    out = {}
    for n, t in pretrained.items():
        if n not in shapes:
            continue  # a num_batches_tracked counter
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"pretrained[{n!r}] must be a floating-point Tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        shape, dtype = shapes[n]
        if tuple(t.shape) != shape:
            if n in trainable:
                continue  # a head of another size: freshly initialized instead
            raise ValueError(f"pretrained[{n!r}] has shape {tuple(t.shape)}, model needs "
                             f"{shape}")
        _finite_iv(t, f"pretrained[{n!r}]")
        out[n] = t.detach().to(dtype).clone()
    return out


def _module_iv(model):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def _state_iv(state, name, model, *, stacked=False):
    """A dict of the model's parameters or float buffers, each finite and of the model's
    shape (with a leading axis of K >= 1 rows, the same for all, when ``stacked``)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{name} must be a dict name -> Tensor, got {type(state).__name__}")
    if not state:
        raise ValueError(f"{name} must hold at least one tensor")
    shapes = _state_shapes(model)
    rows = None
    for n, t in state.items():
        if not isinstance(n, str) or n not in shapes:
            raise ValueError(f"{name} has {n!r}, which is not a parameter or float buffer of "
                             "model")
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}[{n!r}] must be a floating-point Tensor")
        shape = tuple(t.shape[1:]) if stacked else tuple(t.shape)
        if shape != shapes[n][0] or (stacked and t.dim() == 0):
            want = f"(K, {', '.join(map(str, shapes[n][0]))})" if stacked else shapes[n][0]
            raise ValueError(f"{name}[{n!r}] must have shape {want}, got {tuple(t.shape)}")
        if stacked:
            if rows is None:
                rows = t.shape[0]
            if t.shape[0] != rows or rows < 1:
                raise ValueError(f"{name} must stack the same number K >= 1 of rows in every "
                                 f"tensor; {n!r} has {t.shape[0]}, others {rows}")
        _finite_iv(t, f"{name}[{n!r}]")
    return dict(state)


def _same_inputs(a, b):
    """Whether two per-sample input shapes are the same (a 2-D image is one channel)."""
    return a == b or (len(a) == 2 and (1, *a) == b) or (len(b) == 2 and (1, *b) == a)


@torch.no_grad()
def _inputs_iv(x, name, model):
    """Check a floating, finite batch of inputs (n >= 1, ...) that ``model`` accepts; return
    the number of classes of its logits (one forward pass on one sample, in eval mode)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point Tensor of inputs (n, ...), got "
                        f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dim() < 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must have shape (n, ...) with n >= 1, got {tuple(x.shape)}")
    _finite_iv(x, name)
    try:
        with eval_mode(model):
            out = model(x[:1].to(model_device(model)))
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        detail = " ".join(str(exc).split())[:160]
        raise ValueError(f"{name}: model does not accept inputs of shape "
                         f"{tuple(x.shape[1:])} (torch: {detail})") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 1:
        raise ValueError(f"model must return (n, n_classes) logits; on {name} it returned "
                         f"{getattr(out, 'shape', type(out).__name__)}")
    return int(out.shape[1])


def _logits_iv(logits, name, n, n_classes):
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point Tensor (n_aux, n_classes)")
    if tuple(logits.shape) != (n, n_classes):
        raise ValueError(f"{name} must have shape (n_aux, n_classes) = ({n}, {n_classes}), "
                         f"got {tuple(logits.shape)}")
    _finite_iv(logits, name)


def _temperature_iv(temperature):
    lo, hi = TEMPERATURE_RANGE
    return check_real_scalar(temperature, "temperature", low=lo, high=hi)


def _generator_iv(generator):
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator, got "
                        f"{type(generator).__name__}")


def _batches_iv(batches, n):
    """A list of non-empty 1-D integer index tensors into ``range(n)``."""
    if isinstance(batches, torch.Tensor) or not isinstance(batches, list | tuple):
        raise TypeError(f"batches must be a list of 1-D integer index Tensors, got "
                        f"{type(batches).__name__}")
    if len(batches) > MAX_KD_STEPS:
        raise ValueError(f"batches must hold at most {MAX_KD_STEPS} steps, got {len(batches)}")
    for i, idx in enumerate(batches):
        if (not isinstance(idx, torch.Tensor) or idx.is_floating_point() or idx.is_complex()
                or idx.dtype == torch.bool):
            raise TypeError(f"batches[{i}] must be a 1-D integer index Tensor")
        if idx.dim() != 1 or idx.numel() < 1:
            raise ValueError(f"batches[{i}] must be a non-empty 1-D index Tensor, got shape "
                             f"{tuple(idx.shape)}")
        if int(idx.min()) < 0 or int(idx.max()) >= n:
            raise ValueError(f"batches[{i}] must index aux's {n} samples, in [0, {n - 1}]; "
                             f"got values from {int(idx.min())} to {int(idx.max())}")
    return list(batches)


def _aux_iv(aux, model):
    if aux is None:
        return None
    _inputs_iv(aux, "aux", model)
    return aux


def _validation_iv(validation, model, aux, name):
    """Labelled data (x, y): inputs as ``aux``'s, labels integers in [0, n_classes)."""
    if validation is None:
        return None
    if isinstance(validation, torch.Tensor) or not isinstance(validation, tuple | list) or len(
            validation) != 2:
        raise TypeError(f"{name} must be a pair (x, y) of Tensors")
    x, y = validation
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a pair (x, y) of Tensors; y is a {type(y).__name__}")
    n_classes = _inputs_iv(x, f"{name}[0] (x)", model)
    if aux is not None and not _same_inputs(tuple(x.shape[1:]), tuple(aux.shape[1:])):
        raise ValueError(f"{name}[0] (x) must hold inputs shaped as aux's "
                         f"{tuple(aux.shape[1:])}, got {tuple(x.shape[1:])}")
    return x, check_labels(y, f"{name}[1] (y)", x.shape[0], n_classes)
