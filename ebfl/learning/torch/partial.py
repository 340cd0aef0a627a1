"""Partial model personalization: a shared part averaged by the server, a personal part kept.

Pillutla, Malik, Mohamed, Rabbat, Sanjabi & Xiao ("Federated learning with
partial model personalization", ICML 2022) split the model's state in two:

* a shared part u: sent to the sampled clients, trained there from the
  received u, sent back and averaged by the server, weighted by the clients'
  training-set sizes;
* a personal part v_m: client m's own, trained on its data, never sent.

Client m predicts with (u, v_m), u being the server's current shared part
(the evaluation message). Optionally some tensors are *frozen*: given
(pretrained), shared by every client's model and trained by no one.

The state is the model's parameters and float buffers (BatchNorm running
statistics, the adapters' dropout key): a buffer belongs to the part its
name is in, is updated by the train-mode forward passes of every local step
(whichever part that step trains), and is averaged with u if it is shared.
The adapters' ``dropout_key`` is always personal: each client redraws it from
its own stream before every step, so that dropout masks differ across clients
and are the same on both runtimes.

Strategies (each one :class:`~ebfl.learning.torch.strategies.Strategy`, run by
:func:`~ebfl.learning.torch.engine.train` and by Flower):

* :class:`FedAlt`: alternating updates, first the personal part, then the
  shared part (Pillutla et al.);
* :class:`FedSim`: simultaneous updates of both parts from the same gradients
  (Pillutla et al.);
* :class:`FedRep` (Collins et al. 2021): FedAlt with a personal head and many
  head steps;
* :class:`FedBN` (Li et al. 2021): personal BatchNorm layers, FedAvg on the rest;
* :class:`LGFedAvg` (Liang et al. 2020): personal feature extractor, shared head.

Table 1 of PerAda (Xie et al., CVPR 2024) compares, on a pretrained
ResNet-18, ``FedAlt(model, lr, personal="input")``, ``personal="output"``,
``personal="adapter"`` (and FedSim likewise), ``FedRep(model)``,
``FedBN(model)`` and ``LGFedAvg(model)``: the group names are those of
:func:`ebfl.learning.torch.adapters.parameter_groups`, and every strategy
reports Table 1's parameter counts (``trained_parameters()``,
``communicated_parameters()``).

On ResNet-18 with 10 classes (11,181,642 parameters) these counts are: FedBN
communicates 11,172,042 (Table 1: 11.17M), LG-FedAvg 5,130 (0.005M), FedRep
and output-layer personalization 11,176,512 (11.17M); adapter
personalization trains 12,581,962 (printed 12.59M, the sum of the rounded
11.18M and 1.41M) and communicates the backbone, 11,168,704 (printed 11.18M).
Table 1 prints 6.45M communicated parameters for the two input-layer rows:
that is an error of the table, since personalizing the input layer (the stem
``conv1`` and ``bn1``, 9,536 parameters) leaves 11,172,106 (11.17M) to
communicate.

Examples
--------
>>> import numpy as np
>>> from ebfl.learning.torch import FederatedDataset, train
>>> from ebfl.learning.torch.adapters import SmallResNet
>>> rng = np.random.default_rng(0)
>>> xs = [rng.normal(size=(12, 8, 8)).astype(np.float32) for _ in range(3)]
>>> ys = [rng.integers(0, 2, 12) for _ in range(3)]
>>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
>>> alg = FedAlt(SmallResNet(2, widths=(4,), adapters=False), 0.05, personal="output")
>>> res = train(alg, data, n_rounds=2, local_steps=2, batch_size=4)
>>> alg.name, sorted(res.server), sorted(res.clients["personal"])
('FedAlt (output layer)', ['shared'], ['fc.bias', 'fc.weight'])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ebfl._validation import check_int_scalar, check_nonnegative_scalar
from ebfl.learning.torch.distillation import (
    DROPOUT_KEY,
    check_state_names,
    frozen_batchnorm_eval,
    redraw_dropout_keys,
)
from ebfl.learning.torch.functional import (
    buffer_names,
    client_generators,
    client_grad,
    cross_entropy,
    fresh_params,
    replicate,
    sgd_step,
    train_mode,
    weighted_mean,
)
from ebfl.learning.torch.strategies import Strategy, _weights, check_model

__all__ = ["GROUPS", "FedAlt", "FedBN", "FedRep", "FedSim", "LGFedAvg"]

#: The personalized parts of Table 1 of PerAda, by group of
#: :func:`~ebfl.learning.torch.adapters.parameter_groups`, and their labels in ``name``.
GROUPS = {"input": "input layer", "output": "output layer", "adapter": "adapter",
          "bn": "batch norm", "feature_extractor": "feature extractor"}
#: Groups that ``frozen`` may also name.
_FROZEN_GROUPS = (*GROUPS, "backbone")


def _split_ce_loss(forward, params, x, y, rest):
    """Cross-entropy of the model (params, rest), differentiated with respect to ``params``."""
    return cross_entropy(forward({**params, **rest}, x), y)


class _Partial(Strategy):
    """The shared machinery: the split, the server half, the step on a chosen part.

    Message: the shared part u (``shared``). Reply: the client's u after the
    round. Client state: the personal part v_m (``personal``). Server state: u.
    """

    family = "Partial"
    #: How the arguments are called in messages (FedRep names them after the head).
    _arg_names = {"personal": "personal", "lr_personal": "lr_personal",
                  "personal_steps": "personal_steps"}

    def __init__(self, model, personal, *, lr, lr_personal, weight_decay, pretrained, frozen):
        self.model = check_model(model)
        names = _state_names(model)
        arg = self._arg_names
        self.personal_names, self.mode = _names_iv(model, personal, arg["personal"], GROUPS,
                                                   names)
        frozen_names = ([] if frozen is None else
                        _names_iv(model, frozen, "frozen", _FROZEN_GROUPS, names)[0])
        both = [n for n in self.personal_names if n in frozen_names and n != DROPOUT_KEY]
        if both:
            raise ValueError(f"{arg['personal']} and frozen must not share names; both hold "
                             f"{both[:5]}")
        if DROPOUT_KEY in names:  # each client's own dropout stream
            frozen_names = [n for n in frozen_names if n != DROPOUT_KEY]
            if DROPOUT_KEY not in self.personal_names:
                self.personal_names.append(DROPOUT_KEY)
        self.frozen_names = frozen_names
        self.shared_names = [n for n in names
                             if n not in self.personal_names and n not in frozen_names]
        _parts_iv(model, self.personal_names, self.shared_names, frozen_names, arg["personal"])
        self.pretrained = _pretrained_iv(model, pretrained, frozen_names)
        self._frozen = {n: self.pretrained[n] for n in frozen_names} or None
        self.lr = check_nonnegative_scalar(lr, "lr")
        self.lr_personal = (self.lr if lr_personal is None
                            else check_nonnegative_scalar(lr_personal, arg["lr_personal"]))
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        label = GROUPS.get(self.mode, "custom")
        self.name = f"{self.family} ({label})"

    def config(self):
        return {"name": self.name, "personal": self.mode, "frozen": self.frozen_names,
                "lr": self.lr, "lr_personal": self.lr_personal,
                "weight_decay": self.weight_decay}

    # --- Table 1's columns ----------------------------------------------------------------------
    def trained_parameters(self):
        """Parameters each client trains, u and v_m (buffers and frozen tensors not counted):
        Table 1's "# Trained Params" of PerAda.

        Examples
        --------
        >>> from ebfl.learning.torch.adapters import SmallResNet
        >>> net = SmallResNet(10, widths=(4,), adapters=False)
        >>> alg = FedAlt(net, personal="output")
        >>> alg.trained_parameters() == sum(p.numel() for p in net.parameters())
        True
        """
        return _count(self.model, self.shared_names + self.personal_names)

    def communicated_parameters(self):
        """Parameters of u, received and sent back by each sampled client per round
        (buffers not counted): Table 1's "# Comm. Params" of PerAda.

        Examples
        --------
        >>> from ebfl.learning.torch.adapters import SmallResNet
        >>> LGFedAvg(SmallResNet(10, widths=(4,), adapters=False)).communicated_parameters()
        50
        """
        return _count(self.model, self.shared_names)

    def global_state(self, server):
        """None: the personal part has no global counterpart, so the server holds no model
        that predicts by itself (only the pairs (u, v_m) do)."""
        return None

    # --- initialization -------------------------------------------------------------------------
    def initial_params(self, run):
        """u and v at the start: the run's ``init_params`` where given, else ``pretrained``,
        else a fresh initialization drawn from the run's seed (frozen tensors excluded)."""
        state = fresh_params(self.model, run.seed)
        state.update({n: t.clone() for n, t in self.pretrained.items()})
        if self.init_params is not None:
            state.update({n: t.detach().clone() for n, t in self.init_params.items()})
        return {n: state[n] for n in self.shared_names + self.personal_names}

    def frozen(self):
        return self._frozen

    def training(self):
        if self._frozen is None:
            return train_mode(self.model)
        return frozen_batchnorm_eval(self.model, self.shared_names + self.personal_names)

    # --- server half ----------------------------------------------------------------------------
    def init_server(self, run):
        init = self.initial_params(run)
        return {"shared": {n: init[n] for n in self.shared_names}}

    def broadcast(self, server, rc):
        return {"shared": server["shared"]}

    def evaluation_message(self, server):
        return {"shared": server["shared"]}

    def aggregate(self, server, replies, weights, rc):
        return {"shared": weighted_mean(replies["shared"], _weights(weights))}

    # --- client half ----------------------------------------------------------------------------
    def init_clients(self, run, data, clients):
        init = self.initial_params(run)
        return {"personal": replicate({n: init[n] for n in self.personal_names}, len(clients))}

    def client_begin(self, message, client, rc):
        return {"shared": replicate(message["shared"], rc.clients.size)}

    def client_reply(self, work, client):
        return {"shared": work["shared"]}

    def personal(self, message, client, data):
        return {**replicate(message["shared"], data.n_clients), **client["personal"]}

    def sgd_update(self, work, client, x, y, scale, rng, *, shared, personal):
        """One SGD step of the clients' u (``shared``), v (``personal``) or both, on one
        minibatch, the other part held fixed; both parts' buffers follow the forward pass."""
        redraw_dropout_keys(client["personal"], rng)
        u, v = work["shared"], client["personal"]
        state = {**u, **v}
        buffers = set(buffer_names(self.model))
        trained = (self.shared_names if shared else []) + (self.personal_names if personal else [])
        diff = {n: state[n] for n in trained if n not in buffers}
        rest = {n: t for n, t in state.items() if n not in diff}
        g = client_grad(self.model, _split_ce_loss, diff, x, y, rest, frozen=self._frozen)
        if shared:
            work["shared"] = sgd_step(u, g, self.lr * scale, self.weight_decay)
        if personal:
            client["personal"] = sgd_step(v, g, self.lr_personal * scale, self.weight_decay)


