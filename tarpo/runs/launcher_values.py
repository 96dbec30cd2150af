"""The values the launchers show: every setting the paper fixes for a data set, written into ``run_<data>.sh`` as shell
variables, and the table a run prints of what it uses, in the launcher's words (docs/design-notes.md, "Launchers and
baselines").

One owner: :mod:`tarpo.runs.presets` (and ``TarpoConfig``'s defaults, which it reads). ``python
scripts/write_launchers.py`` writes from it (:mod:`tarpo.runs.launcher_writer`) the block of each launcher and
``tarpo/resources/launcher_values.json``, the paper's value of each variable per data set and model, which a run reads
here without importing torch or TRL (this module is the run-time part: the table a run prints, the sources of its
values); ``tests/test_launcher_values.py`` fails when either differs from what the presets give.

A launcher records which variables came from the environment (``TARPO_FROM_ENVIRONMENT``) before it fills in its
values; :func:`sources` then tells, for each variable, whether its value is the paper's for this data set and model,
the launcher file's (an edit) or the environment's (which wins). A value the launcher filled in that is the paper's is
passed on as if unset (:func:`as_set`), so that what depends on whether a setting was set (``BF16`` on a CPU,
``OPTIM`` under FSDP2) is as before.
"""

from __future__ import annotations

import json
import os

RESOURCE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "resources", "launcher_values.json")
FROM_ENVIRONMENT = "TARPO_FROM_ENVIRONMENT"  # the launcher's list of the variables the environment set
MODEL_VARIABLES = ("ACTION_BIAS", "LR", "ROUTER_LR")  # what the paper gives per model (Table 6): the case block

# the launcher block: each variable and what it means (where the paper fixes it); MODEL and ALGO come first
BLOCK = {
    "MODEL": "a preset (scripts/launch.sh lists them), a hub id or a local folder",
    "ALGO": "tarpo, or a baseline (scripts/launch.sh lists them)",
    "ACTION_BIAS": "router bias b0 = hard,soft: soft ~10% of steps at 2.2, ~1% at 4.6 (Table 6)",
    "LR": "LoRA learning rate (Table 6)",
    "ROUTER_LR": "router learning rate (Table 6)",
    "GROUP_SIZE": "G, completions per prompt (Table 6)",
    "BATCH": "completions per optimizer step, all processes together (Table 6)",
    "MAX_PROMPT_LENGTH": "prompt tokens, cut from the left beyond (Table 7)",
    "MAX_COMPLETION_LENGTH": "generated units, hard + soft (Table 7)",
    "TEMPERATURE": "T_s: sampling temperature, log-probs taken at it (Table 6)",
    "SOFT_TOP_K": "k of the soft mixture of top-k token embeddings (Table 6)",
    "ACTION_TEMPERATURE": "tau_a of the router's softmax (Table 6)",
    "BETA": "beta: weight of the KL term (Table 6)",
    "ALPHA": "alpha: weight of the router's KL inside it (Table 6)",
    "LAMBDA": "lambda: weight of the router's term (Eq. 5; value: docs/algorithm.md §2)",
    "LORA_R": "LoRA rank (Table 6)",
    "LORA_ALPHA": "LoRA alpha (Table 6)",
    "LORA_TARGETS": "paper: q, k, v, o (Table 6) | all-linear: + gate, up, down (released scripts)",
    "OPTIM": "8-bit AdamW, paged on a GPU (docs/algorithm.md §4)",
    "LR_SCHEDULE": "learning-rate schedule (Table 6)",
    "WARMUP": "linear warm-up, a fraction of the steps if < 1 (Table 6)",
    "WEIGHT_DECAY": "AdamW weight decay (Table 6)",
    "MAX_GRAD_NORM": "gradient clipping norm (Table 6)",
    "EPOCHS": "epochs over the training set (Table 6)",
    "BF16": "1: bfloat16 weights and compute (a CPU run trains in fp32 unless set)",
    "GRAD_CHECKPOINTING": "1: recompute activations in the backward pass",
    "SEED": "seed of sampling, LoRA init and data order",
    "SAVE_STEPS": "a checkpoint every N optimizer steps",
    "EVAL": "1: evaluate after training on the data set's benchmarks (32 samples a question)",
}


def _parsers() -> dict:
    from .launch_variables import SETTINGS, VARIABLES
    return {**{k: parser for k, (_, parser) in VARIABLES.items()}, **SETTINGS}


