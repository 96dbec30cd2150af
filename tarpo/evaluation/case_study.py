"""Case studies (``tarpo case``): an HTML page of sampled completions for chosen questions.

Each question gets ``n`` samples (one group) from the rollout engine in an inference mode; each
sample shows its training reward (the format rule of docs/algorithm.md §6) and its group-relative
advantage, computed as the trainer computes it (:func:`tarpo.training.advantages.group_advantages`,
docs/algorithm.md §2). Soft steps are highlighted, the stronger the higher the router's soft
probability; hovering a soft step shows the top-k tokens of its mixture and their weights.
"""

from __future__ import annotations

import html
import os

import torch

from ..engine.tagging import token_text_fn
from ..tasks.graders import grade_batch
from ..tasks.registry import TASKS, load_task
from ..training.advantages import group_advantages
from .sample import sample
from .system import RUN_FLAGS, check_system, fill_run_settings, load_system, rollout_spec

STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto}
.q{margin-top:2em;border-top:2px solid #444}.s{margin:1em 0;padding:.5em;border:1px solid #ccc}
.t{font-family:monospace;white-space:pre-wrap}.soft{border-radius:3px;cursor:help}
.meta{color:#555;font-size:90%}"""


def render_sample(rec: dict, token_text, top: int = 5) -> str:
    """One completion as HTML: soft steps in ``<span class="soft">`` with the mixture in ``title``.

    >>> rec = {"tokens": [1, 2], "actions": "s-", "p_soft": [0.8, 0.0], "soft_top": [[[1, 0.75], [3, 0.25]], None]}
    >>> render_sample(rec, {1: "a", 2: "<b>", 3: "c"}.__getitem__)
    '<span class="soft" style="background:rgba(255,140,0,0.80)" title="a 0.750 | c 0.250">a</span>&lt;b&gt;'
    """
    out = []
    for j, tok in enumerate(rec["tokens"]):
        text = html.escape(token_text(tok))
        if rec["actions"][j] == "s":
            mix = " | ".join(f"{token_text(i)} {w:.3f}" for i, w in (rec["soft_top"][j] or [])[:top])
            alpha = max(rec["p_soft"][j], 0.25)
            out.append(f'<span class="soft" style="background:rgba(255,140,0,{alpha:.2f})" '
                       f'title="{html.escape(mix, quote=True)}">{text}</span>')
        else:
            out.append(text)
    return "".join(out)


def page(title: str, questions: list[tuple[dict, list[dict]]], token_text) -> str:
    """The whole page: one section per question, its samples with reward, advantage, units and soft steps."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for ex, recs in questions:
        body.append(f'<div class="q"><h2>{html.escape(str(ex["id"]))}</h2>'
                    f'<p class="t">{html.escape(ex["prompt"][-1]["content"])}</p>'
                    f'<p class="meta">gold: {html.escape(str(ex["gold"]))}</p>')
        for r in recs:
            body.append(f'<div class="s"><p class="meta">sample {r["sample"]}: reward {r["reward"]:.0f}, '
                        f'advantage {r["advantage"]:+.3f}, units {r["units"]}, soft steps {r["soft_steps"]}</p>'
                        f'<div class="t">{render_sample(r, token_text)}</div></div>')
        body.append("</div>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


def case_study(args) -> str:
    """The page of ``tarpo case`` for the namespace of its flags (``model``, ``adapter``, ``mode``,
    ``task``, ``data_dir``, ``ids``, ``n``, ``temperature``, ``soft_top_k``, the routing rule's settings of
    :data:`tarpo.evaluation.system.RUN_FLAGS` (None: the run's), ``max_new_tokens``, ``seed``): the system, its
    run's settings and the questions are checked before the model loads."""
    check_system(args.adapter, args.mode)
    fill_run_settings(args)
    examples = list(load_task(args.task, args.data_dir and os.path.join(args.data_dir, args.task)))
    by_id = {str(ex["id"]): ex for ex in examples}
    wanted = [i.strip() for i in args.ids.split(",") if i.strip()]
    missing = [i for i in wanted if i not in by_id]
    if missing or not wanted:
        raise ValueError(f"--ids: no question {', '.join(missing) or '(none)'} in {args.task}")
    if args.n < 2:
        raise ValueError("--n must be >= 2 (advantages are relative to the group)")
    system = load_system(args.model, args.adapter, args.mode)
    prompt_len, new_tokens = TASKS[args.task].eval_lengths
    spec = rollout_spec({"max_new_tokens": args.max_new_tokens or new_tokens, "temperature": args.temperature,
                         "soft_top_k": args.soft_top_k, **{name: getattr(args, name) for name in RUN_FLAGS}})
    generator = torch.Generator(system.device).manual_seed(args.seed)
    chosen = [by_id[i] for i in wanted]
    recs = sample(system, chosen, args.n, spec, max_prompt_length=prompt_len, batch_size=len(chosen) * args.n,
                  generator=generator, soft_detail=10)
    grades = grade_batch([r["completion"] for r in recs], [by_id[r["id"]] for r in recs], reward=True)
    rewards = torch.tensor([g.score for g in grades])
    adv = group_advantages(rewards, args.n)
    for r, g, a in zip(recs, grades, adv.tolist()):
        r.update(reward=g.score, advantage=a)
    groups = [(ex, [r for r in recs if r["id"] == ex["id"]]) for ex in chosen]
    return page(f"{args.task}: {args.mode} samples of {args.adapter or args.model}", groups,
                token_text_fn(system.tokenizer))
