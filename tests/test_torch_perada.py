"""PerAda (Algorithm 1 of Xie et al., CVPR 2024): client steps, server distillation, runtimes,
and the exact generalization inequalities on real evaluations."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call  # noqa: E402

from ebfl.federated import RoundContext, RunConfig, run  # noqa: E402
from ebfl.learning.torch.adapters import SmallResNet, parameter_groups  # noqa: E402
from ebfl.learning.torch.data import FederatedDataset  # noqa: E402
from ebfl.learning.torch.distillation import _kd_loss, distill, ensemble_logits  # noqa: E402
from ebfl.learning.torch.engine import train  # noqa: E402
from ebfl.learning.torch.functional import eval_mode, replicate  # noqa: E402
from ebfl.perada.algorithm import PerAda  # noqa: E402
from ebfl.perada.generalization import (  # noqa: E402
    InequalityViolation,
    check_inequalities,
    generalization_report,
)
from tests.test_federated import assert_trees_close, drive_one_client_at_a_time  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _images(rng, n, label_shift):
    """Class-dependent 12x12 images: a bright square at a class-dependent place, plus noise."""
    y = rng.integers(0, 4, n)
    x = rng.random((n, 12, 12)).astype(np.float32) * 0.3
    for i, c in enumerate(y):
        r, col = divmod(int(c + label_shift) % 4, 2)
        x[i, 6 * r:6 * r + 6, 6 * col:6 * col + 6] += 0.7
    return x, y


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    parts = [_images(rng, n, 0) for n in (30, 24, 36, 20, 28)]
    tests = [_images(rng, 12, 0) for _ in parts]
    return FederatedDataset.from_clients([p[0] for p in parts], [p[1] for p in parts],
                                         [t[0] for t in tests], [t[1] for t in tests],
                                         n_classes=4)


def _net(dropout=0.3):
    return SmallResNet(4, 1, widths=(4, 8), dropout=dropout)


def _pretrained(net, seed=3):
    """A stand-in 'pretrained' state: a seeded initialization of the whole model."""
    from ebfl.learning.torch.functional import fresh_params

    return fresh_params(net, seed)


def _aux(n=64, seed=1):
    return torch.rand((n, 12, 12), generator=torch.Generator().manual_seed(seed))


def _config(**kw):
    base = dict(n_clients=5, n_rounds=3, seed=7, clients_per_round=3, local_steps=3,
                batch_size=6)
    return RunConfig(**{**base, **kw})


def test_reply_is_the_local_adapter_only_and_the_backbone_never_moves(data):
    net = _net()
    pre = _pretrained(net)
    alg = PerAda(net, pre, lr=0.1, aux=_aux(), kd_steps=2)
    adapter = set(parameter_groups(net)["adapter"])
    assert set(alg.trainable) == adapter | {"dropout_key"}
    res = run(alg, data, _config())
    assert set(res.server["global"]) == set(alg.trainable)
    for name, t in alg.frozen().items():
        assert torch.equal(t, pre[name]), name  # frozen backbone, downsample BN stats included
    assert set(res.clients["personal"]) == set(alg.trainable)


def _by_hand_step(alg, v, w, x, y, lr, lam):
    """One personalized step with plain autograd on one client: grad CE + lam (v - w)."""
    net = alg.model
    names = dict(net.named_parameters())
    params = {n: t.clone().requires_grad_(True) for n, t in v.items() if n in names}
    buffers = {n: t.clone() for n, t in v.items() if n not in names}
    with alg.training():  # frozen BatchNorms in eval mode, the adapter set's in train mode
        loss = torch.nn.functional.cross_entropy(
            functional_call(net, (params, buffers, alg.frozen()), (x,)), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    out = {n: (p - lr * (g + lam * (p - w[n]))).detach()
           for (n, p), g in zip(params.items(), grads, strict=True)}
    return {**out, **buffers}


def test_personal_step_is_sgd_on_cross_entropy_plus_the_proximal_pull(data):
    net = _net(dropout=0.0)
    alg = PerAda(net, _pretrained(net), lr=0.05, lr_personal=0.2, lam=3.0)
    run_cfg = _config()
    w = alg.initial_params(run_cfg)
    rng = torch.Generator().manual_seed(0)
    v = {n: t + 0.01 * torch.randn(t.shape, generator=rng) for n, t in w.items()}
    client = {"personal": replicate(v, 1)}
    rc = RoundContext(run_cfg, 0, np.array([2]))
    work = alg.client_begin({"global": w}, client, rc)
    sub = data.subset([2])
    x, y = sub.x_train[:, :6], sub.y_train[:, :6]
    with alg.training():
        alg.local_step(work, client, x, y, 1.0, [torch.Generator().manual_seed(1)])
    expected = _by_hand_step(alg, v, w, x[0], y[0], 0.2, 3.0)
    for name, t in expected.items():
        if name == "dropout_key":
            continue
        torch.testing.assert_close(client["personal"][name][0], t, rtol=1e-5, atol=1e-6)


def test_without_distillation_the_global_adapter_is_the_uniform_average(data):
    net = _net()
    alg = PerAda(net, _pretrained(net))
    assert alg.name == "PerAda w/o KD"
    g = torch.Generator().manual_seed(0)
    thetas = {n: torch.randn((3, *t.shape), generator=g) for n, t in alg.initial_params(
        _config()).items()}
    out = alg.aggregate({}, {"theta": thetas}, np.array([1.0, 50.0, 3.0]),
                        RoundContext(_config(), 0, np.array([0, 1, 2])))
    for name, t in thetas.items():
        torch.testing.assert_close(out["global"][name], t.mean(0))  # not data-size weighted


def test_a_distillation_run_lowers_the_students_kl_to_the_teachers(data):
    net = _net()
    alg = PerAda(net, _pretrained(net))
    w = alg.initial_params(_config())
    g = torch.Generator().manual_seed(2)
    teachers = {n: (t + 0.3 * torch.randn((3, *t.shape), generator=g)
                    if t.is_floating_point() and n != "dropout_key" and "running" not in n
                    else t.expand(3, *t.shape).clone()) for n, t in w.items()}
    aux = _aux(96)
    teacher = ensemble_logits(net, teachers, aux, frozen=alg.frozen())
    student0 = {n: t.mean(0) for n, t in teachers.items()}

    def kl(state):
        with torch.no_grad(), eval_mode(net):
            return float(_kd_loss(teacher, functional_call(net, (state, alg.frozen()), (aux,)),
                                  1.0))

    for optimizer, lr in (("sgd", 0.5), ("adam", 0.01)):
        out, info = distill(net, student0, teacher, aux, steps=30, lr=lr, batch_size=32,
                            generator=torch.Generator().manual_seed(0), optimizer=optimizer,
                            frozen=alg.frozen())
        assert info["kd_steps"] == 30
        assert kl(out) < 0.5 * kl(student0), optimizer
        for name in student0:  # running statistics are not changed by distillation
            if "running" in name:
                assert torch.equal(out[name], student0[name])


def test_early_stopping_keeps_the_best_student_and_can_keep_the_average(data):
    net = _net()
    alg = PerAda(net, _pretrained(net))
    w = alg.initial_params(_config())
    aux = _aux(64)
    teacher = torch.zeros((64, 4))
    teacher[:, 0] = 10.0  # the teachers all say class 0
    x = data.x_test[0, :12]
    y = torch.full((12,), 3)  # the validation labels all say class 3: distillation only hurts
    out, info = distill(net, w, teacher, aux, steps=40, lr=0.5, batch_size=16,
                        generator=torch.Generator().manual_seed(0), frozen=alg.frozen(),
                        validation=(x, y), patience=5)
    assert info["kd_best_step"] in (0,) or info["kd_steps"] < 40
    if info["kd_best_step"] == 0:
        for name in w:
            assert torch.equal(out[name], w[name])


def test_kd_only_in_the_first_kd_rounds(data):
    net = _net()
    alg = PerAda(net, _pretrained(net), aux=_aux(), kd_steps=2, kd_rounds=1)
    res = train(alg, data, n_rounds=3, local_steps=2, clients_per_round=2, batch_size=4, seed=1,
                lr_decay=1.0)
    assert [("kd_steps" in h) for h in res.history] == [True, False, False]


@pytest.mark.parametrize("kd", [False, True])
def test_stacked_clients_equal_clients_run_one_at_a_time(data, kd):
    net = _net(dropout=0.3)  # the dropout masks too are per client
    alg = PerAda(net, _pretrained(net), lr=0.1, lam=1.0,
                 aux=_aux() if kd else None, kd_steps=3, kd_batch_size=16)
    config = _config()
    res = run(alg, data, config, failures={1: [2]})
    server, clients, metrics = drive_one_client_at_a_time(alg, data, config, failures={1: [2]})
    assert_trees_close(res.server, server, atol=1e-6)
    assert_trees_close(res.clients, clients, atol=1e-6)
    np.testing.assert_allclose(res.metrics["accuracy"], metrics["accuracy"], atol=1e-6)


def test_resumed_run_equals_the_uninterrupted_one(data, tmp_path):
    net = _net()
    alg = PerAda(net, _pretrained(net), aux=_aux(), kd_steps=2)
    kw = dict(local_steps=2, clients_per_round=2, batch_size=4, seed=4)
    full = train(alg, data, n_rounds=4, **kw)
    ck = tmp_path / "ck.pt"
    train(alg, data, n_rounds=2, checkpoint=ck, **kw)
    resumed = train(alg, data, n_rounds=4, checkpoint=ck, **kw)
    assert_trees_close(resumed.server, full.server)
    assert_trees_close(resumed.clients, full.clients)


def test_inequalities_of_theorems_1_and_2_hold_on_a_real_evaluation(data):
    net = _net()
    aux = _aux()
    alg = PerAda(net, _pretrained(net), lr=0.2, aux=aux, kd_steps=3)
    res = train(alg, data, n_rounds=4, local_steps=4, clients_per_round=3, batch_size=6, seed=2)
    x = data.x_test.reshape(-1, 12, 12)[:40]
    y = data.y_test.reshape(-1)[:40]
    shifted = (x.flip(-1), y)
    report = generalization_report(alg, res.server, res.clients, data, global_test=(x, y),
                                   ood={"flipped": shifted}, aux=aux)
    for name in ("global_test", "flipped"):
        entry = report[name]
        assert set(entry["inequalities"]) == {"inequality_1", "inequality_2", "inequality_3"}
        assert min(entry["inequalities"].values()) >= -1e-5
        assert 0 <= entry["phi"] <= 2 and 0 <= entry["prediction_distance"] <= 1
        # the averaged form of inequality 1: 0-1 error <= 2 x soft error
        assert (100 - entry["global_model"]) / 100 <= 2 * entry["global_soft_error"] + 1e-6
    assert 0 <= report["local"]["mean"] <= 100 and "weighted_mean" in report["local"]
    assert report["phi_aux"] >= 0


def test_check_inequalities_detects_a_violation():
    y = torch.tensor([0, 1])
    g = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    p = g[None].clone()
    check_inequalities(p, g, y)
    g_bad = torch.tensor([[0.95, 0.96], [0.2, 0.8]])  # not a probability vector: g_y = 0.95
    with pytest.raises(InequalityViolation, match="inequality_1"):  # yet argmax g != y
        check_inequalities(g_bad[None], g_bad, y)


def test_bad_input(data):
    net = _net()
    pre = _pretrained(net)
    with pytest.raises(ValueError, match="pretrained lacks frozen backbone"):
        PerAda(net, {k: v for k, v in pre.items() if k != "conv1.weight"})
    with pytest.raises(ValueError, match="lam"):
        PerAda(net, pre, lam=-1)
    with pytest.raises(TypeError, match="aux"):
        PerAda(net, pre, aux=np.zeros((3, 12, 12)))
    with pytest.raises(ValueError, match="kd_patience needs kd_validation"):
        PerAda(net, pre, aux=_aux(), kd_patience=3)
    with pytest.raises(ValueError, match="kd_optimizer"):
        PerAda(net, pre, kd_optimizer="rmsprop")
    with pytest.raises(ValueError, match="trainable names"):
        PerAda(net, pre, trainable=["nope"])
    with pytest.warns(RuntimeWarning, match="overshoots"):
        PerAda(net, pre, lr=0.2, lam=20.0)


def test_a_proximal_step_with_lr_times_lam_above_2_moves_v_away_from_w():
    """Why PerAda warns: the pull's factor on v - w is 1 - lr lam (here -3)."""
    v, w, lr, lam = torch.tensor([1.0]), torch.tensor([0.0]), 0.2, 20.0
    for _ in range(3):
        v = v - lr * lam * (v - w)
    assert abs(float(v)) == pytest.approx(27.0)


def test_dp_adaped_refuses_a_model_whose_reply_would_carry_unnoised_statistics():
    from ebfl.generative.algorithm import DPAdaPeD

    with pytest.raises(ValueError, match="not noised"):
        DPAdaPeD(_net(), 0.1, 0.1, clip_mu=1.0, noise_mu=1.0)
