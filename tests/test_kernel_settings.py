"""The zero-advantage step at initialisation under the CPU kernel settings that change which kernels run:
MKL's conditional numerical reproducibility (MKL_CBWR), ATen's vectorisation level (ATEN_CPU_CAPABILITY).

At initialisation the policy (LoRA B = 0) is the reference (adapter disabled): the same products on the same
shapes. With MKL held to reproducible kernels the KL terms, the loss and its gradient are exactly 0. With plain
kernels they are 0 only within fp32 rounding: Intel MKL's AVX-512 sgemm does not promise bitwise-equal results
for two calls on equal inputs (an Intel Xeon gave a loss of -1.56e-12 where an AMD EPYC gives 0). The tolerance
below is what that rounding allows: log-probs of O(10) differ by at most a few ulp (~1e-6), the k3 KL of such a
difference is ~1e-12, and the gradient of KL terms at equal distributions scales with that difference (~1e-6
times beta times the logits' gradient), well under 1e-6. Each setting runs in its own process
(tests/workers/kernel_worker.py): MKL and ATen read them at start-up."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {"plain": {}, "MKL_CBWR=AVX2": {"MKL_CBWR": "AVX2"}, "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
            "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"}}
KL_TOLERANCE, GRAD_TOLERANCE = 1e-9, 1e-6  # tolerance: fp32 rounding of equal forwards (the module's docstring)


def run(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "kernel_worker.py")], capture_output=True,
                         text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1", **extra})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results():
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(SETTINGS, pool.map(run, SETTINGS.values())))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_zero_advantages_at_initialisation_give_no_loss_and_no_gradient(results, setting):
    r = results[setting]
    assert r["grads"] > 0
    assert abs(r["loss"]) <= KL_TOLERANCE and r["kl_tok"] <= KL_TOLERANCE and r["kl_act"] <= KL_TOLERANCE, r
    assert r["grad_norm"] <= GRAD_TOLERANCE, r["grad_norm"]
    if setting.startswith("MKL_CBWR"):  # exact: reproducible kernels, the same products on the same shapes
        assert r["loss"] == 0.0 and r["kl_tok"] == 0.0 and r["kl_act"] == 0.0 and r["grad_norm"] == 0.0, r


def test_the_settings_change_the_rounding_not_the_log_probs(results):
    base = results["plain"]["logp_tok"]
    for setting, r in results.items():
        worst = max(abs(a - b) for a, b in zip(base, r["logp_tok"]))
        assert worst <= 1e-4, (setting, worst)  # tolerance: other kernels, fp32 rounding of a 2-layer forward
