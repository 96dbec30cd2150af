"""Sampling and scoring a model on a task's examples with the hybrid rollout engine.

:func:`sample` decodes ``n`` samples per question (questions x samples batched through
:func:`tarpo.engine.rollout.hybrid_generate`) and returns one record per sample;
:func:`summarize` turns graded records into the metrics of docs/algorithm.md §7.

Inference modes (docs/algorithm.md §3, §7): ``cot`` and ``hard`` (hard inputs throughout; ``hard`` is a
trained model forced to hard routing), ``pure_latent`` (soft at every thinking step),
``entropy`` (soft iff the entropy of softmax(z / ``spec.entropy_temperature``) exceeds the
threshold), ``tarpo`` (the trained router decides), ``hrpo`` (an HRPO-trained gate blends every
thinking input), ``greedy`` (argmax tokens, hard inputs, one sample) and ``tarpo_greedy``
(argmax tokens and argmax routing by the trained router, one sample: the Greedy column of the
paper's Table 3 for TARPO; the paper does not define it further).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..engine.precision import mixed_precision
from ..engine.rollout import RolloutSpec, hybrid_generate
from ..algorithms import inference_mode
from ..tasks.graders import grade_batch
from ..tasks.prompts import encode_prompts
from .metrics import majority_vote, mean_pass_at_k, mean_sd_ci

def spec_for_mode(name: str, spec: RolloutSpec) -> RolloutSpec:
    """``spec`` under the inference mode ``name`` (:data:`tarpo.algorithms.MODES`): its routing rule; a
    greedy mode takes argmax tokens, and argmax routing where the router decides."""
    m = inference_mode(name)
    return replace(spec, routing=m.routing, greedy=m.greedy,
                   router_greedy=spec.router_greedy or (m.greedy and m.rule.router))


@torch.no_grad()
def sample(system, examples: list[dict], n: int, spec: RolloutSpec, *, max_prompt_length: int, batch_size: int = 64,
           generator=None, soft_detail: int = 0) -> list[dict]:
    """``n`` samples for each example (:func:`trajectory_fields` plus question id and sample index) from
    ``system`` (:class:`tarpo.evaluation.system.System`: model, router, soft input, tokenizer, in its inference mode);
    ``generator`` (optional) drives all sampling, else torch's global RNG. ``soft_detail`` > 0 adds each soft
    step's top mixture entries (``soft_top``)."""
    tokenizer, mode, device = system.tokenizer, system.mode, system.device
    if inference_mode(mode).rule.router and system.router is None:
        raise ValueError(f"mode {mode!r} needs a trained router")
    spec = spec_for_mode(mode, spec)
    policy = system.policy()
    jobs = [(ex, i) for ex in examples for i in range(n)]
    records = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        ids, mask, _ = encode_prompts(tokenizer, [ex["prompt"] for ex, _ in chunk], max_prompt_length, device,
                                      system.template_kwargs)
        with mixed_precision(policy.backbone):  # the precision training rolled out in (tarpo.engine.precision)
            out = hybrid_generate(policy, ids, mask, spec, generator=generator)
        for row, (ex, i) in enumerate(chunk):
            records.append({"id": ex["id"], "sample": i, **trajectory_fields(out, row, tokenizer, soft_detail)})
    return records


