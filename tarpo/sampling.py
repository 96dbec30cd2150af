"""The token policy pi(.|s_t) = softmax(filter(z_t / T_s)) of docs/algorithm.md §1.

Filters run in the order of transformers' sampling (temperature, top-k, top-p) and
with the same arithmetic, so routing ``hard`` reproduces ``model.generate`` token for
token under a fixed seed. Every filter is explicit: ``top_k=0`` and ``top_p=1.0`` are
"off"; nothing falls back to a library default.

Two ways to draw. ``sample_tokens`` calls ``torch.multinomial`` on torch's stream, as
``generate`` does. :class:`StepNoise` instead hands each decode step pre-drawn noise from
its own seeded generator (uniforms for the token and the router, normals for Soft Tokens),
and :func:`gumbel_argmax` turns the token uniforms into an exact draw: given the same
noise, the eager and the compiled engines (:mod:`tarpo.static_decode`) draw the same
trajectory, and the compiled step never touches an RNG.
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


def gumbel_argmax(filtered_scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``argmax(filtered + G)``, ``G = -log(-log(u))``: an exact draw from ``softmax(filtered)``
    (the Gumbel-max trick), rows of ``uniforms`` in [0, 1) the same shape as the scores.

        >>> gumbel_argmax(torch.tensor([[0.0, 0.0, float("-inf")]]), torch.tensor([[0.3, 0.9, 0.99]]))
        tensor([1])
    """
    return (filtered_scores - torch.log(-torch.log(uniforms))).argmax(dim=-1)


class StepNoise:
    """Per-step noise for a batch, drawn in one fixed order from a seeded generator.

    ``draw()`` refills and returns ``(tokens [B, V], route [B], gaussian [B, d])``, uniforms,
    uniforms and standard normals (``None`` for the ones not asked for), the same tensors
    every step, overwritten in place (static addresses for a CUDA graph). Row ``r`` of a step
    belongs to row ``r`` of the batch whatever else happened, so an engine that drops
    finished rows indexes them and draws the same trajectory as one that keeps them.

        >>> a, b = StepNoise(7, 2, 5, device="cpu"), StepNoise(7, 2, 5, device="cpu")
        >>> torch.equal(a.draw()[0], b.draw()[0]), a.draw()[1] is None
        (True, True)
    """

    def __init__(self, seed: int, batch: int, vocab: int, hidden: int = 0, *, device, tokens: bool = True,
                 route: bool = False, gaussian: bool = False):
        self.generator = torch.Generator(device).manual_seed(int(seed))
        self.tokens = torch.empty(batch, vocab, device=device) if tokens else None
        self.route = torch.empty(batch, device=device) if route else None
        self.gaussian = torch.empty(batch, hidden, device=device) if gaussian else None

    def draw(self):
        if self.tokens is not None:
            self.tokens.uniform_(generator=self.generator)
        if self.route is not None:
            self.route.uniform_(generator=self.generator)
        if self.gaussian is not None:
            self.gaussian.normal_(generator=self.generator)
        return self.tokens, self.route, self.gaussian