class FedAlt(_Partial):
    """FedAlt (Pillutla et al., ICML 2022): alternating updates of the personal and shared parts.

    Each sampled client, per round: ``personal_steps`` SGD steps on its v_m
    with u fixed at the received value, then the run's ``local_steps`` SGD
    steps on u with v_m fixed at its new value; it replies u. Each step draws
    its own minibatch, all drawn in that order from the client's stream of the
    round.
    Unsampled clients keep their v_m. The learning-rate decay of the run
    (``lr_decay`` per epoch) applies to the shared steps as in every strategy,
    and to the personal steps at its value at the start of the round.

    Message: u. Reply: the client's u after the round. v_m never leaves the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the shared steps (>= 0; 0 keeps u's parameters fixed).
    lr_personal : float, optional
        Rate of the personal steps (default: ``lr``).
    personal : str or list of str
        The personal part (required): a group of
        :func:`~ebfl.learning.torch.adapters.parameter_groups` ("input",
        "output", "adapter", "bn", "feature_extractor"; the model must then
        be a ``ResNet18Adapters`` or ``SmallResNet``) or a list of state
        names (parameters and float buffers) of ``model``.
    personal_steps : int, optional
        Personal steps per round (>= 0; default: the run's ``local_steps``).
    weight_decay : float
    pretrained : dict name -> Tensor, optional
        Initial values of any of the model's tensors (e.g. an ImageNet
        backbone; the run's ``init_params`` take precedence), finite. Every
        name must be a state name of the model (``num_batches_tracked``
        counters are ignored); a tensor of another shape is ignored unless it
        is frozen (a head for another number of classes: freshly initialized
        instead). Not modified.
    frozen : str or list of str, optional
        Tensors nobody trains: a group (as ``personal``, or "backbone") or
        names; their values must be in ``pretrained``. BatchNorm layers whose
        tensors are all frozen run in eval mode (their pretrained statistics).
        Table 1 of PerAda trains the whole model, so it freezes nothing.

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> FedAlt(SmallResNet(10, widths=(4,)), 0.05, personal="adapter").name
    'FedAlt (adapter)'
    """

    family = "FedAlt"
    #: personal_steps = this x the run's local_steps when not given
    _default_factor = 1

    def __init__(self, model, lr=0.01, lr_personal=None, *, personal, personal_steps=None,
                 weight_decay=0.0, pretrained=None, frozen=None):
        super().__init__(model, personal, lr=lr, lr_personal=lr_personal,
                         weight_decay=weight_decay, pretrained=pretrained, frozen=frozen)
        self.personal_steps = (None if personal_steps is None
                               else check_int_scalar(personal_steps,
                                                     self._arg_names["personal_steps"],
                                                     minimum=0))

    def config(self):
        return {**super().config(), "personal_steps": self.personal_steps,
                "default_personal_steps": f"{self._default_factor} x local_steps"}

    def n_personal_steps(self, run):
        """Personal steps per round under the run configuration ``run``."""
        if self.personal_steps is not None:
            return self.personal_steps
        return self._default_factor * run.local_steps

    def client_train(self, message, client, data, rc):
        work = self.client_begin(message, client, rc)
        rng = client_generators(rc.seeds())  # one stream per client and round: both phases
        batch = rc.config.batch_size
        with self.training():
            scale = rc.lr_scale(0)
            for _ in range(self.n_personal_steps(rc.config)):
                x, y = data.sample_batch(rng, batch)
                self.sgd_update(work, client, x, y, scale, rng, shared=False, personal=True)
            for step in range(rc.config.local_steps):
                x, y = data.sample_batch(rng, batch)
                self.local_step(work, client, x, y, rc.lr_scale(step), rng)
        return self.client_reply(work, client)

    def local_step(self, work, client, x, y, scale, rng):
        """One shared step: u moves, v_m is held fixed."""
        self.sgd_update(work, client, x, y, scale, rng, shared=True, personal=False)