def trajectory_fields(out, row: int, tokenizer, soft_detail: int = 0) -> dict:
    """One row of a rollout as JSON-ready fields.

    ``tokens`` are the sampled ids v_t (placeholders at soft steps); ``actions`` has one
    character per unit: ``s`` soft (the next input was the mixture), ``h`` a hard router
    decision, ``-`` no decision (answer phase, EOS, last step); ``p_soft`` is rho(soft|h_t)
    per unit (0 where no learned decision); ``marked`` is the text with each soft step's
    placeholder wrapped in ``⟦ ⟧``. With ``soft_detail`` > 0, ``soft_top`` lists per unit the
    first ``soft_detail`` (id, weight) pairs of the soft step's mixture (None at other units).

    >>> from types import SimpleNamespace as NS
    >>> t = lambda *v: torch.tensor([list(v)])
    >>> out = NS(completion_mask=t(True, True, True), is_soft=t(False, True, False), decided=t(True, True, False),
    ...          token_ids=t(5, 6, 7), p_soft=t(0.1, 0.9, 0.0))
    >>> tok = NS(decode=lambda ids, skip_special_tokens=True: "".join("abcdefgh"[i] for i in ids))
    >>> f = trajectory_fields(out, 0, tok)
    >>> f["completion"], f["marked"], f["actions"], f["units"], f["hard_tokens"], f["soft_steps"]
    ('fgh', 'f⟦g⟧h', 'hs-', 3, 2, 1)
    """
    m = out.completion_mask[row]
    tokens = out.token_ids[row][m].tolist()
    soft = out.is_soft[row][m].tolist()
    decided = out.decided[row][m].tolist()
    marked, start = [], 0
    for j in range(1, len(tokens) + 1):  # decode runs of equal kind together (multi-byte pieces stay whole)
        if j == len(tokens) or soft[j] != soft[start]:
            text = tokenizer.decode(tokens[start:j], skip_special_tokens=True)
            marked.append(f"⟦{text}⟧" if soft[start] and text else text)
            start = j
    extra = {}
    if soft_detail:
        ids, weights = (out.soft_ids[row][m][:, :soft_detail].tolist(),
                        out.soft_weights[row][m][:, :soft_detail].tolist())
        # zero weights: none recorded (HRPO's full-vocabulary mixture is fed from soft_inputs)
        extra["soft_top"] = [[[i, round(w, 4)] for i, w in zip(ids[j], weights[j]) if w > 0] if soft[j] else None
                             for j in range(len(tokens))]
    return {
        **extra,
        "completion": tokenizer.decode(tokens, skip_special_tokens=True), "marked": "".join(marked),
        "tokens": tokens, "actions": "".join("s" if s else "h" if d else "-" for s, d in zip(soft, decided)),
        "p_soft": [round(p, 4) for p in out.p_soft[row][m].tolist()],
        "units": len(tokens), "hard_tokens": len(tokens) - sum(soft), "soft_steps": sum(soft),
    }


def score_records(records: list[dict], examples: list[dict], **grade_kwargs) -> list[dict]:
    """Add ``score`` (and ``answer``) to each record by the task's grader."""
    by_id = {ex["id"]: ex for ex in examples}
    grades = grade_batch([r["completion"] for r in records], [by_id[r["id"]] for r in records], **grade_kwargs)
    return [{**r, "score": g.score, "answer": g.answer} for r, g in zip(records, grades)]


def summarize(records: list[dict], ks=(1,), canonical: list[str] | None = None) -> dict:
    """The metrics of docs/algorithm.md §7 from graded records (each with ``id``, ``sample``, ``score``).

    pass@k (unbiased) for each k in ``ks``; maj@k for each k when ``canonical`` (one
    canonical answer per record, "" = none) is given, voting over each question's first k
    samples; mean, sample SD and 95% CI half-width of the question-level accuracy c/n;
    mean units (hard + soft) and hard tokens per sample; soft ratio = soft steps / units.
    """
    per_q: dict[str, list[tuple[int, float, str]]] = {}
    for j, r in enumerate(records):
        per_q.setdefault(r["id"], []).append((r["sample"], r["score"], canonical[j] if canonical else ""))
    groups = [sorted(v) for v in per_q.values()]
    counts = [(len(g), sum(int(s) for _, s, _ in g)) for g in groups]
    mean, sd, ci = mean_sd_ci([c / n for n, c in counts])
    units = sum(r["units"] for r in records)
    out = {f"pass@{k}": mean_pass_at_k(counts, k) for k in ks}
    if canonical is not None:
        for k in ks:
            out[f"maj@{k}"] = sum(majority_vote([a for _, _, a in g[:k]], [s > 0 for _, s, _ in g[:k]])
                                  for g in groups) / len(groups)
    return {
        **out, "accuracy_mean": mean, "accuracy_sd": sd, "accuracy_ci95": ci,
        "soft_ratio": sum(r["soft_steps"] for r in records) / max(units, 1),
        "units": units / len(records), "hard_tokens": sum(r["hard_tokens"] for r in records) / len(records),
        "questions": len(groups), "samples": len(records),
    }
