"""Generalization metrics of personalized federated models, and PerAda's exact inequalities.

PerAda's Theorems 1 and 2 (Xie et al., CVPR 2024) bound the risk of the
global model g and of each personalized model p_m on a target distribution
by quantities a run can measure: the soft error ``1 - g(x)_y``, the ensemble
distillation distance Phi (the L1 distance between g's probabilities and the
mean of the members' probabilities), and the prediction distance
``min(1, |p_m(x) - g(x)|_1)``. Their Rademacher and VC terms have no explicit
constants; what holds *exactly*, sample by sample, is the skeleton:

1. ``1[argmax g(x) != y] <= 2 (1 - g(x)_y)``  (0-1 error <= 2 x soft error);
2. ``1[argmax p(x) != y] <= 2 (1 - g(x)_y) + 2 min(1, |p(x) - g(x)|_1)``
   (the empirical form of Theorem 2);
3. ``1 - g(x)_y <= mean_m (1 - h_m(x)_y) + |g(x) - mean_m h_m(x)|_1``
   (averaged: soft error of g <= members' mean soft error + Phi, the step
   behind Theorem 1's ``2 Phi`` term).

:func:`generalization_report` evaluates a trained strategy on a test set,
computes these terms and checks the three inequalities on every sample
(:class:`InequalityViolation` if one fails: they cannot fail for valid
probability vectors, so a failure is a bug).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

try:
    import torch
    from torch.func import functional_call
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"{__name__} needs torch: pip install 'ebfl[learning]'") from exc

from ebfl._validation import check_int_scalar, check_nonnegative_scalar
from ebfl.learning.torch.functional import check_labels, eval_mode

__all__ = ["InequalityViolation", "check_inequalities", "ensemble_distance",
           "generalization_report", "prediction_distance", "soft_error", "zero_one_error"]

#: Slack for float32 rounding in the pointwise inequalities.
TOLERANCE = 1e-5


class InequalityViolation(AssertionError):
    """One of the exact inequalities behind PerAda's Theorems 1-2 failed on a sample."""


def _probs_iv(p, name, ndim=None, shape=None):
    """Probabilities, classes along the last axis: finite, in [0, 1].

    Their sums are not checked: :func:`check_inequalities` is a bug detector,
    which reports vectors that are not probability vectors by their violation.
    ``ndim``: the number of axes required (None: at least 2); ``shape``: the
    trailing (n, k) they must have.
    """
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise TypeError(f"{name} must be a floating-point Tensor of probabilities")
    if p.dim() < 2 or (ndim is not None and p.dim() != ndim):
        want = f"{ndim} axes" if ndim is not None else "a sample and a class axis"
        raise ValueError(f"{name} must have {want} (classes last), got shape {tuple(p.shape)}")
    if p.shape[-1] < 1 or p.shape[-2] < 1:
        raise ValueError(f"{name} must hold at least one sample and one class, got shape "
                         f"{tuple(p.shape)}")
    if shape is not None and tuple(p.shape[-2:]) != tuple(shape):
        raise ValueError(f"{name} must have (n, k) = {tuple(shape)} as its last axes, got "
                         f"shape {tuple(p.shape)}")
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} must be finite; it has NaN or infinite values")
    if bool((p < 0).any()) or bool((p > 1).any()):
        raise ValueError(f"{name} must hold probabilities in [0, 1], got values from "
                         f"{float(p.min())} to {float(p.max())}")
    return p


def soft_error(probs, y):
    """Mean over samples of ``1 - p(x)_y`` (PerAda's ERR); probs (..., n, k), y (n,)."""
    probs = _probs_iv(probs, "probs")
    y = check_labels(y, "y", *probs.shape[-2:])
    return (1 - probs.gather(-1, y.expand(*probs.shape[:-1]).unsqueeze(-1)).squeeze(-1)).mean(-1)


def zero_one_error(probs, y):
    """Mean over samples of ``1[argmax p(x) != y]``; probs (..., n, k), y (n,)."""
    probs = _probs_iv(probs, "probs")
    y = check_labels(y, "y", *probs.shape[-2:])
    return (probs.argmax(-1) != y).float().mean(-1)


def ensemble_distance(member_probs, global_probs):
    """Phi: mean over samples of ``|g(x) - mean_m h_m(x)|_1``; members (M, n, k), g (n, k)."""
    global_probs = _probs_iv(global_probs, "global_probs", ndim=2)
    member_probs = _probs_iv(member_probs, "member_probs", ndim=3, shape=global_probs.shape)
    return float((global_probs - member_probs.mean(0)).abs().sum(-1).mean())


def prediction_distance(personal_probs, global_probs):
    """Per model: mean over samples of ``min(1, |p(x) - g(x)|_1)``; p (M, n, k) -> (M,)."""
    global_probs = _probs_iv(global_probs, "global_probs", ndim=2)
    personal_probs = _probs_iv(personal_probs, "personal_probs", ndim=3,
                               shape=global_probs.shape)
    return (personal_probs - global_probs).abs().sum(-1).clamp(max=1.0).mean(-1)


