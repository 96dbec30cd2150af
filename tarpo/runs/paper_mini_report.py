"""The report of :mod:`tarpo.runs.paper_mini`: what its finished jobs show, as one JSON, Markdown tables and PNG
figures (docs/paper-mini.md explains each figure and statistic).

- **Per system and column**: pass@1 with its 95% interval over questions, pass@n, R@1 (pass@1 under the training
  reward's rule: exactly one ``####`` and the right number after it; P@1 is the evaluation grader's, which reads the
  last tag or else the last number), mean generated units (hard + soft, as the paper counts them), soft ratio; for
  trained systems each figure is the mean over seeds with the seeds' sample SD.
- **Per trained run**: the reward's rise and the learning criterion (:func:`tarpo.runs.learning_curves.summarize`),
  the router's p(soft) at the start (step 1) and the end (mean of the last 3 steps), the log-prob drift's tails, the
  step time.
- **Comparisons**: each trained system against the base (CoT) and against GRPO, per column: the mean difference of
  pass@1, the seeds' SD of that difference and the questions' 95% interval of one difference; "beyond" when the
  difference is over both twice the seeds' SD and the questions' interval.
- **Where TARPO goes soft**: from its evaluation trajectories, the soft share and mean p(soft) by the kind of the
  step's token and by its position in the completion.
- **The §5.4 figures**: soft ratio and reward over training for each b0, and the token entropy with the action KL on
  and off.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from ..algorithms import ALGOS
from ..atomic_files import atomic_path, write_json_atomic, write_text_atomic
from ..evaluation.plot import read_log
from .learning_curves import mean_present, summarize
from .paper_mini_plan import (B0_VALUES, EVAL_TASKS, FIGURE_RUNS, HARD_INFERENCE, TRAINED, TRAINING_FREE, eval_label,
                         run_name)

TAG = "####"
POSITIONS = ((1, 4), (5, 8), (9, 16), (17, 10**6))


def token_kind(text: str) -> str:
    """The kind of a step's token, for where the router goes soft.

    >>> [token_kind(t) for t in ("12", " 7", "+", "=", "####", " ", "The", "#")]
    ['digit', 'digit', 'operator', 'operator', 'tag', 'space', 'word', 'tag']
    """
    t = text.strip()
    if not t:
        return "space"
    if "#" in t:
        return "tag"
    if t.isdigit():
        return "digit"
    if all(c in "+-=*/" for c in t):
        return "operator"
    return "word"


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None,
            "seeds": len(values)}


def _read_eval(folder: str, task: str) -> dict | None:
    path = os.path.join(folder, f"{task}.results.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        res = json.load(f)
    m = res["metrics"]
    with open(os.path.join(folder, res["trajectories"])) as f:
        records = [json.loads(line) for line in f if line.strip()]
    by_q = {}
    for r in records:  # the training reward's rule: one tag, and the answer after it right
        by_q.setdefault(r["id"], []).append(float(r["score"]) if r["completion"].count(TAG) == 1 else 0.0)
    n_key = max((k for k in m if k.startswith("pass@")), key=lambda k: int(k.split("@")[1]))
    return {"pass@1": m["pass@1"], "ci95": m["accuracy_ci95"], "pass@n": m[n_key], "n": int(n_key.split("@")[1]),
            "reward@1": statistics.fmean(statistics.fmean(v) for v in by_q.values()), "units": m["units"],
            "soft_ratio": m["soft_ratio"], "questions": m["questions"], "records": records}


def _run_figures(run_dir: str) -> dict | None:
    if not os.path.isfile(os.path.join(run_dir, "adapter", "final_state.json")):
        return None
    rows = read_log(run_dir)
    p_soft = [r.get("router/p_soft") for r in rows]
    if not any(p_soft):  # no router (GRPO and the fixed routings log 0)
        p_soft = [None]
    s = summarize(run_dir)
    return {**{k: s[k] for k in ("steps", "curve", "first", "last", "rise", "rise_se", "rise_rho", "learns", "step_s",
                                 "rollout_s", "soft_ratio", "logp_drift", "logp_drift_p99", "logp_drift_max")},
            "p_soft_start": p_soft[0], "p_soft_end": mean_present(p_soft[-3:]),
            "entropy": [r.get("entropy") for r in rows], "soft_ratio_curve": [r.get("soft_ratio") for r in rows],
            "units_curve": [r.get("completions/mean_units") for r in rows]}


def where_soft(records: list[dict], decode) -> dict:
    """The soft share of TARPO's decided steps (``h``/``s`` actions) and their mean p(soft), by the kind of the step's
    token (:func:`token_kind`) and by its position in the completion (:data:`POSITIONS`)."""
    tally = {}
    for r in records:
        for j, (action, p, token) in enumerate(zip(r["actions"], r["p_soft"], r["tokens"])):
            if action not in "hs":
                continue
            low, high = next(b for b in POSITIONS if b[0] <= j + 1 <= b[1])
            for key in (("kind", token_kind(decode(token))), ("position", f"{low}-{high}" if high < 10**6
                                                             else f"{low}+")):
                t = tally.setdefault(key, [0, 0, 0.0])
                t[0], t[1], t[2] = t[0] + 1, t[1] + (action == "s"), t[2] + p
    return {f"{k}:{v}": {"steps": n, "soft_share": soft / n, "mean_p_soft": p / n}
            for (k, v), (n, soft, p) in sorted(tally.items())}


def token_decoder(model: str):
    """One token id -> its text, by the model's tokenizer."""
    from transformers import AutoTokenizer

    from .paths import model_source
    from .presets import MODELS
    tokenizer = AutoTokenizer.from_pretrained(model_source(model, MODELS.get(model)))
    return lambda token: tokenizer.decode([token])


