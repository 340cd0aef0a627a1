"""PerAda and Ditto under sample-level differential privacy (Table 4 of PerAda).

PerAda (Xie et al., CVPR 2024) reports, in Table 4, personalized accuracy on
CIFAR-10 under sample-level (epsilon, delta)-DP with delta = 1e-5: each client
trains *both* its personalized adapter v_m and its local adapter theta_m by
DP-SGD on its own data, with full participation, and epsilon is reported per
client (mean +- std over clients). The server's distillation runs on public
unlabeled data and only post-processes the clients' releases: it spends no
budget. This module gives

* :class:`DPPerAda`: PerAda with DP-SGD on both adapters (with ``aux=None``,
  "PerAda w/o KD" of Table 4);
* :class:`DPDitto`: Ditto (the full-model baseline of Table 4) with DP-SGD on
  both of its models;
* :func:`client_epsilons`, :func:`calibrate_noise_multiplier` and
  :func:`client_sampling_rates`: the per-client accounting.

**Privacy unit and accounting.** Neighbouring datasets differ by adding or
removing one sample of one client (sample level, not client level). Every
DP-SGD step (:mod:`ebfl.learning.torch.dp_sgd`) draws a fresh Poisson batch
of the client's data at rate q_m, clips each sample's gradient to C and adds
N(0, (z C)^2): one Poisson-subsampled Gaussian event. Per local iteration a
client takes one step on v_m and one on theta_m, each on its own Poisson
batch, so a round touches the client's data in ``2 * local_steps`` events; the
two adapters compose (their Renyi DP adds), as do the rounds. A client spends
budget only in rounds it trains in. The proximal pull ``lam (v - w)`` and weight
decay do not read the data, so they are added after the noise.

**Sampling rates.** With ``expected_batch=B`` every client has the same
expected batch B and the rate q_m = B / n_m: small clients are sampled at a
higher rate and spend more budget, which is why Table 4 reports epsilon as a
mean +- std over clients (a fixed q would give every client the same epsilon).
``sampling_rate=q`` instead fixes the rate for every client.

**BatchNorm.** A train-mode BatchNorm layer normalizes each sample with the
statistics of its whole batch (so a sample's gradient depends on the other
samples and per-sample clipping bounds nothing) and writes those statistics
into its running mean and variance, which are released. Table 4 sidesteps
this with a ViT-S/16 backbone, which has no BatchNorm. Here every BatchNorm
layer runs in eval mode during DP training: the backbone's and the adapter
set's BatchNorm layers normalize with their fixed statistics (the public
pretrained ones; the adapters' own BatchNorm layers at their initial mean 0
and variance 1, i.e. an affine map), so each sample's output depends on that
sample only. Their affine parameters are still trained, by DP-SGD; running
statistics are never updated from private data.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"{__name__} needs torch: pip install 'ebfl[learning]'") from exc

from ebfl._validation import (
    check_choice,
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.learning.torch.baselines import Ditto
from ebfl.learning.torch.distillation import DROPOUT_KEY, DROPOUT_KEY_RANGE
from ebfl.learning.torch.dp_sgd import dp_sgd_gradient, gather_batch, poisson_batch
from ebfl.learning.torch.functional import (
    client_generators,
    cross_entropy,
    sgd_step,
)
from ebfl.perada.algorithm import PerAda
from ebfl.privacy.accounting.core import NOISE_MULTIPLIER_RANGE
from ebfl.privacy.accounting.dp_fedavg import dp_fedavg_epsilon, dp_fedavg_noise_multiplier

__all__ = ["ClientPrivacy", "DPDitto", "DPPerAda", "batchnorm_eval", "calibrate_noise_multiplier",
           "client_epsilons", "client_sampling_rates"]

#: DP-SGD steps per local iteration: one on each of the two models a client trains.
STEPS_PER_ITERATION = 2
_ACCOUNTANTS = ("rdp", "pld")


def batchnorm_eval(model):
    """Train mode (dropout on), except every BatchNorm layer, which runs in eval mode.

    Eval-mode BatchNorm normalizes with its running statistics and leaves them
    unchanged, so each sample's output depends on that sample only: what
    per-sample DP-SGD needs (see the module docstring). The previous modes are
    restored on exit.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2))
    >>> with batchnorm_eval(net):
    ...     net.training, net[1].training
    (True, False)
    >>> net[1].training  # restored
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return _batchnorm_eval(model)


