"""The neural engine on a device: ``train(..., device=)``, ``FederatedDataset.to``,
``Strategy.to``, portable checkpoints and ``--device`` on the CLI.

Without a GPU the CUDA path is exercised on a *stand-in device*: a dispatch mode
that runs every op on the CPU but makes the tensors moved to "cuda" report
another device, and refuses any op that combines them with CPU tensors the way
CUDA does (0-dim CPU scalars and CPU index tensors are accepted, as on CUDA).
A strategy that makes a tensor on the CPU and then combines it with the
device's fails there as it would on a GPU; since the arithmetic is the CPU's,
the stand-in run must equal the CPU run bit for bit.
Tests marked ``needs_cuda`` run on a real GPU where there is one.
"""

import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from ebfl.cli import main  # noqa: E402
from ebfl.fedhdp.algorithm import FedHDP  # noqa: E402
from ebfl.generative.algorithm import AdaPeD, DPAdaPeD  # noqa: E402
from ebfl.learning.torch import (  # noqa: E402
    MLP,
    DPFedEM,
    FedAvg,
    FedEM,
    FederatedDataset,
    SmallResNet,
    train,
)
from ebfl.learning.torch.baselines import APFL, FedAvgFT  # noqa: E402
from ebfl.learning.torch.functional import check_device, fresh_params  # noqa: E402
from ebfl.learning.torch.partial import FedAlt  # noqa: E402
from ebfl.perada.algorithm import PerAda  # noqa: E402
from ebfl.perada.dp import DPPerAda  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (none on this machine)")


# --------------------------------------------------------------------------- data, strategies

