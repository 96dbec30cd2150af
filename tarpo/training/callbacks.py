"""Trainer callbacks shared by the demo and the launchers."""

from __future__ import annotations

import json
import os
import time

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..atomic_files import write_text_atomic


class JsonlLogger(TrainerCallback):
    """Appends every log record of the Trainer to a JSONL file (the run's metrics log,
    read by ``tarpo plot``).

    When training starts at step N (0, or the step of the checkpoint it resumes from), the records
    of later steps are dropped first (rewriting the file atomically): those of the steps a resumed
    run rolls back and trains again, and a line cut by a kill. The log keeps one record per step,
    the latest."""

    def __init__(self, path: str):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or not os.path.isfile(self.path):
            return
        keep, dropped = [], False
        with open(self.path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                    rolled_back = record.get("step", 0) > state.global_step
                except (ValueError, AttributeError, TypeError):  # cut by a kill, or not a record
                    rolled_back = True
                if rolled_back:
                    dropped = True
                else:
                    keep.append(line if line.endswith("\n") else line + "\n")
        if dropped:
            write_text_atomic(self.path, "".join(keep))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")


class ProgressBar(TrainerCallback):
    """A tqdm bar over optimizer steps showing the mean reward of the last 20 steps."""

    def __init__(self, name: str, steps: int):
        self.bar = tqdm(total=steps, desc=f"RL {name}", mininterval=5)
        self.reward: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.reward.append(logs["reward"])
            self.bar.set_postfix(reward=f"{sum(self.reward[-20:]) / len(self.reward[-20:]):.3f}")

    def on_step_end(self, args, state, control, **kwargs):
        self.bar.update(1)

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()


def forward_hook_count(model) -> int:
    """Forward and forward-pre hooks registered on ``model`` and its submodules: constant from step to
    step in a healthy run (a hook added per step and never removed would grow it)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class StepResources(TrainerCallback):
    """Adds to each optimizer step's log what the step cost: ``timing/step_s`` (wall seconds of the step,
    rollout and every micro-batch's forward/backward included, checkpoint saving not),
    ``memory/peak_gib`` (CUDA only: the peak of ``torch.cuda.max_memory_allocated`` during the step, set
    back at its start; compare with the run's memory plan in launch_config.json) and
    ``hooks/forward`` (:func:`forward_hook_count` at the step's end). The trainer's rollout adds
    ``timing/rollout_s``; the training part of a step is ``timing/step_s`` less its rollouts.

    It writes into the trainer's metrics of the step (``metrics``: TRL's ``_metrics["train"]``, averaged
    into the step's log record), so every logger (metrics.jsonl, REPORT_TO) sees the same numbers."""

    def __init__(self, metrics, model_fn):
        self.metrics, self.model_fn, self.started = metrics, model_fn, None

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is None:
            return
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        self.metrics["timing/step_s"].append(time.perf_counter() - self.started)
        if cuda:
            self.metrics["memory/peak_gib"].append(torch.cuda.max_memory_allocated() / 2**30)
        self.metrics["hooks/forward"].append(float(forward_hook_count(self.model_fn())))
        self.started = None
