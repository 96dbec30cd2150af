"""The launcher's variables: the :class:`tarpo.config.TarpoConfig` field each one sets and how its text is read
(:data:`VARIABLES`; the launcher's own settings, :data:`SETTINGS`; the names ``LORA_TARGETS`` takes,
:data:`LORA_TARGET_PRESETS`), and the rule that refuses a variable meant for the launcher but misspelt
(:func:`misspelt`). Nothing here imports torch or TRL. The paper's value of each variable per data set and model is
:mod:`tarpo.runs.presets`'s, whose :func:`tarpo.runs.presets.checked_variables` parses and checks a launch's variables
with these tables; the table a run prints of them is :mod:`tarpo.runs.launcher_values`'s.
"""

from __future__ import annotations

import difflib
import math

# LORA_TARGETS presets: "paper" = Table 6's query, key, value, dense; "all-linear" = the authors' released
# scripts (TARPO's tarpo_*.py and HRPO's hrpo_*.py), which also adapt the MLP projections
LORA_TARGET_PRESETS = {
    "paper": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "all-linear": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


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
# ---- names a user may try for a variable (refused by presets.resolve(), since the launcher ignores unknown names)
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
