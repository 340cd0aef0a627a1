"""The package imports and gives the same answers with NUMBA_DISABLE_JIT=1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = """
import json, numpy as np
from ebfl import BetaBernoulliPopulation, GaussianPopulation, beta_bernoulli_eb, gaussian_eb_samples
sample = BetaBernoulliPopulation(2, 3).sample(150, np.arange(150) % 11 + 2, rng=5)
out = {m: beta_bernoulli_eb(sample.data, method=m).posterior.mean.tolist()
       for m in ("mle", "moments", "loo_printed", "loo_proof", "loo_corrected")}
g = GaussianPopulation([0.0, 1.0], 0.3, 1.0).sample(100, np.arange(100) % 5 + 2, rng=6)
out["gaussian"] = gaussian_eb_samples(g.data).posterior.mean.tolist()
from ebfl.eb import npmle_binomial, npmle_normal
x = np.linspace(-2, 3, 200) ** 3 / 5
out["npmle"] = npmle_normal(x, 0.5 + (np.arange(200) % 3) / 4, n_grid=60).posterior_mean.tolist()
x3, s3 = 3 * np.sin(np.arange(800) * 0.37) + np.arange(800) % 5 / 4, 0.5 + np.arange(800) % 7 / 6
out["npmle_warm"] = npmle_normal(x3, s3, n_grid=30).posterior_mean.tolist()
auto = npmle_normal(x3, s3, n_grid=30, bins="auto", bin_error=4.0)
out["npmle_auto"] = auto.posterior_mean.tolist() + [auto.diagnostics["binning_error_bound"]]
out["npmle_binomial"] = npmle_binomial(np.arange(300) % 7, 6 + np.arange(300) % 5,
                                       n_grid=30).posterior_mean.tolist()
print(json.dumps(out))
"""


def run_script(script, disable_jit):
    """The JSON a Python ``script`` prints, run in a fresh process with or without JIT."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1" if disable_jit else "0")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parent.parent)
    return json.loads(proc.stdout)


def _run(disable_jit):
    return run_script(SCRIPT, disable_jit)


def test_same_answers_without_jit():
    jit, plain = _run(False), _run(True)
    assert jit.keys() == plain.keys()
    for key in jit:
        # atol: posterior means that cancel to ~1e-3 differ by rounding (~1e-14)
        # between the JIT's and the interpreter's summation order.
        np.testing.assert_allclose(plain[key], jit[key], rtol=1e-12, atol=1e-12, err_msg=key)
