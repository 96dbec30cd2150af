"""``TarpoTrainer``'s saving and resuming: the Trainer's checkpoint methods, overridden in one mixin
(:class:`TrainerCheckpoints`, a base of :class:`tarpo.training.trainer.TarpoTrainer` ahead of TRL's class).

- ``_save_checkpoint`` / ``save_model``: the router (and the frozen reference router), the soft input and the routing
  rule's settings are saved beside the adapter; a checkpoint is written whole into a temporary folder and renamed into
  place, a full disk raises ``DiskFull``, a non-finite tensor is refused (:mod:`tarpo.training.checkpoints`).
- ``_load_from_checkpoint``: the heads restored. The resume that ``TarpoTrainer.train`` asks for
  (:meth:`TrainerCheckpoints._resume_point`): ``resume_from_checkpoint=True`` takes the newest *complete* checkpoint
  (:mod:`tarpo.training.resume`); a checkpoint at the last step is loaded and nothing trained
  (:meth:`TrainerCheckpoints._end_at`; the Trainer would train one more step).
"""

from __future__ import annotations

import logging
import os
import shutil

from transformers import TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from . import checkpoints, resume, sharding

logger = logging.getLogger(__name__)


class TrainerCheckpoints:
    """The checkpoint methods of transformers' ``Trainer`` that ``TarpoTrainer`` overrides (each override calls the
    Trainer's own through ``super()``: TRL's ``GRPOTrainer`` further along ``TarpoTrainer``'s MRO), and the resume's
    helpers that ``TarpoTrainer.train`` calls."""

    # A checkpoint is written whole into a temporary folder, then renamed into place (tarpo.training.checkpoints):
    # a kill or a full disk during a save never leaves a checkpoint-N that a re-run would pick.
    def _save_router(self, directory: str) -> None:
        checkpoints.save_heads(directory, self.router, self.ref_router, self.soft_input, self.args)

    def _get_output_dir(self, trial):
        """The run folder; while a checkpoint is being saved, the temporary folder that the Trainer's
        own save sequence (and TRL's) writes ``checkpoint-N`` into."""
        staging = getattr(self, "_checkpoint_staging", None)
        return staging if staging is not None else super()._get_output_dir(trial=trial)

    def _save_checkpoint(self, model, trial):
        run_dir = super()._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        checkpoints.refuse_nonfinite(self.model, name)
        staging = checkpoints.staging_folder(run_dir, name)
        staged = os.path.join(staging, name)
        with checkpoints.staged_save(self, staging, name, run_dir) as main:
            self._checkpoint_staging = staging
            try:
                # the Trainer's sequence into the temporary folder: adapter, optimizer, scheduler, RNG state,
                # trainer_state.json (its rotation sees only this checkpoint there); then the router and the rest
                super()._save_checkpoint(model, trial)
                self._save_router(staged)
                best = self.state.best_model_checkpoint
                if best is not None and os.path.abspath(best).startswith(os.path.abspath(staging) + os.sep):
                    self.state.best_model_checkpoint = os.path.join(run_dir, name)
                    if main:
                        self.state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))
                self.accelerator.wait_for_everyone()  # every process's files (rng_state_<rank>.pth) are written
                if main:
                    checkpoints.write_manifest(staged)
            finally:
                self._checkpoint_staging = None
        if main:
            checkpoints.publish(staged, os.path.join(run_dir, name))
            shutil.rmtree(staging, ignore_errors=True)
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()

    def save_model(self, output_dir=None, _internal_call=False):
        checkpoints.refuse_nonfinite(self.model, output_dir or self.args.output_dir)
        if self.is_fsdp_enabled:  # FSDP2: the adapter gathered whole and written as PEFT's (one process loads it)
            adapter = sharding.whole_state_dict(self.accelerator.unwrap_model(self.model), lambda n: "lora_" in n)
            if self.args.should_save:
                self._save(output_dir or self.args.output_dir, state_dict=adapter)
        else:
            super().save_model(output_dir, _internal_call)
        if not _internal_call:
            self._save_router(output_dir or self.args.output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.ref_router = checkpoints.load_heads(resume_from_checkpoint, self.router, self.soft_input,
                                                 self.accelerator.device)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None or not resume.load_optimizer_on_cpu(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)  # TRL's reads the adaptive entropy state too
        else:  # ... which the CPU processes' loader does not
            self._restore_entropy_control(checkpoint)

    def _resume_point(self, resume_from_checkpoint):
        return resume.resume_point(resume_from_checkpoint, self.args.output_dir, logger.warning)

    def _at_the_end(self, checkpoint) -> bool:
        """Whether ``checkpoint`` is at the last step of this training (the Trainer would still train
        one more step from it)."""
        step = resume.read_state(checkpoint)["global_step"]
        if self.args.max_steps > 0:
            return step >= self.args.max_steps
        return step >= self.set_initial_training_values(self.args, self.get_train_dataloader())[-1]

    def _end_at(self, checkpoint):
        """Training ended at ``checkpoint`` (a kill came after its save, before the final one): load it and
        train nothing."""
        logger.warning(f"{checkpoint} is at the last step of training: loading it, nothing left to train")
        self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        return TrainOutput(self.state.global_step, 0.0, {})
