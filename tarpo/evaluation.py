"""Sampling and scoring a model on a task's examples with the hybrid rollout engine.

:func:`sample` decodes ``n`` samples per question (questions x samples batched through
:func:`tarpo.rollout.hybrid_generate`) and returns one record per sample;
:func:`summarize` turns graded records into the metrics of DESIGN §7.

Inference modes (DESIGN §3, §7): ``cot`` and ``hard`` (hard inputs throughout; ``hard`` is a
trained model forced to hard routing), ``pure_latent`` (soft at every thinking step),
``entropy`` (soft iff the token entropy exceeds the threshold), ``tarpo`` (the trained
router decides) and ``greedy`` (argmax tokens, hard inputs, one sample).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .backbone import Backbone
from .graders import grade_batch
from .metrics import mean_pass_at_k
from .rollout import RolloutSpec, hybrid_generate
from .tagging import token_piece_fn
from .trainer import encode_prompts

MODES = {"cot": "hard", "hard": "hard", "pure_latent": "soft", "entropy": "entropy", "tarpo": "learned",
         "greedy": "hard"}


def spec_for_mode(mode: str, spec: RolloutSpec) -> RolloutSpec:
    if mode not in MODES:
        raise ValueError(f"unknown inference mode {mode!r}; known: {', '.join(MODES)}")
    return replace(spec, routing=MODES[mode], greedy=mode == "greedy")


@torch.no_grad()
def sample(model, router, tokenizer, examples: list[dict], n: int, spec: RolloutSpec, *, mode: str,
           max_prompt_length: int, batch_size: int = 64, progress=None) -> list[dict]:
    """``n`` samples for each example; records carry question id, sample index, text and counts."""
    if mode == "tarpo" and router is None:
        raise ValueError("mode 'tarpo' needs a trained router")
    spec = spec_for_mode(mode, spec)
    backbone = Backbone(model)
    device = next(model.parameters()).device
    piece = token_piece_fn(tokenizer)
    jobs = [(ex, i) for ex in examples for i in range(n)]
    records = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        ids, mask, _ = encode_prompts(tokenizer, [ex["prompt"] for ex, _ in chunk], max_prompt_length, device)
        out = hybrid_generate(backbone, router, ids, mask, spec, piece, [tokenizer.eos_token_id],
                              tokenizer.pad_token_id)
        for row, (ex, i) in enumerate(chunk):
            m = out.completion_mask[row]
            tokens = out.token_ids[row][m].tolist()
            records.append({
                "id": ex["id"], "sample": i, "completion": tokenizer.decode(tokens, skip_special_tokens=True),
                "units": int(m.sum()), "hard_tokens": int((m & ~out.is_soft[row]).sum()),
                "soft_steps": int(out.is_soft[row].sum()),
            })
        if progress is not None:
            progress.update(len(chunk))
    return records


def score_records(records: list[dict], examples: list[dict], **grade_kwargs) -> list[dict]:
    """Add ``score`` (and ``answer``) to each record by the task's grader."""
    by_id = {ex["id"]: ex for ex in examples}
    grades = grade_batch([r["completion"] for r in records], [by_id[r["id"]] for r in records], **grade_kwargs)
    return [{**r, "score": g.score, "answer": g.answer} for r, g in zip(records, grades)]


def summarize(records: list[dict], k: int) -> dict:
    """pass@1, pass@k, soft ratio (soft steps / units) and mean units / hard tokens."""
    per_q: dict[str, list[float]] = {}
    for r in records:
        per_q.setdefault(r["id"], []).append(r["score"])
    counts = [(len(s), int(sum(s))) for s in per_q.values()]
    units = sum(r["units"] for r in records)
    return {
        "pass@1": mean_pass_at_k(counts, 1),
        f"pass@{k}": mean_pass_at_k(counts, k),
        "soft_ratio": sum(r["soft_steps"] for r in records) / max(units, 1),
        "units": units / len(records),
        "hard_tokens": sum(r["hard_tokens"] for r in records) / len(records),
        "questions": len(per_q),
    }
