"""FedEM (a mixture of global models per client) and DP-FedEM (its private variant)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from ebfl._validation import (
    check_int_scalar,
    check_nonnegative_scalar,
    check_positive_scalar,
)
from ebfl.federated.protocol import MAX_SEED
from ebfl.federated.streams import SERVER, stream_seed
from ebfl.learning.torch.baselines.adaptation import (
    _dtype,
    _n_parameters,
    _outputs,
)
from ebfl.learning.torch.functional import (
    client_grad,
    fresh_params,
    sgd_step,
    weighted_mean,
)
from ebfl.learning.torch.strategies import (
    GaussianRelease,
    Strategy,
    _weights,
    check_model,
)

__all__ = ["DPFedEM", "FedEM"]


# --- FedEM and DP-FedEM ----------------------------------------------------------------------

def _per_sample_ce(logits, y):
    """Per-sample cross-entropy: logits (..., B, C), y (..., B) -> (..., B)."""
    return -torch.gather(F.log_softmax(logits, -1), -1, y.unsqueeze(-1)).squeeze(-1)


def _weighted_ce_loss(forward, params, x, y, q):
    return (q * _per_sample_ce(forward(params, x), y)).mean()


def _component_seed(base, c):
    """Seed of component c >= 1's initialization: the server's "init" stream, the component
    in the round's place, so it never equals the run seed that draws component 0."""
    return stream_seed(base, c, SERVER, "init")


