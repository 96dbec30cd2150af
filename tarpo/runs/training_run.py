"""Step 3 of the launcher (:mod:`tarpo.runs.launch`): train a run into its folder, in every process of the run.

Without CUDA the loaded model is probed first and the run's time estimated (:mod:`tarpo.runs.cpu_estimate`), a run
longer than ``CPU_MAX_HOURS`` refused before any file is written. A new run folder records the run's identity and
``launch_config.json``; the trainer resumes from the newest complete checkpoint there, stops at a signal of
``SAVE_ON_SIGNALS`` with a checkpoint (:mod:`tarpo.training.preemption`) and saves ``adapter/`` atomically.
"""

from __future__ import annotations

import os

import torch

from ..atomic_files import write_json_atomic
from ..models.loading import load_tokenizer, stop_token_ids, training_policy
from ..tasks import graders  # its reward_function by attribute: a test stands in for it
from ..tasks.prompts import count_too_long, prompt_ids
from ..tasks.registry import load_task
from ..training import preemption
from ..training.callbacks import JsonlLogger
from ..training.checkpoints import DiskFull, NonFiniteTensors, remove_partial_saves, save_final
from ..training.resume import finished_step, last_complete_checkpoint
from ..training.nonfinite import NonFiniteTraining
from ..training.trainer import TarpoTrainer
from . import run_identity
from .cpu_estimate import PROBE_PROMPTS, completion_lengths, describe, planned_steps, probe
from .launch_config import LaunchConfig
from .processes import first_on_machine, process_rank


