"""The paper's runs as data: the one place where the launchers' defaults live (docs/algorithm.md §5).

A run is a data set preset (GSM8K, MATH, DAPO-Math-17k), a model preset and an algorithm;
:func:`resolve` merges them with user overrides into a :class:`tarpo.runs.launch_config.LaunchConfig`: the
keyword arguments of :class:`tarpo.config.TarpoConfig` plus the launcher's own settings. What each launcher
variable sets and how its text is read is :mod:`tarpo.runs.launch_variables`'s; :func:`checked_variables` parses and
checks a launch's variables with it before TRL is imported.

    >>> cfg = resolve("math", {})
    >>> cfg.model, cfg.trainer["action_bias"], cfg.trainer["num_generations"]
    ('Qwen/Qwen2.5-3B-Instruct', [2.2, 0.0], 8)
    >>> resolve("math", {"MODEL": "qwen2.5-7b"}).trainer["action_bias"]
    [4.6, 0.0]
"""

from __future__ import annotations

import os

from ..architectures import ARCHITECTURES
from ..atomic_files import check_writable_folder
from ..algorithms import ALGOS, MODES
from .launch_config import LaunchConfig
from .launch_variables import SETTINGS, VARIABLES, misspelt
from .processes import accelerate_settings, machines
from .paths import check_model, model_source

# ---- docs/algorithm.md §5, one row per data set: group size, completions per step, train lengths, evaluation
DATASETS = {
    "gsm8k": dict(task="gsm8k", num_generations=4, per_device_train_batch_size=32,
                  max_prompt_length=1024, max_completion_length=1024, eval_tasks=["gsm8k"]),
    "math": dict(task="math", num_generations=8, per_device_train_batch_size=64,
                 max_prompt_length=1024, max_completion_length=1024,
                 eval_tasks=["math", "amc23", "olympiadbench"]),  # MATH-500: the subset of the MATH run
    "dapo": dict(task="dapo", num_generations=8, per_device_train_batch_size=64,
                 max_prompt_length=1024, max_completion_length=2048,
                 eval_tasks=["gpqa_diamond", "arc_challenge", "humaneval"]),
    # not the paper's: the CPU testbed's synthetic arithmetic (tarpo.tasks.synthetic), the demo's sizes, which the
    # demo reads here; the learning check trains it through the launcher (tarpo.runs.learning_check)
    "arith": dict(task="arith", num_generations=8, per_device_train_batch_size=64,
                  max_prompt_length=256, max_completion_length=32, eval_tasks=["arith"]),
    # not the paper's: the real-model learning check's (docs/real-model.md): the same arithmetic, its format shown
    "arith_shots": dict(task="arith_shots", num_generations=4, per_device_train_batch_size=16,
                        max_prompt_length=256, max_completion_length=32, eval_tasks=["arith_shots"]),
    "arith_one": dict(task="arith_one", num_generations=4, per_device_train_batch_size=16,
                      max_prompt_length=256, max_completion_length=32, eval_tasks=["arith_one"]),
}

