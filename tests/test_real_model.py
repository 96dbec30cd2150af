"""What only real weights show (SmolLM2-135M-Instruct, made offline by ``python -m tarpo.models.offline smollm2-135m``,
which scripts/test.sh runs once before the suite; the test skips where that folder is missing): a BPE vocabulary of
49,152 real token embeddings, a real chat template.

- One TARPO step of the trainer with many soft steps: the training forward replays each soft step's top-k mixture
  over the real vocabulary, so its log-probs equal the rollout's (fp32, the same kernels: the drift is rounding);
  the gradients are finite and every LoRA tensor and the router move.
- The prompt ids are transformers' own ``apply_chat_template`` of the same messages.
"""

import math
import os

import datasets
import pytest
import torch

from helpers import letter_reward, make_args
from tarpo.models.offline import local_copy
from tarpo.tasks.prompts import prompt_ids
from tarpo.tasks.registry import load_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = local_copy("smollm2-135m", os.path.join(ROOT, "runs", "cache"))
pytestmark = pytest.mark.skipif(FOLDER is None, reason="python -m tarpo.models.offline smollm2-135m not run")


@pytest.fixture(scope="module")
def tokenizer():
    from tarpo.models.loading import load_tokenizer
    return load_tokenizer(FOLDER)


@pytest.fixture(scope="module")
def arith_rows():
    return load_task("arith", split="test", limit=4)


def test_prompt_ids_are_transformers_own_chat_template(tokenizer, arith_rows):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    for row in arith_rows:
        ids, cut = prompt_ids(tokenizer, row["prompt"], 256)
        reference = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                  return_dict=False)
        assert not cut and ids == list(reference)
        assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_a_tarpo_step_replays_the_real_vocabularys_soft_mixtures_and_trains(tokenizer, arith_rows, tmp_path):
    from transformers import AutoModelForCausalLM

    from tarpo.training.trainer import TarpoTrainer

    model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32)
    data = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in arith_rows.select(range(2))])
    args = make_args(tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=8, max_prompt_length=256, lora_r=8, lora_alpha=16, learning_rate=1e-2,
                     router_lr=1e-1, action_bias=[0.0, 0.0], soft_top_k=30, temperature=1.0,
                     warmup_steps=0, lr_scheduler_type="constant")
    trainer = TarpoTrainer(model=model, reward_funcs=letter_reward, args=args, train_dataset=data,
                           processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["soft_ratio"] > 0.2, log  # b0 = 0: about half the thinking steps are soft mixtures
    assert math.isfinite(log["loss"]) and math.isfinite(log["grad_norm"]) and log["grad_norm"] > 0
    # the training forward replays every step as the rollout fed it: the log-probs agree to fp32 rounding
    assert log["logp_drift_max"] < 1e-4, log["logp_drift_max"]
    trained = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    moved = {n for n, p in trained if not torch.equal(p, before[n])}  # exact: any change at all counts as moved
    assert moved == set(before), sorted(set(before) - moved)[:5]  # every LoRA tensor and the router
    # A and B of q, k, v, o in each of the 30 layers
    assert any("tarpo_router" in n for n in moved) and sum("lora_" in n for n in moved) == 2 * 4 * 30


def test_the_real_model_check_is_a_launcher_run_of_its_task_with_its_chosen_settings(tmp_path):
    """``learning_check --model smollm2-135m``'s runs are launcher runs: every variable it sets is one the launcher
    takes, on the data-set preset of one-step problems whose prompts show the answer format as earlier chat turns;
    its evaluation's questions are the task's test split, none of them a training question."""
    from tarpo.runs.learning_check import REAL_MODELS, REAL_TASK, real_model_variables
    from tarpo.runs.presets import resolve
    from tarpo.tasks.chat_messages import messages

    for algo in ("grpo", "tarpo"):
        cfg = resolve(REAL_TASK, real_model_variables("smollm2-135m", str(tmp_path), algo, None))
        assert cfg.task == REAL_TASK == "arith_one" and cfg.algo == algo and cfg.preset == "smollm2-135m"
        assert cfg.trainer["per_device_train_batch_size"] == int(REAL_MODELS["smollm2-135m"]["BATCH"])
        assert cfg.trainer["learning_rate"] == float(REAL_MODELS["smollm2-135m"]["LR"])
        assert cfg.run_dir == str(tmp_path / algo)
    turns = messages("arith_one", "Compute 1 + 2.")
    assert [m["content"] for m in turns[2::2]] == ["3+4=7 #### 7", "8-6=2 #### 2"]
    train, test = (load_task(REAL_TASK, split=s) for s in ("train", "test"))
    assert len(test) >= 200 and not set(train["prompt"][i][-1]["content"] for i in range(len(train))) & set(
        test["prompt"][i][-1]["content"] for i in range(len(test)))
    assert test[0]["prompt"][:5] == turns[:5]  # the system prompt and the same worked examples before each question
