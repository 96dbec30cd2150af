"""The Markdown of :mod:`tarpo.runs.paper_mini`'s report (:func:`markdown`): Tables 1 and 5 in miniature with the
paper's cells beside them as the reference shape, the per-system figures, the comparisons, the trained runs and where
TARPO goes soft. Reads only the report's JSON (``paper_mini.json``), so it can render a copy anywhere.
"""

from __future__ import annotations

import json
from importlib import resources

from .paper_mini_plan import EVAL_TASKS, HARD_INFERENCE, TRAINING_FREE

ROWS = [name for name, _ in TRAINING_FREE] + ["GRPO", "GRPO w/ Pure Latent", "GRPO w/ Entropy Routing", "HRPO",
                                              "Soft Tokens", "TARPO", HARD_INFERENCE]
PAPER_MODEL, PAPER_COLUMNS = "Qwen2.5-1.5B-Instruct", ("gsm8k", "math")
PAPER_SYSTEM = {"Soft Tokens": None, HARD_INFERENCE: None}  # rows the paper has no 1.5B cell for


def paper_cells() -> dict:
    """{(system, benchmark, metric): value} of the paper's Qwen2.5-1.5B-Instruct rows of Tables 1 and 5."""
    text = resources.files("tarpo.resources").joinpath("paper_tables.json").read_text()
    return {(p["system"], p["benchmark"], p["metric"]): p["value"] for p in json.loads(text)["published"]
            if p["table"] in (1, 5) and p["model"] == PAPER_MODEL}


def _cell(stats, scale=100.0, digits=1) -> str:
    if not stats:
        return "–"
    sd = f" ± {stats['sd'] * scale:.{digits}f}" if stats.get("sd") is not None else ""
    return f"{stats['mean'] * scale:.{digits}f}{sd}"


def _f(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"


def markdown(summary: dict) -> str:
    systems, settings = summary["systems"], summary["settings"]
    n = settings["n"]
    paper = paper_cells()
    lines = [f"Settings: {settings['model']}, seeds {settings['seeds']}, {settings['steps']} RL steps, "
             f"{settings['questions']} held-out questions x {n} samples per column; {summary['jobs_done']} of "
             f"{summary['jobs']} jobs done.", "",
             "### Tables 1 and 5 in miniature", "",
             f"P@1 and P@{n} in percent (the evaluation grader: the last `####`, else the last number); R@1 the "
             "training reward's rule (exactly one `####` and the right number after it). Trained rows: mean ± the "
             "seeds' SD. The paper's columns: Qwen2.5-1.5B-Instruct (Tables 1 and 5), the shape to compare with.", "",
             "| system | " + " | ".join(f"{t} P@1 | {t} P@{n} | {t} R@1" for t in EVAL_TASKS)
             + " | paper GSM8K P@1 / P@32 | paper MATH P@1 / P@32 |",
             "|---|" + "---|" * (3 * len(EVAL_TASKS) + 2)]
    for row in ROWS:
        figs = systems.get(row, {})
        cells = []
        for t in EVAL_TASKS:
            f = figs.get(t, {})
            cells += [_cell(f.get("pass@1")), _cell(f.get("pass@n")), _cell(f.get("reward@1"))]
        name = PAPER_SYSTEM.get(row, row)
        ref = [" / ".join(_f(paper.get((name, b, m)), 2) for m in ("pass@1", "pass@32")) for b in PAPER_COLUMNS]
        lines.append(f"| {row} | " + " | ".join(cells) + " | " + " | ".join(ref) + " |")
    lines += ["", "### Per system", "",
              "| system | column | P@1 ± 95% (questions) | units (hard + soft) | soft ratio |",
              "|---|---|---|---|---|"]
    for row in ROWS:
        for t, f in systems.get(row, {}).items():
            lines.append(f"| {row} | {t} | {_f(f['pass@1']['mean'])} ± {_f(f['ci95'])} | "
                         f"{_cell(f['units'], 1.0, 1)} | {_cell(f['soft_ratio'], 1.0, 3)} |")
    lines += ["", "### Against the base and against GRPO", "",
              "Difference of pass@1 (mean over seeds), the seeds' SD of that difference, the 95% interval over "
              "questions of one difference; *beyond* when the difference is over twice the seeds' SD and over the "
              "questions' interval.", "",
              "| comparison | difference | seeds' SD | questions' 95% | beyond |", "|---|---|---|---|---|"]
    for name, c in summary["comparisons"].items():
        verdict = "one seed: not judged" if c["seeds_sd"] is None else "yes" if c["beyond"] else "no"
        lines.append(f"| {name} | {c['difference']:+.3f} | {_f(c['seeds_sd'])} | {_f(c['questions_ci95'])} | "
                     f"{verdict} |")
    lines += ["", "### Training runs", "",
              "| run | steps | reward first / last | rise ± 2 se (rho) | learns | p(soft) start / end | soft ratio | "
              "drift mean / step p99 (mean) / max | median step s (rollout s) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary["runs"].items():
        band = "" if r["rise_se"] is None else f" ± {2 * r['rise_se']:.3f} ({r['rise_rho']:.2f})"
        lines.append(f"| {name} | {r['steps']} | {_f(r['first'])} / {_f(r['last'])} | {_f(r['rise'])}{band} | "
                     f"{r['learns']} | {_f(r['p_soft_start'])} / {_f(r['p_soft_end'])} | {_f(r['soft_ratio'])} | "
                     f"{_g(r['logp_drift'])} / {_g(r['logp_drift_p99'])} / {_g(r['logp_drift_max'])} | "
                     f"{_f(r['step_s'], 1)} ({_f(r['rollout_s'], 1)}) |")
    if summary.get("where_soft"):
        lines += ["", "### Where TARPO goes soft (its evaluation on the trained column, every seed)", "",
                  "| token kind or position | decided steps | soft share | mean p(soft) |", "|---|---|---|---|"]
        for key, w in summary["where_soft"].items():
            lines.append(f"| {key} | {w['steps']} | {w['soft_share']:.3f} | {w['mean_p_soft']:.3f} |")
    return "\n".join(lines) + "\n"


def _g(v):
    return "–" if v is None else f"{v:.2g}"