class FedEM(Strategy):
    """FedEM (Marfoq, Neglia, Bellet, Kameni & Vidal, NeurIPS 2021, Algorithm 1).

    The server holds M component models; client i holds mixture weights pi_i
    and predicts with ``sum_m pi_im softmax(h_m(x))``. Per local iteration each
    sampled client

    * E-step on its minibatch: ``q_jm ∝ pi_im exp(-CE(h_m(x_j), y_j))``, with
      its current local copies of the components;
    * one SGD step of every component on ``mean_j q_jm CE(h_m(x_j), y_j)``;

    and at the end of the round ``pi_i`` becomes the mean responsibility over
    the round's minibatches (the paper's M-step, which uses the full local
    dataset once per round; here the E-step is per minibatch and pi_i stays
    fixed within a round). The server averages each component over the
    sampled clients.

    Message: the M components. Reply: the client's M local copies after the
    round. pi_i (client state ``pi``) stays on the client.

    Component 0 starts from the run's initial parameters, component c >= 1
    from a fresh initialization of the model drawn from a stream keyed by
    ``init_seed`` (default: the run's seed) and c, never the one of component
    0 (identical components would stay identical); pi starts uniform.

    Evaluation: :meth:`personal_logits` gives the mixture's log-probabilities;
    :meth:`personal` returns each client's highest-weight component, for
    callers that need one model per client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Section 4.1 of Ozkara et al.: 0.2.
    n_components : int
        M (Section 4.1: 2).
    weight_decay : float
    init_seed : int, optional
        Keys the initialization of components 1..M-1 (default: the run's seed).

    Examples
    --------
    >>> from ebfl.federated import RunConfig
    >>> from ebfl.learning.torch import LogisticModel
    >>> strat = FedEM(LogisticModel(4, 3), n_components=3)
    >>> tuple(strat.init_server(RunConfig(n_clients=2, n_rounds=1))["components"]
    ...       ["net.1.weight"].shape)
    (3, 3, 4)
    """

    name = "FedEM"

    def __init__(self, model, lr=0.2, *, n_components=2, weight_decay=1e-4, init_seed=None):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.n_components = check_int_scalar(n_components, "n_components", minimum=1)
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")
        self.init_seed = (None if init_seed is None else
                          check_int_scalar(init_seed, "init_seed", minimum=0, maximum=MAX_SEED))

    def config(self):
        return {"name": self.name, "lr": self.lr, "n_components": self.n_components,
                "weight_decay": self.weight_decay, "init_seed": self.init_seed}

    # ---- server half
    def init_server(self, run):
        first = self.initial_params(run)
        base = run.seed if self.init_seed is None else self.init_seed
        comps = [first] + [{n: p.to(first[n].dtype) for n, p in
                            fresh_params(self.model, _component_seed(base, c)).items()}
                           for c in range(1, self.n_components)]
        return {"components": {n: torch.stack([c[n] for c in comps]) for n in first}}

    def broadcast(self, server, rc):
        return {"components": server["components"]}

    def evaluation_message(self, server):
        return {"components": server["components"]}

    def aggregate(self, server, replies, weights, rc):
        return {"components": weighted_mean(replies["components"], _weights(weights))}

    # ---- client half
    def init_clients(self, run, data, clients):
        dtype = _dtype(self.initial_params(run))
        return {"pi": torch.full((len(clients), self.n_components), 1 / self.n_components,
                                 dtype=dtype, device=self.device)}

    def client_begin(self, message, client, rc):
        k = rc.clients.size
        comps = {n: p.unsqueeze(0).expand(k, *p.shape).clone()
                 for n, p in message["components"].items()}
        return {"components": comps, "q": torch.zeros_like(client["pi"]), "steps": 0}

    def local_step(self, work, client, x, y, scale, rng):
        k, mc = x.shape[0], self.n_components
        # client j's M components are rows j*M .. (j+1)*M - 1 of one flat stack
        flat = {n: p.reshape(k * mc, *p.shape[2:]) for n, p in work["components"].items()}
        xs = x.repeat_interleave(mc, dim=0)
        ys = y.repeat_interleave(mc, dim=0)
        with torch.no_grad():  # E-step: responsibilities (K, M, B)
            losses = _per_sample_ce(_outputs(self.model, flat, xs), ys).reshape(k, mc, -1)
            q = torch.softmax(torch.log(client["pi"])[:, :, None] - losses, dim=1)
        g = client_grad(self.model, _weighted_ce_loss, flat, xs, ys, q.reshape(k * mc, -1))
        flat = sgd_step(flat, self.release(g, rng), self.lr * scale, self.weight_decay)
        work["components"] = {n: p.reshape(k, mc, *p.shape[1:]) for n, p in flat.items()}
        work["q"] = work["q"] + q.mean(-1)
        work["steps"] += 1

    def release(self, g, rng):
        """The components' gradients as they leave the client (DP-FedEM privatizes them)."""
        return g

    def client_reply(self, work, client):
        client["pi"] = work["q"] / work["steps"]  # the M-step closes the client's round
        return {"components": work["components"]}

    def personal(self, message, client, data):
        best = client["pi"].argmax(1)
        return {n: p[best] for n, p in message["components"].items()}

    def global_state(self, server):
        """None: FedEM has no single global model (each client predicts with its own mixture
        of the server's M components)."""
        return None

    def trained_parameters(self):
        """Parameters each client trains: its copies of the M components (buffers and the M
        mixture weights not counted)."""
        return self.n_components * _n_parameters(self.model)

    def communicated_parameters(self):
        """Parameters sent each way per sampled client and round: the M components."""
        return self.n_components * _n_parameters(self.model)

    @torch.no_grad()
    def personal_logits(self, message, client, data, x, *, chunk=16):
        """Log-probabilities of every client's mixture on its own inputs.

        Parameters
        ----------
        message : dict
            ``{"components": ...}`` (:meth:`evaluation_message`).
        client : dict
            The clients' states (``pi``: (K, M)).
        data : ClientSubset
            Unused: the mixture needs no data beyond ``x``.
        x : Tensor (K, n, ...)
            Client j's inputs in row j (e.g. ``data.x_test``).
        chunk : int
            Clients per forward pass.

        Returns
        -------
        Tensor (K, n, classes)
            ``log sum_c pi_jc softmax(h_c(x_ji))``.
        """
        chunk = check_int_scalar(chunk, "chunk", minimum=1)
        comps, pi = message["components"], client["pi"]
        dtype = _dtype(comps)
        k_all, n = x.shape[:2]
        out = []
        for lo in range(0, k_all, chunk):
            xb = x[lo:lo + chunk].to(dtype)
            k = xb.shape[0]
            flat = xb.reshape(k * n, *xb.shape[2:])
            parts = []
            for c in range(self.n_components):
                z = functional_call(self.model, {p: v[c] for p, v in comps.items()}, (flat,))
                parts.append(F.log_softmax(z, -1).reshape(k, n, -1)
                             + torch.log(pi[lo:lo + k, c])[:, None, None])
            out.append(torch.logsumexp(torch.stack(parts), dim=0))
        return torch.cat(out)