def _clients(m=4, d=12, classes=3, seed=0):
    """m clients of 2-d images (3 x 4 pixels), each with 2 of 3 linearly separable classes."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d)).astype(np.float32) * 2
    parts = [[], [], [], []]
    for i in range(m):
        n = 14 + 3 * i
        for part, size in ((0, n), (2, 8)):
            y = rng.choice([i % classes, (i + 1) % classes], size)
            x = centers[y] + rng.normal(size=(size, d)).astype(np.float32)
            parts[part].append(x.reshape(size, 3, 4))
            parts[part + 1].append(y)
    return FederatedDataset.from_clients(*parts, n_classes=classes)


def _images(m=4, seed=0):
    """Tiny 8 x 8 images for the ResNet strategies: a class-dependent bright quadrant."""
    rng = np.random.default_rng(seed)
    parts = [[], [], [], []]
    for i in range(m):
        for part, size in ((0, 10 + 2 * i), (2, 6)):
            y = rng.integers(0, 4, size)
            x = rng.random((size, 8, 8)).astype(np.float32) * 0.3
            for j, c in enumerate(y):
                r, col = divmod(int(c), 2)
                x[j, 4 * r:4 * r + 4, 4 * col:4 * col + 4] += 0.7
            parts[part].append(x)
            parts[part + 1].append(y)
    return FederatedDataset.from_clients(*parts, n_classes=4)


def _mlp():
    return MLP(12, 3, hidden=(8,))


def _resnet():
    return SmallResNet(4, 1, widths=(4,), dropout=0.3)


def _aux():
    return torch.rand((16, 8, 8), generator=torch.Generator().manual_seed(1))


#: One maker per strategy family: (strategy, image data?, train keywords).
FAMILIES = {
    "FedAvg": lambda: (FedAvg(_mlp(), 0.2), False, {}),
    "AdaPeD-FT": lambda: (AdaPeD(_mlp(), fine_tune=True), False, {}),
    "APFL": lambda: (APFL(_mlp()), False, {}),
    "FedEM": lambda: (FedEM(_mlp()), False, {}),
    "FedAvg-FT": lambda: (FedAvgFT(_mlp(), finetune_steps=2, finetune_batch=4), False, {}),
    "DP-AdaPeD": lambda: (DPAdaPeD(_mlp(), clip_mu=1.0, noise_mu=0.5, concatenate=True), False,
                          {}),
    "DP-FedEM": lambda: (DPFedEM(_mlp(), clip=1.0, noise=0.5), False, {}),
    "FedHDP": lambda: (FedHDP(_mlp(), np.array([0, 1, 0, 1]), ratio=0.5,
                              noise_multiplier=[0.0, 1.0], clip=1.0, count_noise=2.0), False,
                       {"sampling": "poisson"}),
    "PerAda": lambda: (PerAda(_resnet(), fresh_params(_resnet(), 3), lr=0.1, aux=_aux(),
                              kd_steps=2, kd_batch_size=8), True, {}),
    "DP-PerAda": lambda: (DPPerAda(_resnet(), fresh_params(_resnet(), 3), clip=1.0,
                                   noise_multiplier=1.0, sampling_rate=0.3, lr=0.1), True, {}),
    "FedAlt": lambda: (FedAlt(_resnet(), personal="output", personal_steps=1), True, {}),
}

RUN = dict(n_rounds=2, local_steps=2, clients_per_round=3, batch_size=4, eval_every=1, seed=3)


def _family(name):
    strategy, images, kw = FAMILIES[name]()
    return strategy, (_images() if images else _clients()), {**RUN, **kw}


def _tensors(result):
    """Every tensor of a TrainResult, by name."""
    flat, _ = tree_flatten({"server": result.server, "clients": result.clients})
    return [t for t in flat if isinstance(t, torch.Tensor)] + [result.accuracy]


def _assert_same_run(a, b):
    assert a.history == b.history
    ta, tb = _tensors(a), _tensors(b)
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb, strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0, equal_nan=True)


# --------------------------------------------------------------------------- the stand-in device

class _OnDevice(torch.Tensor):
    """CPU data reporting the "meta" device: a tensor the stand-in device holds."""

    # ebfl.federated.tree recognizes torch tensors by their class's module, without
    # importing torch
    __module__ = "torch.stand_in"

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=torch.device("meta"),
            requires_grad=elem.requires_grad)

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _OnDevice(inner["elem"])

    def tolist(self):  # as a CUDA tensor's (a copy to the host)
        return self.elem.tolist()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _on_stand_in(func, args, kwargs or {})


class DeviceMixing(RuntimeError):
    """An op combined tensors of the stand-in device with CPU tensors."""


_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default,
             torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl_.default}


def _is_device(device):
    return device is not None and torch.device(device).type in ("cuda", "meta")


def _host_scalar(t):
    # CUDA kernels accept 0-dim CPU tensors as scalars
    return not isinstance(t, _OnDevice) and t.device.type == "cpu" and t.dim() == 0


def _check_mixing(func, args, kwargs, tensors):
    indices = set()
    if func in _INDEXING:  # CUDA takes CPU index tensors
        idx = args[1] if len(args) > 1 else kwargs.get("indices")
        indices = {id(t) for t in idx or () if isinstance(t, torch.Tensor)}
    host = [tuple(t.shape) for t in tensors if not isinstance(t, _OnDevice)
            and not _host_scalar(t) and id(t) not in indices]
    if host:
        raise DeviceMixing(f"{func} mixes device tensors with CPU tensors of shapes {host}")


def _on_stand_in(func, args, kwargs):
    """Run ``func`` on the CPU data; its outputs are on the device if an input was, or if it
    was asked to put them there (``device=``, ``.to(device)``)."""
    flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    on_device = any(isinstance(t, _OnDevice) for t in tensors)
    if on_device and func not in _COPIES:
        _check_mixing(func, args, kwargs, tensors)
    args, kwargs = tree_map(lambda t: t.elem if isinstance(t, _OnDevice) else t, (args, kwargs))
    target = kwargs.get("device")
    if target is not None:
        to_device = _is_device(target)
        if to_device:
            kwargs = {**kwargs, "device": torch.device("cpu")}
    else:
        to_device = on_device
    out = func(*args, **kwargs)
    name = func._schema.name.split("::")[-1]
    if name.endswith("_") and not name.endswith("__"):
        return out  # in place (add_, copy_; not __rshift__): the caller keeps its own tensor
    if not to_device:
        return out
    return tree_map(lambda t: _OnDevice(t) if type(t) is torch.Tensor else t, out)


class _StandInDevice(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        if any(isinstance(t, _OnDevice) for t in flat) or _is_device(kwargs.get("device")):
            return _on_stand_in(func, args, kwargs)
        return func(*args, **kwargs)


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """"cuda" is the stand-in device inside (torch's CUDA checks answer as with one GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
    real_tensor, real_as_tensor = torch.tensor, torch.as_tensor

    def construct(real):  # torch.tensor(..., device=) builds outside the dispatcher
        def make(*args, device=None, **kwargs):
            out = real(*args, **kwargs)
            return out if device is None else out.to(device)
        return make

    monkeypatch.setattr(torch, "tensor", construct(real_tensor))
    monkeypatch.setattr(torch, "as_tensor", construct(real_as_tensor))
    with _StandInDevice():
        yield


def test_the_stand_in_device_refuses_what_cuda_refuses(stand_in_cuda):
    x = torch.ones(3, 2).to(torch.device("cuda", 0))  # as check_device spells it
    assert isinstance(x, _OnDevice) and isinstance(x + 1, _OnDevice)
    assert isinstance(x * torch.tensor(2.0), _OnDevice)  # a CPU scalar is fine
    assert isinstance(x[torch.tensor([0, 2])], _OnDevice)  # CPU indices are fine
    assert isinstance(torch.zeros(2, device=x.device) + x[0], _OnDevice)
    for bad in (lambda: x + torch.ones(3, 2), lambda: x @ torch.ones(2, 2),
                lambda: torch.where(x > 0, x, torch.zeros(3, 2))):
        with pytest.raises(DeviceMixing):
            bad()
    y = x.clone()
    with pytest.raises(DeviceMixing):
        y[torch.tensor([0])] = torch.ones(1, 2) * torch.ones(1, 2)  # CPU values, not indices


# --------------------------------------------------------------------------- runs on the device

@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_strategy_family_runs_on_a_device_as_on_the_cpu(name, stand_in_cuda):
    """No tensor of the run is made on the CPU and combined with the device's, and the
    device run draws exactly the CPU run's random numbers (the stand-in computes on the
    CPU, so the two runs agree bit for bit; the result comes back on the CPU)."""
    strategy, data, kw = _family(name)
    on_device = train(strategy, data, device="cuda", **kw)
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in _tensors(on_device))
    assert strategy.device.type == "cpu" and data.device.type == "cpu"  # the caller's stay put
    on_cpu = train(strategy, data, **kw)
    _assert_same_run(on_device, on_cpu)


