"""The batched forward pass over a stack of client models (ebfl.learning.torch.stacked)
against ``torch.func.vmap`` of each client's own forward pass and gradient."""

import pytest

torch = pytest.importorskip("torch", reason="the learning extra: pip install 'ebfl[learning]'")

from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402

from ebfl.learning.torch.functional import (  # noqa: E402
    ce_loss,
    client_forward,
    client_grad,
    cross_entropy,
    distillation_kl,
    fresh_params,
    replicate,
)
from ebfl.learning.torch.models import CNN5, MLP, LogisticModel  # noqa: E402
from ebfl.learning.torch.stacked import batched_grad, stacked_forward  # noqa: E402


def _stack(model, k, seed=0):
    """k different clients (not copies: a mix-up between clients would go unseen)."""
    base = replicate(fresh_params(model, seed), k)
    g = torch.Generator().manual_seed(seed + 1)
    return {n: v + 0.05 * torch.randn(v.shape, generator=g) for n, v in base.items()}


def _vmap_forward(model, stack, x):
    return vmap(lambda p, xb: functional_call(model, p, (xb,)))(stack, x)


def _vmap_grad(model, loss, stack, *args):
    def one(p, *a):
        return loss(lambda q, xb: functional_call(model, q, (xb,)), p, *a)

    return vmap(grad(one))(stack, *args)


def _close(a, b, tol=2e-5):
    assert sorted(a) == sorted(b)
    for name in a:
        scale = max(1.0, float(b[name].abs().max()))
        assert float((a[name] - b[name]).abs().max()) <= tol * scale, name


MODELS = {
    "mlp": (lambda: MLP(12, 5, hidden=(7, 6)), (12,)),
    "logistic": (lambda: LogisticModel(9, 4), (3, 3)),
    "cnn5": (lambda: CNN5(), (28, 28)),
    "cnn5-channel": (lambda: CNN5(), (1, 28, 28)),
    "sequential-conv": (lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.MaxPool2d(2, stride=1), nn.Conv2d(3, 4, 2, dilation=2), nn.Identity(),
        nn.Flatten(), nn.Linear(4 * 2 * 2, 3)), (2, 9, 9)),
    "linear-on-images": (lambda: nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Flatten(),
                                               nn.Linear(12, 2)), (3, 5)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("k", [1, 4])
def test_forward_equals_vmap(name, k):
    make, shape = MODELS[name]
    model = make()
    stack = _stack(model, k)
    x = torch.randn(k, 6, *shape, generator=torch.Generator().manual_seed(3))
    fast = stacked_forward(model)
    assert fast is not None
    _close({"y": fast(stack, x)}, {"y": _vmap_forward(model, stack, x)})
    _close({"y": client_forward(model, stack, x)}, {"y": _vmap_forward(model, stack, x)})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradient_equals_vmap_grad(name):
    make, shape = MODELS[name]
    model = make()
    k = 3
    stack = _stack(model, k)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(k, 5, *shape, generator=g)
    y = torch.randint(0, 2, (k, 5), generator=g)
    got = batched_grad(stacked_forward(model), ce_loss, stack, (x, y))
    _close(got, _vmap_grad(model, ce_loss, stack, x, y))
    _close(client_grad(model, ce_loss, stack, x, y), _vmap_grad(model, ce_loss, stack, x, y))


def test_loss_with_its_own_terms():
    """AdaPeD's loss: cross-entropy, a distillation term against per-client teachers and a
    per-client scale, and a proximal term on the parameters themselves."""
    model = MLP(10, 4, hidden=(8,))
    k = 5
    stack, anchor = _stack(model, k, 0), _stack(model, k, 7)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(k, 6, 10, generator=g)
    y = torch.randint(0, 4, (k, 6), generator=g)
    teacher = torch.randn(k, 6, 4, generator=g)
    psi = torch.rand(k, generator=g) + 0.5

    def loss(forward, params, xb, yb, t, p, a):
        z = forward(params, xb)
        prox = sum(((params[n] - a[n]) ** 2).sum() for n in params)
        return cross_entropy(z, yb) + distillation_kl(t, z) / (2 * p) + 0.1 * prox

    _close(client_grad(model, loss, stack, x, y, teacher, psi, anchor),
           _vmap_grad(model, loss, stack, x, y, teacher, psi, anchor))


