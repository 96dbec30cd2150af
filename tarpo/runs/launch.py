"""What ``run_gsm8k.sh``, ``run_math.sh`` and ``run_dapo.sh`` run: ``python -m tarpo.runs.launch <dataset>``.

The launcher's shell variables (and the environment) override the presets of
:mod:`tarpo.runs.presets`; an empty variable means "the paper's value". Steps:

1. resolve the configuration and check it (bad values name their variable); plan the GPU memory
   and pick the training micro-batch (:func:`plan_memory`, docs/memory-plan.md), refusing a run
   that cannot fit; ``DRY_RUN=1`` prints it, the last line being the configuration as one JSON object;
2. without CUDA, estimate the run's time from a short probe of the model and print it, refusing
   a run longer than ``CPU_MAX_HOURS`` (:mod:`tarpo.runs.cpu_estimate`);
3. train with :class:`tarpo.training.trainer.TarpoTrainer` into the run folder (``launch_config.json``,
   ``metrics.jsonl``, checkpoints, ``adapter/`` with the router), resuming from the newest
   complete checkpoint there if any (:mod:`tarpo.training.checkpoints`); a finished run is a no-op; a signal of
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
import re
import shlex
import sys

from dataclasses import replace

from ..atomic_files import write_json_atomic
from ..algorithms import ROUTINGS
from . import run_identity
from .launch_config import LaunchConfig
from . import launcher_values
from .presets import checked_variables, resolve, variable_of
from .processes import (LAUNCHED, accelerate_prefix, check_processes, process_rank, run_command,
                        training_command)



def cpu_run_estimate(cfg: LaunchConfig, model, tokenizer, dataset) -> float:
    """Without CUDA: probe the loaded model (:mod:`tarpo.runs.cpu_estimate`), print the time of a step and
    of the run, and return the run's seconds. Before any file of the run is written."""
    from .cpu_estimate import PROBE_PROMPTS, completion_lengths, describe, planned_steps, probe
    from ..models.loading import stop_token_ids
    from ..tasks.prompts import prompt_ids
    t = cfg.trainer
    rows = t["per_device_train_batch_size"] * t.get("gradient_accumulation_steps", 1)
    sample = [prompt_ids(tokenizer, p, t["max_prompt_length"], i)[0] for i, p in enumerate(dataset["prompt"][:64])]
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


def check_data(cfg: LaunchConfig) -> None:
    """EVAL=1 with an EVAL_DATA_DIR needs a folder there for each benchmark (that DATA_PATH and
    EVAL_DATA_DIR exist, :func:`tarpo.runs.presets.resolve` has checked)."""
    root = cfg.eval_data_dir
    if cfg.eval and root is not None:
        missing = [t for t in cfg.eval_tasks if not os.path.exists(os.path.join(root, t))]
        if missing:
            raise ValueError(f"EVAL_DATA_DIR={root}: no folder for {', '.join(missing)} (EVAL=1 evaluates "
                             f"{', '.join(cfg.eval_tasks)})")


def trainer_arguments(cfg: LaunchConfig, cuda: bool, whole_step: bool = False):
    """The run's :class:`tarpo.config.TarpoConfig`, built from ``cfg.trainer`` alone, once, before anything is
    loaded or written; an invalid field is reported under the launcher variable that sets it, as are a BACKEND
    that is not installed and a REPORT_TO integration that cannot start. bf16 without ``cuda`` trains with
    ``use_cpu``.

    ``whole_step``: in the process that starts the run's processes (which trains nothing), TRL's batch checks
    see the whole step's completions, as they will across NUM_PROCESSES processes. Building it writes no file.
    """
    from transformers.integrations import get_reporting_integration_callbacks

    from ..config import TarpoConfig
    from ..models.loading import resolve_backend
    t = dict(cfg.trainer)
    if whole_step:
        t["per_device_train_batch_size"] *= cfg.num_processes
    if t["bf16"] and not cuda:
        t["use_cpu"] = True
    try:
        args = TarpoConfig(**t)
        resolve_backend(cfg.backend)
    except ValueError as exc:
        raise ValueError(re.sub(r"TarpoConfig\.(\w+)=",
                                lambda m: f"{variable_of(m[1]) or 'TarpoConfig.' + m[1]}=", str(exc))) from None
    try:  # the callbacks the Trainer will make: one whose package is not installed raises here, not there
        for callback in get_reporting_integration_callbacks(args.report_to):
            callback()
    except (ValueError, RuntimeError, ImportError) as exc:
        raise ValueError(f"REPORT_TO={cfg.trainer['report_to']!r}: {exc}") from None
    return args