class FedSim(_Partial):
    """FedSim (Pillutla et al., ICML 2022): simultaneous updates of the shared and personal parts.

    Each sampled client takes the run's ``local_steps`` SGD steps, each
    moving u (rate ``lr``) and v_m (rate ``lr_personal``) from the gradient of
    the same minibatch; it replies u. Unsampled clients keep their v_m.

    Message: u. Reply: the client's u after the round. v_m never leaves the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of u (>= 0).
    lr_personal : float, optional
        Rate of v_m (default: ``lr``).
    personal : str or list of str
        As :class:`FedAlt` (required).
    weight_decay : float
    pretrained, frozen : optional
        As :class:`FedAlt`.

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> FedSim(SmallResNet(10, widths=(4,), adapters=False), personal="input").name
    'FedSim (input layer)'
    """

    family = "FedSim"

    def __init__(self, model, lr=0.01, lr_personal=None, *, personal, weight_decay=0.0,
                 pretrained=None, frozen=None):
        super().__init__(model, personal, lr=lr, lr_personal=lr_personal,
                         weight_decay=weight_decay, pretrained=pretrained, frozen=frozen)

    def local_step(self, work, client, x, y, scale, rng):
        self.sgd_update(work, client, x, y, scale, rng, shared=True, personal=True)


