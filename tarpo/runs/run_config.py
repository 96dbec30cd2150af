"""The run's :class:`tarpo.config.TarpoConfig` and its GPU memory plan, before anything loads or is written.

The launcher (:mod:`tarpo.runs.launch`) validates a ``TarpoConfig`` from the launcher's settings
(:func:`trainer_arguments`), plans the memory from it, with the optimizer, soft input, backend and engine the run
will have (:func:`plan_memory`, :mod:`tarpo.engine.memory_plan`, docs/memory-plan.md), and builds the final
configuration with the planned micro-batch. An invalid field is reported under the launcher variable that sets it.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch
from transformers.integrations import get_reporting_integration_callbacks

from ..config import TarpoConfig
from ..engine.engine_choice import engine_for
from ..engine.soft_input import soft_input_class
from ..models import loading  # its resolve_backend by attribute: a test harness stands in for it
from ..engine import memory_plan as mp
from .launch_config import LaunchConfig
from .launch_variables import variable_of


def in_launcher_words(message: str, cfg: LaunchConfig) -> str:
    """A configuration error named by the launcher variables it is about: ``TarpoConfig.<field>=`` as the
    variable that sets the field; TRL's own group and batch rules (GRPOConfig's: at least 2 completions a
    prompt, a step of whole groups), which TRL words in its fields, prefixed with BATCH and GROUP_SIZE.

        >>> from tarpo.runs.presets import resolve
        >>> cfg = resolve("math", {"BATCH": "8", "GROUP_SIZE": "3"})
        >>> in_launcher_words("generation_batch_size (8) must be divisible by num_generations (3).", cfg)
        "BATCH=8, GROUP_SIZE=3: generation_batch_size (8) must be divisible by num_generations (3). (TRL's rule)"
    """
    if "generation_batch_size" in message or "generations per prompt" in message:
        batch, group = cfg.trainer["per_device_train_batch_size"] * cfg.num_processes, cfg.trainer["num_generations"]
        return f"BATCH={batch}, GROUP_SIZE={group}: {message} (TRL's rule)"
    return re.sub(r"TarpoConfig\.(\w+)=", lambda m: f"{variable_of(m[1]) or 'TarpoConfig.' + m[1]}=", message)


def trainer_arguments(cfg: LaunchConfig, cuda: bool, whole_step: bool = False) -> TarpoConfig:
    """The run's :class:`tarpo.config.TarpoConfig`, built from ``cfg.trainer`` alone; an invalid field is reported
    under the launcher variable that sets it, as are a BACKEND that is not installed and a REPORT_TO integration
    that cannot start. bf16 without ``cuda`` trains with ``use_cpu``.

    ``whole_step``: in the process that starts the run's processes (which trains nothing), TRL's batch checks
    see the whole step's completions, as they will across NUM_PROCESSES processes. Building it writes no file.
    """
    t = dict(cfg.trainer)
    if whole_step:
        t["per_device_train_batch_size"] *= cfg.num_processes
    if t["bf16"] and not cuda:
        t["use_cpu"] = True
    try:
        args = TarpoConfig(**t)
        loading.resolve_backend(cfg.backend)
    except ValueError as exc:
        raise ValueError(in_launcher_words(str(exc), cfg)) from None
    try:  # the callbacks the Trainer will make: one whose package is not installed raises here, not there
        for callback in get_reporting_integration_callbacks(args.report_to):
            callback()
    except (ValueError, RuntimeError, ImportError) as exc:
        raise ValueError(f"REPORT_TO={cfg.trainer['report_to']!r}: {exc}") from None
    return args


def planned_run(cfg: LaunchConfig, args: TarpoConfig, hidden_size: int) -> mp.Run:
    """What moves the run's memory, as ``args`` (the validated configuration) will train: the GPU's engine, the
    backend, the optimizer it resolved to (8-bit moments only where bitsandbytes runs), the soft input's
    parameters and records, the precision the launcher asked for."""
    soft = soft_input_class(args.rule.soft_input)
    return mp.Run(rows=cfg.trainer["per_device_train_batch_size"], prompt=args.max_prompt_length,
                  completion=args.max_completion_length,
                  engine=engine_for(args.rollout_engine, True, "ENGINE"),  # the GPU's engine
                  backend=loading.resolve_backend(cfg.backend), soft_top_k=args.soft_top_k,
                  full_mix=soft.full_mixture(args), router=args.rule.router,
                  soft_params=soft.trained_elements(hidden_size),
                  optim_8bit="8bit" in str(getattr(args.optim, "value", args.optim)), chunk=args.logprob_chunk_size,
                  full_kl=args.token_kl == "full", checkpointing=args.gradient_checkpointing,
                  weight_bytes=2 if args.bf16 else 4, shards=cfg.num_processes if cfg.sharding else 1)


def too_large(cfg: LaunchConfig, p: dict, usable_gib: float, gpu_gib: float) -> str:
    """The refusal of a run whose plan ``p`` does not fit: what it needs, and what to change."""
    requested = cfg.micro_batch
    at = f"MICRO_BATCH={requested}" if requested else "micro-batch 1"
    change = ("set a smaller MICRO_BATCH (or leave it empty to pick one), or lower BATCH, "
              "MAX_COMPLETION_LENGTH or MODEL") if requested else "lower BATCH, MAX_COMPLETION_LENGTH or MODEL"
    if cfg.sharding:
        change = (f"raise NUM_PROCESSES (now {cfg.num_processes}; FSDP2 shares the weights and the "
                  f"rollout's rows among the processes, over several machines with NUM_MACHINES), or {change}")
    elif cfg.num_processes == 1:
        change += ", or shard the model over several GPUs (ACCELERATE_CONFIG=configs/fsdp2.yaml NUM_PROCESSES=8)"
    return (f"{'MICRO_BATCH' if requested else 'BATCH'}: the run needs {p['peak_gib']:.1f} GiB at {at} (rollout "
            f"{p['rollout_gib']:.1f}, training {p['train_gib']:.1f}), more than the {usable_gib} GiB usable of this "
            f"{gpu_gib} GiB GPU: {change} (docs/memory-plan.md)")


def plan_memory(cfg: LaunchConfig, args: TarpoConfig, cuda: bool) -> LaunchConfig:
    """Plan the run's GPU memory before anything loads, from ``args`` (:func:`trainer_arguments`), and train in
    the micro-batch it picks: the largest divisor of the per-process batch whose peak fits the GPU (or
    MICRO_BATCH), with ``BATCH / NUM_PROCESSES / micro-batch`` gradient-accumulation steps. Without CUDA the plan
    is for an 80 GB GPU; it refuses a run only where it targets a GPU (CUDA, or ``DRY_RUN=1``): a CPU run of a
    tiny model is told the plan, never stopped by it. Returns ``cfg`` with its ``memory_plan`` and the trainer's
    batch fields; the run folder keeps its BATCH name."""
    per_process, requested = cfg.trainer["per_device_train_batch_size"], cfg.micro_batch
    config = mp.model_config(cfg.model, cfg.preset)
    if config is None:
        result = {"skipped": f"no config.json for {cfg.model} offline (not a preset, a local folder or in the "
                             "hub cache): memory not planned", "micro_batch": requested or per_process}
    else:
        shapes = mp.shapes_of(config, args.lora_target_modules, args.lora_r)
        run = planned_run(cfg, args, shapes.hidden)
        total = torch.cuda.mem_get_info()[1] if cuda else mp.GPU_80GB
        usable = mp.usable_bytes(total)
        run = replace(run, decode_merge=mp.choose_decode_merge(shapes, run, usable, args.decode_merge))
        p = mp.choose_micro_batch(shapes, run, per_process, usable, requested)
        result = {**{k: round(v, 2) for k, v in p.items() if k.endswith("_gib")}, "micro_batch": p["micro_batch"],
                  "decode_merge": run.decode_merge, "gpu_gib": round(total / mp.GIB, 2),
                  "usable_gib": round(usable / mp.GIB, 2),
                  "gpu": torch.cuda.get_device_name() if cuda else "none: planned for an 80 GB GPU",
                  "engine": run.engine, "backend": run.backend, "shards": run.shards, "fits": p["fits"]}
        if not p["fits"] and (cuda or cfg.dry_run):
            raise ValueError(too_large(cfg, p, result["usable_gib"], result["gpu_gib"]))
    micro = result["micro_batch"]
    steps = per_process // micro
    chosen = {"decode_merge": result["decode_merge"]} if "decode_merge" in result else {}
    return replace(cfg.with_trainer(per_device_train_batch_size=micro, gradient_accumulation_steps=steps, **chosen),
                   memory_plan={**result, "gradient_accumulation_steps": steps})
