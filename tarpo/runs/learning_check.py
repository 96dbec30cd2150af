"""The learning check: does this machine's default training path learn? Two minutes on a GPU before a long run.

GRPO and TARPO are trained side by side (one process each) from the CPU demo's warm-started model on its
synthetic arithmetic, with the demo's hyper-parameters (:mod:`tarpo.runs.demo`), through the launchers' own
code path: ``python -m tarpo.runs.launch arith`` (the ``arith`` data-set preset of :mod:`tarpo.runs.presets`)
with the launcher's defaults for everything the demo does not set. On CUDA that is Unsloth (where installed), the
compiled rollout engine with CUDA graphs, bf16, the paged 8-bit AdamW and gradient checkpointing; on a CPU what
``auto`` picks there. Then, per algorithm, the reward curve and its rise (:func:`summarize`).

    python -m tarpo.runs.learning_check                       # the warm start from runs/cache (made if missing)
    python -m tarpo.runs.learning_check --warm DIR --out runs/learning-check --steps 100
    BACKEND=hf ENGINE=eager python -m tarpo.runs.learning_check   # any launcher variable still applies

Each run's folder (``<out>/<algo>``) holds what a launcher run leaves (``metrics.jsonl``,
``launch_config.json`` with the memory plan, the adapter); its output is in ``<out>/<algo>.log``. The summary
goes to ``<out>/learning.json`` and is the last line printed, as one JSON object. Exit status 0 when every
algorithm learns (its rise is over twice its standard error), 1 when one does not, 2 when a run failed or a
setting is bad. Killed (SIGTERM, SIGINT), it stops its runs and summarises the steps they logged.

**On a real model** (``--model smollm2-135m``, docs/real-model.md): no warm start; each run is
``python -m tarpo.runs.launch arith_shots`` (the arithmetic with its answer format shown by two worked examples as
earlier chat turns) with the settings of :data:`REAL_MODELS` (the model's preset for everything else), and the
base model and each trained system are evaluated before and after on ``--eval-questions`` held-out questions with
``--eval-n`` samples each (``tarpo eval``; pass@1 with its 95% interval). The output says the format was shown by
the prompt, the reward being the paper's.

Why a data-set preset and not a flag of the demo: the launcher's path is the thing checked (its presets,
memory plan, backend and engine choice, optimizer, checkpoints), so the check is a launcher run like any other,
and ``bash run_*.sh`` users read its ``metrics.jsonl`` as they read their own (docs/gpu-path.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

from ..atomic_files import write_json_atomic
from .presets import variable_of

ALGOS = ("grpo", "tarpo")
# the real models' check (docs/real-model.md: the settings and why): the launcher variables beside
# MODEL, on the data-set preset REAL_TASK
REAL_TASK = "arith_one"
REAL_MODELS = {
    "smollm2-135m": dict(BATCH="32", GROUP_SIZE="4", MAX_COMPLETION_LENGTH="32", MAX_STEPS="30", LR="5e-4", BETA="0",
                         ROUTER_LR="5e-4", TEMPERATURE="1.0", LR_SCHEDULE="constant_with_warmup", LORA_R="16",
                         LORA_ALPHA="32", LORA_TARGETS="all-linear", GRAD_CHECKPOINTING="0"),
}
FORMAT = (f"the answer format shown by two worked examples as earlier chat turns (task {REAL_TASK}); the paper's "
          "reward")
FIRST, LAST = 0.1, 0.2  # the shares of the steps whose mean reward is ``first`` and ``last``


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
            with open(os.path.join(out, f"eval-{name}", f"{REAL_TASK}.results.json")) as f:
                metrics = json.load(f)["metrics"]
            results[name] = {"mode": mode, "pass@1": metrics["pass@1"], "ci95": metrics["accuracy_ci95"],
                             "soft_ratio": metrics["soft_ratio"], "seconds": round(time.time() - started, 1)}
    finally:  # an error or a signal here leaves no evaluation behind
        _kill_running(procs)
    base = results["base"]
    for name in algos:  # the base's interval: pass@1 ± ci95 over its questions
        if "pass@1" in results[name] and "pass@1" in base:
            results[name]["above_base_interval"] = results[name]["pass@1"] > base["pass@1"] + base["ci95"]
    return results


def fitted_rise(values: list[float]) -> tuple[float, float | None]:
    """The least-squares line through ``values`` (one per step): its rise from the first step to the last (slope
    times ``len - 1``), and that rise's standard error (None under 3 values).

    Worked example: steps x = 0..3 and rewards y = 0, 0.2, 0.1, 0.3 give the slope
    sum((x - 1.5)(y - 0.15)) / sum((x - 1.5)^2) = 0.4 / 5 = 0.08, so a rise of 3 x 0.08 = 0.24; the residuals
    -0.03, 0.09, -0.09, 0.03 give the slope's standard error sqrt(0.018 / 2 / 5) = 0.0424, the rise's 0.127.

    >>> rise, se = fitted_rise([0.0, 0.2, 0.1, 0.3])
    >>> round(rise, 4), round(se, 4)
    (0.24, 0.1273)
    """
    n = len(values)
    if n < 2:
        return 0.0, None
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(values)) / sxx
    if n < 3:
        return slope * (n - 1), None
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in enumerate(values))
    return slope * (n - 1), math.sqrt(residual / (n - 2) / sxx) * (n - 1)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(run_dir: str) -> dict:
    """A run's learning figures from its ``metrics.jsonl`` (the steps logged so far; ``None`` where a figure
    needs more). ``curve``: the mean reward of each step; ``first`` / ``last``: the mean of the first 10% / the
    last 20% of the steps (steps 1-10 and 81-100 of 100); ``rise`` and ``rise_se``: :func:`fitted_rise` of the
    curve; ``learns``: ``rise`` over twice ``rise_se``. ``step_s``: the median step time after the first (which
    compiles); the soft ratio, the log-prob drift's mean and tails, and on CUDA the memory peaks."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if isinstance(row, dict) and "reward" in row:
                    rows.append(row)
    curve = [r["reward"] for r in rows]
    n = len(curve)
    rise, se = fitted_rise(curve) if n else (None, None)

    def column(key):
        return [r[key] for r in rows if r.get(key) is not None]

    def peak(key):
        return max(column(key), default=None)
    times = column("timing/step_s")
    return {"steps": n, "curve": [round(c, 4) for c in curve],
            "first": _mean(curve[:max(1, round(FIRST * n))]) if n else None,
            "last": _mean(curve[-max(1, round(LAST * n)):]) if n else None,
            "rise": rise, "rise_se": se, "learns": None if se is None else rise > 2 * se,
            "step_s": statistics.median(times[1:]) if len(times) > 1 else (times[0] if times else None),
            "first_step_s": times[0] if times else None, "rollout_s": _mean(column("timing/rollout_s")[1:]),
            "soft_ratio": _mean(column("soft_ratio")), "router_p_soft": _mean(column("router/p_soft")),
            "logp_drift": _mean(column("logp_drift")),
            "logp_drift_p99": _mean(column("logp_drift_p99")), "logp_drift_max": peak("logp_drift_max"),
            "logp_drift_frac_over_0.1": _mean(column("logp_drift_frac_over_0.1")),
            "peak_gib": peak("memory/peak_gib"), "reserved_gib": peak("memory/peak_reserved_gib"),
            "rollout_peak_gib": peak("memory/rollout_peak_gib")}