class FedRep(FedAlt):
    """FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021): a personal head on a shared
    representation.

    Exactly :class:`FedAlt` with the output layer personal, under FedRep's
    step counts: each round a sampled client first trains its head with the
    representation fixed, then the representation with its new head fixed,
    and sends the representation. Collins et al. train the head for many
    more local steps than the representation (10 epochs of head updates);
    the default ``head_steps`` is therefore 10 x the run's ``local_steps``
    (the representation steps), where :class:`FedAlt` defaults to 1 x.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the representation steps.
    lr_head : float, optional
        Rate of the head steps (default: ``lr``).
    head_steps : int, optional
        Head steps per round (default: 10 x ``local_steps``).
    head : str or list of str
        The personal head (default: the group "output", i.e. ``fc``).
    weight_decay : float
    pretrained, frozen : optional
        As :class:`FedAlt`.

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> alg = FedRep(SmallResNet(10, widths=(4,), adapters=False))
    >>> alg.name, alg.personal_names
    ('FedRep', ['fc.weight', 'fc.bias'])
    """

    family = "FedRep"
    _default_factor = 10
    _arg_names = {"personal": "head", "lr_personal": "lr_head", "personal_steps": "head_steps"}

    def __init__(self, model, lr=0.01, lr_head=None, *, head_steps=None, head="output",
                 weight_decay=0.0, pretrained=None, frozen=None):
        super().__init__(model, lr, lr_head, personal=head, personal_steps=head_steps,
                         weight_decay=weight_decay, pretrained=pretrained, frozen=frozen)
        self.name = "FedRep"