@contextlib.contextmanager
def _batchnorm_eval(model):
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.train()
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


# --------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class ClientPrivacy:
    """Each client's sample-level (epsilon, delta) after a DP-SGD run.

    Attributes
    ----------
    epsilons : ndarray (m,)
        epsilon of each client (0 for a client that never trained; +inf without noise).
    delta : float
    sampling_rates : ndarray (m,)
        q_m, the Poisson rate of the client's batches.
    steps : ndarray (m,)
        DP-SGD steps the client took: ``2 * local_steps`` per round it trained in.
    noise_multiplier : float
    accountant : str
        ``"rdp"`` or ``"pld"``.
    """

    epsilons: np.ndarray
    delta: float
    sampling_rates: np.ndarray
    steps: np.ndarray
    noise_multiplier: float
    accountant: str

    @property
    def mean(self):
        """The mean epsilon over clients (Table 4 of PerAda reports mean +- std)."""
        return float(np.mean(self.epsilons))

    @property
    def std(self):
        """The standard deviation of epsilon over clients (population, ddof = 0)."""
        return float(np.std(self.epsilons))

    @property
    def max(self):
        """The worst client's epsilon: the guarantee that holds for every client."""
        return float(np.max(self.epsilons))

    def to_dict(self):
        """A JSON-able dict (arrays as lists, plus mean, std and max)."""
        return {"epsilons": self.epsilons.tolist(), "delta": self.delta,
                "sampling_rates": self.sampling_rates.tolist(), "steps": self.steps.tolist(),
                "noise_multiplier": self.noise_multiplier, "accountant": self.accountant,
                "mean": self.mean, "std": self.std, "max": self.max}


def _n_train_iv(n_train):
    try:
        n = np.asarray(n_train.cpu().numpy() if isinstance(n_train, torch.Tensor) else n_train)
    except (TypeError, ValueError):  # ragged sequences
        raise TypeError("n_train must be a non-empty 1-d array of integers (training samples "
                        "per client)") from None
    if n.ndim != 1 or n.size == 0 or n.dtype.kind not in "iu":
        raise TypeError("n_train must be a non-empty 1-d array of integers (training samples "
                        "per client)")
    if np.any(n < 1):
        raise ValueError(f"n_train must be >= 1 for every client, got {n.tolist()[:10]}")
    if n.dtype.kind == "u" and int(n.max()) > np.iinfo(np.int64).max:  # would wrap on the cast
        raise ValueError(f"n_train must be <= {np.iinfo(np.int64).max}, got {int(n.max())}")
    return n.astype(np.int64)


def _rate_choice_iv(sampling_rate, expected_batch):
    """Exactly one of the two, checked: ("rate", q) or ("batch", B)."""
    if (sampling_rate is None) == (expected_batch is None):
        raise ValueError("give exactly one of sampling_rate (the same Poisson rate q for every "
                         "client) and expected_batch (the same expected batch B, q_m = B / n_m)")
    if sampling_rate is not None:
        q = check_positive_scalar(sampling_rate, "sampling_rate")
        if q > 1:
            raise ValueError(f"sampling_rate must lie in (0, 1], got {q!r}")
        return "rate", q
    return "batch", check_positive_scalar(expected_batch, "expected_batch")


def _rates(n, choice):
    """(q_m, expected batch q_m n_m) per client, float64; B > n_m is refused, not clipped."""
    kind, value = choice
    if kind == "rate":
        return np.full(n.shape, value), value * n.astype(np.float64)
    small = np.flatnonzero(n < value)
    if small.size:
        raise ValueError(f"expected_batch={value:g} exceeds the training-set size of "
                         f"{small.size} client(s) (row {int(small[0])} has {int(n[small[0]])} "
                         "samples): it must be <= every client's n_m, since q_m = B / n_m "
                         "must be <= 1")
    return value / n.astype(np.float64), np.full(n.shape, value)