def check_inequalities(personal_probs, global_probs, y, *, members=None, tol=TOLERANCE):
    """Check inequalities 1-3 (module docstring) on every sample; return their margins.

    Parameters
    ----------
    personal_probs : Tensor (M, n, k)
        The personalized models' probabilities.
    global_probs : Tensor (n, k)
    y : Tensor (n,)
    members : Tensor (M', n, k), optional
        The ensemble members h_m of inequality 3 (default: the personalized
        models: Theorem 1 holds for any h_m in H_m).
    tol : float
        >= 0.

    Returns
    -------
    dict
        The smallest slack (right side minus left side) of each inequality
        over all samples (and models), ``>= -tol``.

    Raises
    ------
    InequalityViolation
        If a slack is below ``-tol``.
    """
    global_probs = _probs_iv(global_probs, "global_probs", ndim=2)
    personal_probs = _probs_iv(personal_probs, "personal_probs", ndim=3,
                               shape=global_probs.shape)
    members = personal_probs if members is None else _probs_iv(
        members, "members", ndim=3, shape=global_probs.shape)
    y = check_labels(y, "y", *global_probs.shape)
    tol = check_nonnegative_scalar(tol, "tol")
    gy = global_probs.gather(-1, y[:, None]).squeeze(-1)
    wrong_g = (global_probs.argmax(-1) != y).float()
    slack1 = 2 * (1 - gy) - wrong_g
    wrong_p = (personal_probs.argmax(-1) != y).float()
    dist = (personal_probs - global_probs).abs().sum(-1).clamp(max=1.0)
    slack2 = 2 * (1 - gy) + 2 * dist - wrong_p
    mean_h = members.mean(0)
    hy = members.gather(-1, y.expand(members.shape[0], -1).unsqueeze(-1)).squeeze(-1)
    slack3 = (1 - hy).mean(0) + (global_probs - mean_h).abs().sum(-1) - (1 - gy)
    out = {"inequality_1": float(slack1.min()), "inequality_2": float(slack2.min()),
           "inequality_3": float(slack3.min())}
    bad = {k: v for k, v in out.items() if v < -tol}
    if bad:
        raise InequalityViolation(f"exact inequalities of Theorems 1-2 violated (min slack): "
                                  f"{bad}")
    return out


@torch.no_grad()
def _personal_probs(strategy, server, clients, data, inputs, chunk):
    """Every client's personalized probabilities on each set of shared inputs: name -> (m, n, k).

    Each chunk of clients builds its personal models once (fine-tuning strategies
    adapt at that point) and scores every set with them.
    """
    from ebfl.federated.tree import tree_take
    from ebfl.learning.torch.functional import client_forward

    message = strategy.evaluation_message(server)
    m = data.n_clients
    out = {name: [] for name in inputs}
    for lo in range(0, m, chunk):
        rows = np.arange(lo, min(lo + chunk, m))
        part = data.subset(rows)
        own = tree_take(clients, rows)
        stack = None if hasattr(strategy, "personal_logits") else strategy.personal(
            message, own, part)
        with eval_mode(strategy.model):
            for name, x in inputs.items():
                xs = x.expand(len(rows), *x.shape)
                logits = (strategy.client_logits(message, own, part, xs) if stack is None
                          else client_forward(strategy.model, stack, xs,
                                              frozen=strategy.frozen()))
                out[name].append(torch.softmax(logits.float(), -1))
    return {name: torch.cat(v) for name, v in out.items()}


@torch.no_grad()
def _global_probs(strategy, server, x, chunk=1024):
    state = strategy.global_state(server) if hasattr(strategy, "global_state") else None
    if state is None:
        return None
    frozen = strategy.frozen() or {}
    with eval_mode(strategy.model):
        logits = torch.cat([functional_call(strategy.model, (state, frozen), (x[lo:lo + chunk],))
                            for lo in range(0, x.shape[0], chunk)])
    return torch.softmax(logits.float(), -1)


def _summary(acc, weights=None):
    acc = np.asarray(acc, dtype=np.float64) * 100
    out = {"mean": float(acc.mean()), "std": float(acc.std())}
    if weights is not None:
        out["weighted_mean"] = float(np.average(acc, weights=np.asarray(weights, np.float64)))
    return out


