"""Unsloth's own Python code on the CPU, in a process of its own, against transformers in another.

``tests/unsloth_cpu.py`` stands in for the GPU-only pieces (device queries, two Triton kernels);
the rest is the pinned Unsloth 2026.10.7 (installed by scripts/setup_env.sh into
``.venv/unsloth-cpu``, never into the project's environment): its class forwards, the fast
single-token decode with paged K/V buffers behind tarpo.patches' decode wrapper, the embedding
override for soft rows, for_inference/for_training, and the training forward with
tarpo.patches' flags. A tiny Qwen2 with a LoRA adapter and a router that sends about half the
steps soft; the transformers process scores the Unsloth rollout teacher-forced.
"""

import os
import subprocess
import sys

import pytest
import torch

from backend_worker import compare, prepare
from test_backend_worker import TINY

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.environ.get("TARPO_UNSLOTH_CPU_SITE", os.path.join(os.path.dirname(HERE), ".venv", "unsloth-cpu"))

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "unsloth")),
                                reason=f"Unsloth for CPU tests is not installed in {SITE} (scripts/setup_env.sh)")


def run(tmp_path, *args, unsloth=False):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if unsloth:
        env.update(UNSLOTH_ALLOW_CPU="1", UNSLOTH_COMPILE_LOCATION=str(tmp_path / "unsloth_cache"),
                   PYTHONPATH=os.pathsep.join([SITE, HERE]))
    res = subprocess.run([sys.executable, os.path.join(HERE, "backend_worker.py"), "--steps", "24", "--completion",
                          "32", *args], capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-5000:]


def test_unsloth_decode_and_training_forward_equal_transformers(tmp_path):
    base, adapter = prepare(str(tmp_path), TINY, torch.float32)
    un, hf = str(tmp_path / "unsloth.pt"), str(tmp_path / "hf.pt")
    run(tmp_path, "--backend", "unsloth", "--unsloth-on-cpu", "--model", base, "--adapter", adapter, "--out", un,
        unsloth=True)
    run(tmp_path, "--backend", "hf", "--model", base, "--adapter", adapter, "--out", hf, "--score", un)
    cand, ref = torch.load(un), torch.load(hf)
    assert cand["backbone"] == "UnslothBackbone" and ref["backbone"] == "Backbone"
    got = compare(cand, ref)
    assert got["hidden_rel_err"] < 1e-5 and got["logits_rel_err"] < 1e-5      # Unsloth's training forward
    assert got["rollout_soft_steps"] > 10 and got["rollout_hard_steps"] > 10
    assert got["rollout_logp_mean_abs_diff"] < 1e-4                            # its fast decode, teacher-forced
    assert got["rollout_p_soft_max_abs_diff"] < 1e-4
    assert got["free_running_token_agreement"] == 1.0                          # same draws, step for step
    assert got["loss_rel_diff"] < 1e-5 and got["grads_rel_err"] < 1e-4        # LoRA gradients through it
    assert not os.path.exists(os.path.join(HERE, "unsloth_compiled_cache"))