class FedBN(FedSim):
    """FedBN (Li, Jiang, Zhang, Kamp & Dou, ICLR 2021): personal BatchNorm layers, FedAvg on
    the rest.

    Every BatchNorm tensor (affine parameters and running statistics) is
    personal; all other parameters are trained and averaged as in FedAvg:
    :class:`FedSim` with the BatchNorm layers personal and one rate. The
    server never sees a BatchNorm tensor.

    Parameters
    ----------
    model : nn.Module
        Any model with BatchNorm layers (without ``num_batches_tracked``).
    lr : float
    weight_decay : float
    pretrained, frozen : optional
        As :class:`FedAlt`.

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> alg = FedBN(SmallResNet(10, widths=(4,), adapters=False))
    >>> alg.name, alg.personal_names[:2]
    ('FedBN', ['bn1.weight', 'bn1.bias'])
    """

    family = "FedBN"

    def __init__(self, model, lr=0.01, *, weight_decay=0.0, pretrained=None, frozen=None):
        super().__init__(model, lr, personal=_batchnorm_names(model), weight_decay=weight_decay,
                         pretrained=pretrained, frozen=frozen)
        self.name = "FedBN"


class LGFedAvg(FedSim):
    """LG-FedAvg (Liang et al. 2020, arXiv:2001.01523): personal feature extractor, shared head.

    The local representations (everything but the head) are personal and the
    head is averaged by the server, both trained at once on every local step
    (:class:`FedSim` with the feature extractor personal). Only the head is
    communicated (Table 1 of PerAda: 0.005M parameters on ResNet-18).

    LG-FedAvg has no global model (a shared head without a shared
    representation predicts nothing): ``global_state()`` is None.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of the head.
    lr_personal : float, optional
        Rate of the feature extractor (default: ``lr``).
    personal : str or list of str
        Default: the group "feature_extractor".
    weight_decay : float
    pretrained, frozen : optional
        As :class:`FedAlt`.

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> alg = LGFedAvg(SmallResNet(10, widths=(4,), adapters=False))
    >>> alg.name, alg.shared_names
    ('LG-FedAvg', ['fc.weight', 'fc.bias'])
    """

    family = "LG-FedAvg"

    def __init__(self, model, lr=0.01, lr_personal=None, *, personal="feature_extractor",
                 weight_decay=0.0, pretrained=None, frozen=None):
        super().__init__(model, lr, lr_personal, personal=personal, weight_decay=weight_decay,
                         pretrained=pretrained, frozen=frozen)
        self.name = "LG-FedAvg"


# --- validation and helpers -------------------------------------------------------------------

def _state_names(model):
    """Parameter and float-buffer names, in ``state_dict`` order."""
    state = set(dict(model.named_parameters())) | set(buffer_names(model))
    return [n for n in model.state_dict() if n in state]