def run_side_by_side(envs: dict[str, dict], out: str, deadline: float | None, dataset: str = "arith"
                     ) -> dict[str, int | None]:
    """Start ``python -m tarpo.runs.launch <dataset>`` once per entry of ``envs`` (algo -> its variables), each with
    its share of the cores, and wait for all; stop the runs still going at ``deadline`` (``time.time()``) or when
    this process is sent SIGTERM/SIGINT. Returns each run's exit status: its own where it ended by itself (a crash
    stays a crash), None where this function stopped it."""
    threads = str(max(1, (os.cpu_count() or 1) // len(envs)))
    procs, logs, stopped = {}, [], set()
    try:
        for algo, variables in envs.items():
            logs.append(log := open(os.path.join(out, f"{algo}.log"), "w"))
            procs[algo] = subprocess.Popen([sys.executable, "-m", "tarpo.runs.launch", dataset], stdout=log,
                                           stderr=subprocess.STDOUT,
                                           env={**os.environ, "OMP_NUM_THREADS": threads, **variables})

        def stop(signum=None, _frame=None):
            for algo, p in procs.items():
                if p.poll() is None:
                    stopped.add(algo)
                    p.terminate()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while any(p.poll() is None for p in procs.values()):
                if deadline is not None and time.time() > deadline and not stopped:
                    print(f"learning check: --max-seconds reached, stopping {', '.join(procs)}", flush=True)
                    stop()
                time.sleep(0.5)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        _kill_running(procs)  # an error here leaves no run behind
        for log in logs:
            log.close()
    return {algo: None if algo in stopped else p.returncode for algo, p in procs.items()}


def _kill_running(procs: dict) -> None:
    """Kill and reap each of ``procs`` (name -> ``subprocess.Popen``) still running."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_in_process(envs: dict[str, dict], dataset: str = "arith") -> dict[str, int]:
    """The runs one after another in this process (``--processes 1``: tests, a one-core machine)."""
    from . import launch

    status = {}
    for algo, variables in envs.items():
        saved = {k: os.environ.get(k) for k in variables}
        os.environ.update(variables)
        try:
            status[algo] = launch.main([dataset])
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return status


def report(results: dict[str, dict], evaluation: dict | None = None) -> str:
    """A table of the runs' figures, then each reward curve as the means of tenths of the run; then the evaluation
    before and after, where there is one."""
    def f(v, digits=3):
        return "-" if v is None else f"{v:.{digits}f}"

    def g(v):
        return "-" if v is None else f"{v:.2g}"
    lines = ["| algo | steps | first | last | rise (± 2 se) | learns | step s (rollout s) | soft ratio "
             "| router p(soft) | drift mean / p99 / max |", "|---|---|---|---|---|---|---|---|---|---|"]
    for algo, s in results.items():
        band = "" if s["rise_se"] is None else f" ± {2 * s['rise_se']:.3f}"
        lines.append(f"| {algo} | {s['steps']} | {f(s['first'])} | {f(s['last'])} | {f(s['rise'])}{band} | "
                     f"{s['learns']} | {f(s['step_s'], 2)} ({f(s['rollout_s'], 2)}) | {f(s['soft_ratio'])} | "
                     f"{f(s.get('router_p_soft'))} | {g(s['logp_drift'])} / {g(s['logp_drift_p99'])} / "
                     f"{g(s['logp_drift_max'])} |")
    for algo, s in results.items():
        curve, size = s["curve"], max(1, len(s["curve"]) // 10)
        tenths = [sum(curve[i:i + size]) / len(curve[i:i + size]) for i in range(0, len(curve), size)]
        lines.append(f"{algo} reward, mean of each {size} steps: " + " ".join(f"{v:.3f}" for v in tenths))
    for name, e in (evaluation or {}).items():
        if "failed" in e:
            lines.append(f"evaluation {name} ({e['mode']}): {e['failed']}")
            continue
        above = "" if name == "base" else f", above the base's interval: {e.get('above_base_interval')}"
        lines.append(f"evaluation {name} ({e['mode']}): pass@1 {e['pass@1']:.3f} ± {e['ci95']:.3f}{above}")
    return "\n".join(lines)


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
    sys.exit(main())
