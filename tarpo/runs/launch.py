"""What ``run_gsm8k.sh``, ``run_math.sh`` and ``run_dapo.sh`` run: ``python -m tarpo.runs.launch <dataset>``.

The launcher's shell variables (and the environment) override the presets of
:mod:`tarpo.runs.presets`; an empty variable means "the paper's value". Steps:

1. resolve the configuration and check it (bad values name their variable: :func:`configure`, needing no torch
   until every variable is checked); validate the run's TarpoConfig, plan the GPU memory from it and pick the
   training micro-batch (:mod:`tarpo.runs.run_config`, docs/memory-plan.md), refusing a run that cannot fit;
   ``DRY_RUN=1`` prints it, the last line being the configuration as one JSON object;
2. without CUDA, estimate the run's time from a short probe of the model and print it, refusing
   a run longer than ``CPU_MAX_HOURS`` (:mod:`tarpo.runs.training_run`, :mod:`tarpo.runs.cpu_estimate`);
3. train (:mod:`tarpo.runs.training_run`) with :class:`tarpo.training.trainer.TarpoTrainer` into the run folder
   (``launch_config.json``, ``metrics.jsonl``, checkpoints, ``adapter/`` with the router), resuming from the newest
   complete checkpoint there if any (:mod:`tarpo.training.resume`); a finished run is a no-op; a signal of
   ``SAVE_ON_SIGNALS`` (a scheduler's preemption) stops it after the step in flight with a checkpoint, one line
   and exit status 75 (:mod:`tarpo.training.preemption`), and a run of non-finite steps stops it with one line
   (:mod:`tarpo.training.nonfinite`);
4. with ``EVAL=1``, evaluate the trained system on the data set's benchmarks with
   ``tarpo eval`` into ``<run>/eval``.

With ``NUM_PROCESSES`` > 1 or an ``ACCELERATE_CONFIG``, this process checks the configuration, then
starts steps 3 and 4 each through ``accelerate launch`` (:mod:`tarpo.runs.processes`) and waits for
them: training runs ``-m tarpo.runs.launch <dataset>`` in every process (the main one, rank 0, alone
writes and prints), the evaluation ``-m tarpo.cli eval`` once training has ended. One process (the
default) trains and evaluates in this process.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import replace

from . import launch_environment, launcher_values, run_identity
from .launch_config import LaunchConfig
from .presets import checked_variables, resolve
from .processes import (LAUNCHED, accelerate_prefix, check_processes, first_on_machine, process_rank, run_command,
                        training_command)


def check_data(cfg: LaunchConfig) -> None:
    """EVAL=1 with an EVAL_DATA_DIR needs a folder there for each benchmark (that DATA_PATH and
    EVAL_DATA_DIR exist, :func:`tarpo.runs.presets.resolve` has checked)."""
    root = cfg.eval_data_dir
    if cfg.eval and root is not None:
        missing = [t for t in cfg.eval_tasks if not os.path.exists(os.path.join(root, t))]
        if missing:
            raise ValueError(f"EVAL_DATA_DIR={root}: no folder for {', '.join(missing)} (EVAL=1 evaluates "
                             f"{', '.join(cfg.eval_tasks)})")


def evaluation_args(cfg: LaunchConfig, adapter: str) -> list[str]:
    """The ``tarpo eval`` arguments that evaluate the trained system as the paper does (the routing rule's own
    settings, e.g. the entropy threshold, it reads from the adapter: :data:`tarpo.algorithms.RULE_SETTINGS`)."""
    args = ["eval", "--model", cfg.model, "--adapter", adapter, "--mode", cfg.eval_mode, "--system",
            cfg.system, "--tasks", ",".join(cfg.eval_tasks), "--n", str(cfg.eval_n),
            "--out", os.path.join(cfg.run_dir, "eval"), "--seed", str(cfg.trainer["seed"]), "--backend", cfg.backend]
    if cfg.eval_limit:
        args += ["--limit", str(cfg.eval_limit)]
    if cfg.eval_data_dir:
        args += ["--data-dir", cfg.eval_data_dir]
    return args


def evaluate(cfg: LaunchConfig, adapter: str) -> int:
    """``tarpo eval`` in this process (one-process runs)."""
    from ..cli import main as cli
    return cli(evaluation_args(cfg, adapter))


def evaluation_command(cfg: LaunchConfig, adapter: str) -> list[str]:
    """``tarpo eval`` through the run's ``accelerate launch`` prefix (runs with several processes)."""
    return [*accelerate_prefix(cfg), "-m", "tarpo.cli", *evaluation_args(cfg, adapter)]


