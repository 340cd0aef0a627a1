"""Knowledge-distillation baselines: QuPeD without quantization, Federated Mutual Learning."""

from __future__ import annotations

from ebfl._validation import (
    check_nonnegative_scalar,
    check_positive_scalar,
    check_probability,
)
from ebfl.learning.torch.baselines.adaptation import (
    _outputs,
)
from ebfl.learning.torch.baselines.local_copy import (
    _TwoModels,
)
from ebfl.learning.torch.functional import (
    client_grad,
    cross_entropy,
    distillation_kl,
    sgd_step,
)
from ebfl.learning.torch.strategies import (
    check_model,
)

__all__ = ["FML", "QuPeDFP"]


# --- knowledge-distillation baselines --------------------------------------------------------

def _ce_kd(w_ce, w_kd):
    """The loss ``w_ce CE(z, y) + w_kd KL(p_teacher || p_z)`` of a client's model."""
    def loss(forward, params, x, y, teacher):
        z = forward(params, x)
        return w_ce * cross_entropy(z, y) + w_kd * distillation_kl(teacher, z)

    return loss


class QuPeDFP(_TwoModels):
    """QuPeD at full precision (Ozkara, Singh, Data & Diggavi, NeurIPS 2021, Algorithm 1).

    Without quantization the centers and the quantization regularizer drop out
    and each sampled client, per local iteration, takes

    * ``theta <- theta - eta1 grad_theta [f(theta) + lam_p KD(w -> theta)]``;
    * ``w <- w - eta3 grad_w [f(w) + lam_p KD(theta_new -> w)]``,

    where ``KD(a -> b) = KL(p_a || p_b)`` (teacher a) and w is the client's copy
    of the global model; the server averages the copies. The global step
    distills from the *updated* personal model, as Algorithm 1 orders them.

    Message: the global model. Reply: the client's copy w after the round.
    theta (client state) stays on the client.

    Parameters
    ----------
    model : nn.Module
    lr_theta, lr_global : float
        eta1 and eta3 (Section 4.1 of Ozkara et al.: 0.1, 0.1).
    lam_p : float
        lambda_p (Section 4.1: 0.25).
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> QuPeDFP(LogisticModel(4, 3)).config()["lam_p"]
    0.25
    """

    name = "QuPeD-FP"

    def __init__(self, model, lr_theta=0.1, lr_global=0.1, *, lam_p=0.25, weight_decay=1e-4):
        self.model = check_model(model)
        self.lr_theta = check_positive_scalar(lr_theta, "lr_theta")
        self.lr_global = check_positive_scalar(lr_global, "lr_global")
        self.lam_p = check_nonnegative_scalar(lam_p, "lam_p")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr_theta": self.lr_theta, "lr_global": self.lr_global,
                "lam_p": self.lam_p, "weight_decay": self.weight_decay}

    def local_step(self, work, client, x, y, scale, rng):
        w, theta = work["model"], client["theta"]
        teacher = _outputs(self.model, w, x)
        g = client_grad(self.model, _ce_kd(1.0, self.lam_p), theta, x, y, teacher)
        theta = sgd_step(theta, g, self.lr_theta * scale, self.weight_decay)
        teacher = _outputs(self.model, theta, x)
        h = client_grad(self.model, _ce_kd(1.0, self.lam_p), w, x, y, teacher)
        work["model"] = sgd_step(w, h, self.lr_global * scale, self.weight_decay)
        client["theta"] = theta


class FML(_TwoModels):
    """Federated Mutual Learning (Shen et al. 2020, arXiv:2006.16765).

    Each sampled client trains its private (personal) model and its copy of the
    shared "meme" model by deep mutual learning, per local iteration:

    * ``L_personal = alpha CE(personal) + (1 - alpha) KL(p_meme || p_personal)``;
    * ``L_meme = beta CE(meme) + (1 - beta) KL(p_personal || p_meme)``;

    both models step at once, each against the other's outputs on the same
    batch before either update (the authors' code, github.com/ZJU-DAI/
    Federated-Mutual-Learning, ``train_mutual``). alpha and beta weight the
    cross-entropy, as in the paper and that code. The server averages the memes.

    Message: the global meme. Reply: the client's meme after the round. The
    private model (client state ``theta``) stays on the client.

    Parameters
    ----------
    model : nn.Module
    lr : float
        Rate of both models (the same schedule, Section 4.1 of Ozkara et al.).
    lr_meme : float, optional
        Default: ``lr``.
    alpha, beta : float in [0, 1]
        Section 4.1: 0.25, 0.25.
    weight_decay : float

    Examples
    --------
    >>> from ebfl.learning.torch import LogisticModel
    >>> FML(LogisticModel(4, 3), 0.1, alpha=0.5).config()["lr_meme"]
    0.1
    """

    name = "FML"

    def __init__(self, model, lr=0.1, lr_meme=None, *, alpha=0.25, beta=0.25,
                 weight_decay=1e-4):
        self.model = check_model(model)
        self.lr = check_positive_scalar(lr, "lr")
        self.lr_meme = self.lr if lr_meme is None else check_positive_scalar(lr_meme, "lr_meme")
        self.alpha = check_probability(alpha, "alpha")
        self.beta = check_probability(beta, "beta")
        self.weight_decay = check_nonnegative_scalar(weight_decay, "weight_decay")

    def config(self):
        return {"name": self.name, "lr": self.lr, "lr_meme": self.lr_meme, "alpha": self.alpha,
                "beta": self.beta, "weight_decay": self.weight_decay}

    def local_step(self, work, client, x, y, scale, rng):
        meme, theta = work["model"], client["theta"]
        z_meme = _outputs(self.model, meme, x)
        z_personal = _outputs(self.model, theta, x)
        g = client_grad(self.model, _ce_kd(self.alpha, 1 - self.alpha), theta, x, y, z_meme)
        h = client_grad(self.model, _ce_kd(self.beta, 1 - self.beta), meme, x, y, z_personal)
        client["theta"] = sgd_step(theta, g, self.lr * scale, self.weight_decay)
        work["model"] = sgd_step(meme, h, self.lr_meme * scale, self.weight_decay)
