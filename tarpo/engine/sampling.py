"""The token policy pi(.|s_t) = softmax(filter(z_t / T_s)) of docs/algorithm.md §1.

Filters run in the order of transformers' sampling (temperature, top-k, top-p, min-p) and
with the same arithmetic, so routing ``hard`` reproduces ``model.generate`` token for
token under a fixed seed. Every filter is explicit: ``top_k=0`` and ``top_p=1.0`` are
"off"; nothing falls back to a library default.

Two ways to draw. ``sample_tokens`` calls ``torch.multinomial`` on torch's stream, as
``generate`` does. Keyed noise instead computes each step's randomness as a pure function
of (seed, row id, step, stream, index) (:func:`step_uniforms`, a counter-based integer hash):
uniforms for the token and the router, normals for Soft Tokens; :func:`gumbel_argmax` turns
the token uniforms into an exact draw. Given the same seed, the eager and the compiled engines
(:mod:`tarpo.engine.static_decode`) draw the same trajectory, a row draws the same whatever batch or
process decodes it, and the compiled step computes its noise inside the graph, with no RNG.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float | None = None) -> torch.Tensor:
    """Tempered logits with the top-k / top-p / min-p tail set to -inf (min-p, TRL's ``min_p``: a token whose
    probability is under ``min_p`` times the top one's, as transformers' ``MinPLogitsWarper``).

    >>> filter_logits(torch.tensor([[2.0, 1.0, 0.0]]), 0.5, top_k=2)
    tensor([[4., 2., -inf]])
    >>> filter_logits(torch.tensor([[2.0, 1.0, 0.0]]), 1.0, min_p=0.3)   # e^-1 = 0.37 >= 0.3, e^-2 = 0.14 < 0.3
    tensor([[2., 1., -inf]])
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
    if min_p:
        probs = scores.softmax(dim=-1)
        scores = scores.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
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


# ---- counter-based noise: a pure function of (seed, row, step, stream, index) ----------------------------------
# Values are 32-bit integers held in int64 tensors; every product stays below 2**63 (no overflow).
_M32 = 0xFFFFFFFF
STREAM_TOKEN, STREAM_ROUTE, STREAM_GAUSSIAN, STREAM_GUMBEL = 0, 1, 2, 4  # the Gaussian stream uses 2 and 3


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for x in [0, 2**32), exactly, in 16-bit halves of ``c``."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (``lowbias32``: xor-shift / multiply rounds), a bijection of [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seed: int, rows: torch.Tensor) -> torch.Tensor:
    """One int64 key per row from a seed and the rows' global ids (< 2**32), made once per rollout."""
    seed = int(seed)
    lo, hi = seed & _M32, (seed >> 32) & _M32
    return _mix32(_mix32(_mix32(torch.full_like(rows, lo)) ^ hi) ^ (rows.long() & _M32))


def step_uniforms(keys: torch.Tensor, step, stream: int, n: int) -> torch.Tensor:
    """Uniforms in (0, 1), [B, n] fp32, for rows with ``keys`` at decode step ``step`` (int or 0-d tensor).

    A pure function of (seed, row id, step, stream, index): a row gets the same noise whatever
    batch it is decoded in, by either engine, in one process or several. 24 random bits each, as
    ``torch.rand`` for fp32; never exactly 0 or 1.

        >>> k = row_keys(7, torch.arange(3))
        >>> torch.equal(step_uniforms(k, 2, STREAM_TOKEN, 5)[1:], step_uniforms(k[1:], 2, STREAM_TOKEN, 5))
        True
    """
    key = _mix32(_mix32(keys ^ (step & _M32)) ^ (stream * 0x9E3779B9 & _M32))  # a Python step: no copy to the device
    index = _mul32(torch.arange(n, device=keys.device), 0x9E3779B9)
    h = _mix32(key[:, None] ^ index[None, :])
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def step_normals(keys: torch.Tensor, step, stream: int, n: int) -> torch.Tensor:
    """Standard normals [B, n] fp32 (Box-Muller on the uniforms of ``stream`` and ``stream + 1``)."""
    u1, u2 = step_uniforms(keys, step, stream, n), step_uniforms(keys, step, stream + 1, n)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * torch.pi) * u2)