def client_sampling_rates(n_train, *, sampling_rate=None, expected_batch=None):
    """Each client's Poisson rate q_m: a fixed q, or B / n_m for a fixed expected batch B.

    Parameters
    ----------
    n_train : array_like of int (m,)
        Training samples per client, each >= 1.
    sampling_rate : float, optional
        q in (0, 1] for every client.
    expected_batch : float, optional
        B > 0 with B <= min n_m (exactly one of the two).

    Returns
    -------
    ndarray (m,)

    Examples
    --------
    >>> client_sampling_rates([100, 400], expected_batch=20).tolist()
    [0.2, 0.05]
    """
    n = _n_train_iv(n_train)
    return _rates(n, _rate_choice_iv(sampling_rate, expected_batch))[0]


def _participation_iv(participated, m, n_rounds):
    if participated is None:
        return np.full(m, n_rounds, dtype=np.int64)
    p = np.asarray(participated)
    if p.shape != (m,) or p.dtype.kind not in "iu":
        raise ValueError(f"participated must hold one integer per client ({m}): the rounds "
                         "each client trained in")
    if np.any(p < 0) or np.any(p > n_rounds):
        raise ValueError(f"participated must lie in [0, n_rounds={n_rounds}], got values from "
                         f"{int(p.min())} to {int(p.max())}")
    return p.astype(np.int64)


def _noise_iv(noise_multiplier):
    z = check_nonnegative_scalar(noise_multiplier, "noise_multiplier")
    lo, hi = NOISE_MULTIPLIER_RANGE
    if not (z == 0 or lo <= z <= hi):
        raise ValueError(f"noise_multiplier must be 0 (no privacy) or lie in [{lo:g}, {hi:g}], "
                         f"got {noise_multiplier!r}")
    return z


def client_epsilons(n_train, *, noise_multiplier, n_rounds, local_steps, delta, sampling_rate=None,
                    expected_batch=None, participated=None, accountant="rdp"):
    """Each client's sample-level epsilon after DP-SGD training of two models per round.

    Client m takes ``2 * local_steps`` DP-SGD steps in every round it trains in
    (one on each of its two models per local iteration, each on a fresh Poisson
    batch at rate q_m); each step is a Poisson-subsampled Gaussian event of
    noise multiplier z, and all of them compose. The count is passed to
    :func:`ebfl.privacy.accounting.dp_fedavg.dp_fedavg_epsilon` as its number of
    "rounds" (the same event, with samples in place of clients).

    Parameters
    ----------
    n_train : array_like of int (m,)
        Training samples per client.
    noise_multiplier : float
        z: 0 (epsilon = +inf) or in [1e-3, 1e8].
    n_rounds : int
        Rounds of the run (>= 0).
    local_steps : int
        Local iterations per round (>= 1).
    delta : float
        In (0, 1).
    sampling_rate, expected_batch : float
        Exactly one, as in :func:`client_sampling_rates`.
    participated : array_like of int (m,), optional
        Rounds each client actually trained in (default: all ``n_rounds``, full
        participation as in Table 4 of PerAda). With partial participation and
        no count given, ``n_rounds`` makes every epsilon an upper bound.
    accountant : {"rdp", "pld"}
        As :func:`~ebfl.privacy.accounting.dp_fedavg.dp_fedavg_epsilon`.

    Returns
    -------
    ClientPrivacy

    Examples
    --------
    30 rounds of 5 steps per model at q = 0.05, z = 1:

    >>> res = client_epsilons([640, 640], noise_multiplier=1.0, n_rounds=30, local_steps=5,
    ...                       delta=1e-5, sampling_rate=0.05)
    >>> res.steps.tolist(), round(res.mean, 3), res.std
    ([300, 300], 6.464, 0.0)
    """
    n = _n_train_iv(n_train)
    choice = _rate_choice_iv(sampling_rate, expected_batch)
    z = _noise_iv(noise_multiplier)
    n_rounds = check_int_scalar(n_rounds, "n_rounds", minimum=0)
    local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
    accountant = check_choice(accountant, "accountant", _ACCOUNTANTS)
    q, _ = _rates(n, choice)
    steps = STEPS_PER_ITERATION * local_steps * _participation_iv(participated, n.size, n_rounds)
    cache = {}
    eps = np.empty(n.size)
    for i, (qi, ti) in enumerate(zip(q.tolist(), steps.tolist(), strict=True)):
        if ti == 0:
            eps[i] = 0.0
        elif z == 0:
            eps[i] = math.inf
        else:
            if (qi, ti) not in cache:  # clients of equal size share one accountant call
                cache[qi, ti] = dp_fedavg_epsilon(
                    sampling_rate=qi, noise_multiplier=z, n_rounds=ti, delta=delta,
                    accountant=accountant).epsilon
            eps[i] = cache[qi, ti]
    if not cache:  # still check delta
        dp_fedavg_epsilon(sampling_rate=0.5, noise_multiplier=1.0, n_rounds=1, delta=delta)
    return ClientPrivacy(eps, float(delta), q, steps, z, accountant)


