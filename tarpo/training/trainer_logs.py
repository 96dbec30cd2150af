"""What ``TarpoTrainer`` writes into TRL's logs (docs/design-notes.md, "Logged metrics"), one mixin
(:class:`TrainerLogs`, a base of :class:`tarpo.training.trainer.TarpoTrainer`): a rollout's figures, computed by
:mod:`tarpo.training.metrics` from the rollout alone, into the step's metrics, TRL's completion log and its token
count; and the log record, where the project's ``*_max`` / ``*_min`` metrics keep their extremes.

The containers are TRL's ``GRPOTrainer``'s own (``_metrics``, ``_logs``, ``_pending_extra_logs``,
``_pending_metrics``): a subclass that replaces its ``_generate_and_score_completions`` fills them as that method
does; TRL has no public way to add to them (its ``log_metric`` / ``log_extra`` are handed to reward functions only).
"""

from __future__ import annotations

from . import metrics


class TrainerLogs:
    """TRL's logging of a rollout and a step, for ``TarpoTrainer``'s own rollout and loss."""

    def _report(self, mode: str, rollout, rewards, rewards_per_func, n_trunc: int, completions_log) -> None:
        """A rollout's figures (:mod:`tarpo.training.metrics`) into TRL's logs: the step's metrics, the tokens seen,
        the completion log (``log_completions``; ``completions_log``: prompts, completions, advantages) and what
        the reward functions logged (TRL's ``log_extra`` / ``log_metric``: their pending lists emptied, as TRL's
        own generation empties them). Every process gathers in the same order."""
        settings, step_metrics = self._report_settings, self._metrics[mode]
        figures, tokens = metrics.rollout_figures(settings, rollout, rewards, rewards_per_func, n_trunc)
        for name, value in figures.items():
            step_metrics[name].append(value)
        self.state.num_input_tokens_seen += tokens
        step_metrics["num_tokens"] = [self.state.num_input_tokens_seen]  # TRL's running count
        prompts, completions, advantages = completions_log
        logged = metrics.completion_rows(settings, prompts, completions, rewards_per_func, advantages) \
            if self.args.log_completions else None
        columns, means = metrics.reward_logs(settings, self._pending_extra_logs, self._pending_metrics, len(prompts))
        self._pending_extra_logs.clear()
        self._pending_metrics.clear()
        for name, value in means.items():
            step_metrics[name].append(value)
        if logged is not None:
            for key in ("prompt", "completion", "advantages"):
                self._logs[key].extend(logged[key])
            for name, values in logged["rewards"].items():
                self._logs["rewards"][name].extend(values)
            for column, values in columns.items():
                self._logs["extra"][column].extend(values)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, except that the project's own ``*_max`` (``*_min``) metrics and the run's count
        ``nonfinite_steps`` log the largest (smallest) value of the logged steps' micro-batches, where TRL averages
        every metric over them (TRL's own ``clip_ratio/high_max`` keeps TRL's meaning)."""
        for mode, step_metrics in self._metrics.items():
            self._loss_figures.flush(mode, step_metrics)  # an evaluation's (training's are flushed at each step)
            for name, values in step_metrics.items():
                finite = [v for v in values if v == v]  # NaN left out, as TRL's average leaves it out
                own = name.startswith(("logp_drift", "importance_sampling/")) and name.endswith(("_max", "_min"))
                if finite and (own or name == "nonfinite_steps"):
                    step_metrics[name] = [min(finite) if name.endswith("_min") else max(finite)]
        if "loss" in logs:  # a training log: its window's loss left the sums if a step was skipped (nonfinite)
            if self.nonfinite.skipped_since_log:
                logs["loss"] = float("nan")
            self.nonfinite.skipped_since_log = False
        super().log(logs, start_time)