def launch_processes(cfg: LaunchConfig, args) -> int:
    """Train through ``accelerate launch`` and wait for every process; then, with EVAL=1, evaluate
    through the same prefix, once the training processes have ended and freed their devices."""
    from ..engineering_fields import signal_numbers
    from ..training import preemption

    # every process trains in the micro-batch planned here
    env = {**os.environ, LAUNCHED: "1", "MICRO_BATCH": str(cfg.memory_plan["micro_batch"])}
    preemption.clear_stop(cfg.run_dir)
    stops, received = signal_numbers(cfg.trainer.get("save_on_signals", ())), []
    status = run_command(training_command(cfg), env, stops, received)
    stopped = preemption.stop_line(cfg.run_dir)
    if stopped is not None:  # the processes stopped at a signal (tarpo.runs.launch_signals)
        print(stopped, flush=True)
        return preemption.EXIT_PREEMPTED
    if received:  # a stop signal, and no process left a marker: they stopped before the run folder was made
        return preempted(cfg, args, received[0])
    if status != 0 or not cfg.eval:
        return status
    status = run_command(evaluation_command(cfg, os.path.join(cfg.run_dir, "adapter")), dict(os.environ), stops,
                         received, stop_as_term=True)
    return preempted(cfg, args, received[0], evaluating=True) if received and status != 0 else status


def preempted(cfg: LaunchConfig, args, signal_name: str, evaluating: bool = False) -> int:
    """A stop signal outside a training step (tarpo.runs.launch_signals): the marker (by each machine's first
    process), the launcher's line (by the process that started the run) and the requeue status. What is complete:
    the adapter (training finished; EVAL=1 left to run, or to resume), else the newest complete checkpoint."""
    from ..training import preemption
    from ..training.resume import finished_step, last_complete_checkpoint
    adapter = os.path.join(cfg.run_dir, "adapter")
    trained = finished_step(cfg.run_dir, args.max_steps, args.num_train_epochs) is not None
    if trained:
        when = "during the evaluation" if evaluating else "after training"
        then = "resume the evaluation" if evaluating else "evaluate (EVAL=1)" if cfg.eval else "see it finished"
        saved = adapter
    else:
        when, saved = "before training ended", last_complete_checkpoint(cfg.run_dir, report=lambda _: None)
        then = "resume from it" if saved else "start it again"
    if first_on_machine() and os.path.isdir(cfg.run_dir):  # none before the folder is
        preemption.record_stop(cfg.run_dir, signal_name, None, saved, when, then)  # made: its starter says so
    if os.environ.get(LAUNCHED) == "1":  # the process that started this one says so
        return 0
    print(preemption.describe_stop({"signal": signal_name, "when": when, "saved": saved, "then": then}), flush=True)
    return preemption.EXIT_PREEMPTED


