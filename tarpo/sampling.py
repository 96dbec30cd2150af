"""The token policy pi(.|s_t) = softmax(filter(z_t / T_s)) of docs/algorithm.md §1.

Filters run in the order of transformers' sampling (temperature, top-k, top-p) and
with the same arithmetic, so routing ``hard`` reproduces ``model.generate`` token for
token under a fixed seed. Every filter is explicit: ``top_k=0`` and ``top_p=1.0`` are
"off"; nothing falls back to a library default.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Tempered logits with the top-k / top-p tail set to -inf.

    >>> filter_logits(torch.tensor([[2.0, 1.0, 0.0]]), 0.5, top_k=2)
    tensor([[4., 2., -inf]])
    """
    scores = logits / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1:] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def logprobs_and_entropy(scaled_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(scaled_logits) and its entropy in nats, over the last axis (fp32)."""
    logp = torch.log_softmax(scaled_logits.float(), dim=-1)
    return logp, -(logp.exp() * logp).sum(-1)


def sample_tokens(filtered_scores: torch.Tensor, greedy: bool = False,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row: multinomial over softmax(filtered_scores), or argmax."""
    if greedy:
        return filtered_scores.argmax(dim=-1)
    probs = torch.softmax(filtered_scores, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
