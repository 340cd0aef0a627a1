"""PerAda's adapter architectures: counts, identity at init, deterministic dropout, loading."""

import math

import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call, vmap  # noqa: E402

from ebfl.learning.torch.adapters import (  # noqa: E402
    AdapterBlock,
    ResNet18Adapters,
    SmallResNet,
    _hash_dropout,
    _hash_uniform,
    load_torchvision_weights,
    parameter_counts,
    parameter_groups,
    split_state,
)
from ebfl.learning.torch.functional import buffer_names, eval_mode, model_state  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _zero_adapters(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".adapter" in name and name.endswith("conv.weight"):
                p.zero_()


def _backbone_twin(model, cls, **kwargs):
    """The same architecture without adapters, holding ``model``'s backbone tensors."""
    twin = cls(**kwargs, adapters=False)
    state = model.state_dict()
    twin.load_state_dict({name: state[name] for name in twin.state_dict()})
    return twin


# --------------------------------------------------------------------------- counts


def test_resnet18_parameter_counts_match_table_1():
    # Table 1 of PerAda: 11.18M backbone, 1.41M adapter set (12.6 %); the exact
    # counts follow from the construction (conv 1x1 4*(64^2+128^2+256^2+512^2) = 1,392,640,
    # adapter BNs 7,680, block BNs 7,680, stem BN 128, fc 5,130).
    plain = parameter_counts(ResNet18Adapters(n_classes=10, adapters=False))
    counts = parameter_counts(ResNet18Adapters(n_classes=10))
    assert plain["all"] == 11_181_642
    assert counts["adapter"] == 1_413_258
    assert counts["all"] == 12_581_962
    assert counts["backbone"] == plain["all"] - (7_680 + 128 + 5_130)
    assert counts["output"] == 5_130
    assert counts["input"] == 3 * 64 * 49 + 128


def test_small_resnet_parameter_count():
    counts = parameter_counts(SmallResNet(adapters=False))
    # stem 144+32, block 1: 2*2304+64, block 2: 4608+9216+128+512+64,
    # block 3: 18432+36864+256+2048+128, fc 650
    assert counts["all"] == 77_754
    with_adapters = parameter_counts(SmallResNet())
    assert with_adapters["all"] - counts["all"] == 2 * (16**2 + 32**2 + 64**2) + 4 * (16 + 32 + 64)


def test_torchvision_names():
    names = list(ResNet18Adapters(adapters=False).state_dict())
    assert names[:5] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                         "bn1.running_var"]
    assert "layer2.0.downsample.0.weight" in names and "layer4.1.bn2.running_var" in names
    assert names[-2:] == ["fc.weight", "fc.bias"]
    assert len(names) == 102  # torchvision's 122 keys less its 20 num_batches_tracked
    assert not any("num_batches_tracked" in n for n in ResNet18Adapters().state_dict())


def test_state_is_float_only():
    model = ResNet18Adapters(n_classes=10)
    assert all(t.is_floating_point() for t in model.state_dict().values())
    assert model.dropout_key.dtype == torch.float64
    assert set(model_state(model)) == set(model.state_dict())
    model.load_state_dict(dict(model.state_dict()))  # a plain dict (no version metadata) loads


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize("model", [SmallResNet(widths=(4, 8, 8)), SmallResNet(adapters=False),
                                   ResNet18Adapters(n_classes=10)],
                         ids=["small", "small-plain", "resnet18"])
def test_groups_partition_the_state(model):
    groups = parameter_groups(model)
    names = list(model.state_dict())
    assert groups["all"] == names
    for a, b in (("adapter", "backbone"), ("feature_extractor", "output")):
        assert not set(groups[a]) & set(groups[b])
        assert sorted(groups[a] + groups[b]) == sorted(names)
    for group in groups.values():  # state_dict order
        assert group == sorted(group, key=names.index)
    bn = {n for m_name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)
          for n in names if n.startswith(m_name + ".")}
    assert set(groups["bn"]) == bn
    assert groups["input"] == [n for n in names if n.split(".")[0] in ("conv1", "bn1")]
    assert all("downsample" not in n for n in groups["adapter"])
    assert all(n in groups["adapter"] for n in names if ".adapter" in n or n.startswith("fc."))


