"""FedHDP (Algorithm 2 of "Federated learning with heterogeneous differential privacy").

Every client belongs to a privacy group (group 0: the least private, e.g. the
clients who opted out; the last: the strictest). Per round:

* each sampled client trains a local copy of the global model (the DP-FedAvg
  update Delta = theta - theta^t) and, on the same minibatches, its personal
  model by Ditto's step toward the received global model (lambda per group);
  it clips Delta to the round's clip norm S^t and reports whether it was
  unclipped;
* the server averages each group's clipped updates and adds Gaussian noise
  with standard deviation z_i S^t / N_i^t to group i's mean (its noise
  multiplier z_i, turned into z_Delta for adaptive clipping; 0 for a
  non-private group), combines the groups with the weights r_i N_i / sum r_k N_k
  (:func:`ebfl.fedhdp.aggregation.group_weights`), moves the global model by
  the result (server learning rate 1) and updates S from the noisy fraction of
  unclipped updates (:mod:`ebfl.fedhdp.aggregation`).

The noise is added by the server (central DP, as the paper's analysis):
drawn from the server's stream of the round, so both runtimes agree.

The baselines of the paper's Tables 3 and 4 are the same algorithm with other
settings: :func:`non_private_ditto` (no clipping, no noise), :func:`dp_fedavg_ditto`
(every client in one private group) and :func:`hdp_fedavg_ditto` (r = 1).

Examples
--------
>>> import numpy as np
>>> from ebfl.learning.torch import FederatedDataset, LogisticModel, train
>>> rng = np.random.default_rng(0)
>>> xs = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(6)]
>>> ys = [(x[:, 0] > 0).astype(np.int64) for x in xs]
>>> data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=2)
>>> groups = [0, 1, 1, 1, 1, 1]  # client 0 opts out, the others are private
>>> alg = FedHDP(LogisticModel(4, 2), groups, ratio=0.1, noise_multiplier=[0.0, 1.0],
...              count_noise=1.0)
>>> res = train(alg, data, n_rounds=3, local_steps=2, batch_size=5, clients_per_round=4)
>>> sorted(res.server), sorted(res.clients)
(['clip', 'global'], ['personal', 'trained'])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"{__name__} needs torch: pip install 'ebfl[learning]'") from exc

from ebfl._validation import (
    check_bool,
    check_choice,
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
    check_real_scalar,
)
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.fedhdp.aggregation import group_weights, noisy_unclipped_fraction, update_clip_norm
from ebfl.learning.torch.functional import (
    ce_loss,
    client_forward,
    client_grad,
    replicate,
)
from ebfl.learning.torch.stacked import dense_sgd_step_
from ebfl.learning.torch.strategies import EVAL_CHUNK, Strategy, check_model, client_test_accuracy
from ebfl.privacy.accounting.dp_fedavg import adaptive_clipping_noise

__all__ = ["FedHDP", "dp_fedavg_ditto", "hdp_fedavg_ditto", "non_private_ditto"]

#: The denominators of the noisy group means (see :class:`FedHDP`).
DENOMINATORS = ("realized", "expected")


def _groups_iv(groups):
    g = np.asarray(groups)
    if g.ndim != 1 or g.size == 0:
        raise ValueError(f"groups must be a non-empty 1-d array with one group id per client, "
                         f"got shape {g.shape}")
    if g.dtype.kind == "f" and np.all(np.isfinite(g)) and np.all(g == np.round(g)):
        g = g.astype(np.int64)
    if g.dtype.kind not in "iu" or g.min() < 0:
        raise ValueError("groups must hold non-negative integer group ids 0, 1, ..., l - 1")
    missing = np.setdiff1d(np.arange(g.max() + 1), g)
    if missing.size:
        raise ValueError(f"groups must use every id 0..{g.max()}; missing {missing.tolist()}")
    return g.astype(np.int64)


def _per_group(value, name, n_groups, check):
    """A scalar (the same for every group) or one value per group."""
    if isinstance(value, Sequence | np.ndarray) and not isinstance(value, str):
        values = [check(v, f"{name}[{i}]") for i, v in enumerate(np.asarray(value).tolist())]
        if len(values) != n_groups:
            raise ValueError(f"{name} must have one value per privacy group ({n_groups}), got "
                             f"{len(values)}")
        return np.asarray(values, dtype=np.float64)
    return np.full(n_groups, check(value, name), dtype=np.float64)


def _ratios_iv(ratio, n_groups):
    """r_i per group: a scalar r is (1, r, ..., r), group 0 the reference."""
    if isinstance(ratio, Sequence | np.ndarray) and not isinstance(ratio, str):
        r = _per_group(ratio, "ratio", n_groups, check_probability)
    else:
        r = np.full(n_groups, check_probability(ratio, "ratio"))
        r[0] = 1.0
    if not np.any(r > 0):
        raise ValueError("ratio must give some group a positive weight")
    return r


class FedHDP(Strategy):
    """FedHDP (Algorithm 2): DP-FedAvg with adaptive clipping, group weights and Ditto.

    Message: the global model and the clip norm S^t. Reply: the clipped update
    and whether it was unclipped. The personal models stay on the clients.

    Parameters
    ----------
    model : nn.Module
    groups : array_like of int (m,)
        Each client's privacy group, 0 .. l-1 (0: the least private; with two
        groups, 0 = non-private, 1 = private).
    lr : float
        eta, the local learning rate of the global model's copy (Table 7:
        0.5 on non-IID MNIST).
    lr_personal : float, optional
        eta_p (default ``lr``).
    lam : float or sequence of float
        lambda of Ditto's proximal term, one per group or the same for all.
    ratio : float or sequence of float
        r: group 0 gets ratio 1 and every other group r; or r_i per group (eq.
        (64)). 0 leaves a group out of training altogether: its clients never
        train (as the paper's r = 0 rows) and are evaluated with the global model.
    noise_multiplier : float or sequence of float
        z_i per group, the multiplier each group's privacy is accounted at (0:
        no noise). With adaptive clipping the update noise uses z_Delta
        (:func:`~ebfl.privacy.accounting.dp_fedavg.adaptive_clipping_noise`).
    clip : float or None
        S^0, the initial clip norm (Table 7: 0.5); None: no clipping and no
        noise (the non-private baseline).
    adaptive : bool
        Adapt S (Andrew et al.); else S stays S^0 and z_i is the update's
        multiplier.
    clip_lr, target_quantile : float
        eta_b (0.2) and kappa (0.5).
    count_noise : float, optional
        sigma_b, the standard deviation of the unclipped count's noise
        (default: the expected clients per round / 20, Andrew et al.'s choice;
        the paper does not give it).
    denominator : {"realized", "expected"}
        "realized" (Algorithm 2 as printed): each group's mean, its noise and
        the group weights use the round's sampled counts N_i^t. "expected":
        they use the expected counts q M_i (M_i the group's size), which do not
        depend on who took part, and noise is released in every round: the
        variant for which the accountant's (epsilon, delta) is a proof
        (with Poisson sampling, ``sampling="poisson"``; errata [FedHDP 6]).
    weight_decay : float
    """

    name = "FedHDP"
    aggregate_empty = True

    def __init__(self, model, groups, *, lr=0.5, lr_personal=None, lam=0.005, ratio=0.01,
                 noise_multiplier=(0.0, 1.5), clip=0.5, adaptive=True, clip_lr=0.2,
                 target_quantile=0.5, count_noise=None, denominator="realized",
                 weight_decay=0.0):
        self.model = check_model(model)
        self.groups = _groups_iv(groups)
        n_groups = int(self.groups.max()) + 1
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_personal = self.lr if lr_personal is None else check_positive_scalar(
            lr_personal, "lr_personal")
        self.lam = _per_group(lam, "lam", n_groups, check_nonnegative_scalar)
        self.ratio = _ratios_iv(ratio, n_groups)
        self.noise_multiplier = _per_group(noise_multiplier, "noise_multiplier", n_groups,
                                           check_nonnegative_scalar)
        self.clip = None if clip is None else check_positive_scalar(clip, "clip")
        if self.clip is None and np.any(self.noise_multiplier > 0):
            raise ValueError("clip=None (no clipping) needs noise_multiplier 0 for every group: "
                             "noise is calibrated to the clip norm")
        self.adaptive = check_bool(adaptive, "adaptive") and self.clip is not None
        self.clip_lr = check_nonnegative_scalar(clip_lr, "clip_lr")
        self.target_quantile = check_probability(target_quantile, "target_quantile")
        self.count_noise = None if count_noise is None else check_positive_scalar(
            count_noise, "count_noise")
        self.denominator = check_choice(denominator, "denominator", DENOMINATORS)
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        if self.count_noise is not None:
            self._update_multipliers(self.count_noise)  # fails early if sigma_b is too small

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_personal": self.lr_personal,
                "lam": self.lam.tolist(), "ratio": self.ratio.tolist(),
                "noise_multiplier": self.noise_multiplier.tolist(), "clip": self.clip,
                "adaptive": self.adaptive, "clip_lr": self.clip_lr,
                "target_quantile": self.target_quantile, "count_noise": self.count_noise,
                "denominator": self.denominator, "weight_decay": self.weight_decay,
                "groups": self.groups.tolist()}

    @property
    def n_groups(self):
        return self.lam.size

    # ---- the server's noise
    def sigma_b(self, run):
        """sigma_b of ``run``: ``count_noise`` or the expected clients per round / 20."""
        if self.count_noise is not None:
            return self.count_noise
        return run.clients_per_round / 20.0

    def _update_multipliers(self, sigma_b):
        """The multipliers of the group means' noise (z_Delta with adaptive clipping)."""
        if not self.adaptive:
            return self.noise_multiplier.copy()
        return np.array([adaptive_clipping_noise(z, sigma_b) for z in self.noise_multiplier])

    def update_noise_std(self, clip, counts, run):
        """Standard deviation of the noise on each group's mean update: z_i S / N_i."""
        z = self._update_multipliers(self.sigma_b(run))
        noisy = (counts > 0) & (z > 0)  # z = 0: no noise (and no clip norm to scale)
        return np.where(noisy, z * clip / np.where(noisy, counts, 1.0), 0.0)

    # ---- server half
    def init_server(self, run):
        if self.adaptive and self.count_noise is None:
            try:
                self._update_multipliers(self.sigma_b(run))
            except ValueError:
                raise ValueError(
                    f"count_noise defaults to clients_per_round / 20 = {self.sigma_b(run):g}, "
                    f"which must be > max(noise_multiplier) / 2 = "
                    f"{self.noise_multiplier.max() / 2:g}: pass a larger count_noise") from None
        server = {"global": self.initial_params(run)}
        if self.clip is not None:
            server["clip"] = torch.tensor(self.clip, dtype=torch.float64, device=self.device)
        return server

    def broadcast(self, server, rc):
        return dict(server)  # the global model, and the clip norm S^t if clipping

    def evaluation_message(self, server):
        return {"global": server["global"]}

    def summary(self, server):
        return {} if self.clip is None else {"clip": float(server["clip"])}

    def _counts(self, ids, run):
        """N_i per group: the round's (realized) or q M_i (expected)."""
        if self.denominator == "expected":
            sizes = np.bincount(self.groups, minlength=self.n_groups)
            return run.sampling_rate * sizes.astype(np.float64)
        return np.bincount(self.groups[ids], minlength=self.n_groups).astype(np.float64)

    def aggregate(self, server, replies, weights, rc):
        run = rc.config
        ids = np.asarray(rc.clients, dtype=np.int64)
        rows = np.flatnonzero(self.ratio[self.groups[ids]] > 0)  # r_i = 0: left out
        ids = ids[rows]
        clip = float(server["clip"]) if "clip" in server else 0.0  # 0: no clipping, no noise
        counts = self._counts(ids, run)
        std = self.update_noise_std(clip, counts, run)
        w = group_weights(counts, self.ratio)
        gen = torch.Generator().manual_seed(stream_seed(run.seed, rc.round, SERVER, "aggregate"))
        new = {}
        for name, p in server["global"].items():
            # one draw per group and parameter, in a fixed order, whatever the data
            noise = torch.randn((self.n_groups, *p.shape), generator=gen, dtype=p.dtype)
            noise = noise.to(p.device)  # drawn on the CPU: the same numbers on every device
            step = torch.zeros_like(p)
            delta = replies["delta"][name][rows] if ids.size else None
            for i in np.flatnonzero(w > 0):  # realized counts: an empty group has w = 0
                mine = torch.as_tensor(self.groups[ids] == i)
                total = delta[mine].sum(0) if bool(mine.any()) else torch.zeros_like(p)
                step = step + float(w[i]) * (total / counts[i] + float(std[i]) * noise[i])
            new[name] = p + step
        count_draw = float(torch.randn((), generator=gen, dtype=torch.float64))
        if self.adaptive:
            n = counts.sum() if self.denominator == "expected" else float(ids.size)
            if n > 0:
                b = (replies["unclipped"][rows].double().cpu().numpy() if ids.size
                     else np.zeros(0))
                frac = noisy_unclipped_fraction(b, n, self.sigma_b(run) * count_draw)
                clip = update_clip_norm(clip, frac, self.clip_lr, self.target_quantile)
        if "clip" not in server:
            return {"global": new}
        return {"global": new, "clip": torch.tensor(clip, dtype=torch.float64,
                                                    device=self.device)}

    # ---- client half
    def init_clients(self, run, data, clients):
        k = len(clients)
        return {"personal": replicate(self.initial_params(run), k),
                "trained": torch.zeros(k, dtype=torch.bool, device=self.device)}

    def client_begin(self, message, client, rc):
        ids = np.asarray(rc.clients, dtype=np.int64)
        k = ids.size
        g = self.groups[ids]
        active = torch.as_tensor(self.ratio[g] > 0, device=self.device)
        fresh = active & ~client["trained"]  # Algorithm 2: theta_j <- theta^0 if not initialized
        if bool(fresh.any()):
            start = replicate(message["global"], k)
            client["personal"] = {n: torch.where(_rows(fresh, v), start[n], v)
                                  for n, v in client["personal"].items()}
        client["trained"] = client["trained"] | active
        return {"model": replicate(message["global"], k), "anchor": message["global"],
                "lam": torch.as_tensor(self.lam[g], device=self.device), "active": active,
                "clip": message.get("clip")}

    def local_step(self, work, client, x, y, scale, rng):
        # In place: each update is one pass over the stacks (memory-bound at this size) and
        # the stacks are this round's copies (the work's model, the client's rows).
        lr, lr_p, wd = self.lr * scale, self.lr_personal * scale, self.weight_decay
        if not dense_sgd_step_(self.model, ce_loss, work["model"], x, y, lr=lr,
                               weight_decay=wd):  # dense: fused
            g = client_grad(self.model, ce_loss, work["model"], x, y)
            for n, p in work["model"].items():
                if wd:
                    g[n].add_(p, alpha=wd)
                p.sub_(g[n], alpha=lr)
        v, w, lam, active = client["personal"], work["anchor"], work["lam"], work["active"]
        # clients of a group with r = 0 keep their (untrained) personal model: rate 0
        if dense_sgd_step_(self.model, ce_loss, v, x, y, lr=lr_p * active.to(torch.float64),
                           weight_decay=wd, anchor=w, lam=lam):
            return
        h = client_grad(self.model, ce_loss, v, x, y)
        everyone = bool(active.all())
        for n, vn in v.items():
            hn = h[n].addcmul_(_rows(lam, vn).to(vn.dtype), vn - w[n])  # Ditto's pull to w^t
            if wd:
                hn.add_(vn, alpha=wd)
            if everyone:
                vn.sub_(hn, alpha=lr_p)
            else:  # clients of a group with r = 0 keep their (untrained) personal model
                vn.copy_(torch.where(_rows(active, vn), vn - lr_p * hn, vn))

    def client_reply(self, work, client):
        delta = {n: work["model"][n] - work["anchor"][n] for n in work["model"]}
        k = work["active"].numel()
        if work["clip"] is None:  # the non-private baseline: no clipping
            return {"delta": delta, "unclipped": torch.ones(k, device=self.device)}
        norm = torch.sqrt(sum(d.reshape(k, -1).double().pow(2).sum(1) for d in delta.values()))
        clip = work["clip"].double()
        unclipped = norm <= clip
        factor = torch.clamp(clip / norm.clamp_min(1e-300), max=1.0)
        clipped = {n: d * _rows(factor, d).to(d.dtype) for n, d in delta.items()}
        return {"delta": clipped, "unclipped": unclipped.to(torch.float32)}

    def personal(self, message, client, data):
        """The personal model, or the global one for a client that never trained."""
        k = data.n_clients
        start = replicate(message["global"], k)
        done = client["trained"]
        return {n: torch.where(_rows(done, v), v, start[n]) for n, v in client["personal"].items()}

    @torch.no_grad()
    def client_evaluate(self, message, client, data):
        """``accuracy`` of the personal models and ``global_accuracy`` of the global model,
        each on the client's local test set."""
        out = super().client_evaluate(message, client, data)
        k = data.n_clients
        acc = []
        for lo in range(0, k, EVAL_CHUNK):
            part = data.subset(np.arange(lo, min(lo + EVAL_CHUNK, k)))
            logits = client_forward(self.model, replicate(message["global"], part.n_clients),
                                    part.x_test)
            acc.append(client_test_accuracy(logits, part))
        return {**out, "global_accuracy": torch.cat(acc)}

    def privacy(self, delta, *, n_rounds, sampling_rate, accountant="rdp", sampling=None):
        """Each privacy group's epsilon after ``n_rounds`` rounds, with what it is a proof for.

        Accounts each group separately, as the paper (parallel composition): the
        Poisson-sampled Gaussian at the group's z, which covers the update and
        the unclipped count together (see ``noise_multiplier``). The epsilon is
        a proof only for a run inside that model: Poisson sampling and
        ``denominator="expected"``; otherwise the record says
        ``guarantee="conditional"`` and why (``condition``).

        Parameters
        ----------
        delta : float
            In (0, 1).
        n_rounds : int
        sampling_rate : float
            q in (0, 1], the probability that a client takes part in a round.
        accountant : {"rdp", "pld"}
        sampling : {"poisson", "fixed"} or None
            The run's client sampling (``train(..., sampling=)``); None: not
            known, and the epsilon is conditional on it being Poisson.

        Returns
        -------
        ebfl.privacy.accounting.guarantee.FedHDPPrivacy
            ``epsilon`` per group (inf for a group with z = 0), ``in_model``,
            ``guarantee`` and ``condition``.
        """
        from ebfl.privacy.accounting.dp_fedavg import fedhdp_group_epsilons
        from ebfl.privacy.accounting.guarantee import FedHDPPrivacy, dp_fedavg_guarantee

        terms = dp_fedavg_guarantee(sampling=sampling, denominator=self.denominator)
        sampling_rate = check_real_scalar(sampling_rate, "sampling_rate", low=0.0, high=1.0,
                                          low_open=True)
        eps = fedhdp_group_epsilons(sampling_rate=sampling_rate,
                                    noise_multipliers=self.noise_multiplier.tolist(),
                                    n_rounds=n_rounds, delta=delta, accountant=accountant)
        return FedHDPPrivacy(eps, float(delta), int(n_rounds), sampling_rate,
                             tuple(self.noise_multiplier.tolist()), accountant, **terms)


def _rows(mask, like):
    """A per-client vector shaped to broadcast over the rows of ``like``."""
    return mask.reshape(-1, *([1] * (like.dim() - 1)))


def non_private_ditto(model, n_clients, **kwargs):
    """The Non-private+Ditto baseline: FedAvg + Ditto without clipping or noise."""
    kwargs.setdefault("lam", 0.005)
    alg = FedHDP(model, np.zeros(n_clients, np.int64), ratio=1.0, noise_multiplier=0.0,
                 clip=None, **kwargs)
    alg.name = "Non-private+Ditto"
    return alg


def dp_fedavg_ditto(model, n_clients, *, noise_multiplier=1.5, **kwargs):
    """DP-FedAvg+Ditto: every client private at the same multiplier (adaptive clipping)."""
    alg = FedHDP(model, np.zeros(n_clients, np.int64), ratio=1.0,
                 noise_multiplier=noise_multiplier, **kwargs)
    alg.name = "DP-FedAvg+Ditto"
    return alg


def hdp_fedavg_ditto(model, groups, **kwargs):
    """HDP-FedAvg+Ditto: FedHDP with r = 1 (noise only on the private groups)."""
    alg = FedHDP(model, groups, ratio=1.0, **kwargs)
    alg.name = "HDP-FedAvg+Ditto"
    return alg
