"""A non-finite step never reaches the parameters (docs/design-notes.md, "Preemption and non-finite steps").

A bf16 overflow in one training forward (or an infinite reward, a row that divides by zero) makes a loss or a gradient
non-finite; the optimizer would write it into every trained tensor, and the run would go on, its loss logged as 0.0
by transformers' NaN filter. :class:`NonFiniteGuard` makes the step a no-op instead, as Megatron-LM skips an
iteration whose gradients overflowed:

- every micro-batch's loss is checked on the device (an or'ed flag, no host synchronisation);
- at the optimizer step, after the gradient clip, the pre-clip gradient norm (inf or NaN when any gradient is) and
  that flag are or'ed over the processes (one all-reduce of one number, so that every rank takes the same decision)
  and read once (one host read a step, of the norm transformers reads anyway to log it);
- a bad step drops every gradient (the optimizer then changes neither a parameter nor its state: both torch's AdamW
  and bitsandbytes' skip a parameter without a gradient) and marks the optimizer step skipped, so the learning-rate
  schedule does not advance (accelerate's ``step_was_skipped``, which transformers reads); the step counter does
  advance (the step's data were used). The skipped step's loss and gradient norm are logged NaN (``null`` in
  ``metrics.jsonl``, which every JSON reader takes), its loss (its logging window's, with ``logging_steps`` > 1) left
  out of the run's ``train_loss``, which stays finite (a skipped step counts 0 in its mean),
  ``nonfinite_steps`` counts the skipped steps of the run;
- ``TarpoConfig.max_nonfinite_steps`` bad steps in a row stop the run with :class:`NonFiniteTraining`, one line
  naming the step, the last complete checkpoint and the usual causes.

On the rollout side nothing is filtered: a non-finite logit, router probability or soft mixture in a rollout
(the policy's parameters are finite, so only an overflow of its arithmetic makes one) is recorded as it is; it
makes that row's training forward or its recorded log-probabilities non-finite, so the step is skipped and
counted here (tests/test_nonfinite.py).
"""

from __future__ import annotations

import torch

from . import resume
from .distributed import on_any_rank

CAUSES = ("a learning rate too high for the model (LR, ROUTER_LR), bf16 overflow in long sequences (try BF16=0 on a "
          "small model to tell), or a reward function that returns inf (a NaN or None reward is TRL's \"not scored\": "
          "the row is left out of its group and trains nothing, tarpo.training.advantages)")


class NonFiniteTraining(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient norm."""


class NonFiniteGuard:
    """The trainer's non-finite check, one per run. ``limit``: consecutive bad steps that stop the run."""

    def __init__(self, limit: int):
        self.limit = limit
        self.reset()

    def reset(self) -> None:
        """The state of a new ``train()`` call: the run's count is read again from its log at the first step."""
        self.in_a_row, self.count, self._bad_loss = 0, None, None
        self.skipped_since_log = False  # a step of the logging window was skipped: its loss is logged NaN

    def observe_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss: whether it is finite, kept on the device until the step's check."""
        bad = ~torch.isfinite(loss.detach())
        self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad

    def decide(self, grad_norm, log_history: list[dict]) -> bool:
        """At the optimizer step (``grad_norm``: the pre-clip norm, a tensor or a float): whether the step is finite,
        the same answer on every process (one all-reduce, the step's one host read), counted in :attr:`count` (a
        resumed run goes on counting from ``log_history``, the Trainer's ``state.log_history``)."""
        if self.count is None:
            logged = [h["nonfinite_steps"] for h in log_history if "nonfinite_steps" in h]
            self.count = int(logged[-1]) if logged else 0
        norm = torch.as_tensor(grad_norm, dtype=torch.float32)
        bad = ~torch.isfinite(norm.to(self._bad_loss.device) if self._bad_loss is not None else norm)
        if self._bad_loss is not None:
            bad = bad | self._bad_loss
        self._bad_loss = None
        finite = not bool(on_any_rank(bad).item())
        self.in_a_row = 0 if finite else self.in_a_row + 1
        self.count += not finite
        self.skipped_since_log |= not finite
        return finite

    def stop(self, step: int, output_dir: str) -> NonFiniteTraining | None:
        """The error that stops the run at ``step`` after :attr:`limit` bad steps in a row, naming the last complete
        checkpoint of ``output_dir``; None while the run goes on."""
        if self.in_a_row < self.limit:
            return None
        last = resume.last_complete_checkpoint(output_dir, report=lambda _: None)
        return NonFiniteTraining(
            f"step {step}: the loss or the gradient norm was not finite at {self.in_a_row} optimizer steps in a "
            f"row (max_nonfinite_steps={self.limit}; each skipped, no parameter changed); the last complete "
            f"checkpoint is {last or 'none (no checkpoint was saved)'}. Usual causes: {CAUSES}")


def skip_or_take(trainer, finite: bool) -> None:
    """The decision's effects on a transformers ``Trainer``: a non-finite step's gradients dropped, its optimizer
    step marked skipped (the LR schedule holds) and its loss left out of the run's sum; a finite step taken."""
    # accelerate's AcceleratedOptimizer.step_was_skipped (which transformers reads to hold the LR schedule) is a
    # read-only property over its private _is_overflow, set only by its fp16 scaler: no public way to set it
    trainer.optimizer._is_overflow = not finite
    if finite:
        return
    trainer.model.zero_grad(set_to_none=True)
    # The step's NaN leaves transformers' loss sum (so the run's train_loss stays finite), and with it the
    # losses of the logging window's earlier steps (none at logging_steps=1; the sum is one tensor); the
    # window's loss is logged NaN instead (TrainerLogs.log, tarpo.training.trainer_logs), which metrics.jsonl
    # writes as null. The sum is the Trainer's private ``_tr_loss``: transformers has no public way to drop a
    # step's loss from it.
    if getattr(trainer, "_tr_loss", None) is not None:
        trainer._tr_loss.zero_()