def test_a_checkpoint_written_on_the_device_resumes_on_the_cpu(tmp_path, stand_in_cuda):
    strategy, data, kw = _family("AdaPeD-FT")
    ckpt = tmp_path / "run.pkl"
    train(strategy, data, checkpoint=ckpt, device="cuda", **{**kw, "n_rounds": 1})
    with open(ckpt, "rb") as fh:
        saved = pickle.load(fh)
    flat, _ = tree_flatten({"server": saved["server"], "clients": saved["clients"]})
    assert flat and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in flat)
    resumed = train(strategy, data, checkpoint=ckpt, **kw)  # on the CPU
    full = train(strategy, data, **kw)
    _assert_same_run(resumed, full)
    # and back: a CPU checkpoint resumed on the device
    ckpt2 = tmp_path / "run2.pkl"
    train(strategy, data, checkpoint=ckpt2, **{**kw, "n_rounds": 1})
    _assert_same_run(train(strategy, data, checkpoint=ckpt2, device="cuda", **kw), full)


def test_explicit_cpu_is_the_default_bit_for_bit():
    strategy, data, kw = _family("AdaPeD-FT")
    default = train(strategy, data, **kw)
    for device in ("cpu", torch.device("cpu"), "cpu:0"):
        _assert_same_run(train(strategy, data, device=device, **kw), default)


