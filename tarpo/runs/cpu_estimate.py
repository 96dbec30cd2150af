"""How long a training run will take on a CPU, from a short probe of the loaded model.

A launcher run without CUDA (a laptop with a 135M-360M instruct model, say) measures, before the
first step, what one step is made of on this machine, and prints the estimate:

- **length**: how long the model's completions are. An instruct model usually ends its answer long
  before ``max_completion_length``; a step decodes until its longest row ends and trains every row
  padded to that length. :func:`completion_lengths` samples a completion for a few of the run's own
  prompts at the run's temperature, up to :data:`PROBE_TOKENS` new tokens (a row still running then
  counts at the full ``max_completion_length``); the estimate takes their longest;
- **decode**: ``rows`` completions draw one token per step; the probe times a few cached decode
  steps of the whole batch (the eager engine's work: one forward of ``rows`` tokens over the cache);
- **prefill**: the prompts' tokens in one forward, at the probe's forward speed (tokens/s);
- **training**: the forward and backward of every completion with its prompt, at the probe's
  training speed (a forward and backward that reaches the inputs with the weights frozen, as LoRA
  training does), plus one more forward for the reference model's log-probs when ``beta`` > 0.

Until 2026-11-25 every completion was counted at ``max_completion_length``: a real 135M chat model on
2 cores was estimated at 199 s for two steps that trained in 56 s. The estimate is printed, not
trusted: ``CPU_MAX_HOURS`` (the launchers' variable) refuses a run whose estimate is longer, so that
nobody starts a week-long run on a laptop by accident. ``benchmarks/bench_cpu_estimate.py`` measures
it against the run.

    >>> e = Estimate(decode_step_s=0.05, forward_tok_s=2000.0, train_tok_s=500.0)
    >>> round(e.step_seconds(rows=8, prompt=100, completion=200, beta=0.0), 2)
    15.2
    >>> round(e.step_seconds(rows=8, prompt=100, completion=200, beta=0.01), 2)
    16.4
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

PROBE_TOKENS = 256  # new tokens the length probe samples at most
PROBE_PROMPTS = 4   # prompts it samples a completion for


@dataclass
class Estimate:
    decode_step_s: float  # one decode step of the whole batch
    forward_tok_s: float  # tokens/s of a forward without gradients (prefill, reference model)
    train_tok_s: float  # tokens/s of a forward and backward (training)

    def step_seconds(self, rows: int, prompt: int, completion: int, beta: float) -> float:
        """Seconds of one optimizer step: ``rows`` completions of ``completion`` tokens after
        prompts of ``prompt`` tokens (see the module docstring for what is counted)."""
        tokens = rows * (prompt + completion)
        prefill = rows * prompt / self.forward_tok_s
        reference = tokens / self.forward_tok_s if beta > 0 else 0.0
        return prefill + completion * self.decode_step_s + tokens / self.train_tok_s + reference


def _timed(fn, repeats: int) -> float:
    fn()  # the first call pays for lazy initialisation
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


@torch.no_grad()
def _decode_step_seconds(model, rows: int, context: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (rows, context))
    out = model(input_ids=ids, use_cache=True)
    cache, token = out.past_key_values, ids[:, -1:]

    def step():
        model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # drop the step just cached: the same context at every timed step
    return _timed(step, 3)


def probe(model, rows: int, length: int = 64) -> Estimate:
    """Measure ``model`` (on the CPU, in its own dtype) for batches of ``rows`` completions: a few
    seconds for a 135M model. The model is left as it was (mode, ``requires_grad``)."""
    was_training, grads = model.training, [p.requires_grad for p in model.parameters()]
    vocab = model.get_input_embeddings().weight.shape[0]
    batch = max(1, min(rows, 4))
    ids = torch.randint(0, vocab, (batch, length))
    model.eval()
    try:
        decode = _decode_step_seconds(model, rows, length, vocab)
        with torch.no_grad():
            forward = _timed(lambda: model(input_ids=ids, use_cache=False), 1)
        for p in model.parameters():
            p.requires_grad_(False)
        embed = model.get_input_embeddings()

        def train():
            x = embed(ids).detach().requires_grad_()
            model(inputs_embeds=x, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        backward = _timed(train, 1)
    finally:
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
        model.train(was_training)
    tokens = batch * length
    return Estimate(decode_step_s=decode, forward_tok_s=tokens / forward, train_tok_s=tokens / backward)


@torch.no_grad()
def completion_lengths(model, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int], pad_id: int,
                       temperature: float) -> list[int]:
    """The length of one completion sampled for each of ``prompts`` (token ids) at ``temperature``, ending at
    any of ``stop_ids``: at most :data:`PROBE_TOKENS` tokens are sampled, and a row still running then counts
    as ``max_new_tokens``. The model is left as it was (mode)."""
    was_training = model.training
    model.eval()
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    budget = min(max_new_tokens, PROBE_TOKENS)
    try:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=0, top_p=1.0,
                             eos_token_id=list(stop_ids), pad_token_id=pad_id)[:, longest:]
    finally:
        model.train(was_training)
    lengths, stops = [], set(stop_ids)
    for row in out.tolist():
        ends = [i for i, t in enumerate(row) if t in stops]
        lengths.append(ends[0] + 1 if ends else (max_new_tokens if len(row) >= budget else len(row)))
    return lengths


def planned_steps(max_steps: int, epochs: float, questions: int, group: int, batch: int) -> int:
    """Optimizer steps of a run: ``max_steps`` when set (> 0), else the epochs over the questions, each
    giving ``group`` completions, ``batch`` completions a step.

    >>> planned_steps(-1, 1.0, 7473, 4, 32), planned_steps(2, 1.0, 7473, 4, 32)
    (935, 2)
    """
    return max_steps if max_steps > 0 else math.ceil(epochs * questions * group / batch)


def describe(seconds: float) -> str:
    """Seconds as a person reads them.

    >>> describe(42), describe(5400), describe(200000)
    ('42 s', '1.5 h', '55.6 h')
    """
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 3600:.1f} h"