def same(name: str, a: str, b: str) -> bool:
    """Whether two texts of variable ``name`` mean the same value (``5e-6`` and ``5e-06``, ``paper`` and the four
    names).

    >>> same("LR", "5e-6", "5e-06"), same("LORA_TARGETS", "paper", "q_proj,k_proj,v_proj,o_proj")
    (True, True)
    >>> same("BETA", "1", "2")
    False
    """
    parser = _parsers()[name]
    try:
        return parser(a) == parser(b)
    except ValueError:
        return a == b


def paper_values(dataset: str, model: str) -> dict[str, str]:
    """The paper's value of each launcher variable for ``dataset`` and ``model`` (a preset name, else a model
    without one), as the launcher writes it; read from :data:`RESOURCE`, no torch."""
    with open(RESOURCE) as f:
        values = json.load(f)[dataset]
    models = values.pop("models")
    return {**values, **models.get(model.lower(), models["*"])}


def sources(dataset: str, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(variable, value, source)`` of every launcher variable set in ``env``: the paper's value for this data set
    and model, the launcher file's (``run_<data>.sh``: edited), or the environment's. Without the launcher's record of
    what the environment set (a direct ``python -m tarpo.runs.launch``), every value is the environment's."""
    from .launch_variables import SETTINGS, VARIABLES
    from .presets import DEFAULT_MODEL

    recorded = env.get(FROM_ENVIRONMENT)
    from_env = set(recorded.split()) if recorded is not None and dataset in LAUNCHED_DATA_SETS else None
    paper = paper_values(dataset, env.get("MODEL") or DEFAULT_MODEL) if from_env is not None else {}
    rows = []
    for name in [*BLOCK, *sorted(n for n in env if n not in BLOCK and (n in VARIABLES or n in SETTINGS))]:
        value = env.get(name, "")
        if value == "":
            continue
        if from_env is None or name in from_env or name not in BLOCK:
            where = "environment"
        elif same(name, value, paper[name]):
            where = f"paper ({dataset}, {env.get('MODEL') or DEFAULT_MODEL})"
        else:
            where = f"run_{dataset}.sh (paper: {paper[name]})"
        rows.append((name, value, where))
    return rows


def as_set(dataset: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` less the values the launcher filled in that are the paper's: what the user set (the environment, or
    an edit of the launcher file)."""
    drop = {name for name, _, where in sources(dataset, env) if where.startswith("paper")}
    return {k: v for k, v in env.items() if k not in drop}


def table(rows) -> str:
    """The launcher variables a run uses: each one set by hand (the environment, an edit of the launcher) on a line
    with where it came from, then the paper's, a few to a line.

    >>> print(table([("MODEL", "qwen2.5-3b", "paper (math, qwen2.5-3b)"), ("BETA", "0.01", "environment"),
    ...              ("LR", "1e-6", "run_math.sh (paper: 5e-06)"), ("GROUP_SIZE", "8", "paper (math, qwen2.5-3b)")]))
    launcher variables (scripts/launch.sh lists all):
      BETA = 0.01   environment
      LR   = 1e-6   run_math.sh (paper: 5e-06)
      paper (math, qwen2.5-3b): MODEL=qwen2.5-3b GROUP_SIZE=8
    """
    own = [(n, v, w) for n, v, w in rows if not w.startswith("paper")]
    wide, value = max((len(n) for n, _, _ in own), default=0), max((len(v) for _, v, _ in own), default=0)
    lines = ["launcher variables (scripts/launch.sh lists all):",
             *(f"  {n:<{wide}} = {v:<{value}}   {w}" for n, v, w in own)]
    paper = [(w, f"{n}={v}") for n, v, w in rows if w.startswith("paper")]
    if paper:
        words, line = [f"{paper[0][0]}:"] + [text for _, text in paper], " "
        for word in words:
            if len(line) + len(word) > 116:
                lines.append(line.rstrip())
                line = "   "
            line += " " + word
        lines.append(line.rstrip())
    return "\n".join(lines)


LAUNCHED_DATA_SETS = ("gsm8k", "math", "dapo")  # the paper's, one launcher each (arith: the learning check's)


def render(name: str, value) -> str:
    """A setting's value as the launcher writes it.

    >>> render("ACTION_BIAS", [2.2, 0.0]), render("LR", 5e-06), render("BF16", True), render("EPOCHS", 1.0)
    ('2.2,0', '5e-06', '1', '1')
    >>> render("LORA_TARGETS", ["q_proj", "k_proj", "v_proj", "o_proj"])
    'paper'
    """
    from .launch_variables import LORA_TARGET_PRESETS
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (list, tuple)):
        named = [k for k, v in LORA_TARGET_PRESETS.items() if list(v) == list(value)]
        return named[0] if named else ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)