def generalization_report(strategy, server, clients, data, *, global_test, ood=None, aux=None,
                          chunk=4):
    """Personalized and global accuracy on local, global and shifted test sets, with
    PerAda's generalization terms and their exact inequalities checked.

    Parameters
    ----------
    strategy : Strategy
        The trained algorithm (its ``global_state(server)``, if any, is the
        global model; ``None`` for methods without one).
    server, clients : dict
        Its final server state and client states (a :class:`~ebfl.learning.torch.TrainResult`'s).
    data : FederatedDataset
        The clients' data: each personalized model is scored on its local test set.
    global_test : (Tensor, Tensor)
        The union of the local test sets (Global-test).
    ood : dict name -> (Tensor, Tensor), optional
        Shifted test sets.
    aux : Tensor, optional
        Unlabeled distillation data, for Phi on D_aux.
    chunk : int
        Clients per vectorized forward pass.

    The evaluation runs on ``strategy``'s device (:meth:`~.strategies.Strategy.to`):
    the states and test sets are copied there (no copy where they already are).

    Returns
    -------
    dict
        ``local`` (accuracy in %: mean, weighted_mean by local test size, std across
        clients), ``global_test`` and each ``ood`` name (personalized models: mean,
        std across clients; ``global_model`` accuracy), and for the global test set
        and every OOD set: ``phi`` (members = the personalized models),
        ``prediction_distance`` (mean over clients), soft and 0-1 errors, and the
        inequality slacks (all >= 0 up to rounding, else :class:`InequalityViolation`).
        ``phi_aux``: Phi on D_aux.
    """
    from ebfl.learning.torch.data import FederatedDataset
    from ebfl.learning.torch.engine import evaluate_strategy
    from ebfl.learning.torch.functional import to_device
    from ebfl.learning.torch.strategies import Strategy

    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a Strategy of ebfl.learning.torch, got "
                        f"{type(strategy).__name__}")
    if not isinstance(data, FederatedDataset):
        raise TypeError(f"data must be a FederatedDataset, got {type(data).__name__}")
    for name, state in (("server", server), ("clients", clients)):
        if not isinstance(state, Mapping):
            raise TypeError(f"{name} must be a state dict (a TrainResult's), got "
                            f"{type(state).__name__}")
    features, k = tuple(data.x_train.shape[2:]), int(data.n_classes)
    _test_set_iv(global_test, "global_test", features, k)
    if ood is not None:
        if not isinstance(ood, Mapping):
            raise TypeError(f"ood must be a dict name -> (x, y), got {type(ood).__name__}")
        for name, pair in ood.items():
            if not isinstance(name, str):
                raise TypeError(f"ood must be keyed by names (strings), got {name!r}")
            _test_set_iv(pair, f"ood[{name!r}]", features, k)
    if aux is not None:
        _inputs_iv(aux, "aux", features)
    chunk = check_int_scalar(chunk, "chunk", minimum=1)
    device = strategy.device
    server, clients = strategy.restore_state(server), strategy.restore_state(clients)
    data = data.to(device)
    global_test, ood, aux = to_device((global_test, ood, aux), device)
    local = evaluate_strategy(strategy, _Result(server, clients), data)
    report = {"local": _summary(local.cpu().numpy(), data.n_test.cpu().numpy())}
    sets = {"global_test": global_test, **(ood or {})}
    inputs = {name: x for name, (x, _) in sets.items()}
    if aux is not None:
        inputs["__aux__"] = aux
    probs = _personal_probs(strategy, server, clients, data, inputs, chunk)
    for name, (x, y) in sets.items():
        p = probs[name]
        acc = (p.argmax(-1) == y).float().mean(-1).cpu().numpy()
        entry = {"personalized": _summary(acc),
                 "personalized_soft_error": float(soft_error(p, y).mean())}
        g = _global_probs(strategy, server, x)
        if g is not None:
            entry["global_model"] = float((g.argmax(-1) == y).float().mean()) * 100
            entry["global_soft_error"] = float(soft_error(g, y))
            entry["phi"] = ensemble_distance(p, g)
            entry["prediction_distance"] = float(prediction_distance(p, g).mean())
            entry["inequalities"] = check_inequalities(p, g, y)
        report[name] = entry
    if aux is not None:
        g = _global_probs(strategy, server, aux)
        if g is not None:
            report["phi_aux"] = ensemble_distance(probs["__aux__"], g)
    return report


def _inputs_iv(x, name, features):
    """A floating, finite (n >= 1, *features) Tensor."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point Tensor of inputs")
    if x.dim() < 1 or x.shape[0] < 1 or tuple(x.shape[1:]) != features:
        raise ValueError(f"{name} must have shape (n, {', '.join(map(str, features))}) with "
                         f"n >= 1 (the clients' inputs), got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite; it has NaN or infinite values")


def _test_set_iv(pair, name, features, k):
    """A labelled test set (x, y) of the clients' inputs and classes."""
    if isinstance(pair, torch.Tensor) or not isinstance(pair, tuple | list) or len(pair) != 2:
        raise TypeError(f"{name} must be a pair (x, y) of Tensors")
    x, y = pair
    _inputs_iv(x, f"{name}[0] (x)", features)
    check_labels(y, f"{name}[1] (y)", x.shape[0], k)


class _Result:
    def __init__(self, server, clients):
        self.server, self.clients = server, clients