# ---- docs/algorithm.md §5, per model: router bias b0 and learning rates; ``config``: the architecture as the
# model's published config.json gives it (tarpo.architectures), for the memory plan (tarpo.engine.memory_plan)
MODELS = {
    "qwen2.5-1.5b": dict(hub_id="Qwen/Qwen2.5-1.5B-Instruct", action_bias=[4.6, 0.0], learning_rate=5e-6,
                         router_lr=1e-4, config=ARCHITECTURES["qwen2.5-1.5b"]),
    "qwen2.5-3b": dict(hub_id="Qwen/Qwen2.5-3B-Instruct", action_bias=[2.2, 0.0], learning_rate=5e-6,
                       router_lr=1e-4, config=ARCHITECTURES["qwen2.5-3b"]),
    "qwen2.5-7b": dict(hub_id="Qwen/Qwen2.5-7B-Instruct", action_bias=[4.6, 0.0], learning_rate=5e-6,
                       router_lr=1e-4, config=ARCHITECTURES["qwen2.5-7b"]),
    # beyond the paper (docs/several-gpus.md): the 7B's b0 and learning rates
    "qwen2.5-14b": dict(hub_id="Qwen/Qwen2.5-14B-Instruct", action_bias=[4.6, 0.0], learning_rate=5e-6,
                        router_lr=1e-4, config=ARCHITECTURES["qwen2.5-14b"]),
    "qwen2.5-32b": dict(hub_id="Qwen/Qwen2.5-32B-Instruct", action_bias=[4.6, 0.0], learning_rate=5e-6,
                        router_lr=1e-4, config=ARCHITECTURES["qwen2.5-32b"]),
    # beyond the paper: a small real model for CPUs (docs/real-model.md; ``python -m tarpo.models.offline
    # smollm2-135m`` makes it available without a hub). b0 the 3B's (p(soft) 0.10 at the start); the learning rates
    # the ones its learning check learned with (5e-4 both; 1e-3 collapsed GRPO, a router at 3e-3 drifted:
    # docs/real-model.md, "The settings, and why")
    "smollm2-135m": dict(hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", action_bias=[2.2, 0.0], learning_rate=5e-4,
                         router_lr=5e-4, config=ARCHITECTURES["smollm2-135m"]),
    "llama3.1-8b": dict(hub_id="meta-llama/Llama-3.1-8B-Instruct", action_bias=[4.6, 0.0], learning_rate=2e-6,
                        router_lr=2e-6, config=ARCHITECTURES["llama3.1-8b"]),
}
DEFAULT_MODEL = "qwen2.5-3b"
CPU_MAX_HOURS = 12.0  # without CUDA, a run estimated to take longer is refused (tarpo.runs.training_run)

# ---- docs/algorithm.md §5 values shared by all runs: TarpoConfig's defaults (the paper's; a model without a preset
# gets its b0 and the Qwen LRs), shown in every resolved configuration, and what the launchers set otherwise
COMMON_FIELDS = ("learning_rate", "router_lr", "action_bias", "num_train_epochs", "beta", "alpha_action_kl",
                 "lambda_act", "temperature", "action_temperature", "soft_top_k", "max_grad_norm", "weight_decay",
                 "adam_beta2", "lr_scheduler_type", "warmup_steps", "lora_r", "lora_alpha", "lora_target_modules",
                 "optim", "gradient_checkpointing", "logging_steps", "report_to",
                 # the loss variants and the mismatch correction (docs/algorithm.md §8): the paper's by default
                 "loss_type", "scale_rewards", "importance_sampling_level", "mask_truncated_completions", "epsilon",
                 "epsilon_high", "is_correction", "is_clip_min", "is_clip_max", "top_entropy_quantile")
# and a preemption's signals stop a launcher run with a checkpoint (tarpo.training.preemption)
LAUNCHER_SETTINGS = dict(bf16=True, seed=0, save_steps=100, save_on_signals=["SIGTERM", "SIGUSR1"])


def common(algo: str) -> dict:
    """The resolved configuration's start: COMMON_FIELDS and the ALGO's routing settings (docs/algorithm.md
    §3: each as its authors run it, which are TarpoConfig's defaults), then LAUNCHER_SETTINGS."""
    from ..config import default  # imports TRL: only once the settings are being resolved

    names = (*COMMON_FIELDS, *ALGOS[algo].settings)
    return {**{name: default(name) for name in names}, **LAUNCHER_SETTINGS}


