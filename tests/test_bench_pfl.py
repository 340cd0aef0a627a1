"""bench_pfl (P9) on a tiny job: the two ebfl runners (pfl itself is not run here)."""

import json

import pytest

from tests.conftest import requires_data

pytest.importorskip("torch")

from tests.test_benchmarks import _load  # noqa: E402


@requires_data("mnist")
def test_bench_pfl_quick_without_pfl(capsys):
    bench = _load("bench_pfl")
    out = bench.main(["--quick", "--no-pfl", "--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(out))
    assert not out["pfl_ran"] and out["pfl_not_run_reason"] == "--no-pfl"
    assert sorted(out["workloads"]) == ["cnn", "mlp"]
    for res in out["workloads"].values():
        assert res["threads"] == 1 and res["rounds"] == 3 and res["warmup"] == 1
        for runner in ("engine", "loop"):
            seconds = res["seconds_per_round"][runner]
            assert seconds["rounds"] == 2 and 0 < seconds["q1"] <= seconds["median"]
            assert res["cpu_seconds_per_round"][runner]["median"] > 0
            assert 0 <= res["accuracy"][runner] <= 1
        assert res["seconds_per_round"]["pfl"] is None and res["accuracy"]["pfl"] is None
        assert res["ratio_engine_over_loop"] > 0 and res["ratio_engine_over_pfl"] is None
        # The same rounds on the same minibatches: the engine's vmap and the loop's
        # autograd differ only by float32 rounding.
        assert res["max_abs_diff_engine_loop"] <= 1e-5
        assert res["accuracy"]["engine"] == pytest.approx(res["accuracy"]["loop"], abs=0.01)


def test_engine_schedule_is_the_engines_draws():
    """The minibatch indices handed to pfl with --pfl-same-batches are those the engine
    draws: a dataset whose features are the sample indices returns them as batches."""
    import numpy as np
    import torch

    from ebfl.federated import RoundContext, sample_clients
    from ebfl.learning.torch import FederatedDataset
    from ebfl.learning.torch.engine import run_config
    from ebfl.learning.torch.functional import client_generators

    bench = _load("bench_pfl")
    m, n = 6, 20
    xs = [np.arange(n, dtype=np.float32)[:, None] + 100 * c for c in range(m)]
    ys = [np.zeros(n, np.int64)] * m
    data = FederatedDataset.from_clients(xs, ys, xs, ys, n_classes=10)
    setting = {"samples": n, "batch": 5, "per_round": 3}
    clients, idx = bench.engine_schedule(data, setting, 2, 7)
    assert clients.shape == (2, 3) and idx.shape == (2, 3, n)
    config = run_config(data, n_rounds=2, eval_every=2, seed=7, **bench._train_kwargs(setting))
    for r in range(2):
        sampled = sample_clients(config, r)
        assert list(clients[r]) == list(sampled)
        gens = client_generators(RoundContext(config, r, sampled).seeds())
        part = data.subset(sampled)
        drawn = torch.cat([part.sample_batch(gens, 5)[0][..., 0] for _ in range(4)], dim=1)
        expect = torch.as_tensor(idx[r] + 100 * sampled[:, None], dtype=torch.float32)
        assert torch.equal(drawn, expect)
