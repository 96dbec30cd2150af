"""The whole training step on a real model: TRL's ``GRPOTrainer`` beside ``TarpoTrainer`` as GRPO and as TARPO.

All three train SmolLM2-135M-Instruct (``python -m tarpo.models.offline smollm2-135m`` first) with the same settings,
by default the learning check's (``tarpo.runs.learning_check.REAL_MODELS``, docs/real-model.md): its task's questions,
the paper's reward, LoRA r 16 on every linear layer, ``--batch`` completions a step in groups of ``--group``,
``--length`` new tokens at most, the same sampling temperature, fp32 on the CPU. TRL samples with transformers'
``generate``; TarpoTrainer with its own engine (the eager one on a CPU, or ``--engine``). Two passes, the trainers in
the order TRL, GRPO, TARPO, then the reverse (so that a drift of the machine over time weighs on each alike); in each
pass each trainer is built anew and trains ``--steps`` steps. A step is timed from the trainer's step start to its end
(callbacks); TarpoTrainer's rollout time is its own log (``timing/rollout_s``; TRL logs none on this path). Each
pass's first step (first calls, allocations) is reported apart; the figures are the medians of the other steps, and
each trainer's over TRL's.

TRL 1.15's GRPOTrainer computes its training log-probs with a Triton kernel (``trl/kernels/chunked_logprob.py``,
called from ``trl/trainer/utils.py``'s fused LM head without a fallback): where Triton is missing (the CPU wheel of
torch) it fails at its first training forward (``AttributeError: 'NoneType' object has no attribute 'apply'``).
There the benchmark gives TRL :class:`TorchLogProbs`, the kernel's outputs computed in plain torch (the whole
logits of the completion tokens at once), and says so in its output (``trl_logprobs``): TRL's step is then TRL's
own everywhere but in that one function.

    python benchmarks/bench_trl_step.py --steps 3 --json out.json     # about 15 minutes on a 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tarpo.models.loading import load_tokenizer  # noqa: E402
from tarpo.models.offline import local_copy  # noqa: E402
from tarpo.runs.learning_check import REAL_MODELS, REAL_TASK  # noqa: E402
from tarpo.tasks.graders import reward_function  # noqa: E402
from tarpo.tasks.registry import load_task  # noqa: E402

NAMES = ("trl", "grpo", "tarpo")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TorchLogProbs:
    """``trl.kernels.ChunkedLogProbFunction`` in plain torch, for machines without Triton: the same arguments and
    the same five outputs (the targets' log-probs; the entropy when asked; the three other optional outputs, which
    TRL's GRPO does not ask for, None), from the logits ``hidden @ weight.T (+ bias)``, times ``logit_scale``,
    soft-capped, over ``temperature``, as the kernel's ``_transform``. Autograd gives the backward."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None, logit_scale=1.0,
              outputs=("entropy",)):
        z = torch.nn.functional.linear(hidden, weight, bias).float() * logit_scale
        if final_logit_softcapping is not None:
            z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
        logp = (z / temperature).log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
        return logp.gather(-1, targets[:, None]).squeeze(-1), entropy, None, None, None


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (from its start to its end)."""

    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def common(args, out: str) -> dict:
    """The settings both configurations take, TRL's names (GRPOConfig's fields, which TarpoConfig inherits)."""
    return dict(output_dir=out, per_device_train_batch_size=args.batch, num_generations=args.group,
                max_completion_length=args.length, learning_rate=args.lr, beta=0.0, temperature=args.temperature,
                max_steps=args.steps, logging_steps=1, save_strategy="no", report_to="none", bf16=False,
                gradient_checkpointing=False, seed=0, data_seed=0, disable_tqdm=True, lr_scheduler_type="constant")


def build(name: str, args, folder: str, out: str, timer: StepTimer):
    """One trainer on its own copy of the model: TRL's GRPOTrainer, or TarpoTrainer as GRPO or TARPO."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from tarpo.config import TarpoConfig
    from tarpo.training.trainer import TarpoTrainer

    tokenizer = load_tokenizer(folder)
    questions = args.batch // args.group * args.steps
    data = load_task(REAL_TASK, split="train", limit=questions).select_columns(["prompt", "gold", "task"])
    reward = reward_function(REAL_TASK)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if name == "trl":
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, task_type="CAUSAL_LM")
        return GRPOTrainer(model, reward, GRPOConfig(**common(args, out)), data, processing_class=tokenizer,
                           callbacks=[timer], peft_config=lora)
    config = TarpoConfig(**common(args, out), max_prompt_length=256, routing="hard" if name == "grpo" else "learned",
                         rollout_engine=args.engine, lora_r=16, lora_alpha=32, lora_target_modules=TARGETS)
    return TarpoTrainer(model, reward, config, data, processing_class=tokenizer, callbacks=[timer])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    check = REAL_MODELS["smollm2-135m"]  # the learning check's settings by default
    ap.add_argument("--steps", type=int, default=3, help="steps of each trainer in each of the two passes")
    ap.add_argument("--batch", type=int, default=int(check["BATCH"]))
    ap.add_argument("--group", type=int, default=int(check["GROUP_SIZE"]))
    ap.add_argument("--length", type=int, default=int(check["MAX_COMPLETION_LENGTH"]))
    ap.add_argument("--lr", type=float, default=float(check["LR"]))
    ap.add_argument("--temperature", type=float, default=float(check["TEMPERATURE"]))
    ap.add_argument("--engine", default="eager", choices=["eager", "compiled", "auto"])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    folder = local_copy("smollm2-135m")
    if folder is None:
        print("bench_trl_step: run python -m tarpo.models.offline smollm2-135m first", file=sys.stderr)
        return 2
    from trl.trainer import utils as trl_utils

    names, notes = NAMES, {"trl_logprobs": "TRL's Triton kernel"}
    if trl_utils._ChunkedLogProbFunction is None:  # no Triton: TRL's kernel is missing (module docstring)
        trl_utils._ChunkedLogProbFunction = TorchLogProbs
        notes["trl_logprobs"] = ("TorchLogProbs (this benchmark): TRL's kernel needs Triton, which this machine "
                                   "lacks")
    times = {name: [] for name in names}
    rollouts = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for order in (names, names[::-1]):
            for name in order:
                timer = StepTimer()
                trainer = build(name, args, folder, os.path.join(tmp, f"{name}-{len(times[name])}"), timer)
                trainer.train()
                times[name].append(timer.times)
                rollouts[name] += [h.get("timing/rollout_s") for h in trainer.state.log_history if "loss" in h][1:]
                del trainer
    later = {n: [t for run in runs for t in run[1:]] for n, runs in times.items()}
    result = {"settings": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(), **notes,
              "steps_s": times, "first_step_s": {n: [run[0] for run in runs] for n, runs in times.items()},
              "median_after_first_s": {n: statistics.median(t) for n, t in later.items() if t},
              "rollout_median_s": {n: statistics.median(r) for n, r in rollouts.items() if r and None not in r}}
    medians = result["median_after_first_s"]
    for base in ("trl", "grpo"):
        if base in medians:
            result[f"over_{base}"] = {n: round(v / medians[base], 3) for n, v in medians.items()}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