def plan_memory(cfg: LaunchConfig, cuda: bool) -> LaunchConfig:
    """Plan the run's GPU memory before anything loads (:mod:`tarpo.runs.memory_plan`, docs/memory-plan.md)
    and train in the micro-batch it picks: the largest divisor of the per-process batch whose peak fits
    the GPU (or MICRO_BATCH), with ``BATCH / NUM_PROCESSES / micro-batch`` gradient-accumulation steps.
    Without CUDA the plan is for an 80 GB GPU; it refuses a run only where it targets a GPU (CUDA, or
    ``DRY_RUN=1``): a CPU run of a tiny model is told the plan, never stopped by it. Returns ``cfg`` with its
    ``memory_plan`` and the trainer's batch fields; the run folder keeps its BATCH name."""
    from . import memory_plan as mp
    from ..config import default
    from ..models.loading import resolve_backend
    from ..engine.engine_choice import engine_for
    from ..engine.soft_input import soft_input_class

    per_process, requested = cfg.trainer["per_device_train_batch_size"], cfg.micro_batch
    config = mp.model_config(cfg.model, cfg.preset)
    if config is None:
        micro = requested or per_process
        result = {"skipped": f"no config.json for {cfg.model} offline (not a preset, a local folder or in the "
                             "hub cache): memory not planned", "micro_batch": micro}
    else:
        backend = resolve_backend(cfg.backend)

        def setting(name):  # the trainer's keyword, else TarpoConfig's default (its one owner)
            return cfg.trainer[name] if name in cfg.trainer else default(name)
        rule = ROUTINGS[setting("routing")]
        run = mp.Run(rows=per_process, prompt=setting("max_prompt_length"),
                     completion=setting("max_completion_length"),
                     engine=engine_for(setting("rollout_engine"), True, "ENGINE"),  # the GPU's engine
                     backend=backend, soft_top_k=setting("soft_top_k"),
                     full_mix=soft_input_class(rule.soft_input).full_mixture(setting), gate=rule.soft.trained,
                     optim_8bit="8bit" in setting("optim"), chunk=setting("logprob_chunk_size"),
                     full_kl=setting("token_kl") == "full", checkpointing=setting("gradient_checkpointing"),
                     weight_bytes=2 if setting("bf16") else 4, shards=cfg.num_processes if cfg.sharding else 1)
        shapes = mp.shapes_of(config, setting("lora_target_modules"), setting("lora_r"))
        import torch
        total = torch.cuda.mem_get_info()[1] if cuda else mp.GPU_80GB
        merge = mp.choose_decode_merge(shapes, run, mp.usable_bytes(total), setting("decode_merge"))
        run = replace(run, decode_merge=merge)
        p = mp.choose_micro_batch(shapes, run, per_process, mp.usable_bytes(total), requested)
        micro = p["micro_batch"]
        result = {**{k: round(v, 2) for k, v in p.items() if k.endswith("_gib")}, "micro_batch": micro,
                  "decode_merge": merge,
                  "gpu_gib": round(total / mp.GIB, 2), "usable_gib": round(mp.usable_bytes(total) / mp.GIB, 2),
                  "gpu": torch.cuda.get_device_name() if cuda else "none: planned for an 80 GB GPU",
                  "engine": run.engine, "backend": backend, "shards": run.shards}
        if not p["fits"] and (cuda or cfg.dry_run):
            at = f"MICRO_BATCH={requested}" if requested else "micro-batch 1"
            change = ("set a smaller MICRO_BATCH (or leave it empty to pick one), or lower BATCH, "
                      "MAX_COMPLETION_LENGTH or MODEL") if requested else "lower BATCH, MAX_COMPLETION_LENGTH or MODEL"
            if cfg.sharding:
                change = (f"raise NUM_PROCESSES (now {cfg.num_processes}; FSDP2 shares the weights and the "
                          f"rollout's rows among the processes, over several machines with NUM_MACHINES), or {change}")
            elif cfg.num_processes == 1:
                change += (", or shard the model over several GPUs (ACCELERATE_CONFIG=configs/fsdp2.yaml "
                           "NUM_PROCESSES=8)")
            raise ValueError(f"{'MICRO_BATCH' if requested else 'BATCH'}: the run needs {p['peak_gib']:.1f} GiB at "
                             f"{at} (rollout {p['rollout_gib']:.1f}, training {p['train_gib']:.1f}), more than the "
                             f"{result['usable_gib']} GiB usable of this {result['gpu_gib']} GiB GPU: {change} "
                             "(docs/memory-plan.md)")
        result["fits"] = p["fits"]
    steps = per_process // micro
    chosen = {"decode_merge": result["decode_merge"]} if "decode_merge" in result else {}
    return replace(cfg.with_trainer(per_device_train_batch_size=micro, gradient_accumulation_steps=steps, **chosen),
                   memory_plan={**result, "gradient_accumulation_steps": steps})