def test_loss_calling_the_model_otherwise_falls_back():
    """A loss that evaluates other parameters than its own takes vmap(grad): same result."""
    model = MLP(6, 3, hidden=(4,))
    k = 2
    stack = _stack(model, k)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(k, 4, 6, generator=g)
    y = torch.randint(0, 3, (k, 4), generator=g)

    def halved(forward, params, xb, yb):
        return cross_entropy(forward({n: v / 2 for n, v in params.items()}, xb), yb)

    assert batched_grad(stacked_forward(model), halved, stack, (x, y)) is None
    _close(client_grad(model, halved, stack, x, y), _vmap_grad(model, halved, stack, x, y))


def test_unsupported_models_have_no_batched_forward():
    assert stacked_forward(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))) is None
    assert stacked_forward(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))) is None
    assert stacked_forward(nn.Sequential(nn.Flatten(2), nn.Linear(3, 3))) is None

    class Own(MLP):  # a subclass may change forward: not trusted
        def forward(self, x):
            return super().forward(x) * 2

    assert stacked_forward(Own(3, 2)) is None
    model = Own(3, 2)
    stack = _stack(model, 2)
    x = torch.randn(2, 4, 3)
    _close({"y": client_forward(model, stack, x)}, {"y": _vmap_forward(model, stack, x)})


def test_inputs_are_not_modified_and_no_grad_is_left_on():
    model = MLP(5, 3, hidden=(4,))
    stack = _stack(model, 2)
    before = {n: v.clone() for n, v in stack.items()}
    x = torch.randn(2, 3, 5)
    y = torch.randint(0, 3, (2, 3))
    with torch.no_grad():
        out = client_grad(model, ce_loss, stack, x, y)
    assert all(not v.requires_grad for v in out.values())
    assert all(not v.requires_grad for v in stack.values())
    _close(stack, before, tol=0)


def test_composes_with_outer_transforms():
    """Differentiating through a step (second order, as Per-FedAvg's Hessian terms do) still
    works: inside a torch.func transform the batched path steps aside."""
    model = MLP(4, 3, hidden=(5,))
    stack = _stack(model, 2)
    x = torch.randn(2, 3, 4)
    y = torch.randint(0, 3, (2, 3))

    def after_step(s):
        g = client_grad(model, ce_loss, s, x, y)
        return sum((s[n] - 0.1 * g[n]).square().sum() for n in s)

    def after_step_vmap(s):
        g = _vmap_grad(model, ce_loss, s, x, y)
        return sum((s[n] - 0.1 * g[n]).square().sum() for n in s)

    _close(grad(after_step)(stack), grad(after_step_vmap)(stack))
    leaves = {n: v.clone().requires_grad_(True) for n, v in stack.items()}
    total = after_step(leaves)
    got = dict(zip(leaves, torch.autograd.grad(total, list(leaves.values())), strict=True))
    _close(got, grad(after_step_vmap)(stack))