def cpu_run_estimate(cfg: LaunchConfig, model, tokenizer, dataset) -> float:
    """Without CUDA: probe the loaded model (:mod:`tarpo.runs.cpu_estimate`), print the time of a step and
    of the run, and return the run's seconds. Before any file of the run is written."""
    t = cfg.trainer
    rows = t["per_device_train_batch_size"] * t.get("gradient_accumulation_steps", 1)
    sample = [prompt_ids(tokenizer, p, t["max_prompt_length"], i, t.get("chat_template_kwargs"))[0]
              for i, p in enumerate(dataset["prompt"][:64])]
    prompt = round(sum(map(len, sample)) / max(1, len(sample)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    lengths = completion_lengths(model, sample[:PROBE_PROMPTS], t["max_completion_length"],
                                 stop_token_ids(model, tokenizer), pad, t["temperature"])
    completion = max(lengths)
    estimate = probe(model, rows)
    step = estimate.step_seconds(rows, prompt, completion, t["beta"])
    steps = planned_steps(t.get("max_steps", -1), t["num_train_epochs"], len(dataset), t["num_generations"],
                          rows * cfg.num_processes)
    print(f"CPU estimate: {describe(step)} a step ({rows} completions of up to {t['max_completion_length']} tokens, "
          f"{completion} in the probe's longest of {len(lengths)}, after prompts of ~{prompt}: decode "
          f"{estimate.decode_step_s * 1000:.0f} ms a token, forward {estimate.forward_tok_s:.0f} tokens/s, training "
          f"{estimate.train_tok_s:.0f} tokens/s), {steps} steps: {describe(step * steps)} "
          "(tarpo/runs/cpu_estimate.py)", flush=True)
    return step * steps


def load_run(cfg: LaunchConfig, args):
    """The run's tokenizer, training data and policy, loaded; without CUDA the run's time estimated first and a run
    longer than ``CPU_MAX_HOURS`` refused. No file of the run is written yet."""
    try:
        tokenizer = load_tokenizer(cfg.model)
    except OSError as exc:  # offline without the model in the hub cache, a folder without a tokenizer, ...
        where = "" if torch.cuda.is_available() else (" On a CPU-only machine run the demo (bash run_demo.sh) or "
                                                      "set MODEL to a small local model folder.")
        raise ValueError(f"MODEL={cfg.model}: cannot be loaded ({str(exc).splitlines()[0]}).{where}") from None
    dataset = load_task(cfg.task, cfg.data_path, "train", limit=cfg.train_limit)
    count_too_long(tokenizer, dataset["prompt"], args.max_prompt_length)  # a prompt that cannot fit: refused now
    model = training_policy(cfg.model, args, cfg.backend, "bfloat16" if args.bf16 else "float32")
    if not torch.cuda.is_available():
        seconds = cpu_run_estimate(cfg, model, tokenizer, dataset)
        if seconds > cfg.cpu_max_hours * 3600:
            raise ValueError(f"CPU_MAX_HOURS={cfg.cpu_max_hours:g}: this run would take about "
                             f"{seconds / 3600:.1f} h on this CPU; lower MAX_STEPS, BATCH or MAX_COMPLETION_LENGTH, "
                             "use a GPU, or raise CPU_MAX_HOURS")
    return tokenizer, dataset, model


def train(cfg: LaunchConfig, args, ident: dict, signals) -> str | None:
    """Train into ``cfg.run_dir`` with ``args``, the run's TarpoConfig (:mod:`tarpo.runs.run_config`), recording
    ``ident`` (:func:`tarpo.runs.run_identity.identity`) in a new run folder; returns the saved adapter folder
    (None: stopped by a signal, with a checkpoint). Every process of a run calls this; the main one alone writes
    the configuration, clears interrupted saves and prints. ``signals`` (:class:`tarpo.runs.launch_signals
    .LaunchSignals`): a signal during the final save is kept until it is done; a signal in the last step, or during
    that save, raises :class:`tarpo.runs.launch_signals.Preempted` after it (the launch stops before EVAL=1)."""
    run_dir, main = cfg.run_dir, process_rank() == 0
    adapter = os.path.join(run_dir, "adapter")
    done = finished_step(run_dir, args.max_steps, args.num_train_epochs)
    if done is not None:  # a re-run of a finished run: nothing is loaded, trained or written
        if main:
            print(f"run already finished at step {done}; nothing to do ({adapter} is its adapter; raise MAX_STEPS "
                  "to train further, or set another RUN_NAME/OUT_DIR for a new run)")
        return adapter
    tokenizer, dataset, model = load_run(cfg, args)
    os.makedirs(run_dir, exist_ok=True)
    if main:
        run_identity.record(run_dir, ident)
        write_json_atomic(os.path.join(run_dir, "launch_config.json"), cfg.to_dict())
    trainer = TarpoTrainer(model=model, reward_funcs=graders.reward_function(cfg.task), args=args,
                           train_dataset=dataset, processing_class=tokenizer,
                           callbacks=[JsonlLogger(os.path.join(run_dir, "metrics.jsonl"))])
    if main:
        preemption.clear_stop(run_dir)
        for name in remove_partial_saves(run_dir):
            print(f"removed {name}: a save that a kill or a full disk interrupted")
    trainer.accelerator.wait_for_everyone()  # the others look for checkpoints once those are gone
    # the newest complete checkpoint; the main process says which it skips
    last = last_complete_checkpoint(run_dir, report=print if main else lambda _: None)
    if last is not None and main:
        print(f"resuming from {last}")
    try:
        trainer.train(resume_from_checkpoint=last)  # from a checkpoint at the last step: trains nothing
        stop = trainer.stop_signal
        # a signal after the last step's on_step_end (the checkpoint transformers writes then, a last log) is
        # received but stops no step: the run trained to its end, and stops before EVAL=1 all the same
        stopped = stop is not None and (stop.stopped_at is not None or stop.received is not None)
        if stopped and trainer.state.global_step < trainer.state.max_steps:
            if first_on_machine():  # checkpoint-<step> saved; each machine's launcher reads its own run folder
                preemption.record_stop(run_dir, stop.received, stop.stopped_at)
            return None
        with signals.deferred():
            save_final(trainer, adapter)  # adapter/ appears complete, with final_state.json
        if stopped:  # a signal in the last step: the adapter saved, no EVAL=1
            from .launch_signals import Preempted
            raise Preempted(stop.received)
    except (DiskFull, NonFiniteTraining, NonFiniteTensors) as exc:
        raise SystemExit(f"tarpo launch: error: {exc}") from None
    return adapter