def _parse(name, parser, raw):
    try:
        return parser(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None


def checked_variables(dataset: str, env: dict[str, str]) -> tuple[dict, dict, dict]:
    """``env``'s launcher variables checked and parsed, without importing torch or TRL: ``(env, settings,
    overrides)``, the set variables, the launcher's settings and TarpoConfig's fields they set. Raises
    ``ValueError`` naming the bad variable."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset {dataset!r}: known {', '.join(DATASETS)}")
    slips = misspelt(env)  # every one at once, before anything else is read
    if slips:
        unset = " ".join(f"-u {slip.split('=')[0]}" for slip in slips)
        raise ValueError("; ".join(slips) + " (scripts/launch.sh lists the variables; for another program's: "
                         f"env {unset} bash run_{dataset}.sh)")
    env = {k: v for k, v in env.items() if (k in VARIABLES or k in SETTINGS) and v != ""}
    s = {k: _parse(k, SETTINGS[k], v) for k, v in env.items() if k in SETTINGS}
    if s.get("BACKEND", "auto") not in ("auto", "hf", "unsloth"):
        raise ValueError(f"BACKEND={s['BACKEND']!r}: must be auto, hf or unsloth")
    algo = s.get("ALGO", "tarpo")
    if algo not in ALGOS:
        raise ValueError(f"ALGO={algo!r}: must be one of {', '.join(ALGOS)}")
    model_key = s.get("MODEL", DEFAULT_MODEL)
    check_model(model_key, MODELS.get(model_key.lower()), MODELS)
    for name in ("EVAL_N", "TRAIN_LIMIT", "EVAL_LIMIT", "NUM_PROCESSES", "MICRO_BATCH"):
        if name in s and s[name] < 1:
            raise ValueError(f"{name}={s[name]}: must be >= 1")
    if "CPU_MAX_HOURS" in s and s["CPU_MAX_HOURS"] <= 0:
        raise ValueError(f"CPU_MAX_HOURS={s['CPU_MAX_HOURS']}: must be > 0 (hours)")
    out_dir = s.get("OUT_DIR", "runs")
    check_writable_folder(out_dir, f"OUT_DIR={out_dir}")
    if "DATA_PATH" in s and not os.path.exists(s["DATA_PATH"]):
        raise ValueError(f"DATA_PATH={s['DATA_PATH']}: no such file or folder")
    if "EVAL_DATA_DIR" in s and not os.path.isdir(s["EVAL_DATA_DIR"]):
        raise ValueError(f"EVAL_DATA_DIR={s['EVAL_DATA_DIR']}: no such folder")
    # every variable is parsed before common() imports TRL: a mistyped value is refused at once
    overrides = {VARIABLES[k][0]: _parse(k, VARIABLES[k][1], v) for k, v in env.items() if k in VARIABLES}
    for name, why in (("MAX_STEPS", "leave it empty to train EPOCHS"),
                      ("SAVE_STEPS", "a checkpoint every SAVE_STEPS optimizer steps"),
                      ("BATCH", "completions per optimizer step"),  # TRL checks their arithmetic, not their sign
                      ("GROUP_SIZE", "completions per prompt")):
        if name in env and overrides[VARIABLES[name][0]] < 1:  # TRL reads MAX_STEPS <= 0 as "train EPOCHS"
            raise ValueError(f"{name}={overrides[VARIABLES[name][0]]}: must be >= 1 ({why})")
    return env, s, overrides


def trainer_settings(dataset: str, algo: str, preset: dict | None, overrides: dict) -> dict:
    """TarpoConfig's keyword arguments of a run: the algorithm's, the data set's and the model's presets, then the
    launcher's variables. TRL's own rules on them (a group of at least 2 completions, a step of whole groups) are
    TRL's config's to check (:func:`tarpo.runs.run_config.trainer_arguments` names the variables)."""
    data = DATASETS[dataset]
    trainer = {**common(algo), **{k: v for k, v in data.items() if k not in ("task", "eval_tasks")},
               **{k: v for k, v in (preset or {}).items() if k not in ("hub_id", "config")},
               "routing": ALGOS[algo].name}
    trainer.update(overrides)
    return trainer


def parallel_settings(s: dict, env: dict, trainer: dict) -> dict:
    """How the step's BATCH completions are shared: the processes (NUM_PROCESSES, else the ACCELERATE_CONFIG's),
    the machines, FSDP2 sharding and the per-process batch, checked (BATCH a multiple of the processes,
    MICRO_BATCH dividing a process's share). Sets ``trainer``'s per-process batch (and fp32 Adam under FSDP2
    unless OPTIM is set); returns LaunchConfig's fields of them."""
    batch = trainer["per_device_train_batch_size"]
    accelerate_config = s.get("ACCELERATE_CONFIG")
    configured, in_config, sharding = accelerate_settings(accelerate_config) if accelerate_config else (1, 1, None)
    processes = s.get("NUM_PROCESSES", configured)
    nodes = machines(s, processes, in_config)
    if sharding and s.get("BACKEND") == "unsloth":
        raise ValueError(f"BACKEND=unsloth: ACCELERATE_CONFIG={accelerate_config} shards the model with FSDP2, "
                         "which trains on transformers + PEFT: set BACKEND=hf or leave it empty")
    if sharding and "OPTIM" not in env:  # 8-bit states of sharded parameters: untested; fp32 Adam is sharded too
        trainer["optim"] = "adamw_torch"
    if batch % processes:
        raise ValueError(f"BATCH={batch}: the completions of a step are shared by NUM_PROCESSES={processes} "
                         "processes, so BATCH must be a multiple of it")
    trainer["per_device_train_batch_size"] = batch // processes
    micro = s.get("MICRO_BATCH")
    if micro is not None and (batch // processes) % micro:
        raise ValueError(f"MICRO_BATCH={micro}: must divide the completions each process trains per step, "
                         f"BATCH/NUM_PROCESSES = {batch}/{processes} = {batch // processes}")
    return dict(num_processes=processes, accelerate_config=accelerate_config, sharding=sharding, micro_batch=micro,
                backend="hf" if sharding else s.get("BACKEND", "auto"), **nodes)


def run_name(dataset: str, model_key: str, preset: dict | None, algo: str, trainer: dict, batch: int) -> str:
    """The run folder's default name (RUN_NAME): data set, model, algorithm and the settings that tell runs apart.

    >>> run_name("math", "qwen2.5-3b", {}, "tarpo", dict(num_generations=8, learning_rate=5e-6, beta=0.005,
    ...          action_bias=[2.2, 0.0], seed=0), 64)
    'math-qwen2.5-3b-tarpo-g8-bs64-lr5e-06-beta0.005-b02.2-s0'
    """
    short = model_key.lower() if preset is not None else os.path.basename(os.path.normpath(model_key))
    return (f"{dataset}-{short}-{algo}-g{trainer['num_generations']}-bs{batch}-lr{trainer['learning_rate']:g}"
            f"-beta{trainer['beta']:g}-b0{trainer['action_bias'][0]:g}-s{trainer['seed']}")


def resolve(dataset: str, env: dict[str, str]) -> LaunchConfig:
    """The full configuration of a launcher run; ``env`` maps variable names to strings
    (empty or absent = the preset). Raises ``ValueError`` naming the bad variable."""
    env, s, overrides = checked_variables(dataset, env)
    algo, model_key = s.get("ALGO", "tarpo"), s.get("MODEL", DEFAULT_MODEL)
    preset, data = MODELS.get(model_key.lower()), DATASETS[dataset]
    trainer = trainer_settings(dataset, algo, preset, overrides)
    batch = trainer["per_device_train_batch_size"]  # BATCH: the completions of a step, every process together
    parallel = parallel_settings(s, env, trainer)
    out = os.path.join(s.get("OUT_DIR", "runs"), s.get("RUN_NAME") or run_name(dataset, model_key, preset, algo,
                                                                               trainer, batch))
    trainer["output_dir"] = out
    model = model_source(model_key, preset)
    return LaunchConfig(
        dataset=dataset, task=data["task"], algo=algo, system=ALGOS[algo].system, model=model,
        model_name=os.path.basename(model.rstrip("/")), run_dir=out, preset=model_key.lower() if preset else None,
        data_path=s.get("DATA_PATH"), train_limit=s.get("TRAIN_LIMIT"), eval=s.get("EVAL", False),
        eval_tasks=data["eval_tasks"], eval_mode=ALGOS[algo].eval_mode,
        eval_n=s.get("EVAL_N", MODES[ALGOS[algo].eval_mode].samples), eval_limit=s.get("EVAL_LIMIT"),
        eval_data_dir=s.get("EVAL_DATA_DIR"), dry_run=s.get("DRY_RUN", False),
        cpu_max_hours=s.get("CPU_MAX_HOURS", CPU_MAX_HOURS), bf16_set="BF16" in env, trainer=trainer, **parallel)