def configure(dataset: str, main_process: bool, launched: bool):
    """Step 1: the run's :class:`LaunchConfig`, its :class:`tarpo.config.TarpoConfig` and identity, and whether this
    process starts the run's processes. Every check runs here, before any model loads or any file is written (a
    ``.gguf`` MODEL, once checked, is converted into the cache ``runs/cache/gguf``, even on DRY_RUN: the plan reads
    its architecture); a bad launcher variable is refused before torch is imported (``ValueError`` naming it)."""
    env = dict(os.environ)
    checked_variables(dataset, env)
    says = main_process and not launched
    if says:  # what the run runs on and uses, in the launcher's words, before the heavy imports
        print(launch_environment.python_line(env), flush=True)
        print(launcher_values.table(launcher_values.sources(dataset, env)), flush=True)
    cfg = resolve(dataset, launcher_values.as_set(dataset, env))  # the launcher's paper values: as if unset
    ident = run_identity.identity(cfg)
    run_identity.check(cfg, ident)  # a folder of another run is refused before anything loads
    import torch  # torch, TRL: once every variable is checked
    from ..models.loading import resolve_backend
    if says:
        print(launch_environment.device_line(resolve_backend(cfg.backend)), flush=True)

    check_data(cfg)
    from ..models.gguf import gguf_folder, is_gguf
    if is_gguf(cfg.model):  # converted once into runs/cache/gguf (a cache keyed by the file's bytes, not a run's
        cfg = replace(cfg, model=gguf_folder(cfg.model))  # output): the memory plan reads its architecture there

    from ..training.distributed import cpu_requested
    from . import run_config
    cuda = torch.cuda.is_available()
    command = training_command(cfg)
    # this process starts the run's processes, unless it is one of them (or accelerate started it)
    starts = command is not None and not launched and "LOCAL_RANK" not in os.environ
    cfg = replace(cfg, launch_command=None if command is None else shlex.join(command))
    planned = run_config.trainer_arguments(cfg, cuda, whole_step=starts)  # validated: what the plan reads
    cfg = run_config.plan_memory(cfg, planned, cuda)  # the GPU's plan, in the launcher's precision
    if not cfg.dry_run:  # DRY_RUN=1 shows what a GPU would train
        cfg = cfg.on_device(cuda)
    args = run_config.trainer_arguments(cfg, cuda, whole_step=starts)  # the run's TarpoConfig: planned micro-batch
    if not cfg.dry_run:
        check_processes(cfg, torch.cuda.device_count() if cuda else 0, cpu_requested())
    return cfg, args, ident, starts


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tarpo.runs.launch {gsm8k|math|dapo|arith}   (settings come from the environment; "
              "arith: the CPU testbed's task, tarpo.runs.learning_check)", file=sys.stderr)
        return 2
    main_process, launched = process_rank() == 0, os.environ.get(LAUNCHED) == "1"
    try:
        cfg, args, ident, starts = configure(argv[0], main_process, launched)
    except ValueError as exc:
        print(f"tarpo launch: error: {exc}", file=sys.stderr)
        return 2
    if cfg.dry_run:
        if main_process:
            print(cfg.listing())
        return 0
    if main_process:
        print(f"memory plan: {json.dumps(dict(cfg.memory_plan))}", flush=True)
    if starts:
        return launch_processes(cfg, args)
    from ..training import preemption
    from . import training_run  # the trainer and its imports: only where this process trains
    from .launch_signals import LaunchSignals, Preempted
    with LaunchSignals(cfg.trainer.get("save_on_signals", ())) as signals:  # a signal outside a training step
        try:
            try:
                adapter = training_run.train(cfg, args, ident, signals)
            except ValueError as exc:
                print(f"tarpo launch: error: {exc}", file=sys.stderr)
                return 2
            if adapter is None:  # stopped by a signal, with a checkpoint: the process that started this run says so
                if launched:
                    return 0
                print(preemption.stop_line(cfg.run_dir), flush=True)
                return preemption.EXIT_PREEMPTED
            if not main_process:
                return 0
            print(f"adapter and router saved to {adapter}")
            if launched or not cfg.eval:  # the process that launched this one evaluates, once every process ended
                return 0
        except Preempted as stop:
            return preempted(cfg, args, str(stop))
        try:
            return evaluate(cfg, adapter)
        except Preempted as stop:
            return preempted(cfg, args, str(stop), evaluating=True)


if __name__ == "__main__":
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    sys.exit(main())