@pytest.mark.parametrize("make, shape", [
    (lambda: MLP(12, 5, hidden=(7, 6)), (12,)),
    (lambda: MLP(12, 5, hidden=(7, 6)), (3, 4)),
    (lambda: LogisticModel(9, 4), (9,)),
    (lambda: nn.Sequential(nn.Linear(6, 5, bias=False), nn.ReLU(), nn.Linear(5, 3)), (6,)),
])
@pytest.mark.parametrize("lr", [0.3, "per-client"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_fused_step_equals_the_generic_step(make, shape, lr, weight_decay):
    """In place, one pass per layer: the same update as client_grad + sgd_step, for five
    steps (so that an error in the order of reads and writes would compound)."""
    from ebfl.learning.torch.functional import sgd_step
    from ebfl.learning.torch.stacked import dense_sgd_step_

    model = make()
    k = 4
    rate = torch.tensor([0.3, 0.1, 0.5, 0.2]) if lr == "per-client" else lr
    generic, fused = _stack(model, k), _stack(model, k)
    g = torch.Generator().manual_seed(8)
    for _ in range(5):
        x = torch.randn(k, 6, *shape, generator=g)
        y = torch.randint(0, 3, (k, 6), generator=g)
        generic = sgd_step(generic, _vmap_grad(model, ce_loss, generic, x, y), rate,
                           weight_decay)
        assert dense_sgd_step_(model, ce_loss, fused, x, y, lr=rate, weight_decay=weight_decay)
    _close(fused, generic, tol=1e-5)


def test_fused_step_declines_what_it_does_not_cover():
    from ebfl.learning.torch.stacked import dense_sgd_step_

    x, y = torch.randn(2, 3, 28, 28), torch.randint(0, 10, (2, 3))
    cnn = CNN5()
    stack = _stack(cnn, 2)
    before = {n: v.clone() for n, v in stack.items()}
    assert not dense_sgd_step_(cnn, ce_loss, stack, x, y, lr=0.1)  # convolutions: the generic step
    _close(stack, before, tol=0)
    mlp = MLP(4, 3, hidden=(5,))
    stack = _stack(mlp, 2)
    assert not dense_sgd_step_(mlp, ce_loss, {**stack, "extra": torch.zeros(2)},
                               torch.randn(2, 3, 4), torch.randint(0, 3, (2, 3)), lr=0.1)
    lin = nn.Sequential(nn.Linear(4, 3))  # a Linear over the last axis of (B, 2, 4) inputs
    assert not dense_sgd_step_(lin, ce_loss, _stack(lin, 2), torch.randn(2, 3, 2, 4),
                               torch.randint(0, 3, (2, 3)), lr=0.1)


def _tempered_kd(forward, params, xb, yb, t, p):
    """An AdaPeD-style loss: cross-entropy plus a distillation term weighted per client."""
    z = forward(params, xb)
    return cross_entropy(z, yb) + distillation_kl(t, z) / (2 * p)


def _teacher_side_kd(forward, params, xb, s, p):
    """AdaPeD's loss of the global model: the model is the KL's first argument."""
    return distillation_kl(forward(params, xb), s) / (2 * p)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("lr", [0.2, "per-client"])
def test_fused_proximal_step_equals_dittos_update(lr, weight_decay):
    """anchor/lam: p - lr (g + lam (p - anchor) + wd p), per-client lam; a client with
    rate 0 keeps its model bit for bit (FedHDP's clients of a group with r = 0)."""
    from ebfl.learning.torch.stacked import dense_sgd_step_

    model = MLP(12, 5, hidden=(7, 6))
    k = 4
    rate = torch.tensor([0.3, 0.0, 0.5, 0.2]) if lr == "per-client" else lr
    lam = torch.tensor([0.0, 0.5, 2.0, 0.1], dtype=torch.float64)
    anchor = fresh_params(model, 3)
    generic, fused = _stack(model, k), _stack(model, k)
    start = {n: v.clone() for n, v in fused.items()}
    g = torch.Generator().manual_seed(8)
    r = rate if isinstance(rate, torch.Tensor) else torch.full((k,), rate)

    def rows(c, like):
        return c.reshape(k, *[1] * (like.dim() - 1))
    for _ in range(5):
        x = torch.randn(k, 6, 12, generator=g)
        y = torch.randint(0, 5, (k, 6), generator=g)
        grads = _vmap_grad(model, ce_loss, generic, x, y)
        generic = {n: v - rows(r, v) * (grads[n] + rows(lam.float(), v) * (v - anchor[n])
                                        + weight_decay * v)
                   for n, v in generic.items()}
        assert dense_sgd_step_(model, ce_loss, fused, x, y, lr=rate,
                               weight_decay=weight_decay, anchor=anchor, lam=lam)
    _close(fused, generic, tol=1e-5)
    if lr == "per-client":
        for n in fused:
            assert torch.equal(fused[n][1], start[n][1]), n


@pytest.mark.parametrize("loss, extra", [
    (_tempered_kd, "labels"),
    (_teacher_side_kd, "logits"),
])
def test_fused_step_takes_any_loss_of_the_logits(loss, extra):
    """Other losses than the cross-entropy (AdaPeD's two): the logits' gradient by
    autograd, the layers' backward by hand, equal to client_grad + sgd_step."""
    from ebfl.learning.torch.functional import sgd_step
    from ebfl.learning.torch.stacked import dense_sgd_step_

    model = MLP(12, 5, hidden=(7,))
    k = 3
    generic, fused = _stack(model, k), _stack(model, k)
    g = torch.Generator().manual_seed(4)
    psi = torch.tensor([0.5, 1.0, 4.0])
    for _ in range(4):
        x = torch.randn(k, 6, 12, generator=g)
        other = torch.randn(k, 6, 5, generator=g)
        args = ((x, torch.randint(0, 5, (k, 6), generator=g), other, psi)
                if extra == "labels" else (x, other, psi))
        generic = sgd_step(generic, _vmap_grad(model, loss, generic, *args), 0.3, 0.01)
        assert dense_sgd_step_(model, loss, fused, *args, lr=0.3, weight_decay=0.01)
    _close(fused, generic, tol=1e-5)


def test_fused_step_declines_a_loss_that_uses_the_parameters_directly():
    """A penalty on the parameters would get no update from a logits-only backward:
    the fused step declines (stack untouched) and the generic step is exact."""
    from ebfl.learning.torch.stacked import dense_sgd_step_

    def penalized(forward, params, xb, yb):
        return ce_loss(forward, params, xb, yb) + sum(v.square().sum() for v in params.values())

    def other_input(forward, params, xb, yb):
        return ce_loss(forward, params, xb * 2, yb)

    model = MLP(4, 3, hidden=(5,))
    x, y = torch.randn(2, 3, 4), torch.randint(0, 3, (2, 3))
    for loss in (penalized, other_input):
        stack = _stack(model, 2)
        before = {n: v.clone() for n, v in stack.items()}
        assert not dense_sgd_step_(model, loss, stack, x, y, lr=0.1)
        _close(stack, before, tol=0)
    with pytest.raises(ValueError, match="anchor and lam"):
        dense_sgd_step_(model, ce_loss, _stack(model, 2), x, y, lr=0.1,
                        anchor=fresh_params(model, 0))


def test_cnn_steps_equal_a_per_client_loop_in_float64():
    """Ten SGD steps of CNN5 clients through the grouped convolutions equal each client's
    own autograd steps to rounding in float64 (in float32 the two orders of summation
    drift apart by about 1e-7 a step)."""
    from ebfl.learning.torch.functional import sgd_step

    model = CNN5().double()
    k, b = 3, 4
    start = {n: v.double() for n, v in _stack(model, k).items()}
    g = torch.Generator().manual_seed(9)
    data = [(torch.rand(k, b, 28, 28, generator=g, dtype=torch.float64),
             torch.randint(0, 10, (k, b), generator=g)) for _ in range(10)]
    stacked = dict(start)
    for x, y in data:
        stacked = sgd_step(stacked, client_grad(model, ce_loss, stacked, x, y), 0.2)
    for i in range(k):
        p = {n: v[i].clone() for n, v in start.items()}
        for x, y in data:
            leaves = {n: v.requires_grad_(True) for n, v in p.items()}
            loss = cross_entropy(functional_call(model, leaves, (x[i],)), y[i])
            grads = torch.autograd.grad(loss, list(leaves.values()))
            p = {n: (v - 0.2 * gr).detach() for (n, v), gr in zip(leaves.items(), grads,
                                                                   strict=True)}
        for n in p:
            assert float((stacked[n][i] - p[n]).abs().max()) <= 1e-12, n


def test_cnn_runs_channels_last_with_relu_after_pooling():
    """The two layout choices the CNN's speed rests on stay in place: the grouped
    convolutions see channels-last input on the CPU, and each ReLU that a max-pooling
    follows runs after it (same values: ReLU and max commute)."""
    from ebfl.learning.torch.stacked import _group, _program_of

    x = torch.randn(3, 4, 2, 6, 6)
    grouped = _group(x)
    assert grouped.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(grouped, x.transpose(0, 1).reshape(4, 6, 6, 6))
    ops = [step[0] for step in _program_of(CNN5())]
    assert ops.count("maxpool") == 2
    assert all(ops[i + 1] == "relu" for i, op in enumerate(ops) if op == "maxpool")
    assert torch.equal(torch.relu(torch.nn.functional.max_pool2d(x[0], 2)),
                       torch.nn.functional.max_pool2d(torch.relu(x[0]), 2))
