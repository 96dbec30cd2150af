"""GPU equivalence of the Unsloth path (tarpo.patches) and the transformers path.

A random-init model of the Qwen2.5-1.5B configuration in bf16 with a saved LoRA adapter and
router; each backend runs in a process of its own (``tests/workers/backend_worker.py``: importing
Unsloth rebinds transformers' Qwen2/Llama forwards process-wide, so a reference loaded beside
it would run Unsloth's code), and this process, which never imports Unsloth, compares what
they wrote. Skipped without CUDA or without Unsloth (scripts/install_gpu.sh); run by benchmarks/gpu_check.sh.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and importlib.util.find_spec("unsloth") is not None),
    reason="needs a CUDA GPU and Unsloth (scripts/install_gpu.sh)")]

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "workers"))
from backend_worker import compare, prepare  # noqa: E402  at collection, so a CPU run sees a broken import too


def run_worker(*args):
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "backend_worker.py"), *args],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


@pytest.fixture(scope="module")
def agreement(tmp_path_factory):
    from tarpo.models.tiny import QWEN25_15B
    root = tmp_path_factory.mktemp("qwen")
    base, adapter = prepare(str(root), QWEN25_15B, torch.bfloat16)
    un, hf = str(root / "unsloth.pt"), str(root / "hf.pt")
    run_worker("--backend", "unsloth", "--model", base, "--adapter", adapter, "--out", un)
    run_worker("--backend", "hf", "--model", base, "--adapter", adapter, "--out", hf, "--score", un)
    cand, ref = torch.load(un), torch.load(hf)
    assert cand["backbone"] == "UnslothBackbone" and ref["backbone"] == "Backbone"
    result = compare(cand, ref)
    print("\nunsloth vs transformers:", json.dumps(result, indent=1))
    return result


def test_logits_and_hidden_states_are_as_close_to_fp32_as_transformers(agreement):
    """Unsloth's bf16 forward (its own RMSNorm, rotary and LoRA kernels) is held to the fp32 forward of the same
    model: no further from it than transformers' bf16 forward is, by more than half again (the two round
    differently). Their distance from each other is reported, not asserted: a fixed bound of 2e-2 was a guess, and
    the H100 measured 2.04e-2 on the 1.5B shape (docs/gpu/2026-11-26-NVIDIA-H100-80GB-HBM3-session2.md)."""
    for what in ("hidden", "logits"):
        ref = agreement[f"{what}_rel_err_to_fp32_ref"]
        assert 0 < ref < 5e-2, (what, ref)  # bf16 rounding is there, and is bf16's size
        assert agreement[f"{what}_rel_err_to_fp32"] <= 1.5 * ref, (what, agreement)


def test_hybrid_rollout_of_64_steps_agrees(agreement):
    """The Unsloth rollout, scored teacher-forced by the transformers training forward. Free-running,
    the two sample the same tokens only while bf16 differences flip no draw: reported, not asserted."""
    assert agreement["rollout_soft_steps"] > 0 and agreement["rollout_hard_steps"] > 0
    assert agreement["rollout_logp_mean_abs_diff"] < 0.05
    assert agreement["rollout_p_soft_max_abs_diff"] < 0.02


def test_one_training_step_gives_matching_losses_and_gradients(agreement):
    assert agreement["loss_rel_diff"] <= 2e-2
    assert agreement["grads_rel_err"] < 5e-2


def test_one_trainer_step_changes_every_lora_and_router_tensor_on_both_backends(agreement):
    assert agreement["trained_tensors"] > 0 and agreement["trained_tensors_ref"] > 0
    assert agreement["unchanged_after_step"] == [] and agreement["unchanged_after_step_ref"] == []
