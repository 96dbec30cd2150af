"""TRL's adaptive entropy coefficient (``use_adaptive_entropy``, Skywork-OR1) for :class:`TarpoTrainer`, kept as
GRPOTrainer keeps it, on the trainer's own attributes: ``entropy_coef`` (the coefficient now),
``_last_world_entropy`` (the mean entropy of the last optimizer step, over every process) and
``_entropy_window_stats`` (the running [entropy sum, steps] of the step in progress). TRL's ``_save_checkpoint``
writes the first two into ``entropy_ctrl_state.json`` of each checkpoint; :meth:`_restore_entropy_control` reads them
back on resume.

The rule, TRL's: a micro-batch applies ``entropy_coef`` if the last step's entropy was at or below
``entropy_target``, else 0 (the first step applies 0: no step measured yet); at each optimizer step the coefficient
moves by ``entropy_coef_delta`` up (entropy at or below the target) or down, within ``[entropy_coef_min,
entropy_coef_max]``. The entropy is the token distribution's over the steps the token term reads
(:func:`tarpo.training.objective.tarpo_loss`'s ``entropy_bonus``).

Worked example (``entropy_coef=0``, ``entropy_coef_delta=0.01``, ``entropy_target=1e9``): step 1 applies 0 and ends
at 0.01; step 2 applies 0.01 and ends at 0.02; ``entropy_coef`` is logged 0.01, 0.02, ...
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch

ENTROPY_STATE = "entropy_ctrl_state.json"  # TRL's file name (GRPOTrainer._save_checkpoint writes it)


class TrainerEntropy:
    """The adaptive coefficient's three steps: what a micro-batch applies, what it measured, what a resume reads."""

    def _loss_settings_now(self):
        """The loss settings of this micro-batch: ``entropy_coef`` the coefficient it applies."""
        if not self.use_adaptive_entropy:
            return self.loss_settings
        applied = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        return replace(self.loss_settings, entropy_coef=applied)

    def _observe_entropy(self, terms: dict, mode: str) -> None:
        """Add a training micro-batch's entropy to the step's window (``terms``: the loss's, its ``entropy_steps``
        taken out); at the optimizer step, move the coefficient and log it as TRL does."""
        steps = terms.pop("entropy_steps", None)
        if not self.use_adaptive_entropy:
            return
        terms.pop("entropy_coef", None)  # the coefficient is logged once a step, below (a micro-batch's may be 0)
        if mode != "train":  # an evaluation never moves the controller
            return
        stats = torch.stack([terms["entropy_bonus"] * steps, steps]).detach().float()
        window = self._entropy_window_stats
        self._entropy_window_stats = stats if window is None else window + stats
        if not self.accelerator.sync_gradients:
            return
        total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
        entropy = (total[0] / total[1].clamp(min=1.0)).item()
        a = self.args
        if entropy <= a.entropy_target:
            self.entropy_coef = min(self.entropy_coef + a.entropy_coef_delta, a.entropy_coef_max)
        else:
            self.entropy_coef = max(self.entropy_coef - a.entropy_coef_delta, a.entropy_coef_min)
        self._last_world_entropy, self._entropy_window_stats = entropy, None
        self._metrics["train"]["entropy_coef"].append(self.entropy_coef)

    def _restore_entropy_control(self, checkpoint: str | None) -> None:
        """The controller's state of ``checkpoint``, where the optimizer's loader is not TRL's (which reads it too):
        CPU processes under DDP (:func:`tarpo.training.resume.load_optimizer_on_cpu`)."""
        path = os.path.join(checkpoint, ENTROPY_STATE) if checkpoint else None
        if self.use_adaptive_entropy and path and os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            self.entropy_coef, self._last_world_entropy = state["entropy_coef"], state["last_world_entropy"]