def test_split_state_clones():
    model = SmallResNet(widths=(4,))
    names = parameter_groups(model)["adapter"]
    selected, rest = split_state(model, names)
    assert list(selected) == names
    assert set(rest) == set(model.state_dict()) - set(names)
    selected["fc.weight"].add_(1.0)
    assert not torch.equal(selected["fc.weight"], model.fc.weight)
    with pytest.raises(ValueError, match="nope"):
        split_state(model, ["fc.weight", "nope"])
    with pytest.raises(TypeError, match="model"):
        parameter_groups(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize("cls, kwargs, shape", [
    (SmallResNet, {"widths": (4, 8)}, (6, 28, 28)),
    (ResNet18Adapters, {"n_classes": 10}, (2, 3, 32, 32)),
])
def test_zero_adapters_are_the_identity(cls, kwargs, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    model = cls(**kwargs, dropout=0.0)
    _zero_adapters(model)
    twin = _backbone_twin(model, cls, **kwargs)
    with torch.no_grad():
        assert torch.equal(model(x), twin(x))  # train mode: batch statistics
        with eval_mode(model), eval_mode(twin):
            assert torch.equal(model(x), twin(x))


def test_adapters_sit_between_conv_and_bn():
    model = SmallResNet(widths=(4, 8)).eval()
    block = model.layer2[0]
    seen = {}
    for name in ("conv1", "adapter1", "bn1", "conv2", "adapter2", "bn2"):
        getattr(block, name).register_forward_hook(
            lambda mod, args, out, name=name: seen.update({name: (args[0], out)}))
    model(torch.randn(2, 28, 28))
    for conv, adapter, bn in (("conv1", "adapter1", "bn1"), ("conv2", "adapter2", "bn2")):
        assert seen[adapter][0] is seen[conv][1]
        assert seen[bn][0] is seen[adapter][1]


def test_default_init_is_near_the_identity():
    torch.manual_seed(1)
    x = torch.randn(8, 28, 28)
    model = SmallResNet(widths=(8, 16))  # N(0, 1e-4^2) adapter convs, dropout 0.3
    twin = _backbone_twin(model, SmallResNet, widths=(8, 16))
    with torch.no_grad():
        for train in (False, True):
            model.train(train)
            twin.train(train)
            out, ref = model(x), twin(x)
            assert float((out - ref).norm() / ref.norm()) < 1e-3
            assert not torch.equal(out, ref)


# --------------------------------------------------------------------------- dropout


def test_dropout_keeps_one_minus_p():
    p, shape = 0.3, (200, 500)
    u = _hash_uniform(torch.tensor(123.0, dtype=torch.float64), 7, shape)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    n = math.prod(shape)
    kept = float((u >= p).double().mean())
    assert abs(kept - (1 - p)) < 4 * math.sqrt(p * (1 - p) / n)
    # uniform: mean 1/2 and no correlation between neighbouring elements
    flat = u.flatten()
    assert abs(float(flat.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / n)
    corr = float(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1])
    assert abs(corr) < 4 / math.sqrt(n)
    # nor between the next key's numbers and these (the next step's mask)
    after = _hash_uniform(torch.tensor(124.0, dtype=torch.float64), 7, shape).flatten()
    assert abs(float(torch.corrcoef(torch.stack([flat, after]))[0, 1])) < 4 / math.sqrt(n)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9])
def test_dropout_rate_for_several_p(p):
    x = torch.ones(50, 40, 10)
    out = _hash_dropout(x, p, torch.tensor(float(round(1e4 * p)), dtype=torch.float64), 3)
    kept = float((out != 0).double().mean())
    assert abs(kept - (1 - p)) < 4 * math.sqrt(p * (1 - p) / x.numel())
    assert torch.allclose(out[out != 0], torch.tensor(1 / (1 - p)))
    # the same key drops a superset of elements at a larger p
    larger = _hash_dropout(x, min(p + 0.05, 0.99),
                           torch.tensor(float(round(1e4 * p)), dtype=torch.float64), 3)
    assert bool(((larger != 0) <= (out != 0)).all())