def calibrate_noise_multiplier(epsilon, delta, *, n_train, n_rounds, local_steps,
                               sampling_rate=None, expected_batch=None, accountant="rdp"):
    """The smallest noise multiplier z that keeps every client's epsilon <= ``epsilon``.

    The binding client is the one with the largest rate q_m (the smallest
    client under a fixed ``expected_batch``); z is
    :func:`~ebfl.privacy.accounting.dp_fedavg.dp_fedavg_noise_multiplier` at that rate
    over ``2 * rounds * local_steps`` steps.

    Parameters
    ----------
    epsilon : float
        Target epsilon > 0 per client.
    delta : float
    n_train, rounds, local_steps, sampling_rate, expected_batch, accountant
        As :func:`client_epsilons` (every client trains every round).

    Returns
    -------
    ebfl.privacy.accounting.dp_fedavg.NoiseCalibration
        Its ``n_rounds`` field holds the step count, ``sampling_rate`` the binding
        client's rate; ``converged`` False (with a RuntimeWarning) when the
        target is out of reach.

    Examples
    --------
    >>> cal = calibrate_noise_multiplier(2.0, 1e-5, n_train=[640, 1280], n_rounds=30,
    ...                                  local_steps=5, expected_batch=32)
    >>> res = client_epsilons([640, 1280], noise_multiplier=cal.noise_multiplier, n_rounds=30,
    ...                       local_steps=5, delta=1e-5, expected_batch=32)
    >>> cal.converged, res.max <= 2.0
    (True, True)
    """
    n = _n_train_iv(n_train)
    choice = _rate_choice_iv(sampling_rate, expected_batch)
    n_rounds = check_int_scalar(n_rounds, "n_rounds", minimum=1)
    local_steps = check_int_scalar(local_steps, "local_steps", minimum=1)
    q = float(np.max(_rates(n, choice)[0]))
    return dp_fedavg_noise_multiplier(sampling_rate=q, n_rounds=STEPS_PER_ITERATION * n_rounds
                                      * local_steps, delta=delta, epsilon=epsilon,
                                      accountant=accountant)


# --------------------------------------------------------------------------- strategies


