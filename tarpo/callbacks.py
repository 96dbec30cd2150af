"""Trainer callbacks shared by the demo and the launchers."""

from __future__ import annotations

import json

from tqdm.auto import tqdm
from transformers import TrainerCallback


class JsonlLogger(TrainerCallback):
    """Appends every log record of the Trainer to a JSONL file (the run's metrics log,
    read by ``tarpo plot``)."""

    def __init__(self, path: str):
        self.path = path

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