def test_dropout_masks_differ_across_keys_salts_and_steps():
    x = torch.ones(4, 8, 5, 5)
    key = torch.tensor(0.0, dtype=torch.float64)
    masks = [_hash_dropout(x, 0.5, key + k, s) for k, s in ((0, 0), (1, 0), (0, 1))]
    assert torch.equal(masks[0], _hash_dropout(x, 0.5, key.clone(), 0))  # deterministic
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert float((masks[a] != masks[b]).double().mean()) > 0.3  # ~1/2 for independent
    assert set(masks[0].unique().tolist()) == {0.0, 2.0}  # kept values scaled by 1/(1-p)

    model = SmallResNet(widths=(4,), dropout=0.5)
    with torch.no_grad():
        model.layer1[0].adapter1.conv.weight.normal_()
    x = torch.randn(3, 28, 28)
    with eval_mode(model):  # BatchNorm on running statistics, so only dropout can differ
        ref = model(x)
    outs = []
    for _ in range(2):
        outs.append(_forward_with_eval_bn(model, x))
    assert float(model.dropout_key) == 2.0  # one step per train-mode forward
    assert not torch.equal(outs[0], outs[1])
    model.dropout_key.fill_(0.0)
    assert torch.equal(_forward_with_eval_bn(model, x), outs[0])
    with eval_mode(model):
        assert torch.equal(model(x), ref)  # eval mode: no dropout, the key is not used
        assert float(model.dropout_key) == 1.0


def _forward_with_eval_bn(model, x):
    """Train-mode forward (dropout on) with every BatchNorm in eval mode."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    with torch.no_grad():
        return model(x)


def test_no_dropout_no_key_step():
    model = SmallResNet(widths=(4,), dropout=0.0)
    model(torch.randn(2, 28, 28))
    assert float(model.dropout_key) == 0.0
    block = AdapterBlock(4, dropout=0.2)
    with pytest.raises(ValueError, match="key"):
        block(torch.randn(2, 4, 3, 3))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vmap_over_clients_equals_one_client_at_a_time(dtype):
    torch.manual_seed(0)
    k = 3
    model = SmallResNet(widths=(4, 8), dropout=0.5).to(dtype)
    model.dropout_key.data = model.dropout_key.data.double()
    state = model_state(model)
    stack = {n: torch.stack([t + (0.1 * torch.randn_like(t) if n != "dropout_key" else 0)
                             for _ in range(k)]) for n, t in state.items()}
    stack["dropout_key"] = torch.tensor([5.0, 17.0, 2.0**31 - 2], dtype=torch.float64)
    buffers = set(buffer_names(model))
    params = {n: t for n, t in stack.items() if n not in buffers}
    batched = {n: t.clone() for n, t in stack.items() if n in buffers}
    x = torch.randn(k, 6, 28, 28, dtype=dtype)
    model.train()
    out = vmap(lambda p, b, xb: functional_call(model, (p, b), (xb,)))(params, batched, x)
    # torch's batched conv/linear kernels may sum in another order than the single ones:
    # float32 agrees to a few ulps; in float64 a different dropout mask would show at O(1)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0, "atol": 1e-12}
    for i in range(k):
        alone = {n: t[i].clone() for n, t in stack.items() if n in buffers}
        ref = functional_call(model, ({n: t[i] for n, t in params.items()}, alone), (x[i],))
        torch.testing.assert_close(out[i], ref, **tol)
        for name in buffers:
            torch.testing.assert_close(batched[name][i], alone[name], **tol)
        assert float(batched["dropout_key"][i]) == float(alone["dropout_key"])
    assert batched["dropout_key"].tolist() == [6.0, 18.0, 0.0]  # wraps below 2^31 - 1
    assert not torch.equal(batched["layer1.0.bn1.running_mean"],
                           stack["layer1.0.bn1.running_mean"])


def test_gradients_through_vmap_with_buffers():
    """functional.client_grad differentiates the parameters and updates each client's key."""
    from ebfl.learning.torch.functional import client_grad, replicate

    torch.manual_seed(0)
    model = SmallResNet(n_classes=3, widths=(4,), dropout=0.3).train()
    stack = replicate(model_state(model), 2)
    x, y = torch.randn(2, 5, 28, 28), torch.randint(0, 3, (2, 5))

    def loss(forward, params, xb, yb):
        return torch.nn.functional.cross_entropy(forward(params, xb), yb)

    grads = client_grad(model, loss, stack, x, y)
    assert "dropout_key" not in grads and "fc.weight" in grads
    assert stack["dropout_key"].tolist() == [1.0, 1.0]


# --------------------------------------------------------------------------- loading


