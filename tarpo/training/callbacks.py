"""Trainer callbacks shared by the demo and the launchers."""

from __future__ import annotations

import contextlib
import json
import math
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
            record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in (logs or {}).items()}
            with open(self.path, "a") as f:  # NaN and inf (a skipped step's loss) as null: strict JSON
                f.write(json.dumps({"step": state.global_step, **record}, allow_nan=False) + "\n")


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


def cuda_in_use() -> bool:
    """Whether this process has started CUDA (the only case where there is device memory to read)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class StepResources(TrainerCallback):
    """Adds to each optimizer step's log what the step cost:

    - ``timing/step_s``: wall seconds of the step, rollout and every micro-batch's forward/backward included,
      checkpoint saving not (the trainer's rollout adds ``timing/rollout_s``; the training part of a step is
      ``timing/step_s`` less its rollouts; ``TarpoConfig.time_scoring`` adds ``timing/scoring_s``, :meth:`timed`);
    - on CUDA, ``memory/peak_gib`` and ``memory/peak_reserved_gib``: the peaks of
      ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` during the step (set back at its start; the
      reserved peak is what the allocator held, fragmentation included: what ``nvidia-smi`` sees, less the CUDA
      context), and ``memory/rollout_peak_gib``: the rollout's own allocated peak, the allocator's peak set back
      when the rollout starts (:meth:`rollout_started`, the peak so far kept for the step's) and read when it ends
      (:meth:`rollout_ended`), an evaluation's rollout's alike (in its ``eval_`` metrics); compare each with the
      run's memory plan in launch_config.json, docs/memory-plan.md;
    - ``hooks/forward``: :func:`forward_hook_count` at the step's end.

    It writes into the trainer's metrics of the step (``metrics``: TRL's ``_metrics["train"]``, averaged
    into the step's log record), so every logger (metrics.jsonl, REPORT_TO) sees the same numbers. Reading the
    allocator's peaks costs no synchronisation; the step's time synchronises once at each end of the step."""

    def __init__(self, metrics, model_fn):
        self.metrics, self.model_fn, self.started = metrics, model_fn, None
        self.peaks = (0, 0)  # allocated and reserved peaks of the step before its last rollout started

    def on_step_begin(self, args, state, control, **kwargs):
        if cuda_in_use():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.started, self.peaks = time.perf_counter(), (0, 0)

    def _read_peaks(self) -> tuple[int, int]:
        """The step's allocated and reserved peaks so far: those kept at its rollouts' starts and the allocator's."""
        return (max(self.peaks[0], torch.cuda.max_memory_allocated()),
                max(self.peaks[1], torch.cuda.max_memory_reserved()))

    def rollout_started(self) -> None:
        """Called by the trainer just before a rollout (CUDA only): the peaks so far kept for the step's, the
        allocator's set back, so that the rollout's peak is its own (after a step's micro-batches, or a step's
        whole training before an evaluation)."""
        if cuda_in_use():
            self.peaks = self._read_peaks()
            torch.cuda.reset_peak_memory_stats()

    def rollout_ended(self, metrics) -> None:
        """Called by the trainer just after a rollout: ``memory/rollout_peak_gib`` (CUDA only)."""
        if cuda_in_use():
            metrics["memory/rollout_peak_gib"].append(torch.cuda.max_memory_allocated() / 2**30)

    @contextlib.contextmanager
    def timed(self, metrics, key: str, on: bool):
        """With ``on``, the seconds of the block appended to ``metrics[key]``, the device synchronised at both
        ends (so the time is the block's work, not its launch): opt-in, since each synchronisation stalls the
        host's queue of kernels. Off, nothing is added."""
        if not on:
            yield
            return
        if cuda_in_use():
            torch.cuda.synchronize()
        started = time.perf_counter()
        yield
        if cuda_in_use():
            torch.cuda.synchronize()
        metrics[key].append(time.perf_counter() - started)

    def on_step_end(self, args, state, control, **kwargs):
        if self.started is None:
            return
        cuda = cuda_in_use()
        if cuda:
            torch.cuda.synchronize()
        self.metrics["timing/step_s"].append(time.perf_counter() - self.started)
        if cuda:
            allocated, reserved = self._read_peaks()
            self.metrics["memory/peak_gib"].append(allocated / 2**30)
            self.metrics["memory/peak_reserved_gib"].append(reserved / 2**30)
        self.metrics["hooks/forward"].append(float(forward_hook_count(self.model_fn())))
        self.started = None


class SyncReferences(TrainerCallback):
    """TRL's ``sync_ref_model`` for this trainer (TRL's ``SyncRefModelCallback`` pairs the reference's parameters
    with the policy's one by one, which the router and the soft input, submodules of the policy, break): every
    ``ref_model_sync_steps`` optimizer steps, reference <- alpha * policy + (1 - alpha) * reference
    (``ref_model_mixup_alpha``), for the token reference of full fine-tuning (its parameters matched by name) and
    for the router's reference. ``policy()``: the base model; ``references()``: ``(ref_model, router, ref_router)``,
    each possibly None."""

    def __init__(self, policy, references):
        self.policy, self.references = policy, references

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps:
            return
        alpha = args.ref_model_mixup_alpha
        ref_model, router, ref_router = self.references()
        pairs = []
        if ref_model is not None:
            policy = dict(self.policy().named_parameters())
            pairs += [(p, policy[n]) for n, p in ref_model.named_parameters()]
        if ref_router is not None and router is not None:
            pairs += list(zip(ref_router.parameters(), router.parameters(), strict=True))
        with torch.no_grad():
            for target, source in pairs:
                target.mul_(1.0 - alpha).add_(source.to(target.dtype), alpha=alpha)