class DPFedEM(GaussianRelease, FedEM):
    """DP-FedEM as in Figure 3 of Ozkara et al. (Section 4): FedEM with the M components'
    gradients concatenated, clipped and Gaussian-noised at every local step.

    Each sampled client's M component gradients, as one vector, are scaled to
    L2 norm at most ``clip`` and N(0, ``noise``^2) is added to every coordinate
    (:func:`~ebfl.learning.torch.functional.clip_and_noise`, client j's noise
    from its own stream of the round), exactly the mechanism of
    :class:`~ebfl.generative.algorithm.DPAdaPeD` with ``concatenate=True``; the
    mixture weights pi never leave the client. The server averages the
    components *unweighted* (every client's weight is 1): weights by
    training-set size would let a large client's update exceed the 1/K share
    the accountant assumes. Models with BatchNorm running statistics are
    refused: the reply would carry them, computed from the client's data and
    not noised.

    Parameters
    ----------
    model : nn.Module
    lr : float
    clip, noise : float
        C > 0 and sigma >= 0.
    **kwargs
        As :class:`~ebfl.learning.torch.baselines.FedEM`.

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> strat = DPFedEM(LogisticModel(4, 3), clip=1.0, noise=0.0)
    >>> strat.privacy(1e-5, n_clients=50, n_sampled=5, n_iterations=100, sync_gap=10)
    inf
    """

    name = "DP-FedEM"

    def __init__(self, model, lr=0.2, *, clip, noise, **kwargs):
        super().__init__(model, lr, **kwargs)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
               for m in model.modules()):
            raise ValueError("model must not have BatchNorm running statistics: DP-FedEM's "
                             "reply carries each component's buffers, computed from the "
                             "client's data and not noised (use a model without BatchNorm, "
                             "e.g. with GroupNorm)")
        self.clip = check_positive_scalar(clip, "clip")
        self.noise = check_nonnegative_scalar(noise, "noise")

    def config(self):
        return {**super().config(), "clip": self.clip, "noise": self.noise}

    def release(self, g, rng):
        return self.privatize(g, self.clip, self.noise, rng, rows_per_client=self.n_components)

    def client_weights(self, data):
        return np.ones(data.n_clients)

    def privacy(self, delta, *, n_clients, n_sampled, n_iterations, sync_gap,
                sampling="without_replacement", trust="aggregator", accountant="rdp"):
        """Epsilon of a run by the accountant of :func:`ebfl.privacy.accounting.dp_adaped_epsilon`.

        The released mechanism is the same as concatenated DP-AdaPeD's (one
        block, clip C, noise sigma per step, tau steps per round), so the same
        accountant applies; the paper states no privacy theorem for DP-FedEM.

        Returns
        -------
        float
            Epsilon at ``delta`` (inf without noise).
        """
        from ebfl.privacy.accounting import dp_adaped_epsilon

        if self.noise == 0:
            return float("inf")
        return float(dp_adaped_epsilon(delta, n_clients=n_clients, n_sampled=n_sampled,
                                       n_iterations=n_iterations, sync_gap=sync_gap,
                                       clip_mu=self.clip, noise_mu=self.noise, sampling=sampling,
                                       trust=trust, accountant=accountant).epsilon)