def _count(model, names):
    params = dict(model.named_parameters())
    return sum(params[n].numel() for n in names if n in params)


def _batchnorm_names(model):
    """Every tensor of every BatchNorm layer of ``model``."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            names += [f"{prefix}.{n}" if prefix else n for n in module.state_dict()]
    if not names:
        raise ValueError("model has no BatchNorm layer: FedBN personalizes BatchNorm layers")
    return names


def _names_iv(model, value, name, groups, names):
    """A group name or a list of state names -> (list of names, mode: the group or "custom")."""
    if isinstance(value, str):
        if value not in groups:
            raise ValueError(f"{name} must be a list of state names or one of the groups "
                             f"{sorted(groups)}, got {value!r}")
        from ebfl.learning.torch.adapters import parameter_groups

        try:
            return list(parameter_groups(model)[value]), value
        except TypeError:
            raise TypeError(f"{name}={value!r} names a group of parameter_groups, which needs a "
                            f"ResNet18Adapters or SmallResNet; for a {type(model).__name__} give "
                            "a list of state names") from None
    if not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a group name or a list of state names, got "
                        f"{type(value).__name__}")
    value = list(value)
    wrong = [v for v in value if not isinstance(v, str)]
    if wrong:
        raise TypeError(f"{name} must hold state names (strings), got {wrong[0]!r}")
    known = set(names)
    unknown = [v for v in value if v not in known]
    if unknown:
        raise ValueError(f"{name} holds names that are not parameters or float buffers of "
                         f"model: {unknown[:5]}")
    if not value:
        raise ValueError(f"{name} must name at least one tensor of model")
    return list(dict.fromkeys(value)), "custom"


def _parts_iv(model, personal, shared, frozen, name="personal"):
    """Both parts hold a parameter, and no BatchNorm layer that trains has frozen statistics."""
    if not _count(model, personal):
        raise ValueError(f"{name} must hold at least one parameter of model (buffers alone "
                         "are not trained)")
    if not _count(model, shared):
        raise ValueError(f"{name} and frozen leave no shared parameter: with nothing to "
                         "communicate this is local training (Local)")
    frozen = set(frozen)
    for prefix, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            own = [f"{prefix}.{n}" if prefix else n for n in module.state_dict()]
            if any(n in frozen for n in own) and not all(n in frozen for n in own):
                raise ValueError(f"frozen must hold all of BatchNorm layer {prefix!r}'s tensors "
                                 "or none: a layer that trains updates its running statistics")


def _pretrained_iv(model, pretrained, frozen):
    """The entries of ``pretrained`` that fit the model's state, as its dtypes."""
    if pretrained is None:
        if frozen:
            raise ValueError("frozen tensors take their values from pretrained: give "
                             "pretrained=")
        return {}
    if not isinstance(pretrained, Mapping):
        raise TypeError(f"pretrained must be a dict name -> Tensor, got "
                        f"{type(pretrained).__name__}")
    state = dict(model.named_parameters())
    state.update((n, b) for n, b in model.named_buffers() if b.is_floating_point())
    check_state_names(pretrained, state)
    frozen = set(frozen)
    out = {}
    for name, value in pretrained.items():
        if name not in state:
            continue  # a num_batches_tracked counter
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"pretrained[{name!r}] must be a floating-point Tensor")
        if value.shape != state[name].shape:
            if name in frozen:
                raise ValueError(f"pretrained[{name!r}] has shape {tuple(value.shape)}, model "
                                 f"needs {tuple(state[name].shape)}")
            continue  # e.g. a head for another number of classes: freshly initialized
        bad = int(value.numel() - torch.isfinite(value).sum())
        if bad:
            raise ValueError(f"pretrained[{name!r}] must be finite; it has {bad} NaN or "
                             "infinite value(s)")
        out[name] = value.detach().to(state[name].dtype).clone()
    missing = [n for n in frozen if n not in out]
    if missing:
        raise ValueError(f"pretrained lacks frozen tensors {missing[:5]} ({len(missing)} in "
                         "all)")
    return out