def _torchvision_state(n_classes=1000, seed=0):
    """A random state dict under torchvision's ResNet-18 keys (num_batches_tracked included)."""
    torch.manual_seed(seed)
    state = {}
    for name, t in ResNet18Adapters(n_classes, adapters=False).state_dict().items():
        state[name] = torch.randn_like(t) if not name.endswith("running_var") else \
            torch.rand_like(t) + 0.5
        if name.endswith("running_var"):
            state[name[:-len("running_var")] + "num_batches_tracked"] = torch.tensor(7)
    return state


def test_load_torchvision_weights_round_trip(tmp_path):
    weights = _torchvision_state(n_classes=10)
    assert len(weights) == 122  # the key count of torchvision's resnet18 state_dict
    path = tmp_path / "resnet18.pth"
    torch.save(weights, path)
    before = {n: t.clone() for n, t in weights.items()}
    model = ResNet18Adapters(n_classes=10)
    adapter_before = model.layer3[1].adapter2.conv.weight.clone()
    report = load_torchvision_weights(model, path)
    assert report.head_loaded and len(report.loaded) == 102
    assert all(n.endswith("num_batches_tracked") for n in report.skipped)
    state = model.state_dict()
    assert all(torch.equal(state[n], weights[n]) for n in report.loaded)
    assert torch.equal(model.layer3[1].adapter2.conv.weight, adapter_before)
    assert all(torch.equal(weights[n], before[n]) for n in weights)  # input untouched
    with eval_mode(model):
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def test_load_torchvision_weights_skips_a_different_head():
    weights = _torchvision_state(n_classes=1000)
    model = ResNet18Adapters(n_classes=10)
    head = model.fc.weight.clone()
    report = load_torchvision_weights(model, weights)
    assert not report.head_loaded
    assert "left as initialised" in report.skipped["fc.weight"]
    assert torch.equal(model.fc.weight, head)
    assert torch.equal(model.conv1.weight, weights["conv1.weight"])


def test_load_torchvision_weights_names_bad_keys():
    model = ResNet18Adapters(n_classes=10)
    conv = model.conv1.weight.clone()
    weights = _torchvision_state(n_classes=10)
    weights["layer9.0.conv1.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unknown keys.*layer9.0.conv1.weight"):
        load_torchvision_weights(model, weights)
    weights = _torchvision_state(n_classes=10)
    del weights["layer2.1.bn1.running_mean"]
    with pytest.raises(ValueError, match="missing keys.*layer2.1.bn1.running_mean"):
        load_torchvision_weights(model, weights)
    weights = _torchvision_state(n_classes=10)
    weights["layer1.0.conv2.weight"] = torch.zeros(64, 64, 1, 1)
    with pytest.raises(ValueError, match=r"layer1.0.conv2.weight.*\(64, 64, 3, 3\)"):
        load_torchvision_weights(model, weights)
    weights = _torchvision_state(n_classes=10)
    weights["conv1.weight"][0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="conv1.weight.*finite"):
        load_torchvision_weights(model, weights)
    assert torch.equal(model.conv1.weight, conv)  # nothing copied on error
    with pytest.raises(TypeError, match="model"):
        load_torchvision_weights(SmallResNet(), weights)
    with pytest.raises(TypeError, match="weights"):
        load_torchvision_weights(model, [1, 2])


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize("kwargs, match", [
    ({"n_classes": 0}, "n_classes"), ({"widths": ()}, "widths"),
    ({"widths": (4, -1)}, r"widths\[1\]"), ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"), ({"in_channels": 2.5}, "in_channels"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SmallResNet(**kwargs)


def test_small_resnet_accepts_both_input_layouts():
    model = SmallResNet(widths=(4, 8)).eval()
    x = torch.randn(3, 28, 28)
    assert torch.equal(model(x), model(x.unsqueeze(1)))


def test_fresh_params_keeps_the_adapter_init():
    """Re-initializing (functional.fresh_params) draws adapters near zero again."""
    from ebfl.learning.torch.functional import fresh_params

    model = SmallResNet(widths=(8,))
    _zero_adapters(model)
    fresh = fresh_params(model, seed=3)
    w = fresh["layer1.0.adapter1.conv.weight"]
    assert 0 < float(w.abs().max()) < 1e-3
    assert float(fresh["layer1.0.bn1.running_var"].min()) == 1.0