class _DPSGDClients:
    """Mixin: clients train their two models by DP-SGD (clip, noise, Poisson batches).

    A subclass lists its local iteration's steps in ``DP_STEPS``, in order: (the
    state holding the model, "work" or "client"; its key; the attribute of its
    learning rate; whether the proximal pull toward ``work["anchor"]`` applies).
    """

    DP_STEPS = ()

    def client_train(self, message, client, data, rc):
        work = self.client_begin(message, client, rc)
        states = {"work": work, "client": client}
        rates = self._client_rates(data)
        rng = client_generators(rc.seeds())
        with self.training():
            for step in range(rc.config.local_steps):
                scale = rc.lr_scale(step)
                for where, key, lr, pulled in self.DP_STEPS:
                    state = states[where]
                    state[key] = self._dp_step(state[key], data, rates, rng,
                                               getattr(self, lr) * scale,
                                               work["anchor"] if pulled else None)
        return self.client_reply(work, client)

    def _dp_setup(self, clip, noise_multiplier, sampling_rate, expected_batch):
        self.clip = check_positive_scalar(clip, "clip")
        self.noise_multiplier = _noise_iv(noise_multiplier)
        self._rate_choice = _rate_choice_iv(sampling_rate, expected_batch)
        kind, value = self._rate_choice
        self.sampling_rate = value if kind == "rate" else None
        self.expected_batch = value if kind == "batch" else None
        self.name = "DP-" + self.name

    def _dp_config(self):
        return {"clip": self.clip, "noise_multiplier": self.noise_multiplier,
                "sampling_rate": self.sampling_rate, "expected_batch": self.expected_batch}

    def training(self):
        """Train mode with every BatchNorm layer in eval mode (see the module docstring)."""
        return batchnorm_eval(self.model)

    def _client_rates(self, data):
        """(q_m, q_m n_m) of the clients of ``data`` as float64 tensors."""
        q, expected = _rates(_n_train_iv(data.n_train), self._rate_choice)
        return torch.from_numpy(q), torch.from_numpy(expected)

    def _noisy_gradient(self, stack, data, rates, rng):
        """One DP-SGD gradient per client, on a fresh Poisson batch of its data (drawn on the
        CPU, then moved to the data's device)."""
        q, expected = rates
        idx, mask, _ = poisson_batch(data.n_train, q, rng)
        x, y = gather_batch(data, idx)
        mask = mask.to(y.device)
        return dp_sgd_gradient(self.model, stack, x, y, mask, clip=self.clip,
                               noise_multiplier=self.noise_multiplier, generators=rng,
                               expected_batch=expected, frozen=self.frozen(),
                               loss_fn=cross_entropy,
                               sample_state=_sample_keys(stack, rng, idx.shape[1]))

    def _dp_step(self, stack, data, rates, rng, lr, anchor=None):
        """stack - lr (noisy gradient [+ lam (stack - anchor)] [+ weight decay])."""
        g = self._noisy_gradient(stack, data, rates, rng)
        if anchor is not None:  # the proximal pull reads no data: added after the noise
            g = {n: t + self.lam * (stack[n] - anchor[n]) for n, t in g.items()}
        return sgd_step(stack, g, lr, self.weight_decay)

    def privacy(self, delta, n_rounds, *, n_train, local_steps, participated=None,
                accountant="rdp"):
        """Each client's sample-level epsilon after ``n_rounds`` rounds (:func:`client_epsilons`).

        Parameters
        ----------
        delta : float
        n_rounds : int
        n_train : array_like of int (m,)
            The clients' training-set sizes (e.g. ``data.n_train``).
        local_steps : int
            Local iterations per round (the run's ``local_steps``): 2 DP-SGD
            steps each.
        participated : array_like of int (m,), optional
            Rounds each client trained in (default: every round, full
            participation; with partial participation the default is an upper
            bound).
        accountant : {"rdp", "pld"}

        Returns
        -------
        ClientPrivacy
        """
        return client_epsilons(n_train, noise_multiplier=self.noise_multiplier, n_rounds=n_rounds,
                               local_steps=local_steps, delta=delta,
                               sampling_rate=self.sampling_rate,
                               expected_batch=self.expected_batch, participated=participated,
                               accountant=accountant)


def _sample_keys(stack, rng, width):
    """One dropout key per sample (key_j + i for sample i of client j, key_j drawn from the
    client's stream), so that samples get independent masks; None without a dropout key.
    The keys are exact integers in float64, made on the CPU and moved to the stack's device."""
    if DROPOUT_KEY not in stack:
        return None
    base = torch.tensor([float(torch.randint(DROPOUT_KEY_RANGE, (1,), generator=g)) for g in rng],
                        dtype=torch.float64)
    offsets = torch.arange(width, dtype=torch.float64)
    keys = torch.remainder(base[:, None] + offsets[None, :], DROPOUT_KEY_RANGE)
    return {DROPOUT_KEY: keys.to(stack[DROPOUT_KEY].device)}


