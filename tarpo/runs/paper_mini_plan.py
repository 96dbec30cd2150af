"""What :mod:`tarpo.runs.paper_mini` runs: the systems, the figures' runs and the jobs (:func:`plan`), each a launcher
run or a ``tarpo eval`` with the folder it writes and the file that marks it complete (docs/paper-mini.md)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ..algorithms import ALGOS
from .learning_check import REAL_MODELS, REAL_TASK, real_model_variables

EVAL_TASKS = (REAL_TASK, "arith_two")
TRAINED = ("grpo", "grpo_pure_latent", "grpo_entropy", "hrpo", "soft_tokens", "tarpo")
TRAINING_FREE = (("CoT", "cot"), ("Pure Latent", "pure_latent"), ("Entropy-Routed", "entropy"))
HARD_INFERENCE = "TARPO (hard inference)"
# the §5.4 figures' runs (first seed): TARPO's b0 without action KL (BETA 0 turns it off: alpha sits inside beta's
# term; b0 2.2 is the main TARPO run), and the action KL on / off at b0 2.2 with beta > 0
B0_VALUES = (1.1, 2.2, 4.6)
KL_BETA = "0.04"
FIGURE_RUNS = {f"tarpo-b0={b}": {"ACTION_BIAS": f"{b},0"} for b in B0_VALUES if b != 2.2}
FIGURE_RUNS.update({f"tarpo-alpha={a}": {"BETA": KL_BETA, "ALPHA": a} for a in ("1", "0")})
PRIOR_SECONDS = {"train": 1300.0, "eval": 360.0}  # a job's time before one of its kind has finished (2-core CPU)


@dataclass(frozen=True)
class Settings:
    """What the command runs: built once from its flags (``tarpo.runs.paper_mini.settings_from``)."""

    model: str = "smollm2-135m"
    out: str = os.path.join("runs", "paper-mini")
    seeds: tuple = (0, 1, 2)
    steps: int = 30
    questions: int = 200
    n: int = 4
    slots: int = 2
    figures: bool = True


@dataclass
class Job:
    name: str            # train/<run> or eval/<label>: the folder under Settings.out
    kind: str            # train | eval
    command: list
    env: dict
    done_file: str       # present when the job is complete
    after: tuple = ()    # names of the jobs it needs finished
    seconds: float | None = field(default=None)  # how long it ran, once it has ended
    ok: bool = False     # it ended complete


def run_name(algo_or_figure: str, seed: int) -> str:
    return f"{algo_or_figure}-s{seed}"


def eval_label(system: str, seed: int | None) -> str:
    """The folder of a system's evaluation: its table label, filesystem-safe, with the seed of a trained one."""
    safe = system.replace(" ", "_").replace("/", "").replace("(", "").replace(")", "")
    return safe if seed is None else f"{safe}-s{seed}"


def plan(s: Settings) -> list[Job]:
    """Every job of the command, in the order they start: the first seed's trainings and evaluations, the
    training-free evaluations, the figures' runs, then the other seeds."""
    from .paths import model_source
    from .presets import MODELS

    source = model_source(s.model, MODELS.get(s.model))
    source = os.path.abspath(source) if os.path.isdir(source) else source
    train_dir = os.path.join(s.out, "train")

    def train(name, algo, seed, extra=None):
        env = {**real_model_variables(s.model, train_dir, algo, s.steps, seed), "RUN_NAME": name, "SAVE_STEPS": "10",
               **(extra or {})}
        return Job(f"train/{name}", "train", [sys.executable, "-m", "tarpo.runs.launch", REAL_TASK], env,
                   os.path.join(train_dir, name, "adapter", "final_state.json"))

    def evaluation(system, mode, seed, adapter_run=None):
        label = eval_label(system, seed if adapter_run else None)
        folder = os.path.join(s.out, "eval", label)
        command = [sys.executable, "-m", "tarpo.cli", "eval", "--model", source, "--tasks", ",".join(EVAL_TASKS),
                   "--limit", str(s.questions), "--n", str(s.n), "--mode", mode, "--system", system,
                   "--model-name", s.model, "--seed", str(seed), "--max-new-tokens",
                   REAL_MODELS[s.model]["MAX_COMPLETION_LENGTH"], "--out", folder]
        if adapter_run:
            command += ["--adapter", os.path.join(train_dir, adapter_run, "adapter")]
        return Job(f"eval/{label}", "eval", command, {"HF_HUB_OFFLINE": "1"},
                   os.path.join(folder, f"{EVAL_TASKS[-1]}.results.json"),
                   after=(f"train/{adapter_run}",) if adapter_run else ())

    jobs = []
    for i, seed in enumerate(s.seeds):
        for algo in TRAINED:
            jobs.append(train(run_name(algo, seed), algo, seed))
        for algo in TRAINED:
            rule = ALGOS[algo]
            jobs.append(evaluation(rule.system, rule.eval_mode, seed, run_name(algo, seed)))
        jobs.append(evaluation(HARD_INFERENCE, "hard", seed, run_name("tarpo", seed)))
        if i == 0:
            jobs += [evaluation(system, mode, seed) for system, mode in TRAINING_FREE]
            if s.figures:
                jobs += [train(run_name(name, seed), "tarpo", seed, extra) for name, extra in FIGURE_RUNS.items()]
    return jobs
