"""The learning check: does this machine's default training path learn? Two minutes on a GPU before a long run.

GRPO and TARPO are trained side by side (one process each) from the CPU demo's warm-started model on its
synthetic arithmetic, with the demo's hyper-parameters (:mod:`tarpo.runs.demo`), through the launchers' own
code path: ``python -m tarpo.runs.launch arith`` (the ``arith`` data-set preset of :mod:`tarpo.runs.presets`)
with the launcher's defaults for everything the demo does not set. On CUDA that is Unsloth (where installed), the
compiled rollout engine with CUDA graphs, bf16, the paged 8-bit AdamW and gradient checkpointing; on a CPU what
``auto`` picks there. Then, per algorithm, the reward curve and its rise
(:func:`tarpo.runs.learning_curves.summarize`).

    python -m tarpo.runs.learning_check                       # the warm start from runs/cache (made if missing)
    python -m tarpo.runs.learning_check --warm DIR --out runs/learning-check --steps 100
    BACKEND=hf ENGINE=eager python -m tarpo.runs.learning_check   # any launcher variable still applies

Each run's folder (``<out>/<algo>``) holds what a launcher run leaves (``metrics.jsonl``,
``launch_config.json`` with the memory plan, the adapter); its output is in ``<out>/<algo>.log``. The summary
goes to ``<out>/learning.json`` and is the last line printed, as one JSON object. Exit status 0 when every
algorithm learns (its rise is over twice its standard error widened for the dependence of consecutive steps:
:func:`tarpo.runs.learning_curves.learns`), 1 when one does not, 2 when a run failed or a
setting is bad. Killed (SIGTERM, SIGINT), it stops its runs and summarises the steps they logged.

**On a real model** (``--model smollm2-135m``, docs/real-model.md): no warm start; each run is
``python -m tarpo.runs.launch arith_one`` (one-operation arithmetic with its answer format shown by two worked
examples as earlier chat turns) with the settings of :data:`REAL_MODELS` (the model's preset for everything else),
and the base model and each trained system are evaluated before and after on ``--eval-questions`` held-out
questions with ``--eval-n`` samples each (``tarpo eval``; pass@1 with its 95% interval). An evaluation that fails,
or ends without a readable results file, is reported as failed in ``learning.json``, which is written all the same.
The output says the format was shown by
the prompt, the reward being the paper's.

Why a data-set preset and not a flag of the demo: the launcher's path is the thing checked (its presets,
memory plan, backend and engine choice, optimizer, checkpoints), so the check is a launcher run like any other,
and ``bash run_*.sh`` users read its ``metrics.jsonl`` as they read their own (docs/gpu-path.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from ..atomic_files import write_json_atomic
from .launch_variables import variable_of
from .learning_curves import report, summarize
from .side_by_side import kill_running, run_in_process, run_side_by_side

ALGOS = ("grpo", "tarpo")
# the real models' check (docs/real-model.md: the settings and why): the launcher variables beside
# MODEL, on the data-set preset REAL_TASK
REAL_TASK = "arith_one"
REAL_MODELS = {
    "smollm2-135m": dict(BATCH="32", GROUP_SIZE="4", MAX_COMPLETION_LENGTH="32", MAX_STEPS="30", LR="5e-4", BETA="0",
                         ROUTER_LR="5e-4", TEMPERATURE="1.0", LR_SCHEDULE="constant_with_warmup", LORA_R="16",
                         LORA_ALPHA="32", LORA_TARGETS="all-linear", GRAD_CHECKPOINTING="0", MICRO_BATCH="8"),
}
FORMAT = (f"the answer format shown by two worked examples as earlier chat turns (task {REAL_TASK}); the paper's "
          "reward")


def launcher_variables(demo_args, warm: str, out: str, algo: str) -> dict[str, str]:
    """The launcher variables of one run: the demo's RL settings (its flags and ``demo.RL_SETTINGS``) where they
    differ from the ``arith`` preset, which holds the demo's sizes. Everything else is the launcher's default.

    >>> from tarpo.runs import demo
    >>> v = launcher_variables(demo.parse_args([]), "/w", "/o", "tarpo")
    >>> v["LR"], v["ROUTER_LR"], v["ACTION_BIAS"], v["LORA_R"], v["MAX_STEPS"], v["RUN_NAME"]
    ('0.001', '0.005', '2.2,0', '16', '100', 'tarpo')
    """
    from . import demo
    from .launcher_values import render

    fields = {"learning_rate": demo_args.lr, "router_lr": demo_args.router_lr,
              "lr_scheduler_type": demo_args.lr_schedule, "temperature": demo_args.temperature,
              "num_generations": demo_args.group_size, "per_device_train_batch_size": demo_args.batch,
              "max_completion_length": demo_args.max_new_tokens, "max_steps": demo_args.steps,
              "seed": demo_args.seed, **demo.RL_SETTINGS}
    out_vars = {variable_of(name): render(variable_of(name), v) for name, v in fields.items()}
    return {**out_vars, "MODEL": warm, "ALGO": algo, "OUT_DIR": out, "RUN_NAME": algo, "EVAL": "0"}


def real_model_variables(model: str, out: str, algo: str, steps: int | None, seed: int = 0) -> dict[str, str]:
    """The launcher variables of one run of the real-model check (:data:`REAL_MODELS`)."""
    extra = {"MAX_STEPS": str(steps), "SEED": str(seed)} if steps else {"SEED": str(seed)}
    return {**REAL_MODELS[model], **extra, "MODEL": model, "ALGO": algo, "OUT_DIR": out, "RUN_NAME": algo,
            "EVAL": "0", "SAVE_STEPS": "1000"}


def evaluate_before_after(model: str, out: str, algos, questions: int, n: int) -> dict:
    """pass@1 and its 95% interval of the base model (CoT) and of each trained system (its own mode), each on the
    same ``questions`` held-out :data:`REAL_TASK` questions with ``n`` samples (``tarpo eval``), the systems side
    by side, each with its share of the cores."""
    from ..algorithms import ALGOS as ROUTINGS
    from .paths import model_source
    from .presets import MODELS

    source = model_source(model, MODELS.get(model))
    systems = {"base": ("cot", None), **{a: (ROUTINGS[a].eval_mode, os.path.join(out, a, "adapter")) for a in algos}}
    threads = str(max(1, (os.cpu_count() or 1) // len(systems)))
    started, procs, results = time.time(), {}, {}
    try:
        for name, (mode, adapter) in systems.items():
            command = [sys.executable, "-m", "tarpo.cli", "eval", "--model", source, "--tasks", REAL_TASK,
                       "--limit", str(questions), "--n", str(n), "--mode", mode, "--max-new-tokens",
                       REAL_MODELS[model]["MAX_COMPLETION_LENGTH"], "--out", os.path.join(out, f"eval-{name}")]
            procs[name] = subprocess.Popen(command + (["--adapter", adapter] if adapter else []),
                                           stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": threads})
        for name, proc in procs.items():  # "seconds": from the common start until this system's result was read
            mode = systems[name][0]
            if proc.wait() != 0:
                results[name] = {"mode": mode, "failed": f"tarpo eval exit {proc.returncode}"}
                continue
            path = os.path.join(out, f"eval-{name}", f"{REAL_TASK}.results.json")
            try:
                with open(path) as f:
                    metrics = json.load(f)["metrics"]
            except (OSError, ValueError, KeyError) as exc:  # exit 0 without its results: a failure all the same
                results[name] = {"mode": mode, "failed": f"tarpo eval exit 0 but {path} unreadable ({exc})"}
                continue
            results[name] = {"mode": mode, "pass@1": metrics["pass@1"], "ci95": metrics["accuracy_ci95"],
                             "soft_ratio": metrics["soft_ratio"], "seconds": round(time.time() - started, 1)}
    finally:  # an error or a signal here leaves no evaluation behind
        kill_running(procs)
    base = results["base"]
    for name in algos:  # the base's interval: pass@1 ± ci95 over its questions
        if "pass@1" in results[name] and "pass@1" in base:
            results[name]["above_base_interval"] = results[name]["pass@1"] > base["pass@1"] + base["ci95"]
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", help="the warm-started model folder (default: the demo's, made in --cache-dir if "
                                   "missing: about 3 minutes on a 2-core CPU)")
    ap.add_argument("--cache-dir", default=os.path.join("runs", "cache"))
    ap.add_argument("--out", default=None, help="default runs/learning-check-<time>")
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--steps", type=int, default=None, help="RL steps of each run (default: the demo's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=0,
                    help="0: one process per algorithm, side by side; 1: one after another in this process")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop the runs after this long and summarise what they logged")
    ap.add_argument("--model", choices=sorted(REAL_MODELS), help="a real model instead of the demo's warm start")
    ap.add_argument("--eval-questions", type=int, default=200, help="--model: held-out questions before and after")
    ap.add_argument("--eval-n", type=int, default=4, help="--model: samples per question")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from . import demo

    args = parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    demo_args = demo.parse_args(["--seed", str(args.seed), *(["--steps", str(args.steps)] if args.steps else [])])
    if not algos or any(a not in ALGOS for a in algos):
        print(f"learning check: --algos {args.algos!r}: choose from {', '.join(ALGOS)}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out or os.path.join("runs", time.strftime("learning-check-%Y%m%d-%H%M%S")))
    warm = args.warm
    if warm is not None and args.model:
        print("learning check: --warm and --model: a real model starts from its own weights", file=sys.stderr)
        return 2
    if warm is not None and not os.path.isfile(os.path.join(warm, "config.json")):
        print(f"learning check: --warm {warm}: no config.json there (a folder demo.warm_start wrote)", file=sys.stderr)
        return 2
    if any(os.path.exists(os.path.join(out, a)) for a in algos):
        print(f"learning check: --out {out}: holds runs already; choose a new folder", file=sys.stderr)
        return 2
    started = time.time()
    if args.model:
        dataset, source = REAL_TASK, args.model
        envs = {a: real_model_variables(args.model, out, a, args.steps, args.seed) for a in algos}
    else:
        if warm is None:
            warm = demo.warm_start(args.cache_dir, demo_args.sft_steps, demo_args.warm_seed, demo_args.sft_noise,
                                   batch_size=demo_args.sft_batch)
        dataset, source = "arith", os.path.abspath(warm)
        envs = {a: launcher_variables(demo_args, source, out, a) for a in algos}
    os.makedirs(out, exist_ok=True)
    print(f"learning check: {', '.join(algos)} for {envs[algos[0]]['MAX_STEPS']} steps from {source} into {out}"
          + (f"; {FORMAT}" if args.model else ""), flush=True)
    if args.processes == 1:
        status = run_in_process(envs, dataset)
    else:
        status = run_side_by_side(envs, out, None if args.max_seconds is None else started + args.max_seconds,
                                  dataset)
    results = {a: {**summarize(os.path.join(out, a)), "exit": status[a]} for a in algos}
    summary = {"learning": results, "warm": source, "seconds": round(time.time() - started, 1)}
    if args.model:
        summary["format"] = FORMAT
        if all(s == 0 for s in status.values()):
            summary["evaluation"] = evaluate_before_after(args.model, out, algos, args.eval_questions, args.eval_n)
            summary["seconds_with_evaluation"] = round(time.time() - started, 1)
    write_json_atomic(os.path.join(out, "learning.json"), summary)
    print(report(results, summary.get("evaluation")))
    print(json.dumps(summary), flush=True)
    if any(s not in (0, None) for s in status.values()):
        return 2
    return 0 if all(r["learns"] for r in results.values()) else 1


if __name__ == "__main__":
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    sys.exit(main())