def compare(per_seed: dict, reference: dict | float, ci_a: float, ci_b: float) -> dict:
    """A system's pass@1 against a reference's: ``per_seed`` {seed: value}, ``reference`` one value (the base) or
    {seed: value} (paired by seed).

    >>> c = compare({0: 0.5, 1: 0.6, 2: 0.55}, 0.3, 0.06, 0.05)
    >>> round(c["difference"], 3), round(c["seeds_sd"], 3), round(c["questions_ci95"], 3), c["beyond"]
    (0.25, 0.05, 0.078, True)
    """
    diffs = [v - (reference[s] if isinstance(reference, dict) else reference)
             for s, v in per_seed.items() if not isinstance(reference, dict) or s in reference]
    if not diffs:  # no seed of both (a reference evaluation failed or is still to run)
        return None
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else None
    ci = math.hypot(ci_a, ci_b)
    return {"difference": mean, "seeds_sd": sd, "questions_ci95": ci, "seeds": len(diffs),
            "beyond": sd is not None and abs(mean) > max(2 * sd, ci)}


def write_report(s, jobs) -> dict:
    """Read what the finished jobs wrote, write ``paper_mini.json``, ``tables.md`` and the figures into ``s.out``."""
    done = sum(os.path.isfile(j.done_file) for j in jobs)
    runs = {name: _run_figures(os.path.join(s.out, "train", name)) for name in
            [run_name(a, seed) for seed in s.seeds for a in TRAINED]
            + [run_name(f, s.seeds[0]) for f in FIGURE_RUNS]}
    runs = {k: v for k, v in runs.items() if v}
    systems = {}  # system label -> task -> {seed: eval figures}
    labels = [(name, None) for name, _ in TRAINING_FREE] + [(ALGOS[a].system, a) for a in TRAINED] + [
        (HARD_INFERENCE, "tarpo")]
    for system, algo in labels:
        for seed in (s.seeds if algo else s.seeds[:1]):
            folder = os.path.join(s.out, "eval", eval_label(system, seed if algo else None))
            for task in EVAL_TASKS:
                e = _read_eval(folder, task)
                if e:
                    systems.setdefault(system, {}).setdefault(task, {})[seed] = e
    summary = {"settings": {k: getattr(s, k) for k in ("model", "seeds", "steps", "questions", "n")},
               "jobs": len(jobs), "jobs_done": done, "runs": runs, "systems": {}, "comparisons": {}}
    for system, tasks in systems.items():
        summary["systems"][system] = {task: {
            **{k: _stats([e[k] for e in per_seed.values()]) for k in ("pass@1", "pass@n", "reward@1", "units",
                                                                      "soft_ratio")},
            "ci95": mean_present([e["ci95"] for e in per_seed.values()]), "n": next(iter(per_seed.values()))["n"],
            "per_seed": {seed: e["pass@1"] for seed, e in per_seed.items()}} for task, per_seed in tasks.items()}
    base, grpo = summary["systems"].get("CoT", {}), summary["systems"].get("GRPO", {})
    for system in [ALGOS[a].system for a in TRAINED] + [HARD_INFERENCE]:
        for task, fig in summary["systems"].get(system, {}).items():
            for ref_name, ref in (("CoT", base), ("GRPO", grpo)):
                if task in ref and system != ref_name and fig["per_seed"]:
                    r = ref[task]
                    reference = r["per_seed"] if ref_name == "GRPO" else r["pass@1"]["mean"]
                    c = compare(fig["per_seed"], reference, fig["ci95"], r["ci95"])
                    if c is not None:
                        summary["comparisons"][f"{system} vs {ref_name} on {task}"] = c
    tarpo_evals = systems.get("TARPO", {}).get(EVAL_TASKS[0], {})
    if tarpo_evals:
        records = [r for e in tarpo_evals.values() for r in e["records"]]
        summary["where_soft"] = where_soft(records, token_decoder(s.model))
    summary["figures"] = _figures(s.out, runs, s.seeds[0])
    write_json_atomic(os.path.join(s.out, "paper_mini.json"), summary)
    from .paper_mini_tables import markdown
    write_text_atomic(os.path.join(s.out, "tables.md"), markdown(summary))
    return summary


def _figures(out: str, runs: dict, seed: int) -> dict:
    """The §5.4 panels as PNG files with their data beside them (``figures.json``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b0_runs = {b: runs.get(run_name("tarpo" if b == 2.2 else f"tarpo-b0={b}", seed)) for b in B0_VALUES}
    kl_runs = {a: runs.get(run_name(f"tarpo-alpha={a}", seed)) for a in ("1", "0")}
    data = {"b0": {str(b): r and {"soft_ratio": r["soft_ratio_curve"], "reward": r["curve"]}
                   for b, r in b0_runs.items()},
            "action_kl": {a: r and {"entropy": r["entropy"]} for a, r in kl_runs.items()}}
    written = []
    b0 = data["b0"].items()
    panels = [("b0_soft_ratio.png", "soft ratio", [(f"b0=[{b}, 0]", d and d["soft_ratio"]) for b, d in b0]),
              ("b0_reward.png", "training reward", [(f"b0=[{b}, 0]", d and d["reward"]) for b, d in b0]),
              ("action_kl_entropy.png", "token entropy (nats)",
               [(f"alpha={a}", d and d["entropy"]) for a, d in data["action_kl"].items()])]
    for name, ylabel, lines in panels:
        lines = [(label, ys) for label, ys in lines if ys]
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        for label, ys in lines:
            ax.plot(range(1, len(ys) + 1), ys, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(os.path.join(out, name)) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)
        written.append(name)
    write_json_atomic(os.path.join(out, "figures.json"), data)
    return {"written": written, "data": "figures.json"}