def train(cfg: LaunchConfig, args, ident: dict) -> str:
    """Train into ``cfg.run_dir`` with ``args``, the run's TarpoConfig (:func:`trainer_arguments`), recording
    ``ident`` (:func:`tarpo.runs.run_identity.identity`) in a new run folder; returns the saved adapter folder.
    Every process of a run calls this; the main one alone writes the configuration,
    clears interrupted saves and prints."""
    from ..training.callbacks import JsonlLogger
    from ..training import preemption
    from ..training.checkpoints import (DiskFull, NonFiniteTensors, finished_step, last_complete_checkpoint,
                                        remove_partial_saves, save_final)
    from ..training.nonfinite import NonFiniteTraining
    from ..tasks.graders import reward_function
    from ..models.loading import load_tokenizer, training_policy
    from ..tasks.prompts import count_too_long
    from ..tasks.registry import load_task
    from ..training.trainer import TarpoTrainer
    import torch

    run_dir, main = cfg.run_dir, process_rank() == 0
    adapter = os.path.join(run_dir, "adapter")
    done = finished_step(run_dir, args.max_steps, args.num_train_epochs)
    if done is not None:  # a re-run of a finished run: nothing is loaded, trained or written
        if main:
            print(f"run already finished at step {done}; nothing to do ({adapter} is its adapter; raise MAX_STEPS "
                  "to train further, or set another RUN_NAME/OUT_DIR for a new run)")
        return adapter
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
    os.makedirs(run_dir, exist_ok=True)
    if main:
        run_identity.record(run_dir, ident)
        write_json_atomic(os.path.join(run_dir, "launch_config.json"), cfg.to_dict())
    trainer = TarpoTrainer(model=model, reward_funcs=reward_function(cfg.task), args=args, train_dataset=dataset,
                           processing_class=tokenizer,
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
        if stop is not None and stop.stopped_at is not None and trainer.state.global_step < trainer.state.max_steps:
            if main:  # stopped by a signal before the end, checkpoint-<step> saved (tarpo.training.preemption)
                preemption.record_stop(run_dir, stop.received, stop.stopped_at)
            return None
        save_final(trainer, adapter)  # adapter/ appears complete, with final_state.json
    except (DiskFull, NonFiniteTraining, NonFiniteTensors) as exc:
        raise SystemExit(f"tarpo launch: error: {exc}") from None
    return adapter


def evaluation_args(cfg: LaunchConfig, adapter: str) -> list[str]:
    """The ``tarpo eval`` arguments that evaluate the trained system as the paper does."""
    args = ["eval", "--model", cfg.model, "--adapter", adapter, "--mode", cfg.eval_mode, "--system",
            cfg.system, "--tasks", ",".join(cfg.eval_tasks), "--n", str(cfg.eval_n),
            "--out", os.path.join(cfg.run_dir, "eval"), "--seed", str(cfg.trainer["seed"]), "--backend", cfg.backend]
    for name in ("entropy_threshold", "entropy_temperature", "entropy_soft_when"):  # mode entropy: as in training
        if name in cfg.trainer:
            args += [f"--{name.replace('_', '-')}", str(cfg.trainer[name])]
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


def launch_processes(cfg: LaunchConfig) -> int:
    """Train through ``accelerate launch`` and wait for every process; then, with EVAL=1, evaluate
    through the same prefix, once the training processes have ended and freed their devices."""
    from ..config import signal_numbers
    from ..training import preemption

    # every process trains in the micro-batch planned here
    env = {**os.environ, LAUNCHED: "1", "MICRO_BATCH": str(cfg.memory_plan["micro_batch"])}
    preemption.clear_stop(cfg.run_dir)
    status = run_command(training_command(cfg), env, signal_numbers(cfg.trainer.get("save_on_signals", ())))
    stopped = preemption.stop_line(cfg.run_dir)
    if stopped is not None:  # the processes stopped at a signal, with a checkpoint
        print(stopped, flush=True)
        return preemption.EXIT_PREEMPTED
    if status != 0 or not cfg.eval:
        return status
    return run_command(evaluation_command(cfg, os.path.join(cfg.run_dir, "adapter")), dict(os.environ))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tarpo.runs.launch {gsm8k|math|dapo|arith}   (settings come from the environment; "
              "arith: the CPU testbed's task, tarpo.runs.learning_check)", file=sys.stderr)
        return 2
    main_process, launched = process_rank() == 0, os.environ.get(LAUNCHED) == "1"
    try:
        env = dict(os.environ)
        checked_variables(argv[0], env)  # a bad variable is refused before torch is imported
        if main_process and not launched:  # what the run uses, in the launcher's words, before the heavy imports
            print(launcher_values.table(launcher_values.sources(argv[0], env)), flush=True)
        cfg = resolve(argv[0], launcher_values.as_set(argv[0], env))  # the launcher's paper values: as if unset
        ident = run_identity.identity(cfg)
        run_identity.check(cfg, ident)  # a folder of another run is refused before anything loads
        import torch

        from ..training.distributed import cpu_requested
        cuda = torch.cuda.is_available()
        command = training_command(cfg)
        # this process starts the run's processes, unless it is one of them (or accelerate started it)
        starts = command is not None and not launched and "LOCAL_RANK" not in os.environ
        cfg = replace(cfg, launch_command=None if command is None else shlex.join(command))
        check_data(cfg)
        cfg = plan_memory(cfg, cuda)  # the GPU's plan, in the launcher's precision
        if not cfg.dry_run:  # DRY_RUN=1 shows what a GPU would train
            cfg = cfg.on_device(cuda)
        args = trainer_arguments(cfg, cuda, whole_step=starts)  # the run's one TarpoConfig, before anything loads
        if not cfg.dry_run:
            check_processes(cfg, torch.cuda.device_count() if cuda else 0, cpu_requested())
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
        return launch_processes(cfg)
    try:
        adapter = train(cfg, args, ident)
    except ValueError as exc:
        print(f"tarpo launch: error: {exc}", file=sys.stderr)
        return 2
    if adapter is None:  # stopped by a signal, with a checkpoint: the process that started this run says so
        from ..training import preemption
        if launched:
            return 0
        print(preemption.stop_line(cfg.run_dir), flush=True)
        return preemption.EXIT_PREEMPTED
    if not main_process:
        return 0
    print(f"adapter and router saved to {adapter}")
    if launched:  # the process that launched this one evaluates, once every process has ended
        return 0
    return evaluate(cfg, adapter) if cfg.eval else 0


if __name__ == "__main__":
    sys.exit(main())