class DPPerAda(_DPSGDClients, PerAda):
    """PerAda with sample-level DP: DP-SGD on both adapters (Table 4 of PerAda).

    Each local iteration of a round takes one DP-SGD step on the personalized
    adapter v_m (noisy cross-entropy gradient, then the proximal pull
    ``lam (v - w^t)``) and one on the local adapter theta_m, each on its own
    Poisson batch of the client's data (:mod:`ebfl.learning.torch.dp_sgd`).
    Every BatchNorm layer runs in eval mode (see the module docstring), so
    running statistics in the replies equal those broadcast. The server is
    :class:`~ebfl.perada.algorithm.PerAda`'s: averaging and distillation on
    public unlabeled data, post-processing that spends no budget. Table 4 runs
    with full participation (``clients_per_round`` = m). ``RunConfig.batch_size``
    is not used: batches are Poisson draws.

    Parameters
    ----------
    model, pretrained
        As :class:`~ebfl.perada.algorithm.PerAda`.
    clip : float
        C > 0, the per-sample L2 clip over the adapter's parameters.
    noise_multiplier : float
        z: 0 (no privacy) or in [1e-3, 1e8]; noise N(0, (z C)^2) per coordinate.
    sampling_rate : float, optional
        The same Poisson rate q in (0, 1] for every client.
    expected_batch : float, optional
        Instead: the same expected batch B for every client, q_m = B / n_m
        (then epsilon varies across clients, as in Table 4). B must be <= every
        client's n_m (a ValueError when a round reaches a smaller client).
    **kwargs
        As :class:`~ebfl.perada.algorithm.PerAda` (``aux=None``: PerAda w/o KD).

    Examples
    --------
    >>> from ebfl.learning.torch.adapters import SmallResNet
    >>> from ebfl.learning.torch.functional import model_state
    >>> net = SmallResNet()
    >>> alg = DPPerAda(net, model_state(net), clip=1.0, noise_multiplier=1.0,
    ...                sampling_rate=0.05, lr=0.05)
    >>> alg.name
    'DP-PerAda w/o KD'
    >>> round(alg.privacy(1e-5, 30, n_train=[640, 640], local_steps=5).mean, 3)
    6.464
    """

    name = "PerAda"
    #: The personalized adapter first (pulled to the global one), then the local adapter.
    DP_STEPS = (("client", "personal", "lr_personal", True), ("work", "theta", "lr", False))

    def __init__(self, model, pretrained, *, clip, noise_multiplier, sampling_rate=None,
                 expected_batch=None, **kwargs):
        super().__init__(model, pretrained, **kwargs)
        self._dp_setup(clip, noise_multiplier, sampling_rate, expected_batch)

    def config(self):
        return {**super().config(), **self._dp_config(), "name": self.name}



class DPDitto(_DPSGDClients, Ditto):
    """Ditto (the full-model baseline of Table 4 of PerAda) with DP-SGD on both models.

    Each local iteration takes one DP-SGD step on the client's copy of the
    global model and one on its personal model v (noisy gradient, then the
    proximal pull ``lam (v - w^t)``), each on its own Poisson batch; every
    BatchNorm layer runs in eval mode (see the module docstring). Accounting,
    parameters and sampling as :class:`DPPerAda`.

    Parameters
    ----------
    model : nn.Module
    clip, noise_multiplier, sampling_rate, expected_batch
        As :class:`DPPerAda`.
    **kwargs
        As :class:`~ebfl.learning.torch.baselines.Ditto` (``lr``, ``lr_personal``,
        ``lam``, ``weight_decay``).

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> DPDitto(LogisticModel(4, 3), clip=1.0, noise_multiplier=0.8, expected_batch=16).name
    'DP-Ditto'
    """

    name = "Ditto"
    #: The copy of the global model first, then the personal model (pulled to the global one).
    DP_STEPS = (("work", "model", "lr", False), ("client", "personal", "lr_personal", True))

    def __init__(self, model, *, clip, noise_multiplier, sampling_rate=None, expected_batch=None,
                 **kwargs):
        super().__init__(model, **kwargs)
        self._dp_setup(clip, noise_multiplier, sampling_rate, expected_batch)

    def config(self):
        return {**super().config(), **self._dp_config(), "name": self.name}

