"""The GPU equivalence check's worker and comparison (tests/workers/backend_worker.py), on CPU: two
processes of the transformers backend on a tiny model must agree exactly, and each must
train every LoRA and router tensor in one TarpoTrainer step."""

import os
import subprocess
import sys

import torch

from workers.backend_worker import compare, prepare
from helpers import TINY

HERE = os.path.dirname(os.path.abspath(__file__))
def run_worker(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, os.path.join(HERE, "workers", "backend_worker.py"), "--steps", "24",
                          "--completion", "32", *args], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-4000:]


def test_two_processes_of_one_backend_agree_and_train_every_tensor(tmp_path):
    # the vocabulary of a real model beside the workers' 400-token tokenizer (the GPU check's 1.5B shape has
    # 151,936 ids): most sampled ids decode to no text, so a reward of the decoded text is the same in every row
    # (seen on the H100: no gradient, every LoRA B and the router unchanged after the step)
    base, adapter = prepare(str(tmp_path), dict(TINY, vocab_size=65536), torch.float32)
    a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    run_worker("--backend", "hf", "--model", base, "--adapter", adapter, "--out", a)
    run_worker("--backend", "hf", "--model", base, "--adapter", adapter, "--out", b, "--score", a)
    assert not os.path.exists(a + ".tmp") and not os.path.exists(b + ".tmp")
    got = compare(torch.load(a), torch.load(b))
    # exact: one backend, the same code on the same inputs and shapes in both processes
    assert got["hidden_rel_err"] == 0 and got["logits_rel_err"] == 0
    # exact: an fp32 model is its own fp32 yardstick (.float() changes nothing)
    assert got["hidden_rel_err_to_fp32"] == got["hidden_rel_err_to_fp32_ref"] == 0
    assert got["logits_rel_err_to_fp32"] == got["logits_rel_err_to_fp32_ref"] == 0  # exact: the same, for the logits
    assert got["rollout_soft_steps"] > 0 and got["rollout_hard_steps"] > 0
    assert got["rollout_logp_mean_abs_diff"] < 1e-5 and got["rollout_p_soft_max_abs_diff"] < 1e-5
    assert got["free_running_token_agreement"] == 1.0
    # exact: the same loss and backward on the same inputs in both processes
    assert got["loss_rel_diff"] == 0 and got["grads_rel_err"] == 0
    assert got["trained_tensors"] == 4 * 2 * 2 + 2  # LoRA A and B on q/k/v/o of 2 layers, router weight and bias
    assert got["unchanged_after_step"] == [] and got["unchanged_after_step_ref"] == []