def test_dataset_to_returns_a_new_dataset_and_leaves_the_input_alone():
    data = _clients()
    before = {k: v.clone() for k, v in vars(data).items() if isinstance(v, torch.Tensor)}
    moved = data.to("cpu")
    assert moved is not data and moved.device == torch.device("cpu")
    assert moved.n_classes == data.n_classes
    for k, v in before.items():
        assert torch.equal(getattr(moved, k), v), k
        assert torch.equal(getattr(data, k), v), k


def test_strategy_to_copies_what_it_moves():
    strategy, _, _ = _family("PerAda")
    assert strategy.to("cpu") is strategy
    assert strategy.device == torch.device("cpu")


# --------------------------------------------------------------------------- bad devices

@pytest.mark.parametrize("device", ["gpu", "cuda:x", "", "tpu", "meta", "mps"])
def test_unknown_devices_are_a_value_error_naming_device(device):
    strategy, data, kw = _family("FedAvg")
    with pytest.raises(ValueError, match="device"):
        train(strategy, data, device=device, **kw)
    with pytest.raises(ValueError, match="device"):
        data.to(device)


def test_a_device_that_is_not_a_string_is_a_type_error():
    strategy, data, kw = _family("FedAvg")
    with pytest.raises(TypeError, match="device"):
        train(strategy, data, device=0, **kw)


def test_cuda_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    strategy, data, kw = _family("FedAvg")
    for device in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(ValueError, match="CUDA is not available"):
            train(strategy, data, device=device, **kw)
    with pytest.raises(ValueError, match="CUDA is not available"):
        data.to("cuda")
    assert check_device(None) == torch.device("cpu")


@pytest.mark.parametrize("command", ["adaped", "dp-adaped", "adaped-fedem", "perada", "fedhdp"])
def test_cli_device_cuda_without_cuda_is_one_error_line(command, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["reproduce", command, "--quick", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: argument --device:"), err
    assert "CUDA is not available" in err
    assert main(["reproduce", command, "--quick", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --device:")


# --------------------------------------------------------------------------- a real GPU

#: A run on a GPU draws the CPU run's random numbers but rounds differently (reduction
#: order, TF32 convolutions): the states agree to these tolerances after 2 rounds of 2
#: steps, and each client's accuracy on its 6-8 test rows by all but a flipped
#: prediction or two (a mean difference of at most 0.1).
GPU_STATE_TOL = dict(rtol=0.05, atol=0.01)
GPU_ACCURACY_TOL = 0.1


@needs_cuda
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_strategy_family_on_a_gpu_agrees_with_the_cpu(name):
    strategy, data, kw = _family(name)
    gpu = train(strategy, data, device="cuda", **kw)
    cpu = train(strategy, data, **kw)
    for t in _tensors(gpu):
        assert t.device.type == "cpu"
        assert not t.is_floating_point() or bool(torch.isfinite(t).all())
    for a, b in zip(_tensors(gpu)[:-1], _tensors(cpu)[:-1], strict=True):
        torch.testing.assert_close(a, b, **GPU_STATE_TOL, equal_nan=True)
    assert abs(float(gpu.accuracy.mean()) - float(cpu.accuracy.mean())) <= GPU_ACCURACY_TOL


@needs_cuda
def test_a_checkpoint_written_on_a_gpu_resumes_on_the_cpu(tmp_path):
    strategy, data, kw = _family("AdaPeD-FT")
    ckpt = tmp_path / "run.pkl"
    train(strategy, data, checkpoint=ckpt, device="cuda", **{**kw, "n_rounds": 1})
    resumed = train(strategy, data, checkpoint=ckpt, **kw)  # on the CPU
    gpu = train(strategy, data, device="cuda", **kw)
    for a, b in zip(_tensors(resumed)[:-1], _tensors(gpu)[:-1], strict=True):
        torch.testing.assert_close(a, b, **GPU_STATE_TOL)
    assert [h["round"] for h in resumed.history] == [1, 2]
